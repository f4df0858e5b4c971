/* engine — batched forward of Qwen3 / Qwen3-MoE on the backend interface.
 *
 * Weights stay in their stored dtype (memory-mapped or in memory). A GEMM needs fp32, so each
 * weight matrix is converted right before use into a reusable per-engine buffer; tensors that
 * are already F32 are used in place. Optionally (m2d_engine_cache_weights) tensors are
 * converted once and kept, up to a byte budget. Chosen by measurement (bench/bench_engine.c,
 * numbers in BENCHMARKS.md): on-use conversion is one vectorised pass over the weight bytes per
 * forward, ~5% (dense) to ~10% (MoE, ~32 rows per expert) of a 512-token forward in perf, while
 * a full fp32 copy doubles the resident weights (Qwen3-30B-A3B: 122 GB) and was not faster on
 * the 30B-shaped slices: streaming 2x the bytes from DRAM costs about what converting saves.
 * Memory with on-use conversion: the mapped checkpoint + 3 buffers of the largest matrix (+ per
 * worker 3 expert matrices in the expert-parallel MoE path).
 *
 * One core (forward_hidden) serves every entry point: a batch of rows split into "segments";
 * each segment attends to an optional cached prefix and causally to itself. A full window is
 * one segment with no prefix; extend is one segment over the KV cache (and appends to it);
 * branches are several segments over the same cached prefix, all in one batch. */
#include "engine/engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/backend.h"
#include "base/util.h"

#define WBUF_SLOTS 3
#define LM_CHUNK 4096 /* vocab rows of the LM head converted and multiplied at a time */

typedef struct {
    const m2d_tensor *t;
    float *f32;
} wcache_entry;

struct m2d_engine {
    const m2d_model *m;
    int n_threads;
    m2d_moe_hook hook;
    void *hook_user;
    float *wbuf[WBUF_SLOTS];
    size_t wcap[WBUF_SLOTS];
    int expert_parallel; /* MoE experts spread over our threads (1) or one after another (0) */
    wcache_entry *cache; /* open addressing on the tensor pointer */
    int cache_cap;
    size_t cache_bytes;
};

struct m2d_kv {
    const m2d_engine *e;
    int cap, len, n_layers, n_kv, hd;
    float **k, **v; /* [layer] -> [n_kv][cap][hd] */
};

/* ---- weights ---- */
static size_t ptr_hash(const void *p) { return ((uintptr_t)p >> 4) * 0x9E3779B97F4A7C15ull; }

static float *cache_lookup(const m2d_engine *e, const m2d_tensor *t) {
    if (!e->cache) return NULL;
    for (size_t i = ptr_hash(t) % (size_t)e->cache_cap;; i = (i + 1) % (size_t)e->cache_cap) {
        if (!e->cache[i].t) return NULL;
        if (e->cache[i].t == t) return e->cache[i].f32;
    }
}

/* fp32 view of the elements [first, first+n) of t: in place for F32, else the cache or
 * a conversion into buffer SLOT (valid until the next use of that slot). */
static const float *weight_rows(m2d_engine *e, const m2d_tensor *t, int64_t first, int64_t n, int slot) {
    if (t->dtype == M2D_F32 && ((uintptr_t)t->data & 3) == 0) return (const float *)t->data + first;
    const float *c = cache_lookup(e, t);
    if (c) return c + first;
    if ((size_t)n > e->wcap[slot]) {
        free(e->wbuf[slot]);
        e->wbuf[slot] = m2d_malloc((size_t)n * sizeof(float));
        e->wcap[slot] = (size_t)n;
    }
    m2d_be_convert(t->dtype, t->data, first, n, e->wbuf[slot]);
    return e->wbuf[slot];
}

static const float *weight(m2d_engine *e, const m2d_tensor *t, int slot) {
    return weight_rows(e, t, 0, m2d_tensor_numel(t), slot);
}

static void cache_insert(m2d_engine *e, const m2d_tensor *t, size_t budget) {
    if (!t || t->dtype == M2D_F32 || cache_lookup(e, t)) return;
    size_t bytes = (size_t)m2d_tensor_numel(t) * sizeof(float);
    if (e->cache_bytes + bytes > budget) return;
    float *f = m2d_malloc(bytes);
    m2d_be_convert(t->dtype, t->data, 0, m2d_tensor_numel(t), f);
    size_t i = ptr_hash(t) % (size_t)e->cache_cap;
    while (e->cache[i].t) i = (i + 1) % (size_t)e->cache_cap;
    e->cache[i].t = t;
    e->cache[i].f32 = f;
    e->cache_bytes += bytes;
}

size_t m2d_engine_cache_weights(m2d_engine *e, size_t budget_bytes) {
    const m2d_model *m = e->m;
    const m2d_config *c = &m->cfg;
    if (!e->cache) {
        int n = 8 + c->num_hidden_layers * (12 + 3 * (c->num_experts > 0 ? c->num_experts : 0));
        e->cache_cap = 2 * n + 1;
        e->cache = m2d_calloc((size_t)e->cache_cap, sizeof(wcache_entry));
    }
    /* small and hot first: norms, attention, router, dense FFN, then experts, LM head last */
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const m2d_layer *L = &m->layers[l];
        const m2d_tensor *ts[] = {L->attn_norm, L->ffn_norm, L->q_norm, L->k_norm, L->q_proj, L->k_proj,
                                  L->v_proj, L->o_proj, L->router, L->gate_proj, L->up_proj, L->down_proj};
        for (size_t i = 0; i < M2D_ARRAY_LEN(ts); i++) cache_insert(e, ts[i], budget_bytes);
    }
    cache_insert(e, m->final_norm, budget_bytes);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const m2d_layer *L = &m->layers[l];
        if (!c->layer_is_moe[l] || !L->exp_gate) continue;
        for (int x = 0; x < c->num_experts; x++) {
            cache_insert(e, L->exp_gate[x], budget_bytes);
            cache_insert(e, L->exp_up[x], budget_bytes);
            cache_insert(e, L->exp_down[x], budget_bytes);
        }
    }
    cache_insert(e, m->lm_head, budget_bytes);
    return e->cache_bytes;
}

/* bytes of an fp32 copy of every tensor that is not already F32 */
static size_t fp32_copy_bytes(const m2d_model *m) {
    const m2d_config *c = &m->cfg;
    size_t b = 0;
#define ADDT(t) do { if ((t) && (t)->dtype != M2D_F32) b += (size_t)m2d_tensor_numel(t) * sizeof(float); } while (0)
    ADDT(m->final_norm);
    if (m->lm_head != m->embed) ADDT(m->lm_head);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const m2d_layer *L = &m->layers[l];
        const m2d_tensor *ts[] = {L->attn_norm, L->ffn_norm, L->q_norm, L->k_norm, L->q_proj, L->k_proj,
                                  L->v_proj, L->o_proj, L->router, L->gate_proj, L->up_proj, L->down_proj};
        for (size_t i = 0; i < M2D_ARRAY_LEN(ts); i++) ADDT(ts[i]);
        if (c->layer_is_moe[l] && L->exp_gate)
            for (int x = 0; x < c->num_experts; x++) {
                ADDT(L->exp_gate[x]);
                ADDT(L->exp_up[x]);
                ADDT(L->exp_down[x]);
            }
    }
#undef ADDT
    return b;
}

/* ---- lifecycle ---- */
int m2d_engine_new(const m2d_model *m, int n_threads, m2d_engine **out) {
    *out = NULL;
    if (!m || !m->layers || !m->embed || !m->lm_head || !m->final_norm)
        return m2d_err("engine: model is not bound (missing embed/lm_head/final_norm/layers)");
    const m2d_config *c = &m->cfg;
    if (c->hidden_size <= 0 || c->num_attention_heads <= 0 || c->num_key_value_heads <= 0 ||
        c->head_dim <= 0 || c->head_dim % 2 || c->num_attention_heads % c->num_key_value_heads ||
        c->vocab_size <= 0 || c->num_hidden_layers <= 0)
        return m2d_err("%s: config: inconsistent attention shape (heads %d, kv heads %d, head_dim %d)",
                       m->dir ? m->dir : "model", c->num_attention_heads, c->num_key_value_heads, c->head_dim);
    if (c->head_dim > 1024) return m2d_err("%s: field 'head_dim': %d > 1024 unsupported", m->dir, c->head_dim);
    m2d_engine *e = m2d_calloc(1, sizeof *e);
    e->m = m;
    e->n_threads = n_threads > 0 ? n_threads : m2d_default_threads();
    e->expert_parallel = 1;
    m2d_be_set_threads(e->n_threads);
    /* weight policy: $M2D_WEIGHT_CACHE_MB if set (0 = convert on use); else keep an fp32 copy
     * only when the whole model's copy is small (<= 1/8 of RAM): +10..30% speed measured,
     * while big checkpoints stay mmapped in their stored dtype */
    const char *env = getenv("M2D_WEIGHT_CACHE_MB");
    if (env) {
        if (atol(env) > 0) m2d_engine_cache_weights(e, (size_t)atol(env) << 20);
    } else {
        size_t need = fp32_copy_bytes(m);
        long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        if (need > 0 && pages > 0 && psz > 0 && need <= (size_t)pages * (size_t)psz / 8)
            m2d_engine_cache_weights(e, need);
    }
    *out = e;
    return 0;
}

void m2d_engine_free(m2d_engine *e) {
    if (!e) return;
    for (int i = 0; i < WBUF_SLOTS; i++) free(e->wbuf[i]);
    if (e->cache)
        for (int i = 0; i < e->cache_cap; i++) free(e->cache[i].f32);
    free(e->cache);
    free(e);
}

const m2d_model *m2d_engine_model(const m2d_engine *e) { return e->m; }

void m2d_engine_set_expert_parallel(m2d_engine *e, int on) { e->expert_parallel = on; }

void m2d_engine_set_moe_hook(m2d_engine *e, m2d_moe_hook hook, void *user) {
    e->hook = hook;
    e->hook_user = user;
}

/* ---- FFN ---- */
/* SwiGLU block on rows x [n, d]: out = down(silu(gate x) * up x); g, u scratch [n, inter]. */
static void swiglu_ffn(m2d_engine *e, const m2d_tensor *gate, const m2d_tensor *up, const m2d_tensor *down,
                       const float *x, int n, int d, int inter, float *g, float *u, float *out, float beta) {
    m2d_be_matmul_wt(x, d, n, d, weight(e, gate, 0), d, inter, g, inter, 0.0f);
    m2d_be_matmul_wt(x, d, n, d, weight(e, up, 1), d, inter, u, inter, 0.0f);
    m2d_be_swiglu(g, u, (int64_t)n * inter, g);
    m2d_be_matmul_wt(g, inter, n, inter, weight(e, down, 2), inter, d, out, d, beta);
}

static int expert_impl(m2d_engine *e, int layer, int expert, const float *x, int n, float *out) {
    const m2d_config *c = &e->m->cfg;
    if (layer < 0 || layer >= c->num_hidden_layers || !c->layer_is_moe[layer])
        return m2d_err("engine: layer %d is not an MoE layer", layer);
    if (expert < 0 || expert >= c->num_experts)
        return m2d_err("engine: expert %d out of range [0, %d)", expert, c->num_experts);
    if (n <= 0) return m2d_err("engine: expert: n = %d tokens", n);
    const m2d_layer *L = &e->m->layers[layer];
    int d = c->hidden_size, de = c->moe_intermediate_size;
    float *g = m2d_malloc(sizeof(float) * (size_t)n * de), *u = m2d_malloc(sizeof(float) * (size_t)n * de);
    swiglu_ffn(e, L->exp_gate[expert], L->exp_up[expert], L->exp_down[expert], x, n, d, de, g, u, out, 0.0f);
    free(g);
    free(u);
    return 0;
}

/* fp32 view of a whole tensor for a parallel worker: in place, cached, or converted into BUF
 * (single-threaded: the workers are the parallelism). */
static const float *weight_1t(const m2d_engine *e, const m2d_tensor *t, float *buf) {
    if (t->dtype == M2D_F32 && ((uintptr_t)t->data & 3) == 0) return t->data;
    const float *c = cache_lookup(e, t);
    if (c) return c;
    m2d_be_convert_1t(t->dtype, t->data, 0, m2d_tensor_numel(t), buf);
    return buf;
}

/* Expert-parallel MoE: each worker takes whole experts (gather, convert, three single-threaded
 * sgemms) and writes the outputs to Y in bucket order; the caller scatter-adds afterwards in
 * expert order, so the result does not depend on the thread count or the schedule. With ~n·k/E
 * rows per expert (32 for 512 tokens on Qwen3-30B-A3B) the GEMMs are too small to split well
 * across OpenBLAS threads; whole experts per thread avoid that synchronisation. */
typedef struct {
    const m2d_engine *e;
    const m2d_layer *L;
    const float *x;
    const int *count, *pair, *active;
    int k, d, de;
    float *Y;
    float **xs, **g, **u, **w0, **w1, **w2; /* per worker */
} moe_job;

static void moe_item(void *ctx, int item) {
    const moe_job *j = ctx;
    int w = m2d_be_worker(), ex = j->active[item], d = j->d, de = j->de;
    int m0 = j->count[ex], mn = j->count[ex + 1] - m0;
    float *xs = j->xs[w], *g = j->g[w], *u = j->u[w];
    for (int r = 0; r < mn; r++) memcpy(xs + (size_t)r * d, j->x + (size_t)(j->pair[m0 + r] / j->k) * d, sizeof(float) * d);
    m2d_be_matmul_wt(xs, d, mn, d, weight_1t(j->e, j->L->exp_gate[ex], j->w0[w]), d, de, g, de, 0.0f);
    m2d_be_matmul_wt(xs, d, mn, d, weight_1t(j->e, j->L->exp_up[ex], j->w1[w]), d, de, u, de, 0.0f);
    m2d_be_swiglu(g, u, (int64_t)mn * de, g);
    m2d_be_matmul_wt(g, de, mn, de, weight_1t(j->e, j->L->exp_down[ex], j->w2[w]), de, d, j->Y + (size_t)m0 * d, d, 0.0f);
}

static void experts_parallel(m2d_engine *e, const m2d_layer *L, const float *x, int k, int d, int de, int E,
                             const int *count, const int *pair, int maxm, float *Y) {
    int nt = m2d_be_threads(), na = 0;
    int *active = m2d_malloc(sizeof(int) * (size_t)E);
    for (int ex = 0; ex < E; ex++)
        if (count[ex + 1] > count[ex]) active[na++] = ex;
    moe_job j = {e, L, x, count, pair, active, k, d, de, Y, NULL, NULL, NULL, NULL, NULL, NULL};
    float **bufs = m2d_calloc((size_t)nt * 6, sizeof(float *));
    j.xs = bufs; j.g = bufs + nt; j.u = bufs + 2 * nt; j.w0 = bufs + 3 * nt; j.w1 = bufs + 4 * nt; j.w2 = bufs + 5 * nt;
    for (int t = 0; t < nt; t++) {
        j.xs[t] = m2d_malloc(sizeof(float) * (size_t)maxm * d);
        j.g[t] = m2d_malloc(sizeof(float) * (size_t)maxm * de);
        j.u[t] = m2d_malloc(sizeof(float) * (size_t)maxm * de);
        for (int s = 0; s < 3; s++) j.w0[t + s * nt] = m2d_malloc(sizeof(float) * (size_t)de * d);
    }
    m2d_be_parallel_for(na, moe_item, &j); /* GEMMs inside an item run on that worker alone */
    for (int t = 0; t < 6 * nt; t++) free(bufs[t]);
    free(bufs);
    free(active);
}

/* Router, hook, then each routed expert on the rows sent to it (gather -> GEMMs -> scatter-add
 * with the gate weight). out [n, d] is overwritten. */
static int moe_ffn(m2d_engine *e, int layer, const float *x, int n, float *out) {
    const m2d_config *c = &e->m->cfg;
    const m2d_layer *L = &e->m->layers[layer];
    int d = c->hidden_size, E = c->num_experts, k = c->num_experts_per_tok, de = c->moe_intermediate_size;
    float *probs = m2d_malloc(sizeof(float) * (size_t)n * E);
    int32_t *topk = m2d_malloc(sizeof(int32_t) * (size_t)n * k);
    float *gates = m2d_malloc(sizeof(float) * (size_t)n * k);
    m2d_be_matmul_wt(x, d, n, d, weight(e, L->router, 0), d, E, probs, E, 0.0f);
    for (int t = 0; t < n; t++) {
        float *p = probs + (size_t)t * E;
        m2d_be_softmax(p, E);
        m2d_be_topk(p, E, k, topk + (size_t)t * k);
        double s = 0;
        for (int j = 0; j < k; j++) s += p[topk[(size_t)t * k + j]];
        for (int j = 0; j < k; j++) {
            float pj = p[topk[(size_t)t * k + j]];
            gates[(size_t)t * k + j] = c->norm_topk_prob ? (float)(pj / s) : pj;
        }
    }
    int rc = 0;
    if (e->hook) {
        m2d_moe_event ev = {layer, n, d, E, k, x, probs, topk, gates};
        m2d_err_clear();
        if (e->hook(e->hook_user, &ev)) { /* keep the hook's own message, if it set one */
            char why[768];
            snprintf(why, sizeof why, "%s", m2d_errmsg());
            rc = why[0] ? m2d_err("engine: MoE hook aborted the forward at layer %d: %s", layer, why)
                        : m2d_err("engine: MoE hook aborted the forward at layer %d", layer);
        }
    }
    if (rc == 0) {
        /* bucket the (token, slot) pairs by expert, in token order within an expert */
        int *count = m2d_calloc((size_t)E + 1, sizeof(int));
        for (int i = 0; i < n * k; i++) count[topk[i] + 1]++;
        for (int x2 = 0; x2 < E; x2++) count[x2 + 1] += count[x2];
        int *fill = m2d_malloc(sizeof(int) * (size_t)E), *pair = m2d_malloc(sizeof(int) * (size_t)n * k);
        memcpy(fill, count, sizeof(int) * (size_t)E);
        for (int i = 0; i < n * k; i++) pair[fill[topk[i]]++] = i;
        int maxm = 0;
        for (int x2 = 0; x2 < E; x2++) maxm = M2D_MAX(maxm, count[x2 + 1] - count[x2]);
        memset(out, 0, sizeof(float) * (size_t)n * d);
        if (e->expert_parallel && m2d_be_threads() > 1) {
            float *Y = m2d_malloc(sizeof(float) * (size_t)n * k * d); /* expert outputs, bucket order */
            experts_parallel(e, L, x, k, d, de, E, count, pair, maxm, Y);
            for (int ex = 0; ex < E; ex++)
                for (int r = count[ex]; r < count[ex + 1]; r++) {
                    float gw = gates[pair[r]], *o = out + (size_t)(pair[r] / k) * d;
                    const float *y = Y + (size_t)r * d;
                    for (int j = 0; j < d; j++) o[j] += gw * y[j];
                }
            free(Y);
        } else { /* one expert at a time, each GEMM split over all threads */
            float *xs = m2d_malloc(sizeof(float) * (size_t)maxm * d), *ys = m2d_malloc(sizeof(float) * (size_t)maxm * d);
            float *g = m2d_malloc(sizeof(float) * (size_t)maxm * de), *u = m2d_malloc(sizeof(float) * (size_t)maxm * de);
            for (int ex = 0; ex < E; ex++) {
                int m0 = count[ex], mn = count[ex + 1] - m0;
                if (mn == 0) continue;
                for (int r = 0; r < mn; r++) memcpy(xs + (size_t)r * d, x + (size_t)(pair[m0 + r] / k) * d, sizeof(float) * d);
                swiglu_ffn(e, L->exp_gate[ex], L->exp_up[ex], L->exp_down[ex], xs, mn, d, de, g, u, ys, 0.0f);
                for (int r = 0; r < mn; r++) {
                    int i = pair[m0 + r];
                    float gw = gates[i], *o = out + (size_t)(i / k) * d;
                    const float *y = ys + (size_t)r * d;
                    for (int j = 0; j < d; j++) o[j] += gw * y[j];
                }
            }
            free(xs); free(ys); free(g); free(u);
        }
        free(count); free(fill); free(pair);
    }
    free(probs);
    free(topk);
    free(gates);
    return rc;
}

/* ---- the core forward ---- */
typedef struct {
    int n_seg;
    const int *seg_off, *seg_len; /* rows of each segment, contiguous and in order */
    const m2d_kv *prefix;         /* cached keys every segment sees (NULL: none) */
    int np;                       /* number of prefix positions used */
    m2d_kv *append;               /* when set (one segment), its keys/values are appended */
} seg_plan;

static int check_tokens(const m2d_engine *e, const int32_t *tokens, int n) {
    if (n <= 0) return m2d_err("engine: n = %d tokens (need >= 1)", n);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= e->m->cfg.vocab_size)
            return m2d_err("engine: token %d at index %d out of range [0, %d)", tokens[i], i, e->m->cfg.vocab_size);
    return 0;
}

/* Final-normed hidden states hid [n, d] for the rows of the plan. */
static int forward_hidden(m2d_engine *e, const int32_t *tokens, int n, const seg_plan *p, float *hid) {
    const m2d_model *m = e->m;
    const m2d_config *c = &m->cfg;
    int d = c->hidden_size, H = c->num_attention_heads, KV = c->num_key_value_heads, hd = c->head_dim;
    int qd = H * hd, kvd = KV * hd;
    int inter = 0;
    for (int l = 0; l < c->num_hidden_layers; l++)
        if (!c->layer_is_moe[l]) inter = M2D_MAX(inter, c->intermediate_size);
    int *pos = m2d_malloc(sizeof(int) * (size_t)n);
    for (int s = 0; s < p->n_seg; s++)
        for (int i = 0; i < p->seg_len[s]; i++) pos[p->seg_off[s] + i] = p->np + i;
    float *x = m2d_malloc(sizeof(float) * (size_t)n * d), *xn = m2d_malloc(sizeof(float) * (size_t)n * d);
    float *ffo = m2d_malloc(sizeof(float) * (size_t)n * d);
    float *q = m2d_malloc(sizeof(float) * (size_t)n * qd), *att = m2d_malloc(sizeof(float) * (size_t)n * qd);
    float *kk = m2d_malloc(sizeof(float) * (size_t)n * kvd), *vv = m2d_malloc(sizeof(float) * (size_t)n * kvd);
    float *g = inter ? m2d_malloc(sizeof(float) * (size_t)n * inter) : NULL;
    float *u = inter ? m2d_malloc(sizeof(float) * (size_t)n * inter) : NULL;
    int rc = 0;
    for (int i = 0; i < n; i++)
        m2d_be_convert(m->embed->dtype, m->embed->data, (int64_t)tokens[i] * d, d, x + (size_t)i * d);
    for (int l = 0; l < c->num_hidden_layers && rc == 0; l++) {
        const m2d_layer *L = &m->layers[l];
        /* attention */
        m2d_be_rmsnorm(x, d, weight(e, L->attn_norm, 0), n, d, c->rms_norm_eps, xn, d);
        m2d_be_matmul_wt(xn, d, n, d, weight(e, L->q_proj, 0), d, qd, q, qd, 0.0f);
        m2d_be_matmul_wt(xn, d, n, d, weight(e, L->k_proj, 1), d, kvd, kk, kvd, 0.0f);
        m2d_be_matmul_wt(xn, d, n, d, weight(e, L->v_proj, 2), d, kvd, vv, kvd, 0.0f);
        m2d_be_rmsnorm(q, hd, weight(e, L->q_norm, 0), n * H, hd, c->rms_norm_eps, q, hd);
        m2d_be_rmsnorm(kk, hd, weight(e, L->k_norm, 1), n * KV, hd, c->rms_norm_eps, kk, hd);
        m2d_be_rope(q, qd, n, H, hd, pos, c->rope_theta);
        m2d_be_rope(kk, kvd, n, KV, hd, pos, c->rope_theta);
        for (int s = 0; s < p->n_seg; s++) {
            size_t o = (size_t)p->seg_off[s];
            const float *kp = p->prefix ? p->prefix->k[l] : NULL, *vp = p->prefix ? p->prefix->v[l] : NULL;
            size_t stride = p->prefix ? (size_t)p->prefix->cap * hd : 0;
            m2d_be_attention(q + o * qd, qd, kk + o * kvd, vv + o * kvd, kvd, p->seg_len[s], kp, vp, stride,
                             p->np, H, KV, hd, att + o * qd, qd);
        }
        if (p->append) {
            m2d_kv *kv = p->append;
            for (int gi = 0; gi < KV; gi++)
                for (int i = 0; i < n; i++) {
                    size_t dst = ((size_t)gi * kv->cap + (size_t)(kv->len + i)) * hd;
                    memcpy(kv->k[l] + dst, kk + (size_t)i * kvd + (size_t)gi * hd, sizeof(float) * hd);
                    memcpy(kv->v[l] + dst, vv + (size_t)i * kvd + (size_t)gi * hd, sizeof(float) * hd);
                }
        }
        m2d_be_matmul_wt(att, qd, n, qd, weight(e, L->o_proj, 0), qd, d, x, d, 1.0f); /* residual add */
        /* FFN */
        m2d_be_rmsnorm(x, d, weight(e, L->ffn_norm, 0), n, d, c->rms_norm_eps, xn, d);
        if (c->layer_is_moe[l]) {
            rc = moe_ffn(e, l, xn, n, ffo);
            if (rc == 0)
                for (size_t i = 0; i < (size_t)n * d; i++) x[i] += ffo[i];
        } else {
            swiglu_ffn(e, L->gate_proj, L->up_proj, L->down_proj, xn, n, d, c->intermediate_size, g, u, x, 1.0f);
        }
    }
    if (rc == 0) m2d_be_rmsnorm(x, d, weight(e, m->final_norm, 0), n, d, c->rms_norm_eps, hid, d);
    free(pos); free(x); free(xn); free(ffo); free(q); free(att); free(kk); free(vv); free(g); free(u);
    return rc;
}

/* ---- LM head ---- */
static void lm_head_logits(m2d_engine *e, const float *hid, int n, float *logits) {
    const m2d_config *c = &e->m->cfg;
    int d = c->hidden_size, V = c->vocab_size;
    for (int v0 = 0; v0 < V; v0 += LM_CHUNK) {
        int nv = M2D_MIN(LM_CHUNK, V - v0);
        const float *w = weight_rows(e, e->m->lm_head, (int64_t)v0 * d, (int64_t)nv * d, 0);
        m2d_be_matmul_wt(hid, d, n, d, w, d, nv, logits + v0, V, 0.0f);
    }
}

/* lp[i] = log softmax(logits(hid_i))[targets[i]], streaming over vocab chunks with an online
 * max / sum of exponentials in double: never more than [n, LM_CHUNK] logits at once. */
static void lm_head_logprobs(m2d_engine *e, const float *hid, int n, const int32_t *targets, double *lp) {
    const m2d_config *c = &e->m->cfg;
    int d = c->hidden_size, V = c->vocab_size;
    const int rows = 256;
    float *blk = m2d_malloc(sizeof(float) * (size_t)M2D_MIN(rows, n) * LM_CHUNK);
    double *mx = m2d_malloc(sizeof(double) * (size_t)n), *sum = m2d_calloc((size_t)n, sizeof(double));
    double *tgt = m2d_malloc(sizeof(double) * (size_t)n);
    for (int i = 0; i < n; i++) mx[i] = -INFINITY;
    for (int v0 = 0; v0 < V; v0 += LM_CHUNK) {
        int nv = M2D_MIN(LM_CHUNK, V - v0);
        const float *w = weight_rows(e, e->m->lm_head, (int64_t)v0 * d, (int64_t)nv * d, 0);
        for (int r0 = 0; r0 < n; r0 += rows) {
            int nr = M2D_MIN(rows, n - r0);
            m2d_be_matmul_wt(hid + (size_t)r0 * d, d, nr, d, w, d, nv, blk, nv, 0.0f);
            for (int r = 0; r < nr; r++) {
                const float *z = blk + (size_t)r * nv;
                int i = r0 + r;
                float cm = z[0];
                for (int j = 1; j < nv; j++) cm = z[j] > cm ? z[j] : cm;
                double s = 0;
                for (int j = 0; j < nv; j++) s += exp((double)z[j] - cm);
                if (cm > mx[i]) {
                    sum[i] = sum[i] * exp(mx[i] - cm) + s;
                    mx[i] = cm;
                } else {
                    sum[i] += s * exp(cm - mx[i]);
                }
                if (targets[i] >= v0 && targets[i] < v0 + nv) tgt[i] = z[targets[i] - v0];
            }
        }
    }
    for (int i = 0; i < n; i++) lp[i] = tgt[i] - mx[i] - log(sum[i]);
    free(blk); free(mx); free(sum); free(tgt);
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

/* ---- public entry points ---- */
static int logits_impl(m2d_engine *e, const int32_t *tokens, int n, float *logits) {
    if (check_tokens(e, tokens, n) || check_window(e, n)) return -1;
    int off = 0;
    seg_plan p = {1, &off, &n, NULL, 0, NULL};
    float *hid = m2d_malloc(sizeof(float) * (size_t)n * e->m->cfg.hidden_size);
    int rc = forward_hidden(e, tokens, n, &p, hid);
    if (rc == 0) lm_head_logits(e, hid, n, logits);
    free(hid);
    return rc;
}

static int logprobs_impl(m2d_engine *e, const int32_t *tokens, int n, const int32_t *targets, int first, double *lp) {
    if (check_tokens(e, tokens, n) || check_window(e, n)) return -1;
    if (first < 0 || first > n) return m2d_err("engine: logprobs: first = %d outside [0, %d]", first, n);
    if (check_targets(e, targets + first, n - first)) return -1;
    int off = 0, d = e->m->cfg.hidden_size;
    seg_plan p = {1, &off, &n, NULL, 0, NULL};
    float *hid = m2d_malloc(sizeof(float) * (size_t)n * d);
    int rc = forward_hidden(e, tokens, n, &p, hid);
    if (rc == 0 && first < n) lm_head_logprobs(e, hid + (size_t)first * d, n - first, targets + first, lp);
    free(hid);
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
    kv->k = m2d_calloc((size_t)kv->n_layers, sizeof(float *));
    kv->v = m2d_calloc((size_t)kv->n_layers, sizeof(float *));
    size_t per = (size_t)kv->n_kv * capacity * kv->hd;
    for (int l = 0; l < kv->n_layers; l++) {
        kv->k[l] = m2d_malloc(per * sizeof(float));
        kv->v[l] = m2d_malloc(per * sizeof(float));
    }
    return kv;
}

int m2d_kv_len(const m2d_kv *kv) { return kv->len; }

void m2d_kv_truncate(m2d_kv *kv, int len) {
    if (len >= 0 && len < kv->len) kv->len = len;
}

void m2d_kv_free(m2d_kv *kv) {
    if (!kv) return;
    for (int l = 0; l < kv->n_layers; l++) {
        free(kv->k[l]);
        free(kv->v[l]);
    }
    free(kv->k);
    free(kv->v);
    free(kv);
}

static int extend_impl(m2d_engine *e, m2d_kv *kv, const int32_t *tokens, int n, const int32_t *targets, double *lp) {
    if (kv->e != e) return m2d_err("engine: extend: KV cache belongs to another engine");
    if (check_tokens(e, tokens, n)) return -1;
    if (kv->len + n > kv->cap)
        return m2d_err("engine: extend: %d cached + %d new tokens exceed the KV capacity %d", kv->len, n, kv->cap);
    if (lp && check_targets(e, targets, n)) return -1;
    int off = 0, d = e->m->cfg.hidden_size;
    seg_plan p = {1, &off, &n, kv->len ? kv : NULL, kv->len, kv};
    float *hid = m2d_malloc(sizeof(float) * (size_t)n * d);
    int rc = forward_hidden(e, tokens, n, &p, hid);
    if (rc == 0) {
        kv->len += n;
        if (lp) lm_head_logprobs(e, hid, n, targets, lp);
    }
    free(hid);
    return rc;
}

static int branches_impl(m2d_engine *e, const m2d_kv *prefix, int n_branches, const int32_t *const *tokens,
                         const int *lens, const int32_t *const *targets, double *const *lp) {
    if (prefix && prefix->e != e) return m2d_err("engine: branches: KV cache belongs to another engine");
    if (n_branches <= 0) return m2d_err("engine: branches: n_branches = %d", n_branches);
    int np = prefix ? prefix->len : 0, total = 0, maxlen = 0;
    for (int b = 0; b < n_branches; b++) {
        if (lens[b] <= 0) return m2d_err("engine: branches: branch %d has %d tokens", b, lens[b]);
        if (check_tokens(e, tokens[b], lens[b])) return -1;
        if (lp && lp[b] && check_targets(e, targets[b], lens[b])) return -1;
        total += lens[b];
        maxlen = M2D_MAX(maxlen, lens[b]);
    }
    if (check_window(e, np + maxlen)) return -1;
    int *off = m2d_malloc(sizeof(int) * (size_t)n_branches);
    int32_t *all = m2d_malloc(sizeof(int32_t) * (size_t)total), *alltg = m2d_malloc(sizeof(int32_t) * (size_t)total);
    for (int b = 0, o = 0; b < n_branches; o += lens[b], b++) {
        off[b] = o;
        memcpy(all + o, tokens[b], sizeof(int32_t) * lens[b]);
        if (lp && lp[b]) memcpy(alltg + o, targets[b], sizeof(int32_t) * lens[b]);
        else memset(alltg + o, 0, sizeof(int32_t) * lens[b]);
    }
    int d = e->m->cfg.hidden_size;
    seg_plan p = {n_branches, off, lens, np ? prefix : NULL, np, NULL};
    float *hid = m2d_malloc(sizeof(float) * (size_t)total * d);
    int rc = forward_hidden(e, all, total, &p, hid);
    if (rc == 0 && lp) {
        double *tmp = m2d_malloc(sizeof(double) * (size_t)total);
        lm_head_logprobs(e, hid, total, alltg, tmp);
        for (int b = 0; b < n_branches; b++)
            if (lp[b]) memcpy(lp[b], tmp + off[b], sizeof(double) * lens[b]);
        free(tmp);
    }
    free(hid); free(off); free(all); free(alltg);
    return rc;
}

/* ---- public compute entry points: OpenBLAS single-threaded inside (see m2d_be_begin) ---- */
int m2d_engine_expert(m2d_engine *e, int layer, int expert, const float *x, int n, float *out) {
    int saved = m2d_be_begin();
    int rc = expert_impl(e, layer, expert, x, n, out);
    m2d_be_end(saved);
    return rc;
}

int m2d_engine_logits(m2d_engine *e, const int32_t *tokens, int n, float *logits) {
    int saved = m2d_be_begin();
    int rc = logits_impl(e, tokens, n, logits);
    m2d_be_end(saved);
    return rc;
}

int m2d_engine_logprobs(m2d_engine *e, const int32_t *tokens, int n, const int32_t *targets, int first, double *lp) {
    int saved = m2d_be_begin();
    int rc = logprobs_impl(e, tokens, n, targets, first, lp);
    m2d_be_end(saved);
    return rc;
}

int m2d_engine_extend(m2d_engine *e, m2d_kv *kv, const int32_t *tokens, int n, const int32_t *targets, double *lp) {
    int saved = m2d_be_begin();
    int rc = extend_impl(e, kv, tokens, n, targets, lp);
    m2d_be_end(saved);
    return rc;
}

int m2d_engine_branches(m2d_engine *e, const m2d_kv *prefix, int n_branches, const int32_t *const *tokens,
                        const int *lens, const int32_t *const *targets, double *const *lp) {
    int saved = m2d_be_begin();
    int rc = branches_impl(e, prefix, n_branches, tokens, lens, targets, lp);
    m2d_be_end(saved);
    return rc;
}
