// kit/check.c: the reporting side of the CHECK macros (see check.h).
#include "kit/check.h"

#include <pthread.h>
#include <stdarg.h>
#include <unistd.h>

// Reports go to stderr in ONE write(): under mpirun every rank's stderr is forwarded to one terminal,
// and a report written in pieces (stdio's unbuffered stderr writes each fprintf separately) interleaves
// with other ranks' lines. A write of up to PIPE_BUF bytes to a pipe is atomic, and the reports are
// shorter than that. Formatting failures and a short write are ignored: we are about to exit anyway.
static void report(const char *text, size_t len) {
    fflush(stdout);  // what the program printed before the error comes before it
    while (len > 0) {
        ssize_t w = write(STDERR_FILENO, text, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        text += w;
        len -= (size_t)w;
    }
}

// Appends printf-style text to buf (of cap bytes) at *used, truncating when full (buf stays terminated).
static void vappend(char *buf, size_t cap, size_t *used, const char *fmt, va_list ap) {
    int n = vsnprintf(buf + *used, cap - *used, fmt, ap);
    if (n > 0) *used += (size_t)n < cap - *used ? (size_t)n : cap - 1 - *used;
}

static void append(char *buf, size_t cap, size_t *used, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t cap, size_t *used, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vappend(buf, cap, used, fmt, ap);
    va_end(ap);
}

enum { REPORT_MAX = 2048 };

void check_fail(const char *file, int line, const char *call, const char *error, const char *hint) {
    char buf[REPORT_MAX];
    size_t used = 0;
    append(buf, sizeof buf, &used, "%s:%d: %s\n  error: %s\n", file, line, call, error);
    if (hint && hint[0]) append(buf, sizeof buf, &used, "  HINT: %s\n", hint);
    report(buf, used);
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
    char buf[REPORT_MAX];
    size_t used = 0;
    append(buf, sizeof buf, &used, "error: ");
    va_list ap;
    va_start(ap, fmt);
    vappend(buf, sizeof buf - 1, &used, fmt, ap);  // - 1: room for the newline even when truncated
    va_end(ap);
    buf[used++] = '\n';
    report(buf, used);
    exit(1);
}

int check_reason(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

void check_join(char *buf, size_t len, const char *sep, const char *s) {
    size_t used = strlen(buf);
    int n = snprintf(buf + used, len - used, "%s%s", used ? sep : "", s);
    CHECKF(n >= 0 && (size_t)n < len - used, "make the buffer larger", "\"%s\" does not fit after \"%s\" (%zu bytes)",
           s, buf, len);
}

const char *check_names(char *buf, size_t len, int n, const char *(*name)(int i)) {
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    CHECK_PTHREAD(pthread_mutex_lock(&lock));
    if (!buf[0])
        for (int i = 0; i < n; i++) check_join(buf, len, "|", name(i));
    CHECK_PTHREAD(pthread_mutex_unlock(&lock));
    return buf;
}

const char *check_text(int code, const CheckText *table, int n, const char *fallback) {
    for (int i = 0; i < n; i++)
        if (table[i].code == code) return table[i].text;
    return fallback;
}
