// kit/cuda_check.h: CHECK macros for the CUDA runtime and cuBLAS (used by device.c and kit/cuda/*.cu).
// Only included when KIT_CUDA is defined.
#ifndef KIT_CUDA_CHECK_H
#define KIT_CUDA_CHECK_H

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "kit/check.h"

#ifdef __cplusplus
extern "C" {
#endif

// The usual causes of a CUDA error, in one line.
static inline const char *cuda_hint(cudaError_t e) {
    switch (e) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
        return "no usable GPU or driver: run `nvidia-smi`; on a machine without a GPU use --device cpu";
    case cudaErrorMemoryAllocation:
        return "the GPU is out of memory: lower --batch-size or --width, or check `nvidia-smi` for other processes";
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
        return "a kernel read or wrote out of bounds: rerun under `compute-sanitizer --tool memcheck`";
    case cudaErrorInvalidDevice:
        return "the device index is larger than the number of GPUs (CUDA_VISIBLE_DEVICES?)";
    case cudaErrorNoKernelImageForDevice:
        return "the binary has no code for this GPU: rebuild with CUDA_ARCH=<your sm number>";
    default:
        return "if this follows a kernel launch, run with CUDA_LAUNCH_BLOCKING=1 to find the failing kernel";
    }
}

#define CUDA_CHECK(call)                                                                  \
    do {                                                                                  \
        cudaError_t cuda_e_ = (call);                                                     \
        if (cuda_e_ != cudaSuccess)                                                       \
            check_fail(__FILE__, __LINE__, #call, cudaGetErrorString(cuda_e_), cuda_hint(cuda_e_)); \
    } while (0)

// After a kernel launch: launch errors show up here, execution errors at the next sync.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

// Every kernel launch is written CUDA_LAUNCH(kernel, grid, block, shared_bytes, stream)(arguments...).
// Under nvcc it is exactly kernel<<<grid, block, shared_bytes, stream>>>(arguments...); in the CPU
// emulator (the EMU=1 build, kit/cuda/README.md) the host compiler cannot read <<<...>>>, and the same
// line becomes a call that runs every thread of the grid.
#ifdef KIT_CUDA_EMU
#define CUDA_LAUNCH(kernel, grid, block, shared_bytes, stream) \
    kit_emu_launch(kernel, #kernel, grid, block, shared_bytes, stream)
#else
#define CUDA_LAUNCH(kernel, grid, block, shared_bytes, stream) kernel<<<grid, block, shared_bytes, stream>>>
#endif

static inline const char *cublas_status_name(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "cuBLAS error";
    }
}

#define CUBLAS_CHECK(call)                                                                \
    do {                                                                                  \
        cublasStatus_t cublas_s_ = (call);                                                \
        if (cublas_s_ != CUBLAS_STATUS_SUCCESS)                                           \
            check_fail(__FILE__, __LINE__, #call, cublas_status_name(cublas_s_),          \
                       "INVALID_VALUE: a dimension or leading dimension is wrong (cuBLAS is column-major); " \
                       "ALLOC_FAILED / NOT_INITIALIZED: the GPU is out of memory or unusable");            \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif // KIT_CUDA_CHECK_H
