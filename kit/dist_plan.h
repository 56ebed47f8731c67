// kit/dist_plan.h: the process group's decisions that need neither MPI nor a GPU (kit/dist_plan.c), below
// kit/dist.h so that the unit tests check them without mpirun and the kit links them without MPI: the table of
// backends (their names, which start each one needs), the backend choice, the buffer hash that says whether
// replicas are bit-identical, and the report of which ranks a stalled collective waits for.
#ifndef KIT_DIST_PLAN_H
#define KIT_DIST_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kit/device.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { PG_BACKEND_MPI = 0, PG_BACKEND_NCCL = 1, PG_BACKEND_SOCKET = 2 } PgBackend;

// How the ranks of a job were started: by mpirun or srun (pg_init), or from a rendezvous store without them
// (pg_init_socket, lesson 07). Each start has its host backend, which "auto" falls back to when NCCL cannot
// run: MPI under mpirun, the socket backend from a store.
typedef enum { PG_START_MPIRUN = 0, PG_START_STORE = 1 } PgStart;

// "mpi", "nccl" or "socket".
const char *pg_backend_name(PgBackend b);
// Every name --backend takes, "auto|mpi|nccl|socket" (kit/cli.c's choices).
const char *pg_backend_choices(void);
// True when `requested` (NULL: "auto") names a backend that a job started by `start` can run; otherwise false,
// with the reason in why (unknown name, or "mpi" from a store, or "socket" under mpirun).
bool pg_backend_startable(const char *requested, PgStart start, char *why, size_t why_len);
// Decides the backend from what was asked, how the job started and what this node has; no MPI or CUDA calls, so
// it is testable anywhere. ranks_per_gpu: the most ranks of this node that share one physical GPU (0 when there
// is no usable GPU). Returns false when the request cannot be met, with the reason in why (naming the start's host
// backend when NCCL is refused); on success why says why (for auto).
bool pg_choose_backend(const char *requested, PgStart start, Device dev, bool nccl_built, int ranks_per_gpu,
                       PgBackend *out, char *why, size_t why_len);
// The most times one string occurs among n fixed-width strings (ids + i * stride): ranks per GPU
// from the gathered PCI bus ids.
int pg_max_duplicates(const char *ids, int n, size_t stride);

// CRC-32 (zlib) of the bytes of (n) floats on device d: equal hashes mean bit-identical buffers
// (+0.0 and -0.0 differ; so do NaN payloads).
uint32_t pg_hash_floats(Device d, const float *buf, size_t n);

// The stalled-rank report (kit/dist.c): seen[r] is the number of the collective rank r last said it was waiting
// in (a rank says so after waiting a moment), seq the collective this rank `me` timed out in. Writes which
// ranks never joined it ("rank 2 did not join it ...") and which waited in a later one.
void pg_describe_absent(const long long *seen, int world, int me, long long seq, char *out, size_t len);

#ifdef __cplusplus
}
#endif

#endif // KIT_DIST_PLAN_H
