// kit/ops.h: the operations a network is made of, forward and backward.
//
// Conventions (the same on every device; the CPU and CUDA versions share these signatures):
//   - float32, NCHW layout: images are (N, C, H, W), row-major, W fastest.
//   - Every pointer lives on the device `d` (host memory for DEVICE_CPU, GPU memory for DEVICE_CUDA),
//     unless the comment says "host".
//   - Forward ops OVERWRITE their output.
//   - Backward ops ACCUMULATE (+=) into every gradient they produce: input gradients (dx) and parameter
//     gradients (dw, db). The caller zeroes gradients before a backward pass. One rule for all ops is what
//     lets an activation feed two layers (a residual connection): both add their share.
//     A gradient pointer may be NULL when it is not needed (e.g. dx of the first layer).
//   - `work` is scratch memory of at least the size the matching *_work_floats() function returns;
//     ops never allocate it. (conv2d on CUDA asks for none: its work, cuDNN's workspace or im2col's columns,
//     depends on the engine that takes each pass, so the CUDA context holds it, kit/cuda/cuda_context.h; `work`
//     may then be NULL.)
#ifndef KIT_OPS_H
#define KIT_OPS_H

#include <stdbool.h>
#include <stddef.h>

#include "kit/device.h"
#include "kit/ops_dims.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---------------------------------------------------------------- conv2d
// x (N, C, H, W) * w (K, C, R, R) + b (K) -> y (N, K, P, Q)
// with P = (H + 2*pad - R) / stride + 1, Q = (W + 2*pad - R) / stride + 1.
// Teaching path: im2col of one image into a (C*R*R, P*Q) matrix, then one GEMM per image.
size_t conv2d_work_floats(Device d, const Conv2dDims *s);
void conv2d_forward(Device d, const Conv2dDims *s, const float *x, const float *w, const float *b,
                    float *y, float *work);
// The filters in the form the forward computes with, made once for many calls (an inference model's weights change
// only when a checkpoint is applied): on the CPU, Winograd's transformed filters for the layers it takes, which
// conv2d_forward would otherwise transform anew on every call (16 floats per channel pair: 16 MB for 512 -> 512).
// conv2d_prepared_floats: how many floats `prepared` needs (0: nothing to prepare, on this layer or this device).
// conv2d_prepare: prepared from w (call again whenever w changes). conv2d_forward_prepared: conv2d_forward's result,
// using `prepared` where it has one (w where it has none): the same bits where its GEMMs have many columns; where
// they have few (batch 1 on small maps) the same products summed in another order (kit/gemm_small.h), equal up to
// rounding.
size_t conv2d_prepared_floats(Device d, const Conv2dDims *s);
void conv2d_prepare(Device d, const Conv2dDims *s, const float *w, float *prepared);
void conv2d_forward_prepared(Device d, const Conv2dDims *s, const float *x, const float *w, const float *prepared,
                             const float *b, float *y, float *work);
// dx += conv_transpose(dy, w); dw += dy (x) x; db += sum(dy). Any of dx, dw, db may be NULL.
void conv2d_backward(Device d, const Conv2dDims *s, const float *x, const float *w, const float *dy,
                     float *dx, float *dw, float *db, float *work);

// ---------------------------------------------------------------- batch norm (2-D, per channel)
// Training mode normalises with the batch statistics over (N, H, W) and updates the running
// statistics: running = (1 - momentum) * running + momentum * batch (unbiased variance), as PyTorch.
// Eval mode normalises with the running statistics.
size_t batchnorm_work_floats(Device d, const BatchNormDims *s);
// mean, invstd (C): saved for backward. running_mean, running_var (C): updated in place.
void batchnorm_forward_train(Device d, const BatchNormDims *s, const float *x, const float *gamma,
                             const float *beta, float *y, float *mean, float *invstd,
                             float *running_mean, float *running_var, const BatchNormSync *sync,
                             float *work);
void batchnorm_forward_eval(Device d, const BatchNormDims *s, const float *x, const float *gamma,
                            const float *beta, const float *running_mean, const float *running_var,
                            float *y);
void batchnorm_backward(Device d, const BatchNormDims *s, const float *x, const float *gamma,
                        const float *mean, const float *invstd, const float *dy, float *dx,
                        float *dgamma, float *dbeta, const BatchNormSync *sync, float *work);

// Batch norm followed by ReLU, as one op (kit/model.c fuses a BN whose sole consumer is a ReLU, on either device).
// Forward: y = max(batchnorm(x), 0), the BN output never stored; the same sync hook calls as batchnorm_*.
// Backward: dy is the gradient of the ReLU's OUTPUT y (the forward's y), masked by y > 0 on the fly.
// dx may be dy itself: then dx is OVERWRITTEN with the input gradient (what adding into zeros gives), which
// lets the model keep one buffer for both (dy is fully read for the channel sums before dx is written).
// Both give bit for bit what batchnorm_forward_train + relu_forward and relu_backward (into a zeroed
// buffer) + batchnorm_backward give: one pass over the activations each way instead of two.
void batchnorm_relu_forward_train(Device d, const BatchNormDims *s, const float *x, const float *gamma,
                                  const float *beta, float *y, float *mean, float *invstd,
                                  float *running_mean, float *running_var, const BatchNormSync *sync,
                                  float *work);
void batchnorm_relu_backward(Device d, const BatchNormDims *s, const float *x, const float *gamma,
                             const float *mean, const float *invstd, const float *y, const float *dy,
                             float *dx, float *dgamma, float *dbeta, const BatchNormSync *sync, float *work);

// ---------------------------------------------------------------- elementwise
// y = max(x, 0). Backward uses the output: dx += dy * (y > 0).
void relu_forward(Device d, size_t n, const float *x, float *y);
void relu_backward(Device d, size_t n, const float *y, const float *dy, float *dx);

// y = a + b (the residual connection). Its backward is add_inplace(dy) into both inputs' gradients.
void add_forward(Device d, size_t n, const float *a, const float *b, float *y);
// dst += src
void add_inplace(Device d, size_t n, float *dst, const float *src);

// ---------------------------------------------------------------- pooling
// 2x2 max-pool, stride 2: x (N, C, H, W) -> y (N, C, H/2, W/2) (odd H or W: the last row/column is dropped).
// Backward routes dy to the first maximum of each window (recomputed from x; nothing saved).
void maxpool2_forward(Device d, int n, int c, int h, int w, const float *x, float *y);
void maxpool2_backward(Device d, int n, int c, int h, int w, const float *x, const float *y,
                       const float *dy, float *dx);

// Global average pool: x (N, C, H, W) -> y (N, C).
void avgpool_forward(Device d, int n, int c, int hw, const float *x, float *y);
void avgpool_backward(Device d, int n, int c, int hw, const float *dy, float *dx);

// ---------------------------------------------------------------- linear
// x (N, IN) @ w^T (OUT, IN) + b (OUT) -> y (N, OUT). (A conv output feeds it flattened.)
void linear_forward(Device d, int n, int in, int out, const float *x, const float *w, const float *b,
                    float *y);
void linear_backward(Device d, int n, int in, int out, const float *x, const float *w, const float *dy,
                     float *dx, float *dw, float *db);

// ---------------------------------------------------------------- loss
// Softmax cross-entropy with label smoothing s (0 = none): the target is (1 - s) on the label plus
// s / K spread over all K classes, as torch.nn.CrossEntropyLoss(label_smoothing=s).
// logits (N, K); labels (N) on the device; loss (N) per-sample losses on the device.
void cross_entropy_forward(Device d, int n, int k, const float *logits, const int *labels,
                           float smoothing, float *loss);
// dlogits += scale * (softmax(logits) - target). scale = 1/N gives the gradient of the batch mean.
void cross_entropy_backward(Device d, int n, int k, const float *logits, const int *labels,
                            float smoothing, float scale, float *dlogits);
// pred (N) = argmax over each row of logits (N, K) (first maximum).
void argmax_rows(Device d, int n, int k, const float *logits, int *pred);

// ---------------------------------------------------------------- optimizer
// SGD with momentum (PyTorch's formulation), over n contiguous floats:
//   g = grad + weight_decay * param
//   v = momentum * v + g
//   step = nesterov ? g + momentum * v : v
//   param -= lr * step
void sgd_update(Device d, size_t n, float *param, const float *grad, float *velocity, float lr,
                float momentum, float weight_decay, int nesterov);

// ---------------------------------------------------------------- low precision (lesson 10)
// The kit computes in float32; a bf16 or fp16 tensor is EMULATED by rounding a float buffer to the format's
// values, kept in float containers. A bf16 product summed in float32 is exactly what a tensor core gives
// (two 8-bit mantissas multiply exactly in float32's 24), so rounding the inputs is all it takes.
// LowpFormat and LowpStats are in kit/ops_dims.h (the kernels share them).
//
// x (n) in place: round to nearest, ties to even, to format f and back to float (LOWP_FP32: unchanged).
// NaN stays NaN (made quiet, sign kept), +-inf stays +-inf; fp16: |x| >= 65520 becomes +-inf, results below
// 2^-14 are fp16 subnormals (multiples of 2^-24), |x| <= 2^-25 becomes +-0. stats (host; NULL: not counted):
// this call's counts are ADDED to it, so one LowpStats can sum many buffers.
void round_lowp(Device d, LowpFormat f, size_t n, float *x, LowpStats *stats);
// x (n) *= s, in place (the loss scale and its inverse).
void scale_inplace(Device d, size_t n, float *x, float s);
// The number of entries of x (n) that are inf or NaN (an overflowed gradient).
size_t count_nonfinite(Device d, size_t n, const float *x);
// "fp32", "bf16", "fp16"; lowp_parse: the reverse (false, f untouched, for anything else).
const char *lowp_name(LowpFormat f);
bool lowp_parse(const char *s, LowpFormat *f);

#ifdef __cplusplus
}
#endif

#endif // KIT_OPS_H
