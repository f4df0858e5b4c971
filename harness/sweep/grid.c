#include "sweep/grid.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/util.h"
#include "io/results.h"
#include "model/model.h"
#include "sweep/grid_d2d.h"
#include "sweep/sweep_backend.h"

static const char *const AXES[] = {"scoring", "grouping", "scaling", "K", "params", "target", "ratio", "top_k"};
enum { AX_SCORING, AX_GROUPING, AX_SCALING, AX_K, AX_PARAMS, AX_TARGET, AX_RATIO, AX_TOP_K, N_AXES };
#define AXES_LIST "scoring, grouping, scaling, K, params, target, ratio, top_k"

/* ---- typed look-ups with errors naming file:line and the key ---- */

typedef struct {
    const char *file, *exp;
} ctx;

/* "FILE:LINE:COL: experiment 'NAME'", or "--set: experiment 'NAME'" for a value given on the
 * command line (its nodes have line 0: m2d_toml_set) */
static const char *where_at(const char *file, const char *exp, const m2d_toml *v, char *buf, size_t n) {
    if (!v) snprintf(buf, n, "%s: experiment '%s'", file, exp);
    else if (v->line == 0) snprintf(buf, n, "--set: experiment '%s'", exp);
    else snprintf(buf, n, "%s:%d:%d: experiment '%s'", file, v->line, v->col, exp);
    return buf;
}

static const char *where(const ctx *c, const m2d_toml *v, char *buf, size_t n) {
    return where_at(c->file, c->exp, v, buf, n);
}

/* What V is, for "must be X, not Y" (an empty array says so). */
static const char *what_it_is(const m2d_toml *v) {
    if ((v->type == M2D_TOML_ARRAY || v->type == M2D_TOML_TABLE) && v->n == 0)
        return v->type == M2D_TOML_ARRAY ? "an empty array" : "an empty table";
    if (v->type == M2D_TOML_STRING && !v->str[0]) return "an empty string";
    return m2d_toml_type_name(v->type);
}

static int key_err(const ctx *c, const m2d_toml *v, const char *key, const char *want) {
    char at[512];
    if (v) return m2d_err("%s: '%s' must be %s, not %s", where(c, v, at, sizeof at), key, want, what_it_is(v));
    return m2d_err("%s: missing '%s' (%s)", where(c, NULL, at, sizeof at), key, want);
}

static int get_str(const ctx *c, const m2d_toml *t, const char *key, const char *dflt, char **out) {
    const m2d_toml *v = m2d_toml_path(t, key);
    if (!v) {
        if (!dflt) return key_err(c, NULL, key, "a string");
        *out = m2d_strdup(dflt);
        return 0;
    }
    if (v->type != M2D_TOML_STRING) return key_err(c, v, key, "a string");
    *out = m2d_strdup(v->str);
    return 0;
}

/* A path: a non-empty string (an empty one would become "/config.json" and the like). */
static int get_path(const ctx *c, const m2d_toml *t, const char *key, const char *dflt, char **out) {
    if (get_str(c, t, key, dflt, out)) return -1;
    if (**out) return 0;
    free(*out);
    *out = NULL;
    return key_err(c, m2d_toml_path(t, key), key, "a non-empty path");
}

static int get_int(const ctx *c, const m2d_toml *t, const char *key, int64_t dflt, int64_t lo, int64_t hi,
                   int64_t *out) {
    const m2d_toml *v = m2d_toml_path(t, key);
    if (!v) {
        *out = dflt;
        return 0;
    }
    if (v->type != M2D_TOML_INT) return key_err(c, v, key, "an integer");
    char at[512];
    if (v->i < lo || v->i > hi)
        return m2d_err("%s: '%s' = %lld is outside [%lld, %lld]", where(c, v, at, sizeof at), key, (long long)v->i,
                       (long long)lo, (long long)hi);
    *out = v->i;
    return 0;
}

static int get_int32(const ctx *c, const m2d_toml *t, const char *key, int dflt, int lo, int hi, int *out) {
    int64_t v = dflt;
    if (get_int(c, t, key, dflt, lo, hi, &v)) return -1;
    *out = (int)v;
    return 0;
}

/* Unknown keys are errors: a typo must not silently fall back to a default. */
static int check_keys(const ctx *c, const m2d_toml *t, const char *where, const char *const *allowed, int n) {
    if (!t) return 0;
    for (int i = 0; i < t->n; i++) {
        int ok = 0;
        for (int j = 0; j < n; j++) ok |= strcmp(t->keys[i], allowed[j]) == 0;
        char at[512];
        if (!ok)
            return m2d_err("%s: unknown key '%s' in %s", where_at(c->file, c->exp, t->items[i], at, sizeof at),
                           t->keys[i], where);
    }
    return 0;
}

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
        if (!v->str[0] && strcmp(key, "params") != 0) return key_err(c, v, key, "a non-empty string");
        if (strlen(v->str) >= n) return key_err(c, v, key, "a shorter string");
        snprintf(buf, n, "%s", v->str);
    } else if (v->type == M2D_TOML_INT) {
        snprintf(buf, n, "%lld", (long long)v->i);
    } else if (v->type == M2D_TOML_FLOAT && strcmp(key, "ratio") == 0) {
        snprintf(buf, n, "%.15g", v->f);
    } else {
        return key_err(c, v, key, "a string or an integer");
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
    if (!v) return key_err(c, NULL, key, "an axis list in [axes]");
    if (v->type != M2D_TOML_ARRAY || v->n == 0) return key_err(c, v, key, "a non-empty array");
    a->vals = m2d_calloc((size_t)v->n, sizeof *a->vals);
    for (int i = 0; i < v->n; i++) {
        char buf[128], at[512];
        size_t cap = which == AX_PARAMS ? 128 : which == AX_K ? 16 : which == AX_TARGET ? 8 : which == AX_RATIO ? 9 : 32;
        if (scalar_text(c, v->items[i], key, buf, cap)) return -1; /* cap: the m2d_grid_config field */
        double r;
        if (which == AX_TARGET && strcmp(buf, "dense") && strcmp(buf, "moe"))
            return m2d_err("%s: axis 'target': '%s' is not dense or moe", where(c, v->items[i], at, sizeof at), buf);
        if (which == AX_RATIO && parse_ratio(buf, &r))
            return m2d_err("%s: axis 'ratio': '%s' is not a fraction of experts removed in [0, 1)",
                           where(c, v->items[i], at, sizeof at), buf);
        char *end;
        long tk = which == AX_TOP_K ? strtol(buf, &end, 10) : 1;
        if (which == AX_TOP_K && (*end || tk < 1 || v->items[i]->type != M2D_TOML_INT))
            return m2d_err("%s: axis 'top_k': '%s' is not a number of experts >= 1", where(c, v->items[i], at, sizeof at),
                           buf);
        for (int j = 0; j < a->n; j++)
            if (strcmp(a->vals[j], buf) == 0)
                return m2d_err("%s: axis '%s' lists '%s' twice", where(c, v->items[i], at, sizeof at), key, buf);
        /* plugin names reach file names, CSV cells and plot titles: plugin-style names only */
        if (which <= AX_SCALING && !m2d_results_is_name(buf))
            return m2d_err("%s: axis '%s': '%s' is not a plugin name ([a-z0-9][a-z0-9_.+-]*, < 32 characters)",
                           where(c, v->items[i], at, sizeof at), key, buf);
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
            return m2d_err("%s: rule key '%s' is not an axis (" AXES_LIST ")", where(c, rule->items[i], at, sizeof at),
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
                    return m2d_err("%s: rule: %s", where(c, item, at, sizeof at), msg);
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
    if (v->type != M2D_TOML_ARRAY) return key_err(c, v, key, "an array of tables ([[experiment.NAME." "rules]])");
    for (int i = 0; i < v->n; i++)
        if (v->items[i]->type != M2D_TOML_TABLE) return key_err(c, v->items[i], key, "an array of tables");
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
    return m2d_err("%s: axes.K: %s (teacher k = %d, E = %d)", where(gb->c, kv, at, sizeof at), msg, gb->x->k, gb->x->E);
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
    if (dense && !ax[AX_SCALING].n) return key_err(c, NULL, "scaling", "an axis list in [axes] (target dense)");
    if (dense && !ax[AX_K].n) return key_err(c, NULL, "K", "an axis list in [axes] (target dense)");
    if (moe && !ax[AX_RATIO].n) return key_err(c, NULL, "ratio", "an axis list in [axes] (target moe)");
    const char *moe_only[2] = {"ratio", "top_k"};
    for (int i = 0; i < 2 && !moe; i++) {
        const m2d_toml *v = m2d_toml_get(axes_t, moe_only[i]);
        char at[512];
        if (v) return m2d_err("%s: axis '%s' is only for target \"moe\"", where(c, v, at, sizeof at), moe_only[i]);
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
                   "axes, or raise the limit with --max-configs N", where(c, NULL, at, sizeof at), (long long)total,
                   axes, (long long)max_configs);
}

static int build_grid(const ctx *c, m2d_experiment *x) {
    const m2d_toml *axes_t = m2d_toml_get(x->table, "axes");
    if (!axes_t || axes_t->type != M2D_TOML_TABLE) return key_err(c, axes_t, "axes", "a table of axis lists");
    if (check_keys(c, axes_t, "[axes] (axes are " AXES_LIST ")", AXES, N_AXES)) return -1;
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

static int read_mc(const ctx *c, m2d_experiment *x) {
    const m2d_toml *mc = m2d_toml_get(x->table, "mc");
    x->mc_configs = m2d_strdup("none");
    if (!mc) return 0;
    if (mc->type != M2D_TOML_TABLE) return key_err(c, mc, "mc", "a table");
    static const char *const keys[] = {"tasks", "shots", "limit", "configs", "data_dir"};
    if (check_keys(c, mc, "[mc]", keys, 5)) return -1;
    if (get_str(c, mc, "data_dir", "data", &x->mc_data_dir)) return -1;
    const m2d_toml *tasks = m2d_toml_get(mc, "tasks");
    if (!tasks || tasks->type != M2D_TOML_ARRAY) return key_err(c, tasks, "mc.tasks", "an array of task names");
    const m2d_toml *shots = m2d_toml_get(mc, "shots");
    if (shots && shots->type != M2D_TOML_TABLE) return key_err(c, shots, "mc.shots", "a table task = shots");
    x->mc_tasks = m2d_calloc((size_t)tasks->n, sizeof *x->mc_tasks);
    x->mc_shots = m2d_calloc((size_t)tasks->n, sizeof *x->mc_shots);
    for (int i = 0; i < tasks->n; i++) {
        if (tasks->items[i]->type != M2D_TOML_STRING) return key_err(c, tasks->items[i], "mc.tasks", "strings");
        x->mc_tasks[x->n_mc] = m2d_strdup(tasks->items[i]->str);
        const m2d_toml *s = m2d_toml_get(shots, tasks->items[i]->str);
        if (s && (s->type != M2D_TOML_INT || s->i < 0 || s->i > 100))
            return key_err(c, s, "mc.shots", "an integer in [0, 100]");
        x->mc_shots[x->n_mc++] = s ? (int)s->i : 0;
    }
    if (get_int32(c, mc, "limit", 0, 0, 1 << 30, &x->mc_limit)) return -1;
    free(x->mc_configs);
    x->mc_configs = NULL;
    if (get_str(c, mc, "configs", "best-per-pair", &x->mc_configs)) return -1;
    if (strcmp(x->mc_configs, "none") && strcmp(x->mc_configs, "all") && strcmp(x->mc_configs, "best-per-pair"))
        return key_err(c, m2d_toml_get(mc, "configs"), "mc.configs", "\"none\", \"all\" or \"best-per-pair\"");
    return 0;
}

/* A number (integer or float) >= 0 and finite. */
static int get_double(const ctx *c, const m2d_toml *t, const char *key, double *out) {
    const m2d_toml *v = m2d_toml_path(t, key);
    if (!v) return 0;
    if (v->type == M2D_TOML_INT) *out = (double)v->i;
    else if (v->type == M2D_TOML_FLOAT) *out = v->f;
    else return key_err(c, v, key, "a number");
    if (!(*out >= 0) || *out > 1e30) return key_err(c, v, key, "a finite number >= 0");
    return 0;
}

static int get_bool(const ctx *c, const m2d_toml *t, const char *key, bool *out) {
    const m2d_toml *v = m2d_toml_path(t, key);
    if (!v) return 0;
    if (v->type != M2D_TOML_BOOL) return key_err(c, v, key, "true or false");
    *out = v->i != 0;
    return 0;
}

/* distill.configs: "best-per-pair" | "all" | an array of config ids (checked against the grid later) */
static int read_distill_configs(const ctx *c, const m2d_toml *d, m2d_experiment *x) {
    const m2d_toml *v = m2d_toml_get(d, "configs");
    if (v && v->type == M2D_TOML_ARRAY) {
        if (v->n == 0) return key_err(c, v, "distill.configs", "a non-empty array of config ids");
        x->distill_ids = m2d_calloc((size_t)v->n, sizeof *x->distill_ids);
        for (int i = 0; i < v->n; i++) {
            if (v->items[i]->type != M2D_TOML_STRING) return key_err(c, v->items[i], "distill.configs", "strings");
            x->distill_ids[x->n_distill_ids++] = m2d_strdup(v->items[i]->str);
        }
        x->distill_configs = m2d_strdup("list");
        return 0;
    }
    if (get_str(c, x->table, "distill.configs", "best-per-pair", &x->distill_configs)) return -1;
    if (strcmp(x->distill_configs, "all") && strcmp(x->distill_configs, "best-per-pair"))
        return key_err(c, v, "distill.configs", "\"all\", \"best-per-pair\" or an array of config ids");
    return 0;
}

/* keys looked up from the experiment table T0 as "distill.KEY", so errors name them that way */
static int read_distill_numbers(const ctx *c, const m2d_toml *t0, m2d_distill_opts *o) {
    m2d_trainer_opts *t = &o->train;
    int64_t tokens = 0, seed = 0;
    if (get_int(c, t0, "distill.tokens", 0, 0, (int64_t)1 << 50, &tokens) ||
        get_int32(c, t0, "distill.steps", 0, 0, 100000000, &t->optim.steps) ||
        get_int32(c, t0, "distill.seq_len", t->seq_len, 2, 1 << 20, &t->seq_len) ||
        get_int32(c, t0, "distill.batch", t->batch, 1, 1 << 20, &t->batch) ||
        get_int32(c, t0, "distill.micro_batch", 0, 0, 1 << 20, &t->micro_batch) ||
        get_int32(c, t0, "distill.warmup", t->optim.warmup, 0, 100000000, &t->optim.warmup) ||
        get_int32(c, t0, "distill.eval_every", 0, 0, 100000000, &o->eval_every) ||
        get_int32(c, t0, "distill.save_every", 0, 0, 100000000, &o->save_every) ||
        get_int(c, t0, "distill.seed", 0, 0, INT64_MAX, &seed) || get_double(c, t0, "distill.lr", &t->optim.lr) ||
        get_double(c, t0, "distill.min_lr", &t->optim.min_lr) ||
        get_double(c, t0, "distill.weight_decay", &t->optim.weight_decay) ||
        get_double(c, t0, "distill.clip", &t->optim.clip) || get_double(c, t0, "distill.mse_weight", &t->mse_weight) ||
        get_bool(c, t0, "distill.recompute", &t->recompute) || get_bool(c, t0, "distill.fp32", &o->fp32))
        return -1;
    o->tokens = tokens;
    o->seed = (uint64_t)seed;
    if ((tokens > 0) == (t->optim.steps > 0))
        return m2d_err("%s: experiment '%s': [distill] needs exactly one of 'tokens' and 'steps'", c->file, c->exp);
    if (t->optim.lr <= 0) return key_err(c, m2d_toml_path(t0, "distill.lr"), "distill.lr", "a positive number");
    return 0;
}

/* The validation file beside the PPL data: PPL's file name with its "test" read as "valid"
 * (WikiText-2: wiki.test.raw -> wiki.valid.raw); NULL when the name has no "test". */
static char *valid_beside(const char *ppl) {
    const char *base = strrchr(ppl, '/'), *t = strstr(base ? base + 1 : ppl, "test");
    return t ? m2d_strfmt("%.*svalid%s", (int)(t - ppl), ppl, t + 4) : NULL;
}

/* A and B name one file (the same path, or the same inode through links) */
static int same_file(const char *a, const char *b) {
    struct stat sa, sb;
    if (!strcmp(a, b)) return 1;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* distill.val_data: the held-out text the validation curve (Figure 5; eval_every > 0) is measured
 * on; default the validation file beside ppl.data (none without a curve when there is none).
 * Refused when it is ppl.data, the split the tables report. */
static int read_distill_val(const ctx *c, m2d_experiment *x) {
    const m2d_toml *v = m2d_toml_path(x->table, "distill.val_data");
    char *dflt = v ? NULL : valid_beside(x->ppl_data), at[512];
    if (!v && !dflt && x->distill.eval_every == 0) return 0;
    if (!v && !dflt)
        return m2d_err("%s: missing 'distill.val_data' (ppl.data '%s' has no \"test\" in its name to find the "
                       "validation split beside it)", where(c, NULL, at, sizeof at), x->ppl_data);
    int rc = get_path(c, x->table, "distill.val_data", dflt, &x->distill_val_data);
    free(dflt);
    if (rc == 0 && same_file(x->distill_val_data, x->ppl_data))
        rc = m2d_err("%s: 'distill.val_data': '%s' is ppl.data, the split the tables report; validate on a "
                     "held-out split (e.g. WikiText-2 validation)", where(c, v, at, sizeof at), x->distill_val_data);
    return rc;
}

/* one value of the distill.loss axis (V: a string) into *OUT */
static int read_loss_value(const ctx *c, const m2d_toml *v, void *out) {
    if (v->type != M2D_TOML_STRING || m2d_loss_parse(v->str, out))
        return key_err(c, v, "distill.loss", "\"fkl\", \"rkl\" or \"fkl+mse\" (or a list of them)");
    return 0;
}

/* one value of the distill.teacher_topk axis (V: an integer >= 0; 0: the teacher's own routing) */
static int read_topk_value(const ctx *c, const m2d_toml *v, void *out) {
    if (v->type != M2D_TOML_INT || v->i < 0 || v->i > (1 << 20))
        return key_err(c, v, "distill.teacher_topk", "an integer in [0, 1048576] (or a list of them)");
    *(int *)out = (int)v->i;
    return 0;
}

/* distill.KEY: a scalar or a non-empty list of distinct values, read one by one with READ into
 * VALS (SIZE bytes each; DFLT when absent); returns the count, -1 on error. *LISTED: 1 for a list. */
static int read_axis_values(const ctx *c, const m2d_toml *d, const char *key, const void *dflt, size_t size,
                            int (*read)(const ctx *, const m2d_toml *, void *), void **vals, int *listed) {
    const m2d_toml *v = m2d_toml_get(d, key);
    char dotted[64];
    snprintf(dotted, sizeof dotted, "distill.%s", key);
    int n = !v ? 1 : v->type == M2D_TOML_ARRAY ? v->n : 1;
    *listed |= v && v->type == M2D_TOML_ARRAY;
    if (n == 0) return key_err(c, v, dotted, "a value or a non-empty list");
    unsigned char *out = m2d_calloc((size_t)n, size);
    *vals = out;
    for (int i = 0; i < n; i++) {
        unsigned char *slot = out + (size_t)i * size;
        if (!v) memcpy(slot, dflt, size);
        else if (read(c, v->type == M2D_TOML_ARRAY ? v->items[i] : v, slot)) return -1;
        for (int j = 0; j < i; j++)
            if (!memcmp(out + (size_t)j * size, slot, size))
                return key_err(c, v->items[i], dotted, "a list of distinct values");
    }
    return n;
}

/* distill.loss and distill.teacher_topk: the ablation axes (Tables 4, 5), scalars or lists; the
 * first values are the stage's defaults (x->distill.train) */
static int read_distill_axes(const ctx *c, const m2d_toml *d, m2d_experiment *x) {
    const m2d_loss_kind fkl = M2D_LOSS_FKL;
    const int own = 0;
    void *losses = NULL, *topks = NULL;
    x->n_distill_losses = read_axis_values(c, d, "loss", &fkl, sizeof fkl, read_loss_value, &losses, &x->distill_ablation);
    x->distill_losses = losses;
    if (x->n_distill_losses < 0) return -1;
    x->n_distill_topks = read_axis_values(c, d, "teacher_topk", &own, sizeof own, read_topk_value, &topks,
                                          &x->distill_ablation);
    x->distill_topks = topks;
    if (x->n_distill_topks < 0) return -1;
    x->distill.train.loss = x->distill_losses[0];
    x->distill.train.teacher_topk = x->distill_topks[0];
    return 0;
}

/* [distill]: the stage that distills the chosen students (sweep_distill.h); absent: no stage */
static int read_distill(const ctx *c, m2d_experiment *x) {
    const m2d_toml *d = m2d_toml_get(x->table, "distill");
    if (!d) return 0;
    if (d->type != M2D_TOML_TABLE) return key_err(c, d, "distill", "a table");
    static const char *const keys[] = {"configs", "data", "tokens", "steps", "seq_len", "batch", "micro_batch",
                                       "recompute", "lr", "min_lr", "warmup", "weight_decay", "clip", "loss",
                                       "mse_weight", "teacher_topk", "order", "seed", "eval_every", "save_every",
                                       "fp32", "val_data", "mse_norm"};
    if (check_keys(c, d, "[distill]", keys, M2D_ARRAY_LEN(keys))) return -1;
    x->has_distill = 1;
    m2d_distill_defaults(&x->distill);
    x->distill.quiet = true;
    char *order = NULL, *norm = NULL;
    int rc = read_distill_configs(c, d, x);
    if (rc == 0) rc = get_str(c, x->table, "distill.data", NULL, &x->distill_data);
    if (rc == 0) rc = read_distill_numbers(c, x->table, &x->distill);
    if (rc == 0) rc = read_distill_val(c, x);
    if (rc == 0) rc = read_distill_axes(c, d, x);
    if (rc == 0) rc = get_str(c, x->table, "distill.order", "shuffle", &order);
    if (rc == 0 && m2d_order_parse(order, &x->distill.order))
        rc = key_err(c, m2d_toml_get(d, "order"), "distill.order", "\"shuffle\" or \"sequential\"");
    if (rc == 0) rc = get_str(c, x->table, "distill.mse_norm", "minitron", &norm);
    if (rc == 0 && m2d_mse_norm_parse(norm, &x->distill.train.mse_norm))
        rc = key_err(c, m2d_toml_get(d, "mse_norm"), "distill.mse_norm", "\"minitron\" or \"sum\"");
    free(order), free(norm);
    return rc;
}

/* Every id of distill.configs must be a configuration of the grid. */
static int check_distill_ids(const ctx *c, const m2d_experiment *x) {
    for (int i = 0; i < x->n_distill_ids; i++) {
        int found = 0;
        for (int j = 0; j < x->n_configs && !found; j++) found = !strcmp(x->configs[j].id, x->distill_ids[i]);
        if (!found)
            return m2d_err("%s: experiment '%s': distill.configs: '%s' is not a config id of the grid (see "
                           "'moe2dense sweep --dry-run')", c->file, c->exp, x->distill_ids[i]);
    }
    return 0;
}

/* The backend must be registered: the product has "pipeline"; test builds add "fake". */
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
    if (get_int32(c, x->table, "teacher.vocab_size", 0, 1, 1 << 24, &x->t_vocab) ||
        get_int32(c, x->table, "teacher.hidden_size", 0, 1, 1 << 20, &x->t_hidden) ||
        get_int32(c, x->table, "teacher.num_hidden_layers", 0, 1, 4096, &x->t_layers) ||
        get_int32(c, x->table, "teacher.num_attention_heads", 0, 1, 4096, &x->t_heads) ||
        get_int32(c, x->table, "teacher.num_key_value_heads", 0, 1, 4096, &x->t_kv_heads) ||
        get_int32(c, x->table, "teacher.head_dim", 0, 1, 4096, &x->t_head_dim) ||
        get_int32(c, x->table, "teacher.intermediate_size", 0, 1, 1 << 24, &x->t_intermediate) ||
        get_int32(c, x->table, "teacher.max_position_embeddings", 0, 1, 1 << 24, &x->t_max_pos))
        return -1;
    if (x->t_heads && x->t_kv_heads && x->t_heads % x->t_kv_heads)
        return key_err(c, m2d_toml_path(x->table, "teacher.num_key_value_heads"), "teacher.num_key_value_heads",
                       "a divisor of teacher.num_attention_heads");
    return 0;
}

static int read_experiment(const ctx *c, m2d_experiment *x) {
    static const char *const top[] = {"description", "model", "backend", "out", "cache_dir", "teacher",
                                      "calibration", "ppl", "mc", "distill", "axes", "include", "exclude", "d2d"};
    if (check_keys(c, x->table, "the experiment", top, M2D_ARRAY_LEN(top))) return -1;
    static const char *const calib_keys[] = {"data", "seq_len", "samples", "seed", "windows"};
    static const char *const ppl_keys[] = {"protocol", "data", "seq_len", "max_windows"};
    static const char *const teacher_keys[] = {"experts", "top_k", "moe_intermediate_size", "vocab_size", "hidden_size",
                                               "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                               "head_dim", "intermediate_size", "max_position_embeddings"};
    if (check_keys(c, m2d_toml_get(x->table, "calibration"), "[calibration]", calib_keys, 5) ||
        check_keys(c, m2d_toml_get(x->table, "ppl"), "[ppl]", ppl_keys, 4) ||
        check_keys(c, m2d_toml_get(x->table, "teacher"), "[teacher]", teacher_keys, M2D_ARRAY_LEN(teacher_keys)) ||
        read_teacher_dims(c, x))
        return -1;
    if (get_str(c, x->table, "description", "", &x->description) || get_path(c, x->table, "model", NULL, &x->model) ||
        get_str(c, x->table, "backend", "pipeline", &x->backend))
        return -1;
    char *dflt_out = m2d_strfmt("results/%s.csv", x->name);
    int rc = get_path(c, x->table, "out", dflt_out, &x->out);
    free(dflt_out);
    if (rc || get_path(c, x->table, "cache_dir", "results/cache", &x->cache_dir)) return -1;
    if (check_backend(c, x)) return -1;
    if (get_path(c, x->table, "calibration.data", NULL, &x->calib_data) ||
        get_int32(c, x->table, "calibration.seq_len", 2048, 2, 1 << 20, &x->calib_seq_len) ||
        get_int32(c, x->table, "calibration.samples", 512, 1, 1 << 24, &x->calib_samples) ||
        get_int(c, x->table, "calibration.seed", -1, 0, INT64_MAX, &x->calib_seed) ||
        get_str(c, x->table, "calibration.windows", "fixed", &x->calib_windows))
        return -1;
    if (strcmp(x->calib_windows, "fixed") && strcmp(x->calib_windows, "documents"))
        return key_err(c, m2d_toml_path(x->table, "calibration.windows"), "calibration.windows",
                       "\"fixed\" or \"documents\"");
    if (get_str(c, x->table, "ppl.protocol", "gptq", &x->ppl_protocol) ||
        get_path(c, x->table, "ppl.data", NULL, &x->ppl_data) ||
        get_int32(c, x->table, "ppl.seq_len", 2048, 2, 1 << 20, &x->ppl_seq_len) ||
        get_int32(c, x->table, "ppl.max_windows", 0, 0, 1 << 30, &x->ppl_max_windows))
        return -1;
    if (strcmp(x->ppl_protocol, "gptq") && strcmp(x->ppl_protocol, "lm-eval"))
        return key_err(c, m2d_toml_path(x->table, "ppl.protocol"), "ppl.protocol", "\"gptq\" or \"lm-eval\"");
    if (read_mc(c, x) || read_distill(c, x)) return -1;
    /* teacher shape: config.json when the model is here, else the [teacher] hints (dry runs) */
    if (read_teacher_shape(x->model, &x->E, &x->k, &x->d_e) == 0) {
        x->shape_from_config = 1;
    } else {
        char why[512];
        snprintf(why, sizeof why, "%s", m2d_errmsg());
        int E = 0, k = 0, de = 0;
        if (get_int32(c, x->table, "teacher.experts", 0, 0, 1 << 20, &E) ||
            get_int32(c, x->table, "teacher.top_k", 0, 0, 1 << 20, &k) ||
            get_int32(c, x->table, "teacher.moe_intermediate_size", 0, 0, 1 << 30, &de))
            return -1;
        if (E < 1 || k < 1 || k > E)
            return m2d_err("%s: experiment '%s': teacher shape unknown: %s (set --set model=DIR, or give "
                           "[teacher] experts and top_k)", c->file, c->exp, why);
        x->E = E;
        x->k = k;
        x->d_e = de;
    }
    if (build_grid(c, x) || m2d_grid_d2d_read(x)) return -1;
    return check_distill_ids(c, x);
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
    return where_at(x->file, x->name, v, buf, n);
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

int m2d_grid_shard(const m2d_experiment *x, int i, int n, int **idx) {
    affinity *groups = m2d_malloc((size_t)(x->n_configs + 1) * sizeof *groups);
    int *group_of = m2d_malloc((size_t)(x->n_configs + 1) * sizeof *group_of);
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
