/* libFuzzer target: encode arbitrary bytes with the tiny teacher's tokenizer (path from
 * $M2D_FUZZ_TOKENIZER, default ../shared/models/tiny-qwen3moe/tokenizer.json). Invalid UTF-8 must
 * be rejected cleanly; valid UTF-8 must round-trip: decode(encode(x)) == NFC(x), and == x when
 * x is already NFC. Every id must be in range. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "tokenizer/tokenizer.h"
#include "base/util.h"

static m2d_tokenizer *tk;

static void load_once(void) {
    if (tk) return;
    const char *path = getenv("M2D_FUZZ_TOKENIZER");
    if (!path) path = "../shared/models/tiny-qwen3moe/tokenizer.json";
    if (m2d_tokenizer_load(path, &tk)) {
        fprintf(stderr, "fuzz_tokenizer: %s\n", m2d_errmsg());
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    load_once();
    int32_t *ids = NULL;
    size_t n = 0;
    int valid = utf8proc_decompose((const utf8proc_uint8_t *)data, (utf8proc_ssize_t)size, NULL, 0, 0) >= 0 || size == 0;
    if (m2d_tokenizer_encode(tk, (const char *)data, size, &ids, &n)) {
        if (valid) abort(); /* valid UTF-8 must encode */
        if (!strstr(m2d_errmsg(), "invalid UTF-8 at byte offset")) abort();
        return 0;
    }
    if (!valid) abort(); /* invalid UTF-8 must be rejected */
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= m2d_tokenizer_vocab_size(tk)) abort();
    char *text;
    size_t len;
    if (m2d_tokenizer_decode(tk, ids, n, &text, &len)) abort();
    utf8proc_uint8_t *nfc = NULL;
    utf8proc_ssize_t k = size ? utf8proc_map(data, (utf8proc_ssize_t)size, &nfc, UTF8PROC_STABLE | UTF8PROC_COMPOSE) : 0;
    if (k < 0 || (size_t)k != len || (len && memcmp(text, nfc, len) != 0)) abort();
    free(nfc);
    free(text);
    free(ids);
    return 0;
}
