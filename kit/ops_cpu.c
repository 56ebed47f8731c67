// kit/ops_cpu.c: the CPU implementations of kit/ops.h (float32, NCHW).
//
// Every loop is split statically (the same thread count gives the same bits: lesson 04 resumes a run and
// expects identical weights); all parallelism is OpenMP's, OpenBLAS stays single-threaded inside. Convolution
// is im2col + GEMM over groups of images, or Winograd F(2x2, 3x3) (kit/winograd.c) for 3x3 stride-1 layers.
// Why each: kit/README.md ("The CPU ops").
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kit/check.h"
#include "kit/cpu_bf16.h"
#include "kit/device.h"
#include "kit/gemm_small.h"
#include "kit/ops_impl.h"
#include "kit/winograd.h"

// Below this many elements a parallel region costs more (thread wake-up) than it saves.
#define PAR_MIN 32768

// A GEMM with fewer columns than this runs far below OpenBLAS's peak: group images until it has them.
#define CONV_TARGET_COLS 512
// ...but never let one thread's im2col matrix exceed this many floats (64 MiB).
#define CONV_MAX_COL_FLOATS ((size_t)16 << 20)

static void blas_single_thread(void) {
    // Cheap getter; only the first call (or one after someone raised the count) changes anything.
    if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

// ================================================================ the GEMMs of conv and linear: float32 or bf16
// device_gemm_precision(DEVICE_CPU) (kit/device.h) says which: GEMM_FP32 is OpenBLAS's SGEMM on the float32 buffers
// as they are; GEMM_BF16 is oneDNN's bf16 matmul (kit/cpu_bf16.h) on copies of its inputs rounded to bf16 by the
// functions below, float32 sums into a float32 C. The rounding is round_lowp's (kit/ops_dims.h), so each product
// is the one lesson 10's emulation forms, exactly.

static bool gemm_bf16(void) { return device_gemm_precision(DEVICE_CPU) == GEMM_BF16; }

// src (n floats) rounded to bf16 into dst, stored as cpu_bf16 reads GEMM inputs (2 bytes, or float32 containers in
// the tests' mode). dst may be src: element i's new bytes (at 2i or 4i) never reach element i + 1's, which is read
// later; memcpy keeps the compiler from assuming the two types never share memory.
static void bf16_store(const float *src, size_t n, void *dst) {
    const size_t eb = cpu_bf16_elem_bytes();
    unsigned char *d = dst;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, src + i, sizeof u);
        u = lowp_bf16_bits(u);
        if (eb == 2) {
            const uint16_t h = (uint16_t)(u >> 16);
            memcpy(d + 2 * i, &h, sizeof h);
        } else {
            memcpy(d + 4 * i, &u, sizeof u);
        }
    }
}

// src as a bf16 GEMM input in this thread's scratch `slot` (kit/cpu_bf16.h).
static const void *bf16_copy(int slot, const float *src, size_t n) {
    void *dst = cpu_bf16_scratch(slot, n * cpu_bf16_elem_bytes());
    bf16_store(src, n, dst);
    return dst;
}

// The scratch slots (per thread): the weights (converted once per call by the calling thread, read by all), a
// matrix that is not the thread's own to overwrite (an image that is its own im2col matrix, linear's x), the output
// gradients.
enum { SLOT_WEIGHTS, SLOT_INPUT, SLOT_DY };

// C (m, n) = op(A) op(B) + beta C, row-major (op: transposed when ta / tb). float32 A and B for SGEMM; for bf16, A
// and B as bf16_store left them.
static void gemm_any(bool bf16, bool ta, bool tb, int m, int n, int k, const void *a, int lda, const void *b, int ldb,
                     float beta, float *c, int ldc) {
    if (bf16) {
        cpu_bf16_gemm(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a, lda,
                b, ldb, beta, c, ldc);
}

// The im2col matrix `a` (crr x cols) of a group as a GEMM input: itself for float32; for bf16, rounded in place when
// it is the thread's own `col`, else (a 1x1 layer's image) copied into the thread's scratch.
static const void *conv_gemm_columns(bool bf16, const float *a, float *col, size_t n) {
    if (!bf16) return a;
    if (a != col) return bf16_copy(SLOT_INPUT, a, n);
    bf16_store(col, n, col);
    return col;
}

// ================================================================ conv2d

// How a convolution is split into GEMMs. The work size and the ops compute the same plan, so the
// slices they carve out of `work` always agree.
typedef struct {
    int p, q;             // output height, width
    size_t pq, crr;       // output positions per image; rows of the im2col matrix (C*R*R)
    int group;            // images per GEMM (G)
    int threads;          // OpenMP threads = workspace slices
    int chunks;           // ceil(N / G)
    bool direct;          // 1x1, stride 1, no padding, G == 1: the image IS its im2col matrix
    size_t col_floats;    // per thread: (C*R*R, G*P*Q)
    size_t stage_floats;  // per thread: (K, G*P*Q), only when G > 1 (the GEMM output before scatter)
} ConvPlan;

// Thread t's slice of `work`: its im2col matrix (col_floats), then its staging (stage_floats).
static float *conv_thread_col(const ConvPlan *pl, float *work, int t) {
    return work + (size_t)t * (pl->col_floats + pl->stage_floats);
}

// The images of the group that starts at image n0: G, or fewer for the last group.
static int conv_group_images(const Conv2dDims *s, const ConvPlan *pl, int n0) {
    return s->n - n0 < pl->group ? s->n - n0 : pl->group;
}

static void conv_check_dims(const Conv2dDims *s) {
    CHECK(s->n > 0 && s->c > 0 && s->h > 0 && s->w > 0 && s->k > 0 && s->r > 0,
          "conv2d: every dimension (n, c, h, w, k, r) must be positive");
    CHECK(s->stride > 0 && s->pad >= 0, "conv2d: stride must be >= 1 and pad >= 0");
    CHECK(s->h + 2 * s->pad >= s->r && s->w + 2 * s->pad >= s->r,
          "conv2d: the kernel is larger than the padded input (input too small for this layer)");
}

// Threads a convolution may use from the calling thread: its OpenMP budget, at most the cores.
static int conv_call_threads(void) {
    int t = omp_get_max_threads(), procs = omp_get_num_procs();
    return t < procs ? t : procs;
}

static ConvPlan conv_plan_for(const Conv2dDims *s, int threads) {
    conv_check_dims(s);
    ConvPlan pl;
    pl.p = conv2d_out_h(s);
    pl.q = conv2d_out_w(s);
    pl.pq = (size_t)pl.p * (size_t)pl.q;
    pl.crr = (size_t)s->c * (size_t)s->r * (size_t)s->r;
    if (threads > s->n) threads = s->n;
    if (threads < 1) threads = 1;
    // Enough images for CONV_TARGET_COLS columns, but keep at least one group per thread.
    size_t g = (CONV_TARGET_COLS + pl.pq - 1) / pl.pq;
    g = min_size(g, (size_t)((s->n + threads - 1) / threads));
    while (g > 1 && pl.crr * g * pl.pq > CONV_MAX_COL_FLOATS) g--;
    pl.group = (int)g;
    pl.chunks = (s->n + pl.group - 1) / pl.group;
    pl.threads = threads < pl.chunks ? threads : pl.chunks;
    pl.direct = s->r == 1 && s->stride == 1 && s->pad == 0 && pl.group == 1;
    pl.col_floats = pl.direct ? 0 : pl.crr * g * pl.pq;
    pl.stage_floats = pl.group > 1 ? (size_t)s->k * g * pl.pq : 0;
    return pl;
}

static ConvPlan conv_plan(const Conv2dDims *s) { return conv_plan_for(s, conv_call_threads()); }

static size_t conv_plan_work_floats(const ConvPlan *pl, const Conv2dDims *s) {
    return (size_t)pl->threads * (pl->col_floats + pl->stage_floats) + (size_t)(pl->threads - 1) * (size_t)s->k * pl->crr;
}

// Layout of `work`: per thread [col | stage], then (threads - 1) private dW partial sums (K, C*R*R):
// thread 0 accumulates straight into dw, the others into their own partial, summed at the end.
// The plan depends on the calling thread's OpenMP budget, and a model may be sized on one thread and
// run on another (lesson 02 runs each replica on its own thread, with its own budget): so the size is
// the largest over every budget from 1 thread to all cores. It never grows when n shrinks either, so a
// buffer sized for the largest batch fits every smaller one.
size_t conv2d_work_floats_cpu(const Conv2dDims *s) {
    size_t most = 0;
    for (int t = 1; t <= omp_get_num_procs(); t++) {
        ConvPlan pl = conv_plan_for(s, t);
        size_t need = conv_plan_work_floats(&pl, s);
        if (need > most) most = need;
    }
    // Sized for Winograd too whether or not it is switched on now, so KIT_WINOGRAD may change mid-run.
    if (winograd_eligible(s)) most = winograd_work_floats(s) > most ? winograd_work_floats(s) : most;
    return most;
}

// One row of col for a stride-1 layer whose output is as wide as its input (Q == W: 3x3 pad 1): dst (P, W)
// = the channel xc (H, W) shifted by di rows and dj columns. Its valid rows are then ONE contiguous slice of
// xc, copied in one go; the shift wraps a column round from the neighbouring row at each edge, and those
// columns (q < q_lo, q >= q_hi) are then set to the padding's 0. One long copy instead of one per output row:
// the per-row copies of 14 floats cost as much as the weight gradient's GEMM on a 14x14 layer.
static void im2col_row_shifted(const float *xc, int H, int W, int P, int di, int dj, int q_lo, int q_hi,
                               float *dst) {
    const int p_lo = di < 0 ? -di : 0, p_hi = H - di < P ? H - di : P;
    if (p_hi <= p_lo) {  // every row in the padding
        memset(dst, 0, (size_t)P * W * sizeof *dst);
        return;
    }
    memset(dst, 0, (size_t)p_lo * W * sizeof *dst);
    memset(dst + (size_t)p_hi * W, 0, (size_t)(P - p_hi) * W * sizeof *dst);
    // dst[p*W + q] = xc[(p + di)*W + q + dj] for the valid rows; clipped to xc's ends (what the clip leaves
    // out lies in the edge columns, zeroed below).
    ptrdiff_t from = (ptrdiff_t)(p_lo + di) * W + dj, to = (ptrdiff_t)(p_hi + di) * W + dj;
    const ptrdiff_t skip = from < 0 ? -from : 0, end = (ptrdiff_t)H * W;
    if (to > end) to = end;
    if (to > from + skip)  // (not when a kernel wider than the map shifts every column off it)
        memcpy(dst + (size_t)p_lo * W + skip, xc + from + skip, (size_t)(to - from - skip) * sizeof *dst);
    for (int p = p_lo; p < p_hi; p++) {
        float *row = dst + (size_t)p * W;
        for (int q = 0; q < q_lo; q++) row[q] = 0.0f;
        for (int q = q_hi; q < W; q++) row[q] = 0.0f;
    }
}

// One image x (C, H, W) -> rows (C*R*R) of col, written at column offset `at` of rows `ld` long.
// Row (c, i, j) holds x[c][p*stride - pad + i][q*stride - pad + j] for every output (p, q); 0 in the padding.
static void im2col_image(const Conv2dDims *s, const ConvPlan *pl, const float *x, float *col, size_t ld,
                         size_t at) {
    const int H = s->h, W = s->w, R = s->r, S = s->stride, PAD = s->pad, P = pl->p, Q = pl->q;
    for (int c = 0; c < s->c; c++) {
        const float *xc = x + (size_t)c * H * W;
        for (int i = 0; i < R; i++) {
            for (int j = 0; j < R; j++) {
                float *dst = col + ((size_t)(c * R + i) * R + j) * ld + at;
                // Valid output columns q: 0 <= q*S - PAD + j < W.
                int q_lo = 0, q_hi = Q;
                while (q_lo < Q && q_lo * S - PAD + j < 0) q_lo++;
                while (q_hi > q_lo && (q_hi - 1) * S - PAD + j >= W) q_hi--;
                if (S == 1 && Q == W) {
                    im2col_row_shifted(xc, H, W, P, i - PAD, j - PAD, q_lo, q_hi, dst);
                    continue;
                }
                for (int p = 0; p < P; p++, dst += Q) {
                    int hh = p * S - PAD + i;
                    if (hh < 0 || hh >= H) {
                        memset(dst, 0, (size_t)Q * sizeof *dst);
                        continue;
                    }
                    const float *src = xc + (size_t)hh * W + (j - PAD);
                    for (int q = 0; q < q_lo; q++) dst[q] = 0.0f;
                    if (S == 1) {
                        memcpy(dst + q_lo, src + q_lo, (size_t)(q_hi - q_lo) * sizeof *dst);
                    } else {
                        for (int q = q_lo; q < q_hi; q++) dst[q] = src[(size_t)q * S];
                    }
                    for (int q = q_hi; q < Q; q++) dst[q] = 0.0f;
                }
            }
        }
    }
}

// The adjoint of im2col_image: dx (C, H, W) += every column entry, back at the pixel it came from.
// Overlapping receptive fields add up, which is exactly the chain rule for a shared input pixel.
static void col2im_image(const Conv2dDims *s, const ConvPlan *pl, const float *col, size_t ld, size_t at,
                         float *dx) {
    const int H = s->h, W = s->w, R = s->r, S = s->stride, PAD = s->pad, P = pl->p, Q = pl->q;
    for (int c = 0; c < s->c; c++) {
        float *dxc = dx + (size_t)c * H * W;
        for (int i = 0; i < R; i++) {
            for (int j = 0; j < R; j++) {
                const float *src = col + ((size_t)(c * R + i) * R + j) * ld + at;
                int q_lo = 0, q_hi = Q;
                while (q_lo < Q && q_lo * S - PAD + j < 0) q_lo++;
                while (q_hi > q_lo && (q_hi - 1) * S - PAD + j >= W) q_hi--;
                for (int p = 0; p < P; p++, src += Q) {
                    int hh = p * S - PAD + i;
                    if (hh < 0 || hh >= H) continue;  // padding: no pixel to send the gradient to
                    float *dst = dxc + (size_t)hh * W + (j - PAD);
                    if (S == 1) {
#pragma omp simd
                        for (int q = q_lo; q < q_hi; q++) dst[q] += src[q];
                    } else {
                        for (int q = q_lo; q < q_hi; q++) dst[(size_t)q * S] += src[q];
                    }
                }
            }
        }
    }
}

// im2col of a group of g images, side by side: col (C*R*R, g*P*Q).
static void im2col_group(const Conv2dDims *s, const ConvPlan *pl, const float *x, int g, float *col) {
    const size_t img = (size_t)s->c * s->h * s->w, ld = (size_t)g * pl->pq;
    for (int n = 0; n < g; n++) im2col_image(s, pl, x + n * img, col, ld, n * pl->pq);
}

static void col2im_group(const Conv2dDims *s, const ConvPlan *pl, const float *col, int g, float *dx) {
    const size_t img = (size_t)s->c * s->h * s->w, ld = (size_t)g * pl->pq;
    for (int n = 0; n < g; n++) col2im_image(s, pl, col, ld, n * pl->pq, dx + n * img);
}

// Fewer images than threads (batch-1 inference, lesson 06): splitting by image would leave threads idle, so the
// threads share each image's GEMM y (K, P*Q) = w (K, C*R*R) @ col (C*R*R, P*Q), by output columns when the map is
// the larger side (thread t: y[:, c0:c1] = w @ col[:, c0:c1]) or by output channels when the filters are (late
// layers: 512 channels of a 4 x 4 map; thread t: y[k0:k1, :] = w[k0:k1, :] @ col, so each thread packs only its
// share of the filters instead of all of them). Every output element is still the same dot product over C*R*R; a
// thread's smaller GEMM may take another OpenBLAS kernel (its small-matrix one), so the result is the image split's
// up to rounding (tests/test_ops.c: test_conv_forward_thread_split), and for a given thread count always the same.
static void conv2d_forward_split(const Conv2dDims *s, const ConvPlan *pl, int threads, const float *x,
                                 const float *w, const float *b, float *y, float *col) {
    const int K = s->k;
    const size_t x_img = (size_t)s->c * s->h * s->w, y_img = (size_t)K * pl->pq;
    const bool by_rows = (size_t)K > pl->pq;
    // Blocks of whole 16-float vectors (of 16 rows), so each thread's GEMM runs the same full-width kernels.
    const size_t extent = by_rows ? (size_t)K : pl->pq;
    const size_t block = ((extent + (size_t)threads - 1) / (size_t)threads + 15) / 16 * 16;
    for (int n = 0; n < s->n; n++) {
        const float *xn = x + n * x_img;
        float *yn = y + n * y_img;
        if (!pl->direct) im2col_group(s, pl, xn, 1, col);
        const float *a = pl->direct ? xn : col;
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int t = 0; t < threads; t++) {
            const size_t i0 = (size_t)t * block, i1 = min_size(i0 + block, extent);
            if (i0 >= i1) continue;
            // This thread's part: rows k0..k1 by columns c0..c1 of y.
            const size_t k0 = by_rows ? i0 : 0, k1 = by_rows ? i1 : (size_t)K;
            const size_t c0 = by_rows ? 0 : i0, c1 = by_rows ? pl->pq : i1;
            float beta = 0.0f;
            if (b) {
                for (size_t k = k0; k < k1; k++)
                    for (size_t i = c0; i < c1; i++) yn[k * pl->pq + i] = b[k];
                beta = 1.0f;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(k1 - k0), (int)(c1 - c0), (int)pl->crr,
                        1.0f, w + k0 * pl->crr, (int)pl->crr, a + c0, (int)pl->pq, beta, yn + k0 * pl->pq + c0,
                        (int)pl->pq);
        }
    }
}

// With bf16 GEMMs, im2col + GEMM always (Winograd's transforms would round other numbers than the emulation does),
// and the group split below even for few images (the split by rows or columns is a float32 tuning).
void conv2d_forward_cpu(const Conv2dDims *s, const float *x, const float *w, const float *b, float *y,
                        float *work) {
    const bool bf16 = gemm_bf16();
    if (!bf16 && winograd_forward_eligible(s) && winograd_enabled()) {
        winograd_forward(s, x, w, b, y, work);
        return;
    }
    const ConvPlan pl = conv_plan(s);
    blas_single_thread();
    const int call_threads = conv_call_threads();
    const void *wg = bf16 ? bf16_copy(SLOT_WEIGHTS, w, (size_t)s->k * pl.crr) : w;
    if (!bf16 && pl.group == 1 && s->n < call_threads && (pl.pq >= 2 * 16 || s->k >= 2 * 16)) {
        conv2d_forward_split(s, &pl, call_threads, x, w, b, y, work);
        return;
    }
    const int K = s->k;
    const size_t x_img = (size_t)s->c * s->h * s->w, y_img = (size_t)K * pl.pq;
#pragma omp parallel num_threads(pl.threads)
    {
        const int t = omp_get_thread_num();
        float *col = conv_thread_col(&pl, work, t);
        float *stage = col + pl.col_floats;
#pragma omp for schedule(static)
        for (int ch = 0; ch < pl.chunks; ch++) {
            const int n0 = ch * pl.group;
            const int g = conv_group_images(s, &pl, n0);
            const int cols = (int)((size_t)g * pl.pq);
            const float *xg = x + n0 * x_img;
            if (!pl.direct) im2col_group(s, &pl, xg, g, col);
            const float *a = pl.direct ? xg : col;
            // One image: the GEMM writes y[n] (K, P*Q) in place, starting from the bias (beta = 1).
            // A group: it writes stage (K, g*P*Q), scattered into the g images below.
            float *out = pl.group == 1 ? y + n0 * y_img : stage;
            float beta = 0.0f;
            if (pl.group == 1 && b) {
                for (int k = 0; k < K; k++)
                    for (size_t i = 0; i < pl.pq; i++) out[k * pl.pq + i] = b[k];
                beta = 1.0f;
            }
            // out (K, cols) = w (K, C*R*R) @ a (C*R*R, cols)
            gemm_any(bf16, false, false, K, cols, (int)pl.crr, wg, (int)pl.crr,
                     conv_gemm_columns(bf16, a, col, pl.crr * (size_t)cols), cols, beta, out, cols);
            if (pl.group > 1) {
                for (int n = 0; n < g; n++) {
                    for (int k = 0; k < K; k++) {
                        const float *src = stage + (size_t)k * cols + n * pl.pq;
                        float *dst = y + (n0 + n) * y_img + k * pl.pq;
                        const float bk = b ? b[k] : 0.0f;
#pragma omp simd
                        for (size_t i = 0; i < pl.pq; i++) dst[i] = src[i] + bk;
                    }
                }
            }
        }
    }
}

// The prepared filters: Winograd's (winograd_prepare_filters) for the layers whose forward it takes (whatever
// KIT_WINOGRAD says now: it is read on every call); for the others, the filters packed for gemm_small (a whole image
// at most GEMM_SMALL_MAX_COLS output positions: the 4 x 4 maps of ResNet-9's last stage, where OpenBLAS's packing of
// the filters on every call cost more than its multiplications at batch 1); none where neither applies.
static bool conv_packable(const Conv2dDims *s) {
    return (size_t)conv2d_out_h(s) * (size_t)conv2d_out_w(s) <= GEMM_SMALL_MAX_COLS && gemm_small_available();
}

size_t conv2d_prepared_floats_cpu(const Conv2dDims *s) {
    conv_check_dims(s);
    if (winograd_forward_eligible(s)) return winograd_filters_floats(s);
    return conv_packable(s) ? gemm_packed_floats(s->k, s->c * s->r * s->r) : 0;
}

void conv2d_prepare_cpu(const Conv2dDims *s, const float *w, float *prepared) {
    if (winograd_forward_eligible(s)) winograd_prepare_filters(s, w, prepared);
    else if (conv_packable(s)) gemm_pack(s->k, s->c * s->r * s->r, w, s->c * s->r * s->r, prepared);
}

// The forward from filters packed for gemm_small, one image at a time (im2col by the calling thread, then the
// filters' panels shared out between the threads): batches of at most GEMM_SMALL_MAX_COLS output positions.
static void conv2d_forward_packed(const Conv2dDims *s, const float *x, const float *wp, const float *b, float *y,
                                  float *work) {
    const ConvPlan pl = conv_plan(s);
    const int threads = conv_call_threads(), panels = (s->k + GEMM_PANEL - 1) / GEMM_PANEL;
    const size_t x_img = (size_t)s->c * s->h * s->w, y_img = (size_t)s->k * pl.pq;
    for (int n = 0; n < s->n; n++) {
        const float *a = x + n * x_img;  // 1x1, stride 1, no padding: the image is its im2col matrix
        if (!pl.direct) {
            im2col_group(s, &pl, a, 1, work);
            a = work;
        }
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int p = 0; p < panels; p++)
            gemm_small(s->k, (int)pl.pq, (int)pl.crr, wp, a, (int)pl.pq, b, y + n * y_img, (int)pl.pq, p, p + 1);
    }
}

void conv2d_forward_prepared_cpu(const Conv2dDims *s, const float *x, const float *w, const float *prepared,
                                 const float *b, float *y, float *work) {
    if (gemm_bf16()) prepared = NULL;  // the prepared filters are float32 (Winograd's, gemm_small's)
    if (prepared && winograd_forward_eligible(s)) {
        if (winograd_enabled()) winograd_forward_prepared(s, x, prepared, b, y, work);
        else conv2d_forward_cpu(s, x, w, b, y, work);
        return;
    }
    if (prepared && conv_packable(s) && (size_t)s->n * conv2d_out_h(s) * conv2d_out_w(s) <= GEMM_SMALL_MAX_COLS) {
        conv2d_forward_packed(s, x, prepared, b, y, work);
        return;
    }
    conv2d_forward_cpu(s, x, w, b, y, work);
}

// db[k] += sum over images and positions of dy[n][k].
static void conv_bias_grad(const Conv2dDims *s, size_t pq, const float *dy, float *db) {
    const int K = s->k;
#pragma omp parallel for schedule(static) if ((size_t)s->n * K * pq >= PAR_MIN)
    for (int k = 0; k < K; k++) {
        double acc = 0.0;
        for (int n = 0; n < s->n; n++) {
            const float *p = dy + ((size_t)n * K + k) * pq;
            float part = 0.0f;
#pragma omp simd reduction(+ : part)
            for (size_t i = 0; i < pq; i++) part += p[i];
            acc += part;
        }
        db[k] += (float)acc;
    }
}

static void conv2d_backward_cpu_plain(const Conv2dDims *s, const float *x, const float *w, const float *dy,
                                      float *dx, float *dw, float *db, float *work);

void conv2d_backward_cpu(const Conv2dDims *s, const float *x, const float *w, const float *dy, float *dx,
                         float *dw, float *db, float *work) {
    if (!gemm_bf16() && winograd_eligible(s) && winograd_enabled()) {
        // One after the other: each uses all of `work`.
        if (db) conv_bias_grad(s, (size_t)s->h * s->w, dy, db);
        if (dw) winograd_backward_weights(s, x, dy, dw, work);
        if (dx) winograd_backward_data(s, w, dy, dx, work);
        return;
    }
    conv2d_backward_cpu_plain(s, x, w, dy, dx, dw, db, work);
}

// The im2col + GEMM backward: dx through col2im, dW through the same im2col as the forward.
static void conv2d_backward_cpu_plain(const Conv2dDims *s, const float *x, const float *w, const float *dy,
                                      float *dx, float *dw, float *db, float *work) {
    const ConvPlan pl = conv_plan(s);
    if (db) conv_bias_grad(s, pl.pq, dy, db);
    if (!dx && !dw) return;
    blas_single_thread();
    const int K = s->k;
    const size_t x_img = (size_t)s->c * s->h * s->w, y_img = (size_t)K * pl.pq, wn = (size_t)K * pl.crr;
    const bool bf16 = gemm_bf16();
    const void *wg = bf16 && dx ? bf16_copy(SLOT_WEIGHTS, w, wn) : w;
    float *partials = conv_thread_col(&pl, work, pl.threads);  // past every thread's slice
#pragma omp parallel num_threads(pl.threads)
    {
        const int t = omp_get_thread_num();
        float *col = conv_thread_col(&pl, work, t);
        float *stage = col + pl.col_floats;
        float *dwt = NULL;
        if (dw) {
            dwt = t == 0 ? dw : partials + (size_t)(t - 1) * wn;
            if (t > 0) memset(dwt, 0, wn * sizeof *dwt);
        }
#pragma omp for schedule(static)
        for (int ch = 0; ch < pl.chunks; ch++) {
            const int n0 = ch * pl.group;
            const int g = conv_group_images(s, &pl, n0);
            const int cols = (int)((size_t)g * pl.pq);
            const float *xg = x + n0 * x_img;
            // dY of the group as one (K, g*P*Q) matrix: the image's own slice when g == 1, else gathered; for bf16
            // GEMMs, gathered and rounded into the thread's scratch.
            const void *dyg = dy + n0 * y_img;
            if (bf16) {
                const size_t eb = cpu_bf16_elem_bytes();
                unsigned char *d = cpu_bf16_scratch(SLOT_DY, (size_t)K * cols * eb);
                for (int n = 0; n < g; n++)
                    for (int k = 0; k < K; k++)
                        bf16_store(dy + (n0 + n) * y_img + k * pl.pq, pl.pq, d + ((size_t)k * cols + n * pl.pq) * eb);
                dyg = d;
            } else if (pl.group > 1) {
                for (int n = 0; n < g; n++)
                    for (int k = 0; k < K; k++)
                        memcpy(stage + (size_t)k * cols + n * pl.pq, dy + (n0 + n) * y_img + k * pl.pq,
                               pl.pq * sizeof *stage);
                dyg = stage;
            }
            if (dw) {
                const float *a = xg;
                if (!pl.direct) {
                    im2col_group(s, &pl, xg, g, col);
                    a = col;
                }
                // dW (K, C*R*R) += dY (K, cols) @ col^T (cols, C*R*R): each weight meets every position.
                gemm_any(bf16, false, true, K, (int)pl.crr, cols, dyg, cols,
                         conv_gemm_columns(bf16, a, col, pl.crr * (size_t)cols), cols, 1.0f, dwt, (int)pl.crr);
            }
            if (dx) {
                if (pl.direct) {
                    // 1x1: dx[n] (C, H*W) += w^T (C, K) @ dY (K, H*W), no col2im needed.
                    gemm_any(bf16, true, false, s->c, cols, K, wg, (int)pl.crr, dyg, cols, 1.0f, dx + n0 * x_img,
                             cols);
                } else {
                    // dcol (C*R*R, cols) = w^T (C*R*R, K) @ dY (K, cols), then scattered back: dx += col2im(dcol).
                    gemm_any(bf16, true, false, (int)pl.crr, cols, K, wg, (int)pl.crr, dyg, cols, 0.0f, col, cols);
                    col2im_group(s, &pl, col, g, dx + n0 * x_img);
                }
            }
        }
        // Sum the other threads' partial dW into dw (the implicit barrier above made them complete).
        if (dw && pl.threads > 1) {
#pragma omp for schedule(static)
            for (size_t i = 0; i < wn; i++) {
                float acc = 0.0f;
                for (int u = 0; u < pl.threads - 1; u++) acc += partials[(size_t)u * wn + i];
                dw[i] += acc;
            }
        }
    }
}

// ================================================================ batch norm

static void bn_check_dims(const BatchNormDims *s) {
    CHECK(s->n > 0 && s->c > 0 && s->hw > 0, "batchnorm: n, c and hw must be positive");
    CHECK(s->eps > 0.0f, "batchnorm: eps must be positive (PyTorch's default is 1e-5)");
}

// `work` holds the sync buffer: 2*C + 1 doubles, at the first 8-byte boundary (hence the + 1 float).
size_t batchnorm_work_floats_cpu(const BatchNormDims *s) {
    bn_check_dims(s);
    return 2 * (2 * (size_t)s->c + 1) + 1;
}

static double *bn_sync_buffer(float *work) {
    uintptr_t p = ((uintptr_t)work + 7u) & ~(uintptr_t)7u;
    return (double *)p;
}

// Fused BN + ReLU (batchnorm_relu_*): the gradient reaching BN's output through the ReLU, computed where
// it is used instead of stored. The mask is applied to dy's bits (all ones or all zeros, +0.0f when
// masked) because GCC will not vectorise a float select feeding a reduction ("control flow in loop").
// `0.0f +` repeats the unfused path's arithmetic exactly (relu_backward adds into a zeroed buffer, which
// turns a -0.0f into +0.0f), so fused and plain agree bit for bit.
static inline float bn_relu_grad(float relu_y, float dy) {
    uint32_t bits;
    memcpy(&bits, &dy, sizeof bits);
    bits &= -(uint32_t)(relu_y > 0.0f);
    float g;
    memcpy(&g, &bits, sizeof g);
    return 0.0f + g;
}

// Per channel c, over (N, HW), in double (a float sum over 100k+ values loses digits, and the
// variance E[x^2] - E[x]^2 would cancel the rest):
//   dy == NULL: sums[c] = sum x,  sums[C + c] = sum x^2
//   dy != NULL: sums[c] = sum dy, sums[C + c] = sum dy * (x - mean[c])   (times invstd later)
//   relu_y != NULL (fused BN + ReLU): dy is the ReLU's output gradient, masked by relu_y > 0 on the fly.
static void bn_channel_sums(const BatchNormDims *s, const float *x, const float *dy, const float *relu_y,
                            const float *mean, double *sums) {
    const int C = s->c;
    const size_t hw = (size_t)s->hw;
#pragma omp parallel for schedule(static) if ((size_t)s->n * C * hw >= PAR_MIN)
    for (int c = 0; c < C; c++) {
        double s1 = 0.0, s2 = 0.0;
        for (int n = 0; n < s->n; n++) {
            const float *px = x + ((size_t)n * C + c) * hw;
            if (dy && relu_y) {
                const float *pg = dy + ((size_t)n * C + c) * hw, *py = relu_y + ((size_t)n * C + c) * hw;
                const double m = mean[c];
#pragma omp simd reduction(+ : s1, s2)
                for (size_t i = 0; i < hw; i++) {
                    const float g = bn_relu_grad(py[i], pg[i]);
                    s1 += g;
                    s2 += (double)g * ((double)px[i] - m);
                }
            } else if (dy) {
                const float *pg = dy + ((size_t)n * C + c) * hw;
                const double m = mean[c];
#pragma omp simd reduction(+ : s1, s2)
                for (size_t i = 0; i < hw; i++) {
                    s1 += pg[i];
                    s2 += (double)pg[i] * ((double)px[i] - m);
                }
            } else {
#pragma omp simd reduction(+ : s1, s2)
                for (size_t i = 0; i < hw; i++) {
                    double v = px[i];
                    s1 += v;
                    s2 += v * v;
                }
            }
        }
        sums[c] = s1;
        sums[C + c] = s2;
    }
}

// y = gamma * (x - mean) * invstd + beta, written as y = x * a + b per channel (one FMA per element).
// relu: y = max(that, 0) in the same pass (fused BN + ReLU), the value relu_forward would compute.
static void bn_apply(const BatchNormDims *s, const float *x, const float *gamma, const float *beta,
                     const float *mean, const float *invstd, bool relu, float *y) {
    const int C = s->c;
    const size_t hw = (size_t)s->hw, planes = (size_t)s->n * C;
#pragma omp parallel for schedule(static) if (planes * hw >= PAR_MIN)
    for (size_t pl = 0; pl < planes; pl++) {
        const int c = (int)(pl % (size_t)C);
        const float a = gamma[c] * invstd[c], b = beta[c] - mean[c] * a;
        const float *src = x + pl * hw;
        float *dst = y + pl * hw;
        if (relu) {
#pragma omp simd
            for (size_t i = 0; i < hw; i++) {
                const float v = src[i] * a + b;
                dst[i] = v > 0.0f ? v : 0.0f;
            }
        } else {
#pragma omp simd
            for (size_t i = 0; i < hw; i++) dst[i] = src[i] * a + b;
        }
    }
}

// Batch statistics (through the sync hook when set), running statistics, then y; relu: fused ReLU.
static void bn_forward_train(const BatchNormDims *s, const float *x, const float *gamma, const float *beta,
                             bool relu, float *y, float *mean, float *invstd, float *running_mean,
                             float *running_var, const BatchNormSync *sync, float *work) {
    bn_check_dims(s);
    const int C = s->c;
    double *buf = bn_sync_buffer(work);  // [sum x (C), sum x^2 (C), count (1)]
    bn_channel_sums(s, x, NULL, NULL, NULL, buf);
    buf[2 * C] = (double)s->n * (double)s->hw;
    if (sync && sync->allreduce_sum) sync->allreduce_sum(buf, 2 * C + 1, sync->ctx);
    const double count = buf[2 * C];
    CHECK(count > 1.0, "batchnorm in training mode needs more than one value per channel "
                       "(a batch of 1 with 1x1 feature maps?)");
    for (int c = 0; c < C; c++) {
        const double m = buf[c] / count;
        double var = buf[C + c] / count - m * m;  // biased: what normalises the batch (as PyTorch)
        if (var < 0.0) var = 0.0;                 // rounding can push a constant channel just below 0
        mean[c] = (float)m;
        invstd[c] = (float)(1.0 / sqrt(var + (double)s->eps));
        if (running_mean && running_var) {
            const double unbiased = var * count / (count - 1.0);  // what PyTorch keeps in running_var
            running_mean[c] = (float)((1.0 - s->momentum) * running_mean[c] + s->momentum * m);
            running_var[c] = (float)((1.0 - s->momentum) * running_var[c] + s->momentum * unbiased);
        }
    }
    bn_apply(s, x, gamma, beta, mean, invstd, relu, y);
}

void batchnorm_forward_train_cpu(const BatchNormDims *s, const float *x, const float *gamma, const float *beta,
                                 float *y, float *mean, float *invstd, float *running_mean, float *running_var,
                                 const BatchNormSync *sync, float *work) {
    bn_forward_train(s, x, gamma, beta, false, y, mean, invstd, running_mean, running_var, sync, work);
}

void batchnorm_relu_forward_train_cpu(const BatchNormDims *s, const float *x, const float *gamma,
                                      const float *beta, float *y, float *mean, float *invstd,
                                      float *running_mean, float *running_var, const BatchNormSync *sync,
                                      float *work) {
    bn_forward_train(s, x, gamma, beta, true, y, mean, invstd, running_mean, running_var, sync, work);
}

void batchnorm_forward_eval_cpu(const BatchNormDims *s, const float *x, const float *gamma, const float *beta,
                                const float *running_mean, const float *running_var, float *y) {
    bn_check_dims(s);
    const int C = s->c;
    const size_t hw = (size_t)s->hw, planes = (size_t)s->n * C;
#pragma omp parallel for schedule(static) if (planes * hw >= PAR_MIN)
    for (size_t pl = 0; pl < planes; pl++) {
        const int c = (int)(pl % (size_t)C);
        const float a = (float)(gamma[c] / sqrt((double)running_var[c] + (double)s->eps));
        const float b = beta[c] - running_mean[c] * a;
        const float *src = x + pl * hw;
        float *dst = y + pl * hw;
#pragma omp simd
        for (size_t i = 0; i < hw; i++) dst[i] = src[i] * a + b;
    }
}

// With xhat = (x - mean) * invstd and M values per channel (over all ranks under SyncBN):
//   dbeta  += sum dy,  dgamma += sum dy * xhat        (local sums: DDP averages parameter gradients)
//   dx     += gamma * invstd * (dy - sum dy / M - xhat * sum(dy * xhat) / M)   (global sums)
// The sync buffer is [sum dy (C), sum dy*xhat (C), count (1)]: the count rides along because backward
// has no other way to learn the global M (mean and invstd do not carry it).
// relu_y != NULL: fused BN + ReLU, dy is the gradient of the ReLU's output relu_y (see bn_relu_grad).
static void bn_backward(const BatchNormDims *s, const float *x, const float *gamma, const float *mean,
                        const float *invstd, const float *dy, const float *relu_y, float *dx, float *dgamma,
                        float *dbeta, const BatchNormSync *sync, float *work) {
    bn_check_dims(s);
    const int C = s->c;
    double *buf = bn_sync_buffer(work);
    bn_channel_sums(s, x, dy, relu_y, mean, buf);
    for (int c = 0; c < C; c++) {
        buf[C + c] *= invstd[c];  // sum dy * (x - mean) -> sum dy * xhat
        if (dbeta) dbeta[c] += (float)buf[c];
        if (dgamma) dgamma[c] += (float)buf[C + c];
    }
    if (!dx) return;  // no input gradient wanted: nothing global to compute (the same on every rank)
    buf[2 * C] = (double)s->n * (double)s->hw;
    if (sync && sync->allreduce_sum) sync->allreduce_sum(buf, 2 * C + 1, sync->ctx);
    const double count = buf[2 * C];
    const size_t hw = (size_t)s->hw, planes = (size_t)s->n * C;
#pragma omp parallel for schedule(static) if (planes * hw >= PAR_MIN)
    for (size_t pl = 0; pl < planes; pl++) {
        const int c = (int)(pl % (size_t)C);
        // dx += A*dy + B*x + D: the formula above expanded per channel, so the loop is two FMAs.
        const double A = (double)gamma[c] * invstd[c];
        const double B = -A * invstd[c] * buf[C + c] / count;
        const double D = -A * buf[c] / count - B * mean[c];
        const float a = (float)A, b = (float)B, d = (float)D;
        const float *g = dy + pl * hw, *xp = x + pl * hw;
        float *out = dx + pl * hw;
        if (relu_y && dx == dy) {  // in place (fused only): 0.0f + ... is what += into a zeroed dx gives
            const float *py = relu_y + pl * hw;
#pragma omp simd
            for (size_t i = 0; i < hw; i++) out[i] = 0.0f + (a * bn_relu_grad(py[i], g[i]) + b * xp[i] + d);
        } else if (relu_y) {
            const float *py = relu_y + pl * hw;
#pragma omp simd
            for (size_t i = 0; i < hw; i++) out[i] += a * bn_relu_grad(py[i], g[i]) + b * xp[i] + d;
        } else {
#pragma omp simd
            for (size_t i = 0; i < hw; i++) out[i] += a * g[i] + b * xp[i] + d;
        }
    }
}

void batchnorm_backward_cpu(const BatchNormDims *s, const float *x, const float *gamma, const float *mean,
                            const float *invstd, const float *dy, float *dx, float *dgamma, float *dbeta,
                            const BatchNormSync *sync, float *work) {
    bn_backward(s, x, gamma, mean, invstd, dy, NULL, dx, dgamma, dbeta, sync, work);
}

void batchnorm_relu_backward_cpu(const BatchNormDims *s, const float *x, const float *gamma, const float *mean,
                                 const float *invstd, const float *y, const float *dy, float *dx, float *dgamma,
                                 float *dbeta, const BatchNormSync *sync, float *work) {
    bn_backward(s, x, gamma, mean, invstd, dy, y, dx, dgamma, dbeta, sync, work);
}

// ================================================================ elementwise

void relu_forward_cpu(size_t n, const float *x, float *y) {
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void relu_backward_cpu(size_t n, const float *y, const float *dy, float *dx) {
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        // Both loads unconditional: a load inside `?:` stops the compiler from vectorising (it may not
        // read dy[i] when the condition is false), and this loop runs over every activation.
        const float g = dy[i], v = y[i];
        dx[i] += v > 0.0f ? g : 0.0f;
    }
}

void add_forward_cpu(size_t n, const float *a, const float *b, float *y) {
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}

void add_inplace_cpu(size_t n, float *dst, const float *src) {
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

// ================================================================ pooling

static void pool_check_dims(int n, int c, int h, int w) {
    CHECK(n > 0 && c > 0 && h >= 2 && w >= 2, "maxpool2: needs n, c > 0 and an input of at least 2x2");
}

// Max-pool in PyTorch's order: the window is scanned row-major (a b / c d) and a value replaces the
// running maximum when it is larger, or when it is NaN (so a NaN propagates instead of hiding).
// Ties keep the first. Written as a select, not a branch, so the loops over a row vectorise.
static inline float pool_max2(float m, float v) { return ((v > m) | (v != v)) ? v : m; }

void maxpool2_forward_cpu(int n, int c, int h, int w, const float *x, float *y) {
    pool_check_dims(n, c, h, w);
    const int ho = h / 2, wo = w / 2;  // odd sizes: the last row / column belongs to no window
    const size_t planes = (size_t)n * c;
#pragma omp parallel for schedule(static) if (planes * h * w >= PAR_MIN)
    for (size_t pl = 0; pl < planes; pl++) {
        const float *xp = x + pl * h * w;
        float *yp = y + pl * ho * wo;
        for (int i = 0; i < ho; i++) {
            const float *r0 = xp + (size_t)(2 * i) * w, *r1 = r0 + w;
            float *out = yp + (size_t)i * wo;
#pragma omp simd
            for (int j = 0; j < wo; j++) {
                float m = r0[2 * j];
                m = pool_max2(m, r0[2 * j + 1]);
                m = pool_max2(m, r1[2 * j]);
                out[j] = pool_max2(m, r1[2 * j + 1]);
            }
        }
    }
}

// One row of windows: input rows r0, r1 (2*wo values used), their gradient rows d0, d1, and dy's row g.
// The window's maximum is recomputed as in the forward; the gradient goes to the FIRST element equal to
// it (the first NaN when it is NaN), which is the element the forward's scan picked. Written as float
// selects on plain comparisons: GCC leaves a loop with an integer winner index scalar, this it vectorises.
static void maxpool2_backward_row(int wo, const float *r0, const float *r1, const float *g, float *d0, float *d1) {
#pragma omp simd
    for (int j = 0; j < wo; j++) {
        const float a = r0[2 * j], b = r0[2 * j + 1], cc = r1[2 * j], d = r1[2 * j + 1];
        const float m = pool_max2(pool_max2(pool_max2(a, b), cc), d);
        float rest = g[j];  // what is still to be routed; windows never overlap, so each input gets one share
        const int ea = (a == m) | (a != a), eb = (b == m) | (b != b), ec = (cc == m) | (cc != cc);
        const float ga = ea ? rest : 0.0f;
        rest = ea ? 0.0f : rest;
        const float gb = eb ? rest : 0.0f;
        rest = eb ? 0.0f : rest;
        const float gc = ec ? rest : 0.0f;
        rest = ec ? 0.0f : rest;
        d0[2 * j] += ga;
        d0[2 * j + 1] += gb;
        d1[2 * j] += gc;
        d1[2 * j + 1] += rest;
    }
}

void maxpool2_backward_cpu(int n, int c, int h, int w, const float *x, const float *y, const float *dy,
                           float *dx) {
    (void)y;  // the argmax is recomputed from x: same answer, nothing to keep in sync
    pool_check_dims(n, c, h, w);
    const int ho = h / 2, wo = w / 2;
    const size_t planes = (size_t)n * c;
#pragma omp parallel for schedule(static) if (planes * h * w >= PAR_MIN)
    for (size_t pl = 0; pl < planes; pl++) {
        for (int i = 0; i < ho; i++) {
            const size_t r = pl * h * w + (size_t)(2 * i) * w;
            maxpool2_backward_row(wo, x + r, x + r + w, dy + pl * ho * wo + (size_t)i * wo, dx + r, dx + r + w);
        }
    }
}

void avgpool_forward_cpu(int n, int c, int hw, const float *x, float *y) {
    CHECK(n > 0 && c > 0 && hw > 0, "avgpool: n, c and hw must be positive");
    const size_t planes = (size_t)n * c;
#pragma omp parallel for schedule(static) if (planes * hw >= PAR_MIN)
    for (size_t pl = 0; pl < planes; pl++) {
        const float *p = x + pl * hw;
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int i = 0; i < hw; i++) acc += p[i];
        y[pl] = acc / (float)hw;
    }
}

void avgpool_backward_cpu(int n, int c, int hw, const float *dy, float *dx) {
    CHECK(n > 0 && c > 0 && hw > 0, "avgpool: n, c and hw must be positive");
    const size_t planes = (size_t)n * c;
#pragma omp parallel for schedule(static) if (planes * hw >= PAR_MIN)
    for (size_t pl = 0; pl < planes; pl++) {
        const float g = dy[pl] / (float)hw;
        float *p = dx + pl * hw;
#pragma omp simd
        for (int i = 0; i < hw; i++) p[i] += g;
    }
}

// ================================================================ linear

void linear_forward_cpu(int n, int in, int out, const float *x, const float *w, const float *b, float *y) {
    CHECK(n > 0 && in > 0 && out > 0, "linear: n, in and out must be positive");
    blas_single_thread();
    float beta = 0.0f;
    if (b) {  // start from the bias, and let the GEMM add onto it
        for (int i = 0; i < n; i++) memcpy(y + (size_t)i * out, b, (size_t)out * sizeof *y);
        beta = 1.0f;
    }
    // y (N, OUT) = x (N, IN) @ w^T (IN, OUT)
    const bool bf16 = gemm_bf16();
    const void *xg = bf16 ? bf16_copy(SLOT_INPUT, x, (size_t)n * in) : x;
    const void *wg = bf16 ? bf16_copy(SLOT_WEIGHTS, w, (size_t)out * in) : w;
    gemm_any(bf16, false, true, n, out, in, xg, in, wg, in, beta, y, out);
}

void linear_backward_cpu(int n, int in, int out, const float *x, const float *w, const float *dy, float *dx,
                         float *dw, float *db) {
    CHECK(n > 0 && in > 0 && out > 0, "linear: n, in and out must be positive");
    blas_single_thread();
    const bool bf16 = gemm_bf16();
    const void *dyg = bf16 && (dx || dw) ? bf16_copy(SLOT_DY, dy, (size_t)n * out) : dy;
    // dx (N, IN) += dy (N, OUT) @ w (OUT, IN)
    if (dx)
        gemm_any(bf16, false, false, n, in, out, dyg, out, bf16 ? bf16_copy(SLOT_WEIGHTS, w, (size_t)out * in) : w,
                 in, 1.0f, dx, in);
    // dw (OUT, IN) += dy^T (OUT, N) @ x (N, IN)
    if (dw)
        gemm_any(bf16, true, false, out, in, n, dyg, out, bf16 ? bf16_copy(SLOT_INPUT, x, (size_t)n * in) : x, in,
                 1.0f, dw, in);
    if (db) {
        for (int o = 0; o < out; o++) {
            double acc = 0.0;
            for (int i = 0; i < n; i++) acc += dy[(size_t)i * out + o];
            db[o] += (float)acc;
        }
    }
}

// ================================================================ loss

static void ce_check(int n, int k, const int *labels, float smoothing) {
    CHECK(n > 0 && k > 0, "cross_entropy: n and k must be positive");
    CHECK(smoothing >= 0.0f && smoothing <= 1.0f, "cross_entropy: label smoothing must be in [0, 1]");
    for (int i = 0; i < n; i++)
        CHECKF(labels[i] >= 0 && labels[i] < k,
               "the dataset has more classes than the model's output: check --classes / the model config",
               "sample %d has label %d, but there are %d classes", i, labels[i], k);
}

// log(sum_j exp(l_j)) computed as m + log(sum_j exp(l_j - m)) with m = max l_j: no overflow, no underflow
// of the largest term.
static double ce_logsumexp(int k, const float *l) {
    float m = l[0];
    for (int j = 1; j < k; j++) m = l[j] > m ? l[j] : m;
    double sum = 0.0;
    for (int j = 0; j < k; j++) sum += exp((double)l[j] - m);
    return m + log(sum);
}

// loss = -sum_j target_j * log softmax_j, target = (1 - s) * onehot(label) + s / K:
//      = lse - (1 - s) * l_label - s * mean_j(l_j)
void cross_entropy_forward_cpu(int n, int k, const float *logits, const int *labels, float smoothing,
                               float *loss) {
    ce_check(n, k, labels, smoothing);
    for (int i = 0; i < n; i++) {
        const float *l = logits + (size_t)i * k;
        const double lse = ce_logsumexp(k, l);
        double mean_l = 0.0;
        for (int j = 0; j < k; j++) mean_l += l[j];
        mean_l /= k;
        loss[i] = (float)(lse - (1.0 - smoothing) * l[labels[i]] - smoothing * mean_l);
    }
}

void cross_entropy_backward_cpu(int n, int k, const float *logits, const int *labels, float smoothing,
                                float scale, float *dlogits) {
    ce_check(n, k, labels, smoothing);
    const double off = (double)smoothing / k;  // the smoothed target's share on every class
    for (int i = 0; i < n; i++) {
        const float *l = logits + (size_t)i * k;
        float *g = dlogits + (size_t)i * k;
        const double lse = ce_logsumexp(k, l);
        for (int j = 0; j < k; j++) {
            const double target = off + (j == labels[i] ? 1.0 - smoothing : 0.0);
            g[j] += (float)(scale * (exp((double)l[j] - lse) - target));
        }
    }
}

void argmax_rows_cpu(int n, int k, const float *logits, int *pred) {
    CHECK(n > 0 && k > 0, "argmax_rows: n and k must be positive");
    for (int i = 0; i < n; i++) {
        const float *l = logits + (size_t)i * k;
        int best = 0;
        for (int j = 1; j < k; j++)
            if (l[j] > l[best]) best = j;  // strict: the first maximum wins ties
        pred[i] = best;
    }
}

// ================================================================ optimizer

void sgd_update_cpu(size_t n, float *param, const float *grad, float *velocity, float lr, float momentum,
                    float weight_decay, int nesterov) {
    CHECK(velocity || momentum == 0.0f, "sgd_update: momentum needs a velocity buffer");
    if (!velocity) {
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
        for (size_t i = 0; i < n; i++) param[i] -= lr * (grad[i] + weight_decay * param[i]);
        return;
    }
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        const float g = grad[i] + weight_decay * param[i];
        const float v = momentum * velocity[i] + g;
        velocity[i] = v;
        param[i] -= lr * (nesterov ? g + momentum * v : v);
    }
}

// ================================================================ low precision

// One element rounded in place (the bits via memcpy: the C way to read a float's representation).
static inline uint32_t lowp_round_one(LowpFormat f, float *x) {
    uint32_t u, r;
    memcpy(&u, x, sizeof u);
    r = lowp_round_bits(f, u);
    memcpy(x, &r, sizeof r);
    return u;
}

void round_lowp_cpu(LowpFormat f, size_t n, float *x, LowpStats *stats) {
    CHECK(f == LOWP_FP32 || f == LOWP_BF16 || f == LOWP_FP16, "round_lowp: unknown format");
    if (!stats) {
        if (f == LOWP_FP32) return;
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
        for (size_t i = 0; i < n; i++) lowp_round_one(f, &x[i]);
        return;
    }
    // The counts read the bits before and after: |x| > 0 (NaN included, as x != 0 is true for it), finite
    // (exponent not all ones), 0 (magnitude bits all zero), inf (exactly the all-ones exponent, no mantissa).
    size_t nonzero = 0, underflow = 0, overflow = 0;
#pragma omp parallel for schedule(static) reduction(+ : nonzero, underflow, overflow) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        uint32_t before = lowp_round_one(f, &x[i]) & 0x7FFFFFFFu, after;
        memcpy(&after, &x[i], sizeof after);
        after &= 0x7FFFFFFFu;
        bool finite = before < 0x7F800000u;
        nonzero += before != 0;
        underflow += finite && before != 0 && after == 0;
        overflow += finite && after == 0x7F800000u;
    }
    stats->nonzero += nonzero;
    stats->underflow += underflow;
    stats->overflow += overflow;
}

void scale_inplace_cpu(size_t n, float *x, float s) {
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

size_t count_nonfinite_cpu(size_t n, const float *x) {
    size_t bad = 0;
#pragma omp parallel for schedule(static) reduction(+ : bad) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) bad += !isfinite(x[i]);
    return bad;
}
