/* report_d2d — `moe2dense report RESULTS.csv --table 3`: the MoE-to-dense against dense-to-dense
 * comparison of a sweep with a [d2d] block (sweep_d2d.h), in the layout of the paper's Table 3 /
 * Figure 1, then its Table 13 (the D2D architecture search).
 *
 *  - Table 3 rows (each present only when the file has it): "MoE-to-dense DO-ACP, K = k" (the
 *    do-acp dense row at K = k; the distilled one when there are several groupings), "MoE-to-dense,
 *    best of the grid" (the converted dense student, baselines and D2D excluded, with the lowest
 *    PPL after distillation, or before when nothing was distilled; its configuration named), "D2D
 *    pruning" (the candidate the paper's rule selected, m2d_d2d_best_row, its shape named),
 *    "Random FFN + teacher attn" (random-ffn), "Random initialization" (random-init), and both
 *    teachers from the run header (teacher_ppl=, d2d_teacher_ppl=; their MC averages from
 *    teacher_mc=, d2d_teacher_mc=, an em dash where absent). Columns: the teacher each
 *    student was distilled from, parameters, PPL before and after distillation, the MC average
 *    (percent; when the file has mc_avg or a teacher's), seconds per optimizer step and of its teacher forward
 *    (distill_step_s, distill_teacher_s: measured in the same run on the same machine).
 *  - Table 6 (`--table 6`, extended training: the same comparison at a larger token budget): Table
 *    3's rows, but in place of "best of the grid" every other distilled converted student (one row
 *    per student), labelled with its scoring, K, grouping and scaling (the paper: "SF, K = 16" with
 *    Weight Cluster beside DO-ACP, K = 8); a line above it gives the tokens per student.
 *  - Table 13 rows: every D2D candidate (evaluated or failed): shape, strategy (width-only when it
 *    keeps the dense teacher's layers, else width + depth), parameters, PPL before distillation,
 *    the selected one marked.
 *  - Plot data (Figure 1): figure1.dat, one line per Table 3 student: quoted label, parameters, PPL
 *    before, PPL after, MC average, seconds per step (NaN where absent); written by --plot-data
 *    when the file has D2D candidates (plots/figure1.gp draws it). */
#ifndef M2D_REPORT_D2D_H
#define M2D_REPORT_D2D_H

#include <stdio.h>

#include "io/results.h"
#include "sweep/report_table.h"

/* Tables 3 (TABLE 3) or 6 (TABLE 6) and 13 of R (md, tex or csv; csv: Table 3 or 6 only, raw
 * numbers). -1 + m2d_err when R has no D2D candidates. */
int m2d_report_d2d_write(const m2d_results *r, int table, m2d_report_format fmt, FILE *f);
/* figure1.dat into DIR; nothing (0) when R has no D2D candidates. */
int m2d_report_d2d_plot_data(const m2d_results *r, const char *dir);

#endif
