/* lm_engine — the engine-backed log-likelihood scorer (part of the lm module, see lm.h).
 *
 * Cached mode: the requests of one call (the choices of one document) share a token prefix;
 * it is run once into a KV cache that persists across calls (so MMLU's description + 5 dev
 * shots, identical for every question of a subject, are computed once per subject), and every
 * request's remaining tokens run as branches of one batch (m2d_engine_branches).
 * Naive mode: one full forward per request with full logits (lm-eval's way; also gives
 * is_greedy exactly). Both use the same tokenization (m2d_ll_tokenize). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "evals/lm.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "base/util.h"

typedef struct {
    m2d_lm lm;
    m2d_model *model;      /* owned only when `owns` (m2d_lm_engine_open) */
    m2d_engine *eng;
    const m2d_tokenizer *tok;
    int owns;
    m2d_lm_mode mode;
    int max_length, prefix_token;
    m2d_kv *kv;            /* holds K/V of cached[0..n_cached) */
    int kv_cap;
    int32_t *cached;
    int n_cached;
    m2d_lm_stats stats;
} engine_lm;

static int encode(void *user, const char *text, size_t len, int32_t **ids, size_t *n) {
    /* user is the (const) tokenizer */
    return m2d_tokenizer_encode(user, text, len, ids, n);
}

/* lm-eval's per-request scoring from full logits: sum of log-softmax at the continuation
 * positions (in double) and greedy = every target is the first argmax (torch/numpy argmax). */
static int score_naive(engine_lm *E, const m2d_ll_tokens *t, m2d_ll_result *out) {
    int n_in = t->n - 1, V = m2d_engine_model(E->eng)->cfg.vocab_size; /* a wrapped scorer has no E->model */
    if (t->tokens[t->n - 1] < 0 || t->tokens[t->n - 1] >= V) /* the engine checks the inputs, not the last target */
        return m2d_err("lm: continuation token %d outside the model's vocabulary [0, %d)", t->tokens[t->n - 1], V);
    float *logits = m2d_malloc(sizeof(float) * (size_t)n_in * (size_t)V);
    if (m2d_engine_logits(E->eng, t->tokens, n_in, logits)) { free(logits); return -1; }
    double ll = 0;
    int greedy = 1;
    for (int j = n_in - t->n_cont; j < n_in; j++) {
        const float *z = logits + (size_t)j * V;
        int arg = 0;
        for (int v = 1; v < V; v++) if (z[v] > z[arg]) arg = v;
        double s = 0;
        for (int v = 0; v < V; v++) s += exp((double)z[v] - z[arg]);
        int32_t target = t->tokens[j + 1];
        ll += (double)z[target] - z[arg] - log(s);
        if (arg != target) greedy = 0;
    }
    free(logits);
    E->stats.tokens_forwarded += n_in;
    out->ll = ll;
    out->is_greedy = greedy;
    return 0;
}

/* One forward per request, log-probs only where they are scored (no cache, no full logits). */
static int score_naive_lp(engine_lm *E, const m2d_ll_tokens *t, m2d_ll_result *out) {
    int n_in = t->n - 1, first = n_in - t->n_cont;
    double *lp = m2d_malloc(sizeof(double) * (size_t)t->n_cont);
    if (m2d_engine_logprobs(E->eng, t->tokens, n_in, t->tokens + 1, first, lp)) { free(lp); return -1; }
    double ll = 0;
    for (int i = 0; i < t->n_cont; i++) ll += lp[i];
    free(lp);
    E->stats.tokens_forwarded += n_in;
    out->ll = ll;
    out->is_greedy = -1;
    return 0;
}

static int common_prefix(const int32_t *a, int na, const int32_t *b, int nb) {
    int i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    return i;
}

/* Make the KV cache hold exactly tokens[0..p), reusing what it already has. */
static int cache_prefix(engine_lm *E, const int32_t *tokens, int p) {
    if (p > E->kv_cap) {
        int cap = E->kv_cap ? E->kv_cap : 256;
        while (cap < p) cap *= 2;
        if (cap > E->max_length) cap = E->max_length;
        m2d_kv_free(E->kv);
        E->kv = m2d_kv_new(E->eng, cap);
        if (!E->kv) { E->kv_cap = 0; E->n_cached = 0; return -1; }
        E->kv_cap = cap;
        E->cached = m2d_realloc(E->cached, sizeof(int32_t) * (size_t)cap);
        E->n_cached = 0;
    }
    int keep = common_prefix(E->cached, E->n_cached, tokens, p);
    m2d_kv_truncate(E->kv, keep);
    E->n_cached = keep;
    if (p > keep) {
        if (m2d_engine_extend(E->eng, E->kv, tokens + keep, p - keep, NULL, NULL)) {
            m2d_kv_truncate(E->kv, 0);
            E->n_cached = 0;
            return -1;
        }
        memcpy(E->cached + keep, tokens + keep, sizeof(int32_t) * (size_t)(p - keep));
        E->n_cached = p;
        E->stats.tokens_forwarded += p - keep;
    }
    return 0;
}

static int score_cached(engine_lm *E, const m2d_ll_tokens *t, int n, m2d_ll_result *out) {
    /* shared prefix P: common to all requests, and short enough that every scored position
     * (input index N - 1 - n_cont ...) lies in the branch: P <= N - 1 - n_cont */
    int P = -1, first = -1;
    for (int r = 0; r < n; r++) {
        if (t[r].n_cont == 0) continue;
        int lim = t[r].n - 1 - t[r].n_cont;
        if (first < 0) { first = r; P = lim; continue; }
        P = M2D_MIN(P, lim);
        P = M2D_MIN(P, common_prefix(t[first].tokens, t[first].n, t[r].tokens, t[r].n));
    }
    if (first < 0) return 0; /* nothing to score */
    if (P > 0 && cache_prefix(E, t[first].tokens, P)) return -1;
    const int32_t **toks = m2d_calloc((size_t)n, sizeof *toks), **tgts = m2d_calloc((size_t)n, sizeof *tgts);
    int *lens = m2d_calloc((size_t)n, sizeof *lens), nb = 0, *which = m2d_calloc((size_t)n, sizeof *which);
    double **lps = m2d_calloc((size_t)n, sizeof *lps);
    for (int r = 0; r < n; r++) {
        if (t[r].n_cont == 0) continue;
        toks[nb] = t[r].tokens + P;
        tgts[nb] = t[r].tokens + P + 1;
        lens[nb] = t[r].n - 1 - P;
        lps[nb] = m2d_malloc(sizeof(double) * (size_t)lens[nb]);
        which[nb++] = r;
        E->stats.tokens_forwarded += t[r].n - 1 - P;
    }
    int rc = m2d_engine_branches(E->eng, P > 0 ? E->kv : NULL, nb, toks, lens, tgts, lps);
    for (int b = 0; b < nb && !rc; b++) {
        const m2d_ll_tokens *q = &t[which[b]];
        double ll = 0;
        for (int i = lens[b] - q->n_cont; i < lens[b]; i++) ll += lps[b][i];
        out[which[b]].ll = ll;
        out[which[b]].is_greedy = -1; /* not available from the streamed log-probs (use naive mode) */
    }
    for (int b = 0; b < nb; b++) free(lps[b]);
    free(lps); free(toks); free(tgts); free(lens); free(which);
    return rc;
}

static int engine_loglikelihood(m2d_lm *lm, const m2d_ll_request *reqs, int n, m2d_ll_result *out) {
    engine_lm *E = lm->impl;
    m2d_ll_tokens *t = m2d_calloc((size_t)n, sizeof *t);
    int rc = 0;
    for (int r = 0; r < n && !rc; r++) {
        rc = m2d_ll_tokenize(encode, (void *)E->tok, E->prefix_token, E->max_length, &reqs[r], &t[r]);
        out[r].ll = 0;        /* an empty continuation scores 0 and is trivially greedy */
        out[r].is_greedy = 1;
    }
    int64_t naive_cost = 0;
    for (int r = 0; r < n && !rc; r++) if (t[r].n_cont) naive_cost += t[r].n - 1;
    int64_t before = E->stats.tokens_forwarded;
    if (!rc) {
        if (E->mode == M2D_LM_NAIVE || E->mode == M2D_LM_NAIVE_LP) {
            for (int r = 0; r < n && !rc; r++)
                if (t[r].n_cont)
                    rc = E->mode == M2D_LM_NAIVE ? score_naive(E, &t[r], &out[r]) : score_naive_lp(E, &t[r], &out[r]);
        } else {
            rc = score_cached(E, t, n, out);
        }
    }
    if (!rc) {
        E->stats.requests += n;
        E->stats.tokens_reused += naive_cost - (E->stats.tokens_forwarded - before);
    }
    for (int r = 0; r < n; r++) m2d_ll_tokens_free(&t[r]);
    free(t);
    return rc;
}

int m2d_lm_engine_score_all(m2d_lm *lm, const m2d_ll_request *reqs, int n, m2d_ll_result *out) {
    engine_lm *E = lm->impl;
    m2d_ll_tokens *t = m2d_calloc((size_t)n + 1, sizeof *t);
    int *which = m2d_calloc((size_t)n + 1, sizeof(int)), nw = 0, rc = 0; /* window -> request */
    m2d_window_arrays a;
    m2d_window_arrays_init(&a, n);
    for (int r = 0; r < n && !rc; r++) {
        rc = m2d_ll_tokenize(encode, (void *)E->tok, E->prefix_token, E->max_length, &reqs[r], &t[r]);
        out[r] = (m2d_ll_result){0, 1}; /* an empty continuation scores 0 and is trivially greedy */
        if (rc || !t[r].n_cont) continue;
        /* the window is the request's input; its targets, the same tokens shifted by one */
        a.tokens[nw] = t[r].tokens, a.targets[nw] = t[r].tokens + 1;
        a.lens[nw] = t[r].n - 1, a.first[nw] = t[r].n - 1 - t[r].n_cont;
        a.lp[nw] = m2d_malloc(sizeof(double) * (size_t)t[r].n_cont);
        which[nw++] = r;
        E->stats.tokens_forwarded += t[r].n - 1;
    }
    a.set.n = nw;
    if (!rc) rc = m2d_engine_logprobs_windows(E->eng, &a.set, "multiple choice (one pass)");
    for (int w = 0; w < nw && !rc; w++) {
        double ll = 0;
        for (int i = 0; i < a.lens[w] - a.first[w]; i++) ll += a.lp[w][i];
        out[which[w]] = (m2d_ll_result){ll, -1};
    }
    if (!rc) E->stats.requests += n;
    for (int r = 0; r < n; r++) m2d_ll_tokens_free(&t[r]);
    m2d_window_arrays_free(&a);
    free(t), free(which);
    return rc;
}

static void engine_free(m2d_lm *lm) {
    engine_lm *E = lm->impl;
    m2d_kv_free(E->kv);
    free(E->cached);
    if (E->owns) {
        m2d_engine_free(E->eng);
        m2d_tokenizer_free((m2d_tokenizer *)E->tok);
        m2d_model_close(E->model);
    }
    free(E);
}

static void engine_lm_init(engine_lm *E, m2d_lm_mode mode, int max_length) {
    /* lm-eval's max_length: the config's max_position_embeddings; the prefix token for an
     * empty context: BOS, else EOS */
    const m2d_config *c = &m2d_engine_model(E->eng)->cfg;
    int mp = c->max_position_embeddings;
    E->max_length = max_length > 0 && max_length < mp ? max_length : mp;
    E->prefix_token = m2d_tokenizer_bos_id(E->tok);
    if (E->prefix_token < 0) E->prefix_token = c->bos_token_id;
    if (E->prefix_token < 0) E->prefix_token = m2d_tokenizer_eos_id(E->tok);
    if (E->prefix_token < 0) E->prefix_token = c->eos_token_id;
    E->mode = mode;
    E->lm.name = "engine";
    E->lm.loglikelihood = engine_loglikelihood;
    E->lm.free = engine_free;
    E->lm.impl = E;
}

int m2d_lm_engine_wrap(m2d_engine *eng, const m2d_tokenizer *tok, m2d_lm_mode mode, int max_length, m2d_lm **out) {
    engine_lm *E = m2d_calloc(1, sizeof *E);
    E->eng = eng;
    E->tok = tok;
    engine_lm_init(E, mode, max_length);
    *out = &E->lm;
    return 0;
}

int m2d_lm_engine_open(const char *dir, const m2d_engine_opts *eo, m2d_lm_mode mode, int max_length, m2d_lm **out) {
    engine_lm *E = m2d_calloc(1, sizeof *E);
    m2d_tokenizer *tk = NULL;
    /* lazily: the engine acquires each layer it runs (a layer-major pass one at a time) */
    if (m2d_model_open_lazy(dir, &E->model)) { free(E); return -1; }
    if (m2d_engine_open(E->model, eo, &E->eng) || m2d_tokenizer_load(dir, &tk)) {
        m2d_engine_free(E->eng);
        m2d_model_close(E->model);
        free(E);
        return -1;
    }
    E->tok = tk;
    E->owns = 1;
    engine_lm_init(E, mode, max_length);
    *out = &E->lm;
    return 0;
}

m2d_engine *m2d_lm_engine_of(const m2d_lm *lm) {
    return lm && lm->free == engine_free ? ((const engine_lm *)lm->impl)->eng : NULL;
}

int m2d_lm_engine_stats(const m2d_lm *lm, m2d_lm_stats *out) {
    if (!lm || lm->free != engine_free) return m2d_err("lm: not an engine-backed scorer");
    *out = ((const engine_lm *)lm->impl)->stats;
    return 0;
}

void m2d_lm_engine_set_mode(m2d_lm *lm, m2d_lm_mode mode) {
    if (lm && lm->free == engine_free) ((engine_lm *)lm->impl)->mode = mode;
}
