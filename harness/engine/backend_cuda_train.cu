/* backend_cuda_train — the "cuda" backend's training ops (m2d_backend_train_ops, backend.h): the
 * backward of each forward op, the distillation losses and AdamW on the GPU, so that `distill
 * --device cuda` trains the student there. The arithmetic is backend_cpu_train.c's (kernels in
 * cuda_train_kernels.cuh, checked on the CPU by tests/test_cuda_train_kernels.cc); the GEMMs are
 * cuBLASLt's, fp32 (cu_sgemm: never TF32) or, for the projections at --train-precision bf16, on
 * operands rounded to bf16 (tensor cores, fp32 accumulation). Every reduction runs in a fixed order (block trees, fixed
 * chunks added in order, GEMMs accumulated head after head), so a step's bits do not depend on
 * timing; tests/test_train_ops.c checks each op against float64 and finite differences on every
 * backend that lists the capability "train".
 *
 * Attention's backward materialises one head's scores at a time, P and dS [n, n] (n = a training
 * window: 32 MiB for both at 2,048 rows), as the CPU's does: five GEMMs and three small kernels a
 * head. A flash-style backward is the lever when training time matters more than simplicity. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "engine/backend_cuda_impl.cuh"

extern "C" {
#include "base/util.h" /* M2D_MIN, which the kernels use */
}
#include "engine/cuda_train_kernels.cuh"

/* a temporary device buffer of BYTES (the backend's cache makes it cheap); NULL after a failure,
 * its own included (kept sticky: leave() reports it, and the ops after it are skipped) */
static m2d_buf *tmp(m2d_backend *be, size_t bytes) {
    if (cu_failed(be)) return NULL;
    m2d_buf *b = be->ops->alloc(be, bytes);
    if (!b) cu_check(be, cudaErrorMemoryAllocation, "a training op's temporary buffer");
    return b;
}

static void tmp_free(m2d_backend *be, m2d_buf *b) {
    if (b) be->ops->release(be, b);
}

void cu_gemm_naive(m2d_backend *be, m2d_precision prec, bool ta, bool tb, int m, int n, int k, float alpha,
                   const void *A, int lda, const void *B, int ldb, float beta, float *C, int ldc) {
    unsigned blocks = cu_blocks((int64_t)m * n, TR_THREADS);
    if (prec == M2D_PREC_BF16)
        k_tr_gemm<<<blocks, TR_THREADS>>>(ta, tb, m, n, k, alpha, (const __nv_bfloat16 *)A, lda,
                                          (const __nv_bfloat16 *)B, ldb, beta, C, ldc);
    else
        k_tr_gemm<<<blocks, TR_THREADS>>>(ta, tb, m, n, k, alpha, (const float *)A, lda, (const float *)B, ldb, beta,
                                          C, ldc);
    cu_launched(be, "k_tr_gemm");
}

static void tr_fill(m2d_backend *be, m2d_buf *buf, size_t off, size_t n, float value) {
    if (cu_failed(be) || n == 0) return;
    float *p = (float *)cu_ptr(buf) + off;
    if (value == 0.0f) {
        cu_check(be, cudaMemsetAsync(p, 0, n * sizeof(float)), "cudaMemsetAsync (fill)");
        return;
    }
    k_tr_fill<<<cu_blocks((int64_t)n, TR_THREADS), TR_THREADS>>>(p, (int64_t)n, value);
    cu_launched(be, "k_tr_fill");
}

static void tr_copy(m2d_backend *be, m2d_mat *dst, const m2d_mat *src) {
    if (cu_failed(be) || src->rows <= 0 || src->cols <= 0) return;
    cu_check(be,
             cudaMemcpy2DAsync(cu_mat(dst), sizeof(float) * (size_t)dst->ld, cu_mat(src), sizeof(float) * (size_t)src->ld,
                               sizeof(float) * (size_t)src->cols, (size_t)src->rows, cudaMemcpyDeviceToDevice),
             "cudaMemcpy2DAsync (copy)");
}

/* ---- GEMMs (row-major windows as column-major transposes: see each) ---- */

/* rows x cols of X (row stride LD) rounded to bf16 into a temporary buffer, compact (stride
 * cols); NULL after a failure */
static m2d_buf *bf16_copy(m2d_backend *be, const float *x, int ld, int rows, int cols) {
    int64_t n = (int64_t)rows * cols;
    m2d_buf *b = tmp(be, sizeof(__nv_bfloat16) * (size_t)(n ? n : 1));
    if (!b || n == 0) return b;
    k_tr_round_bf16<<<cu_blocks(n, TR_THREADS), TR_THREADS>>>(x, ld, rows, cols, (__nv_bfloat16 *)cu_ptr(b));
    cu_launched(be, "k_tr_round_bf16");
    return b;
}

/* column-major C[m, n] = op(A) op(B) + beta C at PREC, A and B fp32 [.. rows of LDA / LDB]: as
 * they are (FP32), or rounded to bf16 first (BF16: A's AR x AC and B's BR x BC row-major windows
 * copied compact, so their strides become AC and BC) */
static void gemm_at(m2d_backend *be, m2d_precision prec, bool ta, bool tb, int m, int n, int k, const float *A,
                    int lda, int ar, int ac, const float *B, int ldb, int br, int bc, float beta, float *C, int ldc) {
    if (prec != M2D_PREC_BF16) {
        cu_sgemm(be, ta, tb, m, n, k, 1.0f, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    m2d_buf *a = bf16_copy(be, A, lda, ar, ac), *b = a ? bf16_copy(be, B, ldb, br, bc) : NULL;
    if (b) cu_gemm(be, prec, ta, tb, m, n, k, 1.0f, cu_ptr(a), ac, cu_ptr(b), bc, beta, C, ldc);
    tmp_free(be, b);
    tmp_free(be, a);
}

/* dx[n, in] = dy[n, out] W[out, in] + beta dx; column-major: dx^T = W^T dy^T */
static void tr_gemm_dx(m2d_backend *be, const m2d_mat *dy, const m2d_weight *w, m2d_mat *dx, float beta,
                       m2d_precision prec) {
    int n = dy->rows, outd = dy->cols, in = dx->cols;
    if (cu_failed(be) || n <= 0 || in <= 0) return;
    if (outd <= 0) { /* dx = beta dx */
        cu_sgemm(be, false, false, in, n, 0, 1.0f, NULL, in, cu_mat(dy), dy->ld, beta, cu_mat(dx), dx->ld);
        return;
    }
    if (prec == M2D_PREC_BF16) { /* W as the forward's GEMM reads it (kept within a bracket), dy rounded */
        const void *wb = cu_weight_dev_bf16(be, w, 0, (int64_t)outd * in);
        m2d_buf *b = wb ? bf16_copy(be, cu_mat(dy), dy->ld, n, outd) : NULL;
        if (b) cu_gemm(be, prec, false, false, in, n, outd, 1.0f, wb, in, cu_ptr(b), outd, beta, cu_mat(dx), dx->ld);
        tmp_free(be, b);
        return;
    }
    const float *wr = cu_weight_dev_f32(be, w, 0, (int64_t)outd * in);
    if (wr) cu_sgemm(be, false, false, in, n, outd, 1.0f, wr, in, cu_mat(dy), dy->ld, beta, cu_mat(dx), dx->ld);
}

/* dw[out, in] = dy^T x + beta dw; column-major: dw^T = x^T dy */
static void tr_gemm_dw(m2d_backend *be, const m2d_mat *dy, const m2d_mat *x, m2d_mat *dw, float beta,
                       m2d_precision prec) {
    int n = dy->rows, outd = dy->cols, in = x->cols;
    if (outd <= 0 || in <= 0) return;
    if (n <= 0) prec = M2D_PREC_FP32; /* k = 0: dw = beta dw, nothing to round */
    gemm_at(be, prec, false, true, in, outd, n, cu_mat(x), x->ld, n, in, cu_mat(dy), dy->ld, n, outd, beta, cu_mat(dw),
            dw->ld);
}

/* ---- column sums over rows: fixed chunks, then in chunk order ---- */

/* dst (1 x cols) += sum over rows of a (* b) (* rs[row]) */
static void col_sums(m2d_backend *be, const float *a, int lda, const float *b, int ldb, const double *rs, int rows,
                     int cols, float *dst) {
    int chunks = (rows + TR_ROW_CHUNK - 1) / TR_ROW_CHUNK;
    m2d_buf *part = tmp(be, sizeof(double) * (size_t)chunks * cols);
    if (!part) return;
    dim3 grid((unsigned)chunks, cu_blocks(cols, TR_THREADS)); /* chunks on x: up to 2^31 - 1 of them */
    k_tr_col_part<<<grid, TR_THREADS>>>(a, lda, b, ldb, rs, rows, cols, (double *)cu_ptr(part));
    k_tr_col_finish<<<cu_blocks(cols, TR_THREADS), TR_THREADS>>>((const double *)cu_ptr(part), chunks, cols, dst);
    cu_launched(be, "k_tr_col_part/k_tr_col_finish");
    tmp_free(be, part);
}

/* ---- RMSNorm ---- */

static void tr_rmsnorm_bwd(m2d_backend *be, const m2d_mat *x, const m2d_weight *w, double eps, const m2d_mat *dy,
                           m2d_mat *dx, float beta, m2d_mat *dw) {
    int rows = x->rows, d = x->cols;
    if (cu_failed(be) || rows <= 0 || d <= 0) return;
    m2d_buf *rc = tmp(be, sizeof(double) * 2 * (size_t)rows);
    const float *wv = rc ? cu_weight_dev_f32(be, w, 0, d) : NULL;
    if (wv) {
        double *rr = (double *)cu_ptr(rc), *cc = rr + rows;
        k_rms_bwd_rows<<<rows, cu_row_threads(d)>>>(cu_mat(x), x->ld, wv, cu_mat(dy), dy->ld, d, eps, rr, cc);
        cu_launched(be, "k_rms_bwd_rows");
        col_sums(be, cu_mat(dy), dy->ld, cu_mat(x), x->ld, rr, rows, d, cu_mat(dw)); /* before dx: dx may be dy */
        k_rms_bwd_dx<<<cu_blocks((int64_t)rows * d, TR_THREADS), TR_THREADS>>>(cu_mat(x), x->ld, wv, cu_mat(dy), dy->ld,
                                                                                rr, cc, rows, d, cu_mat(dx), dx->ld, beta);
        cu_launched(be, "k_rms_bwd_dx");
    }
    tmp_free(be, rc);
}

/* ---- attention ---- */

struct attb_tmp {
    m2d_buf *P, *dS, *psink, *term;
};

/* one query head h (kv head g): P = softmax(s Q K^T), dP = dO V^T, dS = P (dP - D), dQ = s dS K,
 * dK_g (+)= s dS^T Q, dV_g (+)= P^T dO, the heads of a group added in head order; P and dS
 * row-major [n, n] are, column-major, their transposes */
static void attb_head(m2d_backend *be, const m2d_attn_bwd_args *a, int h, float scale, const float *sinks,
                      const attb_tmp &t) {
    int n = a->q.rows, hd = a->head_dim, per = a->n_heads / a->n_kv, g = h / per;
    float first = h % per ? 1.0f : 0.0f; /* beta: the group's first head overwrites dK, dV */
    const float *qh = cu_mat(&a->q) + (size_t)h * hd, *kg = cu_mat(&a->k) + (size_t)g * hd;
    const float *vg = cu_mat(&a->v) + (size_t)g * hd, *oh = cu_mat(&a->out) + (size_t)h * hd;
    const float *doh = cu_mat(&a->dout) + (size_t)h * hd;
    float *P = (float *)cu_ptr(t.P), *dS = (float *)cu_ptr(t.dS), *ps = (float *)cu_ptr(t.psink);
    double *term = (double *)cu_ptr(t.term);
    cu_sgemm(be, true, false, n, n, hd, scale, kg, a->k.ld, qh, a->q.ld, 0.0f, P, n);
    k_attn_bwd_softmax<<<n, TR_THREADS>>>(P, n, a->window, sinks ? sinks + h : NULL, ps);
    cu_launched(be, "k_attn_bwd_softmax");
    cu_sgemm(be, true, false, n, n, hd, 1.0f, vg, a->v.ld, doh, a->dout.ld, 0.0f, dS, n);
    k_attn_bwd_ds<<<n, 128>>>(P, dS, n, oh, a->out.ld, doh, a->dout.ld, hd, sinks ? ps : NULL, term);
    cu_launched(be, "k_attn_bwd_ds");
    if (sinks) {
        k_attn_bwd_dsink<<<1, 1>>>(term, n, cu_mat(&a->dsinks) + h);
        cu_launched(be, "k_attn_bwd_dsink");
    }
    cu_sgemm(be, false, false, hd, n, n, scale, kg, a->k.ld, dS, n, 0.0f, cu_mat(&a->dq) + (size_t)h * hd, a->dq.ld);
    cu_sgemm(be, false, true, hd, n, n, scale, qh, a->q.ld, dS, n, first, cu_mat(&a->dk) + (size_t)g * hd, a->dk.ld);
    cu_sgemm(be, false, true, hd, n, n, 1.0f, doh, a->dout.ld, P, n, first, cu_mat(&a->dv) + (size_t)g * hd, a->dv.ld);
}

static void tr_attention_bwd(m2d_backend *be, const m2d_attn_bwd_args *a) {
    int n = a->q.rows, H = a->n_heads;
    if (cu_failed(be) || n <= 0) return;
    float scale = a->scale != 0 ? a->scale : 1.0f / sqrtf((float)a->head_dim);
    attb_tmp t = {tmp(be, sizeof(float) * (size_t)n * n), tmp(be, sizeof(float) * (size_t)n * n),
                  tmp(be, sizeof(float) * (size_t)n), tmp(be, sizeof(double) * (size_t)n)};
    /* the sinks as fp32 on the device: a scratch copy no op below replaces (GEMMs and kernels only) */
    const float *sinks = a->sinks && !cu_failed(be) ? cu_weight_dev_f32(be, a->sinks, 0, H) : NULL;
    for (int h = 0; h < H && !cu_failed(be); h++) attb_head(be, a, h, scale, sinks, t);
    tmp_free(be, t.P), tmp_free(be, t.dS), tmp_free(be, t.psink), tmp_free(be, t.term);
}

/* ---- elementwise ---- */

static unsigned elem_blocks(const m2d_mat *m) { return cu_blocks((int64_t)m->rows * m->cols, TR_THREADS); }

static void tr_glu_bwd(m2d_backend *be, m2d_ffn_act act, const m2d_mat *g, const m2d_mat *u, m2d_mat *dg,
                       m2d_mat *du) {
    (void)act; /* M2D_ACT_SWIGLU is the only activation (backend.h) */
    if (cu_failed(be) || g->rows <= 0 || g->cols <= 0) return;
    k_glu_bwd<<<elem_blocks(g), TR_THREADS>>>(cu_mat(g), g->ld, cu_mat(u), u->ld, g->rows, g->cols, cu_mat(dg), dg->ld,
                                              cu_mat(du), du->ld);
    cu_launched(be, "k_glu_bwd");
}

static void tr_glu_clamp_bwd(m2d_backend *be, const m2d_mat *g, const m2d_mat *u, float alpha, float limit,
                             m2d_mat *dg, m2d_mat *du) {
    if (cu_failed(be) || g->rows <= 0 || g->cols <= 0) return;
    k_glu_clamp_bwd<<<elem_blocks(g), TR_THREADS>>>(cu_mat(g), g->ld, cu_mat(u), u->ld, g->rows, g->cols, alpha, limit,
                                                    cu_mat(dg), dg->ld, cu_mat(du), du->ld);
    cu_launched(be, "k_glu_clamp_bwd");
}

static void tr_clamp_bwd(m2d_backend *be, const m2d_mat *x, float limit, m2d_mat *dy) {
    if (cu_failed(be) || x->rows <= 0 || x->cols <= 0) return;
    k_clamp_bwd<<<elem_blocks(x), TR_THREADS>>>(cu_mat(x), x->ld, x->rows, x->cols, limit, cu_mat(dy), dy->ld);
    cu_launched(be, "k_clamp_bwd");
}

static void tr_bias_bwd(m2d_backend *be, const m2d_mat *dy, m2d_mat *db) {
    if (cu_failed(be) || dy->rows <= 0 || dy->cols <= 0) return;
    col_sums(be, cu_mat(dy), dy->ld, NULL, 0, NULL, dy->rows, dy->cols, cu_mat(db));
}

static void tr_head_sum(m2d_backend *be, const m2d_mat *x, int n_heads, int stride, m2d_mat *y, float beta) {
    if (cu_failed(be) || y->rows <= 0 || y->cols <= 0) return;
    k_head_sum<<<elem_blocks(y), TR_THREADS>>>(cu_mat(x), x->ld, n_heads, stride, y->rows, y->cols, cu_mat(y), y->ld,
                                               beta);
    cu_launched(be, "k_head_sum");
}

static void tr_embed_bwd(m2d_backend *be, const m2d_buf *tokens, const m2d_mat *dx, m2d_mat *dtable) {
    if (cu_failed(be) || dx->rows <= 0 || dx->cols <= 0) return;
    k_embed_bwd<<<cu_blocks(dx->cols, TR_THREADS), TR_THREADS>>>((const int32_t *)cu_ptr(tokens), dx->rows, cu_mat(dx),
                                                                 dx->ld, dx->cols, dtable->rows, cu_mat(dtable),
                                                                 dtable->ld);
    cu_launched(be, "k_embed_bwd");
}

/* ---- losses ---- */

static void tr_kd_loss(m2d_backend *be, m2d_kd_kind kind, const m2d_mat *zt, m2d_mat *zs, double scale,
                       m2d_buf *row_loss) {
    if (cu_failed(be) || zs->rows <= 0) return;
    k_kd_rows<<<zs->rows, TR_THREADS>>>(kind == M2D_KD_REVERSE_KL, cu_mat(zt), zt->ld, cu_mat(zs), zs->ld, zs->cols,
                                        scale, (double *)cu_ptr(row_loss));
    cu_launched(be, "k_kd_rows");
}

static void tr_mse(m2d_backend *be, const m2d_mat *a, const m2d_mat *b, double scale, m2d_mat *da, m2d_buf *row_loss) {
    if (cu_failed(be) || a->rows <= 0) return;
    k_mse_rows<<<a->rows, cu_row_threads(a->cols)>>>(cu_mat(a), a->ld, cu_mat(b), b->ld, a->cols, scale, cu_mat(da),
                                                     da->ld, (double *)cu_ptr(row_loss));
    cu_launched(be, "k_mse_rows");
}

/* ---- the gradient norm, AdamW ---- */

static void tr_sumsq(m2d_backend *be, const m2d_buf *x, size_t off, size_t n, m2d_buf *out) {
    if (cu_failed(be)) return;
    int chunks = (int)((n + TR_SUM_CHUNK - 1) / TR_SUM_CHUNK);
    m2d_buf *part = tmp(be, sizeof(double) * (size_t)(chunks + 1));
    if (!part) return;
    if (chunks) k_sumsq_part<<<chunks, TR_THREADS>>>((const float *)cu_ptr(x) + off, (int64_t)n, (double *)cu_ptr(part));
    k_sum_parts<<<1, 1>>>((const double *)cu_ptr(part), chunks, (double *)cu_ptr(out));
    cu_launched(be, "k_sumsq_part/k_sum_parts");
    tmp_free(be, part);
}

static void tr_adamw(m2d_backend *be, m2d_buf *p, const m2d_buf *g, m2d_buf *m, m2d_buf *v, size_t off, size_t n,
                     const m2d_adamw_args *a) {
    if (cu_failed(be) || n == 0) return;
    double bc1 = 1.0 - pow(a->beta1, a->step), bc2 = 1.0 - pow(a->beta2, a->step);
    adamw_dev k = {(float)(1.0 - a->lr * a->weight_decay), (float)(1.0 - a->beta1), (float)a->beta2,
                  (float)(1.0 - a->beta2), (float)sqrt(bc2), (float)a->eps, (float)(a->lr / bc1), a->grad_scale};
    float *pf = (float *)cu_ptr(p) + off, *mf = (float *)cu_ptr(m) + off, *vf = (float *)cu_ptr(v) + off;
    k_adamw<<<cu_blocks((int64_t)n, TR_THREADS), TR_THREADS>>>(pf, (const float *)cu_ptr(g) + off, mf, vf, (int64_t)n, k);
    cu_launched(be, "k_adamw");
    cu_weights_changed(be); /* the kept bf16 copies of the weights are stale */
}

const m2d_backend_train_ops cu_train_ops = {
    .weight_view = cu_weight_view,
    .fill = tr_fill,
    .copy = tr_copy,
    .gemm_dx = tr_gemm_dx,
    .gemm_dw = tr_gemm_dw,
    .rmsnorm_bwd = tr_rmsnorm_bwd,
    .attention_bwd = tr_attention_bwd,
    .glu_bwd = tr_glu_bwd,
    .glu_clamp_bwd = tr_glu_clamp_bwd,
    .clamp_bwd = tr_clamp_bwd,
    .bias_bwd = tr_bias_bwd,
    .head_sum = tr_head_sum,
    .embed_bwd = tr_embed_bwd,
    .kd_loss = tr_kd_loss,
    .mse = tr_mse,
    .sumsq = tr_sumsq,
    .adamw = tr_adamw,
};
