// kit/buckets_plan.h: how the gradient buckets (kit/buckets.h) cut the flat gradient buffer (kit/buckets_plan.c).
// Pure: no process group, so it is tested without mpirun.
#ifndef KIT_BUCKETS_PLAN_H
#define KIT_BUCKETS_PLAN_H

#include <stddef.h>

#include "kit/model.h"

#ifdef __cplusplus
extern "C" {
#endif

// Splits a flat gradient buffer into buckets of about bucket_bytes (25 MB by default, as PyTorch DDP),
// each a contiguous range made of whole TensorViews, formed in REVERSE order of offset: backward
// produces the last layers' gradients first, so bucket 0 (the end of the buffer) is ready first and
// its all-reduce overlaps with the rest of backward. A view larger than bucket_bytes gets a bucket
// of its own.
#define PG_DEFAULT_BUCKET_BYTES ((size_t)25 << 20)

typedef struct {
    size_t offset, count;  // floats, in the flat buffer
    int n_views;           // whole views in it
} GradBucket;

// The plan: fills buckets (room for n_views entries) and view_bucket (n_views: the bucket each view is in),
// returns the number of buckets. Views may come in any order but must not overlap and together must cover
// [0, total) with no gap (a clear error otherwise). bucket_bytes 0 = PG_DEFAULT_BUCKET_BYTES.
int buckets_plan(const TensorView *views, int n_views, size_t total, size_t bucket_bytes,
                 GradBucket *buckets, int *view_bucket);
// The indices of the views in increasing offset (empty views first among equal offsets), in a new array
// (n_views) the caller frees.
int *buckets_views_by_offset(const TensorView *views, int n_views);

#ifdef __cplusplus
}
#endif

#endif // KIT_BUCKETS_PLAN_H
