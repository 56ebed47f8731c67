// kit/sampler.c: PyTorch's DistributedSampler, with its padding and dropping spelled out (see data.h).
//
// Every rank computes the SAME permutation from (seed, epoch) and keeps every world-th position of it,
// so the shards are disjoint without any communication.
#include <stdlib.h>

#include "kit/check.h"
#include "kit/data.h"
#include "kit/rng.h"

void sampler_init(Sampler *s, int n, int rank, int world, uint64_t seed, SamplerMode mode) {
    CHECK(n >= 0, "sampler_init: the dataset size must not be negative");
    CHECK(world >= 1 && rank >= 0 && rank < world, "sampler_init: rank must be in 0..world-1 and world >= 1");
    CHECK(mode == SAMPLER_TRAIN_PAD || mode == SAMPLER_TRAIN_DROP || mode == SAMPLER_EVAL,
          "sampler_init: mode is SAMPLER_TRAIN_PAD, SAMPLER_TRAIN_DROP or SAMPLER_EVAL");
    s->n = n;
    s->rank = rank;
    s->world = world;
    s->seed = seed;
    s->mode = mode;
    s->epoch = 0;
}

void sampler_set_epoch(Sampler *s, int epoch) { s->epoch = epoch; }

// Positions in the (padded or truncated) global list, over all ranks.
static long sampler_total(const Sampler *s) {
    long n = s->n, w = s->world;
    switch (s->mode) {
    case SAMPLER_TRAIN_PAD: return (n + w - 1) / w * w;
    case SAMPLER_TRAIN_DROP: return n / w * w;
    default: return n;
    }
}

int sampler_len(const Sampler *s) {
    long total = sampler_total(s);
    // EVAL: rank r gets r, r + world, ... < n, so the first n % world ranks get one more.
    if (s->rank >= total) return 0;
    return (int)((total - s->rank + s->world - 1) / s->world);
}

int sampler_indices(const Sampler *s, int *out) {
    int n = s->n, count = sampler_len(s);
    if (count == 0) return 0;
    int *perm = xmalloc((size_t)n * sizeof *perm);
    for (int i = 0; i < n; i++) perm[i] = i;
    if (s->mode != SAMPLER_EVAL) {
        // Same (seed, epoch) -> same order on every rank; the tag keeps this stream apart from the
        // augmentation streams drawn with the same seed.
        Rng r = rng_make(s->seed, SAMPLER_STREAM_TAG | (uint64_t)(uint32_t)s->epoch);
        rng_shuffle(&r, perm, n);
    }
    // Position p of the padded list is perm[p mod n]: PAD repeats from the start (cycling when the
    // padding is longer than the data, as torch does), DROP and EVAL never reach p >= n.
    for (int k = 0; k < count; k++) out[k] = perm[(size_t)(s->rank + (long)k * s->world) % (size_t)n];
    free(perm);
    return count;
}
