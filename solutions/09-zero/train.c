// train.c: lesson 09, lesson 03's data-parallel program with the training state sharded over the ranks (ZeRO
// stages 1-3, FSDP) and, optionally, the activations recomputed in backward.
//
//   scripts/launch.sh 2 ./train --zero 1                     momentum sharded
//   scripts/launch.sh 3 ./train --zero 3 --units 4 --memory  parameters sharded, the memory table after step 1
//   scripts/launch.sh 2 ./train --zero 2 --recompute         + activations recomputed in backward
//
// Read it top to bottom: options (the kit's, CLI_ZERO: --zero, --units, --recompute, --memory, --consolidate), then
// lesson 03's loop (ddp_run_open / ddp_run_epochs / ddp_run_report) with its hooks set to this lesson's:
//
//   make_model      the units and their shards (zero_create); the whole model the loop prints the setup with
//   step            zero_step (TODO 2-5, zero.c)
//   evaluate        zero_evaluate: the units one after the other (stage 3: each in its window)
//   check_replicas  what must agree across ranks: full parameters (stages 0-2) and the BN statistics
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit/check.h"
#include "kit/ckpt.h"
#include "kit/cli.h"
#include "kit/data.h"
#include "kit/device.h"
#include "kit/dist.h"
#include "kit/log.h"
#include "kit/model.h"
#include "kit/optim.h"
#include "kit/train.h"
#include "lesson.h"
#include "zero_ckpt.h"

#ifndef AUTOGRADER

// ---------------------------------------------------------------- this lesson's options

// They are the kit's (kit/cli.c, the group CLI_ZERO): --zero, --units, --recompute, --memory and --consolidate
// arrive in TrainOptions with lesson 03's and lesson 04's, their ranges checked there. The kit's table cannot
// see this lesson's header: its --units range is written out, and must stay ZERO_MAX_UNITS.
_Static_assert(ZERO_MAX_UNITS == 32, "kit/cli.c's --units row accepts 1..32: change it with ZERO_MAX_UNITS");

// ---------------------------------------------------------------- the hooks into lesson 03's loop

typedef struct {
    Zero *z;
} ZeroRun;

// The units, and a whole model for the loop's setup line: made for one image, and emptied once the loop has
// printed it (after ddp_run_open), so that it takes no memory the table would count.
static Model *make_model(void *ctx, DdpRun *r, const ModelConfig *cfg) {
    ZeroRun *zr = ctx;
    Device dev = pg_device(r->pg);
    zr->z = zero_create(r->pg, cfg, dev, r->local_batch, r->o->seed, (ZeroStage)r->o->zero, r->o->units,
                        r->o->recompute);
    return model_create(cfg, dev, 1, r->o->seed);
}

static Metrics step(void *ctx, DdpRun *r, const Batch *b) {
    ZeroRun *zr = ctx;
    if (zr->z->steps == 0) mem_stats_reset_peak();  // the peaks from here on: the training's, not the set-up's
    Metrics m = zero_step(zr->z, b, &r->opt, r->o->label_smoothing);
    if (zr->z->steps == 1 && r->o->memory) {
        zero_print_memory(zr->z, stdout);
        const Model *whole = r->ddp.model;  // emptied but for its BN statistics, which model_release keeps
        if (r->is_main && whole->n_buffers)
            printf("  params beyond the expected: %zu bytes, the BN statistics of the whole model the loop printed\n",
                   whole->n_buffers * sizeof(float));
    }
    return m;
}

static Metrics evaluate(void *ctx, DdpRun *r) {
    ZeroRun *zr = ctx;
    return zero_evaluate(zr->z, r->data.test_loader);
}

// Stages 0-2 keep the full parameters on every rank: they must be identical. Stage 3's shards differ by design
// (and its all-gather makes every window identical); what every rank holds whole there is the BN statistics.
static void check_replicas(void *ctx, DdpRun *r, const char *what) {
    ZeroRun *zr = ctx;
    for (int u = 0; u < zr->z->n_units; u++) {
        const Model *m = zr->z->units[u];
        char name[128];
        snprintf(name, sizeof name, "%s, unit %d", what, u);
        if (m->params) pg_check_identical(r->pg, m->params, m->n_params, name);
        snprintf(name, sizeof name, "BN statistics after %s, unit %d", what, u);
        if (m->n_buffers) pg_check_identical(r->pg, m->buffers, m->n_buffers, name);
    }
}

// The most any rank held at once since the first step, in MB.
static double peak_mb_over_ranks(ProcessGroup *pg) {
    int W = pg_world(pg);
    double *peaks = xcalloc((size_t)W, sizeof(double));
    peaks[pg_rank(pg)] = (double)mem_stats().peak_total;
    pg_allreduce_sum_double_host(pg, peaks, W);
    double most = 0;
    for (int r = 0; r < W; r++)
        if (peaks[r] > most) most = peaks[r];
    free(peaks);
    return most / 1e6;
}

static void print_units(const Zero *z) {
    printf("zero: stage %d (%s) over %d rank%s, %d unit%s%s\n", z->stage,
           (const char *[]){"DDP: nothing sharded", "momentum sharded", "momentum + gradients sharded",
                            "momentum + gradients + parameters sharded"}[z->stage],
           z->world, z->world == 1 ? "" : "s", z->n_units, z->n_units == 1 ? "" : "s",
           z->recompute ? ", activations recomputed in backward" : "");
    for (int u = 0; u < z->n_units; u++)
        printf("  unit %2d: layers %2d-%-2d %9zu params, shard %zu (+%zu padding on the last rank)\n", u, z->first[u],
               z->first[u + 1] - 1, z->layout[u].n, z->layout[u].shard, z->layout[u].padded - z->layout[u].n);
}

// The whole model's parameters gathered from the units (zero_gather_model), as a CRC-32: two runs that trained
// the same numbers print the same value (stage 1 against stage 0, a recomputed run against a plain one).
static void print_params_crc(Zero *z, Model *whole, bool is_main) {
    model_materialize(whole, MODEL_PARAMS);
    zero_gather_model(z, whole);
    uint32_t crc = ckpt_params_crc32(whole);
    if (is_main) printf("zero: parameters crc32=%08lx (%zu floats, gathered from the units)\n", (unsigned long)crc,
                        whole->n_params);
    model_release(whole, MODEL_PARAMS);
}

static int train(ProcessGroup *pg, const TrainOptions *o, ZeroCkpt *ck) {
    ZeroRun zr = {0};
    TrainHooks hooks = {.ctx = &zr, .make_model = make_model, .step = step, .evaluate = evaluate,
                        .check_replicas = check_replicas};
    DdpRun r;
    zero_ckpt_attach(ck, &hooks, o);
    ddp_run_open(&r, pg, o, &hooks);
    if (zero_ckpt_begin(ck, &r, zr.z) != 0) return 1;
    model_release(r.ddp.model, MODEL_PARAMS | MODEL_GRADS | MODEL_VELOCITY | MODEL_ACTS);
    if (r.is_main) print_units(zr.z);
    ddp_run_epochs(&r);
    r.ddp.compute_seconds = zr.z->compute_seconds, r.ddp.comm_seconds = zr.z->comm_seconds;
    double peak = peak_mb_over_ranks(pg);
    print_params_crc(zr.z, r.ddp.model, r.is_main);
    if (r.is_main && zr.z->steps > 0)
        printf("zero: %.3f MB sent per rank per step (ring count), %ld steps\n", zr.z->bytes_sent / 1e6 / zr.z->steps,
               zr.z->steps);
    char extra[160];
    snprintf(extra, sizeof extra, "zero=%d units=%d recompute=%d peak_mb=%.3f", o->zero, zr.z->n_units,
             o->recompute ? 1 : 0, peak);
    ddp_run_report(&r, extra);
    int rc = zero_ckpt_end(ck, &r) != 0;
    model_free(ddp_run_close(&r));
    zero_free(zr.z);
    return rc;
}

// ---------------------------------------------------------------- main

int main(int argc, char **argv) {
    ZeroCkpt ck;
    TrainOptions o;
    cli_parse(&o, argc, argv, CLI_DIST | CLI_CKPT | CLI_ZERO);  // lessons 01, 03 and 04's options, and this lesson's
    cli_apply_dataset_defaults(&o);
    Device dev;
    device_parse(o.device, &dev, true);  // quiet: rank 0 names the device in the process group's line
    ProcessGroup *pg = pg_init(&argc, &argv, o.backend, dev, o.timeout_s);
    int rc = train(pg, &o, &ck);
    pg_finalize(pg);
    return rc;
}
#endif  // AUTOGRADER
