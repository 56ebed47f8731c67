// schedule.c: the order of one stage's forwards and backwards in a step (GPipe given, 1F1B: TODO 4, a stretch
// goal) and a timeline simulator that runs every stage's order against the others (given).
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
    // STARTER: (void)stages, (void)micro_batches, (void)stage, (void)ops;
    // STARTER: return 0;  // nothing scheduled yet: `--schedule 1f1b` stops with an error until this is done
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
