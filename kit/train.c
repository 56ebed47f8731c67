// kit/train.c: forward+backward of one batch, evaluation, and opening a dataset for a rank (see train.h).
#include "kit/train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit/check.h"
#include "kit/ops.h"
#include "kit/trace.h"

// The batch on the model's device: the loader's own copy when it staged one (on CUDA, copied while the
// previous step computed: data.h, batch_on_device), else a synchronous copy into the model's buffers.
// *x: (b->n, C, H, W), *y: (b->n).
static void batch_to_device(Model *m, const Batch *b, const float **x, const int **y) {
    if (batch_on_device(b, m->device, x, y)) return;
    size_t image_floats = (size_t)m->cfg.in_c * m->cfg.in_h * m->cfg.in_w;
    device_copy_to(m->device, m->input, b->x, (size_t)b->n * image_floats * sizeof(float));
    device_copy_to(m->device, m->labels, b->y, (size_t)b->n * sizeof(int));
    *x = m->input;
    *y = m->labels;
}

// Adds the per-sample losses and correct predictions of the last forward to *acc.
static void metrics_add(Model *m, const Batch *b, Metrics *acc) {
    float *loss = m->host_loss;  // (b->n)
    int *pred = m->host_pred;    // (b->n)
    device_copy_from(m->device, loss, m->loss, (size_t)b->n * sizeof(float));
    device_copy_from(m->device, pred, m->pred, (size_t)b->n * sizeof(int));
    for (int i = 0; i < b->n; i++) {
        acc->loss_sum += loss[i];
        acc->correct += pred[i] == b->y[i];
    }
    acc->count += b->n;
}

Metrics train_forward_backward(Model *m, const Batch *b, float label_smoothing, float grad_scale) {
    Device d = m->device;
    int n = b->n, k = m->cfg.classes;
    const float *x;
    const int *y;
    batch_to_device(m, b, &x, &y);
    double t = trace_begin("forward");
    const float *logits = model_forward(m, x, n, true);
    cross_entropy_forward(d, n, k, logits, y, label_smoothing, m->loss);
    argmax_rows(d, n, k, logits, m->pred);
    trace_end(t, TRACE_COMPUTE, "forward");
    t = trace_begin("backward");
    device_memset_zero(d, m->dlogits, (size_t)n * k * sizeof(float));  // backward ops accumulate
    cross_entropy_backward(d, n, k, logits, y, label_smoothing, grad_scale, m->dlogits);
    model_zero_grad(m);
    model_backward(m, x, m->dlogits, n);
    trace_end(t, TRACE_COMPUTE, "backward");
    Metrics r = {0, 0, 0};
    metrics_add(m, b, &r);
    return r;
}

Metrics train_evaluate(Model *m, Loader *L) {
    Metrics r = {0, 0, 0};
    loader_start_epoch(L, 0, 0);
    const Batch *b;
    while ((b = loader_next(L, NULL)) != NULL) {
        const float *x;
        const int *y;
        batch_to_device(m, b, &x, &y);
        const float *logits = model_forward(m, x, b->n, false);
        cross_entropy_forward(m->device, b->n, m->cfg.classes, logits, y, 0.0f, m->loss);
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
    // PyTorch's DistributedSampler + DataLoader: drop_last=True for both by default; --keep-last-batch is their
    // drop_last=False (the shards padded to equal length, the short last batch trained on).
    bool keep = o->keep_last_batch;
    sampler_init(&td->train_sampler, td->train.n, rank, world, o->seed, keep ? SAMPLER_TRAIN_PAD : SAMPLER_TRAIN_DROP);
    sampler_init(&td->test_sampler, td->test.n, rank, world, o->seed, SAMPLER_EVAL);
    const Augment *aug = &dataset_info(o->dataset)->train_augment;  // the dataset table (kit/data.c)
    td->train_loader = loader_create(&td->train, &td->train_sampler, local_batch, !keep, aug, o->seed);
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

SgdConfig train_sgd_config(const TrainOptions *o) {
    // lr: set from the schedule before every step (optim.h); --lr reaches it only through train_schedule.
    SgdConfig c = {.lr = 0.0f, .momentum = o->momentum, .weight_decay = o->weight_decay, .nesterov = o->nesterov};
    return c;
}

void train_identity(CkptState *id, const ModelConfig *cfg, const TrainOptions *o, const LrSchedule *sched) {
    memset(id, 0, sizeof *id);
    id->model = *cfg;
    snprintf(id->dataset, sizeof id->dataset, "%s", o->dataset ? o->dataset : "");
    id->global_batch = o->batch_size;
    id->epochs = o->epochs;
    id->seed = o->seed;
    id->peak_lr = sched->peak_lr;
    id->warmup_steps = sched->warmup_steps;
    id->momentum = o->momentum;  // what train_sgd_config gives the optimizer and lesson 04's capture saves
    id->weight_decay = o->weight_decay;
    id->nesterov = o->nesterov;
}

LrSchedule train_schedule(const TrainOptions *o, int steps_per_epoch) {
    LrSchedule s = {.peak_lr = o->lr, .warmup_steps = o->warmup_epochs * steps_per_epoch,
                    .total_steps = o->epochs * steps_per_epoch, .final_lr = 0.0f, .decay = DECAY_LINEAR};
    return s;
}

void train_print_setup(const TrainData *td, const Model *m) {
    printf("dataset: %s (%d train, %d test, %dx%dx%d, %d classes)\n", td->train.name, td->train.n, td->test.n,
           td->train.c, td->train.h, td->train.w, td->train.classes);
    model_print(m, stdout);
}

// ---------------------------------------------------------------- TrainLog

void trainlog_begin(TrainLog *log, const TrainOptions *o, const char *dataset, Device dev, int world, bool enabled) {
    memset(log, 0, sizeof *log);
    log->world = world > 1 ? world : 1;
    log->o = o;
    log->dataset = dataset;
    log->device = dev;
    log->enabled = enabled;
    log->run_start = time_now();
}

void trainlog_epoch_begin(TrainLog *log, int epoch, int steps) {
    snprintf(log->label, sizeof log->label, "epoch %d/%d", epoch + 1, log->o->epochs);
    log->epoch = epoch;
    log->steps = steps;
    log->local = (Metrics){0, 0, 0};
    progress_begin(&log->bar, log->label, steps, log->enabled);
    log->epoch_start = time_now();
}

void trainlog_step(TrainLog *log, int batch_index, const Metrics *batch, double wait_seconds) {
    log->data_wait += wait_seconds;
    log->local.loss_sum += batch->loss_sum;
    log->local.correct += batch->correct;
    log->local.count += batch->count;
    const Metrics *m = &log->local;
    if (m->count)
        progress_update(&log->bar, batch_index + 1, m->loss_sum / m->count, (double)m->correct / m->count,
                        (double)m->count * log->world / (time_now() - log->epoch_start));
}

static double safe_div(double a, double b) { return b > 0 ? a / b : 0.0; }

void trainlog_epoch_end(TrainLog *log, const Metrics *train, const Metrics *test, float lr) {
    progress_end(&log->bar);
    double seconds = time_now() - log->epoch_start;
    log->train_seconds += seconds;
    log->images += log->local.count;
    log->last_loss = safe_div(train->loss_sum, (double)train->count);
    log->test_acc = safe_div((double)test->correct, (double)test->count);
    double train_acc = safe_div((double)train->correct, (double)train->count);
    double test_loss = safe_div(test->loss_sum, (double)test->count);
    // This process's images times the ranks (as trainlog_final): not train->count, which may hold a resumed
    // epoch's images from before the restart (lesson 04).
    double images_per_s = safe_div((double)log->local.count * log->world, seconds);
    if (!log->enabled) return;
    printf("epoch %d: train_loss %.4f train_acc %.2f%% test_loss %.4f test_acc %.2f%% (%.1f s, %.0f img/s)\n",
           log->epoch + 1, log->last_loss, 100.0 * train_acc, test_loss, 100.0 * log->test_acc, seconds, images_per_s);
    if (log->o->metrics) {
        double row[] = {log->epoch + 1, log->last_loss, train_acc, test_loss, log->test_acc, images_per_s, lr};
        metrics_append(log->o->metrics, "epoch,train_loss,train_acc,test_loss,test_acc,images_per_s,lr", row, 7);
    }
}

void trainlog_epoch_cut(TrainLog *log) {
    progress_end(&log->bar);
    log->train_seconds += time_now() - log->epoch_start;
    log->images += log->local.count;
    if (log->local.count) log->last_loss = log->local.loss_sum / (double)log->local.count;
}

void trainlog_final(TrainLog *log, const char *extra) {
    if (!log->enabled) return;
    double total = time_now() - log->run_start, t = log->train_seconds;
    // Where did the training time go? Waiting for the loader thread, or computing?
    printf("time: %.1f s training, of which %.1f s (%.0f%%) waiting for data and %.1f s computing\n", t,
           log->data_wait, 100.0 * safe_div(log->data_wait, t), t - log->data_wait);
    printf("final: dataset=%s device=%s epochs=%d train_loss=%.4f test_acc=%.4f images_per_s=%.0f seconds=%.1f%s%s\n",
           log->dataset, device_name(log->device), log->o->epochs, log->last_loss, log->test_acc,
           safe_div((double)log->images * log->world, t), total, extra ? " " : "", extra ? extra : "");
    fflush(stdout);
}
