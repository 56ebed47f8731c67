// tests/lesson04/test_lesson04.c: the autograder for lesson 04 (the learner's ckpt.c: checkpoints of a DDP run).
//
// Built with Open MPI and run on GRADE_NP ranks (solutions/04-checkpoint/lesson.mk) like lesson 03's: every rank
// runs the same test and writes its own verdict (tests/grading.h); a test passes only when it passes on every
// rank. Tests decide from values every rank has before asserting, so the ranks make the same collective calls,
// and the process group's timeout is short, so a learner's mismatched collective stops the test within seconds.
//
// To see what the learner's code does to files, this binary defines fsync, fdatasync, rename and write itself:
// the learner's calls land here (the executable's own definitions win at link time), are recorded (write: cut
// short on request, as write(2) may), and are passed to the kernel. Hints for failures are in hints.tsv.
#include <mpi.h>

#include "tests/testutil.h"
#include "tests/grading.h"
#include "tests/mpi_testutil.h"

#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kit/ckpt.h"
#include "kit/cli.h"
#include "kit/dist.h"
#include "lesson.h"
#include "kit/model.h"
#include "kit/train.h"

#define TEST_SEED 7
#define TEST_TIMEOUT_S 20.0

// ---------------------------------------------------------------- what the learner's code does to files

typedef enum { EV_FSYNC_FILE, EV_FSYNC_DIR, EV_RENAME } EventKind;
typedef struct {
    EventKind kind;
    char path[512];  // fsync: the file or folder synced; rename: the destination
    char from[512];  // rename: the source
} Event;

enum { MAX_EVENTS = 64 };
static Event g_events[MAX_EVENTS];
static int g_n_events;
static double g_fsync_delay_s;  // > 0: every fsync of a regular file sleeps this long (a slow disk)

static void record(EventKind kind, const char *path, const char *from) {
    if (g_n_events == MAX_EVENTS) return;
    Event *e = &g_events[g_n_events++];
    e->kind = kind;
    snprintf(e->path, sizeof e->path, "%s", path);
    snprintf(e->from, sizeof e->from, "%s", from ? from : "");
}

static void record_fsync(int fd) {
    char link[64], path[512] = "?";
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n > 0) path[n] = 0;
    struct stat st;
    bool dir = fstat(fd, &st) == 0 && S_ISDIR(st.st_mode);
    record(dir ? EV_FSYNC_DIR : EV_FSYNC_FILE, path, NULL);
    if (!dir && g_fsync_delay_s > 0) usleep((useconds_t)(g_fsync_delay_s * 1e6));
}

int fsync(int fd) {
    record_fsync(fd);
    return (int)syscall(SYS_fsync, fd);
}
int fdatasync(int fd) {
    record_fsync(fd);
    return (int)syscall(SYS_fdatasync, fd);
}
int rename(const char *from, const char *to) {
    // realpath writes up to PATH_MAX bytes: a smaller buffer is an overflow waiting for a long path (glibc's
    // _FORTIFY_SOURCE, on by default on Ubuntu, stops the program there).
    char abs_from[PATH_MAX], abs_to[PATH_MAX];
    // Absolute paths, so that the folder of each can be compared.
    if (!realpath(from, abs_from)) snprintf(abs_from, sizeof abs_from, "%s", from);
    int rc = renameat(AT_FDCWD, from, AT_FDCWD, to);
    if (!realpath(to, abs_to)) snprintf(abs_to, sizeof abs_to, "%s", to);
    record(EV_RENAME, abs_to, abs_from);
    return rc;
}

// > 0: every write(2) of more bytes writes this many only and returns the count, as write(2) may (a signal,
// a pipe, a quota): a caller must loop until every byte is written.
static size_t g_write_max;
ssize_t write(int fd, const void *buf, size_t n) {
    if (g_write_max > 0 && n > g_write_max) n = g_write_max;
    return (ssize_t)syscall(SYS_write, fd, buf, n);
}

static void dir_of(const char *path, char *out, size_t len) {
    const char *slash = strrchr(path, '/');
    snprintf(out, len, "%.*s", slash ? (int)(slash - path) : 0, path);
}

// ---------------------------------------------------------------- the test process group, shared folders

static ProcessGroup *test_pg(void) { return test_pg_named("test_lesson04", TEST_TIMEOUT_S); }

static double sum_over_ranks(ProcessGroup *pg, double x) {
    pg_allreduce_sum_double_host(pg, &x, 1);
    return x;
}

// A temporary folder made by rank 0, the same path on every rank (the ranks share this machine's /tmp).
static char g_dir[128];

static void shared_dir(ProcessGroup *pg) {
    float buf[sizeof g_dir];
    memset(buf, 0, sizeof buf);
    if (pg_rank(pg) == 0) {
        snprintf(g_dir, sizeof g_dir, "/tmp/test_lesson04.XXXXXX");
        if (!mkdtemp(g_dir)) g_dir[0] = 0;
        for (size_t i = 0; i < sizeof g_dir; i++) buf[i] = (float)(unsigned char)g_dir[i];  // bytes are exact floats
    }
    pg_broadcast(pg, buf, sizeof g_dir, 0);
    for (size_t i = 0; i < sizeof g_dir; i++) g_dir[i] = (char)(unsigned char)buf[i];
    assert_true(g_dir[0] != 0);
}

static void remove_shared_dir(ProcessGroup *pg) {
    pg_barrier(pg);
    if (pg_rank(pg) == 0 && g_dir[0]) {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
        if (system(cmd) != 0) print_error("could not remove %s\n", g_dir);
    }
}

static Model *small_model(uint64_t seed) {
    ModelConfig cfg;
    assert_true(model_config(&cfg, "tiny-bn", 8, 3, 32, 32, 10));
    Model *m = model_create(&cfg, DEVICE_CPU, 4, seed);
    fill_uniform(m->velocity, m->n_params, -1, 1, seed + 1);  // momentum and BN statistics not at their defaults
    fill_uniform(m->buffers, m->n_buffers, 0.5f, 2, seed + 2);
    return m;
}

static CkptState small_state(const Model *m, long long step) {
    CkptState s;
    memset(&s, 0, sizeof s);
    s.model = m->cfg;
    snprintf(s.dataset, sizeof s.dataset, "synthetic");
    s.world = 2, s.global_batch = 64, s.steps_per_epoch = 78, s.epochs = 2, s.step = step;
    s.epoch = (int)(step / 78), s.batch_in_epoch = (int)(step % 78), s.seed = TEST_SEED;
    return s;
}

static bool same_model(const Model *a, const Model *b) {
    return memcmp(a->params, b->params, a->n_params * sizeof(float)) == 0 &&
           memcmp(a->velocity, b->velocity, a->n_params * sizeof(float)) == 0 &&
           memcmp(a->buffers, b->buffers, a->n_buffers * sizeof(float)) == 0;
}

// ---------------------------------------------------------------- TODO 1: an atomic, durable write

// A child writes two different 1 MB contents to one path, over and over, with the learner's ckpt_write_file;
// the parent kills it with SIGKILL at random moments. Each time the file must be one of the two, complete.
static void test_write_file_survives_kill(void **state) {
    ProcessGroup *pg = test_pg();
    shared_dir(pg);
    char path[256], err[512];
    snprintf(path, sizeof path, "%s/rank%d.bin", g_dir, pg_rank(pg));
    enum { N = 1 << 20, TRIALS = 25 };
    uint8_t *a = xmalloc(N), *b = xmalloc(N), *got = xmalloc(N + 1);
    memset(a, 0xAA, N);
    memset(b, 0x55, N);
    if (ckpt_write_file(path, a, N, err, sizeof err) != 0) fail_msg("ckpt_write_file: %s", err);
    srand((unsigned)time(NULL) + (unsigned)pg_rank(pg));
    int broken = 0;
    for (int t = 0; t < TRIALS; t++) {
        fflush(NULL);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            for (int i = 0;; i++) ckpt_write_file(path, i % 2 ? a : b, N, err, sizeof err);
        }
        usleep((useconds_t)(2000 + rand() % 8000));
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        FILE *f = fopen(path, "rb");
        size_t n = f ? fread(got, 1, N + 1, f) : 0;
        if (f) fclose(f);
        bool whole = n == N && (memcmp(got, a, N) == 0 || memcmp(got, b, N) == 0);
        if (!whole && broken++ == 0)
            print_error("killed during ckpt_write_file: the file holds %zu bytes%s, neither the old nor the new "
                        "content\n", n, n == N ? " (a mix)" : "");
    }
    free(a), free(b), free(got);
    bool ok = broken == 0;
    all_ranks(pg, ok);
    remove_shared_dir(pg);
    if (!ok) fail();
}

// The order of the calls: the new bytes synced, then renamed over the path (from the same folder), then the
// folder synced. And every byte written: write(2) may write fewer bytes than asked and say so in its return
// value (here every write stops after 1000 bytes): one write() per file leaves a truncated checkpoint.
static void test_write_file_is_durable(void **state) {
    ProcessGroup *pg = test_pg();
    shared_dir(pg);
    char path[256], abs_path[PATH_MAX], dir[PATH_MAX], err[512];
    snprintf(path, sizeof path, "%s/rank%d.ckpt", g_dir, pg_rank(pg));
    enum { N = 64 * 1024 };
    static uint8_t bytes[N], got[N + 1];
    for (int i = 0; i < N; i++) bytes[i] = (uint8_t)(i * 7 + 3);
    g_n_events = 0;
    g_write_max = 1000;
    int rc = ckpt_write_file(path, bytes, sizeof bytes, err, sizeof err);
    g_write_max = 0;
    FILE *f = fopen(path, "rb");
    size_t n_got = f ? fread(got, 1, sizeof got, f) : 0;
    if (f) fclose(f);
    bool whole = n_got == N && memcmp(got, bytes, N) == 0;
    if (!realpath(path, abs_path)) snprintf(abs_path, sizeof abs_path, "%s", path);
    dir_of(abs_path, dir, sizeof dir);
    int synced_file = -1, renamed = -1, synced_dir = -1;
    bool other_folder = false;
    for (int i = 0; i < g_n_events; i++) {
        const Event *e = &g_events[i];
        if (e->kind == EV_RENAME && strcmp(e->path, abs_path) == 0 && renamed < 0) renamed = i;
        if (e->kind == EV_FSYNC_DIR && strcmp(e->path, dir) == 0 && renamed >= 0 && synced_dir < 0) synced_dir = i;
    }
    if (renamed >= 0) {
        char from_dir[512];
        dir_of(g_events[renamed].from, from_dir, sizeof from_dir);
        for (int i = 0; i < renamed; i++)
            if (g_events[i].kind == EV_FSYNC_FILE && strcmp(g_events[i].path, g_events[renamed].from) == 0)
                synced_file = i;
        if (strcmp(from_dir, dir) != 0) {
            print_error("renamed from %s: another folder than %s (rename is atomic only within one file system: "
                        "the temporary file belongs next to the checkpoint)\n", g_events[renamed].from, dir);
            other_folder = true;
        }
    }
    bool ok = rc == 0 && whole && renamed >= 0 && !other_folder && synced_file >= 0 && synced_dir >= 0;
    if (rc != 0) print_error("ckpt_write_file returned %d: %s%s\n", rc, err,
                             strstr(err, "write") ? " (write(2) wrote 1000 bytes a call here: a short write is not an "
                                                    "error, write the rest)" : "");
    else if (!whole)
        print_error("write(2) wrote at most 1000 bytes a call and the file holds %zu of the %d bytes: one write() is "
                    "not enough, loop until every byte is written (and retry on EINTR)\n", n_got, (int)N);
    else if (other_folder) {}  // said above
    else if (renamed < 0) print_error("no rename(2) onto %s: the file was written in place\n", path);
    else if (synced_file < 0) print_error("the temporary file was not fsync'ed before the rename\n");
    else if (synced_dir < 0) print_error("the folder %s was not fsync'ed after the rename\n", dir);
    // A failure is reported, not hidden.
    char bad[300];
    snprintf(bad, sizeof bad, "%s/no/such/folder/x.ckpt", g_dir);
    err[0] = 0;
    if (ckpt_write_file(bad, bytes, sizeof bytes, err, sizeof err) != -1 || !strstr(err, "No such file")) {
        print_error("writing into a missing folder: expected -1 and the system's reason in err, got '%s'\n", err);
        ok = false;
    }
    all_ranks(pg, ok);  // the ranks leave together; the verdict is this rank's own
    remove_shared_dir(pg);
    if (!ok) fail();
}

// ---------------------------------------------------------------- TODO 2: rank 0 writes, everyone knows

// Each rank passes ITS OWN path, so that the test sees who writes: only rank 0's file may appear. Rank 0's disk
// is slow (every fsync sleeps 0.3 s): when the call returns on any rank, rank 0's file must already be complete.
static void test_only_rank0_writes(void **state) {
    ProcessGroup *pg = test_pg();
    int rank = pg_rank(pg), world = pg_world(pg);
    shared_dir(pg);
    Model *m = small_model(1);
    CkptState st = small_state(m, 5);
    char path[256], rank0[256], err[512] = "";
    snprintf(path, sizeof path, "%s/rank%d.ckpt", g_dir, rank);
    snprintf(rank0, sizeof rank0, "%s/rank0.ckpt", g_dir);
    g_fsync_delay_s = rank == 0 ? 0.3 : 0.0;
    int rc = ckpt_save_rank0(pg, path, m, &st, err, sizeof err);
    g_fsync_delay_s = 0;
    bool ok = true;
    if (rc != 0) print_error("rank %d: ckpt_save_rank0 returned %d: %s\n", rank, rc, err), ok = false;
    Ckpt ck;
    char why[512];
    if (ckpt_read(&ck, rank0, why, sizeof why) != 0) {
        print_error("rank %d: when ckpt_save_rank0 returned, rank 0's file was not complete yet: %s\n", rank, why);
        ok = false;
    } else {
        ckpt_free(&ck);
    }
    if (rank != 0 && access(path, F_OK) == 0) {
        print_error("rank %d wrote a checkpoint (%s): only rank 0 may write\n", rank, path);
        ok = false;
    }
    all_ranks(pg, ok);  // the ranks leave together; the verdict is this rank's own
    if (world == 1 && rank == 0) print_message("(one rank: the only-rank-0 part is checked on 2 or more)\n");
    model_free(m);
    remove_shared_dir(pg);
    if (!ok) fail();
}

static void test_save_failure_reaches_every_rank(void **state) {
    ProcessGroup *pg = test_pg();
    int rank = pg_rank(pg);
    shared_dir(pg);
    Model *m = small_model(1);
    CkptState st = small_state(m, 5);
    char path[256], err[512] = "";
    // Rank 0 cannot write (no such folder); the others are given writable paths they must not use anyway.
    if (rank == 0) snprintf(path, sizeof path, "%s/missing/x.ckpt", g_dir);
    else snprintf(path, sizeof path, "%s/rank%d.ckpt", g_dir, rank);
    int rc = ckpt_save_rank0(pg, path, m, &st, err, sizeof err);
    bool ok = rc == -1 && err[0] != 0;
    if (!ok) print_error("rank %d: ckpt_save_rank0 returned %d (err '%s') although rank 0 could not write\n", rank, rc, err);
    all_ranks(pg, ok);  // the ranks leave together; the verdict is this rank's own
    model_free(m);
    remove_shared_dir(pg);
    if (!ok) fail();
}

// ---------------------------------------------------------------- TODO 3: what an exact resume needs

static TrainOptions test_options(const char *model, int global_batch, int epochs) {
    static char name[] = "train";
    char *argv[] = {name, NULL};
    TrainOptions o;
    cli_parse(&o, 1, argv, CLI_DIST | CLI_CKPT);
    o.dataset = "synthetic";
    o.model = model;
    o.width = 8;
    o.batch_size = global_batch;
    o.epochs = epochs;
    o.seed = TEST_SEED;
    o.lr = 0.08f;
    o.nesterov = true;
    o.backend = "mpi";
    o.timeout_s = TEST_TIMEOUT_S;
    cli_apply_dataset_defaults(&o);
    return o;
}

static void test_capture_and_restore(void **state) {
    ProcessGroup *pg = test_pg();
    int rank = pg_rank(pg), world = pg_world(pg);
    TrainOptions o = test_options("tiny-bn", 64, 3);
    Model *m = small_model(1);
    RunState run = {.epoch = 1, .batch_in_epoch = 17, .step = 95, .carry = {.loss_sum = 10.5, .correct = 40, .count = 64},
                    .images = 4992, .last_loss = 0.625, .test_acc = 0.875};
    Metrics local = {.loss_sum = 1.0 + rank, .correct = 10 + rank, .count = 32};  // this rank's part of the epoch
    LrSchedule s = train_schedule(&o, 78);
    CkptState st = ckpt_capture(pg, &o, m, &run, &s, 78, local);
    SgdConfig opt = train_sgd_config(&o);
    double want_loss = 10.5 + world + world * (world - 1) / 2.0;  // carry + sum over ranks of (1 + rank)
    long want_correct = 40 + 10L * world + world * (world - 1) / 2, want_count = 64 + 32L * world;
    const char *wrong = NULL;
    if (st.epoch != 1 || st.batch_in_epoch != 17 || st.step != 95) wrong = "the position (epoch, batch_in_epoch, step)";
    else if (st.seed != TEST_SEED) wrong = "the seed (the random state of every stream: kit/rng.h)";
    else if (st.peak_lr != s.peak_lr || st.warmup_steps != s.warmup_steps || st.total_steps != s.total_steps ||
             st.final_lr != s.final_lr || st.decay != (int)s.decay) wrong = "the schedule (train_schedule)";
    else if (st.momentum != opt.momentum || st.weight_decay != opt.weight_decay || st.nesterov != (int)opt.nesterov)
        wrong = "the optimizer (train_sgd_config)";
    else if (st.loss_sum != want_loss || st.correct != want_correct || st.count != want_count)
        wrong = "the epoch's metrics so far (run->carry + this epoch's sums over ALL ranks)";
    else if (st.images != 4992 + want_count)
        wrong = "the images trained on since the start (the finished epochs' run->images + the epoch in progress)";
    else if (st.last_loss != 0.625 || st.test_acc != 0.875)
        wrong = "the metrics of finished epochs (last_loss, test_acc)";
    if (wrong) print_error("ckpt_capture: wrong or missing: %s\n", wrong);
    RunState back = ckpt_restore(&st);
    bool restored = back.epoch == 1 && back.batch_in_epoch == 17 && back.step == 95 && back.images == 4992 &&
                    back.carry.loss_sum == want_loss && back.carry.correct == want_correct &&
                    back.carry.count == want_count && back.last_loss == 0.625 && back.test_acc == 0.875;
    if (!wrong && !restored) print_error("ckpt_restore does not give back the run that ckpt_capture described\n");
    model_free(m);
    all_ranks(pg, !wrong && restored);
    if (wrong || !restored) fail();
}

// ---------------------------------------------------------------- TODO 4: load on every rank

static void test_load_on_every_rank(void **state) {
    ProcessGroup *pg = test_pg();
    int rank = pg_rank(pg);
    shared_dir(pg);
    char path[256], err[512] = "";
    snprintf(path, sizeof path, "%s/saved.ckpt", g_dir);
    Model *saved = small_model(42);
    CkptState st = small_state(saved, 33);
    if (rank == 0 && ckpt_save(path, saved, &st, err, sizeof err) != 0) fail_msg("%s", err);
    pg_barrier(pg);
    Model *m = small_model(100 + (uint64_t)rank);  // every rank starts different
    CkptState got;
    memset(&got, 0, sizeof got);
    int rc = ckpt_load_all(pg, path, m, &got, err, sizeof err);
    bool ok = rc == 0 && same_model(m, saved) && got.step == 33;
    if (rc != 0) print_error("rank %d: ckpt_load_all returned %d: %s\n", rank, rc, err);
    else if (!same_model(m, saved)) print_error("rank %d: the model is not the checkpoint's after ckpt_load_all\n", rank);
    else if (got.step != 33) print_error("rank %d: *st was not filled (step %lld, expected 33)\n", rank, got.step);
    all_ranks(pg, ok);  // the ranks leave together; the verdict is this rank's own
    model_free(m);
    model_free(saved);
    remove_shared_dir(pg);
    if (!ok) fail();
}

// The last rank gets a damaged copy (one flipped byte: its CRC fails); every rank must return -1.
static void test_load_failure_reaches_every_rank(void **state) {
    ProcessGroup *pg = test_pg();
    int rank = pg_rank(pg), world = pg_world(pg);
    shared_dir(pg);
    char good[256], bad[256], err[512] = "";
    snprintf(good, sizeof good, "%s/good.ckpt", g_dir);
    snprintf(bad, sizeof bad, "%s/bad.ckpt", g_dir);
    Model *saved = small_model(42);
    CkptState st = small_state(saved, 33);
    if (rank == 0) {
        size_t n;
        uint8_t *bytes = ckpt_encode(saved, &st, &n);
        bytes[n - 100] ^= 1;
        FILE *f = fopen(bad, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(bytes, 1, n, f), n);
        fclose(f);
        free(bytes);
        if (ckpt_save(good, saved, &st, err, sizeof err) != 0) fail_msg("%s", err);
    }
    pg_barrier(pg);
    Model *m = small_model(100 + (uint64_t)rank), *before = small_model(100 + (uint64_t)rank);
    bool last = rank == world - 1;
    int rc = ckpt_load_all(pg, last ? bad : good, m, NULL, err, sizeof err);
    bool ok = rc == -1 && err[0] != 0 && (!last || same_model(m, before));
    if (!ok)
        print_error("rank %d: ckpt_load_all returned %d (err '%s'); rank %d's file is corrupt, so every rank must "
                    "return -1%s\n", rank, rc, err, world - 1, last ? " and leave its model untouched" : "");
    all_ranks(pg, ok);  // the ranks leave together; the verdict is this rank's own
    model_free(m);
    model_free(before);
    model_free(saved);
    remove_shared_dir(pg);
    if (!ok) fail();
}

// Every rank reads a valid checkpoint, but not the same one (node-local folders that went out of step): each load
// succeeds alone, yet training on would average the gradients of different models. ckpt_load_all must see it and
// return -1 on every rank.
static void test_load_refuses_different_replicas(void **state) {
    ProcessGroup *pg = test_pg();
    int rank = pg_rank(pg), world = pg_world(pg);
    shared_dir(pg);
    char path[256], err[512] = "";
    snprintf(path, sizeof path, "%s/rank%d.ckpt", g_dir, rank);
    Model *saved = small_model(42 + (uint64_t)rank), *m = small_model(100);
    CkptState st = small_state(saved, 33);
    if (ckpt_save(path, saved, &st, err, sizeof err) != 0) fail_msg("%s", err);
    pg_barrier(pg);
    int rc = ckpt_load_all(pg, path, m, NULL, err, sizeof err);
    bool ok = world == 1 ? rc == 0 : rc == -1 && err[0] != 0;
    if (!ok && world > 1)
        print_error("rank %d: ckpt_load_all returned %d although every rank loaded another checkpoint (each valid): "
                    "after a load, check that the replicas are identical and fail on every rank when they are not "
                    "(pg_identical)\n", rank, rc);
    else if (!ok) print_error("rank 0: ckpt_load_all returned %d on a valid file: %s\n", rc, err);
    if (world == 1 && rank == 0) print_message("(one rank: different replicas are checked on 2 or more)\n");
    all_ranks(pg, ok);
    model_free(m), model_free(saved);
    remove_shared_dir(pg);
    if (!ok) fail();
}

// ---------------------------------------------------------------- TODO 5: stop together

static void test_stop_flags_agree(void **state) {
    ProcessGroup *pg = test_pg();
    int rank = pg_rank(pg), world = pg_world(pg);
    Metrics fine = {.loss_sum = 3.0, .correct = 1, .count = 4}, nan_loss = {.loss_sum = NAN, .correct = 0, .count = 4};
    bool sig = true, bad = true, ok = true;
    g_stop_signal = 0;
    ckpt_stop_flags(pg, &fine, &sig, &bad);
    if (sig || bad) print_error("rank %d: nothing happened, yet signalled=%d nonfinite=%d\n", rank, sig, bad), ok = false;
    g_stop_signal = rank == world - 1 ? SIGTERM : 0;  // the signal reached one rank only
    ckpt_stop_flags(pg, &fine, &sig, &bad);
    if (!sig || bad) print_error("rank %d: SIGTERM reached rank %d: every rank must see signalled=1 (got %d)\n", rank,
                                 world - 1, sig), ok = false;
    g_stop_signal = 0;
    ckpt_stop_flags(pg, rank == 0 ? &nan_loss : &fine, &sig, &bad);
    if (sig || !bad) print_error("rank %d: rank 0's loss is NaN: every rank must see nonfinite=1 (got %d)\n", rank, bad),
        ok = false;
    all_ranks(pg, ok);
    if (!ok) fail();
}

// ---------------------------------------------------------------- the whole program: exact resume

// The same training three ways: uninterrupted; stopped by --stop-at and resumed. Same final model, bit for bit.
static Model *run_with(ProcessGroup *pg, TrainOptions o, RunStatus expect, long long *resumed_from) {
    Model *m = NULL;
    long long from = -2;
    RunStatus s = run_program(pg, &o, &m, &from);
    static const char *names[] = {"RUN_DONE", "RUN_STOPPED", "RUN_NONFINITE", "RUN_FAILED (see the error above)"};
    if (s != expect) print_error("run_program returned %s, expected %s\n", names[s], names[expect]);
    if (resumed_from) *resumed_from = from;
    if (s != expect) {
        model_free(m);
        return NULL;
    }
    return m;
}

static void test_resume_is_exact(void **state) {
    ProcessGroup *pg = test_pg();
    shared_dir(pg);
    TrainOptions o = test_options("tiny-bn", 128, 2);  // a BN net: the running statistics must come back too
    Model *ref = run_with(pg, o, RUN_DONE, NULL);
    char dir[256];
    snprintf(dir, sizeof dir, "%s/run", g_dir);
    TrainOptions first = o, second = o;
    first.checkpoint_dir = dir;
    first.stop_at = 50;  // in epoch 2 (39 steps per epoch)
    Model *part = run_with(pg, first, RUN_STOPPED, NULL);
    second.checkpoint_dir = dir;
    second.resume = "auto";
    long long from = -1;
    Model *resumed = part ? run_with(pg, second, RUN_DONE, &from) : NULL;
    bool ok = ref && resumed && from == 50 && same_model(resumed, ref);
    if (resumed && from != 50) print_error("resumed from step %lld, expected 50 (the --stop-at step)\n", from);
    else if (resumed && ref && !same_model(resumed, ref)) {
        bool p = memcmp(resumed->params, ref->params, ref->n_params * sizeof(float)) == 0;
        bool v = memcmp(resumed->velocity, ref->velocity, ref->n_params * sizeof(float)) == 0;
        print_error("stopped at step 50 and resumed, the final model differs from the uninterrupted run's:%s%s%s\n",
                    p ? "" : " parameters", v ? "" : " momentum",
                    memcmp(resumed->buffers, ref->buffers, ref->n_buffers * sizeof(float)) ? " BN statistics" : "");
    }
    all_ranks(pg, ok);  // the ranks leave together; the verdict is this rank's own
    model_free(ref), model_free(part), model_free(resumed);
    remove_shared_dir(pg);
    if (!ok) fail();
}

// The checkpoint saved at step k holds the model AFTER step k (all-reduced, updated): resuming from it, the next
// step is k + 1. A save from the middle of a step (before the all-reduce or the update) would hold another model.
static void test_checkpoint_holds_the_step(void **state) {
    ProcessGroup *pg = test_pg();
    shared_dir(pg);
    TrainOptions o = test_options("tiny-bn", 128, 1);
    char file[256], err[512];
    snprintf(file, sizeof file, "%s/stop.ckpt", g_dir);
    o.checkpoint = file;
    o.stop_at = 3;
    Model *m = run_with(pg, o, RUN_STOPPED, NULL);
    bool ok = m != NULL;
    Ckpt ck;
    if (ok && ckpt_read(&ck, file, err, sizeof err) != 0) print_error("%s\n", err), ok = false;
    else if (ok) {
        if (ck.state.step != 3 || ck.state.batch_in_epoch != 3) {
            print_error("the checkpoint after step 3 says step %lld, batch %d of epoch %d\n", ck.state.step,
                        ck.state.batch_in_epoch, ck.state.epoch + 1);
            ok = false;
        }
        float *p = xmalloc(m->n_params * sizeof(float));
        for (int i = 0; i < m->n_views && ok; i++) {
            ckpt_tensor_data(&ck, ckpt_find(&ck, CKPT_PARAMS, m->views[i].name), p);
            if (memcmp(p, m->params + m->views[i].offset, m->views[i].count * sizeof(float)) != 0) {
                print_error("tensor %s in the checkpoint of step 3 is not the model after step 3: saved before the "
                            "step (or before its all-reduce and update)? A save belongs after the complete step\n",
                            m->views[i].name);
                ok = false;
            }
        }
        free(p);
        ckpt_free(&ck);
    }
    all_ranks(pg, ok);  // the ranks leave together; the verdict is this rank's own
    model_free(m);
    remove_shared_dir(pg);
    if (!ok) fail();
}

static void on_sigterm(int sig) { g_stop_signal = sig; }

// SIGTERM reaches the LAST rank only, in the middle of training: every rank must stop at the same step, with a
// checkpoint of that step.
static void test_sigterm_saves_and_stops(void **state) {
    ProcessGroup *pg = test_pg();
    int rank = pg_rank(pg), world = pg_world(pg);
    shared_dir(pg);
    TrainOptions o = test_options("tiny-bn", 64, 20);  // far longer than the test: the signal comes first
    char dir[256], latest[512], err[512];
    snprintf(dir, sizeof dir, "%s/run", g_dir);
    o.checkpoint_dir = dir;
    // First the flags alone: if they do not agree, the ranks would stop at different steps and the rest would
    // wait for the stopped ones in a collective (then the process group's timeout ends the job).
    Metrics fine = {.loss_sum = 1.0, .correct = 0, .count = 1};
    bool sig = false, bad = false;
    g_stop_signal = rank == world - 1 ? SIGTERM : 0;
    ckpt_stop_flags(pg, &fine, &sig, &bad);
    g_stop_signal = 0;
    if (!all_ranks(pg, sig)) {
        if (!sig) print_error("rank %d: a SIGTERM on rank %d only does not stop rank %d (ckpt_stop_flags): not "
                              "running the program\n", rank, world - 1, rank);
        remove_shared_dir(pg);
        if (!sig) fail();
        return;
    }
    // Until run_program installs its own handler, ours does the same (the default action would kill the rank).
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigterm;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, &old);
    timer_t timer;
    if (rank == world - 1) {  // SIGTERM to this process 1.5 s from now (data and model are ready by then)
        struct sigevent ev = {.sigev_notify = SIGEV_SIGNAL, .sigev_signo = SIGTERM};
        struct itimerspec when = {.it_value = {.tv_sec = 1, .tv_nsec = 500000000}};
        assert_int_equal(timer_create(CLOCK_MONOTONIC, &ev, &timer), 0);
        assert_int_equal(timer_settime(timer, 0, &when, NULL), 0);
    }
    Model *m = run_with(pg, o, RUN_STOPPED, NULL);
    if (rank == world - 1) timer_delete(timer);
    sigaction(SIGTERM, &old, NULL);
    bool ok = m != NULL;
    Ckpt ck;
    if (ok && (ckpt_find_latest(dir, latest, sizeof latest, err, sizeof err) != 0 ||
               ckpt_read(&ck, latest, err, sizeof err) != 0)) {
        print_error("no checkpoint after the SIGTERM: %s\n", err);
        ok = false;
    }
    double step = -1;
    if (ok) {
        step = (double)ck.state.step;
        ckpt_free(&ck);
    }
    // The same step on every rank: the largest equals the smallest.
    double s_sum = sum_over_ranks(pg, step), s_sq = sum_over_ranks(pg, step * step);
    if (ok && s_sq * world != s_sum * s_sum) print_error("the ranks stopped at different steps\n"), ok = false;
    if (ok && rank == 0) print_message("SIGTERM on rank %d: every rank stopped after step %.0f, checkpoint saved\n",
                                       world - 1, step);
    g_stop_signal = 0;
    all_ranks(pg, ok);  // the ranks leave together; the verdict is this rank's own
    model_free(m);
    remove_shared_dir(pg);
    if (!ok) fail();
}

// A learning rate of 100 makes the BN-free net's loss overflow (within the first epoch with these options): the run must stop
// with RUN_NONFINITE, and the checkpoint saved before (every 5 steps) must still hold finite weights.
static void test_nan_stops_before_overwrite(void **state) {
    ProcessGroup *pg = test_pg();
    shared_dir(pg);
    TrainOptions o = test_options("tiny", 64, 2);
    o.lr = 100.0f;
    char file[256], err[512];
    snprintf(file, sizeof file, "%s/last.ckpt", g_dir);
    o.checkpoint = file;
    o.save_every = 5;
    Model *m = run_with(pg, o, RUN_NONFINITE, NULL);
    bool ok = m != NULL;
    Ckpt ck;
    if (ckpt_read(&ck, file, err, sizeof err) != 0) {
        print_error("no valid checkpoint left: %s\n", err);
        ok = false;
    } else {
        const uint8_t *p = ck.bytes;
        bool finite = true;
        for (int i = 0; i < ck.n_tensors; i++)
            for (uint64_t k = 0; k < ck.tensors[i].nbytes; k += 4) {
                float x;
                memcpy(&x, p + ck.tensors[i].offset + k, 4);
                finite = finite && isfinite(x);
            }
        if (!finite) print_error("the checkpoint (step %lld) holds NaN or Inf: it was saved after the loss "
                                 "blew up\n", ck.state.step), ok = false;
        ckpt_free(&ck);
    }
    all_ranks(pg, ok);  // the ranks leave together; the verdict is this rank's own
    model_free(m);
    remove_shared_dir(pg);
    if (!ok) fail();
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_write_file_survives_kill),
        cmocka_unit_test(test_write_file_is_durable),
        cmocka_unit_test(test_only_rank0_writes),
        cmocka_unit_test(test_save_failure_reaches_every_rank),
        cmocka_unit_test(test_capture_and_restore),
        cmocka_unit_test(test_load_on_every_rank),
        cmocka_unit_test(test_load_failure_reaches_every_rank),
        cmocka_unit_test(test_load_refuses_different_replicas),
        cmocka_unit_test(test_stop_flags_agree),
        cmocka_unit_test(test_checkpoint_holds_the_step),
        cmocka_unit_test(test_resume_is_exact),
        cmocka_unit_test(test_sigterm_saves_and_stops),
        cmocka_unit_test(test_nan_stops_before_overwrite),
    };
    return grading_run(argc, argv, tests, sizeof tests / sizeof tests[0]);
}
