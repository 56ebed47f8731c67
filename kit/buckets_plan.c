// kit/buckets_plan.c: the gradient buckets' plan (see buckets_plan.h): which views go in which bucket. Pure, so
// the unit tests check it without mpirun and it links without MPI; kit/buckets.c runs the plan.
#include "kit/buckets_plan.h"

#include <stdlib.h>

#include "kit/check.h"

static const TensorView *g_views;  // qsort has no context argument in C11
static int by_view_offset(const void *a, const void *b) {
    const TensorView *va = &g_views[*(const int *)a], *vb = &g_views[*(const int *)b];
    if (va->offset != vb->offset) return (va->offset > vb->offset) - (va->offset < vb->offset);
    return (va->count > vb->count) - (va->count < vb->count);  // empty views first
}

int *buckets_views_by_offset(const TensorView *views, int n_views) {
    int *order = xmalloc((size_t)(n_views > 0 ? n_views : 1) * sizeof(int));
    for (int i = 0; i < n_views; i++) order[i] = i;
    g_views = views;
    qsort(order, (size_t)n_views, sizeof(int), by_view_offset);
    return order;
}

// Checks that the views, in offset order, tile [0, total) exactly.
static void check_views_tile(const TensorView *views, const int *order, int n_views, size_t total) {
    size_t end = 0;
    for (int i = 0; i < n_views; i++) {
        const TensorView *v = &views[order[i]];
        CHECKF(v->offset == end, "the views must cut the gradient buffer with no gap or overlap",
               "view '%s' starts at float %zu, but the views before it end at %zu", v->name, v->offset, end);
        end = v->offset + v->count;
    }
    CHECKF(end == total, "pass Model.n_params as the total", "the views cover %zu floats but the buffer has %zu", end,
           total);
}

int buckets_plan(const TensorView *views, int n_views, size_t total, size_t bucket_bytes,
                 GradBucket *buckets, int *view_bucket) {
    CHECK(n_views > 0, "the model has no parameters to reduce");
    if (bucket_bytes == 0) bucket_bytes = PG_DEFAULT_BUCKET_BYTES;
    size_t cap = bucket_bytes / sizeof(float);
    if (cap == 0) cap = 1;
    int *order = buckets_views_by_offset(views, n_views);
    check_views_tile(views, order, n_views, total);
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
