// tests/test_cuda.c: every CUDA op equals the CPU op (kit/ops_cpu.c) on random
// inputs, within stated tolerances; and a training step of a whole model does too.
//
// Every test skips, saying why, when no GPU is usable (machines without one, CPU-only builds).
//
// How the tolerances are chosen. Errors are measured as |gpu - cpu| / max(|cpu|, floor), with the floor
// set to the RMS of the CPU result (rms_floor): an element that is a sum of many terms carries a
// rounding error proportional to the size of those terms, not to the (possibly cancelled, near-zero)
// sum, and the RMS of the whole result measures the terms' size. A wrong index, a missed accumulation
// or a race produces errors of the order of the RMS itself, five orders of magnitude over 1e-5.
//   - EXACT (0): the two devices do the same float operations in the same order (ReLU, add, max-pool,
//     argmax, avg-pool backward): any difference at all is a bug.
//   - 1e-6: the same operations, but nvcc contracts a*b + c into one fused multiply-add (one rounding
//     instead of two), a difference of at most an ulp or two (2^-24 = 6e-8 each) per operation.
//   - 1e-5: a different summation order (cuBLAS GEMMs and tree reductions against OpenBLAS and
//     sequential loops). For a sum of k terms of size t, float32 rounding is about sqrt(k) * 6e-8 * t
//     in practice; the largest k here is a few thousand (sqrt ~ 50-70), which gives ~4e-6 * rms.
#include "tests/testutil.h"

#include "kit/model.h"
#include "kit/ops.h"
#include "kit/optim.h"
#include "kit/train.h"
#include "tests/lowp_gemm_cases.h"
#ifdef KIT_CUDA
#include "kit/cuda/conv_cudnn.h"
#include "kit/cuda/cuda_context.h"
#endif

static const Device GPU = DEVICE_CUDA, CPU = DEVICE_CPU;

#define EXACT 0.0
#define TOL_FMA 1e-6
#define TOL_SUM 1e-5
// A whole training step chains a dozen ops, and ReLU and max-pool make discrete choices that a rounding
// difference can flip near a tie (a value just above or below 0, two equal maxima). Measured on the
// CPU alone, by perturbing the input of tiny-bn by 1e-7 and 1e-6 relative (the size of float rounding
// and of a reordered sum): the gradients moved by up to 1.6e-5 and the parameters by up to 1e-5 of
// their RMS after one step. 1e-4 leaves a margin of about 6x; a real bug (a wrong index, a lost
// accumulation, a race) moves them by O(1). Over several steps such a difference can flip one of those
// choices and then grow (test_model_ten_steps says by how much), so each step is compared from the same state.
#define TOL_MODEL 1e-4

// ---------------------------------------------------------------- helpers

// A GPU copy of a host array (NULL stays NULL, so optional gradients read naturally).
static float *gpu_of(const float *h, size_t n) {
    if (!h) return NULL;
    float *d = device_alloc(GPU, n * sizeof(float));
    device_copy_to(GPU, d, h, n * sizeof(float));
    return d;
}

static int *gpu_ints(const int *h, size_t n) {
    int *d = device_alloc(GPU, n * sizeof(int));
    device_copy_to(GPU, d, h, n * sizeof(int));
    return d;
}

// The GPU array d, brought back to the host (the caller frees).
static float *host_of(const float *d, size_t n) {
    float *h = xmalloc((n ? n : 1) * sizeof(float));
    device_copy_from(GPU, h, d, n * sizeof(float));
    return h;
}

// Asserts the GPU array d equals the CPU array ref within tol (relative, floor = RMS of ref; see top).
#define assert_gpu_close(d, ref, n, tol)                                                     \
    do {                                                                                     \
        float *got_ = host_of((d), (n));                                                     \
        if ((tol) == 0.0) {                                                                  \
            for (size_t k_ = 0; k_ < (size_t)(n); k_++)                                      \
                if (memcmp(&got_[k_], &(ref)[k_], sizeof(float)) != 0) {                     \
                    print_error("%s differs from %s at [%zu]: %.9g vs %.9g (must be equal)\n", #d, #ref, \
                                k_, (double)got_[k_], (double)(ref)[k_]);                    \
                    fail();                                                          \
                }                                                                            \
        } else {                                                                             \
            assert_close(got_, (ref), (n), (tol), rms_floor((ref), (n)));                    \
        }                                                                                    \
        free(got_);                                                                          \
    } while (0)


// ---------------------------------------------------------------- conv2d

// conv2d's engine (kit/cuda/cuda_context.h): cuDNN (emulated in the EMU build) or im2col + cuBLAS. Returns the
// setting it replaced; a no-op without CUDA.
static bool use_cudnn(bool on) {
#ifdef KIT_CUDA
    return cuda_conv_use_cudnn(on);
#else
    return on;
#endif
}

// Small integers in [-3, 3] in place of x's values: products and sums of them are exact in float (every
// partial sum below stays far under 2^24), so any summation order gives the same bits. No -0.0f (+ 0.0f):
// a gradient starting at -0 keeps its sign on one device (adding nothing) and loses it on the other
// (adding a sum of no taps, +0), which is no difference of value.
static void round_to_ints(float *x, size_t n) {
    for (size_t i = 0; x && i < n; i++) x[i] = rintf(3.0f * x[i]) + 0.0f;
}

// Forward and backward of one conv shape on both devices. Gradients start from the same random values
// on both, so the comparison also checks that backward ADDS to them; `grads` selects which are wanted
// (bit 0: dx, bit 1: dw, bit 2: db), the others are NULL. ints: every input a small integer (round_to_ints),
// so the two devices must agree EXACTLY: what is left to differ is where the values go (im2col, col2im and
// the layout kernels around the GEMMs, which only move data), and there any difference at all is a bug.
static void conv_case_ints(Conv2dDims s, bool bias, int grads, uint64_t seed, bool ints) {
    size_t nx = (size_t)s.n * s.c * s.h * s.w, nw = (size_t)s.k * s.c * s.r * s.r;
    size_t ny = (size_t)s.n * s.k * conv2d_out_h(&s) * conv2d_out_w(&s);
    float *x = uniform_vec(nx, -1, 1, seed), *w = uniform_vec(nw, -1, 1, seed + 1), *b = bias ? uniform_vec(s.k, -1, 1, seed + 2) : NULL;
    float *dy = uniform_vec(ny, -1, 1, seed + 3);
    float *dx = (grads & 1) ? uniform_vec(nx, -1, 1, seed + 4) : NULL;
    float *dw = (grads & 2) ? uniform_vec(nw, -1, 1, seed + 5) : NULL;
    float *db = (grads & 4) ? uniform_vec(s.k, -1, 1, seed + 6) : NULL;
    if (ints) {
        round_to_ints(x, nx), round_to_ints(w, nw), round_to_ints(b, bias ? (size_t)s.k : 0);
        round_to_ints(dy, ny), round_to_ints(dx, dx ? nx : 0), round_to_ints(dw, dw ? nw : 0);
        round_to_ints(db, db ? (size_t)s.k : 0);
    }
    const double tol = ints ? EXACT : TOL_SUM;
    float *gx = gpu_of(x, nx), *gw = gpu_of(w, nw), *gb = gpu_of(b, s.k), *gdy = gpu_of(dy, ny);
    float *gdx = gpu_of(dx, nx), *gdw = gpu_of(dw, nw), *gdb = gpu_of(db, s.k);
    float *gy = device_alloc(GPU, ny * sizeof(float));
    float *gwork = device_alloc(GPU, conv2d_work_floats(GPU, &s) * sizeof(float));
    float *y = xmalloc(ny * sizeof(float)), *work = xmalloc(conv2d_work_floats(CPU, &s) * sizeof(float));

    conv2d_forward(CPU, &s, x, w, b, y, work);
    conv2d_forward(GPU, &s, gx, gw, gb, gy, gwork);
    assert_gpu_close(gy, y, ny, tol);  // sums of C*R*R products (up to 5*25 here)

    conv2d_backward(CPU, &s, x, w, dy, dx, dw, db, work);
    conv2d_backward(GPU, &s, gx, gw, gdy, gdx, gdw, gdb, gwork);
    // dx: sums of K*R*R products; dw: sums over N*P*Q products; db: over N*P*Q values.
    if (dx) assert_gpu_close(gdx, dx, nx, tol);
    if (dw) assert_gpu_close(gdw, dw, nw, tol);
    if (db) assert_gpu_close(gdb, db, (size_t)s.k, tol);

    float *hp[] = {x, w, b, dy, dx, dw, db, y, work};
    for (size_t i = 0; i < sizeof hp / sizeof hp[0]; i++) free(hp[i]);
    float *dp[] = {gx, gw, gb, gdy, gdx, gdw, gdb, gy, gwork};
    for (size_t i = 0; i < sizeof dp / sizeof dp[0]; i++) device_free(GPU, dp[i]);
}

static void conv_case(Conv2dDims s, bool bias, int grads, uint64_t seed) { conv_case_ints(s, bias, grads, seed, false); }

static void test_conv_3x3_pad1(void **state) {
    skip_without_gpu();
    conv_case((Conv2dDims){.n = 3, .c = 5, .h = 9, .w = 7, .k = 4, .r = 3, .stride = 1, .pad = 1}, true, 7, 10);
}

static void test_conv_stride2_no_pad(void **state) {
    skip_without_gpu();
    conv_case((Conv2dDims){.n = 2, .c = 3, .h = 11, .w = 8, .k = 6, .r = 3, .stride = 2, .pad = 0}, true, 7, 20);
}

static void test_conv_1x1_and_5x5(void **state) {
    skip_without_gpu();
    conv_case((Conv2dDims){.n = 4, .c = 7, .h = 6, .w = 6, .k = 5, .r = 1, .stride = 1, .pad = 0}, true, 7, 30);
    conv_case((Conv2dDims){.n = 2, .c = 5, .h = 8, .w = 10, .k = 3, .r = 5, .stride = 1, .pad = 2}, false, 7, 40);
}

// NULL gradients are skipped, each combination on its own (bias-free conv before BN, first layer's dx).
static void test_conv_null_grads(void **state) {
    skip_without_gpu();
    Conv2dDims s = {.n = 2, .c = 4, .h = 6, .w = 5, .k = 3, .r = 3, .stride = 1, .pad = 1};
    for (int grads = 0; grads < 8; grads++) conv_case(s, grads & 4, grads, 50 + (uint64_t)grads * 10);
}

// More images than fit in one chunk of scratch: 5 images, 2 per chunk (2 + 2 + 1).
// On im2col + cuBLAS: cuDNN has no chunks.
static void test_conv_chunks(void **state) {
    skip_without_gpu();
#ifdef KIT_CUDA
    const bool was = use_cudnn(false);
    Conv2dDims s = {.n = 5, .c = 3, .h = 8, .w = 8, .k = 4, .r = 3, .stride = 1, .pad = 1};
    lowp_set_chunk(GPU, &s, 2);
    assert_int_equal(conv2d_work_floats(GPU, &s), 0);  // its work is the context's (test_memstat checks its size)
    conv_case(s, true, 7, 90);
    cuda_conv_set_work_budget(0);
    use_cudnn(was);
#endif
}

// The index kernels (im2col, col2im, the layouts around the GEMMs) move data only: with integer inputs the
// GPU equals the CPU bit for bit, over strides 1-3, paddings 0-2, kernels 1-5, non-square and odd planes,
// an output of one pixel, and several chunks (the last one short). On both engines: cuDNN's GEMM-family
// algorithms (the only ones the kit lets it use, kit/cuda/conv_cudnn.cu) sum exact products too, so a
// descriptor that put a value in the wrong place, or an algorithm outside that family, fails here.
static void exact_layouts(void) {
    const Conv2dDims shapes[] = {
        {.n = 3, .c = 5, .h = 9, .w = 7, .k = 4, .r = 3, .stride = 1, .pad = 1},
        {.n = 2, .c = 3, .h = 11, .w = 8, .k = 6, .r = 3, .stride = 2, .pad = 0},
        {.n = 2, .c = 3, .h = 11, .w = 13, .k = 5, .r = 3, .stride = 2, .pad = 1},
        {.n = 2, .c = 2, .h = 10, .w = 9, .k = 3, .r = 5, .stride = 3, .pad = 2},
        {.n = 3, .c = 4, .h = 7, .w = 5, .k = 2, .r = 1, .stride = 2, .pad = 0},
        {.n = 2, .c = 6, .h = 3, .w = 3, .k = 3, .r = 3, .stride = 1, .pad = 0},  // P = Q = 1
        {.n = 2, .c = 3, .h = 4, .w = 6, .k = 3, .r = 2, .stride = 1, .pad = 1},  // an even kernel
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        conv_case_ints(shapes[i], true, 7, 1000 + 10 * (uint64_t)i, true);
#ifdef KIT_CUDA
    Conv2dDims s = {.n = 5, .c = 3, .h = 8, .w = 6, .k = 4, .r = 3, .stride = 2, .pad = 1};
    lowp_set_chunk(GPU, &s, 2);
    conv_case_ints(s, true, 7, 1100, true);
    cuda_conv_set_work_budget(0);
#endif
}

static void test_conv_exact_layouts(void **state) {
    skip_without_gpu();
    const bool was = use_cudnn(true);
    for (int engine = 0; engine < 2; engine++) {
        print_message("  conv engine: %s\n", engine ? "im2col + cuBLAS" : "cuDNN where the build has it");
        use_cudnn(engine == 0);
        exact_layouts();
    }
    use_cudnn(was);
}

// When cuDNN cannot run a call it accepted a plan for (CUDNN_STATUS_NOT_SUPPORTED at the run: the emulator's
// KIT_EMU_CUDNN_REFUSE), the pass runs on im2col + cuBLAS instead, with the same result, and the program goes on.
static void test_conv_cudnn_refusal_falls_back(void **state) {
    skip_without_gpu();
#ifdef KIT_CUDA_EMU
    const bool was = use_cudnn(true);
    setenv("KIT_EMU_CUDNN_REFUSE", "1", 1);
    conv_case((Conv2dDims){.n = 2, .c = 3, .h = 7, .w = 9, .k = 5, .r = 3, .stride = 2, .pad = 1}, true, 7, 1200);
    unsetenv("KIT_EMU_CUDNN_REFUSE");
    use_cudnn(was);
#else
    skip();  // a real cuDNN refuses only what the emulator is told to
#endif
}

#ifdef KIT_CUDA
// The element of a (N, C, H, W) tensor at (n, c, h, w), in NCHW or in NHWC order: the index of it in memory.
static size_t layout_at(ConvLayout l, int C, int H, int W, int n, int c, int h, int w) {
    return l == CONV_NCHW ? (((size_t)n * C + c) * H + h) * W + w : (((size_t)n * H + h) * W + w) * C + c;
}

// a (N, C, H, W) in NCHW, as 16-bit values of format f in layout l (the ints of round_to_ints are exact in both).
static uint16_t *to_layout16(const float *a, int N, int C, int H, int W, ConvLayout l, LowpFormat f) {
    uint16_t *out = xmalloc((size_t)N * C * H * W * sizeof *out);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++)
            for (int h = 0; h < H; h++)
                for (int w = 0; w < W; w++) {
                    uint32_t u;
                    float v = a[layout_at(CONV_NCHW, C, H, W, n, c, h, w)];
                    memcpy(&u, &v, sizeof u);
                    out[layout_at(l, C, H, W, n, c, h, w)] = f == LOWP_BF16 ? (uint16_t)(lowp_bf16_bits(u) >> 16)
                                                                            : lowp_fp16_pack(lowp_fp16_bits(u));
                }
    return out;
}

// The three passes of one conv on cuDNN in 16-bit format f and layout l; results brought back in NCHW order
// (y, dx, dw: the 16-bit bits). false when cuDNN did not take a pass.
static bool cudnn_passes(const Conv2dDims *s, LowpFormat f, ConvLayout l, const float *x, const float *w,
                         const float *dy, uint16_t *y, uint16_t *dx, uint16_t *dw) {
    const int P = conv2d_out_h(s), Q = conv2d_out_w(s);
    const size_t nx = (size_t)s->n * s->c * s->h * s->w, nw = (size_t)s->k * s->c * s->r * s->r,
                 ny = (size_t)s->n * s->k * P * Q;
    // Host copies in layout l: x (N, C, H, W), w as a (K, C, R, R) tensor, dy (N, K, P, Q).
    uint16_t *hx = to_layout16(x, s->n, s->c, s->h, s->w, l, f), *hw = to_layout16(w, s->k, s->c, s->r, s->r, l, f),
             *hdy = to_layout16(dy, s->n, s->k, P, Q, l, f);
    void *gx = device_alloc(GPU, nx * 2), *gw = device_alloc(GPU, nw * 2), *gdy = device_alloc(GPU, ny * 2);
    void *gy = device_alloc(GPU, ny * 2), *gdx = device_alloc(GPU, nx * 2), *gdw = device_alloc(GPU, nw * 2);
    device_copy_to(GPU, gx, hx, nx * 2), device_copy_to(GPU, gw, hw, nw * 2), device_copy_to(GPU, gdy, hdy, ny * 2);
    device_memset_zero(GPU, gdx, nx * 2);  // backward data adds into dx
    bool ok = cudnn_conv_forward(f, l, s, gx, gw, gy) && cudnn_conv_backward_data(f, l, s, gw, gdy, gdx) &&
              cudnn_conv_backward_filter(f, l, s, gx, gdy, gdw, 0.0f);
    uint16_t *back[3] = {hdy, hx, hw};  // reused as the results' host copies, in layout l
    device_copy_from(GPU, back[0], gy, ny * 2), device_copy_from(GPU, back[1], gdx, nx * 2);
    device_copy_from(GPU, back[2], gdw, nw * 2);
    const int dims[3][4] = {{s->n, s->k, P, Q}, {s->n, s->c, s->h, s->w}, {s->k, s->c, s->r, s->r}};
    uint16_t *out[3] = {y, dx, dw};
    for (int t = 0; t < 3; t++) {
        const int *d = dims[t];
        for (int n = 0; n < d[0]; n++)
            for (int c = 0; c < d[1]; c++)
                for (int h = 0; h < d[2]; h++)
                    for (int w2 = 0; w2 < d[3]; w2++)
                        out[t][layout_at(CONV_NCHW, d[1], d[2], d[3], n, c, h, w2)] =
                            back[t][layout_at(l, d[1], d[2], d[3], n, c, h, w2)];
    }
    void *g[6] = {gx, gw, gdy, gy, gdx, gdw};
    for (int i = 0; i < 6; i++) device_free(GPU, g[i]);
    free(hx), free(hw), free(hdy);
    return ok;
}
#endif

// cuDNN in NHWC (channels_last: what bench_profile's 16-bit profile times against NCHW) computes the same
// convolution as in NCHW. Small integer inputs (round_to_ints): every product and every partial sum is an integer
// under 2^24, exact in float32 in any order, and the 16-bit results are that one exact value rounded once. So the
// two layouts must agree bit for bit, whatever algorithm cuDNN picks for each.
static void test_cudnn_nhwc_matches_nchw(void **state) {
    skip_without_gpu();
#ifdef KIT_CUDA
    if (!cudnn_conv_wanted()) {
        print_message("skipped: this build has no cuDNN (or KIT_CUDNN=0)\n");
        skip();
    }
    const GemmPrecision was = device_gemm_precision(GPU);
    const Conv2dDims shapes[] = {
        {.n = 2, .c = 8, .h = 6, .w = 5, .k = 16, .r = 3, .stride = 1, .pad = 1},
        {.n = 3, .c = 16, .h = 7, .w = 7, .k = 8, .r = 3, .stride = 2, .pad = 1},
    };
    for (int fi = 0; fi < 2; fi++) {
        const LowpFormat f = fi ? LOWP_FP16 : LOWP_BF16;
        device_set_gemm_precision(GPU, f == LOWP_BF16 ? GEMM_BF16 : GEMM_FP16);
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            const Conv2dDims *s = &shapes[i];
            const size_t nx = (size_t)s->n * s->c * s->h * s->w, nw = (size_t)s->k * s->c * s->r * s->r,
                         ny = (size_t)s->n * s->k * conv2d_out_h(s) * conv2d_out_w(s);
            float *x = uniform_vec(nx, -1, 1, 1300 + i), *w = uniform_vec(nw, -1, 1, 1310 + i),
                  *dy = uniform_vec(ny, -1, 1, 1320 + i);
            round_to_ints(x, nx), round_to_ints(w, nw), round_to_ints(dy, ny);
            uint16_t *r[2][3];
            for (int l = 0; l < 2; l++) {
                r[l][0] = xmalloc(ny * 2), r[l][1] = xmalloc(nx * 2), r[l][2] = xmalloc(nw * 2);
                if (!cudnn_passes(s, f, l ? CONV_NHWC : CONV_NCHW, x, w, dy, r[l][0], r[l][1], r[l][2]))
                    fail_msg("%s, shape %zu: cuDNN took no algorithm for a pass in %s (stderr says which)",
                             lowp_name(f), i, l ? "NHWC" : "NCHW");
            }
            const char *what[3] = {"y", "dx", "dw"};
            const size_t len[3] = {ny, nx, nw};
            for (int t = 0; t < 3; t++) {
                for (size_t k = 0; k < len[t]; k++)
                    if (r[0][t][k] != r[1][t][k])
                        fail_msg("%s, shape %zu: %s[%zu] differs between NCHW (0x%04x) and NHWC (0x%04x)",
                                 lowp_name(f), i, what[t], k, r[0][t][k], r[1][t][k]);
                free(r[0][t]), free(r[1][t]);
            }
            free(x), free(w), free(dy);
        }
    }
    device_set_gemm_precision(GPU, was);
#endif
}

// ---------------------------------------------------------------- batch norm

typedef struct {
    int calls, last_count;
} HookLog;

// Pretends a second rank holds an identical batch: every sum (and the count) doubles. BN over
// "both ranks" must then equal plain BN over the batch concatenated with itself.
static void hook_double(double *buf, int count, void *ctx) {
    HookLog *log = ctx;
    log->calls++;
    log->last_count = count;
    for (int i = 0; i < count; i++) buf[i] *= 2.0;
}

typedef struct {
    BatchNormDims s;
    size_t nx;
    float *x, *gamma, *beta, *dy;
} BnCase;

static BnCase bn_case(int n, int c, int hw, uint64_t seed) {
    BnCase b = {.s = {.n = n, .c = c, .hw = hw, .eps = 1e-5f, .momentum = 0.1f}};
    b.nx = (size_t)n * c * hw;
    b.x = uniform_vec(b.nx, -2, 3, seed);  // a non-zero mean, so mean and variance both matter
    b.gamma = uniform_vec(c, 0.5f, 1.5f, seed + 1);
    b.beta = uniform_vec(c, -0.5f, 0.5f, seed + 2);
    b.dy = uniform_vec(b.nx, -1, 1, seed + 3);
    return b;
}

static void bn_case_free(BnCase *b) {
    free(b->x);
    free(b->gamma);
    free(b->beta);
    free(b->dy);
}

// Training forward + backward on both devices (running stats and gradients start random: they must be
// updated / accumulated, not overwritten), then eval forward with the updated running stats.
static void bn_compare(int n, int c, int hw, uint64_t seed) {
    BnCase b = bn_case(n, c, hw, seed);
    const BatchNormDims *s = &b.s;
    size_t C = (size_t)c;
    float *rm = uniform_vec(C, -0.2f, 0.2f, seed + 5), *rv = uniform_vec(C, 0.5f, 2, seed + 6);
    float *dx = uniform_vec(b.nx, -1, 1, seed + 7), *dg = uniform_vec(C, -1, 1, seed + 8), *dbeta = uniform_vec(C, -1, 1, seed + 9);
    float *y = xmalloc(b.nx * sizeof(float)), *mean = xmalloc(C * sizeof(float)), *invstd = xmalloc(C * sizeof(float));
    float *work = xmalloc(batchnorm_work_floats(CPU, s) * sizeof(float));
    float *gx = gpu_of(b.x, b.nx), *gg = gpu_of(b.gamma, C), *gbeta = gpu_of(b.beta, C), *gdy = gpu_of(b.dy, b.nx);
    float *grm = gpu_of(rm, C), *grv = gpu_of(rv, C), *gdx = gpu_of(dx, b.nx), *gdg = gpu_of(dg, C);
    float *gdbeta = gpu_of(dbeta, C), *gy = device_alloc(GPU, b.nx * sizeof(float));
    float *gmean = device_alloc(GPU, C * sizeof(float)), *ginvstd = device_alloc(GPU, C * sizeof(float));
    float *gwork = device_alloc(GPU, batchnorm_work_floats(GPU, s) * sizeof(float));

    batchnorm_forward_train(CPU, s, b.x, b.gamma, b.beta, y, mean, invstd, rm, rv, NULL, work);
    batchnorm_forward_train(GPU, s, gx, gg, gbeta, gy, gmean, ginvstd, grm, grv, NULL, gwork);
    // Statistics: sums in double on both devices, in a different order: far below float rounding, so
    // mean, invstd and the running stats agree to about an ulp of float; y = x * a + b adds an FMA.
    assert_gpu_close(gmean, mean, C, TOL_FMA);
    assert_gpu_close(ginvstd, invstd, C, TOL_FMA);
    assert_gpu_close(grm, rm, C, TOL_FMA);
    assert_gpu_close(grv, rv, C, TOL_FMA);
    assert_gpu_close(gy, y, b.nx, TOL_FMA);

    batchnorm_backward(CPU, s, b.x, b.gamma, mean, invstd, b.dy, dx, dg, dbeta, NULL, work);
    batchnorm_backward(GPU, s, gx, gg, gmean, ginvstd, gdy, gdx, gdg, gdbeta, NULL, gwork);
    // Double sums again, but dx = a*dy + b*x + d is a sum of three float products that cancel (the
    // gradient of a normalised input has mean 0), so its error follows the terms: 1e-5 of the RMS.
    assert_gpu_close(gdg, dg, C, TOL_FMA);
    assert_gpu_close(gdbeta, dbeta, C, TOL_FMA);
    assert_gpu_close(gdx, dx, b.nx, TOL_SUM);

    batchnorm_forward_eval(CPU, s, b.x, b.gamma, b.beta, rm, rv, y);
    batchnorm_forward_eval(GPU, s, gx, gg, gbeta, grm, grv, gy);
    assert_gpu_close(gy, y, b.nx, TOL_FMA);

    float *hp[] = {rm, rv, dx, dg, dbeta, y, mean, invstd, work};
    for (size_t i = 0; i < sizeof hp / sizeof hp[0]; i++) free(hp[i]);
    float *dp[] = {gx, gg, gbeta, gdy, grm, grv, gdx, gdg, gdbeta, gy, gmean, ginvstd, gwork};
    for (size_t i = 0; i < sizeof dp / sizeof dp[0]; i++) device_free(GPU, dp[i]);
    bn_case_free(&b);
}

static void test_bn_small(void **state) {
    skip_without_gpu();
    bn_compare(4, 3, 25, 100);
    bn_compare(2, 1, 1, 110);  // two values per channel: the smallest legal batch
}

// Enough values per channel for the GPU to split each channel into several slices (8192 values each).
static void test_bn_sliced(void **state) {
    skip_without_gpu();
    bn_compare(64, 3, 300, 120);  // 19200 values per channel: 3 slices, the last one short
    bn_compare(8, 16, 64, 130);
}

// The sync hook (SyncBN): called once in forward and once in backward with 2C + 1 doubles, and its
// result used everywhere: with a hook that doubles every sum, BN on x equals BN on [x; x] (CPU).
static void test_bn_sync_hook(void **state) {
    skip_without_gpu();
    BnCase b = bn_case(3, 4, 10, 200);
    size_t C = 4, nx = b.nx;
    BatchNormDims s2 = b.s;
    s2.n *= 2;
    float *x2 = xmalloc(2 * nx * sizeof(float)), *dy2 = xmalloc(2 * nx * sizeof(float));
    memcpy(x2, b.x, nx * sizeof(float));
    memcpy(x2 + nx, b.x, nx * sizeof(float));
    memcpy(dy2, b.dy, nx * sizeof(float));
    memcpy(dy2 + nx, b.dy, nx * sizeof(float));
    // CPU reference: plain BN on the doubled batch.
    float *rm = uniform_vec(C, -0.2f, 0.2f, 5), *rv = uniform_vec(C, 0.5f, 2, 6);
    float *grm = gpu_of(rm, C), *grv = gpu_of(rv, C);
    float *y2 = xmalloc(2 * nx * sizeof(float)), *mean = xmalloc(C * sizeof(float)), *invstd = xmalloc(C * sizeof(float));
    float *dx2 = xcalloc(2 * nx, sizeof(float)), *dg = xcalloc(C, sizeof(float)), *dbeta = xcalloc(C, sizeof(float));
    float *work = xmalloc(batchnorm_work_floats(CPU, &s2) * sizeof(float));
    batchnorm_forward_train(CPU, &s2, x2, b.gamma, b.beta, y2, mean, invstd, rm, rv, NULL, work);
    batchnorm_backward(CPU, &s2, x2, b.gamma, mean, invstd, dy2, dx2, dg, dbeta, NULL, work);

    HookLog log = {0, 0};
    BatchNormSync sync = {hook_double, &log};
    float *gx = gpu_of(b.x, nx), *gg = gpu_of(b.gamma, C), *gbeta = gpu_of(b.beta, C), *gdy = gpu_of(b.dy, nx);
    float *gy = device_alloc(GPU, nx * sizeof(float)), *gmean = device_alloc(GPU, C * sizeof(float));
    float *ginvstd = device_alloc(GPU, C * sizeof(float)), *gwork = device_alloc(GPU, batchnorm_work_floats(GPU, &b.s) * sizeof(float));
    float *zeros = xcalloc(nx, sizeof(float));  // gradients start at 0 (see the halving below)
    float *gdx = gpu_of(zeros, nx), *gdg = gpu_of(zeros, C), *gdbeta = gpu_of(zeros, C);
    batchnorm_forward_train(GPU, &b.s, gx, gg, gbeta, gy, gmean, ginvstd, grm, grv, &sync, gwork);
    assert_int_equal(log.calls, 1);
    assert_int_equal(log.last_count, 2 * (int)C + 1);
    batchnorm_backward(GPU, &b.s, gx, gg, gmean, ginvstd, gdy, gdx, gdg, gdbeta, &sync, gwork);
    assert_int_equal(log.calls, 2);
    assert_int_equal(log.last_count, 2 * (int)C + 1);

    // Same tolerances as bn_compare; the count (2M, not M) shows in the unbiased running variance.
    assert_gpu_close(gmean, mean, C, TOL_FMA);
    assert_gpu_close(ginvstd, invstd, C, TOL_FMA);
    assert_gpu_close(grm, rm, C, TOL_FMA);
    assert_gpu_close(grv, rv, C, TOL_FMA);
    assert_gpu_close(gy, y2, nx, TOL_FMA);  // the first copy of the doubled batch
    assert_gpu_close(gdx, dx2, nx, TOL_SUM);
    // Parameter gradients stay LOCAL (DDP averages them later): half of the doubled batch's (the
    // doubled batch's double sums are twice the single ones up to double rounding, far below float).
    for (size_t c = 0; c < C; c++) {
        dg[c] *= 0.5f;
        dbeta[c] *= 0.5f;
    }
    assert_gpu_close(gdg, dg, C, TOL_FMA);
    assert_gpu_close(gdbeta, dbeta, C, TOL_FMA);

    float *hp[] = {x2, dy2, rm, rv, y2, mean, invstd, dx2, dg, dbeta, work, zeros};
    for (size_t i = 0; i < sizeof hp / sizeof hp[0]; i++) free(hp[i]);
    float *dp[] = {grm, grv, gx, gg, gbeta, gdy, gy, gmean, ginvstd, gwork, gdx, gdg, gdbeta};
    for (size_t i = 0; i < sizeof dp / sizeof dp[0]; i++) device_free(GPU, dp[i]);
    bn_case_free(&b);
}

// Fused BN + ReLU on the GPU (batchnorm_relu_*, what kit/model.c runs for a BN whose sole consumer is a ReLU)
// against the plain GPU path it replaces: batchnorm_forward_train + relu_forward in place; relu_backward into a
// zeroed buffer + batchnorm_backward. The same kernels do the same float operations in the same order, so
// the two must agree BIT FOR BIT, also in place (dx == dy, overwritten) and with the sync hook, which the
// fused op calls exactly as often with the same counts. Against the CPU's fused op: bn_compare's tolerances.
static void bn_relu_compare(int n, int c, int hw, bool with_sync, uint64_t seed) {
    BnCase b = bn_case(n, c, hw, seed);
    const BatchNormDims *s = &b.s;
    const size_t C = (size_t)c, nx = b.nx;
    for (size_t i = 0; i < nx; i += 7) b.dy[i] = -0.0f;  // the plain path turns these into +0.0f
    float *rm = uniform_vec(C, -0.2f, 0.2f, seed + 5), *rv = uniform_vec(C, 0.5f, 2, seed + 6), *dx = uniform_vec(nx, -1, 1, seed + 7);
    float *zeros = xcalloc(nx, sizeof(float));
    HookLog lp = {0, 0}, lf = {0, 0};
    BatchNormSync sp = {hook_double, &lp}, sf = {hook_double, &lf};
    float *gx = gpu_of(b.x, nx), *gg = gpu_of(b.gamma, C), *gbeta = gpu_of(b.beta, C), *gdy = gpu_of(b.dy, nx);
    float *work_p = device_alloc(GPU, batchnorm_work_floats(GPU, s) * sizeof(float));
    float *work_f = device_alloc(GPU, batchnorm_work_floats(GPU, s) * sizeof(float));
    // Plain, then fused; each with its own running stats, saved stats and gradients.
    float *rm_p = gpu_of(rm, C), *rv_p = gpu_of(rv, C), *rm_f = gpu_of(rm, C), *rv_f = gpu_of(rv, C);
    float *y_p = device_alloc(GPU, nx * sizeof(float)), *y_f = device_alloc(GPU, nx * sizeof(float));
    float *mean_p = device_alloc(GPU, C * sizeof(float)), *inv_p = device_alloc(GPU, C * sizeof(float));
    float *mean_f = device_alloc(GPU, C * sizeof(float)), *inv_f = device_alloc(GPU, C * sizeof(float));
    batchnorm_forward_train(GPU, s, gx, gg, gbeta, y_p, mean_p, inv_p, rm_p, rv_p, with_sync ? &sp : NULL, work_p);
    relu_forward(GPU, nx, y_p, y_p);
    batchnorm_relu_forward_train(GPU, s, gx, gg, gbeta, y_f, mean_f, inv_f, rm_f, rv_f, with_sync ? &sf : NULL,
                                 work_f);
    float *hy = host_of(y_p, nx);
    size_t cut = 0;
    for (size_t i = 0; i < nx; i++) cut += hy[i] == 0.0f;
    assert_true(cut > nx / 10 && cut < nx * 9 / 10);  // the ReLU really cuts
    assert_gpu_close(y_f, hy, nx, EXACT);
    float *hmean = host_of(mean_p, C), *hinv = host_of(inv_p, C), *hrm = host_of(rm_p, C), *hrv = host_of(rv_p, C);
    assert_gpu_close(mean_f, hmean, C, EXACT);
    assert_gpu_close(inv_f, hinv, C, EXACT);
    assert_gpu_close(rm_f, hrm, C, EXACT);
    assert_gpu_close(rv_f, hrv, C, EXACT);

    // Backward, accumulating into the same non-zero dx, dgamma, dbeta on both paths.
    float *dbn = gpu_of(zeros, nx);
    relu_backward(GPU, nx, y_p, gdy, dbn);
    float *dx_p = gpu_of(dx, nx), *dx_f = gpu_of(dx, nx), *dg_p = gpu_of(dx, C), *dg_f = gpu_of(dx, C);
    float *db_p = gpu_of(dx + C, C), *db_f = gpu_of(dx + C, C);
    batchnorm_backward(GPU, s, gx, gg, mean_p, inv_p, dbn, dx_p, dg_p, db_p, with_sync ? &sp : NULL, work_p);
    batchnorm_relu_backward(GPU, s, gx, gg, mean_f, inv_f, y_f, gdy, dx_f, dg_f, db_f, with_sync ? &sf : NULL,
                            work_f);
    float *hdx = host_of(dx_p, nx), *hdg = host_of(dg_p, C), *hdb = host_of(db_p, C);
    assert_gpu_close(dx_f, hdx, nx, EXACT);
    assert_gpu_close(dg_f, hdg, C, EXACT);
    assert_gpu_close(db_f, hdb, C, EXACT);
    assert_int_equal(lf.calls, lp.calls);
    assert_int_equal(lf.calls, with_sync ? 2 : 0);
    assert_int_equal(lf.last_count, lp.last_count);

    // In place (dx == dy, as the model runs it): overwritten with what the plain path adds into zeros.
    float *dx0 = gpu_of(zeros, nx), *io = gpu_of(b.dy, nx);
    batchnorm_backward(GPU, s, gx, gg, mean_p, inv_p, dbn, dx0, NULL, NULL, NULL, work_p);
    batchnorm_relu_backward(GPU, s, gx, gg, mean_f, inv_f, y_f, io, io, NULL, NULL, NULL, work_f);
    float *hdx0 = host_of(dx0, nx);
    assert_gpu_close(io, hdx0, nx, EXACT);

    // The CPU's fused op, without the hook (bn_compare's tolerances and reasons).
    if (!with_sync) {
        float *y = xmalloc(nx * sizeof(float)), *mean = xmalloc(C * sizeof(float)), *inv = xmalloc(C * sizeof(float));
        float *work = xmalloc(batchnorm_work_floats(CPU, s) * sizeof(float)), *cdx = xmalloc(nx * sizeof(float));
        memcpy(cdx, b.dy, nx * sizeof(float));
        batchnorm_relu_forward_train(CPU, s, b.x, b.gamma, b.beta, y, mean, inv, rm, rv, NULL, work);
        assert_gpu_close(y_f, y, nx, TOL_FMA);
        batchnorm_relu_backward(CPU, s, b.x, b.gamma, mean, inv, y, cdx, cdx, NULL, NULL, NULL, work);
        assert_gpu_close(io, cdx, nx, TOL_SUM);
        free(y), free(mean), free(inv), free(work), free(cdx);
    }

    float *hp[] = {rm, rv, dx, zeros, hy, hmean, hinv, hrm, hrv, hdx, hdg, hdb, hdx0};
    for (size_t i = 0; i < sizeof hp / sizeof hp[0]; i++) free(hp[i]);
    float *dp[] = {gx, gg, gbeta, gdy, work_p, work_f, rm_p, rv_p, rm_f, rv_f, y_p, y_f, mean_p, inv_p, mean_f,
                   inv_f, dbn, dx_p, dx_f, dg_p, dg_f, db_p, db_f, dx0, io};
    for (size_t i = 0; i < sizeof dp / sizeof dp[0]; i++) device_free(GPU, dp[i]);
    bn_case_free(&b);
}

static void test_bn_relu_fused(void **state) {
    skip_without_gpu();
    bn_relu_compare(4, 3, 25, false, 140);
    bn_relu_compare(4, 3, 25, true, 150);
    bn_relu_compare(64, 3, 300, false, 160);  // several slices per channel
    bn_relu_compare(8, 16, 64, true, 170);
}

// ---------------------------------------------------------------- elementwise, pooling

static void test_relu_add_scale(void **state) {
    skip_without_gpu();
    size_t n = 100003;  // not a multiple of the block size, and more than one grid-stride pass
    float *x = uniform_vec(n, -1, 1, 300), *b = uniform_vec(n, -1, 1, 301), *dy = uniform_vec(n, -1, 1, 302), *dx = uniform_vec(n, -1, 1, 303);
    float *y = xmalloc(n * sizeof(float));
    float *gx = gpu_of(x, n), *gb = gpu_of(b, n), *gdy = gpu_of(dy, n), *gdx = gpu_of(dx, n);
    float *gy = device_alloc(GPU, n * sizeof(float));

    relu_forward(CPU, n, x, y);
    relu_forward(GPU, n, gx, gy);
    assert_gpu_close(gy, y, n, EXACT);
    relu_backward(CPU, n, y, dy, dx);
    relu_backward(GPU, n, gy, gdy, gdx);
    assert_gpu_close(gdx, dx, n, EXACT);

    add_forward(CPU, n, x, b, y);
    add_forward(GPU, n, gx, gb, gy);
    assert_gpu_close(gy, y, n, EXACT);
    add_inplace(CPU, n, dx, dy);
    add_inplace(GPU, n, gdx, gdy);
    assert_gpu_close(gdx, dx, n, EXACT);

    float *hp[] = {x, b, dy, dx, y};
    for (size_t i = 0; i < sizeof hp / sizeof hp[0]; i++) free(hp[i]);
    float *dp[] = {gx, gb, gdy, gdx, gy};
    for (size_t i = 0; i < sizeof dp / sizeof dp[0]; i++) device_free(GPU, dp[i]);
}

// Max-pool with odd sizes (the last row and column belong to no window) and with many ties (values on
// a coarse grid): the gradient must go to the same "first maximum" on both devices.
static void maxpool_compare(int n, int c, int h, int w, bool ties, uint64_t seed) {
    size_t nx = (size_t)n * c * h * w, ny = (size_t)n * c * (h / 2) * (w / 2);
    float *x = uniform_vec(nx, -1, 1, seed), *dy = uniform_vec(ny, -1, 1, seed + 1), *dx = uniform_vec(nx, -1, 1, seed + 2);
    if (ties)
        for (size_t i = 0; i < nx; i++) x[i] = floorf(x[i] * 2.0f);  // only -2, -1, 0, 1
    float *y = xmalloc(ny * sizeof(float));
    float *gx = gpu_of(x, nx), *gdy = gpu_of(dy, ny), *gdx = gpu_of(dx, nx), *gy = device_alloc(GPU, ny * sizeof(float));
    maxpool2_forward(CPU, n, c, h, w, x, y);
    maxpool2_forward(GPU, n, c, h, w, gx, gy);
    assert_gpu_close(gy, y, ny, EXACT);
    maxpool2_backward(CPU, n, c, h, w, x, y, dy, dx);
    maxpool2_backward(GPU, n, c, h, w, gx, gy, gdy, gdx);
    assert_gpu_close(gdx, dx, nx, EXACT);
    float *hp[] = {x, dy, dx, y};
    for (size_t i = 0; i < sizeof hp / sizeof hp[0]; i++) free(hp[i]);
    float *dp[] = {gx, gdy, gdx, gy};
    for (size_t i = 0; i < sizeof dp / sizeof dp[0]; i++) device_free(GPU, dp[i]);
}

static void test_maxpool(void **state) {
    skip_without_gpu();
    maxpool_compare(3, 4, 8, 6, false, 400);
    maxpool_compare(2, 3, 7, 9, false, 410);
    maxpool_compare(2, 5, 6, 6, true, 420);
}

static void test_avgpool(void **state) {
    skip_without_gpu();
    int n = 6, c = 7, hw = 49;
    size_t nx = (size_t)n * c * hw, ny = (size_t)n * c;
    float *x = uniform_vec(nx, -1, 1, 500), *dy = uniform_vec(ny, -1, 1, 501), *dx = uniform_vec(nx, -1, 1, 502);
    float *y = xmalloc(ny * sizeof(float));
    float *gx = gpu_of(x, nx), *gdy = gpu_of(dy, ny), *gdx = gpu_of(dx, nx), *gy = device_alloc(GPU, ny * sizeof(float));
    avgpool_forward(CPU, n, c, hw, x, y);
    avgpool_forward(GPU, n, c, hw, gx, gy);
    assert_gpu_close(gy, y, ny, TOL_SUM);  // a float sum (CPU) against a double one (GPU) of 49 values
    avgpool_backward(CPU, n, c, hw, dy, dx);
    avgpool_backward(GPU, n, c, hw, gdy, gdx);
    assert_gpu_close(gdx, dx, nx, EXACT);
    float *hp[] = {x, dy, dx, y};
    for (size_t i = 0; i < sizeof hp / sizeof hp[0]; i++) free(hp[i]);
    float *dp[] = {gx, gdy, gdx, gy};
    for (size_t i = 0; i < sizeof dp / sizeof dp[0]; i++) device_free(GPU, dp[i]);
}

// ---------------------------------------------------------------- linear

static void linear_compare(int n, int in, int out, bool bias, bool want_dx, uint64_t seed) {
    size_t nx = (size_t)n * in, nw = (size_t)out * in, ny = (size_t)n * out;
    float *x = uniform_vec(nx, -1, 1, seed), *w = uniform_vec(nw, -1, 1, seed + 1), *b = bias ? uniform_vec(out, -1, 1, seed + 2) : NULL;
    float *dy = uniform_vec(ny, -1, 1, seed + 3), *dx = want_dx ? uniform_vec(nx, -1, 1, seed + 4) : NULL;
    float *dw = uniform_vec(nw, -1, 1, seed + 5), *db = bias ? uniform_vec(out, -1, 1, seed + 6) : NULL;
    float *y = xmalloc(ny * sizeof(float));
    float *gx = gpu_of(x, nx), *gw = gpu_of(w, nw), *gb = gpu_of(b, out), *gdy = gpu_of(dy, ny);
    float *gdx = gpu_of(dx, nx), *gdw = gpu_of(dw, nw), *gdb = gpu_of(db, out), *gy = device_alloc(GPU, ny * sizeof(float));
    linear_forward(CPU, n, in, out, x, w, b, y);
    linear_forward(GPU, n, in, out, gx, gw, gb, gy);
    assert_gpu_close(gy, y, ny, TOL_SUM);  // sums of `in` products
    linear_backward(CPU, n, in, out, x, w, dy, dx, dw, db);
    linear_backward(GPU, n, in, out, gx, gw, gdy, gdx, gdw, gdb);
    if (dx) assert_gpu_close(gdx, dx, nx, TOL_SUM);  // sums of `out` products
    assert_gpu_close(gdw, dw, nw, TOL_SUM);          // sums of `n` products
    if (db) assert_gpu_close(gdb, db, (size_t)out, TOL_FMA);  // double sums of n values on both
    float *hp[] = {x, w, b, dy, dx, dw, db, y};
    for (size_t i = 0; i < sizeof hp / sizeof hp[0]; i++) free(hp[i]);
    float *dp[] = {gx, gw, gb, gdy, gdx, gdw, gdb, gy};
    for (size_t i = 0; i < sizeof dp / sizeof dp[0]; i++) device_free(GPU, dp[i]);
}

static void test_linear(void **state) {
    skip_without_gpu();
    linear_compare(33, 70, 10, true, true, 600);
    linear_compare(5, 512, 100, false, false, 610);
}

// ---------------------------------------------------------------- loss, argmax, SGD

static void ce_compare(int n, int k, float smoothing, uint64_t seed) {
    size_t nl = (size_t)n * k;
    float *logits = uniform_vec(nl, -3, 3, seed), *dl = uniform_vec(nl, -1, 1, seed + 1), *loss = xmalloc(n * sizeof(float));
    int *labels = xmalloc(n * sizeof(int)), *pred = xmalloc(n * sizeof(int)), *gpred_h = xmalloc(n * sizeof(int));
    Rng r = rng_make(seed, 7);
    for (int i = 0; i < n; i++) labels[i] = (int)rng_below(&r, (uint32_t)k);
    for (int i = 0; i < n; i += 5) logits[(size_t)i * k + 1] = logits[(size_t)i * k];  // ties for argmax
    float *gl = gpu_of(logits, nl), *gdl = gpu_of(dl, nl), *gloss = device_alloc(GPU, n * sizeof(float));
    int *glabels = gpu_ints(labels, n), *gpred = device_alloc(GPU, n * sizeof(int));

    cross_entropy_forward(CPU, n, k, logits, labels, smoothing, loss);
    cross_entropy_forward(GPU, n, k, gl, glabels, smoothing, gloss);
    // Both compute in double from the same floats: they differ by exp/log rounding (~1e-16) and the
    // order of k terms, then round to float: an ulp or so.
    assert_gpu_close(gloss, loss, (size_t)n, TOL_FMA);
    cross_entropy_backward(CPU, n, k, logits, labels, smoothing, 1.0f / n, dl);
    cross_entropy_backward(GPU, n, k, gl, glabels, smoothing, 1.0f / n, gdl);
    assert_gpu_close(gdl, dl, nl, TOL_FMA);

    argmax_rows(CPU, n, k, logits, pred);
    argmax_rows(GPU, n, k, gl, gpred);
    device_copy_from(GPU, gpred_h, gpred, n * sizeof(int));
    for (int i = 0; i < n; i++) assert_int_equal(gpred_h[i], pred[i]);

    free(logits), free(dl), free(loss), free(labels), free(pred), free(gpred_h);
    device_free(GPU, gl), device_free(GPU, gdl), device_free(GPU, gloss), device_free(GPU, glabels);
    device_free(GPU, gpred);
}

static void test_cross_entropy_argmax(void **state) {
    skip_without_gpu();
    ce_compare(37, 10, 0.0f, 700);
    ce_compare(37, 10, 0.1f, 710);
    ce_compare(300, 100, 0.2f, 720);
}

static void test_sgd(void **state) {
    skip_without_gpu();
    size_t n = 5001;
    for (int variant = 0; variant < 3; variant++) {
        // plain momentum + decay; Nesterov; momentum 0 without a velocity buffer
        float momentum = variant == 2 ? 0.0f : 0.9f, wd = variant == 1 ? 0.0f : 5e-4f;
        int nesterov = variant == 1;
        float *p = uniform_vec(n, -1, 1, 800), *g = uniform_vec(n, -1, 1, 801), *v = variant == 2 ? NULL : uniform_vec(n, -1, 1, 802);
        float *gp = gpu_of(p, n), *gg = gpu_of(g, n), *gv = gpu_of(v, n);
        for (int step = 0; step < 3; step++) {
            sgd_update(CPU, n, p, g, v, 0.05f, momentum, wd, nesterov);
            sgd_update(GPU, n, gp, gg, gv, 0.05f, momentum, wd, nesterov);
        }
        // A handful of multiply-adds per step, contracted to FMAs by nvcc (see top).
        assert_gpu_close(gp, p, n, TOL_FMA);
        if (v) assert_gpu_close(gv, v, n, TOL_FMA);
        free(p), free(g), free(v);
        device_free(GPU, gp), device_free(GPU, gg), device_free(GPU, gv);
    }
}

// ---------------------------------------------------------------- low precision (round_lowp, lesson 10)

// Random bit patterns (every exponent, NaNs, infinities, float32 subnormals) with the edge values put in: the
// GPU rounds with the CPU's own function (kit/ops_dims.h), so the bits and the counts must be equal.
static float *lowp_inputs(size_t n, uint64_t seed) {
    float *x = xmalloc(n * sizeof(float));
    Rng r = rng_make(seed, 0);
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)rng_next_u64(&r);
        if (i % 3 == 0) u = (u & 0x80000000u) | (0x33000000u + u % 0x14800000u);  // 2^-25 .. 65536: fp16's range
        memcpy(&x[i], &u, sizeof u);
    }
    const float edges[] = {0.0f, -0.0f, 65504.0f, 65519.0f, 65520.0f, -65520.0f, 5.9604644775390625e-8f,
                           2.98023223876953125e-8f, 1e-45f, 3.4e38f, INFINITY, -INFINITY, NAN, -NAN};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0] && i < n; i++) x[n - 1 - i] = edges[i];
    return x;
}

static void test_round_lowp(void **state) {
    skip_without_gpu();
    size_t n = 100003;  // not a multiple of the block size: the last block's tail counts too
    for (LowpFormat f = LOWP_FP32; f <= LOWP_FP16; f++) {
        for (int counted = 0; counted < 2; counted++) {
            float *x = lowp_inputs(n, 1000 + f);
            float *gx = gpu_of(x, n);
            LowpStats cs = {1, 2, 3}, gs = {1, 2, 3};  // both add to what they are given
            round_lowp(CPU, f, n, x, counted ? &cs : NULL);
            round_lowp(GPU, f, n, gx, counted ? &gs : NULL);
            assert_gpu_close(gx, x, n, EXACT);
            assert_memory_equal(&gs, &cs, sizeof cs);
            if (counted && f != LOWP_FP32) assert_true(cs.underflow > 2 && cs.overflow > 3);  // both seen
            free(x);
            device_free(GPU, gx);
        }
    }
    LowpStats s = {0, 0, 0};
    round_lowp(GPU, LOWP_BF16, 0, NULL, &s);  // nothing: no launch, no counts
    assert_int_equal(s.nonzero + s.underflow + s.overflow, 0);
}

static void test_scale_count_nonfinite(void **state) {
    skip_without_gpu();
    size_t n = 100003;
    float *x = lowp_inputs(n, 1100);
    float *gx = gpu_of(x, n);
    assert_int_equal(count_nonfinite(GPU, n, gx), count_nonfinite(CPU, n, x));
    scale_inplace(CPU, n, x, 1024.0f);  // one multiply, no contraction: the same bits
    scale_inplace(GPU, n, gx, 1024.0f);
    assert_gpu_close(gx, x, n, EXACT);
    size_t bad = count_nonfinite(CPU, n, x);
    assert_true(bad > 0);
    assert_int_equal(count_nonfinite(GPU, n, gx), bad);
    assert_int_equal(count_nonfinite(GPU, 0, gx), 0);
    scale_inplace(CPU, n, x, 3e-3f);
    scale_inplace(GPU, n, gx, 3e-3f);
    assert_gpu_close(gx, x, n, EXACT);
    free(x);
    device_free(GPU, gx);
}

// The model's rounding hook (lesson 10) is called at the same points on both devices, though the CPU fuses each
// BN with its ReLU and the GPU does not: the same (layer, point, count) sequence for a training step and an eval.
typedef struct {
    int n;
    int layer[256], at[256];
    size_t count[256];
} RoundLog;

static void round_log(void *ctx, const Model *m, int layer, RoundPoint at, float *buf, size_t n) {
    RoundLog *h = ctx;
    assert_true(h->n < 256);
    h->layer[h->n] = layer, h->at[h->n] = (int)at, h->count[h->n] = n;
    h->n++;
    round_lowp(m->device, LOWP_BF16, n, buf, NULL);
}

static void test_round_hook_same_points(void **state) {
    skip_without_gpu();
    ModelConfig cfg;
    assert_true(model_config(&cfg, "tiny-bn", 0, 3, 16, 16, 10));
    RoundLog *log = xmalloc(2 * sizeof *log);
    const int batch = 4;
    float *x = uniform_vec((size_t)batch * 3 * 16 * 16, -1, 1, 1200), *dl = uniform_vec((size_t)batch * 10, -1, 1, 1201);
    for (int d = 0; d < 2; d++) {
        Device dev = d ? GPU : CPU;
        Model *m = model_create(&cfg, dev, batch, 7);
        log[d].n = 0;
        model_set_round_hook(m, round_log, &log[d]);
        device_copy_to(dev, m->input, x, (size_t)batch * 3 * 16 * 16 * sizeof(float));
        device_copy_to(dev, m->dlogits, dl, (size_t)batch * 10 * sizeof(float));
        model_zero_grad(m);
        model_forward(m, m->input, batch, true);
        model_backward(m, m->input, m->dlogits, batch);
        model_forward(m, m->input, batch, false);
        model_free(m);
    }
    assert_int_equal(log[0].n, log[1].n);
    assert_int_equal(log[0].n, 10 + 9 + 5 + 10);  // outputs, output gradients (not the logits'), dparams, eval
    assert_memory_equal(log[0].layer, log[1].layer, (size_t)log[0].n * sizeof(int));
    assert_memory_equal(log[0].at, log[1].at, (size_t)log[0].n * sizeof(int));
    assert_memory_equal(log[0].count, log[1].count, (size_t)log[0].n * sizeof(size_t));
    free(x), free(dl), free(log);
}

// ---------------------------------------------------------------- the real low-precision GEMMs (tensor cores)
// Against the emulation (bf16, fp16, TF32): the cases and their bound are in tests/lowp_gemm_cases.h.

static void test_gemm_lowp_real_equals_emulated(void **state) {
    skip_without_gpu();
#ifdef KIT_CUDA
    for (GemmPrecision p = GEMM_BF16; p <= GEMM_FP16; p++) {
        print_message("%s GEMMs:\n", gemm_precision_name(p));
        g_plain_outside = 0;
        conv_lowp_case(GPU, p, (Conv2dDims){.n = 3, .c = 5, .h = 9, .w = 9, .k = 7, .r = 3, .stride = 1, .pad = 1}, 0,
                       1300 + p);
        // Two images per GEMM: dw adds three GEMMs (beta = 1), the chunk's offsets into x, dy and dx.
        conv_lowp_case(GPU, p, (Conv2dDims){.n = 5, .c = 16, .h = 8, .w = 8, .k = 32, .r = 3, .stride = 2, .pad = 1}, 2,
                       1310 + p);
        conv_lowp_case(GPU, p, (Conv2dDims){.n = 2, .c = 64, .h = 4, .w = 4, .k = 24, .r = 1, .stride = 1, .pad = 0}, 0,
                       1320 + p);
        linear_lowp_case(GPU, p, 33, 70, 10, 1330 + p);
        linear_lowp_case(GPU, p, 5, 512, 100, 1340 + p);
        assert_true(g_plain_outside > 0);  // the bound is tight enough to see a missing rounding
    }
#endif
}

// TF32 (--tf32): the convolutions' GEMMs read float32 inputs as TF32 and sum in float32, so they equal the
// float32 conv on inputs truncated to TF32 within the summation bound above (plus, on a GPU, the slack for a
// kernel that rounds instead: input_slack), and differ from plain float32 beyond it (the test can fail: a TF32
// switch that changed nothing fails it). Linear stays float32 under TF32 (PyTorch's default: TF32 for
// convolutions, not for matmuls): the same bits as fp32. (On a GPU the "differs" half is reported, not asserted:
// see below.)
static void test_gemm_tf32(void **state) {
    skip_without_gpu();
#ifdef KIT_CUDA
    g_plain_outside = 0;
    conv_lowp_case(GPU, GEMM_TF32, (Conv2dDims){.n = 3, .c = 5, .h = 9, .w = 9, .k = 7, .r = 3, .stride = 1, .pad = 1}, 0,
                   1400);
    conv_lowp_case(GPU, GEMM_TF32, (Conv2dDims){.n = 5, .c = 16, .h = 8, .w = 8, .k = 32, .r = 3, .stride = 2, .pad = 1},
                   2, 1410);
#ifdef KIT_CUDA_EMU
    assert_true(g_plain_outside > 0);
#else
    // cuBLAS may answer a TF32 request on these small shapes with a float32 kernel ("allows" tensor cores): then
    // nothing differs from float32, which is no error of the kit. Said, not asserted.
    print_message("  TF32 %s on this GPU (%zu elements beyond float32's summation bound)\n",
                  g_plain_outside ? "used" : "NOT used", g_plain_outside);
#endif
    const int n = 9, in_f = 70, out_f = 10;
    float *x = uniform_vec((size_t)n * in_f, -1, 1, 1420), *w = uniform_vec((size_t)out_f * in_f, -1, 1, 1421);
    float *gx = gpu_of(x, (size_t)n * in_f), *gw = gpu_of(w, (size_t)out_f * in_f);
    float *y[2] = {device_alloc(GPU, (size_t)n * out_f * sizeof(float)),
                   device_alloc(GPU, (size_t)n * out_f * sizeof(float))};
    for (int t = 0; t < 2; t++) {
        device_set_gemm_precision(GPU, t ? GEMM_TF32 : GEMM_FP32);
        assert_int_equal(device_gemm_precision(GPU), t ? GEMM_TF32 : GEMM_FP32);
        linear_forward(GPU, n, in_f, out_f, gx, gw, NULL, y[t]);
    }
    device_set_gemm_precision(GPU, GEMM_FP32);
    float *y_fp32 = host_of(y[0], (size_t)n * out_f);
    assert_gpu_close(y[1], y_fp32, (size_t)n * out_f, EXACT);
    free(x), free(w), free(y_fp32);
    device_free(GPU, gx), device_free(GPU, gw), device_free(GPU, y[0]), device_free(GPU, y[1]);
#endif
}

// The step of a whole model in bf16, real against emulated: policy_step and its comment, tests/lowp_gemm_cases.h.
// Both steps on im2col + cuBLAS: the test is about the GEMMs' precision, and the emulated step's float32 data
// would otherwise go to cuDNN, which sums in another order (test_conv_engines_model_step compares the engines).
static void test_gemm_lowp_model_step(void **state) {
    skip_without_gpu();
#ifdef KIT_CUDA_EMU
    const double tol = EXACT;
#else
    const double tol = lowp_unit(LOWP_BF16);
#endif
    const bool was = use_cudnn(false);
    lowp_model_step_case(GPU, tol, 1500);
    use_cudnn(was);
}

// 16-bit storage (model_store_activations): every layer's output but the logits, and its gradient, stored in 2
// bytes, the kernels reading them into float32 and writing them rounded. Against the same model with float32
// storage and the policy's hook rounding those tensors in place (the real path before 16-bit storage, which
// test_gemm_lowp_model_step checks against the emulated one), nothing may change: a rounded value is stored
// exactly in 2 bytes, every kernel computes in float32 from the same values in the same order, and ResNet-9's
// residual inputs, whose gradients two layers add into, round once either way (kit/model.c, grad16_exact). So in
// the emulator the two agree bit for bit: the loss gradient, every parameter gradient, the BN running statistics
// and an eval forward's logits. On a GPU, cuBLAS may pick another kernel for an operand at another address (the
// 16-bit arena, against the scratch copy), which changes the GEMMs' summation order: the bound of
// test_gemm_lowp_model_step (one unit of the format, lowp_unit) then applies. And both arenas take half their
// float32 bytes.
// With cuDNN on, the 16-bit model's convolutions (forward, dx, dw) run on cuDNN's 16-bit configuration, while the
// float32-storage model's stay on im2col (its data is float32): the GEMMs' summation orders differ even in the
// emulator, and the GPU's bound applies there too.
static void act16_one_step(LowpFormat f, bool cudnn) {
    // One bf16 unit for either format: fp16's units are 8 times smaller, and its more frequent flips, carried
    // through the layers into the gradients, add up to a few of them (two, in the first conv's dw here), still
    // well under a bf16 unit. A wiring mistake (a type, a descriptor, the 16-bit dw's scratch) is far larger.
#ifdef KIT_CUDA_EMU
    const double tol = cudnn ? lowp_unit(LOWP_BF16) : EXACT;
#else
    const double tol = lowp_unit(LOWP_BF16);
#endif
    const int batch = 4, classes = 10;
    const bool was = use_cudnn(cudnn);
    print_message("  %s activations, conv on %s\n", lowp_name(f), cudnn ? "cuDNN" : "im2col + cuBLAS");
    ModelConfig cfg;
    assert_true(model_config(&cfg, "resnet9", 8, 3, 16, 16, classes));  // residual adds, pools, fused BN + ReLU
    float *x = uniform_vec((size_t)batch * 3 * 16 * 16, -1, 1, 1700);
    int y[4] = {3, 1, 4, 1};
    LowpFormat fmt = f;
    device_set_gemm_precision(GPU, f == LOWP_BF16 ? GEMM_BF16 : GEMM_FP16);
    Model *m[2];  // [0] float32 storage, rounded by the hook; [1] 16-bit storage
    for (int r = 0; r < 2; r++) {
        m[r] = model_create(&cfg, GPU, batch, 1701);
        if (r) {
            MemStats before = mem_stats();
            model_store_activations(m[r], f);
            MemStats after = mem_stats();
            // Both arenas (activations, their gradients) in 2 bytes, plus the float32 logits.
            const size_t arenas = (size_t)batch * (m[r]->act_floats_per_sample + m[r]->grad_floats_per_sample) * 4;
            assert_int_equal(after.live[MEM_ACTS] + arenas / 2, before.live[MEM_ACTS] + batch * classes * sizeof(float));
        }
        policy_step(m[r], &fmt, x, y, batch);
    }
    assert_step_close(m[0], m[1], batch, tol);
    float *ref = host_of(m[0]->buffers, m[0]->n_buffers);  // the running statistics the training forward updated
    assert_gpu_close(m[1]->buffers, ref, m[0]->n_buffers, tol);
    free(ref);
    const float *eval[2];
    for (int r = 0; r < 2; r++) eval[r] = model_forward(m[r], m[r]->input, batch, false);
    ref = host_of(eval[0], (size_t)batch * classes);
    assert_gpu_close(eval[1], ref, (size_t)batch * classes, tol);
    free(ref);
    device_set_gemm_precision(GPU, GEMM_FP32);
    model_free(m[0]), model_free(m[1]);
    free(x);
    use_cudnn(was);
}

static void test_act16_model_step(void **state) {
    skip_without_gpu();
    for (int cudnn = 0; cudnn < 2; cudnn++) {
        act16_one_step(LOWP_BF16, cudnn);
        act16_one_step(LOWP_FP16, cudnn);
    }
}

// What model_store_activations refuses, each with its reason and a non-zero exit: the CPU (its 16 bits are lesson
// 10's emulation), GEMMs in another format than the activations (they read them as they are), and a stage.
static void store_on(void *arg) {
    const int which = *(const int *)arg;
    ModelConfig cfg;
    assert_true(model_config(&cfg, "tiny", 0, 3, 32, 32, 10));
    Model *m = which == 2 ? model_create_stage(&cfg, GPU, 2, 1, 3, 8) : model_create(&cfg, which ? GPU : CPU, 2, 1);
    device_set_gemm_precision(GPU, which == 2 ? GEMM_BF16 : GEMM_FP32);
    model_store_activations(m, LOWP_BF16);
}

static void test_act16_refusals(void **state) {
    skip_without_gpu();
    const char *why[3] = {"16-bit activation storage is the GPU's", "set them to the same format first",
                          "on a stage"};
    for (int which = 0; which < 3; which++) {
        char report[2048];
        int status = child_exit_status(store_on, &which, report, sizeof report);
        print_message("  case %d: exit %d\n", which, status);
        assert_true(status > 0);
        if (!strstr(report, why[which])) print_error("case %d's report lacks \"%s\":\n%s\n", which, why[which], report);
        assert_non_null(strstr(report, why[which]));
    }
}

// ---------------------------------------------------------------- whole model

typedef struct {
    Model *m[2];  // [0] CPU, [1] GPU
    int batch, classes;
    float *x;     // (batch, 3, 32, 32) host
    int *y;
} Pair;

static Pair pair_create(const char *name, int batch, uint64_t seed) {
    Pair p = {.batch = batch, .classes = 10};
    ModelConfig cfg;
    assert_true(model_config(&cfg, name, 0, 3, 32, 32, 10));
    p.m[0] = model_create(&cfg, CPU, batch, seed);
    p.m[1] = model_create(&cfg, GPU, batch, seed);
    size_t nx = (size_t)batch * 3 * 32 * 32;
    p.x = uniform_vec(nx, -1, 1, seed + 1);
    p.y = xmalloc(batch * sizeof(int));
    Rng r = rng_make(seed, 3);
    for (int i = 0; i < batch; i++) p.y[i] = (int)rng_below(&r, 10);
    for (int d = 0; d < 2; d++) {
        device_copy_to(p.m[d]->device, p.m[d]->input, p.x, nx * sizeof(float));
        device_copy_to(p.m[d]->device, p.m[d]->labels, p.y, batch * sizeof(int));
    }
    return p;
}

static void pair_free(Pair *p) {
    model_free(p->m[0]);
    model_free(p->m[1]);
    free(p->x);
    free(p->y);
}

// One training step (as lesson 01 does it) on model m.
static void train_step(Model *m, int batch, int classes, const SgdConfig *opt) {
    Device d = m->device;
    const float *logits = model_forward(m, m->input, batch, true);
    cross_entropy_forward(d, batch, classes, logits, m->labels, 0.0f, m->loss);
    device_memset_zero(d, m->dlogits, (size_t)batch * classes * sizeof(float));
    cross_entropy_backward(d, batch, classes, logits, m->labels, 0.0f, 1.0f / batch, m->dlogits);
    model_zero_grad(m);
    model_backward(m, m->input, m->dlogits, batch);
    optim_step(m, opt);
}

// Compares one flat model buffer (params, grads or buffers) view by view, each with its own RMS floor.
static void compare_views(const Pair *p, int which, double tol) {
    const Model *c = p->m[0], *g = p->m[1];
    const float *cb = which == 0 ? c->params : which == 1 ? c->grads : c->buffers;
    const float *gb = which == 0 ? g->params : which == 1 ? g->grads : g->buffers;
    int nv = which == 2 ? c->n_buffer_views : c->n_views;
    const TensorView *views = which == 2 ? c->buffer_views : c->views;
    for (int i = 0; i < nv; i++) {
        const TensorView *v = &views[i];
        print_message("  %-24s ", v->name);
        float *got = host_of(gb + v->offset, v->count);
        double e = max_rel_error(got, cb + v->offset, v->count, rms_floor(cb + v->offset, v->count));
        print_message("max rel. error %.2g\n", e);
        assert_close(got, cb + v->offset, v->count, tol, rms_floor(cb + v->offset, v->count));
        free(got);
    }
}

// One full training step of "tiny-bn": loss, dlogits, every gradient, the updated parameters and the
// running statistics agree within TOL_MODEL (see its comment at the top).
static void test_model_one_step(void **state) {
    skip_without_gpu();
    Pair p = pair_create("tiny-bn", 32, 900);
    SgdConfig opt = {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-4f, .nesterov = true};
    compare_views(&p, 0, EXACT);  // the same initial parameters on both devices
    for (int d = 0; d < 2; d++) train_step(p.m[d], p.batch, p.classes, &opt);
    assert_gpu_close(p.m[1]->loss, p.m[0]->loss, (size_t)p.batch, TOL_MODEL);
    assert_gpu_close(p.m[1]->dlogits, p.m[0]->dlogits, (size_t)p.batch * p.classes, TOL_MODEL);
    compare_views(&p, 1, TOL_MODEL);
    compare_views(&p, 0, TOL_MODEL);
    compare_views(&p, 2, TOL_MODEL);
    pair_free(&p);
}

// Ten steps, each from the same state on both devices: after every step the gradients, the updated
// parameters and the running statistics agree within TOL_MODEL; then the CPU model's state (parameters,
// momentum, running statistics) is copied to the GPU model for the next step. Without the copy the two
// runs drift apart for a reason that is no bug: a rounding-level difference flips a discrete choice (a
// ReLU input near 0, a near-tie in a max-pool window) and the flip grows from step to step. It does so
// on the CPU alone: two CPU runs of this test whose inputs differ by 1e-6 relative had gradients 2e-3
// apart (relative to their RMS) after the second step and 0.1 apart after the tenth, the same as the
// CUDA emulator against the CPU (measured). What ten steps add over one is the state the steps carry,
// and that is compared at every step.
static void model_copy_state(Model *dst, const Model *src) {
    device_copy_to(dst->device, dst->params, src->params, src->n_params * sizeof(float));
    device_copy_to(dst->device, dst->velocity, src->velocity, src->n_params * sizeof(float));
    device_copy_to(dst->device, dst->buffers, src->buffers, src->n_buffers * sizeof(float));
}

static void test_model_ten_steps(void **state) {
    skip_without_gpu();
    Pair p = pair_create("tiny-bn", 32, 910);
    SgdConfig opt = {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-4f, .nesterov = true};
    for (int step = 0; step < 10; step++) {
        for (int d = 0; d < 2; d++) train_step(p.m[d], p.batch, p.classes, &opt);
        print_message("step %d\n", step);
        compare_views(&p, 1, TOL_MODEL);
        compare_views(&p, 0, TOL_MODEL);
        compare_views(&p, 2, TOL_MODEL);
        model_copy_state(p.m[1], p.m[0]);
    }
    pair_free(&p);
}

// The two conv engines on one model: a float32 training step of ResNet-9 (strides, residual adds, pools) on
// cuDNN and on im2col + cuBLAS, the loss gradient and every parameter gradient within TOL_MODEL of each other
// (both sum the same exact products, in other orders, as the CPU and the GPU do), and the updated parameters.
static void test_conv_engines_model_step(void **state) {
    skip_without_gpu();
    const int batch = 4, classes = 10;
    ModelConfig cfg;
    assert_true(model_config(&cfg, "resnet9", 8, 3, 16, 16, classes));
    const size_t nx = (size_t)batch * 3 * 16 * 16;
    float *x = uniform_vec(nx, -1, 1, 1800);
    int y[4] = {2, 7, 1, 8};
    SgdConfig opt = {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-4f, .nesterov = true};
    const bool was = use_cudnn(true);
    Model *m[2];  // [0] cuDNN, [1] im2col + cuBLAS
    for (int e = 0; e < 2; e++) {
        use_cudnn(e == 0);
        m[e] = model_create(&cfg, GPU, batch, 1801);
        device_copy_to(GPU, m[e]->input, x, nx * sizeof(float));
        device_copy_to(GPU, m[e]->labels, y, sizeof y);
        train_step(m[e], batch, classes, &opt);
    }
    use_cudnn(was);
    assert_step_close(m[1], m[0], batch, TOL_MODEL);
    float *want = host_of(m[1]->params, m[1]->n_params);
    assert_gpu_close(m[0]->params, want, m[1]->n_params, TOL_MODEL);
    free(want);
    model_free(m[0]), model_free(m[1]);
    free(x);
}

// ---------------------------------------------------------------- the overlapped copy (kit/loader.c)
// On CUDA a loader copies batch k+1 to the device while batch k computes (data.h, batch_on_device). In the
// emulator, copies on the loader's non-blocking stream run only when something waits for their event
// (kit/cuda/README.md): a consumer that skipped the wait would read the previous batch, or NaN.

static void overlap_data(Dataset *ds) { dataset_synthetic(ds, 52, 10, 3, 32, 32, 77, SPLIT_TRAIN); }

// Every batch after the first one of a staging loader is on the device, equal to the host batch, over two
// epochs (52 images in batches of 16: 16, 16, 16 and a short 4, so both slots and a short copy are used).
static void test_loader_stages_batches(void **state) {
    (void)state;
    skip_without_gpu();
    Dataset ds;
    overlap_data(&ds);
    Sampler s;
    sampler_init(&s, ds.n, 0, 1, 5, SAMPLER_TRAIN_PAD);
    Loader *L = loader_create(&ds, &s, 16, false, NULL, 5);
    size_t img = 3 * 32 * 32;
    float *hx = xmalloc(16 * img * sizeof(float));
    int *hy = xmalloc(16 * sizeof(int));
    int staged = 0, batches = 0;
    for (int epoch = 0; epoch < 2; epoch++) {
        loader_start_epoch(L, epoch, 0);
        const Batch *b;
        while ((b = loader_next(L, NULL)) != NULL) {
            const float *dx = NULL;
            const int *dy = NULL;
            bool on = batch_on_device(b, GPU, &dx, &dy);
            // The first batch starts the staging (the caller copies it); every later one is staged.
            assert_int_equal(on, batches > 0);
            batches++;
            if (!on) continue;
            staged++;
            // A synchronous copy on the legacy stream runs after the compute stream's wait for the event.
            device_copy_from(GPU, hx, dx, (size_t)b->n * img * sizeof(float));
            device_copy_from(GPU, hy, dy, (size_t)b->n * sizeof(int));
            assert_memory_equal(hx, b->x, (size_t)b->n * img * sizeof(float));
            assert_memory_equal(hy, b->y, (size_t)b->n * sizeof(int));
            // Not the loader's own Batch (a copy, as lesson 02's chunks): never staged.
            Batch copy = *b;
            assert_false(batch_on_device(&copy, GPU, &dx, &dy));
        }
    }
    assert_int_equal(staged, 7);
    free(hx);
    free(hy);
    loader_free(L);
    dataset_free(&ds);
}

// Two epochs of training plus an evaluation, through train_forward_backward and train_evaluate (the path
// of lessons 03 on): with the overlap and without it, the same batches meet the same kernels in the same
// order, so the parameters and the metrics must be equal bit for bit.
static void overlap_train(bool overlap, float *params_out, Metrics *train, Metrics *test) {
    Dataset ds;
    overlap_data(&ds);
    Sampler s;
    sampler_init(&s, ds.n, 0, 1, 9, SAMPLER_TRAIN_PAD);
    Loader *L = loader_create(&ds, &s, 16, false, NULL, 9);
    loader_set_overlap(L, overlap);
    ModelConfig cfg;
    assert_true(model_config(&cfg, "tiny-bn", 0, 3, 32, 32, 10));
    Model *m = model_create(&cfg, GPU, 16, 9);
    SgdConfig opt = {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-4f, .nesterov = false};
    *train = (Metrics){0, 0, 0};
    for (int epoch = 0; epoch < 2; epoch++) {
        loader_start_epoch(L, epoch, 0);
        const Batch *b;
        while ((b = loader_next(L, NULL)) != NULL) {
            Metrics r = train_forward_backward(m, b, 0.1f, 1.0f / (float)b->n);
            optim_step(m, &opt);
            train->loss_sum += r.loss_sum;
            train->correct += r.correct;
            train->count += r.count;
        }
    }
    *test = train_evaluate(m, L);
    device_copy_from(GPU, params_out, m->params, m->n_params * sizeof(float));
    model_free(m);
    loader_free(L);
    dataset_free(&ds);
}

static void test_overlap_same_results(void **state) {
    (void)state;
    skip_without_gpu();
    ModelConfig cfg;
    assert_true(model_config(&cfg, "tiny-bn", 0, 3, 32, 32, 10));
    Model *probe = model_create(&cfg, CPU, 1, 9);
    size_t n = probe->n_params;
    model_free(probe);
    float *with = xmalloc(n * sizeof(float)), *without = xmalloc(n * sizeof(float));
    Metrics tr[2], te[2];
    overlap_train(true, with, &tr[0], &te[0]);
    overlap_train(false, without, &tr[1], &te[1]);
    assert_memory_equal(with, without, n * sizeof(float));
    for (int i = 0; i < 2; i++) {
        assert_int_equal(tr[i].count, 2 * 52);
        assert_int_equal(te[i].count, 52);
    }
    // Exact: the same operations in the same order (see above).
    assert_true(tr[0].loss_sum == tr[1].loss_sum && te[0].loss_sum == te[1].loss_sum);
    assert_int_equal(tr[0].correct, tr[1].correct);
    assert_int_equal(te[0].correct, te[1].correct);
    free(with);
    free(without);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv_3x3_pad1),
        cmocka_unit_test(test_conv_stride2_no_pad),
        cmocka_unit_test(test_conv_1x1_and_5x5),
        cmocka_unit_test(test_conv_null_grads),
        cmocka_unit_test(test_conv_chunks),
        cmocka_unit_test(test_conv_exact_layouts),
        cmocka_unit_test(test_conv_engines_model_step),
        cmocka_unit_test(test_conv_cudnn_refusal_falls_back),
        cmocka_unit_test(test_cudnn_nhwc_matches_nchw),
        cmocka_unit_test(test_bn_small),
        cmocka_unit_test(test_bn_sliced),
        cmocka_unit_test(test_bn_sync_hook),
        cmocka_unit_test(test_bn_relu_fused),
        cmocka_unit_test(test_relu_add_scale),
        cmocka_unit_test(test_maxpool),
        cmocka_unit_test(test_avgpool),
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_cross_entropy_argmax),
        cmocka_unit_test(test_sgd),
        cmocka_unit_test(test_round_lowp),
        cmocka_unit_test(test_scale_count_nonfinite),
        cmocka_unit_test(test_round_hook_same_points),
        cmocka_unit_test(test_gemm_lowp_real_equals_emulated),
        cmocka_unit_test(test_gemm_tf32),
        cmocka_unit_test(test_gemm_lowp_model_step),
        cmocka_unit_test(test_act16_model_step),
        cmocka_unit_test(test_act16_refusals),
        cmocka_unit_test(test_model_one_step),
        cmocka_unit_test(test_model_ten_steps),
        cmocka_unit_test(test_loader_stages_batches),
        cmocka_unit_test(test_overlap_same_results),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
