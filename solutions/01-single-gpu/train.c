// train.c: lesson 01, a complete image-classifier training program on one device.
//
//   ./train --dataset fashion-mnist --epochs 5
//
// Read it top to bottom: options, data, model, then the loop that the whole workshop builds on:
//
//   for each epoch:
//       for each batch (prepared by a background thread while we compute):
//           train_step: copy to the device -> forward -> loss -> backward -> SGD update   (TODO 3, 1, 2)
//       evaluate on the test split                                                       (TODO 4)
//
// Everything you write is marked TODO; the kit (../../kit) supplies the layers, the data and the logging.
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "data.h"
#include "device.h"
#include "lesson.h"
#include "log.h"
#include "model.h"
#include "ops.h"
#include "optim.h"

// ---------------------------------------------------------------- the training step (TODO 3)

// TODO 3: one training step on `batch` (host memory: batch->x is (n, C, H, W), batch->y is (n)).
//   a. copy the images into m->input and the labels into m->labels    (device_copy_to)
//   b. forward in training mode                                        (model_forward -> logits (n, classes))
//   c. per-sample losses into m->loss, predictions into m->pred        (cross_entropy_forward, argmax_rows)
//   d. dloss/dlogits into m->dlogits: zero it first (backward ops ADD into gradients), then
//      cross_entropy_backward with scale 1/n, because the loss is the MEAN over the batch
//   e. zero the parameter gradients, then backward                     (model_zero_grad, model_backward)
//   f. the update, with YOUR lesson_sgd_update                         (optim_step_with)
//   g. return the mean loss and the number of correct predictions (copy m->loss and m->pred to the host)
// PyTorch: x, y = x.to(dev), y.to(dev); out = model(x); loss = F.cross_entropy(out, y)
//          opt.zero_grad(); loss.backward(); opt.step()
StepResult train_step(Model *m, const Batch *batch, const SgdConfig *opt, float lr, float label_smoothing) {
    StepResult r = {0.0, 0};
    // BEGIN SOLUTION
    Device d = m->device;
    int n = batch->n, k = m->cfg.classes;
    size_t image_floats = (size_t)m->cfg.in_c * m->cfg.in_h * m->cfg.in_w;
    device_copy_to(d, m->input, batch->x, (size_t)n * image_floats * sizeof(float));
    device_copy_to(d, m->labels, batch->y, (size_t)n * sizeof(int));

    const float *logits = model_forward(m, m->input, n, true);
    cross_entropy_forward(d, n, k, logits, m->labels, label_smoothing, m->loss);
    argmax_rows(d, n, k, logits, m->pred);

    device_memset_zero(d, m->dlogits, (size_t)n * k * sizeof(float));
    cross_entropy_backward(d, n, k, logits, m->labels, label_smoothing, 1.0f / (float)n, m->dlogits);
    model_zero_grad(m);
    model_backward(m, m->input, m->dlogits, n);
    optim_step_with(m, opt, lr, lesson_sgd_update);

    float *loss = xmalloc((size_t)n * sizeof(float));
    int *pred = xmalloc((size_t)n * sizeof(int));
    device_copy_from(d, loss, m->loss, (size_t)n * sizeof(float));
    device_copy_from(d, pred, m->pred, (size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) {
        r.loss += loss[i] / n;
        r.correct += pred[i] == batch->y[i];
    }
    free(loss);
    free(pred);
    // END SOLUTION
    return r;
}

// ---------------------------------------------------------------- evaluation (TODO 4)

// TODO 4: evaluate the model on every batch of `loader` (the test split, no augmentation).
//   - start the epoch (loader_start_epoch(loader, 0, 0)), then loop while loader_next returns a batch
//   - copy the batch to the device, forward in EVAL mode (BN uses its running statistics),
//     per-sample losses and arg-max predictions, copy them back and add them up
//   - count every sample exactly once: the last batch may be shorter than the others
// PyTorch: model.eval(); with torch.no_grad(): for x, y in loader: ...
EvalResult evaluate(Model *m, Loader *loader) {
    EvalResult r = {0.0, 0, 0};
    // BEGIN SOLUTION
    Device d = m->device;
    int k = m->cfg.classes;
    size_t image_floats = (size_t)m->cfg.in_c * m->cfg.in_h * m->cfg.in_w;
    float *loss = xmalloc((size_t)m->max_batch * sizeof(float));
    int *pred = xmalloc((size_t)m->max_batch * sizeof(int));
    loader_start_epoch(loader, 0, 0);
    const Batch *b;
    while ((b = loader_next(loader, NULL)) != NULL) {
        device_copy_to(d, m->input, b->x, (size_t)b->n * image_floats * sizeof(float));
        device_copy_to(d, m->labels, b->y, (size_t)b->n * sizeof(int));
        const float *logits = model_forward(m, m->input, b->n, false);
        cross_entropy_forward(d, b->n, k, logits, m->labels, 0.0f, m->loss);
        argmax_rows(d, b->n, k, logits, m->pred);
        device_copy_from(d, loss, m->loss, (size_t)b->n * sizeof(float));
        device_copy_from(d, pred, m->pred, (size_t)b->n * sizeof(int));
        for (int i = 0; i < b->n; i++) {
            r.loss_sum += loss[i];
            r.correct += pred[i] == b->y[i];
        }
        r.count += b->n;
    }
    free(loss);
    free(pred);
    // END SOLUTION
    return r;
}

#ifndef AUTOGRADER
// ---------------------------------------------------------------- options

typedef struct {
    const char *dataset, *data_dir, *device, *model, *metrics;
    int width, epochs, batch_size, warmup_epochs;
    float lr, momentum, weight_decay, label_smoothing;
    bool nesterov;
    unsigned long long seed;
} Options;

static void usage(FILE *out) {
    fprintf(out,
            "usage: train [options]\n"
            "  --dataset NAME      %s (default synthetic)\n"
            "  --data-dir DIR      where the dataset files are (default datasets/data)\n"
            "  --device DEV        auto|cpu|cuda (default auto: the GPU when one is usable)\n"
            "  --model NAME        %s (default: resnet9 for CIFAR, fmnist for Fashion-MNIST, tiny-bn for synthetic)\n"
            "  --width N           base channel count of the model (default: the model's own)\n"
            "  --epochs N          passes over the training set (default: per dataset, see README)\n"
            "  --batch-size N      images per step (default 128)\n"
            "  --lr X              peak learning rate (default 0.05)\n"
            "  --momentum X        SGD momentum (default 0.9)\n"
            "  --nesterov          use Nesterov momentum\n"
            "  --weight-decay X    L2 penalty on conv/linear weights (default 5e-4)\n"
            "  --label-smoothing X (default 0)\n"
            "  --warmup-epochs N   linear learning-rate warmup, then linear decay to 0 (default 1)\n"
            "  --seed N            seed for initialisation, shuffling and augmentation (default 1)\n"
            "  --metrics FILE      append one CSV row per epoch to FILE\n"
            "  --help              this text\n",
            dataset_names(), model_names());
}

// A wrong option is the user's mistake, not a crash: one line saying what is wrong, the usage, exit 2.
static void usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, "train: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n");
    usage(stderr);
    exit(2);
}

static long parse_long(const char *name, const char *s, long lo, long hi) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s needs an integer in [%ld, %ld], got '%%s'", name, lo, hi);
        usage_error(msg, s);
    }
    return v;
}

static float parse_float(const char *name, const char *s, float lo, float hi) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s needs a number in [%g, %g], got '%%s'", name, lo, hi);
        usage_error(msg, s);
    }
    return v;
}

// Is name one of the entries of "a|b|c"?
static bool name_in_list(const char *name, const char *list) {
    size_t len = strlen(name);
    for (const char *p = list; *p; p = strchr(p, '|') ? strchr(p, '|') + 1 : p + strlen(p))
        if (strncmp(p, name, len) == 0 && (p[len] == '|' || p[len] == '\0')) return true;
    return false;
}

static Options parse_options(int argc, char **argv) {
    Options o = {.dataset = "synthetic", .data_dir = "datasets/data", .device = "auto", .model = NULL,
                 .metrics = NULL, .width = 0, .epochs = 0, .batch_size = 128, .warmup_epochs = 1,
                 .lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-4f, .label_smoothing = 0.0f,
                 .nesterov = false, .seed = 1};
    static const struct option longopts[] = {
        {"dataset", required_argument, 0, 'd'},   {"data-dir", required_argument, 0, 'D'},
        {"device", required_argument, 0, 'v'},    {"model", required_argument, 0, 'm'},
        {"width", required_argument, 0, 'w'},     {"epochs", required_argument, 0, 'e'},
        {"batch-size", required_argument, 0, 'b'}, {"lr", required_argument, 0, 'l'},
        {"momentum", required_argument, 0, 'M'},  {"nesterov", no_argument, 0, 'n'},
        {"weight-decay", required_argument, 0, 'W'}, {"label-smoothing", required_argument, 0, 'S'},
        {"warmup-epochs", required_argument, 0, 'u'}, {"seed", required_argument, 0, 's'},
        {"metrics", required_argument, 0, 'o'},   {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    opterr = 0;  // we print our own one-line error
    int c;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 'd': o.dataset = optarg; break;
        case 'D': o.data_dir = optarg; break;
        case 'v': o.device = optarg; break;
        case 'm': o.model = optarg; break;
        case 'w': o.width = (int)parse_long("--width", optarg, 1, 4096); break;
        case 'e': o.epochs = (int)parse_long("--epochs", optarg, 1, 100000); break;
        case 'b': o.batch_size = (int)parse_long("--batch-size", optarg, 1, 65536); break;
        case 'l': o.lr = parse_float("--lr", optarg, 0.0f, 100.0f); break;
        case 'M': o.momentum = parse_float("--momentum", optarg, 0.0f, 0.999f); break;
        case 'n': o.nesterov = true; break;
        case 'W': o.weight_decay = parse_float("--weight-decay", optarg, 0.0f, 1.0f); break;
        case 'S': o.label_smoothing = parse_float("--label-smoothing", optarg, 0.0f, 0.999f); break;
        case 'u': o.warmup_epochs = (int)parse_long("--warmup-epochs", optarg, 0, 100000); break;
        case 's': o.seed = (unsigned long long)parse_long("--seed", optarg, 0, 0x7fffffffL); break;
        case 'o': o.metrics = optarg; break;
        case 'h': usage(stdout); exit(0);
        default: usage_error("unknown option, or an option without its value: '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) usage_error("unexpected argument '%s'", argv[optind]);
    if (!name_in_list(o.dataset, dataset_names())) usage_error("unknown dataset '%s'", o.dataset);
    if (o.model && !name_in_list(o.model, model_names())) usage_error("unknown model '%s'", o.model);
    return o;
}

// Defaults that depend on the dataset: the model, and an epoch count that reaches the README's accuracy.
static void apply_dataset_defaults(Options *o) {
    bool cifar = strncmp(o->dataset, "cifar", 5) == 0;
    bool fmnist = strcmp(o->dataset, "fashion-mnist") == 0;
    if (!o->model) o->model = cifar ? "resnet9" : fmnist ? "fmnist" : "tiny-bn";
    if (!o->epochs) o->epochs = cifar ? 24 : fmnist ? 8 : 3;
}

// ---------------------------------------------------------------- main

int main(int argc, char **argv) {
    Options o = parse_options(argc, argv);
    apply_dataset_defaults(&o);
    Device dev;
    if (!device_parse(o.device, &dev, false)) usage_error("--device must be auto, cpu or cuda, got '%s'", o.device);

    // Data: the training split is shuffled every epoch and augmented; the test split is neither.
    Dataset train_set, test_set;
    char err[512];
    if (dataset_load(&train_set, o.dataset, o.data_dir, SPLIT_TRAIN, err, sizeof err) != 0 ||
        dataset_load(&test_set, o.dataset, o.data_dir, SPLIT_TEST, err, sizeof err) != 0)
        die("%s\n  HINT: run `datasets/get-data.sh` (or `make run`), or pass --data-dir", err);
    Sampler train_sampler, test_sampler;
    sampler_init(&train_sampler, train_set.n, 0, 1, o.seed, SAMPLER_TRAIN_DROP);
    sampler_init(&test_sampler, test_set.n, 0, 1, o.seed, SAMPLER_EVAL);
    // Crop+flip suit natural images; the synthetic patterns and Fashion-MNIST's centred items get neither.
    Augment aug = {.crop_pad = 4, .flip = true};
    bool augment = strncmp(o.dataset, "cifar", 5) == 0;
    Loader *train_loader = loader_create(&train_set, &train_sampler, o.batch_size, true, augment ? &aug : NULL, o.seed);
    Loader *test_loader = loader_create(&test_set, &test_sampler, o.batch_size, false, NULL, o.seed);

    // Model and optimizer.
    ModelConfig cfg;
    if (!model_config(&cfg, o.model, o.width, train_set.c, train_set.h, train_set.w, train_set.classes))
        usage_error("unknown model '%s'", o.model);
    Model *m = model_create(&cfg, dev, o.batch_size, o.seed);
    SgdConfig opt = {.lr = o.lr, .momentum = o.momentum, .weight_decay = o.weight_decay, .nesterov = o.nesterov};
    int steps_per_epoch = loader_batches_per_epoch(train_loader);
    if (steps_per_epoch == 0) die("--batch-size %d is larger than the training set (%d images)", o.batch_size, train_set.n);
    LrSchedule sched = {.peak_lr = o.lr, .warmup_steps = o.warmup_epochs * steps_per_epoch,
                        .total_steps = o.epochs * steps_per_epoch, .final_lr = 0.0f, .decay = DECAY_LINEAR};
    printf("dataset: %s (%d train, %d test, %dx%dx%d, %d classes)\n", train_set.name, train_set.n, test_set.n,
           train_set.c, train_set.h, train_set.w, train_set.classes);
    model_print(m, stdout);

    double run_start = time_now(), data_wait = 0.0, train_seconds = 0.0;
    long images_seen = 0;
    double last_loss = 0.0, test_acc = 0.0;
    for (int epoch = 0; epoch < o.epochs; epoch++) {
        char label[32];
        snprintf(label, sizeof label, "epoch %d/%d", epoch + 1, o.epochs);
        Progress bar;
        progress_begin(&bar, label, steps_per_epoch, true);
        loader_start_epoch(train_loader, epoch, 0);
        double epoch_start = time_now(), loss_sum = 0.0;
        long correct = 0, seen = 0;
        const Batch *b;
        double wait;
        while ((b = loader_next(train_loader, &wait)) != NULL) {
            int step = epoch * steps_per_epoch + b->index;
            StepResult r = train_step(m, b, &opt, lr_at(&sched, step), o.label_smoothing);
            data_wait += wait;
            loss_sum += r.loss * b->n;
            correct += r.correct;
            seen += b->n;
            progress_update(&bar, b->index + 1, loss_sum / seen, (double)correct / seen,
                            seen / (time_now() - epoch_start));
        }
        progress_end(&bar);
        double epoch_seconds = time_now() - epoch_start;
        train_seconds += epoch_seconds;
        images_seen += seen;
        last_loss = loss_sum / seen;

        EvalResult ev = evaluate(m, test_loader);
        test_acc = ev.count ? (double)ev.correct / ev.count : 0.0;
        printf("epoch %d: train_loss %.4f train_acc %.2f%% test_loss %.4f test_acc %.2f%% (%.1f s, %.0f img/s)\n",
               epoch + 1, last_loss, 100.0 * correct / seen, ev.count ? ev.loss_sum / ev.count : 0.0,
               100.0 * test_acc, epoch_seconds, seen / epoch_seconds);
        if (o.metrics) {
            double row[] = {epoch + 1, last_loss, (double)correct / seen, ev.loss_sum / ev.count, test_acc,
                            seen / epoch_seconds, lr_at(&sched, (epoch + 1) * steps_per_epoch - 1)};
            metrics_append(o.metrics, "epoch,train_loss,train_acc,test_loss,test_acc,images_per_s,lr", row, 7);
        }
    }
    double total = time_now() - run_start;
    // Where did the training time go? Waiting for the loader thread, or computing?
    printf("time: %.1f s training, of which %.1f s (%.0f%%) waiting for data and %.1f s computing\n", train_seconds,
           data_wait, 100.0 * data_wait / train_seconds, train_seconds - data_wait);
    printf("final: dataset=%s device=%s epochs=%d train_loss=%.4f test_acc=%.4f images_per_s=%.0f seconds=%.1f\n",
           train_set.name, device_name(dev), o.epochs, last_loss, test_acc, images_seen / train_seconds, total);

    loader_free(train_loader);
    loader_free(test_loader);
    model_free(m);
    dataset_free(&train_set);
    dataset_free(&test_set);
    return 0;
}
#endif  // AUTOGRADER
