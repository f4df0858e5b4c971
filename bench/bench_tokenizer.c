/* bench_tokenizer: encoding throughput on WikiText-2 test (1.29 MB) with the tiny teacher's
 * tokenizer and the real Qwen3 one ($M2D_MODELS/qwen3-tokenizer, or the tokenizer.json or directory
 * that $M2D_QWEN3_TOKENIZER names), and the issue-12 families' small trained tokenizers when the
 * tokenizer tests have made them ($M2D_BUILD/tok-families). Reports load time, best-of-N encode time, tokens/s and MB/s, and decode time. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"
#include "base/util.h"

#define REPEATS 5

/* whole: merge every piece whole (no cuts where no merge reaches across: the obviously-correct path) */
static int bench(const char *label, const char *path, const char *text, size_t len, int whole) {
    double t0 = m2d_now();
    m2d_tokenizer *tk;
    if (m2d_tokenizer_load(path, &tk)) {
        fprintf(stderr, "bench_tokenizer: %s\n", m2d_errmsg());
        return 1;
    }
    double load = m2d_now() - t0, best = 1e30, best_dec = 1e30;
    if (whole) m2d_tokenizer_set_word_cut_min(tk, (size_t)-1);
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
    printf("| %-17s | %7.0f | %8zu | %9.1f | %10.2f | %6.2f | %9.1f |\n", label, load * 1e3, n, best * 1e3,
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
    if (m2d_file_exists(tiny)) rc |= bench("tiny", tiny, text, len, 0);
    else printf("| tiny | (not found: %s) |\n", tiny);
    char *qwen3 = m2d_strfmt("%s/qwen3-tokenizer", models ? models : "../shared/models");
    const char *q = getenv("M2D_QWEN3_TOKENIZER");
    if (!q && m2d_file_exists(qwen3)) q = qwen3;
    if (q) rc |= bench("qwen3", q, text, len, 0);
    else printf("| qwen3 | (not found: %s; or set M2D_QWEN3_TOKENIZER) |\n", qwen3);
    /* the issue-12 families' pipelines, as trained by tests/test_tokenizer.c (tools/train_tokenizers.py) */
    static const char *families[] = {"deepseek-v2", "gpt-oss", "olmoe", "mixtral", "mistral-metaspace"};
    const char *build = getenv("M2D_BUILD") ? getenv("M2D_BUILD") : "build";
    for (size_t i = 0; i < M2D_ARRAY_LEN(families); i++) {
        char *dir = m2d_strfmt("%s/tok-families/%s", build, families[i]);
        if (m2d_file_exists(dir)) rc |= bench(families[i], dir, text, len, 0);
        else printf("| %s | (not found: %s; made by build/tests/test_tokenizer) |\n", families[i], dir);
        if (m2d_file_exists(dir) && !strcmp(families[i], "mixtral")) rc |= bench("mixtral, whole", dir, text, len, 1);
        free(dir);
    }
    free(text), free(wiki), free(tiny), free(qwen3);
    return rc;
}
