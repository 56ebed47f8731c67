// kit/device.c: device selection and memory (see device.h).
#include "kit/device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit/check.h"
#include "kit/cpu_bf16.h"
#ifdef KIT_CUDA
#include "kit/cuda/cuda_context.h"
#include "kit/cuda_check.h"
#endif

#ifdef KIT_CUDA_EMU
// The EMU=1 build: the CUDA backend is the CPU emulator of kit/cuda/emu (kit/cuda/README.md).
#define CUDA_DEVICE_NAME "cuda-emu"
#else
#define CUDA_DEVICE_NAME "cuda"
#endif

const char *device_name(Device d) { return d == DEVICE_CUDA ? CUDA_DEVICE_NAME : "cpu"; }

const char *device_conv_engine(Device d) {
#ifdef KIT_CUDA
    if (d == DEVICE_CUDA) return cuda_conv_engine();
#endif
    (void)d;
    return "im2col or Winograd around OpenBLAS SGEMM (oneDNN's bf16 matmul under bf16 GEMMs)";
}

bool device_cuda_built(void) {
#ifdef KIT_CUDA
    return true;
#else
    return false;
#endif
}

bool device_cuda_usable(const char **why) {
#ifdef KIT_CUDA
    // Asked once: the answer cannot change during a run, and the first CUDA call is slow.
    static int known = -1;
    static const char *reason = NULL;
    if (known < 0) {
        int count = 0;
        cudaError_t e = cudaGetDeviceCount(&count);
        if (e != cudaSuccess) {
            // No driver (InsufficientDriver) or no device: say it plainly, then in CUDA's words.
            static char text[160];
            snprintf(text, sizeof text, "no GPU on this machine: %s", cudaGetErrorString(e));
            reason = text;
            (void)cudaGetLastError();  // clear the sticky error so later calls start clean
            known = 0;
        } else if (count == 0) {
            reason = "no GPU on this machine: no CUDA device found";
            known = 0;
        } else {
            known = 1;
        }
    }
    if (!known && why) *why = reason;
    return known == 1;
#else
    if (why) *why = "this binary was built without CUDA (nvcc was not found, or NO_CUDA=1)";
    return false;
#endif
}

// The GemmPrecision of every conv and linear, per device kind (device_set_gemm_precision).
static _Atomic int g_gemm_precision = GEMM_FP32, g_cpu_gemm_precision = GEMM_FP32;

void device_set_gemm_precision(Device d, GemmPrecision p) {
    CHECK(p == GEMM_FP32 || p == GEMM_TF32 || p == GEMM_BF16 || p == GEMM_FP16, "device_set_gemm_precision: unknown");
    if (d == DEVICE_CUDA) {
        g_gemm_precision = (int)p;
        return;
    }
    // The CPU: float32 (OpenBLAS), or bf16 through oneDNN where this CPU has a bf16 kernel (kit/cpu_bf16.h; the
    // tests' float32 containers stand in for it wherever oneDNN is built in). TF32 exists only on tensor cores, and oneDNN 2.x has no
    // fp16 matmul on the CPU: fp16 on the CPU is lesson 10's emulation (round_lowp at the policy's points).
    CHECKF(p == GEMM_FP32 || p == GEMM_BF16, "the CPU runs its GEMMs in float32, or in bf16 on AMX/AVX512-BF16",
           "asked for %s GEMMs on the CPU (TF32 is a tensor-core format: use --device cuda; fp16 on the CPU is "
           "lesson 10's --precision, emulated by rounding)", gemm_precision_name(p));
    const char *why = NULL;
    CHECKF(p == GEMM_FP32 || cpu_bf16_ready(&why),
           "bf16 GEMMs on the CPU need oneDNN and a CPU with AVX-512 (AVX512-BF16 or AMX for the speed); elsewhere "
           "lesson 10's --precision bf16 emulates them (check cpu_bf16_available first)", "%s", why);
    g_cpu_gemm_precision = (int)p;
}

GemmPrecision device_gemm_precision(Device d) {
    return (GemmPrecision)(d == DEVICE_CUDA ? g_gemm_precision : g_cpu_gemm_precision);
}

const char *gemm_precision_name(GemmPrecision p) {
    switch (p) {
    case GEMM_FP32: return "fp32";
    case GEMM_TF32: return "tf32";
    case GEMM_BF16: return "bf16";
    case GEMM_FP16: return "fp16";
    }
    return "?";
}

static bool g_tf32_requested;

void device_request_tf32(bool on) { g_tf32_requested = on; }

// --tf32 on the device just chosen (see device.h).
static void device_apply_tf32(Device d) {
    if (!g_tf32_requested) return;
    if (d == DEVICE_CPU) {
        fprintf(stderr, "error: --tf32 needs a CUDA device: TF32 is a format of NVIDIA's tensor cores (Ampere and "
                        "later), and the CPU's GEMMs are float32 (OpenBLAS). Use --device cuda, or drop --tf32.\n");
        exit(2);
    }
    device_set_gemm_precision(d, GEMM_TF32);
}

bool device_parse(const char *arg, Device *out, bool quiet) {
    const char *why = NULL;
    if (strcmp(arg, "cpu") == 0) {
        *out = DEVICE_CPU;
#ifdef KIT_CUDA_EMU
    } else if (strcmp(arg, "cuda-emu") == 0 || strcmp(arg, "cuda") == 0) {
        // Always available here, and never chosen by auto: it is for checking and learning, not for speed.
        if (!quiet)
            fprintf(stderr, "device: cuda-emu: the CUDA code runs in the CPU emulator (kit/cuda/README.md), "
                            "many times slower than --device cpu; use it to check kernels, not to train\n");
        *out = DEVICE_CUDA;
#else
    } else if (strcmp(arg, "cuda-emu") == 0) {
        die("--device cuda-emu: this binary was built for %s; the CUDA emulator is a separate build: "
            "`make EMU=1`, then run the same program from build-emu/ (kit/cuda/README.md)",
            device_cuda_built() ? "a real GPU" : "the CPU only");
    } else if (strcmp(arg, "cuda") == 0) {
        if (!device_cuda_usable(&why)) die("--device cuda: no usable GPU (%s). Use --device cpu or auto.", why);
        *out = DEVICE_CUDA;
#endif
    } else if (strcmp(arg, "auto") == 0) {
#ifdef KIT_CUDA_EMU
        why = "auto never picks the CUDA emulator: ask for it with --device cuda-emu";
        *out = DEVICE_CPU;
#else
        *out = device_cuda_usable(&why) ? DEVICE_CUDA : DEVICE_CPU;
#endif
        if (!quiet) {
            if (*out == DEVICE_CUDA) printf("device: cuda (a usable GPU was found)\n");
            else printf("device: cpu (%s)\n", why);
        }
    } else {
        return false;
    }
    device_apply_tf32(*out);
    return true;
}

int device_gpu_count(void) {
#ifdef KIT_CUDA
    int count = 0;
    if (!device_cuda_usable(NULL)) return 0;
    CUDA_CHECK(cudaGetDeviceCount(&count));
    return count;
#else
    return 0;
#endif
}

void device_set_gpu(int index) {
#ifdef KIT_CUDA
    if (device_cuda_usable(NULL)) CUDA_CHECK(cudaSetDevice(index));
#else
    (void)index;
#endif
}

// ---------------------------------------------------------------- memory

void *device_alloc(Device d, size_t bytes) { return device_alloc_as(d, bytes, MEM_OTHER); }

void *device_alloc_as(Device d, size_t bytes, MemPart part) {
    CHECKF((unsigned)part < MEM_PARTS, "the part is one of MemPart (kit/mem.h)", "part %d", (int)part);
    void *p = NULL;
    size_t asked = bytes;
    if (bytes == 0) bytes = 1;  // a valid pointer even for empty tensors
#ifdef KIT_CUDA
    if (d == DEVICE_CUDA) {
        CUDA_CHECK(cudaMalloc(&p, bytes));
        mem_count(p, asked, part);
        return p;
    }
#endif
    CHECK(d == DEVICE_CPU, "this binary was built without CUDA: use --device cpu");
    size_t rounded = (bytes + 63) / 64 * 64;
    p = CHECK_ALLOC(aligned_alloc(64, rounded));
    mem_count(p, asked, part);
    return p;
}

void device_free(Device d, void *ptr) {
    if (!ptr) return;
    mem_uncount(ptr);
#ifdef KIT_CUDA
    if (d == DEVICE_CUDA) {
        CUDA_CHECK(cudaFree(ptr));
        return;
    }
#endif
    free(ptr);
}

void device_memset_zero(Device d, void *ptr, size_t bytes) {
#ifdef KIT_CUDA
    if (d == DEVICE_CUDA) {
        CUDA_CHECK(cudaMemset(ptr, 0, bytes));
        return;
    }
#endif
    memset(ptr, 0, bytes);
}

void device_copy_to(Device d, void *dst_device, const void *src_host, size_t bytes) {
#ifdef KIT_CUDA
    if (d == DEVICE_CUDA) {
        CUDA_CHECK(cudaMemcpy(dst_device, src_host, bytes, cudaMemcpyHostToDevice));
        return;
    }
#endif
    memcpy(dst_device, src_host, bytes);
}

void device_copy_from(Device d, void *dst_host, const void *src_device, size_t bytes) {
#ifdef KIT_CUDA
    if (d == DEVICE_CUDA) {
        CUDA_CHECK(cudaMemcpy(dst_host, src_device, bytes, cudaMemcpyDeviceToHost));
        return;
    }
#endif
    memcpy(dst_host, src_device, bytes);
}

void device_copy(Device d, void *dst_device, const void *src_device, size_t bytes) {
#ifdef KIT_CUDA
    if (d == DEVICE_CUDA) {
        CUDA_CHECK(cudaMemcpy(dst_device, src_device, bytes, cudaMemcpyDeviceToDevice));
        return;
    }
#endif
    memmove(dst_device, src_device, bytes);
}

void device_synchronize(Device d) {
#ifdef KIT_CUDA
    if (d == DEVICE_CUDA) CUDA_CHECK(cudaDeviceSynchronize());
#else
    (void)d;
#endif
}

void *host_alloc_pinned(size_t bytes) {
    if (bytes == 0) bytes = 1;
#ifdef KIT_CUDA
    if (device_cuda_usable(NULL)) {
        void *p = NULL;
        CUDA_CHECK(cudaMallocHost(&p, bytes));
        return p;
    }
#endif
    return CHECK_ALLOC(aligned_alloc(64, (bytes + 63) / 64 * 64));
}

void host_free_pinned(void *ptr) {
    if (!ptr) return;
#ifdef KIT_CUDA
    if (device_cuda_usable(NULL)) {
        CUDA_CHECK(cudaFreeHost(ptr));
        return;
    }
#endif
    free(ptr);
}
