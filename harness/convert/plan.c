/* convert/plan — what to build: the plugins run on every MoE layer into canonical groups, merge
 * weights and α (SPEC §4); the checks that need no statistics. See plan.h. */
#include "convert/plan.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "calib/calib.h"
#include "convert/fingerprint.h"
#include "base/util.h"

void m2d_merge_weights(const double *s, int n, double *w) {
    double sum = 0;
    for (int i = 0; i < n; i++) sum += s[i];
    for (int i = 0; i < n; i++) w[i] = sum > 0 ? s[i] / sum : 1.0 / n;
}


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
    snprintf(p->teacher_hash, sizeof p->teacher_hash, "%s", t->model_hash);
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
