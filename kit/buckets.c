// kit/buckets.c: gradient buckets, the engine behind DDP's overlap of communication with backward
// (see buckets.h): each step, which views are ready, and the all-reduces of the buckets (planned by
// buckets_plan.c).
#include "kit/buckets.h"

#include <stdlib.h>
#include <string.h>

#include "kit/buckets_internal.h"
#include "kit/buckets_plan.h"
#include "kit/check.h"
#include "kit/dist_internal.h"
#include "kit/trace.h"

struct GradBuckets {
    ProcessGroup *pg;
    float *grads;       // (total) on the pg's device
    size_t total;
    int n_views, n_buckets;
    GradBucket *buckets;   // (n_buckets), bucket 0 at the end of the buffer
    int *view_bucket;      // (n_views)
    int *by_offset;        // (n_views) view indices in increasing offset, to find a marked range
    const TensorView *views;  // the caller's table (it outlives us: it is the Model's)
    bool *view_ready;      // (n_views) marked in this step
    int *pending;          // (n_buckets) non-empty views not yet marked
    PgRequest *req;        // (n_buckets)
    int next_start;        // buckets [0, next_start) have been started this step
};

static void reset_step(GradBuckets *gb) {
    memset(gb->view_ready, 0, (size_t)gb->n_views * sizeof(bool));
    memset(gb->pending, 0, (size_t)gb->n_buckets * sizeof(int));
    for (int v = 0; v < gb->n_views; v++)
        if (gb->views[v].count > 0) gb->pending[gb->view_bucket[v]]++;
    gb->next_start = 0;
}

GradBuckets *buckets_create(ProcessGroup *pg, float *grads, const TensorView *views, int n_views,
                            size_t total, size_t bucket_bytes) {
    GradBuckets *gb = xcalloc(1, sizeof *gb);
    gb->pg = pg;
    gb->grads = grads;
    gb->total = total;
    gb->n_views = n_views;
    gb->views = views;
    size_t nv = (size_t)(n_views > 0 ? n_views : 1);
    gb->buckets = xcalloc(nv, sizeof *gb->buckets);
    gb->view_bucket = xcalloc(nv, sizeof *gb->view_bucket);
    gb->n_buckets = buckets_plan(views, n_views, total, bucket_bytes, gb->buckets, gb->view_bucket);
    gb->by_offset = buckets_views_by_offset(views, n_views);
    gb->view_ready = xcalloc(nv, sizeof *gb->view_ready);
    gb->pending = xcalloc((size_t)gb->n_buckets, sizeof *gb->pending);
    gb->req = xcalloc((size_t)gb->n_buckets, sizeof *gb->req);
    CHECK(gb->n_buckets <= PG_MAX_INFLIGHT, "too many buckets for the process group: raise bucket_bytes");
    reset_step(gb);
    return gb;
}

void buckets_free(GradBuckets *gb) {
    if (!gb) return;
    free(gb->buckets);
    free(gb->view_bucket);
    free(gb->by_offset);
    free(gb->view_ready);
    free(gb->pending);
    free(gb->req);
    free(gb);
}

int buckets_count(const GradBuckets *gb) { return gb->n_buckets; }
int buckets_in_flight(const GradBuckets *gb) { return gb->next_start; }

void buckets_begin(GradBuckets *gb) {
    CHECK(gb->next_start == 0,
          "buckets_begin while the last step's all-reduces are in flight: call buckets_finish first");
    reset_step(gb);
}

// Starts every ready bucket that has no unstarted bucket before it. The strict order is what keeps
// the ranks' collectives matched: MPI and NCCL pair the k-th call on one rank with the k-th on another.
static void start_ready(GradBuckets *gb, bool force) {
    while (gb->next_start < gb->n_buckets && (force || gb->pending[gb->next_start] == 0)) {
        int b = gb->next_start++;
        const GradBucket *bk = &gb->buckets[b];
        trace_name_next("all-reduce bucket %d", b);
        gb->req[b] = pg_iallreduce(gb->pg, gb->grads + bk->offset, bk->count, PG_AVG);
    }
}

// Index in by_offset of the non-empty view starting at `offset`, or -1.
static int find_view_at(const GradBuckets *gb, size_t offset) {
    int lo = 0, hi = gb->n_views;  // first position with offset >= the one sought
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (gb->views[gb->by_offset[mid]].offset < offset) lo = mid + 1;
        else hi = mid;
    }
    while (lo < gb->n_views && gb->views[gb->by_offset[lo]].offset == offset &&
           gb->views[gb->by_offset[lo]].count == 0)
        lo++;
    return lo < gb->n_views && gb->views[gb->by_offset[lo]].offset == offset ? lo : -1;
}

void buckets_on_grads_ready(void *ctx, size_t offset, size_t count) {
    GradBuckets *gb = ctx;
    if (count == 0) return;
    int pos = find_view_at(gb, offset);
    CHECKF(pos >= 0, "mark whole TensorViews: pass a view's offset and count", "float %zu is not the start of a parameter view", offset);
    // Check the whole range first, so a bad call changes nothing.
    size_t end = offset + count, at = offset;
    int last = pos;
    for (; last < gb->n_views && at < end; last++) at += gb->views[gb->by_offset[last]].count;
    CHECKF(at >= end, "mark whole TensorViews: pass a view's offset and count", "the range [%zu, %zu) runs past the end of the buffer (%zu floats)", offset, end,
           gb->total);
    const TensorView *lastv = &gb->views[gb->by_offset[last - 1]];
    CHECKF(at == end, "mark whole TensorViews: pass a view's offset and count", "the range [%zu, %zu) ends inside view '%s' [%zu, %zu)", offset, end, lastv->name,
           lastv->offset, lastv->offset + lastv->count);
    for (; pos < last; pos++) {
        int v = gb->by_offset[pos];
        if (gb->views[v].count == 0) continue;
        CHECKF(!gb->view_ready[v], "each view once per step; call buckets_finish at the end of the step (it resets)",
               "view '%s' was marked ready twice", gb->views[v].name);
        gb->view_ready[v] = true;
        gb->pending[gb->view_bucket[v]]--;
    }
    start_ready(gb, false);
    pg_progress(gb->pg);  // the buckets started at earlier layers move while this backward goes on
}

void buckets_finish(GradBuckets *gb) {
    // Views never marked (a layer whose hook was not called) are reduced now: correct, just no overlap.
    start_ready(gb, true);
    for (int b = 0; b < gb->n_buckets; b++) pg_wait(gb->pg, gb->req[b]);
    reset_step(gb);
}
