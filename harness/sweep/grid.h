/* grid — an experiment from experiments.toml and its configuration grid.
 *
 * An experiment is the table [experiment.NAME]; see experiments.toml for the documented schema.
 * The grid is the product of the axes scoring × grouping × scaling × K (× params), in that
 * nesting order (K innermost, as the paper's tables read), trimmed by [[...include]] /
 * [[...exclude]] rules. K may be relative to the teacher: "k", "2k", "E", "E/2", or a number.
 * The optional axis target (["dense"] by default) adds smaller-MoE students: for target "moe" the
 * axis ratio (fractions of experts removed, e.g. [0.25, 0.5]) takes the place of scaling × K
 * (scaling "none") and the optional axis top_k (experts per token of the MoE student, default the
 * teacher's k) is nested inside it: scoring × grouping × target × (scaling × K | ratio × top_k) × params.
 * Dense configurations keep the ids they had before the axis existed. */
#ifndef M2D_GRID_H
#define M2D_GRID_H

#include <stddef.h>
#include <stdint.h>

#include "io/toml.h"
#include "train/distill.h"

#define M2D_ID_LEN 12 /* hex characters of a config id */

typedef struct {
    char scoring[32], grouping[32], scaling[32];
    char target[8];         /* "dense" (the default) | "moe" (a smaller MoE: REAP-style pruning or merging) |
                               "d2d" (a dense-to-dense candidate of [d2d]: scoring "d2d", params "shape=SPEC";
                               grid_d2d.h) */
    char ratio[16];         /* moe: fraction of routed experts removed per layer as written ("0.25"); "" for dense */
    double ratio_v;         /* its value (0: no expert removed, e.g. the teacher with fewer experts per token) */
    int top_k;              /* moe: the student's experts per token (paper 001 §2 (iii)); 0: the teacher's k */
    char K_expr[16];        /* as written in the axis: "2k", "E", "16"; moe: "(1-R)E" */
    int K;                  /* resolved against the teacher; moe: max(1, round((1 − ratio)·E)) experts kept;
                               d2d: k (the candidates are matched to the K = k student's parameters) */
    char params[128];       /* plugin parameters "b=1,a=1,c=2"; "" when none */
    char id[M2D_ID_LEN + 1];/* stable: hash of the axis values (with K resolved) */
    int index;              /* position in the experiment's grid (0-based) */
} m2d_grid_config;

typedef struct {
    char *file, *name, *description;
    char *model;                 /* teacher directory */
    char *backend;               /* a registered sweep backend: "pipeline" (default); test builds add
                                    "fake" (see sweep_backend.h) */
    char *out;                   /* default results CSV */
    char *cache_dir;             /* calibration statistics cache */
    int E, k;                    /* teacher experts and router top-k */
    int64_t d_e;                 /* expert intermediate size (0 if unknown) */
    int shape_from_config;       /* 1: E, k read from MODEL/config.json; 0: from [teacher] hints */
    /* the rest of [teacher] (0: not given), for the dry run's time and memory estimates when
       MODEL/config.json is not readable; validated whenever given */
    int t_vocab, t_hidden, t_layers, t_heads, t_kv_heads, t_head_dim, t_intermediate, t_max_pos;
    /* calibration */
    char *calib_data;
    char *calib_windows;         /* "fixed" (default) | "documents" (one window per WikiText article) */
    int calib_seq_len, calib_samples;
    int64_t calib_seed;          /* -1 (absent): the first N windows; else N windows drawn with this seed */
    /* perplexity */
    char *ppl_protocol, *ppl_data;
    int ppl_seq_len, ppl_max_windows; /* max_windows 0: all */
    /* multiple choice: tasks with shots; which configurations get them */
    int n_mc;
    char **mc_tasks;
    int *mc_shots;
    int mc_limit;                /* items per task, 0: all */
    char *mc_configs;            /* "none" | "all" | "best-per-pair" */
    char *mc_data_dir;           /* task data (default "data") */
    /* distillation stage ([distill]; sweep_distill.h): which configurations, the training text and
       the settings (distill.teacher, .student, .out, .data are filled per configuration) */
    int has_distill;
    char *distill_configs;       /* "best-per-pair" | "best-per-scoring-K" | "all" | "list" (distill_ids) */
    char **distill_ids;          /* configs = ["<config_id>", ...] */
    int n_distill_ids;
    char *distill_data;
    char *distill_val_data;      /* distill.val_data: the validation curve's text (never ppl_data; NULL: no curve) */
    m2d_distill_opts distill;    /* distill.train.loss / .teacher_topk: the first values of the lists below */
    /* the ablation axes (paper Tables 4, 5): distill.loss and distill.teacher_topk, each a scalar or a
       list; every selected student is distilled once per (loss, teacher_topk). distill_ablation: 1
       when either was given as a list (the sidecar then records both per row; sweep_distill.h) */
    int distill_ablation;
    int n_distill_losses, n_distill_topks;
    m2d_loss_kind *distill_losses;
    int *distill_topks;          /* as written (0: the teacher's own routing) */
    /* dense-to-dense pruning ([d2d]; grid_d2d.h): the dense teacher the candidates are pruned from
       and distilled with, and the calibration of its importance (default: [calibration]'s) */
    int has_d2d;
    char *d2d_teacher;
    char *d2d_calib_data;
    int d2d_calib_seq_len, d2d_calib_samples;
    int64_t d2d_calib_seed;      /* -1: the first N windows */
    /* grid */
    int n_configs;
    m2d_grid_config *configs;
    int n_excluded, n_duplicate_K; /* trimmed by rules / K expressions resolving to the same K */
    m2d_toml *doc;               /* the parsed file (with --set applied) */
    const m2d_toml *table;       /* [experiment.NAME] inside doc */
} m2d_experiment;

/* The largest grid m2d_experiment_load builds: the product of the axis lengths is counted first
 * and a larger grid refused in one line (before rules; the limit is per process, set from the
 * commands' --max-configs). */
#define M2D_GRID_DEFAULT_MAX_CONFIGS 20000 /* resume, dedup and report stay within seconds */
void m2d_grid_set_max_configs(int64_t n); /* <= 0: the default */
int64_t m2d_grid_max_configs(void);

/* Load experiment NAME from PATH, applying "key=value" overrides (keys relative to the
 * experiment table, e.g. "model", "ppl.max_windows"). Errors name the file, line and key; a
 * failed load leaves *OUT empty (nothing to free). */
int m2d_experiment_load(const char *path, const char *name, char *const *sets, int n_sets, m2d_experiment *out);
void m2d_experiment_free(m2d_experiment *x);
/* Where a value of X is, for messages: "FILE:LINE:COL: experiment 'NAME'" of the value at DOTTED
 * ("calibration.seq_len"), or of the element of the array at DOTTED whose text is ITEM
 * ("axes.scoring", "nope"); "FILE: experiment 'NAME'" for a default; "--set: experiment 'NAME'"
 * for a value given on the command line. Into BUF, which is returned. */
const char *m2d_experiment_where(const m2d_experiment *x, const char *dotted, const char *item, char *buf, size_t n);
/* Names of the experiments in PATH, comma separated (malloc'd), for messages and `help`. */
char *m2d_experiment_names(const char *path);

/* "k", "2k", "E", "E/4", "16" -> K with k <= K <= E. -1 + m2d_err when invalid. */
int m2d_grid_resolve_K(const char *expr, int k, int E, int *K);
/* Stable id of a configuration (hash of its axis values). */
void m2d_grid_config_id(const m2d_grid_config *c, char id[M2D_ID_LEN + 1]);

/* Remove every "--set key=value" / "--set=key=value" from argv (in place; *argc shrinks) and
 * return the key=value strings (malloc'd array of pointers into argv). -1 on a missing value. */
int m2d_extract_sets(const char *cmd, int *argc, char **argv, char ***sets, int *n_sets);

/* "I/N" with 1 <= I <= N. */
int m2d_parse_shard(const char *s, int *i, int *n);
/* Configuration indices of shard I of N (in grid order). Configurations that can share a student
 * stay together; groups are dealt round-robin in hash order so each shard mixes cheap and
 * expensive K. Disjoint, and their union is the grid. Returns the count; *idx malloc'd. */
int m2d_grid_shard(const m2d_experiment *x, int i, int n, int **idx);
/* How many shards can hold a configuration: the groups of configurations that share a student. */
int m2d_grid_shard_groups(const m2d_experiment *x);

#endif
