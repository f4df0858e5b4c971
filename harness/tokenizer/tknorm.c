/* tknorm — the normalizers of a tokenizer.json (HF `normalizers`): NFC, NFD, NFKC, NFKD (utf8proc),
 * Prepend, Replace and Sequences of them. */
#include "tokenizer/tkimpl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "base/util.h"

int m2d_tknorm_load(m2d_tokenizer *tk, const loadctx *L, const cJSON *nz, const char *field) {
    if (!nz || cJSON_IsNull(nz)) return 0;
    char f[256];
    const char *type;
    if (m2d_tkj_type(L->path, nz, field, &type)) return -1;
    if (!strcmp(type, "Sequence")) return m2d_tk_load_sequence(tk, L, nz, field, "normalizers", m2d_tknorm_load);
    static const char *names[] = {"NFC", "NFD", "NFKC", "NFKD", "Prepend", "Replace"};
    int kind = -1;
    for (int i = 0; i < 6; i++)
        if (!strcmp(type, names[i])) kind = i;
    snprintf(f, sizeof f, "%s.type", field);
    if (kind < 0) return m2d_tkj_unsupported(L->path, f, type, "NFC, NFD, NFKC, NFKD, Prepend, Replace, Sequence");
    if (tk->n_norms == MAX_STAGES) return m2d_tk_field_err(L, field, "too many normalizers");
    normalizer *nm = &tk->norms[tk->n_norms++]; /* owned (and freed) from here on */
    memset(nm, 0, sizeof *nm);
    nm->kind = kind;
    if (kind == NORM_REPLACE) return m2d_tkreplace_load(&nm->rep, L->path, nz, field);
    if (kind != NORM_PREPEND) return 0;
    const char *prepend;
    snprintf(f, sizeof f, "%s.prepend", field);
    if (m2d_tkj_string(L->path, nz, "prepend", f, &prepend)) return -1;
    if (!prepend) return m2d_tk_field_err(L, f, "expected a string");
    nm->prepend = m2d_strdup(prepend);
    nm->prepend_n = strlen(prepend);
    return 0;
}

static char *utf8proc_normal_form(const char *s, size_t *n, int form) {
    int opt = UTF8PROC_STABLE;
    switch (form) {
    case NORM_NFC: opt |= UTF8PROC_COMPOSE; break;
    case NORM_NFD: opt |= UTF8PROC_DECOMPOSE; break;
    case NORM_NFKC: opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    default: opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
    }
    utf8proc_uint8_t *out = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)*n, &out, (utf8proc_option_t)opt);
    if (r < 0) { /* cannot happen on valid UTF-8 */
        free(out);
        return NULL;
    }
    *n = (size_t)r;
    return (char *)out;
}

/* NFC touching only what can change. Characters below U+0300 (UTF-8 lead byte < 0xCC) are NFC
 * on their own, and the text can be cut before any ASCII character: it is a starter that never
 * composes with what precedes it and blocks canonical reordering. So only the stretches from the
 * last ASCII character before a character >= U+0300 to the next ASCII character are normalized.
 * Returns NULL when s is already NFC. */
static char *nfc_fast(const char *s, size_t *n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t len = *n, copied = 0, i = 0;
    char *out = NULL;
    size_t o = 0, cap = 0;
    while (i < len) {
        if (u[i] < 0xCC) {
            i++;
            continue;
        }
        size_t r = i, e = i;
        while (r > copied && u[r] >= 0x80) r--; /* back to an ASCII character (or the copied end) */
        while (e < len && u[e] >= 0x80) e++;    /* on to the next ASCII character */
        size_t m = e - r;
        char *norm = utf8proc_normal_form(s + r, &m, NORM_NFC);
        if (!norm) return out; /* not reached */
        if (!out) out = m2d_malloc(cap = len + len / 4 + 16);
        m2d_tk_reserve(&out, &cap, o + (r - copied) + m + 1);
        memcpy(out + o, s + copied, r - copied), o += r - copied;
        memcpy(out + o, norm, m), o += m;
        free(norm);
        copied = i = e;
    }
    if (!out) return NULL;
    m2d_tk_reserve(&out, &cap, o + (len - copied) + 1);
    memcpy(out + o, s + copied, len - copied), o += len - copied;
    out[o] = 0;
    *n = o;
    return out;
}

/* One normalizer on s[0..*n): *out gets a malloc'd result (*n updated), or NULL when s stays as it
 * is. *start_moved is set when the result no longer begins at the original first character (HF's
 * alignments then put the text's start past offset 0). */
static int apply_normalizer(const m2d_tokenizer *tk, const normalizer *nz, re_scratch *rs, const char *s, size_t *n,
                            char **out, int *start_moved) {
    *out = NULL;
    switch (nz->kind) {
    case NORM_PREPEND:
        if (*n == 0) return 0; /* HF prepends to non-empty text only */
        *out = m2d_malloc(nz->prepend_n + *n + 1);
        memcpy(*out, nz->prepend, nz->prepend_n);
        memcpy(*out + nz->prepend_n, s, *n);
        *n += nz->prepend_n;
        (*out)[*n] = 0;
        return 0;
    case NORM_REPLACE: {
        m2d_tkbuf b = {0};
        if (m2d_tkreplace_apply(&nz->rep, rs->md, &rs->spans, s, *n, &b, start_moved)) {
            free(b.p);
            return -1;
        }
        *out = b.p;
        *n = b.n;
        return 0;
    }
    case NORM_NFC:
        if (!tk->slow_paths) {
            *out = nfc_fast(s, n);
            return 0;
        }
        /* fall through */
    default:
        *out = utf8proc_normal_form(s, n, nz->kind);
        return 0;
    }
}

/* Apply the normalizers to *s (length *n). *s is left as it is when nothing changes, else it points
 * to a malloc'd string also stored in *owned. */
int m2d_tknorm_apply(const m2d_tokenizer *tk, re_scratch *rs, const char **s, size_t *n, char **owned, int *start_moved) {
    *owned = NULL;
    if (!tk->n_norms) return 0;
    if (tk->norms_unicode_only) {
        int ascii = 1;
        for (size_t i = 0; i < *n && ascii; i++) ascii = (unsigned char)(*s)[i] < 0x80;
        if (ascii) return 0; /* ASCII is invariant under all four normal forms */
    }
    for (int k = 0; k < tk->n_norms; k++) {
        char *next;
        if (apply_normalizer(tk, &tk->norms[k], rs, *s, n, &next, start_moved)) return -1;
        if (!next) continue;
        free(*owned);
        *owned = next;
        *s = next;
    }
    return 0;
}
