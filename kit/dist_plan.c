// kit/dist_plan.c: the parts of the process group that need neither MPI nor a GPU (see dist_internal.h):
// the backend decision, bucket planning and buffer hashing. Kept apart from dist.c so the unit tests
// can check them without mpirun, and so they link without MPI.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "kit/check.h"
#include "kit/dist_internal.h"

const char *pg_backend_name(PgBackend b) {
    return b == PG_BACKEND_NCCL ? "nccl" : b == PG_BACKEND_SOCKET ? "socket" : "mpi";
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

bool pg_choose_backend(const char *requested, Device dev, bool nccl_built, int ranks_per_gpu,
                       PgBackend *out, char *why, size_t why_len) {
    char detail[256];
    const char *req = requested ? requested : "auto";
    const char *blocker = nccl_blocker(dev, nccl_built, ranks_per_gpu, detail, sizeof detail);
    if (strcmp(req, "mpi") == 0) {
        *out = PG_BACKEND_MPI;
        snprintf(why, why_len, "asked for with --backend mpi");
        return true;
    }
    if (strcmp(req, "nccl") == 0) {
        if (blocker) {
            snprintf(why, why_len, "--backend nccl refused: %s. Use --backend mpi.", blocker);
            return false;
        }
        *out = PG_BACKEND_NCCL;
        snprintf(why, why_len, "asked for with --backend nccl, one GPU per rank");
        return true;
    }
    if (strcmp(req, "auto") == 0) {
        *out = blocker ? PG_BACKEND_MPI : PG_BACKEND_NCCL;
        if (blocker) snprintf(why, why_len, "auto: mpi, because %s", blocker);
        else snprintf(why, why_len, "auto: nccl, every rank has a GPU of its own");
        return true;
    }
    snprintf(why, why_len, "unknown backend '%s': use auto, mpi or nccl", req);
    return false;
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

// ---------------------------------------------------------------- bucket plan

static const TensorView *sort_views;
static int by_offset(const void *a, const void *b) {
    size_t oa = sort_views[*(const int *)a].offset, ob = sort_views[*(const int *)b].offset;
    return (oa > ob) - (oa < ob);
}

// Indices of the views in increasing offset; checks they tile [0, total) exactly.
static int *views_in_offset_order(const TensorView *views, int n_views, size_t total) {
    int *order = xmalloc((size_t)(n_views > 0 ? n_views : 1) * sizeof(int));
    for (int i = 0; i < n_views; i++) order[i] = i;
    sort_views = views;
    qsort(order, (size_t)n_views, sizeof(int), by_offset);
    size_t end = 0;
    for (int i = 0; i < n_views; i++) {
        const TensorView *v = &views[order[i]];
        CHECKF(v->offset == end, "the views must cut the gradient buffer with no gap or overlap",
               "view '%s' starts at float %zu, but the views before it end at %zu", v->name, v->offset, end);
        end = v->offset + v->count;
    }
    CHECKF(end == total, "pass Model.n_params as the total", "the views cover %zu floats but the buffer has %zu", end,
           total);
    return order;
}

int buckets_plan(const TensorView *views, int n_views, size_t total, size_t bucket_bytes,
                 GradBucket *buckets, int *view_bucket) {
    CHECK(n_views > 0, "the model has no parameters to reduce");
    if (bucket_bytes == 0) bucket_bytes = PG_DEFAULT_BUCKET_BYTES;
    size_t cap = bucket_bytes / sizeof(float);
    if (cap == 0) cap = 1;
    int *order = views_in_offset_order(views, n_views, total);
    int nb = 0;
    // Walk from the end of the buffer: the last layers' gradients come first in backward.
    for (int i = n_views - 1; i >= 0; i--) {
        const TensorView *v = &views[order[i]];
        GradBucket *cur = nb > 0 ? &buckets[nb - 1] : NULL;
        if (!cur || (cur->count > 0 && cur->count + v->count > cap)) {
            cur = &buckets[nb++];
            cur->offset = v->offset + v->count;
            cur->count = 0;
            cur->n_views = 0;
        }
        cur->offset = v->offset;  // the bucket grows downwards
        cur->count += v->count;
        cur->n_views++;
        view_bucket[order[i]] = nb - 1;
    }
    free(order);
    return nb;
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
