// kit/buckets_internal.h: what kit/buckets.c offers its tests only. Lessons use kit/buckets.h.
#ifndef KIT_BUCKETS_INTERNAL_H
#define KIT_BUCKETS_INTERNAL_H

#include <stddef.h>

#include "kit/buckets.h"

#ifdef __cplusplus
extern "C" {
#endif

// Buckets started in this step and not yet finished (all of them after a full backward).
int buckets_in_flight(const GradBuckets *gb);

#ifdef __cplusplus
}
#endif

#endif // KIT_BUCKETS_INTERNAL_H
