/* grid_read — experiments.toml's typed look-ups: strings, paths, integers, numbers, booleans,
 * allowed keys; errors name FILE:LINE:COL and the key (grid_read.h). */
#include "sweep/grid_read.h"

#include <stdlib.h>
#include <string.h>

#include "base/util.h"

/* "FILE:LINE:COL: experiment 'NAME'", or "--set: experiment 'NAME'" for a value given on the
 * command line (its nodes have line 0: m2d_toml_set) */
const char *m2d_grid_where_at(const char *file, const char *exp, const m2d_toml *v, char *buf, size_t n) {
    if (!v) snprintf(buf, n, "%s: experiment '%s'", file, exp);
    else if (v->line == 0) snprintf(buf, n, "--set: experiment '%s'", exp);
    else snprintf(buf, n, "%s:%d:%d: experiment '%s'", file, v->line, v->col, exp);
    return buf;
}

const char *m2d_grid_where(const ctx *c, const m2d_toml *v, char *buf, size_t n) {
    return m2d_grid_where_at(c->file, c->exp, v, buf, n);
}

/* What V is, for "must be X, not Y" (an empty array says so). */
const char *m2d_grid_what_it_is(const m2d_toml *v) {
    if ((v->type == M2D_TOML_ARRAY || v->type == M2D_TOML_TABLE) && v->n == 0)
        return v->type == M2D_TOML_ARRAY ? "an empty array" : "an empty table";
    if (v->type == M2D_TOML_STRING && !v->str[0]) return "an empty string";
    return m2d_toml_type_name(v->type);
}

int m2d_grid_key_err(const ctx *c, const m2d_toml *v, const char *key, const char *want) {
    char at[512];
    if (v) return m2d_err("%s: '%s' must be %s, not %s", m2d_grid_where(c, v, at, sizeof at), key, want, m2d_grid_what_it_is(v));
    return m2d_err("%s: missing '%s' (%s)", m2d_grid_where(c, NULL, at, sizeof at), key, want);
}

/* KEY, missing under T: when a table on its path is something else (--set ppl=5), that value is
 * what is wrong, named where it was given (the file's line, or --set) */
static int missing_err(const ctx *c, const m2d_toml *t, const char *key, const char *want) {
    char *prefix = m2d_strdup(key);
    int rc = 1;
    for (char *dot = strchr(prefix, '.'); dot && rc == 1; dot = strchr(dot + 1, '.')) {
        *dot = 0;
        const m2d_toml *v = m2d_toml_path(t, prefix);
        if (v && v->type != M2D_TOML_TABLE) rc = m2d_grid_key_err(c, v, prefix, "a table");
        *dot = '.';
    }
    free(prefix);
    return rc == 1 ? m2d_grid_key_err(c, NULL, key, want) : rc;
}

int m2d_grid_get_str(const ctx *c, const m2d_toml *t, const char *key, const char *dflt, char **out) {
    const m2d_toml *v = m2d_toml_path(t, key);
    if (!v) {
        if (!dflt) return missing_err(c, t, key, "a string");
        *out = m2d_strdup(dflt);
        return 0;
    }
    if (v->type != M2D_TOML_STRING) return m2d_grid_key_err(c, v, key, "a string");
    *out = m2d_strdup(v->str);
    return 0;
}

/* A path: a non-empty string (an empty one would become "/config.json" and the like). */
int m2d_grid_get_path(const ctx *c, const m2d_toml *t, const char *key, const char *dflt, char **out) {
    if (m2d_grid_get_str(c, t, key, dflt, out)) return -1;
    if (**out) return 0;
    free(*out);
    *out = NULL;
    return m2d_grid_key_err(c, m2d_toml_path(t, key), key, "a non-empty path");
}

int m2d_grid_get_int(const ctx *c, const m2d_toml *t, const char *key, int64_t dflt, int64_t lo, int64_t hi,
                   int64_t *out) {
    const m2d_toml *v = m2d_toml_path(t, key);
    if (!v) {
        *out = dflt;
        return 0;
    }
    if (v->type != M2D_TOML_INT) return m2d_grid_key_err(c, v, key, "an integer");
    char at[512];
    if (v->i < lo || v->i > hi)
        return m2d_err("%s: '%s' = %lld is outside [%lld, %lld]", m2d_grid_where(c, v, at, sizeof at), key, (long long)v->i,
                       (long long)lo, (long long)hi);
    *out = v->i;
    return 0;
}

int m2d_grid_get_int32(const ctx *c, const m2d_toml *t, const char *key, int dflt, int lo, int hi, int *out) {
    int64_t v = dflt;
    if (m2d_grid_get_int(c, t, key, dflt, lo, hi, &v)) return -1;
    *out = (int)v;
    return 0;
}

/* Unknown keys are errors: a typo must not silently fall back to a default. */
int m2d_grid_check_keys(const ctx *c, const m2d_toml *t, const char *where, const char *const *allowed, int n) {
    if (!t) return 0;
    for (int i = 0; i < t->n; i++) {
        int ok = 0;
        for (int j = 0; j < n; j++) ok |= strcmp(t->keys[i], allowed[j]) == 0;
        char at[512];
        if (!ok)
            return m2d_err("%s: unknown key '%s' in %s", m2d_grid_where_at(c->file, c->exp, t->items[i], at, sizeof at),
                           t->keys[i], where);
    }
    return 0;
}

/* A number (integer or float) >= 0 and finite. */
int m2d_grid_get_double(const ctx *c, const m2d_toml *t, const char *key, double *out) {
    const m2d_toml *v = m2d_toml_path(t, key);
    if (!v) return 0;
    if (v->type == M2D_TOML_INT) *out = (double)v->i;
    else if (v->type == M2D_TOML_FLOAT) *out = v->f;
    else return m2d_grid_key_err(c, v, key, "a number");
    if (!(*out >= 0) || *out > 1e30) return m2d_grid_key_err(c, v, key, "a finite number >= 0");
    return 0;
}

int m2d_grid_get_bool(const ctx *c, const m2d_toml *t, const char *key, bool *out) {
    const m2d_toml *v = m2d_toml_path(t, key);
    if (!v) return 0;
    if (v->type != M2D_TOML_BOOL) return m2d_grid_key_err(c, v, key, "true or false");
    *out = v->i != 0;
    return 0;
}
