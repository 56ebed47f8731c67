// train.c: lesson 02, the lesson-01 training program with one process driving N replicas (DataParallel).
//
//   ./train --devices 2 --dataset fashion-mnist --epochs 2
//
// Read it top to bottom: options, data, the DataParallel replicas, then the loop of lesson 01 (in the pieces
// lesson 03's loop has), where the training step is now dp_step (dp.c):
//
//   for each epoch:
//       for each global batch (prepared by a background thread while we compute):
//           dp_step: scatter -> replicate -> forward+backward on every replica -> reduce -> update  (TODO 1-4)
//       evaluate the master on the test split
//   print where the time of a step went, and how much of it passed through the master
//
// What you wrote in lesson 01 (the step, the SGD update, the evaluation loop) comes from the kit now:
// train_forward_backward, optim_step and train_evaluate in ../../kit.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit/check.h"
#include "kit/cli.h"
#include "kit/data.h"
#include "kit/device.h"
#include "kit/log.h"
#include "kit/model.h"
#include "kit/optim.h"
#include "kit/trace.h"
#include "kit/train.h"
#include "lesson.h"

#ifndef AUTOGRADER
// ---------------------------------------------------------------- where the time went

// Mean time per step of each phase, and the part that passes through the master alone.
static void print_time_split(const DataParallel *dp) {
    const DpTimes *t = &dp->times;
    if (t->steps == 0) return;
    double ms = 1000.0 / t->steps;
    double step = t->scatter + t->replicate + t->compute + t->reduce + t->update;
    printf("time per step (ms, mean of %ld steps): scatter %.2f | replicate %.2f | compute %.2f (slowest replica "
           "%.2f) | reduce %.2f | update %.2f | total %.2f\n",
           t->steps, t->scatter * ms, t->replicate * ms, t->compute * ms, t->compute_slowest * ms, t->reduce * ms,
           t->update * ms, step * ms);
    // Per step the master sends params + buffers to N-1 replicas and receives N-1 gradient buffers.
    const Model *m = dp->replicas[0];
    double mb = (double)(dp->n - 1) * (2 * m->n_params + m->n_buffers) * sizeof(float) / 1e6;
    printf("master bottleneck: %.2f MB through the master per step; replicate + reduce = %.1f%% of the step, "
           "+ update (master only) = %.1f%%\n",
           mb, 100.0 * (t->replicate + t->reduce) / step, 100.0 * (t->replicate + t->reduce + t->update) / step);
}

// ---------------------------------------------------------------- the training loop
// Lesson 01's loop, in the pieces that lesson 03's loop has (open, an epoch, the report, close), with the
// training step now dp_step.

// One training run: what dp_run_open makes and the loop uses.
typedef struct {
    const TrainOptions *o;
    TrainData data;          // ONE loader makes the global batch of --batch-size images
    DataParallel *dp;        // the replicas; replicas[0], the master, is the model
    int steps_per_epoch;
    SgdConfig opt;           // opt.lr: set before every step from sched
    LrSchedule sched;        // the run's schedule, built once
    TrainLog log;
    long long step;          // optimizer steps done since the start
} DpRun;

// Data, replicas, optimizer and schedule; prints the setup.
static void dp_run_open(DpRun *r, const TrainOptions *o, Device dev) {
    memset(r, 0, sizeof *r);
    r->o = o;

    // Data: the global batch; dp_step cuts it into N chunks.
    train_data_open(&r->data, o, 0, 1, o->batch_size);

    // The replicas and the master's optimizer.
    ModelConfig cfg;
    model_config(&cfg, o->model, o->width, r->data.train.c, r->data.train.h, r->data.train.w, r->data.train.classes);
    DataParallel *dp = r->dp = dp_create(&cfg, dev, o->devices, o->batch_size, o->seed);
    Model *m = dp->replicas[0];  // the master
    r->opt = train_sgd_config(o);
    r->steps_per_epoch = loader_batches_per_epoch(r->data.train_loader);
    r->sched = train_schedule(o, r->steps_per_epoch);  // warmup, then linear decay to 0: the run's one schedule
    train_print_setup(&r->data, m);
    int chunk = o->batch_size / dp->n, bigger = o->batch_size % dp->n;
    printf("data parallel: %d replica(s), global batch %d -> chunks of %d", dp->n, o->batch_size, chunk);
    if (bigger) printf(" (%d of them %d)", bigger, chunk + 1);
    printf("\n");
    for (int i = 0; i < dp->n; i++) {
        if (dev == DEVICE_CUDA) printf("  replica %d%s: GPU %d\n", i, i == 0 ? " (master)" : "", dp->gpu[i]);
        else printf("  replica %d%s: CPU thread, %d OpenMP thread(s)\n", i, i == 0 ? " (master)" : "",
                    dp->threads_per_replica);
    }
    trainlog_begin(&r->log, o, r->data.train.name, dev, 1, true);
    trace_open_process(o->trace);  // --trace FILE: this process's timeline, to dp_run_close (kit/TRACING.md)
}

// One epoch, then its evaluation.
static void dp_run_epoch(DpRun *r, int epoch) {
    Model *m = r->dp->replicas[0];  // the master
    trainlog_epoch_begin(&r->log, epoch, r->steps_per_epoch);
    loader_start_epoch(r->data.train_loader, epoch, 0);  // a new shuffle every epoch
    const Batch *b;
    double wait;
    while ((b = loader_next(r->data.train_loader, &wait)) != NULL) {
        r->opt.lr = lr_at(&r->sched, (int)r->step);  // the schedule sets this step's rate
        double t = trace_begin("step");
        Metrics batch = dp_step(r->dp, b, &r->opt, r->o->label_smoothing);
        trace_endf(t, TRACE_COMPUTE, "step %lld", r->step);
        if (batch.count != b->n)
            die("dp_step processed %ld of the %d images of the batch: finish TODO 1-4 in dp.c", batch.count, b->n);
        trainlog_step(&r->log, b->index, &batch, wait);
        r->step++;
    }

    // The master alone evaluates: its weights are the model, and its BN running statistics are the only ones
    // kept (each replica's were overwritten by the next replicate).
    double t = trace_begin("evaluate");
    Metrics test = train_evaluate(m, r->data.test_loader);
    trace_end(t, TRACE_EVAL, "evaluate");
    trainlog_epoch_end(&r->log, &r->log.local, &test, lr_at(&r->sched, (epoch + 1) * r->steps_per_epoch - 1));
}

// Where the time went, then the final line.
static void dp_run_report(DpRun *r) {
    print_time_split(r->dp);
    char line[32];
    snprintf(line, sizeof line, "devices=%d", r->dp->n);
    trainlog_final(&r->log, line);
}

static void dp_run_close(DpRun *r) {
    trace_close_process(r->o->trace);
    dp_free(r->dp);
    train_data_close(&r->data);
}

// ---------------------------------------------------------------- main

int main(int argc, char **argv) {
    TrainOptions o;
    cli_parse(&o, argc, argv, CLI_DP);  // CLI_DP: this lesson also takes --devices N
    cli_apply_dataset_defaults(&o);
    Device dev;
    device_parse(o.device, &dev, false);

    DpRun r;
    dp_run_open(&r, &o, dev);
    for (int epoch = 0; epoch < o.epochs; epoch++) dp_run_epoch(&r, epoch);
    dp_run_report(&r);
    dp_run_close(&r);
    return 0;
}
#endif  // AUTOGRADER
