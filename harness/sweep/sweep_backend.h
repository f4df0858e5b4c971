/* sweep_backend — what the sweep runner asks of "evaluate one configuration", and the table of
 * backends by name (experiments.toml: backend = "NAME").
 *
 * The runner (grid, dedup, CSV, resume, shards, worker pool, MC stage) talks only to this
 * interface, so it is independent of the conversion pipeline:
 *   prepare  once per run (the pipeline backend calibrates here, cached by hash)
 *   build    construct the student of one configuration and its fingerprint (a hash of selected
 *            sets, groups, merge weights and alpha: equal fingerprints = provably the same student)
 *   evaluate perplexity (and multiple choice when configured) of a built student
 * A backend registers itself from its own file with M2D_SWEEP_BACKEND (like plugins and
 * commands): the product registers "pipeline" (sweep_pipeline.c); the tests link a deterministic
 * "fake" (tests/sweep_fake.c) that the product binary does not contain. */
#ifndef M2D_SWEEP_BACKEND_H
#define M2D_SWEEP_BACKEND_H

#include <stdint.h>

#include "engine/backend.h"
#include "sweep/grid.h"

typedef struct {
    char fingerprint[65];   /* build: hex; equal => same student */
    int64_t d_dense;        /* build: dense FFN width (k * d_e) */
    int64_t n_params;       /* build: student parameter count */
    double ppl;             /* evaluate: NaN when it blew up */
    int ppl_windows;        /* evaluate: windows actually scored */
    int layers;             /* evaluate_d2d_teacher: the dense teacher's decoder layers (the report tells
                               width-only candidates from width + depth ones by it) */
    double *mc;             /* evaluate: [n_mc_cols] (NaN = not run); allocated by the runner */
    char error[256];        /* why build/evaluate failed */
} m2d_sweep_result;

/* A backend: its registration is a template of this struct (name and hooks); a run gets a copy
 * with X set and SELF from open(); m2d_sweep_backend_close when done. */
typedef struct m2d_sweep_backend m2d_sweep_backend;
struct m2d_sweep_backend {
    const char *name;       /* as in experiments.toml: "pipeline" */
    const m2d_experiment *x;/* the experiment of this run */
    void *self;             /* the backend's own state (NULL without open) */
    int threads;            /* compute threads per job, set by the runner before prepare */
    char calibration[256];  /* optional, filled by prepare: the calibration actually used ("windows=323
                               requested=512 ..."), recorded in the CSV header as calibration=... */
    m2d_precision precision;/* of the engine's GEMMs (FP32 or BF16: AUTO resolved), set with threads;
                             * also the distill hook's teacher precision (o->train.precision) */
    const char *device;     /* where the engines run (calibration, evaluation, MC, the distill hook's
                             * teacher): "cpu", "cuda", "cuda:N"; set with threads */
    m2d_precision attention;/* of attention's operands in evaluation (PPL, MC): m2d_sweep_opts.attention */
    /* optional: the state for experiment X (cheap: the work is in prepare); NULL + m2d_err on
     * failure; and destroy, which frees it */
    void *(*open)(const m2d_experiment *x);
    void (*destroy)(m2d_sweep_backend *b);
    /* once per run; fill hashes identifying the teacher and the calibration (for the CSV header) */
    int (*prepare)(m2d_sweep_backend *b, const m2d_experiment *x, char model_hash[65], char calib_hash[65]);
    /* 0 and *student, or -1 with res->error */
    int (*build)(m2d_sweep_backend *b, const m2d_grid_config *c, void **student, m2d_sweep_result *res);
    int (*evaluate)(m2d_sweep_backend *b, void *student, const m2d_grid_config *c, m2d_sweep_result *res);
    void (*free_student)(m2d_sweep_backend *b, void *student);
    /* optional, after prepare: the teacher's own perplexity on the windows evaluate scores every
     * student on (res->ppl, res->ppl_windows); the run records it in the CSV header (teacher_ppl=)
     * and the report shows it as the table's teacher row */
    int (*evaluate_teacher)(m2d_sweep_backend *b, m2d_sweep_result *res);
    /* optional: the same for the dense teacher of the experiment's [d2d] block (sweep_d2d.h; the
     * header's d2d_teacher_ppl=, the report's second teacher row); 1 when there is none. Both
     * teacher hooks also fill res->n_params (the teacher's parameters) */
    int (*evaluate_d2d_teacher)(m2d_sweep_backend *b, m2d_sweep_result *res);
    /* optional, after prepare: the hash of what the [d2d] block's students are made from (the dense
     * teacher's weights, its importance calibration) into OUT, for the CSV header's identity
     * (d2d_inputs=); 1 when there is no [d2d] block */
    int (*d2d_inputs)(m2d_sweep_backend *b, char out[65]);
    /* optional: multiple-choice tasks of the experiment on a built student: res->mc[2t] = acc,
     * res->mc[2t+1] = acc_norm (NaN when the task has none), res->mc[2 n_tasks] = the average of
     * each task's paper metric */
    int (*evaluate_mc)(m2d_sweep_backend *b, void *student, const m2d_grid_config *c, m2d_sweep_result *res);
    /* optional: the same tasks (shots, limit) on a teacher: the MoE teacher (D2D = 0) or the [d2d]
     * block's dense teacher (D2D = 1), into res->mc as evaluate_mc; 1 when there is no such
     * teacher. The MC stage records them in the CSV header (teacher_mc=, d2d_teacher_mc=;
     * sweep_mc.h) and the report shows them in the teacher rows. NULL: none recorded */
    int (*evaluate_teacher_mc)(m2d_sweep_backend *b, int d2d, m2d_sweep_result *res);
    /* optional (distill stage, sweep_distill.h): distill STUDENT (from build) with the settings O
     * (data filled by the stage; the teacher and the student are the backend's, O->teacher and
     * O->student are not read; O->out = DIR, where the distilled checkpoint goes; a checkpoint of
     * an interrupted run there is resumed) into *DISTILLED, a student that evaluate and
     * evaluate_mc accept (freed with free_student); fills RES's tokens, final_loss and steps. 0,
     * or -1 with res->error. */
    int (*distill)(m2d_sweep_backend *b, void *student, const m2d_grid_config *c, const m2d_distill_opts *o,
                   void **distilled, m2d_distill_result *res, char error[256]);
    /* optional: before any work (the run and its dry run call it first), refuse in one line what
     * build or evaluate would reject for the experiment: unknown plugins, parameters no chosen
     * plugin takes, lengths beyond the teacher's, missing data files. 0, or -1 + m2d_err naming
     * FILE:LINE:COL of the value (or "--set") */
    int (*check)(m2d_sweep_backend *b, const m2d_experiment *x);
    /* optional (dry run): the fingerprint configuration C's student would have, without building
     * it: 0 and fp; 1 when C would fail to build (it makes no student); -1 when the backend cannot
     * tell yet (e.g. no cached calibration statistics) */
    int (*plan_fingerprint)(m2d_sweep_backend *b, const m2d_experiment *x, const m2d_grid_config *c, char fp[65]);
};

void m2d_sweep_backend_register(const m2d_sweep_backend *template_);
const m2d_sweep_backend *m2d_sweep_backend_find(const char *name);
/* The registered names, comma separated, sorted (malloc'd), for messages. */
char *m2d_sweep_backend_names(void);
/* The backend x->backend names, opened for X; -1 + m2d_err naming the registered ones when unknown. */
int m2d_sweep_backend_make(const m2d_experiment *x, m2d_sweep_backend *b);
void m2d_sweep_backend_close(m2d_sweep_backend *b);

/* Exact number of distinct students among configurations idx[0..n) from plan_fingerprint
 * (configurations that would fail to build are not students); -1 when the backend cannot tell. */
int m2d_sweep_count_distinct(m2d_sweep_backend *b, const m2d_experiment *x, const int *idx, int n);

/* Put at file scope in the backend's .c file (designated initializers of m2d_sweep_backend):
 *   M2D_SWEEP_BACKEND(pipeline, .name = "pipeline", .open = pipe_open, .prepare = pipe_prepare, ...) */
#define M2D_SWEEP_BACKEND(ident, ...)                                                   \
    static const m2d_sweep_backend ident##_sweep_backend = {__VA_ARGS__};               \
    __attribute__((constructor)) static void ident##_sweep_backend_register(void) {     \
        m2d_sweep_backend_register(&ident##_sweep_backend);                             \
    }

#endif
