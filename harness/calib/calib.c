/* calib — calibration pass and stats file (format documented in calib.h). */
#include "calib/calib.h"

#include <cblas.h>
#include <cjson/cJSON.h>
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

static void put_le64(uint8_t *b, uint64_t v) {
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
}

/* tag, L and the window count (int64 LE) */
static void hash_head(m2d_sha256 *s, const char *tag, int seq_len, int n_windows) {
    uint8_t b[8];
    m2d_sha256_update(s, tag, strlen(tag));
    put_le64(b, (uint64_t)(int64_t)seq_len);
    m2d_sha256_update(s, b, 8);
    put_le64(b, (uint64_t)(int64_t)n_windows);
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
        put_le64(b, (uint64_t)(int64_t)lens[w]);
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
    float *F;             /* [nb, E, d] expert outputs of one token block (reference: [E, d]) */
    double *norms;        /* [E, nb] ‖f_e(t)‖ */
    double **router;      /* [n_layers] fp64 router rows [E, d] of each MoE layer (made on first use) */
    double *Xd, *Z;       /* [nb, d] fp64 FFN input, [nb, E] router logits of one token block */
    double *dmg;          /* [nb, k] each token's pruning damage of its top-k experts */
    m2d_pool *pool;       /* the statistics' threads (the engine's own count) */
    int block_tokens;
    m2d_progress *prog;
    double done, total;
    char err[1024];       /* the hook's own error (the engine reports only that the hook aborted) */
} calib_ctx;

/* f_e for all E experts on tokens [t0, t0+nb) of the event, into ctx->F as [nb, E, d], and the
 * Gram G += sum_t F_t F_t^T (upper triangle; finalize_gram mirrors it), both on the engine's
 * backend (m2d_engine_all_experts: grouped GEMMs over the experts; the Gram in fp64 in fp32
 * precision, SPEC §1: the only error is fp64 rounding; in bf16 each token's F_t F_t^T in fp32, see
 * backend.h). Gram cost: E²·nb·d flops against 6·E·nb·d·d_e for the experts, a ratio of
 * E/(6·d_e) (15% for the tiny teacher, 3% for Qwen3-30B). */
static int run_all_experts(calib_ctx *c, const m2d_moe_event *ev, int t0, int nb, m2d_layer_stats *s) {
    return m2d_engine_all_experts(c->eng, ev->layer, ev->x + (size_t)t0 * ev->hidden, nb, c->F, s->gram);
}

static void finalize_gram(m2d_layer_stats *s) {
    for (int i = 0; i < s->E; i++)
        for (int j = 0; j < i; j++) {
            s->gram[(size_t)i * s->E + j] = s->gram[(size_t)j * s->E + i];
            s->logit_gram[(size_t)i * s->E + j] = s->logit_gram[(size_t)j * s->E + i];
        }
}

/* The layer's router rows in fp64 (converted once per calibration run). */
static const double *router_rows(calib_ctx *c, int layer) {
    if (!c->router[layer]) {
        const m2d_tensor *r = c->m->layers[layer].router;
        int64_t n = m2d_tensor_numel(r);
        float *f = m2d_tensor_f32(r);
        c->router[layer] = m2d_malloc((size_t)n * sizeof(double));
        for (int64_t i = 0; i < n; i++) c->router[layer][i] = f[i];
        free(f);
    }
    return c->router[layer];
}

/* Router logits z = W_router x recomputed in fp64 from the FFN input (the engine's own logits are
 * fp32 and already turned into probabilities); logit_gram += Zᵀ Z (upper triangle, mirrored by
 * finalize_gram). Cost E·d·nb, small against the experts' 6·E·d·d_e·nb. */
static void logits_block(calib_ctx *c, m2d_layer_stats *s, const m2d_moe_event *ev, int t0, int nb) {
    int E = ev->n_experts, d = ev->hidden;
    const float *x = ev->x + (size_t)t0 * d;
    for (size_t i = 0; i < (size_t)nb * d; i++) c->Xd[i] = x[i];
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nb, E, d, 1.0, c->Xd, d, router_rows(c, ev->layer), d, 0.0,
                c->Z, E);
    cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, E, nb, 1.0, c->Z, E, 1.0, s->logit_gram, E);
}

typedef struct {
    calib_ctx *c;
    const m2d_moe_event *ev;
    m2d_layer_stats *s;
    int t0, nb;
} block_job;

/* expert e over the block: sum_f_all[e] += f_e(t), norms[e][t] = ‖f_e(t)‖² */
static void expert_sums_item(void *ctx, int e) {
    const block_job *j = ctx;
    int E = j->ev->n_experts, d = j->ev->hidden, nb = j->nb;
    double *sf = j->s->sum_f_all + (size_t)e * d;
    for (int t = 0; t < nb; t++)
        j->c->norms[(size_t)e * nb + t] = m2d_blocksum_add_norm2(sf, j->c->F + ((size_t)t * E + e) * d, d);
}

/* token t's pruning damage of each of its top-k experts into dmg[t][k] (-1 in dmg[t][0]: k too
 * large for the fast kernel; the caller adds the reference's) */
static void damage_item(void *ctx, int t) {
    const block_job *j = ctx;
    int E = j->ev->n_experts, k = j->ev->top_k, tt = j->t0 + t;
    double *out = j->c->dmg + (size_t)t * k;
    if (m2d_blocksum_damage(j->ev->probs + (size_t)tt * E, j->ev->topk + (size_t)tt * k, k, E, j->ev->hidden,
                            j->c->F + (size_t)t * E * j->ev->hidden, (size_t)j->ev->hidden, out))
        out[0] = -1;
}

static void block_item(void *ctx, int item) {
    const block_job *j = ctx;
    if (item < j->ev->n_experts) expert_sums_item(ctx, item);
    else damage_item(ctx, item - j->ev->n_experts);
}

/* Everything but the Gram for a block of tokens, in the raw sums of stats.h (the same sums
 * m2d_layer_stats_add_token keeps; finalize derives means/variances from them). The per-expert
 * sums and the per-token damages in parallel (each item writes only its own entries: the same
 * sums on any thread count), then the routed sums token by token. */
static void token_stats_block(calib_ctx *c, m2d_layer_stats *s, const m2d_moe_event *ev, int t0, int nb) {
    int E = ev->n_experts, k = ev->top_k, d = ev->hidden;
    block_job job = {c, ev, s, t0, nb};
    m2d_pool_for(c->pool, E + nb, block_item, &job);
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
                                       c->F + ((size_t)t * E + e) * d, c->norms[(size_t)e * nb + t]);
        }
        const double *dmg = c->dmg + (size_t)t * k;
        if (dmg[0] < 0) m2d_layer_stats_add_damage(s, p, topk, c->F + (size_t)t * E * d, (size_t)d);
        else
            for (int r = 0; r < k; r++) s->damage[topk[r]] += dmg[r];
    }
    s->N += nb;
    s->cur_len += nb;
}

typedef struct {
    const calib_ctx *c;
    const m2d_moe_event *ev;
    int t0, nb;
} routed_job;

/* routed[t] = Σ_r gate_r · f_{topk[r]}(t), the terms in increasing expert id (engine.h) */
static void routed_item(void *ctx, int t) {
    const routed_job *j = ctx;
    int E = j->ev->n_experts, k = j->ev->top_k, d = j->ev->hidden, tt = j->t0 + t;
    const int32_t *topk = j->ev->topk + (size_t)tt * k;
    const float *gates = j->ev->gates + (size_t)tt * k;
    float *o = j->ev->routed + (size_t)tt * d;
    memset(o, 0, sizeof(float) * d);
    for (int done = 0, last = -1; done < k; done++) { /* next expert id above LAST among the top-k */
        int r = -1;
        for (int q = 0; q < k; q++)
            if (topk[q] > last && (r < 0 || topk[q] < topk[r])) r = q;
        last = topk[r];
        const float *f = j->c->F + ((size_t)t * E + last) * d;
        for (int i = 0; i < d; i++) o[i] += gates[r] * f[i];
    }
}

/* The block's rows of the layer's routed output, from the experts' outputs already at hand: the
 * engine then skips running the top-k experts again (engine.h, m2d_moe_event.routed). */
static void routed_block(calib_ctx *c, const m2d_moe_event *ev, int t0, int nb) {
    routed_job j = {c, ev, t0, nb};
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
    return 0;
}

/* Obviously-correct path: one token at a time through stats.c's reference accumulator
 * (scalar loops, Gram entry by entry). Slow; tests compare the fast path against it. */
static int hook_reference(void *user, const m2d_moe_event *ev) {
    calib_ctx *c = user;
    if (check_event(c, ev)) return -1;
    int E = ev->n_experts, k = ev->top_k, d = ev->hidden;
    const double *W = router_rows(c, ev->layer);
    for (int t = 0; t < ev->n_tokens; t++) {
        for (int e = 0; e < E; e++)
            if (m2d_engine_expert(c->eng, ev->layer, e, ev->x + (size_t)t * d, 1, c->F + (size_t)e * d)) return -1;
        m2d_layer_stats_add_token(c->acc[ev->layer], ev->probs + (size_t)t * E, ev->topk + (size_t)t * k,
                                  ev->gates + (size_t)t * k, c->F);
        for (int e = 0; e < E; e++) { /* router logits, one dot product at a time */
            double z = 0;
            for (int j = 0; j < d; j++) z += W[(size_t)e * d + j] * ev->x[(size_t)t * d + j];
            c->Z[e] = z;
        }
        m2d_layer_stats_add_logits(c->acc[ev->layer], c->Z);
        c->done += 1;
        if (c->prog) m2d_progress_update(c->prog, c->done);
    }
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
    snprintf(st->model_hash, sizeof st->model_hash, "%s", m->weights_hash);
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
    c->norms = m2d_malloc((size_t)E * c->block_tokens * sizeof(double));
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
    free(c->acc); free(c->F); free(c->norms);
}

/* The teacher's forward over every window; the hook accumulates each MoE layer. */
static int run_windows(calib_ctx *c, m2d_stats *st, const int32_t *ids, int L, const m2d_calib_opts *o) {
    m2d_engine_opts eo = {.backend = o->device, .n_threads = calib_threads(o),
                          .precision = (m2d_precision)o->precision};
    int rc = m2d_engine_open(c->m, &eo, &c->eng);
    if (rc) return -1;
    snprintf(st->precision, sizeof st->precision, "%s", m2d_precision_name(m2d_engine_precision(c->eng)));
    /* no fp32 weight copy beyond the engine's own policy (small models only): an expert's bf16
     * weights are converted once per block of up to 256+ tokens, 6 % of calibration time on the
     * 30B-shaped slice, while a 4 GiB copy made peak RSS 7.8 GB instead of 3.5 GB and was not
     * faster (BENCHMARKS.md, "Memory") */
    m2d_engine_set_moe_hook(c->eng, o->reference ? calib_hook_reference : calib_hook_fast, c);
    m2d_progress prog;
    c->total = m2d_stats_window_tokens(st) * st->n_layers;
    if (o->progress) {
        m2d_progress_start(&prog, "calibrate (layer-tokens)", c->total);
        c->prog = &prog;
    }
    double lp;
    for (int w = 0; w < st->n_windows && rc == 0; w++) {
        const int32_t *tok = ids + st->window_starts[w];
        int n = st->window_lens ? st->window_lens[w] : L;
        /* only the last position's log-prob is requested: the forward (and its hook) is the point */
        rc = m2d_engine_logprobs(c->eng, tok, n, tok, n - 1, &lp);
        if (rc && c->err[0]) m2d_err("%s", c->err);
        for (int i = 0; i < st->n_layers; i++) m2d_layer_stats_end_sample(&st->layers[i]);
    }
    if (c->prog) m2d_progress_end(&prog);
    c->prog = NULL;
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

/* ------------------------------------------------------------------ stats file */

/* Stored arrays: the raw sums of stats.h (so files can be merged later); the derived fields
 * (mu, routed mean/variance, ES-Act/Mag) are recomputed on read by m2d_layer_stats_finalize. */
typedef struct { const char *name; int per; } array_desc; /* per: 0 = [E], 1 = [E*E], 2 = [E*d] */
static const array_desc ARRAYS[] = {
    {"n", 0}, {"sum_p", 0}, {"sum_p_sel", 0}, {"sum_g", 0}, {"sum_g2", 0}, {"sum_f", 0}, {"sum_f2", 0},
    {"sum_gf", 0}, {"sum_g2f2", 0}, {"sum_gf2", 0}, {"sum_g2f", 0}, {"sum_r", 0}, {"sum_r2", 0}, {"sum_rf", 0},
    {"sum_rf2", 0}, {"sum_r2f", 0}, {"sum_r2f2", 0}, {"damage", 0}, {"es_act_sum", 0}, {"es_mag_sum", 0},
    {"es_magg_sum", 0}, {"gram", 1}, {"logit_gram", 1}, {"sum_f_all", 2}, {"sum_f_routed", 2},
    {"sum_f_routed_sq", 2},
};
#define N_ARRAYS ((int)M2D_ARRAY_LEN(ARRAYS))

static double **layer_array(m2d_layer_stats *s, int i) {
    double **p[N_ARRAYS] = {&s->n, &s->sum_p, &s->sum_p_sel, &s->sum_g, &s->sum_g2, &s->sum_f, &s->sum_f2,
                            &s->sum_gf, &s->sum_g2f2, &s->sum_gf2, &s->sum_g2f, &s->sum_r, &s->sum_r2,
                            &s->sum_rf, &s->sum_rf2, &s->sum_r2f, &s->sum_r2f2, &s->damage, &s->es_act_sum,
                            &s->es_mag_sum, &s->es_magg_sum, &s->gram, &s->logit_gram, &s->sum_f_all,
                            &s->sum_f_routed, &s->sum_f_routed_sq};
    return p[i];
}

static size_t array_len(int per, int E, int d) {
    return per == 0 ? (size_t)E : per == 1 ? (size_t)E * E : (size_t)E * d;
}

static size_t payload_bytes(int n_layers, int E, int d) {
    size_t per = 0;
    for (int i = 0; i < N_ARRAYS; i++) per += array_len(ARRAYS[i].per, E, d);
    return per * n_layers * sizeof(double);
}

static void put_f64(uint8_t *b, double v) {
    uint64_t u;
    memcpy(&u, &v, 8);
    put_le64(b, u);
}

static double get_f64(const uint8_t *b) {
    uint64_t u = 0;
    for (int i = 0; i < 8; i++) u |= (uint64_t)b[i] << (8 * i);
    double v;
    memcpy(&v, &u, 8);
    return v;
}

int m2d_stats_write(const m2d_stats *s, const char *path) {
    size_t pbytes = payload_bytes(s->n_layers, s->E, s->d);
    uint8_t *payload = m2d_malloc(pbytes ? pbytes : 1), *q = payload;
    for (int l = 0; l < s->n_layers; l++)
        for (int i = 0; i < N_ARRAYS; i++) {
            const double *a = *layer_array(&s->layers[l], i);
            size_t n = array_len(ARRAYS[i].per, s->E, s->d);
            for (size_t j = 0; j < n; j++, q += 8) put_f64(q, a[j]);
        }
    char sha[65];
    m2d_sha256_hex(payload, pbytes, sha);

    cJSON *h = cJSON_CreateObject();
    cJSON_AddStringToObject(h, "magic", "moe2dense-stats");
    cJSON_AddNumberToObject(h, "version", M2D_STATS_VERSION);
    cJSON_AddStringToObject(h, "model_hash", s->model_hash);
    cJSON_AddStringToObject(h, "calib_hash", s->calib_hash);
    cJSON_AddStringToObject(h, "gate_convention", s->gate_convention);
    cJSON_AddNumberToObject(h, "E", s->E);
    cJSON_AddNumberToObject(h, "k", s->k);
    cJSON_AddNumberToObject(h, "d", s->d);
    cJSON_AddNumberToObject(h, "d_e", s->d_e);
    cJSON_AddNumberToObject(h, "n_layers", s->n_layers);
    cJSON *layers = cJSON_AddArrayToObject(h, "layers");
    for (int l = 0; l < s->n_layers; l++) cJSON_AddItemToArray(layers, cJSON_CreateNumber(s->layers[l].layer));
    cJSON_AddNumberToObject(h, "N", s->N);
    cJSON_AddNumberToObject(h, "n_samples", s->n_layers ? s->layers[0].n_samples : 0);
    cJSON_AddNumberToObject(h, "seq_len", s->seq_len);
    cJSON *win = cJSON_AddArrayToObject(h, "windows");
    for (int w = 0; w < s->n_windows; w++) cJSON_AddItemToArray(win, cJSON_CreateNumber((double)s->window_starts[w]));
    if (s->window_lens) { /* variable-length (document) windows */
        cJSON *wl = cJSON_AddArrayToObject(h, "window_lengths");
        for (int w = 0; w < s->n_windows; w++) cJSON_AddItemToArray(wl, cJSON_CreateNumber(s->window_lens[w]));
    }
    cJSON_AddStringToObject(h, "window_choice", s->window_choice[0] ? s->window_choice : "first");
    cJSON_AddStringToObject(h, "data_path", s->data_path ? s->data_path : "");
    cJSON_AddStringToObject(h, "precision", s->precision[0] ? s->precision : "fp32");
    cJSON *arr = cJSON_AddArrayToObject(h, "arrays");
    for (int i = 0; i < N_ARRAYS; i++) cJSON_AddItemToArray(arr, cJSON_CreateString(ARRAYS[i].name));
    cJSON_AddNumberToObject(h, "data_bytes", (double)pbytes);
    cJSON_AddStringToObject(h, "data_sha256", sha);
    char *js = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    size_t hl = strlen(js), pad = (8 - (16 + hl) % 8) % 8;
    size_t total = 16 + hl + pad + pbytes;
    uint8_t *buf = m2d_malloc(total);
    memcpy(buf, M2D_STATS_MAGIC, 8);
    put_le64(buf + 8, hl + pad);
    memcpy(buf + 16, js, hl);
    memset(buf + 16 + hl, ' ', pad);
    memcpy(buf + 16 + hl + pad, payload, pbytes);
    int rc = m2d_write_file_atomic(path, buf, total);
    free(js); free(payload); free(buf);
    return rc;
}

/* ---- payload checks: what any real calibration satisfies (a NaN or an all-zero payload with a
 * recomputed checksum loads no further than here) ---- */

/* Every value finite; the sums of non-negative quantities (counts, probabilities, gate weights,
 * norms, squares) >= 0. Arrays 0..12 are such sums, 13 is the Gram matrix, 14..16 per dimension. */
static int check_array(const char *path, const m2d_layer_stats *ls, int i, const double *a, size_t n) {
    int nonneg = i <= 12 || i == 16;
    for (size_t j = 0; j < n; j++) {
        if (!isfinite(a[j]))
            return m2d_err("%s: layer %d: field '%s'[%zu]: %g is not finite (corrupted statistics; recalibrate)", path,
                           ls->layer, ARRAYS[i].name, j, a[j]);
        if (nonneg && a[j] < 0)
            return m2d_err("%s: layer %d: field '%s'[%zu]: %g is negative (a sum of non-negative values; recalibrate)",
                           path, ls->layer, ARRAYS[i].name, j, a[j]);
    }
    return 0;
}

/* Routing invariants: each n_e a count in [0, N], and every token routed to exactly k experts. */
static int check_counts(const char *path, const m2d_stats *s, const m2d_layer_stats *ls) {
    double total = 0;
    for (int e = 0; e < s->E; e++) {
        double n = ls->n[e];
        if (n != floor(n) || n > s->N)
            return m2d_err("%s: layer %d: field 'n'[%d]: %g is not a token count in [0, N = %.0f]", path, ls->layer, e,
                           n, s->N);
        total += n;
    }
    if (total != s->N * s->k)
        return m2d_err("%s: layer %d: field 'n': the routed counts sum to %.0f, not N x k = %.0f (every token goes to "
                       "k experts; corrupted statistics, recalibrate)", path, ls->layer, total, s->N * s->k);
    return 0;
}

/* The Gram matrix is one: a non-negative diagonal and |G_ij| <= sqrt(G_ii G_jj) (Cauchy-Schwarz,
 * with room for rounding). */
static int check_gram(const char *path, const m2d_stats *s, const m2d_layer_stats *ls) {
    int E = s->E;
    for (int i = 0; i < E; i++) {
        if (ls->gram[(size_t)i * E + i] < 0)
            return m2d_err("%s: layer %d: field 'gram'[%d][%d]: negative diagonal", path, ls->layer, i, i);
        for (int j = 0; j < i; j++) {
            double bound = sqrt(ls->gram[(size_t)i * E + i] * ls->gram[(size_t)j * E + j]);
            if (fabs(ls->gram[(size_t)i * E + j]) > bound * (1 + 1e-6) + 1e-300)
                return m2d_err("%s: layer %d: field 'gram'[%d][%d]: %g exceeds sqrt(G_ii G_jj) = %g (not a Gram matrix)",
                               path, ls->layer, i, j, ls->gram[(size_t)i * E + j], bound);
        }
    }
    return 0;
}

static int check_payload(const char *path, const m2d_stats *s) {
    for (int l = 0; l < s->n_layers; l++) {
        m2d_layer_stats *ls = &s->layers[l];
        for (int i = 0; i < N_ARRAYS; i++)
            if (check_array(path, ls, i, *layer_array(ls, i), array_len(ARRAYS[i].per, s->E, s->d))) return -1;
        if (check_counts(path, s, ls) || check_gram(path, s, ls)) return -1;
    }
    return 0;
}

/* Header field helpers: each failure names the file and the field. */
static int hdr_int(const char *path, const cJSON *h, const char *field, long lo, long hi, long *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(h, field);
    if (!cJSON_IsNumber(v) || v->valuedouble != (double)(long)v->valuedouble || v->valuedouble < lo || v->valuedouble > hi)
        return m2d_err("%s: field '%s': missing or not an integer in [%ld, %ld]", path, field, lo, hi);
    *out = (long)v->valuedouble;
    return 0;
}

static int hdr_str(const char *path, const cJSON *h, const char *field, char *out, size_t cap) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(h, field);
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= cap)
        return m2d_err("%s: field '%s': missing, not a string, or longer than %zu bytes", path, field, cap - 1);
    snprintf(out, cap, "%s", v->valuestring);
    return 0;
}

static int is_hex64(const char *s) {
    if (strlen(s) != 64) return 0;
    for (int i = 0; i < 64; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

/* magic, version, hashes, gate convention and shapes */
static int parse_identity(const char *path, const cJSON *h, m2d_stats *s) {
    char buf[64];
    long v;
    if (hdr_str(path, h, "magic", buf, sizeof buf)) return -1;
    if (strcmp(buf, "moe2dense-stats")) return m2d_err("%s: field 'magic': '%s' is not moe2dense-stats", path, buf);
    if (hdr_int(path, h, "version", 0, 1000000, &v)) return -1;
    if (v != M2D_STATS_VERSION)
        return m2d_err("%s: field 'version': %ld is not supported (this build reads version %d; recalibrate)", path, v,
                       M2D_STATS_VERSION);
    if (hdr_str(path, h, "model_hash", s->model_hash, sizeof s->model_hash) || !is_hex64(s->model_hash))
        return m2d_err("%s: field 'model_hash': not a sha256 hex string", path);
    if (hdr_str(path, h, "calib_hash", s->calib_hash, sizeof s->calib_hash) || !is_hex64(s->calib_hash))
        return m2d_err("%s: field 'calib_hash': not a sha256 hex string", path);
    if (hdr_str(path, h, "gate_convention", s->gate_convention, sizeof s->gate_convention)) return -1;
    if (strcmp(s->gate_convention, "softmax-topk-renorm") && strcmp(s->gate_convention, "softmax-topk") &&
        strcmp(s->gate_convention, "topk-softmax"))
        return m2d_err("%s: field 'gate_convention': unknown convention '%s'", path, s->gate_convention);
    if (hdr_int(path, h, "E", 1, 1 << 16, &v)) return -1;
    s->E = (int)v;
    if (hdr_int(path, h, "k", 1, s->E, &v)) return -1;
    s->k = (int)v;
    if (hdr_int(path, h, "d", 1, 1 << 20, &v)) return -1;
    s->d = (int)v;
    if (hdr_int(path, h, "d_e", 1, 1 << 24, &v)) return -1;
    s->d_e = (int)v;
    return 0;
}

/* seq_len, N, the windows (N = windows x seq_len), n_samples, window choice, data path */
static int parse_windows(const char *path, const cJSON *h, m2d_stats *s, long *ns) {
    long v;
    if (hdr_int(path, h, "seq_len", 1, 1 << 30, &v)) return -1;
    s->seq_len = (int)v;
    if (hdr_int(path, h, "n_samples", 0, 1L << 40, ns)) return -1;
    const cJSON *N = cJSON_GetObjectItemCaseSensitive(h, "N");
    if (!cJSON_IsNumber(N) || N->valuedouble < 0 || N->valuedouble != floor(N->valuedouble))
        return m2d_err("%s: field 'N': missing or not a non-negative integer", path);
    s->N = N->valuedouble;
    const cJSON *win = cJSON_GetObjectItemCaseSensitive(h, "windows");
    if (!cJSON_IsArray(win)) return m2d_err("%s: field 'windows': missing or not an array", path);
    s->n_windows = cJSON_GetArraySize(win);
    s->window_starts = m2d_malloc((size_t)(s->n_windows ? s->n_windows : 1) * sizeof(int64_t));
    int i = 0;
    for (const cJSON *w = win->child; w; w = w->next, i++) {
        if (!cJSON_IsNumber(w) || w->valuedouble < 0 || w->valuedouble != floor(w->valuedouble))
            return m2d_err("%s: field 'windows': entry %d is not a token offset", path, i);
        s->window_starts[i] = (int64_t)w->valuedouble;
    }
    const cJSON *wl = cJSON_GetObjectItemCaseSensitive(h, "window_lengths");
    if (wl) {
        if (!cJSON_IsArray(wl) || cJSON_GetArraySize(wl) != s->n_windows)
            return m2d_err("%s: field 'window_lengths': not an array of one length per window", path);
        s->window_lens = m2d_malloc((size_t)(s->n_windows ? s->n_windows : 1) * sizeof(int));
        i = 0;
        for (const cJSON *w = wl->child; w; w = w->next, i++) {
            if (!cJSON_IsNumber(w) || w->valuedouble < 1 || w->valuedouble > s->seq_len ||
                w->valuedouble != floor(w->valuedouble))
                return m2d_err("%s: field 'window_lengths': entry %d is not a length in [1, seq_len]", path, i);
            s->window_lens[i] = (int)w->valuedouble;
        }
    }
    if (m2d_stats_window_tokens(s) != s->N)
        return m2d_err("%s: field 'N': %.0f is not the tokens of the %d windows (%.0f)", path, s->N, s->n_windows,
                       m2d_stats_window_tokens(s));
    if (*ns != s->n_windows)
        return m2d_err("%s: field 'n_samples': %ld but %d windows are recorded", path, *ns, s->n_windows);
    const cJSON *wc = cJSON_GetObjectItemCaseSensitive(h, "window_choice");
    if (wc && !cJSON_IsString(wc)) return m2d_err("%s: field 'window_choice': not a string", path);
    snprintf(s->window_choice, sizeof s->window_choice, "%s", wc ? wc->valuestring : "first");
    const cJSON *dp = cJSON_GetObjectItemCaseSensitive(h, "data_path");
    s->data_path = m2d_strdup(cJSON_IsString(dp) ? dp->valuestring : "");
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(h, "precision");
    if (pr && (!cJSON_IsString(pr) || (strcmp(pr->valuestring, "fp32") && strcmp(pr->valuestring, "bf16"))))
        return m2d_err("%s: field 'precision': expected \"fp32\" or \"bf16\"", path);
    snprintf(s->precision, sizeof s->precision, "%s", pr ? pr->valuestring : "fp32");
    return 0;
}

/* the array names of this version, the payload size for NL layers and its checksum */
static int parse_payload(const char *path, const cJSON *h, const m2d_stats *s, long nl, size_t *pbytes, char sha[65]) {
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(h, "arrays");
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) != N_ARRAYS)
        return m2d_err("%s: field 'arrays': expected the %d arrays of version %d", path, N_ARRAYS, M2D_STATS_VERSION);
    int i = 0;
    for (const cJSON *a = arr->child; a; a = a->next, i++)
        if (!cJSON_IsString(a) || strcmp(a->valuestring, ARRAYS[i].name))
            return m2d_err("%s: field 'arrays': entry %d is not '%s'", path, i, ARRAYS[i].name);
    const cJSON *dbj = cJSON_GetObjectItemCaseSensitive(h, "data_bytes");
    if (!cJSON_IsNumber(dbj)) return m2d_err("%s: field 'data_bytes': missing or not a number", path);
    *pbytes = payload_bytes((int)nl, s->E, s->d);
    if (dbj->valuedouble != (double)*pbytes)
        return m2d_err("%s: field 'data_bytes': %.0f does not match E=%d, d=%d, n_layers=%d (%zu bytes)", path,
                       dbj->valuedouble, s->E, s->d, (int)nl, *pbytes);
    if (hdr_str(path, h, "data_sha256", sha, 65) || !is_hex64(sha))
        return m2d_err("%s: field 'data_sha256': not a sha256 hex string", path);
    return 0;
}

/* the MoE layer indices (increasing), each with zeroed sums of the header's shape */
static int parse_layers(const char *path, const cJSON *layers, m2d_stats *s, long nl, long ns) {
    s->layers = m2d_calloc((size_t)nl, sizeof *s->layers);
    s->n_layers = (int)nl;
    int i = 0;
    for (const cJSON *l = layers->child; l; l = l->next, i++) {
        if (!cJSON_IsNumber(l) || l->valuedouble < 0 || l->valuedouble > 1e6 || l->valuedouble != floor(l->valuedouble))
            return m2d_err("%s: field 'layers': entry %d is not a layer index", path, i);
        if (i > 0 && l->valuedouble <= s->layers[i - 1].layer)
            return m2d_err("%s: field 'layers': entry %d is not increasing", path, i);
        m2d_layer_stats_alloc(&s->layers[i], (int)l->valuedouble, s->E, s->k, s->d);
        s->layers[i].N = s->N;
        s->layers[i].n_samples = (int)ns;
    }
    return 0;
}

static int parse_header(const char *path, const cJSON *h, m2d_stats *s, size_t *pbytes, char sha[65]) {
    long nl, ns;
    if (parse_identity(path, h, s)) return -1;
    /* s->n_layers is set only once s->layers exists (m2d_stats_free walks it) */
    if (hdr_int(path, h, "n_layers", 1, 1 << 16, &nl)) return -1;
    if (parse_windows(path, h, s, &ns)) return -1;
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(h, "layers");
    if (!cJSON_IsArray(layers) || cJSON_GetArraySize(layers) != nl)
        return m2d_err("%s: field 'layers': not an array of n_layers (%d) layer indices", path, (int)nl);
    if (parse_payload(path, h, s, nl, pbytes, sha)) return -1;
    return parse_layers(path, layers, s, nl, ns);
}

int m2d_stats_read(const char *path, m2d_stats **out) {
    size_t len;
    uint8_t *buf = (uint8_t *)m2d_read_file(path, &len);
    if (!buf) return -1;
    int rc = m2d_stats_parse(path, buf, len, out);
    free(buf);
    return rc;
}

int m2d_stats_parse(const char *path, const uint8_t *buf, size_t len, m2d_stats **out) {
    m2d_stats *s = m2d_calloc(1, sizeof *s);
    int rc = -1;
    cJSON *h = NULL;
    if (len < 16 || memcmp(buf, M2D_STATS_MAGIC, 8)) {
        m2d_err("%s: field 'magic': not a moe2dense stats file (expected it to start with %s)", path, M2D_STATS_MAGIC);
        goto done;
    }
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++) hl |= (uint64_t)buf[8 + i] << (8 * i);
    if (hl > len - 16 || (16 + hl) % 8) {
        m2d_err("%s: field 'header_length': %llu is inconsistent with the file size %zu (truncated?)", path,
                (unsigned long long)hl, len);
        goto done;
    }
    h = cJSON_ParseWithLength((const char *)buf + 16, (size_t)hl);
    if (!cJSON_IsObject(h)) {
        m2d_err("%s: field 'header': not a JSON object (garbled file?)", path);
        goto done;
    }
    size_t pbytes = 0;
    char sha[65];
    if (parse_header(path, h, s, &pbytes, sha)) goto done;
    if (len - 16 - hl != pbytes) {
        m2d_err("%s: field 'data_bytes': the file holds %llu payload bytes, the header says %zu (truncated or "
                "padded file)", path, (unsigned long long)(len - 16 - hl), pbytes);
        goto done;
    }
    const uint8_t *q = buf + 16 + hl;
    char got[65];
    m2d_sha256_hex(q, pbytes, got);
    if (strcmp(got, sha)) {
        m2d_err("%s: field 'data_sha256': payload checksum mismatch (corrupted file; recalibrate)", path);
        goto done;
    }
    for (int l = 0; l < s->n_layers; l++)
        for (int i = 0; i < N_ARRAYS; i++) {
            double *a = *layer_array(&s->layers[l], i);
            size_t n = array_len(ARRAYS[i].per, s->E, s->d);
            for (size_t j = 0; j < n; j++, q += 8) a[j] = get_f64(q);
        }
    if (check_payload(path, s)) goto done;
    for (int l = 0; l < s->n_layers; l++) m2d_layer_stats_finalize(&s->layers[l]);
    rc = 0;
done:
    cJSON_Delete(h);
    if (rc) {
        m2d_stats_free(s);
        free(s);
    } else {
        *out = s;
    }
    return rc;
}

void m2d_calib_stats_free(m2d_stats *s) {
    if (!s) return;
    m2d_stats_free(s);
    free(s);
}

int m2d_stats_check_model(const m2d_stats *s, const char *stats_path, const m2d_model *m) {
    const m2d_config *c = &m->cfg;
    if (strcmp(s->model_hash, m->weights_hash))
        return m2d_err("%s: field 'model_hash': the statistics were computed on another model (%.12s..., this model "
                       "%s is %.12s...); recalibrate with 'moe2dense calibrate'", stats_path, s->model_hash, m->dir,
                       m->weights_hash);
    if (s->E != c->num_experts || s->k != c->num_experts_per_tok || s->d != c->hidden_size ||
        s->d_e != c->moe_intermediate_size)
        return m2d_err("%s: field 'E': shapes (E %d, k %d, d %d, d_e %d) do not match %s", stats_path, s->E, s->k, s->d,
                       s->d_e, m->dir);
    if (strcmp(s->gate_convention, m2d_calib_gate_convention(c)))
        return m2d_err("%s: field 'gate_convention': '%s' but the model uses '%s'", stats_path, s->gate_convention,
                       m2d_calib_gate_convention(c));
    int i = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (!c->layer_is_moe[l]) continue;
        if (i >= s->n_layers || s->layers[i].layer != l)
            return m2d_err("%s: field 'layers': MoE layer %d of %s is missing", stats_path, l, m->dir);
        i++;
    }
    if (i != s->n_layers) return m2d_err("%s: field 'layers': more MoE layers than %s has", stats_path, m->dir);
    return 0;
}
