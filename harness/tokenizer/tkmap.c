/* tkmap — the tokenizer's hash maps. See tkmap.h. */
#include "tokenizer/tkmap.h"

#include <stdlib.h>
#include <string.h>

#include "base/util.h"

uint64_t m2d_tk_hash_bytes(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 0x243F6A8885A308D3ull ^ (n * 0x9E3779B97F4A7C15ull);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, s, 8);
        h = (h ^ v) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
        s += 8;
        n -= 8;
    }
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v |= (uint64_t)s[i] << (8 * i);
    h = (h ^ v) * 0x94D049BB133111EBull;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 32);
}

void m2d_strmap_init(m2d_strmap *m, size_t expect) {
    memset(m, 0, sizeof *m);
    size_t cap = 16;
    while (cap < expect * 2) cap *= 2;
    m->slots = m2d_calloc(cap, sizeof *m->slots);
    m->mask = cap - 1;
}

void m2d_strmap_free(m2d_strmap *m) {
    free(m->keys);
    free(m->e);
    free(m->slots);
    memset(m, 0, sizeof *m);
}

const m2d_strmap_entry *m2d_strmap_find(const m2d_strmap *m, const char *k, size_t n, uint64_t h) {
    for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
        uint32_t s = m->slots[i];
        if (!s) return NULL;
        const m2d_strmap_entry *e = &m->e[s - 1];
        if (e->hash == h && e->len == n && memcmp(m->keys + e->off, k, n) == 0) return e;
    }
}

int32_t m2d_strmap_get(const m2d_strmap *m, const char *k, size_t n) {
    const m2d_strmap_entry *e = m2d_strmap_find(m, k, n, m2d_tk_hash_bytes(k, n));
    return e ? e->val : -1;
}

static void strmap_grow(m2d_strmap *m) {
    size_t cap = (m->mask + 1) * 2;
    free(m->slots);
    m->slots = m2d_calloc(cap, sizeof *m->slots);
    m->mask = cap - 1;
    for (size_t j = 0; j < m->n; j++) {
        size_t i = m->e[j].hash & m->mask;
        while (m->slots[i]) i = (i + 1) & m->mask;
        m->slots[i] = (uint32_t)(j + 1);
    }
}

/* Insert or overwrite (later duplicates win, like a JSON object read into a HashMap). */
m2d_strmap_entry *m2d_strmap_put(m2d_strmap *m, const char *k, size_t n, int32_t v) {
    uint64_t h = m2d_tk_hash_bytes(k, n);
    m2d_strmap_entry *found = (m2d_strmap_entry *)m2d_strmap_find(m, k, n, h);
    if (found) {
        found->val = v;
        return found;
    }
    if ((m->n + 1) * 2 > m->mask + 1) strmap_grow(m);
    if (m->n == m->e_cap) {
        m->e_cap = m->e_cap ? m->e_cap * 2 : 64;
        m->e = m2d_realloc(m->e, m->e_cap * sizeof *m->e);
    }
    if (m->keys_len + n > m->keys_cap) {
        while (m->keys_len + n > m->keys_cap) m->keys_cap = m->keys_cap ? m->keys_cap * 2 : 4096;
        m->keys = m2d_realloc(m->keys, m->keys_cap);
    }
    if (n) memcpy(m->keys + m->keys_len, k, n);
    m2d_strmap_entry *e = &m->e[m->n];
    *e = (m2d_strmap_entry){h, m->keys_len, (uint32_t)n, v};
    m->keys_len += n;
    size_t i = h & m->mask;
    while (m->slots[i]) i = (i + 1) & m->mask;
    m->slots[i] = (uint32_t)(++m->n);
    return e;
}

void m2d_pairmap_init(m2d_pairmap *p, size_t expect) {
    size_t cap = 16;
    while (cap < expect * 2) cap *= 2;
    p->keys = m2d_malloc(cap * sizeof *p->keys);
    memset(p->keys, 0xFF, cap * sizeof *p->keys);
    p->rank = m2d_malloc(cap * sizeof *p->rank);
    p->merged = m2d_malloc(cap * sizeof *p->merged);
    p->mask = cap - 1;
    p->n = 0;
}

void m2d_pairmap_free(m2d_pairmap *p) {
    free(p->keys);
    free(p->rank);
    free(p->merged);
}

/* Later duplicates overwrite earlier ones (HF collects merges into a HashMap). */
void m2d_pairmap_put(m2d_pairmap *p, int32_t a, int32_t b, int32_t rank, int32_t merged) {
    uint64_t k = m2d_pairmap_key(a, b);
    size_t i = m2d_pairmap_slot(k, p->mask);
    while (p->keys[i] != UINT64_MAX && p->keys[i] != k) i = (i + 1) & p->mask;
    if (p->keys[i] == UINT64_MAX) p->n++;
    p->keys[i] = k;
    p->rank[i] = rank;
    p->merged[i] = merged;
}
