/* backend_cpu — the "cpu" backend: OpenBLAS sgemm (single-threaded between enter/leave) for every
 * matmul; all parallelism is this backend's own pthreads: GEMMs split by output columns (or rows),
 * attention by heads, MoE by experts.
 * One kind of thread only: with OpenBLAS's pool threads next to ours, idle pool threads spin in
 * sched_yield and took up to half of the time on tiny shapes (perf). Splitting a GEMM by output
 * columns/rows leaves each element's reduction order unchanged, so results do not depend on the
 * thread count. Thread count and tuning are per backend object (one per engine); this file is the
 * only one in the product that calls OpenBLAS's threading functions.
 *
 * Buffers are host memory; weights are the checkpoint's tensors (mmapped or in memory), used in
 * place when F32, else converted to fp32 on use into a reusable scratch buffer, or once and kept
 * (make_resident). Every kernel has an obviously-correct counterpart in tests/test_engine.c. */
#include "engine/backend.h"
#include "engine/backend_cpu.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/util.h"

typedef struct {
    void *p;
    size_t bytes;
} cpu_buf;

typedef struct {
    const m2d_tensor *t;
    float *f32; /* resident fp32 copy, or NULL */
} cpu_weight;

typedef struct {
    m2d_backend base;
    int threads;
    int expert_parallel;    /* MoE: whole experts per thread (1) or one expert at a time (0) */
    int attn_gemm_min_rows; /* segments of at least this many rows use the GEMM attention */
    int depth, blas_saved;  /* enter/leave nesting and OpenBLAS's thread count outside */
    float *scratch;         /* weight rows converted for the op in progress */
    size_t scratch_cap;
} cpu_be;

static cpu_be *CPU(m2d_backend *be) { return (cpu_be *)be; }
static float *F(const m2d_mat *m) { return (float *)((const cpu_buf *)m->buf)->p + m->off; }
static void *B(const m2d_buf *b) { return ((const cpu_buf *)b)->p; }
static const cpu_weight *W(const m2d_weight *w) { return (const cpu_weight *)w; }

/* ---- parallel for: a fresh set of pthreads per call (calls are per layer, so the
 * ~tens of microseconds of thread start-up are negligible next to the work) ---- */
typedef struct {
    void (*fn)(void *, int);
    void *ctx;
    int n;
    atomic_int next;
} pfor_job;

static _Thread_local int worker_id;
static _Thread_local int in_parallel; /* inside a parallel_for item: nested loops run serially */

typedef struct {
    pfor_job *job;
    int id;
} pfor_arg;

static void run_items(pfor_job *j) {
    for (int i; (i = atomic_fetch_add(&j->next, 1)) < j->n;) j->fn(j->ctx, i);
}

static void *pfor_thread(void *arg) {
    pfor_arg *a = arg;
    worker_id = a->id;
    in_parallel = 1;
    run_items(a->job);
    return NULL;
}

/* fn(ctx, item) for item in [0, n_items) on up to c->threads threads (items handed out
 * dynamically); m2d-style nesting: called from inside an item it runs serially on that worker. */
static void parallel_for(const cpu_be *c, int n_items, void (*fn)(void *ctx, int item), void *ctx) {
    pfor_job j = {fn, ctx, n_items, 0};
    int nt = M2D_MIN(M2D_MIN(c->threads, n_items), 64);
    if (nt <= 1 || in_parallel) {
        for (int i = 0; i < n_items; i++) fn(ctx, i);
        return;
    }
    pthread_t tid[64];
    pfor_arg args[64];
    int started = 0;
    for (int t = 1; t < nt; t++) {
        args[started] = (pfor_arg){&j, started + 1};
        if (pthread_create(&tid[started], NULL, pfor_thread, &args[started]) == 0) started++;
    }
    worker_id = 0;
    in_parallel = 1;
    run_items(&j); /* the calling thread works too; if no thread started it does everything */
    in_parallel = 0;
    for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);
}

/* ---- dtype conversion ---- */
static void convert_range(m2d_dtype t, const void *src, int64_t first, int64_t n, float *dst) {
    if (t == M2D_BF16) { /* bf16 is the top half of an fp32: widen and shift, 16 lanes at a time */
        typedef uint16_t v16u16 __attribute__((vector_size(32)));
        typedef uint32_t v16u32 __attribute__((vector_size(64)));
        const uint16_t *s = (const uint16_t *)src + first;
        uint32_t *d = (uint32_t *)dst;
        int64_t i = 0;
        for (; i + 16 <= n; i += 16) {
            v16u16 a;
            memcpy(&a, s + i, sizeof a);
            v16u32 b = __builtin_convertvector(a, v16u32) << 16;
            memcpy(d + i, &b, sizeof b);
        }
        for (; i < n; i++) d[i] = (uint32_t)s[i] << 16;
    } else {
        m2d_to_f32(t, src, first, n, dst);
    }
}

typedef struct {
    m2d_dtype t;
    const void *src;
    int64_t first, n, chunk;
    float *dst;
} conv_job;

static void conv_item(void *ctx, int item) {
    conv_job *j = ctx;
    int64_t a = (int64_t)item * j->chunk, b = M2D_MIN(a + j->chunk, j->n);
    convert_range(j->t, j->src, j->first + a, b - a, j->dst + a);
}

/* n elements from FIRST to fp32, in parallel chunks of 256 Ki elements */
static void convert_par(const cpu_be *c, m2d_dtype t, const void *src, int64_t first, int64_t n, float *dst) {
    const int64_t chunk = 1 << 18;
    if (n <= chunk || c->threads <= 1) {
        convert_range(t, src, first, n, dst);
        return;
    }
    conv_job j = {t, src, first, n, chunk, dst};
    parallel_for(c, (int)((n + chunk - 1) / chunk), conv_item, &j);
}

/* ---- weights ---- */
static int in_place(const m2d_tensor *t) { return t->dtype == M2D_F32 && ((uintptr_t)t->data & 3) == 0; }

static float *scratch(cpu_be *c, size_t n) {
    if (n > c->scratch_cap) {
        free(c->scratch);
        c->scratch = m2d_malloc(n * sizeof(float));
        c->scratch_cap = n;
    }
    return c->scratch;
}

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

/* the whole of W for a parallel worker: converted single-threaded into BUF (the workers are the
 * parallelism) unless in place or resident */
static const float *wall_1t(const m2d_weight *wh, float *buf) {
    const cpu_weight *w = W(wh);
    if (in_place(w->t)) return w->t->data;
    if (w->f32) return w->f32;
    convert_range(w->t->dtype, w->t->data, 0, m2d_tensor_numel(w->t), buf);
    return buf;
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
    free(wh);
}

static size_t cpu_resident_bytes(m2d_backend *be, const m2d_weight *wh) {
    (void)be;
    const cpu_weight *w = W(wh);
    return in_place(w->t) || w->f32 ? 0 : (size_t)m2d_tensor_numel(w->t) * sizeof(float);
}

static int cpu_make_resident(m2d_backend *be, m2d_weight *wh) {
    cpu_weight *w = (cpu_weight *)wh;
    if (in_place(w->t) || w->f32) return 0;
    int64_t n = m2d_tensor_numel(w->t);
    w->f32 = m2d_malloc((size_t)n * sizeof(float));
    convert_par(CPU(be), w->t->dtype, w->t->data, 0, n, w->f32);
    return 0;
}

/* default: keep an fp32 copy only when it is small next to RAM (1/8): +10..30% speed measured on
 * tiny models, while big checkpoints stay mmapped in their stored dtype */
static size_t cpu_resident_budget(m2d_backend *be) {
    (void)be;
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    return pages > 0 && psz > 0 ? (size_t)pages * (size_t)psz / 8 : 0;
}

static void cpu_weight_f32(m2d_backend *be, const m2d_weight *wh, int64_t first, int64_t n, float *dst) {
    const cpu_weight *w = W(wh);
    if (w->f32) memcpy(dst, w->f32 + first, (size_t)n * sizeof(float));
    else convert_par(CPU(be), w->t->dtype, w->t->data, first, n, dst);
}

/* ---- memory ---- */
static m2d_buf *cpu_alloc(m2d_backend *be, size_t bytes) {
    (void)be;
    cpu_buf *b = m2d_calloc(1, sizeof *b);
    b->p = m2d_malloc(bytes ? bytes : 1);
    b->bytes = bytes;
    return (m2d_buf *)b;
}

static void cpu_release(m2d_backend *be, m2d_buf *b) {
    (void)be;
    if (!b) return;
    free(((cpu_buf *)b)->p);
    free(b);
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

/* ---- GEMM: y[n, out] = x[n, in] · w[out, in]^T + beta y (row strides ldx/ldw/ldy) ---- */
typedef struct {
    const float *x, *w;
    float *y, beta;
    int ldx, n, in, ldw, out, ldy, blk, by_cols;
} mm_job;

static void mm_item(void *ctx, int item) {
    const mm_job *j = ctx;
    int a = item * j->blk;
    if (j->by_cols) {
        int nc = M2D_MIN(j->blk, j->out - a);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->n, nc, j->in, 1.0f, j->x, j->ldx,
                    j->w + (size_t)a * j->ldw, j->ldw, j->beta, j->y + a, j->ldy);
    } else {
        int nr = M2D_MIN(j->blk, j->n - a);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, j->out, j->in, 1.0f, j->x + (size_t)a * j->ldx,
                    j->ldx, j->w, j->ldw, j->beta, j->y + (size_t)a * j->ldy, j->ldy);
    }
}

static void matmul_wt(const cpu_be *c, const float *x, int ldx, int n, int in, const float *w, int ldw, int out,
                      float *y, int ldy, float beta) {
    if (n <= 0 || out <= 0) return;
    int nt = c->threads;
    if (nt <= 1 || in_parallel || 2.0 * n * out * in < 2e6) { /* small: thread start-up would dominate */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1.0f, x, ldx, w, ldw, beta, y, ldy);
        return;
    }
    mm_job j = {x, w, y, beta, ldx, n, in, ldw, out, ldy, 0, 0};
    /* split the weight's rows (output columns) in 64-aligned blocks when there are enough, else
     * the token rows; one block per thread */
    if (out >= 64 * nt) {
        j.by_cols = 1;
        j.blk = ((out + nt - 1) / nt + 63) / 64 * 64;
        parallel_for(c, (out + j.blk - 1) / j.blk, mm_item, &j);
    } else {
        j.blk = (n + nt - 1) / nt;
        parallel_for(c, (n + j.blk - 1) / j.blk, mm_item, &j);
    }
}

static void cpu_gemm(m2d_backend *be, const m2d_mat *x, const m2d_weight *w, int w_row0, m2d_mat *y, float beta,
                     m2d_precision prec) {
    (void)prec; /* fp32 only (precisions) */
    cpu_be *c = CPU(be);
    int in = x->cols;
    const float *wr = wrows(c, w, (int64_t)w_row0 * in, (int64_t)y->cols * in);
    matmul_wt(c, F(x), x->ld, x->rows, in, wr, in, y->cols, F(y), y->ld, beta);
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

typedef struct {
    const attn_host *a;
    int nk;
    float *S; /* one [nq, nk] score block per worker */
} attg_job;

/* The GEMM formulation, one head per item: S = Q K^T (the full [nq, np+nq] block; the causal
 * upper part, and with a window the part before it, is computed and then zeroed: 2x work on the
 * segment part but at sgemm speed), masked softmax, O = P V. */
static void attg_item(void *ctx, int h) {
    const attg_job *jb = ctx;
    const attn_host *j = jb->a;
    int g = h / (j->n_heads / j->n_kv), hd = j->hd, nq = j->nq, np = j->np, nk = jb->nk;
    float *S = jb->S + (size_t)worker_id * nq * nk;
    float scale = j->scale;
    const float *qh = j->q + (size_t)h * hd;
    if (np)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, np, hd, scale, qh, j->ldq, j->kp + g * j->p_head_stride,
                    hd, 0.0f, S, nk);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nq, hd, scale, qh, j->ldq, j->ks + (size_t)g * hd, j->ldk,
                0.0f, S + np, nk);
    for (int i = 0; i < nq; i++) { /* causal (and window) mask + softmax */
        float *row = S + (size_t)i * nk;
        int valid = np + i + 1, lo = first_key(j, i);
        softmax_sink(row + lo, valid - lo, j->sinks ? j->sinks + h : NULL);
        memset(row, 0, sizeof(float) * (size_t)lo);
        memset(row + valid, 0, sizeof(float) * (size_t)(nk - valid));
    }
    float *oh = j->out + (size_t)h * hd;
    if (np)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, hd, np, 1.0f, S, nk, j->vp + g * j->p_head_stride, hd,
                    0.0f, oh, j->ldo);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, hd, nq, 1.0f, S + np, nk, j->vs + (size_t)g * hd, j->ldk,
                np ? 1.0f : 0.0f, oh, j->ldo);
}

static void cpu_attention(m2d_backend *be, const m2d_attn_args *a) {
    const cpu_be *c = CPU(be);
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
        int nk = a->np + nq, nw = M2D_MIN(c->threads, a->n_heads);
        attg_job j = {&h, nk, m2d_malloc(sizeof(float) * (size_t)nq * nk * (size_t)M2D_MAX(nw, 1))};
        parallel_for(c, a->n_heads, attg_item, &j);
        free(j.S);
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
    int maxm;   /* largest bucket */
} buckets;

static void bucket_by_expert(const int32_t *topk, int nk, int E, buckets *b) {
    b->count = m2d_calloc((size_t)E + 1, sizeof(int));
    for (int i = 0; i < nk; i++) b->count[topk[i] + 1]++;
    for (int e = 0; e < E; e++) b->count[e + 1] += b->count[e];
    int *fill = m2d_malloc(sizeof(int) * (size_t)E);
    memcpy(fill, b->count, sizeof(int) * (size_t)E);
    b->pair = m2d_malloc(sizeof(int) * (size_t)(nk ? nk : 1));
    for (int i = 0; i < nk; i++) b->pair[fill[topk[i]]++] = i;
    b->maxm = 0;
    for (int e = 0; e < E; e++) b->maxm = M2D_MAX(b->maxm, b->count[e + 1] - b->count[e]);
    free(fill);
}

static void gather_rows(const float *x, int ldx, const int *pair, int k, int m, int d, float *xs) {
    for (int r = 0; r < m; r++) memcpy(xs + (size_t)r * d, x + (size_t)(pair[r] / k) * ldx, sizeof(float) * d);
}

/* out[token of pair] += gate[pair] * y[r] for the m rows of one bucket */
static void scatter_add_rows(const float *ys, const int *pair, const float *gates, int k, int m, int d, float *out,
                             int ldo) {
    for (int r = 0; r < m; r++) {
        float gw = gates[pair[r]], *o = out + (size_t)(pair[r] / k) * ldo;
        const float *y = ys + (size_t)r * d;
        for (int j = 0; j < d; j++) o[j] += gw * y[j];
    }
}

/* Expert-parallel: each worker takes whole experts (gather, convert, three single-threaded sgemms)
 * and writes the outputs to Y in bucket order; the caller scatter-adds afterwards in expert order,
 * so the result does not depend on the thread count or the schedule. With ~n·k/E rows per expert
 * (32 for 512 tokens on Qwen3-30B-A3B) the GEMMs are too small to split well across threads;
 * whole experts per thread avoid that synchronisation. */
/* between an expert's GEMMs: g = act(g + bg, u + bu) over MN rows (biases when given); BB
 * scratch for a bias of max(d, d_e) elements */
static void expert_act(const m2d_moe_args *a, int ex, int mn, float *g, float *u, float *bb) {
    int de = a->d_ff;
    if (a->gate_bias) add_rows(g, de, mn, de, wall_1t(a->gate_bias[ex], bb));
    if (a->up_bias) add_rows(u, de, mn, de, wall_1t(a->up_bias[ex], bb));
    if (a->act == M2D_ACT_SWIGLU_CLAMP) swiglu_clamp(g, u, (int64_t)mn * de, a->act_alpha, a->act_limit, g);
    else swiglu(g, u, (int64_t)mn * de, g);
}

static void expert_down_bias(const m2d_moe_args *a, int ex, int mn, float *y, float *bb) {
    int d = a->x.cols;
    if (a->down_bias) add_rows(y, d, mn, d, wall_1t(a->down_bias[ex], bb));
}

/* Expert-parallel: each worker takes whole experts (gather, convert, three single-threaded sgemms)
 * and writes the outputs to Y in bucket order; the caller scatter-adds afterwards in expert order,
 * so the result does not depend on the thread count or the schedule. With ~n·k/E rows per expert
 * (32 for 512 tokens on Qwen3-30B-A3B) the GEMMs are too small to split well across threads;
 * whole experts per thread avoid that synchronisation. */
typedef struct {
    const cpu_be *c;
    const m2d_moe_args *a;
    const buckets *b;
    const int *active;
    float *Y;
    float **xs, **g, **u, **w0, **w1, **w2, **bb; /* per worker */
} moe_job;

static void moe_item(void *ctx, int item) {
    const moe_job *j = ctx;
    const m2d_moe_args *a = j->a;
    int w = worker_id, ex = j->active[item], d = a->x.cols, de = a->d_ff, k = a->k;
    int m0 = j->b->count[ex], mn = j->b->count[ex + 1] - m0;
    float *xs = j->xs[w], *g = j->g[w], *u = j->u[w], *y = j->Y + (size_t)m0 * d;
    gather_rows(F(&a->x), a->x.ld, j->b->pair + m0, k, mn, d, xs);
    matmul_wt(j->c, xs, d, mn, d, wall_1t(a->gate[ex], j->w0[w]), d, de, g, de, 0.0f);
    matmul_wt(j->c, xs, d, mn, d, wall_1t(a->up[ex], j->w1[w]), d, de, u, de, 0.0f);
    expert_act(a, ex, mn, g, u, j->bb[w]);
    matmul_wt(j->c, g, de, mn, de, wall_1t(a->down[ex], j->w2[w]), de, d, y, d, 0.0f);
    expert_down_bias(a, ex, mn, y, j->bb[w]);
}

static void experts_parallel(const cpu_be *c, const m2d_moe_args *a, const buckets *b, float *Y) {
    int nt = c->threads, na = 0, E = a->n_experts, d = a->x.cols, de = a->d_ff;
    int *active = m2d_malloc(sizeof(int) * (size_t)E);
    for (int ex = 0; ex < E; ex++)
        if (b->count[ex + 1] > b->count[ex]) active[na++] = ex;
    moe_job j = {c, a, b, active, Y, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    float **bufs = m2d_calloc((size_t)nt * 7, sizeof(float *));
    j.xs = bufs; j.g = bufs + nt; j.u = bufs + 2 * nt; j.w0 = bufs + 3 * nt; j.w1 = bufs + 4 * nt; j.w2 = bufs + 5 * nt;
    j.bb = bufs + 6 * nt;
    for (int t = 0; t < nt; t++) {
        j.xs[t] = m2d_malloc(sizeof(float) * (size_t)b->maxm * d);
        j.g[t] = m2d_malloc(sizeof(float) * (size_t)b->maxm * de);
        j.u[t] = m2d_malloc(sizeof(float) * (size_t)b->maxm * de);
        for (int s = 0; s < 3; s++) j.w0[t + s * nt] = m2d_malloc(sizeof(float) * (size_t)de * d);
        j.bb[t] = m2d_malloc(sizeof(float) * (size_t)M2D_MAX(d, de));
    }
    parallel_for(c, na, moe_item, &j); /* GEMMs inside an item run on that worker alone */
    for (int t = 0; t < 7 * nt; t++) free(bufs[t]);
    free(bufs);
    free(active);
}

/* one expert at a time, each GEMM split over all threads (weights converted in parallel) */
static void experts_serial(cpu_be *c, const m2d_moe_args *a, const buckets *b, const float *gates, float *out) {
    int d = a->x.cols, de = a->d_ff, k = a->k, maxm = b->maxm;
    float *xs = m2d_malloc(sizeof(float) * (size_t)maxm * d), *ys = m2d_malloc(sizeof(float) * (size_t)maxm * d);
    float *g = m2d_malloc(sizeof(float) * (size_t)maxm * de), *u = m2d_malloc(sizeof(float) * (size_t)maxm * de);
    float *bb = m2d_malloc(sizeof(float) * (size_t)M2D_MAX(d, de));
    for (int ex = 0; ex < a->n_experts; ex++) {
        int m0 = b->count[ex], mn = b->count[ex + 1] - m0;
        if (mn == 0) continue;
        gather_rows(F(&a->x), a->x.ld, b->pair + m0, k, mn, d, xs);
        matmul_wt(c, xs, d, mn, d, wrows(c, a->gate[ex], 0, (int64_t)de * d), d, de, g, de, 0.0f);
        matmul_wt(c, xs, d, mn, d, wrows(c, a->up[ex], 0, (int64_t)de * d), d, de, u, de, 0.0f);
        expert_act(a, ex, mn, g, u, bb);
        matmul_wt(c, g, de, mn, de, wrows(c, a->down[ex], 0, (int64_t)d * de), de, d, ys, d, 0.0f);
        expert_down_bias(a, ex, mn, ys, bb);
        scatter_add_rows(ys, b->pair + m0, gates, k, mn, d, out, a->out.ld);
    }
    free(xs); free(ys); free(g); free(u); free(bb);
}

static void cpu_moe(m2d_backend *be, const m2d_moe_args *a) {
    cpu_be *c = CPU(be);
    int n = a->x.rows, d = a->x.cols, k = a->k;
    const float *gates = B(a->gates);
    float *out = F(&a->out);
    buckets b;
    bucket_by_expert(B(a->topk), n * k, a->n_experts, &b);
    for (int t = 0; t < n; t++) memset(out + (size_t)t * a->out.ld, 0, sizeof(float) * d);
    if (c->expert_parallel && c->threads > 1) {
        float *Y = m2d_malloc(sizeof(float) * (size_t)n * k * d); /* expert outputs, bucket order */
        experts_parallel(c, a, &b, Y);
        for (int ex = 0; ex < a->n_experts; ex++) {
            int m0 = b.count[ex];
            scatter_add_rows(Y + (size_t)m0 * d, b.pair + m0, gates, k, b.count[ex + 1] - m0, d, out, a->out.ld);
        }
        free(Y);
    } else {
        experts_serial(c, a, &b, gates, out);
    }
    free(b.count);
    free(b.pair);
}

/* ---- LM head log-probabilities ---- */
#define LM_CHUNK 4096 /* vocab rows of the LM head converted and multiplied at a time */
#define LM_ROWS 256   /* hidden rows per GEMM block */

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

/* streaming over vocab chunks: never more than [LM_ROWS, LM_CHUNK] logits at once */
static void cpu_logprobs(m2d_backend *be, const m2d_mat *hid, const m2d_weight *head, int V, const m2d_buf *targetsb,
                         m2d_buf *lpb, m2d_precision prec) {
    (void)prec;
    cpu_be *c = CPU(be);
    int n = hid->rows, d = hid->cols;
    const int32_t *targets = B(targetsb);
    double *lp = B(lpb);
    float *blk = m2d_malloc(sizeof(float) * (size_t)M2D_MIN(LM_ROWS, n) * LM_CHUNK);
    double *mx = m2d_malloc(sizeof(double) * (size_t)n), *sum = m2d_calloc((size_t)n, sizeof(double));
    double *tgt = m2d_malloc(sizeof(double) * (size_t)n);
    for (int i = 0; i < n; i++) mx[i] = -INFINITY;
    for (int v0 = 0; v0 < V; v0 += LM_CHUNK) {
        int nv = M2D_MIN(LM_CHUNK, V - v0);
        const float *w = wrows(c, head, (int64_t)v0 * d, (int64_t)nv * d);
        for (int r0 = 0; r0 < n; r0 += LM_ROWS) {
            int nr = M2D_MIN(LM_ROWS, n - r0);
            matmul_wt(c, F(hid) + (size_t)r0 * hid->ld, hid->ld, nr, d, w, d, nv, blk, nv, 0.0f);
            for (int r = 0; r < nr; r++)
                lse_update(blk + (size_t)r * nv, nv, v0, targets[r0 + r], &mx[r0 + r], &sum[r0 + r], &tgt[r0 + r]);
        }
    }
    for (int i = 0; i < n; i++) lp[i] = tgt[i] - mx[i] - log(sum[i]);
    free(blk); free(mx); free(sum); free(tgt);
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
    if (--c->depth == 0 && c->blas_saved != 1) openblas_set_num_threads(c->blas_saved);
    return 0;
}

void m2d_backend_host_blas_threads(int n_threads) { openblas_set_num_threads(n_threads > 0 ? n_threads : 1); }

static int cpu_tune(m2d_backend *be, const char *knob, int value) {
    cpu_be *c = CPU(be);
    if (strcmp(knob, "threads") == 0 && value > 0) c->threads = value;
    else if (strcmp(knob, "expert_parallel") == 0 && (value == 0 || value == 1)) c->expert_parallel = value;
    else if (strcmp(knob, "attention_gemm_min_rows") == 0 && value > 0) c->attn_gemm_min_rows = value;
    else return m2d_err("backend cpu: knob '%s' = %d: unknown knob or bad value (threads >= 1, expert_parallel 0|1, "
                        "attention_gemm_min_rows >= 1)", knob, value);
    return 0;
}

static void cpu_destroy(m2d_backend *be) {
    cpu_be *c = CPU(be);
    free(c->scratch);
    free(c);
}

static const m2d_backend_ops cpu_ops = {
    .name = "cpu",
    .precisions = 1u << M2D_PREC_FP32,
    .destroy = cpu_destroy,
    .tune = cpu_tune,
    .enter = cpu_enter,
    .leave = cpu_leave,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .upload = cpu_upload,
    .download = cpu_download,
    .download_mat = cpu_download_mat,
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
    .train = &m2d_cpu_train_ops,
};

static int cpu_create(const m2d_backend_opts *o, m2d_backend **out) {
    cpu_be *c = m2d_calloc(1, sizeof *c);
    c->base.ops = &cpu_ops;
    c->threads = o->n_threads > 0 ? o->n_threads : m2d_default_threads();
    c->expert_parallel = 1;
    c->attn_gemm_min_rows = 64;
    *out = &c->base;
    return 0;
}

M2D_BACKEND(cpu, "cpu", "host CPU: OpenBLAS sgemm on fp32 (weights converted on use or kept), pthreads", cpu_create)

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
