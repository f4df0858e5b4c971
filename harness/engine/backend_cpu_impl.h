/* backend_cpu_impl — what the files of the "cpu" backend's forward ops share: the backend's
 * state, buffer and weight handles, their accessors, the work buffers, the small row kernels
 * (inline: splitting the op families into files costs no call per row), and each file's ops for
 * the table in backend_cpu.c. Files: backend_cpu.c (state, memory, weights, GEMM, lifecycle, the
 * table), backend_cpu_rows.c (norms, RoPE, elementwise, embedding, KV cache, LM head
 * log-probabilities), backend_cpu_attn.c (attention), backend_cpu_moe.c (routing, MoE experts,
 * calibration's all-experts pass and Gram). Internal to the "cpu" backend; nothing else includes it. */
#ifndef M2D_BACKEND_CPU_IMPL_H
#define M2D_BACKEND_CPU_IMPL_H

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/util.h"
#include "engine/backend.h"
#include "engine/backend_cpu.h"
#include "engine/gemm.h"
#include "engine/pool.h"
#include "engine/vexp.h"

/* rows of one pool item in row-parallel elementwise loops */
#define ROW_BLOCK 16

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
    int as_stored;           /* make_resident kept it as stored: a copy would change its bits */
} cpu_weight;

/* The op-sized buffers an op reuses from the last one (in floats): fresh 10–100 MB mallocs would be
 * new mappings each time, and their page faults and zeroing were ~6 % of calibration time. One op
 * runs at a time per backend, so each slot has one user; the MoE hook runs between ops. */
enum { WORK_WEIGHT, WORK_ROWS, WORK_OUT, WORK_GATE, WORK_UP, WORK_ATTN, N_WORK };

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
    void *train_state;      /* the training ops' (m2d_cpu_train_state): read inside enter/leave only,
                             * marked stale at the outermost leave */
    int failed;             /* an op failed since the outermost enter: err holds its message */
    char err[512];
} cpu_be;

static inline cpu_be *CPU(m2d_backend *be) { return (cpu_be *)be; }
static inline float *F(const m2d_mat *m) { return (float *)((const cpu_buf *)m->buf)->p + m->off; }
static inline void *B(const m2d_buf *b) { return ((const cpu_buf *)b)->p; }
static inline const cpu_weight *W(const m2d_weight *w) { return (const cpu_weight *)w; }

/* fn(ctx, item) for item in [0, n_items) on the backend's pool (engine/pool.h: nested calls run
 * serially on the calling worker) */
static inline void parallel_for(const cpu_be *c, int n_items, void (*fn)(void *ctx, int item), void *ctx) {
    m2d_pool_for(c->pool, n_items, fn, ctx);
}

/* ---- work buffers, failures, weights as the GEMM module reads them (backend_cpu.c) ---- */
static inline int in_place(const m2d_tensor *t) { return t->dtype == M2D_F32 && ((uintptr_t)t->data & 3) == 0; }

/* Slot SLOT's buffer of at least N floats (its old contents are not kept when it grows). */
static inline float *work(cpu_be *c, int slot, size_t n) {
    if (n > c->work_cap[slot]) {
        free(c->work[slot]);
        c->work[slot] = m2d_malloc(n * sizeof(float));
        c->work_cap[slot] = n;
    }
    return c->work[slot];
}

static inline float *scratch(cpu_be *c, size_t n) { return work(c, WORK_WEIGHT, n); } /* weight rows converted */

/* the first failure of an op since the outermost enter, reported by leave */
static inline void fail(cpu_be *c) {
    if (!c->failed) snprintf(c->err, sizeof c->err, "%s", m2d_errmsg());
    c->failed = 1;
}

static inline m2d_gemm_ctx *gemm_ctx(const cpu_be *c, m2d_precision p) { return c->gemm[p == M2D_PREC_BF16]; }

static inline int is_matrix(const m2d_tensor *t) { return t->ndim == 2; }

/* Rows [r0, r0+n) of W for the GEMM module: the prepared copy when it was made for PREC, for the
 * kernel W takes now (a gemm_kernel knob set after make_resident leaves older copies unused) and
 * the rows are a view of it (slice-aligned; same bits as the stored rows), else the stored rows. */
static inline m2d_gemm_w gemm_view(const cpu_be *c, const m2d_weight *wh, int64_t r0, int n, m2d_precision prec) {
    const cpu_weight *w = W(wh);
    if (w->packed && prec == c->resident && r0 % M2D_GEMM_SLICE == 0 &&
        (n % M2D_GEMM_SLICE == 0 || r0 + n == w->t->shape[0])) {
        m2d_gemm_w whole = m2d_gemm_tensor_rows(w->t, 0, (int)w->t->shape[0]);
        if (m2d_gemm_packed_current(gemm_ctx(c, prec), w->packed, &whole)) return m2d_gemm_packed_rows(w->packed, (int)r0, n);
    }
    return m2d_gemm_tensor_rows(w->t, r0, n);
}

/* ---- row kernels the op families share ---- */

/* in-place softmax of one row (max-subtracted, sum in double); with SINK (not NULL) one more
 * logit *SINK joins the max and the denominator (an attention sink: its probability is dropped) */
static inline void softmax_sink(float *x, int n, const float *sink) {
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

static inline void softmax_row(float *x, int n) { softmax_sink(x, n, NULL); }

/* SwiGLU itself: m2d_vexp_swiglu (vexp.h). GPT-OSS's clamped SwiGLU (modelling_gpt_oss.py GptOssExperts._apply_gate), h may be g */
static inline void swiglu_clamp(const float *g, const float *u, int64_t n, float alpha, float limit, float *h) {
    for (int64_t i = 0; i < n; i++) {
        float a = fminf(g[i], limit), b = fminf(fmaxf(u[i], -limit), limit);
        h[i] = (b + 1.0f) * (a / (1.0f + expf(-alpha * a)));
    }
}

static inline void add_rows(float *y, int ld, int rows, int cols, const float *b) {
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < cols; i++) y[(size_t)r * ld + i] += b[i];
}

static inline int row_blocks(int n) { return (n + ROW_BLOCK - 1) / ROW_BLOCK; }
/* fp32 view of elements [first, first+n) of W (backend_cpu.h: m2d_cpu_weight_rows) */
static inline const float *wrows(cpu_be *c, const m2d_weight *wh, int64_t first, int64_t n) {
    return m2d_cpu_weight_rows(&c->base, wh, first, n);
}

/* ---- the ops, by file (the table is in backend_cpu.c) ---- */

/* backend_cpu.c */
void m2d_cpu_weight_f32(m2d_backend *be, const m2d_weight *wh, int64_t first, int64_t n, float *dst);

/* backend_cpu_rows.c */
void m2d_cpu_add(m2d_backend *be, m2d_mat *y, const m2d_mat *x);
void m2d_cpu_add_bias(m2d_backend *be, m2d_mat *y, const m2d_weight *b);
void m2d_cpu_clamp(m2d_backend *be, m2d_mat *x, float limit);
void m2d_cpu_embed(m2d_backend *be, const m2d_weight *table, const m2d_buf *tokens, int n, m2d_mat *x);
void m2d_cpu_glu(m2d_backend *be, m2d_ffn_act act, m2d_mat *g, const m2d_mat *u);
void m2d_cpu_glu_clamp(m2d_backend *be, m2d_mat *g, const m2d_mat *u, float alpha, float limit);
void m2d_cpu_kv_append(m2d_backend *be, m2d_buf *kc, m2d_buf *vc, size_t off, size_t head_stride, int pos0,
                       const m2d_mat *k, const m2d_mat *v, int n_kv, int hd);
void m2d_cpu_logprobs(m2d_backend *be, const m2d_mat *hid, const m2d_weight *head, int V, const m2d_buf *targetsb,
                      m2d_buf *lpb, m2d_precision prec);
void m2d_cpu_rmsnorm(m2d_backend *be, const m2d_mat *x, const m2d_weight *w, double eps, m2d_mat *y);
void m2d_cpu_rope(m2d_backend *be, m2d_mat *xm, int n_heads, int hd, const m2d_buf *posb, const m2d_rope_args *r);
void m2d_cpu_sigmoid_scale(m2d_backend *be, m2d_mat *y, const m2d_mat *sm);

/* backend_cpu_attn.c */
void m2d_cpu_attention(m2d_backend *be, const m2d_attn_args *a);

/* backend_cpu_moe.c */
void m2d_cpu_experts_all(m2d_backend *be, const m2d_moe_args *a);
int m2d_cpu_experts_rows_exact(m2d_backend *be, const m2d_moe_args *a);
void m2d_cpu_gram(m2d_backend *be, const m2d_mat *f, int E, m2d_buf *gb, m2d_precision prec);
void m2d_cpu_experts_reduce(m2d_backend *be, const m2d_mat *f, int E, const m2d_buf *ids, int k1, m2d_buf *sel,
                            m2d_buf *sum_f, m2d_buf *norm2);
void m2d_cpu_moe(m2d_backend *be, const m2d_moe_args *a);
void m2d_cpu_route(m2d_backend *be, m2d_mat *logits, const m2d_route_args *r, m2d_buf *topkb, m2d_buf *gatesb);

#endif
