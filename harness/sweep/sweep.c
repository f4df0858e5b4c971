#include "sweep/sweep.h"

#include <math.h>
#include <pthread.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "io/results.h"
#include "base/util.h"
#include "engine/backend.h"
#include "engine/engine.h"
#include "model/model.h"
#include "sweep/sweep_backend.h"
#include "sweep/sweep_csv.h"
#include "sweep/sweep_d2d.h"
#include "sweep/sweep_distill.h"
#include "sweep/sweep_mc.h"
#include "sweep/sweep_pool.h"
#include "sweep/report_scoring_k.h"

/* sweep — the two entry points: a run (backend by name, threads, prepare, the CSV opened or
 * resumed, the worker pool, the multiple-choice stage) and the dry run (plan and estimate). */

/* The configurations of this run or shard (indices into x->configs, malloc'd); returns the count. */
static int run_configs(const m2d_experiment *x, const m2d_sweep_opts *o, int **idx) {
    if (o->shard_n) return m2d_grid_shard(x, o->shard_i, o->shard_n, idx);
    *idx = m2d_malloc((size_t)(x->n_configs + 1) * sizeof **idx);
    for (int i = 0; i < x->n_configs; i++) (*idx)[i] = i;
    return x->n_configs;
}

static void choose_threads(const m2d_sweep_opts *o, int n_todo, int *jobs, int *threads) {
    int cores = m2d_default_threads();
    *jobs = o->jobs > 0 ? o->jobs : 1;
    if (*jobs > n_todo && n_todo > 0) *jobs = n_todo;
    *threads = o->threads > 0 ? o->threads : M2D_MAX(1, cores / *jobs);
}

/* The directory OUT goes into. */
static int make_parent_dir(const char *out) {
    char *dir = m2d_strdup(out);
    char *slash = strrchr(dir, '/');
    int rc = 0;
    if (slash && slash != dir) {
        *slash = 0;
        rc = m2d_mkdir_p(dir);
    }
    free(dir);
    return rc;
}

/* The distillation stage, else the multiple-choice stage, when the experiment has one (a shard
 * leaves them to the merged CSV). With [distill], MC tasks are scored on the distilled students
 * inside the distillation stage. With MC tasks, the teachers' MC first, into OUT's header
 * (m2d_sweep_teacher_mc). */
static int stages_if_configured(const m2d_experiment *x, const m2d_sweep_opts *o, m2d_sweep_backend *b,
                                const char *out, const m2d_sweep_meta *meta, m2d_sweep_summary *sum) {
    int mc = x->n_mc && strcmp(x->mc_configs, "none") != 0;
    if (!mc && !x->has_distill) return 0;
    const char *stage = x->has_distill ? "distillation" : "multiple-choice";
    if (o->shard_n > 1) {
        fprintf(stderr, "moe2dense sweep: %s stage skipped in a shard: it runs on the merged CSV "
                        "(moe2dense sweep %s --experiment %s --out MERGED.csv)\n", stage, x->file, x->name);
        return 0;
    }
    if (x->n_mc && !b->evaluate_mc) return m2d_err("backend '%s' cannot run multiple-choice tasks", b->name);
    if (x->has_distill && !b->distill) return m2d_err("backend '%s' cannot distill", b->name);
    if (x->n_mc && m2d_sweep_teacher_mc(x, b, out)) return -1; /* the teachers' rows of the tables */
    if (x->has_distill) return m2d_sweep_distill_stage(x, b, out, meta, sum);
    return m2d_sweep_mc_stage(x, b, out, meta, sum);
}

/* The teacher's perplexity on the students' windows into the run header (teacher_ppl=, and
 * d2d_teacher_ppl= for a [d2d] block's dense teacher; " params=N" when the backend counts them),
 * where the backend measures it and OUT is new (a resumed file keeps the header it has). */
static int teacher_ppl_meta(m2d_sweep_backend *b, const char *out, m2d_sweep_meta *meta) {
    if (!b->evaluate_teacher || m2d_file_exists(out)) return 0;
    m2d_sweep_result r, d;
    memset(&r, 0, sizeof r);
    memset(&d, 0, sizeof d);
    if (b->evaluate_teacher(b, &r)) return -1;
    m2d_sweep_meta_add(meta, m2d_strfmt("teacher_ppl=%.6f windows=%d params=%lld", r.ppl, r.ppl_windows,
                                        (long long)r.n_params));
    int rc = b->x->has_d2d && b->evaluate_d2d_teacher ? b->evaluate_d2d_teacher(b, &d) : 1;
    if (rc < 0) return -1;
    if (rc == 0)
        m2d_sweep_meta_add(meta, m2d_strfmt("d2d_teacher_ppl=%.6f windows=%d params=%lld layers=%d teacher=%s", d.ppl,
                                            d.ppl_windows, (long long)d.n_params, d.layers,
                                            b->x->d2d_teacher));
    return 0;
}

/* --retry-failed: OUT's failed rows dropped, and its sidecars' (failed distillations and MC
 * evaluations are tried again too), once OUT's identity is this experiment's: another
 * experiment's file is refused before anything in it changes. */
static int retry_failed_rows(const m2d_experiment *x, const char *out, char **cols, int n_cols, const m2d_sweep_meta *meta) {
    m2d_results_writer probe = {0};
    m2d_results seen = {0};
    int rc = m2d_results_open(out, (const char *const *)cols, n_cols, (const char *const *)meta->items, meta->n,
                              m2d_sweep_identity_keys, m2d_sweep_n_identity_keys, &probe, &seen);
    m2d_results_close(&probe);
    m2d_results_free(&seen);
    const char *sides[] = {"", ".distill.csv", ".mc.csv"};
    for (size_t i = 0; i < M2D_ARRAY_LEN(sides) && rc == 0; i++) {
        if (i == 1 && !x->has_distill) continue;
        char *path = m2d_strfmt("%s%s", out, sides[i]);
        rc = m2d_sweep_drop_failed_rows(path);
        free(path);
    }
    return rc;
}

/* Everything after the backend is made: prepare it, open (or resume) OUT, the pool, the MC stage. */
static int run_with_backend(const m2d_experiment *x, const m2d_sweep_opts *o, const char *out, m2d_sweep_backend *b,
                            const int *idx, int n_idx, m2d_sweep_summary *sum) {
    char model_hash[65] = "", calib_hash[65] = "";
    double t_prep = m2d_now();
    if (b->prepare(b, x, model_hash, calib_hash)) return -1;
    m2d_sweep_meta meta = {0};
    char precision[48]; /* the identity key: GEMMs, and attention where it is not fp32 (CSVs before it have none) */
    snprintf(precision, sizeof precision, "%s%s", m2d_precision_name(b->precision),
             b->attention == M2D_PREC_BF16 ? " attention=bf16" : "");
    m2d_sweep_meta_build(x, o->shard_i, o->shard_n, model_hash, calib_hash, precision, &meta);
    if (b->calibration[0]) m2d_sweep_meta_add(&meta, m2d_strfmt("calibration=%s", b->calibration));
    /* an identity key written only off the CPU: CSVs from before it (and every CPU run) have none */
    if (strcmp(b->device, "cpu") != 0) m2d_sweep_meta_add(&meta, m2d_strfmt("device=%s", b->device));
    char d2d[65]; /* an identity key where the experiment prunes a dense teacher too */
    if (b->d2d_inputs && b->d2d_inputs(b, d2d) == 0) m2d_sweep_meta_add(&meta, m2d_strfmt("d2d_inputs=%.16s", d2d));
    if (teacher_ppl_meta(b, out, &meta)) {
        m2d_sweep_meta_free(&meta);
        return -1;
    }
    sum->prepare_s = m2d_now() - t_prep;
    char **cols = NULL;
    int n_cols = m2d_sweep_columns(x, &cols);
    m2d_results existing = {0};
    m2d_results_writer w = {0};
    int rc = o->retry_failed ? retry_failed_rows(x, out, cols, n_cols, &meta) : 0;
    if (rc == 0)
        rc = m2d_results_open(out, (const char *const *)cols, n_cols, (const char *const *)meta.items, meta.n,
                              m2d_sweep_identity_keys, m2d_sweep_n_identity_keys, &w, &existing);
    if (rc == 0) {
        m2d_sweep_pool_job job = {x, b, &w, &existing, idx, n_idx, sum->jobs};
        rc = m2d_sweep_pool_run(&job, sum);
    }
    m2d_results_close(&w); /* the MC stage may rewrite OUT */
    double t_stages = m2d_now();
    if (rc == 0) rc = stages_if_configured(x, o, b, out, &meta, sum);
    sum->stages_s = m2d_now() - t_stages;
    m2d_results_free(&existing);
    m2d_sweep_meta_free(&meta);
    m2d_sweep_columns_free(cols, n_cols);
    return rc;
}

/* The backend of X, made and checked for a run on DEVICE (nothing has been written when this fails). */
static int backend_checked(const m2d_experiment *x, const char *device, m2d_sweep_backend *b) {
    if (m2d_sweep_backend_make(x, b)) return -1;
    if ((!b->check || b->check(b, x) == 0) && m2d_sweep_distill_check(x, device) == 0) return 0;
    m2d_sweep_backend_close(b);
    return -1;
}

/* OUT's lock for the whole run (pool, MC stage, rewrites); a dead run's temp files are removed. */
static int lock_output(const char *out, const m2d_sweep_opts *o, m2d_lock *lock) {
    if (make_parent_dir(out) || m2d_check_output_path(out) ||
        m2d_lock_acquire(lock, out, "sweep", "another sweep writes it: wait for it, or use another --out", 0))
        return -1;
    if (o->no_resume && m2d_file_exists(out)) {
        m2d_lock_release(lock);
        return m2d_err("sweep: %s exists and --no-resume was given (move it away or drop --no-resume)", out);
    }
    char *mc = m2d_strfmt("%s.mc.csv", out), *distill = m2d_strfmt("%s.distill.csv", out);
    int n = m2d_atomic_remove_leftovers(out) + m2d_atomic_remove_leftovers(mc) + m2d_atomic_remove_leftovers(distill);
    if (n) fprintf(stderr, "moe2dense sweep: removed %d temporary file(s) an interrupted run left next to %s\n", n, out);
    free(mc), free(distill);
    return 0;
}

int m2d_sweep_run(const m2d_experiment *x, const m2d_sweep_opts *o, m2d_sweep_summary *sum) {
    memset(sum, 0, sizeof *sum);
    double t_start = m2d_now();
    const char *out = o->out ? o->out : x->out;
    m2d_sweep_backend b;
    if (backend_checked(x, o->device, &b)) return -1;
    m2d_lock lock;
    if (lock_output(out, o, &lock)) {
        m2d_sweep_backend_close(&b);
        return -1;
    }
    int *idx = NULL, n_idx = run_configs(x, o, &idx);
    sum->total = n_idx;
    int jobs, threads;
    choose_threads(o, n_idx, &jobs, &threads);
    b.threads = threads;
    b.device = o->device ? o->device : "cpu";
    b.attention = o->attention;
    if (m2d_device_check(b.device, "sweep: --device") || m2d_engine_resolve_precision(b.device, o->precision, &b.precision) ||
        m2d_engine_check_attention(b.device, o->attention)) {
        free(idx);
        m2d_sweep_backend_close(&b);
        return -1;
    }
    m2d_backend_host_blas_threads(threads);
    sum->jobs = jobs;
    sum->threads = threads;
    int rc = run_with_backend(x, o, out, &b, idx, n_idx, sum);
    free(idx);
    m2d_sweep_backend_close(&b);
    m2d_lock_release(&lock);
    sum->wall_s = m2d_now() - t_start;
    return rc;
}

/* ---- dry run ---- */

typedef m2d_run_shape shape;

void m2d_run_shape_from_config(const m2d_config *c, m2d_run_shape *s) {
    int moe = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) moe += c->layer_is_moe ? c->layer_is_moe[l] : 1;
    size_t db = m2d_dtype_size(c->torch_dtype);
    *s = (m2d_run_shape){c->vocab_size, c->hidden_size, c->num_hidden_layers, moe, c->num_attention_heads,
                         c->num_key_value_heads, c->head_dim, c->moe_intermediate_size, c->num_experts,
                         c->num_experts_per_tok, c->intermediate_size, db ? (int64_t)db : 2, c->tie_word_embeddings};
}

/* The shape from MODEL/config.json, else from the experiment's [teacher] table when it gives every
 * dimension the estimates need; *SOURCE names which. */
static int read_shape(const m2d_experiment *x, shape *sh, const char **source) {
    m2d_config c;
    if (m2d_config_load(x->model, &c, NULL) == 0) {
        m2d_run_shape_from_config(&c, sh);
        m2d_config_free(&c);
        *source = "MODEL/config.json";
        return 0;
    }
    m2d_err_clear();
    if (!x->t_vocab || !x->t_hidden || !x->t_layers || !x->t_heads || !x->t_kv_heads || !x->t_head_dim || x->E < 1 ||
        x->k < 1 || x->d_e < 1)
        return -1;
    /* [teacher] describes an all-MoE teacher (Qwen3-30B-A3B: decoder_sparse_step 1, no mlp_only_layers) */
    *sh = (shape){x->t_vocab, x->t_hidden, x->t_layers, x->t_layers, x->t_heads, x->t_kv_heads, x->t_head_dim,
                  x->d_e, x->E, x->k, x->t_intermediate, 2, 0};
    *source = "[teacher] (config.json not readable)";
    return 0;
}

/* Parameters of the teacher (MOE_K 0, DENSE 0); of a smaller-MoE student of MOE_K experts (each
 * with its router row); of the dense student (DENSE 1: one SwiGLU FFN of the k groups' width k d_e
 * per MoE layer, no router, whatever K was: K experts are merged into k groups). */
/* one layer's attention: q, k, v, o and the two norms (and the q/k norms' head_dim each) */
static int64_t attn_params(const shape *s) {
    int64_t d = s->hidden;
    return d * s->head_dim * (2 * s->heads + 2 * s->kv_heads) + 2 * d + 2 * s->head_dim;
}

static int64_t shape_params(const shape *s, int64_t moe_K, int dense_student) {
    int64_t d = s->hidden, attn = attn_params(s);
    int64_t n_exp = moe_K > 0 ? moe_K : s->E;
    int64_t moe = dense_student ? 3 * d * s->d_e * s->k : n_exp * (3 * d * s->d_e + d), dense = 3 * d * s->F;
    return s->vocab * d * (s->tied ? 1 : 2) + d + s->layers * attn + s->moe_layers * moe +
           (s->layers - s->moe_layers) * dense;
}

/* Calibration's anonymous memory (BENCHMARKS.md "Memory formula", harness/calib/calib.c ctx_init):
 * the expert-output block [nb, E, d] fp32 (nb = min(L, 512 MiB / (4 E d))) with its fp64 norms,
 * inputs, router logits and gates; one window's forward, ~27 fp32 values per token and hidden unit
 * (the measured 0.66 GB at Qwen3-30B-A3B's shapes, L = 512, less the block); the fp64 Gram's
 * scratch, 16 tokens of every expert's output a thread (backend_cpu_moe.c m2d_cpu_gram); and the
 * statistics, 8 (2 E^2 + 6 E d + 27 E) bytes per MoE layer (calib/stats.c SLOTS: the two Gram
 * matrices, three sums and three derived means per dimension, 27 per-expert vectors). */
static double calib_bytes(const shape *s, int L, int threads) {
    double E = (double)s->E, d = (double)s->hidden;
    double nb = fmax(1, fmin(L, floor(512.0 * 1024 * 1024 / (4 * E * d))));
    return 4 * nb * E * d + 8 * nb * (2 * E + d + (double)s->k) + 4 * 27.0 * L * d +
           8 * 16 * E * d * threads + 8 * (2 * E * E + 6 * E * d + 27 * E) * (double)s->moe_layers;
}

void m2d_run_memory_estimate(const m2d_run_shape *s, int calib_L, int moe_K_max, int threads, m2d_run_memory *m) {
    m->teacher_params = shape_params(s, 0, 0);
    m->student_params = shape_params(s, 0, 1);
    if (moe_K_max > 0) m->student_params = M2D_MAX(m->student_params, shape_params(s, moe_K_max, 0));
    m->teacher = (double)s->dtype_bytes * (double)m->teacher_params;
    m->calib = calib_bytes(s, calib_L, M2D_MAX(1, threads));
    m->student = (double)s->dtype_bytes * (double)m->student_params;
    m->total = m->teacher + m->calib + m->student;
    /* the largest layer (an MoE layer's experts, router and attention) beside the LM head */
    int64_t d = s->hidden, layer = attn_params(s) + M2D_MAX(s->moe_layers ? s->E * (3 * d * s->d_e + d) : 0, 3 * d * s->F);
    m->teacher_layer = (double)s->dtype_bytes * (double)(layer + s->vocab * d);
    m->layer_major = m->total > (double)m2d_default_mem_budget();
    if (m->layer_major) m->total = m->teacher_layer + m->calib + m->student;
}

/* BYTES as "%.1f GiB" from 1 GiB up, else "%.1f MiB" */
static const char *fmt_bytes(double bytes, char *buf, size_t n) {
    const double M = 1024.0 * 1024;
    if (bytes >= 1024 * M) snprintf(buf, n, "%.1f GiB", bytes / (1024 * M));
    else snprintf(buf, n, "%.1f MiB", bytes / M);
    return buf;
}

void m2d_run_memory_print(const m2d_run_memory *m, FILE *f) {
    const double G = 1024.0 * 1024 * 1024;
    char a[32], b[32], c[32], d[32], e[32];
    if (m->layer_major)
        fprintf(f, "peak memory: ~%s (teacher one layer at a time: %s of its %s mapped as stored, calibration %s, "
                   "student %s; README \"Memory of a sweep\")\nthe teacher exceeds the memory budget (80 %% of RAM): "
                   "its passes run layer-major, each layer read from disk once per pass\n",
                fmt_bytes(m->total, a, sizeof a), fmt_bytes(m->teacher_layer, e, sizeof e),
                fmt_bytes(m->teacher, b, sizeof b), fmt_bytes(m->calib, c, sizeof c), fmt_bytes(m->student, d, sizeof d));
    else
        fprintf(f, "peak memory: ~%s (teacher %s mapped as stored, calibration %s, student %s; README \"Memory of a "
                   "sweep\")\n", fmt_bytes(m->total, a, sizeof a), fmt_bytes(m->teacher, b, sizeof b),
                fmt_bytes(m->calib, c, sizeof c), fmt_bytes(m->student, d, sizeof d));
    double ram = m2d_physical_ram() ? (double)m2d_physical_ram() : INFINITY;
    if (m->total > ram)
        fprintf(f, "warning: the estimated peak memory (%.1f GiB) exceeds this machine's RAM (%.1f GiB)%s: the run "
                   "may fail\n", m->total / G, ram / G, m->layer_major ? " even with layer-major passes" : "");
}

/* Rough seconds per configuration from FLOPs: 2 * (per-token weights) * scored tokens at an assumed
 * 20 GFLOP/s per core (a deliberately conservative CPU figure). A results CSV with measured wall
 * times replaces this guess. */
#define ASSUMED_FLOPS_PER_CORE 20e9

static double estimate_config_seconds(const m2d_experiment *x, const shape *sh, int64_t *ppl_tokens) {
    int64_t attn = sh->hidden * sh->head_dim * (2 * sh->heads + 2 * sh->kv_heads);
    int64_t ffn = 3 * sh->hidden * sh->k * sh->d_e;
    int64_t per_token = sh->layers * (attn + ffn) + sh->vocab * sh->hidden;
    /* WikiText-2 test: ~4.3 bytes per token for BPE vocabularies (documented rough figure) */
    int64_t tokens = 0;
    struct stat st; /* its size only: never opened (a FIFO would block) */
    if (stat(x->ppl_data, &st) == 0 && S_ISREG(st.st_mode)) {
        tokens = (int64_t)((double)st.st_size / 4.3);
    } else {
        tokens = 290000;
    }
    int64_t windows = tokens / x->ppl_seq_len;
    if (x->ppl_max_windows && windows > x->ppl_max_windows) windows = x->ppl_max_windows;
    *ppl_tokens = windows * x->ppl_seq_len;
    return 2.0 * (double)per_token * (double)*ppl_tokens / (ASSUMED_FLOPS_PER_CORE * m2d_default_threads());
}

double m2d_run_calib_seconds(const m2d_run_shape *sh, double tokens) {
    /* the teacher runs every expert on every token (the Gram matrix needs all f_e) */
    int64_t attn = sh->hidden * sh->head_dim * (2 * sh->heads + 2 * sh->kv_heads);
    int64_t experts = 3 * sh->hidden * sh->E * sh->d_e;
    int64_t per_token = sh->layers * (attn + experts) + sh->vocab * sh->hidden;
    return 2.0 * (double)per_token * tokens / (ASSUMED_FLOPS_PER_CORE * m2d_default_threads());
}

static double calibration_seconds(const m2d_experiment *x, const shape *sh) {
    return m2d_run_calib_seconds(sh, (double)x->calib_samples * x->calib_seq_len);
}

void m2d_fmt_duration(double s, char *buf, size_t n) {
    if (s < 10) snprintf(buf, n, "%.1f s", s);
    else if (s < 120) snprintf(buf, n, "%.0f s", s);
    else if (s < 7200) snprintf(buf, n, "%.1f min", s / 60);
    else snprintf(buf, n, "%.1f h", s / 3600);
}


/* The grid with each configuration's status in EXISTING (NULL: no CSV); returns how many are recorded. */
static int print_grid(const m2d_experiment *x, const int *idx, int n_idx, const m2d_results *existing, FILE *f) {
    fprintf(f, "%5s  %-12s  %-8s %-8s %-12s %-5s %4s  %-16s %s\n", "#", "config_id", "scoring", "grouping", "scaling",
            "K", "", "params", "status");
    int done = 0;
    for (int i = 0; i < n_idx; i++) {
        const m2d_grid_config *c = &x->configs[idx[i]];
        const char *st = "pending";
        for (int r = 0; existing && r < existing->n_rows; r++)
            if (strcmp(m2d_results_get(existing, r, "config_id"), c->id) == 0) st = m2d_results_get(existing, r, "status");
        if (strcmp(st, "pending")) done++;
        char kexpr[24];
        snprintf(kexpr, sizeof kexpr, "(%s)", c->K_expr);
        fprintf(f, "%5d  %-12s  %-8s %-8s %-12s %-5d %4s  %-16s %s\n", c->index + 1, c->id, c->scoring, c->grouping,
                c->scaling, c->K, kexpr, c->params[0] ? c->params : "-", st);
    }
    return done;
}

/* At K = k every group holds one expert, so all groupings give one student per (scoring, scaling,
 * params): an upper bound on the distinct students until the statistics exist. */
static int distinct_upper_bound(const m2d_experiment *x, const int *idx, int n_idx) {
    int collapsed = 0;
    for (int i = 0; i < n_idx; i++) {
        const m2d_grid_config *c = &x->configs[idx[i]];
        if (c->K != x->k || !strcmp(c->target, "moe")) continue; /* an MoE student: not at K = k */
        for (int j = 0; j < i; j++) {
            const m2d_grid_config *d = &x->configs[idx[j]];
            if (d->K == c->K && !strcmp(d->target, c->target) && !strcmp(d->scoring, c->scoring) && !strcmp(d->scaling, c->scaling) &&
                !strcmp(d->params, c->params)) {
                collapsed++;
                break;
            }
        }
    }
    return n_idx - collapsed;
}

/* Distinct students: exact when the backend can tell without evaluating, else the upper bound;
 * returns the number printed. */
static int print_distinct(const m2d_experiment *x, m2d_precision prec, const int *idx, int n_idx, FILE *f) {
    m2d_sweep_backend b;
    int distinct = -1;
    if (m2d_sweep_backend_make(x, &b) == 0) {
        b.precision = prec; /* whose calibration cache to read */
        distinct = m2d_sweep_count_distinct(&b, x, idx, n_idx);
        m2d_sweep_backend_close(&b);
    }
    m2d_err_clear();
    if (distinct >= 0) {
        fprintf(f, "distinct students: %d (from their fingerprints); %d configurations build a student identical to "
                   "an earlier one's (same fingerprint) and will be recorded as dedup_of, not evaluated\n",
                distinct, n_idx - distinct);
        return distinct;
    }
    int upper = distinct_upper_bound(x, idx, n_idx);
    fprintf(f, "distinct students: at most %d (upper bound: groupings coincide at K = k; the exact count needs "
               "the calibration statistics, which are computed on the first run)\n", upper);
    return upper;
}

/* Mean wall time of the evaluated rows of EXISTING (NULL: no CSV); -1 when there are none. */
static double measured_seconds(const m2d_results *existing) {
    int n = 0;
    double sum = 0;
    for (int r = 0; existing && r < existing->n_rows; r++)
        if (!m2d_results_get(existing, r, "dedup_of")[0] && !strcmp(m2d_results_get(existing, r, "status"), "ok")) {
            sum += strtod(m2d_results_get(existing, r, "wall_s"), NULL);
            n++;
        }
    return n ? sum / n : -1;
}

/* the distillation ablation (Tables 4, 5): its axes and the runs per student */
static void print_ablation(const m2d_experiment *x, FILE *f) {
    fprintf(f, "distillation ablation: loss [");
    for (int i = 0; i < x->n_distill_losses; i++) fprintf(f, "%s%s", i ? ", " : "", m2d_loss_name(x->distill_losses[i]));
    fprintf(f, "] x teacher_topk [");
    for (int i = 0; i < x->n_distill_topks; i++)
        fprintf(f, i ? ", %d" : "%d", x->distill_topks[i] ? x->distill_topks[i] : x->k);
    fprintf(f, "] (k = %d: the teacher's own routing): %d distillation(s) per student\n", x->k,
            x->n_distill_losses * x->n_distill_topks);
}

/* Calibration and PPL sizes, and the run time of the TO_RUN configurations still to evaluate. */
/* distill.configs = "best-per-scoring-K": how many students at most (distinct scoring x K in {k, 2k}
 * of the dense students) and, from an existing results file, the rows it selects now */
static void print_scoring_k(const m2d_experiment *x, const m2d_results *existing, FILE *f) {
    int n = 0;
    for (int c = 0; c < x->n_configs; c++) {
        const m2d_grid_config *g = &x->configs[c];
        if (strcmp(g->target, "dense") || m2d_d2d_is_config(g) || (g->K != x->k && g->K != 2 * x->k)) continue;
        int seen = 0;
        for (int d = 0; d < c && !seen; d++)
            seen = !strcmp(x->configs[d].scoring, g->scoring) && x->configs[d].K == g->K &&
                   !strcmp(x->configs[d].target, "dense") && !m2d_d2d_is_config(&x->configs[d]);
        n += !seen;
    }
    fprintf(f, "distillation selection: per scoring the lowest pre-distillation PPL at K = k = %d and at K = 2k = %d "
               "(at most %d students)\n", x->k, 2 * x->k, n);
    int *rows = NULL, m = existing ? m2d_report_best_per_scoring_K(existing, &rows) : 0;
    if (m < 0) m2d_err_clear();
    if (m > 0) {
        fprintf(f, "selected now from the PPLs in the results file (%d):\n", m);
        m2d_report_write_rows(existing, rows, m, f);
    }
    free(rows);
}

static void print_estimate(const m2d_experiment *x, const int *idx, int n_idx, const m2d_results *existing,
                           int to_run, int threads, FILE *f) {
    shape sh;
    const char *source = NULL;
    double per = measured_seconds(existing);
    const char *how = per >= 0 ? "mean measured wall time of the evaluated rows in the CSV" : "";
    int have_shape = read_shape(x, &sh, &source) == 0;
    if (have_shape) {
        fprintf(f, "teacher shape from %s: %lld layers, hidden %lld, vocabulary %lld\n", source, (long long)sh.layers,
                (long long)sh.hidden, (long long)sh.vocab);
        int64_t ppl_tokens;
        double est = estimate_config_seconds(x, &sh, &ppl_tokens);
        if (per < 0) {
            per = est;
            how = "FLOP estimate at 20 GFLOP/s per core; rough";
        }
        char a[32];
        m2d_fmt_duration(calibration_seconds(x, &sh), a, sizeof a);
        fprintf(f, "calibration: %d x %d tokens, ~%s once (cached in %s)\n", x->calib_samples, x->calib_seq_len, a,
                x->cache_dir);
        fprintf(f, "perplexity: %s on %lld tokens per configuration (L = %d)\n", x->ppl_protocol,
                (long long)ppl_tokens, x->ppl_seq_len);
    }
    if (per < 0) {
        fprintf(f, "estimated run time: unknown (teacher config.json not readable, and [teacher] does not give "
                   "vocab_size, hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads and head_dim)\n");
        return;
    }
    char a[32], c2[32];
    m2d_fmt_duration(per, a, sizeof a);
    m2d_fmt_duration(per * to_run, c2, sizeof c2);
    fprintf(f, "estimated run time: ~%s per configuration (%s) -> ~%s for %d to run\n", a, how, c2, to_run);
    if (!have_shape) return;
    int moe_K_max = 0; /* the largest smaller-MoE student; a dense one's width does not grow with K */
    for (int i = 0; i < n_idx; i++)
        if (!strcmp(x->configs[idx[i]].target, "moe")) moe_K_max = M2D_MAX(moe_K_max, x->configs[idx[i]].K);
    m2d_run_memory m;
    m2d_run_memory_estimate(&sh, x->calib_seq_len, moe_K_max, threads, &m);
    m2d_run_memory_print(&m, f);
}

int m2d_sweep_dry_run(const m2d_experiment *x, const m2d_sweep_opts *o, FILE *f) {
    const char *out = o->out ? o->out : x->out;
    m2d_sweep_backend b;
    if (backend_checked(x, o->device, &b)) return -1; /* what the run would refuse, the dry run refuses */
    m2d_sweep_backend_close(&b);
    m2d_results existing = {0};
    int have_csv = m2d_file_exists(out);
    if (have_csv && m2d_results_read_checked(out, &existing)) return -1;
    int *idx = NULL, n_idx = run_configs(x, o, &idx);
    fprintf(f, "experiment %s (%s): %s\n", x->name, x->file, x->description);
    fprintf(f, "teacher %s: E = %d, k = %d%s\n", x->model, x->E, x->k,
            x->shape_from_config ? "" : " (from [teacher]; config.json not readable)");
    int done = print_grid(x, idx, n_idx, have_csv ? &existing : NULL, f);
    fprintf(f, "\nconfigurations: %d", n_idx);
    if (o->shard_n) fprintf(f, " (shard %d/%d of %d)", o->shard_i, o->shard_n, x->n_configs);
    if (x->n_excluded) fprintf(f, "; %d excluded by rules", x->n_excluded);
    if (x->n_duplicate_K)
        fprintf(f, "; %d configurations identical to another in the grid (same resolved settings: K expressions "
                   "that coincide on this teacher, e.g. 8k = E) dropped before the run",
                x->n_duplicate_K);
    fprintf(f, "\n");
    if (have_csv) fprintf(f, "already in %s: %d (resume skips them), to run: %d\n", out, done, n_idx - done);
    m2d_precision prec = M2D_PREC_FP32;
    if (m2d_engine_resolve_precision(NULL, o->precision, &prec)) m2d_err_clear(); /* then: the fp32 cache */
    int students = print_distinct(x, prec, idx, n_idx, f);
    int jobs, threads; /* the run's: its calibration's threads each hold a Gram scratch */
    choose_threads(o, n_idx - done, &jobs, &threads);
    print_estimate(x, idx, n_idx, have_csv ? &existing : NULL, M2D_MIN(n_idx - done, students), threads, f);
    if (strcmp(x->mc_configs, "none") != 0 && x->n_mc)
        fprintf(f, "multiple choice: %d task(s) on %s%s, and on %s (the header's teacher_mc=)\n", x->n_mc,
                x->has_distill ? "the distilled students (distillation stage)" : x->mc_configs,
                x->has_distill ? "" : " configurations", x->has_d2d ? "both teachers" : "the teacher");
    char listed[32];
    snprintf(listed, sizeof listed, "%d listed", x->n_distill_ids);
    if (x->has_distill)
        fprintf(f, "distillation: %s configurations, %s %lld, L = %d, B = %d, loss %s, into %s.distill/\n",
                x->n_distill_ids ? listed : x->distill_configs, x->distill.tokens ? "tokens" : "steps",
                x->distill.tokens ? (long long)x->distill.tokens : (long long)x->distill.train.optim.steps,
                x->distill.train.seq_len, x->distill.train.batch, m2d_loss_name(x->distill.train.loss), out);
    if (x->has_distill && !strcmp(x->distill_configs, "best-per-scoring-K"))
        print_scoring_k(x, have_csv ? &existing : NULL, f);
    if (x->has_distill && x->distill_ablation) print_ablation(x, f);
    m2d_d2d_dry_run(x, f);
    if (x->has_distill && x->distill_val_data && x->distill.eval_every > 0)
        fprintf(f, "distillation validation: every %d step(s) on %s (held out; the tables report %s)\n",
                x->distill.eval_every, x->distill_val_data, x->ppl_data);
    m2d_results_free(&existing);
    free(idx);
    return 0;
}
