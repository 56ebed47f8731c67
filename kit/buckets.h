// kit/buckets.h: gradient buckets (lesson 03's stretch goal): the all-reduce of the flat gradient buffer,
// cut into pieces that start while backward is still computing the layers before them.
//
//   GradBuckets *gb = buckets_create(pg, m->grads, m->views, m->n_views, m->n_params, 0);
//   m->on_grads_ready = buckets_on_grads_ready;  m->on_grads_ready_ctx = gb;
//   each step:  buckets_begin(gb);  forward + backward (marks the views);  buckets_finish(gb);
#ifndef KIT_BUCKETS_H
#define KIT_BUCKETS_H

#include <stddef.h>

#include "kit/buckets_plan.h"
#include "kit/dist.h"
#include "kit/model.h"

#ifdef __cplusplus
extern "C" {
#endif


typedef struct GradBuckets GradBuckets;

// grads (total) on the pg's device; views say how it is cut (Model.views, Model.n_params).
// bucket_bytes 0 = PG_DEFAULT_BUCKET_BYTES.
GradBuckets *buckets_create(ProcessGroup *pg, float *grads, const TensorView *views, int n_views,
                            size_t total, size_t bucket_bytes);
void buckets_free(GradBuckets *gb);
int buckets_count(const GradBuckets *gb);

// Starts a step: forgets which views were ready.
void buckets_begin(GradBuckets *gb);
// Starts whatever was not marked, waits for every bucket and leaves grads averaged over the ranks.
void buckets_finish(GradBuckets *gb);
// The hook for Model's backward (Model.on_grads_ready; ctx is the GradBuckets): the gradients in
// grads[offset, offset + count) are final for this step, a whole view or several adjacent whole views (a
// clear error otherwise, or when one is marked twice in a step). When this completes a bucket, its
// all-reduce starts at once; buckets start strictly in bucket order (a bucket that is ready early waits
// for the ones before it), so every rank issues the same collectives in the same order whatever order
// backward marks them in.
void buckets_on_grads_ready(void *ctx, size_t offset, size_t count);

#ifdef __cplusplus
}
#endif

#endif // KIT_BUCKETS_H
