// tests/test_lowp.c: round_lowp, scale_inplace, count_nonfinite and the format names (kit/ops.h) on the CPU.
//
// The rounding is checked three ways: against PyTorch's own conversions (x.to(torch.bfloat16 / torch.float16)
// and back, tests/fixtures/lowp.bin written by tests/fixtures/make_lowp.py: every exponent, the mantissas at
// each tie, the fp16 overflow and subnormal edges, NaN and inf, both signs); against a reference written here in
// double arithmetic on random bit patterns; and the counts on inputs built so that each one is known.
// Run from the repository root (the fixture's path).
#include "tests/testutil.h"

#include <stdbool.h>

#include "kit/ops.h"

static float from_bits(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static uint32_t to_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static uint32_t rounded_bits(LowpFormat f, uint32_t u) {
    float x = from_bits(u);
    round_lowp(DEVICE_CPU, f, 1, &x, NULL);
    return to_bits(x);
}

// A NaN in: a NaN out, quiet (the top mantissa bit set), with the input's sign. Anything else: PyTorch's bits.
static bool same_as_torch(uint32_t in, uint32_t mine, uint32_t torch) {
    if ((in & 0x7FFFFFFFu) > 0x7F800000u) {
        bool torch_nan = (torch & 0x7FFFFFFFu) > 0x7F800000u;
        return torch_nan && (mine & 0x7FFFFFFFu) > 0x7F800000u && (mine & 0x00400000u) &&
               (mine & 0x80000000u) == (in & 0x80000000u);
    }
    return mine == torch;
}

static void test_matches_pytorch(void **state) {
    (void)state;
    size_t size;
    unsigned char *b = read_fixture("tests/fixtures/lowp.bin", &size);
    assert_true(size >= 12 && memcmp(b, "KITLOWP1", 8) == 0);
    uint32_t count;
    memcpy(&count, b + 8, 4);
    assert_int_equal(size, 12 + (size_t)count * 12);
    assert_true(count > 7000);  // every exponent with its boundary mantissas, both signs
    int bad = 0;
    for (uint32_t i = 0; i < count; i++) {
        uint32_t rec[3];
        memcpy(rec, b + 12 + (size_t)i * 12, sizeof rec);
        uint32_t bf = rounded_bits(LOWP_BF16, rec[0]), hf = rounded_bits(LOWP_FP16, rec[0]);
        if (!same_as_torch(rec[0], bf, rec[1]) && bad++ < 5)
            print_error("bf16(0x%08x = %g): kit 0x%08x, PyTorch 0x%08x\n", rec[0], from_bits(rec[0]), bf, rec[1]);
        if (!same_as_torch(rec[0], hf, rec[2]) && bad++ < 5)
            print_error("fp16(0x%08x = %g): kit 0x%08x, PyTorch 0x%08x\n", rec[0], from_bits(rec[0]), hf, rec[2]);
        assert_int_equal(rounded_bits(LOWP_FP32, rec[0]), rec[0]);
    }
    free(b);
    assert_int_equal(bad, 0);
}

// The reference: x / q rounded to an integer (nearbyint: ties to even in the default rounding mode) times q,
// in double, where q is the format's spacing at x: 2^(e - p) for x in [2^e, 2^(e+1)), with e no lower than the
// smallest normal exponent (below it the spacing stays that of the subnormals). x / q and the product are exact
// in double (a power of two scaling a 24-bit integer). Above the largest finite value: inf.
static double reference_round(LowpFormat f, float x) {
    if (!isfinite(x) || x == 0.0f) return x;
    int mant = f == LOWP_BF16 ? 7 : 10, emin = f == LOWP_BF16 ? -126 : -14;
    double maxf = f == LOWP_BF16 ? ldexp(255.0 / 128.0, 127) : 65504.0;
    int e;
    frexp(x, &e);  // |x| in [2^(e-1), 2^e)
    e -= 1;
    if (e < emin) e = emin;
    double q = ldexp(1.0, e - mant), r = nearbyint((double)x / q) * q;
    return fabs(r) > maxf ? copysign(INFINITY, x) : r;
}

static void test_matches_reference_on_random_bits(void **state) {
    (void)state;
    Rng r = rng_make(20261126, 0);
    int bad = 0;
    for (int i = 0; i < (1 << 20); i++) {
        uint32_t u = (uint32_t)rng_next_u64(&r);
        if ((u & 0x7FFFFFFFu) > 0x7F800000u) continue;  // NaNs: the fixture's cases
        float x = from_bits(u);
        for (LowpFormat f = LOWP_BF16; f <= LOWP_FP16; f++) {
            float mine = from_bits(rounded_bits(f, u));
            double want = reference_round(f, x);
            // equal as values, and a zero keeps the input's sign
            if (((double)mine != want || signbit(mine) != signbit(x)) && bad++ < 5)
                print_error("%s(%a): kit %a, reference %a\n", lowp_name(f), (double)x, (double)mine, want);
            // rounding a rounded value changes nothing
            if (rounded_bits(f, to_bits(mine)) != to_bits(mine) && bad++ < 5)
                print_error("%s(%a) is not a fixed point\n", lowp_name(f), (double)mine);
        }
    }
    assert_int_equal(bad, 0);
}

// Each input's fate is known: (value, counted nonzero, underflows, overflows), per format.
typedef struct {
    float x;
    bool nonzero, underflow, overflow;
} Case;

static void check_counts(LowpFormat f, const Case *c, size_t n) {
    float *x = malloc(n * sizeof *x);
    assert_non_null(x);
    LowpStats want = {0, 0, 0};
    for (size_t i = 0; i < n; i++) {
        x[i] = c[i].x;
        want.nonzero += c[i].nonzero;
        want.underflow += c[i].underflow;
        want.overflow += c[i].overflow;
    }
    LowpStats got = {100, 200, 300};  // counts are added to what the caller holds
    round_lowp(DEVICE_CPU, f, n, x, &got);
    assert_int_equal(got.nonzero, want.nonzero + 100);
    assert_int_equal(got.underflow, want.underflow + 200);
    assert_int_equal(got.overflow, want.overflow + 300);
    for (size_t i = 0; i < n; i++) {  // the counted call rounds exactly as the uncounted one
        assert_int_equal(to_bits(x[i]), rounded_bits(f, to_bits(c[i].x)));
        if (c[i].underflow) assert_true(x[i] == 0.0f && signbit(x[i]) == signbit(c[i].x));
        if (c[i].overflow) assert_true(isinf(x[i]) && signbit(x[i]) == signbit(c[i].x));
    }
    free(x);
}

static void test_counts_fp16(void **state) {
    (void)state;
    const float tiny = 5.9604644775390625e-8f;  // 2^-24, fp16's smallest subnormal
    const Case c[] = {
        {0.0f, false, false, false},          {-0.0f, false, false, false},
        {1.0f, true, false, false},           {-3.14159f, true, false, false},
        {1e-9f, true, true, false},           {-1e-9f, true, true, false},
        {tiny / 2, true, true, false},        // exactly half the smallest subnormal: the tie goes to 0
        {tiny * 0.5000001f, true, false, false}, // just above it: 2^-24
        {tiny, true, false, false},           {1e-45f, true, true, false},  // a float32 subnormal
        {65504.0f, true, false, false},       {65519.0f, true, false, false},  // rounds down to 65504
        {65520.0f, true, false, true},        {-70000.0f, true, false, true},
        {3e38f, true, false, true},           {INFINITY, true, false, false},  // inf was not finite before
        {-INFINITY, true, false, false},      {NAN, true, false, false},
    };
    check_counts(LOWP_FP16, c, sizeof c / sizeof c[0]);
}

static void test_counts_bf16(void **state) {
    (void)state;
    const Case c[] = {
        {0.0f, false, false, false},       {1.0f, true, false, false},
        {1e-9f, true, false, false},       // bf16 has float32's exponent range: no underflow here
        {65520.0f, true, false, false},    {3e38f, true, false, false},
        {from_bits(0x7F7FFFFFu), true, false, true},  // the largest float32 rounds above bf16's largest
        {-from_bits(0x7F7F8000u), true, false, true}, // halfway, odd last bit: up, to -inf
        {from_bits(0x7F7F7FFFu), true, false, false}, // just below halfway: bf16's largest
        {from_bits(0x00000001u), true, true, false},  // 2^-149 is below half bf16's smallest subnormal
        {-from_bits(0x00008000u), true, true, false}, // exactly half of it: the tie goes to even, -0
        {from_bits(0x00008001u), true, false, false}, // just above: the smallest bf16 subnormal
        {NAN, true, false, false},         {-INFINITY, true, false, false},
    };
    check_counts(LOWP_BF16, c, sizeof c / sizeof c[0]);
}

static void test_fp32_changes_nothing(void **state) {
    (void)state;
    float x[6] = {0.0f, 1e-45f, 70000.0f, NAN, -INFINITY, 1.0000001f}, y[6];
    memcpy(y, x, sizeof x);
    LowpStats s = {0, 0, 0};
    round_lowp(DEVICE_CPU, LOWP_FP32, 6, x, &s);
    assert_memory_equal(x, y, sizeof x);
    assert_int_equal(s.nonzero, 5);  // NaN != 0 too
    assert_int_equal(s.underflow, 0);
    assert_int_equal(s.overflow, 0);
}

// Large buffers take the OpenMP path: the same bits and counts as element by element.
static void test_large_buffer_matches_elementwise(void **state) {
    (void)state;
    size_t n = 100003;
    float *x = malloc(n * sizeof *x);
    assert_non_null(x);
    Rng r = rng_make(7, 0);
    for (size_t i = 0; i < n; i++) x[i] = from_bits((uint32_t)rng_next_u64(&r));
    for (LowpFormat f = LOWP_BF16; f <= LOWP_FP16; f++) {
        float *y = malloc(n * sizeof *y);
        assert_non_null(y);
        memcpy(y, x, n * sizeof *x);
        LowpStats all = {0, 0, 0}, one = {0, 0, 0};
        round_lowp(DEVICE_CPU, f, n, y, &all);
        for (size_t i = 0; i < n; i++) {
            float v = x[i];
            round_lowp(DEVICE_CPU, f, 1, &v, &one);
            assert_int_equal(to_bits(v), to_bits(y[i]));
        }
        assert_memory_equal(&all, &one, sizeof all);
        assert_true(one.nonzero > n / 2 && one.underflow > 0 && one.overflow > 0);  // random bits hit all three
        free(y);
    }
    free(x);
}

static void test_scale_and_count_nonfinite(void **state) {
    (void)state;
    float x[7] = {1.0f, -2.5f, 3e38f, 0.0f, NAN, -INFINITY, 1e-3f};
    assert_int_equal(count_nonfinite(DEVICE_CPU, 7, x), 2);
    scale_inplace(DEVICE_CPU, 7, x, 65536.0f);
    assert_true(x[0] == 65536.0f && x[1] == -163840.0f && x[3] == 0.0f && x[6] == 1e-3f * 65536.0f);
    assert_true(isinf(x[2]) && isnan(x[4]) && isinf(x[5]));  // 3e38 * 2^16 overflows: now three
    assert_int_equal(count_nonfinite(DEVICE_CPU, 7, x), 3);
    assert_int_equal(count_nonfinite(DEVICE_CPU, 0, x), 0);
    scale_inplace(DEVICE_CPU, 2, x, 1.0f / 65536.0f);  // a power of two: exact both ways
    assert_true(x[0] == 1.0f && x[1] == -2.5f);
}

static void test_names(void **state) {
    (void)state;
    for (LowpFormat f = LOWP_FP32; f <= LOWP_FP16; f++) {
        LowpFormat back = (LowpFormat)99;
        assert_true(lowp_parse(lowp_name(f), &back));
        assert_int_equal(back, f);
    }
    assert_string_equal(lowp_name(LOWP_BF16), "bf16");
    LowpFormat f = LOWP_BF16;
    assert_false(lowp_parse("float16", &f));
    assert_false(lowp_parse("BF16", &f));
    assert_false(lowp_parse("", &f));
    assert_false(lowp_parse(NULL, &f));
    assert_int_equal(f, LOWP_BF16);  // untouched on failure
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_pytorch),
        cmocka_unit_test(test_matches_reference_on_random_bits),
        cmocka_unit_test(test_counts_fp16),
        cmocka_unit_test(test_counts_bf16),
        cmocka_unit_test(test_fp32_changes_nothing),
        cmocka_unit_test(test_large_buffer_matches_elementwise),
        cmocka_unit_test(test_scale_and_count_nonfinite),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
