// kit/store.h: the rendezvous store (lesson 07): how processes started WITHOUT mpirun find each other, as
// torchrun's TCPStore and PyTorch's init_method="tcp://..." / "file://..." do.
//
//   Store *s = store_open("tcp://10.0.0.1:29500", job, rank, world, 30.0, err, sizeof err);
//   store_set(s, "addr/3", text, len, ...);              // any rank publishes a value under a key
//   store_get(s, "nccl-id", buf, sizeof buf, ...);       // any rank reads it, waiting until it exists
//
// Two kinds, one interface:
//   tcp://HOST:PORT   rank 0 serves the store (a thread) on PORT; every rank, rank 0 included, connects to
//                     HOST:PORT. HOST must be rank 0's address as the other nodes reach it (MASTER_ADDR).
//                     PORT 0 (rank 0 only): any free port, which store_port() reports for the other ranks.
//   c10d://HOST:PORT  a PyTorch c10d TCPStore that someone else serves (torchrun's agent, when it sets
//                     TORCHELASTIC_USE_AGENT_STORE=True): every rank is a client; the kit's keys live under
//                     "kit/<job id>/<TORCHELASTIC_RESTART_COUNT>/" (as a PyTorch client names them), apart from torchrun's and from an earlier
//                     attempt's.
//   file://PATH       a file on a file system every rank sees (NFS, Lustre; /tmp for one node). No server,
//                     no port: the ranks append records under a lock and read the file back.
//
// Every wait has the store's timeout. When keys never come, the error names them and, separately, the ranks
// that never joined the store at all (never started, or started with another address).
//
// One store, one job: a rank joins with the job id (KIT_RUN_ID, or torchrun's TORCHELASTIC_RUN_ID, or
// SLURM_JOB_ID) and its rank. A rank of another job, or a second rank with a number already taken (a second
// job with the same id, an old file left by an earlier run), is refused with the reason.
#ifndef KIT_STORE_H
#define KIT_STORE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct Store Store;

#define STORE_KEY_MAX 128     // bytes of a key
#define STORE_VALUE_MAX 65536 // bytes of a value

// The job id a store is shared under: KIT_RUN_ID, TORCHELASTIC_RUN_ID or SLURM_JOB_ID, else "none".
const char *store_job_id(void);

// Opens (rank 0 of a tcp store: also serves) the store at url and joins it as `rank` of `world`. Returns NULL
// with the reason in err: a malformed url, port in use (rank 0), master unreachable within the timeout, job
// refused (another job's store, rank already taken).
Store *store_open(const char *url, const char *job_id, int rank, int world, double timeout_s, char *err,
                  size_t errlen);
// Publishes value (len bytes, at most STORE_VALUE_MAX) under key. A key set twice keeps the last value.
int store_set(Store *s, const char *key, const void *value, size_t len, char *err, size_t errlen);
// Waits (the store's timeout) until key exists, then copies its value into buf (cap bytes). Returns the
// value's length (more than cap: truncated to cap), or -1 (timeout: the reason names the key).
long store_get(Store *s, const char *key, void *buf, size_t cap, char *err, size_t errlen);
// Waits until all n keys exist. Returns 0, or -1 when the timeout passes first: err lists the missing keys
// and the ranks that never joined the store.
int store_wait(Store *s, const char *const *keys, int n, char *err, size_t errlen);
// Every rank calls it with the same name: returns when all `world` ranks have; on timeout, err names the
// ranks that did not come.
int store_barrier(Store *s, const char *name, char *err, size_t errlen);

int store_rank(const Store *s);
int store_world(const Store *s);
double store_timeout(const Store *s);
// The connected socket to the tcp store (-1 for a file store): its local address is the interface that
// reaches the master (kit/sock.h sock_local_address).
int store_fd(const Store *s);
// The port of a tcp or c10d store (for rank 0 of a tcp://HOST:0 url: the one the system chose); 0 for a file.
int store_port(const Store *s);
// Leaves the store. Rank 0 of a tcp or file store waits (the timeout) until every rank has left, then stops serving (tcp) or removes
// the file (file), so that no rank loses the store while it still reads from it.
void store_close(Store *s);

#ifdef __cplusplus
}
#endif

#endif // KIT_STORE_H
