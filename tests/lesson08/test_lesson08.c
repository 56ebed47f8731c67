// tests/lesson08/test_lesson08.c: the autograder for lesson 08 (the learner's pipe.c: the cut, the hand-offs
// across it, the GPipe step).
//
// The cut is checked against its definition (every layer once, contiguous, only where pipe_cut_ok) and against
// the best split found by trying them all; the hand-offs by what lands where (and what must not change); the step
// against independent references built from kit calls in this file, one step from identical state:
//   - BN-free model ("tiny"): P stages and M micro-batches equal ONE model on the whole batch;
//   - with batch norm ("tiny-bn"): M micro-batches equal one model run on each micro-batch in turn with its
//     gradients added up (per-micro-batch statistics), and differ from one model on the whole batch.
// Hints for failures are in hints.tsv.
#include "tests/testutil.h"

#include "kit/data.h"
#include "kit/model.h"
#include "kit/ops.h"
#include "kit/optim.h"
#include "kit/train.h"
#include "lesson.h"

#include "tests/grading.h"
#include "tests/learn_testutil.h"

enum { IMAGE = 3 * 32 * 32, BATCH = 16 };

// One step of the pipe vs its reference, from the SAME parameters, momentum and BN statistics: both run the same
// float32 operations on the same numbers except for the ORDER of some sums (a weight gradient is a sum over the
// batch's images, which the reference adds up in one pass and the pipe as M partial sums, one per micro-batch;
// on the CPU the kit fuses BN and ReLU in one pass where the stage runner makes two). So they differ by rounding.
//
// STEP_TOL: the gradient elements are float32 sums of at most k = B*H*W = 16*32*32 = 16384 products in some
// order: |error| <= gamma_k sum|terms| (gamma_k = k u / (1 - k u) = 1e-3, u = 2^-24) in the worst case, and
// lambda sqrt(k) u sum|terms| = 6 * 128 * 6e-8 = 4.6e-5 sum|terms| with probability 1 - 1e-8 per element
// (Higham & Mary 2019). Relative to the largest gradient (sum|terms| a few times |g| where the images agree),
// 1e-3 leaves a margin of 10 over that; the same for the step's move, ||p - p_ref||_2 / ||p_ref - p_before||_2,
// since p' = p - lr (momentum v + g + wd p) is the same operations on the same p and v. Every mistake is off by
// far more: a loss scaled by 1/(micro-batch) makes the gradient M times too large; gradients zeroed per
// micro-batch leave 1/M of it; a missing hand-off gives a gradient of unrelated numbers (or none).
#define STEP_TOL 1e-3
// The lower bound the BN test needs: per-micro-batch statistics change the loss function itself, by
// O(1/sqrt(micro-batch)) relative in each BN output; the gradient moves by tens of percents (measured: 0.3 of its
// largest element, tiny-bn, 4 micro-batches of 4), hundreds of times STEP_TOL. 1e-2 is ten times the
// tolerance: the difference cannot be rounding.
#define BN_DIFFERS 1e-2

static ModelConfig config(const char *name) {
    ModelConfig cfg;
    // ResNet-9 at width 8 (not its default 64): the same layer table, residual blocks included, in a second.
    assert_true(model_config(&cfg, name, strcmp(name, "resnet9") == 0 ? 8 : 0, 3, 32, 32, 10));
    return cfg;
}

// The autograder runs on 4 ranks (the tests of pipe_dist.c need them); a test of the one-process pipe runs on
// rank 0 alone, the other ranks pass it at once.
static bool single_process_rank(void) { return grading_launcher_rank() == 0; }

static const SgdConfig OPT = {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-4f, .nesterov = false};

// A batch of synthetic images (host memory).
typedef struct {
    Dataset ds;
    float *x;  // (n, 3, 32, 32)
    int *y;    // (n)
    int n;
} Images;

static Images images_make(int n) {
    Images im = {.n = n};
    dataset_synthetic(&im.ds, n, 10, 3, 32, 32, 7, SPLIT_TRAIN);
    im.x = xmalloc((size_t)n * IMAGE * sizeof(float));
    im.y = xmalloc((size_t)n * sizeof(int));
    int *idx = xmalloc((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) idx[i] = i;
    dataset_fill_batch(&im.ds, idx, n, NULL, 7, 0, im.x, im.y);
    free(idx);
    return im;
}
static void images_free(Images *im) {
    free(im->x);
    free(im->y);
    dataset_free(&im->ds);
}

// ---------------------------------------------------------------- TODO 1: where to cut

// Sum of cost over [a, b).
static double span_cost(const double *cost, int a, int b) {
    double c = 0.0;
    for (int i = a; i < b; i++) c += cost[i];
    return c;
}

// The largest stage cost of a split, or INFINITY (with the reason in why) when it is not a valid split.
static double split_cost(const Model *m, const double *cost, int P, const int *first, char *why, size_t len) {
    if (first[0] != 0 || first[P] != m->n_layers) {
        snprintf(why, len, "first[0] = %d and first[%d] = %d: the stages must start at layer 0 and end at layer %d",
                 first[0], P, first[P], m->n_layers);
        return INFINITY;
    }
    double worst = 0.0;
    for (int s = 0; s < P; s++) {
        if (first[s + 1] <= first[s]) {
            snprintf(why, len, "stage %d is [%d, %d): empty or backwards (every stage needs a layer, in order)", s,
                     first[s], first[s + 1]);
            return INFINITY;
        }
        if (s > 0 && !pipe_cut_ok(m, first[s])) {
            snprintf(why, len, "a cut before layer %d, where more than one activation would cross (pipe_cut_ok)",
                     first[s]);
            return INFINITY;
        }
        worst = fmax(worst, span_cost(cost, first[s], first[s + 1]));
    }
    return worst;
}

// The best largest-stage cost over EVERY valid split into P stages, by trying them all (INFINITY: none).
static double best_by_search(const Model *m, const double *cost, int P, int *first, int s) {
    if (s == P) {
        char why[8];
        first[P] = m->n_layers;
        return split_cost(m, cost, P, first, why, sizeof why);
    }
    double best = INFINITY;
    for (int c = first[s - 1] + 1; c < m->n_layers; c++) {
        if (!pipe_cut_ok(m, c)) continue;
        first[s] = c;
        best = fmin(best, best_by_search(m, cost, P, first, s + 1));
    }
    return best;
}

static int valid_cuts(const Model *m) {
    int n = 0;
    for (int c = 1; c < m->n_layers; c++) n += pipe_cut_ok(m, c);
    return n;
}

static void test_costs_by_rule(void **state) {
    (void)state;
    if (!single_process_rank()) return;
    ModelConfig cfg = config("resnet9");
    Model *m = model_create(&cfg, DEVICE_CPU, 1, 1);
    double seconds[MODEL_MAX_LAYERS], cost[MODEL_MAX_LAYERS];
    for (int i = 0; i < m->n_layers; i++) seconds[i] = 0.001 * (i + 1) * (i % 3 + 1);
    pipe_layer_costs(m, BALANCE_PARAMS, NULL, cost);
    for (int i = 0; i < m->n_layers; i++)
        if (cost[i] != (double)m->layers[i].param_count) {
            print_error("--balance params: layer %d costs %g, it has %zu parameters\n", i, cost[i],
                        m->layers[i].param_count);
            fail();
        }
    pipe_layer_costs(m, BALANCE_TIME, seconds, cost);
    for (int i = 0; i < m->n_layers; i++)
        if (cost[i] != seconds[i]) {
            print_error("--balance time: layer %d costs %g, its measured time is %g s\n", i, cost[i], seconds[i]);
            fail();
        }
    model_free(m);
}

// Every model of the kit into 1..5 stages (and one stage more than its cuts allow): each split covers every
// layer exactly once, in contiguous stages, cut only where one activation crosses.
static void test_split_covers_every_layer(void **state) {
    (void)state;
    if (!single_process_rank()) return;
    const char *names[] = {"tiny", "tiny-bn", "fmnist", "resnet9"};
    for (size_t a = 0; a < sizeof names / sizeof names[0]; a++) {
        ModelConfig cfg = config(names[a]);
        Model *m = model_create(&cfg, DEVICE_CPU, 1, 1);
        double cost[MODEL_MAX_LAYERS];
        for (int i = 0; i < m->n_layers; i++) cost[i] = (double)m->layers[i].param_count + 1.0;
        int most = valid_cuts(m) + 1;
        for (int P = 1; P <= 5 && P <= most; P++) {
            int first[PIPE_MAX_STAGES + 1];
            for (int s = 0; s <= P; s++) first[s] = -7;
            char why[200] = "";
            if (!pipe_balance(m, cost, P, first)) snprintf(why, sizeof why, "returned false, but a split exists");
            else split_cost(m, cost, P, first, why, sizeof why);
            if (why[0]) {
                print_error("%s into %d stage(s): %s\n", names[a], P, why);
                fail();
            }
        }
        if (most + 1 <= PIPE_MAX_STAGES) {
            int first[PIPE_MAX_STAGES + 1];
            if (pipe_balance(m, cost, most + 1, first)) {
                print_error("%s into %d stages: returned true, but it has only %d places to cut\n", names[a],
                            most + 1, most - 1);
                fail();
            }
        }
        model_free(m);
    }
}

// The largest stage is as cheap as the best of ALL valid splits (tried one by one here), for parameter counts
// and for made-up times, on the models where cuts are restricted (residual blocks) and where they are not.
static void test_split_is_balanced(void **state) {
    (void)state;
    if (!single_process_rank()) return;
    const char *names[] = {"fmnist", "resnet9"};
    for (size_t a = 0; a < sizeof names / sizeof names[0]; a++) {
        ModelConfig cfg = config(names[a]);
        Model *m = model_create(&cfg, DEVICE_CPU, 1, 1);
        for (int rule = 0; rule < 3; rule++) {
            double cost[MODEL_MAX_LAYERS];
            Rng r = rng_make(100 + (uint64_t)rule, 0);
            for (int i = 0; i < m->n_layers; i++)
                cost[i] = rule == 0 ? (double)m->layers[i].param_count : 0.01 + rng_uniform(&r);
            for (int P = 2; P <= 4 && P <= valid_cuts(m) + 1; P++) {
                int first[PIPE_MAX_STAGES + 1], trial[PIPE_MAX_STAGES + 1] = {0};
                char why[200] = "";
                double best = best_by_search(m, cost, P, trial, 1);
                if (!pipe_balance(m, cost, P, first)) {
                    print_error("%s into %d stages: pipe_balance returned false\n", names[a], P);
                    fail();
                }
                double got = split_cost(m, cost, P, first, why, sizeof why);
                if (why[0]) {
                    print_error("%s into %d stages: %s\n", names[a], P, why);
                    fail();
                }
                if (!(got <= best * (1 + 1e-12))) {  // sums of <= 31 doubles: rounding far below 1e-12
                    print_error("%s into %d stages (%s costs): the largest stage costs %.6g, a split with %.6g "
                                "exists (a greedy fill up to the average is not exact)\n", names[a], P,
                                rule == 0 ? "parameter" : "made-up", got, best);
                    fail();
                }
            }
        }
        model_free(m);
    }
}

// ---------------------------------------------------------------- TODO 2: the hand-offs

enum { SENTINEL_OFF = 5, SENTINEL_N = 6 };

// Stage 0's output (or stage 1's input gradient) filled with marks, the receiving buffer with -1; after the
// hand-off of samples [5, 11) those must have arrived and nothing else may have changed. Returns a description
// of the first problem, or NULL.
static const char *check_handoff(bool forward, char *why, size_t len) {
    ModelConfig cfg = config("tiny");
    Model *table = model_create(&cfg, DEVICE_CPU, 1, 42);
    int first[3] = {0, 3, table->n_layers};  // after conv, relu, maxpool: (8, 16, 16) per image
    Pipe *p = pipe_create(table, DEVICE_CPU, first, 2, 4, BATCH);
    Stage *a = &p->stages[0], *b = &p->stages[1];
    size_t f = b->in_floats, all = (size_t)BATCH * f;
    float *src = forward ? stage_out(a) : b->dinput, *dst = forward ? b->input : stage_dout(a);
    for (size_t i = 0; i < all; i++) src[i] = (float)i, dst[i] = -1.0f;
    if (forward) pipe_send_forward(p, 0, SENTINEL_OFF, SENTINEL_N);
    else pipe_send_backward(p, 0, SENTINEL_OFF, SENTINEL_N);
    const char *r = NULL;
    for (size_t i = 0; i < all && !r; i++) {
        size_t sample = i / f;
        bool inside = sample >= SENTINEL_OFF && sample < SENTINEL_OFF + SENTINEL_N;
        float want = inside ? (float)i : -1.0f;
        if (dst[i] != want) {
            snprintf(why, len, "%s samples [%d, %d) of a batch of %d: %s[%zu] (sample %zu, feature %zu) is %g, "
                     "expected %g%s", forward ? "forward" : "backward", SENTINEL_OFF, SENTINEL_OFF + SENTINEL_N, BATCH,
                     forward ? "stage 1's input" : "stage 0's output gradient", i, sample, i % f, dst[i], want,
                     dst[i] == -1.0f ? (inside ? ": not copied (the micro-batch's offset? n * features floats?)" : "")
                     : inside ? ": the wrong floats (the offset is in samples: off * features)"
                              : ": written outside the micro-batch's samples");
            r = why;
        }
    }
    pipe_free(p);
    model_free(table);
    return r;
}

static void test_handoff_forward(void **state) {
    (void)state;
    if (!single_process_rank()) return;
    char why[300];
    if (check_handoff(true, why, sizeof why)) {
        print_error("%s\n", why);
        fail();
    }
}

static void test_handoff_backward(void **state) {
    (void)state;
    if (!single_process_rank()) return;
    char why[300];
    if (check_handoff(false, why, sizeof why)) {
        print_error("%s\n", why);
        fail();
    }
}

// ---------------------------------------------------------------- TODO 3: the step

// The stages' gradients and parameters in the whole model's layout (host arrays of n_params).
static void pipe_grads(const Pipe *p, float *g) {
    for (int s = 0; s < p->n_stages; s++)
        memcpy(g + p->stages[s].param_offset, p->stages[s].grads, p->stages[s].n_params * sizeof(float));
}

// One step of a pipe of P stages cut at `first` and M micro-batches, against one model: on the whole batch
// (per_micro = false) or on each micro-batch in turn with the gradients added up (per_micro = true). Returns the
// gradient's comparison; *move_err the step's move error; fails with a reason when the step is wrong outright.
static Compare pipe_vs_reference(const char *name, const int *first, int P, int M, bool per_micro, double *move_err) {
    ModelConfig cfg = config(name);
    Model *table = model_create(&cfg, DEVICE_CPU, 1, 42);
    Model *one = model_create(&cfg, DEVICE_CPU, BATCH, 42);  // same seed: the same initial weights
    Model *after = model_create(&cfg, DEVICE_CPU, 1, 42);    // the pipe's weights after its step, gathered
    Pipe *p = pipe_create(table, DEVICE_CPU, first, P, M, BATCH);
    Images im = images_make(BATCH);
    Batch b = {.n = BATCH, .x = im.x, .y = im.y};
    size_t n = one->n_params;
    float *before = xmalloc(n * sizeof(float)), *g = xcalloc(n, sizeof(float)), *acc = xcalloc(n, sizeof(float));
    memcpy(before, one->params, n * sizeof(float));

    Metrics got = pipe_step(p, &b, &OPT, 0.0f);
    Metrics ref = {0, 0, 0};
    if (!per_micro) {
        ref = train_forward_backward(one, &b, 0.0f, 1.0f / BATCH);
    } else {
        for (int k = 0; k < M; k++) {
            int off, size;
            pipe_micro_range(BATCH, M, k, &off, &size);
            Batch mb = {.n = size, .x = im.x + (size_t)off * IMAGE, .y = im.y + off};
            Metrics r = train_forward_backward(one, &mb, 0.0f, 1.0f / BATCH);  // zeroes one->grads first
            ref.loss_sum += r.loss_sum, ref.correct += r.correct, ref.count += r.count;
            for (size_t i = 0; i < n; i++) acc[i] += one->grads[i];
        }
        memcpy(one->grads, acc, n * sizeof(float));
    }
    optim_step(one, &OPT);
    pipe_grads(p, g);
    pipe_gather(p, after);
    Compare c = compare_arrays(g, one->grads, n);
    *move_err = move_error(after->params, one->params, before, n);
    // One SGD step from the same weights with the pipe's OWN gradient: when the pipe's weights are that step, it
    // updated once and its gradient is what is wrong (a backward over the wrong samples); when they are not, the
    // weights moved more than once (a step per micro-batch: the later backwards then saw updated weights too).
    Model *own = model_create(&cfg, DEVICE_CPU, 1, 42);
    memcpy(own->grads, g, n * sizeof(float));
    optim_step(own, &OPT);
    double own_err = move_error(after->params, own->params, before, n);
    model_free(own);

    char why[300] = "";
    // The loss: BATCH positive per-image losses of O(1), from the same forward but for rounding (a few 1e-6).
    if (got.count != BATCH)
        snprintf(why, sizeof why, "pipe_step returned count %ld for a batch of %d%s", got.count, BATCH,
                 got.count > 0 && got.count < BATCH ? ": not every micro-batch went through" : "");
    else if (!(fabs(got.loss_sum - ref.loss_sum) <= 1e-5 * fabs(ref.loss_sum)))
        snprintf(why, sizeof why, "loss_sum %.6g, the reference's %.6g: the forward through the stages is wrong",
                 got.loss_sum, ref.loss_sum);
    else if (!(c.error <= STEP_TOL))
        snprintf(why, sizeof why, "the stages' gradient is %.3g x the reference's (max diff %.2g, tolerance %.0e)%s",
                 c.ratio, c.error, STEP_TOL,
                 M > 1 && fabs(c.ratio - M) < 0.15 * M ? ": the loss scaled by 1/(micro-batch) instead of 1/(batch)?"
                 : M > 1 && c.ratio * M < 1.5 ? ": only one micro-batch's share (gradients zeroed per micro-batch?)"
                 : fabs(c.ratio) < 0.05 ? ": no gradient (backward not run, or not handed back across the cut)"
                 : !(own_err <= STEP_TOL) ? ": the weights moved more than one SGD step of this gradient: weights "
                                            "updated before every micro-batch's backward was done (one SGD step per "
                                            "stage, after ALL of them)?"
                 : M > 1 ? ": one SGD step, but of a wrong gradient: a micro-batch's backward run over other samples "
                           "than its forward (the off and n of ITS pipe_micro_range, and its view k)?"
                         : "");
    else if (!(*move_err <= STEP_TOL))
        snprintf(why, sizeof why, "the gradient is right but the update moved the weights %.3g off (one SGD step "
                 "per stage, after ALL micro-batches, with opt->lr)", *move_err);
    if (why[0]) {
        print_error("%s, %d stage(s), %d micro-batch(es)%s: %s\n", name, P, M,
                    per_micro ? ", vs one model per micro-batch (BN over each micro-batch)" : "", why);
        fail();
    }
    print_message("%s, %d stage(s), %d micro-batch(es) vs one model %s: gradient %.3g x, max diff %.2g; move "
                  "error %.3g (tolerance %.0e)\n", name, P, M, per_micro ? "per micro-batch" : "on the whole batch",
                  c.ratio, c.error, *move_err, STEP_TOL);
    free(before), free(g), free(acc);
    images_free(&im);
    pipe_free(p);
    model_free(after), model_free(one), model_free(table);
    return c;
}

// The step's tests check the hand-offs first: a wrong hand-off makes the step wrong for another reason.
static void require_handoffs(void) {
    char why[300];
    const char *f = check_handoff(true, why, sizeof why);
    grading_require_todo(f == NULL, "2", "%s", f ? f : "");
    const char *b = check_handoff(false, why, sizeof why);
    grading_require_todo(b == NULL, "2", "%s", b ? b : "");
}

// M = 1: naive model parallelism equals one model, on a BN-free net in 2 and 3 stages, with BN in 2, and on
// ResNet-9 (BN and residual blocks) in 3.
static void test_naive_equals_one_model(void **state) {
    (void)state;
    if (!single_process_rank()) return;
    require_handoffs();
    double e;
    int two[3] = {0, 3, 8}, three[4] = {0, 2, 5, 8}, bn[3] = {0, 4, 10};
    pipe_vs_reference("tiny", two, 2, 1, false, &e);
    pipe_vs_reference("tiny", three, 3, 1, false, &e);
    pipe_vs_reference("tiny-bn", bn, 2, 1, false, &e);
    int res[4] = {0, 7, 22, 31};  // after the first max-pool, and after the third: each stage has a residual block
    pipe_vs_reference("resnet9", res, 3, 1, false, &e);
}

// GPipe on a BN-free net: M micro-batches (4 of 4 images; 3 of 6, 5, 5) equal one model on the whole batch.
static void test_micro_batches_equal_full_batch(void **state) {
    (void)state;
    if (!single_process_rank()) return;
    require_handoffs();
    double e;
    int two[3] = {0, 3, 8}, three[4] = {0, 2, 5, 8};
    pipe_vs_reference("tiny", two, 2, 4, false, &e);
    pipe_vs_reference("tiny", three, 3, 3, false, &e);
    pipe_vs_reference("tiny", two, 2, BATCH, false, &e);  // one image per micro-batch
}

// With batch norm, M micro-batches normalise each with its own statistics: the step equals one model run on
// each micro-batch in turn (gradients added up), and differs from one model on the whole batch by far more
// than rounding.
static void test_batchnorm_differs(void **state) {
    (void)state;
    if (!single_process_rank()) return;
    require_handoffs();
    double e_micro, e_full;
    int bn[3] = {0, 4, 10};
    Compare micro = pipe_vs_reference("tiny-bn", bn, 2, 4, true, &e_micro);
    // pipe_vs_reference fails the test itself when the pipe is wrong outright; the comparison with the whole
    // batch, which must NOT agree, is made here.
    ModelConfig cfg = config("tiny-bn");
    Model *table = model_create(&cfg, DEVICE_CPU, 1, 42), *one = model_create(&cfg, DEVICE_CPU, BATCH, 42);
    Pipe *p = pipe_create(table, DEVICE_CPU, bn, 2, 4, BATCH);
    Images im = images_make(BATCH);
    Batch b = {.n = BATCH, .x = im.x, .y = im.y};
    float *g = xcalloc(one->n_params, sizeof(float));
    pipe_step(p, &b, &OPT, 0.0f);
    train_forward_backward(one, &b, 0.0f, 1.0f / BATCH);
    pipe_grads(p, g);
    Compare full = compare_arrays(g, one->grads, one->n_params);
    e_full = full.error;
    print_message("tiny-bn, 4 micro-batches: gradient max diff %.2g vs per-micro-batch BN (tolerance %.0e), %.2g vs "
                  "one model on the whole batch (must exceed %.0e)\n", micro.error, STEP_TOL, e_full, BN_DIFFERS);
    free(g);
    images_free(&im);
    pipe_free(p);
    model_free(one), model_free(table);
    if (!(micro.error <= STEP_TOL && e_micro <= STEP_TOL)) fail();
    if (!(e_full > BN_DIFFERS)) {
        print_error("with batch norm and 4 micro-batches the gradient equals the whole batch's (diff %.2g): every "
                    "micro-batch must go through BN on its own\n", e_full);
        fail();
    }
}

// A short training through 2 stages and 4 micro-batches learns the synthetic task.
static Metrics pipe_step_adapter(void *p, const Batch *b, const SgdConfig *opt, float label_smoothing) {
    return pipe_step(p, b, opt, label_smoothing);
}

static void test_short_run_learns(void **state) {
    (void)state;
    if (!single_process_rank()) return;
    enum { B = 32, EPOCHS = 4 };
    require_handoffs();
    ModelConfig cfg = config("tiny-bn");
    Model *table = model_create(&cfg, DEVICE_CPU, 1, 42);
    int first[3] = {0, 4, table->n_layers};
    Pipe *p = pipe_create(table, DEVICE_CPU, first, 2, 4, B);
    learn_expect(learn_short_run(pipe_step_adapter, p, B, EPOCHS), "pipe_step", "2 stages, 4 micro-batches");
    pipe_free(p);
    model_free(table);
}

// ---------------------------------------------------------------- schedules (schedule.c): GPipe and 1F1B (TODO 4)
// The op lists by their definition (every micro-batch forward and backward exactly once per stage, backward
// after forward, both in the order 0..M-1), and by what the timeline simulator makes of them: how many
// micro-batches' activations a stage stores at once, and the idle time against its closed form. The simulator
// and GPipe are given code; they are checked here along with the learner's 1F1B lists (an unfinished 1F1B
// schedules nothing, which the simulator reports as a step that never ends).
#include "schedule.h"

enum { SCHED_MAX_P = 6, SCHED_MAX_M = 12 };
static const ScheduleKind SCHED_KINDS[2] = {SCHEDULE_GPIPE, SCHEDULE_1F1B};

// Fails with what is wrong when stage s's list (n ops) is not every micro-batch forward then backward exactly
// once, each direction in the order 0..M-1. Returns the most micro-batches forward and not yet backward.
static int sched_check_list(ScheduleKind kind, int P, int M, int s, const PipeOp *ops, int n) {
    if (n != 2 * M) {
        print_error("%s, %d stage(s), %d micro-batch(es): stage %d got %d ops, expected 2 x %d\n", schedule_name(kind),
                    P, M, s, n, M);
        fail();
    }
    int next_f = 0, next_b = 0, inflight = 0, peak = 0;
    for (int i = 0; i < n; i++) {
        // A backward whose forward has not run yet: the op this place needs is that forward (F next_f), whatever
        // micro-batch the backward names. Otherwise the next micro-batch of the op's own direction.
        bool early = ops[i].backward && next_b >= next_f;
        int want = early ? next_f : ops[i].backward ? next_b : next_f;
        if (ops[i].micro != want || early) {
            print_error("%s, %d stage(s), %d micro-batch(es), stage %d, op %d: %c%d, expected %c%d%s\n",
                        schedule_name(kind), P, M, s, i, ops[i].backward ? 'B' : 'F', ops[i].micro,
                        early || !ops[i].backward ? 'F' : 'B', want,
                        early ? " (a backward before its forward: a micro-batch's forward comes first)"
                              : " (each direction takes the micro-batches in order 0..M-1)");
            fail();
        }
        if (ops[i].backward) next_b++, inflight--;
        else next_f++, inflight++;
        if (inflight > peak) peak = inflight;
    }
    return peak;
}

// Fails when the simulated step of kind did not run every op: an op waits on one that never runs.
static void sched_require_ok(ScheduleKind kind, int P, int M, ScheduleStats st) {
    if (!st.ok) {
        print_error("%s, %d stage(s), %d micro-batch(es): the simulated step never ends (some op is missing, or "
                    "waits on one that never runs)\n", schedule_name(kind), P, M);
        fail();
    }
}

// Every list of both schedules for 1..6 stages and 1..12 micro-batches holds every op once in order, and the
// simulator runs them to the end; the peak it reports is the one counted here from the list.
static void test_schedule_every_op_once(void **state) {
    (void)state;
    PipeOp ops[2 * SCHED_MAX_M];
    for (int k = 0; k < 2; k++)
        for (int P = 1; P <= SCHED_MAX_P; P++)
            for (int M = 1; M <= SCHED_MAX_M; M++) {
                ScheduleStats st = schedule_simulate(SCHED_KINDS[k], P, M, 1.0, 2.0, 0.25);
                for (int s = 0; s < P; s++) {
                    int n = pipe_schedule(SCHED_KINDS[k], P, M, s, ops);
                    int peak = sched_check_list(SCHED_KINDS[k], P, M, s, ops, n);
                    sched_require_ok(SCHED_KINDS[k], P, M, st);
                    assert_int_equal(st.peak_inflight[s], peak);
                }
            }
}

// Stage s of P stores at most min(P - s, M) micro-batches' activations under 1F1B; all M under GPipe.
static void test_1f1b_bounds_stored_activations(void **state) {
    (void)state;
    for (int k = 0; k < 2; k++)
        for (int P = 1; P <= SCHED_MAX_P; P++)
            for (int M = 1; M <= SCHED_MAX_M; M++) {
                ScheduleStats st = schedule_simulate(SCHED_KINDS[k], P, M, 1.0, 2.0, 0.0);
                for (int s = 0; s < P; s++) {
                    int want = SCHED_KINDS[k] == SCHEDULE_GPIPE ? M : (P - s < M ? P - s : M);
                    sched_require_ok(SCHED_KINDS[k], P, M, st);
                    if (st.peak_inflight[s] != want) {
                        print_error("%s, %d stage(s), %d micro-batch(es): stage %d stores up to %d micro-batches' "
                                    "activations, expected %d\n", schedule_name(SCHED_KINDS[k]), P, M, s,
                                    st.peak_inflight[s], want);
                        fail();
                    }
                }
            }
}

// The bubble. With every forward t_f, every backward t_b and no hop time, GPipe's last forward (micro-batch
// M-1 on stage P-1) ends at (M+P-1) t_f: M-1 forwards on stage 0 before it, then P stages in turn. The
// backwards then run the same way back: stage 0's last backward ends (M+P-1) t_b later. Each stage works
// M (t_f + t_b) of the step, so every stage is idle (P-1) / (M+P-1) of it. A hop h adds h to each of the P-1
// crossings forward and P-1 back: step (M+P-1)(t_f + t_b) + 2(P-1)h. 1F1B reorders the same ops without
// lengthening the step when h = 0. (Times 1, 2, 0.25: their sums are exact in double; the idle fraction,
// 1 - busy / step, rounds twice at 1e-16, far inside 1e-12.)
static void test_bubble_formula(void **state) {
    (void)state;
    const double tf = 1.0, tb = 2.0, h = 0.25;
    for (int k = 0; k < 2; k++)
        for (int P = 1; P <= SCHED_MAX_P; P++)
            for (int M = 1; M <= SCHED_MAX_M; M++)
                for (int equal = 0; equal < 2; equal++) {
                    double t_b = equal ? tf : tb, formula = (double)(P - 1) / (M + P - 1);
                    ScheduleStats st = schedule_simulate(SCHED_KINDS[k], P, M, tf, t_b, 0.0);
                    sched_require_ok(SCHED_KINDS[k], P, M, st);
                    for (int s = 0; s < P; s++)
                        if (fabs(st.idle[s] - formula) > 1e-12) {
                            print_error("%s, %d stage(s), %d micro-batch(es), t_f %g, t_b %g: stage %d idle %.6f "
                                        "of the step, expected (P-1)/(M+P-1) = %.6f\n",
                                        schedule_name(SCHED_KINDS[k]), P, M, tf, t_b, s, st.idle[s], formula);
                            fail();
                        }
                }
    for (int P = 1; P <= SCHED_MAX_P; P++)
        for (int M = 1; M <= SCHED_MAX_M; M++) {
            ScheduleStats st = schedule_simulate(SCHEDULE_GPIPE, P, M, tf, tb, h);
            sched_require_ok(SCHEDULE_GPIPE, P, M, st);
            double want = (M + P - 1) * (tf + tb) + 2 * (P - 1) * h;
            if (st.step_time != want) {
                print_error("gpipe, %d stage(s), %d micro-batch(es), hop %g: step %g, expected (M+P-1)(t_f+t_b) + "
                            "2(P-1)h = %g\n", P, M, h, st.step_time, want);
                fail();
            }
        }
}

// The simulator stops on orders that cannot run: a backward before its own forward; a wait cycle across two
// stages (stage 0 runs B0 before F1, stage 1 runs F1 before B0: each waits on the other); a missing op; an op
// twice. 1F1B's lists run to the end, with hops and uneven times as well.
static void test_simulator_detects_deadlock(void **state) {
    (void)state;
    PipeOp b_first[2] = {{true, 0}, {false, 0}};
    PipeOp s0[4] = {{false, 0}, {true, 0}, {false, 1}, {true, 1}};
    PipeOp s1[4] = {{false, 0}, {false, 1}, {true, 1}, {true, 0}};
    PipeOp missing[3] = {{false, 0}, {false, 1}, {true, 0}}, twice[4] = {{false, 0}, {false, 0}, {true, 0}, {true, 0}};
    PipeOp gpipe[4] = {{false, 0}, {false, 1}, {true, 0}, {true, 1}};
    PipeOp *one[1] = {b_first}, *cycle[2] = {s0, s1}, *miss[1] = {missing}, *dup[1] = {twice}, *fine[2] = {gpipe, s1};
    int n1[1] = {2}, n2[2] = {4, 4}, n3[1] = {3}, n4[1] = {4};
    assert_false(schedule_simulate_ops(1, 1, one, n1, 1.0, 2.0, 0.0).ok);
    assert_false(schedule_simulate_ops(2, 2, cycle, n2, 1.0, 2.0, 0.0).ok);
    assert_false(schedule_simulate_ops(1, 2, miss, n3, 1.0, 2.0, 0.0).ok);
    assert_false(schedule_simulate_ops(1, 1, dup, n4, 1.0, 2.0, 0.0).ok);
    assert_true(schedule_simulate_ops(2, 2, fine, n2, 1.0, 2.0, 0.0).ok);  // stage 0 GPipe: no cycle
    for (int P = 1; P <= SCHED_MAX_P; P++)
        for (int M = 1; M <= SCHED_MAX_M; M++)
            sched_require_ok(SCHEDULE_1F1B, P, M, schedule_simulate(SCHEDULE_1F1B, P, M, 1.0, 3.0, 0.5));
}
// ---- across processes (tests/lesson08/test_dist.c)
void test_dist_grid(void **state);
void test_dist_groups(void **state);
void test_dist_data_by_replica(void **state);
void test_dist_messages(void **state);
void test_dist_stage_per_rank(void **state);
void test_dist_grid_equals_one_process(void **state);
void test_dist_deadlock_named(void **state);
int lesson08_fault_dispatch(int argc, char **argv);  // `--fault never-sends`: the job test_dist_deadlock_named starts

int main(int argc, char **argv) {
    int fault = lesson08_fault_dispatch(argc, argv);
    if (fault >= 0) return fault;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_costs_by_rule),
        cmocka_unit_test(test_split_covers_every_layer),
        cmocka_unit_test(test_split_is_balanced),
        cmocka_unit_test(test_handoff_forward),
        cmocka_unit_test(test_handoff_backward),
        cmocka_unit_test(test_naive_equals_one_model),
        cmocka_unit_test(test_micro_batches_equal_full_batch),
        cmocka_unit_test(test_batchnorm_differs),
        cmocka_unit_test(test_short_run_learns),
        cmocka_unit_test(test_schedule_every_op_once),
        cmocka_unit_test(test_1f1b_bounds_stored_activations),
        cmocka_unit_test(test_bubble_formula),
        cmocka_unit_test(test_simulator_detects_deadlock),
        // across processes (test_dist.c)
        cmocka_unit_test(test_dist_grid),
        cmocka_unit_test(test_dist_groups),
        cmocka_unit_test(test_dist_data_by_replica),
        cmocka_unit_test(test_dist_messages),
        cmocka_unit_test(test_dist_stage_per_rank),
        cmocka_unit_test(test_dist_grid_equals_one_process),
        cmocka_unit_test(test_dist_deadlock_named),
    };
    return grading_run(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
