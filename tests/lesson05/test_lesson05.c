// tests/lesson05/test_lesson05.c: the autograder for lesson 05 (the learner's syncbn.c: synchronised batch norm).
//
// Built with Open MPI and run on GRADE_NP ranks (solutions/05-syncbn/lesson.mk) like lessons 03 and 04: every rank
// runs the same test and writes its own verdict (tests/grading.h); a test passes only when it passes on every
// rank. The reference is always the kit's own batch norm (kit/ops_cpu.c, plain BN, sums in double) run in ONE
// process on the GLOBAL batch, which every rank builds itself (the data is deterministic): SyncBN on N
// ranks must equal exactly that. Tests decide from values every rank has (maxima over the
// ranks) before asserting, so the ranks make the same collective calls, and the process group's timeout is short,
// so a learner's mismatched collective stops the test within seconds instead of hanging it.
// Hints for failures are in hints.tsv.
#include <mpi.h>

#include "tests/testutil.h"
#include "tests/grading.h"
#include "tests/mpi_testutil.h"

#include <fcntl.h>
#include <unistd.h>

#include "kit/cli.h"
#include "kit/data.h"
#include "kit/dist.h"
#include "lesson.h"
#include "kit/model.h"
#include "kit/ops.h"
#include "kit/optim.h"
#include "kit/train.h"

#define TEST_SEED 7

// ---------------------------------------------------------------- what the learner allocates
// syncbn_convert's buffer must hold 2C + 1 doubles. One double short writes past the allocation, which a normal
// build never notices (malloc rounds the block up): this binary defines malloc and calloc itself (the
// executable's definitions win at link time), passes them to glibc's and records the sizes asked for while
// g_track is set. Under AddressSanitizer, which replaces the allocator and reports such a write itself, the
// recording is left out.
#if defined(__SANITIZE_ADDRESS__)
#define TRACK_ALLOCS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TRACK_ALLOCS 0
#endif
#endif
#ifndef TRACK_ALLOCS
#define TRACK_ALLOCS 1
#endif
enum { MAX_TRACKED = 256 };
static volatile bool g_track;
static void *g_alloc_ptr[MAX_TRACKED];
static size_t g_alloc_size[MAX_TRACKED];
static int g_n_alloc;
#if TRACK_ALLOCS
extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t k, size_t n);
static void track(void *p, size_t n) {
    if (!g_track || !p) return;
    int i = __atomic_fetch_add(&g_n_alloc, 1, __ATOMIC_RELAXED);
    if (i < MAX_TRACKED) g_alloc_ptr[i] = p, g_alloc_size[i] = n;
}
void *malloc(size_t n) {
    void *p = __libc_malloc(n);
    track(p, n);
    return p;
}
void *calloc(size_t k, size_t n) {
    void *p = __libc_calloc(k, n);
    track(p, k * n);
    return p;
}
#endif
// The size asked for the block at p while tracking, or 0 when it was not seen.
static size_t tracked_size(const void *p) {
    for (int i = 0; i < g_n_alloc && i < MAX_TRACKED; i++)
        if (g_alloc_ptr[i] == p) return g_alloc_size[i];
    return 0;
}
#define TEST_TIMEOUT_S 20.0
#define U_FLOAT 5.9604644775390625e-8    // 2^-24: float32's unit roundoff
#define U_DOUBLE 1.1102230246251565e-16  // 2^-53

static ProcessGroup *test_pg(void) { return test_pg_named("test_lesson05", TEST_TIMEOUT_S); }

// ---------------------------------------------------------------- one BN layer: global data, each rank's part

// A global batch (G, C, HW) of which rank r holds images [first[r], first[r] + n[r]).
typedef struct {
    int G, C, HW, world, rank;
    int *n, *first;   // (world) images per rank, and where each rank's start
    float *x, *dy;    // (G, C, HW) the global input and output gradient
    float *gamma, *beta;  // (C)
} BnCase;

// Channel c of image g: mean `center + c / C`, spread `spread` (uniform), so means differ by channel and no
// channel's mean is near 0 (relative tolerances stay meaningful).
static BnCase bn_case(ProcessGroup *pg, const int *per_rank, int C, int HW, float center, float spread, uint64_t seed) {
    BnCase k = {.C = C, .HW = HW, .world = pg_world(pg), .rank = pg_rank(pg)};
    k.n = xcalloc((size_t)k.world, sizeof *k.n);
    k.first = xcalloc((size_t)k.world, sizeof *k.first);
    for (int r = 0; r < k.world; r++) {
        k.n[r] = per_rank[r];
        k.first[r] = k.G;
        k.G += per_rank[r];
    }
    size_t total = (size_t)k.G * C * HW;
    k.x = xmalloc(total * sizeof *k.x);
    k.dy = xmalloc(total * sizeof *k.dy);
    fill_uniform(k.x, total, -spread, spread, seed);
    for (size_t i = 0; i < total; i++) k.x[i] += center + (float)((i / (size_t)HW) % (size_t)C) / (float)C;
    fill_uniform(k.dy, total, -1.0f, 1.0f, seed + 1);
    k.gamma = xmalloc((size_t)C * sizeof *k.gamma);
    k.beta = xmalloc((size_t)C * sizeof *k.beta);
    fill_uniform(k.gamma, (size_t)C, 0.5f, 1.5f, seed + 2);
    fill_uniform(k.beta, (size_t)C, -0.5f, 0.5f, seed + 3);
    return k;
}

static void bn_case_free(BnCase *k) {
    free(k->n), free(k->first), free(k->x), free(k->dy), free(k->gamma), free(k->beta);
}

static size_t plane(const BnCase *k) { return (size_t)k->C * k->HW; }
static const float *local_x(const BnCase *k) { return k->x + (size_t)k->first[k->rank] * plane(k); }
static const float *local_dy(const BnCase *k) { return k->dy + (size_t)k->first[k->rank] * plane(k); }
static size_t local_len(const BnCase *k) { return (size_t)k->n[k->rank] * plane(k); }

// A SyncBn made by hand (not by syncbn_convert: these tests are about TODO 1-4 only).
static SyncBn *test_syncbn(ProcessGroup *pg, int C) {
    SyncBn *sb = xcalloc(1, sizeof *sb);
    sb->pg = pg;
    sb->max_c = C;
    sb->buf = xcalloc(2 * (size_t)C + 1, sizeof *sb->buf);
    return sb;
}

// The kit's plain BN forward on the whole global batch, in this process: the reference.
typedef struct {
    float *y, *mean, *invstd, *run_mean, *run_var;
} BnForward;

static BnForward bn_reference_forward(const BnCase *k, const float *x, int n) {
    BnForward f;
    size_t C = (size_t)k->C;
    f.y = xmalloc((size_t)n * plane(k) * sizeof(float));
    f.mean = xmalloc(C * sizeof(float));
    f.invstd = xmalloc(C * sizeof(float));
    f.run_mean = xmalloc(C * sizeof(float));
    f.run_var = xmalloc(C * sizeof(float));
    for (size_t c = 0; c < C; c++) f.run_mean[c] = 0.25f, f.run_var[c] = 1.75f;
    BatchNormDims d = {.n = n, .c = k->C, .hw = k->HW, .eps = 1e-5f, .momentum = 0.1f};
    float *work = xcalloc(batchnorm_work_floats(DEVICE_CPU, &d), sizeof(float));
    batchnorm_forward_train(DEVICE_CPU, &d, x, k->gamma, k->beta, f.y, f.mean, f.invstd, f.run_mean, f.run_var, NULL,
                            work);
    free(work);
    return f;
}

// The learner's forward on this rank's part.
static BnForward bn_learner_forward(ProcessGroup *pg, const BnCase *k, SyncBn **sb_out) {
    BnForward f;
    size_t C = (size_t)k->C;
    f.y = xcalloc(local_len(k) + 1, sizeof(float));
    f.mean = xcalloc(C, sizeof(float));
    f.invstd = xcalloc(C, sizeof(float));
    f.run_mean = xmalloc(C * sizeof(float));
    f.run_var = xmalloc(C * sizeof(float));
    for (size_t c = 0; c < C; c++) f.run_mean[c] = 0.25f, f.run_var[c] = 1.75f;
    BatchNormDims d = {.n = k->n[k->rank], .c = k->C, .hw = k->HW, .eps = 1e-5f, .momentum = 0.1f};
    SyncBn *sb = test_syncbn(pg, k->C);
    syncbn_forward_train(sb, &d, local_x(k), k->gamma, k->beta, f.y, f.mean, f.invstd, f.run_mean, f.run_var);
    if (sb_out) *sb_out = sb;
    else syncbn_free(sb, NULL);
    return f;
}

static void bn_forward_free(BnForward *f) { free(f->y), free(f->mean), free(f->invstd), free(f->run_mean), free(f->run_var); }

// Sums over the global batch that the tolerances are made of (double, in this process).
typedef struct {
    double M;           // values per channel, all ranks
    double abs_x, sq_x; // max over channels of E|x| and E[x^2]
} BnScale;

static BnScale bn_scale(const BnCase *k) {
    BnScale s = {.M = (double)k->G * k->HW};
    for (int c = 0; c < k->C; c++) {
        double a = 0.0, q = 0.0;
        for (int g = 0; g < k->G; g++)
            for (int i = 0; i < k->HW; i++) {
                double v = k->x[((size_t)g * k->C + c) * k->HW + i];
                a += fabs(v), q += v * v;
            }
        s.abs_x = fmax(s.abs_x, a / s.M), s.sq_x = fmax(s.sq_x, q / s.M);
    }
    return s;
}

// FORWARD TOLERANCE. The learner may sum in float or double, in any order, over the ranks in any order: a sum of
// M terms is then off by at most gamma_M * sum|terms| with gamma_M ~ M u (Higham, "Accuracy and Stability of
// Numerical Algorithms", 3.1; every rounding in the same direction). With M' = M + world (the all-reduce adds
// the ranks' partial sums) and u = the accumulation's unit roundoff:
//   mean:  |dm| <= M' u E|x|
//   var = E[x^2] - m^2:  |dvar| <= M' u E[x^2] + 2 |m| |dm|, plus the same bound with double's u for the reference
//        (the kit sums in double too: negligible beside float's, but not beside double's in the cancellation test)
//   invstd = (var + eps)^-1/2:  relative error <= |dvar| / (2 (var + eps)), plus one float rounding each side (2u)
// Each y = gamma (x - m) invstd + beta is then a few float operations (<= 4 roundings of terms no larger than
// |x a|, |m a|, |beta|, a = gamma invstd) on each side: |dy| <= 8 u_f (|x a| + |m a| + |beta|) + |x - m| |a| rel(invstd)
// + |a| |dm|. These bounds hold for float accumulation when the data is well centred (the general tests); the
// cancellation test asks for the bound of double accumulation (see there).
typedef struct {
    double mean, var, invstd_rel;
} BnTol;

static BnTol bn_tol(const BnCase *k, const BnScale *s, double u, double var_min) {
    double Mp = s->M + k->world, dm = Mp * (u + U_DOUBLE) * s->abs_x;  // the learner's side and the reference's
    double dvar = Mp * (u + U_DOUBLE) * s->sq_x + 2.0 * sqrt(s->sq_x) * dm;
    return (BnTol){.mean = dm + 2.0 * U_FLOAT * s->abs_x, .var = dvar,
                   .invstd_rel = dvar / (2.0 * (var_min + 1e-5)) + 2.0 * U_FLOAT};
}

// The smallest biased variance over the channels of the global batch.
static double bn_var_min(const BnCase *k) {
    double vmin = INFINITY, M = (double)k->G * k->HW;
    for (int c = 0; c < k->C; c++) {
        double s = 0.0, q = 0.0;
        for (int g = 0; g < k->G; g++)
            for (int i = 0; i < k->HW; i++) s += k->x[((size_t)g * k->C + c) * k->HW + i];
        double m = s / M;
        for (int g = 0; g < k->G; g++)
            for (int i = 0; i < k->HW; i++) {
                double d = k->x[((size_t)g * k->C + c) * k->HW + i] - m;
                q += d * d;  // two passes: the exact variance to double precision
            }
        vmin = fmin(vmin, q / M);
    }
    return vmin;
}

// Worst violation of the forward tolerance (<= 1 passes): mean, invstd and this rank's y against the reference.
// *local_stats: the learner's statistics are those of this rank's part alone (the all-reduce is missing).
static double forward_violation(const BnCase *k, const BnForward *mine, const BnForward *ref, const BnTol *t,
                                bool check_y, const char **what) {
    double worst = 0.0;
    *what = "";
    for (int c = 0; c < k->C; c++) {
        double e = fabs((double)mine->mean[c] - ref->mean[c]) / t->mean;
        if (!(e <= worst)) worst = isnan(e) ? INFINITY : e, *what = "mean";
        double ri = fabs((double)mine->invstd[c] - ref->invstd[c]) / fabs((double)ref->invstd[c]);
        e = ri / t->invstd_rel;
        if (!(e <= worst)) worst = isnan(e) ? INFINITY : e, *what = "invstd";
    }
    if (!check_y) return worst;
    const float *yref = ref->y + (size_t)k->first[k->rank] * plane(k);
    const float *x = local_x(k);
    for (size_t i = 0; i < local_len(k); i++) {
        int c = (int)((i / (size_t)k->HW) % (size_t)k->C);
        double a = fabs((double)k->gamma[c] * ref->invstd[c]), m = ref->mean[c];
        double tol = 8.0 * U_FLOAT * (fabs(x[i]) * a + fabs(m) * a + fabs(k->beta[c])) +
                     fabs(x[i] - m) * a * t->invstd_rel + a * t->mean;
        double e = fabs((double)mine->y[i] - yref[i]) / tol;
        if (!(e <= worst)) worst = isnan(e) ? INFINITY : e, *what = "y";
    }
    return worst;
}

// How far two sets of statistics are apart (relative, summed over the channels).
static double stats_distance(const BnCase *k, const BnForward *a, const BnForward *b) {
    double d = 0.0;
    for (int c = 0; c < k->C; c++)
        d += fabs((double)a->mean[c] - b->mean[c]) / (fabs((double)b->mean[c]) + 1e-3) +
             fabs((double)a->invstd[c] - b->invstd[c]) / fabs((double)b->invstd[c]);
    return isnan(d) ? INFINITY : d;
}

// Do the learner's statistics look like this rank's own batch's (the all-reduce forgotten)? Much closer to them
// than the local statistics are to the global ones.
static bool looks_local(const BnCase *k, const BnForward *mine, const BnForward *ref) {
    if (k->world == 1) return false;
    BnForward loc = bn_reference_forward(k, local_x(k), k->n[k->rank]);
    bool local = stats_distance(k, mine, &loc) < 0.01 * stats_distance(k, &loc, ref);
    bn_forward_free(&loc);
    return local;
}

static int *even_counts(ProcessGroup *pg, int n) {
    int *v = xcalloc((size_t)pg_world(pg), sizeof *v);
    for (int r = 0; r < pg_world(pg); r++) v[r] = n;
    return v;
}

// Is the learner's invstd the right variance with eps in the wrong place? With var from the reference
// (1 / invstd^2 - eps), every channel's invstd within 1e-4 of one of the usual slips and not of the right formula.
static bool g_eps_misplaced;  // said once: the cancellation test must not blame float precision for it
static const char *eps_misplaced(const BnCase *k, const BnForward *mine, const BnForward *ref) {
    static const char *slips[] = {
        ": invstd is 1 / (sqrt(var) + eps): eps belongs INSIDE the square root, 1 / sqrt(var + eps)",
        ": invstd is 1 / sqrt(var) + eps: eps belongs inside the square root, 1 / sqrt(var + eps)",
        ": invstd is 1 / sqrt(var): eps is missing, 1 / sqrt(var + eps)",
    };
    const double eps = 1e-5;
    for (int slip = 0; slip < 3; slip++) {
        bool all = true;
        for (int c = 0; c < k->C && all; c++) {
            double r = ref->invstd[c], var = 1.0 / (r * r) - eps, sd = sqrt(fmax(var, 0.0));
            double alt = slip == 0 ? 1.0 / (sd + eps) : slip == 1 ? 1.0 / sd + eps : 1.0 / sd;
            double got = mine->invstd[c];
            all = fabs(got - alt) <= 1e-4 * fabs(alt) && fabs(got - alt) < fabs(got - r);
        }
        if (all) return slips[slip];
    }
    return NULL;
}

// One forward check on the case; returns whether it passed on every rank (and explains on failure).
static bool forward_matches(ProcessGroup *pg, BnCase *k, double u, const char *label) {
    BnScale s = bn_scale(k);
    BnTol t = bn_tol(k, &s, u, bn_var_min(k));
    BnForward ref = bn_reference_forward(k, k->x, k->G);
    BnForward mine = bn_learner_forward(pg, k, NULL);
    const char *what;
    double v = forward_violation(k, &mine, &ref, &t, u == U_FLOAT, &what);
    double worst = max_over_ranks(pg, v);
    bool local = looks_local(k, &mine, &ref);
    const char *eps = eps_misplaced(k, &mine, &ref);
    if (pg_rank(pg) == 0)
        print_message("%s: %d ranks, %d values per channel: worst error %.3g of the tolerance (derived: see "
                      "bn_tol)\n", label, k->world, (int)s.M, worst);
    if (!(v <= 1.0))
        print_error("rank %d: %s is off by %.3g times its tolerance (first channel mean: yours %.9g, one process "
                    "on the global batch %.9g; invstd %.9g vs %.9g)%s\n", pg_rank(pg), what, v, (double)mine.mean[0],
                    (double)ref.mean[0], (double)mine.invstd[0], (double)ref.invstd[0],
                    local ? ": these are the statistics of this rank's images only: the all-reduce is missing"
                    : eps ? eps : "");
    bn_forward_free(&ref);
    bn_forward_free(&mine);
    if (eps) g_eps_misplaced = true;
    return worst <= 1.0;
}

// ---------------------------------------------------------------- TODO 1: forward

static void test_forward_global_stats(void **state) {
    ProcessGroup *pg = test_pg();
    int *n = even_counts(pg, 4);
    BnCase k = bn_case(pg, n, 5, 36, 0.5f, 1.0f, 11);
    bool ok = forward_matches(pg, &k, U_FLOAT, "SyncBN forward vs one process on the global batch");
    // One message per layer: the sums, the sums of squares and the count travel together.
    SyncBn *sb = NULL;
    BnForward once = bn_learner_forward(pg, &k, &sb);
    long calls = sb->allreduces;
    bn_forward_free(&once);
    syncbn_free(sb, NULL);
    if (ok && calls != 1) {
        if (pg_rank(pg) == 0)
            print_error("one forward made %ld syncbn_allreduce calls: the sums of x, of x^2 and the count go in ONE "
                        "all-reduce of 2C + 1 doubles (each call is a round trip over the network)\n", calls);
        ok = false;
    }
    bn_case_free(&k);
    free(n);
    if (!ok) fail();
}

// CANCELLATION: mean 1e3 and spread 1e-2 (variance ~3e-5, E[x^2] ~ 1e6). E[x^2] - E[x]^2 then keeps only the
// digits beyond the 10 that E[x^2] and m^2 share: float (7 digits) has none left (its sum of x^2 is off by ~M u_f
// 1e6 = several times the variance itself), double keeps 6. The tolerance is bn_tol's bound with double's u:
// what float64 sums (or a Welford / Chan merge in double) guarantee; float accumulation is 5e8 times further off.
static void test_forward_cancellation(void **state) {
    ProcessGroup *pg = test_pg();
    int *n = even_counts(pg, 4);
    BnCase k = bn_case(pg, n, 3, 64, 1000.0f, 0.01f, 12);
    bool ok = forward_matches(pg, &k, U_DOUBLE, "SyncBN forward, mean 1e3 and spread 1e-2");
    bn_case_free(&k);
    free(n);
    if (!ok) {
        if (!g_eps_misplaced)
            print_error("E[x^2] - E[x]^2 in float loses every digit of a variance that is 1e-10 of the mean squared: "
                        "README section 2\n");
        fail();
    }
}

// ---------------------------------------------------------------- TODO 3: running statistics

// Small batches (2 images of 3 values per rank): the unbiased correction count / (count - 1) is then large
// enough to see (6/5 on one rank against 12/11 over two), so a biased variance or a local count shows.
// Tolerance: running = 0.9 r + 0.1 stat, with stat within the forward tolerance (bn_tol: the variance within
// t.var, times count / (count - 1) <= 2 for the unbiased one), plus a few float roundings of the update.
static void test_running_stats_global(void **state) {
    ProcessGroup *pg = test_pg();
    int *n = even_counts(pg, 2);
    BnCase k = bn_case(pg, n, 4, 3, 0.5f, 1.0f, 13);
    BnScale s = bn_scale(&k);
    double vmin = bn_var_min(&k);
    BnTol t = bn_tol(&k, &s, U_FLOAT, vmin);
    BnForward ref = bn_reference_forward(&k, k.x, k.G);
    BnForward mine = bn_learner_forward(pg, &k, NULL);
    double worst = 0.0;
    for (int c = 0; c < k.C; c++) {
        double tm = 0.1 * t.mean + 4.0 * U_FLOAT * fabs(ref.run_mean[c]);
        double tv = 0.1 * 2.0 * t.var + 4.0 * U_FLOAT * fabs(ref.run_var[c]);
        double e = fmax(fabs((double)mine.run_mean[c] - ref.run_mean[c]) / tm,
                        fabs((double)mine.run_var[c] - ref.run_var[c]) / tv);
        worst = isnan(e) || e > worst ? (isnan(e) ? INFINITY : e) : worst;
    }
    double most = max_over_ranks(pg, worst);
    bool same_mean = pg_identical(pg, mine.run_mean, (size_t)k.C), same_var = pg_identical(pg, mine.run_var, (size_t)k.C);
    if (pg_rank(pg) == 0)
        print_message("running statistics after one SyncBN step on %d ranks: worst error %.3g of the tolerance; "
                      "identical on every rank: %s\n", k.world, most, same_mean && same_var ? "yes" : "no");
    if (!(worst <= 1.0))
        print_error("rank %d: running_mean[0] = %.7g, running_var[0] = %.7g; one process on the global batch: %.7g, "
                    "%.7g (both started at 0.25, 1.75; momentum 0.1)\n", pg_rank(pg), (double)mine.run_mean[0],
                    (double)mine.run_var[0], (double)ref.run_mean[0], (double)ref.run_var[0]);
    bn_forward_free(&ref);
    bn_forward_free(&mine);
    bn_case_free(&k);
    free(n);
    if (!(most <= 1.0) || !(same_mean && same_var)) fail();
}

// ---------------------------------------------------------------- TODO 2: backward

typedef struct {
    float *dx, *dgamma, *dbeta;
} BnBackward;

#define DX_INIT 0.125f  // the gradients start here: backward must ADD to them (a residual's gradient arrives twice)

static BnBackward bn_backward_alloc(size_t len, int C) {
    BnBackward b = {xmalloc((len + 1) * sizeof(float)), xmalloc((size_t)C * sizeof(float)),
                    xmalloc((size_t)C * sizeof(float))};
    for (size_t i = 0; i < len; i++) b.dx[i] = DX_INIT;
    for (int c = 0; c < C; c++) b.dgamma[c] = DX_INIT, b.dbeta[c] = DX_INIT;
    return b;
}
static void bn_backward_free(BnBackward *b) { free(b->dx), free(b->dgamma), free(b->dbeta); }

// BACKWARD TOLERANCE. Both sides get the same mean and invstd (the reference forward's). The sums S1 = sum dy and
// S2 = sum dy xhat over M' = M + world terms are off by at most M' u sum|terms| (float or double accumulation);
// dx_i = A (dy_i - S1 / M - xhat_i S2 / M), A = gamma invstd, is then off by |A| (dS1 + |xhat_i| dS2) / M plus
// the float evaluation on each side: <= 8 u_f |A| (|dy_i| + |S1| / M + (|x_i| + |m|) invstd |S2| / M) (the kit
// evaluates it as A dy + B x + D, which rounds terms of that size), plus the rounding of the += into DX_INIT.
// dgamma and dbeta are this rank's sums: summed over the ranks here, they are the global sums, within the same
// M' u sum|terms| per side.
static double backward_violation(ProcessGroup *pg, const BnCase *k, const BnForward *f, const BnBackward *mine,
                                 const BnBackward *ref, bool *dx_is_local) {
    int C = k->C;
    double M = (double)k->G * k->HW, Mp = M + k->world;
    double *S = xcalloc(4 * (size_t)C, sizeof *S);  // S1, S2, sum|dy|, sum|dy xhat| per channel, global
    for (int g = 0; g < k->G; g++)
        for (int c = 0; c < C; c++)
            for (int i = 0; i < k->HW; i++) {
                size_t j = ((size_t)g * C + c) * k->HW + i;
                double xh = ((double)k->x[j] - f->mean[c]) * f->invstd[c];
                S[c] += k->dy[j], S[C + c] += k->dy[j] * xh, S[2 * C + c] += fabs(k->dy[j]),
                    S[3 * C + c] += fabs(k->dy[j] * xh);
            }
    double worst = 0.0;
    const float *x = local_x(k), *dy = local_dy(k);
    const float *dxref = ref->dx + (size_t)k->first[k->rank] * plane(k);
    for (size_t i = 0; i < local_len(k); i++) {
        int c = (int)((i / (size_t)k->HW) % (size_t)C);
        double A = fabs((double)k->gamma[c] * f->invstd[c]);
        double xh = fabs(((double)x[i] - f->mean[c]) * f->invstd[c]);
        double tol = A * Mp * U_FLOAT * (S[2 * C + c] + xh * S[3 * C + c]) / M +
                     8.0 * U_FLOAT * A * (fabs(dy[i]) + fabs(S[c]) / M + (fabs(x[i]) + fabs(f->mean[c])) * f->invstd[c] * fabs(S[C + c]) / M) +
                     2.0 * U_FLOAT * (DX_INIT + fabs(dxref[i]));
        double e = fabs((double)mine->dx[i] - dxref[i]) / tol;
        worst = isnan(e) || e > worst ? (isnan(e) ? INFINITY : e) : worst;
    }
    // dgamma, dbeta: the ranks' additions summed (each rank added its sum to DX_INIT)
    double *dg = xcalloc(2 * (size_t)C, sizeof *dg);
    for (int c = 0; c < C; c++) dg[c] = mine->dgamma[c] - DX_INIT, dg[C + c] = mine->dbeta[c] - DX_INIT;
    pg_allreduce_sum_double_host(pg, dg, 2 * C);
    for (int c = 0; c < C; c++) {
        double tg = 2.0 * Mp * U_FLOAT * S[3 * C + c] + 4.0 * k->world * U_FLOAT * DX_INIT;
        double tb = 2.0 * Mp * U_FLOAT * S[2 * C + c] + 4.0 * k->world * U_FLOAT * DX_INIT;
        double e = fmax(fabs(dg[c] - (ref->dgamma[c] - DX_INIT)) / tg, fabs(dg[C + c] - (ref->dbeta[c] - DX_INIT)) / tb);
        worst = isnan(e) || e > worst ? (isnan(e) ? INFINITY : e) : worst;
    }
    // Is dx what the local sums alone would give? (the backward all-reduce forgotten)
    *dx_is_local = false;
    if (k->world > 1) {
        BnBackward loc = bn_backward_alloc(local_len(k), C);
        BatchNormDims d = {.n = k->n[k->rank], .c = C, .hw = k->HW, .eps = 1e-5f, .momentum = 0.1f};
        float *work = xcalloc(batchnorm_work_floats(DEVICE_CPU, &d), sizeof(float));
        batchnorm_backward(DEVICE_CPU, &d, x, k->gamma, f->mean, f->invstd, dy, loc.dx, loc.dgamma, loc.dbeta, NULL,
                           work);
        free(work);
        *dx_is_local = max_rel_error(mine->dx, loc.dx, local_len(k), 1e-3) < 1e-4;
        bn_backward_free(&loc);
    }
    free(dg);
    free(S);
    return worst;
}

// One backward check; the reference and the learner's get the reference forward's mean and invstd.
static bool backward_matches(ProcessGroup *pg, BnCase *k, const char *label) {
    BnForward f = bn_reference_forward(k, k->x, k->G);
    BatchNormDims dg = {.n = k->G, .c = k->C, .hw = k->HW, .eps = 1e-5f, .momentum = 0.1f};
    BnBackward ref = bn_backward_alloc((size_t)k->G * plane(k), k->C);
    float *work = xcalloc(batchnorm_work_floats(DEVICE_CPU, &dg), sizeof(float));
    batchnorm_backward(DEVICE_CPU, &dg, k->x, k->gamma, f.mean, f.invstd, k->dy, ref.dx, ref.dgamma, ref.dbeta, NULL,
                       work);
    free(work);
    BnBackward mine = bn_backward_alloc(local_len(k), k->C);
    BatchNormDims dl = {.n = k->n[k->rank], .c = k->C, .hw = k->HW, .eps = 1e-5f, .momentum = 0.1f};
    SyncBn *sb = test_syncbn(pg, k->C);
    syncbn_backward(sb, &dl, local_x(k), k->gamma, f.mean, f.invstd, local_dy(k), mine.dx, mine.dgamma, mine.dbeta);
    syncbn_free(sb, NULL);
    bool local = false;
    double v = backward_violation(pg, k, &f, &mine, &ref, &local);
    double worst = max_over_ranks(pg, v);
    if (pg_rank(pg) == 0)
        print_message("%s: %d ranks: worst error %.3g of the tolerance (derived: see backward_violation)\n", label,
                      k->world, worst);
    if (!(v <= 1.0))
        print_error("rank %d: dx[0] = %.9g, one process on the global batch: %.9g (both started at %g: backward "
                    "adds)%s\n", pg_rank(pg), (double)mine.dx[0], (double)ref.dx[(size_t)k->first[k->rank] * plane(k)],
                    (double)DX_INIT, local ? ": this is the gradient of this rank's images alone: the all-reduce of "
                                             "sum(dy) and sum(dy * xhat) is missing" : "");
    bn_backward_free(&mine);
    bn_backward_free(&ref);
    bn_forward_free(&f);
    return worst <= 1.0;
}

static void test_backward_global_sums(void **state) {
    ProcessGroup *pg = test_pg();
    int *n = even_counts(pg, 4);
    BnCase k = bn_case(pg, n, 5, 36, 0.5f, 1.0f, 21);
    bool ok = backward_matches(pg, &k, "SyncBN backward vs one process on the global batch");
    bn_case_free(&k);
    free(n);
    if (!ok) fail();
}

// ---------------------------------------------------------------- TODO 4: uneven batches

// Rank r holds 1 + (r % 3) images (the last batch of an epoch without drop_last): world * local count is not
// the global count, on any rank.
static void test_uneven_batches(void **state) {
    ProcessGroup *pg = test_pg();
    int world = pg_world(pg);
    int *n = xcalloc((size_t)world, sizeof *n);
    for (int r = 0; r < world; r++) n[r] = 1 + r % 3;
    BnCase k = bn_case(pg, n, 4, 9, 0.5f, 1.0f, 31);
    bool ok = forward_matches(pg, &k, U_FLOAT, "SyncBN forward, ranks with 1, 2, 3, 1... images");
    ok = backward_matches(pg, &k, "SyncBN backward, the same uneven batches") && ok;
    bn_case_free(&k);
    free(n);
    if (!ok) fail();
}

// ---------------------------------------------------------------- the model: DDP + SyncBN vs one process

enum { LOCAL_BATCH = 8 };  // images per rank: small, as in the lesson's point (BN statistics of few images)

// prerequisites: the op-level TODOs, on a small case, before the model-level tests send the learner elsewhere.
static void require_syncbn_ops(ProcessGroup *pg) {
    int *n = even_counts(pg, 2);
    BnCase k = bn_case(pg, n, 3, 16, 0.5f, 1.0f, 41);
    BnScale s = bn_scale(&k);
    BnTol t = bn_tol(&k, &s, U_FLOAT, bn_var_min(&k));
    BnForward ref = bn_reference_forward(&k, k.x, k.G);
    BnForward mine = bn_learner_forward(pg, &k, NULL);
    const char *what;
    bool fwd = all_ranks(pg, forward_violation(&k, &mine, &ref, &t, true, &what) <= 1.0);
    bn_forward_free(&ref);
    bn_forward_free(&mine);
    bn_case_free(&k);
    free(n);
    grading_require_todo(fwd, "1", "syncbn_forward_train must give the global batch's statistics (see "
                         "test_forward_global_stats)");
}

static void require_convert(ProcessGroup *pg) {
    ModelConfig cfg;
    model_config(&cfg, "tiny-bn", 0, 3, 32, 32, 10);
    Model *m = model_create(&cfg, DEVICE_CPU, 1, 1);
    SyncBn *sb = syncbn_convert(m, pg);
    bool ok = all_ranks(pg, sb && (m->bn_ops != NULL) && sb->buf && sb->max_c > 0);
    syncbn_free(sb, m);
    model_free(m);
    grading_require_todo(ok, "5", "syncbn_convert must give the model's BN layers your SyncBN (Model.bn_ops on the "
                         "CPU) and a buffer for the widest layer");
}

// The global batch of step s: G images of the synthetic set; rank r's local batch is rows [r B, (r + 1) B).
typedef struct {
    Dataset ds;
    float *x;  // (G, 3, 32, 32)
    int *y;    // (G)
    int G;
} GlobalData;

static GlobalData global_data(int G, int steps) {
    GlobalData d = {.G = G};
    dataset_synthetic(&d.ds, G * steps + G, 10, 3, 32, 32, 1234, SPLIT_TRAIN);
    d.x = xmalloc((size_t)G * 3 * 32 * 32 * sizeof(float));
    d.y = xmalloc((size_t)G * sizeof(int));
    return d;
}
static void global_batch(GlobalData *d, int step) {
    int *idx = xmalloc((size_t)d->G * sizeof *idx);
    for (int i = 0; i < d->G; i++) idx[i] = step * d->G + i;
    dataset_fill_batch(&d->ds, idx, d->G, NULL, TEST_SEED, 0, d->x, d->y);
    free(idx);
}
static void global_data_free(GlobalData *d) { dataset_free(&d->ds), free(d->x), free(d->y); }

static const float *model_logits(const Model *m) {
    return m->acts + m->layers[m->n_layers - 1].act_offset * (size_t)m->max_batch;
}

// Errors of DDP (+ SyncBN when `sync`) against one process on the global batch, worst over the steps, each step
// taken by both from the DDP replica's state (parameters, momentum, running statistics): lesson 03's STEP_TOL
// comment says why steps are compared one at a time and not as two trajectories.
typedef struct {
    double logits, grads, buffers, move;  // each as a fraction of its tolerance (below): <= 1 passes
    double logits_raw, buffers_raw;       // the plain relative errors, for the messages
} StepErrors;

// TOLERANCES of the model-level comparison (tiny-bn: conv 3->8, BN, ReLU, pool, conv 8->16, BN, ReLU, pool, linear):
// - parameter move and gradients: lesson 03's STEP_TOL (1e-3 of the move or of ||g||, 2-norm) and its derivation:
//   float32 sums of at most k = B H W products per gradient element in an order the BLAS kernel and the split over
//   ranks choose, lambda sqrt(k) u_f sum|terms| with probability 1 - 1e-8; the BN sums (double in the kit, float or
//   double in yours) add M u at most over M = G H W <= 32 * 1024 values (4 ranks x 8 images of 32 x 32), 2e-3
//   worst case in float and 6 * 181 * u_f = 6.5e-5 in the same probabilistic sense.
// - logits: each forward layer is a float32 dot product of k <= 8 * 9 = 72 terms (conv 2) or 16 * 8 * 8 = 1024
//   (linear) per output, in a blocking that the batch size may change: lambda sqrt(k) u_f = 6 * 32 * 6e-8 = 1.2e-5
//   of sum|terms| per layer; BN then divides by the channel's spread, which scales an error relative to |x| by
//   |x| / std <= 4 (ReLU'd, pooled activations); over 3 layers 3 * 4 * 1.2e-5 = 1.4e-4 of max|logit|. LOGIT_TOL
//   1e-3 leaves a margin for one max-pool kink crossing (one image's value at one unit). A rank normalising with
//   its own 8 images instead of the global batch's is off by O(1/sqrt(8)) of the spread: 1e-1, not 1e-3.
// - running statistics: 0.9 r + 0.1 stat, stat from the activations above (1.4e-4 relative at most): BUF_TOL 1e-4
//   of max|buffer| (the statistics of 8 images against 8 * world are off by 1e-2).
#define STEP_TOL 1e-3
#define LOGIT_TOL 1e-3
#define BUF_TOL 1e-4

static double norm2_error(const float *a, const float *b, size_t n) {
    double e2 = 0.0, r2 = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        e2 += d * d, r2 += (double)b[i] * b[i];
    }
    return isnan(e2) ? INFINITY : r2 > 0 ? sqrt(e2 / r2) : sqrt(e2);
}
static double maxnorm_error(const float *a, const float *b, size_t n) {
    double e = 0.0, s = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        e = isnan(d) || d > e ? (isnan(d) ? INFINITY : d) : e;
        s = fmax(s, fabs((double)b[i]));
    }
    return s > 0 ? e / s : e;
}

static StepErrors ddp_vs_one(ProcessGroup *pg, bool sync, int steps, Model **out) {
    int world = pg_world(pg), rank = pg_rank(pg), G = LOCAL_BATCH * world;
    ModelConfig cfg;
    model_config(&cfg, "tiny-bn", 0, 3, 32, 32, 10);
    Model *m = model_create(&cfg, DEVICE_CPU, LOCAL_BATCH, 1);
    SyncBn *sb = sync ? syncbn_convert(m, pg) : NULL;
    ddp_broadcast_model(pg, m);
    Ddp ddp = {.pg = pg, .model = m, .buckets = NULL};
    Model *one = model_create(&cfg, DEVICE_CPU, G, 1);
    float *before = xmalloc(m->n_params * sizeof(float));
    GlobalData d = global_data(G, steps);
    SgdConfig opt = {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-4f};
    StepErrors e = {0};
    size_t chw = 3 * 32 * 32;
    for (int s = 0; s < steps; s++) {
        global_batch(&d, s);
        memcpy(one->params, m->params, m->n_params * sizeof(float));
        memcpy(one->velocity, m->velocity, m->n_params * sizeof(float));
        memcpy(one->buffers, m->buffers, m->n_buffers * sizeof(float));
        memcpy(before, m->params, m->n_params * sizeof(float));
        Batch local = {.n = LOCAL_BATCH, .x = d.x + (size_t)rank * LOCAL_BATCH * chw, .y = d.y + rank * LOCAL_BATCH};
        Batch global = {.n = G, .x = d.x, .y = d.y};
        ddp_step(&ddp, &local, &opt, 0.0f);  // lesson 03's step: grads all-reduced (averaged) in m->grads
        train_forward_backward(one, &global, 0.0f, 1.0f / (float)G);
        optim_step(one, &opt);
        size_t classes = (size_t)cfg.classes;
        double el = maxnorm_error(model_logits(m), model_logits(one) + (size_t)rank * LOCAL_BATCH * classes,
                                  LOCAL_BATCH * classes);
        double eg = norm2_error(m->grads, one->grads, m->n_params);
        double eb = maxnorm_error(m->buffers, one->buffers, m->n_buffers);
        double em = move_error(m->params, one->params, before, m->n_params);
        e.logits_raw = fmax(e.logits_raw, el), e.buffers_raw = fmax(e.buffers_raw, eb);
        e.logits = fmax(e.logits, el / LOGIT_TOL), e.grads = fmax(e.grads, eg / STEP_TOL);
        e.buffers = fmax(e.buffers, eb / BUF_TOL), e.move = fmax(e.move, em / STEP_TOL);
        if (isnan(el + eg + eb + em)) e.logits = INFINITY;
    }
    e.logits = max_over_ranks(pg, e.logits), e.grads = max_over_ranks(pg, e.grads);
    e.buffers = max_over_ranks(pg, e.buffers), e.move = max_over_ranks(pg, e.move);
    e.logits_raw = max_over_ranks(pg, e.logits_raw), e.buffers_raw = max_over_ranks(pg, e.buffers_raw);
    global_data_free(&d);
    free(before);
    model_free(one);
    syncbn_free(sb, m);
    if (out) *out = m;
    else model_free(m);
    return e;
}

static bool within(const StepErrors *e) { return e->logits <= 1.0 && e->grads <= 1.0 && e->buffers <= 1.0 && e->move <= 1.0; }

// SyncBN equals BN on the global batch, in the training program's own step: DDP (lesson 03's ddp_step) + SyncBN on N ranks,
// LOCAL_BATCH images each, against one process with the kit's plain BN on the N * LOCAL_BATCH images.
static void test_ddp_syncbn_equals_single_process(void **state) {
    ProcessGroup *pg = test_pg();
    require_syncbn_ops(pg);
    require_convert(pg);
    StepErrors e = ddp_vs_one(pg, true, 4, NULL);
    if (pg_rank(pg) == 0)
        print_message("DDP + SyncBN on %d ranks x %d images vs one process on %d, 4 steps each from the same state, as "
                      "fractions of their tolerances: logits %.3g, gradients %.3g, running statistics %.3g, parameter "
                      "move %.3g\n", pg_world(pg), LOCAL_BATCH, LOCAL_BATCH * pg_world(pg), e.logits, e.grads,
                      e.buffers, e.move);
    if (!within(&e)) {
        print_error("DDP + SyncBN differs from one process on the global batch (fractions of the tolerances: logits "
                    "%.3g, gradients %.3g, running statistics %.3g, move %.3g; > 1 fails)\n", e.logits, e.grads,
                    e.buffers, e.move);
        fail();
    }
}

// The problem SyncBN solves, shown beside the solution: the same comparison with plain BN is far off (each rank
// normalises with its own 8 images), with SyncBN within the tolerances.
static void test_plain_bn_differs(void **state) {
    ProcessGroup *pg = test_pg();
    require_syncbn_ops(pg);
    require_convert(pg);
    StepErrors plain = ddp_vs_one(pg, false, 2, NULL);
    StepErrors sync = ddp_vs_one(pg, true, 2, NULL);
    int world = pg_world(pg);
    if (pg_rank(pg) == 0)
        print_message("%d ranks x %d images: logits off by %.3g (plain BN) and %.3g (SyncBN) of their size, running "
                      "statistics by %.3g and %.3g\n", world, LOCAL_BATCH, plain.logits_raw, sync.logits_raw,
                      plain.buffers_raw, sync.buffers_raw);
    // With one rank plain BN IS the global batch; from two on its error must be far above the tolerance.
    if (world > 1 && !(plain.logits > 10.0)) {
        print_error("plain BN on %d ranks matches one process (%.3g of the tolerance): were the ranks given the same "
                    "images?\n", world, plain.logits);
        fail();
    }
    if (!within(&sync)) {
        print_error("SyncBN does not match one process (fractions of the tolerances: logits %.3g, gradients %.3g, "
                    "running statistics %.3g, move %.3g)\n", sync.logits, sync.grads, sync.buffers, sync.move);
        fail();
    }
}

// Eval mode uses the running statistics: after training-mode forwards on different images, every rank must hold
// the same statistics WITHOUT any broadcast (lesson 03's ddp_step broadcasts rank 0's buffers after each step,
// which would hide the difference; here only the model's own forward runs), so eval needs no communication and
// gives the same answer on every rank, equal to one process's on the global batches (LOGIT_TOL).
static void test_eval_identical_across_ranks(void **state) {
    ProcessGroup *pg = test_pg();
    require_syncbn_ops(pg);
    require_convert(pg);
    int world = pg_world(pg), rank = pg_rank(pg), G = LOCAL_BATCH * world, steps = 3;
    ModelConfig cfg;
    model_config(&cfg, "tiny-bn", 0, 3, 32, 32, 10);
    Model *m = model_create(&cfg, DEVICE_CPU, G, 1), *one = model_create(&cfg, DEVICE_CPU, G, 1);
    SyncBn *sb = syncbn_convert(m, pg);
    GlobalData d = global_data(G, steps);
    size_t chw = 3 * 32 * 32;
    for (int s = 0; s < steps; s++) {
        global_batch(&d, s);
        model_forward(m, d.x + (size_t)rank * LOCAL_BATCH * chw, LOCAL_BATCH, true);
        model_forward(one, d.x, G, true);
    }
    global_batch(&d, steps);  // images neither has seen; every rank evaluates the same G images
    model_forward(m, d.x, G, false);
    model_forward(one, d.x, G, false);
    bool identical = pg_identical(pg, m->buffers, m->n_buffers) &&
                     pg_identical(pg, model_logits(m), (size_t)G * cfg.classes);
    double e = max_over_ranks(pg, maxnorm_error(model_logits(m), model_logits(one), (size_t)G * cfg.classes));
    if (rank == 0)
        print_message("eval after %d SyncBN forwards on %d ranks: identical on every rank: %s; against one process on "
                      "the global batches: %.3g of max|logit| (tolerance %.0e)\n", steps, world,
                      identical ? "yes" : "no", e, LOGIT_TOL);
    global_data_free(&d);
    syncbn_free(sb, m);
    model_free(m);
    model_free(one);
    if (!identical) {
        print_error("the running statistics differ between the ranks: each rank kept its own batch's (TODO 3: from "
                    "the global sums they are the same everywhere)\n");
        fail();
    }
    if (!(e <= LOGIT_TOL)) {
        print_error("eval mode differs from one process's by %.3g of max|logit| > %.0e\n", e, LOGIT_TOL);
        fail();
    }
}

// The buffer of syncbn_convert carries forward's [sum x (C), sum x^2 (C), count] and backward's
// [sum dy (C), sum dy xhat (C), count] of the widest BN layer: 2C + 1 doubles.
static void test_convert_buffer_holds_2c_plus_1(void **state) {
    ProcessGroup *pg = test_pg();
    ModelConfig cfg;
    model_config(&cfg, "tiny-bn", 0, 3, 32, 32, 10);
    Model *m = model_create(&cfg, DEVICE_CPU, 1, 1);
    int widest = 0;
    for (int i = 0; i < m->n_layers; i++)
        if (m->layers[i].kind == LAYER_BN && m->layers[i].c > widest) widest = m->layers[i].c;
    g_n_alloc = 0;
    g_track = true;
    SyncBn *sb = syncbn_convert(m, pg);
    g_track = false;
    size_t need = (2 * (size_t)widest + 1) * sizeof(double), got = sb && sb->buf ? tracked_size(sb->buf) : 0;
    bool ok = true;
    if (!sb || !sb->buf) {
        print_error("syncbn_convert left sb->buf NULL: the all-reduces need a buffer of 2C + 1 doubles (C: the widest "
                    "BN layer, %d here)\n", widest);
        ok = false;
    } else if (sb->max_c != widest) {
        print_error("sb->max_c is %d, the widest BN layer of the model has %d channels\n", sb->max_c, widest);
        ok = false;
    } else if (TRACK_ALLOCS && got > 0 && got < need) {
        print_error("sb->buf holds %zu bytes: %.2f doubles, for 2C + 1 = %d (sum x and sum x^2 per channel, then the "
                    "count): %.2f double(s) short, and every all-reduce writes past its end\n", got,
                    (double)got / sizeof(double), 2 * widest + 1, (double)(need - got) / sizeof(double));
        ok = false;
    }
    if (ok && pg_rank(pg) == 0)
        print_message("syncbn_convert: a buffer of %s for the widest BN layer (%d channels)\n",
                      TRACK_ALLOCS && got ? "2C + 1 doubles or more" : "(size not seen in this build)", widest);
    syncbn_free(sb, m);
    model_free(m);
    if (!all_ranks(pg, ok)) fail();
}

// A channel whose values are all one large constant: E[x^2] - E[x]^2 is 0, but the rounded sums leave it a hair
// above or below 0 (some channels each way: 64 constants near 1e6, 4096 values each per rank, so the sum of x^2
// needs more bits than a double has). Below 0, sqrt(var + eps) is NaN once the hair exceeds eps, and the running
// variance (momentum 1: the batch's unbiased variance itself) goes negative.
static void test_constant_channels_never_negative(void **state) {
    ProcessGroup *pg = test_pg();
    enum { C = 64, N = 4, HW = 1024 };
    float *x = xmalloc((size_t)N * C * HW * sizeof *x), *y = xcalloc((size_t)N * C * HW, sizeof *y);
    float gamma[C], beta[C], mean[C], invstd[C], rmean[C], rvar[C];
    for (int c = 0; c < C; c++) gamma[c] = 1.0f, beta[c] = 0.5f, rmean[c] = 0.0f, rvar[c] = 0.0f;
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++)
            for (int i = 0; i < HW; i++) x[((size_t)n * C + c) * HW + i] = 1000000.0f + 0.0625f * (float)(37 * c + 1);
    BatchNormDims d = {.n = N, .c = C, .hw = HW, .eps = 1e-5f, .momentum = 1.0f};
    SyncBn *sb = test_syncbn(pg, C);
    syncbn_forward_train(sb, &d, x, gamma, beta, y, mean, invstd, rmean, rvar);
    syncbn_free(sb, NULL);
    int bad_inv = -1, bad_var = -1, bad_y = -1;
    for (int c = 0; c < C; c++) {
        if (bad_inv < 0 && !(isfinite(invstd[c]) && invstd[c] > 0.0f)) bad_inv = c;
        if (bad_var < 0 && !(rvar[c] >= 0.0f)) bad_var = c;
    }
    for (size_t i = 0; i < (size_t)N * C * HW && bad_y < 0; i++)
        if (!isfinite(y[i])) bad_y = (int)((i / HW) % C);
    bool ok = bad_inv < 0 && bad_var < 0 && bad_y < 0;
    if (bad_inv >= 0)
        print_error("rank %d: channel %d holds one constant (mean %.9g): invstd is %g. Its variance rounded to a hair "
                    "below 0: clamp the variance at 0 before the square root\n", pg_rank(pg), bad_inv,
                    (double)mean[bad_inv], (double)invstd[bad_inv]);
    else if (bad_var >= 0)
        print_error("rank %d: channel %d holds one constant: running_var became %g (momentum 1, from 0): the batch "
                    "variance rounded below 0 and went in as it was: clamp it at 0\n", pg_rank(pg), bad_var,
                    (double)rvar[bad_var]);
    else if (bad_y >= 0)
        print_error("rank %d: channel %d holds one constant: y is not finite there\n", pg_rank(pg), bad_y);
    free(x), free(y);
    if (!all_ranks(pg, ok)) fail();
}

// ---------------------------------------------------------------- TODO 5: the program

// The same as the program's report line "syncbn: X all-reduces per step, Y bytes per step": rank 0's stdout.
static void test_program_converts(void **state) {
    ProcessGroup *pg = test_pg();
    require_syncbn_ops(pg);
    require_convert(pg);
    static char name[] = "train";
    char *argv[] = {name, NULL};
    TrainOptions o;
    cli_parse(&o, 1, argv, CLI_DIST | CLI_CKPT);
    o.dataset = "synthetic";
    o.model = "tiny-bn";
    o.batch_size = 128 * pg_world(pg);  // the global batch must divide over the ranks
    o.seed = TEST_SEED;
    cli_apply_dataset_defaults(&o);
    o.epochs = 1;
    char path[] = "/tmp/test_lesson05_out.XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    fflush(stdout);
    int saved = dup(STDOUT_FILENO);
    dup2(fd, STDOUT_FILENO);
    Model *m = NULL;
    long long from;
    RunStatus st = run_program(pg, &o, &m, &from);
    fflush(stdout);
    dup2(saved, STDOUT_FILENO);
    close(saved);
    static char text[1 << 16];
    ssize_t got = pread(fd, text, sizeof text - 1, 0);
    text[got > 0 ? got : 0] = '\0';
    close(fd);
    unlink(path);
    int n_bn = 0;
    double bytes = 0.0;  // per step: forward and backward, 2C + 1 doubles each, per BN layer
    for (int i = 0; m && i < m->n_layers; i++)
        if (m->layers[i].kind == LAYER_BN) n_bn++, bytes += 2.0 * (2 * m->layers[i].c + 1) * sizeof(double);
    model_free(m);
    bool ok = true;
    if (pg_rank(pg) == 0) {
        const char *line = strstr(text, "syncbn:");
        double per_step = 0.0, b = 0.0;
        if (!line || sscanf(line, "syncbn: %lf all-reduces per step, %lf bytes per step", &per_step, &b) != 2) {
            print_error("the program's report has no line \"syncbn: X all-reduces per step, ...\"%s\n",
                        line ? ": it says the BN layers stayed plain BN (is syncbn_convert called in convert_model, "
                               "the hook lesson 04's program calls after model_create?)"
                             : "");
            ok = false;
        } else {
            print_message("the program: %.1f SyncBN all-reduces (%.0f bytes) per step; %d BN layers need %d (%.0f)\n",
                          per_step, b, n_bn, 2 * n_bn, bytes);
            ok = per_step == 2.0 * n_bn && b == bytes;
            if (!ok && per_step > 2.0 * n_bn)
                print_error("%.1f all-reduces per step for %d BN layers: syncbn_forward_train or syncbn_backward sends its "
                            "sums in several all-reduces (TODO 1 and 2: ONE of 2C + 1 doubles per layer and direction); "
                            "the conversion itself (TODO 5) is fine\n", per_step, n_bn);
            else if (!ok)
                print_error("expected one all-reduce of 2C + 1 doubles per BN layer in forward and one in backward\n");
        }
    }
    ok = all_ranks(pg, ok && st == RUN_DONE);
    if (!ok) fail();
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_global_stats),
        cmocka_unit_test(test_forward_cancellation),
        cmocka_unit_test(test_running_stats_global),
        cmocka_unit_test(test_backward_global_sums),
        cmocka_unit_test(test_uneven_batches),
        cmocka_unit_test(test_constant_channels_never_negative),
        cmocka_unit_test(test_convert_buffer_holds_2c_plus_1),
        cmocka_unit_test(test_ddp_syncbn_equals_single_process),
        cmocka_unit_test(test_plain_bn_differs),
        cmocka_unit_test(test_eval_identical_across_ranks),
        cmocka_unit_test(test_program_converts),
    };
    return grading_run(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
