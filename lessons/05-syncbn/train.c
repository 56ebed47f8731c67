// train.c: lesson 05, lesson 04's program (DDP with checkpoints) with synchronised batch norm: the BN layers
// normalise with the statistics of the global batch, so N ranks train the model one process would on the
// global batch.
//
//   scripts/launch.sh 8 ./train --dataset fashion-mnist --batch-size 64     (8 images per rank, BN over 64)
//
// Every rank runs lesson 04's program, which comes complete from its solution like DDP (ddp_*) and the
// checkpoints (ckpt_*): run_program_with (solutions/04-checkpoint/train.c) opens the data, builds the model,
// resumes, trains with checkpoints and reports. It calls hooks at fixed points (RunHooks,
// solutions/04-checkpoint/lesson.h); this file fills them in, and that is all it adds:
//
//   model built:  every BN layer becomes SyncBN (TODO 5), before the broadcast and the gradient buckets
//   report:       what SyncBN cost in communication (the syncbn: line)
//   model done:   back to plain BN
//
// What you write is in syncbn.c (TODO 1-5).
#include <stdio.h>
#include <stdlib.h>

#include "kit/check.h"
#include "kit/cli.h"
#include "kit/device.h"
#include "kit/dist.h"
#include "kit/model.h"
#include "lesson.h"

// ---------------------------------------------------------------- the hooks
// ctx: where this run's SyncBn is kept (run_program, below; NULL while the model has plain BN).

// Did every rank convert? A rank left with plain BN while the others run SyncBN makes their collectives differ,
// which MPI reports steps later as a truncated message, far from the cause. This names the ranks instead.
static void check_converted_alike(ProcessGroup *pg, const Model *m) {
    int world = pg_world(pg), synced = 0;
    double *is_sync = xcalloc((size_t)world, sizeof *is_sync);  // (world) 1: that rank's BN layers are SyncBN
    is_sync[pg_rank(pg)] = m->bn_ops != NULL ? 1.0 : 0.0;
    pg_allreduce_sum_double_host(pg, is_sync, world);
    for (int r = 0; r < world; r++) synced += is_sync[r] != 0.0;
    if (synced != 0 && synced != world) {
        if (pg_rank(pg) == 0) {
            fprintf(stderr, "error: after convert_model the ranks' BN layers differ:");
            for (int r = 0; r < world; r++) fprintf(stderr, " rank %d %s;", r, is_sync[r] != 0.0 ? "SyncBN" : "plain BN");
            fprintf(stderr, "\n  HINT: TODO 5: syncbn_convert on EVERY rank\n");
        }
        pg_barrier(pg);  // rank 0's message first
        die("rank %d: the model is not converted like the other ranks' (see rank 0's error)", pg_rank(pg));
    }
    free(is_sync);
}

static void convert_model(void *ctx, ProcessGroup *pg, Model *m) {
    SyncBn **sb = ctx;
    // TODO 5 (the call): every BN layer becomes SyncBN here, on every rank, BEFORE the initial broadcast and the
    // gradient buckets (README section 5): lesson 04's program calls this right after model_create.
    (void)sb, (void)pg, (void)m;
    check_converted_alike(pg, m);
}

// What SyncBN cost in communication over `steps` steps: its all-reduces (2 per BN layer and step: forward's
// statistics, backward's gradient sums) against the one gradient all-reduce of DDP, in messages, bytes and time.
static void report_syncbn(void *ctx, const Ddp *ddp, long long steps) {
    const SyncBn *sb = *(SyncBn **)ctx;
    if (pg_rank(ddp->pg) != 0) return;  // rank 0 prints
    if (!sb || sb->allreduces == 0 || steps <= 0) {
        printf("syncbn: no SyncBN all-reduce ran: the BN layers used each rank's own batch (plain BN)\n");
        return;
    }
    double grad_bytes = (double)ddp->model->n_params * sizeof(float);
    double step_s = ddp->compute_seconds + ddp->comm_seconds;
    printf("syncbn: %.1f all-reduces per step, %.0f bytes per step (%.2f%% of the gradient all-reduce's %.0f), "
           "%.2f s waiting in them (%.1f%% of the steps' %.1f s; the gradient all-reduce's exposed wait: %.2f s)\n",
           (double)sb->allreduces / (double)steps, sb->bytes / (double)steps,
           100.0 * sb->bytes / (double)steps / grad_bytes, grad_bytes, sb->seconds,
           step_s > 0 ? 100.0 * sb->seconds / step_s : 0.0, step_s, ddp->comm_seconds);
}

static void unconvert_model(void *ctx, Model *m) {
    syncbn_free(*(SyncBn **)ctx, m);  // back to the kit's plain BN (what the caller may still run: eval mode)
}

// Lesson 04's program with the three hooks. The autograder runs whole trainings through it.
RunStatus run_program(ProcessGroup *pg, const TrainOptions *o, Model **model_out, long long *resumed_from) {
    SyncBn *sb = NULL;
    RunHooks hooks = {.ctx = &sb, .model_built = convert_model, .report = report_syncbn, .model_done = unconvert_model};
    return run_program_with(pg, o, &hooks, model_out, resumed_from);
}

#ifndef AUTOGRADER
// ---------------------------------------------------------------- main

int main(int argc, char **argv) {
    TrainOptions o;
    cli_parse(&o, argc, argv, CLI_DIST | CLI_CKPT);  // lesson 04's options: SyncBN needs none
    cli_apply_dataset_defaults(&o);
    Device dev;
    device_parse(o.device, &dev, true);
    ProcessGroup *pg = ddp_setup(&argc, &argv, &o, dev);
    CHECK(pg != NULL, "ddp_setup (lesson 03) returns the process group");
    long long resumed_from;
    RunStatus status = run_program(pg, &o, NULL, &resumed_from);
    pg_finalize(pg);
    // A stop on request (signal, --stop-at) is a success: the checkpoint is saved and the job can go on later.
    return status == RUN_DONE || status == RUN_STOPPED ? 0 : 1;
}
#endif  // AUTOGRADER
