// kit/cuda/cuda_context.h: the CUDA state every op needs, one set per host thread and GPU.
//
// Streams and ordering (the one rule to remember):
//   - Compute (every kernel and cuBLAS call of the kit) runs on cuda_stream(): a stream created with
//     default flags, i.e. a BLOCKING stream. Blocking streams are implicitly ordered with the legacy
//     default stream, which the synchronous calls in device.c use (cudaMemcpy, cudaMemset). So a
//     device_copy_from() after an op sees the op's result, and an op after device_copy_to() sees the
//     copy, without any explicit synchronisation.
//
// Why per thread: lesson 02 drives several GPUs, one host thread per GPU. A cuBLAS handle is bound to
// the GPU that was current when it was created and is not meant to be shared between threads, so each
// (thread, GPU) pair gets its own handle and streams, created on first use and destroyed when the thread
// exits. Create worker threads once, not once per step: creating a cuBLAS handle costs milliseconds.
//
// Only compiled with the CUDA backend (KIT_CUDA).
#ifndef KIT_CUDA_CONTEXT_H
#define KIT_CUDA_CONTEXT_H

#include <stdbool.h>
#include <stddef.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

// This thread's compute stream on its current GPU (see above).
cudaStream_t cuda_stream(void);
// This thread's cuBLAS handle on its current GPU, bound to cuda_stream(), in CUBLAS_DEFAULT_MATH: cublasSgemm
// computes in float32; tensor cores are asked for per call, by cublasGemmEx's types (kit/cuda/conv.cu).
cublasHandle_t cuda_cublas(void);

// GPU scratch of at least `bytes` for this thread on its current GPU: where conv and linear put their 16-bit
// GEMM inputs that conv's work does not hold (the weights; linear's inputs). It grows when asked for more
// (cudaFree waits for the GPU, so no queued kernel still reads the old one) and is kept until the thread exits.
// Ops use it one after another on the compute stream, so one op's contents are dead when the next op starts.
void *cuda_device_scratch(size_t bytes);

// Host scratch of at least `count` doubles for this thread (the BN sync hook's buffer). It grows when
// asked for more and is kept until the thread exits, so a training loop allocates it once.
double *cuda_host_scratch(size_t count);

// Two ints of GPU memory owned by this thread on its current GPU (cross-entropy's bad-label report).
// Per thread, not a __device__ global: lesson 02 may run two replicas' threads on one GPU at once, and
// a global flag would let one thread's reset hide the other's error (or report it as its own).
int *cuda_device_flags(void);

// Four counters of GPU memory owned by this thread on its current GPU, for kernels that count (round_lowp's
// statistics, count_nonfinite): per thread for the reason the flags above are.
unsigned long long *cuda_device_counters(void);

// conv2d's work on CUDA, for this thread on its current GPU, grown on demand as cuda_device_scratch is (and apart
// from it: a pass holds both): cuDNN's workspace for the algorithm it runs, or, on im2col + cuBLAS, a chunk's
// columns and GEMM output. It lives here rather than in the caller's work buffer (conv2d_work_floats is 0 on CUDA)
// because only the pass knows which engine takes it: a buffer sized for im2col's columns (256 MiB for ResNet-9's
// layer 1 at batch 93 or more) would sit idle while cuDNN used a few MiB of it. Counted as `other` (kit/mem.h).
void *cuda_conv_work(size_t bytes);

// The most conv2d's work may hold, in floats (default 2^26 = 256 MiB): im2col lowers the largest chunk of images
// whose columns fit (at least one image always), and cuDNN runs the best algorithm whose workspace fits. The same
// for every batch size, so the algorithm a shape gets does not depend on the batch it first came with. Tests
// lower it to exercise the multi-chunk path on small shapes. 0 restores the default.
void cuda_conv_set_work_budget(size_t floats);
size_t cuda_conv_work_budget(void);

// conv2d's engine (kit/cuda/conv_cudnn.cu): cuDNN's convolutions where the build has cuDNN and it starts on the
// GPU (the default), else im2col + cuBLAS (kit/cuda/conv.cu); a pass cuDNN has no algorithm for runs on the
// latter. cuda_conv_use_cudnn(false), or KIT_CUDNN=0 in the environment, keeps every pass on im2col + cuBLAS
// (the benchmark's comparison, and tests that check one engine against the other). cuda_conv_engine names the
// engine for a program's first lines. cuda_conv_use_cudnn returns the setting it replaced.
bool cuda_conv_use_cudnn(bool on);
const char *cuda_conv_engine(void);

// Kernel profile (bench/bench_profile.c): between cuda_profile_start and cuda_profile_stop, every kit kernel
// launched through KIT_LAUNCH / KIT_LAUNCH_2D / KIT_PROFILED (kit/cuda/cuda_internal.h) on this thread is
// bracketed by two CUDA events on the compute stream, so its GPU time is measured alone. cuBLAS calls, memsets
// and idle time are not kernels of the kit: they are what a step's time minus the kernels' leaves. The events
// add host work per launch: time whole steps with the profile off. Off (the default), a launch pays one test.
typedef struct {
    const char *kernel;  // the kernel's name (a string literal: kept, never copied)
    long calls;
    double ms;  // their total GPU time
} CudaProfileRow;
void cuda_profile_start(void);
// Waits for the recorded kernels, fills rows (at most max, largest total first) and returns how many kernels
// there were; the profile is off afterwards.
int cuda_profile_stop(CudaProfileRow *rows, int max);
bool cuda_profile_on(void);
void cuda_profile_before(const char *kernel);
void cuda_profile_after(void);

#ifdef __cplusplus
}
#endif

#endif // KIT_CUDA_CONTEXT_H
