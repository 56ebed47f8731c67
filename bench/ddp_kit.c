// bench/ddp_kit.c: lesson 03's DDP training loop (the solution's train.c, linked in whole) timed over a fixed
// number of steps, for bench/torch_ddp.py, which runs it alternately with PyTorch DistributedDataParallel.
//
//   scripts/launch.sh 2 build/bench/ddp_kit --steps 8 --warmup 2 --model resnet9 --batch-size 128
//
// --poke (an experiment, off by default): after every layer's gradients-ready call, one MPI_Iprobe, which drives
// Open MPI's progress engine and with it the buckets' all-reduces started during backward (Open MPI moves a
// non-blocking collective only inside MPI calls: without a poke, a bucket started mid-backward mostly waits for
// buckets_finish). It measures what such a poke in kit/buckets.c would hide.
//
// Every option but --steps, --warmup and --poke is lesson 03's own (kit/cli.h: --batch-size is the GLOBAL batch). The
// run stops after warmup + steps steps of the first epoch (it must have that many: the synthetic set's 5000
// images make 39 steps at 128), so no evaluation falls inside the timed part. Rank 0 prints one JSON line:
//
//   seconds        the timed steps on rank 0, from the end of the last warm-up step to the end of the last
//                  step (loader, forward, backward, the all-reduce, SGD, the BN buffers' broadcast: the whole
//                  job's loop); images = steps x global batch
//   exposed_comm_s rank 0's wait for the gradient all-reduce after its backward (lesson 03's Ddp.comm_seconds;
//                  with buckets the part that overlapped backward is not in it), over the timed steps
//   exposed_after_slowest_s  the same wait counted from the end of the SLOWEST rank's backward (rank 0's
//                  all-reduce end minus the latest backward end, one clock for every process of the machine):
//                  communication that nothing hid, without the wait for a slower rank
//   coll_bytes_per_step, coll_calls_per_step  what rank 0 handed to the process group's collectives per timed
//                  step (pg_traffic: the gradient all-reduce's buffer, the BN buffers' broadcast, any metrics):
//                  the payload, not what the ring puts on the wire (2 (w-1)/w of an all-reduce's buffer)
//   compute_s      forward + backward + SGD over the timed steps (Ddp.compute_seconds); data_wait_s: the
//                  loader's share (time spent waiting for the next batch)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit/check.h"
#include "kit/cli.h"
#include "kit/dist.h"
#include "kit/log.h"
#include "kit/model.h"
#include "solutions/03-ddp/lesson.h"

#include <mpi.h>
#include <omp.h>

typedef struct {
    int warmup, steps, done;
    bool poke;  // --poke
    double t0, comm0, compute0, wait0;  // at the end of the last warm-up step
    double comm_prev;                   // Ddp.comm_seconds after the previous step
    double last_grads;  // when backward's last gradients-ready call returned (the last bucket started): its end
    void (*on_grads_ready)(void *ctx, size_t offset, size_t count);  // the buckets' hook, called through ours
    void *on_grads_ready_ctx;
    ProcessGroup *pg;
    PgTraffic traffic0;  // the group's counters at the end of the last warm-up step
    double *ends;  // (2 steps) per timed step: backward's end, the gradient all-reduce's end (CLOCK_MONOTONIC)
} Timing;

// Between backward and the buckets: lets the buckets start what is ready, then notes the time. The first layer's
// call is backward's last act, so the last time noted in a step is where backward ended, as DDP's own timer
// places it (after the last bucket's all-reduce was started).
static void timing_on_grads_ready(void *ctx, size_t offset, size_t count) {
    Timing *t = ctx;
    if (t->on_grads_ready) t->on_grads_ready(t->on_grads_ready_ctx, offset, count);
    if (t->poke) {
        int flag = 0;
        MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
    }
    t->last_grads = time_now();
}

// Called after every complete step: marks the end of the warm-up, stops after the timed steps.
static bool timing_after_step(void *ctx, DdpRun *r, const Batch *b, const Metrics *batch) {
    (void)b, (void)batch;
    Timing *t = ctx;
    int k = t->done++ - t->warmup;  // this step's index among the timed ones
    if (k >= 0) {  // the all-reduce ended comm_seconds' increase after backward did
        t->ends[2 * k] = t->last_grads;
        t->ends[2 * k + 1] = t->last_grads + (r->ddp.comm_seconds - t->comm_prev);
    }
    t->comm_prev = r->ddp.comm_seconds;
    if (t->done == t->warmup) {
        t->t0 = time_now();
        t->comm0 = r->ddp.comm_seconds;
        t->compute0 = r->ddp.compute_seconds;
        t->wait0 = r->log.data_wait;
        t->traffic0 = pg_traffic(t->pg);
    }
    return t->done == t->warmup + t->steps;
}

// The communication left after the LAST rank's backward, summed over the timed steps: rank 0's all-reduce end
// minus the latest backward end of any rank (one clock for every process of a machine: CLOCK_MONOTONIC). Rank
// 0's own wait (Ddp.comm_seconds) also holds its wait for a slower rank; this does not.
static double exposed_after_slowest(ProcessGroup *pg, const Timing *t) {
    int world = pg_world(pg), rank = pg_rank(pg), n = 2 * t->steps;
    double *all = xcalloc((size_t)(world * n), sizeof *all);  // (world, steps, 2): a gather made of a sum
    memcpy(all + (size_t)rank * (size_t)n, t->ends, (size_t)n * sizeof *all);
    pg_allreduce_sum_double_host(pg, all, world * n);
    double sum = 0;
    for (int k = 0; k < t->steps; k++) {
        double slowest = 0;
        for (int r = 0; r < world; r++) slowest = all[r * n + 2 * k] > slowest ? all[r * n + 2 * k] : slowest;
        double left = all[2 * k + 1] - slowest;  // rank 0's end
        sum += left > 0 ? left : 0;
    }
    free(all);
    return sum;
}

// Takes the flag `name` out of argv; true when it was there.
static bool take_flag(int *argc, char **argv, const char *name) {
    for (int i = 1; i < *argc; i++) {
        if (strcmp(argv[i], name) != 0) continue;
        memmove(argv + i, argv + i + 1, (size_t)(*argc - i) * sizeof *argv);  // the NULL at argv[argc] too
        *argc -= 1;
        return true;
    }
    return false;
}

// Takes the integer option `name` (and its value) out of argv, so that the rest is lesson 03's command line.
static int take_int_option(int *argc, char **argv, const char *name, int fallback, int lo) {
    for (int i = 1; i < *argc; i++) {
        if (strcmp(argv[i], name) != 0) continue;
        if (i + 1 >= *argc) die("%s needs a value", name);
        char *end = NULL;
        long v = strtol(argv[i + 1], &end, 10);
        if (*end != '\0' || v < lo || v > 100000) die("%s needs an integer >= %d, got '%s'", name, lo, argv[i + 1]);
        memmove(argv + i, argv + i + 2, (size_t)(*argc - i - 1) * sizeof *argv);  // the NULL at argv[argc] too
        *argc -= 2;
        return (int)v;
    }
    return fallback;
}

int main(int argc, char **argv) {
    Timing t = {.warmup = take_int_option(&argc, argv, "--warmup", 2, 1)};
    t.steps = take_int_option(&argc, argv, "--steps", 8, 1);
    t.poke = take_flag(&argc, argv, "--poke");
    TrainOptions o;
    cli_parse(&o, argc, argv, CLI_DIST);
    cli_apply_dataset_defaults(&o);
    o.epochs = 1;
    Device dev;
    device_parse(o.device, &dev, true);
    ProcessGroup *pg = ddp_setup(&argc, &argv, &o, dev);
    CHECK(pg != NULL, "ddp_setup returns the process group of pg_init (solutions/03-ddp/train.c)");

    DdpRun r;
    t.pg = pg;
    TrainHooks hooks = {.ctx = &t, .after_step = timing_after_step};
    ddp_run_open(&r, pg, &o, &hooks);
    t.ends = xcalloc((size_t)(2 * t.steps), sizeof *t.ends);
    Model *m = r.ddp.model;  // our hook in front of the buckets' (none with --bucket-mb 0: backward's end only)
    t.on_grads_ready = m->on_grads_ready;
    t.on_grads_ready_ctx = m->on_grads_ready_ctx;
    m->on_grads_ready = timing_on_grads_ready;
    m->on_grads_ready_ctx = &t;
    if (t.warmup + t.steps > r.steps_per_epoch)
        die("--warmup %d + --steps %d is more than the %d steps of one epoch (the timed part must not hold an "
            "evaluation): fewer steps, or a smaller --batch-size", t.warmup, t.steps, r.steps_per_epoch);
    ddp_run_epoch(&r);  // stops itself after the timed steps
    double seconds = time_now() - t.t0;
    if (t.done != t.warmup + t.steps) die("the epoch ended after %d of %d steps", t.done, t.warmup + t.steps);
    PgTraffic tr = pg_traffic(pg);  // before exposed_after_slowest's own all-reduce
    double coll_bytes = (double)(tr.coll_bytes_in - t.traffic0.coll_bytes_in) / t.steps;
    double coll_calls = (double)(tr.coll_calls - t.traffic0.coll_calls) / t.steps;
    double after_slowest = exposed_after_slowest(pg, &t);
    if (r.is_main) {
        printf("{\"impl\": \"kit\", \"model\": \"%s\", \"world\": %d, \"threads\": %d, \"local_batch\": %d, "
               "\"steps\": %d, \"images\": %d, \"seconds\": %.6f, \"exposed_comm_s\": %.6f, \"exposed_after_slowest_s\": %.6f, "
               "\"compute_s\": %.6f, "
               "\"data_wait_s\": %.6f, \"coll_bytes_per_step\": %.1f, \"coll_calls_per_step\": %.2f, \"n_params\": %zu, "
               "\"n_buffers\": %zu, \"bucket_mb\": %g, \"backend\": \"%s\", \"poke\": %s}\n",
               o.model, pg_world(pg), omp_get_max_threads(), r.local_batch, t.steps,
               t.steps * r.local_batch * pg_world(pg), seconds, r.ddp.comm_seconds - t.comm0, after_slowest,
               r.ddp.compute_seconds - t.compute0, r.log.data_wait - t.wait0, coll_bytes, coll_calls, r.ddp.model->n_params,
               r.ddp.model->n_buffers, o.bucket_mb,
               pg_backend_name(pg_backend(pg)), t.poke ? "true" : "false");
        fflush(stdout);
    }
    m->on_grads_ready = t.on_grads_ready;
    m->on_grads_ready_ctx = t.on_grads_ready_ctx;
    free(t.ends);
    model_free(ddp_run_close(&r));
    pg_finalize(pg);
    return 0;
}
