/* csv — strict RFC 4180 reading with positions (see csv.h). */
#include "io/csv.h"

#include <stdlib.h>
#include <string.h>

#include "base/util.h"

typedef struct {
    const char *name, *text;
    size_t len, pos;
    int line, col;          /* of text[pos] */
    char **fields;
    int *cols;
    int n, cap;
    char *buf;              /* the field being read */
    size_t blen, bcap;
} scanner;

static int fail(const scanner *s, const char *what) {
    return m2d_err("%s:%d:%d: malformed CSV: %s", s->name, s->line, s->col, what);
}

static void advance(scanner *s) {
    if (s->text[s->pos] == '\n') {
        s->line++;
        s->col = 1;
    } else {
        s->col++;
    }
    s->pos++;
}

static void buf_put(scanner *s, char c) {
    if (s->blen + 1 >= s->bcap) s->buf = m2d_realloc(s->buf, s->bcap = s->bcap ? 2 * s->bcap : 64);
    s->buf[s->blen++] = c;
}

static void end_field(scanner *s, int col) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 32;
        s->fields = m2d_realloc(s->fields, (size_t)s->cap * sizeof *s->fields);
        s->cols = m2d_realloc(s->cols, (size_t)s->cap * sizeof *s->cols);
    }
    char *f = m2d_malloc(s->blen + 1);
    if (s->blen) memcpy(f, s->buf, s->blen); /* buf is NULL before the first character */
    f[s->blen] = 0;
    s->fields[s->n] = f;
    s->cols[s->n++] = col;
    s->blen = 0;
}

static int at_record_end(const scanner *s) {
    if (s->pos >= s->len || s->text[s->pos] == '\n') return 1;
    return s->text[s->pos] == '\r' && (s->pos + 1 >= s->len || s->text[s->pos + 1] == '\n');
}

static int is_blank(char c) { return c == ' ' || c == '\t'; }

/* A quoted field, from its opening quote to just after its closing quote. */
static int quoted_field(scanner *s) {
    int line = s->line, col = s->col;
    advance(s);
    for (;;) {
        if (s->pos >= s->len)
            return m2d_err("%s:%d:%d: malformed CSV: quoted field never closed", s->name, line, col);
        char c = s->text[s->pos];
        if (c == 0) return fail(s, "NUL byte");
        if (c == '"') {
            if (s->pos + 1 < s->len && s->text[s->pos + 1] == '"') {
                buf_put(s, '"');
                advance(s);
                advance(s);
                continue;
            }
            advance(s);
            break;
        }
        buf_put(s, c);
        advance(s);
    }
    while (s->pos < s->len && is_blank(s->text[s->pos])) advance(s);
    if (!at_record_end(s) && s->text[s->pos] != ',') return fail(s, "text after a closing quote");
    return 0;
}

/* An unquoted field up to the next ',' or record end; surrounding blanks dropped. */
static int plain_field(scanner *s) {
    while (!at_record_end(s) && s->text[s->pos] != ',') {
        char c = s->text[s->pos];
        if (c == '"') return fail(s, "quote inside an unquoted field (quote the whole field)");
        if (c == 0) return fail(s, "NUL byte");
        buf_put(s, c);
        advance(s);
    }
    while (s->blen && is_blank(s->buf[s->blen - 1])) s->blen--;
    return 0;
}

/* One record: fields until the end of the line (which is consumed). */
static int record(scanner *s, int *start_line) {
    *start_line = s->line;
    for (;;) {
        while (s->pos < s->len && is_blank(s->text[s->pos])) advance(s);
        int col = s->col;
        int rc = s->pos < s->len && s->text[s->pos] == '"' ? quoted_field(s) : plain_field(s);
        if (rc) return -1;
        end_field(s, col);
        if (s->pos < s->len && s->text[s->pos] == ',') {
            advance(s);
            continue;
        }
        if (s->pos < s->len && s->text[s->pos] == '\r') advance(s);
        if (s->pos < s->len) advance(s); /* the '\n' */
        return 0;
    }
}

int m2d_csv_parse(const char *name, const char *text, size_t len, int first_line, m2d_csv_record_fn fn,
                  void *user) {
    scanner s = {.name = name, .text = text, .len = len, .line = first_line, .col = 1};
    int rc = 0;
    while (rc == 0 && s.pos < s.len) {
        if (at_record_end(&s)) { /* an empty line is no record ("\r" may be the last byte) */
            if (s.text[s.pos] == '\r') advance(&s);
            if (s.pos < s.len) advance(&s);
            continue;
        }
        int line;
        rc = record(&s, &line);
        if (rc == 0) {
            int n = s.n;
            s.n = 0; /* ownership of the strings passes to the callback */
            rc = fn(user, s.fields, s.cols, n, line);
        }
    }
    for (int i = 0; i < s.n; i++) free(s.fields[i]);
    free(s.fields);
    free(s.cols);
    free(s.buf);
    return rc;
}
