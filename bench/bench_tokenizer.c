/* bench_tokenizer: encoding throughput on WikiText-2 test (1.29 MB) with the tiny teacher's
 * tokenizer and the real Qwen3 one ($M2D_MODELS/qwen3-tokenizer, or the tokenizer.json or directory
 * that $M2D_QWEN3_TOKENIZER names). Reports load time, best-of-N encode time, tokens/s and MB/s, and decode time. */
#include <stdio.h>
#include <stdlib.h>

#include "tokenizer/tokenizer.h"
#include "base/util.h"

#define REPEATS 5

static int bench(const char *label, const char *path, const char *text, size_t len) {
    double t0 = m2d_now();
    m2d_tokenizer *tk;
    if (m2d_tokenizer_load(path, &tk)) {
        fprintf(stderr, "bench_tokenizer: %s\n", m2d_errmsg());
        return 1;
    }
    double load = m2d_now() - t0, best = 1e30, best_dec = 1e30;
    size_t n = 0;
    for (int r = 0; r < REPEATS; r++) {
        int32_t *ids;
        t0 = m2d_now();
        if (m2d_tokenizer_encode(tk, text, len, &ids, &n)) {
            fprintf(stderr, "bench_tokenizer: %s\n", m2d_errmsg());
            m2d_tokenizer_free(tk);
            return 1;
        }
        double t = m2d_now() - t0;
        if (t < best) best = t;
        char *out;
        size_t olen;
        t0 = m2d_now();
        if (m2d_tokenizer_decode(tk, ids, n, &out, &olen) == 0) free(out);
        t = m2d_now() - t0;
        if (t < best_dec) best_dec = t;
        free(ids);
    }
    printf("| %-6s | %7.0f | %8zu | %9.1f | %10.2f | %6.2f | %9.1f |\n", label, load * 1e3, n, best * 1e3,
           (double)n / best / 1e6, (double)len / best / 1e6, best_dec * 1e3);
    m2d_tokenizer_free(tk);
    return 0;
}

int main(void) {
    const char *data = getenv("M2D_DATA");
    char *wiki = m2d_strfmt("%s/wikitext-2-raw/wikitext-2-raw/wiki.test.raw", data ? data : "data");
    const char *models = getenv("M2D_MODELS");
    char *tiny = m2d_strfmt("%s/tiny-qwen3moe", models ? models : "../shared/models");
    size_t len;
    char *text = m2d_read_file(wiki, &len);
    if (!text) {
        printf("bench_tokenizer: skipped (%s; run 'make data')\n", m2d_errmsg());
        return 0;
    }
    printf("WikiText-2 test: %zu bytes; best of %d encodes, single thread\n\n", len, REPEATS);
    printf("| tokenizer | load ms | tokens | encode ms | Mtokens/s | MB/s | decode ms |\n");
    printf("|---|---|---|---|---|---|---|\n");
    int rc = 0;
    if (m2d_file_exists(tiny)) rc |= bench("tiny", tiny, text, len);
    else printf("| tiny | (not found: %s) |\n", tiny);
    char *qwen3 = m2d_strfmt("%s/qwen3-tokenizer", models ? models : "../shared/models");
    const char *q = getenv("M2D_QWEN3_TOKENIZER");
    if (!q && m2d_file_exists(qwen3)) q = qwen3;
    if (q) rc |= bench("qwen3", q, text, len);
    else printf("| qwen3 | (not found: %s; or set M2D_QWEN3_TOKENIZER) |\n", qwen3);
    free(text), free(wiki), free(tiny), free(qwen3);
    return rc;
}
