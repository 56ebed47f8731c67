// kit/optim.h: SGD with momentum over a model's flat buffers, and the learning-rate schedule.
#ifndef KIT_OPTIM_H
#define KIT_OPTIM_H

#include <stdbool.h>

#include "kit/model.h"

#ifdef __cplusplus
extern "C" {
#endif

// The one learning rate the update reads is `lr` here. A schedule does not own a second copy: the training
// loop writes the schedule's value into it before every step (`opt.lr = lr_at(&sched, step)`), as a PyTorch
// LR scheduler writes the optimizer's param_groups[...]["lr"].
typedef struct {
    float lr;            // learning rate of the next update
    float momentum;      // 0.9
    float weight_decay;  // applied to conv/linear weights only (TensorView.decay), not to biases or BN:
                         // decaying a BN scale or a bias only fights the normalisation, it does not regularise
    bool nesterov;
} SgdConfig;

// One SGD step over all parameters with learning rate cfg->lr.
void optim_step(Model *m, const SgdConfig *cfg);

// The same, with the element-wise update supplied by the caller (lesson 01 passes the learner's own).
typedef void (*SgdUpdateFn)(Device d, size_t n, float *param, const float *grad, float *velocity, float lr,
                            float momentum, float weight_decay, int nesterov);
void optim_step_with(Model *m, const SgdConfig *cfg, SgdUpdateFn update);

typedef enum { DECAY_LINEAR, DECAY_COSINE, DECAY_NONE } DecayKind;

// Computes a learning rate per step; it never applies one (see SgdConfig.lr).
typedef struct {
    float peak_lr;
    int warmup_steps;     // linear ramp up to peak_lr over the first warmup_steps steps
    int total_steps;      // decay ends here
    float final_lr;       // learning rate at total_steps
    DecayKind decay;
} LrSchedule;

// Learning rate for step (0-based). Warmup: peak * (step + 1) / warmup_steps; then decay to final_lr.
float lr_at(const LrSchedule *s, int step);

#ifdef __cplusplus
}
#endif

#endif // KIT_OPTIM_H
