// kit/cuda/cuda_internal.h: helpers shared by the kit's .cu files (never included from C).
#ifndef KIT_CUDA_INTERNAL_H
#define KIT_CUDA_INTERNAL_H

#if !defined(__CUDACC__) && !defined(KIT_CUDA_EMU)
#error "cuda_internal.h is for .cu files only"
#endif

#include <stddef.h>
#include <stdint.h>

#include <type_traits>

#include "kit/cuda_check.h"
#include "kit/cuda/cuda_context.h"
#include "kit/ops_dims.h"

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

// The statements after `kernel` (its CUDA_LAUNCH and the check), timed alone under the kernel profile
// (cuda_context.h). Variadic because the statements hold commas.
#define KIT_PROFILED(kernel, ...)                                                          \
    do {                                                                                   \
        const bool kit_prof_ = cuda_profile_on();                                          \
        if (kit_prof_) cuda_profile_before(#kernel);                                       \
        __VA_ARGS__                                                                        \
        if (kit_prof_) cuda_profile_after();                                               \
    } while (0)

// Launches a grid-stride kernel over n items on this thread's compute stream and checks the launch.
// Nothing is launched for n == 0 (a grid of zero blocks is a launch error).
#define KIT_LAUNCH(kernel, n, ...)                                                         \
    do {                                                                                   \
        size_t kit_n_ = (size_t)(n);                                                       \
        if (kit_n_ > 0) {                                                                  \
            KIT_PROFILED(kernel, {                                                         \
                CUDA_LAUNCH(kernel, kit_grid(kit_n_), KIT_BLOCK, 0, cuda_stream())(__VA_ARGS__); \
                CUDA_CHECK_LAUNCH();                                                       \
            });                                                                            \
        }                                                                                  \
    } while (0)

// ---------------------------------------------------------------- index arithmetic without division
// An index kernel turns a flat thread index into coordinates (image, channel, row, column). A 64-bit `/` or
// `%` is a long software routine on a GPU (tens of instructions, more than the load and store it places), a
// 32-bit one still about twenty. The kit's index kernels therefore
//   - use 32-bit indices within one image or one chunk, where the plan has checked that they fit (int),
//     and 64-bit only for the base offset of an image or row (a multiply, never a division);
//   - map the grid's y dimension to images or channels (kit_grid_2d), so most coordinates are loop counters;
//   - divide by the remaining runtime constants (P*Q, Q, W, H*W, stride) with KitDiv: a multiply-high,
//     an add and a shift, from a magic number made once on the host.
//
// KitDiv: n / d for every 0 <= n < 2^31 and 1 <= d < 2^31 (Granlund and Montgomery, "Division by invariant
// integers using multiplication", PLDI 1994). With s = ceil(log2 d) and m = floor(2^32 (2^s - d) / d) + 1,
// the 33-bit multiplier M = 2^32 + m is floor(2^(32+s) / d) + 1 = (2^(32+s) + e) / d with 0 < e <= d <= 2^s.
// Then n * M / 2^(32+s) = n / d + n e / (d 2^(32+s)), and the extra term is below 1/d because
// n e < 2^31 2^s < 2^(32+s): it never carries floor(n / d) past the next integer. kit_div computes
// floor(n M / 2^(32+s)) as (mulhi(n, m) + n) >> s; mulhi(n, m) <= n < 2^31 keeps the sum in 32 bits.
// tests/test_emu.cu checks it against `/` on the edge cases of many divisors.
struct KitDiv {
    unsigned d, m, s;
};

static inline KitDiv kit_div_make(long long d) {
    CHECK(d >= 1 && d <= 0x7FFFFFFF, "kit_div_make: the divisor must be in [1, 2^31)");
    KitDiv v;
    v.d = (unsigned)d;
    v.s = 0;
    while ((1ull << v.s) < (unsigned long long)d) v.s++;
    v.m = (unsigned)(((1ull << 32) * ((1ull << v.s) - (unsigned long long)d)) / (unsigned long long)d + 1);
    return v;
}

// n / v.d for n < 2^31. (The 64-bit product's high half is one mul.hi.u32 under nvcc.)
__host__ __device__ inline unsigned kit_div(unsigned n, KitDiv v) {
    unsigned hi = (unsigned)(((unsigned long long)n * v.m) >> 32);
    return (hi + n) >> v.s;
}

// A 2-D grid: x covers nx items in blocks of KIT_BLOCK threads (capped like kit_grid: kernels loop over x),
// y covers ny rows (images, channels), at most 65535 of them (CUDA's limit; kernels loop over y too).
static inline dim3 kit_grid_2d(size_t nx, size_t ny) {
    return dim3(kit_grid(nx), (unsigned)(ny < 1 ? 1 : ny > 65535 ? 65535 : ny));
}

// The grid-stride loops of a 2-D kernel, in 32-bit unsigned indices (the launch checked that n < 2^31).
#define KIT_LOOP_X(i, n) \
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < (unsigned)(n); i += blockDim.x * gridDim.x)
#define KIT_LOOP_Y(j, n) for (unsigned j = blockIdx.y; j < (unsigned)(n); j += gridDim.y)

// Launches a 2-D kernel (kit_grid_2d) over nx by ny items on the compute stream; nothing for an empty range.
#define KIT_LAUNCH_2D(kernel, nx, ny, ...)                                                           \
    do {                                                                                             \
        size_t kit_nx_ = (size_t)(nx), kit_ny_ = (size_t)(ny);                                       \
        CHECK(kit_nx_ <= 0x7FFFFFFF && kit_ny_ <= 0x7FFFFFFF, #kernel ": more than 2^31 items in one " \
              "dimension (the kit's index kernels use 32-bit indices)");                             \
        if (kit_nx_ > 0 && kit_ny_ > 0) {                                                            \
            KIT_PROFILED(kernel, {                                                                   \
                CUDA_LAUNCH(kernel, kit_grid_2d(kit_nx_, kit_ny_), KIT_BLOCK, 0, cuda_stream())(__VA_ARGS__); \
                CUDA_CHECK_LAUNCH();                                                                 \
            });                                                                                      \
        }                                                                                            \
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

// ---------------------------------------------------------------- 16-bit storage
// A bf16 or an fp16 as its 16 bits: two types, so that a kernel template picks the conversion. Same size and
// layout as CUDA's __nv_bfloat16 and __half, which is what cublasGemmEx reads for CUDA_R_16BF and CUDA_R_16F.
// A kernel templated on its storage type T (float, Bf16 or Fp16) reads with kit_load and writes with
// kit_store<T>, and computes in float32 in between: for T = float both are the identity, so the float32
// instance is the kernel as it was before there were 16-bit types.
struct Bf16 {
    uint16_t bits;
};
struct Fp16 {
    uint16_t bits;
};

// fp16 bits of a float32 that lowp_fp16_bits has already rounded: kit/ops_dims.h, shared with the emulated cuDNN.
__device__ __forceinline__ uint16_t fp16_pack(uint32_t r) { return lowp_fp16_pack(r); }

// The float32 an fp16 stands for (every fp16 is a float32 exactly).
__device__ __forceinline__ float fp16_unpack(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 31u) return __uint_as_float(sign | 0x7F800000u | (m << 13));  // inf, NaN (payload kept)
    if (e != 0u) return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
    const float sub = (float)m * 5.9604644775390625e-8f;  // m x 2^-24: a subnormal, exact in float32
    return sign ? -sub : sub;
}

// v as storage type T: float as it is, 16 bits rounded to nearest even (the bits round_lowp gives).
template <typename T>
__device__ __forceinline__ T kit_store(float v) {
    if constexpr (std::is_same<T, float>::value) {
        return v;
    } else if constexpr (std::is_same<T, Bf16>::value) {
        return Bf16{(uint16_t)(lowp_bf16_bits(__float_as_uint(v)) >> 16)};
    } else {
        static_assert(std::is_same<T, Fp16>::value, "kit_store: float, Bf16 or Fp16");
        return Fp16{fp16_pack(lowp_fp16_bits(__float_as_uint(v)))};
    }
}

__device__ __forceinline__ float kit_load(float v) { return v; }
__device__ __forceinline__ float kit_load(Bf16 v) { return __uint_as_float((uint32_t)v.bits << 16); }
__device__ __forceinline__ float kit_load(Fp16 v) { return fp16_unpack(v.bits); }

// Calls fn(KitType<T>{}) with T the storage type of format f (LOWP_FP32: float): the one switch from a run-time
// format to a kernel template. Inside, `using T = typename decltype(tag)::type;`.
template <typename T>
struct KitType {
    using type = T;
};
template <typename Fn>
void kit_with_type(LowpFormat f, Fn &&fn) {
    if (f == LOWP_BF16) fn(KitType<Bf16>{});
    else if (f == LOWP_FP16) fn(KitType<Fp16>{});
    else fn(KitType<float>{});
}

// dx += v, stored as X: for float the plain +=; for 16 bits the float32 sum rounded once.
template <typename X>
__device__ __forceinline__ void kit_add_to(X *dx, float v) {
    *dx = kit_store<X>(kit_load(*dx) + v);
}

// Host-side argument checks shared by the ops.
#define KIT_CHECK_PTR(p) CHECK((p) != NULL, #p " must not be NULL here (see kit/ops.h)")

#endif // KIT_CUDA_INTERNAL_H
