/* distill — the distillation run: windows, steps, log, validation, checkpoints, output. */
#include "train/distill.h"

#include <cjson/cJSON.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/outfile.h"
#include "base/util.h"
#include "engine/backend.h"
#include "convert/convert.h"
#include "engine/engine.h"
#include "evals/ppl.h"
#include "io/st.h"
#include "tokenizer/tokenizer.h"
#include "train/state.h"

typedef struct {
    const m2d_distill_opts *o;
    m2d_trainer_opts t;     /* with the steps resolved */
    const m2d_model *teacher, *student;  /* given (m2d_distill_run_models) or OPENED from the paths */
    m2d_model *opened[2];
    const char *teacher_dir, *student_dir; /* what the run names them by (checks, moe2dense.json) */
    const char *manifest;   /* the student's moe2dense.json text, or NULL */
    char *manifest_read;    /* ... read from the student's directory */
    m2d_tokenizer *tk;
    m2d_windows win;
    m2d_trainer *tr;
    int S, start;           /* steps in all, steps done before this invocation */
    double *losses;         /* [S] */
    double step_sum, teacher_sum; /* wall seconds of this invocation's steps, and of their teacher forwards */
    m2d_run_identity id;
    char *state_dir;
    m2d_lock lock;          /* OUT's, held from its preparation to the end of the run */
    FILE *log;
    int32_t *eval_ids;
    size_t n_eval;
    float *host;            /* host copy of the master weights (validation, output) */
    m2d_model *view;        /* the student over HOST */
    m2d_engine *eval_engine;
    m2d_distill_result *r;
} run_t;

void m2d_distill_defaults(m2d_distill_opts *o) {
    memset(o, 0, sizeof *o);
    o->train.seq_len = 512;
    o->train.batch = 8;
    o->train.loss = M2D_LOSS_FKL;
    o->train.mse_weight = 1.0;
    o->train.mse_norm = M2D_MSE_MINITRON; /* Minitron's weighting (kd.h) */
    m2d_optim_defaults(&o->train.optim);
    o->order = M2D_ORDER_SHUFFLE;
}

/* ---- setup ---- */

static int resolve_steps(run_t *r) {
    const m2d_distill_opts *o = r->o;
    int64_t per = (int64_t)o->train.batch * o->train.seq_len;
    if ((o->train.optim.steps > 0) == (o->tokens > 0))
        return m2d_err("distill: give exactly one of --steps and --tokens");
    if (per <= 0) return m2d_err("distill: --batch and --seq-len must be positive");
    int64_t S = o->train.optim.steps > 0 ? o->train.optim.steps : (o->tokens + per - 1) / per;
    if (S > 100000000) return m2d_err("distill: %lld steps is too many", (long long)S);
    r->S = (int)S;
    r->t = o->train;
    r->t.optim.steps = r->S;
    /* resolved once: what the identity, the log and the manifest record is what runs */
    if (m2d_engine_resolve_precision(m2d_trainer_teacher_backend(&r->t), o->train.precision, &r->t.precision))
        return m2d_err_prefix("distill: --precision");
    r->r->precision = r->t.precision;
    return 0;
}

/* ---- checks: every flag and path, before any model is loaded and before OUT is touched ---- */

const m2d_distill_names m2d_distill_flag_names = {"--seq-len", "--batch", "--micro-batch", "--teacher-topk",
                                                  "--eval-seq-len", "--recompute"};

int m2d_distill_check_settings(const m2d_distill_opts *o, const m2d_config *t, const m2d_distill_names *nm) {
    const m2d_trainer_opts *tr = &o->train;
    int max_pos = t->max_position_embeddings;
    if (tr->micro_batch && tr->batch % tr->micro_batch)
        return m2d_err("%s %d must divide %s %d", nm->micro_batch, tr->micro_batch, nm->batch, tr->batch);
    if (tr->seq_len > max_pos)
        return m2d_err("%s %d exceeds the teacher's max_position_embeddings %d", nm->seq_len, tr->seq_len, max_pos);
    if (o->eval_data && o->eval_seq_len > max_pos)
        return m2d_err("%s %d exceeds the teacher's max_position_embeddings %d", nm->eval_seq_len, o->eval_seq_len,
                       max_pos);
    if (tr->teacher_topk > t->num_experts)
        return m2d_err("%s %d exceeds the teacher's num_experts %d", nm->teacher_topk, tr->teacher_topk,
                       t->num_experts);
    return 0;
}

static double gib(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }

void m2d_distill_memory_estimate(const m2d_config *t, const m2d_config *s, int64_t student_params,
                                 const m2d_trainer_opts *o, double ram, m2d_distill_memory *m) {
    double R = (double)(o->micro_batch ? o->micro_batch : o->batch) * o->seq_len, P = (double)student_params;
    double d = s->hidden_size, q = (double)s->num_attention_heads * s->head_dim, F = s->intermediate_size;
    double kv = (double)s->num_key_value_heads * s->head_dim, n = s->num_hidden_layers, V = s->vocab_size;
    double dt = t->hidden_size, copy = o->precision == M2D_PREC_BF16 ? 2 : 4;
    /* a student on a device holds its state, activations and KD logits in the device's memory
     * (an allocation there that fails is its own one-line error): the host keeps its copy and one
     * window's teacher outputs on their way to the device */
    int on_host = !m2d_backend_spec_has_devices(o->backend);
    m->student = (on_host ? 16 * P : 0) + 4 * P; /* weights, gradients, AdamW m and v; the host copy */
    m->teacher = M2D_MIN(ram / 8, copy * (double)m2d_model_param_counts(t).total) + 4 * V * dt;
    double clip = s->clip_qkv > 0 ? q + 2 * kv : 0; /* clip_qkv (OLMoE): q, k, v before the clamp, per layer */
    m->activations = o->recompute ? 4 * R * (n * d + 8 * d + 5 * q + 5 * kv + 5 * F + dt + clip)
                                  : 4 * R * (n * (4 * d + 3 * q + 3 * kv + 3 * F + clip) + 5 * d + 2 * q + 2 * kv + 2 * F + dt);
    if (o->loss == M2D_LOSS_FKL_MSE) m->activations += 4 * R * n * dt;
    m->logits = 2 * M2D_MIN(R, 128.0 * 1024 * 1024 / (4 * V)) * 4 * V;
    /* a bf16 student on the host (backend_cpu_train.c): the weights' bf16 transposes (made once a step), one
     * GEMM's transposed dy (fp32, and its bf16 copy in the GEMM module) and x (bf16): an LM head block or a
     * layer's */
    if (o->train_precision == M2D_PREC_BF16 && on_host) {
        double w = M2D_MAX(d, F), rows = M2D_MIN(R, 128.0 * 1024 * 1024 / (4 * V));
        m->student += 2 * P;
        m->logits += 6 * M2D_MAX(rows * V, R * w) + 2 * R * w;
    }
    if (!on_host) m->activations = 4.0 * o->seq_len * dt * (o->loss == M2D_LOSS_FKL_MSE ? 1 + n : 1), m->logits = 0;
    m->total = m->student + m->teacher + m->activations + m->logits;
}

double m2d_distill_ram_bytes(void) {
    size_t ram = m2d_physical_ram();
    return ram ? (double)ram : INFINITY;
}

int m2d_distill_check_memory(const m2d_config *t, const m2d_config *s, int64_t student_params,
                             const m2d_trainer_opts *o, const m2d_distill_names *nm) {
    double ram = m2d_distill_ram_bytes();
    m2d_distill_memory m;
    m2d_distill_memory_estimate(t, s, student_params, o, ram, &m);
    if (m.total <= ram) return 0;
    if (m2d_backend_spec_has_devices(o->backend)) /* the batch is the device's business, not the host's */
        return m2d_err("with the student on %s, the host still needs ~%.1f GiB (the student's host copy %.1f, teacher "
                       "copies %.1f; README \"Memory of a run\"), more than this machine's %.1f GiB",
                       o->backend, gib(m.total), gib(m.student), gib(m.teacher + m.activations), gib(ram));
    return m2d_err("%s %d x %s %d needs ~%.1f GiB of memory (student state %.1f, activations %.1f, KD logits %.1f, "
                   "teacher copies %.1f; README \"Memory of a run\"), more than this machine's %.1f GiB: lower them, "
                   "or use %s and %s", nm->batch, o->batch, nm->seq_len, o->seq_len, gib(m.total), gib(m.student),
                   gib(m.activations), gib(m.logits), gib(m.teacher), gib(ram), nm->micro_batch, nm->recompute);
}

/* the flags against the teacher's config T and the student's S, and the memory they need */
static int check_config_pair(const run_t *r, const m2d_config *t, const m2d_config *s) {
    return m2d_distill_check_settings(r->o, t, &m2d_distill_flag_names) ||
                   m2d_distill_check_memory(t, s, m2d_model_param_counts(s).total, &r->t, &m2d_distill_flag_names)
               ? m2d_err_prefix("distill")
               : 0;
}

/* ... of the models given, or of the config.json files before any model is opened */
static int check_configs(run_t *r) {
    if (r->teacher) return check_config_pair(r, &r->teacher->cfg, &r->student->cfg);
    m2d_config t, s;
    if (m2d_config_load(r->teacher_dir, &t, NULL)) return -1;
    int rc = m2d_config_load(r->student_dir, &s, NULL);
    if (rc == 0) rc = check_config_pair(r, &t, &s), m2d_config_free(&s);
    m2d_config_free(&t);
    return rc;
}

/* 1 when the stream F holds only lines a distill log has (JSON objects with a numeric "step") */
static int only_log_lines(FILE *f) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int ok = 1;
    while (ok && (len = getline(&line, &cap, f)) > 0) {
        cJSON *j = cJSON_ParseWithLength(line, (size_t)len);
        ok = cJSON_IsObject(j) && cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(j, "step"));
        cJSON_Delete(j);
    }
    free(line);
    return ok;
}

/* --log: never a link or a directory, never one of the run's inputs, and an existing file only when
 * it is a distill log (a rerun's or the checkpoint's run's): anything else is not ours to replace */
static int check_log_path(const m2d_distill_opts *o) {
    const char *path = o->log;
    if (!path) return 0;
    if (m2d_check_inplace_path(path)) return m2d_err_prefix("distill: --log");
    const char *inputs[] = {o->data, o->eval_data};
    for (size_t i = 0; i < M2D_ARRAY_LEN(inputs); i++)
        if (m2d_same_file(path, inputs[i]))
            return m2d_err("distill: --log %s: is the run's input %s; refusing to overwrite it", path, inputs[i]);
    if (!m2d_file_exists(path)) return 0;
    int fd = m2d_open_input(path);
    FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (!f) return fd >= 0 ? close(fd), m2d_err("distill: --log %s: cannot read", path) : m2d_err_prefix("distill: --log");
    int ours = only_log_lines(f);
    fclose(f);
    return ours ? 0
                : m2d_err("distill: --log %s: exists and is not a distill log (one JSON object with a \"step\" per "
                          "line); refusing to overwrite it: give another path", path);
}

/* --out: a directory of its own, never the teacher's or the student's */
static int check_out_path(const run_t *r) {
    const m2d_distill_opts *o = r->o;
    const char *inputs[] = {r->teacher_dir, r->student_dir}, *names[] = {"teacher", "student"};
    for (int i = 0; i < 2; i++)
        if (m2d_same_file(o->out, inputs[i]))
            return m2d_err("distill: --out %s: is the %s's directory (--%s); the output would overwrite its input: "
                           "give another --out", o->out, names[i], names[i]);
    return 0;
}

/* ---- inputs ---- */

/* the validation text: gptq-joined and encoded, at least one window of the validation length */
static int load_eval_ids(run_t *r) {
    const m2d_distill_opts *o = r->o;
    if (!o->eval_data) return 0;
    size_t len, jl;
    char *raw = m2d_read_file(o->eval_data, &len);
    if (!raw) return -1;
    int rc = m2d_ppl_check_utf8(o->eval_data, raw, len);
    char *joined = rc == 0 ? m2d_ppl_gptq_text(raw, len, &jl) : NULL;
    if (joined && m2d_tokenizer_encode(r->tk, joined, jl, &r->eval_ids, &r->n_eval)) rc = m2d_err_prefix(o->eval_data);
    free(raw), free(joined);
    if (rc) return -1;
    int L = o->eval_seq_len ? o->eval_seq_len : r->t.seq_len;
    if (r->n_eval / (size_t)L == 0)
        return m2d_err("%s: %zu tokens, fewer than one validation window of %d", o->eval_data, r->n_eval, L);
    return 0;
}

/* The student's values start the training: a NaN there would reach every weight (the teacher's
 * show as a non-finite loss at the first step). A student with a file of its own: that file; one
 * in memory (sharing the teacher's file): its tensors. */
static int check_student_finite(const run_t *r) {
    const m2d_model *s = r->student;
    if (s->st && s->st != r->teacher->st) return m2d_st_check_finite(s->st);
    const m2d_tensor *top[] = {s->embed, s->final_norm, s->lm_head};
    for (int l = -1; l < s->cfg.num_hidden_layers; l++)
        for (int i = 0; i < (l < 0 ? 3 : M2D_T_COUNT); i++) {
            const m2d_tensor *t = l < 0 ? top[i] : s->layers[l].w[i];
            int64_t count, first = t ? m2d_tensor_first_non_finite(t, &count) : -1;
            if (first >= 0)
                return m2d_err("%s: tensor '%s': %lld value(s) not finite (the first at element %lld)", s->dir,
                               t->name, (long long)count, (long long)first);
        }
    return 0;
}

/* the models of the paths, unless given */
static int open_models(run_t *r) {
    if (!r->teacher) {
        if (m2d_model_open(r->teacher_dir, &r->opened[0]) || m2d_model_open(r->student_dir, &r->opened[1])) return -1;
        r->teacher = r->opened[0], r->student = r->opened[1];
    }
    return check_student_finite(r);
}

/* the tokenizer and the texts first (cheap), then the models (memory-mapped, hashed) */
static int open_inputs(run_t *r) {
    const m2d_distill_opts *o = r->o;
    if (m2d_tokenizer_load(r->teacher_dir, &r->tk)) return -1;
    if (m2d_windows_open(r->tk, o->data, r->t.seq_len, o->order, o->seed, &r->win) || load_eval_ids(r)) return -1;
    if (r->win.n_windows < r->t.batch)
        fprintf(stderr, "moe2dense distill: warning: %s holds %lld window(s) of %d tokens, fewer than --batch %d: "
                "every step repeats windows\n", o->data, (long long)r->win.n_windows, r->t.seq_len, r->t.batch);
    return open_models(r);
}

/* everything that changes the numbers of a step: a checkpoint resumes only the same run */
static void build_identity(run_t *r) {
    const m2d_trainer_opts *t = &r->t;
    m2d_run_identity *id = &r->id;
    m2d_run_identity_add(id, "teacher", "%s", r->teacher->model_hash);
    m2d_run_identity_add(id, "student", "%s", r->student->model_hash);
    m2d_run_identity_add(id, "data", "%s", r->win.ids_hash);
    m2d_run_identity_add(id, "seq_len", "%d", t->seq_len);
    m2d_run_identity_add(id, "batch", "%d", t->batch);
    m2d_run_identity_add(id, "micro_batch", "%d", t->micro_batch ? t->micro_batch : t->batch);
    m2d_run_identity_add(id, "steps", "%d", r->S);
    m2d_run_identity_add(id, "order", "%s", m2d_order_name(r->o->order));
    m2d_run_identity_add(id, "seed", "%llu", (unsigned long long)r->o->seed);
    m2d_run_identity_add(id, "loss", "%s", m2d_loss_name(t->loss));
    m2d_run_identity_add(id, "mse_weight", "%.17g", t->mse_weight);
    if (t->loss == M2D_LOSS_FKL_MSE) m2d_run_identity_add(id, "mse_norm", "%s", m2d_mse_norm_name(t->mse_norm));
    m2d_run_identity_add(id, "teacher_topk", "%d", t->teacher_topk);
    m2d_run_identity_add(id, "lr", "%.17g", t->optim.lr);
    m2d_run_identity_add(id, "min_lr", "%.17g", t->optim.min_lr);
    m2d_run_identity_add(id, "warmup", "%d", t->optim.warmup);
    m2d_run_identity_add(id, "weight_decay", "%.17g", t->optim.weight_decay);
    m2d_run_identity_add(id, "clip", "%.17g", t->optim.clip);
    m2d_run_identity_add(id, "backend", "%s", t->backend ? t->backend : "cpu");
    const char *teacher = m2d_trainer_teacher_backend(t); /* its targets' sums differ by device */
    m2d_run_identity_add(id, "teacher_backend", "%s", teacher ? teacher : "cpu");
    m2d_run_identity_add(id, "precision", "%s", m2d_precision_name(t->precision));
    m2d_run_identity_add(id, "train_precision", "%s", m2d_precision_name(t->train_precision));
}

/* OUT for a fresh run (checked and prepared) or a resumed one (its checkpoint must be there) */
static int prepare_out(run_t *r) {
    const m2d_distill_opts *o = r->o;
    r->state_dir = m2d_path_join(o->out, "train-state");
    if (m2d_check_output_dir(r->state_dir)) return m2d_err_prefix("distill");
    int have = m2d_train_state_exists(r->state_dir);
    if (o->resume && !have)
        return m2d_err("distill: --resume: %s holds no checkpoint (state.json)", r->state_dir);
    if (!o->resume && have)
        return m2d_err("distill: %s holds the checkpoint of an unfinished run: add --resume to continue it, or "
                       "remove it", r->state_dir);
    if (o->resume) {
        char *marker = m2d_path_join(o->out, "moe2dense.json");
        int done = m2d_file_exists(marker);
        free(marker);
        if (done) return m2d_err("distill: %s is a finished output and also holds a checkpoint: remove one", o->out);
        if (m2d_convert_lock_dir(o->out, &r->lock)) return -1;
    } else if (m2d_convert_prepare_dir(o->out, &r->lock)) {
        return -1;
    }
    /* under the lock: no save is live, so what an interrupted one left can go */
    int n = m2d_train_state_remove_leftovers(r->state_dir);
    if (n) fprintf(stderr, "moe2dense distill: %s: removed %d file(s) an interrupted checkpoint save left\n",
                   r->state_dir, n);
    return 0;
}

/* ---- log ---- */

/* Keep the lines of steps <= KEEP (the checkpoint's): later ones are repeated by this run. */
static int trim_log(const char *path, int keep) {
    if (!m2d_file_exists(path)) return 0;
    size_t n;
    char *text = m2d_read_file(path, &n), *out = m2d_malloc(n + 1);
    if (!text) {
        free(out);
        return -1;
    }
    size_t used = 0;
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        size_t len = next ? (size_t)(next - line) + 1 : strlen(line);
        if (next) next++;
        cJSON *j = cJSON_ParseWithLength(line, len);
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "step");
        if (cJSON_IsNumber(s) && s->valueint <= keep) memcpy(out + used, line, len), used += len;
        cJSON_Delete(j);
    }
    int rc = m2d_write_file_atomic(path, out, used);
    free(text), free(out);
    return rc;
}

/* the log (checked by check_log_path: absent or a distill log): appended to on a resume after the
 * lines of steps past the checkpoint are cut, else rewritten; never through a link */
static int open_log(run_t *r) {
    const char *path = r->o->log;
    if (!path) return 0;
    if (m2d_check_inplace_path(path)) return -1;
    if (r->o->resume && trim_log(path, r->start)) return -1;
    int fd = open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | (r->o->resume ? O_APPEND : O_TRUNC), 0666);
    r->log = fd >= 0 ? fdopen(fd, "a") : NULL;
    if (!r->log) {
        if (fd >= 0) close(fd);
        return m2d_err("%s: cannot open the log for writing", path);
    }
    return 0;
}

static void log_step(run_t *r, int step, const m2d_step_stats *st, double tok_s, double elapsed) {
    if (!r->log) return;
    int64_t tokens = (int64_t)step * r->t.batch * r->t.seq_len;
    char mse[96] = ""; /* fkl+mse: how the MSE part was weighted */
    if (r->t.loss == M2D_LOSS_FKL_MSE)
        snprintf(mse, sizeof mse, ", \"mse_weight\": %.17g, \"mse_norm\": \"%s\"", r->t.mse_weight,
                 m2d_mse_norm_name(r->t.mse_norm));
    fprintf(r->log,
            "{\"step\": %d, \"tokens\": %lld, \"loss\": %.17g, \"div\": %.17g, \"mse\": %.17g%s, \"grad_norm\": %.17g, "
            "\"lr\": %.17g, \"tokens_per_s\": %.1f, \"elapsed_s\": %.3f, \"teacher_s\": %.4f, \"precision\": \"%s\", "
            "\"student_precision\": \"%s\"}\n",
            step, (long long)tokens, st->loss, st->div, st->mse, mse, st->grad_norm, st->lr, tok_s, elapsed,
            st->teacher_s, m2d_precision_name(r->t.precision), m2d_precision_name(r->t.train_precision));
    fflush(r->log);
}

/* ---- validation ---- */

/* the validation engine over the host copy of the student's weights, on the student's device at
 * the teacher's precision. Opened for each evaluation and freed after it: a device backend copies
 * the weights at open (the CPU reads fp32 weights in place), so an engine kept open would score
 * stale ones, and a device's memory goes back to training between evaluations. */
static int open_eval_engine(run_t *r) {
    m2d_engine_opts eo = {.backend = r->t.backend, .n_threads = r->t.threads, .precision = r->t.precision};
    return m2d_engine_open(r->view, &eo, &r->eval_engine);
}

static void close_eval_engine(run_t *r) {
    m2d_engine_free(r->eval_engine);
    r->eval_engine = NULL;
}

/* the host copy and its model view; with validation, its engine opened once (its errors before
 * any step) and closed */
static int eval_setup(run_t *r) {
    const m2d_distill_opts *o = r->o;
    r->host = m2d_malloc(sizeof(float) * m2d_trainer_params(r->tr)->total);
    if (m2d_train_params_model(m2d_trainer_params(r->tr), r->student, r->host, &r->view)) return -1;
    if (!o->eval_data) return 0;
    int rc = open_eval_engine(r);
    close_eval_engine(r);
    return rc;
}

static void download_weights(run_t *r) { m2d_train_params_download(m2d_trainer_params(r->tr), M2D_PBUF_WEIGHTS, r->host); }

/* WikiText-2 gptq perplexity and mean cross-entropy of the student's current weights */
static int evaluate(run_t *r, int step, double *ppl, double *ce) {
    const m2d_distill_opts *o = r->o;
    if (!o->eval_data) return 0;
    download_weights(r);
    if (open_eval_engine(r)) return -1;
    m2d_ppl_result res;
    memset(&res, 0, sizeof res);
    int L = o->eval_seq_len ? o->eval_seq_len : r->t.seq_len;
    int rc = m2d_ppl_gptq_tokens(r->eval_engine, r->eval_ids, r->n_eval, L, o->eval_windows, NULL, &res);
    close_eval_engine(r);
    if (rc) return -1;
    *ppl = res.ppl;
    *ce = res.nll_sum / (double)res.tokens_scored;
    if (r->log) {
        fprintf(r->log,
                "{\"step\": %d, \"tokens\": %lld, \"eval\": \"wikitext2-gptq\", \"ppl\": %.17g, \"val_ce\": %.17g, "
                "\"windows\": %d, \"seq_len\": %d, \"precision\": \"%s\"}\n",
                step, (long long)step * r->t.batch * r->t.seq_len, *ppl, *ce, res.windows, L,
                m2d_precision_name(r->t.precision));
        fflush(r->log);
    }
    return 0;
}

/* ---- output ---- */

/* the student's config.json, with the dtype fields naming DT when the weights are written in another */
static char *output_config(const m2d_model *s, m2d_dtype dt) {
    cJSON *j = cJSON_Parse(s->config_text);
    const char *name = dt == M2D_F32 ? "float32" : dt == M2D_F16 ? "float16" : "bfloat16";
    for (int k = 0; j && k < 2; k++) {
        const char *key = k ? "dtype" : "torch_dtype";
        if (cJSON_GetObjectItemCaseSensitive(j, key)) cJSON_ReplaceItemInObjectCaseSensitive(j, key, cJSON_CreateString(name));
    }
    char *text = j ? cJSON_Print(j) : m2d_strdup(s->config_text);
    cJSON_Delete(j);
    return text;
}

/* the parameter trained from tensor T, or -1 */
static int param_of(const m2d_train_params *p, const m2d_tensor *t) {
    for (int i = 0; i < p->n; i++)
        if (p->p[i].name == t->name) return i;
    return -1;
}

/* A student whose architecture stores its FFN block in a layout of its own (model.h write_ffn:
 * GPT-OSS's fused, interleaved experts) gets it written that way, from a view of the student whose
 * FFN roles hold the trained values in DT; those parameters are marked in DONE. */
static int write_ffn_blocks(run_t *r, m2d_dtype dt, m2d_st_writer *w, char *done) {
    const m2d_model *s = r->student;
    const m2d_train_params *p = m2d_trainer_params(r->tr);
    int L = s->cfg.num_hidden_layers, rc = 0;
    m2d_model view = *s;
    view.layers = m2d_malloc(sizeof(m2d_layer) * (size_t)L);
    memcpy(view.layers, s->layers, sizeof(m2d_layer) * (size_t)L);
    m2d_tensor *made = m2d_calloc((size_t)L * M2D_T_COUNT, sizeof *made);
    for (int l = 0; l < L && rc == 0; l++) {
        for (int role = 0; role < M2D_T_COUNT; role++) {
            const m2d_tensor *t = s->layers[l].w[role];
            int i = t && m2d_layer_role_is_ffn(role) ? param_of(p, t) : -1;
            if (i < 0) continue;
            m2d_tensor *x = &made[(size_t)l * M2D_T_COUNT + role];
            *x = *t;
            x->dtype = dt;
            x->nbytes = (size_t)m2d_tensor_numel(t) * m2d_dtype_size(dt);
            x->data = m2d_malloc(x->nbytes);
            m2d_from_f32(dt, r->host + p->p[i].off, m2d_tensor_numel(t), (void *)x->data);
            view.layers[l].w[role] = x;
            done[i] = 1;
        }
        rc = s->arch->write_ffn(&view, l, w);
    }
    for (size_t k = 0; k < (size_t)L * M2D_T_COUNT; k++) free((void *)made[k].data);
    free(made);
    free(view.layers);
    return rc;
}

static int write_weights(run_t *r, m2d_dtype dt) {
    const m2d_train_params *p = m2d_trainer_params(r->tr);
    m2d_st_writer *w = m2d_st_writer_new();
    m2d_st_writer_metadata(w, "format", "pt");
    char *done = m2d_calloc((size_t)p->n + 1, 1);
    int rc = r->student->arch->write_ffn ? write_ffn_blocks(r, dt, w, done) : 0;
    for (int i = 0; i < p->n && rc == 0; i++) {
        const m2d_tparam *q = &p->p[i];
        if (done[i]) continue;
        int64_t shape[2] = {q->rows, m2d_tparam_stored_cols(q)};
        float *stored = q->group ? m2d_malloc(sizeof(float) * (size_t)(q->rows * shape[1])) : NULL;
        if (stored) m2d_tparam_stored(q, r->host, stored); /* without the loader's padding (MLA's o_proj) */
        rc = m2d_st_writer_add_f32(w, q->name, dt, q->ndim, shape, stored ? stored : r->host + q->off);
        free(stored);
    }
    const m2d_tensor *stored = r->student->lm_head_stored; /* tied, but the checkpoint also has lm_head */
    if (rc == 0 && stored) {
        const m2d_tparam *q = &p->p[p->lm_head];
        int64_t shape[2] = {q->rows, q->cols};
        rc = m2d_st_writer_add_f32(w, stored->name, dt, 2, shape, r->host + q->off);
    }
    char *path = m2d_path_join(r->o->out, "model.safetensors");
    if (rc == 0) rc = m2d_st_writer_write(w, path);
    free(path);
    free(done);
    m2d_st_writer_free(w);
    return rc;
}

static cJSON *settings_json(const run_t *r) {
    const m2d_trainer_opts *t = &r->t;
    const m2d_distill_opts *o = r->o;
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "teacher", r->teacher_dir);
    cJSON_AddStringToObject(s, "teacher_weights_hash", r->teacher->weights_hash);
    cJSON_AddStringToObject(s, "student_init", r->student_dir);
    cJSON_AddStringToObject(s, "student_init_weights_hash", r->student->weights_hash);
    cJSON_AddStringToObject(s, "data", o->data);
    cJSON_AddStringToObject(s, "data_tokens_sha256", r->win.ids_hash);
    cJSON_AddNumberToObject(s, "data_tokens", (double)r->win.n_ids);
    cJSON_AddNumberToObject(s, "data_passes", m2d_windows_passes(&r->win, (int64_t)r->S * t->batch));
    cJSON_AddNumberToObject(s, "steps", r->S);
    cJSON_AddNumberToObject(s, "seq_len", t->seq_len);
    cJSON_AddNumberToObject(s, "batch", t->batch);
    cJSON_AddNumberToObject(s, "micro_batch", t->micro_batch ? t->micro_batch : t->batch);
    cJSON_AddStringToObject(s, "loss", m2d_loss_name(t->loss));
    if (t->loss == M2D_LOSS_FKL_MSE) cJSON_AddNumberToObject(s, "mse_weight", t->mse_weight);
    if (t->loss == M2D_LOSS_FKL_MSE) cJSON_AddStringToObject(s, "mse_norm", m2d_mse_norm_name(t->mse_norm));
    cJSON_AddNumberToObject(s, "teacher_topk", t->teacher_topk);
    cJSON_AddStringToObject(s, "teacher_routing", m2d_trainer_route_topk(&r->teacher->cfg, t->teacher_topk) ? "eq6" : "own");
    cJSON_AddNumberToObject(s, "lr", t->optim.lr);
    cJSON_AddNumberToObject(s, "min_lr", t->optim.min_lr);
    cJSON_AddNumberToObject(s, "warmup", t->optim.warmup);
    cJSON_AddNumberToObject(s, "beta1", t->optim.beta1);
    cJSON_AddNumberToObject(s, "beta2", t->optim.beta2);
    cJSON_AddNumberToObject(s, "eps", t->optim.eps);
    cJSON_AddNumberToObject(s, "weight_decay", t->optim.weight_decay);
    cJSON_AddNumberToObject(s, "clip", t->optim.clip);
    cJSON_AddStringToObject(s, "order", m2d_order_name(o->order));
    cJSON_AddNumberToObject(s, "seed", (double)o->seed);
    cJSON_AddNumberToObject(s, "temperature", 1);
    cJSON_AddStringToObject(s, "precision", m2d_precision_name(t->precision)); /* teacher + validation */
    cJSON_AddStringToObject(s, "precision_requested", m2d_precision_name(o->train.precision));
    cJSON_AddStringToObject(s, "student_training_precision", m2d_precision_name(o->train.train_precision));
    const char *teacher = m2d_trainer_teacher_backend(&o->train);
    cJSON_AddStringToObject(s, "teacher_device", teacher ? teacher : "cpu");
    cJSON_AddStringToObject(s, "student_device", o->train.backend ? o->train.backend : "cpu");
    return s;
}

static cJSON *metrics_json(const run_t *r) {
    const m2d_distill_result *res = r->r;
    cJSON *m = cJSON_CreateObject();
    cJSON_AddNumberToObject(m, "tokens", (double)res->tokens);
    cJSON_AddNumberToObject(m, "final_loss", res->final_loss);
    cJSON_AddNumberToObject(m, "last_step_loss", r->losses[r->S - 1]);
    if (!isnan(res->pre_ppl)) cJSON_AddNumberToObject(m, "pre_ppl", res->pre_ppl);
    if (!isnan(res->post_ppl)) {
        cJSON_AddNumberToObject(m, "post_ppl", res->post_ppl);
        cJSON_AddNumberToObject(m, "post_val_ce", res->post_ce);
        cJSON_AddStringToObject(m, "eval_data", r->o->eval_data);
    }
    cJSON_AddNumberToObject(m, "wall_s_last_invocation", res->wall_s);
    if (isfinite(res->step_s)) cJSON_AddNumberToObject(m, "step_s_last_invocation", res->step_s);
    if (isfinite(res->teacher_s)) cJSON_AddNumberToObject(m, "teacher_forward_s_per_step_last_invocation", res->teacher_s);
    return m;
}

/* the student's moe2dense.json (given, or read from its directory), or NULL */
static const char *student_manifest(run_t *r) {
    if (r->manifest || r->opened[1] == NULL) return r->manifest;
    char *src = m2d_path_join(r->student_dir, "moe2dense.json");
    size_t n;
    r->manifest = r->manifest_read = m2d_file_exists(src) ? m2d_read_file(src, &n) : NULL;
    free(src);
    return r->manifest;
}

/* the student's moe2dense.json (a converted student's plan or a baseline's recipe) + "distill" */
static int write_manifest(run_t *r) {
    const char *text = student_manifest(r);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    if (!j) j = cJSON_CreateObject();
    cJSON_DeleteItemFromObjectCaseSensitive(j, "distill");
    cJSON_DeleteItemFromObjectCaseSensitive(j, "moe2dense_version");
    cJSON_AddStringToObject(j, "moe2dense_version", M2D_VERSION);
    cJSON *d = cJSON_AddObjectToObject(j, "distill");
    cJSON_AddItemToObject(d, "settings", settings_json(r));
    cJSON_AddItemToObject(d, "metrics", metrics_json(r));
    char *out = cJSON_Print(j), *path = m2d_path_join(r->o->out, "moe2dense.json");
    int rc = m2d_write_file_atomic(path, out, strlen(out));
    cJSON_Delete(j);
    free(out), free(path);
    return rc;
}

static int write_output(run_t *r) {
    m2d_dtype dt = r->o->fp32 ? M2D_F32 : r->teacher->cfg.torch_dtype;
    if (dt != M2D_F32 && dt != M2D_BF16 && dt != M2D_F16) dt = M2D_F32;
    download_weights(r);
    char *cfg = output_config(r->student, dt), *path = m2d_path_join(r->o->out, "config.json");
    int rc = write_weights(r, dt);
    if (rc == 0) rc = m2d_write_file_atomic(path, cfg, strlen(cfg));
    free(cfg), free(path);
    if (rc == 0) rc = m2d_convert_copy_tokenizer(r->teacher, r->o->out);
    if (rc == 0) rc = write_manifest(r); /* last: marks the output complete */
    if (rc == 0) rc = m2d_convert_finish_dir(r->o->out);
    if (rc == 0) rc = m2d_train_state_remove(r->state_dir);
    return rc;
}

/* ---- the loop ---- */

static void final_metrics(run_t *r) {
    int tail = M2D_MAX(1, r->S / 10);
    double s = 0;
    for (int i = r->S - tail; i < r->S; i++) s += r->losses[i];
    r->r->final_loss = s / tail;
}

static int one_step(run_t *r, int step, int32_t *tok, double t_start) {
    m2d_step_stats st;
    double t0 = m2d_now();
    m2d_windows_get(&r->win, (int64_t)(step - 1) * r->t.batch, r->t.batch, tok);
    if (m2d_trainer_step(r->tr, step, tok, &st)) return -1;
    if (!isfinite(st.loss) || !isfinite(st.grad_norm))
        return m2d_err("distill: step %d: the loss (%g) or gradient norm (%g) is not finite", step, st.loss, st.grad_norm);
    r->losses[step - 1] = st.loss;
    double dt = m2d_now() - t0;
    r->step_sum += dt, r->teacher_sum += st.teacher_s;
    log_step(r, step, &st, r->t.batch * r->t.seq_len / dt, m2d_now() - t_start);
    r->r->steps_done = step;
    return 0;
}

static int checkpoint_due(const run_t *r, int step, int last) {
    return (r->o->save_every > 0 && step % r->o->save_every == 0) || (step == last && last < r->S);
}

static int run_steps(run_t *r) {
    const m2d_distill_opts *o = r->o;
    int last = o->stop_after > 0 ? M2D_MIN(o->stop_after, r->S) : r->S;
    int32_t *tok = m2d_malloc(sizeof(int32_t) * (size_t)r->t.batch * r->t.seq_len);
    char label[160];
    m2d_progress prog;
    snprintf(label, sizeof label, "distill");
    m2d_progress_start(&prog, label, last - r->start);
    double t_start = m2d_now(), ppl, ce;
    int rc = 0;
    for (int s = r->start + 1; s <= last && rc == 0; s++) {
        rc = one_step(r, s, tok, t_start);
        if (rc == 0 && s == r->start + 1 && !o->quiet)
            fprintf(stderr, "moe2dense distill: peak RSS after the first step: %.1f MB\n", m2d_peak_rss() / 1048576.0);
        if (rc == 0 && o->eval_every > 0 && s % o->eval_every == 0 && s < r->S) rc = evaluate(r, s, &ppl, &ce);
        if (rc == 0 && checkpoint_due(r, s, last)) rc = m2d_train_state_save(r->state_dir, m2d_trainer_params(r->tr), s, &r->id, r->losses);
        double el = m2d_now() - t_start, tps = (double)(s - r->start) * r->t.batch * r->t.seq_len / el;
        snprintf(label, sizeof label, "distill loss %.4f %.0f tok/s step", r->losses[s - 1], tps);
        m2d_progress_update(&prog, s - r->start);
    }
    m2d_progress_end(&prog);
    r->r->wall_s = m2d_now() - t_start;
    int done = r->r->steps_done - r->start;
    r->r->tokens_per_s = r->r->wall_s > 0 ? (double)done * r->t.batch * r->t.seq_len / r->r->wall_s : 0;
    r->r->step_s = done > 0 ? r->step_sum / done : NAN;
    r->r->teacher_s = done > 0 ? r->teacher_sum / done : NAN;
    free(tok);
    return rc;
}

static int resume_or_start(run_t *r) {
    if (r->o->resume) {
        if (m2d_train_state_load(r->state_dir, m2d_trainer_params(r->tr), &r->id, r->S, &r->start, r->losses)) return -1;
        r->r->steps_done = r->start;
        if (!r->o->quiet) fprintf(stderr, "moe2dense distill: resuming after step %d of %d\n", r->start, r->S);
    }
    if (!r->o->quiet)
        fprintf(stderr, "moe2dense distill: teacher forward and validation: %s (requested %s); student training: %s\n",
                m2d_precision_name(r->t.precision), m2d_precision_name(r->o->train.precision),
                m2d_precision_name(r->t.train_precision));
    if (open_log(r) || eval_setup(r)) return -1;
    double ce;
    if (r->start == 0 && evaluate(r, 0, &r->r->pre_ppl, &ce)) return -1;
    return 0;
}

static int run(run_t *r) {
    if (resolve_steps(r) || check_out_path(r) || check_log_path(r->o) || check_configs(r) || open_inputs(r) ||
        prepare_out(r))
        return -1;
    m2d_windows_repeat_note(&r->win, r->o->data, r->S, r->t.batch, stderr); /* the data guard, quiet or not */
    r->r->steps = r->S;
    r->losses = m2d_calloc((size_t)r->S, sizeof(double));
    build_identity(r);
    if (m2d_trainer_new(r->teacher, r->student, &r->t, &r->tr) || resume_or_start(r) || run_steps(r)) return -1;
    r->r->tokens = (int64_t)r->r->steps_done * r->t.batch * r->t.seq_len;
    r->r->peak_rss = m2d_peak_rss();
    if (r->r->steps_done < r->S) return 0; /* --stop-after: the checkpoint is saved */
    if (evaluate(r, r->S, &r->r->post_ppl, &r->r->post_ce)) return -1;
    final_metrics(r);
    if (write_output(r)) return -1;
    r->r->finished = true;
    return 0;
}

/* M: the models open already, or NULL (opened from O's paths once the cheap checks pass) */
static int distill(const m2d_distill_opts *o, const m2d_distill_models *m, m2d_distill_result *res) {
    memset(res, 0, sizeof *res);
    res->pre_ppl = res->post_ppl = res->post_ce = res->final_loss = res->step_s = res->teacher_s = NAN;
    run_t r;
    memset(&r, 0, sizeof r);
    r.o = o;
    r.r = res;
    if (m) r.teacher = m->teacher, r.student = m->student, r.manifest = m->manifest;
    r.teacher_dir = m ? m->teacher->dir : o->teacher;
    r.student_dir = m ? m->student->dir : o->student;
    int rc = run(&r);
    if (r.log) fclose(r.log);
    m2d_engine_free(r.eval_engine);
    m2d_train_params_model_free(r.view);
    m2d_trainer_free(r.tr);
    m2d_windows_free(&r.win);
    if (r.tk) m2d_tokenizer_free(r.tk);
    m2d_model_close(r.opened[1]);
    m2d_model_close(r.opened[0]);
    m2d_run_identity_free(&r.id);
    m2d_lock_release(&r.lock);
    free(r.losses), free(r.host), free(r.eval_ids), free(r.state_dir), free(r.manifest_read);
    return rc;
}

int m2d_distill_run(const m2d_distill_opts *o, m2d_distill_result *res) { return distill(o, NULL, res); }

int m2d_distill_run_models(const m2d_distill_opts *o, const m2d_distill_models *m, m2d_distill_result *res) {
    return distill(o, m, res);
}
