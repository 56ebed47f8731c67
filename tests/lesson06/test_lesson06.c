// tests/lesson06/test_lesson06.c: the autograder for lesson 06 (the learner's infer.c: inference from a checkpoint).
//
// One process, the CPU. Each test starts from a checkpoint that a short training run writes through the kit
// (tiny-bn, width 8, the synthetic set, batch 64, one epoch of warmup to lr 0.05: a model still making mistakes,
// 864 of 1000 right here, so that "the same number correct" says something; at 100 % any model would pass). The run
// evaluates the test set after its epoch exactly as lesson 03/04's programs do (train_evaluate: eval mode, batches
// of 64) and saves that result in the checkpoint (CkptState.test_acc), as lesson 04 does. One test does the same on
// a slice of real data (Fashion-MNIST, from Debian's dataset-fashion-mnist; skipped when it is not installed), where
// one channel, other statistics and unbalanced classes show mistakes the synthetic set hides. When a result is
// wrong, the tests compute what each classic mistake would give (batch statistics, an arg-max off by one, a dropped
// last batch, label smoothing, augmentation, a transposed matrix) and name the one that matches. Checkpoints
// written by lesson 04's own program on 1 and 2 ranks are checked by tests/lesson06/run-tests.sh. Hints: hints.tsv.
#include "tests/testutil.h"
#include "tests/grading.h"

#include <math.h>
#include <unistd.h>

#include "kit/ckpt.h"
#include "kit/cli.h"
#include "kit/data.h"
#include "kit/model.h"
#include "kit/optim.h"
#include "kit/train.h"
#include "lesson.h"

#define FIXTURE_SEED 11
#define FIXTURE_BATCH 64

static char g_dir[128];   // this test's temporary folder
static char g_ckpt[256];  // the fixture checkpoint in it
static Dataset g_test;    // the synthetic test split (1000 images)
static CkptState g_state; // what the fixture run saved
static ModelConfig g_cfg;

static TrainOptions fixture_options(void) {
    static char name[] = "train";
    char *argv[] = {name, NULL};
    TrainOptions o;
    cli_parse(&o, 1, argv, CLI_BASE);
    o.dataset = "synthetic";
    o.model = "tiny-bn";
    o.width = 8;
    o.batch_size = FIXTURE_BATCH;
    o.epochs = 1;
    o.lr = 0.05f;
    o.seed = FIXTURE_SEED;
    cli_apply_dataset_defaults(&o);
    return o;
}

// One epoch of training through the kit, its evaluation, and a checkpoint holding both (lesson 04's end-of-epoch
// save: epoch 1, batch_in_epoch 0, test_acc of the evaluation of these very weights).
static void fixture_train(const char *path) {
    TrainOptions o = fixture_options();
    TrainData td;
    train_data_open(&td, &o, 0, 1, o.batch_size);
    model_config(&g_cfg, o.model, o.width, td.train.c, td.train.h, td.train.w, td.train.classes);
    Model *m = model_create(&g_cfg, DEVICE_CPU, o.batch_size, o.seed);
    int steps = loader_batches_per_epoch(td.train_loader);
    SgdConfig opt = train_sgd_config(&o);
    LrSchedule sched = train_schedule(&o, steps);
    loader_start_epoch(td.train_loader, 0, 0);
    const Batch *b;
    int step = 0;
    while ((b = loader_next(td.train_loader, NULL)) != NULL) {
        opt.lr = lr_at(&sched, step++);
        train_forward_backward(m, b, 0.0f, 1.0f / (float)b->n);
        optim_step(m, &opt);
    }
    Metrics test = train_evaluate(m, td.test_loader);
    CkptState st;
    memset(&st, 0, sizeof st);
    st.model = g_cfg;
    snprintf(st.dataset, sizeof st.dataset, "%s", o.dataset);
    st.world = 1, st.global_batch = o.batch_size, st.steps_per_epoch = steps, st.epochs = 1, st.epoch = 1;
    st.step = step, st.seed = o.seed, st.peak_lr = sched.peak_lr, st.momentum = opt.momentum;
    st.weight_decay = opt.weight_decay, st.images = (long long)step * o.batch_size;
    st.test_acc = (double)test.correct / (double)test.count;
    char err[512];
    assert_int_equal(ckpt_save(path, m, &st, err, sizeof err), 0);
    g_state = st;
    model_free(m);
    train_data_close(&td);
}

static int setup(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/test_lesson06.XXXXXX");
    if (!mkdtemp(g_dir)) return -1;
    snprintf(g_ckpt, sizeof g_ckpt, "%s/fixture.ckpt", g_dir);
    fixture_train(g_ckpt);
    char err[512];
    return dataset_load(&g_test, "synthetic", "datasets/data", SPLIT_TEST, err, sizeof err);
}

static int teardown(void **state) {
    (void)state;
    dataset_free(&g_test);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) print_error("could not remove %s\n", g_dir);
    return 0;
}

static long fixture_correct(void) { return lround(g_state.test_acc * g_test.n); }

// The learner's load, which every later test needs: TODO 1 first.
static Model *load_or_fail(int max_batch) {
    char err[512] = "";
    Model *m = infer_load(g_ckpt, &g_cfg, "synthetic", DEVICE_CPU, max_batch, NULL, err, sizeof err);
    grading_require_todo(m != NULL, "1", "infer_load refused a valid checkpoint: %s", err);
    return m;
}

// What the kit itself gives for every image of ds, from a TRAINING model loaded with ckpt_load (the reference the
// learner's code is compared with), in batches of `batch` in order. pred (n) may be NULL; logits (n, classes) may be
// NULL. train_mode: BN with batch statistics instead (the mistake). loss: the sum of per-image cross-entropies with
// label smoothing `smoothing` (0: none), summed in double in image order; NULL to skip. Returns the correct count.
typedef struct {
    long correct;
    double loss_sum;       // sum over images
    double batch_mean_sum; // sum over batches of the batch's mean loss (a mistake: a sum of means)
} Reference;

static Reference reference_eval(const Dataset *ds, const char *ckpt, int batch, bool train_mode, float smoothing,
                                int *pred, float *logits_out) {
    Model *m = model_create(&g_cfg, DEVICE_CPU, batch, 0);
    char err[512];
    assert_int_equal(ckpt_load(ckpt, m, NULL, err, sizeof err), 0);
    size_t img = (size_t)g_cfg.in_c * g_cfg.in_h * g_cfg.in_w;
    int K = g_cfg.classes;
    float *x = xmalloc((size_t)batch * img * sizeof(float));
    int *idx = xmalloc((size_t)batch * sizeof(int)), *y = xmalloc((size_t)batch * sizeof(int));
    int *p = xmalloc((size_t)batch * sizeof(int));
    Reference r = {0, 0, 0};
    for (int start = 0; start < ds->n; start += batch) {
        int n = ds->n - start < batch ? ds->n - start : batch;
        for (int i = 0; i < n; i++) idx[i] = start + i;
        dataset_fill_batch(ds, idx, n, NULL, 0, 0, x, y);
        const float *logits = model_forward(m, x, n, train_mode);
        argmax_rows(DEVICE_CPU, n, K, logits, p);
        cross_entropy_forward(DEVICE_CPU, n, K, logits, y, smoothing, m->loss);
        double batch_sum = 0;
        for (int i = 0; i < n; i++) r.correct += p[i] == y[i], r.loss_sum += m->loss[i], batch_sum += m->loss[i];
        r.batch_mean_sum += batch_sum / n;
        if (pred) memcpy(pred + start, p, (size_t)n * sizeof(int));
        if (logits_out) memcpy(logits_out + (size_t)start * K, logits, (size_t)n * K * sizeof(float));
    }
    free(x), free(idx), free(y), free(p);
    model_free(m);
    return r;
}

static long reference_predictions(int *pred, bool train_mode, int batch) {
    return reference_eval(&g_test, g_ckpt, batch, train_mode, 0.0f, pred, NULL).correct;
}

// The arg-max of one row, ties to the lower class (as the kit's argmax_rows and torch.argmax).
static int row_argmax(const float *row, int k) {
    int best = 0;
    for (int j = 1; j < k; j++) best = row[j] > row[best] ? j : best;
    return best;
}

// Largest |a - b| over n floats.
static double max_abs_diff(const float *a, const float *b, size_t n) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)a[i] - b[i]));
    return worst;
}

// Logits of the same images through the same layers in eval mode: identical but for the float order of a
// library's GEMM blocking (a few ulps of values below ~30: 1e-4 is hundreds of them), while batch statistics
// instead of running ones move them by tenths or more.
#define LOGIT_TOL 1e-4

// TODO 2 on the first FIXTURE_BATCH images of ds (the model of checkpoint ckpt): NULL when infer_predict returns
// the eval-mode logits and their arg-max, else what is wrong, naming the mistake (a static string).
// argmax_only: check only that pred is the arg-max of the logits infer_predict returned, whatever they are.
static const char *predict_mistake_on(Model *m, const Dataset *ds, const char *ckpt, bool argmax_only) {
    static char why[512];
    int n = FIXTURE_BATCH, K = g_cfg.classes;
    size_t img = (size_t)g_cfg.in_c * g_cfg.in_h * g_cfg.in_w;
    float *x = xmalloc((size_t)n * img * sizeof(float)), *got = xmalloc((size_t)n * K * sizeof(float));
    float *eval = xmalloc((size_t)ds->n * K * sizeof(float)), *train = xmalloc((size_t)ds->n * K * sizeof(float));
    int idx[FIXTURE_BATCH], y[FIXTURE_BATCH], pred[FIXTURE_BATCH];
    for (int i = 0; i < n; i++) idx[i] = i;
    dataset_fill_batch(ds, idx, n, NULL, 0, 0, x, y);
    memset(pred, 0xff, sizeof pred);
    const float *out = infer_predict(m, x, n, pred);
    const char *res = NULL;
    if (!out) {
        res = "infer_predict returned no logits";
    } else {
        memcpy(got, out, (size_t)n * K * sizeof(float));  // the CPU model: its logits are host memory
        reference_eval(ds, ckpt, FIXTURE_BATCH, false, 0.0f, NULL, eval);
        reference_eval(ds, ckpt, FIXTURE_BATCH, true, 0.0f, NULL, train);
        double d_eval = max_abs_diff(got, eval, (size_t)n * K), d_train = max_abs_diff(got, train, (size_t)n * K);
        if (argmax_only) d_eval = d_train = 0;
        int bad = -1;
        for (int i = 0; i < n && bad < 0; i++)
            if (pred[i] != row_argmax(got + (size_t)i * K, K)) bad = i;
        if (d_eval > LOGIT_TOL && d_train <= LOGIT_TOL) {
            snprintf(why, sizeof why, "batch norm runs in TRAINING mode: the logits are those of batch statistics "
                     "(eval mode's differ by up to %.3g): inference uses the running statistics", d_eval);
            res = why;
        } else if (d_eval > LOGIT_TOL) {
            snprintf(why, sizeof why, "the logits differ from the network's in eval mode by up to %.3g (and from "
                     "training mode's by %.3g): are the n images copied to the model's input whole?", d_eval, d_train);
            res = why;
        }
        // The arg-max of every batch of ds, not only the first: a loop that stops one class short shows only on
        // an image whose largest logit is the last class.
        for (int start = n; start < ds->n && bad < 0 && !res; start += n) {
            int b = ds->n - start < n ? ds->n - start : n, best;
            for (int i = 0; i < b; i++) idx[i] = start + i;
            dataset_fill_batch(ds, idx, b, NULL, 0, 0, x, y);
            const float *o = infer_predict(m, x, b, pred);
            for (int i = 0; i < b && bad < 0; i++)
                if (pred[i] != (best = row_argmax(o + (size_t)i * K, K))) {
                    bad = start + i;
                    memcpy(got, o + (size_t)i * K, (size_t)K * sizeof(float));
                    pred[0] = pred[i];
                }
        }
        if (!res && bad >= 0) {
            int row = bad < n ? bad : 0;  // later batches: the offending row was copied to got[0]
            snprintf(why, sizeof why, "the arg-max is wrong: image %d's largest logit is class %d, pred says %d "
                     "(an arg-max loop off by one, or a class index shifted?)", bad,
                     row_argmax(got + (size_t)row * K, K), pred[row]);
            res = why;
        }
    }
    free(x), free(got), free(eval), free(train);
    return res;
}

static const char *predict_mistake(Model *m) { return predict_mistake_on(m, &g_test, g_ckpt, false); }

// What a wrong count says: n images, batches of `batch`.
static const char *count_mistake(long count, int n, int batch) {
    static char why[256];
    if (count == n) return NULL;
    if (n % batch && count == n - n % batch)
        snprintf(why, sizeof why, "%ld images evaluated, the test set has %d: the last, short batch of %d was dropped "
                 "(drop_last)", count, n, n % batch);
    else if (count > n)
        snprintf(why, sizeof why, "%ld images evaluated, the test set has %d: some counted twice (a padding sampler, or "
                 "a batch counted as full?)", count, n);
    else
        snprintf(why, sizeof why, "%ld images evaluated, the test set has %d: every image must count once", count, n);
    return why;
}

// ---------------------------------------------------------------- TODO 1: load and refuse

static void test_load_inference_only(void **state) {
    (void)state;
    char err[512] = "";
    CkptState st;
    memset(&st, 0, sizeof st);
    Model *m = infer_load(g_ckpt, &g_cfg, "synthetic", DEVICE_CPU, 16, &st, err, sizeof err);
    if (!m) fail_msg("infer_load refused the valid checkpoint %s: %s", g_ckpt, err);
    if (m->grads || m->velocity || m->dacts)
        fail_msg("the model has %s%s%s allocated: inference needs none of them (kit/model.h)", m->grads ? "grads " : "",
                 m->velocity ? "velocity " : "", m->dacts ? "dacts" : "");
    assert_int_equal(m->max_batch, 16);
    Ckpt ck;
    assert_int_equal(ckpt_read(&ck, g_ckpt, err, sizeof err), 0);
    float *want = xmalloc((m->n_params > m->n_buffers ? m->n_params : m->n_buffers) * sizeof(float));
    for (int i = 0; i < m->n_views; i++) {  // the weights AND the BN running statistics, bit for bit
        ckpt_tensor_data(&ck, ckpt_find(&ck, CKPT_PARAMS, m->views[i].name), want);
        if (memcmp(want, m->params + m->views[i].offset, m->views[i].count * sizeof(float)) != 0)
            fail_msg("parameter %s differs from the checkpoint's", m->views[i].name);
    }
    for (int i = 0; i < m->n_buffer_views; i++) {
        ckpt_tensor_data(&ck, ckpt_find(&ck, CKPT_BUFFERS, m->buffer_views[i].name), want);
        if (memcmp(want, m->buffers + m->buffer_views[i].offset, m->buffer_views[i].count * sizeof(float)) != 0)
            fail_msg("buffer %s (BN running statistics) differs from the checkpoint's", m->buffer_views[i].name);
    }
    if (st.step != g_state.step || strcmp(st.dataset, "synthetic") != 0)
        fail_msg("*st is not the checkpoint's state (step %lld, want %lld)", st.step, g_state.step);
    free(want);
    ckpt_free(&ck);
    model_free(m);
}

// Copies the fixture with one byte changed (or cut at `truncate` bytes when >= 0) to path.
static void corrupt_copy(const char *path, long flip_at, long truncate) {
    FILE *f = fopen(g_ckpt, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    uint8_t *buf = xmalloc((size_t)n);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    if (flip_at >= 0) buf[flip_at < n ? flip_at : n / 2] ^= 0x10;
    f = fopen(path, "wb");
    assert_non_null(f);
    fwrite(buf, 1, truncate >= 0 ? (size_t)truncate : (size_t)n, f);
    fclose(f);
    free(buf);
}

// A refusal counts only from code that also accepts what is valid (refusing everything is not refusing).
static void expect_accepts_valid(void) {
    char err[512] = "";
    Model *m = infer_load(g_ckpt, &g_cfg, "synthetic", DEVICE_CPU, 8, NULL, err, sizeof err);
    if (!m) fail_msg("infer_load must load a valid checkpoint (it refused %s: %s) before refusal counts", g_ckpt, err);
    model_free(m);
}

static void expect_refused(const char *path, const ModelConfig *cfg, const char *dataset, const char *what,
                           const char *must_mention) {
    expect_accepts_valid();
    char err[512] = "";
    Model *m = infer_load(path, cfg, dataset, DEVICE_CPU, 8, NULL, err, sizeof err);
    if (m) {
        model_free(m);
        fail_msg("infer_load accepted %s", what);
    }
    if (strlen(err) < 10) fail_msg("infer_load refused %s but err says nothing (\"%s\"): say why", what, err);
    if (must_mention && !strstr(err, must_mention))
        fail_msg("refusing %s, the message must name '%s': \"%s\"", what, must_mention, err);
    print_message("refused %s: %s\n", what, err);
}

static void test_refuses_corrupt_file(void **state) {
    (void)state;
    char path[300];
    snprintf(path, sizeof path, "%s/bad.ckpt", g_dir);
    corrupt_copy(path, -1, 100);
    expect_refused(path, &g_cfg, "synthetic", "a truncated checkpoint", NULL);
    corrupt_copy(path, 1L << 30, -1);  // one bit in the middle of the tensors
    expect_refused(path, &g_cfg, "synthetic", "a checkpoint with a flipped bit", NULL);
    snprintf(path, sizeof path, "%s/missing.ckpt", g_dir);
    expect_refused(path, &g_cfg, "synthetic", "a file that does not exist", "missing.ckpt");
}

static void test_refuses_other_dataset(void **state) {
    (void)state;
    expect_refused(g_ckpt, &g_cfg, "fashion-mnist", "a synthetic-set checkpoint for fashion-mnist", "synthetic");
}

static void test_refuses_other_model(void **state) {
    (void)state;
    ModelConfig wider = g_cfg, other = g_cfg;
    wider.width = 16;
    snprintf(other.name, sizeof other.name, "tiny");  // the same layers without BN
    expect_refused(g_ckpt, &wider, "synthetic", "a width-8 checkpoint for a width-16 model", NULL);
    expect_refused(g_ckpt, &other, "synthetic", "a tiny-bn checkpoint for the tiny model", NULL);
}

// ---------------------------------------------------------------- TODO 2 and 3: eval mode, exact reproduction

static void test_eval_mode(void **state) {
    (void)state;
    Model *m = load_or_fail(FIXTURE_BATCH);
    int n = g_test.n, K = g_cfg.classes;
    int *want = xmalloc((size_t)n * sizeof(int)), *train64 = xmalloc((size_t)n * sizeof(int));
    int *train1 = xmalloc((size_t)n * sizeof(int));
    long c_eval = reference_predictions(want, false, FIXTURE_BATCH);
    long c_train64 = reference_predictions(train64, true, FIXTURE_BATCH);
    long c_train1 = reference_predictions(train1, true, 1);
    print_message("the test set, eval mode: %ld of %d correct; BN in training mode instead: %ld (batches of %d), "
                  "%ld (images one at a time)\n", c_eval, n, c_train64, FIXTURE_BATCH, c_train1);
    free(want), free(train64), free(train1);
    // The learner's logits of the first batch, and of one image alone: eval mode gives the same numbers. (The
    // arg-max taken of them is test_predict_argmax's subject, not this test's.)
    size_t img = (size_t)g_cfg.in_c * g_cfg.in_h * g_cfg.in_w;
    float *x = xmalloc(FIXTURE_BATCH * img * sizeof(float)), *batch = xmalloc((size_t)FIXTURE_BATCH * K * sizeof(float));
    float *eval = xmalloc((size_t)n * K * sizeof(float)), alone[64];
    int idx[FIXTURE_BATCH], y[FIXTURE_BATCH], pred[FIXTURE_BATCH];
    for (int i = 0; i < FIXTURE_BATCH; i++) idx[i] = i;
    dataset_fill_batch(&g_test, idx, FIXTURE_BATCH, NULL, 0, 0, x, y);
    const float *out = infer_predict(m, x, FIXTURE_BATCH, pred);
    if (!out) fail_msg("infer_predict returned no logits");
    memcpy(batch, out, (size_t)FIXTURE_BATCH * K * sizeof(float));
    out = infer_predict(m, x + 5 * img, 1, pred);
    memcpy(alone, out, (size_t)K * sizeof(float));
    reference_eval(&g_test, g_ckpt, FIXTURE_BATCH, false, 0.0f, NULL, eval);
    double d_batch = max_abs_diff(batch, eval, (size_t)FIXTURE_BATCH * K);
    double d_alone = max_abs_diff(alone, eval + 5 * K, (size_t)K);
    const char *why = predict_mistake(m);
    free(x), free(batch), free(eval);
    model_free(m);
    if (d_batch > LOGIT_TOL || d_alone > LOGIT_TOL)
        fail_msg("%s (batch of %d: off by up to %.3g; image 5 alone: %.3g)", why ? why : "the logits are not eval mode's",
                 FIXTURE_BATCH, d_batch, d_alone);
}

static void test_predict_argmax(void **state) {
    (void)state;
    Model *m = load_or_fail(FIXTURE_BATCH);
    const char *why = predict_mistake_on(m, &g_test, g_ckpt, true);
    model_free(m);
    if (why) fail_msg("%s", why);
}

// Float losses of the same logits (the kit's cross_entropy_forward, whoever calls it), summed in another order or
// precision: float summation of n positive terms errs by at most (n - 1) * 2^-24 of the sum: 6e-5 for 1000.
#define LOSS_REL_TOL 1e-4

// ds with its images in reverse order (a copy; free with dataset_free).
static Dataset reversed(const Dataset *ds) {
    Dataset r = *ds;
    size_t img = (size_t)ds->c * ds->h * ds->w;
    r.images = xmalloc((size_t)ds->n * img);
    r.labels = xmalloc((size_t)ds->n);
    for (int i = 0; i < ds->n; i++) {
        memcpy(r.images + (size_t)i * img, ds->images + (size_t)(ds->n - 1 - i) * img, img);
        r.labels[i] = ds->labels[ds->n - 1 - i];
    }
    return r;
}

// True when the learner's evaluation of the first 128 images of ds changes when they come in reverse order, in
// batches of 1 (where nothing but augmentation can make an image's result depend on where it sits): the test
// images are augmented. For the messages of tests whose numbers are wrong for a reason they cannot see.
static bool augmentation_seen(Model *m, const Dataset *ds) {
    Dataset head = *ds;
    head.n = ds->n < 128 ? ds->n : 128;
    Dataset rev = reversed(&head);
    EvalReport a = infer_evaluate(m, &head, 1), b = infer_evaluate(m, &rev, 1);
    bool moved = a.count != b.count || a.correct != b.correct ||
                 (a.confusion && b.confusion &&
                  memcmp(a.confusion, b.confusion, (size_t)a.classes * a.classes * sizeof(long)) != 0) ||
                 fabs(a.loss_sum - b.loss_sum) > LOSS_REL_TOL * fabs(a.loss_sum);
    eval_report_free(&a), eval_report_free(&b);
    dataset_free(&rev);
    return moved;
}

#define AUGMENTED_MSG "test images are AUGMENTED (the same images in another order give another result): a random " \
                      "crop or flip of a test image is another image; evaluation takes every image as it is"

// What is wrong with loss_sum `got` of ds evaluated in batches of `batch`: NULL when it is the cross-entropy summed
// over the images, else the mistake named (a static string).
static const char *loss_mistake(double got, Model *m, const Dataset *ds, const char *ckpt, int batch) {
    static char why[512];
    Reference plain = reference_eval(ds, ckpt, batch, false, 0.0f, NULL, NULL);
    Reference smooth = reference_eval(ds, ckpt, batch, false, 0.1f, NULL, NULL);
    print_message("loss_sum %.6g; cross-entropy: %.6g (label smoothing 0.1: %.6g)\n", got, plain.loss_sum,
                  smooth.loss_sum);
    if (fabs(got - plain.loss_sum) <= LOSS_REL_TOL * plain.loss_sum) return NULL;
    if (fabs(got - smooth.loss_sum) <= LOSS_REL_TOL * smooth.loss_sum)
        snprintf(why, sizeof why, "loss_sum %.6g is the loss WITH label smoothing (0.1); evaluation reports the plain "
                 "cross-entropy (%.6g): smoothing is a training regulariser, not part of the measured loss", got,
                 plain.loss_sum);
    else if (fabs(got - plain.batch_mean_sum) <= LOSS_REL_TOL * plain.batch_mean_sum)
        snprintf(why, sizeof why, "loss_sum %.6g is a sum of batch MEANS; it must be the sum over images (%.6g), so "
                 "that loss_sum / count is the mean whatever the batch size", got, plain.loss_sum);
    else if (augmentation_seen(m, ds))
        snprintf(why, sizeof why, "loss_sum %.6g, want %.6g: " AUGMENTED_MSG, got, plain.loss_sum);
    else
        snprintf(why, sizeof why, "loss_sum %.6g, the cross-entropy of the eval-mode logits summed over the test set is "
                 "%.6g", got, plain.loss_sum);
    return why;
}

// Evaluation of ds (the learner's) against the kit's, count, correct and confusion matrix; NULL when equal, else
// what differs (a static string).
static const char *evaluation_difference(const EvalReport *r, const Dataset *ds, const int *want_pred, int batch) {
    static char why[512];
    const char *c = count_mistake(r->count, ds->n, batch);
    if (c) return c;
    int K = r->classes;
    long correct = 0, same = 0, transposed = 0;
    long *ref = xcalloc((size_t)K * K, sizeof(long));
    for (int i = 0; i < ds->n; i++) ref[(size_t)ds->labels[i] * K + want_pred[i]]++, correct += want_pred[i] == ds->labels[i];
    for (int k = 0; k < K * K; k++) same += r->confusion[k] == ref[k], transposed += r->confusion[k] == ref[(k % K) * K + k / K];
    free(ref);
    if (r->correct != correct)
        snprintf(why, sizeof why, "%ld correct, the kit's evaluation of the same weights has %ld", r->correct, correct);
    else if (same != (long)K * K && transposed == (long)K * K)
        snprintf(why, sizeof why, "the confusion matrix is transposed: rows must be the TRUE class, columns the "
                 "PREDICTED one");
    else if (same != (long)K * K)
        snprintf(why, sizeof why, "the confusion matrix differs from the kit's in %ld of %d cells (rows: true class, "
                 "columns: predicted)", (long)K * K - same, K * K);
    else
        return NULL;
    return why;
}

static void test_reproduces_training_eval(void **state) {
    (void)state;
    Model *m = load_or_fail(FIXTURE_BATCH);
    const char *why = predict_mistake(m);
    grading_require_todo(why == NULL, "2", "%s", why ? why : "");
    EvalReport r = infer_evaluate(m, &g_test, FIXTURE_BATCH);
    long want = fixture_correct();
    print_message("training run's evaluation: %ld of %d; infer_evaluate: %ld of %ld\n", want, g_test.n, r.correct,
                  r.count);
    const char *count = count_mistake(r.count, g_test.n, FIXTURE_BATCH);
    bool augmented = !count && r.correct != want && augmentation_seen(m, &g_test);
    eval_report_free(&r);
    model_free(m);
    if (count) fail_msg("%s", count);
    if (r.correct != want) fail_msg("%ld correct, the training run's evaluation had %ld%s", r.correct, want,
                                    augmented ? ": " AUGMENTED_MSG : "");
}

// 1000 images in batches of 1, 7 (142 full + one of 6), 64 (15 + 40), 333 (3 + 1) and 1000: the same answer.
static void test_batch_size_invariance(void **state) {
    (void)state;
    const int sizes[] = {FIXTURE_BATCH, 1, 7, 333, 1000};
    Model *m = load_or_fail(1000);
    const char *why = predict_mistake(m);
    grading_require_todo(why == NULL, "2", "%s", why ? why : "");
    EvalReport first = {0};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        EvalReport r = infer_evaluate(m, &g_test, sizes[k]);
        const char *count = count_mistake(r.count, g_test.n, sizes[k]);
        if (count) fail_msg("batch %d: %s", sizes[k], count);
        if (k == 0) {
            first = r;
            continue;
        }
        bool same = r.correct == first.correct &&
                    memcmp(r.confusion, first.confusion, (size_t)r.classes * r.classes * sizeof(long)) == 0;
        long c = r.correct;
        eval_report_free(&r);
        if (!same) fail_msg("batch %d: %ld correct, batch %d: %ld (or another confusion matrix)", sizes[k], c,
                            sizes[0], first.correct);
    }
    print_message("%ld correct with every batch size\n", first.correct);
    eval_report_free(&first);
    model_free(m);
}

static void test_confusion_matrix(void **state) {
    (void)state;
    Model *m = load_or_fail(FIXTURE_BATCH);
    const char *pm = predict_mistake(m);
    grading_require_todo(pm == NULL, "2", "%s", pm ? pm : "");
    EvalReport r = infer_evaluate(m, &g_test, FIXTURE_BATCH);
    int K = g_cfg.classes;
    int *want = xmalloc((size_t)g_test.n * sizeof(int));
    reference_predictions(want, false, FIXTURE_BATCH);
    long total = 0, diag = 0;
    for (int k = 0; k < K; k++)
        for (int j = 0; j < K; j++) total += r.confusion[(size_t)k * K + j], diag += k == j ? r.confusion[(size_t)k * K + j] : 0;
    const char *why = total == g_test.n && diag == r.correct ? evaluation_difference(&r, &g_test, want, FIXTURE_BATCH)
                                                             : NULL;
    bool augmented = why && r.count == g_test.n && augmentation_seen(m, &g_test);
    long correct = r.correct;
    eval_report_free(&r);
    free(want);
    model_free(m);
    if (total != g_test.n) fail_msg("the confusion matrix sums to %ld, the test set has %d images", total, g_test.n);
    if (diag != correct) fail_msg("the diagonal sums to %ld, the report says %ld correct", diag, correct);
    if (why) fail_msg("%s%s", why, augmented ? ": " AUGMENTED_MSG : "");
}


static void test_eval_loss(void **state) {
    (void)state;
    Model *m = load_or_fail(FIXTURE_BATCH);
    const char *why = predict_mistake(m);
    grading_require_todo(why == NULL, "2", "%s", why ? why : "");
    EvalReport r = infer_evaluate(m, &g_test, FIXTURE_BATCH);
    double got = r.loss_sum;
    long count = r.count;
    eval_report_free(&r);
    const char *c = count_mistake(count, g_test.n, FIXTURE_BATCH);
    grading_require_todo(c == NULL, "3", "%s", c ? c : "");
    const char *loss = loss_mistake(got, m, &g_test, g_ckpt, FIXTURE_BATCH);
    model_free(m);
    if (loss) fail_msg("%s", loss);
}

// A test image gets no augmentation: a random crop or flip is drawn per (seed, epoch, INDEX), so an augmented
// evaluation changes when the same images sit at other indices. The synthetic set's table row has no
// augmentation (copying the training loader's setting changes nothing there); a copy of it named cifar10, whose
// row crops and flips, shows that mistake too.
static void test_no_test_augmentation(void **state) {
    (void)state;
    Model *m = load_or_fail(FIXTURE_BATCH);
    const char *why = predict_mistake(m);
    grading_require_todo(why == NULL, "2", "%s", why ? why : "");
    Reference ref = reference_eval(&g_test, g_ckpt, FIXTURE_BATCH, false, 0.0f, NULL, NULL);
    const char *names[] = {"synthetic", "cifar10"};
    long first_correct = 0;
    double first_loss = 0;
    for (int k = 0; k < 2; k++) {
        Dataset ds = g_test, rev = reversed(&g_test);
        snprintf(ds.name, sizeof ds.name, "%s", names[k]);
        snprintf(rev.name, sizeof rev.name, "%s", names[k]);
        // Batches of 1: the loss of an image then does not depend on its batch mates, even where loss_sum is
        // computed wrongly (a sum of batch means), so only augmentation can make the order matter.
        EvalReport a = infer_evaluate(m, &ds, 1), b = infer_evaluate(m, &rev, 1);
        const char *c = count_mistake(a.count, g_test.n, 1);
        grading_require_todo(c == NULL, "3", "%s", c ? c : "");
        // Another order, the same images: only the order of the loss sum may change (LOSS_REL_TOL).
        bool moved = a.correct != b.correct ||
                     memcmp(a.confusion, b.confusion, (size_t)a.classes * a.classes * sizeof(long)) != 0 ||
                     fabs(a.loss_sum - b.loss_sum) > LOSS_REL_TOL * fabs(a.loss_sum);
        // Another name, the same images in the same order: the same floats (LOSS_REL_TOL, as above).
        bool renamed = k > 0 && (a.correct != first_correct || fabs(a.loss_sum - first_loss) > LOSS_REL_TOL * first_loss);
        print_message("dataset named %s: %ld correct (reversed order: %ld), loss_sum %.6g (%.6g); the kit: %ld, %.6g\n",
                      names[k], a.correct, b.correct, a.loss_sum, b.loss_sum, ref.correct, ref.loss_sum);
        first_correct = k == 0 ? a.correct : first_correct, first_loss = k == 0 ? a.loss_sum : first_loss;
        long ac = a.correct;
        eval_report_free(&a), eval_report_free(&b);
        dataset_free(&rev);
        if (moved || renamed)
            fail_msg("test images are AUGMENTED: %s (%s: %ld correct, the kit %ld without augmentation): a random crop "
                     "or flip of a test image is another image; evaluation takes every image as it is",
                     moved ? "the same images in another order give another result"
                           : "a dataset whose TRAINING crops and flips (cifar10) changes the evaluation",
                     names[k], ac, ref.correct);
    }
    model_free(m);
}

// ---------------------------------------------------------------- TODO 4 and 5: one image file

// The loader computes (v / 255 - mean) / std in float; another order of the same float operations differs by a few
// roundings of values below 1 / std ~ 4 (synthetic std ~ 0.25; Fashion-MNIST's 0.353): 1e-5 absolute is 40 such
// ulps (2^-22 at 4), while a missing normalisation is off by ~1 and a swapped mean/std or channel by ~0.1 or more.
#define NORM_TOL 1e-5

// Which classic normalisation mistake x (c, h, w) is, for the image img of ds: a static string, or NULL when none
// of them matches. Each candidate is computed in double and compared with NORM_TOL.
static const char *normalisation_mistake(const float *x, const Image *img, const Dataset *ds) {
    static const float imagenet[2][3] = {{0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f}};
    static const float cifar10[2][3] = {{0.4914f, 0.4822f, 0.4465f}, {0.2470f, 0.2435f, 0.2616f}};
    static const char *const what[] = {
        "the bytes are not divided by 255: the training data was in 0..1 units before the mean and std",
        "the mean and std are not applied: the training data was normalised with the dataset's mean and std",
        "channel 0's mean and std are used for every channel: each channel has its own",
        "ImageNet's constants (0.485, 0.456, 0.406 / 0.229, 0.224, 0.225) instead of this dataset's mean and std",
        "CIFAR-10's published constants instead of this dataset's own mean and std",
        "mean and std swapped: (v / 255 - std) / mean",
        "the pixels are read as (h, w, c), interleaved: the Image's bytes are planar (c, h, w) like the datasets'",
    };
    size_t plane = (size_t)img->h * img->w;
    for (int k = 0; k < (int)(sizeof what / sizeof what[0]); k++) {
        double worst = 0;
        for (int ch = 0; ch < img->c; ch++)
            for (size_t i = 0; i < plane; i++) {
                double v = img->pixels[ch * plane + i], m = ds->mean[ch], sd = ds->std[ch], want;
                if (k == 6) v = img->pixels[i * (size_t)img->c + ch];
                switch (k) {
                case 0: want = (v - m) / sd; break;
                case 1: want = v / 255; break;
                case 2: want = (v / 255 - ds->mean[0]) / ds->std[0]; break;
                case 3: want = ch < 3 ? (v / 255 - imagenet[0][ch]) / imagenet[1][ch] : 0; break;
                case 4: want = ch < 3 ? (v / 255 - cifar10[0][ch]) / cifar10[1][ch] : 0; break;
                case 5: want = (v / 255 - sd) / m; break;
                default: want = (v / 255 - m) / sd; break;
                }
                worst = fmax(worst, fabs(x[ch * plane + i] - want));
            }
        if (worst <= NORM_TOL * (k == 0 ? 255 : 1)) return what[k];
    }
    return NULL;
}

static void test_image_input_normalised(void **state) {
    (void)state;
    Image img = image_of_sample(&g_test, 3);
    size_t n = (size_t)g_cfg.in_c * g_cfg.in_h * g_cfg.in_w;
    float *x = xcalloc(n, sizeof(float)), *want = xmalloc(n * sizeof(float));
    int idx = 3, y;
    dataset_fill_batch(&g_test, &idx, 1, NULL, 0, 0, want, &y);
    char err[512] = "";
    int rc = image_to_input(&img, &g_test, &g_cfg, x, err, sizeof err);
    double worst = 0;
    for (size_t i = 0; i < n && rc == 0; i++) worst = fmax(worst, fabs((double)x[i] - want[i]));
    const char *why = rc == 0 && !(worst <= NORM_TOL) ? normalisation_mistake(x, &img, &g_test) : NULL;
    free(x), free(want);
    image_free(&img);
    if (rc != 0) fail_msg("image_to_input refused a test-set image: %s", err);
    if (!(worst <= NORM_TOL))
        fail_msg("the input differs from the training data's normalisation by up to %g%s%s", worst, why ? ": " : "",
                 why ? why : "");
}

// A test image written as a PNG and as raw bytes, read back and classified: the class the batched evaluation gives it.
static void test_predict_known_image(void **state) {
    (void)state;
    Model *m = load_or_fail(FIXTURE_BATCH);
    const char *pm = predict_mistake(m);
    grading_require_todo(pm == NULL, "2", "%s", pm ? pm : "");
    int *want = xmalloc((size_t)g_test.n * sizeof(int));
    reference_predictions(want, false, FIXTURE_BATCH);
    int j = 0;  // the first test image the model gets wrong: its class is not simply the label
    while (j < g_test.n - 1 && want[j] == g_test.labels[j]) j++;
    Image img = image_of_sample(&g_test, j);
    char png[300], raw[300], err[512] = "";
    snprintf(png, sizeof png, "%s/known.png", g_dir);
    snprintf(raw, sizeof raw, "%s/known.raw", g_dir);
    assert_int_equal(image_write_png(png, &img, err, sizeof err), 0);
    FILE *f = fopen(raw, "wb");
    assert_non_null(f);
    fwrite(img.pixels, 1, (size_t)img.c * img.h * img.w, f);
    fclose(f);
    image_free(&img);
    const char *files[] = {png, raw};
    size_t n = (size_t)g_cfg.in_c * g_cfg.in_h * g_cfg.in_w;
    float *x = xmalloc(n * sizeof(float)), logits[16];
    for (int k = 0; k < 2; k++) {
        Image in;
        assert_int_equal(image_read(files[k], g_cfg.in_c, g_cfg.in_h, g_cfg.in_w, &in, err, sizeof err), 0);
        int rc = image_to_input(&in, &g_test, &g_cfg, x, err, sizeof err);
        image_free(&in);
        if (rc != 0) fail_msg("%s: image_to_input refused it: %s", files[k], err);
        int pred = -1, idx[5];
        float prob[5];
        const float *out = infer_predict(m, x, 1, &pred);
        if (!out) fail_msg("infer_predict returned no logits");
        memcpy(logits, out, (size_t)g_cfg.classes * sizeof(float));
        top_k(logits, g_cfg.classes, 5, idx, prob);
        if (pred != want[j]) fail_msg("%s (test image %d): class %d, the batched evaluation says %d", files[k], j, pred, want[j]);
        if (idx[0] != pred) fail_msg("%s: top-5 starts with class %d, the prediction is %d", files[k], idx[0], pred);
        print_message("%s: test image %d (label %d): class %d, p = %.3f\n", k ? "raw" : "png", j, g_test.labels[j], pred,
                      prob[0]);
    }
    free(x), free(want);
    model_free(m);
}

static void test_top_k(void **state) {
    (void)state;
    // Large logits (exp(1000) overflows even double) and a tie between classes 2 and 5.
    const float logits[8] = {1000.0f, 998.0f, 999.0f, -50.0f, 990.0f, 999.0f, 0.0f, 997.0f};
    int idx[5] = {-1, -1, -1, -1, -1};
    float prob[5] = {0};
    top_k(logits, 8, 5, idx, prob);
    const int want_idx[5] = {0, 2, 5, 1, 7};
    double z = 0;  // the softmax in double, shifted by the max: the reference
    for (int j = 0; j < 8; j++) z += exp((double)logits[j] - 1000.0);
    for (int t = 0; t < 5; t++) {
        if (idx[t] != want_idx[t]) fail_msg("position %d: class %d, want %d (most likely first; ties: lower index first)",
                                            t + 1, idx[t], want_idx[t]);
        double p = exp((double)logits[want_idx[t]] - 1000.0) / z;
        // float's rounding of a probability in (0, 1]: 2^-24 relative, a few of them from exp and the division.
        if (!(fabs(prob[t] - p) <= 1e-6 * p + 1e-12))
            fail_msg("class %d: probability %g, want %g (softmax of large logits: subtract the max)", idx[t], prob[t], p);
    }
}

static void test_refuses_wrong_image(void **state) {
    (void)state;
    size_t n = (size_t)g_cfg.in_c * g_cfg.in_h * g_cfg.in_w;
    float *x = xmalloc(n * sizeof(float));
    uint8_t pixels[3 * 32 * 32];
    memset(pixels, 128, sizeof pixels);
    const struct { Image img; const char *what; } cases[] = {
        {{1, 32, 32, pixels}, "a gray 32x32 image for a colour model"},
        {{3, 16, 16, pixels}, "a 16x16 image for a 32x32 model"},
        {{3, 32, 16, pixels}, "a 16x32 image for a 32x32 model"},
    };
    Image valid = image_of_sample(&g_test, 0);
    char why[512] = "";
    int rc = image_to_input(&valid, &g_test, &g_cfg, x, why, sizeof why);
    image_free(&valid);
    if (rc != 0) fail_msg("image_to_input must accept a test-set image (it refused it: %s) before refusal counts", why);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char err[512] = "";
        if (image_to_input(&cases[k].img, &g_test, &g_cfg, x, err, sizeof err) == 0)
            fail_msg("image_to_input accepted %s%s", cases[k].what, k == 0 ? ": the CHANNELS are not checked (a "
                     "height x width check alone lets a gray image through, and reads 3 planes of a 1-plane image)" : "");
        if (strlen(err) < 10) fail_msg("image_to_input refused %s but err says nothing: say why", cases[k].what);
        print_message("refused %s: %s\n", cases[k].what, err);
    }
    free(x);
}

// ---------------------------------------------------------------- a slice of real data

#define FASHION_DIR "/usr/share/datasets/fashion-mnist"
#define SLICE_EVAL 1000   // test images 0..999 are evaluated
#define SLICE_TRAIN 4000  // test images 1000..4999 train the slice's model (one epoch: a model still making mistakes)

static int setup_dir(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/test_lesson06.XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

// Fashion-MNIST: one channel, 28 x 28, its own mean and std (0.2860, 0.3530), classes in another order in the
// file. A model trained through the kit on 4000 of its test images, saved as lesson 04 saves, then: TODO 1-4 on
// the 1000 images before them, against the kit's own evaluation of the same weights.
static void test_real_data_slice(void **state) {
    (void)state;
    Dataset all, slice, train;
    char err[512];
    if (dataset_load(&all, "fashion-mnist", FASHION_DIR, SPLIT_TEST, err, sizeof err) != 0) {
        print_message("skipped: Fashion-MNIST is not installed (Debian: apt-get install dataset-fashion-mnist): %s\n", err);
        skip();
    }
    size_t img = (size_t)all.c * all.h * all.w;
    slice = all, train = all;
    slice.n = SLICE_EVAL;
    train.n = SLICE_TRAIN, train.images = all.images + SLICE_EVAL * img, train.labels = all.labels + SLICE_EVAL;
    TrainOptions o = fixture_options();
    o.dataset = "fashion-mnist";
    o.lr = 0.2f;  // one epoch of 62 steps, all warmup: 450 of 1000 right after it (0.05: 256, 0.5: 222)
    model_config(&g_cfg, o.model, o.width, all.c, all.h, all.w, all.classes);
    Model *t = model_create(&g_cfg, DEVICE_CPU, o.batch_size, o.seed);
    Sampler ts, es;
    sampler_init(&ts, train.n, 0, 1, o.seed, SAMPLER_TRAIN_DROP);
    sampler_init(&es, slice.n, 0, 1, o.seed, SAMPLER_EVAL);
    Loader *tl = loader_create(&train, &ts, o.batch_size, true, NULL, o.seed);
    Loader *el = loader_create(&slice, &es, o.batch_size, false, NULL, o.seed);
    int steps = loader_batches_per_epoch(tl), step = 0;
    SgdConfig opt = train_sgd_config(&o);
    LrSchedule sched = train_schedule(&o, steps);
    loader_start_epoch(tl, 0, 0);
    const Batch *b;
    while ((b = loader_next(tl, NULL)) != NULL) {
        opt.lr = lr_at(&sched, step++);
        train_forward_backward(t, b, 0.0f, 1.0f / (float)b->n);
        optim_step(t, &opt);
    }
    Metrics test = train_evaluate(t, el);
    loader_free(tl), loader_free(el);
    CkptState st;
    memset(&st, 0, sizeof st);
    st.model = g_cfg, st.world = 1, st.global_batch = o.batch_size, st.steps_per_epoch = steps;
    st.epochs = 1, st.epoch = 1, st.step = step, st.seed = o.seed;
    snprintf(st.dataset, sizeof st.dataset, "fashion-mnist");
    st.test_acc = (double)test.correct / (double)test.count;
    char path[300];
    snprintf(path, sizeof path, "%s/fashion.ckpt", g_dir);
    assert_int_equal(ckpt_save(path, t, &st, err, sizeof err), 0);
    model_free(t);

    Model *m = infer_load(path, &g_cfg, "fashion-mnist", DEVICE_CPU, o.batch_size, NULL, err, sizeof err);
    if (!m) {
        dataset_free(&all);
        fail_msg("infer_load refused a Fashion-MNIST checkpoint (1 x 28 x 28, 10 classes): %s", err);
    }
    const char *pm = predict_mistake_on(m, &slice, path, false);
    if (pm) {
        model_free(m);
        dataset_free(&all);
        fail_msg("Fashion-MNIST: %s", pm);
    }
    int *want = xmalloc((size_t)slice.n * sizeof(int));
    reference_eval(&slice, path, o.batch_size, false, 0.0f, want, NULL);
    EvalReport r = infer_evaluate(m, &slice, o.batch_size);
    print_message("Fashion-MNIST slice: %ld of %d right in the kit's evaluation, %ld of %ld in infer_evaluate\n",
                  test.correct, slice.n, r.correct, r.count);
    const char *why = evaluation_difference(&r, &slice, want, o.batch_size);
    bool augmented = why && r.count == slice.n && augmentation_seen(m, &slice);
    char loss_why[512] = "";
    const char *lm = why ? NULL : loss_mistake(r.loss_sum, m, &slice, path, o.batch_size);
    if (lm) snprintf(loss_why, sizeof loss_why, "%s", lm);
    eval_report_free(&r);
    // One image through TODO 4: the loader's normalisation with this dataset's one channel and statistics.
    // x has room for 3 planes: code that does not check the channels writes 3 of them for the colour image below.
    float *x = xcalloc(3 * img, sizeof(float)), *norm = xmalloc(img * sizeof(float));
    int idx = 7, y;
    dataset_fill_batch(&slice, &idx, 1, NULL, 0, 0, norm, &y);
    Image one = image_of_sample(&slice, 7);
    int rc = image_to_input(&one, &slice, &g_cfg, x, err, sizeof err);
    double worst = rc == 0 ? max_abs_diff(x, norm, img) : 0;
    const char *norm_why = rc == 0 && !(worst <= NORM_TOL) ? normalisation_mistake(x, &one, &slice) : NULL;
    uint8_t colour[3 * 28 * 28] = {0};
    Image rgb = {3, 28, 28, colour};
    char err2[512] = "";
    int rc_rgb = image_to_input(&rgb, &slice, &g_cfg, x, err2, sizeof err2);
    image_free(&one);
    free(x), free(norm), free(want);
    model_free(m);
    dataset_free(&all);
    if (why) fail_msg("Fashion-MNIST: %s%s", why, augmented ? ": " AUGMENTED_MSG : "");
    if (test.correct != (long)lround(st.test_acc * slice.n)) fail_msg("the reference itself is inconsistent");
    if (loss_why[0]) fail_msg("Fashion-MNIST: %s", loss_why);
    if (rc != 0) fail_msg("Fashion-MNIST: image_to_input refused a test image (1 x 28 x 28): %s", err);
    if (!(worst <= NORM_TOL))
        fail_msg("Fashion-MNIST: the input differs from the training data's by up to %g: %s (this dataset: 1 channel, "
                 "mean %.4f, std %.4f)", worst, norm_why ? norm_why : "the dataset's own units, mean and std?",
                 slice.mean[0], slice.std[0]);
    if (rc_rgb == 0) fail_msg("Fashion-MNIST: image_to_input accepted a 3-channel image for a 1-channel model: the "
                              "CHANNELS are not checked");
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_load_inference_only, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuses_corrupt_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuses_other_dataset, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuses_other_model, setup, teardown),
        cmocka_unit_test_setup_teardown(test_eval_mode, setup, teardown),
        cmocka_unit_test_setup_teardown(test_predict_argmax, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reproduces_training_eval, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_size_invariance, setup, teardown),
        cmocka_unit_test_setup_teardown(test_confusion_matrix, setup, teardown),
        cmocka_unit_test_setup_teardown(test_eval_loss, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_test_augmentation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_image_input_normalised, setup, teardown),
        cmocka_unit_test_setup_teardown(test_predict_known_image, setup, teardown),
        cmocka_unit_test_setup_teardown(test_top_k, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuses_wrong_image, setup, teardown),
        cmocka_unit_test_setup_teardown(test_real_data_slice, setup_dir, teardown),
    };
    return grading_run(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
