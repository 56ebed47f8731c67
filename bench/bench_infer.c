// bench/bench_infer.c: where the time of an inference forward goes, layer by layer (lesson 06's batch-1 latency).
//
//   bench_infer [--model resnet9] [--batch 1] [--reps 300] [--warmup 20]
//
// Runs an inference model (model_create_inference, model_init's weights: the values do not change the time) in eval
// mode. Each repetition walks the layers as model_forward(train = false) does, through the same public ops, timing
// each layer with clock_gettime; then one whole model_forward is timed. Printed per layer: the MINIMUM over the
// repetitions (the run least disturbed by other work: robust on a shared machine, where medians are not) and the
// median; then the sum of the minima and the minimum / median of whole forwards. Threads: OMP_NUM_THREADS.
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kit/check.h"
#include "kit/model.h"
#include "kit/ops.h"
#include "kit/rng.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static const char *kind_name(LayerKind k) {
    static const char *names[] = {[LAYER_CONV] = "conv",       [LAYER_BN] = "bn",   [LAYER_RELU] = "relu",
                                  [LAYER_MAXPOOL] = "maxpool", [LAYER_ADD] = "add", [LAYER_AVGPOOL] = "avgpool",
                                  [LAYER_LINEAR] = "linear"};
    return names[k];
}

int main(int argc, char **argv) {
    const char *model = "resnet9";
    int batch = 1, reps = 300, warmup = 20;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--model") == 0 && v) model = v, i++;
        else if (strcmp(a, "--batch") == 0 && v) batch = atoi(v), i++;
        else if (strcmp(a, "--reps") == 0 && v) reps = atoi(v), i++;
        else if (strcmp(a, "--warmup") == 0 && v) warmup = atoi(v), i++;
        else die("usage: %s [--model resnet9|fmnist] [--batch 1] [--reps 300] [--warmup 20]", argv[0]);
    }
    CHECK(batch >= 1 && reps >= 1 && warmup >= 0, "--batch >= 1, --reps >= 1, --warmup >= 0");
    const bool r9 = strcmp(model, "resnet9") == 0;
    ModelConfig cfg;
    CHECK(model_config(&cfg, model, 0, r9 ? 3 : 1, r9 ? 32 : 28, r9 ? 32 : 28, 10), "unknown --model");
    Model *m = model_create_inference(&cfg, DEVICE_CPU, batch);
    const size_t img = (size_t)cfg.in_c * cfg.in_h * cfg.in_w;
    float *x = xmalloc((size_t)batch * img * sizeof(float));  // (batch, C, H, W)
    Rng r = rng_make(1, 7);
    for (size_t i = 0; i < (size_t)batch * img; i++) x[i] = 2.0f * rng_uniform(&r) - 1.0f;
    const int L = m->n_layers;
    double *t = xmalloc((size_t)reps * (L + 1) * sizeof(double));  // (L + 1, reps): per layer, then whole
    for (int rep = -warmup; rep < reps; rep++) {
        for (int i = 0; i < L; i++) {
            double s = now();
            model_forward_layer_eval(m, i, x, batch);  // what model_forward runs
            if (rep >= 0) t[(size_t)i * reps + rep] = now() - s;
        }
        double s = now();
        model_forward(m, x, batch, false);
        if (rep >= 0) t[(size_t)L * reps + rep] = now() - s;
    }
    printf("bench_infer: model %s, batch %d, %d threads, %d repetitions: ms per layer (min, median)\n", model, batch,
           omp_get_max_threads(), reps);
    double sum_min = 0;
    for (int i = 0; i <= L; i++) {
        double *ti = t + (size_t)i * reps;
        qsort(ti, (size_t)reps, sizeof *ti, cmp_double);
        if (i == L) {
            printf("sum of the layers' minima %.3f ms; whole forward: min %.3f ms, median %.3f ms\n", 1e3 * sum_min,
                   1e3 * ti[0], 1e3 * ti[reps / 2]);
            break;
        }
        const Layer *l = &m->layers[i];
        int c = cfg.in_c, h = cfg.in_h, w = cfg.in_w;
        if (l->in >= 0) c = m->layers[l->in].c, h = m->layers[l->in].h, w = m->layers[l->in].w;
        sum_min += ti[0];
        printf("  %2d %-8s (%3d, %2d, %2d) -> (%3d, %2d, %2d)  %7.3f  %7.3f\n", i, kind_name(l->kind), c, h, w, l->c,
               l->h, l->w, 1e3 * ti[0], 1e3 * ti[reps / 2]);
    }
    free(t), free(x);
    model_free(m);
    return 0;
}
