/* mc — lm-eval-style multiple-choice evaluation: documents, prompts, few-shot sampling,
 * requests, scoring (acc, acc_norm), aggregation (stderr, MMLU micro groups) and a registry of
 * task plugins (evals/tasks/<name>.c register themselves with M2D_MC_TASK).
 *
 * Everything here follows data/LM_EVAL_TASKS.md to the character; every place where the data
 * available forces a deviation from lm-eval is recorded in the result (m2d_mc_task_result.notes). */
#ifndef M2D_MC_H
#define M2D_MC_H

#include <stdio.h>

#include "evals/lm.h"
#include "evals/pyrandom.h"

/* One document after the task's processing (lm-eval's doc_to_text / doc_to_choice / doc_to_target). */
typedef struct {
    char *text;        /* doc_to_text; NULL for multiple-input tasks (Winogrande) */
    char **choices;    /* doc_to_choice: answer strings, or the per-option contexts (multiple input) */
    int n_choices;
    int gold;          /* index into choices */
    char *target;      /* multiple input only: the continuation shared by every option */
    char *key;         /* identity of the dataset row as lm-eval sees it (its HF dict's fields);
                        * few-shot draws drop pool docs whose key equals the evaluated doc's */
} m2d_mc_doc;

typedef struct {
    m2d_mc_doc *docs;
    int n, cap;
} m2d_mc_docs;

void m2d_mc_docs_push(m2d_mc_docs *s, m2d_mc_doc d);   /* takes ownership of d's strings */
void m2d_mc_docs_free(m2d_mc_docs *s);
/* Python `doc == other` (lm-eval drops the evaluated doc from its few-shot draw by dict
 * equality): compares keys when both have one, else the processed fields. */
int m2d_mc_doc_equal(const m2d_mc_doc *a, const m2d_mc_doc *b);

typedef enum { M2D_FEWSHOT_RANDOM = 0, M2D_FEWSHOT_FIRST_N = 1 } m2d_fewshot_sampler;

/* A loaded (sub)task: evaluation split, few-shot pool, and how to render them. */
typedef struct {
    char name[96];             /* "arc_easy", "mmlu_abstract_algebra" */
    char *description;         /* prepended to every prompt ("" if none) */
    m2d_mc_docs eval;
    m2d_mc_docs pool_own;      /* few-shot pool when it is a separate split */
    int pool_is_eval;          /* the pool is the evaluation split itself */
    /* lm-eval draws k+1 and drops the evaluated doc when `config.fewshot_split ==
     * config.test_split`; that holds (None == None) for tasks that name neither split --
     * hellaswag and winogrande -- even though their pool is the train split. */
    int draw_extra;
    m2d_fewshot_sampler sampler;
    int multiple_input;        /* Winogrande-style partial scoring */
    int has_acc_norm;
    char **notes;              /* deviations from lm-eval, one line each */
    int n_notes;
} m2d_mc_task;

const m2d_mc_docs *m2d_mc_task_pool(const m2d_mc_task *t);
void m2d_mc_task_note(m2d_mc_task *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void m2d_mc_task_free(m2d_mc_task *t);

/* ---- task plugins ---- */
typedef struct {
    const char *name;          /* "arc_easy"; a family (mmlu) expands into subtasks */
    const char *summary;
    int paper_shots;           /* the paper's setting (--shots paper) */
    const char *paper_metric;  /* "acc" or "acc_norm": the number the paper-style average uses */
    int n_subtasks;            /* 1, or 57 for mmlu */
    const char *(*subtask_name)(int i);   /* NULL when n_subtasks == 1 */
    /* Micro-averaged groups (lm-eval weight_by_size): the group of subtask i ("stem"), reported
     * as "<name>_<group>", and the family total "<name>". NULL: no groups. */
    const char *(*subtask_group)(int i);
    /* Load subtask i from DATA_DIR; errors name the file (and line/row and field). `shots` lets
     * the loader record notes that only matter for few-shot prompts. */
    int (*load)(const char *data_dir, int i, int shots, m2d_mc_task *out);
} m2d_mc_plugin;

void m2d_mc_plugin_register(const m2d_mc_plugin *p);
const m2d_mc_plugin *m2d_mc_plugin_find(const char *name);
int m2d_mc_plugin_count(void);
const m2d_mc_plugin *m2d_mc_plugin_at(int i);   /* sorted by name */
char *m2d_mc_plugin_list(void);                 /* "arc_challenge, arc_easy, ..." (malloc'd) */

#define M2D_MC_TASK(ident, ...)                                                  \
    static const m2d_mc_plugin ident##_mc_plugin = {__VA_ARGS__};                \
    __attribute__((constructor)) static void ident##_mc_register(void) {         \
        m2d_mc_plugin_register(&ident##_mc_plugin);                              \
    }

/* ---- prompts and requests ---- */

/* The few-shot examples for document `doc_index` (indices into the pool, *n_out <= k), drawing
 * from `rng` exactly as lm-eval's ContextSampler: random.sample(pool, k + 1 if draw_extra or the
 * pool is the evaluation split, else k), drop docs equal to the evaluated one, keep the first k;
 * first_n: pool[:k]. */
int m2d_mc_fewshot(const m2d_mc_task *t, m2d_pyrandom *rng, int doc_index, int k, int *idx, int *n_out);
/* description + examples (malloc'd): what precedes doc_to_text / the option contexts. */
char *m2d_mc_fewshot_prefix(const m2d_mc_task *t, const int *idx, int n);

/* The requests of one document (n_choices of them). Strings are malloc'd; free with
 * m2d_mc_requests_free. */
int m2d_mc_doc_requests(const m2d_mc_task *t, int doc_index, const char *prefix, m2d_ll_request *reqs);
void m2d_mc_requests_free(m2d_ll_request *reqs, int n);

/* ---- metrics ---- */
/* acc: argmax ll == gold; acc_norm: argmax ll / len(choice) in code points == gold; ties to the
 * lowest index (numpy argmax). */
void m2d_mc_score(const m2d_mc_doc *d, const double *ll, int *acc, int *acc_norm);
size_t m2d_utf8_codepoints(const char *s);
/* lm-eval mean_stderr of 0/1 items: sample std (n-1) / sqrt(n). NaN ("N/A") when n < 2. */
double m2d_mc_stderr(double sum, int n);
/* lm-eval pooled_sample_stderr for a weight_by_size group; NaN if any part is NaN. */
double m2d_mc_pooled_stderr(const double *stderrs, const int *sizes, int n);

/* ---- running ---- */
typedef struct {
    char name[96];
    int is_group;              /* mmlu, mmlu_stem, ... (micro averages) */
    int n;                     /* documents */
    int shots;
    double acc, acc_stderr;
    int has_acc_norm;
    double acc_norm, acc_norm_stderr;
    char **notes;              /* deviations from lm-eval */
    int n_notes;
} m2d_mc_task_result;

typedef struct {
    m2d_mc_task_result *tasks; /* in run order; mmlu subjects followed by the mmlu groups */
    int n_tasks;
    int has_paper_average;     /* all five tasks were run */
    double paper_average;
    int limit;                 /* 0: none; else first N documents per task (per subject for MMLU) */
    int64_t seed;              /* few-shot seed used */
    int64_t n_requests;
} m2d_mc_results;

typedef struct {
    const char *data_dir;      /* NULL: "data" */
    const char *dump_requests; /* NULL: none; else JSON lines of every scored request */
    int64_t seed;              /* fewshot_random_seed (lm-eval default 1234) */
    int progress;              /* show m2d_progress */
} m2d_mc_config;

#define M2D_MC_SHOTS_PAPER (-1)
void m2d_mc_config_default(m2d_mc_config *c);
/* Run the tasks of the comma-separated list TASKS ("all", task names, mmlu, or mmlu_<subject>).
 * shots: N, or M2D_MC_SHOTS_PAPER; limit 0 = all documents. */
int m2d_mc_run(m2d_lm *lm, const char *tasks, int shots, int limit, const m2d_mc_config *cfg,
               m2d_mc_results *out);
void m2d_mc_results_free(m2d_mc_results *r);
const m2d_mc_task_result *m2d_mc_results_find(const m2d_mc_results *r, const char *name);
/* Human-readable table (with deviations) and a JSON document (malloc'd). */
void m2d_mc_results_print(const m2d_mc_results *r, FILE *f);
char *m2d_mc_results_json(const m2d_mc_results *r);

/* ---- text helpers shared by the task plugins ---- */
/* Python str.strip() (Unicode whitespace), malloc'd. */
char *m2d_py_strip(const char *s, size_t len);
/* Python str.replace(old, new), all occurrences, one left-to-right pass; malloc'd. */
char *m2d_py_replace(const char *s, const char *old, const char *rep);
/* Load a .jsonl file: calls line_fn for each non-empty line parsed with cJSON; errors name
 * PATH:LINE. */
/* HellaSwag's utils.preprocess (evals/tasks/hellaswag.c), exposed for tests. */
char *m2d_hellaswag_preprocess(const char *text);
int m2d_jsonl_each(const char *path, int (*line_fn)(void *user, const void *json, const char *path, int line),
                   void *user);

#endif
