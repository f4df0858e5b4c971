/* moe2dense tokenize — encode text to ids (or --decode ids to text) with a HF tokenizer.json. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cmd.h"
#include "tokenizer/tokenizer.h"
#include "base/util.h"

static const char TOKENIZE_USAGE[] =
    "usage: moe2dense tokenize --model DIR [--file F] [--decode]\n"
    "\n"
    "Encode UTF-8 text with a Hugging Face tokenizer.json and print the token ids, space-separated,\n"
    "on one line. The ids are exactly those of HF `tokenizers` with add_special_tokens=False (no BOS):\n"
    "special tokens written in the text (e.g. <|im_start|>) are recognised as such.\n"
    "\n"
    "  --model DIR   directory holding tokenizer.json (and optionally tokenizer_config.json),\n"
    "                or the path of a tokenizer.json file\n"
    "  --file F      read the input from F (default: standard input)\n"
    "  --decode      the input is whitespace-separated ids; print the text they decode to,\n"
    "                byte for byte, with no newline added (bytes that do not form valid UTF-8,\n"
    "                e.g. half of a character, become U+FFFD as in HF decode)\n"
    "\n"
    "Errors (one line, non-zero exit): missing or malformed tokenizer.json (naming the field),\n"
    "invalid UTF-8 input (naming the byte offset), an id out of range when decoding.\n"
    "\n"
    "examples:\n"
    "  echo 'Hello world' | moe2dense tokenize --model ../shared/models/tiny-qwen3moe\n"
    "  moe2dense tokenize --model tok.json --file ids.txt --decode > text.txt\n";

/* Whitespace-separated decimal ids; anything else is an error naming the byte offset. */
static int parse_ids(const char *src, const char *s, size_t n, int32_t **out, size_t *n_out) {
    size_t cap = 1024, k = 0;
    int32_t *ids = m2d_malloc(cap * sizeof *ids);
    size_t i = 0;
    while (i < n) {
        if (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r' || s[i] == '\v' || s[i] == '\f') {
            i++;
            continue;
        }
        size_t start = i;
        int neg = s[i] == '-';
        if (neg) i++;
        long long v = 0;
        size_t digits = 0;
        while (i < n && s[i] >= '0' && s[i] <= '9') {
            if (v < 10000000000LL) v = v * 10 + (s[i] - '0');
            i++, digits++;
        }
        int sep_ok = i == n || s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r' || s[i] == '\v' || s[i] == '\f';
        if (!digits || !sep_ok) {
            free(ids);
            return m2d_err("%s: byte offset %zu: expected a token id (a decimal integer)", src, start);
        }
        if (neg) v = -v;
        if (v < INT32_MIN) v = INT32_MIN;
        if (v > INT32_MAX) v = INT32_MAX;
        if (k == cap) ids = m2d_realloc(ids, (cap *= 2) * sizeof *ids);
        ids[k++] = (int32_t)v;
    }
    *out = ids;
    *n_out = k;
    return 0;
}

static int write_all(const void *p, size_t n) {
    if (n && fwrite(p, 1, n, stdout) != n) return m2d_err("stdout: write failed: %s", strerror(errno));
    if (fflush(stdout) != 0) return m2d_err("stdout: write failed: %s", strerror(errno));
    return 0;
}

static int print_ids(const int32_t *ids, size_t n) {
    size_t cap = n * 12 + 2, o = 0;
    char *buf = m2d_malloc(cap);
    for (size_t i = 0; i < n; i++) o += (size_t)snprintf(buf + o, cap - o, i ? " %d" : "%d", (int)ids[i]);
    buf[o++] = '\n';
    int rc = write_all(buf, o);
    free(buf);
    return rc;
}

static int cmd_tokenize_run(int argc, char **argv) {
    const char *model = NULL, *file = NULL;
    int decode = 0;
    m2d_opt opts[] = {{"--model", 1, &model, NULL}, {"--file", 1, &file, NULL}, {"--decode", 0, NULL, &decode}, {0}};
    if (m2d_parse_opts("tokenize", argc, argv, opts, NULL, 0, NULL)) return m2d_cmd_fail("tokenize");
    if (!model) {
        m2d_err("tokenize: --model DIR is required (see 'moe2dense help tokenize')");
        return m2d_cmd_fail("tokenize");
    }
    m2d_tokenizer *tk;
    if (m2d_tokenizer_load(model, &tk)) return m2d_cmd_fail("tokenize");
    size_t len;
    char *input = file ? m2d_read_file(file, &len) : m2d_read_stream(stdin, "stdin", &len);
    const char *src = file ? file : "stdin";
    int rc = -1;
    if (!input) goto done;
    if (decode) {
        int32_t *ids = NULL;
        size_t n = 0;
        char *text;
        size_t tlen;
        if (parse_ids(src, input, len, &ids, &n)) goto done;
        int r = m2d_tokenizer_decode(tk, ids, n, &text, &tlen);
        free(ids);
        if (r) {
            m2d_err_prefix(src);
            goto done;
        }
        rc = write_all(text, tlen);
        free(text);
    } else {
        int32_t *ids;
        size_t n;
        if (m2d_tokenizer_encode(tk, input, len, &ids, &n)) {
            m2d_err_prefix(src);
            goto done;
        }
        rc = print_ids(ids, n);
        free(ids);
    }
done:
    free(input);
    m2d_tokenizer_free(tk);
    return rc ? m2d_cmd_fail("tokenize") : 0;
}

M2D_COMMAND(tokenize, "tokenize", "encode text to token ids (or --decode ids) with a HF tokenizer.json",
            TOKENIZE_USAGE, cmd_tokenize_run)
