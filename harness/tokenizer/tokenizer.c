/* tokenizer — Hugging Face tokenizer.json (BPE model) reimplemented to give exactly the ids of
 * Hugging Face `tokenizers` (Rust) with add_special_tokens=False.
 *
 * Pipeline (as HF runs it):
 *   1. added tokens with normalized=false are cut out of the RAW text (leftmost-longest match,
 *      honouring single_word / lstrip / rstrip);
 *   2. every remaining segment is normalized (NFC/NFD/NFKC/NFKD via utf8proc, Prepend, Replace),
 *      then added tokens with normalized=true are cut out of the normalized segment the same way;
 *   3. the pre-tokenizers (Split with a regex, Digits, Metaspace, ByteLevel) split the rest into
 *      pieces;
 *   4. each piece goes through BPE (rank-ordered merges over symbol ids, byte fallback, unknown
 *      tokens fused or not, memoised per call).
 * Decoding (tkdecode.c) runs the decoder chain over the ids' token strings.
 *
 * All mutable state of an encode lives in a per-call context, so one loaded tokenizer can be
 * used from several threads at once. */
#include "tokenizer/tokenizer.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>
#include <utf8proc.h>

#include "tokenizer/tkdecode.h"
#include "tokenizer/tkpost.h"
#include "tokenizer/tktext.h"
#include "base/util.h"

#define MAX_STAGES 16
#define DEFAULT_HEAP_THRESHOLD 48
/* words longer than this (bytes) are cut where no merge can reach across (see word_cuts_init) */
#define DEFAULT_CUT_MIN 256
/* ids index dense tables: bound them so a corrupt file cannot ask for gigabytes */
#define MAX_ID 16777215
#define MAX_ID_STR "16777215"

/* ------------------------------------------------------------------------------------------ */
/* Hash maps (open addressing, power-of-two tables, linear probing)                             */

static uint64_t hash_bytes(const void *p, size_t n) {
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

typedef struct {
    uint64_t hash;
    size_t off;
    uint32_t len;
    int32_t val;
} strmap_entry;

typedef struct {
    char *keys;
    size_t keys_len, keys_cap;
    strmap_entry *e;
    size_t n, e_cap;
    uint32_t *slots; /* entry index + 1; 0 = empty */
    size_t mask;
} strmap;

static void strmap_init(strmap *m, size_t expect) {
    memset(m, 0, sizeof *m);
    size_t cap = 16;
    while (cap < expect * 2) cap *= 2;
    m->slots = m2d_calloc(cap, sizeof *m->slots);
    m->mask = cap - 1;
}

static void strmap_free(strmap *m) {
    free(m->keys);
    free(m->e);
    free(m->slots);
    memset(m, 0, sizeof *m);
}

static const strmap_entry *strmap_find(const strmap *m, const char *k, size_t n, uint64_t h) {
    for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
        uint32_t s = m->slots[i];
        if (!s) return NULL;
        const strmap_entry *e = &m->e[s - 1];
        if (e->hash == h && e->len == n && memcmp(m->keys + e->off, k, n) == 0) return e;
    }
}

static int32_t strmap_get(const strmap *m, const char *k, size_t n) {
    const strmap_entry *e = strmap_find(m, k, n, hash_bytes(k, n));
    return e ? e->val : -1;
}

static void strmap_grow(strmap *m) {
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
static strmap_entry *strmap_put(strmap *m, const char *k, size_t n, int32_t v) {
    uint64_t h = hash_bytes(k, n);
    strmap_entry *found = (strmap_entry *)strmap_find(m, k, n, h);
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
    strmap_entry *e = &m->e[m->n];
    *e = (strmap_entry){h, m->keys_len, (uint32_t)n, v};
    m->keys_len += n;
    size_t i = h & m->mask;
    while (m->slots[i]) i = (i + 1) & m->mask;
    m->slots[i] = (uint32_t)(++m->n);
    return e;
}

/* (left id, right id) -> (merge rank, merged id). */
typedef struct {
    uint64_t *keys; /* UINT64_MAX = empty (ids are < 2^31) */
    int32_t *rank, *merged;
    size_t mask, n;
} pairmap;

static uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t)(uint32_t)a << 32 | (uint32_t)b; }
static size_t pair_slot(uint64_t k, size_t mask) {
    /* full 64-bit mix: both ids must reach the low bits that the mask keeps */
    k ^= k >> 33;
    k *= 0xFF51AFD7ED558CCDull;
    k ^= k >> 33;
    return (size_t)k & mask;
}

static void pairmap_init(pairmap *p, size_t expect) {
    size_t cap = 16;
    while (cap < expect * 2) cap *= 2;
    p->keys = m2d_malloc(cap * sizeof *p->keys);
    memset(p->keys, 0xFF, cap * sizeof *p->keys);
    p->rank = m2d_malloc(cap * sizeof *p->rank);
    p->merged = m2d_malloc(cap * sizeof *p->merged);
    p->mask = cap - 1;
    p->n = 0;
}

static void pairmap_free(pairmap *p) {
    free(p->keys);
    free(p->rank);
    free(p->merged);
}

/* Later duplicates overwrite earlier ones (HF collects merges into a HashMap). */
static void pairmap_put(pairmap *p, int32_t a, int32_t b, int32_t rank, int32_t merged) {
    uint64_t k = pair_key(a, b);
    size_t i = pair_slot(k, p->mask);
    while (p->keys[i] != UINT64_MAX && p->keys[i] != k) i = (i + 1) & p->mask;
    if (p->keys[i] == UINT64_MAX) p->n++;
    p->keys[i] = k;
    p->rank[i] = rank;
    p->merged[i] = merged;
}

static inline int32_t pairmap_get(const pairmap *p, int32_t a, int32_t b, int32_t *merged) {
    uint64_t k = pair_key(a, b);
    for (size_t i = pair_slot(k, p->mask);; i = (i + 1) & p->mask) {
        if (p->keys[i] == k) {
            *merged = p->merged[i];
            return p->rank[i];
        }
        if (p->keys[i] == UINT64_MAX) return -1;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* The tokenizer                                                                                */

enum { NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD, NORM_PREPEND, NORM_REPLACE };
enum { STAGE_SPLIT, STAGE_BYTELEVEL, STAGE_METASPACE, STAGE_DIGITS };

typedef struct {
    int kind;
    char *prepend; /* Prepend */
    size_t prepend_n;
    m2d_tkreplace rep; /* Replace */
} normalizer;

typedef struct {
    int kind;
    pcre2_code *re;       /* Split pattern, or the GPT-2 regex for ByteLevel use_regex */
    int behavior, invert; /* Split; Digits: Isolated (individual_digits) or Contiguous */
    int add_prefix_space; /* ByteLevel */
    m2d_tkmetaspace meta; /* Metaspace */
} stage;

typedef struct {
    char *content; /* as given in tokenizer.json (what id -> token returns) */
    size_t len;
    char *match; /* what is searched for: content, normalized when normalized=true */
    size_t match_len;
    int32_t id;
    int single_word, lstrip, rstrip, normalized, special;
} added_token;

/* Added tokens matched leftmost-longest (HF: Aho-Corasick, MatchKind::LeftmostLongest). */
typedef struct {
    int *idx;         /* indices into tk->added, bucketed by first byte */
    int start[257];   /* bucket b is idx[start[b] .. start[b+1]) */
    int n;
} added_set;

struct m2d_tokenizer {
    char *path;
    strmap vocab;            /* model vocab: token -> id */
    pairmap merges;
    int32_t char_id[0x800];  /* vocab id of each one-character token below U+0800, -1 if none */
    int32_t n_ids;           /* max id + 1 */
    char **id_tok;           /* id -> token string (added tokens override), NULL for holes */
    uint32_t *id_len;
    added_token *added;
    int n_added;
    added_set raw_set, norm_set;
    normalizer norms[MAX_STAGES];
    int n_norms;
    int norms_unicode_only;  /* only Unicode normal forms: ASCII text is left as it is */
    stage stages[MAX_STAGES];
    int n_stages;
    m2d_tkdecoder *decoder;
    m2d_tkpost post;         /* add_special_tokens=True: ids around the text's */
    int32_t unk_id;         /* -1 when model.unk_token is null */
    int fuse_unk, byte_fallback, ignore_merges;
    char *subword_prefix, *word_suffix; /* continuing_subword_prefix / end_of_word_suffix */
    int32_t byte_fallback_id[256];
    int32_t bos_id, eos_id;
    size_t heap_threshold;
    pairmap cut_pairs;  /* adjacent code points inside some vocab token; word cuts on when allocated */
    size_t cut_min;
    int slow_paths; /* testing: full-text utf8proc NFC instead of nfc_fast */
};

/* Regex matching state, one per encode (or per load, for the added tokens' normalization). */
typedef struct {
    pcre2_match_data *md;
    m2d_tkspans spans;
} re_scratch;

static void re_scratch_init(re_scratch *r) {
    r->md = pcre2_match_data_create(1, NULL);
    memset(&r->spans, 0, sizeof r->spans);
}

static void re_scratch_free(re_scratch *r) {
    pcre2_match_data_free(r->md);
    free(r->spans.v);
}

/* ------------------------------------------------------------------------------------------ */
/* Loading                                                                                      */

typedef struct {
    const char *path;
} loadctx;

static int field_err(const loadctx *L, const char *field, const char *what) { return m2d_tkj_err(L->path, field, what); }

static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int load_split(stage *st, const loadctx *L, const cJSON *pt, const char *field) {
    char f[256];
    st->kind = STAGE_SPLIT;
    if (m2d_tkre_pattern(L->path, pt, field, &st->re, NULL)) return -1;
    snprintf(f, sizeof f, "%s.behavior", field);
    const char *beh;
    if (m2d_tkj_string(L->path, pt, "behavior", f, &beh)) return -1;
    static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    st->behavior = -1;
    for (int i = 0; i < 5; i++)
        if (beh && !strcmp(beh, names[i])) st->behavior = i;
    if (st->behavior < 0)
        return m2d_tkj_unsupported(L->path, f, beh ? beh : "(missing)",
                                   "Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous");
    snprintf(f, sizeof f, "%s.invert", field);
    return m2d_tkj_bool(L->path, pt, "invert", f, 0, &st->invert);
}

static int load_bytelevel(stage *st, const loadctx *L, const cJSON *pt, const char *field) {
    char f[256];
    int use_regex;
    st->kind = STAGE_BYTELEVEL;
    snprintf(f, sizeof f, "%s.add_prefix_space", field);
    if (m2d_tkj_bool(L->path, pt, "add_prefix_space", f, 1, &st->add_prefix_space)) return -1;
    snprintf(f, sizeof f, "%s.use_regex", field);
    if (m2d_tkj_bool(L->path, pt, "use_regex", f, 1, &use_regex)) return -1;
    return use_regex ? m2d_tkre_compile(L->path, field, GPT2_PATTERN, 0, &st->re) : 0;
}

/* Digits: every numeric character its own piece (individual_digits), or runs of them. */
static int load_digits(stage *st, const loadctx *L, const cJSON *pt, const char *field) {
    char f[256];
    int individual;
    st->kind = STAGE_DIGITS;
    snprintf(f, sizeof f, "%s.individual_digits", field);
    if (m2d_tkj_bool(L->path, pt, "individual_digits", f, 0, &individual)) return -1;
    st->behavior = individual ? M2D_SPLIT_ISOLATED : M2D_SPLIT_CONTIGUOUS;
    return 0;
}

static int load_pre_tokenizer(m2d_tokenizer *tk, const loadctx *L, const cJSON *pt, const char *field) {
    if (!pt || cJSON_IsNull(pt)) return 0;
    char f[256];
    const char *type;
    if (m2d_tkj_type(L->path, pt, field, &type)) return -1;
    if (!strcmp(type, "Sequence")) {
        snprintf(f, sizeof f, "%s.pretokenizers", field);
        const cJSON *list = m2d_tkj_get(pt, "pretokenizers");
        if (!cJSON_IsArray(list)) return field_err(L, f, "expected an array");
        int i = 0;
        for (const cJSON *c = list->child; c; c = c->next, i++) {
            snprintf(f, sizeof f, "%s.pretokenizers[%d]", field, i);
            if (load_pre_tokenizer(tk, L, c, f)) return -1;
        }
        return 0;
    }
    if (tk->n_stages == MAX_STAGES) return field_err(L, field, "too many pre-tokenizers");
    stage *st = &tk->stages[tk->n_stages++]; /* owned (and freed) from here on */
    memset(st, 0, sizeof *st);
    if (!strcmp(type, "Split")) return load_split(st, L, pt, field);
    if (!strcmp(type, "ByteLevel")) return load_bytelevel(st, L, pt, field);
    if (!strcmp(type, "Digits")) return load_digits(st, L, pt, field);
    if (!strcmp(type, "Metaspace")) {
        st->kind = STAGE_METASPACE;
        return m2d_tkj_metaspace(L->path, pt, field, &st->meta);
    }
    snprintf(f, sizeof f, "%s.type", field);
    return m2d_tkj_unsupported(L->path, f, type, "Split, ByteLevel, Metaspace, Digits, Sequence");
}

static int load_normalizer(m2d_tokenizer *tk, const loadctx *L, const cJSON *nz, const char *field) {
    if (!nz || cJSON_IsNull(nz)) return 0;
    char f[256];
    const char *type;
    if (m2d_tkj_type(L->path, nz, field, &type)) return -1;
    if (!strcmp(type, "Sequence")) {
        snprintf(f, sizeof f, "%s.normalizers", field);
        const cJSON *list = m2d_tkj_get(nz, "normalizers");
        if (!cJSON_IsArray(list)) return field_err(L, f, "expected an array");
        int i = 0;
        for (const cJSON *c = list->child; c; c = c->next, i++) {
            snprintf(f, sizeof f, "%s.normalizers[%d]", field, i);
            if (load_normalizer(tk, L, c, f)) return -1;
        }
        return 0;
    }
    static const char *names[] = {"NFC", "NFD", "NFKC", "NFKD", "Prepend", "Replace"};
    int kind = -1;
    for (int i = 0; i < 6; i++)
        if (!strcmp(type, names[i])) kind = i;
    snprintf(f, sizeof f, "%s.type", field);
    if (kind < 0) return m2d_tkj_unsupported(L->path, f, type, "NFC, NFD, NFKC, NFKD, Prepend, Replace, Sequence");
    if (tk->n_norms == MAX_STAGES) return field_err(L, field, "too many normalizers");
    normalizer *nm = &tk->norms[tk->n_norms++]; /* owned (and freed) from here on */
    memset(nm, 0, sizeof *nm);
    nm->kind = kind;
    if (kind == NORM_REPLACE) return m2d_tkreplace_load(&nm->rep, L->path, nz, field);
    if (kind != NORM_PREPEND) return 0;
    const char *prepend;
    snprintf(f, sizeof f, "%s.prepend", field);
    if (m2d_tkj_string(L->path, nz, "prepend", f, &prepend)) return -1;
    if (!prepend) return field_err(L, f, "expected a string");
    nm->prepend = m2d_strdup(prepend);
    nm->prepend_n = strlen(prepend);
    return 0;
}

static char *utf8proc_normal_form(const char *s, size_t *n, int form) {
    int opt = UTF8PROC_STABLE;
    switch (form) {
    case NORM_NFC: opt |= UTF8PROC_COMPOSE; break;
    case NORM_NFD: opt |= UTF8PROC_DECOMPOSE; break;
    case NORM_NFKC: opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    default: opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
    }
    utf8proc_uint8_t *out = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)*n, &out, (utf8proc_option_t)opt);
    if (r < 0) { /* cannot happen on valid UTF-8 */
        free(out);
        return NULL;
    }
    *n = (size_t)r;
    return (char *)out;
}

/* NFC touching only what can change. Characters below U+0300 (UTF-8 lead byte < 0xCC) are NFC
 * on their own, and the text can be cut before any ASCII character: it is a starter that never
 * composes with what precedes it and blocks canonical reordering. So only the stretches from the
 * last ASCII character before a character >= U+0300 to the next ASCII character are normalized.
 * Returns NULL when s is already NFC. */
static char *nfc_fast(const char *s, size_t *n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t len = *n, copied = 0, i = 0;
    char *out = NULL;
    size_t o = 0, cap = 0;
    while (i < len) {
        if (u[i] < 0xCC) {
            i++;
            continue;
        }
        size_t r = i, e = i;
        while (r > copied && u[r] >= 0x80) r--; /* back to an ASCII character (or the copied end) */
        while (e < len && u[e] >= 0x80) e++;    /* on to the next ASCII character */
        size_t m = e - r;
        char *norm = utf8proc_normal_form(s + r, &m, NORM_NFC);
        if (!norm) return out; /* not reached */
        if (!out) out = m2d_malloc(cap = len + len / 4 + 16);
        m2d_tk_reserve(&out, &cap, o + (r - copied) + m + 1);
        memcpy(out + o, s + copied, r - copied), o += r - copied;
        memcpy(out + o, norm, m), o += m;
        free(norm);
        copied = i = e;
    }
    if (!out) return NULL;
    m2d_tk_reserve(&out, &cap, o + (len - copied) + 1);
    memcpy(out + o, s + copied, len - copied), o += len - copied;
    out[o] = 0;
    *n = o;
    return out;
}

/* One normalizer on s[0..*n): *out gets a malloc'd result (*n updated), or NULL when s stays as it
 * is. *start_moved is set when the result no longer begins at the original first character (HF's
 * alignments then put the text's start past offset 0). */
static int apply_normalizer(const m2d_tokenizer *tk, const normalizer *nz, re_scratch *rs, const char *s, size_t *n,
                            char **out, int *start_moved) {
    *out = NULL;
    switch (nz->kind) {
    case NORM_PREPEND:
        if (*n == 0) return 0; /* HF prepends to non-empty text only */
        *out = m2d_malloc(nz->prepend_n + *n + 1);
        memcpy(*out, nz->prepend, nz->prepend_n);
        memcpy(*out + nz->prepend_n, s, *n);
        *n += nz->prepend_n;
        (*out)[*n] = 0;
        return 0;
    case NORM_REPLACE: {
        m2d_tkbuf b = {0};
        if (m2d_tkreplace_apply(&nz->rep, rs->md, &rs->spans, s, *n, &b, start_moved)) {
            free(b.p);
            return -1;
        }
        *out = b.p;
        *n = b.n;
        return 0;
    }
    case NORM_NFC:
        if (!tk->slow_paths) {
            *out = nfc_fast(s, n);
            return 0;
        }
        /* fall through */
    default:
        *out = utf8proc_normal_form(s, n, nz->kind);
        return 0;
    }
}

/* Apply the normalizers to *s (length *n). *s is left as it is when nothing changes, else it points
 * to a malloc'd string also stored in *owned. */
static int normalize(const m2d_tokenizer *tk, re_scratch *rs, const char **s, size_t *n, char **owned, int *start_moved) {
    *owned = NULL;
    if (!tk->n_norms) return 0;
    if (tk->norms_unicode_only) {
        int ascii = 1;
        for (size_t i = 0; i < *n && ascii; i++) ascii = (unsigned char)(*s)[i] < 0x80;
        if (ascii) return 0; /* ASCII is invariant under all four normal forms */
    }
    for (int k = 0; k < tk->n_norms; k++) {
        char *next;
        if (apply_normalizer(tk, &tk->norms[k], rs, *s, n, &next, start_moved)) return -1;
        if (!next) continue;
        free(*owned);
        *owned = next;
        *s = next;
    }
    return 0;
}

static int build_added_set(m2d_tokenizer *tk, added_set *set, int normalized) {
    int count[256] = {0};
    set->n = 0;
    for (int i = 0; i < tk->n_added; i++)
        if (tk->added[i].normalized == normalized && tk->added[i].match_len) count[(unsigned char)tk->added[i].match[0]]++, set->n++;
    set->idx = m2d_malloc((size_t)(set->n ? set->n : 1) * sizeof *set->idx);
    set->start[0] = 0;
    for (int b = 0; b < 256; b++) set->start[b + 1] = set->start[b] + count[b];
    int fill[256];
    memcpy(fill, set->start, sizeof fill);
    for (int i = 0; i < tk->n_added; i++)
        if (tk->added[i].normalized == normalized && tk->added[i].match_len)
            set->idx[fill[(unsigned char)tk->added[i].match[0]]++] = i;
    return 0;
}

static int32_t lookup_model_token(const m2d_tokenizer *tk, const char *s, size_t n) {
    return strmap_get(&tk->vocab, s, n);
}

/* One added_tokens entry: its flags into *a (content borrowed from the JSON). */
static int parse_added_token(const loadctx *L, const cJSON *t, int i, added_token *a) {
    char f[96];
    const cJSON *id = m2d_tkj_get(t, "id"), *content = m2d_tkj_get(t, "content");
    snprintf(f, sizeof f, "added_tokens[%d].id", i);
    if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > MAX_ID ||
        id->valuedouble != (double)(int32_t)id->valuedouble)
        return field_err(L, f, "expected an integer id in [0, " MAX_ID_STR "]");
    snprintf(f, sizeof f, "added_tokens[%d].content", i);
    if (!cJSON_IsString(content)) return field_err(L, f, "expected a string");
    memset(a, 0, sizeof *a);
    a->content = content->valuestring;
    a->len = strlen(a->content);
    if (m2d_utf8_first_invalid(a->content, a->len) != a->len) return field_err(L, f, "invalid UTF-8");
    struct { const char *name; int *dst; int dflt; } flags[] = {
        {"single_word", &a->single_word, 0}, {"lstrip", &a->lstrip, 0}, {"rstrip", &a->rstrip, 0},
        {"normalized", &a->normalized, 1}, {"special", &a->special, 0}};
    for (size_t k = 0; k < M2D_ARRAY_LEN(flags); k++) {
        snprintf(f, sizeof f, "added_tokens[%d].%s", i, flags[k].name);
        if (m2d_tkj_bool(L->path, t, flags[k].name, f, flags[k].dflt, flags[k].dst)) return -1;
    }
    return 0;
}

/* HF ignores the ids written in added_tokens and adds the entries one by one as
 * AddedVocabulary::add_tokens does: a content added before keeps its id (the later entry's flags
 * win), a content in the model's vocab takes the model's id, any other the next id — the vocab's
 * size, or one past the largest added id when that is not below it. Empty contents are ignored. */
static int load_added_tokens(m2d_tokenizer *tk, const loadctx *L, const cJSON *list) {
    if (!list || cJSON_IsNull(list)) return 0;
    if (!cJSON_IsArray(list)) return field_err(L, "added_tokens", "expected an array");
    int n = cJSON_GetArraySize(list), i = 0;
    int64_t vocab_n = (int64_t)tk->vocab.n, max_id = -1;
    tk->added = m2d_calloc((size_t)(n ? n : 1), sizeof *tk->added);
    for (const cJSON *t = list->child; t; t = t->next, i++) {
        added_token a, *prev = NULL;
        if (parse_added_token(L, t, i, &a)) return -1;
        if (!a.len) continue;
        for (int k = 0; k < tk->n_added && !prev; k++)
            if (tk->added[k].len == a.len && !memcmp(tk->added[k].content, a.content, a.len)) prev = &tk->added[k];
        if (prev) {
            a.id = prev->id;
            a.content = prev->content, a.match = prev->match, a.match_len = prev->match_len;
            *prev = a;
            continue;
        }
        int64_t id = lookup_model_token(tk, a.content, a.len);
        if (id < 0) id = max_id < 0 ? vocab_n : max_id >= vocab_n || vocab_n == 0 ? max_id + 1 : vocab_n;
        if (id > MAX_ID) return m2d_err("%s: field 'added_tokens[%d]': more tokens than ids up to " MAX_ID_STR, L->path, i);
        max_id = M2D_MAX(max_id, id);
        a.id = (int32_t)id;
        a.content = m2d_strdup(a.content);
        a.match = m2d_strdup(a.content);
        a.match_len = a.len;
        tk->added[tk->n_added++] = a;
    }
    return 0;
}

/* model.vocab {token: id}, and model.unk_token (UNK, may be NULL) looked up in it. */
static int load_vocab(m2d_tokenizer *tk, const loadctx *L, const cJSON *model, const char *unk) {
    const cJSON *vocab = m2d_tkj_get(model, "vocab");
    if (!cJSON_IsObject(vocab)) return field_err(L, "model.vocab", "expected an object {token: id}");
    int nv = cJSON_GetArraySize(vocab);
    strmap_init(&tk->vocab, (size_t)nv);
    for (const cJSON *v = vocab->child; v; v = v->next) {
        if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > MAX_ID ||
            v->valuedouble != (double)(int32_t)v->valuedouble) {
            char f[160];
            snprintf(f, sizeof f, "model.vocab.%.120s", v->string);
            return field_err(L, f, "expected an integer id in [0, " MAX_ID_STR "]");
        }
        strmap_put(&tk->vocab, v->string, strlen(v->string), (int32_t)v->valuedouble);
    }
    tk->unk_id = -1;
    if (unk) {
        tk->unk_id = lookup_model_token(tk, unk, strlen(unk));
        if (tk->unk_id < 0) return field_err(L, "model.unk_token", "not in model.vocab");
    }
    return 0;
}

/* model.merges, in rank order: each pair and its merged token must be in the vocab. */
static int load_merges(m2d_tokenizer *tk, const loadctx *L, const cJSON *model) {
    const cJSON *merges = m2d_tkj_get(model, "merges");
    if (!cJSON_IsArray(merges)) return field_err(L, "model.merges", "expected an array");
    int nm = cJSON_GetArraySize(merges);
    pairmap_init(&tk->merges, (size_t)nm);
    size_t plen = tk->subword_prefix ? strlen(tk->subword_prefix) : 0;
    char *joined = NULL;
    size_t jcap = 0;
    int rank = 0;
    for (const cJSON *m = merges->child; m; m = m->next, rank++) {
        char f[64];
        snprintf(f, sizeof f, "model.merges[%d]", rank);
        const char *a, *b;
        size_t alen, blen;
        if (cJSON_IsString(m)) { /* legacy "a b" */
            const char *sp = strchr(m->valuestring, ' ');
            if (!sp) {
                free(joined);
                return field_err(L, f, "expected \"left right\" (two tokens separated by a space)");
            }
            a = m->valuestring, alen = (size_t)(sp - a);
            b = sp + 1, blen = strlen(b);
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) &&
                   cJSON_IsString(m->child->next)) { /* ["a", "b"] (tokenizers >= 0.20) */
            a = m->child->valuestring, alen = strlen(a);
            b = m->child->next->valuestring, blen = strlen(b);
        } else {
            free(joined);
            return field_err(L, f, "expected \"left right\" or [\"left\", \"right\"]");
        }
        int32_t ia = lookup_model_token(tk, a, alen), ib = lookup_model_token(tk, b, blen);
        if (blen < plen) {
            free(joined);
            return m2d_err("%s: field '%s': right token '%.*s' is shorter than model.continuing_subword_prefix", L->path, f,
                           (int)blen, b);
        }
        if (ia < 0 || ib < 0) {
            free(joined);
            return m2d_err("%s: field '%s': token '%.*s' is not in model.vocab", L->path, f,
                           (int)(ia < 0 ? alen : blen), ia < 0 ? a : b);
        }
        if (alen + blen + 1 > jcap) joined = m2d_realloc(joined, jcap = (alen + blen) * 2 + 16);
        memcpy(joined, a, alen);
        memcpy(joined + alen, b + plen, blen - plen);
        int32_t im = lookup_model_token(tk, joined, alen + blen - plen);
        if (im < 0) {
            m2d_err("%s: field '%s': merged token '%.*s' is not in model.vocab", L->path, f,
                    (int)(alen + blen - plen), joined);
            free(joined);
            return -1;
        }
        pairmap_put(&tk->merges, ia, ib, rank, im);
    }
    free(joined);
    return 0;
}

static int load_model(m2d_tokenizer *tk, const loadctx *L, const cJSON *model) {
    if (!cJSON_IsObject(model)) return field_err(L, "model", "expected an object");
    const char *type;
    if (m2d_tkj_string(L->path, model, "type", "model.type", &type)) return -1;
    /* HF also accepts an untagged model; one with merges is a BPE */
    if (type ? strcmp(type, "BPE") != 0 : !m2d_tkj_get(model, "merges"))
        return m2d_tkj_unsupported(L->path, "model.type", type ? type : "(missing)", "BPE");
    const cJSON *dropout = m2d_tkj_get(model, "dropout");
    if (dropout && !cJSON_IsNull(dropout) && !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0))
        return m2d_err("%s: field 'model.dropout': BPE dropout is random and not supported (need null)", L->path);
    const char *prefix, *suffix, *unk;
    if (m2d_tkj_string(L->path, model, "continuing_subword_prefix", "model.continuing_subword_prefix", &prefix) ||
        m2d_tkj_string(L->path, model, "end_of_word_suffix", "model.end_of_word_suffix", &suffix) ||
        m2d_tkj_string(L->path, model, "unk_token", "model.unk_token", &unk) ||
        m2d_tkj_bool(L->path, model, "fuse_unk", "model.fuse_unk", 0, &tk->fuse_unk) ||
        m2d_tkj_bool(L->path, model, "byte_fallback", "model.byte_fallback", 0, &tk->byte_fallback) ||
        m2d_tkj_bool(L->path, model, "ignore_merges", "model.ignore_merges", 0, &tk->ignore_merges))
        return -1;
    if (prefix && *prefix) tk->subword_prefix = m2d_strdup(prefix);
    if (suffix && *suffix) tk->word_suffix = m2d_strdup(suffix);
    return load_vocab(tk, L, model, unk) || load_merges(tk, L, model) ? -1 : 0;
}

/* bos/eos from tokenizer_config.json: a string, null, or {"content": ...} (AddedToken form). */
static int config_token(m2d_tokenizer *tk, const loadctx *L, const cJSON *cfg, const char *name, int32_t *out) {
    *out = -1;
    const cJSON *v = m2d_tkj_get(cfg, name);
    if (!v || cJSON_IsNull(v)) return 0;
    const cJSON *content = cJSON_IsObject(v) ? m2d_tkj_get(v, "content") : v;
    if (!cJSON_IsString(content)) return field_err(L, name, "expected a string, null or {\"content\": ...}");
    int32_t id = m2d_tokenizer_token_id(tk, content->valuestring);
    if (id < 0) return m2d_err("%s: field '%s': token '%s' is not in the vocabulary", L->path, name, content->valuestring);
    *out = id;
    return 0;
}

static cJSON *parse_json_file(const char *path) {
    size_t len;
    char *text = m2d_read_file(path, &len);
    if (!text) return NULL;
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t off = at && at >= text && at <= text + len ? (size_t)(at - text) : 0;
        m2d_err("%s: invalid JSON near byte offset %zu", path, off);
    }
    free(text);
    return root;
}

static int load_config(m2d_tokenizer *tk, const char *json_path) {
    const char *slash = strrchr(json_path, '/');
    char *dir = slash ? m2d_strfmt("%.*s", (int)(slash - json_path), json_path) : m2d_strdup(".");
    char *cfg_path = m2d_path_join(dir, "tokenizer_config.json");
    free(dir);
    int rc = 0;
    if (m2d_file_exists(cfg_path)) {
        cJSON *cfg = parse_json_file(cfg_path);
        loadctx L = {cfg_path};
        if (!cfg) rc = -1;
        else if (!cJSON_IsObject(cfg)) rc = m2d_err("%s: expected a JSON object", cfg_path);
        else rc = config_token(tk, &L, cfg, "bos_token", &tk->bos_id) || config_token(tk, &L, cfg, "eos_token", &tk->eos_id) ? -1 : 0;
        cJSON_Delete(cfg);
    }
    free(cfg_path);
    return rc;
}


/* id -> token table and the one-character lookup table. */
static void build_id_tables(m2d_tokenizer *tk) {
    int32_t max_id = -1;
    for (size_t i = 0; i < tk->vocab.n; i++) max_id = M2D_MAX(max_id, tk->vocab.e[i].val);
    for (int i = 0; i < tk->n_added; i++) max_id = M2D_MAX(max_id, tk->added[i].id);
    tk->n_ids = max_id + 1;
    tk->id_tok = m2d_calloc((size_t)(tk->n_ids ? tk->n_ids : 1), sizeof *tk->id_tok);
    tk->id_len = m2d_calloc((size_t)(tk->n_ids ? tk->n_ids : 1), sizeof *tk->id_len);
    for (size_t i = 0; i < tk->vocab.n; i++) {
        const strmap_entry *e = &tk->vocab.e[i];
        tk->id_tok[e->val] = tk->vocab.keys + e->off; /* keys arena is final now */
        tk->id_len[e->val] = e->len;
    }
    for (int i = 0; i < tk->n_added; i++) { /* HF looks up added tokens first */
        tk->id_tok[tk->added[i].id] = tk->added[i].content;
        tk->id_len[tk->added[i].id] = (uint32_t)tk->added[i].len;
    }
    for (uint32_t cp = 0; cp < 0x800; cp++) {
        char buf[4];
        int k = m2d_utf8_put(buf, cp);
        tk->char_id[cp] = lookup_model_token(tk, buf, (size_t)k);
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        tk->byte_fallback_id[b] = lookup_model_token(tk, name, strlen(name));
    }
}

/* Pipelines whose pre-tokenizers never split (SentencePiece style: Prepend + Replace, or Metaspace
 * without split) hand BPE the whole text as one word, which the memo cannot help. Such a word can be
 * cut between two characters a, b when no vocab token contains "ab": no merge then produces a symbol
 * across the cut, merges on either side never see the other, so BPE of the parts is BPE of the
 * whole. The cut also needs both characters to be one-character vocab tokens (a dropped unknown
 * character lets its neighbours merge, fused unks join across it) and no ignore_merges, prefix or
 * suffix (they depend on where the word starts and ends). Records the pairs in tk->cut_pairs. */
static void word_cuts_init(m2d_tokenizer *tk) {
    for (int i = 0; i < tk->n_stages; i++) {
        const stage *st = &tk->stages[i];
        int splits = st->kind == STAGE_METASPACE ? st->meta.split : st->kind == STAGE_BYTELEVEL ? st->re != NULL : 1;
        if (splits) return;
    }
    if (tk->ignore_merges || tk->subword_prefix || tk->word_suffix) return;
    size_t pairs = 0; /* at most one per byte of the vocab: the table never fills */
    for (size_t i = 0; i < tk->vocab.n; i++) pairs += tk->vocab.e[i].len;
    pairmap_init(&tk->cut_pairs, pairs);
    for (size_t i = 0; i < tk->vocab.n; i++) {
        const unsigned char *t = (const unsigned char *)tk->vocab.keys + tk->vocab.e[i].off;
        size_t n = tk->vocab.e[i].len;
        int64_t prev = -1; /* -1: no character before (start, or after bytes that are not UTF-8) */
        for (size_t j = 0; j < n;) {
            uint32_t cp;
            int k = m2d_utf8_next(t, n, j, &cp);
            if (k < 0) { /* not UTF-8: no text reaches such a token */
                j += (size_t)-k;
                prev = -1;
                continue;
            }
            if (prev >= 0) pairmap_put(&tk->cut_pairs, (int32_t)prev, (int32_t)cp, 0, 0);
            prev = cp;
            j += (size_t)k;
        }
    }
}

/* Tokens matched after normalization are themselves normalized first (HF does the same). */
static int normalize_added_tokens(m2d_tokenizer *tk) {
    re_scratch rs;
    re_scratch_init(&rs);
    int rc = 0;
    for (int i = 0; i < tk->n_added && !rc; i++) {
        added_token *a = &tk->added[i];
        if (!a->normalized) continue;
        char *owned;
        const char *s = a->match;
        size_t n = a->match_len;
        int moved = 0;
        rc = normalize(tk, &rs, &s, &n, &owned, &moved);
        if (owned) {
            free(a->match);
            a->match = owned;
            a->match_len = n;
        }
    }
    re_scratch_free(&rs);
    return rc;
}

static int load_root(m2d_tokenizer *tk, const loadctx *L, const cJSON *root) {
    if (!cJSON_IsObject(root)) return m2d_err("%s: expected a JSON object", L->path);
    if (load_model(tk, L, m2d_tkj_get(root, "model")) || load_added_tokens(tk, L, m2d_tkj_get(root, "added_tokens")) ||
        load_normalizer(tk, L, m2d_tkj_get(root, "normalizer"), "normalizer") ||
        load_pre_tokenizer(tk, L, m2d_tkj_get(root, "pre_tokenizer"), "pre_tokenizer") ||
        m2d_tkdecoder_load(L->path, m2d_tkj_get(root, "decoder"), &tk->decoder) ||
        m2d_tkpost_load(L->path, m2d_tkj_get(root, "post_processor"), MAX_ID, &tk->post))
        return -1;
    tk->norms_unicode_only = 1;
    for (int i = 0; i < tk->n_norms; i++) tk->norms_unicode_only &= tk->norms[i].kind <= NORM_NFKD;
    if (normalize_added_tokens(tk)) return -1;
    build_added_set(tk, &tk->raw_set, 0);
    build_added_set(tk, &tk->norm_set, 1);
    build_id_tables(tk);
    word_cuts_init(tk);
    return 0;
}

int m2d_tokenizer_load(const char *path, m2d_tokenizer **out) {
    *out = NULL;
    m2d_bytelevel_init();
    struct stat st;
    if (stat(path, &st) != 0)
        return m2d_err("%s: cannot open: %s (want a tokenizer.json or a directory holding one)", path, strerror(errno));
    /* a directory holds tokenizer.json; anything else is taken as the file itself */
    char *json_path = S_ISDIR(st.st_mode) ? m2d_path_join(path, "tokenizer.json") : m2d_strdup(path);
    cJSON *root = parse_json_file(json_path);
    if (!root) {
        free(json_path);
        return -1;
    }
    m2d_tokenizer *tk = m2d_calloc(1, sizeof *tk);
    tk->path = json_path;
    tk->bos_id = tk->eos_id = tk->unk_id = -1;
    tk->heap_threshold = DEFAULT_HEAP_THRESHOLD;
    tk->cut_min = DEFAULT_CUT_MIN;
    loadctx L = {json_path};
    int rc = load_root(tk, &L, root) || load_config(tk, json_path) ? -1 : 0;
    cJSON_Delete(root);
    if (rc) m2d_tokenizer_free(tk);
    else *out = tk;
    return rc;
}

void m2d_tokenizer_free(m2d_tokenizer *tk) {
    if (!tk) return;
    strmap_free(&tk->vocab);
    pairmap_free(&tk->merges);
    if (tk->cut_pairs.keys) pairmap_free(&tk->cut_pairs);
    for (int i = 0; i < tk->n_added; i++) {
        free(tk->added[i].content);
        free(tk->added[i].match);
    }
    free(tk->added);
    free(tk->raw_set.idx);
    free(tk->norm_set.idx);
    for (int i = 0; i < tk->n_norms; i++) {
        free(tk->norms[i].prepend);
        m2d_tkreplace_free(&tk->norms[i].rep);
    }
    for (int i = 0; i < tk->n_stages; i++) pcre2_code_free(tk->stages[i].re);
    m2d_tkdecoder_free(tk->decoder);
    m2d_tkpost_free(&tk->post);
    free(tk->id_tok);
    free(tk->id_len);
    free(tk->subword_prefix);
    free(tk->word_suffix);
    free(tk->path);
    free(tk);
}

int m2d_tokenizer_vocab_size(const m2d_tokenizer *tk) { return tk->n_ids; }
int m2d_tokenizer_bos_id(const m2d_tokenizer *tk) { return tk->bos_id; }
int m2d_tokenizer_eos_id(const m2d_tokenizer *tk) { return tk->eos_id; }

int m2d_tokenizer_token_id(const m2d_tokenizer *tk, const char *token) {
    size_t n = strlen(token);
    for (int i = 0; i < tk->n_added; i++) /* HF: added tokens first, then the model */
        if (tk->added[i].len == n && !memcmp(tk->added[i].content, token, n)) return tk->added[i].id;
    return lookup_model_token(tk, token, n);
}

const char *m2d_tokenizer_id_token(const m2d_tokenizer *tk, int32_t id, size_t *len) {
    if (id < 0 || id >= tk->n_ids || !tk->id_tok[id]) return NULL;
    if (len) *len = tk->id_len[id];
    return tk->id_tok[id];
}

void m2d_tokenizer_set_bpe_heap_threshold(m2d_tokenizer *tk, size_t n) { tk->heap_threshold = n; }
void m2d_tokenizer_set_word_cut_min(m2d_tokenizer *tk, size_t n) { tk->cut_min = n; }
void m2d_tokenizer_set_reference_nfc(m2d_tokenizer *tk, int on) { tk->slow_paths = on; }

/* ------------------------------------------------------------------------------------------ */
/* Encoding                                                                                     */

typedef struct {
    char *buf, *buf2;
    size_t cap, cap2;
    m2d_tkspans spans;
} depth_scratch;

typedef struct {
    const m2d_tokenizer *tk;
    int32_t *ids;
    size_t n, cap;
    depth_scratch depth[MAX_STAGES + 1];
    re_scratch rs;
    const char *text;      /* the input: a segment starting here starts at offset 0 */
    const char *norm_base; /* the normalized segment being pre-tokenized */
    int seg_first;         /* ... and whether it starts at offset 0 of the input */
    /* memo: piece bytes -> ids (value = offset into memo_ids; lengths in memo_len) */
    strmap memo;
    int32_t *memo_ids;
    size_t memo_n, memo_cap;
    uint32_t *memo_len;
    size_t memo_len_cap;
    /* BPE scratch */
    int32_t *sym, *prev, *next;
    size_t sym_cap;
    struct heap_item { int32_t rank, pos; } *heap;
    size_t heap_cap;
} enc_ctx;

static void emit(enc_ctx *c, int32_t id) {
    if (c->n == c->cap) c->ids = m2d_realloc(c->ids, (c->cap = c->cap ? c->cap * 2 : 1024) * sizeof *c->ids);
    c->ids[c->n++] = id;
}

/* -- BPE ----------------------------------------------------------------------------------- */

static void sym_reserve(enc_ctx *c, size_t n) {
    if (n <= c->sym_cap) return;
    c->sym_cap = M2D_MAX(n, c->sym_cap * 2);
    c->sym = m2d_realloc(c->sym, c->sym_cap * sizeof *c->sym);
    c->prev = m2d_realloc(c->prev, c->sym_cap * sizeof *c->prev);
    c->next = m2d_realloc(c->next, c->sym_cap * sizeof *c->next);
}

static void sym_push(enc_ctx *c, size_t *n, int32_t id) {
    sym_reserve(c, *n + 1);
    c->sym[(*n)++] = id;
}

/* Initial symbols of a word, exactly as HF BPE::merge_word builds them: one per character
 * (with continuing_subword_prefix / end_of_word_suffix), byte fallback, then unk (fused or not);
 * a character with no token and no unk is dropped. */
static size_t bpe_initial_symbols(enc_ctx *c, const char *w, size_t n) {
    const m2d_tokenizer *tk = c->tk;
    size_t ns = 0;
    int32_t unk_pending = -1; /* HF keeps one pending unk to fuse consecutive ones */
    char *tmp = NULL;
    size_t tmp_cap = 0;
    size_t plen = tk->subword_prefix ? strlen(tk->subword_prefix) : 0;
    size_t slen = tk->word_suffix ? strlen(tk->word_suffix) : 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = m2d_utf8_next((const unsigned char *)w, n, i, &cp);
        if (k < 0) k = 1; /* not reached: pieces are valid UTF-8 */
        int first = i == 0, last = i + (size_t)k == n;
        int32_t id;
        if ((!plen || first) && (!slen || !last)) {
            id = cp < 0x800 ? tk->char_id[cp] : lookup_model_token(tk, w + i, (size_t)k);
        } else {
            size_t len = (first ? 0 : plen) + (size_t)k + (last ? slen : 0);
            m2d_tk_reserve(&tmp, &tmp_cap, len);
            size_t o = 0;
            if (!first && plen) memcpy(tmp, tk->subword_prefix, plen), o = plen;
            memcpy(tmp + o, w + i, (size_t)k), o += (size_t)k;
            if (last && slen) memcpy(tmp + o, tk->word_suffix, slen), o += slen;
            id = lookup_model_token(tk, tmp, o);
        }
        if (id >= 0) {
            if (unk_pending >= 0) sym_push(c, &ns, unk_pending), unk_pending = -1;
            sym_push(c, &ns, id);
        } else {
            int done = 0;
            if (tk->byte_fallback) {
                /* HF formats the byte tokens from the (prefixed/suffixed) symbol string; with
                 * byte fallback those affixes are empty in practice, so the raw bytes are used */
                int ok = 1;
                for (int j = 0; j < k; j++) ok &= tk->byte_fallback_id[(unsigned char)w[i + (size_t)j]] >= 0;
                if (ok) {
                    for (int j = 0; j < k; j++) sym_push(c, &ns, tk->byte_fallback_id[(unsigned char)w[i + (size_t)j]]);
                    done = 1;
                }
            }
            if (!done && tk->unk_id >= 0) {
                if (unk_pending >= 0 && !tk->fuse_unk) sym_push(c, &ns, unk_pending);
                unk_pending = tk->unk_id;
            }
        }
        i += (size_t)k;
    }
    if (unk_pending >= 0) sym_push(c, &ns, unk_pending);
    free(tmp);
    return ns;
}

/* Obviously-correct merge: repeatedly merge the lowest-rank adjacent pair, leftmost on ties.
 * O(n^2), fastest for the short words that dominate text. */
static size_t bpe_merge_scan(const m2d_tokenizer *tk, int32_t *s, size_t n) {
    for (;;) {
        int32_t best = INT32_MAX, best_new = -1, merged;
        size_t at = 0;
        for (size_t i = 0; i + 1 < n; i++) {
            int32_t r = pairmap_get(&tk->merges, s[i], s[i + 1], &merged);
            if (r >= 0 && r < best) best = r, best_new = merged, at = i;
        }
        if (best_new < 0) return n;
        s[at] = best_new;
        memmove(s + at + 1, s + at + 2, (n - at - 2) * sizeof *s);
        n--;
    }
}

static int heap_less(struct heap_item a, struct heap_item b) {
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void heap_push(enc_ctx *c, size_t *hn, int32_t rank, int32_t pos) {
    if (*hn == c->heap_cap) c->heap = m2d_realloc(c->heap, (c->heap_cap = c->heap_cap ? c->heap_cap * 2 : 256) * sizeof *c->heap);
    struct heap_item it = {rank, pos};
    size_t i = (*hn)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(it, c->heap[p])) break;
        c->heap[i] = c->heap[p];
        i = p;
    }
    c->heap[i] = it;
}

static struct heap_item heap_pop(enc_ctx *c, size_t *hn) {
    struct heap_item top = c->heap[0], last = c->heap[--(*hn)];
    size_t i = 0, n = *hn;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        struct heap_item best = last;
        if (l < n && heap_less(c->heap[l], best)) m = l, best = c->heap[l];
        if (r < n && heap_less(c->heap[r], best)) m = r;
        if (m == i) break;
        c->heap[i] = c->heap[m];
        i = m;
    }
    if (n) c->heap[i] = last;
    return top;
}

/* Priority-queue merge (what HF Word::merge_all does): pops the (rank, position) minimum among
 * the live adjacent pairs, so it merges in exactly the order of bpe_merge_scan. O(n log n). */
static size_t bpe_merge_heap(enc_ctx *c, size_t n) {
    const m2d_tokenizer *tk = c->tk;
    int32_t *s = c->sym, *prev = c->prev, *next = c->next;
    size_t hn = 0;
    int32_t merged = -1;
    for (size_t i = 0; i < n; i++) {
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        int32_t r = pairmap_get(&tk->merges, s[i], s[i + 1], &merged);
        if (r >= 0) heap_push(c, &hn, r, (int32_t)i);
    }
    while (hn) {
        struct heap_item it = heap_pop(c, &hn);
        int32_t i = it.pos, j = next[i];
        if (s[i] < 0 || j < 0) continue; /* merged away, or now the last symbol */
        int32_t r = pairmap_get(&tk->merges, s[i], s[j], &merged);
        if (r != it.rank) continue; /* stale: the pair at i changed since it was queued */
        s[i] = merged;
        s[j] = -1;
        next[i] = next[j];
        if (next[j] >= 0) prev[next[j]] = i;
        if (prev[i] >= 0 && (r = pairmap_get(&tk->merges, s[prev[i]], s[i], &merged)) >= 0) heap_push(c, &hn, r, prev[i]);
        if (next[i] >= 0 && (r = pairmap_get(&tk->merges, s[i], s[next[i]], &merged)) >= 0) heap_push(c, &hn, r, i);
    }
    size_t o = 0;
    for (int32_t i = n ? 0 : -1; i >= 0; i = next[i]) s[o++] = s[i];
    return o;
}

static void bpe_word(enc_ctx *c, const char *w, size_t n) {
    const m2d_tokenizer *tk = c->tk;
    if (tk->ignore_merges) {
        int32_t id = lookup_model_token(tk, w, n);
        if (id >= 0) {
            emit(c, id);
            return;
        }
    }
    const strmap_entry *hit = strmap_find(&c->memo, w, n, hash_bytes(w, n));
    if (hit) {
        uint32_t len = c->memo_len[hit->val];
        for (uint32_t i = 0; i < len; i++) emit(c, c->memo_ids[c->memo_len[hit->val + 1] + i]);
        return;
    }
    size_t ns = bpe_initial_symbols(c, w, n);
    ns = ns > tk->heap_threshold ? bpe_merge_heap(c, ns) : bpe_merge_scan(tk, c->sym, ns);
    for (size_t i = 0; i < ns; i++) emit(c, c->sym[i]);
    /* memoise (bounded: a pathological input of only unique words must not grow without end) */
    if (c->memo.n >= (1u << 22)) return;
    if (c->memo_n + ns > c->memo_cap) c->memo_ids = m2d_realloc(c->memo_ids, (c->memo_cap = M2D_MAX(c->memo_n + ns, c->memo_cap * 2)) * sizeof *c->memo_ids);
    if (2 * c->memo.n + 2 > c->memo_len_cap) c->memo_len = m2d_realloc(c->memo_len, (c->memo_len_cap = M2D_MAX(2 * c->memo.n + 2, c->memo_len_cap * 2)) * sizeof *c->memo_len);
    /* memo_len[2k] = length, memo_len[2k+1] = offset into memo_ids of entry k */
    int32_t slot = (int32_t)(2 * c->memo.n);
    c->memo_len[slot] = (uint32_t)ns;
    c->memo_len[slot + 1] = (uint32_t)c->memo_n;
    memcpy(c->memo_ids + c->memo_n, c->sym, ns * sizeof *c->sym);
    c->memo_n += ns;
    strmap_put(&c->memo, w, n, slot);
}

/* The code point at w[i] when it is a one-character vocab token, else -1. */
static int64_t vocab_char_at(const m2d_tokenizer *tk, const char *w, size_t n, size_t i, int *len) {
    uint32_t cp;
    *len = m2d_utf8_next((const unsigned char *)w, n, i, &cp);
    if (*len < 0) { /* not reached: pieces are valid UTF-8 */
        *len = 1;
        return -1;
    }
    int32_t id = cp < 0x800 ? tk->char_id[cp] : lookup_model_token(tk, w + i, (size_t)*len);
    return id >= 0 ? (int64_t)cp : -1;
}

/* BPE of one piece: long words cut where no merge reaches across (word_cuts_init), each part on its
 * own (and memoised). */
static void bpe_piece(enc_ctx *c, const char *w, size_t n) {
    const m2d_tokenizer *tk = c->tk;
    if (!tk->cut_pairs.keys || n <= tk->cut_min) {
        bpe_word(c, w, n);
        return;
    }
    size_t start = 0;
    int len;
    int64_t prev = vocab_char_at(tk, w, n, 0, &len);
    int32_t unused;
    for (size_t i = (size_t)len; i < n; i += (size_t)len) {
        int64_t cp = vocab_char_at(tk, w, n, i, &len);
        if (prev >= 0 && cp >= 0 && pairmap_get(&tk->cut_pairs, (int32_t)prev, (int32_t)cp, &unused) < 0) {
            bpe_word(c, w + start, i - start);
            start = i;
        }
        prev = cp;
    }
    bpe_word(c, w + start, n - start);
}

/* -- pre-tokenization --------------------------------------------------------------------------- */

static int run_stage(enc_ctx *c, int depth, const char *s, size_t n, int first);

/* The kept spans of c->depth[depth] (pieces of s) on to the next stage, each mapped to the
 * byte-level alphabet when byte_level. A piece is "first" when it starts where s does and s
 * starts at the input's offset 0 (HF: offsets_original().0 == 0). */
static int next_stage_pieces(enc_ctx *c, int depth, const char *s, int first, int byte_level) {
    depth_scratch *d = &c->depth[depth];
    /* deeper stages use their own scratch, so d->spans and d->buf2 survive the recursion */
    int rc = 0;
    for (size_t i = 0; i < d->spans.n && !rc; i++) {
        const m2d_tkspan *sp = &d->spans.v[i];
        if (sp->m || sp->e == sp->s) continue;
        const char *p = s + sp->s;
        size_t len = sp->e - sp->s;
        int piece_first = first && sp->s == 0;
        if (!byte_level) {
            rc = run_stage(c, depth + 1, p, len, piece_first);
            continue;
        }
        m2d_tk_reserve(&d->buf2, &d->cap2, 2 * len);
        size_t o = 0;
        for (size_t j = 0; j < len; j++) {
            size_t k;
            const char *u = m2d_bytelevel_char((unsigned char)p[j], &k);
            memcpy(d->buf2 + o, u, k);
            o += k;
        }
        rc = run_stage(c, depth + 1, d->buf2, o, piece_first);
    }
    return rc;
}

/* ByteLevel: optional prefix space, optional GPT-2 split, then bytes -> alphabet. */
static int bytelevel_stage(enc_ctx *c, int depth, const stage *st, const char *s, size_t n, int first) {
    depth_scratch *d = &c->depth[depth];
    if (st->add_prefix_space && s[0] != ' ') {
        m2d_tk_reserve(&d->buf, &d->cap, n + 1);
        d->buf[0] = ' ';
        memcpy(d->buf + 1, s, n);
        s = d->buf;
        n++;
    }
    if (m2d_tkre_find(st->re, c->rs.md, s, n, &d->spans)) return -1;
    m2d_tkspans_split(&d->spans, M2D_SPLIT_ISOLATED, 0);
    return next_stage_pieces(c, depth, s, first, 1);
}

/* Metaspace: spaces become the replacement, which is prepended (prepend_scheme "always", or
 * "first" on the input's first piece) unless already there; split: cut before each one. */
static int metaspace_stage(enc_ctx *c, int depth, const stage *st, const char *s, size_t n, int first) {
    depth_scratch *d = &c->depth[depth];
    const m2d_tkmetaspace *m = &st->meta;
    size_t spaces = 0, o = 0;
    for (size_t i = 0; i < n; i++) spaces += s[i] == ' ';
    m2d_tk_reserve(&d->buf, &d->cap, n + (spaces + 1) * m->repl_n);
    int starts = s[0] == ' ' || (n >= m->repl_n && !memcmp(s, m->repl, m->repl_n));
    if (!starts && (m->scheme == M2D_PREPEND_ALWAYS || (m->scheme == M2D_PREPEND_FIRST && first)))
        memcpy(d->buf, m->repl, m->repl_n), o = m->repl_n;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != ' ') d->buf[o++] = s[i];
        else memcpy(d->buf + o, m->repl, m->repl_n), o += m->repl_n;
    }
    if (!m->split) return run_stage(c, depth + 1, d->buf, o, first);
    m2d_tk_find_literal(m->repl, m->repl_n, d->buf, o, &d->spans);
    m2d_tkspans_split(&d->spans, M2D_SPLIT_MERGED_NEXT, 0);
    return next_stage_pieces(c, depth, d->buf, first, 0);
}

static int run_stage(enc_ctx *c, int depth, const char *s, size_t n, int first) {
    const m2d_tokenizer *tk = c->tk;
    if (n == 0) return 0;
    if (depth == tk->n_stages) {
        bpe_piece(c, s, n);
        return 0;
    }
    const stage *st = &tk->stages[depth];
    depth_scratch *d = &c->depth[depth];
    switch (st->kind) {
    case STAGE_SPLIT:
        if (m2d_tkre_find(st->re, c->rs.md, s, n, &d->spans)) return -1;
        m2d_tkspans_split(&d->spans, st->behavior, st->invert);
        return next_stage_pieces(c, depth, s, first, 0);
    case STAGE_DIGITS:
        m2d_tk_find_chars(m2d_is_numeric, s, n, &d->spans);
        m2d_tkspans_split(&d->spans, st->behavior, 0);
        return next_stage_pieces(c, depth, s, first, 0);
    case STAGE_METASPACE:
        return metaspace_stage(c, depth, st, s, n, first);
    default:
        return bytelevel_stage(c, depth, st, s, n, first);
    }
}

/* -- added tokens ------------------------------------------------------------------------------ */

/* Leftmost-longest match of the set in s[from..n): returns the added index or -1. */
static int added_find(const m2d_tokenizer *tk, const added_set *set, const char *s, size_t n, size_t from, size_t *at) {
    for (size_t i = from; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        int best = -1;
        size_t best_len = 0;
        for (int k = set->start[b]; k < set->start[b + 1]; k++) {
            const added_token *a = &tk->added[set->idx[k]];
            if (a->match_len > best_len && a->match_len <= n - i && !memcmp(s + i, a->match, a->match_len))
                best = set->idx[k], best_len = a->match_len;
        }
        if (best >= 0) {
            *at = i;
            return best;
        }
    }
    return -1;
}

typedef int (*segment_fn)(enc_ctx *c, const char *s, size_t n);

/* HF AddedVocabulary::find_matches + split: emit added-token ids, pass the text between to fn. */
static int split_added(enc_ctx *c, const added_set *set, const char *s, size_t n, segment_fn fn) {
    const m2d_tokenizer *tk = c->tk;
    if (!set->n) return fn(c, s, n);
    size_t start_offset = 0, from = 0, at;
    int k;
    while (from < n && (k = added_find(tk, set, s, n, from, &at)) >= 0) {
        const added_token *a = &tk->added[k];
        size_t start = at, stop = at + a->match_len;
        from = stop; /* the automaton resumes after the match, whatever happens to it */
        if (a->single_word) {
            size_t p;
            int start_space = start == 0 || !m2d_is_word_char(m2d_utf8_prev(s, start, &p));
            uint32_t cp = 0;
            int stop_space = stop == n || (m2d_utf8_next((const unsigned char *)s, n, stop, &cp), !m2d_is_word_char(cp));
            if (!start_space || !stop_space) continue;
        }
        if (a->lstrip) {
            size_t ns = start, p;
            while (ns > 0 && m2d_is_white_space(m2d_utf8_prev(s, ns, &p))) ns = p;
            start = M2D_MAX(ns, start_offset);
        }
        if (a->rstrip) {
            uint32_t cp;
            int len;
            while (stop < n && (len = m2d_utf8_next((const unsigned char *)s, n, stop, &cp)) > 0 && m2d_is_white_space(cp))
                stop += (size_t)len;
        }
        if (start_offset < start && fn(c, s + start_offset, start - start_offset)) return -1;
        emit(c, a->id);
        start_offset = stop;
    }
    if (start_offset < n) return fn(c, s + start_offset, n - start_offset);
    return 0;
}

static int pre_tokenize_segment(enc_ctx *c, const char *s, size_t n) {
    return run_stage(c, 0, s, n, c->seg_first && s == c->norm_base);
}

static int normalized_segment(enc_ctx *c, const char *s, size_t n) {
    char *owned;
    const char *t = s;
    int moved = 0;
    if (normalize(c->tk, &c->rs, &t, &n, &owned, &moved)) return -1;
    c->norm_base = t;
    c->seg_first = s == c->text && !moved;
    int rc = split_added(c, &c->tk->norm_set, t, n, pre_tokenize_segment);
    free(owned);
    return rc;
}

static void enc_free(enc_ctx *c) {
    for (int i = 0; i <= MAX_STAGES; i++) {
        free(c->depth[i].buf);
        free(c->depth[i].buf2);
        free(c->depth[i].spans.v);
    }
    re_scratch_free(&c->rs);
    strmap_free(&c->memo);
    free(c->memo_ids);
    free(c->memo_len);
    free(c->sym);
    free(c->prev);
    free(c->next);
    free(c->heap);
}

int m2d_tokenizer_encode(const m2d_tokenizer *tk, const char *text, size_t len, int32_t **ids, size_t *n_ids) {
    *ids = NULL;
    *n_ids = 0;
    size_t bad = m2d_utf8_first_invalid(text, len);
    if (bad != len) return m2d_err("invalid UTF-8 at byte offset %zu", bad);
    enc_ctx c;
    memset(&c, 0, sizeof c);
    c.tk = tk;
    c.text = text;
    re_scratch_init(&c.rs);
    strmap_init(&c.memo, M2D_MIN(len / 8 + 16, (size_t)1 << 16));
    int rc = split_added(&c, &tk->raw_set, text, len, normalized_segment);
    if (rc == 0) {
        *ids = c.ids ? c.ids : m2d_malloc(sizeof(int32_t));
        *n_ids = c.n;
    } else {
        free(c.ids);
        m2d_err_prefix(tk->path);
    }
    enc_free(&c);
    return rc;
}

int m2d_tokenizer_encode_special(const m2d_tokenizer *tk, const char *text, size_t len, int32_t **ids, size_t *n_ids) {
    int32_t *body;
    size_t n;
    if (m2d_tokenizer_encode(tk, text, len, &body, &n)) {
        *ids = NULL;
        *n_ids = 0;
        return -1;
    }
    const m2d_tkpost *p = &tk->post;
    int32_t *all = m2d_malloc((p->n_pre + n + p->n_post + 1) * sizeof *all);
    if (p->n_pre) memcpy(all, p->pre, p->n_pre * sizeof *all);
    if (n) memcpy(all + p->n_pre, body, n * sizeof *all);
    if (p->n_post) memcpy(all + p->n_pre + n, p->post, p->n_post * sizeof *all);
    free(body);
    *ids = all;
    *n_ids = p->n_pre + n + p->n_post;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Decoding                                                                                     */

static int decode_run(const m2d_tokenizer *tk, const int32_t *ids, size_t n, int raw, m2d_tkbuf *out) {
    const char **toks = m2d_malloc((n ? n : 1) * sizeof *toks);
    uint32_t *lens = m2d_malloc((n ? n : 1) * sizeof *lens);
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= tk->n_ids) rc = m2d_err("id %ld (position %zu) out of range [0, %d)", (long)id, i, tk->n_ids);
        else if (!tk->id_tok[id]) rc = m2d_err("id %ld (position %zu) has no token in the vocabulary", (long)id, i);
        else toks[i] = tk->id_tok[id], lens[i] = tk->id_len[id];
    }
    if (!rc) rc = m2d_tkdecoder_run(tk->decoder, toks, lens, n, raw, out);
    free(toks);
    free(lens);
    return rc;
}

int m2d_tokenizer_decode_bytes(const m2d_tokenizer *tk, const int32_t *ids, size_t n, char **bytes, size_t *len) {
    m2d_tkbuf b = {0};
    *bytes = NULL;
    *len = 0;
    if (decode_run(tk, ids, n, 1, &b)) {
        free(b.p);
        return -1;
    }
    *bytes = b.p;
    *len = b.n;
    return 0;
}

int m2d_tokenizer_decode(const m2d_tokenizer *tk, const int32_t *ids, size_t n, char **text, size_t *len) {
    m2d_tkbuf b = {0};
    *text = NULL;
    *len = 0;
    if (decode_run(tk, ids, n, 0, &b)) {
        free(b.p);
        return -1;
    }
    if (m2d_utf8_first_invalid(b.p, b.n) != b.n) { /* only from invalid UTF-8 in a token string itself */
        m2d_tkbuf l = {0};
        m2d_tkbuf_put_lossy(&l, b.p, b.n);
        free(b.p);
        b = l;
    }
    *text = b.p;
    *len = b.n;
    return 0;
}
