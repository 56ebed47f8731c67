// train.c: lesson 01, a complete image-classifier training program on one device.
//
//   ./train --dataset fashion-mnist --epochs 5
//
// Read it top to bottom: options, data, model, then the loop that the whole workshop builds on:
//
//   for each epoch:
//       for each batch (prepared by a background thread while we compute):
//           train_step: copy to the device -> forward -> loss -> backward -> SGD update   (TODO 3, 1, 2)
//       evaluate on the test split                                                       (TODO 4)
//
// Everything you write is marked TODO; the kit (../../kit) supplies the layers, the data and the logging.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit/check.h"
#include "kit/cli.h"
#include "kit/data.h"
#include "kit/device.h"
#include "kit/log.h"
#include "kit/model.h"
#include "kit/ops.h"
#include "kit/optim.h"
#include "kit/trace.h"
#include "kit/train.h"
#include "lesson.h"

// ---------------------------------------------------------------- the training step (TODO 3)

// TODO 3: one training step on `batch` (host memory: batch->x is (n, C, H, W), batch->y is (n)).
//   a. copy the images and the labels to the model's device buffers (m->input, m->labels)
//   b. forward in training mode -> logits (n, classes)
//   c. per-sample losses into m->loss, arg-max predictions into m->pred
//   d. dloss/dlogits into m->dlogits. Backward ops ADD into gradients (README section 2): what must be
//      zero before this? And the loss is the MEAN over the batch: what does that make the scale?
//   e. the parameter gradients, by backward through the model (from zero, for the same reason)
//   f. the update at opt->lr, with YOUR lesson_sgd_update doing the arithmetic
//   g. return the batch's SUMS: loss_sum (the per-sample losses added up), correct (predictions equal to
//      the label) and count (n), from this step's forward, read back to the host. Sums, not a mean: the
//      loop adds them over batches (and from lesson 02 on over replicas and ranks) and divides last.
//   n is batch->n: the last batch of an epoch can be shorter than the batch size the model was made for.
// PyTorch: x, y = x.to(dev), y.to(dev); out = model(x); loss = F.cross_entropy(out, y)
//          opt.zero_grad(); loss.backward(); opt.step()
Metrics train_step(Model *m, const Batch *batch, const SgdConfig *opt, float label_smoothing) {
    Metrics r = {0, 0, 0};
    return r;
}

// ---------------------------------------------------------------- evaluation (TODO 4)

// TODO 4: evaluate the model on every batch of `loader` (the test split, no augmentation): the sums of the
//   per-sample losses (plain cross-entropy, no smoothing), of the correct predictions and of the images.
//   - the loader must be started before it yields batches (the test split is not shuffled: any epoch)
//   - forward in EVAL mode: batch norm uses its running statistics and leaves them alone
//   - count every sample exactly once: the last batch may be shorter than the others
// PyTorch: model.eval(); with torch.no_grad(): for x, y in loader: ...
Metrics evaluate(Model *m, Loader *loader) {
    Metrics r = {0.0, 0, 0};
    return r;
}

#ifndef AUTOGRADER
// ---------------------------------------------------------------- main

int main(int argc, char **argv) {
    TrainOptions o;
    cli_parse(&o, argc, argv, CLI_BASE);  // the options are shared by every lesson: kit/cli.c
    cli_apply_dataset_defaults(&o);
    Device dev;
    device_parse(o.device, &dev, false);

    // Data: the training split is shuffled every epoch (and augmented for CIFAR); the test split is not.
    // One process, so this is rank 0 of a world of 1 (lesson 03 changes exactly that).
    TrainData data;
    train_data_open(&data, &o, 0, 1, o.batch_size);

    // Model and optimizer.
    ModelConfig cfg;
    model_config(&cfg, o.model, o.width, data.train.c, data.train.h, data.train.w, data.train.classes);
    Model *m = model_create(&cfg, dev, o.batch_size, o.seed);
    SgdConfig opt = train_sgd_config(&o);
    int steps_per_epoch = loader_batches_per_epoch(data.train_loader);
    LrSchedule sched = train_schedule(&o, steps_per_epoch);  // warmup, then linear decay to 0
    train_print_setup(&data, m);

    TrainLog log;  // the progress bar, the per-epoch lines and the final line: kit/train.c
    trainlog_begin(&log, &o, data.train.name, dev, 1, true);
    trace_open_process(o.trace);  // --trace FILE: the run's timeline, the time split as a picture (kit/TRACING.md)
    for (int epoch = 0; epoch < o.epochs; epoch++) {
        trainlog_epoch_begin(&log, epoch, steps_per_epoch);
        loader_start_epoch(data.train_loader, epoch, 0);  // a new shuffle every epoch
        const Batch *b;
        double wait;
        while ((b = loader_next(data.train_loader, &wait)) != NULL) {  // a "data wait" span on the timeline
            opt.lr = lr_at(&sched, epoch * steps_per_epoch + b->index);  // the schedule sets this step's rate
            double t = trace_begin("step");  // trace_*: nothing at all without --trace
            Metrics r = train_step(m, b, &opt, o.label_smoothing);
            trace_endf(t, TRACE_COMPUTE, "step %d", epoch * steps_per_epoch + b->index);
            trainlog_step(&log, b->index, &r, wait);
        }
        double t = trace_begin("evaluate");
        Metrics test = evaluate(m, data.test_loader);
        trace_end(t, TRACE_EVAL, "evaluate");
        trainlog_epoch_end(&log, &log.local, &test, opt.lr);
    }
    trainlog_final(&log, NULL);
    trace_close_process(o.trace);

    model_free(m);
    train_data_close(&data);
    return 0;
}
#endif  // AUTOGRADER
