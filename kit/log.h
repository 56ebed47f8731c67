// kit/log.h: progress bar, per-epoch metrics CSV, and a wall clock.
#ifndef KIT_LOG_H
#define KIT_LOG_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

// Seconds from a monotonic clock.
double time_now(void);

typedef struct {
    const char *label;   // "epoch 3/10"
    int total;           // steps in this bar
    bool tty;            // redraw in place on a terminal; otherwise print a plain line every ~10%
    bool enabled;        // false on ranks other than 0
    double start;
    int last_printed;
} Progress;

// enabled=false prints nothing (for non-zero ranks). The bar redraws in place when stdout is a TTY
// (and KIT_PROGRESS is not "plain").
void progress_begin(Progress *p, const char *label, int total, bool enabled);
// step is 1-based; loss and acc are running means; images_per_s is the throughput so far.
void progress_update(Progress *p, int step, double loss, double acc, double images_per_s);
void progress_end(Progress *p);

// Appends one row to a CSV file, writing the header first when the file is new or empty.
// columns: comma-separated names ("epoch,train_loss,..."); values: that many doubles.
void metrics_append(const char *path, const char *columns, const double *values, int count);

#ifdef __cplusplus
}
#endif

#endif // KIT_LOG_H
