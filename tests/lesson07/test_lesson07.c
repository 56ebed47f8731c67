// tests/lesson07/test_lesson07.c: the autograder for lesson 07 (the learner's bootstrap.c and ring.c).
//
// Built with Open MPI and run on GRADE_NP ranks (solutions/07-scale-out/lesson.mk) like lessons 03 and 04: every
// rank runs the same test and writes its own verdict (tests/grading.h). MPI is the referee here: it tells the
// ranks the port of a test's store (rank 0 probes a free one), and its all-reduce is what the learner's ring
// must equal. Each rank decides from values every rank has (an MPI all-reduce of the verdicts) before
// asserting, so no rank waits in a collective for a rank that already left the test.
//
// The ports: a store's port comes from binding port 0 (the system picks a free one) and closing it again, so
// tests running in parallel with other suites do not collide; the tiny window between the probe and the store
// binding it again is reported as "port in use" by the store, never as a wrong result.
#include <mpi.h>

#include "tests/testutil.h"
#include "tests/grading.h"
#include "tests/mpi_testutil.h"

#include <math.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kit/cli.h"
#include "kit/dist.h"
#include "kit/log.h"
#include "kit/model.h"
#include "kit/sock.h"
#include "kit/store.h"
#include "lesson.h"

#define STORE_TIMEOUT_S 10.0

static int mpi_rank(void) {
    test_pg_named("test_lesson07", 20.0);  // MPI_Init, once per process
    int r;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}
static int mpi_world(void) {
    test_pg_named("test_lesson07", 20.0);
    int w;
    MPI_Comm_size(MPI_COMM_WORLD, &w);
    return w;
}
// True on every rank when ok is true on every rank.
static bool all_ok(bool ok) {
    int v = ok ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return v == 1;
}

// A free TCP port of this host, probed by this process alone.
static int free_port_local(void) {
    char err[256];
    int port = 0, fd = sock_listen(0, &port, err, sizeof err);
    assert_true(fd >= 0);
    close(fd);
    return port;
}
// One free port, the same on every rank (rank 0 probes it).
static int free_port_shared(void) {
    int port = mpi_rank() == 0 ? free_port_local() : 0;
    MPI_Bcast(&port, 1, MPI_INT, 0, MPI_COMM_WORLD);
    return port;
}

// The torchrun-style environment of `rank` of `world` with the store at 127.0.0.1:port, under job id `job`.
static void set_env(int rank, int world, int port, const char *job) {
    char v[32];
    snprintf(v, sizeof v, "%d", rank);
    setenv("RANK", v, 1);
    snprintf(v, sizeof v, "%d", world);
    setenv("WORLD_SIZE", v, 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    snprintf(v, sizeof v, "%d", port);
    setenv("MASTER_PORT", v, 1);
    unsetenv("LOCAL_RANK");
    setenv("KIT_RUN_ID", job, 1);
}

// A job id no other run of this suite shares: rank 0's pid, the same on every rank.
static void job_id(char *out, size_t len, const char *tag) {
    int pid = mpi_rank() == 0 ? (int)getpid() : 0;
    MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
    snprintf(out, len, "lesson07-%s-%d", tag, pid);
}

// Every rank joins a store at url, shares a token from rank 0 and gathers one int per rank: true on every rank
// when all of it worked and gave the right values. err: this rank's first failure.
static bool bootstrap_round(const char *init_method, int port, const char *job, char *err, size_t errlen) {
    int rank = mpi_rank(), world = mpi_world();
    set_env(rank, world, port, job);
    RdzvEnv e;
    bool ok = rdzv_env_read(&e, init_method, err, errlen) == 0;
    Store *s = ok ? rdzv_open(&e, STORE_TIMEOUT_S, err, errlen) : NULL;
    ok = s != NULL;
    unsigned char token[16], want[16];
    for (int i = 0; i < 16; i++) want[i] = (unsigned char)(port * 31 + i * 7 + (int)strlen(job));
    memcpy(token, rank == 0 ? want : (unsigned char[16]){0}, 16);
    if (ok && bootstrap_share(s, "token", token, sizeof token, err, errlen) < 0) ok = false;
    if (ok && memcmp(token, want, 16) != 0) ok = !check_reason(err, errlen, "bootstrap_share: rank %d got other bytes than rank 0's", rank);
    int mine = 1000 + 7 * rank, *all = calloc((size_t)world, sizeof *all);
    if (ok && bootstrap_allgather(s, "num", &mine, sizeof mine, all, err, errlen) < 0) ok = false;
    for (int r = 0; ok && r < world; r++)
        if (all[r] != 1000 + 7 * r) ok = !check_reason(err, errlen, "bootstrap_allgather: slot %d holds %d, rank %d sent %d", r, all[r], r, 1000 + 7 * r);
    if (ok && (store_rank(s) != rank || store_world(s) != world))
        ok = !check_reason(err, errlen, "the store says rank %d of %d; RANK=%d WORLD_SIZE=%d", store_rank(s), store_world(s), rank, world);
    free(all);
    bool every = all_ok(ok);
    store_close(s);
    return every;
}

// ---------------------------------------------------------------- TODO 1a: the environment

static void test_env_read(void **state) {
    (void)state;
    char err[512] = "";
    RdzvEnv e;
    set_env(1, 3, 1234, "x");
    setenv("MASTER_ADDR", "node7", 1);
    setenv("LOCAL_RANK", "1", 1);
    assert_int_equal(rdzv_env_read(&e, "env", err, sizeof err), 0);
    assert_int_equal(e.rank, 1);
    assert_int_equal(e.world, 3);
    assert_int_equal(e.local_rank, 1);
    assert_string_equal(e.url, "tcp://node7:1234");
    unsetenv("LOCAL_RANK");
    assert_int_equal(rdzv_env_read(&e, "file:///shared/job.store", err, sizeof err), 0);
    assert_int_equal(e.local_rank, -1);
    assert_string_equal(e.url, "file:///shared/job.store");
    unsetenv("MASTER_PORT");  // a job script's typo: the error must name the variable
    err[0] = '\0';
    assert_int_equal(rdzv_env_read(&e, "env", err, sizeof err), -1);
    assert_non_null(strstr(err, "MASTER_PORT"));
    set_env(3, 3, 1234, "x");  // RANK outside 0..WORLD_SIZE-1
    err[0] = '\0';
    assert_int_equal(rdzv_env_read(&e, "env", err, sizeof err), -1);
    assert_non_null(strstr(err, "RANK"));
    unsetenv("WORLD_SIZE");
    err[0] = '\0';
    assert_int_equal(rdzv_env_read(&e, "env", err, sizeof err), -1);
    assert_non_null(strstr(err, "WORLD_SIZE"));
}

// ---------------------------------------------------------------- TODO 4: the node map

static void test_node_map(void **state) {
    (void)state;
    const char hosts[6][RDZV_HOST_LEN] = {"a", "b", "a", "c", "b", "a"};
    struct { int rank, node, local_rank, local_world; } want[] = {
        {0, 0, 0, 3}, {1, 1, 0, 2}, {2, 0, 1, 3}, {3, 2, 0, 1}, {4, 1, 1, 2}, {5, 0, 2, 3}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        NodeMap m = rdzv_node_map(hosts, 6, want[i].rank);
        if (m.nodes != 3 || m.node != want[i].node || m.local_rank != want[i].local_rank ||
            m.local_world != want[i].local_world)
            fail_msg("hosts a b a c b a, rank %d: got node %d of %d, local rank %d of %d; want node %d of 3, local "
                     "rank %d of %d", want[i].rank, m.node, m.nodes, m.local_rank, m.local_world, want[i].node,
                     want[i].local_rank, want[i].local_world);
    }
    const char one[1][RDZV_HOST_LEN] = {"solo"};
    NodeMap m = rdzv_node_map(one, 1, 0);
    assert_true(m.nodes == 1 && m.node == 0 && m.local_rank == 0 && m.local_world == 1);
}

// ---------------------------------------------------------------- TODO 1b, 2, 3: the TCP store

static void test_tcp_bootstrap(void **state) {
    (void)state;
    char job[64], err[1024] = "";
    job_id(job, sizeof job, "tcp");
    bool ok = bootstrap_round("env", free_port_shared(), job, err, sizeof err);
    if (!ok) fail_msg("rank %d: %s", mpi_rank(), err[0] ? err : "(another rank failed)");
}

// A rank that never comes: the wait ends at the timeout, and the error names that rank.
static void test_tcp_missing_rank_named(void **state) {
    (void)state;
    char err[1024] = "";
    // Each rank alone: rank 0 of a job of 3 whose ranks 1 and 2 never start.
    int port = free_port_local();
    char url[64];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", port);
    const double timeout = 1.0;
    Store *s = store_open(url, "lonely", 0, 3, timeout, err, sizeof err);
    assert_non_null(s);
    int mine = 5, all[3];
    double start = time_now();
    int rc = bootstrap_allgather(s, "num", &mine, sizeof mine, all, err, sizeof err);
    double waited = time_now() - start;
    store_close(s);
    if (rc != -1) fail_msg("bootstrap_allgather returned %d with ranks 1 and 2 missing (expected -1)", rc);
    if (waited > timeout + 3.0) fail_msg("it returned after %.1f s: the store's timeout is %.1f s", waited, timeout);
    if (!strstr(err, "ranks 1, 2 never joined"))
        fail_msg("the error must name the missing ranks (the store's message, passed on), got: %s", err);
}

// Two jobs on one MASTER_ADDR:MASTER_PORT: the second job's rank is refused, the job's own rank is not.
static void test_tcp_second_job_refused(void **state) {
    (void)state;
    char err[1024] = "";
    int port = free_port_local();
    RdzvEnv e;
    set_env(0, 2, port, "jobA");
    assert_int_equal(rdzv_env_read(&e, "env", err, sizeof err), 0);
    Store *a0 = rdzv_open(&e, STORE_TIMEOUT_S, err, sizeof err);
    if (!a0) fail_msg("job A's rank 0 could not open its store: %s", err);
    set_env(1, 2, port, "jobB");
    assert_int_equal(rdzv_env_read(&e, "env", err, sizeof err), 0);
    err[0] = '\0';
    Store *b1 = rdzv_open(&e, STORE_TIMEOUT_S, err, sizeof err);
    set_env(1, 2, port, "jobA");
    char err2[512] = "";
    assert_int_equal(rdzv_env_read(&e, "env", err2, sizeof err2), 0);
    Store *a1 = rdzv_open(&e, STORE_TIMEOUT_S, err2, sizeof err2);
    bool b1_refused = b1 == NULL && strstr(err, "refused") && strstr(err, "jobA");
    store_close(b1);
    store_close(a1);
    store_close(a0);
    if (!b1_refused) fail_msg("a rank of job 'jobB' joined job 'jobA''s store (the store refuses it only when it is told each rank's job id): %s", err);
    if (!a1) fail_msg("job A's own rank 1 was refused: %s", err2);
}

// ---------------------------------------------------------------- TODO 1-3: the file store

static void test_file_rendezvous(void **state) {
    (void)state;
    char dir[256] = "", url[300], job[64], err[1024] = "";
    if (mpi_rank() == 0) {
        snprintf(dir, sizeof dir, "/tmp/lesson07-file-XXXXXX");
        assert_non_null(mkdtemp(dir));
    }
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    snprintf(url, sizeof url, "file://%s/store", dir);
    job_id(job, sizeof job, "file");
    bool ok = bootstrap_round(url, 0, job, err, sizeof err);
    // A file left behind by a job must not capture the next one: every rank gone, rank 0 removes it.
    MPI_Barrier(MPI_COMM_WORLD);
    char path[300];
    snprintf(path, sizeof path, "%s/store", dir);
    struct stat st;
    bool removed = stat(path, &st) != 0;
    MPI_Barrier(MPI_COMM_WORLD);  // every rank looked before rank 0 creates the file again just below
    // And a second job on a live file is refused.
    char err2[512] = "";
    bool refused = true;
    if (mpi_rank() == 0) {
        Store *a = store_open(url, "jobA", 0, 2, 2.0, err2, sizeof err2);
        RdzvEnv e;
        set_env(1, 2, 0, "jobB");
        rdzv_env_read(&e, url, err2, sizeof err2);
        Store *b = rdzv_open(&e, 2.0, err2, sizeof err2);
        refused = a != NULL && b == NULL && strstr(err2, "refused") != NULL;
        store_close(b);
        store_close(a);
        unlink(path);
        rmdir(dir);
    }
    bool every = all_ok(refused);
    if (!ok) fail_msg("rank %d: %s", mpi_rank(), err[0] ? err : "(another rank failed)");
    if (!removed) fail_msg("the store file %s is still there after every rank closed it", path);
    if (!every) fail_msg("a rank of job 'jobB' joined job 'jobA''s store file: %s", err2);
}

// ---------------------------------------------------------------- TODO 5: the ring

// Connects a ring through a fresh TCP store; fails the test (on every rank) when it cannot.
static Store *ring_up(Ring *ring, const char *tag) {
    char job[64], err[1024] = "";
    job_id(job, sizeof job, tag);
    int rank = mpi_rank(), world = mpi_world(), port = free_port_shared();
    char url[64];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", port);
    Store *s = store_open(url, job, rank, world, STORE_TIMEOUT_S, err, sizeof err);  // the kit's: no TODO 1 needed
    bool ok = s != NULL && ring_connect(s, ring, err, sizeof err) == 0;  // the addresses go through TODO 3
    grading_require_todo(all_ok(ok), "3", "the ring's ranks exchange their addresses with bootstrap_allgather: %s",
                         err[0] ? err : "(another rank failed)");
    return s;
}

// Small integers: every partial sum is exact, so ANY summation order gives the same bits as MPI's.
static void test_ring_equals_mpi_exact(void **state) {
    (void)state;
    Ring ring;
    Store *s = ring_up(&ring, "ring-exact");
    int rank = mpi_rank(), world = mpi_world();
    size_t sizes[] = {1, 2, 3, 7, 1000, 65539};  // fewer floats than ranks, uneven chunks, larger than a socket buffer
    char err[512] = "", what[256] = "";
    bool ok = true;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0] && ok; k++) {
        size_t n = sizes[k];
        float *mine = malloc(n * sizeof *mine), *want = malloc(n * sizeof *want);
        for (size_t i = 0; i < n; i++) mine[i] = (float)((int)((i * 13 + (size_t)rank * 101) % 97) - 40);
        MPI_Allreduce(mine, want, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        if (ring_allreduce(&ring, mine, n, err, sizeof err) < 0) {
            ok = false;
            snprintf(what, sizeof what, "n=%zu: ring_allreduce failed: %s", n, err);
        }
        for (size_t i = 0; i < n && ok; i++)
            if (memcmp(&mine[i], &want[i], sizeof(float)) != 0) {
                ok = false;
                snprintf(what, sizeof what, "n=%zu, element %zu: ring %g, MPI_Allreduce %g", n, i, mine[i], want[i]);
            }
        ok = all_ok(ok);
        free(mine);
        free(want);
    }
    ring_close(&ring);
    store_close(s);
    if (!ok) fail_msg("rank %d of %d: %s", rank, world, what[0] ? what : "(another rank differs)");
}

// Random floats: the ring adds each element's N values in another order than MPI does. The tolerance, derived:
// a sum of N floats formed one addition at a time in ANY order is within (N-1) u sum_r |x_r| of the exact sum
// (each addition rounds by at most u = 2^-24 relative to a partial sum, and every partial sum is at most
// sum_r |x_r|), so two orders differ by at most 2 (N-1) u sum_r |x_r|. With N = 2 there is one addition,
// a + b = b + a exactly: the ring must then equal MPI bit for bit.
static void test_ring_equals_mpi_random(void **state) {
    (void)state;
    Ring ring;
    Store *s = ring_up(&ring, "ring-random");
    int rank = mpi_rank(), world = mpi_world();
    const size_t n = 100003;
    float *mine = malloc(n * sizeof *mine), *want = malloc(n * sizeof *want), *absx = malloc(n * sizeof *absx);
    uint64_t st = 0x9E3779B97F4A7C15ull ^ (uint64_t)(rank + 1) * 0xBF58476D1CE4E5B9ull;
    for (size_t i = 0; i < n; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        mine[i] = (float)((double)(st >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
        absx[i] = fabsf(mine[i]);
    }
    MPI_Allreduce(mine, want, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, absx, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    char err[512] = "", what[256] = "";
    bool ok = ring_allreduce(&ring, mine, n, err, sizeof err) == 0;
    if (!ok) snprintf(what, sizeof what, "ring_allreduce failed: %s", err);
    const double u = 1.0 / (double)(1 << 24);
    for (size_t i = 0; i < n && ok; i++) {
        // absx itself was summed in float: (1 + (N-1) u) covers its own rounding.
        double tol = world == 2 ? 0.0 : 2.0 * (world - 1) * u * absx[i] * (1.0 + world * u);
        if (fabs((double)mine[i] - (double)want[i]) > tol) {
            ok = false;
            snprintf(what, sizeof what, "element %zu: ring %.9g, MPI_Allreduce %.9g (allowed difference %.3g)", i, mine[i],
                     want[i], tol);
        }
    }
    ok = all_ok(ok);
    free(mine);
    free(want);
    free(absx);
    ring_close(&ring);
    store_close(s);
    if (!ok) fail_msg("rank %d of %d: %s", rank, world, what[0] ? what : "(another rank differs)");
}

// ---------------------------------------------------------------- TODO 1-4: the program, started both ways

static TrainOptions small_run(void) {
    TrainOptions o;
    char *args[] = {"train", "--dataset", "synthetic", "--model", "tiny", "--epochs", "1", "--bucket-mb", "0",
                    "--seed", "11", NULL};
    cli_parse(&o, 11, args, CLI_DIST | CLI_RDZV);
    cli_apply_dataset_defaults(&o);
    o.timeout_s = 20.0;
    return o;
}

// Training under the store start equals training under mpirun. With 2 ranks bit for bit: every sum is one
// addition (a + b = b + a). With more, MPI's reduction order is its own and the weights may differ in their
// last bits after many steps, with no bound that a test could derive: the test then says so and skips.
static void test_store_launch_trains_like_mpirun(void **state) {
    (void)state;
    int world = mpi_world();
    if (world > 2) skip();
    char job[64], err[1024] = "";
    job_id(job, sizeof job, "train");
    bool works = bootstrap_round("env", free_port_shared(), job, err, sizeof err);
    grading_require_todo(works, "1-3", "the store start needs rdzv_env_read, rdzv_open, bootstrap_share and "
                         "bootstrap_allgather: %s", err[0] ? err : "(another rank failed)");
    set_env(mpi_rank(), world, free_port_shared(), job);
    TrainOptions o = small_run();
    ProcessGroup *by_store = scaleout_setup_store(&o, DEVICE_CPU);
    assert_int_equal(pg_backend(by_store), PG_BACKEND_SOCKET);
    assert_int_equal(pg_rank(by_store), mpi_rank());
    Model *a = scaleout_train(by_store, &o);
    pg_finalize(by_store);
    Model *b = scaleout_train(test_pg_named("test_lesson07", 20.0), &o);
    bool same = a->n_params == b->n_params && memcmp(a->params, b->params, a->n_params * sizeof(float)) == 0;
    size_t first = 0;
    while (same == false && first < a->n_params && a->params[first] == b->params[first]) first++;
    bool every = all_ok(same);
    float pa = first < a->n_params ? a->params[first] : 0, pb = first < b->n_params ? b->params[first] : 0;
    model_free(a);
    model_free(b);
    if (!every) fail_msg("after one epoch the weights differ between the store start and mpirun (rank %d, first at "
                         "parameter %zu: %.9g vs %.9g)", mpi_rank(), first, pa, pb);
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_env_read),
        cmocka_unit_test(test_node_map),
        cmocka_unit_test(test_tcp_bootstrap),
        cmocka_unit_test(test_tcp_missing_rank_named),
        cmocka_unit_test(test_tcp_second_job_refused),
        cmocka_unit_test(test_file_rendezvous),
        cmocka_unit_test(test_ring_equals_mpi_exact),
        cmocka_unit_test(test_ring_equals_mpi_random),
        cmocka_unit_test(test_store_launch_trains_like_mpirun),
    };
    return grading_run(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
