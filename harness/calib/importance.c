/* calib/importance — Minitron activation importance of a dense teacher (definitions, aggregation and
 * the file format: importance.h).
 *
 * One forward per window with the engine's probe hook (engine.h) gives every activation the scores
 * need; the window's next-token NLL comes from the same forward (m2d_engine_logprobs). Then one more
 * pass over the windows per layer with that layer skipped (m2d_engine_set_skip_layer) gives the
 * layer's skip NLL: (L + 1) forwards of the calibration set in all. */
#include "calib/importance.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/outfile.h"
#include "base/util.h"
#include "calib/ensure.h"
#include "engine/engine.h"

#define AGGREGATION "per window the mean over its tokens of |value| (heads: of the head output's L2 norm), then the " \
                    "L2 norm over the windows (Minitron: mean over the sequence, L2 over the batch); channel: the sum " \
                    "over the 2 RMSNorms of every layer of that score of the norm's output; layer_cos: 1 - mean over " \
                    "every token of cos(layer input, layer output); layer_nll: mean next-token NLL with the layer skipped"

/* ------------------------------------------------------------------ accumulation */

typedef struct {
    const m2d_config *c;
    double *ffn_sq;    /* [L][F] sum over windows of (mean over tokens |a_i|)^2 */
    double *head_sq;   /* [L][H] the same of each head's L2 norm */
    double *norm_sq;   /* [2L][d] the same of each RMSNorm output channel */
    double *cos_sum;   /* [L] sum over tokens of cos(in, out) */
    double *mean;      /* scratch [max(F, H, d)] */
    float *layer_in;   /* [n, d] the current layer's input (for the cosine) */
    double n_tokens;
} imp_acc;

/* MEAN[j] = mean over the N rows of |x[r][j]| */
static void col_abs_mean(const float *x, int n, int cols, double *mean) {
    memset(mean, 0, sizeof(double) * (size_t)cols);
    for (int r = 0; r < n; r++)
        for (int j = 0; j < cols; j++) mean[j] += fabs((double)x[(size_t)r * cols + j]);
    for (int j = 0; j < cols; j++) mean[j] /= n;
}

/* MEAN[h] = mean over the N rows of the L2 norm of head h's HD values */
static void head_norm_mean(const float *x, int n, int heads, int hd, double *mean) {
    memset(mean, 0, sizeof(double) * (size_t)heads);
    for (int r = 0; r < n; r++)
        for (int h = 0; h < heads; h++) {
            const float *v = x + (size_t)r * heads * hd + (size_t)h * hd;
            double s = 0;
            for (int i = 0; i < hd; i++) s += (double)v[i] * v[i];
            mean[h] += sqrt(s);
        }
    for (int h = 0; h < heads; h++) mean[h] /= n;
}

static void add_squares(double *acc, const double *v, int n) {
    for (int i = 0; i < n; i++) acc[i] += v[i] * v[i];
}

/* sum over the N rows of cos(a_r, b_r) (0 for a zero row) */
static double cos_rows(const float *a, const float *b, int n, int d) {
    double sum = 0;
    for (int r = 0; r < n; r++) {
        double ab = 0, aa = 0, bb = 0;
        for (int j = 0; j < d; j++) {
            double x = a[(size_t)r * d + j], y = b[(size_t)r * d + j];
            ab += x * y, aa += x * x, bb += y * y;
        }
        sum += aa > 0 && bb > 0 ? ab / sqrt(aa * bb) : 0;
    }
    return sum;
}

static int probe(void *user, const m2d_probe_event *ev) {
    imp_acc *a = user;
    const m2d_config *c = a->c;
    int l = ev->layer, n = ev->n_tokens, d = c->hidden_size;
    switch (ev->point) {
    case M2D_PROBE_FFN_ACT:
        col_abs_mean(ev->x, n, ev->cols, a->mean);
        add_squares(a->ffn_sq + (size_t)l * c->intermediate_size, a->mean, c->intermediate_size);
        break;
    case M2D_PROBE_HEADS:
        head_norm_mean(ev->x, n, c->num_attention_heads, c->head_dim, a->mean);
        add_squares(a->head_sq + (size_t)l * c->num_attention_heads, a->mean, c->num_attention_heads);
        break;
    case M2D_PROBE_ATTN_NORM:
    case M2D_PROBE_FFN_NORM:
        col_abs_mean(ev->x, n, d, a->mean);
        add_squares(a->norm_sq + (size_t)(2 * l + (ev->point == M2D_PROBE_FFN_NORM)) * d, a->mean, d);
        break;
    case M2D_PROBE_LAYER_IN:
        memcpy(a->layer_in, ev->x, sizeof(float) * (size_t)n * d);
        break;
    case M2D_PROBE_LAYER_OUT:
        a->cos_sum[l] += cos_rows(a->layer_in, ev->x, n, d);
        break;
    default:
        break;
    }
    return 0;
}

/* zeroed score arrays for IMP's sizes */
static void alloc_scores(m2d_importance *imp) {
    int L = imp->n_layers;
    imp->ffn_neuron = m2d_calloc((size_t)L * imp->ffn, sizeof(double));
    imp->head = m2d_calloc((size_t)L * imp->heads, sizeof(double));
    imp->channel = m2d_calloc((size_t)imp->hidden, sizeof(double));
    imp->layer_cos = m2d_calloc((size_t)L, sizeof(double));
    imp->layer_nll = m2d_calloc((size_t)L, sizeof(double));
}

static m2d_importance *imp_new(const m2d_config *c) {
    m2d_importance *imp = m2d_calloc(1, sizeof *imp);
    imp->n_layers = c->num_hidden_layers, imp->hidden = c->hidden_size, imp->ffn = c->intermediate_size;
    imp->heads = c->num_attention_heads, imp->kv_heads = c->num_key_value_heads, imp->head_dim = c->head_dim;
    alloc_scores(imp);
    return imp;
}

void m2d_importance_free(m2d_importance *imp) {
    if (!imp) return;
    free(imp->ffn_neuron);
    free(imp->head);
    free(imp->channel);
    free(imp->layer_cos);
    free(imp->layer_nll);
    free(imp->window_starts);
    free(imp);
}

int m2d_importance_supported(const m2d_config *c, const char *dir) {
    if (!dir) dir = "model";
    for (int l = 0; l < c->num_hidden_layers; l++)
        if (c->layer_is_moe[l])
            return m2d_err("%s: %s is a Mixture-of-Experts model (layer %d); Minitron pruning needs a dense teacher "
                           "(e.g. Qwen3ForCausalLM)", dir, c->arch, l);
    if (c->ops.attn != M2D_ATTN_GQA || c->qkv_bias || c->o_bias || c->ops.qk_norm == M2D_QK_NORM_WHOLE ||
        c->layer_window || c->ops.ffn_act != M2D_ACT_SWIGLU)
        return m2d_err("%s: %s: pruning supports dense GQA decoders without attention biases, sliding windows or "
                       "whole-projection q/k norms, with a SwiGLU FFN (Qwen3ForCausalLM)", dir, c->arch);
    return 0;
}

/* mean next-token NLL over the windows (tokens 1..L-1 of each, predicted from their prefix) */
static int windows_nll(m2d_engine *e, const int32_t *ids, const int64_t *starts, int nw, int L, double *lp,
                       double *out) {
    double sum = 0;
    int32_t *tg = m2d_malloc(sizeof(int32_t) * (size_t)L);
    int rc = 0;
    for (int w = 0; w < nw && rc == 0; w++) {
        const int32_t *t = ids + starts[w];
        memcpy(tg, t + 1, sizeof(int32_t) * (size_t)(L - 1));
        tg[L - 1] = t[0]; /* the last position's prediction lies past the window: not counted */
        rc = m2d_engine_logprobs(e, t, L, tg, 0, lp);
        for (int i = 0; i < L - 1 && rc == 0; i++) sum -= lp[i];
    }
    free(tg);
    *out = sum / ((double)nw * (L - 1));
    return rc;
}

static void acc_finish(const imp_acc *a, m2d_importance *imp) {
    int L = imp->n_layers, d = imp->hidden;
    for (size_t i = 0; i < (size_t)L * imp->ffn; i++) imp->ffn_neuron[i] = sqrt(a->ffn_sq[i]);
    for (size_t i = 0; i < (size_t)L * imp->heads; i++) imp->head[i] = sqrt(a->head_sq[i]);
    for (int k = 0; k < 2 * L; k++)
        for (int j = 0; j < d; j++) imp->channel[j] += sqrt(a->norm_sq[(size_t)k * d + j]);
    for (int l = 0; l < L; l++) imp->layer_cos[l] = 1.0 - a->cos_sum[l] / a->n_tokens;
}

static void acc_init(imp_acc *a, const m2d_config *c, int L) {
    int nl = c->num_hidden_layers, d = c->hidden_size;
    a->c = c;
    a->ffn_sq = m2d_calloc((size_t)nl * c->intermediate_size, sizeof(double));
    a->head_sq = m2d_calloc((size_t)nl * c->num_attention_heads, sizeof(double));
    a->norm_sq = m2d_calloc((size_t)2 * nl * d, sizeof(double));
    a->cos_sum = m2d_calloc((size_t)nl, sizeof(double));
    a->mean = m2d_calloc((size_t)M2D_MAX(M2D_MAX(c->intermediate_size, c->num_attention_heads), d), sizeof(double));
    a->layer_in = m2d_malloc(sizeof(float) * (size_t)L * d);
    a->n_tokens = 0;
}

static void acc_free(imp_acc *a) {
    free(a->ffn_sq);
    free(a->head_sq);
    free(a->norm_sq);
    free(a->cos_sum);
    free(a->mean);
    free(a->layer_in);
}

#define ALL_POINTS ((1u << M2D_PROBE_COUNT) - 1)

/* The probed pass (scores and nll_full), then one pass per skipped layer. */
static int run_passes(m2d_engine *e, const int32_t *ids, const int64_t *starts, int nw, int L, imp_acc *a,
                      m2d_importance *imp) {
    double *lp = m2d_malloc(sizeof(double) * (size_t)L);
    m2d_engine_set_probe(e, probe, a, ALL_POINTS);
    int rc = windows_nll(e, ids, starts, nw, L, lp, &imp->nll_full);
    m2d_engine_set_probe(e, NULL, NULL, 0);
    a->n_tokens = (double)nw * L;
    for (int l = 0; l < imp->n_layers && rc == 0; l++)
        rc = m2d_engine_set_skip_layer(e, l) || windows_nll(e, ids, starts, nw, L, lp, &imp->layer_nll[l]) ? -1 : 0;
    m2d_engine_set_skip_layer(e, -1);
    free(lp);
    return rc;
}

int m2d_importance_compute(const m2d_model *m, const int32_t *ids, const int64_t *starts, int nw, int L,
                           const m2d_calib_opts *o, m2d_importance **out) {
    *out = NULL;
    if (m2d_importance_supported(&m->cfg, m->dir)) return -1;
    if (nw < 1 || L < 2) return m2d_err("importance: need at least one window of >= 2 tokens (%d of %d)", nw, L);
    m2d_engine_opts eo = {.backend = o->device, .n_threads = o->n_threads, .precision = (m2d_precision)o->precision};
    m2d_engine *e;
    if (m2d_engine_open(m, &eo, &e)) return -1;
    m2d_importance *imp = imp_new(&m->cfg);
    imp_acc a;
    acc_init(&a, &m->cfg, L);
    int rc = run_passes(e, ids, starts, nw, L, &a, imp);
    if (rc == 0) acc_finish(&a, imp);
    snprintf(imp->precision, sizeof imp->precision, "%s", m2d_precision_name(m2d_engine_precision(e)));
    acc_free(&a);
    m2d_engine_free(e);
    snprintf(imp->model_hash, sizeof imp->model_hash, "%s", m->model_hash);
    m2d_calib_hash(ids, starts, nw, L, m2d_calib_gate_convention(&m->cfg), imp->calib_hash);
    imp->n_windows = nw, imp->seq_len = L;
    imp->window_starts = m2d_malloc(sizeof(int64_t) * (size_t)nw);
    memcpy(imp->window_starts, starts, sizeof(int64_t) * (size_t)nw);
    if (rc) {
        m2d_importance_free(imp);
        return -1;
    }
    *out = imp;
    return 0;
}

/* ------------------------------------------------------------------ the file */

static cJSON *rows(const double *v, int n_rows, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int r = 0; r < n_rows; r++) cJSON_AddItemToArray(a, cJSON_CreateDoubleArray(v + (size_t)r * n, n));
    return a;
}

int m2d_importance_write(const m2d_importance *imp, const char *data_path, const char *path) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "format", M2D_IMPORTANCE_FORMAT);
    cJSON_AddStringToObject(j, "model_hash", imp->model_hash);
    cJSON_AddStringToObject(j, "calib_hash", imp->calib_hash);
    cJSON_AddStringToObject(j, "precision", imp->precision);
    cJSON_AddStringToObject(j, "data_path", data_path ? data_path : "");
    cJSON_AddNumberToObject(j, "seq_len", imp->seq_len);
    cJSON_AddNumberToObject(j, "n_windows", imp->n_windows);
    cJSON *ws = cJSON_AddArrayToObject(j, "window_starts");
    for (int i = 0; i < imp->n_windows; i++) cJSON_AddItemToArray(ws, cJSON_CreateNumber((double)imp->window_starts[i]));
    cJSON_AddStringToObject(j, "aggregation", AGGREGATION);
    const char *szn[] = {"n_layers", "hidden", "ffn", "heads", "kv_heads", "head_dim"};
    const int szv[] = {imp->n_layers, imp->hidden, imp->ffn, imp->heads, imp->kv_heads, imp->head_dim};
    for (int i = 0; i < 6; i++) cJSON_AddNumberToObject(j, szn[i], szv[i]);
    cJSON_AddItemToObject(j, "ffn_neuron", rows(imp->ffn_neuron, imp->n_layers, imp->ffn));
    cJSON_AddItemToObject(j, "head", rows(imp->head, imp->n_layers, imp->heads));
    cJSON_AddItemToObject(j, "channel", cJSON_CreateDoubleArray(imp->channel, imp->hidden));
    cJSON_AddItemToObject(j, "layer_cos", cJSON_CreateDoubleArray(imp->layer_cos, imp->n_layers));
    cJSON_AddItemToObject(j, "layer_nll", cJSON_CreateDoubleArray(imp->layer_nll, imp->n_layers));
    cJSON_AddNumberToObject(j, "nll_full", imp->nll_full);
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    size_t n = strlen(text);
    text = m2d_realloc(text, n + 2);
    text[n] = '\n', text[n + 1] = 0;
    int rc = m2d_write_file_atomic(path, text, n + 1);
    free(text);
    return rc;
}

static const cJSON *field(const cJSON *j, const char *path, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, name);
    if (!v) m2d_err("%s: field %s: missing", path, name);
    return v;
}

static int get_str(const cJSON *j, const char *path, const char *name, char *out, size_t cap) {
    const cJSON *v = field(j, path, name);
    if (!v) return -1;
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= cap)
        return m2d_err("%s: field %s: expected a string of at most %zu characters", path, name, cap - 1);
    memcpy(out, v->valuestring, strlen(v->valuestring) + 1);
    return 0;
}

static int get_int(const cJSON *j, const char *path, const char *name, int lo, int *out) {
    const cJSON *v = field(j, path, name);
    if (!v) return -1;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo || v->valuedouble > 1e9)
        return m2d_err("%s: field %s: expected an integer >= %d", path, name, lo);
    *out = (int)v->valuedouble;
    return 0;
}

/* N finite numbers of array V into OUT */
static int get_numbers(const cJSON *v, const char *path, const char *name, int n, double *out) {
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != n)
        return m2d_err("%s: field %s: expected an array of %d numbers", path, name, n);
    int i = 0;
    for (const cJSON *x = v->child; x; x = x->next, i++) {
        if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble))
            return m2d_err("%s: field %s: element %d is not a finite number", path, name, i);
        out[i] = x->valuedouble;
    }
    return 0;
}

/* [n_rows][n] numbers */
static int get_rows(const cJSON *j, const char *path, const char *name, int n_rows, int n, double *out) {
    const cJSON *v = field(j, path, name);
    if (!v) return -1;
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != n_rows)
        return m2d_err("%s: field %s: expected %d arrays (one per layer)", path, name, n_rows);
    int r = 0;
    for (const cJSON *x = v->child; x; x = x->next, r++) {
        char sub[64];
        snprintf(sub, sizeof sub, "%s[%d]", name, r);
        if (get_numbers(x, path, sub, n, out + (size_t)r * n)) return -1;
    }
    return 0;
}

static int get_vec(const cJSON *j, const char *path, const char *name, int n, double *out) {
    const cJSON *v = field(j, path, name);
    return v ? get_numbers(v, path, name, n, out) : -1;
}

static int read_sizes(const cJSON *j, const char *path, m2d_importance *imp) {
    char fmt[64];
    if (get_str(j, path, "format", fmt, sizeof fmt)) return -1;
    if (strcmp(fmt, M2D_IMPORTANCE_FORMAT))
        return m2d_err("%s: field format: '%s', expected '%s'", path, fmt, M2D_IMPORTANCE_FORMAT);
    return get_str(j, path, "model_hash", imp->model_hash, sizeof imp->model_hash) ||
                   get_str(j, path, "calib_hash", imp->calib_hash, sizeof imp->calib_hash) ||
                   get_str(j, path, "precision", imp->precision, sizeof imp->precision) ||
                   get_int(j, path, "seq_len", 2, &imp->seq_len) || get_int(j, path, "n_windows", 1, &imp->n_windows) ||
                   get_int(j, path, "n_layers", 1, &imp->n_layers) || get_int(j, path, "hidden", 1, &imp->hidden) ||
                   get_int(j, path, "ffn", 1, &imp->ffn) || get_int(j, path, "heads", 1, &imp->heads) ||
                   get_int(j, path, "kv_heads", 1, &imp->kv_heads) || get_int(j, path, "head_dim", 1, &imp->head_dim)
               ? -1
               : 0;
}

static int read_scores(const cJSON *j, const char *path, m2d_importance *imp) {
    int L = imp->n_layers;
    alloc_scores(imp);
    imp->window_starts = m2d_calloc((size_t)imp->n_windows, sizeof(int64_t));
    double *ws = m2d_calloc((size_t)imp->n_windows, sizeof(double));
    int rc = get_vec(j, path, "window_starts", imp->n_windows, ws) ||
                     get_rows(j, path, "ffn_neuron", L, imp->ffn, imp->ffn_neuron) ||
                     get_rows(j, path, "head", L, imp->heads, imp->head) ||
                     get_vec(j, path, "channel", imp->hidden, imp->channel) ||
                     get_vec(j, path, "layer_cos", L, imp->layer_cos) ||
                     get_vec(j, path, "layer_nll", L, imp->layer_nll)
                 ? -1
                 : 0;
    for (int i = 0; rc == 0 && i < imp->n_windows; i++) {
        if (!(ws[i] >= 0 && ws[i] <= 0x1p62) || ws[i] != floor(ws[i])) /* the range first: the cast is UB outside */
            rc = m2d_err("%s: field 'window_starts': entry %d (%g) is not a token offset", path, i, ws[i]);
        else imp->window_starts[i] = (int64_t)ws[i];
    }
    free(ws);
    const cJSON *nf = rc ? NULL : field(j, path, "nll_full");
    if (rc == 0 && !nf) rc = -1;
    if (rc == 0 && (!cJSON_IsNumber(nf) || !isfinite(nf->valuedouble)))
        rc = m2d_err("%s: field nll_full: expected a finite number", path);
    if (rc == 0) imp->nll_full = nf->valuedouble;
    return rc;
}

/* sizes no larger than a file of N bytes can hold (each number takes two characters at least): a
 * hostile header never makes the reader allocate more than the file's size */
static int check_sizes(const m2d_importance *imp, const char *path, size_t n) {
    double need = (double)imp->n_layers * (imp->ffn + imp->heads + 2) + imp->hidden + imp->n_windows;
    if (2 * need > (double)n)
        return m2d_err("%s: fields n_layers, ffn, heads, hidden, n_windows: sizes larger than the file holds", path);
    if (imp->heads % imp->kv_heads)
        return m2d_err("%s: field kv_heads: %d does not divide heads %d", path, imp->kv_heads, imp->heads);
    return 0;
}

int m2d_importance_read(const char *path, m2d_importance **out) {
    *out = NULL;
    size_t n;
    char *text = m2d_read_file(path, &n);
    if (!text) return -1;
    int rc = m2d_importance_parse(path, text, n, out);
    free(text);
    return rc;
}

int m2d_importance_parse(const char *path, const char *text, size_t n, m2d_importance **out) {
    *out = NULL;
    cJSON *j = cJSON_ParseWithLength(text, n);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return m2d_err("%s: not a JSON object (an importance file of 'moe2dense prune' is)", path);
    }
    m2d_importance *imp = m2d_calloc(1, sizeof *imp);
    int rc = read_sizes(j, path, imp) || check_sizes(imp, path, n) || read_scores(j, path, imp) ? -1 : 0;
    cJSON_Delete(j);
    if (rc) {
        m2d_importance_free(imp);
        return -1;
    }
    *out = imp;
    return 0;
}

int m2d_importance_check_model(const m2d_importance *imp, const char *path, const m2d_model *m) {
    const m2d_config *c = &m->cfg;
    if (strcmp(imp->model_hash, m->model_hash))
        return m2d_err("%s: field model_hash: %.12s is not the model %s (%.12s)", path, imp->model_hash, m->dir,
                       m->model_hash);
    const char *names[] = {"n_layers", "hidden", "ffn", "heads", "kv_heads", "head_dim"};
    const int have[] = {imp->n_layers, imp->hidden, imp->ffn, imp->heads, imp->kv_heads, imp->head_dim};
    const int want[] = {c->num_hidden_layers, c->hidden_size, c->intermediate_size, c->num_attention_heads,
                        c->num_key_value_heads, c->head_dim};
    for (int i = 0; i < 6; i++)
        if (have[i] != want[i]) return m2d_err("%s: field %s: %d, the model has %d", path, names[i], have[i], want[i]);
    return 0;
}

/* ------------------------------------------------------------------ ensure */

/* *OUT = PATH's importance when up to date for (M, HASH, PRECISION); NULL when absent or stale (other
 * model, windows or precision: said on stderr). A damaged file is an error: never overwritten. */
static int cached_importance(const m2d_model *m, const char *hash, const char *precision, const char *path,
                             const char *cmd, m2d_importance **out) {
    *out = NULL;
    if (!m2d_file_exists(path)) return 0;
    m2d_importance *imp = NULL;
    if (m2d_importance_read(path, &imp)) return m2d_err_prefix("importance file (delete it to recompute)");
    const char *why = strcmp(imp->model_hash, m->model_hash) ? "another model"
                      : strcmp(imp->calib_hash, hash)         ? "other calibration windows"
                      : strcmp(imp->precision, precision)     ? "another precision"
                                                              : NULL;
    if (!why && m2d_importance_check_model(imp, path, m)) {
        m2d_importance_free(imp);
        return -1;
    }
    if (!why) {
        *out = imp;
        return 0;
    }
    fprintf(stderr, "moe2dense %s: %s is stale (%s): recomputing\n", cmd, path, why);
    m2d_importance_free(imp);
    return 0;
}

static int ensure_with(const m2d_model *m, m2d_calib_job *j, const char *path, const char *cmd, m2d_importance **out,
                       int *cached) {
    int64_t *starts = NULL;
    int *lens = NULL, nw = 0;
    char hash[65];
    m2d_precision used;
    if (m2d_calib_choose(m, j->ids, (int64_t)j->n_ids, &j->opts, &starts, &lens, &nw, hash) ||
        m2d_engine_resolve_precision(j->opts.device, (m2d_precision)j->opts.precision, &used))
        return -1;
    int L = j->opts.seq_len > 0 ? j->opts.seq_len : m2d_calib_default_seq_len(&m->cfg);
    int rc = cached_importance(m, hash, m2d_precision_name(used), path, cmd, out);
    if (cached) *cached = *out != NULL;
    if (rc == 0 && !*out) {
        j->opts.precision = (int)used;
        rc = m2d_importance_compute(m, j->ids, starts, nw, L, &j->opts, out) ||
                     m2d_importance_write(*out, j->opts.data_path, path)
                 ? -1
                 : 0;
    }
    free(starts);
    free(lens);
    return rc;
}

int m2d_importance_ensure(const m2d_model *m, const m2d_calib_opts *opts, const char *path, const char *cmd,
                          m2d_importance **out, int *cached) {
    *out = NULL;
    if (m2d_importance_supported(&m->cfg, m->dir)) return -1;
    m2d_tokenizer *tk;
    if (m2d_tokenizer_load(m->dir, &tk)) return -1;
    m2d_calib_job j = {.opts = *opts};
    j.opts.doc_starts = NULL, j.opts.n_docs = 0;
    m2d_lock lock = {.fd = -1, .path = NULL};
    int rc = m2d_calib_job_tokens(&j, tk, 0) ||
                     m2d_lock_acquire(&lock, path, cmd, "computing the importance of a dense teacher", 1) ||
                     ensure_with(m, &j, path, cmd, out, cached)
                 ? -1
                 : 0;
    m2d_lock_release(&lock);
    m2d_tokenizer_free(tk);
    m2d_calib_job_free(&j);
    if (rc && *out) {
        m2d_importance_free(*out);
        *out = NULL;
    }
    return rc;
}
