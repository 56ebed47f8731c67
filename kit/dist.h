// kit/dist.h: the process group (lessons 03-05): one process per rank, collectives over MPI or NCCL,
// and gradient buckets for overlapping the all-reduce with backward.
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
//   auto  nccl when the device is CUDA, NCCL is built in and every rank has its own GPU; mpi otherwise.
//
// Buffers given to a collective live on the pg's device, except where a name says "host".
//
// Timeouts: every wait polls with a deadline (pg's timeout_s). When a peer rank dies or stalls, the
// others print one line (rank, collective and its number, size, seconds waited, and WHICH ranks did not
// join it) and abort the job with a non-zero exit status, instead of hanging. The environment variable KIT_PG_TIMEOUT (seconds) overrides the
// value given to pg_init.
//
// This header does not include <mpi.h>: only kit/dist.c needs MPI's flags, and a program that does
// not call pg_* does not link MPI at all.
#ifndef KIT_DIST_H
#define KIT_DIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "device.h"
#include "model.h"
#include "ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { PG_BACKEND_MPI = 0, PG_BACKEND_NCCL = 1 } PgBackend;
typedef enum { PG_SUM = 0, PG_AVG = 1 } PgOp;

typedef struct ProcessGroup ProcessGroup;

// A collective in flight (from pg_iallreduce); pg_wait completes it. At most PG_MAX_INFLIGHT at once.
typedef struct {
    int slot;
} PgRequest;
#define PG_MAX_INFLIGHT 64

// 25 s: a stalled job ends within 30 s (the timeout, a 1.5 s grace to hear which ranks arrived, the abort);
// kit/dist.c explains the cost (false timeouts when one rank legitimately works longer than that alone).
#define PG_DEFAULT_TIMEOUT_S 25.0

// ---------------------------------------------------------------- setup
// Initialises MPI (reading mpirun's / srun's environment), finds rank, world size and local rank
// (rank among the processes on this node), picks the GPU `local_rank % gpus` when dev is CUDA, and
// sets up the backend ("auto", "mpi" or "nccl"; NULL means "auto"). timeout_s <= 0 means the default.
// Rank 0 prints one line saying which backend runs and why. Errors (unknown backend, NCCL refused,
// MPI failure) are a clear message and exit status 1.
ProcessGroup *pg_init(int *argc, char ***argv, const char *backend, Device dev, double timeout_s);
// Waits for every rank (with the timeout), releases the backend and calls MPI_Finalize.
void pg_finalize(ProcessGroup *pg);

int pg_rank(const ProcessGroup *pg);
int pg_world(const ProcessGroup *pg);
int pg_local_rank(const ProcessGroup *pg);
int pg_local_world(const ProcessGroup *pg);  // processes on this node
Device pg_device(const ProcessGroup *pg);
PgBackend pg_backend(const ProcessGroup *pg);
const char *pg_backend_name(PgBackend b);    // "mpi" or "nccl"
double pg_timeout(const ProcessGroup *pg);

// Prints `msg` (when not NULL) prefixed with "rank R: " and aborts every rank (MPI_Abort): for errors
// found on one rank that must stop the whole job.
void pg_abort(ProcessGroup *pg, const char *msg) __attribute__((noreturn));

// ---------------------------------------------------------------- collectives (blocking, with timeout)
// Every rank must call the same collectives in the same order with the same sizes.
void pg_allreduce_sum(ProcessGroup *pg, float *buf, size_t n);  // (n) in place: sum over ranks
void pg_allreduce_avg(ProcessGroup *pg, float *buf, size_t n);  // (n) in place: mean over ranks
void pg_allreduce(ProcessGroup *pg, float *buf, size_t n, PgOp op);
// Host doubles, whatever the backend (always over MPI): SyncBN statistics (lesson 05) and metrics.
void pg_allreduce_sum_double_host(ProcessGroup *pg, double *host_buf, int n);
// (n) on root -> (n) on every rank.
void pg_broadcast(ProcessGroup *pg, float *buf, size_t n, int root);
// send (n) from each rank -> recv (world, n), rank r's block at recv + r * n. send may not alias recv.
void pg_allgather(ProcessGroup *pg, const float *send, float *recv, size_t n);
void pg_barrier(ProcessGroup *pg);

// ---------------------------------------------------------------- non-blocking (for buckets)
// Starts an in-place all-reduce and returns at once. The buffer must not be touched until pg_wait.
// Every rank must start the same requests in the same order.
PgRequest pg_iallreduce(ProcessGroup *pg, float *buf, size_t n, PgOp op);
PgRequest pg_iallreduce_sum(ProcessGroup *pg, float *buf, size_t n);
// Completes the request (with the timeout). For PG_AVG the division by the world size happens here
// on the MPI backend (NCCL divides itself).
void pg_wait(ProcessGroup *pg, PgRequest req);

// ---------------------------------------------------------------- checks across ranks
// CRC-32 (zlib) of the bytes of (n) floats on device d: equal hashes mean bit-identical buffers
// (+0.0 and -0.0 differ; so do NaN payloads). Needs no process group.
uint32_t pg_hash_floats(Device d, const float *buf, size_t n);
// True when buf (n) hashes the same on every rank. Collective: every rank gets the same answer.
bool pg_identical(ProcessGroup *pg, const float *buf, size_t n);
// Like pg_identical, but when they differ rank 0 prints every rank's hash under the name `what`
// ("parameters after step 12") and the job stops with a non-zero exit status.
void pg_check_identical(ProcessGroup *pg, const float *buf, size_t n, const char *what);

// The SyncBN hook for BatchNormSync (ops.h): ctx is the ProcessGroup.
void pg_bn_allreduce_sum(double *host_buf, int count, void *ctx);
BatchNormSync pg_batchnorm_sync(ProcessGroup *pg);

// ---------------------------------------------------------------- backend choice (pure)
// Decides the backend from what was asked and what this node has; no MPI or CUDA calls, so it is
// testable anywhere. ranks_per_gpu: the most ranks of this node that share one physical GPU
// (0 when there is no usable GPU). Returns false when the request cannot be met, with the reason in
// why (naming `--backend mpi` when NCCL is refused); on success why says why (for auto).
bool pg_choose_backend(const char *requested, Device dev, bool nccl_built, int ranks_per_gpu,
                       PgBackend *out, char *why, size_t why_len);
// The most times one string occurs among n fixed-width strings (ids + i * stride): ranks per GPU
// from the gathered PCI bus ids.
int pg_max_duplicates(const char *ids, int n, size_t stride);
// The stalled-rank report (kit/dist.c): seen[r] is the number of the collective rank r last said it was waiting
// in (a rank says so after waiting a moment), seq the collective this rank `me` timed out in. Writes which
// ranks never joined it ("rank 2 did not join it ...") and which waited in a later one.
void pg_describe_absent(const long long *seen, int world, int me, long long seq, char *out, size_t len);

// ---------------------------------------------------------------- gradient buckets
// Splits a flat gradient buffer into buckets of about bucket_bytes (25 MB by default, as PyTorch DDP),
// each a contiguous range made of whole TensorViews, formed in REVERSE order of offset: backward
// produces the last layers' gradients first, so bucket 0 (the end of the buffer) is ready first and
// its all-reduce overlaps with the rest of backward. A view larger than bucket_bytes gets a bucket
// of its own.
#define PG_DEFAULT_BUCKET_BYTES ((size_t)25 << 20)

typedef struct {
    size_t offset, count;  // floats, in the flat buffer
    int n_views;           // whole views in it
} GradBucket;

// The plan alone (pure): fills buckets (room for n_views entries) and view_bucket (n_views: the bucket
// each view is in), returns the number of buckets. Views may come in any order but must not overlap
// and together must cover [0, total) with no gap (a clear error otherwise).
int buckets_plan(const TensorView *views, int n_views, size_t total, size_t bucket_bytes,
                 GradBucket *buckets, int *view_bucket);

typedef struct GradBuckets GradBuckets;

// grads (total) on the pg's device; views say how it is cut (Model.views, Model.n_params).
// bucket_bytes 0 = PG_DEFAULT_BUCKET_BYTES.
GradBuckets *buckets_create(ProcessGroup *pg, float *grads, const TensorView *views, int n_views,
                            size_t total, size_t bucket_bytes);
void buckets_free(GradBuckets *gb);
int buckets_count(const GradBuckets *gb);
const GradBucket *buckets_get(const GradBuckets *gb, int i);

// Starts a step: forgets which views were ready.
void buckets_begin(GradBuckets *gb);
// The gradients in grads[offset, offset + count) are final for this step: a whole view or several
// adjacent whole views (a clear error otherwise, or when one is marked twice in a step). When this
// completes a bucket, its all-reduce starts at once; buckets start strictly in bucket order (a bucket
// that is ready early waits for the ones before it), so every rank issues the same collectives in
// the same order whatever order backward marks them in.
void buckets_mark_ready(GradBuckets *gb, size_t offset, size_t count);
// Buckets started in this step and not yet finished (all of them after a full backward).
int buckets_in_flight(const GradBuckets *gb);
// Starts whatever was not marked, waits for every bucket and leaves grads averaged over the ranks.
void buckets_finish(GradBuckets *gb);
// The hook for Model's backward: ctx is the GradBuckets. Same as buckets_mark_ready.
void buckets_on_grads_ready(void *ctx, size_t offset, size_t count);

#ifdef __cplusplus
}
#endif

#endif // KIT_DIST_H
