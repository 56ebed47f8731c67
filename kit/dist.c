// kit/dist.c: the process group over MPI and NCCL (see dist.h).
//
// Compiled with MPI's flags and -DKIT_MPI by mk/kit.mk when Open MPI is found; without MPI every
// entry point says how to get it. The NCCL parts need KIT_NCCL (CUDA + NCCL found at build time).
//
// Every collective is started non-blocking and completed by a loop that tests it and watches a deadline:
// a blocking call never returns when a peer dies or stalls (kit/README.md, "The process group's waits").
#include "kit/dist_internal.h"

#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kit/check.h"
#include "kit/dist_socket.h"
#include "kit/trace.h"

#ifdef KIT_NCCL
#define KIT_NCCL_BUILT true
#else
#define KIT_NCCL_BUILT false
#endif

#ifndef KIT_MPI
// ---------------------------------------------------------------- built without MPI
static void no_mpi(void) __attribute__((noreturn));
static void no_mpi(void) {
    die("this program was built without MPI, so it cannot run several ranks. Install Open MPI "
        "(libopenmpi-dev openmpi-bin: `make deps`), then `make clean` and rebuild.");
}
ProcessGroup *pg_init(int *argc, char ***argv, const char *backend, Device dev, double timeout_s) { no_mpi(); }
ProcessGroup *pg_init_socket(const PgPeers *peers, const char *backend, Device dev, double timeout_s) { no_mpi(); }
bool pg_nccl_unique_id(void *out) { no_mpi(); }
void pg_finalize(ProcessGroup *pg) { no_mpi(); }
int pg_rank(const ProcessGroup *pg) { no_mpi(); }
int pg_world(const ProcessGroup *pg) { no_mpi(); }
int pg_local_rank(const ProcessGroup *pg) { no_mpi(); }
int pg_local_world(const ProcessGroup *pg) { no_mpi(); }
Device pg_device(const ProcessGroup *pg) { no_mpi(); }
PgBackend pg_backend(const ProcessGroup *pg) { no_mpi(); }
double pg_timeout(const ProcessGroup *pg) { no_mpi(); }
void pg_abort(ProcessGroup *pg, const char *msg) { no_mpi(); }
static void pg_allreduce(ProcessGroup *pg, float *buf, size_t n, PgOp op) { no_mpi(); }
void pg_allreduce_sum_double_host(ProcessGroup *pg, double *host_buf, int n) { no_mpi(); }
void pg_broadcast(ProcessGroup *pg, float *buf, size_t n, int root) { no_mpi(); }
void pg_allgather(ProcessGroup *pg, const float *send, float *recv, size_t n) { no_mpi(); }
void pg_barrier(ProcessGroup *pg) { no_mpi(); }
void pg_reduce_scatter_sum(ProcessGroup *pg, const float *send, float *recv, size_t n) { no_mpi(); }
PgWork *pg_reduce_scatter_sum_start(ProcessGroup *pg, const float *send, float *recv, size_t n) { no_mpi(); }
void pg_work_wait(ProcessGroup *pg, PgWork *w, const char *what) { no_mpi(); }
PgRequest pg_iallreduce(ProcessGroup *pg, float *buf, size_t n, PgOp op) { no_mpi(); }
void pg_check_identical(ProcessGroup *pg, const float *buf, size_t n, const char *what) { no_mpi(); }
void pg_wait(ProcessGroup *pg, PgRequest req) { no_mpi(); }
void pg_progress(ProcessGroup *pg) { no_mpi(); }
bool pg_identical(ProcessGroup *pg, const float *buf, size_t n) { no_mpi(); }
PgSend *pg_send_start(ProcessGroup *pg, const float *buf, size_t n, int peer, int tag) { no_mpi(); }
void pg_send_wait(ProcessGroup *pg, PgSend *s, const char *what) { no_mpi(); }
void pg_recv(ProcessGroup *pg, float *buf, size_t n, int peer, int tag, const char *what) { no_mpi(); }
ProcessGroup *pg_split(ProcessGroup *pg, int color, int key) { no_mpi(); }
void pg_send(ProcessGroup *pg, const float *buf, size_t n, int peer, int tag, const char *what) { no_mpi(); }
PgTraffic pg_traffic(const ProcessGroup *pg) { no_mpi(); }
void pg_trace_open(ProcessGroup *pg, const char *path) { no_mpi(); }
void pg_trace_close(ProcessGroup *pg, const char *path) { no_mpi(); }
#else
// ---------------------------------------------------------------- built with MPI
#include "kit/log.h"
#include "kit/mpi_check.h"
#ifdef KIT_CUDA
#include "kit/cuda_check.h"
#endif

// One collective in flight: an all-reduce (pg_iallreduce) or a reduce-scatter (pg_reduce_scatter_sum_start, which
// hands out the slot itself as its PgWork). MPI with a CUDA device stages the data in `host`, which each slot keeps
// (and grows) across calls, so a bucketed step allocates nothing after the first.
typedef struct PgWork {
    bool busy;
    bool staged;        // MPI backend on a CUDA device: the data is in `host`
    bool scatter;       // a reduce-scatter: `host` holds its (world, n) input, then its (n) result
    float *buf;         // the caller's result buffer (n), on the device: the all-reduce's own, the reduce-scatter's recv
    size_t n;
    PgOp op;
    MPI_Request req;
    float *data;        // an all-reduce's (n) floats as MPI sees them: buf, or `host` when staged
    size_t piece;       // floats per MPI call: n (whole), or PIECE_FLOATS for a blocking call's pieces
    size_t started;     // how many of the n floats the calls started so far cover (see piece_start)
    float *host;        // (host_cap) pinned staging
    size_t host_cap;
    uint64_t trace_id;  // its async span on the timeline (kit/trace.h), 0 when none is open
#ifdef KIT_NCCL
    cudaEvent_t done;   // recorded on the NCCL stream after the collective
    bool has_event;
#endif
} Slot;

struct ProcessGroup {
    int rank, world, local_rank, local_world;
    Device dev;
    PgBackend backend;
    double timeout_s;
    PgTraffic traffic;   // what this group's calls handed to the backend (pg_traffic)
    bool blocking;       // a blocking call is using a slot: its timeline span is a complete one, not async
    SockGroup *sock;     // the socket backend (pg_init_socket, no MPI at all), else NULL
    bool is_sub;         // made by pg_split: pg_finalize frees it but leaves MPI running
    MPI_Comm comm;       // a duplicate of MPI_COMM_WORLD: the kit's traffic never mixes with the caller's
    // Arrival notes, for naming the rank a timed-out collective waits for (see wait_until).
    MPI_Comm note_comm;      // another duplicate: notes never match a collective's messages
    long long seq;           // collectives this rank has waited for, counted from 1 (the same on every rank)
    long long *seen;         // (world) the collective each rank last said it was waiting in (0: none yet)
    long long *note_buf;     // (world) send buffers of this rank's notes, one per peer
    MPI_Request *note_req;   // (world) their requests (MPI_REQUEST_NULL when none is pending)
    Slot slots[PG_MAX_INFLIGHT];
    float *stage;        // (stage_cap) staging for blocking broadcast / all-gather on CUDA + MPI
    size_t stage_cap;
#ifdef KIT_NCCL
    struct PgSend *pending;  // NCCL sends started but not yet posted (see nccl_post)
    ncclComm_t nccl;
    cudaStream_t stream;     // NCCL's own stream
    cudaEvent_t inputs_ready; // recorded on the compute stream before each collective
    cudaEvent_t blocking_done; // recorded after a blocking collective (broadcast, all-gather)
#endif
};

// Between two polls. Open MPI moves data only inside MPI calls (there is no progress thread), so a
// sleep here would stall a large collective. The first 100 us spin, as a blocking call does (small
// collectives finish in that time); then yielding keeps the loop nearly as fast while letting other
// ranks run when there are more ranks than cores. After a second of waiting the collective is either
// huge or stuck, and a short sleep stops a stalled job from burning CPU.
static void poll_pause(double waited_s) {
    if (waited_s < 100e-6) {
        return;
    } else if (waited_s < 1.0) {
        sched_yield();
    } else {
        struct timespec nap = {0, 200 * 1000};  // 0.2 ms
        nanosleep(&nap, NULL);
    }
}

void pg_abort(ProcessGroup *pg, const char *msg) {
    if (msg) {
        fflush(stdout);
        fprintf(stderr, "rank %d: %s\n", pg ? pg->rank : -1, msg);
        fflush(stderr);
    }
#ifdef KIT_NCCL
    // Frees NCCL's kernels and proxy threads that would otherwise wait forever for the dead peer.
    if (pg && pg->nccl) ncclCommAbort(pg->nccl);
#endif
    // The socket backend has no launcher to ask: our connections close with us, and every other rank stops at
    // its next receive with a message naming this rank.
    if (pg && pg->sock) exit(1);
    // MPI_Abort asks mpirun to kill every rank. Should it hang (its daemon is gone), the alarm ends us.
    alarm(10);
    MPI_Abort(MPI_COMM_WORLD, 1);
    _exit(1);
}

// ---------------------------------------------------------------- waiting, and naming the missing rank
//
// A rank that has waited PG_NOTE_AFTER_S in collective #k tells every peer "I am waiting in #k"; at the
// deadline, the ranks that never said so are the ones that did not join. kit/README.md ("The process group's
// waits") gives the cost of these notes and of the default timeout.
#define PG_NOTE_AFTER_S 1.0

static double note_after(const ProcessGroup *pg) {
    return pg->timeout_s / 4 < PG_NOTE_AFTER_S ? pg->timeout_s / 4 : PG_NOTE_AFTER_S;
}

// Tells every peer "I am waiting in collective #seq". A peer whose previous note is still in flight (it is
// not reading: stopped or dead) is skipped rather than given a second one. The notes are advice for the error
// message: an MPI error here (a dead peer's connection) skips that peer instead of stopping the job with a less
// useful message than the timeout's.
static void note_send(ProcessGroup *pg, long long seq) {
    if (pg->sock) return;  // no MPI under the socket backend (with NCCL on GPUs): no notes
    for (int r = 0; r < pg->world; r++) {
        if (r == pg->rank) continue;
        if (pg->note_req[r] != MPI_REQUEST_NULL) {
            int done = 0;
            if (MPI_Test(&pg->note_req[r], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done) continue;
        }
        pg->note_buf[r] = seq;
        if (MPI_Isend(&pg->note_buf[r], 1, MPI_LONG_LONG, r, 0, pg->note_comm, &pg->note_req[r]) != MPI_SUCCESS)
            pg->note_req[r] = MPI_REQUEST_NULL;
    }
}

// Reads every note that has arrived into pg->seen. Called at the start of every wait too, so the notes of a
// rank that never waits itself (the slowest one, which the others note every step) do not pile up.
static void note_drain(ProcessGroup *pg) {
    if (pg->sock) return;
    for (;;) {
        int flag = 0;
        MPI_Status st;
        if (MPI_Iprobe(MPI_ANY_SOURCE, 0, pg->note_comm, &flag, &st) != MPI_SUCCESS || !flag) return;
        long long v = 0;
        if (MPI_Recv(&v, 1, MPI_LONG_LONG, st.MPI_SOURCE, 0, pg->note_comm, MPI_STATUS_IGNORE) != MPI_SUCCESS) return;
        if (v > pg->seen[st.MPI_SOURCE]) pg->seen[st.MPI_SOURCE] = v;
    }
}

static void timeout_fail(ProcessGroup *pg, const char *what, size_t n, const char *unit, long long seq,
                         double waited) __attribute__((noreturn));
static void timeout_fail(ProcessGroup *pg, const char *what, size_t n, const char *unit, long long seq,
                         double waited) {
    char who[384], msg[1024];
    if (pg->sock) {
        snprintf(who, sizeof who, "a peer rank did not take part (its own output says why)");
    } else {
        pg->seen[pg->rank] = seq;
        pg_describe_absent(pg->seen, pg->world, pg->rank, seq, who, sizeof who);
    }
    snprintf(msg, sizeof msg,
             "%s #%lld of %zu %s timed out after %.1f s (limit %.0f s): %s\n"
             "  HINT: every rank must call the same collectives in the same order; if one step is just slow, "
             "raise the limit with --timeout or KIT_PG_TIMEOUT=<seconds>",
             what, seq, n, unit, waited, pg->timeout_s, who);
    pg_abort(pg, msg);
}

// Polls `done` until it says the collective completed, or stops the job when the deadline passes; the
// arrival notes above run meanwhile. Every collective's wait goes through here, so pg->seq counts them.
typedef bool (*PollFn)(ProcessGroup *pg, void *ctx);

static void wait_until(ProcessGroup *pg, PollFn done, void *ctx, const char *what, size_t n, const char *unit) {
    const long long seq = ++pg->seq;
    const double start = time_now(), quiet = note_after(pg);
    bool noted = false;
    note_drain(pg);  // one MPI_Iprobe when nothing came
    for (;;) {
        if (done(pg, ctx)) return;
        double waited = time_now() - start;
        if (waited > quiet) {
            if (!noted) note_send(pg, seq);
            noted = true;
            note_drain(pg);
        }
        if (waited > pg->timeout_s) {
            // A rank that arrived less than `quiet` ago has not sent its note yet: hear it before judging.
            // The collective may still complete meanwhile; then the job goes on.
            const double judge = time_now() + quiet + 0.5;
            while (time_now() < judge) {
                if (done(pg, ctx)) return;
                note_drain(pg);
                poll_pause(waited);
            }
            timeout_fail(pg, what, n, unit, seq, time_now() - start);
        }
        poll_pause(waited);
    }
}

static bool mpi_done(ProcessGroup *pg, void *req) {
    int done = 0;
    MPI_CHECK(MPI_Test((MPI_Request *)req, &done, MPI_STATUS_IGNORE));
    return done != 0;
}

// Completes an MPI request, or stops the job when the deadline passes.
static void mpi_wait(ProcessGroup *pg, MPI_Request *req, const char *what, size_t n, const char *unit) {
    wait_until(pg, mpi_done, req, what, n, unit);
}

// MPI counts are int: larger buffers would need chunking, which no lesson needs.
static int mpi_count(size_t n) {
    CHECKF(n <= (size_t)INT_MAX, "split the buffer into pieces below 2^31 floats",
           "%zu elements is more than one MPI call can take", n);
    return (int)n;
}

// Grows a pinned host buffer to hold `bytes`.
static float *stage_reserve(float **buf, size_t *cap, size_t bytes) {
    if (*cap < bytes) {
        host_free_pinned(*buf);
        *buf = host_alloc_pinned(bytes);
        *cap = bytes;
    }
    return *buf;
}

static bool staged(const ProcessGroup *pg) { return pg->backend != PG_BACKEND_NCCL && pg->dev == DEVICE_CUDA; }

// ---------------------------------------------------------------- NCCL helpers
#ifdef KIT_NCCL
// A non-blocking communicator may answer ncclInProgress: poll until the call has settled.
static bool nccl_settled(ProcessGroup *pg, void *r) {
    ncclResult_t *res = r;
    if (*res != ncclInProgress) return true;
    NCCL_CHECK(ncclCommGetAsyncError(pg->nccl, res));
    return *res != ncclInProgress;
}

// A failure names the operation and adds NCCL's own last message (which argument it refused, and why).
static void nccl_settle(ProcessGroup *pg, ncclResult_t r, const char *what, size_t n) {
    if (r == ncclSuccess) return;
    wait_until(pg, nccl_settled, &r, what, n, "floats");
    if (r == ncclSuccess) return;
    char msg[512];
    const char *detail = ncclGetLastError(pg->nccl);  // NULL: the last error of any communicator
    snprintf(msg, sizeof msg, "%s (%zu) failed in NCCL: %s%s%s\n  HINT: %s", what, n, ncclGetErrorString(r),
             detail && *detail ? ": " : "", detail ? detail : "", nccl_hint(r));
    pg_abort(pg, msg);
}

// Makes NCCL's stream wait for the compute work queued so far. An event on the legacy default stream
// completes after all earlier work on every blocking stream, which covers the kit's compute stream
// (kit/cuda/cuda_context.cu) and device.c's copies alike.
static void nccl_after_compute(ProcessGroup *pg) {
    CUDA_CHECK(cudaEventRecord(pg->inputs_ready, 0));
    CUDA_CHECK(cudaStreamWaitEvent(pg->stream, pg->inputs_ready, 0));
}

typedef struct {
    cudaEvent_t ev;
    const char *what;
    size_t n;
} EventWait;

// An event on NCCL's stream has completed; NCCL's own errors stop the job.
static bool nccl_event_done(ProcessGroup *pg, void *ctx) {
    const EventWait *w = ctx;
    cudaError_t e = cudaEventQuery(w->ev);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) CUDA_CHECK(e);
    ncclResult_t async = ncclSuccess;
    NCCL_CHECK(ncclCommGetAsyncError(pg->nccl, &async));
    if (async != ncclSuccess && async != ncclInProgress) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s of %zu floats failed in NCCL: %s\n  HINT: %s", w->what, w->n,
                 ncclGetErrorString(async), nccl_hint(async));
        pg_abort(pg, msg);
    }
    return false;
}

// Waits for an event on NCCL's stream, watching NCCL's error state and the deadline.
static void nccl_wait_event(ProcessGroup *pg, cudaEvent_t ev, const char *what, size_t n) {
    EventWait w = {ev, what, n};
    wait_until(pg, nccl_event_done, &w, what, n, "floats");
}

static cudaEvent_t slot_event(Slot *s) {
    if (!s->has_event) {
        CUDA_CHECK(cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming));
        s->has_event = true;
    }
    return s->done;
}

// Runs `call` (an NCCL collective on pg->stream) and waits for it with the deadline.
#define NCCL_BLOCKING(pg, call, what, n)                                                  \
    do {                                                                                  \
        nccl_after_compute(pg);                                                           \
        nccl_settle((pg), (call), (what), (n));                                           \
        CUDA_CHECK(cudaEventRecord((pg)->blocking_done, (pg)->stream));                   \
        nccl_wait_event((pg), (pg)->blocking_done, (what), (n));                          \
    } while (0)
#endif

// ---------------------------------------------------------------- setup

int pg_rank(const ProcessGroup *pg) { return pg->rank; }
int pg_world(const ProcessGroup *pg) { return pg->world; }
int pg_local_rank(const ProcessGroup *pg) { return pg->local_rank; }
int pg_local_world(const ProcessGroup *pg) { return pg->local_world; }
Device pg_device(const ProcessGroup *pg) { return pg->dev; }
PgBackend pg_backend(const ProcessGroup *pg) { return pg->backend; }
double pg_timeout(const ProcessGroup *pg) { return pg->timeout_s; }
PgTraffic pg_traffic(const ProcessGroup *pg) { return pg->traffic; }

// One collective call handing `bytes` of input to the backend (pg_traffic).
static void count_coll(ProcessGroup *pg, size_t bytes) {
    pg->traffic.coll_bytes_in += bytes;
    pg->traffic.coll_calls++;
}

static double timeout_from_env(double given) {
    const char *env = getenv("KIT_PG_TIMEOUT");
    if (env && env[0]) {
        char *end = NULL;
        double t = strtod(env, &end);
        if (*end != '\0' || !(t > 0)) die("KIT_PG_TIMEOUT='%s' is not a positive number of seconds", env);
        return t;
    }
    return given > 0 ? given : PG_DEFAULT_TIMEOUT_S;
}

// A small all-reduce of ints on the host (setup decisions), with the deadline.
static void host_allreduce_int(ProcessGroup *pg, MPI_Comm comm, int *v, int n, MPI_Op op, const char *what) {
    MPI_Request req;
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, v, n, MPI_INT, op, comm, &req));
    mpi_wait(pg, &req, what, (size_t)n, "ints");
}

// Rank and size among the processes of this node (MPI_COMM_TYPE_SHARED: same shared memory).
static void find_local_rank(ProcessGroup *pg, MPI_Comm *node) {
    MPI_CHECK(MPI_Comm_split_type(pg->comm, MPI_COMM_TYPE_SHARED, pg->rank, MPI_INFO_NULL, node));
    MPI_CHECK(MPI_Comm_rank(*node, &pg->local_rank));
    MPI_CHECK(MPI_Comm_size(*node, &pg->local_world));
}

// Picks this rank's GPU by local rank and returns the most ranks of any node that share one physical
// GPU (compared by PCI bus id, so CUDA_VISIBLE_DEVICES set per rank by a launcher counts correctly).
static int pick_gpu(ProcessGroup *pg, MPI_Comm node) {
    int most = 0;
#ifdef KIT_CUDA
    if (pg->dev == DEVICE_CUDA) {
        int gpus = device_gpu_count();
        CHECK(gpus > 0, "--device cuda needs a usable GPU on every node: run `nvidia-smi` there");
        device_set_gpu(pg->local_rank % gpus);
        enum { ID = 32 };
        char mine[ID] = {0};
        CUDA_CHECK(cudaDeviceGetPCIBusId(mine, ID, pg->local_rank % gpus));
        char *all = xcalloc((size_t)pg->local_world, ID);
        MPI_Request req;
        MPI_CHECK(MPI_Iallgather(mine, ID, MPI_CHAR, all, ID, MPI_CHAR, node, &req));
        mpi_wait(pg, &req, "gathering GPU ids", ID, "bytes");
        most = pg_max_duplicates(all, pg->local_world, ID);
        free(all);
    }
#endif
    // The busiest node decides for everyone: all ranks must pick the same backend.
    host_allreduce_int(pg, pg->comm, &most, 1, MPI_MAX, "agreeing on the backend");
    return most;
}

#ifdef KIT_NCCL
static void nccl_init_with(ProcessGroup *pg, ncclUniqueId id);

static void nccl_init(ProcessGroup *pg) {
    ncclUniqueId id;
    if (pg->rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    MPI_Request req;
    MPI_CHECK(MPI_Ibcast(&id, (int)sizeof id, MPI_BYTE, 0, pg->comm, &req));
    mpi_wait(pg, &req, "broadcast of the ncclUniqueId", sizeof id, "bytes");
    nccl_init_with(pg, id);
}

// The communicator from rank 0's id, however it came (MPI_Bcast above, or a rendezvous store: pg_init_socket).
// NCCL's own stream and the two events every NCCL group uses.
static void nccl_stream_init(ProcessGroup *pg) {
    CUDA_CHECK(cudaStreamCreateWithFlags(&pg->stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&pg->inputs_ready, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&pg->blocking_done, cudaEventDisableTiming));
}

static void nccl_init_with(ProcessGroup *pg, ncclUniqueId id) {
    nccl_stream_init(pg);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
    // Non-blocking: init returns at once and we poll, so a missing peer cannot hang us here.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&pg->nccl, pg->world, id, pg->rank, &config);
    nccl_settle(pg, r, "NCCL communicator setup", (size_t)pg->world);
#else
    NCCL_CHECK(ncclCommInitRank(&pg->nccl, pg->world, id, pg->rank));
#endif
}
#endif

// Asks Open MPI's non-blocking all-reduce for its ring (2(N-1)/N of the buffer per rank) instead of its binomial
// tree, on 2 ranks only, where both give the same bits; a value someone set is left alone. Why and how:
// kit/README.md ("The all-reduce algorithm").
static void mpi_prefer_ring_iallreduce(void) {
    int provided = 0, index = 0, count = 0, world = 0;
    if (MPI_Comm_size(MPI_COMM_WORLD, &world) != MPI_SUCCESS || world != 2) return;
    if (MPI_T_init_thread(MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) return;
    MPI_T_cvar_handle handle;
    if (MPI_T_cvar_get_index("coll_libnbc_iallreduce_algorithm", &index) == MPI_SUCCESS &&
        MPI_T_cvar_handle_alloc(index, NULL, &handle, &count) == MPI_SUCCESS) {
        int algorithm = 0;
        const int ring = 1;  // the variable's enum: 0 ignore, 1 ring, 2 binomial, 3 rabenseifner, ...
        if (count == 1 && MPI_T_cvar_read(handle, &algorithm) == MPI_SUCCESS && algorithm == 0)
            MPI_T_cvar_write(handle, &ring);
        MPI_T_cvar_handle_free(&handle);
    }
    MPI_T_finalize();  // the written value stays in effect: MPI_T only gave access to it
}

// Rank and size from pg->comm, and the arrival notes' own communicator and arrays (see wait_until).
static void comm_adopt(ProcessGroup *pg) {
    MPI_CHECK(MPI_Comm_set_errhandler(pg->comm, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(pg->comm, &pg->rank));
    MPI_CHECK(MPI_Comm_size(pg->comm, &pg->world));
    MPI_CHECK(MPI_Comm_dup(pg->comm, &pg->note_comm));
    pg->seen = xcalloc((size_t)pg->world, sizeof *pg->seen);
    pg->note_buf = xcalloc((size_t)pg->world, sizeof *pg->note_buf);
    pg->note_req = xmalloc((size_t)pg->world * sizeof *pg->note_req);
    for (int r = 0; r < pg->world; r++) pg->note_req[r] = MPI_REQUEST_NULL;
}

ProcessGroup *pg_init(int *argc, char ***argv, const char *backend, Device dev, double timeout_s) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        int provided = 0;
        // FUNNELED: the data loader has its own thread, but only the main thread calls MPI.
        if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
            die("MPI_Init failed: start the program with mpirun (scripts/launch.sh) or srun --mpi=pmix");
    }
    mpi_prefer_ring_iallreduce();  // before the first collective, on every rank alike
    ProcessGroup *pg = xcalloc(1, sizeof *pg);
    pg->dev = dev;
    pg->timeout_s = timeout_from_env(timeout_s);
    MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &pg->comm));
    comm_adopt(pg);

    MPI_Comm node;
    find_local_rank(pg, &node);
    int ranks_per_gpu = pick_gpu(pg, node);
    MPI_CHECK(MPI_Comm_free(&node));

    char why[512];
    if (!pg_choose_backend(backend, PG_START_MPIRUN, dev, device_cuda_built() && KIT_NCCL_BUILT, ranks_per_gpu,
                           &pg->backend, why, sizeof why)) {
        // Every rank reached the same verdict (the inputs were agreed on above): one message, clean exit.
        if (pg->rank == 0) fprintf(stderr, "error: %s\n", why);
        MPI_Finalize();
        exit(1);
    }
#ifdef KIT_NCCL
    if (pg->backend == PG_BACKEND_NCCL) nccl_init(pg);
#endif
    if (pg->rank == 0)
        printf("process group: %d rank%s, backend %s (%s), device %s, timeout %.0f s\n", pg->world,
               pg->world == 1 ? "" : "s", pg_backend_name(pg->backend), why, device_name(dev), pg->timeout_s);
    return pg;
}

bool pg_nccl_unique_id(void *out) {
#ifdef KIT_NCCL
    ncclUniqueId id;
    NCCL_CHECK(ncclGetUniqueId(&id));
    _Static_assert(sizeof id == PG_NCCL_ID_BYTES, "ncclUniqueId is 128 bytes");
    memcpy(out, &id, sizeof id);
    return true;
#else
    memset(out, 0, PG_NCCL_ID_BYTES);
    return false;
#endif
}

// GPUs under the socket backend: the most ranks of one node that share a physical GPU (node name + PCI bus
// id, gathered over the sockets), as pick_gpu finds it under MPI.
#ifdef KIT_CUDA
static int socket_ranks_per_gpu(ProcessGroup *pg, const char *node) {
    enum { ID = 128 };
    char mine[ID] = {0}, bus[32] = {0};
    CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof bus, pg->local_rank % device_gpu_count()));
    snprintf(mine, ID, "%.90s|%s", node ? node : "", bus);
    char *all = xcalloc((size_t)pg->world, ID);
    sockgroup_allgather(pg->sock, mine, all, ID);
    int most = pg_max_duplicates(all, pg->world, ID);
    free(all);
    return most;
}
#endif

ProcessGroup *pg_init_socket(const PgPeers *peers, const char *backend, Device dev, double timeout_s) {
    const char *req = backend ? backend : "auto";
    char why[512];
    if (!pg_backend_startable(req, PG_START_STORE, why, sizeof why)) die("%s", why);
    ProcessGroup *pg = xcalloc(1, sizeof *pg);
    pg->rank = peers->rank;
    pg->world = peers->world;
    pg->local_rank = peers->local_rank;
    pg->local_world = peers->local_world;
    pg->dev = dev;
    pg->backend = PG_BACKEND_SOCKET;
    pg->timeout_s = timeout_from_env(timeout_s);
#ifdef KIT_CUDA
    if (dev == DEVICE_CUDA) {  // the GPU by local rank, as pg_init does; the collectives stage through the host
        int gpus = device_gpu_count();
        CHECK(gpus > 0, "--device cuda needs a usable GPU on every node: run `nvidia-smi` there");
        device_set_gpu(pg->local_rank % gpus);
    }
#endif
    char err[1024];
    pg->sock = sockgroup_create(pg->rank, pg->world, peers->root_addr, peers->listen_fd, pg->timeout_s, err, sizeof err);
    if (!pg->sock)
        check_failf(__FILE__, __LINE__, "sockgroup_create", "every rank must start within the timeout and reach rank 0's "
                    "address (KIT_SOCKET_IFNAME picks the interface rank 0 publishes; a firewall may block the port)",
                    "%s", err);
    // The sockets carry the host-side collectives; on GPUs, as under mpirun, NCCL takes the rest when every
    // rank has a GPU of its own (its unique id came through the store).
    snprintf(why, sizeof why, "host sums over TCP, around rank 0");
    if (strcmp(req, "socket") != 0) {
        int ranks_per_gpu = 0;
#ifdef KIT_CUDA
        if (dev == DEVICE_CUDA) ranks_per_gpu = socket_ranks_per_gpu(pg, peers->node);
#endif
        PgBackend choice;
        char verdict[512];
        if (!pg_choose_backend(req, PG_START_STORE, dev, KIT_NCCL_BUILT, ranks_per_gpu, &choice, verdict,
                               sizeof verdict))
            die("%s", verdict);  // every rank reached the same verdict from the same gathered ids
        if (dev == DEVICE_CUDA) snprintf(why, sizeof why, "%s", verdict);
        if (choice == PG_BACKEND_NCCL) {
            CHECK(peers->nccl_id != NULL, "on GPUs rank 0's NCCL unique id must reach every rank through the store "
                                          "(pg_nccl_unique_id on rank 0, then the bootstrap) before pg_init_socket");
#ifdef KIT_NCCL
            ncclUniqueId id;
            memcpy(&id, peers->nccl_id, sizeof id);
            pg->backend = PG_BACKEND_NCCL;
            nccl_init_with(pg, id);
#endif
        }
    }
    if (pg->rank == 0)
        printf("process group: %d rank%s, backend %s (started from a rendezvous store, without mpirun: %s), device %s, "
               "timeout %.0f s\n", pg->world, pg->world == 1 ? "" : "s", pg_backend_name(pg->backend), why,
               device_name(dev), pg->timeout_s);
    return pg;
}

// What every backend holds: the in-flight slots, the staging buffer and, on GPUs, the NCCL communicator.
static void pg_free_buffers(ProcessGroup *pg) {
    for (int i = 0; i < PG_MAX_INFLIGHT; i++) {
        Slot *s = &pg->slots[i];
        CHECK(!s->busy, "a non-blocking collective was never completed: call pg_wait, pg_work_wait or buckets_finish");
        host_free_pinned(s->host);
#ifdef KIT_NCCL
        if (s->has_event) CUDA_CHECK(cudaEventDestroy(s->done));
#endif
    }
    host_free_pinned(pg->stage);
#ifdef KIT_NCCL
    if (pg->nccl) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
        // Non-blocking communicator: finish its outstanding work before destroying it.
        nccl_settle(pg, ncclCommFinalize(pg->nccl), "NCCL shutdown", 0);
#endif
        NCCL_CHECK(ncclCommDestroy(pg->nccl));
        CUDA_CHECK(cudaEventDestroy(pg->inputs_ready));
        CUDA_CHECK(cudaEventDestroy(pg->blocking_done));
        CUDA_CHECK(cudaStreamDestroy(pg->stream));
    }
#endif
}

void pg_finalize(ProcessGroup *pg) {
    if (!pg) return;
    // A rank that is missing now is reported here, with the deadline, not as a hang in MPI_Finalize.
    pg_barrier(pg);
    pg_free_buffers(pg);
    if (pg->sock) {  // started from a store: no MPI state to free, no MPI to finalize
        sockgroup_free(pg->sock);
        free(pg);
        return;
    }
    // Notes of slow steps that nobody read: read them, and complete this rank's own (every rank is here, after
    // the barrier above, so the notes sent to it before are on their way or arrived).
    note_drain(pg);
    for (int r = 0; r < pg->world; r++)
        if (pg->note_req[r] != MPI_REQUEST_NULL) MPI_CHECK(MPI_Request_free(&pg->note_req[r]));
    free(pg->seen);
    free(pg->note_buf);
    free(pg->note_req);
    MPI_CHECK(MPI_Comm_free(&pg->note_comm));
    MPI_CHECK(MPI_Comm_free(&pg->comm));
    bool world_group = !pg->is_sub;
    free(pg);
    if (world_group) MPI_Finalize();
}

// ---------------------------------------------------------------- all-reduce

// A blocking all-reduce larger than PIECE_FLOATS goes to MPI in pieces of that size, one after the other: each
// piece's scratch (Open MPI's ring allocates half the message per call) and its sums then stay in the caches,
// where a whole 64 MB message runs at the speed of memory and faults its fresh scratch in on every call. On 2
// ranks here: 3.9 against 1.6 GB/s at 64 MB, 4.0 against 3.3 at 16 MB; up to 8 MB one piece or two cost the same
// (kit/README.md, "The all-reduce algorithm"). Non-blocking all-reduces (the buckets during backward) go whole:
// Open MPI moves them only at pg_progress calls, a few protocol rounds per message, so one large message gets
// further during backward than a chain of pieces would (measured: pieced buckets left 3x the communication
// exposed after backward). Pieces do not change the sums: an element's additions in libnbc's tree and in the
// 2-rank ring do not depend on the message's length.
enum { PIECE_FLOATS = 1 << 20 };  // 4 MB

// Starts slot s's next MPI call: `piece` floats from `started` on (the first: also when n == 0, so that every
// all-reduce is one MPI collective at least).
static void piece_start(ProcessGroup *pg, Slot *s) {
    size_t len = s->n - s->started < s->piece ? s->n - s->started : s->piece;
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, s->data + s->started, mpi_count(len), MPI_FLOAT, MPI_SUM, pg->comm,
                             &s->req));
    s->started += len;
}

// Tests slot s's collective; a blocking all-reduce's finished piece starts the next (inside that call's wait, so
// every rank starts its pieces at the same point of its sequence of collectives). True when the last is done.
static bool slot_advance(ProcessGroup *pg, void *slot) {
    Slot *s = slot;
    int done = 0;
    MPI_CHECK(MPI_Test(&s->req, &done, MPI_STATUS_IGNORE));  // a completed request stays done
    if (!done || s->scatter || s->started == s->n) return done != 0;
    piece_start(pg, s);
    return false;
}

static int slot_take(ProcessGroup *pg) {
    int i = 0;
    while (i < PG_MAX_INFLIGHT && pg->slots[i].busy) i++;
    CHECKF(i < PG_MAX_INFLIGHT, "call pg_wait on earlier requests before starting more",
           "more than %d collectives in flight", PG_MAX_INFLIGHT);
    return i;
}

// Takes a free slot for a collective of `bytes` in all, with its result in buf (n floats), and counts it.
static Slot *slot_open(ProcessGroup *pg, float *buf, size_t n, PgOp op, bool scatter, size_t bytes) {
    Slot *s = &pg->slots[slot_take(pg)];
    count_coll(pg, bytes);
    s->busy = true;
    s->scatter = scatter;
    s->buf = buf;
    s->n = n;
    s->op = op;
    s->staged = staged(pg);
    s->trace_id = pg->blocking ? 0 : trace_async_begin_named(TRACE_COMM, scatter ? "reduce-scatter" : "all-reduce");
    return s;
}

// pg_iallreduce, with `piece` floats per MPI call (see PIECE_FLOATS).
static PgRequest allreduce_start(ProcessGroup *pg, float *buf, size_t n, PgOp op, size_t piece) {
    Slot *s = slot_open(pg, buf, n, op, false, n * sizeof(float));
    const int i = (int)(s - pg->slots);
#ifdef KIT_NCCL
    if (pg->backend == PG_BACKEND_NCCL) {
        nccl_after_compute(pg);
        nccl_settle(pg, ncclAllReduce(buf, buf, n, ncclFloat, op == PG_AVG ? ncclAvg : ncclSum, pg->nccl, pg->stream),
                    "all-reduce", n);
        CUDA_CHECK(cudaEventRecord(slot_event(s), pg->stream));
        return (PgRequest){i};
    }
#endif
    float *data = buf;
    if (s->staged) {
        data = stage_reserve(&s->host, &s->host_cap, n * sizeof(float));
        device_copy_from(pg->dev, data, buf, n * sizeof(float));  // waits for the kernels that made buf
    }
    if (pg->sock) {  // blocking: the socket backend overlaps nothing with backward
        sockgroup_allreduce_sum(pg->sock, data, n, false);
        return (PgRequest){i};
    }
    s->data = data;
    s->piece = piece;
    s->started = 0;
    piece_start(pg, s);
    return (PgRequest){i};
}

PgRequest pg_iallreduce(ProcessGroup *pg, float *buf, size_t n, PgOp op) {
    return allreduce_start(pg, buf, n, op, n);
}

PgWork *pg_reduce_scatter_sum_start(ProcessGroup *pg, const float *send, float *recv, size_t n) {
    CHECK(send != recv, "a reduce-scatter's send (world, n) and recv (n) must be different buffers");
    CHECKF(!pg->sock, "the socket backend sums around rank 0 only: run under mpirun for a reduce-scatter",
           "a reduce-scatter on the socket backend");
    const size_t total = n * (size_t)pg->world;
    mpi_count(total);
    Slot *s = slot_open(pg, recv, n, PG_SUM, true, total * sizeof(float));
#ifdef KIT_NCCL
    if (pg->backend == PG_BACKEND_NCCL) {
        nccl_after_compute(pg);
        nccl_settle(pg, ncclReduceScatter(send, recv, n, ncclFloat, ncclSum, pg->nccl, pg->stream), "reduce-scatter",
                    n);
        CUDA_CHECK(cudaEventRecord(slot_event(s), pg->stream));
        return s;
    }
#endif
    const float *src = send;
    float *dst = recv;
    if (s->staged) {  // one host buffer: the (world, n) input, then this rank's (n) block of the result
        float *h = stage_reserve(&s->host, &s->host_cap, (total + n) * sizeof(float));
        device_copy_from(pg->dev, h, send, total * sizeof(float));  // waits for the kernels that made send
        src = h;
        dst = h + total;
    }
    MPI_CHECK(MPI_Ireduce_scatter_block(src, dst, mpi_count(n), MPI_FLOAT, MPI_SUM, pg->comm, &s->req));
    return s;
}

// Completes slot s: waits for it (the deadline, `what` in the error), then the all-reduce's average and the
// copies back from a host staging buffer.
static void slot_finish(ProcessGroup *pg, Slot *s, const char *what) {
    double t = pg->blocking ? 0.0 : trace_begin("wait");
#ifdef KIT_NCCL
    if (pg->backend == PG_BACKEND_NCCL) {
        nccl_wait_event(pg, s->done, what, s->n);
        trace_async_end(s->trace_id);
        s->trace_id = 0;
        if (!pg->blocking) trace_endf(t, TRACE_WAIT, "wait: %s", what);
        s->busy = false;
        return;
    }
#endif
    if (!pg->sock) wait_until(pg, slot_advance, s, what, s->n, "floats");
    trace_async_end(s->trace_id);  // if pg_progress did not see it finish first
    s->trace_id = 0;
    if (!pg->blocking) trace_endf(t, TRACE_WAIT, "wait: %s", what);
    if (s->scatter) {
        if (s->staged) device_copy_to(pg->dev, s->buf, s->host + s->n * (size_t)pg->world, s->n * sizeof(float));
        s->busy = false;
        return;
    }
    float *data = s->staged ? s->host : s->buf;
    if (s->op == PG_AVG && pg->world > 1) {
        // Divide: the same rounding as PyTorch DDP's grad.div_(world). When the world is a power of two, 1/world is
        // exact and x * (1/world) is the same float as x / world, so the cheaper multiply gives the same bits.
        float w = (float)pg->world;
        if ((pg->world & (pg->world - 1)) == 0) {
            float inv = 1.0f / w;
            for (size_t k = 0; k < s->n; k++) data[k] *= inv;
        } else {
            for (size_t k = 0; k < s->n; k++) data[k] /= w;
        }
    }
    if (s->staged) device_copy_to(pg->dev, s->buf, data, s->n * sizeof(float));
    s->busy = false;
}

void pg_wait(ProcessGroup *pg, PgRequest r) {
    CHECK(r.slot >= 0 && r.slot < PG_MAX_INFLIGHT && pg->slots[r.slot].busy,
          "pg_wait on a request that was never started or was already waited for");
    slot_finish(pg, &pg->slots[r.slot], "all-reduce");
}

void pg_work_wait(ProcessGroup *pg, PgWork *w, const char *what) {
    bool ours = false;  // one of this group's slots, in flight (== is defined between any two pointers; < is not)
    for (int i = 0; i < PG_MAX_INFLIGHT && !ours; i++) ours = w == &pg->slots[i] && w->busy;
    CHECK(ours, "pg_work_wait takes what pg_reduce_scatter_sum_start returned, on the same group, once");
    slot_finish(pg, w, what ? what : "reduce-scatter");
}

static void pg_allreduce(ProcessGroup *pg, float *buf, size_t n, PgOp op) {
    double t = trace_begin("all-reduce");
    pg->blocking = true;
    pg_wait(pg, allreduce_start(pg, buf, n, op, n > PIECE_FLOATS ? PIECE_FLOATS : n));
    pg->blocking = false;
    trace_endf(t, TRACE_COMM, "all-reduce %zu floats", n);
}

// Open MPI moves a non-blocking collective's data only inside MPI calls (no progress thread): a bucket started
// during backward would otherwise sit still until pg_wait. One test of every collective in flight lets it move.
void pg_progress(ProcessGroup *pg) {
    if (pg->sock || pg->backend == PG_BACKEND_NCCL) return;  // blocking sums / NCCL's own stream
    for (int i = 0; i < PG_MAX_INFLIGHT; i++) {
        Slot *s = &pg->slots[i];
        if (s->busy && slot_advance(pg, s) && s->trace_id) {  // done: the timeline's span ends here, not at the wait
            trace_async_end(s->trace_id);
            s->trace_id = 0;
        }
    }
}

void pg_allreduce_sum_double_host(ProcessGroup *pg, double *host_buf, int n) {
    double t = trace_begin("all-reduce (host)");
    count_coll(pg, (size_t)(n > 0 ? n : 0) * sizeof(double));
    if (pg->sock) {
        sockgroup_allreduce_sum(pg->sock, host_buf, (size_t)n, true);
    } else {
        MPI_Request req;
        MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, host_buf, n, MPI_DOUBLE, MPI_SUM, pg->comm, &req));
        mpi_wait(pg, &req, "all-reduce (host)", (size_t)n, "doubles");
    }
    trace_endf(t, TRACE_COMM, "all-reduce %d doubles (host)", n);
}

// ---------------------------------------------------------------- broadcast, all-gather, barrier

static void broadcast(ProcessGroup *pg, float *buf, size_t n, int root);
void pg_broadcast(ProcessGroup *pg, float *buf, size_t n, int root) {
    double t = trace_begin("broadcast");
    broadcast(pg, buf, n, root);
    trace_endf(t, TRACE_COMM, "broadcast %zu floats from rank %d", n, root);
}

static void broadcast(ProcessGroup *pg, float *buf, size_t n, int root) {
    CHECK(root >= 0 && root < pg->world, "the root of a broadcast must be a rank: 0 <= root < world");
    count_coll(pg, n * sizeof(float));
#ifdef KIT_NCCL
    if (pg->backend == PG_BACKEND_NCCL) {
        NCCL_BLOCKING(pg, ncclBroadcast(buf, buf, n, ncclFloat, root, pg->nccl, pg->stream), "broadcast", n);
        return;
    }
#endif
    float *data = buf;
    if (staged(pg)) {
        data = stage_reserve(&pg->stage, &pg->stage_cap, n * sizeof(float));
        if (pg->rank == root) device_copy_from(pg->dev, data, buf, n * sizeof(float));
    }
    if (pg->sock) {
        sockgroup_broadcast(pg->sock, data, n * sizeof(float), root);
    } else {
        MPI_Request req;
        MPI_CHECK(MPI_Ibcast(data, mpi_count(n), MPI_FLOAT, root, pg->comm, &req));
        mpi_wait(pg, &req, "broadcast", n, "floats");
    }
    if (staged(pg) && pg->rank != root) device_copy_to(pg->dev, buf, data, n * sizeof(float));
}

static void allgather(ProcessGroup *pg, const float *send, float *recv, size_t n);
void pg_allgather(ProcessGroup *pg, const float *send, float *recv, size_t n) {
    double t = trace_begin("all-gather");
    allgather(pg, send, recv, n);
    trace_endf(t, TRACE_COMM, "all-gather %zu floats", n);
}

static void allgather(ProcessGroup *pg, const float *send, float *recv, size_t n) {
    count_coll(pg, n * sizeof(float));
#ifdef KIT_NCCL
    if (pg->backend == PG_BACKEND_NCCL) {
        NCCL_BLOCKING(pg, ncclAllGather(send, recv, n, ncclFloat, pg->nccl, pg->stream), "all-gather", n);
        return;
    }
#endif
    size_t total = n * (size_t)pg->world;
    mpi_count(total);
    const float *src = send;
    float *dst = recv;
    if (staged(pg)) {
        // One host buffer: this rank's block first, the gathered (world, n) after it.
        float *h = stage_reserve(&pg->stage, &pg->stage_cap, (n + total) * sizeof(float));
        device_copy_from(pg->dev, h, send, n * sizeof(float));
        src = h;
        dst = h + n;
    }
    if (pg->sock) {
        sockgroup_allgather(pg->sock, src, dst, n * sizeof(float));
    } else {
        MPI_Request req;
        MPI_CHECK(MPI_Iallgather(src, mpi_count(n), MPI_FLOAT, dst, mpi_count(n), MPI_FLOAT, pg->comm, &req));
        mpi_wait(pg, &req, "all-gather", n, "floats");
    }
    if (staged(pg)) device_copy_to(pg->dev, recv, dst, total * sizeof(float));
}

// The blocking call is the one in flight, waited for at once: one code path, the same bits.
void pg_reduce_scatter_sum(ProcessGroup *pg, const float *send, float *recv, size_t n) {
    double t = trace_begin("reduce-scatter");
    pg->blocking = true;
    pg_work_wait(pg, pg_reduce_scatter_sum_start(pg, send, recv, n), "reduce-scatter");
    pg->blocking = false;
    trace_endf(t, TRACE_COMM, "reduce-scatter %zu floats", n);
}

void pg_barrier(ProcessGroup *pg) {
    double t = trace_begin("barrier");
    if (pg->sock) {
        sockgroup_barrier(pg->sock);
    } else {
        MPI_Request req;
        MPI_CHECK(MPI_Ibarrier(pg->comm, &req));
        mpi_wait(pg, &req, "barrier", 0, "bytes");
    }
    trace_end(t, TRACE_WAIT, "barrier");
}

// ---------------------------------------------------------------- point to point
//
// Two ranks only: the arrival notes of wait_until (which count collectives, the same count on every rank) do
// not apply, so these waits have their own loop and their own error, which names the peer and the message.

struct PgSend {
    MPI_Request req;
    float *host;         // MPI on a CUDA device: the data staged on the host (owned), else NULL
    size_t n;
    int peer, tag;
    uint64_t trace_id;   // its async span on the timeline (0: none)
#ifdef KIT_NCCL
    const float *buf;    // NCCL: the device buffer, sent at the next pg_recv / pg_send_wait (see nccl_flush)
    bool posted;
    cudaEvent_t done;
#endif
    PgSend *next_pending;
};

#define PG_MAX_TAG 32767  // the least MPI_TAG_UB the MPI standard allows

static void p2p_check_args(const ProcessGroup *pg, size_t n, int peer, int tag, const char *op) {
    CHECKF(pg->backend != PG_BACKEND_SOCKET, "point-to-point messages need mpirun (the MPI or NCCL backend)",
           "%s on the socket backend", op);
    CHECKF(peer >= 0 && peer < pg->world && peer != pg->rank, "the peer is another rank of this group: 0 <= peer < world",
           "%s with peer %d on rank %d of %d", op, peer, pg->rank, pg->world);
    CHECKF(tag >= 0 && tag <= PG_MAX_TAG, "build the tag from small numbers (direction, micro-batch index)",
           "%s with tag %d: tags go from 0 to %d", op, tag, PG_MAX_TAG);
    mpi_count(n);
}

typedef struct {
    const char *op, *what;  // "receiving" / "sending", and the caller's name for the message
    size_t n;
    int peer, tag;
} P2pInfo;

static void p2p_fail(ProcessGroup *pg, const P2pInfo *m, double waited, const char *extra) __attribute__((noreturn));
static void p2p_fail(ProcessGroup *pg, const P2pInfo *m, double waited, const char *extra) {
    char msg[1024];
    snprintf(msg, sizeof msg,
             "%s %s (%zu floats, tag %d) %s rank %d: not done after %.1f s (limit %.0f s)%s\n"
             "  HINT: rank %d never %s it: check that both ranks' schedules post this message (same tag, same size, "
             "same order); if rank %d itself stopped, its own output says why",
             m->op, m->what ? m->what : "a message", m->n, m->tag, m->op[0] == 'r' ? "from" : "to", m->peer, waited,
             pg->timeout_s, extra, m->peer, m->op[0] == 'r' ? "sent" : "received", m->peer);
    pg_abort(pg, msg);
}

// Polls done() until true, or stops the job when the group's timeout passes.
static void p2p_wait(ProcessGroup *pg, PollFn done, void *ctx, const P2pInfo *m) {
    const double start = time_now();
    for (;;) {
        if (done(pg, ctx)) return;
        double waited = time_now() - start;
        if (waited > pg->timeout_s) {
            char extra[160] = "";
            int flag = 0;
            MPI_Status st;
            // A message from the same peer under another tag is the usual cause: a swapped or skipped micro-batch.
            if (m->op[0] == 'r' && pg->backend == PG_BACKEND_MPI &&
                MPI_Iprobe(m->peer, MPI_ANY_TAG, pg->comm, &flag, &st) == MPI_SUCCESS && flag)
                snprintf(extra, sizeof extra, "; a message with tag %d from rank %d is waiting instead", st.MPI_TAG,
                         m->peer);
            p2p_fail(pg, m, waited, extra);
        }
        poll_pause(waited);
    }
}
static void p2p_free(PgSend *s) {
    trace_async_end(s->trace_id);
    host_free_pinned(s->host);
#ifdef KIT_NCCL
    if (s->posted) CUDA_CHECK(cudaEventDestroy(s->done));
#endif
    free(s);
}

#ifdef KIT_NCCL
// NCCL matches sends and receives by order, and a send blocks NCCL's stream until the peer's receive runs:
// two neighbours that each send before they receive (1F1B does) would wait for each other forever. So a send is
// only queued by pg_send_start, and posted together with the next receive (or at its pg_send_wait) in one NCCL
// group, in which NCCL progresses them together.
static void nccl_post(ProcessGroup *pg, float *recv_buf, size_t recv_n, int recv_peer, const P2pInfo *m) {
    nccl_after_compute(pg);
    NCCL_CHECK(ncclGroupStart());
    for (PgSend *s = pg->pending; s; s = s->next_pending) {
        ncclResult_t r = ncclSend(s->buf, s->n, ncclFloat, s->peer, pg->nccl, pg->stream);
        if (r != ncclInProgress) NCCL_CHECK(r);
    }
    if (recv_buf) {
        ncclResult_t r = ncclRecv(recv_buf, recv_n, ncclFloat, recv_peer, pg->nccl, pg->stream);
        if (r != ncclInProgress) NCCL_CHECK(r);
    }
    ncclResult_t r = ncclGroupEnd();
    p2p_wait(pg, nccl_settled, &r, m);
    NCCL_CHECK(r);
    for (PgSend *s = pg->pending; s; s = s->next_pending) {
        CUDA_CHECK(cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventRecord(s->done, pg->stream));
        s->posted = true;
    }
    pg->pending = NULL;
}
#endif

PgSend *pg_send_start(ProcessGroup *pg, const float *buf, size_t n, int peer, int tag) {
    p2p_check_args(pg, n, peer, tag, "pg_send_start");
    pg->traffic.p2p_bytes_sent += n * sizeof(float);
    pg->traffic.p2p_msgs++;
    PgSend *s = xcalloc(1, sizeof *s);
    s->n = n;
    s->peer = peer;
    s->tag = tag;
    if (kit_trace_flags) {  // the caller's name (trace_name_next), else the peer and the tag
        char name[TRACE_NAME_MAX];
        snprintf(name, sizeof name, "send to rank %d (tag %d)", peer, tag);
        s->trace_id = trace_async_begin_named(TRACE_COMM, name);
    }
#ifdef KIT_NCCL
    if (pg->backend == PG_BACKEND_NCCL) {  // queued in start order: NCCL matches by order
        s->buf = buf;
        PgSend **tail = &pg->pending;
        while (*tail) tail = &(*tail)->next_pending;
        *tail = s;
        return s;
    }
#endif
    const float *data = buf;
    if (staged(pg)) {
        s->host = host_alloc_pinned(n * sizeof(float));
        device_copy_from(pg->dev, s->host, buf, n * sizeof(float));
        data = s->host;
    }
    MPI_CHECK(MPI_Isend(data, mpi_count(n), MPI_FLOAT, peer, tag, pg->comm, &s->req));
    return s;
}

static void send_wait(ProcessGroup *pg, PgSend *s, const char *what);
void pg_send_wait(ProcessGroup *pg, PgSend *s, const char *what) {
    double t = trace_begin("send wait");
    send_wait(pg, s, what);
    trace_endf(t, TRACE_WAIT, "wait: send %s", what ? what : "a message");
}

static void send_wait(ProcessGroup *pg, PgSend *s, const char *what) {
    CHECK(s != NULL, "pg_send_wait needs the PgSend that pg_send_start returned");
    P2pInfo m = {"sending", what, s->n, s->peer, s->tag};
#ifdef KIT_NCCL
    if (pg->backend == PG_BACKEND_NCCL) {
        if (!s->posted) nccl_post(pg, NULL, 0, 0, &m);
        EventWait w = {s->done, what, s->n};
        p2p_wait(pg, nccl_event_done, &w, &m);
        p2p_free(s);
        return;
    }
#endif
    p2p_wait(pg, mpi_done, &s->req, &m);
    p2p_free(s);
}

void pg_send(ProcessGroup *pg, const float *buf, size_t n, int peer, int tag, const char *what) {
    pg_send_wait(pg, pg_send_start(pg, buf, n, peer, tag), what);
}

typedef struct {
    int peer, tag;
    MPI_Status st;
} Probe;

static bool probe_arrived(ProcessGroup *pg, void *ctx) {
    Probe *p = ctx;
    int flag = 0;
    MPI_CHECK(MPI_Iprobe(p->peer, p->tag, pg->comm, &flag, &p->st));
    return flag != 0;
}

static void p2p_recv(ProcessGroup *pg, float *buf, size_t n, int peer, int tag, const char *what);
void pg_recv(ProcessGroup *pg, float *buf, size_t n, int peer, int tag, const char *what) {
    double t = trace_begin("recv");
    p2p_recv(pg, buf, n, peer, tag, what);
    trace_endf(t, TRACE_WAIT, "recv %s", what ? what : "a message");
}

static void p2p_recv(ProcessGroup *pg, float *buf, size_t n, int peer, int tag, const char *what) {
    p2p_check_args(pg, n, peer, tag, "pg_recv");
    pg->traffic.p2p_bytes_recv += n * sizeof(float);
    P2pInfo m = {"receiving", what, n, peer, tag};
#ifdef KIT_NCCL
    if (pg->backend == PG_BACKEND_NCCL) {  // no tags, no lengths: the order and the sizes must agree
        nccl_post(pg, buf, n, peer, &m);
        CUDA_CHECK(cudaEventRecord(pg->blocking_done, pg->stream));
        EventWait w = {pg->blocking_done, what, n};
        p2p_wait(pg, nccl_event_done, &w, &m);
        return;
    }
#endif
    // Probe first: the message's length is checked before it lands, so a wrong size is an error that says so
    // (an MPI_Recv would stop at MPI_ERR_TRUNCATE, or take a shorter message silently).
    Probe probe = {peer, tag, {0}};
    p2p_wait(pg, probe_arrived, &probe, &m);
    int count = 0;
    MPI_CHECK(MPI_Get_count(&probe.st, MPI_FLOAT, &count));
    if (count < 0 || (size_t)count != n) {
        char msg[768];
        snprintf(msg, sizeof msg,
                 "receiving %s (tag %d) from rank %d: the message holds %d floats, this rank expects %zu\n"
                 "  HINT: both ranks must agree on every message's size: the micro-batch's samples and the "
                 "activation's shape at the cut", what ? what : "a message", tag, peer, count, n);
        pg_abort(pg, msg);
    }
    float *data = staged(pg) ? stage_reserve(&pg->stage, &pg->stage_cap, n * sizeof(float)) : buf;
    MPI_CHECK(MPI_Recv(data, count, MPI_FLOAT, peer, tag, pg->comm, MPI_STATUS_IGNORE));  // arrived: returns now
    if (staged(pg)) device_copy_to(pg->dev, buf, data, n * sizeof(float));
}

// ---------------------------------------------------------------- sub-groups

ProcessGroup *pg_split(ProcessGroup *pg, int color, int key) {
    CHECKF(pg->backend != PG_BACKEND_SOCKET, "sub-groups need mpirun (the MPI or NCCL backend)",
           "pg_split on the socket backend");
    CHECKF(color >= 0, "every rank passes a color >= 0 (the ranks with the same color form one group)",
           "pg_split with color %d", color);
    // MPI_Comm_split blocks until every rank arrives: a barrier with the deadline first, so a missing rank is
    // named instead of hanging the split.
    pg_barrier(pg);
    ProcessGroup *g = xcalloc(1, sizeof *g);
    g->is_sub = true;
    g->dev = pg->dev;
    g->backend = pg->backend;
    g->timeout_s = pg->timeout_s;
    g->local_rank = pg->local_rank;    // the GPU was chosen by the node-local rank in pg_init: it stays
    g->local_world = pg->local_world;
    MPI_CHECK(MPI_Comm_split(pg->comm, color, key, &g->comm));
    comm_adopt(g);
#ifdef KIT_NCCL
    if (g->backend == PG_BACKEND_NCCL) {
        // The group's own communicator, made as the world's was: a fresh ncclUniqueId from the group's rank 0,
        // broadcast over the group's MPI communicator. Not ncclCommSplit: on a non-blocking parent (NCCL 2.28.3,
        // an H200) it settled without filling in the new handle, whose first all-reduce then failed with "comm
        // argument is NULL"; NCCL fills it only as the parent's own operation completes (NVIDIA/nccl#1472).
        nccl_init(g);
    }
#endif
    return g;
}

// ---------------------------------------------------------------- checks across ranks

// Every rank's hash of buf, gathered on every rank: (world).
static uint32_t *gather_hashes(ProcessGroup *pg, const float *buf, size_t n) {
    uint32_t mine = pg_hash_floats(pg->dev, buf, n);
    uint32_t *all = xcalloc((size_t)pg->world, sizeof *all);
    if (pg->sock) {
        sockgroup_allgather(pg->sock, &mine, all, sizeof mine);
        return all;
    }
    MPI_Request req;
    MPI_CHECK(MPI_Iallgather(&mine, 1, MPI_UINT32_T, all, 1, MPI_UINT32_T, pg->comm, &req));
    mpi_wait(pg, &req, "all-gather of buffer hashes", 1, "ints");
    return all;
}

static bool all_equal(const uint32_t *h, int n) {
    for (int i = 1; i < n; i++)
        if (h[i] != h[0]) return false;
    return true;
}

bool pg_identical(ProcessGroup *pg, const float *buf, size_t n) {
    uint32_t *all = gather_hashes(pg, buf, n);
    bool same = all_equal(all, pg->world);
    free(all);
    return same;
}

void pg_check_identical(ProcessGroup *pg, const float *buf, size_t n, const char *what) {
    uint32_t *all = gather_hashes(pg, buf, n);
    if (all_equal(all, pg->world)) {
        free(all);
        return;
    }
    if (pg->rank == 0) {
        fflush(stdout);
        fprintf(stderr, "error: %s (%zu floats) differ across ranks; CRC-32 per rank:", what, n);
        for (int r = 0; r < pg->world; r++) fprintf(stderr, " %d:%08x", r, (unsigned)all[r]);
        fprintf(stderr, "\n  HINT: the replicas must start equal (same seed, or a broadcast from rank 0) and "
                        "apply the same averaged gradients; a rank that skipped an all-reduce drifts\n");
        fflush(stderr);
    }
    free(all);
    // The others wait until rank 0 has printed, so the abort cannot cut its message.
    pg_barrier(pg);
    pg_abort(pg, NULL);
}

// ---------------------------------------------------------------- the timeline's clock (--trace)
//
// Each rank's CLOCK_MONOTONIC against rank 0's, by ping-pong (NTP's and Cristian's estimate): rank r notes t1,
// sends it to rank 0, which answers with its clock t0 on arrival; back on rank r at t2, rank 0's clock read
// somewhere in [t1, t2] of rank r's, so offset = t0 - (t1 + t2) / 2 is off by at most half the round trip
// (t2 - t1) / 2. The exchange with the shortest round trip is kept: the one least delayed by a busy core or a
// rank that was late to the first message. At least CLOCK_MIN_ROUNDS, then more (up to CLOCK_MAX_ROUNDS) until
// one round trip took under CLOCK_GOOD_US: on a machine with more runnable processes than cores a round trip
// waits for the scheduler (milliseconds), and a few more tries usually find a quick one. Rank r ends the
// exchange by sending -1 instead of a time. Ranks on one node share the clock: their offsets measure this
// method's error, not a real difference.
enum { CLOCK_MIN_ROUNDS = 10, CLOCK_MAX_ROUNDS = 200 };
#define CLOCK_GOOD_US 100.0

static void clock_msg(ProcessGroup *pg, double *v, int peer, bool send) {
    MPI_Request req;
    if (send) MPI_CHECK(MPI_Isend(v, 1, MPI_DOUBLE, peer, PG_MAX_TAG, pg->comm, &req));
    else MPI_CHECK(MPI_Irecv(v, 1, MPI_DOUBLE, peer, PG_MAX_TAG, pg->comm, &req));
    P2pInfo m = {send ? "sending" : "receiving", "a clock ping (--trace)", 1, peer, PG_MAX_TAG};
    p2p_wait(pg, mpi_done, &req, &m);
}

// Rank 0's side with rank r: answers every ping with its clock until r says it is done.
static void clock_serve(ProcessGroup *pg, int r) {
    for (;;) {
        double ping = 0.0;
        clock_msg(pg, &ping, r, false);
        if (ping < 0) return;
        double t0 = trace_clock_us();
        clock_msg(pg, &t0, r, true);
    }
}

// Rank r's side: the offset of the quickest exchange; *error_us: half its round trip.
static void clock_ask(ProcessGroup *pg, double *offset_us, double *error_us) {
    double best = -1.0;
    for (int k = 0; k < CLOCK_MAX_ROUNDS && !(k >= CLOCK_MIN_ROUNDS && best < CLOCK_GOOD_US); k++) {
        double t1 = trace_clock_us(), t0 = 0.0;
        clock_msg(pg, &t1, 0, true);
        clock_msg(pg, &t0, 0, false);
        double t2 = trace_clock_us();
        if (best < 0 || t2 - t1 < best) {
            best = t2 - t1;
            *offset_us = t0 - (t1 + t2) / 2;
        }
    }
    double done = -1.0;
    clock_msg(pg, &done, 0, true);
    *error_us = best / 2;
}

static void clock_offset(ProcessGroup *pg, double *offset_us, double *error_us) {
    *offset_us = 0.0;
    *error_us = 0.0;  // rank 0 against itself
    if (pg->rank != 0) clock_ask(pg, offset_us, error_us);
    else
        for (int r = 1; r < pg->world; r++) clock_serve(pg, r);
}

void pg_trace_open(ProcessGroup *pg, const char *path) {
    if (!path) return;
    double offset = 0.0, error = -1.0;  // the socket backend has no point-to-point messages: not measured there
    if (!pg->sock) clock_offset(pg, &offset, &error);
    else if (pg->rank == 0) error = 0.0;
    // The worst error of all ranks, for rank 0's line (a host all-reduce of one double, before tracing starts).
    double worst[1] = {error};
    if (!pg->sock) {
        MPI_Request req;
        MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, worst, 1, MPI_DOUBLE, MPI_MAX, pg->comm, &req));
        mpi_wait(pg, &req, "all-reduce of the clock error (--trace)", 1, "doubles");
    }
    trace_open(path, pg->rank, pg->world);
    trace_set_clock(offset, error);
    trace_thread_name("main");
    if (pg->rank == 0) {
        if (pg->sock) printf("trace: %s.rankR.json, merged into %s at the end (clocks not aligned: socket backend)\n",
                             path, path);
        else printf("trace: %s.rankR.json, merged into %s at the end (clocks aligned to rank 0 within %.1f us)\n",
                    path, path, worst[0]);
    }
}

void pg_trace_close(ProcessGroup *pg, const char *path) {
    if (!path) return;
    trace_close();
    pg_barrier(pg);  // every rank's file is complete
    if (pg->rank != 0) return;
    long n = trace_merge(path, pg->world);
    if (n >= 0) printf("trace: %s (%ld events, %d rank%s): open it at https://ui.perfetto.dev\n", path, n, pg->world,
                       pg->world == 1 ? "" : "s");
}

#endif  // KIT_MPI

// ---------------------------------------------------------------- shared by both builds

void pg_allreduce_sum(ProcessGroup *pg, float *buf, size_t n) { pg_allreduce(pg, buf, n, PG_SUM); }
void pg_allreduce_avg(ProcessGroup *pg, float *buf, size_t n) { pg_allreduce(pg, buf, n, PG_AVG); }

