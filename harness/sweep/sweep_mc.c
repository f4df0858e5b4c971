/* sweep_mc — multiple-choice stage: select, evaluate into OUT.mc.csv, fill OUT (see sweep_mc.h). */
#include "sweep/sweep_mc.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "sweep/report.h"
#include "sweep/report_scoring_k.h"
#include "sweep/sweep_d2d.h"

int m2d_sweep_find_config(const m2d_experiment *x, const char *id) {
    for (int i = 0; i < x->n_configs; i++)
        if (strcmp(x->configs[i].id, id) == 0) return i;
    return -1;
}

int m2d_sweep_select_rows(const m2d_results *r, const char *mode, char *const *ids, int n_ids, int **rows) {
    if (strcmp(mode, "best-per-pair") == 0) {
        int n = m2d_report_best_per_pair(r, rows);
        return n < 0 ? n : m2d_d2d_keep_best(r, *rows, n);
    }
    if (strcmp(mode, "best-per-scoring-K") == 0) return m2d_report_best_per_scoring_K(r, rows); /* no D2D rows */
    *rows = m2d_malloc((size_t)(r->n_rows + 1) * sizeof **rows);
    int n = 0;
    for (int i = 0; i < r->n_rows; i++) {
        if (strcmp(m2d_results_get(r, i, "status"), "ok")) continue;
        const char *id = m2d_results_get(r, i, "config_id");
        int listed = 0;
        for (int j = 0; j < n_ids && !listed; j++) listed = !strcmp(ids[j], id);
        if (strcmp(mode, "list") == 0 ? listed : !m2d_results_get(r, i, "dedup_of")[0]) (*rows)[n++] = i;
    }
    /* of the D2D candidates only the one the paper's rule selects (a listed id is taken as listed) */
    return strcmp(mode, "list") == 0 ? n : m2d_d2d_keep_best(r, *rows, n);
}

typedef struct {
    const m2d_experiment *x;
    int id_col;
} grid_rows;

static int in_grid(const m2d_results *r, int row, void *ctx) {
    const grid_rows *g = ctx;
    return g->id_col < 0 || m2d_sweep_find_config(g->x, r->rows[row][g->id_col]) >= 0;
}

int m2d_sweep_keep_grid_rows(const m2d_experiment *x, m2d_results *r, const char *path) {
    grid_rows g = {x, m2d_results_col(r, "config_id")};
    int gone = m2d_results_keep_rows(r, in_grid, &g);
    if (gone)
        fprintf(stderr, "moe2dense sweep: %s: %d row(s) of configurations not in this grid (an earlier, larger one?) "
                        "are kept in the file but not selected\n", path, gone);
    return gone;
}

/* Column indices of NAMES in R (file PATH), or -1 + m2d_err naming the file and the column. */
static int columns_of(const m2d_results *r, const char *path, char *const *names, int n, int *idx) {
    for (int i = 0; i < n; i++)
        if ((idx[i] = m2d_results_col(r, names[i])) < 0)
            return m2d_err("%s: field '%s': column missing", path, names[i]);
    return 0;
}

/* The fingerprint of configuration ID in MAIN ("" when absent). */
static const char *fingerprint_of(const m2d_results *main, int id_col, int fp_col, const char *id) {
    for (int i = 0; i < main->n_rows; i++)
        if (!strcmp(main->rows[i][id_col], id)) return main->rows[i][fp_col];
    return "";
}

/* Set the MC cells of every MAIN row with fingerprint FP from sidecar row J; 1 if any changed. */
static int copy_cells(m2d_results *main, int fp_col, const char *fp, const m2d_results *mc, int j, const int *main_cols,
                      const int *side_cols, int n_mc) {
    int changed = 0;
    for (int i = 0; i < main->n_rows; i++) {
        if (strcmp(main->rows[i][fp_col], fp)) continue;
        for (int m = 0; m < n_mc; m++) {
            char **cell = &main->rows[i][main_cols[m]];
            const char *v = mc->rows[j][side_cols[m]];
            if (!strcmp(*cell, v)) continue;
            free(*cell);
            *cell = m2d_strdup(v);
            changed = 1;
        }
    }
    return changed;
}

/* 1 when sidecar row J holds VALS in the columns COLS */
static int row_matches(const m2d_results *mc, int j, const int *cols, char *const *vals, int n) {
    for (int i = 0; i < n; i++)
        if (strcmp(mc->rows[j][cols[i]], vals[i])) return 0;
    return 1;
}

int m2d_sweep_mc_fill(const char *out, const char *side, char *const *mc_cols, int n_mc) {
    return m2d_sweep_mc_fill_where(out, side, mc_cols, n_mc, NULL, NULL, 0);
}

int m2d_sweep_mc_fill_where(const char *out, const char *side, char *const *mc_cols, int n_mc,
                            char *const *where_cols, char *const *where_vals, int n_where) {
    m2d_results main, mc;
    if (m2d_results_read_checked(out, &main)) return -1;
    if (m2d_results_read_checked(side, &mc)) {
        m2d_results_free(&main);
        return -1;
    }
    int *main_cols = m2d_calloc((size_t)n_mc + 1, sizeof *main_cols);
    int *side_cols = m2d_calloc((size_t)n_mc + 1, sizeof *side_cols);
    static char *const keys[] = {"config_id", "fingerprint"};
    int key_cols[2] = {-1, -1}, side_id[1] = {-1}, *side_where = m2d_calloc((size_t)n_where + 1, sizeof *side_where);
    int rc = columns_of(&main, out, keys, 2, key_cols);
    if (rc == 0) rc = columns_of(&mc, side, where_cols, n_where, side_where);
    if (rc == 0) rc = columns_of(&main, out, mc_cols, n_mc, main_cols);
    if (rc == 0) rc = columns_of(&mc, side, keys, 1, side_id);
    if (rc == 0) rc = columns_of(&mc, side, mc_cols, n_mc, side_cols);
    int changed = 0;
    for (int j = 0; rc == 0 && j < mc.n_rows; j++) {
        if (strcmp(m2d_results_get(&mc, j, "status"), "ok") || !row_matches(&mc, j, side_where, where_vals, n_where))
            continue;
        const char *fp = fingerprint_of(&main, key_cols[0], key_cols[1], mc.rows[j][side_id[0]]);
        if (fp[0]) changed |= copy_cells(&main, key_cols[1], fp, &mc, j, main_cols, side_cols, n_mc);
    }
    if (rc == 0 && changed) rc = m2d_results_write(out, &main);
    free(main_cols);
    free(side_cols);
    free(side_where);
    m2d_results_free(&main);
    m2d_results_free(&mc);
    return rc;
}

/* The sidecar row of one configuration: build its student, run the tasks. 0, 1 when the row says
 * failed, -1 when it could not be written. */
static int evaluate_one(const m2d_experiment *x, m2d_sweep_backend *b, int ci, double *mc_buf, int n_mc,
                        m2d_results_writer *w) {
    double t0 = m2d_now();
    m2d_sweep_result r;
    memset(&r, 0, sizeof r);
    r.ppl = NAN;
    r.mc = mc_buf;
    for (int m = 0; m < n_mc; m++) mc_buf[m] = NAN;
    void *student = NULL;
    if (b->build(b, &x->configs[ci], &student, &r) == 0) {
        if (b->evaluate_mc(b, student, &x->configs[ci], &r) != 0 && !r.error[0])
            snprintf(r.error, sizeof r.error, "%s", m2d_errmsg());
        b->free_student(b, student);
    } else if (!r.error[0]) {
        snprintf(r.error, sizeof r.error, "%s", m2d_errmsg());
    }
    int n = n_mc + 3, k = 0;
    char **f = m2d_calloc((size_t)n, sizeof *f);
    f[k++] = m2d_strdup(x->configs[ci].id);
    for (int m = 0; m < n_mc; m++) f[k++] = m2d_sweep_mc_cell(mc_buf[m]);
    f[k++] = m2d_strfmt("%.3f", m2d_now() - t0);
    f[k++] = r.error[0] ? m2d_strfmt("failed: %s", r.error) : m2d_strdup("ok");
    int rc = m2d_results_append(w, (const char *const *)f);
    m2d_sweep_row_free(f, n);
    return rc ? -1 : r.error[0] ? 1 : 0;
}

/* Evaluate the selected rows of MAIN not yet in the sidecar (DONE: its rows so far). */
static int evaluate_selected(const m2d_experiment *x, m2d_sweep_backend *b, const m2d_results *main, const int *rows,
                             int n_sel, const m2d_results *done, int n_mc, m2d_results_writer *w,
                             m2d_sweep_summary *sum) {
    int done_id = m2d_results_col(done, "config_id"), rc = 0;
    double *mc_buf = m2d_malloc((size_t)(n_mc + 1) * sizeof *mc_buf);
    m2d_progress prog;
    m2d_progress_start(&prog, "multiple choice", n_sel);
    for (int s = 0; rc == 0 && s < n_sel; s++) {
        const char *id = m2d_results_get(main, rows[s], "config_id");
        int seen = -1;
        for (int d = 0; d < done->n_rows && seen < 0; d++)
            if (!strcmp(done->rows[d][done_id], id)) seen = d;
        if (seen >= 0 && strncmp(m2d_results_get(done, seen, "status"), "failed", 6) == 0) sum->mc_failed++;
        int ci = m2d_sweep_find_config(x, id);
        if (seen >= 0 || ci < 0) continue;
        rc = evaluate_one(x, b, ci, mc_buf, n_mc, w);
        if (rc == 1) sum->mc_failed++, rc = 0;
        sum->mc_evaluated++;
        m2d_progress_update(&prog, s + 1);
    }
    m2d_progress_end(&prog);
    free(mc_buf);
    return rc;
}

int m2d_sweep_mc_stage(const m2d_experiment *x, m2d_sweep_backend *b, const char *out, const m2d_sweep_meta *meta,
                       m2d_sweep_summary *sum) {
    m2d_results main;
    if (m2d_results_read_checked(out, &main)) return -1;
    m2d_sweep_keep_grid_rows(x, &main, out);
    int *rows = NULL, n_sel = m2d_sweep_select_rows(&main, x->mc_configs, NULL, 0, &rows);
    if (n_sel < 0) {
        m2d_results_free(&main);
        return -1;
    }
    sum->mc_selected = n_sel;
    /* sidecar columns: config_id, the MC columns, wall_s, status */
    char **mc_cols;
    int n_mc = m2d_sweep_mc_columns(x, &mc_cols), n_side = n_mc + 3, j = 0;
    const char **side_cols = m2d_calloc((size_t)n_side, sizeof *side_cols);
    side_cols[j++] = "config_id";
    for (int m = 0; m < n_mc; m++) side_cols[j++] = mc_cols[m];
    side_cols[j++] = "wall_s";
    side_cols[j++] = "status";
    char *side = m2d_strfmt("%s.mc.csv", out);
    m2d_results_writer w;
    m2d_results done;
    int rc = m2d_results_open(side, side_cols, n_side, (const char *const *)meta->items, meta->n,
                              m2d_sweep_identity_keys, m2d_sweep_n_identity_keys, &w, &done);
    if (rc == 0) {
        rc = evaluate_selected(x, b, &main, rows, n_sel, &done, n_mc, &w, sum);
        m2d_results_close(&w);
        m2d_results_free(&done);
    }
    m2d_results_free(&main);
    if (rc == 0) rc = m2d_sweep_mc_fill(out, side, mc_cols, n_mc);
    m2d_sweep_columns_free(mc_cols, n_mc);
    free(side);
    free(side_cols);
    free(rows);
    return rc;
}

/* ---- the teachers ---- */

char *m2d_sweep_teacher_mc_value(const m2d_experiment *x, const double *mc) {
    char **cols;
    int n = m2d_sweep_mc_columns(x, &cols);
    char *v = m2d_strdup("");
    for (int i = 0; i < n; i++) {
        if (!isfinite(mc[i])) continue;
        char *next = m2d_strfmt("%s%s%s:%.6f", v, v[0] ? "," : "", cols[i], mc[i]);
        free(v);
        v = next;
    }
    m2d_sweep_columns_free(cols, n);
    return v;
}

/* KEY of one teacher (D2D: the dense one) measured into MAIN's header and OUT rewritten; 0 when
 * there is nothing to do (measured already, or no such teacher). */
static int one_teacher_mc(const m2d_experiment *x, m2d_sweep_backend *b, int d2d, m2d_results *main,
                          const char *out) {
    const char *key = d2d ? "d2d_teacher_mc" : "teacher_mc";
    if (m2d_results_meta(main, key)) return 0; /* a resumed run measured it */
    int n = 2 * x->n_mc + 1;
    double *mc = m2d_malloc((size_t)n * sizeof *mc);
    for (int i = 0; i < n; i++) mc[i] = NAN;
    m2d_sweep_result r;
    memset(&r, 0, sizeof r);
    r.mc = mc;
    fprintf(stderr, "moe2dense sweep: multiple choice on the %s teacher\n", d2d ? "dense (d2d)" : "MoE");
    int rc = b->evaluate_teacher_mc(b, d2d, &r);
    if (rc == 0) {
        char *v = m2d_sweep_teacher_mc_value(x, mc);
        m2d_results_set_meta(main, key, v);
        free(v);
        rc = m2d_results_write(out, main);
    }
    free(mc);
    if (rc < 0) {
        char *why = m2d_strdup(m2d_errmsg());
        m2d_err("%s: %s: %s", out, key, why);
        free(why);
        return -1;
    }
    return 0;
}

int m2d_sweep_teacher_mc(const m2d_experiment *x, m2d_sweep_backend *b, const char *out) {
    if (!b->evaluate_teacher_mc || x->n_mc == 0) return 0;
    m2d_results main;
    if (m2d_results_read_checked(out, &main)) return -1;
    int rc = one_teacher_mc(x, b, 0, &main, out);
    if (rc == 0 && x->has_d2d) rc = one_teacher_mc(x, b, 1, &main, out);
    m2d_results_free(&main);
    return rc;
}
