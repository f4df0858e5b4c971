/* prune: Minitron importance and dense-to-dense pruning (calib/importance.h, convert/prune.h):
 *   - the engine's importance (probe hook) against the same statistics from a float64 forward
 *     written here (itself checked against tests/reffwd.c);
 *   - a planted case: neurons whose gate and up rows are zero score exactly 0, are the ones pruned,
 *     and pruning them leaves the logits unchanged;
 *   - pruning equals masking: removing FFN neurons, query heads, kv groups and whole layers gives the
 *     logits of the teacher with those neurons' down_proj columns, those heads' o_proj columns and
 *     those layers' o_proj and down_proj zeroed (embedding channels are not a mask: RMSNorm over
 *     fewer channels normalises differently; checked by the tensors' values instead);
 *   - shapes: parsing, checks, parameter counts (tiny-qwen3-dense's L4-H192-F576-A6/2: 4,868,032);
 *   - bad inputs: malformed or too large shapes, damaged and stale importance files, a MoE teacher;
 *   - the command line on tiny-qwen3-dense. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "calib/importance.h"
#include "convert/prune.h"
#include "engine/engine.h"
#include "io/st.h"
#include "model/model.h"
#include "reffwd.h"
#include "testmodel.h"

#define NW 3  /* windows */
#define WL 12 /* tokens per window */

/* ------------------------------------------------------------------ fixtures */

/* a small dense Qwen3 in f32: hidden 32, 2 layers, 4 query / 2 kv heads of 8, FFN 64, vocab 64 */
static char *dense_teacher(const char *name) {
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    o.moe = false;
    o.dtype = M2D_F32;
    o.init_std = 0.2f;
    char *dir = m2d_path_join(tu_work, name);
    assert_int_equal(m2d_testmodel_write(dir, &o), 0);
    return dir;
}

static void window_ids(int32_t *ids, int64_t *starts) {
    uint64_t st = 11;
    for (int i = 0; i < NW * WL; i++) ids[i] = (int32_t)(tu_rand_u64(&st) % 64);
    for (int w = 0; w < NW; w++) starts[w] = (int64_t)w * WL;
}

static m2d_importance *importance_of(const m2d_model *m) {
    int32_t ids[NW * WL];
    int64_t starts[NW];
    window_ids(ids, starts);
    m2d_calib_opts o = {.n_threads = 2};
    m2d_importance *imp;
    if (m2d_importance_compute(m, ids, starts, NW, WL, &o, &imp)) fail_msg("importance: %s", m2d_errmsg());
    return imp;
}

/* a copy of checkpoint SRC in DST with EDIT applied to each tensor's f32 values (F32 checkpoints) */
typedef void (*edit_fn)(const char *name, float *v, const int64_t *shape, void *ctx);
static void write_edited(const char *src, const char *dst, edit_fn edit, void *ctx) {
    m2d_model *m;
    assert_int_equal(m2d_model_open(src, &m), 0);
    m2d_st_writer *w = m2d_st_writer_new();
    for (int i = 0; i < m2d_st_count(m->st); i++) {
        const m2d_tensor *t = m2d_st_at(m->st, i);
        float *v = m2d_tensor_f32(t);
        edit(t->name, v, t->shape, ctx);
        assert_int_equal(m2d_st_writer_add_f32(w, t->name, M2D_F32, t->ndim, t->shape, v), 0);
        free(v);
    }
    assert_int_equal(m2d_mkdir_p(dst), 0);
    char *p = m2d_path_join(dst, "model.safetensors"), *c = m2d_path_join(dst, "config.json");
    assert_int_equal(m2d_st_writer_write(w, p), 0);
    tu_write(c, m->config_text, strlen(m->config_text));
    free(p);
    free(c);
    m2d_st_writer_free(w);
    m2d_model_close(m);
}

/* ------------------------------------------------------------------ a float64 forward with activations */

typedef struct {
    double *ffn_sq, *head_sq, *norm_sq, *cos_sum; /* as calib/importance.c accumulates them */
    double nll;
} ref_stats;

/* y[r] = W[r] . x (W [rows, cols] row-major) */
static void matvec(const double *W, const double *x, int rows, int cols, double *y) {
    for (int r = 0; r < rows; r++) {
        double s = 0;
        for (int c = 0; c < cols; c++) s += W[(size_t)r * cols + c] * x[c];
        y[r] = s;
    }
}

static void rmsnorm(const double *x, const double *w, int n, double eps, double *y) {
    double s = 0;
    for (int i = 0; i < n; i++) s += x[i] * x[i];
    double r = 1.0 / sqrt(s / n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * r * w[i];
}

/* per-head RMSNorm then rotate-half RoPE at position POS */
static void head_prep(double *v, const double *w, int hd, int pos, const m2d_config *c) {
    double tmp[64];
    rmsnorm(v, w, hd, c->rms_norm_eps, tmp);
    for (int i = 0; i < hd / 2; i++) {
        double a = pos * pow(c->rope_theta, -2.0 * i / hd), x = tmp[i], y = tmp[i + hd / 2];
        v[i] = x * cos(a) - y * sin(a);
        v[i + hd / 2] = y * cos(a) + x * sin(a);
    }
}

/* causal GQA attention of the N tokens' q [n][H*hd], k, v [n][KV*hd] -> o [n][H*hd] */
static void attention(const double *q, const double *k, const double *v, int n, const m2d_config *c, double *o) {
    int H = c->num_attention_heads, KV = c->num_key_value_heads, hd = c->head_dim, g = H / KV;
    double p[WL];
    for (int t = 0; t < n; t++)
        for (int h = 0; h < H; h++) {
            const double *qh = q + (size_t)t * H * hd + h * hd;
            double mx = -1e300, z = 0;
            for (int j = 0; j <= t; j++) {
                double s = 0;
                for (int i = 0; i < hd; i++) s += qh[i] * k[(size_t)j * KV * hd + (h / g) * hd + i];
                p[j] = s / sqrt(hd);
                mx = fmax(mx, p[j]);
            }
            for (int j = 0; j <= t; j++) z += p[j] = exp(p[j] - mx);
            for (int i = 0; i < hd; i++) {
                double s = 0;
                for (int j = 0; j <= t; j++) s += p[j] / z * v[(size_t)j * KV * hd + (h / g) * hd + i];
                o[(size_t)t * H * hd + h * hd + i] = s;
            }
        }
}

/* window mean of |x| per column added squared to ACC (cols of each of N rows) */
static void acc_abs(const double *x, int n, int cols, int stride, double *acc) {
    for (int j = 0; j < cols; j++) {
        double m = 0;
        for (int t = 0; t < n; t++) m += fabs(x[(size_t)t * stride + j]);
        acc[j] += (m / n) * (m / n);
    }
}

/* the window's head norms: mean over tokens of each head's L2 norm, squared into ACC */
static void acc_heads(const double *o, int n, int H, int hd, double *acc) {
    for (int h = 0; h < H; h++) {
        double m = 0;
        for (int t = 0; t < n; t++) {
            double s = 0;
            for (int i = 0; i < hd; i++) s += o[(size_t)t * H * hd + h * hd + i] * o[(size_t)t * H * hd + h * hd + i];
            m += sqrt(s);
        }
        acc[h] += (m / n) * (m / n);
    }
}

typedef struct {
    const m2d_model *m;
    double **w[M2D_T_COUNT]; /* [role][layer] f64 copies */
    double *embed, *fnorm, *head;
} ref_model;

static void ref_open(const m2d_model *m, ref_model *r) {
    memset(r, 0, sizeof *r);
    r->m = m;
    for (int role = 0; role < M2D_T_COUNT; role++) {
        if (!m->layers[0].w[role]) continue;
        r->w[role] = m2d_calloc((size_t)m->cfg.num_hidden_layers, sizeof(double *));
        for (int l = 0; l < m->cfg.num_hidden_layers; l++) r->w[role][l] = tu_ref_tensor_f64(m->layers[l].w[role]);
    }
    r->embed = tu_ref_tensor_f64(m->embed), r->fnorm = tu_ref_tensor_f64(m->final_norm), r->head = tu_ref_tensor_f64(m->lm_head);
}

static void ref_close(ref_model *r) {
    for (int role = 0; role < M2D_T_COUNT; role++) {
        for (int l = 0; r->w[role] && l < r->m->cfg.num_hidden_layers; l++) free(r->w[role][l]);
        free(r->w[role]);
    }
    free(r->embed), free(r->fnorm), free(r->head);
}

typedef struct {
    double *x, *xn, *q, *k, *v, *o, *g, *u, *in; /* [n][...] activations of one layer */
} ref_ws;

/* attention half of layer L on the window's residual X [n][d] (in place), statistics into S */
static void ref_attn(const ref_model *r, int l, int n, ref_ws *w, ref_stats *s) {
    const m2d_config *c = &r->m->cfg;
    int d = c->hidden_size, H = c->num_attention_heads, KV = c->num_key_value_heads, hd = c->head_dim;
    for (int t = 0; t < n; t++) {
        double *xn = w->xn + (size_t)t * d;
        rmsnorm(w->x + (size_t)t * d, r->w[M2D_T_ATTN_NORM][l], d, c->rms_norm_eps, xn);
        matvec(r->w[M2D_T_Q][l], xn, H * hd, d, w->q + (size_t)t * H * hd);
        matvec(r->w[M2D_T_K][l], xn, KV * hd, d, w->k + (size_t)t * KV * hd);
        matvec(r->w[M2D_T_V][l], xn, KV * hd, d, w->v + (size_t)t * KV * hd);
        for (int h = 0; h < H; h++) head_prep(w->q + (size_t)t * H * hd + h * hd, r->w[M2D_T_Q_NORM][l], hd, t, c);
        for (int h = 0; h < KV; h++) head_prep(w->k + (size_t)t * KV * hd + h * hd, r->w[M2D_T_K_NORM][l], hd, t, c);
    }
    if (s) acc_abs(w->xn, n, d, d, s->norm_sq + (size_t)(2 * l) * d);
    attention(w->q, w->k, w->v, n, c, w->o);
    if (s) acc_heads(w->o, n, H, hd, s->head_sq + (size_t)l * H);
    double y[64];
    for (int t = 0; t < n; t++) {
        matvec(r->w[M2D_T_O][l], w->o + (size_t)t * H * hd, d, H * hd, y);
        for (int i = 0; i < d; i++) w->x[(size_t)t * d + i] += y[i];
    }
}

static void ref_ffn(const ref_model *r, int l, int n, ref_ws *w, ref_stats *s) {
    const m2d_config *c = &r->m->cfg;
    int d = c->hidden_size, F = c->intermediate_size;
    double y[64];
    for (int t = 0; t < n; t++) {
        double *xn = w->xn + (size_t)t * d, *g = w->g + (size_t)t * F, *u = w->u + (size_t)t * F;
        rmsnorm(w->x + (size_t)t * d, r->w[M2D_T_FFN_NORM][l], d, c->rms_norm_eps, xn);
        matvec(r->w[M2D_T_GATE][l], xn, F, d, g);
        matvec(r->w[M2D_T_UP][l], xn, F, d, u);
        for (int i = 0; i < F; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
        matvec(r->w[M2D_T_DOWN][l], g, d, F, y);
        for (int i = 0; i < d; i++) w->x[(size_t)t * d + i] += y[i];
    }
    if (s) acc_abs(w->xn, n, d, d, s->norm_sq + (size_t)(2 * l + 1) * d);
    if (s) acc_abs(w->g, n, F, F, s->ffn_sq + (size_t)l * F);
}

static double cos_of(const double *a, const double *b, int d) {
    double ab = 0, aa = 0, bb = 0;
    for (int i = 0; i < d; i++) ab += a[i] * b[i], aa += a[i] * a[i], bb += b[i] * b[i];
    return ab / sqrt(aa * bb);
}

/* the window TOK's logits [n][vocab] (LOGITS may be NULL) and summed NLL; statistics into S (or NULL),
 * layer SKIP skipped (-1: none) */
static double ref_window(const ref_model *r, const int32_t *tok, int n, int skip, ref_stats *s, double *logits) {
    const m2d_config *c = &r->m->cfg;
    int d = c->hidden_size, V = c->vocab_size, H = c->num_attention_heads * c->head_dim;
    ref_ws w;
    double **all[] = {&w.x, &w.xn, &w.q, &w.k, &w.v, &w.o, &w.g, &w.u, &w.in};
    for (size_t i = 0; i < M2D_ARRAY_LEN(all); i++) *all[i] = m2d_calloc((size_t)n * 128, sizeof(double));
    (void)H;
    for (int t = 0; t < n; t++) memcpy(w.x + (size_t)t * d, r->embed + (size_t)tok[t] * d, sizeof(double) * d);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (l == skip) continue;
        memcpy(w.in, w.x, sizeof(double) * (size_t)n * d);
        ref_attn(r, l, n, &w, s);
        ref_ffn(r, l, n, &w, s);
        for (int t = 0; s && t < n; t++) s->cos_sum[l] += cos_of(w.in + (size_t)t * d, w.x + (size_t)t * d, d);
    }
    double nll = 0, *lg = m2d_malloc(sizeof(double) * V);
    for (int t = 0; t < n; t++) {
        rmsnorm(w.x + (size_t)t * d, r->fnorm, d, c->rms_norm_eps, w.xn);
        matvec(r->head, w.xn, V, d, lg);
        if (logits) memcpy(logits + (size_t)t * V, lg, sizeof(double) * V);
        double mx = -1e300, z = 0;
        for (int i = 0; i < V; i++) mx = fmax(mx, lg[i]);
        for (int i = 0; i < V; i++) z += exp(lg[i] - mx);
        if (t + 1 < n) nll += mx + log(z) - lg[tok[t + 1]];
    }
    free(lg);
    for (size_t i = 0; i < M2D_ARRAY_LEN(all); i++) free(*all[i]);
    return nll;
}

/* ------------------------------------------------------------------ importance vs float64 */

/* |a - b| <= tol * scale for n values, naming the statistic */
static void near(const char *what, const double *a, const double *b, int n, double tol) {
    double scale = 0;
    for (int i = 0; i < n; i++) scale = fmax(scale, fabs(b[i]));
    for (int i = 0; i < n; i++)
        if (fabs(a[i] - b[i]) > tol * scale)
            fail_msg("%s[%d]: engine %.9g, float64 %.9g (scale %.3g)", what, i, a[i], b[i], scale);
}

static void sqrt_all(double *v, int n) {
    for (int i = 0; i < n; i++) v[i] = sqrt(v[i]);
}

static void importance_matches_float64(void **state) {
    (void)state;
    char *dir = dense_teacher("imp64");
    m2d_model *m;
    assert_int_equal(m2d_model_open(dir, &m), 0);
    ref_model r;
    ref_open(m, &r);
    /* the float64 forward here is the reference forward's (tests/reffwd.c) to float64 rounding */
    int32_t ids[NW * WL];
    int64_t starts[NW];
    window_ids(ids, starts);
    double *a = m2d_malloc(sizeof(double) * WL * 64), *b = m2d_malloc(sizeof(double) * WL * 64);
    ref_window(&r, ids, WL, -1, NULL, a);
    tu_ref_forward(m, ids, WL, b);
    near("logits (float64 forwards)", a, b, WL * 64, 1e-12);
    const m2d_config *c = &m->cfg;
    int L = c->num_hidden_layers, d = c->hidden_size, F = c->intermediate_size, H = c->num_attention_heads;
    ref_stats s = {m2d_calloc((size_t)L * F, 8), m2d_calloc((size_t)L * H, 8), m2d_calloc((size_t)2 * L * d, 8),
                   m2d_calloc((size_t)L, 8), 0};
    double nll = 0, skip_nll[8] = {0};
    for (int w = 0; w < NW; w++) nll += ref_window(&r, ids + starts[w], WL, -1, &s, NULL);
    for (int l = 0; l < L; l++)
        for (int w = 0; w < NW; w++) skip_nll[l] += ref_window(&r, ids + starts[w], WL, l, NULL, NULL) / (NW * (WL - 1));
    sqrt_all(s.ffn_sq, L * F), sqrt_all(s.head_sq, L * H), sqrt_all(s.norm_sq, 2 * L * d);
    double *chan = m2d_calloc((size_t)d, 8), cos_bi[8];
    for (int k = 0; k < 2 * L; k++)
        for (int j = 0; j < d; j++) chan[j] += s.norm_sq[(size_t)k * d + j];
    for (int l = 0; l < L; l++) cos_bi[l] = 1 - s.cos_sum[l] / (NW * WL);
    m2d_importance *imp = importance_of(m);
    /* The engine computes in fp32: every activation within ~K·2^-24 relative of float64 (K <= 64
     * terms per dot product, two layers, softmax and norms in fp32: measured ~1e-6). The scores are
     * means of |x| (1-Lipschitz) and L2 norms over windows of them, so they inherit that relative
     * error; 1e-4 of each statistic's largest value leaves a 100x margin and is far below the
     * spread between neurons (scores differ by tens of percent). Cosines and NLLs likewise: 1e-5. */
    near("ffn_neuron", imp->ffn_neuron, s.ffn_sq, L * F, 1e-4);
    near("head", imp->head, s.head_sq, L * H, 1e-4);
    near("channel", imp->channel, chan, d, 1e-4);
    near("layer_nll", imp->layer_nll, skip_nll, L, 1e-5);
    assert_true(fabs(imp->nll_full - nll / (NW * (WL - 1))) < 1e-5);
    for (int l = 0; l < L; l++) assert_true(fabs(imp->layer_cos[l] - cos_bi[l]) < 1e-5);
    m2d_importance_free(imp);
    free(s.ffn_sq), free(s.head_sq), free(s.norm_sq), free(s.cos_sum), free(chan), free(a), free(b);
    ref_close(&r);
    m2d_model_close(m);
    free(dir);
}

/* ------------------------------------------------------------------ pruning equals masking */

static int layer_of(const char *name) {
    int l = -1;
    return sscanf(name, "model.layers.%d.", &l) == 1 ? l : -1;
}

typedef struct {
    const int *dead;
    int n_dead;
} plant_ctx;

/* neurons DEAD of every layer: gate and up rows zero, so their activation is exactly 0 */
static void plant_dead(const char *name, float *v, const int64_t *shape, void *ctx) {
    const plant_ctx *p = ctx;
    if (!strstr(name, "gate_proj") && !strstr(name, "up_proj")) return;
    for (int i = 0; i < p->n_dead; i++) memset(v + (size_t)p->dead[i] * shape[1], 0, sizeof(float) * shape[1]);
}

/* the pruned student's logits against the float64 forward of MASKED */
static void logits_equal(const char *pruned, const char *masked, double tol) {
    m2d_model *a, *b;
    assert_int_equal(m2d_model_open(pruned, &a), 0);
    assert_int_equal(m2d_model_open(masked, &b), 0);
    int32_t ids[NW * WL];
    int64_t starts[NW];
    window_ids(ids, starts);
    int V = a->cfg.vocab_size;
    double *la = m2d_malloc(sizeof(double) * WL * V), *lb = m2d_malloc(sizeof(double) * WL * V);
    tu_ref_forward(a, ids, WL, la);
    tu_ref_forward(b, ids, WL, lb);
    near("logits pruned vs masked (float64)", la, lb, WL * V, tol);
    /* the engine (fp32) on both: GEMMs over fewer terms round differently, ~1e-6 of the logits' scale */
    m2d_engine *ea, *eb;
    float *fa = m2d_malloc(sizeof(float) * WL * V), *fb = m2d_malloc(sizeof(float) * WL * V);
    assert_int_equal(m2d_engine_new(a, 1, &ea), 0);
    assert_int_equal(m2d_engine_new(b, 1, &eb), 0);
    assert_int_equal(m2d_engine_logits(ea, ids, WL, fa), 0);
    assert_int_equal(m2d_engine_logits(eb, ids, WL, fb), 0);
    for (int i = 0; i < WL * V; i++) la[i] = fa[i], lb[i] = fb[i];
    near("logits pruned vs masked (engine)", la, lb, WL * V, 1e-4);
    m2d_engine_free(ea), m2d_engine_free(eb);
    free(fa), free(fb), free(la), free(lb);
    m2d_model_close(a), m2d_model_close(b);
}

static char *prune_to(const char *teacher, const char *spec, const char *name, m2d_importance **imp_out) {
    m2d_model *m;
    assert_int_equal(m2d_model_open(teacher, &m), 0);
    m2d_importance *imp = importance_of(m);
    char *ip = m2d_strfmt("%s/%s.importance.json", tu_work, name), *out = m2d_path_join(tu_work, name);
    assert_int_equal(m2d_importance_write(imp, "test", ip), 0);
    m2d_prune_shape s;
    assert_int_equal(m2d_prune_shape_parse(spec, &s), 0);
    if (m2d_prune_write(m, ip, &s, out)) fail_msg("prune %s: %s", spec, m2d_errmsg());
    if (imp_out) *imp_out = imp;
    else m2d_importance_free(imp);
    free(ip);
    m2d_model_close(m);
    return out;
}

static void planted_dead_neurons_are_pruned_for_free(void **state) {
    (void)state;
    char *base = dense_teacher("plant-base"), *dir = m2d_path_join(tu_work, "plant");
    int dead[] = {3, 17, 40};
    plant_ctx p = {dead, 3};
    write_edited(base, dir, plant_dead, &p);
    m2d_importance *imp;
    char *out = prune_to(dir, "F61", "plant-out", &imp);
    for (int l = 0; l < imp->n_layers; l++)
        for (int i = 0; i < imp->ffn; i++) {
            int is_dead = i == 3 || i == 17 || i == 40;
            double v = imp->ffn_neuron[(size_t)l * imp->ffn + i];
            if (is_dead ? v != 0 : !(v > 0)) fail_msg("layer %d neuron %d: importance %g", l, i, v);
        }
    /* removing exactly-zero activations: only summation order changes (float64: ~1e-15 relative) */
    logits_equal(out, dir, 1e-9);
    m2d_importance_free(imp);
    free(base), free(dir), free(out);
}

typedef struct {
    const m2d_model *student_src; /* unused */
    cJSON *kept;
} mask_ctx;

/* zero what KEPT (moe2dense.json "kept") leaves out: down_proj columns of removed neurons, o_proj
 * columns of removed heads, o_proj and down_proj of removed layers */
static void mask_removed(const char *name, float *v, const int64_t *shape, void *ctx) {
    const mask_ctx *mc = ctx;
    int l = layer_of(name), i = -1;
    if (l < 0 || (!strstr(name, "o_proj") && !strstr(name, "down_proj"))) return;
    const cJSON *layers = cJSON_GetObjectItem(mc->kept, "layers");
    for (int k = 0; k < cJSON_GetArraySize(layers); k++)
        if (cJSON_GetArrayItem(layers, k)->valueint == l) i = k;
    int is_o = strstr(name, "o_proj") != NULL, unit = is_o ? 8 : 1; /* head_dim 8 */
    const cJSON *keep = i < 0 ? NULL : cJSON_GetArrayItem(cJSON_GetObjectItem(mc->kept, is_o ? "heads" : "ffn"), i);
    for (int64_t c = 0; c < shape[1]; c++) {
        int kept = 0;
        for (int k = 0; keep && k < cJSON_GetArraySize(keep); k++) kept |= cJSON_GetArrayItem(keep, k)->valueint == c / unit;
        for (int64_t r = 0; !kept && r < shape[0]; r++) v[r * shape[1] + c] = 0;
    }
}

static cJSON *read_manifest(const char *dir) {
    char *p = m2d_path_join(dir, "moe2dense.json");
    size_t n;
    char *text = m2d_read_file(p, &n);
    assert_non_null(text);
    cJSON *j = cJSON_Parse(text);
    assert_non_null(j);
    free(text), free(p);
    return j;
}

static void pruning_equals_masking(void **state) {
    (void)state;
    char *dir = dense_teacher("mask-teacher");
    /* 1 of 2 layers, 40 of 64 neurons, 1 of 2 kv groups with 1 of its 2 query heads */
    const char *specs[] = {"F40-A2/1", "L1-F40-A1/1", "A4/2-F63"};
    for (int s = 0; s < 3; s++) {
        char name[32], mname[32];
        snprintf(name, sizeof name, "mask-out%d", s), snprintf(mname, sizeof mname, "masked%d", s);
        char *out = prune_to(dir, specs[s], name, NULL), *masked = m2d_path_join(tu_work, mname);
        cJSON *man = read_manifest(out);
        mask_ctx mc = {NULL, cJSON_GetObjectItem(man, "kept")};
        write_edited(dir, masked, mask_removed, &mc);
        /* removed terms become exact zeros in the masked sums: float64 summation order only */
        logits_equal(out, masked, 1e-9);
        cJSON_Delete(man);
        free(out), free(masked);
    }
    free(dir);
}

/* channels: not a mask; every cut tensor holds the teacher's values at the kept indices */
static void channel_pruning_gathers_teacher_values(void **state) {
    (void)state;
    char *dir = dense_teacher("chan-teacher"), *out = prune_to(dir, "H24-F48-A2/1", "chan-out", NULL);
    cJSON *man = read_manifest(out), *kept = cJSON_GetObjectItem(man, "kept");
    m2d_model *t, *s;
    assert_int_equal(m2d_model_open(dir, &t), 0);
    assert_int_equal(m2d_model_open(out, &s), 0);
    assert_int_equal(s->cfg.hidden_size, 24);
    const cJSON *ch = cJSON_GetObjectItem(kept, "channels"), *ffn = cJSON_GetArrayItem(cJSON_GetObjectItem(kept, "ffn"), 1);
    const float *te = t->embed->data, *se = s->embed->data, *td = t->layers[1].down_proj->data;
    const float *sd = s->layers[1].down_proj->data;
    for (int r = 0; r < 64; r++)
        for (int j = 0; j < 24; j++)
            assert_true(se[r * 24 + j] == te[r * 32 + cJSON_GetArrayItem(ch, j)->valueint]);
    for (int r = 0; r < 24; r++)
        for (int j = 0; j < 48; j++)
            assert_true(sd[r * 48 + j] ==
                        td[cJSON_GetArrayItem(ch, r)->valueint * 64 + cJSON_GetArrayItem(ffn, j)->valueint]);
    for (int j = 1; j < 24; j++) /* ascending, distinct */
        assert_true(cJSON_GetArrayItem(ch, j)->valueint > cJSON_GetArrayItem(ch, j - 1)->valueint);
    assert_int_equal(m2d_model_param_counts(&s->cfg).total, (int64_t)cJSON_GetObjectItem(man, "params")->valuedouble);
    m2d_model_close(t), m2d_model_close(s);
    cJSON_Delete(man);
    free(dir), free(out);
}

/* ------------------------------------------------------------------ shapes */

static void shape_parse_format_and_params(void **state) {
    (void)state;
    char *dir = tu_model_path("tiny-qwen3-dense");
    if (!dir) TU_SKIP("../shared/models/tiny-qwen3-dense absent");
    m2d_config c;
    const m2d_arch *a;
    assert_int_equal(m2d_config_load(dir, &c, &a), 0);
    m2d_prune_shape s;
    assert_int_equal(m2d_prune_shape_parse("A6/2-L4-F576-H192", &s), 0);
    assert_int_equal(m2d_prune_shape_check(&c, &s), 0);
    assert_int_equal(m2d_prune_params(&c, &s), 4868032); /* the matched student size */
    char buf[64];
    m2d_prune_shape_format(&c, &s, buf, sizeof buf);
    assert_string_equal(buf, "L4-H192-F576-A6/2");
    assert_int_equal(m2d_prune_shape_parse("H256", &s), 0);
    m2d_prune_shape_format(&c, &s, buf, sizeof buf);
    assert_string_equal(buf, "L6-H256-F768-A12/4");
    m2d_prune_shape none = {0};
    assert_int_equal(m2d_prune_params(&c, &none), 13964544); /* the teacher's own count (README) */
    assert_int_equal(m2d_prune_shape_parse("L4n-A9", &s), 0);
    assert_true(s.layers_by_nll && s.heads == 9 && s.kv_heads == 0);
    m2d_config_free(&c);
    free(dir);
}

/* SPEC fails to parse (or, parsed, to fit tiny-qwen3-dense) with a message containing WANT */
static void shape_refused(const m2d_config *c, const char *spec, const char *want) {
    m2d_prune_shape s;
    int rc = m2d_prune_shape_parse(spec, &s);
    if (rc == 0) rc = m2d_prune_shape_check(c, &s);
    if (rc == 0) fail_msg("shape '%s' accepted", spec);
    if (!strstr(m2d_errmsg(), want) || strchr(m2d_errmsg(), '\n'))
        fail_msg("shape '%s': '%s' lacks '%s'", spec, m2d_errmsg(), want);
}

static void bad_shapes(void **state) {
    (void)state;
    char *dir = tu_model_path("tiny-qwen3-dense");
    if (!dir) TU_SKIP("../shared/models/tiny-qwen3-dense absent");
    m2d_config c;
    const m2d_arch *a;
    assert_int_equal(m2d_config_load(dir, &c, &a), 0);
    shape_refused(&c, "", "expected parts");
    shape_refused(&c, "X4", "part 'X4'");
    shape_refused(&c, "L4-L3", "part 'L' given twice");
    shape_refused(&c, "L0", "positive integer");
    shape_refused(&c, "H19x", "unexpected 'x'");
    shape_refused(&c, "A6/", "A<heads>/<kv heads>");
    shape_refused(&c, "L4--H8", "part ''");
    shape_refused(&c, "H500", "H (hidden) = 500: outside [1, 384]");
    shape_refused(&c, "L7", "L (layers) = 7");
    shape_refused(&c, "A5/2", "multiple of the kv heads");
    shape_refused(&c, "A4/1", "4 query heads per kv group, the teacher has 3");
    shape_refused(&c, "A6/5", "A (kv heads) = 5");
    m2d_config_free(&c);
    free(dir);
}

/* ------------------------------------------------------------------ bad importance files, MoE */

/* m2d_prune_write with the importance file TEXT fails naming the file and WANT */
static void importance_refused(const m2d_model *m, const char *text, const char *want) {
    char *ip = m2d_path_join(tu_work, "bad.importance.json"), *out = m2d_path_join(tu_work, "bad-out");
    tu_write(ip, text, strlen(text));
    m2d_prune_shape s = {.ffn = 8};
    if (m2d_prune_write(m, ip, &s, out) == 0) fail_msg("importance '%.40s...' accepted", text);
    if (!strstr(m2d_errmsg(), want) || !strstr(m2d_errmsg(), ip) || strchr(m2d_errmsg(), '\n'))
        fail_msg("'%s' lacks '%s' or the file name", m2d_errmsg(), want);
    free(ip), free(out);
}

/* the good file's text with FROM replaced by TO */
static char *edited(const char *good, const char *from, const char *to) {
    const char *p = strstr(good, from);
    assert_non_null(p);
    return m2d_strfmt("%.*s%s%s", (int)(p - good), good, to, p + strlen(from));
}

static void bad_importance_files(void **state) {
    (void)state;
    char *dir = dense_teacher("badimp"), *ip = m2d_path_join(tu_work, "good.importance.json");
    m2d_model *m;
    assert_int_equal(m2d_model_open(dir, &m), 0);
    m2d_importance *imp = importance_of(m);
    assert_int_equal(m2d_importance_write(imp, "test", ip), 0);
    size_t n;
    char *good = m2d_read_file(ip, &n), hash[80];
    importance_refused(m, "not json", "not a JSON object");
    char *t1 = edited(good, "\"head\":", "\"heads_x\":"), *t2 = edited(good, "\"ffn_neuron\":[[", "\"ffn_neuron\":[[1,");
    char *t3 = edited(good, "\"format\":\"moe2dense-importance-v1\"", "\"format\":\"v0\"");
    snprintf(hash, sizeof hash, "\"model_hash\":\"%s\"", imp->model_hash);
    char *t4 = edited(good, hash, "\"model_hash\":\"0000\""), *t5 = edited(good, "\"nll_full\":", "\"nll_full\":\"x\",\"y\":");
    importance_refused(m, t1, "field head: missing");
    importance_refused(m, t2, "field ffn_neuron[0]: expected an array of 64 numbers");
    importance_refused(m, t3, "field format");
    importance_refused(m, t4, "field model_hash: 0000 is not the model");
    importance_refused(m, t5, "field nll_full");
    char *t6 = edited(good, "\"n_layers\":2", "\"n_layers\":100000000"); /* hostile: never allocated */
    importance_refused(m, t6, "sizes larger than the file holds");
    char *t7 = edited(good, "\"window_starts\":[0,", "\"window_starts\":[1e30,"); /* no int64 holds it */
    importance_refused(m, t7, "field 'window_starts': entry 0 (1e+30) is not a token offset");
    free(t7);
    free(t1), free(t2), free(t3), free(t4), free(t5), free(t6), free(good);
    m2d_importance_free(imp);
    m2d_model_close(m);
    free(dir), free(ip);
}

static void moe_teacher_refused(void **state) {
    (void)state;
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    char *dir = m2d_path_join(tu_work, "moe-teacher");
    assert_int_equal(m2d_testmodel_write(dir, &o), 0);
    m2d_model *m;
    assert_int_equal(m2d_model_open(dir, &m), 0);
    m2d_prune_shape s = {.ffn = 8};
    assert_int_not_equal(m2d_prune_shape_check(&m->cfg, &s), 0);
    assert_non_null(strstr(m2d_errmsg(), "Mixture-of-Experts"));
    int32_t ids[NW * WL];
    int64_t starts[NW];
    window_ids(ids, starts);
    m2d_calib_opts co = {.n_threads = 1};
    m2d_importance *imp = NULL;
    assert_int_not_equal(m2d_importance_compute(m, ids, starts, NW, WL, &co, &imp), 0);
    assert_non_null(strstr(m2d_errmsg(), "needs a dense teacher"));
    m2d_model_close(m);
    free(dir);
}

/* ------------------------------------------------------------------ the command line */

static int prune_cli(const char *teacher, const char *args, char **out, char **err) {
    char *cmd = m2d_strfmt("%s prune --teacher %s --data %s --seq-len 32 --samples 2 --threads 2 %s", tu_bin(), teacher,
                           tu_data_path("wikitext-2-raw/wikitext-2-raw/wiki.valid.raw"), args);
    int rc = tu_run(cmd, out, err);
    free(cmd);
    return rc;
}

static void one_line(const char *err, const char *want) {
    if (!err || !strstr(err, want) || strchr(err, '\n') != err + strlen(err) - 1)
        fail_msg("stderr '%s' is not one line with '%s'", err ? err : "", want);
}

static void cli_prunes_tiny_dense(void **state) {
    (void)state;
    char *dir = tu_model_path("tiny-qwen3-dense");
    if (!dir) TU_SKIP("../shared/models/tiny-qwen3-dense absent");
    char *o = NULL, *e = NULL, *args = m2d_strfmt("--shape L4-H192-F576-A6/2 --out %s/cli-out", tu_work);
    assert_int_equal(prune_cli(dir, args, &o, &e), 0);
    assert_non_null(strstr(o, "L4-H192-F576-A6/2, 4868032 parameters"));
    free(o), free(e), free(args);
    args = m2d_strfmt("--shape L4-H192-F576-A6/2 --out %s/cli-out//", tu_work); /* README's 'pruned/' spelling */
    assert_int_equal(prune_cli(dir, args, &o, &e), 0); /* the importance file beside the folder is kept */
    assert_non_null(strstr(o, "kept up-to-date"));
    free(o), free(e), free(args);
    m2d_model *s;
    char *sd = m2d_path_join(tu_work, "cli-out");
    assert_int_equal(m2d_model_open(sd, &s), 0);
    assert_int_equal(m2d_model_param_counts(&s->cfg).total, 4868032);
    m2d_model_close(s);
    args = m2d_strfmt("--shape L4 --samples 3 --out %s/cli-out", tu_work); /* other windows: stale */
    assert_int_equal(prune_cli(dir, args, &o, &e), 0);
    assert_non_null(strstr(e, "is stale (other calibration windows): recomputing"));
    free(o), free(e), free(args);
    char *ip = m2d_strfmt("%s/cli-out.importance.json", tu_work);
    tu_replace_in_file(ip, "\"channel\":", "\"channelx\":"); /* damaged: an error, never overwritten */
    args = m2d_strfmt("--shape L4 --samples 3 --out %s/cli-out", tu_work);
    assert_int_not_equal(prune_cli(dir, args, &o, &e), 0);
    one_line(e, "field channel: missing");
    free(o), free(e), free(args), free(ip), free(sd), free(dir);
}

static void cli_refuses_bad_input(void **state) {
    (void)state;
    char *dense = tu_model_path("tiny-qwen3-dense"), *moe = tu_model_path("tiny-qwen3moe");
    if (!dense || !moe) TU_SKIP("../shared/models tiny-qwen3-dense or tiny-qwen3moe absent");
    char *o = NULL, *e = NULL, *args = m2d_strfmt("--shape L4 --out %s/cli-moe", tu_work);
    assert_int_not_equal(prune_cli(moe, args, &o, &e), 0);
    one_line(e, "Mixture-of-Experts");
    free(o), free(e), free(args);
    args = m2d_strfmt("--shape L4-H999 --out %s/cli-big", tu_work);
    assert_int_not_equal(prune_cli(dense, args, &o, &e), 0);
    one_line(e, "H (hidden) = 999");
    free(o), free(e), free(args);
    assert_int_not_equal(prune_cli(dense, "--shape L4", &o, &e), 0);
    one_line(e, "are required");
    free(o), free(e), free(dense), free(moe);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(importance_matches_float64),
        cmocka_unit_test(planted_dead_neurons_are_pruned_for_free),
        cmocka_unit_test(pruning_equals_masking),
        cmocka_unit_test(channel_pruning_gathers_teacher_values),
        cmocka_unit_test(shape_parse_format_and_params),
        cmocka_unit_test(bad_shapes),
        cmocka_unit_test(bad_importance_files),
        cmocka_unit_test(moe_teacher_refused),
        cmocka_unit_test(cli_prunes_tiny_dense),
        cmocka_unit_test(cli_refuses_bad_input),
    };
    return cmocka_run_group_tests(tests, tu_work_setup, tu_work_teardown);
}
