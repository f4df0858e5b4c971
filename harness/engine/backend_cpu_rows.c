/* backend_cpu_rows — the "cpu" backend's per-row ops: RMSNorm, RoPE, the GLU activations, biases
 * and adds, clamps, embedding, KV-cache append, and the LM head's log-probabilities (streaming
 * log-sum-exp over vocabulary chunks). See backend_cpu.c for the backend's conventions. */
#include "engine/backend_cpu_impl.h"
#include "engine/vexp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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

void m2d_cpu_rmsnorm(m2d_backend *be, const m2d_mat *x, const m2d_weight *w, double eps, m2d_mat *y) {
    const float *wv = wrows(CPU(be), w, 0, x->cols);
    rmsnorm_rows(F(x), x->ld, wv, x->rows, x->cols, eps, F(y), y->ld);
}

/* RoPE (m2d_rope_args): pair i of each head's first rot dims, (a, b) = (x[i], x[i + rot/2]) for
 * rotate-half or (x[2i], x[2i+1]) interleaved, turns by f = pos * inv_freq[i]:
 * (a cos f - b sin f, b cos f + a sin f), cos and sin times attn_factor; angles in double */
void m2d_cpu_rope(m2d_backend *be, m2d_mat *xm, int n_heads, int hd, const m2d_buf *posb, const m2d_rope_args *r) {
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




typedef struct {
    m2d_mat *g;
    const m2d_mat *u;
    int clamp;
    float alpha, limit;
} glu_job;

static void glu_item(void *ctx, int item) {
    const glu_job *j = ctx;
    for (int r = item * ROW_BLOCK; r < M2D_MIN(j->g->rows, (item + 1) * ROW_BLOCK); r++) {
        float *g = F(j->g) + (size_t)r * j->g->ld;
        const float *u = F(j->u) + (size_t)r * j->u->ld;
        if (j->clamp) swiglu_clamp(g, u, j->g->cols, j->alpha, j->limit, g);
        else m2d_vexp_swiglu(g, u, j->g->cols, g);
    }
}

void m2d_cpu_glu(m2d_backend *be, m2d_ffn_act act, m2d_mat *g, const m2d_mat *u) {
    (void)act; /* M2D_ACT_SWIGLU is the only activation */
    glu_job j = {g, u, 0, 0.0f, 0.0f};
    parallel_for(CPU(be), row_blocks(g->rows), glu_item, &j);
}

void m2d_cpu_glu_clamp(m2d_backend *be, m2d_mat *g, const m2d_mat *u, float alpha, float limit) {
    glu_job j = {g, u, 1, alpha, limit};
    parallel_for(CPU(be), row_blocks(g->rows), glu_item, &j);
}


void m2d_cpu_add_bias(m2d_backend *be, m2d_mat *y, const m2d_weight *b) {
    add_rows(F(y), y->ld, y->rows, y->cols, wrows(CPU(be), b, 0, y->cols));
}

void m2d_cpu_add(m2d_backend *be, m2d_mat *y, const m2d_mat *x) {
    (void)be;
    for (int r = 0; r < y->rows; r++) {
        float *yr = F(y) + (size_t)r * y->ld;
        const float *xr = F(x) + (size_t)r * x->ld;
        for (int i = 0; i < y->cols; i++) yr[i] += xr[i];
    }
}

void m2d_cpu_sigmoid_scale(m2d_backend *be, m2d_mat *y, const m2d_mat *sm) {
    (void)be;
    for (int r = 0; r < y->rows; r++) {
        float *yr = F(y) + (size_t)r * y->ld, g = 1.0f / (1.0f + expf(-F(sm)[(size_t)r * sm->ld]));
        for (int i = 0; i < y->cols; i++) yr[i] *= g;
    }
}

void m2d_cpu_clamp(m2d_backend *be, m2d_mat *x, float limit) {
    (void)be;
    for (int r = 0; r < x->rows; r++) {
        float *xr = F(x) + (size_t)r * x->ld;
        for (int i = 0; i < x->cols; i++) xr[i] = xr[i] < -limit ? -limit : xr[i] > limit ? limit : xr[i];
    }
}

void m2d_cpu_embed(m2d_backend *be, const m2d_weight *table, const m2d_buf *tokens, int n, m2d_mat *x) {
    const int32_t *tok = B(tokens);
    int d = x->cols;
    for (int i = 0; i < n; i++) m2d_cpu_weight_f32(be, table, (int64_t)tok[i] * d, d, F(x) + (size_t)i * x->ld);
}

void m2d_cpu_kv_append(m2d_backend *be, m2d_buf *kc, m2d_buf *vc, size_t off, size_t head_stride, int pos0,
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

/* ---- LM head log-probabilities ---- */
#define LM_CHUNK 4096 /* vocab rows of the LM head per GEMM (a multiple of M2D_GEMM_SLICE: views of a prepared head) */
#define LM_ROWS 512   /* hidden rows per GEMM block: at most [LM_ROWS, LM_CHUNK] logits at once (8 MB) */

/* running max / sum of exponentials (double) of row i over one chunk z[nv] of logits at v0 */
static void lse_update(const float *z, int nv, int v0, int target, double *mx, double *sum, double *tgt) {
    float cm = m2d_vexp_max(z, nv);
    if (target >= v0 && target < v0 + nv) *tgt = z[target - v0];
    if (cm == -INFINITY) return; /* a masked chunk adds nothing (its exp(z - cm) would be NaN) */
    double s = m2d_vexp_sum_exp(z, nv, cm); /* float terms (<= 2.4e-7 relative), double sum: vexp.h */
    if (cm > *mx) {
        *sum = *sum * exp(*mx - cm) + s;
        *mx = cm;
    } else {
        *sum += s * exp(cm - *mx);
    }
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
void m2d_cpu_logprobs(m2d_backend *be, const m2d_mat *hid, const m2d_weight *head, int V, const m2d_buf *targetsb,
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
