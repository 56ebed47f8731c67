// kit/device.c: device selection and memory (see device.h).
#include "kit/device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit/check.h"
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

void *device_alloc(Device d, size_t bytes) {
    void *p = NULL;
    if (bytes == 0) bytes = 1;  // a valid pointer even for empty tensors
#ifdef KIT_CUDA
    if (d == DEVICE_CUDA) {
        CUDA_CHECK(cudaMalloc(&p, bytes));
        return p;
    }
#endif
    CHECK(d == DEVICE_CPU, "this binary was built without CUDA: use --device cpu");
    size_t rounded = (bytes + 63) / 64 * 64;
    p = CHECK_ALLOC(aligned_alloc(64, rounded));
    return p;
}

void device_free(Device d, void *ptr) {
    if (!ptr) return;
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
