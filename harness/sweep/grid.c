/* grid — experiments.toml → m2d_experiment: the teacher's shape, K expressions, configuration ids,
 * one experiment read (its keys, [teacher] hints, backend, then the grid and its sections), shards
 * and --set. The reader's parts: grid_read.c, grid_expand.c, grid_sections.c (grid_read.h). */
#include "sweep/grid.h"
#include "sweep/grid_read.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "model/model.h"
#include "sweep/grid_d2d.h"
#include "sweep/sweep_backend.h"

/* ---- teacher shape ---- */

static int read_teacher_shape(const char *model, int *E, int *k, int64_t *d_e) {
    m2d_config c;
    if (m2d_config_load(model, &c, NULL) != 0) return -1;
    int rc = c.num_experts < 1 ? m2d_err("%s/config.json: field 'num_experts': %s is not an MoE", model, c.arch) : 0;
    *E = c.num_experts;
    *k = c.num_experts_per_tok;
    *d_e = c.moe_intermediate_size;
    m2d_config_free(&c);
    return rc;
}

int m2d_grid_resolve_K(const char *expr, int k, int E, int *K) {
    char *end;
    long v;
    errno = 0;
    if (strcmp(expr, "k") == 0) {
        v = k;
    } else if (strcmp(expr, "E") == 0) {
        v = E;
    } else if (strncmp(expr, "E/", 2) == 0) {
        long d = strtol(expr + 2, &end, 10);
        if (*end || d < 1 || E % d) return m2d_err("K '%s': E/N needs N dividing E = %d", expr, E);
        v = E / d;
    } else {
        v = strtol(expr, &end, 10);
        if (end == expr || errno) return m2d_err("K '%s': expected k, Nk, E, E/N or a number", expr);
        if (*end == 'k' && end[1] == 0) v *= k;
        else if (*end) return m2d_err("K '%s': expected k, Nk, E, E/N or a number", expr);
    }
    if (v < k || v > E) return m2d_err("K '%s' = %ld is outside [k, E] = [%d, %d]", expr, v, k, E);
    *K = (int)v;
    return 0;
}

void m2d_grid_config_id(const m2d_grid_config *c, char id[M2D_ID_LEN + 1]) {
    /* a dense configuration hashes as before the target axis existed (its id stays) */
    int moe = strcmp(c->target, "moe") == 0;
    char topk[32] = "";
    if (moe && c->top_k) snprintf(topk, sizeof topk, "top_k=%d\n", c->top_k);
    char *s = m2d_strfmt("scoring=%s\ngrouping=%s\nscaling=%s\nK=%d\nparams=%s\n%s%s%s%s", c->scoring, c->grouping,
                         c->scaling, c->K, c->params, moe ? "target=moe\nratio=" : "", moe ? c->ratio : "",
                         moe ? "\n" : "", topk);
    char hex[65];
    m2d_sha256_hex(s, strlen(s), hex);
    memcpy(id, hex, M2D_ID_LEN);
    id[M2D_ID_LEN] = 0;
    free(s);
}

static int check_backend(const ctx *c, const m2d_experiment *x) {
    if (m2d_sweep_backend_find(x->backend)) return 0;
    const m2d_toml *v = m2d_toml_get(x->table, "backend");
    char *names = m2d_sweep_backend_names();
    if (v && v->line)
        m2d_err("%s:%d:%d: experiment '%s': 'backend': '%s' is not a registered sweep backend (%s)", c->file, v->line,
                v->col, c->exp, x->backend, names);
    else
        m2d_err("--set backend: '%s' is not a registered sweep backend (%s)", x->backend, names);
    free(names);
    return -1;
}

/* [teacher]'s dimensions beyond E, k, d_e (each optional; 0 when absent): positive and in range
 * whenever given, so that a typo is refused even while MODEL/config.json is readable. */
static int read_teacher_dims(const ctx *c, m2d_experiment *x) {
    if (m2d_grid_get_int32(c, x->table, "teacher.vocab_size", 0, 1, 1 << 24, &x->t_vocab) ||
        m2d_grid_get_int32(c, x->table, "teacher.hidden_size", 0, 1, 1 << 20, &x->t_hidden) ||
        m2d_grid_get_int32(c, x->table, "teacher.num_hidden_layers", 0, 1, 4096, &x->t_layers) ||
        m2d_grid_get_int32(c, x->table, "teacher.num_attention_heads", 0, 1, 4096, &x->t_heads) ||
        m2d_grid_get_int32(c, x->table, "teacher.num_key_value_heads", 0, 1, 4096, &x->t_kv_heads) ||
        m2d_grid_get_int32(c, x->table, "teacher.head_dim", 0, 1, 4096, &x->t_head_dim) ||
        m2d_grid_get_int32(c, x->table, "teacher.intermediate_size", 0, 1, 1 << 24, &x->t_intermediate) ||
        m2d_grid_get_int32(c, x->table, "teacher.max_position_embeddings", 0, 1, 1 << 24, &x->t_max_pos))
        return -1;
    if (x->t_heads && x->t_kv_heads && x->t_heads % x->t_kv_heads)
        return m2d_grid_key_err(c, m2d_toml_path(x->table, "teacher.num_key_value_heads"), "teacher.num_key_value_heads",
                       "a divisor of teacher.num_attention_heads");
    return 0;
}

static int read_experiment(const ctx *c, m2d_experiment *x) {
    static const char *const top[] = {"description", "model", "backend", "out", "cache_dir", "teacher",
                                      "calibration", "ppl", "mc", "distill", "axes", "include", "exclude", "d2d"};
    if (m2d_grid_check_keys(c, x->table, "the experiment", top, M2D_ARRAY_LEN(top))) return -1;
    static const char *const calib_keys[] = {"data", "seq_len", "samples", "seed", "windows"};
    static const char *const ppl_keys[] = {"protocol", "data", "seq_len", "max_windows"};
    static const char *const teacher_keys[] = {"experts", "top_k", "moe_intermediate_size", "vocab_size", "hidden_size",
                                               "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                               "head_dim", "intermediate_size", "max_position_embeddings"};
    if (m2d_grid_check_keys(c, m2d_toml_get(x->table, "calibration"), "[calibration]", calib_keys, 5) ||
        m2d_grid_check_keys(c, m2d_toml_get(x->table, "ppl"), "[ppl]", ppl_keys, 4) ||
        m2d_grid_check_keys(c, m2d_toml_get(x->table, "teacher"), "[teacher]", teacher_keys, M2D_ARRAY_LEN(teacher_keys)) ||
        read_teacher_dims(c, x))
        return -1;
    if (m2d_grid_get_str(c, x->table, "description", "", &x->description) || m2d_grid_get_path(c, x->table, "model", NULL, &x->model) ||
        m2d_grid_get_str(c, x->table, "backend", "pipeline", &x->backend))
        return -1;
    char *dflt_out = m2d_strfmt("results/%s.csv", x->name);
    int rc = m2d_grid_get_path(c, x->table, "out", dflt_out, &x->out);
    free(dflt_out);
    if (rc || m2d_grid_get_path(c, x->table, "cache_dir", "results/cache", &x->cache_dir)) return -1;
    if (check_backend(c, x)) return -1;
    if (m2d_grid_get_path(c, x->table, "calibration.data", NULL, &x->calib_data) ||
        m2d_grid_get_int32(c, x->table, "calibration.seq_len", 2048, 2, 1 << 20, &x->calib_seq_len) ||
        m2d_grid_get_int32(c, x->table, "calibration.samples", 512, 1, 1 << 24, &x->calib_samples) ||
        m2d_grid_get_int(c, x->table, "calibration.seed", -1, 0, INT64_MAX, &x->calib_seed) ||
        m2d_grid_get_str(c, x->table, "calibration.windows", "fixed", &x->calib_windows))
        return -1;
    if (strcmp(x->calib_windows, "fixed") && strcmp(x->calib_windows, "documents"))
        return m2d_grid_key_err(c, m2d_toml_path(x->table, "calibration.windows"), "calibration.windows",
                       "\"fixed\" or \"documents\"");
    if (m2d_grid_get_str(c, x->table, "ppl.protocol", "gptq", &x->ppl_protocol) ||
        m2d_grid_get_path(c, x->table, "ppl.data", NULL, &x->ppl_data) ||
        m2d_grid_get_int32(c, x->table, "ppl.seq_len", 2048, 2, 1 << 20, &x->ppl_seq_len) ||
        m2d_grid_get_int32(c, x->table, "ppl.max_windows", 0, 0, 1 << 30, &x->ppl_max_windows))
        return -1;
    if (strcmp(x->ppl_protocol, "gptq") && strcmp(x->ppl_protocol, "lm-eval"))
        return m2d_grid_key_err(c, m2d_toml_path(x->table, "ppl.protocol"), "ppl.protocol", "\"gptq\" or \"lm-eval\"");
    if (m2d_grid_read_mc(c, x) || m2d_grid_read_distill(c, x)) return -1;
    /* teacher shape: config.json when the model is here, else the [teacher] hints (dry runs) */
    if (read_teacher_shape(x->model, &x->E, &x->k, &x->d_e) == 0) {
        x->shape_from_config = 1;
    } else {
        char why[512];
        snprintf(why, sizeof why, "%s", m2d_errmsg());
        int E = 0, k = 0, de = 0;
        if (m2d_grid_get_int32(c, x->table, "teacher.experts", 0, 0, 1 << 20, &E) ||
            m2d_grid_get_int32(c, x->table, "teacher.top_k", 0, 0, 1 << 20, &k) ||
            m2d_grid_get_int32(c, x->table, "teacher.moe_intermediate_size", 0, 0, 1 << 30, &de))
            return -1;
        if (E < 1 || k < 1 || k > E)
            return m2d_err("%s: experiment '%s': teacher shape unknown: %s (set --set model=DIR, or give "
                           "[teacher] experts and top_k)", c->file, c->exp, why);
        x->E = E;
        x->k = k;
        x->d_e = de;
    }
    if (m2d_grid_build(c, x) || m2d_grid_d2d_read(x)) return -1;
    return m2d_grid_check_distill_ids(c, x);
}

const char *m2d_experiment_where(const m2d_experiment *x, const char *dotted, const char *item, char *buf, size_t n) {
    const m2d_toml *v = x->table ? m2d_toml_path(x->table, dotted) : NULL;
    if (v && item && v->type == M2D_TOML_ARRAY) {
        const m2d_toml *found = v;
        for (int i = 0; i < v->n; i++) {
            const m2d_toml *e = v->items[i];
            char text[64];
            if (e->type == M2D_TOML_STRING) snprintf(text, sizeof text, "%s", e->str);
            else if (e->type == M2D_TOML_INT) snprintf(text, sizeof text, "%lld", (long long)e->i);
            else continue;
            if (!strcmp(text, item)) {
                found = e;
                break;
            }
        }
        v = found;
    }
    return m2d_grid_where_at(x->file, x->name, v, buf, n);
}

static int experiment_load(const char *path, const char *name, char *const *sets, int n_sets, m2d_experiment *x) {
    x->file = m2d_strdup(path);
    x->name = m2d_strdup(name);
    x->doc = m2d_toml_load(path);
    if (!x->doc) return -1;
    const m2d_toml *exps = m2d_toml_get(x->doc, "experiment");
    const m2d_toml *t = m2d_toml_get(exps, name);
    if (!t || t->type != M2D_TOML_TABLE) {
        char *names = m2d_experiment_names(path);
        m2d_err("%s: no experiment '%s' (have: %s)", path, name, names ? names : "none");
        free(names);
        return -1;
    }
    x->table = t;
    for (int i = 0; i < n_sets; i++) {
        char *eq = strchr(sets[i], '=');
        if (!eq) return m2d_err("--set '%s': expected key=value", sets[i]);
        char *key = m2d_strdup(sets[i]);
        key[eq - sets[i]] = 0;
        int rc = m2d_toml_set((m2d_toml *)t, key, eq + 1);
        free(key);
        if (rc) return -1;
    }
    ctx c = {path, name};
    return read_experiment(&c, x);
}

int m2d_experiment_load(const char *path, const char *name, char *const *sets, int n_sets, m2d_experiment *x) {
    memset(x, 0, sizeof *x);
    if (experiment_load(path, name, sets, n_sets, x) == 0) return 0;
    m2d_experiment_free(x); /* a failed load holds nothing (freeing it again is harmless) */
    return -1;
}

void m2d_experiment_free(m2d_experiment *x) {
    free(x->file);
    free(x->name);
    free(x->description);
    free(x->model);
    free(x->backend);
    free(x->out);
    free(x->cache_dir);
    free(x->calib_data);
    free(x->calib_windows);
    free(x->ppl_protocol);
    free(x->ppl_data);
    for (int i = 0; i < x->n_mc; i++) free(x->mc_tasks[i]);
    free(x->mc_tasks);
    free(x->mc_shots);
    free(x->mc_configs);
    free(x->mc_data_dir);
    for (int i = 0; i < x->n_distill_ids; i++) free(x->distill_ids[i]);
    free(x->distill_ids);
    free(x->distill_configs);
    free(x->distill_data);
    free(x->distill_val_data);
    free(x->distill_losses);
    free(x->distill_topks);
    free(x->d2d_teacher);
    free(x->d2d_calib_data);
    free(x->configs);
    m2d_toml_free(x->doc);
    memset(x, 0, sizeof *x);
}

char *m2d_experiment_names(const char *path) {
    m2d_toml *doc = m2d_toml_load(path);
    if (!doc) return NULL;
    const m2d_toml *exps = m2d_toml_get(doc, "experiment");
    char *out = m2d_strdup("");
    for (int i = 0; exps && exps->type == M2D_TOML_TABLE && i < exps->n; i++) {
        char *next = m2d_strfmt("%s%s%s", out, i ? ", " : "", exps->keys[i]);
        free(out);
        out = next;
    }
    m2d_toml_free(doc);
    return out;
}

int m2d_parse_shard(const char *s, int *i, int *n) {
    char *end;
    long a = strtol(s, &end, 10);
    if (end == s || *end != '/') return m2d_err("--shard '%s': expected I/N (e.g. 3/8)", s);
    const char *rest = end + 1;
    long b = strtol(rest, &end, 10);
    if (end == rest || *end || b < 1 || b > 100000 || a < 1 || a > b)
        return m2d_err("--shard '%s': expected I/N with 1 <= I <= N", s);
    *i = (int)a;
    *n = (int)b;
    return 0;
}

/* Configurations that may share a student (same scoring, scaling, params and K; at K = k also
 * across groupings) stay in one shard so dedup still saves their evaluations. These "affinity
 * groups" are dealt round-robin in the order of their hashes, which mixes cheap and expensive K
 * into every shard. */
static void affinity_key(const m2d_experiment *x, const m2d_grid_config *c, char hex[65]) {
    int dense = strcmp(c->target, "moe") != 0; /* an MoE student never collapses across groupings */
    char *s = m2d_strfmt("%s|%s|%s|%d|%s%s%s|%d", c->scoring, c->scaling, c->params, c->K,
                         dense && c->K == x->k ? "*" : c->grouping, dense ? "" : "|moe|", c->ratio, c->top_k);
    m2d_sha256_hex(s, strlen(s), hex);
    free(s);
}

typedef struct {
    char key[65];
    int first;
} affinity;

static int cmp_affinity(const void *a, const void *b) {
    return strcmp(((const affinity *)a)->key, ((const affinity *)b)->key);
}

/* The configurations that can share a student, grouped: GROUPS[n] (returned n), GROUP_OF[config] */
static int affinity_groups(const m2d_experiment *x, affinity *groups, int *group_of) {
    int n_groups = 0;
    for (int c = 0; c < x->n_configs; c++) {
        char key[65];
        affinity_key(x, &x->configs[c], key);
        int g = -1;
        for (int j = 0; j < n_groups && g < 0; j++)
            if (strcmp(groups[j].key, key) == 0) g = j;
        if (g < 0) {
            g = n_groups++;
            memcpy(groups[g].key, key, sizeof key);
            groups[g].first = c;
        }
        group_of[c] = g;
    }
    return n_groups;
}

int m2d_grid_shard_groups(const m2d_experiment *x) {
    affinity *groups = m2d_malloc((size_t)(x->n_configs + 1) * sizeof *groups);
    int *group_of = m2d_malloc((size_t)(x->n_configs + 1) * sizeof *group_of);
    int n = affinity_groups(x, groups, group_of);
    free(groups), free(group_of);
    return n;
}

int m2d_grid_shard(const m2d_experiment *x, int i, int n, int **idx) {
    affinity *groups = m2d_malloc((size_t)(x->n_configs + 1) * sizeof *groups);
    int *group_of = m2d_malloc((size_t)(x->n_configs + 1) * sizeof *group_of);
    int n_groups = affinity_groups(x, groups, group_of);
    affinity *sorted = m2d_malloc((size_t)(n_groups + 1) * sizeof *sorted);
    memcpy(sorted, groups, (size_t)n_groups * sizeof *sorted);
    qsort(sorted, (size_t)n_groups, sizeof *sorted, cmp_affinity);
    int *shard_of_group = m2d_malloc((size_t)(n_groups + 1) * sizeof *shard_of_group);
    for (int p = 0; p < n_groups; p++) {
        int g = group_of[sorted[p].first];
        shard_of_group[g] = p % n;
    }
    *idx = m2d_malloc((size_t)(x->n_configs + 1) * sizeof **idx);
    int cnt = 0;
    for (int c = 0; c < x->n_configs; c++)
        if (shard_of_group[group_of[c]] == i - 1) (*idx)[cnt++] = c;
    free(groups);
    free(group_of);
    free(sorted);
    free(shard_of_group);
    return cnt;
}

int m2d_extract_sets(const char *cmd, int *argc, char **argv, char ***sets, int *n_sets) {
    *sets = m2d_calloc((size_t)*argc + 1, sizeof **sets);
    *n_sets = 0;
    int out = 0;
    for (int i = 0; i < *argc; i++) {
        if (strcmp(argv[i], "--set") == 0) {
            if (i + 1 >= *argc) return m2d_err("%s: option '--set' needs a value", cmd);
            (*sets)[(*n_sets)++] = argv[++i];
        } else if (strncmp(argv[i], "--set=", 6) == 0) {
            (*sets)[(*n_sets)++] = argv[i] + 6;
        } else {
            argv[out++] = argv[i];
        }
    }
    *argc = out;
    return 0;
}
