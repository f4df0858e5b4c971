/* report_distill — the distillation section of a report and its plot data (see report_distill.h). */
#include "sweep/report_distill.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

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

/* distinct values of column COL over ROWS, in order of appearance */
static int distinct(const m2d_results *r, const int *rows, int n, const char *col, const char **vals) {
    int k = 0;
    for (int i = 0; i < n; i++) {
        const char *v = m2d_results_get(r, rows[i], col);
        int seen = 0;
        for (int j = 0; j < k && !seen; j++) seen = !strcmp(vals[j], v);
        if (!seen) vals[k++] = v;
    }
    return k;
}

/* Table 12 layout: rows scoring, columns grouping; the cell is VALUE of the pair's distilled
 * student with the lowest post-distillation PPL (SCALE 100: percent) */
static void matrix(const m2d_results *r, const int *rows, int n, const m2d_report_out *o, const char *value, double scale,
                   const char *title) {
    const char **sc = m2d_calloc((size_t)n + 1, sizeof *sc), **gr = m2d_calloc((size_t)n + 1, sizeof *gr);
    int ns = distinct(r, rows, n, "scoring", sc), ng = distinct(r, rows, n, "grouping", gr);
    char **cells = m2d_calloc((size_t)ng + 1, sizeof *cells);
    fprintf(o->f, o->fmt == M2D_REPORT_MD ? "\n%s\n\n" : "\n%% %s\n", title);
    cells[0] = m2d_strdup("Scoring");
    for (int g = 0; g < ng; g++) cells[g + 1] = m2d_strdup(m2d_report_display_name(gr[g]));
    m2d_report_header(o, (const char *const *)cells, ng + 1, 1);
    for (int s = 0; s < ns; s++) {
        for (int g = 0; g <= ng; g++) free(cells[g]);
        cells[0] = m2d_strdup(m2d_report_display_name(sc[s]));
        for (int g = 0; g < ng; g++) {
            int best = -1;
            for (int i = 0; i < n; i++)
                if (!strcmp(m2d_results_get(r, rows[i], "scoring"), sc[s]) &&
                    !strcmp(m2d_results_get(r, rows[i], "grouping"), gr[g]) &&
                    (best < 0 || cell_num(r, rows[i], "distill_ppl") < cell_num(r, best, "distill_ppl")))
                    best = rows[i];
            double v = best >= 0 ? cell_num(r, best, value) : NAN;
            char buf[32] = "";
            if (isfinite(v) && scale == 1) m2d_report_format_ppl(v, buf, sizeof buf);
            else if (isfinite(v)) snprintf(buf, sizeof buf, "%.1f", v * scale);
            cells[g + 1] = m2d_strdup(buf);
        }
        m2d_report_cells(o, (const char *const *)cells, ng + 1, NULL);
    }
    m2d_report_end(o);
    for (int g = 0; g <= ng; g++) free(cells[g]);
    free(cells), free(sc), free(gr);
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

int m2d_report_distill_write(const m2d_results *r, m2d_report_format fmt, FILE *f) {
    int *rows, n = m2d_report_distilled_rows(r, 1, &rows), *all, n_all = m2d_report_distilled_rows(r, 0, &all);
    if (n > 0 && fmt != M2D_REPORT_CSV) {
        m2d_report_out o = {fmt, f};
        const char *exp = m2d_results_meta(r, "experiment");
        if (fmt == M2D_REPORT_MD)
            fprintf(f, "\n## After distillation%s%s\n\n%d distilled student(s). Table 12 layout: per scoring x "
                       "grouping, the distilled student with the lowest post-distillation PPL.\n",
                    exp ? " — experiment " : "", exp ? exp : "", n);
        else
            fprintf(f, "\n%% After distillation: %d distilled student(s); per scoring x grouping the one with the "
                       "lowest post-distillation PPL\n", n);
        int with_mc = m2d_results_col(r, "mc_avg") >= 0;
        /* every row of a distilled student: configurations that share it fill their own cells */
        if (with_mc) matrix(r, all, n_all, &o, "mc_avg", 100, "Multiple-choice average (%), distilled students:");
        matrix(r, all, n_all, &o, "distill_ppl", 1, "WikiText-2 perplexity, distilled students:");
        details(r, rows, n, with_mc, &o);
    }
    free(rows), free(all);
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
