// kit/cuda/cuda_internal.h: helpers shared by the kit's .cu files (never included from C).
#ifndef KIT_CUDA_INTERNAL_H
#define KIT_CUDA_INTERNAL_H

#if !defined(__CUDACC__) && !defined(KIT_CUDA_EMU)
#error "cuda_internal.h is for .cu files only"
#endif

#include <stddef.h>

#include "kit/cuda_check.h"
#include "kit/cuda/cuda_context.h"

// Threads per block for every kit kernel. The block reductions below assume exactly this many.
#define KIT_BLOCK 256

// Blocks for a grid-stride loop over n items. Capped because a grid-stride loop does not need one
// thread per item; 4096 blocks of 256 threads fill an H100 (132 SMs x 2048 threads) several times over.
static inline unsigned kit_grid(size_t n) {
    size_t blocks = (n + KIT_BLOCK - 1) / KIT_BLOCK;
    if (blocks > 4096) blocks = 4096;
    return (unsigned)(blocks ? blocks : 1);
}

// The grid-stride loop: every thread of the grid visits i, i + total threads, ... below n.
#define KIT_GRID_LOOP(i, n)                                                                \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (size_t)(n);        \
         i += (size_t)blockDim.x * gridDim.x)

// Launches a grid-stride kernel over n items on this thread's compute stream and checks the launch.
// Nothing is launched for n == 0 (a grid of zero blocks is a launch error).
#define KIT_LAUNCH(kernel, n, ...)                                                         \
    do {                                                                                   \
        size_t kit_n_ = (size_t)(n);                                                       \
        if (kit_n_ > 0) {                                                                  \
            CUDA_LAUNCH(kernel, kit_grid(kit_n_), KIT_BLOCK, 0, cuda_stream())(__VA_ARGS__);   \
            CUDA_CHECK_LAUNCH();                                                           \
        }                                                                                  \
    } while (0)

// Sum of one double per thread over a block of KIT_BLOCK threads, in a fixed order (a tree), so the
// result is the same on every run: the kit never uses floating-point atomics, which is what makes
// training runs on one GPU reproducible bit for bit (lesson 04). `shared` holds KIT_BLOCK doubles.
// Every thread of the block must call it; the total is returned to thread 0 (others get partials).
__device__ inline double kit_block_sum(double v, double *shared) {
    shared[threadIdx.x] = v;
    __syncthreads();
    for (int half = KIT_BLOCK / 2; half > 0; half /= 2) {
        if ((int)threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
        __syncthreads();
    }
    double total = shared[0];
    __syncthreads();  // shared[] may be reused by the caller right after
    return total;
}

// Host-side argument checks shared by the ops.
#define KIT_CHECK_PTR(p) CHECK((p) != NULL, #p " must not be NULL here (see kit/ops.h)")

#endif // KIT_CUDA_INTERNAL_H
