// tests/test_cpu_bf16.c: the CPU's real bf16 GEMMs (kit/cpu_bf16.h: oneDNN's matmul, bf16 inputs, float32 sums)
// in conv and linear, against lesson 10's emulation (round_lowp, then float32), within the summation-order bound
// derived in tests/lowp_gemm_cases.h.
//
// Which kernel runs. Where oneDNN has a bf16 matmul for this CPU (AVX-512, AVX512-BF16, AMX; on plain AVX-512 it
// exists though lesson 10 does not take it, cpu_bf16_available), every case runs twice:
// with the GEMM inputs in 2 bytes (the real kernel) and in float32 containers. Elsewhere (AVX2: oneDNN 2.x answers
// "unimplemented") only the float32 containers run (CPU_BF16_IN_FP32): oneDNN's float32 matmul on the same bf16
// values, so every line of the kit's path runs (the rounding as each op stores its GEMM inputs, the layouts, the
// transposes, beta = 1 through oneDNN's sum post-op, the per-thread primitives and scratch, OpenMP's split) but the
// kernel's input type. The test says which ran.
#include "tests/testutil.h"

#include "kit/cpu_bf16.h"
#include "kit/model.h"
#include "kit/ops.h"
#include "tests/lowp_gemm_cases.h"

// The cases of tests/test_cuda.c's test_gemm_lowp_real_equals_emulated, on the CPU, in bf16.
static void run_cases(void) {
    const Device cpu = DEVICE_CPU;
    g_plain_outside = 0;
    conv_lowp_case(cpu, GEMM_BF16, (Conv2dDims){.n = 3, .c = 5, .h = 9, .w = 9, .k = 7, .r = 3, .stride = 1, .pad = 1},
                   0, 2300);
    // Stride 2; a batch the CPU groups several images per GEMM in (dw adds each group's GEMM: beta = 1).
    conv_lowp_case(cpu, GEMM_BF16,
                   (Conv2dDims){.n = 9, .c = 16, .h = 8, .w = 8, .k = 32, .r = 3, .stride = 2, .pad = 1}, 0, 2310);
    // 1x1: the image is its own im2col matrix, so its bf16 copy goes to scratch instead of being rounded in place.
    conv_lowp_case(cpu, GEMM_BF16, (Conv2dDims){.n = 2, .c = 64, .h = 4, .w = 4, .k = 24, .r = 1, .stride = 1, .pad = 0},
                   0, 2320);
    // ResNet-9's 3x3 shape that Winograd takes in float32: bf16 GEMMs must take im2col instead.
    conv_lowp_case(cpu, GEMM_BF16,
                   (Conv2dDims){.n = 4, .c = 32, .h = 8, .w = 8, .k = 32, .r = 3, .stride = 1, .pad = 1}, 0, 2330);
    linear_lowp_case(cpu, GEMM_BF16, 33, 70, 10, 2340);
    linear_lowp_case(cpu, GEMM_BF16, 5, 512, 100, 2350);
    assert_true(g_plain_outside > 0);  // the bound is tight enough to see a missing rounding
}

// Without oneDNN in the build there is no path to test (the kit says so where it would take it): skip, saying why.
static void skip_without_dnnl(void) {
    const char *why = NULL;
    cpu_bf16_set_storage(CPU_BF16_IN_FP32);
    const bool ready = cpu_bf16_ready(&why);
    cpu_bf16_set_storage(CPU_BF16_2BYTES);
    if (!ready) {
        print_message("skipped: %s\n", why);
        skip();
    }
}

static void test_cpu_bf16_real_equals_emulated(void **state) {
    // The emulated and plain runs compare against im2col's float32 GEMMs: Winograd's transforms add rounding of
    // their own, which the summation bound does not cover.
    skip_without_dnnl();
    setenv("KIT_WINOGRAD", "0", 1);
    const char *why = NULL;
    const bool real = cpu_bf16_kernel_exists();
    cpu_bf16_available(&why);
    for (int storage = CPU_BF16_IN_FP32; storage >= (real ? CPU_BF16_2BYTES : CPU_BF16_IN_FP32); storage--) {
        cpu_bf16_set_storage((CpuBf16Storage)storage);
        print_message("bf16 GEMM inputs in %s:\n",
                      storage == CPU_BF16_2BYTES ? "2 bytes (the real kernel)" : "float32 containers");
        run_cases();
    }
    if (real) print_message("real kernel: %s, oneDNN %s%s%s\n", cpu_bf16_isa(), cpu_bf16_impl(),
                            why ? "; lesson 10 still emulates here: " : "", why ? why : "");
    else print_message("the real kernel did not run: %s\n", why);
}

// One training step of tiny-bn in bf16 as lesson 10 takes it (policy_step, tests/lowp_gemm_cases.h), with the CPU's
// bf16 GEMMs against the emulation: every GEMM input is already a bf16 value, so only the summation order differs,
// which can move a value across a bf16 rounding boundary: each element within one bf16 unit, lowp_unit (the
// argument at policy_step). Both with im2col (Winograd's transforms round other numbers).
static void test_cpu_bf16_model_step(void **state) {
    skip_without_dnnl();
    setenv("KIT_WINOGRAD", "0", 1);
    const bool real = cpu_bf16_kernel_exists();
    for (int storage = CPU_BF16_IN_FP32; storage >= (real ? CPU_BF16_2BYTES : CPU_BF16_IN_FP32); storage--) {
        cpu_bf16_set_storage((CpuBf16Storage)storage);
        lowp_model_step_case(DEVICE_CPU, lowp_unit(LOWP_BF16), 2400);
    }
}

// A CPU without a bf16 kernel refuses bf16 GEMMs with the reason (lesson 10 asks cpu_bf16_available first, and
// keeps the emulation); fp16 and TF32 are refused on every CPU.
static void set_cpu_precision(void *arg) { device_set_gemm_precision(DEVICE_CPU, *(GemmPrecision *)arg); }

static void test_cpu_bf16_refusals(void **state) {
    char report[2048];
    const GemmPrecision refused[] = {GEMM_FP16, GEMM_TF32};
    for (size_t i = 0; i < 2; i++) {
        GemmPrecision p = refused[i];
        assert_int_equal(child_exit_status(set_cpu_precision, &p, report, sizeof report), 1);
        assert_non_null(strstr(report, "the CPU runs its GEMMs in float32, or in bf16"));
    }
    const char *why = NULL;
    GemmPrecision bf16 = GEMM_BF16;
    cpu_bf16_available(&why);
    if (cpu_bf16_kernel_exists()) {
        assert_int_equal(child_exit_status(set_cpu_precision, &bf16, report, sizeof report), 0);
    } else {
        assert_int_equal(child_exit_status(set_cpu_precision, &bf16, report, sizeof report), 1);
        assert_non_null(strstr(report, why));
        print_message("refused here, as it must be: %s\n", why);
    }
    // The float32 containers stand in for the kernel wherever oneDNN is built in (the tests' mode).
    skip_without_dnnl();
    cpu_bf16_set_storage(CPU_BF16_IN_FP32);
    assert_int_equal(child_exit_status(set_cpu_precision, &bf16, report, sizeof report), 0);
}

// After each test, failed or not: the defaults again (float32 GEMMs, the real storage, Winograd's switch unset).
static int restore_defaults(void **state) {
    cpu_bf16_set_storage(CPU_BF16_2BYTES);
    device_set_gemm_precision(DEVICE_CPU, GEMM_FP32);
    unsetenv("KIT_WINOGRAD");
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_cpu_bf16_real_equals_emulated, restore_defaults),
        cmocka_unit_test_teardown(test_cpu_bf16_model_step, restore_defaults),
        cmocka_unit_test_teardown(test_cpu_bf16_refusals, restore_defaults),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
