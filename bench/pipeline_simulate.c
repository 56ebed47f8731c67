// bench/pipeline_simulate.c: lesson 08's schedule simulator (solutions/08-pipeline/schedule.c) over a range of
// micro-batch counts, as CSV for bench/plot_pipeline.py (`make plot-pipeline`): the idle fraction a schedule
// leaves when every stage takes the same time, next to (P-1)/(M+P-1), and the peak stored micro-batches.
//
//   build/bench/pipeline_simulate [--stages P] [--max-micro M] [--fwd T] [--bwd T] [--hop T]
//
// Prints: schedule,P,M,step,idle_sim,idle_formula,peak_inflight (idle_sim: the busiest-idle stage, stage 0;
// peak_inflight: stage 0's, the largest of any stage).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit/check.h"
#include "solutions/08-pipeline/schedule.h"

// The value after option argv[i], as a number, or a clear stop.
static double arg_number(int argc, char **argv, int i) {
    CHECKF(i + 1 < argc, "usage: pipeline_simulate [--stages P] [--max-micro M] [--fwd T] [--bwd T] [--hop T]",
           "%s needs a value", argv[i]);
    char *end;
    double v = strtod(argv[i + 1], &end);
    CHECKF(*end == '\0' && end != argv[i + 1], "a number", "%s %s", argv[i], argv[i + 1]);
    return v;
}

// The value after option argv[i], a whole number in [lo, hi], or a clear stop.
static int arg_int(int argc, char **argv, int i, int lo, int hi) {
    double v = arg_number(argc, argv, i);
    CHECKF(v >= lo && v <= hi && v == (int)v, "a whole number in range", "%s %s: expected %d..%d", argv[i],
           argv[i + 1], lo, hi);
    return (int)v;
}

int main(int argc, char **argv) {
    int P = 2, max_micro = 16;
    double t_fwd = 1.0, t_bwd = 2.0, t_hop = 0.0;  // backward ~ twice the forward: two products per weight
    for (int i = 1; i < argc; i += 2) {
        if (strcmp(argv[i], "--stages") == 0) P = arg_int(argc, argv, i, 1, SCHEDULE_MAX_STAGES);
        else if (strcmp(argv[i], "--max-micro") == 0) max_micro = arg_int(argc, argv, i, 1, 4096);
        else if (strcmp(argv[i], "--fwd") == 0) t_fwd = arg_number(argc, argv, i);
        else if (strcmp(argv[i], "--bwd") == 0) t_bwd = arg_number(argc, argv, i);
        else if (strcmp(argv[i], "--hop") == 0) t_hop = arg_number(argc, argv, i);
        else CHECKF(false, "options: --stages --max-micro --fwd --bwd --hop", "unknown option %s", argv[i]);
    }
    printf("schedule,P,M,step,idle_sim,idle_formula,peak_inflight\n");
    for (int k = 0; k < 2; k++) {
        ScheduleKind kind = k == 0 ? SCHEDULE_GPIPE : SCHEDULE_1F1B;
        for (int M = 1; M <= max_micro; M++) {
            ScheduleStats st = schedule_simulate(kind, P, M, t_fwd, t_bwd, t_hop);
            if (!st.ok) {  // the starter's 1F1B (TODO 4) schedules nothing
                fprintf(stderr, "pipeline_simulate: %s with %d stages, %d micro-batches does not run to the end "
                        "(1f1b: TODO 4 in schedule.c)\n", schedule_name(kind), P, M);
                break;
            }
            printf("%s,%d,%d,%.6g,%.6f,%.6f,%d\n", schedule_name(kind), P, M, st.step_time, st.idle[0],
                   (double)(P - 1) / (M + P - 1), st.peak_inflight[0]);
        }
    }
    return 0;
}
