// tests/lesson09/test_lesson09.c: the autograder for lesson 09 (the learner's zero.c: the collectives a sharded
// model is made of, ZeRO stages 1-3 and recomputation).
//
// Built with Open MPI and run on GRADE_NP = 3 ranks (solutions/09-zero/lesson.mk): an odd world, so that most
// lengths do not divide evenly and the last shards carry padding. Every rank runs the same test and
// reports its own verdict (tests/grading.h); a test passes only when it passes on every rank.
//
// The references are independent of the learner's code:
//   - the collectives against MPI itself, over a communicator of the test's own with the same ranks
//     (MPI_Allreduce, then this rank's slice; an MPI_Allgather of the shards), for lengths below, at and just
//     above a multiple of the world;
//   - each stage's step against lesson 03's ddp_step (its solution is linked in) from IDENTICAL state: before
//     every step the reference model gets the learner's parameters, momentum and BN buffers, gathered here by
//     the test's own code, so that each step is judged alone and a wrong momentum shows in the step it breaks;
//   - memory from the kit's allocation counters (kit/mem.h, mem_stats), not from what the code says it holds;
//   - recomputation against the same stage without it, bit for bit.
// The collectives, the stages and recomputation run again on smaller worlds carved out of the grading one
// (pg_split): ranks 0-1 as a world of 2 and rank 2 alone as a world of 1 (no padding, nothing to shard); the
// memory tests on the grading world only.
//
// No test may hang: every decision that changes which collectives run is taken from values every rank has
// (max_over_ranks), and the process group has a short timeout. Hints for failures are in hints.tsv.
#include <mpi.h>

#include "tests/testutil.h"
#include "tests/grading.h"
#include "tests/mpi_testutil.h"

#include "kit/data.h"
#include "kit/device.h"
#include "kit/dist.h"
#include "kit/model.h"
#include "kit/optim.h"
#include "kit/train.h"
#include "lesson.h"

enum { LOCAL_BATCH = 8, IMAGE = 3 * 32 * 32, STEPS = 2 };
#define TEST_TIMEOUT_S 20.0  // a lost collective ends the test's job within this (a loaded machine is slow)

static const SgdConfig OPT = {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-4f, .nesterov = false};

static ProcessGroup *test_world(void) { return test_pg_named("test_lesson09", TEST_TIMEOUT_S); }

// The worlds every test runs on: the grading world itself, then (when it has more than one rank) a split of it:
// ranks [0, world - 1) as one group and the last rank alone, so that a world of 1 and an even world are seen
// too. Free a split with pg_finalize.
static ProcessGroup *split_world(ProcessGroup *world) {
    int w = pg_world(world), r = pg_rank(world);
    return pg_split(world, r == w - 1 ? 1 : 0, r);
}

static ModelConfig config(const char *name) {
    ModelConfig cfg;
    // ResNet-9 at width 8 (not its default 64): the same layer table, residual blocks included, in a second.
    assert_true(model_config(&cfg, name, strcmp(name, "resnet9") == 0 ? 8 : 0, 3, 32, 32, 10));
    return cfg;
}

// ---------------------------------------------------------------- TODO 1a: the layout of a shard

// shard_layout against its definition for many (n, world), or the reason it is wrong ("" when right).
static void layout_problem(char *why, size_t len) {
    static const size_t ns[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 16, 17, 100, 101, 216, 1152, 1586, 36864, 100003};
    why[0] = '\0';
    for (int world = 1; world <= 8 && !why[0]; world++)
        for (size_t i = 0; i < sizeof ns / sizeof ns[0] && !why[0]; i++) {
            size_t n = ns[i], shard = (n + (size_t)world - 1) / (size_t)world;
            ShardLayout l = shard_layout(n, world);
            if (l.n == n && l.shard == shard && l.padded == shard * (size_t)world) continue;
            snprintf(why, len, "shard_layout(n %zu, world %d) = {n %zu, shard %zu, padded %zu}; expected {n %zu, shard "
                     "%zu, padded %zu}%s", n, world, l.n, l.shard, l.padded, n, shard, shard * (size_t)world,
                     l.shard * (size_t)world < n ? ": the shards do not cover the buffer (rounded down: the last "
                                                   "floats belong to nobody)"
                     : l.padded != l.shard * (size_t)world ? ": padded must be world x shard (equal blocks)"
                     : l.shard > shard ? ": larger than needed" : "");
        }
}

static void test_shard_layout(void **state) {
    (void)state;
    char why[400];
    layout_problem(why, sizeof why);
    if (why[0]) {
        print_error("%s\n", why);
        fail();
    }
}

// ---------------------------------------------------------------- TODO 1b, 1c: reduce-scatter and all-gather

// Rank r's full buffer of length n, the same formula on every rank, values of mixed sign and size (so that the
// order of the additions matters to the last bit, as with real gradients).
static void fill_rank(float *x, size_t n, int rank, uint64_t seed) {
    fill_uniform(x, n, -1.0f, 1.0f, seed * 131 + (uint64_t)rank);
    for (size_t i = 0; i < n; i += 7) x[i] *= 1000.0f;
}

// Reduce-scatter of length n on pg against MPI_Allreduce (then this rank's slice, divided by the world), or the
// reason it is wrong ("" when right; the same verdict on every rank).
//
// Tolerance, per element: both sides add the same w numbers t_r (one per rank), in orders that may differ (the
// reduce-scatter's and the all-reduce's algorithms are MPI's own), then divide by w. Each side is within
// gamma_w * sum_r |t_r| / w of the exact mean (w - 1 additions and one division: Higham, Thm 3.5), so they
// differ by at most 2 gamma_w sum_r |t_r| / w; sum_r |t_r| comes from a second MPI_Allreduce of |t|.
static bool reduce_scatter_ok(ProcessGroup *pg, MPI_Comm comm, size_t n, uint64_t seed, char *why, size_t len) {
    int w = pg_world(pg), r = pg_rank(pg);
    ShardLayout l = shard_layout(n, w);
    size_t shard = (n + (size_t)w - 1) / (size_t)w;
    why[0] = '\0';
    // The input is followed by NaNs up to world x shard floats: a reduce-scatter that reads the buffer as if it
    // were padded (past its end) puts them into the last shards, where the test sees them.
    float *full = xmalloc((shard * (size_t)w + 1) * sizeof(float)), *copy = xmalloc(n * sizeof(float));
    float *sum = xmalloc(n * sizeof(float)), *abs_sum = xmalloc(n * sizeof(float));
    float *got = xmalloc((shard + 1) * sizeof(float)), *scratch = xmalloc(shard * (size_t)w * sizeof(float));
    fill_rank(full, n, r, seed);
    for (size_t i = n; i < shard * (size_t)w + 1; i++) full[i] = NAN;
    memcpy(copy, full, n * sizeof(float));
    for (size_t i = 0; i < n; i++) abs_sum[i] = fabsf(full[i]);
    MPI_Allreduce(full, sum, (int)n, MPI_FLOAT, MPI_SUM, comm);
    MPI_Allreduce(MPI_IN_PLACE, abs_sum, (int)n, MPI_FLOAT, MPI_SUM, comm);
    for (size_t i = 0; i < shard + 1; i++) got[i] = NAN;                // never written: shows
    for (size_t i = 0; i < shard * (size_t)w; i++) scratch[i] = NAN;   // the padding must be set, not assumed
    shard_reduce_scatter_avg(pg, &l, full, got, n == shard * (size_t)w ? NULL : scratch);
    size_t lo = (size_t)r * shard;
    for (size_t i = 0; i < shard && !why[0]; i++) {
        size_t at = lo + i;
        if (at >= n) {  // padding: no float of the buffer; it must be 0, or it would flow into the update
            if (got[i] != 0.0f)
                snprintf(why, len, "world %d, length %zu: rank %d's shard[%zu] is padding (past the buffer's end), and "
                         "it is %g, not 0: the padded tail must be zeros in every rank's input (%s)", w, n, r, i,
                         got[i], isnan(got[i]) ? "was the buffer read past its end, or the scratch's tail left unset?"
                                               : "is the scratch's tail set?");
            continue;
        }
        double want = sum[at] / (float)w, tol = 2.0 * gamma_k(w) * abs_sum[at] / w;
        if (!(fabs(got[i] - want) <= tol)) {
            double total = sum[at], mine = full[at];
            snprintf(why, len, "world %d, length %zu (shard %zu): rank %d's shard[%zu] (float %zu of the buffer) is "
                     "%.8g, the mean over the ranks is %.8g%s", w, n, shard, r, i, at, got[i], want,
                     isnan(got[i]) ? ": never written"
                     : fabs(got[i] - total) <= 2.0 * gamma_k(w) * abs_sum[at] ? ": the sum, not the mean"
                     : fabs(got[i] - mine) <= 1e-6 * fabs(mine) ? ": this rank's own value (not reduced)"
                     : ": another float's value (which block is rank r's? where does each rank's padding go?)");
        }
    }
    if (!why[0] && !isnan(got[shard]))
        snprintf(why, len, "world %d, length %zu: rank %d wrote past its shard of %zu floats", w, n, r, shard);
    if (!why[0] && memcmp(full, copy, n * sizeof(float)) != 0)
        snprintf(why, len, "world %d, length %zu: the input buffer changed (it is const: pad in the scratch)", w, n);
    if (why[0]) print_error("rank %d: %s\n", pg_rank(pg), why);
    free(full), free(copy), free(sum), free(abs_sum), free(got), free(scratch);
    return max_over_ranks(pg, why[0] ? 1.0 : 0.0) == 0;
}

// All-gather of length n on pg against MPI_Allgather of the same shards: exact (a copy, no arithmetic), nothing
// written past n; or the reason it is wrong.
static bool allgather_ok(ProcessGroup *pg, MPI_Comm comm, size_t n, uint64_t seed, char *why, size_t len) {
    int w = pg_world(pg), r = pg_rank(pg);
    ShardLayout l = shard_layout(n, w);
    size_t shard = (n + (size_t)w - 1) / (size_t)w, padded = shard * (size_t)w;
    why[0] = '\0';
    float *mine = xmalloc(shard * sizeof(float)), *copy = xmalloc(shard * sizeof(float));
    float *want = xmalloc(padded * sizeof(float)), *got = xmalloc((n + 4) * sizeof(float));
    float *scratch = xmalloc(padded * sizeof(float));
    fill_rank(mine, shard, r, seed);
    for (size_t i = 0; i < shard; i++)  // the padding of the last shard holds zeros, as the layout promises
        if ((size_t)r * shard + i >= n) mine[i] = 0.0f;
    memcpy(copy, mine, shard * sizeof(float));
    MPI_Allgather(mine, (int)shard, MPI_FLOAT, want, (int)shard, MPI_FLOAT, comm);
    for (size_t i = 0; i < n + 4; i++) got[i] = NAN;
    shard_allgather(pg, &l, mine, got, n == padded ? NULL : scratch);
    for (size_t i = 0; i < n && !why[0]; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
            snprintf(why, len, "world %d, length %zu (shard %zu): full[%zu] is %.8g, expected %.8g (rank %zu's shard, "
                     "element %zu)%s", w, n, shard, i, got[i], want[i], i / shard, i % shard,
                     isnan(got[i]) ? ": never written" : ": rank r's shard starts at r x shard, padding included");
    for (size_t i = n; i < n + 4 && !why[0]; i++)
        if (!isnan(got[i]))
            snprintf(why, len, "world %d, length %zu: the all-gather wrote full[%zu], past the buffer's end: the "
                     "padding (world x shard - n floats) goes to the scratch, never into the output", w, n, i);
    if (!why[0] && memcmp(mine, copy, shard * sizeof(float)) != 0)
        snprintf(why, len, "world %d, length %zu: the shard changed (it is const)", w, n);
    if (why[0]) print_error("rank %d: %s\n", pg_rank(pg), why);
    free(mine), free(copy), free(want), free(got), free(scratch);
    return max_over_ranks(pg, why[0] ? 1.0 : 0.0) == 0;
}

// Lengths below the world, at a multiple of it, one past a multiple, and model-sized.
static const size_t LENGTHS[] = {1, 2, 3, 5, 6, 7, 64, 301, 1586, 10001};

// Both collectives on pg for every length (which = 'r' reduce-scatter, 'g' all-gather), or the first failure.
static bool collectives_ok(ProcessGroup *pg, char which, char *why, size_t len) {
    MPI_Comm comm = reference_comm(pg);
    bool ok = true;
    for (size_t i = 0; i < sizeof LENGTHS / sizeof LENGTHS[0] && ok; i++)
        ok = which == 'r' ? reduce_scatter_ok(pg, comm, LENGTHS[i], 11 + i, why, len)
                          : allgather_ok(pg, comm, LENGTHS[i], 23 + i, why, len);
    MPI_Comm_free(&comm);
    return ok;
}

// The collectives on the grading world, then on its split (a world of world - 1 ranks and one of 1).
static void collectives_on_worlds(char which) {
    ProcessGroup *world = test_world();
    char why[600] = "";
    char layout[400];
    layout_problem(layout, sizeof layout);
    grading_require_todo(!layout[0], "1a", "%s", layout);
    bool ok = collectives_ok(world, which, why, sizeof why);
    if (ok && pg_world(world) > 1) {
        ProcessGroup *sub = split_world(world);
        ok = all_ranks(world, collectives_ok(sub, which, why, sizeof why));
        pg_finalize(sub);
    }
    if (!ok) fail();
    if (pg_rank(world) == 0)
        print_message("%s: %zu lengths (1 to %zu) on %d rank(s)%s: equal to MPI's\n",
                      which == 'r' ? "reduce-scatter (average)" : "all-gather", sizeof LENGTHS / sizeof LENGTHS[0],
                      LENGTHS[sizeof LENGTHS / sizeof LENGTHS[0] - 1], pg_world(world),
                      pg_world(world) > 1 ? " and on its split" : "");
}

static void test_reduce_scatter_uneven(void **state) {
    (void)state;
    collectives_on_worlds('r');
}

static void test_allgather_uneven(void **state) {
    (void)state;
    collectives_on_worlds('g');
}

// The stages' tests check TODO 1 first (on the grading world): with a wrong collective every stage is wrong for
// a reason the collectives' own tests name.
static void require_collectives(ProcessGroup *world) {
    char why[600];
    layout_problem(why, sizeof why);
    grading_require_todo(!why[0], "1a", "%s", why);
    MPI_Comm comm = reference_comm(world);
    bool rs = reduce_scatter_ok(world, comm, 7, 5, why, sizeof why);
    bool ag = rs && allgather_ok(world, comm, 7, 6, why, sizeof why);
    MPI_Comm_free(&comm);
    grading_require_todo(rs, "1b", "the reduce-scatter is wrong on a buffer of 7 floats (test_reduce_scatter_uneven)");
    grading_require_todo(ag, "1c", "the all-gather is wrong on a buffer of 7 floats (test_allgather_uneven)");
}

// ---------------------------------------------------------------- the state of a Zero, gathered by the test

// This rank's batch: LOCAL_BATCH synthetic images, different on every rank of pg (its rank's slice of a global
// batch), the same numbers however the learner's code runs.
typedef struct {
    float *x;  // (LOCAL_BATCH, 3, 32, 32)
    int *y;    // (LOCAL_BATCH)
    Batch b;
} LocalBatch;

static LocalBatch local_batch(ProcessGroup *pg, int step) {
    int world = pg_world(pg), n = LOCAL_BATCH * world;
    Dataset ds;
    dataset_synthetic(&ds, n, 10, 3, 32, 32, 7 + (uint64_t)step, SPLIT_TRAIN);
    LocalBatch lb;
    lb.x = xmalloc((size_t)LOCAL_BATCH * IMAGE * sizeof(float));
    lb.y = xmalloc(LOCAL_BATCH * sizeof(int));
    int idx[LOCAL_BATCH];
    for (int i = 0; i < LOCAL_BATCH; i++) idx[i] = pg_rank(pg) * LOCAL_BATCH + i;
    dataset_fill_batch(&ds, idx, LOCAL_BATCH, NULL, 7, 0, lb.x, lb.y);
    dataset_free(&ds);
    lb.b = (Batch){.n = LOCAL_BATCH, .x = lb.x, .y = lb.y};
    return lb;
}
static void local_batch_free(LocalBatch *lb) { free(lb->x), free(lb->y); }

// Unit u's n floats gathered from every rank's shard (the test's own all-gather, over the kit's pg_allgather:
// independent of the learner's shard_allgather) into out (n).
static void gather_shard(ProcessGroup *pg, const ShardLayout *l, const float *shard, float *out) {
    float *all = xmalloc((l->padded ? l->padded : 1) * sizeof(float));
    pg_allgather(pg, shard, all, l->shard);
    memcpy(out, all, l->n * sizeof(float));
    free(all);
}

// The whole model's momentum of z into v (n_params of the whole model): from the unit models at stage 0, from
// the shards from stage 1 on.
static void zero_velocity(Zero *z, float *v) {
    for (int u = 0; u < z->n_units; u++) {
        Model *unit = z->units[u];
        float *dst = v + unit->param_base;
        if (z->stage == ZERO_DDP) memcpy(dst, unit->velocity, unit->n_params * sizeof(float));
        else gather_shard(z->pg, &z->layout[u], z->velocity_shard[u], dst);
    }
}

// ---------------------------------------------------------------- TODO 2-4: each stage against lesson 03's DDP

// One step of the stage is judged against one ddp_step from the same parameters, momentum and BN buffers.
//
// Stages 0 and 1 must agree BIT FOR BIT: the same all-reduce of each unit's gradients, then the same element-wise
// update (stage 1 applies it to a slice, and an all-gather only copies floats). Stages 2 and 3 average the
// gradients with a reduce-scatter, whose order of additions may differ from the all-reduce's. Per element:
//   gradient  both sides are the mean of the same w local gradients g_r (w - 1 additions and a division, in
//             some order): each within gamma_w S / w of the exact mean, S = sum_r |g_r| (summed here from every
//             rank's local gradient): |dg| <= 2 gamma_w S / w.
//   momentum  v' = m v + (g + wd p): three roundings on each side (fewer with a fused multiply-add), on the
//             same m v and wd p: |dv'| <= |dg| + 2 gamma_3 (m |v| + |g| + |dg| + wd |p|).
//   weights   p' = p - lr v': two roundings on each side: |dp'| <= lr |dv'| + 2 gamma_2 (|p| + lr (|v'| + |dv'|)).
// These hold for any order and any kernel; every mistake below is larger by orders of magnitude (a summed
// gradient moves the weights w times as far; a stale shard leaves them where they were).
typedef struct {
    const char *model;
    ZeroStage stage;
    int units;       // 0: the default cut
    bool recompute;
} StageCase;

static const char *STAGE_NAMES[] = {"stage 0 (DDP through units)", "stage 1 (momentum sharded)",
                                    "stage 2 (+ gradients sharded)", "stage 3 (+ parameters sharded)"};

// Where the first float of a failure sits, for the message: its unit, view and whether this rank owns it.
static void describe_float(const Zero *z, const Model *whole, size_t i, char *out, size_t len) {
    int u = 0;
    while (u + 1 < z->n_units && z->units[u + 1]->param_base <= i) u++;
    const char *view = "?";
    bool decay = false;
    for (int k = 0; k < whole->n_views; k++)
        if (i >= whole->views[k].offset && i < whole->views[k].offset + whole->views[k].count)
            view = whole->views[k].name, decay = whole->views[k].decay;
    size_t in_unit = i - z->units[u]->param_base, shard = z->layout[u].shard;
    int owner = shard ? (int)(in_unit / shard) : 0;
    snprintf(out, len, "float %zu (%s%s; unit %d, its float %zu, in rank %d's shard%s)", i, view,
             decay ? "" : ", no weight decay", u, in_unit, owner, owner == pg_rank(z->pg) ? ": this rank's" : "");
}

// What the pattern of wrong floats says, or "".
static const char *diagnose(const Zero *z, const Model *whole, const unsigned char *bad, const float *got_p,
                            const float *ref_p, const float *before, const float *got_v, const float *ref_v) {
    size_t n = whole->n_params, wrong = 0, mine = 0, decay = 0, frozen = 0, v_zero = 0, first_shard = 0;
    int rank = pg_rank(z->pg);
    for (size_t i = 0; i < n; i++) {
        if (!bad[i]) continue;
        wrong++;
        int u = 0;
        while (u + 1 < z->n_units && z->units[u + 1]->param_base <= i) u++;
        size_t shard = z->layout[u].shard;
        mine += shard && (i - z->units[u]->param_base) / shard == (size_t)rank;
        first_shard += shard && (i - z->units[u]->param_base) / shard == 0;
        for (int k = 0; k < whole->n_views; k++)
            if (i >= whole->views[k].offset && i < whole->views[k].offset + whole->views[k].count)
                decay += whole->views[k].decay;
        frozen += got_p[i] == before[i] && ref_p[i] != before[i];
        v_zero += got_v[i] == 0.0f && ref_v[i] != 0.0f;
    }
    if (wrong == 0) return "";
    if (frozen == wrong && mine == 0)
        return ": the floats of OTHER ranks' shards never moved: after the update, every rank needs every shard "
               "(all-gather the unit's parameters)";
    if (frozen == wrong) return ": those weights never moved (the update of this rank's shard is missing)";
    if (v_zero == wrong) return ": the momentum there is 0 after the step: the momentum shard must be updated and "
                                "kept from step to step (velocity_shard)";
    if (first_shard == 0 && pg_world(z->pg) > 1)
        return ": rank 0's shards are right and every other rank's wrong: each rank's slice of the gradient, the "
               "weights and the momentum starts at rank x shard";
    if (decay == 0) return ": only floats WITHOUT weight decay are wrong (biases, BN): weight decay applied to the "
                           "whole shard instead of per view (zero_sgd_shard gives each view's part of the shard "
                           "the view's weight decay, 0 where TensorView.decay is false)";
    if (decay == wrong) return ": only floats WITH weight decay are wrong: the shard updated without weight decay, or "
                               "with another value than the run's; it applies per view (zero_sgd_shard)";
    return "";
}

// The shards z keeps after a step against the reference's state after the same step (ref: its weights and its
// averaged gradient, the one ddp_step applied): grad_shard (stages 2-3) within the gradient's bound (above);
// param_shard (stage 3) exactly the slice of the weights zero_gather_model gathered (got); the padding 0. Writes the reason into why ("" when right).
static void shards_problem(const Zero *z, const Model *ref, const Model *got, const float *abs_g, char *why,
                           size_t len) {
    int w = pg_world(z->pg), rank = pg_rank(z->pg);
    why[0] = '\0';
    for (int u = 0; u < z->n_units && !why[0]; u++) {
        const ShardLayout *l = &z->layout[u];
        size_t base = z->units[u]->param_base, off = (size_t)rank * l->shard;
        for (size_t i = 0; i < l->shard && !why[0]; i++) {
            bool pad = off + i >= l->n;
            double g = z->grad_shard[u][i], want = pad ? 0.0 : ref->grads[base + off + i];
            double tol = pad ? 0.0 : 2.0 * gamma_k(w) * abs_g[base + off + i] / w;
            if (!(fabs(g - want) <= tol))
                snprintf(why, len, "grad_shard[%d][%zu] (%s) is %.9g, the gradient averaged over the ranks is %.9g: "
                         "after unit %d's backward its gradient is reduce-scattered (averaged) into grad_shard, "
                         "which the update then reads%s", u, i, pad ? "padding" : "this rank's", g, want, u,
                         g == 0.0 ? " (it was never written)" : "");
        }
        if (z->stage != ZERO_PARAMS) continue;
        for (size_t i = 0; i < l->shard && !why[0]; i++) {
            bool pad = off + i >= l->n;
            float p = z->param_shard[u][i], want = pad ? 0.0f : got->params[base + off + i];
            if (pad ? p != 0.0f : memcmp(&p, &want, sizeof p) != 0) {
                snprintf(why, len, "param_shard[%d][%zu] (%s) is %.9g after the step, the unit's weights there are "
                         "%.9g (gathered by zero_gather_model): at stage 3 param_shard is the only copy of the weights between windows (update it "
                         "in place, every window gathers from it)", u, i, pad ? "padding, must stay 0" : "this rank's",
                         p, want);
            }
        }
    }
}

// Runs STEPS steps of case c on pg, each against ddp_step from the same state; fails with a reason naming the
// first wrong step. Returns the worst error seen (relative to the tolerance: <= 1 passes) for the message.
// One case's state: the learner's Zero, the reference model stepped by ddp_step, z's state gathered after the
// step (got, got_v), and what the tolerance needs from before it.
typedef struct {
    Zero *z;
    Model *ref, *got;
    Ddp ddp;
    bool exact;        // stages 0-1: bit for bit
    float *before;     // (n_params) the weights before the step
    float *v_before;   // (n_params) the momentum before the step
    float *got_v;      // (n_params) z's momentum after the step
    float *abs_g;      // (n_params) sum over the ranks of |local gradient| (stages 2-3)
    float *saved_buf;  // (n_buffers + 1) the BN buffers, kept across the reference's extra forward
    unsigned char *bad;  // (n_params) 1 where z's weight or momentum is off
} StepCheck;

// The reference takes z's state (weights, BN buffers, momentum: gathered by the test); at stages 2-3 the sum of
// |local gradient| over the ranks for the tolerance (one more forward + backward, its BN update undone).
static void reference_from(StepCheck *s, const Batch *b) {
    Model *ref = s->ref;
    size_t n = ref->n_params, nb = ref->n_buffers;
    zero_gather_model(s->z, ref);
    zero_velocity(s->z, ref->velocity);
    memcpy(s->before, ref->params, n * sizeof(float));
    memcpy(s->v_before, ref->velocity, n * sizeof(float));
    if (s->exact) return;
    memcpy(s->saved_buf, ref->buffers, nb * sizeof(float));
    train_forward_backward(ref, b, 0.0f, 1.0f / LOCAL_BATCH);
    for (size_t i = 0; i < n; i++) s->abs_g[i] = fabsf(ref->grads[i]);
    pg_allreduce_sum(s->z->pg, s->abs_g, n);
    memcpy(ref->buffers, s->saved_buf, nb * sizeof(float));
}

// The bounds on |dv'| and |dp'| of float i at stages 2-3 (the derivation above StageCase).
static void element_bounds(const StepCheck *s, size_t i, double *dv, double *dp) {
    const Model *ref = s->ref;
    int w = pg_world(s->z->pg);
    double g = fabs(ref->grads[i]), dg = 2.0 * gamma_k(w) * s->abs_g[i] / w, wd = 0.0;
    for (int k = 0; k < ref->n_views; k++)
        if (i >= ref->views[k].offset && i < ref->views[k].offset + ref->views[k].count)
            wd = ref->views[k].decay ? OPT.weight_decay : 0.0;
    *dv = dg + 2.0 * gamma_k(3) * (OPT.momentum * fabs(s->v_before[i]) + g + dg + wd * fabs(s->before[i]));
    *dp = OPT.lr * *dv + 2.0 * gamma_k(2) * (fabs(s->before[i]) + OPT.lr * (fabs(ref->velocity[i]) + *dv));
}

// Marks the floats whose weight or momentum is off (s->bad); returns the first (n_params: none) and raises *worst
// to the largest error relative to its bound.
static size_t mark_wrong(StepCheck *s, double *worst) {
    const Model *ref = s->ref, *got = s->got;
    size_t n = ref->n_params, first = n;
    for (size_t i = 0; i < n; i++) {
        bool wrong;
        if (s->exact) {
            wrong = memcmp(&got->params[i], &ref->params[i], sizeof(float)) != 0 ||
                    memcmp(&s->got_v[i], &ref->velocity[i], sizeof(float)) != 0;
        } else {
            double dv, dp, ep = fabs((double)got->params[i] - ref->params[i]);
            double ev = fabs((double)s->got_v[i] - ref->velocity[i]);
            element_bounds(s, i, &dv, &dp);
            wrong = !(ep <= dp) || !(ev <= dv);
            if (dp > 0) *worst = fmax(*worst, fmax(ep / dp, dv > 0 ? ev / dv : 0.0));
        }
        s->bad[i] = wrong;
        if (wrong && first == n) first = i;
    }
    return first;
}

// The verdict on one step (the metrics each side returned; s holds the rest): the reason into why, "" when right.
static void judge_step(StepCheck *s, const StageCase *c, int step, Metrics m_got, Metrics m_ref, double *worst,
                       char *why, size_t len) {
    const Model *ref = s->ref, *got = s->got;
    size_t n = ref->n_params, nb = ref->n_buffers;
    why[0] = '\0';
    // The loss: the same forward on the same weights, through units instead of one model.
    if (m_got.count != m_ref.count || m_got.correct != m_ref.correct ||
        !(fabs(m_got.loss_sum - m_ref.loss_sum) <= 1e-6 * fabs(m_ref.loss_sum))) {
        snprintf(why, len, "step %d: zero_step returned loss_sum %.7g, correct %ld, count %ld; the reference's %.7g, "
                 "%ld, %ld: the forward through the units is wrong%s", step + 1, m_got.loss_sum, m_got.correct,
                 m_got.count, m_ref.loss_sum, m_ref.correct, m_ref.count,
                 m_got.count == 0 ? " (or the metrics were not returned)" : "");
        return;
    }
    size_t first = mark_wrong(s, worst);
    if (first < n) {
        char where[200];
        describe_float(s->z, ref, first, where, sizeof where);
        const char *pattern = diagnose(s->z, ref, s->bad, got->params, ref->params, s->before, s->got_v, ref->velocity);
        snprintf(why, len, "step %d: %s: weight %.9g, momentum %.9g; lesson 03's ddp_step gives %.9g, %.9g (%s; "
                 "weights off by %.3g of the step's move)%s%s", step + 1, where, got->params[first], s->got_v[first],
                 ref->params[first], ref->velocity[first],
                 s->exact ? "this stage must be equal bit for bit" : "beyond the rounding bound",
                 move_error(got->params, ref->params, s->before, n), pattern,
                 step > 0 && !pattern[0] ? ": the first steps agreed (is the state from the step before kept?)" : "");
        return;
    }
    // The shards this rank keeps between steps: its slice of the averaged gradient (stages 2-3) and of the
    // weights (stage 3, the only copy), padding zero.
    if (c->stage >= ZERO_GRADS) {
        char inner[600];
        shards_problem(s->z, ref, got, s->abs_g, inner, sizeof inner);
        if (inner[0]) {
            snprintf(why, len, "step %d: %s", step + 1, inner);
            return;
        }
    }
    // BN running statistics: rank 0's, everywhere (as ddp_step broadcasts them).
    if (nb > 0 && memcmp(got->buffers, ref->buffers, nb * sizeof(float)) != 0)
        snprintf(why, len, "step %d: the BN running statistics differ from ddp_step's (which keeps rank 0's on every "
                 "rank, broadcast after the update)", step + 1);
}

// Runs STEPS steps of case c on pg, each against ddp_step from the same state; fails (every rank) with the reason
// for the first wrong step. Returns the largest error relative to its bound (stages 2-3; <= 1 passes).
static double stage_vs_ddp(ProcessGroup *pg, const StageCase *c) {
    ModelConfig cfg = config(c->model);
    StepCheck s = {.exact = c->stage <= ZERO_OPTIM};
    s.z = zero_create(pg, &cfg, DEVICE_CPU, LOCAL_BATCH, 42, c->stage, c->units, c->recompute);
    s.ref = model_create(&cfg, DEVICE_CPU, LOCAL_BATCH, 42);
    s.got = model_create(&cfg, DEVICE_CPU, 1, 42);
    s.ddp = (Ddp){.pg = pg, .model = s.ref};
    size_t n = s.ref->n_params;
    s.before = xmalloc(n * sizeof(float)), s.v_before = xmalloc(n * sizeof(float));
    s.got_v = xmalloc(n * sizeof(float)), s.abs_g = xmalloc(n * sizeof(float));
    s.saved_buf = xmalloc((s.ref->n_buffers + 1) * sizeof(float));
    s.bad = xcalloc(n, 1);
    char why[800] = "";
    double worst = 0.0;
    for (int step = 0; step < STEPS && !why[0]; step++) {
        LocalBatch lb = local_batch(pg, step);
        reference_from(&s, &lb.b);
        Metrics m_got = zero_step(s.z, &lb.b, &OPT, 0.0f);
        Metrics m_ref = ddp_step(&s.ddp, &lb.b, &OPT, 0.0f);
        zero_gather_model(s.z, s.got);
        zero_velocity(s.z, s.got_v);
        judge_step(&s, c, step, m_got, m_ref, &worst, why, sizeof why);
        local_batch_free(&lb);
    }
    if (why[0])
        print_error("rank %d, %s, world %d, %s%s%s: %s\n", pg_rank(pg), c->model, pg_world(pg),
                    STAGE_NAMES[c->stage], c->units ? ", --units" : "", c->recompute ? ", recompute" : "", why);
    bool ok = max_over_ranks(pg, why[0] ? 1.0 : 0.0) == 0;
    free(s.before), free(s.v_before), free(s.got_v), free(s.abs_g), free(s.saved_buf), free(s.bad);
    model_free(s.got), model_free(s.ref);
    zero_free(s.z);
    if (!ok) fail();
    return worst;
}

// Stage c.stage on the grading world and on its split; prints the worst error against its tolerance.
static void stage_on_worlds(const StageCase *cases, int n_cases) {
    ProcessGroup *world = test_world();
    require_collectives(world);
    double worst = 0.0;
    for (int i = 0; i < n_cases; i++) worst = fmax(worst, stage_vs_ddp(world, &cases[i]));
    if (pg_world(world) > 1) {
        ProcessGroup *sub = split_world(world);
        for (int i = 0; i < n_cases; i++) worst = fmax(worst, stage_vs_ddp(sub, &cases[i]));
        pg_finalize(sub);
    }
    const char *split = pg_world(world) > 1 ? " and its split" : "";
    if (pg_rank(world) == 0) {
        if (cases[0].stage <= ZERO_OPTIM)
            print_message("%s: %d steps equal to ddp_step bit for bit (world %d%s)\n", STAGE_NAMES[cases[0].stage],
                          STEPS, pg_world(world), split);
        else
            print_message("%s: %d steps within the rounding bound of ddp_step (largest error %.2g of the bound; world "
                          "%d%s)\n", STAGE_NAMES[cases[0].stage], STEPS, worst, pg_world(world), split);
    }
}

static void test_stage1_equals_ddp(void **state) {
    (void)state;
    const StageCase cases[] = {{"tiny-bn", ZERO_OPTIM, 0, false}, {"tiny", ZERO_OPTIM, 2, false}};
    stage_on_worlds(cases, 2);
}

static void test_stage2_equals_ddp(void **state) {
    (void)state;
    const StageCase cases[] = {{"tiny-bn", ZERO_GRADS, 0, false}, {"tiny", ZERO_GRADS, 2, false}};
    stage_on_worlds(cases, 2);
}

static void test_stage3_equals_ddp(void **state) {
    (void)state;
    const StageCase cases[] = {{"tiny-bn", ZERO_PARAMS, 0, false}, {"tiny", ZERO_PARAMS, 2, false}};
    stage_on_worlds(cases, 2);
}

// ---------------------------------------------------------------- memory, from the kit's counters

// What one rank holds of a stage, measured by the kit's allocation counters (kit/device.h: the bytes asked for,
// by part): their growth from before zero_create to after a second step (live: what stays between steps), and
// the most during that second step (peak). Beside them, the sizes the bounds are made of, from the layouts.
typedef struct {
    size_t live[MEM_PARTS], peak[MEM_PARTS];
    size_t shards;        // sum over the units of shard_u floats, in bytes: one shard-sized array per unit
    size_t full;          // the whole model's parameters, bytes: what DDP holds of each of params, grads, momentum
    size_t largest_unit;  // the largest unit's parameters, bytes
    size_t largest_pair;  // the largest two adjacent units' parameters together (the largest unit's with one unit), bytes
    size_t buffers;       // the BN running statistics (every rank keeps them whole: small), bytes
    size_t arenas, arena_pair;  // every unit's activation arena, and the largest two adjacent ones, bytes
    int units;
} Measured;

// The activation arena of each unit (bytes; what model_release(MODEL_ACTS) frees), measured on a copy of the
// unit made here.
static void unit_arenas(const ModelConfig *cfg, const Zero *z, size_t *arena) {
    for (int u = 0; u < z->n_units; u++) {
        Model *m = model_create_stage(cfg, DEVICE_CPU, LOCAL_BATCH, 1, z->first[u], z->first[u + 1]);
        size_t before = mem_stats().live[MEM_ACTS];
        model_release(m, MODEL_ACTS);
        arena[u] = before - mem_stats().live[MEM_ACTS];
        model_free(m);
    }
}

static Measured measure(ProcessGroup *pg, const char *model, ZeroStage stage, bool recompute) {
    ModelConfig cfg = config(model);
    LocalBatch lb = local_batch(pg, 0);
    MemStats before = mem_stats();
    Zero *z = zero_create(pg, &cfg, DEVICE_CPU, LOCAL_BATCH, 42, stage, 0, recompute);
    zero_step(z, &lb.b, &OPT, 0.0f);
    mem_stats_reset_peak();
    zero_step(z, &lb.b, &OPT, 0.0f);
    MemStats after = mem_stats();
    Measured m = {.units = z->n_units};
    for (int p = 0; p < MEM_PARTS; p++) {
        m.live[p] = after.live[p] > before.live[p] ? after.live[p] - before.live[p] : 0;
        m.peak[p] = after.peak[p] > before.live[p] ? after.peak[p] - before.live[p] : 0;
    }
    size_t arena[ZERO_MAX_UNITS];
    unit_arenas(&cfg, z, arena);
    for (int u = 0; u < z->n_units; u++) {
        size_t full = z->units[u]->n_params * sizeof(float);
        m.shards += z->layout[u].shard * sizeof(float);
        m.largest_unit = full > m.largest_unit ? full : m.largest_unit;
        m.full += full;
        m.buffers += z->units[u]->n_buffers * sizeof(float);
        m.arenas += arena[u];
        size_t pair = arena[u] + (u + 1 < z->n_units ? arena[u + 1] : 0);
        m.arena_pair = pair > m.arena_pair ? pair : m.arena_pair;
        size_t two = full + (u + 1 < z->n_units ? z->units[u + 1]->n_params * sizeof(float) : 0);
        m.largest_pair = two > m.largest_pair ? two : m.largest_pair;
    }
    zero_free(z);
    local_batch_free(&lb);
    return m;
}

// Fails (every rank, with this rank's numbers) when got > bound; what: the part and the moment; full: what a
// rank holding everything would have; rule: what the stage must do instead.
static bool within(ProcessGroup *pg, const char *what, size_t got, size_t bound, size_t full, const char *rule) {
    bool ok = got <= bound;
    if (!ok)
        print_error("rank %d of %d: %s: %zu bytes, more than the %zu the stage allows (the whole model's would be "
                    "%zu)%s: %s\n", pg_rank(pg), pg_world(pg), what, got, bound, full,
                    got >= full ? ": this rank holds ALL of it" : "", rule);
    return max_over_ranks(pg, ok ? 0.0 : 1.0) == 0;
}

// The memory tests run on the grading world, on ResNet-9 (width 8): 11 units by default, so that one unit at a
// time (the bound: the shards + the largest unit, 1.05 x the model on 3 ranks, its residual block being 71 % of
// it) and every unit at once (the shards + the whole model, 1.33 x) are told apart.
#define MEMORY_MODEL "resnet9"

// Stage 1: the only optimizer state is velocity_shard: sum over the units of shard_u floats, live and at the
// peak of a step. No slack: the counters count the bytes asked for, and the full momentum goes (model_release).
static void test_stage1_memory(void **state) {
    (void)state;
    ProcessGroup *world = test_world();
    require_collectives(world);
    Measured m = measure(world, MEMORY_MODEL, ZERO_OPTIM, false);
    const char *rule = "at stage 1 a rank keeps the momentum of its own shard only (velocity_shard): release the "
                       "unit's full momentum";
    bool ok = within(world, "optimizer state between steps", m.live[MEM_OPTIM], m.shards, m.full, rule) &&
              within(world, "optimizer state at the peak of a step", m.peak[MEM_OPTIM], m.shards, m.full, rule);
    if (!ok) fail();
    if (pg_rank(world) == 0)
        print_message("stage 1, %d units on %d ranks: momentum %zu bytes live, %zu at the peak (shards %zu; full %zu)\n",
                      m.units, pg_world(world), m.live[MEM_OPTIM], m.peak[MEM_OPTIM], m.shards, m.full);
}

// Stage 2: between steps the gradient is grad_shard only (sum of shard_u floats). During a step a unit's full
// gradient exists from its backward to the end of its reduce-scatter. With the overlap (the default), that
// reduce-scatter travels during the next unit's backward (unit u-1's, backward going down), whose own full
// gradient exists meanwhile: at most two ADJACENT units' full gradients at once, so the peak is at most the shards
// plus the largest adjacent pair. With KIT_OVERLAP=0 each reduce-scatter ends before the next backward: one unit at
// a time, the shards plus the largest unit. Both bounds are below the shards + the whole model (11 units; the
// largest pair is the residual block and one unit beside it): holding every unit's full gradient fails either.
static bool stage2_grads_within(ProcessGroup *world, bool overlap) {
    if (!overlap) setenv("KIT_OVERLAP", "0", 1);  // read by zero_create
    Measured m = measure(world, MEMORY_MODEL, ZERO_GRADS, false);
    if (!overlap) unsetenv("KIT_OVERLAP");
    const size_t working = overlap ? m.largest_pair : m.largest_unit;
    bool ok = within(world, "gradients between steps", m.live[MEM_GRADS], m.shards, m.full,
                     "at stage 2 a rank keeps the averaged gradient of its shard only (grad_shard): release the "
                     "unit's full gradient once it is reduce-scattered") &&
              within(world, overlap ? "gradients at the peak of a step" : "gradients at the peak of a step with "
                     "KIT_OVERLAP=0", m.peak[MEM_GRADS], m.shards + working, m.full, overlap
                     ? "a unit's full gradient lives from its backward to the end of its reduce-scatter, which ends "
                       "after the backward of the unit before it: release it then, before the next backward brings "
                       "a third"
                     : "with the overlap off (z->overlap false) each reduce-scatter ends right after its unit's "
                       "backward: release the full gradient then, before the next unit's backward brings its own");
    if (ok && pg_rank(world) == 0)
        print_message("stage 2%s, %d units on %d ranks: gradients %zu bytes live, %zu at the peak (bound %zu = shards "
                      "+ %s; full %zu)\n", overlap ? "" : " with KIT_OVERLAP=0", m.units, pg_world(world),
                      m.live[MEM_GRADS], m.peak[MEM_GRADS], m.shards + working,
                      overlap ? "largest adjacent pair of units" : "largest unit", m.full);
    return ok;
}

static void test_stage2_memory(void **state) {
    (void)state;
    ProcessGroup *world = test_world();
    require_collectives(world);
    if (!stage2_grads_within(world, true) || !stage2_grads_within(world, false)) fail();
}

// Stage 3: between steps the parameters are param_shard (sum of shard_u floats) and the BN buffers (kept whole:
// model_release(MODEL_PARAMS) leaves them); a unit's full parameters exist only inside its window, one unit at a
// time: the peak is at most the shards + the buffers + the largest unit's parameters. The overlap does not change
// that (a reduce-scatter reads the gradient, not the parameters: the window closes at the end of the backward);
// the gradients follow stage 2's bound with the overlap.
static void test_stage3_memory(void **state) {
    (void)state;
    ProcessGroup *world = test_world();
    require_collectives(world);
    Measured m = measure(world, MEMORY_MODEL, ZERO_PARAMS, false);
    bool ok = within(world, "parameters between steps", m.live[MEM_PARAMS], m.shards + m.buffers, m.full + m.buffers,
                     "at stage 3 a rank keeps only its shard of the parameters (param_shard) between windows: "
                     "release the unit's full parameters") &&
              within(world, "parameters at the peak of a step", m.peak[MEM_PARAMS],
                     m.shards + m.buffers + m.largest_unit, m.full + m.buffers,
                     "a unit's full parameters exist only inside its window (gathered before its forward, released "
                     "after; again for its backward): one unit at a time") &&
              within(world, "gradients between steps", m.live[MEM_GRADS], m.shards, m.full,
                     "stage 3 shards the gradients as stage 2 does") &&
              within(world, "gradients at the peak of a step", m.peak[MEM_GRADS], m.shards + m.largest_pair, m.full,
                     "stage 3 reduce-scatters the gradients as stage 2 does: at most two adjacent units' full "
                     "gradients at once") &&
              within(world, "optimizer state between steps", m.live[MEM_OPTIM], m.shards, m.full,
                     "stage 3 shards the momentum as stage 1 does");
    if (!ok) fail();
    if (pg_rank(world) == 0)
        print_message("stage 3, %d units on %d ranks: parameters %zu bytes live, %zu at the peak (bound %zu = shards "
                      "+ BN buffers + largest unit; full %zu)\n", m.units, pg_world(world), m.live[MEM_PARAMS],
                      m.peak[MEM_PARAMS], m.shards + m.buffers + m.largest_unit, m.full + m.buffers);
}

// ---------------------------------------------------------------- TODO 5: recomputation

// With recomputation a unit's activations exist only while its forward runs, and again in its backward. The
// unit's backward also reads the gradient of its output from the unit after it (its input gradient, in that
// unit's arena), so at most two adjacent units' arenas are live at once; the rest of the activation memory
// (unit outputs kept at the boundaries, the loss gradient, the saved BN statistics) does not depend on it. So
// the peak with recomputation is at most the peak without it, less every arena, plus the largest adjacent pair
// and the boundaries: sum over the units of (batch x output floats), plus the largest unit's BN buffers.
static void test_recompute_memory(void **state) {
    (void)state;
    ProcessGroup *world = test_world();
    require_collectives(world);
    Measured none = measure(world, MEMORY_MODEL, ZERO_DDP, false);
    Measured re = measure(world, MEMORY_MODEL, ZERO_DDP, true);
    ModelConfig cfg = config(MEMORY_MODEL);
    Zero *z = zero_create(world, &cfg, DEVICE_CPU, LOCAL_BATCH, 42, ZERO_DDP, 0, false);
    size_t boundaries = 0, bn = 0;
    for (int u = 0; u < z->n_units; u++) {
        const Model *unit = z->units[u];
        const Layer *last = &unit->layers[unit->n_layers - 1];
        boundaries += (size_t)LOCAL_BATCH * last->c * last->h * last->w * sizeof(float);
        bn = unit->n_buffers * sizeof(float) > bn ? unit->n_buffers * sizeof(float) : bn;
    }
    zero_free(z);
    size_t bound = none.peak[MEM_ACTS] - none.arenas + re.arena_pair + boundaries + bn;
    bool ok = within(world, "activations at the peak of a step with recomputation", re.peak[MEM_ACTS], bound,
                     none.peak[MEM_ACTS], "a unit keeps only its output after its forward (release its activations; "
                     "its backward brings them back, runs the forward again, and they go once the unit before has "
                     "read its input gradient)");
    if (!ok) fail();
    if (pg_rank(world) == 0)
        print_message("recomputation, %d units: activations at the peak %zu bytes (bound %zu; without it %zu)\n",
                      re.units, re.peak[MEM_ACTS], bound, none.peak[MEM_ACTS]);
}

// Stage s with and without recomputation on the same batches, STEPS steps: the weights, the momentum and the BN
// running statistics must be equal bit for bit (the forward run again is the same arithmetic on the same input).
// Returns the reason they differ, "" when they agree; the same verdict on every rank.
static bool recompute_same(ProcessGroup *pg, const char *model, ZeroStage stage, char *why, size_t len) {
    ModelConfig cfg = config(model);
    Zero *plain = zero_create(pg, &cfg, DEVICE_CPU, LOCAL_BATCH, 42, stage, 0, false);
    Zero *re = zero_create(pg, &cfg, DEVICE_CPU, LOCAL_BATCH, 42, stage, 0, true);
    Model *a = model_create(&cfg, DEVICE_CPU, 1, 42), *b = model_create(&cfg, DEVICE_CPU, 1, 42);
    size_t n = a->n_params, nb = a->n_buffers;
    why[0] = '\0';
    for (int step = 0; step < STEPS && !why[0]; step++) {
        LocalBatch lb = local_batch(pg, step);
        Metrics ma = zero_step(plain, &lb.b, &OPT, 0.0f), mb = zero_step(re, &lb.b, &OPT, 0.0f);
        int kept = -1;  // a unit that still holds its activations after the step: then nothing was recomputed
        for (int u = 0; u < re->n_units && kept < 0; u++)
            if (!(re->units[u]->released & MODEL_ACTS)) kept = u;
        zero_gather_model(plain, a), zero_gather_model(re, b);
        zero_velocity(plain, a->velocity), zero_velocity(re, b->velocity);
        if (kept >= 0)
            snprintf(why, len, "step %d: with recomputation unit %d still holds its activations after the step, so "
                     "its backward used the forward's and nothing was recomputed (each unit frees them after its "
                     "forward and again once the unit before it has read its input gradient)", step + 1, kept);
        else if (ma.count != mb.count || ma.correct != mb.correct || ma.loss_sum != mb.loss_sum)
            snprintf(why, len, "step %d: with recomputation the step returned loss_sum %.9g, correct %ld, count %ld; "
                     "without: %.9g, %ld, %ld (the forward's outputs are kept at the units' boundaries)", step + 1,
                     mb.loss_sum, mb.correct, mb.count, ma.loss_sum, ma.correct, ma.count);
        else if (nb > 0 && memcmp(a->buffers, b->buffers, nb * sizeof(float)) != 0)
            snprintf(why, len, "step %d: the BN running statistics differ with recomputation: the forward run again "
                     "in backward updated them a second time (keep the unit's buffers before it, put them back "
                     "after)", step + 1);
        else if (memcmp(a->params, b->params, n * sizeof(float)) != 0 ||
                 memcmp(a->velocity, b->velocity, n * sizeof(float)) != 0) {
            Compare c = compare_arrays(b->params, a->params, n);
            snprintf(why, len, "step %d: the weights differ with recomputation (largest difference %.3g of the largest "
                     "weight): backward must see the activations of the same forward (train mode, the unit's saved "
                     "input) before it runs", step + 1, c.error);
        }
        local_batch_free(&lb);
    }
    if (why[0]) print_error("rank %d, %s, world %d, %s: %s\n", pg_rank(pg), model, pg_world(pg), STAGE_NAMES[stage],
                            why);
    model_free(a), model_free(b);
    zero_free(plain), zero_free(re);
    return max_over_ranks(pg, why[0] ? 1.0 : 0.0) == 0;
}

// Recomputation is bit for bit the step without it, BN buffers included (tiny-bn), at stage 0 and at stage 3
// (whose backward window must be open for the forward run again), on the grading world and on its split.
static void test_recompute_bitwise(void **state) {
    (void)state;
    ProcessGroup *world = test_world();
    require_collectives(world);
    char why[600];
    bool ok = recompute_same(world, "tiny-bn", ZERO_DDP, why, sizeof why) &&
              recompute_same(world, "tiny-bn", ZERO_PARAMS, why, sizeof why);
    if (ok && pg_world(world) > 1) {
        ProcessGroup *sub = split_world(world);
        ok = all_ranks(world, recompute_same(sub, "tiny-bn", ZERO_PARAMS, why, sizeof why));
        pg_finalize(sub);
    }
    if (!ok) fail();
    if (pg_rank(world) == 0)
        print_message("recomputation: %d steps bit for bit equal to none, BN buffers included (stages 0 and 3)\n",
                      STEPS);
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shard_layout),
        cmocka_unit_test(test_reduce_scatter_uneven),
        cmocka_unit_test(test_allgather_uneven),
        cmocka_unit_test(test_stage1_equals_ddp),
        cmocka_unit_test(test_stage2_equals_ddp),
        cmocka_unit_test(test_stage3_equals_ddp),
        cmocka_unit_test(test_stage1_memory),
        cmocka_unit_test(test_stage2_memory),
        cmocka_unit_test(test_stage3_memory),
        cmocka_unit_test(test_recompute_memory),
        cmocka_unit_test(test_recompute_bitwise),
    };
    return grading_run(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
