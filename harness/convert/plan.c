/* convert — plan (plugins), build (in memory) and write (HF checkpoint) the student. See convert.h. */
#include "convert/convert.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "calib/calib.h"
#include "base/util.h"

/* ------------------------------------------------------------------ math on plain arrays */

void m2d_merge_weights(const double *s, int n, double *w) {
    double sum = 0;
    for (int i = 0; i < n; i++) sum += s[i];
    for (int i = 0; i < n; i++) w[i] = sum > 0 ? s[i] / sum : 1.0 / n;
}

void m2d_merge_matrices(const float *const *src, const double *w, int n, size_t numel, double scale, float *out) {
    for (size_t j = 0; j < numel; j++) {
        double acc = 0;
        for (int i = 0; i < n; i++) acc += w[i] * src[i][j];
        out[j] = (float)(scale * acc);
    }
}

void m2d_concat_ffn_blocks(int n, int d, const int *widths, const float *const *gates, const float *const *ups,
                           const float *const *downs, float *gate, float *up, float *down) {
    int total = 0, off = 0;
    for (int b = 0; b < n; b++) total += widths[b];
    for (int b = 0; b < n; b++) {
        size_t blk = (size_t)widths[b] * d;
        memcpy(gate + (size_t)off * d, gates[b], blk * sizeof(float));
        memcpy(up + (size_t)off * d, ups[b], blk * sizeof(float));
        for (int r = 0; r < d; r++)
            memcpy(down + (size_t)r * total + off, downs[b] + (size_t)r * widths[b], (size_t)widths[b] * sizeof(float));
        off += widths[b];
    }
}

void m2d_concat_ffn(int k, int d, int d_e, const float *const *gates, const float *const *ups,
                    const float *const *downs, float *gate, float *up, float *down) {
    int *w = m2d_malloc(sizeof(int) * (size_t)k);
    for (int g = 0; g < k; g++) w[g] = d_e;
    m2d_concat_ffn_blocks(k, d, w, gates, ups, downs, gate, up, down);
    free(w);
}

void m2d_swiglu_ref(int d, int inter, const float *gate, const float *up, const float *down, const float *x, float *y) {
    double *h = m2d_malloc((size_t)inter * sizeof *h);
    for (int i = 0; i < inter; i++) {
        double a = 0, b = 0;
        for (int j = 0; j < d; j++) {
            a += (double)gate[(size_t)i * d + j] * x[j];
            b += (double)up[(size_t)i * d + j] * x[j];
        }
        h[i] = a / (1 + exp(-a)) * b;
    }
    for (int r = 0; r < d; r++) {
        double acc = 0;
        for (int i = 0; i < inter; i++) acc += (double)down[(size_t)r * inter + i] * h[i];
        y[r] = (float)acc;
    }
    free(h);
}

/* ------------------------------------------------------------------ plan */

int m2d_convert_parse_param(const char *kv, char **key, double *value) {
    const char *eq = strchr(kv, '=');
    if (!eq || eq == kv || !eq[1])
        return m2d_err("convert: --param '%s': expected key=value (e.g. --param b=1)", kv);
    char *end;
    errno = 0;
    double v = strtod(eq + 1, &end);
    if (errno || *end || !isfinite(v))
        return m2d_err("convert: --param '%s': value '%s' is not a finite number", kv, eq + 1);
    *key = m2d_strfmt("%.*s", (int)(eq - kv), kv);
    *value = v;
    return 0;
}

m2d_baseline m2d_baseline_lookup(const char *name) {
    if (name && !strcmp(name, "random-ffn")) return M2D_BASELINE_RANDOM_FFN;
    if (name && !strcmp(name, "random-init")) return M2D_BASELINE_RANDOM_INIT;
    return M2D_BASELINE_NONE;
}

int m2d_baseline_parse(const char *name, m2d_baseline *out) {
    if ((*out = m2d_baseline_lookup(name)) == M2D_BASELINE_NONE)
        return m2d_err("baseline '%s': expected random-ffn or random-init", name);
    return 0;
}

/* A baseline named in the scoring slot (a sweep's scoring axis): the baseline, planned with sf. */
static m2d_convert_opts resolve_baseline(const m2d_convert_opts *o) {
    m2d_convert_opts r = *o;
    m2d_baseline b = m2d_baseline_lookup(o->scoring);
    if (b != M2D_BASELINE_NONE && o->baseline == M2D_BASELINE_NONE) r.baseline = b, r.scoring = "sf";
    return r;
}

const char *m2d_baseline_name(m2d_baseline b) {
    return b == M2D_BASELINE_RANDOM_FFN ? "random-ffn" : b == M2D_BASELINE_RANDOM_INIT ? "random-init" : NULL;
}

static int find_plugin(m2d_plugin_kind kind, const char *name, const m2d_plugin **out) {
    if (!name) return m2d_err("convert: no %s plugin given", m2d_plugin_kind_name(kind));
    *out = m2d_plugin_find(kind, name);
    if (*out) return 0;
    size_t cap = 64;
    int n = m2d_plugin_count(kind);
    for (int i = 0; i < n; i++) cap += strlen(m2d_plugin_at(kind, i)->name) + 2;
    char *list = m2d_calloc(cap, 1);
    for (int i = 0; i < n; i++) {
        if (i) strcat(list, ", ");
        strcat(list, m2d_plugin_at(kind, i)->name);
    }
    m2d_err("convert: unknown %s plugin '%s' (available: %s)", m2d_plugin_kind_name(kind), name, n ? list : "none");
    free(list);
    return -1;
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

typedef struct { int first, g; } group_key;
static int cmp_group_key(const void *a, const void *b) {
    const group_key *x = a, *y = b;
    return (x->first > y->first) - (x->first < y->first);
}

/* A whole-model grouping's sources of plugin group G -> canonical group CG of LP (model layer ids). */
static void copy_sources(m2d_layer_plan *lp, const m2d_layer_groups *src, const int *layer_ids, int g, int cg,
                         int *pos) {
    lp->src_start[cg] = *pos;
    for (int s = src->src_start[g]; s < src->src_start[g + 1]; s++, (*pos)++) {
        lp->src_layer[*pos] = layer_ids[src->src_layer[s]];
        lp->src_expert[*pos] = src->src_expert[s];
        lp->src_w[*pos] = src->src_w[s];
        lp->src_perm[*pos] = NULL;
        if (src->src_perm && src->src_perm[s]) {
            lp->src_perm[*pos] = m2d_malloc((size_t)lp->d_e * sizeof(int));
            memcpy(lp->src_perm[*pos], src->src_perm[s], (size_t)lp->d_e * sizeof(int));
        }
    }
}

/* Plugin output -> canonical groups (see convert.h), merge weights, α in canonical order; SRC (may
 * be NULL): a whole-model grouping's sources, LAYER_IDS its layer index -> model layer. */
static int canonicalize(m2d_layer_plan *lp, const int *group_of, const double *alpha_plugin, int E,
                        const char *grouping, const m2d_layer_groups *src, const int *layer_ids) {
    int K = lp->K, G = lp->n_groups;
    group_key *keys = m2d_malloc((size_t)G * sizeof *keys);
    for (int g = 0; g < G; g++) keys[g] = (group_key){E, g};
    for (int i = 0; i < K; i++) {
        if (group_of[i] < 0 || group_of[i] >= G) {
            free(keys);
            return m2d_err("convert: layer %d: grouping plugin '%s' put expert %d in group %d (valid: 0..%d)",
                           lp->layer, grouping, lp->selected[i], group_of[i], G - 1);
        }
        if (lp->selected[i] < keys[group_of[i]].first) keys[group_of[i]].first = lp->selected[i];
    }
    for (int g = 0; g < G; g++)
        if (keys[g].first == E) {
            free(keys);
            return m2d_err("convert: layer %d: grouping plugin '%s' left group %d empty", lp->layer, grouping, g);
        }
    qsort(keys, (size_t)G, sizeof *keys, cmp_group_key);
    int pos = 0, spos = 0, with_src = src && src->src_start;
    if (with_src) {
        int n_src = src->src_start[G];
        lp->src_start = m2d_malloc((size_t)(G + 1) * sizeof(int));
        lp->src_layer = m2d_malloc((size_t)n_src * sizeof(int));
        lp->src_expert = m2d_malloc((size_t)n_src * sizeof(int));
        lp->src_w = m2d_malloc((size_t)n_src * sizeof(double));
        lp->src_perm = m2d_calloc((size_t)n_src, sizeof(int *));
    }
    for (int cg = 0; cg < G; cg++) {
        lp->group_start[cg] = pos;
        for (int i = 0; i < K; i++)
            if (group_of[i] == keys[cg].g) lp->members[pos++] = lp->selected[i];
        qsort(lp->members + lp->group_start[cg], (size_t)(pos - lp->group_start[cg]), sizeof(int), cmp_int);
        int n = pos - lp->group_start[cg];
        double *s = m2d_malloc((size_t)n * sizeof *s);
        for (int i = 0; i < n; i++) s[i] = lp->scores[lp->members[lp->group_start[cg] + i]];
        m2d_merge_weights(s, n, lp->merge_w + lp->group_start[cg]);
        free(s);
        lp->alpha[cg] = alpha_plugin ? alpha_plugin[keys[cg].g] : 1.0;
        if (with_src) {
            copy_sources(lp, src, layer_ids, keys[cg].g, cg, &spos);
            for (int i = lp->group_start[cg]; i < pos; i++) lp->merge_w[i] = 0; /* the sources say it all */
        }
    }
    lp->group_start[G] = pos;
    if (with_src) lp->src_start[G] = spos;
    free(keys);
    return 0;
}

/* The subset of PARAMS that plugin P accepts (each plugin validates its own keys). */
static void params_for(const m2d_plugin *p, const m2d_params *all, m2d_params *out, const char **keys, double *vals) {
    int n = 0;
    for (int i = 0; p && i < all->n; i++) {
        m2d_params one = {1, &all->keys[i], &all->values[i]};
        if (m2d_plugin_check_params(p, &one) == 0) {
            keys[n] = all->keys[i];
            vals[n++] = all->values[i];
        }
    }
    m2d_err_clear();
    *out = (m2d_params){n, keys, vals};
}

typedef struct {
    const m2d_plugin *p[3];
    m2d_params params[3];
    const char **keys[3];
    double *vals[3];
} plugin_set;

/* Route each --param key to the plugins that accept it; a key nobody accepts is an error. */
static int route_params(plugin_set *ps, const m2d_params *all) {
    for (int k = 0; k < 3; k++) {
        ps->keys[k] = m2d_calloc((size_t)all->n + 1, sizeof(char *));
        ps->vals[k] = m2d_calloc((size_t)all->n + 1, sizeof(double));
        params_for(ps->p[k], all, &ps->params[k], ps->keys[k], ps->vals[k]);
    }
    for (int i = 0; i < all->n; i++) {
        int used = 0;
        for (int k = 0; k < 3; k++)
            for (int j = 0; j < ps->params[k].n; j++) used |= ps->params[k].keys[j] == all->keys[i];
        if (!used) {
            char acc[512] = "";
            for (int k = 0; k < 3; k++)
                if (ps->p[k] && ps->p[k]->params_default && *ps->p[k]->params_default) {
                    size_t n = strlen(acc);
                    snprintf(acc + n, sizeof acc - n, "%s%s: %s", n ? "; " : "", ps->p[k]->name, ps->p[k]->params_default);
                }
            return m2d_err("convert: --param '%s': no chosen plugin accepts it (accepted: %s)", all->keys[i],
                           *acc ? acc : "none");
        }
    }
    return 0;
}

static void plugin_set_free(plugin_set *ps) {
    for (int k = 0; k < 3; k++) {
        free((void *)ps->keys[k]);
        free(ps->vals[k]);
    }
}

/* Scores and selection of one MoE layer (K experts), its view kept for the grouping. */
static int score_layer(const m2d_model *t, const m2d_layer_stats *ls, int K, int G, const plugin_set *ps,
                       m2d_layer_plan *lp, m2d_layer_view *v) {
    const m2d_config *c = &t->cfg;
    int E = c->num_experts;
    *v = (m2d_layer_view){ls, &t->layers[ls->layer], E, c->num_experts_per_tok, K, c->hidden_size,
                          c->moe_intermediate_size, &ps->params[0]};
    lp->layer = ls->layer;
    lp->K = K;
    lp->n_groups = G;
    lp->d_e = c->moe_intermediate_size;
    lp->scores = m2d_calloc((size_t)E, sizeof(double));
    lp->selected = m2d_malloc((size_t)K * sizeof(int));
    lp->members = m2d_malloc((size_t)K * sizeof(int));
    lp->merge_w = m2d_malloc((size_t)K * sizeof(double));
    return m2d_score_and_select(ps->p[0], v, lp->scores, lp->selected);
}

/* What a dense student's α are multiplied by: the teacher's gate factor (DeepSeek's
 * routed_scaling_factor), 1 for an MoE student (its router keeps the factor). */
static double dense_factor(const m2d_model *t, const m2d_convert_opts *o) {
    double f = t->cfg.routed_scaling_factor;
    return o->target == M2D_TARGET_DENSE && f > 0 ? f : 1.0;
}

/* Grouping (GROUP_OF given by a whole-model grouping, else the layer's plugin), scaling, canonical
 * form. */
static int group_layer(const m2d_layer_view *v, const plugin_set *ps, m2d_layer_plan *lp, const m2d_layer_groups *mg,
                       const int *layer_ids, double dense_factor) {
    int K = lp->K, G = mg ? mg->n_groups : lp->n_groups;
    lp->n_groups = G;
    lp->group_start = m2d_malloc((size_t)(G + 1) * sizeof(int));
    lp->alpha = m2d_malloc((size_t)G * sizeof(double));
    /* grouping and scaling see k = the number of groups wanted (k for a dense student) */
    m2d_layer_view vg = *v;
    vg.k = G;
    vg.params = &ps->params[1];
    int *group_of = m2d_malloc((size_t)K * sizeof(int));
    double *alpha = NULL;
    int rc = 0;
    if (mg) memcpy(group_of, mg->group_of, (size_t)K * sizeof(int));
    else rc = m2d_group_run(ps->p[1], &vg, lp->selected, lp->scores, group_of);
    if (rc == 0 && ps->p[2]) {
        alpha = m2d_malloc((size_t)G * sizeof(double));
        m2d_layer_view vs = vg;
        vs.params = &ps->params[2];
        rc = m2d_scale_run(ps->p[2], &vs, lp->selected, lp->scores, group_of, alpha);
    }
    if (rc == 0) rc = canonicalize(lp, group_of, alpha, v->E, ps->p[1]->name, mg, layer_ids);
    /* DeepSeek's routed_scaling_factor multiplies every gate of the teacher: the dense FFN scales its
     * groups by it too (the scaling rules speak of p; a smaller MoE keeps the factor in its router) */
    for (int g = 0; rc == 0 && dense_factor != 1 && g < G; g++) lp->alpha[g] *= dense_factor;
    free(group_of);
    free(alpha);
    return rc;
}

/* A whole-model grouping (group_model): every layer scored first, then grouped at once. */
static int plan_layers_together(const m2d_model *t, const m2d_stats *stats, const m2d_convert_opts *o,
                                const plugin_set *ps, m2d_convert_plan *p) {
    int L = stats->n_layers, rc = 0;
    m2d_layer_view *views = m2d_calloc((size_t)L, sizeof *views);
    const int **sel = m2d_calloc((size_t)L, sizeof *sel);
    const double **sc = m2d_calloc((size_t)L, sizeof *sc);
    int *ids = m2d_malloc((size_t)L * sizeof *ids);
    for (int i = 0; i < L && rc == 0; i++) {
        p->n_layers = i + 1;
        rc = score_layer(t, &stats->layers[i], p->K, p->n_groups, ps, &p->layers[i], &views[i]);
        sel[i] = p->layers[i].selected, sc[i] = p->layers[i].scores, ids[i] = stats->layers[i].layer;
    }
    m2d_layer_groups *mg = m2d_calloc((size_t)L, sizeof *mg);
    if (rc == 0) {
        m2d_model_view mv = {L, views, sel, sc, ps->p[0], p->n_groups, o->ratio, &ps->params[1]};
        rc = m2d_group_model_run(ps->p[1], &mv, mg);
    }
    for (int i = 0; i < L && rc == 0; i++) rc = group_layer(&views[i], ps, &p->layers[i], &mg[i], ids, dense_factor(t, o));
    int G = 0;
    for (int i = 0; i < L && rc == 0; i++) G = M2D_MAX(G, p->layers[i].n_groups);
    if (rc == 0) p->n_groups = G;
    for (int i = 0; i < L && rc == 0 && o->target == M2D_TARGET_DENSE; i++)
        if (p->layers[i].n_groups != G)
            rc = m2d_err("convert: grouping '%s' gives layer %d %d groups and another %d; a dense student has one "
                         "width in every layer", o->grouping, p->layers[i].layer, p->layers[i].n_groups, G);
    m2d_layer_groups_free(mg, L);
    free(mg), free(views), free(sel), free(sc), free(ids);
    return rc;
}

/* K and the number of groups per layer (see m2d_convert_opts). */
static int plan_sizes(const m2d_config *c, const char *dir, const m2d_convert_opts *o, const m2d_plugin *grouping,
                      int *K, int *G) {
    int E = c->num_experts, k = c->num_experts_per_tok, moe = o->target == M2D_TARGET_MOE;
    *K = o->K;
    *G = o->n_groups;
    if (moe && o->ratio > 0 && (o->K || o->n_groups))
        return m2d_err("convert: --ratio %g sets K and the number of groups: give neither -K nor --groups with it",
                       o->ratio);
    if (moe && o->ratio > 0) {
        if (o->ratio >= 1) return m2d_err("convert: --ratio %g must be below 1 (the fraction of experts removed)", o->ratio);
        int keep = (int)M2D_MAX(1, lround((1 - o->ratio) * E));
        *K = grouping->remap ? E : keep;
        *G = grouping->remap ? keep : 0;
    }
    if (moe ? *K < 1 || *K > E : *K < k || *K > E)
        return m2d_err("convert: -K %d is outside [%s, E] = [%d, %d] (k = num_experts_per_tok of %s)", *K,
                       moe ? "1" : "k", moe ? 1 : k, E, dir);
    if (grouping->remap && *K != E)
        return m2d_err("convert: grouping '%s' assigns every one of the E = %d experts to a group: K must be E, not %d",
                       grouping->name, E, *K);
    if (*G == 0) *G = !moe && grouping->group_count != M2D_GROUPS_EACH ? k : *K;
    if (grouping->group_count == M2D_GROUPS_EACH && *G != *K)
        return m2d_err("convert: grouping '%s' keeps every selected expert on its own: groups must be K = %d, not %d",
                       grouping->name, *K, *G);
    if (*G < 1 || *G > *K) return m2d_err("convert: --groups %d is outside [1, K = %d]", *G, *K);
    if (moe && grouping->remap && o->moe_router != M2D_MOE_ROUTER_SHARED)
        return m2d_err("convert: grouping '%s' keeps the teacher's router: --router shared, not average", grouping->name);
    if (moe && o->top_k < 0) return m2d_err("convert: --top-k %d must be positive", o->top_k);
    return 0;
}

/* What needs no statistics: K and the groups against the config, the plugins, the parameters'
 * routing. PS: the plugins (free with plugin_set_free when 0). */
static int check_opts(const m2d_config *c, const char *dir, const m2d_convert_opts *o, int *K, int *G, plugin_set *ps) {
    if (c->num_experts <= 0) return m2d_err("%s: config.json: field 'num_experts': not an MoE model", dir);
    if (o->baseline != M2D_BASELINE_NONE && o->target != M2D_TARGET_DENSE)
        return m2d_err("convert: the %s baseline is a dense student (--target dense)", m2d_baseline_name(o->baseline));
    memset(ps, 0, sizeof *ps);
    if (find_plugin(M2D_SCORING, o->scoring, &ps->p[0]) || find_plugin(M2D_GROUPING, o->grouping, &ps->p[1])) return -1;
    if (o->target == M2D_TARGET_DENSE && find_plugin(M2D_SCALING, o->scaling, &ps->p[2])) return -1;
    if (plan_sizes(c, dir, o, ps->p[1], K, G)) return -1;
    if (route_params(ps, &o->params)) {
        plugin_set_free(ps);
        return -1;
    }
    return 0;
}

int m2d_convert_check(const m2d_config *c, const char *dir, const m2d_convert_opts *given) {
    int K, G;
    plugin_set ps;
    m2d_convert_opts r = resolve_baseline(given), *o = &r;
    if (check_opts(c, dir, o, &K, &G, &ps)) return -1;
    plugin_set_free(&ps);
    return 0;
}

/* The teacher config's initializer_range, transformers' default 0.02 when absent or not a
 * positive number (the baselines' std). */
static double initializer_range(const m2d_model *t) {
    cJSON *j = t->config_text ? cJSON_Parse(t->config_text) : NULL;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "initializer_range");
    double r = cJSON_IsNumber(v) && v->valuedouble > 0 ? v->valuedouble : 0.02;
    cJSON_Delete(j);
    return r;
}

static m2d_convert_plan *plan_new(const m2d_model *t, const m2d_stats *stats, const m2d_convert_opts *o,
                                  const plugin_set *ps, int K, int G) {
    m2d_convert_plan *p = m2d_calloc(1, sizeof *p);
    p->target = o->target;
    p->moe_router = o->target == M2D_TARGET_MOE ? o->moe_router : M2D_MOE_ROUTER_SHARED;
    p->scoring = m2d_strdup(o->scoring);
    p->grouping = m2d_strdup(o->grouping);
    p->scaling = m2d_strdup(ps->p[2] ? o->scaling : "none");
    p->K = K;
    p->n_groups = G;
    p->ratio = o->target == M2D_TARGET_MOE ? o->ratio : 0;
    int n_exp = p->moe_router == M2D_MOE_ROUTER_SHARED ? K : G;
    p->top_k = o->target == M2D_TARGET_MOE ? M2D_MIN(o->top_k > 0 ? o->top_k : t->cfg.num_experts_per_tok, n_exp) : 0;
    p->n_params = o->params.n;
    p->param_keys = m2d_calloc((size_t)(o->params.n + 1), sizeof(char *));
    p->param_values = m2d_calloc((size_t)(o->params.n + 1), sizeof(double));
    for (int i = 0; i < o->params.n; i++) {
        p->param_keys[i] = m2d_strdup(o->params.keys[i]);
        p->param_values[i] = o->params.values[i];
    }
    p->baseline = o->target == M2D_TARGET_DENSE ? o->baseline : M2D_BASELINE_NONE;
    p->baseline_seed = p->baseline ? o->baseline_seed : 0;
    p->init_std = p->baseline ? initializer_range(t) : 0;
    snprintf(p->teacher_hash, sizeof p->teacher_hash, "%s", t->weights_hash);
    snprintf(p->calib_hash, sizeof p->calib_hash, "%s", stats->calib_hash);
    snprintf(p->calib_precision, sizeof p->calib_precision, "%s", stats->precision[0] ? stats->precision : "fp32");
    p->layers = m2d_calloc((size_t)stats->n_layers, sizeof *p->layers);
    return p;
}

int m2d_convert_plan_build(const m2d_model *t, const m2d_stats *stats, const m2d_convert_opts *given,
                           m2d_convert_plan **out) {
    if (m2d_stats_check_model(stats, "statistics", t)) return -1;
    m2d_convert_opts r = resolve_baseline(given), *o = &r;
    int K, G;
    plugin_set ps;
    if (check_opts(&t->cfg, t->dir, o, &K, &G, &ps)) return -1;
    m2d_convert_plan *p = plan_new(t, stats, o, &ps, K, G);
    int rc = 0;
    if (ps.p[1]->group_model) {
        rc = plan_layers_together(t, stats, o, &ps, p);
    } else {
        for (int i = 0; i < stats->n_layers && rc == 0; i++) {
            m2d_layer_view v;
            p->n_layers = i + 1;
            rc = score_layer(t, &stats->layers[i], K, G, &ps, &p->layers[i], &v);
            if (rc == 0) rc = group_layer(&v, &ps, &p->layers[i], NULL, NULL, dense_factor(t, o));
        }
    }
    plugin_set_free(&ps);
    if (rc) {
        m2d_convert_plan_free(p);
        return -1;
    }
    m2d_convert_fingerprint(p, p->fingerprint);
    *out = p;
    return 0;
}

int m2d_convert_moe_experts(const m2d_convert_plan *p) {
    return p->moe_router == M2D_MOE_ROUTER_SHARED ? p->K : p->n_groups;
}

int64_t m2d_convert_student_params(const m2d_convert_plan *p, const m2d_model *student) {
    const m2d_config *c = &student->cfg;
    int64_t total = m2d_model_param_counts(c).total, per_expert = 3 * (int64_t)c->hidden_size * c->moe_intermediate_size;
    if (p->target != M2D_TARGET_MOE) return total;
    for (int i = 0; i < p->n_layers; i++) total -= (int64_t)(m2d_convert_moe_experts(p) - p->layers[i].n_groups) * per_expert;
    return total;
}

static const char *target_name(const m2d_convert_plan *p) {
    if (p->target == M2D_TARGET_DENSE) return "dense";
    return p->moe_router == M2D_MOE_ROUTER_SHARED ? "moe" : "moe-average";
}

void m2d_convert_plan_free(m2d_convert_plan *p) {
    if (!p) return;
    for (int i = 0; i < p->n_layers; i++) {
        m2d_layer_plan *l = &p->layers[i];
        free(l->scores); free(l->selected); free(l->group_start); free(l->members); free(l->merge_w); free(l->alpha);
        int n_src = l->src_start ? l->src_start[l->n_groups] : 0;
        for (int s = 0; l->src_perm && s < n_src; s++) free(l->src_perm[s]);
        free(l->src_start); free(l->src_layer); free(l->src_expert); free(l->src_w); free(l->src_perm);
    }
    for (int i = 0; i < p->n_params; i++) free(p->param_keys[i]);
    free(p->param_keys); free(p->param_values);
    free(p->layers); free(p->scoring); free(p->grouping); free(p->scaling);
    free(p);
}

static void sha_str(m2d_sha256 *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sha_str(m2d_sha256 *s, const char *fmt, ...) {
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    m2d_sha256_update(s, buf, (size_t)M2D_MIN(n, (int)sizeof buf - 1));
}

/* " src L.E:w[:perm sha]" of source J */
static void fingerprint_source(m2d_sha256 *s, const m2d_layer_plan *l, int j) {
    sha_str(s, " src %d.%d:%a", l->src_layer[j], l->src_expert[j], l->src_w[j]);
    if (l->src_perm[j]) {
        char h[65];
        m2d_sha256_hex(l->src_perm[j], (size_t)l->d_e * sizeof(int), h);
        sha_str(s, ":perm-%.16s", h);
    }
}

void m2d_convert_fingerprint(const m2d_convert_plan *p, char out[65]) {
    m2d_sha256 s;
    m2d_sha256_init(&s);
    sha_str(&s, "moe2dense-student-v1\nteacher %s\ntarget %s\n", p->teacher_hash, target_name(p));
    if (p->target == M2D_TARGET_MOE) sha_str(&s, "top_k %d\n", p->top_k); /* part of the student's config */
    if (p->baseline) /* the weights depend on kind, seed, std and the width only, not on the plan */
        sha_str(&s, "baseline %s seed %llu std %a groups %d\n", m2d_baseline_name(p->baseline),
                (unsigned long long)p->baseline_seed, p->init_std, p->n_groups);
    for (int i = 0; i < p->n_layers && p->baseline; i++) sha_str(&s, "layer %d\n", p->layers[i].layer);
    for (int i = 0; i < p->n_layers && !p->baseline; i++) {
        const m2d_layer_plan *l = &p->layers[i];
        sha_str(&s, "layer %d groups %d\n", l->layer, l->n_groups);
        for (int g = 0; g < l->n_groups; g++) {
            sha_str(&s, "group alpha=%a", l->alpha[g]);
            for (int j = l->group_start[g]; j < l->group_start[g + 1]; j++)
                sha_str(&s, " %d:%a", l->members[j], l->merge_w[j]);
            for (int j = l->src_start ? l->src_start[g] : 0; l->src_start && j < l->src_start[g + 1]; j++)
                fingerprint_source(&s, l, j);
            sha_str(&s, "\n");
        }
    }
    uint8_t d[32];
    m2d_sha256_final(&s, d);
    m2d_hex(d, 32, out);
}

/* ------------------------------------------------------------------ build */

/* The student owns its new tensors; the rest point into the teacher. */
typedef struct {
    m2d_model m;            /* first: the public pointer is &owner->m */
    m2d_tensor **owned;
    char *owns_data;        /* [cap_owned] 0: an alias of another tensor's data (slots of one group) */
    int n_owned, cap_owned;
    const m2d_tensor ***ptr_arrays; /* [n_ptr_arrays] per MoE layer expert pointer arrays (moe target) */
    int n_ptr_arrays;
} student_owner;

static void keep_tensor(student_owner *o, m2d_tensor *t, int owns_data) {
    if (o->n_owned == o->cap_owned) {
        o->cap_owned = o->cap_owned ? 2 * o->cap_owned : 64;
        o->owned = m2d_realloc(o->owned, (size_t)o->cap_owned * sizeof *o->owned);
        o->owns_data = m2d_realloc(o->owns_data, (size_t)o->cap_owned);
    }
    o->owns_data[o->n_owned] = (char)owns_data;
    o->owned[o->n_owned++] = t;
}

static m2d_tensor *new_tensor(student_owner *o, const char *name, m2d_dtype dt, int rows, int cols, const float *src) {
    m2d_tensor *t = m2d_calloc(1, sizeof *t);
    t->name = m2d_strdup(name);
    t->dtype = dt;
    t->ndim = cols > 0 ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols > 0 ? cols : 0;
    int64_t n = (int64_t)rows * (cols > 0 ? cols : 1);
    t->nbytes = (size_t)n * m2d_dtype_size(dt);
    void *data = m2d_malloc(t->nbytes ? t->nbytes : 1);
    m2d_from_f32(dt, src, n, data);
    t->data = data;
    keep_tensor(o, t, 1);
    return t;
}

/* A tensor named NAME over SRC's data (not copied, not freed with the student). */
static const m2d_tensor *alias_tensor(student_owner *o, const char *name, const m2d_tensor *src) {
    m2d_tensor *t = m2d_calloc(1, sizeof *t);
    *t = *src;
    t->name = m2d_strdup(name);
    keep_tensor(o, t, 0);
    return t;
}

/* New FFN tensor of role ROLE (SCOPE: DENSE, MOE or EXPERT) named by ARCH's tensor table; an
 * architecture that writes its FFN block itself (write_ffn: fused or quantised layouts) stores
 * it under other names, and the tensor gets a descriptive one. */
static int role_name(const m2d_arch *arch, m2d_scope scope, int role, int layer, int expert, char *name, size_t n) {
    if (arch->write_ffn && scope == M2D_SCOPE_EXPERT)
        snprintf(name, n, "model.layers.%d.experts.%d.%s", layer, expert, m2d_expert_role_name(role));
    else if (arch->write_ffn)
        snprintf(name, n, "model.layers.%d.%s", layer, m2d_layer_role_name(role));
    else
        return m2d_arch_tensor_name(arch, scope, role, layer, expert, name, n);
    return 0;
}

static const m2d_tensor *role_tensor(student_owner *o, const m2d_arch *arch, m2d_scope scope, int role, int layer,
                                     int expert, m2d_dtype dt, int rows, int cols, const float *src) {
    char name[256];
    if (role_name(arch, scope, role, layer, expert, name, sizeof name) != 0) return NULL;
    return new_tensor(o, name, dt, rows, cols, src);
}

/* One contribution to a group's expert: expert EXPERT of model layer LAYER with weight W, its
 * intermediate neurons permuted by PERM (NULL: as stored). */
typedef struct {
    int layer, expert;
    double w;
    const int *perm;
} contrib;

/* Group G's contributions: its sources (whole-model groupings) or its members (merge weights);
 * returns their number. *out malloc'd. */
static int group_contribs(const m2d_layer_plan *lp, int g, contrib **out) {
    int src = lp->src_start != NULL, a = src ? lp->src_start[g] : lp->group_start[g];
    int n = (src ? lp->src_start[g + 1] : lp->group_start[g + 1]) - a;
    contrib *c = m2d_malloc((size_t)n * sizeof *c);
    for (int i = 0; i < n; i++)
        c[i] = src ? (contrib){lp->src_layer[a + i], lp->src_expert[a + i], lp->src_w[a + i], lp->src_perm[a + i]}
                   : (contrib){lp->layer, lp->members[a + i], lp->merge_w[a + i], NULL};
    *out = c;
    return n;
}

/* Expert role R (M2D_X_*) of C in fp32, the intermediate dimension permuted (rows of gate/up and
 * their biases, columns of down; the down bias lives in the hidden dimension and is not permuted). */
static float *contrib_role(const m2d_model *t, const contrib *c, int r) {
    const m2d_tensor *ts = t->layers[c->layer].x[r][c->expert];
    float *w = m2d_tensor_f32(ts);
    if (!c->perm || r == M2D_X_EXP_DOWN_BIAS) return w;
    int rows = (int)ts->shape[0], cols = ts->ndim > 1 ? (int)ts->shape[1] : 1;
    float *p = m2d_malloc((size_t)rows * cols * sizeof *p);
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++)
            p[(size_t)i * cols + j] =
                r == M2D_X_EXP_DOWN ? w[(size_t)i * cols + c->perm[j]] : w[(size_t)c->perm[i] * cols + j];
    free(w);
    return p;
}

/* Group G's expert role R times SCALE: Σ_c w_c · π_c(W_c), fp64 accumulation, one rounding. */
static float *group_role(const m2d_model *t, const m2d_layer_plan *lp, int g, int r, double scale) {
    contrib *c;
    int n = group_contribs(lp, g, &c);
    size_t numel = (size_t)m2d_tensor_numel(t->layers[c[0].layer].x[r][c[0].expert]);
    float **w = m2d_malloc((size_t)n * sizeof *w), *out = m2d_malloc(numel * sizeof *out);
    double *wt = m2d_malloc((size_t)n * sizeof *wt);
    for (int i = 0; i < n; i++) w[i] = contrib_role(t, &c[i], r), wt[i] = c[i].w;
    m2d_merge_matrices((const float *const *)w, wt, n, numel, scale, out);
    for (int i = 0; i < n; i++) free(w[i]);
    free(w), free(wt), free(c);
    return out;
}

/* The teacher tensor group G's role R is, unchanged (one unpermuted contribution of weight 1), or NULL. */
static const m2d_tensor *unchanged_role(const m2d_model *t, const m2d_layer_plan *lp, int g, int r) {
    contrib *c;
    int n = group_contribs(lp, g, &c);
    const m2d_tensor *ts = n == 1 && c[0].w == 1 && !c[0].perm ? t->layers[c[0].layer].x[r][c[0].expert] : NULL;
    free(c);
    return ts;
}

/* A student that stores its dense FFN as one expert routed top-1 (OLMoE's) has a router of one row:
 * zeros (the softmax over one logit is 1 whatever its value). NULL for every other student. */
static const m2d_tensor *one_expert_router(student_owner *o, const m2d_arch *sa, int layer, m2d_dtype dt, int d) {
    if (!m2d_arch_has_tensor(sa, M2D_SCOPE_DENSE, M2D_T_ROUTER)) return NULL;
    float *zero = m2d_calloc((size_t)d, sizeof(float));
    const m2d_tensor *r = role_tensor(o, sa, M2D_SCOPE_DENSE, M2D_T_ROUTER, layer, 0, dt, 1, d, zero);
    free(zero);
    return r;
}

/* The dense FFN's biases, when the teacher's experts have them: gate/up merged like the weights
 * and concatenated per group; down merged, scaled by α_g and summed over the groups (group g adds
 * α_g (W_down^(g) h_g + b_down^(g))), in fp64 with one rounding. WIDTH: the dense FFN's. */
static int build_dense_biases(student_owner *o, const m2d_model *t, const m2d_layer_plan *lp, int width, m2d_layer *dst) {
    const m2d_layer *src = &t->layers[lp->layer];
    int d = t->cfg.hidden_size, de = t->cfg.moe_intermediate_size, G = lp->n_groups;
    const int xr[3] = {M2D_X_EXP_GATE_BIAS, M2D_X_EXP_UP_BIAS, M2D_X_EXP_DOWN_BIAS};
    const int roles[3] = {M2D_T_GATE_BIAS, M2D_T_UP_BIAS, M2D_T_DOWN_BIAS};
    for (int b = 0; b < 3; b++) {
        if (!src->x[xr[b]]) continue;
        int n = b == 2 ? d : width; /* a shared expert's part (after the groups') has no bias */
        double *acc = m2d_calloc((size_t)n, sizeof(double));
        for (int g = 0; g < G; g++) {
            contrib *c;
            int nc = group_contribs(lp, g, &c);
            for (int i = 0; i < nc; i++) {
                float *v = contrib_role(t, &c[i], xr[b]);
                double wi = c[i].w * (b == 2 ? lp->alpha[g] : 1.0);
                for (int j = 0; j < (b == 2 ? d : de); j++) acc[(b == 2 ? 0 : (size_t)g * de) + j] += wi * v[j];
                free(v);
            }
            free(c);
        }
        float *out = m2d_malloc((size_t)n * sizeof(float));
        for (int j = 0; j < n; j++) out[j] = (float)acc[j];
        dst->w[roles[b]] =
            role_tensor(o, o->m.arch, M2D_SCOPE_DENSE, roles[b], lp->layer, 0, src->x[xr[b]][0]->dtype, n, 0, out);
        free(acc);
        free(out);
        if (!dst->w[roles[b]]) return -1;
    }
    return 0;
}

/* The dense FFN of an MoE layer: the k merged groups (down projections scaled by alpha), then the
 * layer's shared experts copied with alpha = 1 (SPEC §4), concatenated. */
static int build_dense_layer(student_owner *o, const m2d_model *t, const m2d_layer_plan *lp, m2d_layer *dst) {
    const m2d_config *c = &t->cfg;
    const m2d_layer *src = &t->layers[lp->layer];
    int d = c->hidden_size, de = c->moe_intermediate_size, G = lp->n_groups, shared = src->shared_gate_proj != NULL;
    int nb = G + shared, *widths = m2d_malloc(sizeof(int) * (size_t)nb);
    m2d_dtype dt = src->exp_gate[0]->dtype;
    float **gs = m2d_malloc((size_t)nb * sizeof *gs), **us = m2d_malloc((size_t)nb * sizeof *us),
          **ds = m2d_malloc((size_t)nb * sizeof *ds);
    size_t W = 0;
    for (int g = 0; g < G; g++) {
        gs[g] = group_role(t, lp, g, M2D_X_EXP_GATE, 1.0);
        us[g] = group_role(t, lp, g, M2D_X_EXP_UP, 1.0);
        ds[g] = group_role(t, lp, g, M2D_X_EXP_DOWN, lp->alpha[g]);
        W += (size_t)(widths[g] = de);
    }
    if (shared) {
        gs[G] = m2d_tensor_f32(src->shared_gate_proj);
        us[G] = m2d_tensor_f32(src->shared_up_proj);
        ds[G] = m2d_tensor_f32(src->shared_down_proj);
        W += (size_t)(widths[G] = c->shared_expert_intermediate_size);
    }
    float *gate = m2d_malloc(W * d * sizeof(float)), *up = m2d_malloc(W * d * sizeof(float)),
          *down = m2d_malloc(W * d * sizeof(float));
    m2d_concat_ffn_blocks(nb, d, widths, (const float *const *)gs, (const float *const *)us, (const float *const *)ds,
                          gate, up, down);
    const m2d_arch *sa = o->m.arch; /* the student's names */
    dst->gate_proj = role_tensor(o, sa, M2D_SCOPE_DENSE, M2D_T_GATE, lp->layer, 0, dt, (int)W, d, gate);
    dst->up_proj = role_tensor(o, sa, M2D_SCOPE_DENSE, M2D_T_UP, lp->layer, 0, dt, (int)W, d, up);
    dst->down_proj = role_tensor(o, sa, M2D_SCOPE_DENSE, M2D_T_DOWN, lp->layer, 0, dt, d, (int)W, down);
    dst->router = one_expert_router(o, sa, lp->layer, src->router->dtype, d);
    dst->router_bias = NULL;
    for (int r = 0; r < M2D_X_COUNT; r++) dst->x[r] = NULL;
    dst->shared_gate_proj = dst->shared_up_proj = dst->shared_down_proj = dst->shared_expert_gate = NULL;
    for (int b = 0; b < nb; b++) { free(gs[b]); free(us[b]); free(ds[b]); }
    free(gs); free(us); free(ds); free(gate); free(up); free(down); free(widths);
    if (!dst->gate_proj || !dst->up_proj || !dst->down_proj) return -1;
    return build_dense_biases(o, t, lp, (int)W, dst);
}

/* Slot of each canonical member position in a shared-router layer: the rank of its expert id. */
static int *member_slots(const m2d_layer_plan *lp) {
    int *slot = m2d_malloc((size_t)lp->K * sizeof *slot);
    for (int i = 0; i < lp->K; i++) {
        slot[i] = 0;
        for (int j = 0; j < lp->K; j++) slot[i] += lp->members[j] < lp->members[i];
    }
    return slot;
}

/* Router rows (and bias entries, one "row" of width 1) of the --target moe student: each member's
 * own in its slot SLOT[i] (shared) or the merge-weighted average of the group's (average). */
static float *moe_router_rows(const m2d_tensor *tr, const m2d_layer_plan *lp, const int *slot, int X, int width) {
    float *router = m2d_tensor_f32(tr), *rows = m2d_calloc((size_t)X * width, sizeof(float));
    for (int g = 0; g < lp->n_groups; g++) {
        int first = lp->group_start[g], n = lp->group_start[g + 1] - first;
        const int *mem = lp->members + first;
        for (int i = 0; i < n && slot; i++)
            memcpy(rows + (size_t)slot[first + i] * width, router + (size_t)mem[i] * width, (size_t)width * sizeof(float));
        for (int j = 0; j < width && !slot; j++) {
            double acc = 0;
            for (int i = 0; i < n; i++) acc += lp->merge_w[first + i] * router[(size_t)mem[i] * width + j];
            rows[(size_t)g * width + j] = (float)acc;
        }
    }
    free(router);
    return rows;
}

/* Group G's expert role R into the slots SLOTS[0..n) of ARR: the first gets the tensor (the
 * teacher's own data when unchanged), the others alias it. */
static int fill_slots(student_owner *o, const m2d_model *t, const m2d_layer_plan *lp, int g, int r, const int *slots,
                      int n, const m2d_tensor **arr) {
    const int d = t->cfg.hidden_size, de = t->cfg.moe_intermediate_size;
    const int rows[M2D_X_COUNT] = {de, de, d, de, de, d}, cols[M2D_X_COUNT] = {d, d, de, 0, 0, 0};
    _Static_assert(M2D_X_COUNT == 6, "expert roles: shapes above");
    const m2d_tensor *first = unchanged_role(t, lp, g, r);
    for (int i = 0; i < n; i++) {
        char name[256];
        if (role_name(o->m.arch, M2D_SCOPE_EXPERT, r, lp->layer, slots[i], name, sizeof name)) return -1;
        if (first) {
            arr[slots[i]] = alias_tensor(o, name, first);
            continue;
        }
        float *merged = group_role(t, lp, g, r, 1.0);
        first = arr[slots[i]] = new_tensor(o, name, t->layers[lp->layer].x[r][0]->dtype, rows[r], cols[r], merged);
        free(merged);
    }
    return 0;
}

/* --target moe layer. Group g's expert goes to one slot (average) or to the slot of every member
 * (shared: slots in increasing teacher expert id, each keeping its router row). Every expert role
 * the teacher has (weights, and biases when present) is merged the same way. */
static int build_moe_layer(student_owner *o, const m2d_model *t, const m2d_convert_plan *plan,
                           const m2d_layer_plan *lp, m2d_layer *dst, int slot) {
    const m2d_layer *src = &t->layers[lp->layer];
    int d = t->cfg.hidden_size, G = lp->n_groups;
    int shared = plan->moe_router == M2D_MOE_ROUTER_SHARED, X = shared ? lp->K : G;
    const m2d_tensor **arr = m2d_calloc((size_t)M2D_X_COUNT * X, sizeof *arr);
    o->ptr_arrays[slot] = arr;
    for (int r = 0; r < M2D_X_COUNT; r++) dst->x[r] = src->x[r] ? arr + (size_t)r * X : NULL;
    int *mslot = shared ? member_slots(lp) : NULL, rc = 0;
    for (int g = 0; g < G && rc == 0; g++) {
        int first = lp->group_start[g], n = shared ? lp->group_start[g + 1] - first : 1;
        const int *slots = shared ? mslot + first : &g;
        for (int r = 0; r < M2D_X_COUNT && rc == 0; r++)
            if (src->x[r]) rc = fill_slots(o, t, lp, g, r, slots, n, arr + (size_t)r * X);
    }
    if (rc == 0) {
        float *rr = moe_router_rows(src->router, lp, mslot, X, d);
        dst->router = role_tensor(o, o->m.arch, M2D_SCOPE_MOE, M2D_T_ROUTER, lp->layer, 0, src->router->dtype, X, d, rr);
        free(rr);
        rc = dst->router ? 0 : -1;
    }
    if (rc == 0 && src->router_bias) {
        float *rb = moe_router_rows(src->router_bias, lp, mslot, X, 1);
        dst->router_bias = role_tensor(o, o->m.arch, M2D_SCOPE_MOE, M2D_T_ROUTER_BIAS, lp->layer, 0,
                                       src->router_bias->dtype, X, 0, rb);
        free(rb);
        rc = dst->router_bias ? 0 : -1;
    }
    free(mslot);
    return rc;
}

/* Dense teacher layer narrower than the student width: zero-pad (SPEC §4). */
static int pad_dense_layer(student_owner *o, const m2d_model *t, int l, int width, m2d_layer *dst) {
    const m2d_layer *src = &t->layers[l];
    int d = t->cfg.hidden_size, w0 = (int)src->gate_proj->shape[0];
    if (w0 == width) return 0;
    if (w0 > width)
        return m2d_err("convert: dense layer %d is wider (%d) than the student width %d (k*d_e + shared experts); the dense student "
                       "(%s) has one intermediate_size for all layers", l, w0, width, o->m.cfg.arch);
    float *g = m2d_calloc((size_t)width * d, sizeof(float)), *u = m2d_calloc((size_t)width * d, sizeof(float)),
          *dn = m2d_calloc((size_t)width * d, sizeof(float));
    m2d_to_f32(src->gate_proj->dtype, src->gate_proj->data, 0, (int64_t)w0 * d, g);
    m2d_to_f32(src->up_proj->dtype, src->up_proj->data, 0, (int64_t)w0 * d, u);
    float *row = m2d_malloc((size_t)w0 * sizeof(float));
    for (int r = 0; r < d; r++) {
        m2d_to_f32(src->down_proj->dtype, src->down_proj->data, (int64_t)r * w0, w0, row);
        memcpy(dn + (size_t)r * width, row, (size_t)w0 * sizeof(float));
    }
    const m2d_arch *sa = o->m.arch;
    dst->gate_proj = role_tensor(o, sa, M2D_SCOPE_DENSE, M2D_T_GATE, l, 0, src->gate_proj->dtype, width, d, g);
    dst->up_proj = role_tensor(o, sa, M2D_SCOPE_DENSE, M2D_T_UP, l, 0, src->up_proj->dtype, width, d, u);
    dst->down_proj = role_tensor(o, sa, M2D_SCOPE_DENSE, M2D_T_DOWN, l, 0, src->down_proj->dtype, d, width, dn);
    free(g); free(u); free(dn); free(row);
    return dst->gate_proj && dst->up_proj && dst->down_proj ? 0 : -1;
}

/* The dense student's FFN width: the k groups of d_e and the shared experts (SPEC §4: d_dense). */
static int student_width(const m2d_config *c, const m2d_convert_plan *plan) {
    return plan->n_groups * c->moe_intermediate_size + c->shared_expert_intermediate_size;
}

/* The student's config: the teacher adapter rewrites the teacher's config.json (m2d_arch_student_config)
 * and the one config reader parses it, so the in-memory student and the written config.json agree
 * by construction. The dense student must be the architecture the teacher adapter names. */
static int student_config(student_owner *o, const m2d_model *t, const m2d_convert_plan *plan) {
    const m2d_config *c = &t->cfg;
    m2d_student_shape sh = {plan->target == M2D_TARGET_MOE, student_width(c, plan), 0, 0};
    if (sh.moe) {
        sh.n_experts = m2d_convert_moe_experts(plan);
        sh.top_k = plan->top_k;
    }
    if (m2d_arch_student_config(t, &sh, &o->m.config_text) != 0) return -1;
    char *label = m2d_strfmt("%s (student config.json)", t->dir);
    int rc = m2d_config_parse(o->m.config_text, strlen(o->m.config_text), label, &o->m.cfg, &o->m.arch);
    const char *want = sh.moe ? t->arch->name : t->arch->student;
    if (rc == 0 && strcmp(o->m.arch->name, want) != 0)
        rc = m2d_err("%s: the student config names architecture %s, but %s converts to %s", label, o->m.arch->name,
                     t->arch->name, want);
    free(label);
    return rc;
}

static int build_layers(student_owner *o, const m2d_model *t, const m2d_convert_plan *plan) {
    const m2d_config *c = &t->cfg;
    int width = student_width(c, plan), rc = 0;
    for (int l = 0, i = 0; l < c->num_hidden_layers && rc == 0; l++) {
        if (c->layer_is_moe[l]) {
            const m2d_layer_plan *lp = &plan->layers[i];
            if (lp->layer != l) rc = m2d_err("convert: plan layer %d does not match MoE layer %d", lp->layer, l);
            else if (plan->target == M2D_TARGET_DENSE) rc = build_dense_layer(o, t, lp, &o->m.layers[l]);
            else rc = build_moe_layer(o, t, plan, lp, &o->m.layers[l], i);
            i++;
        } else if (plan->target == M2D_TARGET_DENSE) {
            rc = pad_dense_layer(o, t, l, width, &o->m.layers[l]);
        }
    }
    return rc;
}

/* ---- random baselines (convert.h) ---- */
typedef enum { INIT_NORMAL, INIT_ONES, INIT_ZEROS } init_kind;

/* A tensor like LIKE (name, dtype, shape) filled as KIND says, from the stream of its name. */
static const m2d_tensor *random_tensor(student_owner *o, const m2d_tensor *like, const m2d_convert_plan *p,
                                       init_kind kind) {
    int64_t rows = like->shape[0], cols = like->ndim == 2 ? like->shape[1] : 0, n = rows * (cols ? cols : 1);
    float *v = m2d_malloc((size_t)(n ? n : 1) * sizeof *v);
    uint64_t st = p->baseline_seed ^ m2d_fnv1a64(like->name);
    for (int64_t i = 0; i < n; i++)
        v[i] = kind == INIT_NORMAL ? (float)(p->init_std * m2d_rand_normal(&st)) : kind == INIT_ONES ? 1.0f : 0.0f;
    const m2d_tensor *t = new_tensor(o, like->name, like->dtype, (int)rows, (int)cols, v);
    free(v);
    return t;
}

/* How Hugging Face initialises a tensor of layer role R: RMSNorm weights 1, biases (and other
 * vectors) 0, matrices normal(0, initializer_range). */
static init_kind role_init(int r, const m2d_tensor *x) {
    if (strstr(m2d_layer_role_name(r), "norm")) return INIT_ONES;
    return x->ndim == 1 ? INIT_ZEROS : INIT_NORMAL;
}

/* random-ffn: every layer's dense FFN tensors (the one-expert router of a dense layer, where the
 * architecture has one, is kept: its softmax over one expert is 1 whatever it holds);
 * random-init: every tensor of the student. */
static void randomize_student(student_owner *o, const m2d_convert_plan *p) {
    m2d_model *m = &o->m;
    int all = p->baseline == M2D_BASELINE_RANDOM_INIT;
    for (int l = 0; l < m->cfg.num_hidden_layers; l++)
        for (int r = 0; r < M2D_T_COUNT; r++) {
            const m2d_tensor *x = m->layers[l].w[r];
            if (x && r != M2D_T_ROUTER && (all || m2d_layer_role_is_ffn(r)))
                m->layers[l].w[r] = random_tensor(o, x, p, role_init(r, x));
        }
    if (!all) return;
    int tied = m->lm_head == m->embed;
    m->embed = random_tensor(o, m->embed, p, INIT_NORMAL);
    m->final_norm = random_tensor(o, m->final_norm, p, INIT_ONES);
    m->lm_head = tied ? m->embed : random_tensor(o, m->lm_head, p, INIT_NORMAL);
    if (m->lm_head_stored) m->lm_head_stored = m->lm_head;
}

int m2d_convert_build(const m2d_model *t, const m2d_convert_plan *plan, m2d_model **student) {
    const m2d_config *c = &t->cfg;
    int L = c->num_hidden_layers, n_moe = 0;
    for (int l = 0; l < L; l++) n_moe += c->layer_is_moe[l] ? 1 : 0;
    if (plan->n_layers != n_moe || strcmp(plan->teacher_hash, t->weights_hash))
        return m2d_err("convert: the plan was made for another model (%.12s..., this is %.12s...)", plan->teacher_hash,
                       t->weights_hash);
    student_owner *o = m2d_calloc(1, sizeof *o);
    m2d_model *m = &o->m;
    *m = *t; /* shares st, embeddings, norms, head; dir, config and layers are the student's own */
    m->dir = m2d_strfmt("%s (in-memory student %.12s)", t->dir, plan->fingerprint);
    memset(&m->cfg, 0, sizeof m->cfg);
    m->config_text = NULL;
    m->layers = m2d_malloc((size_t)L * sizeof *m->layers);
    memcpy(m->layers, t->layers, (size_t)L * sizeof *m->layers);
    o->ptr_arrays = m2d_calloc((size_t)(n_moe ? n_moe : 1), sizeof *o->ptr_arrays);
    o->n_ptr_arrays = n_moe;
    int rc = student_config(o, t, plan);
    if (rc == 0) rc = build_layers(o, t, plan);
    if (rc == 0 && plan->baseline) randomize_student(o, plan);
    /* identity of an in-memory student: derived from the teacher and the plan (not a hash of bytes) */
    char *id = m2d_strfmt("student %s %s", t->weights_hash, plan->fingerprint);
    m2d_sha256_hex(id, strlen(id), m->weights_hash);
    free(id);
    if (rc) {
        m2d_convert_student_free(m);
        return -1;
    }
    *student = m;
    return 0;
}

void m2d_convert_student_free(m2d_model *student) {
    if (!student) return;
    student_owner *o = (student_owner *)student;
    for (int i = 0; i < o->n_owned; i++) {
        free((void *)o->owned[i]->name);
        if (o->owns_data[i]) free((void *)o->owned[i]->data);
        free(o->owned[i]);
    }
    free(o->owned);
    free(o->owns_data);
    for (int i = 0; i < o->n_ptr_arrays; i++) free(o->ptr_arrays[i]);
    free(o->ptr_arrays);
    free(o->m.layers);
    m2d_config_free(&o->m.cfg);
    free(o->m.config_text);
    free(o->m.dir);
    free(o);
}

/* ------------------------------------------------------------------ write */

static const char *const TOKENIZER_FILES[] = {"tokenizer.json", "tokenizer_config.json", "vocab.json",
                                              "merges.txt", "special_tokens_map.json", "added_tokens.json",
                                              "generation_config.json"};

#define MARK_COMPLETE "moe2dense.json"
#define MARK_INCOMPLETE "moe2dense.incomplete"
#define DIR_LOCK ".moe2dense" /* the lock file is DIR/.moe2dense.lock */

/* 1 when NAME is a file this command writes into a student directory */
static int written_name(const char *name) {
    if (!strcmp(name, "model.safetensors") || !strcmp(name, "model.safetensors.index.json") ||
        !strcmp(name, "config.json") || !strcmp(name, MARK_COMPLETE) || !strcmp(name, MARK_INCOMPLETE))
        return 1;
    for (size_t i = 0; i < M2D_ARRAY_LEN(TOKENIZER_FILES); i++)
        if (!strcmp(name, TOKENIZER_FILES[i])) return 1;
    unsigned a, b;
    char tail[32];
    return sscanf(name, "model-%5u-of-%5u.%31s", &a, &b, tail) == 3 && !strcmp(tail, "safetensors");
}

/* 1 when NAME is the temp file of a write of one of those names that was killed */
static int leftover_name(const char *name) {
    char *base = m2d_strdup(name);
    char *tag = strstr(base, ".m2d-tmp.");
    if (!tag) tag = strstr(base, ".tmp.");
    int yes = 0;
    if (tag) {
        *tag = 0;
        yes = written_name(base) && m2d_atomic_leftover(name, base);
    }
    free(base);
    return yes;
}

typedef struct {
    int complete, incomplete, foreign, leftovers;
} dir_scan;

static int scan_dir(const char *dir, dir_scan *ds) {
    memset(ds, 0, sizeof *ds);
    DIR *dh = opendir(dir);
    if (!dh) return m2d_err("%s: cannot open directory: %s", dir, strerror(errno));
    for (struct dirent *de; (de = readdir(dh));) {
        const char *n = de->d_name;
        if (!strcmp(n, ".") || !strcmp(n, "..") || !strcmp(n, DIR_LOCK ".lock")) continue;
        if (!strcmp(n, MARK_COMPLETE)) ds->complete = 1;
        else if (!strcmp(n, MARK_INCOMPLETE)) ds->incomplete = 1;
        else if (leftover_name(n)) ds->leftovers++;
        else ds->foreign = 1;
    }
    closedir(dh);
    return 0;
}

/* Remove the temp files of killed writes (only under the directory's lock: none is live). */
static void remove_leftovers(const char *dir) {
    DIR *dh = opendir(dir);
    for (struct dirent *de; dh && (de = readdir(dh));) {
        if (!leftover_name(de->d_name)) continue;
        char *p = m2d_path_join(dir, de->d_name);
        unlink(p);
        free(p);
    }
    if (dh) closedir(dh);
}

/* Make DIR ready for a student, under its lock: empty, a student (moe2dense.json), or what a
 * killed convert left (moe2dense.incomplete and/or temp files of our names) -- anything else is
 * refused. The incomplete marker goes first and the complete one is removed, so an interrupted
 * write never looks complete; the temp files of killed writes are removed. */
static int prepare_dir(const char *dir, m2d_lock *lock) {
    if (m2d_mkdir_p(dir)) return -1;
    char *lp = m2d_path_join(dir, DIR_LOCK), *mark = m2d_path_join(dir, MARK_INCOMPLETE);
    char *done = m2d_path_join(dir, MARK_COMPLETE);
    dir_scan ds;
    int rc = m2d_lock_acquire(lock, lp, "convert", "another convert writes this directory", 0);
    if (rc == 0) rc = scan_dir(dir, &ds);
    if (rc == 0 && ds.foreign && !ds.complete && !ds.incomplete)
        rc = m2d_err("%s: directory is not empty and holds no moe2dense.json; refusing to write a student there", dir);
    static const char note[] = "a moe2dense convert is writing this directory, or was interrupted: not a complete "
                               "student (rerun the convert)\n";
    if (rc == 0) rc = m2d_write_file_atomic(mark, note, strlen(note));
    if (rc == 0 && unlink(done) != 0 && errno != ENOENT)
        rc = m2d_err("%s: cannot remove the old moe2dense.json: %s", dir, strerror(errno));
    if (rc == 0 && ds.leftovers) {
        remove_leftovers(dir);
        fprintf(stderr, "moe2dense convert: %s: removed %d temporary file(s) left by an interrupted convert\n", dir,
                ds.leftovers);
    }
    if (rc) m2d_lock_release(lock);
    free(lp);
    free(mark);
    free(done);
    return rc;
}

/* Print J (which this frees) to DIR/NAME atomically. */
static int write_json(const char *dir, const char *name, cJSON *j) {
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    char *path = m2d_path_join(dir, name);
    int rc = m2d_write_file_atomic(path, text, strlen(text));
    free(path);
    free(text);
    return rc;
}

/* The student's config.json: the text its in-memory config was parsed from (student_config). */
static int write_config(const m2d_model *s, const char *dir) {
    if (!s->config_text) return m2d_err("convert: the student %s has no config text", s->dir);
    char *path = m2d_path_join(dir, "config.json");
    int rc = m2d_write_file_atomic(path, s->config_text, strlen(s->config_text));
    free(path);
    return rc;
}

static int copy_tokenizer_files(const m2d_model *t, const char *dir) {
    for (size_t i = 0; i < M2D_ARRAY_LEN(TOKENIZER_FILES); i++) {
        char *src = m2d_path_join(t->dir, TOKENIZER_FILES[i]);
        int rc = 0;
        if (m2d_file_exists(src)) {
            size_t n;
            char *data = m2d_read_file(src, &n);
            char *dst = m2d_path_join(dir, TOKENIZER_FILES[i]);
            rc = data ? m2d_write_file_atomic(dst, data, n) : -1;
            free(data);
            free(dst);
        }
        free(src);
        if (rc) return -1;
    }
    return 0;
}

static int add_tensor(m2d_st_writer *w, const m2d_tensor *t) {
    return m2d_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data);
}

/* The FFN block of a student layer: its FFN roles (dense gate/up/down, router), then each expert's;
 * or as the student's architecture stores them (write_ffn). */
static int add_layer_tensors(m2d_st_writer *w, const m2d_model *s, int layer) {
    if (s->arch->write_ffn) return s->arch->write_ffn(s, layer, w);
    const m2d_layer *l = &s->layers[layer];
    const m2d_config *c = &s->cfg;
    for (int r = 0; r < M2D_T_COUNT; r++)
        if (m2d_layer_role_is_ffn(r) && l->w[r] && add_tensor(w, l->w[r])) return -1;
    for (int e = 0; l->router && e < c->num_experts; e++)
        for (int r = 0; r < M2D_X_COUNT; r++)
            if (l->x[r] && add_tensor(w, l->x[r][e])) return -1;
    return 0;
}

/* SKIP[st index of X] = 1 when X is one of the teacher's stored tensors (not one post_bind made). */
static void mark_stored(const m2d_model *t, const m2d_tensor *x, char *skip) {
    int i = x ? m2d_st_index_of(t->st, x->name) : -1;
    if (i >= 0 && m2d_st_at(t->st, i) == x) skip[i] = 1;
}

/* Mark the teacher's FFN-block tensors of layer L (the ones the student replaces) in SKIP[st index]:
 * those bound to FFN roles and experts, and those post_bind read for them. */
static void mark_ffn_block(const m2d_model *t, int l, char *skip) {
    const m2d_layer *L = &t->layers[l];
    for (int r = 0; r < M2D_T_COUNT; r++)
        if (m2d_layer_role_is_ffn(r)) mark_stored(t, L->w[r], skip);
    for (int r = 0; r < M2D_X_COUNT; r++)
        for (int e = 0; L->x[r] && e < t->cfg.num_experts; e++) mark_stored(t, L->x[r][e], skip);
    for (int i = 0; i < t->n_claimed; i++)
        if (t->claimed[i].layer == l && t->claimed[i].part == M2D_PART_FFN) mark_stored(t, t->claimed[i].t, skip);
}

/* The student's tensor in the place of the teacher's stored non-FFN tensor X (a random-init
 * baseline replaces them; otherwise it is X itself). */
static const m2d_tensor *student_twin(const m2d_model *t, const m2d_model *s, const m2d_tensor *x) {
    if (x == t->embed) return s->embed;
    if (x == t->final_norm) return s->final_norm;
    if (x == t->lm_head) return s->lm_head;
    if (x == t->lm_head_stored) return s->lm_head_stored;
    for (int l = 0; l < t->cfg.num_hidden_layers; l++)
        for (int r = 0; r < M2D_T_COUNT; r++)
            if (t->layers[l].w[r] == x && !m2d_layer_role_is_ffn(r)) return s->layers[l].w[r];
    return x;
}

/* Teacher tensor X as stored (bit-exact copy), or under its name the student's replacement. */
static int add_kept_tensor(m2d_st_writer *w, const m2d_model *t, const m2d_model *s, const m2d_tensor *x, int twins) {
    const m2d_tensor *y = twins ? student_twin(t, s, x) : x;
    if (!y) y = x;
    return m2d_st_writer_add(w, x->name, y->dtype, y->ndim, y->shape, y->data);
}

static int write_weights(const m2d_model *t, const m2d_model *s, const char *dir, int twins) {
    m2d_st_writer *w = m2d_st_writer_new();
    m2d_st_writer_metadata(w, "format", "pt");
    int rc = 0, n = m2d_st_count(t->st);
    char *replaced = m2d_calloc((size_t)t->cfg.num_hidden_layers, 1), *skip = m2d_calloc((size_t)n + 1, 1);
    for (int l = 0; l < t->cfg.num_hidden_layers; l++) {
        replaced[l] = t->cfg.layer_is_moe[l] || s->layers[l].gate_proj != t->layers[l].gate_proj;
        if (replaced[l]) mark_ffn_block(t, l, skip);
    }
    for (int i = 0; i < n && rc == 0; i++)
        if (!skip[i]) rc = add_kept_tensor(w, t, s, m2d_st_at(t->st, i), twins);
    for (int l = 0; l < t->cfg.num_hidden_layers && rc == 0; l++)
        if (replaced[l]) rc = add_layer_tensors(w, s, l);
    free(replaced);
    free(skip);
    char *p = m2d_path_join(dir, "model.safetensors");
    if (rc == 0) rc = m2d_st_writer_write(w, p);
    free(p);
    m2d_st_writer_free(w);
    return rc;
}

static cJSON *int_array(const int *v, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
    return a;
}

static cJSON *dbl_array(const double *v, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
    return a;
}

/* per group: [[layer, expert, weight, permuted?], ...] */
static cJSON *sources_json(const m2d_layer_plan *l) {
    cJSON *a = cJSON_CreateArray();
    for (int g = 0; g < l->n_groups; g++) {
        cJSON *grp = cJSON_CreateArray();
        for (int s = l->src_start[g]; s < l->src_start[g + 1]; s++) {
            cJSON *one = cJSON_CreateArray();
            cJSON_AddItemToArray(one, cJSON_CreateNumber(l->src_layer[s]));
            cJSON_AddItemToArray(one, cJSON_CreateNumber(l->src_expert[s]));
            cJSON_AddItemToArray(one, cJSON_CreateNumber(l->src_w[s]));
            cJSON_AddItemToArray(one, cJSON_CreateBool(l->src_perm[s] != NULL));
            cJSON_AddItemToArray(grp, one);
        }
        cJSON_AddItemToArray(a, grp);
    }
    return a;
}

static int write_manifest(const m2d_model *t, const m2d_convert_plan *p, const char *stats_path, const char *dir) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "moe2dense_version", M2D_VERSION);
    cJSON_AddStringToObject(j, "fingerprint", p->fingerprint);
    cJSON_AddStringToObject(j, "target", p->target == M2D_TARGET_DENSE ? "dense" : "moe");
    if (p->target == M2D_TARGET_MOE) {
        cJSON_AddStringToObject(j, "moe_router", p->moe_router == M2D_MOE_ROUTER_SHARED ? "shared" : "average");
        cJSON_AddNumberToObject(j, "ratio", p->ratio);
        cJSON_AddNumberToObject(j, "top_k", p->top_k);
    }
    cJSON *te = cJSON_AddObjectToObject(j, "teacher");
    cJSON_AddStringToObject(te, "dir", t->dir);
    cJSON_AddStringToObject(te, "architecture", t->cfg.arch);
    cJSON_AddStringToObject(te, "weights_hash", t->weights_hash);
    cJSON *st = cJSON_AddObjectToObject(j, "stats");
    cJSON_AddStringToObject(st, "path", stats_path ? stats_path : "");
    cJSON_AddStringToObject(st, "model_hash", p->teacher_hash);
    cJSON_AddStringToObject(st, "calib_hash", p->calib_hash);
    cJSON_AddStringToObject(st, "precision", p->calib_precision);
    if (p->baseline) {
        cJSON *b = cJSON_AddObjectToObject(j, "baseline");
        cJSON_AddStringToObject(b, "kind", m2d_baseline_name(p->baseline));
        cJSON_AddNumberToObject(b, "seed", (double)p->baseline_seed);
        cJSON_AddNumberToObject(b, "init_std", p->init_std);
        cJSON_AddStringToObject(b, "random", p->baseline == M2D_BASELINE_RANDOM_FFN
                                                 ? "every layer's FFN gate/up/down: normal(0, init_std), biases 0"
                                                 : "every tensor: matrices normal(0, init_std), RMSNorm weights 1, "
                                                   "biases 0");
        cJSON_AddStringToObject(b, "teacher", p->baseline == M2D_BASELINE_RANDOM_FFN
                                                  ? "attention, embeddings, norms, LM head: bit for bit"
                                                  : "nothing (the plan below fixes only the FFN width)");
    }
    cJSON_AddStringToObject(j, "scoring", p->scoring);
    cJSON_AddStringToObject(j, "grouping", p->grouping);
    cJSON_AddStringToObject(j, "scaling", p->scaling);
    cJSON_AddNumberToObject(j, "K", p->K);
    cJSON_AddNumberToObject(j, "groups", p->n_groups);
    cJSON *par = cJSON_AddObjectToObject(j, "params");
    for (int i = 0; i < p->n_params; i++) cJSON_AddNumberToObject(par, p->param_keys[i], p->param_values[i]);
    cJSON *layers = cJSON_AddArrayToObject(j, "layers");
    for (int i = 0; i < p->n_layers; i++) {
        const m2d_layer_plan *l = &p->layers[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "layer", l->layer);
        cJSON_AddItemToObject(o, "selected", int_array(l->selected, l->K));
        cJSON_AddItemToObject(o, "scores", dbl_array(l->scores, t->cfg.num_experts));
        cJSON *gs = cJSON_AddArrayToObject(o, "groups"), *ws = cJSON_AddArrayToObject(o, "merge_weights");
        for (int g = 0; g < l->n_groups; g++) {
            int a = l->group_start[g], n = l->group_start[g + 1] - a;
            cJSON_AddItemToArray(gs, int_array(l->members + a, n));
            cJSON_AddItemToArray(ws, dbl_array(l->merge_w + a, n));
        }
        cJSON_AddItemToObject(o, "alpha", dbl_array(l->alpha, l->n_groups));
        if (l->src_start) cJSON_AddItemToObject(o, "sources", sources_json(l));
        cJSON_AddItemToArray(layers, o);
    }
    return write_json(dir, "moe2dense.json", j);
}

int m2d_convert_write(const m2d_model *t, const m2d_model *s, const m2d_convert_plan *plan, const char *stats_path,
                      const char *dir) {
    if (!t->st) return m2d_err("convert: the teacher %s has no safetensors to copy from", t->dir);
    m2d_lock lock;
    if (prepare_dir(dir, &lock)) return -1;
    int rc = write_weights(t, s, dir, plan->baseline == M2D_BASELINE_RANDOM_INIT) || write_config(s, dir) || copy_tokenizer_files(t, dir) ||
             write_manifest(t, plan, stats_path, dir) ? -1 : 0;
    if (rc == 0) { /* complete: moe2dense.json is in place, the marker of an unfinished write goes */
        char *mark = m2d_path_join(dir, MARK_INCOMPLETE);
        unlink(mark);
        free(mark);
    }
    m2d_lock_release(&lock);
    return rc;
}

int m2d_convert_prepare_dir(const char *dir) {
    m2d_lock lock;
    if (prepare_dir(dir, &lock)) return -1;
    m2d_lock_release(&lock);
    return 0;
}

int m2d_convert_finish_dir(const char *dir) {
    char *mark = m2d_path_join(dir, MARK_INCOMPLETE);
    int rc = unlink(mark) != 0 && errno != ENOENT ? m2d_err("%s: cannot remove: %s", mark, strerror(errno)) : 0;
    free(mark);
    return rc;
}

int m2d_convert_copy_tokenizer(const m2d_model *from, const char *to_dir) { return copy_tokenizer_files(from, to_dir); }
