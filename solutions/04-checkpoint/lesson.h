// lesson.h: the functions you write in lesson 04, shared by train.c, ckpt.c and the autograder.
//
// Lesson 03's DDP comes complete from its solution (solutions/03-ddp/lesson.h: ddp_step, ddp_global_metrics,
// ...). The kit supplies the checkpoint FILE (kit/ckpt.h: encoding, every check of a file, loading onto a
// model on its device). You write what makes a distributed training run survive being stopped.
#ifndef LESSON04_H
#define LESSON04_H

#include <signal.h>

#include "solutions/03-ddp/lesson.h"
#include "kit/ckpt.h"
#include "kit/cli.h"
#include "kit/dist.h"
#include "kit/model.h"
#include "kit/train.h"

#ifdef __cplusplus
extern "C" {
#endif

// What to save, where, and when.
typedef struct {
    const char *file;    // --checkpoint FILE: overwritten at every save
    const char *dir;     // --checkpoint-dir DIR: DIR/ckpt-STEP.ckpt, the newest `keep` kept
    int keep;
    int save_every;      // steps; 0: at the end of every epoch only
    long stop_at;        // save and stop after this step (0: never)
    char last_saved[1024];  // path of the last checkpoint written ("" before the first)
    long long last_saved_step;
    double save_seconds; // time spent saving, rank 0
    const char *stopped_by;  // why the training returned RUN_STOPPED
} Checkpointer;

// Why the training returned.
typedef enum {
    RUN_DONE,       // every epoch trained
    RUN_STOPPED,    // SIGTERM/SIGINT or --stop-at: a checkpoint was saved, resume from it
    RUN_NONFINITE,  // the loss became NaN or Inf: stopped before saving
    RUN_FAILED,     // a checkpoint could not be saved or loaded (message printed)
} RunStatus;

// ---------------------------------------------------------------- what you write (ckpt.c)

// TODO 1: writes n bytes to path so that path is never seen half written, and is on disk when this returns.
// Returns 0, or -1 with the failing step and the system's reason in err.
int ckpt_write_file(const char *path, const void *buf, size_t n, char *err, size_t errlen);

// TODO 2: saves m and *st to path from rank 0 only; every rank returns the same result, and only once the
// file is durable. Returns 0, or -1 on every rank (err: the reason on rank 0, a pointer to it elsewhere).
int ckpt_save_rank0(ProcessGroup *pg, const char *path, const Model *m, const CkptState *st, char *err,
                    size_t errlen);

// TODO 3: the checkpoint's description of this run: model, dataset, world, the position, the schedule, the
// optimizer, and the metrics so far. epoch_local: this rank's sums over the epoch in progress (this session).
// sched: the run's schedule (lesson 03's DdpRun.sched).
CkptState ckpt_capture(ProcessGroup *pg, const TrainOptions *o, const Model *m, const RunState *run,
                       const LrSchedule *sched, int steps_per_epoch, Metrics epoch_local);
// TODO 3 (the other way): the run's position and metrics from a checkpoint.
RunState ckpt_restore(const CkptState *st);

// TODO 4: loads path into m on every rank (each onto its own device). Returns 0, or -1 on EVERY rank when any
// rank could not load it (err: the reason). On success the replicas are identical.
int ckpt_load_all(ProcessGroup *pg, const char *path, Model *m, CkptState *st, char *err, size_t errlen);

// TODO 5: must the run stop after this step? Sets *nonfinite when the step's loss (batch: this rank's) was
// NaN or Inf on ANY rank, *signalled when SIGTERM/SIGINT reached ANY rank. Every rank gets the same answers.
void ckpt_stop_flags(ProcessGroup *pg, const Metrics *batch, bool *signalled, bool *nonfinite);

// Set by the signal handler (train.c installs it for SIGTERM and SIGINT).
extern volatile sig_atomic_t g_stop_signal;

// ---------------------------------------------------------------- given (train.c)

// What a later lesson adds to this program, called by run_program_with at fixed points on every rank, ctx
// first. Each may be NULL (nothing to add there). Lesson 05 converts the model to SyncBN with them.
typedef struct {
    void *ctx;
    // after the model is made, before the broadcast from rank 0 and the gradient buckets: change what it is
    void (*model_built)(void *ctx, ProcessGroup *pg, Model *m);
    // in the report of a run that finished or stopped, before the final line. steps: what this process
    // trained (after a resume: since the resume); ddp: the model, the process group and the step times
    void (*report)(void *ctx, const Ddp *ddp, long long steps);
    // after training, before the model is given to the caller or freed
    void (*model_done)(void *ctx, Model *m);
} RunHooks;

// Everything main does after the process group: lesson 03's loop (ddp_run_*) with saves, stops and --resume
// added through its hooks (TrainHooks), and the later lesson's hooks
// (NULL: none). Returns why it stopped; *model_out (when not NULL) gets the model (the caller frees it),
// *resumed_from the step resumed from (-1: none).
RunStatus run_program_with(ProcessGroup *pg, const TrainOptions *o, const RunHooks *hooks, Model **model_out,
                           long long *resumed_from);
// This lesson's program: run_program_with, no hooks. The autograder runs whole trainings through it.
RunStatus run_program(ProcessGroup *pg, const TrainOptions *o, Model **model_out, long long *resumed_from);
// The path of the checkpoint saved at `step`: --checkpoint's file, or the step's file in --checkpoint-dir.
void checkpointer_path(const Checkpointer *ck, long long step, char *out, size_t outlen);

#ifdef __cplusplus
}
#endif

#endif // LESSON04_H
