// tests/lesson08/test_dist.c: lesson 08 across processes (the learner's pipe_dist.c: TODO 5-7), run on the
// autograder's 4 ranks (GRADE_NP in solutions/08-pipeline/lesson.mk); every rank runs the same test and a test
// passes only when it passes on every rank (tests/grading.h).
//
// The references are independent of the learner's code: each rank computes the single-process step itself (one
// model on the whole batch, kit calls only) and compares its own stage's slice of it. The messages are checked
// by what arrived where: after a step, each stage is sent its neighbour's buffers over the WORLD group (another
// communicator than the pipe's, so these messages can never be taken for the learner's) and compares them
// micro-batch by micro-batch. The deadlock test starts a job of its own (2 ranks, one that never sends) and
// reads what it printed, as lesson 03 reads its program's output.
//
// No test may hang: every decision that changes which collectives run is taken from values every rank has
// (pure checks, or max_over_ranks), and the process group has a timeout.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/testutil.h"
#define GRADING_HELPERS_ONLY  // test_lesson08.c has main() and the verdict channel
#include "tests/grading.h"
#include "tests/mpi_testutil.h"

#include "kit/cli.h"
#include "kit/data.h"
#include "kit/dist.h"
#include "kit/model.h"
#include "kit/optim.h"
#include "kit/train.h"
#include "lesson.h"

void test_dist_grid(void **state);
void test_dist_groups(void **state);
void test_dist_data_by_replica(void **state);
void test_dist_messages(void **state);
void test_dist_stage_per_rank(void **state);
void test_dist_grid_equals_one_process(void **state);
void test_dist_deadlock_named(void **state);
int lesson08_fault_dispatch(int argc, char **argv);

enum { WORLD = 4, DIST_BATCH = 16, DIST_IMAGE = 3 * 32 * 32 };
#define TEST_TIMEOUT_S 20.0  // a lost message ends the test's job within this (a loaded machine is slow)
// One step of the ranks vs the one-process reference, from the same weights: the same float32 operations but
// for the ORDER of some sums (a weight gradient is a sum over the batch's images, added up in one pass by the
// reference and as M partial sums by the stages; the 2 x 2 grid adds the two replicas' halves, then halves the
// sum, which is exact). A gradient element is a sum of at most k = 32 images x 32 x 32 positions = 32768
// products: |error| <= lambda sqrt(k) u sum|terms| = 6 x 181 x 6e-8 = 6.5e-5 sum|terms| with probability
// 1 - 1e-8 per element (Higham & Mary 2019), sum|terms| a few times the largest |g|: 1e-3 of the largest
// gradient element leaves a margin of 5 or more; the same for the move of the weights (p' = p - lr (m v + g + wd p),
// the same operations on the same p and v). The mistakes are off by far more: gradients averaged with another
// stage's, a micro-batch computed on another micro-batch's activation, a missing 1/batch or all-reduce (2x).
#define DIST_TOL 1e-3

static const SgdConfig DIST_OPT = {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-4f, .nesterov = false};

static ProcessGroup *test_world(void) { return test_pg_named("test_lesson08", TEST_TIMEOUT_S); }

// The tests below need the autograder's 4 ranks; started by hand on another number they are skipped.
static ProcessGroup *world_of_four(void) {
    ProcessGroup *pg = test_world();
    if (pg_world(pg) != WORLD) {
        print_message("this test runs on %d ranks (make grade LESSON=08 starts them); here there are %d\n", WORLD,
                      pg_world(pg));
        skip();
    }
    return pg;
}

static Model *tiny_table(int max_batch) {
    ModelConfig cfg;
    assert_true(model_config(&cfg, "tiny", 0, 3, 32, 32, 10));
    return model_create(&cfg, DEVICE_CPU, max_batch, 42);
}

// n synthetic images and labels (host), the same on every rank.
static void make_images(int n, float **x, int **y) {
    Dataset ds;
    dataset_synthetic(&ds, n, 10, 3, 32, 32, 7, SPLIT_TRAIN);
    *x = xmalloc((size_t)n * DIST_IMAGE * sizeof(float));
    *y = xmalloc((size_t)n * sizeof(int));
    int *idx = xmalloc((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) idx[i] = i;
    dataset_fill_batch(&ds, idx, n, NULL, 7, 0, *x, *y);
    free(idx);
    dataset_free(&ds);
}

// ---------------------------------------------------------------- TODO 5: the grid and its groups

// pipe_grid against its definition, or the reason it is wrong ("" when right). Either order is right (README
// section 14: which axis gets consecutive ranks is the learner's decision), as long as every case follows the
// same one: pipe inside (rank = replica * stages + stage) or data inside (rank = stage * replicas + replica).
// The order is read from rank 1 of a 2 x 2 grid: stage 1 is pipe inside, replica 1 data inside.
static void grid_problem(char *why, size_t len) {
    static const int cases[][3] = {  // rank, world, stages (world not a multiple of stages: no grid)
        {0, 4, 2}, {1, 4, 2}, {2, 4, 2}, {3, 4, 2}, {3, 4, 4}, {3, 4, 1}, {13, 16, 4}, {6, 16, 4}, {7, 8, 8},
        {5, 6, 3}, {4, 6, 2}, {0, 6, 4}, {0, 2, 3},
    };
    PipeGrid first = {-1, -1, -1, -1};
    bool data_inside = pipe_grid(1, 4, 2, &first) && first.replica == 1 && first.stage == 0;
    why[0] = '\0';
    for (size_t i = 0; i < sizeof cases / sizeof cases[0] && !why[0]; i++) {
        const int *c = cases[i], rank = c[0], world = c[1], stages = c[2], replicas = world / stages;
        bool exists = world % stages == 0;
        int stage = !exists ? -1 : data_inside ? rank / replicas : rank % stages;
        int replica = !exists ? -1 : data_inside ? rank % replicas : rank / stages;
        PipeGrid g = {-1, -1, -1, -1};
        bool ok = pipe_grid(rank, world, stages, &g);
        if (!exists && ok)
            snprintf(why, len, "pipe_grid(rank %d, world %d, stages %d) returned true: %d ranks are not pipes of %d "
                     "stages", rank, world, stages, world, stages);
        else if (exists && !ok)
            snprintf(why, len, "pipe_grid(rank %d, world %d, stages %d) returned false", rank, world, stages);
        else if (exists && (g.stage != stage || g.replica != replica || g.stages != stages || g.replicas != replicas))
            snprintf(why, len, "pipe_grid(rank %d, world %d, stages %d) = stage %d of %d, replica %d of %d; expected "
                     "stage %d of %d, replica %d of %d (%s, the order your pipe_grid gives rank 1 of a 2 x 2 grid; "
                     "any other numbering leaves two ranks on one place or a place empty)", rank, world, stages,
                     g.stage, g.stages, g.replica, g.replicas, stage, stages, replica, replicas,
                     data_inside ? "data inside: rank = stage x replicas + replica"
                                 : "pipe inside: rank = replica x stages + stage");
    }
}

// Where world rank r sits in the grid of g's shape, by the learner's pipe_grid (checked by grid_problem first).
static PipeGrid grid_of(int r, const PipeGrid *g) {
    PipeGrid h = {-1, -1, -1, -1};
    pipe_grid(r, g->stages * g->replicas, g->stages, &h);
    return h;
}

void test_dist_grid(void **state) {
    (void)state;
    char why[300];
    grid_problem(why, sizeof why);
    if (why[0]) {
        print_error("%s\n", why);
        fail();
    }
}

// group_members, members_text: tests/mpi_testutil.h.

// The groups of a 2 x 2 grid (TODO 5b), or the reason they are wrong; the same verdict on every rank.
static bool groups_ok(ProcessGroup *world, const PipeGrid *g, ProcessGroup **same, ProcessGroup **pipe, char *why,
                      size_t len) {
    why[0] = '\0';
    *same = *pipe = NULL;
    pipe_dist_groups(world, g, same, pipe);
    if (max_over_ranks(world, *same && *pipe ? 0.0 : 1.0) > 0) {
        if (!*same || !*pipe) snprintf(why, len, "pipe_dist_groups left a group NULL (pg_split makes them)");
        return false;
    }
    unsigned want_same = 0, want_pipe = 0;
    for (int r = 0; r < WORLD; r++) {
        PipeGrid h = grid_of(r, g);
        want_same |= (unsigned)(h.stage == g->stage) << r;
        want_pipe |= (unsigned)(h.replica == g->replica) << r;
    }
    unsigned same_bits = group_members(world, *same), pipe_bits = group_members(world, *pipe);
    char a[32], b[32];
    if (same_bits != want_same) {
        members_text(same_bits, a, sizeof a), members_text(want_same, b, sizeof b);
        snprintf(why, len, "rank %d (stage %d): its same-stage group is ranks %s; the ranks holding stage %d are %s",
                 pg_rank(world), g->stage, a, g->stage, b);
    } else if (pipe_bits != want_pipe) {
        members_text(pipe_bits, a, sizeof a), members_text(want_pipe, b, sizeof b);
        snprintf(why, len, "rank %d (replica %d): its pipe group is ranks %s; replica %d's pipe is ranks %s",
                 pg_rank(world), g->replica, a, g->replica, b);
    } else if (pg_rank(*pipe) != g->stage || pg_rank(*same) != g->replica) {
        snprintf(why, len, "rank %d: rank %d in its pipe (expected its stage, %d) and %d among its stage's copies "
                 "(expected its replica, %d): the key of pg_split orders the group", pg_rank(world), pg_rank(*pipe),
                 g->stage, pg_rank(*same), g->replica);
    }
    return max_over_ranks(world, why[0] ? 1.0 : 0.0) == 0;
}

// A DistPipe of this rank's stage, built from the test's own pieces (pipe_dist_join stops the job on a wrong
// grid; the tests check the grid first and fail instead).
static DistPipe *test_dist_pipe(ProcessGroup *world, const PipeGrid *g, ProcessGroup *same, ProcessGroup *pipe,
                                const Model *table, const int *first, int micro, int max_batch, ScheduleKind kind) {
    DistPipe *dp = xcalloc(1, sizeof *dp);
    dp->grid = *g, dp->world = world, dp->same_stage = same, dp->pipe = pipe, dp->table = table;
    dp->micro_batches = micro, dp->schedule = kind;
    dp->local = pipe_create_stage(table, DEVICE_CPU, first, g->stages, g->stage, micro, max_batch);
    return dp;
}

// TODO 7a on a 2 x 2 grid: every rank's gradient set to (world rank + 1) x (i + 1) over a length all stages
// share (so that even an all-reduce over the wrong group completes), then averaged: it must be the mean over
// the two copies of this rank's stage. Returns the reason it is not ("" when it is); the same verdict everywhere.
static bool average_ok(ProcessGroup *world, DistPipe *dp, char *why, size_t len) {
    Stage *st = &dp->local->stages[0];
    size_t own = st->n_params;
    double common = -max_over_ranks(world, -(double)own);  // the smallest stage
    st->n_params = (size_t)common;
    for (size_t i = 0; i < st->n_params; i++) st->grads[i] = (float)((pg_rank(world) + 1) * (double)(i + 1));
    pipe_dist_average_grads(dp);
    st->n_params = own;
    const PipeGrid *g = &dp->grid;
    double want = 0.0, all = 0.0, pipe_mean = 0.0;  // the right mean, the world's, the pipe's (per unit of i + 1)
    for (int r = 0; r < WORLD; r++) {
        all += (r + 1) / (double)WORLD;
        PipeGrid h = grid_of(r, g);
        if (h.stage == g->stage) want += (r + 1) / (double)g->replicas;
        if (h.replica == g->replica) pipe_mean += (r + 1) / (double)g->stages;
    }
    double got = st->grads[0];
    why[0] = '\0';
    for (size_t i = 0; i < (size_t)common && !why[0]; i++)
        if (fabs(st->grads[i] - want * (double)(i + 1)) > 1e-6 * want * (double)(i + 1)) {
            got = st->grads[i] / (double)(i + 1);
            snprintf(why, len, "rank %d (stage %d): gradient[%zu] is %g x (i + 1) after averaging, expected %g x: the "
                     "mean over the copies of stage %d (ranks with the same stage)%s", pg_rank(world), g->stage, i,
                     got, want, g->stage,
                     fabs(got - all) < 1e-6 * all ? ": you averaged over ALL ranks, mixing stage 0's gradient with "
                                                    "stage 1's (other tensors)"
                     : fabs(got - pipe_mean) < 1e-6 * pipe_mean ? ": you averaged over the pipe (the OTHER stages)"
                     : fabs(got - (pg_rank(world) + 1)) < 1e-6 ? ": nothing was averaged"
                     : fabs(got - want * g->replicas) < 1e-6 * want ? ": summed, not averaged" : "");
        }
    return max_over_ranks(world, why[0] ? 1.0 : 0.0) == 0;
}

// TODO 5b and 7a: the groups of a 2 x 2 grid, and the gradient averaged among the copies of a stage only.
void test_dist_groups(void **state) {
    (void)state;
    ProcessGroup *world = world_of_four();
    char why[400];
    grid_problem(why, sizeof why);
    grading_require_todo(!why[0], "5a", "%s", why);
    PipeGrid g;
    pipe_grid(pg_rank(world), WORLD, 2, &g);
    ProcessGroup *same, *pipe;
    if (!groups_ok(world, &g, &same, &pipe, why, sizeof why)) {
        if (why[0]) print_error("%s\n", why);
        fail();
    }
    Model *table = tiny_table(1);
    int first[3] = {0, 3, table->n_layers};
    DistPipe *dp = test_dist_pipe(world, &g, same, pipe, table, first, 4, DIST_BATCH, SCHEDULE_GPIPE);
    bool ok = average_ok(world, dp, why, sizeof why);
    if (!ok && why[0]) print_error("%s\n", why);
    pipe_dist_free(dp);
    model_free(table);
    if (!ok) fail();
}

// TODO 5c: on a 2 x 2 grid with a global batch of 32, each rank reads its REPLICA's shard (the sampler's rank and
// world are the replica's) in local batches of 16, so that both ranks of a pipe read the same images.
void test_dist_data_by_replica(void **state) {
    (void)state;
    ProcessGroup *world = world_of_four();
    char why[400];
    grid_problem(why, sizeof why);
    grading_require_todo(!why[0], "5a", "%s", why);
    PipeGrid g;
    pipe_grid(pg_rank(world), WORLD, 2, &g);
    static char name[] = "train";
    char *argv[] = {name, NULL};
    TrainOptions o;
    cli_parse(&o, 1, argv, CLI_DIST);
    o.dataset = "synthetic", o.batch_size = 2 * DIST_BATCH, o.seed = 7;
    cli_apply_dataset_defaults(&o);
    TrainData td;
    pipe_dist_data_open(&td, &o, &g);
    const Sampler *s = &td.train_sampler;
    const Batch *b = NULL;
    loader_start_epoch(td.train_loader, 0, 0);
    b = loader_next(td.train_loader, NULL);
    why[0] = '\0';
    if (s->world != g.replicas || s->rank != g.replica)
        snprintf(why, sizeof why, "rank %d (stage %d of replica %d) reads shard %d of %d; the data is split between "
                 "the %d REPLICAS: shard %d of %d, the same for both ranks of its pipe (stage 0 feeds the images in, "
                 "the last stage needs their labels)", pg_rank(world), g.stage, g.replica, s->rank, s->world,
                 g.replicas, g.replica, g.replicas);
    else if (!b || b->n != DIST_BATCH)
        snprintf(why, sizeof why, "rank %d: a local batch of %d images; the global --batch-size %d is split between "
                 "the %d replicas: %d each", pg_rank(world), b ? b->n : 0, o.batch_size, g.replicas, DIST_BATCH);
    if (why[0]) print_error("%s\n", why);
    train_data_close(&td);
    if (max_over_ranks(world, why[0] ? 1.0 : 0.0) > 0) fail();
}

// ---------------------------------------------------------------- TODO 6: the messages of the ops

// Tags: one per (direction, micro-batch), in [0, 32767]; the reason they are not ("" when they are).
static void tags_problem(char *why, size_t len) {
    why[0] = '\0';
    static int seen[32768];
    memset(seen, 0, sizeof seen);
    for (int k = 0; k < PIPE_MAX_MICRO && !why[0]; k++)
        for (int d = 0; d < 2 && !why[0]; d++) {
            int t = pipe_tag(d == 1, k);
            if (t < 0 || t > 32767)
                snprintf(why, len, "pipe_tag(%s, micro-batch %d) = %d: tags must be in [0, 32767]",
                         d ? "backward" : "forward", k, t);
            else if (seen[t])
                snprintf(why, len, "pipe_tag(%s, micro-batch %d) = %d, the tag of %s micro-batch %d too: two messages "
                         "in flight at once between two stages must differ in tag", d ? "backward" : "forward", k, t,
                         (seen[t] - 1) % 2 ? "backward" : "forward", (seen[t] - 1) / 2);
            else seen[t] = 1 + 2 * k + d;
        }
}

// The grid (5a) and the groups (5b) of a world of WORLD ranks in `stages` stages: fails the test with "fix TODO
// 5x first" when they are wrong (every rank the same), else makes them.
static void require_grid(ProcessGroup *world, int stages, PipeGrid *g, ProcessGroup **same, ProcessGroup **pipe) {
    char why[400];
    grid_problem(why, sizeof why);
    grading_require_todo(!why[0], "5a", "%s", why);
    pipe_grid(pg_rank(world), WORLD, stages, g);
    bool ok = groups_ok(world, g, same, pipe, why, sizeof why);
    grading_require_todo(ok, "5b", "%s", why[0] ? why : "the groups are wrong on another rank");
}

// Which micro-batch's samples of `ref` slot k of `got` holds (n floats per sample), -1: none; -2: never written.
static int slot_source(const float *got, const float *ref, int batch, int M, int k, size_t f) {
    int off, n;
    pipe_micro_range(batch, M, k, &off, &n);
    bool untouched = true;
    for (size_t i = 0; i < (size_t)n * f; i++) untouched &= isnan(got[(size_t)off * f + i]);
    if (untouched) return -2;
    for (int j = 0; j < M; j++) {
        int joff, jn;
        pipe_micro_range(batch, M, j, &joff, &jn);
        if (jn == n && memcmp(got + (size_t)off * f, ref + (size_t)joff * f, (size_t)n * f * sizeof(float)) == 0)
            return j;
    }
    return -1;
}

// Compares, micro-batch by micro-batch, what this stage received (got) with what its neighbour sent (ref).
static void check_slots(const char *what, int from, int to, const float *got, const float *ref, int batch, int M,
                        size_t f, char *why, size_t len) {
    int src[PIPE_MAX_MICRO];
    for (int k = 0; k < M; k++) src[k] = slot_source(got, ref, batch, M, k, f);
    for (int k = 0; k < M && !why[0]; k++) {
        if (src[k] == k) continue;
        int off, n;
        pipe_micro_range(batch, M, k, &off, &n);
        int twice = -1;
        for (int j = 0; j < M; j++)
            if (j != k && src[j] >= 0 && src[j] == src[k]) twice = j;
        if (src[k] == -2)
            snprintf(why, len, "the %s of micro-batch %d (samples [%d, %d)), stage %d -> %d, never arrived: stage %d's "
                     "slot for it is untouched (missing receive, or the wrong place)", what, k, off, off + n, from, to,
                     to);
        else if (src[k] >= 0 && twice >= 0)
            snprintf(why, len, "stage %d holds the %s of micro-batch %d in the slots of micro-batches %d AND %d "
                     "(duplicated): micro-batch %d's own never landed where it belongs", to, what, src[k], k, twice, k);
        else if (src[k] >= 0)
            snprintf(why, len, "stage %d's slot for micro-batch %d holds the %s of micro-batch %d (swapped): stage %d "
                     "sent them in another order here, and only the tag can tell which message is which", to, k, what,
                     src[k], from);
        else
            snprintf(why, len, "stage %d's slot for micro-batch %d (samples [%d, %d)) holds numbers stage %d never "
                     "sent as a %s (the offset of the micro-batch, or the size?)", to, k, off, off + n, from, what);
    }
}

// TODO 6: a pipe of 4 stages (one replica), 4 micro-batches, GPipe but for two swaps that a schedule may make:
// stage 0 sends micro-batch 2's activation before 1's, the last stage sends 2's gradient before 1's. After
// the step, each slot of each stage must hold exactly the message of ITS micro-batch.
void test_dist_messages(void **state) {
    (void)state;
    enum { P = 4, M = 4 };
    ProcessGroup *world = world_of_four();
    PipeGrid g;
    ProcessGroup *same, *pipe;
    require_grid(world, P, &g, &same, &pipe);
    char why[400];
    tags_problem(why, sizeof why);
    if (why[0]) {
        print_error("%s\n", why);
        fail();
    }
    Model *table = tiny_table(1);
    int first[P + 1] = {0, 3, 4, 6, table->n_layers};  // stage 2 (relu, pool) has no parameter
    DistPipe *dp = test_dist_pipe(world, &g, same, pipe, table, first, M, DIST_BATCH, SCHEDULE_GPIPE);
    Stage *st = &dp->local->stages[0];
    size_t fin = st->in_floats, fout = stage_out_floats(st, table);
    float *x;
    int *y;
    make_images(DIST_BATCH, &x, &y);
    Batch b = {.n = DIST_BATCH, .x = x, .y = y};
    PipePlan plan;
    pipe_dist_plan(dp, DIST_BATCH, &plan);
    PipeOp *ops = plan.ops;
    if (g.stage == 0) { PipeOp t = ops[1]; ops[1] = ops[2]; ops[2] = t; }               // F0 F2 F1 F3 B0..B3
    if (g.stage == P - 1) { PipeOp t = ops[M + 1]; ops[M + 1] = ops[M + 2]; ops[M + 2] = t; }  // .. B0 B2 B1 B3
    // Untouched slots stay NaN: a message that never came shows.
    if (g.stage > 0) for (size_t i = 0; i < DIST_BATCH * fin; i++) st->input[i] = NAN;
    if (g.stage < P - 1) for (size_t i = 0; i < DIST_BATCH * fout; i++) stage_dout(st)[i] = NAN;
    pipe_dist_step(dp, &b, &plan, &DIST_OPT, 0.0f);

    // Each stage hands its neighbours what it sent (its output forward, its input gradient backward), over the
    // world group: the test's messages never meet the learner's.
    float *prev_out = g.stage > 0 ? xmalloc(DIST_BATCH * fin * sizeof(float)) : NULL;
    float *next_din = g.stage < P - 1 ? xmalloc(DIST_BATCH * fout * sizeof(float)) : NULL;
    int me = pg_rank(world);
    if (g.stage + 1 < P) pg_send(world, stage_out(st), DIST_BATCH * fout, me + 1, 1, "test: stage output");
    if (g.stage > 0) pg_recv(world, prev_out, DIST_BATCH * fin, me - 1, 1, "test: previous stage's output");
    if (g.stage > 0) pg_send(world, st->dinput, DIST_BATCH * fin, me - 1, 2, "test: input gradient");
    if (g.stage + 1 < P) pg_recv(world, next_din, DIST_BATCH * fout, me + 1, 2, "test: next stage's input gradient");
    why[0] = '\0';
    if (g.stage > 0) check_slots("activation", g.stage - 1, g.stage, st->input, prev_out, DIST_BATCH, M, fin, why,
                                 sizeof why);
    if (g.stage + 1 < P && !why[0])
        check_slots("gradient", g.stage + 1, g.stage, stage_dout(st), next_din, DIST_BATCH, M, fout, why, sizeof why);
    if (why[0]) print_error("rank %d: %s\n", me, why);
    bool ok = max_over_ranks(world, why[0] ? 1.0 : 0.0) == 0;
    free(prev_out), free(next_din), free(x), free(y);
    pipe_dist_free(dp);
    model_free(table);
    if (!ok) fail();
}

// ---------------------------------------------------------------- TODO 7: the step

// The 1F1B order of stage s, built here (independent of schedule.c, whose 1F1B is a stretch goal): min(P-1-s, M)
// forwards, then one forward and one backward in turn, then the backwards left. Neighbours then send to each
// other at the same time, which only a runner that starts its sends and waits later survives.
static void interleaved_ops(int P, int M, int s, PipeOp *ops) {
    int warm = P - 1 - s < M ? P - 1 - s : M, n = 0, b = 0;
    for (int k = 0; k < warm; k++) ops[n++] = (PipeOp){.backward = false, .micro = k};
    for (int k = warm; k < M; k++) {
        ops[n++] = (PipeOp){.backward = false, .micro = k};
        ops[n++] = (PipeOp){.backward = true, .micro = b++};
    }
    while (b < M) ops[n++] = (PipeOp){.backward = true, .micro = b++};
}

// One step of this rank's stage vs one model on the whole batch (each rank computes it), from identical
// weights: P stages x (WORLD / P) replicas, each replica on its own consecutive `local` images of the batch, in
// GPipe's order or (interleaved) 1F1B's. Fails the test (on every rank) when a rank is off; prints its numbers.
static void dist_vs_one_process(ProcessGroup *world, int P, int M, bool interleaved, const char *label) {
    PipeGrid g;
    ProcessGroup *same, *pipe;
    require_grid(world, P, &g, &same, &pipe);
    int R = WORLD / P, local = DIST_BATCH, global = local * R;
    Model *table = tiny_table(1), *one = tiny_table(global);
    int two[3] = {0, 3, table->n_layers}, four[5] = {0, 3, 4, 6, table->n_layers};
    DistPipe *dp = test_dist_pipe(world, &g, same, pipe, table, P == 2 ? two : four, M, local, SCHEDULE_GPIPE);
    Stage *st = &dp->local->stages[0];
    float *x;
    int *y;
    make_images(global, &x, &y);
    Batch mine = {.n = local, .x = x + (size_t)g.replica * local * DIST_IMAGE, .y = y + g.replica * local};
    Batch all = {.n = global, .x = x, .y = y};
    float *before = xmalloc(st->n_params * sizeof(float) + 1);
    memcpy(before, st->params, st->n_params * sizeof(float));
    PipePlan plan;
    pipe_dist_plan(dp, local, &plan);
    if (interleaved) interleaved_ops(P, M, g.stage, plan.ops);
    Metrics got = pipe_dist_step(dp, &mine, &plan, &DIST_OPT, 0.0f);
    Metrics ref = train_forward_backward(one, &all, 0.0f, 1.0f / (float)global);
    optim_step(one, &DIST_OPT);

    char why[400] = "";
    bool last = g.stage == P - 1;
    Compare c = compare_arrays(st->grads, one->grads + st->param_offset, st->n_params);
    double e2 = 0.0, m2 = 0.0;
    for (size_t i = 0; i < st->n_params; i++) {
        double d = (double)st->params[i] - one->params[st->param_offset + i];
        double mv = (double)one->params[st->param_offset + i] - before[i];
        e2 += d * d, m2 += mv * mv;
    }
    double move = isnan(e2) ? INFINITY : m2 > 0 ? sqrt(e2 / m2) : sqrt(e2);
    // The last stages' losses, summed over the replicas, against one process's over the whole batch.
    double sums[2] = {last ? got.loss_sum : 0.0, last ? (double)got.count : 0.0};
    pg_allreduce_sum_double_host(world, sums, 2);
    if (!last && got.count != 0)
        snprintf(why, sizeof why, "stage %d (not the last) returned count %ld: only the last stage has the loss and "
                 "the metrics", g.stage, got.count);
    else if (last && got.count != local)
        snprintf(why, sizeof why, "the last stage returned count %ld for its replica's %d images%s", got.count, local,
                 got.count == 0 ? ": the loss was never computed (pipe_loss, on the last stage)" : "");
    else if (!(fabs(sums[0] - ref.loss_sum) <= 1e-5 * fabs(ref.loss_sum)))
        snprintf(why, sizeof why, "the loss summed over the replicas is %.6g, one process on the batch: %.6g: the "
                 "forward through the stages is wrong", sums[0], ref.loss_sum);
    else if (st->n_params > 0 && !(c.error <= DIST_TOL))
        snprintf(why, sizeof why, "stage %d's gradient is %.3g x one process's (max diff %.2g of its largest, "
                 "tolerance %.0e)%s", g.stage, c.ratio, c.error, DIST_TOL,
                 fabs(c.ratio) < 0.05 ? ": none (backward not run, or the gradient not received from the next stage)"
                 : M > 1 && fabs(c.ratio - M) < 0.1 * M ? ": the loss scaled by 1/(micro-batch) instead of 1/(the "
                                                          "replica's batch)"
                 : R > 1 && fabs(c.ratio - R) < 0.1 * R ? ": summed over the replicas, not averaged"
                 : "");
    else if (st->n_params > 0 && !(move <= DIST_TOL))
        snprintf(why, sizeof why, "stage %d's gradient is right but its weights moved %.3g off one process's (one SGD "
                 "step of this stage after every op and the average)", g.stage, move);
    else if (dp->n_sends != 0)  // a send not waited for may still read a buffer the next step overwrites
        snprintf(why, sizeof why, "stage %d ended the step with %d send(s) never waited for: wait for every send of "
                 "the step (pipe_dist_wait_sends) before the buffers change again", g.stage, dp->n_sends);
    if (why[0]) print_error("rank %d, %s: %s\n", pg_rank(world), label, why);
    else if (pg_rank(world) == 0)
        print_message("%s: stage %d gradient max diff %.2g, move error %.2g (tolerance %.0e)\n", label, g.stage,
                      c.error, move, DIST_TOL);
    bool ok = max_over_ranks(world, why[0] ? 1.0 : 0.0) == 0;
    free(before), free(x), free(y);
    pipe_dist_free(dp);
    model_free(one), model_free(table);
    if (!ok) fail();
}

// The grid and the messages first: with either wrong, the step is wrong for a reason another test names.
static void require_messages(void) {
    char why[400];
    grid_problem(why, sizeof why);
    grading_require_todo(!why[0], "5a", "%s", why);
    tags_problem(why, sizeof why);
    grading_require_todo(!why[0], "6a", "%s", why);
}

// TODO 6-7: 4 ranks, one stage each, equal one process on the batch: GPipe with 4 micro-batches and with 3
// (sizes 6, 5, 5), and the 1F1B order.
void test_dist_stage_per_rank(void **state) {
    (void)state;
    ProcessGroup *world = world_of_four();
    require_messages();
    dist_vs_one_process(world, 4, 4, false, "4 stages, GPipe, 4 micro-batches");
    dist_vs_one_process(world, 4, 3, false, "4 stages, GPipe, 3 micro-batches");
    dist_vs_one_process(world, 4, 4, true, "4 stages, 1F1B order, 4 micro-batches");
}

// TODO 7: 2 stages x 2 replicas, each replica on its half of a batch of 32, equal one process on all 32.
void test_dist_grid_equals_one_process(void **state) {
    (void)state;
    ProcessGroup *world = world_of_four();
    require_messages();
    {  // the average among the copies of a stage (7a) first: over the wrong group the step would mix tensors
        PipeGrid g;
        ProcessGroup *same, *pipe;
        require_grid(world, 2, &g, &same, &pipe);
        Model *table = tiny_table(1);
        int first[3] = {0, 3, table->n_layers};
        DistPipe *dp = test_dist_pipe(world, &g, same, pipe, table, first, 4, DIST_BATCH, SCHEDULE_GPIPE);
        char why[400];
        bool ok = average_ok(world, dp, why, sizeof why);
        pipe_dist_free(dp);
        model_free(table);
        grading_require_todo(ok, "5b", "%s", why[0] ? why : "the average is wrong on another rank");
    }
    dist_vs_one_process(world, 2, 4, false, "2 stages x 2 replicas, GPipe, 4 micro-batches");
    dist_vs_one_process(world, 2, 4, true, "2 stages x 2 replicas, 1F1B order, 4 micro-batches");
}

// ---------------------------------------------------------------- a rank that never sends

enum { FAULT_RANKS = 2, FAULT_TIMEOUT_S = 3, FAULT_LIMIT_S = 40 };

// `test_lesson08 --fault never-sends` (started on 2 ranks by the test below): a pipe of 2 stages where stage 1
// runs its forwards and then never sends its gradients back (it sleeps). Stage 0 waits for the gradient of
// micro-batch 0 and must end the job within the process group's timeout, naming what it waited for.
int lesson08_fault_dispatch(int argc, char **argv) {
    if (argc < 3 || strcmp(argv[1], "--fault") != 0) return -1;
    ProcessGroup *world = test_pg_named("lesson08-fault", FAULT_TIMEOUT_S);
    PipeGrid g;
    ProcessGroup *same, *pipe;
    CHECK(pg_world(world) == FAULT_RANKS && pipe_grid(pg_rank(world), FAULT_RANKS, FAULT_RANKS, &g),
          "the fault job runs on 2 ranks, with a working pipe_grid");
    pipe_dist_groups(world, &g, &same, &pipe);
    CHECK(same && pipe, "TODO 5b: pipe_dist_groups");
    Model *table = tiny_table(1);
    int first[3] = {0, 3, table->n_layers};
    DistPipe *dp = test_dist_pipe(world, &g, same, pipe, table, first, 4, DIST_BATCH, SCHEDULE_GPIPE);
    float *x;
    int *y;
    make_images(DIST_BATCH, &x, &y);
    Batch b = {.n = DIST_BATCH, .x = x, .y = y};
    PipePlan plan;
    pipe_dist_plan(dp, DIST_BATCH, &plan);
    if (g.stage == 1) {
        plan.n_ops = plan.micro;  // the forwards only: its gradients never leave
        pipe_dist_step(dp, &b, &plan, &DIST_OPT, 0.0f);
        printf("stage 1 (rank %d): forwards done, never sending a gradient\n", pg_rank(world));
        fflush(stdout);
        sleep(FAULT_LIMIT_S);  // until stage 0 ends the job
    } else {
        pipe_dist_step(dp, &b, &plan, &DIST_OPT, 0.0f);
        printf("UNEXPECTED: stage 0 finished its step without stage 1's gradients\n");
        fflush(stdout);
    }
    free(x), free(y);
    pipe_dist_free(dp);
    model_free(table);
    return 0;  // the test's exit handler finalizes MPI
}

// The grading job's launcher variables removed, so that the new mpirun does not take itself for one of its ranks.
static void forget_launcher(void) {
    extern char **environ;
    for (int again = 1; again;) {
        again = 0;
        for (char **e = environ; *e; e++) {
            if (strncmp(*e, "OMPI_", 5) == 0 || strncmp(*e, "PMIX_", 5) == 0 || strncmp(*e, "CMOCKA_", 7) == 0 ||
                strncmp(*e, "GRADING_CHANNEL=", 16) == 0) {
                char name[256];
                size_t len = strcspn(*e, "=");
                snprintf(name, sizeof name, "%.*s", (int)(len < sizeof name ? len : sizeof name - 1), *e);
                unsetenv(name);
                again = 1;
                break;
            }
        }
    }
}

// Runs `test_lesson08 --fault never-sends` on 2 ranks, output in log. Its exit status (-1: killed at the limit)
// and its seconds.
static int run_fault_job(const char *log, double *seconds) {
    const char *root = getenv("GRADING_ROOT");
    char launch[4096], self[4096];
    snprintf(launch, sizeof launch, "%s/scripts/launch.sh", root && *root ? root : ".");
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) return -1;
    self[len] = '\0';
    double start = time_now();
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        setpgid(0, 0);  // its own process group, so that a hung job can be stopped whole
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0) _exit(126);
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        forget_launcher();
        unsetenv("KIT_PG_TIMEOUT");  // the job's own timeout (FAULT_TIMEOUT_S) is the one under test
        char np[16];
        snprintf(np, sizeof np, "%d", FAULT_RANKS);
        char *args[] = {launch, np, self, "--fault", "never-sends", NULL};
        execv(launch, args);
        _exit(127);
    }
    int status = 0;
    for (;;) {
        pid_t done = waitpid(pid, &status, WNOHANG);
        if (done == pid) break;
        if (done < 0 || time_now() - start > FAULT_LIMIT_S) {
            kill(-pid, SIGKILL);
            waitpid(pid, &status, 0);
            *seconds = time_now() - start;
            return -1;
        }
        nanosleep(&(struct timespec){.tv_nsec = 50 * 1000 * 1000}, NULL);
    }
    *seconds = time_now() - start;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The first line of the log containing every one of the needles, into out ("" when none).
static void find_line_with(const char *log, const char *const *needles, int n, char *out, size_t len) {
    out[0] = '\0';
    FILE *f = fopen(log, "r");
    if (!f) return;
    char line[1024];
    while (!out[0] && fgets(line, sizeof line, f)) {
        int hits = 0;
        for (int i = 0; i < n; i++) hits += strstr(line, needles[i]) != NULL;
        if (hits == n) snprintf(out, len, "%.*s", (int)strcspn(line, "\r\n"), line);
    }
    fclose(f);
}

// TODO 6b: a rank that never sends (stage 1 keeps its gradients) must not hang the job: stage 0's receive ends
// it within the timeout, and the error names what never came: the gradient of micro-batch 0, stage 1 -> 0.
void test_dist_deadlock_named(void **state) {
    (void)state;
    if (grading_launcher_rank() != 0) return;  // one job is enough: the test's rank 0 starts it
    char why[400];
    grid_problem(why, sizeof why);
    grading_require_todo(!why[0], "5a", "%s", why);
    char log[] = "fault-XXXXXX";
    int fd = mkstemp(log);
    assert_true(fd >= 0);
    close(fd);
    double seconds = 0.0;
    int rc = run_fault_job(log, &seconds);
    static const char *const named[] = {"micro-batch 0", "stage 1", "rank 0"};
    static const char *const unexpected[] = {"UNEXPECTED"};
    char line[1024], went_on[256];
    find_line_with(log, named, 3, line, sizeof line);
    find_line_with(log, unexpected, 1, went_on, sizeof went_on);
    char tail[1024] = "";
    if (!line[0]) {  // what it said instead: its last error line
        static const char *const err[] = {"rank"};
        find_line_with(log, err, 1, tail, sizeof tail);
    }
    unlink(log);
    if (rc < 0) {
        print_error("a pipe of 2 ranks where stage 1 never sends its gradients did not end within %d s (its timeout: "
                    "%d s): every wait must be a pg_recv / pg_send_wait of the kit, which give up\n", FAULT_LIMIT_S,
                    FAULT_TIMEOUT_S);
        fail();
    }
    if (went_on[0] || rc == 0) {
        print_error("stage 0 finished its step although stage 1 never sent a gradient (exit %d): the backward of a "
                    "stage that is not the last must first RECEIVE its output gradient\n", rc);
        fail();
    }
    if (!line[0]) {
        print_error("the job ended (exit %d after %.1f s) but no line names rank 0 waiting for the gradient of "
                    "micro-batch 0 from stage 1; it said: %s\n", rc, seconds, tail[0] ? tail : "(nothing)");
        fail();
    }
    print_message("ended after %.1f s (timeout %d s): %s\n", seconds, FAULT_TIMEOUT_S, line);
}
