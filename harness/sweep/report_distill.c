/* report_distill — the distillation section of a report and its plot data (see report_distill.h). */
#include "sweep/report_distill.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "evals/mc.h"

static double cell_num(const m2d_results *r, int i, const char *col) {
    const char *v = m2d_results_get(r, i, col);
    return v && v[0] ? strtod(v, NULL) : NAN;
}

int m2d_report_distilled_rows(const m2d_results *r, int one_per_student, int **rows) {
    *rows = m2d_malloc((size_t)(r->n_rows + 1) * sizeof **rows);
    if (m2d_results_col(r, "distill_ppl") < 0 || m2d_results_col(r, "fingerprint") < 0) return 0;
    int n = 0;
    for (int i = 0; i < r->n_rows; i++) {
        if (!isfinite(cell_num(r, i, "distill_ppl"))) continue;
        int seen = 0;
        for (int j = 0; j < n && !seen && one_per_student; j++)
            seen = !strcmp(m2d_results_get(r, (*rows)[j], "fingerprint"), m2d_results_get(r, i, "fingerprint"));
        if (!seen) (*rows)[n++] = i;
    }
    return n;
}

/* ---- tables ---- */

/* The paper's Table 12 benchmarks: the task (its results columns TASK_acc, TASK_acc_norm), the heading. */
static const struct {
    const char *task, *head;
} BENCH[] = {{"winogrande", "Wino"}, {"hellaswag", "Hella"}, {"arc_easy", "ARC-E"}, {"arc_challenge", "ARC-C"},
             {"mmlu", "MMLU"}};
#define N_BENCH ((int)M2D_ARRAY_LEN(BENCH))

/* MC column COL of row I, or of a teacher (I < 0: the header's KEY, teacher_mc or d2d_teacher_mc) */
static double mc_num(const m2d_results *r, int i, const char *key, const char *col) {
    return i >= 0 ? cell_num(r, i, col) : m2d_report_teacher_mc(r, key, col);
}

/* TASK's accuracy on row I (I < 0: the teacher of header KEY) in the task's paper metric
 * (acc_norm where its plugin says so and the cell has one, as the sweep's mc_avg); NAN when none */
static double bench_acc(const m2d_results *r, int i, const char *key, const char *task) {
    const m2d_mc_plugin *pl = m2d_mc_plugin_find(task);
    char col[96];
    double v = NAN;
    if (pl && pl->paper_metric && !strcmp(pl->paper_metric, "acc_norm")) {
        snprintf(col, sizeof col, "%s_acc_norm", task);
        v = mc_num(r, i, key, col);
    }
    snprintf(col, sizeof col, "%s_acc", task);
    return isfinite(v) ? v : mc_num(r, i, key, col);
}



static int has_bench(const m2d_results *r, int b) {
    char col[96];
    snprintf(col, sizeof col, "%s_acc", BENCH[b].task);
    return m2d_results_col(r, col) >= 0;
}

/* accuracy as the paper prints it (percent, two decimals); empty when not measured */
static char *pct(double v) { return isfinite(v) ? m2d_strfmt("%.2f", 100 * v) : m2d_strdup(""); }

/* an accuracy cell of row I; the teacher's (I < 0) shows an em dash where the header has none */
static char *acc_cell(double v, int i, m2d_report_format fmt) {
    char buf[32];
    if (i >= 0) return pct(v);
    m2d_report_format_teacher_acc(v, fmt, buf, sizeof buf);
    return m2d_strdup(buf);
}

/* the MC cells of row I measured on its distilled student (mc_student, where the file has it,
 * says "distilled"; else they would be the converted student's) */
static int mc_of_distilled(const m2d_results *r, int i) {
    return isfinite(cell_num(r, i, "distill_ppl")) &&
           (m2d_results_col(r, "mc_student") < 0 || !strcmp(m2d_results_get(r, i, "mc_student"), "distilled"));
}

double m2d_report_distilled_mc_avg(const m2d_results *r, int i) {
    return mc_of_distilled(r, i) ? cell_num(r, i, "mc_avg") : NAN;
}

int m2d_report_acc_heads(const m2d_results *r, const char **head) {
    int n = 0;
    for (int b = 0; b < N_BENCH; b++)
        if (has_bench(r, b)) head[n++] = BENCH[b].head;
    if (m2d_results_col(r, "mc_avg") >= 0) head[n++] = "Avg";
    return n;
}

/* row I's values (I < 0: the teacher of header KEY) */
static int acc_values(const m2d_results *r, int i, const char *key, double *v) {
    int n = 0, mc = i < 0 || mc_of_distilled(r, i);
    for (int b = 0; b < N_BENCH; b++)
        if (has_bench(r, b)) v[n++] = mc ? bench_acc(r, i, key, BENCH[b].task) : NAN;
    if (m2d_results_col(r, "mc_avg") >= 0) v[n++] = mc ? mc_num(r, i, key, "mc_avg") : NAN;
    return n;
}

int m2d_report_acc_values(const m2d_results *r, int i, double *v) { return acc_values(r, i, "teacher_mc", v); }

int m2d_report_teacher_acc_values(const m2d_results *r, const char *key, double *v) {
    return acc_values(r, -1, key, v);
}

/* One Table 12 line: row I (or the teacher, I < 0, with PPL TEACHER and the accuracies of the
 * header's teacher_mc) into CELLS (malloc'd strings). */
static int t12_cells(const m2d_results *r, int i, double teacher, m2d_report_format fmt, char **cells) {
    int j = 0;
    char pre[32], post[32];
    double v[M2D_REPORT_MAX_ACC];
    m2d_report_format_ppl(i >= 0 ? cell_num(r, i, "ppl") : teacher, pre, sizeof pre);
    m2d_report_format_ppl(i >= 0 ? cell_num(r, i, "distill_ppl") : NAN, post, sizeof post);
    cells[j++] = m2d_strdup(i >= 0 ? m2d_report_display_name(m2d_results_get(r, i, "scoring")) : "Teacher (MoE)");
    cells[j++] = m2d_strdup(i >= 0 ? m2d_report_display_name(m2d_results_get(r, i, "grouping")) : "");
    cells[j++] = m2d_strdup(i >= 0 ? m2d_report_display_name(m2d_results_get(r, i, "scaling")) : "");
    cells[j++] = m2d_strdup(i >= 0 ? m2d_results_get(r, i, "K") : "");
    cells[j++] = m2d_strdup(pre);
    cells[j++] = m2d_strdup(i >= 0 ? post : "");
    int n = m2d_report_acc_values(r, i, v);
    for (int q = 0; q < n; q++) cells[j++] = acc_cell(v[q], i, fmt);
    return j;
}

/* Table 12 (paper): per scoring x grouping the student the paper's rule selected (best (K,
 * scaling) by pre-distillation PPL, m2d_report_best_per_pair), its PPL before and after
 * distillation and its accuracies after; a teacher row first (where the header has teacher_ppl:
 * its PPL, and its accuracies from the header's teacher_mc, an em dash where absent).
 * A selected student that was not distilled keeps empty post-distillation cells: the table never
 * substitutes another student of the pair. */
static void table12(const m2d_results *r, const int *rows, int n, const m2d_report_out *o) {
    int nc = 0, windows;
    if (n < 0) return;
    const char *head[6 + M2D_REPORT_MAX_ACC] = {"Scoring", "Grouping", "Scaling", "K", "Pre", "Post"};
    nc = 6 + m2d_report_acc_heads(r, head + 6);
    fprintf(o->f, o->fmt == M2D_REPORT_MD ? "\n%s\n\n" : "\n%% %s\n",
            "Table 12: per scoring x grouping the student the paper selects (the (K, scaling) with the lowest "
            "pre-distillation PPL), after distillation. Pre/Post: WikiText-2 PPL before/after; accuracy in %, "
            "each task's paper metric; empty: that student was not distilled.");
    m2d_report_header(o, head, nc, 3);
    char **cells = m2d_calloc((size_t)nc, sizeof *cells);
    double teacher;
    for (int i = m2d_report_teacher_ppl(r, &teacher, &windows) ? -1 : 0; i < n; i++) {
        int k = t12_cells(r, i < 0 ? -1 : rows[i], teacher, o->fmt, cells);
        m2d_report_cells(o, (const char *const *)cells, k, NULL);
        for (int c = 0; c < k; c++) free(cells[c]);
    }
    m2d_report_end(o);
    free(cells);
}

/* one line per distilled student */
static void details(const m2d_results *r, const int *rows, int n, int with_mc, const m2d_report_out *o) {
    const char *head[] = {"Scoring", "Grouping", "Scaling", "K", "PPL converted", "PPL distilled", "Tokens",
                          "Final loss", "MC avg"};
    int nc = with_mc ? 9 : 8;
    fprintf(o->f, o->fmt == M2D_REPORT_MD ? "\nEvery distilled student:\n\n" : "\n%% every distilled student\n");
    m2d_report_header(o, head, nc, 3);
    for (int i = 0; i < n; i++) {
        int k = rows[i];
        char pre[32], post[32], loss[32], mc[32] = "";
        m2d_report_format_ppl(cell_num(r, k, "ppl"), pre, sizeof pre);
        m2d_report_format_ppl(cell_num(r, k, "distill_ppl"), post, sizeof post);
        snprintf(loss, sizeof loss, "%.4f", cell_num(r, k, "distill_final_loss"));
        if (with_mc && isfinite(cell_num(r, k, "mc_avg"))) snprintf(mc, sizeof mc, "%.1f", 100 * cell_num(r, k, "mc_avg"));
        const char *cells[] = {m2d_report_display_name(m2d_results_get(r, k, "scoring")),
                               m2d_report_display_name(m2d_results_get(r, k, "grouping")),
                               m2d_report_display_name(m2d_results_get(r, k, "scaling")),
                               m2d_results_get(r, k, "K"), pre, post, m2d_results_get(r, k, "distill_tokens"), loss, mc};
        m2d_report_cells(o, cells, nc, NULL);
    }
    m2d_report_end(o);
}

int m2d_report_distill_write(const m2d_results *r, const int *best, int n_best, m2d_report_format fmt, FILE *f) {
    int *rows, n = m2d_report_distilled_rows(r, 1, &rows);
    if (n > 0 && fmt != M2D_REPORT_CSV) {
        m2d_report_out o = {fmt, f};
        const char *exp = m2d_results_meta(r, "experiment");
        if (fmt == M2D_REPORT_MD)
            fprintf(f, "\n## After distillation%s%s\n\n%d distilled student(s).\n", exp ? " — experiment " : "",
                    exp ? exp : "", n);
        else
            fprintf(f, "\n%% After distillation: %d distilled student(s)\n", n);
        table12(r, best, n_best, &o);
        details(r, rows, n, m2d_results_col(r, "mc_avg") >= 0, &o);
    }
    free(rows);
    return 0;
}

/* ---- plot data ---- */

/* "scoring/grouping/scaling/K=N" with anything but [A-Za-z0-9._=/+-] as '_': it is written into
 * gnuplot data files as a quoted title (data, never code) */
static char *label_of(const m2d_results *r, int i) {
    char *l = m2d_strfmt("%s/%s/%s/K=%s", m2d_results_get(r, i, "scoring"), m2d_results_get(r, i, "grouping"),
                         m2d_results_get(r, i, "scaling"), m2d_results_get(r, i, "K"));
    for (char *p = l; *p; p++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._=/+-", *p)) *p = '_';
    return l;
}

typedef struct {
    m2d_report_file loss, val; /* distill_loss.dat, distill_val.dat: one block per run (gnuplot index) */
    int n_loss, n_val;
} curve_files;

/* the run's log (JSON lines: training steps have "loss", validations "val_ce" and "ppl") as one
 * block of each file, titled LABEL; an absent log adds nothing; -1 on a malformed line */
static int add_curves(const char *log, const char *label, curve_files *c) {
    if (!m2d_file_exists(log)) return 0;
    size_t len;
    char *text = m2d_read_file(log, &len);
    if (!text) return -1;
    char *lb = NULL, *vb = NULL;
    size_t ll = 0, vl = 0;
    FILE *lm = open_memstream(&lb, &ll), *vm = open_memstream(&vb, &vl);
    int rc = 0, line_no = 0, n_l = 0, n_v = 0;
    for (char *s = text, *e; rc == 0 && *s; s = e + (*e != 0)) {
        e = strchr(s, '\n');
        if (!e) e = s + strlen(s);
        line_no++;
        cJSON *j = cJSON_ParseWithLength(s, (size_t)(e - s));
        const cJSON *tok = cJSON_GetObjectItemCaseSensitive(j, "tokens"), *loss = cJSON_GetObjectItemCaseSensitive(j, "loss");
        const cJSON *ce = cJSON_GetObjectItemCaseSensitive(j, "val_ce"), *ppl = cJSON_GetObjectItemCaseSensitive(j, "ppl");
        if (!cJSON_IsNumber(tok)) rc = m2d_err("%s: line %d: field 'tokens': not a number", log, line_no);
        else if (cJSON_IsNumber(loss)) fprintf(lm, "%.0f %.9g\n", tok->valuedouble, loss->valuedouble), n_l++;
        else if (cJSON_IsNumber(ce) && cJSON_IsNumber(ppl))
            fprintf(vm, "%.0f %.9g %.9g\n", tok->valuedouble, ce->valuedouble, ppl->valuedouble), n_v++;
        cJSON_Delete(j);
    }
    fclose(lm), fclose(vm);
    if (rc == 0 && n_l) fprintf(c->loss.f, "%s\"%s\"\n%s", c->n_loss++ ? "\n\n" : "", label, lb);
    if (rc == 0 && n_v) fprintf(c->val.f, "%s\"%s\"\n%s", c->n_val++ ? "\n\n" : "", label, vb);
    free(lb), free(vb), free(text);
    return rc;
}

/* a config id names files: hex only */
static int check_id(const char *path, const char *id) {
    size_t n = strspn(id, "0123456789abcdef");
    if (n == 0 || n > 16 || id[n]) return m2d_err("%s: field 'config_id': '%s' is not a config id", path, id);
    return 0;
}

int m2d_report_distill_plot_data(const char *results_path, const m2d_results *r, const char *dir) {
    int *rows, n = m2d_report_distilled_rows(r, 1, &rows), rc = 0;
    if (n == 0) {
        free(rows);
        return 0;
    }
    curve_files c = {0};
    m2d_report_file d;
    m2d_report_file_open(&d, dir, "distill.dat");
    m2d_report_file_open(&c.loss, dir, "distill_loss.dat");
    m2d_report_file_open(&c.val, dir, "distill_val.dat");
    fputs("# configuration ppl_converted ppl_distilled\n", d.f);
    for (int i = 0; i < n && rc == 0; i++) {
        const char *id = m2d_results_get(r, rows[i], "config_id");
        if ((rc = check_id(results_path, id))) break;
        char *label = label_of(r, rows[i]), *log = m2d_strfmt("%s.distill/%s.jsonl", results_path, id);
        fprintf(d.f, "\"%s\" %.6g %.6g\n", label, cell_num(r, rows[i], "ppl"), cell_num(r, rows[i], "distill_ppl"));
        rc = add_curves(log, label, &c);
        free(log), free(label);
    }
    m2d_report_file cnt;
    m2d_report_file_open(&cnt, dir, "distill_curves.txt");
    fprintf(cnt.f, "%d %d\n", c.n_loss, c.n_val);
    /* all four are closed (and written) whatever happened; an error keeps the first message */
    int w = m2d_report_file_close(&d) | m2d_report_file_close(&c.loss) | m2d_report_file_close(&c.val) |
            m2d_report_file_close(&cnt);
    free(rows);
    return rc ? rc : w ? -1 : 0;
}

/* ---- Tables 4 and 5: the distillation ablation (the sidecar RESULTS.distill.csv) ---- */

/* Table 4 varies teacher_topk at the reference loss (fkl); Table 5 the loss at the reference K'
 * (the teacher's own k). */
typedef struct {
    const char *axis, *fixed, *head, *caption;
} ablation_spec;

static const ablation_spec TABLE4 = {"teacher_topk", "loss", "k'",
                                     "Table 4: effect of the teacher's routing breadth k' during distillation (Eq. 6; "
                                     "k' = k: its own routing), forward KL"};
static const ablation_spec TABLE5 = {"loss", "teacher_topk", "Loss",
                                     "Table 5: loss function ablation, the teacher's own routing"};

/* the losses in the paper's order, with its names */
static const struct {
    const char *name, *label;
} LOSSES[] = {{"fkl", "Forward KL"}, {"fkl+mse", "Intermediate (logit + hidden MSE)"}, {"rkl", "Reverse KL"}};

static int loss_rank(const char *name) {
    for (int i = 0; i < (int)M2D_ARRAY_LEN(LOSSES); i++)
        if (!strcmp(LOSSES[i].name, name)) return i;
    return (int)M2D_ARRAY_LEN(LOSSES);
}

static double axis_key(const ablation_spec *sp, const char *v) { return sp == &TABLE4 ? strtod(v, NULL) : loss_rank(v); }

static void teacher_shape(const m2d_results *r, int *E, int *k) { *E = m2d_report_teacher_shape(r, k); }

/* the reference value of COL: fkl, or the teacher's k */
static void reference_of(const m2d_results *r, const char *col, char *buf, size_t n) {
    int E, k;
    teacher_shape(r, &E, &k);
    if (!strcmp(col, "loss")) snprintf(buf, n, "fkl");
    else snprintf(buf, n, "%d", k);
}

/* the ok rows of sidecar S for configuration ID at FIXED = the reference (else the first row's
 * value), in the axis' order -> ROWS; the count */
static int ablation_rows(const m2d_results *s, const m2d_results *r, const ablation_spec *sp, const char *id,
                         int *rows) {
    char ref[32];
    reference_of(r, sp->fixed, ref, sizeof ref);
    int n = 0, have_ref = 0;
    const char *fixed = NULL;
    for (int i = 0; i < s->n_rows; i++) {
        if (strcmp(m2d_results_get(s, i, "config_id"), id) || strcmp(m2d_results_get(s, i, "status"), "ok")) continue;
        if (!fixed) fixed = m2d_results_get(s, i, sp->fixed);
        have_ref |= !strcmp(m2d_results_get(s, i, sp->fixed), ref);
    }
    for (int i = 0; fixed && i < s->n_rows; i++) {
        if (strcmp(m2d_results_get(s, i, "config_id"), id) || strcmp(m2d_results_get(s, i, "status"), "ok") ||
            strcmp(m2d_results_get(s, i, sp->fixed), have_ref ? ref : fixed))
            continue;
        int j = n++;
        double key = axis_key(sp, m2d_results_get(s, i, sp->axis));
        for (; j > 0 && axis_key(sp, m2d_results_get(s, rows[j - 1], sp->axis)) > key; j--) rows[j] = rows[j - 1];
        rows[j] = i;
    }
    return n;
}

/* the row the deltas are against: the axis' reference value, else the first */
static int delta_base(const m2d_results *s, const m2d_results *r, const ablation_spec *sp, const int *rows, int n) {
    char ref[32];
    reference_of(r, sp->axis, ref, sizeof ref);
    for (int i = 0; i < n; i++)
        if (!strcmp(m2d_results_get(s, rows[i], sp->axis), ref)) return rows[i];
    return rows[0];
}

/* a row's label: "8 (default)", "64 (all)", or the loss' name in the paper */
static char *axis_label(const m2d_results *s, const m2d_results *r, const ablation_spec *sp, int i) {
    const char *v = m2d_results_get(s, i, sp->axis);
    if (sp == &TABLE5) return m2d_strdup(loss_rank(v) < (int)M2D_ARRAY_LEN(LOSSES) ? LOSSES[loss_rank(v)].label : v);
    int E, k;
    teacher_shape(r, &E, &k);
    int kp = atoi(v);
    return m2d_strfmt("%s%s", v, kp == k ? " (default)" : kp == E ? " (all)" : "");
}

/* a signed difference, empty on the base row or when either side is missing */
static char *delta(double v, double base, int is_base, const char *fmt) {
    return is_base || !isfinite(v) || !isfinite(base) ? m2d_strdup("") : m2d_strfmt(fmt, v - base);
}

/* one line of the table: the cells of sidecar row I (BASE: the deltas' row) into CELLS */
static int ablation_cells(const m2d_results *s, const m2d_results *r, const ablation_spec *sp, int i, int base,
                          char **cells) {
    int j = 0, mc = m2d_results_col(s, "mc_avg") >= 0;
    char ppl[32];
    m2d_report_format_ppl(cell_num(s, i, "distill_ppl"), ppl, sizeof ppl);
    cells[j++] = axis_label(s, r, sp, i);
    cells[j++] = m2d_strdup(ppl);
    for (int b = 0; b < N_BENCH; b++)
        if (has_bench(s, b)) cells[j++] = pct(bench_acc(s, i, "teacher_mc", BENCH[b].task));
    if (mc) cells[j++] = pct(cell_num(s, i, "mc_avg"));
    cells[j++] = delta(cell_num(s, i, "distill_ppl"), cell_num(s, base, "distill_ppl"), i == base, "%+.2f");
    if (mc) cells[j++] = delta(100 * cell_num(s, i, "mc_avg"), 100 * cell_num(s, base, "mc_avg"), i == base, "%+.2f");
    return j;
}

/* the student of configuration ID in the main results R: "scoring/grouping/scaling K=N" */
static char *student_label(const m2d_results *r, const char *id) {
    for (int i = 0; i < r->n_rows; i++)
        if (!strcmp(m2d_results_get(r, i, "config_id"), id))
            return m2d_strfmt("%s / %s / %s, K = %s", m2d_report_display_name(m2d_results_get(r, i, "scoring")),
                              m2d_report_display_name(m2d_results_get(r, i, "grouping")),
                              m2d_report_display_name(m2d_results_get(r, i, "scaling")), m2d_results_get(r, i, "K"));
    return m2d_strdup(id);
}

/* the table of one student (configuration ID); csv: one table for all, the student in front */
static void ablation_table(const m2d_results *s, const m2d_results *r, const ablation_spec *sp, const char *id,
                           int first, const m2d_report_out *o) {
    int *rows = m2d_malloc((size_t)(s->n_rows + 1) * sizeof *rows), n = ablation_rows(s, r, sp, id, rows);
    int csv = o->fmt == M2D_REPORT_CSV, mc = m2d_results_col(s, "mc_avg") >= 0, nc = 0;
    const char *head[4 + N_BENCH + 3];
    if (csv) head[nc++] = "config_id";
    head[nc++] = sp->head, head[nc++] = "PPL";
    for (int b = 0; b < N_BENCH; b++)
        if (has_bench(s, b)) head[nc++] = BENCH[b].head;
    if (mc) head[nc++] = "Avg (%)";
    head[nc++] = "Δ PPL";
    if (mc) head[nc++] = "Δ Avg (pp)";
    char *label = student_label(r, id), **cells = m2d_calloc((size_t)nc, sizeof *cells);
    if (!csv) fprintf(o->f, o->fmt == M2D_REPORT_MD ? "\nStudent: %s\n\n" : "\n%% student: %s\n", label);
    if (!csv || first) m2d_report_header(o, head, nc, 1 + csv);
    for (int i = 0; i < n; i++) {
        int k = csv;
        if (csv) cells[0] = m2d_strdup(id);
        k += ablation_cells(s, r, sp, rows[i], delta_base(s, r, sp, rows, n), cells + csv);
        m2d_report_cells(o, (const char *const *)cells, k, NULL);
        for (int c = 0; c < k; c++) free(cells[c]);
    }
    if (!csv) m2d_report_end(o);
    free(cells), free(label), free(rows);
}

int m2d_report_ablation_write(const char *results_path, const m2d_results *r, int table, m2d_report_format fmt,
                              FILE *f) {
    const ablation_spec *sp = table == 4 ? &TABLE4 : &TABLE5;
    char *side = m2d_strfmt("%s.distill.csv", results_path);
    m2d_results s;
    int rc = m2d_results_read_checked(side, &s), have = rc == 0;
    if (rc == 0 && (m2d_results_col(&s, "loss") < 0 || m2d_results_col(&s, "teacher_topk") < 0))
        rc = m2d_err("%s: field '%s': column missing (not a distillation ablation: give [distill] loss or "
                     "teacher_topk a list)", side, m2d_results_col(&s, "loss") < 0 ? "loss" : "teacher_topk");
    m2d_report_out o = {fmt, f};
    if (rc == 0 && fmt != M2D_REPORT_CSV) fprintf(f, fmt == M2D_REPORT_MD ? "%s\n" : "%% %s\n", sp->caption);
    for (int i = 0, first = 1; rc == 0 && i < s.n_rows; i++) {
        const char *id = m2d_results_get(&s, i, "config_id");
        int seen = 0;
        for (int j = 0; j < i && !seen; j++) seen = !strcmp(m2d_results_get(&s, j, "config_id"), id);
        if (!seen) ablation_table(&s, r, sp, id, first, &o), first = 0;
    }
    if (have) m2d_results_free(&s);
    free(side);
    return rc;
}
