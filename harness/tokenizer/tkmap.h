/* tkmap — the tokenizer's hash maps (open addressing, power-of-two tables, linear probing): token
 * bytes -> id (the vocab, an encode's memo) and (left id, right id) -> (merge rank, merged id) (the
 * merges, the word cuts). Entries are never removed. */
#ifndef M2D_TKMAP_H
#define M2D_TKMAP_H

#include <stddef.h>
#include <stdint.h>

uint64_t m2d_tk_hash_bytes(const void *p, size_t n);

typedef struct {
    uint64_t hash;
    size_t off;
    uint32_t len;
    int32_t val;
} m2d_strmap_entry;

typedef struct {
    char *keys;
    size_t keys_len, keys_cap;
    m2d_strmap_entry *e;
    size_t n, e_cap;
    uint32_t *slots; /* entry index + 1; 0 = empty */
    size_t mask;
} m2d_strmap;

/* EXPECT: the number of entries foreseen (the table grows past it). */
void m2d_strmap_init(m2d_strmap *m, size_t expect);
void m2d_strmap_free(m2d_strmap *m);
/* The entry of key K[0..n) whose m2d_tk_hash_bytes is H, NULL if absent. */
const m2d_strmap_entry *m2d_strmap_find(const m2d_strmap *m, const char *k, size_t n, uint64_t h);
/* The id of key K[0..n), -1 if absent. */
int32_t m2d_strmap_get(const m2d_strmap *m, const char *k, size_t n);
/* Insert or overwrite (later duplicates win, like a JSON object read into a HashMap). */
m2d_strmap_entry *m2d_strmap_put(m2d_strmap *m, const char *k, size_t n, int32_t v);

/* (left id, right id) -> (merge rank, merged id). */
typedef struct {
    uint64_t *keys; /* UINT64_MAX = empty (ids are < 2^31) */
    int32_t *rank, *merged;
    size_t mask, n;
} m2d_pairmap;

void m2d_pairmap_init(m2d_pairmap *p, size_t expect);
void m2d_pairmap_free(m2d_pairmap *p);
/* Later duplicates overwrite earlier ones (HF collects merges into a HashMap). */
void m2d_pairmap_put(m2d_pairmap *p, int32_t a, int32_t b, int32_t rank, int32_t merged);

/* inline: the BPE merge loops look pairs up in their innermost step */
static inline uint64_t m2d_pairmap_key(int32_t a, int32_t b) { return (uint64_t)(uint32_t)a << 32 | (uint32_t)b; }
static inline size_t m2d_pairmap_slot(uint64_t k, size_t mask) {
    /* full 64-bit mix: both ids must reach the low bits that the mask keeps */
    k ^= k >> 33;
    k *= 0xFF51AFD7ED558CCDull;
    k ^= k >> 33;
    return (size_t)k & mask;
}

/* The merge rank of (a, b) and *merged its merged id, or -1 when the pair is absent. */
static inline int32_t m2d_pairmap_get(const m2d_pairmap *p, int32_t a, int32_t b, int32_t *merged) {
    uint64_t k = m2d_pairmap_key(a, b);
    for (size_t i = m2d_pairmap_slot(k, p->mask);; i = (i + 1) & p->mask) {
        if (p->keys[i] == k) {
            *merged = p->merged[i];
            return p->rank[i];
        }
        if (p->keys[i] == UINT64_MAX) return -1;
    }
}

#endif
