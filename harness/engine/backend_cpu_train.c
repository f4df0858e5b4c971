/* backend_cpu_train — the "cpu" backend's training ops (m2d_backend_train_ops, backend.h): the
 * backward of each forward op, the distillation losses and AdamW, on the same threads as the
 * forward ops (backend_cpu.c): the backward GEMMs in fp32 through OpenBLAS sgemm, or on bf16
 * operands (--train-precision bf16) through the GEMM module (engine/gemm.h: oneDNN's bf16 kernels,
 * AMX or AVX512-BF16, where the CPU has them) on transposed operands.
 *
 * Determinism: every reduction runs in a fixed order whatever the thread count. GEMMs are split
 * into blocks whose sizes depend on the shapes only (never on the thread count), along output
 * rows or columns, so each element's sum over the reduction dimension is one sgemm's; sums across
 * rows (a norm weight's gradient, the GQA heads sharing a key/value head, the gradient norm) are
 * formed per fixed-size chunk and the chunks added in order. The obviously-correct counterparts
 * are the float64 references and finite differences in tests/test_train_ops.c. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/tensor.h"
#include "base/util.h"
#include "engine/backend.h"
#include "engine/backend_cpu.h"
#include "engine/gemm.h"

#define F m2d_cpu_mat
#define GEMM_SERIAL_FLOPS 2e6 /* below this a GEMM runs as one call */
#define ROW_CHUNK 64          /* rows per item of row-parallel kernels (fixed: schedule-independent) */
#define SUM_CHUNK (1 << 16)   /* elements per partial sum of sumsq and per item of elementwise kernels */

static m2d_weight *cpu_weight_view(m2d_backend *be, m2d_buf *buf, size_t off, int64_t rows, int64_t cols) {
    (void)be;
    return m2d_cpu_weight_over((const float *)m2d_cpu_ptr(buf) + off, rows, cols);
}

static void cpu_fill(m2d_backend *be, m2d_buf *buf, size_t off, size_t n, float value) {
    (void)be;
    float *p = (float *)m2d_cpu_ptr(buf) + off;
    if (value == 0.0f) memset(p, 0, n * sizeof(float));
    else
        for (size_t i = 0; i < n; i++) p[i] = value;
}

static void cpu_copy(m2d_backend *be, m2d_mat *dst, const m2d_mat *src) {
    (void)be;
    for (int r = 0; r < src->rows; r++)
        memcpy(F(dst) + (size_t)r * dst->ld, F(src) + (size_t)r * src->ld, sizeof(float) * (size_t)src->cols);
}

/* ---- GEMMs in fp32: blocks of a size fixed by the shape ---- */

/* block size along a dimension of N: about N/16, rounded up to a multiple of 64 (at least 64) */
static int fixed_block(int n) {
    int b = (n + 15) / 16;
    return M2D_MAX(64, (b + 63) / 64 * 64);
}

typedef struct {
    const float *dy, *w, *x;
    float *out;
    float beta;
    int n, in, outd, lddy, ldx, ldo, blk, by_cols;
} bwd_gemm;

/* dx[n, in] = dy[n, out] · W[out, in] + beta dx, one block of columns of dx or of rows */
static void dx_item(void *ctx, int item) {
    const bwd_gemm *j = ctx;
    int a = item * j->blk;
    if (j->by_cols) {
        int nc = M2D_MIN(j->blk, j->in - a);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, j->n, nc, j->outd, 1.0f, j->dy, j->lddy, j->w + a,
                    j->in, j->beta, j->out + a, j->ldo);
    } else {
        int nr = M2D_MIN(j->blk, j->n - a);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nr, j->in, j->outd, 1.0f, j->dy + (size_t)a * j->lddy,
                    j->lddy, j->w, j->in, j->beta, j->out + (size_t)a * j->ldo, j->ldo);
    }
}

static void dx_fp32(m2d_backend *be, const m2d_mat *dy, const float *wr, m2d_mat *dx, float beta) {
    int n = dy->rows, outd = dy->cols, in = dx->cols;
    bwd_gemm j = {F(dy), wr, NULL, F(dx), beta, n, in, outd, dy->ld, 0, dx->ld, 0, 0};
    if (2.0 * n * outd * in < GEMM_SERIAL_FLOPS) {
        j.blk = n;
        dx_item(&j, 0);
        return;
    }
    j.by_cols = in >= 128;
    j.blk = fixed_block(j.by_cols ? in : n);
    int total = j.by_cols ? in : n;
    m2d_cpu_parallel_for(be, (total + j.blk - 1) / j.blk, dx_item, &j);
}

/* dw[out, in] = dy^T · x + beta dw, one block of rows of dw */
static void dw_item(void *ctx, int item) {
    const bwd_gemm *j = ctx;
    int a = item * j->blk, nr = M2D_MIN(j->blk, j->outd - a);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nr, j->in, j->n, 1.0f, j->dy + a, j->lddy, j->x, j->ldx,
                j->beta, j->out + (size_t)a * j->ldo, j->ldo);
}

static void dw_fp32(m2d_backend *be, const m2d_mat *dy, const m2d_mat *x, m2d_mat *dw, float beta) {
    int n = dy->rows, outd = dy->cols, in = x->cols;
    bwd_gemm j = {F(dy), NULL, F(x), F(dw), beta, n, in, outd, dy->ld, x->ld, dw->ld, outd, 0};
    if (2.0 * n * outd * in >= GEMM_SERIAL_FLOPS) j.blk = fixed_block(outd);
    m2d_cpu_parallel_for(be, (outd + j.blk - 1) / j.blk, dw_item, &j);
}

/* ---- GEMMs on bf16 operands: the GEMM module's Y = X·Wᵀ (oneDNN where the CPU has native bf16)
 * on transposed operands. It rounds X and W to bf16 itself (W as stored when already bf16); its
 * slices are fixed by the shape, so the results do not depend on the thread count. ---- */

#define T_TILE 32 /* square tiles of a transpose: rows and columns of one pool item */

typedef struct {
    const float *x;
    int ld, rows, cols;
    float *f32;     /* out [cols, rows]: fp32 */
    uint16_t *bf16; /* or bf16 bits (rounded to nearest even) */
} transpose_job;

/* one T_TILE x T_TILE tile: its rows read (and rounded, 16 lanes at a time) into a local tile, then
 * written down its columns, each a contiguous run of the output */
static void transpose_item(void *ctx, int item) {
    const transpose_job *j = ctx;
    int tiles_c = (j->cols + T_TILE - 1) / T_TILE;
    int r0 = item / tiles_c * T_TILE, c0 = item % tiles_c * T_TILE;
    int nr = M2D_MIN(T_TILE, j->rows - r0), nc = M2D_MIN(T_TILE, j->cols - c0);
    const float *x = j->x + (size_t)r0 * j->ld + c0;
    if (j->bf16) {
        uint16_t t[T_TILE * T_TILE];
        m2d_bf16_rows(x, j->ld, nr, nc, t);
        for (int c = 0; c < nc; c++) {
            uint16_t *o = j->bf16 + (size_t)(c0 + c) * j->rows + r0;
            for (int r = 0; r < nr; r++) o[r] = t[r * nc + c];
        }
    } else {
        for (int c = 0; c < nc; c++) {
            float *o = j->f32 + (size_t)(c0 + c) * j->rows + r0;
            for (int r = 0; r < nr; r++) o[r] = x[(size_t)r * j->ld + c];
        }
    }
}

/* X's rows x cols window (stride LD) transposed into OUT [cols, rows]: fp32 (F32) or bf16 (BF16) */
static void transpose(m2d_backend *be, const float *x, int ld, int rows, int cols, float *f32, uint16_t *bf16) {
    transpose_job j = {x, ld, rows, cols, f32, bf16};
    int items = ((rows + T_TILE - 1) / T_TILE) * ((cols + T_TILE - 1) / T_TILE);
    m2d_cpu_parallel_for(be, items, transpose_item, &j);
}

/* The training state (m2d_cpu_train_state), used inside enter/leave brackets only.
 * - The weights' bf16 transposes (Wᵀ [in, out], dx's operand), made at a weight's first dx of a
 *   step: one transpose serves every micro-batch and every row block of the LM head. They are
 *   marked stale when AdamW changes the weights and at the outermost leave (a weight may be written
 *   between brackets), and made again into the same memory at the next use: a step's 2 bytes a
 *   parameter are allocated once, not faulted in afresh every step.
 * - dW's transposed operands, grow-only: an LM head block's dyᵀ is 128 MiB. */
typedef struct {
    const m2d_weight *w;
    uint16_t *t;
    int64_t n;  /* elements of t */
    int fresh;  /* t is the current weights' transpose */
} wt_entry;

typedef struct {
    void *p;
    size_t cap; /* bytes */
} grow_buf;

typedef struct {
    wt_entry *e;
    int n, cap;
    grow_buf dyt, xt;
} train_state;

void m2d_cpu_train_state_stale(void *state) {
    train_state *c = state;
    for (int i = 0; c && i < c->n; i++) c->e[i].fresh = 0;
}

void m2d_cpu_train_state_free(void *state) {
    train_state *c = state;
    if (!c) return;
    for (int i = 0; i < c->n; i++) free(c->e[i].t);
    free(c->e);
    free(c->dyt.p);
    free(c->xt.p);
    free(c);
}

/* the state, or NULL outside a bracket */
static train_state *state_of(m2d_backend *be) {
    train_state **slot = (train_state **)m2d_cpu_train_state(be);
    if (slot && !*slot) *slot = m2d_calloc(1, sizeof **slot);
    return slot ? *slot : NULL;
}

/* BYTES of scratch: the state's grow-only B, or (no state: B NULL) a new buffer in *OWNED */
static void *step_buffer(grow_buf *b, size_t bytes, void **owned) {
    if (!b) return *owned = m2d_malloc(bytes ? bytes : 1);
    if (bytes > b->cap) {
        free(b->p);
        b->p = m2d_malloc(bytes);
        b->cap = bytes;
    }
    return b->p;
}

/* W's entry in the state C (a new one when W has none) */
static wt_entry *entry_of(train_state *c, const m2d_weight *w) {
    for (int i = 0; i < c->n; i++)
        if (c->e[i].w == w) return &c->e[i];
    if (c->n == c->cap) c->e = m2d_realloc(c->e, sizeof *c->e * (size_t)(c->cap = c->cap ? 2 * c->cap : 64));
    c->e[c->n] = (wt_entry){w, NULL, 0, 0};
    return &c->e[c->n++];
}

/* Wᵀ in bf16 for W's OUT x IN fp32 rows WR; *OWNED: the caller frees it (outside a bracket) */
static const uint16_t *weight_t_bf16(m2d_backend *be, const m2d_weight *w, const float *wr, int outd, int in,
                                     uint16_t **owned) {
    train_state *c = state_of(be);
    int64_t n = (int64_t)outd * in;
    if (!c) {
        *owned = m2d_malloc(sizeof(uint16_t) * (size_t)n);
        transpose(be, wr, in, outd, in, NULL, *owned);
        return *owned;
    }
    wt_entry *e = entry_of(c, w);
    if (e->fresh && e->n == n) return e->t;
    if (e->n != n) { /* a new weight (or another at a freed one's address) */
        free(e->t);
        e->t = m2d_malloc(sizeof(uint16_t) * (size_t)n);
        e->n = n;
    }
    transpose(be, wr, in, outd, in, NULL, e->t);
    e->fresh = 1;
    return e->t;
}

/* dx = dy · W = dy · (Wᵀ)ᵀ: X = dy, the module's weight Wᵀ [in, out] */
static void dx_bf16(m2d_backend *be, const m2d_mat *dy, const m2d_weight *w, const float *wr, m2d_mat *dx, float beta) {
    int n = dy->rows, outd = dy->cols, in = dx->cols;
    uint16_t *owned = NULL;
    m2d_gemm_w wt = m2d_gemm_weight(M2D_BF16, weight_t_bf16(be, w, wr, outd, in, &owned), in, outd, outd);
    if (m2d_gemm(m2d_cpu_gemm(be, M2D_PREC_BF16), F(dy), dy->ld, n, &wt, F(dx), dx->ld, beta)) m2d_cpu_fail(be);
    free(owned);
}

/* dW = dyᵀ · x: X = dyᵀ [out, n], the module's weight xᵀ [in, n] */
static void dw_bf16(m2d_backend *be, const m2d_mat *dy, const m2d_mat *x, m2d_mat *dw, float beta) {
    int n = dy->rows, outd = dy->cols, in = x->cols;
    train_state *c = state_of(be);
    void *own_dyt = NULL, *own_xt = NULL;
    float *dyt = step_buffer(c ? &c->dyt : NULL, sizeof(float) * (size_t)outd * n, &own_dyt);
    uint16_t *xt = step_buffer(c ? &c->xt : NULL, sizeof(uint16_t) * (size_t)in * n, &own_xt);
    transpose(be, F(dy), dy->ld, n, outd, dyt, NULL);
    transpose(be, F(x), x->ld, n, in, NULL, xt);
    m2d_gemm_w wt = m2d_gemm_weight(M2D_BF16, xt, in, n, n);
    if (m2d_gemm(m2d_cpu_gemm(be, M2D_PREC_BF16), dyt, n, outd, &wt, F(dw), dw->ld, beta)) m2d_cpu_fail(be);
    free(own_dyt);
    free(own_xt);
}

/* dx = beta dx or dw = beta dw when the product has no terms */
static void scale_mat(m2d_mat *y, float beta) {
    for (int r = 0; r < y->rows; r++)
        for (int c = 0; c < y->cols; c++) F(y)[(size_t)r * y->ld + c] *= beta;
}

static void cpu_gemm_dx(m2d_backend *be, const m2d_mat *dy, const m2d_weight *w, m2d_mat *dx, float beta,
                        m2d_precision prec) {
    int n = dy->rows, outd = dy->cols, in = dx->cols;
    if (n <= 0 || in <= 0 || m2d_cpu_failed(be)) return;
    if (outd <= 0) {
        scale_mat(dx, beta);
        return;
    }
    const float *wr = m2d_cpu_weight_rows(be, w, 0, (int64_t)outd * in);
    if (prec == M2D_PREC_BF16) dx_bf16(be, dy, w, wr, dx, beta);
    else dx_fp32(be, dy, wr, dx, beta);
}

static void cpu_gemm_dw(m2d_backend *be, const m2d_mat *dy, const m2d_mat *x, m2d_mat *dw, float beta,
                        m2d_precision prec) {
    int n = dy->rows, outd = dy->cols, in = x->cols;
    if (outd <= 0 || in <= 0 || m2d_cpu_failed(be)) return;
    if (n <= 0) scale_mat(dw, beta);
    else if (prec == M2D_PREC_BF16) dw_bf16(be, dy, x, dw, beta);
    else dw_fp32(be, dy, x, dw, beta);
}

/* ---- RMSNorm ---- */

typedef struct {
    const float *x, *w, *dy;
    float *dx;
    double *dw_part; /* [chunks][d] */
    int ldx, lddy, lddx, rows, d;
    double eps;
    float beta;
} rms_job;

/* y_j = x_j r w_j, r = (mean x^2 + eps)^(-1/2):
 *   dx_i = r w_i dy_i - x_i r^3 / d · sum_j dy_j w_j x_j,   dw_j += dy_j x_j r */
static void rms_item(void *ctx, int item) {
    const rms_job *j = ctx;
    int r0 = item * ROW_CHUNK, r1 = M2D_MIN(r0 + ROW_CHUNK, j->rows), d = j->d;
    double *dw = j->dw_part + (size_t)item * d;
    memset(dw, 0, sizeof(double) * (size_t)d);
    for (int r = r0; r < r1; r++) {
        const float *x = j->x + (size_t)r * j->ldx, *dy = j->dy + (size_t)r * j->lddy;
        float *dx = j->dx + (size_t)r * j->lddx;
        double ss = 0, dot = 0;
        for (int i = 0; i < d; i++) {
            ss += (double)x[i] * x[i];
            dot += (double)dy[i] * j->w[i] * x[i];
        }
        double rr = 1.0 / sqrt(ss / d + j->eps), c = dot * rr * rr * rr / d;
        for (int i = 0; i < d; i++) { /* dy[i] read before dx[i] is written: dx may be dy */
            double dyi = dy[i];
            float g = (float)(rr * j->w[i] * dyi - c * x[i]);
            dw[i] += dyi * x[i] * rr;
            dx[i] = j->beta == 0.0f ? g : j->beta * dx[i] + g;
        }
    }
}

static void cpu_rmsnorm_bwd(m2d_backend *be, const m2d_mat *x, const m2d_weight *w, double eps, const m2d_mat *dy,
                            m2d_mat *dx, float beta, m2d_mat *dw) {
    int rows = x->rows, d = x->cols, chunks = (rows + ROW_CHUNK - 1) / ROW_CHUNK;
    if (rows <= 0) return;
    /* copy the weight: the scratch behind weight_rows may be reused by a nested op */
    float *wv = m2d_malloc(sizeof(float) * (size_t)d);
    memcpy(wv, m2d_cpu_weight_rows(be, w, 0, d), sizeof(float) * (size_t)d);
    rms_job j = {F(x), wv, F(dy), F(dx), m2d_malloc(sizeof(double) * (size_t)chunks * d), x->ld, dy->ld, dx->ld,
                 rows, d, eps, beta};
    m2d_cpu_parallel_for(be, chunks, rms_item, &j);
    float *g = F(dw);
    for (int i = 0; i < d; i++) {
        double s = 0;
        for (int c = 0; c < chunks; c++) s += j.dw_part[(size_t)c * d + i];
        g[i] += (float)s;
    }
    free(j.dw_part);
    free(wv);
}

/* ---- attention ---- */

typedef struct {
    const m2d_attn_bwd_args *a;
    const float *q, *k, *v, *o, *dout, *sinks; /* sinks: [n_heads] or NULL */
    float *dq, *dk_part, *dv_part; /* parts: [n_heads][n][hd] */
    double *dsink;                 /* [n_heads]: dL/d sink of each head */
    float scale;
} attb_job;

/* softmax of the score rows S [n, n] (already scaled), in place, over the keys row i sees
 * (i - window < t <= i, or t <= i without a window; the others zeroed), exp(*SINK) joining the
 * denominator when SINK is given; psink[i] = the sink's probability (0 without) */
static void causal_softmax(float *S, int n, int window, const float *sink, float *psink) {
    for (int i = 0; i < n; i++) {
        int lo = window > 0 ? M2D_MAX(0, i + 1 - window) : 0;
        float *row = S + (size_t)i * n, m = sink ? *sink : -INFINITY;
        for (int t = lo; t <= i; t++) m = row[t] > m ? row[t] : m;
        double s = sink ? expf(*sink - m) : 0;
        for (int t = lo; t <= i; t++) {
            row[t] = expf(row[t] - m);
            s += row[t];
        }
        float inv = (float)(1.0 / s);
        for (int t = lo; t <= i; t++) row[t] *= inv;
        psink[i] = sink ? expf(*sink - m) * inv : 0.0f;
        memset(row, 0, sizeof(float) * (size_t)lo);
        memset(row + i + 1, 0, sizeof(float) * (size_t)(n - i - 1));
    }
}

/* one query head: P = softmax(s Q K^T) (masked, with the sink), dP = dO V^T, D_i = o_i . dO_i,
 * dS = P (dP - D), dQ = s dS K, dK_h = s dS^T Q, dV_h = P^T dO; the sink (a logit whose value row
 * is zero): dL/d sink = -sum_i P_sink,i D_i */
static void attb_item(void *ctx, int h) {
    const attb_job *j = ctx;
    const m2d_attn_bwd_args *a = j->a;
    int n = a->q.rows, hd = a->head_dim, g = h / (a->n_heads / a->n_kv);
    const float *qh = j->q + (size_t)h * hd, *kg = j->k + (size_t)g * hd, *vg = j->v + (size_t)g * hd;
    const float *oh = j->o + (size_t)h * hd, *doh = j->dout + (size_t)h * hd;
    float *P = m2d_malloc(sizeof(float) * (size_t)n * n), *dS = m2d_malloc(sizeof(float) * (size_t)n * n);
    float *psink = m2d_malloc(sizeof(float) * (size_t)n);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, hd, j->scale, qh, a->q.ld, kg, a->k.ld, 0.0f, P, n);
    causal_softmax(P, n, a->window, j->sinks ? j->sinks + h : NULL, psink);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, hd, 1.0f, doh, a->dout.ld, vg, a->v.ld, 0.0f, dS, n);
    double dsink = 0;
    for (int i = 0; i < n; i++) {
        const float *oi = oh + (size_t)i * a->out.ld, *di = doh + (size_t)i * a->dout.ld;
        double D = 0;
        for (int c = 0; c < hd; c++) D += (double)oi[c] * di[c];
        dsink -= psink[i] * D;
        float *ds = dS + (size_t)i * n;
        const float *p = P + (size_t)i * n;
        for (int t = 0; t < n; t++) ds[t] = p[t] == 0.0f ? 0.0f : p[t] * (ds[t] - (float)D); /* masked: 0 */
    }
    j->dsink[h] = dsink;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, hd, n, j->scale, dS, n, kg, a->k.ld, 0.0f,
                j->dq + (size_t)h * hd, a->dq.ld);
    float *dk = j->dk_part + (size_t)h * n * hd, *dv = j->dv_part + (size_t)h * n * hd;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hd, n, j->scale, dS, n, qh, a->q.ld, 0.0f, dk, hd);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hd, n, 1.0f, P, n, doh, a->dout.ld, 0.0f, dv, hd);
    free(P);
    free(dS);
    free(psink);
}

/* the heads of kv group g, added in head order into dk/dv */
static void sum_group(const float *part, int n, int hd, int h0, int per, float *dst, int ld) {
    for (int i = 0; i < n; i++) {
        float *row = dst + (size_t)i * ld;
        for (int c = 0; c < hd; c++) {
            float s = 0;
            for (int h = h0; h < h0 + per; h++) s += part[((size_t)h * n + i) * hd + c];
            row[c] = s;
        }
    }
}

static void cpu_attention_bwd(m2d_backend *be, const m2d_attn_bwd_args *a) {
    int n = a->q.rows, H = a->n_heads, KV = a->n_kv, hd = a->head_dim, per = H / KV;
    if (n <= 0) return;
    float *sinks = NULL;
    if (a->sinks) {
        sinks = m2d_malloc(sizeof(float) * (size_t)H);
        memcpy(sinks, m2d_cpu_weight_rows(be, a->sinks, 0, H), sizeof(float) * (size_t)H);
    }
    attb_job j = {a, F(&a->q), F(&a->k), F(&a->v), F(&a->out), F(&a->dout), sinks, F(&a->dq),
                  m2d_malloc(sizeof(float) * (size_t)H * n * hd), m2d_malloc(sizeof(float) * (size_t)H * n * hd),
                  m2d_calloc((size_t)H, sizeof(double)), a->scale != 0 ? a->scale : 1.0f / sqrtf((float)hd)};
    m2d_cpu_parallel_for(be, H, attb_item, &j);
    for (int g = 0; g < KV; g++) {
        sum_group(j.dk_part, n, hd, g * per, per, F(&a->dk) + (size_t)g * hd, a->dk.ld);
        sum_group(j.dv_part, n, hd, g * per, per, F(&a->dv) + (size_t)g * hd, a->dv.ld);
    }
    for (int h = 0; sinks && h < H; h++) F(&a->dsinks)[h] += (float)j.dsink[h];
    free(j.dk_part);
    free(j.dv_part);
    free(j.dsink);
    free(sinks);
}

/* ---- SwiGLU, embedding ---- */

/* h = silu(g) u, silu(g) = g s(g): dg = dh u s (1 + g (1 - s)), du = dh silu(g) */
static void cpu_glu_bwd(m2d_backend *be, m2d_ffn_act act, const m2d_mat *g, const m2d_mat *u, m2d_mat *dg,
                        m2d_mat *du) {
    (void)be;
    (void)act; /* M2D_ACT_SWIGLU is the only activation */
    for (int r = 0; r < g->rows; r++) {
        const float *gr = F(g) + (size_t)r * g->ld, *ur = F(u) + (size_t)r * u->ld;
        float *dgr = F(dg) + (size_t)r * dg->ld, *dur = F(du) + (size_t)r * du->ld;
        for (int i = 0; i < g->cols; i++) {
            float s = 1.0f / (1.0f + expf(-gr[i])), dh = dgr[i];
            dur[i] = dh * gr[i] * s;
            dgr[i] = dh * ur[i] * s * (1.0f + gr[i] * (1.0f - s));
        }
    }
}

/* h = (uc + 1) gc s(alpha gc), gc = min(g, limit), uc = clamp(u, -limit, limit):
 * dg = dh (uc + 1) s (1 + alpha gc (1 - s)) where g <= limit, du = dh gc s where |u| <= limit */
static void cpu_glu_clamp_bwd(m2d_backend *be, const m2d_mat *g, const m2d_mat *u, float alpha, float limit,
                              m2d_mat *dg, m2d_mat *du) {
    (void)be;
    for (int r = 0; r < g->rows; r++) {
        const float *gr = F(g) + (size_t)r * g->ld, *ur = F(u) + (size_t)r * u->ld;
        float *dgr = F(dg) + (size_t)r * dg->ld, *dur = F(du) + (size_t)r * du->ld;
        for (int i = 0; i < g->cols; i++) {
            float gc = fminf(gr[i], limit), uc = fminf(fmaxf(ur[i], -limit), limit);
            float s = 1.0f / (1.0f + expf(-alpha * gc)), dh = dgr[i];
            dur[i] = ur[i] >= -limit && ur[i] <= limit ? dh * gc * s : 0.0f;
            dgr[i] = gr[i] <= limit ? dh * (uc + 1.0f) * s * (1.0f + alpha * gc * (1.0f - s)) : 0.0f;
        }
    }
}

static void cpu_clamp_bwd(m2d_backend *be, const m2d_mat *x, float limit, m2d_mat *dy) {
    (void)be;
    for (int r = 0; r < x->rows; r++) {
        const float *xr = F(x) + (size_t)r * x->ld;
        float *d = F(dy) + (size_t)r * dy->ld;
        for (int i = 0; i < x->cols; i++)
            if (!(xr[i] >= -limit && xr[i] <= limit)) d[i] = 0.0f;
    }
}

/* column sums over the rows in order, in fp64 (one thread: schedule-independent) */
static void cpu_bias_bwd(m2d_backend *be, const m2d_mat *dy, m2d_mat *db) {
    (void)be;
    double *s = m2d_calloc((size_t)dy->cols, sizeof(double));
    for (int r = 0; r < dy->rows; r++)
        for (int i = 0; i < dy->cols; i++) s[i] += F(dy)[(size_t)r * dy->ld + i];
    for (int i = 0; i < dy->cols; i++) F(db)[i] += (float)s[i];
    free(s);
}

/* per row: the heads' blocks added in head order in fp64, rounded once */
static void cpu_head_sum(m2d_backend *be, const m2d_mat *x, int n_heads, int stride, m2d_mat *y, float beta) {
    (void)be;
    for (int r = 0; r < y->rows; r++) {
        const float *xr = F(x) + (size_t)r * x->ld;
        float *yr = F(y) + (size_t)r * y->ld;
        for (int j = 0; j < y->cols; j++) {
            double s = 0;
            for (int h = 0; h < n_heads; h++) s += xr[(size_t)h * stride + j];
            yr[j] = (float)s + (beta != 0.0f ? beta * yr[j] : 0.0f);
        }
    }
}

static void cpu_embed_bwd(m2d_backend *be, const m2d_buf *tokens, const m2d_mat *dx, m2d_mat *dtable) {
    (void)be;
    const int32_t *tok = m2d_cpu_ptr(tokens);
    for (int i = 0; i < dx->rows; i++) {
        float *row = F(dtable) + (size_t)tok[i] * dtable->ld;
        const float *g = F(dx) + (size_t)i * dx->ld;
        for (int c = 0; c < dx->cols; c++) row[c] += g[c];
    }
}

/* ---- losses ---- */

typedef struct {
    m2d_kd_kind kind;
    const float *zt;
    float *zs;
    int rows, V, ldt, lds;
    double scale;
    double *loss;
} kd_job;

#define KD_ROWS 8 /* rows per item */

/* e[i] = exp(z[i] - max z) (fp32); *sum = their sum (fp64); returns log sum exp z */
static double exp_row(const float *z, int V, float *e, double *sum) {
    float m = -INFINITY;
    for (int i = 0; i < V; i++) m = z[i] > m ? z[i] : m;
    double s = 0;
    for (int i = 0; i < V; i++) {
        e[i] = expf(z[i] - m);
        s += e[i];
    }
    *sum = s;
    return m + log(s);
}

/* With l = log p and shift = lse_t - lse_s (so lt_i - ls_i = zt_i - zs_i - shift):
 *   forward KL: L = sum pt (lt - ls), dL/dzs = ps - pt;
 *   reverse KL: L = sum ps (ls - lt), dL/dzs_k = ps_k (ls_k - lt_k - L). */
static void kd_row(const kd_job *j, int r, float *et, float *es) {
    const float *zt = j->zt + (size_t)r * j->ldt;
    float *zs = j->zs + (size_t)r * j->lds;
    int V = j->V;
    double st, ss;
    double shift = exp_row(zt, V, et, &st) - exp_row(zs, V, es, &ss), it = 1.0 / st, is = 1.0 / ss, L = 0;
    if (j->kind == M2D_KD_FORWARD_KL) {
        for (int i = 0; i < V; i++) {
            double pt = et[i] * it, ps = es[i] * is;
            L += pt * ((double)zt[i] - (double)zs[i] - shift);
            zs[i] = (float)(j->scale * (ps - pt));
        }
    } else {
        for (int i = 0; i < V; i++) L += es[i] * is * ((double)zs[i] - (double)zt[i] + shift);
        for (int i = 0; i < V; i++)
            zs[i] = (float)(j->scale * es[i] * is * ((double)zs[i] - (double)zt[i] + shift - L));
    }
    j->loss[r] = L;
}

static void kd_item(void *ctx, int item) {
    const kd_job *j = ctx;
    float *et = m2d_malloc(sizeof(float) * (size_t)j->V * 2);
    for (int r = item * KD_ROWS; r < M2D_MIN((item + 1) * KD_ROWS, j->rows); r++) kd_row(j, r, et, et + j->V);
    free(et);
}

static void cpu_kd_loss(m2d_backend *be, m2d_kd_kind kind, const m2d_mat *zt, m2d_mat *zs, double scale,
                        m2d_buf *row_loss) {
    kd_job j = {kind, F(zt), F(zs), zs->rows, zs->cols, zt->ld, zs->ld, scale, m2d_cpu_ptr(row_loss)};
    m2d_cpu_parallel_for(be, (j.rows + KD_ROWS - 1) / KD_ROWS, kd_item, &j);
}

static void cpu_mse(m2d_backend *be, const m2d_mat *a, const m2d_mat *b, double scale, m2d_mat *da, m2d_buf *row_loss) {
    (void)be;
    double *loss = m2d_cpu_ptr(row_loss);
    for (int r = 0; r < a->rows; r++) {
        const float *ar = F(a) + (size_t)r * a->ld, *br = F(b) + (size_t)r * b->ld;
        float *dr = F(da) + (size_t)r * da->ld;
        double s = 0;
        for (int i = 0; i < a->cols; i++) {
            double diff = (double)ar[i] - br[i];
            s += diff * diff;
            dr[i] += (float)(scale * 2.0 * diff);
        }
        loss[r] = s;
    }
}

/* ---- gradient norm, AdamW: fixed chunks of SUM_CHUNK elements ---- */

typedef struct {
    const float *x;
    size_t n;
    double *part;
} sumsq_job;

static void sumsq_item(void *ctx, int item) {
    const sumsq_job *j = ctx;
    size_t a = (size_t)item * SUM_CHUNK, b = M2D_MIN(a + SUM_CHUNK, j->n);
    double s = 0;
    for (size_t i = a; i < b; i++) s += (double)j->x[i] * j->x[i];
    j->part[item] = s;
}

static void cpu_sumsq(m2d_backend *be, const m2d_buf *x, size_t off, size_t n, m2d_buf *out) {
    int chunks = (int)((n + SUM_CHUNK - 1) / SUM_CHUNK);
    sumsq_job j = {(const float *)m2d_cpu_ptr(x) + off, n, m2d_calloc((size_t)chunks + 1, sizeof(double))};
    m2d_cpu_parallel_for(be, chunks, sumsq_item, &j);
    double s = 0;
    for (int c = 0; c < chunks; c++) s += j.part[c];
    *(double *)m2d_cpu_ptr(out) = s;
    free(j.part);
}

typedef struct {
    float *p, *m, *v;
    const float *g;
    size_t n;
    float decay, b1c, b2, b2c, bc2_sqrt, eps, step_size, grad_scale;
} adamw_job;

/* the operations of torch.optim.AdamW (single-tensor path), in its order, in fp32 */
static void adamw_item(void *ctx, int item) {
    const adamw_job *j = ctx;
    size_t a = (size_t)item * SUM_CHUNK, b = M2D_MIN(a + SUM_CHUNK, j->n);
    for (size_t i = a; i < b; i++) {
        float g = j->g[i] * j->grad_scale;
        float p = j->p[i] * j->decay;                 /* param.mul_(1 - lr wd) */
        float m = j->m[i] + j->b1c * (g - j->m[i]);   /* exp_avg.lerp_(grad, 1 - beta1) */
        float v = j->v[i] * j->b2 + j->b2c * g * g;   /* exp_avg_sq.mul_(beta2).addcmul_(g, g, 1 - beta2) */
        float denom = sqrtf(v) / j->bc2_sqrt + j->eps;
        j->p[i] = p + -j->step_size * (m / denom);    /* param.addcdiv_(exp_avg, denom, -step_size) */
        j->m[i] = m;
        j->v[i] = v;
    }
}

static void cpu_adamw(m2d_backend *be, m2d_buf *p, const m2d_buf *g, m2d_buf *m, m2d_buf *v, size_t off, size_t n,
                      const m2d_adamw_args *a) {
    void **state = m2d_cpu_train_state(be); /* the weights change: their bf16 transposes are stale */
    if (state) m2d_cpu_train_state_stale(*state);
    double bc1 = 1.0 - pow(a->beta1, a->step), bc2 = 1.0 - pow(a->beta2, a->step);
    adamw_job j = {(float *)m2d_cpu_ptr(p) + off, (float *)m2d_cpu_ptr(m) + off, (float *)m2d_cpu_ptr(v) + off,
                   (const float *)m2d_cpu_ptr(g) + off, n,
                   (float)(1.0 - a->lr * a->weight_decay), (float)(1.0 - a->beta1), (float)a->beta2,
                   (float)(1.0 - a->beta2), (float)sqrt(bc2), (float)a->eps, (float)(a->lr / bc1), a->grad_scale};
    m2d_cpu_parallel_for(be, (int)((n + SUM_CHUNK - 1) / SUM_CHUNK), adamw_item, &j);
}

const m2d_backend_train_ops m2d_cpu_train_ops = {
    .weight_view = cpu_weight_view,
    .fill = cpu_fill,
    .copy = cpu_copy,
    .gemm_dx = cpu_gemm_dx,
    .gemm_dw = cpu_gemm_dw,
    .rmsnorm_bwd = cpu_rmsnorm_bwd,
    .attention_bwd = cpu_attention_bwd,
    .glu_bwd = cpu_glu_bwd,
    .glu_clamp_bwd = cpu_glu_clamp_bwd,
    .clamp_bwd = cpu_clamp_bwd,
    .bias_bwd = cpu_bias_bwd,
    .head_sum = cpu_head_sum,
    .embed_bwd = cpu_embed_bwd,
    .kd_loss = cpu_kd_loss,
    .mse = cpu_mse,
    .sumsq = cpu_sumsq,
    .adamw = cpu_adamw,
};
