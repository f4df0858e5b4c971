/* tktext — UTF-8, the byte-level alphabet, tokenizer.json fields and Oniguruma-compatible
 * regexes, shared by the tokenizer's pipeline and its decoders. */
#include "tokenizer/tktext.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "base/util.h"

/* ------------------------------------------------------------------------------------------ */
/* UTF-8                                                                                        */

int m2d_utf8_next(const unsigned char *s, size_t n, size_t i, uint32_t *cp) {
    unsigned b = s[i];
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    int need;
    unsigned lo = 0x80, hi = 0xBF;
    uint32_t c;
    if (b >= 0xC2 && b <= 0xDF) need = 1, c = b & 0x1F;
    else if (b == 0xE0) need = 2, c = b & 0x0F, lo = 0xA0;
    else if (b >= 0xE1 && b <= 0xEC) need = 2, c = b & 0x0F;
    else if (b == 0xED) need = 2, c = b & 0x0F, hi = 0x9F;
    else if (b >= 0xEE && b <= 0xEF) need = 2, c = b & 0x0F;
    else if (b == 0xF0) need = 3, c = b & 0x07, lo = 0x90;
    else if (b >= 0xF1 && b <= 0xF3) need = 3, c = b & 0x07;
    else if (b == 0xF4) need = 3, c = b & 0x07, hi = 0x8F;
    else return -1;
    for (int k = 1; k <= need; k++) {
        if (i + (size_t)k >= n) return -k;
        unsigned t = s[i + (size_t)k];
        if (t < lo || t > hi) return -k;
        lo = 0x80, hi = 0xBF; /* only the second byte has a narrowed range */
        c = (c << 6) | (t & 0x3F);
    }
    *cp = c;
    return need + 1;
}

size_t m2d_utf8_first_invalid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    uint32_t cp;
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        int k = m2d_utf8_next(u, n, i, &cp);
        if (k < 0) return i;
        i += (size_t)k;
    }
    return n;
}

int m2d_utf8_put(char *out, uint32_t cp) {
    if (cp < 0x80) return out[0] = (char)cp, 1;
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

uint32_t m2d_utf8_prev(const char *s, size_t end, size_t *start) {
    size_t i = end - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
    uint32_t cp = 0;
    m2d_utf8_next((const unsigned char *)s, end, i, &cp);
    *start = i;
    return cp;
}

int m2d_is_white_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

/* Alphabetic = letters + Nl + Other_Alphabetic (mostly marks; the So letters are listed). */
int m2d_is_word_char(uint32_t c) {
    if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (c == 0x200C || c == 0x200D) return 1;
    if ((c >= 0x24B6 && c <= 0x24E9) || (c >= 0x1F130 && c <= 0x1F149) || (c >= 0x1F150 && c <= 0x1F169) ||
        (c >= 0x1F170 && c <= 0x1F189))
        return 1;
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
        return 1;
    default:
        return 0;
    }
}

int m2d_is_numeric(uint32_t c) {
    if (c < 0x80) return c >= '0' && c <= '9';
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

/* ------------------------------------------------------------------------------------------ */
/* Buffers                                                                                      */

void m2d_tk_reserve(char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return;
    *cap = M2D_MAX(need, *cap * 2);
    *buf = m2d_realloc(*buf, *cap);
}

void m2d_tkbuf_put(m2d_tkbuf *b, const void *s, size_t n) {
    m2d_tk_reserve(&b->p, &b->cap, b->n + n + 1);
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void m2d_tkbuf_put_lossy(m2d_tkbuf *b, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0; /* s[run..i) is valid and not yet copied */
    uint32_t cp;
    while (i < n) {
        int k = u[i] < 0x80 ? 1 : m2d_utf8_next(u, n, i, &cp);
        if (k > 0) {
            i += (size_t)k;
            continue;
        }
        m2d_tkbuf_put(b, s + run, i - run);
        m2d_tkbuf_put(b, "\xEF\xBF\xBD", 3);
        i += (size_t)(-k);
        run = i;
    }
    m2d_tkbuf_put(b, s + run, n - run);
}

/* ------------------------------------------------------------------------------------------ */
/* Byte-level alphabet                                                                          */

static int16_t g_cp_to_byte[0x144]; /* -1 when the code point is not in the alphabet */
static char g_byte_utf8[256][2];
static unsigned char g_byte_utf8_len[256];

/* bytes_to_unicode: printable bytes map to themselves, the others to U+0100 on in byte order. */
void m2d_bytelevel_init(void) {
    static int done;
    if (__atomic_load_n(&done, __ATOMIC_ACQUIRE)) return;
    uint32_t next = 256;
    int16_t c2b[0x144];
    for (size_t i = 0; i < 0x144; i++) c2b[i] = -1;
    /* idempotent: racing initialisers write identical values */
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        uint32_t cp = printable ? (uint32_t)b : next++;
        c2b[cp] = (int16_t)b;
        char tmp[4];
        int k = m2d_utf8_put(tmp, cp);
        g_byte_utf8_len[b] = (unsigned char)k;
        memcpy(g_byte_utf8[b], tmp, (size_t)k);
    }
    memcpy(g_cp_to_byte, c2b, sizeof c2b);
    __atomic_store_n(&done, 1, __ATOMIC_RELEASE);
}

const char *m2d_bytelevel_char(unsigned char b, size_t *len) {
    *len = g_byte_utf8_len[b];
    return g_byte_utf8[b];
}

int m2d_bytelevel_byte(uint32_t cp) { return cp < 0x144 ? g_cp_to_byte[cp] : -1; }

/* ------------------------------------------------------------------------------------------ */
/* tokenizer.json fields                                                                        */

int m2d_tkj_err(const char *path, const char *field, const char *what) {
    return m2d_err("%s: field '%s': %s", path, field, what);
}

int m2d_tkj_unsupported(const char *path, const char *field, const char *value, const char *supported) {
    return m2d_err("%s: field '%s': '%s' not supported (supported: %s)", path, field, value, supported);
}

const cJSON *m2d_tkj_get(const cJSON *obj, const char *name) {
    return cJSON_IsObject(obj) ? cJSON_GetObjectItemCaseSensitive(obj, name) : NULL;
}

int m2d_tkj_bool(const char *path, const cJSON *obj, const char *name, const char *field, int dflt, int *out) {
    const cJSON *v = m2d_tkj_get(obj, name);
    if (!v || cJSON_IsNull(v)) {
        *out = dflt;
        return 0;
    }
    if (!cJSON_IsBool(v)) return m2d_tkj_err(path, field, "expected true or false");
    *out = cJSON_IsTrue(v);
    return 0;
}

int m2d_tkj_string(const char *path, const cJSON *obj, const char *name, const char *field, const char **out) {
    const cJSON *v = m2d_tkj_get(obj, name);
    *out = NULL;
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsString(v)) return m2d_tkj_err(path, field, "expected a string");
    *out = v->valuestring;
    return 0;
}

int m2d_tkj_type(const char *path, const cJSON *obj, const char *field, const char **type) {
    char f[256];
    snprintf(f, sizeof f, "%s.type", field);
    if (!cJSON_IsObject(obj)) return m2d_tkj_err(path, field, "expected an object");
    if (m2d_tkj_string(path, obj, "type", f, type)) return -1;
    if (!*type) return m2d_tkj_err(path, f, "missing");
    return 0;
}

/* HF's Metaspace deserializer: replacement is required and one character; prepend_scheme defaults
 * to "always"; a legacy add_prefix_space false is accepted only with prepend_scheme "never". */
int m2d_tkj_metaspace(const char *path, const cJSON *obj, const char *field, m2d_tkmetaspace *out) {
    char f[256];
    const char *repl, *scheme;
    int aps;
    uint32_t cp;
    memset(out, 0, sizeof *out);
    snprintf(f, sizeof f, "%s.replacement", field);
    if (m2d_tkj_string(path, obj, "replacement", f, &repl)) return -1;
    size_t rn = repl ? strlen(repl) : 0;
    if (!rn || m2d_utf8_next((const unsigned char *)repl, rn, 0, &cp) != (int)rn)
        return m2d_tkj_err(path, f, "expected one character");
    memcpy(out->repl, repl, rn);
    out->repl_n = rn;
    snprintf(f, sizeof f, "%s.prepend_scheme", field);
    if (m2d_tkj_string(path, obj, "prepend_scheme", f, &scheme)) return -1;
    static const char *names[] = {"always", "first", "never"};
    out->scheme = scheme ? -1 : M2D_PREPEND_ALWAYS;
    for (int i = 0; i < 3 && scheme; i++)
        if (!strcmp(scheme, names[i])) out->scheme = i;
    if (out->scheme < 0) return m2d_tkj_unsupported(path, f, scheme, "always, first, never");
    snprintf(f, sizeof f, "%s.add_prefix_space", field);
    if (m2d_tkj_bool(path, obj, "add_prefix_space", f, 1, &aps)) return -1;
    if (!aps && out->scheme != M2D_PREPEND_NEVER)
        return m2d_tkj_err(path, f, "false contradicts prepend_scheme (HF refuses it too)");
    snprintf(f, sizeof f, "%s.split", field);
    return m2d_tkj_bool(path, obj, "split", f, 1, &out->split);
}

/* ------------------------------------------------------------------------------------------ */
/* Regexes                                                                                      */

/* Where a PCRE2 (UTF+UCP) escape means something else than in Oniguruma, it is rewritten:
 *   \s  U+0009..U+000D, U+0085, Zs, Zl, Zp  (PCRE2 adds U+180E)
 *   \w  Letter, Mark, Number, Connector_Punctuation  (PCRE2 10.42: letters, numbers, '_')
 *   \h  hexadecimal digit  (PCRE2: horizontal whitespace)
 *   \uHHHH  the code point (PCRE2 refuses \u)
 * Upper-case forms outside a class become the negated class; inside a class only the
 * lower-case forms are rewritten. ^ and $ are line anchors in Oniguruma: compiled MULTILINE. */
static const char *onig_class_body(char d) {
    switch (d) {
    case 's': case 'S': return "\\t-\\r\\x{85}\\p{Z}";
    case 'w': case 'W': return "\\p{L}\\p{M}\\p{N}\\p{Pc}";
    case 'h': case 'H': return "0-9a-fA-F";
    default: return NULL;
    }
}

static int is_hex4(const char *p) {
    for (int i = 0; i < 4; i++)
        if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f') || (p[i] >= 'A' && p[i] <= 'F'))) return 0;
    return 1;
}

/* One escape at p[i] (a backslash with a next character): appended rewritten; returns the
 * number of pattern bytes consumed. */
static size_t onig_escape(const char *p, size_t i, size_t n, int in_class, char *out, size_t *o, size_t cap) {
    char d = p[i + 1];
    const char *body = onig_class_body(d);
    int upper = d >= 'A' && d <= 'Z';
    if (body && !(in_class && upper)) {
        const char *open = in_class ? "" : (upper ? "[^" : "[");
        *o += (size_t)snprintf(out + *o, cap - *o, "%s%s%s", open, body, in_class ? "" : "]");
        return 2;
    }
    if (d == 'u' && i + 6 <= n && is_hex4(p + i + 2)) {
        *o += (size_t)snprintf(out + *o, cap - *o, "\\x{%.4s}", p + i + 2);
        return 6;
    }
    out[(*o)++] = p[i];
    out[(*o)++] = d;
    return 2;
}

static char *onig_compatible_pattern(const char *p) {
    size_t n = strlen(p), cap = n * 4 + 64, o = 0;
    char *out = m2d_malloc(cap);
    int in_class = 0;
    for (size_t i = 0; i < n; i++) {
        if (o + 40 > cap) out = m2d_realloc(out, cap *= 2);
        char c = p[i];
        if (c == '\\' && i + 1 < n) {
            i += onig_escape(p, i, n, in_class, out, &o, cap) - 1;
            continue;
        }
        if (c == '[' && !in_class) {
            in_class = 1;
            out[o++] = c;
            /* a ']' right after '[' or '[^' is a literal */
            if (i + 1 < n && p[i + 1] == '^') out[o++] = p[++i];
            if (i + 1 < n && p[i + 1] == ']') out[o++] = p[++i];
            continue;
        }
        if (c == '[' && in_class) in_class++; /* nested class / POSIX [:name:] */
        else if (c == ']' && in_class) in_class--;
        out[o++] = c;
    }
    out[o] = 0;
    return out;
}

int m2d_tkre_compile(const char *path, const char *field, const char *pattern, int literal, pcre2_code **out) {
    int errcode;
    PCRE2_SIZE erroff;
    char *pat = literal ? m2d_strdup(pattern) : onig_compatible_pattern(pattern);
    uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP | PCRE2_MULTILINE);
    pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
    pcre2_set_newline(cc, PCRE2_NEWLINE_LF); /* Oniguruma's line end, whatever PCRE2 was built with */
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, opts, &errcode, &erroff, cc);
    pcre2_compile_context_free(cc);
    free(pat);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(errcode, msg, sizeof msg);
        return m2d_err("%s: field '%s': cannot compile regex: %s", path, field, (const char *)msg);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* optional speed-up; the interpreter is the fallback */
    *out = re;
    return 0;
}

int m2d_tkre_pattern(const char *path, const cJSON *obj, const char *field, pcre2_code **out, const char **string) {
    char f[256];
    const cJSON *pat = m2d_tkj_get(obj, "pattern");
    const cJSON *rx = m2d_tkj_get(pat, "Regex"), *str = m2d_tkj_get(pat, "String");
    *out = NULL;
    if (string) *string = NULL;
    if (cJSON_IsString(rx)) {
        snprintf(f, sizeof f, "%s.pattern.Regex", field);
        return m2d_tkre_compile(path, f, rx->valuestring, 0, out);
    }
    if (cJSON_IsString(str)) {
        snprintf(f, sizeof f, "%s.pattern.String", field);
        if (string) *string = str->valuestring;
        /* HF compiles the escaped string as a regex: an empty String is the empty regex, which
         * matches at every character boundary */
        return m2d_tkre_compile(path, f, str->valuestring, 1, out);
    }
    snprintf(f, sizeof f, "%s.pattern", field);
    return m2d_tkj_err(path, f, "expected {\"Regex\": ...} or {\"String\": ...}");
}

void m2d_tkspans_push(m2d_tkspans *d, size_t s, size_t e, int m) {
    if (d->n == d->cap) d->v = m2d_realloc(d->v, (d->cap = d->cap ? d->cap * 2 : 64) * sizeof *d->v);
    d->v[d->n++] = (m2d_tkspan){s, e, m};
}

static int regex_match(const pcre2_code *re, pcre2_match_data *md, const char *s, size_t n, size_t from, size_t *ms,
                       size_t *me) {
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, md, NULL);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) /* deep backtracking: redo with the interpreter */
        rc = pcre2_match(re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        return m2d_err("tokenizer regex failed: %s", (const char *)msg);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

/* The onig crate's find_iter skips an empty match right after the previous match (searching on
 * one character further); HF keeps the rest as (offsets, is_match) covering the text. */
int m2d_tkre_find(const pcre2_code *re, pcre2_match_data *md, const char *s, size_t n, m2d_tkspans *d) {
    d->n = 0;
    if (n == 0) return 0;
    if (!re) {
        m2d_tkspans_push(d, 0, n, 0);
        return 0;
    }
    size_t prev = 0, from = 0;
    int have_last = 0;
    while (from <= n) {
        size_t ms, me;
        int r = regex_match(re, md, s, n, from, &ms, &me);
        if (r < 0) return -1;
        if (r == 0) break;
        if (ms == me && have_last && prev == me) {
            if (from >= n) break;
            uint32_t cp;
            int k = m2d_utf8_next((const unsigned char *)s, n, from, &cp);
            from += (size_t)(k > 0 ? k : 1);
            continue;
        }
        if (prev != ms) m2d_tkspans_push(d, prev, ms, 0);
        m2d_tkspans_push(d, ms, me, 1);
        prev = from = me;
        have_last = 1;
    }
    if (prev != n) m2d_tkspans_push(d, prev, n, 0);
    return 0;
}

void m2d_tk_find_chars(int (*pred)(uint32_t), const char *s, size_t n, m2d_tkspans *d) {
    d->n = 0;
    size_t last = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = m2d_utf8_next((const unsigned char *)s, n, i, &cp);
        if (k < 0) k = 1, cp = 0xFFFD; /* not reached: text is valid UTF-8 */
        if (pred(cp)) {
            if (last < i) m2d_tkspans_push(d, last, i, 0);
            m2d_tkspans_push(d, i, i + (size_t)k, 1);
            last = i + (size_t)k;
        }
        i += (size_t)k;
    }
    if (last < n) m2d_tkspans_push(d, last, n, 0);
}

void m2d_tk_find_literal(const char *lit, size_t lit_n, const char *s, size_t n, m2d_tkspans *d) {
    d->n = 0;
    size_t prev = 0;
    for (size_t i = 0; i + lit_n <= n;) {
        const char *hit = memchr(s + i, lit[0], n - i - lit_n + 1);
        if (!hit) break;
        i = (size_t)(hit - s);
        if (memcmp(hit, lit, lit_n) != 0) {
            i++;
            continue;
        }
        if (prev != i) m2d_tkspans_push(d, prev, i, 0);
        m2d_tkspans_push(d, i, i + lit_n, 1);
        prev = i += lit_n;
    }
    if (prev != n) m2d_tkspans_push(d, prev, n, 0);
}

/* MergedWithPrevious; MergedWithNext is the same walking backwards. */
static size_t merge_with_previous(m2d_tkspan *sp, size_t n) {
    int prev_match = 0;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int m = sp[i].m;
        if (m && !prev_match && o > 0) sp[o - 1].e = sp[i].e;
        else sp[o++] = (m2d_tkspan){sp[i].s, sp[i].e, 0};
        prev_match = m;
    }
    return o;
}

static size_t merge_with_next(m2d_tkspan *sp, size_t n) {
    int prev_match = 0;
    size_t w = n; /* written from the back */
    for (size_t i = n; i-- > 0;) {
        int m = sp[i].m;
        if (m && !prev_match && w < n) sp[w].s = sp[i].s;
        else sp[--w] = (m2d_tkspan){sp[i].s, sp[i].e, 0};
        prev_match = m;
    }
    memmove(sp, sp + w, (n - w) * sizeof *sp);
    return n - w;
}

void m2d_tkspans_split(m2d_tkspans *d, int behavior, int invert) {
    m2d_tkspan *sp = d->v;
    size_t n = d->n, o = 0;
    if (invert)
        for (size_t i = 0; i < n; i++) sp[i].m = !sp[i].m;
    switch (behavior) {
    case M2D_SPLIT_REMOVED:
        return; /* drop the matches: m already says so */
    case M2D_SPLIT_ISOLATED:
        for (size_t i = 0; i < n; i++) sp[i].m = 0;
        return;
    case M2D_SPLIT_CONTIGUOUS: {
        int prev_match = 0;
        for (size_t i = 0; i < n; i++) {
            int m = sp[i].m;
            if (m == prev_match && o > 0) sp[o - 1].e = sp[i].e;
            else sp[o++] = (m2d_tkspan){sp[i].s, sp[i].e, 0};
            prev_match = m;
        }
        break;
    }
    case M2D_SPLIT_MERGED_PREV:
        o = merge_with_previous(sp, n);
        break;
    default:
        o = merge_with_next(sp, n);
        break;
    }
    d->n = o;
}

/* ------------------------------------------------------------------------------------------ */
/* Replace                                                                                      */

int m2d_tkreplace_load(m2d_tkreplace *r, const char *path, const cJSON *obj, const char *field) {
    memset(r, 0, sizeof *r);
    char f[256];
    const char *content, *lit;
    snprintf(f, sizeof f, "%s.content", field);
    if (m2d_tkj_string(path, obj, "content", f, &content)) return -1;
    if (!content) return m2d_tkj_err(path, f, "expected a string");
    if (m2d_tkre_pattern(path, obj, field, &r->re, &lit)) return -1;
    r->content = m2d_strdup(content);
    r->content_n = strlen(content);
    if (lit && *lit) { /* a plain substring search finds the same matches, faster */
        pcre2_code_free(r->re);
        r->re = NULL;
        r->lit = m2d_strdup(lit);
        r->lit_n = strlen(lit);
    }
    return 0;
}

void m2d_tkreplace_free(m2d_tkreplace *r) {
    pcre2_code_free(r->re);
    free(r->lit);
    free(r->content);
    memset(r, 0, sizeof *r);
}


int m2d_tkreplace_apply(const m2d_tkreplace *r, pcre2_match_data *md, m2d_tkspans *d, const char *s, size_t n,
                        m2d_tkbuf *out, int *start_deleted) {
    if (r->lit) m2d_tk_find_literal(r->lit, r->lit_n, s, n, d);
    else if (m2d_tkre_find(r->re, md, s, n, d)) return -1;
    m2d_tkbuf_put(out, "", 0); /* a valid (NUL-terminated) buffer even for empty results */
    for (size_t i = 0; i < d->n; i++) {
        const m2d_tkspan *sp = &d->v[i];
        if (!sp->m) m2d_tkbuf_put(out, s + sp->s, sp->e - sp->s);
        else m2d_tkbuf_put(out, r->content, r->content_n);
        if (sp->m && sp->s == 0 && sp->e > 0 && !r->content_n && start_deleted) *start_deleted = 1;
    }
    return 0;
}
