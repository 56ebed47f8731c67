// bench/ddp_drift.c: how far DDP's float32 arithmetic drifts from one process on the global batch.
//
// DDP over W ranks computes each rank's gradient on its shard (scaled by 1/local batch), sums the W
// gradients and divides by W; one process computes the gradient of the whole batch (scaled by 1/global
// batch). In exact arithmetic both are the same number; in float32 the sums run in another order (other
// GEMM shapes, other blocking), so they differ by rounding. This program replays both in ONE process,
// with the same arithmetic as lesson 03 on the MPI backend (world 2: the all-reduce is one float addition,
// so the replay is bit for bit what two ranks compute), and prints per step:
//
//   drift    max |p_ddp - p_one| / max |p_one| over the parameters, both trained from the same start
//   fresh    the same after ONE step taken from identical parameters and momentum (the one-process
//            run's): the error one step adds, without what earlier steps left behind
//   grad     max |g_ddp - g_one| / max |g_one| of that fresh step's gradients
//   move-max, move-l2  the fresh step's move (new - old parameters) against the one-process move: max-norm
//            error over the largest move, and 2-norm error over the move's 2-norm
//   flips    how many ReLU outputs are zero in one run and not in the other (fresh step): each flip is a
//            kink crossed, an O(1) change of that unit's gradient instead of an O(rounding) one
//
//   build/bench/ddp_drift [--model tiny] [--world 2] [--batch 32] [--steps 6] [--lr 0.05] [--every 1] [--seed 1]
//
// Run it under OPENBLAS_CORETYPE=Haswell and without (AVX-512 kernels) to compare kernels.
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit/check.h"
#include "kit/data.h"
#include "kit/model.h"
#include "kit/optim.h"
#include "kit/train.h"

static double rel_err(const float *a, const float *b, size_t n) {
    double err = 0.0, scale = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (isnan(d)) return INFINITY;
        err = d > err ? d : err;
        scale = fabs((double)b[i]) > scale ? fabs((double)b[i]) : scale;
    }
    return scale > 0 ? err / scale : err;
}

// The next batch of a loader, starting a new epoch when one ends.
static const Batch *next_batch(Loader *L, int *epoch) {
    const Batch *b = loader_next(L, NULL);
    if (!b) {
        loader_start_epoch(L, ++*epoch, 0);
        b = loader_next(L, NULL);
    }
    return b;
}

// The difference of two moves (a - before) and (b - before): max-norm relative to the largest move of b,
// and 2-norm relative to the 2-norm of b's move.
static void move_err(const float *a, const float *b, const float *before, size_t n, double *maxrel, double *l2rel) {
    double emax = 0, mmax = 0, e2 = 0, m2 = 0;
    for (size_t i = 0; i < n; i++) {
        double ma = (double)a[i] - before[i], mb = (double)b[i] - before[i], d = fabs(ma - mb);
        emax = d > emax ? d : emax;
        mmax = fabs(mb) > mmax ? fabs(mb) : mmax;
        e2 += d * d;
        m2 += mb * mb;
    }
    *maxrel = mmax > 0 ? emax / mmax : emax;
    *l2rel = m2 > 0 ? sqrt(e2 / m2) : sqrt(e2);
}

static const float *act_of(const Model *m, int idx) {
    return m->acts + m->layers[idx].act_offset * (size_t)m->max_batch;
}

// Kinks on which two models' forwards (same images, n of them) disagree: ReLU outputs that are zero in one
// and not in the other, plus 2x2 max-pool windows whose maximum sits at another position. Each such
// disagreement switches a path of the gradient on or off: an O(1) change of that unit's gradient.
static long kink_flips(const Model *a, const Model *b, int n) {
    long flips = 0;
    for (int li = 0; li < a->n_layers; li++) {
        const Layer *l = &a->layers[li];
        if (l->kind == LAYER_RELU) {
            const float *x = act_of(a, li), *y = act_of(b, li);
            size_t count = (size_t)n * l->c * l->h * l->w;
            for (size_t i = 0; i < count; i++) {
                bool f = (x[i] == 0.0f) != (y[i] == 0.0f);
                flips += f;
                if (f && getenv("DRIFT_VERBOSE")) fprintf(stderr, "ReLU flip: layer %d, %g vs %g\n", li, (double)x[i], (double)y[i]);
            }
        } else if (l->kind == LAYER_MAXPOOL) {
            const Layer *in = &a->layers[l->in];
            const float *x = act_of(a, l->in), *y = act_of(b, l->in);
            for (int p = 0; p < n * l->c; p++)
                for (int i = 0; i < l->h; i++)
                    for (int j = 0; j < l->w; j++) {
                        int ax = 0, ay = 0;
                        for (int k = 1; k < 4; k++) {
                            size_t at = ((size_t)p * in->h + 2 * i + k / 2) * in->w + 2 * j + k % 2;
                            size_t bx = ((size_t)p * in->h + 2 * i + ax / 2) * in->w + 2 * j + ax % 2;
                            size_t by = ((size_t)p * in->h + 2 * i + ay / 2) * in->w + 2 * j + ay % 2;
                            if (x[at] > x[bx]) ax = k;
                            if (y[at] > y[by]) ay = k;
                        }
                        flips += ax != ay;
                        if (ax != ay && getenv("DRIFT_VERBOSE")) fprintf(stderr, "max-pool flip: layer %d\n", li);
                    }
        }
    }
    return flips;
}

typedef struct {
    const char *model;
    int world, batch, steps, every;
    float lr;
    int n_train;
    uint64_t seed;
} Options;

static Options parse(int argc, char **argv) {
    Options o = {.model = "tiny", .world = 2, .batch = 32, .steps = 6, .every = 1, .lr = 0.05f, .n_train = 1200, .seed = 1};
    static const struct option longs[] = {{"model", 1, 0, 'm'}, {"world", 1, 0, 'w'}, {"batch", 1, 0, 'b'},
                                          {"steps", 1, 0, 's'}, {"lr", 1, 0, 'l'},    {"every", 1, 0, 'e'},
                                          {"train-size", 1, 0, 'n'}, {"seed", 1, 0, 'S'}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        switch (c) {
        case 'm': o.model = optarg; break;
        case 'w': o.world = atoi(optarg); break;
        case 'b': o.batch = atoi(optarg); break;
        case 's': o.steps = atoi(optarg); break;
        case 'l': o.lr = (float)atof(optarg); break;
        case 'e': o.every = atoi(optarg); break;
        case 'n': o.n_train = atoi(optarg); break;
        case 'S': o.seed = strtoull(optarg, NULL, 10); break;
        default: die("usage: ddp_drift [--model M] [--world W] [--batch GLOBAL] [--steps S] [--lr LR] [--every K] "
                     "[--train-size N] [--seed INIT_SEED]");
        }
    }
    CHECK(o.world >= 1 && o.batch % o.world == 0 && o.steps >= 1 && o.every >= 1,
          "--batch must be a multiple of --world; --steps and --every at least 1");
    return o;
}

int main(int argc, char **argv) {
    Options o = parse(argc, argv);
    const int W = o.world, local = o.batch / W;
    const SgdConfig opt = {.lr = o.lr, .momentum = 0.9f, .weight_decay = 5e-4f};
    Dataset ds;
    dataset_synthetic(&ds, o.n_train, 10, 3, 32, 32, 1234, SPLIT_TRAIN);
    ModelConfig cfg;
    CHECK(model_config(&cfg, o.model, 0, ds.c, ds.h, ds.w, ds.classes), "unknown --model");

    // The one-process run, the DDP replica (one model stands for every rank: they are identical), and a
    // scratch one-process model for the fresh step.
    Model *one = model_create(&cfg, DEVICE_CPU, o.batch, o.seed), *ddp = model_create(&cfg, DEVICE_CPU, local, o.seed);
    Model *fresh = model_create(&cfg, DEVICE_CPU, local, 1), *probe = model_create(&cfg, DEVICE_CPU, local, 1);
    const size_t n = one->n_params;
    float *sum = xmalloc(n * sizeof(float)), *gfresh = xmalloc(n * sizeof(float));
    float *before = xmalloc(n * sizeof(float));
    double worst_max = 0, worst_l2 = 0, worst_drift = 0;

    Sampler s_all, *s_rank = xmalloc((size_t)W * sizeof(Sampler));
    sampler_init(&s_all, ds.n, 0, 1, 7, SAMPLER_TRAIN_DROP);
    Loader *L_all = loader_create(&ds, &s_all, o.batch, true, NULL, 7);
    Loader **L = xmalloc((size_t)W * sizeof(Loader *));
    for (int r = 0; r < W; r++) {
        sampler_init(&s_rank[r], ds.n, r, W, 7, SAMPLER_TRAIN_DROP);
        L[r] = loader_create(&ds, &s_rank[r], local, true, NULL, 7);
        loader_start_epoch(L[r], 0, 0);
    }
    loader_start_epoch(L_all, 0, 0);
    int ep_all = 0, *ep = xcalloc((size_t)W, sizeof(int));

    printf("# %s, world %d, global batch %d, lr %g, momentum 0.9, wd 5e-4, %zu parameters\n", o.model, W, o.batch,
           (double)o.lr, n);
    printf("# step      drift      fresh       grad  kink-flips  move-max    move-l2\n");
    for (int step = 1; step <= o.steps; step++) {
        const bool report = step % o.every == 0 || step <= 10 || step == o.steps;
        const Batch *shard[64];
        CHECK(W <= 64, "--world at most 64");
        for (int r = 0; r < W; r++) shard[r] = next_batch(L[r], &ep[r]);
        long flips = 0;
        if (report) {
            // Kinks: each shard forwarded through the drifted DDP replica and through the one-process model,
            // with the same batch size (so the same GEMM shapes).
            memcpy(probe->params, one->params, n * sizeof(float));
            memcpy(before, one->params, n * sizeof(float));
            for (int r = 0; r < W; r++) {
                model_forward(probe, shard[r]->x, shard[r]->n, true);
                model_forward(ddp, shard[r]->x, shard[r]->n, true);
                flips += kink_flips(ddp, probe, shard[r]->n);
            }
        }
        // pass 0: DDP from the one-process run's parameters (fresh); pass 1: DDP from its own.
        for (int pass = report ? 0 : 1; pass < 2; pass++) {
            Model *m = pass == 0 ? fresh : ddp;
            if (pass == 0) {
                memcpy(fresh->params, one->params, n * sizeof(float));
                memcpy(fresh->velocity, one->velocity, n * sizeof(float));
            }
            for (int r = 0; r < W; r++) {
                train_forward_backward(m, shard[r], 0.0f, 1.0f / (float)local);
                if (r == 0) memcpy(sum, m->grads, n * sizeof(float));
                else for (size_t i = 0; i < n; i++) sum[i] += m->grads[i];  // MPI_SUM, rank order
            }
            for (size_t i = 0; i < n; i++) m->grads[i] = sum[i] / (float)W;  // kit/dist.c's PG_AVG
            if (pass == 0) memcpy(gfresh, m->grads, n * sizeof(float));
            optim_step(m, &opt);
        }
        const Batch *b = next_batch(L_all, &ep_all);
        train_forward_backward(one, b, 0.0f, 1.0f / (float)b->n);
        optim_step(one, &opt);
        if (report) {
            double mx, l2, drift = rel_err(ddp->params, one->params, n);
            move_err(fresh->params, one->params, before, n, &mx, &l2);
            worst_max = mx > worst_max ? mx : worst_max;
            worst_l2 = l2 > worst_l2 ? l2 : worst_l2;
            worst_drift = drift > worst_drift ? drift : worst_drift;
            printf("%6d %10.3g %10.3g %10.3g %11ld %10.3g %10.3g\n", step, drift, rel_err(fresh->params, one->params, n),
                   rel_err(gfresh, one->grads, n), flips, mx, l2);
        }
    }
    printf("# worst over the reported steps: drift %.3g, one step's move error %.3g (max norm) %.3g (2-norm)\n",
           worst_drift, worst_max, worst_l2);
    return 0;
}
