/* sweep_pipeline — the real backend: calibrate once (cached by model and calibration hash) ->
 * per configuration: plan (plugins) -> fingerprint -> build the student in memory -> perplexity.
 *
 * Calibration cache: CACHE_DIR/<model_hash[:16]>-<calib_hash[:16]>.m2dstats (fp32) or
 * ...-bf16.m2dstats (calibrated in bf16), where calib_hash is h-calib's identity of the chosen
 * windows (token ids, L, gate convention). A cache file is used only if it reads back intact and
 * matches both hashes and the precision; otherwise it is recomputed and written atomically.
 * Students are evaluated in the same precision. The entry's lock (ENTRY.lock) is held from the
 * look-up until it is written, so concurrent shards compute it once: the others wait (saying for
 * whom), then read it.
 *
 * Check (before any work, also for --dry-run): every scoring/grouping/scaling value is a
 * registered plugin, every configuration's parameters are taken by its plugins, K is in range,
 * the calibration and PPL lengths fit the teacher's max_position_embeddings, the data files are
 * readable, the MC tasks exist; errors name the value's FILE:LINE:COL.
 *
 * PPL (gptq protocol): the evaluation text is encoded ONCE in prepare; each student is scored by
 * m2d_ppl_gptq_tokens, the core of m2d_ppl_gptq (which encodes per call). lm-eval protocol:
 * m2d_ppl_lmeval. The teacher is scored the same way, on the same windows (evaluate_teacher).
 * Distillation stage: the student in memory distilled from the teacher held open
 * (m2d_distill_run_models, train/distill.h); no temporary checkpoint. A [d2d] candidate
 * (sweep_d2d.h) is pruned from the dense teacher instead (its importance computed in prepare),
 * scored the same way, and distilled from the dense teacher. Registered as sweep backend
 * "pipeline" (the default). */
#include <errno.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>

#include "calib/calib.h"
#include "calib/ensure.h"
#include "convert/convert.h"
#include "engine/engine.h"
#include "evals/lm.h"
#include "evals/mc.h"
#include "evals/ppl.h"
#include "criteria/registry.h"
#include "sweep/sweep_backend.h"
#include "sweep/sweep_d2d.h"
#include "tokenizer/tokenizer.h"
#include "train/distill.h"
#include "base/util.h"

typedef struct {
    const m2d_experiment *x;
    m2d_model *teacher;
    m2d_tokenizer *tk;
    m2d_stats *stats;
    int stats_cached;       /* the statistics were read from the cache (not computed by this run) */
    char *stats_path;       /* the cache file the statistics came from */
    char *ppl_raw;          /* lm-eval: the raw file */
    size_t ppl_raw_len;
    int32_t *ppl_ids;       /* gptq: the joined rows, encoded */
    size_t n_ppl_ids;
    int calib_windows;      /* windows the calibration uses (may be fewer than asked) */
    m2d_d2d *d2d;           /* [d2d]: the dense teacher and its importance */
} pipe_t;

typedef struct {
    m2d_convert_plan *plan;
    m2d_model *student;
    char *dir;              /* a distilled or pruned student: its checkpoint directory (no plan) */
    int pruned;             /* a D2D candidate: DIR is a scratch directory, removed with the student */
} student_t;

static int open_teacher(pipe_t *p) {
    if (p->teacher) return 0;
    if (m2d_model_open(p->x->model, &p->teacher)) return -1;
    return m2d_tokenizer_load(p->x->model, &p->tk);
}

/* The experiment's calibration job: its options, its text encoded (whole or document by document)
 * and the identity of its windows; the windows used go to p->calib_windows (the CSV header records
 * them). */
static int calibration_job(const m2d_sweep_backend *b, pipe_t *p, m2d_calib_job *j) {
    const m2d_experiment *x = p->x;
    if (x->calib_seq_len > p->teacher->cfg.max_position_embeddings)
        return m2d_err("%s: experiment '%s': calibration.seq_len %d exceeds the teacher's max_position_embeddings %d",
                       x->file, x->name, x->calib_seq_len, p->teacher->cfg.max_position_embeddings);
    j->opts = (m2d_calib_opts){.seq_len = x->calib_seq_len, .n_samples = x->calib_samples, .seeded = x->calib_seed >= 0,
                               .seed = (uint64_t)(x->calib_seed >= 0 ? x->calib_seed : 0), .data_path = x->calib_data,
                               .n_threads = m2d_default_threads(), /* calibration runs before the pool: all cores */
                               .progress = 1, .precision = (int)b->precision,
                               /* one cache entry whichever device computes it: their statistics agree
                                * within test_calib's tolerances (gpu_calibration_matches_cpu) */
                               .device = b->device};
    j->cmd = "sweep";
    if (m2d_calib_job_tokens(j, p->tk, strcmp(x->calib_windows, "documents") == 0) ||
        m2d_calib_job_identity(j, p->teacher))
        return -1;
    p->calib_windows = j->n_windows;
    return 0;
}

static char *cache_path(const m2d_sweep_backend *b, const m2d_experiment *x, const char *model_hash,
                        const char *calib_hash) {
    char *name = m2d_strfmt("%.16s-%.16s%s.m2dstats", model_hash, calib_hash, b->precision == M2D_PREC_BF16 ? "-bf16" : "");
    char *path = m2d_path_join(x->cache_dir, name);
    free(name);
    return path;
}

/* The statistics from the cache entry PATH, computed and written first when absent or stale; the
 * entry's lock is held meanwhile, so another process waits and then reads what this one wrote. */
static int cached_statistics(m2d_sweep_backend *b, m2d_calib_job *j, const char *path) {
    pipe_t *p = b->self;
    if (m2d_mkdir_p(p->x->cache_dir) || m2d_calib_ensure(j, p->teacher, path)) return -1;
    p->stats = j->stats;
    p->stats_cached = j->cached;
    j->stats = NULL;
    if (!p->stats_cached)
        fprintf(stderr, "moe2dense sweep: calibrated %d windows x %d tokens in %.1f s -> %s\n", p->stats->n_windows,
                p->x->calib_seq_len, j->seconds, path);
    return 0;
}

static int pipe_prepare(m2d_sweep_backend *b, const m2d_experiment *x, char model_hash[65], char calib_hash[65]) {
    pipe_t *p = b->self;
    if (open_teacher(p)) return -1;
    memcpy(model_hash, p->teacher->model_hash, 65);
    m2d_calib_job j = {0};
    int rc = calibration_job(b, p, &j);
    if (rc == 0) {
        p->stats_path = cache_path(b, x, model_hash, j.hash);
        memcpy(calib_hash, j.hash, 65);
        rc = cached_statistics(b, &j, p->stats_path);
    }
    m2d_calib_job_free(&j);
    if (rc == 0) {
        const m2d_stats *st = p->stats;
        snprintf(b->calibration, sizeof b->calibration, "%s windows=%d requested=%d seq_len=%d tokens=%.0f%s",
                 x->calib_windows, st->n_windows, x->calib_samples, x->calib_seq_len, st->N,
                 st->n_windows < x->calib_samples ? " (fewer windows than requested: the data holds no more)" : "");
        /* loud: the statistics are not what the experiment asked for (a fresh calibration says so
         * itself; cached statistics would otherwise be used silently) */
        if (st->n_windows < x->calib_samples && p->stats_cached)
            fprintf(stderr, "moe2dense sweep: warning: %s: calibration.samples = %d but %s holds only %d window(s) of "
                            "%d tokens (%.0f tokens): the cached statistics of those are used; recorded in the CSV "
                            "header\n",
                    x->file, x->calib_samples, x->calib_data, st->n_windows, x->calib_seq_len, st->N);
    }
    if (rc) return -1;
    if (x->has_d2d && m2d_d2d_open(x, b->device, b->precision, &p->d2d)) return -1;
    /* evaluation data, encoded once */
    if (x->ppl_seq_len > p->teacher->cfg.max_position_embeddings)
        return m2d_err("%s: experiment '%s': ppl.seq_len %d exceeds the teacher's max_position_embeddings %d",
                       x->file, x->name, x->ppl_seq_len, p->teacher->cfg.max_position_embeddings);
    p->ppl_raw = m2d_read_file(x->ppl_data, &p->ppl_raw_len);
    if (!p->ppl_raw) return -1;
    if (p->ppl_raw_len == 0) return m2d_err("%s: empty evaluation file", x->ppl_data);
    if (m2d_ppl_check_utf8(x->ppl_data, p->ppl_raw, p->ppl_raw_len)) return -1;
    if (strcmp(x->ppl_protocol, "gptq") == 0) {
        size_t jl;
        char *joined = m2d_ppl_gptq_text(p->ppl_raw, p->ppl_raw_len, &jl);
        rc = m2d_tokenizer_encode(p->tk, joined, jl, &p->ppl_ids, &p->n_ppl_ids);
        free(joined);
        if (rc) return -1;
        if (p->n_ppl_ids / (size_t)x->ppl_seq_len == 0)
            return m2d_err("%s: %zu tokens is less than one window of %d", x->ppl_data, p->n_ppl_ids, x->ppl_seq_len);
    }
    return 0;
}

/* The convert options of configuration C (PARAMS parsed from c->params). */
static m2d_convert_opts grid_convert_opts(const m2d_grid_config *c, m2d_params params) {
    int moe = !strcmp(c->target, "moe"); /* MoE: the ratio sets K (and the groups of a remapping grouping) */
    return (m2d_convert_opts){.scoring = c->scoring, .grouping = c->grouping, .scaling = moe ? NULL : c->scaling,
                              .K = moe && c->ratio_v > 0 ? 0 : c->K, /* ratio 0: every expert kept */
                              .target = moe ? M2D_TARGET_MOE : M2D_TARGET_DENSE, .params = params,
                              .ratio = moe ? c->ratio_v : 0, .top_k = moe ? c->top_k : 0};
}

static int make_plan(pipe_t *p, const m2d_grid_config *c, m2d_convert_plan **plan) {
    m2d_params params = {0, NULL, NULL};
    if (m2d_params_parse(c->params, &params)) return -1;
    m2d_convert_opts o = grid_convert_opts(c, params);
    int rc = m2d_convert_plan_build(p->teacher, p->stats, &o, plan);
    m2d_params_free(&params);
    return rc;
}

/* A D2D candidate: pruned from the dense teacher into a scratch checkpoint, opened from there. */
static int build_d2d(pipe_t *p, const m2d_grid_config *c, void **out, m2d_sweep_result *res) {
    student_t *s = m2d_calloc(1, sizeof *s);
    if (m2d_d2d_build(p->d2d, c, &s->dir, &s->student, res)) {
        snprintf(res->error, sizeof res->error, "%s", m2d_errmsg());
        free(s);
        return -1;
    }
    s->pruned = 1;
    *out = s;
    return 0;
}

static int pipe_build(m2d_sweep_backend *b, const m2d_grid_config *c, void **out, m2d_sweep_result *res) {
    pipe_t *p = b->self;
    if (m2d_d2d_is_config(c)) return build_d2d(p, c, out, res);
    student_t *s = m2d_calloc(1, sizeof *s);
    if (make_plan(p, c, &s->plan) || m2d_convert_build(p->teacher, s->plan, &s->student)) {
        snprintf(res->error, sizeof res->error, "%s", m2d_errmsg());
        if (s->plan) m2d_convert_plan_free(s->plan);
        free(s);
        return -1;
    }
    memcpy(res->fingerprint, s->plan->fingerprint, 65);
    res->d_dense = s->plan->target == M2D_TARGET_DENSE ? s->student->cfg.intermediate_size : 0;
    res->n_params = m2d_convert_student_params(s->plan, s->student);
    *out = s;
    return 0;
}

/* The perplexity of MODEL (a student, or the teacher) on the experiment's evaluation windows. */
static int model_ppl(m2d_sweep_backend *b, const m2d_model *model, m2d_sweep_result *res) {
    pipe_t *p = b->self;
    const m2d_experiment *x = p->x;
    m2d_engine *e = NULL;
    if (m2d_engine_open(model, &(m2d_engine_opts){.backend = b->device, .n_threads = b->threads, .precision = b->precision,
                                                  .attention = b->attention}, &e))
        return -1;
    int rc;
    m2d_ppl_result r;
    memset(&r, 0, sizeof r);
    if (strcmp(x->ppl_protocol, "gptq") == 0) {
        /* silent: the sweep shows its own progress */
        rc = m2d_ppl_gptq_tokens(e, p->ppl_ids, p->n_ppl_ids, x->ppl_seq_len, x->ppl_max_windows, NULL, &r);
        if (rc == 0) res->ppl = r.ppl;
    } else {
        rc = m2d_ppl_lmeval(e, p->tk, p->ppl_raw, p->ppl_raw_len, x->ppl_seq_len, x->ppl_max_windows, &r);
        if (rc == 0) res->ppl = r.word_perplexity;
    }
    if (rc == 0) res->ppl_windows = r.windows;
    m2d_engine_free(e);
    return rc;
}

static int pipe_evaluate(m2d_sweep_backend *b, void *student, const m2d_grid_config *c, m2d_sweep_result *res) {
    (void)c;
    return model_ppl(b, ((student_t *)student)->student, res);
}

static int pipe_evaluate_teacher(m2d_sweep_backend *b, m2d_sweep_result *res) {
    const m2d_model *t = ((pipe_t *)b->self)->teacher;
    res->n_params = m2d_model_param_counts(&t->cfg).total;
    return model_ppl(b, t, res);
}

static int pipe_evaluate_d2d_teacher(m2d_sweep_backend *b, m2d_sweep_result *res) {
    pipe_t *p = b->self;
    if (!p->d2d) return 1; /* no [d2d] */
    const m2d_model *t = m2d_d2d_teacher(p->d2d);
    res->n_params = m2d_model_param_counts(&t->cfg).total;
    res->layers = t->cfg.num_hidden_layers;
    return model_ppl(b, t, res);
}

static int pipe_d2d_inputs(m2d_sweep_backend *b, char out[65]) {
    pipe_t *p = b->self;
    if (!p->d2d) return 1;
    m2d_d2d_inputs_hash(p->d2d, out);
    return 0;
}

/* MC tasks: the lm-eval scorer over an engine on MODEL (a student in memory, a distilled one: the
 * checkpoint it was opened from, or a teacher) and the teacher's tokenizer, which the student's
 * checkpoint copies (and the dense teacher shares: sweep_d2d checks it). */
static int model_mc(m2d_sweep_backend *b, const m2d_model *model, m2d_sweep_result *res) {
    pipe_t *p = b->self;
    const m2d_experiment *x = p->x;
    m2d_engine *e = NULL;
    m2d_lm *lm = NULL;
    int rc = m2d_engine_open(model, &(m2d_engine_opts){.backend = b->device, .n_threads = b->threads, .precision = b->precision,
                                                        .attention = b->attention}, &e) ||
             m2d_lm_engine_wrap(e, p->tk, M2D_LM_CACHED, 0, &lm);
    m2d_mc_config cfg;
    m2d_mc_config_default(&cfg);
    cfg.data_dir = x->mc_data_dir;
    cfg.progress = 0;
    double avg = 0;
    for (int t = 0; rc == 0 && t < x->n_mc; t++) {
        m2d_mc_results r;
        memset(&r, 0, sizeof r);
        rc = m2d_mc_run(lm, x->mc_tasks[t], x->mc_shots[t], x->mc_limit, &cfg, &r);
        const m2d_mc_task_result *tr = rc == 0 ? m2d_mc_results_find(&r, x->mc_tasks[t]) : NULL;
        if (rc == 0 && !tr) rc = m2d_err("multiple choice: no result for task '%s'", x->mc_tasks[t]);
        if (rc == 0) {
            res->mc[2 * t] = tr->acc;
            res->mc[2 * t + 1] = tr->has_acc_norm ? tr->acc_norm : NAN;
            const m2d_mc_plugin *pl = m2d_mc_plugin_find(x->mc_tasks[t]);
            /* the paper-style average uses each task's paper metric (acc_norm where the paper does) */
            int norm = pl && pl->paper_metric && !strcmp(pl->paper_metric, "acc_norm") && tr->has_acc_norm;
            avg += norm ? tr->acc_norm : tr->acc;
        }
        m2d_mc_results_free(&r);
    }
    if (rc == 0 && x->n_mc) res->mc[2 * x->n_mc] = avg / x->n_mc;
    if (lm) m2d_lm_free(lm);
    m2d_engine_free(e);
    return rc ? -1 : 0;
}

static int pipe_evaluate_mc(m2d_sweep_backend *b, void *student, const m2d_grid_config *c, m2d_sweep_result *res) {
    (void)c;
    return model_mc(b, ((student_t *)student)->student, res);
}

static int pipe_evaluate_teacher_mc(m2d_sweep_backend *b, int d2d, m2d_sweep_result *res) {
    pipe_t *p = b->self;
    if (d2d && !p->d2d) return 1; /* no [d2d] */
    return model_mc(b, d2d ? m2d_d2d_teacher(p->d2d) : p->teacher, res);
}

/* Distil the student S in memory from TEACHER (a parameter: the teacher of the distillation need
 * not be the one the student was converted from) into O->out, then open O->out as the distilled
 * student: its PPL and MC are those of the checkpoint a user gets (in the teacher's dtype unless
 * fp32). The output's moe2dense.json extends the plan's, as `convert` would have written it. */
/* The moe2dense.json text a distilled student's extends: a converted student's plan, or a pruned
 * candidate's own file */
static char *student_manifest(pipe_t *p, const student_t *s) {
    if (!s->pruned) return m2d_convert_manifest(p->teacher, s->plan, p->stats_path);
    char *path = m2d_path_join(s->dir, "moe2dense.json");
    char *text = m2d_read_file(path, NULL);
    free(path);
    return text;
}

static int distill_student(pipe_t *p, const m2d_model *teacher, const student_t *s, const m2d_distill_opts *o,
                           student_t **distilled, m2d_distill_result *res) {
    char *manifest = student_manifest(p, s);
    if (!manifest) return -1;
    int rc = m2d_distill_run_models(o, &(m2d_distill_models){teacher, s->student, manifest}, res);
    free(manifest);
    if (rc == 0 && !res->finished) rc = m2d_err("distill: %s: the run stopped before its last step", o->out);
    if (rc) return -1;
    student_t *out = m2d_calloc(1, sizeof *out);
    out->dir = m2d_strdup(o->out);
    if (m2d_model_open(o->out, &out->student)) {
        free(out->dir), free(out);
        return -1;
    }
    *distilled = out;
    return 0;
}

/* The distill hook: the experiment's teacher distils the student. */
static int pipe_distill(m2d_sweep_backend *b, void *student, const m2d_grid_config *c, const m2d_distill_opts *o,
                        void **distilled, m2d_distill_result *res, char error[256]) {
    (void)c;
    pipe_t *p = b->self;
    const student_t *s = student;
    /* a D2D candidate is distilled from the dense teacher (which has no routing to override:
     * m2d_d2d_check refuses K' lists) */
    m2d_distill_opts d = *o;
    if (s->pruned) d.teacher = p->x->d2d_teacher, d.train.teacher_topk = 0;
    const m2d_model *teacher = s->pruned ? m2d_d2d_teacher(p->d2d) : p->teacher;
    student_t *out = NULL;
    if (distill_student(p, teacher, s, &d, &out, res)) {
        snprintf(error, 256, "%s", m2d_errmsg());
        return -1;
    }
    *distilled = out;
    return 0;
}

static void pipe_free_student(m2d_sweep_backend *b, void *student) {
    (void)b;
    student_t *s = student;
    if (!s) return;
    if (s->dir) {
        m2d_model_close(s->student);
        if (s->pruned) m2d_d2d_remove_dir(s->dir);
        free(s->dir);
    } else {
        m2d_convert_student_free(s->student);
        m2d_convert_plan_free(s->plan);
    }
    free(s);
}

static void pipe_destroy(m2d_sweep_backend *b) {
    pipe_t *p = b->self;
    m2d_d2d_free(p->d2d);
    m2d_calib_stats_free(p->stats);
    if (p->tk) m2d_tokenizer_free(p->tk);
    if (p->teacher) m2d_model_close(p->teacher);
    free(p->ppl_raw);
    free(p->ppl_ids);
    free(p->stats_path);
    free(p);
}

/* The cached statistics, for the dry run (which never calibrates): 0, or -1 when there are none. */
static int load_cached_stats(const m2d_sweep_backend *b, pipe_t *p, const m2d_experiment *x) {
    if (p->stats) return 0;
    if (open_teacher(p)) return -1;
    m2d_calib_job j = {0};
    if (calibration_job(b, p, &j) == 0) {
        char *path = cache_path(b, x, p->teacher->model_hash, j.hash);
        p->stats = m2d_calib_cached(&j, p->teacher, path);
        free(path);
    }
    m2d_calib_job_free(&j);
    return p->stats ? 0 : -1;
}

/* A D2D candidate's stand-in for the dry run's count: its canonical shape (two specs that resolve
 * to one shape are one student); 1 when it does not fit the dense teacher. */
static int d2d_plan_fingerprint(const m2d_experiment *x, const m2d_grid_config *c, char fp[65]) {
    m2d_config t;
    if (m2d_config_load(x->d2d_teacher, &t, NULL)) return -1;
    char canon[96], *s = NULL;
    int rc = m2d_d2d_params(&t, m2d_d2d_spec(c->params), canon, sizeof canon) < 0 ? 1 : 0;
    if (rc == 0) s = m2d_strfmt("d2d-shape\n%s\n", canon), m2d_sha256_hex(s, strlen(s), fp);
    free(s);
    m2d_config_free(&t);
    m2d_err_clear();
    return rc;
}

/* The plan only (no weights are built): its fingerprint is the student's. */
static int pipe_plan_fingerprint(m2d_sweep_backend *b, const m2d_experiment *x, const m2d_grid_config *c,
                                 char fp[65]) {
    pipe_t *p = b->self;
    if (m2d_d2d_is_config(c)) return d2d_plan_fingerprint(x, c, fp);
    if (load_cached_stats(b, p, x)) return -1;
    m2d_convert_plan *plan;
    if (make_plan(p, c, &plan)) return 1; /* fails at run time too */
    memcpy(fp, plan->fingerprint, 65);
    m2d_convert_plan_free(plan);
    return 0;
}

/* ---- the check before any work ---- */

/* Every value of axis KEY names a registered plugin of KIND. */
static int check_axis_plugins(const m2d_experiment *x, const char *key, m2d_plugin_kind kind) {
    for (int i = 0; i < x->n_configs; i++) {
        const m2d_grid_config *c = &x->configs[i];
        if (m2d_d2d_is_config(c)) continue; /* not a plugin's: sweep_d2d.h */
        const char *v = kind == M2D_SCORING ? c->scoring : kind == M2D_GROUPING ? c->grouping : c->scaling;
        if (m2d_plugin_find(kind, v) || (kind == M2D_SCALING && !strcmp(c->target, "moe"))) continue; /* MoE: no scaling */
        if (kind == M2D_SCORING && m2d_baseline_lookup(v) != M2D_BASELINE_NONE) continue; /* random-ffn, random-init */
        char at[512];
        m2d_experiment_where(x, key, v, at, sizeof at);
        return m2d_err("%s: %s: unknown %s plugin '%s' (see 'moe2dense list')", at, key, m2d_plugin_kind_name(kind), v);
    }
    return 0;
}

/* Each configuration as the conversion will see it: parameters parse and are taken, K fits. */
static int check_configs(const m2d_experiment *x, const m2d_config *cfg) {
    for (int i = 0; i < x->n_configs; i++) {
        const m2d_grid_config *c = &x->configs[i];
        if (m2d_d2d_is_config(c)) continue; /* checked by m2d_d2d_check */
        m2d_params params = {0, NULL, NULL};
        int rc = m2d_params_parse(c->params, &params);
        if (rc == 0) {
            m2d_convert_opts o = grid_convert_opts(c, params);
            rc = m2d_convert_check(cfg, x->model, &o);
            m2d_params_free(&params);
        }
        if (rc == 0) continue;
        char at[512], *why = m2d_strdup(m2d_errmsg());
        m2d_experiment_where(x, c->params[0] ? "axes.params" : "axes.scoring", c->params[0] ? c->params : c->scoring,
                             at, sizeof at);
        m2d_err("%s: configuration %s/%s/%s K=%d params '%s': %s", at, c->scoring, c->grouping, c->scaling, c->K,
                c->params, why);
        free(why);
        return -1;
    }
    return 0;
}

/* LEN (the value of KEY) fits the teacher. */
static int check_length(const m2d_experiment *x, const char *key, int len, const m2d_config *cfg) {
    if (len <= cfg->max_position_embeddings) return 0;
    char at[512];
    return m2d_err("%s: '%s' %d exceeds the teacher's max_position_embeddings %d (%s/config.json)",
                   m2d_experiment_where(x, key, NULL, at, sizeof at), key, len, cfg->max_position_embeddings, x->model);
}

static int check_readable(const m2d_experiment *x, const char *key, const char *path) {
    int fd = m2d_open_input(path); /* a regular file (a FIFO would block the run) */
    if (fd >= 0) return close(fd);
    char at[512], *msg = m2d_strdup(m2d_errmsg()), *why = msg; /* "PATH: cannot open: REASON" or "PATH: REASON" */
    if (!strncmp(why, path, strlen(path)) && !strncmp(why + strlen(path), ": ", 2)) why += strlen(path) + 2;
    if (!strncmp(why, "cannot open: ", 13)) why += 13;
    m2d_err("%s: '%s': %s: cannot read: %s", m2d_experiment_where(x, key, NULL, at, sizeof at), key, path, why);
    free(msg);
    return -1;
}

static int check_mc_tasks(const m2d_experiment *x) {
    for (int t = 0; t < x->n_mc; t++) {
        if (m2d_mc_plugin_find(x->mc_tasks[t])) continue;
        char at[512];
        return m2d_err("%s: mc.tasks: unknown task '%s' (see 'moe2dense list')",
                       m2d_experiment_where(x, "mc.tasks", x->mc_tasks[t], at, sizeof at), x->mc_tasks[t]);
    }
    return 0;
}

static int pipe_check(m2d_sweep_backend *b, const m2d_experiment *x) {
    (void)b;
    if (check_axis_plugins(x, "axes.scoring", M2D_SCORING) || check_axis_plugins(x, "axes.grouping", M2D_GROUPING) ||
        check_axis_plugins(x, "axes.scaling", M2D_SCALING) || check_mc_tasks(x) ||
        check_readable(x, "calibration.data", x->calib_data) || check_readable(x, "ppl.data", x->ppl_data) ||
        m2d_d2d_check(x))
        return -1;
    m2d_config cfg;
    if (m2d_config_load(x->model, &cfg, NULL) != 0) {
        /* a dry run may go on from the [teacher] hints; a run stops at the teacher anyway */
        if (!x->shape_from_config) {
            m2d_err_clear();
            return 0;
        }
        return -1;
    }
    int rc = check_length(x, "calibration.seq_len", x->calib_seq_len, &cfg) ||
             check_length(x, "ppl.seq_len", x->ppl_seq_len, &cfg) || check_configs(x, &cfg) ? -1 : 0;
    m2d_config_free(&cfg);
    return rc;
}

static void *pipe_open(const m2d_experiment *x) {
    pipe_t *p = m2d_calloc(1, sizeof *p);
    p->x = x;
    return p;
}

M2D_SWEEP_BACKEND(pipeline, .name = "pipeline", .open = pipe_open, .destroy = pipe_destroy, .check = pipe_check,
                  .prepare = pipe_prepare,
                  .build = pipe_build, .evaluate = pipe_evaluate, .free_student = pipe_free_student,
                  .evaluate_mc = pipe_evaluate_mc, .distill = pipe_distill, .plan_fingerprint = pipe_plan_fingerprint,
                  .evaluate_teacher = pipe_evaluate_teacher, .evaluate_d2d_teacher = pipe_evaluate_d2d_teacher,
                  .d2d_inputs = pipe_d2d_inputs,
                  .evaluate_teacher_mc = pipe_evaluate_teacher_mc)
