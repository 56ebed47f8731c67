// kit/train.h: the pieces of a training program that every lesson after 01 reuses.
//
// Lesson 01 has you write the training step and the evaluation loop; from lesson 02 on they come from
// here, split at the point where distributed training inserts its communication:
//
//   train_forward_backward(m, batch, ...)   local gradients in m->grads
//   <lesson 02: reduce onto the master / lesson 03: all-reduce across ranks>
//   optim_step(m, &opt, lr)
#ifndef KIT_TRAIN_H
#define KIT_TRAIN_H

#include "cli.h"
#include "data.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

// Sums, so that they can be added over batches, replicas and ranks before dividing.
typedef struct {
    double loss_sum;  // sum of per-sample losses
    long correct;     // arg-max predictions equal to the label
    long count;       // samples
} Metrics;

// Copies the batch to the device, runs forward in training mode, computes per-sample losses and
// predictions, sets dloss/dlogits = grad_scale * (softmax - target), zeroes m->grads and runs backward.
// grad_scale is 1/n for the mean over this batch; a data-parallel program passes 1/(global batch).
// Adds the batch's loss, correct and count (measured before any update) to *acc.
void train_forward_backward(Model *m, const Batch *b, float label_smoothing, float grad_scale, Metrics *acc);

// Every batch of L in eval mode (BN running statistics); sums over exactly what L yields.
Metrics train_evaluate(Model *m, Loader *L);

// A dataset's two splits with their samplers and loaders, for one rank of `world`.
typedef struct {
    Dataset train, test;
    Sampler train_sampler, test_sampler;
    Loader *train_loader, *test_loader;
} TrainData;

// Loads o->dataset from o->data_dir (a clear error and exit 1 when it cannot), shards the training set
// (shuffled each epoch, the tail dropped so every rank takes the same number of steps) and the test set
// (every sample exactly once over all ranks), and makes loaders of local_batch images. Augmentation
// (crop + flip) for CIFAR only.
void train_data_open(TrainData *td, const TrainOptions *o, int rank, int world, int local_batch);
void train_data_close(TrainData *td);

#ifdef __cplusplus
}
#endif

#endif // KIT_TRAIN_H
