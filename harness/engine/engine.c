/* engine — the batched forward pass of every registered architecture, on a backend object.
 *
 * The engine knows no architecture by name: it reads the model's tensor roles (model.h) and its
 * ops description (cfg.ops: q/k norm kind, router, activation, RoPE), and calls only backend ops
 * (backend.h) on backend buffers. What it does itself is bookkeeping on the host: positions of the
 * segments, token and target uploads, and (only when a calibration hook is set) downloading the
 * hook's view of the routing.
 *
 * Weights stay in their stored dtype; the backend reads them as stored, or prepares them once when
 * made resident (m2d_engine_cache_weights) within a byte budget. Chosen by measurement on the CPU
 * backend (bench/bench_engine.c, bench_gemm.c; numbers in BENCHMARKS.md): bf16 GEMMs read bf16
 * weights in place; prepared copies (oneDNN's blocked layout, the same bytes in bf16) gain 4-38 %
 * per GEMM but cost memory beside the mmapped checkpoint, so big checkpoints stay as stored.
 *
 * One core (forward_hidden) serves every entry point: a batch of rows split into "segments";
 * each segment attends to an optional cached prefix and causally to itself. A full window is
 * one segment with no prefix; extend is one segment over the KV cache (and appends to it);
 * branches are several segments over the same cached prefix, all in one batch.
 *
 * Kept whole (~860 lines; the checks are engine_check.c): the layers, the entry points and the KV
 * cache read one private state (struct m2d_engine: weight handles, RoPE table, hook) and run one
 * op sequence; a split would publish that state in a header that nothing else should read. */
#include "engine/engine.h"
#include "engine/engine_check.h"
#include "engine/actstore.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

#define LM_CHUNK 4096 /* vocab rows of the LM head per GEMM when full logits are asked for */

typedef struct {
    m2d_weight *w[M2D_T_COUNT];
    m2d_weight **x[M2D_X_COUNT]; /* [expert], MoE layers only */
} layer_weights;

struct m2d_engine {
    const m2d_model *m;
    m2d_backend *be;
    const m2d_backend_ops *B;
    m2d_precision prec;
    m2d_precision attn_prec; /* of attention's operands (m2d_engine_opts.attention) */
    m2d_moe_hook hook;
    void *hook_user;
    float *hook_x;        /* the hook's host copy of x, kept across calls and pinned (hook_x_buf) */
    size_t hook_x_cap;    /* its bytes */
    m2d_probe_hook probe;                     /* analyses of activations (m2d_engine_set_probe) */
    void *probe_user;
    unsigned probe_points;
    int skip_layer;                           /* >= 0: that layer is skipped (m2d_engine_set_skip_layer) */
    m2d_weight *embed, *final_norm, *lm_head; /* lm_head == embed when tied */
    layer_weights *lw;                        /* [num_hidden_layers] */
    size_t resident_bytes;
    int route_topk;                           /* > 0: Eq. 6 routing override (m2d_engine_set_route_topk) */
    m2d_pass_opts pass;                       /* how m2d_engine_logprobs_windows runs */
    m2d_rope_args rope;                       /* the model's RoPE (frequencies from cfg, model/rope.h) */
    double *inv_freq;                         /* [rope_dim / 2] */
};

struct m2d_kv {
    const m2d_engine *e;
    int cap, len, n_layers, n_kv, hd;
    m2d_buf *k, *v; /* [layer][n_kv][cap][hd] */
};

/* ---- weights ---- */

static void weights_new(m2d_engine *e) {
    const m2d_model *m = e->m;
    e->embed = e->B->weight_new(e->be, m->embed);
    e->final_norm = e->B->weight_new(e->be, m->final_norm);
    e->lm_head = m->lm_head == m->embed ? e->embed : e->B->weight_new(e->be, m->lm_head);
    e->lw = m2d_calloc((size_t)m->cfg.num_hidden_layers, sizeof *e->lw);
    for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
        const m2d_layer *L = &m->layers[l];
        for (int r = 0; r < M2D_T_COUNT; r++)
            if (L->w[r]) e->lw[l].w[r] = e->B->weight_new(e->be, L->w[r]);
        for (int r = 0; r < M2D_X_COUNT && m->cfg.layer_is_moe[l]; r++) {
            if (!L->x[r]) continue; /* an optional role (expert biases) */
            e->lw[l].x[r] = m2d_calloc((size_t)m->cfg.num_experts, sizeof(m2d_weight *));
            for (int x = 0; x < m->cfg.num_experts; x++) e->lw[l].x[r][x] = e->B->weight_new(e->be, L->x[r][x]);
        }
    }
}

static void weights_free(m2d_engine *e) {
    for (int l = 0; e->lw && l < e->m->cfg.num_hidden_layers; l++) {
        for (int r = 0; r < M2D_T_COUNT; r++) e->B->weight_free(e->be, e->lw[l].w[r]);
        for (int r = 0; r < M2D_X_COUNT; r++) {
            for (int x = 0; e->lw[l].x[r] && x < e->m->cfg.num_experts; x++) e->B->weight_free(e->be, e->lw[l].x[r][x]);
            free(e->lw[l].x[r]);
        }
    }
    free(e->lw);
    if (e->lm_head != e->embed) e->B->weight_free(e->be, e->lm_head);
    e->B->weight_free(e->be, e->embed);
    e->B->weight_free(e->be, e->final_norm);
}

/* Visit every weight in residency order: small and hot first (each layer's norms, attention,
 * router and dense FFN, then the final norm), then the experts, the LM head, the embedding last.
 * On a backend whose lookups convert just the rows they read (the CPU), the embedding is visited
 * only as the tied LM head, and only when TIED_HEAD (the default policy does not count a tied
 * head); where lookups want it resident (a GPU: resident_embedding), always. */
static void for_each_weight(m2d_engine *e, int tied_head, void (*fn)(m2d_engine *, m2d_weight *, void *), void *ctx) {
    const m2d_config *c = &e->m->cfg;
    for (int l = 0; l < c->num_hidden_layers; l++)
        for (int r = 0; r < M2D_T_COUNT; r++)
            if (e->lw[l].w[r]) fn(e, e->lw[l].w[r], ctx);
    fn(e, e->final_norm, ctx);
    for (int l = 0; l < c->num_hidden_layers; l++)
        for (int x = 0; e->lw[l].x[0] && x < c->num_experts; x++)
            for (int r = 0; r < M2D_X_COUNT; r++)
                if (e->lw[l].x[r]) fn(e, e->lw[l].x[r][x], ctx);
    int dev = e->B->resident_embedding;
    if (e->lm_head != e->embed || tied_head || dev) fn(e, e->lm_head, ctx);
    if (e->lm_head != e->embed && dev) fn(e, e->embed, ctx);
}

static void add_bytes(m2d_engine *e, m2d_weight *w, void *ctx) { *(size_t *)ctx += e->B->resident_bytes(e->be, w); }

static void keep_within(m2d_engine *e, m2d_weight *w, void *ctx) {
    size_t b = e->B->resident_bytes(e->be, w);
    if (b == 0 || e->resident_bytes + b > *(const size_t *)ctx) return;
    size_t made;
    if (e->B->make_resident(e->be, w, &made) == 0) e->resident_bytes += made;
}

size_t m2d_engine_cache_weights(m2d_engine *e, size_t budget_bytes) {
    /* prepared copies are made from the values: a lazy model's deferred layers get theirs first
     * (a layer that cannot is reported by the forward that runs it) */
    for (int l = 0; l < e->m->cfg.num_hidden_layers; l++)
        if (m2d_model_acquire_layer(e->m, l)) return e->resident_bytes;
    e->B->enter(e->be);
    for_each_weight(e, 1, keep_within, &budget_bytes);
    e->B->leave(e->be);
    return e->resident_bytes;
}

/* $M2D_WEIGHT_CACHE_MB if set (0 = prepare on use); else everything, if the backend's default
 * budget holds all of it and the passes are window-major (a layer-major engine holds one layer) */
static void default_residency(m2d_engine *e) {
    const char *env = getenv("M2D_WEIGHT_CACHE_MB");
    if (env) {
        if (atol(env) > 0) m2d_engine_cache_weights(e, (size_t)atol(env) << 20);
        return;
    }
    if (e->pass.layer_major) return;
    size_t all = 0;
    for_each_weight(e, 0, add_bytes, &all);
    if (all > 0 && all <= e->B->resident_budget(e->be)) m2d_engine_cache_weights(e, all);
}

/* ---- lifecycle ---- */

/* AUTO through the backend's own rule; a precision the backend lacks is an error */
static int resolve_on(m2d_backend *be, m2d_precision p, m2d_precision *out) {
    if (p == M2D_PREC_AUTO) p = be->ops->auto_precision ? be->ops->auto_precision(be, p) : M2D_PREC_FP32;
    if (!(be->ops->precisions & (1u << p)))
        return m2d_err("engine: backend %s does not support precision %s", be->ops->name, m2d_precision_name(p));
    *out = p;
    return 0;
}

int m2d_engine_resolve_precision(const char *backend, m2d_precision p, m2d_precision *out) {
    if ((unsigned)p >= M2D_PREC_COUNT) return m2d_err("engine: precision %d is not one", (int)p);
    m2d_backend *be;
    if (m2d_backend_new(backend ? backend : "cpu", &(m2d_backend_opts){.n_threads = 1, .precision = p}, &be)) return -1;
    int rc = resolve_on(be, p, out);
    m2d_backend_free(be);
    return rc;
}

/* fp32, or bf16 where the backend has the capability attention-bf16 */
static int check_attention(const m2d_backend *be, m2d_precision p) {
    if (p != M2D_PREC_FP32 && p != M2D_PREC_BF16)
        return m2d_err("engine: attention precision %s: fp32 or bf16", m2d_precision_name(p));
    if (p == M2D_PREC_BF16 && m2d_backend_missing(be, M2D_CAP(M2D_CAP_ATTN_BF16)) >= 0)
        return m2d_err("engine: attention in bf16 needs '%s', which backend %s does not implement",
                       m2d_cap_name(M2D_CAP_ATTN_BF16), be->ops->name);
    return 0;
}

int m2d_engine_check_attention(const char *backend, m2d_precision p) {
    if (p == M2D_PREC_FP32) return 0;
    m2d_backend *be;
    if (m2d_backend_new(backend ? backend : "cpu", &(m2d_backend_opts){.n_threads = 1}, &be)) return -1;
    int rc = check_attention(be, p);
    m2d_backend_free(be);
    return rc;
}

int m2d_engine_open(const m2d_model *m, const m2d_engine_opts *o, m2d_engine **out) {
    *out = NULL;
    if (m2d_engine_check_model(m)) return -1;
    if ((unsigned)o->precision >= M2D_PREC_COUNT) return m2d_err("engine: precision %d is not one", (int)o->precision);
    m2d_backend_opts bo = {.n_threads = o->n_threads, .precision = o->precision};
    m2d_backend *be;
    if (m2d_backend_new(o->backend ? o->backend : "cpu", &bo, &be)) return -1;
    m2d_precision p;
    if (m2d_engine_check_caps(m, be) || resolve_on(be, o->precision, &p) || check_attention(be, o->attention)) {
        m2d_backend_free(be);
        return -1;
    }
    m2d_engine *e = m2d_calloc(1, sizeof *e);
    e->m = m;
    e->be = be;
    e->B = be->ops;
    e->prec = p;
    e->attn_prec = o->attention;
    e->skip_layer = -1;
    e->pass = m2d_engine_plan_pass(m, o->mem_budget ? o->mem_budget : m2d_default_mem_budget(), o->pass);
    e->pass.spill_dir = o->spill_dir;
    e->pass.act = o->act;
    int rot = m2d_engine_rope_dim(&m->cfg);
    e->inv_freq = m2d_malloc(sizeof(double) * (size_t)(rot / 2));
    m2d_rope_inv_freq(&m->cfg.rope_scaling, m->cfg.rope_theta, rot, e->inv_freq);
    e->rope = (m2d_rope_args){.kind = m->cfg.ops.rope, .theta = m->cfg.rope_theta, .inv_freq = e->inv_freq,
                              .attn_factor = m2d_rope_attention_factor(&m->cfg.rope_scaling), .rot_dim = rot};
    weights_new(e);
    default_residency(e);
    *out = e;
    return 0;
}

int m2d_engine_new(const m2d_model *m, int n_threads, m2d_engine **out) {
    m2d_engine_opts o = {.backend = "cpu", .n_threads = n_threads, .precision = M2D_PREC_FP32};
    return m2d_engine_open(m, &o, out);
}

void m2d_engine_free(m2d_engine *e) {
    if (!e) return;
    weights_free(e);
    m2d_engine_unpin(e, e->hook_x);
    m2d_backend_free(e->be);
    free(e->hook_x);
    free(e->inv_freq);
    free(e);
}

const m2d_model *m2d_engine_model(const m2d_engine *e) { return e->m; }
m2d_precision m2d_engine_precision(const m2d_engine *e) { return e->prec; }
m2d_precision m2d_engine_attention_precision(const m2d_engine *e) { return e->attn_prec; }
m2d_backend *m2d_engine_backend(m2d_engine *e) { return e->be; }
int m2d_engine_tune(m2d_engine *e, const char *knob, int value) { return e->B->tune(e->be, knob, value); }
void m2d_engine_set_expert_parallel(m2d_engine *e, int on) { e->B->tune(e->be, "expert_parallel", on ? 1 : 0); }

void m2d_engine_set_moe_hook(m2d_engine *e, m2d_moe_hook hook, void *user) {
    e->hook = hook;
    e->hook_user = user;
}

void m2d_engine_set_probe(m2d_engine *e, m2d_probe_hook hook, void *user, unsigned points) {
    e->probe = hook;
    e->probe_user = user;
    e->probe_points = hook ? points : 0;
}

int m2d_engine_set_skip_layer(m2d_engine *e, int layer) {
    if (layer < -1 || layer >= e->m->cfg.num_hidden_layers)
        return m2d_err("engine: skip layer %d outside [-1, %d)", layer, e->m->cfg.num_hidden_layers);
    e->skip_layer = layer;
    return 0;
}

/* The probe's host copy of COLS columns of N rows of BUF at POINT of LAYER (only when asked for). */
static int probe_at(m2d_engine *e, int layer, m2d_probe_point point, m2d_buf *buf, int n, int cols) {
    if (!(e->probe_points & (1u << point))) return 0;
    size_t bytes = (size_t)n * (size_t)cols * sizeof(float);
    float *x = m2d_malloc(bytes);
    e->B->download(e->be, x, buf, 0, bytes);
    m2d_probe_event ev = {layer, point, n, cols, x};
    m2d_err_clear();
    int rc = 0;
    if (e->probe(e->probe_user, &ev)) {
        char why[768];
        snprintf(why, sizeof why, "%s", m2d_errmsg());
        rc = m2d_err("engine: probe aborted the forward at layer %d%s%s", layer, why[0] ? ": " : "", why);
    }
    free(x);
    return rc;
}

/* ---- the forward's buffers ---- */
typedef struct {
    int n_seg;
    const int *seg_off, *seg_len; /* rows of each segment, contiguous and in order */
    const m2d_kv *prefix;         /* cached keys every segment sees (NULL: none) */
    int np;                       /* number of prefix positions used */
    m2d_kv *append;               /* when set (one segment), its keys/values are appended */
    float *capture;               /* when set: the residual stream after each layer, host [layers][n][d] */
} seg_plan;

typedef struct {
    int n;
    int r0; /* rows [r0, n) go on past the attention (see live_rows); 0 but in the last layer of a
             * forward whose caller reads only those rows */
    m2d_buf *x, *xn, *ffo, *q, *att, *k, *v, *g, *u; /* fp32 activations */
    m2d_buf *tok, *pos;                              /* int32 [n] */
    m2d_buf *probs, *topk, *gates;                   /* routing [n, E], [n, k] (MoE models) */
    m2d_buf *sh, *shl;                               /* shared experts' output [n, d], gate logit [n, 1] */
    m2d_buf *lat;                                    /* MLA: the q or kv latent [n, max rank] */
} fwd_ws;

static size_t f32s(int64_t rows, int64_t cols) { return (size_t)rows * (size_t)cols * sizeof(float); }

/* experts routed per token: the model's top-k, or the distillation override */
static int route_k(const m2d_engine *e) { return e->route_topk > 0 ? e->route_topk : e->m->cfg.num_experts_per_tok; }

static void ws_free(m2d_engine *e, fwd_ws *w) {
    m2d_buf *all[] = {w->x, w->xn, w->ffo, w->q, w->att, w->k, w->v, w->g, w->u, w->tok, w->pos, w->probs, w->topk,
                      w->gates, w->sh, w->shl, w->lat};
    for (size_t i = 0; i < M2D_ARRAY_LEN(all); i++) e->B->release(e->be, all[i]);
}

static int ws_alloc(m2d_engine *e, int n, fwd_ws *w) {
    const m2d_config *c = &e->m->cfg;
    int d = c->hidden_size, qd = c->num_attention_heads * c->head_dim, kvd = c->num_key_value_heads * c->head_dim;
    int inter = 0, any_moe = 0, k = route_k(e);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (!c->layer_is_moe[l]) inter = M2D_MAX(inter, c->intermediate_size);
        any_moe |= c->layer_is_moe[l];
    }
    int shared = any_moe ? c->shared_expert_intermediate_size : 0;
    inter = M2D_MAX(inter, shared);
    memset(w, 0, sizeof *w);
    w->n = n;
    m2d_backend *be = e->be;
    m2d_buf *(*A)(m2d_backend *, size_t) = e->B->alloc;
    w->x = A(be, f32s(n, d)), w->xn = A(be, f32s(n, d)), w->ffo = A(be, f32s(n, d));
    w->q = A(be, f32s(n, qd)), w->att = A(be, f32s(n, qd)), w->k = A(be, f32s(n, kvd)), w->v = A(be, f32s(n, kvd));
    w->tok = A(be, sizeof(int32_t) * (size_t)n), w->pos = A(be, sizeof(int32_t) * (size_t)n);
    int ok = w->x && w->xn && w->ffo && w->q && w->att && w->k && w->v && w->tok && w->pos;
    if (inter) ok &= (w->g = A(be, f32s(n, inter))) && (w->u = A(be, f32s(n, inter)));
    if (any_moe)
        ok &= (w->probs = A(be, f32s(n, c->num_experts))) && (w->topk = A(be, sizeof(int32_t) * (size_t)n * k)) &&
              (w->gates = A(be, f32s(n, k)));
    if (shared) ok &= (w->sh = A(be, f32s(n, d))) && (w->shl = A(be, f32s(n, 1)));
    if (c->ops.attn == M2D_ATTN_MLA) {
        ok &= (w->lat = A(be, f32s(n, M2D_MAX(c->q_lora_rank, c->kv_lora_rank)))) != NULL;
        /* the values' padding (head_dim - v_head_dim per head) stays zero: only the v slots are written */
        float *zero = ok ? m2d_calloc((size_t)n * kvd, sizeof(float)) : NULL;
        if (ok) e->B->upload(be, w->v, 0, zero, f32s(n, kvd));
        free(zero);
    }
    if (ok) return 0;
    ws_free(e, w);
    return -1;
}

/* ---- layers ---- */

/* y[r] += b (an optional role: nothing when the layer has none) */
static void bias(m2d_engine *e, m2d_mat *y, const m2d_weight *b) {
    if (b) e->B->add_bias(e->be, y, b);
}

/* per ops.qk_norm: each head's vector ([n*heads, head_dim] rows) or the whole projection ([n, heads*head_dim]) */
/* Rows [r0, n) of a per-row buffer of COLS columns: what a layer computes after its attention. Every
 * row, but in the last layer of a forward whose caller reads only the rows from r0 on (the log-probs
 * of a continuation, the last token of a prompt): their keys, values and attention need every row
 * before them, the rest of the layer only themselves (llama.cpp does the same with its output ids). */
static m2d_mat live_rows(const fwd_ws *w, m2d_buf *b, int cols) {
    return m2d_mat_of(b, (size_t)w->r0 * cols, w->n - w->r0, cols, cols);
}

static void qk_norm(m2d_engine *e, const layer_weights *lw, const fwd_ws *w) {
    const m2d_config *c = &e->m->cfg;
    int n = w->n, H = c->num_attention_heads, KV = c->num_key_value_heads, hd = c->head_dim;
    if (c->ops.qk_norm == M2D_QK_NORM_NONE) return;
    int whole = c->ops.qk_norm == M2D_QK_NORM_WHOLE;
    m2d_mat Q = whole ? m2d_mat_of(w->q, 0, n, H * hd, H * hd) : m2d_mat_of(w->q, 0, n * H, hd, hd);
    m2d_mat K = whole ? m2d_mat_of(w->k, 0, n, KV * hd, KV * hd) : m2d_mat_of(w->k, 0, n * KV, hd, hd);
    e->B->rmsnorm(e->be, &Q, lw->w[M2D_T_Q_NORM], c->rms_norm_eps, &Q);
    e->B->rmsnorm(e->be, &K, lw->w[M2D_T_K_NORM], c->rms_norm_eps, &K);
}

/* q, k, v of the normed input xn: projections (+ biases), q/k norm, clamp (clip_qkv), RoPE */
static void gqa_qkv(m2d_engine *e, int l, const fwd_ws *w) {
    const m2d_config *c = &e->m->cfg;
    const m2d_backend_ops *B = e->B;
    const layer_weights *lw = &e->lw[l];
    int n = w->n, d = c->hidden_size, H = c->num_attention_heads, KV = c->num_key_value_heads, hd = c->head_dim;
    int qd = H * hd, kvd = KV * hd;
    m2d_mat XN = m2d_mat_of(w->xn, 0, n, d, d);
    m2d_mat Q = m2d_mat_of(w->q, 0, n, qd, qd), K = m2d_mat_of(w->k, 0, n, kvd, kvd), V = m2d_mat_of(w->v, 0, n, kvd, kvd);
    B->gemm(e->be, &XN, lw->w[M2D_T_Q], 0, &Q, 0.0f, e->prec);
    B->gemm(e->be, &XN, lw->w[M2D_T_K], 0, &K, 0.0f, e->prec);
    B->gemm(e->be, &XN, lw->w[M2D_T_V], 0, &V, 0.0f, e->prec);
    bias(e, &Q, lw->w[M2D_T_Q_BIAS]);
    bias(e, &K, lw->w[M2D_T_K_BIAS]);
    bias(e, &V, lw->w[M2D_T_V_BIAS]);
    qk_norm(e, lw, w);
    if (c->clip_qkv > 0) {
        B->clamp(e->be, &Q, (float)c->clip_qkv);
        B->clamp(e->be, &K, (float)c->clip_qkv);
        B->clamp(e->be, &V, (float)c->clip_qkv);
    }
    B->rope(e->be, &Q, H, hd, w->pos, &e->rope);
    B->rope(e->be, &K, KV, hd, w->pos, &e->rope);
}

/* MLA (model.h M2D_ATTN_MLA): q, k, v of the normed input xn in the GQA layout attend() reads:
 * heads of head_dim = nope + rope, the values zero-padded to head_dim; RoPE on each head's rope part */
static void mla_qkv(m2d_engine *e, int l, const fwd_ws *w) {
    const m2d_config *c = &e->m->cfg;
    const m2d_backend_ops *B = e->B;
    const layer_weights *lw = &e->lw[l];
    int n = w->n, d = c->hidden_size, H = c->num_attention_heads, hd = c->head_dim, nope = c->qk_nope_head_dim;
    int rope = c->rope_dim, vd = c->v_head_dim, qr = c->q_lora_rank, kr = c->kv_lora_rank, qd = H * hd;
    m2d_mat XN = m2d_mat_of(w->xn, 0, n, d, d), Q = m2d_mat_of(w->q, 0, n, qd, qd);
    if (qr) {
        m2d_mat QA = m2d_mat_of(w->lat, 0, n, qr, qr);
        B->gemm(e->be, &XN, lw->w[M2D_T_Q_A], 0, &QA, 0.0f, e->prec);
        B->rmsnorm(e->be, &QA, lw->w[M2D_T_Q_A_NORM], c->mla_norm_eps, &QA);
        B->gemm(e->be, &QA, lw->w[M2D_T_Q_B], 0, &Q, 0.0f, e->prec);
    } else {
        B->gemm(e->be, &XN, lw->w[M2D_T_Q], 0, &Q, 0.0f, e->prec);
    }
    m2d_mat C = m2d_mat_of(w->lat, 0, n, kr, kr);
    B->gemm(e->be, &XN, lw->w[M2D_T_KV_A], 0, &C, 0.0f, e->prec);
    B->rmsnorm(e->be, &C, lw->w[M2D_T_KV_A_NORM], c->mla_norm_eps, &C);
    for (int h = 0; h < H; h++) { /* kv_b_proj's rows of head h: [k_nope | v]; the shared rotated key */
        size_t o = (size_t)h * hd;
        m2d_mat KN = m2d_mat_of(w->k, o, n, nope, qd), KR = m2d_mat_of(w->k, o + nope, n, rope, qd);
        m2d_mat V = m2d_mat_of(w->v, o, n, vd, qd);
        B->gemm(e->be, &C, lw->w[M2D_T_KV_B], h * (nope + vd), &KN, 0.0f, e->prec);
        B->gemm(e->be, &C, lw->w[M2D_T_KV_B], h * (nope + vd) + nope, &V, 0.0f, e->prec);
        B->gemm(e->be, &XN, lw->w[M2D_T_KV_A], kr, &KR, 0.0f, e->prec);
    }
    /* RoPE of the rope part (the last dims of each head): the heads viewed from column nope on */
    m2d_mat QR = m2d_mat_of(w->q, nope, n, qd - nope, qd), KR = m2d_mat_of(w->k, nope, n, qd - nope, qd);
    B->rope(e->be, &QR, H, hd, w->pos, &e->rope);
    B->rope(e->be, &KR, H, hd, w->pos, &e->rope);
}

/* attention of every segment over its prefix and itself, the KV append, o_proj (+ bias) into the
 * residual stream */
static int attend(m2d_engine *e, int l, const fwd_ws *w, const seg_plan *p) {
    const m2d_config *c = &e->m->cfg;
    const m2d_backend_ops *B = e->B;
    m2d_backend *be = e->be;
    const layer_weights *lw = &e->lw[l];
    int n = w->n, d = c->hidden_size, H = c->num_attention_heads, KV = c->num_key_value_heads, hd = c->head_dim;
    int qd = H * hd, kvd = KV * hd;
    const m2d_kv *pre = p->prefix;
    for (int s = 0; s < p->n_seg; s++) {
        size_t o = (size_t)p->seg_off[s];
        int ns = p->seg_len[s];
        m2d_attn_args a = {.q = m2d_mat_of(w->q, o * qd, ns, qd, qd),
                           .k = m2d_mat_of(w->k, o * kvd, ns, kvd, kvd),
                           .v = m2d_mat_of(w->v, o * kvd, ns, kvd, kvd),
                           .k_cache = pre ? pre->k : NULL,
                           .v_cache = pre ? pre->v : NULL,
                           .cache_off = pre ? (size_t)l * KV * pre->cap * hd : 0,
                           .head_stride = pre ? (size_t)pre->cap * hd : 0,
                           .np = p->np,
                           .n_heads = H,
                           .n_kv = KV,
                           .head_dim = hd,
                           .out = m2d_mat_of(w->att, o * qd, ns, qd, qd),
                           .window = c->layer_window ? c->layer_window[l] : 0,
                           .sinks = lw->w[M2D_T_SINKS],
                           .scale = (float)c->attn_scale,
                           .prec = e->attn_prec};
        B->attention(be, &a);
    }
    if (p->append) {
        m2d_kv *kv = p->append;
        m2d_mat K = m2d_mat_of(w->k, 0, n, kvd, kvd), V = m2d_mat_of(w->v, 0, n, kvd, kvd);
        B->kv_append(be, kv->k, kv->v, (size_t)l * KV * kv->cap * hd, (size_t)kv->cap * hd, kv->len, &K, &V, KV, hd);
    }
    if (e->probe && probe_at(e, l, M2D_PROBE_HEADS, w->att, n, qd)) return -1;
    m2d_mat X = live_rows(w, w->x, d), ATT = live_rows(w, w->att, qd);
    B->gemm(be, &ATT, lw->w[M2D_T_O], 0, &X, 1.0f, e->prec); /* residual add */
    bias(e, &X, lw->w[M2D_T_O_BIAS]);
    return 0;
}

static int attention_block(m2d_engine *e, int l, const fwd_ws *w, const seg_plan *p) {
    const m2d_config *c = &e->m->cfg;
    int n = w->n, d = c->hidden_size;
    m2d_mat X = m2d_mat_of(w->x, 0, n, d, d), XN = m2d_mat_of(w->xn, 0, n, d, d);
    if (e->probe && probe_at(e, l, M2D_PROBE_LAYER_IN, w->x, n, d)) return -1;
    e->B->rmsnorm(e->be, &X, e->lw[l].w[M2D_T_ATTN_NORM], c->rms_norm_eps, &XN);
    if (e->probe && probe_at(e, l, M2D_PROBE_ATTN_NORM, w->xn, n, d)) return -1;
    if (c->ops.attn == M2D_ATTN_MLA) mla_qkv(e, l, w);
    else gqa_qkv(e, l, w);
    return attend(e, l, w, p);
}

/* The experts of LAYER on X -> OUT (routing fields left zero: moe sets them, experts_all has none) */
static m2d_moe_args experts_of(const m2d_engine *e, int layer, m2d_mat x, m2d_mat out) {
    const m2d_config *c = &e->m->cfg;
    const layer_weights *lw = &e->lw[layer];
    return (m2d_moe_args){.x = x,
                          .n_experts = c->num_experts,
                          .d_ff = c->moe_intermediate_size,
                          .gate = lw->x[M2D_X_EXP_GATE],
                          .up = lw->x[M2D_X_EXP_UP],
                          .down = lw->x[M2D_X_EXP_DOWN],
                          .act = c->ops.ffn_act,
                          .prec = e->prec,
                          .out = out,
                          .gate_bias = lw->x[M2D_X_EXP_GATE_BIAS],
                          .up_bias = lw->x[M2D_X_EXP_UP_BIAS],
                          .down_bias = lw->x[M2D_X_EXP_DOWN_BIAS],
                          .act_alpha = c->ops.act_alpha,
                          .act_limit = c->ops.act_limit,
                          .exact_rows = e->hook != NULL}; /* so that a hook may hand outputs back */
}

/* the hook's host copy of x, kept and page-locked across calls: a device copies it down for the
 * hook every MoE layer, and calibration's expert pass up again (4 MB a 512-token block on
 * Qwen3-30B-A3B) */
static float *hook_x_buf(m2d_engine *e, size_t bytes) {
    if (bytes > e->hook_x_cap) {
        m2d_engine_unpin(e, e->hook_x);
        free(e->hook_x);
        e->hook_x = m2d_malloc(bytes);
        e->hook_x_cap = bytes;
        m2d_engine_pin(e, e->hook_x, bytes);
    }
    return e->hook_x;
}

/* The hook's host view of one MoE layer's routing (downloaded only because a hook is set). */
static int call_hook(m2d_engine *e, int layer, const fwd_ws *w, int *routed_set) {
    const m2d_config *c = &e->m->cfg;
    int n = w->n, d = c->hidden_size, E = c->num_experts, k = route_k(e);
    float *x = hook_x_buf(e, f32s(n, d)), *probs = m2d_malloc(f32s(n, E)), *gates = m2d_malloc(f32s(n, k));
    int32_t *topk = m2d_malloc(sizeof(int32_t) * (size_t)n * k);
    e->B->download(e->be, x, w->xn, 0, f32s(n, d));
    e->B->download(e->be, probs, w->probs, 0, f32s(n, E));
    e->B->download(e->be, topk, w->topk, 0, sizeof(int32_t) * (size_t)n * k);
    e->B->download(e->be, gates, w->gates, 0, f32s(n, k));
    *routed_set = 0;
    m2d_moe_args a = experts_of(e, layer, m2d_mat_of(w->xn, 0, n, d, d), m2d_mat_of(w->ffo, 0, n, d, d));
    /* the hook may supply the routed output only where it would be the engine's own bit for bit */
    int exact = e->B->experts_rows_exact && e->B->experts_rows_exact(e->be, &a);
    float *routed = exact ? m2d_malloc(f32s(n, d)) : NULL;
    m2d_moe_event ev = {layer, n, d, E, k, x, probs, topk, gates, routed, exact ? routed_set : NULL};
    m2d_err_clear();
    int rc = 0;
    if (e->hook(e->hook_user, &ev)) { /* keep the hook's own message, if it set one */
        char why[768];
        snprintf(why, sizeof why, "%s", m2d_errmsg());
        rc = why[0] ? m2d_err("engine: MoE hook aborted the forward at layer %d: %s", layer, why)
                    : m2d_err("engine: MoE hook aborted the forward at layer %d", layer);
    }
    if (rc == 0 && *routed_set) e->B->upload(e->be, w->ffo, 0, routed, f32s(n, d));
    free(probs); free(topk); free(gates); free(routed);
    return rc;
}

/* Router, hook, then the routed experts: ffo = sum of gated expert outputs. */
static int moe_block(m2d_engine *e, int l, const fwd_ws *w) {
    const m2d_config *c = &e->m->cfg;
    const layer_weights *lw = &e->lw[l];
    int d = c->hidden_size, E = c->num_experts, k = route_k(e);
    m2d_mat XN = live_rows(w, w->xn, d), P = live_rows(w, w->probs, E); /* topk, gates: P's rows from 0 */
    e->B->gemm(e->be, &XN, lw->w[M2D_T_ROUTER], 0, &P, 0.0f, e->prec);
    bias(e, &P, lw->w[M2D_T_ROUTER_BIAS]);
    /* the Eq. 6 override weights the K' experts by their raw probabilities (never renormalised);
     * for GPT-OSS's router (its gates a softmax over its top-k logits) those are the full softmax
     * over all E logits, whose top K' are the K' largest logits (softmax is monotone) */
    m2d_router_kind kind = c->ops.router;
    if (e->route_topk > 0 && kind == M2D_ROUTER_TOPK_SOFTMAX) kind = M2D_ROUTER_SOFTMAX_TOPK;
    m2d_route_args r = {.kind = kind, .renorm = c->ops.router_renorm && e->route_topk <= 0, .k = k,
                        .n_group = c->n_group, .topk_group = c->topk_group, .scale = (float)c->routed_scaling_factor};
    e->B->route(e->be, &P, &r, w->topk, w->gates);
    int routed_set = 0; /* the hook supplied the routed output (ffo) */
    if (e->hook && call_hook(e, l, w, &routed_set)) return -1;
    if (routed_set) return 0;
    m2d_moe_args a = experts_of(e, l, XN, live_rows(w, w->ffo, d));
    a.topk = w->topk, a.gates = w->gates, a.k = k;
    e->B->moe(e->be, &a);
    return 0;
}

/* dense FFN: y (+)= down(act(gate x + bg, up x + bu)) + bd (biases when the roles are there);
 * g, u scratch [n, inter] */
static int dense_ffn(m2d_engine *e, m2d_weight *const *wt, const m2d_mat *x, int inter, m2d_buf *g, m2d_buf *u,
                     m2d_mat *y, float beta, int probe_layer) {
    const m2d_layer_ops *ops = &e->m->cfg.ops;
    m2d_mat G = m2d_mat_of(g, 0, x->rows, inter, inter), U = m2d_mat_of(u, 0, x->rows, inter, inter);
    e->B->gemm(e->be, x, wt[M2D_T_GATE], 0, &G, 0.0f, e->prec);
    e->B->gemm(e->be, x, wt[M2D_T_UP], 0, &U, 0.0f, e->prec);
    bias(e, &G, wt[M2D_T_GATE_BIAS]);
    bias(e, &U, wt[M2D_T_UP_BIAS]);
    if (ops->ffn_act == M2D_ACT_SWIGLU_CLAMP) e->B->glu_clamp(e->be, &G, &U, ops->act_alpha, ops->act_limit);
    else e->B->glu(e->be, ops->ffn_act, &G, &U);
    if (probe_layer >= 0 && e->probe && probe_at(e, probe_layer, M2D_PROBE_FFN_ACT, g, x->rows, inter)) return -1;
    e->B->gemm(e->be, &G, wt[M2D_T_DOWN], 0, y, beta, e->prec);
    bias(e, y, wt[M2D_T_DOWN_BIAS]);
    return 0;
}

/* The always-on shared experts of an MoE layer: ffo += shared(xn), each token's output times
 * sigmoid(w . xn) when the layer has a shared-expert gate (Qwen2-MoE), unscaled without (DeepSeek) */
static void shared_experts(m2d_engine *e, int l, const fwd_ws *w) {
    const layer_weights *lw = &e->lw[l];
    if (!lw->w[M2D_T_SHARED_GATE]) return;
    const m2d_config *c = &e->m->cfg;
    int d = c->hidden_size, width = c->shared_expert_intermediate_size;
    m2d_weight *wt[M2D_T_COUNT] = {0};
    wt[M2D_T_GATE] = lw->w[M2D_T_SHARED_GATE];
    wt[M2D_T_UP] = lw->w[M2D_T_SHARED_UP];
    wt[M2D_T_DOWN] = lw->w[M2D_T_SHARED_DOWN];
    m2d_mat XN = live_rows(w, w->xn, d), FFO = live_rows(w, w->ffo, d);
    if (!lw->w[M2D_T_SHARED_EXPERT_GATE]) {
        dense_ffn(e, wt, &XN, width, w->g, w->u, &FFO, 1.0f, -1);
        return;
    }
    m2d_mat S = live_rows(w, w->sh, d), G = live_rows(w, w->shl, 1);
    dense_ffn(e, wt, &XN, width, w->g, w->u, &S, 0.0f, -1);
    e->B->gemm(e->be, &XN, lw->w[M2D_T_SHARED_EXPERT_GATE], 0, &G, 0.0f, e->prec);
    e->B->sigmoid_scale(e->be, &S, &G);
    e->B->add(e->be, &FFO, &S);
}

static int ffn_block(m2d_engine *e, int l, const fwd_ws *w) {
    const m2d_config *c = &e->m->cfg;
    int n = w->n, d = c->hidden_size;
    m2d_mat X = live_rows(w, w->x, d), XN = live_rows(w, w->xn, d);
    e->B->rmsnorm(e->be, &X, e->lw[l].w[M2D_T_FFN_NORM], c->rms_norm_eps, &XN);
    if (e->probe && probe_at(e, l, M2D_PROBE_FFN_NORM, w->xn, n, d)) return -1;
    if (!c->layer_is_moe[l]) /* residual add */
        return dense_ffn(e, e->lw[l].w, &XN, c->intermediate_size, w->g, w->u, &X, 1.0f, l);
    if (moe_block(e, l, w)) return -1;
    shared_experts(e, l, w);
    m2d_mat FFO = live_rows(w, w->ffo, d);
    e->B->add(e->be, &X, &FFO);
    return 0;
}

static int check_tokens(const m2d_engine *e, const int32_t *tokens, int n) {
    if (n <= 0) return m2d_err("engine: n = %d tokens (need >= 1)", n);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= e->m->cfg.vocab_size)
            return m2d_err("engine: token %d at index %d out of range [0, %d)", tokens[i], i, e->m->cfg.vocab_size);
    return 0;
}

/* The rows' positions (each segment from the plan's prefix length on) onto W */
static void upload_positions(m2d_engine *e, const seg_plan *p, const fwd_ws *w) {
    int32_t *pos = m2d_malloc(sizeof(int32_t) * (size_t)w->n);
    for (int s = 0; s < p->n_seg; s++)
        for (int i = 0; i < p->seg_len[s]; i++) pos[p->seg_off[s] + i] = p->np + i;
    e->B->upload(e->be, w->pos, 0, pos, sizeof(int32_t) * (size_t)w->n);
    free(pos);
}

/* the embedding of the rows' tokens into w->x */
static void embed_rows(m2d_engine *e, const int32_t *tokens, const fwd_ws *w) {
    int d = e->m->cfg.hidden_size;
    m2d_mat X = m2d_mat_of(w->x, 0, w->n, d, d);
    e->B->upload(e->be, w->tok, 0, tokens, sizeof(int32_t) * (size_t)w->n);
    e->B->embed(e->be, e->embed, w->tok, w->n, &X);
}

/* decoder layer L on w->x in place (nothing when it is the skipped one), its probe and capture */
static int run_layer(m2d_engine *e, int l, const fwd_ws *w, const seg_plan *p) {
    int n = w->n, d = e->m->cfg.hidden_size;
    if (l != e->skip_layer) {
        if (m2d_model_acquire_layer(e->m, l) || attention_block(e, l, w, p) || ffn_block(e, l, w)) return -1;
        if (e->probe && probe_at(e, l, M2D_PROBE_LAYER_OUT, w->x, n, d)) return -1;
    }
    if (p->capture) e->B->download(e->be, p->capture + (size_t)l * n * d, w->x, 0, f32s(n, d));
    return 0;
}

static void final_norm(m2d_engine *e, const fwd_ws *w, m2d_buf *hid) {
    int d = e->m->cfg.hidden_size;
    m2d_mat X = live_rows(w, w->x, d), H = live_rows(w, hid, d);
    e->B->rmsnorm(e->be, &X, e->final_norm, e->m->cfg.rms_norm_eps, &H);
}

/* Whether the last layer may stop after the attention for rows before FIRST (live_rows): nothing
 * reads them (no hook, probe or capture sees the layer's rows, one segment). */
static int last_layer_rows_from(const m2d_engine *e, const seg_plan *p, int first, int n) {
    return first > 0 && first < n && !e->hook && !e->probe && !p->capture && p->n_seg == 1 ? first : 0;
}

/* Final-normed hidden states hid [n, d] (a backend buffer) for the rows of the plan; only rows
 * [first, n) are needed (0: all). */
static int forward_hidden(m2d_engine *e, const int32_t *tokens, int n, const seg_plan *p, int first, m2d_buf *hid) {
    fwd_ws w;
    if (ws_alloc(e, n, &w)) return -1;
    upload_positions(e, p, &w);
    embed_rows(e, tokens, &w);
    int rc = 0, L = e->m->cfg.num_hidden_layers;
    for (int l = 0; l < L && rc == 0; l++) {
        if (l == L - 1) w.r0 = last_layer_rows_from(e, p, first, n);
        rc = run_layer(e, l, &w, p);
    }
    if (rc == 0) final_norm(e, &w, hid);
    ws_free(e, &w);
    return rc;
}

/* ---- LM head ---- */

static int lm_head_logits(m2d_engine *e, m2d_buf *hid, int n, float *logits) {
    int d = e->m->cfg.hidden_size, V = e->m->cfg.vocab_size;
    m2d_buf *chunk = e->B->alloc(e->be, f32s(n, M2D_MIN(LM_CHUNK, V)));
    if (!chunk) return -1;
    m2d_mat H = m2d_mat_of(hid, 0, n, d, d);
    for (int v0 = 0; v0 < V; v0 += LM_CHUNK) {
        int nv = M2D_MIN(LM_CHUNK, V - v0);
        m2d_mat Y = m2d_mat_of(chunk, 0, n, nv, nv);
        e->B->gemm(e->be, &H, e->lm_head, v0, &Y, 0.0f, e->prec);
        e->B->download_mat(e->be, logits + v0, V, &Y);
    }
    e->B->release(e->be, chunk);
    return 0;
}

/* lp[i] = log p(targets[i]) for N rows of hid starting at row FIRST */
static int lm_head_logprobs(m2d_engine *e, m2d_buf *hid, int first, int n, const int32_t *targets, double *lp) {
    int d = e->m->cfg.hidden_size;
    m2d_buf *tg = e->B->alloc(e->be, sizeof(int32_t) * (size_t)n), *out = e->B->alloc(e->be, sizeof(double) * (size_t)n);
    int rc = tg && out ? 0 : -1;
    if (rc == 0) {
        e->B->upload(e->be, tg, 0, targets, sizeof(int32_t) * (size_t)n);
        m2d_mat H = m2d_mat_of(hid, (size_t)first * d, n, d, d);
        e->B->logprobs(e->be, &H, e->lm_head, e->m->cfg.vocab_size, tg, out, e->prec);
        e->B->download(e->be, lp, out, 0, sizeof(double) * (size_t)n);
    }
    e->B->release(e->be, tg);
    e->B->release(e->be, out);
    return rc;
}

static int check_targets(const m2d_engine *e, const int32_t *t, int n) {
    for (int i = 0; i < n; i++)
        if (t[i] < 0 || t[i] >= e->m->cfg.vocab_size)
            return m2d_err("engine: target %d at index %d out of range [0, %d)", t[i], i, e->m->cfg.vocab_size);
    return 0;
}

static int check_window(const m2d_engine *e, int n) {
    if (n > e->m->cfg.max_position_embeddings)
        return m2d_err("engine: window of %d tokens exceeds max_position_embeddings %d", n,
                       e->m->cfg.max_position_embeddings);
    return 0;
}

/* ---- entry points (each bracketed by the backend's enter/leave below) ---- */

static m2d_buf *hidden_buf(m2d_engine *e, int n) { return e->B->alloc(e->be, f32s(n, e->m->cfg.hidden_size)); }

static int logits_impl(m2d_engine *e, const int32_t *tokens, int n, float *logits) {
    if (check_tokens(e, tokens, n) || check_window(e, n)) return -1;
    int off = 0;
    seg_plan p = {1, &off, &n, NULL, 0, NULL, NULL};
    m2d_buf *hid = hidden_buf(e, n);
    int rc = hid ? forward_hidden(e, tokens, n, &p, 0, hid) : -1;
    if (rc == 0) rc = lm_head_logits(e, hid, n, logits);
    e->B->release(e->be, hid);
    return rc;
}

static int hidden_impl(m2d_engine *e, const int32_t *tokens, int n, float *hidden, float *layers) {
    if (check_tokens(e, tokens, n) || check_window(e, n)) return -1;
    int off = 0;
    seg_plan p = {1, &off, &n, NULL, 0, NULL, layers};
    m2d_buf *hid = hidden_buf(e, n);
    int rc = hid ? forward_hidden(e, tokens, n, &p, 0, hid) : -1;
    if (rc == 0) e->B->download(e->be, hidden, hid, 0, f32s(n, e->m->cfg.hidden_size));
    e->B->release(e->be, hid);
    return rc;
}

static int logprobs_impl(m2d_engine *e, const int32_t *tokens, int n, const int32_t *targets, int first, double *lp) {
    if (check_tokens(e, tokens, n) || check_window(e, n)) return -1;
    if (first < 0 || first > n) return m2d_err("engine: logprobs: first = %d outside [0, %d]", first, n);
    if (check_targets(e, targets + first, n - first)) return -1;
    int off = 0;
    seg_plan p = {1, &off, &n, NULL, 0, NULL, NULL};
    m2d_buf *hid = hidden_buf(e, n);
    int rc = hid ? forward_hidden(e, tokens, n, &p, first, hid) : -1;
    if (rc == 0 && first < n) rc = lm_head_logprobs(e, hid, first, n - first, targets + first, lp);
    e->B->release(e->be, hid);
    return rc;
}

/* ---- passes over many windows (m2d_engine_logprobs_windows) ---- */

static int check_set(const m2d_engine *e, const m2d_window_set *s) {
    if (s->n < 0) return m2d_err("engine: %d windows", s->n);
    for (int w = 0; w < s->n; w++) {
        int n = s->lens[w], first = s->first[w];
        if (check_tokens(e, s->tokens[w], n) || check_window(e, n)) return -1;
        if (first < 0 || first > n) return m2d_err("engine: window %d: first = %d outside [0, %d]", w, first, n);
        if (check_targets(e, s->targets[w] + first, n - first)) return -1;
    }
    return 0;
}

/* one segment of N rows from position 0 */
static seg_plan window_plan(const int *zero, const int *n) { return (seg_plan){1, zero, n, NULL, 0, NULL, NULL}; }

typedef struct {
    m2d_engine *e;
    const m2d_window_set *s;
    m2d_actstore *store;
    size_t *row0;     /* [n + 1] each window's first row in the store */
    fwd_ws w;         /* sized for the longest window; w.n set per window */
    float *x;         /* host staging of one window's residual stream */
    m2d_progress *prog;
    double done;
} layer_pass;

/* window W's residual stream from the store onto lp->w (its rows set; every window's positions are
 * 0, 1, ..., uploaded once for the longest, layer_major_group) */
static int pass_load(layer_pass *lp, int w) {
    m2d_engine *e = lp->e;
    size_t n = (size_t)lp->s->lens[w], d = (size_t)e->m->cfg.hidden_size;
    lp->w.n = (int)n;
    if (m2d_actstore_get(lp->store, lp->row0[w], n, lp->x)) return -1;
    e->B->upload(e->be, lp->w.x, 0, lp->x, n * d * sizeof(float));
    return 0;
}

static int pass_save(layer_pass *lp, int w) {
    m2d_engine *e = lp->e;
    size_t n = (size_t)lp->s->lens[w], d = (size_t)e->m->cfg.hidden_size;
    e->B->download(e->be, lp->x, lp->w.x, 0, n * d * sizeof(float));
    return m2d_actstore_put(lp->store, lp->row0[w], n, lp->x);
}

/* every window's embedding into the store */
static int pass_embed(layer_pass *lp) {
    for (int w = 0; w < lp->s->n; w++) {
        lp->w.n = lp->s->lens[w];
        embed_rows(lp->e, lp->s->tokens[w], &lp->w);
        if (pass_save(lp, w)) return -1;
    }
    return 0;
}

typedef struct { const m2d_model *m; int layer; } prefetch_job;
static void *prefetch_main(void *arg) {
    const prefetch_job *j = arg;
    m2d_model_advise_layer(j->m, j->layer, M2D_ST_WILLNEED);
    return NULL;
}

/* decoder layer L over every window; its weights read ahead before, dropped after */
static int pass_layer(layer_pass *lp, int l) {
    const m2d_model *m = lp->e->m;
    /* the next layer's read ahead on its own thread: madvise(WILLNEED) of a GB-sized range waits
     * while the disk's queue is full, which on the calling thread serialised reading and compute
     * (measured on the 61 GB checkpoint, BENCHMARKS.md "A checkpoint of Qwen3-30B-A3B's full shape") */
    prefetch_job job = {m, l + 1};
    pthread_t th;
    int prefetching = l + 1 < m->cfg.num_hidden_layers && pthread_create(&th, NULL, prefetch_main, &job) == 0;
    int zero = 0, rc = 0, last = l == m->cfg.num_hidden_layers - 1;
    for (int w = 0; w < lp->s->n && rc == 0; w++) {
        seg_plan p = window_plan(&zero, &lp->s->lens[w]);
        rc = pass_load(lp, w) ? -1 : 0; /* the rows the last layer finishes: as forward_hidden's */
        lp->w.r0 = last ? last_layer_rows_from(lp->e, &p, lp->s->first[w], lp->s->lens[w]) : 0;
        rc = rc || run_layer(lp->e, l, &lp->w, &p) || pass_save(lp, w) ? -1 : 0;
        lp->done += lp->s->lens[w];
        if (lp->prog) m2d_progress_update(lp->prog, lp->done);
    }
    if (prefetching) pthread_join(th, NULL);
    m2d_model_advise_layer(m, l, M2D_ST_DONTNEED);
    m2d_model_release_layer(m, l); /* deferred values (MXFP4 experts dequantised) given back */
    return rc;
}

/* the final norm and the LM head's log-probs of every window */
static int pass_head(layer_pass *lp) {
    m2d_engine *e = lp->e;
    const m2d_window_set *s = lp->s;
    int rc = 0;
    for (int w = 0; w < s->n && rc == 0; w++) {
        int n = s->lens[w], first = s->first[w], zero = 0;
        m2d_buf *hid = hidden_buf(e, n);
        seg_plan p = window_plan(&zero, &s->lens[w]);
        rc = hid ? pass_load(lp, w) : -1;
        lp->w.r0 = last_layer_rows_from(e, &p, first, n);
        if (rc == 0) final_norm(e, &lp->w, hid);
        if (rc == 0 && first < n) rc = lm_head_logprobs(e, hid, first, n - first, s->targets[w] + first, s->lp[w]);
        e->B->release(e->be, hid);
    }
    return rc;
}

/* Windows S through every layer, layer after layer, their residual streams in a store of at most
 * BUDGET bytes in memory (beyond: the spill file); progress into PROG (may be NULL) from *DONE. */
static int layer_major_group(m2d_engine *e, const m2d_window_set *s, size_t budget, m2d_progress *prog, double *done) {
    int d = e->m->cfg.hidden_size, L = e->m->cfg.num_hidden_layers, max_n = 1;
    layer_pass lp = {.e = e, .s = s, .prog = prog, .done = *done};
    lp.row0 = m2d_malloc(sizeof(size_t) * ((size_t)s->n + 1));
    lp.row0[0] = 0;
    for (int w = 0; w < s->n; w++) {
        lp.row0[w + 1] = lp.row0[w] + (size_t)s->lens[w];
        max_n = M2D_MAX(max_n, s->lens[w]);
    }
    lp.store = m2d_actstore_open(lp.row0[s->n], (size_t)d, budget, e->pass.spill_dir);
    int rc = lp.store && ws_alloc(e, max_n, &lp.w) == 0 ? 0 : -1, zero = 0;
    lp.x = rc == 0 ? m2d_malloc(f32s(max_n, d)) : NULL;
    seg_plan longest = window_plan(&zero, &max_n);
    if (rc == 0) upload_positions(e, &longest, &lp.w);
    if (rc == 0) rc = pass_embed(&lp);
    for (int l = 0; l < L && rc == 0; l++) rc = pass_layer(&lp, l);
    if (rc == 0) rc = pass_head(&lp);
    if (lp.x) ws_free(e, &lp.w);
    free(lp.x);
    free(lp.row0);
    m2d_actstore_free(lp.store);
    *done = lp.done;
    return rc;
}

/* the windows from W0 on whose residual streams fit BUDGET bytes together (at least one) */
static int group_end(const m2d_window_set *s, int w0, size_t row_bytes, size_t budget) {
    size_t used = (size_t)s->lens[w0] * row_bytes;
    int w = w0 + 1;
    while (w < s->n && used + (size_t)s->lens[w] * row_bytes <= budget) used += (size_t)s->lens[w++] * row_bytes;
    return w;
}

/* Residual streams over the budget go either to groups of windows that each fit (each group reads
 * the weights again) or to a spill file for one pass (every layer writes and reads back what
 * exceeds the budget): whichever moves fewer bytes (engine.h m2d_act_mode), unless forced. */
int m2d_engine_layer_major_groups(const m2d_engine *e, const m2d_window_set *s) {
    size_t row_bytes = (size_t)e->m->cfg.hidden_size * sizeof(float), B = e->pass.act_budget, A = 0;
    for (int w = 0; w < s->n; w++) A += (size_t)s->lens[w] * row_bytes;
    int groups = 0;
    for (int w = 0; w < s->n; w = group_end(s, w, row_bytes, B)) groups++;
    if (A <= B || e->pass.act == M2D_ACT_SPILL) return 1;
    if (e->pass.act == M2D_ACT_GROUPS) return groups;
    double reread = (double)(groups - 1) * (double)m2d_engine_weight_bytes(e->m),
           spill = 2.0 * e->m->cfg.num_hidden_layers * (double)(A - B);
    return reread <= spill ? groups : 1;
}

static int layer_major_impl(m2d_engine *e, const m2d_window_set *s, const char *progress) {
    size_t row_bytes = (size_t)e->m->cfg.hidden_size * sizeof(float), rows = 0;
    for (int w = 0; w < s->n; w++) rows += (size_t)s->lens[w];
    m2d_progress prog;
    if (progress) m2d_progress_start(&prog, progress, (double)rows * e->m->cfg.num_hidden_layers);
    double done = 0;
    int rc = 0, grouped = m2d_engine_layer_major_groups(e, s) > 1;
    for (int w0 = 0, w1; w0 < s->n && rc == 0; w0 = w1) {
        w1 = grouped ? group_end(s, w0, row_bytes, e->pass.act_budget) : s->n;
        m2d_window_set g = {w1 - w0, s->tokens + w0, s->lens + w0, s->targets + w0, s->first + w0, s->lp + w0};
        rc = layer_major_group(e, &g, grouped ? SIZE_MAX : e->pass.act_budget, progress ? &prog : NULL, &done);
    }
    if (progress) m2d_progress_end(&prog);
    return rc;
}

static int window_major_impl(m2d_engine *e, const m2d_window_set *s, const char *progress) {
    m2d_progress prog;
    if (progress) m2d_progress_start(&prog, progress, s->n);
    int rc = 0;
    for (int w = 0; w < s->n && rc == 0; w++) {
        rc = logprobs_impl(e, s->tokens[w], s->lens[w], s->targets[w], s->first[w], s->lp[w]);
        if (progress) m2d_progress_update(&prog, w + 1);
    }
    if (progress) m2d_progress_end(&prog);
    return rc;
}

static int expert_impl(m2d_engine *e, int layer, int expert, const float *x, int n, float *out) {
    const m2d_config *c = &e->m->cfg;
    if (layer < 0 || layer >= c->num_hidden_layers || !c->layer_is_moe[layer])
        return m2d_err("engine: layer %d is not an MoE layer", layer);
    if (expert < 0 || expert >= c->num_experts)
        return m2d_err("engine: expert %d out of range [0, %d)", expert, c->num_experts);
    if (n <= 0) return m2d_err("engine: expert: n = %d tokens", n);
    if (m2d_model_acquire_layer(e->m, layer)) return -1;
    int d = c->hidden_size, de = c->moe_intermediate_size;
    const layer_weights *lw = &e->lw[layer];
    m2d_weight *wt[M2D_T_COUNT] = {0};
    wt[M2D_T_GATE] = lw->x[M2D_X_EXP_GATE][expert];
    wt[M2D_T_UP] = lw->x[M2D_X_EXP_UP][expert];
    wt[M2D_T_DOWN] = lw->x[M2D_X_EXP_DOWN][expert];
    if (lw->x[M2D_X_EXP_GATE_BIAS]) wt[M2D_T_GATE_BIAS] = lw->x[M2D_X_EXP_GATE_BIAS][expert];
    if (lw->x[M2D_X_EXP_UP_BIAS]) wt[M2D_T_UP_BIAS] = lw->x[M2D_X_EXP_UP_BIAS][expert];
    if (lw->x[M2D_X_EXP_DOWN_BIAS]) wt[M2D_T_DOWN_BIAS] = lw->x[M2D_X_EXP_DOWN_BIAS][expert];
    m2d_buf *xb = e->B->alloc(e->be, f32s(n, d)), *yb = e->B->alloc(e->be, f32s(n, d));
    m2d_buf *g = e->B->alloc(e->be, f32s(n, de)), *u = e->B->alloc(e->be, f32s(n, de));
    int rc = xb && yb && g && u ? 0 : -1;
    if (rc == 0) {
        e->B->upload(e->be, xb, 0, x, f32s(n, d));
        m2d_mat X = m2d_mat_of(xb, 0, n, d, d), Y = m2d_mat_of(yb, 0, n, d, d);
        dense_ffn(e, wt, &X, de, g, u, &Y, 0.0f, -1);
        e->B->download(e->be, out, yb, 0, f32s(n, d));
    }
    m2d_buf *all[] = {xb, yb, g, u};
    for (int i = 0; i < 4; i++) e->B->release(e->be, all[i]);
    return rc;
}

/* host memory as a backend buffer: a view where the backend has them (no copy), else a copy
 * (COPY_IN: uploaded first); release with host_done */
static m2d_buf *host_buf(m2d_engine *e, void *p, size_t bytes, int copy_in) {
    m2d_buf *b = e->B->host_view ? e->B->host_view(e->be, p, bytes) : NULL;
    if (b) return b;
    b = e->B->alloc(e->be, bytes);
    if (b && copy_in) e->B->upload(e->be, b, 0, p, bytes);
    return b;
}

/* COPY_OUT: download into p first, unless b is a view of it */
static void host_done(m2d_engine *e, m2d_buf *b, void *p, size_t bytes, int copy_out) {
    if (b && copy_out && !e->B->host_view) e->B->download(e->be, p, b, 0, bytes);
    e->B->release(e->be, b);
}

/* calibration's reductions of all_experts' outputs (m2d_engine_all_experts_reduced); sel NULL: none */
typedef struct {
    const int32_t *ids;
    int k1;
    float *sel;
    double *sum_f, *norm2;
} reduce_req;

/* the reductions of F (on the backend, [n, E * d]) into the request's host arrays: launched, then
 * (after the Gram is: a device may copy the selected rows while the Gram runs) brought back */
typedef struct {
    m2d_buf *I, *S, *SF, *N2;
    size_t ib, sb, fb, nb;
    int rc;
} reduce_bufs;

static reduce_bufs reduce_launch(m2d_engine *e, const m2d_mat *F, int E, const reduce_req *rq) {
    int n = F->rows, d = F->cols / E;
    reduce_bufs b = {NULL, NULL, NULL, NULL, sizeof(int32_t) * (size_t)n * rq->k1, f32s(n, (int64_t)rq->k1 * d),
                     sizeof(double) * (size_t)E * d, sizeof(double) * (size_t)E * n, 0};
    b.I = host_buf(e, (void *)rq->ids, b.ib, 1), b.S = host_buf(e, rq->sel, b.sb, 0);
    b.SF = host_buf(e, rq->sum_f, b.fb, 1), b.N2 = host_buf(e, rq->norm2, b.nb, 0);
    b.rc = b.I && b.S && b.SF && b.N2 ? 0 : -1;
    if (b.rc == 0) e->B->experts_reduce(e->be, F, E, b.I, rq->k1, b.S, b.SF, b.N2);
    return b;
}

static int reduce_finish(m2d_engine *e, const reduce_req *rq, reduce_bufs *b) {
    host_done(e, b->I, (void *)rq->ids, b->ib, 0);
    host_done(e, b->S, rq->sel, b->sb, b->rc == 0);
    host_done(e, b->SF, rq->sum_f, b->fb, b->rc == 0);
    host_done(e, b->N2, rq->norm2, b->nb, b->rc == 0);
    return b->rc;
}

static int all_experts_impl(m2d_engine *e, int layer, const float *x, int n, float *f, double *gram,
                            const reduce_req *rq) {
    const m2d_config *c = &e->m->cfg;
    if (layer < 0 || layer >= c->num_hidden_layers || !c->layer_is_moe[layer])
        return m2d_err("engine: layer %d is not an MoE layer", layer);
    if (n <= 0) return m2d_err("engine: all experts: n = %d tokens", n);
    if (rq && (rq->k1 <= 0 || !rq->ids || !rq->sel || !rq->sum_f || !rq->norm2))
        return m2d_err("engine: all experts reduced: k1 = %d or an output missing", rq->k1);
    for (size_t i = 0; rq && i < (size_t)n * rq->k1; i++)
        if (rq->ids[i] < -1 || rq->ids[i] >= c->num_experts)
            return m2d_err("engine: all experts reduced: expert id %d (token %zu) outside [-1, %d)", rq->ids[i],
                           i / (size_t)rq->k1, c->num_experts);
    if (m2d_model_acquire_layer(e->m, layer)) return -1;
    uint64_t need = M2D_CAP(M2D_CAP_EXPERTS_ALL) | (gram ? M2D_CAP(M2D_CAP_GRAM) : 0) |
                    (rq ? M2D_CAP(M2D_CAP_EXPERTS_REDUCE) : 0);
    int miss = m2d_backend_missing(e->be, need);
    if (miss >= 0)
        return m2d_err("engine: calibration needs '%s', which backend %s does not implement", m2d_cap_name((m2d_cap)miss),
                       e->B->name);
    int d = c->hidden_size, E = c->num_experts;
    size_t xb = f32s(n, d), fb = f32s(n, (int64_t)E * d), gb = sizeof(double) * (size_t)E * E;
    /* without F on the host (reduced, no WORK): the backend's own buffer */
    m2d_buf *X = host_buf(e, (void *)x, xb, 1), *Fb = f ? host_buf(e, f, fb, 0) : e->B->alloc(e->be, fb);
    m2d_buf *G = gram ? host_buf(e, gram, gb, 1) : NULL;
    int rc = X && Fb && (G || !gram) ? 0 : -1;
    if (rc == 0) {
        m2d_moe_args a = experts_of(e, layer, m2d_mat_of(X, 0, n, d, d), m2d_mat_of(Fb, 0, n, E * d, E * d));
        a.exact_rows = 1; /* the outputs a hook hands back as the routed output (call_hook) */
        e->B->experts_all(e->be, &a);
        reduce_bufs rb = {0};
        if (rq) rb = reduce_launch(e, &a.out, E, rq);
        if (G) e->B->gram(e->be, &a.out, E, G, e->prec);
        if (rq) rc = reduce_finish(e, rq, &rb);
    }
    host_done(e, X, (void *)x, xb, 0);
    if (f) host_done(e, Fb, f, fb, rc == 0 && !rq); /* reduced: the outputs stay where they are */
    else e->B->release(e->be, Fb);
    if (G) host_done(e, G, gram, gb, rc == 0);
    return rc;
}

/* ---- KV cache ---- */
m2d_kv *m2d_kv_new(m2d_engine *e, int capacity) {
    const m2d_config *c = &e->m->cfg;
    if (capacity <= 0 || capacity > c->max_position_embeddings) {
        m2d_err("engine: kv capacity %d outside [1, max_position_embeddings = %d]", capacity,
                c->max_position_embeddings);
        return NULL;
    }
    m2d_kv *kv = m2d_calloc(1, sizeof *kv);
    kv->e = e;
    kv->cap = capacity;
    kv->n_layers = c->num_hidden_layers;
    kv->n_kv = c->num_key_value_heads;
    kv->hd = c->head_dim;
    size_t bytes = (size_t)kv->n_layers * kv->n_kv * capacity * kv->hd * sizeof(float);
    kv->k = e->B->alloc(e->be, bytes);
    kv->v = e->B->alloc(e->be, bytes);
    if (!kv->k || !kv->v) {
        m2d_kv_free(kv);
        return NULL;
    }
    return kv;
}

int m2d_kv_len(const m2d_kv *kv) { return kv->len; }

void m2d_kv_truncate(m2d_kv *kv, int len) {
    if (len >= 0 && len < kv->len) kv->len = len;
}

void m2d_kv_free(m2d_kv *kv) {
    if (!kv) return;
    kv->e->B->release(kv->e->be, kv->k);
    kv->e->B->release(kv->e->be, kv->v);
    free(kv);
}

static int extend_impl(m2d_engine *e, m2d_kv *kv, const int32_t *tokens, int n, const int32_t *targets, double *lp) {
    if (kv->e != e) return m2d_err("engine: extend: KV cache belongs to another engine");
    if (check_tokens(e, tokens, n)) return -1;
    if (kv->len + n > kv->cap)
        return m2d_err("engine: extend: %d cached + %d new tokens exceed the KV capacity %d", kv->len, n, kv->cap);
    if (lp && check_targets(e, targets, n)) return -1;
    int off = 0;
    seg_plan p = {1, &off, &n, kv->len ? kv : NULL, kv->len, kv, NULL};
    m2d_buf *hid = hidden_buf(e, n);
    int rc = hid ? forward_hidden(e, tokens, n, &p, 0, hid) : -1;
    if (rc == 0) {
        kv->len += n;
        if (lp) rc = lm_head_logprobs(e, hid, 0, n, targets, lp);
    }
    e->B->release(e->be, hid);
    return rc;
}

static int branches_check(const m2d_engine *e, const m2d_kv *prefix, int nb, const int32_t *const *tokens,
                          const int *lens, const int32_t *const *targets, double *const *lp, int *total) {
    if (prefix && prefix->e != e) return m2d_err("engine: branches: KV cache belongs to another engine");
    if (nb <= 0) return m2d_err("engine: branches: n_branches = %d", nb);
    int maxlen = 0;
    *total = 0;
    for (int b = 0; b < nb; b++) {
        if (lens[b] <= 0) return m2d_err("engine: branches: branch %d has %d tokens", b, lens[b]);
        if (check_tokens(e, tokens[b], lens[b])) return -1;
        if (lp && lp[b] && check_targets(e, targets[b], lens[b])) return -1;
        *total += lens[b];
        maxlen = M2D_MAX(maxlen, lens[b]);
    }
    return check_window(e, (prefix ? prefix->len : 0) + maxlen);
}

static int branches_impl(m2d_engine *e, const m2d_kv *prefix, int n_branches, const int32_t *const *tokens,
                         const int *lens, const int32_t *const *targets, double *const *lp) {
    int total = 0, np = prefix ? prefix->len : 0;
    if (branches_check(e, prefix, n_branches, tokens, lens, targets, lp, &total)) return -1;
    int *off = m2d_malloc(sizeof(int) * (size_t)n_branches);
    int32_t *all = m2d_malloc(sizeof(int32_t) * (size_t)total), *alltg = m2d_malloc(sizeof(int32_t) * (size_t)total);
    for (int b = 0, o = 0; b < n_branches; o += lens[b], b++) {
        off[b] = o;
        memcpy(all + o, tokens[b], sizeof(int32_t) * lens[b]);
        if (lp && lp[b]) memcpy(alltg + o, targets[b], sizeof(int32_t) * lens[b]);
        else memset(alltg + o, 0, sizeof(int32_t) * lens[b]);
    }
    seg_plan p = {n_branches, off, lens, np ? prefix : NULL, np, NULL, NULL};
    m2d_buf *hid = hidden_buf(e, total);
    int rc = hid ? forward_hidden(e, all, total, &p, 0, hid) : -1;
    if (rc == 0 && lp) {
        double *tmp = m2d_malloc(sizeof(double) * (size_t)total);
        rc = lm_head_logprobs(e, hid, 0, total, alltg, tmp);
        for (int b = 0; b < n_branches && rc == 0; b++)
            if (lp[b]) memcpy(lp[b], tmp + off[b], sizeof(double) * lens[b]);
        free(tmp);
    }
    e->B->release(e->be, hid);
    free(off); free(all); free(alltg);
    return rc;
}

/* ---- public compute entry points: bracketed by the backend (errors from either side) ---- */
static int leave(m2d_engine *e, int rc) {
    int lrc = e->B->leave(e->be);
    return rc ? rc : lrc;
}

int m2d_engine_expert(m2d_engine *e, int layer, int expert, const float *x, int n, float *out) {
    e->B->enter(e->be);
    return leave(e, expert_impl(e, layer, expert, x, n, out));
}

int m2d_engine_all_experts(m2d_engine *e, int layer, const float *x, int n, float *f, double *gram) {
    if (!f) return m2d_err("engine: all experts: no output array");
    e->B->enter(e->be);
    return leave(e, all_experts_impl(e, layer, x, n, f, gram, NULL));
}

int m2d_engine_all_experts_reduced(m2d_engine *e, int layer, const float *x, int n, const int32_t *ids, int k1,
                                   float *sel, double *sum_f, double *norm2, double *gram, float *work) {
    reduce_req rq = {ids, k1, sel, sum_f, norm2};
    e->B->enter(e->be);
    return leave(e, all_experts_impl(e, layer, x, n, work, gram, &rq));
}

void m2d_engine_pin(m2d_engine *e, void *p, size_t bytes) {
    if (e->B->pin && p && bytes) e->B->pin(e->be, p, bytes);
}

void m2d_engine_unpin(m2d_engine *e, void *p) {
    if (e->B->unpin && p) e->B->unpin(e->be, p);
}

int m2d_engine_logits(m2d_engine *e, const int32_t *tokens, int n, float *logits) {
    e->B->enter(e->be);
    return leave(e, logits_impl(e, tokens, n, logits));
}

int m2d_engine_hidden(m2d_engine *e, const int32_t *tokens, int n, float *hidden, float *layers) {
    e->B->enter(e->be);
    return leave(e, hidden_impl(e, tokens, n, hidden, layers));
}

int m2d_engine_set_route_topk(m2d_engine *e, int k) {
    const m2d_config *c = &e->m->cfg;
    if (k < 0 || (k > 0 && (c->num_experts <= 0 || k > c->num_experts)))
        return m2d_err("engine: routing override top-%d outside [1, num_experts = %d]", k, c->num_experts);
    e->route_topk = k;
    return 0;
}

int m2d_engine_logprobs(m2d_engine *e, const int32_t *tokens, int n, const int32_t *targets, int first, double *lp) {
    e->B->enter(e->be);
    return leave(e, logprobs_impl(e, tokens, n, targets, first, lp));
}

int m2d_engine_extend(m2d_engine *e, m2d_kv *kv, const int32_t *tokens, int n, const int32_t *targets, double *lp) {
    e->B->enter(e->be);
    return leave(e, extend_impl(e, kv, tokens, n, targets, lp));
}

int m2d_engine_branches(m2d_engine *e, const m2d_kv *prefix, int n_branches, const int32_t *const *tokens,
                        const int *lens, const int32_t *const *targets, double *const *lp) {
    e->B->enter(e->be);
    return leave(e, branches_impl(e, prefix, n_branches, tokens, lens, targets, lp));
}

int m2d_engine_logprobs_windows(m2d_engine *e, const m2d_window_set *s, const char *progress) {
    if (check_set(e, s)) return -1;
    e->B->enter(e->be);
    return leave(e, e->pass.layer_major ? layer_major_impl(e, s, progress) : window_major_impl(e, s, progress));
}

const m2d_pass_opts *m2d_engine_pass(const m2d_engine *e) { return &e->pass; }

void m2d_window_arrays_init(m2d_window_arrays *a, int n) {
    size_t k = (size_t)n + 1; /* never a zero-sized allocation */
    a->tokens = m2d_calloc(k, sizeof *a->tokens), a->targets = m2d_calloc(k, sizeof *a->targets);
    a->lens = m2d_calloc(k, sizeof(int)), a->first = m2d_calloc(k, sizeof(int));
    a->lp = m2d_calloc(k, sizeof *a->lp);
    a->set = (m2d_window_set){n, a->tokens, a->lens, a->targets, a->first, a->lp};
}

void m2d_window_arrays_free(m2d_window_arrays *a) {
    for (int w = 0; w < a->set.n; w++) free(a->lp[w]);
    free(a->tokens), free(a->targets), free(a->lens), free(a->first), free(a->lp);
}

size_t m2d_engine_weight_bytes(const m2d_model *m) {
    size_t b = m->embed->nbytes + m->final_norm->nbytes + (m->lm_head != m->embed ? m->lm_head->nbytes : 0);
    for (int l = 0; l < m->cfg.num_hidden_layers; l++) b += m2d_model_layer_bytes(m, l);
    return b;
}

m2d_pass_opts m2d_engine_plan_pass(const m2d_model *m, size_t mem_budget, m2d_pass_mode mode) {
    m2d_pass_opts o = {0};
    o.layer_major = mode == M2D_PASS_AUTO ? m2d_engine_weight_bytes(m) > mem_budget : mode == M2D_PASS_LAYER;
    size_t held = 0; /* the largest layer, beside the LM head */
    for (int l = 0; l < m->cfg.num_hidden_layers; l++) held = M2D_MAX(held, m2d_model_layer_bytes(m, l));
    held += m->lm_head->nbytes;
    o.act_budget = mem_budget > held ? mem_budget - held : 0;
    return o;
}

int m2d_pass_mode_parse(const char *what, const char *s, m2d_pass_mode *mode) {
    static const char *const names[] = {"auto", "window", "layer"};
    for (int i = 0; i < 3; i++)
        if (!strcmp(s, names[i])) {
            *mode = (m2d_pass_mode)i;
            return 0;
        }
    return m2d_err("%s: '%s' is not a pass (auto, window or layer)", what, s);
}
