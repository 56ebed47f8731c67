// kit/ops_impl.h: the per-device implementations behind kit/ops.h (internal to the kit).
// ops.c dispatches each op to its _cpu version (ops_cpu.c) or its _cuda version (kit/cuda/*.cu);
// both take the arguments of the public op, minus the device.
#ifndef KIT_OPS_IMPL_H
#define KIT_OPS_IMPL_H

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
void conv2d_forward_cuda(const Conv2dDims *s, const float *x, const float *w, const float *b, float *y, float *work);
void conv2d_backward_cuda(const Conv2dDims *s, const float *x, const float *w, const float *dy, float *dx, float *dw, float *db, float *work);
size_t batchnorm_work_floats_cuda(const BatchNormDims *s);
void batchnorm_forward_train_cuda(const BatchNormDims *s, const float *x, const float *gamma, const float *beta, float *y, float *mean, float *invstd, float *running_mean, float *running_var, const BatchNormSync *sync, float *work);
void batchnorm_forward_eval_cuda(const BatchNormDims *s, const float *x, const float *gamma, const float *beta, const float *running_mean, const float *running_var, float *y);
void batchnorm_backward_cuda(const BatchNormDims *s, const float *x, const float *gamma, const float *mean, const float *invstd, const float *dy, float *dx, float *dgamma, float *dbeta, const BatchNormSync *sync, float *work);
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

#ifdef __cplusplus
}
#endif

#endif // KIT_OPS_IMPL_H
