// tests/test_dist_plan.c: the process group's pure parts (no MPI, no GPU): the backend decision (NCCL
// refused for several ranks per GPU), bucket planning, and buffer hashing. The collectives themselves
// are tested under mpirun by tests/run-dist-tests.sh.
#include <sys/wait.h>
#include <unistd.h>

#include "tests/testutil.h"

#include "kit/buckets_plan.h"
#include "kit/dist_plan.h"

// ---------------------------------------------------------------- backend choice

static bool choose(const char *req, Device dev, bool nccl_built, int ranks_per_gpu, PgBackend *out, char *why) {
    return pg_choose_backend(req, PG_START_MPIRUN, dev, nccl_built, ranks_per_gpu, out, why, 512);
}

static void test_backend_mpi_always_possible(void **state) {
    (void)state;
    char why[512];
    PgBackend b = PG_BACKEND_NCCL;
    assert_true(choose("mpi", DEVICE_CPU, false, 0, &b, why));
    assert_int_equal(b, PG_BACKEND_MPI);
    b = PG_BACKEND_NCCL;
    assert_true(choose("mpi", DEVICE_CUDA, true, 4, &b, why));  // 4 ranks on one GPU: fine over MPI
    assert_int_equal(b, PG_BACKEND_MPI);
}

static void test_backend_nccl_one_rank_per_gpu(void **state) {
    (void)state;
    char why[512];
    PgBackend b = PG_BACKEND_MPI;
    assert_true(choose("nccl", DEVICE_CUDA, true, 1, &b, why));
    assert_int_equal(b, PG_BACKEND_NCCL);
    b = PG_BACKEND_MPI;
    assert_true(choose("auto", DEVICE_CUDA, true, 1, &b, why));
    assert_int_equal(b, PG_BACKEND_NCCL);
}

static void test_backend_nccl_refused_when_ranks_share_a_gpu(void **state) {
    (void)state;
    char why[512] = "";
    PgBackend b = PG_BACKEND_MPI;
    assert_false(choose("nccl", DEVICE_CUDA, true, 2, &b, why));
    assert_non_null(strstr(why, "2 ranks share one GPU"));
    assert_non_null(strstr(why, "--backend mpi"));
    // auto falls back to MPI instead, and says why.
    assert_true(choose("auto", DEVICE_CUDA, true, 2, &b, why));
    assert_int_equal(b, PG_BACKEND_MPI);
    assert_non_null(strstr(why, "share one GPU"));
}

static void test_backend_nccl_refused_without_gpu_or_build(void **state) {
    (void)state;
    char why[512] = "";
    PgBackend b;
    assert_false(choose("nccl", DEVICE_CPU, true, 0, &b, why));
    assert_non_null(strstr(why, "--backend mpi"));
    assert_false(choose("nccl", DEVICE_CUDA, false, 1, &b, why));
    assert_non_null(strstr(why, "without NCCL"));
    assert_false(choose("nccl", DEVICE_CUDA, true, 0, &b, why));
    assert_true(choose("auto", DEVICE_CPU, true, 0, &b, why));
    assert_int_equal(b, PG_BACKEND_MPI);
    assert_true(choose(NULL, DEVICE_CUDA, false, 1, &b, why));  // NULL = auto
    assert_int_equal(b, PG_BACKEND_MPI);
}

static void test_backend_unknown_name(void **state) {
    (void)state;
    char why[512] = "";
    PgBackend b;
    assert_false(choose("gloo", DEVICE_CPU, false, 0, &b, why));
    assert_non_null(strstr(why, "gloo"));
}

// The one table: --backend's choices, and which start runs which backend.
static void test_backend_table_and_starts(void **state) {
    (void)state;
    assert_string_equal(pg_backend_choices(), "auto|mpi|nccl|socket");
    char why[512] = "";
    PgBackend b = PG_BACKEND_NCCL;
    // socket is for store-started jobs: refused under mpirun, with the names mpirun can run.
    assert_false(choose("socket", DEVICE_CPU, false, 0, &b, why));
    assert_non_null(strstr(why, "rendezvous store"));
    assert_non_null(strstr(why, "auto, mpi or nccl"));
    assert_true(pg_choose_backend("socket", PG_START_STORE, DEVICE_CPU, false, 0, &b, why, sizeof why));
    assert_int_equal(b, PG_BACKEND_SOCKET);
    // mpi needs mpirun.
    assert_false(pg_choose_backend("mpi", PG_START_STORE, DEVICE_CPU, false, 0, &b, why, sizeof why));
    assert_non_null(strstr(why, "needs mpirun"));
    assert_non_null(strstr(why, "auto, nccl or socket"));
    // From a store, auto falls back to the sockets (and says so), and a refused NCCL names them.
    assert_true(pg_choose_backend("auto", PG_START_STORE, DEVICE_CUDA, true, 2, &b, why, sizeof why));
    assert_int_equal(b, PG_BACKEND_SOCKET);
    assert_non_null(strstr(why, "auto: socket, because 2 ranks share one GPU"));
    assert_false(pg_choose_backend("nccl", PG_START_STORE, DEVICE_CPU, true, 0, &b, why, sizeof why));
    assert_non_null(strstr(why, "--backend socket"));
    assert_true(pg_choose_backend("auto", PG_START_STORE, DEVICE_CUDA, true, 1, &b, why, sizeof why));
    assert_int_equal(b, PG_BACKEND_NCCL);
}

static void test_max_duplicates(void **state) {
    (void)state;
    enum { W = 16 };
    char ids[4][W] = {"0000:17:00.0", "0000:65:00.0", "0000:17:00.0", "0000:b3:00.0"};
    assert_int_equal(pg_max_duplicates(&ids[0][0], 4, W), 2);
    assert_int_equal(pg_max_duplicates(&ids[1][0], 1, W), 1);
    strcpy(ids[2], "0000:ca:00.0");
    assert_int_equal(pg_max_duplicates(&ids[0][0], 4, W), 1);
}

// ---------------------------------------------------------------- bucket plan

// Views with the given counts, laid out in order.
static int views_of(TensorView *v, const size_t *counts, int n, size_t *total) {
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        memset(&v[i], 0, sizeof v[i]);
        snprintf(v[i].name, sizeof v[i].name, "v%d", i);
        v[i].offset = off;
        v[i].count = counts[i];
        off += counts[i];
    }
    *total = off;
    return n;
}

// Every bucket is contiguous and made of whole views; together they tile [0, total), bucket 0 at the end.
static void assert_plan_consistent(const TensorView *v, int nv, size_t total, const GradBucket *b, int nb,
                                   const int *vb) {
    size_t end = total;
    for (int i = 0; i < nb; i++) {
        assert_int_equal(b[i].offset + b[i].count, end);  // reverse order, no gap
        end = b[i].offset;
        size_t sum = 0;
        int views = 0;
        for (int k = 0; k < nv; k++)
            if (vb[k] == i) {
                assert_true(v[k].offset >= b[i].offset && v[k].offset + v[k].count <= b[i].offset + b[i].count);
                sum += v[k].count;
                views++;
            }
        assert_int_equal(sum, b[i].count);
        assert_int_equal(views, b[i].n_views);
    }
    assert_int_equal(end, 0);
}

static void test_plan_reverse_order_and_whole_views(void **state) {
    (void)state;
    // 100 floats = 400 bytes per bucket.
    const size_t counts[] = {30, 30, 30, 30, 30, 250, 10, 10};
    TensorView v[8];
    size_t total;
    int nv = views_of(v, counts, 8, &total);
    GradBucket b[8];
    int vb[8];
    int nb = buckets_plan(v, nv, total, 400, b, vb);
    assert_plan_consistent(v, nv, total, b, nb, vb);
    // From the end: {v6, v7} (20), then v5 alone (250 > cap: its own bucket), then {v2, v3, v4} (90),
    // then {v0, v1} (60).
    assert_int_equal(nb, 4);
    assert_int_equal(vb[7], 0);
    assert_int_equal(vb[6], 0);
    assert_int_equal(vb[5], 1);
    assert_int_equal(b[1].count, 250);
    assert_int_equal(vb[4], 2);
    assert_int_equal(vb[2], 2);
    assert_int_equal(vb[1], 3);
    assert_int_equal(vb[0], 3);
    assert_int_equal(b[3].offset, 0);
}

static void test_plan_default_is_one_bucket_for_small_models(void **state) {
    (void)state;
    const size_t counts[] = {1000, 7, 1, 123456};
    TensorView v[4];
    size_t total;
    int nv = views_of(v, counts, 4, &total);
    GradBucket b[4];
    int vb[4];
    assert_int_equal(buckets_plan(v, nv, total, 0, b, vb), 1);  // 0 = 25 MB
    assert_int_equal(b[0].offset, 0);
    assert_int_equal(b[0].count, total);
    // A tiny cap: one bucket per view.
    assert_int_equal(buckets_plan(v, nv, total, 1, b, vb), 4);
    assert_plan_consistent(v, nv, total, b, 4, vb);
}

static void test_plan_views_out_of_order(void **state) {
    (void)state;
    // The table order need not be the memory order (the model lists a layer's weight and bias together,
    // but stores weights first and biases after).
    const size_t counts[] = {40, 40, 40, 40};
    TensorView v[4];
    size_t total;
    views_of(v, counts, 4, &total);
    TensorView shuffled[4] = {v[2], v[0], v[3], v[1]};
    GradBucket b[4];
    int vb[4];
    int nb = buckets_plan(shuffled, 4, total, 80 * sizeof(float), b, vb);
    assert_int_equal(nb, 2);
    assert_plan_consistent(shuffled, 4, total, b, nb, vb);
    assert_int_equal(vb[2], 0);  // v[3], the last in memory, is in bucket 0
    assert_int_equal(vb[1], 1);  // v[0]
}

// A gap between views is a programming error: the plan stops with a message instead of reducing garbage.
static void test_plan_rejects_gap(void **state) {
    (void)state;
    const size_t counts[] = {10, 10};
    TensorView v[2];
    size_t total;
    views_of(v, counts, 2, &total);
    v[1].offset = 12;  // gap [10, 12)
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr)) _exit(2);
        GradBucket b[2];
        int vb[2];
        buckets_plan(v, 2, 22, 0, b, vb);
        _exit(0);  // not reached when the check works
    }
    int status = 0;
    waitpid(pid, &status, 0);
    assert_true(WIFEXITED(status));
    assert_int_not_equal(WEXITSTATUS(status), 0);
}

// ---------------------------------------------------------------- hashing

static void test_hash_sees_one_bit(void **state) {
    (void)state;
    enum { N = 100003 };
    float *x = xmalloc(N * sizeof(float));
    fill_uniform(x, N, -1, 1, 7);
    uint32_t h0 = pg_hash_floats(DEVICE_CPU, x, N);
    assert_int_equal(h0, pg_hash_floats(DEVICE_CPU, x, N));  // deterministic
    uint32_t bits;
    memcpy(&bits, &x[N - 1], 4);
    bits ^= 1u;
    memcpy(&x[N - 1], &bits, 4);
    assert_int_not_equal(h0, pg_hash_floats(DEVICE_CPU, x, N));
    // +0.0 and -0.0 are equal floats but different bits: the hash is about bits.
    float z[2] = {0.0f, 1.0f}, nz[2] = {-0.0f, 1.0f};
    assert_int_not_equal(pg_hash_floats(DEVICE_CPU, z, 2), pg_hash_floats(DEVICE_CPU, nz, 2));
    free(x);
}

static void test_hash_matches_on_gpu(void **state) {
    (void)state;
    skip_without_gpu();
    enum { N = (1 << 20) + 5 };  // more than one host chunk
    float *x = xmalloc(N * sizeof(float));
    fill_uniform(x, N, -1, 1, 3);
    float *d = device_alloc(DEVICE_CUDA, N * sizeof(float));
    device_copy_to(DEVICE_CUDA, d, x, N * sizeof(float));
    assert_int_equal(pg_hash_floats(DEVICE_CUDA, d, N), pg_hash_floats(DEVICE_CPU, x, N));
    device_free(DEVICE_CUDA, d);
    free(x);
}

// The stalled-rank report names exactly the ranks that never said they were waiting in collective #seq.
static void test_describe_absent(void **state) {
    (void)state;
    char out[512];
    const long long one_stalled[4] = {1834, 1834, 1833, 1834};  // rank 2 is still before #1834
    pg_describe_absent(one_stalled, 4, 0, 1834, out, sizeof out);
    assert_non_null(strstr(out, "rank 2 did not join it"));
    assert_null(strstr(out, "LATER"));
    const long long two[4] = {1834, 0, 1834, 7};  // ranks 1 and 3 never waited long enough to say
    pg_describe_absent(two, 4, 2, 1834, out, sizeof out);
    assert_non_null(strstr(out, "ranks 1, 3 did not join it"));
    const long long ahead[3] = {5, 6, 5};  // rank 1 is one collective further: a rank made an extra call
    pg_describe_absent(ahead, 3, 0, 5, out, sizeof out);
    assert_non_null(strstr(out, "rank 1 waited in a LATER collective"));
    assert_null(strstr(out, "did not join"));
    const long long all[2] = {9, 9};
    pg_describe_absent(all, 2, 1, 9, out, sizeof out);
    assert_non_null(strstr(out, "every rank joined it"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backend_mpi_always_possible),
        cmocka_unit_test(test_backend_nccl_one_rank_per_gpu),
        cmocka_unit_test(test_backend_nccl_refused_when_ranks_share_a_gpu),
        cmocka_unit_test(test_backend_nccl_refused_without_gpu_or_build),
        cmocka_unit_test(test_backend_unknown_name),
        cmocka_unit_test(test_backend_table_and_starts),
        cmocka_unit_test(test_max_duplicates),
        cmocka_unit_test(test_plan_reverse_order_and_whole_views),
        cmocka_unit_test(test_plan_default_is_one_bucket_for_small_models),
        cmocka_unit_test(test_plan_views_out_of_order),
        cmocka_unit_test(test_plan_rejects_gap),
        cmocka_unit_test(test_hash_sees_one_bit),
        cmocka_unit_test(test_hash_matches_on_gpu),
        cmocka_unit_test(test_describe_absent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
