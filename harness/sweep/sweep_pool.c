/* sweep_pool — build, dedup by fingerprint, evaluate; one CSV row per configuration (see sweep_pool.h). */
#include "sweep/sweep_pool.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "sweep/sweep_csv.h"

/* a configuration whose student another worker is evaluating: that worker writes its row */
typedef struct waiter {
    int cfg;
    m2d_sweep_result res; /* build part (d_dense, n_params, fingerprint) */
    double wall;
    struct waiter *next;
} waiter;

/* one distinct student: who evaluates it (canonical), and its result once done */
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
    int n_mc;
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

/* Write one CSV row for configuration CI; the first failed write stops the pool. */
static void write_row(run_state *s, int ci, const m2d_sweep_result *r, double wall, const char *status,
                      const char *dedup_of) {
    int n;
    char **f = m2d_sweep_row(s->x, &s->x->configs[ci], r, wall, status, dedup_of, &n);
    pthread_mutex_lock(&s->write_mu);
    if (m2d_results_append(s->w, (const char *const *)f) != 0 && !s->write_failed) {
        s->write_failed = 1;
        snprintf(s->write_err, sizeof s->write_err, "%s", m2d_errmsg());
    }
    pthread_mutex_unlock(&s->write_mu);
    m2d_sweep_row_free(f, n);
}

/* A failed status other than a non-finite perplexity: the configuration could not be run. */
static int unrunnable(const char *status) {
    return strncmp(status, "failed", 6) == 0 && strcmp(status, "failed: non-finite perplexity") != 0;
}

static void count_row(run_state *s, const char *status, int dedup) {
    /* under s->mu */
    s->finished++;
    if (strncmp(status, "failed", 6) == 0) s->sum->failed++;
    if (unrunnable(status)) s->sum->unrunnable++;
    if (dedup) s->sum->dedup++;
    m2d_progress_update(&s->prog, s->finished);
}

/* Write the row of a configuration that needs no evaluation of its own (build failed, or its
 * student was evaluated already: DEDUP_OF names that configuration) and count it. */
static void record_row(run_state *s, int ci, const m2d_sweep_result *r, double wall, const char *dedup_of) {
    char status[300];
    m2d_sweep_status(r, status, sizeof status);
    write_row(s, ci, r, wall, status, dedup_of);
    pthread_mutex_lock(&s->mu);
    s->sum->eval_s += wall;
    count_row(s, status, dedup_of != NULL);
    pthread_mutex_unlock(&s->mu);
}

/* The next configuration to run, or -1 when none is left (or a write failed). */
static int take_next(run_state *s) {
    pthread_mutex_lock(&s->mu);
    int ci = -1;
    if (s->next < s->n_todo && !s->write_failed) {
        ci = s->todo[s->next++];
        const m2d_grid_config *c = &s->x->configs[ci];
        snprintf(s->label, sizeof s->label, "sweep [%s %s/%s/%s K=%d]", c->id, c->scoring, c->grouping, c->scaling,
                 c->K);
    }
    pthread_mutex_unlock(&s->mu);
    return ci;
}

/* After a build: the index of the new fingerprint entry this worker evaluates, or -1 when the
 * configuration's row is taken care of (its student is done or in another worker's hands). */
static int claim_student(run_state *s, int ci, const m2d_sweep_result *r, double t0, void *student) {
    pthread_mutex_lock(&s->mu);
    fp_entry *e = fp_find(s, r->fingerprint);
    if (!e) {
        int ei = s->n_fps;
        fp_add(s, r->fingerprint, s->x->configs[ci].id);
        pthread_mutex_unlock(&s->mu);
        return ei;
    }
    if (e->done) {
        /* the same student was evaluated already: record its result, with this build's own
         * shape (an entry resumed from the CSV has no d_dense / n_params of its own) */
        m2d_sweep_result copy = e->res;
        copy.d_dense = r->d_dense;
        copy.n_params = r->n_params;
        char canonical[M2D_ID_LEN + 1];
        memcpy(canonical, e->canonical, sizeof canonical);
        pthread_mutex_unlock(&s->mu);
        s->b->free_student(s->b, student);
        record_row(s, ci, &copy, m2d_now() - t0, canonical);
        return -1;
    }
    /* being evaluated by another worker: it writes our row when done */
    waiter *wt = m2d_calloc(1, sizeof *wt);
    wt->cfg = ci;
    wt->res = *r;
    wt->res.mc = NULL;
    wt->wall = m2d_now() - t0;
    wt->next = e->waiters;
    e->waiters = wt;
    s->sum->eval_s += wt->wall;
    pthread_mutex_unlock(&s->mu);
    s->b->free_student(s->b, student);
    return -1;
}

/* The rows of the configurations that waited for the student evaluated as CANONICAL. */
static void write_waiters(run_state *s, waiter *ws, const m2d_sweep_result *r, const char *status,
                          const char *canonical) {
    while (ws) {
        waiter *nx = ws->next;
        m2d_sweep_result copy = *r;
        copy.d_dense = ws->res.d_dense;
        copy.n_params = ws->res.n_params;
        write_row(s, ws->cfg, &copy, ws->wall, status, canonical);
        pthread_mutex_lock(&s->mu);
        count_row(s, status, 1);
        pthread_mutex_unlock(&s->mu);
        free(ws);
        ws = nx;
    }
}

/* Evaluate the student of configuration CI (fingerprint entry EI), write its row and those of
 * the configurations that waited for it. */
static void evaluate_and_record(run_state *s, int ci, int ei, m2d_sweep_result *r, double t0, void *student) {
    const m2d_grid_config *c = &s->x->configs[ci];
    if (s->b->evaluate(s->b, student, c, r) != 0 && !r->error[0])
        snprintf(r->error, sizeof r->error, "%s", m2d_errmsg());
    s->b->free_student(s->b, student);
    double wall = m2d_now() - t0;
    char status[300];
    m2d_sweep_status(r, status, sizeof status);
    write_row(s, ci, r, wall, status, NULL);

    pthread_mutex_lock(&s->mu);
    fp_entry *e = &s->fps[ei]; /* fps may have moved */
    e->done = 1;
    e->res = *r;
    e->res.mc = s->n_mc ? m2d_malloc((size_t)s->n_mc * sizeof(double)) : NULL;
    if (s->n_mc) memcpy(e->res.mc, r->mc, (size_t)s->n_mc * sizeof(double));
    waiter *ws = e->waiters;
    e->waiters = NULL;
    s->sum->evaluated++;
    s->sum->eval_s += wall;
    count_row(s, status, 0);
    pthread_mutex_unlock(&s->mu);
    write_waiters(s, ws, r, status, c->id);
}

static void run_one(run_state *s, int ci, double *mc_buf) {
    double t0 = m2d_now();
    m2d_sweep_result r;
    memset(&r, 0, sizeof r);
    r.ppl = NAN;
    r.mc = mc_buf;
    for (int m = 0; m < s->n_mc; m++) mc_buf[m] = NAN;
    void *student = NULL;
    if (s->b->build(s->b, &s->x->configs[ci], &student, &r) != 0) {
        if (!r.error[0]) snprintf(r.error, sizeof r.error, "%s", m2d_errmsg());
        record_row(s, ci, &r, m2d_now() - t0, NULL);
        return;
    }
    int ei = claim_student(s, ci, &r, t0, student);
    if (ei >= 0) evaluate_and_record(s, ci, ei, &r, t0, student);
}

static void *worker(void *arg) {
    run_state *s = arg;
    double *mc_buf = s->n_mc ? m2d_malloc((size_t)s->n_mc * sizeof *mc_buf) : NULL;
    for (int ci; (ci = take_next(s)) >= 0;) run_one(s, ci, mc_buf);
    free(mc_buf);
    return NULL;
}

/* Resume: configurations already in the CSV are skipped (-> s->todo), and the students of its
 * evaluated rows are known by fingerprint, so later configurations are recorded as their dedups. */
static void resume_from(run_state *s, const m2d_sweep_pool_job *job, int *todo) {
    const m2d_results *ex = job->existing;
    int id_col = m2d_results_col(ex, "config_id"), fp_col = m2d_results_col(ex, "fingerprint");
    int dd_col = m2d_results_col(ex, "dedup_of"), ppl_col = m2d_results_col(ex, "ppl");
    int st_col = m2d_results_col(ex, "status"), pw_col = m2d_results_col(ex, "ppl_windows");
    for (int i = 0; i < job->n_idx; i++) {
        const char *id = s->x->configs[job->idx[i]].id;
        int found = -1;
        for (int r = 0; r < ex->n_rows && found < 0; r++)
            if (strcmp(ex->rows[r][id_col], id) == 0) found = r;
        if (found < 0) todo[s->n_todo++] = job->idx[i];
        else {
            s->sum->skipped++;
            if (unrunnable(ex->rows[found][st_col])) s->sum->unrunnable++;
        }
    }
    for (int r = 0; r < ex->n_rows; r++) {
        const char *fp = ex->rows[r][fp_col];
        if (!fp[0] || ex->rows[r][dd_col][0] || fp_find(s, fp)) continue;
        /* MC columns are not copied here: the MC stage fills them by fingerprint */
        fp_entry *e = fp_add(s, fp, ex->rows[r][id_col]);
        e->done = 1;
        e->res.ppl = ex->rows[r][ppl_col][0] ? strtod(ex->rows[r][ppl_col], NULL) : NAN;
        e->res.ppl_windows = atoi(ex->rows[r][pw_col]);
        snprintf(e->res.fingerprint, sizeof e->res.fingerprint, "%s", fp);
        const char *st = ex->rows[r][st_col];
        if (strncmp(st, "failed: ", 8) == 0) snprintf(e->res.error, sizeof e->res.error, "%s", st + 8);
    }
}

static void free_fps(run_state *s) {
    for (int i = 0; i < s->n_fps; i++) {
        free(s->fps[i].res.mc);
        waiter *wt = s->fps[i].waiters;
        while (wt) {
            waiter *nx = wt->next;
            free(wt);
            wt = nx;
        }
    }
    free(s->fps);
}

int m2d_sweep_pool_run(const m2d_sweep_pool_job *job, m2d_sweep_summary *sum) {
    run_state s;
    memset(&s, 0, sizeof s);
    s.x = job->x;
    s.b = job->b;
    s.w = job->w;
    s.n_mc = job->x->n_mc ? 2 * job->x->n_mc + 1 : 0;
    s.sum = sum;
    int *todo = m2d_malloc((size_t)(job->n_idx + 1) * sizeof *todo);
    resume_from(&s, job, todo);
    s.todo = todo;
    pthread_mutex_init(&s.mu, NULL);
    pthread_mutex_init(&s.write_mu, NULL);
    snprintf(s.label, sizeof s.label, "sweep");
    m2d_progress_start(&s.prog, s.label, s.n_todo);
    pthread_t *th = m2d_malloc((size_t)job->jobs * sizeof *th);
    int started = 0;
    for (int j = 0; j < job->jobs; j++)
        if (pthread_create(&th[j], NULL, worker, &s) == 0) started++;
    if (started == 0) worker(&s);
    for (int j = 0; j < started; j++) pthread_join(th[j], NULL);
    m2d_progress_end(&s.prog);
    free(th);
    free(todo);
    pthread_mutex_destroy(&s.mu);
    pthread_mutex_destroy(&s.write_mu);
    free_fps(&s);
    return s.write_failed ? m2d_err("%s", s.write_err) : 0;
}
