// train.c: lesson 08, the lesson-01 training program with the model cut into stages (model parallelism) and
// each batch cut into micro-batches (GPipe); with several ranks, one stage per rank.
//
//   ./train --dataset fashion-mnist --stages 2 --micro-batches 4 --balance params           (one process)
//   scripts/launch.sh 4 ./train --stages 2 --micro-batches 4 --schedule 1f1b                 (2 stages x 2 replicas)
//
// Read it top to bottom: options (the kit's, plus --stages, --micro-batches, --balance, --schedule and --bench,
// read here), then one of two programs:
//
//   one rank:   the stages one after another in this process (TODO 1-3, pipe.c): the loop of lesson 01
//               where the step is pipe_step
//   N ranks:    the grid of stages x replicas (TODO 5), this rank's stage only, its ops of the schedule with
//               messages across the cuts (TODO 6), the step (TODO 7): pipe_dist.c
//
//   for each epoch:
//       for each batch:
//           the step: M micro-batches forward through the stages, backward back through them, one SGD
//                     step per stage (N ranks: the stage's gradient averaged over its replicas first)
//       evaluate through the stages on the test split
//   print the stages, their time, and the bubble: (P-1)/(M+P-1) next to the measured idle time (N ranks)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit/check.h"
#include "kit/cli.h"
#include "kit/data.h"
#include "kit/device.h"
#include "kit/dist.h"
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
    ScheduleKind schedule;
    int bench;  // > 0: time this many steps on one batch, print one `bench:` line, no training
} PipeOptions;

static void pipe_usage(FILE *out) {
    fprintf(out, "lesson 08 options:\n"
                 "  --stages N          stages the model is cut into (1..%d, default 2)\n"
                 "  --micro-batches M   micro-batches per batch (1..%d, default 4; 1: naive model parallelism)\n"
                 "  --balance RULE      params|time: cut by parameter count or by measured forward+backward time\n"
                 "  --schedule NAME     gpipe|1f1b: the order of each stage's forwards and backwards (several ranks)\n"
                 "  --bench STEPS       several ranks: time STEPS steps on one batch, print a `bench:` line, no training\n",
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
    PipeOptions po = {.stages = 2, .micro_batches = 4, .balance = BALANCE_PARAMS, .schedule = SCHEDULE_GPIPE};
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
        } else if (strcmp(a, "--schedule") == 0) {
            if (!v || !schedule_parse(v, &po.schedule)) pipe_usage_error("--schedule takes gpipe or 1f1b", v);
            i++;
        } else if (strcmp(a, "--bench") == 0) {
            po.bench = parse_int(a, v, 1, 100000), i++;
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
    // GPipe: every micro-batch's activations stay until the backward pass, so each stage holds all M of them.
    printf("activations held:");
    for (int s = 0; s < p->n_stages; s++)
        printf(" stage %d %d micro-batch(es) %.2f MB |", s, p->stages[s].n_views, stage_held_bytes(&p->stages[s]) / 1e6);
    printf("\n");
    // One device per stage, GPipe's schedule: M + P - 1 slots of the slowest stage, of which P - 1 idle on each
    // device (the bubble); here the stages ran one after another.
    int P = p->n_stages, M = p->micro_batches;
    printf("bubble: (P-1)/(M+P-1) = %d/%d = %.0f%% of a step idle per device if each stage had its own device; "
           "balance: slowest stage %.0f%% of the total (ideal %.0f%%)\n",
           P - 1, M + P - 1, 100.0 * (P - 1) / (M + P - 1), total > 0 ? 100.0 * slowest / total : 0.0, 100.0 / P);
}

// ---------------------------------------------------------------- one process: every stage here

// The same cut on every rank: by parameter count (the same table everywhere), or by time measured on rank 0
// and shared (each rank would measure its own noise and cut elsewhere).
static void cut_model(ProcessGroup *pg, Device d, const Model *table, const TrainOptions *o,
                      const PipeOptions *po, double *cost, int *first) {
    double seconds[MODEL_MAX_LAYERS] = {0};
    if (po->balance == BALANCE_TIME) {
        if (pg_rank(pg) == 0) pipe_measure_layers(table, d, o->batch_size, 3, seconds);
        pg_allreduce_sum_double_host(pg, seconds, table->n_layers);  // rank 0's numbers, zeros elsewhere
    }
    pipe_layer_costs(table, po->balance, seconds, cost);
    if (!pipe_balance(table, cost, po->stages, first))
        die("cannot cut model %s into %d stages: it has fewer places where one activation crosses\n"
            "  HINT: fewer --stages (or, if every layer count allows it: TODO 1b, pipe_balance)", o->model, po->stages);
}

static void train_one_process(ProcessGroup *pg, TrainOptions *o, const PipeOptions *po) {
    Device dev;
    device_parse(o->device, &dev, true);
    if (dev != DEVICE_CPU) {  // one process runs every stage on the CPU; a stage per GPU is a stage per rank
        printf("note: lesson 08 in one process runs its stages on the CPU (a GPU per stage: one rank per stage)\n");
        dev = DEVICE_CPU;
    }
    if (po->bench) die("--bench times the pipeline of several ranks: start the program on P ranks (scripts/launch.sh)");
    TrainData data;
    train_data_open(&data, o, 0, 1, o->batch_size);
    ModelConfig cfg;
    model_config(&cfg, o->model, o->width, data.train.c, data.train.h, data.train.w, data.train.classes);
    // The layer table and the initial weights, for one image: the stages copy their slices and own them from here.
    Model *table = model_create(&cfg, DEVICE_CPU, 1, o->seed);
    train_print_setup(&data, table);

    // TODO 1 (pipe.c): where to cut.
    double cost[MODEL_MAX_LAYERS] = {0};
    int first[PIPE_MAX_STAGES + 1];
    cut_model(pg, dev, table, o, po, cost, first);
    Pipe *p = pipe_create(table, dev, first, po->stages, po->micro_batches, o->batch_size);
    print_stages(p, cost, po->balance == BALANCE_TIME ? "measured time (s per step)" : "parameter count");

    SgdConfig opt = train_sgd_config(o);
    int steps_per_epoch = loader_batches_per_epoch(data.train_loader);
    LrSchedule sched = train_schedule(o, steps_per_epoch);
    TrainLog log;
    trainlog_begin(&log, o, data.train.name, dev, 1, true);
    PipeCkpt ck;  // --checkpoint / --resume: lesson 04's file of the whole model (pipe_ckpt.c)
    pipe_ckpt_begin(&ck, pg, NULL, 0, 0, p, o, table, &sched, steps_per_epoch, &log);
    for (int epoch = ck.epoch; epoch < o->epochs; epoch++) {
        trainlog_epoch_begin(&log, epoch, steps_per_epoch);
        loader_start_epoch(data.train_loader, epoch, 0);
        const Batch *b;
        double wait;
        while ((b = loader_next(data.train_loader, &wait)) != NULL) {
            opt.lr = lr_at(&sched, epoch * steps_per_epoch + b->index);
            Metrics r = pipe_step(p, b, &opt, o->label_smoothing);
            if (r.count != b->n)
                die("pipe_step processed %ld of the %d images of the batch: finish TODO 2-3 in pipe.c", r.count, b->n);
            trainlog_step(&log, b->index, &r, wait);
        }
        Metrics test = pipe_evaluate(p, data.test_loader);
        trainlog_epoch_end(&log, &log.local, &test, opt.lr);
        pipe_ckpt_epoch_end(&ck, &log.local, &log);
    }
    print_time_split(p);
    char extra[96];
    snprintf(extra, sizeof extra, "stages=%d micro_batches=%d balance=%s", po->stages, po->micro_batches,
             po->balance == BALANCE_TIME ? "time" : "params");
    trainlog_final(&log, extra);

    pipe_free(p);
    model_free(table);
    train_data_close(&data);
}

// ---------------------------------------------------------------- several ranks: one stage per rank

enum { REPORT_MAX_RANKS = 512 };  // ranks the timing report lists

// Every rank's (step seconds, waiting seconds, peak micro-batches held) per step, known to every rank.
static void gather_times(const DistPipe *dp, int peak, double *step, double *wait, double *held) {
    int world = pg_world(dp->world), rank = pg_rank(dp->world);
    CHECK(world >= 1 && world <= REPORT_MAX_RANKS, "too many ranks for the timing report");
    static double v[3 * REPORT_MAX_RANKS];
    memset(v, 0, sizeof v);
    double steps = dp->steps > 0 ? (double)dp->steps : 1.0;
    v[3 * rank] = dp->step_s / steps, v[3 * rank + 1] = dp->wait_s / steps, v[3 * rank + 2] = peak;
    pg_allreduce_sum_double_host(dp->world, v, 3 * world);
    for (int r = 0; r < world; r++) step[r] = v[3 * r], wait[r] = v[3 * r + 1], held[r] = v[3 * r + 2];
}

static double bubble_formula(int P, int M) { return (double)(P - 1) / (M + P - 1); }

// The idle fraction of every rank (seconds waiting for a message / seconds of the step), and its mean, next to
// (P-1)/(M+P-1). Only the printing rank prints; every rank must call it (it gathers).
static double report_idle(const DistPipe *dp, int M, bool printer) {
    int world = pg_world(dp->world), P = dp->grid.stages;
    static double step[REPORT_MAX_RANKS], wait[REPORT_MAX_RANKS], held[REPORT_MAX_RANKS];
    double idle = 0.0;
    // What each rank's stage holds: as many views (one micro-batch's activations each) as it had in flight at once.
    const Stage *st = &dp->local->stages[0];
    static double mb[REPORT_MAX_RANKS];
    memset(mb, 0, sizeof mb);
    mb[pg_rank(dp->world)] = (double)stage_held_bytes(st) / 1e6;
    pg_allreduce_sum_double_host(dp->world, mb, world);
    gather_times(dp, st->n_views, step, wait, held);
    for (int r = 0; r < world; r++) idle += step[r] > 0 ? wait[r] / step[r] : 0.0;
    idle /= world;
    if (printer) {
        printf("time per step (ms, mean of %ld steps), computing vs waiting for a message:\n", dp->steps);
        for (int r = 0; r < world; r++)
            printf("  rank %d (stage %d, replica %d): step %.2f = computing %.2f + waiting %.2f (%.0f%% idle)\n", r,
                   r % P, r / P, 1000.0 * step[r], 1000.0 * (step[r] - wait[r]), 1000.0 * wait[r],
                   step[r] > 0 ? 100.0 * wait[r] / step[r] : 0.0);
        printf("activations held:");
        for (int r = 0; r < world; r++) printf(" rank %d %.0f micro-batch(es) %.2f MB |", r, held[r], mb[r]);
        printf("\n");
        printf("bubble: measured %.0f%% idle (mean over ranks), formula (P-1)/(M+P-1) = %d/%d = %.0f%%\n",
               100.0 * idle, P - 1, M + P - 1, 100.0 * bubble_formula(P, M));
    }
    return idle;
}

// --bench: STEPS steps on the first batch (after 2 untimed ones), one CSV-ready line.
static void bench_steps(DistPipe *dp, TrainData *data, const TrainOptions *o, int steps, bool printer) {
    loader_start_epoch(data->train_loader, 0, 0);
    const Batch *b = loader_next(data->train_loader, NULL);
    CHECK(b != NULL, "--bench: the training split has no batch");
    SgdConfig opt = train_sgd_config(o);
    PipePlan plan;
    pipe_dist_plan(dp, b->n, &plan);
    for (int i = 0; i < 2 + steps; i++) {
        if (i == 2) dp->steps = 0, dp->step_s = dp->wait_s = 0.0;  // the first steps warm caches and pages
        pipe_dist_step(dp, b, &plan, &opt, o->label_smoothing);
    }
    int world = pg_world(dp->world);
    static double step[REPORT_MAX_RANKS], wait[REPORT_MAX_RANKS], held[REPORT_MAX_RANKS];
    double idle = report_idle(dp, plan.micro, printer), slowest = 0.0, peak = 0.0;
    // The step of the pipeline is its slowest rank's; the memory, the stage that holds the most micro-batches.
    gather_times(dp, plan.peak_inflight, step, wait, held);
    for (int r = 0; r < world; r++) {
        slowest = step[r] > slowest ? step[r] : slowest;
        peak = held[r] > peak ? held[r] : peak;
    }
    if (printer)
        printf("bench: schedule=%s P=%d M=%d batch=%d step_ms=%.3f idle_measured=%.4f idle_formula=%.4f "
               "peak_inflight=%d\n", schedule_name(dp->schedule), dp->grid.stages, plan.micro, o->batch_size,
               1000.0 * slowest, idle, bubble_formula(dp->grid.stages, plan.micro), (int)peak);
}

static void print_grid(const DistPipe *dp, const Model *table, const int *first, const double *cost, const char *rule) {
    const PipeGrid *g = &dp->grid;
    printf("pipeline: %d stage(s) x %d replica(s) on %d ranks (rank = replica * %d + stage), %d micro-batch(es), "
           "%s schedule, cut by %s\n", g->stages, g->replicas, pg_world(dp->world), g->stages, dp->micro_batches,
           schedule_name(dp->schedule), rule);
    for (int s = 0; s < g->stages; s++) {
        size_t params = 0;
        double c = 0;
        for (int i = first[s]; i < first[s + 1]; i++) params += table->layers[i].param_count, c += cost[i];
        const Layer *out = &table->layers[first[s + 1] - 1];
        printf("  stage %d: layers %2d..%-2d  %8zu params  cost %.4g  sends %zu floats per image\n", s, first[s],
               first[s + 1] - 1, params, c, s + 1 < g->stages ? (size_t)out->c * out->h * out->w : (size_t)0);
    }
}

static void train_dist(ProcessGroup *pg, TrainOptions *o, const PipeOptions *po) {
    PipeGrid g;
    if (!pipe_grid(pg_rank(pg), pg_world(pg), po->stages, &g))
        die("%d ranks cannot be cut into pipes of --stages %d\n  HINT: the number of ranks must be a multiple of "
            "--stages (or TODO 5a: pipe_grid)", pg_world(pg), po->stages);
    if (o->batch_size % g.replicas != 0)
        die("--batch-size %d is not a multiple of the %d replicas", o->batch_size, g.replicas);
    Device dev = pg_device(pg);
    // The last stage has the loss: the last stage of replica 0 reports, once for the whole job.
    bool printer = g.stage == g.stages - 1 && g.replica == 0;
    if (dev == DEVICE_CUDA)
        printf("rank %d: stage %d of replica %d on GPU %d of this node\n", pg_rank(pg), g.stage, g.replica,
               pg_local_rank(pg) % device_gpu_count());

    TrainData data;
    pipe_dist_data_open(&data, o, &g);  // TODO 5c: this replica's shard
    int local_batch = o->batch_size / g.replicas;
    ModelConfig cfg;
    model_config(&cfg, o->model, o->width, data.train.c, data.train.h, data.train.w, data.train.classes);
    // The same seed on every rank: the same initial weights, so the copies of a stage start equal.
    Model *table = model_create(&cfg, DEVICE_CPU, 1, o->seed);
    if (printer) train_print_setup(&data, table);
    double cost[MODEL_MAX_LAYERS] = {0};
    int first[PIPE_MAX_STAGES + 1];
    cut_model(pg, dev, table, o, po, cost, first);
    DistPipe *dp = pipe_dist_create(pg, table, dev, first, po->stages, po->micro_batches, local_batch, po->schedule);
    if (printer) print_grid(dp, table, first, cost, po->balance == BALANCE_TIME ? "measured time" : "parameter count");

    if (po->bench) {
        bench_steps(dp, &data, o, po->bench, printer);
    } else {
        SgdConfig opt = train_sgd_config(o);
        int steps_per_epoch = loader_batches_per_epoch(data.train_loader);
        LrSchedule sched = train_schedule(o, steps_per_epoch);
        TrainLog log;
        trainlog_begin(&log, o, data.train.name, dev, g.replicas, printer);
        PipeCkpt ck;  // --checkpoint / --resume: lesson 04's file of the whole model (pipe_ckpt.c)
        pipe_ckpt_begin(&ck, pg, dp->pipe, g.stage, g.replica, dp->local, o, table, &sched, steps_per_epoch, &log);
        PipePlan plan = {0};
        for (int epoch = ck.epoch; epoch < o->epochs; epoch++) {
            trainlog_epoch_begin(&log, epoch, steps_per_epoch);
            loader_start_epoch(data.train_loader, epoch, 0);
            const Batch *b;
            double wait;
            while ((b = loader_next(data.train_loader, &wait)) != NULL) {
                opt.lr = lr_at(&sched, epoch * steps_per_epoch + b->index);
                pipe_dist_plan(dp, b->n, &plan);
                Metrics r = pipe_dist_step(dp, b, &plan, &opt, o->label_smoothing);
                if (g.stage == g.stages - 1 && r.count != b->n)
                    die("rank %d: the step counted %ld of the %d images of the batch: finish TODO 6-7 in "
                        "pipe_dist.c", pg_rank(pg), r.count, b->n);
                trainlog_step(&log, b->index, &r, wait);
            }
            // The copies of a stage must still be equal (a missed or world-wide all-reduce shows here).
            char what[64];
            snprintf(what, sizeof what, "stage %d's parameters after epoch %d", g.stage, epoch + 1);
            Stage *st = &dp->local->stages[0];
            if (st->n_params > 0) pg_check_identical(dp->same_stage, st->params, st->n_params, what);
            // Only the last stages counted: the sum over the world is the sum over the replicas.
            double sums[3] = {log.local.loss_sum, (double)log.local.correct, (double)log.local.count};
            pg_allreduce_sum_double_host(pg, sums, 3);
            Metrics train = {.loss_sum = sums[0], .correct = (long)sums[1], .count = (long)sums[2]};
            Metrics test = pipe_dist_evaluate(dp, data.test_loader);
            trainlog_epoch_end(&log, &train, &test, opt.lr);
            pipe_ckpt_epoch_end(&ck, &train, &log);
        }
        report_idle(dp, plan.micro, printer);
        char extra[128];
        snprintf(extra, sizeof extra, "stages=%d replicas=%d micro_batches=%d schedule=%s balance=%s", g.stages,
                 g.replicas, po->micro_batches, schedule_name(po->schedule),
                 po->balance == BALANCE_TIME ? "time" : "params");
        trainlog_final(&log, extra);
    }
    pipe_dist_free(dp);
    model_free(table);
    train_data_close(&data);
}

// ---------------------------------------------------------------- main

int main(int argc, char **argv) {
    PipeOptions po = pipe_parse(&argc, argv);
    TrainOptions o;
    cli_parse(&o, argc, argv, CLI_DIST | CLI_CKPT);  // lesson 01's options, --backend, --timeout, lesson 04's --checkpoint
    cli_apply_dataset_defaults(&o);
    Device dev;
    device_parse(o.device, &dev, true);
    // One rank: every stage in this process. Several (mpirun): one stage per rank.
    ProcessGroup *pg = pg_init(&argc, &argv, o.backend, dev, o.timeout_s);
    if (pg_world(pg) == 1) train_one_process(pg, &o, &po);
    else train_dist(pg, &o, &po);
    pg_finalize(pg);
    return 0;
}
#endif  // AUTOGRADER
