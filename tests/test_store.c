// tests/test_store.c: the rendezvous store (kit/store.h) and the sockets under it (kit/sock.h), without MPI:
// the other ranks are forked children. Lesson 07's autograder tests the learner's bootstrap ON the store; these
// test the store's own promises: values reach every rank, every wait ends at its timeout naming what is
// missing, one store serves one job, a bad file is an error, and rank 0 leaves no file behind.
#include "tests/testutil.h"

#include <fcntl.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kit/log.h"
#include "kit/sock.h"
#include "kit/store.h"

// A port where a connection is refused and that no other process can take while the test runs: a socket bound
// to a port of the system's choosing that never listens. Returns the socket (the caller closes it) and *port.
static int refusing_port(int *port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

// Rank `rank` of a job of 3 on url: sets "v/<rank>", waits for all three, checks them, and rank 0's "root".
// Returns 0 when everything held (the exit status of a child).
// A tcp url ending in ":0" (any free port): rank 0 writes the port it got to port_fd, once per other rank, and
// the other ranks read it from there (ports are never picked free and bound later: other tests run beside).
static int rank_main(const char *url, int rank, int port_fd[2]) {
    char err[1024], mine[128];
    size_t ulen = strlen(url);
    bool any_port = ulen > 2 && strcmp(url + ulen - 2, ":0") == 0;
    int port = 0;
    if (any_port && rank > 0) {
        if (read(port_fd[0], &port, sizeof port) != (ssize_t)sizeof port || port <= 0) return 1;
        snprintf(mine, sizeof mine, "%.*s:%d", (int)(ulen - 2), url, port);
        url = mine;
    }
    Store *s = store_open(url, "job-3", rank, 3, 10.0, err, sizeof err);
    if (any_port && rank == 0) {
        port = s ? store_port(s) : -1;
        for (int i = 0; i < 2; i++)
            if (write(port_fd[1], &port, sizeof port) != (ssize_t)sizeof port) port = -1;
    }
    if (!s) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        return 1;
    }
    char key[16];
    int v = 100 + rank;
    snprintf(key, sizeof key, "v/%d", rank);
    int rc = store_set(s, key, &v, sizeof v, err, sizeof err);
    if (rank == 0 && rc == 0) rc = store_set(s, "root", "hello", 5, err, sizeof err);
    const char *keys[] = {"v/0", "v/1", "v/2"};
    if (rc == 0) rc = store_wait(s, keys, 3, err, sizeof err);
    for (int r = 0; r < 3 && rc == 0; r++) {
        int got = 0;
        if (store_get(s, keys[r], &got, sizeof got, err, sizeof err) != (long)sizeof got || got != 100 + r) rc = 1;
    }
    char root[8] = "";
    if (rc == 0 && (store_get(s, "root", root, sizeof root, err, sizeof err) != 5 || memcmp(root, "hello", 5) != 0)) rc = 1;
    if (rc == 0) rc = store_barrier(s, "done", err, sizeof err);
    if (rc != 0) fprintf(stderr, "rank %d: %s\n", rank, err);
    store_close(s);
    return rc == 0 ? 0 : 1;
}

static void run_three(const char *url) {
    pid_t kids[2];
    int port_fd[2];
    assert_int_equal(pipe(port_fd), 0);
    for (int r = 1; r <= 2; r++) {
        kids[r - 1] = fork();
        assert_true(kids[r - 1] >= 0);
        if (kids[r - 1] == 0) _exit(rank_main(url, r, port_fd));
    }
    int rc0 = rank_main(url, 0, port_fd);
    close(port_fd[0]);
    close(port_fd[1]);
    for (int i = 0; i < 2; i++) {
        int status;
        assert_int_equal(waitpid(kids[i], &status, 0), kids[i]);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    assert_int_equal(rc0, 0);
}

static void test_tcp_three_ranks(void **state) {
    (void)state;
    run_three("tcp://127.0.0.1:0");
}

static void test_file_three_ranks(void **state) {
    (void)state;
    char dir[] = "/tmp/test-store-XXXXXX", url[128], path[96];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/s", dir);
    snprintf(url, sizeof url, "file://%s", path);
    run_three(url);
    struct stat st;
    assert_int_not_equal(stat(path, &st), 0);  // rank 0 removed it once every rank had left
    rmdir(dir);
}

// A key that never comes: the wait ends at the timeout, naming the key and the ranks that never joined.
static void test_timeout_names_missing(void **state) {
    (void)state;
    char err[1024] = "";
    Store *s = store_open("tcp://127.0.0.1:0", "j", 0, 4, 0.5, err, sizeof err);
    assert_non_null(s);
    double start = time_now();
    char buf[8];
    assert_int_equal(store_get(s, "nope", buf, sizeof buf, err, sizeof err), -1);
    double waited = time_now() - start;
    assert_true(waited >= 0.45 && waited < 3.0);
    assert_non_null(strstr(err, "'nope'"));
    assert_non_null(strstr(err, "ranks 1, 2, 3 never joined"));
    store_close(s);
}

// One store, one job: another job id, another world size, a rank taken twice, a rank out of range.
static void test_tcp_refusals(void **state) {
    (void)state;
    char url[64], err[1024] = "";
    Store *a0 = store_open("tcp://127.0.0.1:0", "A", 0, 2, 5.0, err, sizeof err);
    assert_non_null(a0);
    int port = store_port(a0);
    assert_true(port > 0);
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", port);
    // Port 0 is rank 0's alone: another rank must be told the port.
    assert_null(store_open("tcp://127.0.0.1:0", "A", 1, 2, 5.0, err, sizeof err));
    assert_non_null(strstr(err, "rank 0"));
    assert_null(store_open(url, "B", 1, 2, 5.0, err, sizeof err));
    assert_non_null(strstr(err, "serves job 'A', not job 'B'"));
    assert_null(store_open(url, "A", 1, 3, 5.0, err, sizeof err));
    assert_non_null(strstr(err, "WORLD_SIZE"));
    assert_null(store_open(url, "A", 2, 2, 5.0, err, sizeof err));
    assert_non_null(strstr(err, "RANK must be in 0..WORLD_SIZE-1"));
    Store *a1 = store_open(url, "A", 1, 2, 5.0, err, sizeof err);
    assert_non_null(a1);
    assert_null(store_open(url, "A", 1, 2, 5.0, err, sizeof err));
    assert_non_null(strstr(err, "rank 1 already joined"));
    // The port is taken now: a second rank 0 cannot serve there.
    assert_null(store_open(url, "C", 0, 2, 5.0, err, sizeof err));
    char want[64];
    snprintf(want, sizeof want, "port %d is already in use", port);
    assert_non_null(strstr(err, want));
    store_close(a1);
    store_close(a0);
}

static void test_file_refusals(void **state) {
    (void)state;
    char dir[] = "/tmp/test-store-XXXXXX", url[128], path[96], err[1024] = "";
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/s", dir);
    snprintf(url, sizeof url, "file://%s", path);
    Store *a0 = store_open(url, "A", 0, 2, 2.0, err, sizeof err);
    assert_non_null(a0);
    assert_null(store_open(url, "B", 1, 2, 2.0, err, sizeof err));
    assert_non_null(strstr(err, "belongs to job 'A'"));
    assert_null(store_open(url, "A", 0, 2, 2.0, err, sizeof err));  // a stale rank 0 (a file left behind)
    assert_non_null(strstr(err, "rank 0 already joined"));
    store_close(a0);  // rank 1 never joined: rank 0 does not wait for it, and removes the file
    struct stat st;
    assert_int_not_equal(stat(path, &st), 0);
    // Not a store file: refused with the reason, never parsed as one.
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "this is not a store, just some text\n", 36), 36);
    close(fd);
    assert_null(store_open(url, "A", 0, 2, 2.0, err, sizeof err));
    assert_non_null(strstr(err, "is not a store file"));
    unlink(path);
    rmdir(dir);
}

// The master unreachable: the connect gives up at the deadline with the reason.
static void test_unreachable(void **state) {
    (void)state;
    char url[64], err[1024] = "";
    int port, held = refusing_port(&port);
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", port);
    double start = time_now();
    assert_null(store_open(url, "A", 1, 2, 0.5, err, sizeof err));
    close(held);
    assert_true(time_now() - start < 3.0);
    assert_non_null(strstr(err, "cannot reach the store"));
    assert_non_null(strstr(err, "refused"));
    assert_null(store_open("tcp://127.0.0.1", "A", 0, 1, 0.5, err, sizeof err));
    assert_non_null(strstr(err, "tcp://HOST:PORT"));
    assert_null(store_open("udp://x:1", "A", 0, 1, 0.5, err, sizeof err));
}

static void test_sock_helpers(void **state) {
    (void)state;
    char host[64], err[512], addr[64];
    int port;
    assert_int_equal(sock_split_addr("10.0.0.7:29500", host, sizeof host, &port), 0);
    assert_string_equal(host, "10.0.0.7");
    assert_int_equal(port, 29500);
    assert_int_equal(sock_split_addr("node0", host, sizeof host, &port), -1);
    assert_int_equal(sock_split_addr("node0:0", host, sizeof host, &port), -1);
    assert_int_equal(sock_split_addr("node0:70000", host, sizeof host, &port), -1);
    setenv("KIT_SOCKET_IFNAME", "nosuch9", 1);
    assert_int_equal(sock_local_address(-1, addr, sizeof addr, err, sizeof err), -1);
    assert_non_null(strstr(err, "nosuch9"));
    assert_non_null(strstr(err, "lo"));  // it lists the interfaces there are
    setenv("KIT_SOCKET_IFNAME", "lo", 1);
    assert_int_equal(sock_local_address(-1, addr, sizeof addr, err, sizeof err), 0);
    assert_string_equal(addr, "127.0.0.1");
    unsetenv("KIT_SOCKET_IFNAME");
}

// A peer that dies: the receive ends at once with "closed", not at the deadline.
static void test_sendrecv_peer_dies(void **state) {
    (void)state;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    pid_t kid = fork();
    if (kid == 0) {
        close(sv[0]);
        _exit(0);  // dies without sending
    }
    close(sv[1]);
    char buf[4], err[256];
    double start = time_now();
    assert_int_equal(sock_recv_all(sv[0], buf, sizeof buf, time_now() + 10.0, err, sizeof err), -1);
    assert_true(time_now() - start < 5.0);
    assert_non_null(strstr(err, "closed"));
    close(sv[0]);
    waitpid(kid, NULL, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tcp_three_ranks),   cmocka_unit_test(test_file_three_ranks),
        cmocka_unit_test(test_timeout_names_missing), cmocka_unit_test(test_tcp_refusals),
        cmocka_unit_test(test_file_refusals),     cmocka_unit_test(test_unreachable),
        cmocka_unit_test(test_sock_helpers),      cmocka_unit_test(test_sendrecv_peer_dies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
