// kit/store.c: the rendezvous store (see store.h): a key-value table that rank 0 serves over TCP, or that
// lives in a shared file. Values are small (addresses, an NCCL unique id); the traffic is a few messages per
// rank, so everything here is simple rather than fast: a linear table, polling waits.
#include "kit/store.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kit/check.h"
#include "kit/log.h"
#include "kit/sock.h"

enum { OP_HELLO = 1, OP_SET = 2, OP_GET = 3 };
enum { ST_OK = 0, ST_MISSING = 1, ST_REFUSED = 2 };

typedef struct {
    char key[STORE_KEY_MAX];
    char *value;
    uint32_t len;
} Entry;

// The key-value table (the tcp server's, or one read of the file).
typedef struct {
    Entry *e;
    int n, cap;
} Table;

static Entry *table_find(const Table *t, const char *key) {
    for (int i = t->n - 1; i >= 0; i--)  // the newest value of a key wins
        if (strcmp(t->e[i].key, key) == 0) return &t->e[i];
    return NULL;
}

static void table_put(Table *t, const char *key, const void *value, uint32_t len) {
    Entry *e = table_find(t, key);
    if (!e) {
        if (t->n == t->cap) {
            t->cap = t->cap ? 2 * t->cap : 64;
            t->e = CHECK_ALLOC(realloc(t->e, (size_t)t->cap * sizeof *t->e));
        }
        e = &t->e[t->n++];
        snprintf(e->key, sizeof e->key, "%s", key);
        e->value = NULL;
    }
    free(e->value);
    e->value = xmalloc(len ? len : 1);
    memcpy(e->value, value, len);
    e->len = len;
}

static void table_free(Table *t) {
    for (int i = 0; i < t->n; i++) free(t->e[i].value);
    free(t->e);
    *t = (Table){0};
}

struct Store {
    bool is_file;
    bool is_c10d;      // a PyTorch TCPStore that someone else serves (torchrun's agent): the kit is its client
    char prefix[STORE_KEY_MAX];  // c10d: what every key is stored under, so the kit's keys never meet torchrun's
    int rank, world;
    double timeout_s;
    char job[STORE_KEY_MAX];
    char where[1100];  // "HOST:PORT" or the file's path, for messages
    int port;          // tcp, c10d: the port (the one the system gave rank 0 when the url said port 0)
    int fd;            // tcp: the connection to the server; file: the open file
    // tcp, rank 0: the server
    bool serving;
    pthread_t server;
    int listen_fd, stop_pipe[2];
    Table table;       // the server's table (only its thread touches it)
};

// ---------------------------------------------------------------- the tcp server (rank 0, a thread)

// A request is three uint32 (op, key length, value length), the key, the value; a reply is two (status,
// length) and the payload (the value, or the reason of a refusal).
typedef struct {
    uint32_t op, klen, vlen;
} Header;

static int reply(int fd, uint32_t status, const void *payload, uint32_t len) {
    uint32_t h[2] = {status, len};
    double deadline = time_now() + 5.0;
    if (sock_send_all(fd, h, sizeof h, deadline, NULL, 0) < 0) return -1;
    return sock_send_all(fd, payload, len, deadline, NULL, 0);
}

static int refuse(int fd, const char *msg) {
    reply(fd, ST_REFUSED, msg, (uint32_t)strlen(msg));
    return -1;  // the server drops a refused client
}

// Handles one request from fd. Returns -1 when the client is to be dropped.
static int serve_one(Store *s, int fd) {
    Header h;
    double deadline = time_now() + 5.0;  // a client that sent a header sends the rest at once
    if (sock_recv_all(fd, &h, sizeof h, deadline, NULL, 0) < 0) return -1;
    if (h.klen == 0 || h.klen >= STORE_KEY_MAX || h.vlen > STORE_VALUE_MAX) return -1;
    char key[STORE_KEY_MAX] = {0};
    char *value = xmalloc(h.vlen ? h.vlen : 1);
    int rc = -1;
    if (sock_recv_all(fd, key, h.klen, deadline, NULL, 0) < 0 || sock_recv_all(fd, value, h.vlen, deadline, NULL, 0) < 0)
        goto out;
    if (h.op == OP_HELLO && h.vlen == 2 * sizeof(int32_t)) {  // key: the job id; value: rank, world
        int32_t rw[2];
        memcpy(rw, value, sizeof rw);
        char join[32], msg[512] = "";
        snprintf(join, sizeof join, "__join/%d", rw[0]);
        if (strcmp(key, s->job) != 0)
            snprintf(msg, sizeof msg, "refused: this store serves job '%s', not job '%s' (two jobs on one "
                     "MASTER_ADDR:MASTER_PORT? give each job its own port)", s->job, key);
        else if (rw[1] != s->world)
            snprintf(msg, sizeof msg, "refused: this store's job has WORLD_SIZE %d; this rank was started with %d",
                     s->world, rw[1]);
        else if (rw[0] < 0 || rw[0] >= s->world)
            snprintf(msg, sizeof msg, "refused: rank %d is outside 0..%d", rw[0], s->world - 1);
        else if (table_find(&s->table, join))
            snprintf(msg, sizeof msg, "refused: rank %d already joined this store (job '%s'): a second job on the "
                     "same port with the same id, or one RANK given twice", rw[0], s->job);
        if (msg[0]) rc = refuse(fd, msg);
        else {
            table_put(&s->table, join, "", 0);
            rc = reply(fd, ST_OK, NULL, 0);
        }
    } else if (h.op == OP_SET) {
        table_put(&s->table, key, value, h.vlen);
        rc = reply(fd, ST_OK, NULL, 0);
    } else if (h.op == OP_GET) {
        Entry *e = table_find(&s->table, key);
        rc = e ? reply(fd, ST_OK, e->value, e->len) : reply(fd, ST_MISSING, NULL, 0);
    }
out:
    free(value);
    return rc;
}

static void *server_main(void *arg) {
    Store *s = arg;
    enum { MAX_CLIENTS = 1024 };
    struct pollfd *p = xcalloc(MAX_CLIENTS + 2, sizeof *p);
    int n = 2;
    p[0] = (struct pollfd){.fd = s->listen_fd, .events = POLLIN};
    p[1] = (struct pollfd){.fd = s->stop_pipe[0], .events = POLLIN};
    for (;;) {
        if (poll(p, (nfds_t)n, 1000) < 0 && errno != EINTR) break;
        if (p[1].revents) break;
        if (p[0].revents & POLLIN) {
            int fd = sock_accept(s->listen_fd, time_now(), NULL, 0);
            if (fd >= 0 && n < MAX_CLIENTS + 2) p[n++] = (struct pollfd){.fd = fd, .events = POLLIN};
            else if (fd >= 0) close(fd);
        }
        for (int i = 2; i < n; i++) {
            if (!p[i].revents) continue;
            if ((p[i].revents & (POLLIN | POLLHUP | POLLERR)) && serve_one(s, p[i].fd) < 0) {
                close(p[i].fd);
                p[i--] = p[--n];
            }
        }
    }
    for (int i = 2; i < n; i++) close(p[i].fd);
    free(p);
    return NULL;
}

// ---------------------------------------------------------------- the client side (every rank)

// One request to the tcp server; *status and the payload (into buf, cap bytes) from its reply. Returns the
// payload's length or -1 (the server is gone).
static long tcp_request(Store *s, uint32_t op, const char *key, const void *value, uint32_t vlen, uint32_t *status,
                        void *buf, size_t cap, char *err, size_t errlen) {
    Header h = {op, (uint32_t)strlen(key), vlen};
    double deadline = time_now() + s->timeout_s;
    char why[256];
    uint32_t r[2];
    if (sock_send_all(s->fd, &h, sizeof h, deadline, why, sizeof why) < 0 ||
        sock_send_all(s->fd, key, h.klen, deadline, why, sizeof why) < 0 ||
        sock_send_all(s->fd, value, vlen, deadline, why, sizeof why) < 0 ||
        sock_recv_all(s->fd, r, sizeof r, deadline, why, sizeof why) < 0)
        return check_reason(err, errlen, "lost the store at %s (rank 0 serves it: did rank 0 exit or die?): %s",
                            s->where, why);
    char *payload = xmalloc(r[1] + 1);
    if (sock_recv_all(s->fd, payload, r[1], deadline, why, sizeof why) < 0) {
        free(payload);
        return check_reason(err, errlen, "lost the store at %s: %s", s->where, why);
    }
    payload[r[1]] = '\0';
    *status = r[0];
    if (r[0] == ST_REFUSED) {
        check_reason(err, errlen, "%s: %s", s->where, payload);
        free(payload);
        return -1;
    }
    if (buf) memcpy(buf, payload, r[1] < cap ? r[1] : cap);
    free(payload);
    return r[1];
}

// ---------------------------------------------------------------- the c10d client (a PyTorch TCPStore)

// torchrun's agent serves a c10d TCPStore at MASTER_ADDR:MASTER_PORT before it starts the workers; with
// TORCHELASTIC_USE_AGENT_STORE=True a worker must not serve one itself (the port is the agent's), it joins the
// agent's as a client. The wire format, as PyTorch 2.x's TCPStore client writes it (c10d/TCPStore.cpp and
// TCPStoreBackend.cpp; checked against the installed torch by tests/scale-out/torchrun.sh): a request is a
// one-byte query type and its arguments, integers in the host's byte order, a string or a value as a uint64
// length and its bytes, a list of keys as a uint64 count and the strings. A connection opens with VALIDATE
// (the magic number, no reply) and PING (a uint32 nonce, echoed back). Of the queries, the kit needs four:
//   SET key value              no reply
//   GET key                    reply: the value (uint64 length, bytes); the key must exist (CHECK first)
//   ADD key int64              reply: the new int64 (a counter kept as its decimal text)
//   CHECK n keys               reply: one byte, READY (0) when all exist, else NOT_READY (1)
// WAIT blocks in the server without a deadline of ours, so the kit polls with CHECK instead: every wait keeps
// the store's timeout and can name what is missing.
enum { C10D_VALIDATE = 0, C10D_SET = 1, C10D_GET = 3, C10D_ADD = 4, C10D_CHECK = 5, C10D_PING = 13 };
enum { C10D_READY = 0 };
#define C10D_MAGIC 0x3C85F7CEu

// A request under construction.
typedef struct {
    unsigned char *b;
    size_t n, cap;
} Msg;

static void msg_put(Msg *m, const void *p, size_t n) {
    if (m->n + n > m->cap) {
        m->cap = 2 * (m->n + n) + 64;
        m->b = CHECK_ALLOC(realloc(m->b, m->cap));
    }
    memcpy(m->b + m->n, p, n);
    m->n += n;
}
static void msg_u8(Msg *m, uint8_t v) { msg_put(m, &v, 1); }
static void msg_bytes(Msg *m, const void *p, uint64_t n) {
    msg_put(m, &n, sizeof n);
    msg_put(m, p, (size_t)n);
}
// A key as the server stores it: the store's prefix, then the kit's key.
static void msg_key(Msg *m, const Store *s, const char *key) {
    char full[2 * STORE_KEY_MAX];
    snprintf(full, sizeof full, "%s%s", s->prefix, key);
    msg_bytes(m, full, strlen(full));
}

// Sends m (and frees it), then receives rn bytes of reply into r (rn 0: the query has none).
static int c10d_call(Store *s, Msg *m, void *r, size_t rn, char *err, size_t errlen) {
    double deadline = time_now() + s->timeout_s;
    char why[256];
    int rc = sock_send_all(s->fd, m->b, m->n, deadline, why, sizeof why);
    if (rc == 0 && rn) rc = sock_recv_all(s->fd, r, rn, deadline, why, sizeof why);
    free(m->b);
    *m = (Msg){0};
    if (rc < 0)
        return check_reason(err, errlen, "lost the store at %s (torchrun's agent serves it: did the agent stop, or "
                            "restart the workers?): %s", s->where, why);
    return 0;
}

static int c10d_set(Store *s, const char *key, const void *value, size_t len, char *err, size_t errlen) {
    Msg m = {0};
    msg_u8(&m, C10D_SET);
    msg_key(&m, s, key);
    msg_bytes(&m, value, len);
    return c10d_call(s, &m, NULL, 0, err, errlen);
}

// 1 when key exists, 0 when not, -1 on error.
static int c10d_check(Store *s, const char *key, char *err, size_t errlen) {
    Msg m = {0};
    uint8_t ready;
    msg_u8(&m, C10D_CHECK);
    uint64_t one = 1;
    msg_put(&m, &one, sizeof one);
    msg_key(&m, s, key);
    if (c10d_call(s, &m, &ready, 1, err, errlen) < 0) return -1;
    return ready == C10D_READY;
}

// The value of key, which exists: copied into buf (cap bytes). Returns its length or -1.
static long c10d_get(Store *s, const char *key, void *buf, size_t cap, char *err, size_t errlen) {
    Msg m = {0};
    uint64_t len;
    msg_u8(&m, C10D_GET);
    msg_key(&m, s, key);
    if (c10d_call(s, &m, &len, sizeof len, err, errlen) < 0) return -1;
    if (len > STORE_VALUE_MAX)
        return check_reason(err, errlen, "%s: '%s%s' holds %llu bytes, more than a rendezvous value (%d)", s->where,
                            s->prefix, key, (unsigned long long)len, STORE_VALUE_MAX);
    char *v = xmalloc(len ? (size_t)len : 1), why[256];
    int rc = sock_recv_all(s->fd, v, (size_t)len, time_now() + s->timeout_s, why, sizeof why);
    if (rc == 0 && buf) memcpy(buf, v, (size_t)len < cap ? (size_t)len : cap);
    free(v);
    if (rc < 0) return check_reason(err, errlen, "lost the store at %s: %s", s->where, why);
    return (long)len;
}

// Adds delta to the counter under key (0 when new). Returns 0 with the new value in *out, or -1.
static int c10d_add(Store *s, const char *key, int64_t delta, int64_t *out, char *err, size_t errlen) {
    Msg m = {0};
    msg_u8(&m, C10D_ADD);
    msg_key(&m, s, key);
    msg_put(&m, &delta, sizeof delta);
    return c10d_call(s, &m, out, sizeof *out, err, errlen);
}

// The keys of one job attempt: "/kit/<job id>/<attempt>/" (PyTorch's client puts a "/" before every key, so
// a Python `store.get("kit/...")` finds them). torchrun keeps its store across the restarts of a group and
// numbers them (TORCHELASTIC_RESTART_COUNT): a restarted rank must not find the keys, or the join, of the
// attempt that failed.
static void c10d_prefix(Store *s) {
    const char *attempt = getenv("TORCHELASTIC_RESTART_COUNT");
    snprintf(s->prefix, sizeof s->prefix, "/kit/%.80s/%.16s/", s->job, attempt && *attempt ? attempt : "0");
}

static int open_c10d(Store *s, const char *addr, char *err, size_t errlen) {
    char host[SOCK_ADDR_LEN], why[512];
    if (sock_split_addr(addr, host, sizeof host, &s->port) < 0)
        return check_reason(err, errlen, "'c10d://%s': expected c10d://HOST:PORT with a port in 1..65535", addr);
    snprintf(s->where, sizeof s->where, "%s:%d", host, s->port);
    c10d_prefix(s);
    s->fd = sock_connect(host, s->port, time_now() + s->timeout_s, why, sizeof why);
    if (s->fd < 0)
        return check_reason(err, errlen, "rank %d cannot reach the c10d store (torchrun's agent) at %s: %s", s->rank,
                            s->where, why);
    // The handshake of PyTorch's client: VALIDATE (no reply), then PING, whose nonce must come back.
    Msg m = {0};
    uint32_t magic = C10D_MAGIC, nonce = (uint32_t)getpid() ^ 0x5EED0000u, echo = 0;
    msg_u8(&m, C10D_VALIDATE);
    msg_put(&m, &magic, sizeof magic);
    msg_u8(&m, C10D_PING);
    msg_put(&m, &nonce, sizeof nonce);
    int rc = c10d_call(s, &m, &echo, sizeof echo, why, sizeof why);
    if (rc == 0 && echo != nonce) snprintf(why, sizeof why, "its reply to PING is not the nonce sent");
    if (rc < 0 || echo != nonce)
        return check_reason(err, errlen, "%s does not answer as a PyTorch c10d TCPStore (torchrun's agent store) "
                            "does: %s", s->where, why);
    // Join: a counter per rank, so that a rank number given twice in one attempt is seen (the second gets 2).
    char join[32];
    int64_t n;
    snprintf(join, sizeof join, "__join/%d", s->rank);
    if (c10d_add(s, join, 1, &n, err, errlen) < 0) return -1;
    if (n != 1)
        return check_reason(err, errlen, "%s: refused: rank %d already joined this job's keys (%s): one RANK given "
                            "twice", s->where, s->rank, s->prefix);
    return 0;
}

// ---------------------------------------------------------------- the file store

// Reads every record of the file into t; the caller holds a lock on it (a record is appended whole, under
// an exclusive lock, so a reader under a shared one never sees half of one). Returns 0 or -1.
static int file_read_locked(Store *s, Table *t, char *err, size_t errlen) {
    *t = (Table){0};
    struct stat st;
    if (fstat(s->fd, &st) < 0) return check_reason(err, errlen, "%s: %s", s->where, strerror(errno));
    size_t size = (size_t)st.st_size;
    char *data = xmalloc(size ? size : 1);
    int rc = 0;
    if (size && pread(s->fd, data, size, 0) != (ssize_t)size) rc = check_reason(err, errlen, "%s: short read", s->where);
    for (size_t off = 0; rc == 0 && off < size;) {
        uint32_t kv[2];
        if (off + sizeof kv > size) break;
        memcpy(kv, data + off, sizeof kv);
        if (kv[0] == 0 || kv[0] >= STORE_KEY_MAX || kv[1] > STORE_VALUE_MAX || off + sizeof kv + kv[0] + kv[1] > size) {
            rc = check_reason(err, errlen, "%s is not a store file (or is damaged): delete it, or give the job "
                              "another file", s->where);
            break;
        }
        char key[STORE_KEY_MAX] = {0};
        memcpy(key, data + off + sizeof kv, kv[0]);
        table_put(t, key, data + off + sizeof kv + kv[0], kv[1]);
        off += sizeof kv + kv[0] + kv[1];
    }
    free(data);
    if (rc) table_free(t);
    return rc;
}

static int file_read(Store *s, Table *t, char *err, size_t errlen) {
    if (flock(s->fd, LOCK_SH) < 0) return check_reason(err, errlen, "%s: flock: %s", s->where, strerror(errno));
    int rc = file_read_locked(s, t, err, errlen);
    flock(s->fd, LOCK_UN);
    return rc;
}

static int file_append(Store *s, const char *key, const void *value, uint32_t len, char *err, size_t errlen) {
    uint32_t kv[2] = {(uint32_t)strlen(key), len};
    size_t n = sizeof kv + kv[0] + len;
    char *rec = xmalloc(n);
    memcpy(rec, kv, sizeof kv);
    memcpy(rec + sizeof kv, key, kv[0]);
    memcpy(rec + sizeof kv + kv[0], value, len);
    ssize_t w = write(s->fd, rec, n);  // O_APPEND: one write, at the end, under the exclusive lock
    free(rec);
    if (w != (ssize_t)n) return check_reason(err, errlen, "%s: write: %s", s->where, w < 0 ? strerror(errno) : "short");
    return 0;
}

// Joins the file store: refuses another job's file and a rank number already in it.
static int file_join(Store *s, char *err, size_t errlen) {
    Table t;
    // One exclusive lock over the read and the appends: two ranks joining at once cannot both miss the other.
    if (flock(s->fd, LOCK_EX) < 0) return check_reason(err, errlen, "%s: flock: %s", s->where, strerror(errno));
    if (file_read_locked(s, &t, err, errlen) < 0) {
        flock(s->fd, LOCK_UN);
        return -1;
    }
    int rc = 0;
    char join[32];
    snprintf(join, sizeof join, "__join/%d", s->rank);
    Entry *job = table_find(&t, "__job"), *world = table_find(&t, "__world");
    int32_t w = s->world;
    if (job && (job->len != strlen(s->job) || memcmp(job->value, s->job, job->len) != 0))
        rc = check_reason(err, errlen, "%s: refused: the file belongs to job '%.*s', not '%s': give each job its own "
                          "file", s->where, (int)job->len, job->value, s->job);
    else if (world && (world->len != sizeof w || memcmp(world->value, &w, sizeof w) != 0))
        rc = check_reason(err, errlen, "%s: refused: the job in this file has another WORLD_SIZE than %d", s->where, w);
    else if (table_find(&t, join))
        rc = check_reason(err, errlen, "%s: refused: rank %d already joined this file (left by an earlier run? delete "
                          "it, or give each run its own file)", s->where, s->rank);
    else {
        if (!job) rc = file_append(s, "__job", s->job, (uint32_t)strlen(s->job), err, errlen);
        if (!rc && !world) rc = file_append(s, "__world", &w, sizeof w, err, errlen);
        if (!rc) rc = file_append(s, join, "", 0, err, errlen);
    }
    flock(s->fd, LOCK_UN);
    table_free(&t);
    return rc;
}

// ---------------------------------------------------------------- the interface

const char *store_job_id(void) {
    const char *names[] = {"KIT_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"};
    for (int i = 0; i < 3; i++) {
        const char *v = getenv(names[i]);
        if (v && *v) return v;
    }
    return "none";
}

static int open_tcp(Store *s, const char *addr, char *err, size_t errlen) {
    char host[SOCK_ADDR_LEN];
    size_t alen = strlen(addr);
    // Port 0 (rank 0 only): the system picks a free port, store_port() says which, and the caller hands it to
    // the other ranks. Nothing else can take a port between its choice and its use: the listener holds it.
    bool any_port = alen > 2 && strcmp(addr + alen - 2, ":0") == 0 && s->rank == 0;
    if (any_port && alen - 2 < sizeof host) {
        memcpy(host, addr, alen - 2);
        host[alen - 2] = '\0';
        s->port = 0;
    } else if (sock_split_addr(addr, host, sizeof host, &s->port) < 0)
        return check_reason(err, errlen, "'tcp://%s': expected tcp://HOST:PORT with a port in 1..65535 (0: rank 0 "
                            "only, any free port)", addr);
    double deadline = time_now() + s->timeout_s;
    char why[512];
    if (s->rank == 0) {
        s->listen_fd = sock_listen(s->port, &s->port, why, sizeof why);
        if (s->listen_fd < 0) return check_reason(err, errlen, "rank 0 cannot serve the store: %s", why);
        if (pipe2(s->stop_pipe, O_CLOEXEC) < 0) return check_reason(err, errlen, "pipe: %s", strerror(errno));
        CHECK_PTHREAD(pthread_create(&s->server, NULL, server_main, s));
        s->serving = true;
    }
    snprintf(s->where, sizeof s->where, "%s:%d", host, s->port);
    s->fd = sock_connect(host, s->port, deadline, why, sizeof why);
    if (s->fd < 0)
        return check_reason(err, errlen, "rank %d cannot reach the store (rank 0) at %s: %s", s->rank, s->where, why);
    int32_t rw[2] = {s->rank, s->world};
    uint32_t status;
    if (tcp_request(s, OP_HELLO, s->job, rw, sizeof rw, &status, NULL, 0, err, errlen) < 0) return -1;
    return 0;
}

static int open_file(Store *s, const char *path, char *err, size_t errlen) {
    snprintf(s->where, sizeof s->where, "%s", path);
    s->fd = open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (s->fd < 0) return check_reason(err, errlen, "cannot open the store file %s: %s", path, strerror(errno));
    return file_join(s, err, errlen);
}

Store *store_open(const char *url, const char *job_id, int rank, int world, double timeout_s, char *err,
                  size_t errlen) {
    if (world < 1 || rank < 0 || rank >= world) {
        check_reason(err, errlen, "rank %d of world %d: RANK must be in 0..WORLD_SIZE-1", rank, world);
        return NULL;
    }
    Store *s = xcalloc(1, sizeof *s);
    *s = (Store){.rank = rank, .world = world, .timeout_s = timeout_s > 0 ? timeout_s : 30.0, .fd = -1,
                 .listen_fd = -1, .stop_pipe = {-1, -1}};
    snprintf(s->job, sizeof s->job, "%s", job_id && *job_id ? job_id : "none");
    int rc;
    if (strncmp(url, "tcp://", 6) == 0) rc = open_tcp(s, url + 6, err, errlen);
    else if (strncmp(url, "c10d://", 7) == 0) {
        s->is_c10d = true;
        rc = open_c10d(s, url + 7, err, errlen);
    } else if (strncmp(url, "file://", 7) == 0 && url[7] != '\0') {
        s->is_file = true;
        rc = open_file(s, url + 7, err, errlen);
    } else rc = check_reason(err, errlen, "'%s': a store is tcp://HOST:PORT, c10d://HOST:PORT or file:///PATH", url);
    if (rc < 0) {
        s->rank = -1;  // leave without waiting for anyone, and without removing another job's file
        store_close(s);
        return NULL;
    }
    return s;
}

int store_set(Store *s, const char *key, const void *value, size_t len, char *err, size_t errlen) {
    if (strlen(key) == 0 || strlen(key) >= STORE_KEY_MAX || len > STORE_VALUE_MAX)
        return check_reason(err, errlen, "store_set('%s', %zu bytes): keys are 1..%d bytes, values at most %d", key, len,
                            STORE_KEY_MAX - 1, STORE_VALUE_MAX);
    if (s->is_c10d) return c10d_set(s, key, value, len, err, errlen);
    if (!s->is_file) {
        uint32_t status;
        return tcp_request(s, OP_SET, key, value, (uint32_t)len, &status, NULL, 0, err, errlen) < 0 ? -1 : 0;
    }
    if (flock(s->fd, LOCK_EX) < 0) return check_reason(err, errlen, "%s: flock: %s", s->where, strerror(errno));
    int rc = file_append(s, key, value, (uint32_t)len, err, errlen);
    flock(s->fd, LOCK_UN);
    return rc;
}

// Looks key up once, without waiting: 1 found (value copied, *len set), 0 missing, -1 error.
static int lookup(Store *s, const char *key, void *buf, size_t cap, long *len, char *err, size_t errlen) {
    if (s->is_c10d) {
        int found = c10d_check(s, key, err, errlen);
        if (found == 1 && (*len = c10d_get(s, key, buf, cap, err, errlen)) < 0) return -1;
        return found;
    }
    if (!s->is_file) {
        uint32_t status;
        long n = tcp_request(s, OP_GET, key, NULL, 0, &status, buf, cap, err, errlen);
        if (n < 0) return -1;
        *len = n;
        return status == ST_OK;
    }
    Table t;
    if (file_read(s, &t, err, errlen) < 0) return -1;
    Entry *e = table_find(&t, key);
    if (e) {
        if (buf) memcpy(buf, e->value, e->len < cap ? e->len : cap);
        *len = e->len;
    }
    table_free(&t);
    return e != NULL;
}

// "; ranks that never joined the store: 2, 3 (...)" when some did not.
static void describe_absent(Store *s, char *out, size_t outlen) {
    char list[256] = "";
    int absent = 0;
    for (int r = 0; r < s->world; r++) {
        char join[32], why[64];
        long len;
        snprintf(join, sizeof join, "__join/%d", r);
        if (lookup(s, join, NULL, 0, &len, why, sizeof why) == 0) {
            size_t used = strlen(list);
            if (used < sizeof list - 16) snprintf(list + used, sizeof list - used, "%s%d", absent ? ", " : "", r);
            absent++;
        }
    }
    if (absent)
        snprintf(out, outlen, "; rank%s %s never joined the store (not started, crashed before, or started with "
                 "another %s or job id)", absent == 1 ? "" : "s", list, s->is_file ? "file" : "MASTER_ADDR:MASTER_PORT");
    else
        snprintf(out, outlen, "; every rank joined the store: the missing ones stopped (or are slow) before setting them");
}

int store_wait(Store *s, const char *const *keys, int n, char *err, size_t errlen) {
    double start = time_now(), deadline = start + s->timeout_s, pause = 0.002;
    bool *have = xcalloc((size_t)(n > 0 ? n : 1), sizeof *have);
    int missing = n, rc = 0;
    for (;;) {
        for (int i = 0; i < n; i++) {
            long len;
            if (have[i]) continue;
            int r = lookup(s, keys[i], NULL, 0, &len, err, errlen);
            if (r < 0) {
                rc = -1;
                goto out;
            }
            if (r == 1) {
                have[i] = true;
                missing--;
            }
        }
        if (missing == 0) goto out;
        if (time_now() >= deadline) break;
        usleep((useconds_t)(pause * 1e6));
        pause = pause < 0.05 ? pause * 2 : 0.05;  // quick at first, then a light poll
    }
    char list[512] = "", absent[320];
    int shown = 0;
    for (int i = 0; i < n; i++) {
        if (have[i]) continue;
        size_t used = strlen(list);
        if (shown++ < 8) snprintf(list + used, sizeof list - used, "%s'%s'", shown > 1 ? ", " : "", keys[i]);
    }
    if (shown > 8) snprintf(list + strlen(list), sizeof list - strlen(list), " and %d more", shown - 8);
    describe_absent(s, absent, sizeof absent);
    rc = check_reason(err, errlen, "rank %d waited %.1f s at %s for %s%s", s->rank, time_now() - start, s->where, list,
                      absent);
out:
    free(have);
    return rc;
}

long store_get(Store *s, const char *key, void *buf, size_t cap, char *err, size_t errlen) {
    const char *keys[1] = {key};
    if (store_wait(s, keys, 1, err, errlen) < 0) return -1;
    long len = 0;
    return lookup(s, key, buf, cap, &len, err, errlen) == 1 ? len : -1;
}

int store_barrier(Store *s, const char *name, char *err, size_t errlen) {
    char mine[STORE_KEY_MAX];
    snprintf(mine, sizeof mine, "%s/%d", name, s->rank);
    if (store_set(s, mine, "", 0, err, errlen) < 0) return -1;
    char (*names)[STORE_KEY_MAX] = xmalloc((size_t)s->world * sizeof *names);
    const char **keys = xmalloc((size_t)s->world * sizeof *keys);
    for (int r = 0; r < s->world; r++) {
        snprintf(names[r], sizeof names[r], "%s/%d", name, r);
        keys[r] = names[r];
    }
    int rc = store_wait(s, keys, s->world, err, errlen);
    free(keys);
    free(names);
    return rc;
}

int store_rank(const Store *s) { return s->rank; }
int store_world(const Store *s) { return s->world; }
double store_timeout(const Store *s) { return s->timeout_s; }
int store_fd(const Store *s) { return s->is_file ? -1 : s->fd; }
int store_port(const Store *s) { return s->is_file ? 0 : s->port; }

// Rank 0 waits until every rank that joined has left; the others only say they leave.
static int leave(Store *s, char *err, size_t errlen) {
    char mine[32];
    snprintf(mine, sizeof mine, "__leave/%d", s->rank);
    if (store_set(s, mine, "", 0, err, errlen) < 0) return -1;
    if (s->rank != 0) return 0;
    char (*names)[32] = xmalloc((size_t)s->world * sizeof *names);
    const char **keys = xmalloc((size_t)s->world * sizeof *keys);
    int n = 0;
    for (int r = 0; r < s->world; r++) {
        long len;
        snprintf(names[n], sizeof names[n], "__join/%d", r);
        if (lookup(s, names[n], NULL, 0, &len, err, errlen) != 1) continue;  // never came: nothing to wait for
        snprintf(names[n], sizeof names[n], "__leave/%d", r);
        keys[n] = names[n];
        n++;
    }
    int rc = store_wait(s, keys, n, err, errlen);
    free(keys);
    free(names);
    return rc;
}

void store_close(Store *s) {
    if (!s) return;
    char err[1024];
    // A rank that is already gone only costs the timeout here; whatever waited for it before reported it.
    // A c10d store outlives the job (its agent serves it): nobody has to wait before leaving it.
    if (s->is_c10d) {}
    else if (s->rank == 0 && s->fd >= 0 && leave(s, err, sizeof err) < 0)
        fprintf(stderr, "warning: closing the store: %s\n", err);
    else if (s->rank > 0 && s->fd >= 0)
        leave(s, err, sizeof err);
    if (s->serving) {
        if (write(s->stop_pipe[1], "x", 1) != 1) {}
        pthread_join(s->server, NULL);
    }
    if (s->fd >= 0) close(s->fd);
    if (s->listen_fd >= 0) close(s->listen_fd);
    for (int i = 0; i < 2; i++)
        if (s->stop_pipe[i] >= 0) close(s->stop_pipe[i]);
    if (s->is_file && s->rank == 0) unlink(s->where);
    table_free(&s->table);
    free(s);
}
