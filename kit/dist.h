// kit/dist.h: the process group (lesson 03 on): one process per rank, collectives over MPI or NCCL.
// Gradient buckets, which overlap the all-reduce with backward, are in kit/buckets.h; the backend table and
// the other decisions that need no MPI in kit/dist_plan.h (included here); the non-blocking all-reduce that only
// the kit and its tests use in kit/dist_internal.h (the reduce-scatter in flight, below, shares its slots).
//
//   ProcessGroup *pg = pg_init(&argc, &argv, "auto", dev, 60.0);   // MPI_Init, rank, GPU by local rank
//   pg_allreduce_avg(pg, m->grads, m->n_params);                   // one call over the flat buffer
//   pg_finalize(pg);
//
// Backends:
//   mpi   host buffers. With a CUDA device the collective stages through a host copy (slow but works
//         anywhere, including several ranks sharing one GPU). CPU runs always use it.
//   nccl  device buffers, one rank per GPU. Several ranks on one GPU are refused with a message naming
//         `--backend mpi` (NCCL would deadlock or fail on them).
//   socket host buffers over TCP, for jobs started from a rendezvous store without mpirun (pg_init_socket,
//         lesson 07); under mpirun it is refused, as mpi is from a store.
//   auto  nccl when the device is CUDA, NCCL is built in and every rank has its own GPU; otherwise mpi under
//         mpirun, socket from a store.
// kit/dist_plan.c holds the table of these names (pg_backend_choices) and the choice (pg_choose_backend).
//
// Buffers given to a collective live on the pg's device, except where a name says "host".
//
// Timeouts: every wait polls with a deadline (pg's timeout_s). When a peer rank dies or stalls, the
// others print one line (rank, collective and its number, size, seconds waited, and WHICH ranks did not
// join it) and abort the job with a non-zero exit status, instead of hanging. The environment variable
// KIT_PG_TIMEOUT (seconds) overrides the value given to pg_init.
//
// This header does not include <mpi.h>: only kit/dist.c needs MPI's flags, and a program that does
// not call pg_* does not link MPI at all.
#ifndef KIT_DIST_H
#define KIT_DIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kit/device.h"
#include "kit/dist_plan.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ProcessGroup ProcessGroup;

// 25 s: a stalled job ends within 30 s (the timeout, a 1.5 s grace to hear which ranks arrived, the abort);
// kit/dist.c explains the cost (false timeouts when one rank legitimately works longer than that alone).
#define PG_DEFAULT_TIMEOUT_S 25  // seconds; a bare integer so that kit/cli.c can also spell it as text

// ---------------------------------------------------------------- setup
// Initialises MPI (reading mpirun's / srun's environment), finds rank, world size and local rank
// (rank among the processes on this node), picks the GPU `local_rank % gpus` when dev is CUDA, and
// sets up the backend ("auto", "mpi" or "nccl"; NULL means "auto"). timeout_s <= 0 means the default.
// Rank 0 prints one line saying which backend runs and why. Errors (unknown backend, NCCL refused,
// MPI failure) are a clear message and exit status 1.
ProcessGroup *pg_init(int *argc, char ***argv, const char *backend, Device dev, double timeout_s);
// The start WITHOUT mpirun (lesson 07, torchrun-style): the ranks found each other through a rendezvous store
// (kit/store.h), which told every rank where rank 0's process group listens. Runs the socket backend
// (kit/dist_socket.c: why not MPI, and what it costs). On CUDA, as pg_init does: the GPU by local rank, and
// NCCL (from the unique id rank 0 made with pg_nccl_unique_id and the store carried) when every rank has a
// GPU of its own; the sockets then carry only the host-side collectives. backend: "auto", "socket" (host
// staging even on GPUs) or "nccl" (CUDA only); "mpi" needs mpirun: a clear error.
#define PG_NCCL_ID_BYTES 128
typedef struct {
    int rank, world, local_rank, local_world;
    char root_addr[64];  // "HOST:PORT" where rank 0 listens for the other ranks
    int listen_fd;       // rank 0: that listener, bound before its address was published; others: -1
    const char *node;    // this rank's node name (ranks with the same name share a node)
    const void *nccl_id; // (PG_NCCL_ID_BYTES) rank 0's NCCL unique id on every rank, or NULL (CPU, no NCCL)
} PgPeers;
ProcessGroup *pg_init_socket(const PgPeers *peers, const char *backend, Device dev, double timeout_s);
// Rank 0 of a store-started job on GPUs: writes a new NCCL unique id (PG_NCCL_ID_BYTES) to out. False (and
// zeros) when the kit was built without NCCL.
bool pg_nccl_unique_id(void *out);

// Waits for every rank (with the timeout), releases the backend and calls MPI_Finalize (not for the socket backend).
void pg_finalize(ProcessGroup *pg);

int pg_rank(const ProcessGroup *pg);
int pg_world(const ProcessGroup *pg);
int pg_local_rank(const ProcessGroup *pg);
int pg_local_world(const ProcessGroup *pg);  // processes on this node
Device pg_device(const ProcessGroup *pg);
PgBackend pg_backend(const ProcessGroup *pg);
double pg_timeout(const ProcessGroup *pg);

// Prints `msg` (when not NULL) prefixed with "rank R: " and aborts every rank (MPI_Abort): for errors
// found on one rank that must stop the whole job.
void pg_abort(ProcessGroup *pg, const char *msg) __attribute__((noreturn));

// ---------------------------------------------------------------- collectives (blocking, with timeout)
// Every rank must call the same collectives in the same order with the same sizes, blocking or not alike (as in
// MPI: on MPI a blocking all-reduce above 4 MB goes as 4 MB pieces one after another, which another rank's
// pg_iallreduce of the same buffer would not match). The pieces give the same sums, about twice as fast at 64 MB
// (kit/README.md).
void pg_allreduce_sum(ProcessGroup *pg, float *buf, size_t n);  // (n) in place: sum over ranks
void pg_allreduce_avg(ProcessGroup *pg, float *buf, size_t n);  // (n) in place: mean over ranks
// Host doubles, whatever the backend (always over MPI): SyncBN statistics (lesson 05) and metrics.
void pg_allreduce_sum_double_host(ProcessGroup *pg, double *host_buf, int n);
// (n) on root -> (n) on every rank.
void pg_broadcast(ProcessGroup *pg, float *buf, size_t n, int root);
// send (n) from each rank -> recv (world, n), rank r's block at recv + r * n. send may not alias recv.
void pg_allgather(ProcessGroup *pg, const float *send, float *recv, size_t n);
void pg_barrier(ProcessGroup *pg);
// send (world, n) on every rank -> recv (n) on rank r: the sum over ranks of every rank's block r (the first
// half of a ring all-reduce; lesson 09's sharded gradients). An uneven length is the caller's to pad into
// equal blocks: NCCL and MPI's block variant take equal blocks only. send may not alias recv.
void pg_reduce_scatter_sum(ProcessGroup *pg, const float *send, float *recv, size_t n);

// ---------------------------------------------------------------- a collective in flight (lesson 09's overlap)
// The reduce-scatter above, started now and finished later, so that the caller computes meanwhile (lesson 09
// starts a unit's gradient reduce-scatter after its backward and waits for it after the previous unit's). The
// same machinery as the gradient buckets' all-reduces (kit/buckets.h) and the same sums, bit for bit, as the
// blocking call (which is this start and its wait); counted in pg_traffic the same way, when it starts. Until
// pg_work_wait, send must stay allocated and unchanged and recv must not be read. At most 64 collectives in
// flight at once (PG_MAX_INFLIGHT, kit/dist_internal.h); every rank starts the same ones in the same order, as for blocking calls.
//   mpi     MPI_Ireduce_scatter_block; Open MPI moves it only inside MPI calls: pg_progress (and every other wait
//           of the group) lets it move. On a CUDA device the input is staged on the host at the start.
//   nccl    on the communicator's own stream, after the compute queued so far; an event marks its end.
//   socket  refused, as the blocking call is (the star sums around rank 0 only).
typedef struct PgWork PgWork;
PgWork *pg_reduce_scatter_sum_start(ProcessGroup *pg, const float *send, float *recv, size_t n);
// Waits until w is done (with the timeout; `what` names it in the error, e.g. "reduce-scatter of unit 3's
// gradient") and ends it: w is invalid afterwards. A work that has finished already returns at once.
void pg_work_wait(ProcessGroup *pg, PgWork *w, const char *what);
// Lets the collectives in flight move (MPI progresses them only inside MPI calls); returns at once. Call it
// now and then while computing (a Model's on_grads_ready hook runs after each layer's backward). NCCL and the
// socket backend need nothing: a no-op there.
void pg_progress(ProcessGroup *pg);

// ---------------------------------------------------------------- point to point (lesson 08's pipeline)
// Messages between two ranks, matched by (peer, tag) on the MPI backend and by order on NCCL (which has no tags:
// every pair of ranks must post its sends and receives in the same order). Each wait runs under the timeout and
// names this rank, the peer, the tag and `what` ("activation of micro-batch 3, stage 0 -> 1") when it fails.
typedef struct PgSend PgSend;  // a send in flight
// Starts sending n floats (on the group's device) to rank `peer` with tag (0 <= tag <= 32767). buf must stay
// unchanged until pg_send_wait: the send may still be reading it.
PgSend *pg_send_start(ProcessGroup *pg, const float *buf, size_t n, int peer, int tag);
// Waits until the send is done (the peer took it, or MPI buffered it) and frees s.
void pg_send_wait(ProcessGroup *pg, PgSend *s, const char *what);
// pg_send_start + pg_send_wait.
void pg_send(ProcessGroup *pg, const float *buf, size_t n, int peer, int tag, const char *what);
// Receives exactly n floats from `peer` with `tag` into buf. A message of another length, or none within the
// timeout, ends the job with an error (and names a message with another tag from that peer, if one waits).
void pg_recv(ProcessGroup *pg, float *buf, size_t n, int peer, int tag, const char *what);

// ---------------------------------------------------------------- sub-groups
// The ranks that pass the same color (>= 0) as a group of their own, ranked by key then by rank in pg
// (MPI_Comm_split's rule); same backend, device and timeout. Collective over pg: every rank calls it.
// pg_finalize frees a sub-group (only the world group ends MPI); free sub-groups before their parent.
ProcessGroup *pg_split(ProcessGroup *pg, int color, int key);

// ---------------------------------------------------------------- traffic counters
// What this group's calls handed to the backend, since pg_init / pg_split, on this rank: the payload the caller
// asked to move, counted as each call starts. Point to point: bytes and messages given to pg_send_start, bytes
// taken by pg_recv (the same on the wire: one copy, peer to peer). Collectives (all-reduce, its host-double form,
// broadcast, all-gather, reduce-scatter): the caller's input buffer in bytes (an all-reduce of n floats: 4 n, on
// every rank, root or not), and one call each. NOT counted: what the algorithm moves inside MPI or NCCL to do it
// (a ring all-reduce puts 2 (w-1)/w of its input on each rank's wire; a tree, another multiple), host staging
// copies, barriers, and the kit's own bookkeeping (arrival notes, pg_identical's hashes, pg_split). A sub-group
// counts its own calls, not its parent's. Take two snapshots and subtract for a step's traffic.
typedef struct {
    uint64_t p2p_bytes_sent, p2p_msgs;  // pg_send_start: floats x 4, and one per message
    uint64_t p2p_bytes_recv;            // pg_recv: floats x 4
    uint64_t coll_bytes_in, coll_calls; // collectives: the input buffer's bytes, and one per call
} PgTraffic;
PgTraffic pg_traffic(const ProcessGroup *pg);

// ---------------------------------------------------------------- the timeline (--trace FILE, kit/trace.h)
// Collective: every rank calls it. Measures this rank's clock offset against rank 0 (ping-pong, the shortest of
// 10 to 200 round trips; the error left is half of it, written in the file) and starts kit/trace.h's tracer into
// FILE.rankR.json. Nothing when path is NULL. Every collective and message of the group is then on the timeline:
// blocking calls as spans on the caller's track, non-blocking ones (buckets, reduce-scatters in flight, sends)
// as async spans from start to completion, and the waits for them (pg_work_wait, barriers, receives).
void pg_trace_open(ProcessGroup *pg, const char *path);
// Collective: ends every rank's file and, after a barrier, merges them into FILE on rank 0 (the ranks' files stay:
// on several nodes FILE.rankR.json must be on a folder every node shares, or rank 0 says which is missing).
void pg_trace_close(ProcessGroup *pg, const char *path);

// ---------------------------------------------------------------- checks across ranks
// True when buf (n) hashes the same on every rank. Collective: every rank gets the same answer.
bool pg_identical(ProcessGroup *pg, const float *buf, size_t n);
// Like pg_identical, but when they differ rank 0 prints every rank's hash under the name `what`
// ("parameters after step 12") and the job stops with a non-zero exit status.
void pg_check_identical(ProcessGroup *pg, const float *buf, size_t n, const char *what);

#ifdef __cplusplus
}
#endif

#endif // KIT_DIST_H
