// kit/cuda/conv.cu: conv2d (im2col + cuBLAS SGEMM, a chunk of images per GEMM) and linear (cuBLAS).
//
// cuBLAS is column-major; the kit is row-major. A row-major (M x N) matrix is the same memory as a
// column-major (N x M) one, so every GEMM below is written for the transposed problem. Each call
// says, in row-major terms, which product it computes.
//
// Layout of a chunk of `nc` images in `work` (L = nc * P * Q columns):
//   cols (C*R*R, L)   im2col of the chunk: column n*PQ + pq holds the receptive field of output pq of
//                     image n. The backward pass reuses it for dcols.
//   tmp  (K, L)       the GEMM output before (forward), or dy (backward), in [k][n][pq] order.
// With the images side by side in one matrix, one GEMM covers the whole chunk, and the weight
// gradient's sum over images is the GEMM's own inner sum: no per-image partial results, no atomics.
#include "kit/cuda/cuda_internal.h"
#include "kit/ops_impl.h"

#include <limits.h>

namespace {

struct ConvPlan {
    int p, q, pq;   // output height, width, and their product
    int crr;        // C * R * R: rows of cols
    int chunk;      // images per GEMM
};

// The plan depends only on the dims and the budget, and the chunk never grows when n shrinks, so a
// work buffer sized for max_batch serves every smaller batch.
ConvPlan conv_plan(const Conv2dDims *s) {
    CHECK(s->n >= 1 && s->c >= 1 && s->h >= 1 && s->w >= 1 && s->k >= 1 && s->r >= 1,
          "conv2d: every dimension must be positive");
    CHECK(s->stride >= 1 && s->pad >= 0, "conv2d: stride must be >= 1 and pad >= 0");
    ConvPlan pl;
    // Not `out_h >= 1`: C's division truncates toward zero, so with stride > 1 a kernel up to stride - 1
    // rows larger than the padded input still gives out_h = 1. The CPU refuses that shape; so do we.
    CHECK(s->h + 2 * s->pad >= s->r && s->w + 2 * s->pad >= s->r,
          "conv2d: the kernel is larger than the padded input (input too small for this layer)");
    pl.p = conv2d_out_h(s);
    pl.q = conv2d_out_w(s);
    pl.pq = pl.p * pl.q;
    pl.crr = s->c * s->r * s->r;
    size_t per_image = (size_t)pl.pq * ((size_t)pl.crr + (size_t)s->k);
    size_t chunk = cuda_conv_work_budget() / per_image;
    if (chunk < 1) chunk = 1;
    if (chunk > (size_t)s->n) chunk = (size_t)s->n;
    // cuBLAS takes int dimensions and leading dimensions: L = chunk * PQ must fit (a large budget just
    // gets fewer images per GEMM), and one image's (C*R*R, PQ) matrix must fit too.
    CHECK((size_t)pl.crr * pl.pq <= INT_MAX,
          "conv2d: one image's im2col matrix exceeds 2^31 elements; lower the image size or channels");
    if (chunk > (size_t)INT_MAX / (size_t)pl.pq) chunk = (size_t)INT_MAX / (size_t)pl.pq;
    pl.chunk = (int)chunk;
    return pl;
}

// The chunk of images [n0, n0 + nc) of one pass, and its halves of `work`: cols (CRR, L) then tmp (K, L),
// with L = nc * PQ columns.
struct ConvChunk {
    int nc, L;
    float *cols, *tmp;
};

ConvChunk conv_chunk(const Conv2dDims *s, const ConvPlan &pl, int n0, float *work) {
    ConvChunk c;
    c.nc = s->n - n0 < pl.chunk ? s->n - n0 : pl.chunk;
    c.L = c.nc * pl.pq;
    c.cols = work;
    c.tmp = work + (size_t)pl.crr * c.L;
    return c;
}

// cols[crr][n][pq] = x[n0 + n][c][p*stride - pad + r][q*stride - pad + s'] (0 outside the image).
__global__ void im2col_kernel(Conv2dDims s, ConvPlan pl, int nc, const float *x, float *cols) {
    size_t L = (size_t)nc * pl.pq;
    KIT_GRID_LOOP(i, (size_t)pl.crr * L) {
        int crr = (int)(i / L);
        size_t col = i % L;
        int n = (int)(col / pl.pq), pq = (int)(col % pl.pq);
        int c = crr / (s.r * s.r), r = (crr / s.r) % s.r, t = crr % s.r;
        int ih = (pq / pl.q) * s.stride - s.pad + r;
        int iw = (pq % pl.q) * s.stride - s.pad + t;
        float v = 0.0f;
        if (ih >= 0 && ih < s.h && iw >= 0 && iw < s.w) v = x[(((size_t)n * s.c + c) * s.h + ih) * s.w + iw];
        cols[i] = v;
    }
}

// dx[n][c][ih][iw] += sum of dcols over every (r, t) whose output position reads (ih, iw).
// A gather (one thread per input element) rather than a scatter, so no two threads write one element.
__global__ void col2im_add_kernel(Conv2dDims s, ConvPlan pl, int nc, const float *dcols, float *dx) {
    size_t L = (size_t)nc * pl.pq;
    KIT_GRID_LOOP(i, (size_t)nc * s.c * s.h * s.w) {
        int iw = (int)(i % s.w);
        int ih = (int)((i / s.w) % s.h);
        int c = (int)((i / ((size_t)s.w * s.h)) % s.c);
        int n = (int)(i / ((size_t)s.w * s.h * s.c));
        float sum = 0.0f;
        for (int r = 0; r < s.r; r++) {
            int tp = ih + s.pad - r;  // = p * stride for the output row p that reads ih with kernel row r
            if (tp < 0 || tp % s.stride) continue;
            int p = tp / s.stride;
            if (p >= pl.p) continue;
            for (int t = 0; t < s.r; t++) {
                int tq = iw + s.pad - t;
                if (tq < 0 || tq % s.stride) continue;
                int q = tq / s.stride;
                if (q >= pl.q) continue;
                sum += dcols[(size_t)((c * s.r + r) * s.r + t) * L + (size_t)n * pl.pq + p * pl.q + q];
            }
        }
        dx[i] += sum;
    }
}

// y[n0 + n][k][pq] = tmp[k][n][pq] + b[k]   (b may be NULL)
__global__ void conv_output_kernel(int k_out, ConvPlan pl, int nc, const float *tmp, const float *b,
                                   float *y) {
    size_t L = (size_t)nc * pl.pq;
    KIT_GRID_LOOP(i, (size_t)nc * k_out * pl.pq) {
        int pq = (int)(i % pl.pq);
        int k = (int)((i / pl.pq) % k_out);
        size_t n = i / ((size_t)pl.pq * k_out);
        y[i] = tmp[(size_t)k * L + n * pl.pq + pq] + (b ? b[k] : 0.0f);
    }
}

// tmp[k][n][pq] = dy[n0 + n][k][pq]
__global__ void conv_dy_gather_kernel(int k_out, ConvPlan pl, int nc, const float *dy, float *tmp) {
    size_t L = (size_t)nc * pl.pq;
    KIT_GRID_LOOP(i, (size_t)k_out * L) {
        size_t k = i / L, col = i % L;
        size_t n = col / pl.pq, pq = col % pl.pq;
        tmp[i] = dy[(n * k_out + k) * pl.pq + pq];
    }
}

// db[k] += sum over every image and pixel of dy[n][k][pq]. One block per channel, double accumulator.
__global__ void conv_bias_grad_kernel(int n_img, int k_out, int pq, const float *dy, float *db) {
    __shared__ double shared[KIT_BLOCK];
    int k = blockIdx.x;
    size_t total = (size_t)n_img * pq;
    double s = 0.0;
    for (size_t j = threadIdx.x; j < total; j += blockDim.x) {
        size_t n = j / pq, i = j % pq;
        s += dy[(n * k_out + k) * pq + i];
    }
    s = kit_block_sum(s, shared);
    if (threadIdx.x == 0) db[k] += (float)s;
}

}  // namespace

extern "C" size_t conv2d_work_floats_cuda(const Conv2dDims *s) {
    ConvPlan pl = conv_plan(s);
    return (size_t)pl.chunk * pl.pq * ((size_t)pl.crr + s->k);
}

extern "C" void conv2d_forward_cuda(const Conv2dDims *s, const float *x, const float *w, const float *b,
                                    float *y, float *work) {
    KIT_CHECK_PTR(x);
    KIT_CHECK_PTR(w);
    KIT_CHECK_PTR(y);
    KIT_CHECK_PTR(work);
    ConvPlan pl = conv_plan(s);
    cublasHandle_t blas = cuda_cublas();
    size_t in_image = (size_t)s->c * s->h * s->w, out_image = (size_t)s->k * pl.pq;
    const float one = 1.0f, zero = 0.0f;
    for (int n0 = 0; n0 < s->n; n0 += pl.chunk) {
        const ConvChunk c = conv_chunk(s, pl, n0, work);
        const int nc = c.nc, L = c.L;
        float *cols = c.cols, *tmp = c.tmp;
        KIT_LAUNCH(im2col_kernel, (size_t)pl.crr * L, *s, pl, nc, x + n0 * in_image, cols);
        // Row-major: tmp (K, L) = w (K, CRR) @ cols (CRR, L).
        CUBLAS_CHECK(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, L, s->k, pl.crr, &one, cols, L, w, pl.crr,
                                 &zero, tmp, L));
        KIT_LAUNCH(conv_output_kernel, (size_t)nc * out_image, s->k, pl, nc, tmp, b, y + n0 * out_image);
    }
}

extern "C" void conv2d_backward_cuda(const Conv2dDims *s, const float *x, const float *w, const float *dy,
                                     float *dx, float *dw, float *db, float *work) {
    ConvPlan pl = conv_plan(s);
    KIT_CHECK_PTR(dy);
    if (db) CUDA_LAUNCH(conv_bias_grad_kernel, s->k, KIT_BLOCK, 0, cuda_stream())(s->n, s->k, pl.pq, dy, db);
    if (db) CUDA_CHECK_LAUNCH();
    if (!dx && !dw) return;
    KIT_CHECK_PTR(x);
    KIT_CHECK_PTR(w);
    KIT_CHECK_PTR(work);
    cublasHandle_t blas = cuda_cublas();
    size_t in_image = (size_t)s->c * s->h * s->w, out_image = (size_t)s->k * pl.pq;
    const float one = 1.0f, zero = 0.0f;
    for (int n0 = 0; n0 < s->n; n0 += pl.chunk) {
        const ConvChunk c = conv_chunk(s, pl, n0, work);
        const int nc = c.nc, L = c.L;
        float *cols = c.cols, *tmp = c.tmp;
        KIT_LAUNCH(conv_dy_gather_kernel, (size_t)s->k * L, s->k, pl, nc, dy + n0 * out_image, tmp);
        if (dw) {
            KIT_LAUNCH(im2col_kernel, (size_t)pl.crr * L, *s, pl, nc, x + n0 * in_image, cols);
            // Row-major: dw (K, CRR) += tmp (K, L) @ cols^T (L, CRR): the sum over the chunk's images.
            CUBLAS_CHECK(cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, pl.crr, s->k, L, &one, cols, L, tmp, L,
                                     &one, dw, pl.crr));
        }
        if (dx) {
            // Row-major: dcols (CRR, L) = w^T (CRR, K) @ tmp (K, L). It overwrites cols, which the dw
            // GEMM above has finished reading: both are queued in order on the one compute stream.
            CUBLAS_CHECK(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, L, pl.crr, s->k, &one, tmp, L, w, pl.crr,
                                     &zero, cols, L));
            KIT_LAUNCH(col2im_add_kernel, (size_t)nc * in_image, *s, pl, nc, cols, dx + n0 * in_image);
        }
    }
}

// ---------------------------------------------------------------- linear
namespace {

// y[i][o] += b[o]
__global__ void linear_bias_kernel(size_t total, int out, const float *b, float *y) {
    KIT_GRID_LOOP(i, total) { y[i] += b[i % out]; }
}

// db[o] += sum over rows of dy[i][o]; one thread per output feature, rows in order, double accumulator.
__global__ void linear_bias_grad_kernel(int n, int out, const float *dy, float *db) {
    KIT_GRID_LOOP(o, (size_t)out) {
        double s = 0.0;
        for (int i = 0; i < n; i++) s += dy[(size_t)i * out + o];
        db[o] += (float)s;
    }
}

void linear_check(int n, int in, int out) {
    CHECK(n >= 1 && in >= 1 && out >= 1, "linear: n, in and out must be positive");
}

}  // namespace

extern "C" void linear_forward_cuda(int n, int in, int out, const float *x, const float *w, const float *b,
                                    float *y) {
    linear_check(n, in, out);
    KIT_CHECK_PTR(x);
    KIT_CHECK_PTR(w);
    KIT_CHECK_PTR(y);
    const float one = 1.0f, zero = 0.0f;
    // Row-major: y (N, OUT) = x (N, IN) @ w^T (IN, OUT).
    CUBLAS_CHECK(cublasSgemm(cuda_cublas(), CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, w, in, x, in, &zero, y,
                             out));
    if (b) KIT_LAUNCH(linear_bias_kernel, (size_t)n * out, (size_t)n * out, out, b, y);
}

extern "C" void linear_backward_cuda(int n, int in, int out, const float *x, const float *w, const float *dy,
                                     float *dx, float *dw, float *db) {
    linear_check(n, in, out);
    KIT_CHECK_PTR(dy);
    const float one = 1.0f;
    if (dx) {
        KIT_CHECK_PTR(w);
        // Row-major: dx (N, IN) += dy (N, OUT) @ w (OUT, IN).
        CUBLAS_CHECK(cublasSgemm(cuda_cublas(), CUBLAS_OP_N, CUBLAS_OP_N, in, n, out, &one, w, in, dy, out, &one,
                                 dx, in));
    }
    if (dw) {
        KIT_CHECK_PTR(x);
        // Row-major: dw (OUT, IN) += dy^T (OUT, N) @ x (N, IN).
        CUBLAS_CHECK(cublasSgemm(cuda_cublas(), CUBLAS_OP_N, CUBLAS_OP_T, in, out, n, &one, x, in, dy, out, &one,
                                 dw, in));
    }
    if (db) KIT_LAUNCH(linear_bias_grad_kernel, (size_t)out, n, out, dy, db);
}
