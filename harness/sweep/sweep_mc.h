/* sweep_mc — the multiple-choice stage of a sweep.
 *
 * After the perplexity pass, the configurations chosen by [mc].configs ("best-per-pair": for each
 * scoring x grouping, the (K, scaling) with the lowest PPL, as the paper does; "all": every
 * evaluated student) are evaluated on the MC tasks. Results are appended crash-safely to the
 * sidecar OUT.mc.csv (resumable like the main file), then copied into the MC columns of OUT (one
 * atomic rewrite) for every row whose student has the same fingerprint. Columns are found by name
 * in both files. */
#ifndef M2D_SWEEP_MC_H
#define M2D_SWEEP_MC_H

#include "sweep/grid.h"
#include "sweep/sweep.h"
#include "sweep/sweep_backend.h"
#include "sweep/sweep_csv.h"

/* Run the stage for the results file OUT of experiment X (whose header is META); sets
 * sum->mc_selected and sum->mc_evaluated. B must have evaluate_mc. */
int m2d_sweep_mc_stage(const m2d_experiment *x, m2d_sweep_backend *b, const char *out, const m2d_sweep_meta *meta,
                       m2d_sweep_summary *sum);

/* The teachers' MC (the same tasks, shots and limit as the students) into OUT's run header, where
 * B has evaluate_teacher_mc and X has [mc] tasks: "teacher_mc=" for the MoE teacher and, with a
 * [d2d] block, "d2d_teacher_mc=" for the dense teacher. The value lists the MC columns' values
 * (m2d_sweep_mc_columns' names, those measured): "arc_easy_acc:0.412300,arc_easy_acc_norm:0.398000,
 * ...,mc_avg:0.456000". A key OUT's header has already is not measured again (resume); OUT is
 * rewritten atomically after each teacher. 0, or -1 + m2d_err naming OUT and the key. */
int m2d_sweep_teacher_mc(const m2d_experiment *x, m2d_sweep_backend *b, const char *out);
/* That header value from the MC values MC (m2d_sweep_mc_columns order; NaN: not measured, left
 * out); malloc'd. */
char *m2d_sweep_teacher_mc_value(const m2d_experiment *x, const double *mc);

/* Copy the sidecar SIDE's values of the columns MC_COLS (rows with status ok) into the rows of OUT
 * whose student has the same fingerprint as the sidecar row's configuration (OUT rewritten
 * atomically if anything changed). Every column of MC_COLS must be in both files. The
 * distillation stage fills its columns the same way. */
int m2d_sweep_mc_fill(const char *out, const char *side, char *const *mc_cols, int n_mc);
/* The same from the sidecar rows whose columns WHERE_COLS hold WHERE_VALS (N_WHERE of them; the
 * distillation ablation fills OUT from its first (loss, teacher_topk) only). */
int m2d_sweep_mc_fill_where(const char *out, const char *side, char *const *mc_cols, int n_mc,
                            char *const *where_cols, char *const *where_vals, int n_where);

/* Rows of R a stage works on: MODE "best-per-pair" (m2d_report_best_per_pair), "best-per-scoring-K"
 * (m2d_report_best_per_scoring_K: per scoring the lowest PPL at K = k and at K = 2k), "all" (every row
 * with status ok that is not a dedup_of), "list" (the rows with status ok whose config_id is one
 * of IDS). Of the D2D candidates (sweep_d2d.h) "best-per-pair" and "all" keep only the selected
 * one (the lowest pre-distillation PPL). Row indices -> *rows (malloc'd); returns the count. */
int m2d_sweep_select_rows(const m2d_results *r, const char *mode, char *const *ids, int n_ids, int **rows);
/* R (read from PATH) without the rows whose config_id is not in X's grid (a file resumed after the
 * grid shrank keeps them; a stage must neither select nor report them), said in one line; returns
 * how many went. */
int m2d_sweep_keep_grid_rows(const m2d_experiment *x, m2d_results *r, const char *path);
/* Index of configuration ID in X's grid, or -1. */
int m2d_sweep_find_config(const m2d_experiment *x, const char *id);

#endif
