// train.c: lesson 08, the lesson-01 training program with the model cut into stages (model parallelism) and
// each batch cut into micro-batches (GPipe).
//
//   ./train --dataset fashion-mnist --stages 2 --micro-batches 4 --balance params
//
// Read it top to bottom: options (the kit's, plus --stages, --micro-batches and --balance, read here), data,
// the cut (TODO 1, pipe.c), the stages, then the loop of lesson 01 where the step is pipe_step (TODO 2-3):
//
//   for each epoch:
//       for each batch:
//           pipe_step: M micro-batches forward through the stages, backward back through them, one SGD
//                      step per stage
//       evaluate through the stages on the test split
//   print the stages, their time, and the bubble a real pipeline would have with this P and M
//
// The stages run one after another in this one process: this lesson is the ARITHMETIC of a pipeline (which
// layers, which tensors cross, why micro-batches give the same gradient); running stages at the same time,
// one per device, is what the bubble formula in the report is about (README section 5).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit/check.h"
#include "kit/cli.h"
#include "kit/data.h"
#include "kit/device.h"
#include "kit/log.h"
#include "kit/model.h"
#include "kit/optim.h"
#include "kit/train.h"
#include "lesson.h"

#ifndef AUTOGRADER
// ---------------------------------------------------------------- this lesson's options

typedef struct {
    int stages, micro_batches;
    BalanceRule balance;
} PipeOptions;

static void pipe_usage(FILE *out) {
    fprintf(out, "lesson 08 options:\n"
                 "  --stages N          stages the model is cut into (1..%d, default 2)\n"
                 "  --micro-batches M   micro-batches per batch (1..%d, default 4; 1: naive model parallelism)\n"
                 "  --balance RULE      params|time: cut by parameter count or by measured forward+backward time\n",
            PIPE_MAX_STAGES, PIPE_MAX_MICRO);
}

static void pipe_usage_error(const char *what, const char *value) {
    fprintf(stderr, "error: %s: '%s'\n", what, value ? value : "(missing)");
    pipe_usage(stderr);
    exit(2);
}

static int parse_int(const char *name, const char *v, int lo, int hi) {
    char *end;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || *v == '\0' || *end != '\0' || x < lo || x > hi) {
        char what[96];
        snprintf(what, sizeof what, "%s takes an integer from %d to %d", name, lo, hi);
        pipe_usage_error(what, v);
    }
    return (int)x;
}

// Takes this lesson's options out of argv (the kit's parser rejects options it does not know); the rest is the
// kit's. --help prints both usages.
static PipeOptions pipe_parse(int *argc, char **argv) {
    PipeOptions po = {.stages = 2, .micro_batches = 4, .balance = BALANCE_PARAMS};
    int out = 1;
    for (int i = 1; i < *argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < *argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--stages") == 0) po.stages = parse_int(a, v, 1, PIPE_MAX_STAGES), i++;
        else if (strcmp(a, "--micro-batches") == 0) po.micro_batches = parse_int(a, v, 1, PIPE_MAX_MICRO), i++;
        else if (strcmp(a, "--balance") == 0) {
            if (v && strcmp(v, "params") == 0) po.balance = BALANCE_PARAMS;
            else if (v && strcmp(v, "time") == 0) po.balance = BALANCE_TIME;
            else pipe_usage_error("--balance takes params or time", v);
            i++;
        } else {
            if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) pipe_usage(stdout);
            argv[out++] = argv[i];
        }
    }
    *argc = out;
    argv[out] = NULL;
    return po;
}

// ---------------------------------------------------------------- the report

static void print_stages(const Pipe *p, const double *cost, const char *rule) {
    printf("pipeline: %d stage(s), %d micro-batch(es) per batch, cut by %s\n", p->n_stages, p->micro_batches, rule);
    for (int s = 0; s < p->n_stages; s++) {
        const Stage *st = &p->stages[s];
        double c = 0;
        for (int i = st->first; i < st->last; i++) c += cost[i];
        printf("  stage %d: layers %2d..%-2d  %8zu params  cost %.4g  sends %zu floats per image\n", s, st->first,
               st->last - 1, st->n_params, c, s + 1 < p->n_stages ? p->stages[s + 1].in_floats : (size_t)0);
    }
}

static void print_time_split(const Pipe *p) {
    if (p->steps == 0) return;
    double slowest = 0, total = 0;
    printf("time per step (ms, mean of %ld steps):", p->steps);
    for (int s = 0; s < p->n_stages; s++) {
        double t = p->stages[s].seconds / (double)p->steps;
        printf(" stage %d %.2f |", s, 1000.0 * t);
        total += t;
        slowest = t > slowest ? t : slowest;
    }
    printf(" total %.2f\n", 1000.0 * total);
    // One device per stage, GPipe's schedule: M + P - 1 slots of the slowest stage, of which P - 1 idle on each
    // device (the bubble); here the stages ran one after another.
    int P = p->n_stages, M = p->micro_batches;
    printf("bubble: (P-1)/(M+P-1) = %d/%d = %.0f%% of a step idle per device if each stage had its own device; "
           "balance: slowest stage %.0f%% of the total (ideal %.0f%%)\n",
           P - 1, M + P - 1, 100.0 * (P - 1) / (M + P - 1), total > 0 ? 100.0 * slowest / total : 0.0, 100.0 / P);
}

// ---------------------------------------------------------------- main

int main(int argc, char **argv) {
    PipeOptions po = pipe_parse(&argc, argv);
    TrainOptions o;
    cli_parse(&o, argc, argv, CLI_BASE);
    cli_apply_dataset_defaults(&o);
    Device dev;
    device_parse(o.device, &dev, false);
    if (dev != DEVICE_CPU) {  // the stages' ops use the current GPU: one GPU per stage is not built yet
        printf("note: lesson 08 runs its stages on the CPU (a stage per GPU comes in a later part)\n");
        dev = DEVICE_CPU;
    }

    TrainData data;
    train_data_open(&data, &o, 0, 1, o.batch_size);
    ModelConfig cfg;
    model_config(&cfg, o.model, o.width, data.train.c, data.train.h, data.train.w, data.train.classes);
    // The layer table and the initial weights, for one image: the stages copy their slices and own them from here.
    Model *table = model_create(&cfg, DEVICE_CPU, 1, o.seed);
    train_print_setup(&data, table);

    // TODO 1 (pipe.c): where to cut.
    double seconds[MODEL_MAX_LAYERS] = {0}, cost[MODEL_MAX_LAYERS] = {0};
    if (po.balance == BALANCE_TIME) pipe_measure_layers(table, dev, o.batch_size, 3, seconds);
    pipe_layer_costs(table, po.balance, seconds, cost);
    int first[PIPE_MAX_STAGES + 1];
    if (!pipe_balance(table, cost, po.stages, first))
        die("cannot cut model %s into %d stages: it has fewer places where one activation crosses\n"
            "  HINT: fewer --stages (or, if every layer count allows it: TODO 1b, pipe_balance)", o.model, po.stages);
    Pipe *p = pipe_create(table, dev, first, po.stages, po.micro_batches, o.batch_size);
    print_stages(p, cost, po.balance == BALANCE_TIME ? "measured time (s per step)" : "parameter count");

    SgdConfig opt = train_sgd_config(&o);
    int steps_per_epoch = loader_batches_per_epoch(data.train_loader);
    LrSchedule sched = train_schedule(&o, steps_per_epoch);
    TrainLog log;
    trainlog_begin(&log, &o, data.train.name, dev, 1, true);
    for (int epoch = 0; epoch < o.epochs; epoch++) {
        trainlog_epoch_begin(&log, epoch, steps_per_epoch);
        loader_start_epoch(data.train_loader, epoch, 0);
        const Batch *b;
        double wait;
        while ((b = loader_next(data.train_loader, &wait)) != NULL) {
            opt.lr = lr_at(&sched, epoch * steps_per_epoch + b->index);
            Metrics r = pipe_step(p, b, &opt, o.label_smoothing);
            if (r.count != b->n)
                die("pipe_step processed %ld of the %d images of the batch: finish TODO 2-3 in pipe.c", r.count, b->n);
            trainlog_step(&log, b->index, &r, wait);
        }
        Metrics test = pipe_evaluate(p, data.test_loader);
        trainlog_epoch_end(&log, &log.local, &test, opt.lr);
    }
    print_time_split(p);
    char extra[96];
    snprintf(extra, sizeof extra, "stages=%d micro_batches=%d balance=%s", po.stages, po.micro_batches,
             po.balance == BALANCE_TIME ? "time" : "params");
    trainlog_final(&log, extra);

    pipe_free(p);
    model_free(table);
    train_data_close(&data);
    return 0;
}
#endif  // AUTOGRADER
