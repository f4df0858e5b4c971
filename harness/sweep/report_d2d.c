/* report_d2d — the MoE-to-dense against dense-to-dense comparison (Tables 3 and 13, Figure 1's
 * data) of a sweep with D2D candidates (see report_d2d.h). */
#include "sweep/report_d2d.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "convert/prune.h"
#include "sweep/report_distill.h"
#include "sweep/sweep_d2d.h"

/* One student (or teacher) of Table 3. */
typedef struct {
    char label[160];
    const char *teacher;    /* what it was distilled from: "MoE", "dense"; "" for a teacher */
    double params, pre, post, step, tstep;
    double acc[M2D_REPORT_MAX_ACC]; /* the paper's benchmarks the file has, then the MC average
                                     * (m2d_report_acc_heads), on the distilled student */
    int n_acc;
    int is_teacher;         /* a teacher row: an absent accuracy shows as an em dash */
} t3_row;


static double num(const m2d_results *r, int i, const char *col) {
    const char *v = m2d_results_get(r, i, col);
    return *v ? strtod(v, NULL) : NAN;
}

static int ok_row(const m2d_results *r, int i) { return !strcmp(m2d_results_get(r, i, "status"), "ok"); }

static int is_baseline(const char *scoring) { return !strcmp(scoring, "random-ffn") || !strcmp(scoring, "random-init"); }

/* a converted dense student of the MoE teacher (not a baseline, not D2D, not an MoE target) */
static int converted_row(const m2d_results *r, int i) {
    const char *target = m2d_results_get(r, i, "target");
    return ok_row(r, i) && !m2d_d2d_is_row(r, i) && !is_baseline(m2d_results_get(r, i, "scoring")) &&
           (!*target || !strcmp(target, "dense"));
}

/* The paper's rule for the student a post-distillation table shows: a distilled row before one
 * that was not, then the lowest PPL before distillation (never the best after it: that would pick
 * the winner on the split it reports). 1 when row I beats row BEST (-1: none yet). */
static int selected_before(const m2d_results *r, int i, int best) {
    if (best < 0) return 1;
    int di = isfinite(num(r, i, "distill_ppl")), db = isfinite(num(r, best, "distill_ppl"));
    return di != db ? di > db : num(r, i, "ppl") < num(r, best, "ppl");
}

/* a row at K = k: the header's k (teacher=... k=), else the K expression "k" */
static int at_k(const m2d_results *r, int i, int k) {
    return k > 0 ? atoi(m2d_results_get(r, i, "K")) == k : !strcmp(m2d_results_get(r, i, "K_expr"), "k");
}

/* the selected ok row of SCORING (at K = k when K_ONLY); -1 when none */
static int find_scoring(const m2d_results *r, const char *scoring, int k_only) {
    int best = -1, k = 0;
    if (k_only) m2d_report_teacher_shape(r, &k);
    for (int i = 0; i < r->n_rows; i++) {
        if (!ok_row(r, i) || strcmp(m2d_results_get(r, i, "scoring"), scoring)) continue;
        if (k_only && !at_k(r, i, k)) continue;
        if (isfinite(num(r, i, "ppl")) && selected_before(r, i, best)) best = i;
    }
    return best;
}

/* the selected converted student of the grid (distilled first, then the lowest PPL before) */
static int best_of_grid(const m2d_results *r) {
    int best = -1;
    for (int i = 0; i < r->n_rows; i++)
        if (converted_row(r, i) && isfinite(num(r, i, "ppl")) && selected_before(r, i, best)) best = i;
    return best;
}

static void from_row(const m2d_results *r, int i, const char *teacher, t3_row *t) {
    t->teacher = teacher;
    t->is_teacher = 0;
    t->params = num(r, i, "n_params"), t->pre = num(r, i, "ppl"), t->post = num(r, i, "distill_ppl");
    t->n_acc = m2d_report_acc_values(r, i, t->acc);
    t->step = num(r, i, "distill_step_s"), t->tstep = num(r, i, "distill_teacher_s");
}

/* the teachers' rows from the run header: "teacher_ppl=P windows=W params=N" and
 * "d2d_teacher_ppl=P windows=W params=N layers=L teacher=DIR" (params absent in older files), their
 * accuracies from MC_KEY (teacher_mc=, d2d_teacher_mc=: "arc_easy_acc_norm:A,...,mc_avg:A") */
static int teacher_row(const m2d_results *r, const char *key, const char *mc_key, const char *label, t3_row *t) {
    const char *v = m2d_results_meta(r, key);
    double ppl;
    int windows;
    long long params = 0;
    if (!v || sscanf(v, "%lf windows=%d params=%lld", &ppl, &windows, &params) < 2) return 0;
    memset(t, 0, sizeof *t);
    snprintf(t->label, sizeof t->label, "%s", label);
    t->teacher = "";
    t->params = params > 0 ? (double)params : NAN, t->pre = ppl;
    t->post = t->step = t->tstep = NAN;
    t->n_acc = m2d_report_teacher_acc_values(r, mc_key, t->acc);
    t->is_teacher = 1;
    return 1;
}

/* what makes rows one student: the fingerprint, else (a file without one) the config id */
static const char *student_key(const m2d_results *r, int i) {
    const char *fp = m2d_results_get(r, i, "fingerprint");
    return *fp ? fp : m2d_results_get(r, i, "config_id");
}

/* Table 6's converted students besides DO-ACP at K = k (row SKIP): every distilled one, one row per
 * student (fingerprint), labelled with its configuration */
static int t6_converted(const m2d_results *r, int skip, t3_row *t) {
    int n = 0;
    for (int i = 0; i < r->n_rows; i++) {
        if (!converted_row(r, i) || !isfinite(num(r, i, "distill_ppl"))) continue;
        int seen = skip >= 0 && !strcmp(student_key(r, i), student_key(r, skip));
        for (int j = 0; j < i && !seen; j++)
            seen = converted_row(r, j) && isfinite(num(r, j, "distill_ppl")) && !strcmp(student_key(r, i), student_key(r, j));
        if (seen) continue;
        snprintf(t[n].label, sizeof t[n].label, "%s, K = %s (%s/%s)", m2d_report_display_name(m2d_results_get(r, i, "scoring")),
                 m2d_results_get(r, i, "K"), m2d_results_get(r, i, "grouping"), m2d_results_get(r, i, "scaling"));
        from_row(r, i, "MoE", &t[n++]);
    }
    return n;
}

/* The rows of Table TABLE (3 or 6) of R into T (room for n_rows + 5); returns the count. Table 6
 * lists every distilled converted student where Table 3 has the best of the grid. */
static int t3_rows(const m2d_results *r, int table, t3_row *t) {
    int n = 0, i, doacp;
    if ((i = doacp = find_scoring(r, "do-acp", 1)) >= 0)
        snprintf(t[n].label, sizeof t[n].label, "MoE-to-dense DO-ACP, K = k"), from_row(r, i, "MoE", &t[n++]);
    if (table == 6) n += t6_converted(r, doacp, t + n);
    else if ((i = best_of_grid(r)) >= 0) {
        snprintf(t[n].label, sizeof t[n].label, "MoE-to-dense, best of the grid (%s/%s/%s, K = %s)",
                 m2d_results_get(r, i, "scoring"), m2d_results_get(r, i, "grouping"), m2d_results_get(r, i, "scaling"),
                 m2d_results_get(r, i, "K"));
        from_row(r, i, "MoE", &t[n++]);
    }
    if ((i = m2d_d2d_best_row(r)) >= 0) {
        snprintf(t[n].label, sizeof t[n].label, "D2D pruning (%s)", m2d_d2d_spec(m2d_results_get(r, i, "params")));
        from_row(r, i, "dense", &t[n++]);
    }
    if ((i = find_scoring(r, "random-ffn", 0)) >= 0)
        snprintf(t[n].label, sizeof t[n].label, "Random FFN + teacher attn"), from_row(r, i, "MoE", &t[n++]);
    if ((i = find_scoring(r, "random-init", 0)) >= 0)
        snprintf(t[n].label, sizeof t[n].label, "Random initialization"), from_row(r, i, "MoE", &t[n++]);
    n += teacher_row(r, "teacher_ppl", "teacher_mc", "Teacher (MoE)", &t[n]);
    n += teacher_row(r, "d2d_teacher_ppl", "d2d_teacher_mc", "D2D teacher (dense)", &t[n]);
    return n;
}

/* ---- cells ---- */

/* an integer with thousands separators ("" for NaN) */
static void fmt_count(double v, char *buf, size_t n) {
    if (isfinite(v)) m2d_report_thousands(llround(v), buf, n);
    else snprintf(buf, n, "%s", "");
}

static void fmt_fixed(double v, const char *f, char *buf, size_t n) {
    if (isfinite(v)) snprintf(buf, n, f, v);
    else snprintf(buf, n, "%s", "");
}

/* 1 when some row has the accuracy of column A */
static int any_acc(const t3_row *t, int n, int a) {
    for (int i = 0; i < n; i++)
        if (a < t[i].n_acc && isfinite(t[i].acc[a])) return 1;
    return 0;
}

/* one row's cells (the accuracies of the columns WITH_ACC marks); CSV: raw numbers */
static int t3_cells(const t3_row *t, const int *with_acc, int n_acc, m2d_report_format fmt, char cells[][64],
                    const char **p) {
    int raw = fmt == M2D_REPORT_CSV;
    int j = 0;
    snprintf(cells[j++], 64, "%s", "");
    p[0] = t->label;
    snprintf(cells[j++], 64, "%s", t->teacher);
    if (raw) {
        fmt_fixed(t->params, "%.0f", cells[j++], 64), fmt_fixed(t->pre, "%.4f", cells[j++], 64);
        fmt_fixed(t->post, "%.4f", cells[j++], 64);
    } else {
        fmt_count(t->params, cells[j++], 64), m2d_report_format_ppl(t->pre, cells[j++], 64);
        if (isfinite(t->post)) m2d_report_format_ppl(t->post, cells[j++], 64);
        else snprintf(cells[j++], 64, "%s", "");
    }
    for (int a = 0; a < n_acc; a++) {
        if (!with_acc[a]) continue;
        double v = a < t->n_acc ? t->acc[a] : NAN;
        if (t->is_teacher && !raw) m2d_report_format_teacher_acc(v, fmt, cells[j++], 64);
        else fmt_fixed(raw ? v : 100 * v, raw ? "%.6f" : "%.2f", cells[j++], 64);
    }
    fmt_fixed(t->step, raw ? "%.4f" : "%.2f", cells[j++], 64);
    fmt_fixed(t->tstep, raw ? "%.4f" : "%.2f", cells[j++], 64);
    for (int i = 1; i < j; i++) p[i] = cells[i];
    return j;
}

/* Table 6's line above Table 3's: the extended budget, from the distilled rows' distill_tokens */
static void t6_caption(const m2d_results *r, m2d_report_format fmt, FILE *f) {
    long long tokens = 0;
    for (int i = 0; i < r->n_rows && !tokens; i++) tokens = atoll(m2d_results_get(r, i, "distill_tokens"));
    char t[32] = "(not recorded)";
    if (tokens > 0) m2d_report_thousands(tokens, t, sizeof t);
    fprintf(f, fmt == M2D_REPORT_MD ? "Paper Table 6 (extended training, ~4B tokens there): the Table 3 comparison; "
                                      "distillation tokens per student: %s.\n\n"
                                    : "%% Paper Table 6 (extended training): the Table 3 comparison; tokens per "
                                      "student: %s\n",
            t);
}

enum { T3_COLS = 7 + M2D_REPORT_MAX_ACC };

static void write_t3(const m2d_results *r, const t3_row *t, int n, m2d_report_format fmt, FILE *f) {
    m2d_report_out o = {fmt, f};
    int raw = fmt == M2D_REPORT_CSV, with_acc[M2D_REPORT_MAX_ACC];
    /* the paper's benchmark columns (Wino ... MMLU, Avg) that some row has, as in the paper's Table 3 */
    const char *acc_head[M2D_REPORT_MAX_ACC];
    int n_acc = m2d_report_acc_heads(r, acc_head);
    const char *head_md[] = {"Student", "Distilled from", "Params", "PPL before", "PPL after", "s / step",
                             "teacher s / step"};
    const char *head_csv[] = {"student", "teacher", "params", "ppl_before", "ppl_after", "step_s", "teacher_s"};
    const char *head[T3_COLS];
    int nh = 0;
    for (int i = 0; i < 5; i++) head[nh++] = raw ? head_csv[i] : head_md[i];
    for (int a = 0; a < n_acc; a++)
        if ((with_acc[a] = any_acc(t, n, a)))
            head[nh++] = !strcmp(acc_head[a], "Avg") ? (raw ? "mc_avg" : "MC avg (%)") : acc_head[a];
    for (int i = 5; i < 7; i++) head[nh++] = raw ? head_csv[i] : head_md[i];
    if (!raw) {
        const char *exp = m2d_results_meta(r, "experiment"), *ppl = m2d_results_meta(r, "ppl");
        fprintf(f, "## MoE-to-dense vs dense-to-dense (paper Table 3 / Figure 1 layout) — experiment %s — %s\n\n",
                exp ? exp : "?", ppl ? ppl : "");
        fprintf(f, "PPL before/after: WikiText-2 (the experiment's [ppl]) of the student as converted or pruned, and "
                   "after the same distillation (same settings, data and tokens) from the teacher it names; teachers: "
                   "their own PPL on the same windows and MC on the same tasks (— where not measured). s / step: mean wall seconds of one optimizer step, teacher s "
                   "/ step: of the teacher's forward in it (its LM head runs inside the loss, not counted), both "
                   "measured in this run on this machine.\n\n");
    }
    m2d_report_header(&o, head, nh, 2);
    for (int i = 0; i < n; i++) {
        char cells[T3_COLS][64];
        const char *p[T3_COLS];
        int nc = t3_cells(&t[i], with_acc, n_acc, fmt, cells, p);
        m2d_report_cells(&o, p, nc, NULL);
    }
    m2d_report_end(&o);
}

/* ---- Table 13 ---- */

/* the dense teacher's layers from the run header (0 when the file does not say) */
static int dense_layers(const m2d_results *r) {
    const char *v = m2d_results_meta(r, "d2d_teacher_ppl");
    const char *l = v ? strstr(v, " layers=") : NULL;
    return l ? atoi(l + 8) : 0;
}

static const char *strategy(const char *spec, int layers) {
    m2d_prune_shape s;
    if (!layers || m2d_prune_shape_parse(spec, &s)) return m2d_err_clear(), "";
    return !s.layers || s.layers == layers ? "width-only" : "width + depth";
}

static void write_t13(const m2d_results *r, m2d_report_format fmt, FILE *f) {
    m2d_report_out o = {fmt, f};
    int best = m2d_d2d_best_row(r), layers = dense_layers(r);
    fprintf(f, "\n## D2D architecture search (paper Table 13 layout)\n\nCandidates pruned from the dense teacher "
               "(Minitron importance), scored before distillation; the one with the lowest PPL (bold) is the "
               "one distilled.\n\n");
    const char *head[] = {"Candidate", "Strategy", "Params", "PPL before", "Selected"};
    m2d_report_header(&o, head, 5, 2);
    for (int i = 0; i < r->n_rows; i++) {
        if (!m2d_d2d_is_row(r, i)) continue;
        const char *spec = m2d_d2d_spec(m2d_results_get(r, i, "params"));
        char params[32], ppl[32];
        fmt_count(num(r, i, "n_params"), params, sizeof params);
        m2d_report_format_ppl(ok_row(r, i) ? num(r, i, "ppl") : NAN, ppl, sizeof ppl);
        const char *cells[] = {spec, strategy(spec, layers), params, ppl, i == best ? "yes" : ""};
        unsigned char bold[] = {i == best, 0, 0, i == best, 0};
        m2d_report_cells(&o, cells, 5, bold);
    }
    m2d_report_end(&o);
}

static int has_d2d(const m2d_results *r) {
    for (int i = 0; i < r->n_rows; i++)
        if (m2d_d2d_is_row(r, i)) return 1;
    return 0;
}

int m2d_report_d2d_write(const m2d_results *r, int table, m2d_report_format fmt, FILE *f) {
    if (!has_d2d(r))
        return m2d_err("%s: --table %d: no D2D candidates (scoring \"d2d\": an experiment with a [d2d] block)",
                       m2d_results_name(r), table);
    t3_row *t = m2d_calloc((size_t)r->n_rows + 5, sizeof *t);
    int n = t3_rows(r, table, t);
    if (table == 6 && fmt != M2D_REPORT_CSV) t6_caption(r, fmt, f);
    write_t3(r, t, n, fmt, f);
    if (fmt != M2D_REPORT_CSV) write_t13(r, fmt, f);
    free(t);
    return 0;
}

/* a number for gnuplot ("NaN" where absent) */
static void put_num(FILE *f, double v) {
    if (isfinite(v)) fprintf(f, " %.6g", v);
    else fprintf(f, " NaN");
}

int m2d_report_d2d_plot_data(const m2d_results *r, const char *dir) {
    if (!has_d2d(r)) return 0;
    t3_row *t = m2d_calloc((size_t)r->n_rows + 5, sizeof *t);
    int n = t3_rows(r, 3, t);
    m2d_report_file pf, hf;
    FILE *f = m2d_report_file_open(&pf, dir, "figure1.dat");
    fprintf(f, "# label params ppl_before ppl_after mc_avg step_s\n");
    int have_mc = 0;
    for (int i = 0; i < n; i++) {
        fprintf(f, "\"");
        for (const char *c = t[i].label; *c; c++) fputc(*c == '"' || *c == '\\' ? '\'' : *c, f);
        fprintf(f, "\"");
        double avg = t[i].n_acc > 0 && m2d_results_col(r, "mc_avg") >= 0 ? t[i].acc[t[i].n_acc - 1] : NAN;
        const double v[] = {t[i].params, t[i].pre, t[i].post, avg, t[i].step};
        for (int k = 0; k < 5; k++) put_num(f, v[k]);
        fprintf(f, "\n");
        have_mc |= isfinite(avg);
    }
    free(t);
    /* whether the accuracy panel (the paper's Figure 1, left) has a bar: gnuplot stops on a column
     * without a number */
    FILE *h = m2d_report_file_open(&hf, dir, "figure1.txt");
    fprintf(h, "%d\n", have_mc);
    int rc = m2d_report_file_close(&pf);
    return m2d_report_file_close(&hf) ? -1 : rc;
}
