// lesson.h: DataParallel, the structure and the functions of lesson 02, shared by dp.c, train.c and the autograder.
//
// One process drives N replicas of the model. Replica 0 is the MASTER: it holds the only optimizer state
// (velocity) and the only batch-norm running statistics that are kept. Every step goes through it:
//
//   scatter   the global batch -> N contiguous chunks, chunk i for replica i           (TODO 1)
//   replicate master params + BN buffers -> every other replica                        (TODO 2)
//   compute   forward + backward on every replica at once, one thread each             (given)
//   reduce    every replica's gradients -> summed onto the master                      (TODO 3)
//   update    SGD on the master only; the next step's replicate sends the new weights  (TODO 4: dp_step)
#ifndef LESSON02_H
#define LESSON02_H

#include <stdbool.h>
#include <stdint.h>

#include "kit/data.h"
#include "kit/model.h"
#include "kit/optim.h"
#include "kit/train.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DP_MAX_REPLICAS 64  // --devices accepts 1..64

// Seconds spent in each phase, added up over the steps since dp_times_reset.
typedef struct {
    double scatter, replicate, compute, reduce, update;  // wall time of each phase
    double compute_slowest;  // the slowest replica's own forward+backward, step by step (<= compute: the
                             // rest of `compute` is handing the work to the threads and waiting for them)
    long steps;
} DpTimes;

typedef struct DpPool DpPool;  // the worker threads (dp.c)

typedef struct {
    int n;                                // replicas
    Device device;                        // DEVICE_CPU or DEVICE_CUDA for all of them
    Model *replicas[DP_MAX_REPLICAS];     // replicas[0] is the master
    int gpu[DP_MAX_REPLICAS];             // CUDA: the GPU of replica i (round-robin); CPU: 0
    int threads_per_replica;              // CPU: OpenMP threads inside each replica's ops
    Batch chunks[DP_MAX_REPLICAS];        // the scatter's output: replica i's part of the global batch
    Metrics results[DP_MAX_REPLICAS];     // loss/correct/count of replica i's last forward
    double compute_seconds[DP_MAX_REPLICAS];  // how long replica i's last forward+backward took
    float *grad_stage;                    // (n_params) on the master's GPU: a gradient fetched from another GPU
    DpPool *pool;
    DpTimes times;
} DataParallel;

// Creates n replicas of the model `cfg` on device d, one worker thread each (CUDA: replica i on GPU
// i mod device_gpu_count(), so several replicas may share one GPU). Each replica takes chunks of up to
// ceil(global_batch / n) images; the master also evaluates, alone, on batches of up to global_batch.
// Every replica is initialised from `seed`; replicate makes them equal to the master anyway.
DataParallel *dp_create(const ModelConfig *cfg, Device d, int n, int global_batch, uint64_t seed);
void dp_free(DataParallel *dp);

// Given: forward + backward of chunks[i] on replica i, every replica at the same time (one thread each),
// loss gradient scaled by grad_scale. Fills results[i] and compute_seconds[i]; returns when all are done.
void dp_parallel_forward_backward(DataParallel *dp, float label_smoothing, float grad_scale);

// Given: replica i's gradient buffer (n_params floats) where the master's device can read it: the replica's
// own buffer when it is on the master's GPU (or on the CPU), else a copy in dp->grad_stage, which the next
// call overwrites.
const float *dp_grads_for_master(DataParallel *dp, int i);

// Given: ends a phase of the step: waits until every GPU in use has finished its queued work (CUDA calls
// return before the work is done), adds the seconds since *t to *total and restarts *t.
void dp_phase_done(DataParallel *dp, double *total, double *t);

// TODO 1: splits `global` into dp->n contiguous chunks, in order, sizes differing by at most 1 (the first
// global->n % n chunks take one image more). chunks[i].x/.y point INTO global's arrays (no copy on the host:
// each replica copies its own chunk to its device at the start of its forward). global->n >= dp->n.
void dp_scatter(DataParallel *dp, const Batch *global);

// TODO 2: copies the master's parameters AND its BN buffers (running statistics) onto every other replica.
void dp_replicate(DataParallel *dp);

// TODO 3: master grads = sum over all replicas of their grads (the master's own included).
void dp_reduce_to_master(DataParallel *dp);

// TODO 4: one DataParallel step on the global batch: scatter, replicate, parallel forward+backward with the
// loss gradient scaled by 1/(global batch), reduce, SGD step (optim_step) on the master. Adds each phase's
// time to dp->times. Returns the summed metrics of all replicas (before the update). The step of lesson 01,
// with the model replaced by its replicas: same arguments, same result.
Metrics dp_step(DataParallel *dp, const Batch *global, const SgdConfig *opt, float label_smoothing);

#ifdef __cplusplus
}
#endif

#endif // LESSON02_H
