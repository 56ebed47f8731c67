// kit/cuda/cuda_context.cu: per-thread streams and cuBLAS handles (see cuda_context.h).
#include <atomic>
#include <cstdlib>

#include "kit/cuda/cuda_context.h"
#include "kit/cuda_check.h"
#include "kit/mem.h"

namespace {

// The context's own buffers are kit memory too: counted (kit/mem.h) as `other`, so that a run's peak holds the
// 16-bit copies its GEMMs read (conv.cu's Scratch16, linear's inputs), as PyTorch's holds autocast's casts, and
// conv's work (cuDNN's workspace, im2col's columns), as PyTorch's holds cuDNN's workspace.
void *counted_malloc(size_t bytes) {
    void *p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, bytes));
    mem_count(p, bytes, MEM_OTHER);
    return p;
}

// At thread exit errors are ignored (see ~ThreadState); elsewhere they are reported.
void counted_free(void *p, bool check) {
    if (!p) return;
    mem_uncount(p);
    if (check) CUDA_CHECK(cudaFree(p));
    else cudaFree(p);
}

// A GPU buffer grown on demand and kept: see cuda_device_scratch.
struct DeviceBuf {
    void *p = nullptr;
    size_t bytes = 0;
    void *at_least(size_t want) {
        if (want > bytes) {
            counted_free(p, true);  // cudaFree waits for the GPU: no queued kernel still reads the old buffer
            p = counted_malloc(want);
            bytes = want;
        }
        return p;
    }
};

// Everything one host thread needs on one GPU.
struct GpuState {
    bool ready = false;
    cudaStream_t compute = nullptr;  // blocking: ordered with device.c's legacy-stream calls
    cublasHandle_t blas = nullptr;
    int *flags = nullptr;            // (2) cuda_device_flags(), allocated on first use
    unsigned long long *counters = nullptr;  // (4) cuda_device_counters(), allocated on first use
    DeviceBuf scratch;               // cuda_device_scratch()
    DeviceBuf conv_work;             // cuda_conv_work()
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
            counted_free(g.flags, false);
            counted_free(g.counters, false);
            counted_free(g.scratch.p, false);
            counted_free(g.conv_work.p, false);
            cublasDestroy(g.blas);
            cudaStreamDestroy(g.compute);
        }
        free(scratch);
    }
};

thread_local ThreadState tls;

// 0: the default budget.
std::atomic<size_t> g_conv_budget{0};
constexpr size_t kDefaultConvBudget = (size_t)1 << 26;

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
        g.ready = true;
    }
    return g;
}

}  // namespace

extern "C" {

cudaStream_t cuda_stream(void) { return gpu_state().compute; }

cublasHandle_t cuda_cublas(void) { return gpu_state().blas; }

void *cuda_device_scratch(size_t bytes) { return gpu_state().scratch.at_least(bytes); }

void *cuda_conv_work(size_t bytes) { return gpu_state().conv_work.at_least(bytes); }

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
    if (!g.flags) g.flags = (int *)counted_malloc(2 * sizeof(int));
    return g.flags;
}

unsigned long long *cuda_device_counters(void) {
    GpuState &g = gpu_state();
    if (!g.counters) g.counters = (unsigned long long *)counted_malloc(4 * sizeof(unsigned long long));
    return g.counters;
}

void cuda_conv_set_work_budget(size_t floats) { g_conv_budget.store(floats); }

size_t cuda_conv_work_budget(void) {
    size_t b = g_conv_budget.load();
    return b ? b : kDefaultConvBudget;
}

}  // extern "C"
