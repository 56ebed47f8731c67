// tests/lesson01/test_lesson01.c: the autograder for lesson 01 (the learner's train.c, sgd.c, sgd_kernel.cu).
//
// Each test compares the learner's function with an independent reference: the SGD update with a float64
// formula written here, the training step with the same step composed from kit calls, evaluation with a
// direct count. Hints for failures are in hints.tsv.
#include "tests/testutil.h"

#include "tests/grading.h"

#include "kit/data.h"
#include "lesson.h"
#include "kit/model.h"
#include "kit/ops.h"
#include "kit/optim.h"

// ---------------------------------------------------------------- TODO 1: the SGD update

// float64 reference of torch.optim.SGD's update, several steps in a row (so the momentum buffer matters).
static void sgd_reference(size_t n, double *p, const double *g, double *v, double lr, double mom, double wd,
                          int nesterov) {
    for (size_t i = 0; i < n; i++) {
        double gi = g[i] + wd * p[i];
        v[i] = mom * v[i] + gi;
        p[i] -= lr * (nesterov ? gi + mom * v[i] : v[i]);
    }
}

// Past the end of each array lies a guard of GUARD floats holding a value no update produces, checked
// after the steps: an update that writes one element too many (a `<=` bound) is named as such, on the CPU
// and on the GPU alike (on the CPU emulator's build, AddressSanitizer would stop at the first such access).
enum { GUARD = 64 };
static const float GUARD_VALUE = 12345.0f;

static void check_guard(const char *what, const float *guard, size_t n) {
    for (size_t i = 0; i < GUARD; i++) {
        if (guard[i] != GUARD_VALUE) {
            print_error("the update wrote %s[%zu], past the end of the array (n = %zu): the bound is i < n\n", what,
                        n + i, n);
            fail();
        }
    }
}

// Runs three updates of lesson_sgd_update on device d and returns the largest relative error of the parameters
// and the velocity against the float64 reference (infinite when it wrote past the end or left elements alone).
// With assert_it, fails at once and says what is wrong.
static double sgd_case(Device d, size_t N, float momentum, float weight_decay, int nesterov, bool assert_it) {
    enum { STEPS = 3 };
    size_t bytes = (N + GUARD) * sizeof(float);
    float *p = xmalloc(bytes), *g = xmalloc(bytes), *v = xcalloc(N + GUARD, sizeof(float));
    double *pr = xmalloc(N * sizeof(double)), *gr = xmalloc(N * sizeof(double)), *vr = xcalloc(N, sizeof(double));
    fill_uniform(p, N, -1.0f, 1.0f, 11);
    for (size_t i = 0; i < GUARD; i++) p[N + i] = v[N + i] = g[N + i] = GUARD_VALUE;
    for (size_t i = 0; i < N; i++) pr[i] = p[i];
    float *dp = device_alloc(d, bytes), *dg = device_alloc(d, bytes), *dv = device_alloc(d, bytes);
    device_copy_to(d, dp, p, bytes);
    device_copy_to(d, dv, v, bytes);
    for (int s = 0; s < STEPS; s++) {
        fill_uniform(g, N, -1.0f, 1.0f, 100 + (uint64_t)s);  // a new gradient every step
        for (size_t i = 0; i < N; i++) gr[i] = g[i];
        device_copy_to(d, dg, g, bytes);
        lesson_sgd_update(d, N, dp, dg, dv, 0.1f, momentum, weight_decay, nesterov);
        sgd_reference(N, pr, gr, vr, 0.1, momentum, weight_decay, nesterov);
    }
    device_copy_from(d, p, dp, bytes);
    device_copy_from(d, v, dv, bytes);
    bool guards_ok = true;
    for (size_t i = 0; i < GUARD; i++) guards_ok = guards_ok && p[N + i] == GUARD_VALUE && v[N + i] == GUARD_VALUE;
    if (assert_it) {
        check_guard("param", p + N, N);
        check_guard("velocity", v + N, N);
    }
    // Elements at the end never updated: on the GPU the sign of a kernel without a grid-stride loop (the
    // launch has fewer threads than the array has elements). An update always moves a parameter here.
    float *p0 = xmalloc(N * sizeof(float));
    fill_uniform(p0, N, -1.0f, 1.0f, 11);
    size_t last = N;
    while (last > 0 && p[last - 1] == p0[last - 1]) last--;
    free(p0);
    if (assert_it && last == 0) {
        print_error("no parameter was updated (the update did nothing)\n");
        fail();
    }
    if (assert_it && last < N) {
        print_error("param[%zu] to param[%zu] were never updated%s\n", last, N - 1,
                    d == DEVICE_CUDA ? ": the threads did not cover the array; each starts at its global index "
                                       "(block and thread) and loops with a grid-stride step, as the grid may "
                                       "have fewer threads than the array has elements"
                                     : ": the loop must visit every i < n");
        fail();
    }
    float *pref = xmalloc(N * sizeof(float)), *vref = xmalloc(N * sizeof(float));
    for (size_t i = 0; i < N; i++) pref[i] = (float)pr[i], vref[i] = (float)vr[i];
    // Three float32 steps vs float64, element by element (no BLAS: the same on every CPU). Each step is at most
    // 5 roundings (wd*p, +g, mu*v, +, p - lr*v; Nesterov 2 more) of numbers below 3 in size (|p|, |g| <= 1,
    // |v| <= 1/(1 - 0.9) bounded by 3 after 3 steps), and an error made in one step is carried on, not grown
    // (|mu| < 1, lr < 1): |error| <= 3 steps x 7 roundings x u x 3 = 3.8e-6, so 1e-5 of max(|ref|, 1) holds;
    // the terms may cancel (v = 0.9 v + g), hence the floor 1. Any formula mistake is off by 1e-2 or more.
    if (assert_it) {
        assert_close(p, pref, N, 1e-5, 1.0);
        assert_close(v, vref, N, 1e-5, 1.0);
    }
    double err = guards_ok && last == N ? fmax(max_rel_error(p, pref, N, 1.0), max_rel_error(v, vref, N, 1.0))
                                        : INFINITY;
    device_free(d, dp), device_free(d, dg), device_free(d, dv);
    free(p), free(g), free(v), free(pr), free(gr), free(vr), free(pref), free(vref);
    return err;
}


// The classic mistakes of TODO 1, each as a float64 variant of the reference: when the learner's update equals
// one of them (and not the right one), the failure names it instead of a bare difference.
typedef enum {
    SGD_ASCENT, SGD_V_NOT_STORED, SGD_NO_DECAY, SGD_DECAY_ON_STEP, SGD_NESTEROV_OLD_V, SGD_NESTEROV_IGNORED,
    SGD_NESTEROV_ALWAYS, SGD_DAMPENED, SGD_VARIANTS
} SgdVariant;

static const char *const SGD_MISTAKE[SGD_VARIANTS] = {
    "the parameters moved UP the gradient: the update subtracts lr times the step",
    "the new velocity was not stored: each call must leave it in velocity[i], where the next call starts from",
    "weight decay was left out: the gradient is grad + weight_decay * param",
    "weight decay was added to the step after the momentum: torch adds it to the gradient, BEFORE the velocity update",
    "Nesterov's look-ahead used the velocity from before this step: it uses the new one (g + momentum * v_new)",
    "the nesterov flag was ignored: with it, the step is g + momentum * v, not v",
    "Nesterov's look-ahead was applied though nesterov is 0",
    "the velocity was averaged (momentum * v + (1 - momentum) * g): torch's SGD sums, v = momentum * v + g",
};

static void sgd_variant(SgdVariant k, size_t n, double *p, const double *g, double *v, double lr, double mom,
                        double wd, int nesterov) {
    for (size_t i = 0; i < n; i++) {
        double gi = g[i] + (k == SGD_NO_DECAY || k == SGD_DECAY_ON_STEP ? 0.0 : wd * p[i]);
        double old = v[i];
        double vi = k == SGD_DAMPENED ? mom * old + (1 - mom) * gi : mom * old + gi;
        int nest = k == SGD_NESTEROV_IGNORED ? 0 : k == SGD_NESTEROV_ALWAYS ? 1 : nesterov;
        double step = nest ? gi + mom * (k == SGD_NESTEROV_OLD_V ? old : vi) : vi;
        if (k == SGD_DECAY_ON_STEP) step += wd * p[i];
        p[i] += k == SGD_ASCENT ? lr * step : -lr * step;
        v[i] = k == SGD_V_NOT_STORED ? old : vi;
    }
}

// Three updates of lesson_sgd_update on a small case; the mistake of SGD_MISTAKE it matches, or NULL.
static const char *sgd_diagnose(Device d, float momentum, float weight_decay, int nesterov) {
    enum { N = 64, STEPS = 3 };
    float p[N], g[N], v[N] = {0};
    double pr[N], vr[N] = {0}, gr[N], pk[SGD_VARIANTS][N], vk[SGD_VARIANTS][N];
    fill_uniform(p, N, -1.0f, 1.0f, 21);
    for (size_t i = 0; i < N; i++) pr[i] = p[i];
    for (int k = 0; k < SGD_VARIANTS; k++)
        for (size_t i = 0; i < N; i++) pk[k][i] = p[i], vk[k][i] = 0.0;
    float *dp = device_alloc(d, sizeof p), *dg = device_alloc(d, sizeof g), *dv = device_alloc(d, sizeof v);
    device_copy_to(d, dp, p, sizeof p);
    device_copy_to(d, dv, v, sizeof v);
    for (int s = 0; s < STEPS; s++) {
        fill_uniform(g, N, -1.0f, 1.0f, 200 + (uint64_t)s);
        for (size_t i = 0; i < N; i++) gr[i] = g[i];
        device_copy_to(d, dg, g, sizeof g);
        lesson_sgd_update(d, N, dp, dg, dv, 0.1f, momentum, weight_decay, nesterov);
        sgd_reference(N, pr, gr, vr, 0.1, momentum, weight_decay, nesterov);
        for (int k = 0; k < SGD_VARIANTS; k++) sgd_variant(k, N, pk[k], gr, vk[k], 0.1, momentum, weight_decay, nesterov);
    }
    device_copy_from(d, p, dp, sizeof p);
    device_copy_from(d, v, dv, sizeof v);
    device_free(d, dp), device_free(d, dg), device_free(d, dv);
    // float32 against float64 after 3 steps: 3.8e-6 at most (sgd_case's comment); every variant that differs
    // from the right update here differs by 1e-2 or more.
    double err = 0.0;
    for (size_t i = 0; i < N; i++) err = fmax(err, fmax(fabs(p[i] - pr[i]), fabs(v[i] - vr[i])));
    if (err <= 1e-4) return NULL;
    for (int k = 0; k < SGD_VARIANTS; k++) {
        double ek = 0.0, dk = 0.0;  // learner vs variant; variant vs the right update
        for (size_t i = 0; i < N; i++) {
            ek = fmax(ek, fmax(fabs(p[i] - pk[k][i]), fabs(v[i] - vk[k][i])));
            dk = fmax(dk, fmax(fabs(pr[i] - pk[k][i]), fabs(vr[i] - vk[k][i])));
        }
        if (ek <= 1e-4 && dk > 1e-3) return SGD_MISTAKE[k];
    }
    return NULL;
}

static void check_sgd_case(Device d, size_t N, float momentum, float weight_decay, int nesterov) {
    const char *mistake = sgd_diagnose(d, momentum, weight_decay, nesterov);
    if (mistake) {
        print_error("%s\n", mistake);
        fail();
    }
    sgd_case(d, N, momentum, weight_decay, nesterov, true);
}

// Prerequisite of every test that trains: TODO 1 right in all four settings, on 64 elements.
static void require_sgd_update(void) {
    double err = fmax(fmax(sgd_case(DEVICE_CPU, 64, 0.0f, 0.0f, 0, false),    // plain
                           sgd_case(DEVICE_CPU, 64, 0.9f, 0.0f, 0, false)),   // momentum
                      fmax(sgd_case(DEVICE_CPU, 64, 0.9f, 0.0f, 1, false),    // Nesterov
                           sgd_case(DEVICE_CPU, 64, 0.9f, 5e-2f, 0, false)));  // weight decay
    grading_require_todo(err <= 1e-5, "1", "this test trains with your SGD update (see test_sgd_*)");
}

static void test_sgd_plain(void **state) { check_sgd_case(DEVICE_CPU, 1000, 0.0f, 0.0f, 0); }
static void test_sgd_momentum(void **state) { check_sgd_case(DEVICE_CPU, 1000, 0.9f, 0.0f, 0); }
static void test_sgd_nesterov(void **state) { check_sgd_case(DEVICE_CPU, 1000, 0.9f, 0.0f, 1); }
static void test_sgd_weight_decay(void **state) { check_sgd_case(DEVICE_CPU, 1000, 0.9f, 5e-2f, 0); }
// On a machine without a GPU the grader runs this test in the CUDA emulator (make EMU=1): the same kernel,
// every thread of the grid, so the same mistakes fail (kit/cuda/README.md says what it does not model).
static void test_sgd_cuda_kernel(void **state) {
    skip_without_gpu();
    check_sgd_case(DEVICE_CUDA, 1000, 0.9f, 5e-2f, 0);
    check_sgd_case(DEVICE_CUDA, 1000, 0.9f, 0.0f, 1);
    // More elements than the launch has threads (4096 blocks x 256): only a grid-stride loop covers them all.
    // One ResNet-9 conv weight alone has 2.4 million floats.
    check_sgd_case(DEVICE_CUDA, (1u << 21) + 3, 0.9f, 5e-2f, 1);
}

// ---------------------------------------------------------------- TODO 3: the training step

typedef struct {
    Dataset train;
    Sampler sampler;
    Loader *loader;
} Data;

static void data_open(Data *dt, int batch) {
    dataset_synthetic(&dt->train, 600, 10, 3, 32, 32, 7, SPLIT_TRAIN);
    sampler_init(&dt->sampler, dt->train.n, 0, 1, 7, SAMPLER_TRAIN_DROP);
    dt->loader = loader_create(&dt->train, &dt->sampler, batch, true, NULL, 7);
}
static void data_close(Data *dt) {
    loader_free(dt->loader);
    dataset_free(&dt->train);
}

static Model *tiny_model(const char *name, int batch) {
    ModelConfig cfg;
    assert_true(model_config(&cfg, name, 0, 3, 32, 32, 10));
    return model_create(&cfg, DEVICE_CPU, batch, 42);
}

// The same step composed from kit calls: the reference the learner's train_step must match.
static double reference_step(Model *m, const Batch *b, const SgdConfig *opt, float smoothing) {
    int n = b->n, k = m->cfg.classes;
    memcpy(m->input, b->x, (size_t)n * 3 * 32 * 32 * sizeof(float));
    memcpy(m->labels, b->y, (size_t)n * sizeof(int));
    const float *logits = model_forward(m, m->input, n, true);
    cross_entropy_forward(DEVICE_CPU, n, k, logits, m->labels, smoothing, m->loss);
    memset(m->dlogits, 0, (size_t)n * k * sizeof(float));
    cross_entropy_backward(DEVICE_CPU, n, k, logits, m->labels, smoothing, 1.0f / n, m->dlogits);
    model_zero_grad(m);
    model_backward(m, m->input, m->dlogits, n);
    optim_step(m, opt);
    double loss_sum = 0;
    for (int i = 0; i < n; i++) loss_sum += m->loss[i];
    return loss_sum;
}

// Tolerances of the step comparisons. Every step starts from the learner's own state (copied into the
// reference), so one step of the learner is compared with one step of the kit from identical numbers. With
// the kit's own calls it is bit for bit; an equivalent formula changes a gradient by a few roundings (u = 6e-8
// relative each), which moves a parameter by lr * few u |g|, far below STEP_TOL = 1e-5 of max(|p|, 1e-4);
// velocity and BN statistics likewise. Gradients are compared only to explain a difference: from identical
// state they differ by a few roundings of the largest gradient; GRAD_TOL = 1e-3 keeps every mistake below
// (a 1/n missing, gradients of two steps added, a short batch scaled wrongly: 5 % to 3000 %) visible.
#define STEP_TOL 1e-5
#define STEP_FLOOR 1e-4
#define GRAD_TOL 1e-3

// What a gradient or update ratio usually means, for the messages ("" when no usual cause fits).
static const char *explain_ratio(double ratio, int step, int n, int max_batch) {
    if (fabs(ratio - 1.0 / n) < 0.05 / n) return ": n times too small (1/n applied twice?)";
    if (fabs(ratio) < 0.05) return ": nothing arrived (no backward before the update? no update?)";
    if (fabs(ratio + 1) < 0.05) return ": the opposite sign (a step goes DOWN the gradient)";
    if (n != max_batch && fabs(ratio - (double)n / max_batch) < 0.02)
        return ": divided by the model's largest batch, not by THIS batch's size";
    if (fabs(ratio - n) < 0.05 * n) return ": n times too large (the loss is a MEAN: 1/n)";
    if (step >= 2 && ratio > 1.2 && ratio < 3.0) return ": old gradients left in them? (backward ADDS: zero first)";
    return "";
}

// Compares the learner's model with the reference after step `step` (both started it from the same state,
// whose parameters are in `before`; `prev` holds the reference's gradients of the step before, or NULL).
// Writes the first quantity that differs, and by how much, into why.
static bool step_agrees(int step, const Model *mine, const Model *ref, const float *before, const float *prev, int n,
                        float smoothing, char *why, size_t len) {
    size_t np = mine->n_params;
    float *move = xmalloc(np * sizeof(float)), *ref_move = xmalloc(np * sizeof(float));
    for (size_t i = 0; i < np; i++) move[i] = mine->params[i] - before[i], ref_move[i] = ref->params[i] - before[i];
    Compare pm = compare_arrays(move, ref_move, np);
    Compare gr = compare_arrays(mine->grads, ref->grads, np);
    Compare ve = compare_arrays(mine->velocity, ref->velocity, np);
    Compare bu = compare_arrays(mine->buffers, ref->buffers, mine->n_buffers);
    Compare both = {.error = INFINITY};  // mine vs this step's + the previous step's gradients
    if (prev) {
        for (size_t i = 0; i < np; i++) move[i] = ref->grads[i] + prev[i];
        both = compare_arrays(mine->grads, move, np);
    }
    bool grads_kept = false;  // zeroing the gradients after the update is fine: then they cannot be compared
    for (size_t i = 0; i < np && !grads_kept; i++) grads_kept = mine->grads[i] != 0.0f;
    free(move);
    free(ref_move);
    bool params_ok = max_rel_error(mine->params, ref->params, np, STEP_FLOOR) <= STEP_TOL;
    bool velocity_ok = max_rel_error(mine->velocity, ref->velocity, np, STEP_FLOOR) <= STEP_TOL;
    bool buffers_ok = max_rel_error(mine->buffers, ref->buffers, mine->n_buffers, STEP_FLOOR) <= STEP_TOL;
    if (!params_ok && grads_kept && both.error <= GRAD_TOL)
        snprintf(why, len, "step %d: the gradients are this step's PLUS the last step's (backward ADDS: zero first)",
                 step);
    else if (!params_ok && grads_kept && !(gr.error <= GRAD_TOL))
        snprintf(why, len, "step %d: gradients %.3g x the reference's (max diff %.2g)%s", step, gr.ratio, gr.error,
                 *explain_ratio(gr.ratio, step, n, mine->max_batch) || smoothing == 0.0f
                     ? explain_ratio(gr.ratio, step, n, mine->max_batch)
                     : ": is the loss gradient smoothed like the loss?");
    else if (!params_ok)
        snprintf(why, len, "step %d: parameters moved %.3g x the reference's move (max diff %.2g)%s", step, pm.ratio,
                 pm.error, explain_ratio(pm.ratio, step, n, mine->max_batch));
    else if (!velocity_ok)
        snprintf(why, len, "step %d: momentum buffer %.3g x the reference's (max diff %.2g): one update per step",
                 step, ve.ratio, ve.error);
    else if (!buffers_ok)
        snprintf(why, len, "step %d: BN running statistics differ (max diff %.2g): a training step's forward runs "
                 "in training mode, once", step, bu.error);
    else
        return true;
    return false;
}

// Runs `steps` steps of the learner's train_step and of the reference from the same model, on batches of
// `take` images (0: the loader's full batches; fewer: a short batch, as at the end of an epoch). Returns
// true when they agree at every step; else why says at which step, what differs first, and by how much.
static bool steps_agree(const char *model, float smoothing, int steps, int take, char *why, size_t len) {
    enum { BATCH = 32 };
    Data dt;
    data_open(&dt, BATCH);
    Model *mine = tiny_model(model, BATCH), *ref = tiny_model(model, BATCH);
    float *before = xmalloc(mine->n_params * sizeof(float)), *prev = xmalloc(mine->n_params * sizeof(float));
    SgdConfig opt = {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-4f, .nesterov = false};
    loader_start_epoch(dt.loader, 0, 0);
    bool ok = true;
    for (int s = 1; s <= steps && ok; s++) {
        const Batch *full = loader_next(dt.loader, NULL);
        assert_non_null(full);
        Batch b = *full;
        if (take > 0) b.n = take;
        // Each step from the learner's state: a learner's equivalent formula (scaling the loss instead of
        // dlogits, say) rounds differently, and two runs apart by rounding may cross a ReLU / max-pool kink
        // apart and then differ by far more (lesson 03's STEP_TOL comment); from identical state they cannot.
        memcpy(ref->params, mine->params, mine->n_params * sizeof(float));
        memcpy(ref->velocity, mine->velocity, mine->n_params * sizeof(float));
        memcpy(ref->buffers, mine->buffers, mine->n_buffers * sizeof(float));
        memcpy(before, mine->params, mine->n_params * sizeof(float));
        Metrics r = train_step(mine, &b, &opt, smoothing);
        double ref_loss_sum = reference_step(ref, &b, &opt, smoothing);
        // The loss is the batch's SUM before the update: same numbers, summed in another order.
        // Per-image losses are O(1) and positive: summed in another order, |error| <= gamma_32 * sum = 1.9e-6 of it.
        if (r.count != b.n) {
            snprintf(why, len, "step %d: count is %ld, the batch has %d images", s, r.count, b.n);
            ok = false;
        } else if (!(fabs(r.loss_sum - ref_loss_sum) <= 1e-5 * fabs(ref_loss_sum) + 1e-6)) {
            snprintf(why, len, "step %d: loss_sum %.6g, the reference's %.6g%s", s, r.loss_sum, ref_loss_sum,
                     fabs(r.loss_sum * b.n / ref_loss_sum - 1) < 1e-3 ? ": a mean, not the batch's sum"
                     : ": the forward or the loss differs (mode? smoothing? all of the batch?)");
            ok = false;
        } else {
            ok = step_agrees(s, mine, ref, before, s > 1 ? prev : NULL, b.n, smoothing, why, len);
        }
        memcpy(prev, ref->grads, ref->n_params * sizeof(float));
    }
    free(before);
    free(prev);
    model_free(mine);
    model_free(ref);
    data_close(&dt);
    return ok;
}

static void check_steps_match(const char *model, float smoothing, int take) {
    require_sgd_update();
    char why[512];
    if (!steps_agree(model, smoothing, 3, take, why, sizeof why)) {
        print_error("%s\n", why);
        fail();
    }
}

static void test_train_step_matches_reference(void **state) { check_steps_match("tiny", 0.0f, 0); }
static void test_train_step_with_batchnorm(void **state) { check_steps_match("tiny-bn", 0.0f, 0); }
static void test_train_step_label_smoothing(void **state) { check_steps_match("tiny", 0.1f, 0); }
// The last batch of an epoch is shorter than the others (SAMPLER_EVAL, or a dataset that does not divide):
// 20 images in a model made for 32. The mean is over the 20.
static void test_train_step_short_batch(void **state) { check_steps_match("tiny", 0.0f, 20); }

// train_step's `correct` is the number of arg-max predictions equal to the label, BEFORE the update, and
// `count` the batch's size.
static void test_train_step_counts_correct(void **state) {
    enum { BATCH = 50 };
    Data dt;
    data_open(&dt, BATCH);
    Model *m = tiny_model("tiny", BATCH);
    SgdConfig opt = {.lr = 0.0f, .momentum = 0.0f, .weight_decay = 0.0f, .nesterov = false};
    loader_start_epoch(dt.loader, 0, 0);
    const Batch *b = loader_next(dt.loader, NULL);
    // With lr 0 the model does not move, so a forward pass afterwards predicts what the step saw.
    Metrics r = train_step(m, b, &opt, 0.0f);
    memcpy(m->input, b->x, (size_t)b->n * 3 * 32 * 32 * sizeof(float));
    const float *logits = model_forward(m, m->input, b->n, true);
    int pred[BATCH], expect = 0;
    argmax_rows(DEVICE_CPU, b->n, 10, logits, pred);
    for (int i = 0; i < b->n; i++) expect += pred[i] == b->y[i];
    int n = b->n;
    model_free(m);
    data_close(&dt);  // before any failure: the loader's thread must not outlive dt
    if (r.count != n || r.correct != expect) {
        print_error("train_step returned count %ld, correct %ld; the batch has %d images, %d predicted right\n",
                    r.count, r.correct, n, expect);
        fail();
    }
    // An untrained 10-class model: the mean loss is about ln(10) = 2.3, so the sum about 2.3 * n.
    if (!(r.loss_sum > 0.5 * n)) {
        print_error("train_step returned loss_sum %.4g for %d images: the SUM of the per-image losses (about 2.3 "
                    "each here) is expected\n", r.loss_sum, n);
        fail();
    }
}

// ---------------------------------------------------------------- TODO 4: evaluation

static void test_evaluate_counts_every_sample_once(void **state) {
    enum { BATCH = 64 };
    Dataset test;
    dataset_synthetic(&test, 250, 10, 3, 32, 32, 7, SPLIT_TEST);  // 250 = 3 full batches + a short one of 58
    Sampler s;
    sampler_init(&s, test.n, 0, 1, 7, SAMPLER_EVAL);
    Loader *L = loader_create(&test, &s, BATCH, false, NULL, 7);
    Model *m = tiny_model("tiny-bn", BATCH);

    Metrics r = evaluate(m, L);
    if (r.count != test.n) {
        print_error("evaluate counted %ld images; the test split has %d (3 batches of 64 and a last one of 58)\n",
                    r.count, test.n);
        fail();
    }
    // Eval mode must not touch the running statistics (they start at mean 0, var 1).
    bool untouched = true;
    for (size_t i = 0; i < m->n_buffers; i++) untouched = untouched && (m->buffers[i] == 0.0f || m->buffers[i] == 1.0f);
    if (!untouched) {
        print_error("evaluate changed the BN running statistics: its forward passes ran in training mode\n");
        fail();
    }

    // Direct count, one image at a time, in eval mode. One image is another GEMM shape than a batch of 64, so
    // the logits differ by rounding: sums of at most 72 products per layer, 4 layers, of values of order 1,
    // gamma_72 = 4.3e-6 each. An image whose two largest logits are closer than 1e-4 may be predicted either
    // way (ties); every other prediction must agree. A skipped or doubled batch changes `correct` by dozens.
    long correct = 0, ties = 0;
    double loss = 0;
    int idx, y, pred;
    float l;
    for (idx = 0; idx < test.n; idx++) {
        dataset_fill_batch(&test, &idx, 1, NULL, 7, 0, m->input, &y);
        const float *logits = model_forward(m, m->input, 1, false);
        argmax_rows(DEVICE_CPU, 1, 10, logits, &pred);
        cross_entropy_forward(DEVICE_CPU, 1, 10, logits, &y, 0.0f, &l);
        float second = -INFINITY;
        for (int c = 0; c < 10; c++)
            if (c != pred && logits[c] > second) second = logits[c];
        ties += logits[pred] - second < 1e-4f;
        correct += pred == y;
        loss += l;
    }
    // 250 positive per-image losses of order 1: their rounding (above) and the sum's (gamma_250 = 1.5e-5 of it).
    if (labs(r.correct - correct) > ties || !(fabs(r.loss_sum - loss) <= 1e-4 * loss)) {
        // Per-batch means added up instead of per-image losses: about 4 batches' worth of a mean loss.
        bool means = r.correct == correct && r.loss_sum > 0 && fabs(r.loss_sum * test.n / 4.0 / loss - 1) < 0.5;
        print_error("evaluate gave correct %ld, loss_sum %.6g; one image at a time in eval mode gives %ld, %.6g%s\n",
                    r.correct, r.loss_sum, correct, loss,
                    means ? ": per-batch means added up? loss_sum is the SUM of the per-image losses" : "");
        fail();
    }
    model_free(m);
    loader_free(L);
    dataset_free(&test);
}

// ---------------------------------------------------------------- all together: it learns

static void test_short_run_learns(void **state) {
    enum { BATCH = 32, EPOCHS = 4 };
    require_sgd_update();
    char why[512];
    grading_require_todo(steps_agree("tiny-bn", 0.0f, 2, 0, why, sizeof why), "3", "%s", why);
    Data dt;
    data_open(&dt, BATCH);
    Model *m = tiny_model("tiny-bn", BATCH);
    SgdConfig opt = {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-4f, .nesterov = true};
    long correct = 0, seen = 0;
    for (int e = 0; e < EPOCHS; e++) {
        loader_start_epoch(dt.loader, e, 0);
        correct = seen = 0;
        const Batch *b;
        while ((b = loader_next(dt.loader, NULL)) != NULL) {
            Metrics r = train_step(m, b, &opt, 0.0f);
            correct += r.correct;
            seen += b->n;
        }
    }
    double acc = (double)correct / seen;
    print_message("training accuracy in the last epoch: %.1f%%\n", 100 * acc);
    model_free(m);
    data_close(&dt);
    if (!(acc >= 0.9)) {
        print_error("training accuracy %.1f%% in the 4th epoch; this tiny net reaches 90%% or more\n", 100 * acc);
        fail();
    }
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgd_plain),
        cmocka_unit_test(test_sgd_momentum),
        cmocka_unit_test(test_sgd_nesterov),
        cmocka_unit_test(test_sgd_weight_decay),
        cmocka_unit_test(test_sgd_cuda_kernel),
        cmocka_unit_test(test_train_step_matches_reference),
        cmocka_unit_test(test_train_step_with_batchnorm),
        cmocka_unit_test(test_train_step_label_smoothing),
        cmocka_unit_test(test_train_step_counts_correct),
        cmocka_unit_test(test_train_step_short_batch),
        cmocka_unit_test(test_evaluate_counts_every_sample_once),
        cmocka_unit_test(test_short_run_learns),
    };
    return grading_run(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
