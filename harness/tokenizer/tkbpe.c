/* tkbpe — the BPE model of a tokenizer.json: vocab and merges, byte fallback, unknown tokens
 * (fused or not), continuing-subword prefix and end-of-word suffix, the cuts of long words, and BPE of
 * one piece (rank-ordered merges by a direct scan or a priority queue, memoised per encode). */
#include "tokenizer/tkimpl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

int32_t m2d_tkbpe_token_id(const m2d_tokenizer *tk, const char *s, size_t n) {
    return m2d_strmap_get(&tk->vocab, s, n);
}

/* model.vocab {token: id}, and model.unk_token (UNK, may be NULL) looked up in it. */
static int load_vocab(m2d_tokenizer *tk, const loadctx *L, const cJSON *model, const char *unk) {
    const cJSON *vocab = m2d_tkj_get(model, "vocab");
    if (!cJSON_IsObject(vocab)) return m2d_tk_field_err(L, "model.vocab", "expected an object {token: id}");
    int nv = cJSON_GetArraySize(vocab);
    m2d_strmap_init(&tk->vocab, (size_t)nv);
    for (const cJSON *v = vocab->child; v; v = v->next) {
        if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > MAX_ID ||
            v->valuedouble != (double)(int32_t)v->valuedouble) {
            char f[160];
            snprintf(f, sizeof f, "model.vocab.%.120s", v->string);
            return m2d_tk_field_err(L, f, "expected an integer id in [0, " MAX_ID_STR "]");
        }
        m2d_strmap_put(&tk->vocab, v->string, strlen(v->string), (int32_t)v->valuedouble);
    }
    tk->unk_id = -1;
    if (unk) {
        tk->unk_id = m2d_tkbpe_token_id(tk, unk, strlen(unk));
        if (tk->unk_id < 0) return m2d_tk_field_err(L, "model.unk_token", "not in model.vocab");
    }
    return 0;
}

/* model.merges, in rank order: each pair and its merged token must be in the vocab. */
static int load_merges(m2d_tokenizer *tk, const loadctx *L, const cJSON *model) {
    const cJSON *merges = m2d_tkj_get(model, "merges");
    if (!cJSON_IsArray(merges)) return m2d_tk_field_err(L, "model.merges", "expected an array");
    int nm = cJSON_GetArraySize(merges);
    m2d_pairmap_init(&tk->merges, (size_t)nm);
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
                return m2d_tk_field_err(L, f, "expected \"left right\" (two tokens separated by a space)");
            }
            a = m->valuestring, alen = (size_t)(sp - a);
            b = sp + 1, blen = strlen(b);
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) &&
                   cJSON_IsString(m->child->next)) { /* ["a", "b"] (tokenizers >= 0.20) */
            a = m->child->valuestring, alen = strlen(a);
            b = m->child->next->valuestring, blen = strlen(b);
        } else {
            free(joined);
            return m2d_tk_field_err(L, f, "expected \"left right\" or [\"left\", \"right\"]");
        }
        int32_t ia = m2d_tkbpe_token_id(tk, a, alen), ib = m2d_tkbpe_token_id(tk, b, blen);
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
        int32_t im = m2d_tkbpe_token_id(tk, joined, alen + blen - plen);
        if (im < 0) {
            m2d_err("%s: field '%s': merged token '%.*s' is not in model.vocab", L->path, f,
                    (int)(alen + blen - plen), joined);
            free(joined);
            return -1;
        }
        m2d_pairmap_put(&tk->merges, ia, ib, rank, im);
    }
    free(joined);
    return 0;
}

int m2d_tkbpe_load(m2d_tokenizer *tk, const loadctx *L, const cJSON *model) {
    if (!cJSON_IsObject(model)) return m2d_tk_field_err(L, "model", "expected an object");
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

/* Pipelines whose pre-tokenizers never split (SentencePiece style: Prepend + Replace, or Metaspace
 * without split) hand BPE the whole text as one word, which the memo cannot help. Such a word can be
 * cut between two characters a, b when no vocab token contains "ab": no merge then produces a symbol
 * across the cut, merges on either side never see the other, so BPE of the parts is BPE of the
 * whole. The cut also needs both characters to be one-character vocab tokens (a dropped unknown
 * character lets its neighbours merge, fused unks join across it) and no ignore_merges, prefix or
 * suffix (they depend on where the word starts and ends). Records the pairs in tk->cut_pairs. */
void m2d_tkbpe_word_cuts(m2d_tokenizer *tk) {
    for (int i = 0; i < tk->n_stages; i++) {
        const stage *st = &tk->stages[i];
        int splits = st->kind == STAGE_METASPACE ? st->meta.split : st->kind == STAGE_BYTELEVEL ? st->re != NULL : 1;
        if (splits) return;
    }
    if (tk->ignore_merges || tk->subword_prefix || tk->word_suffix) return;
    size_t pairs = 0; /* at most one per byte of the vocab: the table never fills */
    for (size_t i = 0; i < tk->vocab.n; i++) pairs += tk->vocab.e[i].len;
    m2d_pairmap_init(&tk->cut_pairs, pairs);
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
            if (prev >= 0) m2d_pairmap_put(&tk->cut_pairs, (int32_t)prev, (int32_t)cp, 0, 0);
            prev = cp;
            j += (size_t)k;
        }
    }
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
            id = cp < 0x800 ? tk->char_id[cp] : m2d_tkbpe_token_id(tk, w + i, (size_t)k);
        } else {
            size_t len = (first ? 0 : plen) + (size_t)k + (last ? slen : 0);
            m2d_tk_reserve(&tmp, &tmp_cap, len);
            size_t o = 0;
            if (!first && plen) memcpy(tmp, tk->subword_prefix, plen), o = plen;
            memcpy(tmp + o, w + i, (size_t)k), o += (size_t)k;
            if (last && slen) memcpy(tmp + o, tk->word_suffix, slen), o += slen;
            id = m2d_tkbpe_token_id(tk, tmp, o);
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
            int32_t r = m2d_pairmap_get(&tk->merges, s[i], s[i + 1], &merged);
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
        int32_t r = m2d_pairmap_get(&tk->merges, s[i], s[i + 1], &merged);
        if (r >= 0) heap_push(c, &hn, r, (int32_t)i);
    }
    while (hn) {
        struct heap_item it = heap_pop(c, &hn);
        int32_t i = it.pos, j = next[i];
        if (s[i] < 0 || j < 0) continue; /* merged away, or now the last symbol */
        int32_t r = m2d_pairmap_get(&tk->merges, s[i], s[j], &merged);
        if (r != it.rank) continue; /* stale: the pair at i changed since it was queued */
        s[i] = merged;
        s[j] = -1;
        next[i] = next[j];
        if (next[j] >= 0) prev[next[j]] = i;
        if (prev[i] >= 0 && (r = m2d_pairmap_get(&tk->merges, s[prev[i]], s[i], &merged)) >= 0) heap_push(c, &hn, r, prev[i]);
        if (next[i] >= 0 && (r = m2d_pairmap_get(&tk->merges, s[i], s[next[i]], &merged)) >= 0) heap_push(c, &hn, r, i);
    }
    size_t o = 0;
    for (int32_t i = n ? 0 : -1; i >= 0; i = next[i]) s[o++] = s[i];
    return o;
}

static void bpe_word(enc_ctx *c, const char *w, size_t n) {
    const m2d_tokenizer *tk = c->tk;
    if (tk->ignore_merges) {
        int32_t id = m2d_tkbpe_token_id(tk, w, n);
        if (id >= 0) {
            m2d_tk_emit(c, id);
            return;
        }
    }
    const m2d_strmap_entry *hit = m2d_strmap_find(&c->memo, w, n, m2d_tk_hash_bytes(w, n));
    if (hit) {
        uint32_t len = c->memo_len[hit->val];
        for (uint32_t i = 0; i < len; i++) m2d_tk_emit(c, c->memo_ids[c->memo_len[hit->val + 1] + i]);
        return;
    }
    size_t ns = bpe_initial_symbols(c, w, n);
    ns = ns > tk->heap_threshold ? bpe_merge_heap(c, ns) : bpe_merge_scan(tk, c->sym, ns);
    for (size_t i = 0; i < ns; i++) m2d_tk_emit(c, c->sym[i]);
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
    m2d_strmap_put(&c->memo, w, n, slot);
}

/* The code point at w[i] when it is a one-character vocab token, else -1. */
static int64_t vocab_char_at(const m2d_tokenizer *tk, const char *w, size_t n, size_t i, int *len) {
    uint32_t cp;
    *len = m2d_utf8_next((const unsigned char *)w, n, i, &cp);
    if (*len < 0) { /* not reached: pieces are valid UTF-8 */
        *len = 1;
        return -1;
    }
    int32_t id = cp < 0x800 ? tk->char_id[cp] : m2d_tkbpe_token_id(tk, w + i, (size_t)*len);
    return id >= 0 ? (int64_t)cp : -1;
}

/* BPE of one piece: long words cut where no merge reaches across (m2d_tkbpe_word_cuts), each part on its
 * own (and memoised). */
void m2d_tkbpe_piece(enc_ctx *c, const char *w, size_t n) {
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
        if (prev >= 0 && cp >= 0 && m2d_pairmap_get(&tk->cut_pairs, (int32_t)prev, (int32_t)cp, &unused) < 0) {
            bpe_word(c, w + start, i - start);
            start = i;
        }
        prev = cp;
    }
    bpe_word(c, w + start, n - start);
}
