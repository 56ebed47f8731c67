// tests/lesson11/test_lesson11.c: the autograder for lesson 11 (the learner's tp.c: the column and row split of a
// conv's filters, Megatron's f and g, a residual block split over a tensor group, which layers can be split, and
// the tensor x data grid).
//
// Built with Open MPI and run on GRADE_NP = 4 ranks (solutions/11-tensor/lesson.mk): tensor groups of 2 (two of
// them, side by side) and of 4, and the 2 x 2 grid. Every rank runs the same test and reports its own verdict
// (tests/grading.h); a test passes only when it passes on every rank.
//
// The references are independent of the learner's code:
//   - the shards against a hand-indexed slice of filters whose values are their own index in w;
//   - f and g by what they hand to the backend (pg_traffic: calls and bytes) and by the exact sums of small
//     integers;
//   - a block split over the test's OWN tensor groups (pg_split by the definition: consecutive ranks), built here
//     from the slices the test cuts itself, against the unsplit block as a kit stage of the whole model
//     (model_create_stage: conv, BN, ReLU, conv, BN, ReLU, add), computed by each rank alone;
//   - the whole Tp (tp_create, given, built on TODOs 1, 3 and 4a-b, which are checked first) against one process's
//     kit model on the global batch (train_forward_backward + optim_step);
//   - the bytes of a step against the given arithmetic, tp_expected_traffic, exactly.
//
// No test may hang: every decision that changes which collectives run is taken from values every rank has
// (max_over_ranks, all_ranks), and the process group has a short timeout. Hints for failures are in hints.tsv.
#include <mpi.h>
#include <omp.h>

#include "tests/testutil.h"
#include "tests/grading.h"
#include "tests/mpi_testutil.h"

#include "kit/cli.h"
#include "kit/data.h"
#include "kit/device.h"
#include "kit/dist.h"
#include "kit/model.h"
#include "kit/ops.h"
#include "kit/optim.h"
#include "kit/train.h"
#include "lesson.h"

enum { WORLD = 4, BATCH = 16, IMAGE = 3 * 32 * 32, STEPS = 2, BLOCK_BATCH = 8 };
#define TEST_TIMEOUT_S 20.0  // a lost collective ends the test's job within this (a loaded machine is slow)
#define F sizeof(float)

// The normwise tolerance of whole computations (a block's output and gradients, a step's weights) against the
// unsplit reference. Both sides do the same float32 operations but for the ORDER of some sums: conv2's sum over
// its 9c input terms is cut into T partial sums of 9c/T terms added by the all-reduce; a dx is T partial sums;
// GEMMs of other shapes may block differently. A sum of k terms in any order is within gamma_k sum|terms| of the
// exact value (Higham, Thm 3.5), and in practice within lambda sqrt(k) u sum|terms| (Higham & Mary 2019: lambda =
// 6 for a probability of failure below 1e-8 per element). The longest sums here are the weight gradients over
// the batch's positions, k = 8 images x 16 x 16 = 2048 (or 16 x 256 = 4096 in a step): 6 x 64 x 6e-8 = 2.3e-5 of
// sum|terms|. As in lesson 08 (tests/lesson08/test_dist.c), sum|terms| is taken as at most 10 times the largest
// element of the result, and each of the two batch norms on the way rescales an absolute error by the same
// factor (gamma x invstd) as the values it normalises, at most doubling the relative error: 10 x 2.3e-5 x 2 =
// 5e-4 of the largest element, so 1e-3 leaves a margin of two. The elementwise checks of a1 and z
// (forward_problem) use the rigorous gamma_k bound with sum|terms| computed. Measured (the tests print it): 8.8e-7
// for a block, 1.2e-6 for 2 steps. Every mistake is off by far more: a partial sum (T = 2: about half the value),
// a sum counted twice, the skip gradient counted T times.
#define TP_TOL 1e-3

static const SgdConfig OPT = {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-4f, .nesterov = false};

// The process group, made on first use, and this rank's share of the cores for the kit's OpenMP regions: the 4
// ranks run on one machine, and threads that spin while they wait for each other, more of them than cores, cost
// far more than they save (measured on 2 cores: test_step_equals_one_process 26.7 s with 2 threads per rank, the
// grader's OMP_NUM_THREADS, against 3.2 s with 1).
static ProcessGroup *test_world(void) {
    static bool shared = false;
    ProcessGroup *pg = test_pg_named("test_lesson11", TEST_TIMEOUT_S);
    if (!shared) {
        int threads = omp_get_num_procs() / pg_world(pg);
        omp_set_num_threads(threads > 1 ? threads : 1);
        shared = true;
    }
    return pg;
}

// The tests below need the autograder's 4 ranks; started by hand on another number they are skipped.
static ProcessGroup *world_of_four(void) {
    ProcessGroup *pg = test_world();
    if (pg_world(pg) != WORLD) {
        print_message("this test runs on %d ranks (make grade LESSON=11 starts them); here there are %d\n", WORLD,
                      pg_world(pg));
        skip();
    }
    return pg;
}

// ResNet-9 at width 8 (not its default 64): the same layer table, its two residual blocks at layers 7 (16
// channels, 16 x 16) and 22 (64 channels, 4 x 4).
static ModelConfig resnet9(void) {
    ModelConfig cfg;
    assert_true(model_config(&cfg, "resnet9", 8, 3, 32, 32, 10));
    return cfg;
}
static const int BLOCKS[] = {7, 22};

// The test's own tensor group of T consecutive ranks (the lesson's rule: README section 6), and its rank in it.
// Collective over world; free with pg_finalize.
static ProcessGroup *own_tensor_group(ProcessGroup *world, int T) {
    int r = pg_rank(world);
    return pg_split(world, r / T, r % T);
}

// ---------------------------------------------------------------- TODO 1a, 1b: the shards

// Filters w (K, C, R, R) whose every float is its own index in w (exact in float32 below 2^24): a shard's
// float then says where it came from.
static float *indexed_filters(int K, int C, int R) {
    size_t n = (size_t)K * C * R * R;
    float *w = xmalloc(n * F);
    for (size_t i = 0; i < n; i++) w[i] = (float)i;
    return w;
}

// Where float `v` of w sits: "filter f, input channel c".
static void where_in_w(float v, int C, int R, char *out, size_t len) {
    if (isnan(v)) {
        snprintf(out, len, "NaN (never written)");
        return;
    }
    long i = (long)v;
    long per = (long)C * R * R;
    snprintf(out, len, "w's float %ld: filter %ld, input channel %ld", i, i / per, (i % per) / ((long)R * R));
}

static const int SPLIT_CASES[][4] = {  // K, C, R, T
    {8, 6, 3, 2}, {6, 8, 3, 2}, {12, 8, 3, 4}, {16, 16, 3, 4}, {8, 4, 1, 2}, {4, 4, 3, 1}, {64, 64, 3, 4},
};

// tp_split_out (by_out) or tp_split_in against the hand-indexed slice for every case and rank, or the reason it
// is wrong ("" when right).
static void split_problem(bool by_out, char *why, size_t len) {
    why[0] = '\0';
    for (size_t c = 0; c < sizeof SPLIT_CASES / sizeof SPLIT_CASES[0] && !why[0]; c++) {
        const int K = SPLIT_CASES[c][0], C = SPLIT_CASES[c][1], R = SPLIT_CASES[c][2], T = SPLIT_CASES[c][3];
        const size_t rr = (size_t)R * R, n = (size_t)K * C * rr, shard_n = n / (size_t)T;
        float *w = indexed_filters(K, C, R), *shard = xmalloc((shard_n + 4) * F);
        for (int r = 0; r < T && !why[0]; r++) {
            for (size_t i = 0; i < shard_n + 4; i++) shard[i] = NAN;
            if (by_out) tp_split_out(w, K, C, R, r, T, shard);
            else tp_split_in(w, K, C, R, r, T, shard);
            const int k = K / T, cc = C / T;
            for (size_t i = 0; i < shard_n && !why[0]; i++) {
                size_t want;  // the index in w of shard float i
                if (by_out) {
                    want = (size_t)r * k * C * rr + i;  // output channels [r K/T, (r+1) K/T): consecutive filters
                } else {
                    size_t f = i / ((size_t)cc * rr), rest = i % ((size_t)cc * rr);
                    want = (f * C + (size_t)r * cc) * rr + rest;  // every filter's input channels [r C/T, ...)
                }
                if (shard[i] == (float)want) continue;
                char got[96], exp[96];
                where_in_w(shard[i], C, R, got, sizeof got);
                where_in_w((float)want, C, R, exp, sizeof exp);
                // What a plausible mistake would have put there.
                size_t other_in_f = i / ((size_t)cc * rr), other_in = (other_in_f * C + (size_t)r * cc) * rr +
                                                                      i % ((size_t)cc * rr);
                size_t rank0 = by_out ? i : (other_in_f * C) * rr + i % ((size_t)cc * rr);
                size_t piece = (size_t)r * shard_n + i;  // one contiguous piece of w
                const char *say = isnan(shard[i]) ? ""
                    : by_out && shard[i] == (float)other_in ? ": that is the split by INPUT channel (TODO 1b's); a "
                                                              "column-parallel conv keeps whole filters of its OUTPUT "
                                                              "channels"
                    : !by_out && shard[i] == (float)piece ? ": that is one contiguous piece of w (the split by "
                                                            "OUTPUT channel); a row split keeps, of EVERY filter, the "
                                                            "input channels [r C/T, (r+1) C/T)"
                    : r > 0 && shard[i] == (float)rank0 ? ": rank 0's slice: where does rank r's start?"
                    : "";
                snprintf(why, len, "%s(K %d, C %d, R %d, rank %d of T %d): shard[%zu] holds %s; expected %s%s",
                         by_out ? "tp_split_out" : "tp_split_in", K, C, R, r, T, i, got, exp, say);
            }
            for (size_t i = shard_n; i < shard_n + 4 && !why[0]; i++)
                if (!isnan(shard[i]))
                    snprintf(why, len, "%s(K %d, C %d, R %d, rank %d of T %d) wrote shard[%zu], past its %zu floats",
                             by_out ? "tp_split_out" : "tp_split_in", K, C, R, r, T, i, shard_n);
            for (size_t i = 0; i < n && !why[0]; i++)
                if (w[i] != (float)i)
                    snprintf(why, len, "%s changed w (it is const)", by_out ? "tp_split_out" : "tp_split_in");
        }
        free(w), free(shard);
    }
}

static void test_split_out(void **state) {
    (void)state;
    char why[600];
    split_problem(true, why, sizeof why);
    if (why[0]) {
        print_error("%s\n", why);
        fail();
    }
}

// tp_split_in by the hand-indexed slice, then every rank's shard put back by the given tp_unsplit_in: w again.
static void test_split_in(void **state) {
    (void)state;
    char why[600];
    split_problem(false, why, sizeof why);
    if (why[0]) {
        print_error("%s\n", why);
        fail();
    }
    const int K = 12, C = 8, R = 3, T = 4;
    const size_t n = (size_t)K * C * R * R;
    float *w = indexed_filters(K, C, R), *back = xmalloc(n * F), *shard = xmalloc(n / T * F);
    for (size_t i = 0; i < n; i++) back[i] = NAN;
    for (int r = 0; r < T; r++) {
        tp_split_in(w, K, C, R, r, T, shard);
        tp_unsplit_in(shard, K, C, R, r, T, back);
    }
    bool same = memcmp(w, back, n * F) == 0;
    free(w), free(back), free(shard);
    if (!same) {
        print_error("the %d shards of tp_split_in, put back by tp_unsplit_in, are not w again\n", T);
        fail();
    }
}

// ---------------------------------------------------------------- TODO 1c: f and g

typedef enum { F_FORWARD, F_BACKWARD, G_FORWARD, G_BACKWARD } TpOp;
static const char *OP_NAMES[] = {"tp_f_forward", "tp_f_backward", "tp_g_forward", "tp_g_backward"};

static void run_op(TpOp op, ProcessGroup *g, float *buf, size_t n) {
    switch (op) {
    case F_FORWARD: tp_f_forward(g, buf, n); break;
    case F_BACKWARD: tp_f_backward(g, buf, n); break;
    case G_FORWARD: tp_g_forward(g, buf, n); break;
    case G_BACKWARD: tp_g_backward(g, buf, n); break;
    }
}

// One operator on the tensor group g (n floats): small integers (rank + 1) x (i % 13 + 1), whose sums are exact.
// An identity hands NOTHING to the backend and leaves the buffer as it was; a sum hands exactly one all-reduce of
// the n floats and leaves the sum over the group. The reason it does not ("" when it does); the same verdict on
// every rank of g.
static bool op_ok(ProcessGroup *g, TpOp op, size_t n, char *why, size_t len) {
    const int T = pg_world(g), r = pg_rank(g);
    const bool sums = op == F_BACKWARD || op == G_FORWARD;
    const double group_sum = T * (T + 1) / 2.0;  // sum of (rank + 1) over the group
    float *buf = xmalloc((n + 1) * F);
    for (size_t i = 0; i < n; i++) buf[i] = (float)((r + 1) * (int)(i % 13 + 1));
    buf[n] = NAN;
    PgTraffic before = pg_traffic(g);
    run_op(op, g, buf, n);
    PgTraffic after = pg_traffic(g);
    unsigned long long calls = after.coll_calls - before.coll_calls, bytes = after.coll_bytes_in - before.coll_bytes_in;
    unsigned long long msgs = after.p2p_msgs - before.p2p_msgs;
    // What the buffer holds: this rank's values, the sum, the mean, twice the sum... (the first float that is not
    // the expected one decides).
    const char *holds = "";
    size_t bad = n;
    for (size_t i = 0; i < n && bad == n; i++) {
        double unit = (double)(i % 13 + 1), want = sums ? group_sum * unit : (r + 1) * unit;
        if (buf[i] != (float)want) bad = i;
    }
    if (bad < n) {
        double unit = (double)(bad % 13 + 1), v = buf[bad];
        holds = isnan(v) ? "NaN"
              : v == (r + 1) * unit ? "this rank's own values (nothing summed)"
              : v == group_sum * unit ? "the SUM over the group"
              : v == group_sum * unit / T ? "the MEAN over the group (pg_allreduce_avg: f and g sum)"
              : v == T * group_sum * unit ? "T x the sum (summed twice)"
              : v == 0.0 ? "zeros"
              : "other numbers";
    }
    why[0] = '\0';
    const char *role = op == F_FORWARD ? "f's forward is the identity: every rank of the group already holds the "
                                          "whole input x of the column-parallel conv"
                     : op == G_BACKWARD ? "g's backward is the identity: the gradient of a sum is the same for every "
                                          "term, so each rank's partial output gets the whole gradient as it is"
                     : op == G_FORWARD ? "g's forward SUMS the partial outputs of the row-parallel conv over the "
                                         "group (each rank's comes from its own input channels only)"
                                       : "f's backward SUMS the gradient of x over the group (each rank's "
                                         "column-parallel conv gives only its own channels' share of it)";
    if (!sums && (calls > 0 || msgs > 0))
        snprintf(why, len, "%s handed %llu collective call(s) (%llu bytes) and %llu message(s) to the backend; %s%s",
                 OP_NAMES[op], calls, bytes, msgs, role,
                 bad == n || strstr(holds, "SUM") ? " (are f and g swapped?)" : "");
    else if (sums && calls == 0)
        snprintf(why, len, "%s handed no all-reduce to the backend (the buffer holds %s): %s, one pg_allreduce_sum",
                 OP_NAMES[op], bad < n ? holds : "the sum all the same", role);
    else if (sums && calls > 1)
        snprintf(why, len, "%s handed %llu collective calls (%llu bytes) to the backend, not ONE all-reduce of the "
                 "%zu floats%s: %s", OP_NAMES[op], calls, bytes, n,
                 calls == 2 ? " (the all-reduce is doubled)" : "", role);
    else if (sums && (bytes != 4ull * n || msgs > 0))
        snprintf(why, len, "%s handed one collective of %llu bytes (and %llu messages) to the backend; the buffer "
                 "is %zu floats = %zu bytes: %s", OP_NAMES[op], bytes, msgs, n, 4 * n, role);
    else if (bad < n)
        snprintf(why, len, "%s on a group of %d: float %zu holds %s, expected %s: %s", OP_NAMES[op], T, bad, holds,
                 sums ? "the sum over the group" : "this rank's own value, unchanged", role);
    else if (!isnan(buf[n]))
        snprintf(why, len, "%s wrote past the %zu floats of the buffer", OP_NAMES[op], n);
    free(buf);
    if (why[0]) print_error("rank %d of a tensor group of %d: %s\n", r, T, why);
    return max_over_ranks(g, why[0] ? 1.0 : 0.0) == 0;
}

// The four operators on the groups of T = 2 (two side by side) and T = 4, lengths 1 and 1000; the first failure's
// reason into why (on the ranks that saw it); the same verdict on every rank of the world.
static bool operators_ok(ProcessGroup *world, const size_t *lengths, int n_lengths, char *why, size_t len) {
    bool ok = true;
    why[0] = '\0';
    for (int T = 2; T <= pg_world(world) && ok; T *= 2) {
        if (pg_world(world) % T) continue;
        ProcessGroup *g = own_tensor_group(world, T);
        for (int op = 0; op < 4 && ok; op++)
            for (int i = 0; i < n_lengths && ok; i++) ok = all_ranks(world, op_ok(g, (TpOp)op, lengths[i], why, len));
        pg_finalize(g);
    }
    return ok;
}

static void test_f_and_g(void **state) {
    (void)state;
    ProcessGroup *world = test_world();
    static const size_t lengths[] = {1, 1000};
    char why[700];
    if (!operators_ok(world, lengths, 2, why, sizeof why)) fail();
    if (pg_rank(world) == 0)
        print_message("f and g on tensor groups of 2 and 4: identities hand nothing over, sums one all-reduce\n");
}

// TODO 1c first, for the tests built on it: with a wrong f or g every block is wrong for a reason test_f_and_g
// names.
static void require_operators(ProcessGroup *world) {
    static const size_t lengths[] = {7};
    char why[700];
    bool ok = operators_ok(world, lengths, 1, why, sizeof why);
    grading_require_todo(ok, "1c", "%s", why[0] ? why : "f or g is wrong on another rank (test_f_and_g)");
}

// ---------------------------------------------------------------- TODO 2: a block split over the tensor group

// The test's own TpBlock: rank r's slices of the whole block `st` (a kit stage of the block's 7 layers), cut by
// the test's indexing, on the CPU; every activation NaN until written.
typedef struct {
    TpBlock b;
    size_t full, part;  // floats of (max_batch, c, h, w) and (max_batch, k, h, w)
} TestBlock;

static float *nan_buffer(size_t n) {
    float *p = xmalloc((n ? n : 1) * F);
    for (size_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}

// The whole block's tensors in st (conv1, BN1, conv2, BN2: its layers 0, 1, 3, 4).
typedef struct {
    float *w1, *g1, *b1, *w2, *g2, *b2;      // params
    float *dw1, *dg1, *db1, *dw2, *dg2, *db2;  // grads
    float *rm1, *rv1, *rm2, *rv2;             // running statistics
    float *mean1, *invstd1;                   // BN1's batch statistics of the last forward
} Whole;

static Whole whole_of(Model *st) {
    const Layer *l = st->layers;
    const TensorView *v = st->views, *bv = st->buffer_views;
    Whole w;
    w.w1 = st->params + v[l[0].weight].offset, w.dw1 = st->grads + v[l[0].weight].offset;
    w.g1 = st->params + v[l[1].weight].offset, w.dg1 = st->grads + v[l[1].weight].offset;
    w.b1 = st->params + v[l[1].bias_view].offset, w.db1 = st->grads + v[l[1].bias_view].offset;
    w.w2 = st->params + v[l[3].weight].offset, w.dw2 = st->grads + v[l[3].weight].offset;
    w.g2 = st->params + v[l[4].weight].offset, w.dg2 = st->grads + v[l[4].weight].offset;
    w.b2 = st->params + v[l[4].bias_view].offset, w.db2 = st->grads + v[l[4].bias_view].offset;
    w.rm1 = st->buffers + bv[l[1].running].offset, w.rv1 = st->buffers + bv[l[1].running + 1].offset;
    w.rm2 = st->buffers + bv[l[4].running].offset, w.rv2 = st->buffers + bv[l[4].running + 1].offset;
    w.mean1 = st->saved + l[1].saved_offset, w.invstd1 = w.mean1 + l[1].c;
    return w;
}

// The block of layers [first, first + 7) as a kit stage, with BN's scales, shifts and running statistics set to
// values of their own (the initial 1 and 0 would hide a slice taken from the wrong channels).
static Model *whole_block(const ModelConfig *cfg, int first, int max_batch) {
    Model *st = model_create_stage(cfg, DEVICE_CPU, max_batch, 42, first, first + TP_BLOCK_LAYERS);
    Whole w = whole_of(st);
    const int c = st->in_c;
    fill_uniform(w.g1, (size_t)c, 0.5f, 1.5f, 101), fill_uniform(w.b1, (size_t)c, -0.3f, 0.3f, 102);
    fill_uniform(w.g2, (size_t)c, 0.5f, 1.5f, 103), fill_uniform(w.b2, (size_t)c, -0.3f, 0.3f, 104);
    fill_uniform(w.rm1, (size_t)c, -0.1f, 0.1f, 105), fill_uniform(w.rv1, (size_t)c, 0.5f, 1.5f, 106);
    fill_uniform(w.rm2, (size_t)c, -0.1f, 0.1f, 107), fill_uniform(w.rv2, (size_t)c, 0.5f, 1.5f, 108);
    return st;
}

static TestBlock *block_make(Model *st, int T, int r, int max_batch) {
    TestBlock *t = xcalloc(1, sizeof *t);
    TpBlock *b = &t->b;
    const Layer *c1 = &st->layers[0];
    const Device d = DEVICE_CPU;
    b->layer = st->first, b->c = c1->out_c, b->h = c1->h, b->w = c1->w, b->k = c1->out_c / T;
    b->tp = T, b->tp_rank = r, b->device = d, b->max_batch = max_batch, b->sync = NULL;
    const size_t k = (size_t)b->k, c = (size_t)b->c, hw = (size_t)b->h * b->w, wsz = k * c * 9;
    b->n_params = 2 * wsz + 2 * k + 2 * c;
    b->params = xmalloc(b->n_params * F), b->grads = xcalloc(b->n_params, F), b->velocity = xcalloc(b->n_params, F);
    // The test's own layout (the learner's code uses the views only): w1, g1, b1, w2, g2, b2.
    float *p = b->params, *g = b->grads;
    b->w1 = p, b->dw1 = g, p += wsz, g += wsz;
    b->g1 = p, b->dg1 = g, p += k, g += k;
    b->b1 = p, b->db1 = g, p += k, g += k;
    b->w2 = p, b->dw2 = g, p += wsz, g += wsz;
    b->g2 = p, b->dg2 = g, p += c, g += c;
    b->b2 = p, b->db2 = g;
    Whole w = whole_of(st);
    memcpy(b->w1, w.w1 + (size_t)r * wsz, wsz * F);  // output channels [r k, (r + 1) k): consecutive filters
    for (size_t f = 0; f < c; f++)                    // every filter's input channels [r k, (r + 1) k)
        memcpy(b->w2 + f * k * 9, w.w2 + (f * c + (size_t)r * k) * 9, k * 9 * F);
    memcpy(b->g1, w.g1 + (size_t)r * k, k * F), memcpy(b->b1, w.b1 + (size_t)r * k, k * F);
    memcpy(b->g2, w.g2, c * F), memcpy(b->b2, w.b2, c * F);
    b->running = xmalloc((2 * k + 2 * c) * F);
    memcpy(b->running, w.rm1 + (size_t)r * k, k * F), memcpy(b->running + k, w.rv1 + (size_t)r * k, k * F);
    memcpy(b->running + 2 * k, w.rm2, c * F), memcpy(b->running + 2 * k + c, w.rv2, c * F);
    b->saved = nan_buffer(2 * k + 2 * c);
    t->full = (size_t)max_batch * c * hw, t->part = (size_t)max_batch * k * hw;
    b->a1 = nan_buffer(t->part), b->a2 = nan_buffer(t->part), b->da = nan_buffer(t->part);
    b->z = nan_buffer(t->full), b->a3 = nan_buffer(t->full), b->out = nan_buffer(t->full);
    b->dz = nan_buffer(t->full), b->dx = nan_buffer(t->full);
    Conv2dDims d1 = {.n = max_batch, .c = b->c, .h = b->h, .w = b->w, .k = b->k, .r = 3, .stride = 1, .pad = 1};
    Conv2dDims d2 = {.n = max_batch, .c = b->k, .h = b->h, .w = b->w, .k = b->c, .r = 3, .stride = 1, .pad = 1};
    BatchNormDims s1 = {.n = max_batch, .c = b->k, .hw = (int)hw, .eps = 1e-5f, .momentum = 0.1f};
    BatchNormDims s2 = {.n = max_batch, .c = b->c, .hw = (int)hw, .eps = 1e-5f, .momentum = 0.1f};
    size_t work = conv2d_work_floats(d, &d1);
    if (conv2d_work_floats(d, &d2) > work) work = conv2d_work_floats(d, &d2);
    if (batchnorm_work_floats(d, &s1) > work) work = batchnorm_work_floats(d, &s1);
    if (batchnorm_work_floats(d, &s2) > work) work = batchnorm_work_floats(d, &s2);
    b->work = xmalloc((work ? work : 1) * F);
    return t;
}

static void block_free(TestBlock *t) {
    if (!t) return;
    TpBlock *b = &t->b;
    float *bufs[] = {b->params, b->grads, b->velocity, b->running, b->saved, b->a1, b->a2, b->z,
                     b->a3,     b->out,   b->dz,       b->da,      b->dx,    b->work};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(t);
}

// max |a - b| / max |b| over n floats (NaN: infinite).
static double rel_error(const float *a, const float *b, size_t n) {
    double e = 0.0, m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (isnan(d)) return INFINITY;
        e = d > e ? d : e;
        m = fabs((double)b[i]) > m ? fabs((double)b[i]) : m;
    }
    return m > 0 ? e / m : e;
}

// Channels [lo, lo + k) of x (n, c, hw) into out (n, k, hw).
static void take_channels(const float *x, int n, int c, int hw, int lo, int k, float *out) {
    for (int i = 0; i < n; i++)
        memcpy(out + (size_t)i * k * hw, x + ((size_t)i * c + lo) * hw, (size_t)k * hw * F);
}


// One case of a block split over T ranks: this rank's block, the whole one, their inputs, what they computed.
typedef struct {
    ProcessGroup *tensor;  // the test's own group of T consecutive ranks
    Model *st;             // the whole block (a kit stage), computed by this rank alone
    TestBlock *tb;
    int T, r, n, layer;
    float *x, *dout;       // (n, c, h, w) the same on every rank: what the learner's block gets
    float *x0;             // (n, c, h, w) x as it was before (the references read this one)
    float *ref_out;        // (n, c, h, w) the whole block's output
    float *ref_dx;         // (n, c, h, w) the whole block's input gradient
    float *dx_summed;      // (n, c, h, w) sum over the tensor group of (the learner's dx - dout): its conv path
    PgTraffic fwd, bwd;    // what the learner's forward and backward handed to the tensor group
} BlockCase;

static BlockCase block_case(ProcessGroup *world, int layer, int T) {
    ModelConfig cfg = resnet9();
    BlockCase bc = {.T = T, .n = BLOCK_BATCH, .layer = layer};
    bc.tensor = own_tensor_group(world, T);
    bc.r = pg_rank(bc.tensor);
    bc.st = whole_block(&cfg, layer, BLOCK_BATCH);
    bc.tb = block_make(bc.st, T, bc.r, BLOCK_BATCH);
    const size_t full = bc.tb->full;
    bc.x = xmalloc(full * F), bc.dout = xmalloc(full * F), bc.x0 = xmalloc(full * F);
    bc.ref_out = xmalloc(full * F), bc.ref_dx = xmalloc(full * F), bc.dx_summed = xmalloc(full * F);
    fill_uniform(bc.x, full, -1.0f, 1.0f, 200 + (uint64_t)layer);
    memcpy(bc.x0, bc.x, full * F);
    fill_uniform(bc.dout, full, -1.0f, 1.0f, 300 + (uint64_t)layer);
    return bc;
}

static void block_case_free(BlockCase *bc) {
    block_free(bc->tb);
    model_free(bc->st);
    free(bc->x), free(bc->x0), free(bc->dout), free(bc->ref_out), free(bc->ref_dx), free(bc->dx_summed);
    pg_finalize(bc->tensor);
}

static PgTraffic traffic_delta(PgTraffic a, PgTraffic b) {
    return (PgTraffic){.coll_calls = b.coll_calls - a.coll_calls, .coll_bytes_in = b.coll_bytes_in - a.coll_bytes_in,
                       .p2p_msgs = b.p2p_msgs - a.p2p_msgs, .p2p_bytes_sent = b.p2p_bytes_sent - a.p2p_bytes_sent,
                       .p2p_bytes_recv = b.p2p_bytes_recv - a.p2p_bytes_recv};
}

// The learner's forward (train) and backward of the block with the traffic of each, then the whole block's (the
// reference, by this rank alone), then the test's own sum of the learner's conv-path dx over the group.
static void block_run(BlockCase *bc) {
    TpBlock *b = &bc->tb->b;
    const size_t full = (size_t)bc->n * b->c * b->h * b->w;
    PgTraffic t0 = pg_traffic(bc->tensor);
    tp_block_forward(b, bc->tensor, bc->x, bc->n, true);
    PgTraffic t1 = pg_traffic(bc->tensor);
    memset(b->grads, 0, b->n_params * F);
    tp_block_backward(b, bc->tensor, bc->x, bc->dout, bc->n);
    PgTraffic t2 = pg_traffic(bc->tensor);
    bc->fwd = traffic_delta(t0, t1), bc->bwd = traffic_delta(t1, t2);
    memcpy(bc->ref_out, model_forward(bc->st, bc->x0, bc->n, true), full * F);
    model_zero_grad(bc->st);
    model_backward(bc->st, bc->x0, bc->dout, bc->n);
    memcpy(bc->ref_dx, model_input_grad(bc->st), full * F);
    for (size_t i = 0; i < full; i++) bc->dx_summed[i] = b->dx[i] - bc->dout[i];
    pg_allreduce_sum(bc->tensor, bc->dx_summed, full);
}

// conv2d forward (n, c_in, h, w) -> (n, k, h, w), 3 x 3, padding 1, of a and w, and of |a| and |w| (sum|terms|).
static void conv_and_abs(int n, int c_in, int k, int h, int w, const float *a, const float *wt, float *y, float *yabs) {
    Conv2dDims d = {.n = n, .c = c_in, .h = h, .w = w, .k = k, .r = 3, .stride = 1, .pad = 1};
    size_t na = (size_t)n * c_in * h * w, nw = (size_t)k * c_in * 9;
    float *work = xmalloc((conv2d_work_floats(DEVICE_CPU, &d) + 1) * F);
    float *aa = xmalloc(na * F), *wa = xmalloc(nw * F);
    for (size_t i = 0; i < na; i++) aa[i] = fabsf(a[i]);
    for (size_t i = 0; i < nw; i++) wa[i] = fabsf(wt[i]);
    conv2d_forward(DEVICE_CPU, &d, a, wt, NULL, y, work);
    conv2d_forward(DEVICE_CPU, &d, aa, wa, NULL, yabs, work);
    free(work), free(aa), free(wa);
}

// The first element of got (n) off ref by more than bound (per element), or n.
static size_t first_beyond(const float *got, const float *ref, const float *bound, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!(fabs((double)got[i] - ref[i]) <= bound[i])) return i;
    return n;
}

// The forward, stage by stage, against the arithmetic of the kit's own ops (elementwise, rigorous bounds):
//   a1  conv1 of x by this rank's k filters: a dot product of 9c terms per float, the same as the unsplit conv's
//       output channels [r k, (r + 1) k): within 2 gamma_{9c} sum|terms| of it (GEMMs of other shapes may sum
//       in another order; both sides are within gamma_{9c} sum|terms| of the exact value);
//   z   after g: conv2 of ALL ranks' a2 (gathered here over the test's own group) by the whole w2: the 9c terms
//       summed as T partial sums of 9k terms, then T - 1 additions in the all-reduce: within 2 gamma_{9c+T}
//       sum|terms| of one conv's sum, sum|terms| being conv2 of |a2| by |w2|.
// The reason into why ("" when right). The all-gather runs on every rank whatever a1 gave.
static void forward_problem(BlockCase *bc, char *why, size_t len) {
    TpBlock *b = &bc->tb->b;
    const int n = bc->n, c = b->c, k = b->k, h = b->h, w = b->w, hw = h * w, r = bc->r, T = bc->T;
    const size_t full = (size_t)n * c * hw, part = (size_t)n * k * hw;
    Whole W = whole_of(bc->st);
    why[0] = '\0';
    if (memcmp(bc->x, bc->x0, full * F) != 0)
        snprintf(why, len, "the block changed its input x (a sum over the group on it?): f's forward is the identity "
                 "(every rank of the group already holds the whole x, which the residual add and the layers before "
                 "need as they are)");
    float *y = xmalloc(full * F), *yabs = xmalloc(full * F), *mine = xmalloc(full * F), *bound = xmalloc(full * F);
    conv_and_abs(n, c, c, h, w, bc->x0, W.w1, y, yabs);
    take_channels(y, n, c, hw, r * k, k, mine);
    take_channels(yabs, n, c, hw, r * k, k, bound);
    for (size_t i = 0; i < part; i++) bound[i] *= 2.0 * gamma_k(9.0 * c);
    size_t i = first_beyond(b->a1, mine, bound, part);
    if (!why[0] && i < part)
        snprintf(why, len, "a1 (conv1's output, this rank's %d channels)%s: its float %zu is %.8g; conv1 of x by the "
                 "filters of output channels [%d, %d) gives %.8g", k,
                 isnan(b->a1[i]) ? " was never written (conv1 of x by blk->w1 into blk->a1)"
                                 : " is not conv1 of x by this rank's filters (blk->w1, k output channels)",
                 i, b->a1[i], r * k, (r + 1) * k, mine[i]);
    float *all = xmalloc(part * (size_t)T * F), *a2 = xmalloc(full * F);
    pg_allgather(bc->tensor, b->a2, all, part);
    for (int t = 0; t < T; t++)
        for (int s = 0; s < n; s++)
            memcpy(a2 + ((size_t)s * c + (size_t)t * k) * hw, all + (size_t)t * part + (size_t)s * k * hw,
                   (size_t)k * hw * F);
    conv_and_abs(n, c, c, h, w, a2, W.w2, y, yabs);
    for (size_t j = 0; j < full; j++) bound[j] = 2.0 * gamma_k(9.0 * c + T) * yabs[j];
    i = first_beyond(b->z, y, bound, full);
    if (!why[0] && i < full) {
        // This rank's partial sum alone: conv2 of its own channels of a2 by its slice of w2.
        float *own = xmalloc(full * F), *own_abs = xmalloc(full * F);
        conv_and_abs(n, k, c, h, w, b->a2, b->w2, own, own_abs);
        bool partial = fabs(b->z[i] - own[i]) <= 2.0 * gamma_k(9.0 * c) * own_abs[i];
        bool twice = fabs(b->z[i] - T * y[i]) <= 2.0 * T * gamma_k(9.0 * c + T) * yabs[i];
        snprintf(why, len, "z (conv2's output, after g)%s: its float %zu is %.8g; conv2 of every rank's a2 by the "
                 "whole w2 gives %.8g (bound %.2g)",
                 isnan(b->z[i]) ? " was never written (conv2 of blk->a2 by blk->w2 into blk->z)"
                 : partial ? " is this rank's PARTIAL sum (from its own k input channels only): conv2's output must "
                             "pass through g (the sum over the tensor group) before BN2 reads it"
                 : twice ? " is T x the sum: g applied twice?" : " is not the sum over the group of the partial convs",
                 i, b->z[i], y[i], bound[i]);
        free(own), free(own_abs);
    }
    free(all), free(a2);
    free(y), free(yabs), free(mine), free(bound);
}

// got (n) against ref normwise (TP_TOL of ref's largest): "" when within, else the reason (ratio and error).
static bool array_ok(const char *what, const float *got, const float *ref, size_t n, double *worst, char *why,
                     size_t len, const char *extra) {
    double e = rel_error(got, ref, n);
    *worst = e > *worst ? e : *worst;
    if (e <= TP_TOL) return true;
    Compare c = compare_arrays(got, ref, n);
    snprintf(why, len, "%s is off%s%s (%.3g x the unsplit block's; largest difference %.2g of its largest, tolerance "
             "%.0e)", what, fabs(c.ratio) < 0.02 ? ": nothing there (never computed?)" : "", extra, c.ratio, e, TP_TOL);
    return false;
}

// Everything else the block computed against the unsplit block, normwise (TP_TOL): the output, BN1's batch
// statistics on this rank's channels (over ITS OWN channels only: BN is per channel, so those are the whole BN's
// on the same channels) and BN2's, the running statistics, the input gradient and every parameter gradient. The
// reason into why, *worst the largest error seen.
static void block_problem(BlockCase *bc, char *why, size_t len, double *worst) {
    forward_problem(bc, why, len);
    if (why[0]) return;
    TpBlock *b = &bc->tb->b;
    const int n = bc->n, c = b->c, k = b->k, hw = b->h * b->w, r = bc->r, T = bc->T;
    const size_t full = (size_t)n * c * hw, kk = (size_t)k, cc = (size_t)c, wsz = kk * cc * 9;
    Whole W = whole_of(bc->st);
    const float *bn2_mean = bc->st->saved + bc->st->layers[4].saved_offset, *bn2_invstd = bn2_mean + c;
    float *tmp = xmalloc((full > wsz ? full : wsz) * F);
    char ch[64];
    snprintf(ch, sizeof ch, " (channels [%d, %d))", r * k, (r + 1) * k);
    bool ok = array_ok("the block's output blk->out", b->out, bc->ref_out, full, worst, why, len, "") &&
              array_ok("BN1's batch mean of this rank's channels", b->saved, W.mean1 + r * kk, kk, worst, why, len,
                       ": BN1 normalises each of this rank's channels over (N, H, W), which it holds whole") &&
              array_ok("BN1's batch invstd of this rank's channels", b->saved + kk, W.invstd1 + r * kk, kk, worst,
                       why, len, ch) &&
              array_ok("BN2's batch mean", b->saved + 2 * kk, bn2_mean, cc, worst, why, len,
                       ": BN2 reads the WHOLE sum of conv2 (after g)") &&
              array_ok("BN2's batch invstd", b->saved + 2 * kk + cc, bn2_invstd, cc, worst, why, len, "") &&
              array_ok("BN1's running mean", b->running, W.rm1 + r * kk, kk, worst, why, len, ch) &&
              array_ok("BN1's running variance", b->running + kk, W.rv1 + r * kk, kk, worst, why, len, ch) &&
              array_ok("BN2's running mean", b->running + 2 * kk, W.rm2, cc, worst, why, len, "") &&
              array_ok("BN2's running variance", b->running + 2 * kk + cc, W.rv2, cc, worst, why, len, "");
    if (ok) {  // dx, with what its pattern says
        const char *say = "";
        for (size_t i = 0; i < full; i++) tmp[i] = bc->ref_dx[i] + (float)(T - 1) * bc->dout[i];
        if (rel_error(b->dx, tmp, full) <= TP_TOL)
            say = ": the skip path's gradient (dout) was counted T times: it is the same on every rank, so it is "
                  "added once, AFTER f's all-reduce of the conv path's share";
        for (size_t i = 0; i < full && !say[0]; i++) tmp[i] = bc->ref_dx[i] - bc->dout[i];
        if (!say[0] && rel_error(b->dx, tmp, full) <= TP_TOL)
            say = ": the skip path's gradient (dout) is missing: x reached the output along the residual add too";
        for (size_t i = 0; i < full && !say[0]; i++) tmp[i] = (float)T * (bc->ref_dx[i] - bc->dout[i]) + bc->dout[i];
        if (!say[0] && rel_error(b->dx, tmp, full) <= TP_TOL)
            say = ": the conv path's share is T x too large: all-reduced twice?";
        for (size_t i = 0; i < full && !say[0]; i++) tmp[i] = bc->ref_dx[i] - bc->dout[i];
        if (!say[0] && T > 1 && rel_error(bc->dx_summed, tmp, full) <= TP_TOL)
            say = ": it is only THIS rank's share of the conv path (the sum of every rank's is right): f's backward "
                  "must sum conv1's input gradient over the tensor group";
        ok = array_ok("the input gradient blk->dx", b->dx, bc->ref_dx, full, worst, why, len, say);
    }
    if (ok) {
        for (size_t f = 0; f < cc; f++) memcpy(tmp + f * kk * 9, W.dw2 + (f * cc + (size_t)r * kk) * 9, kk * 9 * F);
        ok = array_ok("conv1's weight gradient dw1 (this rank's filters)", b->dw1, W.dw1 + (size_t)r * wsz, wsz, worst,
                      why, len, "") &&
             array_ok("conv2's weight gradient dw2 (this rank's input channels)", b->dw2, tmp, wsz, worst, why, len,
                      "") &&
             array_ok("BN1's gamma gradient", b->dg1, W.dg1 + r * kk, kk, worst, why, len, ch) &&
             array_ok("BN1's beta gradient", b->db1, W.db1 + r * kk, kk, worst, why, len, ch) &&
             array_ok("BN2's gamma gradient", b->dg2, W.dg2, cc, worst, why, len, "") &&
             array_ok("BN2's beta gradient", b->db2, W.db2, cc, worst, why, len, "");
    }
    free(tmp);
}

// Every block of ResNet-9 (16 and 64 channels) on tensor groups of 2 (two side by side) and 4. `judge` gives the
// verdict on one case; the first failure is printed by the ranks that saw it and fails the test everywhere.
typedef void (*BlockJudge)(BlockCase *bc, char *why, size_t len, double *worst);

static void blocks_on_groups(ProcessGroup *world, BlockJudge judge, double *worst) {
    for (size_t l = 0; l < sizeof BLOCKS / sizeof BLOCKS[0]; l++)
        for (int T = 2; T <= WORLD; T *= 2) {
            BlockCase bc = block_case(world, BLOCKS[l], T);
            block_run(&bc);
            char why[800];
            judge(&bc, why, sizeof why, worst);
            if (why[0])
                print_error("%s [rank %d; the block at layer %d, %d channels of %d x %d, split over T = %d: "
                            "tensor rank %d]\n", why, pg_rank(world), bc.layer, bc.tb->b.c, bc.tb->b.h, bc.tb->b.w, T, bc.r);
            bool ok = all_ranks(world, !why[0]);
            block_case_free(&bc);
            if (!ok) fail();
        }
}

// The traffic of one block: forward exactly ONE collective call of (n, c, h, w) floats (g: conv1, the column
// conv, needs none), backward exactly one of the same size (f); no message.
static void traffic_judge(BlockCase *bc, char *why, size_t len, double *worst) {
    (void)worst;
    const TpBlock *b = &bc->tb->b;
    const unsigned long long want = 4ull * bc->n * b->c * b->h * b->w, part = want / (unsigned long long)bc->T;
    why[0] = '\0';
    for (int pass = 0; pass < 2 && !why[0]; pass++) {
        const PgTraffic *t = pass == 0 ? &bc->fwd : &bc->bwd;
        const char *name = pass == 0 ? "forward" : "backward", *op = pass == 0 ? "g" : "f";
        const char *rule = pass == 0 ? "the column-parallel conv1 needs NO communication (f's forward is the "
                                       "identity); g sums conv2's partial output (n, c, h, w) once, before BN2"
                                     : "g's backward is the identity; f's backward sums conv1's input gradient "
                                       "(n, c, h, w) once; BN1 and BN2 act on channels each rank holds whole";
        if (t->p2p_msgs || t->coll_calls != 1 || t->coll_bytes_in != want)
            snprintf(why, len, "the block's %s handed %llu collective call(s) of %llu bytes in all (and %llu "
                     "message(s)) to the tensor group; expected ONE all-reduce (%s) of (n, c, h, w) = %llu bytes%s: %s",
                     name, (unsigned long long)t->coll_calls, (unsigned long long)t->coll_bytes_in,
                     (unsigned long long)t->p2p_msgs, op, want,
                     t->coll_calls == 0 ? " (none: a rank's partial result was used as if whole)"
                     : t->coll_calls == 2 ? " (two: doubled, or f and g both in one direction)"
                     : t->coll_calls == 1 && t->coll_bytes_in == part ? " (yours is the size of this rank's k "
                                                                         "channels: the all-reduce is on the wrong "
                                                                         "tensor)"
                     : "", rule);
    }
}

// TODO 2a, 2b: the block's communication, counted by pg_traffic.
static void test_block_traffic(void **state) {
    (void)state;
    ProcessGroup *world = world_of_four();
    require_operators(world);
    blocks_on_groups(world, traffic_judge, NULL);
    if (pg_rank(world) == 0)
        print_message("every block, T = 2 and 4: forward one all-reduce of (n, c, h, w) (g), backward one (f)\n");
}

// TODO 2a, 2b: the block split over T = 2 and T = 4 equals the unsplit block.
static void test_block_equals_unsplit(void **state) {
    (void)state;
    ProcessGroup *world = world_of_four();
    require_operators(world);
    double worst = 0.0;
    blocks_on_groups(world, block_problem, &worst);
    worst = max_over_ranks(world, worst);
    if (pg_rank(world) == 0)
        print_message("every block, T = 2 and 4: output, statistics, dx and gradients equal the unsplit block's "
                      "(largest difference %.2g of the largest value; tolerance %.0e)\n", worst, TP_TOL);
}

// ---------------------------------------------------------------- TODO 3: which layers can be split

// tp_is_block on a table against the answer, or the reason it is wrong.
static void is_block_case(const Model *t, int i, int T, bool want, const char *what, char *why, size_t len) {
    if (why[0]) return;
    bool got = tp_is_block(t, i, T);
    if (got != want)
        snprintf(why, len, "tp_is_block(%s, layer %d, T %d) = %s, expected %s", what, i, T, got ? "true" : "false",
                 want ? "true" : "false");
}

// The problems of TODO 3 on ResNet-9's table (blocks at 7, 16 channels, and 22, 64 channels), on tables with one
// thing changed, and on tiny-bn (no block); the reason into why ("" when right).
static void is_block_problem(char *why, size_t len) {
    ModelConfig cfg = resnet9();
    Model *m = model_create(&cfg, DEVICE_CPU, 1, 42);
    why[0] = '\0';
    static const int Ts[] = {1, 2, 4, 8, 16, 3, 32, 64, 5};
    for (size_t t = 0; t < sizeof Ts / sizeof Ts[0] && !why[0]; t++)
        for (int i = -1; i <= m->n_layers && !why[0]; i++) {
            int T = Ts[t];
            bool want = (i == 7 && 16 % T == 0) || (i == 22 && 64 % T == 0);
            char what[160];
            snprintf(what, sizeof what, "resnet9 width 8 (%s)",
                     i == 7 ? "layers 7-13: conv, BN, ReLU, conv, BN, ReLU, add of layer 6's output and 12's; 16 "
                              "channels"
                     : i == 22 ? "layers 22-28: conv, BN, ReLU, conv, BN, ReLU, add of layer 21's output and 27's; "
                                 "64 channels"
                     : "not the first layer of a residual block");
            is_block_case(m, i, T, want, what, why, len);
            if (why[0] && (i == 7 || i == 22) && !want) {
                size_t u = strlen(why);
                snprintf(why + u, len - u, ": T must divide the block's channels");
            }
        }
    // One thing changed in a copy of the table: each makes block 22 something the split cannot compute.
    static const struct {
        const char *what;
        int layer, field, value;  // field: 0 kind, 1 in, 2 in2, 3 ksize, 4 stride, 5 bias, 6 out_c
    } CHANGES[] = {
        {"the add reading conv2's BN (layer 26) instead of its ReLU", 28, 2, 26},
        {"the add reading layer 20 instead of the block's input (21)", 28, 1, 20},
        {"conv2 reading layer 23 (BN1) instead of the ReLU", 25, 1, 23},
        {"conv1 reading layer 20 instead of the block's input (21)", 22, 1, 20},
        {"conv1 of kernel 1", 22, 3, 1},
        {"conv2 of stride 2", 25, 4, 2},
        {"conv1 with a bias", 22, 5, 1},
        {"layer 24 a max-pool instead of a ReLU", 24, 0, LAYER_MAXPOOL},
        {"layer 28 a ReLU instead of the add", 28, 0, LAYER_RELU},
    };
    Model *c = xmalloc(sizeof *c);
    for (size_t k = 0; k < sizeof CHANGES / sizeof CHANGES[0] && !why[0]; k++) {
        memcpy(c, m, sizeof *c);
        Layer *l = &c->layers[CHANGES[k].layer];
        switch (CHANGES[k].field) {
        case 0: l->kind = (LayerKind)CHANGES[k].value; break;
        case 1: l->in = CHANGES[k].value; break;
        case 2: l->in2 = CHANGES[k].value; break;
        case 3: l->ksize = CHANGES[k].value; break;
        case 4: l->stride = CHANGES[k].value; break;
        case 5: l->bias = CHANGES[k].value != 0; break;
        default: l->out_c = CHANGES[k].value; break;
        }
        char what[128];
        snprintf(what, sizeof what, "resnet9 with %s", CHANGES[k].what);
        is_block_case(c, 22, 2, false, what, why, len);
        is_block_case(c, 7, 2, true, what, why, len);  // the other block is still one
    }
    free(c);
    model_free(m);
    if (!why[0]) {
        ModelConfig tb;
        assert_true(model_config(&tb, "tiny-bn", 8, 3, 32, 32, 10));
        Model *t = model_create(&tb, DEVICE_CPU, 1, 42);
        for (int i = 0; i < t->n_layers && !why[0]; i++) is_block_case(t, i, 1, false, "tiny-bn (no add)", why, len);
        model_free(t);
    }
}

static void test_is_block(void **state) {
    (void)state;
    char why[400];
    is_block_problem(why, sizeof why);
    if (why[0]) {
        print_error("%s\n", why);
        fail();
    }
}

// ---------------------------------------------------------------- TODO 4: the grid

// tp_grid against its definition: tensor groups of T CONSECUTIVE ranks (rank = replica x T + tp_rank); false
// when T does not divide the world. The reason into why.
static void grid_problem(char *why, size_t len) {
    static const int cases[][3] = {  // rank, world, T
        {0, 4, 2}, {1, 4, 2}, {2, 4, 2}, {3, 4, 2}, {3, 4, 4}, {2, 4, 1}, {5, 8, 4}, {6, 8, 2}, {7, 8, 8},
        {4, 6, 3}, {0, 6, 4}, {1, 3, 2}, {0, 1, 1},
    };
    why[0] = '\0';
    for (size_t i = 0; i < sizeof cases / sizeof cases[0] && !why[0]; i++) {
        const int rank = cases[i][0], world = cases[i][1], T = cases[i][2];
        const bool exists = world % T == 0;
        TpGrid g = {-1, -1, -1, -1};
        bool ok = tp_grid(rank, world, T, &g);
        if (!exists && ok)
            snprintf(why, len, "tp_grid(rank %d, world %d, tp %d) returned true: %d ranks are not tensor groups of %d",
                     rank, world, T, world, T);
        else if (exists && !ok)
            snprintf(why, len, "tp_grid(rank %d, world %d, tp %d) returned false", rank, world, T);
        else if (exists && (g.tp != T || g.dp != world / T || g.tp_rank != rank % T || g.replica != rank / T))
            snprintf(why, len, "tp_grid(rank %d, world %d, tp %d) = tensor rank %d of %d, replica %d of %d; expected "
                     "tensor rank %d of %d, replica %d of %d: a tensor group is T CONSECUTIVE ranks (rank = replica x "
                     "T + tp_rank)%s", rank, world, T, g.tp_rank, g.tp, g.replica, g.dp, rank % T, T, rank / T,
                     world / T, g.tp_rank == rank / (world / T) && g.replica == rank % (world / T)
                                    ? ": yours puts the DATA dimension inside (consecutive ranks in one data group)"
                                    : "");
    }
}

static void test_grid(void **state) {
    (void)state;
    char why[400];
    grid_problem(why, sizeof why);
    if (why[0]) {
        print_error("%s\n", why);
        fail();
    }
}

// group_members, members_text: tests/mpi_testutil.h.

// tp_groups for tensor groups of T on the world of 4, against the definition, or the reason they are wrong; the
// same verdict on every rank. The groups are freed.
static bool groups_ok(ProcessGroup *world, int T, char *why, size_t len) {
    const int rank = pg_rank(world);
    TpGrid g = {.tp = T, .dp = WORLD / T, .tp_rank = rank % T, .replica = rank / T};
    ProcessGroup *tensor = NULL, *data = NULL;
    tp_groups(world, &g, &tensor, &data);
    why[0] = '\0';
    if (!all_ranks(world, tensor && data)) {
        snprintf(why, len, "tp_groups left a group NULL on some rank (pg_split makes them)");
        return false;
    }
    unsigned want_t = 0, want_d = 0;
    for (int r = 0; r < WORLD; r++) {
        want_t |= (unsigned)(r / T == g.replica) << r;
        want_d |= (unsigned)(r % T == g.tp_rank) << r;
    }
    unsigned t_bits = group_members(world, tensor), d_bits = group_members(world, data);
    char a[32], b[32];
    if (t_bits != want_t) {
        members_text(t_bits, a, sizeof a), members_text(want_t, b, sizeof b);
        snprintf(why, len, "T = %d: rank %d's tensor group is ranks %s; the T ranks of its replica %d are %s%s", T,
                 rank, a, g.replica, b, t_bits == want_d ? " (yours is its DATA group: color and key swapped?)" : "");
    } else if (d_bits != want_d) {
        members_text(d_bits, a, sizeof a), members_text(want_d, b, sizeof b);
        snprintf(why, len, "T = %d: rank %d's data group is ranks %s; the ranks with its tensor rank %d (one per "
                 "replica) are %s", T, rank, a, g.tp_rank, b);
    } else if (pg_rank(tensor) != g.tp_rank || pg_rank(data) != g.replica) {
        snprintf(why, len, "T = %d: rank %d is rank %d of its tensor group (expected its tensor rank, %d) and rank %d "
                 "of its data group (expected its replica, %d): the key of pg_split orders the group", T, rank,
                 pg_rank(tensor), g.tp_rank, pg_rank(data), g.replica);
    }
    if (why[0]) print_error("%s\n", why);
    bool ok = all_ranks(world, !why[0]);
    pg_finalize(data), pg_finalize(tensor);
    return ok;
}

// The grid (4a) and the groups (4b) for T = 1, 2 and 4 on the world of 4, or "".
static bool grid_and_groups_ok(ProcessGroup *world, char *why, size_t len) {
    grid_problem(why, len);
    if (why[0]) return false;
    for (int T = 1; T <= WORLD; T *= 2)
        if (!groups_ok(world, T, why, len)) return false;
    return true;
}

static void test_groups(void **state) {
    (void)state;
    ProcessGroup *world = world_of_four();
    char why[400];
    grid_problem(why, sizeof why);
    grading_require_todo(!why[0], "4a", "%s", why);
    for (int T = 1; T <= WORLD; T *= 2)
        if (!groups_ok(world, T, why, sizeof why)) fail();
}

// TODO 4c: on the 2 x 2 grid with a global batch of 32, each rank reads its REPLICA's shard (the sampler's rank and
// world are the replica's and the replicas') in local batches of 16, so that the T ranks of a tensor group read
// the same images.
static void test_data_by_replica(void **state) {
    (void)state;
    ProcessGroup *world = world_of_four();
    char why[400];
    grid_problem(why, sizeof why);
    grading_require_todo(!why[0], "4a", "%s", why);
    const int T = 2, rank = pg_rank(world);
    TpGrid g = {.tp = T, .dp = WORLD / T, .tp_rank = rank % T, .replica = rank / T};
    static char name[] = "train";
    char *argv[] = {name, NULL};
    TrainOptions o;
    cli_parse(&o, 1, argv, CLI_DIST);
    o.dataset = "synthetic", o.batch_size = 2 * BATCH, o.seed = 7;
    cli_apply_dataset_defaults(&o);
    TrainData td;
    tp_data_open(&td, &o, &g);
    const Sampler *s = &td.train_sampler;
    loader_start_epoch(td.train_loader, 0, 0);
    const Batch *b = loader_next(td.train_loader, NULL);
    why[0] = '\0';
    if (s->world != g.dp || s->rank != g.replica)
        snprintf(why, sizeof why, "rank %d (tensor rank %d of replica %d) reads shard %d of %d; the data is split "
                 "between the %d REPLICAS: shard %d of %d, the same for the %d ranks of its tensor group (they compute "
                 "one model's step on the same images)", rank, g.tp_rank, g.replica, s->rank, s->world, g.dp,
                 g.replica, g.dp, T);
    else if (!b || b->n != o.batch_size / g.dp)
        snprintf(why, sizeof why, "rank %d: a local batch of %d images; the global --batch-size %d is split between "
                 "the %d replicas: %d each", rank, b ? b->n : 0, o.batch_size, g.dp, o.batch_size / g.dp);
    if (why[0]) print_error("%s\n", why);
    bool ok = all_ranks(world, !why[0]);
    if (ok) {  // the same images on the ranks of a tensor group, other images in the other replica
        ProcessGroup *tensor = own_tensor_group(world, T);
        size_t nf = (size_t)b->n * IMAGE;
        bool same = pg_identical(tensor, b->x, nf), across = pg_identical(world, b->x, nf);
        if (!same) print_error("rank %d: the ranks of tensor group %d read different images\n", rank, g.replica);
        else if (across) print_error("every replica read the same images: the replicas' shards must differ\n");
        ok = all_ranks(world, same && !across);
        pg_finalize(tensor);
    }
    train_data_close(&td);
    if (!ok) fail();
}

// ---------------------------------------------------------------- the whole Tp (tp_create is given)

// What tp_create needs to work at all: the shards (1a, 1b: block_scatter cuts with them), f and g (1c), which
// layers are blocks (3), the grid and its groups (4a, 4b). Fails the test with "fix TODO ... first" otherwise.
static void require_tp_create(ProcessGroup *world) {
    char why[700];
    split_problem(true, why, sizeof why);
    grading_require_todo(!why[0], "1a", "%s", why);
    split_problem(false, why, sizeof why);
    grading_require_todo(!why[0], "1b", "%s", why);
    require_operators(world);
    is_block_problem(why, sizeof why);
    grading_require_todo(!why[0], "3", "%s", why);
    grid_problem(why, sizeof why);
    grading_require_todo(!why[0], "4a", "%s", why);
    bool ok = grid_and_groups_ok(world, why, sizeof why);
    grading_require_todo(ok, "4b", "%s", why[0] ? why : "the groups are wrong on another rank");
}

// Sets every piece's gradient to (world rank + 1) x (i + 1) and averages it: it must become the mean over the
// ranks holding the same tensors (the data group): the reason into why ("" when right; every rank the same).
static bool average_ok(ProcessGroup *world, Tp *tp, char *why, size_t len) {
    const TpGrid *g = &tp->grid;
    const int rank = pg_rank(world);
    for (int p = 0; p < tp->n_pieces; p++) {
        TpPiece *pc = &tp->pieces[p];
        float *grads = pc->stage ? pc->stage->grads : pc->block->grads;
        size_t n = pc->stage ? pc->stage->n_params : pc->block->n_params;
        for (size_t i = 0; i < n; i++) grads[i] = (float)((rank + 1) * (double)(i + 1));
    }
    tp_average_grads(tp);
    double want = 0.0, all = 0.0, tensor_mean = 0.0;  // per unit of (i + 1)
    for (int r = 0; r < WORLD; r++) {
        all += (r + 1) / (double)WORLD;
        if (r % g->tp == g->tp_rank) want += (r + 1) / (double)g->dp;
        if (r / g->tp == g->replica) tensor_mean += (r + 1) / (double)g->tp;
    }
    why[0] = '\0';
    for (int p = 0; p < tp->n_pieces && !why[0]; p++) {
        TpPiece *pc = &tp->pieces[p];
        const float *grads = pc->stage ? pc->stage->grads : pc->block->grads;
        size_t n = pc->stage ? pc->stage->n_params : pc->block->n_params;
        for (size_t i = 0; i < n && !why[0]; i++) {
            double got = grads[i] / (double)(i + 1);
            if (fabs(got - want) <= 1e-6 * want) continue;
            snprintf(why, len, "T = %d, D = %d: rank %d, %s (layers %d-%d): gradient[%zu] is %g x (i + 1) after "
                     "tp_average_grads, expected %g x: the mean over the ranks holding the same tensors (its data "
                     "group)%s", g->tp, g->dp, rank, pc->stage ? "replicated layers" : "a block's slices", pc->first,
                     pc->last - 1, i, got, want,
                     g->dp > 1 && fabs(got - all) < 1e-6 * all ? ": you averaged over the WORLD, mixing different "
                                                                 "slices of a block"
                     : g->tp > 1 && fabs(got - tensor_mean) < 1e-6 * tensor_mean
                         ? ": you averaged over the TENSOR group: the ranks of a tensor group hold different slices "
                           "(and the replicated layers' gradients are equal there already)"
                     : fabs(got - (rank + 1)) < 1e-6 * (rank + 1) ? ": nothing was averaged"
                     : fabs(got - want * g->dp) < 1e-6 * want * g->dp ? ": summed, not averaged"
                     : isnan(got) ? ": NaN" : "");
        }
    }
    if (why[0]) print_error("%s\n", why);
    return all_ranks(world, !why[0]);
}

// TODO 4d: on the 2 x 2 grid the data group's mean; with T = 4 (one replica) nothing to average.
static void test_average_grads(void **state) {
    (void)state;
    ProcessGroup *world = world_of_four();
    require_tp_create(world);
    ModelConfig cfg = resnet9();
    char why[600];
    bool ok = true;
    for (int T = 2; T <= WORLD && ok; T *= 2) {
        Tp *tp = tp_create(world, T, &cfg, DEVICE_CPU, BATCH, 42);
        ok = average_ok(world, tp, why, sizeof why);
        tp_free(tp);
    }
    if (!ok) fail();
}

// ---------------------------------------------------------------- the step of the whole Tp

// n synthetic images and labels (host), the same on every rank; a different batch each step.
static void make_images(int n, int step, float **x, int **y) {
    Dataset ds;
    dataset_synthetic(&ds, n, 10, 3, 32, 32, 7 + (uint64_t)step, SPLIT_TRAIN);
    *x = xmalloc((size_t)n * IMAGE * F);
    *y = xmalloc((size_t)n * sizeof(int));
    int *idx = xmalloc((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) idx[i] = i;
    dataset_fill_batch(&ds, idx, n, NULL, 7, 0, *x, *y);
    free(idx);
    dataset_free(&ds);
}

// STEPS steps of a Tp of T tensor ranks on pg (its world: D = world / T replicas, each on its share of a global
// batch of BATCH images) against one process's kit model on the whole batch (train_forward_backward with
// 1/BATCH, then optim_step), from the same initial weights (tp_create's seed). After every step: the weights
// gathered from the pieces (tp_gather_model) within TP_TOL of the reference's move since the start, the BN
// running statistics within TP_TOL of the reference's (normwise), the loss over the replicas within TP_TOL; and
// what must agree does, bit for bit: a replicated piece on every rank of pg, a slice on every rank of its data
// group. The reason into why; *worst the largest error seen.
static bool tp_vs_one_process(ProcessGroup *pg, int T, const char *label, char *why, size_t len, double *worst) {
    ModelConfig cfg = resnet9();
    const int D = pg_world(pg) / T, local = BATCH / D;
    Tp *tp = tp_create(pg, T, &cfg, DEVICE_CPU, local, 42);
    Model *ref = model_create(&cfg, DEVICE_CPU, BATCH, 42), *got = model_create(&cfg, DEVICE_CPU, 1, 42);
    float *start = xmalloc(ref->n_params * F);
    memcpy(start, ref->params, ref->n_params * F);
    ProcessGroup *data = pg_split(pg, pg_rank(pg) % T, pg_rank(pg) / T);  // the test's own: same tensor rank
    why[0] = '\0';
    for (int step = 0; step < STEPS && !why[0]; step++) {
        float *x;
        int *y;
        make_images(BATCH, step, &x, &y);
        const int replica = pg_rank(pg) / T;
        Batch mine = {.n = local, .x = x + (size_t)replica * local * IMAGE, .y = y + replica * local};
        Batch all = {.n = BATCH, .x = x, .y = y};
        Metrics m = tp_step(tp, &mine, &OPT, 0.0f);
        Metrics r = train_forward_backward(ref, &all, 0.0f, 1.0f / BATCH);
        optim_step(ref, &OPT);
        double sums[2] = {m.loss_sum, (double)m.count};
        pg_allreduce_sum_double_host(pg, sums, 2);
        tp_gather_model(tp, got);
        double move = move_error(got->params, ref->params, start, ref->n_params);
        double stats = rel_error(got->buffers, ref->buffers, ref->n_buffers);
        double loss = fabs(sums[0] - r.loss_sum) / fabs(r.loss_sum);
        *worst = fmax(*worst, fmax(move, fmax(stats, loss)));
        // What must agree, bit for bit (the test's own groups): replicated pieces over pg, slices over data.
        int split_first = -1, repl_first = -1;
        for (int p = 0; p < tp->n_pieces; p++) {
            const TpPiece *pc = &tp->pieces[p];
            bool same = pc->stage ? pg_identical(pg, pc->stage->params, pc->stage->n_params)
                                  : pg_identical(data, pc->block->params, pc->block->n_params) &&
                                        pg_identical(pg, pc->block->g2, 2 * (size_t)pc->block->c);
            same = all_ranks(pg, same);
            if (!same && pc->stage && repl_first < 0) repl_first = p;
            if (!same && pc->block && split_first < 0) split_first = p;
        }
        if (sums[1] != BATCH)
            snprintf(why, len, "%s, step %d: the step counted %g images over the replicas, the global batch has %d "
                     "(tensor rank 0 of each replica counts its replica's)", label, step + 1, sums[1], BATCH);
        else if (repl_first >= 0)
            snprintf(why, len, "%s, step %d: the replicated layers %d-%d differ between ranks: they trained on "
                     "different gradients. Before a block, the gradient of its input must be WHOLE and the same on "
                     "every rank of the tensor group (f's backward all-reduce, TODO 2b), and %s", label, step + 1,
                     tp->pieces[repl_first].first, tp->pieces[repl_first].last - 1,
                     D > 1 ? "the replicas average every gradient over the data group (TODO 4d)"
                           : "nothing else may change them on one rank only");
        else if (split_first >= 0)
            snprintf(why, len, "%s, step %d: the copies of the block at layer %d differ between ranks holding the "
                     "same slice (its data group), or its replicated BN2 between tensor ranks: %s", label, step + 1,
                     tp->pieces[split_first].first,
                     D > 1 ? "the data group averages every gradient of the slices (TODO 4d)"
                           : "BN2 sees the whole sum (after g) on every rank");
        else if (!(loss <= TP_TOL))
            snprintf(why, len, "%s, step %d: the loss over the replicas is %.6g, one process on the batch: %.6g: the "
                     "forward through the pieces is wrong", label, step + 1, sums[0], r.loss_sum);
        else if (!(move <= TP_TOL)) {
            Compare c = compare_arrays(got->params, ref->params, ref->n_params);
            snprintf(why, len, "%s, step %d: the weights gathered from the pieces are %.3g of the reference's move "
                     "since the start off one process's (tolerance %.0e; weights %.4g x)%s", label, step + 1, move,
                     TP_TOL, c.ratio,
                     D > 1 ? ": with D > 1, is every piece's gradient averaged over the data group (not summed, not "
                             "over another group), and BN over the replicas' batch?" : "");
        } else if (!(stats <= TP_TOL))
            snprintf(why, len, "%s, step %d: the BN running statistics gathered from the pieces are off one "
                     "process's by %.3g of their largest (tolerance %.0e)", label, step + 1, stats, TP_TOL);
        free(x), free(y);
    }
    if (why[0]) print_error("rank %d: %s\n", pg_rank(pg), why);
    bool ok = all_ranks(pg, !why[0]);
    pg_finalize(data);
    free(start);
    model_free(ref), model_free(got);
    tp_free(tp);
    return ok;
}

// TODO 2 + 4: TP = 2 (two worlds of 2 side by side), TP = 4, and the 2 x 2 grid, each STEPS steps, equal to one
// process on the global batch.
static void test_step_equals_one_process(void **state) {
    (void)state;
    ProcessGroup *world = world_of_four();
    require_tp_create(world);
    char why[800];
    double worst = 0.0;
    ProcessGroup *half = pg_split(world, pg_rank(world) / 2, pg_rank(world));
    bool ok = all_ranks(world, tp_vs_one_process(half, 2, "TP = 2 (a world of 2)", why, sizeof why, &worst));
    pg_finalize(half);
    if (ok) ok = tp_vs_one_process(world, 4, "TP = 4", why, sizeof why, &worst);
    if (ok) ok = tp_vs_one_process(world, 2, "TP = 2 x DP = 2", why, sizeof why, &worst);
    if (!ok) fail();
    worst = max_over_ranks(world, worst);
    if (pg_rank(world) == 0)
        print_message("TP = 2, TP = 4, 2 x 2 grid: %d steps equal one process (largest error %.2g; tolerance %.0e)\n",
                      STEPS, worst, TP_TOL);
}

// The bytes of one step against the arithmetic (tp_expected_traffic, given), exactly: the tensor group's calls
// and bytes (f and g), and with D > 1 the data group's (the gradient average and BN's statistics).
static bool traffic_ok(ProcessGroup *world, int T, char *why, size_t len) {
    ModelConfig cfg = resnet9();
    const int D = WORLD / T, local = BATCH / D;
    Tp *tp = tp_create(world, T, &cfg, DEVICE_CPU, local, 42);
    float *x;
    int *y;
    make_images(BATCH, 0, &x, &y);
    Batch mine = {.n = local, .x = x + (size_t)tp->grid.replica * local * IMAGE, .y = y + tp->grid.replica * local};
    PgTraffic t0 = pg_traffic(tp->tensor), d0 = pg_traffic(tp->data), w0 = pg_traffic(tp->world);
    tp_step(tp, &mine, &OPT, 0.0f);
    PgTraffic t = traffic_delta(t0, pg_traffic(tp->tensor)), d = traffic_delta(d0, pg_traffic(tp->data));
    PgTraffic w = traffic_delta(w0, pg_traffic(tp->world));
    TpTraffic e = tp_expected_traffic(tp, local);
    why[0] = '\0';
    if (t.coll_calls != e.tensor_calls || t.coll_bytes_in != e.tensor_bytes || t.p2p_msgs)
        snprintf(why, len, "T = %d, D = %d: the step handed the tensor group %llu bytes in %llu calls (and %llu "
                 "messages); the arithmetic: %llu bytes in %llu all-reduces, one of (n, c, h, w) forward (g) and one "
                 "backward (f) per block, %d blocks", T, D, (unsigned long long)t.coll_bytes_in,
                 (unsigned long long)t.coll_calls, (unsigned long long)t.p2p_msgs, (unsigned long long)e.tensor_bytes,
                 (unsigned long long)e.tensor_calls, tp->n_blocks);
    else if (D > 1 && (d.coll_calls != e.data_calls || d.coll_bytes_in != e.data_bytes || d.p2p_msgs))
        snprintf(why, len, "T = %d, D = %d: the step handed the data group %llu bytes in %llu calls; the "
                 "arithmetic: %llu bytes in %llu calls (one average of every piece's gradients, %zu floats on this "
                 "rank, and BN's statistics forward and backward)%s", T, D, (unsigned long long)d.coll_bytes_in,
                 (unsigned long long)d.coll_calls, (unsigned long long)e.data_bytes, (unsigned long long)e.data_calls,
                 tp_local_params(tp), w.coll_calls ? ": some of it went to the WORLD group instead" : "");
    else if (w.coll_calls || w.p2p_msgs)
        snprintf(why, len, "T = %d, D = %d: the step handed the WORLD group %llu calls (%llu bytes): a step talks to "
                 "the tensor group and the data group only", T, D, (unsigned long long)w.coll_calls,
                 (unsigned long long)w.coll_bytes_in);
    if (why[0]) print_error("rank %d: %s\n", pg_rank(world), why);
    else if (pg_rank(world) == 0)
        print_message("T = %d, D = %d, rank 0: tensor group %llu bytes in %llu calls, data group %llu bytes in %llu "
                      "calls: the arithmetic's\n", T, D, (unsigned long long)t.coll_bytes_in,
                      (unsigned long long)t.coll_calls, (unsigned long long)d.coll_bytes_in,
                      (unsigned long long)d.coll_calls);
    free(x), free(y);
    tp_free(tp);
    return all_ranks(world, !why[0]);
}

static void test_step_traffic(void **state) {
    (void)state;
    ProcessGroup *world = world_of_four();
    require_tp_create(world);
    char why[600];
    if (!traffic_ok(world, 4, why, sizeof why) || !traffic_ok(world, 2, why, sizeof why)) fail();
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_out),
        cmocka_unit_test(test_split_in),
        cmocka_unit_test(test_f_and_g),
        cmocka_unit_test(test_block_traffic),
        cmocka_unit_test(test_block_equals_unsplit),
        cmocka_unit_test(test_is_block),
        cmocka_unit_test(test_grid),
        cmocka_unit_test(test_groups),
        cmocka_unit_test(test_data_by_replica),
        cmocka_unit_test(test_average_grads),
        cmocka_unit_test(test_step_equals_one_process),
        cmocka_unit_test(test_step_traffic),
    };
    return grading_run(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
