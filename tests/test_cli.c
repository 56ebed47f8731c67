// tests/test_cli.c: the shared options (kit/cli.c): defaults, values, and that every mistake is one clear
// line on stderr and exit status 2 (a wrong --device cuda without a GPU: status 1), never a crash.
#include "tests/testutil.h"

#include <fcntl.h>
#include <unistd.h>

#include "kit/cli.h"
#include "kit/ops.h"

static TrainOptions parse(unsigned groups, int argc, char **argv) {
    TrainOptions o;
    cli_parse(&o, argc, argv, groups);
    return o;
}

typedef struct {
    unsigned groups;
    int argc;
    char **argv;
} ParseArgs;

// cli_parse of a ParseArgs, its stdout (a --help) silenced: what parse_in_child runs in the child.
static void parse_quietly(void *arg) {
    const ParseArgs *a = arg;
    int devnull = open("/dev/null", O_WRONLY);
    if (devnull >= 0) dup2(devnull, STDOUT_FILENO);
    TrainOptions o;
    cli_parse(&o, a->argc, a->argv, a->groups);
}

// Runs cli_parse in a child process (it exits on errors) and returns its exit status and first stderr line.
static int parse_in_child(unsigned groups, int argc, char **argv, char *first_line, size_t len) {
    ParseArgs a = {groups, argc, argv};
    char report[4096];
    int status = child_exit_status(parse_quietly, &a, report, sizeof report);
    assert_true(status >= 0);  // an error is an exit, never a signal
    snprintf(first_line, len, "%.*s", (int)strcspn(report, "\n"), report);
    return status;
}

static void test_defaults_and_values(void **state) {
    char *a0[] = {"train", NULL};
    TrainOptions o = parse(CLI_BASE, 1, a0);
    assert_string_equal(o.dataset, "synthetic");
    assert_int_equal(o.batch_size, 128);
    assert_null(o.model);
    cli_apply_dataset_defaults(&o);
    assert_string_equal(o.model, "tiny-bn");
    assert_int_equal(o.epochs, 3);

    char *a1[] = {"train", "--dataset", "fashion-mnist", "--epochs", "7", "--lr", "0.2", "--nesterov",
                  "--devices", "3", NULL};
    o = parse(CLI_DP, 10, a1);
    cli_apply_dataset_defaults(&o);
    assert_string_equal(o.model, "fmnist");
    assert_int_equal(o.epochs, 7);
    assert_float_equal(o.lr, 0.2f, 1e-7);  // "0.2" parsed and rounded to float once: 0.2f to within u * 0.2
    assert_true(o.nesterov);
    assert_int_equal(o.devices, 3);
}

static void check_error(unsigned groups, int argc, char **argv, int want_status, const char *want_text) {
    char line[512];
    int status = parse_in_child(groups, argc, argv, line, sizeof line);
    if (status != want_status || !strstr(line, want_text))
        fail_msg("%s %s: exit %d, stderr '%s'; expected exit %d and '%s'", argv[1], argc > 2 ? argv[2] : "", status,
                 line, want_status, want_text);
}

static void test_mistakes_are_usage_errors(void **state) {
    char *a[][3] = {
        {"train", "--bogus", NULL},          {"train", "--epochs", "x"},     {"train", "--epochs", "0"},
        {"train", "--dataset", "imagenet"},  {"train", "--model", "vgg"},    {"train", "--lr", "-1"},
        {"train", "--device", "tpu"},        {"train", "--devices", "2"},    {"train", "--epochs", NULL},
    };
    const char *why[] = {"unknown option", "--epochs needs an integer", "--epochs needs an integer",
                         "--dataset must be synthetic, cifar10, cifar100 or fashion-mnist, got 'imagenet'",
                         "--model must be tiny, tiny-bn, fmnist or resnet9, got 'vgg'", "--lr needs a number",
                         "--device must be auto, cpu, cuda or cuda-emu", "--devices does not apply", "without its value"};
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++) {
        int argc = a[i][2] ? 3 : 2;
        check_error(CLI_BASE, argc, a[i], 2, why[i]);
    }
    char *b[] = {"train", "--backend", "gloo", NULL};
    check_error(CLI_DIST, 3, b, 2, "--backend must be auto, mpi, nccl or socket, got 'gloo'");
}

// Lesson 10's options (CLI_PREC): their defaults, their values, their ranges and choices, --loss-scale's three
// forms, and that they belong to lesson 10 only.
static void test_precision_options(void **state) {
    (void)state;
    char *a0[] = {"train", NULL};
    TrainOptions o = parse(CLI_DIST | CLI_PREC, 1, a0);
    assert_string_equal(o.precision, "fp32");
    assert_string_equal(o.loss_scale, "dynamic");
    assert_int_equal(o.scale_window, 2000);
    assert_string_equal(o.master, "fp32");
    assert_string_equal(o.allreduce, "fp32");
    assert_int_equal(o.accumulate, 1);
    assert_string_equal(o.lr_rule, "fixed");
    assert_int_equal(o.lr_ref_batch, 128);
    assert_int_equal(o.stop_at, 0);
    assert_null(o.save_params);
    char *a1[] = {"train", "--precision", "fp16", "--loss-scale", "none", "--scale-window", "50", "--master", "bf16",
                  "--allreduce", "bf16", "--accumulate", "1024", "--lr-rule", "linear", "--lr-ref-batch", "256",
                  "--stop-at", "3", "--save-params", "p.ckpt", NULL};
    o = parse(CLI_DIST | CLI_PREC, 21, a1);
    assert_int_equal(o.stop_at, 3);  // the one parser: no lesson takes options out of argv itself
    assert_string_equal(o.save_params, "p.ckpt");
    assert_string_equal(o.precision, "fp16");
    assert_string_equal(o.loss_scale, "none");
    assert_int_equal(o.scale_window, 50);
    assert_string_equal(o.master, "bf16");
    assert_string_equal(o.allreduce, "bf16");
    assert_int_equal(o.accumulate, 1024);
    assert_string_equal(o.lr_rule, "linear");
    assert_int_equal(o.lr_ref_batch, 256);
    const char *scales[] = {"65536", "1", "0.5", "1e30", "dynamic"};
    for (size_t i = 0; i < sizeof scales / sizeof scales[0]; i++) {
        char *a2[] = {"train", "--precision", "bf16", "--loss-scale", (char *)scales[i], NULL};
        o = parse(CLI_PREC, 5, a2);
        assert_string_equal(o.loss_scale, scales[i]);
        assert_string_equal(o.precision, "bf16");
        LowpFormat f;  // the choices are the kit's format names
        assert_true(lowp_parse(o.precision, &f) && f == LOWP_BF16);
    }
    char *bad[][3] = {{"train", "--precision", "fp8"},   {"train", "--master", "fp16"},
                      {"train", "--allreduce", "fp16"},  {"train", "--accumulate", "0"},
                      {"train", "--accumulate", "1025"}, {"train", "--lr-rule", "sqrt"},
                      {"train", "--lr-ref-batch", "0"},  {"train", "--scale-window", "0"},
                      {"train", "--loss-scale", "0"},    {"train", "--loss-scale", "-8"},
                      {"train", "--loss-scale", "2e30"}, {"train", "--loss-scale", "static"},
                      {"train", "--loss-scale", "8x"},   {"train", "--loss-scale", "nan"},
                      {"train", "--stop-at", "-1"},      {"train", "--save-params", ""},
                      {"train", "--precision", NULL}};
    const char *why[] = {"--precision must be fp32, bf16 or fp16, got 'fp8'",
                         "--master must be fp32 or bf16, got 'fp16'",
                         "--allreduce must be fp32 or bf16, got 'fp16'",
                         "--accumulate needs an integer in [1, 1024], got '0'",
                         "--accumulate needs an integer in [1, 1024], got '1025'",
                         "--lr-rule must be fixed or linear, got 'sqrt'",
                         "--lr-ref-batch needs an integer in [1, 65536], got '0'",
                         "--scale-window needs an integer in [1, 1000000], got '0'",
                         "--loss-scale must be dynamic, none or a number in (0, 1e30], got '0'",
                         "--loss-scale must be dynamic, none or a number in (0, 1e30], got '-8'",
                         "--loss-scale must be dynamic, none or a number in (0, 1e30], got '2e30'",
                         "--loss-scale must be dynamic, none or a number in (0, 1e30], got 'static'",
                         "--loss-scale must be dynamic, none or a number in (0, 1e30], got '8x'",
                         "--loss-scale must be dynamic, none or a number in (0, 1e30], got 'nan'",
                         "--stop-at needs an integer in [0, 2147483647], got '-1'",
                         "--save-params '' is empty",
                         "without its value"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        check_error(CLI_DIST | CLI_PREC, bad[i][2] ? 3 : 2, bad[i], 2, why[i]);
    char *other[] = {"train", "--precision", "bf16", NULL};
    check_error(CLI_DIST | CLI_CKPT | CLI_PIPE, 3, other, 2, "--precision does not apply");
    char *other2[] = {"train", "--accumulate", "2", NULL};
    check_error(CLI_DIST, 3, other2, 2, "--accumulate does not apply");
    char *other3[] = {"train", "--save-params", "p.ckpt", NULL};
    check_error(CLI_DIST | CLI_CKPT, 3, other3, 2, "--save-params does not apply");
}

// Lesson 08's options (CLI_PIPE): their defaults, their values, their ranges and choices, and no other lesson's.
static void test_pipeline_options(void **state) {
    char *a0[] = {"train", NULL};
    TrainOptions o = parse(CLI_PIPE, 1, a0);
    assert_int_equal(o.stages, 2);
    assert_int_equal(o.micro_batches, 4);
    assert_string_equal(o.balance, "params");
    assert_string_equal(o.schedule, "gpipe");
    assert_null(o.stage_devices);
    assert_int_equal(o.bench, 0);
    char *a1[] = {"train", "--stages", "3", "--balance", "time", "--schedule", "1f1b", "--stage-devices",
                  "cpu,cuda,cpu", NULL};
    o = parse(CLI_PIPE, 9, a1);
    assert_int_equal(o.stages, 3);
    assert_string_equal(o.balance, "time");
    assert_string_equal(o.schedule, "1f1b");
    assert_string_equal(o.stage_devices, "cpu,cuda,cpu");
    char *bad[][3] = {{"train", "--stages", "9"}, {"train", "--micro-batches", "0"}, {"train", "--balance", "flops"},
                      {"train", "--schedule", "zb"}};
    const char *why[] = {"--stages needs an integer in [1, 8]", "--micro-batches needs an integer in [1, 64]",
                         "--balance must be params or time", "--schedule must be gpipe or 1f1b"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) check_error(CLI_PIPE, 3, bad[i], 2, why[i]);
    char *other[] = {"train", "--stages", "2", NULL};
    check_error(CLI_DIST, 3, other, 2, "--stages does not apply");
}

// The text of cli_usage(groups), in a buffer the caller frees.
static char *usage_text(unsigned groups) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    cli_usage(f, groups);
    assert_int_equal(fclose(f), 0);
    return text;
}

// Lesson 09's options (CLI_ZERO): their defaults, their values, their ranges (--zero 0..3, --units within
// ZERO_MAX_UNITS = 32), and --help lists them for lesson 09 only.
static void test_zero_options(void **state) {
    char *a0[] = {"train", NULL};
    TrainOptions o = parse(CLI_DIST | CLI_CKPT | CLI_ZERO, 1, a0);
    assert_int_equal(o.zero, 0);
    assert_int_equal(o.units, 0);  // the default cut: one unit per layer with parameters
    assert_false(o.recompute);
    assert_false(o.memory);
    assert_null(o.consolidate);
    char *a1[] = {"train", "--zero", "3", "--units", "32", "--recompute", "--memory", "--consolidate=whole.ckpt", NULL};
    o = parse(CLI_DIST | CLI_CKPT | CLI_ZERO, 8, a1);
    assert_int_equal(o.zero, 3);
    assert_int_equal(o.units, 32);
    assert_true(o.recompute);
    assert_true(o.memory);
    assert_string_equal(o.consolidate, "whole.ckpt");
    char *bad[][3] = {{"train", "--zero", "4"},   {"train", "--zero", "-1"},        {"train", "--units", "0"},
                      {"train", "--units", "33"}, {"train", "--zero", "two"},       {"train", "--consolidate", ""},
                      {"train", "--units", NULL}};
    const char *why[] = {"--zero needs an integer in [0, 3], got '4'", "--zero needs an integer in [0, 3], got '-1'",
                         "--units needs an integer in [1, 32], got '0'", "--units needs an integer in [1, 32], got '33'",
                         "--zero needs an integer in [0, 3], got 'two'", "--consolidate '' is empty",
                         "without its value"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        check_error(CLI_ZERO, bad[i][2] ? 3 : 2, bad[i], 2, why[i]);
    const char *zero_flags[] = {"--zero N", "--units N", "--recompute", "--memory", "--consolidate FILE"};
    char *ours = usage_text(CLI_DIST | CLI_CKPT | CLI_ZERO), *lesson03 = usage_text(CLI_DIST);
    for (size_t i = 0; i < sizeof zero_flags / sizeof zero_flags[0]; i++) {
        if (!strstr(ours, zero_flags[i])) fail_msg("lesson 09's --help does not list %s", zero_flags[i]);
        if (strstr(lesson03, zero_flags[i])) fail_msg("lesson 03's --help lists lesson 09's %s", zero_flags[i]);
    }
    free(ours), free(lesson03);
    char *flags[][2] = {{"train", "--recompute"}, {"train", "--memory"}};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        check_error(CLI_DIST | CLI_CKPT | CLI_PIPE, 2, flags[i], 2, "does not apply to this lesson");
    char *other[] = {"train", "--zero", "1", NULL};
    check_error(CLI_DIST, 3, other, 2, "--zero does not apply");
}

// --metrics to a place that cannot be written is an error at start-up (exit 2), not after the first epoch; a
// writable path is accepted and nothing is created while parsing.
static void test_metrics_path_checked_at_start(void **state) {
    char *missing_dir[] = {"train", "--metrics", "/nonexistent-kit-dir/run.csv", NULL};
    check_error(CLI_BASE, 3, missing_dir, 2, "its folder '/nonexistent-kit-dir' does not exist");
    char *a_dir[] = {"train", "--metrics", "/tmp", NULL};
    check_error(CLI_BASE, 3, a_dir, 2, "not a regular file");
    char dir[] = "/tmp/kit-test-cli-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[64];
    snprintf(path, sizeof path, "%s/run.csv", dir);
    char *ok[] = {"train", "--metrics", path, NULL};
    TrainOptions o = parse(CLI_BASE, 3, ok);
    assert_string_equal(o.metrics, path);
    assert_int_equal(access(path, F_OK), -1);  // parsing created nothing
    char *bare[] = {"train", "--metrics", "run-in-cwd.csv", NULL};  // no folder part: the current folder
    o = parse(CLI_BASE, 3, bare);
    assert_string_equal(o.metrics, "run-in-cwd.csv");
    assert_int_equal(rmdir(dir), 0);
}

// --device cuda where no GPU is usable: a clear error (status 1), not a silent fallback to the CPU.
static void test_device_cuda_without_gpu(void **state) {
    if (device_cuda_usable(NULL)) skip();  // on a GPU machine there is nothing to refuse
    fflush(stdout);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) dup2(devnull, STDERR_FILENO);
        Device d;
        device_parse("cuda", &d, true);
        _exit(0);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 1);
}

// --tf32 on the CPU: refused with the reason (status 2), once the device is known (device_parse); the same
// command without --tf32 goes through.
static void tf32_then_cpu(void *arg) {
    const ParseArgs *a = arg;
    TrainOptions o;
    cli_parse(&o, a->argc, a->argv, a->groups);
    Device d;
    device_parse("cpu", &d, true);
    exit(0);
}

static void test_tf32_refused_on_cpu(void **state) {
    (void)state;
    char *with[] = {"prog", "--tf32", NULL}, *without[] = {"prog", NULL};
    char report[4096];
    ParseArgs a = {CLI_BASE, 2, with};
    assert_int_equal(child_exit_status(tf32_then_cpu, &a, report, sizeof report), 2);
    assert_non_null(strstr(report, "--tf32 needs a CUDA device"));
    ParseArgs b = {CLI_BASE, 1, without};
    assert_int_equal(child_exit_status(tf32_then_cpu, &b, report, sizeof report), 0);
    device_request_tf32(false);  // this process parsed nothing, but keep the state clean for the next tests
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_and_values),
        cmocka_unit_test(test_precision_options),
        cmocka_unit_test(test_mistakes_are_usage_errors),
        cmocka_unit_test(test_device_cuda_without_gpu),
        cmocka_unit_test(test_tf32_refused_on_cpu),
        cmocka_unit_test(test_metrics_path_checked_at_start),
        cmocka_unit_test(test_pipeline_options),
        cmocka_unit_test(test_zero_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
