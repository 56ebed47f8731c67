// kit/cuda/emu/cuda_emu.h: the CUDA emulator's interface: enough of the CUDA runtime and of cuBLAS for the
// kit's .cu files to compile with the host C++ compiler and run on the CPU (the EMU=1 build, mk/config.mk).
//
// It is reached through the shims include/cuda_runtime.h and include/cublas_v2.h, so the sources keep their
// usual #include lines. What it models and what it does not is in kit/cuda/README.md; in short:
//   - a kernel is an ordinary function; each launch runs its blocks one after another (in a random
//     order), and the threads of a block as cooperative fibers that switch only at __syncthreads(). The
//     order of the threads between two barriers is random per run (KIT_EMU_SEED=n repeats one), so a
//     missing __syncthreads() or a shared-memory race gives a wrong result in some runs;
//   - device memory is host heap memory (the build uses AddressSanitizer, so an out-of-bounds access of a
//     device buffer or of a __shared__ array stops with a report naming the line);
//   - kernels, cuBLAS and everything on the null stream or a default-flags stream are done when the call
//     returns; copies, memsets and event records on a cudaStreamNonBlocking stream are queued and run as
//     LATE as CUDA allows (when waited for), so a missing event wait reads stale data every time;
//   - cublasSgemm and cublasGemmEx are OpenBLAS's cblas_sgemm in column-major order, with cuBLAS's argument
//     checks, on inputs read as the tensor cores read them (bf16/fp16 widened exactly, TF32 truncated).
//
// The C part (types and runtime calls) is also read by the kit's C files (device.c, dist.c, the tests); the
// device side (dim3, threadIdx, __syncthreads, atomics, the launch) is C++ only.
#ifndef KIT_CUDA_EMU_H
#define KIT_CUDA_EMU_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

// ---------------------------------------------------------------- runtime: types

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevice = 101,
    cudaErrorNoDevice = 100,
    cudaErrorInsufficientDriver = 35,
    cudaErrorNoKernelImageForDevice = 209,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchFailure = 719,
} cudaError_t;

typedef enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
} cudaMemcpyKind;

typedef struct KitEmuStream *cudaStream_t;  // non-blocking streams are lazy (cuda_emu.cc)
typedef struct KitEmuEvent *cudaEvent_t;

#define cudaStreamDefault 0x0
#define cudaStreamNonBlocking 0x1
#define cudaEventDefault 0x0
#define cudaEventDisableTiming 0x2

// The fields the kit and the usual "print my GPU" code read; the values describe the emulator.
struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    int warpSize;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    int multiProcessorCount;
    int major, minor;
};

// ---------------------------------------------------------------- runtime: calls

const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);

cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device);
cudaError_t cudaDeviceGetPCIBusId(char *id, int len, int device);
cudaError_t cudaDeviceSynchronize(void);

cudaError_t cudaMalloc(void **ptr, size_t bytes);
cudaError_t cudaFree(void *ptr);
cudaError_t cudaMallocHost(void **ptr, size_t bytes);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s);
cudaError_t cudaMemset(void *ptr, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void *ptr, int value, size_t bytes, cudaStream_t s);

cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);

// ---------------------------------------------------------------- cuBLAS (the calls the kit makes)

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_ARCH_MISMATCH = 8,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
} cublasStatus_t;

typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 } cublasOperation_t;
// CUBLAS_TF32_TENSOR_OP_MATH: cublasSgemm (and cublasGemmEx with float32 inputs and CUBLAS_COMPUTE_32F) read
// their inputs as TF32, as the tensor cores do (cuda_emu.cc, emu_tf32; kit/cuda/README.md).
typedef enum { CUBLAS_DEFAULT_MATH = 0, CUBLAS_PEDANTIC_MATH = 2, CUBLAS_TF32_TENSOR_OP_MATH = 3 } cublasMath_t;
typedef struct KitEmuBlas *cublasHandle_t;

// The element types and compute types of cublasGemmEx, with the toolkit's names and values (library_types.h,
// cublas_api.h), so that a .cu file compiles the same under nvcc and here. A 16-bit element is 2 bytes of
// storage: bf16 is float32's top half, fp16 IEEE binary16.
typedef enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 } cudaDataType;
typedef enum {
    CUBLAS_COMPUTE_32F = 68,            // products and sums in float32 (16-bit inputs: exact products)
    CUBLAS_COMPUTE_32F_FAST_TF32 = 77,  // float32 inputs read as TF32 (10 mantissa bits), float32 sums
} cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1, CUBLAS_GEMM_DEFAULT_TENSOR_OP = 99 } cublasGemmAlgo_t;

cublasStatus_t cublasCreate(cublasHandle_t *handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t s);
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode);
// C = alpha op(A) op(B) + beta C, column-major, with cuBLAS's checks (INVALID_VALUE for a negative size
// or a leading dimension smaller than the rows of its matrix).
cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                           int k, const float *alpha, const float *A, int lda, const float *B, int ldb,
                           const float *beta, float *C, int ldc);
// C = alpha op(A) op(B) + beta C with typed A, B and C. What the emulator takes is what cuBLAS supports for
// these types: A and B of one type (CUDA_R_32F, CUDA_R_16BF or CUDA_R_16F), C in CUDA_R_32F, alpha and beta
// float32; CUBLAS_COMPUTE_32F, or CUBLAS_COMPUTE_32F_FAST_TF32 with float32 A and B. Anything else is
// CUBLAS_STATUS_NOT_SUPPORTED; bad sizes and leading dimensions are CUBLAS_STATUS_INVALID_VALUE, as cublasSgemm.
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo);

// ---------------------------------------------------------------- the emulator itself

// For the emulated cuDNN (cudnn_emu.cc): element i of p (CUDA_R_32F, _16BF or _16F) widened exactly to float32;
// a float32 read as TF32 (its top 10 mantissa bits); running a lazy stream's queue before a call that runs now.
float kit_emu_widen(cudaDataType type, const void *p, size_t i);
float kit_emu_tf32(float x);
void kit_emu_stream_flush(cudaStream_t s);

// Runs every thread of every block of one launch; `body` runs the kernel with its arguments for the
// current thread (threadIdx/blockIdx are set). Launch errors go to cudaGetLastError, as on a GPU.
typedef struct {
    unsigned x, y, z;
} KitEmuDim;
void kit_emu_run(const char *kernel, KitEmuDim grid, KitEmuDim block, size_t shmem, cudaStream_t stream,
                 void (*body)(void *), void *ctx);

#ifdef __cplusplus
}  // extern "C"

// ---------------------------------------------------------------- device side (C++ only)

#include <math.h>
#include <string.h>

// As in CUDA's own headers: typed pointers need no cast in C++.
template <typename T>
inline cudaError_t cudaMalloc(T **ptr, size_t bytes) { return cudaMalloc((void **)ptr, bytes); }
template <typename T>
inline cudaError_t cudaMallocHost(T **ptr, size_t bytes) { return cudaMallocHost((void **)ptr, bytes); }

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// One copy per kernel, shared by the fibers of the block that runs: blocks run one after another and
// launches never overlap (one lock for all of them), so this is per-block storage. Statics also get
// AddressSanitizer's red zones, which is how an access past a __shared__ array is caught.
#define __shared__ static

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};

// Read-only views of the running thread's indices (set by the scheduler before each switch).
extern const uint3 &threadIdx;
extern const uint3 &blockIdx;
extern const dim3 &blockDim;
extern const dim3 &gridDim;
constexpr int warpSize = 32;

// The barrier: the calling fiber waits until every thread of its block has reached it.
void __syncthreads(void);
// Memory fences order nothing here: fibers of one block never run at the same time.
inline void __threadfence(void) {}
inline void __threadfence_block(void) {}

// Type-punning intrinsics: a float's bits as an unsigned int and back (memcpy: the defined way in C++).
inline unsigned __float_as_uint(float x) {
    unsigned u;
    memcpy(&u, &x, sizeof u);
    return u;
}
inline float __uint_as_float(unsigned u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

// Atomics: fibers switch only at barriers, so a plain read-modify-write is atomic. Returns the old value.
template <typename T>
inline T kit_emu_atomic_rmw(T *p, T v, int op) {
    T old = *p;
    switch (op) {
    case 0: *p = old + v; break;
    case 1: *p = v; break;
    case 2: *p = v > old ? v : old; break;
    case 3: *p = v < old ? v : old; break;
    }
    return old;
}
template <typename T>
inline T atomicAdd(T *p, T v) { return kit_emu_atomic_rmw(p, v, 0); }
template <typename T>
inline T atomicExch(T *p, T v) { return kit_emu_atomic_rmw(p, v, 1); }
template <typename T>
inline T atomicMax(T *p, T v) { return kit_emu_atomic_rmw(p, v, 2); }
template <typename T>
inline T atomicMin(T *p, T v) { return kit_emu_atomic_rmw(p, v, 3); }
template <typename T>
inline T atomicCAS(T *p, T compare, T v) {
    T old = *p;
    if (old == compare) *p = v;
    return old;
}

// The launch: CUDA_LAUNCH(kernel, grid, block, shmem, stream)(args...) (kit/cuda_check.h) becomes
// kit_emu_launch(kernel, ...)(args...). The arguments are converted to the kernel's parameter types once,
// as a call would, and every thread calls the kernel with them (by value, as on a GPU).
template <typename... P>
struct KitEmuLaunch {
    void (*kernel)(P...);
    const char *name;
    dim3 grid, block;
    size_t shmem;
    cudaStream_t stream;

    void operator()(P... args) const {
        auto body = [&]() { kernel(args...); };
        kit_emu_run(name, KitEmuDim{grid.x, grid.y, grid.z}, KitEmuDim{block.x, block.y, block.z}, shmem, stream,
                    [](void *b) { (*static_cast<decltype(body) *>(b))(); }, &body);
    }
};

template <typename... P>
KitEmuLaunch<P...> kit_emu_launch(void (*kernel)(P...), const char *name, dim3 grid, dim3 block, size_t shmem = 0,
                                  cudaStream_t stream = nullptr) {
    return KitEmuLaunch<P...>{kernel, name, grid, block, shmem, stream};
}

#endif  // __cplusplus

#endif  // KIT_CUDA_EMU_H
