/* calib — the calibration pass (see calib.h); the stats file it writes: stats_file.c. */
#include "calib/calib.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calib/blocksum.h"
#include "engine/engine.h"
#include "engine/pool.h"
#include "tokenizer/tokenizer.h"
#include "base/util.h"

/* ------------------------------------------------------------------ windows and hashes */

const char *m2d_calib_gate_convention(const m2d_config *cfg) {
    if (cfg->ops.router == M2D_ROUTER_TOPK_SOFTMAX) return "topk-softmax"; /* GPT-OSS: softmax of the k logits */
    return cfg->ops.router_renorm ? "softmax-topk-renorm" : "softmax-topk";
}

int m2d_calib_default_seq_len(const m2d_config *cfg) {
    int L = M2D_CALIB_MAX_SEQ;
    if (cfg->max_position_embeddings > 0 && cfg->max_position_embeddings < L) L = cfg->max_position_embeddings;
    return L;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

int m2d_calib_windows(int64_t n_tokens, int seq_len, int n_samples, int seeded, uint64_t seed,
                      int64_t *starts, int *n_out) {
    if (seq_len < 2) return m2d_err("calibration: seq_len %d must be at least 2", seq_len);
    if (n_samples < 1) return m2d_err("calibration: samples %d must be at least 1", n_samples);
    int64_t M = n_tokens / seq_len;
    if (M < 1)
        return m2d_err("calibration: the text has %lld tokens, fewer than one window of %d",
                       (long long)n_tokens, seq_len);
    int n = (int)M2D_MIN((int64_t)n_samples, M);
    if (!seeded) {
        for (int i = 0; i < n; i++) starts[i] = (int64_t)i * seq_len;
    } else {
        int64_t *slot = m2d_malloc((size_t)M * sizeof *slot);
        for (int64_t i = 0; i < M; i++) slot[i] = i;
        uint64_t st = seed;
        for (int i = 0; i < n; i++) {
            int64_t j = i + (int64_t)(m2d_splitmix64(&st) % (uint64_t)(M - i));
            int64_t t = slot[i]; slot[i] = slot[j]; slot[j] = t;
        }
        for (int i = 0; i < n; i++) starts[i] = slot[i] * seq_len;
        free(slot);
        qsort(starts, (size_t)n, sizeof *starts, cmp_i64);
    }
    *n_out = n;
    return 0;
}

/* tag, L and the window count (int64 LE) */
static void hash_head(m2d_sha256 *s, const char *tag, int seq_len, int n_windows) {
    uint8_t b[8];
    m2d_sha256_update(s, tag, strlen(tag));
    m2d_put_le64(b, (uint64_t)(int64_t)seq_len);
    m2d_sha256_update(s, b, 8);
    m2d_put_le64(b, (uint64_t)(int64_t)n_windows);
    m2d_sha256_update(s, b, 8);
}

/* N token ids from IDS, int32 LE each */
static void hash_ids(m2d_sha256 *s, const int32_t *ids, int n) {
    for (int t = 0; t < n; t++) {
        uint32_t v = (uint32_t)ids[t];
        uint8_t le[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
        m2d_sha256_update(s, le, 4);
    }
}

static void hash_tail(m2d_sha256 *s, const char *gate_convention, char out[65]) {
    m2d_sha256_update(s, gate_convention, strlen(gate_convention));
    uint8_t d[32];
    m2d_sha256_final(s, d);
    m2d_hex(d, 32, out);
}

void m2d_calib_hash(const int32_t *ids, const int64_t *starts, int n_windows, int seq_len,
                    const char *gate_convention, char out[65]) {
    m2d_sha256 s;
    m2d_sha256_init(&s);
    hash_head(&s, "moe2dense-calib-v1\n", seq_len, n_windows);
    for (int w = 0; w < n_windows; w++) hash_ids(&s, ids + starts[w], seq_len);
    hash_tail(&s, gate_convention, out);
}

void m2d_calib_hash_windows(const int32_t *ids, const int64_t *starts, const int *lens, int n_windows, int seq_len,
                            const char *gate_convention, char out[65]) {
    if (!lens) {
        m2d_calib_hash(ids, starts, n_windows, seq_len, gate_convention, out);
        return;
    }
    m2d_sha256 s;
    m2d_sha256_init(&s);
    hash_head(&s, "moe2dense-calib-v2-documents\n", seq_len, n_windows);
    for (int w = 0; w < n_windows; w++) {
        uint8_t b[8];
        m2d_put_le64(b, (uint64_t)(int64_t)lens[w]);
        m2d_sha256_update(&s, b, 8);
        hash_ids(&s, ids + starts[w], lens[w]);
    }
    hash_tail(&s, gate_convention, out);
}

int m2d_calib_doc_windows(const int64_t *doc_starts, int n_docs, int64_t n_ids, int seq_len, int n_samples, int seeded,
                          uint64_t seed, int64_t *starts, int *lens, int *n_out) {
    if (seq_len < 2) return m2d_err("calibration: seq_len %d must be at least 2", seq_len);
    if (n_samples < 1) return m2d_err("calibration: samples %d must be at least 1", n_samples);
    int64_t *ok = m2d_malloc((size_t)(n_docs > 0 ? n_docs : 1) * sizeof *ok);
    int M = 0;
    for (int i = 0; i < n_docs; i++) {
        int64_t end = i + 1 < n_docs ? doc_starts[i + 1] : n_ids;
        if (end - doc_starts[i] >= 2) ok[M++] = i; /* a window needs two tokens */
    }
    if (M < 1) {
        free(ok);
        return m2d_err("calibration: none of the %d documents holds two tokens", n_docs);
    }
    int n = M2D_MIN(n_samples, M);
    if (seeded) { /* the same partial Fisher-Yates as m2d_calib_windows, over documents */
        uint64_t st = seed;
        for (int i = 0; i < n; i++) {
            int j = i + (int)(m2d_splitmix64(&st) % (uint64_t)(M - i));
            int64_t t = ok[i]; ok[i] = ok[j]; ok[j] = t;
        }
        qsort(ok, (size_t)n, sizeof *ok, cmp_i64);
    }
    for (int i = 0; i < n; i++) {
        int d = (int)ok[i];
        int64_t end = d + 1 < n_docs ? doc_starts[d + 1] : n_ids;
        starts[i] = doc_starts[d];
        lens[i] = (int)M2D_MIN((int64_t)seq_len, end - doc_starts[d]);
    }
    free(ok);
    *n_out = n;
    return 0;
}

/* WikiText's article titles are the level-1 headings " = Title = " on a line of their own. */
static int is_article_title(const char *line, size_t n) {
    return n >= 6 && !strncmp(line, " = ", 3) && line[3] != '=' && !strncmp(line + n - 3, " = ", 3) &&
           line[n - 4] != '=';
}

int m2d_calib_split_documents(const char *text, size_t len, size_t **starts, int *n) {
    int cap = 16;
    *starts = m2d_malloc((size_t)cap * sizeof **starts);
    *n = 0;
    (*starts)[(*n)++] = 0;
    for (size_t pos = 0; pos < len;) {
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - text) : len;
        if (pos > 0 && is_article_title(text + pos, end - pos)) {
            if (*n == cap) *starts = m2d_realloc(*starts, (size_t)(cap *= 2) * sizeof **starts);
            (*starts)[(*n)++] = pos;
        }
        pos = end + 1;
    }
    return 0;
}

int m2d_calib_encode_documents(const m2d_tokenizer *tk, const char *text, size_t len, int32_t **ids, size_t *n_ids,
                               int64_t **doc_starts, int *n_docs) {
    size_t *cs;
    int nd;
    m2d_calib_split_documents(text, len, &cs, &nd);
    *ids = NULL;
    *n_ids = 0;
    *doc_starts = m2d_malloc((size_t)nd * sizeof **doc_starts);
    *n_docs = nd;
    int rc = 0;
    for (int i = 0; i < nd && rc == 0; i++) {
        size_t end = i + 1 < nd ? cs[i + 1] : len, n = 0;
        int32_t *part = NULL;
        rc = m2d_tokenizer_encode(tk, text + cs[i], end - cs[i], &part, &n);
        (*doc_starts)[i] = (int64_t)*n_ids;
        if (rc == 0 && n) {
            *ids = m2d_realloc(*ids, (*n_ids + n) * sizeof **ids);
            memcpy(*ids + *n_ids, part, n * sizeof *part);
            *n_ids += n;
        }
        free(part);
    }
    free(cs);
    return rc;
}

int m2d_calib_choose(const m2d_model *m, const int32_t *ids, int64_t n_ids, const m2d_calib_opts *o, int64_t **starts,
                     int **lens, int *n_windows, char hash[65]) {
    int L = o->seq_len > 0 ? o->seq_len : m2d_calib_default_seq_len(&m->cfg);
    int N = o->n_samples > 0 ? o->n_samples : M2D_CALIB_DEFAULT_SAMPLES;
    *starts = m2d_malloc((size_t)N * sizeof **starts);
    *lens = o->doc_starts ? m2d_malloc((size_t)N * sizeof **lens) : NULL;
    int rc = o->doc_starts ? m2d_calib_doc_windows(o->doc_starts, o->n_docs, n_ids, L, N, o->seeded, o->seed, *starts,
                                                   *lens, n_windows)
                           : m2d_calib_windows(n_ids, L, N, o->seeded, o->seed, *starts, n_windows);
    if (rc) {
        free(*starts);
        free(*lens);
        *starts = NULL;
        *lens = NULL;
        return m2d_err_prefix(o->data_path ? o->data_path : "calibration text");
    }
    if (hash) m2d_calib_hash_windows(ids, *starts, *lens, *n_windows, L, m2d_calib_gate_convention(&m->cfg), hash);
    return 0;
}

double m2d_calib_expert_flops(const m2d_config *cfg, double n_tokens) {
    int n_moe = 0;
    for (int l = 0; l < cfg->num_hidden_layers; l++) n_moe += cfg->layer_is_moe[l] ? 1 : 0;
    return 6.0 * cfg->hidden_size * (double)cfg->moe_intermediate_size * cfg->num_experts * n_tokens * n_moe;
}

/* ------------------------------------------------------------------ accumulation (fast path) */

typedef struct {
    m2d_engine *eng;
    const m2d_model *m;
    m2d_layer_stats **acc; /* indexed by model layer (NULL for dense layers) */
    float *F;             /* [nb, E, d] expert outputs of one token block, where the backend computes
                           * them on the host (reference: [E, d]) */
    int32_t *ids;         /* [nb, k + 1] each token's top-k experts and its replacement (or -1) */
    float *sel;           /* [nb, k + 1, d] their outputs (the rows the statistics read) */
    double *norms;        /* [E, nb] ‖f_e(t)‖² */
    double **router;      /* [n_layers] fp64 router rows [E, d] then its bias [E] (0 without one) of each
                           * MoE layer (made on first use) */
    double *Xd, *Z;       /* [nb, d] fp64 FFN input, [nb, E] router logits of one token block */
    double *dmg;          /* [nb, k] each token's pruning damage of its top-k experts */
    m2d_pool *pool;       /* the statistics' threads (the engine's own count) */
    int block_tokens;
    m2d_progress *prog;
    double done, total;
    char err[1024];       /* the hook's own error (the engine reports only that the hook aborted) */
} calib_ctx;

/* f_e for all E experts on tokens [t0, t0+nb) of the event, reduced where they are computed
 * (m2d_engine_all_experts_reduced): sum_f_all += Σ_t f_e(t) (the same bits on every backend),
 * norms [E, nb] = ‖f_e(t)‖², and into ctx->sel the rows the statistics read: each token's top-k
 * experts, in its top-k order, and its replacement for the damage (paper 004 Eq. 7; zeros when
 * k = E). The Gram G += sum_t F_t F_t^T (upper triangle; finalize_gram mirrors it) on the
 * backend too (fp64 in fp32 precision, SPEC §1: the only error is fp64 rounding; in bf16 each
 * token's F_t F_t^T in fp32, see backend.h). Gram cost: E²·nb·d flops against 6·E·nb·d·d_e for
 * the experts, a ratio of E/(6·d_e) (15% for the tiny teacher, 3% for Qwen3-30B). */
static int run_all_experts(calib_ctx *c, const m2d_moe_event *ev, int t0, int nb, m2d_layer_stats *s) {
    int E = ev->n_experts, k = ev->top_k;
    for (int t = 0; t < nb; t++) {
        const int32_t *topk = ev->topk + (size_t)(t0 + t) * k;
        int32_t *id = c->ids + (size_t)t * (k + 1);
        memcpy(id, topk, sizeof *id * (size_t)k);
        id[k] = m2d_layer_stats_next_expert(ev->probs + (size_t)(t0 + t) * E, topk, k, E);
    }
    return m2d_engine_all_experts_reduced(c->eng, ev->layer, ev->x + (size_t)t0 * ev->hidden, nb, c->ids, k + 1, c->sel,
                                          s->sum_f_all, c->norms, s->gram, c->F);
}

/* token t's row r of the block (r < k: its r-th top-k expert; r = k: the replacement) */
static const float *sel_row(const calib_ctx *c, const m2d_moe_event *ev, int t, int r) {
    return c->sel + ((size_t)t * (ev->top_k + 1) + r) * ev->hidden;
}

/* token t's replacement expert for the damage (-1: none, k = E) */
static int replacement(const calib_ctx *c, const m2d_moe_event *ev, int t) {
    return c->ids[(size_t)t * (ev->top_k + 1) + ev->top_k];
}

static void finalize_gram(m2d_layer_stats *s) {
    for (int i = 0; i < s->E; i++)
        for (int j = 0; j < i; j++) {
            s->gram[(size_t)i * s->E + j] = s->gram[(size_t)j * s->E + i];
            s->logit_gram[(size_t)i * s->E + j] = s->logit_gram[(size_t)j * s->E + i];
        }
}

/* The layer's router rows in fp64, then its bias (GPT-OSS routes on W x + b): converted once per
 * calibration run. */
static const double *router_rows(calib_ctx *c, int layer) {
    if (!c->router[layer]) {
        const m2d_layer *ly = &c->m->layers[layer];
        int64_t n = m2d_tensor_numel(ly->router), E = ly->router->shape[0];
        double *w = c->router[layer] = m2d_calloc((size_t)(n + E), sizeof(double));
        float *f = m2d_tensor_f32(ly->router);
        for (int64_t i = 0; i < n; i++) w[i] = f[i];
        free(f);
        if (ly->router_bias) {
            f = m2d_tensor_f32(ly->router_bias);
            for (int64_t e = 0; e < E; e++) w[n + e] = f[e];
            free(f);
        }
    }
    return c->router[layer];
}

static const double *router_bias(calib_ctx *c, int layer, int E, int d) {
    return router_rows(c, layer) + (size_t)E * d;
}

/* Router logits z = W_router x + b recomputed in fp64 from the FFN input (the engine's own logits
 * are fp32 and already turned into probabilities); logit_gram += Zᵀ Z (upper triangle, mirrored by
 * finalize_gram). Cost E·d·nb, small against the experts' 6·E·d·d_e·nb. */
static void logits_block(calib_ctx *c, m2d_layer_stats *s, const m2d_moe_event *ev, int t0, int nb) {
    int E = ev->n_experts, d = ev->hidden;
    const float *x = ev->x + (size_t)t0 * d;
    for (size_t i = 0; i < (size_t)nb * d; i++) c->Xd[i] = x[i];
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nb, E, d, 1.0, c->Xd, d, router_rows(c, ev->layer), d, 0.0,
                c->Z, E);
    const double *b = router_bias(c, ev->layer, E, d);
    for (int t = 0; t < nb; t++)
        for (int e = 0; e < E; e++) c->Z[(size_t)t * E + e] += b[e];
    cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, E, nb, 1.0, c->Z, E, 1.0, s->logit_gram, E);
}

/* one token block of an event, for the per-token pool items (damage, routed output) */
typedef struct {
    const calib_ctx *c;
    const m2d_moe_event *ev;
    int t0, nb;
} block_job;

/* token t's pruning damage of each of its top-k experts into dmg[t][k] (-1 in dmg[t][0]: k too
 * large for the fast kernel; the caller adds the reference's) */
static void damage_item(void *ctx, int t) {
    const block_job *j = ctx;
    int E = j->ev->n_experts, k = j->ev->top_k, tt = j->t0 + t;
    double *out = j->c->dmg + (size_t)t * k;
    if (m2d_blocksum_damage(j->ev->probs + (size_t)tt * E, j->ev->topk + (size_t)tt * k, k,
                            replacement(j->c, j->ev, t), j->ev->hidden, sel_row(j->c, j->ev, t, 0),
                            (size_t)j->ev->hidden, out))
        out[0] = -1;
}

/* Everything but the Gram and the per-expert sums for a block of tokens, in the raw sums of
 * stats.h (the same sums m2d_layer_stats_add_token keeps; finalize derives means/variances from
 * them). The per-token damages in parallel (each item writes only its own entries: the same sums
 * on any thread count), then the routed sums token by token. */
static void token_stats_block(calib_ctx *c, m2d_layer_stats *s, const m2d_moe_event *ev, int t0, int nb) {
    int E = ev->n_experts, k = ev->top_k, d = ev->hidden;
    block_job job = {c, ev, t0, nb};
    m2d_pool_for(c->pool, nb, damage_item, &job);
    for (int t = 0; t < nb; t++) {
        int tt = t0 + t;
        const float *p = ev->probs + (size_t)tt * E;
        const int32_t *topk = ev->topk + (size_t)tt * k;
        for (int e = 0; e < E; e++) s->sum_p[e] += p[e];
        double psel = 0;
        for (int r = 0; r < k; r++) psel += p[topk[r]];
        for (int r = 0; r < k; r++) {
            int e = topk[r];
            m2d_layer_stats_add_routed(s, e, p[e], ev->gates[(size_t)tt * k + r], psel > 0 ? p[e] / psel : 0,
                                       sel_row(c, ev, t, r), c->norms[(size_t)e * nb + t]);
        }
        const double *dmg = c->dmg + (size_t)t * k;
        if (dmg[0] < 0)
            m2d_layer_stats_add_damage_rows(s, p, topk, replacement(c, ev, t), sel_row(c, ev, t, 0), (size_t)d);
        else
            for (int r = 0; r < k; r++) s->damage[topk[r]] += dmg[r];
    }
    s->N += nb;
    s->cur_len += nb;
}

/* routed[t] = Σ_r gate_r · f_{topk[r]}(t), the terms in increasing expert id (engine.h) */
static void routed_item(void *ctx, int t) {
    const block_job *j = ctx;
    int k = j->ev->top_k, d = j->ev->hidden, tt = j->t0 + t;
    const int32_t *topk = j->ev->topk + (size_t)tt * k;
    const float *gates = j->ev->gates + (size_t)tt * k;
    float *o = j->ev->routed + (size_t)tt * d;
    memset(o, 0, sizeof(float) * d);
    for (int done = 0, last = -1; done < k; done++) { /* next expert id above LAST among the top-k */
        int r = -1;
        for (int q = 0; q < k; q++)
            if (topk[q] > last && (r < 0 || topk[q] < topk[r])) r = q;
        last = topk[r];
        const float *f = sel_row(j->c, j->ev, t, r);
        for (int i = 0; i < d; i++) o[i] += gates[r] * f[i];
    }
}

/* The block's rows of the layer's routed output, from the experts' outputs already at hand: the
 * engine then skips running the top-k experts again (engine.h, m2d_moe_event.routed). */
static void routed_block(calib_ctx *c, const m2d_moe_event *ev, int t0, int nb) {
    block_job j = {c, ev, t0, nb};
    m2d_pool_for(c->pool, nb, routed_item, &j);
}

static int check_event(const calib_ctx *c, const m2d_moe_event *ev) {
    const m2d_config *cfg = &c->m->cfg;
    if (ev->layer < 0 || ev->layer >= cfg->num_hidden_layers ||
        !c->acc[ev->layer] || ev->n_experts != cfg->num_experts || ev->top_k != cfg->num_experts_per_tok || ev->hidden != cfg->hidden_size)
        return m2d_err("calibration: engine reported an unexpected MoE event (layer %d, E %d, k %d, d %d)",
                       ev->layer, ev->n_experts, ev->top_k, ev->hidden);
    return 0;
}

/* Every expert on every token of the event, block by block, into the statistics; the layer's
 * routed output from the same expert outputs, so the engine does not run the top-k again. */
static int hook_fast(void *user, const m2d_moe_event *ev) {
    calib_ctx *c = user;
    if (check_event(c, ev)) return -1;
    m2d_layer_stats *s = c->acc[ev->layer];
    for (int t0 = 0; t0 < ev->n_tokens; t0 += c->block_tokens) {
        int nb = M2D_MIN(c->block_tokens, ev->n_tokens - t0);
        if (run_all_experts(c, ev, t0, nb, s)) return -1;
        token_stats_block(c, s, ev, t0, nb);
        if (ev->routed) routed_block(c, ev, t0, nb);
        logits_block(c, s, ev, t0, nb);
        c->done += nb;
        if (c->prog) m2d_progress_update(c->prog, c->done);
    }
    if (ev->routed_set) *ev->routed_set = 1;
    m2d_layer_stats_end_sample(s); /* one event = one window at this layer */
    return 0;
}

/* Obviously-correct path: one token at a time through stats.c's reference accumulator
 * (scalar loops, Gram entry by entry). Slow; tests compare the fast path against it. */
static int hook_reference(void *user, const m2d_moe_event *ev) {
    calib_ctx *c = user;
    if (check_event(c, ev)) return -1;
    int E = ev->n_experts, k = ev->top_k, d = ev->hidden;
    const double *W = router_rows(c, ev->layer), *b = router_bias(c, ev->layer, E, d);
    for (int t = 0; t < ev->n_tokens; t++) {
        for (int e = 0; e < E; e++)
            if (m2d_engine_expert(c->eng, ev->layer, e, ev->x + (size_t)t * d, 1, c->F + (size_t)e * d)) return -1;
        m2d_layer_stats_add_token(c->acc[ev->layer], ev->probs + (size_t)t * E, ev->topk + (size_t)t * k,
                                  ev->gates + (size_t)t * k, c->F);
        for (int e = 0; e < E; e++) { /* router logits, one dot product at a time */
            double z = 0;
            for (int j = 0; j < d; j++) z += W[(size_t)e * d + j] * ev->x[(size_t)t * d + j];
            c->Z[e] = z + b[e];
        }
        m2d_layer_stats_add_logits(c->acc[ev->layer], c->Z);
        c->done += 1;
        if (c->prog) m2d_progress_update(c->prog, c->done);
    }
    m2d_layer_stats_end_sample(c->acc[ev->layer]); /* one event = one window at this layer */
    return 0;
}

static int keep_error(calib_ctx *c, int rc) {
    if (rc && !c->err[0]) snprintf(c->err, sizeof c->err, "%s", m2d_errmsg());
    return rc;
}
static int calib_hook_fast(void *user, const m2d_moe_event *ev) { return keep_error(user, hook_fast(user, ev)); }
static int calib_hook_reference(void *user, const m2d_moe_event *ev) {
    return keep_error(user, hook_reference(user, ev));
}

/* Window length L and count N from the options; every id inside the vocabulary. */
static int check_inputs(const m2d_model *m, const int32_t *ids, int64_t n_ids, const m2d_calib_opts *o, int *L,
                        int *N) {
    const m2d_config *cfg = &m->cfg;
    if (cfg->num_experts <= 0) return m2d_err("%s: config.json: field 'num_experts': the model has no MoE layers", m->dir);
    *L = o->seq_len > 0 ? o->seq_len : m2d_calib_default_seq_len(cfg);
    if (cfg->max_position_embeddings > 0 && *L > cfg->max_position_embeddings)
        return m2d_err("%s: config.json: field 'max_position_embeddings': %d is shorter than the calibration "
                       "seq_len %d", m->dir, cfg->max_position_embeddings, *L);
    *N = o->n_samples > 0 ? o->n_samples : M2D_CALIB_DEFAULT_SAMPLES;
    const char *data_name = o->data_path ? o->data_path : "calibration text"; /* named in errors */
    for (int64_t i = 0; i < n_ids; i++)
        if (ids[i] < 0 || ids[i] >= cfg->vocab_size)
            return m2d_err("%s: token id %d at position %lld is outside the vocabulary (%s/config.json field "
                           "'vocab_size' = %d)", data_name, ids[i], (long long)i, m->dir, cfg->vocab_size);
    return 0;
}

/* The stats object: identity (hashes, windows, data path) and zeroed per-layer sums. Takes STARTS. */
static m2d_stats *new_stats(const m2d_model *m, const int32_t *ids, int64_t *starts, int *lens, int nw, int L,
                            const m2d_calib_opts *o) {
    const m2d_config *cfg = &m->cfg;
    m2d_stats *st = m2d_calloc(1, sizeof *st);
    st->E = cfg->num_experts; st->k = cfg->num_experts_per_tok; st->d = cfg->hidden_size;
    st->d_e = cfg->moe_intermediate_size;
    snprintf(st->model_hash, sizeof st->model_hash, "%s", m->model_hash);
    snprintf(st->gate_convention, sizeof st->gate_convention, "%s", m2d_calib_gate_convention(cfg));
    m2d_calib_hash_windows(ids, starts, lens, nw, L, st->gate_convention, st->calib_hash);
    st->n_windows = nw; st->seq_len = L; st->window_starts = starts; st->window_lens = lens;
    if (o->seeded) snprintf(st->window_choice, sizeof st->window_choice, "seeded:%llu", (unsigned long long)o->seed);
    else snprintf(st->window_choice, sizeof st->window_choice, "first");
    st->data_path = m2d_strdup(o->data_path ? o->data_path : "");
    for (int l = 0; l < cfg->num_hidden_layers; l++) st->n_layers += cfg->layer_is_moe[l] ? 1 : 0;
    st->layers = m2d_calloc((size_t)st->n_layers, sizeof *st->layers);
    for (int l = 0, i = 0; l < cfg->num_hidden_layers; l++)
        if (cfg->layer_is_moe[l]) m2d_layer_stats_alloc(&st->layers[i++], l, st->E, st->k, st->d);
    return st;
}

static int calib_threads(const m2d_calib_opts *o) { return o->n_threads > 0 ? o->n_threads : m2d_default_threads(); }

/* bytes of a block's arrays that a device fills: the chosen rows [nb, k + 1, d] (sel) and the
 * norms [E, nb] */
static size_t sel_bytes(const m2d_config *cfg, int nb) {
    return (size_t)nb * (cfg->num_experts_per_tok + 1) * cfg->hidden_size * sizeof(float);
}

static size_t norms_bytes(const m2d_config *cfg, int nb) { return (size_t)cfg->num_experts * nb * sizeof(double); }

/* Accumulator buffers. Token block: expert outputs [nb, E, d] fp32 capped at 512 MiB (a large nb
 * keeps the expert GEMMs efficient: a whole 512-token window of Qwen3-30B-A3B, whose expert
 * GEMMs ran at 800 GFLOP/s with m = 512 against 720 with m = 256 on the bf16 machine of
 * BENCHMARKS.md). */
static void ctx_init(calib_ctx *c, const m2d_model *m, m2d_stats *st, int L, int reference, int n_threads) {
    const m2d_config *cfg = &m->cfg;
    int E = cfg->num_experts, d = cfg->hidden_size;
    memset(c, 0, sizeof *c);
    c->m = m;
    c->acc = m2d_calloc((size_t)cfg->num_hidden_layers, sizeof *c->acc);
    for (int i = 0; i < st->n_layers; i++) c->acc[st->layers[i].layer] = &st->layers[i];
    size_t per_tok = (size_t)E * d * sizeof(float);
    c->block_tokens = reference ? 1 : (int)M2D_MAX((size_t)1, M2D_MIN((size_t)L, ((size_t)512 << 20) / per_tok));
    c->F = m2d_malloc((size_t)E * c->block_tokens * d * sizeof(float));
    c->norms = m2d_malloc(norms_bytes(cfg, c->block_tokens));
    c->ids = m2d_malloc((size_t)c->block_tokens * (cfg->num_experts_per_tok + 1) * sizeof(int32_t));
    c->sel = m2d_malloc(sel_bytes(cfg, c->block_tokens));
    c->router = m2d_calloc((size_t)cfg->num_hidden_layers, sizeof *c->router);
    c->Xd = m2d_malloc((size_t)c->block_tokens * d * sizeof(double));
    c->Z = m2d_malloc((size_t)c->block_tokens * E * sizeof(double));
    c->dmg = m2d_malloc((size_t)c->block_tokens * cfg->num_experts_per_tok * sizeof(double));
    c->pool = m2d_pool_new(n_threads);
}

static void ctx_free(calib_ctx *c) {
    for (int l = 0; l < c->m->cfg.num_hidden_layers; l++) free(c->router[l]);
    free(c->router); free(c->Xd); free(c->Z); free(c->dmg);
    m2d_pool_free(c->pool);
    free(c->acc); free(c->F); free(c->norms); free(c->ids); free(c->sel);
}

/* Every window through the teacher, window- or layer-major as the options and the budget say; only
 * each window's last log-prob is asked for: the forward (and its hook) is the point. */
static int forward_windows(calib_ctx *c, const m2d_stats *st, const int32_t *ids, int L) {
    m2d_window_arrays a;
    m2d_window_arrays_init(&a, st->n_windows);
    for (int w = 0; w < st->n_windows; w++) {
        a.tokens[w] = a.targets[w] = ids + st->window_starts[w];
        a.lens[w] = st->window_lens ? st->window_lens[w] : L;
        a.first[w] = a.lens[w] - 1;
        a.lp[w] = m2d_malloc(sizeof(double));
    }
    int rc = m2d_engine_logprobs_windows(c->eng, &a.set, NULL);
    if (rc && c->err[0]) m2d_err("%s", c->err);
    m2d_window_arrays_free(&a);
    return rc;
}

/* The block arrays that cross from a device every block page-locked there (m2d_engine_pin), or
 * back: the rows the statistics read (9 of 128 experts' outputs a token on Qwen3-30B-A3B, 37.7 MB
 * a 512-token block) and the norms. */
static void pin_block_arrays(calib_ctx *c, int pin) {
    const m2d_config *cfg = &c->m->cfg;
    if (pin) {
        m2d_engine_pin(c->eng, c->sel, sel_bytes(cfg, c->block_tokens));
        m2d_engine_pin(c->eng, c->norms, norms_bytes(cfg, c->block_tokens));
    } else {
        m2d_engine_unpin(c->eng, c->sel);
        m2d_engine_unpin(c->eng, c->norms);
    }
}

/* The teacher's forward over every window; the hook accumulates each MoE layer. */
static int run_windows(calib_ctx *c, m2d_stats *st, const int32_t *ids, int L, const m2d_calib_opts *o) {
    m2d_engine_opts eo = {.backend = o->device, .n_threads = calib_threads(o),
                          .precision = (m2d_precision)o->precision, .pass = o->pass,
                          .mem_budget = o->mem_budget, .spill_dir = o->spill_dir};
    int rc = m2d_engine_open(c->m, &eo, &c->eng);
    if (rc) return -1;
    snprintf(st->precision, sizeof st->precision, "%s", m2d_precision_name(m2d_engine_precision(c->eng)));
    /* no fp32 weight copy beyond the engine's own policy (small models only): an expert's bf16
     * weights are converted once per block of up to 256+ tokens, 6 % of calibration time on the
     * 30B-shaped slice, while a 4 GiB copy made peak RSS 7.8 GB instead of 3.5 GB and was not
     * faster (BENCHMARKS.md, "Memory") */
    m2d_engine_set_moe_hook(c->eng, o->reference ? calib_hook_reference : calib_hook_fast, c);
    pin_block_arrays(c, 1);
    m2d_progress prog;
    c->total = m2d_stats_window_tokens(st) * st->n_layers;
    if (o->progress) {
        m2d_progress_start(&prog, "calibrate (layer-tokens)", c->total);
        c->prog = &prog;
    }
    rc = forward_windows(c, st, ids, L);
    if (c->prog) m2d_progress_end(&prog);
    c->prog = NULL;
    pin_block_arrays(c, 0);
    m2d_engine_free(c->eng);
    return rc;
}

/* Every MoE layer saw every token; then the derived statistics. */
static int finish_stats(m2d_stats *st, int reference) {
    double want = m2d_stats_window_tokens(st);
    for (int i = 0; i < st->n_layers; i++)
        if (st->layers[i].N != want)
            return m2d_err("calibration: layer %d saw %.0f tokens, expected %.0f (engine hook not called?)",
                           st->layers[i].layer, st->layers[i].N, want);
    for (int i = 0; i < st->n_layers; i++) {
        if (!reference) finalize_gram(&st->layers[i]);
        m2d_layer_stats_finalize(&st->layers[i]);
    }
    st->N = want;
    return 0;
}

int m2d_calib_run(const m2d_model *m, const int32_t *ids, int64_t n_ids, const m2d_calib_opts *o,
                  m2d_stats **out) {
    int L = 0, N = 0, nw = 0;
    if (check_inputs(m, ids, n_ids, o, &L, &N)) return -1;
    int64_t *starts;
    int *lens;
    if (m2d_calib_choose(m, ids, n_ids, o, &starts, &lens, &nw, NULL)) return -1;
    if (nw < N) /* loud: a run that silently calibrates on fewer tokens than asked misleads */
        fprintf(stderr, "moe2dense: WARNING: calibration: %s holds only %d %s of up to %d tokens; %d were asked "
                "for, %d are used\n", o->data_path ? o->data_path : "the calibration text", nw,
                o->doc_starts ? "usable documents" : "windows", L, N, nw);
    m2d_stats *st = new_stats(m, ids, starts, lens, nw, L, o);
    calib_ctx c;
    ctx_init(&c, m, st, L, o->reference, calib_threads(o));
    int rc = run_windows(&c, st, ids, L, o);
    if (rc == 0) rc = finish_stats(st, o->reference);
    ctx_free(&c);
    if (rc) {
        m2d_stats_free(st);
        free(st);
        return -1;
    }
    *out = st;
    return 0;
}
