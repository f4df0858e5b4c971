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
/* what the criterion / other field of a metric holds */
typedef enum { F_EMPTY, F_NAME, F_NAME_OR_EMPTY, F_INDEX, F_SVAR } field_kind;
/* the range of a metric's value */
typedef enum { R_UNIT, R_CORR, R_ERANK, R_NONNEG } range_kind;

static const struct {
    const char *name;
    field_kind crit, other;
    range_kind range;
    int na_ok; /* an empty value (n/a) is allowed */
} METRICS[] = {
    [M2D_AN_OVERLAP] = {"overlap", F_NAME, F_NAME, R_UNIT, 0},
    [M2D_AN_ERANK] = {"erank", F_NAME, F_EMPTY, R_ERANK, 0},
    [M2D_AN_ERANK_W] = {"erank_w", F_NAME, F_EMPTY, R_ERANK, 0},
    [M2D_AN_MU] = {"mu", F_NAME_OR_EMPTY, F_EMPTY, R_UNIT, 0},
    [M2D_AN_MU_S] = {"mu_S", F_NAME, F_EMPTY, R_UNIT, 0},
    [M2D_AN_THM33_GAP] = {"thm33_gap", F_EMPTY, F_EMPTY, R_NONNEG, 1},
    [M2D_AN_DAMAGE_25] = {"damage_overlap_25", F_EMPTY, F_EMPTY, R_UNIT, 0},
    [M2D_AN_DAMAGE_50] = {"damage_overlap_50", F_EMPTY, F_EMPTY, R_UNIT, 0},
    [M2D_AN_CALIB_25] = {"calib_overlap_25", F_SVAR, F_EMPTY, R_UNIT, 1},
    [M2D_AN_CALIB_50] = {"calib_overlap_50", F_SVAR, F_EMPTY, R_UNIT, 1},
    [M2D_AN_GINI] = {"gini", F_EMPTY, F_EMPTY, R_UNIT, 0},
    [M2D_AN_PEARSON_MEAN] = {"pearson_mean", F_EMPTY, F_EMPTY, R_CORR, 0},
    [M2D_AN_PEARSON_MAX] = {"pearson_max", F_EMPTY, F_EMPTY, R_CORR, 0},
    [M2D_AN_LORENZ] = {"lorenz", F_INDEX, F_EMPTY, R_UNIT, 0},
    [M2D_AN_PEARSON] = {"pearson", F_INDEX, F_INDEX, R_CORR, 0},
};
#define N_METRICS ((int)(sizeof METRICS / sizeof *METRICS))

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

/* The range of a value of metric M (K: the selection size, 0 when unknown). */
static const char *value_range(m2d_an_metric m, double v, int K) {
    switch (METRICS[m].range) {
    case R_UNIT: return v >= 0 && v <= 1 + 1e-9 ? NULL : "is outside [0, 1]";
    case R_CORR: return v >= -1 - 1e-9 && v <= 1 + 1e-9 ? NULL : "is outside [-1, 1] (a correlation)";
    case R_NONNEG: return v >= 0 ? NULL : "is negative";
    case R_ERANK: break;
    }
    if (v < 0) return "is negative (an effective rank is >= 0)";
    return K && v > K + 1e-6 ? "exceeds K (an effective rank is at most K)" : NULL;
}

/* an expert index or count: up to 6 digits -> *v */
static int parse_index(const char *s, int *v) {
    if (!*s || strspn(s, "0123456789") != strlen(s) || strlen(s) > 6) return -1;
    *v = atoi(s);
    return 0;
}

/* S(b;a;c) of paper 004's family: b in {0,1}, a and c in {0,1,2} */
static int is_svar(const char *s) {
    return strlen(s) == 8 && s[0] == 'S' && s[1] == '(' && (s[2] == '0' || s[2] == '1') && s[3] == ';' &&
           s[4] >= '0' && s[4] <= '2' && s[5] == ';' && s[6] >= '0' && s[6] <= '2' && s[7] == ')';
}

/* why field S (of kind K) is invalid, or NULL; *index for F_INDEX */
static const char *check_field(field_kind k, const char *s, int *index) {
    switch (k) {
    case F_EMPTY: return s[0] ? "must be empty for this metric" : NULL;
    case F_NAME: return m2d_results_is_name(s) ? NULL : "is not a criterion name";
    case F_NAME_OR_EMPTY: return !s[0] || m2d_results_is_name(s) ? NULL : "is not empty or a criterion name";
    case F_INDEX: return parse_index(s, index) ? "is not an expert index (up to 6 digits)" : NULL;
    case F_SVAR: return is_svar(s) ? NULL : "is not S(b;a;c) (b 0-1, a and c 0-2)";
    }
    return NULL;
}

static int check_row(const an_reader *rd, char **f, const int *cols, int line, m2d_an_row *row) {
    if (parse_layer(f[0], &row->layer)) return cell_err(rd, line, cols[0], 0, f[0], "is not 'mean' or a layer index");
    int m = -1;
    for (int i = 0; i < N_METRICS; i++)
        if (!strcmp(f[1], METRICS[i].name)) m = i;
    if (m < 0) return cell_err(rd, line, cols[1], 1, f[1], "is not a metric of analyze --csv (moe2dense help analyze)");
    row->metric = (m2d_an_metric)m;
    row->i = row->j = -1;
    const char *why = check_field(METRICS[m].crit, f[2], &row->i);
    if (why && m == M2D_AN_OVERLAP) why = "is not a criterion name";
    if (why) return cell_err(rd, line, cols[2], 2, f[2], why);
    why = check_field(METRICS[m].other, f[3], &row->j);
    if (why && m == M2D_AN_OVERLAP) why = "is not a criterion name (overlap compares two)";
    if (why) return cell_err(rd, line, cols[3], 3, f[3], why);
    if (!f[4][0] && METRICS[m].na_ok) row->value = NAN;
    else if (parse_value(f[4], &row->value)) return cell_err(rd, line, cols[4], 4, f[4], "is not a number");
    why = isnan(row->value) ? NULL : value_range(row->metric, row->value, rd->a->K);
    if (why) return cell_err(rd, line, cols[4], 4, f[4], why);
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
