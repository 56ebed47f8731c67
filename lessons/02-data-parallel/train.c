// train.c: lesson 02, the lesson-01 training program with one process driving N replicas (DataParallel).
//
//   ./train --devices 2 --dataset fashion-mnist --epochs 2
//
// Read it top to bottom: options, data, the DataParallel replicas, then the loop of lesson 01, where the
// training step is now dp_step (dp.c):
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

#include "check.h"
#include "cli.h"
#include "data.h"
#include "device.h"
#include "lesson.h"
#include "log.h"
#include "model.h"
#include "optim.h"
#include "train.h"

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

// ---------------------------------------------------------------- main

int main(int argc, char **argv) {
    TrainOptions o;
    cli_parse(&o, argc, argv, CLI_DP);  // CLI_DP: this lesson also takes --devices N
    cli_apply_dataset_defaults(&o);
    Device dev;
    device_parse(o.device, &dev, false);

    // Data: ONE loader makes the global batch of --batch-size images; dp_step cuts it into N chunks.
    TrainData data;
    train_data_open(&data, &o, 0, 1, o.batch_size);

    // The replicas and the master's optimizer.
    ModelConfig cfg;
    model_config(&cfg, o.model, o.width, data.train.c, data.train.h, data.train.w, data.train.classes);
    DataParallel *dp = dp_create(&cfg, dev, o.devices, o.batch_size, o.seed);
    Model *master = dp->replicas[0];
    SgdConfig opt = {.lr = o.lr, .momentum = o.momentum, .weight_decay = o.weight_decay, .nesterov = o.nesterov};
    int steps_per_epoch = loader_batches_per_epoch(data.train_loader);
    LrSchedule sched = {.peak_lr = o.lr, .warmup_steps = o.warmup_epochs * steps_per_epoch,
                        .total_steps = o.epochs * steps_per_epoch, .final_lr = 0.0f, .decay = DECAY_LINEAR};
    printf("dataset: %s (%d train, %d test, %dx%dx%d, %d classes)\n", data.train.name, data.train.n, data.test.n,
           data.train.c, data.train.h, data.train.w, data.train.classes);
    model_print(master, stdout);
    int chunk = o.batch_size / dp->n, bigger = o.batch_size % dp->n;
    printf("data parallel: %d replica(s), global batch %d -> chunks of %d", dp->n, o.batch_size, chunk);
    if (bigger) printf(" (%d of them %d)", bigger, chunk + 1);
    printf("\n");
    for (int i = 0; i < dp->n; i++) {
        if (dev == DEVICE_CUDA) printf("  replica %d%s: GPU %d\n", i, i == 0 ? " (master)" : "", dp->gpu[i]);
        else printf("  replica %d%s: CPU thread, %d OpenMP thread(s)\n", i, i == 0 ? " (master)" : "",
                    dp->threads_per_replica);
    }

    double run_start = time_now(), data_wait = 0.0, train_seconds = 0.0;
    long images_seen = 0;
    double last_loss = 0.0, test_acc = 0.0;
    for (int epoch = 0; epoch < o.epochs; epoch++) {
        char label[32];
        snprintf(label, sizeof label, "epoch %d/%d", epoch + 1, o.epochs);
        Progress bar;
        progress_begin(&bar, label, steps_per_epoch, true);
        loader_start_epoch(data.train_loader, epoch, 0);  // a new shuffle every epoch
        double epoch_start = time_now(), loss_sum = 0.0;
        long correct = 0, seen = 0;
        const Batch *b;
        double wait;
        while ((b = loader_next(data.train_loader, &wait)) != NULL) {
            int step = epoch * steps_per_epoch + b->index;
            Metrics r = dp_step(dp, b, &opt, lr_at(&sched, step), o.label_smoothing);
            if (r.count != b->n)
                die("dp_step processed %ld of the %d images of the batch: finish TODO 1-4 in dp.c", r.count, b->n);
            data_wait += wait;
            loss_sum += r.loss_sum;
            correct += r.correct;
            seen += r.count;
            progress_update(&bar, b->index + 1, loss_sum / seen, (double)correct / seen,
                            seen / (time_now() - epoch_start));
        }
        progress_end(&bar);
        double epoch_seconds = time_now() - epoch_start;
        train_seconds += epoch_seconds;
        images_seen += seen;
        last_loss = loss_sum / seen;

        // The master alone evaluates: its weights are the model, and its BN running statistics are the
        // only ones kept (each replica's were overwritten by the next replicate).
        Metrics ev = train_evaluate(master, data.test_loader);
        test_acc = ev.count ? (double)ev.correct / ev.count : 0.0;
        double test_loss = ev.count ? ev.loss_sum / ev.count : 0.0;
        printf("epoch %d: train_loss %.4f train_acc %.2f%% test_loss %.4f test_acc %.2f%% (%.1f s, %.0f img/s)\n",
               epoch + 1, last_loss, 100.0 * correct / seen, test_loss, 100.0 * test_acc, epoch_seconds,
               seen / epoch_seconds);
        if (o.metrics) {
            double row[] = {epoch + 1, last_loss, (double)correct / seen, test_loss, test_acc, seen / epoch_seconds,
                            lr_at(&sched, (epoch + 1) * steps_per_epoch - 1), dp->n};
            metrics_append(o.metrics, "epoch,train_loss,train_acc,test_loss,test_acc,images_per_s,lr,devices", row,
                           8);
        }
    }
    double total = time_now() - run_start;
    printf("time: %.1f s training, of which %.1f s (%.0f%%) waiting for data and %.1f s computing\n", train_seconds,
           data_wait, 100.0 * data_wait / train_seconds, train_seconds - data_wait);
    print_time_split(dp);
    printf("final: dataset=%s device=%s epochs=%d train_loss=%.4f test_acc=%.4f images_per_s=%.0f seconds=%.1f "
           "devices=%d\n",
           data.train.name, device_name(dev), o.epochs, last_loss, test_acc, images_seen / train_seconds, total,
           dp->n);

    dp_free(dp);
    train_data_close(&data);
    return 0;
}
#endif  // AUTOGRADER
