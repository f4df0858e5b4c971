/* tktext — what the tokenizer's pipeline (tokenizer.c) and its decoders (tkdecode.c) share:
 * UTF-8 as Rust handles it, the GPT-2 byte-level alphabet, growable byte buffers, tokenizer.json
 * field access with one-line errors naming the field, and regexes with Oniguruma's meaning (HF
 * compiles its patterns with Oniguruma, moe2dense with PCRE2) cut into pieces the way HF's
 * Pattern::find_matches and NormalizedString::split cut them. */
#ifndef M2D_TKTEXT_H
#define M2D_TKTEXT_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>
#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

/* ---- UTF-8 ---- */
/* Length of the valid sequence at s[i..n) (1..4, *cp set), or minus the length of the maximal
 * invalid subpart there (what Rust's from_utf8_lossy replaces by one U+FFFD). */
int m2d_utf8_next(const unsigned char *s, size_t n, size_t i, uint32_t *cp);
/* Offset of the first invalid byte, or n when s[0..n) is valid UTF-8. */
size_t m2d_utf8_first_invalid(const char *s, size_t n);
int m2d_utf8_put(char *out, uint32_t cp);
/* Code point ending just before s[end] (s valid UTF-8, end > 0); *start gets its offset. */
uint32_t m2d_utf8_prev(const char *s, size_t end, size_t *start);
/* Unicode White_Space (Rust's char::is_whitespace, Oniguruma's \s). */
int m2d_is_white_space(uint32_t c);
/* Rust regex / Oniguruma \w: Alphabetic, Mark, Decimal_Number, Connector_Punctuation, Join_Control. */
int m2d_is_word_char(uint32_t c);
/* Rust char::is_numeric: general category Nd, Nl or No. */
int m2d_is_numeric(uint32_t c);

/* ---- growable bytes ---- */
typedef struct {
    char *p;
    size_t n, cap;
} m2d_tkbuf;
void m2d_tkbuf_put(m2d_tkbuf *b, const void *s, size_t n); /* keeps room for a NUL after n */
/* Appends s with each maximal invalid UTF-8 subpart replaced by U+FFFD (from_utf8_lossy). */
void m2d_tkbuf_put_lossy(m2d_tkbuf *b, const char *s, size_t n);
/* Grow *buf (capacity *cap) to hold need bytes. */
void m2d_tk_reserve(char **buf, size_t *cap, size_t need);

/* ---- GPT-2 byte-level alphabet (bytes_to_unicode) ---- */
void m2d_bytelevel_init(void);                          /* idempotent, thread-safe */
const char *m2d_bytelevel_char(unsigned char b, size_t *len); /* UTF-8 of byte b's character */
int m2d_bytelevel_byte(uint32_t cp);                    /* the byte of an alphabet character, else -1 */

/* ---- tokenizer.json fields (errors: "PATH: field 'FIELD': ...", one line) ---- */
int m2d_tkj_err(const char *path, const char *field, const char *what);
int m2d_tkj_unsupported(const char *path, const char *field, const char *value, const char *supported);
const cJSON *m2d_tkj_get(const cJSON *obj, const char *name);
/* Optional boolean (absent/null -> dflt). */
int m2d_tkj_bool(const char *path, const cJSON *obj, const char *name, const char *field, int dflt, int *out);
/* Optional string (absent/null -> NULL). */
int m2d_tkj_string(const char *path, const cJSON *obj, const char *name, const char *field, const char **out);
/* Required "type" string of a component at FIELD (FIELD.type in errors). */
int m2d_tkj_type(const char *path, const cJSON *obj, const char *field, const char **type);

/* Metaspace fields, as the pre-tokenizer and the decoder of that name read them: replacement (one
 * character, its UTF-8 in repl), prepend_scheme (or the legacy add_prefix_space), split. */
enum { M2D_PREPEND_ALWAYS, M2D_PREPEND_FIRST, M2D_PREPEND_NEVER };
typedef struct {
    char repl[5];
    size_t repl_n;
    int scheme, split;
} m2d_tkmetaspace;
int m2d_tkj_metaspace(const char *path, const cJSON *obj, const char *field, m2d_tkmetaspace *out);

/* ---- regexes with Oniguruma's meaning ---- */
/* Compile PATTERN as HF does (Oniguruma, Ruby syntax: \s \w \h with their Unicode meanings, ^ and $
 * at line ends) or, with literal, as an escaped string. Errors name FIELD. */
int m2d_tkre_compile(const char *path, const char *field, const char *pattern, int literal, pcre2_code **out);
/* A {"String": s} or {"Regex": r} pattern object at FIELD (e.g. pre_tokenizer.pattern). */
int m2d_tkre_pattern(const char *path, const cJSON *obj, const char *field, pcre2_code **out, const char **string);

typedef struct {
    size_t s, e;
    int m; /* find: 1 = a match; after m2d_tkspans_split: 1 = drop */
} m2d_tkspan;
typedef struct {
    m2d_tkspan *v;
    size_t n, cap;
} m2d_tkspans;
void m2d_tkspans_push(m2d_tkspans *d, size_t s, size_t e, int m);

/* HF Pattern::find_matches over Oniguruma's find_iter: the (offsets, is_match) list covering
 * s[0..n) (an empty s gives no spans). re NULL = one unmatched span. -1 (message set) on a
 * matcher failure. md: match data of re's size (pcre2_match_data_create(1, NULL)). */
int m2d_tkre_find(const pcre2_code *re, pcre2_match_data *md, const char *s, size_t n, m2d_tkspans *out);
/* The same for a non-empty literal string (each occurrence, left to right, not overlapping). */
void m2d_tk_find_literal(const char *lit, size_t lit_n, const char *s, size_t n, m2d_tkspans *out);
/* The same for a character predicate (HF's Fn(char) -> bool patterns: every matching character
 * is its own match). */
void m2d_tk_find_chars(int (*pred)(uint32_t), const char *s, size_t n, m2d_tkspans *out);

enum { M2D_SPLIT_REMOVED, M2D_SPLIT_ISOLATED, M2D_SPLIT_MERGED_PREV, M2D_SPLIT_MERGED_NEXT, M2D_SPLIT_CONTIGUOUS };
/* A SplitDelimiterBehavior applied to found spans in place (HF NormalizedString::split); the
 * resulting span.m is 1 for spans to drop. */
void m2d_tkspans_split(m2d_tkspans *d, int behavior, int invert);

/* ---- Replace (normalizer and decoder): every match of a pattern becomes content ---- */
typedef struct {
    pcre2_code *re;  /* NULL when lit is used */
    char *lit;       /* a non-empty String pattern: plain substring search */
    size_t lit_n;
    char *content;
    size_t content_n;
} m2d_tkreplace;
/* {"type": "Replace", "pattern": {...}, "content": "..."} at FIELD. */
int m2d_tkreplace_load(m2d_tkreplace *r, const char *path, const cJSON *obj, const char *field);
void m2d_tkreplace_free(m2d_tkreplace *r);
/* Appends s[0..n) with the matches replaced to out; *at_start is set when a match at offset 0 was
 * replaced by nothing (the text no longer starts where the original did). */
int m2d_tkreplace_apply(const m2d_tkreplace *r, pcre2_match_data *md, m2d_tkspans *scratch, const char *s, size_t n,
                        m2d_tkbuf *out, int *start_deleted);

#endif
