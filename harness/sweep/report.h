/* report — the paper's Table 10/11 layout from a results CSV, a per-criterion summary, and
 * gnuplot data files for the plots/ scripts.
 *
 * Table: one row per scoring x grouping x scaling (x params), one column per K (ascending); the
 * best (lowest) PPL of each row is marked (bold); "–" for failed configurations (blow-ups);
 * empty for configurations not in the file. PPL formatting (as in the paper): < 100 two decimals,
 * < 1,000 one decimal, < 100,000 an integer with thousands separators, then 120k, 1.1m, 2.3b. */
#ifndef M2D_REPORT_H
#define M2D_REPORT_H

#include <stdio.h>

#include "io/analyze_csv.h"
#include "io/results.h"
#include "sweep/report_table.h"

/* Write the table and the per-criterion summary of the dense students, the MoE students' section
 * (report_moe.h) and the distillation section (report_distill.h). The csv format holds the dense
 * table only. */
int m2d_report_write(const m2d_results *r, m2d_report_format fmt, FILE *f);
/* Write gnuplot inputs of the dense students into DIR: heat_<scoring>.dat (PPL matrix, rows grouping/scaling,
 * columns K, NaN for failed/absent), best_<scoring>.dat (column, row of each row's best K), marginal_<axis>.dat (per axis value: geometric-mean PPL, median, best, count),
 * figure4_<axis>.dat (Figure 4: post-distillation accuracy per axis value over Table 12's students,
 * report_figure4.h; only when some have one),
 * scorings.txt ("NAME<TAB>DISPLAY NAME", one scoring a line), range.txt (the colour range). The
 * names are validated (m2d_results_validate); every file is written atomically. */
int m2d_report_plot_data(const m2d_results *r, const char *dir);

/* Write the analyze plots' inputs into DIR from a validated `analyze --csv` file: overlap.dat
 * (mean overlap matrix, row and column headers = criteria), erank.dat (criterion erank erank_w,
 * means over layers) and analyze.txt ("MAXRANK HAVE_K": K and 1 when the file records K, else
 * the largest rank + 1 and 0), and the condenser analyses' lorenz.dat, lorenz.txt, pearson.dat,
 * pearson.txt, pearson_matrix.dat (report_usage.h). Only numbers and validated names reach the
 * files. */
int m2d_report_analyze_plot_data(const m2d_an_csv *a, const char *dir);

/* Paper-style MC selection: for each scoring x grouping pair, the row (K, scaling) with the
 * lowest finite PPL among its dense students (its smaller-MoE students only where it has no dense
 * one: an MoE-only grid). Row indices into r -> *rows (malloc'd); returns the count. */
int m2d_report_best_per_pair(const m2d_results *r, int **rows);
/* The paper's Figure 4 as tables (`report --figure 4`, report_figure4.h) over Table 12's students:
 * those rows with a post-distillation MC average. */
int m2d_report_write_figure4(const m2d_results *r, m2d_report_format fmt, FILE *f);
/* Those rows, one a line: "CONFIG_ID SCORING GROUPING SCALING K=K ppl=PPL". */
int m2d_report_write_best_per_pair(const m2d_results *r, FILE *f);

#endif
