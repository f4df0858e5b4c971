#include "io/results.h"

#include <csv.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/util.h"

/* ---- reading ---- */

typedef struct {
    m2d_results *r;
    char **fields;
    int n, cap;
    int line;        /* 1-based line of the row being parsed */
    int header_done;
    int bad_line, bad_count;
} reader;

static void on_field(void *s, size_t len, void *data) {
    reader *rd = data;
    if (rd->n == rd->cap) {
        rd->cap = rd->cap ? 2 * rd->cap : 32;
        rd->fields = m2d_realloc(rd->fields, (size_t)rd->cap * sizeof *rd->fields);
    }
    char *f = m2d_malloc(len + 1);
    memcpy(f, s, len);
    f[len] = 0;
    rd->fields[rd->n++] = f;
}

static void on_row(int c, void *data) {
    (void)c;
    reader *rd = data;
    m2d_results *r = rd->r;
    if (!rd->header_done) {
        r->cols = rd->fields;
        r->n_cols = rd->n;
        rd->header_done = 1;
    } else if (rd->n != r->n_cols) {
        if (!rd->bad_line) {
            rd->bad_line = rd->line;
            rd->bad_count = rd->n;
        }
        for (int i = 0; i < rd->n; i++) free(rd->fields[i]);
        free(rd->fields);
    } else {
        r->rows = m2d_realloc(r->rows, (size_t)(r->n_rows + 1) * sizeof *r->rows);
        r->rows[r->n_rows++] = rd->fields;
    }
    rd->fields = NULL;
    rd->n = rd->cap = 0;
    rd->line++;
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
        add_meta(r, s, n);
        pos = end + 1;
        line++;
    }
    if (pos == complete) return m2d_err("%s: no column header row (not a moe2dense results file?)", path);
    struct csv_parser p;
    if (csv_init(&p, CSV_STRICT | CSV_APPEND_NULL) != 0) return m2d_err("%s: csv_init failed", path);
    reader rd = {.r = r, .line = line};
    size_t got = csv_parse(&p, text + pos, complete - pos, on_field, on_row, &rd);
    int rc = 0;
    if (got != complete - pos) rc = m2d_err("%s: malformed CSV near line %d: %s", path, rd.line,
                                            csv_strerror(csv_error(&p)));
    else if (csv_fini(&p, on_field, on_row, &rd) != 0) rc = m2d_err("%s: malformed CSV at the end", path);
    csv_free(&p);
    for (int i = 0; i < rd.n; i++) free(rd.fields[i]);
    free(rd.fields);
    if (rc == 0 && rd.bad_line)
        rc = m2d_err("%s: line %d: %d fields, the header has %d", path, rd.bad_line, rd.bad_count, r->n_cols);
    if (rc == 0 && !rd.header_done) rc = m2d_err("%s: no column header row", path);
    return rc;
}

int m2d_results_read(const char *path, m2d_results *r) {
    size_t len;
    char *text = m2d_read_file(path, &len);
    memset(r, 0, sizeof *r);
    if (!text) return -1;
    int rc = parse_text(path, text, len, r);
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
    memset(r, 0, sizeof *r);
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

const char *m2d_results_meta(const m2d_results *r, const char *key) {
    for (int i = 0; i < r->n_meta; i++)
        if (strcmp(r->meta_keys[i], key) == 0) return r->meta_vals[i];
    return NULL;
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

static char *format_file(const m2d_results *r) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    for (int i = 0; i < r->n_meta; i++) fprintf(f, "# %s=%s\n", r->meta_keys[i], r->meta_vals[i]);
    char *hdr = m2d_results_format_line((const char *const *)r->cols, r->n_cols);
    fputs(hdr, f);
    free(hdr);
    for (int i = 0; i < r->n_rows; i++) {
        char *line = m2d_results_format_line((const char *const *)r->rows[i], r->n_cols);
        fputs(line, f);
        free(line);
    }
    fclose(f);
    return buf;
}

int m2d_results_write(const char *path, const m2d_results *r) {
    char *text = format_file(r);
    int rc = m2d_write_file_atomic(path, text, strlen(text));
    free(text);
    return rc;
}

static int create_file(const char *path, const char *const *cols, int n_cols, const char *const *meta, int n_meta) {
    m2d_results r = {0};
    for (int i = 0; i < n_meta; i++) add_meta(&r, meta[i], strlen(meta[i]));
    r.n_cols = n_cols;
    r.cols = (char **)cols;
    char *text = format_file(&r);
    r.n_cols = 0;
    r.cols = NULL;
    m2d_results_free(&r);
    int rc = m2d_write_file_atomic(path, text, strlen(text));
    free(text);
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
        const char *want = meta_value(meta, n_meta, identity[i]);
        const char *have = m2d_results_meta(r, identity[i]);
        if (want && (!have || strcmp(want, have) != 0))
            return m2d_err("%s: header '%s' is '%s' but this run has '%s': refusing to mix results (use another "
                           "--out)", path, identity[i], have ? have : "(absent)", want);
    }
    return 0;
}

int m2d_results_open(const char *path, const char *const *cols, int n_cols, const char *const *meta, int n_meta,
                     const char *const *identity, int n_identity, m2d_results_writer *w, m2d_results *existing) {
    memset(w, 0, sizeof *w);
    if (existing) memset(existing, 0, sizeof *existing);
    if (!m2d_file_exists(path) && create_file(path, cols, n_cols, meta, n_meta)) return -1;
    m2d_results r;
    if (m2d_results_read(path, &r)) return -1;
    if (check_compatible(path, &r, cols, n_cols, meta, n_meta, identity, n_identity)) {
        m2d_results_free(&r);
        return -1;
    }
    int fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
    if (fd < 0) {
        m2d_results_free(&r);
        return m2d_err("%s: cannot open for appending: %s", path, strerror(errno));
    }
    if (r.torn_bytes) {
        /* drop the torn row a crash left behind: the file then ends at the last complete row */
        off_t end = lseek(fd, 0, SEEK_END);
        if (end < 0 || ftruncate(fd, end - (off_t)r.torn_bytes) != 0 || fsync(fd) != 0) {
            close(fd);
            m2d_results_free(&r);
            return m2d_err("%s: cannot drop the torn last line: %s", path, strerror(errno));
        }
        fprintf(stderr, "moe2dense: %s: dropped a torn last line (%zu bytes) left by an interrupted run\n", path,
                r.torn_bytes);
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
    /* one write() of the whole line: O_APPEND makes it land at the end in one piece */
    int rc = write_all(w->fd, line, strlen(line));
    free(line);
    if (rc != 0 || fsync(w->fd) != 0) return m2d_err("%s: cannot append a row: %s", w->path, strerror(errno));
    return 0;
}

void m2d_results_close(m2d_results_writer *w) {
    if (w->fd > 0) close(w->fd);
    free(w->path);
    memset(w, 0, sizeof *w);
}
