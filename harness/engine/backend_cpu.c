/* backend_cpu — the "cpu" backend: every weight GEMM through the GEMM module (gemm.h: oneDNN's
 * fp32 or bf16 matmul, sgemm for tiny weights and CPUs without them), one context per precision;
 * attention's GEMMs through the same module in fp32 (OpenBLAS is single-threaded between
 * enter/leave). All parallelism is this backend's own pool (pool.h): GEMMs in fixed tiles of output
 * columns, attention by (kv head, block of query rows), MoE experts as grouped GEMMs,
 * log-probabilities by rows.
 * One kind of thread only: with OpenBLAS's pool threads next to ours, idle pool threads spin in
 * sched_yield and took up to half of the time on tiny shapes (perf); oneDNN's OpenMP team never
 * starts (gemm.c). Fixed tiles leave each element's reduction order unchanged, so results do not
 * depend on the thread count. Thread count and tuning are per backend object (one per engine);
 * this file is the only one in the product that calls OpenBLAS's threading functions.
 *
 * Buffers are host memory; weights are the checkpoint's tensors (mmapped or in memory), read as
 * stored by the GEMM module (bf16 in place; converted per tile into its scratch otherwise), or
 * prepared once in the kernel's layout and kept (make_resident; norms: an fp32 copy). Every
 * kernel has an obviously-correct counterpart in tests/test_engine.c. */
#include "engine/backend.h"
#include "engine/gemm.h"
#include "engine/pool.h"
#include "engine/backend_cpu.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/util.h"

typedef struct {
    void *p;
    size_t bytes;
    int view;  /* host memory the backend does not own (host_view) */
    size_t cap; /* bytes of p (>= bytes: a reused buffer may be larger) */
} cpu_buf;

/* Released buffers of at least BUF_CACHE_MIN bytes are kept for a later alloc they fit (at most
 * twice its size), up to BUF_CACHE_MAX bytes in all: a forward allocates the same activation
 * buffers every time, and fresh ones cost page faults and zeroing (~5 % of pp512 on the 30B
 * slice). */
#define BUF_CACHE_MIN ((size_t)1 << 20)
#define BUF_CACHE_MAX ((size_t)512 << 20)
#define BUF_CACHE_SLOTS 32

typedef struct {
    pthread_mutex_t mu;
    void *p[BUF_CACHE_SLOTS];
    size_t cap[BUF_CACHE_SLOTS], bytes;
    int n;
} buf_cache;

typedef struct {
    const m2d_tensor *t;
    float *f32;              /* resident fp32 copy (vectors: norms), or NULL */
    m2d_gemm_packed *packed; /* resident copy in the GEMM kernel's layout (matrices), or NULL */
} cpu_weight;

/* The op-sized buffers an op reuses from the last one (in floats): fresh 10–100 MB mallocs would be
 * new mappings each time, and their page faults and zeroing were ~6 % of calibration time. One op
 * runs at a time per backend, so each slot has one user; the MoE hook runs between ops. */
enum { WORK_WEIGHT, WORK_ROWS, WORK_OUT, WORK_GATE, WORK_UP, N_WORK };

typedef struct {
    m2d_backend base;
    int threads;
    int expert_parallel;    /* MoE: whole experts per thread (1) or one expert at a time (0) */
    int attn_gemm_min_rows; /* segments of at least this many rows use the GEMM attention */
    int depth, blas_saved;  /* enter/leave nesting and OpenBLAS's thread count outside */
    buf_cache cache;        /* released activation buffers kept for reuse */
    float *work[N_WORK];    /* grow-only buffers of the op in progress, kept between ops (see work) */
    size_t work_cap[N_WORK];
    m2d_pool *pool;         /* the threads of every op (threads == its size) */
    m2d_gemm_ctx *gemm[2];  /* by precision (FP32, BF16), on the pool */
    m2d_precision resident; /* the precision make_resident prepares matrices for */
    int failed;             /* an op failed since the outermost enter: err holds its message */
    char err[512];
} cpu_be;

static cpu_be *CPU(m2d_backend *be) { return (cpu_be *)be; }
static float *F(const m2d_mat *m) { return (float *)((const cpu_buf *)m->buf)->p + m->off; }
static void *B(const m2d_buf *b) { return ((const cpu_buf *)b)->p; }
static const cpu_weight *W(const m2d_weight *w) { return (const cpu_weight *)w; }

/* fn(ctx, item) for item in [0, n_items) on the backend's pool (engine/pool.h: nested calls run
 * serially on the calling worker) */
static void parallel_for(const cpu_be *c, int n_items, void (*fn)(void *ctx, int item), void *ctx) {
    m2d_pool_for(c->pool, n_items, fn, ctx);
}

/* ---- dtype conversion (m2d_to_f32 widens BF16 16 lanes at a time) ---- */
typedef struct {
    m2d_dtype t;
    const void *src;
    int64_t first, n, chunk;
    float *dst;
} conv_job;

static void conv_item(void *ctx, int item) {
    conv_job *j = ctx;
    int64_t a = (int64_t)item * j->chunk, b = M2D_MIN(a + j->chunk, j->n);
    m2d_to_f32(j->t, j->src, j->first + a, b - a, j->dst + a);
}

/* n elements from FIRST to fp32, in parallel chunks of 256 Ki elements */
static void convert_par(const cpu_be *c, m2d_dtype t, const void *src, int64_t first, int64_t n, float *dst) {
    const int64_t chunk = 1 << 18;
    if (n <= chunk || c->threads <= 1) {
        m2d_to_f32(t, src, first, n, dst);
        return;
    }
    conv_job j = {t, src, first, n, chunk, dst};
    parallel_for(c, (int)((n + chunk - 1) / chunk), conv_item, &j);
}

/* ---- weights ---- */
static int in_place(const m2d_tensor *t) { return t->dtype == M2D_F32 && ((uintptr_t)t->data & 3) == 0; }

/* Slot SLOT's buffer of at least N floats (its old contents are not kept when it grows). */
static float *work(cpu_be *c, int slot, size_t n) {
    if (n > c->work_cap[slot]) {
        free(c->work[slot]);
        c->work[slot] = m2d_malloc(n * sizeof(float));
        c->work_cap[slot] = n;
    }
    return c->work[slot];
}

static float *scratch(cpu_be *c, size_t n) { return work(c, WORK_WEIGHT, n); } /* weight rows converted */

/* fp32 view of elements [first, first+n) of W: in place, resident, or converted into the
 * backend's scratch (valid until the next op) */
static const float *wrows(cpu_be *c, const m2d_weight *wh, int64_t first, int64_t n) {
    const cpu_weight *w = W(wh);
    if (in_place(w->t)) return (const float *)w->t->data + first;
    if (w->f32) return w->f32 + first;
    float *s = scratch(c, (size_t)n);
    convert_par(c, w->t->dtype, w->t->data, first, n, s);
    return s;
}

/* the first failure of an op since the outermost enter, reported by leave */
static void fail(cpu_be *c) {
    if (!c->failed) snprintf(c->err, sizeof c->err, "%s", m2d_errmsg());
    c->failed = 1;
}

static m2d_gemm_ctx *gemm_ctx(const cpu_be *c, m2d_precision p) { return c->gemm[p == M2D_PREC_BF16]; }
static int is_matrix(const m2d_tensor *t) { return t->ndim == 2; }

/* Rows [r0, r0+n) of W for the GEMM module: the prepared copy when it was made for PREC and the
 * rows are a view of it (slice-aligned; same bits as the stored rows), else the stored rows. */
static m2d_gemm_w gemm_view(const cpu_be *c, const m2d_weight *wh, int64_t r0, int n, m2d_precision prec) {
    const cpu_weight *w = W(wh);
    if (w->packed && prec == c->resident && r0 % M2D_GEMM_SLICE == 0 &&
        (n % M2D_GEMM_SLICE == 0 || r0 + n == w->t->shape[0]))
        return m2d_gemm_packed_rows(w->packed, (int)r0, n);
    return m2d_gemm_tensor_rows(w->t, r0, n);
}

static m2d_weight *cpu_weight_new(m2d_backend *be, const m2d_tensor *t) {
    (void)be;
    cpu_weight *w = m2d_calloc(1, sizeof *w);
    w->t = t;
    return (m2d_weight *)w;
}

static void cpu_weight_free(m2d_backend *be, m2d_weight *wh) {
    (void)be;
    if (!wh) return;
    free(((cpu_weight *)wh)->f32);
    m2d_gemm_packed_free(((cpu_weight *)wh)->packed);
    free(wh);
}

/* matrices: the GEMM module's prepared copy for the backend's precision; vectors: fp32. F32
 * tensors are never copied: a handle may view memory its owner keeps writing (a trainer's master
 * weights, m2d_cpu_weight_over), and a copy would go stale. */
static size_t cpu_resident_bytes(m2d_backend *be, const m2d_weight *wh) {
    cpu_be *c = CPU(be);
    const cpu_weight *w = W(wh);
    if (in_place(w->t)) return 0; /* F32: read where it is (it may be a live view, e.g. a trainer's weights) */
    if (is_matrix(w->t)) {
        m2d_gemm_w v = m2d_gemm_tensor_rows(w->t, 0, (int)w->t->shape[0]);
        return w->packed ? 0 : m2d_gemm_prepare_bytes(gemm_ctx(c, c->resident), &v);
    }
    return in_place(w->t) || w->f32 ? 0 : (size_t)m2d_tensor_numel(w->t) * sizeof(float);
}

static int cpu_make_resident(m2d_backend *be, m2d_weight *wh) {
    cpu_be *c = CPU(be);
    cpu_weight *w = (cpu_weight *)wh;
    if (in_place(w->t)) return 0;
    if (is_matrix(w->t)) {
        m2d_gemm_w v = m2d_gemm_tensor_rows(w->t, 0, (int)w->t->shape[0]);
        return w->packed ? 0 : m2d_gemm_prepare(gemm_ctx(c, c->resident), &v, &w->packed);
    }
    if (in_place(w->t) || w->f32) return 0;
    int64_t n = m2d_tensor_numel(w->t);
    w->f32 = m2d_malloc((size_t)n * sizeof(float));
    convert_par(c, w->t->dtype, w->t->data, 0, n, w->f32);
    return 0;
}

/* default: keep prepared copies only when they are small next to RAM (1/8): +10..30% speed
 * measured on tiny models, while big checkpoints stay mmapped in their stored dtype */
static size_t cpu_resident_budget(m2d_backend *be) {
    (void)be;
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    size_t eighth = pages > 0 && psz > 0 ? (size_t)pages * (size_t)psz / 8 : 0;
    /* and at most 1 GiB: a prepared bf16 copy is as big as the mmapped checkpoint it duplicates
     * (a 30B-shaped 2-layer slice: 3.1 GB of anonymous memory next to 3.5 GB mapped, for a few
     * per cent per GEMM), so realistic checkpoints stay as stored in either precision */
    return M2D_MIN(eighth, (size_t)1 << 30);
}

static void cpu_weight_f32(m2d_backend *be, const m2d_weight *wh, int64_t first, int64_t n, float *dst) {
    const cpu_weight *w = W(wh);
    if (w->f32) memcpy(dst, w->f32 + first, (size_t)n * sizeof(float));
    else convert_par(CPU(be), w->t->dtype, w->t->data, first, n, dst);
}

/* ---- memory ---- */
/* the smallest cached buffer of BYTES to 2 x BYTES, taken out of the cache; NULL when none */
static void *cache_take(buf_cache *k, size_t bytes, size_t *cap) {
    void *p = NULL;
    pthread_mutex_lock(&k->mu);
    int best = -1;
    for (int i = 0; i < k->n; i++)
        if (k->cap[i] >= bytes && k->cap[i] <= 2 * bytes && (best < 0 || k->cap[i] < k->cap[best])) best = i;
    if (best >= 0) {
        p = k->p[best], *cap = k->cap[best];
        k->bytes -= *cap;
        k->n--;
        k->p[best] = k->p[k->n], k->cap[best] = k->cap[k->n];
    }
    pthread_mutex_unlock(&k->mu);
    return p;
}

/* keep P for reuse if the cache has room (1), else leave it to the caller (0) */
static int cache_put(buf_cache *k, void *p, size_t cap) {
    pthread_mutex_lock(&k->mu);
    int kept = cap >= BUF_CACHE_MIN && k->n < BUF_CACHE_SLOTS && k->bytes + cap <= BUF_CACHE_MAX;
    if (kept) {
        k->p[k->n] = p, k->cap[k->n] = cap;
        k->n++;
        k->bytes += cap;
    }
    pthread_mutex_unlock(&k->mu);
    return kept;
}

static void cache_free(buf_cache *k) {
    for (int i = 0; i < k->n; i++) free(k->p[i]);
    pthread_mutex_destroy(&k->mu);
}

static m2d_buf *cpu_alloc(m2d_backend *be, size_t bytes) {
    cpu_buf *b = m2d_calloc(1, sizeof *b);
    b->bytes = bytes;
    b->p = bytes >= BUF_CACHE_MIN ? cache_take(&CPU(be)->cache, bytes, &b->cap) : NULL;
    if (!b->p) {
        b->p = m2d_malloc(bytes ? bytes : 1);
        b->cap = bytes;
    }
    return (m2d_buf *)b;
}

static void cpu_release(m2d_backend *be, m2d_buf *bh) {
    cpu_buf *b = (cpu_buf *)bh;
    if (!b) return;
    if (!b->view && !cache_put(&CPU(be)->cache, b->p, b->cap)) free(b->p);
    free(b);
}

static m2d_buf *cpu_host_view(m2d_backend *be, void *p, size_t bytes) {
    (void)be;
    cpu_buf *b = m2d_calloc(1, sizeof *b);
    *b = (cpu_buf){p, bytes, 1, bytes};
    return (m2d_buf *)b;
}

static void cpu_upload(m2d_backend *be, m2d_buf *dst, size_t off, const void *src, size_t bytes) {
    (void)be;
    if (bytes) memcpy((char *)B(dst) + off, src, bytes);
}

static void cpu_download(m2d_backend *be, void *dst, const m2d_buf *src, size_t off, size_t bytes) {
    (void)be;
    if (bytes) memcpy(dst, (const char *)B(src) + off, bytes);
}

static void cpu_download_mat(m2d_backend *be, float *dst, int ld_dst, const m2d_mat *src) {
    (void)be;
    const float *s = F(src);
    for (int r = 0; r < src->rows; r++)
        memcpy(dst + (size_t)r * ld_dst, s + (size_t)r * src->ld, sizeof(float) * (size_t)src->cols);
}

/* ---- GEMM: y = x · W[w_row0 ..)^T + beta y, through the GEMM module ---- */
static void cpu_gemm(m2d_backend *be, const m2d_mat *x, const m2d_weight *w, int w_row0, m2d_mat *y, float beta,
                     m2d_precision prec) {
    cpu_be *c = CPU(be);
    if (c->failed) return;
    m2d_gemm_w v = gemm_view(c, w, w_row0, y->cols, prec);
    if (m2d_gemm(gemm_ctx(c, prec), F(x), x->ld, x->rows, &v, F(y), y->ld, beta)) fail(c);
}

/* ---- elementwise and per-row kernels ---- */
static void rmsnorm_rows(const float *x, int ldx, const float *w, int rows, int d, double eps, float *y, int ldy) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * ldx;
        float *yr = y + (size_t)r * ldy;
        double ss = 0;
        for (int i = 0; i < d; i++) ss += (double)xr[i] * xr[i];
        float inv = (float)(1.0 / sqrt(ss / d + eps));
        for (int i = 0; i < d; i++) yr[i] = xr[i] * inv * w[i];
    }
}

static void cpu_rmsnorm(m2d_backend *be, const m2d_mat *x, const m2d_weight *w, double eps, m2d_mat *y) {
    const float *wv = wrows(CPU(be), w, 0, x->cols);
    rmsnorm_rows(F(x), x->ld, wv, x->rows, x->cols, eps, F(y), y->ld);
}

/* RoPE (m2d_rope_args): pair i of each head's first rot dims, (a, b) = (x[i], x[i + rot/2]) for
 * rotate-half or (x[2i], x[2i+1]) interleaved, turns by f = pos * inv_freq[i]:
 * (a cos f - b sin f, b cos f + a sin f), cos and sin times attn_factor; angles in double */
static void cpu_rope(m2d_backend *be, m2d_mat *xm, int n_heads, int hd, const m2d_buf *posb, const m2d_rope_args *r) {
    (void)be;
    float *x = F(xm);
    const int32_t *pos = B(posb);
    int rot = r->rot_dim ? r->rot_dim : hd, half = rot / 2;
    int inter = r->kind == M2D_ROPE_INTERLEAVED, step = inter ? 2 : 1, partner = inter ? 1 : half;
    double af = r->attn_factor != 0 ? r->attn_factor : 1, inv_freq[M2D_MAX_HEAD_DIM / 2];
    float cs[M2D_MAX_HEAD_DIM / 2], sn[M2D_MAX_HEAD_DIM / 2];
    for (int i = 0; i < half; i++) inv_freq[i] = r->inv_freq ? r->inv_freq[i] : pow(r->theta, -2.0 * i / rot);
    for (int t = 0; t < xm->rows; t++) {
        for (int i = 0; i < half; i++) {
            double f = pos[t] * inv_freq[i];
            cs[i] = (float)(cos(f) * af);
            sn[i] = (float)(sin(f) * af);
        }
        for (int h = 0; h < n_heads; h++) {
            float *v = x + (size_t)t * xm->ld + (size_t)h * hd;
            for (int i = 0; i < half; i++) {
                float *pa = v + i * step, *pb = pa + partner, a = *pa, b = *pb;
                *pa = a * cs[i] - b * sn[i];
                *pb = b * cs[i] + a * sn[i];
            }
        }
    }
}

/* in-place softmax of one row (max-subtracted, sum in double); with SINK (not NULL) one more
 * logit *SINK joins the max and the denominator (an attention sink: its probability is dropped) */
static void softmax_sink(float *x, int n, const float *sink) {
    float m = sink ? *sink : -INFINITY;
    for (int i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    double s = sink ? expf(*sink - m) : 0;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - m);
        s += x[i];
    }
    float inv = (float)(1.0 / s);
    for (int i = 0; i < n; i++) x[i] *= inv;
}

static void softmax_row(float *x, int n) { softmax_sink(x, n, NULL); }

static void swiglu(const float *g, const float *u, int64_t n, float *h) {
    for (int64_t i = 0; i < n; i++) h[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static void cpu_glu(m2d_backend *be, m2d_ffn_act act, m2d_mat *g, const m2d_mat *u) {
    (void)be;
    (void)act; /* M2D_ACT_SWIGLU is the only activation */
    for (int r = 0; r < g->rows; r++)
        swiglu(F(g) + (size_t)r * g->ld, F(u) + (size_t)r * u->ld, g->cols, F(g) + (size_t)r * g->ld);
}

/* GPT-OSS's clamped SwiGLU (modelling_gpt_oss.py GptOssExperts._apply_gate), h may be g */
static void swiglu_clamp(const float *g, const float *u, int64_t n, float alpha, float limit, float *h) {
    for (int64_t i = 0; i < n; i++) {
        float a = fminf(g[i], limit), b = fminf(fmaxf(u[i], -limit), limit);
        h[i] = (b + 1.0f) * (a / (1.0f + expf(-alpha * a)));
    }
}

static void cpu_glu_clamp(m2d_backend *be, m2d_mat *g, const m2d_mat *u, float alpha, float limit) {
    (void)be;
    for (int r = 0; r < g->rows; r++)
        swiglu_clamp(F(g) + (size_t)r * g->ld, F(u) + (size_t)r * u->ld, g->cols, alpha, limit,
                     F(g) + (size_t)r * g->ld);
}

static void add_rows(float *y, int ld, int rows, int cols, const float *b) {
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < cols; i++) y[(size_t)r * ld + i] += b[i];
}

static void cpu_add_bias(m2d_backend *be, m2d_mat *y, const m2d_weight *b) {
    add_rows(F(y), y->ld, y->rows, y->cols, wrows(CPU(be), b, 0, y->cols));
}

static void cpu_add(m2d_backend *be, m2d_mat *y, const m2d_mat *x) {
    (void)be;
    for (int r = 0; r < y->rows; r++) {
        float *yr = F(y) + (size_t)r * y->ld;
        const float *xr = F(x) + (size_t)r * x->ld;
        for (int i = 0; i < y->cols; i++) yr[i] += xr[i];
    }
}

static void cpu_sigmoid_scale(m2d_backend *be, m2d_mat *y, const m2d_mat *sm) {
    (void)be;
    for (int r = 0; r < y->rows; r++) {
        float *yr = F(y) + (size_t)r * y->ld, g = 1.0f / (1.0f + expf(-F(sm)[(size_t)r * sm->ld]));
        for (int i = 0; i < y->cols; i++) yr[i] *= g;
    }
}

static void cpu_clamp(m2d_backend *be, m2d_mat *x, float limit) {
    (void)be;
    for (int r = 0; r < x->rows; r++) {
        float *xr = F(x) + (size_t)r * x->ld;
        for (int i = 0; i < x->cols; i++) xr[i] = xr[i] < -limit ? -limit : xr[i] > limit ? limit : xr[i];
    }
}

static void cpu_embed(m2d_backend *be, const m2d_weight *table, const m2d_buf *tokens, int n, m2d_mat *x) {
    const int32_t *tok = B(tokens);
    int d = x->cols;
    for (int i = 0; i < n; i++) cpu_weight_f32(be, table, (int64_t)tok[i] * d, d, F(x) + (size_t)i * x->ld);
}

static void cpu_kv_append(m2d_backend *be, m2d_buf *kc, m2d_buf *vc, size_t off, size_t head_stride, int pos0,
                          const m2d_mat *k, const m2d_mat *v, int n_kv, int hd) {
    (void)be;
    float *K = (float *)B(kc) + off, *V = (float *)B(vc) + off;
    for (int g = 0; g < n_kv; g++)
        for (int i = 0; i < k->rows; i++) {
            size_t dst = g * head_stride + (size_t)(pos0 + i) * hd;
            memcpy(K + dst, F(k) + (size_t)i * k->ld + (size_t)g * hd, sizeof(float) * hd);
            memcpy(V + dst, F(v) + (size_t)i * v->ld + (size_t)g * hd, sizeof(float) * hd);
        }
}

/* ---- routing ---- */

/* top-k of p[E] by repeated scans (k and E are small: 8 of 128); strict '>' keeps the lower index
 * on ties because indices are scanned in increasing order */
static void topk_row(const float *p, int E, int k, int32_t *idx, uint8_t *taken) {
    memset(taken, 0, (size_t)E);
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
        idx[j] = best;
        taken[best] = 1;
    }
}

/* DeepSeek's group_limited_greedy: the NG groups of E / NG experts ranked by their largest p, the
 * TG best kept (ties -> lower group), the others' p taken as 0, then top-k (transformers' masked_fill
 * and topk). MASKED: scratch [E]. */
static void group_limited_topk(const float *p, int E, int k, int NG, int TG, int32_t *id, uint8_t *taken,
                               float *masked) {
    int per = E / NG;
    int32_t gid[M2D_MAX_EXPERT_GROUPS];
    float gmax[M2D_MAX_EXPERT_GROUPS];
    for (int g = 0; g < NG; g++) {
        gmax[g] = -INFINITY;
        for (int i = 0; i < per; i++) gmax[g] = fmaxf(gmax[g], p[g * per + i]);
    }
    topk_row(gmax, NG, TG, gid, taken);
    for (int i = 0; i < E; i++) masked[i] = 0;
    for (int j = 0; j < TG; j++) memcpy(masked + gid[j] * per, p + gid[j] * per, sizeof(float) * (size_t)per);
    topk_row(masked, E, k, id, taken);
}

static void cpu_route(m2d_backend *be, m2d_mat *logits, const m2d_route_args *r, m2d_buf *topkb, m2d_buf *gatesb) {
    (void)be;
    int E = logits->cols, k = r->k;
    int32_t *topk = B(topkb);
    float *gates = B(gatesb);
    uint8_t *taken = m2d_malloc((size_t)E);
    float *sel = m2d_malloc(sizeof(float) * (size_t)k), *masked = r->n_group > 0 ? m2d_malloc(sizeof(float) * (size_t)E) : NULL;
    for (int t = 0; t < logits->rows; t++) {
        float *p = F(logits) + (size_t)t * logits->ld, *g = gates + (size_t)t * k;
        int32_t *id = topk + (size_t)t * k;
        if (r->kind == M2D_ROUTER_TOPK_SOFTMAX) { /* top-k of the logits, softmax over those k */
            topk_row(p, E, k, id, taken);
            for (int j = 0; j < k; j++) sel[j] = p[id[j]];
            softmax_row(sel, k);
            memcpy(g, sel, sizeof(float) * (size_t)k);
            softmax_row(p, E); /* the full softmax, for the calibration hook */
            continue;
        }
        softmax_row(p, E);
        if (r->n_group > 0) group_limited_topk(p, E, k, r->n_group, r->topk_group, id, taken, masked);
        else topk_row(p, E, k, id, taken);
        double s = 0;
        for (int j = 0; j < k; j++) s += p[id[j]];
        for (int j = 0; j < k; j++) g[j] = r->renorm ? (float)(p[id[j]] / s) : p[id[j]];
        for (int j = 0; j < k && r->scale != 0; j++) g[j] *= r->scale;
    }
    free(taken);
    free(sel);
    free(masked);
}

/* ---- attention ---- */
typedef float v8f __attribute__((vector_size(32)));

static inline float dot(const float *a, const float *b, int n) {
    v8f acc0 = {0}, acc1 = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        v8f a0, b0, a1, b1;
        memcpy(&a0, a + i, 32);
        memcpy(&b0, b + i, 32);
        memcpy(&a1, a + i + 8, 32);
        memcpy(&b1, b + i + 8, 32);
        acc0 += a0 * b0;
        acc1 += a1 * b1;
    }
    acc0 += acc1;
    float s = 0;
    for (int j = 0; j < 8; j++) s += acc0[j];
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static inline void axpy(float a, const float *x, float *y, int n) {
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

/* one attention call on host pointers (the op's fields resolved) */
typedef struct {
    const float *q, *ks, *vs, *kp, *vp;
    int ldq, ldk, nq, np, n_heads, n_kv, hd, ldo;
    size_t p_head_stride;
    float *out;
    int window;          /* 0: full causal */
    const float *sinks;  /* [n_heads] or NULL */
    float scale;         /* of the scores */
} attn_host;

typedef struct {
    const attn_host *a;
    int row_block, n_blocks;
} attn_job;

/* first key position segment row i sees (its own position is np + i) */
static int first_key(const attn_host *j, int i) { return j->window > 0 ? M2D_MAX(0, j->np + i + 1 - j->window) : 0; }

/* per-row dot products: head h, a block of query rows; scores sc[t] for key positions t in
 * [lo, np + i] (prefix t < np, segment rows t - np) */
static void attn_item(void *ctx, int item) {
    const attn_job *jb = ctx;
    const attn_host *j = jb->a;
    int h = item / jb->n_blocks, blk = item % jb->n_blocks;
    int g = h / (j->n_heads / j->n_kv), hd = j->hd;
    int r0 = blk * jb->row_block, r1 = M2D_MIN(r0 + jb->row_block, j->nq);
    float scale = j->scale;
    float *sc = m2d_malloc(sizeof(float) * (size_t)(j->np + r1));
    float *acc = m2d_malloc(sizeof(float) * (size_t)hd);
    const float *kp = j->np ? j->kp + g * j->p_head_stride : NULL;
    const float *vp = j->np ? j->vp + g * j->p_head_stride : NULL;
    const float *sink = j->sinks ? j->sinks + h : NULL;
    for (int i = r0; i < r1; i++) {
        const float *qi = j->q + (size_t)i * j->ldq + (size_t)h * hd;
        int nk = j->np + i + 1, lo = first_key(j, i);
        float m = sink ? *sink : -INFINITY;
        for (int t = lo; t < j->np; t++) sc[t] = dot(qi, kp + (size_t)t * hd, hd) * scale;
        for (int t = M2D_MAX(lo - j->np, 0); t <= i; t++)
            sc[j->np + t] = dot(qi, j->ks + (size_t)t * j->ldk + (size_t)g * hd, hd) * scale;
        for (int t = lo; t < nk; t++) m = sc[t] > m ? sc[t] : m;
        double s = sink ? expf(*sink - m) : 0;
        for (int t = lo; t < nk; t++) {
            sc[t] = expf(sc[t] - m);
            s += sc[t];
        }
        memset(acc, 0, sizeof(float) * (size_t)hd);
        for (int t = lo; t < j->np; t++) axpy(sc[t], vp + (size_t)t * hd, acc, hd);
        for (int t = M2D_MAX(lo - j->np, 0); t <= i; t++)
            axpy(sc[j->np + t], j->vs + (size_t)t * j->ldk + (size_t)g * hd, acc, hd);
        float inv = (float)(1.0 / s);
        float *o = j->out + (size_t)i * j->ldo + (size_t)h * hd;
        for (int d = 0; d < hd; d++) o[d] = acc[d] * inv;
    }
    free(acc);
    free(sc);
}

/* The GEMM formulation, in fp32 through the GEMM module whatever the engine precision (scores and
 * values are activations: no bf16 rounding). One work item: a kv head g and a block of query rows
 * [r0, r1), the G query heads sharing g stacked as rows (i, head) of one GEMM, ~ATTG_ROWS rows.
 * The block needs keys [lo, np + r1) only (lo: where its first row's window starts), so the
 * causal part beyond the block, and with a window the part before it, is never computed (about
 * half the FLOPs of the full [nq, np + nq] square when np = 0); inside the block the masked
 * entries are zeroed after the GEMM. Per kv head K is gathered dense [nk, hd] and V transposed
 * [hd, nk] once: S = Q·Kᵀ is X·Wᵀ with W = K rows, O = P·V is X·Wᵀ with W = Vᵀ (the module's oneDNN
 * kernel reads dense operands; it copies a block's Vᵀ columns). Results depend on the shapes
 * only, never on the thread count (an item's GEMMs run serially inside it). */
#define ATTG_ROWS 128

typedef struct {
    const attn_host *a;
    cpu_be *c;
    int nk, group, block, n_blocks; /* query heads per kv head, query rows per item */
    float *kc, *vt;                 /* [n_kv][nk][hd] keys, [n_kv][hd][nk] values transposed */
    float *work;                    /* per worker: stacked Q rows, scores, outputs, 1/sums */
    size_t work_per;
} attg_job;

/* kv head g: its keys dense and its values transposed, prefix (the cache) then segment */
static void attg_gather(void *ctx, int g) {
    const attg_job *jb = ctx;
    const attn_host *j = jb->a;
    int hd = j->hd, np = j->np, nk = jb->nk;
    float *kc = jb->kc + (size_t)g * nk * hd, *vt = jb->vt + (size_t)g * hd * nk;
    for (int t = 0; t < nk; t++) {
        const float *k = t < np ? j->kp + g * j->p_head_stride + (size_t)t * hd : j->ks + (size_t)(t - np) * j->ldk + (size_t)g * hd;
        const float *v = t < np ? j->vp + g * j->p_head_stride + (size_t)t * hd : j->vs + (size_t)(t - np) * j->ldk + (size_t)g * hd;
        memcpy(kc + (size_t)t * hd, k, sizeof(float) * (size_t)hd);
        for (int d = 0; d < hd; d++) vt[(size_t)d * nk + t] = v[d];
    }
}

/* e^x, within 1.3 ulp of expf on [-87, 0] (all floats there checked against exp in double; expf:
 * 0.5), 0 below -87 (where expf is < 1.7e-38): n = round(x log2 e), r = x - n ln 2 in two parts
 * (Cody-Waite), e^r by a degree-7 polynomial (Cephes expf's coefficients), times 2^n built in the
 * exponent bits. Branch-free, so loops of it vectorise (expf is a call per element). */
static inline float exp_fast(float x) {
    float v = x > -87.0f ? x : -87.0f;
    float n = (v * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* 1.5 * 2^23: round to nearest */
    float r = fmaf(n, -0.693359375f, v);
    r = fmaf(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p, r * r, r + 1.0f);
    union {
        int32_t i;
        float f;
    } two_n = {.i = ((int32_t)n + 127) * (1 << 23)};
    return x > -87.0f ? p * two_n.f : 0.0f;
}

/* x[i] = e^(x[i]·scale - m) for the row's max m (the sink's logit included) and 1 / (the sum of
 * them in double, the sink's term included): softmax_sink's arithmetic, in 16-lane blocks that
 * vectorise; the caller divides the output row by the sum (as attn_item does) */
static float softmax_scaled(float *x, int n, float scale, const float *sink) {
    float m = sink ? *sink : -INFINITY, m16[16];
    double s16[16] = {0};
    int n16 = n / 16 * 16;
    for (int l = 0; l < 16; l++) m16[l] = m;
    for (int i = 0; i < n16; i += 16)
        for (int l = 0; l < 16; l++) m16[l] = x[i + l] * scale > m16[l] ? x[i + l] * scale : m16[l];
    for (int i = n16; i < n; i++) m = x[i] * scale > m ? x[i] * scale : m;
    for (int l = 0; l < 16; l++) m = m16[l] > m ? m16[l] : m;
    for (int i = 0; i < n16; i += 16) {
        float e16[16];
        for (int l = 0; l < 16; l++) e16[l] = exp_fast(x[i + l] * scale - m);
        for (int l = 0; l < 16; l++) {
            x[i + l] = e16[l];
            s16[l] += e16[l];
        }
    }
    double s = sink ? exp_fast(*sink - m) : 0;
    for (int i = n16; i < n; i++) s += x[i] = exp_fast(x[i] * scale - m);
    for (int l = 0; l < 16; l++) s += s16[l];
    return (float)(1.0 / s);
}

/* causal (and window) mask and unnormalised softmax of an item's stacked score rows: row r is
 * query row i = r0 + r / G of head h = g·G + r % G and holds keys [lo, lo + nkeys), of which
 * [first_key(i), np + i] are its own; INV[r]: 1 / the row's sum */
static void attg_softmax(const attg_job *jb, int g, int r0, int r1, int lo, int nkeys, float *S, float *inv) {
    const attn_host *j = jb->a;
    int G = jb->group;
    for (int r = 0; r < (r1 - r0) * G; r++) {
        float *row = S + (size_t)r * nkeys;
        int i = r0 + r / G, h = g * G + r % G, a = first_key(j, i) - lo, b = j->np + i + 1 - lo;
        inv[r] = softmax_scaled(row + a, b - a, j->scale, j->sinks ? j->sinks + h : NULL);
        memset(row, 0, sizeof(float) * (size_t)a);
        memset(row + b, 0, sizeof(float) * (size_t)(nkeys - b));
    }
}

static void attg_item(void *ctx, int item) {
    const attg_job *jb = ctx;
    const attn_host *j = jb->a;
    int g = item / jb->n_blocks, G = jb->group, hd = j->hd, nk = jb->nk;
    int r0 = item % jb->n_blocks * jb->block, r1 = M2D_MIN(r0 + jb->block, j->nq), rows = (r1 - r0) * G;
    int lo = first_key(j, r0), nkeys = j->np + r1 - lo;
    float *Q = jb->work + (size_t)m2d_pool_worker() * jb->work_per, *O = Q + (size_t)rows * hd, *S = O + (size_t)rows * hd;
    float *inv = S + (size_t)rows * nk;
    for (int i = r0; i < r1; i++) /* rows (i, head): G heads are adjacent in a row of Q */
        memcpy(Q + (size_t)(i - r0) * G * hd, j->q + (size_t)i * j->ldq + (size_t)g * G * hd, sizeof(float) * (size_t)G * hd);
    /* every view of this call's K and Vᵀ meets one kernel: the one for the whole */
    m2d_gemm_w wk = m2d_gemm_weight(M2D_F32, jb->kc + ((size_t)g * nk + lo) * hd, nkeys, hd, hd);
    m2d_gemm_w wv = m2d_gemm_weight(M2D_F32, jb->vt + (size_t)g * hd * nk + lo, hd, nkeys, nk);
    wk.whole = wv.whole = (int64_t)nk * hd;
    m2d_gemm_ctx *gc = gemm_ctx(jb->c, M2D_PREC_FP32);
    if (m2d_gemm(gc, Q, hd, rows, &wk, S, nkeys, 0.0f)) {
        fail(jb->c); /* nested in a pool item: the first failure is kept */
        return;
    }
    attg_softmax(jb, g, r0, r1, lo, nkeys, S, inv);
    if (m2d_gemm(gc, S, nkeys, rows, &wv, O, hd, 0.0f)) {
        fail(jb->c);
        return;
    }
    for (int r = 0; r < rows; r++) { /* normalised, to (i, head) */
        float *o = j->out + (size_t)(r0 + r / G) * j->ldo + (size_t)(g * G + r % G) * hd;
        for (int d = 0; d < hd; d++) o[d] = O[(size_t)r * hd + d] * inv[r];
    }
}

static void cpu_attention(m2d_backend *be, const m2d_attn_args *a) {
    cpu_be *c = CPU(be);
    int nq = a->q.rows;
    if (nq <= 0) return;
    attn_host h = {F(&a->q), F(&a->k), F(&a->v), NULL, NULL, a->q.ld, a->k.ld, nq, a->np, a->n_heads, a->n_kv,
                   a->head_dim, a->out.ld, a->head_stride, F(&a->out), a->window, NULL,
                   a->scale != 0 ? a->scale : 1.0f / sqrtf((float)a->head_dim)};
    float *sinks = NULL;
    if (a->sinks) {
        sinks = m2d_malloc(sizeof(float) * (size_t)a->n_heads);
        cpu_weight_f32(be, a->sinks, 0, a->n_heads, sinks);
        h.sinks = sinks;
    }
    if (a->np) {
        h.kp = (const float *)B(a->k_cache) + a->cache_off;
        h.vp = (const float *)B(a->v_cache) + a->cache_off;
    }
    if (nq >= c->attn_gemm_min_rows) {
        int nk = a->np + nq, nw = M2D_MAX(c->threads, 1); /* per-worker work: worker ids < threads */
        size_t kv = (size_t)a->n_kv * nk * a->head_dim;
        attg_job j = {.a = &h, .c = c, .nk = nk, .group = a->n_heads / a->n_kv};
        j.block = M2D_MIN(M2D_MAX(ATTG_ROWS / j.group, 1), nq);
        j.n_blocks = (nq + j.block - 1) / j.block;
        size_t rows = (size_t)j.block * j.group;
        j.work_per = rows * (2 * (size_t)a->head_dim + (size_t)nk + 1) + 16; /* Q, O, S, 1/sums */
        j.kc = m2d_malloc(sizeof(float) * kv);
        j.vt = m2d_malloc(sizeof(float) * kv);
        j.work = m2d_malloc(sizeof(float) * j.work_per * (size_t)nw);
        parallel_for(c, a->n_kv, attg_gather, &j);
        parallel_for(c, a->n_kv * j.n_blocks, attg_item, &j);
        free(j.kc);
        free(j.vt);
        free(j.work);
    } else {
        /* row blocks give the threads work when there are few heads; causal rows grow in cost, and
         * the dynamic hand-out balances that */
        int row_block = nq < 64 ? nq : 64;
        attn_job j = {&h, row_block, (nq + row_block - 1) / row_block};
        parallel_for(c, a->n_heads * j.n_blocks, attn_item, &j);
    }
    free(sinks);
}

/* ---- MoE experts ---- */

/* the (token, slot) pairs bucketed by expert, in token order within an expert */
typedef struct {
    int *count; /* [E + 1] bucket starts */
    int *pair;  /* [n*k] pair index t*k + j, bucket order */
    int *pos;   /* [n*k] inverse: the bucket-order row of pair t*k + j */
} buckets;

static void bucket_by_expert(const int32_t *topk, int nk, int E, buckets *b) {
    b->count = m2d_calloc((size_t)E + 1, sizeof(int));
    for (int i = 0; i < nk; i++) b->count[topk[i] + 1]++;
    for (int e = 0; e < E; e++) b->count[e + 1] += b->count[e];
    int *fill = m2d_malloc(sizeof(int) * (size_t)E);
    memcpy(fill, b->count, sizeof(int) * (size_t)E);
    b->pair = m2d_malloc(sizeof(int) * (size_t)(nk ? nk : 1));
    b->pos = m2d_malloc(sizeof(int) * (size_t)(nk ? nk : 1));
    for (int i = 0; i < nk; i++) {
        b->pos[i] = fill[topk[i]]++;
        b->pair[b->pos[i]] = i;
    }
    free(fill);
}

static void buckets_free(buckets *b) {
    free(b->count);
    free(b->pair);
    free(b->pos);
}

/* Grouped GEMMs: spread over the pool one GEMM per item (expert_parallel), or one after another,
 * each split over the pool; same bits either way (the module's tiles are fixed). */
static void run_groups(cpu_be *c, m2d_precision prec, const m2d_gemm_group *g, int n) {
    m2d_gemm_ctx *ctx = gemm_ctx(c, prec);
    if (c->expert_parallel) {
        if (m2d_gemm_grouped(ctx, g, n)) fail(c);
        return;
    }
    for (int i = 0; i < n && !c->failed; i++)
        if (m2d_gemm(ctx, g[i].x, g[i].ldx, g[i].m, g[i].w, g[i].y, g[i].ldy, g[i].beta)) fail(c);
}

/* rows of one pool item in row-parallel elementwise loops */
#define ROW_BLOCK 16

typedef struct {
    const float *src;
    int ld_src;
    const int *rows; /* gather: source row of each destination row (NULL: identity) */
    float *g;        /* activation: g = act(g + bg, u + bu) */
    float *u;
    int n, d, k;
    const m2d_moe_args *a;  /* activation: its kind and clamp parameters */
    const float *bg, *bu;   /* activation: gate/up bias of each expert [E, d] (NULL: none) */
    const int *rexp;        /* activation: expert of each row; NULL: e0 + row / per */
    int e0, per;
} rows_job;

static void gather_item(void *ctx, int item) {
    const rows_job *j = ctx;
    for (int r = item * ROW_BLOCK; r < M2D_MIN(j->n, (item + 1) * ROW_BLOCK); r++)
        memcpy(j->g + (size_t)r * j->d, j->src + (size_t)(j->rows[r] / j->k) * j->ld_src, sizeof(float) * j->d);
}

/* the experts' activation between their GEMMs, row by row (biases per the row's expert) */
static void act_item(void *ctx, int item) {
    const rows_job *j = ctx;
    int d = j->d;
    for (int r = item * ROW_BLOCK; r < M2D_MIN(j->n, (item + 1) * ROW_BLOCK); r++) {
        float *g = j->g + (size_t)r * d, *u = j->u + (size_t)r * d;
        size_t ex = (size_t)(j->rexp ? j->rexp[r] : j->e0 + r / j->per);
        if (j->bg) add_rows(g, d, 1, d, j->bg + ex * d);
        if (j->bu) add_rows(u, d, 1, d, j->bu + ex * d);
        if (j->a->act == M2D_ACT_SWIGLU_CLAMP) swiglu_clamp(g, u, d, j->a->act_alpha, j->a->act_limit, g);
        else swiglu(g, u, d, g);
    }
}

/* the biases B[e] of experts 0..E-1 as fp32 [E, len] (NULL when the experts have none) */
static float *bias_table(cpu_be *c, m2d_weight *const *b, int E, int len) {
    if (!b) return NULL;
    float *t = m2d_malloc(sizeof(float) * (size_t)E * len);
    for (int e = 0; e < E; e++) cpu_weight_f32(&c->base, b[e], 0, len, t + (size_t)e * len);
    return t;
}

static int row_blocks(int n) { return (n + ROW_BLOCK - 1) / ROW_BLOCK; }

/* out[t] = sum over t's slots, in increasing expert id, of gate * Y[row of the slot] (the fixed
 * order of the sum; rows of tokens in parallel) */
typedef struct {
    const m2d_moe_args *a;
    const buckets *b;
    const float *Y;
} scatter_job;

static void scatter_item(void *ctx, int item) {
    const scatter_job *j = ctx;
    const m2d_moe_args *a = j->a;
    const int32_t *topk = B(a->topk);
    const float *gates = B(a->gates);
    int k = a->k, d = a->x.cols, *slot = m2d_malloc(sizeof(int) * (size_t)k);
    for (int t = item * ROW_BLOCK; t < M2D_MIN(a->x.rows, (item + 1) * ROW_BLOCK); t++) {
        for (int s = 0; s < k; s++) { /* insertion sort of the slots by expert id */
            int i = s;
            for (; i > 0 && topk[(size_t)t * k + slot[i - 1]] > topk[(size_t)t * k + s]; i--) slot[i] = slot[i - 1];
            slot[i] = s;
        }
        float *o = F(&a->out) + (size_t)t * a->out.ld;
        memset(o, 0, sizeof(float) * d);
        for (int s = 0; s < k; s++) {
            int p = t * k + slot[s];
            float gw = gates[p];
            const float *y = j->Y + (size_t)j->b->pos[p] * d;
            for (int i = 0; i < d; i++) o[i] += gw * y[i];
        }
    }
    free(slot);
}

/* Each expert's rows gathered once (bucket order), gate and up of all experts as one grouped call,
 * the activation, down as another; then the gated sum per token in expert-id order. */
static void cpu_moe(m2d_backend *be, const m2d_moe_args *a) {
    cpu_be *c = CPU(be);
    int n = a->x.rows, d = a->x.cols, de = a->d_ff, k = a->k, nk = n * k, E = a->n_experts;
    if (c->failed || n <= 0) return;
    buckets b;
    bucket_by_expert(B(a->topk), nk, E, &b);
    float *xs = work(c, WORK_ROWS, (size_t)nk * d), *Y = work(c, WORK_OUT, (size_t)nk * d);
    float *g = work(c, WORK_GATE, (size_t)nk * de), *u = work(c, WORK_UP, (size_t)nk * de);
    rows_job gj = {.src = F(&a->x), .ld_src = a->x.ld, .rows = b.pair, .g = xs, .n = nk, .d = d, .k = k};
    parallel_for(c, row_blocks(nk), gather_item, &gj);
    m2d_gemm_w *wv = m2d_malloc(sizeof *wv * (size_t)E * 3);
    m2d_gemm_group *grp = m2d_malloc(sizeof *grp * (size_t)E * 2);
    int na = 0;
    for (int ex = 0; ex < E; ex++) {
        int m0 = b.count[ex], mn = b.count[ex + 1] - m0;
        if (mn == 0) continue;
        wv[3 * na] = gemm_view(c, a->gate[ex], 0, de, a->prec);
        wv[3 * na + 1] = gemm_view(c, a->up[ex], 0, de, a->prec);
        wv[3 * na + 2] = gemm_view(c, a->down[ex], 0, d, a->prec);
        const float *x = xs + (size_t)m0 * d;
        grp[2 * na] = (m2d_gemm_group){x, d, mn, &wv[3 * na], g + (size_t)m0 * de, de, 0.0f};
        grp[2 * na + 1] = (m2d_gemm_group){x, d, mn, &wv[3 * na + 1], u + (size_t)m0 * de, de, 0.0f};
        na++;
    }
    run_groups(c, a->prec, grp, 2 * na);
    int *rexp = m2d_malloc(sizeof(int) * (size_t)(nk ? nk : 1));
    for (int ex = 0; ex < E; ex++)
        for (int r = b.count[ex]; r < b.count[ex + 1]; r++) rexp[r] = ex;
    float *bg = bias_table(c, a->gate_bias, E, de), *bu = bias_table(c, a->up_bias, E, de);
    float *bd = bias_table(c, a->down_bias, E, d);
    rows_job sj = {.g = g, .u = u, .n = nk, .d = de, .a = a, .bg = bg, .bu = bu, .rexp = rexp};
    parallel_for(c, row_blocks(nk), act_item, &sj);
    for (int i = 0, ex = 0; i < na; i++, ex++) {
        while (b.count[ex + 1] == b.count[ex]) ex++;
        int m0 = b.count[ex];
        grp[i] = (m2d_gemm_group){g + (size_t)m0 * de, de, b.count[ex + 1] - m0, &wv[3 * i + 2], Y + (size_t)m0 * d, d, 0.0f};
    }
    run_groups(c, a->prec, grp, na);
    for (int r = 0; bd && r < nk; r++) add_rows(Y + (size_t)r * d, d, 1, d, bd + (size_t)rexp[r] * d);
    free(rexp); free(bg); free(bu); free(bd);
    scatter_job sc = {a, &b, Y};
    if (!c->failed) parallel_for(c, row_blocks(n), scatter_item, &sc);
    free(wv); free(grp);
    buckets_free(&b);
}

/* ---- LM head log-probabilities ---- */
#define LM_CHUNK 4096 /* vocab rows of the LM head per GEMM (a multiple of M2D_GEMM_SLICE: views of a prepared head) */
#define LM_ROWS 512   /* hidden rows per GEMM block: at most [LM_ROWS, LM_CHUNK] logits at once (8 MB) */

/* running max / sum of exponentials (double) of row i over one chunk z[nv] of logits at v0 */
static void lse_update(const float *z, int nv, int v0, int target, double *mx, double *sum, double *tgt) {
    float cm = z[0];
    for (int j = 1; j < nv; j++) cm = z[j] > cm ? z[j] : cm;
    double s = 0;
    for (int j = 0; j < nv; j++) s += exp((double)z[j] - cm);
    if (cm > *mx) {
        *sum = *sum * exp(*mx - cm) + s;
        *mx = cm;
    } else {
        *sum += s * exp(cm - *mx);
    }
    if (target >= v0 && target < v0 + nv) *tgt = z[target - v0];
}

typedef struct {
    const float *blk; /* [nr, nv] logits of rows r0.. and vocab v0.. */
    int nr, nv, v0, r0;
    const int32_t *targets;
    double *mx, *sum, *tgt;
} lse_job;

static void lse_item(void *ctx, int item) {
    const lse_job *j = ctx;
    for (int r = item * ROW_BLOCK; r < M2D_MIN(j->nr, (item + 1) * ROW_BLOCK); r++) {
        int i = j->r0 + r;
        lse_update(j->blk + (size_t)r * j->nv, j->nv, j->v0, j->targets[i], &j->mx[i], &j->sum[i], &j->tgt[i]);
    }
}

/* streaming over vocab chunks (in order: each row's log-sum-exp is updated chunk by chunk), the
 * rows of a chunk in parallel */
static void cpu_logprobs(m2d_backend *be, const m2d_mat *hid, const m2d_weight *head, int V, const m2d_buf *targetsb,
                         m2d_buf *lpb, m2d_precision prec) {
    cpu_be *c = CPU(be);
    int n = hid->rows;
    if (c->failed || n <= 0) return;
    double *lp = B(lpb);
    float *blk = m2d_malloc(sizeof(float) * (size_t)M2D_MIN(LM_ROWS, n) * LM_CHUNK);
    double *mx = m2d_malloc(sizeof(double) * (size_t)n), *sum = m2d_calloc((size_t)n, sizeof(double));
    double *tgt = m2d_malloc(sizeof(double) * (size_t)n);
    for (int i = 0; i < n; i++) mx[i] = -INFINITY;
    for (int v0 = 0; v0 < V && !c->failed; v0 += LM_CHUNK) {
        int nv = M2D_MIN(LM_CHUNK, V - v0);
        m2d_gemm_w w = gemm_view(c, head, v0, nv, prec);
        for (int r0 = 0; r0 < n && !c->failed; r0 += LM_ROWS) {
            int nr = M2D_MIN(LM_ROWS, n - r0);
            if (m2d_gemm(gemm_ctx(c, prec), F(hid) + (size_t)r0 * hid->ld, hid->ld, nr, &w, blk, nv, 0.0f)) {
                fail(c);
                break;
            }
            lse_job j = {blk, nr, nv, v0, r0, B(targetsb), mx, sum, tgt};
            parallel_for(c, row_blocks(nr), lse_item, &j);
        }
    }
    for (int i = 0; i < n; i++) lp[i] = tgt[i] - mx[i] - log(sum[i]);
    free(blk); free(mx); free(sum); free(tgt);
}

/* ---- calibration: every expert on every token, the Gram of their outputs ---- */

/* Experts in chunks, so that the activations [chunk, n, d_e] x 2 stay within ~64 MB (at least 4
 * experts: the grouped calls need items for every thread; a multiple of the thread count, so that
 * no thread waits for the last down projection); each chunk: gate and up of its experts
 * as one grouped call on the shared rows, the activation, down straight into the output columns. */
static void cpu_experts_all(m2d_backend *be, const m2d_moe_args *a) {
    cpu_be *c = CPU(be);
    int n = a->x.rows, d = a->x.cols, de = a->d_ff, E = a->n_experts;
    if (c->failed || n <= 0) return;
    int chunk = (int)M2D_MAX(4, M2D_MIN((size_t)E, ((size_t)64 << 20) / ((size_t)n * de * 2 * sizeof(float))));
    if (chunk < E && chunk > c->threads) chunk -= chunk % c->threads; /* down: equal groups per thread */
    float *g = work(c, WORK_GATE, (size_t)chunk * n * de), *u = work(c, WORK_UP, (size_t)chunk * n * de);
    m2d_gemm_w *wv = m2d_malloc(sizeof *wv * (size_t)chunk * 3);
    m2d_gemm_group *grp = m2d_malloc(sizeof *grp * (size_t)chunk * 2);
    float *bg = bias_table(c, a->gate_bias, E, de), *bu = bias_table(c, a->up_bias, E, de);
    float *bd = bias_table(c, a->down_bias, E, d);
    for (int e0 = 0; e0 < E && !c->failed; e0 += chunk) {
        int ne = M2D_MIN(chunk, E - e0);
        for (int i = 0; i < ne; i++) {
            wv[3 * i] = gemm_view(c, a->gate[e0 + i], 0, de, a->prec);
            wv[3 * i + 1] = gemm_view(c, a->up[e0 + i], 0, de, a->prec);
            wv[3 * i + 2] = gemm_view(c, a->down[e0 + i], 0, d, a->prec);
            grp[2 * i] = (m2d_gemm_group){F(&a->x), a->x.ld, n, &wv[3 * i], g + (size_t)i * n * de, de, 0.0f};
            grp[2 * i + 1] = (m2d_gemm_group){F(&a->x), a->x.ld, n, &wv[3 * i + 1], u + (size_t)i * n * de, de, 0.0f};
        }
        run_groups(c, a->prec, grp, 2 * ne);
        rows_job sj = {.g = g, .u = u, .n = ne * n, .d = de, .a = a, .bg = bg, .bu = bu, .e0 = e0, .per = n};
        parallel_for(c, row_blocks(ne * n), act_item, &sj);
        for (int i = 0; i < ne; i++)
            grp[i] = (m2d_gemm_group){g + (size_t)i * n * de, de, n, &wv[3 * i + 2], F(&a->out) + (size_t)(e0 + i) * d,
                                      a->out.ld, 0.0f};
        run_groups(c, a->prec, grp, ne);
        for (int t = 0; bd && t < n; t++) /* expert e0 + i's columns of token t: its down bias */
            for (int i = 0; i < ne; i++)
                add_rows(F(&a->out) + (size_t)t * a->out.ld + (size_t)(e0 + i) * d, d, 1, d, bd + (size_t)(e0 + i) * d);
    }
    free(wv); free(grp); free(bg); free(bu); free(bd);
}

/* Every expert weight of A takes oneDNN (rows computed independently of the batch, gemm.h). */
static int cpu_experts_rows_exact(m2d_backend *be, const m2d_moe_args *a) {
    cpu_be *c = CPU(be);
    m2d_gemm_ctx *g = gemm_ctx(c, a->prec);
    for (int e = 0; e < a->n_experts; e++) {
        m2d_gemm_w w[3] = {gemm_view(c, a->gate[e], 0, a->d_ff, a->prec), gemm_view(c, a->up[e], 0, a->d_ff, a->prec),
                           gemm_view(c, a->down[e], 0, a->x.cols, a->prec)};
        for (int i = 0; i < 3; i++)
            if (!m2d_gemm_rows_independent(g, &w[i])) return 0;
    }
    return 1;
}

/* The Gram in blocks of GRAM_TOKENS tokens, one pool item each (fixed blocks: the same sums on any
 * thread count): the block's sum in fp64 into its own partial, then the partials added into g in
 * block order.
 *  FP32: F_t converted to fp64 exactly; dsyrk accumulates in fp64 (SPEC §1): error ~ fp64 rounding.
 *  BF16: each token's F_t F_t^T as an fp32 GEMM over d terms, then added into fp64. Error of an
 *    entry, per token: |delta| <= gamma_d sum_j |f_ij f_kj| (gamma_d = d u / (1 - d u), u = 2^-24;
 *    1.2e-4 relative at d = 2048 in the worst case, ~u sqrt(d) = 3e-6 typically), and no growth
 *    with the number of tokens (fp64 from there on). The expert outputs themselves carry bf16's
 *    ~1e-3 relative error, so the statistics stay as right as their inputs; in exchange no fp64
 *    copy of the outputs and fp32 GEMM speed (tested against the fp64 reference: test_engine). */
#define GRAM_TOKENS 16

typedef struct {
    cpu_be *c;
    const m2d_mat *f;
    int E, d;
    m2d_precision prec;
    double *part;  /* [blocks, E, E] */
    double **tmp;  /* per worker: fp64 copy of a block (FP32) */
    float **gt;    /* per worker: one token's fp32 Gram (BF16) */
} gram_job;

static void gram_block_f64(const gram_job *j, int t0, int nt, double *part) {
    int E = j->E, d = j->d;
    double *A = j->tmp[m2d_pool_worker()];
    for (int e = 0; e < E; e++)
        for (int t = 0; t < nt; t++) {
            const float *src = F(j->f) + (size_t)(t0 + t) * j->f->ld + (size_t)e * d;
            double *dst = A + (size_t)e * nt * d + (size_t)t * d;
            for (int i = 0; i < d; i++) dst[i] = src[i];
        }
    cblas_dsyrk(CblasRowMajor, CblasUpper, CblasNoTrans, E, nt * d, 1.0, A, nt * d, 0.0, part, E);
}

static void gram_block_f32(const gram_job *j, int t0, int nt, double *part) {
    int E = j->E, d = j->d;
    float *gt = j->gt[m2d_pool_worker()];
    memset(part, 0, sizeof(double) * (size_t)E * E);
    for (int t = 0; t < nt; t++) {
        const float *ft = F(j->f) + (size_t)(t0 + t) * j->f->ld;
        m2d_gemm_w w = m2d_gemm_weight(M2D_F32, ft, E, d, d);
        if (m2d_gemm(gemm_ctx(j->c, M2D_PREC_FP32), ft, d, E, &w, gt, E, 0.0f)) {
            fail(j->c); /* nested in a pool item: the first failure is kept */
            return;
        }
        for (int r = 0; r < E; r++)
            for (int q = r; q < E; q++) part[(size_t)r * E + q] += gt[(size_t)r * E + q];
    }
}

static void gram_item(void *ctx, int b) {
    const gram_job *j = ctx;
    int t0 = b * GRAM_TOKENS, nt = M2D_MIN(GRAM_TOKENS, j->f->rows - t0);
    double *part = j->part + (size_t)b * j->E * j->E;
    if (j->prec == M2D_PREC_BF16) gram_block_f32(j, t0, nt, part);
    else gram_block_f64(j, t0, nt, part);
}

static void cpu_gram(m2d_backend *be, const m2d_mat *f, int E, m2d_buf *gb, m2d_precision prec) {
    cpu_be *c = CPU(be);
    int n = f->rows, d = f->cols / E, blocks = (n + GRAM_TOKENS - 1) / GRAM_TOKENS, nw = c->threads;
    if (c->failed || n <= 0) return;
    gram_job j = {c, f, E, d, prec, m2d_malloc(sizeof(double) * (size_t)blocks * E * E),
                  m2d_calloc((size_t)nw, sizeof(double *)), m2d_calloc((size_t)nw, sizeof(float *))};
    for (int w = 0; w < nw; w++) {
        if (prec == M2D_PREC_BF16) j.gt[w] = m2d_malloc(sizeof(float) * (size_t)E * E);
        else j.tmp[w] = m2d_malloc(sizeof(double) * (size_t)E * GRAM_TOKENS * d);
    }
    parallel_for(c, blocks, gram_item, &j);
    double *g = B(gb);
    for (int b = 0; b < blocks && !c->failed; b++)
        for (int r = 0; r < E; r++)
            for (int q = r; q < E; q++) g[(size_t)r * E + q] += j.part[((size_t)b * E + r) * E + q];
    for (int w = 0; w < nw; w++) {
        free(j.tmp[w]);
        free(j.gt[w]);
    }
    free(j.tmp); free(j.gt); free(j.part);
}

static m2d_precision cpu_auto_precision(m2d_backend *be, m2d_precision p) {
    (void)be;
    return m2d_gemm_resolve(p);
}

/* ---- lifecycle, knobs, OpenBLAS threading ---- */

/* OpenBLAS is made single-threaded inside (our threads split the GEMMs; its own pool next to ours
 * only spins in sched_yield) and restored afterwards, so other code's direct cblas/LAPACKE calls
 * keep OpenBLAS's threading. Measured: same speed as leaving OpenBLAS single-threaded for good. */
static void cpu_enter(m2d_backend *be) {
    cpu_be *c = CPU(be);
    if (c->depth++ == 0) {
        c->blas_saved = openblas_get_num_threads();
        if (c->blas_saved != 1) openblas_set_num_threads(1);
    }
}

static int cpu_leave(m2d_backend *be) {
    cpu_be *c = CPU(be);
    if (--c->depth > 0) return 0;
    if (c->blas_saved != 1) openblas_set_num_threads(c->blas_saved);
    if (!c->failed) return 0;
    c->failed = 0;
    return m2d_err("backend cpu: %s", c->err);
}

void m2d_backend_host_blas_threads(int n_threads) { openblas_set_num_threads(n_threads > 0 ? n_threads : 1); }

static int cpu_tune(m2d_backend *be, const char *knob, int value) {
    cpu_be *c = CPU(be);
    if (strcmp(knob, "threads") == 0 && value > 0) m2d_pool_set_threads(c->pool, c->threads = value);
    else if (strcmp(knob, "expert_parallel") == 0 && (value == 0 || value == 1)) c->expert_parallel = value;
    else if (strcmp(knob, "attention_gemm_min_rows") == 0 && value > 0) c->attn_gemm_min_rows = value;
    else if (strcmp(knob, "gemm_kernel") == 0 && value >= M2D_GEMM_AUTO && value <= M2D_GEMM_ONEDNN)
        for (int p = 0; p < 2; p++) m2d_gemm_set_kernel(c->gemm[p], (m2d_gemm_kernel)value);
    else return m2d_err("backend cpu: knob '%s' = %d: unknown knob or bad value (threads >= 1, expert_parallel 0|1, "
                        "attention_gemm_min_rows >= 1, gemm_kernel 0 auto|1 sgemm|2 onednn)", knob, value);
    return 0;
}

static void cpu_destroy(m2d_backend *be) {
    cpu_be *c = CPU(be);
    for (int i = 0; i < N_WORK; i++) free(c->work[i]);
    cache_free(&c->cache);
    for (int p = 0; p < 2; p++) m2d_gemm_ctx_free(c->gemm[p]);
    m2d_pool_free(c->pool);
    free(c);
}

static const m2d_backend_ops cpu_ops = {
    .name = "cpu",
    .precisions = 1u << M2D_PREC_FP32 | 1u << M2D_PREC_BF16,
    .caps = M2D_CAPS_ALL, /* the reference backend implements every op and variant */
    .destroy = cpu_destroy,
    .tune = cpu_tune,
    .enter = cpu_enter,
    .leave = cpu_leave,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .upload = cpu_upload,
    .download = cpu_download,
    .download_mat = cpu_download_mat,
    .host_view = cpu_host_view,
    .weight_new = cpu_weight_new,
    .weight_free = cpu_weight_free,
    .resident_bytes = cpu_resident_bytes,
    .make_resident = cpu_make_resident,
    .resident_budget = cpu_resident_budget,
    .weight_f32 = cpu_weight_f32,
    .embed = cpu_embed,
    .gemm = cpu_gemm,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .attention = cpu_attention,
    .kv_append = cpu_kv_append,
    .glu = cpu_glu,
    .glu_clamp = cpu_glu_clamp,
    .add_bias = cpu_add_bias,
    .add = cpu_add,
    .clamp = cpu_clamp,
    .sigmoid_scale = cpu_sigmoid_scale,
    .route = cpu_route,
    .moe = cpu_moe,
    .logprobs = cpu_logprobs,
    .experts_all = cpu_experts_all,
    .experts_rows_exact = cpu_experts_rows_exact,
    .gram = cpu_gram,
    .auto_precision = cpu_auto_precision,
    .train = &m2d_cpu_train_ops,
};

static int cpu_create(const m2d_backend_opts *o, m2d_backend **out) {
    cpu_be *c = m2d_calloc(1, sizeof *c);
    c->base.ops = &cpu_ops;
    pthread_mutex_init(&c->cache.mu, NULL);
    c->threads = o->n_threads > 0 ? o->n_threads : m2d_default_threads();
    c->pool = m2d_pool_new(c->threads);
    c->expert_parallel = 1;
    c->attn_gemm_min_rows = 64;
    c->resident = m2d_gemm_resolve(o->precision);
    *out = &c->base;
    if (m2d_gemm_ctx_new(M2D_PREC_FP32, c->pool, &c->gemm[0]) || m2d_gemm_ctx_new(M2D_PREC_BF16, c->pool, &c->gemm[1])) {
        cpu_destroy(*out);
        *out = NULL;
        return -1;
    }
    return 0;
}

M2D_BACKEND(cpu, "cpu", "host CPU: oneDNN fp32/bf16 matmul (sgemm for tiny weights), weights as stored or prepared, pthreads",
            cpu_create)

/* ---- shared with the training ops (backend_cpu.h) ---- */
void *m2d_cpu_ptr(const m2d_buf *b) { return B(b); }
float *m2d_cpu_mat(const m2d_mat *m) { return F(m); }
int m2d_cpu_threads(const m2d_backend *be) { return ((const cpu_be *)be)->threads; }
void m2d_cpu_parallel_for(const m2d_backend *be, int n, void (*fn)(void *, int), void *ctx) {
    parallel_for((const cpu_be *)be, n, fn, ctx);
}
const float *m2d_cpu_weight_rows(m2d_backend *be, const m2d_weight *w, int64_t first, int64_t n) {
    return wrows(CPU(be), w, first, n);
}

/* the handle and the tensor it reads live in one allocation: weight_free releases both */
typedef struct {
    cpu_weight w; /* first: the handle's address */
    m2d_tensor t;
} cpu_weight_view;

m2d_weight *m2d_cpu_weight_over(const float *data, int64_t rows, int64_t cols) {
    cpu_weight_view *v = m2d_calloc(1, sizeof *v);
    v->t = (m2d_tensor){.name = "view", .dtype = M2D_F32, .ndim = 2, .shape = {rows, cols}, .data = data,
                        .nbytes = (size_t)(rows * cols) * sizeof(float)};
    v->w.t = &v->t;
    return (m2d_weight *)&v->w;
}
