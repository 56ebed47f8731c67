// schedule.c: the order of one stage's forwards and backwards in a step (GPipe given, 1F1B: TODO 4, a stretch
// goal) and a timeline simulator that runs every stage's order against the others (given).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kit/check.h"
#include "schedule.h"

static PipeOp op_forward(int k) { return (PipeOp){.backward = false, .micro = k}; }
static PipeOp op_backward(int k) { return (PipeOp){.backward = true, .micro = k}; }

// ---------------------------------------------------------------- TODO 4 (stretch): the 1F1B order

// Stage s of P, M micro-batches: the ops in 1F1B order into ops; returns how many it wrote (2*M when done).
static int schedule_1f1b(int stages, int micro_batches, int stage, PipeOp *ops) {
    // TODO 4 (stretch): GPipe keeps the activations of all M micro-batches on every stage until the backwards
    // start. 1F1B starts backward k as soon as it can: stage s first runs enough forwards to keep the stages
    // after it busy (min(P-1-s, M) of them: the warm-up), then alternates one forward and one backward (the
    // steady state), then runs the backwards left (the drain). Every micro-batch goes forward before backward,
    // in the order 0, 1, ..., M-1 both ways. (op_forward(k) and op_backward(k) make the ops.)
    // BEGIN SOLUTION
    // STARTER: (void)stages, (void)micro_batches, (void)stage, (void)ops;
    // STARTER: return 0;  // nothing scheduled yet: a 1F1B step stops with an error until this is done
    int warmup = stages - 1 - stage < micro_batches ? stages - 1 - stage : micro_batches;
    int n = 0, next_backward = 0;
    for (int k = 0; k < warmup; k++) ops[n++] = op_forward(k);
    for (int k = warmup; k < micro_batches; k++) {
        ops[n++] = op_forward(k);
        ops[n++] = op_backward(next_backward++);
    }
    while (next_backward < micro_batches) ops[n++] = op_backward(next_backward++);
    return n;
    // END SOLUTION
}

// ---------------------------------------------------------------- given: GPipe, names

int pipe_schedule(ScheduleKind kind, int stages, int micro_batches, int stage, PipeOp *ops) {
    CHECKF(stages >= 1 && micro_batches >= 1 && stage >= 0 && stage < stages, "stages >= 1, micro-batches >= 1",
           "stage %d of %d stages, %d micro-batches", stage, stages, micro_batches);
    if (kind == SCHEDULE_1F1B) return schedule_1f1b(stages, micro_batches, stage, ops);
    // GPipe: every forward, then every backward, the same order on every stage.
    int n = 0;
    for (int k = 0; k < micro_batches; k++) ops[n++] = op_forward(k);
    for (int k = 0; k < micro_batches; k++) ops[n++] = op_backward(k);
    return n;
}

static const char *const SCHEDULE_NAMES[] = {[SCHEDULE_GPIPE] = "gpipe", [SCHEDULE_1F1B] = "1f1b"};

bool schedule_parse(const char *name, ScheduleKind *kind) {
    for (int i = 0; i < (int)(sizeof SCHEDULE_NAMES / sizeof SCHEDULE_NAMES[0]); i++)
        if (name && strcmp(name, SCHEDULE_NAMES[i]) == 0) {
            *kind = (ScheduleKind)i;
            return true;
        }
    return false;
}

const char *schedule_name(ScheduleKind kind) {
    return kind == SCHEDULE_GPIPE || kind == SCHEDULE_1F1B ? SCHEDULE_NAMES[kind] : "unknown";
}

// ---------------------------------------------------------------- given: the timeline simulator

// Where the simulation stands: per stage the next op of its order and when it is free; per (stage, micro-batch)
// when its forward and its backward ended (negative: not yet).
typedef struct {
    int P, M;
    int *next;          // (P) index of the next op in each stage's order
    double *free_at;    // (P) when the stage's previous op ended
    double *busy;       // (P) time spent running ops
    int *inflight;      // (P) micro-batches with forward done and backward not yet
    double *f_end;      // (P, M)
    double *b_end;      // (P, M)
} Timeline;

// The earliest start of op on stage s by its dependencies alone, or a negative number when one of them has not
// run yet. A backward needs its own stage's forward (its activations), and the gradient from the stage after.
static double timeline_ready(const Timeline *t, int s, PipeOp op, double t_hop) {
    int k = op.micro;
    if (!op.backward) {
        if (s == 0) return 0.0;
        return t->f_end[(s - 1) * t->M + k] < 0 ? -1.0 : t->f_end[(s - 1) * t->M + k] + t_hop;
    }
    if (t->f_end[s * t->M + k] < 0) return -1.0;
    if (s == t->P - 1) return t->f_end[s * t->M + k];
    return t->b_end[(s + 1) * t->M + k] < 0 ? -1.0 : t->b_end[(s + 1) * t->M + k] + t_hop;
}

// Runs stage s's ops in order while their dependencies are met; returns how many it ran, or -1 for an op that
// can never be valid (a micro-batch out of range, or one run twice).
static int timeline_advance(Timeline *t, int s, PipeOp *const *ops, const int *n_ops, double t_fwd, double t_bwd,
                            double t_hop, ScheduleStats *st) {
    int ran = 0;
    while (t->next[s] < n_ops[s]) {
        PipeOp op = ops[s][t->next[s]];
        if (op.micro < 0 || op.micro >= t->M) return -1;
        double *end = op.backward ? &t->b_end[s * t->M + op.micro] : &t->f_end[s * t->M + op.micro];
        if (*end >= 0) return -1;
        double ready = timeline_ready(t, s, op, t_hop);
        if (ready < 0) break;  // waits on an op not run yet (perhaps never: the caller sees no progress)
        double start = ready > t->free_at[s] ? ready : t->free_at[s], dt = op.backward ? t_bwd : t_fwd;
        *end = t->free_at[s] = start + dt;
        t->busy[s] += dt;
        t->inflight[s] += op.backward ? -1 : 1;
        if (t->inflight[s] > st->peak_inflight[s]) st->peak_inflight[s] = t->inflight[s];
        t->next[s]++;
        ran++;
    }
    return ran;
}

ScheduleStats schedule_simulate_ops(int stages, int micro_batches, PipeOp *const *ops, const int *n_ops,
                                    double t_fwd, double t_bwd, double t_hop) {
    CHECKF(stages >= 1 && stages <= SCHEDULE_MAX_STAGES && micro_batches >= 1, "1..64 stages, micro-batches >= 1",
           "%d stages, %d micro-batches", stages, micro_batches);
    CHECKF(isfinite(t_fwd + t_bwd + t_hop) && t_fwd >= 0 && t_bwd >= 0 && t_hop >= 0,
           "op and hop times are durations (finite, >= 0)",
           "t_fwd %g, t_bwd %g, t_hop %g", t_fwd, t_bwd, t_hop);
    int P = stages, M = micro_batches;
    Timeline t = {.P = P, .M = M};
    t.next = xcalloc((size_t)P, sizeof(int));
    t.inflight = xcalloc((size_t)P, sizeof(int));
    t.free_at = xcalloc((size_t)P, sizeof(double));
    t.busy = xcalloc((size_t)P, sizeof(double));
    t.f_end = xmalloc((size_t)P * M * sizeof(double));
    t.b_end = xmalloc((size_t)P * M * sizeof(double));
    for (size_t i = 0; i < (size_t)P * M; i++) t.f_end[i] = t.b_end[i] = -1.0;
    ScheduleStats st = {.ok = true};
    // Each pass runs whatever became ready; a pass that runs nothing with ops left is a deadlock. Every op's
    // dependencies have ended before it is placed, so its start time is final when it is placed.
    for (bool progress = true; progress;) {
        progress = false;
        for (int s = 0; s < P && st.ok; s++) {
            int ran = timeline_advance(&t, s, ops, n_ops, t_fwd, t_bwd, t_hop, &st);
            if (ran < 0) st.ok = false;
            progress = progress || ran > 0;
        }
    }
    // Done only when every stage ran the forward and the backward of every micro-batch (each at most once, above).
    for (size_t i = 0; i < (size_t)P * M; i++)
        if (t.f_end[i] < 0 || t.b_end[i] < 0) st.ok = false;
    for (int s = 0; s < P; s++)
        if (t.free_at[s] > st.step_time) st.step_time = t.free_at[s];
    for (int s = 0; s < P; s++) st.idle[s] = st.step_time > 0 ? 1.0 - t.busy[s] / st.step_time : 0.0;
    free(t.next), free(t.inflight), free(t.free_at), free(t.busy), free(t.f_end), free(t.b_end);
    return st;
}

ScheduleStats schedule_simulate(ScheduleKind kind, int stages, int micro_batches, double t_fwd, double t_bwd,
                                double t_hop) {
    CHECKF(stages >= 1 && stages <= SCHEDULE_MAX_STAGES && micro_batches >= 1, "1..64 stages, micro-batches >= 1",
           "%d stages, %d micro-batches", stages, micro_batches);
    PipeOp *ops[SCHEDULE_MAX_STAGES];
    int n_ops[SCHEDULE_MAX_STAGES];
    for (int s = 0; s < stages; s++) {
        ops[s] = xmalloc(2 * (size_t)micro_batches * sizeof(PipeOp));
        n_ops[s] = pipe_schedule(kind, stages, micro_batches, s, ops[s]);
    }
    ScheduleStats st = schedule_simulate_ops(stages, micro_batches, ops, n_ops, t_fwd, t_bwd, t_hop);
    for (int s = 0; s < stages; s++) free(ops[s]);
    return st;
}
