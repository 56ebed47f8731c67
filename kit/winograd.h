// kit/winograd.h: Winograd F(2x2, 3x3) convolution on the CPU (internal to the kit; kit/winograd.c).
//
// The fast path for 3x3, stride 1, pad 1 convolutions (forward, input and weight gradients): conv2d_forward_cpu
// and conv2d_backward_cpu (kit/ops_cpu.c) call it for the layers winograd_eligible() accepts, unless
// KIT_WINOGRAD=0 is set in the environment; every other layer, and every layer with KIT_WINOGRAD=0, takes the im2col + GEMM teaching path.
#ifndef KIT_WINOGRAD_H
#define KIT_WINOGRAD_H

#include <stdbool.h>
#include <stddef.h>

#include "kit/ops_dims.h"

#ifdef __cplusplus
extern "C" {
#endif

// 3x3, stride 1, pad 1, and enough channels on both sides for the GEMMs to outweigh the transforms.
bool winograd_eligible(const Conv2dDims *s);
// The forward: also maps of at least 8 x 8 (see WINO_FWD_MIN_PIXELS in winograd.c); both gradients take every
// winograd_eligible layer.
bool winograd_forward_eligible(const Conv2dDims *s);
// False when the environment says KIT_WINOGRAD=0 (the plain path, to compare against); read on every call.
bool winograd_enabled(void);
// Floats of `work` the two calls below need (any thread budget, any batch <= s->n).
size_t winograd_work_floats(const Conv2dDims *s);
// y (N, K, H, W) = conv(x (N, C, H, W), w (K, C, 3, 3)) + b (K, or NULL): overwrites y.
void winograd_forward(const Conv2dDims *s, const float *x, const float *w, const float *b, float *y, float *work);
// The forward's filters transformed once, for many calls (an inference model keeps them: its weights change only
// when a checkpoint is applied): U (16, K, C) = G w G^T, and where gemm_small runs (kit/gemm_small.h) each U[e]
// packed for it too, winograd_filters_floats(s) floats in all, made by winograd_prepare_filters from w (K, C, 3, 3).
// winograd_forward_prepared gives winograd_forward's bits when its GEMMs have more than GEMM_SMALL_MAX_COLS tiles;
// with fewer (batch 1 on small maps), gemm_small's: the same products summed in channel order, equal up to rounding.
size_t winograd_filters_floats(const Conv2dDims *s);
void winograd_prepare_filters(const Conv2dDims *s, const float *w, float *u);
void winograd_forward_prepared(const Conv2dDims *s, const float *x, const float *u, const float *b, float *y,
                               float *work);
// dx (N, C, H, W) += the input gradient of that convolution for dy (N, K, H, W).
void winograd_backward_data(const Conv2dDims *s, const float *w, const float *dy, float *dx, float *work);
// dw (K, C, 3, 3) += the weight gradient of that convolution for x (N, C, H, W) and dy (N, K, H, W).
void winograd_backward_weights(const Conv2dDims *s, const float *x, const float *dy, float *dw, float *work);

#ifdef __cplusplus
}
#endif

#endif
