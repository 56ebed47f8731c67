// bench/bench_trace.c: what one timeline event costs (kit/trace.h), off and on: the per-step cost of --trace is
// this times the events a step records (lesson 03 with 6 buckets: about 20), which a whole-run A/B on a shared
// machine cannot resolve (bench/results-trace.md).
//
//   build/bench/bench_trace [SPANS]      (writes /tmp/bench-trace-PID.json.rank0.json and removes it)
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "kit/log.h"
#include "kit/trace.h"

// ns per begin/end pair of a complete span, the best of 5 repetitions of n (the least disturbed by other work).
static double span_ns(long n) {
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = time_now();
        for (long i = 0; i < n; i++) {
            double t = trace_begin("forward");
            trace_end(t, TRACE_COMPUTE, "forward");
        }
        double ns = (time_now() - t0) * 1e9 / (double)n;
        if (ns < best) best = ns;
    }
    return best;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 200000;
    double off = span_ns(n);
    char path[64], rank_file[96];
    snprintf(path, sizeof path, "/tmp/bench-trace-%ld.json", (long)getpid());
    snprintf(rank_file, sizeof rank_file, "%s.rank0.json", path);
    trace_open(path, 0, 1);
    double on = span_ns(n);  // 5 n spans: the buffer (65536 events) is written out many times, as in a long run
    double t0 = time_now();
    trace_close();
    double close_s = time_now() - t0;
    remove(rank_file);
    printf("spans: %ld x 5; off %.1f ns per span, on %.1f ns per span (buffer flushes included); trace_close %.3f s\n",
           n, off, on, close_s);
    return 0;
}
