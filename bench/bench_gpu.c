// bench/bench_gpu.c: the kit's speed on one GPU, for bench/torch_gpu.py to set beside PyTorch's.
//
//   bench_gpu [--model resnet9] [--batch 512] [--steps 20] [--pipeline-models resnet9,fmnist] [--sgemm-n 8192]
//
// Measures, on GPU 0:
//   1. training throughput (images/s) of the model: forward, loss, backward, SGD step, on a batch that
//      already lives on the GPU (the data pipeline is not measured), in float32, with TF32 conv GEMMs (--tf32),
//      and with bf16 and fp16 GEMMs (device_set_gemm_precision: 16-bit inputs on tensor cores), first with float32
//      activations, then with the activations stored in 2 bytes as well (model_store_activations);
//   1b. the same step in float32, TF32 and bf16 (bf16 activations) with conv on im2col + cuBLAS, the kit's own
//      engine, against the default (cuDNN where the build has it: kit/cuda/conv_cudnn.cu);
//   2. each conv layer's forward and backward as the kit runs them (the default engine), in achieved TFLOP/s (2 * MACs per pass; backward counts dx and dw: 2 passes);
//   3. the ceiling: cuBLAS SGEMM on 8192^3, in float32 and in TF32;
//   4. the data pipeline, for each of --pipeline-models at the same batch: training from the kit's loader
//      (a synthetic CIFAR-shaped set, crop + flip, pinned host slots) through train_forward_backward, as
//      lessons 03 on train, with the copy of batch k+1 overlapping the compute of batch k (kit/loader.c)
//      and without it (the same path as KIT_OVERLAP=0: a synchronous copy in the step): images/s, and per
//      step the wait for the loader thread, the host-to-device copy of one batch measured alone (events
//      on a pinned cudaMemcpy), and the rest (compute).
// Prints one JSON object on stdout (the Python script parses it); progress goes to stderr.
// Without a usable GPU it prints {"skipped": "<why>"} and exits 0.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit/check.h"
#include "kit/data.h"
#include "kit/device.h"
#include "kit/log.h"
#include "kit/model.h"
#include "kit/ops.h"
#include "kit/optim.h"
#include "kit/rng.h"
#include "kit/train.h"
#ifdef KIT_CUDA
#include "bench/gpu_step.h"
#include "kit/cuda/cuda_context.h"
#include "kit/cuda_check.h"
#endif

#ifdef KIT_CUDA
// Images per second over `steps` training steps, after 3 warm-up steps (cuBLAS heuristics, caches).
static double train_throughput(Model *m, int batch, int steps) {
    for (int i = 0; i < 3; i++) gpu_train_step(m, batch);
    device_synchronize(DEVICE_CUDA);
    double t0 = time_now();
    for (int i = 0; i < steps; i++) gpu_train_step(m, batch);
    device_synchronize(DEVICE_CUDA);
    return (double)steps * batch / (time_now() - t0);
}

// One conv pass as training runs it (backward: dx and dw; no bias, as before BN).
typedef enum { PASS_FWD, PASS_BWD } Pass;
typedef struct {
    Conv2dDims s;
    float *x, *w, *y, *dy, *dx, *dw, *work;
} ConvBufs;

static void conv_pass(const ConvBufs *c, Pass pass) {
    if (pass == PASS_FWD) conv2d_forward(DEVICE_CUDA, &c->s, c->x, c->w, NULL, c->y, c->work);
    else conv2d_backward(DEVICE_CUDA, &c->s, c->x, c->w, c->dy, c->dx, c->dw, NULL, c->work);
}

// Seconds per pass, over `reps` passes after one warm-up.
static double conv_time(const ConvBufs *c, Pass pass, int reps) {
    conv_pass(c, pass);
    device_synchronize(DEVICE_CUDA);
    double t0 = time_now();
    for (int i = 0; i < reps; i++) conv_pass(c, pass);
    device_synchronize(DEVICE_CUDA);
    return (time_now() - t0) / reps;
}

// Every conv layer of the model at this batch size: shape, forward and backward TFLOP/s.
static void conv_layers(const Model *m, int batch, FILE *out) {
    fprintf(out, "  \"conv_layers\": [");
    int first = 1;
    for (int i = 0; i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        if (l->kind != LAYER_CONV) continue;
        size_t nx, nw, ny;
        const Conv2dDims s = bench_conv_dims(m, i, batch, &nx, &nw, &ny);
        ConvBufs b = {.s = s, .x = gpu_random(nx, 1), .w = gpu_random(nw, 2), .dy = gpu_random(ny, 3)};
        b.y = device_alloc(DEVICE_CUDA, ny * sizeof(float));
        b.dx = device_alloc(DEVICE_CUDA, nx * sizeof(float));
        b.dw = device_alloc(DEVICE_CUDA, nw * sizeof(float));
        b.work = device_alloc(DEVICE_CUDA, conv2d_work_floats(DEVICE_CUDA, &s) * sizeof(float));
        device_memset_zero(DEVICE_CUDA, b.dx, nx * sizeof(float));
        device_memset_zero(DEVICE_CUDA, b.dw, nw * sizeof(float));
        double flops = 2.0 * (double)ny * s.c * l->ksize * l->ksize;  // 2 * MACs of one pass
        double tf = conv_time(&b, PASS_FWD, 5), tb = conv_time(&b, PASS_BWD, 5);
        fprintf(stderr, "conv %d: %dx%dx%d -> %d: fwd %.2f ms (%.1f TFLOP/s), bwd %.2f ms (%.1f TFLOP/s)\n", i, s.c,
                s.h, s.w, l->out_c, tf * 1e3, flops / tf / 1e12, tb * 1e3, 2 * flops / tb / 1e12);
        fprintf(out, "%s\n    {\"layer\": %d, \"c\": %d, \"h\": %d, \"w\": %d, \"k\": %d, \"r\": %d, "
                     "\"fwd_ms\": %.4f, \"fwd_tflops\": %.3f, \"bwd_ms\": %.4f, \"bwd_tflops\": %.3f}",
                first ? "" : ",", i, s.c, s.h, s.w, l->out_c, l->ksize, tf * 1e3, flops / tf / 1e12, tb * 1e3,
                2 * flops / tb / 1e12);
        first = 0;
        float *bufs[] = {b.x, b.w, b.dy, b.y, b.dx, b.dw, b.work};
        for (size_t j = 0; j < sizeof bufs / sizeof bufs[0]; j++) device_free(DEVICE_CUDA, bufs[j]);
    }
    fprintf(out, "\n  ],\n");
}

// cuBLAS SGEMM on n x n x n: the practical ceiling of any GEMM-based conv on this GPU.
static double sgemm_tflops(int n, bool tf32) {
    cublasHandle_t h = cuda_cublas();
    CUBLAS_CHECK(cublasSetMathMode(h, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    size_t nn = (size_t)n * n;
    float *a = gpu_random(nn, 4), *b = gpu_random(nn, 5), *c = device_alloc(DEVICE_CUDA, nn * sizeof(float));
    const float one = 1.0f, zero = 0.0f;
    int reps = 10;
    double t0 = 0.0;
    for (int i = 0; i <= reps; i++) {
        if (i == 1) {
            device_synchronize(DEVICE_CUDA);
            t0 = time_now();
        }
        CUBLAS_CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, n, b, n, &zero, c, n));
    }
    device_synchronize(DEVICE_CUDA);
    double t = (time_now() - t0) / reps;
    device_free(DEVICE_CUDA, a), device_free(DEVICE_CUDA, b), device_free(DEVICE_CUDA, c);
    CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));  // the kit's ops expect the default (cuda_context.h)
    return 2.0 * n * (double)n * n / t / 1e12;
}

// ---------------------------------------------------------------- 4. the data pipeline

typedef struct {
    double images_per_s;
    double step_ms, wait_ms;  // per step: all of it, and the part spent waiting for the loader thread
} PipeRun;

// `steps` timed training steps (after 3 warm-up steps) from loader L, overlap on or off. Epochs restart
// as needed; the loader's epoch 0 is the warm-up's.
static PipeRun pipeline_run(Model *m, Loader *L, int steps, bool overlap) {
    const SgdConfig opt = {.lr = 0.01f, .momentum = 0.9f, .weight_decay = 5e-4f, .nesterov = true};
    loader_set_overlap(L, overlap);
    int done = 0, epoch = 0;
    double t0 = 0.0, wait_total = 0.0;
    while (done < steps + 3) {
        loader_start_epoch(L, epoch++, 0);
        const Batch *b;
        double wait;
        while (done < steps + 3 && (b = loader_next(L, &wait)) != NULL) {
            if (done == 3) {
                device_synchronize(DEVICE_CUDA);
                t0 = time_now();
            }
            if (done >= 3) wait_total += wait;
            train_forward_backward(m, b, 0.0f, 1.0f / (float)b->n);
            optim_step(m, &opt);
            done++;
        }
    }
    device_synchronize(DEVICE_CUDA);
    double t = time_now() - t0;
    PipeRun r = {.images_per_s = (double)steps * m->max_batch / t, .step_ms = t / steps * 1e3,
                 .wait_ms = wait_total / steps * 1e3};
    return r;
}

// Milliseconds of one synchronous host-to-device copy of `bytes` from pinned memory (median-free: the
// mean of 20 after one warm-up, timed with events so that only the copy counts).
static double copy_ms(size_t bytes) {
    void *h = host_alloc_pinned(bytes);
    void *d = device_alloc(DEVICE_CUDA, bytes);
    memset(h, 0, bytes);
    cudaEvent_t a, b;
    CUDA_CHECK(cudaEventCreate(&a));
    CUDA_CHECK(cudaEventCreate(&b));
    device_copy_to(DEVICE_CUDA, d, h, bytes);
    CUDA_CHECK(cudaEventRecord(a, 0));
    for (int i = 0; i < 20; i++) CUDA_CHECK(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, 0));
    CUDA_CHECK(cudaEventRecord(b, 0));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    CUDA_CHECK(cudaEventDestroy(a));
    CUDA_CHECK(cudaEventDestroy(b));
    device_free(DEVICE_CUDA, d);
    host_free_pinned(h);
    return ms / 20;
}

// Section 4 for one model: JSON object on `out` (first: no leading comma).
static void pipeline_model(const char *model, int batch, int steps, bool first, FILE *out) {
    ModelConfig cfg;
    if (!model_config(&cfg, model, 0, 3, 32, 32, 10)) die("unknown model '%s' (known: %s)", model, model_names());
    Model *m = model_create(&cfg, DEVICE_CUDA, batch, 1);
    // Enough images that the timed steps never wrap within an epoch's first batch (an epoch restart
    // refills both slots: it would show as a wait that training does not have).
    Dataset ds;
    dataset_synthetic(&ds, batch * (steps + 4), 10, 3, 32, 32, DATASET_SYNTHETIC_SEED, SPLIT_TRAIN);
    Sampler s;
    sampler_init(&s, ds.n, 0, 1, 1, SAMPLER_TRAIN_DROP);
    Loader *L = loader_create(&ds, &s, batch, true, &dataset_info("cifar10")->train_augment, 1);
    PipeRun off = pipeline_run(m, L, steps, false), on = pipeline_run(m, L, steps, true);
    double cms = copy_ms((size_t)batch * 3 * 32 * 32 * sizeof(float));
    fprintf(stderr, "pipeline %s: copy %.3f ms/batch; no overlap %.0f images/s (%.2f ms/step, wait %.2f); "
                    "overlap %.0f images/s (%.2f ms/step, wait %.2f)\n",
            model, cms, off.images_per_s, off.step_ms, off.wait_ms, on.images_per_s, on.step_ms, on.wait_ms);
    fprintf(out, "%s\n    {\"model\": \"%s\", \"batch\": %d, \"steps\": %d, \"copy_ms\": %.4f, "
                 "\"no_overlap\": {\"images_per_s\": %.1f, \"step_ms\": %.4f, \"wait_ms\": %.4f}, "
                 "\"overlap\": {\"images_per_s\": %.1f, \"step_ms\": %.4f, \"wait_ms\": %.4f}}",
            first ? "" : ",", model, batch, steps, cms, off.images_per_s, off.step_ms, off.wait_ms,
            on.images_per_s, on.step_ms, on.wait_ms);
    loader_free(L);
    dataset_free(&ds);
    model_free(m);
}

static void pipeline_models(const char *list, int batch, int steps, FILE *out) {
    fprintf(out, "  \"pipeline\": [");
    char names[256];
    snprintf(names, sizeof names, "%s", list);
    bool first = true;
    for (char *save = NULL, *name = strtok_r(names, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        pipeline_model(name, batch, steps, first, out);
        first = false;
    }
    fprintf(out, "\n  ],\n");
}
#endif

int main(int argc, char **argv) {
    const char *model = "resnet9", *pipeline = "resnet9,fmnist";
    int batch = 512, steps = 20, sgemm_n = 8192;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--model") == 0 && i + 1 < argc) model = argv[++i];
        else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc) batch = atoi(argv[++i]);
        else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc) steps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--pipeline-models") == 0 && i + 1 < argc) pipeline = argv[++i];
        else if (strcmp(argv[i], "--sgemm-n") == 0 && i + 1 < argc) sgemm_n = atoi(argv[++i]);
        else die("usage: %s [--model NAME] [--batch N] [--steps N] [--pipeline-models A,B] [--sgemm-n N]", argv[0]);
    }
    if (batch < 1 || steps < 1 || sgemm_n < 1) die("--batch, --steps and --sgemm-n must be positive");
    const char *why = NULL;
    if (!device_cuda_usable(&why)) {
        printf("{\"skipped\": \"no usable GPU: %s\"}\n", why);
        return 0;
    }
#ifdef KIT_CUDA
    device_set_gemm_precision(DEVICE_CUDA, GEMM_FP32);
    ModelConfig cfg;
    if (!model_config(&cfg, model, 0, 3, 32, 32, 10)) die("unknown model '%s' (known: %s)", model, model_names());
    Model *m = model_create(&cfg, DEVICE_CUDA, batch, 1);
    float *x = gpu_random((size_t)batch * 3 * 32 * 32, 7);
    device_copy(DEVICE_CUDA, m->input, x, (size_t)batch * 3 * 32 * 32 * sizeof(float));
    device_free(DEVICE_CUDA, x);
    int *labels = xmalloc(batch * sizeof(int));
    for (int i = 0; i < batch; i++) labels[i] = i % cfg.classes;
    device_copy_to(DEVICE_CUDA, m->labels, labels, batch * sizeof(int));
    free(labels);

    struct cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    double fwd_macs = model_forward_macs(m);
    fprintf(stderr, "%s: %s, batch %d, %.3f GFLOP per image per step (fwd + bwd)\n", prop.name, model, batch,
            6 * fwd_macs / 1e9);
    double ips32 = train_throughput(m, batch, steps);
    fprintf(stderr, "train fp32: %.0f images/s\n", ips32);
    device_set_gemm_precision(DEVICE_CUDA, GEMM_TF32);  // --tf32: the conv GEMMs on TF32 tensor cores, linear float32 (PyTorch's default)
    double ips_tf32 = train_throughput(m, batch, steps);
    device_set_gemm_precision(DEVICE_CUDA, GEMM_FP32);
    fprintf(stderr, "train tf32: %.0f images/s\n", ips_tf32);
    // The real 16-bit GEMMs (device_set_gemm_precision): conv and linear inputs in 2 bytes, tensor cores, float32
    // sums; activations float32. Timing only: no loss scale here (fp16's scaler adds one scale of the loss
    // gradient and one pass over the gradients per step), no policy rounding of the activations.
    // Then the same with the activations stored in 2 bytes too (model_store_activations: lesson 10's GPU path).
    double ips_lowp[2], ips_act16[2];
    for (int k = 0; k < 2; k++) {
        const LowpFormat f = k ? LOWP_FP16 : LOWP_BF16;
        device_set_gemm_precision(DEVICE_CUDA, k ? GEMM_FP16 : GEMM_BF16);
        ips_lowp[k] = train_throughput(m, batch, steps);
        model_store_activations(m, f);
        ips_act16[k] = train_throughput(m, batch, steps);
        model_store_activations(m, LOWP_FP32);
        device_set_gemm_precision(DEVICE_CUDA, GEMM_FP32);
        fprintf(stderr, "train %s GEMMs: %.0f images/s; and %s activations: %.0f images/s\n", lowp_name(f),
                ips_lowp[k], lowp_name(f), ips_act16[k]);
    }
    const double ips_bf16 = ips_lowp[0], ips_fp16 = ips_lowp[1];
    // The same step on the other conv engine (cuda_conv_use_cudnn): im2col + cuBLAS, the kit's own, against cuDNN,
    // the default where the build has it, in float32, TF32 and bf16 with bf16 activations. Equal numbers mean one
    // engine: a build without cuDNN, or a GPU where it did not start (the engine line says which).
    const char *engine = device_conv_engine(DEVICE_CUDA);
    const bool had_cudnn = cuda_conv_use_cudnn(false);
    const GemmPrecision im2col_prec[3] = {GEMM_FP32, GEMM_TF32, GEMM_BF16};
    double ips_im2col[3];
    for (int k = 0; k < 3; k++) {
        device_set_gemm_precision(DEVICE_CUDA, im2col_prec[k]);
        if (k == 2) model_store_activations(m, LOWP_BF16);
        ips_im2col[k] = train_throughput(m, batch, steps);
        if (k == 2) model_store_activations(m, LOWP_FP32);
        fprintf(stderr, "train %s on im2col + cuBLAS: %.0f images/s\n", gemm_precision_name(im2col_prec[k]),
                ips_im2col[k]);
    }
    device_set_gemm_precision(DEVICE_CUDA, GEMM_FP32);
    cuda_conv_use_cudnn(had_cudnn);

    printf("{\n  \"gpu\": \"%s\",\n  \"model\": \"%s\",\n  \"batch\": %d,\n  \"steps\": %d,\n", prop.name, model,
           batch, steps);
    printf("  \"train_flop_per_image\": %.6g,\n", 6 * fwd_macs);  // forward 2*MACs, backward about 2x that
    printf("  \"train_images_per_s_fp32\": %.1f,\n  \"train_images_per_s_tf32\": %.1f,\n", ips32, ips_tf32);
    printf("  \"train_images_per_s_bf16\": %.1f,\n  \"train_images_per_s_fp16\": %.1f,\n", ips_bf16, ips_fp16);
    printf("  \"train_images_per_s_bf16_act16\": %.1f,\n  \"train_images_per_s_fp16_act16\": %.1f,\n", ips_act16[0],
           ips_act16[1]);
    printf("  \"conv_engine\": \"%s\",\n", engine);
    printf("  \"train_images_per_s_fp32_im2col\": %.1f,\n  \"train_images_per_s_tf32_im2col\": %.1f,\n"
           "  \"train_images_per_s_bf16_act16_im2col\": %.1f,\n", ips_im2col[0], ips_im2col[1], ips_im2col[2]);
    conv_layers(m, batch, stdout);
    model_free(m);
    pipeline_models(pipeline, batch, steps, stdout);
    double c32 = sgemm_tflops(sgemm_n, false), ctf = sgemm_tflops(sgemm_n, true);
    fprintf(stderr, "cuBLAS SGEMM %d^3: fp32 %.1f TFLOP/s, tf32 %.1f TFLOP/s\n", sgemm_n, c32, ctf);
    printf("  \"sgemm_n\": %d,\n  \"sgemm_tflops_fp32\": %.3f,\n  \"sgemm_tflops_tf32\": %.3f\n}\n", sgemm_n, c32,
           ctf);
#else
    (void)model, (void)pipeline, (void)sgemm_n;
#endif
    return 0;
}
