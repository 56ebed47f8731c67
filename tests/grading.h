// tests/grading.h: the main() of every autograder test binary (header-only).
//
//   int main(int argc, char **argv) {
//       const struct CMUnitTest tests[] = { cmocka_unit_test(test_sgd_step), ... };
//       return grading_run(argc, argv, tests, sizeof tests / sizeof tests[0]);
//   }
//
// The binary then understands:
//   (no options)   run every test, cmocka's usual output
//   --list         print the test names, one per line, and exit
//   --only NAME    run only the test NAME (exit 2 when there is no such test)
// The grading driver (tests/grade.py) runs each test in its own process with --only. The VERDICT comes
// through the channel below, never from stdout nor from the cmocka XML (which a test can overwrite: the
// driver reads the XML only for the failure message it shows). Under mpirun/srun, rank r > 0 writes its XML
// to "<path>.rank<r>" so ranks do not overwrite each other.
// The exit status is the number of failed tests (0 = all passed), 2 for a usage error; with --only under the
// driver (GRADING_CHANNEL set) it is 0 once the verdict is reported (see grading_run).
//
// The verdict channel (GRADING_CHANNEL=dir, set by the driver; absent when a person runs the binary):
//   dir/token.<rank>  a secret the driver wrote for this rank. It is read and DELETED before any code of the
//                     program's own objects runs: in .preinit_array, which the dynamic loader runs before every
//                     constructor (of the libraries and of the program). The driver rejects a learner object
//                     that brings its own .preinit_array or redefines a C library / cmocka function, so only
//                     this code and the C library run here. The token is never in the environment nor argv.
//   dir/ready.<rank>  made once the token is consumed; every rank waits until all ranks' exist, so no rank runs
//                     learner code while another rank's token file is still on disk.
//   dir/verdict       one line per rank, appended in one write() after the test: "<token> <rank> PASS|FAIL|SKIP
//                     <test>". A line with a wrong token, or a missing or second line, makes the test an ERROR.
// What this does not stop: code running inside this process can read its memory, and so the token.
// tests/GRADING.md says what is guaranteed and how.
// A test whose subject builds on an earlier TODO checks that TODO first, on a tiny known case, with
// grading_require_todo (below): a learner with a wrong SGD update is then told "fix TODO 1 first" by the
// training-step tests, instead of being sent to TODO 3 by their hints.
#ifndef GRADING_H
#define GRADING_H

#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

// This process's rank when started by mpirun (Open MPI), srun (Slurm) or another PMIx launcher; 0 otherwise.
static inline int grading_launcher_rank(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID", "PMI_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return atoi(v);
    }
    return 0;
}

// Fails the calling test with "fix TODO <todo> first: <why>" when `ok` is false. tests/grade.py recognises the
// message and shows it instead of the test's own hint (which is about a later TODO and would mislead).
// In a multi-rank test `ok` must be the same on every rank (decide it from a collective), so that every rank
// leaves the test at the same point and none waits in a collective for the others.
// A macro, so that the failure's file:line is the calling test's.
#define grading_require_todo(ok, todo, ...)                                  \
    do {                                                                     \
        if (!(ok)) {                                                         \
            char text_[1024];                                                \
            int used_ = snprintf(text_, sizeof text_, "fix TODO %s first: ", (todo)); \
            snprintf(text_ + used_, sizeof text_ - (size_t)used_, __VA_ARGS__); \
            print_error("%s\n", text_); /* one write: ranks' lines do not interleave */ \
            fail();                                                          \
        }                                                                    \
    } while (0)

// A test binary made of several .c files: the one with main() includes this header as it is; the others
// define GRADING_HELPERS_ONLY first and get only the helpers above. The verdict channel below must exist once
// per program (its .preinit_array entry takes the rank's token, which a second entry would find gone).
#ifndef GRADING_HELPERS_ONLY

// ---------------------------------------------------------------- the verdict channel

#define GRADING_TOKEN_MAX 64
#define GRADING_PATH_MAX 4096
#define GRADING_READY_WAIT_S 30  // every rank of one test starts within this, or the test fails

static char grading_token[GRADING_TOKEN_MAX + 1];  // empty: not read (no channel, or no token file)
static char grading_channel[GRADING_PATH_MAX];     // empty: the binary was not started by the driver
static int grading_channel_rank;

// getenv() from the envp the loader passes: .preinit_array runs before libc has set up everything else.
static const char *grading_envp_get(char **envp, const char *name) {
    size_t len = strlen(name);
    for (char **e = envp; e && *e; e++)
        if (strncmp(*e, name, len) == 0 && (*e)[len] == '=') return *e + len + 1;
    return NULL;
}

static int grading_envp_int(char **envp, const char *const *names, size_t n, int fallback) {
    for (size_t i = 0; i < n; i++) {
        const char *v = grading_envp_get(envp, names[i]);
        if (v && *v) return atoi(v);
    }
    return fallback;
}

// Fails the process before any test code runs; the driver shows this line.
static void grading_channel_die(const char *what) {
    const char *pre = "grading: ";
    (void)!write(2, pre, strlen(pre));
    (void)!write(2, what, strlen(what));
    (void)!write(2, "\n", 1);
    _exit(3);
}

// Runs from .preinit_array: takes this rank's token, then waits until every rank has taken its own.
static void grading_channel_open(int argc, char **argv, char **envp) {
    (void)argc;
    (void)argv;
    const char *dir = grading_envp_get(envp, "GRADING_CHANNEL");
    if (!dir || !*dir) return;
    if (strlen(dir) + 32 > sizeof grading_channel) grading_channel_die("GRADING_CHANNEL is too long");
    static const char *const rank_vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID", "PMI_RANK"};
    static const char *const size_vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "SLURM_NTASKS", "PMI_SIZE"};
    int rank = grading_envp_int(envp, rank_vars, 4, 0);
    int world = grading_envp_int(envp, size_vars, 4, 1);
    strcpy(grading_channel, dir);
    grading_channel_rank = rank;
    char path[GRADING_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/token.%d", dir, rank);
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) grading_channel_die("no token for this rank (started twice, or not by tests/grade.py?)");
    ssize_t n = read(fd, grading_token, GRADING_TOKEN_MAX);
    close(fd);
    if (unlink(path) != 0 || n <= 0) grading_channel_die("could not take this rank's token");
    grading_token[n] = '\0';
    snprintf(path, sizeof path, "%s/ready.%d", dir, rank);
    fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) grading_channel_die("could not mark this rank ready");
    close(fd);
    // Wait for every rank's ready.<r> (2 ms polls): only then may learner code run anywhere.
    for (int r = 0; r < world; r++) {
        snprintf(path, sizeof path, "%s/ready.%d", dir, r);
        for (long waited_ms = 0; access(path, F_OK) != 0; waited_ms += 2) {
            if (waited_ms > GRADING_READY_WAIT_S * 1000L) grading_channel_die("another rank did not start in time");
            struct timespec nap = {0, 2 * 1000 * 1000};
            nanosleep(&nap, NULL);
        }
    }
}

__attribute__((used, section(".preinit_array"))) static void (*grading_channel_hook)(int, char **, char **) =
    grading_channel_open;

// Appends this rank's verdict in one write, then forgets the token.
static void grading_channel_report(const char *status, const char *test) {
    if (!grading_channel[0] || !grading_token[0]) return;
    char path[GRADING_PATH_MAX + 32], line[GRADING_TOKEN_MAX + 512];
    snprintf(path, sizeof path, "%s/verdict", grading_channel);
    int len = snprintf(line, sizeof line, "%s %d %s %s\n", grading_token, grading_channel_rank, status, test);
    memset(grading_token, 0, sizeof grading_token);
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 || len <= 0 || len >= (int)sizeof line || write(fd, line, (size_t)len) != len)
        grading_channel_die("could not write the verdict");
    close(fd);
}

// Under SANITIZE=1 a failed test leaks what it had allocated: cmocka leaves it by longjmp, past its frees. That
// leak is the failure's consequence, not a bug of its own, and LeakSanitizer's report at exit would replace the
// failure's message as the last lines the grader shows. LeakSanitizer asks this hook before its check at exit:
// the check is skipped after a failure and kept after a pass (a leak there is a bug). Unused without ASan.
static int grading_any_failed;
int __lsan_is_turned_off(void);
int __lsan_is_turned_off(void) { return grading_any_failed; }

// The one test --only runs, wrapped so that a normal return is told apart from a skip (cmocka leaves the
// test by longjmp on fail() and skip(), and counts only failures).
static void (*grading_test_func)(void **state);
static int grading_test_returned;

static void grading_wrapped_test(void **state) {
    grading_test_func(state);
    grading_test_returned = 1;
}

// Gives ranks other than 0 their own XML file, so every rank's verdict reaches the driver.
static inline void grading_split_xml_by_rank(void) {
    const char *xml = getenv("CMOCKA_XML_FILE");
    int rank = grading_launcher_rank();
    if (!xml || !*xml || rank <= 0) return;
    size_t len = strlen(xml) + 32;
    char *path = malloc(len);
    if (!path) return;
    snprintf(path, len, "%s.rank%d", xml, rank);
    setenv("CMOCKA_XML_FILE", path, 1);
    free(path);
}

// The group name in reports: the program's file name ("test_lesson01").
static inline const char *grading_group_name(const char *argv0) {
    const char *slash = argv0 ? strrchr(argv0, '/') : NULL;
    return slash ? slash + 1 : (argv0 ? argv0 : "tests");
}

static inline int grading_usage(const char *argv0) {
    fprintf(stderr, "usage: %s [--list | --only TEST_NAME]\n", argv0);
    return 2;
}

static inline int grading_run(int argc, char **argv, const struct CMUnitTest *tests, size_t n) {
    // Line-buffered stdout: what a test prints lands in the log in the order it happened, next to
    // cmocka's (unbuffered) error text, so the grader can show the line that explains a failure.
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--list") == 0) {
            for (size_t t = 0; t < n; t++) printf("%s\n", tests[t].name);
            return 0;
        } else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
            only = argv[++i];
        } else {
            return grading_usage(argv[0]);
        }
    }
    if (only) {
        size_t t = 0;
        while (t < n && strcmp(tests[t].name, only) != 0) t++;
        if (t == n) {
            fprintf(stderr, "%s: no test named '%s' (--list shows the names)\n", argv[0], only);
            return 2;
        }
        grading_split_xml_by_rank();
        struct CMUnitTest one = tests[t];
        grading_test_func = one.test_func;
        one.test_func = grading_wrapped_test;
        int failed = _cmocka_run_group_tests(grading_group_name(argv[0]), &one, 1, NULL, NULL);
        grading_any_failed = failed != 0;
        grading_channel_report(failed ? "FAIL" : grading_test_returned ? "PASS" : "SKIP", only);
        // Under the driver the verdict is the channel's line, never the exit status, so a reported failure exits
        // 0: Open MPI 4's mpirun answers a non-zero exit by terminating the job and sleeping its SIGTERM-to-
        // SIGKILL grace (odls_base_sigkill_timeout, 1 s) even when every rank has already ended: measured, 1.7 s
        // per failing multi-rank test (grade-starters 127 s -> 54 s without it). Run by hand, the status counts.
        return grading_channel[0] ? 0 : failed;
    }
    grading_split_xml_by_rank();
    int failed = _cmocka_run_group_tests(grading_group_name(argv[0]), tests, n, NULL, NULL);
    grading_any_failed = failed != 0;
    return failed;
}

#endif // GRADING_HELPERS_ONLY

#endif // GRADING_H
