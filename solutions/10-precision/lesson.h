// lesson.h: the numerics of scale, the structures and functions of lesson 10, shared by lowp.c, policy.c,
// scaler.c, allreduce_bf16.c, mixed.c, train.c and the autograder.
//
// Lesson 03 trains in float32 everywhere. Here the same loop trains in MIXED precision: the convolutions and
// the linear layers take their inputs and weights in a 16-bit format (bf16, or fp16 with loss scaling) and sum
// their products in float32, the activations are stored in 16 bits, and an fp32 MASTER copy of the weights
// takes the updates. Then the large batch: K micro-batches accumulated into one step, and the learning rate
// scaled with the global batch.
//
//   TODO 1  the formats: float <-> bf16 and fp16 bit patterns, round-to-nearest-even         lowp.c
//   TODO 2  the policy: which layer rounds what, and the model's weights from the master     policy.c
//   TODO 3  dynamic loss scaling (PyTorch's GradScaler): the same skip decision on every rank  scaler.c
//   TODO 4  the gradient all-reduce with bf16 messages (half the bytes)                     allreduce_bf16.c
//   TODO 5  the step: micro-batches, unscale, skip or update the master, copy to the model   mixed.c
//   TODO 6  the learning rate of a global batch (the linear scaling rule)                     mixed.c
//
// How 16 bits run here: the kit's ops compute in float32, so the lesson ROUNDS each tensor to the 16-bit
// format where a mixed-precision run stores it or feeds it to a GEMM, and keeps it in a float. A bf16 GEMM
// with float32 accumulation (tensor cores, oneDNN) is exactly that: inputs rounded, products exact in float32,
// sums in float32. Every numerical effect shows (rounding, fp16's overflow and underflow, updates lost to a
// 16-bit weight) on any machine; memory and time are not saved (the README gives the byte counts).
#ifndef LESSON10_H
#define LESSON10_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "solutions/03-ddp/lesson.h"
#include "kit/cli.h"
#include "kit/data.h"
#include "kit/dist.h"
#include "kit/model.h"
#include "kit/ops.h"
#include "kit/optim.h"
#include "kit/train.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct Mixed Mixed;

// ---------------------------------------------------------------- TODO 1: the formats (lowp.c)
// Bit patterns as uint16_t; round-to-nearest-even; NaN -> a quiet NaN of the same sign; +-inf -> +-inf.
// float -> fp16: overflow (|x| rounds above 65504) -> +-inf, results below 2^-14 become fp16 subnormals, below
// half the smallest subnormal (2^-25) -> +-0 (ties to even: 2^-25 itself -> 0).
//
//   float32  s eeeeeeee mmmmmmmmmmmmmmmmmmmmmmm   8-bit exponent, 23-bit mantissa
//   bf16     s eeeeeeee mmmmmmm                   float32's exponent, 7-bit mantissa: the top half of a float
//   fp16     s eeeee mmmmmmmmmm                   5-bit exponent (bias 15), 10-bit mantissa, max 65504
uint16_t bf16_from_float(float x);   // TODO 1a
float bf16_to_float(uint16_t h);     // TODO 1b
uint16_t half_from_float(float x);   // TODO 1c
float half_to_float(uint16_t h);     // TODO 1d (subnormals, inf, NaN)
// Given: x rounded to f and back (to_float(from_float(x))); LOWP_FP32: x itself.
float lowp_round(LowpFormat f, float x);
// Given: x (n floats on device d) rounded in place. The CPU loops over YOUR lowp_round, counting into *stats as
// the kit's round_lowp does (stats may be NULL); on a GPU the kit's round_lowp (the same rounding as a kernel).
void lowp_round_buffer(Device d, LowpFormat f, float *x, size_t n, LowpStats *stats);

// ---------------------------------------------------------------- TODO 2: the precision policy (policy.c)
// What a layer does in 16 bits, PyTorch autocast's lists:
//   PREC_COMPUTE_LOW  conv, linear: inputs AND weights in low precision, products summed in fp32, output stored
//                     low, its parameter gradients produced low (then kept in fp32 by the master copy)
//   PREC_STORE_LOW    relu, maxpool, avgpool, add, bn: computed in fp32 (BN's batch statistics, its scale and
//                     shift in fp32), the output stored low
//   PREC_FP32         nothing rounded (what every layer is under --precision fp32)
typedef enum { PREC_FP32, PREC_STORE_LOW, PREC_COMPUTE_LOW } LayerPrecision;

LayerPrecision policy_layer(LayerKind kind, LowpFormat f);  // TODO 2a (f == LOWP_FP32 -> PREC_FP32)
// TODO 2b: the model's round hook (kit/model.h, ModelRoundHook); ctx is the Mixed. OUTPUT and DOUT rounded for
// any low layer, DPARAMS for COMPUTE_LOW only (counted into the Mixed's grad_stats).
void policy_round_hook(void *ctx, const Model *m, int layer, RoundPoint at, float *buf, size_t n);
// TODO 2c: model params = master, the COMPUTE_LOW layers' slices rounded, the others (BN's gamma and beta)
// copied exactly; the BN buffers untouched.
void master_to_model(Mixed *mx);

// ---------------------------------------------------------------- TODO 3: dynamic loss scaling (scaler.c)
// PyTorch's GradScaler, the state machine of its update().
typedef struct {
    float scale;           // the loss is multiplied by it before backward (fp16: init 65536 = 2^16)
    int growth_interval;   // good steps in a row before the scale doubles (--scale-window)
    int good_steps;        // good steps since the last growth or skip
    float growth, backoff; // 2.0 and 0.5
    bool dynamic;          // false: a static scale (or 1 with --loss-scale none): never changes
    long long skipped;     // steps skipped so far
} LossScaler;

LossScaler scaler_init(const TrainOptions *o);  // given
// TODO 3a: did ANY rank find an inf or NaN in its gradients? The same answer on every rank.
bool scaler_found_inf(ProcessGroup *pg, bool local_inf);
// TODO 3b: after a step: found_inf -> the step was skipped, scale x backoff, good steps reset; otherwise one good
// step more, and growth_interval of them in a row -> scale x growth (a static scaler never changes).
void scaler_update(LossScaler *s, bool found_inf);

// ---------------------------------------------------------------- TODO 4: the bf16 gradient all-reduce
// A ring over pg_send / pg_recv whose messages are bf16 (half the bytes), partial sums kept in fp32 on the
// receiving rank and rounded once per hop; every rank ends with identical values (its own chunk rounded too).
// Host buffers: on a GPU the step copies the gradient to the host and back (NCCL's bf16 all-reduce does the
// same inside its kernels).
void allreduce_bf16_avg(ProcessGroup *pg, float *buf /* host, (n) */, size_t n);  // TODO 4

// ---------------------------------------------------------------- TODO 5, 6: the step (mixed.c)
struct Mixed {
    ProcessGroup *pg;
    Model *model;          // its params: the model's copy (rounded for COMPUTE_LOW layers); its grads: one pass
    LowpFormat format, master_format;  // --precision, --master
    LowpFormat wire;       // --allreduce
    int accumulate;        // --accumulate
    float *master;         // (n_params) fp32 master weights (rounded to bf16 after each update when --master bf16)
    float *master_grad;    // (n_params) fp32 sum of the micro-batches' unscaled gradients
    float *host;           // (n_params) host staging for the bf16 all-reduce on a GPU (NULL on the CPU)
    LossScaler scaler;
    LowpStats grad_stats;  // DPARAMS rounding counts since the last report (underflow share of fp16 gradients)
    double compute_seconds, comm_seconds;
    long long steps;
};

// Given: master = the model's params (after the broadcast from rank 0), the model's weights from it, the
// round hook installed. The model must be built for b->n / accumulate samples.
Mixed *mixed_create(ProcessGroup *pg, Model *m, const TrainOptions *o);
void mixed_free(Mixed *mx);
// TODO 5: one optimizer step over K = accumulate micro-batches of this rank's batch b (b->n / K samples each;
// b->n divisible by K). Micro-batch k is every K-th sample of b from the k-th (k, k + K, k + 2K, ...: the samples
// rank r + kW of a world K times larger would get, micro_forward_backward in mixed.c): W ranks with K micro-batches
// take the step of W x K ranks whose batches are those micro-batches (BN's batch statistics per micro-batch, as
// they are per rank). Returns this rank's metrics of b, as ddp_step does.
Metrics mixed_step(Mixed *mx, const Batch *b, const SgdConfig *opt, float label_smoothing);
// TODO 6: the learning rate for a global batch under --lr-rule: "fixed": base_lr; "linear": the linear scaling
// rule (README section 9), relative to ref_batch, the batch base_lr was tuned for.
float lr_for_batch(const char *rule, float base_lr, int global_batch, int ref_batch);

#ifdef __cplusplus
}
#endif

#endif  // LESSON10_H
