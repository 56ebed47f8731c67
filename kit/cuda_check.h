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
#define CUDA_HINT_NO_GPU "no usable GPU or driver: run `nvidia-smi`; on a machine without a GPU use --device cpu"
#define CUDA_HINT_BOUNDS "a kernel read or wrote out of bounds: rerun under `compute-sanitizer --tool memcheck`"
static inline const char *cuda_hint(cudaError_t e) {
    static const CheckText hints[] = {
        {cudaErrorNoDevice, CUDA_HINT_NO_GPU},
        {cudaErrorInsufficientDriver, CUDA_HINT_NO_GPU},
        {cudaErrorMemoryAllocation,
         "the GPU is out of memory: lower --batch-size or --width, or check `nvidia-smi` for other processes"},
        {cudaErrorIllegalAddress, CUDA_HINT_BOUNDS},
        {cudaErrorLaunchFailure, CUDA_HINT_BOUNDS},
        {cudaErrorInvalidDevice, "the device index is larger than the number of GPUs (CUDA_VISIBLE_DEVICES?)"},
        {cudaErrorNoKernelImageForDevice, "the binary has no code for this GPU: rebuild with CUDA_ARCH=<your sm number>"},
    };
    return CHECK_TEXT(e, hints, "if this follows a kernel launch, run with CUDA_LAUNCH_BLOCKING=1 to find the failing kernel");
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

#define CUBLAS_NAME(s) {s, #s}
static inline const char *cublas_status_name(cublasStatus_t s) {
    static const CheckText names[] = {
        CUBLAS_NAME(CUBLAS_STATUS_NOT_INITIALIZED), CUBLAS_NAME(CUBLAS_STATUS_ALLOC_FAILED),
        CUBLAS_NAME(CUBLAS_STATUS_INVALID_VALUE),   CUBLAS_NAME(CUBLAS_STATUS_ARCH_MISMATCH),
        CUBLAS_NAME(CUBLAS_STATUS_EXECUTION_FAILED), CUBLAS_NAME(CUBLAS_STATUS_NOT_SUPPORTED),
    };
    return CHECK_TEXT(s, names, "cuBLAS error");
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
