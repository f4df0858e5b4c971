/* report_moe — the MoE students' section of a report (see report_moe.h). */
#include "sweep/report_moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

int m2d_report_is_moe_row(const m2d_results *r, int i) {
    const char *t = m2d_results_get(r, i, "target");
    return t && !strcmp(t, "moe");
}

/* a column: one (ratio, top-k) pair */
typedef struct {
    const char *ratio;
    double ratio_v;
    int top_k, K;
} moe_col;

/* a row: one method (scoring, grouping, params) */
typedef struct {
    const char *scoring, *grouping, *params;
} moe_method;

typedef struct {
    const m2d_results *r;
    int *rows, n;         /* the MoE rows of R */
    moe_col *cols;
    int n_cols;
    moe_method *methods;
    int n_methods, with_params;
} moe_view;

static int cmp_col(const void *a, const void *b) {
    const moe_col *x = a, *y = b;
    if (x->ratio_v != y->ratio_v) return x->ratio_v < y->ratio_v ? -1 : 1;
    return y->top_k - x->top_k;
}

static int col_of(const moe_view *v, int row) {
    const char *ratio = m2d_results_get(v->r, row, "ratio"), *tk = m2d_results_get(v->r, row, "top_k");
    int top_k = tk ? atoi(tk) : 0;
    for (int c = 0; c < v->n_cols; c++)
        if (!strcmp(v->cols[c].ratio, ratio) && v->cols[c].top_k == top_k) return c;
    return -1;
}

static int method_of(const moe_view *v, int row) {
    const char *sc = m2d_results_get(v->r, row, "scoring"), *gr = m2d_results_get(v->r, row, "grouping"),
               *pa = m2d_results_get(v->r, row, "params");
    for (int m = 0; m < v->n_methods; m++)
        if (!strcmp(v->methods[m].scoring, sc) && !strcmp(v->methods[m].grouping, gr) &&
            !strcmp(v->methods[m].params, pa ? pa : ""))
            return m;
    return -1;
}

/* the MoE rows, their distinct columns (sorted) and methods (in order of appearance) */
static int view_load(const m2d_results *r, moe_view *v) {
    memset(v, 0, sizeof *v);
    v->r = r;
    v->rows = m2d_malloc((size_t)(r->n_rows + 1) * sizeof *v->rows);
    v->cols = m2d_malloc((size_t)(r->n_rows + 1) * sizeof *v->cols);
    v->methods = m2d_malloc((size_t)(r->n_rows + 1) * sizeof *v->methods);
    for (int i = 0; i < r->n_rows; i++) {
        if (!m2d_report_is_moe_row(r, i)) continue;
        v->rows[v->n++] = i;
        if (col_of(v, i) < 0) {
            const char *ratio = m2d_results_get(r, i, "ratio"), *tk = m2d_results_get(r, i, "top_k");
            v->cols[v->n_cols++] = (moe_col){ratio ? ratio : "", ratio ? strtod(ratio, NULL) : 0, tk ? atoi(tk) : 0,
                                             atoi(m2d_results_get(r, i, "K"))};
        }
        if (method_of(v, i) < 0) {
            const char *pa = m2d_results_get(r, i, "params");
            v->methods[v->n_methods++] = (moe_method){m2d_results_get(r, i, "scoring"),
                                                      m2d_results_get(r, i, "grouping"), pa ? pa : ""};
            v->with_params |= pa && pa[0];
        }
    }
    qsort(v->cols, (size_t)v->n_cols, sizeof *v->cols, cmp_col);
    return v->n;
}

static void view_free(moe_view *v) { free(v->rows), free(v->cols), free(v->methods); }

/* the value of COL (ppl, or mc_avg) in cell (method M, column C): NaN when absent or failed;
 * *present: the file has the configuration (the last row wins) */
static double cell_value(const moe_view *v, int m, int c, const char *col, int *present) {
    double x = NAN;
    *present = 0;
    for (int i = 0; i < v->n; i++) {
        int row = v->rows[i];
        if (method_of(v, row) != m || col_of(v, row) != c) continue;
        const char *s = m2d_results_get(v->r, row, col), *st = m2d_results_get(v->r, row, "status");
        int ok = st && !strcmp(st, "ok");
        *present = ok ? 1 : 2; /* 2: failed */
        x = ok && s && s[0] ? strtod(s, NULL) : NAN;
    }
    return x;
}

/* one matrix: COL's values (SCALE 100: percent, one decimal; else PPL notation), the best of
 * each column in bold (LOWER: lowest is best) */
static void moe_matrix(const moe_view *v, const m2d_report_out *o, const char *col, double scale, int lower) {
    int names = 2 + v->with_params, n = names + v->n_cols;
    char **cells = m2d_calloc((size_t)n, sizeof *cells);
    unsigned char *bold = m2d_calloc((size_t)n, 1);
    cells[0] = m2d_strdup("Scoring"), cells[1] = m2d_strdup("Grouping");
    if (v->with_params) cells[2] = m2d_strdup("Params");
    for (int c = 0; c < v->n_cols; c++)
        cells[names + c] = m2d_strfmt("%g %% removed (K=%d), top-%d", 100 * v->cols[c].ratio_v, v->cols[c].K,
                                      v->cols[c].top_k);
    m2d_report_header(o, (const char *const *)cells, n, names);
    double *best = m2d_malloc((size_t)v->n_cols * sizeof *best);
    for (int c = 0; c < v->n_cols; c++) {
        best[c] = NAN;
        for (int m = 0; m < v->n_methods; m++) {
            int present;
            double x = cell_value(v, m, c, col, &present);
            if (isfinite(x) && (!isfinite(best[c]) || (lower ? x < best[c] : x > best[c]))) best[c] = x;
        }
    }
    for (int m = 0; m < v->n_methods; m++) {
        for (int i = 0; i < n; i++) free(cells[i]);
        cells[0] = m2d_strdup(m2d_report_display_name(v->methods[m].scoring));
        cells[1] = m2d_strdup(m2d_report_display_name(v->methods[m].grouping));
        if (v->with_params) cells[2] = m2d_strdup(v->methods[m].params[0] ? v->methods[m].params : "-");
        for (int c = 0; c < v->n_cols; c++) {
            int present;
            double x = cell_value(v, m, c, col, &present);
            char buf[32] = "";
            if (present == 2) snprintf(buf, sizeof buf, "%s", o->fmt == M2D_REPORT_TEX ? "--" : "\xe2\x80\x93");
            else if (isfinite(x) && scale == 1) m2d_report_format_ppl(x, buf, sizeof buf);
            else if (isfinite(x)) snprintf(buf, sizeof buf, "%.1f", scale * x);
            cells[names + c] = m2d_strdup(buf);
            bold[names + c] = isfinite(x) && x == best[c];
        }
        m2d_report_cells(o, (const char *const *)cells, n, bold);
    }
    m2d_report_end(o);
    for (int i = 0; i < n; i++) free(cells[i]);
    free(cells), free(bold), free(best);
}

/* 1 when some MoE student has an MC average */
static int has_mc(const moe_view *v) {
    for (int i = 0; i < v->n; i++) {
        const char *s = m2d_results_get(v->r, v->rows[i], "mc_avg");
        if (s && s[0]) return 1;
    }
    return 0;
}

int m2d_report_moe_write(const m2d_results *r, m2d_report_format fmt, FILE *f) {
    if (fmt == M2D_REPORT_CSV) return 0;
    moe_view v;
    if (view_load(r, &v) == 0) {
        view_free(&v);
        return 0;
    }
    m2d_report_out o = {fmt, f};
    const char *exp = m2d_results_meta(r, "experiment");
    if (fmt == M2D_REPORT_MD)
        fprintf(f, "\n## MoE students (target moe)%s%s\n\n%d configuration(s), %d method(s). Columns: the fraction "
                   "of each layer's routed experts removed (K = experts kept) and the student's experts per token "
                   "(top-k). Bold: the best method of each column; –: failed.\n\nWikiText-2 perplexity:\n\n",
                exp ? " — experiment " : "", exp ? exp : "", v.n, v.n_methods);
    else
        fprintf(f, "\n%% MoE students (target moe): %d configuration(s), %d method(s); columns: experts removed "
                   "(K kept), top-k; bold: best per column; --: failed\n%% WikiText-2 perplexity\n", v.n, v.n_methods);
    moe_matrix(&v, &o, "ppl", 1, 1);
    if (m2d_results_col(r, "mc_avg") >= 0 && has_mc(&v)) {
        fprintf(f, fmt == M2D_REPORT_MD ? "\nMultiple-choice average (%%):\n\n" : "\n%% Multiple-choice average (%%)\n");
        moe_matrix(&v, &o, "mc_avg", 100, 0);
    }
    view_free(&v);
    return 0;
}
