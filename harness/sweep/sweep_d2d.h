/* sweep_d2d — dense-to-dense (D2D) pruning inside a sweep: the paper's Minitron baseline (App. M,
 * Table 13; issue 29) run as part of an experiment.
 *
 * An experiment's [d2d] block (grid_d2d.h) names a dense teacher and candidate shapes. Each
 * candidate is one configuration of the grid, with
 *     scoring "d2d", grouping "none", scaling "none", K_expr "k" (K = k: the candidates are matched
 *     to the K = k student's parameters), params "shape=SPEC" (convert/prune.h's spec, as written)
 * so the CSV, resume, dedup, merge and the report need no new column. The pipeline backend prunes
 * it from the dense teacher with Minitron importance (calib/importance.h, computed once over the
 * [d2d] calibration windows and cached in cache_dir like the MoE statistics), scores it with the
 * experiment's own [ppl] settings (the pre-distillation PPL), and the [distill] stage distills the
 * candidate with the lowest pre-distillation PPL -- the paper's rule (m2d_d2d_best) -- from the
 * dense teacher, with the settings, data and token budget of the MoE-to-dense students.
 *
 * A D2D student's fingerprint: SHA-256 of "d2d\n<dense weights hash>\n<importance calib hash>\n
 * <canonical shape>\n" (equal fingerprints: the same pruned student).
 */
#ifndef M2D_SWEEP_D2D_H
#define M2D_SWEEP_D2D_H

#include <stdint.h>
#include <stdio.h>

#include "io/results.h"
#include "model/model.h"
#include "sweep/grid.h"
#include "sweep/sweep_backend.h"

#define M2D_D2D_SCORING "d2d"
#define M2D_D2D_PARAMS_PREFIX "shape="

/* 1 when configuration C is a D2D candidate. */
int m2d_d2d_is_config(const m2d_grid_config *c);
/* 1 when row I of R is a D2D candidate's (scoring "d2d"). */
int m2d_d2d_is_row(const m2d_results *r, int i);
/* The shape spec of a candidate's params ("shape=L4-H192-F576-A6/2" -> "L4-H192-F576-A6/2"). */
const char *m2d_d2d_spec(const char *params);

/* SPEC parses (m2d_prune_shape_parse); -1 + m2d_err otherwise. */
int m2d_d2d_spec_check(const char *spec);
/* Parameters of candidate SPEC pruned from dense teacher T, its canonical spec into CANON; -1 +
 * m2d_err when SPEC does not fit T. */
int64_t m2d_d2d_params(const m2d_config *t, const char *spec, char *canon, size_t n);

/* The paper's rule: the index of the lowest finite perplexity of PPL[0..N) (the first on ties), or
 * -1 when none is finite. */
int m2d_d2d_best(const double *ppl, int n);
/* The row of R holding the selected D2D candidate (status ok, lowest ppl), or -1. */
int m2d_d2d_best_row(const m2d_results *r);
/* Drop from ROWS[0..N) every D2D row but the selected one (a stage distills or scores only it);
 * returns the new count. */
int m2d_d2d_keep_best(const m2d_results *r, int *rows, int n);

/* Before any work (run and dry run): the dense teacher is a dense model of a family the engine
 * runs, with the MoE teacher's tokenizer; each candidate fits it; the [distill] settings suit a
 * student of another width (fkl+mse needs the teacher's hidden size and depth; K' lists route an MoE
 * teacher only). -1 + m2d_err naming the file and field. */
int m2d_d2d_check(const m2d_experiment *x);

/* The backend's side: the dense teacher and its importance statistics (computed once, cached in
 * x->cache_dir as <weights hash:16>-<calib hash:16>.m2dimp), for one run. */
typedef struct m2d_d2d m2d_d2d;
int m2d_d2d_open(const m2d_experiment *x, const char *device, m2d_precision precision, m2d_d2d **out);
void m2d_d2d_free(m2d_d2d *d);
const m2d_model *m2d_d2d_teacher(const m2d_d2d *d);
/* SHA-256 (hex) of the dense teacher's weights and of its importance calibration: what every pruned
 * student of D is made from (a results file's identity) */
void m2d_d2d_inputs_hash(const m2d_d2d *d, char out[65]);
/* Prune candidate C into a fresh directory *DIR (under x->cache_dir/d2d/, malloc'd) and open it as
 * *STUDENT; RES gets the fingerprint, d_dense (the FFN width) and n_params. -1 + m2d_err. */
int m2d_d2d_build(m2d_d2d *d, const m2d_grid_config *c, char **dir, m2d_model **student, m2d_sweep_result *res);
/* Remove a pruned student's directory (flat: config, weights, tokenizer, moe2dense.json). */
void m2d_d2d_remove_dir(const char *dir);

/* --dry-run: the dense teacher, each candidate's parameters against the K = k student's, the
 * importance pass and the distillation's cost per step with each teacher (FLOP estimates), memory. */
void m2d_d2d_dry_run(const m2d_experiment *x, FILE *f);

#endif
