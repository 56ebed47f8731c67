// kit/check.h: error checking for every call that can fail.
//
// Each CHECK macro evaluates a call once; on failure it prints
//   file:line: the failing call
//   error: what the library said
//   HINT: the usual causes
// in one write (ranks under mpirun do not interleave) and exits with status 1. The kit never continues
// after a failed call: a wrong answer that looks right is worse than a clear stop.
#ifndef KIT_CHECK_H
#define KIT_CHECK_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

// Prints the report and exits(1). Never returns.
void check_fail(const char *file, int line, const char *call, const char *error, const char *hint)
    __attribute__((noreturn));

// Like check_fail, with a printf-style error message.
void check_failf(const char *file, int line, const char *call, const char *hint, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 5, 6)));

// For functions that report a bad input instead of stopping (the dataset readers, the checkpoint loader:
// a caller may skip a corrupt file and try the next): formats the one-line reason into err (when err is
// not NULL) and returns -1, so that a reader can `return check_reason(err, errlen, "truncated at %zu", off);`.
int check_reason(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

// Appends s to the string in buf (len bytes), after sep when buf is not empty: the lists of names that --help
// and error messages build from the kit's tables. A list that does not fit is a bug: it stops with a report.
void check_join(char *buf, size_t len, const char *sep, const char *s);
// A library's error code and what to say about it: tables of these give the CHECK macros' HINT lines and
// names (kit/cuda_check.h, kit/mpi_check.h). check_text returns the text of `code`, or fallback.
typedef struct {
    int code;
    const char *text;
} CheckText;
const char *check_text(int code, const CheckText *table, int n, const char *fallback);
#define CHECK_TEXT(code, table, fallback) check_text((int)(code), (table), (int)(sizeof(table) / sizeof((table)[0])), (fallback))

// The n names of a table joined by '|' ("tiny|tiny-bn|fmnist|resnet9"), written into buf (len bytes, static, all
// zero at first) by the first call and returned by every call; name(i) is the i-th. Safe from several threads.
const char *check_names(char *buf, size_t len, int n, const char *(*name)(int i));

// A condition that must hold. CHECK(n > 0, "the dataset is empty: did the download finish?")
#define CHECK(cond, hint)                                                       \
    do {                                                                        \
        if (!(cond)) check_fail(__FILE__, __LINE__, #cond, "condition is false", (hint)); \
    } while (0)

// A condition with a formatted report of the values involved; the report names the condition as written.
// CHECKF(i < n, "indices come from the sampler", "index %d is outside 0..%d", i, n - 1)
#define CHECKF(cond, hint, ...)                                                 \
    do {                                                                        \
        if (!(cond)) check_failf(__FILE__, __LINE__, #cond, (hint), __VA_ARGS__); \
    } while (0)

// A POSIX call that returns -1 (or a negative value) and sets errno.
#define CHECK_SYS(call, hint)                                                   \
    do {                                                                        \
        if ((call) < 0) check_fail(__FILE__, __LINE__, #call, strerror(errno), (hint)); \
    } while (0)

// A pthread_* call that returns an error number.
#define CHECK_PTHREAD(call)                                                     \
    do {                                                                        \
        int check_rc_ = (call);                                                 \
        if (check_rc_ != 0)                                                     \
            check_fail(__FILE__, __LINE__, #call, strerror(check_rc_),          \
                       "thread creation fails when the process hits its thread or memory limit (ulimit -u, -v)"); \
    } while (0)

// Allocation. Returns the pointer: float *x = CHECK_ALLOC(malloc(n * sizeof *x));
#define CHECK_ALLOC(ptr) ((__typeof__(ptr))check_alloc_((ptr), __FILE__, __LINE__, #ptr))
void *check_alloc_(void *ptr, const char *file, int line, const char *call);

// malloc/calloc that never return NULL (they exit with a report instead).
#define xmalloc(bytes) check_alloc_(malloc(bytes), __FILE__, __LINE__, "malloc(" #bytes ")")
#define xcalloc(n, size) check_alloc_(calloc((n), (size)), __FILE__, __LINE__, "calloc(" #n ", " #size ")")

// An error the user can fix (bad file, missing data, an impossible setting): "error: <message>" on one
// line, exit status 1. A mistake in the command line itself (an unknown option, a bad value) is a usage
// error: cli_parse reports it with the usage text and exit status 2.
void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

#ifdef __cplusplus
}
#endif

#endif // KIT_CHECK_H
