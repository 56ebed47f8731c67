// schedule.h: pipeline schedules, the order in which one stage runs the forwards and backwards of a step's
// micro-batches, and a timeline simulator that runs every stage's order against the others.
//
// Both schedules run the same 2*M operations per stage and, with equal stage times, leave the same idle time
// (the "bubble"); they differ in how many micro-batches' activations a stage must keep at once:
//   GPipe  F0 F1 ... F(M-1)  B0 B1 ... B(M-1)                        keeps all M
//   1F1B   min(P-1-s, M) warm-up forwards, then F, B, F, B, ..., then the remaining backwards   keeps <= P - s
#ifndef LESSON08_SCHEDULE_H
#define LESSON08_SCHEDULE_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { SCHEDULE_GPIPE, SCHEDULE_1F1B } ScheduleKind;

typedef struct {
    bool backward;  // false: forward of the micro-batch; true: its backward
    int micro;      // which micro-batch, 0..M-1
} PipeOp;

// The 2*M operations stage `stage` (of `stages`) runs in one step, in order, into ops (room for 2*M); returns
// 2*M. GPipe: F0..F(M-1), B0..B(M-1) on every stage (backward in the order the micro-batches went forward).
// 1F1B: stage s runs min(P-1-s, M) warm-up forwards, then alternates F, B, then drains the backwards.
int pipe_schedule(ScheduleKind kind, int stages, int micro_batches, int stage, PipeOp *ops);

// "gpipe" | "1f1b" -> *kind; false (and *kind untouched) for any other name.
bool schedule_parse(const char *name, ScheduleKind *kind);
const char *schedule_name(ScheduleKind kind);

#define SCHEDULE_MAX_STAGES 64    // what schedule_simulate accepts (the program itself stops at PIPE_MAX_STAGES)

// What one simulated step did.
typedef struct {
    bool ok;                               // false: the stages' orders deadlock (an op waits on one never run)
    double step_time;                      // from the first forward's start to the last op's end
    double idle[SCHEDULE_MAX_STAGES];      // stage s: the fraction of step_time it ran nothing
    int peak_inflight[SCHEDULE_MAX_STAGES];  // stage s: most micro-batches with F done and B not yet, at once
} ScheduleStats;

// Given: runs one step of `kind` over `stages` stages and M micro-batches on a timeline: every op of a stage
// after the one before it in its order; the forward of micro-batch k on stage s also after its forward on s-1
// ended plus t_hop (the hand-off), its backward after its backward on s+1 ended plus t_hop (and, on the last
// stage, after its own forward). A forward takes t_fwd, a backward t_bwd, on every stage.
ScheduleStats schedule_simulate(ScheduleKind kind, int stages, int micro_batches, double t_fwd, double t_bwd,
                                double t_hop);

// Given: the same for op lists given per stage (ops[s] holds n_ops[s] ops): what schedule_simulate runs, open
// for checking a hand-made order. An op list that never lets some op start gives ok = false, never a hang.
ScheduleStats schedule_simulate_ops(int stages, int micro_batches, PipeOp *const *ops, const int *n_ops,
                                    double t_fwd, double t_bwd, double t_hop);

#ifdef __cplusplus
}
#endif

#endif // LESSON08_SCHEDULE_H
