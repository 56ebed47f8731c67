// kit/dist_socket.h: the process group's socket backend (kit/dist_socket.c), for ranks started without mpirun
// (lesson 07). A star of TCP connections to rank 0. Every call is blocking and collective; a closed connection
// or a timeout ends the process with a message naming the peer rank. kit/dist.c runs it under pg_init_socket;
// nothing else calls it.
#ifndef KIT_DIST_SOCKET_H
#define KIT_DIST_SOCKET_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

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

#endif // KIT_DIST_SOCKET_H
