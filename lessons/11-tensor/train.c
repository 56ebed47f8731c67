// train.c: lesson 11, lesson 03's data-parallel program with every residual block split over a tensor group
// (Megatron-LM's tensor parallelism), and the tensor x data grid.
//
//   scripts/launch.sh 2 ./train --tp 2                  one tensor group of 2: each block's channels halved
//   scripts/launch.sh 4 ./train --tp 2 --memory         a 2 x 2 grid: 2 tensor ranks x 2 data replicas
//   scripts/launch.sh 4 ./train --tp 4 --stop-at 5      one group of 4, five steps
//
// Read it top to bottom: options (the kit's, CLI_TP: --tp, --memory, --stop-at), then lesson 03's loop
// (ddp_run_open / ddp_run_epochs / ddp_run_report) with its hooks set to this lesson's:
//
//   open            this rank's place in the grid, its groups and its replica's data (TODO 4)
//   make_model      the pieces: split blocks and replicated stages (tp_create); a whole model for the setup line
//   step            tp_step: forward through the pieces, f and g inside the blocks (TODO 1-2), the data average
//   evaluate        tp_evaluate: the pieces in eval mode
//   after_step      --memory after step 1, the bytes of step 1 against the arithmetic, --stop-at
//   check_replicas  what must agree: replicated layers over the world, slices over the data group
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

#ifndef AUTOGRADER

// ---------------------------------------------------------------- the hooks into lesson 03's loop

typedef struct {
    Tp *tp;
    TpGrid grid;
    PgTraffic tensor0, data0;  // the groups' counters before step 1
} TpRun;

// This rank's place in the grid and its groups (TODO 4a-b), its replica's data (TODO 4c), the ranks that hold
// copies of its slices (the data group: the loop broadcasts among them, and counts the replicas by it), and the
// rank that prints: world rank 0 (tensor rank 0 of replica 0).
static int open_grid(void *ctx, DdpRun *r) {
    TpRun *run = ctx;
    const int T = r->o->tp ? r->o->tp : pg_world(r->pg);  // --tp 0: one tensor group of every rank
    run->tp = tp_join(r->pg, T);
    run->grid = run->tp->grid;
    if (r->o->batch_size % run->grid.dp != 0)
        die("--batch-size %d is not a multiple of the %d data replica(s)", r->o->batch_size, run->grid.dp);
    tp_data_open(&r->data, r->o, &run->grid);
    r->replicas = run->tp->data;
    r->is_main = pg_rank(r->pg) == 0;
    return r->o->batch_size / run->grid.dp;
}

// The pieces, and a whole model for the loop's setup line: made for one image, emptied once printed.
static Model *make_model(void *ctx, DdpRun *r, const ModelConfig *cfg) {
    TpRun *run = ctx;
    Device dev = pg_device(r->pg);
    tp_make_pieces(run->tp, cfg, dev, r->local_batch, r->o->seed);
    return model_create(cfg, dev, 1, r->o->seed);
}

static Metrics step(void *ctx, DdpRun *r, const Batch *b) {
    TpRun *run = ctx;
    if (run->tp->steps == 0) {
        mem_stats_reset_peak();  // the peaks from here on: the training's, not the set-up's
        run->tensor0 = pg_traffic(run->tp->tensor), run->data0 = pg_traffic(run->tp->data);
    }
    return tp_step(run->tp, b, &r->opt, r->o->label_smoothing);
}

// Step 1's bytes per group, measured (pg_traffic) and by the arithmetic: they must be equal.
static void print_traffic(TpRun *run, int n) {
    const Tp *tp = run->tp;
    PgTraffic t = pg_traffic(tp->tensor), d = pg_traffic(tp->data);
    TpTraffic e = tp_expected_traffic(tp, n);
    printf("tp: step 1 on rank %d: tensor group %llu bytes in %llu all-reduces (arithmetic %llu in %llu), "
           "data group %llu bytes in %llu calls (arithmetic %llu in %llu)\n",
           pg_rank(tp->world), (unsigned long long)(t.coll_bytes_in - run->tensor0.coll_bytes_in),
           (unsigned long long)(t.coll_calls - run->tensor0.coll_calls), (unsigned long long)e.tensor_bytes,
           (unsigned long long)e.tensor_calls, (unsigned long long)(d.coll_bytes_in - run->data0.coll_bytes_in),
           (unsigned long long)(d.coll_calls - run->data0.coll_calls), (unsigned long long)e.data_bytes,
           (unsigned long long)e.data_calls);
}

static bool after_step(void *ctx, DdpRun *r, const Batch *b, const Metrics *batch) {
    TpRun *run = ctx;
    (void)batch;
    if (run->tp->steps == 1) {
        if (r->is_main) print_traffic(run, b->n);
        if (r->o->memory) {
            for (int k = 0; k < pg_world(r->pg); k++) {  // one rank at a time, in rank order
                if (k == pg_rank(r->pg)) tp_print_memory(run->tp, stdout), fflush(stdout);
                pg_barrier(r->pg);
            }
        }
    }
    return r->o->stop_at > 0 && r->run.step >= r->o->stop_at;
}

static Metrics evaluate(void *ctx, DdpRun *r) {
    TpRun *run = ctx;
    return tp_evaluate(run->tp, r->data.test_loader);
}

// A replicated stage must be identical on EVERY rank (a missing f all-reduce in backward shows here first: the
// stages before a block then train on a partial gradient). A block's slices differ across the tensor group by
// design; the copies of one slice (the data group) must agree, and BN2, replicated, everywhere.
static void check_replicas(void *ctx, DdpRun *r, const char *what) {
    TpRun *run = ctx;
    const Tp *tp = run->tp;
    char name[160];
    for (int p = 0; p < tp->n_pieces; p++) {
        const TpPiece *pc = &tp->pieces[p];
        if (pc->stage) {
            snprintf(name, sizeof name, "%s, replicated layers %d-%d", what, pc->first, pc->last - 1);
            pg_check_identical(tp->world, pc->stage->params, pc->stage->n_params, name);
            continue;
        }
        const TpBlock *b = pc->block;
        snprintf(name, sizeof name, "%s, block at layer %d: this tensor rank's slices", what, b->layer);
        pg_check_identical(tp->data, b->params, b->n_params, name);
        snprintf(name, sizeof name, "%s, block at layer %d: BN2 (replicated)", what, b->layer);
        pg_check_identical(tp->world, b->g2, 2 * (size_t)b->c, name);
    }
}

static void print_pieces(const Tp *tp) {
    printf("tp: %d tensor rank%s x %d data replica%s; the model in %d pieces, %d block%s split\n", tp->grid.tp,
           tp->grid.tp == 1 ? "" : "s", tp->grid.dp, tp->grid.dp == 1 ? "" : "s", tp->n_pieces, tp->n_blocks,
           tp->n_blocks == 1 ? "" : "s");
    for (int p = 0; p < tp->n_pieces; p++) {
        const TpPiece *pc = &tp->pieces[p];
        if (pc->stage)
            printf("  layers %2d-%-2d replicated      %9zu params on every rank\n", pc->first, pc->last - 1,
                   pc->stage->n_params);
        else
            printf("  layers %2d-%-2d block, %3d channels: %9zu params on this rank (%d of %d channels between "
                   "its convs)\n", pc->first, pc->last - 1, pc->block->c, pc->block->n_params, pc->block->k,
                   pc->block->c);
    }
}

// The whole model's parameters gathered from the pieces, as a CRC-32: two runs that trained the same numbers
// print the same value.
static void print_params_crc(Tp *tp, Model *whole, bool is_main) {
    model_materialize(whole, MODEL_PARAMS);
    tp_gather_model(tp, whole);
    uint32_t crc = ckpt_params_crc32(whole);
    if (is_main) printf("tp: parameters crc32=%08lx (%zu floats, gathered from the pieces)\n", (unsigned long)crc,
                        whole->n_params);
    model_release(whole, MODEL_PARAMS);
}

static int train(ProcessGroup *pg, const TrainOptions *o) {
    TpRun run = {0};
    TrainHooks hooks = {.ctx = &run, .open = open_grid, .make_model = make_model, .step = step,
                        .after_step = after_step, .evaluate = evaluate, .check_replicas = check_replicas};
    DdpRun r;
    ddp_run_open(&r, pg, o, &hooks);
    model_release(r.ddp.model, MODEL_PARAMS | MODEL_GRADS | MODEL_VELOCITY | MODEL_ACTS);
    if (r.is_main) print_pieces(run.tp);
    ddp_run_epochs(&r);
    r.ddp.compute_seconds = run.tp->compute_seconds, r.ddp.comm_seconds = run.tp->comm_seconds;
    print_params_crc(run.tp, r.ddp.model, r.is_main);
    char extra[96];
    snprintf(extra, sizeof extra, "tp=%d dp=%d params_per_rank=%zu", run.grid.tp, run.grid.dp,
             tp_local_params(run.tp));
    ddp_run_report(&r, extra);
    model_free(ddp_run_close(&r));
    tp_free(run.tp);
    return 0;
}

// ---------------------------------------------------------------- main

int main(int argc, char **argv) {
    TrainOptions o;
    cli_parse(&o, argc, argv, CLI_DIST | CLI_TP);  // lessons 01 and 03's options, and this lesson's
    if (!o.model) o.model = "resnet9";  // on every dataset: the kit's model with residual blocks
    cli_apply_dataset_defaults(&o);
    Device dev;
    device_parse(o.device, &dev, true);  // quiet: rank 0 names the device in the process group's line
    ProcessGroup *pg = pg_init(&argc, &argv, o.backend, dev, o.timeout_s);
    int rc = train(pg, &o);
    pg_finalize(pg);
    return rc;
}
#endif  // AUTOGRADER
