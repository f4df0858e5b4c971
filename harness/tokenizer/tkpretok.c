/* tkpretok — the pre-tokenizers of a tokenizer.json (HF `pre_tokenizers`): Split (a regex with
 * Oniguruma's meaning), ByteLevel, Metaspace, Digits and Sequences of them, run as a chain of stages
 * whose last hands each piece to BPE. */
#include "tokenizer/tkimpl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int load_split(stage *st, const loadctx *L, const cJSON *pt, const char *field) {
    char f[256];
    st->kind = STAGE_SPLIT;
    if (m2d_tkre_pattern(L->path, pt, field, &st->re, NULL)) return -1;
    snprintf(f, sizeof f, "%s.behavior", field);
    const char *beh;
    if (m2d_tkj_string(L->path, pt, "behavior", f, &beh)) return -1;
    static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    st->behavior = -1;
    for (int i = 0; i < 5; i++)
        if (beh && !strcmp(beh, names[i])) st->behavior = i;
    if (st->behavior < 0)
        return m2d_tkj_unsupported(L->path, f, beh ? beh : "(missing)",
                                   "Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous");
    snprintf(f, sizeof f, "%s.invert", field);
    return m2d_tkj_bool(L->path, pt, "invert", f, 0, &st->invert);
}

static int load_bytelevel(stage *st, const loadctx *L, const cJSON *pt, const char *field) {
    char f[256];
    int use_regex;
    st->kind = STAGE_BYTELEVEL;
    snprintf(f, sizeof f, "%s.add_prefix_space", field);
    if (m2d_tkj_bool(L->path, pt, "add_prefix_space", f, 1, &st->add_prefix_space)) return -1;
    snprintf(f, sizeof f, "%s.use_regex", field);
    if (m2d_tkj_bool(L->path, pt, "use_regex", f, 1, &use_regex)) return -1;
    return use_regex ? m2d_tkre_compile(L->path, field, GPT2_PATTERN, 0, &st->re) : 0;
}

/* Digits: every numeric character its own piece (individual_digits), or runs of them. */
static int load_digits(stage *st, const loadctx *L, const cJSON *pt, const char *field) {
    char f[256];
    int individual;
    st->kind = STAGE_DIGITS;
    snprintf(f, sizeof f, "%s.individual_digits", field);
    if (m2d_tkj_bool(L->path, pt, "individual_digits", f, 0, &individual)) return -1;
    st->behavior = individual ? M2D_SPLIT_ISOLATED : M2D_SPLIT_CONTIGUOUS;
    return 0;
}

int m2d_tkpretok_load(m2d_tokenizer *tk, const loadctx *L, const cJSON *pt, const char *field) {
    if (!pt || cJSON_IsNull(pt)) return 0;
    char f[256];
    const char *type;
    if (m2d_tkj_type(L->path, pt, field, &type)) return -1;
    if (!strcmp(type, "Sequence")) return m2d_tk_load_sequence(tk, L, pt, field, "pretokenizers", m2d_tkpretok_load);
    if (tk->n_stages == MAX_STAGES) return m2d_tk_field_err(L, field, "too many pre-tokenizers");
    stage *st = &tk->stages[tk->n_stages++]; /* owned (and freed) from here on */
    memset(st, 0, sizeof *st);
    if (!strcmp(type, "Split")) return load_split(st, L, pt, field);
    if (!strcmp(type, "ByteLevel")) return load_bytelevel(st, L, pt, field);
    if (!strcmp(type, "Digits")) return load_digits(st, L, pt, field);
    if (!strcmp(type, "Metaspace")) {
        st->kind = STAGE_METASPACE;
        return m2d_tkj_metaspace(L->path, pt, field, &st->meta);
    }
    snprintf(f, sizeof f, "%s.type", field);
    return m2d_tkj_unsupported(L->path, f, type, "Split, ByteLevel, Metaspace, Digits, Sequence");
}

/* -- pre-tokenization --------------------------------------------------------------------------- */

int m2d_tkpretok_run(enc_ctx *c, int depth, const char *s, size_t n, int first);

/* The kept spans of c->depth[depth] (pieces of s) on to the next stage, each mapped to the
 * byte-level alphabet when byte_level. A piece is "first" when it starts where s does and s
 * starts at the input's offset 0 (HF: offsets_original().0 == 0). */
static int next_stage_pieces(enc_ctx *c, int depth, const char *s, int first, int byte_level) {
    depth_scratch *d = &c->depth[depth];
    /* deeper stages use their own scratch, so d->spans and d->buf2 survive the recursion */
    int rc = 0;
    for (size_t i = 0; i < d->spans.n && !rc; i++) {
        const m2d_tkspan *sp = &d->spans.v[i];
        if (sp->m || sp->e == sp->s) continue;
        const char *p = s + sp->s;
        size_t len = sp->e - sp->s;
        int piece_first = first && sp->s == 0;
        if (!byte_level) {
            rc = m2d_tkpretok_run(c, depth + 1, p, len, piece_first);
            continue;
        }
        m2d_tk_reserve(&d->buf2, &d->cap2, 2 * len);
        size_t o = 0;
        for (size_t j = 0; j < len; j++) {
            size_t k;
            const char *u = m2d_bytelevel_char((unsigned char)p[j], &k);
            memcpy(d->buf2 + o, u, k);
            o += k;
        }
        rc = m2d_tkpretok_run(c, depth + 1, d->buf2, o, piece_first);
    }
    return rc;
}

/* ByteLevel: optional prefix space, optional GPT-2 split, then bytes -> alphabet. */
static int bytelevel_stage(enc_ctx *c, int depth, const stage *st, const char *s, size_t n, int first) {
    depth_scratch *d = &c->depth[depth];
    if (st->add_prefix_space && s[0] != ' ') {
        m2d_tk_reserve(&d->buf, &d->cap, n + 1);
        d->buf[0] = ' ';
        memcpy(d->buf + 1, s, n);
        s = d->buf;
        n++;
    }
    if (m2d_tkre_find(st->re, c->rs.md, s, n, &d->spans)) return -1;
    m2d_tkspans_split(&d->spans, M2D_SPLIT_ISOLATED, 0);
    return next_stage_pieces(c, depth, s, first, 1);
}

/* Metaspace: spaces become the replacement, which is prepended (prepend_scheme "always", or
 * "first" on the input's first piece) unless already there; split: cut before each one. */
static int metaspace_stage(enc_ctx *c, int depth, const stage *st, const char *s, size_t n, int first) {
    depth_scratch *d = &c->depth[depth];
    const m2d_tkmetaspace *m = &st->meta;
    size_t spaces = 0, o = 0;
    for (size_t i = 0; i < n; i++) spaces += s[i] == ' ';
    m2d_tk_reserve(&d->buf, &d->cap, n + (spaces + 1) * m->repl_n);
    int starts = s[0] == ' ' || (n >= m->repl_n && !memcmp(s, m->repl, m->repl_n));
    if (!starts && (m->scheme == M2D_PREPEND_ALWAYS || (m->scheme == M2D_PREPEND_FIRST && first)))
        memcpy(d->buf, m->repl, m->repl_n), o = m->repl_n;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != ' ') d->buf[o++] = s[i];
        else memcpy(d->buf + o, m->repl, m->repl_n), o += m->repl_n;
    }
    if (!m->split) return m2d_tkpretok_run(c, depth + 1, d->buf, o, first);
    m2d_tk_find_literal(m->repl, m->repl_n, d->buf, o, &d->spans);
    m2d_tkspans_split(&d->spans, M2D_SPLIT_MERGED_NEXT, 0);
    return next_stage_pieces(c, depth, d->buf, first, 0);
}

int m2d_tkpretok_run(enc_ctx *c, int depth, const char *s, size_t n, int first) {
    const m2d_tokenizer *tk = c->tk;
    if (n == 0) return 0;
    if (depth == tk->n_stages) {
        m2d_tkbpe_piece(c, s, n);
        return 0;
    }
    const stage *st = &tk->stages[depth];
    depth_scratch *d = &c->depth[depth];
    switch (st->kind) {
    case STAGE_SPLIT:
        if (m2d_tkre_find(st->re, c->rs.md, s, n, &d->spans)) return -1;
        m2d_tkspans_split(&d->spans, st->behavior, st->invert);
        return next_stage_pieces(c, depth, s, first, 0);
    case STAGE_DIGITS:
        m2d_tk_find_chars(m2d_is_numeric, s, n, &d->spans);
        m2d_tkspans_split(&d->spans, st->behavior, 0);
        return next_stage_pieces(c, depth, s, first, 0);
    case STAGE_METASPACE:
        return metaspace_stage(c, depth, st, s, n, first);
    default:
        return bytelevel_stage(c, depth, st, s, n, first);
    }
}
