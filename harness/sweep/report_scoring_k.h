/* report_scoring_k — the paper's per-scoring tables at K = k (pure pruning) and K = 2k (merging):
 * Table 8 (App. L: the base teacher, "the top-1 base configuration per scoring method at both K = 8
 * and K = 16", distilled), Tables 16 and 17 (App. O: cross-model validation on DeepSeek-V2-Lite and
 * GPT-OSS-20B) and Figure 7 (section 4.6: their MC averages as bars, the random-FFN baseline as a
 * dashed line), each from one results CSV.
 *
 * The students: per scoring and per K in {k, 2k} (k: the run header's teacher=E=.. k=..), the dense
 * row with status ok and the lowest finite pre-distillation PPL over every grouping, scaling and
 * params (the first in file order on ties; D2D candidates and MoE targets are not in it) -- the rule
 * of [distill] configs = "best-per-scoring-K", which therefore distills exactly these rows. The
 * baselines random-ffn and random-init are scorings of the grid: their rows are their selected
 * student at K = k (else 2k), shown after the scorings without a K, as in the paper.
 *
 * Columns: Scoring, K, PPL before and after distillation (WikiText-2; the paper's Table 8 has the
 * first, Tables 16/17 neither), each paper benchmark the file has (Wino, Hella, ARC-E, ARC-C, MMLU;
 * the task's paper metric, measured on the distilled student) and their average, in percent; empty
 * where the selected student was not distilled or not scored (another row is never substituted).
 * Bold: Table 8 the better of each scoring's two rows per column (lower PPL after, higher
 * accuracy); Tables 16/17 the best of each column over all students. Tables 16 and 17 end with the
 * teacher's row (the header's teacher_ppl= and teacher_mc=; em dashes where absent). A note under
 * the table names each selected configuration (grouping, scaling, config id). */
#ifndef M2D_REPORT_SCORING_K_H
#define M2D_REPORT_SCORING_K_H

#include <stdio.h>

#include "io/results.h"
#include "sweep/report_table.h"

/* The selected rows (see above), scorings in the report's order (m2d_report_name_order, then first
 * appearance), K = k before 2k -> *rows (malloc'd); returns the count, or -1 + m2d_err when the
 * results have no scoring/K/ppl/status column. */
int m2d_report_best_per_scoring_K(const m2d_results *r, int **rows);
/* Those rows, one a line: "CONFIG_ID SCORING GROUPING SCALING K=K ppl=PPL" (the dry run's listing). */
void m2d_report_write_rows(const m2d_results *r, const int *rows, int n, FILE *f);

/* Table TABLE (8, 16 or 17) of R in FMT (csv: one line per student, raw names, config ids). -1 +
 * m2d_err when R has no student at K = k or 2k. */
int m2d_report_scoring_k_write(const m2d_results *r, int table, m2d_report_format fmt, FILE *f);
/* Figure 7 as a table: per scoring the MC average after distillation at K = k and at K = 2k, and
 * the random-FFN baseline's (md and tex: a line under the table; csv: long form scoring,K,avg). */
int m2d_report_figure7_write(const m2d_results *r, m2d_report_format fmt, FILE *f);
/* figure7.dat ("\"Display name\" AVG_K AVG_2K", percent, NaN where absent) and figure7.txt ("k 2k
 * HAVE_RANDOM RANDOM_AVG") into DIR for plots/figure7.gp; nothing when no selected student has an
 * MC average after distillation. */
int m2d_report_figure7_plot_data(const m2d_results *r, const char *dir);

#endif
