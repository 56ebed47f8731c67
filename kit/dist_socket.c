// kit/dist_socket.c: the process group's socket backend (lesson 07), for CPU ranks started WITHOUT mpirun
// (torchrun-style: RANK, WORLD_SIZE, MASTER_ADDR in the environment, peers found through kit/store.h).
//
// Every rank keeps one TCP connection to rank 0 (a star), and rank 0 does the arithmetic: simple and
// deterministic, not fast. Why not MPI there, and what the star costs: kit/README.md ("The socket backend").
//
// The sum is formed on rank 0 in rank order, ((x0 + x1) + x2) + ...: on 2 ranks that is bit for bit what
// MPI's all-reduce gives (a + b == b + a in IEEE arithmetic); on more ranks the order may differ from MPI's.
#include "kit/dist_socket.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kit/check.h"
#include "kit/log.h"
#include "kit/sock.h"

struct SockGroup {
    int rank, world;
    double timeout_s;
    int *fd;          // rank 0: (world) the connection to each rank (fd[0] unused); others: fd[0] to rank 0
    long long seq;    // collectives so far (the same count on every rank), for messages
    char *scratch;    // rank 0: one rank's contribution while it is added in
    size_t scratch_cap;
};

static void sockgroup_fail(SockGroup *g, const char *what, int peer, const char *why) __attribute__((noreturn));
static void sockgroup_fail(SockGroup *g, const char *what, int peer, const char *why) {
    fflush(stdout);
    fprintf(stderr, "rank %d: %s #%lld with rank %d failed: %s\n"
                    "  HINT: a rank that exited or crashed shows first as a closed connection; one that is stuck (or far\n"
                    "        slower) as a timeout (--timeout, KIT_PG_TIMEOUT). Look at that rank's own output.\n",
            g->rank, what, g->seq, peer, why);
    fflush(stderr);
    exit(1);  // our connections close with us: every other rank learns it at its next receive
}

SockGroup *sockgroup_create(int rank, int world, const char *root_addr, int listen_fd, double timeout_s, char *err,
                            size_t errlen) {
    SockGroup *g = xcalloc(1, sizeof *g);
    *g = (SockGroup){.rank = rank, .world = world, .timeout_s = timeout_s};
    g->fd = xmalloc((size_t)world * sizeof *g->fd);
    for (int r = 0; r < world; r++) g->fd[r] = -1;
    double deadline = time_now() + timeout_s;
    char why[512];
    if (rank == 0) {
        // Each rank says who it is first: they connect in any order.
        for (int k = 1; k < world; k++) {
            int fd = sock_accept(listen_fd, deadline, why, sizeof why);
            int32_t who = -1;
            if (fd < 0 || sock_recv_all(fd, &who, sizeof who, deadline, why, sizeof why) < 0) {
                int missing = 0;
                for (int r = 1; r < world && !missing; r++)
                    if (g->fd[r] < 0) missing = r;
                check_reason(err, errlen, "rank 0: rank %d (and maybe more) never connected to the process group at "
                             "%s: %s", missing, root_addr, why);
                goto fail;
            }
            if (who < 1 || who >= world || g->fd[who] >= 0) {
                check_reason(err, errlen, "rank 0: a connection said it was rank %d (expected a new rank in 1..%d)",
                             who, world - 1);
                close(fd);
                goto fail;
            }
            g->fd[who] = fd;
        }
    } else if (world > 1) {
        char host[SOCK_ADDR_LEN];
        int port;
        if (sock_split_addr(root_addr, host, sizeof host, &port) < 0) {
            check_reason(err, errlen, "rank 0's address '%s' is not HOST:PORT", root_addr);
            goto fail;
        }
        int32_t me = rank;
        g->fd[0] = sock_connect(host, port, deadline, why, sizeof why);
        if (g->fd[0] < 0 || sock_send_all(g->fd[0], &me, sizeof me, deadline, why, sizeof why) < 0) {
            check_reason(err, errlen, "rank %d cannot reach rank 0's process group at %s: %s", rank, root_addr, why);
            goto fail;
        }
    }
    return g;
fail:
    sockgroup_free(g);
    return NULL;
}

void sockgroup_free(SockGroup *g) {
    if (!g) return;
    for (int r = 0; r < g->world; r++)
        if (g->fd[r] >= 0) close(g->fd[r]);
    free(g->fd);
    free(g->scratch);
    free(g);
}

static void recv_from(SockGroup *g, int peer, void *buf, size_t bytes, const char *what) {
    char why[256];
    int fd = g->rank == 0 ? g->fd[peer] : g->fd[0];
    if (sock_recv_all(fd, buf, bytes, time_now() + g->timeout_s, why, sizeof why) < 0) sockgroup_fail(g, what, peer, why);
}

static void send_to(SockGroup *g, int peer, const void *buf, size_t bytes, const char *what) {
    char why[256];
    int fd = g->rank == 0 ? g->fd[peer] : g->fd[0];
    if (sock_send_all(fd, buf, bytes, time_now() + g->timeout_s, why, sizeof why) < 0) sockgroup_fail(g, what, peer, why);
}

static void *scratch(SockGroup *g, size_t bytes) {
    if (bytes > g->scratch_cap) {
        free(g->scratch);
        g->scratch = xmalloc(bytes);
        g->scratch_cap = bytes;
    }
    return g->scratch;
}

void sockgroup_allreduce_sum(SockGroup *g, void *buf, size_t n, bool is_double) {
    g->seq++;
    size_t bytes = n * (is_double ? sizeof(double) : sizeof(float));
    if (g->rank != 0) {
        send_to(g, 0, buf, bytes, "all-reduce");
        recv_from(g, 0, buf, bytes, "all-reduce");
        return;
    }
    void *tmp = scratch(g, bytes);
    for (int r = 1; r < g->world; r++) {  // rank order: the same sum on every run
        recv_from(g, r, tmp, bytes, "all-reduce");
        if (is_double)
            for (size_t i = 0; i < n; i++) ((double *)buf)[i] += ((const double *)tmp)[i];
        else
            for (size_t i = 0; i < n; i++) ((float *)buf)[i] += ((const float *)tmp)[i];
    }
    for (int r = 1; r < g->world; r++) send_to(g, r, buf, bytes, "all-reduce");
}

void sockgroup_broadcast(SockGroup *g, void *buf, size_t bytes, int root) {
    g->seq++;
    if (root != 0) {  // through rank 0, the hub of the star
        if (g->rank == root) send_to(g, 0, buf, bytes, "broadcast");
        if (g->rank == 0) recv_from(g, root, buf, bytes, "broadcast");
    }
    if (g->rank == 0) {
        for (int r = 1; r < g->world; r++)
            if (r != root) send_to(g, r, buf, bytes, "broadcast");
    } else if (g->rank != root) {
        recv_from(g, 0, buf, bytes, "broadcast");
    }
}

void sockgroup_allgather(SockGroup *g, const void *send, void *recv, size_t bytes) {
    g->seq++;
    char *all = recv;
    memcpy(all + (size_t)g->rank * bytes, send, bytes);
    if (g->rank != 0) {
        send_to(g, 0, send, bytes, "all-gather");
        recv_from(g, 0, all, bytes * (size_t)g->world, "all-gather");
        return;
    }
    for (int r = 1; r < g->world; r++) recv_from(g, r, all + (size_t)r * bytes, bytes, "all-gather");
    for (int r = 1; r < g->world; r++) send_to(g, r, all, bytes * (size_t)g->world, "all-gather");
}

void sockgroup_barrier(SockGroup *g) {
    char one = 1, *all = xmalloc((size_t)g->world);
    sockgroup_allgather(g, &one, all, 1);
    free(all);
}
