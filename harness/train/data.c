/* data — distillation windows and their order (see data.h). */
#include "train/data.h"

#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "evals/ppl.h"

int m2d_order_parse(const char *s, m2d_order *out) {
    if (!strcmp(s, "shuffle")) *out = M2D_ORDER_SHUFFLE;
    else if (!strcmp(s, "sequential")) *out = M2D_ORDER_SEQUENTIAL;
    else return m2d_err("order '%s': expected shuffle or sequential", s);
    return 0;
}

const char *m2d_order_name(m2d_order o) { return o == M2D_ORDER_SEQUENTIAL ? "sequential" : "shuffle"; }

int m2d_windows_from_ids(const int32_t *ids, int64_t n, const char *what, int L, m2d_order order, uint64_t seed,
                         m2d_windows *w) {
    memset(w, 0, sizeof *w);
    if (L < 1) return m2d_err("%s: window length %d", what, L);
    if (n / L < 1) return m2d_err("%s: %lld tokens is less than one window of %d", what, (long long)n, L);
    w->ids = m2d_malloc(sizeof(int32_t) * (size_t)n);
    memcpy(w->ids, ids, sizeof(int32_t) * (size_t)n);
    w->n_ids = n, w->L = L, w->n_windows = n / L, w->order = order, w->seed = seed, w->perm_epoch = -1;
    m2d_sha256_hex(ids, sizeof(int32_t) * (size_t)n, w->ids_hash);
    return 0;
}

char *m2d_training_text_read(const char *path, size_t *len) {
    char *text = m2d_read_file(path, len);
    if (!text) return NULL;
    int rc = *len == 0                    ? m2d_err("%s: empty: no training text", path)
             : memchr(text, 0, *len) != NULL ? m2d_err("%s: holds NUL bytes: a binary file, not training text", path)
                                             : m2d_ppl_check_utf8(path, text, *len);
    if (rc == 0) return text;
    free(text);
    return NULL;
}

int m2d_windows_open(const m2d_tokenizer *tk, const char *path, int L, m2d_order order, uint64_t seed,
                     m2d_windows *w) {
    memset(w, 0, sizeof *w);
    size_t len, n;
    char *text = m2d_training_text_read(path, &len);
    if (!text) return -1;
    int32_t *ids = NULL;
    int rc = m2d_tokenizer_encode(tk, text, len, &ids, &n) ? m2d_err_prefix(path) : 0;
    free(text);
    if (rc) return -1;
    rc = m2d_windows_from_ids(ids, (int64_t)n, path, L, order, seed, w);
    free(ids);
    return rc;
}

double m2d_windows_passes(const m2d_windows *w, int64_t samples) { return (double)samples / (double)w->n_windows; }

int m2d_windows_repeat_note(const m2d_windows *w, const char *what, int steps, int batch, FILE *f) {
    int64_t samples = (int64_t)steps * batch;
    double p = m2d_windows_passes(w, samples);
    if (p <= 1) return 0;
    fprintf(f, "moe2dense distill: %s: the budget (%d steps x %d windows of %d tokens = %lld tokens) reads its "
               "%lld tokens (%lld windows) %.2f times; the paper streams its training data without repeat\n",
            what, steps, batch, w->L, (long long)(samples * w->L), (long long)w->n_ids, (long long)w->n_windows, p);
    return 1;
}

void m2d_windows_free(m2d_windows *w) {
    free(w->ids);
    free(w->perm);
    memset(w, 0, sizeof *w);
}

/* Fisher-Yates over the W windows for EPOCH (unbiased draw by rejection) */
static void permute(m2d_windows *w, int64_t epoch) {
    int64_t W = w->n_windows;
    if (!w->perm) w->perm = m2d_malloc(sizeof(int64_t) * (size_t)W);
    for (int64_t i = 0; i < W; i++) w->perm[i] = i;
    uint64_t st = w->seed ^ (0xD1B54A32D192ED03ull * (uint64_t)(epoch + 1));
    for (int64_t i = W - 1; i > 0; i--) {
        uint64_t range = (uint64_t)i + 1, limit = UINT64_MAX - UINT64_MAX % range, x;
        do x = m2d_splitmix64(&st);
        while (x >= limit);
        int64_t j = (int64_t)(x % range), t = w->perm[i];
        w->perm[i] = w->perm[j];
        w->perm[j] = t;
    }
    w->perm_epoch = epoch;
}

int64_t m2d_windows_index(m2d_windows *w, int64_t i) {
    int64_t epoch = i / w->n_windows, pos = i % w->n_windows;
    if (w->order == M2D_ORDER_SEQUENTIAL) return pos;
    if (epoch != w->perm_epoch) permute(w, epoch);
    return w->perm[pos];
}

void m2d_windows_get(m2d_windows *w, int64_t first, int n, int32_t *dst) {
    for (int s = 0; s < n; s++)
        memcpy(dst + (size_t)s * w->L, w->ids + m2d_windows_index(w, first + s) * w->L, sizeof(int32_t) * (size_t)w->L);
}
