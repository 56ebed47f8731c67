// kit/rng.c: see rng.h.
#include "kit/rng.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

Rng rng_make(uint64_t seed, uint64_t stream) {
    // Hash seed and stream together so nearby (seed, stream) pairs start far apart.
    uint64_t s = seed;
    uint64_t a = splitmix64(&s);
    s = a ^ (stream * 0xD1B54A32D192ED03ull);
    Rng r = {splitmix64(&s)};
    return r;
}

uint64_t rng_next_u64(Rng *r) { return splitmix64(&r->state); }

uint32_t rng_below(Rng *r, uint32_t bound) {
    // Lemire's multiply-shift with rejection: unbiased for every bound.
    uint64_t m = (uint64_t)(uint32_t)rng_next_u64(r) * bound;
    uint32_t low = (uint32_t)m;
    if (low < bound) {
        uint32_t threshold = (uint32_t)(-bound) % bound;
        while (low < threshold) {
            m = (uint64_t)(uint32_t)rng_next_u64(r) * bound;
            low = (uint32_t)m;
        }
    }
    return (uint32_t)(m >> 32);
}

float rng_uniform(Rng *r) { return (float)(rng_next_u64(r) >> 40) * (1.0f / 16777216.0f); }

float rng_normal(Rng *r) {
    float u1 = rng_uniform(r), u2 = rng_uniform(r);
    if (u1 < 1e-7f) u1 = 1e-7f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530718f * u2);
}

void rng_shuffle(Rng *r, int *idx, int n) {
    for (int i = n - 1; i > 0; i--) {
        int j = (int)rng_below(r, (uint32_t)(i + 1));
        int t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
    }
}
