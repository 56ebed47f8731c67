// bench/bench_cpu.c: training throughput of the kit on the CPU, and how close its convolutions get to
// the machine's GEMM ceiling. Prints one JSON object per measurement on stdout (bench/torch_cpu.py reads
// them and writes bench/results-cpu.md); a human-readable line per measurement goes to stderr.
//
//   bench_cpu [--steps N] [--warmup N] [--batch B] [--models resnet9,fmnist] [--what ceiling,train,conv]
//             [--gemm fp32|bf16]
//   bench_cpu --serve MODEL [--batch B]     (driven by bench/torch_cpu.py: one step per "step" line)
//
// --gemm bf16: conv's and linear's GEMMs in bf16 on oneDNN (kit/cpu_bf16.h, lesson 10's CPU path), where the CPU
// has bf16 instructions (refused otherwise, with the reason; KIT_CPU_BF16=fp32 runs its numerics anywhere, not its
// speed). The conv table then says how close the bf16 convolutions get to their GEMMs (bench/gemm_lowp_cpu.c
// times the GEMMs alone on the same shapes): what im2col and the conversions around oneDNN cost on that CPU.
//
// Measured:
//   train      images/s of one full training step (forward, loss, backward, SGD update) per model
//   conv       the model's conv layers alone (forward + backward) with their GEMM FLOP/s
//   ceiling    OpenBLAS sgemm on a large square matrix, all cores: what the conv GEMMs could reach
//   memory     peak resident memory of a training run (2 steps after the warm-up) and the model's buffers
//              by class; run it in a process of its own (peak RSS is per process: --what memory alone)
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit/check.h"
#include "kit/cpu_bf16.h"
#include "kit/device.h"
#include "kit/log.h"
#include "kit/model.h"
#include "kit/ops.h"
#include "kit/optim.h"
#include "kit/rng.h"

typedef struct {
    int steps, warmup, batch;
    char models[128];
    char what[64];  // which measurements: any of ceiling,train,conv,memory
    bool serve;     // --serve MODEL: steps on request (see serve())
    bool bf16;      // --gemm bf16: the GEMMs on oneDNN's bf16 matmul
} Options;

static void parse(int argc, char **argv, Options *o) {
    *o = (Options){.steps = 5, .warmup = 1, .batch = 128};
    snprintf(o->models, sizeof o->models, "resnet9,fmnist");
    snprintf(o->what, sizeof o->what, "ceiling,train,conv");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--steps") == 0 && v) o->steps = atoi(v), i++;
        else if (strcmp(a, "--warmup") == 0 && v) o->warmup = atoi(v), i++;
        else if (strcmp(a, "--batch") == 0 && v) o->batch = atoi(v), i++;
        else if (strcmp(a, "--models") == 0 && v) snprintf(o->models, sizeof o->models, "%s", v), i++;
        else if (strcmp(a, "--what") == 0 && v) snprintf(o->what, sizeof o->what, "%s", v), i++;
        else if (strcmp(a, "--serve") == 0 && v) o->serve = true, snprintf(o->models, sizeof o->models, "%s", v), i++;
        else if (strcmp(a, "--gemm") == 0 && v && (strcmp(v, "fp32") == 0 || strcmp(v, "bf16") == 0))
            o->bf16 = strcmp(v, "bf16") == 0, i++;
        else die("usage: %s [--steps N] [--warmup N] [--batch B] [--models resnet9,fmnist] [--what ceiling,train,conv] "
                "[--gemm fp32|bf16] [--serve MODEL]", argv[0]);
    }
    if (o->steps < 1 || o->warmup < 0 || o->batch < 2) die("--steps >= 1, --warmup >= 0, --batch >= 2");
    if (o->bf16) {
        const char *why = NULL;
        if (!cpu_bf16_available(&why)) die("bench_cpu: --gemm bf16: no bf16 GEMMs on this CPU: %s", why);
        device_set_gemm_precision(DEVICE_CPU, GEMM_BF16);
        fprintf(stderr, "GEMMs: bf16 on oneDNN, %s (%s)\n", cpu_bf16_isa(), cpu_bf16_impl());
    }
}

// The GEMM precision of the JSON records: "fp32" (OpenBLAS, or Winograd's transforms around it) or "bf16".
static const char *gemm_name(void) { return device_gemm_precision(DEVICE_CPU) == GEMM_BF16 ? "bf16" : "fp32"; }

static void fill(float *x, size_t n, uint64_t seed) {
    Rng r = rng_make(seed, 7);
    for (size_t i = 0; i < n; i++) x[i] = 2.0f * rng_uniform(&r) - 1.0f;
}

static bool model_input(const char *name, int *c, int *h, int *w) {
    if (strcmp(name, "resnet9") == 0) return *c = 3, *h = 32, *w = 32, true;
    if (strcmp(name, "fmnist") == 0) return *c = 1, *h = 28, *w = 28, true;
    return false;
}

// One training step exactly as lesson 01 does it: forward, mean cross-entropy, backward, SGD.
static void train_step(Model *m, const float *x, int n, const SgdConfig *sgd) {
    const float *logits = model_forward(m, x, n, true);
    cross_entropy_forward(m->device, n, m->cfg.classes, logits, m->labels, 0.0f, m->loss);
    model_zero_grad(m);
    memset(m->dlogits, 0, (size_t)n * m->cfg.classes * sizeof(float));
    cross_entropy_backward(m->device, n, m->cfg.classes, logits, m->labels, 0.0f, 1.0f / n, m->dlogits);
    model_backward(m, x, m->dlogits, n);
    optim_step(m, sgd);
}

// The model at batch B with random inputs and labels, after `warmup` training steps.
static Model *train_setup(const char *name, const Options *o, const SgdConfig *sgd) {
    int c, h, w;
    if (!model_input(name, &c, &h, &w)) die("bench_cpu: unknown model '%s' (resnet9 or fmnist)", name);
    ModelConfig cfg;
    CHECK(model_config(&cfg, name, 0, c, h, w, 10), "model_config failed");
    Model *m = model_create(&cfg, DEVICE_CPU, o->batch, 1);
    fill(m->input, (size_t)o->batch * c * h * w, 1);
    for (int i = 0; i < o->batch; i++) m->labels[i] = i % 10;
    for (int i = 0; i < o->warmup; i++) train_step(m, m->input, o->batch, sgd);
    return m;
}

static const SgdConfig BENCH_SGD = {.lr = 0.01f, .momentum = 0.9f, .weight_decay = 5e-4f, .nesterov = true};

static void bench_train(const char *name, const Options *o) {
    Model *m = train_setup(name, o, &BENCH_SGD);
    double t0 = time_now();
    for (int i = 0; i < o->steps; i++) train_step(m, m->input, o->batch, &BENCH_SGD);
    double dt = (time_now() - t0) / o->steps;
    // Training FLOPs ~ 3x the forward's: forward, input gradient, weight gradient (2 FLOPs per MAC).
    double gflops = 3.0 * 2.0 * model_forward_macs(m) * o->batch / dt * 1e-9;
    fprintf(stderr, "kit   %-8s batch %d: %8.1f images/s  %7.1f ms/step  %6.1f GFLOP/s\n", name, o->batch,
            o->batch / dt, dt * 1e3, gflops);
    printf("{\"kind\": \"train\", \"impl\": \"kit\", \"gemm\": \"%s\", \"model\": \"%s\", \"batch\": %d, "
           "\"threads\": %d, \"images_per_s\": %.3f, \"ms_per_step\": %.3f, \"gflops\": %.3f}\n",
           gemm_name(), name, o->batch, omp_get_max_threads(), o->batch / dt, dt * 1e3, gflops);
    fflush(stdout);
    model_free(m);
}

// --serve: one training step per line "step" read from stdin, answering with its seconds; "quit" ends.
// bench/torch_cpu.py alternates these single steps with PyTorch's, so each pair sees the same load.
static void serve(const char *name, const Options *o) {
    Model *m = train_setup(name, o, &BENCH_SGD);
    printf("ready %d\n", omp_get_max_threads());
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (strncmp(line, "quit", 4) == 0) break;
        if (strncmp(line, "step", 4) != 0) die("bench_cpu --serve: expected 'step' or 'quit', got '%s'", line);
        double t0 = time_now();
        train_step(m, m->input, o->batch, &BENCH_SGD);
        printf("%.6f\n", time_now() - t0);
        fflush(stdout);
    }
    model_free(m);
}

// This process's peak resident memory: VmHWM, the high-water mark of its address space. Not getrusage's
// ru_maxrss, which Linux carries over from the parent across fork + exec (a child of a 1.4 GB Python
// process would report 1.4 GB).
static double peak_rss_bytes(void) {
    FILE *f = fopen("/proc/self/status", "r");
    CHECK(f, "/proc/self/status is missing: peak memory is measured on Linux only");
    char line[256];
    double kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %lf kB", &kb) == 1) break;
    fclose(f);
    CHECK(kb > 0, "no VmHWM line in /proc/self/status");
    return kb * 1024.0;
}

// Peak resident memory of training, and what the model allocated for it by class (bytes). What the
// classes do not explain is the program itself: code, OpenBLAS's and OpenMP's buffers and stacks, libc.
static void bench_memory(const char *name, const Options *o) {
    Model *m = train_setup(name, o, &BENCH_SGD);
    for (int i = 0; i < 2; i++) train_step(m, m->input, o->batch, &BENCH_SGD);
    const double F = sizeof(float), B = o->batch, MB = 1.0 / (1 << 20);
    const double params = m->n_params * F, grads = m->n_params * F, momentum = m->n_params * F;
    const double acts = B * m->act_floats_per_sample * F + (m->n_buffers + m->saved_floats) * F;
    const double act_grads = B * m->grad_floats_per_sample * F + B * m->cfg.classes * F;  // + dlogits
    const double work = m->work_floats * F;
    const double batch = B * (m->cfg.in_c * m->cfg.in_h * m->cfg.in_w * F + 2 * sizeof(int) + F);
    const double peak = peak_rss_bytes();
    fprintf(stderr, "kit   %-8s batch %d: peak RSS %.0f MiB = params %.1f + grads %.1f + momentum %.1f + "
            "activations saved for backward %.1f + their gradients %.1f + workspace %.1f + batch %.1f + "
            "the rest (code, libraries, thread stacks) %.1f MiB\n", name, o->batch, peak * MB, params * MB,
            grads * MB, momentum * MB, acts * MB, act_grads * MB, work * MB, batch * MB,
            (peak - params - grads - momentum - acts - act_grads - work - batch) * MB);
    printf("{\"kind\": \"memory\", \"impl\": \"kit\", \"model\": \"%s\", \"batch\": %d, \"peak_rss\": %.0f, "
           "\"params\": %.0f, \"grads\": %.0f, \"momentum\": %.0f, \"activations\": %.0f, \"act_grads\": %.0f, "
           "\"workspace\": %.0f, \"batch_bytes\": %.0f}\n",
           name, o->batch, peak, params, grads, momentum, acts, act_grads, work, batch);
    fflush(stdout);
    model_free(m);
}

#define CONV_MIN_SECONDS 0.5
// Rounds kept per layer (a layer's rounds beyond this are timed in the total but not kept for the median).
#define CONV_MAX_ROUNDS 4096
// Runs of the ceiling's sgemm per thread count.
#define CEILING_RUNS 5

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// The median of v[0..n) (sorts v). The conv layers and the ceiling are both reported as the median of their
// runs: the same statistic on both sides of the ratio, and one that a neighbour's burst on a shared machine
// moves little (a mean takes every burst in; a best-of is what no training step sees).
static double median_of(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The model's conv layers alone, forward + backward at batch B, each timed over `steps` rounds or more.
static void bench_convs(const char *name, const Options *o) {
    int c, h, w;
    if (!model_input(name, &c, &h, &w)) die("bench_cpu: unknown model '%s'", name);
    ModelConfig cfg;
    CHECK(model_config(&cfg, name, 0, c, h, w, 10), "model_config failed");
    Model *m = model_create(&cfg, DEVICE_CPU, 1, 1);  // only for its layer table
    double flops = 0, seconds = 0, seconds_mean = 0, seconds_best = 0;
    for (int i = 0; i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        if (l->kind != LAYER_CONV) continue;
        int ic = c, ih = h, iw = w;
        if (l->in >= 0) ic = m->layers[l->in].c, ih = m->layers[l->in].h, iw = m->layers[l->in].w;
        Conv2dDims d = {.n = o->batch, .c = ic, .h = ih, .w = iw, .k = l->out_c, .r = l->ksize,
                        .stride = l->stride, .pad = l->pad};
        const size_t nx = (size_t)d.n * d.c * d.h * d.w, nw = (size_t)d.k * d.c * d.r * d.r;
        const size_t ny = (size_t)d.n * d.k * conv2d_out_h(&d) * conv2d_out_w(&d);
        float *x = xmalloc(nx * 4), *wt = xmalloc(nw * 4), *y = xmalloc(ny * 4), *dy = xmalloc(ny * 4);
        float *dx = xcalloc(nx, 4), *dw = xcalloc(nw, 4);
        float *work = xmalloc(conv2d_work_floats(DEVICE_CPU, &d) * 4 + 4);
        fill(x, nx, 2), fill(wt, nw, 3), fill(dy, ny, 4);
        const bool first = l->in < 0;  // the model never asks for the image's gradient
        conv2d_forward(DEVICE_CPU, &d, x, wt, NULL, y, work);  // warm-up
        // At least `steps` rounds and at least CONV_MIN_SECONDS: a small layer (fmnist's take ~1-25 ms) timed once
        // is mostly timer and scheduling noise.
        // The passes are timed one by one (the backward as its two calls, weight gradient then input gradient:
        // each path runs them one after the other anyway), so that a change to one of them shows where it acts.
        static double round_s[CONV_MAX_ROUNDS], pass_s[3][CONV_MAX_ROUNDS];  // (fwd, wgrad, dgrad) per round
        int rounds = 0;
        double t0 = time_now(), elapsed = 0;
        while (rounds < o->steps || elapsed < CONV_MIN_SECONDS) {
            const double r0 = time_now();
            conv2d_forward(DEVICE_CPU, &d, x, wt, NULL, y, work);
            const double r1 = time_now();
            conv2d_backward(DEVICE_CPU, &d, x, wt, dy, NULL, dw, NULL, work);
            const double r2 = time_now();
            if (!first) conv2d_backward(DEVICE_CPU, &d, x, wt, dy, dx, NULL, NULL, work);
            const double r3 = time_now();
            if (rounds < CONV_MAX_ROUNDS) {
                round_s[rounds] = r3 - r0;
                pass_s[0][rounds] = r1 - r0, pass_s[1][rounds] = r2 - r1, pass_s[2][rounds] = r3 - r2;
            }
            rounds++;
            elapsed = time_now() - t0;
        }
        const double mean = elapsed / rounds;
        const int kept = rounds < CONV_MAX_ROUNDS ? rounds : CONV_MAX_ROUNDS;
        const double dt = median_of(round_s, kept), best = round_s[0];  // sorted by median_of
        double pass_ms[3];
        for (int p = 0; p < 3; p++) pass_ms[p] = median_of(pass_s[p], kept) * 1e3;
        double macs = (double)ny * d.c * d.r * d.r;
        double f = 2.0 * macs * (first ? 2.0 : 3.0);
        fprintf(stderr, "kit   %-8s conv %2d (%3d,%2dx%-2d)->%3d: %7.2f ms fwd+bwd (median of %d; mean %.2f, best %.2f)  "
                "%6.1f GFLOP/s  [fwd %.2f, wgrad %.2f, dgrad %.2f ms]\n", name, i, d.c, d.h, d.w, d.k, dt * 1e3, rounds,
                mean * 1e3, best * 1e3, f / dt * 1e-9, pass_ms[0], pass_ms[1], pass_ms[2]);
        // Per layer too: a model's total hides a layer whose GEMM shape no BLAS runs well (1 input channel: K = 9).
        printf("{\"kind\": \"conv_layer\", \"gemm\": \"%s\", \"model\": \"%s\", \"layer\": %d, \"c\": %d, "
               "\"h\": %d, \"w\": %d, \"k\": %d, \"r\": %d, \"stride\": %d, \"ms\": %.3f, \"gflops\": %.3f, "
               "\"rounds\": %d, \"ms_mean\": %.3f, \"ms_best\": %.3f, \"ms_fwd\": %.3f, \"ms_wgrad\": %.3f, "
               "\"ms_dgrad\": %.3f}\n",
               gemm_name(), name, i, d.c, d.h, d.w, d.k, d.r, d.stride, dt * 1e3, f / dt * 1e-9, rounds, mean * 1e3,
               best * 1e3, pass_ms[0], pass_ms[1], pass_ms[2]);
        flops += f, seconds += dt, seconds_mean += mean, seconds_best += best;
        free(x), free(wt), free(y), free(dy), free(dx), free(dw), free(work);
    }
    printf("{\"kind\": \"conv\", \"impl\": \"kit\", \"gemm\": \"%s\", \"model\": \"%s\", \"batch\": %d, \"ms\": %.3f, "
           "\"gflops\": %.3f, \"gflops_mean\": %.3f, \"gflops_best\": %.3f}\n",
           gemm_name(), name, o->batch, seconds * 1e3, flops / seconds * 1e-9, flops / seconds_mean * 1e-9,
           flops / seconds_best * 1e-9);
    fflush(stdout);
    model_free(m);
}

// OpenBLAS on an n x n x n sgemm with all its threads: the best a GEMM-based conv could do here.
static void bench_ceiling(void) {
    const int n = 2048, threads = omp_get_max_threads();
    float *a = xmalloc((size_t)n * n * 4), *b = xmalloc((size_t)n * n * 4), *cm = xmalloc((size_t)n * n * 4);
    fill(a, (size_t)n * n, 5), fill(b, (size_t)n * n, 6);
    double med1 = 0, medn = 0, best1 = 0, bestn = 0;
    for (int t = 1; t <= threads; t += threads > 1 ? threads - 1 : 1) {
        openblas_set_num_threads(t);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, cm, n);
        double g[CEILING_RUNS];
        for (int r = 0; r < CEILING_RUNS; r++) {
            double t0 = time_now();
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, cm, n);
            g[r] = 2.0 * n * n * (double)n / (time_now() - t0) * 1e-9;
        }
        const double med = median_of(g, CEILING_RUNS), best = g[CEILING_RUNS - 1];  // sorted
        if (t == 1) med1 = med, best1 = best;
        if (t == threads) medn = med, bestn = best;
    }
    openblas_set_num_threads(1);  // the kit's ops run OpenBLAS single-threaded inside OpenMP
    fprintf(stderr, "sgemm %dx%dx%d (median of %d runs; best): %.1f (%.1f) GFLOP/s on 1 thread, %.1f (%.1f) GFLOP/s on %d "
            "threads\n", n, n, n, CEILING_RUNS, med1, best1, medn, bestn, threads);
    printf("{\"kind\": \"ceiling\", \"n\": %d, \"threads\": %d, \"runs\": %d, \"gflops_1\": %.3f, \"gflops\": %.3f, "
           "\"gflops_1_best\": %.3f, \"gflops_best\": %.3f}\n",
           n, threads, CEILING_RUNS, med1, medn, best1, bestn);
    fflush(stdout);
    free(a), free(b), free(cm);
}

int main(int argc, char **argv) {
    Options o;
    parse(argc, argv, &o);
    if (o.serve) {
        serve(o.models, &o);
        return 0;
    }
    if (strstr(o.what, "ceiling")) bench_ceiling();
    char list[128];
    snprintf(list, sizeof list, "%s", o.models);
    for (char *save = NULL, *name = strtok_r(list, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        if (strstr(o.what, "train")) bench_train(name, &o);
        if (strstr(o.what, "conv")) bench_convs(name, &o);
        if (strstr(o.what, "memory")) bench_memory(name, &o);
    }
    return 0;
}
