/* bench_precision — what bf16 GEMMs change on the tiny teacher's real weights and activations,
 * before the engine runs them: the fp32 engine runs WikiText-2 windows and its MoE hook hands over
 * each layer's real FFN input; this bench then recomputes that layer's router and routed experts
 * with the GEMM module in fp32 and in bf16 and compares both with a float64 reference:
 *   router logits: relative error (‖Δ‖₂/‖ref‖₂ over all tokens × experts), tokens whose top-k set
 *                  or top-1 expert changes against fp32's routing, mean |Δ gate weight|;
 *   experts:       relative error of the gated MoE output Σ_k g_k f_k(x) (fp32 routing).
 * The engine-level comparison (PPL, calibration scores, selected sets) follows the integration.
 * Env: M2D_MODELS (default ../shared/models), M2D_DATA (default data), BENCH_WINDOWS (default 4). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "engine/backend.h"
#include "engine/engine.h"
#include "engine/gemm.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    int n, d, E, k;
    float *x;       /* [n, d] FFN inputs of one layer, all windows */
    int32_t *topk;  /* [n, k] fp32 engine's routing */
} layer_inputs;

typedef struct {
    layer_inputs *L; /* by model layer */
    int cap_tokens;
} capture;

static int hook(void *user, const m2d_moe_event *ev) {
    capture *c = user;
    layer_inputs *L = &c->L[ev->layer];
    if (!L->x) {
        L->x = m2d_malloc(sizeof(float) * (size_t)c->cap_tokens * ev->hidden);
        L->topk = m2d_malloc(sizeof(int32_t) * (size_t)c->cap_tokens * ev->top_k);
        L->d = ev->hidden; L->E = ev->n_experts; L->k = ev->top_k;
    }
    memcpy(L->x + (size_t)L->n * L->d, ev->x, sizeof(float) * (size_t)ev->n_tokens * L->d);
    memcpy(L->topk + (size_t)L->n * L->k, ev->topk, sizeof(int32_t) * (size_t)ev->n_tokens * L->k);
    L->n += ev->n_tokens;
    return 0;
}

static m2d_gemm_w wview(const m2d_tensor *t) {
    return m2d_gemm_weight(t->dtype, t->data, (int)t->shape[0], (int)t->shape[1], t->shape[1]);
}

/* float64 Y = X Wᵀ */
static void ref_gemm(const float *x, int m, const m2d_tensor *t, double *y) {
    int out = (int)t->shape[0], in = (int)t->shape[1];
    float *w = m2d_tensor_f32(t);
    for (int i = 0; i < m; i++)
        for (int o = 0; o < out; o++) {
            double s = 0;
            for (int k = 0; k < in; k++) s += (double)x[(size_t)i * in + k] * w[(size_t)o * in + k];
            y[(size_t)i * out + o] = s;
        }
    free(w);
}

static double rel_err(const float *y, const double *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += (y[i] - ref[i]) * (y[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / den);
}

/* top-k of a row of logits (softmax is monotone; ties -> lower index) as a bit set over E <= 64*16
 * experts */
static void topk_set(const float *z, int E, int k, uint64_t *set, int *top1) {
    memset(set, 0, sizeof(uint64_t) * 16);
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (!(set[e / 64] >> (e % 64) & 1) && (best < 0 || z[e] > z[best])) best = e;
        set[best / 64] |= 1ull << (best % 64);
        if (j == 0) *top1 = best;
    }
}

/* expert E_ on rows X [m, d]: down(silu(gate x) * up x) in the context's precision, or in double */
static void expert_gemm(m2d_gemm_ctx *g, const m2d_layer *Lw, int e, const float *x, int m, int d, int de, float *y) {
    float *a = m2d_malloc(sizeof(float) * (size_t)m * de), *b = m2d_malloc(sizeof(float) * (size_t)m * de);
    m2d_gemm_w wg = wview(Lw->exp_gate[e]), wu = wview(Lw->exp_up[e]), wd = wview(Lw->exp_down[e]);
    if (m2d_gemm(g, x, d, m, &wg, a, de, 0.0f) || m2d_gemm(g, x, d, m, &wu, b, de, 0.0f)) exit(1);
    for (size_t i = 0; i < (size_t)m * de; i++) a[i] = a[i] / (1.0f + expf(-a[i])) * b[i];
    if (m2d_gemm(g, a, de, m, &wd, y, d, 0.0f)) exit(1);
    free(a); free(b);
}

static void expert_ref(const m2d_layer *Lw, int e, const float *x, int m, int d, int de, double *y) {
    double *a = m2d_malloc(sizeof(double) * (size_t)m * de), *b = m2d_malloc(sizeof(double) * (size_t)m * de);
    ref_gemm(x, m, Lw->exp_gate[e], a);
    ref_gemm(x, m, Lw->exp_up[e], b);
    float *w = m2d_tensor_f32(Lw->exp_down[e]);
    for (int i = 0; i < m; i++)
        for (int o = 0; o < d; o++) {
            double s = 0;
            for (int j = 0; j < de; j++) {
                double gv = a[(size_t)i * de + j];
                s += gv / (1 + exp(-gv)) * b[(size_t)i * de + j] * w[(size_t)o * de + j];
            }
            y[(size_t)i * d + o] = s;
        }
    free(w); free(a); free(b);
}

/* Σ_k g_k f_k(x_t) for every token (fp32 routing and gates), in fp32 (g32), bf16 (g16), double */
static void moe_outputs(m2d_gemm_ctx *g32, m2d_gemm_ctx *g16, const m2d_layer *Lw, const layer_inputs *L,
                        const float *gates, int de, float *o32, float *o16, double *oref) {
    int d = L->d, n = L->n, k = L->k;
    float *xs = m2d_malloc(sizeof(float) * (size_t)n * d), *y32 = m2d_malloc(sizeof(float) * (size_t)n * d),
          *y16 = m2d_malloc(sizeof(float) * (size_t)n * d);
    double *yr = m2d_malloc(sizeof(double) * (size_t)n * d);
    int *rows = m2d_malloc(sizeof(int) * (size_t)n * k);
    for (int e = 0; e < L->E; e++) {
        int m = 0;
        for (int i = 0; i < n * k; i++)
            if (L->topk[i] == e) {
                rows[m] = i;
                memcpy(xs + (size_t)m++ * d, L->x + (size_t)(i / k) * d, sizeof(float) * d);
            }
        if (!m) continue;
        expert_gemm(g32, Lw, e, xs, m, d, de, y32);
        expert_gemm(g16, Lw, e, xs, m, d, de, y16);
        expert_ref(Lw, e, xs, m, d, de, yr);
        for (int r = 0; r < m; r++) {
            size_t t = (size_t)(rows[r] / k) * d, s = (size_t)r * d;
            double gw = gates[rows[r]];
            for (int j = 0; j < d; j++) {
                o32[t + j] += (float)(gw * y32[s + j]);
                o16[t + j] += (float)(gw * y16[s + j]);
                oref[t + j] += gw * yr[s + j];
            }
        }
    }
    free(xs); free(y32); free(y16); free(yr); free(rows);
}

/* renormalised softmax gates of the routed experts (fp32 routing) from logits z [n, E] */
static void gates_of(const float *z, const layer_inputs *L, float *gates) {
    for (int t = 0; t < L->n; t++) {
        const float *r = z + (size_t)t * L->E;
        double s = 0, mx = -INFINITY;
        for (int j = 0; j < L->k; j++) mx = fmax(mx, r[L->topk[(size_t)t * L->k + j]]);
        for (int j = 0; j < L->k; j++) s += exp(r[L->topk[(size_t)t * L->k + j]] - mx);
        for (int j = 0; j < L->k; j++)
            gates[(size_t)t * L->k + j] = (float)(exp(r[L->topk[(size_t)t * L->k + j]] - mx) / s);
    }
}

static void analyse_layer(m2d_gemm_ctx *g32, m2d_gemm_ctx *g16, const m2d_layer *Lw, const layer_inputs *L, int de,
                          int layer) {
    int n = L->n, E = L->E, k = L->k, d = L->d;
    float *z32 = m2d_malloc(sizeof(float) * (size_t)n * E), *z16 = m2d_malloc(sizeof(float) * (size_t)n * E);
    double *zr = m2d_malloc(sizeof(double) * (size_t)n * E);
    m2d_gemm_w wr = wview(Lw->router);
    if (m2d_gemm(g32, L->x, d, n, &wr, z32, E, 0.0f) || m2d_gemm(g16, L->x, d, n, &wr, z16, E, 0.0f)) exit(1);
    ref_gemm(L->x, n, Lw->router, zr);
    int set_changed = 0, top1_changed = 0;
    for (int t = 0; t < n; t++) {
        uint64_t s32[16], s16[16];
        int t32, t16;
        topk_set(z32 + (size_t)t * E, E, k, s32, &t32);
        topk_set(z16 + (size_t)t * E, E, k, s16, &t16);
        set_changed += memcmp(s32, s16, sizeof s32) != 0;
        top1_changed += t32 != t16;
    }
    float *g32w = m2d_malloc(sizeof(float) * (size_t)n * k), *g16w = m2d_malloc(sizeof(float) * (size_t)n * k);
    gates_of(z32, L, g32w);
    gates_of(z16, L, g16w);
    double dg = 0;
    for (int i = 0; i < n * k; i++) dg += fabs(g32w[i] - g16w[i]);
    float *o32 = m2d_calloc((size_t)n * d, sizeof(float)), *o16 = m2d_calloc((size_t)n * d, sizeof(float));
    double *oref = m2d_calloc((size_t)n * d, sizeof(double));
    moe_outputs(g32, g16, Lw, L, g32w, de, o32, o16, oref);
    printf("| %d | %d | %.2e | %.2e | %.2f %% | %.2f %% | %.1e | %.2e | %.2e |\n", layer, n,
           rel_err(z32, zr, (size_t)n * E), rel_err(z16, zr, (size_t)n * E), 100.0 * set_changed / n,
           100.0 * top1_changed / n, dg / (n * k), rel_err(o32, oref, (size_t)n * d), rel_err(o16, oref, (size_t)n * d));
    free(z32); free(z16); free(zr); free(g32w); free(g16w); free(o32); free(o16); free(oref);
}

/* the first WINDOWS x L tokens of the WikiText-2 test file, encoded with the model's tokenizer */
static int32_t *load_tokens(const char *model_dir, int need, size_t *n_ids) {
    const char *data = getenv("M2D_DATA") ? getenv("M2D_DATA") : "data";
    char *tpath = m2d_path_join(model_dir, "tokenizer.json");
    char *dpath = m2d_path_join(data, "wikitext-2-raw/wikitext-2-raw/wiki.test.raw");
    m2d_tokenizer *tk = NULL;
    size_t len = 0;
    char *text = NULL;
    int32_t *ids = NULL;
    if (m2d_tokenizer_load(tpath, &tk) == 0 && (text = m2d_read_file(dpath, &len)) != NULL) {
        size_t cut = M2D_MIN(len, (size_t)need * 16); /* a few bytes per token are plenty */
        if (m2d_tokenizer_encode(tk, text, cut, &ids, n_ids)) ids = NULL;
    }
    if (!ids) printf("bench_precision: skipped (%s)\n", m2d_errmsg());
    m2d_tokenizer_free(tk);
    free(text); free(tpath); free(dpath);
    return ids;
}

int main(void) {
    const char *models = getenv("M2D_MODELS") ? getenv("M2D_MODELS") : "../shared/models";
    int windows = getenv("BENCH_WINDOWS") ? atoi(getenv("BENCH_WINDOWS")) : 4;
    char *dir = m2d_path_join(models, "tiny-qwen3moe");
    m2d_model *m;
    if (m2d_model_open(dir, &m)) {
        printf("bench_precision: skipped (%s)\n", m2d_errmsg());
        free(dir);
        return 0;
    }
    const m2d_config *c = &m->cfg;
    int L = c->max_position_embeddings;
    size_t n_ids = 0;
    int32_t *ids = load_tokens(dir, windows * L, &n_ids);
    if (!ids || n_ids < (size_t)windows * L) {
        m2d_model_close(m);
        free(dir); free(ids);
        return 0;
    }
    capture cap = {m2d_calloc((size_t)c->num_hidden_layers, sizeof(layer_inputs)), windows * L};
    m2d_engine *e;
    if (m2d_engine_new(m, 2, &e)) return 1;
    m2d_engine_set_moe_hook(e, hook, &cap);
    double lp;
    for (int w = 0; w < windows; w++)
        if (m2d_engine_logprobs(e, ids + (size_t)w * L, L, ids + (size_t)w * L, L - 1, &lp)) return 1;
    m2d_engine_free(e);
    m2d_pool *pool = m2d_pool_new(2);
    m2d_gemm_ctx *g32, *g16;
    if (m2d_gemm_ctx_new(M2D_PREC_FP32, pool, &g32) || m2d_gemm_ctx_new(M2D_PREC_BF16, pool, &g16)) return 1;
    m2d_backend_host_blas_threads(1); /* the pool's threads are the only ones */
    printf("tiny-qwen3moe, %d WikiText-2 test windows of %d tokens; bf16 kernel: %s (ISA %s)\n\n", windows, L,
           m2d_gemm_bf16_native() ? "oneDNN" : "sgemm on bf16-rounded operands", m2d_gemm_isa_name());
    printf("| layer | tokens | router rel. err fp32 | router rel. err bf16 | top-%d set changed (bf16 vs fp32) | "
           "top-1 changed | mean abs. gate diff | MoE output rel. err fp32 | MoE output rel. err bf16 |\n",
           c->num_experts_per_tok);
    printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int l = 0; l < c->num_hidden_layers; l++)
        if (cap.L[l].x) analyse_layer(g32, g16, &m->layers[l], &cap.L[l], c->moe_intermediate_size, l);
    printf("\nrel. err: ‖y - y_ref‖₂ / ‖y_ref‖₂ against float64 on the same inputs and weights; MoE output with "
           "fp32 routing and gates, so it isolates the expert GEMMs.\n");
    for (int l = 0; l < c->num_hidden_layers; l++) {
        free(cap.L[l].x);
        free(cap.L[l].topk);
    }
    free(cap.L); free(ids); free(dir);
    m2d_gemm_ctx_free(g32);
    m2d_gemm_ctx_free(g16);
    m2d_pool_free(pool);
    m2d_model_close(m);
    return 0;
}
