// lesson.h: the functions you write in lesson 03, shared by train.c and the autograder.
//
// One process per rank, each with a full replica of the model. The kit supplies the process group
// (kit/dist.h), the forward+backward of one batch and the evaluation loop (kit/train.h, what you wrote in
// lesson 01), the sampler and the loader (kit/data.h). You write what makes N processes train as ONE.
#ifndef LESSON03_H
#define LESSON03_H

#include "kit/buckets.h"
#include "kit/cli.h"
#include "kit/data.h"
#include "kit/dist.h"
#include "kit/model.h"
#include "kit/optim.h"
#include "kit/train.h"

#ifdef __cplusplus
extern "C" {
#endif

// The state of data-parallel training on one rank.
typedef struct {
    ProcessGroup *pg;
    Model *model;            // this rank's replica
    GradBuckets *buckets;    // stretch goal: NULL = one flat all-reduce after backward (--bucket-mb 0)
    double compute_seconds;  // forward + backward (+ the all-reduces that overlap it, when bucketed)
    double comm_seconds;     // waiting for the gradient all-reduce after backward: EXPOSED communication
} Ddp;

// TODO 1: the GPU this rank drives: its LOCAL rank (rank among the processes of its node) modulo the
// GPUs of the node; -1 when the node has no GPU (gpus <= 0).
int ddp_gpu_for_rank(int rank, int local_rank, int gpus);

// TODO 2: the process group: MPI start-up, rank/world, the backend (--backend), the timeout (--timeout).
ProcessGroup *ddp_setup(int *argc, char ***argv, const TrainOptions *o, Device dev);

// TODO 3a: this rank's shard of the data, in batches of (global batch / world). Returns the local batch.
int ddp_data_open(TrainData *td, const TrainOptions *o, const ProcessGroup *pg);
// TODO 3b: starts a training epoch: a new shuffle, the same on every rank, different every epoch.
void ddp_start_epoch(TrainData *td, int epoch);

// TODO 4: makes every replica equal to rank 0's: parameters AND buffers (BN running statistics).
void ddp_broadcast_model(ProcessGroup *pg, Model *m);

// TODO 5: one step: local forward+backward, gradients averaged over the ranks, SGD update with opt->lr.
// Returns this rank's loss/correct/count (before the update). The step of lessons 01 and 02: same arguments,
// with the model replaced by this rank's DDP wrapper.
Metrics ddp_step(Ddp *ddp, const Batch *b, const SgdConfig *opt, float label_smoothing);

// TODO 6: sums of every rank's metrics, the same on every rank.
Metrics ddp_global_metrics(ProcessGroup *pg, Metrics local);
// The test split, every sample counted once over all ranks (uses TODO 6).
Metrics ddp_evaluate(ProcessGroup *pg, Model *m, Loader *test_loader);

// TODO 7 (stretch): gradient buckets of bucket_mb MB whose all-reduce starts during backward (the model
// calls m->on_grads_ready as each layer's gradients are final). NULL when bucket_mb is 0: flat all-reduce.
GradBuckets *ddp_attach_buckets(ProcessGroup *pg, Model *m, double bucket_mb);

// Given (train.c, with TODO 6's is_main): the training on a started process group: data, replica, epochs,
// report. Returns the model (the caller frees it). Lesson 07 trains through it.
Model *ddp_train(ProcessGroup *pg, const TrainOptions *o);

#ifdef __cplusplus
}
#endif

#endif // LESSON03_H
