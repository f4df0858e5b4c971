/* grid_d2d — [experiment.NAME.d2d] into the experiment and its grid (see grid_d2d.h). */
#include "sweep/grid_d2d.h"

#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "io/toml.h"
#include "sweep/sweep_d2d.h"

static const char *const D2D_KEYS[] = {"teacher", "candidates", "data", "seq_len", "samples", "seed"};

/* "FILE:LINE:COL: experiment 'NAME': 'd2d.KEY' must be WANT, not WHAT" (or "missing" when absent) */
static int field_err(const m2d_experiment *x, const char *key, const char *item, const char *want) {
    char dotted[64], at[512];
    snprintf(dotted, sizeof dotted, "d2d.%s", key);
    const m2d_toml *v = m2d_toml_path(x->table, dotted);
    m2d_experiment_where(x, dotted, item, at, sizeof at);
    if (!v) return m2d_err("%s: missing '%s' (%s)", at, dotted, want);
    return m2d_err("%s: '%s' must be %s", at, dotted, want);
}

static int check_keys(const m2d_experiment *x, const m2d_toml *d) {
    for (int i = 0; i < d->n; i++) {
        int ok = 0;
        for (size_t j = 0; j < M2D_ARRAY_LEN(D2D_KEYS); j++) ok |= !strcmp(d->keys[i], D2D_KEYS[j]);
        if (ok) continue;
        char dotted[160], at[512];
        snprintf(dotted, sizeof dotted, "d2d.%s", d->keys[i]);
        return m2d_err("%s: unknown key '%s' in [d2d] (keys: teacher, candidates, data, seq_len, samples, seed)",
                       m2d_experiment_where(x, dotted, NULL, at, sizeof at), d->keys[i]);
    }
    return 0;
}

/* a non-empty string, or the default DFLT when absent (NULL: required) */
static int get_path(const m2d_experiment *x, const m2d_toml *d, const char *key, const char *dflt, char **out) {
    const m2d_toml *v = m2d_toml_get(d, key);
    if (!v && dflt) return *out = m2d_strdup(dflt), 0;
    if (!v || v->type != M2D_TOML_STRING || !v->str[0]) return field_err(x, key, NULL, "a non-empty path");
    *out = m2d_strdup(v->str);
    return 0;
}

static int get_int(const m2d_experiment *x, const m2d_toml *d, const char *key, int64_t dflt, int64_t lo, int64_t hi,
                   int64_t *out) {
    const m2d_toml *v = m2d_toml_get(d, key);
    if (!v) return *out = dflt, 0;
    char want[96];
    snprintf(want, sizeof want, "an integer in [%lld, %lld]", (long long)lo, (long long)hi);
    if (v->type != M2D_TOML_INT || v->i < lo || v->i > hi) return field_err(x, key, NULL, want);
    *out = v->i;
    return 0;
}

static int read_calibration(m2d_experiment *x, const m2d_toml *d) {
    int64_t L, n;
    if (get_path(x, d, "data", x->calib_data, &x->d2d_calib_data) ||
        get_int(x, d, "seq_len", x->calib_seq_len, 2, 1 << 20, &L) ||
        get_int(x, d, "samples", x->calib_samples, 1, 1 << 24, &n) ||
        get_int(x, d, "seed", x->calib_seed, 0, INT64_MAX, &x->d2d_calib_seed))
        return -1;
    x->d2d_calib_seq_len = (int)L, x->d2d_calib_samples = (int)n;
    return 0;
}

/* candidate SPEC as configuration of the grid */
static void append_candidate(m2d_experiment *x, const char *spec) {
    m2d_grid_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.scoring, sizeof c.scoring, "%s", M2D_D2D_SCORING);
    snprintf(c.grouping, sizeof c.grouping, "none");
    snprintf(c.scaling, sizeof c.scaling, "none");
    snprintf(c.target, sizeof c.target, "d2d");
    snprintf(c.K_expr, sizeof c.K_expr, "k");
    c.K = x->k;
    snprintf(c.params, sizeof c.params, "%s%s", M2D_D2D_PARAMS_PREFIX, spec);
    m2d_grid_config_id(&c, c.id);
    c.index = x->n_configs;
    x->configs = m2d_realloc(x->configs, (size_t)(x->n_configs + 1) * sizeof *x->configs);
    x->configs[x->n_configs++] = c;
}

static int read_candidates(m2d_experiment *x, const m2d_toml *d) {
    const m2d_toml *v = m2d_toml_get(d, "candidates");
    if (!v || v->type != M2D_TOML_ARRAY || v->n == 0)
        return field_err(x, "candidates", NULL, "a non-empty array of shape specs (\"L4-H192-F576-A6/2\")");
    for (int i = 0; i < v->n; i++) {
        const m2d_toml *e = v->items[i];
        if (e->type != M2D_TOML_STRING || !e->str[0] || strlen(e->str) > 64)
            return field_err(x, "candidates", NULL, "an array of shape specs (strings of at most 64 characters)");
        char at[512];
        m2d_experiment_where(x, "d2d.candidates", e->str, at, sizeof at);
        if (m2d_d2d_spec_check(e->str)) {
            char *why = m2d_strdup(m2d_errmsg());
            m2d_err("%s: d2d.candidates: '%s': %s", at, e->str, why);
            free(why);
            return -1;
        }
        for (int j = 0; j < i; j++)
            if (!strcmp(v->items[j]->str, e->str))
                return m2d_err("%s: d2d.candidates lists '%s' twice", at, e->str);
        append_candidate(x, e->str);
    }
    return 0;
}

int m2d_grid_d2d_read(m2d_experiment *x) {
    const m2d_toml *d = m2d_toml_get(x->table, "d2d");
    if (!d) return 0;
    char at[512];
    if (d->type != M2D_TOML_TABLE)
        return m2d_err("%s: 'd2d' must be a table ([experiment.%s.d2d])",
                       m2d_experiment_where(x, "d2d", NULL, at, sizeof at), x->name);
    x->has_d2d = 1;
    if (check_keys(x, d) || get_path(x, d, "teacher", NULL, &x->d2d_teacher) || read_calibration(x, d)) return -1;
    return read_candidates(x, d);
}
