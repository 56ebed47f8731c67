// kit/dist_internal.h: the process group's and the buckets' pieces that only the kit itself and its tests
// call: non-blocking collectives (the buckets' building block), the pure decisions (backend choice, bucket
// plan: testable without MPI), and the hooks tests use to drive buckets by hand. Lessons use kit/dist.h and
// kit/buckets.h only.
#ifndef KIT_DIST_INTERNAL_H
#define KIT_DIST_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kit/buckets.h"
#include "kit/dist.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { PG_SUM = 0, PG_AVG = 1 } PgOp;

// A collective in flight (from pg_iallreduce); pg_wait completes it. At most PG_MAX_INFLIGHT at once.
typedef struct {
    int slot;
} PgRequest;
#define PG_MAX_INFLIGHT 64

// ---------------------------------------------------------------- non-blocking (for buckets)
// Starts an in-place all-reduce and returns at once. The buffer must not be touched until pg_wait.
// Every rank must start the same requests in the same order.
PgRequest pg_iallreduce(ProcessGroup *pg, float *buf, size_t n, PgOp op);
// Completes the request (with the timeout). For PG_AVG the division by the world size happens here
// on the MPI backend (NCCL divides itself).
void pg_wait(ProcessGroup *pg, PgRequest req);

// ---------------------------------------------------------------- checks
// CRC-32 (zlib) of the bytes of (n) floats on device d: equal hashes mean bit-identical buffers
// (+0.0 and -0.0 differ; so do NaN payloads). Needs no process group.
uint32_t pg_hash_floats(Device d, const float *buf, size_t n);

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

// ---------------------------------------------------------------- buckets, driven by hand
// The plan alone (pure): fills buckets (room for n_views entries) and view_bucket (n_views: the bucket
// each view is in), returns the number of buckets. Views may come in any order but must not overlap
// and together must cover [0, total) with no gap (a clear error otherwise).
int buckets_plan(const TensorView *views, int n_views, size_t total, size_t bucket_bytes,
                 GradBucket *buckets, int *view_bucket);
// What buckets_on_grads_ready does (see buckets.h), with the buckets typed.
void buckets_mark_ready(GradBuckets *gb, size_t offset, size_t count);
// Buckets started in this step and not yet finished (all of them after a full backward).
int buckets_in_flight(const GradBuckets *gb);

// ---------------------------------------------------------------- the socket backend (lesson 07, kit/dist_socket.c)
// A star of TCP connections to rank 0, for ranks started without mpirun. Every call is blocking and
// collective; a closed connection or a timeout ends the process with a message naming the peer rank.
typedef struct SockGroup SockGroup;
// rank 0 accepts world - 1 connections on listen_fd (bound before its address went into the store); the
// others connect to root_addr ("HOST:PORT"). NULL with the reason in err.
SockGroup *sockgroup_create(int rank, int world, const char *root_addr, int listen_fd, double timeout_s, char *err,
                            size_t errlen);
void sockgroup_free(SockGroup *g);
// (n) floats or doubles in host memory, summed in rank order on rank 0.
void sockgroup_allreduce_sum(SockGroup *g, void *buf, size_t n, bool is_double);
void sockgroup_broadcast(SockGroup *g, void *buf, size_t bytes, int root);
// send (bytes) from each rank -> recv (world, bytes).
void sockgroup_allgather(SockGroup *g, const void *send, void *recv, size_t bytes);
void sockgroup_barrier(SockGroup *g);

#ifdef __cplusplus
}
#endif

#endif // KIT_DIST_INTERNAL_H
