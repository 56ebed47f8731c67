// kit/rng.h: deterministic random numbers.
//
// Counter-based: a random value is a pure function of (seed, stream, counter), so a run can be
// reproduced and resumed from (seed, epoch, step) alone, and every rank or thread can draw the same
// or different numbers without sharing state. The mixer is SplitMix64 (public domain, Steele et al.).
#ifndef KIT_RNG_H
#define KIT_RNG_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint64_t state;
} Rng;

// A generator for one stream of one seed; streams with different ids are independent.
Rng rng_make(uint64_t seed, uint64_t stream);
uint64_t rng_next_u64(Rng *r);
uint32_t rng_below(Rng *r, uint32_t bound);  // uniform in [0, bound), no modulo bias
float rng_uniform(Rng *r);                   // uniform in [0, 1)
float rng_normal(Rng *r);                    // standard normal (Box-Muller)
// Fisher-Yates shuffle of idx[0..n).
void rng_shuffle(Rng *r, int *idx, int n);

#ifdef __cplusplus
}
#endif

#endif // KIT_RNG_H
