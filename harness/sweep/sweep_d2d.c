/* sweep_d2d — the dense-to-dense baseline inside a sweep: checks, the dense teacher and its
 * importance, pruned candidates, the paper's selection rule, the dry run's lines (see sweep_d2d.h). */
#include "sweep/sweep_d2d.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/util.h"
#include "train/params.h"
#include "io/toml.h"
#include "calib/importance.h"
#include "convert/prune.h"
#include "train/distill.h"

int m2d_d2d_is_config(const m2d_grid_config *c) { return !strcmp(c->target, "d2d"); }

int m2d_d2d_is_row(const m2d_results *r, int i) { return !strcmp(m2d_results_get(r, i, "scoring"), M2D_D2D_SCORING); }

const char *m2d_d2d_spec(const char *params) {
    size_t n = strlen(M2D_D2D_PARAMS_PREFIX);
    return strncmp(params, M2D_D2D_PARAMS_PREFIX, n) ? params : params + n;
}

int m2d_d2d_spec_check(const char *spec) {
    m2d_prune_shape s;
    return m2d_prune_shape_parse(spec, &s);
}

int64_t m2d_d2d_params(const m2d_config *t, const char *spec, char *canon, size_t n) {
    m2d_prune_shape s;
    if (m2d_d2d_spec_check(spec)) return -1;
    m2d_prune_shape_parse(spec, &s);
    if (m2d_prune_shape_check(t, &s)) return -1;
    if (canon) m2d_prune_shape_format(t, &s, canon, n);
    return m2d_prune_params(t, &s);
}

/* ---- the paper's selection rule ---- */

int m2d_d2d_best(const double *ppl, int n) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (isfinite(ppl[i]) && (best < 0 || ppl[i] < ppl[best])) best = i;
    return best;
}

/* the pre-distillation PPL of row I when it is an evaluated D2D candidate (a dedup_of row is its
 * twin's), else NaN */
static double candidate_ppl(const m2d_results *r, int i) {
    if (!m2d_d2d_is_row(r, i) || strcmp(m2d_results_get(r, i, "status"), "ok") || m2d_results_get(r, i, "dedup_of")[0])
        return NAN;
    const char *v = m2d_results_get(r, i, "ppl");
    return *v ? strtod(v, NULL) : NAN;
}

int m2d_d2d_best_row(const m2d_results *r) {
    double *ppl = m2d_malloc((size_t)(r->n_rows + 1) * sizeof *ppl);
    for (int i = 0; i < r->n_rows; i++) ppl[i] = candidate_ppl(r, i);
    int best = m2d_d2d_best(ppl, r->n_rows);
    free(ppl);
    return best;
}

int m2d_d2d_keep_best(const m2d_results *r, int *rows, int n) {
    int best = m2d_d2d_best_row(r), kept = 0;
    for (int i = 0; i < n; i++)
        if (!m2d_d2d_is_row(r, rows[i]) || rows[i] == best) rows[kept++] = rows[i];
    return kept;
}

/* ---- checks before any work ---- */

/* "FILE:LINE:COL: experiment 'NAME'" of d2d.KEY (ITEM: the array element) + ": " + the error */
static int err_at(const m2d_experiment *x, const char *dotted, const char *item) {
    char at[512];
    m2d_experiment_where(x, dotted, item, at, sizeof at);
    char *why = m2d_strdup(m2d_errmsg());
    m2d_err("%s: %s: %s", at, dotted, why);
    free(why);
    return -1;
}

/* the two teachers' tokenizer.json are the same bytes (the students are scored on the MoE
 * teacher's encoding of the evaluation text); absent files are the model loader's to refuse */
static int check_tokenizer(const m2d_experiment *x) {
    char *a_path = m2d_path_join(x->model, "tokenizer.json"), *b_path = m2d_path_join(x->d2d_teacher, "tokenizer.json");
    size_t na = 0, nb = 0;
    char *a = m2d_file_exists(a_path) ? m2d_read_file(a_path, &na) : NULL;
    char *b = a && m2d_file_exists(b_path) ? m2d_read_file(b_path, &nb) : NULL;
    int differ = a && b && (na != nb || memcmp(a, b, na));
    free(a), free(b), free(a_path), free(b_path);
    m2d_err_clear();
    if (differ)
        m2d_err("%s/tokenizer.json differs from the MoE teacher's (%s): the perplexities would not compare",
                x->d2d_teacher, x->model);
    return differ ? err_at(x, "d2d.teacher", NULL) : 0;
}

static const m2d_distill_names TOML_NAMES = {"distill.seq_len", "distill.batch", "distill.micro_batch",
                                             "distill.teacher_topk", "ppl.seq_len", "distill.recompute"};

/* the distillation settings against the dense teacher T (lengths; memory of a student S of
 * PARAMS parameters, whose hidden size and depth are the candidate's) */
static int check_distill(const m2d_experiment *x, const m2d_config *t, const m2d_config *s, int64_t params,
                         const char *spec) {
    const char *why = m2d_train_unsupported(s);
    if (why) {
        m2d_err("the training engine does not implement %s: D2D candidate '%s' (%s) cannot be distilled", why, spec,
                s->arch);
        return err_at(x, "distill", NULL);
    }
    m2d_distill_opts o = x->distill;
    o.train.teacher_topk = 0; /* the dense teacher's own forward */
    if (x->distill.eval_every > 0) o.eval_seq_len = x->ppl_seq_len;
    if (m2d_distill_check_settings(&o, t, &TOML_NAMES) ||
        m2d_distill_check_memory(t, s, params, &o.train, &TOML_NAMES)) {
        char *why = m2d_strdup(m2d_errmsg());
        m2d_err("with the dense teacher %s: %s", x->d2d_teacher, why);
        free(why);
        return err_at(x, "distill", NULL);
    }
    for (int i = 0; i < x->n_distill_losses; i++)
        if (x->distill_losses[i] == M2D_LOSS_FKL_MSE &&
            (s->hidden_size != t->hidden_size || s->num_hidden_layers != t->num_hidden_layers)) {
            m2d_err("fkl+mse needs the dense teacher's hidden size and layer count (%d, %d) in every D2D candidate; "
                    "'%s' has (%d, %d)", t->hidden_size, t->num_hidden_layers, spec, s->hidden_size,
                    s->num_hidden_layers);
            return err_at(x, "distill.loss", "fkl+mse");
        }
    if (x->n_distill_topks > 1) {
        m2d_err("a list of teacher_topk values routes the MoE teacher only; a dense teacher has no routing to vary "
                "(drop the list or the [d2d] block)");
        return err_at(x, "distill.teacher_topk", NULL);
    }
    return 0;
}

/* each candidate fits the dense teacher T, and the distillation suits it */
static int check_candidates(const m2d_experiment *x, const m2d_config *t) {
    for (int i = 0; i < x->n_configs; i++) {
        const m2d_grid_config *c = &x->configs[i];
        if (!m2d_d2d_is_config(c)) continue;
        const char *spec = m2d_d2d_spec(c->params);
        m2d_prune_shape s;
        if (m2d_prune_shape_parse(spec, &s) || m2d_prune_shape_check(t, &s)) return err_at(x, "d2d.candidates", spec);
        m2d_config sc = *t; /* the student's shape (sizes only; not freed) */
        sc.hidden_size = s.hidden ? s.hidden : t->hidden_size;
        sc.num_hidden_layers = s.layers ? s.layers : t->num_hidden_layers;
        sc.intermediate_size = s.ffn ? s.ffn : t->intermediate_size;
        if (x->has_distill && check_distill(x, t, &sc, m2d_prune_params(t, &s), spec)) return -1;
    }
    return 0;
}

int m2d_d2d_check(const m2d_experiment *x) {
    if (!x->has_d2d) return 0;
    int fd = m2d_open_input(x->d2d_calib_data);
    if (fd < 0) return err_at(x, m2d_toml_path(x->table, "d2d.data") ? "d2d.data" : "calibration.data", NULL);
    close(fd);
    m2d_config t;
    if (m2d_config_load(x->d2d_teacher, &t, NULL)) {
        if (!x->shape_from_config) return m2d_err_clear(), 0; /* a dry run on [teacher] hints: no teacher here */
        return err_at(x, "d2d.teacher", NULL);
    }
    int rc = 0;
    if (t.num_experts > 0) {
        m2d_err("%s is an MoE (%d experts): the dense-to-dense baseline prunes a dense teacher", x->d2d_teacher,
                t.num_experts);
        rc = err_at(x, "d2d.teacher", NULL);
    }
    if (rc == 0) rc = check_candidates(x, &t);
    m2d_config_free(&t);
    return rc ? -1 : check_tokenizer(x);
}

/* ---- the backend's side ---- */

struct m2d_d2d {
    const m2d_experiment *x;
    m2d_model *teacher;
    char *imp_path;
    char calib_hash[65];
};

const m2d_model *m2d_d2d_teacher(const m2d_d2d *d) { return d->teacher; }

void m2d_d2d_inputs_hash(const m2d_d2d *d, char out[65]) {
    char *s = m2d_strfmt("d2d inputs\n%s\n%s\n", d->teacher->model_hash, d->calib_hash);
    m2d_sha256_hex(s, strlen(s), out);
    free(s);
}

/* cache_dir/<model hash:16>-imp-<hash of the calibration settings:16>[-bf16].m2dimp, as the
 * statistics' cache (sweep_pipeline.c), so that fp32 and bf16 runs keep one file each (the file
 * itself records the model and calibration hashes and the precision; a stale one is recomputed
 * by m2d_importance_ensure) */
static char *importance_path(const m2d_experiment *x, const m2d_model *t, m2d_precision precision) {
    char *key = m2d_strfmt("%s\n%d\n%d\n%lld\n", x->d2d_calib_data, x->d2d_calib_seq_len, x->d2d_calib_samples,
                           (long long)x->d2d_calib_seed);
    char hex[65];
    m2d_sha256_hex(key, strlen(key), hex);
    char *name = m2d_strfmt("%.16s-imp-%.16s%s.m2dimp", t->model_hash, hex, precision == M2D_PREC_BF16 ? "-bf16" : "");
    char *path = m2d_path_join(x->cache_dir, name);
    free(key), free(name);
    return path;
}

static int ensure_importance(m2d_d2d *d, const char *device, m2d_precision precision) {
    const m2d_experiment *x = d->x;
    m2d_calib_opts o;
    memset(&o, 0, sizeof o);
    o.seq_len = x->d2d_calib_seq_len, o.n_samples = x->d2d_calib_samples, o.seeded = x->d2d_calib_seed >= 0;
    o.seed = (uint64_t)(x->d2d_calib_seed >= 0 ? x->d2d_calib_seed : 0), o.data_path = x->d2d_calib_data;
    o.n_threads = m2d_default_threads(), o.progress = 1, o.precision = (int)precision, o.device = device;
    d->imp_path = importance_path(x, d->teacher, precision);
    m2d_importance *imp = NULL;
    double t0 = m2d_now();
    int cached = 0;
    if (m2d_mkdir_p(x->cache_dir) || m2d_importance_ensure(d->teacher, &o, d->imp_path, "sweep", &imp, &cached)) return -1;
    memcpy(d->calib_hash, imp->calib_hash, 65);
    fprintf(stderr, "moe2dense sweep: d2d importance of %s (%d windows x %d tokens): %s %s in %.1f s\n", x->d2d_teacher,
            imp->n_windows, imp->seq_len, cached ? "read from" : "computed into", d->imp_path, m2d_now() - t0);
    m2d_importance_free(imp);
    return 0;
}

int m2d_d2d_open(const m2d_experiment *x, const char *device, m2d_precision precision, m2d_d2d **out) {
    *out = NULL;
    m2d_d2d *d = m2d_calloc(1, sizeof *d);
    d->x = x;
    if (m2d_model_open(x->d2d_teacher, &d->teacher) || ensure_importance(d, device, precision)) {
        m2d_d2d_free(d);
        return -1;
    }
    *out = d;
    return 0;
}

void m2d_d2d_free(m2d_d2d *d) {
    if (!d) return;
    if (d->teacher) m2d_model_close(d->teacher);
    free(d->imp_path);
    free(d);
}

/* DIR's files and DIR, never through a symbolic link: DIR opened with O_NOFOLLOW (a link planted at
 * that name is left alone, and the build refuses the name), its entries unlinked relative to it
 * (an entry that is a link goes, not its target) */
void m2d_d2d_remove_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return;
    DIR *dd = fdopendir(fd);
    if (!dd) {
        close(fd);
        return;
    }
    struct dirent *e;
    while ((e = readdir(dd)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) unlinkat(fd, e->d_name, 0);
    closedir(dd);
    rmdir(dir);
}

/* SHA-256 of "d2d\n<dense weights hash>\n<importance calib hash>\n<canonical shape>\n" */
static void fingerprint(const m2d_d2d *d, const char *canon, char fp[65]) {
    char *s = m2d_strfmt("d2d\n%s\n%s\n%s\n", d->teacher->model_hash, d->calib_hash, canon);
    m2d_sha256_hex(s, strlen(s), fp);
    free(s);
}

int m2d_d2d_build(m2d_d2d *d, const m2d_grid_config *c, char **dir, m2d_model **student, m2d_sweep_result *res) {
    *dir = NULL, *student = NULL;
    const m2d_config *t = &d->teacher->cfg;
    m2d_prune_shape s;
    char canon[96];
    if (m2d_prune_shape_parse(m2d_d2d_spec(c->params), &s) || m2d_prune_shape_check(t, &s)) return -1;
    m2d_prune_shape_format(t, &s, canon, sizeof canon);
    fingerprint(d, canon, res->fingerprint);
    /* a directory of this process's own (shards may share the cache, over NFS too: host and pid);
     * made new here (mkdir: never an existing one, nor a link planted at its name); removed by the
     * caller */
    char host[256] = "host";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    char *root = m2d_path_join(d->x->cache_dir, "d2d"), *name = m2d_strfmt("%.16s.%s.%ld", res->fingerprint, host, (long)getpid());
    *dir = m2d_path_join(root, name);
    free(name);
    m2d_d2d_remove_dir(*dir); /* what a killed run of the same host and pid left */
    int rc = m2d_mkdir_p(root);
    if (rc == 0 && mkdir(*dir, 0700) != 0)
        rc = m2d_err("%s: cannot make the pruned student's directory: %s (a link or a file in the way?)", *dir,
                     strerror(errno));
    rc = rc || m2d_prune_write(d->teacher, d->imp_path, &s, *dir) || m2d_model_open(*dir, student);
    free(root);
    if (rc) {
        m2d_d2d_remove_dir(*dir);
        free(*dir), *dir = NULL;
        return -1;
    }
    res->d_dense = (*student)->cfg.intermediate_size;
    res->n_params = m2d_model_param_counts(&(*student)->cfg).total;
    return 0;
}

/* ---- the dry run ---- */

/* Rough seconds from FLOPs at the dry run's assumed 20 GFLOP/s per core (sweep.c). */
static double flop_seconds(double flops) { return flops / (20e9 * m2d_default_threads()); }

static void fmt_seconds(double s, char *buf, size_t n) {
    if (s < 120) snprintf(buf, n, "%.1f s", s);
    else if (s < 7200) snprintf(buf, n, "%.1f min", s / 60);
    else snprintf(buf, n, "%.1f h", s / 3600);
}

/* BYTES as "%.1f GiB" from 1 GiB up, else "%.1f MiB" (as sweep.c's dry run) */
static const char *fmt_bytes(double bytes, char *buf, size_t n) {
    const double M = 1024.0 * 1024;
    if (bytes >= 1024 * M) snprintf(buf, n, "%.1f GiB", bytes / (1024 * M));
    else snprintf(buf, n, "%.1f MiB", bytes / M);
    return buf;
}

/* each candidate's parameters against the K = k student's (REF) */
static void print_candidates(const m2d_experiment *x, const m2d_config *t, int64_t ref, FILE *f) {
    for (int i = 0; i < x->n_configs; i++) {
        const m2d_grid_config *c = &x->configs[i];
        if (!m2d_d2d_is_config(c)) continue;
        char canon[96] = "";
        int64_t p = m2d_d2d_params(t, m2d_d2d_spec(c->params), canon, sizeof canon);
        if (p < 0) {
            fprintf(f, "d2d candidate %s (%s): %s\n", m2d_d2d_spec(c->params), c->id, m2d_errmsg());
            m2d_err_clear();
            continue;
        }
        const char *spec = m2d_d2d_spec(c->params);
        fprintf(f, "d2d candidate %s (%s)", spec, c->id);
        if (strcmp(canon, spec)) fprintf(f, " = %s", canon);
        fprintf(f, ": %lld parameters", (long long)p);
        if (ref > 0) fprintf(f, " (%+.2f %% of the K = k student's %lld)", 100.0 * (double)(p - ref) / (double)ref, (long long)ref);
        fprintf(f, "\n");
    }
}

/* the distillation's cost per step with each teacher: teacher forward 2 P_active per token,
 * student forward + backward 6 P_student per token (FLOP estimates) */
static void print_step_cost(const m2d_experiment *x, const m2d_config *moe, const m2d_config *dense, int64_t student,
                            FILE *f) {
    double tokens = (double)x->distill.train.batch * x->distill.train.seq_len;
    double t_moe = flop_seconds(2.0 * (double)m2d_model_param_counts(moe).active * tokens);
    double t_dense = flop_seconds(2.0 * (double)m2d_model_param_counts(dense).total * tokens);
    double s = flop_seconds(6.0 * (double)student * tokens);
    char a[32], b[32], c[32];
    fmt_seconds(t_moe + s, a, sizeof a), fmt_seconds(t_dense + s, b, sizeof b), fmt_seconds(s, c, sizeof c);
    fprintf(f, "d2d distillation step (%d x %d tokens; FLOP estimate at 20 GFLOP/s per core, rough): ~%s with the MoE "
               "teacher, ~%s with the dense teacher (student forward + backward ~%s of each): x%.2f\n",
            x->distill.train.batch, x->distill.train.seq_len, a, b, c, (t_dense + s) / (t_moe + s));
}

/* the importance pass: the dense teacher over the windows, once plus once per layer (the NLL with
 * that layer skipped); memory: both teachers mapped as stored, one candidate */
static void print_importance_and_memory(const m2d_experiment *x, const m2d_config *moe, const m2d_config *t,
                                        int64_t student, FILE *f) {
    double tokens = (double)x->d2d_calib_samples * x->d2d_calib_seq_len;
    double flops = 2.0 * (double)m2d_model_param_counts(t).total * tokens * (1 + t->num_hidden_layers);
    char a[32];
    fmt_seconds(flop_seconds(flops), a, sizeof a);
    fprintf(f, "d2d importance: %d x %d tokens of %s, %d forwards of the dense teacher (1 + one per skipped layer), "
               "~%s once (cached in %s)\n", x->d2d_calib_samples, x->d2d_calib_seq_len, x->d2d_calib_data,
            1 + t->num_hidden_layers, a, x->cache_dir);
    double dense = (double)m2d_dtype_size(t->torch_dtype) * (double)m2d_model_param_counts(t).total;
    double mapped_moe = (double)m2d_dtype_size(moe->torch_dtype) * (double)m2d_model_param_counts(moe).total;
    char b1[32], b2[32], b3[32];
    fprintf(f, "d2d memory: the dense teacher %s and the MoE teacher %s mapped as stored (page cache); distilling a "
               "student holds fp32 weights, gradients and AdamW moments (16 bytes a parameter: %s) besides the "
               "activations (README \"Memory of a run\")\n", fmt_bytes(dense, b1, sizeof b1),
            fmt_bytes(mapped_moe, b2, sizeof b2), fmt_bytes(16.0 * (double)student, b3, sizeof b3));
}

void m2d_d2d_dry_run(const m2d_experiment *x, FILE *f) {
    if (!x->has_d2d) return;
    m2d_config t, moe;
    if (m2d_config_load(x->d2d_teacher, &t, NULL)) {
        fprintf(f, "d2d: dense teacher %s: config.json not readable (%s): no estimates\n", x->d2d_teacher, m2d_errmsg());
        m2d_err_clear();
        return;
    }
    int have_moe = m2d_config_load(x->model, &moe, NULL) == 0;
    m2d_err_clear();
    int64_t ref = have_moe ? m2d_model_param_counts(&moe).dense_student : 0;
    fprintf(f, "d2d: dense teacher %s: %lld parameters, %d layers, hidden %d, FFN %d, heads %d/%d; candidates pruned "
               "from it, the best by pre-distillation PPL distilled with it\n", x->d2d_teacher,
            (long long)m2d_model_param_counts(&t).total, t.num_hidden_layers, t.hidden_size, t.intermediate_size,
            t.num_attention_heads, t.num_key_value_heads);
    print_candidates(x, &t, ref, f);
    int64_t student = ref > 0 ? ref : m2d_model_param_counts(&t).total / 4;
    if (have_moe) print_importance_and_memory(x, &moe, &t, student, f);
    if (have_moe && x->has_distill) print_step_cost(x, &moe, &t, student, f);
    if (have_moe) m2d_config_free(&moe);
    m2d_config_free(&t);
}
