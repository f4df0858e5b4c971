/* sweep_csv — columns, run header and rows of a sweep's results CSV (see sweep_csv.h). */
#include "sweep/sweep_csv.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/util.h"

static const char *const FIXED_COLS[] = {"config_id", "scoring", "grouping", "scaling", "K_expr", "K",
                                         "params", "d_dense", "n_params", "ppl", "ppl_protocol", "ppl_seq_len",
                                         "ppl_windows"};
static const char *const TAIL_COLS[] = {"wall_s", "status", "dedup_of", "fingerprint"};
#define N_FIXED ((int)M2D_ARRAY_LEN(FIXED_COLS))
#define N_TAIL ((int)M2D_ARRAY_LEN(TAIL_COLS))

const char *const m2d_sweep_identity_keys[] = {"experiment", "backend", "model_hash", "calib_hash", "precision", "ppl",
                                                  "shard", "device", "+inputs", "+d2d_inputs"};
const int m2d_sweep_n_identity_keys = (int)M2D_ARRAY_LEN(m2d_sweep_identity_keys);

static int n_mc_cols(const m2d_experiment *x) { return x->n_mc ? 2 * x->n_mc + 1 : 0; }

/* "target", "ratio" and "top_k" columns (after "params") only when the grid has MoE students, so a dense
 * experiment's CSV keeps the columns it always had */
static int has_moe(const m2d_experiment *x) {
    for (int i = 0; i < x->n_configs; i++)
        if (!strcmp(x->configs[i].target, "moe")) return 1;
    return 0;
}
#define N_PARAMS_COL 7 /* FIXED_COLS up to and including "params" */

int m2d_sweep_mc_columns(const m2d_experiment *x, char ***cols) {
    int n = n_mc_cols(x), j = 0;
    *cols = NULL;
    if (n == 0) return 0;
    char **c = m2d_calloc((size_t)n, sizeof *c);
    for (int t = 0; t < x->n_mc; t++) {
        c[j++] = m2d_strfmt("%s_acc", x->mc_tasks[t]);
        c[j++] = m2d_strfmt("%s_acc_norm", x->mc_tasks[t]);
    }
    c[j++] = m2d_strdup("mc_avg");
    *cols = c;
    return n;
}

/* distill_step_s, distill_teacher_s: mean seconds per optimizer step and of its teacher forward
 * (m2d_distill_result; the paper's s/step with each teacher) */
static const char *const DISTILL_COLS[] = {"distill_ppl", "distill_final_loss", "distill_tokens", "distill_steps",
                                           "distill_wall_s", "distill_step_s", "distill_teacher_s"};
#define N_DISTILL ((int)M2D_ARRAY_LEN(DISTILL_COLS))

/* the distill stage's columns in the main CSV (mc_student only when there are MC columns) */
static int n_distill_cols(const m2d_experiment *x) { return x->has_distill ? N_DISTILL + (x->n_mc > 0) : 0; }

int m2d_sweep_distill_columns(const m2d_experiment *x, char ***cols) {
    int n = n_distill_cols(x), j = 0;
    *cols = NULL;
    if (n == 0) return 0;
    char **c = m2d_calloc((size_t)n, sizeof *c);
    for (int i = 0; i < N_DISTILL; i++) c[j++] = m2d_strdup(DISTILL_COLS[i]);
    if (x->n_mc) c[j++] = m2d_strdup("mc_student");
    *cols = c;
    return n;
}

int m2d_sweep_columns(const m2d_experiment *x, char ***cols) {
    char **mc, **dist;
    int n_mc = m2d_sweep_mc_columns(x, &mc), n_dist = m2d_sweep_distill_columns(x, &dist);
    int moe = has_moe(x), n = N_FIXED + 3 * moe + n_mc + n_dist + N_TAIL, j = 0;
    char **c = m2d_calloc((size_t)n, sizeof *c);
    for (int i = 0; i < N_FIXED; i++) {
        c[j++] = m2d_strdup(FIXED_COLS[i]);
        if (moe && i == N_PARAMS_COL - 1)
            c[j++] = m2d_strdup("target"), c[j++] = m2d_strdup("ratio"), c[j++] = m2d_strdup("top_k");
    }
    for (int m = 0; m < n_mc; m++) c[j++] = mc[m]; /* ownership moves */
    for (int m = 0; m < n_dist; m++) c[j++] = dist[m];
    free(dist);
    for (int i = 0; i < N_TAIL; i++) c[j++] = m2d_strdup(TAIL_COLS[i]);
    free(mc);
    *cols = c;
    return n;
}

void m2d_sweep_columns_free(char **cols, int n) {
    for (int i = 0; i < n; i++) free(cols[i]);
    free(cols);
}

/* ---- run header ---- */

void m2d_sweep_meta_add(m2d_sweep_meta *m, char *item) {
    if (m->n == m->cap) {
        m->cap = m->cap ? 2 * m->cap : 16;
        m->items = m2d_realloc(m->items, (size_t)m->cap * sizeof *m->items);
    }
    m->items[m->n++] = item;
}

void m2d_sweep_meta_free(m2d_sweep_meta *m) {
    for (int i = 0; i < m->n; i++) free(m->items[i]);
    free(m->items);
    memset(m, 0, sizeof *m);
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

/* SHA-256 (16 hex digits) of the file at PATH, or "none" (absent or unreadable) */
static void file_sha16(const char *path, char out[17]) {
    size_t n;
    char *text = path ? m2d_read_file(path, &n) : NULL, hex[65];
    snprintf(out, 17, "none");
    if (!text) return;
    m2d_sha256_hex(text, n, hex);
    snprintf(out, 17, "%.16s", hex);
    free(text);
}

/* What the rows depend on besides the other identity keys: the bytes of the PPL and distillation
 * texts (a path may hold other text on a rerun), and the MC settings that change a score (tasks and
 * shots, the document limit, the task data's folder; not which configurations get MC) */
static char *inputs_value(const m2d_experiment *x) {
    char ppl[17], distill[17];
    file_sha16(x->ppl_data, ppl);
    file_sha16(x->has_distill ? x->distill_data : NULL, distill);
    char *mc = m2d_strfmt("limit=%d data=%s tasks=", x->mc_limit, x->n_mc ? x->mc_data_dir : "none");
    for (int i = 0; i < x->n_mc; i++) {
        char *next = m2d_strfmt("%s%s%s:%d", mc, i ? "," : "", x->mc_tasks[i], x->mc_shots[i]);
        free(mc);
        mc = next;
    }
    char *v = m2d_strfmt("inputs=ppl_sha256=%s distill_sha256=%s mc=%s", ppl, distill, mc);
    free(mc);
    return v;
}

/* "grid=" the SHA-256 of the grid's config ids in grid order: shards of one grid have the same
 * (merge checks it; other --set axes of the same size leave every identity key as it was) */
static char *grid_value(const m2d_experiment *x) {
    m2d_sha256 s;
    m2d_sha256_init(&s);
    for (int i = 0; i < x->n_configs; i++) {
        m2d_sha256_update(&s, x->configs[i].id, strlen(x->configs[i].id));
        m2d_sha256_update(&s, "\n", 1);
    }
    uint8_t d[32];
    char hex[65];
    m2d_sha256_final(&s, d);
    m2d_hex(d, 32, hex);
    return m2d_strfmt("grid=%s", hex);
}

void m2d_sweep_meta_build(const m2d_experiment *x, int shard_i, int shard_n, const char *model_hash,
                          const char *calib_hash, const char *precision, m2d_sweep_meta *m) {
    char host[256], now[64];
    host_name(host, sizeof host);
    utc_now(now, sizeof now);
    m2d_sweep_meta_add(m, m2d_strdup("moe2dense-results=1"));
    m2d_sweep_meta_add(m, m2d_strfmt("version=%s", M2D_VERSION));
    m2d_sweep_meta_add(m, m2d_strfmt("experiment=%s", x->name));
    m2d_sweep_meta_add(m, m2d_strfmt("experiments_file=%s", x->file));
    m2d_sweep_meta_add(m, m2d_strfmt("backend=%s", x->backend));
    m2d_sweep_meta_add(m, m2d_strfmt("model=%s", x->model));
    m2d_sweep_meta_add(m, m2d_strfmt("teacher=E=%d k=%d", x->E, x->k));
    m2d_sweep_meta_add(m, m2d_strfmt("model_hash=%s", model_hash));
    m2d_sweep_meta_add(m, m2d_strfmt("calib_hash=%s", calib_hash));
    m2d_sweep_meta_add(m, m2d_strfmt("precision=%s", precision));
    m2d_sweep_meta_add(m, m2d_strfmt("ppl=%s L=%d max_windows=%d data=%s", x->ppl_protocol, x->ppl_seq_len,
                                     x->ppl_max_windows, x->ppl_data));
    m2d_sweep_meta_add(m, inputs_value(x));
    m2d_sweep_meta_add(m, shard_n ? m2d_strfmt("shard=%d/%d", shard_i, shard_n) : m2d_strdup("shard=all"));
    m2d_sweep_meta_add(m, m2d_strfmt("grid_size=%d", x->n_configs));
    m2d_sweep_meta_add(m, grid_value(x));
    m2d_sweep_meta_add(m, m2d_strfmt("host=%s", host));
    m2d_sweep_meta_add(m, m2d_strfmt("started=%s", now));
}

/* ---- rows ---- */

const char *m2d_sweep_status(const m2d_sweep_result *r, char *buf, size_t n) {
    if (r->error[0]) snprintf(buf, n, "failed: %s", r->error);
    else if (!isfinite(r->ppl)) snprintf(buf, n, "failed: non-finite perplexity");
    else snprintf(buf, n, "ok");
    return buf;
}

static char *fmt_num(double v, const char *fmt) { return isfinite(v) ? m2d_strfmt(fmt, v) : m2d_strdup(""); }

char **m2d_sweep_row(const m2d_experiment *x, const m2d_grid_config *c, const m2d_sweep_result *r, double wall,
                     const char *status, const char *dedup_of, int *n_fields) {
    int n_mc = n_mc_cols(x), n_dist = n_distill_cols(x), moe = has_moe(x), n = N_FIXED + 3 * moe + n_mc + n_dist + N_TAIL,
        j = 0;
    char **f = m2d_calloc((size_t)n, sizeof *f);
    f[j++] = m2d_strdup(c->id);
    f[j++] = m2d_strdup(c->scoring);
    f[j++] = m2d_strdup(c->grouping);
    f[j++] = m2d_strdup(c->scaling);
    f[j++] = m2d_strdup(c->K_expr);
    f[j++] = m2d_strfmt("%d", c->K);
    f[j++] = m2d_strdup(c->params);
    if (moe) {
        int is_moe = !strcmp(c->target, "moe");
        f[j++] = m2d_strdup(is_moe ? "moe" : "dense");
        f[j++] = m2d_strdup(c->ratio);
        f[j++] = is_moe ? m2d_strfmt("%d", c->top_k ? c->top_k : x->k) : m2d_strdup("");
    }
    f[j++] = r->d_dense ? m2d_strfmt("%lld", (long long)r->d_dense) : m2d_strdup("");
    f[j++] = r->n_params ? m2d_strfmt("%lld", (long long)r->n_params) : m2d_strdup("");
    f[j++] = fmt_num(r->ppl, "%.4f");
    f[j++] = m2d_strdup(x->ppl_protocol);
    f[j++] = m2d_strfmt("%d", x->ppl_seq_len);
    f[j++] = r->ppl_windows ? m2d_strfmt("%d", r->ppl_windows) : m2d_strdup("");
    for (int m = 0; m < n_mc; m++) f[j++] = r->mc ? m2d_sweep_mc_cell(r->mc[m]) : m2d_strdup("");
    for (int m = 0; m < n_dist; m++) f[j++] = m2d_strdup(""); /* filled by the distill stage */
    f[j++] = m2d_strfmt("%.3f", wall);
    f[j++] = m2d_strdup(status);
    f[j++] = m2d_strdup(dedup_of ? dedup_of : "");
    f[j++] = m2d_strdup(r->fingerprint);
    *n_fields = n;
    return f;
}

void m2d_sweep_row_free(char **fields, int n) { m2d_sweep_columns_free(fields, n); }

char *m2d_sweep_mc_cell(double v) { return fmt_num(v, "%.6f"); }

static int not_failed(const m2d_results *r, int row, void *ctx) {
    int st = *(const int *)ctx;
    return st < 0 || strncmp(r->rows[row][st], "failed", 6) != 0;
}

int m2d_sweep_drop_failed_rows(const char *path) {
    if (!m2d_file_exists(path)) return 0;
    m2d_results r;
    if (m2d_results_read_checked(path, &r)) return -1;
    int st = m2d_results_col(&r, "status");
    m2d_results_keep_rows(&r, not_failed, &st);
    int rc = m2d_results_write(path, &r);
    m2d_results_free(&r);
    return rc;
}
