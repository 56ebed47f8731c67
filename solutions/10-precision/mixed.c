// mixed.c: the mixed-precision, large-batch step. What you write is marked TODO:
//
//   TODO 5  mixed_step: K micro-batches accumulated into one step; the loss scaled, the gradient unscaled; a step
//           with an inf skipped on every rank; the all-reduce (fp32 or bf16 messages); SGD on the fp32 master;
//           the model's 16-bit weights from it
//   TODO 6  lr_for_batch: the learning rate of a global batch (the linear scaling rule)
//
// One step of lesson 03 is: forward+backward, all-reduce (average), SGD. Here:
//
//   for each of the K micro-batches of this rank's batch (b->n / K samples each):
//       forward and backward in mixed precision (given below): loss x scale / b->n, the model's hook rounds
//       master_grad += the model's gradients                                   (fp32: K sums, not K roundings)
//   master_grad x 1/scale; any inf or NaN on any rank? -> skip the step everywhere (TODO 3)
//   all-reduce master_grad (average over the ranks; fp32, or bf16 messages: TODO 4)
//   SGD on the fp32 master weights; the model's weights := master, rounded where the policy says (TODO 2)
//   the loss scale's update (TODO 3)
//
// PyTorch:
//   with torch.autocast("cuda", dtype=torch.float16):       # the policy: which ops in 16 bits (TODO 2)
//       loss = criterion(model(x), y) / K                    # one micro-batch
//   scaler.scale(loss).backward()                            # x scale; DDP: inside model.no_sync() but the last
//   ...K times, then: scaler.step(optimizer)                 # unscale, skip on inf, else optimizer.step()
//   scaler.update(); optimizer.zero_grad()
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lesson.h"
#include "kit/check.h"
#include "kit/log.h"
#include "kit/trace.h"

#define F sizeof(float)

// ---------------------------------------------------------------- given: create, free, one micro-batch

static LowpFormat format_option(const char *name, const char *value) {
    LowpFormat f = LOWP_FP32;
    if (value && !lowp_parse(value, &f)) die("%s %s: fp32, bf16 or fp16", name, value);
    return f;
}

Mixed *mixed_create(ProcessGroup *pg, Model *m, const TrainOptions *o) {
    Mixed *mx = xcalloc(1, sizeof *mx);
    Device d = m->device;
    size_t n = m->n_params;
    mx->pg = pg;
    mx->model = m;
    mx->format = format_option("--precision", o->precision);
    mx->master_format = format_option("--master", o->master);
    mx->wire = format_option("--allreduce", o->allreduce);
    CHECKF(mx->master_format != LOWP_FP16 && mx->wire != LOWP_FP16, "--master and --allreduce take fp32 or bf16",
           "--master %s --allreduce %s", lowp_name(mx->master_format), lowp_name(mx->wire));
    mx->accumulate = o->accumulate > 0 ? o->accumulate : 1;
    // The master copy is the weights the optimizer owns: counted with the parameters; its gradient with the
    // gradients. In a real run the model's copy would be 2 bytes a parameter; here it is a float (README).
    mx->master = device_alloc_as(d, n * F + 1, MEM_PARAMS);
    mx->master_grad = device_alloc_as(d, n * F + 1, MEM_GRADS);
    device_copy(d, mx->master, m->params, n * F);
    device_memset_zero(d, mx->master_grad, n * F);
    if (mx->master_format != LOWP_FP32) lowp_round_buffer(d, mx->master_format, mx->master, n, NULL);
    if (d != DEVICE_CPU && mx->wire == LOWP_BF16) mx->host = xmalloc(n * F + 1);
    mx->scaler = scaler_init(o);
    model_set_round_hook(m, policy_round_hook, mx);
    master_to_model(mx);
    return mx;
}

void mixed_free(Mixed *mx) {
    if (!mx) return;
    Device d = mx->model->device;
    model_set_round_hook(mx->model, NULL, NULL);
    device_free(d, mx->master);
    device_free(d, mx->master_grad);
    free(mx->host);
    free(mx);
}

// Micro-batch k of K of this rank's batch b: every K-th of its samples, starting at the k-th (n = b->n / K of
// them). The sampler deals a step's positions round the ranks (rank r of W takes r, r + W, r + 2W, ...), so these
// are the positions r + kW, r + kW + KW, ...: exactly what rank r + kW of a world K times larger takes. Both runs
// then take the same step: the same micro-batches, hence the same BN batch statistics, up to the order of the
// float32 sums. (K consecutive slices would give the same gradient without BN, other BN batches with it.)
// Its forward and backward in mixed precision, the gradient of (loss sum x grad_scale) left in the model's grads
// (zeroed first). The model's hook rounds every layer's output, output gradient and weight gradient (TODO 2b);
// the two tensors it does not see are rounded here: the input batch (the first conv reads it in 16 bits) and
// the loss gradient (the last linear layer's output gradient). The loss itself is computed in fp32 from the
// 16-bit logits, as autocast runs cross_entropy. Returns the micro-batch's metrics.
static Metrics micro_forward_backward(Mixed *mx, const Batch *b, int k, int K, float label_smoothing,
                                      float grad_scale) {
    Model *m = mx->model;
    Device d = m->device;
    const int n = b->n / K, classes = m->cfg.classes;
    const size_t image = (size_t)m->cfg.in_c * m->cfg.in_h * m->cfg.in_w;
    CHECKF(n <= m->max_batch, "the model is built for local batch / --accumulate samples",
           "a micro-batch of %d samples for a model of %d", n, m->max_batch);
    int *labels = xmalloc((size_t)n * sizeof(int));  // (n) this micro-batch's, in host memory
    if (K == 1) {  // the whole batch: one copy
        device_copy_to(d, m->input, b->x, (size_t)n * image * F);
        memcpy(labels, b->y, (size_t)n * sizeof(int));
    } else {
        for (int t = 0; t < n; t++) {  // sample k + tK of b (b->x: (b->n, C, H, W) in host memory)
            device_copy_to(d, m->input + (size_t)t * image, b->x + (size_t)(k + t * K) * image, image * F);
            labels[t] = b->y[k + t * K];
        }
    }
    device_copy_to(d, m->labels, labels, (size_t)n * sizeof(int));
    lowp_round_buffer(d, mx->format, m->input, (size_t)n * image, NULL);
    double span = trace_begin("forward");  // the timeline (--trace): one span each way per micro-batch
    const float *logits = model_forward(m, m->input, n, true);  // (n, classes)
    cross_entropy_forward(d, n, classes, logits, m->labels, label_smoothing, m->loss);
    argmax_rows(d, n, classes, logits, m->pred);
    device_memset_zero(d, m->dlogits, (size_t)n * classes * F);  // backward ops accumulate
    cross_entropy_backward(d, n, classes, logits, m->labels, label_smoothing, grad_scale, m->dlogits);
    lowp_round_buffer(d, mx->format, m->dlogits, (size_t)n * classes, NULL);
    trace_endf(span, TRACE_COMPUTE, "forward micro-batch %d of %d", k, K);
    span = trace_begin("backward");
    model_zero_grad(m);
    model_backward(m, m->input, m->dlogits, n);
    trace_endf(span, TRACE_COMPUTE, "backward micro-batch %d of %d", k, K);
    // The metrics, as the kit's train_forward_backward counts them.
    device_copy_from(d, m->host_loss, m->loss, (size_t)n * F);
    device_copy_from(d, m->host_pred, m->pred, (size_t)n * sizeof(int));
    Metrics r = {0, 0, 0};
    for (int t = 0; t < n; t++) {
        r.loss_sum += m->host_loss[t];
        r.correct += m->host_pred[t] == labels[t];
    }
    r.count = n;
    free(labels);
    return r;
}

// SGD on the master weights with master_grad, momentum in the model's velocity: optim_step's arithmetic (one
// sgd_update per run of views with the same weight decay), on the master instead of the model's params.
static void master_sgd(Mixed *mx, const SgdConfig *opt) {
    Model *m = mx->model;
    model_require(m, MODEL_VELOCITY, "master_sgd");
    int i = 0;
    while (i < m->n_views) {
        bool decay = m->views[i].decay;
        size_t start = m->views[i].offset, end = start + m->views[i].count;
        int j = i + 1;
        while (j < m->n_views && m->views[j].decay == decay && m->views[j].offset == end) end += m->views[j++].count;
        sgd_update(m->device, end - start, mx->master + start, mx->master_grad + start, m->velocity + start, opt->lr,
                   opt->momentum, decay ? opt->weight_decay : 0.0f, opt->nesterov);
        i = j;
    }
}

// The gradient average over the ranks in the wire format: fp32 is the kit's all-reduce (lesson 03's); bf16 is
// TODO 4, on host memory (a GPU's gradient goes to the host and back).
static void allreduce_master_grad(Mixed *mx) {
    Model *m = mx->model;
    size_t n = m->n_params;
    if (mx->wire == LOWP_FP32) {
        pg_allreduce_avg(mx->pg, mx->master_grad, n);
        return;
    }
    if (!mx->host) {
        allreduce_bf16_avg(mx->pg, mx->master_grad, n);
        return;
    }
    device_copy_from(m->device, mx->host, mx->master_grad, n * F);
    allreduce_bf16_avg(mx->pg, mx->host, n);
    device_copy_to(m->device, mx->master_grad, mx->host, n * F);
}

// ---------------------------------------------------------------- the step (TODO 5)

// TODO 5: one optimizer step on this rank's batch b, in K = mx->accumulate micro-batches (micro_forward_backward,
//   above, runs one). Goal: the step W x K ranks of lesson 03 would take on these micro-batches, made in fp32 on
//   the master weights, from gradients that the loss scale kept out of fp16's underflow (README section 8 has
//   the order of the parts). Decide before writing:
//   - the gradient scale that makes the K micro-batch gradients add up to the gradient of the MEAN loss over b,
//     with the loss scale on top (which the update must never see);
//   - where the K gradients are summed, and in what precision (the model's gradients are 16-bit values, and each
//     backward starts from zero);
//   - what a step whose gradient holds an inf or NaN on ANY rank does on EVERY rank (TODO 3), and what it must
//     leave untouched;
//   - which all-reduce (--allreduce), what the update works on, and what the model's weights are afterwards
//     (--master, TODO 2c).
//   Then (given below) BN's running statistics from rank 0, as lesson 03's ddp_step, and the timing. The kit
//   calls: the hints (README, `make grade HINTS=full`).
//   Why the master at all: an update lr x g smaller than half the spacing of 16-bit numbers around a weight
//   rounds back to the same weight: bf16 has 8 bits of mantissa, so w = 1 ignores every update below 2^-9.
//   Summed over steps in fp32 those updates count; rounded each time they are lost.
// PyTorch: scaler.scale(loss / K).backward() per micro-batch (K - 1 of them inside ddp_model.no_sync());
//   scaler.step(optimizer) (unscale_, the inf check, optimizer.step() or a skip); scaler.update()
Metrics mixed_step(Mixed *mx, const Batch *b, const SgdConfig *opt, float label_smoothing) {
    Model *m = mx->model;
    const Device d = m->device;
    const size_t n = m->n_params;
    const int K = mx->accumulate;
    CHECKF(b->n % K == 0, "the local batch (--batch-size / ranks) must divide by --accumulate",
           "a batch of %d samples in %d micro-batches", b->n, K);
    double start = time_now(), compute = 0.0, comm = 0.0;
    Metrics r = {0, 0, 0};
    // BEGIN SOLUTION
    const float scale = mx->scaler.scale, grad_scale = scale / (float)b->n;  // (mean over K x micro) x scale
    for (int k = 0; k < K; k++) {
        Metrics mk = micro_forward_backward(mx, b, k, K, label_smoothing, grad_scale);
        r.loss_sum += mk.loss_sum, r.correct += mk.correct, r.count += mk.count;
        if (k == 0) device_copy(d, mx->master_grad, m->grads, n * F);
        else add_inplace(d, n, mx->master_grad, m->grads);
    }
    if (scale != 1.0f) scale_inplace(d, n, mx->master_grad, 1.0f / scale);
    bool found_inf = scaler_found_inf(mx->pg, count_nonfinite(d, n, mx->master_grad) > 0);
    double backward_done = time_now();
    compute += backward_done - start;
    if (!found_inf) {
        allreduce_master_grad(mx);
        double reduced = time_now();
        comm += reduced - backward_done;
        master_sgd(mx, opt);
        if (mx->master_format != LOWP_FP32) lowp_round_buffer(d, mx->master_format, mx->master, n, NULL);
        master_to_model(mx);
        compute += time_now() - reduced;
    }
    scaler_update(&mx->scaler, found_inf);
    // STARTER: (void)d, (void)n, (void)master_sgd, (void)allreduce_master_grad, (void)opt;
    // STARTER: r = micro_forward_backward(mx, b, 0, K, label_smoothing, 1.0f / (float)(b->n / K));  // no update yet
    // STARTER: compute += time_now() - start;
    // END SOLUTION
    double bn_start = time_now();
    // BN running statistics: each rank (and each micro-batch) updated its own. Rank 0's win, as in lesson 03.
    if (m->n_buffers > 0) pg_broadcast(mx->pg, m->buffers, m->n_buffers, 0);
    comm += time_now() - bn_start;
    mx->compute_seconds += compute;
    mx->comm_seconds += comm;
    mx->steps++;
    return r;
}

// ---------------------------------------------------------------- the learning rate of a large batch (TODO 6)

// TODO 6: the peak learning rate for a global batch under --lr-rule. "fixed": base_lr was tuned for some batch
//   and stays as it is. "linear": base_lr was tuned for ref_batch; a batch k times larger takes ONE step where
//   the small batch took k, each averaging gradients in about the same direction. What rate makes that one step
//   cover the distance of the k small ones (README section 9 derives it: Goyal et al. 2017), and what must the
//   arithmetic not lose for batches of thousands? An unknown rule keeps base_lr (the options parser refuses it
//   first).
// PyTorch: no built-in: lr = base_lr * global_batch / 256 (torchvision's reference scripts), then a
//   LinearLR(start_factor=...) warmup.
float lr_for_batch(const char *rule, float base_lr, int global_batch, int ref_batch) {
    // BEGIN SOLUTION
    if (rule && strcmp(rule, "linear") == 0) return (float)((double)base_lr * global_batch / ref_batch);
    return base_lr;
    // STARTER: (void)rule, (void)global_batch, (void)ref_batch;
    // STARTER: return base_lr;
    // END SOLUTION
}
