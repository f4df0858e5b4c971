/* shard_merge — join shard CSVs, checking identity, duplicates and gaps (see shard_merge.h). */
#include "sweep/shard_merge.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "io/results.h"
#include "sweep/grid.h"
#include "sweep/sweep_csv.h"


typedef struct {
    const m2d_shard_merge_opts *o;
    m2d_shard_merge_result *res;
    m2d_results *in;              /* [o->n_inputs] */
    m2d_experiment x;
    int have_exp;
    int id_col;
    char ***rows;                 /* distinct rows, input order (borrowed from in) */
    const char **origin;          /* the input each row came from */
    int n;
    char ***ordered;              /* rows in grid order with an experiment, else rows */
} merge_state;

static void note(m2d_shard_merge_result *res, const char *fmt, ...) {
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int len = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = m2d_malloc((size_t)len + 1);
    vsnprintf(s, (size_t)len + 1, fmt, ap2);
    va_end(ap2);
    res->notes = m2d_realloc(res->notes, (size_t)(res->n_notes + 1) * sizeof *res->notes);
    res->notes[res->n_notes++] = s;
}

static int same_identity(const m2d_results *a, const char *pa, const m2d_results *b, const char *pb) {
    if (a->n_cols != b->n_cols) return m2d_err("%s and %s have different columns", pa, pb);
    for (int c = 0; c < a->n_cols; c++)
        if (strcmp(a->cols[c], b->cols[c]))
            return m2d_err("%s and %s differ in column %d ('%s' vs '%s')", pa, pb, c + 1, a->cols[c], b->cols[c]);
    /* the sweep's identity but the shard (the host and start time differ too); a key added later
     * ("+KEY") is compared where both shards have it */
    for (int i = 0; i < m2d_sweep_n_identity_keys; i++) {
        int later = m2d_sweep_identity_keys[i][0] == '+';
        const char *key = m2d_sweep_identity_keys[i] + later;
        if (!strcmp(key, "shard")) continue;
        const char *x = m2d_results_meta(a, key), *y = m2d_results_meta(b, key);
        if (later && (!x || !y)) continue;
        if ((x || y) && (!x || !y || strcmp(x, y)))
            return m2d_err("%s and %s come from different runs: header '%s' is '%s' vs '%s'", pa, pb, key,
                           x ? x : "(absent)", y ? y : "(absent)");
    }
    return 0;
}

/* N of a header "shard=I/N" (0: "all" or none) */
static int shard_count(const m2d_results *r) {
    const char *v = m2d_results_meta(r, "shard");
    int i, n;
    return v && sscanf(v, "%d/%d", &i, &n) == 2 ? n : 0;
}

/* Shards of one grid: the same grid (the hash of its config ids; files from before it: the same
 * grid_size) and the same shard count N (other --set axes leave every identity key as it was,
 * but not these) */
static int same_grid(const m2d_results *a, const char *pa, const m2d_results *b, const char *pb) {
    static const char *const keys[] = {"grid", "grid_size"};
    for (int k = 0; k < 2; k++) {
        const char *x = m2d_results_meta(a, keys[k]), *y = m2d_results_meta(b, keys[k]);
        if (x && y && strcmp(x, y))
            return m2d_err("%s and %s come from different grids: header '%s' is '%.16s' vs '%.16s'", pa, pb, keys[k], x,
                           y);
    }
    int na = shard_count(a), nb = shard_count(b);
    if (na && nb && na != nb)
        return m2d_err("%s and %s come from different splits: header 'shard' of %d vs %d shards", pa, pb, na, nb);
    return 0;
}

/* Read every input; they must be of one run (and of the experiment, when given). */
static int read_inputs(merge_state *st) {
    const m2d_shard_merge_opts *o = st->o;
    st->in = m2d_calloc((size_t)o->n_inputs, sizeof *st->in);
    for (int i = 0; i < o->n_inputs; i++) {
        if (m2d_results_read_checked(o->inputs[i], &st->in[i])) return -1;
        if (st->in[i].torn_bytes)
            note(st->res, "%s: ignoring a torn last line (was that shard killed? re-run it to finish)", o->inputs[i]);
        if (i && (same_identity(&st->in[0], o->inputs[0], &st->in[i], o->inputs[i]) ||
                  same_grid(&st->in[0], o->inputs[0], &st->in[i], o->inputs[i])))
            return -1;
    }
    const char *exp = m2d_results_meta(&st->in[0], "experiment");
    if (st->have_exp && exp && strcmp(exp, o->experiment))
        return m2d_err("merge: %s is from experiment '%s', not '%s'", o->inputs[0], exp, o->experiment);
    st->id_col = m2d_results_col(&st->in[0], "config_id");
    if (st->id_col < 0) return m2d_err("merge: %s: field 'config_id': column missing", o->inputs[0]);
    return 0;
}

/* The rows of all inputs; a configuration in two rows is an error (the first 5 are noted). */
static int collect_rows(merge_state *st) {
    int total = 0, dups = 0;
    for (int i = 0; i < st->o->n_inputs; i++) total += st->in[i].n_rows;
    st->rows = m2d_calloc((size_t)total + 1, sizeof *st->rows);
    st->origin = m2d_calloc((size_t)total + 1, sizeof *st->origin);
    for (int i = 0; i < st->o->n_inputs; i++)
        for (int r = 0; r < st->in[i].n_rows; r++) {
            const char *id = st->in[i].rows[r][st->id_col];
            int dup = -1;
            for (int j = 0; j < st->n && dup < 0; j++)
                if (strcmp(st->rows[j][st->id_col], id) == 0) dup = j;
            if (dup >= 0) {
                if (dups++ < 5)
                    note(st->res, "duplicate configuration %s in %s and %s", id, st->origin[dup], st->o->inputs[i]);
                continue;
            }
            st->origin[st->n] = st->o->inputs[i];
            st->rows[st->n++] = st->in[i].rows[r];
        }
    if (dups)
        return m2d_err("merge: %d duplicate configuration(s) across the inputs (each shard must run a disjoint slice)",
                       dups);
    return 0;
}

/* With an experiment: the rows in grid order, each missing configuration a gap (the first 10
 * noted); a row of no grid configuration is an error. */
static int order_by_grid(merge_state *st) {
    const m2d_experiment *x = &st->x;
    st->ordered = m2d_calloc((size_t)x->n_configs + 1, sizeof *st->ordered);
    int placed = 0, missing = 0;
    for (int c = 0; c < x->n_configs; c++) {
        const m2d_grid_config *g = &x->configs[c];
        for (int j = 0; j < st->n; j++)
            if (strcmp(st->rows[j][st->id_col], g->id) == 0) st->ordered[placed++] = st->rows[j];
        if (placed == c - missing && missing++ < 10)
            note(st->res, "missing %s (%s %s %s K=%d%s%s)", g->id, g->scoring, g->grouping, g->scaling, g->K,
                 g->params[0] ? " " : "", g->params);
    }
    if (placed != st->n)
        return m2d_err("merge: %d row(s) are not configurations of experiment '%s' (another experiment, or different "
                       "--set values?)", st->n - placed, st->o->experiment);
    st->res->gaps = missing;
    if (missing) note(st->res, "%d of %d configurations missing", missing, x->n_configs);
    return 0;
}

/* Without an experiment: a gap is fewer rows than the header's grid_size. */
static void check_grid_size(merge_state *st) {
    st->ordered = st->rows;
    const char *gs = m2d_results_meta(&st->in[0], "grid_size");
    char *end = NULL;
    long size = gs ? strtol(gs, &end, 10) : 0;
    if (gs && (!*gs || *end || size < 1)) {
        note(st->res, "%s: header 'grid_size' is '%.40s', not a number: gaps cannot be counted", st->o->inputs[0], gs);
        return;
    }
    if (gs && size != st->n) {
        st->res->gaps = atoi(gs) - st->n;
        note(st->res, "%d rows but the grid has %s configurations (pass --experiments and --experiment to list the "
                      "missing ones)", st->n, gs);
    }
}

static void add_meta(m2d_results *m, const char *k, const char *v) {
    m->meta_keys = m2d_realloc(m->meta_keys, (size_t)(m->n_meta + 1) * sizeof *m->meta_keys);
    m->meta_vals = m2d_realloc(m->meta_vals, (size_t)(m->n_meta + 1) * sizeof *m->meta_vals);
    m->meta_keys[m->n_meta] = m2d_strdup(k);
    m->meta_vals[m->n_meta++] = m2d_strdup(v);
}

/* The header of OUT: the inputs' identity, shard=all, and where the rows came from. */
static void merged_header(const merge_state *st, m2d_results *out) {
    const m2d_results *first = &st->in[0];
    for (int i = 0; i < first->n_meta; i++) {
        const char *k = first->meta_keys[i];
        if (strcmp(k, "shard") && strcmp(k, "host") && strcmp(k, "started")) add_meta(out, k, first->meta_vals[i]);
    }
    add_meta(out, "shard", "all");
    char *from = m2d_strdup("");
    for (int i = 0; i < st->o->n_inputs; i++) {
        const char *h = m2d_results_meta(&st->in[i], "host"), *s = m2d_results_meta(&st->in[i], "shard");
        char *next = m2d_strfmt("%s%s%s (shard %s, host %s)", from, i ? "; " : "", st->o->inputs[i], s ? s : "?",
                                h ? h : "?");
        free(from);
        from = next;
    }
    add_meta(out, "merged_from", from);
    free(from);
}

static int write_merged(merge_state *st) {
    if (st->res->gaps && !st->o->allow_gaps)
        return m2d_err("merge: %d configuration(s) missing; %s not written (re-run the missing shards, or "
                       "--allow-gaps)", st->res->gaps, st->o->out);
    m2d_results out = {0};
    merged_header(st, &out);
    out.n_cols = st->in[0].n_cols;
    out.cols = st->in[0].cols; /* borrowed, like the rows */
    out.n_rows = st->n;
    out.rows = st->ordered;
    int rc = m2d_results_write(st->o->out, &out);
    out.cols = NULL;
    out.n_cols = 0;
    out.rows = NULL;
    out.n_rows = 0;
    m2d_results_free(&out);
    return rc;
}

static int check_opts(const m2d_shard_merge_opts *o) {
    if (o->n_inputs < 1) return m2d_err("merge: expected at least one input CSV");
    if (!o->experiments != !o->experiment) return m2d_err("merge: --experiments and --experiment go together");
    for (int i = 0; i < o->n_inputs; i++)
        if (strcmp(o->inputs[i], o->out) == 0 || m2d_same_file(o->inputs[i], o->out))
            return m2d_err("merge: the output %s is also an input (%s)", o->out, o->inputs[i]);
    return 0;
}

static void free_state(merge_state *st) {
    if (st->ordered != st->rows) free(st->ordered);
    free(st->rows);
    free(st->origin);
    for (int i = 0; st->in && i < st->o->n_inputs; i++) m2d_results_free(&st->in[i]);
    free(st->in);
    m2d_experiment_free(&st->x);
}

int m2d_shard_merge(const m2d_shard_merge_opts *o, m2d_shard_merge_result *res) {
    memset(res, 0, sizeof *res);
    merge_state st;
    memset(&st, 0, sizeof st);
    st.o = o;
    st.res = res;
    m2d_lock lock = {.fd = -1};
    int rc = check_opts(o);
    /* OUT may be a results file a sweep is writing: take its lock like a sweep would */
    if (rc == 0) rc = m2d_lock_acquire(&lock, o->out, "merge", "a sweep or a merge writes it: wait, or merge elsewhere", 0);
    if (rc == 0 && o->experiments) {
        rc = m2d_experiment_load(o->experiments, o->experiment, o->sets, o->n_sets, &st.x);
        st.have_exp = rc == 0;
    }
    if (rc == 0) rc = read_inputs(&st);
    if (rc == 0) rc = collect_rows(&st);
    if (rc == 0 && st.have_exp) rc = order_by_grid(&st);
    else if (rc == 0) check_grid_size(&st);
    if (rc == 0) rc = write_merged(&st);
    if (rc == 0) {
        res->rows = st.n;
        res->files = o->n_inputs;
    }
    free_state(&st);
    m2d_lock_release(&lock);
    return rc;
}

void m2d_shard_merge_result_free(m2d_shard_merge_result *res) {
    for (int i = 0; i < res->n_notes; i++) free(res->notes[i]);
    free(res->notes);
    memset(res, 0, sizeof *res);
}
