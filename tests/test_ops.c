// tests/test_ops.c: every CPU op against a float64 reference written here, independently of kit/ops_cpu.c.
//
// Gradient checks: for an op y = f(theta) and a fixed random upstream gradient R, the scalar
// L(theta) = sum(R * f64(theta)) has dL/dtheta = the op's backward with dy = R. We compare the float32
// backward against central finite differences of the float64 reference forward.
//
// Tolerances, and why they are right:
//   - Finite differences in float64 with h = 1e-6 are accurate to ~1e-9 (truncation h^2 ~ 1e-12, rounding
//     1e-16 * |L| / h ~ 1e-9), so the error we measure is the float32 op's own.
//   - A float32 op summing m terms, in any order or BLAS kernel, is off by at most gamma_m * sum|terms|
//     (gamma_m = m u / (1 - m u), u = 2^-24; testutil.h), and typically by sqrt(m) u * sum|terms|. The longest
//     sums here have m = 112 (conv dW: 7 images x 4 x 4 positions): gamma_112 = 6.7e-6 of sum|terms|.
//   - A genuine bug (wrong index, missing term, biased instead of unbiased variance with M = 60, a
//     missing 1/N) moves gradients by >= 1e-2 of their scale.
//   GRAD_TOL = 1e-3, measured relative to max(|g_i|, 1e-2 * max|g|), holds the worst case 6.7e-6 sum|terms|
//   whenever sum|terms| <= 150 x the floor, i.e. 1.5 x max|g| (terms of random sign: sum|terms| is ~sqrt(m)
//   times |sum| at most for these inputs, and the typical error sqrt(m) u is 60x smaller than gamma_m), and sits
//   10x below the smallest bug we care about. Forwards are compared at FWD_TOL = 1e-4 with the same floor:
//   a float32 dot product of m terms is off by ~sqrt(m) * 6e-8 of its terms' size, not of its result,
//   so outputs that nearly cancel are measured against 1e-2 of the largest output.
//   Accumulation checks (backward twice = 2x once): where an op adds its finished result at the end (BN,
//   linear bias, pooling), the second call adds the same float c onto c and c + c = 2c exactly, so 1e-5 is
//   only slack; where the GEMM accumulates inside its sums (conv, linear with beta = 1), the two sides are
//   different sums and test_conv_accumulate_and_null bounds them by gamma_k * sum|terms| (assert_within_rounding).
//   Overwriting instead of accumulating is off by 50%.
#include <omp.h>

#include "tests/testutil.h"

#include "kit/gemm_small.h"
#include "kit/ops.h"
#include "kit/winograd.h"

#define GRAD_TOL 1e-3
#define FWD_TOL 1e-4
#define FD_H 1e-6

static const Device CPU = DEVICE_CPU;

// ---------------------------------------------------------------- helpers

static float *fvec(size_t n, float lo, float hi, uint64_t seed) {
    float *x = xmalloc((n ? n : 1) * sizeof *x);
    fill_uniform(x, n, lo, hi, seed);
    return x;
}

static float *fzeros(size_t n) { return xcalloc(n ? n : 1, sizeof(float)); }

static double *to_double(const float *x, size_t n) {
    double *d = xmalloc((n ? n : 1) * sizeof *d);
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

static double max_abs_d(const double *x, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}

// The scalar whose gradient we check: sum(R * reference forward(theta)).
typedef double (*LossFn)(void *ctx);

// Central differences of loss() with respect to theta[0..n) (theta is part of ctx and is restored).
static void fd_grad(LossFn loss, void *ctx, double *theta, size_t n, double *grad) {
    for (size_t i = 0; i < n; i++) {
        const double save = theta[i];
        const double h = FD_H * (fabs(save) > 1.0 ? fabs(save) : 1.0);
        theta[i] = save + h;
        const double lp = loss(ctx);
        theta[i] = save - h;
        const double lm = loss(ctx);
        theta[i] = save;
        grad[i] = (lp - lm) / (2.0 * h);
    }
}

// Asserts a float32 array matches a float64 one: |a - b| <= tol * max(|b|, rel_floor * max|b|).
static void check_close_d(const char *what, const float *a, const double *b, size_t n, double tol,
                          double rel_floor) {
    const double floor = rel_floor * max_abs_d(b, n) + 1e-30;
    double worst = 0.0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        const double scale = fabs(b[i]) > floor ? fabs(b[i]) : floor;
        const double e = fabs((double)a[i] - b[i]) / scale;
        if (!(e <= worst)) {
            worst = e;
            at = i;
        }
    }
    if (!(worst <= tol)) {
        print_error("%s: max relative error %.3g > %.3g at [%zu]: %.9g vs %.9g\n", what, worst, tol, at,
                    (double)a[at], b[at]);
        fail();
    }
}

#define check_grad(what, a, b, n) check_close_d((what), (a), (b), (n), GRAD_TOL, 1e-2)
#define check_fwd(what, a, b, n) check_close_d((what), (a), (b), (n), FWD_TOL, 1e-2)

static double dot_d(const double *r, const double *y, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += r[i] * y[i];
    return s;
}

// ---------------------------------------------------------------- conv2d

typedef struct {
    Conv2dDims s;
    double *x, *w, *b, *r, *y;  // inputs, upstream gradient, output scratch (all float64)
} ConvRef;

static void conv_ref_forward(const Conv2dDims *s, const double *x, const double *w, const double *b, double *y) {
    const int P = conv2d_out_h(s), Q = conv2d_out_w(s);
    for (int n = 0; n < s->n; n++)
        for (int k = 0; k < s->k; k++)
            for (int p = 0; p < P; p++)
                for (int q = 0; q < Q; q++) {
                    double acc = b ? b[k] : 0.0;
                    for (int c = 0; c < s->c; c++)
                        for (int i = 0; i < s->r; i++)
                            for (int j = 0; j < s->r; j++) {
                                const int hh = p * s->stride - s->pad + i, ww = q * s->stride - s->pad + j;
                                if (hh < 0 || hh >= s->h || ww < 0 || ww >= s->w) continue;
                                acc += x[((size_t)(n * s->c + c) * s->h + hh) * s->w + ww] *
                                       w[((size_t)(k * s->c + c) * s->r + i) * s->r + j];
                            }
                    y[((size_t)(n * s->k + k) * P + p) * Q + q] = acc;
                }
}

static size_t conv_y_size(const Conv2dDims *s) {
    return (size_t)s->n * s->k * conv2d_out_h(s) * conv2d_out_w(s);
}

static double conv_loss(void *ctx) {
    ConvRef *c = ctx;
    conv_ref_forward(&c->s, c->x, c->w, c->b, c->y);
    return dot_d(c->r, c->y, conv_y_size(&c->s));
}

static void conv_case(Conv2dDims s, uint64_t seed) {
    const size_t nx = (size_t)s.n * s.c * s.h * s.w, nw = (size_t)s.k * s.c * s.r * s.r, nb = s.k;
    const size_t ny = conv_y_size(&s);
    float *x = fvec(nx, -1, 1, seed), *w = fvec(nw, -0.5f, 0.5f, seed + 1), *b = fvec(nb, -0.5f, 0.5f, seed + 2);
    float *dy = fvec(ny, -1, 1, seed + 3), *y = fzeros(ny);
    float *dx = fzeros(nx), *dw = fzeros(nw), *db = fzeros(nb);
    float *work = fzeros(conv2d_work_floats(CPU, &s));
    ConvRef ref = {s, to_double(x, nx), to_double(w, nw), to_double(b, nb), to_double(dy, ny),
                   xmalloc(ny * sizeof(double))};

    conv2d_forward(CPU, &s, x, w, b, y, work);
    conv_ref_forward(&s, ref.x, ref.w, ref.b, ref.y);
    check_fwd("conv2d y", y, ref.y, ny);

    conv2d_backward(CPU, &s, x, w, dy, dx, dw, db, work);
    double *g = xmalloc((nx > nw ? nx : nw) * sizeof *g);
    fd_grad(conv_loss, &ref, ref.x, nx, g);
    check_grad("conv2d dx", dx, g, nx);
    fd_grad(conv_loss, &ref, ref.w, nw, g);
    check_grad("conv2d dw", dw, g, nw);
    fd_grad(conv_loss, &ref, ref.b, nb, g);
    check_grad("conv2d db", db, g, nb);

    free(g), free(ref.x), free(ref.w), free(ref.b), free(ref.r), free(ref.y);
    free(x), free(w), free(b), free(dy), free(y), free(dx), free(dw), free(db), free(work);
}

static void test_conv_3x3_pad1(void **state) {
    (void)state;
    conv_case((Conv2dDims){.n = 2, .c = 3, .h = 5, .w = 6, .k = 4, .r = 3, .stride = 1, .pad = 1}, 10);
}

static void test_conv_stride2(void **state) {
    (void)state;
    conv_case((Conv2dDims){.n = 2, .c = 2, .h = 7, .w = 8, .k = 3, .r = 3, .stride = 2, .pad = 0}, 20);
    conv_case((Conv2dDims){.n = 3, .c = 2, .h = 7, .w = 6, .k = 3, .r = 3, .stride = 2, .pad = 1}, 21);
}

static void test_conv_1x1(void **state) {
    (void)state;
    conv_case((Conv2dDims){.n = 2, .c = 5, .h = 4, .w = 3, .k = 3, .r = 1, .stride = 1, .pad = 0}, 30);
    conv_case((Conv2dDims){.n = 2, .c = 3, .h = 5, .w = 5, .k = 2, .r = 1, .stride = 2, .pad = 0}, 31);
}

// Small images and several of them: the path that puts a group of images into one GEMM, with an
// uneven last group, and per-thread dW partial sums.
static void test_conv_grouped_images(void **state) {
    (void)state;
    conv_case((Conv2dDims){.n = 5, .c = 3, .h = 3, .w = 3, .k = 4, .r = 3, .stride = 1, .pad = 1}, 40);
    conv_case((Conv2dDims){.n = 7, .c = 2, .h = 4, .w = 4, .k = 3, .r = 5, .stride = 1, .pad = 2}, 41);
    // Kernels wider than the map: im2col's shifted-slice copy (stride 1, output as wide as the input) moves
    // some rows and columns entirely off the image.
    conv_case((Conv2dDims){.n = 3, .c = 2, .h = 2, .w = 1, .k = 3, .r = 5, .stride = 1, .pad = 2}, 42);
    conv_case((Conv2dDims){.n = 2, .c = 2, .h = 3, .w = 2, .k = 2, .r = 7, .stride = 1, .pad = 3}, 43);
}

// Backward twice doubles every gradient; a NULL gradient is skipped and leaves the others unchanged.
// ---------------------------------------------------------------- Winograd F(2x2, 3x3) (kit/winograd.c)

// S = the Winograd algorithm run in float64 on |A^T|, |G|, |B^T| and |x|, |w|, |b|: the sum of |terms| of
// the expanded computation, which bounds its float32 error by gamma_(C+11) * S (kit/WINOGRAD.md
// counts the C + 11 roundings). w is (cout, cin, 3, 3); s gives n, h, w and cin = s->c, cout = s->k.
static void wino_abs_sum(const Conv2dDims *s, const float *x, const float *w, const float *b, double *sum) {
    const int H = s->h, W = s->w;
    const double bt[4][4] = {{1, 0, 1, 0}, {0, 1, 1, 0}, {0, 1, 1, 0}, {0, 1, 0, 1}};  // |B^T|
    const double g[4][3] = {{1, 0, 0}, {.5, .5, .5}, {.5, .5, .5}, {0, 0, 1}};         // |G|
    const double at[2][4] = {{1, 1, 1, 0}, {0, 1, 1, 1}};                              // |A^T|
    for (int n = 0; n < s->n; n++)
        for (int ti = 0; ti < (H + 1) / 2; ti++)
            for (int tj = 0; tj < (W + 1) / 2; tj++) {
                double m[64][4][4];  // per output channel (s->k <= 64 here)
                memset(m, 0, sizeof m);
                for (int c = 0; c < s->c; c++) {
                    double d[4][4], v[4][4] = {{0}};
                    for (int i = 0; i < 4; i++)
                        for (int j = 0; j < 4; j++) {
                            const int r = 2 * ti - 1 + i, cc = 2 * tj - 1 + j;
                            d[i][j] = r >= 0 && r < H && cc >= 0 && cc < W
                                          ? fabs(x[((size_t)(n * s->c + c) * H + r) * W + cc]) : 0.0;
                        }
                    for (int a = 0; a < 4; a++)
                        for (int e = 0; e < 4; e++)
                            for (int i = 0; i < 4; i++)
                                for (int j = 0; j < 4; j++) v[a][e] += bt[a][i] * d[i][j] * bt[e][j];
                    for (int k = 0; k < s->k; k++) {
                        const float *wk = w + ((size_t)k * s->c + c) * 9;
                        for (int a = 0; a < 4; a++)
                            for (int e = 0; e < 4; e++) {
                                double u = 0.0;
                                for (int i = 0; i < 3; i++)
                                    for (int j = 0; j < 3; j++) u += g[a][i] * fabs(wk[i * 3 + j]) * g[e][j];
                                m[k][a][e] += u * v[a][e];
                            }
                    }
                }
                for (int k = 0; k < s->k; k++)
                    for (int p = 0; p < 2 && 2 * ti + p < H; p++)
                        for (int q = 0; q < 2 && 2 * tj + q < W; q++) {
                            double y = b ? fabs(b[k]) : 0.0;
                            for (int a = 0; a < 4; a++)
                                for (int e = 0; e < 4; e++) y += at[p][a] * m[k][a][e] * at[q][e];
                            sum[((size_t)(n * s->k + k) * H + 2 * ti + p) * W + 2 * tj + q] = y;
                        }
            }
}

// The same for the weight gradient: S = sum over images and tiles of |G^T| [(|A| |dy tile| |A^T|) .* (|B^T| |x tile|
// |B|)] |G|, per (k, c) into sum (K, C, 3, 3), plus |dw| before the call (start).
static void wino_abs_dw(const Conv2dDims *s, const float *x, const float *dy, const float *start, double *sum) {
    const int H = s->h, W = s->w;
    const double bt[4][4] = {{1, 0, 1, 0}, {0, 1, 1, 0}, {0, 1, 1, 0}, {0, 1, 0, 1}};  // |B^T|
    const double a[4][2] = {{1, 0}, {1, 1}, {1, 1}, {0, 1}};                           // |A|
    const double gt[3][4] = {{1, .5, .5, 0}, {0, .5, .5, 0}, {0, .5, .5, 1}};          // |G^T|
    double *du = xcalloc((size_t)s->k * s->c * 16, sizeof(double));  // sum over tiles of |dX| .* |V|
    double *v = xmalloc((size_t)s->c * 16 * sizeof(double));
    for (int n = 0; n < s->n; n++)
        for (int ti = 0; ti < (H + 1) / 2; ti++)
            for (int tj = 0; tj < (W + 1) / 2; tj++) {
                for (int c = 0; c < s->c; c++) {
                    double d[4][4];
                    for (int i = 0; i < 4; i++)
                        for (int j = 0; j < 4; j++) {
                            const int r = 2 * ti - 1 + i, cc = 2 * tj - 1 + j;
                            d[i][j] = r >= 0 && r < H && cc >= 0 && cc < W
                                          ? fabs(x[((size_t)(n * s->c + c) * H + r) * W + cc]) : 0.0;
                        }
                    for (int p = 0; p < 4; p++)
                        for (int e = 0; e < 4; e++) {
                            double acc = 0.0;
                            for (int i = 0; i < 4; i++)
                                for (int j = 0; j < 4; j++) acc += bt[p][i] * d[i][j] * bt[e][j];
                            v[c * 16 + p * 4 + e] = acc;
                        }
                }
                for (int k = 0; k < s->k; k++) {
                    double z[2][2];
                    for (int i = 0; i < 2; i++)
                        for (int j = 0; j < 2; j++) {
                            const int r = 2 * ti + i, cc = 2 * tj + j;
                            z[i][j] = r < H && cc < W ? fabs(dy[((size_t)(n * s->k + k) * H + r) * W + cc]) : 0.0;
                        }
                    double dx[16];
                    for (int p = 0; p < 4; p++)
                        for (int e = 0; e < 4; e++) {
                            double acc = 0.0;
                            for (int i = 0; i < 2; i++)
                                for (int j = 0; j < 2; j++) acc += a[p][i] * z[i][j] * a[e][j];
                            dx[p * 4 + e] = acc;
                        }
                    for (int c = 0; c < s->c; c++)
                        for (int e = 0; e < 16; e++) du[((size_t)k * s->c + c) * 16 + e] += dx[e] * v[c * 16 + e];
                }
            }
    for (size_t kc = 0; kc < (size_t)s->k * s->c; kc++)
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 3; j++) {
                double acc = 0.0;
                for (int p = 0; p < 4; p++)
                    for (int e = 0; e < 4; e++) acc += gt[i][p] * du[kc * 16 + p * 4 + e] * gt[j][e];
                sum[kc * 9 + i * 3 + j] = acc + fabs(start[kc * 9 + i * 3 + j]);
            }
    free(du);
    free(v);
}

// |wino - plain| <= gamma_(cin+11) * S (Winograd's error) + gamma_(9 cin + 1) * S_direct (the plain path's:
// 9 cin products and the bias), S_direct = the plain path run on |inputs|. Also reports how far below the
// bound the measured difference sits, and how much larger S is than S_direct (the coefficients' growth).
static void check_wino_bound(const char *what, const float *wino, const float *plain, const double *s_wino,
                             const float *s_direct, size_t n, double k_wino, double k_direct) {
    double worst = 0.0, growth = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)wino[i] - (double)plain[i]);
        const double bound = gamma_k(k_wino) * s_wino[i] + gamma_k(k_direct) * (double)s_direct[i];
        if (!(d <= bound)) {
            print_error("%s: |winograd - im2col| %.3g > bound %.3g at [%zu]: %.9g vs %.9g\n", what, d, bound, i,
                        (double)wino[i], (double)plain[i]);
            fail();
        }
        worst = d / bound > worst ? d / bound : worst;
        growth = s_wino[i] / s_direct[i] > growth ? s_wino[i] / s_direct[i] : growth;
    }
    print_message("  %s: worst |difference| / bound = %.3f, max S_winograd / S_direct = %.2f\n", what, worst,
                  growth);
}

static void wino_case(Conv2dDims s, uint64_t seed) {
    const size_t nx = (size_t)s.n * s.c * s.h * s.w, nw = (size_t)s.k * s.c * 9, ny = (size_t)s.n * s.k * s.h * s.w;
    float *x = fvec(nx, -1, 1, seed), *w = fvec(nw, -0.5f, 0.5f, seed + 1), *b = fvec(s.k, -0.5f, 0.5f, seed + 2);
    float *dy = fvec(ny, -1, 1, seed + 3);
    float *ax = xmalloc(nx * sizeof(float)), *aw = xmalloc(nw * sizeof(float)), *ab = xmalloc(s.k * sizeof(float));
    float *ady = xmalloc(ny * sizeof(float));
    for (size_t i = 0; i < nx; i++) ax[i] = fabsf(x[i]);
    for (size_t i = 0; i < nw; i++) aw[i] = fabsf(w[i]);
    for (int i = 0; i < s.k; i++) ab[i] = fabsf(b[i]);
    for (size_t i = 0; i < ny; i++) ady[i] = fabsf(dy[i]);
    size_t nwork = conv2d_work_floats(CPU, &s);
    if (winograd_eligible(&s)) assert_true(nwork >= winograd_work_floats(&s));  // the model sizes work so
    if (winograd_work_floats(&s) > nwork) nwork = winograd_work_floats(&s);     // (called directly below)
    float *work = fzeros(nwork), *y_wino = fzeros(ny), *y_plain = fzeros(ny), *s_direct = fzeros(nx > ny ? nx : ny);
    double *s_wino = xmalloc((nx > ny ? nx : ny) * sizeof(double));

    // Forward: y = conv(x, w) + b.
    winograd_forward(&s, x, w, b, y_wino, work);
    setenv("KIT_WINOGRAD", "0", 1);
    conv2d_forward(CPU, &s, x, w, b, y_plain, work);
    conv2d_forward(CPU, &s, ax, aw, ab, s_direct, work);
    unsetenv("KIT_WINOGRAD");
    wino_abs_sum(&s, x, w, b, s_wino);
    check_wino_bound("winograd y", y_wino, y_plain, s_wino, s_direct, ny, s.c + 11, 9.0 * s.c + 1);

    // Input gradient: dx += conv(dy, w') with w'[c][k] = w[k][c] rotated 180 degrees.
    float *dx_wino = fvec(nx, -1, 1, seed + 4), *dx_plain = xmalloc(nx * sizeof(float));
    memcpy(dx_plain, dx_wino, nx * sizeof(float));  // start from the same non-zero dx: it must add to it
    float *s_start = xmalloc(nx * sizeof(float));
    for (size_t i = 0; i < nx; i++) s_start[i] = fabsf(dx_wino[i]);
    winograd_backward_data(&s, w, dy, dx_wino, work);
    setenv("KIT_WINOGRAD", "0", 1);
    conv2d_backward(CPU, &s, x, w, dy, dx_plain, NULL, NULL, work);
    memcpy(s_direct, s_start, nx * sizeof(float));
    conv2d_backward(CPU, &s, ax, aw, ady, s_direct, NULL, NULL, work);
    unsetenv("KIT_WINOGRAD");
    float *wt = xmalloc(nw * sizeof(float));  // |w'| (C, K, 3, 3)
    for (int k = 0; k < s.k; k++)
        for (int c = 0; c < s.c; c++)
            for (int e = 0; e < 9; e++) wt[((size_t)c * s.k + k) * 9 + 8 - e] = aw[((size_t)k * s.c + c) * 9 + e];
    Conv2dDims t = s;
    t.c = s.k, t.k = s.c;
    wino_abs_sum(&t, ady, wt, NULL, s_wino);
    for (size_t i = 0; i < nx; i++) s_wino[i] += s_start[i];  // the dx it accumulates onto
    check_wino_bound("winograd dx", dx_wino, dx_plain, s_wino, s_direct, nx, s.k + 11, 9.0 * s.k + 1);

    // Weight gradient: dw += sum over images and positions of dy (x) x. Winograd's roundings: 2 in B^T d B,
    // 2 in A z A^T, 1 in the product, n*tiles - 1 in the sum over tiles (the GEMMs and the chunks), 4 in
    // G^T dU G (2 additions per row, twice; the 1/2 is exact), 1 into dw: n*tiles + 9 in all. The plain path
    // sums n*H*W products and the dw it starts from (thread shares, then their partials): n*H*W + 1.
    float *dw_wino = fvec(nw, -1, 1, seed + 5), *dw_plain = xmalloc(nw * sizeof(float));
    float *s_dw_direct = xmalloc(nw * sizeof(float));
    memcpy(dw_plain, dw_wino, nw * sizeof(float));
    for (size_t i = 0; i < nw; i++) s_dw_direct[i] = fabsf(dw_wino[i]);
    double *s_dw = xmalloc(nw * sizeof(double));
    wino_abs_dw(&s, x, dy, dw_wino, s_dw);
    winograd_backward_weights(&s, x, dy, dw_wino, work);
    setenv("KIT_WINOGRAD", "0", 1);
    conv2d_backward(CPU, &s, x, w, dy, NULL, dw_plain, NULL, work);
    conv2d_backward(CPU, &s, ax, aw, ady, NULL, s_dw_direct, NULL, work);
    unsetenv("KIT_WINOGRAD");
    const double tiles = (double)((s.h + 1) / 2) * ((s.w + 1) / 2);
    check_wino_bound("winograd dw", dw_wino, dw_plain, s_dw, s_dw_direct, nw, s.n * tiles + 9,
                     (double)s.n * s.h * s.w + 1);
    free(dw_wino), free(dw_plain), free(s_dw), free(s_dw_direct);

    // The switch: conv2d_forward takes Winograd for a forward-eligible layer unless KIT_WINOGRAD=0.
    float *y_auto = fzeros(ny);
    conv2d_forward(CPU, &s, x, w, b, y_auto, work);
    if (winograd_forward_eligible(&s)) {
        assert_memory_equal(y_auto, y_wino, ny * sizeof(float));
        assert_memory_not_equal(y_auto, y_plain, ny * sizeof(float));
    } else {
        assert_memory_equal(y_auto, y_plain, ny * sizeof(float));
    }
    // ...and conv2d_backward's weight gradient Winograd's for every winograd_eligible layer.
    float *dw_auto = fzeros(nw), *dw_direct = fzeros(nw);
    conv2d_backward(CPU, &s, x, w, dy, NULL, dw_auto, NULL, work);
    if (winograd_eligible(&s)) {
        winograd_backward_weights(&s, x, dy, dw_direct, work);
    } else {
        setenv("KIT_WINOGRAD", "0", 1);
        conv2d_backward(CPU, &s, x, w, dy, NULL, dw_direct, NULL, work);
        unsetenv("KIT_WINOGRAD");
    }
    assert_memory_equal(dw_auto, dw_direct, nw * sizeof(float));
    free(dw_auto), free(dw_direct);

    free(x), free(w), free(b), free(dy), free(ax), free(aw), free(ab), free(ady), free(work), free(y_wino);
    free(y_plain), free(s_direct), free(s_wino), free(dx_wino), free(dx_plain), free(s_start), free(wt), free(y_auto);
}

static void test_conv_winograd_bound(void **state) {
    (void)state;
    // Odd and even sizes (overhanging tiles), one tile, grouped images with an uneven last group, a
    // layer too thin for the switch, and a deep one (64 channels: the GEMMs' long sums).
    wino_case((Conv2dDims){.n = 3, .c = 16, .h = 7, .w = 6, .k = 20, .r = 3, .stride = 1, .pad = 1}, 60);
    wino_case((Conv2dDims){.n = 2, .c = 17, .h = 2, .w = 1, .k = 16, .r = 3, .stride = 1, .pad = 1}, 61);
    wino_case((Conv2dDims){.n = 37, .c = 16, .h = 4, .w = 4, .k = 24, .r = 3, .stride = 1, .pad = 1}, 62);
    wino_case((Conv2dDims){.n = 2, .c = 3, .h = 5, .w = 5, .k = 4, .r = 3, .stride = 1, .pad = 1}, 63);
    wino_case((Conv2dDims){.n = 2, .c = 64, .h = 8, .w = 8, .k = 64, .r = 3, .stride = 1, .pad = 1}, 64);
    wino_case((Conv2dDims){.n = 3, .c = 16, .h = 9, .w = 11, .k = 20, .r = 3, .stride = 1, .pad = 1}, 65);  // odd, forward too
}

// Through the public op on a layer the switch sends to Winograd: forward against the float64 reference,
// dx and dw against finite differences (independent of Winograd's flipped-filter identity).
static void test_conv_winograd_grads(void **state) {
    (void)state;
    conv_case((Conv2dDims){.n = 2, .c = 16, .h = 5, .w = 6, .k = 16, .r = 3, .stride = 1, .pad = 1}, 70);
}

static void test_conv_accumulate_and_null(void **state) {
    (void)state;
    Conv2dDims s = {.n = 3, .c = 3, .h = 6, .w = 5, .k = 4, .r = 3, .stride = 1, .pad = 1};
    const size_t nx = (size_t)s.n * s.c * s.h * s.w, nw = (size_t)s.k * s.c * 9, ny = conv_y_size(&s);
    float *x = fvec(nx, -1, 1, 50), *w = fvec(nw, -1, 1, 51), *dy = fvec(ny, -1, 1, 52);
    float *work = fzeros(conv2d_work_floats(CPU, &s));
    float *dx1 = fzeros(nx), *dw1 = fzeros(nw), *db1 = fzeros(s.k);
    float *dx2 = fzeros(nx), *dw2 = fzeros(nw), *db2 = fzeros(s.k);
    conv2d_backward(CPU, &s, x, w, dy, dx1, dw1, db1, work);
    conv2d_backward(CPU, &s, x, w, dy, dx2, dw2, db2, work);
    conv2d_backward(CPU, &s, x, w, dy, dx2, dw2, db2, work);
    for (size_t i = 0; i < nx; i++) dx1[i] *= 2.0f;
    for (size_t i = 0; i < nw; i++) dw1[i] *= 2.0f;
    for (int i = 0; i < s.k; i++) db1[i] *= 2.0f;
    // Tolerance from the sums' lengths, not a relative 1e-5 (which failed on OpenBLAS's Sandybridge kernel,
    // no FMA, where a dx of 0.012 is the sum of terms of size ~1: cancellation, not a bug). Each gradient is
    // a sum of at most k = n*P*Q = 90 products (dw, db; dx: K*R*R = 36); twice that plus one addition on
    // the accumulating side, so |dx2 - 2 dx1| <= gamma_(2k+1) * sum|terms of 2 dx1| + gamma_k * the same
    // <= gamma_(3k+1) * 2 S, where S = sum|terms| is the same backward run on |x|, |w|, |dy|. Overwriting
    // instead of accumulating is off by |dx1| itself, far above that.
    float *ax = xmalloc(nx * sizeof(float)), *aw = xmalloc(nw * sizeof(float)), *ady = xmalloc(ny * sizeof(float));
    for (size_t i = 0; i < nx; i++) ax[i] = fabsf(x[i]);
    for (size_t i = 0; i < nw; i++) aw[i] = fabsf(w[i]);
    for (size_t i = 0; i < ny; i++) ady[i] = fabsf(dy[i]);
    float *sx = fzeros(nx), *sw = fzeros(nw), *sb = fzeros(s.k);
    conv2d_backward(CPU, &s, ax, aw, ady, sx, sw, sb, work);
    for (size_t i = 0; i < nx; i++) sx[i] *= 2.0f;
    for (size_t i = 0; i < nw; i++) sw[i] *= 2.0f;
    for (int i = 0; i < s.k; i++) sb[i] *= 2.0f;
    const int k_max = s.n * s.h * s.w;  // stride 1, pad 1: P*Q = H*W; >= K*R*R = 36
    assert_within_rounding(dx2, dx1, sx, nx, 3 * k_max + 1);
    assert_within_rounding(dw2, dw1, sw, nw, 3 * k_max + 1);
    assert_within_rounding(db2, db1, sb, (size_t)s.k, 3 * k_max + 1);
    free(ax);
    free(aw);
    free(ady);
    free(sx);
    free(sw);
    free(sb);

    // Only dw wanted; then only dx; then only db: each equal to its part of the full call.
    float *dx3 = fzeros(nx), *dw3 = fzeros(nw), *db3 = fzeros(s.k);
    for (size_t i = 0; i < nx; i++) dx1[i] *= 0.5f;
    for (size_t i = 0; i < nw; i++) dw1[i] *= 0.5f;
    for (int i = 0; i < s.k; i++) db1[i] *= 0.5f;
    conv2d_backward(CPU, &s, x, w, dy, NULL, dw3, NULL, work);
    assert_close(dw3, dw1, nw, 1e-5, 1e-2);
    conv2d_backward(CPU, &s, x, w, dy, dx3, NULL, NULL, work);
    assert_close(dx3, dx1, nx, 1e-5, 1e-2);
    conv2d_backward(CPU, &s, x, w, dy, NULL, NULL, db3, work);
    assert_close(db3, db1, (size_t)s.k, 1e-5, 1e-2);
    conv2d_backward(CPU, &s, x, w, dy, NULL, NULL, NULL, work);  // nothing wanted: must not crash

    free(x), free(w), free(dy), free(work), free(dx1), free(dw1), free(db1), free(dx2), free(dw2), free(db2);
    free(dx3), free(dw3), free(db3);
}

// Forward overwrites: garbage in y before the call does not leak into the result; no bias = bias 0.
static void test_conv_overwrites_and_no_bias(void **state) {
    (void)state;
    Conv2dDims s = {.n = 2, .c = 2, .h = 4, .w = 4, .k = 3, .r = 3, .stride = 1, .pad = 1};
    const size_t nx = (size_t)s.n * s.c * 16, nw = (size_t)s.k * s.c * 9, ny = conv_y_size(&s);
    float *x = fvec(nx, -1, 1, 60), *w = fvec(nw, -1, 1, 61), *y = fvec(ny, 100, 200, 62);
    float *work = fzeros(conv2d_work_floats(CPU, &s));
    double *yr = xmalloc(ny * sizeof *yr), *xd = to_double(x, nx), *wd = to_double(w, nw);
    conv2d_forward(CPU, &s, x, w, NULL, y, work);
    conv_ref_forward(&s, xd, wd, NULL, yr);
    check_fwd("conv2d y (no bias)", y, yr, ny);
    free(x), free(w), free(y), free(work), free(yr), free(xd), free(wd);
}

// Fewer images than threads (batch-1 inference): the threads split each image's GEMM by output columns or output
// channels (im2col), or share out its 16 GEMMs and its transforms (Winograd). Right against float64; against one
// thread computing the whole image, Winograd's shares are the same calls on the same data (the same bits), while
// im2col's thread-sized GEMMs may take other OpenBLAS kernels (its small-matrix path below about 100^3
// multiply-adds, or another order over the products): each output is a sum of C*R*R products and the bias, so both
// sides lie within gamma_(C*R*R + 1) * sum|terms| of the exact value, and of each other within twice that.
static void test_conv_forward_thread_split(void **state) {
    (void)state;
    const Conv2dDims shapes[] = {
        {.n = 1, .c = 3, .h = 9, .w = 11, .k = 5, .r = 3, .stride = 1, .pad = 1},  // 99 columns: uneven blocks
        {.n = 1, .c = 6, .h = 8, .w = 8, .k = 4, .r = 1, .stride = 1, .pad = 0},   // 1x1: the image is its im2col
        {.n = 1, .c = 2, .h = 16, .w = 15, .k = 3, .r = 3, .stride = 2, .pad = 1},
        {.n = 1, .c = 16, .h = 9, .w = 8, .k = 24, .r = 3, .stride = 1, .pad = 1},  // Winograd: the 16 GEMMs shared
        {.n = 1, .c = 32, .h = 4, .w = 4, .k = 40, .r = 3, .stride = 1, .pad = 1},  // 40 channels > 16 columns: by rows
        {.n = 1, .c = 8, .h = 3, .w = 5, .k = 36, .r = 1, .stride = 1, .pad = 0},   // 1x1, by rows
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const Conv2dDims s = shapes[i];
        conv_case(s, 70 + i);  // forward and backward against float64 and finite differences
        const size_t nx = (size_t)s.c * s.h * s.w, nw = (size_t)s.k * s.c * s.r * s.r, ny = conv_y_size(&s);
        float *x = fvec(nx, -1, 1, 80 + i), *w = fvec(nw, -1, 1, 90 + i), *b = fvec(s.k, -1, 1, 100 + i);
        float *ax = xmalloc(nx * sizeof(float)), *aw = xmalloc(nw * sizeof(float)), *ab = xmalloc(s.k * sizeof(float));
        for (size_t j = 0; j < nx; j++) ax[j] = fabsf(x[j]);
        for (size_t j = 0; j < nw; j++) aw[j] = fabsf(w[j]);
        for (int j = 0; j < s.k; j++) ab[j] = fabsf(b[j]);
        float *work = fzeros(conv2d_work_floats(CPU, &s)), *split = fzeros(ny), *whole = fzeros(ny), *sum = fzeros(ny);
        conv2d_forward(CPU, &s, x, w, b, split, work);  // all threads: shared when there are 2+
        const int threads = omp_get_max_threads();
        omp_set_num_threads(1);
        conv2d_forward(CPU, &s, x, w, b, whole, work);  // one thread: the whole image in one GEMM
        setenv("KIT_WINOGRAD", "0", 1);  // sum|terms| of the direct sum (Winograd's own: test_conv_winograd_bound)
        conv2d_forward(CPU, &s, ax, aw, ab, sum, work);
        unsetenv("KIT_WINOGRAD");
        omp_set_num_threads(threads);
        if (winograd_forward_eligible(&s)) {
            if (memcmp(split, whole, ny * sizeof(float)) != 0)
                fail_msg("conv2d forward of one image (shape %zu): Winograd's sharing between threads changed the bits", i);
        } else {
            // Twice gamma_(CRR + 1) for the two sides, and once more for S itself, a float sum of as many terms.
            assert_within_rounding(split, whole, sum, ny, 3 * (s.c * s.r * s.r + 1));
        }
        free(x), free(w), free(b), free(ax), free(aw), free(ab), free(work), free(split), free(whole), free(sum);
    }
}

// Prepared filters (conv2d_prepare, what an inference model keeps). conv2d_forward_prepared takes gemm_small (filters
// packed once) where a GEMM has at most GEMM_SMALL_MAX_COLS columns, else conv2d_forward's own GEMMs. Against
// conv2d_forward: the same bits on the OpenBLAS route; on gemm_small's the same products summed in another order, so
// both sides lie within Winograd's bound gamma_(C+11) * S of the exact value (S: Winograd run on absolute values,
// kit/WINOGRAD.md), or for im2col within gamma_(C*R*R + 1) * sum|terms|, and within twice that of each other (three
// times for im2col, whose sum|terms| is itself a float sum). gemm_small's results do not depend on the thread count
// or on the other images of the batch (bit for bit). A layer with nothing to prepare takes the plain path; with
// KIT_WINOGRAD=0 the prepared Winograd filters are ignored and the result is im2col's.
static void test_conv_prepared_forward(void **state) {
    (void)state;
    const Conv2dDims shapes[] = {
        {.n = 3, .c = 16, .h = 9, .w = 8, .k = 24, .r = 3, .stride = 1, .pad = 1},   // Winograd, 20 tiles: gemm_small
        {.n = 3, .c = 16, .h = 18, .w = 18, .k = 20, .r = 3, .stride = 1, .pad = 1}, // Winograd, 81 tiles: OpenBLAS
        {.n = 5, .c = 32, .h = 4, .w = 4, .k = 40, .r = 3, .stride = 1, .pad = 1},   // im2col 4 x 4: gemm_small to 4 images
        {.n = 2, .c = 3, .h = 10, .w = 10, .k = 16, .r = 3, .stride = 1, .pad = 1},  // 100 positions: nothing prepared
    };
    const bool small_ok = gemm_small_available();
    if (!small_ok) print_message("gemm_small does not run on this CPU (no AVX2 + FMA): its cases are skipped\n");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const Conv2dDims s = shapes[i];
        const bool wino = winograd_forward_eligible(&s);
        const size_t nx = (size_t)s.n * s.c * s.h * s.w, nw = (size_t)s.k * s.c * 9, ny = conv_y_size(&s), img = ny / s.n;
        const size_t np = conv2d_prepared_floats(CPU, &s);
        assert_true((np > 0) == (wino || (small_ok && s.h * s.w <= GEMM_SMALL_MAX_COLS)));
        float *x = fvec(nx, -1, 1, 110 + i), *w = fvec(nw, -1, 1, 120 + i), *b = fvec(s.k, -1, 1, 130 + i);
        float *prepared = np ? fvec(np, -1, 1, 140 + i) : NULL, *work = fzeros(conv2d_work_floats(CPU, &s));
        float *plain = fzeros(ny), *fast = fzeros(ny), *first = fzeros(ny), *alone = fzeros(img);
        float *ax = xmalloc(nx * sizeof(float)), *aw = xmalloc(nw * sizeof(float)), *ab = xmalloc(s.k * sizeof(float));
        for (size_t j = 0; j < nx; j++) ax[j] = fabsf(x[j]);
        for (size_t j = 0; j < nw; j++) aw[j] = fabsf(w[j]);
        for (int j = 0; j < s.k; j++) ab[j] = fabsf(b[j]);
        double *bound = xmalloc(ny * sizeof(double));  // sum|terms| of each output, for the rounding bound
        if (wino) {
            wino_abs_sum(&s, x, w, b, bound);
        } else {
            float *sd = fzeros(ny);
            setenv("KIT_WINOGRAD", "0", 1);
            conv2d_forward(CPU, &s, ax, aw, ab, sd, work);
            unsetenv("KIT_WINOGRAD");
            for (size_t j = 0; j < ny; j++) bound[j] = sd[j];
            free(sd);
        }
        const int k_round = wino ? 2 * (s.c + 11) : 3 * (s.c * 9 + 1);
        if (np) conv2d_prepare(CPU, &s, w, prepared);
        const int threads = omp_get_max_threads();
        for (int t = 1; t <= threads; t += threads > 1 ? threads - 1 : 1) {
            omp_set_num_threads(t);
            for (int n = 1; n <= s.n; n++) {
                Conv2dDims d = s;
                d.n = n;
                const size_t cols = wino ? (size_t)n * ((s.h + 1) / 2) * ((s.w + 1) / 2) : (size_t)n * s.h * s.w;
                const bool small = np && small_ok && (wino ? ((s.h + 1) / 2) * ((s.w + 1) / 2) <= GEMM_SMALL_MAX_COLS
                                                           : cols <= GEMM_SMALL_MAX_COLS);
                conv2d_forward(CPU, &d, x, w, b, plain, work);
                memset(fast, 0xff, ny * sizeof(float));  // NaNs: what is not overwritten shows
                conv2d_forward_prepared(CPU, &d, x, w, prepared, b, fast, work);
                if (!small && memcmp(plain, fast, (size_t)n * img * sizeof(float)) != 0)
                    fail_msg("shape %zu, %d images, %d threads: the prepared forward's bits differ on OpenBLAS's route", i, n, t);
                assert_within_rounding(fast, plain, bound, (size_t)n * img, k_round);
                if (!small) continue;
                if (t == 1 && n == s.n) memcpy(first, fast, ny * sizeof(float));
                if (t == threads && n == s.n && memcmp(first, fast, ny * sizeof(float)) != 0)
                    fail_msg("shape %zu: gemm_small's results changed with the thread count", i);
                if (n == 1 && t == threads) memcpy(alone, fast, img * sizeof(float));
            }
            if (np && small_ok && t == threads) {  // the last image alone, against its place in the batch of s.n
                Conv2dDims d = s;
                d.n = 1;
                conv2d_forward_prepared(CPU, &d, x + (size_t)(s.n - 1) * (nx / s.n), w, prepared, b, alone, work);
                conv2d_forward_prepared(CPU, &s, x, w, prepared, b, fast, work);
                if (wino ? ((s.h + 1) / 2) * ((s.w + 1) / 2) * 2 <= GEMM_SMALL_MAX_COLS
                         : (size_t)s.n * s.h * s.w <= GEMM_SMALL_MAX_COLS)
                    assert_memory_equal(alone, fast + (size_t)(s.n - 1) * img, img * sizeof(float));
            }
        }
        omp_set_num_threads(threads);
        if (np && wino) {  // KIT_WINOGRAD=0: im2col, whatever was prepared
            setenv("KIT_WINOGRAD", "0", 1);
            conv2d_forward(CPU, &s, x, w, b, plain, work);
            conv2d_forward_prepared(CPU, &s, x, w, prepared, b, fast, work);
            unsetenv("KIT_WINOGRAD");
            assert_memory_equal(plain, fast, ny * sizeof(float));
        }
        free(x), free(w), free(b), free(prepared), free(work), free(plain), free(fast), free(first), free(alone);
        free(ax), free(aw), free(ab), free(bound);
    }
}

// gemm_small against a float64 product: odd row counts (a part panel), every column tail (6, 4, 1), with and without
// a bias, rows of x and y longer than n; each element within gamma_(k+1) * sum|terms|, and column j the same bits
// whether computed among n columns or alone.
static void test_gemm_small(void **state) {
    (void)state;
    if (!gemm_small_available()) {
        print_message("[  SKIP    ] gemm_small needs AVX2 + FMA, which this CPU lacks\n");
        skip();
    }
    const int m = 37, k = 75, ld = 20;
    float *a = fvec((size_t)m * k, -1, 1, 150), *x = fvec((size_t)k * ld, -1, 1, 151), *bias = fvec(m, -1, 1, 152);
    float *wp = fzeros(gemm_packed_floats(m, k)), *y = fzeros((size_t)m * ld), *y1 = fzeros((size_t)m * ld);
    gemm_pack(m, k, a, k, wp);
    for (int n = 1; n <= 17; n++) {
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            const float *bb = with_bias ? bias : NULL;
            gemm_small(m, n, k, wp, x, ld, bb, y, ld, 0, (m + GEMM_PANEL - 1) / GEMM_PANEL);
            for (int i = 0; i < m; i++) {
                for (int j = 0; j < n; j++) {
                    double exact = bb ? bb[i] : 0.0, terms = bb ? fabs(bb[i]) : 0.0;
                    for (int c = 0; c < k; c++) {
                        exact += (double)a[(size_t)i * k + c] * x[(size_t)c * ld + j];
                        terms += fabs((double)a[(size_t)i * k + c] * x[(size_t)c * ld + j]);
                    }
                    if (!(fabs(y[(size_t)i * ld + j] - exact) <= gamma_k(k + 1) * terms))
                        fail_msg("gemm_small n=%d: y[%d][%d] = %.9g, exact %.9g", n, i, j, y[(size_t)i * ld + j], exact);
                }
            }
            for (int j = 0; j < n; j++) {  // column j alone: x and y shifted to it
                gemm_small(m, 1, k, wp, x + j, ld, bb, y1 + j, ld, 0, (m + GEMM_PANEL - 1) / GEMM_PANEL);
                for (int i = 0; i < m; i++)
                    if (memcmp(&y1[(size_t)i * ld + j], &y[(size_t)i * ld + j], sizeof(float)) != 0)
                        fail_msg("gemm_small: column %d of %d gave other bits alone", j, n);
            }
        }
    }
    free(a), free(x), free(bias), free(wp), free(y), free(y1);
}

// The model sizes `work` once for its largest batch; a smaller last batch must fit in it.
static void test_conv_work_fits_smaller_batches(void **state) {
    (void)state;
    const Conv2dDims shapes[] = {
        {.n = 64, .c = 3, .h = 32, .w = 32, .k = 16, .r = 3, .stride = 1, .pad = 1},
        {.n = 64, .c = 32, .h = 4, .w = 4, .k = 64, .r = 3, .stride = 1, .pad = 1},
        {.n = 64, .c = 16, .h = 2, .w = 2, .k = 8, .r = 1, .stride = 1, .pad = 0},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const size_t full = conv2d_work_floats(CPU, &shapes[i]);
        for (int n = 1; n < shapes[i].n; n++) {
            Conv2dDims d = shapes[i];
            d.n = n;
            assert_true(conv2d_work_floats(CPU, &d) <= full);
        }
    }
}

// ---------------------------------------------------------------- batch norm

typedef struct {
    BatchNormDims s;
    double *x, *gamma, *beta, *r, *y;
} BnRef;

// Training-mode forward over the batch statistics; optionally returns mean and biased variance.
static void bn_ref_forward(const BatchNormDims *s, const double *x, const double *gamma, const double *beta,
                           double *y, double *mean_out, double *var_out) {
    const double m = (double)s->n * s->hw;
    for (int c = 0; c < s->c; c++) {
        double mean = 0.0, var = 0.0;
        for (int n = 0; n < s->n; n++)
            for (int i = 0; i < s->hw; i++) mean += x[((size_t)n * s->c + c) * s->hw + i];
        mean /= m;
        for (int n = 0; n < s->n; n++)
            for (int i = 0; i < s->hw; i++) {
                const double d = x[((size_t)n * s->c + c) * s->hw + i] - mean;
                var += d * d;
            }
        var /= m;
        for (int n = 0; n < s->n; n++)
            for (int i = 0; i < s->hw; i++) {
                const size_t at = ((size_t)n * s->c + c) * s->hw + i;
                y[at] = gamma[c] * (x[at] - mean) / sqrt(var + s->eps) + beta[c];
            }
        if (mean_out) mean_out[c] = mean;
        if (var_out) var_out[c] = var;
    }
}

static double bn_loss(void *ctx) {
    BnRef *b = ctx;
    bn_ref_forward(&b->s, b->x, b->gamma, b->beta, b->y, NULL, NULL);
    return dot_d(b->r, b->y, (size_t)b->s.n * b->s.c * b->s.hw);
}

typedef struct {
    float *x, *gamma, *beta, *dy, *y, *mean, *invstd, *rm, *rv, *dx, *dgamma, *dbeta, *work;
    size_t nx;
} BnBufs;

static BnBufs bn_bufs(const BatchNormDims *s, uint64_t seed) {
    BnBufs b;
    b.nx = (size_t)s->n * s->c * s->hw;
    b.x = fvec(b.nx, -2, 3, seed);  // mean ~0.5, not 0: a missing mean subtraction shows
    b.gamma = fvec(s->c, 0.5f, 1.5f, seed + 1);
    b.beta = fvec(s->c, -0.5f, 0.5f, seed + 2);
    b.dy = fvec(b.nx, -1, 1, seed + 3);
    b.y = fzeros(b.nx), b.dx = fzeros(b.nx);
    b.mean = fzeros(s->c), b.invstd = fzeros(s->c), b.dgamma = fzeros(s->c), b.dbeta = fzeros(s->c);
    b.rm = fvec(s->c, -0.2f, 0.2f, seed + 4);
    b.rv = fvec(s->c, 0.5f, 1.5f, seed + 5);
    b.work = fzeros(batchnorm_work_floats(CPU, s));
    return b;
}

static void bn_bufs_free(BnBufs *b) {
    free(b->x), free(b->gamma), free(b->beta), free(b->dy), free(b->y), free(b->mean), free(b->invstd);
    free(b->rm), free(b->rv), free(b->dx), free(b->dgamma), free(b->dbeta), free(b->work);
}

static void test_bn_train_gradients(void **state) {
    (void)state;
    const BatchNormDims s = {.n = 3, .c = 4, .hw = 10, .eps = 1e-5f, .momentum = 0.1f};
    BnBufs b = bn_bufs(&s, 100);
    BnRef ref = {s, to_double(b.x, b.nx), to_double(b.gamma, s.c), to_double(b.beta, s.c), to_double(b.dy, b.nx),
                 xmalloc(b.nx * sizeof(double))};
    double mean[4], var[4];
    batchnorm_forward_train(CPU, &s, b.x, b.gamma, b.beta, b.y, b.mean, b.invstd, b.rm, b.rv, NULL, b.work);
    bn_ref_forward(&s, ref.x, ref.gamma, ref.beta, ref.y, mean, var);
    check_fwd("bn y", b.y, ref.y, b.nx);
    double invstd[4];
    for (int c = 0; c < 4; c++) invstd[c] = 1.0 / sqrt(var[c] + s.eps);
    check_fwd("bn mean", b.mean, mean, 4);
    check_fwd("bn invstd", b.invstd, invstd, 4);

    batchnorm_backward(CPU, &s, b.x, b.gamma, b.mean, b.invstd, b.dy, b.dx, b.dgamma, b.dbeta, NULL, b.work);
    double *g = xmalloc(b.nx * sizeof *g);
    fd_grad(bn_loss, &ref, ref.x, b.nx, g);
    check_grad("bn dx", b.dx, g, b.nx);
    fd_grad(bn_loss, &ref, ref.gamma, s.c, g);
    check_grad("bn dgamma", b.dgamma, g, s.c);
    fd_grad(bn_loss, &ref, ref.beta, s.c, g);
    check_grad("bn dbeta", b.dbeta, g, s.c);

    // Accumulation: a second backward doubles all three; NULL dx still gives dgamma, dbeta.
    float dx1[120], dg1[4], db1[4];
    memcpy(dx1, b.dx, sizeof dx1), memcpy(dg1, b.dgamma, sizeof dg1), memcpy(db1, b.dbeta, sizeof db1);
    batchnorm_backward(CPU, &s, b.x, b.gamma, b.mean, b.invstd, b.dy, b.dx, b.dgamma, b.dbeta, NULL, b.work);
    for (size_t i = 0; i < b.nx; i++) dx1[i] *= 2.0f;
    for (int c = 0; c < 4; c++) dg1[c] *= 2.0f, db1[c] *= 2.0f;
    assert_close(b.dx, dx1, b.nx, 1e-5, 1e-2);
    assert_close(b.dgamma, dg1, 4, 1e-5, 1e-2);
    assert_close(b.dbeta, db1, 4, 1e-5, 1e-2);
    float dg2[4] = {0}, db2[4] = {0};
    batchnorm_backward(CPU, &s, b.x, b.gamma, b.mean, b.invstd, b.dy, NULL, dg2, db2, NULL, b.work);
    for (int c = 0; c < 4; c++) dg2[c] *= 2.0f, db2[c] *= 2.0f;
    assert_close(dg2, b.dgamma, 4, 1e-5, 1e-2);
    assert_close(db2, b.dbeta, 4, 1e-5, 1e-2);

    free(g), free(ref.x), free(ref.gamma), free(ref.beta), free(ref.r), free(ref.y);
    bn_bufs_free(&b);
}

// running = 0.9 * running + 0.1 * batch, with the UNBIASED batch variance (as PyTorch).
static void test_bn_running_stats(void **state) {
    (void)state;
    const BatchNormDims s = {.n = 2, .c = 3, .hw = 5, .eps = 1e-5f, .momentum = 0.1f};
    BnBufs b = bn_bufs(&s, 200);
    double rm0[3], rv0[3], mean[3], var[3];
    double *xd = to_double(b.x, b.nx), *gd = to_double(b.gamma, 3), *bd = to_double(b.beta, 3);
    double *yd = xmalloc(b.nx * sizeof *yd);
    for (int c = 0; c < 3; c++) rm0[c] = b.rm[c], rv0[c] = b.rv[c];
    bn_ref_forward(&s, xd, gd, bd, yd, mean, var);
    batchnorm_forward_train(CPU, &s, b.x, b.gamma, b.beta, b.y, b.mean, b.invstd, b.rm, b.rv, NULL, b.work);
    const double m = 10.0;
    double rm[3], rv[3];
    for (int c = 0; c < 3; c++) {
        rm[c] = 0.9 * rm0[c] + 0.1 * mean[c];
        rv[c] = 0.9 * rv0[c] + 0.1 * var[c] * m / (m - 1.0);
    }
    check_fwd("running_mean", b.rm, rm, 3);
    check_fwd("running_var", b.rv, rv, 3);
    free(xd), free(gd), free(bd), free(yd);
    bn_bufs_free(&b);
}

// Eval mode normalises with the running statistics, not the batch's.
static void test_bn_eval_uses_running_stats(void **state) {
    (void)state;
    const BatchNormDims s = {.n = 2, .c = 3, .hw = 4, .eps = 1e-5f, .momentum = 0.1f};
    BnBufs b = bn_bufs(&s, 300);
    double *yr = xmalloc(b.nx * sizeof *yr);
    for (int n = 0; n < 2; n++)
        for (int c = 0; c < 3; c++)
            for (int i = 0; i < 4; i++) {
                const size_t at = ((size_t)n * 3 + c) * 4 + i;
                yr[at] = b.gamma[c] * ((double)b.x[at] - b.rm[c]) / sqrt((double)b.rv[c] + s.eps) + b.beta[c];
            }
    float rm[3], rv[3];
    memcpy(rm, b.rm, sizeof rm), memcpy(rv, b.rv, sizeof rv);
    batchnorm_forward_eval(CPU, &s, b.x, b.gamma, b.beta, b.rm, b.rv, b.y);
    check_fwd("bn eval y", b.y, yr, b.nx);
    assert_memory_equal(rm, b.rm, sizeof rm);  // eval leaves the running statistics alone
    assert_memory_equal(rv, b.rv, sizeof rv);
    free(yr);
    bn_bufs_free(&b);
}

// A fake SyncBN hook: records what it was given, then doubles every entry, which is what an all-reduce
// over two ranks holding identical batches returns.
typedef struct {
    int calls;
    int counts[4];
    double seen[4][64];
} FakeSync;

static void fake_allreduce(double *buf, int count, void *ctx) {
    FakeSync *f = ctx;
    assert_true(f->calls < 4 && count <= 64);
    f->counts[f->calls] = count;
    memcpy(f->seen[f->calls], buf, (size_t)count * sizeof *buf);
    f->calls++;
    for (int i = 0; i < count; i++) buf[i] *= 2.0;
}

static void test_bn_sync_hook(void **state) {
    (void)state;
    const BatchNormDims s = {.n = 2, .c = 3, .hw = 5, .eps = 1e-5f, .momentum = 0.1f};
    BnBufs one = bn_bufs(&s, 400), two = bn_bufs(&s, 400);
    FakeSync fake = {0};
    const BatchNormSync sync = {fake_allreduce, &fake};
    double rv_init[3];
    for (int c = 0; c < 3; c++) rv_init[c] = one.rv[c];

    batchnorm_forward_train(CPU, &s, one.x, one.gamma, one.beta, one.y, one.mean, one.invstd, one.rm, one.rv,
                            NULL, one.work);
    batchnorm_forward_train(CPU, &s, two.x, two.gamma, two.beta, two.y, two.mean, two.invstd, two.rm, two.rv,
                            &sync, two.work);
    // Forward: one call with [sum x (C), sum x^2 (C), count].
    assert_int_equal(fake.calls, 1);
    assert_int_equal(fake.counts[0], 2 * 3 + 1);
    for (int c = 0; c < 3; c++) {
        double s1 = 0, s2 = 0;
        for (int n = 0; n < 2; n++)
            for (int i = 0; i < 5; i++) {
                const double v = one.x[((size_t)n * 3 + c) * 5 + i];
                s1 += v, s2 += v * v;
            }
        assert_true(fabs(fake.seen[0][c] - s1) <= 1e-9 * (1 + fabs(s1)));
        assert_true(fabs(fake.seen[0][3 + c] - s2) <= 1e-9 * (1 + fabs(s2)));
    }
    assert_true(fake.seen[0][6] == 10.0);
    // Two identical ranks normalise exactly like one...
    assert_close(two.y, one.y, one.nx, 1e-5, 1e-2);
    assert_close(two.rm, one.rm, 3, 1e-5, 1e-2);
    // ...but the running variance's unbiasing uses the global count (20, not 10).
    for (int c = 0; c < 3; c++) {
        const double var_b = 1.0 / ((double)one.invstd[c] * one.invstd[c]) - s.eps;  // biased batch variance
        const double global = 0.9 * rv_init[c] + 0.1 * var_b * 20.0 / 19.0;
        const double local = 0.9 * rv_init[c] + 0.1 * var_b * 10.0 / 9.0;
        assert_true(fabs(two.rv[c] - global) <= 1e-5 * global);
        assert_true(fabs(one.rv[c] - local) <= 1e-5 * local);
    }

    batchnorm_backward(CPU, &s, one.x, one.gamma, one.mean, one.invstd, one.dy, one.dx, one.dgamma, one.dbeta,
                       NULL, one.work);
    batchnorm_backward(CPU, &s, two.x, two.gamma, two.mean, two.invstd, two.dy, two.dx, two.dgamma, two.dbeta,
                       &sync, two.work);
    // Backward: one call with [sum dy (C), sum dy * xhat (C), count].
    assert_int_equal(fake.calls, 2);
    assert_int_equal(fake.counts[1], 2 * 3 + 1);
    for (int c = 0; c < 3; c++) {
        double s1 = 0, s2 = 0;
        for (int n = 0; n < 2; n++)
            for (int i = 0; i < 5; i++) {
                const size_t at = ((size_t)n * 3 + c) * 5 + i;
                s1 += one.dy[at];
                s2 += one.dy[at] * ((double)one.x[at] - one.mean[c]) * one.invstd[c];
            }
        assert_true(fabs(fake.seen[1][c] - s1) <= 1e-6 * (1 + fabs(s1)));
        assert_true(fabs(fake.seen[1][3 + c] - s2) <= 1e-6 * (1 + fabs(s2)));
    }
    assert_true(fake.seen[1][6] == 10.0);
    assert_close(two.dx, one.dx, one.nx, 1e-5, 1e-3);
    // Parameter gradients stay local (DDP averages them afterwards).
    assert_close(two.dgamma, one.dgamma, 3, 1e-5, 1e-2);
    assert_close(two.dbeta, one.dbeta, 3, 1e-5, 1e-2);
    bn_bufs_free(&one);
    bn_bufs_free(&two);
}

// Fused BN + ReLU (batchnorm_relu_*) against the plain path it replaces: batchnorm_forward_train then
// relu_forward; relu_backward into a zeroed buffer then batchnorm_backward. Both paths perform the same
// float operations in the same order (the fused op only skips storing the intermediate), so the results
// must be equal BIT FOR BIT, whatever the BLAS kernel: no tolerance to derive. Inputs include exact zeros
// of the ReLU (beta chosen so some outputs sit at 0) and -0.0f upstream gradients (the plain path turns
// them into +0.0f). Two sizes: below and above PAR_MIN (the OpenMP threshold), and with the sync hook,
// which the fused op must call exactly as the plain one does.
static void bn_relu_case(BatchNormDims s, bool with_sync, uint64_t seed) {
    BnBufs plain = bn_bufs(&s, seed), fused = bn_bufs(&s, seed);
    for (size_t i = 0; i < plain.nx; i += 7) plain.dy[i] = fused.dy[i] = -0.0f;
    for (size_t i = 3; i < plain.nx; i += 11) plain.x[i] = fused.x[i] = 0.5f;  // repeated values
    FakeSync fp = {0}, ff = {0};
    const BatchNormSync sp = {fake_allreduce, &fp}, sf = {fake_allreduce, &ff};
    batchnorm_forward_train(CPU, &s, plain.x, plain.gamma, plain.beta, plain.y, plain.mean, plain.invstd,
                            plain.rm, plain.rv, with_sync ? &sp : NULL, plain.work);
    relu_forward(CPU, plain.nx, plain.y, plain.y);  // in place, as the model runs it
    batchnorm_relu_forward_train(CPU, &s, fused.x, fused.gamma, fused.beta, fused.y, fused.mean, fused.invstd,
                                 fused.rm, fused.rv, with_sync ? &sf : NULL, fused.work);
    size_t zeros = 0;
    for (size_t i = 0; i < plain.nx; i++) zeros += plain.y[i] == 0.0f;
    assert_true(zeros > plain.nx / 10 && zeros < plain.nx * 9 / 10);  // the ReLU really cuts
    assert_memory_equal(fused.y, plain.y, plain.nx * sizeof(float));
    assert_memory_equal(fused.mean, plain.mean, s.c * sizeof(float));
    assert_memory_equal(fused.invstd, plain.invstd, s.c * sizeof(float));
    assert_memory_equal(fused.rm, plain.rm, s.c * sizeof(float));
    assert_memory_equal(fused.rv, plain.rv, s.c * sizeof(float));

    float *dbn = fzeros(plain.nx);  // the plain path's BN output gradient
    relu_backward(CPU, plain.nx, plain.y, plain.dy, dbn);
    fill_uniform(plain.dx, plain.nx, -1, 1, seed + 9);  // backward accumulates into dx: start from non-zero
    memcpy(fused.dx, plain.dx, plain.nx * sizeof(float));
    batchnorm_backward(CPU, &s, plain.x, plain.gamma, plain.mean, plain.invstd, dbn, plain.dx, plain.dgamma,
                       plain.dbeta, with_sync ? &sp : NULL, plain.work);
    batchnorm_relu_backward(CPU, &s, fused.x, fused.gamma, fused.mean, fused.invstd, fused.y, fused.dy, fused.dx,
                            fused.dgamma, fused.dbeta, with_sync ? &sf : NULL, fused.work);
    assert_memory_equal(fused.dx, plain.dx, plain.nx * sizeof(float));
    assert_memory_equal(fused.dgamma, plain.dgamma, s.c * sizeof(float));
    assert_memory_equal(fused.dbeta, plain.dbeta, s.c * sizeof(float));
    assert_int_equal(ff.calls, fp.calls);
    assert_int_equal(ff.calls, with_sync ? 2 : 0);
    for (int k = 0; k < fp.calls; k++) {
        assert_int_equal(ff.counts[k], fp.counts[k]);
        assert_memory_equal(ff.seen[k], fp.seen[k], (size_t)fp.counts[k] * sizeof(double));
    }
    // In place (dx == dy, as the model runs it): overwrites with what the plain path adds into zeros.
    float *dx0 = fzeros(plain.nx), *io = fzeros(plain.nx), dg[16] = {0}, db[16] = {0};
    memcpy(io, fused.dy, plain.nx * sizeof(float));
    batchnorm_backward(CPU, &s, plain.x, plain.gamma, plain.mean, plain.invstd, dbn, dx0, dg, db, NULL, plain.work);
    batchnorm_relu_backward(CPU, &s, fused.x, fused.gamma, fused.mean, fused.invstd, fused.y, io, io, dg, db, NULL,
                            fused.work);
    assert_memory_equal(io, dx0, plain.nx * sizeof(float));
    free(dx0), free(io);
    free(dbn);
    bn_bufs_free(&plain);
    bn_bufs_free(&fused);
}

static void test_bn_relu_fused_matches_plain(void **state) {
    (void)state;
    bn_relu_case((BatchNormDims){.n = 3, .c = 4, .hw = 10, .eps = 1e-5f, .momentum = 0.1f}, false, 700);
    bn_relu_case((BatchNormDims){.n = 3, .c = 4, .hw = 10, .eps = 1e-5f, .momentum = 0.1f}, true, 710);
    bn_relu_case((BatchNormDims){.n = 8, .c = 16, .hw = 300, .eps = 1e-5f, .momentum = 0.1f}, false, 720);
    bn_relu_case((BatchNormDims){.n = 8, .c = 16, .hw = 300, .eps = 1e-5f, .momentum = 0.1f}, true, 730);
}

// ---------------------------------------------------------------- relu, add, scale

typedef struct {
    size_t n;
    double *x, *r;
} VecRef;

static double relu_loss(void *ctx) {
    VecRef *v = ctx;
    double s = 0.0;
    for (size_t i = 0; i < v->n; i++) s += v->r[i] * (v->x[i] > 0 ? v->x[i] : 0.0);
    return s;
}

static void test_relu(void **state) {
    (void)state;
    enum { N = 200 };
    float *x = fvec(N, -1, 1, 500), *dy = fvec(N, -1, 1, 501), *y = fvec(N, 5, 6, 502), *dx = fzeros(N);
    for (int i = 0; i < N; i++)
        if (fabsf(x[i]) < 1e-3f) x[i] = 0.5f;  // keep finite differences off the kink
    relu_forward(CPU, N, x, y);
    for (int i = 0; i < N; i++) assert_true(y[i] == (x[i] > 0 ? x[i] : 0.0f));
    relu_backward(CPU, N, y, dy, dx);
    VecRef ref = {N, to_double(x, N), to_double(dy, N)};
    double g[N];
    fd_grad(relu_loss, &ref, ref.x, N, g);
    check_grad("relu dx", dx, g, N);
    relu_backward(CPU, N, y, dy, dx);
    for (int i = 0; i < N; i++) assert_true(dx[i] == 2.0f * (float)g[i] || fabs(dx[i] - 2 * g[i]) < 1e-6);
    free(x), free(dy), free(y), free(dx), free(ref.x), free(ref.r);
}

static void test_add(void **state) {
    (void)state;
    enum { N = 100000 };  // large enough for the parallel path
    float *a = fvec(N, -1, 1, 600), *b = fvec(N, -1, 1, 601), *y = fvec(N, 7, 8, 602);
    add_forward(CPU, N, a, b, y);
    for (int i = 0; i < N; i++) assert_true(y[i] == a[i] + b[i]);
    add_inplace(CPU, N, y, a);
    for (int i = 0; i < N; i++) assert_true(y[i] == (a[i] + b[i]) + a[i]);
    free(a), free(b), free(y);
}

// ---------------------------------------------------------------- pooling

typedef struct {
    int n, c, h, w;
    double *x, *r;
} PoolRef;

static double maxpool_loss(void *ctx) {
    PoolRef *p = ctx;
    const int ho = p->h / 2, wo = p->w / 2;
    double s = 0.0;
    for (int pl = 0; pl < p->n * p->c; pl++)
        for (int i = 0; i < ho; i++)
            for (int j = 0; j < wo; j++) {
                const double *x = p->x + (size_t)pl * p->h * p->w;
                double m = x[(2 * i) * p->w + 2 * j];
                for (int a = 0; a < 2; a++)
                    for (int b = 0; b < 2; b++) m = fmax(m, x[(2 * i + a) * p->w + 2 * j + b]);
                s += p->r[((size_t)pl * ho + i) * wo + j] * m;
            }
    return s;
}

static void maxpool_case(int n, int c, int h, int w, uint64_t seed) {
    const size_t nx = (size_t)n * c * h * w, ny = (size_t)n * c * (h / 2) * (w / 2);
    float *x = fvec(nx, -1, 1, seed), *dy = fvec(ny, -1, 1, seed + 1), *y = fzeros(ny), *dx = fzeros(nx);
    PoolRef ref = {n, c, h, w, to_double(x, nx), to_double(dy, ny)};
    maxpool2_forward(CPU, n, c, h, w, x, y);
    maxpool2_backward(CPU, n, c, h, w, x, y, dy, dx);
    double *g = xmalloc(nx * sizeof *g);
    fd_grad(maxpool_loss, &ref, ref.x, nx, g);
    check_grad("maxpool dx", dx, g, nx);
    // The forward value is the window maximum (exact: no arithmetic).
    for (size_t pl = 0; pl < (size_t)n * c; pl++)
        for (int i = 0; i < h / 2; i++)
            for (int j = 0; j < w / 2; j++) {
                const float *xp = x + pl * h * w;
                float m = xp[(2 * i) * w + 2 * j];
                for (int a = 0; a < 2; a++)
                    for (int b = 0; b < 2; b++) m = fmaxf(m, xp[(2 * i + a) * w + 2 * j + b]);
                assert_true(y[(pl * (h / 2) + i) * (w / 2) + j] == m);
            }
    // Odd sizes: the dropped last row / column gets no gradient.
    for (size_t pl = 0; pl < (size_t)n * c; pl++) {
        if (h % 2)
            for (int j = 0; j < w; j++) assert_true(dx[pl * h * w + (size_t)(h - 1) * w + j] == 0.0f);
        if (w % 2)
            for (int i = 0; i < h; i++) assert_true(dx[pl * h * w + (size_t)i * w + w - 1] == 0.0f);
    }
    free(x), free(dy), free(y), free(dx), free(g), free(ref.x), free(ref.r);
}

static void test_maxpool(void **state) {
    (void)state;
    maxpool_case(2, 3, 4, 6, 700);
    maxpool_case(2, 2, 5, 7, 710);  // odd height and width
}

// Ties: the first maximum in row-major window order takes the whole gradient. A NaN wins its window
// (it propagates, as in PyTorch) and takes the gradient.
static void test_maxpool_ties_and_nan(void **state) {
    (void)state;
    const float x[12] = {1, 3, 3, 0, 5, NAN,   // window 0: 1 3 / 2 3 -> first 3 at (0,1)
                         2, 3, 3, 3, 7, 9};    // window 1: 3 0 / 3 3 -> first 3 at (0,0); window 2: NaN
    float y[3], dx[12] = {0};
    const float dy[3] = {1.5f, -2.0f, 4.0f};
    maxpool2_forward(CPU, 1, 1, 2, 6, x, y);
    assert_true(y[0] == 3.0f && y[1] == 3.0f && isnan(y[2]));
    maxpool2_backward(CPU, 1, 1, 2, 6, x, y, dy, dx);
    const float expect[12] = {0, 1.5f, -2.0f, 0, 0, 4.0f, 0, 0, 0, 0, 0, 0};
    assert_memory_equal(dx, expect, sizeof dx);
}

static double avgpool_loss(void *ctx) {
    PoolRef *p = ctx;  // h = hw, w unused
    double s = 0.0;
    for (int pl = 0; pl < p->n * p->c; pl++) {
        double m = 0.0;
        for (int i = 0; i < p->h; i++) m += p->x[(size_t)pl * p->h + i];
        s += p->r[pl] * m / p->h;
    }
    return s;
}

static void test_avgpool(void **state) {
    (void)state;
    const int n = 3, c = 4, hw = 9;
    const size_t nx = (size_t)n * c * hw;
    float *x = fvec(nx, -1, 1, 800), *dy = fvec(n * c, -1, 1, 801), *y = fzeros(n * c), *dx = fzeros(nx);
    PoolRef ref = {n, c, hw, 1, to_double(x, nx), to_double(dy, n * c)};
    avgpool_forward(CPU, n, c, hw, x, y);
    double yr[12];
    for (int pl = 0; pl < n * c; pl++) {
        yr[pl] = 0;
        for (int i = 0; i < hw; i++) yr[pl] += ref.x[pl * hw + i] / hw;
    }
    check_fwd("avgpool y", y, yr, 12);
    avgpool_backward(CPU, n, c, hw, dy, dx);
    double *g = xmalloc(nx * sizeof *g);
    fd_grad(avgpool_loss, &ref, ref.x, nx, g);
    check_grad("avgpool dx", dx, g, nx);
    free(x), free(dy), free(y), free(dx), free(g), free(ref.x), free(ref.r);
}

// ---------------------------------------------------------------- linear

typedef struct {
    int n, in, out;
    double *x, *w, *b, *r;
} LinRef;

static double linear_loss(void *ctx) {
    LinRef *l = ctx;
    double s = 0.0;
    for (int i = 0; i < l->n; i++)
        for (int o = 0; o < l->out; o++) {
            double y = l->b[o];
            for (int j = 0; j < l->in; j++) y += l->x[i * l->in + j] * l->w[o * l->in + j];
            s += l->r[i * l->out + o] * y;
        }
    return s;
}

static void test_linear(void **state) {
    (void)state;
    const int n = 4, in = 7, out = 5;
    float *x = fvec(n * in, -1, 1, 900), *w = fvec(out * in, -1, 1, 901), *b = fvec(out, -1, 1, 902);
    float *dy = fvec(n * out, -1, 1, 903), *y = fvec(n * out, 50, 60, 904);
    float *dx = fzeros(n * in), *dw = fzeros(out * in), *db = fzeros(out);
    LinRef ref = {n, in, out, to_double(x, n * in), to_double(w, out * in), to_double(b, out),
                  to_double(dy, n * out)};
    linear_forward(CPU, n, in, out, x, w, b, y);
    double yr[20];
    for (int i = 0; i < n; i++)
        for (int o = 0; o < out; o++) {
            yr[i * out + o] = ref.b[o];
            for (int j = 0; j < in; j++) yr[i * out + o] += ref.x[i * in + j] * ref.w[o * in + j];
        }
    check_fwd("linear y", y, yr, 20);
    linear_backward(CPU, n, in, out, x, w, dy, dx, dw, db);
    double g[35];
    fd_grad(linear_loss, &ref, ref.x, n * in, g);
    check_grad("linear dx", dx, g, n * in);
    fd_grad(linear_loss, &ref, ref.w, out * in, g);
    check_grad("linear dw", dw, g, out * in);
    fd_grad(linear_loss, &ref, ref.b, out, g);
    check_grad("linear db", db, g, out);
    // Accumulates, and NULL gradients are skipped.
    float dw2[35];
    memcpy(dw2, dw, sizeof dw2);
    linear_backward(CPU, n, in, out, x, w, dy, NULL, dw, NULL);
    for (int i = 0; i < 35; i++) dw2[i] *= 2.0f;
    // The GEMM adds onto dw inside its sum of n = 4 products: a sum of 2n + 1 terms against 2 x a sum of n,
    // both within gamma_(2n+1) of the exact 2 x sum|terms| (from the same backward on |x|, |dy|).
    float *ax = xmalloc((size_t)n * in * sizeof(float)), *ady = xmalloc((size_t)n * out * sizeof(float));
    float *sw = fzeros(out * in);
    for (int i = 0; i < n * in; i++) ax[i] = fabsf(x[i]);
    for (int i = 0; i < n * out; i++) ady[i] = fabsf(dy[i]);
    linear_backward(CPU, n, in, out, ax, w, ady, NULL, sw, NULL);
    for (int i = 0; i < 35; i++) sw[i] *= 2.0f;
    assert_within_rounding(dw, dw2, sw, 35, 2 * (2 * n + 1));
    free(ax), free(ady), free(sw);
    free(x), free(w), free(b), free(dy), free(y), free(dx), free(dw), free(db);
    free(ref.x), free(ref.w), free(ref.b), free(ref.r);
}

// ---------------------------------------------------------------- cross-entropy

typedef struct {
    int n, k;
    double *l;
    const int *labels;
    double s, scale;
} CeRef;

// Per-sample loss with the smoothed target, straight from the definition -sum_j t_j log softmax_j.
static double ce_ref_sample(const double *l, int k, int label, double s) {
    double m = l[0], z = 0.0, loss = 0.0;
    for (int j = 1; j < k; j++) m = fmax(m, l[j]);
    for (int j = 0; j < k; j++) z += exp(l[j] - m);
    for (int j = 0; j < k; j++) {
        const double t = s / k + (j == label ? 1.0 - s : 0.0);
        loss -= t * (l[j] - m - log(z));
    }
    return loss;
}

static double ce_loss(void *ctx) {
    CeRef *c = ctx;
    double s = 0.0;
    for (int i = 0; i < c->n; i++) s += c->scale * ce_ref_sample(c->l + i * c->k, c->k, c->labels[i], c->s);
    return s;
}

static void ce_case(float smoothing, float shift) {
    const int n = 5, k = 7;
    const int labels[5] = {0, 6, 3, 3, 1};
    float *l = fvec(n * k, -3, 3, 1000), loss[5], *dl = fzeros(n * k);
    for (int i = 0; i < n * k; i++) l[i] += shift;  // large logits: exp would overflow without the max
    CeRef ref = {n, k, to_double(l, n * k), labels, smoothing, 1.0 / n};
    cross_entropy_forward(CPU, n, k, l, labels, smoothing, loss);
    double lr[5];
    for (int i = 0; i < n; i++) lr[i] = ce_ref_sample(ref.l + i * k, k, labels[i], smoothing);
    check_fwd("cross-entropy loss", loss, lr, 5);
    cross_entropy_backward(CPU, n, k, l, labels, smoothing, 1.0f / n, dl);
    double g[35];
    fd_grad(ce_loss, &ref, ref.l, n * k, g);
    check_grad("cross-entropy dlogits", dl, g, n * k);
    free(l), free(dl), free(ref.l);
}

static void test_cross_entropy(void **state) {
    (void)state;
    ce_case(0.0f, 0.0f);
    ce_case(0.1f, 0.0f);
    ce_case(0.25f, 200.0f);
}

// Label smoothing by hand: two classes, equal logits: loss = log 2 whatever s is; with logits (0, log 3)
// softmax = (1/4, 3/4) and label 1, s = 0.2: target = (0.1, 0.9), loss = -(0.1 log 1/4 + 0.9 log 3/4).
static void test_label_smoothing_by_hand(void **state) {
    (void)state;
    const float eq[2] = {0.7f, 0.7f}, l[2] = {0.0f, (float)log(3.0)};
    const int label = 1;
    float loss, g[2] = {0, 0};
    // A handful of float exp / log / add roundings of numbers below 2: a few u x 2 < 1e-6 (u = 6e-8); a wrong
    // smoothing weight moves these by 1e-2 or more.
    cross_entropy_forward(CPU, 1, 2, eq, &label, 0.2f, &loss);
    assert_true(fabs(loss - log(2.0)) < 1e-6);
    cross_entropy_forward(CPU, 1, 2, l, &label, 0.2f, &loss);
    const double expect = -(0.1 * log(0.25) + 0.9 * log(0.75));
    assert_true(fabs(loss - expect) < 1e-6);
    cross_entropy_backward(CPU, 1, 2, l, &label, 0.2f, 1.0f, g);  // softmax - target
    assert_true(fabs(g[0] - (0.25 - 0.1)) < 1e-6 && fabs(g[1] - (0.75 - 0.9)) < 1e-6);
}

static void test_argmax_rows(void **state) {
    (void)state;
    const float l[12] = {1, 5, 5, 2, /**/ -1, -3, -1, -2, /**/ 0, 0, 0, 9};
    int pred[3];
    argmax_rows(CPU, 3, 4, l, pred);
    assert_int_equal(pred[0], 1);  // tie between 1 and 2: the first
    assert_int_equal(pred[1], 0);
    assert_int_equal(pred[2], 3);
}

// ---------------------------------------------------------------- SGD

// Three steps of the PyTorch formula in double, against the op, for every flag combination.
static void test_sgd_update(void **state) {
    (void)state;
    enum { N = 50 };
    for (int nesterov = 0; nesterov < 2; nesterov++) {
        for (int wd_on = 0; wd_on < 2; wd_on++) {
            const float lr = 0.05f, mom = 0.9f, wd = wd_on ? 5e-3f : 0.0f;
            float *p = fvec(N, -1, 1, 1100), *v = fzeros(N);
            double pd[N], vd[N] = {0};
            for (int i = 0; i < N; i++) pd[i] = p[i];
            for (int step = 0; step < 3; step++) {
                float *g = fvec(N, -1, 1, 1200 + step);
                sgd_update(CPU, N, p, g, v, lr, mom, wd, nesterov);
                for (int i = 0; i < N; i++) {
                    const double gg = g[i] + (double)wd * pd[i];
                    vd[i] = mom * vd[i] + gg;
                    pd[i] -= lr * (nesterov ? gg + mom * vd[i] : vd[i]);
                }
                free(g);
            }
            check_close_d("sgd params", p, pd, N, 1e-5, 1e-2);
            check_close_d("sgd velocity", v, vd, N, 1e-5, 1e-2);
            free(p), free(v);
        }
    }
    // No momentum: a plain step, no velocity buffer needed.
    float p[3] = {1, 2, 3}, g[3] = {1, -1, 0.5f};
    sgd_update(CPU, 3, p, g, NULL, 0.1f, 0.0f, 0.0f, 0);
    assert_true(p[0] == 1.0f - 0.1f * 1.0f && p[1] == 2.0f + 0.1f && p[2] == 3.0f - 0.1f * 0.5f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv_3x3_pad1),
        cmocka_unit_test(test_conv_stride2),
        cmocka_unit_test(test_conv_1x1),
        cmocka_unit_test(test_conv_grouped_images),
        cmocka_unit_test(test_conv_winograd_bound),
        cmocka_unit_test(test_conv_winograd_grads),
        cmocka_unit_test(test_conv_accumulate_and_null),
        cmocka_unit_test(test_conv_overwrites_and_no_bias),
        cmocka_unit_test(test_conv_work_fits_smaller_batches),
        cmocka_unit_test(test_conv_forward_thread_split),
        cmocka_unit_test(test_conv_prepared_forward),
        cmocka_unit_test(test_gemm_small),
        cmocka_unit_test(test_bn_train_gradients),
        cmocka_unit_test(test_bn_running_stats),
        cmocka_unit_test(test_bn_eval_uses_running_stats),
        cmocka_unit_test(test_bn_sync_hook),
        cmocka_unit_test(test_bn_relu_fused_matches_plain),
        cmocka_unit_test(test_relu),
        cmocka_unit_test(test_add),
        cmocka_unit_test(test_maxpool),
        cmocka_unit_test(test_maxpool_ties_and_nan),
        cmocka_unit_test(test_avgpool),
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_cross_entropy),
        cmocka_unit_test(test_label_smoothing_by_hand),
        cmocka_unit_test(test_argmax_rows),
        cmocka_unit_test(test_sgd_update),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
