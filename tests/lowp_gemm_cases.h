// tests/lowp_gemm_cases.h: the real low-precision GEMMs of conv and linear (device_set_gemm_precision: bf16, fp16,
// TF32) against lesson 10's emulation (round_lowp, then float32), on a device: the GPU (tests/test_cuda.c) or the
// CPU's oneDNN bf16 path (tests/test_cpu_bf16.c). Header-only, for those two tests; include it after testutil.h.
#ifndef LOWP_GEMM_CASES_H
#define LOWP_GEMM_CASES_H

#include "kit/model.h"
#include "kit/ops.h"
#include "tests/testutil.h"
#ifdef KIT_CUDA
#include "kit/cuda/cuda_context.h"
#endif

// A copy of the host array h on dev (NULL stays NULL); the device array d back on the host (the caller frees).
static inline float *lowp_to(Device dev, const float *h, size_t n) {
    if (!h) return NULL;
    float *d = device_alloc(dev, n * sizeof(float));
    device_copy_to(dev, d, h, n * sizeof(float));
    return d;
}

static inline float *lowp_from(Device dev, const float *d, size_t n) {
    float *h = xmalloc((n ? n : 1) * sizeof(float));
    device_copy_from(dev, h, d, n * sizeof(float));
    return h;
}

// On a GPU, lowers the conv scratch budget so that exactly `chunk` images of s fit (the multi-chunk path); chunk 0
// restores the default. The CPU plans its own groups.
static inline void lowp_set_chunk(Device dev, const Conv2dDims *s, int chunk) {
#ifdef KIT_CUDA
    if (dev != DEVICE_CUDA) return;
    size_t pq = (size_t)conv2d_out_h(s) * conv2d_out_w(s);
    cuda_conv_set_work_budget(chunk ? (size_t)chunk * pq * ((size_t)s->c * s->r * s->r + s->k) : 0);
#else
    (void)dev, (void)s, (void)chunk;
#endif
}
//
// What is compared. The REAL path: device_set_gemm_precision(dev, bf16 or fp16); conv and linear get float32
// x, w, dy and store each as a 16-bit GEMM input themselves (round to nearest even), then cublasGemmEx with
// 16-bit A and B, float32 accumulation and a float32 C (on the CPU: oneDNN's bf16 matmul, kit/cpu_bf16.h). The EMULATED path (lesson 10's, kit/ops.h round_lowp):
// x, w and dy rounded to the format by round_lowp, then the float32 op (cublasSgemm). Both round the same
// tensors at the same point (the GEMM's inputs, once, with the same rounding: kit/ops_dims.h's functions), so
// each GEMM multiplies the same pairs of numbers a_i, b_i. 16-bit values have at most 11 significant bits, so
// a_i b_i (22 bits) is EXACT in float32 in both paths. What remains is the summation of k exact products in
// float32, in an order that differs between cuBLAS's tensor-core kernels and its SGEMM (and OpenBLAS in the
// emulator), or between oneDNN's kernels and OpenBLAS's on the CPU. Each addition errs by at most one unit u of its result, u = 2^-23 (2^-24 for round-to-nearest;
// 2^-23 covers tensor cores, whose adders truncate when they align: Fasi, Higham, Mikaitis, Pranesh,
// "Numerical behavior of NVIDIA tensor cores", PeerJ CS 2021; the CPU's AVX512-BF16 and AMX dot products round
// each addition to nearest, and flush subnormals, which inputs of size 1 never meet). A sum of k terms then errs by at most
// gamma_k = k u / (1 - k u) times S = sum |a_i b_i| (Higham, Accuracy and Stability, 3.1), whatever the order,
// so the two paths differ by at most 2 gamma_k S. The accumulation into an existing C (beta = 1: dx and dw add
// into what is there) and the bias add are further additions: k + 1 terms, with |c0| joining S. Hence, per
// element: |real - emulated| <= 2 gamma_(k+1) (S + |c0|), with k the GEMM's inner size (plus the R*R dcols that
// col2im adds into one dx element). S is the same op on |inputs| (the CPU's float32 computes it; its own error
// changes the bound by a few parts in 10^7).
// Why it can fail: without the conversion (fp32 inputs), a product differs by up to 2^-8 (bf16) / 2^-11 (fp16)
// relative from the rounded one; the test checks that this plain float32 result lies OUTSIDE the bound, so
// the bound would catch a real path that forgot to round (or rounded another way, e.g. truncated).

#define U_ACC (1.0 / 8388608.0)  // 2^-23, see above

static inline double gamma_acc(double k) { return k * U_ACC / (1.0 - k * U_ACC); }

// x as the GEMM precision p reads it: bf16/fp16 rounded by round_lowp (the emulated path), TF32 truncated to 10
// mantissa bits (what the emulator's tensor cores read: kit/cuda/emu/cuda_emu.cc, emu_tf32).
static inline float *copy_rounded(const float *x, size_t n, GemmPrecision p) {
    if (!x) return NULL;
    float *r = xmalloc(n * sizeof(float));
    memcpy(r, x, n * sizeof(float));
    if (p == GEMM_BF16 || p == GEMM_FP16) round_lowp(DEVICE_CPU, p == GEMM_BF16 ? LOWP_BF16 : LOWP_FP16, n, r, NULL);
    if (p == GEMM_TF32)
        for (size_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, &r[i], sizeof u);
            u &= 0xFFFFE000u;  // finite inputs only here
            memcpy(&r[i], &u, sizeof u);
        }
    return r;
}

// TF32 on a GPU: cuBLAS's kernels may round float32 to TF32 (PTX cvt.rna: nearest, ties away) where the emulator
// truncates; either input is then within one TF32 unit (2^-10 relative) of the truncated one, so a product differs
// by at most (2 x 2^-10 + 2^-20) |a b|: that much of S joins the bound. The emulator truncates, as the emulated
// path does: nothing to add. bf16/fp16: the same rounding on both sides everywhere.
static inline double input_slack(Device dev, GemmPrecision p) {
#ifdef KIT_CUDA_EMU
    return 0.0;
#else
    return dev == DEVICE_CUDA && p == GEMM_TF32 ? ldexp(1.0, -9) + ldexp(1.0, -20) : 0.0;
#endif
}

// How many elements of got (host) lie outside 2 gamma_(k+1) (S + |c0|) of want (host); c0 may be NULL.
static inline size_t outside_sum_bound(const float *got, const float *want, const float *S, const float *c0, size_t n,
                                double k, double slack, double *worst) {
    size_t bad = 0;
    *worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double bound = 2.0 * gamma_acc(k + 1) * ((double)S[i] + (c0 ? fabs((double)c0[i]) : 0.0)) + slack * S[i];
        double d = fabs((double)got[i] - (double)want[i]);
        if (d > bound) bad++;
        if (bound > 0 && d / bound > *worst) *worst = d / bound;
    }
    return bad;
}

// Asserts real and emulated within the bound. Adds to g_plain_outside how many elements of the plain float32 result (no
// rounding) lie outside it: the test asserts some do (a large inner size k or accumulator c0 can hide the
// rounding in one tensor, not in all).
static size_t g_plain_outside __attribute__((unused));
static inline void check_sum_bound(Device dev, const char *what, const float *g_real, const float *g_emul, const float *g_plain,
                            const float *S, const float *c0, size_t n, double k, double slack) {
    float *real = lowp_from(dev, g_real, n), *emul = lowp_from(dev, g_emul, n), *plain = lowp_from(dev, g_plain, n);
    double worst, worst_plain;
    size_t bad = outside_sum_bound(real, emul, S, c0, n, k, slack, &worst);
    // The real path against float32 inputs, with the summation bound alone: outside it, the inputs WERE read
    // in the low precision.
    size_t plain_out = outside_sum_bound(plain, real, S, c0, n, k, 0.0, &worst_plain);
    print_message("  %-6s k=%-5.0f real vs emulated: %.3g of the bound; real vs float32: %.3g (%zu of %zu outside)\n",
                  what, k, worst, worst_plain, plain_out, n);
    if (bad) {
        print_error("%s: %zu of %zu elements of the real path differ from the emulated one by more than the bound\n",
                    what, bad, n);
        fail();
    }
    g_plain_outside += plain_out;
    free(real), free(emul), free(plain);
}

// One conv shape in GEMM precision p (bf16/fp16): forward y, backward dx, dw (added into random values) and db.
// Three runs on dev: real (p, float32 inputs), emulated (fp32 GEMMs, inputs rounded by round_lowp), plain
// (fp32, float32 inputs).
static inline void conv_lowp_case(Device dev, GemmPrecision p, Conv2dDims s, int chunk, uint64_t seed) {
    const GemmPrecision f = p;
    const double slack = input_slack(dev, p);
    size_t nx = (size_t)s.n * s.c * s.h * s.w, nw = (size_t)s.k * s.c * s.r * s.r;
    size_t ny = (size_t)s.n * s.k * conv2d_out_h(&s) * conv2d_out_w(&s), pq = ny / ((size_t)s.n * s.k);
    float *in[4] = {uniform_vec(nx, -1, 1, seed), uniform_vec(nw, -1, 1, seed + 1), uniform_vec(ny, -1, 1, seed + 2),
                    uniform_vec(s.k, -1, 1, seed + 3)};  // x, w, dy, b
    float *dx0 = uniform_vec(nx, -1, 1, seed + 4), *dw0 = uniform_vec(nw, -1, 1, seed + 5), *db0 = uniform_vec(s.k, -1, 1, seed + 6);
    size_t sizes[4] = {nx, nw, ny, (size_t)s.k};
    lowp_set_chunk(dev, &s, chunk);
    float *out[3][4];  // [real, emulated, plain][y, dx, dw, db] on dev
    for (int run = 0; run < 3; run++) {
        float *g[4];
        for (int i = 0; i < 4; i++) {
            float *h = run == 1 && i < 3 ? copy_rounded(in[i], sizes[i], f) : in[i];  // the bias is not rounded
            g[i] = lowp_to(dev, h, sizes[i]);
            if (h != in[i]) free(h);
        }
        out[run][0] = device_alloc(dev, ny * sizeof(float));
        out[run][1] = lowp_to(dev, dx0, nx), out[run][2] = lowp_to(dev, dw0, nw), out[run][3] = lowp_to(dev, db0, s.k);
        float *work = device_alloc(dev, conv2d_work_floats(dev, &s) * sizeof(float));
        device_set_gemm_precision(dev, run == 0 ? p : GEMM_FP32);
        conv2d_forward(dev, &s, g[0], g[1], g[3], out[run][0], work);
        conv2d_backward(dev, &s, g[0], g[1], g[2], out[run][1], out[run][2], out[run][3], work);
        device_set_gemm_precision(dev, GEMM_FP32);
        for (int i = 0; i < 4; i++) device_free(dev, g[i]);
        device_free(dev, work);
    }
    lowp_set_chunk(dev, &s, 0);
    // S for each GEMM: the op on the absolute values of the rounded inputs (CPU, float32).
    float *ax = copy_rounded(in[0], nx, f), *aw = copy_rounded(in[1], nw, f), *ady = copy_rounded(in[2], ny, f);
    for (size_t i = 0; i < nx; i++) ax[i] = fabsf(ax[i]);
    for (size_t i = 0; i < nw; i++) aw[i] = fabsf(aw[i]);
    for (size_t i = 0; i < ny; i++) ady[i] = fabsf(ady[i]);
    float *Sy = xmalloc(ny * sizeof(float)), *Sdx = xcalloc(nx, sizeof(float)), *Sdw = xcalloc(nw, sizeof(float));
    float *work = xmalloc(conv2d_work_floats(DEVICE_CPU, &s) * sizeof(float));
    conv2d_forward(DEVICE_CPU, &s, ax, aw, NULL, Sy, work);
    conv2d_backward(DEVICE_CPU, &s, ax, aw, ady, Sdx, Sdw, NULL, work);
    float *bias_y = xmalloc(ny * sizeof(float));  // the bias each output element adds: c0 of the forward
    for (size_t i = 0; i < ny; i++) bias_y[i] = in[3][(i / pq) % (size_t)s.k];
    const double crr = (double)s.c * s.r * s.r;
    check_sum_bound(dev, "y", out[0][0], out[1][0], out[2][0], Sy, bias_y, ny, crr, slack);
    check_sum_bound(dev, "dx", out[0][1], out[1][1], out[2][1], Sdx, dx0, nx, (double)s.k + (double)s.r * s.r, slack);
    check_sum_bound(dev, "dw", out[0][2], out[1][2], out[2][2], Sdw, dw0, nw, (double)s.n * pq + s.n, slack);
    // db is no GEMM: the real path sums the float32 dy it was given, as the plain run does: the same bits.
    float *db_plain = lowp_from(dev, out[2][3], s.k);
    float *db_real = lowp_from(dev, out[0][3], s.k);
    assert_memory_equal(db_real, db_plain, (size_t)s.k * sizeof(float));
    free(db_plain), free(db_real);
    for (int run = 0; run < 3; run++)
        for (int i = 0; i < 4; i++) device_free(dev, out[run][i]);
    for (int i = 0; i < 4; i++) free(in[i]);
    float *hp[] = {dx0, dw0, db0, ax, aw, ady, Sy, Sdx, Sdw, work, bias_y};
    for (size_t i = 0; i < sizeof hp / sizeof hp[0]; i++) free(hp[i]);
}

// Linear in precision p: y = x w^T + b, dx += dy w, dw += dy^T x; runs as conv_lowp_case.
static inline void linear_lowp_case(Device dev, GemmPrecision p, int n, int in_f, int out_f, uint64_t seed) {
    const GemmPrecision f = p;
    size_t nx = (size_t)n * in_f, nw = (size_t)out_f * in_f, ny = (size_t)n * out_f;
    float *in[4] = {uniform_vec(nx, -1, 1, seed), uniform_vec(nw, -1, 1, seed + 1), uniform_vec(ny, -1, 1, seed + 2),
                    uniform_vec(out_f, -1, 1, seed + 3)};
    float *dx0 = uniform_vec(nx, -1, 1, seed + 4), *dw0 = uniform_vec(nw, -1, 1, seed + 5);
    size_t sizes[4] = {nx, nw, ny, (size_t)out_f};
    float *out[3][3];
    for (int run = 0; run < 3; run++) {
        float *g[4];
        for (int i = 0; i < 4; i++) {
            float *h = run == 1 && i < 3 ? copy_rounded(in[i], sizes[i], f) : in[i];
            g[i] = lowp_to(dev, h, sizes[i]);
            if (h != in[i]) free(h);
        }
        out[run][0] = device_alloc(dev, ny * sizeof(float));
        out[run][1] = lowp_to(dev, dx0, nx), out[run][2] = lowp_to(dev, dw0, nw);
        device_set_gemm_precision(dev, run == 0 ? p : GEMM_FP32);
        linear_forward(dev, n, in_f, out_f, g[0], g[1], g[3], out[run][0]);
        linear_backward(dev, n, in_f, out_f, g[0], g[1], g[2], out[run][1], out[run][2], NULL);
        device_set_gemm_precision(dev, GEMM_FP32);
        for (int i = 0; i < 4; i++) device_free(dev, g[i]);
    }
    float *ax = copy_rounded(in[0], nx, f), *aw = copy_rounded(in[1], nw, f), *ady = copy_rounded(in[2], ny, f);
    for (size_t i = 0; i < nx; i++) ax[i] = fabsf(ax[i]);
    for (size_t i = 0; i < nw; i++) aw[i] = fabsf(aw[i]);
    for (size_t i = 0; i < ny; i++) ady[i] = fabsf(ady[i]);
    float *Sy = xmalloc(ny * sizeof(float)), *Sdx = xcalloc(nx, sizeof(float)), *Sdw = xcalloc(nw, sizeof(float));
    linear_forward(DEVICE_CPU, n, in_f, out_f, ax, aw, NULL, Sy);
    linear_backward(DEVICE_CPU, n, in_f, out_f, ax, aw, ady, Sdx, Sdw, NULL);
    float *bias_y = xmalloc(ny * sizeof(float));
    for (size_t i = 0; i < ny; i++) bias_y[i] = in[3][i % (size_t)out_f];
    check_sum_bound(dev, "y", out[0][0], out[1][0], out[2][0], Sy, bias_y, ny, in_f, 0.0);
    check_sum_bound(dev, "dx", out[0][1], out[1][1], out[2][1], Sdx, dx0, nx, out_f, 0.0);
    check_sum_bound(dev, "dw", out[0][2], out[1][2], out[2][2], Sdw, dw0, nw, n, 0.0);
    for (int run = 0; run < 3; run++)
        for (int i = 0; i < 3; i++) device_free(dev, out[run][i]);
    for (int i = 0; i < 4; i++) free(in[i]);
    float *hp[] = {dx0, dw0, ax, aw, ady, Sy, Sdx, Sdw, bias_y};
    for (size_t i = 0; i < sizeof hp / sizeof hp[0]; i++) free(hp[i]);
}

// One training step of a whole model (tiny-bn: conv, BN, ReLU, pool, linear) in bf16, as lesson 10 takes it
// (test_gemm_lowp_model_step on the GPU, test_cpu_bf16_model_step on the CPU):
// the input and the loss gradient rounded, the conv and linear parameters rounded (master_to_model), every
// layer's output and output gradient rounded, the GEMM layers' parameter gradients rounded (policy.c's hook).
// Real: those roundings plus the real path's own (bf16 GEMMs). Emulated: those roundings, fp32 GEMMs. Every GEMM
// input of the real path is then already a bf16 value, so its conversions are exact: the two differ only in the
// GEMMs' summation order (the bound above, per GEMM). In the emulator both orders are OpenBLAS's: the same bits,
// asserted exactly. On a GPU a summation-order difference (~1e-5 of the RMS, TOL_MODEL's measurement) can move a
// value across a bf16 rounding boundary: that element then differs by one bf16 unit, and the elements computed
// from it by that much of its share. A bf16 holds 8 significant bits, so its unit is 2^-7 of the power of two at
// or below the value: between 2^-8 and 2^-7 of the value itself (a value just above a power of two flips by
// nearly 2^-7 of itself: -0.0337 against -0.0334, one unit of 2^-12, was measured). assert_close divides by the
// value or the tensor's RMS, whichever is larger, so a flip is at most lowp_unit (2^-7; fp16's 11 bits: 2^-10).
static inline double lowp_unit(LowpFormat f) { return f == LOWP_FP16 ? 1.0 / 1024.0 : 1.0 / 128.0; }

static inline void policy_like_hook(void *ctx, const Model *m, int layer, RoundPoint at, float *buf, size_t n) {
    LayerKind k = m->layers[layer].kind;
    if (at == ROUND_DPARAMS && k != LAYER_CONV && k != LAYER_LINEAR) return;  // BN's gamma, beta: fp32
    round_lowp(m->device, *(const LowpFormat *)ctx, n, buf, NULL);
}

// One mixed-precision training step of m in format *f, as lesson 10 takes it (the comment above): the policy's
// hook installed, the conv and linear parameters, the input batch x (batch, 3, H, W) and the loss gradient rounded.
static inline void policy_step(Model *m, LowpFormat *f, const float *x, const int *y, int batch) {
    const int classes = m->cfg.classes;
    const size_t nx = (size_t)batch * m->cfg.in_c * m->cfg.in_h * m->cfg.in_w;
    model_set_round_hook(m, policy_like_hook, f);
    for (int i = 0; i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        if (l->param_count && (l->kind == LAYER_CONV || l->kind == LAYER_LINEAR))
            round_lowp(m->device, *f, l->param_count, m->params + l->param_offset, NULL);
    }
    device_copy_to(m->device, m->input, x, nx * sizeof(float));
    device_copy_to(m->device, m->labels, y, batch * sizeof(int));
    round_lowp(m->device, *f, nx, m->input, NULL);
    const float *logits = model_forward(m, m->input, batch, true);
    device_memset_zero(m->device, m->dlogits, (size_t)batch * classes * sizeof(float));
    cross_entropy_backward(m->device, batch, classes, logits, m->labels, 0.0f, 1.0f / batch, m->dlogits);
    round_lowp(m->device, *f, (size_t)batch * classes, m->dlogits, NULL);
    model_zero_grad(m);
    model_backward(m, m->input, m->dlogits, batch);
}

// The loss gradient (the forward's result, through the loss) and every parameter gradient of b against a's, within
// tol of each tensor's RMS (tol 0: equal).
static inline void assert_step_close(const Model *a, const Model *b, int batch, double tol) {
    const size_t nd = (size_t)batch * a->cfg.classes;
    for (int i = -1; i < a->n_views; i++) {
        const size_t n = i < 0 ? nd : a->views[i].count, off = i < 0 ? 0 : a->views[i].offset;
        float *want = lowp_from(a->device, (i < 0 ? a->dlogits : a->grads) + off, n);
        float *got = lowp_from(b->device, (i < 0 ? b->dlogits : b->grads) + off, n);
        print_message("  %-24s checked\n", i < 0 ? "the loss gradient" : a->views[i].name);
        assert_close(got, want, n, tol, rms_floor(want, n));
        free(want), free(got);
    }
}

// One bf16 step of tiny-bn (batch 8) on dev, emulated (fp32 GEMMs) then real (bf16 GEMMs), each tensor of the step
// within tol of its RMS (assert_step_close). Inputs and weights from the seed.
static inline void lowp_model_step_case(Device dev, double tol, uint64_t seed) {
    const int batch = 8;
    ModelConfig cfg;
    assert_true(model_config(&cfg, "tiny-bn", 0, 3, 32, 32, 10));
    float *x = uniform_vec((size_t)batch * 3 * 32 * 32, -1, 1, seed);
    int y[8];
    for (int i = 0; i < batch; i++) y[i] = (i * 7) % 10;
    LowpFormat f = LOWP_BF16;
    Model *m[2];  // [0] emulated, [1] real
    for (int r = 0; r < 2; r++) {
        m[r] = model_create(&cfg, dev, batch, seed + 1);
        device_set_gemm_precision(dev, r ? GEMM_BF16 : GEMM_FP32);
        policy_step(m[r], &f, x, y, batch);
        device_set_gemm_precision(dev, GEMM_FP32);
    }
    assert_step_close(m[0], m[1], batch, tol);
    model_free(m[0]), model_free(m[1]);
    free(x);
}

#endif  // LOWP_GEMM_CASES_H
