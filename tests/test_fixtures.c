// tests/test_fixtures.c: every CPU op against PyTorch's results on the same inputs.
//
// The reference files were written once by tests/fixtures/make_fixtures.py (PyTorch, CPU, float32) and
// are committed, so this test needs no Python. Format: tests/fixtures/README.md. Run from the repository root.
//
// Tolerance: relative error <= 1e-4, measured against max(|ref|, 1e-2 * max|ref|) per array. Both sides
// are float32 computations of the same formula in a different order (PyTorch's kernels, and whichever
// OpenBLAS kernel runs here). Each is within gamma_m * sum|terms| of the exact value (gamma_m = m u / (1 - m u),
// u = 2^-24) for its sums of m terms; the fixtures' longest sums have m <= 96 (conv_5x5_grouped's weight
// gradient: 6 images x 4 x 4 positions), gamma_96 = 5.7e-6. So an element is guaranteed within 1e-4 of its
// size when sum|terms| <= 8.7 x that size (and the floor), which holds wherever the terms do not cancel;
// where they do (an output close to 0), the floor turns the allowance into 1e-6 of the array's largest value,
// and the guarantee rests on the typical error, sqrt(m) u sum|terms| = 6e-7 sum|terms| for random signs,
// 10x smaller than gamma_m: a documented assumption, not a proof. Formula mistakes are off by 1e-2 or more.
#include "tests/testutil.h"

#include "kit/ops.h"

#define FIX_TOL 1e-4
#define FIX_FLOOR 1e-2
#define FIX_MAX_ARRAYS 32

static const Device CPU = DEVICE_CPU;

typedef struct {
    char name[33];
    int dtype;  // 0 float32, 1 int32
    int ndim;
    int shape[4];
    size_t count;
    void *data;
} FixArray;

typedef struct {
    const char *path;
    void *blob;
    int n;
    FixArray a[FIX_MAX_ARRAYS];
} Fixture;

static uint32_t rd_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

// Parses tests/fixtures/<name>.bin; every size is checked against the file length first.
static Fixture fix_load(const char *name) {
    static char path[256];
    snprintf(path, sizeof path, "tests/fixtures/%s.bin", name);
    Fixture f = {.path = path};
    size_t size = 0;
    unsigned char *b = read_fixture(path, &size);
    f.blob = b;
    assert_true(size >= 12 && memcmp(b, "KITFIX01", 8) == 0);
    uint32_t n = rd_u32(b + 8);
    assert_true(n <= FIX_MAX_ARRAYS);
    size_t at = 12;
    for (uint32_t i = 0; i < n; i++) {
        FixArray *a = &f.a[i];
        assert_true(at + 32 + 8 + 16 <= size);
        memcpy(a->name, b + at, 32);
        a->name[32] = '\0';
        a->dtype = (int)rd_u32(b + at + 32);
        a->ndim = (int)rd_u32(b + at + 36);
        assert_true(a->dtype == 0 || a->dtype == 1);
        assert_true(a->ndim >= 1 && a->ndim <= 4);
        a->count = 1;
        for (int d = 0; d < 4; d++) {
            a->shape[d] = (int)rd_u32(b + at + 40 + 4 * d);
            a->count *= (size_t)a->shape[d];
        }
        at += 56;
        assert_true(a->count <= (size - at) / 4);
        // The data is 4-byte aligned in the file after a 12-byte header and 56-byte entries; copy it out
        // anyway so the pointer's alignment never depends on malloc.
        a->data = xmalloc(a->count * 4 + 4);
        memcpy(a->data, b + at, a->count * 4);
        at += a->count * 4;
    }
    assert_true(at == size);  // nothing left over: the file is what the header says
    f.n = (int)n;
    return f;
}

static void fix_free(Fixture *f) {
    for (int i = 0; i < f->n; i++) free(f->a[i].data);
    free(f->blob);
}

static FixArray *fix_get(Fixture *f, const char *name, int dtype) {
    for (int i = 0; i < f->n; i++) {
        if (strcmp(f->a[i].name, name) == 0) {
            if (f->a[i].dtype != dtype) {
                print_error("%s: array %s has the wrong type\n", f->path, name);
                fail();
            }
            return &f->a[i];
        }
    }
    print_error("%s: no array named %s (regenerate with tests/fixtures/make_fixtures.py)\n", f->path, name);
    fail();
    return NULL;
}

static float *fx_f(Fixture *f, const char *name, size_t *count) {
    FixArray *a = fix_get(f, name, 0);
    if (count) *count = a->count;
    return a->data;
}

static int *fx_i(Fixture *f, const char *name) { return fix_get(f, name, 1)->data; }

static float *zeros(size_t n) { return xcalloc(n ? n : 1, sizeof(float)); }

static double max_abs(const float *x, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}

// Asserts `got` matches the fixture's array `name` (and has its size).
static void expect_array(Fixture *f, const char *name, const float *got, size_t n) {
    size_t count = 0;
    const float *ref = fx_f(f, name, &count);
    assert_int_equal(count, n);
    const double floor = FIX_FLOOR * max_abs(ref, n) + 1e-30;
    if (max_rel_error(got, ref, n, floor) > FIX_TOL) print_error("%s: %s differs from PyTorch\n", f->path, name);
    assert_close(got, ref, n, FIX_TOL, floor);
}

// ---------------------------------------------------------------- cases

static void conv_fixture(const char *name) {
    Fixture f = fix_load(name);
    const int *d = fx_i(&f, "dims");
    Conv2dDims s = {.n = d[0], .c = d[1], .h = d[2], .w = d[3], .k = d[4], .r = d[5], .stride = d[6], .pad = d[7]};
    size_t nx, nw, ny;
    const float *x = fx_f(&f, "x", &nx), *w = fx_f(&f, "w", &nw), *b = fx_f(&f, "b", NULL);
    const float *dy = fx_f(&f, "dy", &ny);
    float *y = zeros(ny), *dx = zeros(nx), *dw = zeros(nw), *db = zeros(s.k);
    float *work = zeros(conv2d_work_floats(CPU, &s));
    conv2d_forward(CPU, &s, x, w, b, y, work);
    expect_array(&f, "y", y, ny);
    conv2d_backward(CPU, &s, x, w, dy, dx, dw, db, work);
    expect_array(&f, "dx", dx, nx);
    expect_array(&f, "dw", dw, nw);
    expect_array(&f, "db", db, (size_t)s.k);
    free(y), free(dx), free(dw), free(db), free(work);
    fix_free(&f);
}

static void test_conv_stride1_pad1(void **state) { (void)state, conv_fixture("conv_s1p1"); }
static void test_conv_stride2_pad0(void **state) { (void)state, conv_fixture("conv_s2p0"); }
static void test_conv_stride2_pad1(void **state) { (void)state, conv_fixture("conv_s2p1"); }
static void test_conv_1x1(void **state) { (void)state, conv_fixture("conv_1x1"); }
static void test_conv_5x5_grouped(void **state) { (void)state, conv_fixture("conv_5x5_grouped"); }

static void test_batchnorm(void **state) {
    (void)state;
    Fixture f = fix_load("bn");
    const int *d = fx_i(&f, "dims");
    const float *em = fx_f(&f, "eps_momentum", NULL);
    BatchNormDims s = {.n = d[0], .c = d[1], .hw = d[2], .eps = em[0], .momentum = em[1]};
    size_t nx;
    const float *x = fx_f(&f, "x", &nx), *gamma = fx_f(&f, "gamma", NULL), *beta = fx_f(&f, "beta", NULL);
    const float *dy = fx_f(&f, "dy", NULL);
    const size_t C = (size_t)s.c;
    float *rm = zeros(C), *rv = zeros(C), *mean = zeros(C), *invstd = zeros(C);
    memcpy(rm, fx_f(&f, "running_mean0", NULL), C * 4);
    memcpy(rv, fx_f(&f, "running_var0", NULL), C * 4);
    float *y = zeros(nx), *dx = zeros(nx), *dgamma = zeros(C), *dbeta = zeros(C);
    float *work = zeros(batchnorm_work_floats(CPU, &s));

    batchnorm_forward_train(CPU, &s, x, gamma, beta, y, mean, invstd, rm, rv, NULL, work);
    expect_array(&f, "y", y, nx);
    expect_array(&f, "mean", mean, C);
    expect_array(&f, "invstd", invstd, C);
    expect_array(&f, "running_mean", rm, C);
    expect_array(&f, "running_var", rv, C);
    batchnorm_backward(CPU, &s, x, gamma, mean, invstd, dy, dx, dgamma, dbeta, NULL, work);
    expect_array(&f, "dx", dx, nx);
    expect_array(&f, "dgamma", dgamma, C);
    expect_array(&f, "dbeta", dbeta, C);
    // Eval mode with the running statistics the training step just produced.
    batchnorm_forward_eval(CPU, &s, x, gamma, beta, rm, rv, y);
    expect_array(&f, "y_eval", y, nx);
    free(rm), free(rv), free(mean), free(invstd), free(y), free(dx), free(dgamma), free(dbeta), free(work);
    fix_free(&f);
}

static void test_relu(void **state) {
    (void)state;
    Fixture f = fix_load("relu");
    size_t n;
    const float *x = fx_f(&f, "x", &n), *dy = fx_f(&f, "dy", NULL);
    float *y = zeros(n), *dx = zeros(n);
    relu_forward(CPU, n, x, y);
    expect_array(&f, "y", y, n);
    relu_backward(CPU, n, y, dy, dx);
    expect_array(&f, "dx", dx, n);
    free(y), free(dx);
    fix_free(&f);
}

static void maxpool_fixture(const char *name) {
    Fixture f = fix_load(name);
    const int *d = fx_i(&f, "dims");
    size_t nx, ny;
    const float *x = fx_f(&f, "x", &nx), *dy = fx_f(&f, "dy", &ny);
    float *y = zeros(ny), *dx = zeros(nx);
    maxpool2_forward(CPU, d[0], d[1], d[2], d[3], x, y);
    expect_array(&f, "y", y, ny);
    maxpool2_backward(CPU, d[0], d[1], d[2], d[3], x, y, dy, dx);
    expect_array(&f, "dx", dx, nx);
    free(y), free(dx);
    fix_free(&f);
}

static void test_maxpool_even(void **state) { (void)state, maxpool_fixture("maxpool_even"); }
static void test_maxpool_odd(void **state) { (void)state, maxpool_fixture("maxpool_odd"); }

static void test_avgpool(void **state) {
    (void)state;
    Fixture f = fix_load("avgpool");
    const int *d = fx_i(&f, "dims");
    size_t nx, ny;
    const float *x = fx_f(&f, "x", &nx), *dy = fx_f(&f, "dy", &ny);
    float *y = zeros(ny), *dx = zeros(nx);
    avgpool_forward(CPU, d[0], d[1], d[2], x, y);
    expect_array(&f, "y", y, ny);
    avgpool_backward(CPU, d[0], d[1], d[2], dy, dx);
    expect_array(&f, "dx", dx, nx);
    free(y), free(dx);
    fix_free(&f);
}

static void test_linear(void **state) {
    (void)state;
    Fixture f = fix_load("linear");
    const int *d = fx_i(&f, "dims");
    const int n = d[0], in = d[1], out = d[2];
    const float *x = fx_f(&f, "x", NULL), *w = fx_f(&f, "w", NULL), *b = fx_f(&f, "b", NULL);
    const float *dy = fx_f(&f, "dy", NULL);
    float *y = zeros((size_t)n * out), *dx = zeros((size_t)n * in), *dw = zeros((size_t)out * in), *db = zeros(out);
    linear_forward(CPU, n, in, out, x, w, b, y);
    expect_array(&f, "y", y, (size_t)n * out);
    linear_backward(CPU, n, in, out, x, w, dy, dx, dw, db);
    expect_array(&f, "dx", dx, (size_t)n * in);
    expect_array(&f, "dw", dw, (size_t)out * in);
    expect_array(&f, "db", db, (size_t)out);
    free(y), free(dx), free(dw), free(db);
    fix_free(&f);
}

static void ce_fixture(const char *name) {
    Fixture f = fix_load(name);
    const int *d = fx_i(&f, "dims");
    const int n = d[0], k = d[1];
    const float smoothing = fx_f(&f, "smoothing", NULL)[0];
    const float *logits = fx_f(&f, "logits", NULL);
    const int *labels = fx_i(&f, "labels");
    float *loss = zeros(n), *dl = zeros((size_t)n * k);
    cross_entropy_forward(CPU, n, k, logits, labels, smoothing, loss);
    expect_array(&f, "loss", loss, (size_t)n);
    cross_entropy_backward(CPU, n, k, logits, labels, smoothing, 1.0f / n, dl);  // the batch mean's gradient
    expect_array(&f, "dlogits", dl, (size_t)n * k);
    free(loss), free(dl);
    fix_free(&f);
}

static void test_cross_entropy(void **state) { (void)state, ce_fixture("ce"); }
static void test_cross_entropy_smoothing(void **state) { (void)state, ce_fixture("ce_smooth"); }
static void test_cross_entropy_large_logits(void **state) { (void)state, ce_fixture("ce_smooth_large"); }

static void sgd_fixture(const char *name) {
    Fixture f = fix_load(name);
    const int *d = fx_i(&f, "dims");
    const size_t n = (size_t)d[0];
    const int steps = d[1];
    const float *h = fx_f(&f, "hyper", NULL);
    const float *grads = fx_f(&f, "grads", NULL);
    float *p = zeros(n), *v = h[1] != 0.0f ? zeros(n) : NULL;
    memcpy(p, fx_f(&f, "p0", NULL), n * 4);
    for (int s = 0; s < steps; s++) sgd_update(CPU, n, p, grads + (size_t)s * n, v, h[0], h[1], h[2], h[3] != 0.0f);
    expect_array(&f, "p", p, n);
    if (v) expect_array(&f, "v", v, n);
    free(p), free(v);
    fix_free(&f);
}

static void test_sgd_momentum(void **state) { (void)state, sgd_fixture("sgd_momentum"); }
static void test_sgd_nesterov_weight_decay(void **state) { (void)state, sgd_fixture("sgd_nesterov_wd"); }
static void test_sgd_plain_weight_decay(void **state) { (void)state, sgd_fixture("sgd_plain_wd"); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv_stride1_pad1),
        cmocka_unit_test(test_conv_stride2_pad0),
        cmocka_unit_test(test_conv_stride2_pad1),
        cmocka_unit_test(test_conv_1x1),
        cmocka_unit_test(test_conv_5x5_grouped),
        cmocka_unit_test(test_batchnorm),
        cmocka_unit_test(test_relu),
        cmocka_unit_test(test_maxpool_even),
        cmocka_unit_test(test_maxpool_odd),
        cmocka_unit_test(test_avgpool),
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_cross_entropy),
        cmocka_unit_test(test_cross_entropy_smoothing),
        cmocka_unit_test(test_cross_entropy_large_logits),
        cmocka_unit_test(test_sgd_momentum),
        cmocka_unit_test(test_sgd_nesterov_weight_decay),
        cmocka_unit_test(test_sgd_plain_weight_decay),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
