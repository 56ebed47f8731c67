// tests/lesson02/test_lesson02.c: the autograder for lesson 02 (the learner's dp.c: scatter, replicate, reduce,
// the DataParallel step).
//
// The pieces are checked one by one against what they must do (chunk sizes and pointers, exact copies, sums),
// then the whole step against independent references built from kit calls in this file:
//   - BN-free model ("tiny"): DataParallel over N = 1, 2, 3 replicas equals ONE model on the same global batch;
//   - with batch norm ("tiny-bn"): it equals N separate models, each normalising its OWN chunk (PyTorch's
//     nn.DataParallel semantics), and differs from one model on the whole batch.
// Hints for failures are in hints.tsv.
#include "tests/testutil.h"

#include "kit/data.h"
#include "kit/log.h"
#include "lesson.h"
#include "kit/model.h"
#include "kit/ops.h"
#include "kit/optim.h"
#include "kit/train.h"

#include "tests/grading.h"
#include "tests/learn_testutil.h"

enum { IMAGE = 3 * 32 * 32 };

// Each SGD step of DataParallel vs its reference, taken from the SAME parameters, momentum and BN statistics
// (the master's): both run the same float32 operations on the same numbers except for the ORDER of some sums
// (a weight gradient is a sum over the batch's images, which the reference adds up in one pass and DataParallel
// as N partial sums, one per chunk, each with its own OpenMP split, added on the master). So they differ by
// rounding, which is compared as the error of the step's move, ||p_dp - p_ref||_2 / ||p_ref - p_before||_2.
//
// Why per step and not after 4 steps side by side: the net is piecewise linear (ReLU, max-pool); two runs that
// differ by rounding now and then put an activation on different sides of a kink and from there follow
// different paths, by 1e-5 or more, on some BLAS kernels and not others (lesson 03's test comment and
// bench/ddp_drift.c show it). From identical state nothing accumulates.
//
// STEP_TOL: both sides compute v' = momentum*v + g + wd*p and p' = p - lr*v' with the same operations on the
// same p, v; they differ through g only, whose elements are float32 sums of at most k = B*H*W = 16*32*32 = 16384
// products in some order: |error| <= gamma_k sum|terms| (gamma_k = k u / (1 - k u) = 1e-3, u = 2^-24) in the
// worst case, and lambda sqrt(k) u sum|terms| = 6 * 128 * 6e-8 = 4.6e-5 sum|terms| with probability 1 - 1e-8
// per element (Higham & Mary 2019). In the 2-norm, which weighs the large gradients where the images agree
// (sum|terms| a few times |g|), 1e-3 leaves a margin of 10 over that and over a kink crossed by the forward's
// own rounding; every mistake is off by 0.3 or more (a gradient scaled by 1/chunk instead of 1/B: (n-1);
// a missing replica: 1/n of the move; stale weights on a replica: O(1)).
#define STEP_TOL 1e-3

// The samples whose two largest logits are closer than `gap`: their argmax may go either way under rounding.
static int near_ties(const Model *m, int n, double gap) {
    const Layer *last = &m->layers[m->n_layers - 1];
    const float *logits = m->acts + last->act_offset * (size_t)m->max_batch;  // (n, classes)
    int k = m->cfg.classes, ties = 0;
    for (int i = 0; i < n; i++) {
        double top = -INFINITY, second = -INFINITY;
        for (int c = 0; c < k; c++) {
            double v = logits[(size_t)i * k + c];
            if (v > top) second = top, top = v;
            else if (v > second) second = v;
        }
        ties += top - second < gap;
    }
    return ties;
}

// The previous rule, for the BN test's lower bound (DataParallel with plain BN differs from one model on the
// whole batch by far more than rounding): relative to max(|value|, 1e-2).
#define PARAM_TOL 1e-5
#define PARAM_FLOOR 1e-2

static ModelConfig config(const char *name) {
    ModelConfig cfg;
    assert_true(model_config(&cfg, name, 0, 3, 32, 32, 10));
    return cfg;
}

// `steps` global batches of `batch` images each, from a synthetic training set (host memory).
typedef struct {
    Dataset ds;
    float *x;  // (steps * batch, 3, 32, 32)
    int *y;    // (steps * batch)
    int batch, steps;
} Batches;

static void batches_make(Batches *bt, int batch, int steps) {
    dataset_synthetic(&bt->ds, batch * steps, 10, 3, 32, 32, 7, SPLIT_TRAIN);
    bt->x = xmalloc((size_t)batch * steps * IMAGE * sizeof(float));
    bt->y = xmalloc((size_t)batch * steps * sizeof(int));
    int *idx = xmalloc((size_t)batch * steps * sizeof(int));
    for (int i = 0; i < batch * steps; i++) idx[i] = i;
    dataset_fill_batch(&bt->ds, idx, batch * steps, NULL, 7, 0, bt->x, bt->y);
    free(idx);
    bt->batch = batch;
    bt->steps = steps;
}

static Batch batches_get(const Batches *bt, int step) {
    size_t first = (size_t)step * bt->batch;
    return (Batch){.n = bt->batch, .x = bt->x + first * IMAGE, .y = bt->y + first, .index = step};
}

static void batches_free(Batches *bt) {
    free(bt->x);
    free(bt->y);
    dataset_free(&bt->ds);
}

static const SgdConfig OPT = {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-4f, .nesterov = false};

// ---------------------------------------------------------------- TODO 1: scatter

// Every global batch size from n to 17 on n = 1..4 replicas: chunk i has n_global / n images, plus one for
// the first n_global % n chunks; the chunks are contiguous, in order, and point into the global batch.
static void test_scatter_chunks(void **state) {
    ModelConfig cfg = config("tiny");
    float *x = xcalloc((size_t)17 * IMAGE, sizeof(float));
    int *y = xcalloc(17, sizeof(int));
    for (int n = 1; n <= 4; n++) {
        DataParallel *dp = dp_create(&cfg, DEVICE_CPU, n, 17, 1);
        for (int total = n; total <= 17; total++) {
            Batch global = {.n = total, .x = x, .y = y, .index = 5};
            dp_scatter(dp, &global);
            int start = 0;
            for (int i = 0; i < n; i++) {
                const Batch *c = &dp->chunks[i];
                int expect = total / n + (i < total % n ? 1 : 0);
                if (c->n != expect) {
                    print_error("%d image(s) on %d replica(s): chunk %d has %d, expected %d (sizes differ by at "
                                "most 1, the first chunks take the extra images)\n", total, n, i, c->n, expect);
                    fail();
                }
                if (c->x != x + (size_t)start * IMAGE || c->y != y + start) {
                    print_error("%d image(s) on %d replica(s): chunk %d does not point at image %d, its first (x and y "
                                "point INTO the batch)\n", total, n, i, start);
                    fail();
                }
                if (c->index != 5) {
                    print_error("chunk %d has index %d; the batch's is 5\n", i, c->index);
                    fail();
                }
                start += c->n;
            }
            assert_int_equal(start, total);  // every image in exactly one chunk
        }
        dp_free(dp);
    }
    free(x);
    free(y);
}

// ---------------------------------------------------------------- TODO 2: replicate

// Gives every replica different numbers in `which` (params or buffers), replicates, and checks that every
// replica now holds exactly the master's numbers (and that the master kept them).
static void check_replicate(bool buffers) {
    ModelConfig cfg = config("tiny-bn");  // has BN running statistics: n_buffers > 0
    DataParallel *dp = dp_create(&cfg, DEVICE_CPU, 3, 12, 1);
    Model *master = dp->replicas[0];
    size_t n = buffers ? master->n_buffers : master->n_params;
    assert_true(n > 0);
    for (int i = 0; i < dp->n; i++) {
        Model *r = dp->replicas[i];
        fill_uniform(r->params, r->n_params, -1.0f, 1.0f, 100 + (uint64_t)i);
        fill_uniform(r->buffers, r->n_buffers, 0.5f, 2.0f, 200 + (uint64_t)i);
    }
    float *expect = xmalloc(n * sizeof(float));
    memcpy(expect, buffers ? master->buffers : master->params, n * sizeof(float));
    dp_replicate(dp);
    for (int i = 0; i < dp->n; i++) {
        const float *got = buffers ? dp->replicas[i]->buffers : dp->replicas[i]->params;
        if (memcmp(got, expect, n * sizeof(float)) != 0)
            print_error("replica %d: its %s differ from the master's after dp_replicate\n", i,
                        buffers ? "BN buffers (running mean/var)" : "parameters");
        assert_close(got, expect, n, 0.0, 1.0);  // an exact copy
    }
    free(expect);
    dp_free(dp);
}

static void test_replicate_copies_params(void **state) { check_replicate(false); }
static void test_replicate_copies_buffers(void **state) { check_replicate(true); }

// ---------------------------------------------------------------- TODO 3: reduce

// Known gradients on 3 replicas: the master must end with their sum (not the mean, not twice its own).
static void test_reduce_sums_onto_master(void **state) {
    ModelConfig cfg = config("tiny");
    DataParallel *dp = dp_create(&cfg, DEVICE_CPU, 3, 12, 1);
    size_t n = dp->replicas[0]->n_params;
    float *expect = xcalloc(n, sizeof(float));
    for (int i = 0; i < dp->n; i++) {
        fill_uniform(dp->replicas[i]->grads, n, -1.0f, 1.0f, 300 + (uint64_t)i);
        for (size_t j = 0; j < n; j++) expect[j] += dp->replicas[i]->grads[j];
    }
    dp_reduce_to_master(dp);
    // Three numbers in [-1, 1] summed in float32 in any order: |error| <= gamma_2 * sum|g| <= 2u * 3 = 3.6e-7 each
    // (floor 1.0: absolute); a mean instead of the sum or the master's own twice is off by 0.1 or more.
    assert_close(dp->replicas[0]->grads, expect, n, 1e-6, 1.0);
    free(expect);
    dp_free(dp);
}

// ---------------------------------------------------------------- TODO 4: the whole step

// The step is TODO 1-3 put together: each is checked first on one small known case, so that a wrong piece
// reads "fix TODO N first" instead of a parameter difference after four steps.
static void require_pieces(void) {
    enum { N = 16, R = 3 };  // 16 images on 3 replicas: chunks of 6, 5, 5 at images 0, 6, 11
    ModelConfig cfg = config("tiny-bn");
    DataParallel *dp = dp_create(&cfg, DEVICE_CPU, R, N, 1);
    float *x = xcalloc((size_t)N * IMAGE, sizeof(float));
    int y[N] = {0};
    Batch global = {.n = N, .x = x, .y = y, .index = 3};
    dp_scatter(dp, &global);
    bool scatter_ok = true;
    for (int i = 0, start = 0; i < R; i++) {
        const Batch *c = &dp->chunks[i];
        int expect = N / R + (i < N % R ? 1 : 0);
        scatter_ok = scatter_ok && c->n == expect && c->x == x + (size_t)start * IMAGE && c->y == y + start &&
                     c->index == 3;
        start += expect;
    }
    Model *master = dp->replicas[0];
    size_t np = master->n_params, nb = master->n_buffers;
    float *sum = xcalloc(np, sizeof(float));
    for (int i = 0; i < R; i++) {
        fill_uniform(dp->replicas[i]->params, np, -1.0f, 1.0f, 100 + (uint64_t)i);
        fill_uniform(dp->replicas[i]->buffers, nb, 0.5f, 2.0f, 200 + (uint64_t)i);
    }
    dp_replicate(dp);
    bool replicate_ok = true;
    for (int i = 1; i < R; i++)
        replicate_ok = replicate_ok && memcmp(dp->replicas[i]->params, master->params, np * sizeof(float)) == 0 &&
                       memcmp(dp->replicas[i]->buffers, master->buffers, nb * sizeof(float)) == 0;
    for (int i = 0; i < R; i++) {
        fill_uniform(dp->replicas[i]->grads, np, -1.0f, 1.0f, 300 + (uint64_t)i);
        for (size_t j = 0; j < np; j++) sum[j] += dp->replicas[i]->grads[j];
    }
    dp_reduce_to_master(dp);
    bool reduce_ok = max_rel_error(master->grads, sum, np, 1.0) <= 1e-6;  // as test_reduce_sums_onto_master
    free(sum);
    free(x);
    dp_free(dp);
    grading_require_todo(scatter_ok, "1", "the step scatters with it (see test_scatter_chunks)");
    grading_require_todo(replicate_ok, "2", "the step replicates with it (see test_replicate_*)");
    grading_require_todo(reduce_ok, "3", "the step reduces with it (see test_reduce_sums_onto_master)");
}

// DataParallel over n replicas vs ONE model on the same global batches (BN-free model): at every step, from the
// master's parameters and momentum, the same metrics (measured before the update) and the same move.
static void check_dp_equals_one_model(int n) {
    enum { BATCH = 16, STEPS = 4 };  // 16 images on 3 replicas: chunks of 6, 5, 5 (the 1/B scale matters)
    require_pieces();
    Batches bt;
    batches_make(&bt, BATCH, STEPS);
    ModelConfig cfg = config("tiny");
    DataParallel *dp = dp_create(&cfg, DEVICE_CPU, n, BATCH, 42);
    Model *one = model_create(&cfg, DEVICE_CPU, BATCH, 42);
    Model *master = dp->replicas[0];
    float *before = xmalloc(one->n_params * sizeof(float));
    double worst = 0.0;
    for (int s = 1; s <= STEPS; s++) {
        Batch b = batches_get(&bt, s - 1);
        memcpy(one->params, master->params, one->n_params * sizeof(float));
        memcpy(one->velocity, master->velocity, one->n_params * sizeof(float));
        memcpy(before, master->params, one->n_params * sizeof(float));
        Metrics got = dp_step(dp, &b, &OPT, 0.0f);
        Metrics ref = train_forward_backward(one, &b, 0.0f, 1.0f / BATCH);
        // An argmax may flip only where the two largest logits are within the forward's rounding: the logits
        // are O(1) results of sums of at most 72 products per layer, 4 layers deep, so gamma_72 = 4.3e-6 per
        // layer of values of a few units: 1e-4 is far above that.
        int ties = near_ties(one, BATCH, 1e-4);
        optim_step(one, &OPT);
        // The first quantity that differs, at the first step where it does. The master's gradient is the same
        // float32 sums as one model's in another order: at most ~(terms) x 6e-8 x sum|terms| apart, under 1e-4
        // of the largest gradient even with heavy cancellation; 1e-3 keeps every mistake (a replica missing or
        // counted twice, 1/chunk instead of 1/B: 30 % or more) far outside.
        // The loss: a sum of BATCH positive per-image losses of O(1), each a log-sum-exp of those logits: the
        // rounding of the forward (gamma_72 per layer, above) makes at most a few 1e-6 of it.
        Compare g = compare_arrays(master->grads, one->grads, one->n_params);
        char why[400] = "";
        if (got.count != BATCH)
            snprintf(why, sizeof why, "step %d: dp_step returned count %ld for a batch of %d", s, got.count, BATCH);
        else if (labs(got.correct - ref.correct) > ties || !(fabs(got.loss_sum - ref.loss_sum) <= 1e-5 * fabs(ref.loss_sum)))
            snprintf(why, sizeof why, "step %d: loss_sum %.6g, one model's %.6g%s", s, got.loss_sum, ref.loss_sum,
                     s == 1 ? "" : ": a replica computed with stale weights (replicate first?)");
        else if (!(g.error <= 1e-3))
            snprintf(why, sizeof why, "step %d: master's gradient %.3g x one model's (max diff %.2g)%s", s,
                     g.ratio, g.error,
                     n > 1 && fabs(g.ratio - n) < 0.15 * n ? ": 1/(chunk) instead of 1/(global batch)?"
                     : n > 1 && fabs(g.ratio * n - 1) < 0.15
                         ? ": about 1/N of it: the other replicas' gradients not added (reduce?), or divided by the "
                           "number of replicas again?"
                     : fabs(g.ratio) < 0.05 ? ": no gradient reached the master"
                     : n > 1 && BATCH % n != 0 && fabs(g.ratio - 1) < 0.2
                         ? ": a scale that depends on the chunk? every image weighs 1/(global batch)"
                         : "");
        if (why[0]) {
            print_error("%d replica(s): %s\n", n, why);
            fail();
        }
        double e = move_error(master->params, one->params, before, one->n_params);
        worst = e > worst || isinf(e) ? e : worst;
    }
    print_message("%d replica(s) vs one model, each step from the master's state: worst move error %.3g (2-norm, "
                  "tolerance %.0e)\n", n, worst, STEP_TOL);
    free(before);
    if (!(worst <= STEP_TOL)) {
        print_error("a DataParallel step on %d replicas differs from one model's step by %.3g of the move\n", n, worst);
        fail();
    }
    model_free(one);
    dp_free(dp);
    batches_free(&bt);
}

static void test_dp_equals_one_model_n1(void **state) { check_dp_equals_one_model(1); }
static void test_dp_equals_one_model_n2(void **state) { check_dp_equals_one_model(2); }
static void test_dp_equals_one_model_n3(void **state) { check_dp_equals_one_model(3); }

// With batch norm, each replica normalises its chunk with the chunk's OWN mean and variance (PyTorch's
// nn.DataParallel does the same), so DataParallel does NOT equal one model on the global batch. Its reference
// is n separate kit models, one per chunk, each starting from the master's weights and running statistics,
// their gradients summed onto model 0, which alone takes the SGD step and keeps its running statistics.
static void check_dp_batchnorm(int n) {
    enum { BATCH = 16, STEPS = 4 };
    Batches bt;
    batches_make(&bt, BATCH, STEPS);
    ModelConfig cfg = config("tiny-bn");
    DataParallel *dp = dp_create(&cfg, DEVICE_CPU, n, BATCH, 42);
    Model *ref[DP_MAX_REPLICAS];
    for (int i = 0; i < n; i++) ref[i] = model_create(&cfg, DEVICE_CPU, BATCH, 42);
    Model *one = model_create(&cfg, DEVICE_CPU, BATCH, 42);  // one model, BN over the whole global batch
    Model *master = dp->replicas[0];
    float *before = xmalloc(master->n_params * sizeof(float)), *bbefore = xmalloc(master->n_buffers * sizeof(float));
    double e_step = 0.0, e_buf = 0.0;
    for (int s = 0; s < STEPS; s++) {
        Batch b = batches_get(&bt, s);
        // The per-chunk reference starts each step from the master's state (STEP_TOL says why).
        memcpy(ref[0]->params, master->params, master->n_params * sizeof(float));
        memcpy(ref[0]->velocity, master->velocity, master->n_params * sizeof(float));
        memcpy(ref[0]->buffers, master->buffers, master->n_buffers * sizeof(float));
        memcpy(before, master->params, master->n_params * sizeof(float));
        memcpy(bbefore, master->buffers, master->n_buffers * sizeof(float));
        dp_step(dp, &b, &OPT, 0.0f);

        int start = 0;
        for (int i = 0; i < n; i++) {
            int size = BATCH / n + (i < BATCH % n ? 1 : 0);
            Batch chunk = {.n = size, .x = b.x + (size_t)start * IMAGE, .y = b.y + start, .index = s};
            start += size;
            if (i > 0) {  // start from model 0's weights and running statistics
                memcpy(ref[i]->params, ref[0]->params, ref[0]->n_params * sizeof(float));
                memcpy(ref[i]->buffers, ref[0]->buffers, ref[0]->n_buffers * sizeof(float));
            }
            train_forward_backward(ref[i], &chunk, 0.0f, 1.0f / BATCH);
        }
        for (int i = 1; i < n; i++)
            for (size_t j = 0; j < ref[0]->n_params; j++) ref[0]->grads[j] += ref[i]->grads[j];
        optim_step(ref[0], &OPT);
        // Equal to per-replica BN, step by step: the parameters' move, and the master's running statistics (those
        // of chunk 0: batch means and variances, sums of at most 6 * 32 * 32 terms, the same argument).
        double e = move_error(master->params, ref[0]->params, before, master->n_params);
        double eb = move_error(master->buffers, ref[0]->buffers, bbefore, master->n_buffers);
        e_step = e > e_step || isinf(e) ? e : e_step;
        e_buf = eb > e_buf || isinf(eb) ? eb : e_buf;

        train_forward_backward(one, &b, 0.0f, 1.0f / BATCH);
        optim_step(one, &OPT);
    }
    double e_one = max_rel_error(master->params, one->params, master->n_params, PARAM_FLOOR);
    print_message("BN, %d replicas: worst step's move error %.3g (parameters) %.3g (running statistics) vs per-chunk "
                  "BN (tolerance %.0e); after %d steps %.3g vs one model on the whole batch\n", n, e_step, e_buf,
                  STEP_TOL, STEPS, e_one);
    assert_true(e_step <= STEP_TOL);
    assert_true(e_buf <= STEP_TOL);
    free(before);
    free(bbefore);
    // ...and NOT equal to one model on the global batch: that is what SyncBN (lesson 05) fixes. The trajectories
    // differ by 0.39 here (per-chunk statistics), 100 x PARAM_TOL is 1e-3: rounding cannot close that gap.
    assert_true(e_one > 100 * PARAM_TOL);
    assert_true(max_rel_error(master->buffers, one->buffers, master->n_buffers, PARAM_FLOOR) > 100 * PARAM_TOL);
    for (int i = 0; i < n; i++) model_free(ref[i]);
    model_free(one);
    dp_free(dp);
    batches_free(&bt);
}

static void test_dp_batchnorm_is_per_replica(void **state) {
    require_pieces();
    check_dp_batchnorm(2);
    check_dp_batchnorm(3);
}

// ---------------------------------------------------------------- all together: it learns

static Metrics dp_step_adapter(void *dp, const Batch *b, const SgdConfig *opt, float label_smoothing) {
    return dp_step(dp, b, opt, label_smoothing);
}

static void test_dp_short_run_learns(void **state) {
    enum { BATCH = 32, EPOCHS = 4 };
    require_pieces();
    ModelConfig cfg = config("tiny-bn");
    DataParallel *dp = dp_create(&cfg, DEVICE_CPU, 2, BATCH, 42);
    learn_expect(learn_short_run(dp_step_adapter, dp, BATCH, EPOCHS), "dp_step", "2 replicas");
    dp_free(dp);
}

// ---------------------------------------------------------------- TODO 4: the time split

// The lesson measures the master bottleneck from dp->times: every step counted, each phase timed into its own
// field. Only what holds by construction is checked, never a duration against a number: the compute phase's
// interval encloses every replica's own forward + backward (so compute >= compute_slowest, which the given
// code adds up inside the workers), and the five phases are disjoint intervals inside this test's own.
static void test_dp_step_times_phases(void **state) {
    enum { BATCH = 16, STEPS = 3 };
    require_pieces();
    Batches bt;
    batches_make(&bt, BATCH, STEPS);
    ModelConfig cfg = config("tiny");
    DataParallel *dp = dp_create(&cfg, DEVICE_CPU, 2, BATCH, 42);
    double start = time_now();
    for (int s = 0; s < STEPS; s++) {
        Batch b = batches_get(&bt, s);
        dp_step(dp, &b, &OPT, 0.0f);
    }
    double wall = time_now() - start;
    DpTimes t = dp->times;
    dp_free(dp);
    batches_free(&bt);
    if (t.steps != STEPS) {
        print_error("dp->times.steps is %ld after %d calls of dp_step: count every step (the time split divides "
                    "by it)\n", t.steps, STEPS);
        fail();
    }
    const double phase[5] = {t.scatter, t.replicate, t.compute, t.reduce, t.update};
    const char *name[5] = {"scatter", "replicate", "compute", "reduce", "update"};
    double sum = 0.0;
    for (int i = 0; i < 5; i++) {
        if (!(phase[i] >= 0.0)) {
            print_error("dp->times.%s is %g: each phase adds now - t, t being the end of the phase before\n", name[i],
                        phase[i]);
            fail();
        }
        sum += phase[i];
    }
    if (!(t.compute_slowest > 0.0 && t.compute >= t.compute_slowest)) {
        print_error("dp->times.compute is %.3g s, but the replicas' forward + backward alone took %.3g s: time the "
                    "compute phase (dp_parallel_forward_backward) into dp->times.compute\n", t.compute,
                    t.compute_slowest);
        fail();
    }
    if (!(sum <= wall)) {
        print_error("the five phases add up to %.3g s, but the %d steps took %.3g s: a phase counted twice, or t "
                    "not moved on (dp_phase_done does both)\n", sum, STEPS, wall);
        fail();
    }
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scatter_chunks),
        cmocka_unit_test(test_replicate_copies_params),
        cmocka_unit_test(test_replicate_copies_buffers),
        cmocka_unit_test(test_reduce_sums_onto_master),
        cmocka_unit_test(test_dp_equals_one_model_n1),
        cmocka_unit_test(test_dp_equals_one_model_n2),
        cmocka_unit_test(test_dp_equals_one_model_n3),
        cmocka_unit_test(test_dp_batchnorm_is_per_replica),
        cmocka_unit_test(test_dp_short_run_learns),
        cmocka_unit_test(test_dp_step_times_phases),
    };
    return grading_run(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
