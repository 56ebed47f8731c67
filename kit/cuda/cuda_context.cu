// kit/cuda/cuda_context.cu: per-thread streams and cuBLAS handles (see cuda_context.h).
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "kit/cuda/cuda_context.h"
#include "kit/cuda_check.h"

namespace {

// Everything one host thread needs on one GPU.
struct GpuState {
    bool ready = false;
    cudaStream_t compute = nullptr;  // blocking: ordered with device.c's legacy-stream calls
    cublasHandle_t blas = nullptr;
    bool tf32 = false;               // the math mode last applied to `blas`
    int *flags = nullptr;            // (2) cuda_device_flags(), allocated on first use
    unsigned long long *counters = nullptr;  // (4) cuda_device_counters(), allocated on first use
};

// Enough for any single node; cudaGetDevice beyond it is reported, not indexed out of bounds.
constexpr int kMaxGpus = 64;

struct ThreadState {
    GpuState gpu[kMaxGpus];
    double *scratch = nullptr;
    size_t scratch_count = 0;

    // Runs when the thread exits (and for the main thread inside exit()). Errors are ignored on
    // purpose: at exit after a failed CUDA call the context may already be unusable, and the
    // report that matters has been printed.
    ~ThreadState() {
        for (int d = 0; d < kMaxGpus; d++) {
            GpuState &g = gpu[d];
            if (!g.ready) continue;
            if (g.flags) cudaFree(g.flags);
            if (g.counters) cudaFree(g.counters);
            cublasDestroy(g.blas);
            cudaStreamDestroy(g.compute);
        }
        free(scratch);
    }
};

thread_local ThreadState tls;

// -1: not read from the environment yet; 0 or 1 afterwards.
std::atomic<int> g_tf32{-1};
// 0: the default budget.
std::atomic<size_t> g_conv_budget{0};
constexpr size_t kDefaultConvBudget = (size_t)1 << 26;

bool tf32_wanted() {
    int v = g_tf32.load();
    if (v < 0) {
        const char *env = getenv("KIT_TF32");
        int want = (env && strcmp(env, "1") == 0) ? 1 : 0;
        int expected = -1;
        g_tf32.compare_exchange_strong(expected, want);  // a concurrent cuda_set_tf32 wins
        v = g_tf32.load();
    }
    return v == 1;
}

void apply_math_mode(GpuState &g) {
    bool want = tf32_wanted();
    if (g.tf32 == want) return;
    CUBLAS_CHECK(cublasSetMathMode(g.blas, want ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    g.tf32 = want;
}

GpuState &gpu_state() {
    int dev = -1;
    CUDA_CHECK(cudaGetDevice(&dev));
    CHECK(dev >= 0 && dev < kMaxGpus, "more GPUs than the kit supports in one process (64)");
    GpuState &g = tls.gpu[dev];
    if (!g.ready) {
        CUDA_CHECK(cudaStreamCreate(&g.compute));
        CUBLAS_CHECK(cublasCreate(&g.blas));
        CUBLAS_CHECK(cublasSetStream(g.blas, g.compute));
        CUBLAS_CHECK(cublasSetMathMode(g.blas, CUBLAS_DEFAULT_MATH));
        g.tf32 = false;
        g.ready = true;
    }
    return g;
}

}  // namespace

extern "C" {

cudaStream_t cuda_stream(void) { return gpu_state().compute; }

cublasHandle_t cuda_cublas(void) {
    GpuState &g = gpu_state();
    apply_math_mode(g);
    return g.blas;
}

void cuda_set_tf32(bool on) { g_tf32.store(on ? 1 : 0); }

double *cuda_host_scratch(size_t count) {
    if (count > tls.scratch_count) {
        double *p = (double *)realloc(tls.scratch, count * sizeof(double));
        tls.scratch = CHECK_ALLOC(p);
        tls.scratch_count = count;
    }
    return tls.scratch;
}

int *cuda_device_flags(void) {
    GpuState &g = gpu_state();
    if (!g.flags) CUDA_CHECK(cudaMalloc(&g.flags, 2 * sizeof(int)));
    return g.flags;
}

unsigned long long *cuda_device_counters(void) {
    GpuState &g = gpu_state();
    if (!g.counters) CUDA_CHECK(cudaMalloc(&g.counters, 4 * sizeof(unsigned long long)));
    return g.counters;
}

void cuda_conv_set_work_budget(size_t floats) { g_conv_budget.store(floats); }

size_t cuda_conv_work_budget(void) {
    size_t b = g_conv_budget.load();
    return b ? b : kDefaultConvBudget;
}

}  // extern "C"
