// kit/cuda/conv.cu: conv2d (im2col + cuBLAS SGEMM, a chunk of images per GEMM) and linear (cuBLAS).
//
// cuBLAS is column-major; the kit is row-major. A row-major (M x N) matrix is the same memory as a
// column-major (N x M) one, so every GEMM below is written for the transposed problem. Each call
// says, in row-major terms, which product it computes.
//
// Layout of a chunk of `nc` images in im2col's work (im2col_work: the CUDA context's conv work; L = nc * P * Q
// columns):
//   cols (C*R*R, L)   im2col of the chunk: column n*PQ + pq holds the receptive field of output pq of
//                     image n. The backward pass reuses it for dcols.
//   tmp  (K, L)       the GEMM output before (forward), or dy (backward), in [k][n][pq] order.
// With the images side by side in one matrix, one GEMM covers the whole chunk, and the weight
// gradient's sum over images is the GEMM's own inner sum: no per-image partial results, no atomics.
//
// The GEMM precision (device_gemm_precision, kit/device.h: the one switch) decides how the GEMMs run:
//   fp32  cublasSgemm on float32 buffers (the default)
//   tf32  the conv GEMMs through cublasGemmEx with CUBLAS_COMPUTE_32F_FAST_TF32 (tensor cores; linear stays fp32,
//         as PyTorch's default has it)
//   bf16, fp16  every GEMM input in 2 bytes, written so by the kernel that makes it: im2col writes the columns
//         in 16 bits (cols takes half its float32 bytes), the output-gradient gather writes dy in 16 bits, and
//         the weights are converted from the float32 parameters at each call (into cuda_device_scratch). Then
//         cublasGemmEx with 16-bit A and B, float32 C and CUBLAS_COMPUTE_32F: tensor cores, float32 sums. The
//         conversion rounds to nearest even with kit/ops_dims.h's functions, the same bits round_lowp gives,
//         so the emulated path (round_lowp, then float32) computes the same products.
#include "kit/cuda/conv_cudnn.h"
#include "kit/cuda/cuda_internal.h"
#include "kit/device.h"
#include "kit/ops_impl.h"

#include <limits.h>
#include <stdint.h>

#include <type_traits>

namespace {

// ---------------------------------------------------------------- the GEMM inputs' storage
// GEMM inputs are stored as T = float, Bf16 or Fp16 (cuda_internal.h: kit_store rounds to nearest even).

template <typename T>
__global__ void to_gemm_kernel(size_t n, const float *src, T *dst) {
    KIT_GRID_LOOP(i, n) { dst[i] = kit_store<T>(src[i]); }
}

// src (n floats) as GEMM inputs of type T: src itself for float, else converted into dst.
template <typename T>
const T *gemm_input(const float *src, size_t n, T *dst) {
    if constexpr (sizeof(T) == sizeof(float)) {
        (void)n, (void)dst;
        return src;
    } else {
        KIT_LAUNCH(to_gemm_kernel<T>, n, n, src, dst);
        return dst;
    }
}

// C (m x n, float32) = op(A) op(B) + beta C, column-major, in precision p: A and B are T as p stores them
// (float for fp32 and tf32, Bf16 or Fp16). fp32 is cublasSgemm, exactly as before there were precisions.
void gemm(GemmPrecision p, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void *A, int lda,
          const void *B, int ldb, float beta, float *C, int ldc) {
    const float one = 1.0f;
    cublasHandle_t blas = cuda_cublas();
    if (p == GEMM_FP32) {
        CUBLAS_CHECK(cublasSgemm(blas, ta, tb, m, n, k, &one, (const float *)A, lda, (const float *)B, ldb, &beta,
                                 C, ldc));
        return;
    }
    cudaDataType t = p == GEMM_BF16 ? CUDA_R_16BF : p == GEMM_FP16 ? CUDA_R_16F : CUDA_R_32F;
    cublasComputeType_t compute = p == GEMM_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    CUBLAS_CHECK(cublasGemmEx(blas, ta, tb, m, n, k, &one, A, t, lda, B, t, ldb, &beta, C, CUDA_R_32F, ldc, compute,
                              CUBLAS_GEMM_DEFAULT));
}

struct ConvPlan {
    int p, q, pq;   // output height, width, and their product
    int crr;        // C * R * R: rows of cols
    int chunk;      // images per GEMM
    int hw;         // H * W: one input plane
    // Dividers for the index kernels (cuda_internal.h): by P*Q (column -> image), Q (-> output row),
    // W (input position -> input row), C (plane -> image) and the stride (col2im's first kernel row).
    KitDiv div_pq, div_q, div_w, div_c, div_stride;
};

// The plan depends only on the dims and the budget; its chunk is at most s->n images.
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
    // The index kernels count a chunk's planes (nc * C) in 32 bits, and positions within a plane too.
    if (chunk > (size_t)INT_MAX / (size_t)s->c) chunk = (size_t)INT_MAX / (size_t)s->c;
    CHECK((size_t)s->h * s->w <= INT_MAX && (size_t)s->h + 2 * (size_t)s->pad <= INT_MAX / 2 &&
              (size_t)s->w + 2 * (size_t)s->pad <= INT_MAX / 2,
          "conv2d: an input plane exceeds 2^31 elements; lower the image size");
    pl.chunk = (int)chunk;
    pl.hw = s->h * s->w;
    pl.div_pq = kit_div_make(pl.pq);
    pl.div_q = kit_div_make(pl.q);
    pl.div_w = kit_div_make(s->w);
    pl.div_c = kit_div_make(s->c);
    pl.div_stride = kit_div_make(s->stride);
    return pl;
}

// The chunk of images [n0, n0 + nc) of one pass, and its halves of im2col's work: cols (CRR, L) then tmp (K, L),
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

// The storage types of a kernel that reads In and writes Out, in one type argument (a launch macro sees no comma).
// im2col reads the input (float, or the 16-bit activations of 16-bit storage, conv2d_forward_act16_cuda) and
// writes the columns (the GEMM input type); the output-gradient gather reads dy and writes the GEMM input type.
template <typename In, typename Out>
struct InOut {
    using in = In;
    using out = Out;
};

// cols[crr][n][pq] = x[n0 + n][c][p*stride - pad + r][q*stride - pad + s'] (0 outside the image), stored as
// IO::out (float32, or a 16-bit GEMM input: see the top).
// Grid: x over the chunk's L columns (n, p, q), y over input channels. A thread finds (n, p, q) once, with
// two KitDivs, then writes the R*R rows of each of its channels: consecutive threads write consecutive
// columns (coalesced) and, at stride 1, read consecutive input columns.
template <typename IO>
__global__ void im2col_kernel(Conv2dDims s, ConvPlan pl, int nc, const typename IO::in *x, typename IO::out *cols) {
    using Col = typename IO::out;
    const unsigned L = (unsigned)nc * (unsigned)pl.pq;  // <= INT_MAX: conv_plan
    const int rr = s.r * s.r;
    KIT_LOOP_X(col, L) {
        const unsigned n = kit_div(col, pl.div_pq), pq = col - n * (unsigned)pl.pq;
        const unsigned p = kit_div(pq, pl.div_q);
        const int ih0 = (int)p * s.stride - s.pad, iw0 = (int)(pq - p * (unsigned)pl.q) * s.stride - s.pad;
        KIT_LOOP_Y(c, s.c) {
            const typename IO::in *plane = x + ((size_t)n * s.c + c) * (size_t)pl.hw;
            Col *dst = cols + (size_t)c * rr * L + col;  // row (c, 0, 0); each (r, t) is the next row
            for (int r = 0; r < s.r; r++) {
                const int ih = ih0 + r;
                const bool row_in = ih >= 0 && ih < s.h;
                for (int t = 0; t < s.r; t++, dst += L) {
                    const int iw = iw0 + t;
                    *dst = kit_store<Col>(row_in && iw >= 0 && iw < s.w ? kit_load(plane[ih * s.w + iw]) : 0.0f);
                }
            }
        }
    }
}

// dx[n][c][ih][iw] += sum of dcols over every (r, t) whose output position reads (ih, iw).
// A gather (one thread per input element) rather than a scatter, so no two threads write one element.
// Grid: x over the positions of a plane, y over the chunk's nc * C planes. Output row p reads input row ih
// with kernel row r when ih + pad - r = p * stride: those r are r0, r0 + stride, ... with
// r0 = (ih + pad) % stride, and p falls by one at each step. So one KitDiv per dimension and thread
// replaces the division per kernel tap; the taps are summed in the same order as always (r, then t,
// ascending), so the result is the same bit for bit.
template <typename X>
__global__ void col2im_add_kernel(Conv2dDims s, ConvPlan pl, int nc, const float *dcols, X *dx) {
    const size_t L = (size_t)nc * pl.pq;
    const unsigned planes = (unsigned)nc * (unsigned)s.c;  // <= INT_MAX: conv_plan
    const unsigned stride = (unsigned)s.stride;
    KIT_LOOP_X(i, pl.hw) {
        const unsigned ih = kit_div(i, pl.div_w), iw = i - ih * (unsigned)s.w;
        const unsigned th = ih + s.pad, tw = iw + s.pad;
        const unsigned ph = kit_div(th, pl.div_stride), qw = kit_div(tw, pl.div_stride);  // p, q for r0, t0
        const int r0 = (int)(th - ph * stride), t0 = (int)(tw - qw * stride);
        KIT_LOOP_Y(plane, planes) {
            const unsigned n = kit_div(plane, pl.div_c), c = plane - n * (unsigned)s.c;
            const float *src = dcols + (size_t)c * s.r * s.r * L + (size_t)n * pl.pq;
            float sum = 0.0f;
            int p = (int)ph;
            for (int r = r0; r < s.r && p >= 0; r += s.stride, p--) {
                if (p >= pl.p) continue;
                int q = (int)qw;
                for (int t = t0; t < s.r && q >= 0; t += s.stride, q--) {
                    if (q >= pl.q) continue;
                    sum += src[(size_t)(r * s.r + t) * L + p * pl.q + q];
                }
            }
            kit_add_to(&dx[(size_t)plane * pl.hw + i], sum);
        }
    }
}

// y[n0 + n][k][pq] = tmp[k][n][pq] + b[k]   (b may be NULL), stored as T (float, or 16-bit activations)
// Grid: x over the chunk's L columns, y over output channels: reads and writes both run along pq.
template <typename T>
__global__ void conv_output_kernel(int k_out, ConvPlan pl, int nc, const float *tmp, const float *b, T *y) {
    const unsigned L = (unsigned)nc * (unsigned)pl.pq;
    KIT_LOOP_X(col, L) {
        const unsigned n = kit_div(col, pl.div_pq), pq = col - n * (unsigned)pl.pq;
        KIT_LOOP_Y(k, k_out) {
            y[((size_t)n * k_out + k) * pl.pq + pq] = kit_store<T>(tmp[(size_t)k * L + col] + (b ? b[k] : 0.0f));
        }
    }
}

// y[n][k][pq] += b[k], float32 y: the bias after cuDNN's forward (the same float32 sum as conv_output_kernel's).
// Grid: x over a plane's pixels, y over the channels; each thread walks the images.
__global__ void conv_bias_add_kernel(int n_img, int k_out, int pq, const float *b, float *y) {
    KIT_LOOP_X(i, pq) {
        KIT_LOOP_Y(k, k_out) {
            const float bk = b[k];
            for (int n = 0; n < n_img; n++) y[((size_t)n * k_out + k) * pq + i] += bk;
        }
    }
}

// tmp[k][n][pq] = dy[n0 + n][k][pq], dy read as IO::in, tmp stored as IO::out; the same grid as conv_output_kernel.
template <typename IO>
__global__ void conv_dy_gather_kernel(int k_out, ConvPlan pl, int nc, const typename IO::in *dy, typename IO::out *tmp) {
    const unsigned L = (unsigned)nc * (unsigned)pl.pq;
    KIT_LOOP_X(col, L) {
        const unsigned n = kit_div(col, pl.div_pq), pq = col - n * (unsigned)pl.pq;
        KIT_LOOP_Y(k, k_out) {
            tmp[(size_t)k * L + col] = kit_store<typename IO::out>(kit_load(dy[((size_t)n * k_out + k) * pl.pq + pq]));
        }
    }
}

// db[k] += sum over every image and pixel of dy[n][k][pq]. One block per channel, double accumulator.
// j runs over (n, pq) in 32 bits (the caller checked N * PQ < 2^31), split with a KitDiv.
template <typename T>
__global__ void conv_bias_grad_kernel(int n_img, int k_out, int pq, KitDiv div_pq, const T *dy, float *db) {
    __shared__ double shared[KIT_BLOCK];
    int k = blockIdx.x;
    const unsigned total = (unsigned)n_img * (unsigned)pq;
    double s = 0.0;
    for (unsigned j = threadIdx.x; j < total; j += blockDim.x) {
        const unsigned n = kit_div(j, div_pq), i = j - n * (unsigned)pq;
        s += kit_load(dy[((size_t)n * k_out + k) * pq + i]);
    }
    s = kit_block_sum(s, shared);
    if (threadIdx.x == 0) db[k] += (float)s;
}

}  // namespace

// None: conv's work on CUDA is the context's (cuda_conv_work), sized by the pass that runs (cuda_context.h says why).
// The shape is checked here all the same, as the CPU's work size checks it, so a model refuses a bad layer when it
// is built.
extern "C" size_t conv2d_work_floats_cuda(const Conv2dDims *s) {
    (void)conv_plan(s);
    return 0;
}

namespace {

// The format of GEMM precision p's inputs, for kit_with_type (fp32 and tf32 read float32 buffers).
LowpFormat gemm_format(GemmPrecision p) {
    return p == GEMM_BF16 ? LOWP_BF16 : p == GEMM_FP16 ? LOWP_FP16 : LOWP_FP32;
}

// dst (n, stored as IO::out) += src (n, stored as IO::in), the sum in float32 rounded once to dst's type: a 16-bit
// weight gradient (cuDNN's) into the float32 one, or linear's float32 dx into 16-bit activations' gradient.
template <typename IO>
__global__ void add_into_kernel(size_t n, const typename IO::in *src, typename IO::out *dst) {
    KIT_GRID_LOOP(i, n) { kit_add_to(&dst[i], kit_load(src[i])); }
}

// The storage format of type G, for cuDNN's descriptors.
template <typename G>
LowpFormat format_of() {
    return std::is_same<G, Bf16>::value ? LOWP_BF16 : std::is_same<G, Fp16>::value ? LOWP_FP16 : LOWP_FP32;
}

// A 16-bit G's inputs that conv2d converts itself, in this thread's device scratch (cuda_context.h), each part on a
// 16-byte boundary: w (the weights, nw), dw (room for cuDNN's 16-bit weight gradient, nw, when with_dw) and x (nx:
// the float32 input batch as G, when cuDNN reads it). For a float32 G every part is null: nothing is converted.
template <typename G>
struct Scratch16 {
    G *w = nullptr, *dw = nullptr, *x = nullptr;
    size_t nx = 0;
    Scratch16(size_t nw, size_t nx_, bool with_dw) : nx(nx_) {
        if (sizeof(G) != 2) return;
        const size_t nw_at = (nw + 7) / 8 * 8;
        G *base = (G *)cuda_device_scratch((nw_at * (with_dw ? 2 : 1) + nx) * sizeof(G));
        w = base;
        if (with_dw) dw = base + nw_at;
        if (nx) x = base + nw_at * (with_dw ? 2 : 1);
    }
};

// x as cuDNN reads it, in G: x itself when it is stored so; the model's float32 input batch under 16-bit storage
// (In float, G 16-bit) converted into sc.x, rounded to nearest even as im2col rounds its columns, so the products
// are the im2col path's.
template <typename G, typename In>
const G *cudnn_x(const In *x, const Scratch16<G> &sc) {
    if constexpr (std::is_same<In, G>::value) {
        return x;
    } else {
        static_assert(std::is_same<In, float>::value && sizeof(G) == 2, "cudnn_x: float32 x with a 16-bit G");
        return gemm_input<G>(x, sc.nx, sc.x);
    }
}

// im2col's work for a pass over s: one chunk's columns and GEMM output (ConvChunk), taken from the context's conv
// work only when a pass runs here, so a run that cuDNN takes whole never holds it.
float *im2col_work(const Conv2dDims *s, const ConvPlan &pl) {
    return (float *)cuda_conv_work((size_t)pl.chunk * pl.pq * ((size_t)pl.crr + s->k) * sizeof(float));
}

// 16-bit activation storage (conv2d_forward_act16_cuda) stores activations in the format the GEMMs read.
void act16_check(LowpFormat f) {
    CHECKF(f == LOWP_BF16 || f == LOWP_FP16, "16-bit activation storage is bf16 or fp16", "format %d", (int)f);
    CHECKF(gemm_format(device_gemm_precision(DEVICE_CUDA)) == f,
           "16-bit activations feed the GEMMs as they are: set the GEMM precision to the same format first "
           "(device_set_gemm_precision, kit/device.h)",
           "activations in %s, GEMMs in %s", f == LOWP_BF16 ? "bf16" : "fp16",
           gemm_precision_name(device_gemm_precision(DEVICE_CUDA)));
}

// The forward with GEMM inputs of type G (see the top), input x stored as In and output y as Out (float, or
// 16-bit activations). With a 16-bit G, cols holds 2-byte columns in the first half of its float32 space, and
// the weights go to this thread's device scratch.
template <typename G, typename In, typename Out>
void conv_forward_as(GemmPrecision p, const Conv2dDims *s, const ConvPlan &pl, const In *x, const float *w,
                     const float *b, Out *y) {
    using IO = InOut<In, G>;
    size_t in_image = (size_t)s->c * s->h * s->w, out_image = (size_t)s->k * pl.pq, nw = (size_t)s->k * pl.crr;
    // cuDNN (conv_cudnn.h) when y and the GEMM inputs share one type, and x does too or is the float32 input batch
    // (cudnn_x). A bias on a 16-bit y stays here: added after cuDNN's rounded output it would round twice, where
    // conv_output_kernel rounds the sum once.
    const bool on_cudnn = std::is_same<Out, G>::value && (!b || sizeof(G) == sizeof(float)) && cudnn_conv_wanted();
    const Scratch16<G> sc(nw, on_cudnn && !std::is_same<In, G>::value ? (size_t)s->n * in_image : 0, false);
    const G *wt = gemm_input<G>(w, nw, sc.w);
    if (on_cudnn &&
        cudnn_conv_forward(format_of<G>(), CONV_NCHW, s, cudnn_x<G>(x, sc), wt, y)) {
        if (b) KIT_LAUNCH_2D(conv_bias_add_kernel, pl.pq, s->k, s->n, s->k, pl.pq, b, (float *)y);
        return;
    }
    float *work = im2col_work(s, pl);
    for (int n0 = 0; n0 < s->n; n0 += pl.chunk) {
        const ConvChunk c = conv_chunk(s, pl, n0, work);
        const int nc = c.nc, L = c.L;
        G *cols = (G *)c.cols;
        float *tmp = c.tmp;
        KIT_LAUNCH_2D(im2col_kernel<IO>, L, s->c, *s, pl, nc, x + n0 * in_image, cols);
        // Row-major: tmp (K, L) = w (K, CRR) @ cols (CRR, L).
        gemm(p, CUBLAS_OP_N, CUBLAS_OP_N, L, s->k, pl.crr, cols, L, wt, pl.crr, 0.0f, tmp, L);
        KIT_LAUNCH_2D(conv_output_kernel<Out>, L, s->k, s->k, pl, nc, tmp, b, y + n0 * out_image);
    }
}

// The backward's GEMMs with inputs of type G, the forward's input x stored as In, dy and dx as T. With a 16-bit
// G the gathered dy (K, L) takes the first half of tmp, the columns the first half of cols, and dcols (float32, the
// dx GEMM's output) all of cols, as in float32.
template <typename G, typename In, typename T>
void conv_backward_as(GemmPrecision p, const Conv2dDims *s, const ConvPlan &pl, const In *x, const float *w,
                      const T *dy, T *dx, float *dw) {
    using IO = InOut<In, G>;
    using DyIO = InOut<T, G>;
    size_t in_image = (size_t)s->c * s->h * s->w, out_image = (size_t)s->k * pl.pq, nw = (size_t)s->k * pl.crr;
    // cuDNN (conv_cudnn.h) for each pass it takes, when dy, dx and the GEMM inputs share one type, and x does too
    // or is the float32 input batch (cudnn_x). Its dw is in that type too: float32 is added into dw by cuDNN
    // (beta 1); a 16-bit one, the pass's gradient rounded once as a 16-bit backward writes it, is added into the
    // float32 dw by add_into_kernel. Lesson 10 zeroes the gradients before each pass, so its hook's rounding at
    // ROUND_DPARAMS sees the same values either way.
    const bool on_cudnn = std::is_same<T, G>::value && cudnn_conv_wanted();
    const bool x_needed = on_cudnn && dw && !std::is_same<In, G>::value;
    const Scratch16<G> sc(nw, x_needed ? (size_t)s->n * in_image : 0, on_cudnn && dw);
    const G *wt = nullptr;
    if (dx) wt = gemm_input<G>(w, nw, sc.w);
    if (dx && on_cudnn && cudnn_conv_backward_data(format_of<G>(), CONV_NCHW, s, wt, dy, dx))
        dx = nullptr;
    if (dw && on_cudnn) {
        G *dw_g = sizeof(G) == 2 ? sc.dw : (G *)dw;
        if (cudnn_conv_backward_filter(format_of<G>(), CONV_NCHW, s, cudnn_x<G>(x, sc), dy, dw_g,
                                       sizeof(G) == 2 ? 0.0f : 1.0f)) {
            using DwIO = InOut<G, float>;  // a launch macro sees no comma
            if (sizeof(G) == 2) KIT_LAUNCH(add_into_kernel<DwIO>, nw, nw, dw_g, dw);
            dw = nullptr;
        }
    }
    float *work = dx || dw ? im2col_work(s, pl) : nullptr;
    for (int n0 = 0; n0 < s->n && (dx || dw); n0 += pl.chunk) {
        const ConvChunk c = conv_chunk(s, pl, n0, work);
        const int nc = c.nc, L = c.L;
        G *cols = (G *)c.cols, *tmp = (G *)c.tmp;
        KIT_LAUNCH_2D(conv_dy_gather_kernel<DyIO>, L, s->k, s->k, pl, nc, dy + n0 * out_image, tmp);
        if (dw) {
            KIT_LAUNCH_2D(im2col_kernel<IO>, L, s->c, *s, pl, nc, x + n0 * in_image, cols);
            // Row-major: dw (K, CRR) += tmp (K, L) @ cols^T (L, CRR): the sum over the chunk's images.
            gemm(p, CUBLAS_OP_T, CUBLAS_OP_N, pl.crr, s->k, L, cols, L, tmp, L, 1.0f, dw, pl.crr);
        }
        if (dx) {
            // Row-major: dcols (CRR, L) = w^T (CRR, K) @ tmp (K, L). It overwrites cols, which the dw
            // GEMM above has finished reading: both are queued in order on the one compute stream.
            gemm(p, CUBLAS_OP_N, CUBLAS_OP_T, L, pl.crr, s->k, tmp, L, wt, pl.crr, 0.0f, c.cols, L);
            KIT_LAUNCH_2D(col2im_add_kernel<T>, pl.hw, (size_t)nc * s->c, *s, pl, nc, c.cols, dx + n0 * in_image);
        }
    }
}

void conv_forward_check(const void *x, const float *w, const void *y) {
    KIT_CHECK_PTR(x);
    KIT_CHECK_PTR(w);
    KIT_CHECK_PTR(y);
}

// db += the bias gradient, from dy stored as T.
template <typename T>
void conv_bias_grad(const Conv2dDims *s, const ConvPlan &pl, const T *dy, float *db) {
    KIT_CHECK_PTR(dy);
    if (!db) return;
    CHECK((size_t)s->n * pl.pq <= INT_MAX, "conv2d: the bias gradient sums over more than 2^31 values "
                                           "per channel; use a smaller batch");
    KIT_PROFILED(conv_bias_grad_kernel<T>, {
        CUDA_LAUNCH(conv_bias_grad_kernel<T>, s->k, KIT_BLOCK, 0, cuda_stream())(s->n, s->k, pl.pq, pl.div_pq, dy, db);
        CUDA_CHECK_LAUNCH();
    });
}

// Whether the GEMMs have anything to do (checking what they read).
bool conv_backward_needs_gemms(const void *x, const float *w, const void *dx, const float *dw) {
    if (!dx && !dw) return false;
    KIT_CHECK_PTR(x);
    KIT_CHECK_PTR(w);
    return true;
}

}  // namespace

extern "C" void conv2d_forward_cuda(const Conv2dDims *s, const float *x, const float *w, const float *b,
                                    float *y) {
    conv_forward_check(x, w, y);
    ConvPlan pl = conv_plan(s);
    GemmPrecision p = device_gemm_precision(DEVICE_CUDA);
    kit_with_type(gemm_format(p), [&](auto g) {
        using G = typename decltype(g)::type;
        conv_forward_as<G, float, float>(p, s, pl, x, w, b, y);
    });
}

extern "C" void conv2d_backward_cuda(const Conv2dDims *s, const float *x, const float *w, const float *dy,
                                     float *dx, float *dw, float *db) {
    ConvPlan pl = conv_plan(s);
    conv_bias_grad(s, pl, dy, db);
    if (!conv_backward_needs_gemms(x, w, dx, dw)) return;
    GemmPrecision p = device_gemm_precision(DEVICE_CUDA);
    kit_with_type(gemm_format(p), [&](auto g) {
        using G = typename decltype(g)::type;
        conv_backward_as<G, float, float>(p, s, pl, x, w, dy, dx, dw);
    });
}

// 16-bit activations (kit/ops_impl.h): y in format f, x in f or float32 (fx: the model's input is float32).
extern "C" void conv2d_forward_act16_cuda(LowpFormat f, LowpFormat fx, const Conv2dDims *s, const void *x,
                                          const float *w, const float *b, void *y) {
    act16_check(f);
    conv_forward_check(x, w, y);
    ConvPlan pl = conv_plan(s);
    GemmPrecision p = device_gemm_precision(DEVICE_CUDA);
    kit_with_type(f, [&](auto t) {
        using T = typename decltype(t)::type;
        if (fx == LOWP_FP32) conv_forward_as<T, float, T>(p, s, pl, (const float *)x, w, b, (T *)y);
        else conv_forward_as<T, T, T>(p, s, pl, (const T *)x, w, b, (T *)y);
    });
}

extern "C" void conv2d_backward_act16_cuda(LowpFormat f, LowpFormat fx, const Conv2dDims *s,
                                           const void *x, const float *w, const void *dy, void *dx, float *dw,
                                           float *db) {
    act16_check(f);
    ConvPlan pl = conv_plan(s);
    kit_with_type(f, [&](auto t) {
        using T = typename decltype(t)::type;
        conv_bias_grad(s, pl, (const T *)dy, db);
        if (!conv_backward_needs_gemms(x, w, dx, dw)) return;
        GemmPrecision p = device_gemm_precision(DEVICE_CUDA);
        if (fx == LOWP_FP32)
            conv_backward_as<T, float, T>(p, s, pl, (const float *)x, w, (const T *)dy, (T *)dx, dw);
        else
            conv_backward_as<T, T, T>(p, s, pl, (const T *)x, w, (const T *)dy, (T *)dx, dw);
    });
}

// ---------------------------------------------------------------- linear
namespace {

// y[i][o] += b[o]. Grid: x over the features, y over the rows (no modulo per element).
__global__ void linear_bias_kernel(int n, int out, const float *b, float *y) {
    KIT_LOOP_X(o, out) {
        const float bo = b[o];
        KIT_LOOP_Y(i, n) { y[(size_t)i * out + o] += bo; }
    }
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

// Linear's GEMM inputs in precision p: 16-bit copies in this thread's device scratch (x (N, IN), w (OUT, IN),
// dy (N, OUT), each converted only when given), or the float32 buffers themselves. TF32 is for convolutions only
// (PyTorch's default: cuDNN's convolutions in TF32, matmuls in float32), so linear runs fp32 under it.
// act: how x and dx are stored, LOWP_FP32 (float32) or the GEMMs' own 16-bit format (16-bit activations: x is
// read where it is, and dx_sum is float32 room for the dx GEMM's (N, IN) result, after the inputs in the same
// scratch, added into dx rounded once: linear_backward_act16_cuda).
struct LinearInputs {
    GemmPrecision p;
    const void *x, *w, *dy;
    float *dx_sum;
};

template <typename T>
LinearInputs linear_inputs_as(GemmPrecision p, int n, int in, int out, LowpFormat act, const void *x,
                              const float *w, const float *dy) {
    const bool act16 = act != LOWP_FP32;
    size_t nx = (size_t)n * in, nw = (size_t)out * in, ndy = (size_t)n * out;
    // Each part starts on a 16-byte boundary (8 elements), where cuBLAS's tensor-core kernels want their operands.
    size_t at_w = (nx + 7) / 8 * 8, at_dy = at_w + (nw + 7) / 8 * 8, at_sum = (at_dy + ndy + 7) / 8 * 8;
    size_t bytes = at_sum * sizeof(T) + (act16 ? nx * sizeof(float) : 0);
    T *scratch = (T *)cuda_device_scratch(bytes);
    LinearInputs r = {p, nullptr, nullptr, nullptr, act16 ? (float *)(scratch + at_sum) : nullptr};
    if (x) r.x = act16 ? x : gemm_input<T>((const float *)x, nx, scratch);
    if (w) r.w = gemm_input<T>(w, nw, scratch + at_w);
    if (dy) r.dy = gemm_input<T>(dy, ndy, scratch + at_dy);
    return r;
}

LinearInputs linear_inputs(int n, int in, int out, LowpFormat act, const void *x, const float *w, const float *dy) {
    GemmPrecision p = device_gemm_precision(DEVICE_CUDA);
    if (p == GEMM_BF16) return linear_inputs_as<Bf16>(p, n, in, out, act, x, w, dy);
    if (p == GEMM_FP16) return linear_inputs_as<Fp16>(p, n, in, out, act, x, w, dy);
    return LinearInputs{GEMM_FP32, x, w, dy, nullptr};  // act is LOWP_FP32 here: act16_check
}

// act: how x is stored (see LinearInputs); y is float32.
void linear_forward_impl(int n, int in, int out, LowpFormat act, const void *x, const float *w, const float *b,
                         float *y) {
    linear_check(n, in, out);
    KIT_CHECK_PTR(x);
    KIT_CHECK_PTR(w);
    KIT_CHECK_PTR(y);
    LinearInputs g = linear_inputs(n, in, out, act, x, w, nullptr);
    // Row-major: y (N, OUT) = x (N, IN) @ w^T (IN, OUT).
    gemm(g.p, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, g.w, in, g.x, in, 0.0f, y, out);
    if (b) KIT_LAUNCH_2D(linear_bias_kernel, out, n, n, out, b, y);
}

// act: how x and dx are stored (see LinearInputs); a 16-bit dx gets the GEMM's float32 result added, rounded.
void linear_backward_impl(int n, int in, int out, LowpFormat act, const void *x, const float *w, const float *dy,
                          void *dx, float *dw, float *db) {
    linear_check(n, in, out);
    KIT_CHECK_PTR(dy);
    if (dx) KIT_CHECK_PTR(w);
    if (dw) KIT_CHECK_PTR(x);
    if (dx || dw) {
        const bool dx16 = dx && act != LOWP_FP32;
        LinearInputs g = linear_inputs(n, in, out, act, dw ? x : nullptr, dx ? w : nullptr, dy);
        // Row-major: dx (N, IN) += dy (N, OUT) @ w (OUT, IN).
        if (dx && !dx16) gemm(g.p, CUBLAS_OP_N, CUBLAS_OP_N, in, n, out, g.w, in, g.dy, out, 1.0f, (float *)dx, in);
        if (dx16) {
            gemm(g.p, CUBLAS_OP_N, CUBLAS_OP_N, in, n, out, g.w, in, g.dy, out, 0.0f, g.dx_sum, in);
            const size_t nx = (size_t)n * in;
            kit_with_type(act, [&](auto t) {
                using X = typename decltype(t)::type;
                using AddIO = InOut<float, X>;  // a launch macro sees no comma
                KIT_LAUNCH(add_into_kernel<AddIO>, nx, nx, g.dx_sum, (X *)dx);
            });
        }
        // Row-major: dw (OUT, IN) += dy^T (OUT, N) @ x (N, IN).
        if (dw) gemm(g.p, CUBLAS_OP_N, CUBLAS_OP_T, in, out, n, g.x, in, g.dy, out, 1.0f, dw, in);
    }
    if (db) KIT_LAUNCH(linear_bias_grad_kernel, (size_t)out, n, out, dy, db);
}

}  // namespace

extern "C" void linear_forward_cuda(int n, int in, int out, const float *x, const float *w, const float *b,
                                    float *y) {
    linear_forward_impl(n, in, out, LOWP_FP32, x, w, b, y);
}

extern "C" void linear_backward_cuda(int n, int in, int out, const float *x, const float *w, const float *dy,
                                     float *dx, float *dw, float *db) {
    linear_backward_impl(n, in, out, LOWP_FP32, x, w, dy, dx, dw, db);
}

// 16-bit activations (kit/ops_impl.h): x in format f, which the GEMMs read as it is; y (the logits) in float32.
extern "C" void linear_forward_act16_cuda(LowpFormat f, int n, int in, int out, const void *x, const float *w,
                                          const float *b, float *y) {
    act16_check(f);
    linear_forward_impl(n, in, out, f, x, w, b, y);
}

extern "C" void linear_backward_act16_cuda(LowpFormat f, int n, int in, int out, const void *x,
                                           const float *w, const float *dy, void *dx, float *dw, float *db) {
    act16_check(f);
    linear_backward_impl(n, in, out, f, x, w, dy, dx, dw, db);
}
