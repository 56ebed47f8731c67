// kit/cpu_bf16.h: bf16 GEMMs on the CPU, for real: oneDNN's matmul with bf16 inputs, float32 accumulation and a
// float32 result, on AMX-BF16 tiles or AVX512-BF16 dot products (oneDNN picks; cpu_bf16_isa says which).
//
// What uses it: conv and linear on the CPU (kit/ops_cpu.c) when the CPU's GEMM precision is GEMM_BF16
// (device_set_gemm_precision(DEVICE_CPU, GEMM_BF16), kit/device.h; lesson 10 sets it with --precision bf16 where
// cpu_bf16_available says yes). Each op rounds its GEMM inputs (columns, weights, output gradients) to bf16 as it
// stores them (the bits round_lowp gives, in the layout cpu_bf16_elem_bytes says), so the products are those of lesson 10's emulation and
// only the order of the float32 sums differs. A CPU without bf16 kernels (AVX2: oneDNN answers "unimplemented")
// keeps the emulation, and the program says so.
//
// Without oneDNN at build time (no libdnnl-dev), cpu_bf16_available is false with that reason.
#ifndef KIT_CPU_BF16_H
#define KIT_CPU_BF16_H

#include <stdbool.h>
#include <stddef.h>

#ifdef KIT_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>

#include "kit/check.h"

// A oneDNN call that must succeed: on failure, file:line, the call, its status and a hint (kit/check.h's report).
#define DNNL_CHECK(call)                                                                                      \
    do {                                                                                                      \
        dnnl_status_t dnnl_s_ = (call);                                                                       \
        if (dnnl_s_ != dnnl_success)                                                                          \
            check_failf(__FILE__, __LINE__, #call,                                                            \
                        "oneDNN refused: dnnl_unimplemented means no kernel for these data types on this CPU " \
                        "(ONEDNN_VERBOSE=1 lists what it tried); dnnl_out_of_memory, no memory",               \
                        "dnnl_status_t %d", (int)dnnl_s_);                                                    \
    } while (0)
#endif

#ifdef __cplusplus
extern "C" {
#endif

// Does this CPU multiply bf16 for real: oneDNN built in, a bf16 matmul for this CPU, and bf16 instructions to run it
// (AVX512-BF16 or AMX-BF16)? When not, and why is not NULL, *why says why. Probed once (a tiny primitive), then
// remembered. An AVX-512 CPU without bf16 instructions has a oneDNN bf16 matmul that widens to float32 in its
// kernel: no faster than the emulation, so not available (lesson 10 emulates there), though it exists.
// The environment variable KIT_CPU_BF16, read at the probe:
//   0       the path is off: unavailable, "switched off (KIT_CPU_BF16=0)"; lesson 10 then emulates on this CPU too,
//           which puts the emulation beside the real path on one machine (bench/precision_runs.py)
//   fp32    the tests' stand-in (CPU_BF16_IN_FP32 below) for the whole process: available wherever oneDNN is built
//           in, on any CPU, so a program runs every line of its bf16 path (make test runs lesson 10 so); the numerics
//           of the real kernel, not its speed, and cpu_bf16_isa says so
bool cpu_bf16_available(const char **why);
// Has oneDNN a bf16 matmul for this CPU at all (AVX-512 or later; or KIT_CPU_BF16=fp32's stand-in)? The tests run
// the real kernel wherever it exists.
bool cpu_bf16_kernel_exists(void);

// What runs it, for the program's first lines: "AMX-BF16", "AVX512-BF16", or "AVX-512 (bf16 converted to float32
// in the kernel...)"; and oneDNN's own name for its implementation ("brg:avx512_core_amx", ...). "none" when no
// kernel exists.
const char *cpu_bf16_isa(void);
const char *cpu_bf16_impl(void);

// Where the GEMM inputs live.
//   CPU_BF16_2BYTES   bf16 in 2 bytes, oneDNN's bf16 matmul: the real path (the default)
//   CPU_BF16_IN_FP32  the same bf16 values in float32 containers, oneDNN's float32 matmul: the same exact products
//                     and float32 sums, on any CPU. For the tests, where the CPU has no bf16 kernel: every line of
//                     the path runs but the kernel's data type. A program never sets it.
typedef enum { CPU_BF16_2BYTES, CPU_BF16_IN_FP32 } CpuBf16Storage;
void cpu_bf16_set_storage(CpuBf16Storage s);
CpuBf16Storage cpu_bf16_storage(void);
// Bytes per GEMM input element: 2, or 4 in CPU_BF16_IN_FP32.
size_t cpu_bf16_elem_bytes(void);
// Can cpu_bf16_gemm run with the storage set now: the kernel exists (CPU_BF16_2BYTES), or oneDNN is built in
// (CPU_BF16_IN_FP32)? When not, *why (if why) says why. device_set_gemm_precision(DEVICE_CPU, GEMM_BF16) asks.
bool cpu_bf16_ready(const char **why);

// C (m, n) = op(A) op(B) + beta C, row-major, A and B bf16 values stored as cpu_bf16_storage says, C float32;
// beta 0 or 1.
// op(A) is A (m, k), or A stored (k, m) when ta; likewise B (k, n), or (n, k) when tb. Runs on the calling thread
// alone inside an OpenMP parallel region, else on every OpenMP thread. Dies with the reason when the CPU has no
// bf16 kernel (callers check cpu_bf16_available first).
void cpu_bf16_gemm(bool ta, bool tb, int m, int n, int k, const void *a, int lda, const void *b, int ldb, float beta,
                   float *c, int ldc);

// A buffer of at least `bytes` for this thread's use, slot 0..CPU_BF16_SCRATCH_SLOTS-1 (the converted weights,
// output gradients...): kept and reused by the calling thread, grown when asked for more, freed at exit.
enum { CPU_BF16_SCRATCH_SLOTS = 3 };
void *cpu_bf16_scratch(int slot, size_t bytes);

#ifdef __cplusplus
}
#endif

#endif  // KIT_CPU_BF16_H
