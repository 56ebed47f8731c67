// sgd_kernel.cu: the optimizer step of lesson 01 as a CUDA kernel (TODO 2).
// Compiled by nvcc for a GPU, or by the host C++ compiler for the kit's CUDA emulator (make EMU=1, see
// kit/cuda/README.md); graded on the GPU when there is one, else in the emulator.
#include "kit/cuda_check.h"
#include "lesson.h"

// TODO 2: the same update as TODO 1, on the GPU. The launch below caps the grid, so it may start fewer threads
//   than n: whatever the grid size, the threads together must update every i < n exactly once, and nothing
//   past the end (README section 5: the grid-stride loop).
__global__ void sgd_kernel(size_t n, float *param, const float *grad, float *velocity, float lr, float momentum,
                           float weight_decay, int nesterov) {
    // BEGIN SOLUTION
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float g = grad[i] + weight_decay * param[i];
        float v = momentum * velocity[i] + g;
        velocity[i] = v;
        param[i] -= lr * (nesterov ? g + momentum * v : v);
    }
    // END SOLUTION
}

extern "C" void lesson_sgd_update_cuda(size_t n, float *param, const float *grad, float *velocity, float lr,
                                       float momentum, float weight_decay, int nesterov) {
    if (n == 0) return;
    const int threads = 256;
    // Enough blocks to fill the GPU, not one per element: the grid-stride loop does the rest.
    size_t want = (n + threads - 1) / threads;
    int blocks = (int)(want < 4096 ? want : 4096);
    // sgd_kernel<<<blocks, threads>>>(...), written so that the emulator can run it too (kit/cuda_check.h).
    CUDA_LAUNCH(sgd_kernel, blocks, threads, 0, 0)(n, param, grad, velocity, lr, momentum, weight_decay, nesterov);
    CUDA_CHECK_LAUNCH();
}
