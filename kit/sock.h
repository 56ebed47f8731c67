// kit/sock.h: plain TCP sockets with deadlines (lesson 07): what the rendezvous store (kit/store.h), the
// process group's socket backend (kit/dist.h) and the lesson's ring all-reduce are built on.
//
// Every call that can wait takes a deadline (an absolute time_now() value, kit/log.h) and gives up there with
// a reason, so that a peer that died or never came is an error with its name, never a hang. Errors are
// returned (-1, the reason in err), not printed: the caller knows what the connection was for.
#ifndef KIT_SOCK_H
#define KIT_SOCK_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SOCK_ADDR_LEN 64  // "host:port" with an IPv4 address or a short host name

// Listens on port (0: a free port chosen by the system) on every interface. Returns the socket and the
// port it got in *bound_port, or -1 (port in use: the reason says so, with the port).
int sock_listen(int port, int *bound_port, char *err, size_t errlen);
// Accepts one connection, waiting until the deadline. Returns the socket or -1.
int sock_accept(int listen_fd, double deadline, char *err, size_t errlen);
// Connects to host:port, retrying while nobody listens there yet (the server may start later) until the
// deadline. Returns the socket or -1 with the last reason (refused, no route, unknown host).
int sock_connect(const char *host, int port, double deadline, char *err, size_t errlen);
// Splits "host:port". Returns 0, or -1 when it is not of that form.
int sock_split_addr(const char *addr, char *host, size_t hostlen, int *port);

// Sends / receives exactly n bytes before the deadline. -1: the peer closed the connection (it exited or
// died), an error, or the deadline passed; err says which.
int sock_send_all(int fd, const void *buf, size_t n, double deadline, char *err, size_t errlen);
int sock_recv_all(int fd, void *buf, size_t n, double deadline, char *err, size_t errlen);
// Sends sn bytes on send_fd while receiving rn bytes on recv_fd, both at once: what a ring step needs. Two
// neighbours that each first sent a large block and only then received would both wait for the other to
// read, once the block is larger than the sockets' buffers: a deadlock.
int sock_sendrecv(int send_fd, const void *sbuf, size_t sn, int recv_fd, void *rbuf, size_t rn, double deadline,
                  char *err, size_t errlen);

// The IPv4 address peers should use to reach this process: the interface named by KIT_SOCKET_IFNAME when
// set (an unknown name is an error that lists the interfaces there are), else the local address of `via_fd`
// (a connected socket: the interface that reaches the master, when via_fd >= 0), else the first interface
// that is up and not loopback, else 127.0.0.1. Returns 0 or -1.
int sock_local_address(int via_fd, char *out, size_t outlen, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif // KIT_SOCK_H
