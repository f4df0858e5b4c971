/* report_table — the table and file helpers the report's sections share (report.c and
 * report_distill.c, report_moe.c, report_usage.c): output formats, PPL formatting, display names,
 * table rows in md / tex / csv, the teacher's PPL from the run header, plot-data files written
 * atomically. It includes none of the sections nor report.h, so the sections depend on it and
 * report.c on them, without a circle. */
#ifndef M2D_REPORT_TABLE_H
#define M2D_REPORT_TABLE_H

#include <stddef.h>
#include <stdio.h>

#include "io/results.h"

typedef enum { M2D_REPORT_MD, M2D_REPORT_TEX, M2D_REPORT_CSV } m2d_report_format;

/* V with thousands separators ("4,868,032") into buf. */
void m2d_report_thousands(long long v, char *buf, size_t n);
/* Compact PPL text into buf ("–" for NaN / inf). */
void m2d_report_format_ppl(double ppl, char *buf, size_t n);
/* Long display name of a plugin ("sf" -> "Selection Frequency", from its registration); the name
 * itself when unknown or without one. */
const char *m2d_report_display_name(const char *name);
/* A name's place in the report's order: its plugin's report rank - 1 (the paper's order), 1000 for
 * a name without one (those follow the ranked ones in order of first appearance). */
int m2d_report_name_order(const char *name);

/* Rows of a table shared by the report's sections (md, tex or csv): CELLS in order (names escaped
 * for tex here, quoted where needed for csv), BOLD[i] != 0 marks cell i (BOLD may be NULL; not in
 * csv); a header row opens the table (first NAMES columns left-aligned, the others right-aligned)
 * and m2d_report_end closes it. */
typedef struct {
    m2d_report_format fmt;
    FILE *f;
} m2d_report_out;
void m2d_report_cells(const m2d_report_out *o, const char *const *cells, int n, const unsigned char *bold);
void m2d_report_header(const m2d_report_out *o, const char *const *cells, int n, int names);
void m2d_report_end(const m2d_report_out *o);
/* S with LaTeX's specials escaped; the one non-ASCII letter the tables use, Δ, as $\\Delta$. */
void m2d_report_tex_escape(FILE *f, const char *s);
/* S as one CSV cell: quoted (quotes doubled) when it holds a comma, a quote or a line break
 * (parameters "b=1,a=1,c=2") */
void m2d_report_csv_cell(FILE *f, const char *s);

/* The teacher's own PPL and its windows from the run header ("teacher_ppl=812.5 windows=8");
 * 0 when the file has none. */
int m2d_report_teacher_ppl(const m2d_results *r, double *ppl, int *windows);

/* The teacher's expert count E (returned) and top-k (*K) from the run header ("teacher=E=64 k=8");
 * both 0 when the file has none. */
int m2d_report_teacher_shape(const m2d_results *r, int *k);

/* A teacher's MC value COL (a results MC column name: "arc_easy_acc", "mc_avg") from the run
 * header KEY ("teacher_mc" or "d2d_teacher_mc": "arc_easy_acc:0.412300,...,mc_avg:0.456000",
 * sweep_mc.h); NaN when the header or the column is absent or the value is not a number. */
double m2d_report_teacher_mc(const m2d_results *r, const char *key, const char *col);
/* A teacher's accuracy V as a table cell: percent with two decimals (as the students' cells);
 * absent (NaN): an em dash ("---" in tex, empty in csv). */
void m2d_report_format_teacher_acc(double v, m2d_report_format fmt, char *buf, size_t n);

/* A plot-data file built in memory and written atomically into DIR on close (0, or -1 +
 * m2d_err naming it). */
typedef struct {
    FILE *f;
    char *buf, *path;
    size_t len;
} m2d_report_file;
FILE *m2d_report_file_open(m2d_report_file *p, const char *dir, const char *name);
int m2d_report_file_close(m2d_report_file *p);

#endif
