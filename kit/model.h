// kit/model.h: a network as a small table of layers, with all its memory in a few flat buffers.
//
//   params    every trainable float, in ONE buffer; named views (TensorView) say which slice is which.
//             Layout: layer by layer in forward order, each layer's weight then its bias. Backward
//             therefore finishes gradients from the END of the buffer towards the start, which is what
//             lets DDP all-reduce the tail (a "bucket") while backward is still computing the head.
//   grads     same layout as params.
//   velocity  same layout: SGD momentum.
//   buffers   BN running means/variances (not trained, but saved, broadcast and used in eval).
//   arena     every activation and activation gradient for `max_batch` samples, allocated once. Slots are
//             shared where lifetimes allow (in-place ReLU, activation-gradient slots reused in backward):
//             kit/model.c, plan_memory, says how; the numbers are the same as with a slot per tensor.
//
// All-reduce, broadcast and checkpointing are therefore one call over one buffer.
#ifndef KIT_MODEL_H
#define KIT_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kit/device.h"
#include "kit/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    LAYER_CONV,     // conv2d, square kernel (bias only when not followed by BN)
    LAYER_BN,       // batch norm 2-D
    LAYER_RELU,
    LAYER_MAXPOOL,  // 2x2, stride 2
    LAYER_ADD,      // residual: output = input + input2
    LAYER_AVGPOOL,  // global average pool -> (C, 1, 1)
    LAYER_LINEAR,   // fully connected on the flattened input
} LayerKind;

typedef struct {
    LayerKind kind;
    int in, in2;            // activation indices read: -1 is the model input; in2 only for LAYER_ADD
    int out_c, ksize, stride, pad;  // conv: output channels, kernel, stride, padding; linear: out_c features
    bool bias;              // conv / linear
    // Filled in by model_create:
    int c, h, w;            // output shape of one sample
    size_t act_offset;      // where this layer's output (N, c, h, w) starts in the arena
    int weight, bias_view;  // index into Model.views of the weight / bias (-1 = none); BN: gamma, beta
    size_t param_offset, param_count;  // this layer's parameters (weight then bias) in the flat buffers
    int running;            // BN: index into Model.buffer_views of running_mean (running_var is +1)
    size_t saved_offset;    // BN: mean and invstd (2 * c floats) in the saved-statistics area
    // Memory plan (kit/model.c, plan_memory): where the gradient of this layer's output lives in `dacts`,
    // the backward step that first writes it (it is zeroed just before), and whether this BN layer runs
    // fused with the ReLU that follows it (CPU: one pass instead of two, the BN output never stored).
    size_t grad_offset;
    int grad_first_write;   // -1: nobody writes it (the logits, or a fused BN's output)
    bool fused_relu;
    bool grad_in_place;     // fused BN: its input gradient overwrites its ReLU's output gradient (same slot)
} Layer;

// A named slice of a flat buffer, in PyTorch's state_dict spirit: "3.conv.weight" is (K, C, R, R).
typedef struct {
    char name[48];
    int ndim;
    int shape[4];
    size_t offset;  // in floats, from the start of its flat buffer
    size_t count;
    bool decay;     // weight decay applies (conv and linear weights; not biases, not BN)
} TensorView;

typedef struct {
    char name[24];    // "tiny", "tiny-bn", "fmnist", "resnet9"
    int width;        // base channel count (0 = the model's default)
    int in_c, in_h, in_w;
    int classes;
} ModelConfig;

// Lesson 05's one hook into the BN layers in training mode (Model.bn_ops, installed by model_set_bn_ops):
//   forward_train, backward: a replacement batch norm, called on the CPU: the arguments of
//     batchnorm_forward_train and batchnorm_backward (kit/ops.h) without the device, the sync hook and the
//     scratch, which an implementation brings in its ctx. NULL (both): the kit's own batch norm.
//   sync: the all-reduce of the statistics that the kit's own batch norm calls wherever it runs instead (on a
//     GPU always; on the CPU when forward_train is NULL). A NULL sync.allreduce_sum: the local batch's statistics.
typedef struct {
    void (*forward_train)(void *ctx, const BatchNormDims *s, const float *x, const float *gamma, const float *beta,
                          float *y, float *mean, float *invstd, float *running_mean, float *running_var);
    void (*backward)(void *ctx, const BatchNormDims *s, const float *x, const float *gamma, const float *mean,
                     const float *invstd, const float *dy, float *dx, float *dgamma, float *dbeta);
    void *ctx;
    BatchNormSync sync;
} BatchNormLayerOps;

#define MODEL_MAX_LAYERS 64
#define MODEL_MAX_VIEWS 128

typedef struct Model Model;

// Lesson 10's rounding hook (Model.round_hook, installed by model_set_round_hook): the model hands it each buffer
// at the points where a mixed-precision run would store or feed it in a low-precision format, and the hook
// rounds it in place (round_lowp), so the kit's float32 ops then compute what low-precision kernels would.
typedef enum {
    // After layer `layer`'s forward wrote its output, (n, c, h, w) floats, in training AND eval forwards. For a
    // BN with a fused ReLU (batchnorm_relu_forward_train), called for the BN and then for the ReLU,
    // on the same buffer.
    ROUND_OUTPUT,
    // Before layer `layer`'s backward reads dy, the gradient of its output, once every consumer has added its
    // share. NOT called for the last layer: its dy is the caller's dlogits, which the caller rounds. For a BN
    // fused with its ReLU, the buffer is the ReLU's output gradient (the fused backward masks it itself): the
    // ReLU's DOUT buffer again, so n is the same and a second rounding changes nothing.
    ROUND_DOUT,
    // After layer `layer`'s backward: its parameter gradients (grads + param_offset, param_count floats) as
    // accumulated so far (zero the gradients before a backward to round one pass's contribution alone). Only
    // for layers with parameters; before on_grads_ready, so a bucket sends the rounded gradients.
    ROUND_DPARAMS,
} RoundPoint;
typedef void (*ModelRoundHook)(void *ctx, const Model *m, int layer, RoundPoint at, float *buf, size_t n);

struct Model {
    ModelConfig cfg;
    Device device;
    int max_batch;

    // A stage (model_create_stage) is layers [first, first + n_layers) of cfg's architecture; a whole model has
    // first = 0. Its input, (in_c, in_h, in_w) per sample, is layer first-1's output (first = 0: cfg's image);
    // its "logits" are its last layer's output. Its params, grads and velocity are the whole model's floats
    // [param_base, param_base + n_params), its buffers the whole model's [buffer_base, buffer_base + n_buffers):
    // the same names, order and initial values. Layer.in = -1 is the stage's input.
    int first;
    int in_c, in_h, in_w;
    size_t param_base, buffer_base;
    // A view (model_create_view): the model whose params, grads, velocity, buffers and scratch (`work`) this one
    // uses; it owns only its activations. NULL: this model owns everything it points to.
    Model *owner;

    int n_layers;
    Layer layers[MODEL_MAX_LAYERS];

    int n_views, n_buffer_views;
    TensorView views[MODEL_MAX_VIEWS];         // into params / grads / velocity
    TensorView buffer_views[MODEL_MAX_VIEWS];  // into buffers

    size_t n_params, n_buffers;
    float *params;    // (n_params)   on the device
    float *grads;     // (n_params)
    float *velocity;  // (n_params)
    float *buffers;   // (n_buffers)

    // The arena, on the device, sized for max_batch samples.
    float *acts;      // every layer's output, at Layer.act_offset * batch (in act_format: 2 bytes an element when
                      // it is 16-bit, model_store_activations; float32 otherwise; dacts too)
    LowpFormat act_format;
    float *logits;    // (max_batch, classes) float32: the last layer's output under 16-bit storage; NULL otherwise
    float *dacts;     // their gradients, at Layer.grad_offset * batch (slots reused once dead: plan_memory)
    size_t act_floats_per_sample;
    size_t grad_floats_per_sample;
    float *saved;     // BN batch statistics kept for backward (mean, invstd per channel)
    size_t saved_floats;
    float *work;      // scratch for conv (CPU) / BN; conv on CUDA takes its work from the CUDA context
    size_t work_floats;
    float *input;     // (max_batch, in_c, in_h, in_w): the batch copied to the device
    int *labels;      // (max_batch)
    float *loss;      // (max_batch) per-sample loss
    float *dlogits;   // (max_batch, classes)
    int *pred;        // (max_batch) argmax of the logits
    float *host_loss; // (max_batch) in host memory: loss and pred copied back for the metrics, allocated
    int *host_pred;   // (max_batch) once here rather than once per batch
    float *dinput;    // (max_batch, in_c, in_h, in_w): the input's gradient (model_input_grad); NULL when first = 0

    // Lesson 05's SyncBN (BatchNormLayerOps above; syncbn_convert installs it). NULL: plain BN, the kit's own.
    // Set it with model_set_bn_ops, never directly: the memory plan depends on it.
    const BatchNormLayerOps *bn_ops;

    // Called by model_backward each time a layer's parameter gradients are final, with their range
    // [offset, offset + count) in m->grads (ranges arrive from the end of the buffer towards the start).
    // Lesson 03 uses it to start all-reducing a bucket while backward goes on. NULL: not called.
    void (*on_grads_ready)(void *ctx, size_t offset, size_t count);
    void *on_grads_ready_ctx;

    // Lesson 10's rounding hook (RoundPoint above), set with model_set_round_hook. NULL: never called, and
    // nothing differs from a model without it.
    ModelRoundHook round_hook;
    void *round_hook_ctx;

    // An inference model's conv filters in the form its forward computes with (conv2d_prepare: on the CPU,
    // Winograd's transformed filters), made from params by model_prepare_inference; layer i's at
    // prepared_offset[i] when conv2d_prepared_floats is not 0 for it. NULL (a training model, or nothing to
    // prepare): every forward works from params alone.
    float *prepared;
    size_t prepared_floats;
    size_t prepared_offset[MODEL_MAX_LAYERS];

    // The parts freed by model_release (MODEL_PARAMS | ...), until model_materialize brings them back.
    unsigned released;
};

// Fills cfg for a named architecture. Returns false on an unknown name.
bool model_config(ModelConfig *cfg, const char *name, int width, int in_c, int in_h, int in_w, int classes);
// The names of the model table (kit/model.c) joined by '|' ("tiny|tiny-bn|fmnist|resnet9"), for --help.
const char *model_names(void);

// Builds the layer table, allocates every buffer on `d` for batches of up to max_batch, and
// initialises the parameters from `seed` (the same numbers on every device and every rank).
Model *model_create(const ModelConfig *cfg, Device d, int max_batch, uint64_t seed);
void model_free(Model *m);
// Inference only (lesson 06): the same layers, params, buffers and activations, but no grads, velocity,
// activation gradients, BN saved statistics or dlogits (those pointers are NULL). Only model_forward with
// train = false runs on it; load weights with ckpt_apply. ResNet-9 for batches of 128: 495 MB, against
// 665 MB for model_create (lesson 06's README); on the CPU 45 MB more for its prepared filters (Model.prepared),
// which make its batch-1 forward about 2x faster.
Model *model_create_inference(const ModelConfig *cfg, Device d, int max_batch);
// Pipeline stages (lesson 08) and per-micro-batch activations.
// May the architecture be cut before layer `cut` (0 < cut < its layer count)? Only where ONE activation crosses:
// no layer at or after the cut reads an activation from before it other than layer cut-1's output (a residual's
// skip connection cannot straddle a cut).
bool model_cut_ok(const ModelConfig *cfg, int cut);
// Layers [first, last) of cfg's architecture as a model of their own (see Model.first): forward takes layer
// first-1's output (n, in_c, in_h, in_w) and returns its last layer's (the logits when last is the layer count);
// backward takes that output's gradient as dlogits. Its parameters and BN buffers are the whole model's slice,
// initialised as model_create(cfg, .., seed) would. first and last must be 0, the layer count or model_cut_ok
// cuts, first < last: anything else stops with an error.
Model *model_create_stage(const ModelConfig *cfg, Device d, int max_batch, uint64_t seed, int first, int last);
// A model that SHARES owner's parameters, gradients, momentum, BN buffers and scratch, with activations of its
// own for batches of up to max_batch (at most owner's): one per micro-batch in flight. Backward through a view
// accumulates into the owner's gradients; model_free of a view frees only its activations (free views before
// their owner). Views and their owner share the scratch: run one of them at a time, never two at once.
// Install bn_ops (model_set_bn_ops), on_grads_ready and the round hook on the owner before making views: a view
// copies them.
Model *model_create_view(Model *owner, int max_batch);
// Installs the rounding hook (RoundPoint above; ctx is handed to it). NULL: no hook (lessons 01-09 unchanged).
void model_set_round_hook(Model *m, ModelRoundHook hook, void *ctx);
// 16-bit activation storage, on a CUDA device (the real path of lesson 10's policy): f = LOWP_BF16 or LOWP_FP16
// stores every layer's output but the last, and the gradients of those outputs, in 2 bytes of format f (the
// arena takes half its float32 bytes), and the kit's CUDA kernels read them into float32 and write them rounded
// to nearest even (kit/ops_impl.h, *_act16). Each layer adding into a gradient rounds what it adds; for the kit's
// models that gives the float32 path's numbers exactly (model.c, grad16_exact; a model where it would not is
// refused). The logits and their gradient stay float32
// (the last layer's output moves to Model.logits), and so do parameters, their gradients, BN statistics, the
// input batch and the loss. The GEMMs must already be in format f (device_set_gemm_precision), and read the
// 16-bit operands as they are. The round hook is then not called at ROUND_OUTPUT and ROUND_DOUT for what is
// stored in 16 bits: storing IS that rounding, to the same values (ROUND_DPARAMS and the logits' ROUND_OUTPUT
// still are). LOWP_FP32: float32 storage again. Re-allocates the arena (it holds nothing between steps). A whole model only (no stage, no view); the
// CPU refuses with the reason: its 16 bits are lesson 10's emulation (round_lowp on float32 containers).
void model_store_activations(Model *m, LowpFormat f);
// The gradient of the input, (n, in_c, in_h, in_w) of the last model_backward, written (not added) by each
// backward: what a stage sends back across its cut. NULL for a model whose first layer is the network's first
// (first = 0): nobody needs the image's gradient, so it is not computed.
const float *model_input_grad(const Model *m);

// Re-derives what an inference model keeps from its params (Model.prepared), so that its forward uses the current
// weights: ckpt_apply and model_init call it; call it after changing m->params of an inference model any other
// way. A no-op on a training model, which keeps nothing.
void model_prepare_inference(Model *m);
// Bytes of device memory the model's buffers take (what model_create or model_create_inference allocated; a
// view: only its own, not what it shares with its owner).
size_t model_device_bytes(const Model *m);

// Re-initialises params (PyTorch's defaults: conv/linear U(-1/sqrt(fan_in), +1/sqrt(fan_in)),
// BN gamma 1 beta 0, running mean 0 var 1), zeroes grads and velocity.
void model_init(Model *m, uint64_t seed);

// Forward pass over x (n, in_c, in_h, in_w) on the device, n <= max_batch.
// train: BN uses batch statistics (and updates running ones); otherwise running statistics.
// Returns the logits (n, classes), on the device, valid until the next forward.
const float *model_forward(Model *m, const float *x, int n, bool train);

// Backward pass for the last forward (which must have been in train mode) given dloss/dlogits
// (n, classes) on the device. ACCUMULATES into m->grads: call model_zero_grad first.
void model_backward(Model *m, const float *x, const float *dlogits, int n);
// Layer i alone of model_forward(train = false) on n images (its input: the earlier layers' outputs from the same
// call, or x for the first): what bench/bench_infer.c times layer by layer.
void model_forward_layer_eval(Model *m, int i, const float *x, int n);

void model_zero_grad(Model *m);

// Installs lesson 05's hook into the BN layers (Model.bn_ops; NULL: plain BN again). The activation arena is
// re-planned and re-allocated (the CPU's fused BN + ReLU is the kit's BN, so it is off while a replacement is
// in): call it between steps, never during one.
void model_set_bn_ops(Model *m, const BatchNormLayerOps *ops);

// An owner model's big buffers can be freed and brought back: FSDP frees a unit's full parameters between
// uses, ZeRO-2 its full gradients, ZeRO-1 its momentum, recomputation its activations. The parts:
//   MODEL_PARAMS    params (the BN running statistics, `buffers`, stay: they are small and every rank keeps them)
//   MODEL_GRADS     grads
//   MODEL_VELOCITY  velocity (SGD momentum)
//   MODEL_ACTS      everything a batch needs: the arena (acts, dacts, saved, work), dlogits, dinput, and the
//                   batch's input, labels, loss and pred
// Released pointers are NULL; forward, backward, model_zero_grad and the optimizer on a released part stop with
// an error naming it. A view (model_create_view) cannot release (its owner's buffers are shared): release the
// owner, with no view alive. The allocations are tagged for mem_stats: params and buffers MEM_PARAMS, grads
// MEM_GRADS, velocity MEM_OPTIM, everything else MEM_ACTS.
enum { MODEL_PARAMS = 1u, MODEL_GRADS = 2u, MODEL_VELOCITY = 4u, MODEL_ACTS = 8u };
// Frees `parts` (a part already released is left as it is).
void model_release(Model *m, unsigned parts);
// Allocates `parts` again (those not released are left as they are). Contents are undefined, except grads:
// zeroed, as model_zero_grad leaves them.
void model_materialize(Model *m, unsigned parts);
// Stops with an error naming the part when any of `parts` is released; `what` names the caller ("forward").
void model_require(const Model *m, unsigned parts, const char *what);

// Prints the layer table and parameter count.
void model_print(const Model *m, FILE *out);
// Multiply-accumulates of one forward pass per sample (for FLOP/s figures). Backward is about 2x.
double model_forward_macs(const Model *m);

#ifdef __cplusplus
}
#endif

#endif // KIT_MODEL_H
