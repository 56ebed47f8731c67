// tests/ckpt_torch_export.c: the C half of tests/test_ckpt_torch.py. Trains the kit's resnet9 (width 8) for a
// few steps on the synthetic set, saves a checkpoint, evaluates the test split in eval mode (BN running
// statistics), and writes what the Python half compares against PyTorch:
//
//   ckpt_torch_export OUT_DIR  ->  OUT_DIR/model.ckpt, OUT_DIR/x.f32 (N, 3, 32, 32) normalised test images,
//                                  OUT_DIR/y.i32 (N) labels, OUT_DIR/logits.f32 (N, 10) the kit's logits
//   and prints "kit: N test images, C correct".
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit/check.h"
#include "kit/ckpt.h"
#include "kit/data.h"
#include "kit/model.h"
#include "kit/ops.h"
#include "kit/optim.h"

enum { BATCH = 32, STEPS = 40, TEST_N = 500, CLASSES = 10 };

static void write_file(const char *dir, const char *name, const void *p, size_t bytes) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL, "the output folder must exist and be writable");
    CHECK(fwrite(p, 1, bytes, f) == bytes, "disk full?");
    CHECK(fclose(f) == 0, "disk full?");
}

int main(int argc, char **argv) {
    if (argc != 2) die("usage: %s OUT_DIR", argv[0]);
    Dataset train, test;
    dataset_synthetic(&train, 2000, CLASSES, 3, 32, 32, DATASET_SYNTHETIC_SEED, SPLIT_TRAIN);
    dataset_synthetic(&test, TEST_N, CLASSES, 3, 32, 32, DATASET_SYNTHETIC_SEED, SPLIT_TEST);
    ModelConfig cfg;
    CHECK(model_config(&cfg, "resnet9", 8, 3, 32, 32, CLASSES), "resnet9 is one of the kit's models");
    Model *m = model_create(&cfg, DEVICE_CPU, BATCH, 3);

    // A few SGD steps, so that weights, momentum and BN running statistics are all far from their initial values.
    Sampler s;
    sampler_init(&s, train.n, 0, 1, 3, SAMPLER_TRAIN_DROP);
    Loader *L = loader_create(&train, &s, BATCH, true, NULL, 3);
    SgdConfig opt = {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-4f, .nesterov = true};
    loader_start_epoch(L, 0, 0);
    for (int step = 0; step < STEPS; step++) {
        const Batch *b = loader_next(L, NULL);
        const float *logits = model_forward(m, b->x, b->n, true);
        memset(m->dlogits, 0, (size_t)b->n * CLASSES * sizeof(float));
        cross_entropy_backward(DEVICE_CPU, b->n, CLASSES, logits, b->y, 0.0f, 1.0f / b->n, m->dlogits);
        model_zero_grad(m);
        model_backward(m, b->x, m->dlogits, b->n);
        optim_step(m, &opt);
    }
    loader_free(L);

    char path[1024], err[512];
    snprintf(path, sizeof path, "%s/model.ckpt", argv[1]);
    CkptState st = {.model = cfg, .world = 1, .global_batch = BATCH, .steps_per_epoch = train.n / BATCH, .epochs = 1,
                    .batch_in_epoch = STEPS, .step = STEPS, .seed = 3, .peak_lr = opt.lr, .momentum = opt.momentum,
                    .weight_decay = opt.weight_decay, .nesterov = 1};
    snprintf(st.dataset, sizeof st.dataset, "synthetic");
    if (ckpt_save(path, m, &st, err, sizeof err) != 0) die("%s", err);

    // Eval mode over the test split, in batches, in order.
    size_t image = (size_t)3 * 32 * 32;
    float *x = xmalloc(TEST_N * image * sizeof(float)), *logits = xmalloc(TEST_N * CLASSES * sizeof(float));
    int *y = xmalloc(TEST_N * sizeof(int)), *idx = xmalloc(TEST_N * sizeof(int));
    for (int i = 0; i < TEST_N; i++) idx[i] = i;
    dataset_fill_batch(&test, idx, TEST_N, NULL, 0, 0, x, y);
    int correct = 0;
    for (int at = 0; at < TEST_N; at += BATCH) {
        int n = TEST_N - at < BATCH ? TEST_N - at : BATCH;
        const float *out = model_forward(m, x + at * image, n, false);
        memcpy(logits + (size_t)at * CLASSES, out, (size_t)n * CLASSES * sizeof(float));
        for (int i = 0; i < n; i++) {
            int best = 0;
            for (int k = 1; k < CLASSES; k++) best = out[i * CLASSES + k] > out[i * CLASSES + best] ? k : best;
            correct += best == y[at + i];
        }
    }
    write_file(argv[1], "x.f32", x, TEST_N * image * sizeof(float));
    write_file(argv[1], "y.i32", y, TEST_N * sizeof(int));
    write_file(argv[1], "logits.f32", logits, TEST_N * CLASSES * sizeof(float));
    printf("kit: %d test images, %d correct\n", TEST_N, correct);
    free(x), free(logits), free(y), free(idx);
    model_free(m);
    dataset_free(&train);
    dataset_free(&test);
    return 0;
}
