/* cuda_train_kernels — the kernels of the cuda backend's training ops (backend_cuda_train.cu;
 * the ops' contracts are backend.h's m2d_backend_train_ops). Each mirrors backend_cpu_train.c's
 * arithmetic: the same fp32 and fp64 expressions, written with the _rn intrinsics where the CPU's
 * ISO C (no FMA contraction) rounds each operation; sums in a fixed order (block trees, column
 * sums over fixed chunks of rows added in order, sequential loops where the CPU's result must be
 * matched bit for bit: the embedding's scatter-add), never atomics, so a step's bits do not depend
 * on timing. The GEMMs are cuBLASLt's (backend_cuda.cu, cu_gemm); k_tr_gemm is its fallback and
 * the gemm_naive knob's.
 *
 * Kept in this header so that tests/test_cuda_train_kernels.cc runs the same source on the CPU
 * (tests/cuda_emu.h) against float64; included once by backend_cuda_train.cu. */
#ifndef M2D_CUDA_TRAIN_KERNELS_CUH
#define M2D_CUDA_TRAIN_KERNELS_CUH

#include "engine/cuda_reduce.cuh"

#define TR_THREADS 256           /* threads of a block */
#define TR_ROW_CHUNK 64          /* rows of one partial column sum (backend_cpu_train.c's ROW_CHUNK) */
#define TR_SUM_CHUNK (1 << 16)   /* elements of one partial sum of squares (its SUM_CHUNK) */

__device__ static __forceinline__ int64_t tr_id(void) { return (int64_t)blockIdx.x * blockDim.x + threadIdx.x; }

/* ---- memory, GEMM fallback ---- */

__global__ static void k_tr_fill(float *p, int64_t n, float v) {
    int64_t i = tr_id();
    if (i < n) p[i] = v;
}

/* an operand's value: fp32 as stored, or bf16 bits widened (exact) */
__device__ static __forceinline__ float tr_val(float x) { return x; }
__device__ static __forceinline__ float tr_val(__nv_bfloat16 x) { return __bfloat162float(x); }

/* column-major C[m, n] = alpha op(A) op(B) + beta C as cuBLAS defines it (op: transposed when TA /
 * TB), one thread per element, the inner products in k order by fmaf; beta 0 never reads C. T:
 * float, or __nv_bfloat16 operands (exact products, fp32 sums) */
template <typename T>
__global__ static void k_tr_gemm(int ta, int tb, int m, int n, int k, float alpha, const T *A, int lda, const T *B,
                                 int ldb, float beta, float *C, int ldc) {
    int64_t id = tr_id();
    if (id >= (int64_t)m * n) return;
    int i = (int)(id % m), j = (int)(id / m);
    float s = 0.0f;
    for (int l = 0; l < k; l++) {
        float a = tr_val(ta ? A[l + (size_t)i * lda] : A[i + (size_t)l * lda]);
        float b = tr_val(tb ? B[j + (size_t)l * ldb] : B[l + (size_t)j * ldb]);
        s = fmaf(a, b, s);
    }
    float *c = C + i + (size_t)j * ldc;
    *c = beta == 0.0f ? __fmul_rn(alpha, s) : __fadd_rn(__fmul_rn(alpha, s), __fmul_rn(beta, *c));
}

/* rows x cols of X (row stride LDX) rounded to bf16 (nearest even) into a dense [rows, cols] OUT:
 * the bf16 operands of the training GEMMs (m2d_bf16_rows' rounding) */
__global__ static void k_tr_round_bf16(const float *x, int ldx, int rows, int cols, __nv_bfloat16 *out) {
    int64_t i = tr_id();
    if (i >= (int64_t)rows * cols) return;
    out[i] = __float2bfloat16_rn(x[(size_t)(i / cols) * ldx + i % cols]);
}

/* ---- column sums: fixed chunks of TR_ROW_CHUNK rows, then the chunks in order ---- */

/* part[chunk][j] = sum over the chunk's rows r (in order, fp64) of a[r, j] (* b[r, j]) (* rs[r]);
 * grid (chunks, columns / TR_THREADS) */
__global__ static void k_tr_col_part(const float *a, int lda, const float *b, int ldb, const double *rs, int rows,
                                     int cols, double *part) {
    int j = (int)(blockIdx.y * blockDim.x + threadIdx.x), chunk = (int)blockIdx.x;
    if (j >= cols) return;
    int r1 = M2D_MIN((chunk + 1) * TR_ROW_CHUNK, rows);
    double s = 0;
    for (int r = chunk * TR_ROW_CHUNK; r < r1; r++) {
        double v = a[(size_t)r * lda + j];
        if (b) v = __dmul_rn(v, (double)b[(size_t)r * ldb + j]);
        if (rs) v = __dmul_rn(v, rs[r]);
        s = __dadd_rn(s, v);
    }
    part[(size_t)chunk * cols + j] = s;
}

/* dst[j] += the chunks' partial sums of column j added in chunk order, rounded once */
__global__ static void k_tr_col_finish(const double *part, int chunks, int cols, float *dst) {
    int j = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (j >= cols) return;
    double s = 0;
    for (int c = 0; c < chunks; c++) s = __dadd_rn(s, part[(size_t)c * cols + j]);
    dst[j] += (float)s;
}

/* ---- RMSNorm: y_j = x_j r w_j, r = (mean x^2 + eps)^(-1/2) ----
 * dx_i = r w_i dy_i - x_i r^3 / d . sum_j dy_j w_j x_j;  dw_j += sum over rows of dy_j x_j r */

/* one block per row: rr[row] = r, cc[row] = r^3 / d . sum_j dy_j w_j x_j (sums in fp64) */
__global__ static void k_rms_bwd_rows(const float *x, int ldx, const float *w, const float *dy, int lddy, int d,
                                      double eps, double *rr, double *cc) {
    const float *xr = x + (size_t)blockIdx.x * ldx, *dyr = dy + (size_t)blockIdx.x * lddy;
    double ss = 0, dot = 0;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        ss = __dadd_rn(ss, __dmul_rn((double)xr[i], (double)xr[i]));
        dot = __dadd_rn(dot, __dmul_rn(__dmul_rn((double)dyr[i], (double)w[i]), (double)xr[i]));
    }
    ss = block_sum_d(ss);
    dot = block_sum_d(dot);
    if (threadIdx.x == 0) {
        double r = 1.0 / sqrt(ss / d + eps);
        rr[blockIdx.x] = r;
        cc[blockIdx.x] = __dmul_rn(__dmul_rn(__dmul_rn(dot, r), r), r) / d;
    }
}

/* dx = (float)(r w dy - c x) + beta dx, one thread an element (dx may be dy: each element is read
 * before it is written, by the same thread) */
__global__ static void k_rms_bwd_dx(const float *x, int ldx, const float *w, const float *dy, int lddy,
                                    const double *rr, const double *cc, int rows, int d, float *dx, int lddx,
                                    float beta) {
    int64_t id = tr_id();
    if (id >= (int64_t)rows * d) return;
    int r = (int)(id / d), i = (int)(id % d);
    double dyi = dy[(size_t)r * lddy + i];
    float g = (float)__dsub_rn(__dmul_rn(__dmul_rn(rr[r], (double)w[i]), dyi), __dmul_rn(cc[r], (double)x[(size_t)r * ldx + i]));
    float *o = dx + (size_t)r * lddx + i;
    *o = beta == 0.0f ? g : __fadd_rn(__fmul_rn(beta, *o), g);
}

/* ---- attention, one query head at a time (P and dS [n, n] row-major) ---- */

/* one block per row i: P[i] = softmax over the keys row i sees (i - window < t <= i; t <= i
 * without a window), exp(*SINK) in the denominator when given, the other entries zeroed;
 * psink[i] = the sink's probability (0 without). As causal_softmax in backend_cpu_train.c. */
__global__ static void k_attn_bwd_softmax(float *P, int n, int window, const float *sink, float *psink) {
    int i = (int)blockIdx.x, lo = window > 0 ? max(0, i + 1 - window) : 0;
    float *row = P + (size_t)i * n, m = sink ? *sink : -INFINITY;
    for (int t = lo + (int)threadIdx.x; t <= i; t += blockDim.x) m = fmaxf(m, row[t]);
    m = block_max_f(m);
    double s = 0;
    for (int t = lo + (int)threadIdx.x; t <= i; t += blockDim.x) {
        row[t] = expf(__fsub_rn(row[t], m));
        s = __dadd_rn(s, (double)row[t]);
    }
    s = block_sum_d(s);
    float es = sink ? expf(__fsub_rn(*sink, m)) : 0.0f, inv = (float)(1.0 / (s + es));
    for (int t = threadIdx.x; t < n; t += blockDim.x) row[t] = t >= lo && t <= i ? __fmul_rn(row[t], inv) : 0.0f;
    if (threadIdx.x == 0) psink[i] = __fmul_rn(es, inv);
}

/* one block per row i: D = o_i . dO_i (fp64), dS[i] = P (dP - D) where P != 0 (dS holds dP on
 * entry); term[i] = psink[i] D, the row's part of dL/d sink (with sinks) */
__global__ static void k_attn_bwd_ds(const float *P, float *dS, int n, const float *o, int ldo, const float *dout,
                                     int lddo, int hd, const float *psink, double *term) {
    int i = (int)blockIdx.x;
    const float *oi = o + (size_t)i * ldo, *di = dout + (size_t)i * lddo;
    double D = 0;
    for (int c = threadIdx.x; c < hd; c += blockDim.x) D = __dadd_rn(D, __dmul_rn((double)oi[c], (double)di[c]));
    D = block_sum_d(D);
    float Df = (float)D;
    const float *p = P + (size_t)i * n;
    float *ds = dS + (size_t)i * n;
    for (int t = threadIdx.x; t < n; t += blockDim.x) ds[t] = p[t] == 0.0f ? 0.0f : __fmul_rn(p[t], __fsub_rn(ds[t], Df));
    if (psink && threadIdx.x == 0) term[i] = __dmul_rn((double)psink[i], D);
}

/* one thread: *dsink += (float)(-sum_i term[i]), the terms subtracted in row order */
__global__ static void k_attn_bwd_dsink(const double *term, int n, float *dsink) {
    if (blockIdx.x || threadIdx.x) return; /* one thread, however launched */
    double s = 0;
    for (int i = 0; i < n; i++) s = __dsub_rn(s, term[i]);
    *dsink += (float)s;
}

/* ---- elementwise backward ops, one thread an element of a rows x cols window ---- */

/* h = silu(g) u: dg = dh u s (1 + g (1 - s)), du = dh g s, s = sigmoid(g); DG holds dh on entry */
__global__ static void k_glu_bwd(const float *g, int ldg, const float *u, int ldu, int rows, int cols, float *dg,
                                 int lddg, float *du, int lddu) {
    int64_t id = tr_id();
    if (id >= (int64_t)rows * cols) return;
    size_t r = (size_t)(id / cols), c = (size_t)(id % cols);
    float gv = g[r * ldg + c], uv = u[r * ldu + c], dh = dg[r * lddg + c];
    float s = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-gv)));
    du[r * lddu + c] = __fmul_rn(__fmul_rn(dh, gv), s);
    dg[r * lddg + c] = __fmul_rn(__fmul_rn(__fmul_rn(dh, uv), s), __fadd_rn(1.0f, __fmul_rn(gv, __fsub_rn(1.0f, s))));
}

/* h = (uc + 1) gc sigmoid(alpha gc), gc = min(g, limit), uc = clamp(u, -limit, limit): dg where
 * g <= limit, du where |u| <= limit (torch's clamp gradients), else 0 */
__global__ static void k_glu_clamp_bwd(const float *g, int ldg, const float *u, int ldu, int rows, int cols,
                                       float alpha, float limit, float *dg, int lddg, float *du, int lddu) {
    int64_t id = tr_id();
    if (id >= (int64_t)rows * cols) return;
    size_t r = (size_t)(id / cols), c = (size_t)(id % cols);
    float gv = g[r * ldg + c], uv = u[r * ldu + c], dh = dg[r * lddg + c];
    float gc = fminf(gv, limit), uc = fminf(fmaxf(uv, -limit), limit);
    float s = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-__fmul_rn(alpha, gc))));
    du[r * lddu + c] = uv >= -limit && uv <= limit ? __fmul_rn(__fmul_rn(dh, gc), s) : 0.0f;
    float dgv = __fmul_rn(__fmul_rn(__fmul_rn(dh, __fadd_rn(uc, 1.0f)), s),
                          __fadd_rn(1.0f, __fmul_rn(__fmul_rn(alpha, gc), __fsub_rn(1.0f, s))));
    dg[r * lddg + c] = gv <= limit ? dgv : 0.0f;
}

/* dy zeroed where x is outside [-limit, limit] (NaN included) */
__global__ static void k_clamp_bwd(const float *x, int ldx, int rows, int cols, float limit, float *dy, int lddy) {
    int64_t id = tr_id();
    if (id >= (int64_t)rows * cols) return;
    size_t r = (size_t)(id / cols), c = (size_t)(id % cols);
    float v = x[r * ldx + c];
    if (!(v >= -limit && v <= limit)) dy[r * lddy + c] = 0.0f;
}

/* y[r, j] = the heads' x[r, h stride + j] added in head order in fp64, rounded once, + beta y */
__global__ static void k_head_sum(const float *x, int ldx, int n_heads, int stride, int rows, int cols, float *y,
                                  int ldy, float beta) {
    int64_t id = tr_id();
    if (id >= (int64_t)rows * cols) return;
    size_t r = (size_t)(id / cols), c = (size_t)(id % cols);
    double s = 0;
    for (int h = 0; h < n_heads; h++) s = __dadd_rn(s, (double)x[r * ldx + (size_t)h * stride + c]);
    float *o = y + r * ldy + c;
    *o = __fadd_rn((float)s, beta != 0.0f ? __fmul_rn(beta, *o) : 0.0f);
}

/* one thread a column c: table[tok[i], c] += dx[i, c] for i in order (repeated tokens add up in
 * row order, as the CPU); a token outside [0, V) is skipped (the trainer checks its data) */
__global__ static void k_embed_bwd(const int32_t *tok, int n, const float *dx, int lddx, int cols, int V,
                                   float *table, int ldt) {
    int c = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (c >= cols) return;
    for (int i = 0; i < n; i++)
        if (tok[i] >= 0 && tok[i] < V) table[(size_t)tok[i] * ldt + c] += dx[(size_t)i * lddx + c];
}

/* ---- losses ---- */

/* one block per row: the divergence between softmax(zt) and softmax(zs) (natural log) into
 * loss[row] (fp64), zs replaced by scale * its gradient. With shift = lse_t - lse_s:
 *   forward KL: L = sum pt (zt - zs - shift), dL/dzs = ps - pt;
 *   reverse KL: L = sum ps (zs - zt + shift), dL/dzs_k = ps_k (zs_k - zt_k + shift - L).
 * Exponentials in fp32, their sums and L in fp64 (as kd_row in backend_cpu_train.c). */
__global__ static void k_kd_rows(int reverse, const float *zt, int ldt, float *zs, int lds, int V, double scale,
                                 double *loss) {
    const float *t = zt + (size_t)blockIdx.x * ldt;
    float *s = zs + (size_t)blockIdx.x * lds;
    float mt = -INFINITY, ms = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x) mt = fmaxf(mt, t[i]), ms = fmaxf(ms, s[i]);
    mt = block_max_f(mt);
    ms = block_max_f(ms);
    double st = 0, ss = 0;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        st = __dadd_rn(st, (double)expf(__fsub_rn(t[i], mt)));
        ss = __dadd_rn(ss, (double)expf(__fsub_rn(s[i], ms)));
    }
    st = block_sum_d(st);
    ss = block_sum_d(ss);
    double shift = ((double)mt + log(st)) - ((double)ms + log(ss)), it = 1.0 / st, is = 1.0 / ss, L = 0;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        double pt = __dmul_rn((double)expf(__fsub_rn(t[i], mt)), it), ps = __dmul_rn((double)expf(__fsub_rn(s[i], ms)), is);
        double diff = __dsub_rn(__dsub_rn((double)t[i], (double)s[i]), shift); /* log pt - log ps */
        if (!reverse) {
            L = __dadd_rn(L, __dmul_rn(pt, diff));
            s[i] = (float)__dmul_rn(scale, __dsub_rn(ps, pt));
        } else {
            L = __dadd_rn(L, __dmul_rn(ps, -diff));
        }
    }
    L = block_sum_d(L);
    for (int i = threadIdx.x; reverse && i < V; i += blockDim.x) {
        double e = expf(__fsub_rn(s[i], ms)), diff = __dsub_rn(__dsub_rn((double)s[i], (double)t[i]), -shift);
        s[i] = (float)__dmul_rn(__dmul_rn(__dmul_rn(scale, e), is), __dsub_rn(diff, L));
    }
    if (threadIdx.x == 0) loss[blockIdx.x] = L;
}

/* one block per row: loss[row] = sum (a - b)^2 (fp64); da += (float)(scale 2 (a - b)) */
__global__ static void k_mse_rows(const float *a, int lda, const float *b, int ldb, int cols, double scale, float *da,
                                  int ldda, double *loss) {
    const float *ar = a + (size_t)blockIdx.x * lda, *br = b + (size_t)blockIdx.x * ldb;
    float *dr = da + (size_t)blockIdx.x * ldda;
    double s = 0;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        double diff = __dsub_rn((double)ar[i], (double)br[i]);
        s = __dadd_rn(s, __dmul_rn(diff, diff));
        dr[i] = __fadd_rn(dr[i], (float)__dmul_rn(__dmul_rn(scale, 2.0), diff));
    }
    s = block_sum_d(s);
    if (threadIdx.x == 0) loss[blockIdx.x] = s;
}

/* ---- the gradient norm and AdamW ---- */

/* one block per chunk of TR_SUM_CHUNK elements: part[chunk] = its sum of squares (fp64) */
__global__ static void k_sumsq_part(const float *x, int64_t n, double *part) {
    int64_t a = (int64_t)blockIdx.x * TR_SUM_CHUNK, b = M2D_MIN(a + TR_SUM_CHUNK, n);
    double s = 0;
    for (int64_t i = a + threadIdx.x; i < b; i += blockDim.x) s = __dadd_rn(s, __dmul_rn((double)x[i], (double)x[i]));
    s = block_sum_d(s);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

/* one thread: *out = the N parts added in order */
__global__ static void k_sum_parts(const double *part, int n, double *out) {
    if (blockIdx.x || threadIdx.x) return;
    double s = 0;
    for (int i = 0; i < n; i++) s = __dadd_rn(s, part[i]);
    *out = s;
}

struct adamw_dev {
    float decay, b1c, b2, b2c, bc2_sqrt, eps, step_size, grad_scale; /* as adamw_job in backend_cpu_train.c */
};

/* torch.optim.AdamW's single-tensor step, its operations in its order, in fp32 */
__global__ static void k_adamw(float *p, const float *g, float *m, float *v, int64_t n, adamw_dev a) {
    int64_t i = tr_id();
    if (i >= n) return;
    float gi = __fmul_rn(g[i], a.grad_scale);
    float pi = __fmul_rn(p[i], a.decay);                                  /* param.mul_(1 - lr wd) */
    float mi = __fadd_rn(m[i], __fmul_rn(a.b1c, __fsub_rn(gi, m[i])));    /* exp_avg.lerp_(grad, 1 - beta1) */
    float vi = __fadd_rn(__fmul_rn(v[i], a.b2), __fmul_rn(__fmul_rn(a.b2c, gi), gi)); /* .mul_(b2).addcmul_ */
    float denom = __fadd_rn(__fdiv_rn(sqrtf(vi), a.bc2_sqrt), a.eps);
    p[i] = __fadd_rn(pi, __fmul_rn(-a.step_size, __fdiv_rn(mi, denom))); /* param.addcdiv_(m, denom, -step) */
    m[i] = mi;
    v[i] = vi;
}

#endif
