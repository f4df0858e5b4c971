#include "io/toml.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/util.h"

enum {
    F_EXPLICIT = 1, /* table defined by a [header] */
    F_IMPLICIT = 2, /* table created as an intermediate of a header */
    F_DOTTED = 4,   /* table created by a dotted key */
    F_INLINE = 8,   /* inline table / static array: frozen */
    F_AOT = 16,     /* array of tables */
};

#define MAX_DEPTH 64
#define MAX_KEY_PARTS 32

typedef struct {
    const char *s, *path;
    size_t len, pos, line_start;
    int line, depth;
} parser;

static int perr(parser *p, const char *fmt, const char *arg) {
    char msg[256];
    snprintf(msg, sizeof msg, fmt, arg ? arg : "");
    return m2d_err("%s:%d:%d: %s", p->path, p->line, (int)(p->pos - p->line_start) + 1, msg);
}

static int peek(const parser *p) { return p->pos < p->len ? (unsigned char)p->s[p->pos] : -1; }
static int peek_at(const parser *p, size_t off) {
    return p->pos + off < p->len ? (unsigned char)p->s[p->pos + off] : -1;
}

static m2d_toml *node_new(m2d_toml_type type, const parser *p) {
    m2d_toml *t = m2d_calloc(1, sizeof *t);
    t->type = type;
    if (p) {
        t->line = p->line;
        t->col = (int)(p->pos - p->line_start) + 1;
    }
    return t;
}

void m2d_toml_free(m2d_toml *t) {
    if (!t) return;
    for (int i = 0; i < t->n; i++) {
        m2d_toml_free(t->items[i]);
        if (t->keys) free(t->keys[i]);
    }
    free(t->items);
    free(t->keys);
    free(t->str);
    free(t);
}

static void node_append(m2d_toml *t, const char *key, m2d_toml *item) {
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 4;
        t->items = m2d_realloc(t->items, (size_t)t->cap * sizeof *t->items);
        if (t->type == M2D_TOML_TABLE) t->keys = m2d_realloc(t->keys, (size_t)t->cap * sizeof *t->keys);
    }
    if (t->type == M2D_TOML_TABLE) t->keys[t->n] = m2d_strdup(key);
    t->items[t->n++] = item;
}

const m2d_toml *m2d_toml_get(const m2d_toml *t, const char *key) {
    if (!t || t->type != M2D_TOML_TABLE) return NULL;
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->keys[i], key) == 0) return t->items[i];
    return NULL;
}

static m2d_toml *get_mut(m2d_toml *t, const char *key) { return (m2d_toml *)m2d_toml_get(t, key); }

const m2d_toml *m2d_toml_path(const m2d_toml *t, const char *dotted) {
    char *copy = m2d_strdup(dotted), *save = NULL;
    const m2d_toml *cur = t;
    for (char *part = strtok_r(copy, ".", &save); part && cur; part = strtok_r(NULL, ".", &save))
        cur = m2d_toml_get(cur, part);
    free(copy);
    return cur;
}

const char *m2d_toml_type_name(m2d_toml_type t) {
    static const char *names[] = {"string", "integer", "float", "boolean", "array", "table"};
    return (unsigned)t < M2D_ARRAY_LEN(names) ? names[t] : "?";
}

/* ---- lexing helpers ---- */

static void skip_ws(parser *p) {
    while (peek(p) == ' ' || peek(p) == '\t') p->pos++;
}

/* A comment runs to the end of the line; control characters other than tab are invalid. */
static int skip_comment(parser *p) {
    if (peek(p) != '#') return 0;
    while (p->pos < p->len && p->s[p->pos] != '\n') {
        unsigned char c = (unsigned char)p->s[p->pos];
        if ((c < 0x20 && c != '\t' && !(c == '\r' && peek_at(p, 1) == '\n')) || c == 0x7f)
            return perr(p, "control character in comment", NULL);
        p->pos++;
    }
    return 0;
}

/* Consume one newline ("\n" or "\r\n"); returns 1 if one was consumed, -1 on a lone '\r'. */
static int eat_newline(parser *p) {
    if (peek(p) == '\n') {
        p->pos++;
    } else if (peek(p) == '\r') {
        if (peek_at(p, 1) != '\n') return perr(p, "carriage return without newline", NULL);
        p->pos += 2;
    } else {
        return 0;
    }
    p->line++;
    p->line_start = p->pos;
    return 1;
}

/* Whitespace, comments and newlines (inside arrays). */
static int skip_ws_nl(parser *p) {
    for (;;) {
        skip_ws(p);
        if (skip_comment(p)) return -1;
        int r = eat_newline(p);
        if (r < 0) return -1;
        if (r == 0) return 0;
    }
}

static void buf_put(char **b, size_t *n, size_t *cap, const char *src, size_t k) {
    if (*n + k + 1 > *cap) {
        while (*n + k + 1 > *cap) *cap = *cap ? 2 * *cap : 32;
        *b = m2d_realloc(*b, *cap);
    }
    memcpy(*b + *n, src, k);
    *n += k;
    (*b)[*n] = 0;
}

static int hex_value(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int parse_unicode_escape(parser *p, int digits, char **b, size_t *n, size_t *cap) {
    int32_t cp = 0;
    for (int i = 0; i < digits; i++) {
        int h = hex_value(peek(p));
        if (h < 0) return perr(p, "invalid unicode escape (need %s hex digits)", digits == 4 ? "4" : "8");
        cp = cp * 16 + h;
        p->pos++;
    }
    if (!utf8proc_codepoint_valid(cp)) return perr(p, "unicode escape is not a scalar value", NULL);
    /* values and keys are C strings: a NUL would cut them short */
    if (cp == 0) return perr(p, "unicode escape of NUL: NUL is not supported", NULL);
    uint8_t enc[4];
    utf8proc_ssize_t k = utf8proc_encode_char(cp, enc);
    buf_put(b, n, cap, (const char *)enc, (size_t)k);
    return 0;
}

/* Basic ("...") or literal ('...') single-line string; p->pos is on the opening quote. */
static int parse_string(parser *p, char **out) {
    char q = p->s[p->pos];
    if (peek_at(p, 1) == q && peek_at(p, 2) == q)
        return perr(p, "multi-line strings are not supported", NULL);
    p->pos++;
    char *b = NULL;
    size_t n = 0, cap = 0;
    buf_put(&b, &n, &cap, "", 0);
    for (;;) {
        int c = peek(p);
        if (c < 0 || c == '\n' || c == '\r') {
            free(b);
            return perr(p, "unterminated string", NULL);
        }
        if (c == q) {
            p->pos++;
            break;
        }
        if ((c < 0x20 && c != '\t') || c == 0x7f) {
            free(b);
            return perr(p, "control character in string", NULL);
        }
        if (c == '\\' && q == '"') {
            p->pos++;
            int e = peek(p);
            const char *rep = NULL;
            switch (e) {
            case 'b': rep = "\b"; break;
            case 't': rep = "\t"; break;
            case 'n': rep = "\n"; break;
            case 'f': rep = "\f"; break;
            case 'r': rep = "\r"; break;
            case '"': rep = "\""; break;
            case '\\': rep = "\\"; break;
            case 'u': case 'U':
                p->pos++;
                if (parse_unicode_escape(p, e == 'u' ? 4 : 8, &b, &n, &cap)) {
                    free(b);
                    return -1;
                }
                continue;
            default:
                free(b);
                return perr(p, "invalid escape sequence in string", NULL);
            }
            buf_put(&b, &n, &cap, rep, 1);
            p->pos++;
            continue;
        }
        buf_put(&b, &n, &cap, p->s + p->pos, 1);
        p->pos++;
    }
    *out = b;
    return 0;
}

static int is_bare(int c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

static void free_parts(char **parts, int n);

/* key = simple-key ( ws '.' ws simple-key )* ; parts are malloc'd (freed here on error). */
static int parse_key_parts(parser *p, char **parts, int *nparts);
static int parse_key(parser *p, char **parts, int *nparts) {
    if (parse_key_parts(p, parts, nparts) == 0) return 0;
    free_parts(parts, *nparts);
    *nparts = 0;
    return -1;
}

static int parse_key_parts(parser *p, char **parts, int *nparts) {
    *nparts = 0;
    for (;;) {
        skip_ws(p);
        if (*nparts == MAX_KEY_PARTS) return perr(p, "key has too many dotted parts", NULL);
        char *part = NULL;
        int c = peek(p);
        if (c == '"' || c == '\'') {
            if (parse_string(p, &part)) return -1;
        } else {
            size_t start = p->pos;
            while (is_bare(peek(p))) p->pos++;
            if (p->pos == start) return perr(p, "expected a key", NULL);
            part = m2d_malloc(p->pos - start + 1);
            memcpy(part, p->s + start, p->pos - start);
            part[p->pos - start] = 0;
        }
        parts[(*nparts)++] = part;
        skip_ws(p);
        if (peek(p) != '.') return 0;
        p->pos++;
    }
}

static void free_parts(char **parts, int n) {
    for (int i = 0; i < n; i++) free(parts[i]);
}

static int is_value_end(int c) {
    return c < 0 || c == ' ' || c == '\t' || c == ',' || c == ']' || c == '}' || c == '#' || c == '\n' ||
           c == '\r';
}

/* digits with single '_' between digits; returns number of chars consumed, -1 on error. */
static int scan_digits(const char *s, size_t n, size_t *i) {
    size_t start = *i;
    int last_digit = 0;
    while (*i < n) {
        char c = s[*i];
        if (c >= '0' && c <= '9') {
            last_digit = 1;
        } else if (c == '_') {
            if (!last_digit || *i + 1 >= n || s[*i + 1] < '0' || s[*i + 1] > '9') return -1;
            last_digit = 0;
        } else {
            break;
        }
        (*i)++;
    }
    return *i > start ? 0 : -1;
}

static int parse_number(parser *p, m2d_toml *v) {
    size_t start = p->pos;
    while (!is_value_end(peek(p))) p->pos++;
    size_t n = p->pos - start;
    const char *s = p->s + start;
    char tok[128];
    if (n == 0 || n >= sizeof tok) {
        p->pos = start;
        return perr(p, "invalid value", NULL);
    }
    memcpy(tok, s, n);
    tok[n] = 0;
    const char *body = tok + (tok[0] == '+' || tok[0] == '-');
    if (strcmp(body, "inf") == 0 || strcmp(body, "nan") == 0) {
        v->type = M2D_TOML_FLOAT;
        v->f = body[0] == 'i' ? INFINITY : NAN;
        if (tok[0] == '-') v->f = -v->f;
        return 0;
    }
    size_t i = (size_t)(body - tok), len = n;
    int is_float = 0;
    if (scan_digits(tok, len, &i) < 0) goto bad;
    /* no leading zeros in the integer part */
    if (body[0] == '0' && i - (size_t)(body - tok) > 1) goto bad;
    if (i < len && tok[i] == '.') {
        i++;
        is_float = 1;
        if (scan_digits(tok, len, &i) < 0) goto bad;
    }
    if (i < len && (tok[i] == 'e' || tok[i] == 'E')) {
        i++;
        is_float = 1;
        if (i < len && (tok[i] == '+' || tok[i] == '-')) i++;
        if (scan_digits(tok, len, &i) < 0) goto bad;
    }
    if (i != len) goto bad;
    char clean[128];
    size_t k = 0;
    for (size_t j = 0; j < len; j++)
        if (tok[j] != '_') clean[k++] = tok[j];
    clean[k] = 0;
    errno = 0;
    char *end;
    if (is_float) {
        v->type = M2D_TOML_FLOAT;
        v->f = strtod(clean, &end);
        if (errno == ERANGE && isinf(v->f)) goto range;
    } else {
        v->type = M2D_TOML_INT;
        v->i = strtoll(clean, &end, 10);
        if (errno == ERANGE) goto range;
    }
    return 0;
range:
    p->pos = start;
    return perr(p, "number out of range: '%s'", tok);
bad:
    p->pos = start;
    if (strchr(tok, ':') || (strlen(tok) >= 8 && tok[4] == '-'))
        return perr(p, "dates and times are not supported: '%s'", tok);
    return perr(p, "invalid value '%s' (expected a string, number, boolean, array or inline table)", tok);
}

static m2d_toml *parse_value(parser *p);

static int insert_keyval(parser *p, m2d_toml *table, char **parts, int nparts, m2d_toml *val);

static m2d_toml *parse_array(parser *p) {
    m2d_toml *a = node_new(M2D_TOML_ARRAY, p);
    a->flags = F_INLINE;
    p->pos++; /* '[' */
    for (;;) {
        if (skip_ws_nl(p)) goto fail;
        if (peek(p) == ']') break;
        m2d_toml *item = parse_value(p);
        if (!item) goto fail;
        node_append(a, NULL, item);
        if (skip_ws_nl(p)) goto fail;
        if (peek(p) == ',') {
            p->pos++;
            continue;
        }
        if (peek(p) == ']') break;
        perr(p, "expected ',' or ']' in array", NULL);
        goto fail;
    }
    p->pos++;
    return a;
fail:
    m2d_toml_free(a);
    return NULL;
}

static m2d_toml *parse_inline_table(parser *p) {
    m2d_toml *t = node_new(M2D_TOML_TABLE, p);
    p->pos++; /* '{' */
    skip_ws(p);
    if (peek(p) == '}') {
        p->pos++;
        t->flags = F_INLINE;
        return t;
    }
    for (;;) {
        char *parts[MAX_KEY_PARTS];
        int np;
        if (parse_key(p, parts, &np)) goto fail;
        if (peek(p) != '=') {
            free_parts(parts, np);
            perr(p, "expected '=' after key", NULL);
            goto fail;
        }
        p->pos++;
        skip_ws(p);
        m2d_toml *v = parse_value(p);
        if (!v) {
            free_parts(parts, np);
            goto fail;
        }
        int rc = insert_keyval(p, t, parts, np, v);
        free_parts(parts, np);
        if (rc) goto fail;
        skip_ws(p);
        if (peek(p) == ',') {
            p->pos++;
            skip_ws(p);
            if (peek(p) == '\n' || peek(p) == '\r' || peek(p) == '}') {
                perr(p, "inline tables are single-line, without a trailing comma", NULL);
                goto fail;
            }
            continue;
        }
        if (peek(p) == '}') break;
        perr(p, "expected ',' or '}' in inline table (inline tables are single-line)", NULL);
        goto fail;
    }
    p->pos++;
    /* freeze the table and every table created inside it */
    t->flags = F_INLINE;
    return t;
fail:
    m2d_toml_free(t);
    return NULL;
}

static void freeze(m2d_toml *t) {
    t->flags |= F_INLINE;
    if (t->type == M2D_TOML_TABLE)
        for (int i = 0; i < t->n; i++) freeze(t->items[i]);
}

static m2d_toml *parse_value(parser *p) {
    if (++p->depth > MAX_DEPTH) {
        perr(p, "values nested too deeply", NULL);
        p->depth--;
        return NULL;
    }
    m2d_toml *v = NULL;
    int c = peek(p);
    if (c == '"' || c == '\'') {
        v = node_new(M2D_TOML_STRING, p);
        if (parse_string(p, &v->str)) {
            m2d_toml_free(v);
            v = NULL;
        }
    } else if (c == '[') {
        v = parse_array(p);
    } else if (c == '{') {
        v = parse_inline_table(p);
        if (v) freeze(v);
    } else if (c == 't' && p->len - p->pos >= 4 && memcmp(p->s + p->pos, "true", 4) == 0 &&
               is_value_end(peek_at(p, 4))) {
        v = node_new(M2D_TOML_BOOL, p);
        v->i = 1;
        p->pos += 4;
    } else if (c == 'f' && p->len - p->pos >= 5 && memcmp(p->s + p->pos, "false", 5) == 0 &&
               is_value_end(peek_at(p, 5))) {
        v = node_new(M2D_TOML_BOOL, p);
        p->pos += 5;
    } else if (c < 0 || c == '\n' || c == '\r' || c == '#') {
        perr(p, "expected a value", NULL);
    } else {
        v = node_new(M2D_TOML_INT, p);
        if (parse_number(p, v)) {
            m2d_toml_free(v);
            v = NULL;
        }
    }
    p->depth--;
    return v;
}

static const char *what(const m2d_toml *t) {
    if (t->type == M2D_TOML_TABLE) return t->flags & F_INLINE ? "an inline table" : "a table";
    if (t->type == M2D_TOML_ARRAY) return t->flags & F_AOT ? "an array of tables" : "an array";
    return "a value";
}

static int insert_keyval(parser *p, m2d_toml *table, char **parts, int nparts, m2d_toml *val) {
    m2d_toml *cur = table;
    for (int i = 0; i < nparts - 1; i++) {
        m2d_toml *child = get_mut(cur, parts[i]);
        if (!child) {
            child = node_new(M2D_TOML_TABLE, p);
            child->flags = F_DOTTED;
            node_append(cur, parts[i], child);
        } else if (child->type != M2D_TOML_TABLE || !(child->flags & F_DOTTED) || (child->flags & F_INLINE)) {
            char msg[160];
            snprintf(msg, sizeof msg, "key '%.60s' is already %s and cannot be extended with a dotted key",
                     parts[i], what(child));
            m2d_toml_free(val);
            return perr(p, "%s", msg);
        }
        cur = child;
    }
    if (get_mut(cur, parts[nparts - 1])) {
        m2d_toml_free(val);
        return perr(p, "duplicate key '%s'", parts[nparts - 1]);
    }
    node_append(cur, parts[nparts - 1], val);
    return 0;
}

/* [a.b] or [[a.b]]; p->pos is on the first '['. Sets *current. */
static int parse_header(parser *p, m2d_toml *root, m2d_toml **current) {
    int aot = peek_at(p, 1) == '[';
    p->pos += aot ? 2 : 1;
    char *parts[MAX_KEY_PARTS];
    int np;
    if (parse_key(p, parts, &np)) return -1;
    if (peek(p) != ']' || (aot && peek_at(p, 1) != ']')) {
        free_parts(parts, np);
        return perr(p, aot ? "expected ']]' to close the table header" : "expected ']' to close the table header",
                    NULL);
    }
    m2d_toml *cur = root;
    int rc = 0;
    for (int i = 0; i < np - 1 && rc == 0; i++) {
        m2d_toml *child = get_mut(cur, parts[i]);
        if (!child) {
            child = node_new(M2D_TOML_TABLE, p);
            child->flags = F_IMPLICIT;
            node_append(cur, parts[i], child);
        } else if (child->type == M2D_TOML_ARRAY && (child->flags & F_AOT)) {
            child = child->items[child->n - 1];
        } else if (child->type != M2D_TOML_TABLE || (child->flags & F_INLINE)) {
            char msg[160];
            snprintf(msg, sizeof msg, "'%.60s' is already %s, not a table", parts[i], what(child));
            rc = perr(p, "%s", msg);
            break;
        }
        cur = child;
    }
    if (rc == 0) {
        const char *last = parts[np - 1];
        m2d_toml *t = get_mut(cur, last);
        if (aot) {
            if (t && !(t->type == M2D_TOML_ARRAY && (t->flags & F_AOT))) {
                rc = perr(p, "cannot define an array of tables: '%s' is already defined", last);
            } else {
                if (!t) {
                    t = node_new(M2D_TOML_ARRAY, p);
                    t->flags = F_AOT;
                    node_append(cur, last, t);
                }
                m2d_toml *elem = node_new(M2D_TOML_TABLE, p);
                elem->flags = F_EXPLICIT;
                node_append(t, NULL, elem);
                *current = elem;
            }
        } else if (!t) {
            t = node_new(M2D_TOML_TABLE, p);
            t->flags = F_EXPLICIT;
            node_append(cur, last, t);
            *current = t;
        } else if (t->type == M2D_TOML_TABLE && t->flags == F_IMPLICIT) {
            t->flags = F_EXPLICIT;
            *current = t;
        } else {
            rc = perr(p, "table '%s' is defined twice", last);
        }
    }
    free_parts(parts, np);
    if (rc) return rc;
    p->pos += aot ? 2 : 1;
    return 0;
}

/* After a key/value or header: optional whitespace and comment, then end of line. */
static int expect_eol(parser *p) {
    skip_ws(p);
    if (skip_comment(p)) return -1;
    if (peek(p) < 0) return 0;
    int r = eat_newline(p);
    if (r < 0) return -1;
    if (r == 0) {
        char c[2] = {(char)peek(p), 0};
        return perr(p, "unexpected '%s' after the value (one key = value per line)", c);
    }
    return 0;
}

static int check_utf8(parser *p) {
    const uint8_t *s = (const uint8_t *)p->s;
    size_t i = 0;
    while (i < p->len) {
        if (s[i] == '\n') {
            p->line++;
            p->line_start = i + 1;
        }
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(s + i, (utf8proc_ssize_t)(p->len - i), &cp);
        if (k < 0) {
            p->pos = i;
            return perr(p, "invalid UTF-8", NULL);
        }
        i += (size_t)k;
    }
    p->line = 1;
    p->line_start = 0;
    p->pos = 0;
    return 0;
}

m2d_toml *m2d_toml_parse(const char *text, size_t len, const char *path) {
    parser p = {.s = text, .path = path, .len = len, .line = 1};
    if (check_utf8(&p)) return NULL;
    /* a UTF-8 byte order mark is allowed at the start */
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) p.pos = p.line_start = 3;
    m2d_toml *root = node_new(M2D_TOML_TABLE, &p);
    root->flags = F_EXPLICIT;
    m2d_toml *cur = root;
    while (p.pos < p.len) {
        skip_ws(&p);
        int c = peek(&p);
        if (c < 0) break;
        int r = eat_newline(&p);
        if (r < 0) goto fail;
        if (r) continue;
        if (c == '#') {
            if (skip_comment(&p)) goto fail;
            continue;
        }
        if (c == '[') {
            if (parse_header(&p, root, &cur)) goto fail;
        } else {
            char *parts[MAX_KEY_PARTS];
            int np;
            if (parse_key(&p, parts, &np)) goto fail;
            if (peek(&p) != '=') {
                free_parts(parts, np);
                perr(&p, "expected '=' after key", NULL);
                goto fail;
            }
            p.pos++;
            skip_ws(&p);
            m2d_toml *v = parse_value(&p);
            if (!v) {
                free_parts(parts, np);
                goto fail;
            }
            int rc = insert_keyval(&p, cur, parts, np, v);
            free_parts(parts, np);
            if (rc) goto fail;
        }
        if (expect_eol(&p)) goto fail;
    }
    return root;
fail:
    m2d_toml_free(root);
    return NULL;
}

m2d_toml *m2d_toml_load(const char *path) {
    size_t n;
    char *s = m2d_read_file(path, &n);
    if (!s) return NULL;
    m2d_toml *t = m2d_toml_parse(s, n, path);
    free(s);
    return t;
}

/* Values from the command line have no place in the file: line 0 (errors then say "--set"). */
static void mark_from_command_line(m2d_toml *t) {
    t->line = t->col = 0;
    for (int i = 0; (t->type == M2D_TOML_ARRAY || t->type == M2D_TOML_TABLE) && i < t->n; i++)
        mark_from_command_line(t->items[i]);
}

/* DOTTED is parts joined by single dots, none empty (".", "a..b", "a." would be taken apart by
 * strtok as fewer parts, or none) */
static int check_set_key(const char *dotted) {
    if (!*dotted) return m2d_err("--set: empty key");
    for (const char *p = dotted;; p++) {
        if (*p == '.' || !*p) {
            if (p == dotted || p[-1] == '.') return m2d_err("--set %s: empty key part", dotted);
            if (!*p) return 0;
        }
    }
}

/* VALUE as a TOML value (a plain string when it is not one), or NULL when it is more than one
 * (a newline and a second key) */
static m2d_toml *set_value(const char *dotted, const char *value) {
    char *doc = m2d_strfmt("v = %s", value);
    m2d_toml *parsed = m2d_toml_parse(doc, strlen(doc), "--set");
    free(doc);
    m2d_err_clear();
    if (!parsed) {
        m2d_toml *val = node_new(M2D_TOML_STRING, NULL);
        val->str = m2d_strdup(value);
        return val;
    }
    if (parsed->n != 1) {
        m2d_toml_free(parsed);
        m2d_err("--set %s: the value is more than one TOML value (a newline in it?)", dotted);
        return NULL;
    }
    m2d_toml *val = parsed->items[0];
    free(parsed->keys[0]);
    parsed->n = 0;
    m2d_toml_free(parsed);
    return val;
}

int m2d_toml_set(m2d_toml *root, const char *dotted, const char *value) {
    if (check_set_key(dotted)) return -1;
    m2d_toml *val = set_value(dotted, value);
    if (!val) return -1;
    mark_from_command_line(val);
    char *copy = m2d_strdup(dotted), *save = NULL;
    m2d_toml *cur = root;
    char *part = strtok_r(copy, ".", &save);
    int rc = 0;
    while (part) {
        char *next = strtok_r(NULL, ".", &save);
        m2d_toml *child = get_mut(cur, part);
        if (!next) {
            if (child) {
                for (int i = 0; i < cur->n; i++)
                    if (cur->items[i] == child) {
                        m2d_toml_free(child);
                        cur->items[i] = val;
                    }
            } else {
                node_append(cur, part, val);
            }
            val = NULL;
            break;
        }
        if (!child) {
            child = node_new(M2D_TOML_TABLE, NULL);
            node_append(cur, part, child);
        } else if (child->type != M2D_TOML_TABLE) {
            rc = m2d_err("--set %s: '%s' is %s, not a table", dotted, part, what(child));
            break;
        }
        cur = child;
        part = next;
    }
    m2d_toml_free(val);
    free(copy);
    return rc;
}
