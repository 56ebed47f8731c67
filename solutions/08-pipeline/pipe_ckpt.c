// pipe_ckpt.c: lesson 08, a pipeline's checkpoint: ONE file of lesson 04 for the whole model, whatever the cut.
// Given code: the idea of this lesson is the pipeline; the file, its atomic write and the run state are lesson
// 04's (linked from its solution: ckpt_capture, ckpt_save_rank0, ckpt_load_all, ckpt_restore).
//
//   save:    the stages of replica 0 send their slices (parameters, momentum, BN statistics) to the world's
//            rank 0, which holds the whole model's layout and writes it like lesson 04's rank 0
//   resume:  every rank reads the file (lesson 04's TODO 4) and each stage takes its slice back
//
// A file of the whole model, not one per stage: lesson 06 evaluates it on one device, and a run resumes it on
// another cut (--stages) or grid, since a slice is only an offset and a count in the whole layout.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit/check.h"
#include "kit/ckpt.h"
#include "kit/device.h"
#include "kit/train.h"
#include "lesson.h"
#include "solutions/04-checkpoint/lesson.h"

// Point-to-point messages of a save come after every message of the steps and the evaluation was received.
enum { CKPT_TAG = 32700 };

static bool saving(const PipeCkpt *c) { return c->o->checkpoint || c->o->checkpoint_dir; }

// Every rank ends here when the run cannot go on: they all learned it from the same collective.
static void ckpt_fail(const PipeCkpt *c) {
    fflush(stdout);
    pg_finalize(c->world);
    exit(1);
}

// ---------------------------------------------------------------- the slices

// The whole-model offsets and counts of every stage of this rank's pipe, known to every rank of it: (P, 4).
static int pipe_layout(const PipeCkpt *c, double *lay) {
    int P = c->pipe ? pg_world(c->pipe) : c->p->n_stages;
    memset(lay, 0, (size_t)P * 4 * sizeof *lay);
    for (int i = 0; i < c->p->n_stages; i++) {
        const Stage *st = &c->p->stages[i];
        double *l = lay + 4 * (c->stage + i);
        l[0] = (double)st->param_offset, l[1] = (double)st->n_params;
        l[2] = (double)st->buffer_offset, l[3] = (double)st->n_buffers;
    }
    if (c->pipe) pg_allreduce_sum_double_host(c->pipe, lay, 4 * P);  // each stage fills its row, zeros elsewhere
    return P;
}

// n floats of stage `s` (on rank s of the pipe) into host dst of the world's rank 0 (stage 0 of replica 0).
static void recv_slice(const PipeCkpt *c, float *dst, size_t n, int s, float *staging, const char *what) {
    if (n == 0) return;
    pg_recv(c->pipe, staging, n, s, CKPT_TAG, what);
    device_copy_from(c->p->stages[0].device, dst, staging, n * sizeof(float));
}

void pipe_ckpt_gather(const PipeCkpt *c, Model *whole) {
    double lay[4 * PIPE_MAX_STAGES];
    int P = pipe_layout(c, lay);
    if (c->replica != 0) return;  // the copies of a stage are identical: replica 0's are saved
    bool root = pg_rank(c->world) == 0;
    for (int i = 0; i < c->p->n_stages; i++) {  // this rank's own stages
        const Stage *st = &c->p->stages[i];
        if (root) {
            pipe_copy(DEVICE_CPU, whole->params + st->param_offset, st->device, st->params, st->n_params);
            pipe_copy(DEVICE_CPU, whole->velocity + st->param_offset, st->device, st->velocity, st->n_params);
            pipe_copy(DEVICE_CPU, whole->buffers + st->buffer_offset, st->device, st->buffers, st->n_buffers);
        } else {
            if (st->n_params > 0) pg_send(c->pipe, st->params, st->n_params, 0, CKPT_TAG, "checkpoint: parameters");
            if (st->n_params > 0) pg_send(c->pipe, st->velocity, st->n_params, 0, CKPT_TAG, "checkpoint: momentum");
            if (st->n_buffers > 0) pg_send(c->pipe, st->buffers, st->n_buffers, 0, CKPT_TAG, "checkpoint: BN buffers");
        }
    }
    if (!root || !c->pipe) return;
    size_t most = 0;
    for (int s = 1; s < P; s++) most = (size_t)lay[4 * s + 1] > most ? (size_t)lay[4 * s + 1] : most;
    for (int s = 1; s < P; s++) most = (size_t)lay[4 * s + 3] > most ? (size_t)lay[4 * s + 3] : most;
    Device d = c->p->stages[0].device;
    float *staging = device_alloc(d, (most > 0 ? most : 1) * sizeof(float));  // messages arrive on the device
    for (int s = 1; s < P; s++) {  // the same order as the sends: parameters, momentum, buffers
        size_t po = (size_t)lay[4 * s], pn = (size_t)lay[4 * s + 1], bo = (size_t)lay[4 * s + 2];
        size_t bn = (size_t)lay[4 * s + 3];
        recv_slice(c, whole->params + po, pn, s, staging, "checkpoint: parameters");
        recv_slice(c, whole->velocity + po, pn, s, staging, "checkpoint: momentum");
        recv_slice(c, whole->buffers + bo, bn, s, staging, "checkpoint: BN buffers");
    }
    device_free(d, staging);
}

void pipe_ckpt_scatter(const PipeCkpt *c, const Model *whole) {
    for (int i = 0; i < c->p->n_stages; i++) {
        Stage *st = &c->p->stages[i];
        pipe_copy(st->device, st->params, DEVICE_CPU, whole->params + st->param_offset, st->n_params);
        pipe_copy(st->device, st->velocity, DEVICE_CPU, whole->velocity + st->param_offset, st->n_params);
        pipe_copy(st->device, st->buffers, DEVICE_CPU, whole->buffers + st->buffer_offset, st->n_buffers);
    }
}

// ---------------------------------------------------------------- saving

void pipe_ckpt_epoch_end(PipeCkpt *c, long long images, const TrainLog *log) {
    c->epoch++, c->step += c->steps_per_epoch, c->images = images;
    c->last_loss = log->last_loss, c->test_acc = log->test_acc;
    if (!saving(c)) return;
    bool root = pg_rank(c->world) == 0;
    Model *whole = root ? model_create(&c->table->cfg, DEVICE_CPU, 1, c->o->seed) : NULL;
    pipe_ckpt_gather(c, whole);
    // Lesson 04's state of the run at an epoch's end (nothing of the next epoch trained yet), and its writer.
    RunState run = {.epoch = c->epoch, .step = c->step, .images = c->images, .last_loss = c->last_loss,
                    .test_acc = c->test_acc};
    CkptState st = ckpt_capture(c->world, c->o, c->table, &run, &c->sched, c->steps_per_epoch, (Metrics){0});
    char path[1024], err[1024];
    if (c->o->checkpoint) snprintf(path, sizeof path, "%s", c->o->checkpoint);
    else ckpt_path_for_step(path, sizeof path, c->o->checkpoint_dir, c->step);
    int rc = ckpt_save_rank0(c->world, path, root ? whole : c->table, &st, err, sizeof err);
    model_free(whole);
    if (rc != 0) {
        fprintf(stderr, "error: rank %d: checkpoint not saved: %s\n", pg_rank(c->world), err);
        ckpt_fail(c);
    }
    snprintf(c->last_saved, sizeof c->last_saved, "%s", path);
    if (c->o->checkpoint_dir && root) ckpt_prune(c->o->checkpoint_dir, c->o->keep);
    if (root) printf("checkpoint: %s (step %lld, the whole model: %d stage(s) gathered on rank 0)\n", path,
                     c->step, c->pipe ? pg_world(c->pipe) : c->p->n_stages);
}

// ---------------------------------------------------------------- before the first step

// Rank 0's verdict on the options and the outputs, shared: every rank goes on, or every rank stops. No output
// replaces another run's work (the kit's check, kit/ckpt.h: --overwrite for a file, --resume to continue).
static void check_options(PipeCkpt *c) {
    const TrainOptions *o = c->o;
    char err[2400] = "";
    if (pg_rank(c->world) == 0) {
        CkptState id;
        train_identity(&id, &c->table->cfg, o, &c->sched);
        CkptOwner me = {.id = &id, .resuming = o->resume != NULL, .overwrite = o->overwrite, .can_resume = true};
        char newest[1024], why[1024];
        if (o->save_every > 0 || o->stop_at > 0)
            snprintf(err, sizeof err, "lesson 08 saves at the end of every epoch only: --save-every and --stop-at "
                     "are lesson 04's (a pipeline in the middle of a step holds micro-batches on every stage)");
        else if (o->resume && !saving(c) && strcmp(o->resume, "auto") == 0)
            snprintf(err, sizeof err, "--resume auto needs --checkpoint-dir (the folder to look in)");
        else if (o->checkpoint &&
                 ckpt_check_file_owner("--checkpoint", o->checkpoint, CKPT_OUT_CHECKPOINT, &me, err, sizeof err)) {
        } else if (o->checkpoint_dir &&
                   ckpt_check_dir_owner("--checkpoint-dir", o->checkpoint_dir,
                                        ckpt_find_latest(o->checkpoint_dir, newest, sizeof newest, why, sizeof why) == 0
                                            ? newest : NULL, "checkpoints", &me, err, sizeof err)) {
        } else if (o->metrics) {
            ckpt_check_file_owner("--metrics", o->metrics, CKPT_OUT_REPORT, &me, err, sizeof err);
        }
        if (err[0]) fprintf(stderr, "error: %s\n", err);
    }
    double bad = err[0] ? 1.0 : 0.0;
    pg_allreduce_sum_double_host(c->world, &bad, 1);
    if (bad != 0.0) ckpt_fail(c);
}

// The checkpoint continues THIS run: what decides a step must be what this run would have saved. Compares the
// file's state with lesson 04's capture of this run.
static int check_same_run(const CkptState *got, const CkptState *want, char *err, size_t errlen) {
    char name[CKPT_ESCAPED_LEN];
    if (strcmp(got->dataset, want->dataset) != 0)
        snprintf(err, errlen, "the checkpoint was trained on --dataset %s, this run asks for %s",
                 ckpt_escape(got->dataset, name, sizeof name), want->dataset);
    else if (got->global_batch != want->global_batch || got->steps_per_epoch != want->steps_per_epoch)
        snprintf(err, errlen, "the checkpoint has --batch-size %d and %d steps per epoch, this run %d and %d",
                 got->global_batch, got->steps_per_epoch, want->global_batch, want->steps_per_epoch);
    else if (got->epochs != want->epochs || got->seed != want->seed || got->peak_lr != want->peak_lr ||
             got->final_lr != want->final_lr || got->warmup_steps != want->warmup_steps ||
             got->total_steps != want->total_steps || got->decay != want->decay || got->momentum != want->momentum ||
             got->weight_decay != want->weight_decay || got->nesterov != want->nesterov)
        snprintf(err, errlen, "the checkpoint was trained with other --epochs, --seed, --lr, schedule or optimizer "
                 "options (saved: %d epochs, seed %llu, lr %g; asked: %d, %llu, %g)", got->epochs,
                 (unsigned long long)got->seed, (double)got->peak_lr, want->epochs,
                 (unsigned long long)want->seed, (double)want->peak_lr);
    else if (got->batch_in_epoch == got->steps_per_epoch)  // lesson 04's save after a last batch: not an end
        snprintf(err, errlen, "the checkpoint was saved after the last batch of epoch %d (batch %d of %d), before "
                 "that epoch's evaluation: lesson 08 resumes from a save at the end of an epoch only (its "
                 "evaluation done)", got->epoch + 1, got->batch_in_epoch, got->steps_per_epoch);
    else if (got->batch_in_epoch != 0)
        snprintf(err, errlen, "the checkpoint was saved in the middle of epoch %d (after batch %d of %d): lesson 08 "
                 "resumes at the end of an epoch only", got->epoch + 1, got->batch_in_epoch, got->steps_per_epoch);
    else return 0;
    return -1;
}

// --resume: every rank loads the whole model (lesson 04's TODO 4), its stages take their slices.
static void resume(PipeCkpt *c, TrainLog *log) {
    char path[1024], err[1024] = "";
    if (strcmp(c->o->resume, "auto") == 0) {
        if (ckpt_find_latest(c->o->checkpoint_dir, path, sizeof path, err, sizeof err) != 0) {
            if (pg_rank(c->world) == 0) printf("resume: nothing to resume (%s): starting from step 0\n", err);
            return;  // every rank looked in the same folder
        }
    } else {
        snprintf(path, sizeof path, "%s", c->o->resume);
    }
    RunState zero = {0};  // lesson 04's capture of this run: what the file must agree with (a collective)
    CkptState want = ckpt_capture(c->world, c->o, c->table, &zero, &c->sched, c->steps_per_epoch, (Metrics){0});
    Model *whole = model_create(&c->table->cfg, DEVICE_CPU, 1, c->o->seed);
    CkptState st;
    double bad = 0.0;
    if (ckpt_load_all(c->world, path, whole, &st, err, sizeof err) != 0 || check_same_run(&st, &want, err, sizeof err))
        bad = 1.0;
    pg_allreduce_sum_double_host(c->world, &bad, 1);  // check_same_run is per rank: agree before going on
    if (bad != 0.0) {
        fprintf(stderr, "error: rank %d: cannot resume from %s: %s\n", pg_rank(c->world), path,
                err[0] ? err : "another rank could not (see its error)");
        model_free(whole);
        ckpt_fail(c);
    }
    pipe_ckpt_scatter(c, whole);
    model_free(whole);
    RunState run = ckpt_restore(&st);  // lesson 04's way back (batch_in_epoch is 0: checked)
    c->epoch = run.epoch, c->step = run.step, c->images = run.images;
    c->last_loss = log->last_loss = run.last_loss;
    c->test_acc = log->test_acc = run.test_acc;
    snprintf(c->last_saved, sizeof c->last_saved, "%s", path);
    if (pg_rank(c->world) == 0)
        printf("resumed from %s: step %lld, epoch %d of %d next, saved by %d rank(s), now %d\n", path, st.step,
               c->epoch + 1, st.epochs, st.world, pg_world(c->world));
}

void pipe_ckpt_begin(PipeCkpt *c, ProcessGroup *world, ProcessGroup *pipe, int stage, int replica, Pipe *p,
                     const TrainOptions *o, const Model *table, const LrSchedule *sched, int steps_per_epoch,
                     TrainLog *log) {
    *c = (PipeCkpt){.world = world, .pipe = pipe, .stage = stage, .replica = replica, .p = p, .o = o,
                    .table = table, .sched = *sched, .steps_per_epoch = steps_per_epoch};
    check_options(c);
    if (o->resume) resume(c, log);
}
