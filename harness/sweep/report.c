#include "sweep/report.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "sweep/report_distill.h"
#include "sweep/report_figure4.h"
#include "sweep/report_moe.h"
#include "sweep/report_usage.h"

/* ---- names and number formatting ---- */

/* position in the paper's order (ranked plugins first), else a large number */
static int known_order(const char *name) { return m2d_report_name_order(name); }

/* ---- the grid view of a results file ---- */

typedef struct {
    const char *scoring, *grouping, *scaling, *params;
    int K, failed, moe; /* moe: a smaller-MoE student (report_moe.h) */
    double ppl;
} entry;

typedef struct {
    int n;
    const char **v;
} names;

typedef struct {
    int n_e;
    entry *e;
    names sc, gr, sl, pa;
    int n_K;
    int *Ks;
} grid;

static int names_index(const names *s, const char *v) {
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->v[i], v) == 0) return i;
    return -1;
}

static void names_add(names *s, const char *v) {
    if (names_index(s, v) >= 0) return;
    s->v = m2d_realloc(s->v, (size_t)(s->n + 1) * sizeof *s->v);
    /* insert keeping the paper's order for known names, first appearance for the others */
    int pos = s->n;
    while (pos > 0 && known_order(s->v[pos - 1]) > known_order(v) && known_order(v) < 1000) pos--;
    memmove(s->v + pos + 1, s->v + pos, (size_t)(s->n - pos) * sizeof *s->v);
    s->v[pos] = v;
    s->n++;
}

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* The grid of R's rows; DENSE_ONLY: without the MoE students (report_moe.h), whose scaling and K
 * have no place in the dense table (the entries are then not in row order). */
static int grid_load(const m2d_results *r, grid *g, int dense_only) {
    memset(g, 0, sizeof *g);
    static const char *const need[] = {"config_id", "scoring", "grouping", "scaling", "K", "ppl", "status"};
    for (size_t i = 0; i < M2D_ARRAY_LEN(need); i++)
        if (m2d_results_col(r, need[i]) < 0) return m2d_err("%s: field '%s': column missing", m2d_results_name(r), need[i]);
    int c_sc = m2d_results_col(r, "scoring"), c_gr = m2d_results_col(r, "grouping"),
        c_sl = m2d_results_col(r, "scaling"), c_pa = m2d_results_col(r, "params"), c_K = m2d_results_col(r, "K"),
        c_ppl = m2d_results_col(r, "ppl"), c_st = m2d_results_col(r, "status");
    g->e = m2d_calloc((size_t)r->n_rows + 1, sizeof *g->e);
    for (int i = 0; i < r->n_rows; i++) {
        int moe = m2d_report_is_moe_row(r, i);
        if (dense_only && moe) continue;
        char **row = r->rows[i];
        entry *e = &g->e[g->n_e++];
        e->scoring = row[c_sc];
        e->grouping = row[c_gr];
        e->scaling = row[c_sl];
        e->params = c_pa >= 0 ? row[c_pa] : "";
        e->K = atoi(row[c_K]);
        e->moe = moe;
        e->failed = strncmp(row[c_st], "ok", 2) != 0;
        e->ppl = !e->failed && row[c_ppl][0] ? strtod(row[c_ppl], NULL) : NAN;
        if (!isfinite(e->ppl)) e->failed = 1;
        names_add(&g->sc, e->scoring);
        names_add(&g->gr, e->grouping);
        names_add(&g->sl, e->scaling);
        names_add(&g->pa, e->params);
        int seen = 0;
        for (int k = 0; k < g->n_K; k++) seen |= g->Ks[k] == e->K;
        if (!seen) {
            g->Ks = m2d_realloc(g->Ks, (size_t)(g->n_K + 1) * sizeof *g->Ks);
            g->Ks[g->n_K++] = e->K;
        }
    }
    if (g->Ks) qsort(g->Ks, (size_t)g->n_K, sizeof *g->Ks, cmp_int);
    return 0;
}

static void grid_free(grid *g) {
    free(g->e);
    free(g->sc.v);
    free(g->gr.v);
    free(g->sl.v);
    free(g->pa.v);
    free(g->Ks);
}

/* The entry for one cell (the last row wins if a file holds a configuration twice). */
static const entry *cell(const grid *g, const char *sc, const char *gr, const char *sl, const char *pa, int K) {
    const entry *found = NULL;
    for (int i = 0; i < g->n_e; i++) {
        const entry *e = &g->e[i];
        if (e->K == K && !strcmp(e->scoring, sc) && !strcmp(e->grouping, gr) && !strcmp(e->scaling, sl) &&
            !strcmp(e->params, pa))
            found = e;
    }
    return found;
}

static int row_present(const grid *g, const char *sc, const char *gr, const char *sl, const char *pa) {
    for (int k = 0; k < g->n_K; k++)
        if (cell(g, sc, gr, sl, pa, g->Ks[k])) return 1;
    return 0;
}

/* ---- table ---- */

static void put_name(FILE *f, m2d_report_format fmt, const char *s) {
    if (fmt == M2D_REPORT_TEX) m2d_report_tex_escape(f, s);
    else if (fmt == M2D_REPORT_CSV) m2d_report_csv_cell(f, s);
    else fputs(s, f);
}

/* index into g->Ks of the lowest finite PPL of a table row, -1 when none */
static int best_k(const grid *g, const char *sc, const char *gr, const char *sl, const char *pa) {
    int best = -1;
    double best_v = INFINITY;
    for (int k = 0; k < g->n_K; k++) {
        const entry *e = cell(g, sc, gr, sl, pa, g->Ks[k]);
        if (e && !e->failed && e->ppl < best_v) best_v = e->ppl, best = k;
    }
    return best;
}

static int header_teacher(const m2d_results *r, int *k) { return m2d_report_teacher_shape(r, k); }

/* " (= E)" after the K that is the teacher's expert count (every expert selected), else "" */
static const char *k_is_E(const m2d_results *r, int K) {
    int k;
    return K == header_teacher(r, &k) ? " (= E)" : "";
}

/* md: what the teacher row and K = E are, before the table */
static void table_legend(const m2d_results *r, FILE *f) {
    int k, E = header_teacher(r, &k), windows;
    double ppl;
    int have_ppl = m2d_report_teacher_ppl(r, &ppl, &windows);
    if (have_ppl)
        fprintf(f, "Teacher: the unconverted MoE, scored on the same %d window(s) as every student.\n", windows);
    if (E) fprintf(f, "K = %d is E, the teacher's expert count (every expert selected; k = %d).\n", E, k);
    if (have_ppl || E) fputc('\n', f);
}

/* The teacher row (md and tex): its PPL in every K column, the reference of each. */
static void teacher_row(const grid *g, const m2d_results *r, m2d_report_format fmt, int with_params, FILE *f) {
    double ppl;
    int windows, k, E = header_teacher(r, &k);
    if (fmt == M2D_REPORT_CSV || !m2d_report_teacher_ppl(r, &ppl, &windows)) return;
    char name[64], v[32];
    if (E) snprintf(name, sizeof name, "Teacher (MoE, E = %d, top-%d)", E, k);
    else snprintf(name, sizeof name, "Teacher (MoE)");
    m2d_report_format_ppl(ppl, v, sizeof v);
    int n = 3 + with_params + g->n_K, j = 0;
    const char **cells = m2d_calloc((size_t)n, sizeof *cells);
    cells[j++] = name;
    while (j < n - g->n_K) cells[j++] = ""; /* grouping, scaling (params) */
    while (j < n) cells[j++] = v;
    m2d_report_cells(&(m2d_report_out){fmt, f}, cells, n, NULL);
    free(cells);
    if (fmt == M2D_REPORT_TEX) fputs("\\midrule\n", f);
}

static void table_header(const grid *g, const m2d_results *r, m2d_report_format fmt, int with_params, FILE *f) {
    const char *exp = m2d_results_meta(r, "experiment"), *ppl = m2d_results_meta(r, "ppl");
    if (fmt == M2D_REPORT_CSV) {
        fprintf(f, "scoring,grouping,scaling%s", with_params ? ",params" : "");
        for (int k = 0; k < g->n_K; k++) fprintf(f, ",K=%d", g->Ks[k]);
        fprintf(f, ",best_K\n");
    } else if (fmt == M2D_REPORT_MD) {
        fprintf(f, "## Perplexity by configuration%s%s%s%s\n\n", exp ? " — experiment " : "", exp ? exp : "",
                ppl ? " — " : "", ppl ? ppl : "");
        table_legend(r, f);
        fprintf(f, "| Scoring | Grouping | Scaling |%s", with_params ? " Params |" : "");
        for (int k = 0; k < g->n_K; k++) fprintf(f, " K=%d%s |", g->Ks[k], k_is_E(r, g->Ks[k]));
        fprintf(f, "\n|---|---|---|%s", with_params ? "---|" : "");
        for (int k = 0; k < g->n_K; k++) fprintf(f, "---:|");
        fprintf(f, "\n");
    } else {
        fprintf(f, "%% Perplexity by configuration%s%s. Bold: best K per row; --: numerical failure.\n",
                exp ? ", experiment " : "", exp ? exp : "");
        fprintf(f, "\\begin{tabular}{lll%s", with_params ? "l" : "");
        for (int k = 0; k < g->n_K; k++) fputc('r', f);
        fprintf(f, "}\n\\toprule\nScoring & Grouping & DP Scaling%s", with_params ? " & Params" : "");
        for (int k = 0; k < g->n_K; k++) fprintf(f, " & $K{=}%d$%s", g->Ks[k], k_is_E(r, g->Ks[k]));
        fprintf(f, " \\\\\n\\midrule\n");
    }
}

/* the PPL cells of one row (each after SEP); the best one in bold */
static void table_cells(const grid *g, m2d_report_format fmt, const char *const key[4], int best, const char *sep,
                        FILE *f) {
    for (int k = 0; k < g->n_K; k++) {
        const entry *e = cell(g, key[0], key[1], key[2], key[3], g->Ks[k]);
        fputs(sep, f);
        if (!e) continue;
        char buf[32];
        if (fmt == M2D_REPORT_CSV) {
            if (e->failed) fputs("failed", f);
            else fprintf(f, "%.4f", e->ppl);
            continue;
        }
        if (e->failed) {
            fputs(fmt == M2D_REPORT_TEX ? "--" : "\xe2\x80\x93", f);
            continue;
        }
        m2d_report_format_ppl(e->ppl, buf, sizeof buf);
        if (k == best) fprintf(f, fmt == M2D_REPORT_MD ? "**%s**" : "\\textbf{%s}", buf);
        else fputs(buf, f);
    }
}

/* one row: KEY = scoring, grouping, scaling, params; the scoring and grouping names are shown on
 * the first row of their block only */
static void table_row(const grid *g, m2d_report_format fmt, int with_params, const char *const key[4],
                      int first_of_scoring, int first_of_group, FILE *f) {
    int best = best_k(g, key[0], key[1], key[2], key[3]);
    const char *sep = fmt == M2D_REPORT_CSV ? "," : fmt == M2D_REPORT_MD ? " | " : " & ";
    if (fmt == M2D_REPORT_MD) fputs("| ", f);
    if (fmt == M2D_REPORT_CSV) fprintf(f, "%s,%s,%s", key[0], key[1], key[2]);
    else {
        if (first_of_scoring) put_name(f, fmt, m2d_report_display_name(key[0]));
        fputs(sep, f);
        if (first_of_group) put_name(f, fmt, m2d_report_display_name(key[1]));
        fputs(sep, f);
        put_name(f, fmt, m2d_report_display_name(key[2]));
    }
    if (with_params) {
        fputs(sep, f);
        put_name(f, fmt, key[3][0] ? key[3] : "-");
    }
    table_cells(g, fmt, key, best, sep, f);
    if (fmt == M2D_REPORT_CSV) {
        if (best >= 0) fprintf(f, ",%d", g->Ks[best]);
        else fputs(",", f);
    }
    fputs(fmt == M2D_REPORT_MD ? " |\n" : fmt == M2D_REPORT_TEX ? " \\\\\n" : "\n", f);
}

static void write_table(const grid *g, const m2d_results *r, m2d_report_format fmt, FILE *f) {
    int with_params = g->pa.n > 1 || (g->pa.n == 1 && g->pa.v[0][0]);
    table_header(g, r, fmt, with_params, f);
    teacher_row(g, r, fmt, with_params, f);
    for (int s = 0; s < g->sc.n; s++) {
        int first_of_scoring = 1;
        for (int gi = 0; gi < g->gr.n; gi++) {
            int first_of_group = 1;
            for (int d = 0; d < g->sl.n; d++)
                for (int p = 0; p < g->pa.n; p++) {
                    const char *const key[4] = {g->sc.v[s], g->gr.v[gi], g->sl.v[d], g->pa.v[p]};
                    if (!row_present(g, key[0], key[1], key[2], key[3])) continue;
                    table_row(g, fmt, with_params, key, first_of_scoring, first_of_group, f);
                    first_of_scoring = first_of_group = 0;
                }
        }
        if (fmt == M2D_REPORT_TEX && s + 1 < g->sc.n) fputs("\\midrule\n", f);
    }
    if (fmt == M2D_REPORT_TEX) fputs("\\bottomrule\n\\end{tabular}\n", f);
}

/* Where the paper's own tables disagree with its method, said next to the reproduction so that
 * nobody hunts for a bug that is the paper's (issue 14). */
static const char PAPER_TABLE_NOTE[] =
    "Note on the paper's Table 10: at K = k every group holds one expert, so every grouping gives the "
    "same student (equal fingerprints here, one evaluation); Table 10 nevertheless lists different K = k "
    "perplexities for SF, PP, PS and CP under AB and OC than under RR, WC and RC, which the paper's method "
    "cannot produce. Table 12's CP rows are not in Table 10.";

static void write_table_note(const grid *g, m2d_report_format fmt, FILE *f) {
    if (g->gr.n < 2 || fmt == M2D_REPORT_CSV) return;
    if (fmt == M2D_REPORT_MD) fprintf(f, "\n%s\n", PAPER_TABLE_NOTE);
    else fprintf(f, "%% %s\n", PAPER_TABLE_NOTE);
}

/* ---- per-criterion summary ---- */

typedef struct {
    int s;
    double best, rank_sum;
    int n_rank, n, failed;
    const entry *at;
} crit;

static int cmp_crit(const void *a, const void *b) {
    const crit *x = a, *y = b;
    if (x->best != y->best) return x->best < y->best ? -1 : 1;
    return x->s - y->s;
}

/* Mean rank: in every cell (grouping, scaling, K, params) where all scorings have a finite PPL,
 * rank the scorings (1 = lowest PPL; ties share the average rank). Returns the number of cells. */
static int add_mean_ranks(const grid *g, crit *c) {
    int cells = 0;
    double *v = m2d_malloc((size_t)(g->sc.n + 1) * sizeof *v);
    for (int gi = 0; gi < g->gr.n; gi++)
        for (int d = 0; d < g->sl.n; d++)
            for (int p = 0; p < g->pa.n; p++)
                for (int k = 0; k < g->n_K; k++) {
                    int complete = 1;
                    for (int s = 0; s < g->sc.n && complete; s++) {
                        const entry *e = cell(g, g->sc.v[s], g->gr.v[gi], g->sl.v[d], g->pa.v[p], g->Ks[k]);
                        if (!e || e->failed) complete = 0;
                        else v[s] = e->ppl;
                    }
                    if (!complete) continue;
                    cells++;
                    for (int s = 0; s < g->sc.n; s++) {
                        double less = 0, equal = 0;
                        for (int t = 0; t < g->sc.n; t++) {
                            if (v[t] < v[s]) less++;
                            else if (v[t] == v[s]) equal++;
                        }
                        c[s].rank_sum += less + (equal + 1) / 2.0;
                        c[s].n_rank++;
                    }
                }
    free(v);
    return cells;
}

static void write_summary(const grid *g, m2d_report_format fmt, FILE *f) {
    crit *c = m2d_calloc((size_t)g->sc.n, sizeof *c);
    for (int s = 0; s < g->sc.n; s++) {
        c[s].s = s;
        c[s].best = INFINITY;
    }
    for (int i = 0; i < g->n_e; i++) {
        const entry *e = &g->e[i];
        crit *x = &c[names_index(&g->sc, e->scoring)];
        x->n++;
        if (e->failed) x->failed++;
        else if (e->ppl < x->best) x->best = e->ppl, x->at = e;
    }
    int cells = add_mean_ranks(g, c);
    qsort(c, (size_t)g->sc.n, sizeof *c, cmp_crit);
    if (fmt == M2D_REPORT_MD) {
        fprintf(f, "\n## Per-criterion summary\n\nRanked by best PPL. Mean rank: average rank among the %d "
                   "scorings over the %d cells (grouping, scaling, K) where all of them ran.\n\n", g->sc.n, cells);
        fprintf(f, "| Rank | Scoring | Best PPL | at (grouping, scaling, K) | Mean rank | Configurations | Failed |\n");
        fprintf(f, "|---:|---|---:|---|---:|---:|---:|\n");
    } else {
        fprintf(f, "\n%% Per-criterion summary: ranked by best PPL; mean rank over %d complete cells\n", cells);
        fprintf(f, "\\begin{tabular}{rlrlrrr}\n\\toprule\nRank & Scoring & Best PPL & at & Mean rank & Configs & "
                   "Failed \\\\\n\\midrule\n");
    }
    for (int i = 0; i < g->sc.n; i++) {
        char best[32], at[128] = "", mr[32] = "";
        m2d_report_format_ppl(c[i].best, best, sizeof best);
        if (c[i].at)
            snprintf(at, sizeof at, "%s, %s, K=%d", c[i].at->grouping, c[i].at->scaling, c[i].at->K);
        if (c[i].n_rank) snprintf(mr, sizeof mr, "%.2f", c[i].rank_sum / c[i].n_rank);
        const char *sep = fmt == M2D_REPORT_MD ? " | " : " & ";
        fprintf(f, "%s%d%s", fmt == M2D_REPORT_MD ? "| " : "", i + 1, sep);
        put_name(f, fmt, m2d_report_display_name(g->sc.v[c[i].s]));
        fprintf(f, "%s%s%s", sep, best, sep);
        put_name(f, fmt, at);
        fprintf(f, "%s%s%s%d%s%d%s", sep, mr, sep, c[i].n, sep, c[i].failed,
                fmt == M2D_REPORT_MD ? " |\n" : " \\\\\n");
    }
    if (fmt == M2D_REPORT_TEX) fputs("\\bottomrule\n\\end{tabular}\n", f);
    free(c);
}

/* The calibration the sweep actually used (its header's calibration= line: windows used and
 * requested, seq_len, tokens, and a note when the data held fewer windows than requested). */
static void write_calibration(const m2d_results *r, m2d_report_format fmt, FILE *f) {
    const char *cal = m2d_results_meta(r, "calibration");
    if (!cal || fmt == M2D_REPORT_CSV) return;
    fputs(fmt == M2D_REPORT_MD ? "Calibration (windows actually used): " : "% Calibration (windows actually used): ", f);
    for (const char *c = cal; *c; c++) fputc((unsigned char)*c < 0x20 || *c == 0x7f ? '?' : *c, f);
    fputs(fmt == M2D_REPORT_MD ? "\n\n" : "\n", f);
}

int m2d_report_write(const m2d_results *r, m2d_report_format fmt, FILE *f) {
    write_calibration(r, fmt, f);
    grid g;
    if (grid_load(r, &g, 1)) return -1;
    /* an MoE-only grid has no dense table; a file with no rows keeps its (empty) one */
    if (g.n_e || r->n_rows == 0 || fmt == M2D_REPORT_CSV) {
        write_table(&g, r, fmt, f);
        write_table_note(&g, fmt, f);
        if (fmt != M2D_REPORT_CSV && g.sc.n) write_summary(&g, fmt, f);
    }
    grid_free(&g);
    if (m2d_report_moe_write(r, fmt, f)) return -1;
    /* Table 12's students: the paper's rule over the whole file (this file's grid) */
    int *best = NULL, n_best = m2d_report_best_per_pair(r, &best);
    int rc = m2d_report_distill_write(r, best, n_best, fmt, f);
    free(best);
    return rc;
}

int m2d_report_best_per_pair(const m2d_results *r, int **rows) {
    grid g;
    if (grid_load(r, &g, 0)) return -1;
    *rows = m2d_malloc((size_t)(g.sc.n * g.gr.n + 1) * sizeof **rows);
    int n = 0;
    for (int s = 0; s < g.sc.n; s++)
        for (int gi = 0; gi < g.gr.n; gi++) {
            int best = -1;
            for (int i = 0; i < g.n_e; i++) {
                const entry *e = &g.e[i];
                if (e->failed || strcmp(e->scoring, g.sc.v[s]) || strcmp(e->grouping, g.gr.v[gi])) continue;
                /* a dense student before any smaller MoE (the paper's pairs are dense conversions) */
                if (best < 0 || e->moe < g.e[best].moe || (e->moe == g.e[best].moe && e->ppl < g.e[best].ppl)) best = i;
            }
            if (best >= 0) (*rows)[n++] = best; /* entries are in row order */
        }
    grid_free(&g);
    return n;
}

int m2d_report_write_figure4(const m2d_results *r, m2d_report_format fmt, FILE *f) {
    int *best = NULL, n_best = m2d_report_best_per_pair(r, &best);
    int rc = n_best < 0 ? -1 : m2d_report_figure4_write(r, best, n_best, fmt, f);
    free(best);
    return rc;
}

int m2d_report_write_best_per_pair(const m2d_results *r, FILE *f) {
    int *rows, n = m2d_report_best_per_pair(r, &rows);
    if (n < 0) return -1;
    for (int i = 0; i < n; i++)
        fprintf(f, "%s %s %s %s K=%s ppl=%s\n", m2d_results_get(r, rows[i], "config_id"),
                m2d_results_get(r, rows[i], "scoring"), m2d_results_get(r, rows[i], "grouping"),
                m2d_results_get(r, rows[i], "scaling"), m2d_results_get(r, rows[i], "K"),
                m2d_results_get(r, rows[i], "ppl"));
    free(rows);
    return 0;
}

/* ---- plot data ---- */

/* A plot-data file: built in memory, then written atomically (base/outfile.h) into DIR. */
typedef m2d_report_file pd_file;
#define pd_open m2d_report_file_open
#define pd_close m2d_report_file_close

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* one line of marginal stats over the finite PPLs matching a predicate */
static void marginal_line(FILE *f, const char *label, const double *v, int n) {
    if (n == 0) {
        fprintf(f, "\"%s\" NaN NaN NaN 0\n", label);
        return;
    }
    double *s = m2d_malloc((size_t)n * sizeof *s), logsum = 0;
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    for (int i = 0; i < n; i++) logsum += log(s[i]);
    double median = n % 2 ? s[n / 2] : sqrt(s[n / 2 - 1] * s[n / 2]);
    fprintf(f, "\"%s\" %.6g %.6g %.6g %d\n", label, exp(logsum / n), median, s[0], n);
    free(s);
}

/* heat_<scoring>.dat (PPL matrix: a row per grouping/scaling/params, a column per K) and
 * best_<scoring>.dat (the best K of each row); widens [*lo, *hi] to the finite PPLs written. */
static int write_heat(const grid *g, int s, const char *dir, double *lo, double *hi) {
    /* the scoring name is a validated plugin-style name (m2d_results_is_name): safe in a file name */
    char *name = m2d_strfmt("heat_%s.dat", g->sc.v[s]), *bname = m2d_strfmt("best_%s.dat", g->sc.v[s]);
    pd_file hp, bp;
    FILE *f = pd_open(&hp, dir, name), *bf = pd_open(&bp, dir, bname);
    free(name);
    free(bname);
    fprintf(f, "rows");
    for (int k = 0; k < g->n_K; k++) fprintf(f, " K=%d", g->Ks[k]);
    fprintf(f, "\n");
    fprintf(bf, "# column row (0-based, as in the heat matrix) of the best K of each row\n");
    int row = 0;
    for (int gi = 0; gi < g->gr.n; gi++)
        for (int d = 0; d < g->sl.n; d++)
            for (int p = 0; p < g->pa.n; p++) {
                const char *sc = g->sc.v[s], *gr = g->gr.v[gi], *sl = g->sl.v[d], *pa = g->pa.v[p];
                if (!row_present(g, sc, gr, sl, pa)) continue;
                int best = best_k(g, sc, gr, sl, pa);
                if (best >= 0) fprintf(bf, "%d %d\n", best, row);
                row++;
                /* row header without spaces: gnuplot splits on whitespace */
                char *head = m2d_strfmt("%s/%s%s%s", gr, sl, pa[0] ? "/" : "", pa);
                for (char *c = head; *c; c++)
                    if (*c == ' ' || *c == '\t' || *c == '"') *c = '_';
                fputs(head, f);
                free(head);
                for (int k = 0; k < g->n_K; k++) {
                    const entry *e = cell(g, sc, gr, sl, pa, g->Ks[k]);
                    if (!e || e->failed) fprintf(f, " NaN");
                    else {
                        fprintf(f, " %.6g", e->ppl);
                        *lo = fmin(*lo, e->ppl);
                        *hi = fmax(*hi, e->ppl);
                    }
                }
                fprintf(f, "\n");
            }
    int rc = pd_close(&hp);
    return pd_close(&bp) || rc ? -1 : 0;
}

/* marginal_<axis>.dat: per value of the axis, the geometric mean, median and best of the finite
 * PPLs of every configuration with that value */
static int write_marginal(const grid *g, int a, const char *dir, double *v) {
    static const char *const axes[] = {"scoring", "grouping", "scaling", "K"};
    char *name = m2d_strfmt("marginal_%s.dat", axes[a]);
    pd_file mp;
    FILE *f = pd_open(&mp, dir, name);
    free(name);
    fprintf(f, "# value geomean_ppl median_ppl best_ppl n_finite\n");
    const names *ns = a == 0 ? &g->sc : a == 1 ? &g->gr : &g->sl;
    int nvals = a == 3 ? g->n_K : ns->n;
    for (int i = 0; i < nvals; i++) {
        int n = 0;
        for (int j = 0; j < g->n_e; j++) {
            const entry *e = &g->e[j];
            int match = a == 0 ? !strcmp(e->scoring, ns->v[i])
                      : a == 1 ? !strcmp(e->grouping, ns->v[i])
                      : a == 2 ? !strcmp(e->scaling, ns->v[i])
                               : e->K == g->Ks[i];
            if (match && !e->failed) v[n++] = e->ppl;
        }
        char label[64];
        if (a == 3) snprintf(label, sizeof label, "K=%d", g->Ks[i]);
        else snprintf(label, sizeof label, "%s", ns->v[i]);
        marginal_line(f, label, v, n);
    }
    return pd_close(&mp);
}

/* range.txt: the colour range of the heat maps */
static int write_range(const char *dir, double lo, double hi) {
    pd_file rp;
    FILE *f = pd_open(&rp, dir, "range.txt");
    if (isfinite(lo)) fprintf(f, "%.6g %.6g\n", lo, hi > lo ? hi : lo * 1.01);
    else fprintf(f, "1 10\n");
    return pd_close(&rp);
}

int m2d_report_plot_data(const m2d_results *r, const char *dir) {
    grid g;
    if (grid_load(r, &g, 1)) return -1;
    if (m2d_make_output_dir(dir)) {
        grid_free(&g);
        return -1;
    }
    double lo = INFINITY, hi = 0;
    pd_file lp;
    FILE *list = pd_open(&lp, dir, "scorings.txt");
    int rc = 0;
    for (int s = 0; s < g.sc.n && rc == 0; s++) {
        /* names go into file names and (through plots.sh) plot titles: plugin-style names only */
        if (!m2d_results_is_name(g.sc.v[s])) {
            rc = m2d_err("plot data: scoring '%.40s' is not a plugin-style name", g.sc.v[s]);
            break;
        }
        fprintf(list, "%s\t%s\n", g.sc.v[s], m2d_report_display_name(g.sc.v[s]));
        rc = write_heat(&g, s, dir, &lo, &hi);
    }
    if (pd_close(&lp)) rc = -1;
    double *v = m2d_malloc((size_t)(g.n_e + 1) * sizeof *v);
    for (int a = 0; a < 4 && rc == 0; a++) rc = write_marginal(&g, a, dir, v);
    free(v);
    if (rc == 0) rc = write_range(dir, lo, hi);
    grid_free(&g);
    /* Figure 4 over Table 12's students (nothing without a post-distillation accuracy) */
    int *best = NULL, n_best = rc == 0 ? m2d_report_best_per_pair(r, &best) : 0;
    if (rc == 0) rc = n_best < 0 ? -1 : m2d_report_figure4_plot_data(r, best, n_best, dir);
    free(best);
    return rc;
}

/* ---- analyze plot data ---- */

/* The criteria of A's mean overlap and erank rows in order of first appearance (pointers into A;
 * the file's other metrics name no criterion, or not one of the selections). */
static int an_criteria(const m2d_an_csv *a, const char **out) {
    int n = 0;
    for (int i = 0; i < a->n; i++) {
        m2d_an_metric m = a->rows[i].metric;
        if (a->rows[i].layer != -1 || (m != M2D_AN_OVERLAP && m != M2D_AN_ERANK && m != M2D_AN_ERANK_W)) continue;
        int seen = 0;
        for (int j = 0; j < n && !seen; j++) seen = !strcmp(out[j], a->rows[i].criterion);
        if (!seen) out[n++] = a->rows[i].criterion;
    }
    return n;
}

/* The mean value of METRIC for criterion C (and OTHER for overlap); NaN when absent. */
static double an_mean(const m2d_an_csv *a, m2d_an_metric metric, const char *c, const char *other) {
    double v = NAN;
    for (int i = 0; i < a->n; i++) {
        const m2d_an_row *r = &a->rows[i];
        if (r->layer == -1 && r->metric == metric && !strcmp(r->criterion, c) && (!other || !strcmp(r->other, other)))
            v = r->value;
    }
    return v;
}

int m2d_report_analyze_plot_data(const m2d_an_csv *a, const char *dir) {
    if (m2d_make_output_dir(dir)) return -1;
    const char **crit = m2d_calloc((size_t)a->n + 1, sizeof *crit);
    int n = an_criteria(a, crit);
    pd_file op, ep, kp;
    FILE *o = pd_open(&op, dir, "overlap.dat"), *e = pd_open(&ep, dir, "erank.dat"), *k = pd_open(&kp, dir, "analyze.txt");
    fprintf(o, "x");
    for (int j = 0; j < n; j++) fprintf(o, " %s", crit[j]);
    fprintf(o, "\n");
    double max_erank = 0;
    for (int i = 0; i < n; i++) {
        fprintf(o, "%s", crit[i]);
        for (int j = 0; j < n; j++) fprintf(o, " %.6g", an_mean(a, M2D_AN_OVERLAP, crit[i], crit[j]));
        fprintf(o, "\n");
        double er = an_mean(a, M2D_AN_ERANK, crit[i], NULL), ew = an_mean(a, M2D_AN_ERANK_W, crit[i], NULL);
        fprintf(e, "%s %.6g %.6g\n", crit[i], er, ew);
        if (er > max_erank) max_erank = er;
        if (ew > max_erank) max_erank = ew;
    }
    /* the y range of the erank plot: K when the file records it, else just above the largest rank */
    fprintf(k, "%d %d\n", a->K ? a->K : (int)max_erank + 1, a->K ? 1 : 0);
    free(crit);
    int rc = pd_close(&op);
    if (pd_close(&ep)) rc = -1;
    if (pd_close(&kp)) rc = -1;
    return rc ? rc : m2d_report_usage_plot_data(a, dir);
}
