/* lm — scorer interface and lm-eval's (context, continuation) → tokens rules. */
#include "evals/lm.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/util.h"

int m2d_lm_loglikelihood(m2d_lm *lm, const m2d_ll_request *reqs, int n, m2d_ll_result *out) {
    if (n <= 0) return 0;
    return lm->loglikelihood(lm, reqs, n, out);
}

void m2d_lm_free(m2d_lm *lm) {
    if (lm && lm->free) lm->free(lm);
}

/* Python's str.isspace for one code point: bidirectional class WS, B or S, or category Zs. */
int m2d_py_isspace(int32_t cp) {
    const utf8proc_property_t *p = utf8proc_get_property(cp);
    return p->category == UTF8PROC_CATEGORY_ZS || p->bidi_class == UTF8PROC_BIDI_CLASS_WS ||
           p->bidi_class == UTF8PROC_BIDI_CLASS_B || p->bidi_class == UTF8PROC_BIDI_CLASS_S;
}

size_t m2d_py_rstrip_len(const char *s, size_t len) {
    while (len > 0) {
        size_t st = len - 1; /* back to the first byte of the last code point */
        while (st > 0 && ((unsigned char)s[st] & 0xC0) == 0x80 && len - st < 4) st--;
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + st, (utf8proc_ssize_t)(len - st), &cp);
        if (k <= 0 || (size_t)k != len - st || !m2d_py_isspace(cp)) break;
        len = st;
    }
    return len;
}

int m2d_ll_tokenize(m2d_encode_fn enc, void *user, int prefix_token, int max_length,
                    const m2d_ll_request *req, m2d_ll_tokens *out) {
    memset(out, 0, sizeof *out);
    const char *ctx = req->context, *cont = req->continuation;
    size_t lc = strlen(ctx), lk = strlen(cont);
    int32_t *ctx_ids = NULL, *cont_ids = NULL;
    size_t n_ctx = 0, n_cont = 0;
    if (lc == 0) {
        /* empty context: a single prefix token (BOS, or EOS without BOS), continuation alone */
        if (prefix_token < 0) return m2d_err("loglikelihood: empty context and the tokenizer has no BOS/EOS token");
        if (enc(user, cont, lk, &cont_ids, &n_cont)) return -1;
        ctx_ids = m2d_malloc(sizeof(int32_t));
        ctx_ids[0] = prefix_token;
        n_ctx = 1;
    } else {
        /* trailing whitespace of the context (Python rstrip) goes to the front of the continuation */
        size_t cut = m2d_py_rstrip_len(ctx, lc);
        char *whole = m2d_malloc(lc + lk + 1);
        memcpy(whole, ctx, lc);
        memcpy(whole + lc, cont, lk + 1);
        int32_t *whole_ids = NULL;
        size_t n_whole = 0;
        if (enc(user, whole, lc + lk, &whole_ids, &n_whole) || enc(user, ctx, cut, &ctx_ids, &n_ctx)) {
            free(whole); free(whole_ids); free(ctx_ids);
            return -1;
        }
        free(whole);
        /* continuation tokens = whole[len(ctx):] (merges across the boundary stay in `whole`) */
        if (n_ctx > n_whole) n_ctx = n_whole; /* whole is shorter: nothing of the continuation left */
        n_cont = n_whole - n_ctx;
        cont_ids = m2d_malloc(sizeof(int32_t) * (n_cont ? n_cont : 1));
        memcpy(cont_ids, whole_ids + n_ctx, sizeof(int32_t) * n_cont);
        free(whole_ids);
        /* ctx_ids stays encode(context[:cut]), which is what lm-eval uses for the context part */
    }
    /* left truncation: keep the last max_length + 1 tokens of ctx + cont (the input is all but
     * the last, so the model sees at most max_length positions) */
    size_t total = n_ctx + n_cont, keep = total;
    if (max_length > 0 && keep > (size_t)max_length + 1) keep = (size_t)max_length + 1;
    /* the first token of the window has no prediction: at most keep - 1 tokens can be scored */
    if (keep > 0 && n_cont > keep - 1) n_cont = keep - 1;
    out->tokens = m2d_malloc(sizeof(int32_t) * (total ? total : 1));
    memcpy(out->tokens, ctx_ids, sizeof(int32_t) * n_ctx);
    memcpy(out->tokens + n_ctx, cont_ids, sizeof(int32_t) * (total - n_ctx));
    if (keep < total) memmove(out->tokens, out->tokens + (total - keep), sizeof(int32_t) * keep);
    out->n = (int)keep;
    out->n_cont = (int)n_cont;
    free(ctx_ids);
    free(cont_ids);
    return 0;
}

void m2d_ll_tokens_free(m2d_ll_tokens *t) {
    free(t->tokens);
    memset(t, 0, sizeof *t);
}

static int record_ll(m2d_lm *lm, const m2d_ll_request *reqs, int n, m2d_ll_result *out) {
    m2d_ll_recording *rec = lm->impl;
    for (int i = 0; i < n; i++) {
        if (rec->n == rec->cap) {
            rec->cap = rec->cap ? 2 * rec->cap : 64;
            rec->reqs = m2d_realloc(rec->reqs, sizeof *rec->reqs * (size_t)rec->cap);
            rec->group = m2d_realloc(rec->group, sizeof *rec->group * (size_t)rec->cap);
        }
        rec->reqs[rec->n].context = m2d_strdup(reqs[i].context);
        rec->reqs[rec->n].continuation = m2d_strdup(reqs[i].continuation);
        rec->group[rec->n++] = rec->calls;
        out[i].ll = -1;
        out[i].is_greedy = 0;
    }
    rec->calls++;
    return 0;
}

m2d_lm m2d_lm_recorder(m2d_ll_recording *rec) {
    return (m2d_lm){"recorder", record_ll, NULL, rec};
}

static int replay_ll(m2d_lm *lm, const m2d_ll_request *reqs, int n, m2d_ll_result *out) {
    m2d_ll_replay *rp = lm->impl;
    for (int i = 0; i < n; i++, rp->next++) {
        const m2d_ll_request *want = rp->next < rp->rec->n ? &rp->rec->reqs[rp->next] : NULL;
        if (!want || strcmp(want->context, reqs[i].context) || strcmp(want->continuation, reqs[i].continuation))
            return m2d_err("loglikelihood: request %d differs from the one recorded for the one-pass scoring", rp->next);
        out[i] = rp->res[rp->next];
    }
    return 0;
}

m2d_lm m2d_lm_replayer(m2d_ll_replay *rp) { return (m2d_lm){"replay", replay_ll, NULL, rp}; }

void m2d_ll_recording_free(m2d_ll_recording *rec) {
    for (int i = 0; i < rec->n; i++) {
        free((char *)rec->reqs[i].context);
        free((char *)rec->reqs[i].continuation);
    }
    free(rec->reqs);
    free(rec->group);
    memset(rec, 0, sizeof *rec);
}
