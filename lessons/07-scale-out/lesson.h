// lesson.h: the functions you write in lesson 07, shared by train.c, bootstrap.c, ring.c and the autograder.
//
// Lesson 03's DDP comes complete from its solution (solutions/03-ddp/lesson.h: ddp_step, ddp_evaluate, ...), and
// lesson 04's program with checkpoints from its own (solutions/04-checkpoint/lesson.h: run_program).
// The kit supplies the rendezvous store (kit/store.h: a key-value table served by rank 0 over TCP, or kept in a
// shared file), sockets with deadlines (kit/sock.h) and the process group's socket backend (kit/dist.h,
// pg_init_socket). You write how processes that nobody introduced find each other, and an all-reduce.
#ifndef LESSON07_H
#define LESSON07_H

#include "solutions/04-checkpoint/lesson.h"  // lesson 03's DDP (it includes solutions/03-ddp/lesson.h) and the checkpoints
#include "kit/cli.h"
#include "kit/dist.h"
#include "kit/model.h"
#include "kit/sock.h"
#include "kit/store.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RDZV_HOST_LEN 64

// What a launcher (torchrun, srun with the kit's Slurm script, your own shell loop) tells each process.
typedef struct {
    int rank;          // RANK: 0..world-1
    int world;         // WORLD_SIZE
    int local_rank;    // LOCAL_RANK: rank among the processes of this node (-1: not given)
    char url[1100];    // the store: tcp://MASTER_ADDR:MASTER_PORT, or what --init-method named
} RdzvEnv;

// Where each rank runs, from every rank's host name.
typedef struct {
    int node;          // this rank's node: 0 for the node of rank 0, then in order of first appearance
    int nodes;         // how many nodes
    int local_rank;    // rank among the ranks of its node, in rank order
    int local_world;   // ranks on its node
} NodeMap;

// A ring of TCP connections: each rank to the next, (rank + 1) % world, and from the previous.
typedef struct {
    int rank, world;
    int next_fd, prev_fd;  // -1 when world == 1
    double timeout_s;
    float *scratch;        // a buffer ring_allreduce may keep from call to call (NULL: none yet); ring_close frees it
} Ring;

// ---------------------------------------------------------------- what you write (bootstrap.c)

// TODO 1a: fills *e from the environment (RANK, WORLD_SIZE, LOCAL_RANK; MASTER_ADDR and MASTER_PORT when
// init_method is "env", else init_method itself is the url). Returns 0, or -1 with a reason naming the
// variable that is missing or wrong.
int rdzv_env_read(RdzvEnv *e, const char *init_method, char *err, size_t errlen);
// TODO 1b: joins the store of e (kit/store.h) under this job's id. NULL with the reason in err.
Store *rdzv_open(const RdzvEnv *e, double timeout_s, char *err, size_t errlen);

// TODO 2: rank 0's len bytes at buf reach every rank's buf, under key. Returns 0 or -1 (err: why).
int bootstrap_share(Store *s, const char *key, void *buf, size_t len, char *err, size_t errlen);

// TODO 3: every rank's len bytes `mine` -> all (world, len): rank r's bytes at all + r * len, on every rank.
// Returns 0 or -1 (err: why, naming the ranks that did not come).
int bootstrap_allgather(Store *s, const char *key, const void *mine, size_t len, void *all, char *err,
                        size_t errlen);

// TODO 4: this rank's place, from every rank's host name (hosts: (world) names of RDZV_HOST_LEN bytes).
NodeMap rdzv_node_map(const char (*hosts)[RDZV_HOST_LEN], int world, int rank);

// ---------------------------------------------------------------- what you write (ring.c)

// TODO 5: sums buf (n floats) over the ring's ranks, in place, with a reduce-scatter and an all-gather.
// Returns 0, or -1 (err: which step failed and the peer's state).
int ring_allreduce(Ring *ring, float *buf, size_t n, char *err, size_t errlen);

// ---------------------------------------------------------------- given

// Connects the ring through the store: every rank publishes its listener's address (TODO 3), connects to the
// next rank and accepts the previous. Returns 0 or -1 (err). ring_close frees its sockets and scratch.
int ring_connect(Store *s, Ring *ring, char *err, size_t errlen);
void ring_close(Ring *ring);

// The start without mpirun (TODO 1-4 together): reads the environment, joins the store, gathers host names
// (the node map), shares rank 0's process-group address and starts the socket backend. Prints one line per
// rank: its rank, local rank and node. Errors end the process with the reason and a HINT.
ProcessGroup *scaleout_setup_store(const TrainOptions *o, Device dev);
// Its second half, on a store already open (e: what rdzv_env_read gave): host names, the node map, rank 0's
// address, the socket backend. Closes the store.
ProcessGroup *scaleout_setup_on(Store *s, const RdzvEnv *e, const TrainOptions *o, Device dev);
// mpirun or srun started this process (their environment is there): the start of lesson 03.
bool scaleout_started_by_mpi(void);
// Ends the process with a usage error unless init_method is one the store start understands: env, tcp://HOST:PORT,
// c10d://HOST:PORT or file:///PATH (checked on every start, mpirun's included, so that a typo is never ignored).
void scaleout_check_init_method(const char *init_method);
// Prints this rank's place (rank, local rank, node, host) in rank order: the check of a hostfile or --map-by.
void scaleout_print_mapping(ProcessGroup *pg, const char *host);

// The training of lesson 03 (its ddp_train), on whatever process group: returns the model (the caller frees it). The
// autograder trains through it on both starts and compares the weights.
Model *scaleout_train(ProcessGroup *pg, const TrainOptions *o);

#ifdef __cplusplus
}
#endif

#endif // LESSON07_H
