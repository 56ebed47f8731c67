// tests/mpi_dist.c: the process group's tests, run under mpirun by tests/run-dist-tests.sh.
//
//   mpirun -np N mpi_dist CASE [--backend auto|mpi|nccl] [--device cpu|cuda] [--timeout S]
//
// Cases that must pass (exit 0, rank 0 prints "PASS <case>"):
//   collectives   all-reduce sum/avg (blocking and several in flight), broadcast from every root,
//                 all-gather, barrier, host doubles, on 1, 7 and 1000003 floats
//   pieces        blocking all-reduces above 2^20 floats, which go to MPI in pieces: exact sums, the same bits
//                 as the same data all-reduced in parts that go whole; a large non-blocking all-reduce moved
//                 on at different moments on different ranks while another starts
//   buckets       bucketed all-reduce == one flat all-reduce, bit for bit, whatever the marking order
//   hash          pg_identical sees equal buffers as equal and a one-bit difference (and -0.0) as not
//   model         the model's backward hook drives the buckets: same gradients as one flat all-reduce
//   reduce-scatter  reduce-scatter then all-gather == all-reduce, 1 to 100003 floats per rank; reduce-scatters in
//                 flight (pg_reduce_scatter_sum_start) == the blocking call, bit for bit, waited for in any order
//                 or after they finished
//   p2p           point-to-point messages around a ring, several in flight, matched by tag, 1 to 1000003 floats
//   split         sub-groups (even / odd ranks): their all-reduce, ranks and messages
//   traffic       pg_traffic counts exactly the bytes and calls handed to the backend, per group
//   all           the nine above in one launch
// Cases that must FAIL fast with a message (the script checks exit status, time and text):
//   check-fail    pg_check_identical on buffers that differ on the last rank
//   kill          the last rank SIGKILLs itself in the middle of an all-reduce
//   stall         the last rank sleeps instead of joining the all-reduce
//   (slow, which must PASS: the last rank arrives 1.5 s late at 3 all-reduces, within the timeout)
//   sigstop       the last rank stops itself (SIGSTOP) instead of joining: the others must name it
//   exit          the last rank exits with status 3 before the all-reduce
//   mark-twice    a bucket view marked ready twice in one step
//   mark-partial  a marked range that ends inside a view
//   work-twice    pg_work_wait on a reduce-scatter that was already waited for
//   p2p-size      rank 1 sends 8 floats where rank 0 expects 7
//   p2p-tag       rank 1 sends micro-batch 5's tag where rank 0 waits for 4
//   p2p-missing   rank 1 sends nothing
// Any wrong value: "rank R: FAIL ..." and the job aborts (non-zero exit).
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kit/check.h"
#include "kit/buckets_internal.h"
#include "kit/dist_internal.h"
#include "kit/log.h"
#include "kit/model.h"
#include "kit/rng.h"

static ProcessGroup *pg;
static Device dev;

#define EXPECT(cond, ...)                                                      \
    do {                                                                       \
        if (!(cond)) {                                                         \
            char msg_[400];                                                    \
            int k_ = snprintf(msg_, sizeof msg_, "FAIL %s:%d: ", __FILE__, __LINE__); \
            snprintf(msg_ + k_, sizeof msg_ - (size_t)k_, __VA_ARGS__);        \
            pg_abort(pg, msg_);                                                \
        }                                                                      \
    } while (0)

// Small integers: every sum below is exact in float, so "expected" needs no tolerance.
static float value_at(int rank, size_t i) { return (float)((int)((i * 7 + (size_t)rank * 13) % 101) - 50); }

// A device buffer filled from a host array.
static float *to_device(const float *host, size_t n) {
    float *d = device_alloc(dev, n * sizeof(float));
    device_copy_to(dev, d, host, n * sizeof(float));
    return d;
}

static void from_device(float *host, const float *d, size_t n) { device_copy_from(dev, host, d, n * sizeof(float)); }

static void check_allreduce(size_t n) {
    int rank = pg_rank(pg), world = pg_world(pg);
    float *h = xmalloc(n * sizeof(float)), *want = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        h[i] = value_at(rank, i);
        float s = 0;
        for (int r = 0; r < world; r++) s += value_at(r, i);
        want[i] = s;
    }
    float *d = to_device(h, n);
    pg_allreduce_sum(pg, d, n);
    from_device(h, d, n);
    for (size_t i = 0; i < n; i++) EXPECT(h[i] == want[i], "sum of %zu: [%zu] = %g, want %g", n, i, h[i], want[i]);

    // avg of the same data: the sum divided by the world size (exact ints -> one rounding).
    for (size_t i = 0; i < n; i++) h[i] = value_at(rank, i);
    device_copy_to(dev, d, h, n * sizeof(float));
    pg_allreduce_avg(pg, d, n);
    from_device(h, d, n);
    for (size_t i = 0; i < n; i++) {
        float w = want[i] / (float)world;
        // NCCL's avg pre-scales each input by 1/world before summing: allow one rounding step there.
        bool ok = pg_backend(pg) == PG_BACKEND_MPI ? h[i] == w : fabsf(h[i] - w) <= 1e-6f * (1 + fabsf(w));
        EXPECT(ok, "avg of %zu: [%zu] = %.9g, want %.9g", n, i, h[i], w);
    }
    EXPECT(pg_identical(pg, d, n), "avg of %zu floats differs across ranks", n);
    device_free(dev, d);
    free(h);
    free(want);
}

// Three all-reduces in flight at once, completed in the reverse order.
static void check_inflight(size_t n) {
    int rank = pg_rank(pg), world = pg_world(pg);
    float *h = xmalloc(n * sizeof(float));
    float *d[3];
    PgRequest q[3];
    for (int k = 0; k < 3; k++) {
        for (size_t i = 0; i < n; i++) h[i] = value_at(rank + k, i);
        d[k] = to_device(h, n);
    }
    for (int k = 0; k < 3; k++) q[k] = pg_iallreduce(pg, d[k], n, PG_SUM);
    for (int k = 2; k >= 0; k--) pg_wait(pg, q[k]);
    for (int k = 0; k < 3; k++) {
        from_device(h, d[k], n);
        for (size_t i = 0; i < n; i++) {
            float s = 0;
            for (int r = 0; r < world; r++) s += value_at(r + k, i);
            EXPECT(h[i] == s, "in-flight request %d of %zu: [%zu] = %g, want %g", k, n, i, h[i], s);
        }
        device_free(dev, d[k]);
    }
    free(h);
}

static void check_broadcast(size_t n) {
    int rank = pg_rank(pg);
    float *h = xmalloc(n * sizeof(float));
    for (int root = 0; root < pg_world(pg); root++) {
        for (size_t i = 0; i < n; i++) h[i] = value_at(rank, i);
        float *d = to_device(h, n);
        pg_broadcast(pg, d, n, root);
        from_device(h, d, n);
        for (size_t i = 0; i < n; i++)
            EXPECT(h[i] == value_at(root, i), "broadcast of %zu from %d: [%zu] = %g, want %g", n, root, i, h[i],
                   value_at(root, i));
        device_free(dev, d);
    }
    free(h);
}

static void check_allgather(size_t n) {
    int rank = pg_rank(pg), world = pg_world(pg);
    float *h = xmalloc(n * (size_t)world * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = value_at(rank, i);
    float *send = to_device(h, n);
    float *recv = device_alloc(dev, n * (size_t)world * sizeof(float));
    pg_allgather(pg, send, recv, n);
    from_device(h, recv, n * (size_t)world);
    for (int r = 0; r < world; r++)
        for (size_t i = 0; i < n; i++)
            EXPECT(h[(size_t)r * n + i] == value_at(r, i), "all-gather of %zu: block %d [%zu] = %g, want %g", n, r, i,
                   h[(size_t)r * n + i], value_at(r, i));
    device_free(dev, send);
    device_free(dev, recv);
    free(h);
}

static void check_double_host(void) {
    int rank = pg_rank(pg), world = pg_world(pg);
    double v[5];
    for (int i = 0; i < 5; i++) v[i] = 0.25 * (rank + 1) + i;
    pg_allreduce_sum_double_host(pg, v, 5);
    for (int i = 0; i < 5; i++) {
        double want = 0.25 * world * (world + 1) / 2.0 + (double)i * world;
        EXPECT(v[i] == want, "double all-reduce [%d] = %.17g, want %.17g", i, v[i], want);
    }
}

static void case_collectives(void) {
    const size_t sizes[] = {1, 7, 1000003};
    for (int s = 0; s < 3; s++) {
        check_allreduce(sizes[s]);
        check_inflight(sizes[s]);
        check_broadcast(sizes[s]);
        check_allgather(sizes[s]);
        pg_barrier(pg);
    }
    check_double_host();
}

// ---------------------------------------------------------------- pieced all-reduces

// The process group hands a blocking all-reduce above this many floats to MPI in pieces (kit/dist.c,
// PIECE_FLOATS); non-blocking ones go whole.
enum { PIECE = 1 << 20 };

// A pieced (blocking) all-reduce of random floats == the same data all-reduced in parts that each go whole, bit for bit
// (the order of the additions must not depend on the message's length), and identical on every rank.
static void check_pieced_bits(size_t n) {
    float *whole = xmalloc(n * sizeof(float)), *parts = xmalloc(n * sizeof(float));
    Rng r = rng_make(4321, (uint64_t)pg_rank(pg));
    for (size_t i = 0; i < n; i++) whole[i] = parts[i] = rng_normal(&r);
    float *d = to_device(whole, n), *e = to_device(parts, n);
    pg_allreduce_sum(pg, d, n);
    const size_t cuts[] = {0, PIECE / 3, PIECE / 3 + PIECE - 5, n};  // each part at most one piece
    for (int k = 0; k < 3; k++) pg_allreduce_sum(pg, e + cuts[k], cuts[k + 1] - cuts[k]);
    from_device(whole, d, n);
    from_device(parts, e, n);
    for (size_t i = 0; i < n; i++)
        EXPECT(memcmp(&whole[i], &parts[i], sizeof(float)) == 0, "pieced all-reduce of %zu: [%zu] = %.9g, in parts %.9g",
               n, i, whole[i], parts[i]);
    EXPECT(pg_identical(pg, d, n), "a pieced all-reduce of %zu floats differs across ranks", n);
    device_free(dev, d);
    device_free(dev, e);
    free(whole);
    free(parts);
}

// A large non-blocking all-reduce A, moved on by pg_progress on rank 0 only before it starts B, while the other
// ranks start B at once and move A only in their waits. Whatever MPI calls A takes must be started at the same
// point of every rank's sequence of collectives: were A chained in pieces, each started when the one before
// completes (which each rank sees at its own moment), its pieces and B would interleave differently on
// different ranks and MPI would pair the wrong calls (libnbc aborts).
static void check_large_inflight_order(void) {
    const size_t na = 2 * PIECE + 3, nb = 1000;
    int rank = pg_rank(pg), world = pg_world(pg);
    float *ha = xmalloc(na * sizeof(float)), *hb = xmalloc(nb * sizeof(float));
    for (size_t i = 0; i < na; i++) ha[i] = value_at(rank, i);
    for (size_t i = 0; i < nb; i++) hb[i] = value_at(rank + 1, i);
    float *a = to_device(ha, na), *b = to_device(hb, nb);
    PgRequest qa = pg_iallreduce(pg, a, na, PG_SUM);
    if (rank == 0) {
        for (int k = 0; k < 2000; k++) {
            pg_progress(pg);
            usleep(100);
        }
    }
    PgRequest qb = pg_iallreduce(pg, b, nb, PG_SUM);
    pg_wait(pg, qa);
    pg_wait(pg, qb);
    from_device(ha, a, na);
    from_device(hb, b, nb);
    for (size_t i = 0; i < na; i++) {
        float want = 0;
        for (int r = 0; r < world; r++) want += value_at(r, i);
        EXPECT(ha[i] == want, "large all-reduce in flight with another started meanwhile: [%zu] = %g, want %g", i, ha[i], want);
    }
    for (size_t i = 0; i < nb; i++) {
        float want = 0;
        for (int r = 0; r < world; r++) want += value_at(r + 1, i);
        EXPECT(hb[i] == want, "the all-reduce started during a large one in flight: [%zu] = %g, want %g", i, hb[i], want);
    }
    device_free(dev, a);
    device_free(dev, b);
    free(ha);
    free(hb);
}

static void case_pieces(void) {
    check_allreduce(2 * PIECE + PIECE / 2 + 1);  // sum and avg, exact
    // MPI only: the pieces are the kit's, and NCCL's ring sums an element in an order that depends on where it
    // falls in the message (on more than 2 GPUs whole and parts may differ in the last bits, as NCCL allows).
    if (pg_backend(pg) == PG_BACKEND_MPI) check_pieced_bits(2 * PIECE + 7);
    check_large_inflight_order();
}

// ---------------------------------------------------------------- buckets

// A parameter table like a model's: weights, then small biases, odd sizes, one view bigger than a bucket.
static int make_views(TensorView *v, size_t *total) {
    const size_t counts[] = {27 * 16, 16, 16 * 16 * 9, 16, 1000003, 7, 64 * 10, 10, 1, 333, 5000, 3};
    int n = (int)(sizeof counts / sizeof counts[0]);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        memset(&v[i], 0, sizeof v[i]);
        snprintf(v[i].name, sizeof v[i].name, "view%d", i);
        v[i].ndim = 1;
        v[i].shape[0] = (int)counts[i];
        v[i].offset = off;
        v[i].count = counts[i];
        off += counts[i];
    }
    *total = off;
    return n;
}

// One step of bucketed reduction of `host_grads`, marking views in the given order; result in out.
static void bucketed(const TensorView *views, int nv, size_t total, size_t bucket_bytes, const float *host_grads,
                     const int *order, int n_marked, float *out) {
    float *g = to_device(host_grads, total);
    GradBuckets *gb = buckets_create(pg, g, views, nv, total, bucket_bytes);
    for (int step = 0; step < 2; step++) {  // twice: the engine must reset between steps
        device_copy_to(dev, g, host_grads, total * sizeof(float));
        buckets_begin(gb);
        for (int k = 0; k < n_marked; k++) buckets_on_grads_ready(gb, views[order[k]].offset, views[order[k]].count);
        buckets_finish(gb);
    }
    from_device(out, g, total);
    buckets_free(gb);
    device_free(dev, g);
}

// Bucketed and flat all-reduces add the same numbers; whether in the same order depends on the algorithm.
// Two ranks: always (a + b == b + a exactly). Open MPI's non-blocking in-place all-reduce (libnbc) uses a
// binomial tree whose order does not depend on the buffer's length or position: bit for bit at any world
// size. NCCL's ring splits the buffer into chunks by its length, so with 3+ ranks an element may be
// summed in another order: equal within rounding (and still identical on every rank).
static bool exact_expected(void) { return pg_backend(pg) == PG_BACKEND_MPI || pg_world(pg) <= 2; }

// Index of the first element where got and want differ (bitwise, or beyond rounding when
// exact_expected() is false), or n.
static size_t first_difference(const float *got, const float *want, size_t n) {
    for (size_t i = 0; i < n; i++) {
        bool same = exact_expected() ? memcmp(&got[i], &want[i], sizeof(float)) == 0
                                     : fabsf(got[i] - want[i]) <= 1e-5f * (fabsf(want[i]) + 1e-3f);
        if (!same) return i;
    }
    return n;
}

static void case_buckets(void) {
    TensorView views[16];
    size_t total = 0;
    int nv = make_views(views, &total);
    float *grads = xmalloc(total * sizeof(float));
    float *flat = xmalloc(total * sizeof(float)), *got = xmalloc(total * sizeof(float));
    // Random floats (not integers): here the summation order matters, which is the point.
    Rng r = rng_make(1234, (uint64_t)pg_rank(pg));
    for (size_t i = 0; i < total; i++) grads[i] = rng_normal(&r) * 1e-3f;

    float *d = to_device(grads, total);
    pg_allreduce_avg(pg, d, total);
    from_device(flat, d, total);
    EXPECT(pg_identical(pg, d, total), "the flat all-reduce differs across ranks");
    device_free(dev, d);

    int reverse[16], forward[16], shuffled[16];
    for (int i = 0; i < nv; i++) reverse[i] = nv - 1 - i, forward[i] = i, shuffled[i] = i;
    Rng s = rng_make(99, 0);  // the same order on every rank
    rng_shuffle(&s, shuffled, nv);
    const size_t sizes[] = {4096, 64 << 10, PG_DEFAULT_BUCKET_BYTES, 1};
    for (int b = 0; b < 4; b++) {
        const int *orders[] = {reverse, forward, shuffled, reverse};
        const int marked[] = {nv, nv, nv, nv / 2};  // the last: half never marked, finish reduces them
        for (int o = 0; o < 4; o++) {
            memset(got, 0, total * sizeof(float));
            bucketed(views, nv, total, sizes[b], grads, orders[o], marked[o], got);
            size_t bad = first_difference(got, flat, total);
            EXPECT(bad == total, "buckets of %zu bytes, order %d: [%zu] = %.9g, flat all-reduce gives %.9g", sizes[b],
                   o, bad, bad < total ? got[bad] : 0.0f, bad < total ? flat[bad] : 0.0f);
        }
    }
    free(grads);
    free(flat);
    free(got);
}

// The real thing: the model's backward calls the bucket hook layer by layer; the result must equal
// backward without the hook followed by one flat all-reduce, and every bucket must already be in
// flight when backward returns (the overlap the hook is for).
static void case_model(void) {
    ModelConfig cfg;
    CHECK(model_config(&cfg, "tiny", 0, 3, 16, 16, 10), "the tiny model is missing from model_config");
    const int n = 8;
    Model *m = model_create(&cfg, dev, n, 42);
    size_t in_floats = (size_t)n * 3 * 16 * 16, out_floats = (size_t)n * 10;
    float *h = xmalloc((in_floats + out_floats) * sizeof(float));
    Rng r = rng_make(77, (uint64_t)pg_rank(pg));  // each rank its own batch
    for (size_t i = 0; i < in_floats + out_floats; i++) h[i] = rng_normal(&r);
    float *x = to_device(h, in_floats), *dlogits = to_device(h + in_floats, out_floats);
    float *flat = xmalloc(m->n_params * sizeof(float)), *got = xmalloc(m->n_params * sizeof(float));

    model_forward(m, x, n, true);
    model_zero_grad(m);
    model_backward(m, x, dlogits, n);
    pg_allreduce_avg(pg, m->grads, m->n_params);
    from_device(flat, m->grads, m->n_params);

    GradBuckets *gb = buckets_create(pg, m->grads, m->views, m->n_views, m->n_params, 2048);
    EXPECT(buckets_count(gb) > 1, "the test needs several buckets, got %d", buckets_count(gb));
    m->on_grads_ready = buckets_on_grads_ready;
    m->on_grads_ready_ctx = gb;
    model_forward(m, x, n, true);
    model_zero_grad(m);
    buckets_begin(gb);
    model_backward(m, x, dlogits, n);
    EXPECT(buckets_in_flight(gb) == buckets_count(gb), "after backward only %d of %d buckets were started",
           buckets_in_flight(gb), buckets_count(gb));
    buckets_finish(gb);
    from_device(got, m->grads, m->n_params);
    size_t bad = first_difference(got, flat, m->n_params);
    EXPECT(bad == m->n_params, "bucketed gradient [%zu] = %.9g, the flat all-reduce gives %.9g", bad,
           bad < m->n_params ? got[bad] : 0.0f, bad < m->n_params ? flat[bad] : 0.0f);
    EXPECT(pg_identical(pg, m->grads, m->n_params), "bucketed gradients differ across ranks");

    buckets_free(gb);
    model_free(m);
    device_free(dev, x);
    device_free(dev, dlogits);
    free(h);
    free(flat);
    free(got);
}

// ---------------------------------------------------------------- hashes

static void case_hash(void) {
    const size_t n = 100003;
    float *h = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = value_at(0, i) * 0.37f;
    float *d = to_device(h, n);
    EXPECT(pg_identical(pg, d, n), "equal buffers hash differently");
    EXPECT(pg_hash_floats(dev, d, n) == pg_hash_floats(DEVICE_CPU, h, n), "device and host hashes differ");
    int last = pg_world(pg) - 1;
    if (pg_world(pg) > 1) {
        // One flipped low bit of one float on the last rank.
        float f = h[n / 2];
        uint32_t bits;
        memcpy(&bits, &f, sizeof bits);
        bits ^= 1u;
        memcpy(&f, &bits, sizeof f);
        if (pg_rank(pg) == last) device_copy_to(dev, d + n / 2, &f, sizeof f);
        EXPECT(!pg_identical(pg, d, n), "a one-bit difference on rank %d was not detected", last);
        // 0.0 and -0.0 compare equal as floats but are different bits.
        device_copy_to(dev, d, h, n * sizeof(float));
        float zero = pg_rank(pg) == last ? -0.0f : 0.0f;
        device_copy_to(dev, d + 1, &zero, sizeof zero);
        EXPECT(!pg_identical(pg, d, n), "-0.0 on rank %d vs 0.0 was not detected", last);
    }
    device_free(dev, d);
    free(h);
}

// A slow rank is not a stalled one: the last rank arrives 1.5 s late at 3 all-reduces (the others wait long
// enough to send their arrival notes, kit/dist.c), and everything completes with the right sums.
static void case_slow(void) {
    int last = pg_world(pg) - 1;
    float *h = xcalloc(1000, sizeof(float));
    float *d = to_device(h, 1000);
    for (int k = 0; k < 3; k++) {
        if (pg_rank(pg) == last) usleep(1500 * 1000);
        for (int i = 0; i < 1000; i++) h[i] = 1.0f;
        device_copy_to(dev, d, h, 1000 * sizeof(float));
        pg_allreduce_sum(pg, d, 1000);
        device_copy_from(dev, h, d, 1000 * sizeof(float));
        for (int i = 0; i < 1000; i++)
            EXPECT(h[i] == (float)pg_world(pg), "slow rank, all-reduce %d: element %d is %g, expected %d", k, i,
                   (double)h[i], pg_world(pg));
    }
    device_free(dev, d);
    free(h);
}

// Reduce-scatters in flight (pg_reduce_scatter_sum_start) against the blocking call, on random floats (whose sums
// depend on the order of additions): three started at once and waited for in reverse order, then one that has
// finished before its wait (pg_progress polled it to completion, or NCCL's stream was drained): each result must
// be the blocking call's, bit for bit.
static void check_reduce_scatter_inflight(size_t n) {
    int w = pg_world(pg);
    size_t total = n * (size_t)w;
    float *h = xmalloc(total * sizeof(float)), *want[4], *got = xmalloc(n * sizeof(float));
    float *send[4], *recv[4];
    Rng r = rng_make(4321 + n, (uint64_t)pg_rank(pg));
    for (int k = 0; k < 4; k++) {
        for (size_t i = 0; i < total; i++) h[i] = rng_normal(&r) * (float)(k + 1);
        send[k] = to_device(h, total);
        recv[k] = device_alloc(dev, n * sizeof(float));
        pg_reduce_scatter_sum(pg, send[k], recv[k], n);
        want[k] = xmalloc(n * sizeof(float));
        from_device(want[k], recv[k], n);
        device_memset_zero(dev, recv[k], n * sizeof(float));
    }
    PgWork *work[3];
    for (int k = 0; k < 3; k++) work[k] = pg_reduce_scatter_sum_start(pg, send[k], recv[k], n);
    for (int k = 2; k >= 0; k--) pg_work_wait(pg, work[k], "reduce-scatter in flight");
    PgWork *done = pg_reduce_scatter_sum_start(pg, send[3], recv[3], n);
    const double until = time_now() + 0.05;  // long enough for small n; a larger one may still be moving: also fine
    while (time_now() < until) pg_progress(pg);
    device_synchronize(dev);  // every stream, NCCL's too (cudaDeviceSynchronize)
    pg_work_wait(pg, done, "reduce-scatter already done");
    for (int k = 0; k < 4; k++) {
        from_device(got, recv[k], n);
        for (size_t i = 0; i < n; i++)
            EXPECT(memcmp(&got[i], &want[k][i], sizeof(float)) == 0,
                   "reduce-scatter %d in flight, %zu floats per rank: element %zu is %.9g, the blocking call gives %.9g",
                   k, n, i, (double)got[i], (double)want[k][i]);
        device_free(dev, send[k]);
        device_free(dev, recv[k]);
        free(want[k]);
    }
    free(got);
    free(h);
}

// Reduce-scatter: rank r gets the sum over ranks of block r; then an all-gather of those blocks gives back
// the all-reduce (the identity lesson 09 teaches). Small integers: the sums are exact.
static void case_reduce_scatter(void) {
    int w = pg_world(pg), r = pg_rank(pg);
    const size_t sizes[] = {1, 7, 100003};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        size_t n = sizes[si], total = n * (size_t)w;
        float *h = xmalloc(total * sizeof(float));
        for (size_t i = 0; i < total; i++) h[i] = value_at(r, i);
        float *send = to_device(h, total), *block = device_alloc(dev, n * sizeof(float));
        float *all = device_alloc(dev, total * sizeof(float));
        pg_reduce_scatter_sum(pg, send, block, n);
        pg_allgather(pg, block, all, n);
        from_device(h, all, total);
        for (size_t i = 0; i < total; i++) {
            float want = 0;
            for (int q = 0; q < w; q++) want += value_at(q, i);
            EXPECT(h[i] == want, "reduce-scatter + all-gather of %zu floats per rank: element %zu is %g, expected %g",
                   n, i, (double)h[i], (double)want);
        }
        device_free(dev, send);
        device_free(dev, block);
        device_free(dev, all);
        free(h);
        check_reduce_scatter_inflight(n);
    }
}

// ---------------------------------------------------------------- point to point and sub-groups

// A ring: every rank sends 3 messages to the next rank with tags 0-2 (all started before any wait) and receives
// them from the previous rank in reverse tag order: tags, not arrival order, match. Then an odd size (1 float)
// and a large one (1000003 floats, past MPI's eager limit: the send completes only when the receive runs).
static void case_p2p(void) {
    int w = pg_world(pg), r = pg_rank(pg);
    if (w < 2) return;
    int next = (r + 1) % w, prev = (r + w - 1) % w;
    const size_t sizes[] = {1, 7, 1000003};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        size_t n = sizes[si];
        float *h = xmalloc(n * sizeof(float));
        float *out[3], *in[3];
        PgSend *sends[3];
        for (int t = 0; t < 3; t++) {
            for (size_t i = 0; i < n; i++) h[i] = value_at(r * 3 + t, i);
            out[t] = to_device(h, n);
            in[t] = device_alloc(dev, n * sizeof(float));
        }
        // On 2 ranks next == prev: both start sends to each other before either receives (1F1B's pattern).
        for (int t = 0; t < 3; t++) sends[t] = pg_send_start(pg, out[t], n, next, t);
        for (int t = 2; t >= 0; t--) pg_recv(pg, in[t], n, prev, t, "ring message");
        for (int t = 0; t < 3; t++) pg_send_wait(pg, sends[t], "ring message");
        for (int t = 0; t < 3; t++) {
            from_device(h, in[t], n);
            for (size_t i = 0; i < n; i++)
                EXPECT(h[i] == value_at(prev * 3 + t, i), "p2p %zu floats, tag %d: element %zu is %g, expected %g",
                       n, t, i, (double)h[i], (double)value_at(prev * 3 + t, i));
            device_free(dev, out[t]);
            device_free(dev, in[t]);
        }
        free(h);
    }
}

// Two sub-groups (even and odd ranks, ranked in reverse): an all-reduce sums over the group only, its ranks are
// 0..size-1 in key order, and a message inside it uses the group's ranks.
static void case_split(void) {
    int w = pg_world(pg), r = pg_rank(pg);
    ProcessGroup *g = pg_split(pg, r % 2, -r);
    int members = (w - r % 2 + 1) / 2;  // ranks of the same parity in 0..w-1
    EXPECT(pg_world(g) == members, "sub-group of parity %d has %d ranks, expected %d", r % 2, pg_world(g), members);
    int higher = 0;  // same-parity ranks above r come first (key -rank)
    for (int q = r + 2; q < w; q += 2) higher++;
    EXPECT(pg_rank(g) == higher, "rank %d is rank %d of its sub-group, expected %d", r, pg_rank(g), higher);
    float v = (float)(r + 1), sum = 0;
    for (int q = r % 2; q < w; q += 2) sum += (float)(q + 1);
    float *d = to_device(&v, 1);
    pg_allreduce_sum(g, d, 1);
    from_device(&v, d, 1);
    EXPECT(v == sum, "sub-group all-reduce on rank %d: %g, expected %g (the sum over its parity only)", r, (double)v,
           (double)sum);
    if (pg_world(g) > 1) {  // group rank 0 -> 1: the world ranks differ, the group's are used
        float x = (float)(100 + r);
        if (pg_rank(g) == 0) pg_send(g, d, 1, 1, 9, "sub-group message");
        if (pg_rank(g) == 1) {
            pg_recv(g, d, 1, 0, 9, "sub-group message");
            from_device(&x, d, 1);
            EXPECT(x == sum, "sub-group message on rank %d: %g, expected %g", r, (double)x, (double)sum);
        }
    }
    device_free(dev, d);
    pg_finalize(g);
}

// The traffic counters: known sizes handed to every kind of call -> exact counts (bytes x 4 per float, x 8 per
// double, one call each); barriers, hashes and pg_split count nothing; a sub-group counts only its own calls.
static void expect_traffic(const PgTraffic *got, const PgTraffic *want, const char *after) {
    EXPECT(got->p2p_bytes_sent == want->p2p_bytes_sent && got->p2p_msgs == want->p2p_msgs &&
               got->p2p_bytes_recv == want->p2p_bytes_recv && got->coll_bytes_in == want->coll_bytes_in &&
               got->coll_calls == want->coll_calls,
           "traffic after %s on rank %d: sent %llu B in %llu msgs, recv %llu B, coll %llu B in %llu calls; expected "
           "%llu B in %llu msgs, recv %llu B, coll %llu B in %llu calls", after, pg_rank(pg),
           (unsigned long long)got->p2p_bytes_sent, (unsigned long long)got->p2p_msgs,
           (unsigned long long)got->p2p_bytes_recv, (unsigned long long)got->coll_bytes_in,
           (unsigned long long)got->coll_calls, (unsigned long long)want->p2p_bytes_sent,
           (unsigned long long)want->p2p_msgs, (unsigned long long)want->p2p_bytes_recv,
           (unsigned long long)want->coll_bytes_in, (unsigned long long)want->coll_calls);
}

static PgTraffic traffic_since(const PgTraffic *t0, const ProcessGroup *g) {
    PgTraffic t = pg_traffic(g);
    return (PgTraffic){t.p2p_bytes_sent - t0->p2p_bytes_sent, t.p2p_msgs - t0->p2p_msgs,
                       t.p2p_bytes_recv - t0->p2p_bytes_recv, t.coll_bytes_in - t0->coll_bytes_in,
                       t.coll_calls - t0->coll_calls};
}

static void case_traffic(void) {
    int w = pg_world(pg), r = pg_rank(pg);
    PgTraffic t0 = pg_traffic(pg);
    enum { BIG = 1000 };
    float *d = device_alloc(dev, (size_t)(BIG + 16 * w) * sizeof(float));  // (BIG + 16 w) zeros
    float *g = device_alloc(dev, (size_t)(BIG + 16 * w) * sizeof(float));  // outputs and received messages
    device_memset_zero(dev, d, (size_t)(BIG + 16 * w) * sizeof(float));
    device_memset_zero(dev, g, (size_t)(BIG + 16 * w) * sizeof(float));
    double host[6] = {0};
    pg_allreduce_sum(pg, d, 7);
    pg_allreduce_avg(pg, d, BIG);
    pg_wait(pg, pg_iallreduce(pg, d, 3, PG_SUM));
    pg_broadcast(pg, d, 5, w - 1);
    pg_allgather(pg, d, g, 11);
    pg_reduce_scatter_sum(pg, d, g, 4);   // input (w, 4)
    pg_allreduce_sum_double_host(pg, host, 6);
    pg_barrier(pg);                        // not counted
    (void)pg_identical(pg, d, 9);          // the kit's own check: not counted
    PgTraffic want = {0, 0, 0, 4 * (7 + BIG + 3 + 5 + 11 + 4 * (uint64_t)w) + 8 * 6, 7};
    PgTraffic got = traffic_since(&t0, pg);
    expect_traffic(&got, &want, "7 collectives");
    // A reduce-scatter in flight counts as the blocking one does, when it starts; its wait adds nothing.
    PgWork *work = pg_reduce_scatter_sum_start(pg, d, g, 6);  // input (w, 6)
    want.coll_bytes_in += 4 * 6 * (uint64_t)w;
    want.coll_calls++;
    got = traffic_since(&t0, pg);
    expect_traffic(&got, &want, "a reduce-scatter started");
    pg_work_wait(pg, work, "counted reduce-scatter");
    got = traffic_since(&t0, pg);
    expect_traffic(&got, &want, "its wait");
    if (w >= 2) {  // to the next rank: 3 messages of 1, 9 and 100 floats; the same from the previous one
        int next = (r + 1) % w, prev = (r + w - 1) % w;
        const size_t n[3] = {1, 9, 100};
        PgSend *s[3];
        for (int t = 0; t < 3; t++) s[t] = pg_send_start(pg, d, n[t], next, t);
        for (int t = 0; t < 3; t++) pg_recv(pg, g, n[t], prev, t, "traffic message");
        for (int t = 0; t < 3; t++) pg_send_wait(pg, s[t], "traffic message");
        want.p2p_bytes_sent = want.p2p_bytes_recv = 4 * (1 + 9 + 100);
        want.p2p_msgs = 3;
        got = traffic_since(&t0, pg);
        expect_traffic(&got, &want, "3 messages");
    }
    ProcessGroup *sub = pg_split(pg, r % 2, r);  // the split and the group's calls leave the parent's counts
    PgTraffic s0 = pg_traffic(sub);
    PgTraffic zero = {0};
    expect_traffic(&s0, &zero, "pg_split (the new group's own counts)");
    pg_allreduce_sum(sub, d, 2);
    PgTraffic sub_want = {0, 0, 0, 8, 1};
    PgTraffic sub_got = traffic_since(&zero, sub);
    expect_traffic(&sub_got, &sub_want, "one all-reduce of 2 floats in a sub-group");
    got = traffic_since(&t0, pg);
    expect_traffic(&got, &want, "pg_split and a sub-group's all-reduce (the parent's counts)");
    pg_finalize(sub);
    device_free(dev, g);
    device_free(dev, d);
}

// Mistakes in a pipeline's messages, which must end the job naming them (the script checks the words).
static void case_p2p_failure(const char *which) {
    if (pg_world(pg) < 2) return;
    float buf[8] = {0};
    float *d = to_device(buf, 8);
    if (pg_rank(pg) == 1) {
        if (strcmp(which, "p2p-size") == 0) pg_send(pg, d, 8, 0, 4, "activation of micro-batch 4");
        if (strcmp(which, "p2p-tag") == 0) pg_send_start(pg, d, 7, 0, 5);  // micro-batch 5 sent where 4 is awaited
        // p2p-missing: rank 1 sends nothing
    }
    if (pg_rank(pg) == 0) pg_recv(pg, d, 7, 1, 4, "activation of micro-batch 4");
    if (pg_rank(pg) == 0) printf("UNEXPECTED: the receive completed\n");
    pg_barrier(pg);
    device_free(dev, d);
}

// ---------------------------------------------------------------- failures (the script checks them)

static void case_failure(const char *which) {
    // 4 MB: big enough to be mid-transfer when a rank vanishes, and one MPI call whether blocking or not (a
    // blocking all-reduce above 4 MB goes in pieces, which the killed rank's pg_iallreduce would not match).
    const size_t n = 1 << 20;
    float *h = xcalloc(n, sizeof(float));
    float *d = to_device(h, n);
    pg_allreduce_sum(pg, d, 1000);  // everyone connected and working first
    int last = pg_world(pg) - 1;
    if (strcmp(which, "check-fail") == 0) {
        if (pg_rank(pg) == last) device_copy_to(dev, d + 5, &(float){1.0f}, sizeof(float));
        pg_check_identical(pg, d, n, "test parameters");
    } else if (pg_rank(pg) == last && strcmp(which, "kill") == 0) {
        PgRequest q = pg_iallreduce(pg, d, n, PG_SUM);
        (void)q;
        raise(SIGKILL);
    } else if (pg_rank(pg) == last && strcmp(which, "stall") == 0) {
        sleep(3600);
    } else if (pg_rank(pg) == last && strcmp(which, "sigstop") == 0) {
        raise(SIGSTOP);  // MPI_Abort's SIGKILL still ends a stopped process
    } else if (strcmp(which, "mark-twice") == 0 || strcmp(which, "mark-partial") == 0) {
        TensorView views[16];
        size_t total = 0;
        int nv = make_views(views, &total);
        float *g = device_alloc(dev, total * sizeof(float));
        GradBuckets *gb = buckets_create(pg, g, views, nv, total, 4096);
        buckets_begin(gb);
        if (strcmp(which, "mark-twice") == 0) {
            buckets_on_grads_ready(gb, views[3].offset, views[3].count);
            buckets_on_grads_ready(gb, views[3].offset, views[3].count);
        } else {
            buckets_on_grads_ready(gb, views[3].offset, views[3].count + 1);  // ends inside view 4
        }
    } else if (strcmp(which, "work-twice") == 0) {
        PgWork *w = pg_reduce_scatter_sum_start(pg, d, d + n / 2, n / 2 / (size_t)pg_world(pg));
        pg_work_wait(pg, w, "reduce-scatter");
        pg_work_wait(pg, w, "reduce-scatter");  // a second time: an error, not a hang or a stale result
    } else if (pg_rank(pg) == last && strcmp(which, "exit") == 0) {
        fprintf(stderr, "rank %d: exiting with status 3 on purpose\n", last);
        exit(3);
    }
    pg_allreduce_sum(pg, d, n);
    // Reaching this line on rank 0 means the failure went unnoticed.
    if (pg_rank(pg) == 0) printf("UNEXPECTED: the all-reduce completed\n");
    device_free(dev, d);
    free(h);
}

int main(int argc, char **argv) {
    const char *backend = "mpi", *device = "cpu", *which = argc > 1 ? argv[1] : "";
    double timeout = 10.0;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc) backend = argv[++i];
        else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) device = argv[++i];
        else if (strcmp(argv[i], "--timeout") == 0 && i + 1 < argc) timeout = atof(argv[++i]);
        else die("unknown option %s", argv[i]);
    }
    if (!device_parse(device, &dev, true)) die("--device %s: use cpu, cuda or auto", device);
    pg = pg_init(&argc, &argv, backend, dev, timeout);
    bool all = strcmp(which, "all") == 0;
    if (all) {
        case_collectives();
        case_pieces();
        case_buckets();
        case_model();
        case_hash();
        case_reduce_scatter();
        case_p2p();
        case_split();
        case_traffic();
    } else if (strcmp(which, "collectives") == 0) case_collectives();
    else if (strcmp(which, "pieces") == 0) case_pieces();
    else if (strcmp(which, "model") == 0) case_model();
    else if (strcmp(which, "buckets") == 0) case_buckets();
    else if (strcmp(which, "hash") == 0) case_hash();
    else if (strcmp(which, "slow") == 0) case_slow();
    else if (strcmp(which, "reduce-scatter") == 0) case_reduce_scatter();
    else if (strcmp(which, "p2p") == 0) case_p2p();
    else if (strcmp(which, "split") == 0) case_split();
    else if (strcmp(which, "traffic") == 0) case_traffic();
    else if (strncmp(which, "p2p-", 4) == 0) case_p2p_failure(which);
    else if (strcmp(which, "check-fail") == 0 || strcmp(which, "kill") == 0 || strcmp(which, "stall") == 0 ||
             strcmp(which, "sigstop") == 0 || strcmp(which, "exit") == 0 || strcmp(which, "mark-twice") == 0 || strcmp(which, "mark-partial") == 0 ||
             strcmp(which, "work-twice") == 0)
        case_failure(which);
    else pg_abort(pg, "unknown case: see the comment at the top of tests/mpi_dist.c");
    pg_barrier(pg);
    if (pg_rank(pg) == 0) printf("PASS %s (world %d, backend %s, device %s)\n", which, pg_world(pg),
                                 pg_backend_name(pg_backend(pg)), device_name(dev));
    pg_finalize(pg);
    return 0;
}
