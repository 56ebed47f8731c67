// kit/ops_impl.h: the per-device implementations behind kit/ops.h (internal to the kit).
// ops.c dispatches each op to its _cpu version (ops_cpu.c) or its _cuda version (kit/cuda/*.cu);
// both take the arguments of the public op, minus the device.
#ifndef KIT_OPS_IMPL_H
#define KIT_OPS_IMPL_H

#include <stdbool.h>
#include <stddef.h>

#include "kit/ops_dims.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- CPU (kit/ops_cpu.c)
size_t conv2d_work_floats_cpu(const Conv2dDims *s);
void conv2d_forward_cpu(const Conv2dDims *s, const float *x, const float *w, const float *b, float *y, float *work);
size_t conv2d_prepared_floats_cpu(const Conv2dDims *s);
void conv2d_prepare_cpu(const Conv2dDims *s, const float *w, float *prepared);
void conv2d_forward_prepared_cpu(const Conv2dDims *s, const float *x, const float *w, const float *prepared, const float *b, float *y, float *work);
void conv2d_backward_cpu(const Conv2dDims *s, const float *x, const float *w, const float *dy, float *dx, float *dw, float *db, float *work);
size_t batchnorm_work_floats_cpu(const BatchNormDims *s);
void batchnorm_forward_train_cpu(const BatchNormDims *s, const float *x, const float *gamma, const float *beta, float *y, float *mean, float *invstd, float *running_mean, float *running_var, const BatchNormSync *sync, float *work);
void batchnorm_forward_eval_cpu(const BatchNormDims *s, const float *x, const float *gamma, const float *beta, const float *running_mean, const float *running_var, float *y);
void batchnorm_backward_cpu(const BatchNormDims *s, const float *x, const float *gamma, const float *mean, const float *invstd, const float *dy, float *dx, float *dgamma, float *dbeta, const BatchNormSync *sync, float *work);
void batchnorm_relu_forward_train_cpu(const BatchNormDims *s, const float *x, const float *gamma, const float *beta, float *y, float *mean, float *invstd, float *running_mean, float *running_var, const BatchNormSync *sync, float *work);
void batchnorm_relu_backward_cpu(const BatchNormDims *s, const float *x, const float *gamma, const float *mean, const float *invstd, const float *y, const float *dy, float *dx, float *dgamma, float *dbeta, const BatchNormSync *sync, float *work);
void relu_forward_cpu(size_t n, const float *x, float *y);
void relu_backward_cpu(size_t n, const float *y, const float *dy, float *dx);
void add_forward_cpu(size_t n, const float *a, const float *b, float *y);
void add_inplace_cpu(size_t n, float *dst, const float *src);
void maxpool2_forward_cpu(int n, int c, int h, int w, const float *x, float *y);
void maxpool2_backward_cpu(int n, int c, int h, int w, const float *x, const float *y, const float *dy, float *dx);
void avgpool_forward_cpu(int n, int c, int hw, const float *x, float *y);
void avgpool_backward_cpu(int n, int c, int hw, const float *dy, float *dx);
void linear_forward_cpu(int n, int in, int out, const float *x, const float *w, const float *b, float *y);
void linear_backward_cpu(int n, int in, int out, const float *x, const float *w, const float *dy, float *dx, float *dw, float *db);
void cross_entropy_forward_cpu(int n, int k, const float *logits, const int *labels, float smoothing, float *loss);
void cross_entropy_backward_cpu(int n, int k, const float *logits, const int *labels, float smoothing, float scale, float *dlogits);
void argmax_rows_cpu(int n, int k, const float *logits, int *pred);
void sgd_update_cpu(size_t n, float *param, const float *grad, float *velocity, float lr, float momentum, float weight_decay, int nesterov);
void round_lowp_cpu(LowpFormat f, size_t n, float *x, LowpStats *stats);
void scale_inplace_cpu(size_t n, float *x, float s);
size_t count_nonfinite_cpu(size_t n, const float *x);

// ---- CUDA (kit/cuda/*.cu; compiled only when nvcc is found)
size_t conv2d_work_floats_cuda(const Conv2dDims *s);
void conv2d_forward_cuda(const Conv2dDims *s, const float *x, const float *w, const float *b, float *y);
void conv2d_backward_cuda(const Conv2dDims *s, const float *x, const float *w, const float *dy, float *dx, float *dw, float *db);
size_t batchnorm_work_floats_cuda(const BatchNormDims *s);
void batchnorm_forward_train_cuda(const BatchNormDims *s, const float *x, const float *gamma, const float *beta, float *y, float *mean, float *invstd, float *running_mean, float *running_var, const BatchNormSync *sync, float *work);
void batchnorm_forward_eval_cuda(const BatchNormDims *s, const float *x, const float *gamma, const float *beta, const float *running_mean, const float *running_var, float *y);
void batchnorm_backward_cuda(const BatchNormDims *s, const float *x, const float *gamma, const float *mean, const float *invstd, const float *dy, float *dx, float *dgamma, float *dbeta, const BatchNormSync *sync, float *work);
void batchnorm_relu_forward_train_cuda(const BatchNormDims *s, const float *x, const float *gamma, const float *beta, float *y, float *mean, float *invstd, float *running_mean, float *running_var, const BatchNormSync *sync, float *work);
void batchnorm_relu_backward_cuda(const BatchNormDims *s, const float *x, const float *gamma, const float *mean, const float *invstd, const float *y, const float *dy, float *dx, float *dgamma, float *dbeta, const BatchNormSync *sync, float *work);
void relu_forward_cuda(size_t n, const float *x, float *y);
void relu_backward_cuda(size_t n, const float *y, const float *dy, float *dx);
void add_forward_cuda(size_t n, const float *a, const float *b, float *y);
void add_inplace_cuda(size_t n, float *dst, const float *src);
void maxpool2_forward_cuda(int n, int c, int h, int w, const float *x, float *y);
void maxpool2_backward_cuda(int n, int c, int h, int w, const float *x, const float *y, const float *dy, float *dx);
void avgpool_forward_cuda(int n, int c, int hw, const float *x, float *y);
void avgpool_backward_cuda(int n, int c, int hw, const float *dy, float *dx);
void linear_forward_cuda(int n, int in, int out, const float *x, const float *w, const float *b, float *y);
void linear_backward_cuda(int n, int in, int out, const float *x, const float *w, const float *dy, float *dx, float *dw, float *db);
void cross_entropy_forward_cuda(int n, int k, const float *logits, const int *labels, float smoothing, float *loss);
void cross_entropy_backward_cuda(int n, int k, const float *logits, const int *labels, float smoothing, float scale, float *dlogits);
void argmax_rows_cuda(int n, int k, const float *logits, int *pred);
void sgd_update_cuda(size_t n, float *param, const float *grad, float *velocity, float lr, float momentum, float weight_decay, int nesterov);
void round_lowp_cuda(LowpFormat f, size_t n, float *x, LowpStats *stats);
void scale_inplace_cuda(size_t n, float *x, float s);
size_t count_nonfinite_cuda(size_t n, const float *x);

// ---- CUDA with 16-bit activations (model_store_activations, kit/model.h; kit/cuda/*.cu)
// The ops above with every activation and output gradient (the `void *` arguments) stored in 2 bytes of format f
// (LOWP_BF16 or LOWP_FP16; LOWP_FP32: float, the ops above), read into float32 and written rounded to nearest
// even: the values lesson 10's emulation rounds to at the same points (round_lowp). The input gradient dx is
// stored in f too, each addition into it rounded once. Parameters, their gradients and statistics stay float32. conv's x may be float32
// instead (fx = LOWP_FP32: the model's input); linear's y and dy are the float32 logits and their gradient. conv
// and linear need the GEMMs in the same format (device_set_gemm_precision), which read 16-bit operands as they are.
void conv2d_forward_act16_cuda(LowpFormat f, LowpFormat fx, const Conv2dDims *s, const void *x, const float *w, const float *b, void *y);
void conv2d_backward_act16_cuda(LowpFormat f, LowpFormat fx, const Conv2dDims *s, const void *x, const float *w, const void *dy, void *dx, float *dw, float *db);
void batchnorm_forward_train_act16_cuda(LowpFormat f, bool relu, const BatchNormDims *s, const void *x, const float *gamma, const float *beta, void *y, float *mean, float *invstd, float *running_mean, float *running_var, const BatchNormSync *sync, float *work);
void batchnorm_forward_eval_act16_cuda(LowpFormat f, const BatchNormDims *s, const void *x, const float *gamma, const float *beta, const float *running_mean, const float *running_var, void *y);
// relu_y: the fused ReLU's output (NULL: plain BN).
void batchnorm_backward_act16_cuda(LowpFormat f, const BatchNormDims *s, const void *x, const float *gamma, const float *mean, const float *invstd, const void *relu_y, const void *dy, void *dx, float *dgamma, float *dbeta, const BatchNormSync *sync, float *work);
void relu_forward_act16_cuda(LowpFormat f, size_t n, const void *x, void *y);
void relu_backward_act16_cuda(LowpFormat f, size_t n, const void *y, const void *dy, void *dx);
void add_forward_act16_cuda(LowpFormat f, size_t n, const void *a, const void *b, void *y);
void add_inplace_act16_cuda(LowpFormat f, size_t n, void *dst, const void *src);
void maxpool2_forward_act16_cuda(LowpFormat f, int n, int c, int h, int w, const void *x, void *y);
void maxpool2_backward_act16_cuda(LowpFormat f, int n, int c, int h, int w, const void *x, const void *dy, void *dx);
void avgpool_forward_act16_cuda(LowpFormat f, int n, int c, int hw, const void *x, void *y);
void avgpool_backward_act16_cuda(LowpFormat f, int n, int c, int hw, const void *dy, void *dx);
void linear_forward_act16_cuda(LowpFormat f, int n, int in, int out, const void *x, const float *w, const float *b, float *y);
void linear_backward_act16_cuda(LowpFormat f, int n, int in, int out, const void *x, const float *w, const float *dy, void *dx, float *dw, float *db);

#ifdef __cplusplus
}
#endif

#endif // KIT_OPS_IMPL_H
