// kit/ops.c: the public ops (kit/ops.h) dispatch on the device to their CPU or CUDA implementation.
// Nothing but dispatch lives here, so a reader can find an op's real code in one jump.
#include "kit/ops.h"

#include <string.h>

#include "kit/check.h"
#include "kit/ops_impl.h"

size_t conv2d_work_floats(Device d, const Conv2dDims *s) {
#ifdef KIT_CUDA
    if (d == DEVICE_CUDA) { return conv2d_work_floats_cuda(s); }
#endif
    CHECK(d == DEVICE_CPU, "this binary was built without CUDA: use --device cpu");
    return conv2d_work_floats_cpu(s);
}

void conv2d_forward(Device d, const Conv2dDims *s, const float *x, const float *w, const float *b, float *y, float *work) {
#ifdef KIT_CUDA
    if (d == DEVICE_CUDA) { conv2d_forward_cuda(s, x, w, b, y); return; }
#endif
    CHECK(d == DEVICE_CPU, "this binary was built without CUDA: use --device cpu");
    conv2d_forward_cpu(s, x, w, b, y, work);
}

void conv2d_backward(Device d, const Conv2dDims *s, const float *x, const float *w, const float *dy, float *dx, float *dw, float *db, float *work) {
#ifdef KIT_CUDA
    if (d == DEVICE_CUDA) { conv2d_backward_cuda(s, x, w, dy, dx, dw, db); return; }
#endif
    CHECK(d == DEVICE_CPU, "this binary was built without CUDA: use --device cpu");
    conv2d_backward_cpu(s, x, w, dy, dx, dw, db, work);
}

// Prepared filters: the CPU only (a GPU's conv has nothing to prepare: 0 floats, and the plain forward).
size_t conv2d_prepared_floats(Device d, const Conv2dDims *s) {
    return d == DEVICE_CPU ? conv2d_prepared_floats_cpu(s) : 0;
}

void conv2d_prepare(Device d, const Conv2dDims *s, const float *w, float *prepared) {
    if (d == DEVICE_CPU) conv2d_prepare_cpu(s, w, prepared);
}

void conv2d_forward_prepared(Device d, const Conv2dDims *s, const float *x, const float *w, const float *prepared, const float *b, float *y, float *work) {
    if (d == DEVICE_CPU) { conv2d_forward_prepared_cpu(s, x, w, prepared, b, y, work); return; }
    conv2d_forward(d, s, x, w, b, y, work);
}

size_t batchnorm_work_floats(Device d, const BatchNormDims *s) {
#ifdef KIT_CUDA
    if (d == DEVICE_CUDA) { return batchnorm_work_floats_cuda(s); }
#endif
    CHECK(d == DEVICE_CPU, "this binary was built without CUDA: use --device cpu");
    return batchnorm_work_floats_cpu(s);
}

void batchnorm_forward_train(Device d, const BatchNormDims *s, const float *x, const float *gamma, const float *beta, float *y, float *mean, float *invstd, float *running_mean, float *running_var, const BatchNormSync *sync, float *work) {
#ifdef KIT_CUDA
    if (d == DEVICE_CUDA) { batchnorm_forward_train_cuda(s, x, gamma, beta, y, mean, invstd, running_mean, running_var, sync, work); return; }
#endif
    CHECK(d == DEVICE_CPU, "this binary was built without CUDA: use --device cpu");
    batchnorm_forward_train_cpu(s, x, gamma, beta, y, mean, invstd, running_mean, running_var, sync, work);
}

void batchnorm_forward_eval(Device d, const BatchNormDims *s, const float *x, const float *gamma, const float *beta, const float *running_mean, const float *running_var, float *y) {
#ifdef KIT_CUDA
    if (d == DEVICE_CUDA) { batchnorm_forward_eval_cuda(s, x, gamma, beta, running_mean, running_var, y); return; }
#endif
    CHECK(d == DEVICE_CPU, "this binary was built without CUDA: use --device cpu");
    batchnorm_forward_eval_cpu(s, x, gamma, beta, running_mean, running_var, y);
}

void batchnorm_backward(Device d, const BatchNormDims *s, const float *x, const float *gamma, const float *mean, const float *invstd, const float *dy, float *dx, float *dgamma, float *dbeta, const BatchNormSync *sync, float *work) {
#ifdef KIT_CUDA
    if (d == DEVICE_CUDA) { batchnorm_backward_cuda(s, x, gamma, mean, invstd, dy, dx, dgamma, dbeta, sync, work); return; }
#endif
    CHECK(d == DEVICE_CPU, "this binary was built without CUDA: use --device cpu");
    batchnorm_backward_cpu(s, x, gamma, mean, invstd, dy, dx, dgamma, dbeta, sync, work);
}

// Fused BN + ReLU: one pass over the activations each way, on both devices (kit/model.c fuses a BN whose sole
// consumer is a ReLU).
void batchnorm_relu_forward_train(Device d, const BatchNormDims *s, const float *x, const float *gamma, const float *beta, float *y, float *mean, float *invstd, float *running_mean, float *running_var, const BatchNormSync *sync, float *work) {
#ifdef KIT_CUDA
    if (d == DEVICE_CUDA) { batchnorm_relu_forward_train_cuda(s, x, gamma, beta, y, mean, invstd, running_mean, running_var, sync, work); return; }
#endif
    CHECK(d == DEVICE_CPU, "this binary was built without CUDA: use --device cpu");
    batchnorm_relu_forward_train_cpu(s, x, gamma, beta, y, mean, invstd, running_mean, running_var, sync, work);
}

void batchnorm_relu_backward(Device d, const BatchNormDims *s, const float *x, const float *gamma, const float *mean, const float *invstd, const float *y, const float *dy, float *dx, float *dgamma, float *dbeta, const BatchNormSync *sync, float *work) {
#ifdef KIT_CUDA
    if (d == DEVICE_CUDA) { batchnorm_relu_backward_cuda(s, x, gamma, mean, invstd, y, dy, dx, dgamma, dbeta, sync, work); return; }
#endif
    CHECK(d == DEVICE_CPU, "this binary was built without CUDA: use --device cpu");
    batchnorm_relu_backward_cpu(s, x, gamma, mean, invstd, y, dy, dx, dgamma, dbeta, sync, work);
}

void relu_forward(Device d, size_t n, const float *x, float *y) {
#ifdef KIT_CUDA
    if (d == DEVICE_CUDA) { relu_forward_cuda(n, x, y); return; }
#endif
    CHECK(d == DEVICE_CPU, "this binary was built without CUDA: use --device cpu");
    relu_forward_cpu(n, x, y);
}

void relu_backward(Device d, size_t n, const float *y, const float *dy, float *dx) {
#ifdef KIT_CUDA
    if (d == DEVICE_CUDA) { relu_backward_cuda(n, y, dy, dx); return; }
#endif
    CHECK(d == DEVICE_CPU, "this binary was built without CUDA: use --device cpu");
    relu_backward_cpu(n, y, dy, dx);
}

void add_forward(Device d, size_t n, const float *a, const float *b, float *y) {
#ifdef KIT_CUDA
    if (d == DEVICE_CUDA) { add_forward_cuda(n, a, b, y); return; }
#endif
    CHECK(d == DEVICE_CPU, "this binary was built without CUDA: use --device cpu");
    add_forward_cpu(n, a, b, y);
}

void add_inplace(Device d, size_t n, float *dst, const float *src) {
#ifdef KIT_CUDA
    if (d == DEVICE_CUDA) { add_inplace_cuda(n, dst, src); return; }
#endif
    CHECK(d == DEVICE_CPU, "this binary was built without CUDA: use --device cpu");
    add_inplace_cpu(n, dst, src);
}

void maxpool2_forward(Device d, int n, int c, int h, int w, const float *x, float *y) {
#ifdef KIT_CUDA
    if (d == DEVICE_CUDA) { maxpool2_forward_cuda(n, c, h, w, x, y); return; }
#endif
    CHECK(d == DEVICE_CPU, "this binary was built without CUDA: use --device cpu");
    maxpool2_forward_cpu(n, c, h, w, x, y);
}

void maxpool2_backward(Device d, int n, int c, int h, int w, const float *x, const float *y, const float *dy, float *dx) {
#ifdef KIT_CUDA
    if (d == DEVICE_CUDA) { maxpool2_backward_cuda(n, c, h, w, x, y, dy, dx); return; }
#endif
    CHECK(d == DEVICE_CPU, "this binary was built without CUDA: use --device cpu");
    maxpool2_backward_cpu(n, c, h, w, x, y, dy, dx);
}

void avgpool_forward(Device d, int n, int c, int hw, const float *x, float *y) {
#ifdef KIT_CUDA
    if (d == DEVICE_CUDA) { avgpool_forward_cuda(n, c, hw, x, y); return; }
#endif
    CHECK(d == DEVICE_CPU, "this binary was built without CUDA: use --device cpu");
    avgpool_forward_cpu(n, c, hw, x, y);
}

void avgpool_backward(Device d, int n, int c, int hw, const float *dy, float *dx) {
#ifdef KIT_CUDA
    if (d == DEVICE_CUDA) { avgpool_backward_cuda(n, c, hw, dy, dx); return; }
#endif
    CHECK(d == DEVICE_CPU, "this binary was built without CUDA: use --device cpu");
    avgpool_backward_cpu(n, c, hw, dy, dx);
}

void linear_forward(Device d, int n, int in, int out, const float *x, const float *w, const float *b, float *y) {
#ifdef KIT_CUDA
    if (d == DEVICE_CUDA) { linear_forward_cuda(n, in, out, x, w, b, y); return; }
#endif
    CHECK(d == DEVICE_CPU, "this binary was built without CUDA: use --device cpu");
    linear_forward_cpu(n, in, out, x, w, b, y);
}

void linear_backward(Device d, int n, int in, int out, const float *x, const float *w, const float *dy, float *dx, float *dw, float *db) {
#ifdef KIT_CUDA
    if (d == DEVICE_CUDA) { linear_backward_cuda(n, in, out, x, w, dy, dx, dw, db); return; }
#endif
    CHECK(d == DEVICE_CPU, "this binary was built without CUDA: use --device cpu");
    linear_backward_cpu(n, in, out, x, w, dy, dx, dw, db);
}

void cross_entropy_forward(Device d, int n, int k, const float *logits, const int *labels, float smoothing, float *loss) {
#ifdef KIT_CUDA
    if (d == DEVICE_CUDA) { cross_entropy_forward_cuda(n, k, logits, labels, smoothing, loss); return; }
#endif
    CHECK(d == DEVICE_CPU, "this binary was built without CUDA: use --device cpu");
    cross_entropy_forward_cpu(n, k, logits, labels, smoothing, loss);
}

void cross_entropy_backward(Device d, int n, int k, const float *logits, const int *labels, float smoothing, float scale, float *dlogits) {
#ifdef KIT_CUDA
    if (d == DEVICE_CUDA) { cross_entropy_backward_cuda(n, k, logits, labels, smoothing, scale, dlogits); return; }
#endif
    CHECK(d == DEVICE_CPU, "this binary was built without CUDA: use --device cpu");
    cross_entropy_backward_cpu(n, k, logits, labels, smoothing, scale, dlogits);
}

void argmax_rows(Device d, int n, int k, const float *logits, int *pred) {
#ifdef KIT_CUDA
    if (d == DEVICE_CUDA) { argmax_rows_cuda(n, k, logits, pred); return; }
#endif
    CHECK(d == DEVICE_CPU, "this binary was built without CUDA: use --device cpu");
    argmax_rows_cpu(n, k, logits, pred);
}

void sgd_update(Device d, size_t n, float *param, const float *grad, float *velocity, float lr, float momentum, float weight_decay, int nesterov) {
#ifdef KIT_CUDA
    if (d == DEVICE_CUDA) { sgd_update_cuda(n, param, grad, velocity, lr, momentum, weight_decay, nesterov); return; }
#endif
    CHECK(d == DEVICE_CPU, "this binary was built without CUDA: use --device cpu");
    sgd_update_cpu(n, param, grad, velocity, lr, momentum, weight_decay, nesterov);
}

void round_lowp(Device d, LowpFormat f, size_t n, float *x, LowpStats *stats) {
#ifdef KIT_CUDA
    if (d == DEVICE_CUDA) { round_lowp_cuda(f, n, x, stats); return; }
#endif
    CHECK(d == DEVICE_CPU, "this binary was built without CUDA: use --device cpu");
    round_lowp_cpu(f, n, x, stats);
}

void scale_inplace(Device d, size_t n, float *x, float s) {
#ifdef KIT_CUDA
    if (d == DEVICE_CUDA) { scale_inplace_cuda(n, x, s); return; }
#endif
    CHECK(d == DEVICE_CPU, "this binary was built without CUDA: use --device cpu");
    scale_inplace_cpu(n, x, s);
}

size_t count_nonfinite(Device d, size_t n, const float *x) {
#ifdef KIT_CUDA
    if (d == DEVICE_CUDA) { return count_nonfinite_cuda(n, x); }
#endif
    CHECK(d == DEVICE_CPU, "this binary was built without CUDA: use --device cpu");
    return count_nonfinite_cpu(n, x);
}

// The names are the --precision / --master / --allreduce choices (kit/cli.c), in LowpFormat's order.
static const char *const LOWP_NAMES[] = {"fp32", "bf16", "fp16"};

const char *lowp_name(LowpFormat f) {
    CHECK(f == LOWP_FP32 || f == LOWP_BF16 || f == LOWP_FP16, "lowp_name: unknown format");
    return LOWP_NAMES[f];
}

bool lowp_parse(const char *s, LowpFormat *f) {
    for (int i = 0; s && i < 3; i++) {
        if (strcmp(s, LOWP_NAMES[i]) == 0) {
            *f = (LowpFormat)i;
            return true;
        }
    }
    return false;
}
