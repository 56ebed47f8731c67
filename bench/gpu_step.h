// bench/gpu_step.h: what the GPU benchmarks (bench_gpu.c, bench_profile.c) share: random device inputs and the
// bare training step, every op queued on the device and nothing read back, so that a timed loop of it measures
// the kernels and GEMMs alone (no per-step host synchronisation).
#ifndef BENCH_GPU_STEP_H
#define BENCH_GPU_STEP_H

#include <stdint.h>
#include <stdlib.h>

#include "kit/check.h"
#include "kit/device.h"
#include "kit/model.h"
#include "kit/ops.h"
#include "kit/optim.h"
#include "kit/rng.h"

// n floats uniform in [-1, 1) on the CUDA device, from seed.
static inline float *gpu_random(size_t n, uint64_t seed) {
    float *h = xmalloc(n * sizeof(float));  // (n) host staging
    Rng r = rng_make(seed, 0);
    for (size_t i = 0; i < n; i++) h[i] = 2.0f * rng_uniform(&r) - 1.0f;
    float *d = device_alloc(DEVICE_CUDA, n * sizeof(float));
    device_copy_to(DEVICE_CUDA, d, h, n * sizeof(float));
    free(h);
    return d;
}

// The optimizer of every benchmark step: SGD with momentum, Nesterov and weight decay, as the lessons train.
static const SgdConfig GPU_BENCH_OPT = {.lr = 0.01f, .momentum = 0.9f, .weight_decay = 5e-4f, .nesterov = true};

// One step on the model's own input and labels: forward, loss, backward, SGD.
static inline void gpu_train_step(Model *m, int batch) {
    int k = m->cfg.classes;
    const float *logits = model_forward(m, m->input, batch, true);  // (batch, k)
    cross_entropy_forward(DEVICE_CUDA, batch, k, logits, m->labels, 0.0f, m->loss);
    device_memset_zero(DEVICE_CUDA, m->dlogits, (size_t)batch * k * sizeof(float));
    cross_entropy_backward(DEVICE_CUDA, batch, k, logits, m->labels, 0.0f, 1.0f / batch, m->dlogits);
    model_zero_grad(m);
    model_backward(m, m->input, m->dlogits, batch);
    optim_step(m, &GPU_BENCH_OPT);
}

// Conv layer i of m (LAYER_CONV) at this batch: its dims, and the floats of its input x (N, C, H, W), its
// weights (K, C, R, R) and its output y (N, K, P, Q).
static inline Conv2dDims bench_conv_dims(const Model *m, int i, int batch, size_t *nx, size_t *nw, size_t *ny) {
    const Layer *l = &m->layers[i];
    int c = m->cfg.in_c, h = m->cfg.in_h, w = m->cfg.in_w;
    if (l->in >= 0) c = m->layers[l->in].c, h = m->layers[l->in].h, w = m->layers[l->in].w;
    Conv2dDims s = {.n = batch, .c = c, .h = h, .w = w, .k = l->out_c, .r = l->ksize, .stride = l->stride,
                    .pad = l->pad};
    *nx = (size_t)batch * c * h * w, *nw = (size_t)l->out_c * c * l->ksize * l->ksize;
    *ny = (size_t)batch * l->out_c * conv2d_out_h(&s) * conv2d_out_w(&s);
    return s;
}

#endif  // BENCH_GPU_STEP_H
