/* convert/prune — the Minitron-pruned student of a dense teacher (prune.h): kept indices from the
 * importance statistics, every tensor cut to them (a gather of stored values: no arithmetic, so the
 * student holds the teacher's own bits), config.json with the new sizes, the checkpoint directory. */
#include "convert/prune.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "calib/importance.h"
#include "convert/write.h"

/* ------------------------------------------------------------------ kept indices */

typedef struct {
    m2d_prune_shape s;  /* resolved */
    int *layers;        /* [s.layers] teacher layer of each student layer */
    int *channels;      /* [s.hidden] */
    int *ffn;           /* [s.layers][s.ffn] */
    int *groups;        /* [s.layers][s.kv_heads] kept kv heads */
    int *heads;         /* [s.layers][s.heads] kept query heads */
} prune_keep;

typedef struct {
    double score;
    int idx;
} ranked;

/* higher score first, ties to the lower index */
static int by_score(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

static int ascending(const void *a, const void *b) {
    int i = *(const int *)a, j = *(const int *)b;
    return i < j ? -1 : i > j;
}

/* OUT[0..k) = the indices of the K highest of SCORE[0..n), ascending (no global state: the sweep
 * may prune in several threads) */
static void top_k(const double *score, int n, int k, int *out) {
    ranked *r = m2d_malloc(sizeof(ranked) * (size_t)n);
    for (int i = 0; i < n; i++) r[i] = (ranked){score[i], i};
    qsort(r, (size_t)n, sizeof(ranked), by_score);
    for (int i = 0; i < k; i++) out[i] = r[i].idx;
    qsort(out, (size_t)k, sizeof(int), ascending);
    free(r);
}

/* kv groups of layer L by the sum of their heads' importance; in each kept group its own top heads */
static void keep_heads(const m2d_importance *imp, int l, const m2d_prune_shape *s, int *groups, int *heads) {
    int G = imp->kv_heads, g_t = imp->heads / G, g_s = s->heads / s->kv_heads;
    const double *h = imp->head + (size_t)l * imp->heads;
    double *gsum = m2d_calloc((size_t)G, sizeof(double));
    for (int q = 0; q < imp->heads; q++) gsum[q / g_t] += h[q];
    top_k(gsum, G, s->kv_heads, groups);
    for (int k = 0; k < s->kv_heads; k++) {
        int g = groups[k];
        top_k(h + (size_t)g * g_t, g_t, g_s, heads + (size_t)k * g_s);
        for (int i = 0; i < g_s; i++) heads[(size_t)k * g_s + i] += g * g_t;
    }
    free(gsum);
}

static void keep_free(prune_keep *k) {
    free(k->layers);
    free(k->channels);
    free(k->ffn);
    free(k->groups);
    free(k->heads);
}

static void keep_build(const m2d_importance *imp, const m2d_prune_shape *s, prune_keep *k) {
    k->s = *s;
    int nl = s->layers;
    k->layers = m2d_malloc(sizeof(int) * (size_t)nl);
    k->channels = m2d_malloc(sizeof(int) * (size_t)s->hidden);
    k->ffn = m2d_malloc(sizeof(int) * (size_t)nl * s->ffn);
    k->groups = m2d_malloc(sizeof(int) * (size_t)nl * s->kv_heads);
    k->heads = m2d_malloc(sizeof(int) * (size_t)nl * s->heads);
    top_k(s->layers_by_nll ? imp->layer_nll : imp->layer_cos, imp->n_layers, nl, k->layers);
    top_k(imp->channel, imp->hidden, s->hidden, k->channels);
    for (int i = 0; i < nl; i++) {
        int l = k->layers[i];
        top_k(imp->ffn_neuron + (size_t)l * imp->ffn, imp->ffn, s->ffn, k->ffn + (size_t)i * s->ffn);
        keep_heads(imp, l, s, k->groups + (size_t)i * s->kv_heads, k->heads + (size_t)i * s->heads);
    }
}

/* ------------------------------------------------------------------ cutting tensors */

/* An index list along one dimension: IDX[n] of blocks of BLOCK consecutive elements (NULL: all). */
typedef struct {
    const int *idx;
    int n, block;
} axis;

static axis all_of(void) { return (axis){NULL, 0, 1}; }

static int64_t axis_len(axis a, int64_t full) { return a.idx ? (int64_t)a.n * a.block : full; }
static int64_t axis_at(axis a, int64_t i) { return a.idx ? (int64_t)a.idx[i / a.block] * a.block + i % a.block : i; }

/* A cut tensor: rows R and columns C of T (a vector: R only), gathered from the teacher's mapped
 * data while the writer writes it, so the writer holds no copy of the student. */
typedef struct cut {
    struct cut *next;
    const m2d_tensor *t;
    axis r, c;
    int64_t nc; /* columns of the cut (1 for a vector) */
} cut;

static int fill_cut(void *ctx, const char *name, size_t offset, void *buf, size_t n) {
    (void)name;
    const cut *x = ctx;
    const m2d_tensor *t = x->t;
    size_t es = m2d_dtype_size(t->dtype);
    int64_t cols = t->ndim == 2 ? t->shape[1] : 1, e = (int64_t)(offset / es), end = e + (int64_t)(n / es);
    const char *src = t->data;
    for (char *out = buf; e < end; e++, out += es) {
        int64_t i = e / x->nc, j = e % x->nc;
        memcpy(out, src + (size_t)(axis_at(x->r, i) * cols + (t->ndim == 2 ? axis_at(x->c, j) : 0)) * es, es);
    }
    return 0;
}

/* T's rows R and columns C (a vector: R only) into W under NAME, in T's dtype (lazy: CUTS keeps
 * what the writer's fill reads, freed by the caller after the write) */
static int add_cut(m2d_st_writer *w, cut **cuts, const char *name, const m2d_tensor *t, axis r, axis c) {
    int64_t rows = t->shape[0], cols = t->ndim == 2 ? t->shape[1] : 1;
    cut *x = m2d_calloc(1, sizeof *x);
    *x = (cut){*cuts, t, r, c, t->ndim == 2 ? axis_len(c, cols) : 1};
    *cuts = x;
    int64_t shape[2] = {axis_len(r, rows), x->nc};
    return m2d_st_writer_add_lazy(w, name, t->dtype, t->ndim, shape, fill_cut, x);
}

/* The axes of layer role ROLE: rows and columns, from the kept channels (C), FFN neurons (F),
 * query heads (Q) and kv groups (K). */
static int role_axes(int role, axis C, axis F, axis Q, axis K, axis *r, axis *c) {
    *r = all_of(), *c = all_of();
    switch (role) {
    case M2D_T_ATTN_NORM: case M2D_T_FFN_NORM: *r = C; return 0;
    case M2D_T_Q: *r = Q, *c = C; return 0;
    case M2D_T_K: case M2D_T_V: *r = K, *c = C; return 0;
    case M2D_T_O: *r = C, *c = Q; return 0;
    case M2D_T_Q_NORM: case M2D_T_K_NORM: return 0; /* per head_dim: unchanged */
    case M2D_T_GATE: case M2D_T_UP: *r = F, *c = C; return 0;
    case M2D_T_DOWN: *r = C, *c = F; return 0;
    default: return m2d_err("prune: the teacher's layers hold a '%s' tensor, which pruning does not cut",
                            m2d_layer_role_name(role));
    }
}

/* student layer I (teacher layer k->layers[I]) */
static int add_layer(m2d_st_writer *w, cut **cuts, const m2d_model *t, const prune_keep *k, int i) {
    const m2d_prune_shape *s = &k->s;
    int hd = t->cfg.head_dim;
    axis C = {k->channels, s->hidden, 1}, F = {k->ffn + (size_t)i * s->ffn, s->ffn, 1};
    axis Q = {k->heads + (size_t)i * s->heads, s->heads, hd}, K = {k->groups + (size_t)i * s->kv_heads, s->kv_heads, hd};
    const m2d_layer *L = &t->layers[k->layers[i]];
    for (int role = 0; role < M2D_T_COUNT; role++) {
        if (!L->w[role]) continue;
        axis r, c;
        char name[256];
        if (role_axes(role, C, F, Q, K, &r, &c) ||
            m2d_arch_tensor_name(t->arch, M2D_SCOPE_DENSE, role, i, -1, name, sizeof name) ||
            add_cut(w, cuts, name, L->w[role], r, c))
            return -1;
    }
    return 0;
}

static int write_weights(const m2d_model *t, const prune_keep *k, const char *dir) {
    m2d_st_writer *w = m2d_st_writer_new();
    m2d_st_writer_metadata(w, "format", "pt");
    axis C = {k->channels, k->s.hidden, 1};
    cut *cuts = NULL;
    int rc = add_cut(w, &cuts, t->embed->name, t->embed, all_of(), C) ||
             add_cut(w, &cuts, t->final_norm->name, t->final_norm, C, C);
    if (rc == 0 && t->lm_head != t->embed) rc = add_cut(w, &cuts, t->lm_head->name, t->lm_head, all_of(), C);
    if (rc == 0 && t->lm_head_stored)
        rc = add_cut(w, &cuts, t->lm_head_stored->name, t->lm_head_stored, all_of(), C);
    for (int i = 0; i < k->s.layers && rc == 0; i++) rc = add_layer(w, &cuts, t, k, i);
    if (rc == 0) rc = m2d_convert_write_checkpoint(w, dir, M2D_CONVERT_SHARD_BYTES);
    m2d_st_writer_free(w);
    while (cuts) {
        cut *x = cuts;
        cuts = x->next;
        free(x);
    }
    return rc;
}

/* ------------------------------------------------------------------ config.json, moe2dense.json */

/* KEY = V in place (the key keeps its position), or added at the end */
static void set_int(cJSON *j, const char *key, int v) {
    if (cJSON_GetObjectItemCaseSensitive(j, key)) cJSON_ReplaceItemInObjectCaseSensitive(j, key, cJSON_CreateNumber(v));
    else cJSON_AddNumberToObject(j, key, v);
}

/* The teacher's config.json with the student's sizes; per-layer lists cut to the kept layers. */
static int student_config(const m2d_model *t, const prune_keep *k, char **out) {
    cJSON *j = cJSON_Parse(t->config_text);
    if (!j) return m2d_err("%s/config.json: cannot parse it again", t->dir);
    const m2d_prune_shape *s = &k->s;
    set_int(j, "hidden_size", s->hidden);
    set_int(j, "intermediate_size", s->ffn);
    set_int(j, "num_hidden_layers", s->layers);
    set_int(j, "num_attention_heads", s->heads);
    set_int(j, "num_key_value_heads", s->kv_heads);
    set_int(j, "head_dim", t->cfg.head_dim); /* Qwen3Config's default is 128, not hidden / heads */
    if (cJSON_GetObjectItemCaseSensitive(j, "max_window_layers")) set_int(j, "max_window_layers", s->layers);
    cJSON *lt = cJSON_GetObjectItemCaseSensitive(j, "layer_types");
    if (cJSON_IsArray(lt)) {
        cJSON *nt = cJSON_CreateArray();
        for (int i = 0; i < s->layers; i++)
            cJSON_AddItemToArray(nt, cJSON_Duplicate(cJSON_GetArrayItem(lt, k->layers[i]), 1));
        cJSON_ReplaceItemInObjectCaseSensitive(j, "layer_types", nt);
    }
    *out = cJSON_Print(j);
    cJSON_Delete(j);
    return 0;
}

static int write_text(const char *dir, const char *name, const char *text) {
    char *p = m2d_path_join(dir, name);
    int rc = m2d_write_file_atomic(p, text, strlen(text));
    free(p);
    return rc;
}

static cJSON *int_rows(const int *v, int rows, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int r = 0; r < rows; r++) cJSON_AddItemToArray(a, cJSON_CreateIntArray(v + (size_t)r * n, n));
    return a;
}

static cJSON *manifest(const m2d_model *t, const m2d_importance *imp, const char *imp_path, const char *imp_sha,
                       const prune_keep *k) {
    const m2d_prune_shape *s = &k->s;
    char spec[128];
    m2d_prune_shape_format(&t->cfg, s, spec, sizeof spec);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "method", "minitron");
    cJSON_AddStringToObject(j, "shape", spec);
    cJSON_AddNumberToObject(j, "params", (double)m2d_prune_params(&t->cfg, s));
    cJSON *te = cJSON_AddObjectToObject(j, "teacher");
    cJSON_AddStringToObject(te, "dir", t->dir);
    cJSON_AddStringToObject(te, "architecture", t->cfg.arch);
    cJSON_AddStringToObject(te, "weights_hash", t->weights_hash);
    cJSON *im = cJSON_AddObjectToObject(j, "importance");
    cJSON_AddStringToObject(im, "path", imp_path);
    cJSON_AddStringToObject(im, "sha256", imp_sha);
    cJSON_AddStringToObject(im, "calib_hash", imp->calib_hash);
    cJSON_AddStringToObject(im, "precision", imp->precision);
    cJSON_AddNumberToObject(im, "n_windows", imp->n_windows);
    cJSON_AddNumberToObject(im, "seq_len", imp->seq_len);
    cJSON_AddStringToObject(j, "layer_rank", s->layers_by_nll ? "skip NLL" : "block importance (1 - cos)");
    cJSON *kp = cJSON_AddObjectToObject(j, "kept");
    cJSON_AddItemToObject(kp, "layers", cJSON_CreateIntArray(k->layers, s->layers));
    cJSON_AddItemToObject(kp, "channels", cJSON_CreateIntArray(k->channels, s->hidden));
    cJSON_AddItemToObject(kp, "ffn", int_rows(k->ffn, s->layers, s->ffn));
    cJSON_AddItemToObject(kp, "kv_heads", int_rows(k->groups, s->layers, s->kv_heads));
    cJSON_AddItemToObject(kp, "heads", int_rows(k->heads, s->layers, s->heads));
    cJSON_AddStringToObject(j, "moe2dense_version", M2D_VERSION);
    return j;
}

/* ------------------------------------------------------------------ the student */

static int file_sha256(const char *path, char out[65]) {
    size_t n;
    char *data = m2d_read_file(path, &n);
    if (!data) return -1;
    m2d_sha256_hex(data, n, out);
    free(data);
    return 0;
}

/* the checkpoint in DIR loads (config, shapes, every tensor bound) before it is marked complete */
static int reopen(const char *dir) {
    m2d_model *m;
    if (m2d_model_open(dir, &m)) return m2d_err_prefix("prune: the written student does not load");
    m2d_model_close(m);
    return 0;
}

static int write_all(const m2d_model *t, const m2d_importance *imp, const char *imp_path, const prune_keep *k,
                     const char *dir) {
    char sha[65], *cfg = NULL;
    int rc = file_sha256(imp_path, sha) || student_config(t, k, &cfg) || write_weights(t, k, dir) ||
                     write_text(dir, "config.json", cfg) || m2d_convert_copy_tokenizer(t, dir) || reopen(dir)
                 ? -1
                 : 0;
    free(cfg);
    if (rc) return -1;
    cJSON *j = manifest(t, imp, imp_path, sha, k);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    rc = write_text(dir, "moe2dense.json", text);
    free(text);
    return rc ? -1 : m2d_convert_finish_dir(dir);
}

int m2d_prune_write(const m2d_model *t, const char *importance_path, const m2d_prune_shape *shape, const char *dir) {
    if (!t->st) return m2d_err("prune: the teacher %s has no safetensors to copy from", t->dir);
    if (m2d_prune_shape_check(&t->cfg, shape)) return m2d_err_prefix(t->dir);
    m2d_importance *imp;
    if (m2d_importance_read(importance_path, &imp)) return -1;
    if (m2d_importance_check_model(imp, importance_path, t)) {
        m2d_importance_free(imp);
        return -1;
    }
    m2d_prune_shape s = *shape;
    char spec[128];
    m2d_prune_shape_format(&t->cfg, shape, spec, sizeof spec);
    m2d_prune_shape_parse(spec, &s); /* every part resolved */
    prune_keep k;
    keep_build(imp, &s, &k);
    m2d_lock lock;
    int rc = m2d_convert_prepare_dir(dir, &lock);
    if (rc == 0) {
        rc = write_all(t, imp, importance_path, &k, dir);
        m2d_lock_release(&lock);
    }
    keep_free(&k);
    m2d_importance_free(imp);
    return rc;
}
