/* tkdecode — HF decoders as a flat list of steps over a list of token strings. Each step maps the
 * list to a new one (HF Decoder::decode_chain); the result is the concatenation (with a space
 * between tokens when there is no decoder at all, as HF joins them). */
#include "tokenizer/tkdecode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

enum { DEC_BYTELEVEL, DEC_METASPACE, DEC_REPLACE, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP };

typedef struct {
    int kind;
    m2d_tkmetaspace meta; /* Metaspace */
    m2d_tkreplace rep;    /* Replace */
    char strip[5];        /* Strip: content (one character), start, stop */
    size_t strip_n, start, stop;
} step;

struct m2d_tkdecoder {
    step *steps;
    int n_steps, cap;
    int none; /* no decoder: tokens are joined with ' ' */
};

#define MAX_DEPTH 16

/* ---- loading ---- */

static step *new_step(m2d_tkdecoder *d, int kind) {
    if (d->n_steps == d->cap) d->steps = m2d_realloc(d->steps, (size_t)(d->cap = d->cap ? d->cap * 2 : 8) * sizeof *d->steps);
    step *s = &d->steps[d->n_steps++];
    memset(s, 0, sizeof *s);
    s->kind = kind;
    return s;
}

static int size_field(const char *path, const cJSON *obj, const char *name, const char *field, size_t *out) {
    const cJSON *v = m2d_tkj_get(obj, name);
    char f[256];
    snprintf(f, sizeof f, "%s.%s", field, name);
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e9 || v->valuedouble != (double)(size_t)v->valuedouble)
        return m2d_tkj_err(path, f, "expected a non-negative integer");
    *out = (size_t)v->valuedouble;
    return 0;
}

static int load_strip(step *s, const char *path, const cJSON *dec, const char *field) {
    char f[256];
    const char *content;
    uint32_t cp;
    snprintf(f, sizeof f, "%s.content", field);
    if (m2d_tkj_string(path, dec, "content", f, &content)) return -1;
    size_t n = content ? strlen(content) : 0;
    if (!n || m2d_utf8_next((const unsigned char *)content, n, 0, &cp) != (int)n) return m2d_tkj_err(path, f, "expected one character");
    memcpy(s->strip, content, n);
    s->strip_n = n;
    return size_field(path, dec, "start", field, &s->start) || size_field(path, dec, "stop", field, &s->stop) ? -1 : 0;
}

static int load_one(m2d_tkdecoder *d, const char *path, const cJSON *dec, const char *field, int depth) {
    const char *type;
    if (m2d_tkj_type(path, dec, field, &type)) return -1;
    if (!strcmp(type, "Sequence")) {
        char f[256];
        snprintf(f, sizeof f, "%s.decoders", field);
        const cJSON *list = m2d_tkj_get(dec, "decoders");
        if (!cJSON_IsArray(list)) return m2d_tkj_err(path, f, "expected an array");
        if (depth == MAX_DEPTH) return m2d_tkj_err(path, f, "nested too deeply");
        int i = 0;
        for (const cJSON *c = list->child; c; c = c->next, i++) {
            snprintf(f, sizeof f, "%s.decoders[%d]", field, i);
            if (load_one(d, path, c, f, depth + 1)) return -1;
        }
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) return new_step(d, DEC_BYTELEVEL), 0;
    if (!strcmp(type, "ByteFallback")) return new_step(d, DEC_BYTEFALLBACK), 0;
    if (!strcmp(type, "Fuse")) return new_step(d, DEC_FUSE), 0;
    if (!strcmp(type, "Metaspace")) return m2d_tkj_metaspace(path, dec, field, &new_step(d, DEC_METASPACE)->meta);
    if (!strcmp(type, "Replace")) return m2d_tkreplace_load(&new_step(d, DEC_REPLACE)->rep, path, dec, field);
    if (!strcmp(type, "Strip")) return load_strip(new_step(d, DEC_STRIP), path, dec, field);
    char f[256];
    snprintf(f, sizeof f, "%s.type", field);
    return m2d_tkj_unsupported(path, f, type, "ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence, null");
}

int m2d_tkdecoder_load(const char *path, const cJSON *dec, m2d_tkdecoder **out) {
    m2d_tkdecoder *d = m2d_calloc(1, sizeof *d);
    *out = NULL;
    m2d_bytelevel_init();
    if (!dec || cJSON_IsNull(dec)) d->none = 1;
    else if (load_one(d, path, dec, "decoder", 0)) {
        m2d_tkdecoder_free(d);
        return -1;
    }
    *out = d;
    return 0;
}

void m2d_tkdecoder_free(m2d_tkdecoder *d) {
    if (!d) return;
    for (int i = 0; i < d->n_steps; i++)
        if (d->steps[i].kind == DEC_REPLACE) m2d_tkreplace_free(&d->steps[i].rep);
    free(d->steps);
    free(d);
}

/* ---- running ---- */

/* A list of token strings: (offset, length) into one arena. */
typedef struct {
    m2d_tkbuf arena;
    size_t *off, *len;
    size_t n, cap;
} toklist;

static void tl_push(toklist *t, const char *s, size_t n) {
    if (t->n == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 256;
        t->off = m2d_realloc(t->off, t->cap * sizeof *t->off);
        t->len = m2d_realloc(t->len, t->cap * sizeof *t->len);
    }
    t->off[t->n] = t->arena.n;
    t->len[t->n++] = n;
    m2d_tkbuf_put(&t->arena, s, n);
}

/* Extend the last token (made by tl_push) by s. */
static void tl_append(toklist *t, const char *s, size_t n) {
    m2d_tkbuf_put(&t->arena, s, n);
    t->len[t->n - 1] += n;
}

static const char *tl_tok(const toklist *t, size_t i) { return t->arena.p + t->off[i]; }

static void tl_free(toklist *t) {
    free(t->arena.p);
    free(t->off);
    free(t->len);
}

/* ByteLevel: all tokens to one string of the bytes their characters stand for (a token with a
 * character outside the alphabet keeps its own bytes); lossy unless raw. */
static void run_bytelevel(const toklist *in, toklist *out, int raw) {
    m2d_tkbuf b = {0};
    for (size_t i = 0; i < in->n; i++) {
        const char *t = tl_tok(in, i);
        size_t n = in->len[i], mark = b.n;
        for (size_t j = 0; j < n;) {
            uint32_t cp;
            int k = m2d_utf8_next((const unsigned char *)t, n, j, &cp);
            int byte = k > 0 ? m2d_bytelevel_byte(cp) : -1;
            if (byte < 0) {
                b.n = mark;
                m2d_tkbuf_put(&b, t, n);
                break;
            }
            char c = (char)byte;
            m2d_tkbuf_put(&b, &c, 1);
            j += (size_t)k;
        }
    }
    tl_push(out, "", 0);
    if (raw) tl_append(out, b.p ? b.p : "", b.n);
    else {
        m2d_tkbuf l = {0};
        m2d_tkbuf_put_lossy(&l, b.p ? b.p : "", b.n);
        tl_append(out, l.p, l.n);
        free(l.p);
    }
    free(b.p);
}

/* "<0xHH>" -> HH; Rust's u8::from_str_radix(.., 16) on the two characters, which also takes a
 * leading '+' ("<0x+A>" is byte 10). -1 when t is not such a token. */
static int byte_token(const char *t, size_t n) {
    if (n != 6 || memcmp(t, "<0x", 3) != 0 || t[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = t[i];
        if (i == 3 && c == '+') continue;
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* The pending bytes: one token when valid UTF-8 (or raw), else one U+FFFD token per byte. */
static void flush_bytes(toklist *out, m2d_tkbuf *bytes, int raw) {
    if (!bytes->n) return;
    if (raw || m2d_utf8_first_invalid(bytes->p, bytes->n) == bytes->n) tl_push(out, bytes->p, bytes->n);
    else
        for (size_t i = 0; i < bytes->n; i++) tl_push(out, "\xEF\xBF\xBD", 3);
    bytes->n = 0;
}

static void run_bytefallback(const toklist *in, toklist *out, int raw) {
    m2d_tkbuf bytes = {0};
    for (size_t i = 0; i < in->n; i++) {
        int b = byte_token(tl_tok(in, i), in->len[i]);
        if (b >= 0) {
            char c = (char)b;
            m2d_tkbuf_put(&bytes, &c, 1);
            continue;
        }
        flush_bytes(out, &bytes, raw);
        tl_push(out, tl_tok(in, i), in->len[i]);
    }
    flush_bytes(out, &bytes, raw);
    free(bytes.p);
}

/* Metaspace: the replacement character becomes ' ', except in the first token, where it is
 * dropped (unless prepend_scheme is "never"). */
static void run_metaspace(const m2d_tkmetaspace *m, const toklist *in, toklist *out) {
    for (size_t i = 0; i < in->n; i++) {
        const char *t = tl_tok(in, i);
        size_t n = in->len[i], run = 0;
        int drop = i == 0 && m->scheme != M2D_PREPEND_NEVER;
        tl_push(out, "", 0);
        for (size_t j = 0; j + m->repl_n <= n;) {
            if (memcmp(t + j, m->repl, m->repl_n) != 0) {
                j++;
                continue;
            }
            tl_append(out, t + run, j - run);
            if (!drop) tl_append(out, " ", 1);
            j += m->repl_n;
            run = j;
        }
        tl_append(out, t + run, n - run);
    }
}

/* Strip: up to start leading and stop trailing copies of the content character, per token. */
static void run_strip(const step *s, const toklist *in, toklist *out) {
    for (size_t i = 0; i < in->n; i++) {
        const char *t = tl_tok(in, i);
        size_t a = 0, b = in->len[i], c = s->strip_n;
        for (size_t k = 0; k < s->start && b - a >= c && !memcmp(t + a, s->strip, c); k++) a += c;
        for (size_t k = 0; k < s->stop && b - a >= c && !memcmp(t + b - c, s->strip, c); k++) b -= c;
        tl_push(out, t + a, b - a);
    }
}

static int run_replace(const m2d_tkreplace *r, const toklist *in, toklist *out, pcre2_match_data *md, m2d_tkspans *sp) {
    m2d_tkbuf b = {0};
    int rc = 0;
    for (size_t i = 0; i < in->n && !rc; i++) {
        b.n = 0;
        rc = m2d_tkreplace_apply(r, md, sp, tl_tok(in, i), in->len[i], &b, NULL);
        tl_push(out, b.p, b.n);
    }
    free(b.p);
    return rc;
}

static int run_step(const step *s, const toklist *in, toklist *out, int raw, pcre2_match_data *md, m2d_tkspans *sp) {
    switch (s->kind) {
    case DEC_BYTELEVEL: run_bytelevel(in, out, raw); return 0;
    case DEC_BYTEFALLBACK: run_bytefallback(in, out, raw); return 0;
    case DEC_METASPACE: run_metaspace(&s->meta, in, out); return 0;
    case DEC_STRIP: run_strip(s, in, out); return 0;
    case DEC_REPLACE: return run_replace(&s->rep, in, out, md, sp);
    default: /* Fuse */
        tl_push(out, "", 0);
        for (size_t i = 0; i < in->n; i++) tl_append(out, tl_tok(in, i), in->len[i]);
        return 0;
    }
}

int m2d_tkdecoder_run(const m2d_tkdecoder *d, const char *const *tok, const uint32_t *len, size_t n, int raw,
                      m2d_tkbuf *out) {
    toklist a = {0}, b = {0};
    for (size_t i = 0; i < n; i++) tl_push(&a, tok[i], len[i]);
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    m2d_tkspans sp = {0};
    int rc = 0;
    for (int k = 0; k < d->n_steps && !rc; k++) {
        b.n = b.arena.n = 0;
        rc = run_step(&d->steps[k], &a, &b, raw, md, &sp);
        toklist t = a;
        a = b, b = t;
    }
    for (size_t i = 0; i < a.n && !rc; i++) {
        if (i && d->none) m2d_tkbuf_put(out, " ", 1);
        m2d_tkbuf_put(out, tl_tok(&a, i), a.len[i]);
    }
    m2d_tkbuf_put(out, "", 0);
    pcre2_match_data_free(md);
    free(sp.v);
    tl_free(&a), tl_free(&b);
    return rc;
}
