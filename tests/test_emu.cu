// tests/test_emu.cu: the CUDA emulator's own promises (kit/cuda/README.md), built only in the EMU=1 build:
// every block and thread runs once, __syncthreads() is a real barrier, the thread order between barriers is
// random (so a missing barrier shows), launch limits and cuBLAS's column-major semantics and checks, and
// non-blocking streams that run their copies only when waited for (so a missing event wait shows).
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
extern "C" {  // cmocka's header has no C++ guard
#include <cmocka.h>
}

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cudnn.h>

#include "kit/cuda_check.h"
#include "kit/cuda/cuda_internal.h"

// Every (block, thread) of a 3-D grid of 3-D blocks adds 1 to its own counter, and records its indices.
__global__ void count_kernel(int *count, uint3 *where) {
    unsigned block = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    unsigned thread = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
    unsigned i = block * (blockDim.x * blockDim.y * blockDim.z) + thread;
    count[i] += 1;
    where[i] = uint3{blockIdx.x * 100 + threadIdx.x, blockIdx.y * 100 + threadIdx.y, blockIdx.z * 100 + threadIdx.z};
}

static void test_every_thread_once(void **state) {
    (void)state;
    dim3 grid(3, 2, 2), block(4, 3, 2);
    const int n = 12 * 24;
    int *count;
    uint3 *where;
    CUDA_CHECK(cudaMalloc(&count, n * sizeof(int)));
    CUDA_CHECK(cudaMalloc(&where, n * sizeof(uint3)));
    CUDA_CHECK(cudaMemset(count, 0, n * sizeof(int)));
    CUDA_LAUNCH(count_kernel, grid, block, 0, 0)(count, where);
    CUDA_CHECK_LAUNCH();
    for (int i = 0; i < n; i++) {
        assert_int_equal(count[i], 1);
        int t = i % 24, b = i / 24;
        assert_int_equal(where[i].x, (unsigned)(b % 3 * 100 + t % 4));
        assert_int_equal(where[i].y, (unsigned)(b / 3 % 2 * 100 + t / 4 % 3));
        assert_int_equal(where[i].z, (unsigned)(b / 6 * 100 + t / 12));
    }
    cudaFree(count);
    cudaFree(where);
}

// Each thread writes its slot, then reads its neighbour's: right only when every write comes first. The
// values carry the launch number, so what a previous launch left in the slots is never right.
template <bool kBarrier>
__global__ void neighbour_kernel(int launch, int *out) {
    __shared__ int slot[256];
    slot[threadIdx.x] = launch * 1000 + (int)threadIdx.x;
    if (kBarrier) __syncthreads();
    out[threadIdx.x] = slot[(threadIdx.x + 1) % blockDim.x];
}

static int neighbour_errors(bool barrier, int launch) {
    int *out;
    CUDA_CHECK(cudaMalloc(&out, 256 * sizeof(int)));
    if (barrier) CUDA_LAUNCH(neighbour_kernel<true>, 1, 256, 0, 0)(launch, out);
    else CUDA_LAUNCH(neighbour_kernel<false>, 1, 256, 0, 0)(launch, out);
    CUDA_CHECK_LAUNCH();
    int errors = 0;
    for (int t = 0; t < 256; t++) errors += out[t] != launch * 1000 + (t + 1) % 256;
    cudaFree(out);
    return errors;
}

static void test_barrier_orders_and_its_absence_shows(void **state) {
    (void)state;
    for (int launch = 1; launch <= 20; launch++) assert_int_equal(neighbour_errors(true, launch), 0);
    // Without the barrier a thread reads its neighbour's slot before or after the neighbour wrote it, as
    // the random order has it: each read is wrong with probability 1/2, so about 128 of the 256 (standard
    // deviation about 8). Threads in index order would give 255 wrong, in reverse order 1.
    int wrong = neighbour_errors(false, 21);
    assert_in_range(wrong, 32, 224);
}

__global__ void atomic_kernel(int *sum, int *max) {
    atomicAdd(sum, 1);
    atomicMax(max, (int)(blockIdx.x * blockDim.x + threadIdx.x));
}

static void test_atomics(void **state) {
    (void)state;
    int *v;
    CUDA_CHECK(cudaMalloc(&v, 2 * sizeof(int)));
    CUDA_CHECK(cudaMemset(v, 0, 2 * sizeof(int)));
    CUDA_LAUNCH(atomic_kernel, 7, 64, 0, 0)(v, v + 1);
    CUDA_CHECK_LAUNCH();
    assert_int_equal(v[0], 7 * 64);
    assert_int_equal(v[1], 7 * 64 - 1);
    cudaFree(v);
}

// The bit-cast intrinsics (round_lowp's kernels read a float's bits) and a 64-bit atomicAdd (their counters).
__global__ void bits_kernel(const float *x, unsigned *bits, float *back, unsigned long long *count) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    bits[i] = __float_as_uint(x[i]);
    back[i] = __uint_as_float(bits[i] ^ 0x80000000u);  // the sign flipped: -x
    atomicAdd(count, (unsigned long long)bits[i]);
}

static void test_bit_casts(void **state) {
    (void)state;
    enum { T = 3 * 32 };
    float *x, *back;
    unsigned *bits;
    unsigned long long *count;
    CUDA_CHECK(cudaMalloc(&x, T * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&back, T * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&bits, T * sizeof(unsigned)));
    CUDA_CHECK(cudaMalloc(&count, sizeof *count));
    CUDA_CHECK(cudaMemset(count, 0, sizeof *count));
    unsigned long long want = 0;
    for (int i = 0; i < T; i++) {
        x[i] = 1.5f * (float)(i - 40);  // device memory is host memory here
        unsigned u;
        memcpy(&u, &x[i], sizeof u);
        want += u;
    }
    CUDA_LAUNCH(bits_kernel, 3, 32, 0, 0)(x, bits, back, count);
    CUDA_CHECK_LAUNCH();
    for (int i = 0; i < T; i++) {
        assert_memory_equal(&bits[i], &x[i], sizeof(float));
        assert_true(back[i] == -x[i]);
    }
    assert_true(*count == want);  // above 2^32: the sum needs all 64 bits
    assert_true(want > 0xFFFFFFFFull);
    cudaFree(x), cudaFree(back), cudaFree(bits), cudaFree(count);
}

// KitDiv (kit/cuda/cuda_internal.h), the division the index kernels use in place of `/`: equal to `/` for every
// divisor kind (1, powers of two and their neighbours, small odd ones, random ones up to 2^31 - 1) at the
// dividends where a wrong magic number shows first (around multiples of d, and near 2^31), and at random ones.
static void test_kit_div(void **state) {
    (void)state;
    uint64_t rng = 12345;
    auto next = [&rng]() {  // xorshift64: any spread of values will do
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        return rng;
    };
    unsigned divisors[400];
    int nd = 0;
    for (unsigned d = 1; d <= 64; d++) divisors[nd++] = d;
    for (int s = 1; s < 31; s++) {
        divisors[nd++] = (1u << s) - 1, divisors[nd++] = 1u << s, divisors[nd++] = (1u << s) + 1;
    }
    divisors[nd++] = 0x7FFFFFFFu;
    while (nd < 400) divisors[nd++] = 1 + (unsigned)(next() % 0x7FFFFFFFu);
    const unsigned top = 0x7FFFFFFFu;  // dividends below 2^31
    for (int k = 0; k < nd; k++) {
        const unsigned d = divisors[k];
        const KitDiv v = kit_div_make(d);
        unsigned probes[64];
        int np = 0;
        probes[np++] = 0, probes[np++] = 1, probes[np++] = top, probes[np++] = top - 1, probes[np++] = top - d + 1;
        for (unsigned m = 1; m <= 4; m++)
            if ((unsigned long long)m * d <= top) probes[np++] = m * d - 1, probes[np++] = m * d;
        const unsigned last = top / d * d;  // the largest multiple of d below 2^31
        probes[np++] = last, probes[np++] = last - 1;
        while (np < 64) probes[np++] = (unsigned)(next() % ((unsigned long long)top + 1));
        for (int p = 0; p < np; p++) {
            if (probes[p] > top) continue;
            if (kit_div(probes[p], v) != probes[p] / d) fail_msg("kit_div(%u, %u) = %u, want %u", probes[p], d, kit_div(probes[p], v), probes[p] / d);
        }
    }
}

// Launches a GPU refuses are refused here too, through cudaGetLastError (which then resets).
static void test_launch_limits(void **state) {
    (void)state;
    int *v;
    uint3 *w;
    CUDA_CHECK(cudaMalloc(&v, sizeof(int)));
    CUDA_CHECK(cudaMalloc(&w, sizeof(uint3)));
    CUDA_LAUNCH(count_kernel, 1, 2048, 0, 0)(v, w);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    CUDA_LAUNCH(count_kernel, 0, 32, 0, 0)(v, w);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    CUDA_LAUNCH(count_kernel, 1, dim3(32, 1, 65), 0, 0)(v, w);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    CUDA_LAUNCH(count_kernel, 1, 32, 64 * 1024, 0)(v, w);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
    cudaFree(v);
    cudaFree(w);
}

// cublasSgemm against a plain triple loop over column-major storage, for all four transpose cases, with
// leading dimensions larger than the rows (padding that must be skipped); and cuBLAS's argument checks.
static void test_sgemm_column_major(void **state) {
    (void)state;
    cublasHandle_t h;
    assert_int_equal(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    const int m = 3, n = 4, k = 5, pad = 2;
    float A[(5 + 2) * 5], B[(5 + 2) * 5], C[(3 + 2) * 4], R[(3 + 2) * 4];
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            int lda = (ta ? k : m) + pad, ldb = (tb ? n : k) + pad, ldc = m + pad;
            for (int i = 0; i < (int)(sizeof A / sizeof A[0]); i++) A[i] = (float)((i * 7) % 11) - 5.0f;
            for (int i = 0; i < (int)(sizeof B / sizeof B[0]); i++) B[i] = (float)((i * 5) % 13) - 6.0f;
            for (int i = 0; i < (int)(sizeof C / sizeof C[0]); i++) C[i] = R[i] = (float)(i % 3);
            const float alpha = 2.0f, beta = 0.5f;
            for (int j = 0; j < n; j++)
                for (int i = 0; i < m; i++) {
                    float s = 0.0f;
                    for (int p = 0; p < k; p++)
                        s += (ta ? A[p + i * lda] : A[i + p * lda]) * (tb ? B[j + p * ldb] : B[p + j * ldb]);
                    R[i + j * ldc] = alpha * s + beta * R[i + j * ldc];
                }
            assert_int_equal(cublasSgemm(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k,
                                         &alpha, A, lda, B, ldb, &beta, C, ldc),
                             CUBLAS_STATUS_SUCCESS);
            for (int i = 0; i < (int)(sizeof C / sizeof C[0]); i++) assert_true(C[i] == R[i]);  // small integers: exact
        }
    const float one = 1.0f;
    // A leading dimension below the rows of its matrix, as stored: refused, as cuBLAS does.
    assert_int_equal(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, A, m - 1, B, k, &one, C, m),
                     CUBLAS_STATUS_INVALID_VALUE);
    assert_int_equal(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, A, k - 1, B, k, &one, C, m),
                     CUBLAS_STATUS_INVALID_VALUE);
    assert_int_equal(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, A, m, B, k, &one, C, m - 1),
                     CUBLAS_STATUS_INVALID_VALUE);
    cublasDestroy(h);
}

// Half the block waits at a barrier the other half never reaches: a hang or garbage on a GPU, a stop with a
// message here (in a child process, since it ends the program).
__global__ void divergent_kernel(int *out) {
    if (threadIdx.x < 16) __syncthreads();
    out[threadIdx.x] = 1;
}

// cublasGemmEx: 16-bit inputs read exactly (bf16 = float32's top half; fp16 normals, subnormals, inf), TF32
// inputs truncated to 10 mantissa bits (by the compute type or the handle's math mode, for cublasSgemm too),
// and cuBLAS's checks: unsupported type combinations, bad leading dimensions.
static float gemm1(cublasHandle_t h, const void *a, const void *b, cudaDataType t, cublasComputeType_t ct) {
    const float one = 1.0f, zero = 0.0f;
    float c = -1.0f;
    assert_int_equal(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, a, t, 1, b, t, 1, &zero, &c, CUDA_R_32F,
                                  1, ct, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_SUCCESS);
    return c;
}

static void test_gemm_ex_types(void **state) {
    (void)state;
    cublasHandle_t h;
    assert_int_equal(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    const uint16_t one_bf16 = 0x3F80, three_bf16 = 0x4040;  // 1.0, 3.0
    assert_true(gemm1(h, &three_bf16, &one_bf16, CUDA_R_16BF, CUBLAS_COMPUTE_32F) == 3.0f);
    const uint16_t fp16_1p5 = 0x3E00, fp16_sub = 0x0001, fp16_inf = 0x7C00, fp16_two = 0x4000;  // 1.5, 2^-24, inf, 2
    assert_true(gemm1(h, &fp16_1p5, &fp16_two, CUDA_R_16F, CUBLAS_COMPUTE_32F) == 3.0f);
    assert_true(gemm1(h, &fp16_sub, &fp16_two, CUDA_R_16F, CUBLAS_COMPUTE_32F) == ldexpf(1.0f, -23));
    assert_true(isinf(gemm1(h, &fp16_inf, &fp16_two, CUDA_R_16F, CUBLAS_COMPUTE_32F)));
    // 1 + 2^-23 has its one low bit below TF32's 10 mantissa bits: TF32 reads 1, float32 keeps it.
    const float x = 1.0f + ldexpf(1.0f, -23), one = 1.0f, zero = 0.0f;
    assert_true(gemm1(h, &x, &one, CUDA_R_32F, CUBLAS_COMPUTE_32F) == x);
    assert_true(gemm1(h, &x, &one, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32) == 1.0f);
    const float y = -(1.0f + ldexpf(1.0f, -10) + ldexpf(1.0f, -11));  // truncation, not rounding: -(1 + 2^-10)
    assert_true(gemm1(h, &y, &one, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32) == -(1.0f + ldexpf(1.0f, -10)));
    float c = 0.0f;
    assert_int_equal(cublasSetMathMode(h, CUBLAS_TF32_TENSOR_OP_MATH), CUBLAS_STATUS_SUCCESS);
    assert_int_equal(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, &x, 1, &one, 1, &zero, &c, 1),
                     CUBLAS_STATUS_SUCCESS);
    assert_true(c == 1.0f);
    assert_int_equal(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH), CUBLAS_STATUS_SUCCESS);
    assert_int_equal(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, &x, 1, &one, 1, &zero, &c, 1),
                     CUBLAS_STATUS_SUCCESS);
    assert_true(c == x);
    // What cuBLAS refuses: A and B of different types, a 16-bit C here, TF32 on 16-bit inputs, a short lda.
    uint16_t a16[4] = {0}, b16[4] = {0};
    float cf[4] = {0};
    assert_int_equal(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, a16, CUDA_R_16BF, 2, b16, CUDA_R_16F, 2,
                                  &zero, cf, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_NOT_SUPPORTED);
    assert_int_equal(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, a16, CUDA_R_16BF, 2, b16, CUDA_R_16BF,
                                  2, &zero, a16, CUDA_R_16BF, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_NOT_SUPPORTED);
    assert_int_equal(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, a16, CUDA_R_16BF, 2, b16, CUDA_R_16BF,
                                  2, &zero, cf, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_NOT_SUPPORTED);
    assert_int_equal(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, a16, CUDA_R_16BF, 1, b16, CUDA_R_16BF,
                                  2, &zero, cf, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_INVALID_VALUE);
    cublasDestroy(h);
}

// The emulated cuDNN (kit/cuda/emu/cudnn_emu.cc): a 2x2 input, a 1x1 filter of 3, one output channel, so every
// output is 3 x its input. Float32 data read as TF32 unless the math type is FMA; bf16 data widened exactly and
// alpha * result + beta * old rounded once; and cuDNN's checks: an output of the wrong size, an algorithm it does
// not compute, a workspace smaller than the algorithm's.
typedef struct {
    cudnnHandle_t h;
    cudnnTensorDescriptor_t x, y;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
} Dnn1x1;

static Dnn1x1 dnn_1x1(cudnnDataType_t type, cudnnMathType_t math, int out_h) {
    Dnn1x1 d;
    assert_int_equal(cudnnCreate(&d.h), CUDNN_STATUS_SUCCESS);
    assert_int_equal(cudnnCreateTensorDescriptor(&d.x), CUDNN_STATUS_SUCCESS);
    assert_int_equal(cudnnCreateTensorDescriptor(&d.y), CUDNN_STATUS_SUCCESS);
    assert_int_equal(cudnnCreateFilterDescriptor(&d.w), CUDNN_STATUS_SUCCESS);
    assert_int_equal(cudnnCreateConvolutionDescriptor(&d.conv), CUDNN_STATUS_SUCCESS);
    assert_int_equal(cudnnSetTensor4dDescriptor(d.x, CUDNN_TENSOR_NCHW, type, 1, 1, 2, 2), CUDNN_STATUS_SUCCESS);
    assert_int_equal(cudnnSetTensor4dDescriptor(d.y, CUDNN_TENSOR_NCHW, type, 1, 1, out_h, 2), CUDNN_STATUS_SUCCESS);
    assert_int_equal(cudnnSetFilter4dDescriptor(d.w, type, CUDNN_TENSOR_NCHW, 1, 1, 1, 1), CUDNN_STATUS_SUCCESS);
    assert_int_equal(cudnnSetConvolution2dDescriptor(d.conv, 0, 0, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
                     CUDNN_STATUS_SUCCESS);
    assert_int_equal(cudnnSetConvolutionMathType(d.conv, math), CUDNN_STATUS_SUCCESS);
    return d;
}

static void dnn_free(Dnn1x1 *d) {
    cudnnDestroyConvolutionDescriptor(d->conv);
    cudnnDestroyFilterDescriptor(d->w);
    cudnnDestroyTensorDescriptor(d->y);
    cudnnDestroyTensorDescriptor(d->x);
    cudnnDestroy(d->h);
}

static cudnnStatus_t dnn_forward(Dnn1x1 *d, cudnnConvolutionFwdAlgo_t algo, const void *x, const void *w, float beta,
                                 void *y, size_t workspace) {
    const float one = 1.0f;
    static float ws[16];
    return cudnnConvolutionForward(d->h, &one, d->x, x, d->w, w, d->conv, algo, workspace ? ws : NULL, workspace,
                                   &beta, d->y, y);
}

static void test_cudnn_conv(void **state) {
    (void)state;
    const float x[4] = {1.0f + ldexpf(1.0f, -20), 2.0f, -1.0f, 0.5f}, w = 3.0f;
    float y[4];
    for (int fma = 0; fma < 2; fma++) {  // TF32 drops x[0]'s 2^-20; FMA keeps it (3 + 3 * 2^-20 is exact)
        Dnn1x1 d = dnn_1x1(CUDNN_DATA_FLOAT, fma ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH, 2);
        assert_int_equal(dnn_forward(&d, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, x, &w, 0.0f, y, 0),
                         CUDNN_STATUS_SUCCESS);
        assert_true(y[0] == (fma ? 3.0f * x[0] : 3.0f) && y[1] == 6.0f && y[2] == -3.0f && y[3] == 1.5f);
        dnn_free(&d);
    }
    // bf16: 1.0234375 (exact in bf16) times 3 is 3.0703125, plus the old 2^-7 is 3.078125, itself a bf16 (0x4045;
    // steps of 2^-6 at 3): one rounding, of the sum, keeps it. Rounding the product first (3.0703125 is a tie
    // between 3.0625 and 3.078125: to even, 3.0625) and then the sum would give 0x4044.
    const uint16_t xb[4] = {0x3F83, 0x3F80, 0x3F80, 0x3F80}, wb = 0x4040;  // 1.0234375, 1, 1, 1; 3
    uint16_t yb[4] = {0x3C00, 0x3F80, 0x3F80, 0x3F80};                     // 2^-7, 1, 1, 1
    Dnn1x1 d = dnn_1x1(CUDNN_DATA_BFLOAT16, CUDNN_TENSOR_OP_MATH, 2);
    assert_int_equal(dnn_forward(&d, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, xb, &wb, 1.0f, yb, 0),
                     CUDNN_STATUS_SUCCESS);
    assert_int_equal(yb[0], 0x4045);
    assert_int_equal(yb[1], 0x4080);  // 3 + 1
    // Refusals: FFT (not computed here), the GEMM algorithm without its workspace, then with it.
    assert_int_equal(dnn_forward(&d, CUDNN_CONVOLUTION_FWD_ALGO_FFT, xb, &wb, 0.0f, yb, 0), CUDNN_STATUS_NOT_SUPPORTED);
    assert_int_equal(dnn_forward(&d, CUDNN_CONVOLUTION_FWD_ALGO_GEMM, xb, &wb, 0.0f, yb, 0), CUDNN_STATUS_BAD_PARAM);
    assert_int_equal(dnn_forward(&d, CUDNN_CONVOLUTION_FWD_ALGO_GEMM, xb, &wb, 0.0f, yb, sizeof(float) * 4),
                     CUDNN_STATUS_SUCCESS);
    dnn_free(&d);
    Dnn1x1 bad = dnn_1x1(CUDNN_DATA_FLOAT, CUDNN_FMA_MATH, 1);  // a 2x2 output described as 1x2
    assert_int_equal(dnn_forward(&bad, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, x, &w, 0.0f, y, 0),
                     CUDNN_STATUS_BAD_PARAM);
    dnn_free(&bad);
}

static void test_divergent_barrier_stops(void **state) {
    (void)state;
    int *out;
    CUDA_CHECK(cudaMalloc(&out, 32 * sizeof(int)));
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr)) _exit(2);  // the message is for a learner, not for this test's log
        CUDA_LAUNCH(divergent_kernel, 1, 32, 0, 0)(out);
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
    cudaFree(out);
}

// ---------------------------------------------------------------- lazy (non-blocking) streams
// These hold only in the emulator: on a GPU the copies would race with the reads instead of losing every time.

static void fill(float *x, int n, float v) {
    for (int i = 0; i < n; i++) x[i] = v;
}

static bool all_equal(const float *d, int n, float v) {
    float h[64];
    CUDA_CHECK(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost));  // legacy stream: waits for none
    for (int i = 0; i < n; i++)
        if (h[i] != v) return false;
    return true;
}

// A copy queued on a non-blocking stream has not run until something waits for it: the legacy default
// stream does not. A pinned source is read when the copy runs; a pageable one when it is queued.
static void test_lazy_copy_runs_when_waited(void **state) {
    (void)state;
    const int n = 64;
    float *pinned, *pageable = (float *)malloc(n * sizeof(float)), *d1, *d2;
    CUDA_CHECK(cudaMallocHost((void **)&pinned, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d1, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d2, n * sizeof(float)));
    CUDA_CHECK(cudaMemset(d1, 0, n * sizeof(float)));
    CUDA_CHECK(cudaMemset(d2, 0, n * sizeof(float)));
    cudaStream_t s;
    cudaEvent_t e;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    fill(pinned, n, 1.0f);
    fill(pageable, n, 2.0f);
    CUDA_CHECK(cudaMemcpyAsync(d1, pinned, n * sizeof(float), cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaMemcpyAsync(d2, pageable, n * sizeof(float), cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaEventRecord(e, s));
    fill(pinned, n, 3.0f);  // the host reuses its buffers without waiting for the copies
    fill(pageable, n, 4.0f);
    assert_true(all_equal(d1, n, 0.0f));  // nobody waited: the copies have not run
    assert_true(all_equal(d2, n, 0.0f));
    CUDA_CHECK(cudaStreamWaitEvent(0, e, 0));  // the null stream waits: the copies run now
    assert_true(all_equal(d1, n, 3.0f));       // pinned: read when the copy ran (the reuse shows)
    assert_true(all_equal(d2, n, 2.0f));       // pageable: staged when the call was made
    assert_int_equal(cudaEventQuery(e), cudaSuccess);
    CUDA_CHECK(cudaEventDestroy(e));
    CUDA_CHECK(cudaStreamDestroy(s));
    CUDA_CHECK(cudaFree(d1));
    CUDA_CHECK(cudaFree(d2));
    CUDA_CHECK(cudaFreeHost(pinned));
    free(pageable);
}

// cudaStreamWaitEvent waits for the event's record as it stood at the call: recording the event again
// later does not move the wait. A stream runs its queue in order, and only up to what is waited for.
static void test_wait_takes_the_record_at_the_call(void **state) {
    (void)state;
    const int n = 64;
    float *a, *b, *d, *d2;
    CUDA_CHECK(cudaMallocHost((void **)&a, n * sizeof(float)));
    CUDA_CHECK(cudaMallocHost((void **)&b, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d2, n * sizeof(float)));
    CUDA_CHECK(cudaMemset(d, 0, n * sizeof(float)));
    CUDA_CHECK(cudaMemset(d2, 0, n * sizeof(float)));
    fill(a, n, 1.0f);
    fill(b, n, 2.0f);
    cudaStream_t s1, s2;
    cudaEvent_t e;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreate(&e));
    CUDA_CHECK(cudaMemcpyAsync(d, a, n * sizeof(float), cudaMemcpyHostToDevice, s1));
    CUDA_CHECK(cudaEventRecord(e, s1));
    CUDA_CHECK(cudaStreamWaitEvent(s2, e, 0));
    CUDA_CHECK(cudaMemcpyAsync(d, b, n * sizeof(float), cudaMemcpyHostToDevice, s1));
    CUDA_CHECK(cudaEventRecord(e, s1));  // re-recorded: s2 still waits for the first record only
    CUDA_CHECK(cudaMemcpyAsync(d2, d, n * sizeof(float), cudaMemcpyDeviceToDevice, s2));
    CUDA_CHECK(cudaStreamSynchronize(s2));
    assert_true(all_equal(d2, n, 1.0f));  // s2 copied after the first copy...
    assert_true(all_equal(d, n, 1.0f));   // ...and the second one is still queued
    CUDA_CHECK(cudaEventSynchronize(e));
    assert_true(all_equal(d, n, 2.0f));
    // cudaDeviceSynchronize runs every queue.
    CUDA_CHECK(cudaMemsetAsync(d, 0, n * sizeof(float), s1));
    assert_true(all_equal(d, n, 2.0f));
    CUDA_CHECK(cudaDeviceSynchronize());
    assert_true(all_equal(d, n, 0.0f));
    CUDA_CHECK(cudaEventDestroy(e));
    CUDA_CHECK(cudaStreamDestroy(s1));
    CUDA_CHECK(cudaStreamDestroy(s2));
    CUDA_CHECK(cudaFree(d));
    CUDA_CHECK(cudaFree(d2));
    CUDA_CHECK(cudaFreeHost(a));
    CUDA_CHECK(cudaFreeHost(b));
}

// A kernel queued on a non-blocking stream runs after the copies queued before it on that stream.
__global__ void double_kernel(float *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= 2.0f;
}

static void test_kernel_after_its_stream_queue(void **state) {
    (void)state;
    const int n = 64;
    float *h, *d;
    CUDA_CHECK(cudaMallocHost((void **)&h, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d, n * sizeof(float)));
    CUDA_CHECK(cudaMemset(d, 0, n * sizeof(float)));
    fill(h, n, 5.0f);
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CUDA_CHECK(cudaMemcpyAsync(d, h, n * sizeof(float), cudaMemcpyHostToDevice, s));
    CUDA_LAUNCH(double_kernel, dim3(1), dim3(n), 0, s)(d, n);
    CUDA_CHECK_LAUNCH();
    assert_true(all_equal(d, n, 10.0f));
    CUDA_CHECK(cudaStreamDestroy(s));
    CUDA_CHECK(cudaFree(d));
    CUDA_CHECK(cudaFreeHost(h));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_thread_once),
        cmocka_unit_test(test_barrier_orders_and_its_absence_shows),
        cmocka_unit_test(test_atomics),
        cmocka_unit_test(test_bit_casts),
        cmocka_unit_test(test_kit_div),
        cmocka_unit_test(test_launch_limits),
        cmocka_unit_test(test_sgemm_column_major),
        cmocka_unit_test(test_gemm_ex_types),
        cmocka_unit_test(test_cudnn_conv),
        cmocka_unit_test(test_divergent_barrier_stops),
        cmocka_unit_test(test_lazy_copy_runs_when_waited),
        cmocka_unit_test(test_wait_takes_the_record_at_the_call),
        cmocka_unit_test(test_kernel_after_its_stream_queue),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
