// bench/pipeline_wire.c: what lesson 08's pipeline puts on the wire and holds in memory, per rank and step,
// measured with the kit, next to the arithmetic. It builds the stages as lesson 08's program does (its solution's
// pipe.c, pipe_dist.c and schedule.c, linked in), cut by parameter count (a cut that does not depend on timing),
// and runs steps on one batch of the synthetic set.
//
//   scripts/launch.sh P build/bench/pipeline_wire --model tiny --batch-size 256 --micro-batches 4 --schedule gpipe
//
// Options: lesson 01's (--model, --batch-size = the global batch, --dataset, ...), and --micro-batches M (default
// 4), --schedule gpipe|1f1b (default gpipe), --replicas R (default 1: the world is P = world / R stages), --steps N
// (default 2 measured steps, after one warm-up step). Every rank prints one line:
//
//   wire: rank= stage= replica= P= R= M= schedule= model= batch= micro_rows= out_floats= in_floats=
//         p2p_sent= p2p_msgs= p2p_recv= coll_bytes= coll_calls= p2p_sent_formula=
//         held_bytes= peak_inflight= view_bytes= hwm_delta= rss_base=
//
//   p2p_*, coll_*   per step: the sum over this rank's groups (world, pipe, same stage) of pg_traffic's counts
//   p2p_sent_formula  per step: local batch x (out_floats if not the last stage + in_floats if not the first) x 4
//   held_bytes      the activations this stage's views hold at their most (stage_held_bytes: the kit's allocation)
//   peak_inflight   micro-batches forward-done and not yet backward at once (the plan's count); view_bytes: one
//                   view's bytes (held_bytes / views), so the arithmetic is peak_inflight x view_bytes
//   held_formula    peak_inflight x micro_rows x view_floats_per_sample x 4: what the views WRITE (per sample: the
//                   stage's activations, their gradients, and the input's gradient unless the first stage)
//   hwm_delta       measured: the process's peak resident memory during the last step (VmHWM, reset by writing 5
//                   to /proc/self/clear_refs just before it) minus its resident memory then (VmRSS), once the
//                   views of the steps before were freed (the stage keeps its views from step to step: the last
//                   step makes them again); -1 where /proc does not allow the reset
//
// glibc's malloc is told to mmap every block of 64 KiB or more (mallopt): a view freed between steps then goes
// back to the system, and the next step's peak shows in VmHWM (glibc's default threshold grows after the first
// free and would keep the freed views resident).
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit/check.h"
#include "kit/cli.h"
#include "kit/dist.h"
#include "kit/log.h"
#include "solutions/08-pipeline/lesson.h"

// Takes the option `name` and its value out of argv (so that the rest is lesson 01's command line); NULL if absent.
static const char *take_option(int *argc, char **argv, const char *name) {
    for (int i = 1; i < *argc; i++) {
        if (strcmp(argv[i], name) != 0) continue;
        if (i + 1 >= *argc) die("%s needs a value", name);
        const char *v = argv[i + 1];
        memmove(argv + i, argv + i + 2, (size_t)(*argc - i - 1) * sizeof *argv);  // the NULL at argv[argc] too
        *argc -= 2;
        return v;
    }
    return NULL;
}

static int take_int(int *argc, char **argv, const char *name, int fallback, int lo, int hi) {
    const char *v = take_option(argc, argv, name);
    if (!v) return fallback;
    char *end = NULL;
    long x = strtol(v, &end, 10);
    if (*end != '\0' || x < lo || x > hi) die("%s takes an integer in %d..%d, got '%s'", name, lo, hi, v);
    return (int)x;
}

// A line of /proc/self/status ("VmHWM:", "VmRSS:") in bytes, or -1.
static long long proc_status_bytes(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long long kb = -1;
    size_t k = strlen(key);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, k) == 0) kb = atoll(line + k);
    fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}

// Resets VmHWM to the current VmRSS (Linux 4.0+); false where that is not allowed.
static bool reset_peak_rss(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return false;
    bool ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok;
}

// Frees the stage's views (the activations of its micro-batches in flight): the next step makes them again, as
// many as it needs, so its peak memory above the rest of the process is what the schedule holds.
static void free_views(Stage *st) {
    for (int v = 0; v < st->n_views; v++) model_free(st->views[v]);
    for (int v = 0; v < PIPE_MAX_MICRO; v++) st->views[v] = NULL, st->holds[v] = -1;
    st->n_views = 0;
}

static PgTraffic traffic_sum(const DistPipe *dp) {
    const ProcessGroup *g[3] = {dp->world, dp->pipe, dp->same_stage};
    PgTraffic t = {0};
    for (int i = 0; i < 3; i++) {
        PgTraffic x = pg_traffic(g[i]);
        t.p2p_bytes_sent += x.p2p_bytes_sent, t.p2p_msgs += x.p2p_msgs, t.p2p_bytes_recv += x.p2p_bytes_recv;
        t.coll_bytes_in += x.coll_bytes_in, t.coll_calls += x.coll_calls;
    }
    return t;
}

int main(int argc, char **argv) {
    mallopt(M_MMAP_THRESHOLD, 64 * 1024);
    int micro = take_int(&argc, argv, "--micro-batches", 4, 1, PIPE_MAX_MICRO);
    int replicas = take_int(&argc, argv, "--replicas", 1, 1, 64);
    int steps = take_int(&argc, argv, "--steps", 2, 1, 1000);
    const char *sched_name = take_option(&argc, argv, "--schedule");
    ScheduleKind sched = SCHEDULE_GPIPE;
    if (sched_name && !schedule_parse(sched_name, &sched)) die("--schedule takes gpipe or 1f1b, got '%s'", sched_name);
    TrainOptions o;
    cli_parse(&o, argc, argv, CLI_DIST);
    cli_apply_dataset_defaults(&o);
    Device dev;
    device_parse(o.device, &dev, true);
    ProcessGroup *pg = pg_init(&argc, &argv, o.backend, dev, o.timeout_s);
    int world = pg_world(pg);
    if (world % replicas != 0 || world / replicas < 2)
        die("%d ranks as %d replica(s): each replica needs 2 or more stages (world = stages x replicas)", world,
            replicas);
    int P = world / replicas;
    PipeGrid g;
    CHECK(pipe_grid(pg_rank(pg), world, P, &g), "pipe_grid (solutions/08-pipeline) refused the grid");
    if (o.batch_size % replicas != 0) die("--batch-size %d is not a multiple of %d replicas", o.batch_size, replicas);
    int local_batch = o.batch_size / replicas;

    TrainData data;
    pipe_dist_data_open(&data, &o, &g);
    ModelConfig cfg;
    model_config(&cfg, o.model, o.width, data.train.c, data.train.h, data.train.w, data.train.classes);
    Model *table = model_create(&cfg, DEVICE_CPU, 1, o.seed);
    double cost[MODEL_MAX_LAYERS] = {0};
    int first[PIPE_MAX_STAGES + 1];
    pipe_layer_costs(table, BALANCE_PARAMS, NULL, cost);
    if (!pipe_balance(table, cost, P, first)) die("%s cannot be cut into %d stages", o.model, P);
    DistPipe *dp = pipe_dist_create(pg, table, dev, first, P, micro, local_batch, sched);

    loader_start_epoch(data.train_loader, 0, 0);
    const Batch *b = loader_next(data.train_loader, NULL);
    CHECK(b != NULL && b->n == local_batch, "the training split has no full batch for this --batch-size");
    SgdConfig opt = train_sgd_config(&o);
    PipePlan plan;
    pipe_dist_plan(dp, b->n, &plan);
    pipe_dist_step(dp, b, &plan, &opt, o.label_smoothing);  // warm-up: every fixed buffer touched once
    PgTraffic t0 = traffic_sum(dp);
    long long rss_base = -1, hwm_delta = -1;
    for (int i = 0; i < steps; i++) {
        if (i == steps - 1) {  // the last step's peak over the memory left once the views so far are freed
            free_views(&dp->local->stages[0]);
            rss_base = proc_status_bytes("VmRSS:");
            bool reset = reset_peak_rss();
            pipe_dist_step(dp, b, &plan, &opt, o.label_smoothing);
            long long hwm = proc_status_bytes("VmHWM:");
            if (reset && hwm >= 0 && rss_base >= 0) hwm_delta = hwm - rss_base;
        } else {
            pipe_dist_step(dp, b, &plan, &opt, o.label_smoothing);
        }
    }
    PgTraffic t1 = traffic_sum(dp);
    const Stage *st = &dp->local->stages[0];
    size_t out_f = g.stage + 1 < P ? stage_out_floats(st, table) : 0, in_f = g.stage > 0 ? st->in_floats : 0;
    size_t held = stage_held_bytes(st);
    // What one view of a micro-batch writes per sample: its activations, their gradients (slots shared by the
    // plan), and the input's gradient it sends back (not on the first stage).
    const Model *v0 = st->n_views > 0 ? st->views[0] : NULL;
    size_t per_sample = v0 ? v0->act_floats_per_sample + v0->grad_floats_per_sample + (v0->dinput ? st->in_floats : 0)
                           : 0;
    size_t touched_formula = (size_t)plan.peak_inflight * (size_t)st->micro_rows * per_sample * sizeof(float);
    double n = (double)steps;
    printf("wire: rank=%d stage=%d replica=%d P=%d R=%d M=%d schedule=%s model=%s batch=%d micro_rows=%d "
           "out_floats=%zu in_floats=%zu p2p_sent=%.0f p2p_msgs=%.2f p2p_recv=%.0f coll_bytes=%.0f coll_calls=%.2f "
           "p2p_sent_formula=%zu held_bytes=%zu peak_inflight=%d view_bytes=%zu hwm_delta=%lld rss_base=%lld "
           "params=%zu view_floats_per_sample=%zu held_formula=%zu\n",
           pg_rank(pg), g.stage, g.replica, P, replicas, plan.micro, schedule_name(sched), o.model, o.batch_size,
           st->micro_rows, out_f, in_f, (double)(t1.p2p_bytes_sent - t0.p2p_bytes_sent) / n,
           (double)(t1.p2p_msgs - t0.p2p_msgs) / n, (double)(t1.p2p_bytes_recv - t0.p2p_bytes_recv) / n,
           (double)(t1.coll_bytes_in - t0.coll_bytes_in) / n, (double)(t1.coll_calls - t0.coll_calls) / n,
           (size_t)local_batch * (out_f + in_f) * sizeof(float), held, plan.peak_inflight,
           st->n_views > 0 ? held / (size_t)st->n_views : 0, hwm_delta, rss_base, st->n_params,
           per_sample, touched_formula);
    fflush(stdout);
    pipe_dist_free(dp);
    model_free(table);
    train_data_close(&data);
    pg_finalize(pg);
    return 0;
}
