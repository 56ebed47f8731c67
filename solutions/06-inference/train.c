// train.c: lesson 06, the inference program: a checkpoint written by lesson 04 (any number of ranks, any device)
// evaluated on ONE device, its result compared with the training run's own last evaluation.
//
//   ./train --checkpoint run1/ckpt-00000234.ckpt                      the test set: accuracy, per class, confusion
//   ./train --checkpoint last.ckpt --image cat.png                    one image file: the 5 most likely classes
//   ./train --checkpoint last.ckpt --latency                          batch 1 latency (p50, p99), batch 256 throughput
//                                                                     (instead of the evaluation)
//
// (`make lesson-06` trains a short lesson 04 run first when ARGS has no --checkpoint.) Options are the kit's
// (kit/cli.c): --dataset, --model and --width must say what the checkpoint was trained with, as for a resume;
// --batch-size is the evaluation's batch and changes nothing in the result. What you write is in infer.c.
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kit/check.h"
#include "kit/cli.h"
#include "kit/data.h"
#include "kit/device.h"
#include "kit/log.h"
#include "kit/model.h"
#include "kit/trace.h"
#include "lesson.h"

#define TOP_K 5
#define LATENCY_RUNS 200       // batch-1 forwards timed (after LATENCY_WARMUP)
#define LATENCY_WARMUP 20
#define THROUGHPUT_BATCH 256
#define THROUGHPUT_SECONDS 2.0 // batches of 256 timed for at least this long (and at least 3)

// The correct count of the evaluation the checkpoint's weights had in training, or -1 when it has none: a
// checkpoint saved at the end of an epoch (batch_in_epoch 0) holds the weights that epoch's evaluation saw;
// one saved mid-epoch (--save-every, a signal) holds later weights than its test_acc.
static long reference_correct(const CkptState *st, long count) {
    if (st->epoch == 0 || st->batch_in_epoch != 0) return -1;
    return lround(st->test_acc * (double)count);  // test_acc = correct / count, a double: exact after rounding
}

static void print_per_class(const EvalReport *r, const char *dataset) {
    printf("per class (accuracy = diagonal / row sum):\n");
    for (int k = 0; k < r->classes; k++) {
        long row = 0;
        for (int j = 0; j < r->classes; j++) row += r->confusion[(size_t)k * r->classes + j];
        long hit = r->confusion[(size_t)k * r->classes + k];
        printf("  %3d %-14s %5ld / %-5ld %6.2f %%\n", k, class_name(dataset, k), hit, row,
               row ? 100.0 * (double)hit / (double)row : 0.0);
    }
    if (r->classes > 20) {
        printf("confusion matrix: %d classes, too wide to print (--confusion FILE writes it as CSV)\n", r->classes);
        return;
    }
    printf("confusion matrix (rows: true class, columns: predicted class):\n      ");
    for (int j = 0; j < r->classes; j++) printf(" %5d", j);
    printf("\n");
    for (int k = 0; k < r->classes; k++) {
        printf("  %3d ", k);
        for (int j = 0; j < r->classes; j++) printf(" %5ld", r->confusion[(size_t)k * r->classes + j]);
        printf("\n");
    }
}

// --confusion FILE must be writable BEFORE the evaluation runs (minutes on a large test set), not found out after
// it: opened for appending (which truncates nothing), and removed again when this check created it; and not a
// checkpoint (--overwrite allows even that).
static int check_writable(const char *path, bool o_overwrite, char *err, size_t errlen) {
    struct stat sb;
    bool existed = stat(path, &sb) == 0;
    if (existed && S_ISDIR(sb.st_mode))
        return check_reason(err, errlen, "--confusion %s: a directory: give a file name (e.g. %s/confusion.csv)", path,
                            path);
    FILE *f = fopen(path, "a");
    if (!f) return check_reason(err, errlen, "--confusion %s: cannot write there: %s", path, strerror(errno));
    fclose(f);
    if (!existed) unlink(path);
    // A report never replaces a run's work: a checkpoint there is refused (the kit's check, kit/ckpt.h).
    CkptState none;
    memset(&none, 0, sizeof none);
    CkptOwner me = {.id = &none, .overwrite = o_overwrite};
    return ckpt_check_file_owner("--confusion", path, CKPT_OUT_REPORT, &me, err, errlen);
}

// CSV for scripts/plot-metrics.sh (make plot): a header "true\predicted,0,1,...", then one row per true class.
// Returns 0, or -1 with errno set (the file could not be opened, written or closed).
static int write_confusion_csv(const char *path, const EvalReport *r) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "true\\predicted");
    for (int j = 0; j < r->classes; j++) fprintf(f, ",%d", j);
    fprintf(f, "\n");
    for (int k = 0; k < r->classes; k++) {
        fprintf(f, "%d", k);
        for (int j = 0; j < r->classes; j++) fprintf(f, ",%ld", r->confusion[(size_t)k * r->classes + j]);
        fprintf(f, "\n");
    }
    bool failed = ferror(f) != 0;
    return fclose(f) != 0 || failed ? -1 : 0;
}

static int predict_image(Model *m, const TrainOptions *o, const Dataset *ds) {
    char err[1024];
    Image img;
    const ModelConfig *cfg = &m->cfg;
    float *x = xmalloc((size_t)cfg->in_c * cfg->in_h * cfg->in_w * sizeof(float));  // (C, H, W)
    if (image_read(o->image, cfg->in_c, cfg->in_h, cfg->in_w, &img, err, sizeof err) != 0) {
        fprintf(stderr, "error: %s\n", err);  // names the file
        free(x);
        return 1;
    }
    if (image_to_input(&img, ds, cfg, x, err, sizeof err) != 0) {
        fprintf(stderr, "error: %s: %s\n", o->image, err);
        image_free(&img);
        free(x);
        return 1;
    }
    int pred, k = TOP_K < cfg->classes ? TOP_K : cfg->classes, idx[TOP_K];
    float prob[TOP_K];
    const float *logits_dev = infer_predict(m, x, 1, &pred);
    float *logits = xmalloc((size_t)cfg->classes * sizeof(float));  // (classes)
    device_copy_from(m->device, logits, logits_dev, (size_t)cfg->classes * sizeof(float));
    top_k(logits, cfg->classes, k, idx, prob);
    printf("image %s (%dx%d, %d channel%s): %s\n", o->image, img.w, img.h, img.c, img.c == 1 ? "" : "s",
           class_name(ds->name, pred));
    for (int t = 0; t < k; t++) printf("  %d. %-14s %6.2f %%\n", t + 1, class_name(ds->name, idx[t]), 100.0 * prob[t]);
    printf("predict: image=%s class=%d name=%s p=%.4f\n", o->image, pred, class_name(ds->name, pred), prob[0]);
    free(logits);
    image_free(&img);
    free(x);
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// Latency: one image at a time, end to end (host input -> class on the host), as a request would see it.
// Throughput: batches of 256 of the test set, back to back.
static void measure_latency(Model *m, const Dataset *ds) {
    size_t image_floats = (size_t)m->cfg.in_c * m->cfg.in_h * m->cfg.in_w;
    int n = THROUGHPUT_BATCH < ds->n ? THROUGHPUT_BATCH : ds->n;
    int *idx = xmalloc((size_t)n * sizeof(int)), *y = xmalloc((size_t)n * sizeof(int));
    float *x = xmalloc((size_t)n * image_floats * sizeof(float));  // (n, C, H, W)
    for (int i = 0; i < n; i++) idx[i] = i;
    dataset_fill_batch(ds, idx, n, NULL, 0, 0, x, y);
    int *pred = xmalloc((size_t)n * sizeof(int));
    double *t = xmalloc(LATENCY_RUNS * sizeof(double));
    for (int i = 0; i < LATENCY_WARMUP + LATENCY_RUNS; i++) {
        double start = time_now();
        infer_predict(m, x + (size_t)(i % n) * image_floats, 1, pred);  // copies the class back: synchronises
        if (i >= LATENCY_WARMUP) t[i - LATENCY_WARMUP] = time_now() - start;
    }
    qsort(t, LATENCY_RUNS, sizeof(double), cmp_double);
    double p50 = t[LATENCY_RUNS / 2], p99 = t[(LATENCY_RUNS * 99) / 100];
    infer_predict(m, x, n, pred);  // warm-up of the large batch
    int batches = 0;
    double start = time_now(), elapsed = 0;
    while (batches < 3 || elapsed < THROUGHPUT_SECONDS) {
        infer_predict(m, x, n, pred);
        batches++;
        elapsed = time_now() - start;
    }
    printf("latency: batch 1: p50 %.3f ms, p99 %.3f ms (%d runs); throughput: batch %d: %.0f images/s (%d batches)\n",
           1e3 * p50, 1e3 * p99, LATENCY_RUNS, n, (double)batches * n / elapsed, batches);
    printf("bench: device=%s model=%s p50_ms=%.4f p99_ms=%.4f batch=%d images_per_s=%.1f\n", device_name(m->device),
           m->cfg.name, 1e3 * p50, 1e3 * p99, n, (double)batches * n / elapsed);
    free(t), free(pred), free(x), free(y), free(idx);
}

// The evaluation and its report; returns 1 when the checkpoint's own evaluation is not reproduced.
static int evaluate_and_report(Model *m, const TrainOptions *o, const Dataset *test, const CkptState *st) {
    double start = time_now();
    EvalReport r = infer_evaluate(m, test, o->batch_size);
    double seconds = time_now() - start;
    double acc = r.count ? (double)r.correct / (double)r.count : 0.0;
    printf("evaluation: %ld images in batches of %d (the last of %ld): %ld correct = %.2f %%, loss %.4f (%.2f s)\n",
           r.count, o->batch_size, r.count % o->batch_size ? r.count % o->batch_size : (long)o->batch_size,
           r.correct, 100.0 * acc, r.count ? r.loss_sum / (double)r.count : 0.0, seconds);
    print_per_class(&r, test->name);
    int status = 0;
    if (o->confusion) {
        if (write_confusion_csv(o->confusion, &r) != 0) {  // checked writable at the start: a full disk, say
            fprintf(stderr, "error: --confusion %s: cannot write the matrix: %s\n", o->confusion, strerror(errno));
            status = 1;
        } else {
            printf("confusion matrix written to %s (make plot METRICS=%s draws it)\n", o->confusion, o->confusion);
        }
    }
    long ref = reference_correct(st, r.count);
    if (r.count != test->n) {
        fprintf(stderr, "error: %ld images evaluated, the test set has %d: every image must count exactly once\n",
                r.count, test->n);
        status = 1;
    } else if (ref < 0) {
        printf("reference: none (the checkpoint was saved in the middle of epoch %d: its last evaluation saw other "
               "weights)\n", st->epoch + 1);
    } else if (ref == r.correct) {
        printf("reference: the training run's evaluation after epoch %d: %ld correct: reproduced exactly\n",
               st->epoch, ref);
    } else {
        fprintf(stderr, "error: %ld correct here, %ld in the training run's evaluation after epoch %d: not "
                "reproduced\n  HINT: eval mode? every image once, none dropped, none augmented? the same data?\n",
                r.correct, ref, st->epoch);
        status = 1;
    }
    printf("final: dataset=%s device=%s batch=%d correct=%ld count=%ld test_acc=%.4f reference=%ld reproduced=%s\n",
           test->name, device_name(m->device), o->batch_size, r.correct, r.count, acc, ref,
           ref < 0 ? "n/a" : ref == r.correct ? "yes" : "no");
    eval_report_free(&r);
    return status;
}

int run_inference(const TrainOptions *o) {
    if (!o->checkpoint) {
        fprintf(stderr, "error: no --checkpoint FILE to load\n  HINT: lesson 04 writes one (`make lesson-06` "
                "trains a short run first when ARGS has no --checkpoint)\n");
        return 1;
    }
    char err[1024];
    bool evaluates = !o->image && !o->latency;
    if (o->confusion && evaluates && check_writable(o->confusion, o->overwrite, err, sizeof err) != 0) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
    }
    Device dev;
    device_parse(o->device, &dev, false);
    Dataset test;
    if (dataset_load(&test, o->dataset, o->data_dir, SPLIT_TEST, err, sizeof err) != 0) {
        fprintf(stderr, "error: %s\n  HINT: run `datasets/get-data.sh`, or pass --data-dir\n", err);
        return 1;
    }
    ModelConfig cfg;
    model_config(&cfg, o->model, o->width, test.c, test.h, test.w, test.classes);  // as training built it
    int max_batch = o->latency && o->batch_size < THROUGHPUT_BATCH ? THROUGHPUT_BATCH : o->batch_size;
    CkptState st;
    trace_open_process(o->trace);  // --trace: this one process's timeline, merged into o->trace at the end
    double t = trace_begin("load checkpoint");
    Model *m = infer_load(o->checkpoint, &cfg, o->dataset, dev, max_batch, &st, err, sizeof err);
    trace_end(t, TRACE_IO, "load checkpoint");
    if (!m) {
        fprintf(stderr, "error: %s\n", err);
        dataset_free(&test);
        return 1;
    }
    Model *training = model_create(&cfg, dev, max_batch, 0);  // only to compare the memory (freed at once)
    size_t train_bytes = model_device_bytes(training);
    model_free(training);
    printf("checkpoint: %s: %s (width %d) trained on %s by %d rank%s, step %lld, epoch %d of %d\n", o->checkpoint,
           st.model.name, st.model.width, st.dataset, st.world, st.world == 1 ? "" : "s", st.step,
           st.epoch + (st.batch_in_epoch ? 1 : 0), st.epochs);
    printf("device: %s; inference model for batches of %d: %.2f MB (training would take %.2f MB: no gradients, "
           "momentum, activation gradients)\n", device_name(dev), max_batch, (double)model_device_bytes(m) / 1e6,
           (double)train_bytes / 1e6);
    t = trace_begin("inference");
    int status = o->image ? predict_image(m, o, &test) : evaluates ? evaluate_and_report(m, o, &test, &st) : 0;
    trace_end(t, TRACE_EVAL, o->image ? "predict one image" : "evaluate the test split");
    if (status == 0 && o->latency) {
        t = trace_begin("latency");
        measure_latency(m, &test);
        trace_end(t, TRACE_EVAL, "measure latency and throughput");
    }
    trace_close_process(o->trace);
    fflush(stdout);
    model_free(m);
    dataset_free(&test);
    return status;
}

#ifndef AUTOGRADER
// ---------------------------------------------------------------- main

int main(int argc, char **argv) {
    TrainOptions o;
    cli_parse(&o, argc, argv, CLI_INFER);
    cli_apply_dataset_defaults(&o);
    return run_inference(&o);
}
#endif  // AUTOGRADER
