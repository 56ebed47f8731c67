// train.c: lesson 04, lesson 03's DDP program with checkpoints: stop it any way you like, resume it, get the
// same model.
//
//   scripts/launch.sh 2 ./train --checkpoint-dir run1 --save-every 50      (Ctrl-C: saves, says how to resume)
//   scripts/launch.sh 2 ./train --checkpoint-dir run1 --resume auto        (the same command, requeued)
//
// Every rank runs this whole file. The DDP parts (ddp_*) come complete from lesson 03's solution; what you
// write is in ckpt.c (TODO 1-5). This file calls it at three places:
//
//   start:          --resume: every rank loads the checkpoint (TODO 4) and takes up its position (TODO 3)
//   after a step:   a signal or a NaN on any rank? (TODO 5); a save due? -> capture (TODO 3), rank 0 writes (1, 2)
//   end of epoch:   a save, after the evaluation
//
// The program is run_program_with: it takes hooks (RunHooks, lesson.h) through which a later lesson adds to it
// without copying it (lesson 05: SyncBN). This lesson's run_program passes none.
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kit/check.h"
#include "kit/cli.h"
#include "kit/data.h"
#include "kit/device.h"
#include "kit/dist.h"
#include "lesson.h"
#include "kit/log.h"
#include "kit/model.h"
#include "kit/optim.h"
#include "kit/trace.h"
#include "kit/train.h"

void checkpointer_path(const Checkpointer *ck, long long step, char *out, size_t outlen) {
    if (ck->file) snprintf(out, outlen, "%s", ck->file);
    else ckpt_path_for_step(out, outlen, ck->dir, step);
}

static bool checkpointer_enabled(const Checkpointer *ck) { return ck->file || ck->dir; }

// ---------------------------------------------------------------- saving: the loop's hooks

// What the hooks share: where to save, and why the training stopped.
typedef struct {
    Checkpointer ck;
    RunStatus status;
    const RunHooks *hooks;  // the later lesson's (model_built is forwarded)
} CkptRun;

// Saves where the run stands. Every rank calls it (capturing the metrics is a collective). epoch_local: this
// rank's sums over the epoch in progress.
static int save_now(DdpRun *r, Checkpointer *ck, Metrics epoch_local) {
    CkptState st = ckpt_capture(r->pg, r->o, r->ddp.model, &r->run, &r->sched, r->steps_per_epoch, epoch_local);
    char path[1024], err[1024];
    checkpointer_path(ck, r->run.step, path, sizeof path);
    double start = time_now(), t = trace_begin("checkpoint save");
    if (ckpt_save_rank0(r->pg, path, r->ddp.model, &st, err, sizeof err) != 0) {
        progress_end(&r->log.bar);
        fprintf(stderr, "error: rank %d: checkpoint not saved: %s\n", pg_rank(r->pg), err);
        return -1;
    }
    ck->save_seconds += time_now() - start;
    trace_end(t, TRACE_IO, "checkpoint save");
    snprintf(ck->last_saved, sizeof ck->last_saved, "%s", path);
    ck->last_saved_step = r->run.step;
    if (ck->dir && r->is_main) ckpt_prune(ck->dir, ck->keep);
    return 0;
}

// After every step: stop on a NaN (without saving), save when due, stop on a signal or --stop-at.
static bool after_step(void *ctx, DdpRun *r, const Batch *b, const Metrics *batch) {
    CkptRun *c = ctx;
    Checkpointer *ck = &c->ck;
    bool signalled, nonfinite;
    ckpt_stop_flags(r->pg, batch, &signalled, &nonfinite);
    if (nonfinite) {  // before any save: the last good checkpoint must survive
        progress_end(&r->log.bar);
        if (r->is_main)
            fprintf(stderr, "error: the loss is NaN or Inf at step %lld (epoch %d, batch %d): stopping without "
                    "saving.\n  The last good checkpoint: %s (step %lld)\n  HINT: a lower --lr, or more --warmup-epochs\n",
                    r->run.step, r->run.epoch + 1, b->index + 1, ck->last_saved[0] ? ck->last_saved : "none",
                    ck->last_saved_step);
        c->status = RUN_NONFINITE;
        return true;
    }
    bool stop = signalled || (ck->stop_at > 0 && r->run.step >= ck->stop_at);
    bool due = ck->save_every > 0 && r->run.step % ck->save_every == 0;
    if ((stop || due) && checkpointer_enabled(ck) && save_now(r, ck, r->log.local) != 0) {
        c->status = RUN_FAILED;
        return true;
    }
    if (stop) {
        progress_end(&r->log.bar);
        ck->stopped_by = signalled ? "SIGTERM or SIGINT" : "--stop-at";
        c->status = RUN_STOPPED;
    }
    return stop;
}

// After every epoch (its evaluation done): a save.
static bool after_epoch(void *ctx, DdpRun *r) {
    CkptRun *c = ctx;
    if (checkpointer_enabled(&c->ck) && save_now(r, &c->ck, (Metrics){0, 0, 0}) != 0) {
        c->status = RUN_FAILED;
        return true;
    }
    return false;
}

static void model_built(void *ctx, ProcessGroup *pg, Model *m) {
    const RunHooks *h = ((CkptRun *)ctx)->hooks;
    if (h->model_built) h->model_built(h->ctx, pg, m);
}

// ---------------------------------------------------------------- before the first step

// Every path this run will write, checked by rank 0 before the first step (a save that fails after an hour of
// training loses the hour), its verdict shared with every rank. No output replaces another run's work: the
// kit's one check (kit/ckpt.h, ckpt_check_file_owner) reads what is there and refuses a file or a folder of
// another run, naming --overwrite (a file) and --resume. A user who lost a week of training would not forgive it.
static int check_outputs(DdpRun *r, const Checkpointer *ck) {
    char err[2400];
    double bad = 0.0;
    if (r->is_main) {
        const TrainOptions *o = r->o;
        CkptState id;
        train_identity(&id, &r->ddp.model->cfg, o, &r->sched);
        CkptOwner me = {.id = &id, .resuming = o->resume != NULL, .overwrite = o->overwrite, .can_resume = true};
        char newest[1024], why[1024];
        int rc = 0;
        if (ck->file) rc = ckpt_check_file_owner("--checkpoint", ck->file, CKPT_OUT_CHECKPOINT, &me, err, sizeof err);
        else if (ck->dir) {
            bool any = ckpt_find_latest(ck->dir, newest, sizeof newest, why, sizeof why) == 0;
            rc = ckpt_check_dir_owner("--checkpoint-dir", ck->dir, any ? newest : NULL, "checkpoints", &me, err,
                                      sizeof err);
        }
        if (rc == 0 && o->metrics)
            rc = ckpt_check_file_owner("--metrics", o->metrics, CKPT_OUT_REPORT, &me, err, sizeof err);
        if (rc != 0) {
            fprintf(stderr, "error: %s\n", err);
            bad = 1.0;
        }
    }
    pg_allreduce_sum_double_host(r->pg, &bad, 1);  // rank 0's verdict (the others add 0): every rank stops, or none
    return bad != 0.0 ? -1 : 0;
}

// ---------------------------------------------------------------- resuming

// A checkpoint continues THE SAME run: every option that changes what a step computes must match.
// (The world size need not: the global batch and the data order do not depend on it.)
static int check_resumable(const CkptState *st, const DdpRun *r, char *err, size_t errlen) {
    const TrainOptions *o = r->o;
    const LrSchedule *s = &r->sched;
    const SgdConfig *opt = &r->opt;
#define SAME(cond, opt_name, fmt, saved, now)                                                                      \
    if (!(cond)) {                                                                                                \
        snprintf(err, errlen, "the checkpoint was trained with %s " fmt ", this run asks for " fmt                \
                 ": resume with the same value (another value is another run)", opt_name, saved, now);            \
        return -1;                                                                                                \
    }
    char name[CKPT_ESCAPED_LEN];  // the file's bytes: printed escaped
    SAME(strcmp(st->dataset, o->dataset) == 0, "--dataset", "%s", ckpt_escape(st->dataset, name, sizeof name), o->dataset);
    SAME(st->global_batch == o->batch_size, "--batch-size", "%d", st->global_batch, o->batch_size);
    SAME(st->epochs == o->epochs, "--epochs", "%d", st->epochs, o->epochs);
    SAME(st->seed == o->seed, "--seed", "%llu", (unsigned long long)st->seed, (unsigned long long)o->seed);
    SAME(st->peak_lr == s->peak_lr, "--lr", "%g", (double)st->peak_lr, (double)s->peak_lr);
    SAME(st->momentum == opt->momentum, "--momentum", "%g", (double)st->momentum, (double)opt->momentum);
    SAME(st->weight_decay == opt->weight_decay, "--weight-decay", "%g", (double)st->weight_decay, (double)opt->weight_decay);
    SAME(st->nesterov == (int)opt->nesterov, "--nesterov", "%d", st->nesterov, (int)opt->nesterov);
    SAME(st->warmup_steps == s->warmup_steps, "a warmup of", "%d steps", st->warmup_steps, s->warmup_steps);
#undef SAME
    if (st->steps_per_epoch != r->steps_per_epoch) {
        snprintf(err, errlen, "the checkpoint has %d steps per epoch, %d ranks here make %d (the tail the sampler "
                 "drops depends on the world size): resume on a world size that divides the training set like the "
                 "original", st->steps_per_epoch, pg_world(r->pg), r->steps_per_epoch);
        return -1;
    }
    return 0;
}

// The checkpoint --resume names: the file, or the newest valid one of --checkpoint-dir (auto). Returns false
// when auto finds none (a fresh start: the first job of a chain).
static bool resume_path(const TrainOptions *o, char *out, size_t outlen, bool is_main) {
    if (strcmp(o->resume, "auto") != 0) {
        snprintf(out, outlen, "%s", o->resume);
        return true;
    }
    char why[1024];
    if (ckpt_find_latest(o->checkpoint_dir, out, outlen, why, sizeof why) == 0) return true;
    if (is_main) printf("resume: nothing to resume (%s): starting from step 0\n", why);
    return false;
}

// --resume: every rank loads the checkpoint and takes up its position. Returns 0 (also when there is nothing
// to resume), or -1 on every rank when any rank cannot resume. *resumed_from: the step, -1 for none.
static int resume(DdpRun *r, Checkpointer *ck, long long *resumed_from) {
    *resumed_from = -1;
    if (!r->o->resume) return 0;
    char path[1024], err[1024];
    double failed = 0.0;
    if (resume_path(r->o, path, sizeof path, r->is_main)) {
        CkptState st;
        if (ckpt_load_all(r->pg, path, r->ddp.model, &st, err, sizeof err) != 0 ||
            check_resumable(&st, r, err, sizeof err) != 0) {
            fprintf(stderr, "error: rank %d: cannot resume: %s\n", pg_rank(r->pg), err);
            failed = 1.0;
        } else {
            r->run = ckpt_restore(&st);
            *resumed_from = st.step;
            snprintf(ck->last_saved, sizeof ck->last_saved, "%s", path);
            ck->last_saved_step = st.step;
            if (r->is_main)
                printf("resumed from %s: step %lld (epoch %d, batch %d of %d), saved by %d rank%s, now %d\n", path,
                       st.step, st.epoch + 1, st.batch_in_epoch, st.steps_per_epoch, st.world,
                       st.world == 1 ? "" : "s", pg_world(r->pg));
        }
    }
    pg_allreduce_sum_double_host(r->pg, &failed, 1);  // one rank that cannot resume stops them all
    return failed > 0.0 ? -1 : 0;
}

// ---------------------------------------------------------------- training, stopped by a signal

static void on_stop_signal(int sig) { g_stop_signal = sig; }

// Lesson 03's loop with the hooks; SIGTERM and SIGINT (when there is somewhere to save) ask for a save at the next
// step boundary.
static RunStatus train_with_signals(DdpRun *r, CkptRun *c) {
    bool handle = checkpointer_enabled(&c->ck);
    struct sigaction sa, old_term, old_int;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    if (handle) {
        sigaction(SIGTERM, &sa, &old_term);
        sigaction(SIGINT, &sa, &old_int);
    }
    c->status = RUN_DONE;
    ddp_run_epochs(r);
    if (handle) {
        // After a stop the checkpoint is saved and the program is on its way out, but a scheduler may send its
        // SIGTERM again (Slurm does while it ends the job step): the handler stays, so that a repeated TERM
        // during the teardown cannot turn a clean stop into a kill (exit 143, which the job script reads as a
        // failure and does not requeue). A second Ctrl-C (SIGINT) still ends the program at once.
        if (c->status != RUN_STOPPED) sigaction(SIGTERM, &old_term, NULL);
        sigaction(SIGINT, &old_int, NULL);
    }
    return c->status;
}

// The report of a run that finished or stopped.
static void report(DdpRun *r, CkptRun *c, long long resumed_from) {
    const Checkpointer *ck = &c->ck;
    if (r->is_main && checkpointer_enabled(ck))
        printf("checkpoints: %.2f s spent saving; the last: %s (step %lld)\n", ck->save_seconds, ck->last_saved,
               ck->last_saved_step);
    if (c->hooks->report) c->hooks->report(c->hooks->ctx, &r->ddp, r->run.step - (resumed_from > 0 ? resumed_from : 0));
    if (c->status == RUN_DONE) {
        char extra[64] = "resumed_from=none";
        if (resumed_from >= 0) snprintf(extra, sizeof extra, "resumed_from=%lld", resumed_from);
        ddp_run_report(r, extra);
    } else if (r->is_main) {
        printf("stopped after step %lld by %s; checkpoint %s\n", r->run.step, ck->stopped_by,
               ck->last_saved[0] ? ck->last_saved : "none (no --checkpoint or --checkpoint-dir)");
        printf("resume with the same command and: --resume %s\n", ck->dir ? "auto" : ck->last_saved);
    }
}

// ---------------------------------------------------------------- the program

RunStatus run_program_with(ProcessGroup *pg, const TrainOptions *o, const RunHooks *hooks, Model **model_out,
                           long long *resumed_from) {
    RunHooks none = {0};
    CkptRun c = {.ck = {.file = o->checkpoint, .dir = o->checkpoint_dir, .keep = o->keep, .save_every = o->save_every,
                        .stop_at = o->stop_at, .last_saved_step = -1},
                 .hooks = hooks ? hooks : &none};
    TrainHooks loop = {.ctx = &c, .model_built = model_built, .after_step = after_step, .after_epoch = after_epoch};
    DdpRun r;
    ddp_run_open(&r, pg, o, &loop);  // lesson 03: data, model, optimizer, schedule
    RunStatus status = RUN_FAILED;
    if (check_outputs(&r, &c.ck) == 0 && resume(&r, &c.ck, resumed_from) == 0) {
        status = train_with_signals(&r, &c);
        if (status == RUN_DONE || status == RUN_STOPPED) report(&r, &c, *resumed_from);
    }
    fflush(stdout);
    Model *m = ddp_run_close(&r);
    if (c.hooks->model_done) c.hooks->model_done(c.hooks->ctx, m);
    if (model_out) *model_out = m;
    else model_free(m);
    return status;
}

// This lesson's program: no hooks. A later lesson that links this file defines its own run_program, with its
// hooks; the build compiles this file for it with USED_BY_LATER_LESSON (mk/lessons.mk), which leaves this one out.
#ifndef USED_BY_LATER_LESSON
RunStatus run_program(ProcessGroup *pg, const TrainOptions *o, Model **model_out, long long *resumed_from) {
    return run_program_with(pg, o, NULL, model_out, resumed_from);
}
#endif

#ifndef AUTOGRADER
// ---------------------------------------------------------------- main

int main(int argc, char **argv) {
    TrainOptions o;
    cli_parse(&o, argc, argv, CLI_DIST | CLI_CKPT);  // lesson 03's options plus the checkpoint ones
    cli_apply_dataset_defaults(&o);
    Device dev;
    device_parse(o.device, &dev, true);
    ProcessGroup *pg = ddp_setup(&argc, &argv, &o, dev);
    CHECK(pg != NULL, "ddp_setup (lesson 03) returns the process group");
    long long resumed_from;
    RunStatus status = run_program(pg, &o, NULL, &resumed_from);
    pg_finalize(pg);
    // A stop on request (signal, --stop-at) is a success: the checkpoint is saved and the job can go on later.
    return status == RUN_DONE || status == RUN_STOPPED ? 0 : 1;
}
#endif  // AUTOGRADER
