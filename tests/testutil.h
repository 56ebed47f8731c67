// tests/testutil.h: helpers shared by the cmocka tests (header-only).
#ifndef TESTUTIL_H
#define TESTUTIL_H

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "kit/check.h"
#include "kit/device.h"
#include "kit/rng.h"

// Fills x with uniform values in [lo, hi) from a seeded stream.
static inline void fill_uniform(float *x, size_t n, float lo, float hi, uint64_t seed) {
    Rng r = rng_make(seed, 0);
    for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * rng_uniform(&r);
}

// The RMS of x (at least 1e-30): the floor of a relative error for a result whose elements are sums of many terms.
static inline double rms_floor(const float *x, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    double r = n ? sqrt(s / n) : 0.0;
    return r > 1e-30 ? r : 1e-30;
}

// A new array of n uniform values in [lo, hi) (the caller frees).
static inline float *uniform_vec(size_t n, float lo, float hi, uint64_t seed) {
    float *x = xmalloc((n ? n : 1) * sizeof(float));
    fill_uniform(x, n, lo, hi, seed);
    return x;
}

// max |a - b| / max(|b|, floor): a relative error that does not blow up near zero.
static inline double max_rel_error(const float *a, const float *b, size_t n, double floor) {
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double scale = fabs((double)b[i]) > floor ? fabs((double)b[i]) : floor;
        double e = fabs((double)a[i] - (double)b[i]) / scale;
        if (e > worst || isnan(e)) worst = isnan(e) ? INFINITY : e;
    }
    return worst;
}

// ||a - b||_2 / ||b - before||_2: how far a step's result a is from the reference step's result b, as a fraction
// of the reference's move from `before` (the 2-norm weighs the large moves, where a mistake shows). Infinite
// when a holds a NaN; the plain distance when the reference did not move.
static inline double move_error(const float *a, const float *b, const float *before, size_t n) {
    double e2 = 0.0, m2 = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i], mv = (double)b[i] - (double)before[i];
        e2 += d * d;
        m2 += mv * mv;
    }
    return isnan(e2) ? INFINITY : m2 > 0 ? sqrt(e2 / m2) : sqrt(e2);
}

// How an array compares with its reference, in two numbers that name the usual mistakes:
//   ratio  the least-squares factor in mine ~ ratio * ref, dot(mine, ref) / dot(ref, ref): 2 when mine is
//          twice the reference (gradients added up over two steps), -1 when it has the opposite sign, n when
//          a 1/n scale is missing; 1 when they agree
//   error  max |mine - ref| / max |ref|: the largest difference relative to the reference's size (NaN: infinite)
typedef struct {
    double ratio, error;
} Compare;

static inline Compare compare_arrays(const float *mine, const float *ref, size_t n) {
    double dot = 0.0, norm = 0.0, err = 0.0, scale = 0.0;
    for (size_t i = 0; i < n; i++) {
        dot += (double)mine[i] * ref[i];
        norm += (double)ref[i] * ref[i];
        double d = fabs((double)mine[i] - (double)ref[i]);
        err = isnan(d) ? INFINITY : (d > err ? d : err);
        scale = fabs((double)ref[i]) > scale ? fabs((double)ref[i]) : scale;
    }
    return (Compare){.ratio = norm > 0 ? dot / norm : (dot == 0 ? 1.0 : INFINITY),
                     .error = scale > 0 ? err / scale : err};
}

// Asserts two float arrays agree within a relative tolerance, and says where they first differ.
#define assert_close(a, b, n, tol, floor)                                                    \
    do {                                                                                     \
        double e_ = max_rel_error((a), (b), (n), (floor));                                   \
        if (!(e_ <= (tol))) {                                                                \
            for (size_t i_ = 0; i_ < (size_t)(n); i_++) {                                    \
                double s_ = fabs((double)(b)[i_]) > (floor) ? fabs((double)(b)[i_]) : (floor); \
                if (!(fabs((double)(a)[i_] - (double)(b)[i_]) / s_ <= (tol))) {              \
                    print_error("%s vs %s: max relative error %.3g > %.3g; first at [%zu]: %.8g vs %.8g\n", \
                                #a, #b, e_, (double)(tol), i_, (double)(a)[i_], (double)(b)[i_]); \
                    break;                                                                   \
                }                                                                            \
            }                                                                                \
            fail();                                                                          \
        }                                                                                    \
    } while (0)

// Rounding bound for float32 sums (Higham, Accuracy and Stability, Thm 3.5): a sum of k terms (a dot product of
// length k), in ANY order, blocking or FMA pattern, is off by at most gamma_k * sum|terms|, with
// gamma_k = k u / (1 - k u) and u = 2^-24. It holds for every IEEE float32 BLAS kernel, which one machine's
// measurement does not.
static inline double gamma_k(double k) {
    const double u = 0x1p-24;
    return k * u / (1.0 - k * u);
}

// Asserts |a_i - b_i| <= gamma_k(k) * abs_i for every i: abs_i is sum|terms| of element i (computed by running
// the same operation on |inputs|, whose terms are then all |term|), k the number of roundings on the longer
// path from the exact value to either side.
#define assert_within_rounding(a, b, abs, n, k)                                                             \
    do {                                                                                                     \
        for (size_t i_ = 0; i_ < (size_t)(n); i_++) {                                                        \
            double d_ = fabs((double)(a)[i_] - (double)(b)[i_]), bound_ = gamma_k(k) * (double)(abs)[i_];     \
            if (!(d_ <= bound_)) {                                                                           \
                print_error("%s vs %s: |difference| %.3g > gamma_%d * sum|terms| = %.3g at [%zu]: %.9g vs %.9g\n", \
                            #a, #b, d_, (int)(k), bound_, i_, (double)(a)[i_], (double)(b)[i_]);               \
                fail();                                                                                      \
            }                                                                                                \
        }                                                                                                    \
    } while (0)

// Skips the calling test (cmocka's skip) with the reason when no GPU is usable.
#define skip_without_gpu()                                                   \
    do {                                                                     \
        const char *why_ = NULL;                                             \
        if (!device_cuda_usable(&why_)) {                                    \
            print_message("[  SKIP    ] needs a GPU: %s\n", why_);          \
            skip();                                                          \
        }                                                                    \
        print_message("[  CUDA    ] runs on the CUDA device\n"); /* tests/grade.py: where it ran */ \
    } while (0)

// Reads a whole binary file into a malloc'd buffer; fails the test when it is missing.
static inline void *read_fixture(const char *path, size_t *bytes) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        print_error("cannot open fixture %s (run from the repository root)\n", path);
        fail();
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc((size_t)size + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)size, f), (size_t)size);
    fclose(f);
    if (bytes) *bytes = (size_t)size;
    return buf;
}

// Runs fn(arg) in a child process (a kit error ends the process: the caller must survive it), its stderr captured
// into report (NUL-terminated, at most len - 1 bytes). Returns the child's exit status, -1 if a signal ended it.
static inline int child_exit_status(void (*fn)(void *), void *arg, char *report, size_t len) {
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    fflush(stdout);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], STDERR_FILENO);
        fn(arg);
        _exit(0);
    }
    close(fds[1]);
    size_t used = 0;
    ssize_t got;
    while (used + 1 < len && (got = read(fds[0], report + used, len - 1 - used)) > 0) used += (size_t)got;
    report[used] = '\0';
    // Read the rest to the end, unkept: closing the pipe while the child still writes (a usage text longer than
    // the report) would kill it with SIGPIPE, and a clean exit would read as a crash.
    char rest[512];
    while (read(fds[0], rest, sizeof rest) > 0) {
    }
    close(fds[0]);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

#endif // TESTUTIL_H
