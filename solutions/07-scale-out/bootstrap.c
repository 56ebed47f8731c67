// bootstrap.c: lesson 07, how processes that nobody introduced become one job (what torchrun and
// init_process_group(init_method="tcp://..." or "file://...") do before the first collective).
//
// mpirun starts every rank itself, so each process is born knowing its rank, the world and how to reach the
// others. A job started any other way (torchrun, a Slurm script that runs one process per task, a shell loop
// over ssh) gets only a few environment variables and must introduce its ranks itself:
//
//   every rank: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT from the environment   (TODO 1a)
//               -> join the store at MASTER_ADDR:MASTER_PORT, served by rank 0, or a shared file (TODO 1b)
//               -> publish its host name, read everyone's: which ranks share a node      (TODO 3, TODO 4)
//   rank 0:     -> publish where its process group listens (or, on GPUs, NCCL's unique id) (TODO 2)
//   every rank: -> connect; from here on the store is not needed
//
// The store is tiny (a few keys per rank) and slow (every wait polls it): it only carries addresses. The
// gradients go over the connections it helped to make.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kit/check.h"
#include "kit/dist.h"
#include "kit/log.h"
#include "kit/sock.h"
#include "kit/store.h"
#include "lesson.h"

// ---------------------------------------------------------------- the environment (TODO 1)

// Reads a non-negative integer from the environment variable `name` into *out. -1 with a reason when it is
// missing or not a number.
static int env_int(const char *name, int *out, char *err, size_t errlen) {
    const char *v = getenv(name);
    if (!v || !*v) return check_reason(err, errlen, "%s is not set", name);
    char *end;
    long x = strtol(v, &end, 10);
    if (*end != '\0' || x < 0 || x > 1000000) return check_reason(err, errlen, "%s='%s' is not a number >= 0", name, v);
    *out = (int)x;
    return 0;
}

// TODO 1a: what a launcher (torchrun, srun with the kit's script, your own loop) tells each process, into *e.
//   Must hold: e->rank numbers the ranks of the whole job and e->local_rank those of this node (-1 when the
//   launcher gave none: TODO 4 finds it); e->world is the job's size, and a rank outside it is an error.
//   e->url names the store: init_method itself unless it is "env"; for "env", the one at
//   MASTER_ADDR:MASTER_PORT, which rank 0 serves (tcp://), unless torchrun's agent serves one there already
//   (TORCHELASTIC_USE_AGENT_STORE=True): then the ranks join that one (c10d://). MASTER_PORT 0 ("any free
//   port") is for rank 0 alone. Every error names the variable, so that a typo in a job script is found at
//   one look.
// PyTorch: dist.init_process_group(init_method="env://")  reads the same five variables
int rdzv_env_read(RdzvEnv *e, const char *init_method, char *err, size_t errlen) {
    // BEGIN SOLUTION
    *e = (RdzvEnv){.local_rank = -1};
    if (env_int("WORLD_SIZE", &e->world, err, errlen) < 0 || env_int("RANK", &e->rank, err, errlen) < 0) return -1;
    if (e->world < 1) return check_reason(err, errlen, "WORLD_SIZE=%d: a job has at least one rank", e->world);
    if (e->rank >= e->world)
        return check_reason(err, errlen, "RANK=%d is outside 0..WORLD_SIZE-1 (WORLD_SIZE=%d)", e->rank, e->world);
    if (getenv("LOCAL_RANK") && env_int("LOCAL_RANK", &e->local_rank, err, errlen) < 0) return -1;
    if (init_method && strcmp(init_method, "env") != 0) {
        snprintf(e->url, sizeof e->url, "%s", init_method);
        return 0;
    }
    const char *addr = getenv("MASTER_ADDR"), *agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
    int port;
    if (!addr || !*addr) return check_reason(err, errlen, "MASTER_ADDR is not set (rank 0's host, as the others reach it)");
    if (env_int("MASTER_PORT", &port, err, errlen) < 0) return -1;
    bool by_agent = agent && strcmp(agent, "True") == 0;
    if (port == 0 && by_agent)  // torchrun's static rendezvous passes --master-port on as it was given
        return check_reason(err, errlen, "MASTER_PORT=0: torchrun bound a free port for its store but passes 0 on; "
                            "give --master-port a port, or let the c10d rendezvous choose one (--standalone, or "
                            "--rdzv-backend c10d --rdzv-endpoint HOST:0)");
    if (port > 65535) return check_reason(err, errlen, "MASTER_PORT=%d is not a port (1..65535)", port);
    if (port == 0 && e->rank != 0)  // rank 0 may serve on any free port: it says which, the others need that one
        return check_reason(err, errlen, "MASTER_PORT=0 is for rank 0 only (it serves the store on a free port and "
                            "prints it): start rank %d with that port", e->rank);
    // torchrun's agent already serves a store there: join it, never serve a second one on its port.
    snprintf(e->url, sizeof e->url, "%s://%s:%d", by_agent ? "c10d" : "tcp", addr, port);
    return 0;
    // STARTER: (void)init_method, (void)env_int;
    // STARTER: *e = (RdzvEnv){.local_rank = -1};
    // STARTER: return check_reason(err, errlen, "TODO 1a: rdzv_env_read is not written yet");
    // END SOLUTION
}

// TODO 1b: join the store of e as its rank of its world, giving up after timeout_s. Must hold: two jobs that
//   picked the same port or file never mix their ranks (the kit's store can refuse another job's rank only
//   when it knows each rank's job: kit/store.h).
// PyTorch: dist.TCPStore(MASTER_ADDR, MASTER_PORT, world_size, is_master=(rank == 0))
Store *rdzv_open(const RdzvEnv *e, double timeout_s, char *err, size_t errlen) {
    // BEGIN SOLUTION
    return store_open(e->url, store_job_id(), e->rank, e->world, timeout_s, err, errlen);
    // STARTER: (void)e, (void)timeout_s;
    // STARTER: check_reason(err, errlen, "TODO 1b: rdzv_open is not written yet");
    // STARTER: return NULL;
    // END SOLUTION
}

// ---------------------------------------------------------------- rank 0's bytes to everyone (TODO 2)

// TODO 2: rank 0's len bytes at buf reach every other rank's buf, under key. Must hold: a rank waits (within
//   the store's timeout) until they are there; a value of another length than len is an error (a rank of
//   another build or version). This is how NCCL's unique id travels on GPUs, and how rank 0's socket-backend
//   address does here.
// PyTorch: inside init_process_group("nccl"): rank 0 store.set("ncclUniqueId", id); the others store.get(...)
int bootstrap_share(Store *s, const char *key, void *buf, size_t len, char *err, size_t errlen) {
    // BEGIN SOLUTION
    if (store_rank(s) == 0) return store_set(s, key, buf, len, err, errlen);
    long got = store_get(s, key, buf, len, err, errlen);
    if (got < 0) return -1;
    if ((size_t)got != len)
        return check_reason(err, errlen, "'%s' from rank 0 has %ld bytes, this rank expected %zu (the same program "
                            "on every rank?)", key, got, len);
    return 0;
    // STARTER: (void)s, (void)key, (void)buf, (void)len;
    // STARTER: return check_reason(err, errlen, "TODO 2: bootstrap_share is not written yet");
    // END SOLUTION
}

// ---------------------------------------------------------------- everyone's bytes to everyone (TODO 3)

// TODO 3: every rank's len bytes `mine` reach every rank: rank r's at all + r * len. Rank r publishes under
//   "<key>/<r>" (e.g. "host/3": the kit's ring and the checks read these names). Must hold: a rank that never
//   comes is an error within the store's timeout, never a hang, and the error names EVERY key and rank that
//   is missing, not only the first.
// PyTorch: dist.all_gather_object before the process group exists: one store.set per rank, store.get of all
int bootstrap_allgather(Store *s, const char *key, const void *mine, size_t len, void *all, char *err,
                        size_t errlen) {
    // BEGIN SOLUTION
    int world = store_world(s);
    char (*names)[STORE_KEY_MAX] = xmalloc((size_t)world * sizeof *names);
    const char **keys = xmalloc((size_t)world * sizeof *keys);
    for (int r = 0; r < world; r++) {
        snprintf(names[r], sizeof names[r], "%s/%d", key, r);
        keys[r] = names[r];
    }
    int rc = store_set(s, keys[store_rank(s)], mine, len, err, errlen);
    if (rc == 0) rc = store_wait(s, keys, world, err, errlen);
    for (int r = 0; r < world && rc == 0; r++) {
        long got = store_get(s, keys[r], (char *)all + (size_t)r * len, len, err, errlen);
        if (got >= 0 && (size_t)got != len)
            rc = check_reason(err, errlen, "'%s' has %ld bytes, expected %zu", keys[r], got, len);
        else if (got < 0) rc = -1;
    }
    free(keys);
    free(names);
    return rc;
    // STARTER: (void)s, (void)key, (void)mine, (void)len, (void)all;
    // STARTER: return check_reason(err, errlen, "TODO 3: bootstrap_allgather is not written yet");
    // END SOLUTION
}

// ---------------------------------------------------------------- the node map (TODO 4)

// TODO 4: where does rank `rank` run? Ranks with the same host name share a node. Must hold: rank 0's node is
//   node 0 and the others are numbered as they first appear in rank order, whatever the names (they need not
//   sort that way); the ranks of a node are numbered in rank order (its local rank). This is what mpirun's MPI_COMM_TYPE_SHARED split told lesson 03, found from names alone: with
//   one rank per GPU, the local rank is the GPU a rank drives.
// PyTorch: torchrun sets LOCAL_RANK itself (it starts the processes of its node); Lightning reads it back.
NodeMap rdzv_node_map(const char (*hosts)[RDZV_HOST_LEN], int world, int rank) {
    NodeMap m = {0};
    // BEGIN SOLUTION
    int *node_of = xmalloc((size_t)world * sizeof *node_of);  // (world) each rank's node
    for (int r = 0; r < world; r++) {
        int first = r;  // the lowest rank on r's host
        for (int q = 0; q < r && first == r; q++)
            if (strcmp(hosts[q], hosts[r]) == 0) first = q;
        node_of[r] = first == r ? m.nodes++ : node_of[first];
        if (strcmp(hosts[r], hosts[rank]) == 0) {
            m.local_world++;
            if (r < rank) m.local_rank++;
        }
    }
    m.node = node_of[rank];
    free(node_of);
    // STARTER: (void)hosts, (void)world, (void)rank;
    // END SOLUTION
    return m;
}

// ---------------------------------------------------------------- given: the start without mpirun

// The host name that says which ranks share a node. KIT_NODE_NAME overrides it: several "nodes" on one
// machine (network namespaces share the host name), or a name that a cluster spells two ways.
static void node_name(char out[RDZV_HOST_LEN]) {
    const char *forced = getenv("KIT_NODE_NAME");
    memset(out, 0, RDZV_HOST_LEN);
    if (forced && *forced) snprintf(out, RDZV_HOST_LEN, "%s", forced);
    else if (gethostname(out, RDZV_HOST_LEN - 1) < 0) snprintf(out, RDZV_HOST_LEN, "unknown");
}

#define RDZV_HINT                                                                                                  \
    "rank 0 serves the store at MASTER_ADDR:MASTER_PORT: every rank needs the same pair, and MASTER_ADDR must be an " \
    "address of rank 0's node that the other nodes can reach (not 127.0.0.1 across nodes). 'port in use': another "  \
    "job (or one still exiting) has it: pick another MASTER_PORT. 'refused': two jobs share the port or file, or a " \
    "RANK is given twice. A rank that 'never joined' did not start, or started with other settings."

// Stops this rank with the reason (prefixed with the rank unless it names one already) and the hint.
static void rdzv_fail(int line, const char *call, int rank, const char *err) __attribute__((noreturn));
static void rdzv_fail(int line, const char *call, int rank, const char *err) {
    if (strncmp(err, "rank ", 5) == 0) check_failf(__FILE__, line, call, RDZV_HINT, "%s", err);
    check_failf(__FILE__, line, call, RDZV_HINT, "rank %d: %s", rank, err);
}

void scaleout_check_init_method(const char *m) {
    const char *kinds[] = {"tcp://", "c10d://", "file://"};
    bool ok = m && strcmp(m, "env") == 0;
    for (int i = 0; i < 3 && m && !ok; i++) ok = strncmp(m, kinds[i], strlen(kinds[i])) == 0 && m[strlen(kinds[i])];
    if (!ok)
        check_failf(__FILE__, __LINE__, "--init-method", "env reads MASTER_ADDR/MASTER_PORT (torchrun sets them); "
                    "tcp://HOST:PORT: rank 0 serves the store there; c10d://HOST:PORT: join a PyTorch TCPStore served "
                    "by someone else (torchrun's agent); file:///PATH: a file every rank sees",
                    "--init-method '%s' is not a store this program knows", m ? m : "");
}

bool scaleout_started_by_mpi(void) {
    // mpirun (Open MPI) and srun --mpi=pmix put these in every rank's environment; torchrun does not.
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
}

ProcessGroup *scaleout_setup_store(const TrainOptions *o, Device dev) {
    char err[2048];
    RdzvEnv e;
    Store *s;
    if (rdzv_env_read(&e, o->init_method, err, sizeof err) < 0)
        check_failf(__FILE__, __LINE__, "rdzv_env_read",
                    "without mpirun every process needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, as torchrun "
                    "sets them: RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 ./train & RANK=1 ...",
                    "%s", err);
    s = rdzv_open(&e, o->timeout_s, err, sizeof err);
    if (!s) rdzv_fail(__LINE__, "rdzv_open", e.rank, err);
    // MASTER_PORT=0: rank 0 took a port no other process held; the other ranks are started once it says which.
    size_t ulen = strlen(e.url);
    if (e.rank == 0 && ulen > 2 && strcmp(e.url + ulen - 2, ":0") == 0) {
        printf("store: rank 0 serves the store on port %d (MASTER_PORT=0): start the other ranks with "
               "MASTER_PORT=%d\n", store_port(s), store_port(s));
        fflush(stdout);
    }
    return scaleout_setup_on(s, &e, o, dev);
}

ProcessGroup *scaleout_setup_on(Store *s, const RdzvEnv *env, const TrainOptions *o, Device dev) {
    char err[2048];
    RdzvEnv e = *env;
    // Who shares a node: from every rank's host name.
    char me[RDZV_HOST_LEN];
    node_name(me);
    char (*hosts)[RDZV_HOST_LEN] = xcalloc((size_t)e.world, sizeof *hosts);
    if (bootstrap_allgather(s, "host", me, RDZV_HOST_LEN, hosts, err, sizeof err) < 0)
        rdzv_fail(__LINE__, "bootstrap_allgather", e.rank, err);
    NodeMap nm = rdzv_node_map((const char (*)[RDZV_HOST_LEN])hosts, e.world, e.rank);
    free(hosts);
    if (e.local_rank >= 0 && e.local_rank != nm.local_rank)
        fprintf(stderr, "rank %d: LOCAL_RANK=%d, but the host names say local rank %d: using LOCAL_RANK\n", e.rank,
                e.local_rank, nm.local_rank);

    // Rank 0 listens first (any free port), then publishes where: the others connect when they read it.
    PgPeers peers = {.rank = e.rank, .world = e.world, .local_rank = e.local_rank >= 0 ? e.local_rank : nm.local_rank,
                     .local_world = nm.local_world, .listen_fd = -1};
    if (e.rank == 0) {
        int port;
        char host[40]  /* an IPv4 address in text */;
        peers.listen_fd = sock_listen(0, &port, err, sizeof err);
        if (peers.listen_fd < 0 || sock_local_address(store_fd(s), host, sizeof host, err, sizeof err) < 0)
            check_failf(__FILE__, __LINE__, "rank 0's listener", "KIT_SOCKET_IFNAME must name an interface of this "
                        "node that the other nodes reach (ip -br addr lists them)", "%s", err);
        snprintf(peers.root_addr, sizeof peers.root_addr, "%s:%d", host, port);
    }
    if (bootstrap_share(s, "pg-root", peers.root_addr, sizeof peers.root_addr, err, sizeof err) < 0)
        rdzv_fail(__LINE__, "bootstrap_share", e.rank, err);
    // On GPUs the same road carries NCCL's unique id: rank 0 makes it, every rank hands it to NCCL.
    unsigned char nccl_id[PG_NCCL_ID_BYTES] = {0};
    if (dev == DEVICE_CUDA) {
        if (e.rank == 0) pg_nccl_unique_id(nccl_id);  // zeros when the kit has no NCCL: then nothing reads them
        if (bootstrap_share(s, "nccl-id", nccl_id, sizeof nccl_id, err, sizeof err) < 0)
            rdzv_fail(__LINE__, "bootstrap_share", e.rank, err);
        peers.nccl_id = nccl_id;
    }
    peers.node = me;
    store_close(s);  // every rank has the address now; rank 0 waits here until all have left the store
    return pg_init_socket(&peers, o->backend, dev, o->timeout_s);
}

void scaleout_print_mapping(ProcessGroup *pg, const char *host) {
    int world = pg_world(pg), rank = pg_rank(pg);
    // Host memory doubles are the one collective every backend has for any device: each rank fills its own
    // row (its name, one character per double, and its local rank), the sum is everybody's rows.
    enum { ROW = RDZV_HOST_LEN + 2 };
    double *rows = xcalloc((size_t)world * ROW, sizeof *rows);
    for (int i = 0; i < RDZV_HOST_LEN - 1 && host[i]; i++) rows[(size_t)rank * ROW + (size_t)i] = (unsigned char)host[i];
    rows[(size_t)rank * ROW + RDZV_HOST_LEN] = pg_local_rank(pg);
    rows[(size_t)rank * ROW + RDZV_HOST_LEN + 1] = pg_local_world(pg);
    pg_allreduce_sum_double_host(pg, rows, world * ROW);
    char (*hosts)[RDZV_HOST_LEN] = xcalloc((size_t)world, sizeof *hosts);
    for (int r = 0; r < world; r++)
        for (int i = 0; i < RDZV_HOST_LEN - 1; i++) hosts[r][i] = (char)rows[(size_t)r * ROW + (size_t)i];
    if (rank == 0) {
        NodeMap first = rdzv_node_map((const char (*)[RDZV_HOST_LEN])hosts, world, 0);
        if (first.nodes < 1)  // no rank runs on no node: rdzv_node_map left its answer empty
            printf("mapping: TODO 4 is missing: rdzv_node_map says %d nodes for %d rank%s (write it in bootstrap.c)\n",
                   first.nodes, world, world == 1 ? "" : "s");
        printf("mapping: %d rank%s on %d node%s\n", world, world == 1 ? "" : "s", first.nodes, first.nodes == 1 ? "" : "s");
        for (int r = 0; r < world; r++) {
            NodeMap m = rdzv_node_map((const char (*)[RDZV_HOST_LEN])hosts, world, r);
            printf("  rank %d: node %d (%s), local rank %d of %d\n", r, m.node, hosts[r],
                   (int)rows[(size_t)r * ROW + RDZV_HOST_LEN], (int)rows[(size_t)r * ROW + RDZV_HOST_LEN + 1]);
        }
    }
    free(hosts);
    free(rows);
}
