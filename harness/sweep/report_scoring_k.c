/* report_scoring_k — Tables 8, 16, 17 and Figure 7: per scoring, the students at K = k and K = 2k
 * (see report_scoring_k.h). */
#include "sweep/report_scoring_k.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "sweep/report_distill.h"
#include "sweep/sweep_d2d.h"

static double num(const m2d_results *r, int i, const char *col) {
    const char *v = m2d_results_get(r, i, col);
    return v && *v ? strtod(v, NULL) : NAN;
}

static int is_baseline(const char *s) { return !strcmp(s, "random-ffn") || !strcmp(s, "random-init"); }

/* 0 for a row at K = k, 1 at K = 2k, -1 otherwise (K from the header's k; without one, K_expr) */
static int k_slot(const m2d_results *r, int i, int k) {
    if (k > 0) {
        int K = atoi(m2d_results_get(r, i, "K"));
        return K == k ? 0 : K == 2 * k ? 1 : -1;
    }
    const char *e = m2d_results_get(r, i, "K_expr");
    return !strcmp(e, "k") ? 0 : !strcmp(e, "2k") ? 1 : -1;
}

/* a row that may be selected: a dense student (not D2D, not an MoE target), ok, finite PPL */
static int candidate(const m2d_results *r, int i) {
    const char *target = m2d_results_get(r, i, "target");
    return !strcmp(m2d_results_get(r, i, "status"), "ok") && isfinite(num(r, i, "ppl")) && !m2d_d2d_is_row(r, i) &&
           (!*target || !strcmp(target, "dense"));
}

/* the distinct scorings of R's candidate rows in the report's order -> OUT (pointers into R) */
static int scorings_of(const m2d_results *r, const char **out) {
    int n = 0;
    for (int i = 0; i < r->n_rows; i++) {
        const char *s = m2d_results_get(r, i, "scoring");
        int seen = 0;
        for (int j = 0; j < n && !seen; j++) seen = !strcmp(out[j], s);
        if (seen || !candidate(r, i)) continue;
        int pos = n++;
        for (; pos > 0 && m2d_report_name_order(out[pos - 1]) > m2d_report_name_order(s); pos--) out[pos] = out[pos - 1];
        out[pos] = s;
    }
    return n;
}

/* the selected row of SCORING at slot SLOT (0: K = k, 1: 2k), -1 when none */
static int best_row(const m2d_results *r, const char *scoring, int slot, int k) {
    int best = -1;
    for (int i = 0; i < r->n_rows; i++)
        if (candidate(r, i) && !strcmp(m2d_results_get(r, i, "scoring"), scoring) && k_slot(r, i, k) == slot &&
            (best < 0 || num(r, i, "ppl") < num(r, best, "ppl")))
            best = i;
    return best;
}

int m2d_report_best_per_scoring_K(const m2d_results *r, int **rows) {
    static const char *const need[] = {"config_id", "scoring", "K", "ppl", "status"};
    *rows = NULL;
    for (size_t i = 0; i < M2D_ARRAY_LEN(need); i++)
        if (m2d_results_col(r, need[i]) < 0) return m2d_err("%s: field '%s': column missing", m2d_results_name(r), need[i]);
    int k;
    m2d_report_teacher_shape(r, &k);
    const char **sc = m2d_calloc((size_t)r->n_rows + 1, sizeof *sc);
    int n_sc = scorings_of(r, sc), n = 0;
    *rows = m2d_malloc((size_t)(2 * n_sc + 1) * sizeof **rows);
    for (int s = 0; s < n_sc; s++)
        for (int slot = 0; slot < 2; slot++) {
            int i = best_row(r, sc[s], slot, k);
            if (i >= 0) (*rows)[n++] = i;
        }
    free(sc);
    return n;
}

void m2d_report_write_rows(const m2d_results *r, const int *rows, int n, FILE *f) {
    for (int i = 0; i < n; i++)
        fprintf(f, "%s %s %s %s K=%s ppl=%s\n", m2d_results_get(r, rows[i], "config_id"),
                m2d_results_get(r, rows[i], "scoring"), m2d_results_get(r, rows[i], "grouping"),
                m2d_results_get(r, rows[i], "scaling"), m2d_results_get(r, rows[i], "K"),
                m2d_results_get(r, rows[i], "ppl"));
}

/* ---- the table's lines ---- */

/* One line: a selected row (I >= 0) or the teacher (I < 0); its numbers, PPL and accuracies. */
typedef struct {
    int i, baseline, first_of_scoring, n_of_scoring;
    double pre, post, acc[M2D_REPORT_MAX_ACC];
} line;

/* the lines of R: scorings (K = k, 2k), then the baselines at one K, then (WITH_TEACHER) the
 * teacher -> L (room for 2 x rows + 1); returns the count */
static int lines_of(const m2d_results *r, const int *rows, int n, int with_teacher, line *l) {
    int m = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int q = 0; q < n; q++) {
            const char *s = m2d_results_get(r, rows[q], "scoring");
            int prev = q > 0 && !strcmp(s, m2d_results_get(r, rows[q - 1], "scoring"));
            if (is_baseline(s) != pass || (pass && prev)) continue; /* a baseline's K = k row, else its 2k */
            line *x = &l[m++];
            memset(x, 0, sizeof *x);
            x->i = rows[q], x->baseline = pass, x->first_of_scoring = !prev;
            x->pre = num(r, x->i, "ppl"), x->post = num(r, x->i, "distill_ppl");
            m2d_report_acc_values(r, x->i, x->acc);
            if (prev) l[m - 2].n_of_scoring = 2, x->n_of_scoring = 2;
            else x->n_of_scoring = 1;
        }
    double ppl;
    int windows;
    if (with_teacher && m2d_report_teacher_ppl(r, &ppl, &windows)) {
        line *x = &l[m++];
        memset(x, 0, sizeof *x);
        x->i = -1, x->pre = ppl, x->post = NAN;
        m2d_report_acc_values(r, -1, x->acc);
    }
    return m;
}

/* column C of line X: 0 the PPL after (lower is better), 1.. the accuracies (higher is better);
 * returned so that higher is better, NaN where absent */
static double score(const line *x, int c) { return c == 0 ? -x->post : x->acc[c - 1]; }

/* 1 when line A's column C is the best among the students of lines [FROM, TO) and some other one
 * has a value to compare with (ties: each is bold) */
static int is_best(const line *l, int a, int from, int to, int c) {
    double v = score(&l[a], c);
    int others = 0;
    if (!isfinite(v) || l[a].i < 0) return 0;
    for (int b = from; b < to; b++) {
        if (b == a || l[b].i < 0 || !isfinite(score(&l[b], c))) continue;
        if (score(&l[b], c) > v) return 0;
        others++;
    }
    return others > 0;
}

/* the bold flags of line A's columns 0..NC (Table 8: against its scoring's other row; 16/17: against
 * every student) */
static void bold_of(const line *l, int n, int a, int table, int nc, unsigned char *bold) {
    int from = 0, to = n;
    if (table == 8) {
        if (l[a].n_of_scoring < 2) return;
        from = l[a].first_of_scoring ? a : a - 1, to = from + 2;
    }
    for (int c = 0; c < nc; c++) bold[c] = (unsigned char)is_best(l, a, from, to, c);
}

static const char *row_name(const m2d_results *r, const line *x) {
    if (x->i < 0) return "Teacher (MoE)";
    const char *s = m2d_results_get(r, x->i, "scoring");
    if (!strcmp(s, "random-ffn")) return "Random FFN + teacher attn";
    if (!strcmp(s, "random-init")) return "Random initialization";
    return m2d_report_display_name(s);
}

/* an accuracy (fraction) as a percent cell; the teacher's absent ones as em dashes */
static void acc_text(double v, int teacher, m2d_report_format fmt, char *buf, size_t n) {
    if (teacher) m2d_report_format_teacher_acc(v, fmt, buf, n);
    else if (isfinite(v)) snprintf(buf, n, "%.2f", 100 * v);
    else snprintf(buf, n, "%s", "");
}

static void ppl_text(double v, m2d_report_format fmt, char *buf, size_t n) {
    if (!isfinite(v)) snprintf(buf, n, "%s", "");
    else if (fmt == M2D_REPORT_CSV) snprintf(buf, n, "%.4f", v);
    else m2d_report_format_ppl(v, buf, n);
}

/* line X's cells into CELLS (NA accuracies); csv adds config_id, grouping and scaling */
static int line_cells(const m2d_results *r, const line *x, int na, m2d_report_format fmt, char cells[][64]) {
    int j = 0, csv = fmt == M2D_REPORT_CSV, student = x->i >= 0;
    snprintf(cells[j++], 64, "%s", csv ? (student ? m2d_results_get(r, x->i, "scoring") : "teacher") : row_name(r, x));
    snprintf(cells[j++], 64, "%s", student && !x->baseline ? m2d_results_get(r, x->i, "K") : "");
    if (csv)
        for (int c = 0; c < 3; c++)
            snprintf(cells[j++], 64, "%s", student ? m2d_results_get(r, x->i, (const char *[]){"config_id", "grouping",
                                                                                            "scaling"}[c]) : "");
    ppl_text(x->pre, fmt, cells[j++], 64);
    ppl_text(x->post, fmt, cells[j++], 64);
    for (int a = 0; a < na; a++) acc_text(x->acc[a], !student && !csv, fmt, cells[j++], 64);
    return j;
}

static const char *model_name(const m2d_results *r) {
    const char *m = m2d_results_meta(r, "model"), *slash = m ? strrchr(m, '/') : NULL;
    return slash ? slash + 1 : m ? m : "?";
}

/* the caption: the paper's table, this file's teacher and experiment */
static void caption(const m2d_results *r, int table, m2d_report_format fmt, FILE *f) {
    static const char *const paper[] = {"Table 8 (App. L, the base teacher): distillation results at K = k (pure "
                                        "pruning) and K = 2k (merging); bold: the better K per scoring",
                                        "Table 16 (App. O, DeepSeek-V2-Lite): cross-model validation; bold: best per "
                                        "column",
                                        "Table 17 (App. O, GPT-OSS-20B): cross-model validation; bold: best per column"};
    int k, E = m2d_report_teacher_shape(r, &k);
    const char *exp = m2d_results_meta(r, "experiment");
    char *text = m2d_strfmt("%s. Here: teacher %s (E = %d, k = %d), experiment %s. Per scoring the configuration with "
                            "the lowest pre-distillation PPL at each K (distill.configs = \"best-per-scoring-K\"); "
                            "PPL before/after distillation on the experiment's [ppl] windows; accuracy in %%, each "
                            "task's paper metric, after distillation; empty: not distilled or not scored.",
                            paper[table == 8 ? 0 : table == 16 ? 1 : 2], model_name(r), E, k, exp ? exp : "?");
    if (fmt == M2D_REPORT_MD) fprintf(f, "%s\n\n", text);
    else if (fmt == M2D_REPORT_TEX) {
        fputs("% ", f);
        m2d_report_tex_escape(f, text);
        fputc('\n', f);
    }
    free(text);
}

/* under the table: which configuration each student is */
static void selected_note(const m2d_results *r, const line *l, int n, m2d_report_format fmt, FILE *f) {
    if (fmt == M2D_REPORT_CSV) return;
    fputs(fmt == M2D_REPORT_MD ? "\nSelected configurations:" : "% Selected configurations:", f);
    for (int q = 0; q < n; q++) {
        if (l[q].i < 0) continue;
        char *t = m2d_strfmt(" %s K=%s: %s/%s (%s)%s", m2d_results_get(r, l[q].i, "scoring"),
                             m2d_results_get(r, l[q].i, "K"), m2d_results_get(r, l[q].i, "grouping"),
                             m2d_results_get(r, l[q].i, "scaling"), m2d_results_get(r, l[q].i, "config_id"),
                             q + 1 < n && l[q + 1].i >= 0 ? ";" : ".");
        if (fmt == M2D_REPORT_TEX) m2d_report_tex_escape(f, t);
        else fputs(t, f);
        free(t);
    }
    fputc('\n', f);
}

int m2d_report_scoring_k_write(const m2d_results *r, int table, m2d_report_format fmt, FILE *f) {
    int *rows, n = m2d_report_best_per_scoring_K(r, &rows);
    if (n <= 0) {
        free(rows);
        return n < 0 ? -1 : m2d_err("%s: --table %d: no student at K = k or K = 2k with a finite PPL",
                                    m2d_results_name(r), table);
    }
    line *l = m2d_calloc((size_t)n + 1, sizeof *l);
    int m = lines_of(r, rows, n, table != 8, l), csv = fmt == M2D_REPORT_CSV;
    const char *head[7 + M2D_REPORT_MAX_ACC] = {"Scoring", "K"};
    int nh = 2;
    if (csv) head[nh++] = "config_id", head[nh++] = "grouping", head[nh++] = "scaling";
    head[nh++] = "Pre-distill PPL", head[nh++] = "Post-distill PPL";
    int na = m2d_report_acc_heads(r, head + nh);
    nh += na;
    caption(r, table, fmt, f);
    m2d_report_out o = {fmt, f};
    m2d_report_header(&o, head, nh, 1);
    for (int q = 0; q < m; q++) {
        char cells[7 + M2D_REPORT_MAX_ACC][64];
        const char *p[7 + M2D_REPORT_MAX_ACC];
        unsigned char bold[7 + M2D_REPORT_MAX_ACC] = {0}, b[1 + M2D_REPORT_MAX_ACC] = {0};
        int nc = line_cells(r, &l[q], na, fmt, cells);
        bold_of(l, m, q, table, 1 + na, b);
        memcpy(bold + nc - na - 1, b, (size_t)(1 + na)); /* the PPL after and the accuracies */
        for (int c = 0; c < nc; c++) p[c] = cells[c];
        m2d_report_cells(&o, p, nc, bold);
    }
    m2d_report_end(&o);
    selected_note(r, l, m, fmt, f);
    free(l), free(rows);
    return 0;
}

/* ---- Figure 7 ---- */

/* the MC average after distillation of the selected row of SCORING at SLOT, percent; NaN */
static double avg_at(const m2d_results *r, const int *rows, int n, const char *scoring, int slot, int k) {
    for (int q = 0; q < n; q++)
        if (!strcmp(m2d_results_get(r, rows[q], "scoring"), scoring) && k_slot(r, rows[q], k) == slot)
            return 100 * m2d_report_distilled_mc_avg(r, rows[q]);
    return NAN;
}

/* the random-FFN baseline's average (its K = k student, else 2k); NaN */
static double random_avg(const m2d_results *r, const int *rows, int n, int k) {
    double v = avg_at(r, rows, n, "random-ffn", 0, k);
    return isfinite(v) ? v : avg_at(r, rows, n, "random-ffn", 1, k);
}

/* the scorings of ROWS that are not baselines, in order -> OUT; the count */
static int fig7_scorings(const m2d_results *r, const int *rows, int n, const char **out) {
    int m = 0;
    for (int q = 0; q < n; q++) {
        const char *s = m2d_results_get(r, rows[q], "scoring");
        if (!is_baseline(s) && (m == 0 || strcmp(out[m - 1], s))) out[m++] = s;
    }
    return m;
}

static void fig7_text(double v, m2d_report_format fmt, char *buf, size_t n) {
    if (!isfinite(v)) snprintf(buf, n, "%s", "");
    else snprintf(buf, n, fmt == M2D_REPORT_CSV ? "%.4f" : "%.2f", v);
}

static void fig7_table(const m2d_results *r, const int *rows, int n, int k, m2d_report_format fmt, FILE *f) {
    m2d_report_out o = {fmt, f};
    const char **sc = m2d_calloc((size_t)n + 1, sizeof *sc);
    int m = fig7_scorings(r, rows, n, sc), csv = fmt == M2D_REPORT_CSV;
    char hk[48], h2k[48], v[2][32];
    snprintf(hk, sizeof hk, "K = %d (pure pruning)", k);
    snprintf(h2k, sizeof h2k, "K = %d (merging)", 2 * k);
    const char *head_md[] = {"Scoring", hk, h2k}, *head_csv[] = {"scoring", "K", "avg"};
    m2d_report_header(&o, csv ? head_csv : head_md, 3, 1);
    for (int s = 0; s < m; s++)
        for (int slot = 0; slot < 2; slot++) {
            fig7_text(avg_at(r, rows, n, sc[s], slot, k), fmt, v[slot], sizeof v[slot]);
            char K[16];
            snprintf(K, sizeof K, "%d", slot ? 2 * k : k);
            const char *cm[] = {m2d_report_display_name(sc[s]), v[0], v[1]}, *cc[] = {sc[s], K, v[slot]};
            if (csv) m2d_report_cells(&o, cc, 3, NULL);
            else if (slot) m2d_report_cells(&o, cm, 3, NULL);
        }
    fig7_text(random_avg(r, rows, n, k), fmt, v[0], sizeof v[0]);
    const char *rc[] = {"random-ffn", "", v[0]};
    if (csv) m2d_report_cells(&o, rc, 3, NULL);
    m2d_report_end(&o);
    if (!csv)
        fprintf(f, fmt == M2D_REPORT_MD ? "\nRandom FFN + teacher attn (the dashed line): %s%s\n"
                                        : "%% Random FFN + teacher attn (the dashed line): %s%s\n",
                *v[0] ? v[0] : "not measured", *v[0] ? " %" : "");
    free(sc);
}

int m2d_report_figure7_write(const m2d_results *r, m2d_report_format fmt, FILE *f) {
    int *rows, n = m2d_report_best_per_scoring_K(r, &rows), k;
    if (n < 0) return -1;
    int E = m2d_report_teacher_shape(r, &k);
    if (k <= 0) {
        free(rows);
        return m2d_err("report --figure 7: field 'teacher': the run header has no teacher=E=.. k=.. line");
    }
    if (fmt == M2D_REPORT_MD)
        fprintf(f, "Figure 7 (section 4.6) as a table: MC average after distillation (%%) by scoring and K, teacher "
                   "%s (E = %d, k = %d); per scoring and K the configuration with the lowest pre-distillation PPL.\n\n",
                model_name(r), E, k);
    else if (fmt == M2D_REPORT_TEX)
        fprintf(f, "%% Figure 7 as a table: MC average after distillation (%%) by scoring and K (k = %d)\n", k);
    fig7_table(r, rows, n, k, fmt, f);
    free(rows);
    return 0;
}

/* a quoted gnuplot title (data, never code: quotes and backslashes become ') */
static void put_label(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) fputc(*s == '"' || *s == '\\' ? '\'' : *s, f);
    fputc('"', f);
}

static void put_num(FILE *f, double v) {
    if (isfinite(v)) fprintf(f, " %.6g", v);
    else fputs(" NaN", f);
}

int m2d_report_figure7_plot_data(const m2d_results *r, const char *dir) {
    int *rows, n = m2d_report_best_per_scoring_K(r, &rows), k, any = 0;
    if (n < 0) return -1;
    m2d_report_teacher_shape(r, &k);
    const char **sc = m2d_calloc((size_t)n + 1, sizeof *sc);
    int m = fig7_scorings(r, rows, n, sc), rc = 0;
    /* a bar to draw: a scoring's average at K = k or 2k (the random FFN alone is only the line) */
    for (int s = 0; s < m && k > 0 && !any; s++)
        any = isfinite(avg_at(r, rows, n, sc[s], 0, k)) || isfinite(avg_at(r, rows, n, sc[s], 1, k));
    if (any) {
        m2d_report_file df, tf;
        FILE *d = m2d_report_file_open(&df, dir, "figure7.dat"), *t = m2d_report_file_open(&tf, dir, "figure7.txt");
        fprintf(d, "# scoring avg_K=k avg_K=2k (MC average after distillation, %%; NaN: absent)\n");
        double ra = random_avg(r, rows, n, k), lo = isfinite(ra) ? ra : INFINITY, hi = isfinite(ra) ? ra : -INFINITY;
        int have[2] = {0, 0};
        for (int s = 0; s < m; s++) {
            double a = avg_at(r, rows, n, sc[s], 0, k), b = avg_at(r, rows, n, sc[s], 1, k);
            put_label(d, m2d_report_display_name(sc[s]));
            put_num(d, a), put_num(d, b);
            fputc('\n', d);
            if (isfinite(a)) lo = fmin(lo, a), hi = fmax(hi, a), have[0] = 1;
            if (isfinite(b)) lo = fmin(lo, b), hi = fmax(hi, b), have[1] = 1;
        }
        /* the y range and the K with bars here: gnuplot stops a script on a column without a
         * number (every student at K = k only) */
        fprintf(t, "%d %d %d %.6g %.6g %.6g %d %d\n", k, 2 * k, isfinite(ra), isfinite(ra) ? ra : 0.0, lo, hi, have[0],
                have[1]);
        rc = m2d_report_file_close(&df);
        if (m2d_report_file_close(&tf)) rc = -1;
    }
    free(sc), free(rows);
    return rc;
}
