/* backend_cpu — OpenBLAS sgemm (single-threaded between m2d_be_begin/end) for every matmul; all
 * parallelism is our own pthreads: GEMMs split by output columns (or rows), attention by heads,
 * MoE by experts.
 * One kind of thread only: with OpenBLAS's pool threads next to ours, idle pool threads spin in
 * sched_yield and took up to half of the time on tiny shapes (perf). Splitting a GEMM by output
 * columns/rows leaves each element's reduction order unchanged, so results do not depend on the
 * thread count. */
#include "engine/backend.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

static int be_threads = 1;

void m2d_be_set_threads(int n_threads) {
    be_threads = n_threads > 0 ? n_threads : 1;
}

int m2d_be_begin(void) {
    int saved = openblas_get_num_threads();
    if (saved != 1) openblas_set_num_threads(1);
    return saved;
}

void m2d_be_end(int saved) {
    if (saved != 1) openblas_set_num_threads(saved);
}

int m2d_be_threads(void) { return be_threads; }

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

int m2d_be_worker(void) { return worker_id; }

typedef struct {
    pfor_job *job;
    int id;
} pfor_arg;

static void *pfor_thread(void *arg) {
    pfor_arg *a = arg;
    worker_id = a->id;
    in_parallel = 1;
    pfor_job *j = a->job;
    for (int i; (i = atomic_fetch_add(&j->next, 1)) < j->n;) j->fn(j->ctx, i);
    return NULL;
}

static void *pfor_worker(void *arg) {
    pfor_job *j = arg;
    for (int i; (i = atomic_fetch_add(&j->next, 1)) < j->n;) j->fn(j->ctx, i);
    return NULL;
}

void m2d_be_parallel_for(int n_items, void (*fn)(void *ctx, int item), void *ctx) {
    pfor_job j = {fn, ctx, n_items, 0};
    int nt = M2D_MIN(be_threads, n_items);
    if (nt <= 1 || in_parallel) {
        for (int i = 0; i < n_items; i++) fn(ctx, i);
        return;
    }
    pthread_t tid[64];
    pfor_arg args[64];
    nt = M2D_MIN(nt, 64);
    int started = 0;
    for (int t = 1; t < nt; t++) {
        args[started] = (pfor_arg){&j, started + 1};
        if (pthread_create(&tid[started], NULL, pfor_thread, &args[started]) == 0) started++;
    }
    worker_id = 0;
    in_parallel = 1;
    pfor_worker(&j); /* the calling thread works too; if no thread started it does everything */
    in_parallel = 0;
    for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);
}

/* ---- conversion ---- */
typedef struct {
    m2d_dtype t;
    const void *src;
    int64_t first, n, chunk;
    float *dst;
} conv_job;

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

void m2d_be_convert_1t(m2d_dtype t, const void *src, int64_t first, int64_t n, float *dst) {
    convert_range(t, src, first, n, dst);
}

static void conv_item(void *ctx, int item) {
    conv_job *j = ctx;
    int64_t a = (int64_t)item * j->chunk, b = M2D_MIN(a + j->chunk, j->n);
    convert_range(j->t, j->src, j->first + a, b - a, j->dst + a);
}

void m2d_be_convert(m2d_dtype t, const void *src, int64_t first, int64_t n, float *dst) {
    const int64_t chunk = 1 << 18;
    if (n <= chunk || be_threads <= 1) {
        convert_range(t, src, first, n, dst);
        return;
    }
    conv_job j = {t, src, first, n, chunk, dst};
    m2d_be_parallel_for((int)((n + chunk - 1) / chunk), conv_item, &j);
}

/* ---- dense ops ---- */
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

void m2d_be_matmul_wt(const float *x, int ldx, int n, int in, const float *w, int ldw, int out,
                      float *y, int ldy, float beta) {
    if (n <= 0 || out <= 0) return;
    int nt = be_threads;
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
        m2d_be_parallel_for((out + j.blk - 1) / j.blk, mm_item, &j);
    } else {
        j.blk = (n + nt - 1) / nt;
        m2d_be_parallel_for((n + j.blk - 1) / j.blk, mm_item, &j);
    }
}

void m2d_be_rmsnorm(const float *x, int ldx, const float *w, int rows, int d, double eps, float *y, int ldy) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * ldx;
        float *yr = y + (size_t)r * ldy;
        double ss = 0;
        for (int i = 0; i < d; i++) ss += (double)xr[i] * xr[i];
        float inv = (float)(1.0 / sqrt(ss / d + eps));
        for (int i = 0; i < d; i++) yr[i] = xr[i] * inv * w[i];
    }
}

void m2d_be_rope(float *x, int ldx, int n, int n_heads, int hd, const int *pos, double theta) {
    int half = hd / 2;
    double inv_freq[512];
    for (int i = 0; i < half && i < 512; i++) inv_freq[i] = pow(theta, -2.0 * i / hd);
    for (int t = 0; t < n; t++) {
        float cs[512], sn[512];
        for (int i = 0; i < half; i++) {
            double f = pos[t] * inv_freq[i];
            cs[i] = (float)cos(f);
            sn[i] = (float)sin(f);
        }
        for (int h = 0; h < n_heads; h++) {
            float *v = x + (size_t)t * ldx + (size_t)h * hd;
            for (int i = 0; i < half; i++) {
                float a = v[i], b = v[i + half];
                v[i] = a * cs[i] - b * sn[i];
                v[i + half] = b * cs[i] + a * sn[i];
            }
        }
    }
}

void m2d_be_softmax(float *x, int n) {
    float m = -INFINITY;
    for (int i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    double s = 0;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - m);
        s += x[i];
    }
    float inv = (float)(1.0 / s);
    for (int i = 0; i < n; i++) x[i] *= inv;
}

void m2d_be_swiglu(const float *g, const float *u, int64_t n, float *h) {
    for (int64_t i = 0; i < n; i++) h[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

void m2d_be_topk(const float *p, int E, int k, int32_t *idx) {
    /* selection by repeated scans: k and E are small (8 of 128); strict '>' keeps the lower
     * index on ties because indices are scanned in increasing order */
    uint8_t taken[4096];
    int big = E > 4096;
    uint8_t *tk = big ? m2d_calloc((size_t)E, 1) : taken;
    if (!big) memset(tk, 0, (size_t)E);
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (!tk[e] && (best < 0 || p[e] > p[best])) best = e;
        idx[j] = best;
        tk[best] = 1;
    }
    if (big) free(tk);
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

typedef struct {
    const float *q, *ks, *vs, *kp, *vp;
    int ldq, ldk, nq, np, n_heads, n_kv, hd, ldo, row_block, n_blocks;
    size_t p_head_stride;
    float *out;
} attn_job;

static void attn_item(void *ctx, int item) {
    const attn_job *j = ctx;
    int h = item / j->n_blocks, blk = item % j->n_blocks;
    int g = h / (j->n_heads / j->n_kv), hd = j->hd;
    int r0 = blk * j->row_block, r1 = M2D_MIN(r0 + j->row_block, j->nq);
    float scale = 1.0f / sqrtf((float)hd);
    float *sc = m2d_malloc(sizeof(float) * (size_t)(j->np + r1));
    float *acc = m2d_malloc(sizeof(float) * (size_t)hd);
    const float *kp = j->kp ? j->kp + g * j->p_head_stride : NULL;
    const float *vp = j->vp ? j->vp + g * j->p_head_stride : NULL;
    for (int i = r0; i < r1; i++) {
        const float *qi = j->q + (size_t)i * j->ldq + (size_t)h * hd;
        int nk = j->np + i + 1;
        float m = -INFINITY;
        for (int t = 0; t < j->np; t++) sc[t] = dot(qi, kp + (size_t)t * hd, hd) * scale;
        for (int t = 0; t <= i; t++)
            sc[j->np + t] = dot(qi, j->ks + (size_t)t * j->ldk + (size_t)g * hd, hd) * scale;
        for (int t = 0; t < nk; t++) m = sc[t] > m ? sc[t] : m;
        double s = 0;
        for (int t = 0; t < nk; t++) {
            sc[t] = expf(sc[t] - m);
            s += sc[t];
        }
        memset(acc, 0, sizeof(float) * (size_t)hd);
        for (int t = 0; t < j->np; t++) axpy(sc[t], vp + (size_t)t * hd, acc, hd);
        for (int t = 0; t <= i; t++) axpy(sc[j->np + t], j->vs + (size_t)t * j->ldk + (size_t)g * hd, acc, hd);
        float inv = (float)(1.0 / s);
        float *o = j->out + (size_t)i * j->ldo + (size_t)h * hd;
        for (int d = 0; d < hd; d++) o[d] = acc[d] * inv;
    }
    free(acc);
    free(sc);
}

typedef struct {
    const float *q, *ks, *vs, *kp, *vp;
    int ldq, ldk, nq, np, grp, hd, ldo, nk;
    size_t p_head_stride;
    float *out, *S; /* S: one [nq, nk] score block per worker */
} attg_job;

static void attg_item(void *ctx, int h) {
    const attg_job *j = ctx;
    int g = h / j->grp, hd = j->hd, nq = j->nq, np = j->np, nk = j->nk;
    float *S = j->S + (size_t)m2d_be_worker() * nq * nk;
    float scale = 1.0f / sqrtf((float)hd);
    const float *qh = j->q + (size_t)h * hd;
    if (np)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, np, hd, scale, qh, j->ldq, j->kp + g * j->p_head_stride,
                    hd, 0.0f, S, nk);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nq, hd, scale, qh, j->ldq, j->ks + (size_t)g * hd, j->ldk,
                0.0f, S + np, nk);
    for (int i = 0; i < nq; i++) { /* causal mask + softmax */
        float *row = S + (size_t)i * nk;
        int valid = np + i + 1;
        m2d_be_softmax(row, valid);
        memset(row + valid, 0, sizeof(float) * (size_t)(nk - valid));
    }
    float *oh = j->out + (size_t)h * hd;
    if (np)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, hd, np, 1.0f, S, nk, j->vp + g * j->p_head_stride, hd,
                    0.0f, oh, j->ldo);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, hd, nq, 1.0f, S + np, nk, j->vs + (size_t)g * hd, j->ldk,
                np ? 1.0f : 0.0f, oh, j->ldo);
}

/* The GEMM formulation, one head per worker: S = Q K^T (the full [nq, np+nq] block; the causal
 * upper part is computed and then zeroed, 2x work on the segment part but at sgemm speed),
 * masked softmax, O = P V. */
static void attention_gemm(const float *q, int ldq, const float *ks, const float *vs, int ldk, int nq,
                           const float *kp, const float *vp, size_t p_head_stride, int np, int n_heads,
                           int n_kv, int hd, float *out, int ldo) {
    int nk = np + nq, nw = M2D_MIN(be_threads, n_heads);
    attg_job j = {q, ks, vs, kp, vp, ldq, ldk, nq, np, n_heads / n_kv, hd, ldo, nk, p_head_stride, out, NULL};
    j.S = m2d_malloc(sizeof(float) * (size_t)nq * nk * (size_t)M2D_MAX(nw, 1));
    m2d_be_parallel_for(n_heads, attg_item, &j);
    free(j.S);
}

static int attn_gemm_min_rows = 64;

void m2d_be_set_attention_gemm_min_rows(int rows) { attn_gemm_min_rows = rows; }

void m2d_be_attention(const float *q, int ldq, const float *ks, const float *vs, int ldk, int nq,
                      const float *kp, const float *vp, size_t p_head_stride, int np,
                      int n_heads, int n_kv, int hd, float *out, int ldo) {
    if (nq <= 0) return;
    if (nq >= attn_gemm_min_rows) {
        attention_gemm(q, ldq, ks, vs, ldk, nq, kp, vp, p_head_stride, np, n_heads, n_kv, hd, out, ldo);
        return;
    }
    /* row blocks give the threads work when there are few heads; causal rows grow in cost,
     * and the dynamic hand-out balances that */
    int row_block = nq < 64 ? nq : 64;
    int n_blocks = (nq + row_block - 1) / row_block;
    attn_job j = {q, ks, vs, kp, vp, ldq, ldk, nq, np, n_heads, n_kv, hd, ldo, row_block, n_blocks,
                  p_head_stride, out};
    m2d_be_parallel_for(n_heads * n_blocks, attn_item, &j);
}
