// lesson.h: the functions you write in lesson 05, shared by train.c, syncbn.c and the autograder.
//
// Lessons 03 and 04 come complete from their solutions (ddp_*, ckpt_*, and lesson 04's program: run_program_with,
// called with this lesson's hooks, RunHooks). The kit runs the model; its BN layers call what Model.bn_ops names
// (kit/model.h). You write a batch norm whose statistics are those of the GLOBAL batch, over every rank, and
// the one call that puts it into a model.
#ifndef LESSON05_H
#define LESSON05_H

#include "solutions/04-checkpoint/lesson.h"
#include "kit/dist.h"
#include "kit/model.h"
#include "kit/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

// The SyncBN of one model on one rank: what its BN layers need besides their tensors.
typedef struct {
    ProcessGroup *pg;
    double *buf;            // (2 * max_c + 1) the host buffer of the all-reduces (doubles: see README 2)
    int max_c;              // the widest BN layer of the model
    BatchNormLayerOps ops;  // installed in Model.bn_ops: syncbn_forward_train / syncbn_backward on the CPU; on a
                            // GPU the kit's CUDA batch norm with ops.sync (syncbn_allreduce) as its all-reduce
    // Communication, counted by syncbn_allreduce (given): how many all-reduces, how many bytes, how long.
    long long allreduces;
    double bytes, seconds;
} SyncBn;

// Given: all-reduces (sum) n doubles in place over sb->pg, counting them. Every rank must call it with the same
// n in the same order (it is a collective).
void syncbn_allreduce(SyncBn *sb, double *buf, int n);

// TODO 1 (with 3 and 4): training-mode forward of one BN layer, with the statistics of the GLOBAL batch.
// x, y: (N, C, HW) this rank's part; mean, invstd: (C) out, kept for backward; running_mean, running_var: (C)
// updated in place (TODO 3). One syncbn_allreduce per call, of at most 2C + 1 doubles (sb->buf).
void syncbn_forward_train(void *ctx, const BatchNormDims *s, const float *x, const float *gamma, const float *beta,
                          float *y, float *mean, float *invstd, float *running_mean, float *running_var);

// TODO 2: backward of one BN layer. dgamma, dbeta (C): this rank's sums ADDED (DDP averages them with every
// other parameter gradient); dx (N, C, HW): ADDED, the global batch's (one syncbn_allreduce per call, of at
// most 2C + 1 doubles). dx may be NULL (the model's input): then nothing global is needed.
void syncbn_backward(void *ctx, const BatchNormDims *s, const float *x, const float *gamma, const float *mean,
                     const float *invstd, const float *dy, float *dx, float *dgamma, float *dbeta);

// TODO 3: one channel's running statistics after a training step: mean and var_biased are the GLOBAL batch's,
// count the number of values behind them (over all ranks).
void syncbn_update_running(float momentum, double mean, double var_biased, double count, float *running_mean,
                           float *running_var);

// TODO 5: converts every BN layer of m to SyncBN over pg (PyTorch: SyncBatchNorm.convert_sync_batchnorm).
// Returns what the layers now use (free it with syncbn_free after the model is done with it).
SyncBn *syncbn_convert(Model *m, ProcessGroup *pg);
// Given: undoes syncbn_convert (m may be NULL when the model is already freed) and frees sb.
void syncbn_free(SyncBn *sb, Model *m);

#ifdef __cplusplus
}
#endif

#endif // LESSON05_H
