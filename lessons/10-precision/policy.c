// policy.c: which tensors of the model live in 16 bits. What you write is marked TODO:
//
//   TODO 2a  policy_layer     a layer kind's precision: the GEMMs in low precision, the rest computed in fp32
//   TODO 2b  the round hook   where the model calls it (kit/model.h, RoundPoint), round what the policy says
//   TODO 2c  master_to_model  the model's weights from the fp32 master copy, after every update
//
// The model calls the hook at three points of every layer: after its forward wrote its output (ROUND_OUTPUT),
// before its backward reads the gradient of that output (ROUND_DOUT), after its backward added its parameter
// gradients (ROUND_DPARAMS). The input batch and the loss gradient are rounded by the step (mixed.c, given).
// PyTorch: torch.autocast(device_type, dtype=torch.bfloat16) decides per op from its lists: matmul, conv and
// linear run in the low dtype; batch_norm, softmax, the losses and reductions run in float32.
#include <string.h>

#include "lesson.h"
#include "kit/check.h"

// TODO 2a: the precision of a layer of kind `kind` under format f. Why two kinds of "low"? A conv or a linear
//   layer is a GEMM: a tensor core takes 16-bit inputs (half the bytes to read, several times the FLOP/s) and
//   sums in fp32, so its inputs and weights are low. BN computes batch statistics (sums of squares of many
//   values) and its scale and shift: in 16 bits those lose their digits, so it runs in fp32, as do ReLU, the
//   pools and the residual add (no GEMM: nothing to gain); each still STORES its output in 16 bits (the
//   activations are most of the memory). Under fp32 (f == LOWP_FP32) nothing is rounded.
// PyTorch: autocast's "lower precision" list (conv2d, linear, matmul) and its "float32" list (batch_norm, ...).
LayerPrecision policy_layer(LayerKind kind, LowpFormat f) {
    (void)kind, (void)f;
    return PREC_FP32;
}

// TODO 2b: the model's round hook; ctx is the Mixed (mx->format: the format; mx->grad_stats: the counts).
//   ROUND_OUTPUT and ROUND_DOUT: a layer that is not PREC_FP32 stores its output, and receives the gradient of
//     it, in 16 bits: round buf (lowp_round_buffer, on the model's device).
//   ROUND_DPARAMS: only a PREC_COMPUTE_LOW layer produces its weight gradient in 16 bits (a GEMM's output); BN's
//     gamma and beta gradients come from its fp32 computation and stay fp32. Count these roundings into
//     mx->grad_stats: their underflow share is what the run reports (fp16 without a loss scale loses them).
void policy_round_hook(void *ctx, const Model *m, int layer, RoundPoint at, float *buf, size_t n) {
    Mixed *mx = ctx;
    (void)mx, (void)m, (void)layer, (void)at, (void)buf, (void)n;
}

// TODO 2c: the model computes with ITS params; the update went into the fp32 master (mixed.c). Copy the master
//   into the model's params, then round the slices of the PREC_COMPUTE_LOW layers (Layer.param_offset,
//   .param_count): the weights a tensor core reads are 16-bit. A BN layer's gamma and beta are fp32 parameters:
//   copied exactly. The BN running statistics (m->buffers) are not parameters: leave them alone.
//   Why keep an fp32 master at all, when the model computes with 16-bit weights? See mixed.c, TODO 5.
// PyTorch: with autocast the model's parameters ARE the fp32 master; autocast casts a weight to 16 bits
//   where an op uses it (and caches the cast for the step), which is what the rounded copy here stands for.
void master_to_model(Mixed *mx) {
    Model *m = mx->model;
    device_copy(m->device, m->params, mx->master, m->n_params * sizeof(float));  // every weight: rounded?
}
