/* ppl — WikiText-2 perplexity (SPEC §5; lm-eval rules from data/LM_EVAL_TASKS.md §6). */
#include "evals/ppl.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <math.h>
#include <stdio.h>
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

/* Python's `\s` for str patterns is str.isspace(); PCRE2's \s (even with UCP) differs on
 * U+001C..U+001F and U+180E, so the class is spelled out. */
#define PY_WS "[\\t\\n\\x0b\\f\\r\\x1c-\\x1f \\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}]"

int m2d_ppl_check_utf8(const char *what, const char *text, size_t len) {
    const unsigned char *s = (const unsigned char *)text;
    for (size_t i = 0; i < len;) {
        unsigned c = s[i];
        size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (n == 0 || i + n > len) return m2d_err("%s: invalid UTF-8 at byte offset %zu", what, i);
        uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1f : n == 3 ? c & 0x0f : c & 0x07;
        for (size_t k = 1; k < n; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return m2d_err("%s: invalid UTF-8 at byte offset %zu", what, i);
            cp = cp << 6 | (s[i + k] & 0x3f);
        }
        static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return m2d_err("%s: invalid UTF-8 at byte offset %zu", what, i);
        i += n;
    }
    return 0;
}

/* ---- growable string ---- */
typedef struct { char *s; size_t n, cap; } sbuf;

static void sb_add(sbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->s = m2d_realloc(b->s, b->cap);
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

/* ---- gptq text ---- */
char *m2d_ppl_gptq_text(const char *raw, size_t len, size_t *out_len) {
    sbuf b = {0};
    sb_add(&b, "", 0);
    int first = 1;
    for (size_t i = 0; i < len;) {
        const char *nl = memchr(raw + i, '\n', len - i);
        size_t end = nl ? (size_t)(nl - raw) + 1 : len; /* a line keeps its "\n" (like Python file lines) */
        if (!first) sb_add(&b, "\n\n", 2);
        first = 0;
        if (!(end - i == 2 && raw[i] == ' ' && raw[i + 1] == '\n')) sb_add(&b, raw + i, end - i);
        i = end;
    }
    if (out_len) *out_len = b.n;
    return b.s;
}

/* ---- document split ---- */
static char *str_replace(const char *s, const char *from, const char *to) {
    sbuf b = {0};
    sb_add(&b, "", 0);
    size_t fl = strlen(from), tl = strlen(to);
    for (const char *p = s;;) {
        const char *q = strstr(p, from);
        if (!q) {
            sb_add(&b, p, strlen(p));
            break;
        }
        sb_add(&b, p, (size_t)(q - p));
        sb_add(&b, to, tl);
        p = q + fl;
    }
    return b.s;
}

/* The loader's title test: "= = =" -> "===", "= =" -> "==", strip(), starts with "= " and ends
 * with " =". strip() here removes ASCII whitespace only (Python strips Unicode whitespace too;
 * no line of wiki.*.raw has non-ASCII whitespace at its ends, and the page counts are tested). */
static int is_title(const char *line, size_t n) {
    char *tmp = m2d_malloc(n + 1);
    memcpy(tmp, line, n);
    tmp[n] = 0;
    char *a = str_replace(tmp, "= = =", "===");
    char *b = str_replace(a, "= =", "==");
    free(tmp);
    free(a);
    size_t s = 0, e = strlen(b);
    while (s < e && strchr(" \t\n\r\f\v", b[s])) s++;
    while (e > s && strchr(" \t\n\r\f\v", b[e - 1])) e--;
    int t = e - s >= 3 && b[s] == '=' && b[s + 1] == ' ' && b[e - 1] == '=' && b[e - 2] == ' ';
    free(b);
    return t;
}

static int is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strchr(" \t\n\r\f\v", s[i])) return 0;
    return 1;
}

int m2d_ppl_split_pages(const char *raw, size_t len, char ***pages, int *n_pages) {
    char **out = NULL;
    int np = 0, cap = 0;
    sbuf buf = {0};
    sb_add(&buf, "", 0);
    int buf_lines = 0;
    /* split on "\n": the final piece after the last "\n" (possibly empty) is a line too */
    for (size_t i = 0;;) {
        const char *nl = memchr(raw + i, '\n', len - i);
        size_t end = nl ? (size_t)(nl - raw) : len;
        if (is_title(raw + i, end - i)) {
            if (!is_blank(buf.s, buf.n)) {
                if (np == cap) out = m2d_realloc(out, sizeof(char *) * (size_t)(cap = cap ? cap * 2 : 64));
                out[np++] = m2d_strdup(buf.s);
            }
            buf.n = 0;
            buf.s[0] = 0;
            buf_lines = 0;
        }
        if (buf_lines++) sb_add(&buf, "\n", 1);
        sb_add(&buf, raw + i, end - i);
        if (!nl) break;
        i = end + 1;
    }
    if (np == cap) out = m2d_realloc(out, sizeof(char *) * (size_t)(cap + 1));
    out[np++] = buf.s; /* the remainder, unconditionally */
    *pages = out;
    *n_pages = np;
    return 0;
}

void m2d_ppl_free_pages(char **pages, int n_pages) {
    for (int i = 0; i < n_pages; i++) free(pages[i]);
    free(pages);
}

/* ---- detokenizer ---- */
/* re.sub(pattern, repl, s) with PCRE2 (UTF mode); repl uses PCRE2's $1 syntax. */
static char *regex_sub(const char *s, const char *pattern, const char *repl) {
    int errcode;
    PCRE2_SIZE erroff;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF, &errcode, &erroff, NULL);
    if (!re) {
        m2d_err("ppl: detokenizer: regex '%s' failed to compile at %zu", pattern, (size_t)erroff);
        return NULL;
    }
    size_t sl = strlen(s), cap = sl + 64;
    char *out = NULL;
    for (int attempt = 0; attempt < 2; attempt++) {
        out = m2d_malloc(cap + 1);
        PCRE2_SIZE olen = cap + 1;
        int rc = pcre2_substitute(re, (PCRE2_SPTR)s, sl, 0,
                                  PCRE2_SUBSTITUTE_GLOBAL | PCRE2_SUBSTITUTE_OVERFLOW_LENGTH | PCRE2_NO_UTF_CHECK,
                                  NULL, NULL, (PCRE2_SPTR)repl, PCRE2_ZERO_TERMINATED, (PCRE2_UCHAR *)out, &olen);
        if (rc >= 0) break;
        free(out);
        out = NULL;
        if (rc != PCRE2_ERROR_NOMEMORY || attempt) {
            m2d_err("ppl: detokenizer: regex '%s' substitution failed (%d)", pattern, rc);
            break;
        }
        cap = olen;
    }
    pcre2_code_free(re);
    return out;
}

char *m2d_ppl_detokenize(const char *page) {
    static const char *const plain1[][2] = {{"s '", "s'"}};
    static const char *const plain3[][2] = {
        {" @-@ ", "-"}, {" @,@ ", ","}, {" @.@ ", "."}, {" : ", ": "}, {" ; ", "; "},
        {" . ", ". "},  {" ! ", "! "},  {" ? ", "? "},  {" , ", ", "},
    };
    static const char *const regexes[][2] = {
        {"\\(" PY_WS "*([^\\)]*?)" PY_WS "*\\)", "($1)"},
        {"\\[" PY_WS "*([^\\]]*?)" PY_WS "*\\]", "[$1]"},
        {"\\{" PY_WS "*([^}]*?)" PY_WS "*\\}", "{$1}"},
        {"\"" PY_WS "*([^\"]*?)" PY_WS "*\"", "\"$1\""},
        {"'" PY_WS "*([^']*?)" PY_WS "*'", "'$1'"},
    };
    static const char *const plain6[][2] = {
        {"= = = =", "===="}, {"= = =", "==="}, {"= =", "=="}, {" \xc2\xb0 ", "\xc2\xb0"},
        {" \n", "\n"},       {"\n ", "\n"},     {" N ", " 1 "}, {" 's", "'s"},
    };
    char *s = m2d_strdup(page), *t;
#define STEP(expr) do { t = (expr); free(s); if (!t) return NULL; s = t; } while (0)
    STEP(str_replace(s, plain1[0][0], plain1[0][1]));
    /* lm-eval writes re.sub(r"/' [0-9]/", r"/'[0-9]/"): slashes included, literal replacement */
    STEP(regex_sub(s, "/' [0-9]/", "/'[0-9]/"));
    for (size_t i = 0; i < M2D_ARRAY_LEN(plain3); i++) STEP(str_replace(s, plain3[i][0], plain3[i][1]));
    for (size_t i = 0; i < M2D_ARRAY_LEN(regexes); i++) STEP(regex_sub(s, regexes[i][0], regexes[i][1]));
    for (size_t i = 0; i < M2D_ARRAY_LEN(plain6); i++) STEP(str_replace(s, plain6[i][0], plain6[i][1]));
#undef STEP
    return s;
}

int64_t m2d_ppl_count_words(const char *page) {
    int errcode;
    PCRE2_SIZE erroff;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)PY_WS "+", PCRE2_ZERO_TERMINATED, PCRE2_UTF, &errcode, &erroff, NULL);
    if (!re) return -1;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    size_t len = strlen(page), off = 0;
    int64_t pieces = 1;
    while (off <= len && pcre2_match(re, (PCRE2_SPTR)page, len, off, PCRE2_NO_UTF_CHECK, md, NULL) >= 0) {
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        pieces++;
        off = ov[1];
    }
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return pieces;
}

/* ---- rolling windows (lm-eval get_rolling_token_windows + make_disjoint_window, context_len 1) ---- */
int m2d_ppl_rolling_windows(int n, int L, m2d_ppl_window **win, int *n_win) {
    *win = NULL;
    *n_win = 0;
    if (L < 1) return m2d_err("ppl: rolling windows: max length %d < 1", L);
    if (n <= 0) return 0;
    int cap = n / L + 2, k = 0;
    m2d_ppl_window *w = m2d_malloc(sizeof *w * (size_t)cap);
    int first = M2D_MIN(L, n);
    w[k++] = (m2d_ppl_window){0, first, first}; /* [P] + t[0 : first-1] scores t[0 : first] */
    for (int pred = first; pred < n;) {
        int r = M2D_MIN(n - pred, L), end = pred + r;
        /* input t[end-L-1 : end-1] = s[end-L : end] (s = [P] + t), scoring its last r predictions */
        w[k++] = (m2d_ppl_window){end - L, L, r};
        pred = end;
    }
    *win = w;
    *n_win = k;
    return 0;
}

/* ---- the two protocols ---- */
int m2d_ppl_seq_len(const m2d_engine *e, const char *protocol, int requested, int *L) {
    int maxpos = m2d_engine_model(e)->cfg.max_position_embeddings;
    if (requested > maxpos)
        return m2d_err("ppl: --seq-len %d exceeds the model's max_position_embeddings %d", requested, maxpos);
    if (requested != 0 && requested < 2) return m2d_err("ppl: --seq-len %d < 2", requested);
    if (requested) *L = requested;
    else *L = strcmp(protocol, "gptq") == 0 ? M2D_MIN(2048, maxpos) : maxpos;
    return 0;
}

static int encode(const m2d_tokenizer *tk, const char *s, size_t n, int32_t **ids, size_t *n_ids) {
    return m2d_tokenizer_encode(tk, s, n, ids, n_ids);
}

/* What both protocols do first: OUT reset for PROTOCOL (a literal), the text non-empty and UTF-8,
 * the window length *L chosen. */
static int start(m2d_engine *e, const char *protocol, const char *text, size_t len, int seq_len,
                 m2d_ppl_result *out, int *L) {
    memset(out, 0, sizeof *out);
    out->protocol = protocol;
    if (len == 0) return m2d_err("ppl: %s: empty text", protocol);
    char what[32];
    snprintf(what, sizeof what, "ppl: %s text", protocol);
    if (m2d_ppl_check_utf8(what, text, len)) return -1;
    return m2d_ppl_seq_len(e, protocol, seq_len, L);
}

int m2d_ppl_gptq_tokens(m2d_engine *e, const int32_t *ids, size_t n, int L, int max_windows,
                        const char *progress_label, m2d_ppl_result *out) {
    int nw = (int)(n / (size_t)L);
    if (max_windows > 0) nw = M2D_MIN(nw, max_windows);
    if (nw == 0) return m2d_err("ppl: gptq: %zu tokens is less than one window of %d", n, L);
    m2d_window_arrays a;
    m2d_window_arrays_init(&a, nw);
    for (int w = 0; w < nw; w++) { /* positions 0..L-2 predict tokens 1..L-1 (the last predicts nothing) */
        a.tokens[w] = ids + (size_t)w * L;
        a.targets[w] = a.tokens[w] + 1;
        a.lens[w] = L - 1;
        a.lp[w] = m2d_malloc(sizeof(double) * (size_t)L);
    }
    int rc = m2d_engine_logprobs_windows(e, &a.set, progress_label);
    double nll = 0;
    for (int w = 0; rc == 0 && w < nw; w++)
        for (int i = 0; i < L - 1; i++) nll -= a.lp[w][i];
    m2d_window_arrays_free(&a);
    if (rc) return -1;
    out->seq_len = L;
    out->windows = nw;
    out->tokens_scored = (int64_t)nw * (L - 1);
    out->nll_sum = nll;
    out->ppl = exp(nll / (double)out->tokens_scored);
    return 0;
}

int m2d_ppl_gptq(m2d_engine *e, const m2d_tokenizer *tk, const char *text, size_t len, int seq_len,
                 int max_windows, m2d_ppl_result *out) {
    double t0 = m2d_now();
    int L;
    if (start(e, "gptq", text, len, seq_len, out, &L)) return -1;
    size_t jl;
    char *joined = m2d_ppl_gptq_text(text, len, &jl);
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = encode(tk, joined, jl, &ids, &n);
    free(joined);
    if (rc == 0) rc = m2d_ppl_gptq_tokens(e, ids, n, L, max_windows, "ppl gptq", out);
    free(ids);
    if (rc) return -1;
    out->seconds = m2d_now() - t0;
    return 0;
}

/* One page detokenized and encoded (lm-eval's wikitext doc_to_target). */
static int encode_page(const m2d_tokenizer *tk, const char *page, int32_t **ids, size_t *n) {
    char *det = m2d_ppl_detokenize(page);
    if (!det) return -1;
    int rc = encode(tk, det, strlen(det), ids, n);
    free(det);
    return rc;
}

/* window W of A: s = [P] + t (s[j] = j ? t[j-1] : P), input s[a, a+m), targets s[a+1 .. a+m], the
 * last r positions scored */
static void rolling_input(m2d_window_arrays *A, int w, const m2d_ppl_window *win, const int32_t *t, int32_t P) {
    int a = win->in_start, m = win->in_len, r = win->score_len;
    int32_t *in = m2d_malloc(sizeof(int32_t) * (size_t)(m + 1));
    for (int j = 0; j <= m; j++) in[j] = a + j == 0 ? P : t[a + j - 1];
    A->tokens[w] = in, A->targets[w] = in + 1, A->lens[w] = m, A->first[w] = m - r;
    A->lp[w] = m2d_malloc(sizeof(double) * (size_t)M2D_MAX(r, 1));
}

int m2d_ppl_lmeval(m2d_engine *e, const m2d_tokenizer *tk, const char *text, size_t len, int seq_len,
                   int max_windows, m2d_ppl_result *out) {
    double t0 = m2d_now();
    int L;
    if (start(e, "lm-eval", text, len, seq_len, out, &L)) return -1;
    int P = m2d_tokenizer_bos_id(tk);
    if (P < 0) P = m2d_tokenizer_eos_id(tk);
    const m2d_config *c = &m2d_engine_model(e)->cfg;
    if (P < 0) P = c->bos_token_id >= 0 ? c->bos_token_id : c->eos_token_id;
    if (P < 0) return m2d_err("ppl: lm-eval: the tokenizer and the model have neither a BOS nor an EOS token");
    char **pages;
    int n_pages;
    m2d_ppl_split_pages(text, len, &pages, &n_pages);
    /* the documents scored: all, or the first ones whose windows fit the budget (each page
     * tokenized when it is reached, so the work stays bounded by the budget, not by the file) */
    int32_t **toks = m2d_calloc((size_t)n_pages, sizeof(int32_t *));
    size_t *ntok = m2d_calloc((size_t)n_pages, sizeof(size_t));
    m2d_ppl_window **win = m2d_calloc((size_t)n_pages, sizeof *win); /* each document's rolling windows */
    int *dw = m2d_calloc((size_t)n_pages, sizeof(int));
    int rc = 0, docs = 0, nw = 0;
    for (int d = 0; d < n_pages && rc == 0; d++, docs++) {
        if ((rc = encode_page(tk, pages[d], &toks[d], &ntok[d]))) break;
        m2d_ppl_rolling_windows((int)ntok[d], L, &win[d], &dw[d]);
        if (max_windows > 0 && nw + dw[d] > max_windows) {
            if (docs == 0)
                rc = m2d_err("ppl: lm-eval: --max-windows %d: the first document alone needs %d windows of %d tokens, and "
                             "this protocol scores whole documents only (raise --max-windows, or use --protocol gptq)",
                             max_windows, dw[d], L);
            break;
        }
        nw += dw[d];
    }
    /* then every window of those documents in one pass */
    m2d_window_arrays a;
    m2d_window_arrays_init(&a, nw);
    for (int d = 0, w = 0; d < docs && rc == 0; d++)
        for (int i = 0; i < dw[d]; i++, w++) rolling_input(&a, w, &win[d][i], toks[d], P);
    if (rc == 0) rc = m2d_engine_logprobs_windows(e, &a.set, "ppl lm-eval");
    double loglik = 0;
    for (int d = 0, w = 0; rc == 0 && d < docs; d++) {
        double doc_ll = 0; /* summed per document first, as lm-eval does */
        for (int i = 0; i < dw[d]; i++, w++) {
            for (int j = 0; j < a.lens[w] - a.first[w]; j++) doc_ll += a.lp[w][j];
            out->tokens_scored += a.lens[w] - a.first[w];
        }
        loglik += doc_ll;
        out->words += m2d_ppl_count_words(pages[d]);
        out->bytes += (int64_t)strlen(pages[d]);
    }
    out->docs = docs;
    out->windows = nw;
    for (int w = 0; w < nw; w++) free((void *)a.tokens[w]);
    m2d_window_arrays_free(&a);
    for (int d = 0; d < n_pages; d++) free(toks[d]), free(win[d]);
    free(toks); free(ntok); free(win); free(dw);
    m2d_ppl_free_pages(pages, n_pages);
    if (rc) return -1;
    out->seq_len = L;
    out->nll_sum = -loglik;
    out->word_perplexity = exp(-loglik / (double)out->words);
    out->byte_perplexity = exp(-loglik / (double)out->bytes);
    out->bits_per_byte = -loglik / (double)out->bytes / log(2.0);
    out->seconds = m2d_now() - t0;
    return 0;
}
