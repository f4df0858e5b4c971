/* grid_expand — the grid of an experiment: its axes (scoring, grouping, scaling, K, params, and
 * the MoE target's), include / exclude rules, K expressions resolved, the size limit; one
 * m2d_grid_config per surviving combination, in grid order (grid_read.h). */
#include "sweep/grid_read.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "io/results.h"

static const char *const AXES[] = {"scoring", "grouping", "scaling", "K", "params", "target", "ratio", "top_k"};
enum { AX_SCORING, AX_GROUPING, AX_SCALING, AX_K, AX_PARAMS, AX_TARGET, AX_RATIO, AX_TOP_K, N_AXES };
#define AXES_LIST "scoring, grouping, scaling, K, params, target, ratio, top_k"

/* ---- axes and rules ---- */

typedef struct {
    int n;
    char **vals; /* K: the expressions; others: names */
} axis;

static void axis_free(axis *a) {
    for (int i = 0; i < a->n; i++) free(a->vals[i]);
    free(a->vals);
}

/* A scalar axis value as text: strings as is, integers printed (K = 16). */
static int scalar_text(const ctx *c, const m2d_toml *v, const char *key, char *buf, size_t n) {
    if (v->type == M2D_TOML_STRING) {
        if (!v->str[0] && strcmp(key, "params") != 0) return m2d_grid_key_err(c, v, key, "a non-empty string");
        if (strlen(v->str) >= n) return m2d_grid_key_err(c, v, key, "a shorter string");
        snprintf(buf, n, "%s", v->str);
    } else if (v->type == M2D_TOML_INT) {
        snprintf(buf, n, "%lld", (long long)v->i);
    } else if (v->type == M2D_TOML_FLOAT && strcmp(key, "ratio") == 0) {
        snprintf(buf, n, "%.15g", v->f);
    } else {
        return m2d_grid_key_err(c, v, key, "a string or an integer");
    }
    return 0;
}

/* a fraction of experts removed, in [0, 1) */
static int parse_ratio(const char *s, double *r) {
    char *end;
    *r = strtod(s, &end);
    return end == s || *end || !(*r >= 0 && *r < 1) ? -1 : 0;
}

static int read_axis(const ctx *c, const m2d_toml *axes, int which, axis *a) {
    const char *key = AXES[which];
    const m2d_toml *v = m2d_toml_get(axes, key);
    a->n = 0;
    a->vals = NULL;
    if (!v && (which == AX_PARAMS || which == AX_TARGET)) { /* optional: [""] and ["dense"] */
        a->n = 1;
        a->vals = m2d_malloc(sizeof *a->vals);
        a->vals[0] = m2d_strdup(which == AX_TARGET ? "dense" : "");
        return 0;
    }
    if (!v && which == AX_TOP_K) { /* optional: the teacher's k */
        a->n = 1;
        a->vals = m2d_malloc(sizeof *a->vals);
        a->vals[0] = m2d_strdup("0");
        return 0;
    }
    if (!v && (which == AX_RATIO || which == AX_SCALING || which == AX_K)) return 0; /* checked by the grid */
    if (!v) return m2d_grid_key_err(c, NULL, key, "an axis list in [axes]");
    if (v->type != M2D_TOML_ARRAY || v->n == 0) return m2d_grid_key_err(c, v, key, "a non-empty array");
    a->vals = m2d_calloc((size_t)v->n, sizeof *a->vals);
    for (int i = 0; i < v->n; i++) {
        char buf[128], at[512];
        size_t cap = which == AX_PARAMS ? 128 : which == AX_K ? 16 : which == AX_TARGET ? 8 : which == AX_RATIO ? 9 : 32;
        if (scalar_text(c, v->items[i], key, buf, cap)) return -1; /* cap: the m2d_grid_config field */
        double r;
        if (which == AX_TARGET && strcmp(buf, "dense") && strcmp(buf, "moe"))
            return m2d_err("%s: axis 'target': '%s' is not dense or moe", m2d_grid_where(c, v->items[i], at, sizeof at), buf);
        if (which == AX_RATIO && parse_ratio(buf, &r))
            return m2d_err("%s: axis 'ratio': '%s' is not a fraction of experts removed in [0, 1)",
                           m2d_grid_where(c, v->items[i], at, sizeof at), buf);
        char *end;
        long tk = which == AX_TOP_K ? strtol(buf, &end, 10) : 1;
        if (which == AX_TOP_K && (*end || tk < 1 || v->items[i]->type != M2D_TOML_INT))
            return m2d_err("%s: axis 'top_k': '%s' is not a number of experts >= 1", m2d_grid_where(c, v->items[i], at, sizeof at),
                           buf);
        for (int j = 0; j < a->n; j++)
            if (strcmp(a->vals[j], buf) == 0)
                return m2d_err("%s: axis '%s' lists '%s' twice", m2d_grid_where(c, v->items[i], at, sizeof at), key, buf);
        /* plugin names reach file names, CSV cells and plot titles: plugin-style names only */
        if (which <= AX_SCALING && !m2d_results_is_name(buf))
            return m2d_err("%s: axis '%s': '%s' is not a plugin name ([a-z0-9][a-z0-9_.+-]*, < 32 characters)",
                           m2d_grid_where(c, v->items[i], at, sizeof at), key, buf);
        a->vals[a->n++] = m2d_strdup(buf);
    }
    return 0;
}

/* Does config C match RULE (a table axis -> value or list of values)? */
static int rule_matches(const ctx *c, const m2d_toml *rule, const m2d_grid_config *cfg, int k, int E, int *match) {
    *match = 1;
    for (int i = 0; i < rule->n; i++) {
        const char *key = rule->keys[i];
        int which = -1;
        for (int a = 0; a < N_AXES; a++)
            if (strcmp(key, AXES[a]) == 0) which = a;
        char at[512];
        if (which < 0)
            return m2d_err("%s: rule key '%s' is not an axis (" AXES_LIST ")", m2d_grid_where(c, rule->items[i], at, sizeof at),
                           key);
        const m2d_toml *v = rule->items[i];
        int nv = v->type == M2D_TOML_ARRAY ? v->n : 1;
        int any = 0;
        for (int j = 0; j < nv; j++) {
            const m2d_toml *item = v->type == M2D_TOML_ARRAY ? v->items[j] : v;
            char buf[128];
            if (scalar_text(c, item, key, buf, sizeof buf)) return -1;
            switch (which) {
            case AX_SCORING: any |= strcmp(buf, cfg->scoring) == 0; break;
            case AX_GROUPING: any |= strcmp(buf, cfg->grouping) == 0; break;
            case AX_SCALING: any |= strcmp(buf, cfg->scaling) == 0; break;
            case AX_PARAMS: any |= strcmp(buf, cfg->params) == 0; break;
            case AX_TARGET: any |= strcmp(buf, cfg->target) == 0; break;
            case AX_TOP_K: any |= atoi(buf) == (cfg->top_k ? cfg->top_k : k); break;
            case AX_RATIO: {
                double r;
                any |= parse_ratio(buf, &r) == 0 && r == cfg->ratio_v;
                break;
            }
            case AX_K: {
                int K;
                if (m2d_grid_resolve_K(buf, k, E, &K)) {
                    char msg[512];
                    snprintf(msg, sizeof msg, "%s", m2d_errmsg());
                    return m2d_err("%s: rule: %s", m2d_grid_where(c, item, at, sizeof at), msg);
                }
                any |= K == cfg->K;
                break;
            }
            }
        }
        if (!any) *match = 0;
    }
    return 0;
}

static int rules_match_any(const ctx *c, const m2d_toml *rules, const m2d_grid_config *cfg, int k, int E,
                           int *match) {
    *match = 0;
    for (int r = 0; r < rules->n; r++) {
        int m;
        if (rule_matches(c, rules->items[r], cfg, k, E, &m)) return -1;
        if (m) {
            *match = 1;
            return 0;
        }
    }
    return 0;
}

static int get_rules(const ctx *c, const m2d_toml *t, const char *key, const m2d_toml **out) {
    const m2d_toml *v = m2d_toml_get(t, key);
    *out = NULL;
    if (!v) return 0;
    if (v->type != M2D_TOML_ARRAY) return m2d_grid_key_err(c, v, key, "an array of tables ([[experiment.NAME." "rules]])");
    for (int i = 0; i < v->n; i++)
        if (v->items[i]->type != M2D_TOML_TABLE) return m2d_grid_key_err(c, v->items[i], key, "an array of tables");
    *out = v;
    return 0;
}

typedef struct {
    const ctx *c;
    m2d_experiment *x;
    const m2d_toml *axes_t, *incl, *excl;
    int cap;
} grid_build;

/* K of a dense configuration from its expression (errors name axes.K) */
static int resolve_dense_K(grid_build *gb, m2d_grid_config *cfg) {
    if (m2d_grid_resolve_K(cfg->K_expr, gb->x->k, gb->x->E, &cfg->K) == 0) return 0;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", m2d_errmsg());
    const m2d_toml *kv = m2d_toml_get(gb->axes_t, "K");
    char at[512];
    return m2d_err("%s: axes.K: %s (teacher k = %d, E = %d)", m2d_grid_where(gb->c, kv, at, sizeof at), msg, gb->x->k, gb->x->E);
}

/* The rules, then the id; kept configurations are appended to the grid. */
static int add_config(grid_build *gb, m2d_grid_config *cfg) {
    m2d_experiment *x = gb->x;
    int m = 1, rc = 0;
    if (gb->incl && (rc = rules_match_any(gb->c, gb->incl, cfg, x->k, x->E, &m))) return rc;
    if (m && gb->excl) {
        int e;
        if ((rc = rules_match_any(gb->c, gb->excl, cfg, x->k, x->E, &e))) return rc;
        m = !e;
    }
    if (!m) {
        x->n_excluded++;
        return 0;
    }
    m2d_grid_config_id(cfg, cfg->id);
    cfg->index = x->n_configs;
    if (x->n_configs == gb->cap) {
        gb->cap = gb->cap ? 2 * gb->cap : 64;
        x->configs = m2d_realloc(x->configs, (size_t)gb->cap * sizeof *x->configs);
    }
    x->configs[x->n_configs++] = *cfg;
    return 0;
}

/* scaling × K × params of a dense target (BASE: scoring, grouping, target filled) */
static int add_dense(grid_build *gb, const axis *ax, const m2d_grid_config *base) {
    int rc = 0;
    for (int d = 0; rc == 0 && d < ax[AX_SCALING].n; d++)
        for (int kk = 0; rc == 0 && kk < ax[AX_K].n; kk++)
            for (int p = 0; rc == 0 && p < ax[AX_PARAMS].n; p++) {
                m2d_grid_config cfg = *base;
                snprintf(cfg.scaling, sizeof cfg.scaling, "%s", ax[AX_SCALING].vals[d]);
                snprintf(cfg.K_expr, sizeof cfg.K_expr, "%s", ax[AX_K].vals[kk]);
                snprintf(cfg.params, sizeof cfg.params, "%s", ax[AX_PARAMS].vals[p]);
                if ((rc = resolve_dense_K(gb, &cfg))) break;
                /* two K expressions for the same K (e.g. 8k and E when E = 8k): keep the first */
                int dup = 0;
                for (int q = 0; q < kk; q++) {
                    int K2;
                    if (m2d_grid_resolve_K(ax[AX_K].vals[q], gb->x->k, gb->x->E, &K2) == 0 && K2 == cfg.K) dup = 1;
                }
                if (dup) gb->x->n_duplicate_K++;
                if (!dup) rc = add_config(gb, &cfg);
            }
    return rc;
}

/* ratio × top_k × params of an MoE target: scaling "none", K = max(1, round((1 − ratio)·E)) */
static int add_moe(grid_build *gb, const axis *ax, const m2d_grid_config *base) {
    int rc = 0;
    for (int r = 0; rc == 0 && r < ax[AX_RATIO].n; r++)
        for (int tk = 0; rc == 0 && tk < ax[AX_TOP_K].n; tk++)
            for (int p = 0; rc == 0 && p < ax[AX_PARAMS].n; p++) {
                m2d_grid_config cfg = *base;
                cfg.top_k = atoi(ax[AX_TOP_K].vals[tk]);
                if (cfg.top_k == gb->x->k) cfg.top_k = 0; /* the teacher's: one id for "k" either way */
                snprintf(cfg.scaling, sizeof cfg.scaling, "none");
                snprintf(cfg.ratio, sizeof cfg.ratio, "%s", ax[AX_RATIO].vals[r]);
                parse_ratio(cfg.ratio, &cfg.ratio_v);
                snprintf(cfg.K_expr, sizeof cfg.K_expr, "(1-%.8s)E", cfg.ratio); /* the axis caps ratio at 8 */
                cfg.K = (int)M2D_MAX(1, lround((1 - cfg.ratio_v) * gb->x->E));
                snprintf(cfg.params, sizeof cfg.params, "%s", ax[AX_PARAMS].vals[p]);
                rc = add_config(gb, &cfg);
            }
    return rc;
}

/* the axes a target needs: scaling and K for dense, ratio for moe */
static int check_target_axes(const ctx *c, const m2d_toml *axes_t, const axis *ax) {
    int dense = 0, moe = 0;
    for (int t = 0; t < ax[AX_TARGET].n; t++) dense |= !strcmp(ax[AX_TARGET].vals[t], "dense"), moe |= !strcmp(ax[AX_TARGET].vals[t], "moe");
    if (dense && !ax[AX_SCALING].n) return m2d_grid_key_err(c, NULL, "scaling", "an axis list in [axes] (target dense)");
    if (dense && !ax[AX_K].n) return m2d_grid_key_err(c, NULL, "K", "an axis list in [axes] (target dense)");
    if (moe && !ax[AX_RATIO].n) return m2d_grid_key_err(c, NULL, "ratio", "an axis list in [axes] (target moe)");
    const char *moe_only[2] = {"ratio", "top_k"};
    for (int i = 0; i < 2 && !moe; i++) {
        const m2d_toml *v = m2d_toml_get(axes_t, moe_only[i]);
        char at[512];
        if (v) return m2d_err("%s: axis '%s' is only for target \"moe\"", m2d_grid_where(c, v, at, sizeof at), moe_only[i]);
    }
    return 0;
}

static int64_t max_configs = M2D_GRID_DEFAULT_MAX_CONFIGS;

void m2d_grid_set_max_configs(int64_t n) { max_configs = n > 0 ? n : M2D_GRID_DEFAULT_MAX_CONFIGS; }
int64_t m2d_grid_max_configs(void) { return max_configs; }

/* The grid is counted before it is built: a runaway axis is one line, not gigabytes. */
static int64_t axes_product(const axis *ax, const int *which, int n) {
    int64_t total = 1;
    for (int i = 0; i < n; i++) total = total > INT64_MAX / (ax[which[i]].n + 1) ? INT64_MAX : total * ax[which[i]].n;
    return total;
}

static int check_grid_size(const ctx *c, const axis *ax) {
    int dense = 0, moe = 0;
    for (int t = 0; t < ax[AX_TARGET].n; t++) dense |= !strcmp(ax[AX_TARGET].vals[t], "dense"), moe |= !strcmp(ax[AX_TARGET].vals[t], "moe");
    const int dense_axes[] = {AX_SCORING, AX_GROUPING, AX_SCALING, AX_K, AX_PARAMS};
    const int moe_axes[] = {AX_SCORING, AX_GROUPING, AX_RATIO, AX_TOP_K, AX_PARAMS};
    int64_t nd = dense ? axes_product(ax, dense_axes, 5) : 0, nm = moe ? axes_product(ax, moe_axes, 5) : 0;
    int64_t total = nd > INT64_MAX - nm ? INT64_MAX : nd + nm;
    if (total <= max_configs) return 0;
    char at[512], axes[256];
    if (moe)
        snprintf(axes, sizeof axes, "scoring %d x grouping %d x (scaling %d x K %d | ratio %d x top_k %d) x params %d",
                 ax[AX_SCORING].n, ax[AX_GROUPING].n, ax[AX_SCALING].n, ax[AX_K].n, ax[AX_RATIO].n, ax[AX_TOP_K].n,
                 ax[AX_PARAMS].n);
    else
        snprintf(axes, sizeof axes, "scoring %d x grouping %d x scaling %d x K %d x params %d", ax[AX_SCORING].n,
                 ax[AX_GROUPING].n, ax[AX_SCALING].n, ax[AX_K].n, ax[AX_PARAMS].n);
    return m2d_err("%s: the grid has %lld configurations (%s, before rules), more than the limit of %lld: narrow the "
                   "axes, or raise the limit with --max-configs N", m2d_grid_where(c, NULL, at, sizeof at), (long long)total,
                   axes, (long long)max_configs);
}

int m2d_grid_build(const ctx *c, m2d_experiment *x) {
    const m2d_toml *axes_t = m2d_toml_get(x->table, "axes");
    if (!axes_t || axes_t->type != M2D_TOML_TABLE) return m2d_grid_key_err(c, axes_t, "axes", "a table of axis lists");
    if (m2d_grid_check_keys(c, axes_t, "[axes] (axes are " AXES_LIST ")", AXES, N_AXES)) return -1;
    axis ax[N_AXES] = {0};
    int rc = 0;
    for (int a = 0; a < N_AXES && rc == 0; a++) rc = read_axis(c, axes_t, a, &ax[a]);
    if (rc == 0) rc = check_target_axes(c, axes_t, ax);
    if (rc == 0) rc = check_grid_size(c, ax);
    grid_build gb = {c, x, axes_t, NULL, NULL, 0};
    if (rc == 0) rc = get_rules(c, x->table, "include", &gb.incl);
    if (rc == 0) rc = get_rules(c, x->table, "exclude", &gb.excl);
    for (int s = 0; rc == 0 && s < ax[AX_SCORING].n; s++)
        for (int g = 0; rc == 0 && g < ax[AX_GROUPING].n; g++)
            for (int t = 0; rc == 0 && t < ax[AX_TARGET].n; t++) {
                m2d_grid_config base = {0};
                snprintf(base.scoring, sizeof base.scoring, "%s", ax[AX_SCORING].vals[s]);
                snprintf(base.grouping, sizeof base.grouping, "%s", ax[AX_GROUPING].vals[g]);
                snprintf(base.target, sizeof base.target, "%s", ax[AX_TARGET].vals[t]);
                rc = strcmp(base.target, "moe") ? add_dense(&gb, ax, &base) : add_moe(&gb, ax, &base);
            }
    for (int a = 0; a < N_AXES; a++) axis_free(&ax[a]);
    if (rc == 0 && x->n_configs == 0)
        rc = m2d_err("%s: experiment '%s': the grid is empty (every configuration excluded)", c->file, c->exp);
    return rc;
}
