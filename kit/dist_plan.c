// kit/dist_plan.c: the parts of the process group that need neither MPI nor a GPU (see dist_plan.h): the
// backend table and choice, buffer hashing, the stalled-rank report. Kept apart from dist.c so the unit tests
// can check them without mpirun, and so they link without MPI.
#include "kit/dist_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "kit/check.h"

// The one table of backend names: --backend's choices, the checks and the messages all come from it.
static const struct {
    const char *name;
    bool mpirun, store;  // which starts can run it (PgStart)
} BACKENDS[] = {
    {"auto", true, true},
    {"mpi", true, false},
    {"nccl", true, true},
    {"socket", false, true},
};
#define N_BACKENDS (int)(sizeof BACKENDS / sizeof BACKENDS[0])

const char *pg_backend_name(PgBackend b) {
    return b == PG_BACKEND_NCCL ? "nccl" : b == PG_BACKEND_SOCKET ? "socket" : "mpi";
}

static const char *backend_at(int i) { return BACKENDS[i].name; }

const char *pg_backend_choices(void) {
    static char names[64];
    return check_names(names, sizeof names, N_BACKENDS, backend_at);
}

// "auto, mpi or nccl": the names a start can run, for messages.
static void startable_names(PgStart start, char *out, size_t len) {
    const char *names[N_BACKENDS];
    int n = 0;
    for (int i = 0; i < N_BACKENDS; i++)
        if (start == PG_START_MPIRUN ? BACKENDS[i].mpirun : BACKENDS[i].store) names[n++] = BACKENDS[i].name;
    out[0] = '\0';
    for (int i = 0; i < n; i++) check_join(out, len, i == n - 1 ? " or " : ", ", names[i]);
}

bool pg_backend_startable(const char *requested, PgStart start, char *why, size_t why_len) {
    const char *req = requested ? requested : "auto";
    char names[64];
    startable_names(start, names, sizeof names);
    for (int i = 0; i < N_BACKENDS; i++) {
        if (strcmp(req, BACKENDS[i].name) != 0) continue;
        if (start == PG_START_MPIRUN ? BACKENDS[i].mpirun : BACKENDS[i].store) return true;
        if (start == PG_START_STORE)
            snprintf(why, why_len, "--backend %s needs mpirun (or srun) to start the job; a job started from a "
                     "rendezvous store (RANK/WORLD_SIZE/MASTER_ADDR, torchrun-style) takes --backend %s", req, names);
        else
            snprintf(why, why_len, "--backend %s is for jobs started from a rendezvous store without mpirun "
                     "(lesson 07); under mpirun use %s", req, names);
        return false;
    }
    snprintf(why, why_len, "unknown backend '%s': use %s", req, names);
    return false;
}

// Why NCCL cannot run here, or NULL when it can.
static const char *nccl_blocker(Device dev, bool nccl_built, int ranks_per_gpu, char *buf, size_t len) {
    if (!nccl_built) return "this binary was built without NCCL (it needs CUDA and nccl.h at build time)";
    if (dev != DEVICE_CUDA) return "NCCL works on GPU memory only and the device is cpu";
    if (ranks_per_gpu <= 0) return "no usable GPU was found";
    if (ranks_per_gpu > 1) {
        snprintf(buf, len,
                 "%d ranks share one GPU, and NCCL needs a GPU of its own for every rank "
                 "(start one rank per GPU: mpirun -np <number of GPUs>)",
                 ranks_per_gpu);
        return buf;
    }
    return NULL;
}

bool pg_choose_backend(const char *requested, PgStart start, Device dev, bool nccl_built, int ranks_per_gpu,
                       PgBackend *out, char *why, size_t why_len) {
    const char *req = requested ? requested : "auto";
    if (!pg_backend_startable(req, start, why, why_len)) return false;
    const PgBackend host = start == PG_START_MPIRUN ? PG_BACKEND_MPI : PG_BACKEND_SOCKET;
    char detail[256];
    const char *blocker = nccl_blocker(dev, nccl_built, ranks_per_gpu, detail, sizeof detail);
    if (strcmp(req, "nccl") == 0) {
        if (blocker) {
            snprintf(why, why_len, "--backend nccl refused: %s. Use --backend %s.", blocker, pg_backend_name(host));
            return false;
        }
        *out = PG_BACKEND_NCCL;
        snprintf(why, why_len, "asked for with --backend nccl, one GPU per rank");
        return true;
    }
    if (strcmp(req, "auto") == 0) {
        *out = blocker ? host : PG_BACKEND_NCCL;
        if (blocker) snprintf(why, why_len, "auto: %s, because %s", pg_backend_name(host), blocker);
        else snprintf(why, why_len, "auto: nccl, every rank has a GPU of its own");
        return true;
    }
    *out = host;  // "mpi" under mpirun, "socket" from a store: pg_backend_startable let no other through
    snprintf(why, why_len, "asked for with --backend %s", req);
    return true;
}

int pg_max_duplicates(const char *ids, int n, size_t stride) {
    int most = 0;
    for (int i = 0; i < n; i++) {
        int same = 0;
        for (int j = 0; j < n; j++) same += strcmp(ids + (size_t)i * stride, ids + (size_t)j * stride) == 0;
        if (same > most) most = same;
    }
    return most;
}

uint32_t pg_hash_floats(Device d, const float *buf, size_t n) {
    uLong crc = crc32(0L, Z_NULL, 0);
    if (d == DEVICE_CPU) {
        // crc32 takes a 32-bit length: feed it in chunks.
        const unsigned char *p = (const unsigned char *)buf;
        size_t bytes = n * sizeof(float);
        for (size_t done = 0; done < bytes;) {
            size_t len = bytes - done < ((size_t)1 << 30) ? bytes - done : ((size_t)1 << 30);
            crc = crc32(crc, p + done, (uInt)len);
            done += len;
        }
        return (uint32_t)crc;
    }
    // GPU buffer: hash a host copy, a chunk at a time so a large model needs no large host buffer.
    const size_t chunk = (size_t)1 << 20;  // floats
    float *host = xmalloc(chunk * sizeof(float));
    for (size_t done = 0; done < n; done += chunk) {
        size_t len = n - done < chunk ? n - done : chunk;
        device_copy_from(d, host, buf + done, len * sizeof(float));
        crc = crc32(crc, (const unsigned char *)host, (uInt)(len * sizeof(float)));
    }
    free(host);
    return (uint32_t)crc;
}

// ---------------------------------------------------------------- who is missing from a collective

// Appends "r" or ", r" to a list of ranks in buf.
static void append_rank(char *buf, size_t len, int *count, int r) {
    size_t used = strlen(buf);
    if (used < len) snprintf(buf + used, len - used, "%s%d", *count ? ", " : "", r);
    (*count)++;
}

void pg_describe_absent(const long long *seen, int world, int me, long long seq, char *out, size_t len) {
    char missing[256] = "", ahead[256] = "";
    int n_missing = 0, n_ahead = 0;
    for (int r = 0; r < world; r++) {
        if (r == me) continue;
        if (seen[r] < seq) append_rank(missing, sizeof missing, &n_missing, r);
        else if (seen[r] > seq) append_rank(ahead, sizeof ahead, &n_ahead, r);
    }
    out[0] = '\0';
    if (n_missing > 0)
        snprintf(out, len, "rank%s %s did not join it (stopped, dead, or still computing)", n_missing == 1 ? "" : "s",
                 missing);
    if (n_ahead > 0) {
        size_t used = strlen(out);
        if (used < len)
            snprintf(out + used, len - used, "%srank%s %s waited in a LATER collective (one more call on %s)",
                     n_missing ? "; " : "", n_ahead == 1 ? "" : "s", ahead, n_ahead == 1 ? "that rank" : "those ranks");
    }
    if (n_missing == 0 && n_ahead == 0)
        snprintf(out, len, "every rank joined it, yet it did not complete (a collective of another size or kind "
                           "on some rank?)");
}
