/* sweep_pool — the worker pool of a sweep run.
 *
 * Each worker takes the next configuration not yet in the CSV, builds its student and then, by
 * the student's fingerprint:
 *   - new: evaluates it and writes its row;
 *   - evaluated already (in this run, or recorded by an earlier one): writes the row with that
 *     result and dedup_of = the configuration evaluated;
 *   - being evaluated by another worker: leaves its row to that worker, which writes it when done;
 *   - build failed: writes the row with status "failed: REASON".
 * Rows are appended (crash-safe) to the open results file as they finish. */
#ifndef M2D_SWEEP_POOL_H
#define M2D_SWEEP_POOL_H

#include "io/results.h"
#include "sweep/grid.h"
#include "sweep/sweep.h"
#include "sweep/sweep_backend.h"

typedef struct {
    const m2d_experiment *x;
    m2d_sweep_backend *b;        /* prepared */
    m2d_results_writer *w;       /* the open CSV */
    const m2d_results *existing; /* its rows from earlier runs: skipped, their students reused */
    const int *idx;              /* configurations of this run (indices into x->configs) */
    int n_idx;
    int jobs;                    /* worker threads */
} m2d_sweep_pool_job;

/* Run the pool; adds to sum->skipped, evaluated, dedup, failed and eval_s. -1 + m2d_err when a
 * row could not be written (the workers stop taking configurations). */
int m2d_sweep_pool_run(const m2d_sweep_pool_job *job, m2d_sweep_summary *sum);

#endif
