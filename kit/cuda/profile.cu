// kit/cuda/profile.cu: the kernel profile (cuda_context.h): every kit kernel launched while it is on is
// bracketed by two CUDA events on the compute stream; cuda_profile_stop waits for them and sums the GPU time
// per kernel. For bench/bench_profile.c, on the thread that runs the model; other threads are not recorded.
#include <stdlib.h>
#include <string.h>

#include "kit/cuda_check.h"
#include "kit/cuda/cuda_context.h"

namespace {

struct Record {
    const char *kernel;
    cudaEvent_t before, after;
};

struct Profile {
    bool on = false;
    Record *records = nullptr;  // the first `used` are this profile's; events are kept for the next one
    size_t used = 0, cap = 0;
};

thread_local Profile g_profile;

}  // namespace

extern "C" bool cuda_profile_on(void) { return g_profile.on; }

extern "C" void cuda_profile_start(void) {
    g_profile.used = 0;
    g_profile.on = true;
}

extern "C" void cuda_profile_before(const char *kernel) {
    Profile &p = g_profile;
    if (p.used == p.cap) {
        size_t cap = p.cap ? 2 * p.cap : 1024;
        p.records = (Record *)realloc(p.records, cap * sizeof *p.records);
        CHECK(p.records != NULL, "cuda_profile: out of host memory for the kernel records");
        for (size_t i = p.cap; i < cap; i++) {
            CUDA_CHECK(cudaEventCreate(&p.records[i].before));
            CUDA_CHECK(cudaEventCreate(&p.records[i].after));
        }
        p.cap = cap;
    }
    Record &r = p.records[p.used];
    r.kernel = kernel;
    CUDA_CHECK(cudaEventRecord(r.before, cuda_stream()));
}

extern "C" void cuda_profile_after(void) {
    Profile &p = g_profile;
    CUDA_CHECK(cudaEventRecord(p.records[p.used].after, cuda_stream()));
    p.used++;
}

extern "C" int cuda_profile_stop(CudaProfileRow *rows, int max) {
    Profile &p = g_profile;
    p.on = false;
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
    int n = 0;
    for (size_t i = 0; i < p.used; i++) {
        float ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&ms, p.records[i].before, p.records[i].after));
        int k = 0;
        while (k < n && strcmp(rows[k].kernel, p.records[i].kernel) != 0) k++;
        if (k == n) {
            if (n == max) continue;  // more kernels than rows: the caller's table is full
            rows[n++] = CudaProfileRow{p.records[i].kernel, 0, 0.0};
        }
        rows[k].calls++;
        rows[k].ms += ms;
    }
    qsort(rows, (size_t)n, sizeof *rows, [](const void *a, const void *b) {
        double d = ((const CudaProfileRow *)b)->ms - ((const CudaProfileRow *)a)->ms;
        return d > 0 ? 1 : d < 0 ? -1 : 0;
    });
    p.used = 0;
    return n;
}
