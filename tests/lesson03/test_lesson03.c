// tests/lesson03/test_lesson03.c: the autograder for lesson 03 (the learner's train.c: DDP over MPI).
//
// Built with Open MPI and run on GRADE_NP ranks (solutions/03-ddp/lesson.mk) by tests/grade.py through
// scripts/launch.sh; every rank runs the same test and writes its own verdict (tests/grading.h), and a test
// passes only when it passes on every rank. The references are independent of the learner's code: each rank
// computes the single-process run on the GLOBAL batch itself (the data is deterministic), and the expected
// shard of every rank from its own Sampler.
//
// No test may hang: a test takes its decisions from values every rank has (pg_identical, or a maximum over
// the ranks) before asserting, so the ranks always call the same collectives; and the process group has a
// short timeout, so a learner's mismatched collective stops the job within seconds instead of hanging.
// Hints for failures are in hints.tsv.
#include <mpi.h>

#include "tests/testutil.h"
#include "tests/grading.h"
#include "tests/mpi_testutil.h"

#include "kit/cli.h"
#include "kit/data.h"
#include "kit/dist.h"
#include "lesson.h"
#include "kit/model.h"
#include "kit/optim.h"
#include "kit/train.h"

enum { LOCAL_BATCH = 16 };           // images per rank per step in these tests
#define TEST_SEED 7
#define TEST_TIMEOUT_S 20.0

// ---------------------------------------------------------------- the test process group

static ProcessGroup *test_pg(void) { return test_pg_named("test_lesson03", TEST_TIMEOUT_S); }

// The options of `train --dataset synthetic --model MODEL --batch-size GLOBAL`.
static TrainOptions test_options(const char *model, int global_batch) {
    static char name[] = "train";
    char *argv[] = {name, NULL};
    TrainOptions o;
    cli_parse(&o, 1, argv, CLI_DIST);
    o.dataset = "synthetic";
    o.model = model;
    o.batch_size = global_batch;
    o.seed = TEST_SEED;
    cli_apply_dataset_defaults(&o);
    return o;
}

static Model *test_model(const char *name, const Dataset *ds, int max_batch, uint64_t seed) {
    ModelConfig cfg;
    assert_true(model_config(&cfg, name, 0, ds->c, ds->h, ds->w, ds->classes));
    return model_create(&cfg, DEVICE_CPU, max_batch, seed);
}

// train_data_open's shards and loaders (kit/train.c) over a smaller synthetic set, for the tests that are not
// about the learner's ddp_data_open: generating the 5000-image set on every rank would cost more than the test.
static void small_data_open(TrainData *td, int rank, int world, int local_batch) {
    memset(td, 0, sizeof *td);
    dataset_synthetic(&td->train, 1200, 10, 3, 32, 32, 1234, SPLIT_TRAIN);
    dataset_synthetic(&td->test, 300, 10, 3, 32, 32, 1234, SPLIT_TEST);
    sampler_init(&td->train_sampler, td->train.n, rank, world, TEST_SEED, SAMPLER_TRAIN_DROP);
    sampler_init(&td->test_sampler, td->test.n, rank, world, TEST_SEED, SAMPLER_EVAL);
    td->train_loader = loader_create(&td->train, &td->train_sampler, local_batch, true, NULL, TEST_SEED);
    td->test_loader = loader_create(&td->test, &td->test_sampler, local_batch, false, NULL, TEST_SEED);
}

// The shape of the synthetic images, for building models.
static const Dataset synthetic_shape = {.c = 3, .h = 32, .w = 32, .classes = 10};

// ---------------------------------------------------------------- TODO 1: rank -> GPU

static void test_gpu_for_rank(void **state) {
    // {rank, local rank, GPUs on the node, expected GPU}
    static const int cases[][4] = {
        {0, 0, 8, 0},  {3, 3, 8, 3},   // one node of 8 GPUs
        {9, 1, 8, 1},                  // the second node of 8-GPU machines: global rank 9 is GPU 1 there
        {4, 1, 4, 1},  {3, 0, 4, 0},   // 2 nodes x 3 ranks on 4-GPU machines: rank 3 is the first of node 2
        {5, 3, 2, 1},                  // 4 ranks sharing 2 GPUs (--backend mpi)
        {2, 2, 0, -1},                 // no GPU: CPU
    };
    int wrong = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int got = ddp_gpu_for_rank(cases[i][0], cases[i][1], cases[i][2]);
        if (got != cases[i][3]) {
            print_error("ddp_gpu_for_rank(rank %d, local rank %d, %d GPUs) = %d, expected %d\n", cases[i][0],
                        cases[i][1], cases[i][2], got, cases[i][3]);
            wrong++;
        }
    }
    if (wrong) fail();
}

// ---------------------------------------------------------------- TODO 2: the process group

// The world size the launcher announced (1 when started without one).
static int launcher_world(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "SLURM_NTASKS", "PMI_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return atoi(v);
    }
    return 1;
}

static void test_setup_process_group(void **state) {
    TrainOptions o = test_options("tiny", LOCAL_BATCH);
    o.backend = "mpi";
    o.timeout_s = 7.5;  // not the default: the learner must pass --timeout on
    static char name[] = "train";
    static char *args[] = {name, NULL};
    int argc = 1;
    char **argv = args;
    register_exit();
    ProcessGroup *pg = ddp_setup(&argc, &argv, &o, DEVICE_CPU);
    if (!pg) {
        print_error("ddp_setup returned NULL instead of a process group\n");
        fail();
    }
    if (!g_pg) g_pg = pg;  // finalized at exit like the tests' own
    if (pg_world(pg) != launcher_world() || pg_rank(pg) != grading_launcher_rank()) {
        print_error("the process group says rank %d of %d; the launcher started rank %d of %d\n", pg_rank(pg),
                    pg_world(pg), grading_launcher_rank(), launcher_world());
        fail();
    }
    if (pg_backend(pg) != PG_BACKEND_MPI) {
        print_error("--backend mpi was asked for, the process group runs %s\n", pg_backend_name(pg_backend(pg)));
        fail();
    }
    const char *env = getenv("KIT_PG_TIMEOUT");  // overrides what the program asks for (kit/dist.h)
    double expected = env && *env ? atof(env) : o.timeout_s;
    if (pg_timeout(pg) != expected) {
        print_error("the process group's timeout is %g s, but --timeout asked for %g s\n", pg_timeout(pg), expected);
        fail();
    }
}

// ---------------------------------------------------------------- TODO 3: sharded, reshuffled data

// The images and labels rank `rank` of `world` should get as batch k of `epoch`, from the kit's Sampler
// (the DistributedSampler semantics the kit's own tests check): x (batch, C, H, W), y (batch).
static void expected_batch(const Dataset *ds, int rank, int world, int epoch, int k, int batch, float *x, int *y) {
    Sampler s;
    sampler_init(&s, ds->n, rank, world, TEST_SEED, SAMPLER_TRAIN_DROP);
    sampler_set_epoch(&s, epoch);
    int *idx = xmalloc((size_t)sampler_len(&s) * sizeof(int));
    assert_true(sampler_len(&s) >= (k + 1) * batch);
    sampler_indices(&s, idx);
    dataset_fill_batch(ds, idx + (size_t)k * batch, batch, NULL, TEST_SEED, epoch, x, y);
    free(idx);
}

static bool batch_equals(const Batch *b, const float *x, const int *y, int n, size_t image_floats) {
    return b && b->n == n && memcmp(b->x, x, (size_t)n * image_floats * sizeof(float)) == 0 &&
           memcmp(b->y, y, (size_t)n * sizeof(int)) == 0;
}

static void test_sampler_shards_the_batch(void **state) {
    ProcessGroup *pg = test_pg();
    int world = pg_world(pg), rank = pg_rank(pg);
    TrainOptions o = test_options("tiny", LOCAL_BATCH * world);
    TrainData td;
    int local = ddp_data_open(&td, &o, pg);
    if (local != LOCAL_BATCH) {
        print_error("ddp_data_open returned a local batch of %d for --batch-size %d on %d ranks: expected %d\n",
                    local, o.batch_size, world, LOCAL_BATCH);
        fail();
    }
    int want_steps = (td.train.n / world) / LOCAL_BATCH;
    if (loader_batches_per_epoch(td.train_loader) != want_steps) {
        print_error("%d steps per epoch on rank %d; each rank should take %d images (1/%d of %d) in batches of %d: "
                    "%d steps\n", loader_batches_per_epoch(td.train_loader), rank, td.train.n / world, world,
                    td.train.n, LOCAL_BATCH, want_steps);
        fail();
    }
    size_t image_floats = (size_t)td.train.c * td.train.h * td.train.w;
    float *x = xmalloc(LOCAL_BATCH * image_floats * sizeof(float));
    int y[LOCAL_BATCH];
    loader_start_epoch(td.train_loader, 0, 0);  // the kit's call, so that this test is about TODO 3a alone
    bool ok = true;  // fail only after train_data_close: the loader's thread must not outlive td
    for (int k = 0; k < 3 && ok; k++) {
        const Batch *b = loader_next(td.train_loader, NULL);
        expected_batch(&td.train, rank, world, 0, k, LOCAL_BATCH, x, y);
        if (!batch_equals(b, x, y, LOCAL_BATCH, image_floats)) {
            print_error("rank %d of %d: batch %d is not this rank's shard of global batch %d (positions r, r + world, "
                        "... of the epoch's shuffle)\n", rank, world, k, k);
            ok = false;
        }
    }
    free(x);
    train_data_close(&td);
    if (!ok) fail();
}

static void test_sampler_reshuffles_each_epoch(void **state) {
    ProcessGroup *pg = test_pg();
    int world = pg_world(pg), rank = pg_rank(pg);
    TrainData td;
    small_data_open(&td, rank, world, LOCAL_BATCH);  // the kit's sharding, so that this is about TODO 3b alone
    size_t image_floats = (size_t)td.train.c * td.train.h * td.train.w;
    float *x = xmalloc(LOCAL_BATCH * image_floats * sizeof(float)), *x0 = xmalloc(LOCAL_BATCH * image_floats * sizeof(float));
    int y[LOCAL_BATCH], y0[LOCAL_BATCH];
    expected_batch(&td.train, rank, world, 0, 0, LOCAL_BATCH, x0, y0);
    bool ok = true;  // fail only after train_data_close: the loader's thread must not outlive td
    for (int epoch = 1; epoch <= 2 && ok; epoch++) {
        ddp_start_epoch(&td, epoch, 0);
        const Batch *b = loader_next(td.train_loader, NULL);
        expected_batch(&td.train, rank, world, epoch, 0, LOCAL_BATCH, x, y);
        if (!batch_equals(b, x, y, LOCAL_BATCH, image_floats)) {
            print_error("epoch %d starts with %s, not with the shuffle of epoch %d\n", epoch,
                        batch_equals(b, x0, y0, LOCAL_BATCH, image_floats) ? "epoch 0's first batch again"
                                                                            : "an unexpected batch",
                        epoch);
            ok = false;
        }
    }
    free(x);
    free(x0);
    train_data_close(&td);
    if (!ok) fail();
}

// ---------------------------------------------------------------- TODO 4: identical replicas

static void test_initial_broadcast(void **state) {
    ProcessGroup *pg = test_pg();
    int rank = pg_rank(pg);
    // Every rank initialises differently (as after a non-deterministic init or a restore from elsewhere), and
    // its BN running statistics differ too.
    Model *m = test_model("tiny-bn", &synthetic_shape, LOCAL_BATCH, 100 + (uint64_t)rank);
    for (size_t i = 0; i < m->n_buffers; i++) m->buffers[i] += 0.5f * (float)(rank + 1);  // CPU: host memory
    Model *ref = test_model("tiny-bn", &synthetic_shape, LOCAL_BATCH, 100);  // what rank 0 holds
    for (size_t i = 0; i < ref->n_buffers; i++) ref->buffers[i] += 0.5f;

    ddp_broadcast_model(pg, m);
    bool same_params = pg_identical(pg, m->params, m->n_params);
    bool same_buffers = pg_identical(pg, m->buffers, m->n_buffers);
    bool mine_is_rank0 = memcmp(m->params, ref->params, m->n_params * sizeof(float)) == 0 &&
                         memcmp(m->buffers, ref->buffers, m->n_buffers * sizeof(float)) == 0;
    bool all_rank0 = max_over_ranks(pg, mine_is_rank0 ? 0.0 : 1.0) == 0.0;
    if (!same_params) print_error("the parameters differ across ranks after ddp_broadcast_model\n");
    if (!same_buffers) print_error("the BN running statistics (m->buffers) differ across ranks\n");
    if (same_params && same_buffers && !all_rank0) print_error("the replicas are equal, but not to rank 0's model\n");
    model_free(m);
    model_free(ref);
    if (!(same_params && same_buffers && all_rank0)) fail();
}

// ---------------------------------------------------------------- TODO 5: the step, against one process

// Trains `steps` DDP steps (the learner's ddp_step on this rank's shard) and the same steps in one
// process on the global batch (kit calls only), from the same initial model. Returns the DDP model and
// sets *ref to the single-process one. with_buckets: the learner's ddp_attach_buckets (stretch).
typedef struct {
    const char *model;
    int steps;
    SgdConfig opt;
    bool init_seed_per_rank;  // false: every rank starts from seed 1; true: from 100 + rank, then TODO 4
} StepRun;

static void train_single(const StepRun *run, int global_batch, Model *ref) {
    TrainData td;
    small_data_open(&td, 0, 1, global_batch);
    loader_start_epoch(td.train_loader, 0, 0);
    for (int s = 0; s < run->steps; s++) {
        const Batch *b = loader_next(td.train_loader, NULL);
        assert_non_null(b);
        train_forward_backward(ref, b, 0.0f, 1.0f / (float)b->n);
        optim_step(ref, &run->opt);
    }
    train_data_close(&td);
}

// train_ddp's per-step reference: one process that takes each step from the DDP replica's parameters and
// momentum (identical on every rank) on the same global batch.
typedef struct {
    TrainData td;     // the global batches, in one process
    Model *one;       // (global batch)
    float *before;    // (n_params) the parameters before the step
} StepRef;

static Model *train_ddp(ProcessGroup *pg, const StepRun *run, GradBuckets *(*attach)(ProcessGroup *, Model *, double),
                        double bucket_mb, bool *identical_every_step, Model **ref_out, double *worst_step_error) {
    int world = pg_world(pg), rank = pg_rank(pg);
    TrainData td;
    small_data_open(&td, rank, world, LOCAL_BATCH);
    uint64_t seed = run->init_seed_per_rank ? 100 + (uint64_t)rank : 1;
    Model *m = test_model(run->model, &td.train, LOCAL_BATCH, seed);
    if (run->init_seed_per_rank) ddp_broadcast_model(pg, m);
    Ddp ddp = {.pg = pg, .model = m, .buckets = attach ? attach(pg, m, bucket_mb) : NULL};
    bool same = pg_identical(pg, m->params, m->n_params) && pg_identical(pg, m->buffers, m->n_buffers);
    if (!same) print_error("the replicas differ before the first step (each rank started from its own weights)\n");
    StepRef sr = {0};
    if (worst_step_error) {
        small_data_open(&sr.td, 0, 1, LOCAL_BATCH * world);
        loader_start_epoch(sr.td.train_loader, 0, 0);
        sr.one = test_model(run->model, &td.train, LOCAL_BATCH * world, 1);
        sr.before = xmalloc(m->n_params * sizeof(float));
        *worst_step_error = 0.0;
    }
    loader_start_epoch(td.train_loader, 0, 0);
    for (int s = 0; s < run->steps; s++) {
        const Batch *b = loader_next(td.train_loader, NULL);
        assert_non_null(b);
        if (worst_step_error) {  // one process starts this step from the DDP replica's state
            memcpy(sr.one->params, m->params, m->n_params * sizeof(float));
            memcpy(sr.one->velocity, m->velocity, m->n_params * sizeof(float));
            memcpy(sr.before, m->params, m->n_params * sizeof(float));
        }
        ddp_step(&ddp, b, &run->opt, 0.0f);
        if (worst_step_error) {
            const Batch *g = loader_next(sr.td.train_loader, NULL);
            assert_non_null(g);
            train_forward_backward(sr.one, g, 0.0f, 1.0f / (float)g->n);
            optim_step(sr.one, &run->opt);
            double e = move_error(m->params, sr.one->params, sr.before, m->n_params);
            *worst_step_error = e > *worst_step_error || isinf(e) ? e : *worst_step_error;
        }
        // Every rank makes the same calls whatever the answers, so no rank waits for another.
        bool p = pg_identical(pg, m->params, m->n_params);
        bool v = pg_identical(pg, m->velocity, m->n_params);
        bool bu = pg_identical(pg, m->buffers, m->n_buffers);
        if (same && !(p && v && bu))
            print_error("after step %d the replicas differ:%s%s%s\n", s + 1, p ? "" : " parameters",
                        v ? "" : " momentum", bu ? "" : " BN running statistics");
        same = same && p && v && bu;
    }
    if (identical_every_step) *identical_every_step = same;
    if (worst_step_error) {
        model_free(sr.one);
        free(sr.before);
        train_data_close(&sr.td);
    }
    m->on_grads_ready = NULL;
    buckets_free(ddp.buckets);
    if (ref_out) {  // rank 0's initial model, trained in this process on the global batches
        *ref_out = test_model(run->model, &td.train, LOCAL_BATCH * world, run->init_seed_per_rank ? 100 : 1);
        train_single(run, LOCAL_BATCH * world, *ref_out);
    }
    train_data_close(&td);
    return m;
}

// max |a - b| / max |b|: the error relative to the size of the reference.
static double rel_error(const float *a, const float *b, size_t n) {
    double err = 0.0, scale = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        err = isnan(d) || d > err ? (isnan(d) ? INFINITY : d) : err;
        scale = fabs((double)b[i]) > scale ? fabs((double)b[i]) : scale;
    }
    return scale > 0 ? err / scale : err;
}

// STEP_TOL: how far one DDP step may move the parameters from where one process's step on the global batch
// moves them, both taken from the SAME parameters and momentum, as ||p_ddp - p_one||_2 / ||p_one - p_before||_2.
//
// Why per step from the same parameters, not two runs side by side: the net is piecewise linear (ReLU,
// max-pool), so its gradient jumps where an activation crosses a kink. Two runs that differ by rounding
// (1e-7) are usually on the same side of every kink, but now and then a max-pool window holds two values
// closer than that, the runs route one image's gradient through different units, and from there they differ
// by 1e-5..1e-3 (they are different, equally good, trajectories). That is what made the old 6-step trajectory
// test fail with OpenBLAS's AVX-512 kernels (SkylakeX/Cooperlake) and pass with Haswell's: measured with
// bench/ddp_drift (world 2, one thread, seed 1), both kernels stay at 6e-8 for 5 steps, then at step 6 one
// max-pool window of the second pool flips under the AVX-512 kernel's rounding and the error jumps to 1.3e-5;
// Haswell's rounding happened not to flip it (with other seeds Haswell flips and AVX-512 does not: 1 of 48
// (seed, kernel, threads) runs of 6 steps flipped). The GEMMs themselves are no less accurate on AVX-512: both
// kernels are within 4 u * sum|a||b| of a double reference on this net's shapes (u = 2^-24). So the test
// compares one step at a time from identical state, where rounding cannot accumulate into a kink crossing.
//
// The bound for one step: both sides compute v' = momentum*v + g + wd*p and p' = p - lr*v' with the same
// float32 operations on the same p and v, so they differ only through g: ||dp'|| <= lr ||dg|| plus one
// rounding of p' (u |p| per element, 1e-4 of the move at most here: moves are >= 5e-4 of |p|). Each gradient
// element is a float32 sum of at most k = B*H*W = 32*32*32 = 32768 products (conv 1's weight gradient; the
// other sums are shorter), in an order that the BLAS kernel, the blocking, the threads and the split over
// ranks choose. Any order has |error| <= gamma_k * sum|terms|, gamma_k = k u / (1 - k u) = 2e-3 (the worst
// case, every rounding in the same direction); rounding errors of independent sign give, with probability
// 1 - 1e-8 per element, lambda * sqrt(k) * u * sum|terms| = 6 * 181 * 6e-8 = 6.5e-5 * sum|terms| (Higham &
// Mary 2019). sum|terms| is at most a few times |g| where the batch's images agree on a gradient's sign,
// which the 2-norm weights most; add a kink flip from the forward's own rounding (one image's contribution
// at one unit: 1/B of a few entries). 1e-3 covers that with a margin of 10 (the most measured over 6000 steps
// of 2-4 ranks, both kernels, 1-2 threads: 5.3e-5), and every mistake is off by 0.5 or more: averaging twice
// gives 1 - 1/world, summing gives world - 1, a rank's own gradient instead of the mean 0.5-1.
#define STEP_TOL 1e-3
// ---------------------------------------------------------------- prerequisites ("fix TODO N first")
// Tests whose subject builds on an earlier TODO check it first, on a small case, with a decision every rank
// shares (tests/grading.h: grading_require_todo), so that the learner is sent to the first mistake.

// TODO 4: ranks that start from different weights and statistics are rank 0's copies after the broadcast.
static void require_broadcast(ProcessGroup *pg) {
    Model *m = test_model("tiny-bn", &synthetic_shape, 1, 100 + (uint64_t)pg_rank(pg));
    for (size_t i = 0; i < m->n_buffers; i++) m->buffers[i] += 0.5f * (float)pg_rank(pg);
    ddp_broadcast_model(pg, m);
    bool same = pg_identical(pg, m->params, m->n_params) && pg_identical(pg, m->buffers, m->n_buffers);
    model_free(m);
    grading_require_todo(same, "4", "replicas that start differently must be equal after ddp_broadcast_model");
}

// TODO 5: one plain SGD step of ddp_step moves the parameters as one process's step on the global batch does,
// from the same parameters: within STEP_TOL (above); every scaling mistake is off by 0.5 of the move or more.
static void require_step(ProcessGroup *pg) {
    StepRun run = {.model = "tiny", .steps = 1, .opt = {.lr = 0.1f}};
    Model *ref = NULL;
    Model *m = train_ddp(pg, &run, NULL, 0, NULL, &ref, NULL);
    Model *init = test_model("tiny", &synthetic_shape, 1, 1);  // train_ddp's initial model
    double err = max_over_ranks(pg, move_error(m->params, ref->params, init->params, m->n_params));
    model_free(m);
    model_free(ref);
    model_free(init);
    grading_require_todo(err <= STEP_TOL, "5", "one ddp_step must equal one step on the global batch "
                         "(see test_gradient_is_global_mean)");
}

// One step without momentum or weight decay moves the parameters by -lr * gradient: comparing the moves
// compares the gradients, and their ratio names the usual scaling mistakes.
static void test_gradient_is_global_mean(void **state) {
    ProcessGroup *pg = test_pg();
    int world = pg_world(pg);
    StepRun run = {.model = "tiny", .steps = 1, .opt = {.lr = 0.1f}};
    Model *ref = NULL;
    Model *m = train_ddp(pg, &run, NULL, 0, NULL, &ref, NULL);
    Model *init = test_model("tiny", &synthetic_shape, 1, 1);  // train_ddp's initial model
    size_t n = m->n_params;
    double dot = 0.0, norm = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)m->params[i] - init->params[i], dref = (double)ref->params[i] - init->params[i];
        dot += d * dref;
        norm += dref * dref;
    }
    double ratio = norm > 0 ? dot / norm : 0.0;
    double err = max_over_ranks(pg, move_error(m->params, ref->params, init->params, n));
    if (pg_rank(pg) == 0)
        print_message("one step on %d ranks: the DDP update is %.6f x the single-process one, error %.3g of the "
                      "move (2-norm, tolerance %.0e)\n", world, ratio, err, STEP_TOL);
    if (!(err <= STEP_TOL)) {
        print_error("rank %d: DDP update = %.4g x the one-process update (%.4g: scaled by 1/world twice; %g: summed, "
                    "not averaged; else: not all-reduced); error %.3g of the move\n", pg_rank(pg), ratio, 1.0 / world,
                    (double)world, err);
    }
    model_free(m);
    model_free(ref);
    model_free(init);
    if (!(err <= STEP_TOL)) fail();
}

static void test_replicas_identical_every_step(void **state) {
    ProcessGroup *pg = test_pg();
    require_broadcast(pg);
    StepRun run = {.model = "tiny-bn", .steps = 4, .opt = {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-4f},
                   .init_seed_per_rank = true};
    bool identical = false;
    Model *m = train_ddp(pg, &run, NULL, 0, &identical, NULL, NULL);
    model_free(m);
    if (!identical) fail();  // train_ddp said where they first differ
}

// Several steps with momentum and weight decay on the BN-free net: each DDP step must be the single process's
// step on the global batch, from the same parameters and momentum (STEP_TOL says why per step).
static void test_ddp_equals_single_process(void **state) {
    ProcessGroup *pg = test_pg();
    StepRun run = {.model = "tiny", .steps = 6, .opt = {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-4f}};
    bool identical = false;
    double worst = INFINITY;
    Model *m = train_ddp(pg, &run, NULL, 0, &identical, NULL, &worst);
    double err = max_over_ranks(pg, worst);
    if (pg_rank(pg) == 0)
        print_message("DDP on %d ranks vs one process on the global batch, %d steps, BN-free, each from the same "
                      "parameters: worst step's error %.3g of its move (2-norm, tolerance %.0e)\n", pg_world(pg),
                      run.steps, err, STEP_TOL);
    model_free(m);
    if (!identical) {
        print_error("the replicas stopped being identical (the first step where they differ is printed above)\n");
        fail();
    }
    if (!(err <= STEP_TOL)) {
        print_error("a DDP step differs from one process's step on the global batch by %.3g of the move (2-norm) > "
                    "%.0e\n", err, STEP_TOL);
        fail();
    }
}

// The same with plain BN: each rank normalises with its own local batch's statistics, so DDP is NOT the
// single process on the global batch (lesson 05's SyncBN fixes that). The replicas must still agree.
static void test_plain_bn_differs(void **state) {
    ProcessGroup *pg = test_pg();
    require_step(pg);
    StepRun run = {.model = "tiny-bn", .steps = 6, .opt = {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-4f}};
    bool identical = false;
    Model *ref = NULL;
    Model *m = train_ddp(pg, &run, NULL, 0, &identical, &ref, NULL);
    double err = max_over_ranks(pg, rel_error(m->params, ref->params, m->n_params));
    double err_buf = max_over_ranks(pg, rel_error(m->buffers, ref->buffers, m->n_buffers));
    int world = pg_world(pg);
    if (pg_rank(pg) == 0)
        print_message("plain BN, DDP on %d ranks (BN over %d images) vs one process (BN over %d): max parameter "
                      "difference %.3g, running statistics %.3g, after %d steps (lesson 05's SyncBN removes it)\n",
                      world, LOCAL_BATCH, LOCAL_BATCH * world, err, err_buf, run.steps);
    model_free(m);
    model_free(ref);
    if (!identical) {
        print_error("the replicas stopped being identical (the first step where they differ is printed above)\n");
        fail();
    }
    // With one rank there is nothing to differ; with more, the local statistics must show: the difference is
    // far above rounding (a BN-free step is within STEP_TOL, and the parameters after 6 steps stay within 1e-4
    // of the single process even after a kink crossing: bench/ddp_drift). If it is not, every rank is computing
    // on the whole batch.
    if (world > 1 && !(err > 1e-4)) {
        print_error("plain BN on %d ranks gave the single-process result (difference %.3g): are the ranks computing "
                    "on the whole global batch instead of their shards?\n", world, err);
        fail();
    }
}

// ---------------------------------------------------------------- TODO 6: global metrics

static void test_global_metrics(void **state) {
    ProcessGroup *pg = test_pg();
    int rank = pg_rank(pg), world = pg_world(pg);
    Metrics local = {.loss_sum = 0.25 + rank, .correct = 10L * rank + 1, .count = 100L + rank};
    Metrics got = ddp_global_metrics(pg, local);
    Metrics want = {0, 0, 0};
    for (int r = 0; r < world; r++) {
        want.loss_sum += 0.25 + r;
        want.correct += 10L * r + 1;
        want.count += 100L + r;
    }
    if (fabs(got.loss_sum - want.loss_sum) > 1e-9 || got.correct != want.correct || got.count != want.count) {
        print_error("rank %d: ddp_global_metrics gave loss_sum %g correct %ld count %ld; the sums over %d ranks are "
                    "%g %ld %ld\n", rank, got.loss_sum, got.correct, got.count, world, want.loss_sum, want.correct,
                    want.count);
        fail();
    }
}

static void test_eval_counts_every_sample_once(void **state) {
    ProcessGroup *pg = test_pg();
    int world = pg_world(pg), rank = pg_rank(pg);
    TrainOptions o = test_options("tiny", LOCAL_BATCH * world);
    TrainData td;
    ddp_data_open(&td, &o, pg);
    Sampler share;
    sampler_init(&share, td.test.n, rank, world, TEST_SEED, SAMPLER_EVAL);
    grading_require_todo(max_over_ranks(pg, sampler_len(&td.test_sampler) != sampler_len(&share)) == 0, "3a",
                         "each rank evaluates its own share of the test split (see test_sampler_shards_the_batch)");
    Model *m = test_model("tiny", &td.train, LOCAL_BATCH * world, 3);
    Metrics mine = train_evaluate(m, td.test_loader);
    Metrics global = ddp_evaluate(pg, m, td.test_loader);
    // Independent reference: one process over the whole test split.
    Sampler all;
    sampler_init(&all, td.test.n, 0, 1, TEST_SEED, SAMPLER_EVAL);
    Loader *L = loader_create(&td.test, &all, LOCAL_BATCH * world, false, NULL, TEST_SEED);
    Metrics ref = train_evaluate(m, L);
    loader_free(L);
    bool ok = true;
    if (global.count != td.test.n) {
        print_error("the global count is %ld for a test split of %d images: %s\n", global.count, td.test.n,
                    global.count > td.test.n ? "images counted more than once (every rank evaluated everything?)"
                                             : "images missing (not summed over the ranks?)");
        ok = false;
    } else if (mine.count != sampler_len(&share)) {
        print_error("rank %d evaluated %ld images, but its share of the %d test images is %d: the ranks must split "
                    "the test split (SAMPLER_EVAL), not each evaluate all of it\n", rank, mine.count, td.test.n,
                    sampler_len(&share));
        ok = false;
    } else if (global.correct != ref.correct || fabs(global.loss_sum - ref.loss_sum) > 1e-4 * fabs(ref.loss_sum)) {
        print_error("global correct %ld loss_sum %.6g, one process over the whole split: %ld %.6g\n", global.correct,
                    global.loss_sum, ref.correct, ref.loss_sum);
        ok = false;
    }
    model_free(m);
    train_data_close(&td);
    if (!ok) fail();
}

// ---------------------------------------------------------------- stretch (TODO 7): buckets

static void test_bucketed_equals_flat(void **state) {
    ProcessGroup *pg = test_pg();
    require_step(pg);
    Model *probe = test_model("tiny-bn", &synthetic_shape, LOCAL_BATCH, 1);
    size_t n_params = probe->n_params;
    if (ddp_attach_buckets(pg, probe, 0.0) != NULL) {  // --bucket-mb 0: flat
        print_error("ddp_attach_buckets with bucket_mb 0 must return NULL (flat all-reduce)\n");
        fail();
    }
    // 1 KB buckets cut the tiny net's 1586 gradients into several.
    GradBuckets *gb = ddp_attach_buckets(pg, probe, 1.0 / 1024);
    bool attached = gb && probe->on_grads_ready && probe->on_grads_ready_ctx == gb;
    int count = gb ? buckets_count(gb) : 0;
    probe->on_grads_ready = NULL;
    buckets_free(gb);
    model_free(probe);
    if (!attached) {
        print_error("ddp_attach_buckets(pg, m, 1 KB) must return buckets and set m->on_grads_ready and its context\n");
        fail();
    }
    if (count < 2) {
        print_error("1 KB buckets over %zu floats of gradients should make several buckets, got %d\n",
                    n_params, count);
        fail();
    }

    // BN-free, so that on more than 2 ranks each step can be held against one process's (below).
    StepRun run = {.model = "tiny", .steps = 3, .opt = {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-4f}};
    bool same_b = false, same_f = false;
    int world = pg_world(pg);
    // Bitwise on 1 or 2 ranks: each gradient is then the sum of at most two floats, one rounding whatever the
    // message size, so the two runs are the same arithmetic. On more ranks MPI may pick another reduction order
    // for a bucket than for the whole buffer: the sums differ in the last bits, and two runs apart by rounding
    // may cross a kink apart (STEP_TOL's comment); so there each step of each run is compared with one
    // process's step from the same state instead, within STEP_TOL (a bucket left out is off by O(1)).
    double wb = 0.0, wf = 0.0;
    Model *bucketed = train_ddp(pg, &run, ddp_attach_buckets, 1.0 / 1024, &same_b, NULL, world > 2 ? &wb : NULL);
    Model *flat = train_ddp(pg, &run, NULL, 0, &same_f, NULL, world > 2 ? &wf : NULL);
    double e = max_over_ranks(pg, world <= 2 ? rel_error(bucketed->params, flat->params, flat->n_params)
                                             : (wb > wf ? wb : wf));
    bool equal = world <= 2 ? max_over_ranks(pg, memcmp(bucketed->params, flat->params,
                                                        flat->n_params * sizeof(float)) != 0) == 0.0
                            : e <= STEP_TOL;
    if (!equal) print_error("bucketed and flat all-reduce give different parameters after %d steps: %s %.3g\n",
                            run.steps, world <= 2 ? "max error" : "worst step's error against one process", e);
    model_free(bucketed);
    model_free(flat);
    if (!(same_b && same_f && equal)) fail();
}

void test_only_rank0_prints(void **state);           // program_output.c
int lesson03_program_dispatch(int argc, char **argv);  // program_output.c: `--program ARGS` runs train.c's main
int lesson03_check_loop_hooks(ProcessGroup *pg);       // loop_hooks.c: the given loop's hooks (run-tests.sh)

int main(int argc, char **argv) {
    int program = lesson03_program_dispatch(argc, argv);
    if (program >= 0) return program;
    if (argc == 2 && strcmp(argv[1], "--check-loop-hooks") == 0) return lesson03_check_loop_hooks(test_pg());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_for_rank),
        cmocka_unit_test(test_setup_process_group),
        cmocka_unit_test(test_sampler_shards_the_batch),
        cmocka_unit_test(test_sampler_reshuffles_each_epoch),
        cmocka_unit_test(test_initial_broadcast),
        cmocka_unit_test(test_gradient_is_global_mean),
        cmocka_unit_test(test_replicas_identical_every_step),
        cmocka_unit_test(test_ddp_equals_single_process),
        cmocka_unit_test(test_plain_bn_differs),
        cmocka_unit_test(test_global_metrics),
        cmocka_unit_test(test_eval_counts_every_sample_once),
        cmocka_unit_test(test_bucketed_equals_flat),
        cmocka_unit_test(test_only_rank0_prints),
    };
    return grading_run(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
