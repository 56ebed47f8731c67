// lowp.c: the two 16-bit formats of mixed precision, as bit patterns. What you write is marked TODO:
//
//   TODO 1a  float -> bf16    keep float32's sign and exponent, round the mantissa from 23 bits to 7
//   TODO 1b  bf16 -> float    exact: every bf16 is a float
//   TODO 1c  float -> fp16    a new exponent range (bias 15, max 65504): overflow, subnormals, underflow to 0
//   TODO 1d  fp16 -> float    exact, subnormals included
//
// Every rounding is to nearest, ties to EVEN (IEEE 754's default, what every GPU and CPU conversion does):
// rounding ties up instead biases every sum of many rounded values upwards.
// PyTorch: x.to(torch.bfloat16), x.to(torch.float16) (c10/util/BFloat16.h, c10/util/Half.h)
#include <math.h>
#include <string.h>

#include "lesson.h"
#include "kit/check.h"

// The bits of a float and back (memcpy: the one conversion of bit patterns C defines).
static uint32_t bits_of(float x) {
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}

static float float_of(uint32_t b) {
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
}

// ---------------------------------------------------------------- bf16 (TODO 1a, 1b)

// TODO 1a: bf16 is the top 16 bits of a float32. Cutting the low 16 bits off truncates (rounds towards zero):
//   round to nearest even instead, by adding to the float's bits the amount that carries into bit 16 exactly when
//   the low half is above the halfway point 0x8000, or at it with bit 16 odd. A carry into the exponent is right
//   (the next binade), and the largest finite floats round to inf as they should. A NaN is the one pattern the
//   addition breaks (a payload in the low half only would round to inf's pattern): return the quiet NaN 0x7FC0
//   with the sign of x for any NaN.
uint16_t bf16_from_float(float x) {
    uint32_t b = bits_of(x);
    // BEGIN SOLUTION
    if (isnan(x)) return (uint16_t)(((b >> 16) & 0x8000u) | 0x7FC0u);
    uint32_t lsb = (b >> 16) & 1u;  // the bit that decides a tie: make it even
    return (uint16_t)((b + 0x7FFFu + lsb) >> 16);
    // STARTER: (void)b;
    // STARTER: return 0;
    // END SOLUTION
}

// TODO 1b: the bf16 bits are the top half of the float's; the low half is zero.
float bf16_to_float(uint16_t h) {
    // BEGIN SOLUTION
    return float_of((uint32_t)h << 16);
    // STARTER: (void)h, (void)float_of;
    // STARTER: return 0.0f;
    // END SOLUTION
}

// ---------------------------------------------------------------- fp16 (TODO 1c, 1d)

// TODO 1c: fp16 has 5 exponent bits (bias 15) and 10 mantissa bits. Take |x| and its sign apart, then by range:
//   NaN -> the quiet NaN 0x7E00 with x's sign; inf -> 0x7C00 with x's sign
//   |x| rounds above 65504 (the largest fp16: 65520, the halfway point to 2^16, rounds to even = up) -> inf
//   normal (|x| >= 2^-14): re-bias the exponent (127 -> 15) and round the mantissa from 23 bits to 10, to
//     nearest even as in TODO 1a (a carry into the exponent is right here too)
//   below 2^-14: a SUBNORMAL, mantissa = |x| / 2^-24 rounded to the nearest integer (even on a tie); 1024 is the
//     smallest normal's pattern, as it should be; below 2^-25 it rounds to 0, and 2^-25 itself ties to 0.
//   Which values underflow here is what loss scaling (TODO 3) is about.
uint16_t half_from_float(float x) {
    uint32_t b = bits_of(x);
    uint16_t sign = (uint16_t)((b >> 16) & 0x8000u);
    uint32_t a = b & 0x7FFFFFFFu;  // |x|
    // BEGIN SOLUTION
    if (a > 0x7F800000u) return sign | 0x7E00u;          // NaN
    if (a >= 0x477FF000u) return sign | 0x7C00u;         // inf, or rounds above 65504: 65520 = 0x477FF000
    if (a >= 0x38800000u) {                              // normal: |x| >= 2^-14
        uint32_t lsb = (a >> 13) & 1u;
        uint32_t r = a + 0xFFFu + lsb - (112u << 23);    // rounded at bit 13, exponent 127 -> 15
        return sign | (uint16_t)(r >> 13);
    }
    int e = (int)(a >> 23);                              // a subnormal result: |x| = m x 2^(e - 150)
    if (e < 102) return sign;                            // below 2^-25: rounds to 0
    uint32_t m = (a & 0x7FFFFFu) | 0x800000u;            // the implicit 1
    int shift = 126 - e;                                 // |x| / 2^-24 = m / 2^shift, shift in 14..24
    uint32_t q = m >> shift, rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rest > half || (rest == half && (q & 1u))) q++;
    return sign | (uint16_t)q;
    // STARTER: (void)a;
    // STARTER: return sign;
    // END SOLUTION
}

// TODO 1d: the other way, exact: exponent 31 is inf (mantissa 0) or NaN (keep the mantissa, shifted into the
//   float's top mantissa bits); exponent 0 is zero or a subnormal, mantissa x 2^-24; otherwise re-bias the
//   exponent (15 -> 127) and shift the mantissa into place.
float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    // BEGIN SOLUTION
    if (e == 0x1F) return float_of(sign | 0x7F800000u | (m << 13));
    if (e == 0) {
        float v = (float)m * 0x1p-24f;  // exact: m < 2^10, and m x 2^-24 is a normal float
        return sign ? -v : v;
    }
    return float_of(sign | ((e + 112u) << 23) | (m << 13));
    // STARTER: (void)sign, (void)e, (void)m;
    // STARTER: return 0.0f;
    // END SOLUTION
}

// ---------------------------------------------------------------- given: rounding tensors

float lowp_round(LowpFormat f, float x) {
    switch (f) {
    case LOWP_BF16: return bf16_to_float(bf16_from_float(x));
    case LOWP_FP16: return half_to_float(half_from_float(x));
    default: return x;
    }
}

// The CPU rounds with your functions, so that training shows what they do; a GPU with the kit's kernel. The
// counts are round_lowp's: nonzero before; underflow: finite and nonzero before, 0 after; overflow: finite
// before, inf after. Your functions read nothing but their argument, so the elements are shared out over the
// cores (OpenMP, as the kit's CPU ops): every activation and gradient passes through here, and one core alone
// made fp16 training about twice as slow as fp32 (the emulation's cost, not the format's). One loop per format:
// bf16's is marked `simd`, and the compiler inlines short functions like bf16's into it and rounds 4 floats per
// instruction (a third of a bf16 step on the fmnist net went here, one float at a time, before); fp16's longer
// functions stay calls, one float at a time.
void lowp_round_buffer(Device d, LowpFormat f, float *x, size_t n, LowpStats *stats) {
    if (d != DEVICE_CPU) {
        round_lowp(d, f, n, x, stats);
        return;
    }
    if (!stats) {  // most calls: the rounding alone (the counts would double its cost)
        if (f == LOWP_FP32) return;
        if (f == LOWP_BF16) {
#if defined(__clang__)  // whether it vectorizes depends on your functions: not a warning (-Werror) when it does not
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wpass-failed"
#endif
#pragma omp parallel for simd schedule(static) if (n >= 32768)
            for (size_t i = 0; i < n; i++) x[i] = lowp_round(LOWP_BF16, x[i]);
#if defined(__clang__)
#pragma clang diagnostic pop
#endif
        } else {
#pragma omp parallel for schedule(static) if (n >= 32768)
            for (size_t i = 0; i < n; i++) x[i] = lowp_round(f, x[i]);
        }
        return;
    }
    size_t nonzero = 0, underflow = 0, overflow = 0;
#pragma omp parallel for schedule(static) reduction(+ : nonzero, underflow, overflow) if (n >= 32768)
    for (size_t i = 0; i < n; i++) {
        float before = x[i], after = lowp_round(f, before);
        nonzero += before != 0.0f;
        underflow += before != 0.0f && isfinite(before) && after == 0.0f;
        overflow += isfinite(before) && isinf(after);
        x[i] = after;
    }
    stats->nonzero += nonzero;
    stats->underflow += underflow;
    stats->overflow += overflow;
}
