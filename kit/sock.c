// kit/sock.c: TCP sockets with deadlines (see sock.h). Every wait is a poll() with what is left of the
// deadline, so no call here blocks past it.
#include "kit/sock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kit/check.h"
#include "kit/log.h"

// Milliseconds left until the deadline, for poll(); 0 when it has passed.
static int ms_left(double deadline) {
    double left = deadline - time_now();
    if (left <= 0) return 0;
    return left > 1e6 ? 1000000000 : (int)(left * 1000.0) + 1;
}

int sock_listen(int port, int *bound_port, char *err, size_t errlen) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return check_reason(err, errlen, "socket: %s", strerror(errno));
    // SO_REUSEADDR lets a restarted job take its port while the last run's connections sit in TIME_WAIT; it
    // does not let two live listeners share a port (that is still EADDRINUSE).
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_ANY)};
    if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(fd, 128) < 0) {
        int e = errno;
        close(fd);
        if (e == EADDRINUSE)
            return check_reason(err, errlen, "port %d is already in use on this host (another job, or a run that is "
                                "still exiting, listens there)", port);
        return check_reason(err, errlen, "cannot listen on port %d: %s", port, strerror(e));
    }
    socklen_t len = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &len);
    if (bound_port) *bound_port = ntohs(a.sin_port);
    return fd;
}

static void tune(int fd) {
    int one = 1;  // small messages (the store's, a ring's last chunks) go out at once, not after 40 ms
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int sock_accept(int listen_fd, double deadline, char *err, size_t errlen) {
    struct pollfd p = {.fd = listen_fd, .events = POLLIN};
    for (;;) {
        int r = poll(&p, 1, ms_left(deadline));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return check_reason(err, errlen, "poll: %s", strerror(errno));
        if (r == 0) return check_reason(err, errlen, "nobody connected before the timeout");
        int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd >= 0) {
            tune(fd);
            return fd;
        }
        if (errno != EINTR && errno != ECONNABORTED) return check_reason(err, errlen, "accept: %s", strerror(errno));
    }
}

int sock_split_addr(const char *addr, char *host, size_t hostlen, int *port) {
    const char *colon = strrchr(addr, ':');
    if (!colon || colon == addr || (size_t)(colon - addr) >= hostlen) return -1;
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (*end != '\0' || end == colon + 1 || p < 1 || p > 65535) return -1;
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = '\0';
    *port = (int)p;
    return 0;
}

// One connection attempt with what is left of the deadline. Returns the socket, or -1 with errno set.
static int connect_once(const struct sockaddr *sa, socklen_t salen, double deadline) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    if (connect(fd, sa, salen) < 0) {
        if (errno != EINPROGRESS) goto fail;
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int r;
        while ((r = poll(&p, 1, ms_left(deadline))) < 0 && errno == EINTR) {}
        if (r <= 0) {
            errno = r == 0 ? ETIMEDOUT : errno;
            goto fail;
        }
        int soerr = 0;
        socklen_t len = sizeof soerr;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len);
        if (soerr) {
            errno = soerr;
            goto fail;
        }
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    tune(fd);
    return fd;
fail:;
    int e = errno;
    close(fd);
    errno = e;
    return -1;
}

int sock_connect(const char *host, int port, double deadline, char *err, size_t errlen) {
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    int rc = getaddrinfo(host, service, &hints, &res);
    if (rc != 0) return check_reason(err, errlen, "cannot resolve host '%s': %s", host, gai_strerror(rc));
    int last = 0;
    for (;;) {
        int fd = connect_once(res->ai_addr, res->ai_addrlen, deadline);
        if (fd >= 0) {
            freeaddrinfo(res);
            return fd;
        }
        last = errno;
        if (time_now() >= deadline) break;
        usleep(50 * 1000);  // refused: the server is not listening yet; try again
    }
    freeaddrinfo(res);
    return check_reason(err, errlen, "could not connect to %s:%d before the timeout (last attempt: %s)", host, port,
                        strerror(last));
}

int sock_send_all(int fd, const void *buf, size_t n, double deadline, char *err, size_t errlen) {
    return sock_sendrecv(fd, buf, n, -1, NULL, 0, deadline, err, errlen);
}

int sock_recv_all(int fd, void *buf, size_t n, double deadline, char *err, size_t errlen) {
    return sock_sendrecv(-1, NULL, 0, fd, buf, n, deadline, err, errlen);
}

int sock_sendrecv(int send_fd, const void *sbuf, size_t sn, int recv_fd, void *rbuf, size_t rn, double deadline,
                  char *err, size_t errlen) {
    size_t sent = 0, got = 0;
    while (sent < sn || got < rn) {
        struct pollfd p[2];
        int np = 0, si = -1, ri = -1;
        if (sent < sn) p[si = np++] = (struct pollfd){.fd = send_fd, .events = POLLOUT};
        if (got < rn) p[ri = np++] = (struct pollfd){.fd = recv_fd, .events = POLLIN};
        int r = poll(p, (nfds_t)np, ms_left(deadline));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return check_reason(err, errlen, "poll: %s", strerror(errno));
        if (r == 0)
            return check_reason(err, errlen, "timed out with %zu of %zu bytes sent and %zu of %zu received", sent, sn,
                                got, rn);
        if (si >= 0 && p[si].revents) {
            ssize_t k = send(send_fd, (const char *)sbuf + sent, sn - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                return check_reason(err, errlen, "the peer is gone (send: %s)", strerror(errno));
            if (k > 0) sent += (size_t)k;
        }
        if (ri >= 0 && p[ri].revents) {
            ssize_t k = recv(recv_fd, (char *)rbuf + got, rn - got, MSG_DONTWAIT);
            if (k == 0) return check_reason(err, errlen, "the peer closed the connection (it exited or died)");
            if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                return check_reason(err, errlen, "the peer is gone (recv: %s)", strerror(errno));
            if (k > 0) got += (size_t)k;
        }
    }
    return 0;
}

int sock_local_address(int via_fd, char *out, size_t outlen, char *err, size_t errlen) {
    const char *want = getenv("KIT_SOCKET_IFNAME");
    if (!want || !*want) want = NULL;
    if (!want && via_fd >= 0) {
        struct sockaddr_in a;
        socklen_t len = sizeof a;
        if (getsockname(via_fd, (struct sockaddr *)&a, &len) == 0 && a.sin_family == AF_INET) {
            inet_ntop(AF_INET, &a.sin_addr, out, (socklen_t)outlen);
            return 0;
        }
    }
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) < 0) return check_reason(err, errlen, "getifaddrs: %s", strerror(errno));
    char names[256] = "";
    int found = 0;
    for (struct ifaddrs *i = ifs; i && !found; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
        size_t used = strlen(names);
        snprintf(names + used, sizeof names - used, "%s%s", used ? ", " : "", i->ifa_name);
        bool pick = want ? strcmp(i->ifa_name, want) == 0 : !(i->ifa_flags & IFF_LOOPBACK);
        if (pick) {
            inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, out, (socklen_t)outlen);
            found = 1;
        }
    }
    freeifaddrs(ifs);
    if (found) return 0;
    if (want)
        return check_reason(err, errlen, "KIT_SOCKET_IFNAME=%s: no such interface with an IPv4 address here "
                            "(this host has: %s)", want, names);
    snprintf(out, outlen, "127.0.0.1");
    return 0;
}
