/* report_figure4 — the paper's Figure 4 from a results CSV: the marginal effect of each design
 * axis on the post-distillation downstream accuracy.
 *
 * The students: Table 12's (per scoring x grouping the row the paper's rule selected,
 * m2d_report_best_per_pair; the caller's) that have an MC average measured on their distilled
 * student (m2d_report_distilled_mc_avg); selected rows without one are left out. As in the paper
 * ("across the 35 best-per-row configurations"), a row that merely shares a distilled student's
 * fingerprint (its results copied there) but was not selected for its pair is not one of them.
 * Per value of an axis (scoring, grouping; scaling and K when they take more than one value among
 * those students), in the report's order (plugin report rank, then first appearance; K ascending):
 * the mean, min and max of the MC average and the number of students, each distinct student once
 * per value (rows that are one student: equal fingerprints, or one the dedup_of of the other;
 * the paper distilled each of its 35 cells separately, so its means count a K = k student once
 * per grouping that selected it, here it is one student and counts once). The spread of an axis:
 * its highest mean minus its lowest (the paper: "5.7 pp gap" between scorings, "~1 pp" between
 * groupings). */
#ifndef M2D_REPORT_FIGURE4_H
#define M2D_REPORT_FIGURE4_H

#include <stdio.h>

#include "io/results.h"
#include "sweep/report_table.h"

/* The table (`report --figure 4`): md and tex a table per axis, headed by its spread; csv one
 * table (axis, value, mean, min, max, students, spread_pp; percent, raw names). Without a student
 * (no selected row has a post-distillation accuracy) md and tex say so in one line and csv holds
 * the header only. ROWS, N: Table 12's students (N < 0: none). */
int m2d_report_figure4_write(const m2d_results *r, const int *rows, int n, m2d_report_format fmt, FILE *f);
/* figure4_<axis>.dat into DIR (plots/figure4.gp): a comment line, then per value
 * "\"NAME\" MEAN MIN MAX N" (percent; K's values as "K=8"); nothing without a student. */
int m2d_report_figure4_plot_data(const m2d_results *r, const int *rows, int n, const char *dir);

#endif
