// kit/optim.c: SGD over the flat parameter buffer, and the learning-rate schedule (see optim.h).
#include "kit/optim.h"

#include <math.h>

#include "kit/trace.h"

void optim_step(Model *m, const SgdConfig *cfg) { optim_step_with(m, cfg, sgd_update); }

void optim_step_with(Model *m, const SgdConfig *cfg, SgdUpdateFn update) {
    model_require(m, MODEL_PARAMS | MODEL_GRADS | MODEL_VELOCITY, "optim_step");
    double t = trace_begin("optimizer step");
    // Parameters are contiguous, so consecutive views with the same decay flag form one run and
    // one sgd_update call (one kernel launch on a GPU) covers the whole run.
    int i = 0;
    while (i < m->n_views) {
        bool decay = m->views[i].decay;
        size_t start = m->views[i].offset, end = start + m->views[i].count;
        int j = i + 1;
        while (j < m->n_views && m->views[j].decay == decay && m->views[j].offset == end) {
            end += m->views[j].count;
            j++;
        }
        update(m->device, end - start, m->params + start, m->grads + start, m->velocity + start, cfg->lr,
               cfg->momentum, decay ? cfg->weight_decay : 0.0f, cfg->nesterov);
        i = j;
    }
    trace_end(t, TRACE_COMPUTE, "optimizer step");
}

float lr_at(const LrSchedule *s, int step) {
    if (step < s->warmup_steps) return s->peak_lr * (float)(step + 1) / (float)s->warmup_steps;
    if (s->decay == DECAY_NONE || s->total_steps <= s->warmup_steps) return s->peak_lr;
    float t = (float)(step - s->warmup_steps) / (float)(s->total_steps - s->warmup_steps);
    if (t > 1.0f) t = 1.0f;
    float shape = s->decay == DECAY_COSINE ? 0.5f * (1.0f + cosf(3.14159265f * t)) : 1.0f - t;
    return s->final_lr + (s->peak_lr - s->final_lr) * shape;
}
