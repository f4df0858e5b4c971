#include "sweep/sweep.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "sweep/report.h"
#include "io/results.h"
#include "base/util.h"
#include "engine/backend.h"
#include "model/model.h"

/* ---- columns ---- */

static const char *const FIXED_COLS[] = {"config_id", "scoring", "grouping", "scaling", "K_expr", "K",
                                         "params", "d_dense", "n_params", "ppl", "ppl_protocol", "ppl_seq_len",
                                         "ppl_windows"};
static const char *const TAIL_COLS[] = {"wall_s", "status", "dedup_of", "fingerprint"};
#define N_FIXED ((int)M2D_ARRAY_LEN(FIXED_COLS))
#define N_TAIL ((int)M2D_ARRAY_LEN(TAIL_COLS))

static int n_mc_cols(const m2d_experiment *x) { return x->n_mc ? 2 * x->n_mc + 1 : 0; }

int m2d_sweep_columns(const m2d_experiment *x, char ***cols) {
    int n = N_FIXED + n_mc_cols(x) + N_TAIL, j = 0;
    char **c = m2d_calloc((size_t)n, sizeof *c);
    for (int i = 0; i < N_FIXED; i++) c[j++] = m2d_strdup(FIXED_COLS[i]);
    for (int t = 0; t < x->n_mc; t++) {
        c[j++] = m2d_strfmt("%s_acc", x->mc_tasks[t]);
        c[j++] = m2d_strfmt("%s_acc_norm", x->mc_tasks[t]);
    }
    if (x->n_mc) c[j++] = m2d_strdup("mc_avg");
    for (int i = 0; i < N_TAIL; i++) c[j++] = m2d_strdup(TAIL_COLS[i]);
    *cols = c;
    return n;
}

void m2d_sweep_columns_free(char **cols, int n) {
    for (int i = 0; i < n; i++) free(cols[i]);
    free(cols);
}

/* ---- backends ---- */

static int make_backend(const m2d_experiment *x, m2d_sweep_backend *b) {
    memset(b, 0, sizeof *b);
    if (strcmp(x->backend, "fake") == 0) return m2d_sweep_backend_fake(x, b);
    return m2d_sweep_backend_pipeline(x, b);
}

/* ---- the run ---- */

typedef struct waiter {
    int cfg;
    m2d_sweep_result res; /* build part (d_dense, n_params, fingerprint) */
    double wall;
    struct waiter *next;
} waiter;

typedef struct {
    char fp[65];
    char canonical[M2D_ID_LEN + 1];
    int done;
    m2d_sweep_result res;
    waiter *waiters;
} fp_entry;

typedef struct {
    const m2d_experiment *x;
    m2d_sweep_backend *b;
    m2d_results_writer *w;
    int n_cols, n_mc;
    const int *todo;
    int n_todo, next, finished;
    fp_entry *fps;
    int n_fps, cap_fps;
    pthread_mutex_t mu, write_mu;
    m2d_progress prog;
    char label[192];
    m2d_sweep_summary *sum;
    int write_failed;
    char write_err[512];
} run_state;

static fp_entry *fp_find(run_state *s, const char *fp) {
    for (int i = 0; i < s->n_fps; i++)
        if (strcmp(s->fps[i].fp, fp) == 0) return &s->fps[i];
    return NULL;
}

static fp_entry *fp_add(run_state *s, const char *fp, const char *canonical) {
    if (s->n_fps == s->cap_fps) {
        s->cap_fps = s->cap_fps ? 2 * s->cap_fps : 64;
        s->fps = m2d_realloc(s->fps, (size_t)s->cap_fps * sizeof *s->fps);
    }
    fp_entry *e = &s->fps[s->n_fps++];
    memset(e, 0, sizeof *e);
    snprintf(e->fp, sizeof e->fp, "%s", fp);
    snprintf(e->canonical, sizeof e->canonical, "%s", canonical);
    return e;
}

static char *fmt_num(double v, const char *fmt) { return isfinite(v) ? m2d_strfmt(fmt, v) : m2d_strdup(""); }

/* Write one CSV row for configuration CI. */
static void write_row(run_state *s, int ci, const m2d_sweep_result *r, double wall, const char *status,
                      const char *dedup_of) {
    const m2d_grid_config *c = &s->x->configs[ci];
    char **f = m2d_calloc((size_t)s->n_cols, sizeof *f);
    int j = 0;
    f[j++] = m2d_strdup(c->id);
    f[j++] = m2d_strdup(c->scoring);
    f[j++] = m2d_strdup(c->grouping);
    f[j++] = m2d_strdup(c->scaling);
    f[j++] = m2d_strdup(c->K_expr);
    f[j++] = m2d_strfmt("%d", c->K);
    f[j++] = m2d_strdup(c->params);
    f[j++] = r->d_dense ? m2d_strfmt("%lld", (long long)r->d_dense) : m2d_strdup("");
    f[j++] = r->n_params ? m2d_strfmt("%lld", (long long)r->n_params) : m2d_strdup("");
    f[j++] = fmt_num(r->ppl, "%.4f");
    f[j++] = m2d_strdup(s->x->ppl_protocol);
    f[j++] = m2d_strfmt("%d", s->x->ppl_seq_len);
    f[j++] = r->ppl_windows ? m2d_strfmt("%d", r->ppl_windows) : m2d_strdup("");
    for (int m = 0; m < s->n_mc; m++) f[j++] = r->mc ? fmt_num(r->mc[m], "%.6f") : m2d_strdup("");
    f[j++] = m2d_strfmt("%.3f", wall);
    f[j++] = m2d_strdup(status);
    f[j++] = m2d_strdup(dedup_of ? dedup_of : "");
    f[j++] = m2d_strdup(r->fingerprint);
    pthread_mutex_lock(&s->write_mu);
    if (m2d_results_append(s->w, (const char *const *)f) != 0 && !s->write_failed) {
        s->write_failed = 1;
        snprintf(s->write_err, sizeof s->write_err, "%s", m2d_errmsg());
    }
    pthread_mutex_unlock(&s->write_mu);
    for (int i = 0; i < s->n_cols; i++) free(f[i]);
    free(f);
}

static const char *status_of(const m2d_sweep_result *r, char *buf, size_t n) {
    if (r->error[0]) snprintf(buf, n, "failed: %s", r->error);
    else if (!isfinite(r->ppl)) snprintf(buf, n, "failed: non-finite perplexity");
    else snprintf(buf, n, "ok");
    return buf;
}

static void count_row(run_state *s, const char *status, int dedup) {
    /* under s->mu */
    s->finished++;
    if (strncmp(status, "failed", 6) == 0) s->sum->failed++;
    if (dedup) s->sum->dedup++;
    m2d_progress_update(&s->prog, s->finished);
}

/* Write the row of a configuration that needs no evaluation of its own (build failed, or its
 * student was evaluated already: DEDUP_OF names that configuration) and count it. */
static void record_row(run_state *s, int ci, const m2d_sweep_result *r, double wall, const char *dedup_of) {
    char status[300];
    status_of(r, status, sizeof status);
    write_row(s, ci, r, wall, status, dedup_of);
    pthread_mutex_lock(&s->mu);
    s->sum->eval_s += wall;
    count_row(s, status, dedup_of != NULL);
    pthread_mutex_unlock(&s->mu);
}

static void *worker(void *arg) {
    run_state *s = arg;
    double *mc_buf = s->n_mc ? m2d_malloc((size_t)s->n_mc * sizeof *mc_buf) : NULL;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        if (s->next >= s->n_todo || s->write_failed) {
            pthread_mutex_unlock(&s->mu);
            break;
        }
        int ci = s->todo[s->next++];
        const m2d_grid_config *c = &s->x->configs[ci];
        snprintf(s->label, sizeof s->label, "sweep [%s %s/%s/%s K=%d]", c->id, c->scoring, c->grouping, c->scaling,
                 c->K);
        pthread_mutex_unlock(&s->mu);

        double t0 = m2d_now();
        m2d_sweep_result r;
        memset(&r, 0, sizeof r);
        r.ppl = NAN;
        r.mc = mc_buf;
        for (int m = 0; m < s->n_mc; m++) mc_buf[m] = NAN;
        void *student = NULL;
        char status[300];
        if (s->b->build(s->b, c, &student, &r) != 0) {
            if (!r.error[0]) snprintf(r.error, sizeof r.error, "%s", m2d_errmsg());
            record_row(s, ci, &r, m2d_now() - t0, NULL);
            continue;
        }
        pthread_mutex_lock(&s->mu);
        fp_entry *e = fp_find(s, r.fingerprint);
        if (e && e->done) {
            /* the same student was evaluated already: record its result */
            m2d_sweep_result copy = e->res;
            char canonical[M2D_ID_LEN + 1];
            memcpy(canonical, e->canonical, sizeof canonical);
            pthread_mutex_unlock(&s->mu);
            s->b->free_student(s->b, student);
            copy.mc = e->res.mc;
            record_row(s, ci, &copy, m2d_now() - t0, canonical);
            continue;
        }
        if (e) {
            /* being evaluated by another worker: it writes our row when done */
            waiter *wt = m2d_calloc(1, sizeof *wt);
            wt->cfg = ci;
            wt->res = r;
            wt->res.mc = NULL;
            wt->wall = m2d_now() - t0;
            wt->next = e->waiters;
            e->waiters = wt;
            s->sum->eval_s += wt->wall;
            pthread_mutex_unlock(&s->mu);
            s->b->free_student(s->b, student);
            continue;
        }
        int ei = s->n_fps;
        fp_add(s, r.fingerprint, c->id);
        pthread_mutex_unlock(&s->mu);

        if (s->b->evaluate(s->b, student, c, &r) != 0 && !r.error[0])
            snprintf(r.error, sizeof r.error, "%s", m2d_errmsg());
        s->b->free_student(s->b, student);
        double wall = m2d_now() - t0;
        status_of(&r, status, sizeof status);
        write_row(s, ci, &r, wall, status, NULL);

        pthread_mutex_lock(&s->mu);
        e = &s->fps[ei]; /* fps may have moved */
        e->done = 1;
        e->res = r;
        e->res.mc = s->n_mc ? m2d_malloc((size_t)s->n_mc * sizeof(double)) : NULL;
        if (s->n_mc) memcpy(e->res.mc, mc_buf, (size_t)s->n_mc * sizeof(double));
        waiter *ws = e->waiters;
        e->waiters = NULL;
        s->sum->evaluated++;
        s->sum->eval_s += wall;
        count_row(s, status, 0);
        pthread_mutex_unlock(&s->mu);
        while (ws) {
            waiter *nx = ws->next;
            m2d_sweep_result copy = r;
            copy.d_dense = ws->res.d_dense;
            copy.n_params = ws->res.n_params;
            write_row(s, ws->cfg, &copy, ws->wall, status, c->id);
            pthread_mutex_lock(&s->mu);
            count_row(s, status, 1);
            pthread_mutex_unlock(&s->mu);
            free(ws);
            ws = nx;
        }
    }
    free(mc_buf);
    return NULL;
}

static void host_name(char *buf, size_t n) {
    if (gethostname(buf, n) != 0) snprintf(buf, n, "unknown");
    buf[n - 1] = 0;
    for (char *p = buf; *p; p++)
        if (*p == '\n' || *p == ',') *p = '_';
}

static void utc_now(char *buf, size_t n) {
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

typedef struct {
    char *items[16];
    int n;
} meta_list;

static void meta_add(meta_list *m, char *s) { m->items[m->n++] = s; }

static void build_meta(const m2d_experiment *x, const m2d_sweep_opts *o, const char *model_hash,
                       const char *calib_hash, meta_list *m) {
    char host[256], now[64];
    host_name(host, sizeof host);
    utc_now(now, sizeof now);
    meta_add(m, m2d_strdup("moe2dense-results=1"));
    meta_add(m, m2d_strfmt("version=%s", M2D_VERSION));
    meta_add(m, m2d_strfmt("experiment=%s", x->name));
    meta_add(m, m2d_strfmt("experiments_file=%s", x->file));
    meta_add(m, m2d_strfmt("backend=%s", x->backend));
    meta_add(m, m2d_strfmt("model=%s", x->model));
    meta_add(m, m2d_strfmt("model_hash=%s", model_hash));
    meta_add(m, m2d_strfmt("calib_hash=%s", calib_hash));
    meta_add(m, m2d_strfmt("ppl=%s L=%d max_windows=%d data=%s", x->ppl_protocol, x->ppl_seq_len, x->ppl_max_windows,
                           x->ppl_data));
    meta_add(m, o->shard_n ? m2d_strfmt("shard=%d/%d", o->shard_i, o->shard_n) : m2d_strdup("shard=all"));
    meta_add(m, m2d_strfmt("grid_size=%d", x->n_configs));
    meta_add(m, m2d_strfmt("host=%s", host));
    meta_add(m, m2d_strfmt("started=%s", now));
}

static const char *const IDENTITY[] = {"experiment", "backend", "model_hash", "calib_hash", "ppl", "shard"};

/* Drop rows recorded as failed (atomic rewrite), so they run again. */
static int drop_failed_rows(const char *path) {
    if (!m2d_file_exists(path)) return 0;
    m2d_results r;
    if (m2d_results_read(path, &r)) return -1;
    int st = m2d_results_col(&r, "status"), kept = 0;
    for (int i = 0; i < r.n_rows; i++) {
        if (st >= 0 && strncmp(r.rows[i][st], "failed", 6) == 0) {
            for (int c = 0; c < r.n_cols; c++) free(r.rows[i][c]);
            free(r.rows[i]);
        } else {
            r.rows[kept++] = r.rows[i];
        }
    }
    r.n_rows = kept;
    int rc = m2d_results_write(path, &r);
    m2d_results_free(&r);
    return rc;
}

static void choose_threads(const m2d_sweep_opts *o, int n_todo, int *jobs, int *threads) {
    int cores = m2d_default_threads();
    *jobs = o->jobs > 0 ? o->jobs : 1;
    if (*jobs > n_todo && n_todo > 0) *jobs = n_todo;
    *threads = o->threads > 0 ? o->threads : M2D_MAX(1, cores / *jobs);
}

/* ---- multiple-choice stage ----
 * After the perplexity pass, the configurations chosen by [mc].configs ("best-per-pair": for each
 * scoring x grouping, the (K, scaling) with the lowest PPL, as the paper does; "all": every
 * evaluated student) are evaluated on the MC tasks. Results are appended crash-safely to the
 * sidecar OUT.mc.csv (resumable like the main file), then copied into the MC columns of OUT (one
 * atomic rewrite) for every row whose student has the same fingerprint. */

static int find_config(const m2d_experiment *x, const char *id) {
    for (int i = 0; i < x->n_configs; i++)
        if (strcmp(x->configs[i].id, id) == 0) return i;
    return -1;
}

static int mc_select(const m2d_experiment *x, const m2d_results *r, int **rows) {
    if (strcmp(x->mc_configs, "best-per-pair") == 0) return m2d_report_best_per_pair(r, rows);
    *rows = m2d_malloc((size_t)(r->n_rows + 1) * sizeof **rows);
    int n = 0;
    for (int i = 0; i < r->n_rows; i++)
        if (!strcmp(m2d_results_get(r, i, "status"), "ok") && !m2d_results_get(r, i, "dedup_of")[0]) (*rows)[n++] = i;
    return n;
}

/* Copy the sidecar's MC values into the main file's rows (matched by student fingerprint). */
static int mc_fill_main(const char *out, const char *side, int n_mc) {
    m2d_results main, mc;
    if (m2d_results_read(out, &main)) return -1;
    if (m2d_results_read(side, &mc)) {
        m2d_results_free(&main);
        return -1;
    }
    int fp_col = m2d_results_col(&main, "fingerprint"), id_col = m2d_results_col(&main, "config_id");
    int first_mc = m2d_results_col(&main, "fingerprint") - N_TAIL + 1 - n_mc; /* MC columns precede the tail */
    int changed = 0;
    for (int j = 0; j < mc.n_rows; j++) {
        if (strcmp(m2d_results_get(&mc, j, "status"), "ok")) continue;
        const char *id = mc.rows[j][0], *fp = NULL;
        for (int i = 0; i < main.n_rows && !fp; i++)
            if (!strcmp(main.rows[i][id_col], id)) fp = main.rows[i][fp_col];
        if (!fp || !fp[0]) continue;
        for (int i = 0; i < main.n_rows; i++) {
            if (strcmp(main.rows[i][fp_col], fp)) continue;
            for (int m = 0; m < n_mc; m++) {
                if (!strcmp(main.rows[i][first_mc + m], mc.rows[j][1 + m])) continue;
                free(main.rows[i][first_mc + m]);
                main.rows[i][first_mc + m] = m2d_strdup(mc.rows[j][1 + m]);
                changed = 1;
            }
        }
    }
    int rc = changed ? m2d_results_write(out, &main) : 0;
    m2d_results_free(&main);
    m2d_results_free(&mc);
    return rc;
}

static int mc_stage(const m2d_experiment *x, m2d_sweep_backend *b, const char *out, char **cols, int n_cols,
                    const meta_list *meta, m2d_sweep_summary *sum) {
    int n_mc = n_mc_cols(x);
    m2d_results main;
    if (m2d_results_read(out, &main)) return -1;
    int *rows = NULL, n_sel = mc_select(x, &main, &rows);
    if (n_sel < 0) {
        m2d_results_free(&main);
        return -1;
    }
    sum->mc_selected = n_sel;
    /* sidecar columns: config_id, the MC columns, wall_s, status */
    int n_side = n_mc + 3, j = 0;
    const char **side_cols = m2d_calloc((size_t)n_side, sizeof *side_cols);
    side_cols[j++] = "config_id";
    for (int m = 0; m < n_mc; m++) side_cols[j++] = cols[N_FIXED + m];
    side_cols[j++] = "wall_s";
    side_cols[j++] = "status";
    (void)n_cols;
    char *side = m2d_strfmt("%s.mc.csv", out);
    m2d_results_writer w;
    m2d_results done;
    int rc = m2d_results_open(side, side_cols, n_side, (const char *const *)meta->items, meta->n, IDENTITY,
                              (int)M2D_ARRAY_LEN(IDENTITY), &w, &done);
    m2d_progress prog;
    m2d_progress_start(&prog, "multiple choice", n_sel);
    double *mc_buf = m2d_malloc((size_t)(n_mc + 1) * sizeof *mc_buf);
    for (int s = 0; rc == 0 && s < n_sel; s++) {
        const char *id = m2d_results_get(&main, rows[s], "config_id");
        int seen = 0;
        for (int d = 0; d < done.n_rows && !seen; d++) seen = !strcmp(done.rows[d][0], id);
        int ci = find_config(x, id);
        if (seen || ci < 0) continue;
        double t0 = m2d_now();
        m2d_sweep_result r;
        memset(&r, 0, sizeof r);
        r.ppl = NAN;
        r.mc = mc_buf;
        for (int m = 0; m < n_mc; m++) mc_buf[m] = NAN;
        void *student = NULL;
        if (b->build(b, &x->configs[ci], &student, &r) == 0) {
            if (b->evaluate_mc(b, student, &x->configs[ci], &r) != 0 && !r.error[0])
                snprintf(r.error, sizeof r.error, "%s", m2d_errmsg());
            b->free_student(b, student);
        } else if (!r.error[0]) {
            snprintf(r.error, sizeof r.error, "%s", m2d_errmsg());
        }
        char **f = m2d_calloc((size_t)n_side, sizeof *f);
        int k = 0;
        f[k++] = m2d_strdup(id);
        for (int m = 0; m < n_mc; m++) f[k++] = fmt_num(mc_buf[m], "%.6f");
        f[k++] = m2d_strfmt("%.3f", m2d_now() - t0);
        f[k++] = r.error[0] ? m2d_strfmt("failed: %s", r.error) : m2d_strdup("ok");
        rc = m2d_results_append(&w, (const char *const *)f);
        for (int i = 0; i < n_side; i++) free(f[i]);
        free(f);
        sum->mc_evaluated++;
        m2d_progress_update(&prog, s + 1);
    }
    m2d_progress_end(&prog);
    free(mc_buf);
    m2d_results_close(&w);
    m2d_results_free(&done);
    m2d_results_free(&main);
    if (rc == 0) rc = mc_fill_main(out, side, n_mc);
    free(side);
    free(side_cols);
    free(rows);
    return rc;
}

int m2d_sweep_run(const m2d_experiment *x, const m2d_sweep_opts *o, m2d_sweep_summary *sum) {
    memset(sum, 0, sizeof *sum);
    double t_start = m2d_now();
    const char *out = o->out ? o->out : x->out;
    int *idx = NULL, n_idx;
    if (o->shard_n) n_idx = m2d_grid_shard(x, o->shard_i, o->shard_n, &idx);
    else {
        idx = m2d_malloc((size_t)x->n_configs * sizeof *idx);
        for (int i = 0; i < x->n_configs; i++) idx[i] = i;
        n_idx = x->n_configs;
    }
    sum->total = n_idx;
    m2d_sweep_backend b;
    if (make_backend(x, &b)) {
        free(idx);
        return -1;
    }
    int jobs, threads;
    choose_threads(o, n_idx, &jobs, &threads);
    b.threads = threads;
    m2d_backend_host_blas_threads(threads);
    sum->jobs = jobs;
    sum->threads = threads;
    char model_hash[65] = "", calib_hash[65] = "";
    int rc = -1;
    char **cols = NULL;
    int n_cols = m2d_sweep_columns(x, &cols);
    meta_list meta = {0};
    m2d_results existing = {0};
    m2d_results_writer w = {0};
    run_state s;
    memset(&s, 0, sizeof s);
    char *dir = m2d_strdup(out);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        *slash = 0;
        if (m2d_mkdir_p(dir)) goto done;
    }
    double t_prep = m2d_now();
    if (b.prepare(&b, x, model_hash, calib_hash)) goto done;
    sum->prepare_s = m2d_now() - t_prep;
    build_meta(x, o, model_hash, calib_hash, &meta);
    if (o->retry_failed && drop_failed_rows(out)) goto done;
    if (m2d_results_open(out, (const char *const *)cols, n_cols, (const char *const *)meta.items, meta.n, IDENTITY,
                         (int)M2D_ARRAY_LEN(IDENTITY), &w, &existing))
        goto done;

    /* resume: skip configurations already recorded; reuse their fingerprints for dedup */
    s.x = x;
    s.b = &b;
    s.w = &w;
    s.n_cols = n_cols;
    s.n_mc = n_mc_cols(x);
    s.sum = sum;
    int id_col = m2d_results_col(&existing, "config_id"), fp_col = m2d_results_col(&existing, "fingerprint");
    int dd_col = m2d_results_col(&existing, "dedup_of"), ppl_col = m2d_results_col(&existing, "ppl");
    int st_col = m2d_results_col(&existing, "status"), pw_col = m2d_results_col(&existing, "ppl_windows");
    int *todo = m2d_malloc((size_t)(n_idx + 1) * sizeof *todo);
    int n_todo = 0;
    for (int i = 0; i < n_idx; i++) {
        const char *id = x->configs[idx[i]].id;
        int found = 0;
        for (int r = 0; r < existing.n_rows && !found; r++) found = strcmp(existing.rows[r][id_col], id) == 0;
        if (found) sum->skipped++;
        else todo[n_todo++] = idx[i];
    }
    for (int r = 0; r < existing.n_rows; r++) {
        const char *fp = existing.rows[r][fp_col];
        if (!fp[0] || existing.rows[r][dd_col][0] || fp_find(&s, fp)) continue;
        /* MC columns are not copied here: the MC stage fills them by fingerprint */
        fp_entry *e = fp_add(&s, fp, existing.rows[r][id_col]);
        e->done = 1;
        e->res.ppl = existing.rows[r][ppl_col][0] ? strtod(existing.rows[r][ppl_col], NULL) : NAN;
        e->res.ppl_windows = atoi(existing.rows[r][pw_col]);
        snprintf(e->res.fingerprint, sizeof e->res.fingerprint, "%s", fp);
        const char *st = existing.rows[r][st_col];
        if (strncmp(st, "failed: ", 8) == 0) snprintf(e->res.error, sizeof e->res.error, "%s", st + 8);
    }
    s.todo = todo;
    s.n_todo = n_todo;
    pthread_mutex_init(&s.mu, NULL);
    pthread_mutex_init(&s.write_mu, NULL);
    snprintf(s.label, sizeof s.label, "sweep");
    m2d_progress_start(&s.prog, s.label, n_todo);
    pthread_t *th = m2d_malloc((size_t)jobs * sizeof *th);
    int started = 0;
    for (int j = 0; j < jobs; j++)
        if (pthread_create(&th[j], NULL, worker, &s) == 0) started++;
    if (started == 0) worker(&s);
    for (int j = 0; j < started; j++) pthread_join(th[j], NULL);
    m2d_progress_end(&s.prog);
    free(th);
    free(todo);
    pthread_mutex_destroy(&s.mu);
    pthread_mutex_destroy(&s.write_mu);
    rc = 0;
    if (s.write_failed) rc = m2d_err("%s", s.write_err);
    m2d_results_close(&w); /* the MC stage may rewrite OUT */
    if (rc == 0 && x->n_mc && strcmp(x->mc_configs, "none") != 0) {
        if (o->shard_n > 1)
            fprintf(stderr, "moe2dense sweep: multiple-choice stage skipped in a shard: it runs on the merged CSV "
                            "(moe2dense sweep %s --experiment %s --out MERGED.csv)\n", x->file, x->name);
        else if (!b.evaluate_mc)
            rc = m2d_err("backend '%s' cannot run multiple-choice tasks", b.name);
        else
            rc = mc_stage(x, &b, out, cols, n_cols, &meta, sum);
    }
done:
    for (int i = 0; i < s.n_fps; i++) {
        free(s.fps[i].res.mc);
        waiter *wt = s.fps[i].waiters;
        while (wt) {
            waiter *nx = wt->next;
            free(wt);
            wt = nx;
        }
    }
    free(s.fps);
    m2d_results_close(&w);
    m2d_results_free(&existing);
    for (int i = 0; i < meta.n; i++) free(meta.items[i]);
    m2d_sweep_columns_free(cols, n_cols);
    free(dir);
    free(idx);
    if (b.destroy) b.destroy(&b);
    sum->wall_s = m2d_now() - t_start;
    return rc;
}

/* ---- dry run ---- */

typedef struct {
    int64_t vocab, hidden, layers, heads, kv_heads, head_dim, d_e, E, k;
} shape;

static int read_shape(const char *model, shape *sh) {
    m2d_config c;
    if (m2d_config_load(model, &c, NULL) != 0) return -1;
    *sh = (shape){c.vocab_size, c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
                  c.head_dim, c.moe_intermediate_size, c.num_experts, c.num_experts_per_tok};
    m2d_config_free(&c);
    return 0;
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
    FILE *f = fopen(x->ppl_data, "rb");
    if (f) {
        fseek(f, 0, SEEK_END);
        tokens = (int64_t)(ftell(f) / 4.3);
        fclose(f);
    } else {
        tokens = 290000;
    }
    int64_t windows = tokens / x->ppl_seq_len;
    if (x->ppl_max_windows && windows > x->ppl_max_windows) windows = x->ppl_max_windows;
    *ppl_tokens = windows * x->ppl_seq_len;
    return 2.0 * (double)per_token * (double)*ppl_tokens / (ASSUMED_FLOPS_PER_CORE * m2d_default_threads());
}

static double calibration_seconds(const m2d_experiment *x, const shape *sh) {
    /* the teacher runs every expert on every token (the Gram matrix needs all f_e) */
    int64_t attn = sh->hidden * sh->head_dim * (2 * sh->heads + 2 * sh->kv_heads);
    int64_t experts = 3 * sh->hidden * sh->E * sh->d_e;
    int64_t per_token = sh->layers * (attn + experts) + sh->vocab * sh->hidden;
    double tokens = (double)x->calib_samples * x->calib_seq_len;
    return 2.0 * (double)per_token * tokens / (ASSUMED_FLOPS_PER_CORE * m2d_default_threads());
}

static void fmt_duration(double s, char *buf, size_t n) {
    if (s < 10) snprintf(buf, n, "%.1f s", s);
    else if (s < 120) snprintf(buf, n, "%.0f s", s);
    else if (s < 7200) snprintf(buf, n, "%.1f min", s / 60);
    else snprintf(buf, n, "%.1f h", s / 3600);
}

int m2d_sweep_dry_run(const m2d_experiment *x, const m2d_sweep_opts *o, FILE *f) {
    const char *out = o->out ? o->out : x->out;
    int *idx = NULL, n_idx;
    if (o->shard_n) n_idx = m2d_grid_shard(x, o->shard_i, o->shard_n, &idx);
    else {
        idx = m2d_malloc((size_t)x->n_configs * sizeof *idx);
        for (int i = 0; i < x->n_configs; i++) idx[i] = i;
        n_idx = x->n_configs;
    }
    m2d_results existing = {0};
    int have_csv = m2d_file_exists(out) && m2d_results_read(out, &existing) == 0;
    m2d_err_clear();
    fprintf(f, "experiment %s (%s): %s\n", x->name, x->file, x->description);
    fprintf(f, "teacher %s: E = %d, k = %d%s\n", x->model, x->E, x->k,
            x->shape_from_config ? "" : " (from [teacher]; config.json not readable)");
    fprintf(f, "%5s  %-12s  %-8s %-8s %-12s %-5s %4s  %-16s %s\n", "#", "config_id", "scoring", "grouping", "scaling",
            "K", "", "params", "status");
    int done = 0;
    for (int i = 0; i < n_idx; i++) {
        const m2d_grid_config *c = &x->configs[idx[i]];
        const char *st = "pending";
        for (int r = 0; have_csv && r < existing.n_rows; r++)
            if (strcmp(m2d_results_get(&existing, r, "config_id"), c->id) == 0) st = m2d_results_get(&existing, r, "status");
        if (strcmp(st, "pending")) done++;
        char kexpr[24];
        snprintf(kexpr, sizeof kexpr, "(%s)", c->K_expr);
        fprintf(f, "%5d  %-12s  %-8s %-8s %-12s %-5d %4s  %-16s %s\n", c->index + 1, c->id, c->scoring, c->grouping,
                c->scaling, c->K, kexpr, c->params[0] ? c->params : "-", st);
    }
    fprintf(f, "\nconfigurations: %d", n_idx);
    if (o->shard_n) fprintf(f, " (shard %d/%d of %d)", o->shard_i, o->shard_n, x->n_configs);
    if (x->n_excluded) fprintf(f, "; %d excluded by rules", x->n_excluded);
    if (x->n_duplicate_K)
        fprintf(f, "; %d duplicates dropped (K expressions that coincide on this teacher, e.g. 8k = E, run once)",
                x->n_duplicate_K);
    fprintf(f, "\n");
    if (have_csv) fprintf(f, "already in %s: %d (resume skips them), to run: %d\n", out, done, n_idx - done);

    /* distinct students: exact when the backend can tell without evaluating */
    m2d_sweep_backend b;
    int distinct = -1;
    if (make_backend(x, &b) == 0) {
        if (b.count_distinct) distinct = b.count_distinct(&b, x, idx, n_idx);
        if (b.destroy) b.destroy(&b);
    }
    m2d_err_clear();
    int upper = n_idx;
    if (distinct >= 0) {
        fprintf(f, "distinct students: %d (from their fingerprints); %d configurations are recorded as dedup_of\n",
                distinct, n_idx - distinct);
    } else {
        /* at K = k every group holds one expert, so all groupings give one student per
         * (scoring, scaling, params): an upper bound until the statistics exist */
        int collapsed = 0;
        for (int i = 0; i < n_idx; i++) {
            const m2d_grid_config *c = &x->configs[idx[i]];
            if (c->K != x->k) continue;
            for (int j = 0; j < i; j++) {
                const m2d_grid_config *d = &x->configs[idx[j]];
                if (d->K == c->K && !strcmp(d->scoring, c->scoring) && !strcmp(d->scaling, c->scaling) &&
                    !strcmp(d->params, c->params)) {
                    collapsed++;
                    break;
                }
            }
        }
        upper = n_idx - collapsed;
        fprintf(f, "distinct students: at most %d (upper bound: groupings coincide at K = k; the exact count needs "
                   "the calibration statistics, which are computed on the first run)\n", upper);
    }
    /* run-time estimate */
    shape sh;
    double per = -1;
    const char *how = "";
    int n_meas = 0;
    double sum_meas = 0;
    for (int r = 0; have_csv && r < existing.n_rows; r++)
        if (!m2d_results_get(&existing, r, "dedup_of")[0] && !strcmp(m2d_results_get(&existing, r, "status"), "ok")) {
            sum_meas += strtod(m2d_results_get(&existing, r, "wall_s"), NULL);
            n_meas++;
        }
    if (n_meas) {
        per = sum_meas / n_meas;
        how = "mean measured wall time of the evaluated rows in the CSV";
    }
    if (read_shape(x->model, &sh) == 0) {
        int64_t ppl_tokens;
        double est = estimate_config_seconds(x, &sh, &ppl_tokens);
        if (per < 0) {
            per = est;
            how = "FLOP estimate at 20 GFLOP/s per core; rough";
        }
        char a[32];
        fmt_duration(calibration_seconds(x, &sh), a, sizeof a);
        fprintf(f, "calibration: %d x %d tokens, ~%s once (cached in %s)\n", x->calib_samples, x->calib_seq_len, a,
                x->cache_dir);
        fprintf(f, "perplexity: %s on %lld tokens per configuration (L = %d)\n", x->ppl_protocol,
                (long long)ppl_tokens, x->ppl_seq_len);
    }
    if (per >= 0) {
        int todo = n_idx - done, bound = distinct >= 0 ? distinct : upper;
        char a[32], c2[32];
        fmt_duration(per, a, sizeof a);
        fmt_duration(per * M2D_MIN(todo, bound), c2, sizeof c2);
        fprintf(f, "estimated run time: ~%s per configuration (%s) -> ~%s for %d to run\n", a, how, c2,
                M2D_MIN(todo, bound));
    } else {
        fprintf(f, "estimated run time: unknown (teacher config.json not readable)\n");
    }
    if (strcmp(x->mc_configs, "none") != 0 && x->n_mc)
        fprintf(f, "multiple choice: %d task(s) on %s configurations\n", x->n_mc, x->mc_configs);
    m2d_results_free(&existing);
    free(idx);
    return 0;
}
