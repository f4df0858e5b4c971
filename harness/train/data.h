/* data — the distillation windows (SPEC §7): a text file encoded whole (no BOS) and cut into
 * floor(n / L) consecutive non-overlapping windows of L tokens; every position of every window
 * is a KD position. Sample i (0-based, counted over the whole run: step s takes samples
 * (s-1) B .. s B - 1) is window i mod W of epoch i / W, where W is the number of windows:
 *   sequential: window index i mod W (file order);
 *   shuffle:    a seeded permutation of the W windows, a fresh one per epoch (Fisher-Yates
 *               driven by splitmix64 from seed and epoch).
 * A sample's window depends only on (seed, order, i): resuming at a step needs no RNG state. */
#ifndef M2D_TRAIN_DATA_H
#define M2D_TRAIN_DATA_H

#include <stdint.h>
#include <stdio.h>

#include "tokenizer/tokenizer.h"

typedef enum { M2D_ORDER_SHUFFLE, M2D_ORDER_SEQUENTIAL } m2d_order;

int m2d_order_parse(const char *s, m2d_order *out); /* "shuffle" | "sequential" */
const char *m2d_order_name(m2d_order o);

typedef struct {
    int32_t *ids;
    int64_t n_ids;
    int L;
    int64_t n_windows;
    m2d_order order;
    uint64_t seed;
    int64_t *perm;          /* shuffle: the permutation of perm_epoch */
    int64_t perm_epoch;
    char ids_hash[65];      /* sha256 of the token ids (identity of the data for resume) */
} m2d_windows;

/* The training text of PATH (a regular file, m2d_read_file): NULL + m2d_err naming the file when
 * it is unreadable, empty, binary (NUL bytes) or not UTF-8. */
char *m2d_training_text_read(const char *path, size_t *len);
/* Encode PATH (m2d_training_text_read) with TK; -1 + m2d_err (naming the file) when it is not
 * training text or shorter than one window. */
int m2d_windows_open(const m2d_tokenizer *tk, const char *path, int L, m2d_order order, uint64_t seed,
                     m2d_windows *w);
/* The same from token ids already in memory (copied). */
int m2d_windows_from_ids(const int32_t *ids, int64_t n, const char *what, int L, m2d_order order, uint64_t seed,
                         m2d_windows *w);
void m2d_windows_free(m2d_windows *w);
/* How many times SAMPLES windows read the text's W windows (SAMPLES / W; > 1: the text repeats). */
double m2d_windows_passes(const m2d_windows *w, int64_t samples);
/* The data guard: when STEPS x BATCH windows read the text WHAT more than once, one line on F
 * saying how often (the paper streams its data without repeat); returns 1 then, else 0. */
int m2d_windows_repeat_note(const m2d_windows *w, const char *what, int steps, int batch, FILE *f);
/* Window index (0 .. W-1) of sample I. */
int64_t m2d_windows_index(m2d_windows *w, int64_t i);
/* Tokens of samples FIRST .. FIRST+N-1 into dst [n * L]. */
void m2d_windows_get(m2d_windows *w, int64_t first, int n, int32_t *dst);

#endif
