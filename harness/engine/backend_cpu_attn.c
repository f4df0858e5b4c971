/* backend_cpu_attn — the "cpu" backend's attention: a row-by-row path (one query row per item,
 * fp32 dot products) and a GEMM path for long segments (blocks of query rows per kv head through
 * the GEMM module); window, sinks, scale and bf16 operands (m2d_attn_args.prec) in both. See
 * backend_cpu.c for the conventions. */
#include "engine/backend_cpu_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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

/* y = a x, elementwise (restrict: the compiler vectorises it; the same bits as the scalar loop) */
static inline void scale_into(float *restrict y, const float *restrict x, float a, int n) {
    for (int i = 0; i < n; i++) y[i] = x[i] * a;
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
    int bf16;            /* m2d_attn_args.prec BF16: operands and numerators rounded to bf16 */
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
        if (j->bf16) /* the numerators' products with v as bf16 operands; s summed them unrounded */
            m2d_bf16_rows_f32(sc + lo, nk - lo, 1, nk - lo, sc + lo);
        for (int t = lo; t < j->np; t++) axpy(sc[t], vp + (size_t)t * hd, acc, hd);
        for (int t = M2D_MAX(lo - j->np, 0); t <= i; t++)
            axpy(sc[j->np + t], j->vs + (size_t)t * j->ldk + (size_t)g * hd, acc, hd);
        float inv = (float)(1.0 / s);
        float *o = j->out + (size_t)i * j->ldo + (size_t)h * hd;
        scale_into(o, acc, inv, hd);
    }
    free(acc);
    free(sc);
}

/* The GEMM formulation, through the GEMM module in the call's attention precision (fp32 unless
 * m2d_attn_args.prec asks for bf16 operands; the engine's GEMM precision does not enter). One work item: a kv head g and a block of query rows
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
    void *kc, *vt;                  /* [n_kv][nk][hd] keys, [n_kv][hd][nk] values transposed: fp32,
                                     * or bf16 bit patterns when a->bf16 */
    float *work;                    /* per worker: stacked Q rows, scores, outputs, 1/sums */
    size_t work_per;
} attg_job;

/* kv head g: its keys dense and its values transposed, prefix (the cache) then segment; as bf16
 * when the call's operands are (the GEMM module then reads them as stored) */
static void attg_gather(void *ctx, int g) {
    const attg_job *jb = ctx;
    const attn_host *j = jb->a;
    int hd = j->hd, np = j->np, nk = jb->nk;
    size_t at = (size_t)g * nk * hd; /* the head's first element, in both arrays */
    for (int t = 0; t < nk; t++) {
        const float *k = t < np ? j->kp + g * j->p_head_stride + (size_t)t * hd : j->ks + (size_t)(t - np) * j->ldk + (size_t)g * hd;
        const float *v = t < np ? j->vp + g * j->p_head_stride + (size_t)t * hd : j->vs + (size_t)(t - np) * j->ldk + (size_t)g * hd;
        if (j->bf16) {
            uint16_t *vt = (uint16_t *)jb->vt + at + t;
            m2d_bf16_rows(k, hd, 1, hd, (uint16_t *)jb->kc + at + (size_t)t * hd);
            for (int d = 0; d < hd; d++) vt[(size_t)d * nk] = m2d_f32_to_bf16(v[d]);
        } else {
            float *kc = (float *)jb->kc + at + (size_t)t * hd, *vt = (float *)jb->vt + at + t;
            memcpy(kc, k, sizeof(float) * (size_t)hd);
            for (int d = 0; d < hd; d++) vt[(size_t)d * nk] = v[d];
        }
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
    /* every view of this call's K and Vᵀ meets one kernel: the one for the whole. In bf16 the
     * module rounds Q, and the numerators in S, as it reads them (gemm.h) */
    m2d_dtype wt = j->bf16 ? M2D_BF16 : M2D_F32;
    size_t es = j->bf16 ? sizeof(uint16_t) : sizeof(float), head = (size_t)g * nk * hd;
    m2d_gemm_w wk = m2d_gemm_weight(wt, (const char *)jb->kc + (head + (size_t)lo * hd) * es, nkeys, hd, hd);
    m2d_gemm_w wv = m2d_gemm_weight(wt, (const char *)jb->vt + (head + (size_t)lo) * es, hd, nkeys, nk);
    wk.whole = wv.whole = (int64_t)nk * hd;
    m2d_gemm_ctx *gc = gemm_ctx(jb->c, j->bf16 ? M2D_PREC_BF16 : M2D_PREC_FP32);
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
        scale_into(o, O + (size_t)r * hd, inv[r], hd);
    }
}

/* The row path's operands in bf16: q, the segment's and the prefix's keys and values rounded
 * once into the backend's attention slot, H re-pointed at them, dense */
static void round_operands(cpu_be *c, attn_host *h) {
    int qd = h->n_heads * h->hd, kvd = h->n_kv * h->hd;
    size_t nqe = (size_t)h->nq * qd, nse = (size_t)h->nq * kvd, npe = (size_t)h->np * kvd;
    float *q = work(c, WORK_ATTN, nqe + 2 * nse + 2 * npe + 1), *ks = q + nqe, *vs = ks + nse;
    float *kp = vs + nse, *vp = kp + npe;
    m2d_bf16_rows_f32(h->q, h->ldq, h->nq, qd, q);
    m2d_bf16_rows_f32(h->ks, h->ldk, h->nq, kvd, ks);
    m2d_bf16_rows_f32(h->vs, h->ldk, h->nq, kvd, vs);
    for (int g = 0; g < h->n_kv && h->np; g++) { /* kv head g's np cache rows: [np, hd] */
        m2d_bf16_rows_f32(h->kp + g * h->p_head_stride, h->hd, h->np, h->hd, kp + (size_t)g * h->np * h->hd);
        m2d_bf16_rows_f32(h->vp + g * h->p_head_stride, h->hd, h->np, h->hd, vp + (size_t)g * h->np * h->hd);
    }
    h->q = q, h->ks = ks, h->vs = vs, h->kp = kp, h->vp = vp;
    h->ldq = qd, h->ldk = kvd, h->p_head_stride = (size_t)h->np * h->hd;
}

void m2d_cpu_attention(m2d_backend *be, const m2d_attn_args *a) {
    cpu_be *c = CPU(be);
    int nq = a->q.rows;
    if (nq <= 0) return;
    attn_host h = {F(&a->q), F(&a->k), F(&a->v), NULL, NULL, a->q.ld, a->k.ld, nq, a->np, a->n_heads, a->n_kv,
                   a->head_dim, a->out.ld, a->head_stride, F(&a->out), a->window, NULL,
                   a->scale != 0 ? a->scale : 1.0f / sqrtf((float)a->head_dim), a->prec == M2D_PREC_BF16};
    float *sinks = NULL;
    if (a->sinks) {
        sinks = m2d_malloc(sizeof(float) * (size_t)a->n_heads);
        m2d_cpu_weight_f32(be, a->sinks, 0, a->n_heads, sinks);
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
        /* keys, values (bf16 takes half of their floats) and the workers' buffers in one reused slot */
        size_t kv_floats = h.bf16 ? (kv + 1) / 2 : kv, all = 2 * kv_floats + j.work_per * (size_t)nw;
        float *slot = work(c, WORK_ATTN, all);
        j.kc = slot, j.vt = slot + kv_floats, j.work = slot + 2 * kv_floats;
        parallel_for(c, a->n_kv, attg_gather, &j);
        parallel_for(c, a->n_kv * j.n_blocks, attg_item, &j);
    } else {
        /* row blocks give the threads work when there are few heads; causal rows grow in cost, and
         * the dynamic hand-out balances that */
        int row_block = nq < 64 ? nq : 64;
        if (h.bf16) round_operands(c, &h);
        attn_job j = {&h, row_block, (nq + row_block - 1) / row_block};
        parallel_for(c, a->n_heads * j.n_blocks, attn_item, &j);
    }
    free(sinks);
}
