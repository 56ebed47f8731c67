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
#include "kit/train.h"

void checkpointer_path(const Checkpointer *ck, long long step, char *out, size_t outlen) {
    if (ck->file) snprintf(out, outlen, "%s", ck->file);
    else ckpt_path_for_step(out, outlen, ck->dir, step);
}

static bool checkpointer_enabled(const Checkpointer *ck) { return ck->file || ck->dir; }

// Saves where the run stands. Every rank calls it (capturing the metrics is a collective). epoch_local: this
// rank's sums over the epoch in progress.
static int save_now(ProcessGroup *pg, const TrainOptions *o, const Model *m, Checkpointer *ck, const RunState *run,
                    int steps_per_epoch, Metrics epoch_local, char *err, size_t errlen) {
    CkptState st = ckpt_capture(pg, o, m, run, steps_per_epoch, epoch_local);
    char path[1024];
    checkpointer_path(ck, run->step, path, sizeof path);
    double start = time_now();
    if (ckpt_save_rank0(pg, path, m, &st, err, errlen) != 0) return -1;
    ck->save_seconds += time_now() - start;
    snprintf(ck->last_saved, sizeof ck->last_saved, "%s", path);
    ck->last_saved_step = run->step;
    if (ck->dir && pg_rank(pg) == 0) ckpt_prune(ck->dir, ck->keep);
    return 0;
}

RunStatus train_run(ProcessGroup *pg, const TrainOptions *o, TrainData *data, Ddp *ddp, Checkpointer *ck,
                    RunState *run, TrainLog *log) {
    Model *m = ddp->model;
    bool is_main = pg_rank(pg) == 0;
    SgdConfig opt = train_sgd_config(o);
    int steps_per_epoch = loader_batches_per_epoch(data->train_loader);
    LrSchedule sched = train_schedule(o, steps_per_epoch);
    char err[1024];
    log->last_loss = run->last_loss;  // the final line is right even when nothing is left to train
    log->test_acc = run->test_acc;
    for (int epoch = run->epoch; epoch < o->epochs; epoch++) {
        trainlog_epoch_begin(log, epoch, steps_per_epoch);
        // Lesson 03's ddp_start_epoch, at the position: a resumed epoch goes on with the batch after the last
        // one trained. The global batch k holds the same images for any world size (kit/data.h: rank r takes
        // positions r, r + world, ... of the epoch's shuffle), so this also holds after an elastic resume.
        loader_start_epoch(data->train_loader, epoch, run->batch_in_epoch);
        const Batch *b;
        double wait;
        while ((b = loader_next(data->train_loader, &wait)) != NULL) {
            opt.lr = lr_at(&sched, (int)run->step);  // the schedule sets this step's rate: from the restored step
            Metrics batch = ddp_step(ddp, b, &opt, o->label_smoothing);
            trainlog_step(log, b->index, &batch, wait);
            run->batch_in_epoch = b->index + 1;  // the step is complete (all-reduce and update): the position after it
            run->step++;

            bool signalled, nonfinite;
            ckpt_stop_flags(pg, &batch, &signalled, &nonfinite);
            if (nonfinite) {  // before any save: the last good checkpoint must survive
                progress_end(&log->bar);
                if (is_main)
                    fprintf(stderr, "error: the loss is NaN or Inf at step %lld (epoch %d, batch %d): stopping without "
                            "saving.\n  The last good checkpoint: %s (step %lld)\n  HINT: a lower --lr, or more --warmup-epochs\n",
                            run->step, epoch + 1, b->index + 1, ck->last_saved[0] ? ck->last_saved : "none",
                            ck->last_saved_step);
                return RUN_NONFINITE;
            }
            bool stop = signalled || (o->stop_at > 0 && run->step >= o->stop_at);
            bool due = ck->save_every > 0 && run->step % ck->save_every == 0;
            if ((stop || due) && checkpointer_enabled(ck) &&
                save_now(pg, o, m, ck, run, steps_per_epoch, log->local, err, sizeof err) != 0) {
                progress_end(&log->bar);
                fprintf(stderr, "error: rank %d: checkpoint not saved: %s\n", pg_rank(pg), err);
                return RUN_FAILED;
            }
            if (stop) {
                progress_end(&log->bar);
                ck->stopped_by = signalled ? "SIGTERM or SIGINT" : "--stop-at";
                return RUN_STOPPED;
            }
        }

        char what[64];
        snprintf(what, sizeof what, "parameters after epoch %d", epoch + 1);
        pg_check_identical(pg, m->params, m->n_params, what);
        Metrics train = ddp_global_metrics(pg, log->local);
        train.loss_sum += run->carry.loss_sum;  // the part of the epoch trained before the resume
        train.correct += run->carry.correct;
        train.count += run->carry.count;
        run->carry = (Metrics){0, 0, 0};
        Metrics test = ddp_evaluate(pg, m, data->test_loader);
        trainlog_epoch_end(log, &train, &test, lr_at(&sched, (epoch + 1) * steps_per_epoch - 1));
        run->images += train.count;
        run->last_loss = log->last_loss;
        run->test_acc = log->test_acc;
        run->epoch = epoch + 1;
        run->batch_in_epoch = 0;
        if (checkpointer_enabled(ck) && save_now(pg, o, m, ck, run, steps_per_epoch, (Metrics){0, 0, 0}, err,
                                                 sizeof err) != 0) {
            fprintf(stderr, "error: rank %d: checkpoint not saved: %s\n", pg_rank(pg), err);
            return RUN_FAILED;
        }
    }
    return RUN_DONE;
}

// ---------------------------------------------------------------- resuming

// A checkpoint continues THE SAME run: every option that changes what a step computes must match.
// (The world size need not: the global batch and the data order do not depend on it.)
static int check_resumable(const CkptState *st, const TrainOptions *o, int world, int steps_per_epoch, char *err,
                           size_t errlen) {
    SgdConfig opt = train_sgd_config(o);
    LrSchedule s = train_schedule(o, steps_per_epoch);
#define SAME(cond, opt_name, fmt, saved, now)                                                                      \
    if (!(cond)) {                                                                                                \
        snprintf(err, errlen, "the checkpoint was trained with %s " fmt ", this run asks for " fmt                \
                 ": resume with the same value (another value is another run)", opt_name, saved, now);            \
        return -1;                                                                                                \
    }
    SAME(strcmp(st->dataset, o->dataset) == 0, "--dataset", "%s", st->dataset, o->dataset);
    SAME(st->global_batch == o->batch_size, "--batch-size", "%d", st->global_batch, o->batch_size);
    SAME(st->epochs == o->epochs, "--epochs", "%d", st->epochs, o->epochs);
    SAME(st->seed == o->seed, "--seed", "%llu", (unsigned long long)st->seed, (unsigned long long)o->seed);
    SAME(st->peak_lr == s.peak_lr, "--lr", "%g", (double)st->peak_lr, (double)s.peak_lr);
    SAME(st->momentum == opt.momentum, "--momentum", "%g", (double)st->momentum, (double)opt.momentum);
    SAME(st->weight_decay == opt.weight_decay, "--weight-decay", "%g", (double)st->weight_decay, (double)opt.weight_decay);
    SAME(st->nesterov == (int)opt.nesterov, "--nesterov", "%d", st->nesterov, (int)opt.nesterov);
    SAME(st->warmup_steps == s.warmup_steps, "a warmup of", "%d steps", st->warmup_steps, s.warmup_steps);
#undef SAME
    if (st->steps_per_epoch != steps_per_epoch) {
        snprintf(err, errlen, "the checkpoint has %d steps per epoch, %d ranks here make %d (the tail the sampler "
                 "drops depends on the world size): resume on a world size that divides the training set like the "
                 "original", st->steps_per_epoch, world, steps_per_epoch);
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

static void on_stop_signal(int sig) { g_stop_signal = sig; }

RunStatus run_program_with(ProcessGroup *pg, const TrainOptions *o, const RunHooks *hooks, Model **model_out,
                           long long *resumed_from) {
    RunHooks none = {0};
    if (!hooks) hooks = &none;
    int rank = pg_rank(pg), world = pg_world(pg);
    bool is_main = rank == 0;
    Device dev = pg_device(pg);
    TrainData data;
    int local_batch = ddp_data_open(&data, o, pg);
    ModelConfig cfg;
    model_config(&cfg, o->model, o->width, data.train.c, data.train.h, data.train.w, data.train.classes);
    Model *m = model_create(&cfg, dev, local_batch, o->seed);
    if (hooks->model_built) hooks->model_built(hooks->ctx, pg, m);  // before the broadcast and the buckets see it
    ddp_broadcast_model(pg, m);
    Ddp ddp = {.pg = pg, .model = m, .buckets = ddp_attach_buckets(pg, m, o->bucket_mb)};
    int steps_per_epoch = loader_batches_per_epoch(data.train_loader);
    Checkpointer ck = {.file = o->checkpoint, .dir = o->checkpoint_dir, .keep = o->keep, .save_every = o->save_every,
                       .stop_at = o->stop_at, .last_saved_step = -1};
    if (is_main) {
        train_print_setup(&data, m);
        printf("data: %d rank%s x %d images per step = global batch %d; %d steps per epoch\n", world,
               world == 1 ? "" : "s", local_batch, local_batch * world, steps_per_epoch);
    }

    RunState run;
    memset(&run, 0, sizeof run);
    *resumed_from = -1;
    RunStatus status = RUN_DONE;
    char path[1024], err[1024];
    if (ck.dir && is_main && mkdir(ck.dir, 0755) != 0 && errno != EEXIST)  // rank 0 is the only writer
        fprintf(stderr, "warning: cannot create the checkpoint folder %s: %s\n", ck.dir, strerror(errno));
    if (o->resume && resume_path(o, path, sizeof path, is_main)) {
        CkptState st;
        if (ckpt_load_all(pg, path, m, &st, err, sizeof err) != 0 ||
            check_resumable(&st, o, world, steps_per_epoch, err, sizeof err) != 0) {
            fprintf(stderr, "error: rank %d: cannot resume: %s\n", rank, err);
            status = RUN_FAILED;
        } else {
            run = ckpt_restore(&st);
            *resumed_from = st.step;
            snprintf(ck.last_saved, sizeof ck.last_saved, "%s", path);
            ck.last_saved_step = st.step;
            if (is_main)
                printf("resumed from %s: step %lld (epoch %d, batch %d of %d), saved by %d rank%s, now %d\n", path,
                       st.step, st.epoch + 1, st.batch_in_epoch, st.steps_per_epoch, st.world,
                       st.world == 1 ? "" : "s", world);
        }
    }

    if (o->resume) {  // one rank that cannot resume stops them all (the others would wait for it)
        double failed = status == RUN_FAILED ? 1.0 : 0.0;
        pg_allreduce_sum_double_host(pg, &failed, 1);
        if (failed > 0.0) status = RUN_FAILED;
    }

    TrainLog log;
    trainlog_begin(&log, o, data.train.name, dev, world, is_main);
    if (status == RUN_DONE) {
        struct sigaction sa, old_term, old_int;  // a signal asks for a save at the next step boundary
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_stop_signal;
        sigemptyset(&sa.sa_mask);
        if (checkpointer_enabled(&ck)) {
            sigaction(SIGTERM, &sa, &old_term);
            sigaction(SIGINT, &sa, &old_int);
        }
        status = train_run(pg, o, &data, &ddp, &ck, &run, &log);
        if (checkpointer_enabled(&ck)) {
            // After a stop the checkpoint is saved and the program is on its way out, but a scheduler may send its
            // SIGTERM again (Slurm does while it ends the job step): the handler stays, so that a repeated TERM
            // during the teardown cannot turn a clean stop into a kill (exit 143, which the job script reads as a
            // failure and does not requeue). A second Ctrl-C (SIGINT) still ends the program at once.
            if (status != RUN_STOPPED) sigaction(SIGTERM, &old_term, NULL);
            sigaction(SIGINT, &old_int, NULL);
        }
    }
    if (status == RUN_DONE || status == RUN_STOPPED) {
        char extra[128], from[32] = "none";
        if (*resumed_from >= 0) snprintf(from, sizeof from, "%lld", *resumed_from);
        snprintf(extra, sizeof extra, "ranks=%d backend=%s resumed_from=%s", world, pg_backend_name(pg_backend(pg)),
                 from);
        if (is_main && checkpointer_enabled(&ck))
            printf("checkpoints: %.2f s spent saving; the last: %s (step %lld)\n", ck.save_seconds, ck.last_saved,
                   ck.last_saved_step);
        if (hooks->report) hooks->report(hooks->ctx, &ddp, run.step - (*resumed_from > 0 ? *resumed_from : 0));
        if (status == RUN_DONE) trainlog_final(&log, extra);
    }
    if (status == RUN_STOPPED && is_main) {
        printf("stopped after step %lld by %s; checkpoint %s\n", run.step, ck.stopped_by,
               ck.last_saved[0] ? ck.last_saved : "none (no --checkpoint or --checkpoint-dir)");
        printf("resume with the same command and: --resume %s\n", ck.dir ? "auto" : ck.last_saved);
    }
    fflush(stdout);

    m->on_grads_ready = NULL;
    buckets_free(ddp.buckets);
    if (hooks->model_done) hooks->model_done(hooks->ctx, m);
    if (model_out) *model_out = m;
    else model_free(m);
    train_data_close(&data);
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
