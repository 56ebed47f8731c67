// lesson.h: the functions you write in lesson 01, shared by train.c, sgd.c, sgd_kernel.cu and the autograder.
#ifndef LESSON01_H
#define LESSON01_H

#include <stddef.h>

#include "kit/data.h"
#include "kit/model.h"
#include "kit/optim.h"
#include "kit/train.h"  // Metrics: the sums train_step and evaluate return

#ifdef __cplusplus
extern "C" {
#endif

// TODO 1 (sgd.c) and TODO 2 (sgd_kernel.cu): the SGD-with-momentum update over n floats.
void lesson_sgd_update(Device d, size_t n, float *param, const float *grad, float *velocity, float lr,
                       float momentum, float weight_decay, int nesterov);
void lesson_sgd_update_cpu(size_t n, float *param, const float *grad, float *velocity, float lr, float momentum,
                           float weight_decay, int nesterov);
void lesson_sgd_update_cuda(size_t n, float *param, const float *grad, float *velocity, float lr, float momentum,
                            float weight_decay, int nesterov);

// TODO 3 (train.c): one step on one batch: copy to the device, forward, loss, backward, update with opt->lr.
// Returns the batch's sums (loss_sum, correct, count), measured before the update.
Metrics train_step(Model *m, const Batch *batch, const SgdConfig *opt, float label_smoothing);

// TODO 4 (train.c): the evaluation loop over every batch the loader yields (eval mode, no update).
Metrics evaluate(Model *m, Loader *loader);

#ifdef __cplusplus
}
#endif

#endif // LESSON01_H
