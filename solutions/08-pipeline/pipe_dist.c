// pipe_dist.c: lesson 08 across processes. One stage per rank, activations and gradients by point-to-point
// messages (kit/dist.h), the world a grid of stages x replicas: the grid and its groups (TODO 5), one op of the
// schedule with its messages (TODO 6), the step over the schedule (TODO 7). The bookkeeping around them (the
// stage, the timed sends and receives, the plan, evaluation) is given, below the TODOs.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit/check.h"
#include "kit/device.h"
#include "kit/log.h"
#include "kit/trace.h"
#include "lesson.h"

// ---------------------------------------------------------------- TODO 5: the grid

bool pipe_grid(int rank, int world, int stages, PipeGrid *g) {
    // TODO 5a: world = stages x replicas. Which stage and which replica is `rank`? Consecutive ranks share a
    // node (fast links): give them the axis that moves more bytes per step, the pipe's activations (grow with
    // the batch) or a stage's gradient all-reduce (fixed by its parameters). README section 14: decide, then
    // number the grid so; every rank must compute the same grid.
    // BEGIN SOLUTION
    if (stages < 1 || world < stages || world % stages != 0 || rank < 0 || rank >= world) return false;
    g->stages = stages, g->replicas = world / stages;
    g->stage = rank % stages, g->replica = rank / stages;
    return true;
    // STARTER: (void)rank, (void)world, (void)stages, (void)g;
    // STARTER: return false;
    // END SOLUTION
}

void pipe_dist_groups(ProcessGroup *world, const PipeGrid *g, ProcessGroup **same_stage, ProcessGroup **pipe) {
    // TODO 5b: two splits of the world (pg_split: the ranks that pass the same color form a group, ranked by
    // key). The gradient of stage s must be averaged with the OTHER COPIES of stage s only: the ranks of other
    // stages hold other tensors. Messages go between the stages of ONE replica.
    // BEGIN SOLUTION
    *same_stage = pg_split(world, g->stage, g->replica);
    *pipe = pg_split(world, g->replica, g->stage);
    // STARTER: (void)world, (void)g;
    // STARTER: *same_stage = NULL, *pipe = NULL;
    // END SOLUTION
}

void pipe_dist_data_open(TrainData *td, const TrainOptions *o, const PipeGrid *g) {
    // TODO 5c (stretch: needed only for several replicas, the 2 x 2 grid's runs): lesson 03's sharding, by
    // replica. Why not by rank: the P ranks of a pipe must read the SAME images (stage 0 feeds them in, the last
    // stage needs their labels).
    // BEGIN SOLUTION
    train_data_open(td, o, g->replica, g->replicas, o->batch_size / g->replicas);
    // STARTER: train_data_open(td, o, 0, 1, o->batch_size);
    // STARTER: (void)g;
    // END SOLUTION
}

// ---------------------------------------------------------------- TODO 6: one op and its messages

int pipe_tag(bool backward, int micro) {
    // TODO 6a: a message is matched by (sender, tag). Several micro-batches are in flight between two stages at
    // once, and a schedule may send them in any order: the tag must say WHICH micro-batch (and which direction).
    // BEGIN SOLUTION
    return 2 * micro + (backward ? 1 : 0);
    // STARTER: (void)backward, (void)micro;
    // STARTER: return 0;
    // END SOLUTION
}

void pipe_dist_run_op(DistPipe *dp, PipeOp op, int batch, int M, float smoothing, Metrics *r) {
    Stage *st = &dp->local->stages[0];
    int s = dp->grid.stage, P = dp->grid.stages, k = op.micro;
    int off, n;
    pipe_micro_range(batch, M, k, &off, &n);
    size_t fin = st->in_floats, fout = stage_out_floats(st, dp->table);  // floats per sample in, out
    char what[96];
    // TODO 6b: README section 13. Samples [off, off + n) of micro-batch k. Forward: the activation from stage
    // s-1 lands in st->input (unless s == 0: the images are there), stage_forward, then the output goes to
    // stage s+1 (or pipe_loss on the last stage, scale 1/batch: this replica's batch). Backward: the output gradient from stage s+1
    // lands in stage_dout(st) (unless last: pipe_loss wrote it), stage_backward, then st->dinput goes to s-1
    // (unless first). Peers are ranks of dp->pipe, which are the stages. Name the message in `what`
    // ("activation of micro-batch 3, stage 0 -> 1"): when it never comes, that is what the error says.
    // BEGIN SOLUTION
    if (!op.backward) {
        if (s > 0) {
            snprintf(what, sizeof what, "activation of micro-batch %d, stage %d -> %d", k, s - 1, s);
            pipe_dist_recv(dp, st->input + (size_t)off * fin, (size_t)n * fin, s - 1, pipe_tag(false, k), what);
        }
        stage_forward(st, dp->table, off, n, k, true);
        if (s + 1 < P) {
            snprintf(what, sizeof what, "activation of micro-batch %d, stage %d -> %d", k, s, s + 1);
            pipe_dist_send(dp, stage_out(st) + (size_t)off * fout, (size_t)n * fout, s + 1, pipe_tag(false, k), what);
        } else {
            pipe_loss(dp->local, off, n, smoothing, 1.0f / (float)batch, r);
        }
    } else {
        if (s + 1 < P) {
            snprintf(what, sizeof what, "gradient of micro-batch %d, stage %d -> %d", k, s + 1, s);
            pipe_dist_recv(dp, stage_dout(st) + (size_t)off * fout, (size_t)n * fout, s + 1, pipe_tag(true, k), what);
        }
        stage_backward(st, dp->table, off, n, k);
        if (s > 0) {
            snprintf(what, sizeof what, "gradient of micro-batch %d, stage %d -> %d", k, s, s - 1);
            pipe_dist_send(dp, st->dinput + (size_t)off * fin, (size_t)n * fin, s - 1, pipe_tag(true, k), what);
        }
    }
    // STARTER: (void)what, (void)fin, (void)fout, (void)smoothing, (void)r, (void)P, (void)n, (void)off, (void)s;
    // END SOLUTION
}

// ---------------------------------------------------------------- TODO 7: the step over the schedule

void pipe_dist_average_grads(DistPipe *dp) {
    Stage *st = &dp->local->stages[0];
    // Given (README section 14 walks through it): lesson 03's all-reduce, but of THIS stage's gradient and among
    // the ranks that hold this stage, the group of TODO 5b. Over the world it would average other stages' tensors.
    // (A stage without parameters has nothing to average.)
    if (dp->grid.replicas > 1 && st->n_params > 0) pg_allreduce_avg(dp->same_stage, st->grads, st->n_params);
}

Metrics pipe_dist_step(DistPipe *dp, const Batch *b, const PipePlan *plan, const SgdConfig *opt, float smoothing) {
    Metrics r = {0, 0, 0};
    double t0 = time_now();
    pipe_dist_load(dp, b);  // the images (stage 0) and labels (last stage) in, the gradients zeroed
    // TODO 7b: the plan's ops in order, each with its messages (pipe_dist_run_op); every send started is waited
    // for before the buffers change again (pipe_dist_wait_sends); then the gradient averaged over the replicas
    // and one SGD step of this stage (stage_optim_step on dp->local->stages[0]).
    // BEGIN SOLUTION
    for (int i = 0; i < plan->n_ops; i++) pipe_dist_run_op(dp, plan->ops[i], b->n, plan->micro, smoothing, &r);
    pipe_dist_wait_sends(dp);
    pipe_dist_average_grads(dp);
    stage_optim_step(&dp->local->stages[0], dp->table, opt);
    // STARTER: (void)plan, (void)opt, (void)smoothing;
    // END SOLUTION
    dp->steps++;
    dp->step_s += time_now() - t0;
    return r;
}

// ---------------------------------------------------------------- given: the stage of this rank

size_t stage_out_floats(const Stage *st, const Model *table) {
    const Layer *l = &table->layers[st->last - 1];
    return (size_t)l->c * l->h * l->w;
}

DistPipe *pipe_dist_join(ProcessGroup *world, int stages, ScheduleKind schedule) {
    DistPipe *dp = xcalloc(1, sizeof *dp);
    if (!pipe_grid(pg_rank(world), pg_world(world), stages, &dp->grid))
        die("%d ranks cannot be cut into pipes of %d stages (rank %d)\n"
            "  HINT: the number of ranks must be a multiple of --stages (TODO 5a: pipe_grid)",
            pg_world(world), stages, pg_rank(world));
    dp->world = world, dp->schedule = schedule;
    pipe_dist_groups(world, &dp->grid, &dp->same_stage, &dp->pipe);
    CHECK(dp->same_stage && dp->pipe, "TODO 5b: pipe_dist_groups must make both groups (pg_split)");
    CHECK(pg_world(dp->pipe) == stages && pg_rank(dp->pipe) == dp->grid.stage,
          "TODO 5b: the pipe group holds one rank per stage, ranked by stage");
    CHECK(pg_world(dp->same_stage) == dp->grid.replicas,
          "TODO 5b: the same-stage group holds one rank per replica");
    return dp;
}

void pipe_dist_make_stage(DistPipe *dp, const Model *table, Device d, const int *first, int micro_batches,
                          int max_batch) {
    dp->table = table, dp->micro_batches = micro_batches;
    dp->local = pipe_create_stage(table, d, first, dp->grid.stages, dp->grid.stage, micro_batches, max_batch);
}

void pipe_dist_free(DistPipe *dp) {
    if (!dp) return;
    pipe_free(dp->local);
    pg_finalize(dp->pipe);  // the sub-groups, before their parent (collective: every rank frees its DistPipe)
    pg_finalize(dp->same_stage);
    free(dp);
}

void pipe_dist_plan(const DistPipe *dp, int n, PipePlan *plan) {
    plan->micro = dp->micro_batches < n ? dp->micro_batches : n;
    plan->n_ops = pipe_schedule(dp->schedule, dp->grid.stages, plan->micro, dp->grid.stage, plan->ops);
    if (plan->n_ops != 2 * plan->micro)
        die("the %s schedule gave stage %d %d ops for %d micro-batches, not %d\n"
            "  HINT: %s", schedule_name(dp->schedule), dp->grid.stage, plan->n_ops, plan->micro, 2 * plan->micro,
            dp->schedule == SCHEDULE_1F1B ? "TODO 4 (schedule.c) builds the 1F1B order, or run --schedule gpipe"
                                          : "pipe_schedule (schedule.c)");
    // The activations a stage keeps: a forward adds a micro-batch, its backward releases it.
    int held = 0;
    plan->peak_inflight = 0;
    for (int i = 0; i < plan->n_ops; i++) {
        held += plan->ops[i].backward ? -1 : 1;
        if (held > plan->peak_inflight) plan->peak_inflight = held;
    }
}

void pipe_dist_load(DistPipe *dp, const Batch *b) {
    Stage *st = &dp->local->stages[0];
    CHECK(b->n > 0 && b->n <= dp->local->max_batch, "a batch larger than the stage's max_batch (pipe_dist_make_stage)");
    if (dp->grid.stage == 0)
        device_copy_to(st->device, st->input, b->x, (size_t)b->n * st->in_floats * sizeof(float));
    if (dp->grid.stage == dp->grid.stages - 1) {
        device_copy_to(st->device, st->labels, b->y, (size_t)b->n * sizeof(int));
        memcpy(dp->local->host_labels, b->y, (size_t)b->n * sizeof(int));
    }
    pipe_zero_grad(dp->local);
}

void pipe_dist_recv(DistPipe *dp, float *buf, size_t n, int peer, int tag, const char *what) {
    double t0 = time_now();
    pg_recv(dp->pipe, buf, n, peer, tag, what);
    dp->wait_s += time_now() - t0;
}

void pipe_dist_send(DistPipe *dp, const float *buf, size_t n, int peer, int tag, const char *what) {
    CHECK(dp->n_sends < 2 * PIPE_MAX_MICRO, "more sends in one step than 2 per micro-batch");
    snprintf(dp->send_what[dp->n_sends], sizeof dp->send_what[0], "%s", what);
    trace_name_next("send %s", what);  // its span on the timeline (--trace)
    dp->sends[dp->n_sends++] = pg_send_start(dp->pipe, buf, n, peer, tag);
}

void pipe_dist_wait_sends(DistPipe *dp) {
    double t0 = time_now();
    for (int i = 0; i < dp->n_sends; i++) pg_send_wait(dp->pipe, dp->sends[i], dp->send_what[i]);
    dp->n_sends = 0;
    dp->wait_s += time_now() - t0;
}

// Evaluation starts after every message of the training steps has been received, so one fixed tag cannot be
// confused with theirs, and evaluation does not depend on TODO 6a.
enum { EVAL_TAG = 32767 };

Metrics pipe_dist_evaluate(DistPipe *dp, Loader *L) {
    Stage *st = &dp->local->stages[0];
    int s = dp->grid.stage, P = dp->grid.stages;
    size_t fin = st->in_floats, fout = stage_out_floats(st, dp->table);
    Metrics r = {0, 0, 0};
    loader_start_epoch(L, 0, 0);
    const Batch *b;
    while ((b = loader_next(L, NULL)) != NULL) {
        if (s == 0) device_copy_to(st->device, st->input, b->x, (size_t)b->n * fin * sizeof(float));
        else pg_recv(dp->pipe, st->input, (size_t)b->n * fin, s - 1, EVAL_TAG, "test batch activation");
        stage_forward(st, dp->table, 0, b->n, 0, false);
        if (s + 1 < P) {
            pg_send(dp->pipe, stage_out(st), (size_t)b->n * fout, s + 1, EVAL_TAG, "test batch activation");
        } else {
            device_copy_to(st->device, st->labels, b->y, (size_t)b->n * sizeof(int));
            memcpy(dp->local->host_labels, b->y, (size_t)b->n * sizeof(int));
            pipe_loss(dp->local, 0, b->n, 0.0f, 0.0f, &r);
        }
    }
    // Only the last stages counted: the sum over the world is the sum over the replicas.
    double sums[3] = {r.loss_sum, (double)r.correct, (double)r.count};
    pg_allreduce_sum_double_host(dp->world, sums, 3);
    return (Metrics){.loss_sum = sums[0], .correct = (long)sums[1], .count = (long)sums[2]};
}
