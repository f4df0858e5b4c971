/* analyze_csv — validated reading of `moe2dense analyze --csv` output (see analyze_csv.h). */
#include "io/analyze_csv.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "io/csv.h"
#include "io/results.h"

static const char *const HEADER[] = {"layer", "metric", "criterion", "other", "value"};
/* What the criterion and other fields of a metric hold. */
typedef enum { F_EMPTY, F_NAME, F_INDEX, F_SPEC } field_kind;

/* Every metric `analyze --csv` writes: its fields, its value range, whether the value may be
 * empty (n/a); in m2d_an_metric order. */
static const struct {
    const char *name;
    field_kind criterion, other;
    double lo, hi;
    int hi_is_K, may_be_empty;
} METRICS[] = {
    {"overlap", F_NAME, F_NAME, 0, 1, 0, 0},
    {"erank", F_NAME, F_EMPTY, 0, INFINITY, 1, 0},
    {"erank_w", F_NAME, F_EMPTY, 0, INFINITY, 1, 0},
    {"mu_S", F_NAME, F_EMPTY, 0, 1, 0, 0},
    {"mu", F_EMPTY, F_EMPTY, 0, 1, 0, 0},
    {"thm33_gap", F_EMPTY, F_EMPTY, 0, INFINITY, 0, 1},
    {"damage_overlap_25", F_EMPTY, F_EMPTY, 0, 1, 0, 0},
    {"damage_overlap_50", F_EMPTY, F_EMPTY, 0, 1, 0, 0},
    {"calib_overlap_25", F_SPEC, F_EMPTY, 0, 1, 0, 1},
    {"calib_overlap_50", F_SPEC, F_EMPTY, 0, 1, 0, 1},
    {"gini", F_EMPTY, F_EMPTY, 0, 1, 0, 0},
    {"lorenz", F_INDEX, F_EMPTY, 0, 1, 0, 0},
    {"pearson_mean", F_EMPTY, F_EMPTY, -1, 1, 0, 0},
    {"pearson_max", F_EMPTY, F_EMPTY, -1, 1, 0, 0},
    {"pearson", F_INDEX, F_INDEX, -1, 1, 0, 0},
};
_Static_assert(sizeof METRICS / sizeof METRICS[0] == M2D_AN_METRIC_COUNT, "one entry per m2d_an_metric");

typedef struct {
    const char *name;
    m2d_an_csv *a;
    int header_done, cap;
} an_reader;

static int cell_err(const an_reader *rd, int line, int col, int field, const char *value, const char *why) {
    char shown[48];
    size_t n = 0;
    for (; value[n] && n < 40; n++) shown[n] = (unsigned char)value[n] < 0x20 ? '?' : value[n];
    shown[n] = 0;
    return m2d_err("%s:%d:%d: field '%s': '%s%s' %s", rd->name, line, col, HEADER[field], shown, value[n] ? "..." : "",
                   why);
}

static int check_header(const an_reader *rd, char **f, const int *cols, int n, int line) {
    if (n != 5) return m2d_err("%s:%d:1: header has %d fields, expected layer,metric,criterion,other,value", rd->name, line, n);
    for (int i = 0; i < 5; i++)
        if (strcmp(f[i], HEADER[i]))
            return m2d_err("%s:%d:%d: header field %d is '%.40s', expected '%s'", rd->name, line, cols[i], i + 1, f[i],
                           HEADER[i]);
    return 0;
}

static int parse_layer(const char *s, int *layer) {
    if (!strcmp(s, "mean")) return *layer = -1, 0;
    if (!*s || strspn(s, "0123456789") != strlen(s) || strlen(s) > 7) return -1;
    *layer = atoi(s);
    return 0;
}

static int parse_value(const char *s, double *v) {
    if (!*s || strspn(s, "0123456789.eE+-") != strlen(s)) return -1;
    char *end;
    errno = 0;
    *v = strtod(s, &end);
    return *end || errno == ERANGE || !isfinite(*v) ? -1 : 0;
}

static int is_index(const char *s) { return *s && strlen(s) <= 7 && strspn(s, "0123456789") == strlen(s); }

/* "S(b;a;c)" with small non-negative integers (paper 004's S(b,a,c) variants) */
static int is_spec(const char *s) {
    int b, a, c, n = 0;
    return strlen(s) < 32 && sscanf(s, "S(%3d;%3d;%3d)%n", &b, &a, &c, &n) == 3 && n == (int)strlen(s) && b >= 0 &&
           a >= 0 && c >= 0;
}

static const char *field_problem(field_kind k, const char *s) {
    switch (k) {
    case F_EMPTY: return *s ? "must be empty for this metric" : NULL;
    case F_NAME: return m2d_results_is_name(s) ? NULL : "is not a criterion name";
    case F_INDEX: return is_index(s) ? NULL : "is not an expert index";
    case F_SPEC: return is_spec(s) ? NULL : "is not S(b;a;c)";
    }
    return NULL;
}

static int check_value(const an_reader *rd, int line, int col, const char *s, int m, double *v) {
    if (!*s && METRICS[m].may_be_empty) return *v = NAN, 0; /* n/a */
    if (parse_value(s, v)) return cell_err(rd, line, col, 4, s, "is not a number");
    if (METRICS[m].hi_is_K) { /* an effective rank */
        if (*v < 0) return cell_err(rd, line, col, 4, s, "is negative (an effective rank is >= 0)");
        if (rd->a->K && *v > rd->a->K + 1e-6) return cell_err(rd, line, col, 4, s, "exceeds K (an effective rank is at most K)");
        return 0;
    }
    if (*v < METRICS[m].lo - 1e-9 || *v > METRICS[m].hi + 1e-9) {
        char why[64];
        snprintf(why, sizeof why, "is outside [%g, %g]", METRICS[m].lo, METRICS[m].hi);
        return cell_err(rd, line, col, 4, s, why);
    }
    return 0;
}

static int check_row(const an_reader *rd, char **f, const int *cols, int line, m2d_an_row *row) {
    if (parse_layer(f[0], &row->layer)) return cell_err(rd, line, cols[0], 0, f[0], "is not 'mean' or a layer index");
    int m = -1;
    for (int i = 0; i < M2D_AN_METRIC_COUNT; i++)
        if (!strcmp(f[1], METRICS[i].name)) m = i;
    if (m < 0) return cell_err(rd, line, cols[1], 1, f[1], "is not a metric analyze writes");
    row->metric = (m2d_an_metric)m;
    const char *why = field_problem(METRICS[m].criterion, f[2]);
    if (why) return cell_err(rd, line, cols[2], 2, f[2], why);
    if ((why = field_problem(METRICS[m].other, f[3])))
        return cell_err(rd, line, cols[3], 3, f[3], m == M2D_AN_OVERLAP ? "is not a criterion name (overlap compares two)" : why);
    if (check_value(rd, line, cols[4], f[4], m, &row->value)) return -1;
    snprintf(row->criterion, sizeof row->criterion, "%s", f[2]);
    snprintf(row->other, sizeof row->other, "%s", f[3]);
    return 0;
}

static int on_record(void *user, char **f, const int *cols, int n, int line) {
    an_reader *rd = user;
    m2d_an_csv *a = rd->a;
    int rc;
    if (!rd->header_done) {
        rc = check_header(rd, f, cols, n, line);
        rd->header_done = 1;
    } else if (n != 5) {
        rc = m2d_err("%s:%d:1: the row has %d fields, the header has 5", rd->name, line, n);
    } else {
        if (a->n == rd->cap) a->rows = m2d_realloc(a->rows, (size_t)(rd->cap = rd->cap ? 2 * rd->cap : 64) * sizeof *a->rows);
        rc = check_row(rd, f, cols, line, &a->rows[a->n]);
        if (rc == 0) a->n++;
    }
    for (int i = 0; i < n; i++) free(f[i]);
    return rc;
}

/* "# K=N" (the only comment with a meaning); other comment lines are skipped. */
static int comment_line(const char *name, const char *s, size_t n, int line, m2d_an_csv *a) {
    if (n < 4 || strncmp(s, "# K=", 4)) return 0;
    if (a->K) return m2d_err("%s:%d:3: field 'K': given twice", name, line);
    size_t d = 4;
    while (d < n && s[d] >= '0' && s[d] <= '9' && d < 12) d++;
    char digits[16] = ""; /* S is not NUL-terminated: strtol must not read past N */
    memcpy(digits, s + 4, d - 4);
    long K = d > 4 ? strtol(digits, NULL, 10) : 0;
    if (d != n || K < 1 || K > 65536)
        return m2d_err("%s:%d:5: field 'K': '%.*s' is not an integer in [1, 65536]", name, line,
                       (int)(n - 4 > 40 ? 40 : n - 4), s + 4);
    a->K = (int)K;
    return 0;
}

int m2d_an_csv_parse(const char *name, const char *text, size_t len, m2d_an_csv *a) {
    memset(a, 0, sizeof *a);
    size_t pos = 0;
    int line = 1, rc = 0;
    while (rc == 0 && pos < len && text[pos] == '#') {
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - text) : len, n = end - pos;
        if (n && text[end - 1] == '\r') n--;
        rc = comment_line(name, text + pos, n, line++, a);
        pos = end + (nl ? 1 : 0);
    }
    an_reader rd = {name, a, 0, 0};
    if (rc == 0) rc = m2d_csv_parse(name, text + pos, len - pos, line, on_record, &rd);
    if (rc == 0 && !rd.header_done) rc = m2d_err("%s: no header line (layer,metric,criterion,other,value)", name);
    if (rc) m2d_an_csv_free(a);
    return rc;
}

int m2d_an_csv_read(const char *path, m2d_an_csv *a) {
    memset(a, 0, sizeof *a);
    size_t len;
    char *text = m2d_read_file(path, &len);
    if (!text) return -1;
    int rc = m2d_an_csv_parse(path, text, len, a);
    free(text);
    return rc;
}

void m2d_an_csv_free(m2d_an_csv *a) {
    free(a->rows);
    memset(a, 0, sizeof *a);
}
