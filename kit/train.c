// kit/train.c: forward+backward of one batch, evaluation, and opening a dataset for a rank (see train.h).
#include "train.h"

#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ops.h"

// Copies the batch into the model's device buffers.
static void batch_to_device(Model *m, const Batch *b) {
    size_t image_floats = (size_t)m->cfg.in_c * m->cfg.in_h * m->cfg.in_w;
    device_copy_to(m->device, m->input, b->x, (size_t)b->n * image_floats * sizeof(float));
    device_copy_to(m->device, m->labels, b->y, (size_t)b->n * sizeof(int));
}

// Adds the per-sample losses and correct predictions of the last forward to *acc.
static void metrics_add(Model *m, const Batch *b, Metrics *acc) {
    float *loss = xmalloc((size_t)b->n * sizeof(float));
    int *pred = xmalloc((size_t)b->n * sizeof(int));
    device_copy_from(m->device, loss, m->loss, (size_t)b->n * sizeof(float));
    device_copy_from(m->device, pred, m->pred, (size_t)b->n * sizeof(int));
    for (int i = 0; i < b->n; i++) {
        acc->loss_sum += loss[i];
        acc->correct += pred[i] == b->y[i];
    }
    acc->count += b->n;
    free(loss);
    free(pred);
}

void train_forward_backward(Model *m, const Batch *b, float label_smoothing, float grad_scale, Metrics *acc) {
    Device d = m->device;
    int n = b->n, k = m->cfg.classes;
    batch_to_device(m, b);
    const float *logits = model_forward(m, m->input, n, true);
    cross_entropy_forward(d, n, k, logits, m->labels, label_smoothing, m->loss);
    argmax_rows(d, n, k, logits, m->pred);
    device_memset_zero(d, m->dlogits, (size_t)n * k * sizeof(float));  // backward ops accumulate
    cross_entropy_backward(d, n, k, logits, m->labels, label_smoothing, grad_scale, m->dlogits);
    model_zero_grad(m);
    model_backward(m, m->input, m->dlogits, n);
    if (acc) metrics_add(m, b, acc);
}

Metrics train_evaluate(Model *m, Loader *L) {
    Metrics r = {0, 0, 0};
    loader_start_epoch(L, 0, 0);
    const Batch *b;
    while ((b = loader_next(L, NULL)) != NULL) {
        batch_to_device(m, b);
        const float *logits = model_forward(m, m->input, b->n, false);
        cross_entropy_forward(m->device, b->n, m->cfg.classes, logits, m->labels, 0.0f, m->loss);
        argmax_rows(m->device, b->n, m->cfg.classes, logits, m->pred);
        metrics_add(m, b, &r);
    }
    return r;
}

void train_data_open(TrainData *td, const TrainOptions *o, int rank, int world, int local_batch) {
    char err[512];
    memset(td, 0, sizeof *td);
    if (dataset_load(&td->train, o->dataset, o->data_dir, SPLIT_TRAIN, err, sizeof err) != 0 ||
        dataset_load(&td->test, o->dataset, o->data_dir, SPLIT_TEST, err, sizeof err) != 0)
        die("%s\n  HINT: run `datasets/get-data.sh` (or `make run`), or pass --data-dir", err);
    sampler_init(&td->train_sampler, td->train.n, rank, world, o->seed, SAMPLER_TRAIN_DROP);
    sampler_init(&td->test_sampler, td->test.n, rank, world, o->seed, SAMPLER_EVAL);
    // Crop + flip suit natural photos; Fashion-MNIST's centred items and the synthetic patterns get neither.
    static const Augment cifar_aug = {.crop_pad = 4, .flip = true};
    const Augment *aug = strncmp(o->dataset, "cifar", 5) == 0 ? &cifar_aug : NULL;
    td->train_loader = loader_create(&td->train, &td->train_sampler, local_batch, true, aug, o->seed);
    td->test_loader = loader_create(&td->test, &td->test_sampler, local_batch, false, NULL, o->seed);
    if (loader_batches_per_epoch(td->train_loader) == 0)
        die("a batch of %d per rank is more than this rank's share of the training set (%d images)", local_batch,
            sampler_len(&td->train_sampler));
}

void train_data_close(TrainData *td) {
    loader_free(td->train_loader);
    loader_free(td->test_loader);
    dataset_free(&td->train);
    dataset_free(&td->test);
}
