// bench/gemm_lowp.cu: real low-precision GEMMs on a GPU: cuBLAS cublasGemmEx with bf16 and fp16 inputs and fp32
// accumulation and output (tensor cores) against cublasSgemm (pure fp32, CUDA cores) and TF32 (fp32 storage,
// tensor cores with 10-bit mantissa inputs), on the conv-as-GEMM shapes of the kit's Fashion-MNIST net and
// ResNet-9 and a square sweep (bench/gemm_shapes.h).
//
//   build/bench/gemm_lowp [--set fmnist,resnet9,square] [--images 128] [--max-square 8192] [--seconds 0.1]
//                         [--quick]
//
// Lesson 10 emulates bf16 and fp16 by rounding fp32 tensors (numerically faithful, no faster); this measures
// the speed a real kernel gives. Timing: per shape and kind, one warm-up call, then groups of calls between two
// CUDA events until --seconds have run (at least 5 groups); the median group's time per call is reported.
//
// Correctness, every shape: the bf16 (fp16) product against cublasSgemm of the SAME rounded inputs (fp32
// compute, no TF32). The products of two 8-bit (11-bit) mantissas are exact in fp32, so the two differ only by
// the order of the fp32 additions: the column gives the largest difference over sum|a||b| (u = 2^-24 per
// addition, so up to about K u; tensor cores may also truncate partial sums, which the figure would show).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bench/gemm_shapes.h"
#include "kit/cuda_check.h"

enum Kind { KIND_SGEMM, KIND_TF32, KIND_BF16, KIND_FP16, KIND_COUNT };

struct Options {
    char sets[64];
    int images = 128, max_square = 8192, min_groups = 5;
    double seconds = 0.1;
};

// Device buffers of one shape: A (m, k), B (k, n) row-major in fp32, bf16 and fp16, their rounded copies back
// in fp32 (the reference's inputs), and C.
struct Problem {
    int m, n, k;
    float *a, *b, *a_bf, *b_bf, *a_h, *b_h, *c, *abs_a, *abs_b;
    __nv_bfloat16 *a16b, *b16b;
    __half *a16h, *b16h;
};

__global__ void convert_kernel(size_t n, const float *x, __nv_bfloat16 *xb, __half *xh, float *xb_f, float *xh_f,
                               float *abs_x) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    xb[i] = __float2bfloat16_rn(x[i]);
    xh[i] = __float2half_rn(x[i]);
    xb_f[i] = __bfloat162float(xb[i]);
    xh_f[i] = __half2float(xh[i]);
    abs_x[i] = fabsf(x[i]);
}

static float *dalloc(size_t n) {
    float *p;
    CUDA_CHECK(cudaMalloc(&p, n * sizeof(float)));
    return p;
}

// Uniform in [-1, 1) from the host (a fixed seed), then the low-precision copies on the device.
static void fill(size_t n, float *x, __nv_bfloat16 *xb, __half *xh, float *xb_f, float *xh_f, float *abs_x,
                 unsigned seed) {
    std::vector<float> h(n);
    srand(seed);
    for (size_t i = 0; i < n; i++) h[i] = 2.0f * (float)rand() / (float)RAND_MAX - 1.0f;
    CUDA_CHECK(cudaMemcpy(x, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    convert_kernel<<<(unsigned)((n + 255) / 256), 256>>>(n, x, xb, xh, xb_f, xh_f, abs_x);
    CUDA_CHECK_LAUNCH();
}

static Problem problem_create(int m, int n, int k) {
    Problem p = {};
    p.m = m, p.n = n, p.k = k;
    size_t na = (size_t)m * k, nb = (size_t)k * n;
    p.a = dalloc(na), p.a_bf = dalloc(na), p.a_h = dalloc(na), p.abs_a = dalloc(na);
    p.b = dalloc(nb), p.b_bf = dalloc(nb), p.b_h = dalloc(nb), p.abs_b = dalloc(nb);
    p.c = dalloc((size_t)m * n);
    CUDA_CHECK(cudaMalloc(&p.a16b, na * sizeof(__nv_bfloat16)));
    CUDA_CHECK(cudaMalloc(&p.b16b, nb * sizeof(__nv_bfloat16)));
    CUDA_CHECK(cudaMalloc(&p.a16h, na * sizeof(__half)));
    CUDA_CHECK(cudaMalloc(&p.b16h, nb * sizeof(__half)));
    fill(na, p.a, p.a16b, p.a16h, p.a_bf, p.a_h, p.abs_a, 1234u);
    fill(nb, p.b, p.b16b, p.b16h, p.b_bf, p.b_h, p.abs_b, 5678u);
    return p;
}

static void problem_free(Problem *p) {
    float *fs[] = {p->a, p->b, p->a_bf, p->b_bf, p->a_h, p->b_h, p->c, p->abs_a, p->abs_b};
    for (float *f : fs) CUDA_CHECK(cudaFree(f));
    CUDA_CHECK(cudaFree(p->a16b));
    CUDA_CHECK(cudaFree(p->b16b));
    CUDA_CHECK(cudaFree(p->a16h));
    CUDA_CHECK(cudaFree(p->b16h));
}

// C (m, n) = A (m, k) @ B (k, n), row-major, as cuBLAS's column-major C^T = B^T A^T. The inputs' type and the
// compute type pick the kernel: fp32 + COMPUTE_32F is cublasSgemm's fp32 path, fp32 + FAST_TF32 tensor cores on
// 10-bit mantissas, bf16 / fp16 + COMPUTE_32F tensor cores with fp32 accumulation.
static void gemm(cublasHandle_t h, Kind kind, const Problem &p, const void *a, const void *b, float *c) {
    const float one = 1.0f, zero = 0.0f;
    if (kind == KIND_SGEMM) {
        CUBLAS_CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, p.n, p.m, p.k, &one, (const float *)b, p.n,
                                 (const float *)a, p.k, &zero, c, p.n));
        return;
    }
    cudaDataType_t in = kind == KIND_BF16 ? CUDA_R_16BF : kind == KIND_FP16 ? CUDA_R_16F : CUDA_R_32F;
    cublasComputeType_t ct = kind == KIND_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, p.n, p.m, p.k, &one, b, in, p.n, a, in, p.k, &zero, c,
                              CUDA_R_32F, p.n, ct, CUBLAS_GEMM_DEFAULT));
}

static void kind_inputs(const Problem &p, Kind kind, const void **a, const void **b) {
    *a = kind == KIND_BF16 ? (const void *)p.a16b : kind == KIND_FP16 ? (const void *)p.a16h : p.a;
    *b = kind == KIND_BF16 ? (const void *)p.b16b : kind == KIND_FP16 ? (const void *)p.b16h : p.b;
}

// Median milliseconds per call of `kind` on p.
static double time_kind(const Options &o, cublasHandle_t h, const Problem &p, Kind kind) {
    const void *a, *b;
    kind_inputs(p, kind, &a, &b);
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    gemm(h, kind, p, a, b, p.c);   // warm-up: cuBLAS picks and loads its kernel
    CUDA_CHECK(cudaDeviceSynchronize());
    // A group long enough (about 1 ms) that the events' resolution does not matter.
    float ms = 0;
    CUDA_CHECK(cudaEventRecord(e0));
    gemm(h, kind, p, a, b, p.c);
    CUDA_CHECK(cudaEventRecord(e1));
    CUDA_CHECK(cudaEventSynchronize(e1));
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    int per_group = std::max(1, std::min(1000, (int)(1.0 / std::max(ms, 1e-3f))));
    std::vector<double> groups;
    double spent = 0;
    while (spent < 1e3 * o.seconds || (int)groups.size() < o.min_groups) {
        CUDA_CHECK(cudaEventRecord(e0));
        for (int i = 0; i < per_group; i++) gemm(h, kind, p, a, b, p.c);
        CUDA_CHECK(cudaEventRecord(e1));
        CUDA_CHECK(cudaEventSynchronize(e1));
        CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        groups.push_back((double)ms / per_group);
        spent += ms;
    }
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    std::sort(groups.begin(), groups.end());
    return groups[groups.size() / 2];
}

static std::vector<float> to_host(const float *d, size_t n) {
    std::vector<float> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}

// The largest |low-precision product - fp32 product of the same rounded inputs| over max sum|a||b|.
static double order_error(cublasHandle_t h, const Problem &p, Kind kind) {
    size_t nc = (size_t)p.m * p.n;
    const void *a, *b;
    kind_inputs(p, kind, &a, &b);
    gemm(h, kind, p, a, b, p.c);
    std::vector<float> low = to_host(p.c, nc);
    gemm(h, KIND_SGEMM, p, kind == KIND_BF16 ? p.a_bf : p.a_h, kind == KIND_BF16 ? p.b_bf : p.b_h, p.c);
    std::vector<float> ref = to_host(p.c, nc);
    gemm(h, KIND_SGEMM, p, p.abs_a, p.abs_b, p.c);
    std::vector<float> mag = to_host(p.c, nc);
    double scale = 0, d = 0;
    for (size_t i = 0; i < nc; i++) {
        scale = std::max(scale, (double)mag[i]);
        d = std::max(d, std::fabs((double)low[i] - ref[i]));
    }
    return scale > 0 ? d / scale : 0;
}

static void bench_shape(const Options &o, cublasHandle_t h, const GemmShape *s) {
    int m = s->m, k = s->k, n = gemm_shape_n(s, o.images);
    Problem p = problem_create(m, n, k);
    double gflop = 2.0 * m * n * (double)k * 1e-9, ms[KIND_COUNT];
    for (int kind = 0; kind < KIND_COUNT; kind++) ms[kind] = time_kind(o, h, p, (Kind)kind);
    double err_bf = order_error(h, p, KIND_BF16), err_h = order_error(h, p, KIND_FP16);
    printf("| %s | %d x %d x %d | %.2f |", s->name, m, n, k, gflop);
    for (int kind = 0; kind < KIND_COUNT; kind++) printf(" %.3f (%.1f) |", ms[kind], gflop / ms[kind]);
    printf(" %.2fx | %.2fx | %.2fx | %.1e / %.1e (K u %.1e) |\n", ms[KIND_SGEMM] / ms[KIND_TF32],
           ms[KIND_SGEMM] / ms[KIND_BF16], ms[KIND_SGEMM] / ms[KIND_FP16], err_bf, err_h, k * 0x1p-24);
    fflush(stdout);
    problem_free(&p);
}

static void usage(const char *argv0) {
    fprintf(stderr, "usage: %s [--set fmnist,resnet9,square] [--images N] [--max-square N] [--seconds S] "
                    "[--quick]\n", argv0);
    exit(2);
}

static Options parse(int argc, char **argv) {
    Options o;
    snprintf(o.sets, sizeof o.sets, "fmnist,resnet9,square");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quick")) {
            o.images = 8, o.max_square = 1024, o.seconds = 0.005, o.min_groups = 2;
            continue;
        }
        if (!v) usage(argv[0]);
        i++;
        if (!strcmp(a, "--set")) snprintf(o.sets, sizeof o.sets, "%s", v);
        else if (!strcmp(a, "--images")) o.images = atoi(v);
        else if (!strcmp(a, "--max-square")) o.max_square = atoi(v);
        else if (!strcmp(a, "--seconds")) o.seconds = atof(v);
        else usage(argv[0]);
    }
    if (o.images < 1 || o.max_square < 1 || o.seconds < 0) usage(argv[0]);
    return o;
}

static bool shape_selected(const Options &o, const GemmShape *s) {
    char sets[64];
    snprintf(sets, sizeof sets, "%s", o.sets);
    if (!s->n_per_image && s->m > o.max_square) return false;
    char *save = NULL;
    for (char *w = strtok_r(sets, ",", &save); w; w = strtok_r(NULL, ",", &save))
        if (gemm_shape_in(s, w)) return true;
    return false;
}

int main(int argc, char **argv) {
    Options o = parse(argc, argv);
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    cublasHandle_t h;
    CUBLAS_CHECK(cublasCreate(&h));
    // cublasSgemm must stay fp32: the default math mode, never TF32 unless asked (NVIDIA_TF32_OVERRIDE=0 too).
    CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
    int ver = 0;
    CUBLAS_CHECK(cublasGetVersion(h, &ver));
    printf("gemm_lowp: %s (sm_%d%d), cuBLAS %d; images per conv GEMM %d\n\n", prop.name, prop.major, prop.minor,
           ver, o.images);
    printf("| shape | M x N x K | GFLOP | sgemm ms (TFLOP/s) | TF32 ms (TFLOP/s) | bf16 ms (TFLOP/s) | fp16 ms "
           "(TFLOP/s) | TF32 / sgemm | bf16 / sgemm | fp16 / sgemm | bf16 / fp16 vs fp32 of rounded inputs |\n");
    printf("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < GEMM_SHAPE_COUNT; i++)
        if (shape_selected(o, &GEMM_SHAPES[i])) bench_shape(o, h, &GEMM_SHAPES[i]);
    CUBLAS_CHECK(cublasDestroy(h));
    return 0;
}
