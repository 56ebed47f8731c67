// kit/device.h: where tensors live, and the few memory calls that differ by device.
//
// One binary serves both devices. It is built with CUDA when nvcc and cuBLAS are
// found (KIT_CUDA defined), CPU-only otherwise; the device is chosen at run time
// with --device auto|cpu|cuda.
#ifndef KIT_DEVICE_H
#define KIT_DEVICE_H

#include <stdbool.h>
#include <stddef.h>

#include "kit/mem.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DEVICE_CPU = 0, DEVICE_CUDA = 1 } Device;

// "cpu", "cuda", or "cuda-emu" for the CUDA backend of the EMU=1 build.
const char *device_name(Device d);

// True when this binary was built with the CUDA backend.
bool device_cuda_built(void);

// True when CUDA is built in AND a usable GPU is present. When false and
// `why` is not NULL, *why says why (no driver, no device, not built with CUDA).
bool device_cuda_usable(const char **why);

// Parses "auto", "cpu", "cuda" or "cuda-emu" into *out. Returns false on an unknown name.
// "cuda-emu" is the CUDA backend of the EMU=1 build (the CPU emulator, kit/cuda/README.md): there it is
// the only CUDA there is ("cuda" means it too, and auto never picks it); other builds refuse it clearly.
// "auto" picks CUDA when usable, else CPU, and prints one line saying which and why
// (unless quiet). "cuda" when CUDA is not usable is a clear error (exit 1).
bool device_parse(const char *arg, Device *out, bool quiet);
// --tf32 (kit/cli.h): cli_parse records it here, and every later device_parse applies it to the device it
// returns: a CUDA device gets TF32 convolution GEMMs (device_set_gemm_precision(d, GEMM_TF32), for the whole
// process), the CPU stops the program with the reason (exit status 2): TF32 is a tensor-core format.
void device_request_tf32(bool on);

// The precision of the GEMMs of conv and linear on a device (device_set_gemm_precision).
//   GEMM_FP32  cublasSgemm: float32 inputs, products and sums (the default; what the tests compare to the CPU)
//   GEMM_TF32  the CONVOLUTIONS' GEMMs on TF32 tensor cores (inputs read with 10 mantissa bits, float32 sums);
//              linear stays float32: PyTorch's default (allow_tf32 on for cuDNN, off for matmul)
//   GEMM_BF16, GEMM_FP16  conv and linear store their GEMM inputs (columns, weights, output gradients) in 2 bytes
//              and run cublasGemmEx on tensor cores with float32 accumulation and float32 output; on the CPU, bf16
//              only: oneDNN's bf16 matmul (kit/cpu_bf16.h: AMX or AVX512-BF16), float32 accumulation and output
typedef enum { GEMM_FP32, GEMM_TF32, GEMM_BF16, GEMM_FP16 } GemmPrecision;

// The one switch for how conv and linear run their GEMMs on device d, for the whole process (every thread, every
// op; kit/cuda/conv.cu and kit/ops_cpu.c read it at each call). The CPU takes GEMM_FP32, or GEMM_BF16 where
// cpu_bf16_available (kit/cpu_bf16.h) says it has a bf16 kernel; anything else stops with the reason (the CPU's other
// low precision is lesson 10's emulation: round_lowp at the policy's points).
// GEMM_BF16/FP16 round each GEMM input to the format (to nearest even, the bits round_lowp gives) as they store it
// in 2 bytes; everything else (BN, the loss, the optimizer, the parameters) stays float32, and so do the
// activations between layers and their gradients unless the model stores them in the same 16-bit format
// (model_store_activations).
void device_set_gemm_precision(Device d, GemmPrecision p);
GemmPrecision device_gemm_precision(Device d);
// "fp32", "tf32", "bf16", "fp16".
const char *gemm_precision_name(GemmPrecision p);
// What runs conv2d's GEMM-shaped passes on device d, for a program's first lines: on CUDA, cuDNN (its version) or
// im2col + cuBLAS and why (kit/cuda/cuda_context.h, cuda_conv_use_cudnn); on the CPU, the kit's own im2col or
// Winograd around OpenBLAS (or oneDNN's bf16 matmul under GEMM_BF16).
const char *device_conv_engine(Device d);

// The GPU this thread uses (cudaSetDevice). No-op on CPU. Lessons with several
// GPUs call it once per thread/rank before any allocation.
void device_set_gpu(int index);
int device_gpu_count(void);

// Memory on the device. Never returns NULL (exits with a report instead).
// CPU memory is 64-byte aligned.
void *device_alloc(Device d, size_t bytes);
void device_free(Device d, void *ptr);

// Every device_alloc is counted (kit/mem.h: mem_stats, live and peak bytes by part). device_alloc(d, n) is
// device_alloc_as(d, n, MEM_OTHER).
void *device_alloc_as(Device d, size_t bytes, MemPart part);
void device_memset_zero(Device d, void *ptr, size_t bytes);
// Copies between host and the device (synchronous). On CPU these are memcpy.
void device_copy_to(Device d, void *dst_device, const void *src_host, size_t bytes);
void device_copy_from(Device d, void *dst_host, const void *src_device, size_t bytes);
void device_copy(Device d, void *dst_device, const void *src_device, size_t bytes);
// Waits for all work queued on the device (no-op on CPU).
void device_synchronize(Device d);

// Host memory for batches in flight: page-locked (pinned) when the CUDA backend is usable, so the copy
// engine reads it directly (pageable memory goes through a driver staging buffer, at about half the
// bandwidth); plain aligned memory otherwise.
void *host_alloc_pinned(size_t bytes);
void host_free_pinned(void *ptr);

#ifdef __cplusplus
}
#endif

#endif // KIT_DEVICE_H
