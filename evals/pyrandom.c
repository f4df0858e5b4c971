/* pyrandom — MT19937 as in CPython's Modules/_randommodule.c and sample() of Lib/random.py. */
#include "evals/pyrandom.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

#define MT_N 624
#define MT_M 397

static void init_genrand(m2d_pyrandom *r, uint32_t s) {
    r->mt[0] = s;
    for (int i = 1; i < MT_N; i++)
        r->mt[i] = 1812433253u * (r->mt[i - 1] ^ (r->mt[i - 1] >> 30)) + (uint32_t)i;
    r->mti = MT_N;
}

static void init_by_array(m2d_pyrandom *r, const uint32_t *key, int key_len) {
    init_genrand(r, 19650218u);
    int i = 1, j = 0;
    for (int k = MT_N > key_len ? MT_N : key_len; k; k--) {
        r->mt[i] = (r->mt[i] ^ ((r->mt[i - 1] ^ (r->mt[i - 1] >> 30)) * 1664525u)) + key[j] + (uint32_t)j;
        i++; j++;
        if (i >= MT_N) { r->mt[0] = r->mt[MT_N - 1]; i = 1; }
        if (j >= key_len) j = 0;
    }
    for (int k = MT_N - 1; k; k--) {
        r->mt[i] = (r->mt[i] ^ ((r->mt[i - 1] ^ (r->mt[i - 1] >> 30)) * 1566083941u)) - (uint32_t)i;
        i++;
        if (i >= MT_N) { r->mt[0] = r->mt[MT_N - 1]; i = 1; }
    }
    r->mt[0] = 0x80000000u; /* MSB is 1, assuring a non-zero initial array */
}

void m2d_pyrandom_seed(m2d_pyrandom *r, int64_t seed) {
    /* CPython: n = abs(arg); key = 32-bit words of n, little-endian; zero gives the key [0]. */
    uint64_t a = seed < 0 ? (uint64_t)0 - (uint64_t)seed : (uint64_t)seed;
    uint32_t key[2] = {(uint32_t)a, (uint32_t)(a >> 32)};
    init_by_array(r, key, key[1] ? 2 : 1);
}

uint32_t m2d_pyrandom_u32(m2d_pyrandom *r) {
    static const uint32_t mag01[2] = {0x0u, 0x9908b0dfu};
    uint32_t y;
    if (r->mti >= MT_N) {
        int kk;
        for (kk = 0; kk < MT_N - MT_M; kk++) {
            y = (r->mt[kk] & 0x80000000u) | (r->mt[kk + 1] & 0x7fffffffu);
            r->mt[kk] = r->mt[kk + MT_M] ^ (y >> 1) ^ mag01[y & 1u];
        }
        for (; kk < MT_N - 1; kk++) {
            y = (r->mt[kk] & 0x80000000u) | (r->mt[kk + 1] & 0x7fffffffu);
            r->mt[kk] = r->mt[kk + (MT_M - MT_N)] ^ (y >> 1) ^ mag01[y & 1u];
        }
        y = (r->mt[MT_N - 1] & 0x80000000u) | (r->mt[0] & 0x7fffffffu);
        r->mt[MT_N - 1] = r->mt[MT_M - 1] ^ (y >> 1) ^ mag01[y & 1u];
        r->mti = 0;
    }
    y = r->mt[r->mti++];
    y ^= (y >> 11);
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= (y >> 18);
    return y;
}

uint64_t m2d_pyrandom_getrandbits(m2d_pyrandom *r, int k) {
    if (k <= 0) return 0;
    if (k <= 32) return m2d_pyrandom_u32(r) >> (32 - k);
    /* CPython fills 32-bit words least significant first; the last word keeps its top bits. */
    uint64_t lo = m2d_pyrandom_u32(r);
    uint64_t hi = m2d_pyrandom_u32(r) >> (64 - k);
    return lo | (hi << 32);
}

double m2d_pyrandom_random(m2d_pyrandom *r) {
    uint32_t a = m2d_pyrandom_u32(r) >> 5, b = m2d_pyrandom_u32(r) >> 6;
    return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0);
}

static int bit_length(uint64_t n) {
    int k = 0;
    while (n) { k++; n >>= 1; }
    return k;
}

uint64_t m2d_pyrandom_randbelow(m2d_pyrandom *r, uint64_t n) {
    int k = bit_length(n); /* n, not n-1: CPython's choice, so n == 1 still draws one bit */
    uint64_t v = m2d_pyrandom_getrandbits(r, k);
    while (v >= n) v = m2d_pyrandom_getrandbits(r, k);
    return v;
}

/* setsize of Random.sample: 21 (+ 4 ** ceil(log(3k, 4)) when k > 5). math.log(x, 4) is
 * log(x) / log(4) in double; 3k is never a power of 4, so no rounding edge can flip the ceil. */
static double sample_setsize(int k) {
    double setsize = 21;
    if (k > 5) setsize += pow(4.0, ceil(log((double)k * 3) / log(4.0)));
    return setsize;
}

int m2d_pyrandom_sample(m2d_pyrandom *r, int n, int k, int *out) {
    if (k < 0 || k > n) return m2d_err("random.sample: sample larger than population or is negative (k=%d, n=%d)", k, n);
    if ((double)n <= sample_setsize(k)) {
        /* pool algorithm: partial Fisher-Yates on a copy of the population */
        int *pool = m2d_malloc(sizeof(int) * (size_t)(n ? n : 1));
        for (int i = 0; i < n; i++) pool[i] = i;
        for (int i = 0; i < k; i++) {
            int j = (int)m2d_pyrandom_randbelow(r, (uint64_t)(n - i));
            out[i] = pool[j];
            pool[j] = pool[n - i - 1];
        }
        free(pool);
        return 0;
    }
    /* set algorithm: redraw indices already selected (k is small next to n here) */
    for (int i = 0; i < k; i++) {
        int j, dup;
        do {
            j = (int)m2d_pyrandom_randbelow(r, (uint64_t)n);
            dup = 0;
            for (int t = 0; t < i; t++)
                if (out[t] == j) { dup = 1; break; }
        } while (dup);
        out[i] = j;
    }
    return 0;
}
