/* backend_cpu_moe — the "cpu" backend's MoE ops: routing (softmax / sigmoid, top-k, group-limited
 * top-k), the routed experts as grouped GEMMs (bucket tokens by expert, gate/up, activation,
 * down, scatter-add in expert-id order), and calibration's every-expert pass, the Gram of the
 * expert outputs in fp64 and their reductions (experts_reduce). See backend_cpu.c for the conventions. */
#include "engine/backend_cpu_impl.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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

void m2d_cpu_route(m2d_backend *be, m2d_mat *logits, const m2d_route_args *r, m2d_buf *topkb, m2d_buf *gatesb) {
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

/* Expert weight W ([n, in]) as the GEMMs of A read it: its prepared copy when there is one, except
 * under A's exact_rows where the module has an exact-rows plan that pads calls and splits k (gemm.h:
 * a prepared copy holds all of k in one layout): then as stored, in moe and experts_all alike. */
static m2d_gemm_w expert_view(const cpu_be *c, const m2d_moe_args *a, const m2d_weight *w, int n) {
    int rows, kc;
    if (a->exact_rows && m2d_gemm_plan_of(gemm_ctx(c, a->prec), &rows, &kc)) return m2d_gemm_tensor_rows(W(w)->t, 0, n);
    return gemm_view(c, w, 0, n, a->prec);
}

/* Grouped GEMMs: spread over the pool one GEMM per item (expert_parallel), or one after another,
 * each split over the pool; same bits either way (the module's tiles are fixed). */
static void run_groups(cpu_be *c, m2d_precision prec, const m2d_gemm_group *g, int n) {
    m2d_gemm_ctx *ctx = gemm_ctx(c, prec);
    if (c->expert_parallel) {
        if (m2d_gemm_grouped(ctx, g, n)) fail(c);
        return;
    }
    for (int i = 0; i < n && !c->failed; i++) /* a group of one: split over the pool, exact_rows kept */
        if (m2d_gemm_grouped(ctx, &g[i], 1)) fail(c);
}


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
        else m2d_vexp_swiglu(g, u, d, g);
    }
}

/* the biases B[e] of experts 0..E-1 as fp32 [E, len] (NULL when the experts have none) */
static float *bias_table(cpu_be *c, m2d_weight *const *b, int E, int len) {
    if (!b) return NULL;
    float *t = m2d_malloc(sizeof(float) * (size_t)E * len);
    for (int e = 0; e < E; e++) m2d_cpu_weight_f32(&c->base, b[e], 0, len, t + (size_t)e * len);
    return t;
}


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
void m2d_cpu_moe(m2d_backend *be, const m2d_moe_args *a) {
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
        wv[3 * na] = expert_view(c, a, a->gate[ex], de);
        wv[3 * na + 1] = expert_view(c, a, a->up[ex], de);
        wv[3 * na + 2] = expert_view(c, a, a->down[ex], d);
        const float *x = xs + (size_t)m0 * d;
        grp[2 * na] = (m2d_gemm_group){x, d, mn, &wv[3 * na], g + (size_t)m0 * de, de, 0.0f, a->exact_rows};
        grp[2 * na + 1] = (m2d_gemm_group){x, d, mn, &wv[3 * na + 1], u + (size_t)m0 * de, de, 0.0f, a->exact_rows};
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
        grp[i] = (m2d_gemm_group){g + (size_t)m0 * de, de, b.count[ex + 1] - m0, &wv[3 * i + 2], Y + (size_t)m0 * d, d, 0.0f,
                                  a->exact_rows};
    }
    run_groups(c, a->prec, grp, na);
    for (int r = 0; bd && r < nk; r++) add_rows(Y + (size_t)r * d, d, 1, d, bd + (size_t)rexp[r] * d);
    free(rexp); free(bg); free(bu); free(bd);
    scatter_job sc = {a, &b, Y};
    if (!c->failed) parallel_for(c, row_blocks(n), scatter_item, &sc);
    free(wv); free(grp);
    buckets_free(&b);
}

/* ---- calibration: every expert on every token, the Gram of their outputs ---- */

/* Experts in chunks, so that the activations [chunk, n, d_e] x 2 stay within ~64 MB (at least 4
 * experts: the grouped calls need items for every thread; a multiple of the thread count, so that
 * no thread waits for the last down projection); each chunk: gate and up of its experts
 * as one grouped call on the shared rows, the activation, down straight into the output columns. */
void m2d_cpu_experts_all(m2d_backend *be, const m2d_moe_args *a) {
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
            wv[3 * i] = expert_view(c, a, a->gate[e0 + i], de);
            wv[3 * i + 1] = expert_view(c, a, a->up[e0 + i], de);
            wv[3 * i + 2] = expert_view(c, a, a->down[e0 + i], d);
            grp[2 * i] = (m2d_gemm_group){F(&a->x), a->x.ld, n, &wv[3 * i], g + (size_t)i * n * de, de, 0.0f, a->exact_rows};
            grp[2 * i + 1] = (m2d_gemm_group){F(&a->x), a->x.ld, n, &wv[3 * i + 1], u + (size_t)i * n * de, de, 0.0f,
                                              a->exact_rows};
        }
        run_groups(c, a->prec, grp, 2 * ne);
        rows_job sj = {.g = g, .u = u, .n = ne * n, .d = de, .a = a, .bg = bg, .bu = bu, .e0 = e0, .per = n};
        parallel_for(c, row_blocks(ne * n), act_item, &sj);
        for (int i = 0; i < ne; i++)
            grp[i] = (m2d_gemm_group){g + (size_t)i * n * de, de, n, &wv[3 * i + 2], F(&a->out) + (size_t)(e0 + i) * d,
                                      a->out.ld, 0.0f, a->exact_rows};
        run_groups(c, a->prec, grp, ne);
        for (int t = 0; bd && t < n; t++) /* expert e0 + i's columns of token t: its down bias */
            for (int i = 0; i < ne; i++)
                add_rows(F(&a->out) + (size_t)t * a->out.ld + (size_t)(e0 + i) * d, d, 1, d, bd + (size_t)(e0 + i) * d);
    }
    free(wv); free(grp); free(bg); free(bu); free(bd);
}

/* Every expert weight of A takes oneDNN with rows computed independently of the batch (gemm.h; with
 * A's exact_rows also where the module pads and splits the calls to make them so). */
int m2d_cpu_experts_rows_exact(m2d_backend *be, const m2d_moe_args *a) {
    cpu_be *c = CPU(be);
    m2d_gemm_ctx *g = gemm_ctx(c, a->prec);
    for (int e = 0; e < a->n_experts; e++) {
        m2d_gemm_w w[3] = {expert_view(c, a, a->gate[e], a->d_ff), expert_view(c, a, a->up[e], a->d_ff),
                           expert_view(c, a, a->down[e], a->x.cols)};
        for (int i = 0; i < 3; i++)
            if (!(a->exact_rows ? m2d_gemm_rows_independent_exact(g, &w[i]) : m2d_gemm_rows_independent(g, &w[i])))
                return 0;
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

/* gt's upper triangle (and some of the lower) = F_t F_tᵀ, F_t = FT as [E, d]: rows [0, h) against every
 * expert, rows [h, E) against experts [h, E) only: 3/4 of the full product's work */
static int token_gram_upper(cpu_be *c, const float *ft, int E, int d, float *gt) {
    int h = E / 2;
    m2d_gemm_ctx *g = gemm_ctx(c, M2D_PREC_FP32);
    m2d_gemm_w all = m2d_gemm_weight(M2D_F32, ft, E, d, d), low = m2d_gemm_weight(M2D_F32, ft + (size_t)h * d, E - h, d, d);
    return (h > 0 && m2d_gemm(g, ft, d, h, &all, gt, E, 0.0f)) ||
           m2d_gemm(g, ft + (size_t)h * d, d, E - h, &low, gt + (size_t)h * E + h, E, 0.0f);
}

static void gram_block_f32(const gram_job *j, int t0, int nt, double *part) {
    int E = j->E, d = j->d;
    float *gt = j->gt[m2d_pool_worker()];
    memset(part, 0, sizeof(double) * (size_t)E * E);
    for (int t = 0; t < nt; t++) {
        const float *ft = F(j->f) + (size_t)(t0 + t) * j->f->ld;
        if (token_gram_upper(j->c, ft, E, d, gt)) {
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

void m2d_cpu_gram(m2d_backend *be, const m2d_mat *f, int E, m2d_buf *gb, m2d_precision prec) {
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

/* ---- calibration's reductions of the expert outputs (backend.h experts_reduce) ---- */

typedef double v8d __attribute__((vector_size(64)));
typedef float v8f __attribute__((vector_size(32)));

/* acc[j] += f[j] (element by element: the scalar loop's bits) and the return Σ_j f[j]² (8
 * partial sums added in a fixed order, then the tail). The 64-byte vectors stay inside this
 * function: passing one by value would depend on the ISA the file is compiled for. */
static double add_norm2(double *acc, const float *f, int d) {
    v8d q = {0};
    int j = 0;
    for (; j + 8 <= d; j += 8) {
        v8f x4;
        v8d x, a;
        memcpy(&x4, f + j, sizeof x4);
        x = __builtin_convertvector(x4, v8d);
        memcpy(&a, acc + j, sizeof a);
        a += x;
        memcpy(acc + j, &a, sizeof a);
        q += x * x;
    }
    double s = 0;
    for (int i = 0; i < 8; i++) s += q[i];
    for (; j < d; j++) {
        acc[j] += f[j];
        s += (double)f[j] * f[j];
    }
    return s;
}

typedef struct {
    cpu_be *c;
    const m2d_mat *f;
    int E, d, k1;
    const int32_t *ids;
    float *sel;
    double *sum_f, *norm2;
} reduce_job;

/* items 0 .. E-1: expert e's sums over the tokens in order; then one item a token: its chosen rows */
static void reduce_item(void *ctx, int item) {
    const reduce_job *j = ctx;
    int n = j->f->rows, E = j->E, d = j->d;
    const float *f = F(j->f);
    if (item < E) {
        for (int t = 0; t < n; t++)
            j->norm2[(size_t)item * n + t] = add_norm2(j->sum_f + (size_t)item * d, f + (size_t)t * j->f->ld + (size_t)item * d, d);
        return;
    }
    int t = item - E;
    for (int r = 0; r < j->k1; r++) {
        int e = j->ids[(size_t)t * j->k1 + r];
        float *o = j->sel + ((size_t)t * j->k1 + r) * d;
        if (e < 0) memset(o, 0, sizeof(float) * d);
        else memcpy(o, f + (size_t)t * j->f->ld + (size_t)e * d, sizeof(float) * d);
    }
}

void m2d_cpu_experts_reduce(m2d_backend *be, const m2d_mat *f, int E, const m2d_buf *ids, int k1, m2d_buf *sel,
                            m2d_buf *sum_f, m2d_buf *norm2) {
    cpu_be *c = CPU(be);
    int n = f->rows;
    if (c->failed || n <= 0) return;
    reduce_job j = {c, f, E, f->cols / E, k1, B(ids), B(sel), B(sum_f), B(norm2)};
    parallel_for(c, E + n, reduce_item, &j);
}
