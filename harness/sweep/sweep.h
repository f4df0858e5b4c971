/* sweep — run an experiment's grid: dedup by student fingerprint, resumable CSV, shards, a pthread
 * pool, then the distillation stage and the multiple-choice stage; or print its plan and a run-time estimate (dry run).
 *
 * The pieces (see ARCHITECTURE.md):
 *   sweep.c           the two entry points below: orchestration of a run, and the dry run
 *   sweep_backend.c   the backend interface and the table of backends by name
 *   sweep_pipeline.c  backend "pipeline": calibrate -> convert in memory -> PPL / MC
 *   sweep_pool.c      worker pool: build, dedup by fingerprint, evaluate, one CSV row each
 *   sweep_mc.c        multiple-choice stage on the configurations [mc].configs selects
 *   sweep_distill.c   distillation stage on the configurations [distill].configs selects
 *   sweep_csv.c       the CSV's columns, run header and rows */
#ifndef M2D_SWEEP_H
#define M2D_SWEEP_H

#include <stdio.h>

#include "engine/backend.h"
#include "model/model.h"
#include "sweep/grid.h"

typedef struct {
    const char *out;        /* CSV path (default: the experiment's `out`) */
    int shard_i, shard_n;   /* 0/0: the whole grid */
    int jobs;               /* worker threads; 0: auto */
    int threads;            /* compute threads per job; 0: auto (cores / jobs) */
    int retry_failed;       /* re-run configurations recorded as failed */
    int no_resume;          /* refuse to run when the CSV exists */
    m2d_precision precision;/* of the engine's GEMMs (calibration, evaluation, the distillation's teacher); 0: FP32 */
    const char *device;     /* where those engines run: "cpu" (NULL), "cuda", "cuda:N" */
    m2d_precision attention;/* of attention's operands when students and teachers are evaluated (PPL,
                             * MC; m2d_engine_opts.attention): FP32 (0) or BF16; calibration and the
                             * distillation stay fp32. Recorded in the CSV header as "precision=P
                             * attention=bf16" (fp32: "precision=P", as before), so a resume matches it */
} m2d_sweep_opts;

typedef struct {
    int total, skipped, evaluated, dedup, failed;
    /* configurations of this run whose row (written now or by an earlier run) says failed for a
     * reason other than a non-finite perplexity: the sweep could not run them (the command then
     * exits non-zero); mc_failed, distill_failed: the same for the multiple-choice and the
     * distillation stages */
    int unrunnable, mc_failed, distill_failed;
    double wall_s, eval_s;  /* eval_s: time inside build + evaluate, summed over workers */
    double prepare_s;       /* backend prepare: teacher, calibration (or its cache), data encoding */
    int jobs, threads;
    int mc_selected, mc_evaluated; /* multiple-choice stage */
    int distill_selected, distill_evaluated; /* distillation stage */
    double stages_s;        /* wall time of the distillation / multiple-choice stage */
} m2d_sweep_summary;

/* Before any work: the backend's check of the experiment (plugins, parameters, lengths, data);
 * then OUT is locked for the whole run (a second sweep on it is refused, naming the holder), its
 * rows are validated, and the pool and the MC stage run. 0 also when configurations failed
 * (sum->failed, sum->unrunnable say how many). */
int m2d_sweep_run(const m2d_experiment *x, const m2d_sweep_opts *o, m2d_sweep_summary *sum);
/* Print the grid, the distinct-student count (or its upper bound) and a run-time estimate, after
 * the same check as a run and the validation of an existing CSV (-1 + m2d_err when either fails). */
int m2d_sweep_dry_run(const m2d_experiment *x, const m2d_sweep_opts *o, FILE *f);

/* The teacher's shape for the estimates (elements; moe_layers of the layers are MoE, the rest dense
 * FFNs of width F). */
typedef struct {
    int64_t vocab, hidden, layers, moe_layers, heads, kv_heads, head_dim, d_e, E, k, F;
    int64_t dtype_bytes;  /* of the stored weights (bf16: 2) */
    int tied;             /* tie_word_embeddings: no separate LM head */
} m2d_run_shape;

/* Peak memory of a sweep run (README "Memory of a sweep"), bytes: the teacher's weights as stored
 * (memory-mapped, they count in RSS), the calibration's anonymous memory at window length CALIB_L
 * (the expert-output block, one window's forward, the per-layer statistics) and the largest student
 * in the teacher's dtype: the dense student (an FFN of width k d_e per MoE layer, whatever K), or a
 * smaller MoE of MOE_K_MAX experts when the grid has --target moe students (0: none). */
typedef struct {
    double teacher, calib, student, total;
    int64_t teacher_params, student_params;
    /* when teacher + calibration + student exceed the default pass budget (engine.h, 80 % of RAM):
     * the teacher's passes run layer-major, holding its largest layer and its LM head at a time */
    int layer_major;
    double teacher_layer;
} m2d_run_memory;
/* THREADS: the calibration's (each holds its own Gram scratch) */
void m2d_run_memory_estimate(const m2d_run_shape *s, int calib_L, int moe_K_max, int threads, m2d_run_memory *m);
/* Rough seconds of a calibration of TOKENS tokens on S (every expert on every token) at an assumed
 * 20 GFLOP/s per core; "12.5 s", "3.4 min", "2.1 h" into BUF. */
double m2d_run_calib_seconds(const m2d_run_shape *s, double tokens);
void m2d_fmt_duration(double s, char *buf, size_t n);
/* Fill S from the parsed config.json C. */
void m2d_run_shape_from_config(const m2d_config *c, m2d_run_shape *s);
/* One line "peak memory: ~X GiB (teacher .., calibration .., student ..)" to F, a line on the
 * layer-major passes when the teacher does not fit, and a warning when even those exceed RAM. */
void m2d_run_memory_print(const m2d_run_memory *m, FILE *f);

#endif
