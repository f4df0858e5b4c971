/* sweep_csv — the layout of a sweep's results CSV: its columns, its '# key=value' run header
 * (and which header keys identify a run), one configuration's row, and dropping failed rows.
 *
 * Columns: the fixed ones (config_id ... ppl_windows), then per multiple-choice task TASK_acc and
 * TASK_acc_norm and then mc_avg (only when the experiment has [mc] tasks), then the distillation
 * columns (only with [distill]; m2d_sweep_distill_columns), then the bookkeeping
 * tail (wall_s, status, dedup_of, fingerprint). Code that reads a CSV finds columns by name. */
#ifndef M2D_SWEEP_CSV_H
#define M2D_SWEEP_CSV_H

#include "io/results.h"
#include "sweep/grid.h"
#include "sweep/sweep_backend.h"

/* The CSV columns of experiment X (malloc'd names); returns the count. */
int m2d_sweep_columns(const m2d_experiment *x, char ***cols);
/* Just the multiple-choice columns of X, in CSV order (TASK_acc, TASK_acc_norm, ..., mc_avg);
 * 0 and *cols = NULL when X has no tasks. */
int m2d_sweep_mc_columns(const m2d_experiment *x, char ***cols);
/* The columns the distillation stage fills (sweep_distill.h), in CSV order: distill_ppl,
 * distill_final_loss, distill_tokens, distill_steps, distill_wall_s, distill_step_s, distill_teacher_s
 * (mean seconds per optimizer step and of its teacher forward), and mc_student ("distilled":
 * the MC columns of the row were measured on the distilled student) when X has MC tasks; 0 and
 * *cols = NULL when X has no [distill]. */
int m2d_sweep_distill_columns(const m2d_experiment *x, char ***cols);
void m2d_sweep_columns_free(char **cols, int n);

/* The run header: "key=value" strings (owned). Grows as needed. */
typedef struct {
    char **items;
    int n, cap;
} m2d_sweep_meta;
void m2d_sweep_meta_add(m2d_sweep_meta *m, char *item); /* takes ownership of ITEM */
void m2d_sweep_meta_free(m2d_sweep_meta *m);
/* The header of a run of X (shard 0/0: the whole grid): format version, experiment, backend,
 * model, the teacher's E and k ("teacher=E=64 k=8": the report labels K = E), hashes, the engine's GEMM precision (fp32/bf16, as resolved), PPL protocol, shard, grid
 * size, host, start time. */
void m2d_sweep_meta_build(const m2d_experiment *x, int shard_i, int shard_n, const char *model_hash,
                          const char *calib_hash, const char *precision, m2d_sweep_meta *m);
/* Header keys that must agree for rows to be appended to an existing file (another model's or
 * another experiment's run never mixes into it). */
extern const char *const m2d_sweep_identity_keys[];
extern const int m2d_sweep_n_identity_keys;

/* "ok", "failed: REASON" (build/evaluate error), or "failed: non-finite perplexity". */
const char *m2d_sweep_status(const m2d_sweep_result *r, char *buf, size_t n);
/* The row of configuration C (malloc'd fields, as many as m2d_sweep_columns): R's values, the
 * wall time, STATUS and DEDUP_OF (NULL: evaluated itself). R->mc may be NULL (empty MC cells). */
char **m2d_sweep_row(const m2d_experiment *x, const m2d_grid_config *c, const m2d_sweep_result *r, double wall,
                     const char *status, const char *dedup_of, int *n_fields);
void m2d_sweep_row_free(char **fields, int n);
/* A multiple-choice cell: "%.6f", or "" for NaN (not run / no such metric); malloc'd. */
char *m2d_sweep_mc_cell(double v);

/* Remove the rows recorded as failed from PATH (atomic rewrite; absent PATH: nothing to do). */
int m2d_sweep_drop_failed_rows(const char *path);

#endif
