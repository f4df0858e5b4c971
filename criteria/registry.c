/* registry — one sorted table per plugin kind, filled by M2D_PLUGIN constructors, plus the
 * runners that validate what a plugin returns (so a buggy plugin fails loudly, not silently). */
#include "criteria/registry.h"

#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

#define MAX_PLUGINS 128
static const void *items[M2D_PLUGIN_KINDS][MAX_PLUGINS];
#define PLUGIN_TABLE(kind) {items[kind], 0, MAX_PLUGINS, offsetof(m2d_plugin, name), "too many plugins (raise MAX_PLUGINS)"}
static m2d_name_table tables[M2D_PLUGIN_KINDS] = {PLUGIN_TABLE(M2D_SCORING), PLUGIN_TABLE(M2D_GROUPING),
                                                  PLUGIN_TABLE(M2D_SCALING)};
_Static_assert(M2D_PLUGIN_KINDS == 3, "one PLUGIN_TABLE per kind");

/* plugin families (see m2d_plugin_factory), one table per kind, sorted by prefix */
#define MAX_FACTORIES 16
static const void *factory_items[M2D_PLUGIN_KINDS][MAX_FACTORIES];
#define FACTORY_TABLE(kind) \
    {factory_items[kind], 0, MAX_FACTORIES, offsetof(m2d_plugin_factory, prefix), "too many plugin factories (raise MAX_FACTORIES)"}
static m2d_name_table factories[M2D_PLUGIN_KINDS] = {FACTORY_TABLE(M2D_SCORING), FACTORY_TABLE(M2D_GROUPING),
                                                     FACTORY_TABLE(M2D_SCALING)};

/* plugins made by factories; they live as long as the process. The sweep looks plugins up from
 * worker threads, so making one is serialised. */
static m2d_plugin *derived[MAX_PLUGINS];
static int n_derived;
static pthread_mutex_t derived_lock = PTHREAD_MUTEX_INITIALIZER;

void m2d_plugin_register(const m2d_plugin *p) {
    if ((unsigned)p->kind >= M2D_PLUGIN_KINDS || !p->name) {
        fprintf(stderr, "moe2dense: plugin with bad kind or no name\n");
        abort();
    }
    if (m2d_name_table_find(&tables[p->kind], p->name)) {
        fprintf(stderr, "moe2dense: %s plugin '%s' registered twice\n", m2d_plugin_kind_name(p->kind), p->name);
        abort();
    }
    m2d_name_table_add(&tables[p->kind], p);
}

static const m2d_plugin *find_registered(m2d_plugin_kind kind, const char *name) {
    return m2d_name_table_find(&tables[kind], name);
}

void m2d_plugin_factory_register(const m2d_plugin_factory *f) {
    if ((unsigned)f->kind >= M2D_PLUGIN_KINDS || !f->prefix || !f->prefix[0] || !f->derive) {
        fprintf(stderr, "moe2dense: plugin factory with bad kind, no prefix or no derive\n");
        abort();
    }
    m2d_name_table_add(&factories[f->kind], f);
}

int m2d_plugin_factory_count(m2d_plugin_kind kind) {
    return (unsigned)kind < M2D_PLUGIN_KINDS ? factories[kind].n : 0;
}

const m2d_plugin_factory *m2d_plugin_factory_at(m2d_plugin_kind kind, int i) {
    if ((unsigned)kind >= M2D_PLUGIN_KINDS || i < 0 || i >= factories[kind].n) return NULL;
    return factories[kind].items[i];
}

/* NAME made by factory F from its base (under derived_lock): the one made before, or a new one */
static const m2d_plugin *derive_locked(const m2d_plugin_factory *f, const char *name) {
    for (int i = 0; i < n_derived; i++)
        if (derived[i]->kind == f->kind && !strcmp(derived[i]->name, name)) return derived[i];
    const m2d_plugin *base = find_registered(f->kind, name + strlen(f->prefix));
    if (!base || n_derived == MAX_PLUGINS) return NULL;
    m2d_plugin *p = m2d_calloc(1, sizeof *p);
    if (f->derive(base, p) != 0) {
        free(p);
        return NULL;
    }
    p->name = m2d_strdup(name);
    p->kind = f->kind;
    derived[n_derived++] = p;
    return p;
}

static const m2d_plugin *find_derived(m2d_plugin_kind kind, const char *name) {
    for (int i = 0; i < factories[kind].n; i++) {
        const m2d_plugin_factory *f = factories[kind].items[i];
        if (strncmp(name, f->prefix, strlen(f->prefix)) != 0) continue;
        pthread_mutex_lock(&derived_lock);
        const m2d_plugin *p = derive_locked(f, name);
        pthread_mutex_unlock(&derived_lock);
        if (p) return p;
    }
    return NULL;
}

const m2d_plugin *m2d_plugin_find(m2d_plugin_kind kind, const char *name) {
    if ((unsigned)kind >= M2D_PLUGIN_KINDS || !name) return NULL;
    const m2d_plugin *p = find_registered(kind, name);
    return p ? p : find_derived(kind, name);
}

/* the plugin called NAME, of whichever kind has one */
static const m2d_plugin *find_any_kind(const char *name) {
    for (int k = 0; k < M2D_PLUGIN_KINDS; k++) {
        const m2d_plugin *p = m2d_plugin_find((m2d_plugin_kind)k, name);
        if (p) return p;
    }
    return NULL;
}

const char *m2d_plugin_display_name(const char *name) {
    const m2d_plugin *p = find_any_kind(name);
    return p && p->display ? p->display : name;
}

int m2d_plugin_report_rank(const char *name) {
    const m2d_plugin *p = find_any_kind(name);
    return p ? p->report_rank : 0;
}

int m2d_plugin_count(m2d_plugin_kind kind) { return (unsigned)kind < M2D_PLUGIN_KINDS ? tables[kind].n : 0; }

const m2d_plugin *m2d_plugin_at(m2d_plugin_kind kind, int i) {
    if ((unsigned)kind >= M2D_PLUGIN_KINDS || i < 0 || i >= tables[kind].n) return NULL;
    return tables[kind].items[i];
}

const char *m2d_plugin_kind_name(m2d_plugin_kind kind) {
    static const char *names[] = {"scoring", "grouping", "scaling"};
    return (unsigned)kind < M2D_PLUGIN_KINDS ? names[kind] : "?";
}

double m2d_param(const m2d_params *p, const char *key, double dflt) {
    if (!p) return dflt;
    for (int i = 0; i < p->n; i++)
        if (!strcmp(p->keys[i], key)) return p->values[i];
    return dflt;
}

int m2d_params_parse(const char *s, m2d_params *out) {
    memset(out, 0, sizeof *out);
    if (!s || !*s) return 0;
    int cap = 1;
    for (const char *c = s; *c; c++) cap += *c == ',';
    char **keys = m2d_calloc((size_t)cap, sizeof *keys);
    double *values = m2d_calloc((size_t)cap, sizeof *values);
    char *copy = m2d_strdup(s), *save = NULL;
    int n = 0;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '='), *end = NULL;
        if (!eq || eq == tok) {
            m2d_err("params '%s': field '%s': expected key=value", s, tok);
            goto fail;
        }
        *eq = 0;
        double v = strtod(eq + 1, &end);
        if (end == eq + 1 || *end || !isfinite(v)) {
            m2d_err("params '%s': field '%s': value '%s' is not a finite number", s, tok, eq + 1);
            goto fail;
        }
        for (int i = 0; i < n; i++)
            if (!strcmp(keys[i], tok)) {
                m2d_err("params '%s': field '%s': given twice", s, tok);
                goto fail;
            }
        keys[n] = m2d_strdup(tok);
        values[n++] = v;
    }
    free(copy);
    out->n = n;
    out->keys = (const char *const *)keys;
    out->values = values;
    return 0;
fail:
    for (int i = 0; i < n; i++) free(keys[i]);
    free(keys);
    free(values);
    free(copy);
    return -1;
}

void m2d_params_free(m2d_params *p) {
    if (!p) return;
    for (int i = 0; i < p->n; i++) free((char *)p->keys[i]);
    free((void *)p->keys);
    free((void *)p->values);
    memset(p, 0, sizeof *p);
}

int m2d_plugin_check_params(const m2d_plugin *p, const m2d_params *params) {
    if (!params || params->n == 0) return 0;
    m2d_params accepted;
    if (m2d_params_parse(p->params_default, &accepted) != 0) return -1;
    int rc = 0;
    for (int i = 0; i < params->n && rc == 0; i++) {
        int ok = 0;
        for (int j = 0; j < accepted.n; j++) ok |= !strcmp(params->keys[i], accepted.keys[j]);
        if (!ok)
            rc = m2d_err("%s plugin '%s': field '%s': unknown parameter (accepted: %s)", m2d_plugin_kind_name(p->kind),
                         p->name, params->keys[i], p->params_default ? p->params_default : "none");
    }
    m2d_params_free(&accepted);
    return rc;
}

void m2d_select_topk(const double *scores, int E, int K, int *selected) {
    /* K passes of arg-max over the unselected: O(E·K), tiny for E <= 256; strict '>' keeps the
     * lower index on ties */
    char *used = m2d_calloc((size_t)E, 1);
    for (int r = 0; r < K; r++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (!used[e] && (best < 0 || scores[e] > scores[best])) best = e;
        used[best] = 1;
        selected[r] = best;
    }
    free(used);
}

static int check_view(const char *what, const m2d_plugin *p, const m2d_layer_view *v) {
    int layer = v->stats ? v->stats->layer : -1;
    if (!p) return m2d_err("%s: layer %d: no plugin", what, layer);
    /* K < k is an MoE student smaller than the router's top-k (the student routes to min(k, K)) */
    if (v->E < 1 || v->k < 1 || v->K < 1 || v->K > v->E)
        return m2d_err("%s plugin '%s': layer %d: field 'K': need 1 <= K <= E (E=%d, k=%d, K=%d)", what, p->name,
                       layer, v->E, v->k, v->K);
    return m2d_plugin_check_params(p, v->params);
}

int m2d_score_and_select(const m2d_plugin *scoring, const m2d_layer_view *v, double *scores, int *selected) {
    if (check_view("scoring", scoring, v) != 0) return -1;
    if (scoring->kind != M2D_SCORING || !scoring->score)
        return m2d_err("plugin '%s' is not a scoring plugin", scoring->name);
    int layer = v->stats ? v->stats->layer : -1;
    if (scoring->score(v, scores) != 0) return -1;
    for (int e = 0; e < v->E; e++)
        if (!isfinite(scores[e]) || scores[e] < 0)
            return m2d_err("scoring plugin '%s': layer %d: field 'scores[%d]': %g is not finite and >= 0",
                           scoring->name, layer, e, scores[e]);
    if (!scoring->select) {
        m2d_select_topk(scores, v->E, v->K, selected);
        return 0;
    }
    if (scoring->select(v, scores, selected) != 0) return -1;
    char *seen = m2d_calloc((size_t)v->E, 1);
    int rc = 0;
    for (int i = 0; i < v->K && rc == 0; i++) {
        if (selected[i] < 0 || selected[i] >= v->E || seen[selected[i]])
            rc = m2d_err("scoring plugin '%s': layer %d: field 'selected[%d]': %d is out of range or repeated",
                         scoring->name, layer, i, selected[i]);
        else seen[selected[i]] = 1;
    }
    free(seen);
    return rc;
}

void m2d_groups_canonicalize(int K, int *group_of) {
    /* old id -> new id in order of first appearance; ids are < K by construction */
    int *map = m2d_malloc((size_t)(K > 0 ? K : 1) * sizeof *map);
    for (int i = 0; i < K; i++) map[i] = -1;
    int next = 0;
    for (int i = 0; i < K; i++) {
        int g = group_of[i];
        if (map[g] < 0) map[g] = next++;
        group_of[i] = map[g];
    }
    free(map);
}

int m2d_group_run(const m2d_plugin *grouping, const m2d_layer_view *v, const int *selected,
                  const double *scores, int *group_of) {
    if (check_view("grouping", grouping, v) != 0) return -1;
    if (grouping->kind != M2D_GROUPING || !grouping->group)
        return m2d_err("plugin '%s' is not a grouping plugin", grouping->name);
    if (grouping->group(v, selected, scores, group_of) != 0) return -1;
    int *size = m2d_calloc((size_t)v->k, sizeof *size), rc = 0;
    int layer = v->stats ? v->stats->layer : -1;
    for (int i = 0; i < v->K && rc == 0; i++) {
        if (group_of[i] < 0 || group_of[i] >= v->k)
            rc = m2d_err("grouping plugin '%s': layer %d: field 'group_of[%d]': %d not in [0, %d)", grouping->name,
                         layer, i, group_of[i], v->k);
        else size[group_of[i]]++;
    }
    for (int g = 0; g < v->k && rc == 0; g++)
        if (size[g] == 0)
            rc = m2d_err("grouping plugin '%s': layer %d: field 'group_of': group %d is empty", grouping->name, layer, g);
    free(size);
    if (rc == 0) m2d_groups_canonicalize(v->K, group_of);
    return rc;
}

int m2d_scale_run(const m2d_plugin *scaling, const m2d_layer_view *v, const int *selected,
                  const double *scores, const int *group_of, double *alpha) {
    if (check_view("scaling", scaling, v) != 0) return -1;
    if (scaling->kind != M2D_SCALING || !scaling->scale)
        return m2d_err("plugin '%s' is not a scaling plugin", scaling->name);
    if (scaling->scale(v, selected, scores, group_of, alpha) != 0) return -1;
    for (int g = 0; g < v->k; g++)
        if (!isfinite(alpha[g]) || alpha[g] < 0)
            return m2d_err("scaling plugin '%s': layer %d: field 'alpha[%d]': %g is not finite and >= 0",
                           scaling->name, v->stats ? v->stats->layer : -1, g, alpha[g]);
    return 0;
}

int m2d_score_scope(const m2d_plugin *scoring, const m2d_layer_view *views, int n, double *scores) {
    if (n < 1) return m2d_err("scoring plugin '%s': an empty pool of layers", scoring ? scoring->name : "?");
    for (int i = 0; i < n; i++)
        if (check_view("scoring", scoring, &views[i]) != 0) return -1;
    if (scoring->kind != M2D_SCORING || !scoring->score)
        return m2d_err("plugin '%s' is not a scoring plugin", scoring->name);
    const int E = views[0].E;
    for (int i = 0; i < n; i++) {
        if (views[i].E != E) return m2d_err("scoring plugin '%s': layers of a pool differ in E", scoring->name);
        if (!scoring->score_scope && scoring->score(&views[i], scores + (size_t)i * E) != 0) return -1;
    }
    if (scoring->score_scope && scoring->score_scope(views, n, scores) != 0) return -1;
    for (int i = 0; i < n * E; i++)
        if (!isfinite(scores[i]) || scores[i] < 0)
            return m2d_err("scoring plugin '%s': layer %d: field 'scores[%d]': %g is not finite and >= 0",
                           scoring->name, views[i / E].stats ? views[i / E].stats->layer : -1, i % E, scores[i]);
    return 0;
}

void m2d_layer_groups_free(m2d_layer_groups *g, int n_layers) {
    for (int l = 0; g && l < n_layers; l++) {
        int n_src = g[l].src_start ? g[l].src_start[g[l].n_groups] : 0;
        for (int s = 0; g[l].src_perm && s < n_src; s++) free(g[l].src_perm[s]);
        free(g[l].group_of), free(g[l].src_start), free(g[l].src_layer), free(g[l].src_expert);
        free(g[l].src_w), free(g[l].src_perm);
        memset(&g[l], 0, sizeof g[l]);
    }
}

static int check_perm(const int *perm, int n) {
    char *seen = m2d_calloc((size_t)n, 1);
    int ok = 1;
    for (int i = 0; i < n && ok; i++) {
        ok = perm[i] >= 0 && perm[i] < n && !seen[perm[i]];
        if (ok) seen[perm[i]] = 1;
    }
    free(seen);
    return ok;
}

/* the sources of layer L's groups: indices in range, weights >= 0 summing to 1, permutations */
static int check_sources(const m2d_plugin *p, const m2d_model_view *mv, int l, const m2d_layer_groups *g) {
    int layer = mv->layers[l].stats ? mv->layers[l].stats->layer : l, d_e = mv->layers[l].d_e;
    if (g->src_start[0] != 0) return m2d_err("grouping plugin '%s': layer %d: field 'src_start[0]' is not 0", p->name, layer);
    for (int gi = 0; gi < g->n_groups; gi++) {
        int a = g->src_start[gi], b = g->src_start[gi + 1];
        double sum = 0;
        if (b <= a) return m2d_err("grouping plugin '%s': layer %d: group %d holds no source", p->name, layer, gi);
        for (int s = a; s < b; s++) {
            if (g->src_layer[s] < 0 || g->src_layer[s] >= mv->n_layers || g->src_expert[s] < 0 ||
                g->src_expert[s] >= mv->layers[l].E)
                return m2d_err("grouping plugin '%s': layer %d: field 'src[%d]': (layer %d, expert %d) out of range",
                               p->name, layer, s, g->src_layer[s], g->src_expert[s]);
            if (!isfinite(g->src_w[s]) || g->src_w[s] < 0)
                return m2d_err("grouping plugin '%s': layer %d: field 'src_w[%d]': %g", p->name, layer, s, g->src_w[s]);
            if (g->src_perm && g->src_perm[s] && !check_perm(g->src_perm[s], d_e))
                return m2d_err("grouping plugin '%s': layer %d: field 'src_perm[%d]': not a permutation of %d",
                               p->name, layer, s, d_e);
            sum += g->src_w[s];
        }
        if (fabs(sum - 1) > 1e-9)
            return m2d_err("grouping plugin '%s': layer %d: group %d: source weights sum to %.17g, not 1", p->name,
                           layer, gi, sum);
    }
    return 0;
}

/* group ids of selected order -> canonical (first appearance), sources renumbered along */
static void canonical_groups(m2d_layer_groups *g, int K) {
    int G = g->n_groups, *map = m2d_malloc((size_t)G * sizeof *map), next = 0;
    for (int i = 0; i < G; i++) map[i] = -1;
    for (int i = 0; i < K; i++) {
        if (map[g->group_of[i]] < 0) map[g->group_of[i]] = next++;
        g->group_of[i] = map[g->group_of[i]];
    }
    if (g->src_start) { /* move each group's sources to its new position */
        int n_src = g->src_start[G], *st = m2d_malloc((size_t)(G + 1) * sizeof *st), pos = 0;
        int *ly = m2d_malloc((size_t)n_src * sizeof *ly), *ex = m2d_malloc((size_t)n_src * sizeof *ex);
        double *w = m2d_malloc((size_t)n_src * sizeof *w);
        int **pm = m2d_calloc((size_t)n_src, sizeof *pm);
        for (int ng = 0; ng < G; ng++) {
            int old = 0;
            while (map[old] != ng) old++;
            st[ng] = pos;
            for (int s = g->src_start[old]; s < g->src_start[old + 1]; s++, pos++) {
                ly[pos] = g->src_layer[s], ex[pos] = g->src_expert[s], w[pos] = g->src_w[s];
                pm[pos] = g->src_perm ? g->src_perm[s] : NULL;
            }
        }
        st[G] = pos;
        free(g->src_start), free(g->src_layer), free(g->src_expert), free(g->src_w), free(g->src_perm);
        g->src_start = st, g->src_layer = ly, g->src_expert = ex, g->src_w = w, g->src_perm = pm;
    }
    free(map);
}

int m2d_group_model_run(const m2d_plugin *grouping, const m2d_model_view *mv, m2d_layer_groups *out) {
    if (!grouping || grouping->kind != M2D_GROUPING || !grouping->group_model)
        return m2d_err("plugin '%s' is not a whole-model grouping plugin", grouping ? grouping->name : "?");
    if (m2d_plugin_check_params(grouping, mv->params) != 0) return -1;
    memset(out, 0, (size_t)mv->n_layers * sizeof *out);
    if (grouping->group_model(mv, out) != 0) {
        m2d_layer_groups_free(out, mv->n_layers);
        return -1;
    }
    int rc = 0;
    for (int l = 0; l < mv->n_layers && rc == 0; l++) {
        m2d_layer_groups *g = &out[l];
        const m2d_layer_view *v = &mv->layers[l];
        int layer = v->stats ? v->stats->layer : l;
        int *size = m2d_calloc((size_t)(g->n_groups > 0 ? g->n_groups : 1), sizeof *size);
        if (g->n_groups < 1 || g->n_groups > v->K || !g->group_of)
            rc = m2d_err("grouping plugin '%s': layer %d: field 'n_groups': %d not in [1, K = %d]", grouping->name,
                         layer, g->n_groups, v->K);
        for (int i = 0; i < v->K && rc == 0; i++) {
            if (g->group_of[i] < 0 || g->group_of[i] >= g->n_groups)
                rc = m2d_err("grouping plugin '%s': layer %d: field 'group_of[%d]': %d not in [0, %d)", grouping->name,
                             layer, i, g->group_of[i], g->n_groups);
            else size[g->group_of[i]]++;
        }
        for (int gi = 0; gi < g->n_groups && rc == 0; gi++)
            if (size[gi] == 0)
                rc = m2d_err("grouping plugin '%s': layer %d: field 'group_of': group %d is empty", grouping->name,
                             layer, gi);
        free(size);
        if (rc == 0 && g->src_start) rc = check_sources(grouping, mv, l, g);
        if (rc == 0) canonical_groups(g, v->K);
    }
    if (rc) m2d_layer_groups_free(out, mv->n_layers);
    return rc;
}
