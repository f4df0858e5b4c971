/* report_distill — what `moe2dense report` shows of a sweep's distillation stage
 * (sweep_distill.h): the columns distill_ppl, distill_final_loss, distill_tokens and, with MC
 * tasks, the MC columns measured on the distilled students (mc_student = "distilled").
 *
 *  - Table 12 (paper): per scoring x grouping the student the paper's rule selected (the (K,
 *    scaling) with the lowest pre-distillation PPL, m2d_report_best_per_pair), labelled with its
 *    scaling and K: PPL before and after, the accuracy of each paper benchmark the file has (Wino,
 *    Hella, ARC-E, ARC-C, MMLU; the task's paper metric) and the average; a teacher row first
 *    (the run header's teacher_ppl= and teacher_mc=: its PPL and its accuracies on the same tasks,
 *    an em dash where the header has none). Never the pair's best after distillation. Then one line per distilled student: its
 *    configuration, PPL before and after, tokens, final loss, MC average.
 *  - Plot data: distill.dat (per distilled student: label, PPL before, after) and, from the
 *    training logs next to the results (RESULTS.distill/<config_id>.jsonl), distill_loss.dat
 *    (tokens, training loss per step) and distill_val.dat (tokens, validation CE, PPL; Figure
 *    5): one block per student (gnuplot `index`), its first line the quoted label (a title for
 *    `columnheader`); distill_curves.txt: the two block counts. */
#ifndef M2D_REPORT_DISTILL_H
#define M2D_REPORT_DISTILL_H

#include <stdio.h>

#include "io/results.h"
#include "sweep/report_table.h"

/* Rows of R with a distilled student (distill_ppl filled; with ONE_PER_STUDENT the first row of
 * each student (fingerprint) only) -> *rows (malloc'd); returns the count (0 when R has no
 * distillation columns). */
int m2d_report_distilled_rows(const m2d_results *r, int one_per_student, int **rows);
/* Row I's MC average measured on its distilled student (distill_ppl finite and, where the file
 * has mc_student, "distilled"; else the cells are the converted student's), NAN when none. */
double m2d_report_distilled_mc_avg(const m2d_results *r, int i);
/* The paper's benchmarks R has (Wino, Hella, ARC-E, ARC-C, MMLU: those with a TASK_acc column) and
 * "Avg" when it has mc_avg: their headings -> HEAD (at most M2D_REPORT_MAX_ACC); returns the count. */
#define M2D_REPORT_MAX_ACC 6
int m2d_report_acc_heads(const m2d_results *r, const char **head);
/* Row I's values of those columns (fractions; I < 0: the MoE teacher's, from the header's
 * teacher_mc), each task in its paper metric, measured on the distilled student (NaN where the
 * cells are not the distilled student's) -> V; returns the count. */
int m2d_report_acc_values(const m2d_results *r, int i, double *v);
/* The same for the teacher of header KEY ("teacher_mc", "d2d_teacher_mc"). */
int m2d_report_teacher_acc_values(const m2d_results *r, const char *key, double *v);
/* The distillation section (md or tex); nothing when R has no distilled student. BEST, N_BEST:
 * Table 12's students, m2d_report_best_per_pair of R (the caller's; N_BEST < 0: no Table 12). */
int m2d_report_distill_write(const m2d_results *r, const int *best, int n_best, m2d_report_format fmt, FILE *f);
/* distill.dat, distill_loss.dat, distill_val.dat, distill_curves.txt into DIR (nothing without
 * distilled students); RESULTS_PATH locates the logs (a missing log: no curve for that student). */
int m2d_report_distill_plot_data(const char *results_path, const m2d_results *r, const char *dir);
/* The paper's Table 4 (TABLE 4: per student, one row per teacher_topk k' at forward KL; "k (default)"
 * is the teacher's own routing, "E (all)") or Table 5 (TABLE 5: one row per loss at k' = k) from the
 * distillation ablation's sidecar RESULTS_PATH.distill.csv (columns loss, teacher_topk; its ok rows),
 * R the main results (the students' labels, the teacher's E and k): PPL after distillation, each
 * paper benchmark the file has and the MC average (percent), and the differences to the reference
 * row (Δ PPL, Δ Avg in points). md and tex: a table per student; csv: one table, config_id first.
 * -1 + m2d_err naming the sidecar when it is missing or has no ablation columns. */
int m2d_report_ablation_write(const char *results_path, const m2d_results *r, int table, m2d_report_format fmt,
                              FILE *f);

#endif
