/* pyrandom — CPython's `random.Random` reproduced bit for bit, as far as lm-eval's few-shot
 * sampler uses it: seeding from an int (init_by_array), getrandbits, _randbelow and sample.
 * Checked against python3 outputs in tests/test_pyrandom.c. */
#ifndef M2D_PYRANDOM_H
#define M2D_PYRANDOM_H

#include <stdint.h>

typedef struct {
    uint32_t mt[624];
    int mti;
} m2d_pyrandom;

/* random.Random(seed): the key is |seed| split into 32-bit words, least significant first. */
void m2d_pyrandom_seed(m2d_pyrandom *r, int64_t seed);
uint32_t m2d_pyrandom_u32(m2d_pyrandom *r);             /* genrand_uint32 */
uint64_t m2d_pyrandom_getrandbits(m2d_pyrandom *r, int k); /* 0 <= k <= 64 */
double m2d_pyrandom_random(m2d_pyrandom *r);             /* random.random() */
/* _randbelow_with_getrandbits: uniform in [0, n), n >= 1, rejection sampling on bit_length(n) bits. */
uint64_t m2d_pyrandom_randbelow(m2d_pyrandom *r, uint64_t n);
/* random.sample(range(n), k) as indices into the population: out[k].
 * Uses CPython's pool algorithm when n <= setsize, else its set-based rejection algorithm.
 * Returns -1 (m2d_err) when k > n. */
int m2d_pyrandom_sample(m2d_pyrandom *r, int n, int k, int *out);

#endif
