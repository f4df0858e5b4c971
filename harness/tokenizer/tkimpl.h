/* tkimpl — what the tokenizer's modules share and nothing else includes: the loaded tokenizer
 * (struct m2d_tokenizer), its normalizers, pre-tokenizer stages and added tokens, and an encode's
 * per-call context. The public API is tokenizer.h. The modules, in pipeline order:
 *   tokenizer.c  load (tokenizer.json, tokenizer_config.json), added tokens, encode, decode
 *   tknorm.c     normalizers (NFC/NFD/NFKC/NFKD via utf8proc, Prepend, Replace)
 *   tkpretok.c   pre-tokenizers (Split, ByteLevel, Metaspace, Digits), run as a chain of stages
 *   tkbpe.c      the BPE model: vocab, merges, word cuts, BPE of one piece
 *   tkmap.c      the hash maps under the vocab, the merges and an encode's memo
 * Short type names (stage, normalizer, enc_ctx, ...) are private to these files; the functions one
 * module calls in another carry the m2d_tk prefix. */
#ifndef M2D_TKIMPL_H
#define M2D_TKIMPL_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "tokenizer/tokenizer.h"
#include "tokenizer/tkdecode.h"
#include "tokenizer/tkmap.h"
#include "tokenizer/tkpost.h"
#include "tokenizer/tktext.h"
#include "base/util.h"

#define MAX_STAGES 16
/* ids index dense tables: bound them so a corrupt file cannot ask for gigabytes */
#define MAX_ID 16777215
#define MAX_ID_STR "16777215"

enum { NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD, NORM_PREPEND, NORM_REPLACE };
enum { STAGE_SPLIT, STAGE_BYTELEVEL, STAGE_METASPACE, STAGE_DIGITS };

typedef struct {
    int kind;
    char *prepend; /* Prepend */
    size_t prepend_n;
    m2d_tkreplace rep; /* Replace */
} normalizer;

typedef struct {
    int kind;
    pcre2_code *re;       /* Split pattern, or the GPT-2 regex for ByteLevel use_regex */
    int behavior, invert; /* Split; Digits: Isolated (individual_digits) or Contiguous */
    int add_prefix_space; /* ByteLevel */
    m2d_tkmetaspace meta; /* Metaspace */
} stage;

typedef struct {
    char *content; /* as given in tokenizer.json (what id -> token returns) */
    size_t len;
    char *match; /* what is searched for: content, normalized when normalized=true */
    size_t match_len;
    int32_t id;
    int single_word, lstrip, rstrip, normalized, special;
} added_token;

/* Added tokens matched leftmost-longest (HF: Aho-Corasick, MatchKind::LeftmostLongest). */
typedef struct {
    int *idx;         /* indices into tk->added, bucketed by first byte */
    int start[257];   /* bucket b is idx[start[b] .. start[b+1]) */
    int n;
} added_set;

struct m2d_tokenizer {
    char *path;
    m2d_strmap vocab;            /* model vocab: token -> id */
    m2d_pairmap merges;
    int32_t char_id[0x800];  /* vocab id of each one-character token below U+0800, -1 if none */
    int32_t n_ids;           /* max id + 1 */
    char **id_tok;           /* id -> token string (added tokens override), NULL for holes */
    uint32_t *id_len;
    added_token *added;
    int n_added;
    added_set raw_set, norm_set;
    normalizer norms[MAX_STAGES];
    int n_norms;
    int norms_unicode_only;  /* only Unicode normal forms: ASCII text is left as it is */
    stage stages[MAX_STAGES];
    int n_stages;
    m2d_tkdecoder *decoder;
    m2d_tkpost post;         /* add_special_tokens=True: ids around the text's */
    int32_t unk_id;         /* -1 when model.unk_token is null */
    int fuse_unk, byte_fallback, ignore_merges;
    char *subword_prefix, *word_suffix; /* continuing_subword_prefix / end_of_word_suffix */
    int32_t byte_fallback_id[256];
    int32_t bos_id, eos_id;
    size_t heap_threshold;
    m2d_pairmap cut_pairs;  /* adjacent code points inside some vocab token; word cuts on when allocated */
    size_t cut_min;
    int slow_paths; /* testing: full-text utf8proc NFC instead of nfc_fast */
};

/* Regex matching state, one per encode (or per load, for the added tokens' normalization). */
typedef struct {
    pcre2_match_data *md;
    m2d_tkspans spans;
} re_scratch;

typedef struct {
    const char *path;
} loadctx;

static inline int m2d_tk_field_err(const loadctx *L, const char *field, const char *what) { return m2d_tkj_err(L->path, field, what); }

/* a loader of one object of tokenizer.json (a normalizer, a pre-tokenizer) at FIELD */
typedef int (*m2d_tk_loader)(m2d_tokenizer *tk, const loadctx *L, const cJSON *node, const char *field);
/* a Sequence NODE at FIELD: each element of its array KEY through LOAD, in turn ("FIELD.KEY[i]") */
int m2d_tk_load_sequence(m2d_tokenizer *tk, const loadctx *L, const cJSON *node, const char *field, const char *key,
                         m2d_tk_loader load);

typedef struct {
    char *buf, *buf2;
    size_t cap, cap2;
    m2d_tkspans spans;
} depth_scratch;

typedef struct {
    const m2d_tokenizer *tk;
    int32_t *ids;
    size_t n, cap;
    depth_scratch depth[MAX_STAGES + 1];
    re_scratch rs;
    const char *text;      /* the input: a segment starting here starts at offset 0 */
    const char *norm_base; /* the normalized segment being pre-tokenized */
    int seg_first;         /* ... and whether it starts at offset 0 of the input */
    /* memo: piece bytes -> ids (value = offset into memo_ids; lengths in memo_len) */
    m2d_strmap memo;
    int32_t *memo_ids;
    size_t memo_n, memo_cap;
    uint32_t *memo_len;
    size_t memo_len_cap;
    /* BPE scratch */
    int32_t *sym, *prev, *next;
    size_t sym_cap;
    struct heap_item { int32_t rank, pos; } *heap;
    size_t heap_cap;
} enc_ctx;

static inline void m2d_tk_emit(enc_ctx *c, int32_t id) {
    if (c->n == c->cap) c->ids = m2d_realloc(c->ids, (c->cap = c->cap ? c->cap * 2 : 1024) * sizeof *c->ids);
    c->ids[c->n++] = id;
}

/* ---- tknorm.c ---- */
/* The normalizer object NZ at FIELD (JSON null: none; Sequence: each in turn) appended to tk->norms. */
int m2d_tknorm_load(m2d_tokenizer *tk, const loadctx *L, const cJSON *nz, const char *field);
/* Apply the normalizers to *s (length *n). *s is left as it is when nothing changes, else it points
 * to a malloc'd string also stored in *owned. */
int m2d_tknorm_apply(const m2d_tokenizer *tk, re_scratch *rs, const char **s, size_t *n, char **owned, int *start_moved);

/* ---- tkpretok.c ---- */
/* The pre_tokenizer object PT at FIELD (JSON null: none; Sequence: each in turn) appended to tk->stages. */
int m2d_tkpretok_load(m2d_tokenizer *tk, const loadctx *L, const cJSON *pt, const char *field);
/* Stage DEPTH and the ones after it on s[0..n), each piece the last stage leaves through BPE
 * (m2d_tkbpe_piece); FIRST: s starts at the input's offset 0. */
int m2d_tkpretok_run(enc_ctx *c, int depth, const char *s, size_t n, int first);

/* ---- tkbpe.c ---- */
/* The "model" object (type BPE): vocab, merges, unknown token, byte fallback, affixes. */
int m2d_tkbpe_load(m2d_tokenizer *tk, const loadctx *L, const cJSON *model);
/* The model vocab's id of token s[0..n), -1 if absent. */
int32_t m2d_tkbpe_token_id(const m2d_tokenizer *tk, const char *s, size_t n);
/* Where long words may be cut (tk->cut_pairs), once the stages and the vocab are loaded. */
void m2d_tkbpe_word_cuts(m2d_tokenizer *tk);
/* BPE of one pre-tokenized piece, ids emitted into c. */
void m2d_tkbpe_piece(enc_ctx *c, const char *w, size_t n);

#endif
