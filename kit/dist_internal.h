// kit/dist_internal.h: what kit/dist.c offers the kit's own files and its tests only: non-blocking all-reduces,
// the gradient buckets' building block (kit/buckets.c). Lessons use kit/dist.h.
#ifndef KIT_DIST_INTERNAL_H
#define KIT_DIST_INTERNAL_H

#include <stddef.h>

#include "kit/dist.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { PG_SUM = 0, PG_AVG = 1 } PgOp;

// A collective in flight (from pg_iallreduce); pg_wait completes it. At most PG_MAX_INFLIGHT at once, together
// with the reduce-scatters in flight (kit/dist.h's PgWork: the same slots).
typedef struct {
    int slot;
} PgRequest;
#define PG_MAX_INFLIGHT 64

// Starts an in-place all-reduce and returns at once. The buffer must not be touched until pg_wait.
// Every rank must start the same requests in the same order.
PgRequest pg_iallreduce(ProcessGroup *pg, float *buf, size_t n, PgOp op);
// Completes the request (with the timeout). For PG_AVG the division by the world size happens here
// on the MPI backend (NCCL divides itself).
void pg_wait(ProcessGroup *pg, PgRequest req);
// pg_progress (kit/dist.h) lets the requests in flight move.

#ifdef __cplusplus
}
#endif

#endif // KIT_DIST_INTERNAL_H
