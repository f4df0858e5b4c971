/* ppl — WikiText-2 perplexity, two protocols (SPEC §5):
 *   gptq:    rows of the raw file joined with "\n\n", encoded once without BOS, cut into
 *            floor(n/L) non-overlapping windows of L tokens; tokens 1..L-1 of each window are
 *            predicted from their prefix; ppl = exp(mean NLL).
 *   lm-eval: document split, wikitext detokenizer, rolling windows with prefix token BOS (or
 *            EOS), word/byte perplexity and bits per byte over sums (data/LM_EVAL_TASKS.md §6).
 * The cores take an engine and a tokenizer, so in-memory students are evaluated the same way. */
#ifndef M2D_PPL_H
#define M2D_PPL_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    const char *protocol;   /* "gptq" or "lm-eval" */
    int seq_len;            /* L actually used */
    int windows;            /* windows evaluated */
    int64_t tokens_scored;  /* predictions summed */
    double nll_sum;         /* -sum log p (natural log) */
    double ppl;             /* gptq: exp(nll_sum / tokens_scored) */
    int docs;               /* lm-eval: documents scored (all of their windows) */
    int64_t words, bytes;   /* lm-eval: counts over the scored documents' original text */
    double word_perplexity, byte_perplexity, bits_per_byte;
    double seconds;
} m2d_ppl_result;

/* Choose L: requested (0: default 2048 for gptq, max_position_embeddings for lm-eval), which must
 * not exceed max_position_embeddings (error), and must be >= 2. */
int m2d_ppl_seq_len(const m2d_engine *e, const char *protocol, int requested, int *L);

/* TEXT: the raw wiki.*.raw file content (UTF-8, len bytes). max_windows 0 = all. */
int m2d_ppl_gptq(m2d_engine *e, const m2d_tokenizer *tk, const char *text, size_t len, int seq_len,
                 int max_windows, m2d_ppl_result *out);
/* The gptq scoring of already-encoded tokens (the core of m2d_ppl_gptq, which encodes the text
 * on every call; the sweep encodes once): floor(n/L) windows (at most max_windows when > 0);
 * tokens 1..L-1 of each window are predicted from their prefix. Fills seq_len, windows,
 * tokens_scored, nll_sum and ppl of OUT (nothing else). PROGRESS_LABEL: shown on a terminal;
 * NULL: silent (e.g. inside the sweep's own progress). */
int m2d_ppl_gptq_tokens(m2d_engine *e, const int32_t *ids, size_t n, int L, int max_windows,
                        const char *progress_label, m2d_ppl_result *out);
/* max_windows > 0 stops before the first document whose windows would exceed the budget: at
 * most max_windows windows are scored, and pages past the budget are not even tokenized. Whole
 * documents only: when the first one alone exceeds the budget, -1 + m2d_err (nothing scored). */
int m2d_ppl_lmeval(m2d_engine *e, const m2d_tokenizer *tk, const char *text, size_t len, int seq_len,
                   int max_windows, m2d_ppl_result *out);

/* ---- pieces, exposed for tests ---- */
/* The HF rows of the raw file joined with "\n\n" (malloc'd). */
char *m2d_ppl_gptq_text(const char *raw, size_t len, size_t *out_len);
/* Pages of the document-level dataset (malloc'd array of malloc'd strings). */
int m2d_ppl_split_pages(const char *raw, size_t len, char ***pages, int *n_pages);
void m2d_ppl_free_pages(char **pages, int n_pages);
/* lm-eval's wikitext_detokenizer (malloc'd); NULL + m2d_err on a regex failure. */
char *m2d_ppl_detokenize(const char *page);
/* len(re.split(r"\s+", page)) with Python's Unicode whitespace. */
int64_t m2d_ppl_count_words(const char *page);

/* Rolling windows over n tokens with max length L (context_len 1), on the stream s = [P] + t:
 * the window's input is s[in_start, in_start + in_len) and it scores its last score_len
 * predictions, i.e. targets s[in_start + in_len - score_len + 1 .. in_start + in_len]. */
typedef struct { int in_start, in_len, score_len; } m2d_ppl_window;
/* *win malloc'd; n_win = 0 when n == 0. */
int m2d_ppl_rolling_windows(int n, int L, m2d_ppl_window **win, int *n_win);

/* -1 + m2d_err("WHAT: invalid UTF-8 at byte offset N") when text is not UTF-8. */
int m2d_ppl_check_utf8(const char *what, const char *text, size_t len);

#endif
