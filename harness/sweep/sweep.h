/* sweep — run an experiment's grid: dedup by student fingerprint, resumable CSV, shards, a pthread pool.
 *
 * The runner talks to a small "evaluate one configuration" backend, so the grid / dedup / CSV /
 * resume / shard machinery is independent of the conversion pipeline:
 *   prepare  once per run (the pipeline backend calibrates here, cached by hash)
 *   build    construct the student of one configuration and its fingerprint (a hash of selected
 *            sets, groups, merge weights and alpha: equal fingerprints = provably the same student)
 *   evaluate perplexity (and multiple choice when configured) of a built student
 * Two backends: "pipeline" (calibrate -> convert in memory -> PPL) and "fake" (deterministic,
 * instant; used by the tests to exercise the machinery, incl. kill -9 and Slurm runs). */
#ifndef M2D_SWEEP_H
#define M2D_SWEEP_H

#include <stdint.h>
#include <stdio.h>

#include "engine/engine.h"
#include "sweep/grid.h"

typedef struct {
    char fingerprint[65];   /* build: hex; equal => same student */
    int64_t d_dense;        /* build: dense FFN width (k * d_e) */
    int64_t n_params;       /* build: student parameter count */
    double ppl;             /* evaluate: NaN when it blew up */
    int ppl_windows;        /* evaluate: windows actually scored */
    double *mc;             /* evaluate: [n_mc_cols] (NaN = not run); allocated by the runner */
    char error[256];        /* why build/evaluate failed */
} m2d_sweep_result;

typedef struct m2d_sweep_backend m2d_sweep_backend;
struct m2d_sweep_backend {
    const char *name;
    void *self;
    int threads;            /* compute threads per job, set by the runner before prepare */
    /* once per run; fill hashes identifying the teacher and the calibration (for the CSV header) */
    int (*prepare)(m2d_sweep_backend *b, const m2d_experiment *x, char model_hash[65], char calib_hash[65]);
    /* 0 and *student, or -1 with res->error */
    int (*build)(m2d_sweep_backend *b, const m2d_grid_config *c, void **student, m2d_sweep_result *res);
    int (*evaluate)(m2d_sweep_backend *b, void *student, const m2d_grid_config *c, m2d_sweep_result *res);
    void (*free_student)(m2d_sweep_backend *b, void *student);
    void (*destroy)(m2d_sweep_backend *b);
    /* optional: multiple-choice tasks of the experiment on a built student: res->mc[2t] = acc,
     * res->mc[2t+1] = acc_norm (NaN when the task has none), res->mc[2 n_tasks] = the average of
     * each task's paper metric */
    int (*evaluate_mc)(m2d_sweep_backend *b, void *student, const m2d_grid_config *c, m2d_sweep_result *res);
    /* optional: exact number of distinct students without running (dry run); -1 when unknown */
    int (*count_distinct)(m2d_sweep_backend *b, const m2d_experiment *x, const int *idx, int n);
};

int m2d_sweep_backend_fake(const m2d_experiment *x, m2d_sweep_backend *b);
int m2d_sweep_backend_pipeline(const m2d_experiment *x, m2d_sweep_backend *b);
/* gptq perplexity on already-encoded text: the windows and sums of m2d_ppl_gptq (which encodes
 * the text on every call); the pipeline encodes once per sweep. */
int m2d_sweep_ppl_tokens(m2d_engine *e, const int32_t *ids, size_t n, int L, int max_windows, double *ppl,
                         int *windows);

typedef struct {
    const char *out;        /* CSV path (default: the experiment's `out`) */
    int shard_i, shard_n;   /* 0/0: the whole grid */
    int jobs;               /* worker threads; 0: auto */
    int threads;            /* compute threads per job; 0: auto (cores / jobs) */
    int retry_failed;       /* re-run configurations recorded as failed */
} m2d_sweep_opts;

typedef struct {
    int total, skipped, evaluated, dedup, failed;
    double wall_s, eval_s;  /* eval_s: time inside build + evaluate, summed over workers */
    double prepare_s;       /* backend prepare: teacher, calibration (or its cache), data encoding */
    int jobs, threads;
    int mc_selected, mc_evaluated; /* multiple-choice stage */
} m2d_sweep_summary;

/* The CSV columns of experiment X (fixed, then MC metric columns, then bookkeeping). */
int m2d_sweep_columns(const m2d_experiment *x, char ***cols);
void m2d_sweep_columns_free(char **cols, int n);

int m2d_sweep_run(const m2d_experiment *x, const m2d_sweep_opts *o, m2d_sweep_summary *sum);
/* Print the grid, the distinct-student count (or its upper bound) and a run-time estimate. */
int m2d_sweep_dry_run(const m2d_experiment *x, const m2d_sweep_opts *o, FILE *f);

#endif
