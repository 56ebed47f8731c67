// kit/log.c: progress bar, metrics CSV and clock (see log.h).
#include "kit/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kit/check.h"

double time_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void progress_begin(Progress *p, const char *label, int total, bool enabled) {
    p->label = label;
    p->total = total > 0 ? total : 1;
    // Under mpirun a rank's stdout is a pseudo-terminal even when mpirun's own output goes to a file:
    // scripts/launch.sh then sets KIT_PROGRESS=plain so the bar does not fill the file with redraws.
    const char *mode = getenv("KIT_PROGRESS");
    p->tty = isatty(STDOUT_FILENO) && !(mode && strcmp(mode, "plain") == 0);
    p->enabled = enabled;
    p->start = time_now();
    p->last_printed = 0;
}

static void format_eta(char *buf, size_t len, double seconds) {
    int s = (int)(seconds + 0.5);
    if (s >= 3600) snprintf(buf, len, "%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60);
    else snprintf(buf, len, "%d:%02d", s / 60, s % 60);
}

void progress_update(Progress *p, int step, double loss, double acc, double images_per_s) {
    if (!p->enabled) return;
    // Off a terminal (a log file, CI) a redrawn bar is noise: print a plain line every ~10%.
    int every = p->total >= 10 ? p->total / 10 : 1;
    if (!p->tty && step != p->total && step - p->last_printed < every) return;
    p->last_printed = step;
    double elapsed = time_now() - p->start;
    char eta[16];
    format_eta(eta, sizeof eta, step > 0 ? elapsed * (p->total - step) / step : 0.0);
    if (p->tty) {
        enum { WIDTH = 24 };
        char bar[WIDTH + 1];
        int filled = step * WIDTH / p->total;
        for (int i = 0; i < WIDTH; i++) bar[i] = i < filled ? '#' : '.';
        bar[WIDTH] = '\0';
        printf("\r%s [%s] %d/%d loss %.4f acc %5.1f%% %7.0f img/s ETA %s  ", p->label, bar, step, p->total, loss,
               100.0 * acc, images_per_s, eta);
    } else {
        printf("%s step %d/%d loss %.4f acc %.1f%% %.0f img/s ETA %s\n", p->label, step, p->total, loss,
               100.0 * acc, images_per_s, eta);
    }
    fflush(stdout);
}

void progress_end(Progress *p) {
    if (p->enabled && p->tty) {
        putchar('\n');
        fflush(stdout);
    }
}

void metrics_append(const char *path, const char *columns, const double *values, int count) {
    struct stat st;
    bool fresh = stat(path, &st) != 0 || st.st_size == 0;
    FILE *f = fopen(path, "a");
    if (!f) check_failf(__FILE__, __LINE__, "fopen(path, \"a\")", "does the folder exist, and is it writable?",
                        "cannot open metrics file %s: %s", path, strerror(errno));
    if (fresh) fprintf(f, "%s\n", columns);
    for (int i = 0; i < count; i++) fprintf(f, "%s%.6g", i ? "," : "", values[i]);
    fputc('\n', f);
    CHECK(fclose(f) == 0, "the disk may be full");
}
