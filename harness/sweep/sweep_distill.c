/* sweep_distill — distillation stage: select, distill, score into OUT.distill.csv, fill OUT (see
 * sweep_distill.h). */
#include "sweep/sweep_distill.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/util.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "train/data.h"
#include "train/params.h"
#include "sweep/sweep_mc.h"
#include "train/state.h"

/* The settings that change a distilled student, as one header value of the sidecar (the student's
 * training precision only when it is not fp32: sidecars written before it stay valid). */
static char *settings_text(const m2d_experiment *x) {
    const m2d_distill_opts *o = &x->distill;
    const m2d_trainer_opts *t = &o->train;
    char topk[16]; /* the ablation's loss and teacher_topk are per row: its lists may grow and resume */
    snprintf(topk, sizeof topk, "%d", t->teacher_topk);
    const char *loss = x->distill_ablation ? "per-row" : m2d_loss_name(t->loss), *k = x->distill_ablation ? "per-row" : topk;
    return m2d_strfmt("distill=data=%s val_data=%s tokens=%lld steps=%d L=%d B=%d b=%d lr=%.9g min_lr=%.9g warmup=%d "
                      "weight_decay=%.9g clip=%.9g loss=%s mse_weight=%.9g mse_norm=%s teacher_topk=%s order=%s seed=%llu "
                      "fp32=%d%s",
                      x->distill_data, x->distill_val_data ? x->distill_val_data : "none", (long long)o->tokens, t->optim.steps, t->seq_len, t->batch,
                      t->micro_batch ? t->micro_batch : t->batch, t->optim.lr, t->optim.min_lr, t->optim.warmup,
                      t->optim.weight_decay, t->optim.clip, loss, t->mse_weight,
                      m2d_mse_norm_name(t->mse_norm), k,
                      m2d_order_name(o->order), (unsigned long long)o->seed, (int)o->fp32,
                      t->train_precision == M2D_PREC_BF16 ? " train_precision=bf16" : "");
}

/* ---- checks before any work (the run and the dry run) ---- */

static const m2d_distill_names TOML_NAMES = {"distill.seq_len", "distill.batch", "distill.micro_batch",
                                             "distill.teacher_topk", "ppl.seq_len", "distill.recompute"};

/* the settings, with every teacher_topk K' of the list, against the teacher's config.json and the
 * memory of the largest student (a dense one of width k d_e + shared: every K gives the same size);
 * AT: where the failing value is */
static int check_against_teacher(const m2d_experiment *x, m2d_distill_opts *o, const m2d_config *t, char *at, size_t n) {
    const char *why = m2d_train_unsupported(t); /* the dense student keeps the teacher's attention */
    if (why)
        return m2d_err("the training engine does not implement %s: the dense student of %s (%s) cannot be distilled",
                       why, x->model, t->arch);
    m2d_config s = *t; /* the student's shape, for the estimate only (not freed) */
    s.intermediate_size = t->num_experts_per_tok * t->moe_intermediate_size + t->shared_expert_intermediate_size;
    s.num_experts = 0;
    for (int i = 0; i < x->n_distill_topks; i++) {
        o->train.teacher_topk = x->distill_topks[i];
        char item[16];
        snprintf(item, sizeof item, "%d", x->distill_topks[i]);
        m2d_experiment_where(x, x->distill_ablation ? "distill.teacher_topk" : "distill", item, at, n);
        if (m2d_distill_check_settings(o, t, &TOML_NAMES)) return -1;
    }
    m2d_experiment_where(x, "distill", NULL, at, n);
    return m2d_distill_check_memory(t, &s, m2d_model_param_counts(t).dense_student, &o->train, &TOML_NAMES);
}

/* without config.json (a dry run on [teacher] hints): every K' against the hinted experts */
static int check_topks_against_hints(const m2d_experiment *x, char *at, size_t n) {
    for (int i = 0; i < x->n_distill_topks; i++)
        if (x->distill_topks[i] > x->E) {
            char item[16];
            snprintf(item, sizeof item, "%d", x->distill_topks[i]);
            m2d_experiment_where(x, "distill.teacher_topk", item, at, n);
            return m2d_err("distill.teacher_topk %d exceeds the teacher's num_experts %d", x->distill_topks[i], x->E);
        }
    return 0;
}

/* distill.data: training text (regular, non-empty, UTF-8, no NUL) of at least one window with the
 * teacher's tokenizer (when the teacher is here to give it) */
static int check_data(const m2d_experiment *x, const m2d_distill_opts *o) {
    m2d_tokenizer *tk = NULL;
    if (m2d_tokenizer_load(x->model, &tk)) {
        m2d_err_clear();
        size_t len;
        char *text = m2d_training_text_read(x->distill_data, &len);
        free(text);
        return text ? 0 : -1;
    }
    m2d_windows w;
    int rc = m2d_windows_open(tk, x->distill_data, o->train.seq_len, o->order, o->seed, &w);
    if (rc == 0 && w.n_windows < o->train.batch)
        fprintf(stderr, "moe2dense sweep: warning: %s holds %lld window(s) of %d tokens, fewer than distill.batch %d: "
                "every step repeats windows\n", x->distill_data, (long long)w.n_windows, o->train.seq_len,
                o->train.batch);
    m2d_windows_free(&w);
    m2d_tokenizer_free(tk);
    return rc;
}

int m2d_sweep_distill_check(const m2d_experiment *x, const char *device) {
    if (!x->has_distill) return 0;
    m2d_distill_opts o = x->distill;
    o.train.backend = device; /* where the student trains: its memory is the device's, not the host's */
    o.data = x->distill_data;
    if (o.eval_every > 0) o.eval_data = x->ppl_data, o.eval_seq_len = x->ppl_seq_len;
    m2d_config t;
    char at[512];
    m2d_experiment_where(x, "distill", NULL, at, sizeof at);
    int have_config = m2d_config_load(x->model, &t, NULL) == 0, rc = 0;
    if (!have_config) m2d_err_clear(), rc = check_topks_against_hints(x, at, sizeof at); /* the backend's check
                                                          decides whether a run may go on without config.json */
    else rc = check_against_teacher(x, &o, &t, at, sizeof at), m2d_config_free(&t);
    if (rc == 0) rc = check_data(x, &o);
    return rc ? m2d_err_prefix(at) : 0;
}

/* ---- the stage ---- */

/* The distillation columns (m2d_sweep_distill_columns: mc_student last when there are MC
 * columns) and the MC columns of the experiment. Sidecar: config_id, the distillation columns but
 * mc_student, the MC columns, mc_student, wall_s, status. */
typedef struct {
    char **dist, **mc;
    int n_dist, n_mc;
    int n_axes; /* the ablation's loss and teacher_topk after config_id (2), or none (0) */
} stage_cols;

/* One (loss, teacher_topk) of the ablation axes: combination I of x (loss-major), with the texts
 * its sidecar row records (teacher_topk 0 as the teacher's own k) and the name of its folder. */
typedef struct {
    m2d_loss_kind loss;
    int topk;
    char loss_s[16], topk_s[16], dir[64];
} combo;

static int n_combos(const m2d_experiment *x) { return x->n_distill_losses * x->n_distill_topks; }

static void combo_of(const m2d_experiment *x, int i, const char *id, combo *cb) {
    cb->loss = x->distill_losses[i / x->n_distill_topks];
    cb->topk = x->distill_topks[i % x->n_distill_topks];
    snprintf(cb->loss_s, sizeof cb->loss_s, "%s", m2d_loss_name(cb->loss));
    snprintf(cb->topk_s, sizeof cb->topk_s, "%d", cb->topk ? cb->topk : x->k);
    if (x->distill_ablation) snprintf(cb->dir, sizeof cb->dir, "%s.%s.k%s", id, cb->loss_s, cb->topk_s);
    else snprintf(cb->dir, sizeof cb->dir, "%s", id);
}

/* 1 when DONE (the sidecar so far) holds configuration ID with combination CB; FAILED += its
 * failures */
static int combo_done(const m2d_results *done, const char *id, const combo *cb, int ablation, int *failed) {
    int seen = 0;
    for (int d = 0; d < done->n_rows && !seen; d++) {
        seen = !strcmp(m2d_results_get(done, d, "config_id"), id) &&
               (!ablation || (!strcmp(m2d_results_get(done, d, "loss"), cb->loss_s) &&
                              !strcmp(m2d_results_get(done, d, "teacher_topk"), cb->topk_s)));
        if (seen) *failed += strncmp(m2d_results_get(done, d, "status"), "failed", 6) == 0;
    }
    return seen;
}

/* One configuration's distilled student: distill, score PPL and MC. The sidecar row in F. */
static void distill_one(const m2d_experiment *x, m2d_sweep_backend *b, const m2d_grid_config *c, const combo *cb,
                        const char *root, const stage_cols *sc, char **f) {
    double t0 = m2d_now();
    m2d_sweep_result r;
    memset(&r, 0, sizeof r);
    r.ppl = NAN;
    r.mc = m2d_malloc((size_t)(sc->n_mc + 1) * sizeof *r.mc);
    for (int m = 0; m < sc->n_mc; m++) r.mc[m] = NAN;
    m2d_distill_result d;
    memset(&d, 0, sizeof d);
    d.final_loss = d.step_s = d.teacher_s = NAN;
    m2d_distill_opts o = x->distill;
    o.train.loss = cb->loss, o.train.teacher_topk = cb->topk;
    char *dir = m2d_path_join(root, cb->dir), *log = m2d_strfmt("%s.jsonl", dir), *state = m2d_path_join(dir, "train-state");
    o.data = x->distill_data, o.out = dir, o.log = log, o.train.threads = b->threads;
    o.train.precision = b->precision; /* the sweep's: the teacher's KD targets and validation */
    o.train.teacher_backend = o.train.backend = b->device; /* the teacher's forward and the student's training */
    o.resume = m2d_train_state_exists(state);
    if (o.eval_every > 0) /* the validation curve (Figure 5) on held-out text (distill.val_data), PPL's protocol */
        o.eval_data = x->distill_val_data, o.eval_seq_len = x->ppl_seq_len, o.eval_windows = x->ppl_max_windows;
    void *student = NULL, *distilled = NULL;
    /* the students' folder and this one's: real directories, never a link planted there (a write
     * through it would land, or replace a checkpoint, wherever it points) */
    int rc = m2d_check_output_dir(root) || m2d_check_output_dir(dir) ? -1 : b->build(b, c, &student, &r);
    if (rc == 0) rc = m2d_mkdir_p(root);
    if (rc == 0) rc = b->distill(b, student, c, &o, &distilled, &d, r.error);
    if (student) b->free_student(b, student);
    if (rc == 0) rc = b->evaluate(b, distilled, c, &r);
    int run_mc = sc->n_mc && strcmp(x->mc_configs, "none") != 0;
    if (rc == 0 && run_mc) rc = b->evaluate_mc(b, distilled, c, &r);
    if (distilled) b->free_student(b, distilled);
    if (rc && !r.error[0]) snprintf(r.error, sizeof r.error, "%s", m2d_errmsg());
    int k = 0;
    f[k++] = m2d_strdup(c->id);
    if (sc->n_axes) f[k++] = m2d_strdup(cb->loss_s), f[k++] = m2d_strdup(cb->topk_s);
    f[k++] = isfinite(r.ppl) ? m2d_strfmt("%.4f", r.ppl) : m2d_strdup("");
    f[k++] = isfinite(d.final_loss) ? m2d_strfmt("%.6f", d.final_loss) : m2d_strdup("");
    f[k++] = m2d_strfmt("%lld", (long long)d.tokens);
    f[k++] = m2d_strfmt("%d", d.steps_done);
    f[k++] = m2d_strfmt("%.3f", d.wall_s); /* the training (of this invocation) */
    f[k++] = isfinite(d.step_s) ? m2d_strfmt("%.4f", d.step_s) : m2d_strdup("");
    f[k++] = isfinite(d.teacher_s) ? m2d_strfmt("%.4f", d.teacher_s) : m2d_strdup("");
    for (int m = 0; m < sc->n_mc; m++) f[k++] = m2d_sweep_mc_cell(r.mc[m]);
    if (sc->n_mc) f[k++] = m2d_strdup(run_mc && rc == 0 ? "distilled" : "");
    f[k++] = m2d_strfmt("%.3f", m2d_now() - t0);
    char status[300];
    f[k++] = m2d_strdup(m2d_sweep_status(&r, status, sizeof status));
    free(r.mc), free(dir), free(log), free(state);
}

/* Distill the selected rows of MAIN not yet in the sidecar (DONE: its rows so far); one
 * configuration per distinct student, once per (loss, teacher_topk). */
static int distill_selected(const m2d_experiment *x, m2d_sweep_backend *b, const m2d_results *main, const int *rows,
                            int n_sel, const m2d_results *done, const char *root, const stage_cols *sc,
                            m2d_results_writer *w, m2d_sweep_summary *sum) {
    int rc = 0, n_f = 1 + sc->n_axes + sc->n_dist + sc->n_mc + 2, n_cb = n_combos(x);
    char **f = m2d_calloc((size_t)n_f, sizeof *f);
    m2d_progress prog;
    m2d_progress_start(&prog, "distillation", n_sel * n_cb);
    for (int s = 0; rc == 0 && s < n_sel * n_cb; s++) {
        const int row = rows[s / n_cb];
        const char *id = m2d_results_get(main, row, "config_id"), *fp = m2d_results_get(main, row, "fingerprint");
        combo cb;
        combo_of(x, s % n_cb, id, &cb);
        int seen = combo_done(done, id, &cb, sc->n_axes > 0, &sum->distill_failed);
        for (int e = 0; e < s / n_cb && !seen; e++) seen = !strcmp(m2d_results_get(main, rows[e], "fingerprint"), fp);
        int ci = m2d_sweep_find_config(x, id);
        if (seen || ci < 0) continue;
        distill_one(x, b, &x->configs[ci], &cb, root, sc, f);
        sum->distill_failed += strncmp(f[n_f - 1], "failed", 6) == 0;
        rc = m2d_results_append(w, (const char *const *)f);
        for (int i = 0; i < n_f; i++) free(f[i]), f[i] = NULL;
        sum->distill_evaluated++;
        m2d_progress_update(&prog, s + 1);
    }
    m2d_progress_end(&prog);
    free(f);
    return rc;
}

/* 1 when the sidecar SIDE, refused by the open (other settings), holds no distilled student -- only
 * its header or failed rows, e.g. of a run that failed every row with settings since fixed -- and
 * was removed: nothing is lost, and the run starts it afresh instead of asking for a hand delete */
static int replace_if_no_results(const char *side) {
    m2d_results r;
    if (m2d_results_read(side, &r)) return 0;
    int status = m2d_results_col(&r, "status"), any_ok = status < 0;
    for (int i = 0; i < r.n_rows && !any_ok; i++) any_ok = strncmp(r.rows[i][status], "failed", 6) != 0;
    m2d_results_free(&r);
    if (any_ok || unlink(side) != 0) return 0;
    fprintf(stderr, "moe2dense sweep: %s: made with other settings and holding no distilled student (only failures): "
            "started afresh\n", side);
    return 1;
}

/* Open the sidecar SIDE (created, or resumed when its header and columns agree) and run. */
static int run_stage(const m2d_experiment *x, m2d_sweep_backend *b, const m2d_results *main, const int *rows,
                     int n_sel, const char *out, const m2d_sweep_meta *meta, const stage_cols *sc,
                     m2d_sweep_summary *sum) {
    int n_side = 1 + sc->n_axes + sc->n_dist + sc->n_mc + 2, j = 0, n_meta = meta->n + 1;
    const char **cols = m2d_calloc((size_t)n_side, sizeof *cols);
    cols[j++] = "config_id";
    if (sc->n_axes) cols[j++] = "loss", cols[j++] = "teacher_topk";
    for (int m = 0; m < sc->n_dist - (sc->n_mc > 0); m++) cols[j++] = sc->dist[m];
    for (int m = 0; m < sc->n_mc; m++) cols[j++] = sc->mc[m];
    if (sc->n_mc) cols[j++] = "mc_student";
    cols[j++] = "wall_s";
    cols[j++] = "status";
    const char **items = m2d_calloc((size_t)n_meta, sizeof *items);
    memcpy(items, meta->items, (size_t)meta->n * sizeof *items);
    char *settings = settings_text(x);
    items[meta->n] = settings;
    const char **keys = m2d_calloc((size_t)m2d_sweep_n_identity_keys + 1, sizeof *keys);
    memcpy(keys, m2d_sweep_identity_keys, (size_t)m2d_sweep_n_identity_keys * sizeof *keys);
    keys[m2d_sweep_n_identity_keys] = "distill";
    char *side = m2d_strfmt("%s.distill.csv", out), *root = m2d_strfmt("%s.distill", out);
    m2d_results_writer w;
    m2d_results done;
    int rc = m2d_results_open(side, cols, n_side, items, n_meta, keys, m2d_sweep_n_identity_keys + 1, &w, &done);
    if (rc && replace_if_no_results(side))
        rc = m2d_results_open(side, cols, n_side, items, n_meta, keys, m2d_sweep_n_identity_keys + 1, &w, &done);
    if (rc == 0) {
        rc = distill_selected(x, b, main, rows, n_sel, &done, root, sc, &w, sum);
        m2d_results_close(&w);
        m2d_results_free(&done);
    }
    /* OUT gets the distillation columns, and the MC columns measured on the distilled students */
    int n_fill = sc->n_dist + sc->n_mc;
    char **fill = m2d_calloc((size_t)n_fill + 1, sizeof *fill);
    for (int m = 0; m < sc->n_dist; m++) fill[m] = sc->dist[m];
    for (int m = 0; m < sc->n_mc; m++) fill[sc->n_dist + m] = sc->mc[m];
    combo first; /* the ablation fills OUT from its first (loss, teacher_topk) */
    combo_of(x, 0, "", &first);
    char *where[] = {"loss", "teacher_topk"}, *vals[] = {first.loss_s, first.topk_s};
    if (rc == 0) rc = m2d_sweep_mc_fill_where(out, side, fill, n_fill, where, vals, sc->n_axes);
    free(fill), free(side), free(root), free(settings), free(items), free(keys), free(cols);
    return rc;
}

int m2d_sweep_distill_stage(const m2d_experiment *x, m2d_sweep_backend *b, const char *out, const m2d_sweep_meta *meta,
                            m2d_sweep_summary *sum) {
    m2d_results main;
    if (m2d_results_read_checked(out, &main)) return -1;
    m2d_sweep_keep_grid_rows(x, &main, out);
    int *rows = NULL, n_sel = m2d_sweep_select_rows(&main, x->distill_configs, x->distill_ids, x->n_distill_ids, &rows);
    int rc = n_sel < 0 ? -1 : 0;
    if (rc == 0) {
        sum->distill_selected = n_sel;
        stage_cols sc;
        sc.n_dist = m2d_sweep_distill_columns(x, &sc.dist);
        sc.n_mc = m2d_sweep_mc_columns(x, &sc.mc);
        sc.n_axes = x->distill_ablation ? 2 : 0;
        rc = run_stage(x, b, &main, rows, n_sel, out, meta, &sc, sum);
        m2d_sweep_columns_free(sc.dist, sc.n_dist);
        m2d_sweep_columns_free(sc.mc, sc.n_mc);
    }
    m2d_results_free(&main);
    free(rows);
    return rc;
}
