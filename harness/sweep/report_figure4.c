/* report_figure4 — the paper's Figure 4 layout (see report_figure4.h). */
#include "sweep/report_figure4.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "convert/plan.h"
#include "sweep/report_distill.h"
#include "sweep/sweep_d2d.h"

enum { AX_SCORING, AX_GROUPING, AX_SCALING, AX_K, N_AX };
static const char *const AXIS[N_AX] = {"scoring", "grouping", "scaling", "K"};
static const char *const AXIS_HEAD[N_AX] = {"Scoring", "Grouping", "Scaling", "K"};

/* one value of an axis: its cell text (a pointer into the results) and its students' accuracies */
typedef struct {
    const char *value;
    double sum, lo, hi; /* fractions, as the results hold them */
    int n;
} f4_value;

typedef struct {
    int n;
    f4_value *v;
} f4_axis;

/* ---- the students ---- */

/* the row whose evaluation row I carries: its dedup_of's row, else I */
static int canon(const m2d_results *r, int i) {
    const char *d = m2d_results_get(r, i, "dedup_of");
    for (int j = 0; d[0] && j < r->n_rows; j++)
        if (!strcmp(m2d_results_get(r, j, "config_id"), d)) return j;
    return i;
}

/* rows I and J are one student: one is the other's dedup_of (or both the same row's), or their
 * fingerprints are equal (the distill stage copies a student's results by fingerprint) */
static int same_student(const m2d_results *r, int i, int j) {
    const char *fi = m2d_results_get(r, i, "fingerprint"), *fj = m2d_results_get(r, j, "fingerprint");
    return canon(r, i) == canon(r, j) || (fi[0] && !strcmp(fi, fj));
}

/* a converted student: not a baseline (random-ffn, random-init) nor a dense-to-dense candidate,
 * which vary no design axis of the conversion (the paper's Figure 4 averages its 35 grid cells) */
static int converted(const m2d_results *r, int i) {
    const char *sc = m2d_results_get(r, i, "scoring");
    return m2d_baseline_lookup(sc) == M2D_BASELINE_NONE && strcmp(sc, M2D_D2D_SCORING) != 0;
}

/* the converted students of ROWS (N) with a post-distillation MC average -> *out (malloc'd); the count */
static int students_of(const m2d_results *r, const int *rows, int n, int **out) {
    *out = m2d_malloc((size_t)(n > 0 ? n : 0) * sizeof **out + sizeof **out);
    int k = 0;
    for (int i = 0; i < n; i++)
        if (converted(r, rows[i]) && isfinite(m2d_report_distilled_mc_avg(r, rows[i]))) (*out)[k++] = rows[i];
    return k;
}

/* ---- the axes ---- */

static int value_eq(int a, const char *x, const char *y) { return a == AX_K ? atoi(x) == atoi(y) : !strcmp(x, y); }

/* X goes before Y: K ascending; names in the report's order (ties and unranked names: first
 * appearance) */
static int value_before(int a, const char *x, const char *y) {
    return a == AX_K ? atoi(x) < atoi(y) : m2d_report_name_order(x) < m2d_report_name_order(y);
}

/* axis A over students ST (NS): its values in order, each distinct student once per value */
static void axis_build(const m2d_results *r, const int *st, int ns, int a, f4_axis *ax) {
    ax->n = 0;
    ax->v = m2d_calloc((size_t)ns + 1, sizeof *ax->v);
    for (int s = 0; s < ns; s++) {
        const char *v = m2d_results_get(r, st[s], AXIS[a]);
        int dup = 0;
        for (int t = 0; t < s && !dup; t++)
            dup = value_eq(a, m2d_results_get(r, st[t], AXIS[a]), v) && same_student(r, st[t], st[s]);
        if (dup) continue;
        int k = 0;
        while (k < ax->n && !value_eq(a, ax->v[k].value, v)) k++;
        if (k == ax->n) {
            for (k = ax->n; k > 0 && value_before(a, v, ax->v[k - 1].value); k--) ax->v[k] = ax->v[k - 1];
            ax->v[k] = (f4_value){v, 0, INFINITY, -INFINITY, 0};
            ax->n++;
        }
        double m = m2d_report_distilled_mc_avg(r, st[s]);
        f4_value *x = &ax->v[k];
        x->sum += m, x->n++;
        x->lo = fmin(x->lo, m), x->hi = fmax(x->hi, m);
    }
}

static double mean_of(const f4_value *v) { return v->sum / v->n; }

/* the values of the highest and lowest mean (the first of equal ones); the spread in points */
static double spread_of(const f4_axis *ax, int *hi, int *lo) {
    *hi = *lo = 0;
    for (int k = 1; k < ax->n; k++) {
        if (mean_of(&ax->v[k]) > mean_of(&ax->v[*hi])) *hi = k;
        if (mean_of(&ax->v[k]) < mean_of(&ax->v[*lo])) *lo = k;
    }
    return 100 * (mean_of(&ax->v[*hi]) - mean_of(&ax->v[*lo]));
}

/* scoring and grouping always; scaling and K when they take more than one value */
static int axis_shown(int a, const f4_axis *ax) { return a <= AX_GROUPING || ax->n > 1; }

/* the axes of students ST (NS) -> AX[N_AX] */
static void axes_build(const m2d_results *r, const int *st, int ns, f4_axis *ax) {
    for (int a = 0; a < N_AX; a++) axis_build(r, st, ns, a, &ax[a]);
}

static void axes_free(f4_axis *ax) {
    for (int a = 0; a < N_AX; a++) free(ax[a].v);
}

/* ---- the table ---- */

static const char *shown_name(int a, const char *v) { return a == AX_K ? v : m2d_report_display_name(v); }

static char *pct(double v) { return m2d_strfmt("%.2f", 100 * v); }

/* md / tex: one axis' heading (its letter L, its spread) and table */
static void axis_table(int a, const f4_axis *ax, char letter, const m2d_report_out *o) {
    int hi, lo;
    double spread = spread_of(ax, &hi, &lo);
    char *head = m2d_strfmt("(%c) %s: spread %.2f pp", letter, AXIS_HEAD[a], spread), *tail;
    if (ax->n > 1 && hi == lo) tail = m2d_strfmt(" (every mean %.2f %%)", 100 * mean_of(&ax->v[hi]));
    else if (ax->n > 1)
        tail = m2d_strfmt(" (highest mean %s%s %.2f %%, lowest %s%s %.2f %%)", a == AX_K ? "K = " : "",
                          shown_name(a, ax->v[hi].value), 100 * mean_of(&ax->v[hi]), a == AX_K ? "K = " : "",
                          shown_name(a, ax->v[lo].value), 100 * mean_of(&ax->v[lo]));
    else tail = m2d_strdup(" (one value)");
    fprintf(o->f, o->fmt == M2D_REPORT_MD ? "\n%s%s\n\n" : "\n%% %s%s\n", head, tail);
    const char *cols[] = {AXIS_HEAD[a], "Mean (%)", "Min (%)", "Max (%)", "Students"};
    m2d_report_header(o, cols, 5, 1);
    for (int k = 0; k < ax->n; k++) {
        const f4_value *v = &ax->v[k];
        char *mean = pct(mean_of(v)), *mn = pct(v->lo), *mx = pct(v->hi), *cnt = m2d_strfmt("%d", v->n);
        const char *cells[] = {shown_name(a, v->value), mean, mn, mx, cnt};
        m2d_report_cells(o, cells, 5, NULL);
        free(mean), free(mn), free(mx), free(cnt);
    }
    m2d_report_end(o);
    free(head), free(tail);
}

/* csv: axis A's rows (raw names, percent, the axis' spread on each) */
static void axis_csv(int a, const f4_axis *ax, const m2d_report_out *o) {
    int hi, lo;
    char *spread = m2d_strfmt("%.2f", spread_of(ax, &hi, &lo));
    for (int k = 0; k < ax->n; k++) {
        const f4_value *v = &ax->v[k];
        char *mean = pct(mean_of(v)), *mn = pct(v->lo), *mx = pct(v->hi), *cnt = m2d_strfmt("%d", v->n);
        const char *cells[] = {AXIS[a], v->value, mean, mn, mx, cnt, spread};
        m2d_report_cells(o, cells, 7, NULL);
        free(mean), free(mn), free(mx), free(cnt);
    }
    free(spread);
}

static const char LEGEND[] =
    "Figure 4: marginal effect of each design axis on the downstream accuracy after distillation. Per "
    "value: the mean MC average over Table 12's converted students (baselines and D2D candidates vary no "
    "axis and are left out) that were distilled and scored (per scoring x "
    "grouping the student the paper's rule selected), each distinct student once per value (rows sharing "
    "a fingerprint are one student), their min, max and count. Spread: the highest mean minus the lowest, "
    "in percentage points.";

int m2d_report_figure4_write(const m2d_results *r, const int *rows, int n, m2d_report_format fmt, FILE *f) {
    m2d_report_out o = {fmt, f};
    int *st, ns = students_of(r, rows, n, &st);
    const char *exp = m2d_results_meta(r, "experiment");
    if (fmt == M2D_REPORT_CSV) {
        const char *cols[] = {"axis", "value", "mean", "min", "max", "students", "spread_pp"};
        m2d_report_header(&o, cols, 7, 2);
    } else if (fmt == M2D_REPORT_MD)
        fprintf(f, "## Figure 4: accuracy after distillation by design axis%s%s\n\n%s\n", exp ? " — experiment " : "",
                exp ? exp : "", LEGEND);
    else
        fprintf(f, "%% %s%s%s\n", LEGEND, exp ? " Experiment " : "", exp ? exp : "");
    if (ns == 0 && fmt != M2D_REPORT_CSV)
        fprintf(f, fmt == M2D_REPORT_MD ? "\nNo such student: no selected row has an MC average measured after "
                                          "distillation (a sweep with [distill] and [mc] tasks).\n"
                                        : "%% no such student: no selected row has an MC average after distillation\n");
    if (ns > 0) {
        f4_axis ax[N_AX];
        axes_build(r, st, ns, ax);
        char letter = 'a';
        for (int a = 0; a < N_AX; a++) {
            if (!axis_shown(a, &ax[a])) continue;
            if (fmt == M2D_REPORT_CSV) axis_csv(a, &ax[a], &o);
            else axis_table(a, &ax[a], letter++, &o);
        }
        axes_free(ax);
    }
    free(st);
    return 0;
}

/* ---- plot data ---- */

/* a value as a quoted gnuplot title: anything but [A-Za-z0-9._=+-] as '_' (data, never code) */
static char *label_of(int a, const char *v) {
    char *l = a == AX_K ? m2d_strfmt("K=%s", v) : m2d_strdup(v);
    for (char *p = l; *p; p++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._=+-", *p)) *p = '_';
    return l;
}

int m2d_report_figure4_plot_data(const m2d_results *r, const int *rows, int n, const char *dir) {
    int *st, ns = students_of(r, rows, n, &st), rc = 0;
    if (ns > 0) {
        f4_axis ax[N_AX];
        axes_build(r, st, ns, ax);
        for (int a = 0; a < N_AX; a++) {
            if (!axis_shown(a, &ax[a])) continue;
            char *name = m2d_strfmt("figure4_%s.dat", AXIS[a]);
            m2d_report_file pf;
            FILE *f = m2d_report_file_open(&pf, dir, name);
            free(name);
            fputs("# value mean_acc min_acc max_acc n_students (MC average after distillation, %; Table 12's "
                  "students, each distinct student once per value)\n", f);
            for (int k = 0; k < ax[a].n; k++) {
                const f4_value *v = &ax[a].v[k];
                char *label = label_of(a, v->value);
                fprintf(f, "\"%s\" %.6g %.6g %.6g %d\n", label, 100 * mean_of(v), 100 * v->lo, 100 * v->hi, v->n);
                free(label);
            }
            if (m2d_report_file_close(&pf)) rc = -1;
        }
        axes_free(ax);
    }
    free(st);
    return rc;
}
