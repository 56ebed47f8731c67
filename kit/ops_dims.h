// kit/ops_dims.h: the shapes the operations take and the SyncBN hook type: what the dispatcher (kit/ops.h,
// ops.c) and the per-device implementations (kit/ops_impl.h: ops_cpu.c, winograd.c, kit/cuda/*.cu) share, kept
// below both so that neither needs the other's header.
#ifndef KIT_OPS_DIMS_H
#define KIT_OPS_DIMS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// conv2d: x (N, C, H, W) * w (K, C, R, R) + b (K) -> y (N, K, P, Q)
typedef struct {
    int n, c, h, w;  // input
    int k, r;        // output channels, square kernel size
    int stride, pad;
} Conv2dDims;

// P and Q: (H + 2*pad - R) / stride + 1 and (W + 2*pad - R) / stride + 1.
static inline int conv2d_out_h(const Conv2dDims *s) { return (s->h + 2 * s->pad - s->r) / s->stride + 1; }
static inline int conv2d_out_w(const Conv2dDims *s) { return (s->w + 2 * s->pad - s->r) / s->stride + 1; }

// batch norm (2-D, per channel)
typedef struct {
    int n, c, hw;      // x is (N, C, HW)
    float eps;         // 1e-5
    float momentum;    // 0.1
} BatchNormDims;

// The hook lesson 05 (SyncBN) fills in: all-reduce (sum) of `count` doubles, in place, on the HOST.
// Forward reduces [sum(x) per channel (C), sum(x*x) per channel (C), element count (1)];
// backward reduces [sum(dy) per channel (C), sum(dy * xhat) per channel (C), element count (1)]
// (the input gradient needs the global count), and only when dx is wanted (not NULL).
// dgamma and dbeta stay LOCAL sums: DDP's gradient all-reduce averages them like every other parameter.
// NULL hook (or a NULL allreduce_sum): statistics of the local batch only (plain BN).
typedef struct {
    void (*allreduce_sum)(double *host_buf, int count, void *ctx);
    void *ctx;
} BatchNormSync;

// ---------------------------------------------------------------- low-precision formats (round_lowp)
// bf16: float32's sign and 8 exponent bits, 7 mantissa bits (float32's top half). fp16 (IEEE binary16): 5
// exponent bits, 10 mantissa bits, largest finite 65504, normals from 2^-14, subnormals down to 2^-24.
typedef enum { LOWP_FP32, LOWP_BF16, LOWP_FP16 } LowpFormat;  // LOWP_FP32: nothing to round

// Counted by round_lowp when asked. nonzero: x != 0 before; underflow: x != 0 and finite before, 0 after;
// overflow: finite before, inf after.
typedef struct {
    size_t nonzero, underflow, overflow;
} LowpStats;

// Both the CPU loop and the CUDA kernel round with the functions below, so the two give the same bits.
#ifdef __CUDACC__
#define KIT_HOST_DEVICE __host__ __device__
#else
#define KIT_HOST_DEVICE
#endif

// float32 bits u rounded to bf16 (round to nearest, ties to even) and widened back, as float32 bits.
// Adding 0x7FFF plus the lowest kept bit, then cutting the low 16 bits, is round-to-nearest-even on the cut:
// a carry out of the mantissa moves to the next binade (the largest finite values round up to inf, as they
// must). A NaN gets its quiet bit set before the cut, so no NaN becomes inf; its sign is kept.
KIT_HOST_DEVICE static inline uint32_t lowp_bf16_bits(uint32_t u) {
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (u | 0x00400000u) & 0xFFFF0000u;
    return (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
}

// float32 bits u rounded to fp16 (round to nearest, ties to even) and widened back, as float32 bits.
KIT_HOST_DEVICE static inline uint32_t lowp_fp16_bits(uint32_t u) {
    uint32_t sign = u & 0x80000000u, a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (u | 0x00400000u) & 0xFFFFE000u;  // NaN: quiet, sign and top payload kept
    if (a >= 0x477FF000u) return sign | 0x7F800000u;  // |x| >= 65520, halfway above 65504 (odd): inf
    if (a >= 0x38800000u) {  // the result is an fp16 normal (>= 2^-14): cut 13 mantissa bits, as for bf16
        return sign | ((a + 0xFFFu + ((a >> 13) & 1u)) & 0xFFFFE000u);
    }
    if (a <= 0x33000000u) return sign;  // |x| <= 2^-25, half the smallest subnormal (a tie goes to even, 0)
    // An fp16 subnormal: a multiple q of 2^-24. The 24-bit significand m is worth m * 2^(e - 126) of those
    // units (e the biased exponent, 102..112 here), so q is m shifted right by 126 - e (14..24), rounded.
    uint32_t e = a >> 23, m = (a & 0x007FFFFFu) | 0x00800000u, shift = 126u - e;
    uint32_t q = m >> shift, rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (q & 1u))) q++;
    // q * 2^-24 as float32 bits (q is 1..1024, exact): the exponent is that of q's top bit.
    uint32_t top = 0;
    while (q >> (top + 1u)) top++;
    uint32_t bits = ((top + 127u - 24u) << 23) | ((q << (23u - top)) & 0x007FFFFFu);
    return sign | bits;
}

// The binary16 bits of a float32 (as bits r) that lowp_fp16_bits has already rounded, so every step is exact.
KIT_HOST_DEVICE static inline uint16_t lowp_fp16_pack(uint32_t r) {
    uint32_t sign = (r >> 16) & 0x8000u, a = r & 0x7FFFFFFFu, e = a >> 23;
    if (a >= 0x7F800000u) return (uint16_t)(sign | 0x7C00u | ((a & 0x007FFFFFu) >> 13));  // inf, NaN
    if (e >= 113u) return (uint16_t)(sign | ((e - 112u) << 10) | ((a >> 13) & 0x3FFu));    // normal (>= 2^-14)
    if (a == 0u) return (uint16_t)sign;
    return (uint16_t)(sign | (((a & 0x007FFFFFu) | 0x00800000u) >> (126u - e)));  // subnormal: q x 2^-24
}

KIT_HOST_DEVICE static inline uint32_t lowp_round_bits(LowpFormat f, uint32_t u) {
    return f == LOWP_BF16 ? lowp_bf16_bits(u) : f == LOWP_FP16 ? lowp_fp16_bits(u) : u;
}

#ifdef __cplusplus
}
#endif

#endif // KIT_OPS_DIMS_H
