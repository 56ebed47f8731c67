// kit/train.h: the pieces of a training program that every lesson after 01 reuses.
//
// Lesson 01 has you write the training step and the evaluation loop; from lesson 02 on they come from
// here, split at the point where distributed training inserts its communication:
//
//   Metrics r = train_forward_backward(m, batch, ...)   local gradients in m->grads
//   <lesson 02: reduce onto the master / lesson 03: all-reduce across ranks>
//   optim_step(m, &opt)                                 opt.lr: set by the loop from the schedule
//
// Every lesson's step has the same shape, so the training loops differ only where the concept does:
//
//   Metrics <lesson>_step(<model or its wrapper> *, const Batch *b, const SgdConfig *opt, float label_smoothing)
//
// (train_step in lesson 01, dp_step in 02, ddp_step in 03): it returns the batch's sums (before the update)
// and updates with opt->lr, the one learning rate there is.
#ifndef KIT_TRAIN_H
#define KIT_TRAIN_H

#include "kit/ckpt.h"
#include "kit/cli.h"
#include "kit/data.h"
#include "kit/log.h"
#include "kit/model.h"
#include "kit/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

// Sums, so that they can be added over batches, replicas and ranks before dividing.
typedef struct {
    double loss_sum;  // sum of per-sample losses
    long correct;     // arg-max predictions equal to the label
    long count;       // samples
} Metrics;

// Puts the batch on the device (on CUDA, a batch of a loader is already there from the second one on: the
// loader copied it while the previous step computed, data.h batch_on_device), runs forward in training mode, computes per-sample losses and
// predictions, sets dloss/dlogits = grad_scale * (softmax - target), zeroes m->grads and runs backward.
// grad_scale is 1/n for the mean over this batch; a data-parallel program passes 1/(global batch).
// Returns the batch's loss sum, correct and count (measured before any update).
Metrics train_forward_backward(Model *m, const Batch *b, float label_smoothing, float grad_scale);

// Every batch of L in eval mode (BN running statistics); sums over exactly what L yields.
Metrics train_evaluate(Model *m, Loader *L);

// A dataset's two splits with their samplers and loaders, for one rank of `world`.
typedef struct {
    Dataset train, test;
    Sampler train_sampler, test_sampler;
    Loader *train_loader, *test_loader;
} TrainData;

// Loads o->dataset from o->data_dir (a clear error and exit 1 when it cannot), shards the training set
// (shuffled each epoch, the tail dropped so every rank takes the same number of steps; with
// o->keep_last_batch the shards padded to equal length instead and the short last batch trained on, as
// PyTorch's DistributedSampler and DataLoader with drop_last=False) and the test set
// (every sample exactly once over all ranks), and makes loaders of local_batch images. The training
// split gets the dataset's augmentation (DatasetInfo.train_augment: crop + flip for CIFAR).
void train_data_open(TrainData *td, const TrainOptions *o, int rank, int world, int local_batch);
void train_data_close(TrainData *td);

// The options' optimizer and schedule: SGD with --momentum/--nesterov/--weight-decay; --lr is the schedule's
// peak, reached after --warmup-epochs of linear warmup, then linear decay to 0 at the end of --epochs. The
// returned SgdConfig.lr is 0 (no step moves the weights) until the loop sets it from the schedule.
SgdConfig train_sgd_config(const TrainOptions *o);
LrSchedule train_schedule(const TrainOptions *o, int steps_per_epoch);
// This run's identity as a checkpoint header records it (kit/ckpt.h: what ckpt_same_run compares, every other
// field 0): cfg is the model's, sched the schedule the loop steps with (its peak after any scaling rule).
void train_identity(CkptState *id, const ModelConfig *cfg, const TrainOptions *o, const LrSchedule *sched);
// Prints the dataset and the model's layer table.
void train_print_setup(const TrainData *td, const Model *m);

// ---------------------------------------------------------------- what a training run prints
// The same report in every lesson: a progress bar per epoch, one line per epoch (also appended to
// --metrics as CSV), where the time went, and the `final:` line the README and the tests read.
//
//   TrainLog log;  trainlog_begin(&log, &o, dataset_name, dev, world, rank == 0);
//   for each epoch:  trainlog_epoch_begin(&log, epoch, steps);
//                    for each batch: trainlog_step(&log, b->index, &batch_metrics, wait);
//                    trainlog_epoch_end(&log, &train_metrics, &test_metrics, lr);
//   trainlog_final(&log, "devices=2");
// world > 1 (DDP): images/s count every rank's images (each rank trains on its shard at the same pace).
typedef struct {
    const TrainOptions *o;
    const char *dataset;
    Device device;
    int world;                 // processes training together (1 but for DDP)
    bool enabled;              // only rank 0 prints
    double run_start, data_wait, train_seconds;
    long images;               // images trained on, over all epochs (this process's count)
    double last_loss, test_acc;
    // The epoch in progress.
    int epoch, steps;
    double epoch_start;
    Metrics local;             // this process's running sums, for the progress bar
    Progress bar;
    char label[32];            // "epoch 3/10", shown by the progress bar
} TrainLog;

void trainlog_begin(TrainLog *log, const TrainOptions *o, const char *dataset, Device dev, int world, bool enabled);
void trainlog_epoch_begin(TrainLog *log, int epoch, int steps);
// After each step: the batch's metrics (as seen by this process) and the seconds it waited for data.
void trainlog_step(TrainLog *log, int batch_index, const Metrics *batch, double wait_seconds);
// train: the epoch's training metrics (summed over ranks, when there are several); test: the evaluation.
// Prints the epoch line and appends the CSV row (epoch, losses, accuracies, images/s, lr).
void trainlog_epoch_end(TrainLog *log, const Metrics *train, const Metrics *test, float lr);
// An epoch cut short by a stop on request (a signal, --stop-at): its steps count in the final line's time and
// images, and the final line's train_loss is this process's mean over them (there is no epoch line).
void trainlog_epoch_cut(TrainLog *log);
// Prints the time split and `final: dataset=... device=... epochs=... train_loss=... test_acc=...
// images_per_s=... seconds=...`, followed by `extra` ("devices=2"; NULL for nothing).
void trainlog_final(TrainLog *log, const char *extra);

#ifdef __cplusplus
}
#endif

#endif // KIT_TRAIN_H
