// bench/bench_gpu.c: the kit's speed on one GPU, for bench/torch_gpu.py to set beside PyTorch's.
//
//   bench_gpu [--model resnet9] [--batch 512] [--steps 20]
//
// Measures, on GPU 0:
//   1. training throughput (images/s) of the model: forward, loss, backward, SGD step, on a batch that
//      already lives on the GPU (the data pipeline is not measured), in float32 and with TF32 GEMMs;
//   2. each conv layer's forward and backward as the kit runs them (im2col + cuBLAS SGEMM + layout
//      kernels), in achieved TFLOP/s (2 * MACs per pass; backward counts dx and dw: 2 passes);
//   3. the ceiling: cuBLAS SGEMM on 8192^3, in float32 and in TF32.
// Prints one JSON object on stdout (the Python script parses it); progress goes to stderr.
// Without a usable GPU it prints {"skipped": "<why>"} and exits 0.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit/check.h"
#include "kit/device.h"
#include "kit/log.h"
#include "kit/model.h"
#include "kit/ops.h"
#include "kit/optim.h"
#include "kit/rng.h"
#ifdef KIT_CUDA
#include "kit/cuda/cuda_context.h"
#include "kit/cuda_check.h"
#endif

#ifdef KIT_CUDA
static float *gpu_random(size_t n, uint64_t seed) {
    float *h = xmalloc(n * sizeof(float));
    Rng r = rng_make(seed, 0);
    for (size_t i = 0; i < n; i++) h[i] = 2.0f * rng_uniform(&r) - 1.0f;
    float *d = device_alloc(DEVICE_CUDA, n * sizeof(float));
    device_copy_to(DEVICE_CUDA, d, h, n * sizeof(float));
    free(h);
    return d;
}

static void train_step(Model *m, int batch) {
    const SgdConfig opt = {.lr = 0.01f, .momentum = 0.9f, .weight_decay = 5e-4f, .nesterov = true};
    int k = m->cfg.classes;
    const float *logits = model_forward(m, m->input, batch, true);
    cross_entropy_forward(DEVICE_CUDA, batch, k, logits, m->labels, 0.0f, m->loss);
    device_memset_zero(DEVICE_CUDA, m->dlogits, (size_t)batch * k * sizeof(float));
    cross_entropy_backward(DEVICE_CUDA, batch, k, logits, m->labels, 0.0f, 1.0f / batch, m->dlogits);
    model_zero_grad(m);
    model_backward(m, m->input, m->dlogits, batch);
    optim_step(m, &opt);
}

// Images per second over `steps` training steps, after 3 warm-up steps (cuBLAS heuristics, caches).
static double train_throughput(Model *m, int batch, int steps) {
    for (int i = 0; i < 3; i++) train_step(m, batch);
    device_synchronize(DEVICE_CUDA);
    double t0 = time_now();
    for (int i = 0; i < steps; i++) train_step(m, batch);
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
        int c = m->cfg.in_c, h = m->cfg.in_h, w = m->cfg.in_w;
        if (l->in >= 0) c = m->layers[l->in].c, h = m->layers[l->in].h, w = m->layers[l->in].w;
        Conv2dDims s = {.n = batch, .c = c, .h = h, .w = w, .k = l->out_c, .r = l->ksize, .stride = l->stride,
                        .pad = l->pad};
        size_t nx = (size_t)batch * c * h * w, nw = (size_t)l->out_c * c * l->ksize * l->ksize;
        size_t ny = (size_t)batch * l->out_c * conv2d_out_h(&s) * conv2d_out_w(&s);
        ConvBufs b = {.s = s, .x = gpu_random(nx, 1), .w = gpu_random(nw, 2), .dy = gpu_random(ny, 3)};
        b.y = device_alloc(DEVICE_CUDA, ny * sizeof(float));
        b.dx = device_alloc(DEVICE_CUDA, nx * sizeof(float));
        b.dw = device_alloc(DEVICE_CUDA, nw * sizeof(float));
        b.work = device_alloc(DEVICE_CUDA, conv2d_work_floats(DEVICE_CUDA, &s) * sizeof(float));
        device_memset_zero(DEVICE_CUDA, b.dx, nx * sizeof(float));
        device_memset_zero(DEVICE_CUDA, b.dw, nw * sizeof(float));
        double flops = 2.0 * (double)ny * c * l->ksize * l->ksize;  // 2 * MACs of one pass
        double tf = conv_time(&b, PASS_FWD, 5), tb = conv_time(&b, PASS_BWD, 5);
        fprintf(stderr, "conv %d: %dx%dx%d -> %d: fwd %.2f ms (%.1f TFLOP/s), bwd %.2f ms (%.1f TFLOP/s)\n", i, c,
                h, w, l->out_c, tf * 1e3, flops / tf / 1e12, tb * 1e3, 2 * flops / tb / 1e12);
        fprintf(out, "%s\n    {\"layer\": %d, \"c\": %d, \"h\": %d, \"w\": %d, \"k\": %d, \"r\": %d, "
                     "\"fwd_ms\": %.4f, \"fwd_tflops\": %.3f, \"bwd_ms\": %.4f, \"bwd_tflops\": %.3f}",
                first ? "" : ",", i, c, h, w, l->out_c, l->ksize, tf * 1e3, flops / tf / 1e12, tb * 1e3,
                2 * flops / tb / 1e12);
        first = 0;
        float *bufs[] = {b.x, b.w, b.dy, b.y, b.dx, b.dw, b.work};
        for (size_t j = 0; j < sizeof bufs / sizeof bufs[0]; j++) device_free(DEVICE_CUDA, bufs[j]);
    }
    fprintf(out, "\n  ],\n");
}

// cuBLAS SGEMM on n x n x n: the practical ceiling of any GEMM-based conv on this GPU.
static double sgemm_tflops(int n, bool tf32) {
    cuda_set_tf32(tf32);
    size_t nn = (size_t)n * n;
    float *a = gpu_random(nn, 4), *b = gpu_random(nn, 5), *c = device_alloc(DEVICE_CUDA, nn * sizeof(float));
    const float one = 1.0f, zero = 0.0f;
    cublasHandle_t h = cuda_cublas();
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
    cuda_set_tf32(false);
    return 2.0 * n * (double)n * n / t / 1e12;
}
#endif

int main(int argc, char **argv) {
    const char *model = "resnet9";
    int batch = 512, steps = 20;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--model") == 0 && i + 1 < argc) model = argv[++i];
        else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc) batch = atoi(argv[++i]);
        else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc) steps = atoi(argv[++i]);
        else die("usage: %s [--model NAME] [--batch N] [--steps N]", argv[0]);
    }
    if (batch < 1 || steps < 1) die("--batch and --steps must be positive");
    const char *why = NULL;
    if (!device_cuda_usable(&why)) {
        printf("{\"skipped\": \"no usable GPU: %s\"}\n", why);
        return 0;
    }
#ifdef KIT_CUDA
    cuda_set_tf32(false);
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
    cuda_set_tf32(true);
    double ips_tf32 = train_throughput(m, batch, steps);
    cuda_set_tf32(false);
    fprintf(stderr, "train tf32: %.0f images/s\n", ips_tf32);

    printf("{\n  \"gpu\": \"%s\",\n  \"model\": \"%s\",\n  \"batch\": %d,\n  \"steps\": %d,\n", prop.name, model,
           batch, steps);
    printf("  \"train_flop_per_image\": %.6g,\n", 6 * fwd_macs);  // forward 2*MACs, backward about 2x that
    printf("  \"train_images_per_s_fp32\": %.1f,\n  \"train_images_per_s_tf32\": %.1f,\n", ips32, ips_tf32);
    conv_layers(m, batch, stdout);
    double c32 = sgemm_tflops(8192, false), ctf = sgemm_tflops(8192, true);
    fprintf(stderr, "cuBLAS SGEMM 8192^3: fp32 %.1f TFLOP/s, tf32 %.1f TFLOP/s\n", c32, ctf);
    printf("  \"sgemm_tflops_fp32\": %.3f,\n  \"sgemm_tflops_tf32\": %.3f\n}\n", c32, ctf);
    model_free(m);
#else
    (void)model;
#endif
    return 0;
}
