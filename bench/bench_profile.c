// bench/bench_profile.c: where a float32 training step of the kit spends its GPU time, per kernel and per conv
// layer, against the SGEMM ceiling: the profile that says what to make faster next (bench/GPU.md, "Profile").
//
//   bench_profile [--model resnet9] [--batch 512] [--steps 5] [--sgemm-n 8192] [--conv-budget-mb MB]
//                 [--precision fp32|bf16|fp16]
//
// Prints Markdown tables on stdout, all float32 with TF32 off (--precision bf16 or fp16: tables 1 and 2 of lesson
// 10's GPU path instead, 16-bit GEMMs and activations stored in 2 bytes, model_store_activations; table 3 is then
// each conv layer on cuDNN with NCHW data against NHWC, the layout question of bench/GPU.md):
//   1. the step: images/s of the bare step (forward, loss, backward, SGD, no host synchronisation inside),
//      and of train_forward_backward + optim_step (the lessons' step: it reads the batch's loss and predictions
//      back, and the loss checks the labels on the host), whose difference is what those synchronisations cost;
//   2. per kit kernel (cuda_profile_*, kit/cuda/cuda_context.h): calls and GPU ms per step, % of the step; the
//      rest of the step is cuBLAS, memsets and idle time;
//   3. per conv layer, forward and backward: the whole op (CUDA events), the kit's kernels inside it (im2col,
//      col2im, the layout kernels), the rest (the SGEMMs), and the TFLOP/s of each against cuBLAS SGEMM on
//      n^3 (--sgemm-n), the practical ceiling of a GEMM-based conv.
// Without a usable GPU it prints "bench_profile: skipped: no GPU (why)" and exits 0. In the CUDA emulator
// (make EMU=1) it runs, but every time is the emulator's host time: the tables only show that it works.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/gpu_step.h"
#include "kit/check.h"
#include "kit/device.h"
#include "kit/log.h"
#include "kit/model.h"
#include "kit/ops.h"
#include "kit/optim.h"
#include "kit/rng.h"
#include "kit/train.h"
#ifdef KIT_CUDA
#include "kit/cuda/conv_cudnn.h"
#include "kit/cuda/cuda_context.h"
#include "kit/cuda_check.h"
#endif

#ifdef KIT_CUDA
enum { MAX_ROWS = 64 };

// The lessons' step on a batch already on the host (its copy included, as a lesson without the loader's
// overlap pays it).
static void lesson_step(Model *m, const Batch *b) {
    train_forward_backward(m, b, 0.0f, 1.0f / (float)b->n);
    optim_step(m, &GPU_BENCH_OPT);
}

// Milliseconds per step over `steps` steps after 2 warm-up steps; lesson: the lessons' step, else the bare one.
static double step_ms(Model *m, const Batch *b, int steps, bool lesson) {
    for (int i = 0; i < 2; i++) lesson ? lesson_step(m, b) : gpu_train_step(m, b->n);
    device_synchronize(DEVICE_CUDA);
    const double start = time_now();
    for (int i = 0; i < steps; i++) lesson ? lesson_step(m, b) : gpu_train_step(m, b->n);
    device_synchronize(DEVICE_CUDA);
    return (time_now() - start) / steps * 1e3;
}

// Milliseconds per call of run(ctx), which queues work on the compute stream: one warm-up call, then `reps` calls
// between two CUDA events. A call that returns false (nothing queued: a cuDNN pass with no algorithm) makes it -1.
static double events_ms(bool (*run)(void *ctx), void *ctx, int reps) {
    if (!run(ctx)) return -1.0;
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    CUDA_CHECK(cudaEventRecord(e0, cuda_stream()));
    for (int i = 0; i < reps; i++) run(ctx);
    CUDA_CHECK(cudaEventRecord(e1, cuda_stream()));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    return ms / reps;
}

typedef struct {
    int n;
    const float *a, *b;
    float *c;
} Sgemm;

static bool sgemm_run(void *ctx) {
    const Sgemm *g = ctx;
    const float one = 1.0f, zero = 0.0f;
    CUBLAS_CHECK(cublasSgemm(cuda_cublas(), CUBLAS_OP_N, CUBLAS_OP_N, g->n, g->n, g->n, &one, g->a, g->n, g->b, g->n,
                             &zero, g->c, g->n));
    return true;
}

// cuBLAS SGEMM on n x n x n, TF32 off: TFLOP/s.
static double sgemm_ceiling(int n) {
    size_t nn = (size_t)n * n;
    float *a = gpu_random(nn, 4), *b = gpu_random(nn, 5), *c = device_alloc(DEVICE_CUDA, nn * sizeof(float));
    Sgemm g = {n, a, b, c};
    const double ms = events_ms(sgemm_run, &g, 5);
    device_free(DEVICE_CUDA, a), device_free(DEVICE_CUDA, b), device_free(DEVICE_CUDA, c);
    return 2.0 * n * (double)n * n / (ms * 1e-3) / 1e12;
}

// Table 2: the kit's kernels over `steps` bare steps.
static void kernel_table(Model *m, int batch, int steps, double bare_ms) {
    CudaProfileRow rows[MAX_ROWS];
    gpu_train_step(m, batch);
    cuda_profile_start();
    for (int i = 0; i < steps; i++) gpu_train_step(m, batch);
    int n = cuda_profile_stop(rows, MAX_ROWS);
    printf("\n## The kit's kernels in one step (GPU time, %d steps profiled)\n\n", steps);
    printf("| kernel | calls/step | ms/step | %% of step |\n|---|---:|---:|---:|\n");
    double total = 0.0;
    for (int i = 0; i < n && i < MAX_ROWS; i++) {
        double ms = rows[i].ms / steps;
        total += ms;
        printf("| %s | %.0f | %.3f | %.1f |\n", rows[i].kernel, (double)rows[i].calls / steps, ms, 100.0 * ms / bare_ms);
    }
    printf("| **all kit kernels** | | %.3f | %.1f |\n", total, 100.0 * total / bare_ms);
    printf("| rest: cuBLAS GEMMs, memsets, idle | | %.3f | %.1f |\n", bare_ms - total, 100.0 * (bare_ms - total) / bare_ms);
}

typedef struct {
    double ms, kernels_ms;  // the whole op, and the kit's kernels inside it (per pass)
} OpTime;

// One float32 conv pass of the kit (forward, or backward with dx and dw as training runs it before BN: no bias).
typedef struct {
    const Conv2dDims *s;
    float *x, *w, *y, *dy, *dx, *dw, *work;
    bool backward;
} ConvPass;

static bool conv_pass_run(void *ctx) {
    const ConvPass *c = ctx;
    if (c->backward) conv2d_backward(DEVICE_CUDA, c->s, c->x, c->w, c->dy, c->dx, c->dw, NULL, c->work);
    else conv2d_forward(DEVICE_CUDA, c->s, c->x, c->w, NULL, c->y, c->work);
    return true;
}

// The pass `reps` times after one warm-up: events around the whole, then the kernel profile inside.
static OpTime conv_time(ConvPass *c, int reps) {
    const double ms = events_ms(conv_pass_run, c, reps);
    CudaProfileRow rows[MAX_ROWS];
    cuda_profile_start();
    for (int i = 0; i < reps; i++) conv_pass_run(c);
    int n = cuda_profile_stop(rows, MAX_ROWS);
    double kernels = 0.0;
    for (int i = 0; i < n && i < MAX_ROWS; i++) kernels += rows[i].ms;
    return (OpTime){.ms = ms, .kernels_ms = kernels / reps};
}

// Table 3: every conv layer of the model at this batch.
static void conv_table(const Model *m, int batch, double ceiling, int reps) {
    printf("\n## Conv layers: the op, the kit's kernels in it, the rest (SGEMMs), against the ceiling (%.1f TFLOP/s)\n\n",
           ceiling);
    printf("| layer | C x H x W -> K | pass | op ms | kit kernels ms | SGEMM ms | op TFLOP/s | op %% of ceiling | "
           "SGEMM %% of ceiling |\n|---|---|---|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        if (l->kind != LAYER_CONV) continue;
        size_t nx, nw, ny;
        const Conv2dDims s = bench_conv_dims(m, i, batch, &nx, &nw, &ny);
        float *x = gpu_random(nx, 1), *wt = gpu_random(nw, 2), *dy = gpu_random(ny, 3);
        float *y = device_alloc(DEVICE_CUDA, ny * sizeof(float)), *dx = device_alloc(DEVICE_CUDA, nx * sizeof(float));
        float *dw = device_alloc(DEVICE_CUDA, nw * sizeof(float));
        float *work = device_alloc(DEVICE_CUDA, conv2d_work_floats(DEVICE_CUDA, &s) * sizeof(float));
        device_memset_zero(DEVICE_CUDA, dx, nx * sizeof(float));
        device_memset_zero(DEVICE_CUDA, dw, nw * sizeof(float));
        const double flops = 2.0 * (double)ny * s.c * l->ksize * l->ksize;  // one GEMM's worth: 2 * MACs
        for (int pass = 0; pass < 2; pass++) {
            ConvPass c = {&s, x, wt, y, dy, dx, dw, work, pass == 1};
            OpTime t = conv_time(&c, reps);
            const double f = pass ? 2 * flops : flops;  // backward: the dx and the dw GEMMs
            const double gemm_ms = t.ms - t.kernels_ms;
            const double op_tf = f / (t.ms * 1e-3) / 1e12, gemm_tf = gemm_ms > 0 ? f / (gemm_ms * 1e-3) / 1e12 : 0.0;
            printf("| %d | %d x %d x %d -> %d | %s | %.3f | %.3f | %.3f | %.1f | %.0f | %.0f |\n", m->first + i, s.c, s.h, s.w,
                   l->out_c, pass ? "bwd" : "fwd", t.ms, t.kernels_ms, gemm_ms, op_tf, 100.0 * op_tf / ceiling,
                   100.0 * gemm_tf / ceiling);
        }
        float *bufs[] = {x, wt, dy, y, dx, dw, work};
        for (size_t j = 0; j < sizeof bufs / sizeof bufs[0]; j++) device_free(DEVICE_CUDA, bufs[j]);
    }
}

// n 16-bit values of format f, uniform in [-1, 1), on the device (their bytes as a float pointer's worth of storage).
static void *gpu_random16(size_t n, uint64_t seed, LowpFormat f) {
    uint16_t *h = xmalloc(n * sizeof *h);  // (n) host staging
    Rng r = rng_make(seed, 0);
    for (size_t i = 0; i < n; i++) {
        float v = 2.0f * rng_uniform(&r) - 1.0f;
        uint32_t u;
        memcpy(&u, &v, sizeof u);
        h[i] = f == LOWP_BF16 ? (uint16_t)(lowp_bf16_bits(u) >> 16) : lowp_fp16_pack(lowp_fp16_bits(u));
    }
    void *d = device_alloc(DEVICE_CUDA, n * sizeof *h);
    device_copy_to(DEVICE_CUDA, d, h, n * sizeof *h);
    free(h);
    return d;
}

// One 16-bit cuDNN pass in one layout: 0 forward, 1 backward data, 2 backward filter.
typedef struct {
    LowpFormat f;
    ConvLayout layout;
    const Conv2dDims *s;
    void *x, *w, *y, *dy, *dx, *dw;
    int pass;
} DnnPass;

static bool dnn_pass_run(void *ctx) {
    const DnnPass *c = ctx;
    if (c->pass == 0) return cudnn_conv_forward(c->f, c->layout, c->s, c->x, c->w, c->y);
    if (c->pass == 1) return cudnn_conv_backward_data(c->f, c->layout, c->s, c->w, c->dy, c->dx);
    return cudnn_conv_backward_filter(c->f, c->layout, c->s, c->x, c->dy, c->dw, 0.0f);
}

// Table 3 of a 16-bit profile: each conv layer's passes on cuDNN with the data NCHW (the kit's layout, which cuDNN
// may transpose around its tensor-core kernels) and NHWC (channels_last, PyTorch's bf16 reference), the same
// algorithm rules and work budget as conv2d. The sum over the layers is the convolutions' share of one step in
// each layout: what storing the 16-bit activations NHWC would save, before the NHWC versions of BN and pooling
// it would also need (bench/GPU.md).
static void layout_table(const Model *m, int batch, LowpFormat f, int reps, double step_ms) {
    if (!cudnn_conv_wanted()) {
        printf("\n(no cuDNN in this build, or KIT_CUDNN=0: no layout table)\n");
        return;
    }
    printf("\n## cuDNN, %s data: NCHW (the kit's) against NHWC (channels_last), ms per call\n\n", lowp_name(f));
    printf("| layer | C x H x W -> K | pass | NCHW ms | NHWC ms | NCHW / NHWC |\n|---|---|---|---:|---:|---:|\n");
    static const char *const names[3] = {"fwd", "bwd data", "bwd filter"};
    double total[2] = {0.0, 0.0};
    bool complete = true;
    for (int i = 0; i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        if (l->kind != LAYER_CONV) continue;
        size_t nx, nw, ny;
        const Conv2dDims s = bench_conv_dims(m, i, batch, &nx, &nw, &ny);
        DnnPass c = {.f = f, .s = &s, .x = gpu_random16(nx, 1, f), .w = gpu_random16(nw, 2, f),
                     .dy = gpu_random16(ny, 3, f), .y = device_alloc(DEVICE_CUDA, ny * 2),
                     .dx = gpu_random16(nx, 4, f), .dw = device_alloc(DEVICE_CUDA, nw * 2)};
        for (int pass = 0; pass < 3; pass++) {
            if (pass == 1 && l->in < 0) continue;  // the first layer's input needs no gradient
            double ms[2];
            for (int lay = 0; lay < 2; lay++) {
                c.layout = lay ? CONV_NHWC : CONV_NCHW, c.pass = pass;
                ms[lay] = events_ms(dnn_pass_run, &c, reps);
                if (ms[lay] < 0) complete = false;
                else total[lay] += ms[lay];
            }
            printf("| %d | %d x %d x %d -> %d | %s |", m->first + i, s.c, s.h, s.w, l->out_c, names[pass]);
            for (int lay = 0; lay < 2; lay++)
                printf(ms[lay] < 0 ? " no algorithm |" : " %.3f |", ms[lay]);
            if (ms[0] > 0 && ms[1] > 0) printf(" %.2f |\n", ms[0] / ms[1]);
            else printf(" |\n");
        }
        void *bufs[] = {c.x, c.w, c.dy, c.y, c.dx, c.dw};
        for (size_t j = 0; j < sizeof bufs / sizeof bufs[0]; j++) device_free(DEVICE_CUDA, bufs[j]);
    }
    printf("| **all convs, one step** | | | %.3f | %.3f | %.2f |\n", total[0], total[1],
           total[1] > 0 ? total[0] / total[1] : 0.0);
    printf("\nThe step above: %.3f ms. Its convolutions in NHWC instead of NCHW: %+.3f ms (%+.1f %% of the step)%s.\n",
           step_ms, total[1] - total[0], 100.0 * (total[1] - total[0]) / step_ms,
           complete ? "" : "; a pass with no algorithm left out of both sums");
}

static void profile(const char *model, int batch, int steps, int sgemm_n, LowpFormat f) {
    device_set_gemm_precision(DEVICE_CUDA, f == LOWP_BF16 ? GEMM_BF16 : f == LOWP_FP16 ? GEMM_FP16 : GEMM_FP32);
    ModelConfig cfg;
    if (!model_config(&cfg, model, 0, 3, 32, 32, 10)) die("unknown model '%s' (known: %s)", model, model_names());
    Model *m = model_create(&cfg, DEVICE_CUDA, batch, 1);
    model_store_activations(m, f);  // fp32: as it was
    const size_t image = (size_t)3 * 32 * 32;
    float *x = gpu_random((size_t)batch * image, 7);
    device_copy(DEVICE_CUDA, m->input, x, (size_t)batch * image * sizeof(float));
    device_free(DEVICE_CUDA, x);
    // A host batch for the lessons' step: random images, labels 0..9 in turn.
    Batch b = {.n = batch, .x = xmalloc((size_t)batch * image * sizeof(float)), .y = xmalloc((size_t)batch * sizeof(int)),
               .index = 0, .loader = NULL};
    Rng r = rng_make(8, 0);
    for (size_t i = 0; i < (size_t)batch * image; i++) b.x[i] = 2.0f * rng_uniform(&r) - 1.0f;
    for (int i = 0; i < batch; i++) b.y[i] = i % cfg.classes;
    device_copy_to(DEVICE_CUDA, m->labels, b.y, (size_t)batch * sizeof(int));

    struct cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    if (f == LOWP_FP32) printf("# Kit float32 profile: %s, %s, batch %d, TF32 off\n\n", prop.name, model, batch);
    else printf("# Kit %s profile: %s, %s, batch %d, %s GEMMs and activations stored in 2 bytes (lesson 10's GPU "
                "path)\n\n", lowp_name(f), prop.name, model, batch, lowp_name(f));
#ifdef KIT_CUDA_EMU
    printf("(CUDA emulator: every time below is the emulator's host time, not a GPU's)\n\n");
#endif
    const double ceiling = sgemm_ceiling(sgemm_n);
    const double bare = step_ms(m, &b, steps, false), lesson = step_ms(m, &b, steps, true);
    printf("| step | ms | images/s |\n|---|---:|---:|\n");
    printf("| bare (nothing read back) | %.3f | %.0f |\n", bare, batch / (bare * 1e-3));
    printf("| train_forward_backward + optim_step (copy in, loss and predictions out, label checks) | %.3f | %.0f |\n",
           lesson, batch / (lesson * 1e-3));
    printf("\ncuBLAS SGEMM %d^3 (the ceiling): %.1f TFLOP/s\n", sgemm_n, ceiling);
    kernel_table(m, batch, steps, bare);
    if (f == LOWP_FP32) conv_table(m, batch, ceiling, steps);  // its ceiling is SGEMM's: float32 only
    else layout_table(m, batch, f, steps, bare);
    model_store_activations(m, LOWP_FP32);
    device_set_gemm_precision(DEVICE_CUDA, GEMM_FP32);
    free(b.x);
    free(b.y);
    model_free(m);
}
#endif

int main(int argc, char **argv) {
    const char *model = "resnet9";
    int batch = 512, steps = 5, sgemm_n = 8192;
    double budget_mb = 0.0;
    LowpFormat precision = LOWP_FP32;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--model") == 0 && i + 1 < argc) model = argv[++i];
        else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc) batch = atoi(argv[++i]);
        else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc) steps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--sgemm-n") == 0 && i + 1 < argc) sgemm_n = atoi(argv[++i]);
        else if (strcmp(argv[i], "--conv-budget-mb") == 0 && i + 1 < argc) budget_mb = atof(argv[++i]);
        else if (strcmp(argv[i], "--precision") == 0 && i + 1 < argc && lowp_parse(argv[i + 1], &precision)) i++;
        else die("usage: %s [--model NAME] [--batch N] [--steps N] [--sgemm-n N] [--conv-budget-mb MB] "
                 "[--precision fp32|bf16|fp16]", argv[0]);
    }
    if (batch < 1 || steps < 1 || sgemm_n < 1 || budget_mb < 0) die("--batch, --steps and --sgemm-n must be positive");
    const char *why = NULL;
    if (!device_cuda_usable(&why)) {
        printf("bench_profile: skipped: no GPU (%s)\n", why);
        return 0;
    }
#ifdef KIT_CUDA
    // The conv scratch bounds the images per GEMM (cuda_context.h): a larger budget, fewer and larger GEMMs.
    if (budget_mb > 0) cuda_conv_set_work_budget((size_t)(budget_mb * (1 << 20) / sizeof(float)));
    profile(model, batch, steps, sgemm_n, precision);
#else
    (void)model, (void)batch, (void)steps, (void)sgemm_n, (void)precision;
#endif
    return 0;
}
