// train.c: lesson 10, lesson 03's data-parallel program in mixed precision (bf16, or fp16 with loss scaling;
// fp32 master weights; an optional bf16 gradient all-reduce) and with large global batches (micro-batches
// accumulated into one step, the learning rate scaled with the batch).
//
//   scripts/launch.sh 2 ./train --precision bf16                                   bf16, fp32 master weights
//   scripts/launch.sh 2 ./train --precision fp16                                   fp16, dynamic loss scaling
//   scripts/launch.sh 2 ./train --precision fp16 --loss-scale none                 the underflow it prevents
//   scripts/launch.sh 2 ./train --precision bf16 --master bf16                     the updates a bf16 weight loses
//   scripts/launch.sh 2 ./train --batch-size 512 --accumulate 4 --lr-rule linear   a large batch on small memory
//
// Read it top to bottom: options (the kit's CLI_PREC, plus --stop-at and --save-params, read here), then lesson
// 03's loop (ddp_run_open / ddp_run_epochs / ddp_run_report) with its hooks set to this lesson's:
//
//   make_model      the model for local batch / --accumulate samples (the memory accumulation saves)
//   step            mixed_step (TODO 5, mixed.c), which rounds through the policy (TODO 2) and the formats (1)
//   evaluate        the test split with the input rounded as in training
//   check_replicas  what must agree across ranks: the master weights, the model's weights, the BN statistics
//   after_epoch     the precision report: loss scale, skipped steps, fp16 gradient underflow
// and the learning rate of the global batch (TODO 6) set before the loop builds its schedule.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit/check.h"
#include "kit/ckpt.h"
#include "kit/cli.h"
#include "kit/cpu_bf16.h"
#include "kit/data.h"
#include "kit/device.h"
#include "kit/dist.h"
#include "kit/log.h"
#include "kit/model.h"
#include "kit/ops.h"
#include "kit/optim.h"
#include "kit/trace.h"
#include "kit/train.h"
#include "lesson.h"

#ifndef AUTOGRADER

// ---------------------------------------------------------------- the hooks into lesson 03's loop

typedef struct {
    Mixed *mx;
    LowpStats run_stats;               // the weight gradients' rounding counts of the whole run, all ranks
    double stalled, moved;             // updates with a nonzero gradient that left a master weight unchanged / not
    float *before, *after, *grad;      // (n_params) host copies for that count
    bool count_stalled;
    long long skipped_before;          // the scaler's skipped count before this step, and at the epoch's start
    long long epoch_skipped, epoch_step;
    bool diverged;                     // the run never recovers (never_recovers): stopped, it ends non-zero
} PrecRun;

// Does this CPU multiply in format f (bf16: AVX512-BF16 or AMX-BF16; fp16: AVX512-FP16 or AMX-FP16)? Read from
// /proc/cpuinfo's flags (Linux).
static bool cpu_has_lowp(LowpFormat f) {
    const char *vec = f == LOWP_BF16 ? " avx512_bf16" : " avx512_fp16", *amx = f == LOWP_BF16 ? " amx_bf16" : " amx_fp16";
    FILE *file = fopen("/proc/cpuinfo", "r");
    char line[8192];
    bool yes = false;
    while (file && !yes && fgets(line, sizeof line, file))
        if (strncmp(line, "flags", 5) == 0) yes = strstr(line, vec) || strstr(line, amx);
    if (file) fclose(file);
    return yes;
}

// Does the policy (TODO 2a) store every layer's output in 16 bits, but the logits? Then a GPU can store them so.
static bool policy_stores_low(const Model *m, LowpFormat f) {
    for (int i = 0; i < m->n_layers - 1; i++)
        if (policy_layer(m->layers[i].kind, f) == PREC_FP32) return false;
    return f != LOWP_FP32;
}

// Which path runs conv and linear under --precision, said on the program's first lines. On a CUDA device the
// kit's GEMMs take 16-bit inputs for real (device_set_gemm_precision, before the model exists: tensor cores,
// float32 sums), and where the policy stores every activation in 16 bits the model stores them and their gradients
// in 2 bytes (model_store_activations: half their memory; the round hook's ROUND_OUTPUT and ROUND_DOUT are done by
// storing);
// on a CPU where oneDNN has a bf16 kernel (AMX, AVX512-BF16: kit/cpu_bf16.h) the GEMMs take bf16 inputs for real
// too; on any other CPU the policy's rounding of float32 is the whole of it (the emulation: numerics without the
// speed).
static void say_gemm_path(const DdpRun *r, const Model *m, LowpFormat f) {
    Device d = pg_device(r->pg);
    const char *name = lowp_name(f);
    const bool cuda = d == DEVICE_CUDA, emu = cuda && strcmp(device_name(d), "cuda-emu") == 0;
    const char *why = NULL;
    if (!r->is_main) return;
    const char *where = emu ? "; run in the CUDA emulator (the tensor-core path's numerics, not its speed)" : "";
    if (cuda) printf("conv engine: %s\n", device_conv_engine(d));
    if (f == LOWP_FP32 && cuda && device_gemm_precision(d) == GEMM_TF32)  // --tf32 (kit/device.h)
        printf("precision path: TF32 tensor cores for the convolutions (10-bit mantissa inputs, float32 "
               "sums), linear in float32%s\n", where);
    else if (f == LOWP_FP32)
        printf("precision path: float32 (%s)%s\n", cuda ? "cuDNN or cuBLAS SGEMM: the conv engine above" : "OpenBLAS SGEMM", where);
    else if (cuda && m->act_format == f)
        printf("precision path: tensor cores: %s GEMMs, float32 accumulation; activations and their gradients "
               "stored in 2 bytes (%s); BN statistics, the loss and the master weights in float32%s\n", name, name,
               where);
    else if (cuda)
        printf("precision path: tensor cores: cuBLAS %s GEMMs, float32 accumulation (conv and linear inputs stored "
               "in 2 bytes; activations in float32 containers: the policy keeps some layer's output in float32)%s\n",
               name, where);
    else if (device_gemm_precision(d) == GEMM_BF16)
        printf("precision path: %s: oneDNN bf16 GEMMs (%s), float32 accumulation (conv and linear inputs stored in %zu "
               "bytes; activations in float32 containers, rounded by the policy); BN statistics, the loss and the "
               "master weights in float32\n", cpu_bf16_isa(), cpu_bf16_impl(), cpu_bf16_elem_bytes());
    else if (f == LOWP_BF16 && !cpu_bf16_available(&why))
        printf("precision path: emulated: float32 rounded to bf16 (no real bf16 GEMMs here: %s)\n", why);
    else if (cpu_has_lowp(f))
        printf("precision path: emulated: float32 rounded to %s (this CPU has %s instructions, but oneDNN 2.x has no "
               "fp16 matmul for the CPU: the kit's CPU GEMMs are float32 or bf16)\n", name, name);
    else
        printf("precision path: emulated: float32 rounded to %s (this CPU has no %s instructions: AVX512-FP16, "
               "AMX-FP16; the kit's CPU GEMMs are float32 or bf16)\n", name, name);
}

// The model for one micro-batch: the local batch split into --accumulate parts, one after the other.
static Model *make_model(void *ctx, DdpRun *r, const ModelConfig *cfg) {
    (void)ctx;
    LowpFormat f = LOWP_FP32;
    if (r->o->precision) lowp_parse(r->o->precision, &f);  // checked again by mixed_create, with the message
    Device d = pg_device(r->pg);
    if (d == DEVICE_CUDA && f != LOWP_FP32) device_set_gemm_precision(d, f == LOWP_BF16 ? GEMM_BF16 : GEMM_FP16);
    if (d == DEVICE_CPU && f == LOWP_BF16 && cpu_bf16_available(NULL)) device_set_gemm_precision(d, GEMM_BF16);
    int K = r->o->accumulate > 0 ? r->o->accumulate : 1;
    if (r->local_batch % K != 0)
        die("--batch-size %d over %d rank(s) is a local batch of %d, which does not split into --accumulate %d "
            "micro-batches\n  HINT: a --batch-size that is a multiple of ranks x accumulate (%d)", r->o->batch_size,
            pg_world(r->pg), r->local_batch, K, pg_world(r->pg) * K);
    Model *m = model_create(cfg, d, r->local_batch / K, r->o->seed);
    if (d == DEVICE_CUDA && policy_stores_low(m, f)) model_store_activations(m, f);
    say_gemm_path(r, m, f);
    return m;
}

// Which master weights with a nonzero gradient did the update leave as they were? (the updates lost to a bf16
// master). Host copies before and after the step: counted on the CPU, and on a GPU only with --master bf16.
static Metrics step(void *ctx, DdpRun *r, const Batch *b) {
    PrecRun *pr = ctx;
    Mixed *mx = pr->mx;
    size_t n = mx->model->n_params;
    Device d = mx->model->device;
    long long skipped = mx->scaler.skipped;
    float scale = mx->scaler.scale;
    // The peaks from here on: the training's, not the set-up's (lessons 09 and 11 do the same). On a GPU with 16-bit
    // storage the model was first built with float32 activations, then re-allocated in 2 bytes (make_model): that
    // brief float32 arena is not what a step holds, and PyTorch's peak, which bench/ compares with, starts here too.
    if (mx->steps == 0) mem_stats_reset_peak();
    if (pr->count_stalled) device_copy_from(d, pr->before, mx->master, n * sizeof(float));
    Metrics m = mixed_step(mx, b, &r->opt, r->o->label_smoothing);
    if (mx->scaler.skipped != skipped) trace_instant(TRACE_STEP, "skipped step %lld (inf or NaN)", r->run.step);
    if (mx->scaler.scale != scale) trace_instant(TRACE_STEP, "loss scale %g -> %g", scale, mx->scaler.scale);
    if (pr->count_stalled && mx->scaler.skipped == skipped) {
        device_copy_from(d, pr->after, mx->master, n * sizeof(float));
        device_copy_from(d, pr->grad, mx->master_grad, n * sizeof(float));
        for (size_t i = 0; i < n; i++)
            if (pr->grad[i] != 0.0f) {
                if (pr->after[i] == pr->before[i]) pr->stalled++;
                else pr->moved++;
            }
    }
    return m;
}

// A run that never recovers stops, says why, and ends non-zero (a loss curve of NaN that exits 0 looks like a
// finished run to a job script). Never recovering means what no loss scale explains. Every rank decides alike:
// the skips are agreed (scaler_found_inf, TODO 3a), the scale, the step counts and the epoch's loss the same.
//   - fp32 or bf16 with a static scale of 1 (their default): a step skipped for a NaN or Inf gradient. Both
//     have float32's exponent range: the loss or the weights are not finite. At that step.
//   - any format: every step of an epoch skipped with the scale at its end 1 or less (a dynamic scale halves at
//     each skip: 17 in a row take fp16's 2^16 below 1). At the epoch's end.
//   - any format: the last epoch's mean training loss is NaN or Inf (an fp16 forward that overflows). At the end.
static bool never_recovers(PrecRun *pr, DdpRun *r, const char *why) {
    progress_end(&r->log.bar);
    if (r->is_main)
        fprintf(stderr, "error: the run diverged and never recovers: %s; stopped after step %lld, nothing saved\n"
                "  HINT: a lower --lr, more --warmup-epochs, or --lr-rule fixed\n", why, r->run.step);
    pr->diverged = true;
    return true;
}

static bool after_step(void *ctx, DdpRun *r, const Batch *b, const Metrics *batch) {
    PrecRun *pr = ctx;
    (void)b, (void)batch;
    const LossScaler *s = &pr->mx->scaler;
    bool skipped = s->skipped > pr->skipped_before;
    pr->skipped_before = s->skipped;
    if (skipped && !s->dynamic && s->scale <= 1.0f && pr->mx->format != LOWP_FP16) {
        char why[160];
        snprintf(why, sizeof why, "a NaN or Inf gradient at step %lld in %s with a loss scale of %g, which no "
                 "scale explains", r->run.step, lowp_name(pr->mx->format), (double)s->scale);
        return never_recovers(pr, r, why);
    }
    return r->o->stop_at > 0 && r->run.step >= r->o->stop_at;
}

// The test split through the model's (rounded) weights, its input rounded as in training, in pieces of the
// model's size (the loader's batches are the local batch; the model holds local batch / --accumulate).
static Metrics evaluate(void *ctx, DdpRun *r) {
    PrecRun *pr = ctx;
    Model *m = pr->mx->model;
    Device d = m->device;
    const int k = m->cfg.classes;
    const size_t image = (size_t)m->cfg.in_c * m->cfg.in_h * m->cfg.in_w;
    Metrics acc = {0, 0, 0};
    Loader *L = r->data.test_loader;
    loader_start_epoch(L, 0, 0);
    const Batch *b;
    while ((b = loader_next(L, NULL)) != NULL) {
        for (int at = 0; at < b->n; at += m->max_batch) {
            int n = b->n - at < m->max_batch ? b->n - at : m->max_batch;
            device_copy_to(d, m->input, b->x + (size_t)at * image, (size_t)n * image * sizeof(float));
            device_copy_to(d, m->labels, b->y + at, (size_t)n * sizeof(int));
            lowp_round_buffer(d, pr->mx->format, m->input, (size_t)n * image, NULL);
            const float *logits = model_forward(m, m->input, n, false);
            cross_entropy_forward(d, n, k, logits, m->labels, 0.0f, m->loss);
            argmax_rows(d, n, k, logits, m->pred);
            device_copy_from(d, m->host_loss, m->loss, (size_t)n * sizeof(float));
            device_copy_from(d, m->host_pred, m->pred, (size_t)n * sizeof(int));
            for (int i = 0; i < n; i++) {
                acc.loss_sum += m->host_loss[i];
                acc.correct += m->host_pred[i] == b->y[at + i];
            }
            acc.count += n;
        }
    }
    return ddp_global_metrics(r->pg, acc);
}

// Every rank must hold the same master (the update), the same model weights (rounded from it) and, after rank
// 0's broadcast, the same BN statistics: a bf16 all-reduce that left the ranks with different roundings, or a
// skip decided on one rank only, shows here.
static void check_replicas(void *ctx, DdpRun *r, const char *what) {
    PrecRun *pr = ctx;
    Model *m = pr->mx->model;
    char name[128];
    snprintf(name, sizeof name, "master weights, %s", what);
    pg_check_identical(r->pg, pr->mx->master, m->n_params, name);
    pg_check_identical(r->pg, m->params, m->n_params, what);
    snprintf(name, sizeof name, "BN statistics, %s", what);
    if (m->n_buffers) pg_check_identical(r->pg, m->buffers, m->n_buffers, name);
}

// The weight gradients' rounding counts since the last report, summed over the ranks, added to the run's.
static LowpStats take_grad_stats(PrecRun *pr, ProcessGroup *pg) {
    LowpStats *s = &pr->mx->grad_stats;
    double v[3] = {(double)s->nonzero, (double)s->underflow, (double)s->overflow};
    pg_allreduce_sum_double_host(pg, v, 3);
    *s = (LowpStats){0, 0, 0};
    LowpStats e = {(size_t)v[0], (size_t)v[1], (size_t)v[2]};
    pr->run_stats.nonzero += e.nonzero, pr->run_stats.underflow += e.underflow, pr->run_stats.overflow += e.overflow;
    return e;
}

static double share(size_t part, size_t whole) { return whole ? (double)part / (double)whole : 0.0; }

static bool after_epoch(void *ctx, DdpRun *r) {
    PrecRun *pr = ctx;
    const Mixed *mx = pr->mx;
    LowpStats e = take_grad_stats(pr, r->pg);
    if (r->is_main && mx->format != LOWP_FP32)
        printf("  precision: loss scale %g, %lld step(s) skipped so far; %s weight gradients this epoch: %.4f%% "
               "underflowed to 0, %.4f%% overflowed (of %zu nonzero)\n", mx->scaler.scale, mx->scaler.skipped,
               lowp_name(mx->format), 100.0 * share(e.underflow, e.nonzero), 100.0 * share(e.overflow, e.nonzero),
               e.nonzero);
    long long steps = r->run.step - pr->epoch_step, skipped = mx->scaler.skipped - pr->epoch_skipped;
    pr->epoch_step = r->run.step, pr->epoch_skipped = mx->scaler.skipped;
    if (steps > 0 && skipped == steps && mx->scaler.scale <= 1.0f) {
        char why[160];
        snprintf(why, sizeof why, "every one of the %lld steps of epoch %d skipped, and the loss scale down to %g",
                 steps, r->run.epoch, (double)mx->scaler.scale);
        return never_recovers(pr, r, why);
    }
    return false;
}

// ---------------------------------------------------------------- the report

static void print_setup(const Mixed *mx, const DdpRun *r, const TrainOptions *o, float lr) {
    const char *f = lowp_name(mx->format);
    if (mx->format == LOWP_FP32) printf("precision: fp32 everywhere (nothing rounded)");
    else
        printf("precision: conv and linear in %s (inputs and weights %s, sums fp32), bn/relu/pools/add in fp32, "
               "every activation and gradient stored %s", f, f, f);
    printf("; master weights %s; all-reduce %s", lowp_name(mx->master_format), lowp_name(mx->wire));
    if (mx->scaler.dynamic)
        printf("; loss scale dynamic from %g (x%g after %d good steps, x%g on an overflow)\n", mx->scaler.scale,
               mx->scaler.growth, mx->scaler.growth_interval, mx->scaler.backoff);
    else printf("; loss scale %g (static)\n", mx->scaler.scale);
    printf("batch: global %d = %d rank(s) x %d micro-batch(es) x %d samples (the model holds %d)\n", o->batch_size,
           pg_world(r->pg), mx->accumulate, r->local_batch / mx->accumulate, mx->model->max_batch);
    if (lr != o->lr)
        printf("lr: %s rule: --lr %g x global batch %d / --lr-ref-batch %d = %g (the schedule's peak)\n", o->lr_rule,
               o->lr, o->batch_size, o->lr_ref_batch, lr);
}

// Rank 0 writes the master weights (with the momentum and BN statistics) in lesson 04's format.
static void save_params(PrecRun *pr, DdpRun *r, const TrainOptions *o, const char *path) {
    Model *m = pr->mx->model;
    if (!r->is_main) return;
    device_copy(m->device, m->params, pr->mx->master, m->n_params * sizeof(float));  // the training is over
    CkptState st;
    memset(&st, 0, sizeof st);
    st.model = m->cfg;
    snprintf(st.dataset, sizeof st.dataset, "%s", o->dataset);
    st.world = pg_world(r->pg), st.global_batch = o->batch_size, st.steps_per_epoch = r->steps_per_epoch;
    st.epochs = o->epochs, st.epoch = r->run.epoch, st.batch_in_epoch = r->run.batch_in_epoch, st.step = r->run.step;
    st.seed = o->seed, st.peak_lr = r->sched.peak_lr, st.final_lr = r->sched.final_lr;
    st.warmup_steps = r->sched.warmup_steps, st.total_steps = r->sched.total_steps, st.decay = (int)r->sched.decay;
    st.momentum = o->momentum, st.weight_decay = o->weight_decay, st.nesterov = o->nesterov;
    char err[1024];
    if (ckpt_save(path, m, &st, err, sizeof err) != 0) die("--save-params: %s", err);
    printf("saved: %s (master weights after step %lld)\n", path, r->run.step);
}

// Every output, checked by rank 0 before the first step (a --save-params that cannot be written would be found
// out after the whole training), its verdict agreed on every rank; nothing of another run replaced (the kit's
// check, kit/ckpt.h: --overwrite allows it). Returns 0, or -1 on every rank after an "error:" line.
static int check_outputs(DdpRun *r, const TrainOptions *o) {
    char err[2400] = "";
    if (r->is_main) {
        CkptState id;
        train_identity(&id, &r->ddp.model->cfg, o, &r->sched);
        CkptOwner me = {.id = &id, .overwrite = o->overwrite};  // no --resume here: a file is never continued
        if (o->save_params &&
            ckpt_check_file_owner("--save-params", o->save_params, CKPT_OUT_CHECKPOINT, &me, err, sizeof err) != 0) {
        } else if (o->metrics) {
            ckpt_check_file_owner("--metrics", o->metrics, CKPT_OUT_REPORT, &me, err, sizeof err);
        }
        if (err[0]) fprintf(stderr, "error: %s\n", err);
    }
    double bad = err[0] ? 1.0 : 0.0;
    pg_allreduce_sum_double_host(r->pg, &bad, 1);  // rank 0's verdict: every rank stops, or none
    return bad != 0.0 ? -1 : 0;
}

// The end of a run: did its last epoch train on finite losses? (rank 0's log, agreed)
static bool ended_finite(DdpRun *r) {
    double bad = r->is_main && !isfinite(r->log.last_loss) ? 1.0 : 0.0;
    pg_allreduce_sum_double_host(r->pg, &bad, 1);
    return bad == 0.0;
}

static int train(ProcessGroup *pg, const TrainOptions *o) {
    // TODO 6 is applied here, once: the schedule (warmup, decay) is built from this peak.
    TrainOptions scaled = *o;
    scaled.lr = lr_for_batch(o->lr_rule, o->lr, o->batch_size, o->lr_ref_batch);
    PrecRun pr = {0};
    TrainHooks hooks = {.ctx = &pr, .make_model = make_model, .step = step, .after_step = after_step,
                        .after_epoch = after_epoch, .evaluate = evaluate, .check_replicas = check_replicas};
    DdpRun r;
    ddp_run_open(&r, pg, &scaled, &hooks);
    pr.mx = mixed_create(pg, r.ddp.model, &scaled);  // after rank 0's broadcast: every master starts equal
    size_t n = r.ddp.model->n_params;
    pr.count_stalled = pg_device(pg) == DEVICE_CPU || pr.mx->master_format != LOWP_FP32;
    if (pr.count_stalled) {
        pr.before = xmalloc(n * sizeof(float) + 1);
        pr.after = xmalloc(n * sizeof(float) + 1);
        pr.grad = xmalloc(n * sizeof(float) + 1);
    }
    if (r.is_main) print_setup(pr.mx, &r, o, scaled.lr);
    if (check_outputs(&r, &scaled) != 0) {
        mixed_free(pr.mx);
        free(pr.before), free(pr.after), free(pr.grad);
        model_free(ddp_run_close(&r));
        return 1;
    }
    ddp_run_epochs(&r);
    if (!pr.diverged && r.run.step > 0 && !ended_finite(&r)) {
        char why[96];
        snprintf(why, sizeof why, "the last epoch's mean training loss is %g", r.log.last_loss);
        never_recovers(&pr, &r, why);
    }
    r.ddp.compute_seconds = pr.mx->compute_seconds, r.ddp.comm_seconds = pr.mx->comm_seconds;
    take_grad_stats(&pr, pg);  // the part of an epoch a --stop-at cut short
    const LowpStats *s = &pr.run_stats;
    if (r.is_main && pr.count_stalled && pr.stalled + pr.moved > 0)
        printf("precision: %.4f%% of the master weights' updates with a nonzero gradient left the weight unchanged "
               "(%.0f of %.0f; master %s)\n", 100.0 * pr.stalled / (pr.stalled + pr.moved), pr.stalled,
               pr.stalled + pr.moved, lowp_name(pr.mx->master_format));
    // peak_mib: the most this process's kit allocations held at once from the first step on (kit/mem.h: the GPU's
    // memory on CUDA, conv's work and the GEMMs' 16-bit input copies included; cuBLAS's and cuDNN's own allocations
    // and the CUDA context are not), what a precision saves.
    char extra[320];
    snprintf(extra, sizeof extra, "precision=%s master=%s allreduce=%s accumulate=%d loss_scale=%g skipped=%lld "
             "underflow=%.3g peak_mib=%.1f", lowp_name(pr.mx->format), lowp_name(pr.mx->master_format),
             lowp_name(pr.mx->wire), pr.mx->accumulate, pr.mx->scaler.scale, pr.mx->scaler.skipped,
             share(s->underflow, s->nonzero), (double)mem_stats().peak_total / (1 << 20));
    ddp_run_report(&r, extra);
    if (o->save_params && !pr.diverged) save_params(&pr, &r, &scaled, o->save_params);
    mixed_free(pr.mx);
    free(pr.before), free(pr.after), free(pr.grad);
    model_free(ddp_run_close(&r));
    return pr.diverged ? 1 : 0;
}

// ---------------------------------------------------------------- main

int main(int argc, char **argv) {
    TrainOptions o;
    cli_parse(&o, argc, argv, CLI_DIST | CLI_PREC);  // lesson 03's options plus --precision ... --save-params
    cli_apply_dataset_defaults(&o);
    Device dev;
    device_parse(o.device, &dev, true);  // quiet: rank 0 names the device in the process group's line
    ProcessGroup *pg = pg_init(&argc, &argv, o.backend, dev, o.timeout_s);
    int rc = train(pg, &o);
    pg_finalize(pg);
    return rc;
}
#endif  // AUTOGRADER
