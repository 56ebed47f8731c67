// tests/lesson11/torch/tp_export.c: the C half of tests/lesson11/torch/torch_tp.py. Trains the kit's resnet9 for a few SGD steps
// on fixed synthetic batches, either as ONE process (the kit's plain Model, no tensor parallelism) or through
// lesson 11's solution (tp_create / tp_step: every residual block split over a tensor group of --tp ranks, and a
// data dimension when the world is larger), and writes what the Python half compares with PyTorch:
//
//   tp_export --out DIR [--tp T] [--steps K] [--batch B] [--width W] [--size S] [--lr LR] [--seed SEED]
//     --tp 0 (default): one process, no MPI;  --tp T under mpirun: T x D ranks (D data replicas)
//
//   DIR/init.ckpt    the initial model (model_create's, the one tp_create splits): every run starts from it
//   DIR/final.ckpt   the whole model after K steps (tp_gather_model: the slices all-gathered)
//   DIR/x.f32        (K B, 3, S, S) the normalised images, step s's global batch at rows [s B, (s + 1) B)
//   DIR/y.i32        (K B) their labels
//
// With D replicas, replica r trains on rows [r B/D, (r + 1) B/D) of each global batch (what a DistributedSampler
// of the global batch gives it); BN's statistics are those of the global batch (tp_create syncs them over the data
// group), so every configuration trains the same function as one process on the global batch.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit/check.h"
#include "kit/ckpt.h"
#include "kit/data.h"
#include "kit/dist.h"
#include "kit/model.h"
#include "kit/ops.h"
#include "kit/optim.h"
#include "solutions/11-tensor/lesson.h"

enum { CLASSES = 10, CHANNELS = 3 };

typedef struct {
    const char *out;
    int tp, steps, batch, width, size;
    float lr;
    unsigned long seed;
} ExportOptions;

static void usage(const char *prog) {
    die("usage: %s --out DIR [--tp T] [--steps K] [--batch B] [--width W] [--size S] [--lr LR] [--seed SEED]\n"
        "  --tp 0: one process (no MPI); --tp T: under mpirun, a multiple of T ranks", prog);
}

static ExportOptions parse(int argc, char **argv) {
    ExportOptions o = {.out = NULL, .tp = 0, .steps = 3, .batch = 16, .width = 8, .size = 32, .lr = 0.05f, .seed = 7};
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc) usage(argv[0]);
        const char *k = argv[i], *v = argv[++i];
        if (!strcmp(k, "--out")) {
            o.out = v;
            continue;
        }
        char *end = NULL;
        long n = strtol(v, &end, 10);
        if (!strcmp(k, "--lr")) o.lr = strtof(v, &end);
        else if (!strcmp(k, "--seed")) o.seed = strtoul(v, &end, 10);
        else if (!strcmp(k, "--tp")) o.tp = (int)n;
        else if (!strcmp(k, "--steps")) o.steps = (int)n;
        else if (!strcmp(k, "--batch")) o.batch = (int)n;
        else if (!strcmp(k, "--width")) o.width = (int)n;
        else if (!strcmp(k, "--size")) o.size = (int)n;
        else usage(argv[0]);
        if (!end || *end) die("%s: '%s' is not a number", k, v);
    }
    if (!o.out || o.tp < 0 || o.steps < 1 || o.batch < 2 || o.width < 1 || o.size < 8) usage(argv[0]);
    return o;
}

static void write_file(const char *dir, const char *name, const void *p, size_t bytes) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL, "the output folder must exist and be writable");
    CHECK(fwrite(p, 1, bytes, f) == bytes, "disk full?");
    CHECK(fclose(f) == 0, "disk full?");
}

static void save_model(const ExportOptions *o, const char *name, const Model *m, const ModelConfig *cfg, int world,
                       int step, const SgdConfig *opt) {
    char path[1024], err[512];
    snprintf(path, sizeof path, "%s/%s", o->out, name);
    CkptState st = {.model = *cfg, .world = world, .global_batch = o->batch, .steps_per_epoch = o->steps,
                    .epochs = 1, .batch_in_epoch = step, .step = step, .seed = o->seed, .peak_lr = opt->lr,
                    .momentum = opt->momentum, .weight_decay = opt->weight_decay, .nesterov = opt->nesterov};
    snprintf(st.dataset, sizeof st.dataset, "synthetic");
    if (ckpt_save(path, m, &st, err, sizeof err) != 0) die("%s", err);
}

// One process, the kit's Model: forward, loss (mean over the batch), backward, SGD; as lesson 01 does.
static void train_plain(const ExportOptions *o, const ModelConfig *cfg, const float *x, const int *y,
                        const SgdConfig *opt) {
    Model *m = model_create(cfg, DEVICE_CPU, o->batch, o->seed);
    const size_t image = (size_t)CHANNELS * o->size * o->size;
    for (int s = 0; s < o->steps; s++) {
        const float *xs = x + (size_t)s * o->batch * image;
        const int *ys = y + (size_t)s * o->batch;
        const float *logits = model_forward(m, xs, o->batch, true);
        memset(m->dlogits, 0, (size_t)o->batch * CLASSES * sizeof(float));
        cross_entropy_backward(DEVICE_CPU, o->batch, CLASSES, logits, ys, 0.0f, 1.0f / (float)o->batch, m->dlogits);
        model_zero_grad(m);
        model_backward(m, xs, m->dlogits, o->batch);
        optim_step(m, opt);
    }
    save_model(o, "final.ckpt", m, cfg, 1, o->steps, opt);
    printf("tp_export: one process, %d steps of %d images\n", o->steps, o->batch);
    model_free(m);
}

// Lesson 11's solution: tp_step on this replica's rows of each global batch, then the slices gathered.
static void train_tp(ProcessGroup *world, const ExportOptions *o, const ModelConfig *cfg, float *x, int *y,
                     const SgdConfig *opt) {
    const int W = pg_world(world);
    if (W % o->tp != 0 || o->batch % (W / o->tp) != 0)
        die("--tp %d must divide the %d ranks, and the data replicas (%d) the batch (%d)", o->tp, W, W / o->tp,
            o->batch);
    const int local = o->batch / (W / o->tp);
    Tp *tp = tp_create(world, o->tp, cfg, DEVICE_CPU, local, o->seed);
    const size_t image = (size_t)CHANNELS * o->size * o->size;
    for (int s = 0; s < o->steps; s++) {
        const size_t row = (size_t)s * o->batch + (size_t)tp->grid.replica * local;  // this replica's first image
        Batch b = {.n = local, .x = x + row * image, .y = y + row, .index = s, .loader = NULL};
        tp_step(tp, &b, opt, 0.0f);
    }
    Model *whole = model_create(cfg, DEVICE_CPU, 1, o->seed);
    tp_gather_model(tp, whole);  // collective over the world
    if (pg_rank(world) == 0) {
        save_model(o, "final.ckpt", whole, cfg, W, o->steps, opt);
        printf("tp_export: %d tensor rank(s) x %d data replica(s), %d blocks split, %d steps of %d images\n",
               tp->grid.tp, tp->grid.dp, tp->n_blocks, o->steps, o->batch);
    }
    model_free(whole);
    tp_free(tp);
}

int main(int argc, char **argv) {
    const ExportOptions o = parse(argc, argv);
    ProcessGroup *world = o.tp ? pg_init(&argc, &argv, "mpi", DEVICE_CPU, 60.0) : NULL;  // --tp 0: no MPI
    ModelConfig cfg;
    CHECK(model_config(&cfg, "resnet9", o.width, CHANNELS, o.size, o.size, CLASSES), "resnet9 is one of the kit's");
    // The kit's usual SGD: Nesterov momentum, weight decay on conv and linear weights only (TensorView.decay).
    const SgdConfig opt = {.lr = o.lr, .momentum = 0.9f, .weight_decay = 5e-4f, .nesterov = true};

    // Every rank makes the same images (the synthetic set is a function of its seed).
    const int n = o.steps * o.batch;
    Dataset ds;
    dataset_synthetic(&ds, n, CLASSES, CHANNELS, o.size, o.size, DATASET_SYNTHETIC_SEED, SPLIT_TRAIN);
    const size_t image = (size_t)CHANNELS * o.size * o.size;
    float *x = xmalloc((size_t)n * image * sizeof(float));  // (K B, 3, S, S)
    int *y = xmalloc((size_t)n * sizeof(int)), *idx = xmalloc((size_t)n * sizeof(int));  // (K B)
    for (int i = 0; i < n; i++) idx[i] = i;
    dataset_fill_batch(&ds, idx, n, NULL, 0, 0, x, y);

    // Rank 0 (or the one process) writes the start and the data.
    if (!world || pg_rank(world) == 0) {
        Model *init = model_create(&cfg, DEVICE_CPU, 1, o.seed);
        save_model(&o, "init.ckpt", init, &cfg, 1, 0, &opt);
        model_free(init);
        write_file(o.out, "x.f32", x, (size_t)n * image * sizeof(float));
        write_file(o.out, "y.i32", y, (size_t)n * sizeof(int));
    }
    if (world) train_tp(world, &o, &cfg, x, y, &opt);
    else train_plain(&o, &cfg, x, y, &opt);
    free(x), free(y), free(idx);
    dataset_free(&ds);
    if (world) pg_finalize(world);
    return 0;
}
