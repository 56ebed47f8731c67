// tests/lesson06/test_lesson06.c: the autograder for lesson 06 (the learner's infer.c: inference from a checkpoint).
//
// One process, the CPU. Each test starts from a checkpoint that a short training run writes through the kit
// (tiny-bn, width 8, the synthetic set, batch 64, one epoch of warmup to lr 0.05: a model still making mistakes,
// 864 of 1000 right here, so that "the same number correct" says something; at 100 % any model would pass). The run
// evaluates the test set after its epoch exactly as lesson 03/04's programs do (train_evaluate: eval mode, batches
// of 64) and saves that result in the checkpoint (CkptState.test_acc), as lesson 04 does. Checkpoints written by
// lesson 04's own program on 1 and 2 ranks are checked by tests/lesson06/run-tests.sh. Hints: hints.tsv.
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

// The kit's own eval-mode predictions for every test image, from a TRAINING model loaded with ckpt_load (the
// reference the learner's code is compared with). pred: (n). train_mode: BN with batch statistics instead (the
// mistake), in batches of `batch`.
static long reference_predictions(int *pred, bool train_mode, int batch) {
    Model *m = model_create(&g_cfg, DEVICE_CPU, batch, 0);
    char err[512];
    assert_int_equal(ckpt_load(g_ckpt, m, NULL, err, sizeof err), 0);
    size_t img = (size_t)g_cfg.in_c * g_cfg.in_h * g_cfg.in_w;
    float *x = xmalloc((size_t)batch * img * sizeof(float));
    int *idx = xmalloc((size_t)batch * sizeof(int)), *y = xmalloc((size_t)batch * sizeof(int));
    long correct = 0;
    for (int start = 0; start < g_test.n; start += batch) {
        int n = g_test.n - start < batch ? g_test.n - start : batch;
        for (int i = 0; i < n; i++) idx[i] = start + i;
        dataset_fill_batch(&g_test, idx, n, NULL, 0, 0, x, y);
        const float *logits = model_forward(m, x, n, train_mode);
        argmax_rows(DEVICE_CPU, n, g_cfg.classes, logits, pred + start);
        for (int i = 0; i < n; i++) correct += pred[start + i] == y[i];
    }
    free(x), free(idx), free(y);
    model_free(m);
    return correct;
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
    int n = g_test.n;
    int *want = xmalloc((size_t)n * sizeof(int)), *train64 = xmalloc((size_t)n * sizeof(int));
    int *train1 = xmalloc((size_t)n * sizeof(int));
    long c_eval = reference_predictions(want, false, FIXTURE_BATCH);
    long c_train64 = reference_predictions(train64, true, FIXTURE_BATCH);
    long c_train1 = reference_predictions(train1, true, 1);
    // The learner's predictions of the first batch, and of one image alone: eval mode gives the same classes.
    size_t img = (size_t)g_cfg.in_c * g_cfg.in_h * g_cfg.in_w;
    float *x = xmalloc(FIXTURE_BATCH * img * sizeof(float));
    int idx[FIXTURE_BATCH], y[FIXTURE_BATCH], pred[FIXTURE_BATCH], alone = -1;
    for (int i = 0; i < FIXTURE_BATCH; i++) idx[i] = i;
    dataset_fill_batch(&g_test, idx, FIXTURE_BATCH, NULL, 0, 0, x, y);
    memset(pred, 0xff, sizeof pred);
    infer_predict(m, x, FIXTURE_BATCH, pred);
    int wrong = 0;
    for (int i = 0; i < FIXTURE_BATCH; i++) wrong += pred[i] != want[i];
    infer_predict(m, x + 5 * img, 1, &alone);
    print_message("the test set, eval mode: %ld of %d correct; BN in training mode instead: %ld (batches of %d), "
                  "%ld (images one at a time)\n", c_eval, n, c_train64, FIXTURE_BATCH, c_train1);
    free(x), free(want), free(train64), free(train1);
    model_free(m);
    if (wrong) fail_msg("%d of the first %d images get another class than in eval mode", wrong, FIXTURE_BATCH);
    if (alone != pred[5]) fail_msg("image 5 alone gets class %d, in a batch of %d class %d", alone, FIXTURE_BATCH, pred[5]);
}

static void test_reproduces_training_eval(void **state) {
    (void)state;
    Model *m = load_or_fail(FIXTURE_BATCH);
    EvalReport r = infer_evaluate(m, &g_test, FIXTURE_BATCH);
    long want = fixture_correct();
    print_message("training run's evaluation: %ld of %d; infer_evaluate: %ld of %ld\n", want, g_test.n, r.correct,
                  r.count);
    eval_report_free(&r);
    model_free(m);
    if (r.count != g_test.n) fail_msg("%ld images evaluated, the test set has %d", r.count, g_test.n);
    if (r.correct != want) fail_msg("%ld correct, the training run's evaluation had %ld", r.correct, want);
}

// 1000 images in batches of 1, 7 (142 full + one of 6), 64 (15 + 40), 333 (3 + 1) and 1000: the same answer.
static void test_batch_size_invariance(void **state) {
    (void)state;
    const int sizes[] = {FIXTURE_BATCH, 1, 7, 333, 1000};
    Model *m = load_or_fail(1000);
    EvalReport first = {0};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        EvalReport r = infer_evaluate(m, &g_test, sizes[k]);
        if (r.count != g_test.n)
            fail_msg("batch %d: %ld images evaluated, the test set has %d (the last, short batch?)", sizes[k], r.count,
                     g_test.n);
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
    EvalReport r = infer_evaluate(m, &g_test, FIXTURE_BATCH);
    int K = g_cfg.classes;
    int *want = xmalloc((size_t)g_test.n * sizeof(int));
    reference_predictions(want, false, FIXTURE_BATCH);
    long *ref = xcalloc((size_t)K * K, sizeof(long));
    for (int i = 0; i < g_test.n; i++) ref[(size_t)g_test.labels[i] * K + want[i]]++;
    long total = 0, diag = 0;
    for (int k = 0; k < K; k++)
        for (int j = 0; j < K; j++) total += r.confusion[(size_t)k * K + j], diag += k == j ? r.confusion[(size_t)k * K + j] : 0;
    int bad_row = -1;
    for (int k = 0; k < K && bad_row < 0; k++)
        if (memcmp(r.confusion + (size_t)k * K, ref + (size_t)k * K, (size_t)K * sizeof(long)) != 0) bad_row = k;
    long correct = r.correct;
    eval_report_free(&r);
    free(ref), free(want);
    model_free(m);
    if (total != g_test.n) fail_msg("the confusion matrix sums to %ld, the test set has %d images", total, g_test.n);
    if (diag != correct) fail_msg("the diagonal sums to %ld, the report says %ld correct", diag, correct);
    if (bad_row >= 0) fail_msg("row %d (true class %d) differs from the reference: rows are the TRUE class, columns "
                               "the PREDICTED one", bad_row, bad_row);
}

// ---------------------------------------------------------------- TODO 4 and 5: one image file

static void test_image_input_normalised(void **state) {
    (void)state;
    Image img = image_of_sample(&g_test, 3);
    size_t n = (size_t)g_cfg.in_c * g_cfg.in_h * g_cfg.in_w;
    float *x = xcalloc(n, sizeof(float)), *want = xmalloc(n * sizeof(float));
    int idx = 3, y;
    dataset_fill_batch(&g_test, &idx, 1, NULL, 0, 0, want, &y);
    char err[512] = "";
    int rc = image_to_input(&img, &g_test, &g_cfg, x, err, sizeof err);
    // The loader computes (v / 255 - mean) / std in float; another order of the same float operations differs by
    // a few roundings of values below 1 / std ~ 4 (synthetic std ~ 0.25): 1e-5 absolute is 40 such ulps (2^-22 at 4),
    // while a missing normalisation is off by ~1 and a swapped mean/std or channel by ~0.1 or more.
    double worst = 0;
    for (size_t i = 0; i < n && rc == 0; i++) worst = fmax(worst, fabs((double)x[i] - want[i]));
    free(x), free(want);
    image_free(&img);
    if (rc != 0) fail_msg("image_to_input refused a test-set image: %s", err);
    if (!(worst <= 1e-5)) fail_msg("the input differs from the training data's normalisation by up to %g", worst);
}

// A test image written as a PNG and as raw bytes, read back and classified: the class the batched evaluation gives it.
static void test_predict_known_image(void **state) {
    (void)state;
    Model *m = load_or_fail(1);
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
            fail_msg("image_to_input accepted %s", cases[k].what);
        if (strlen(err) < 10) fail_msg("image_to_input refused %s but err says nothing: say why", cases[k].what);
        print_message("refused %s: %s\n", cases[k].what, err);
    }
    free(x);
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_load_inference_only, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuses_corrupt_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuses_other_dataset, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuses_other_model, setup, teardown),
        cmocka_unit_test_setup_teardown(test_eval_mode, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reproduces_training_eval, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_size_invariance, setup, teardown),
        cmocka_unit_test_setup_teardown(test_confusion_matrix, setup, teardown),
        cmocka_unit_test_setup_teardown(test_image_input_normalised, setup, teardown),
        cmocka_unit_test_setup_teardown(test_predict_known_image, setup, teardown),
        cmocka_unit_test_setup_teardown(test_top_k, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuses_wrong_image, setup, teardown),
    };
    return grading_run(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
