#include "io/results.h"

#include <csv.h>
#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/util.h"
#include "io/csv.h"

/* ---- reading ---- */

typedef struct {
    m2d_results *r;
    const char *name;
    int header_done;
    int cap;
} reader;

static void free_fields(char **fields, int n) {
    for (int i = 0; i < n; i++) free(fields[i]);
}

static int on_record(void *user, char **fields, const int *cols, int n, int line) {
    reader *rd = user;
    m2d_results *r = rd->r;
    if (!rd->header_done) {
        r->cols = m2d_malloc((size_t)n * sizeof *r->cols);
        memcpy(r->cols, fields, (size_t)n * sizeof *fields);
        r->n_cols = n;
        rd->header_done = 1;
        return 0;
    }
    if (n != r->n_cols) {
        free_fields(fields, n);
        return m2d_err("%s:%d:1: the row has %d fields, the header has %d", rd->name, line, n, r->n_cols);
    }
    if (r->n_rows == rd->cap) {
        rd->cap = rd->cap ? 2 * rd->cap : 64;
        r->rows = m2d_realloc(r->rows, (size_t)rd->cap * sizeof *r->rows);
        r->row_line = m2d_realloc(r->row_line, (size_t)rd->cap * sizeof *r->row_line);
        r->field_col = m2d_realloc(r->field_col, (size_t)rd->cap * (size_t)n * sizeof *r->field_col);
    }
    char **row = m2d_malloc((size_t)n * sizeof *row);
    memcpy(row, fields, (size_t)n * sizeof *fields);
    memcpy(r->field_col + (size_t)r->n_rows * (size_t)n, cols, (size_t)n * sizeof *cols);
    r->row_line[r->n_rows] = line;
    r->rows[r->n_rows++] = row;
    return 0;
}

static void add_meta(m2d_results *r, const char *line, size_t n) {
    const char *eq = memchr(line, '=', n);
    r->meta_keys = m2d_realloc(r->meta_keys, (size_t)(r->n_meta + 1) * sizeof *r->meta_keys);
    r->meta_vals = m2d_realloc(r->meta_vals, (size_t)(r->n_meta + 1) * sizeof *r->meta_vals);
    size_t klen = eq ? (size_t)(eq - line) : n;
    char *k = m2d_malloc(klen + 1);
    memcpy(k, line, klen);
    k[klen] = 0;
    size_t vlen = eq ? n - klen - 1 : 0;
    char *v = m2d_malloc(vlen + 1);
    if (vlen) memcpy(v, eq + 1, vlen);
    v[vlen] = 0;
    r->meta_keys[r->n_meta] = k;
    r->meta_vals[r->n_meta++] = v;
}

static int parse_text(const char *path, const char *text, size_t len, m2d_results *r) {
    memset(r, 0, sizeof *r);
    /* everything after the last newline is a torn row (rows are written whole, '\n'-terminated) */
    size_t complete = len;
    while (complete > 0 && text[complete - 1] != '\n') complete--;
    r->torn_bytes = len - complete;
    size_t pos = 0;
    int line = 1;
    while (pos < complete && text[pos] == '#') {
        const char *nl = memchr(text + pos, '\n', complete - pos);
        size_t end = (size_t)(nl - text);
        const char *s = text + pos + 1;
        size_t n = end - pos - 1;
        while (n && *s == ' ') s++, n--;
        if (n && s[n - 1] == '\r') n--;
        if (memchr(s, 0, n)) return m2d_err("%s:%d:1: NUL byte in a header line", path, line);
        add_meta(r, s, n);
        pos = end + 1;
        line++;
    }
    if (pos == complete) return m2d_err("%s: no column header row (not a moe2dense results file?)", path);
    reader rd = {.r = r, .name = path};
    if (m2d_csv_parse(path, text + pos, complete - pos, line, on_record, &rd)) return -1;
    if (!rd.header_done) return m2d_err("%s: no column header row", path);
    return 0;
}

int m2d_results_parse(const char *path, const char *text, size_t len, m2d_results *r) {
    int rc = parse_text(path, text, len, r);
    if (rc) m2d_results_free(r); /* nothing half-read is handed out */
    else r->path = m2d_strdup(path);
    return rc;
}

const char *m2d_results_name(const m2d_results *r) { return r->path ? r->path : "results"; }

int m2d_results_read(const char *path, m2d_results *r) {
    size_t len;
    char *text = m2d_read_file(path, &len);
    memset(r, 0, sizeof *r);
    if (!text) return -1;
    int rc = m2d_results_parse(path, text, len, r);
    free(text);
    return rc;
}

void m2d_results_free(m2d_results *r) {
    for (int i = 0; i < r->n_meta; i++) {
        free(r->meta_keys[i]);
        free(r->meta_vals[i]);
    }
    free(r->meta_keys);
    free(r->meta_vals);
    for (int i = 0; i < r->n_rows; i++) {
        for (int c = 0; c < r->n_cols; c++) free(r->rows[i][c]);
        free(r->rows[i]);
    }
    free(r->rows);
    for (int c = 0; c < r->n_cols; c++) free(r->cols[c]);
    free(r->cols);
    free(r->row_line);
    free(r->field_col);
    free(r->path);
    memset(r, 0, sizeof *r);
}

int m2d_results_keep_rows(m2d_results *r, int (*keep)(const m2d_results *r, int row, void *ctx), void *ctx) {
    int kept = 0;
    for (int i = 0; i < r->n_rows; i++) {
        if (!keep(r, i, ctx)) {
            for (int c = 0; c < r->n_cols; c++) free(r->rows[i][c]);
            free(r->rows[i]);
            continue;
        }
        if (r->row_line) r->row_line[kept] = r->row_line[i];
        if (r->field_col)
            memmove(r->field_col + (size_t)kept * r->n_cols, r->field_col + (size_t)i * r->n_cols,
                    sizeof(int) * (size_t)r->n_cols);
        r->rows[kept++] = r->rows[i];
    }
    int gone = r->n_rows - kept;
    r->n_rows = kept;
    return gone;
}

int m2d_results_col(const m2d_results *r, const char *name) {
    for (int c = 0; c < r->n_cols; c++)
        if (strcmp(r->cols[c], name) == 0) return c;
    return -1;
}

const char *m2d_results_get(const m2d_results *r, int row, const char *name) {
    int c = m2d_results_col(r, name);
    return c < 0 ? "" : r->rows[row][c];
}

void m2d_results_set_meta(m2d_results *r, const char *key, const char *value) {
    for (int i = 0; i < r->n_meta; i++)
        if (strcmp(r->meta_keys[i], key) == 0) {
            free(r->meta_vals[i]);
            r->meta_vals[i] = m2d_strdup(value);
            return;
        }
    char *line = m2d_strfmt("%s=%s", key, value);
    add_meta(r, line, strlen(line));
    free(line);
}

const char *m2d_results_meta(const m2d_results *r, const char *key) {
    for (int i = 0; i < r->n_meta; i++)
        if (strcmp(r->meta_keys[i], key) == 0) return r->meta_vals[i];
    return NULL;
}

/* ---- row validation ---- */

typedef enum {
    V_TEXT, V_ID, V_NAME, V_KEXPR, V_COUNT, V_COUNT_OR_EMPTY, V_TOTAL_OR_EMPTY, V_PARAMS, V_PPL, V_PROB_OR_EMPTY, V_SECONDS,
    V_STATUS, V_DEDUP, V_HEX64_OR_EMPTY, V_TARGET, V_RATIO_OR_EMPTY
} rule;

static const struct {
    const char *col;
    rule kind;
} COLUMN_RULES[] = {
    {"config_id", V_ID},        {"scoring", V_NAME},          {"grouping", V_NAME},
    {"scaling", V_NAME},        {"K_expr", V_KEXPR},          {"K", V_COUNT},
    {"params", V_PARAMS},       {"d_dense", V_COUNT_OR_EMPTY}, {"n_params", V_TOTAL_OR_EMPTY},
    {"ppl", V_PPL},             {"ppl_protocol", V_NAME},     {"ppl_seq_len", V_COUNT},
    {"ppl_windows", V_COUNT_OR_EMPTY}, {"mc_avg", V_PROB_OR_EMPTY}, {"wall_s", V_SECONDS},
    {"status", V_STATUS},       {"dedup_of", V_DEDUP},        {"fingerprint", V_HEX64_OR_EMPTY},
    {"target", V_TARGET},       {"ratio", V_RATIO_OR_EMPTY},  {"top_k", V_COUNT_OR_EMPTY},
};

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n > m && strcmp(s + n - m, suffix) == 0;
}

static rule rule_of(const char *col) {
    for (size_t i = 0; i < M2D_ARRAY_LEN(COLUMN_RULES); i++)
        if (!strcmp(col, COLUMN_RULES[i].col)) return COLUMN_RULES[i].kind;
    if (ends_with(col, "_acc") || ends_with(col, "_acc_norm")) return V_PROB_OR_EMPTY; /* MC tasks */
    return V_TEXT;
}

static int is_hex(const char *s, size_t n) {
    if (strlen(s) != n) return 0;
    for (; *s; s++)
        if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f'))) return 0;
    return 1;
}

int m2d_results_is_name(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n >= 32 || !((s[0] >= 'a' && s[0] <= 'z') || (s[0] >= '0' && s[0] <= '9'))) return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || strchr("_.+-", *s))) return 0;
    return 1;
}

static int all_digits(const char *s) {
    if (!*s) return 0;
    for (; *s; s++)
        if (*s < '0' || *s > '9') return 0;
    return 1;
}

static int decimal(const char *s, double *v);

/* a fraction of experts removed, in [0, 1) (the ratio axis of MoE targets) */
static int is_ratio(const char *s) {
    double v;
    return strlen(s) <= 8 && decimal(s, &v) && v >= 0 && v < 1;
}

/* k, Nk, E, E/N, N (what an axis may say; the value against the teacher is the grid's business),
 * or (1-R)E: the experts an MoE target keeps at ratio R */
static int is_kexpr(const char *s) {
    if (!strcmp(s, "k") || !strcmp(s, "E")) return 1;
    size_t len = strlen(s);
    if (!strncmp(s, "(1-", 3) && len > 5 && len < 16 && !strcmp(s + len - 2, ")E")) {
        char r[16];
        snprintf(r, sizeof r, "%.*s", (int)(len - 5), s + 3);
        return is_ratio(r);
    }
    if (!strncmp(s, "E/", 2)) return all_digits(s + 2) && strlen(s) < 16;
    size_t n = strlen(s);
    if (n && s[n - 1] == 'k') n--;
    if (n == 0 || n >= 15) return 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9') return 0;
    return 1;
}

/* A plain decimal number (no hex floats, inf or nan spelled out); 1 and *v when it is one. */
static int decimal(const char *s, double *v) {
    if (!*s || strspn(s, "0123456789.eE+-") != strlen(s)) return 0;
    char *end;
    errno = 0;
    *v = strtod(s, &end);
    return *end == 0 && errno != ERANGE && isfinite(*v);
}

/* A count >= 1: readers take K, widths and window counts as int; a parameter total (WIDE) is an
 * int64 of at most 18 digits */
static const char *check_count(const char *s, int allow_empty, int wide) {
    static const char *const too_big_int = "is out of range (an integer in [1, 2147483647])",
                      *const too_big_wide = "is out of range (an integer of at most 18 digits)";
    if (!*s) return allow_empty ? NULL : "is empty (an integer >= 1 is required)";
    if (!all_digits(s)) return "is not an integer >= 1";
    if (strlen(s) > 18) return wide ? too_big_wide : too_big_int;
    long long v = strtoll(s, NULL, 10);
    if (v < 1) return "is not an integer >= 1";
    return wide || v <= INT_MAX ? NULL : too_big_int;
}

static const char *check_number(const char *s, double lo, double hi, const char *range) {
    double v;
    if (!decimal(s, &v)) return "is not a number";
    return v >= lo && v <= hi ? NULL : range;
}

static const char *check_printable(const char *s, size_t max) {
    if (strlen(s) >= max) return "is too long";
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f) return "holds a control character";
    return NULL;
}

/* Why field S of column kind K is invalid, or NULL (dedup_of's reference is checked apart). */
static const char *check_field(rule k, const char *s) {
    switch (k) {
    case V_TEXT: return check_printable(s, 1 << 16);
    case V_ID: return is_hex(s, 12) ? NULL : "is not a configuration id (12 lowercase hex digits)";
    case V_NAME: return m2d_results_is_name(s) ? NULL : "is not a plugin-style name ([a-z0-9][a-z0-9_.+-]*, < 32 characters)";
    case V_KEXPR: return is_kexpr(s) ? NULL : "is not a K expression (k, Nk, E, E/N, N or (1-R)E)";
    case V_TARGET: return !strcmp(s, "dense") || !strcmp(s, "moe") ? NULL : "is not dense or moe";
    case V_RATIO_OR_EMPTY: return !*s || is_ratio(s) ? NULL : "is not empty or a fraction in [0, 1)";
    case V_COUNT: return check_count(s, 0, 0);
    case V_COUNT_OR_EMPTY: return check_count(s, 1, 0);
    case V_TOTAL_OR_EMPTY: return check_count(s, 1, 1);
    case V_PARAMS: return check_printable(s, 128);
    case V_PPL: return !*s ? NULL : check_number(s, 1, 1e300, "is out of range (a perplexity is finite and >= 1)");
    case V_PROB_OR_EMPTY: return !*s ? NULL : check_number(s, 0, 1, "is outside [0, 1]");
    case V_SECONDS: return check_number(s, 0, 1e12, "is not a duration >= 0");
    case V_STATUS:
        if (!strcmp(s, "ok") || (!strncmp(s, "failed: ", 8) && s[8])) return check_printable(s, 1 << 16);
        return "is not a status (ok, or failed: REASON)";
    case V_DEDUP: return !*s || is_hex(s, 12) ? NULL : "is not empty or a configuration id";
    case V_HEX64_OR_EMPTY: return !*s || is_hex(s, 64) ? NULL : "is not empty or a 64-digit hex fingerprint";
    }
    return NULL;
}

/* "PATH:LINE:COL: field 'NAME': 'VALUE' WHY" (the value shortened and made printable) */
static int field_err(const m2d_results *r, const char *path, int row, int c, const char *why) {
    char shown[48];
    const char *v = r->rows[row][c];
    size_t n = 0;
    for (; v[n] && n < 40; n++) shown[n] = (unsigned char)v[n] < 0x20 || v[n] == 0x7f ? '?' : v[n];
    shown[n] = 0;
    int line = r->row_line ? r->row_line[row] : row + 1;
    int col = r->field_col ? r->field_col[(size_t)row * r->n_cols + c] : 1;
    return m2d_err("%s:%d:%d: field '%s': '%s%s' %s", path, line, col, r->cols[c], shown, v[n] ? "..." : "", why);
}

/* Open-addressed set of row indices keyed by their config_id (unique ids; dedup_of look-ups) and,
 * in a distillation ablation's sidecar, its loss and teacher_topk (AXES, -1 where absent). */
typedef struct {
    int *slot, cap;
    const m2d_results *r;
    int col, axes[2];
} id_set;

/* ROW's ablation cells equal those of row OTHER (no axes: always; a look-up by id, ROW < 0: too) */
static int same_axes(const id_set *s, int row, int other) {
    for (int a = 0; a < 2 && row >= 0; a++)
        if (s->axes[a] >= 0 && strcmp(s->r->rows[row][s->axes[a]], s->r->rows[other][s->axes[a]])) return 0;
    return 1;
}

static unsigned long hash_str(const char *s) {
    unsigned long h = 1469598103934665603ul;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ul;
    return h;
}

/* The row holding ID (and ADD_ROW's ablation cells), or -1; with ADD_ROW >= 0 that row is inserted
 * when it is new. */
static int id_set_find(id_set *s, const char *id, int add_row) {
    unsigned long i = hash_str(id) & (unsigned long)(s->cap - 1);
    for (; s->slot[i] >= 0; i = (i + 1) & (unsigned long)(s->cap - 1))
        if (!strcmp(s->r->rows[s->slot[i]][s->col], id) && same_axes(s, add_row, s->slot[i])) return s->slot[i];
    if (add_row >= 0) s->slot[i] = add_row;
    return -1;
}

/* Unique config ids (per loss and teacher_topk in an ablation's sidecar), then each dedup_of names
 * one of them (not its own row). */
static int check_ids(const m2d_results *r, const char *path, int id_col, int dd_col) {
    id_set s = {NULL, 64, r, id_col, {m2d_results_col(r, "loss"), m2d_results_col(r, "teacher_topk")}};
    while (s.cap < 2 * r->n_rows + 2) s.cap *= 2;
    s.slot = m2d_malloc((size_t)s.cap * sizeof *s.slot);
    for (int i = 0; i < s.cap; i++) s.slot[i] = -1;
    int rc = 0;
    for (int i = 0; i < r->n_rows && rc == 0; i++) {
        int first = id_set_find(&s, r->rows[i][id_col], i);
        if (first >= 0) {
            char why[64];
            snprintf(why, sizeof why, "is a duplicate (also on line %d)", r->row_line ? r->row_line[first] : first + 1);
            rc = field_err(r, path, i, id_col, why);
        }
    }
    for (int i = 0; dd_col >= 0 && i < r->n_rows && rc == 0; i++) {
        const char *d = r->rows[i][dd_col];
        int j = *d ? id_set_find(&s, d, -1) : i + 1;
        if (j < 0 || j == i) rc = field_err(r, path, i, dd_col, "names no other row of this file");
    }
    free(s.slot);
    return rc;
}

int m2d_results_validate(const m2d_results *r, const char *path) {
    rule *kinds = m2d_malloc((size_t)(r->n_cols + 1) * sizeof *kinds);
    for (int c = 0; c < r->n_cols; c++) kinds[c] = rule_of(r->cols[c]);
    int st = m2d_results_col(r, "status"), ppl = m2d_results_col(r, "ppl"), rc = 0;
    for (int i = 0; i < r->n_rows && rc == 0; i++) {
        for (int c = 0; c < r->n_cols && rc == 0; c++) {
            const char *why = check_field(kinds[c], r->rows[i][c]);
            if (why) rc = field_err(r, path, i, c, why);
        }
        if (rc == 0 && st >= 0 && ppl >= 0 && !strcmp(r->rows[i][st], "ok") && !r->rows[i][ppl][0])
            rc = field_err(r, path, i, ppl, "is empty, but the status is ok");
    }
    free(kinds);
    int id = m2d_results_col(r, "config_id");
    if (rc == 0 && id >= 0) rc = check_ids(r, path, id, m2d_results_col(r, "dedup_of"));
    return rc;
}

int m2d_results_read_checked(const char *path, m2d_results *r) {
    if (m2d_results_read(path, r)) return -1;
    if (m2d_results_validate(r, path) == 0) return 0;
    m2d_results_free(r);
    return -1;
}

/* ---- writing ---- */

static int needs_quotes(const char *s) {
    if (!*s) return 0;
    if (s[0] == ' ' || s[strlen(s) - 1] == ' ' || s[0] == '#') return 1;
    return strpbrk(s, ",\"\r\n") != NULL;
}

char *m2d_results_format_line(const char *const *fields, int n) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    for (int i = 0; i < n; i++) {
        if (i) fputc(',', f);
        const char *s = fields[i] ? fields[i] : "";
        /* rows must stay one line each (torn-line detection relies on it) */
        char *clean = m2d_strdup(s);
        for (char *p = clean; *p; p++)
            if (*p == '\n' || *p == '\r') *p = ' ';
        if (needs_quotes(clean)) csv_fwrite(f, clean, strlen(clean));
        else fputs(clean, f);
        free(clean);
    }
    fputc('\n', f);
    fclose(f);
    return buf;
}

static int write_all(int fd, const char *s, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, s, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        s += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Header line "# key=value" (a newline in a value would end the line: it becomes a space). */
static char *meta_line(const char *k, const char *v) {
    char *line = m2d_strfmt("# %s=%s\n", k, v);
    for (char *p = line; p[1]; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    return line;
}

/* Stream R into an atomic output, a line at a time (large rewrites never sit in memory twice). */
int m2d_results_write(const char *path, const m2d_results *r) {
    m2d_atomic_file f;
    if (m2d_atomic_open(&f, path)) return -1;
    for (int i = 0; i < r->n_meta && !f.failed; i++) {
        char *line = meta_line(r->meta_keys[i], r->meta_vals[i]);
        m2d_atomic_write(&f, line, strlen(line));
        free(line);
    }
    for (int i = -1; i < r->n_rows && !f.failed; i++) {
        char *line = m2d_results_format_line((const char *const *)(i < 0 ? r->cols : r->rows[i]), r->n_cols);
        m2d_atomic_write(&f, line, strlen(line));
        free(line);
    }
    return m2d_atomic_commit(&f);
}

static int create_file(const char *path, const char *const *cols, int n_cols, const char *const *meta, int n_meta) {
    m2d_results r = {0};
    for (int i = 0; i < n_meta; i++) add_meta(&r, meta[i], strlen(meta[i]));
    r.n_cols = n_cols;
    r.cols = (char **)cols;
    int rc = m2d_results_write(path, &r);
    r.n_cols = 0;
    r.cols = NULL;
    m2d_results_free(&r);
    return rc;
}

static const char *meta_value(const char *const *meta, int n_meta, const char *key) {
    size_t kl = strlen(key);
    for (int i = 0; i < n_meta; i++)
        if (strncmp(meta[i], key, kl) == 0 && meta[i][kl] == '=') return meta[i] + kl + 1;
    return NULL;
}

static int check_compatible(const char *path, const m2d_results *r, const char *const *cols, int n_cols,
                            const char *const *meta, int n_meta, const char *const *identity, int n_identity) {
    if (r->n_cols != n_cols)
        return m2d_err("%s: has %d columns, this run writes %d (another experiment's file? use another --out)",
                       path, r->n_cols, n_cols);
    for (int c = 0; c < n_cols; c++)
        if (strcmp(r->cols[c], cols[c]) != 0)
            return m2d_err("%s: column %d is '%s', this run writes '%s' (use another --out)", path, c + 1, r->cols[c],
                           cols[c]);
    for (int i = 0; i < n_identity; i++) {
        int later = identity[i][0] == '+';
        const char *key = identity[i] + later, *want = meta_value(meta, n_meta, key), *have = m2d_results_meta(r, key);
        if (later && !have) continue; /* a file from before the key was written: taken as it is */
        /* a key absent from both is a match (e.g. device, written only off the CPU) */
        if ((want || have) && (!want || !have || strcmp(want, have) != 0))
            return m2d_err("%s: header '%s' is '%s' but this run has '%s': refusing to mix results (use another "
                           "--out)", path, key, have ? have : "(absent)", want ? want : "(absent)");
    }
    return 0;
}

/* Cut the torn last line (TORN bytes) a crash left at the end of the file open on FD. */
static int drop_torn(int fd, const char *path, size_t torn, size_t read_len) {
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size != read_len)
        return m2d_err("%s: changed while being opened (is another process writing it?)", path);
    if (ftruncate(fd, st.st_size - (off_t)torn) != 0 || fsync(fd) != 0)
        return m2d_err("%s: cannot drop the torn last line: %s", path, strerror(errno));
    fprintf(stderr, "moe2dense: %s: dropped a torn last line (%zu bytes) left by an interrupted run\n", path, torn);
    return 0;
}

int m2d_results_open(const char *path, const char *const *cols, int n_cols, const char *const *meta, int n_meta,
                     const char *const *identity, int n_identity, m2d_results_writer *w, m2d_results *existing) {
    memset(w, 0, sizeof *w);
    w->fd = -1;
    if (existing) memset(existing, 0, sizeof *existing);
    if (m2d_check_inplace_path(path)) return -1;
    if (!m2d_file_exists(path) && create_file(path, cols, n_cols, meta, n_meta)) return -1;
    /* never through a link (checked above; O_NOFOLLOW closes the window since) */
    int fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return m2d_err("%s: cannot open for appending: %s", path, strerror(errno));
    m2d_results r;
    size_t len = 0;
    char *text = m2d_read_file(path, &len);
    int rc = text ? m2d_results_parse(path, text, len, &r) : -1;
    free(text);
    if (rc == 0 && (m2d_results_validate(&r, path) ||
                    check_compatible(path, &r, cols, n_cols, meta, n_meta, identity, n_identity) ||
                    (r.torn_bytes && drop_torn(fd, path, r.torn_bytes, len))))
        rc = -1;
    if (rc) {
        if (text) m2d_results_free(&r);
        close(fd);
        return -1;
    }
    w->fd = fd;
    w->path = m2d_strdup(path);
    w->n_cols = n_cols;
    if (existing) *existing = r;
    else m2d_results_free(&r);
    return 0;
}

int m2d_results_append(m2d_results_writer *w, const char *const *fields) {
    char *line = m2d_results_format_line(fields, w->n_cols);
    if (!line) return m2d_err("%s: out of memory formatting a row", w->path);
    /* one write() of the whole line: O_APPEND makes it land at the end in one piece; a partial
     * write (disk full) is cut back off, so the file never holds half a row before the next one */
    off_t end = lseek(w->fd, 0, SEEK_END);
    int rc = write_all(w->fd, line, strlen(line));
    free(line);
    if (rc == 0 && fsync(w->fd) == 0) return 0;
    int err = errno;
    if (end >= 0 && ftruncate(w->fd, end) == 0) (void)fsync(w->fd);
    return m2d_err("%s: cannot append a row: %s", w->path, strerror(err));
}

void m2d_results_close(m2d_results_writer *w) {
    if (w->path && w->fd >= 0) close(w->fd);
    free(w->path);
    memset(w, 0, sizeof *w);
    w->fd = -1;
}
