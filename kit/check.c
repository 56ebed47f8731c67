// kit/check.c: the reporting side of the CHECK macros (see check.h).
#include "kit/check.h"

#include <stdarg.h>

void check_fail(const char *file, int line, const char *call, const char *error, const char *hint) {
    fflush(stdout);
    fprintf(stderr, "%s:%d: %s\n  error: %s\n", file, line, call, error);
    if (hint && hint[0]) fprintf(stderr, "  HINT: %s\n", hint);
    exit(1);
}

void check_failf(const char *file, int line, const char *call, const char *hint, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    check_fail(file, line, call, msg, hint);
}

void *check_alloc_(void *ptr, const char *file, int line, const char *call) {
    if (ptr == NULL)
        check_fail(file, line, call, "out of memory",
                   "lower --batch-size or the model width, or check `ulimit -v`");
    return ptr;
}

void die(const char *fmt, ...) {
    fflush(stdout);
    va_list ap;
    va_start(ap, fmt);
    fputs("error: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}
