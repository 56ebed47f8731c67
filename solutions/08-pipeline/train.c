// train.c: lesson 08, the lesson-01 training program with the model cut into stages (model parallelism) and
// each batch cut into micro-batches (GPipe); with several ranks, one stage per rank.
//
//   ./train --dataset fashion-mnist --stages 2 --micro-batches 4 --balance params           (one process)
//   ./train --stages 2 --stage-devices cpu,cuda                  (one process, stage 0 on the CPU, 1 on the GPU)
//   scripts/launch.sh 4 ./train --stages 2 --micro-batches 4 --schedule 1f1b                 (2 stages x 2 replicas)
//
// Read it top to bottom: the reports, then the training: lesson 03's loop (ddp_run_open, ddp_run_epochs,
// ddp_run_report) with this lesson's hooks, on one rank or many (this lesson's options are the kit's: CLI_PIPE):
//
//   one rank:   every stage in this process, each on its device (TODO 1-3, pipe.c): the step is pipe_step
//   N ranks:    the grid of stages x replicas (TODO 5), this rank's stage only, its ops of the schedule with
//               messages across the cuts (TODO 6), the step (TODO 7): pipe_dist.c
//
//   for each epoch (lesson 03's loop):
//       for each batch:
//           the step: M micro-batches forward through the stages, backward back through them, one SGD
//                     step per stage (N ranks: the stage's gradient averaged over its replicas first)
//       the copies of each stage compared; evaluate through the stages on the test split
//   print the stages, their time, and the bubble: (P-1)/(M+P-1) next to the measured idle time (N ranks)
#include <math.h>
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
#include "solutions/03-ddp/lesson.h"  // lesson 03's training loop, linked from its solution

#ifndef AUTOGRADER
// This lesson's options are the kit's (kit/cli.c, CLI_PIPE): --stages, --micro-batches, --balance, --schedule,
// --stage-devices, --bench.
static BalanceRule balance_rule(const TrainOptions *o) {
    return strcmp(o->balance, "time") == 0 ? BALANCE_TIME : BALANCE_PARAMS;
}

// ---------------------------------------------------------------- the report

static void print_stages(const Pipe *p, const double *cost, const char *rule, bool devices) {
    printf("pipeline: %d stage(s), %d micro-batch(es) per batch, cut by %s\n", p->n_stages, p->micro_batches, rule);
    for (int s = 0; s < p->n_stages; s++) {
        const Stage *st = &p->stages[s];
        double c = 0;
        for (int i = st->first; i < st->last; i++) c += cost[i];
        printf("  stage %d: layers %2d..%-2d  %8zu params  cost %.4g  sends %zu floats per image%s%s\n", s, st->first,
               st->last - 1, st->n_params, c, s + 1 < p->n_stages ? p->stages[s + 1].in_floats : (size_t)0,
               devices ? "  on " : "", devices ? device_name(st->device) : "");
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
    PipeGrid next;  // where rank 1 sits tells the order pipe_grid chose (TODO 5a)
    bool data_inside = g->replicas > 1 && g->stages > 1 && pipe_grid(1, pg_world(dp->world), g->stages, &next) &&
                       next.replica == 1;
    printf("pipeline: %d stage(s) x %d replica(s) on %d ranks (rank = %s), %d micro-batch(es), %s schedule, cut "
           "by %s\n", g->stages, g->replicas, pg_world(dp->world),
           data_inside ? "stage x replicas + replica" : "replica x stages + stage", dp->micro_batches,
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

// ---------------------------------------------------------------- the training: lesson 03's loop, this lesson's hooks
//
// The loop is lesson 03's; what is new goes through its hooks (TrainHooks): the data of a replica and the rank that
// prints (open), the pipeline as the model (make_model), its step with its own messages (step), the evaluation
// through the stages (evaluate), the comparison of the copies of one stage only (check_replicas), the checkpoint
// of the whole model (after_epoch).

// The same cut on every rank: by parameter count (the same table everywhere), or by time measured on rank 0
// and shared (each rank would measure its own noise and cut elsewhere).
static void cut_model(ProcessGroup *pg, Device d, const Model *table, const TrainOptions *o, double *cost,
                      int *first) {
    double seconds[MODEL_MAX_LAYERS] = {0};
    if (balance_rule(o) == BALANCE_TIME) {
        if (pg_rank(pg) == 0) pipe_measure_layers(table, d, o->batch_size, 3, seconds);
        pg_allreduce_sum_double_host(pg, seconds, table->n_layers);  // rank 0's numbers, zeros elsewhere
    }
    pipe_layer_costs(table, balance_rule(o), seconds, cost);
    if (!pipe_balance(table, cost, o->stages, first))
        die("cannot cut model %s into %d stages: it has fewer places where one activation crosses\n"
            "  HINT: fewer --stages (or, if every layer count allows it: TODO 1b, pipe_balance)", o->model, o->stages);
}

// What the hooks share: the cut, and the stages this process runs.
typedef struct {
    Device devices[PIPE_MAX_STAGES];  // one process: the device of every stage
    Model *table;                     // the layer table and the initial weights (batch 1): each stage copies its slice
    double cost[MODEL_MAX_LAYERS];
    int first[PIPE_MAX_STAGES + 1];   // the cut: stage s is layers [first[s], first[s + 1])
    Pipe *p;                          // one process: every stage
    DistPipe *dp;                     // several ranks: this rank's stage, its place in the grid and its groups
    PipePlan plan;
    PipeCkpt ck;                      // --checkpoint / --resume: lesson 04's file of the whole model (pipe_ckpt.c)
    bool nonfinite;                   // the loss became NaN or Inf: every rank stopped, the run ends non-zero
} PipeRun;

// One process: --stage-devices names the device of every stage (default: --device for all).
static void parse_stage_devices(const TrainOptions *o, Device dev, Device *devices) {
    char list[256];
    snprintf(list, sizeof list, "%s", o->stage_devices ? o->stage_devices : "");
    int n = 0;
    for (char *name = strtok(list, ","); name; name = strtok(NULL, ","), n++)
        if (n >= o->stages || !device_parse(name, &devices[n], true))
            die("--stage-devices %s: '%s' is not a device (cpu, cuda, cuda-emu) or one too many for --stages %d",
                o->stage_devices, name, o->stages);
    if (o->stage_devices && n != o->stages)
        die("--stage-devices %s names %d device(s) for --stages %d: one per stage", o->stage_devices, n, o->stages);
    for (int s = 0; s < o->stages; s++) {
        if (!o->stage_devices) devices[s] = dev;
        if (devices[s] == DEVICE_CUDA && dev != DEVICE_CUDA) device_set_gpu(0);  // the process group bound none
    }
}

// Several ranks: this rank's place in the grid and its groups (TODO 5a-b), its REPLICA's shard (TODO 5c), the
// copies of its stage, and the rank that prints: the last stage has the loss; the one of replica 0 reports.
static int open_grid(void *ctx, DdpRun *r) {
    PipeRun *run = ctx;
    ScheduleKind schedule;
    schedule_parse(r->o->schedule, &schedule);
    DistPipe *dp = run->dp = pipe_dist_join(r->pg, r->o->stages, schedule);
    const PipeGrid *g = &dp->grid;
    if (r->o->batch_size % g->replicas != 0)
        die("--batch-size %d is not a multiple of the %d replicas", r->o->batch_size, g->replicas);
    if (pg_device(r->pg) == DEVICE_CUDA)
        printf("rank %d: stage %d of replica %d on GPU %d of this node\n", pg_rank(r->pg), g->stage, g->replica,
               pg_local_rank(r->pg) % device_gpu_count());
    pipe_dist_data_open(&r->data, r->o, g);
    r->replicas = dp->same_stage;
    r->is_main = g->stage == g->stages - 1 && g->replica == 0;
    return r->o->batch_size / g->replicas;
}

// The cut (TODO 1) and the stages: every one in this process, or this rank's. The loop's model is what the copies
// of a rank share: this rank's stage; in one process, which holds each stage once, the whole layer table.
static Model *make_pipe(void *ctx, DdpRun *r, const ModelConfig *cfg) {
    PipeRun *run = ctx;
    const TrainOptions *o = r->o;
    // A micro-batch holds at least one image: more micro-batches than a replica's batch has images would run
    // fewer than asked while the pipeline line, the bubble formula and the final line said M. Refused, on every
    // rank alike (the same options, before the first step), with the largest M that runs as asked.
    if (o->micro_batches > r->local_batch)
        die("--micro-batches %d: a replica's batch has %d image(s) (--batch-size %d over %d replica(s)), and a "
            "micro-batch holds at least one\n  HINT: --micro-batches %d (the most this batch allows), or a "
            "--batch-size of at least %d", o->micro_batches, r->local_batch, o->batch_size,
            o->batch_size / r->local_batch, r->local_batch, o->micro_batches * (o->batch_size / r->local_batch));
    // The same seed on every rank: the same initial weights, so the copies of a stage start equal.
    run->table = model_create(cfg, DEVICE_CPU, 1, o->seed);
    cut_model(r->pg, pg_device(r->pg), run->table, o, run->cost, run->first);
    if (!run->dp) {
        run->p = pipe_create_on(run->table, run->devices, run->first, o->stages, o->micro_batches, r->local_batch);
        return run->table;
    }
    pipe_dist_make_stage(run->dp, run->table, pg_device(r->pg), run->first, o->micro_batches, r->local_batch);
    return run->dp->local->stages[0].owner;
}

// One step: the GPipe step of every stage (TODO 3), or this rank's ops of the schedule with their messages (TODO 7).
static Metrics pipeline_step(void *ctx, DdpRun *r, const Batch *b) {
    PipeRun *run = ctx;
    if (!run->dp) {
        Metrics m = pipe_step(run->p, b, &r->opt, r->o->label_smoothing);
        if (m.count != b->n)
            die("pipe_step processed %ld of the %d images of the batch: finish TODO 2-3 in pipe.c", m.count, b->n);
        return m;
    }
    const PipeGrid *g = &run->dp->grid;
    pipe_dist_plan(run->dp, b->n, &run->plan);
    Metrics m = pipe_dist_step(run->dp, b, &run->plan, &r->opt, r->o->label_smoothing);
    if (g->stage == g->stages - 1 && m.count != b->n)
        die("rank %d: the step counted %ld of the %d images of the batch: finish TODO 6-7 in pipe_dist.c",
            pg_rank(r->pg), m.count, b->n);
    return m;
}

// The test split through the stages; several ranks: the last stages' sums over the world, on every rank.
static Metrics pipeline_evaluate(void *ctx, DdpRun *r) {
    PipeRun *run = ctx;
    return run->dp ? pipe_dist_evaluate(run->dp, r->data.test_loader) : pipe_evaluate(run->p, r->data.test_loader);
}

// The copies of a stage must still be equal (a missed or world-wide all-reduce shows here); the ranks of other
// stages hold other tensors. One process holds every stage once: nothing to compare.
static void check_stage_copies(void *ctx, DdpRun *r, const char *what) {
    PipeRun *run = ctx;
    if (!run->dp) return;
    const Stage *st = &run->dp->local->stages[0];
    char line[96];
    snprintf(line, sizeof line, "stage %d's %s", run->dp->grid.stage, what);
    if (st->n_params > 0) pg_check_identical(r->replicas, st->params, st->n_params, line);
}

// After every step, as lesson 04 does: a NaN or Inf loss (the last stage has it; every rank learns it in one
// all-reduce) stops every rank before the epoch's save, and the run ends non-zero: it never recovers.
static bool stop_on_nan(void *ctx, DdpRun *r, const Batch *b, const Metrics *batch) {
    PipeRun *run = ctx;
    double bad = isfinite(batch->loss_sum) ? 0.0 : 1.0;
    pg_allreduce_sum_double_host(r->pg, &bad, 1);
    if (bad == 0.0) return false;
    progress_end(&r->log.bar);
    if (r->is_main)
        fprintf(stderr, "error: the loss is NaN or Inf at step %lld (epoch %d, batch %d): every rank stops without "
                "saving\n  HINT: a lower --lr, or more --warmup-epochs\n", r->run.step, r->run.epoch + 1, b->index + 1);
    run->nonfinite = true;
    return true;
}

static bool save_epoch(void *ctx, DdpRun *r) {
    PipeRun *run = ctx;
    pipe_ckpt_epoch_end(&run->ck, r->run.images, &r->log);
    return false;
}

// --resume: the stages take their slices and the loop its place (pipe_ckpt.c).
static void resume_pipe(PipeRun *run, DdpRun *r) {
    const DistPipe *dp = run->dp;
    pipe_ckpt_begin(&run->ck, r->pg, dp ? dp->pipe : NULL, dp ? dp->grid.stage : 0, dp ? dp->grid.replica : 0,
                    dp ? dp->local : run->p, r->o, run->table, &r->sched, r->steps_per_epoch, &r->log);
    const PipeCkpt *c = &run->ck;
    r->run = (RunState){.epoch = c->epoch, .step = c->step, .images = c->images, .last_loss = c->last_loss,
                        .test_acc = c->test_acc};
}

// The report after the training and the settings the `final:` line adds to lesson 03's.
static void report(PipeRun *run, DdpRun *r, char *extra, size_t len) {
    const TrainOptions *o = r->o;
    const char *balance = balance_rule(o) == BALANCE_TIME ? "time" : "params";
    if (run->dp) {
        report_idle(run->dp, run->plan.micro, r->is_main);
        snprintf(extra, len, "stages=%d replicas=%d micro_batches=%d schedule=%s balance=%s", o->stages,
                 run->dp->grid.replicas, o->micro_batches, o->schedule, balance);
    } else {
        print_time_split(run->p);
        snprintf(extra, len, "stages=%d micro_batches=%d balance=%s%s%s", o->stages, o->micro_batches, balance,
                 o->stage_devices ? " stage_devices=" : "", o->stage_devices ? o->stage_devices : "");
    }
}

// Returns the program's exit status: 1 when the run never recovered (a NaN loss), else 0.
static int train_pipeline(ProcessGroup *pg, const TrainOptions *o) {
    bool several = pg_world(pg) > 1;
    if (several && o->stage_devices)
        die("--stage-devices places the stages of ONE process; with several ranks each rank runs its stage on "
            "--device (a GPU per rank: --device cuda)");
    if (o->bench && !several)
        die("--bench times the pipeline of several ranks: start the program on P ranks (scripts/launch.sh)");
    PipeRun run = {0};
    parse_stage_devices(o, pg_device(pg), run.devices);
    TrainHooks hooks = {.ctx = &run, .open = several ? open_grid : NULL, .make_model = make_pipe,
                        .step = pipeline_step, .after_step = stop_on_nan, .after_epoch = save_epoch, .evaluate = pipeline_evaluate,
                        .check_replicas = check_stage_copies};
    DdpRun r;
    ddp_run_open(&r, pg, o, &hooks);  // lesson 03: data, model (the hooks'), optimizer, schedule
    const char *rule = balance_rule(o) == BALANCE_TIME ? "measured time" : "parameter count";
    if (r.is_main && several) print_grid(run.dp, run.table, run.first, run.cost, rule);
    if (r.is_main && !several) print_stages(run.p, run.cost, rule, o->stage_devices != NULL);
    if (o->bench) {
        bench_steps(run.dp, &r.data, o, o->bench, r.is_main);
    } else {
        resume_pipe(&run, &r);
        ddp_run_epochs(&r);
        char extra[192];
        report(&run, &r, extra, sizeof extra);
        ddp_run_report(&r, extra);
    }
    ddp_run_close(&r);  // the model it gives back belongs to the pipe (or is the table): freed below
    if (several) pipe_dist_free(run.dp);
    else pipe_free(run.p);
    model_free(run.table);
    return run.nonfinite ? 1 : 0;
}

// ---------------------------------------------------------------- main

int main(int argc, char **argv) {
    TrainOptions o;
    cli_parse(&o, argc, argv, CLI_DIST | CLI_CKPT | CLI_PIPE);  // lessons 01, 03 and 04's options, and this lesson's
    cli_apply_dataset_defaults(&o);
    Device dev;
    device_parse(o.device, &dev, true);
    // One rank: every stage in this process. Several (mpirun): one stage per rank.
    ProcessGroup *pg = pg_init(&argc, &argv, o.backend, dev, o.timeout_s);
    int rc = train_pipeline(pg, &o);
    pg_finalize(pg);
    return rc;
}
#endif  // AUTOGRADER
