// ring.c: lesson 07, a ring all-reduce over plain TCP sockets: what NCCL and Open MPI do inside their
// all-reduce, written out. A teaching artifact (the kit's process group does not use it): you measure it
// against MPI_Allreduce on the same sizes (bench-ring, see the README).
//
// N ranks in a ring, each sending only to the next and receiving only from the previous. The buffer is cut
// into N chunks. Two phases of N - 1 steps each:
//
//   reduce-scatter: in each step a rank sends one chunk to the next rank and receives another from the
//                   previous one, adding it into its own; what it sends is the sum it has built so far of
//                   that chunk. After N - 1 steps each rank holds the complete sum of a different chunk.
//   all-gather:     in each step a rank passes a complete chunk on to the next rank and receives one from
//                   the previous, copying it over its own. After N - 1 steps every rank holds every chunk.
//
// Which chunk goes out at step s on rank r is yours to work out (draw 3 ranks and 3 chunks).
//
// Each rank sends 2 (N - 1) / N of the buffer in all, whatever N: the reason a ring scales ("bus bandwidth",
// busbw = size x 2 (N - 1) / N / time, is the number that compares across N).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kit/check.h"
#include "kit/log.h"
#include "kit/sock.h"
#include "kit/store.h"
#include "lesson.h"

// The part of a buffer of n floats that is chunk c of `world`: [*off, *off + *len). The first n % world
// chunks have one float more, so any n works, including n < world (empty chunks).
static void chunk_range(size_t n, int world, int c, size_t *off, size_t *len) {
    size_t base = n / (size_t)world, extra = n % (size_t)world, uc = (size_t)c;
    *off = uc * base + (uc < extra ? uc : extra);
    *len = base + (uc < extra ? 1 : 0);
}

// TODO 5: the ring all-reduce of buf (n floats), in place: reduce-scatter, then all-gather (the top of this
//   file). Must hold: in both phases data goes to the next rank and comes from the previous one; a step
//   sends and receives at once (chunks may be far larger than the sockets' buffers: kit/sock.h says what
//   happens to two neighbours that both send first); every chunk lies inside buf for any n, n < world
//   included (chunk_range above); a chunk received in the reduce-scatter is added to your own part of the
//   sum, never written over it; a failed step (a peer died) ends the call with -1 and the phase, the step
//   and the reason in err, within the ring's timeout. world == 1: nothing to do. Optional, for speed once it
//   works: receive the reduce-scatter's chunks in pieces into ring->scratch, adding each as it arrives (README
//   section 5).
// NCCL: ncclAllReduce with NCCL_ALGO=Ring;  Open MPI: coll_tuned_allreduce_algorithm 4 ("ring")
int ring_allreduce(Ring *ring, float *buf, size_t n, char *err, size_t errlen) {
    (void)ring, (void)buf, (void)n, (void)chunk_range;
    return check_reason(err, errlen, "TODO 5: ring_allreduce is not written yet");
}

// ---------------------------------------------------------------- given: making the ring

int ring_connect(Store *s, Ring *ring, char *err, size_t errlen) {
    int rank = store_rank(s), world = store_world(s);
    *ring = (Ring){.rank = rank, .world = world, .next_fd = -1, .prev_fd = -1, .timeout_s = store_timeout(s)};
    if (world == 1) return 0;
    // Every rank listens on a free port and publishes "address:port" (TODO 3 gathers them all).
    int port;
    char host[40]  /* an IPv4 address in text */, mine[SOCK_ADDR_LEN] = {0};
    int lfd = sock_listen(0, &port, err, errlen);
    if (lfd < 0 || sock_local_address(store_fd(s), host, sizeof host, err, errlen) < 0) {
        if (lfd >= 0) close(lfd);
        return -1;
    }
    snprintf(mine, sizeof mine, "%s:%d", host, port);
    char (*addrs)[SOCK_ADDR_LEN] = xcalloc((size_t)world, sizeof *addrs);
    int rc = bootstrap_allgather(s, "ring", mine, SOCK_ADDR_LEN, addrs, err, errlen);
    double deadline = time_now() + ring->timeout_s;
    char next_host[SOCK_ADDR_LEN];
    int next_port;
    // Connect first, accept second: the listener's backlog completes our connection even while the next
    // rank is itself still connecting, so no rank waits for another to reach accept().
    if (rc == 0 && sock_split_addr(addrs[(rank + 1) % world], next_host, sizeof next_host, &next_port) < 0)
        rc = check_reason(err, errlen, "rank %d published a bad address '%s'", (rank + 1) % world, addrs[(rank + 1) % world]);
    if (rc == 0 && (ring->next_fd = sock_connect(next_host, next_port, deadline, err, errlen)) < 0) rc = -1;
    if (rc == 0 && (ring->prev_fd = sock_accept(lfd, deadline, err, errlen)) < 0) rc = -1;
    free(addrs);
    close(lfd);
    if (rc < 0) ring_close(ring);
    return rc;
}

void ring_close(Ring *ring) {
    if (ring->next_fd >= 0) close(ring->next_fd);
    if (ring->prev_fd >= 0) close(ring->prev_fd);
    ring->next_fd = ring->prev_fd = -1;
    free(ring->scratch);
    ring->scratch = NULL;
}
