/* tokenizer: ids and decoded text against the reference implementation — Hugging Face `tokenizers`
 * itself (the Rust library, pinned in tests/ref/requirements.txt, run by tests/ref/hf_tokenize.py) —
 * on all of WikiText-2 test and hard cases, for the real Qwen3 tokenizer (../shared/models/qwen3-tokenizer),
 * the tiny teacher's, and small tokenizers trained at test time with the published pipelines of
 * DeepSeek-V2, GPT-OSS (o200k_harmony), OLMoE and Mixtral/Mistral (tools/train_tokenizers.py);
 * hand-built tokenizers (Split behaviours, BPE options, Metaspace/Prepend/Digits, single_word/normalized
 * added tokens, Oniguruma's regex classes) with hand-computed ids that the reference must give too;
 * round trips; bad input via library and CLI.
 * Every exact comparison here (ids, decoded bytes, memcmp of id vectors, round trips) is exact on
 * every CPU: tokenization is integer and byte work (the tokenizer has no floating point beyond
 * reading integer ids from JSON). */
#include "testutil.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <utf8proc.h>

#include "tokenizer/tokenizer.h"
#include "base/util.h"

#define WIKI_TEST "wikitext-2-raw/wikitext-2-raw/wiki.test.raw"

/* ---- helpers ------------------------------------------------------------------------------ */

/* Looked up once and kept for the whole run (the tests use them many times). */
static const char *tiny_dir(void) {
    static char *dir;
    if (!dir) dir = tu_model_path("tiny-qwen3moe");
    return dir;
}

static const char *qwen3_dir(void) {
    static char *dir;
    if (!dir) dir = tu_model_path("qwen3-tokenizer");
    return dir;
}

#define NEED_QWEN3() do { if (!qwen3_dir()) TU_SKIP("../shared/models/qwen3-tokenizer not present"); } while (0)
/* skips only where Python is missing; a failed install of the reference fails (tu_ref_python) */
#define NEED_REF() (void)tu_ref_python()

static m2d_tokenizer *load_or_die(const char *path) {
    m2d_tokenizer *tk = NULL;
    if (m2d_tokenizer_load(path, &tk)) fail_msg("load %s: %s", path, m2d_errmsg());
    return tk;
}

static m2d_tokenizer *g_qwen3, *g_tiny;

static m2d_tokenizer *qwen3(void) {
    if (!g_qwen3) g_qwen3 = load_or_die(qwen3_dir());
    return g_qwen3;
}

static m2d_tokenizer *tiny(void) {
    if (!g_tiny) g_tiny = load_or_die(tiny_dir());
    return g_tiny;
}

typedef struct {
    int32_t *v;
    size_t n;
} idvec;

static idvec encode(const m2d_tokenizer *tk, const char *s, size_t n) {
    idvec r;
    if (m2d_tokenizer_encode(tk, s, n, &r.v, &r.n)) fail_msg("encode: %s", m2d_errmsg());
    return r;
}

static idvec encode_str(const m2d_tokenizer *tk, const char *s) { return encode(tk, s, strlen(s)); }

static idvec parse_line(const char *s, const char **end) {
    idvec r = {m2d_malloc(16 * sizeof(int32_t)), 0};
    size_t cap = 16;
    while (*s && *s != '\n') {
        char *e;
        long v = strtol(s, &e, 10);
        assert_true(e != s);
        if (r.n == cap) r.v = m2d_realloc(r.v, (cap *= 2) * sizeof *r.v);
        r.v[r.n++] = (int32_t)v;
        s = e;
        while (*s == ' ') s++;
    }
    if (end) *end = *s == '\n' ? s + 1 : s;
    return r;
}

static void assert_ids_equal(idvec got, idvec want, const char *what) {
    size_t i = 0;
    while (i < got.n && i < want.n && got.v[i] == want.v[i]) i++;
    if (i == got.n && i == want.n) return;
    fail_msg("%s: ids differ at index %zu (got %ld, want %ld; lengths %zu vs %zu)", what, i,
             i < got.n ? (long)got.v[i] : -1L, i < want.n ? (long)want.v[i] : -1L, got.n, want.n);
}

static void assert_ids(idvec got, const int32_t *want, size_t n, const char *what) {
    idvec w = {(int32_t *)want, n};
    assert_ids_equal(got, w, what);
}

/* Runs the reference (tests/ref/hf_tokenize.py ARGS...); returns its stdout: one line of ids per
 * input file. */
static char *run_reference(const char *const *args, int n) {
    size_t cap = 256 + strlen(tu_ref_python());
    for (int i = 0; i < n; i++) cap += strlen(args[i]) + 3;
    char *cmd = m2d_malloc(cap);
    size_t o = (size_t)snprintf(cmd, cap, "%s tests/ref/hf_tokenize.py", tu_ref_python());
    for (int i = 0; i < n; i++) o += (size_t)snprintf(cmd + o, cap - o, " '%s'", args[i]);
    char *out = NULL, *err = NULL;
    int rc = tu_run(cmd, &out, &err);
    if (rc != 0) fail_msg("reference failed (rc %d): %s", rc, err ? err : "");
    free(cmd);
    free(err);
    return out;
}

/* The reference's ids of each file under one tokenizer.json, each line followed by a line with the
 * hex of HF's decode of those ids and a line with the ids encoded with add_special_tokens=True. */
static char *reference_ids(const char *tokenizer_json, const char **files, int n) {
    const char **args = m2d_malloc(sizeof(char *) * (size_t)(n + 3));
    args[0] = "--decode";
    args[1] = "--special";
    args[2] = tokenizer_json;
    memcpy(args + 3, files, sizeof(char *) * (size_t)n);
    char *out = run_reference(args, n + 3);
    free(args);
    return out;
}

static int hex_digit(char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; }

/* The reference's decoded text at *p (a hex line, "-" for empty), compared with moe2dense's decode of
 * the same ids; *p moves past the line. */
static void assert_decode_matches(const m2d_tokenizer *tk, idvec ids, const char **p, const char *what) {
    const char *s = *p, *eol = strchr(s, '\n');
    if (!eol) eol = s + strlen(s);
    size_t hex = *s == '-' ? 0 : (size_t)(eol - s);
    assert_int_equal(hex % 2, 0);
    char *want = m2d_malloc(hex / 2 + 1);
    for (size_t i = 0; i < hex / 2; i++) {
        int hi = hex_digit(s[2 * i]), lo = hex_digit(s[2 * i + 1]);
        if (hi < 0 || lo < 0) fail_msg("%s: bad hex in the reference's decode line", what);
        want[i] = (char)(hi << 4 | lo);
    }
    char *got;
    size_t got_n;
    if (m2d_tokenizer_decode(tk, ids.v, ids.n, &got, &got_n)) fail_msg("%s: decode: %s", what, m2d_errmsg());
    size_t i = 0;
    while (i < got_n && i < hex / 2 && got[i] == want[i]) i++;
    if (i != got_n || i != hex / 2)
        fail_msg("%s: decoded text differs at byte %zu (lengths %zu vs %zu)", what, i, got_n, hex / 2);
    free(got), free(want);
    *p = *eol ? eol + 1 : eol;
}

/* Hand-computed cases of the small hand-built tokenizers below are remembered here and checked
 * against the reference at the end (hand_cases_match_reference), so that the hand-computed tests
 * themselves run without Python. */
typedef struct {
    char *json, *text, *what;
    int32_t want[10];
    size_t n;
} hand_case;
static hand_case g_hand[64];
static size_t g_n_hand;

static void remember_case(const char *json, const char *text, const int32_t *want, size_t n, const char *what) {
    assert_true(g_n_hand < M2D_ARRAY_LEN(g_hand) && n <= 10);
    hand_case *c = &g_hand[g_n_hand++];
    c->json = m2d_strdup(json), c->text = m2d_strdup(text), c->what = m2d_strdup(what);
    memcpy(c->want, want, n * sizeof *want);
    c->n = n;
}

static char *slurp(const char *path, size_t *n) {
    char *s = m2d_read_file(path, n);
    if (!s) fail_msg("%s", m2d_errmsg());
    return s;
}

static char *write_tokenizer(const char *dir, const char *name, const char *json);
static void expect_load_error(const char *dir, const char *name, const char *json, const char *needle);

/* The reference's ids with add_special_tokens=True at *p against m2d_tokenizer_encode_special;
 * *p moves past the line. */
static void assert_special_matches(const m2d_tokenizer *tk, const char *text, size_t n, const char **p, const char *what) {
    idvec want = parse_line(*p, p), got;
    if (m2d_tokenizer_encode_special(tk, text, n, &got.v, &got.n)) fail_msg("%s: encode_special: %s", what, m2d_errmsg());
    char w[160];
    snprintf(w, sizeof w, "%s (add_special_tokens)", what);
    assert_ids_equal(got, want, w);
    free(want.v), free(got.v);
}

/* ---- hard cases ---------------------------------------------------------------------------- */

static const char *HARD[] = {
    "12345 3.14 1,000,000",
    "don't I'LL we've You'RE she'd 's 'S 'll'LL''",
    "\xE4\xBB\x96\xE8\xAF\xB4\xEF\xBC\x9A\xE2\x80\x9C\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C\xEF\xBC\x81\xE2\x80\x9D "
    "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE\xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9\xE3\x83\x88 \xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4", /* CJK */
    "\xF0\x9F\x91\x8D \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7"
    "\xE2\x80\x8D\xF0\x9F\x91\xA6 \xF0\x9F\x8F\xB3\xEF\xB8\x8F\xE2\x80\x8D\xF0\x9F\x8C\x88 \xF0\x9F\x91\xA9\xF0\x9F\x8F\xBF\xE2\x80\x8D\xF0\x9F\x92\xBB", /* emoji, ZWJ, skin tones */
    "a  b   c    d", "\tx\t\ty\t", "\n\n\n", "  \n ", "trailing   ", "   leading", "   \n\n   \n", "Hello\r\nWorld\r\n",
    "a<|endoftext|>b", "<|im_start|>user\nhi<|im_end|>\n", "<|endoftext|><|endoftext|>", "<|endoftext", " <|im_end|> x ",
    "e\xCC\x81 caf\xC3\xA9 cafe\xCC\x81 \xE2\x84\xAB A\xCC\x8A A\xCC\x88\xCC\x84", /* NFC-sensitive */
    "e\xCC\x81<|endoftext|>\xCC\x81",                                               /* no composition across a special token */
    "", " ", "x", "na\xC3\xAFve r\xC3\xA9sum\xC3\xA9", "$1,234.56 + 7% = ?!?!",
    "a\xC2\xA0""b\xE2\x80\x83""c\xE3\x80\x80""d",                               /* NBSP, em space, ideographic space */
    "x = [1, 2, 3]; // comment\n\tif (y) { return z; }\n",
    "\x01\x7f \xEF\xAC\x81 \xEF\xAC\x80 \xC7\x84 \xC7\x85",                     /* controls, ligatures */
    " \xE1\xA0\x8Ex",                                                              /* U+180E is not \s for HF */
    "\xF0\x9F\x98\x80\xF0\x9F\x98\x81 text \xF0\x90\x8D\x88",
    "<think>\nok</think><tool_call>",
    "<|im_start|>user\n", "e\xCC\x81", "end with spaces  ", "  \t \n\t",
    /* byte fallback (characters outside the SentencePiece-style alphabets): emoji, rare CJK (U+20000),
     * Devanagari, a lone combining mark */
    "\xF0\x9F\xA6\x99 llama \xF0\xA0\x80\x80\xE2\x80\x94 \xE0\xA4\xB9\xE0\xA4\xBF\xE0\xA4\x82 \xCC\x81x",
    " a", "  two leading", "\n leading newline", "x                              y", /* 30 spaces */
    " \n \n", "tab\t\tand  space \r\n\r\n", "x \n y \n", /* DeepSeek's \s+$ at line ends */
    "1234567890123 0.5 2024-01-02 \xD9\xA3\xD9\xA4\xD9\xA5 \xC2\xB2\xC2\xB3 \xEF\xBC\x91\xEF\xBC\x92 \xE2\x85\xA0", /* Nd, No, Nl */
    "I'M o'clock 'Ve 'S 'd 'D've '\xC5\xBF 'K don'T",                     /* contractions, long s */
    "<s>Hello</s> <unk> <s> x</s>",                                        /* SentencePiece specials in text */
    "<|start|>assistant<|channel|>final<|message|>Hi<|return|><|endoftext|>", /* harmony */
    "<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>Hi<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
    "\xC3\xB8 \xC3\xB6\xC3\xBF \xC3\x80x \xC2\xB5m \xCE\xB1\xCE\xB2\xCE\xB3 \xEF\xBD\x81\xEF\xBC\xA2",  /* Latin-1 placeholders, letters classes */
    "\xE2\x96\x81x a\xE2\x96\x81" "b \xE2\x96\x81", "<0x41> <0xZZ>", /* meta space and byte-token look-alikes in text */
    "\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C\xE3\x80\x82 \xEA\xB0\x80\xEB\x82\x98 \xE3\x81\x82\xE3\x82\xA2", /* CJK, Hangul, kana */
    "CamelCaseWord HTTPServer \xC3\x89" "COLE \xC7\x85ungla", /* o200k's case classes (Lt) */
    "mail |||EMAIL_ADDRESS||| or|||PHONE_NUMBER|||x ||IP_ADDRESS|||", /* OLMo's PII masks */
};

#define N_GENERATED 2
#define N_CASES (M2D_ARRAY_LEN(HARD) + N_GENERATED)

/* Generated cases that stress the merge order: random words of 1..60 letters from a skewed
 * alphabet, and one 4000-letter word (long enough for the priority-queue merge). */
static char *generated_case(int k) {
    uint64_t rng = 7 + (uint64_t)k;
    size_t cap = 200000, o = 0;
    char *s = m2d_malloc(cap);
    if (k == 0) {
        for (int w = 0; w < 3000; w++) {
            int len = 1 + (int)(tu_rand_u64(&rng) % 60);
            for (int j = 0; j < len; j++) s[o++] = "etaoinshrdlucmfwyp"[tu_rand_u64(&rng) % (j % 3 ? 18 : 6)];
            s[o++] = w % 17 ? ' ' : '\n';
        }
    } else {
        for (int j = 0; j < 4000; j++) s[o++] = "abcab"[tu_rand_u64(&rng) % 5];
    }
    s[o] = 0;
    return s;
}

static void hard_cases_match_reference(const char *tokenizer_json, const m2d_tokenizer *tk) {
    char *dir = tu_tmpdir();
    char *paths[N_CASES], *texts[N_CASES];
    for (size_t i = 0; i < N_CASES; i++) {
        texts[i] = i < M2D_ARRAY_LEN(HARD) ? m2d_strdup(HARD[i]) : generated_case((int)(i - M2D_ARRAY_LEN(HARD)));
        paths[i] = m2d_strfmt("%s/case%02zu.txt", dir, i);
        tu_write(paths[i], texts[i], strlen(texts[i]));
    }
    char *out = reference_ids(tokenizer_json, (const char **)paths, (int)N_CASES);
    const char *p = out;
    for (size_t i = 0; i < N_CASES; i++) {
        idvec want = parse_line(p, &p);
        idvec got = encode_str(tk, texts[i]);
        char what[64];
        snprintf(what, sizeof what, "hard case %zu", i);
        assert_ids_equal(got, want, what);
        assert_decode_matches(tk, want, &p, what);
        assert_special_matches(tk, texts[i], strlen(texts[i]), &p, what);
        free(want.v), free(got.v), free(paths[i]), free(texts[i]);
    }
    free(out);
    tu_rm_rf(dir);
    free(dir);
}

static void wikitext_matches_reference(const char *tokenizer_json, const m2d_tokenizer *tk) {
    const char *wiki = tu_data_path(WIKI_TEST);
    if (!m2d_file_exists(wiki)) fail_msg("%s missing: run 'make data'", wiki);
    char *out = reference_ids(tokenizer_json, &wiki, 1);
    const char *p = out;
    idvec want = parse_line(out, &p);
    size_t n;
    char *text = slurp(wiki, &n);
    idvec got = encode(tk, text, n);
    assert_true(got.n > 250000);
    assert_ids_equal(got, want, "wiki.test.raw");
    assert_decode_matches(tk, want, &p, "wiki.test.raw");
    assert_special_matches(tk, text, n, &p, "wiki.test.raw");
    free(want.v);
    free(got.v);
    free(text);
    free(out);
}

/* The GPT-2 regex path of the ByteLevel pre-tokenizer (use_regex) with add_prefix_space, which
 * HF applies to every piece: the tiny tokenizer rewired that way, against the reference. */
static void bytelevel_regex_variant_matches_reference(void **state) {
    (void)state;
    NEED_REF();
    if (!tiny_dir()) TU_SKIP("../shared/models/tiny-qwen3moe not present");
    char *src = m2d_path_join(tiny_dir(), "tokenizer.json");
    size_t n;
    char *text = slurp(src, &n);
    const char *key = "\"pre_tokenizer\":";
    char *at = strstr(text, key), *end = at ? strstr(at, "\"post_processor\":") : NULL;
    assert_non_null(at);
    assert_non_null(end);
    char *json = m2d_strfmt("%.*s\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, "
                            "\"trim_offsets\": true, \"use_regex\": true}, %s",
                            (int)(at - text), text, end);
    char *dir = tu_tmpdir();
    char *p = write_tokenizer(dir, "bl", json);
    m2d_tokenizer *tk = load_or_die(p);
    hard_cases_match_reference(p, tk);
    m2d_tokenizer_free(tk);
    free(p), free(json), free(text), free(src);
    tu_rm_rf(dir);
    free(dir);
}

static void qwen3_wikitext_matches_reference(void **state) {
    (void)state;
    NEED_QWEN3();
    NEED_REF();
    char *json = m2d_path_join(qwen3_dir(), "tokenizer.json");
    wikitext_matches_reference(json, qwen3());
    free(json);
}

static void tiny_wikitext_matches_reference(void **state) {
    (void)state;
    NEED_REF();
    if (!tiny_dir()) TU_SKIP("../shared/models/tiny-qwen3moe not present");
    char *json = m2d_path_join(tiny_dir(), "tokenizer.json");
    wikitext_matches_reference(json, tiny());
    free(json);
}

static void qwen3_hard_cases_match_reference(void **state) {
    (void)state;
    NEED_QWEN3();
    NEED_REF();
    char *json = m2d_path_join(qwen3_dir(), "tokenizer.json");
    hard_cases_match_reference(json, qwen3());
    free(json);
}

static void tiny_hard_cases_match_reference(void **state) {
    (void)state;
    NEED_REF();
    if (!tiny_dir()) TU_SKIP("../shared/models/tiny-qwen3moe not present");
    char *json = m2d_path_join(tiny_dir(), "tokenizer.json");
    hard_cases_match_reference(json, tiny());
    free(json);
}

/* ---- the tokenizers of the other MoE families ----------------------------------------------- */

#define TRAIN_TEXT "train-text/wikitext-103-train-prefix/wiki.train.tokens"

/* Small tokenizers with each family's published pipeline, trained by the reference library
 * (tools/train_tokenizers.py) into the build directory once and reused while its STAMP matches. */
static const char *families_dir(void) {
    static char *dir;
    if (dir) return dir;
    const char *py = tu_ref_python();
    const char *build = getenv("M2D_BUILD") ? getenv("M2D_BUILD") : "build";
    char *data = m2d_strdup(tu_data_path(TRAIN_TEXT));
    if (!m2d_file_exists(data)) fail_msg("%s missing: run 'make data'", data);
    char *out = m2d_strfmt("%s/tok-families", build);
    char *cmd = m2d_strfmt("%s tools/train_tokenizers.py --data '%s' '%s'", py, data, out);
    char *err = NULL;
    int rc = tu_run(cmd, NULL, &err);
    if (rc != 0) fail_msg("tools/train_tokenizers.py failed (rc %d): %s", rc, err ? err : "");
    free(cmd), free(err), free(data);
    return dir = out;
}

/* What each family's fixture must show, hand-computed from its published pipeline (so that a fixture
 * that lost a feature fails here, whatever the reference says): strings of its tokenizer.json and
 * one text with its ids spelled as tokens ("<0xF0>": a byte-fallback token). */
typedef struct {
    const char *family, *needles[4];
    const char *text, *tokens[8];
    const char *bos, *eos;
} family_case;

static const family_case FAMILY_CASES[] = {
    {"deepseek-v2", {"\"individual_digits\": true", "\"use_regex\": false", "[\\r\\n]", "\\\\s+$"},
     /* digits one by one; "\xC3\xB8" is a non-special added token (normalized) that takes the model's id
      * of the byte-level character for byte 0xF8, so it decodes to U+FFFD, as in HF */
     "2024\xC3\xB8", {"2", "0", "2", "4", "\xC3\xB8"},
     "<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
     "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"},
    {"gpt-oss", {"\"ignore_merges\": true", "\\\\p{N}{1,3}", "(?i:'s|'t|'re|'ve|'m|'ll|'d)?", "\"use_regex\": false"},
     "<|start|><|return|>", {"<|start|>", "<|return|>"}, "<|startoftext|>", "<|return|>"},
    {"olmoe", {"\"type\": \"NFC\"", "\"use_regex\": true", "\"add_prefix_space\": false", "|||EMAIL_ADDRESS|||"},
     /* runs of spaces and the PII masks are (normalized) added tokens */
     "x    y|||IP_ADDRESS|||", {"x", "    ", "y", "|||IP_ADDRESS|||"}, NULL, "<|endoftext|>"},
    {"mixtral", {"\"byte_fallback\": true", "\"type\": \"Prepend\"", "\"type\": \"Strip\"", "\"fuse_unk\": true"},
     /* the llama emoji is outside the learned alphabet: its four bytes fall back */
     "\xF0\x9F\xA6\x99", {"\xE2\x96\x81", "<0xF0>", "<0x9F>", "<0xA6>", "<0x99>"}, "<s>", "</s>"},
    {"mistral-metaspace", {"\"byte_fallback\": true", "\"type\": \"Metaspace\"", "\"prepend_scheme\": \"first\"", "\"split\": false"},
     "\xF0\x9F\xA6\x99", {"\xE2\x96\x81", "<0xF0>", "<0x9F>", "<0xA6>", "<0x99>"}, "<s>", "</s>"},
};

static void family_features(const family_case *fc, const char *json, const m2d_tokenizer *tk) {
    size_t n;
    char *text = slurp(json, &n);
    for (int i = 0; i < 4 && fc->needles[i]; i++)
        if (!strstr(text, fc->needles[i])) fail_msg("%s: %s lacks %s", fc->family, json, fc->needles[i]);
    free(text);
    int32_t want[8];
    size_t nw = 0;
    for (; nw < 8 && fc->tokens[nw]; nw++) {
        want[nw] = m2d_tokenizer_token_id(tk, fc->tokens[nw]);
        if (want[nw] < 0) fail_msg("%s: no token '%s'", fc->family, fc->tokens[nw]);
    }
    idvec got = encode_str(tk, fc->text);
    assert_ids(got, want, nw, fc->family);
    free(got.v);
    assert_int_equal(m2d_tokenizer_bos_id(tk), fc->bos ? m2d_tokenizer_token_id(tk, fc->bos) : -1);
    assert_int_equal(m2d_tokenizer_eos_id(tk), m2d_tokenizer_token_id(tk, fc->eos));
}

/* One family: its features, then ids and decoded text against the reference on WikiText-2 test and
 * the hard cases. */
static void family_matches_reference(const char *family) {
    NEED_REF();
    const family_case *fc = NULL;
    for (size_t i = 0; i < M2D_ARRAY_LEN(FAMILY_CASES); i++)
        if (!strcmp(FAMILY_CASES[i].family, family)) fc = &FAMILY_CASES[i];
    assert_non_null(fc);
    char *dir = m2d_path_join(families_dir(), family), *json = m2d_path_join(dir, "tokenizer.json");
    m2d_tokenizer *tk = load_or_die(dir);
    family_features(fc, json, tk);
    wikitext_matches_reference(json, tk);
    hard_cases_match_reference(json, tk);
    m2d_tokenizer_free(tk);
    free(json), free(dir);
}

/* Metaspace options the published fixtures do not use, on the mistral-metaspace fixture rewired: the
 * legacy form (add_prefix_space true: prepend always, split) with a Metaspace decoder after byte
 * fallback, and prepend_scheme never with a lone Metaspace decoder (byte tokens stay as text). */
static void metaspace_variants_match_reference(void **state) {
    (void)state;
    NEED_REF();
    static const char *variants[][2] = {
        {"{\"type\": \"Metaspace\", \"replacement\": \"\xE2\x96\x81\", \"add_prefix_space\": true}",
         "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"},"
         " {\"type\": \"Metaspace\", \"replacement\": \"\xE2\x96\x81\", \"add_prefix_space\": true}]}"},
        {"{\"type\": \"Metaspace\", \"replacement\": \"\xE2\x96\x81\", \"prepend_scheme\": \"never\", \"split\": true}",
         "{\"type\": \"Metaspace\", \"replacement\": \"\xE2\x96\x81\", \"prepend_scheme\": \"never\", \"split\": true}"},
    };
    char *src = m2d_strfmt("%s/mistral-metaspace/tokenizer.json", families_dir()), *dir = tu_tmpdir();
    size_t n;
    char *text = slurp(src, &n);
    for (size_t v = 0; v < M2D_ARRAY_LEN(variants); v++) {
        cJSON *root = cJSON_Parse(text);
        assert_non_null(root);
        cJSON_ReplaceItemInObject(root, "pre_tokenizer", cJSON_Parse(variants[v][0]));
        cJSON_ReplaceItemInObject(root, "decoder", cJSON_Parse(variants[v][1]));
        char *json = cJSON_PrintUnformatted(root), name[16];
        snprintf(name, sizeof name, "ms%zu", v);
        char *p = write_tokenizer(dir, name, json);
        m2d_tokenizer *tk = load_or_die(p);
        hard_cases_match_reference(p, tk);
        m2d_tokenizer_free(tk);
        cJSON_Delete(root);
        free(json), free(p);
    }
    free(text), free(src);
    tu_rm_rf(dir);
    free(dir);
}

/* Long pieces cut where no merge reaches across give the ids of the whole pieces (the
 * SentencePiece-style fixtures hand BPE each text as one piece), on WikiText-2 test and hard cases. */
static void word_cuts_equal_whole_words(void **state) {
    (void)state;
    NEED_REF();
    static const char *families[] = {"mixtral", "mistral-metaspace"};
    size_t n;
    char *wiki = slurp(tu_data_path(WIKI_TEST), &n);
    for (size_t f = 0; f < M2D_ARRAY_LEN(families); f++) {
        char *dir = m2d_path_join(families_dir(), families[f]);
        m2d_tokenizer *tk = load_or_die(dir);
        for (size_t i = 0; i <= M2D_ARRAY_LEN(HARD); i++) {
            const char *t = i < M2D_ARRAY_LEN(HARD) ? HARD[i] : wiki;
            size_t len = i < M2D_ARRAY_LEN(HARD) ? strlen(t) : n;
            m2d_tokenizer_set_word_cut_min(tk, (size_t)-1);
            idvec whole = encode(tk, t, len);
            m2d_tokenizer_set_word_cut_min(tk, 0);
            idvec cut = encode(tk, t, len);
            char what[96];
            snprintf(what, sizeof what, "%s: text %zu cut vs whole", families[f], i);
            assert_ids_equal(cut, whole, what);
            free(whole.v), free(cut.v);
        }
        m2d_tokenizer_free(tk);
        free(dir);
    }
    free(wiki);
}

static void deepseek_v2_matches_reference(void **state) { (void)state; family_matches_reference("deepseek-v2"); }
static void gpt_oss_matches_reference(void **state) { (void)state; family_matches_reference("gpt-oss"); }
static void olmoe_matches_reference(void **state) { (void)state; family_matches_reference("olmoe"); }
static void mixtral_matches_reference(void **state) { (void)state; family_matches_reference("mixtral"); }
static void mistral_metaspace_matches_reference(void **state) { (void)state; family_matches_reference("mistral-metaspace"); }

/* The golden tokens shipped with the tiny teacher (first lines of WikiText-2 valid, encoded by
 * an independent port of HF tokenizers). */
static void tiny_golden_tokens(void **state) {
    (void)state;
    if (!tiny_dir()) TU_SKIP("../shared/models/tiny-qwen3moe not present");
    const char *valid = tu_data_path("wikitext-2-raw/wikitext-2-raw/wiki.valid.raw");
    if (!m2d_file_exists(valid)) fail_msg("%s missing: run 'make data'", valid);
    char *gpath = m2d_strfmt("%s/golden/tokens.txt", tiny_dir());
    size_t n;
    char *g = slurp(gpath, &n);
    for (char *q = g; *q; q++)
        if (*q == '\n') *q = ' ';
    idvec want = parse_line(g, NULL);
    assert_int_equal(want.n, 64);
    char *text = slurp(valid, &n);
    idvec got = encode(tiny(), text, n);
    assert_true(got.n >= 64);
    got.n = 64;
    assert_ids_equal(got, want, "golden/tokens.txt");
    free(want.v), free(got.v), free(text), free(g), free(gpath);
}

/* decode(encode(x)) == NFC(x): the normalizer is the only lossy step. */
static void roundtrip_one(const m2d_tokenizer *tk, const char *s, size_t n) {
    idvec ids = encode(tk, s, n);
    char *back;
    size_t bn;
    assert_int_equal(m2d_tokenizer_decode(tk, ids.v, ids.n, &back, &bn), 0);
    utf8proc_uint8_t *nfc = NULL;
    utf8proc_ssize_t k = n ? utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &nfc, UTF8PROC_STABLE | UTF8PROC_COMPOSE) : 0;
    assert_true(k >= 0);
    if (bn != (size_t)k || memcmp(back, n ? (const char *)nfc : "", bn) != 0) fail_msg("round trip differs for '%.60s'", s);
    assert_int_equal(back[bn], 0);
    free(nfc), free(back), free(ids.v);
}

static void roundtrip(void **state) {
    (void)state;
    if (!tiny_dir()) TU_SKIP("../shared/models/tiny-qwen3moe not present");
    for (size_t i = 0; i < M2D_ARRAY_LEN(HARD); i++) roundtrip_one(tiny(), HARD[i], strlen(HARD[i]));
    size_t n;
    char *text = slurp(tu_data_path(WIKI_TEST), &n);
    roundtrip_one(tiny(), text, n);
    if (qwen3_dir()) {
        for (size_t i = 0; i < M2D_ARRAY_LEN(HARD); i++) roundtrip_one(qwen3(), HARD[i], strlen(HARD[i]));
        roundtrip_one(qwen3(), text, n);
    }
    /* not NFC-sensitive: exact */
    const char *plain = "Hello <|im_start|>user\n  x\t\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD";
    idvec ids = encode_str(tiny(), plain);
    char *back;
    size_t bn;
    assert_int_equal(m2d_tokenizer_decode(tiny(), ids.v, ids.n, &back, &bn), 0);
    assert_string_equal(back, plain);
    free(back), free(ids.v), free(text);
}

/* The O(n^2) scan and the priority queue must merge identically. */
static void bpe_scan_equals_heap(void **state) {
    (void)state;
    if (!tiny_dir()) TU_SKIP("../shared/models/tiny-qwen3moe not present");
    m2d_tokenizer *tk = load_or_die(tiny_dir());
    size_t n;
    char *text = slurp(tu_data_path(WIKI_TEST), &n);
    /* long words exercise the queue properly */
    char *extra = m2d_strfmt("%s %s", "abracadabraabracadabraabracadabra-supercalifragilisticexpialidocious",
                             "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
    const char *texts[] = {text, extra};
    size_t lens[] = {n, strlen(extra)};
    for (int t = 0; t < 2; t++) {
        m2d_tokenizer_set_bpe_heap_threshold(tk, (size_t)-1);
        idvec scan = encode(tk, texts[t], lens[t]);
        m2d_tokenizer_set_bpe_heap_threshold(tk, 0);
        idvec heap = encode(tk, texts[t], lens[t]);
        assert_ids_equal(heap, scan, "heap vs scan");
        free(scan.v), free(heap.v);
    }
    free(extra), free(text);
    m2d_tokenizer_free(tk);
}

/* NFC of only the stretches that can change == NFC of the whole text (utf8proc), on WikiText,
 * the hard cases and random mixes of ASCII, Latin-1, combining marks, Hangul jamo and CJK. */
static void nfc_fast_equals_reference(void **state) {
    (void)state;
    if (!tiny_dir()) TU_SKIP("../shared/models/tiny-qwen3moe not present");
    m2d_tokenizer *tk = load_or_die(tiny_dir());
    size_t n;
    char *wiki = slurp(tu_data_path(WIKI_TEST), &n);
    static const uint32_t alphabet[] = {'a', 'e', 'A', ' ', '\n', '.', 0xE9, 0xC5, 0x300, 0x301, 0x308, 0x327, 0x30A, 0x1E0B,
                                        0x323, 0x1100, 0x1161, 0x11A8, 0xAC00, 0x4E16, 0x212B, 0x2126, 0x344, 0xFB01, 0x0CD5,
                                        0x0CBF, 0x0B47, 0x0B3E, 0x1F600};
    uint64_t rng = 42;
    for (int t = 0; t < 300 + 1 + (int)M2D_ARRAY_LEN(HARD); t++) {
        char buf[512];
        const char *text = buf;
        size_t len = 0;
        if (t < 300) {
            int k = 1 + (int)(tu_rand_u64(&rng) % 40);
            for (int j = 0; j < k; j++)
                len += (size_t)utf8proc_encode_char((utf8proc_int32_t)alphabet[tu_rand_u64(&rng) % M2D_ARRAY_LEN(alphabet)],
                                                    (utf8proc_uint8_t *)buf + len);
        } else if (t == 300) {
            text = wiki, len = n;
        } else {
            text = HARD[t - 301], len = strlen(text);
        }
        m2d_tokenizer_set_reference_nfc(tk, 1);
        idvec ref = encode(tk, text, len);
        m2d_tokenizer_set_reference_nfc(tk, 0);
        idvec fast = encode(tk, text, len);
        assert_ids_equal(fast, ref, "nfc fast vs reference");
        free(ref.v), free(fast.v);
    }
    free(wiki);
    m2d_tokenizer_free(tk);
}

/* Oniguruma's \s (HF's regex engine) is Unicode White_Space: U+0085 yes, U+180E and U+FEFF no.
 * The splits show in the ids: " \u0085x" -> " " | "\u0085x", " \u180Ex" -> " \u180E" | "x". */
static void whitespace_splits(const m2d_tokenizer *tk, size_t n_cases) {
    struct { const char *text, *left, *right, *wrong_left, *wrong_right; } cases[] = {
        {" \xC2\x85x", " ", "\xC2\x85x", " \xC2\x85", "x"},
        {" \xE1\xA0\x8Ex", " \xE1\xA0\x8E", "x", " ", "\xE1\xA0\x8Ex"},
        {" \xEF\xBB\xBFx", " \xEF\xBB\xBF", "x", " ", "\xEF\xBB\xBFx"},
    };
    for (size_t i = 0; i < n_cases; i++) {
        idvec all = encode_str(tk, cases[i].text);
        idvec l = encode_str(tk, cases[i].left), r = encode_str(tk, cases[i].right);
        idvec wl = encode_str(tk, cases[i].wrong_left), wr = encode_str(tk, cases[i].wrong_right);
        idvec cat = {m2d_malloc((l.n + r.n + 1) * sizeof(int32_t)), l.n + r.n};
        memcpy(cat.v, l.v, l.n * sizeof(int32_t));
        memcpy(cat.v + l.n, r.v, r.n * sizeof(int32_t));
        assert_ids_equal(all, cat, cases[i].text);
        /* and the other split would have been visible */
        int same = wl.n + wr.n == all.n && !memcmp(wl.v, all.v, wl.n * 4) && !memcmp(wr.v, all.v + wl.n, wr.n * 4);
        assert_false(same);
        free(all.v), free(l.v), free(r.v), free(wl.v), free(wr.v), free(cat.v);
    }
}

static void whitespace_class_like_oniguruma(void **state) {
    (void)state;
    if (!tiny_dir()) TU_SKIP("../shared/models/tiny-qwen3moe not present");
    whitespace_splits(tiny(), 2); /* the tiny vocab cannot tell the U+FEFF splits apart */
    if (qwen3_dir()) whitespace_splits(qwen3(), 3);
}

/* ---- small hand-built tokenizers -------------------------------------------------------------- */

static char *write_tokenizer(const char *dir, const char *name, const char *json) {
    char *sub = m2d_path_join(dir, name);
    assert_int_equal(m2d_mkdir_p(sub), 0);
    char *p = m2d_path_join(sub, "tokenizer.json");
    tu_write(p, json, strlen(json));
    free(sub);
    return p;
}

/* Byte-level vocab: the 256 alphabet characters get ids 0..255 in byte order. */
static char *byte_level_vocab(const char *extra_vocab) {
    size_t cap = 8192, o = 0;
    char *s = m2d_malloc(cap);
    o += (size_t)snprintf(s + o, cap - o, "{");
    uint32_t next = 256;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        uint32_t cp = printable ? (uint32_t)b : next++;
        char u[8] = {0};
        utf8proc_encode_char((utf8proc_int32_t)cp, (utf8proc_uint8_t *)u);
        if (cp == '"' || cp == '\\') o += (size_t)snprintf(s + o, cap - o, "\"\\%s\": %d, ", u, b);
        else o += (size_t)snprintf(s + o, cap - o, "\"%s\": %d, ", u, b);
    }
    o += (size_t)snprintf(s + o, cap - o, "%s}", extra_vocab);
    return s;
}

static const char *BL_PRETOK =
    "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": false, \"use_regex\": true},"
    "\"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, \"use_regex\": true}";

/* vocab extras: "Ġ"+"w" etc. Merges in the two serialisations must load to the same model. */
static void merges_both_serialisations(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    char *vocab = byte_level_vocab("\"he\": 256, \"ll\": 257, \"hell\": 258, \"hello\": 259, \"\xC4\xA0w\": 260, \"\xC4\xA0wo\": 261");
    const char *legacy = "[\"h e\", \"l l\", \"he ll\", \"hell o\", \"\xC4\xA0 w\", \"\xC4\xA0w o\"]";
    const char *pairs = "[[\"h\", \"e\"], [\"l\", \"l\"], [\"he\", \"ll\"], [\"hell\", \"o\"], [\"\xC4\xA0\", \"w\"], [\"\xC4\xA0w\", \"o\"]]";
    const char *forms[] = {legacy, pairs};
    int32_t want[] = {259, 261, 'r', 'l', 'd', 32, 258};
    for (int f = 0; f < 2; f++) {
        char *json = m2d_strfmt("{\"version\": \"1.0\", \"added_tokens\": [], \"normalizer\": null, %s,"
                                "\"model\": {\"type\": \"BPE\", \"vocab\": %s, \"merges\": %s}}",
                                BL_PRETOK, vocab, forms[f]);
        char *p = write_tokenizer(dir, f ? "pairs" : "legacy", json);
        m2d_tokenizer *tk = load_or_die(p);
        idvec got = encode_str(tk, "hello world hell");
        /* "hello" | " world" -> Ġwo r l d | " hell" -> Ġ hell ('Ġ' is byte 0x20, id 32) */
        assert_ids(got, want, M2D_ARRAY_LEN(want), "merges");
        remember_case(json, "hello world hell", want, M2D_ARRAY_LEN(want), "merges");
        assert_int_equal(m2d_tokenizer_vocab_size(tk), 262);
        free(got.v);
        m2d_tokenizer_free(tk);
        free(json), free(p);
    }
    free(vocab);
    tu_rm_rf(dir);
    free(dir);
}

/* Regex escapes with Oniguruma's meaning: \w includes marks, \h is a hex digit. */
static void regex_escapes_like_oniguruma(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    struct { const char *regex, *vocab, *merges, *text; int32_t want[6]; size_t n; } cases[] = {
        /* \w+ keeps a + U+0301 + b together (one piece; merges to one token) */
        {"\\\\w+", "\"a\": 0, \"b\": 1, \"\xCC\x81\": 2, \" \": 3, \"a\xCC\x81\": 4, \"a\xCC\x81""b\": 5",
         "[\"a \xCC\x81\", \"a\xCC\x81 b\"]", "a\xCC\x81""b a", {5, 3, 0}, 3},
        /* \h+ splits "gab" into "g" | "ab" (with PCRE2's \h it would stay whole and merge g+a) */
        {"\\\\h+", "\"a\": 0, \"b\": 1, \"g\": 2, \"ga\": 3, \"ab\": 4", "[\"g a\", \"a b\"]", "gab", {2, 4}, 2},
        /* [^\s]+ inside a class, and \S+ outside: U+180E is not whitespace, so no split at it */
        {"[^\\\\s]+", "\"x\": 0, \"\xE1\xA0\x8E\": 1, \"x\xE1\xA0\x8E\": 2", "[\"x \xE1\xA0\x8E\"]", "x\xE1\xA0\x8E", {2}, 1},
        {"\\\\S+", "\"x\": 0, \"\xE1\xA0\x8E\": 1, \"\xE1\xA0\x8Ex\": 2", "[\"\xE1\xA0\x8E x\"]", "\xE1\xA0\x8Ex", {2}, 1},
    };
    for (size_t i = 0; i < M2D_ARRAY_LEN(cases); i++) {
        char *json = m2d_strfmt("{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"%s\"}, \"behavior\": \"Isolated\","
                                " \"invert\": false}, \"model\": {\"type\": \"BPE\", \"vocab\": {%s}, \"merges\": %s}}",
                                cases[i].regex, cases[i].vocab, cases[i].merges);
        char name[16];
        snprintf(name, sizeof name, "r%zu", i);
        char *p = write_tokenizer(dir, name, json);
        m2d_tokenizer *tk = load_or_die(p);
        idvec got = encode_str(tk, cases[i].text);
        assert_ids(got, cases[i].want, cases[i].n, cases[i].regex);
        remember_case(json, cases[i].text, cases[i].want, cases[i].n, cases[i].regex);
        free(got.v);
        m2d_tokenizer_free(tk);
        free(json), free(p);
    }
    tu_rm_rf(dir);
    free(dir);
}

/* Split behaviours on "a-b-" / "a--b" with pattern "-" (no byte level): the merges make each
 * piece one token where the vocab has it, so the ids show the piece boundaries. */
static void split_behaviours(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    const char *model = "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"-\": 2, \"a-\": 3, \"b-\": 4, \"-b\": 5, \"--\": 6},"
                        "\"merges\": [\"a -\", \"b -\", \"- b\", \"- -\"]}";
    struct {
        const char *pattern, *behavior, *invert, *text;
        int32_t want[6];
        size_t n;
    } cases[] = {
        {"{\"String\": \"-\"}", "Removed", "false", "a-b-", {0, 1}, 2},
        {"{\"String\": \"-\"}", "Isolated", "false", "a-b-", {0, 2, 1, 2}, 4},
        {"{\"String\": \"-\"}", "MergedWithPrevious", "false", "a-b-", {3, 4}, 2},
        {"{\"String\": \"-\"}", "MergedWithNext", "false", "a-b-", {0, 5, 2}, 3},
        {"{\"String\": \"-\"}", "Contiguous", "false", "a--b", {0, 6, 1}, 3},
        {"{\"String\": \"-\"}", "Isolated", "false", "a--b", {0, 2, 2, 1}, 4},
        {"{\"String\": \"-\"}", "Removed", "true", "a-b-", {2, 2}, 2},
        {"{\"Regex\": \"-+\"}", "Isolated", "false", "a--b", {0, 6, 1}, 3},
        {"{\"Regex\": \"-+\"}", "MergedWithPrevious", "false", "b-a", {4, 0}, 2},
        /* Split escapes a String into a regex: "" is the empty regex, matching between characters */
        {"{\"String\": \"\"}", "Isolated", "false", "a-", {0, 2}, 2},
    };
    for (size_t i = 0; i < M2D_ARRAY_LEN(cases); i++) {
        char *json = m2d_strfmt("{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
                                "\"pattern\": %s, \"behavior\": \"%s\", \"invert\": %s}]}, %s}",
                                cases[i].pattern, cases[i].behavior, cases[i].invert, model);
        char name[16];
        snprintf(name, sizeof name, "s%zu", i);
        char *p = write_tokenizer(dir, name, json);
        m2d_tokenizer *tk = load_or_die(p);
        idvec got = encode_str(tk, cases[i].text);
        char what[96];
        snprintf(what, sizeof what, "%s %s invert=%s on '%s'", cases[i].pattern, cases[i].behavior, cases[i].invert, cases[i].text);
        assert_ids(got, cases[i].want, cases[i].n, what);
        remember_case(json, cases[i].text, cases[i].want, cases[i].n, what);
        /* no decoder: HF joins the tokens with spaces */
        if (i == 1) {
            char *back;
            size_t bn;
            assert_int_equal(m2d_tokenizer_decode(tk, got.v, got.n, &back, &bn), 0);
            assert_string_equal(back, "a - b -");
            free(back);
        }
        free(got.v);
        m2d_tokenizer_free(tk);
        free(json), free(p);
    }
    tu_rm_rf(dir);
    free(dir);
}

/* The same ids with every piece cut where no merge reaches across (the tokenizer's fast path for
 * pipelines that never split; tests/test_tokenizer.c word_cuts_equal_whole_words). TK is left so. */
static void assert_word_cuts_agree(m2d_tokenizer *tk, const char *text, const int32_t *want, size_t n, const char *what) {
    m2d_tokenizer_set_word_cut_min(tk, 0);
    idvec got = encode_str(tk, text);
    char w[200];
    snprintf(w, sizeof w, "%s (pieces cut)", what);
    assert_ids(got, want, n, w);
    free(got.v);
}

/* BPE model options, hand-computed with HF's BPE::merge_word rules (no pre-tokenizer). */
static void bpe_model_options(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    struct { const char *opts, *vocab, *merges, *text; int32_t want[6]; size_t n; } cases[] = {
        /* c -> byte fallback <0x63>; d has no byte token -> unk; then a+b merges */
        {"\"unk_token\": \"<unk>\", \"byte_fallback\": true", "\"a\": 0, \"b\": 1, \"ab\": 2, \"<unk>\": 3, \"<0x63>\": 4",
         "[\"a b\"]", "abcd", {2, 4, 3}, 3},
        {"\"unk_token\": \"<unk>\", \"fuse_unk\": true", "\"a\": 0, \"b\": 1, \"ab\": 2, \"<unk>\": 3", "[\"a b\"]", "xyab", {3, 2}, 2},
        {"\"unk_token\": \"<unk>\", \"fuse_unk\": false", "\"a\": 0, \"b\": 1, \"ab\": 2, \"<unk>\": 3", "[\"a b\"]", "xyab", {3, 3, 2}, 3},
        /* no unk: unknown characters vanish and their neighbours merge */
        {"\"unk_token\": null", "\"a\": 0, \"b\": 1, \"ab\": 2", "[\"a b\"]", "axb", {2}, 1},
        {"\"ignore_merges\": true", "\"a\": 0, \"b\": 1, \"ab\": 2, \"aab\": 3", "[\"a b\"]", "aab", {3}, 1},
        {"\"ignore_merges\": false", "\"a\": 0, \"b\": 1, \"ab\": 2, \"aab\": 3", "[\"a b\"]", "aab", {0, 2}, 2},
        /* merged token = left + right without the prefix */
        {"\"continuing_subword_prefix\": \"##\"", "\"a\": 0, \"##b\": 1, \"ab\": 2", "[\"a ##b\"]", "abb", {2, 1}, 2},
        {"\"end_of_word_suffix\": \"</w>\"", "\"a\": 0, \"b</w>\": 1, \"ab</w>\": 2", "[\"a b</w>\"]", "ab", {2}, 1},
        /* two live pairs of the same merge: the leftmost goes first, aaa -> aa a */
        {"\"unk_token\": null", "\"a\": 0, \"aa\": 1", "[\"a a\"]", "aaa", {1, 0}, 2},
    };
    for (size_t i = 0; i < M2D_ARRAY_LEN(cases); i++) {
        char *json = m2d_strfmt("{\"model\": {\"type\": \"BPE\", %s, \"vocab\": {%s}, \"merges\": %s}}", cases[i].opts,
                                cases[i].vocab, cases[i].merges);
        char name[16];
        snprintf(name, sizeof name, "m%zu", i);
        char *p = write_tokenizer(dir, name, json);
        m2d_tokenizer *tk = load_or_die(p);
        idvec got = encode_str(tk, cases[i].text);
        char what[160];
        snprintf(what, sizeof what, "%s on '%s'", cases[i].opts, cases[i].text);
        assert_ids(got, cases[i].want, cases[i].n, what);
        assert_word_cuts_agree(tk, cases[i].text, cases[i].want, cases[i].n, what);
        remember_case(json, cases[i].text, cases[i].want, cases[i].n, what);
        free(got.v);
        m2d_tokenizer_free(tk);
        free(json), free(p);
    }
    tu_rm_rf(dir);
    free(dir);
}

/* SentencePiece-style pipelines and digits, hand-computed: Metaspace's prepend schemes and split,
 * the legacy Prepend + Replace normalizer, Digits. "<s>" is an added token cut out of the raw text, so
 * what follows it does not start at offset 0 (prepend_scheme "first" then prepends nothing). The
 * merge a+▁ ranks first, so an unsplit "▁a▁b" gives ▁ a▁ b where split pieces give ▁a ▁b. */
static void sentencepiece_pipelines(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
#define MS "\xE2\x96\x81"
    const char *model =
        "\"added_tokens\": [{\"id\": 6, \"content\": \"<s>\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false,"
        " \"normalized\": false, \"special\": true}],"
        "\"model\": {\"type\": \"BPE\", \"vocab\": {\"" MS "\": 0, \"a\": 1, \"b\": 2, \"" MS "a\": 3, \"" MS "b\": 4, \"a" MS "\": 5,"
        " \"<s>\": 6, \"1\": 7, \"2\": 8, \"12\": 9, \"a1\": 10},"
        " \"merges\": [\"a " MS "\", \"" MS " a\", \"" MS " b\", \"a 1\", \"1 2\"]}";
    const char *prepend = "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"" MS "\"},"
                          " {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"" MS "\"}]}";
    struct { const char *stage, *scheme, *split, *text; int32_t want[6]; size_t n; } cases[] = {
        {"Metaspace", "always", "false", "a b", {0, 5, 2}, 3},
        {"Metaspace", "always", "true", "a b", {3, 4}, 2},
        {"Metaspace", "never", "true", "a b", {1, 4}, 2},
        {"Metaspace", "first", "true", "a b", {3, 4}, 2},
        {"Metaspace", "first", "true", "<s>a b", {6, 1, 4}, 3},
        {"Metaspace", "always", "true", "<s>a b", {6, 3, 4}, 3},
        {"Metaspace", "first", "true", " a", {3}, 1}, /* already starts with the meta space */
        {"Prepend", NULL, NULL, "a b", {0, 5, 2}, 3},
        {"Prepend", NULL, NULL, "<s>a b", {6, 0, 5, 2}, 4}, /* the normalizer runs per segment */
        {"Digits", "false", NULL, "a12", {1, 9}, 2},
        {"Digits", "true", NULL, "a12", {1, 7, 8}, 3},
        {"none", NULL, NULL, "a12", {10, 8}, 2},
    };
    for (size_t i = 0; i < M2D_ARRAY_LEN(cases); i++) {
        char *pipe;
        if (!strcmp(cases[i].stage, "Metaspace"))
            pipe = m2d_strfmt("\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"" MS "\", \"prepend_scheme\": \"%s\","
                              " \"split\": %s}", cases[i].scheme, cases[i].split);
        else if (!strcmp(cases[i].stage, "Digits"))
            pipe = m2d_strfmt("\"pre_tokenizer\": {\"type\": \"Digits\", \"individual_digits\": %s}", cases[i].scheme);
        else pipe = m2d_strdup(!strcmp(cases[i].stage, "Prepend") ? prepend : "\"pre_tokenizer\": null");
        char *json = m2d_strfmt("{%s, %s}", pipe, model);
        char name[16], what[160];
        snprintf(name, sizeof name, "sp%zu", i);
        snprintf(what, sizeof what, "%s %s %s on '%s'", cases[i].stage, cases[i].scheme ? cases[i].scheme : "",
                 cases[i].split ? cases[i].split : "", cases[i].text);
        char *p = write_tokenizer(dir, name, json);
        m2d_tokenizer *tk = load_or_die(p);
        idvec got = encode_str(tk, cases[i].text);
        assert_ids(got, cases[i].want, cases[i].n, what);
        assert_word_cuts_agree(tk, cases[i].text, cases[i].want, cases[i].n, what);
        remember_case(json, cases[i].text, cases[i].want, cases[i].n, what);
        free(got.v);
        m2d_tokenizer_free(tk);
        free(json), free(p), free(pipe);
    }
#undef MS
    tu_rm_rf(dir);
    free(dir);
}

/* Post-processors with add_special_tokens=True on "ab" (ids a 0, b 1), hand-computed, then against
 * the reference: the template's specials around the text, a special of two ids, RoBERTa/BERT cls+sep,
 * Llama-3's Sequence [ByteLevel, Template] and a template followed by ByteLevel. Two processors adding
 * ids are refused (HF's second template takes the first one's BOS for the text). */
#define TPL(single, specials) "{\"type\": \"TemplateProcessing\", \"single\": [" single "], \"pair\": [" single "], \"special_tokens\": {" specials "}}"
#define TSP(name) "{\"SpecialToken\": {\"id\": \"" name "\", \"type_id\": 0}}"
#define TSEQ "{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}"
#define SPECIAL(name, ids) "\"" name "\": {\"id\": \"" name "\", \"ids\": [" ids "], \"tokens\": [\"" name "\"]}"
static void post_processors(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    const char *model = "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"<s>\": 2, \"</s>\": 3, \"[CLS]\": 4, \"[SEP]\": 5},"
                        " \"merges\": []}";
    struct { const char *pp; int32_t want[6]; size_t n; } cases[] = {
        {TPL(TSP("<s>") ", " TSEQ ", " TSP("</s>"), SPECIAL("<s>", "2") ", " SPECIAL("</s>", "3")), {2, 0, 1, 3}, 4},
        {TPL(TSEQ ", " TSP("<x>"), SPECIAL("<x>", "4, 5")), {0, 1, 4, 5}, 4},
        {"{\"type\": \"RobertaProcessing\", \"sep\": [\"</s>\", 3], \"cls\": [\"<s>\", 2], \"trim_offsets\": true, \"add_prefix_space\": false}",
         {2, 0, 1, 3}, 4},
        {"{\"type\": \"BertProcessing\", \"sep\": [\"[SEP]\", 5], \"cls\": [\"[CLS]\", 4]}", {4, 0, 1, 5}, 4},
        {"{\"type\": \"Sequence\", \"processors\": [{\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": false,"
         " \"use_regex\": true}, " TPL(TSP("<s>") ", " TSEQ, SPECIAL("<s>", "2")) "]}", {2, 0, 1}, 3},
        {"{\"type\": \"Sequence\", \"processors\": [" TPL(TSEQ ", " TSP("</s>"), SPECIAL("</s>", "3")) ", {\"type\": \"ByteLevel\","
         " \"add_prefix_space\": true, \"trim_offsets\": false, \"use_regex\": true}]}", {0, 1, 3}, 3},
    };
    size_t nc = M2D_ARRAY_LEN(cases);
    const char **args = m2d_malloc(sizeof(char *) * (2 * nc + 2));
    args[0] = "--special", args[1] = "--pairs";
    char *text = m2d_path_join(dir, "ab.txt");
    tu_write(text, "ab", 2);
    for (size_t i = 0; i < nc; i++) {
        char *json = m2d_strfmt("{\"post_processor\": %s, %s}", cases[i].pp, model), name[16];
        snprintf(name, sizeof name, "pp%zu", i);
        char *p = write_tokenizer(dir, name, json);
        m2d_tokenizer *tk = load_or_die(p);
        idvec got;
        assert_int_equal(m2d_tokenizer_encode_special(tk, "ab", 2, &got.v, &got.n), 0);
        assert_ids(got, cases[i].want, cases[i].n, cases[i].pp);
        free(got.v);
        m2d_tokenizer_free(tk);
        args[2 + 2 * i] = p, args[3 + 2 * i] = text;
        free(json);
    }
    NEED_REF();
    char *out = run_reference(args, (int)(2 * nc + 2));
    const char *q = out;
    for (size_t i = 0; i < nc; i++) {
        idvec plain = parse_line(q, &q), special = parse_line(q, &q);
        assert_int_equal(plain.n, 2);
        assert_ids(special, cases[i].want, cases[i].n, cases[i].pp);
        free(plain.v), free(special.v);
    }
    free(out);
    for (size_t i = 0; i < nc; i++) free((char *)args[2 + 2 * i]);
    free(args), free(text);
    expect_load_error(dir, "pe1", (text = m2d_strfmt("{\"post_processor\": {\"type\": \"Foo\"}, %s}", model)),
                      "tokenizer.json: field 'post_processor.type': 'Foo' not supported");
    free(text);
    expect_load_error(dir, "pe2", (text = m2d_strfmt("{\"post_processor\": " TPL(TSP("<s>") ", " TSEQ, SPECIAL("</s>", "3")) ", %s}", model)),
                      "tokenizer.json: field 'post_processor.special_tokens': no entry for the template's special token '<s>'");
    free(text);
    expect_load_error(dir, "pe3", (text = m2d_strfmt("{\"post_processor\": {\"type\": \"Sequence\", \"processors\": [{\"type\": \"ByteLevel\"},"
                                                     " {\"type\": \"Bar\"}]}, %s}", model)),
                      "tokenizer.json: field 'post_processor.processors[1].type': 'Bar' not supported");
    free(text);
    expect_load_error(dir, "pe4", (text = m2d_strfmt("{\"post_processor\": " TPL(TSP("<s>"), SPECIAL("<s>", "2")) ", %s}", model)),
                      "tokenizer.json: field 'post_processor.single': no Sequence \"A\"");
    free(text);
    expect_load_error(dir, "pe5", (text = m2d_strfmt("{\"post_processor\": {\"type\": \"Sequence\", \"processors\": ["
                                                     TPL(TSP("<s>") ", " TSEQ, SPECIAL("<s>", "2")) ", {\"type\": \"BertProcessing\","
                                                     " \"sep\": [\"[SEP]\", 5], \"cls\": [\"[CLS]\", 4]}]}, %s}", model)),
                      "tokenizer.json: field 'post_processor.processors[1]': a second post-processor that adds ids");
    free(text);
    tu_rm_rf(dir);
    free(dir);
}
#undef TPL
#undef TSP
#undef TSEQ
#undef SPECIAL

/* Added-token flags, with HF's semantics (AddedVocabulary::find_matches), hand-computed:
 *   <m>  lstrip        " x  <m>y"  -> Ġ x <m> y          (the spaces before <m> are eaten)
 *   <r>  rstrip        "<r>  y z"   -> <r> y Ġ z
 *   [W]  single_word   "a[W] [W] b" -> a [ W ] Ġ [W] Ġ b  (inside a word it is not a token)
 *   é    normalized    "e\u0301"    -> é  (matched after NFC; tokens with normalized=false are not)
 * tokenizer_config.json's bos (object form) and eos (string) are read. The added ids continue the
 * vocabulary (257...), as in real files: HF gives a token that is not in the model's vocabulary the
 * next free id, whatever id the file says. */
static void added_token_flags(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    char *vocab = byte_level_vocab("\"\xC4\xA0x\": 256");
    char *json = m2d_strfmt(
        "{\"added_tokens\": ["
        "{\"id\": 257, \"content\": \"<m>\", \"single_word\": false, \"lstrip\": true, \"rstrip\": false, \"normalized\": false, \"special\": true},"
        "{\"id\": 258, \"content\": \"<r>\", \"single_word\": false, \"lstrip\": false, \"rstrip\": true, \"normalized\": false, \"special\": true},"
        "{\"id\": 259, \"content\": \"[W]\", \"single_word\": true, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"special\": false},"
        "{\"id\": 260, \"content\": \"e\xCC\x81\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": true, \"special\": false},"
        "{\"id\": 261, \"content\": \"q\xCC\x81\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"special\": false},"
        "{\"id\": 262, \"content\": \"<a>\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"special\": true},"
        "{\"id\": 263, \"content\": \"<a>bc\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"special\": true}],"
        "\"normalizer\": {\"type\": \"NFC\"}, %s, \"model\": {\"type\": \"BPE\", \"vocab\": %s, \"merges\": [\"\xC4\xA0 x\"]}}",
        BL_PRETOK, vocab);
    char *p = write_tokenizer(dir, "added", json);
    char *cfg = m2d_strfmt("%s/added/tokenizer_config.json", dir);
    const char *cfg_json = "{\"bos_token\": {\"__type\": \"AddedToken\", \"content\": \"<m>\"}, \"eos_token\": \"<r>\"}";
    tu_write(cfg, cfg_json, strlen(cfg_json));
    m2d_tokenizer *tk = load_or_die(p);
    assert_int_equal(m2d_tokenizer_bos_id(tk), 257);
    assert_int_equal(m2d_tokenizer_eos_id(tk), 258);
    assert_int_equal(m2d_tokenizer_token_id(tk, "e\xCC\x81"), 260);
    assert_int_equal(m2d_tokenizer_token_id(tk, "\xC4\xA0x"), 256);
    assert_int_equal(m2d_tokenizer_token_id(tk, "nope"), -1);
    size_t tl;
    assert_string_equal(m2d_tokenizer_id_token(tk, 260, &tl), "e\xCC\x81");
    struct { const char *text; int32_t want[10]; size_t n; } cases[] = {
        {" x  <m>y", {256, 257, 'y'}, 3},
        {"<r>  y z", {258, 'y', 32, 'z'}, 4},
        /* inside "a[W]" it is not a token; the trailing space of "a[W] " is its own piece */
        {"a[W] [W] b", {'a', '[', 'W', ']', 32, 259, 32, 'b'}, 8},
        {"e\xCC\x81", {260}, 1},
        /* q + U+0301 has no precomposed form: the normalized=false token matches the raw text */
        {"q\xCC\x81", {261}, 1},
        /* "é" precomposed in the input also matches the normalized token */
        {"\xC3\xA9", {260}, 1},
        /* longest match first */
        {"<a>bc<a>b", {263, 262, 'b'}, 3},
    };
    for (size_t i = 0; i < M2D_ARRAY_LEN(cases); i++) {
        idvec got = encode_str(tk, cases[i].text);
        assert_ids(got, cases[i].want, cases[i].n, cases[i].text);
        remember_case(json, cases[i].text, cases[i].want, cases[i].n, cases[i].text);
        free(got.v);
    }
    m2d_tokenizer_free(tk);
    free(json), free(p), free(cfg), free(vocab);
    tu_rm_rf(dir);
    free(dir);
}

/* The hand-computed ids of the tests above are Hugging Face tokenizers' ids too. */
static void hand_cases_match_reference(void **state) {
    (void)state;
    NEED_REF();
    /* merges 2 + regex 4 + split 10 + BPE options 9 + SentencePiece 12 + added tokens 7: those tests ran first */
    assert_true(g_n_hand >= 44);
    char *dir = tu_tmpdir();
    const char **args = m2d_malloc(sizeof(char *) * (2 * g_n_hand + 1));
    args[0] = "--pairs";
    for (size_t i = 0; i < g_n_hand; i++) {
        char name[32];
        snprintf(name, sizeof name, "h%zu", i);
        args[1 + 2 * i] = write_tokenizer(dir, name, g_hand[i].json);
        char *text = m2d_strfmt("%s/%s/text.txt", dir, name);
        tu_write(text, g_hand[i].text, strlen(g_hand[i].text));
        args[2 + 2 * i] = text;
    }
    char *out = run_reference(args, (int)(1 + 2 * g_n_hand));
    const char *p = out;
    for (size_t i = 0; i < g_n_hand; i++) {
        idvec ref = parse_line(p, &p);
        assert_ids(ref, g_hand[i].want, g_hand[i].n, g_hand[i].what);
        free(ref.v);
    }
    for (size_t i = 1; i <= 2 * g_n_hand; i++) free((char *)args[i]);
    free(args), free(out);
    tu_rm_rf(dir);
    free(dir);
}

/* ---- bad input ------------------------------------------------------------------------------- */

static void expect_load_error(const char *dir, const char *name, const char *json, const char *needle) {
    char *p = write_tokenizer(dir, name, json);
    m2d_tokenizer *tk = NULL;
    assert_int_equal(m2d_tokenizer_load(p, &tk), -1);
    assert_null(tk);
    if (!strstr(m2d_errmsg(), needle)) fail_msg("error '%s' lacks '%s'", m2d_errmsg(), needle);
    assert_null(strchr(m2d_errmsg(), '\n'));
    free(p);
}

static void bad_tokenizer_json(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    m2d_tokenizer *tk = NULL;
    assert_int_equal(m2d_tokenizer_load("/nonexistent/dir", &tk), -1);
    assert_non_null(strstr(m2d_errmsg(), "/nonexistent/dir: cannot open"));
    assert_int_equal(m2d_tokenizer_load(dir, &tk), -1); /* a directory without tokenizer.json */
    assert_non_null(strstr(m2d_errmsg(), "/tokenizer.json: cannot open"));
    const char *okm = "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]}";
    char *j;
    expect_load_error(dir, "e1", "{\"model\": {\"type\": \"BPE\", ", "invalid JSON");
    expect_load_error(dir, "e2", "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}",
                      "tokenizer.json: field 'model.type': 'Unigram' not supported (supported: BPE)");
    expect_load_error(dir, "e3", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]}}",
                      "field 'model.merges[0]': token 'b' is not in model.vocab");
    expect_load_error(dir, "e4", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]}}",
                      "field 'model.merges[0]': merged token 'ab'");
    expect_load_error(dir, "e5", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"x\"}, \"merges\": []}}", "field 'model.vocab.a'");
    expect_load_error(dir, "e6", "{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": [\"ab\"]}}", "field 'model.merges[0]'");
    /* a bad component next to a good model; inside a Sequence it is named by its place */
    static const struct { const char *component, *needle; } bad_components[] = {
        {"\"normalizer\": {\"type\": \"Lowercase\"}", "field 'normalizer.type': 'Lowercase' not supported"},
        {"\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"ByteLevel\"}, {\"type\": \"Whitespace\"}]}",
         "field 'pre_tokenizer.pretokenizers[1].type': 'Whitespace' not supported"},
        {"\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a\"}, \"behavior\": \"Isolated\", \"invert\": false}",
         "field 'pre_tokenizer.pattern.Regex': cannot compile regex"},
        {"\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": \"Sideways\"}",
         "field 'pre_tokenizer.behavior': 'Sideways' not supported"},
        {"\"decoder\": {\"type\": \"WordPiece\"}", "field 'decoder.type': 'WordPiece' not supported"},
        {"\"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"ByteFallback\"}, {\"type\": \"CTC\"}]}",
         "tokenizer.json: field 'decoder.decoders[1].type': 'CTC' not supported"},
        {"\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"x\"}, {\"type\": \"StripAccents\"}]}",
         "tokenizer.json: field 'normalizer.normalizers[1].type': 'StripAccents' not supported"},
        {"\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"_\", \"prepend_scheme\": \"sometimes\"}",
         "tokenizer.json: field 'pre_tokenizer.prepend_scheme'"},
        {"\"pre_tokenizer\": {\"kind\": \"Digits\"}", "tokenizer.json: field 'pre_tokenizer.type'"},
    };
    for (size_t i = 0; i < M2D_ARRAY_LEN(bad_components); i++) {
        char name[16];
        snprintf(name, sizeof name, "c%zu", i);
        expect_load_error(dir, name, (j = m2d_strfmt("{%s, %s}", bad_components[i].component, okm)), bad_components[i].needle);
        free(j);
    }
    expect_load_error(dir, "e12", (j = m2d_strfmt("{\"added_tokens\": [{\"content\": \"x\"}], %s}", okm)),
                      "field 'added_tokens[0].id'");
    free(j);
    expect_load_error(dir, "e13", "{\"model\": {\"type\": \"BPE\", \"dropout\": 0.1, \"vocab\": {}, \"merges\": []}}",
                      "field 'model.dropout'");
    expect_load_error(dir, "e14", "[1, 2]", "expected a JSON object");
    expect_load_error(dir, "e16", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 2000000000}, \"merges\": []}}",
                      "field 'model.vocab.a': expected an integer id in [0, 16777215]");
    expect_load_error(dir, "e15", "{}", "field 'model'");
    /* a broken tokenizer_config.json is an error too (it was meant to be read) */
    char *p = write_tokenizer(dir, "cfg", (j = m2d_strfmt("{%s}", okm)));
    free(j);
    char *cfg = m2d_strfmt("%s/cfg/tokenizer_config.json", dir);
    tu_write(cfg, "{\"eos_token\": \"<nope>\"}", 23);
    assert_int_equal(m2d_tokenizer_load(p, &tk), -1);
    assert_non_null(strstr(m2d_errmsg(), "field 'eos_token': token '<nope>' is not in the vocabulary"));
    free(cfg), free(p);
    tu_rm_rf(dir);
    free(dir);
}

static void invalid_utf8_and_bad_ids(void **state) {
    (void)state;
    if (!tiny_dir()) TU_SKIP("../shared/models/tiny-qwen3moe not present");
    const m2d_tokenizer *tk = tiny();
    struct { const char *s; size_t n, off; } bad[] = {
        {"abc\xFF", 4, 3},          {"ab\xC0\x80", 4, 2},        /* overlong */
        {"\xED\xA0\x80", 3, 0},     /* surrogate */             {"xy\xE2\x82", 4, 2}, /* truncated */
        {"\xF4\x90\x80\x80", 4, 0}, /* > U+10FFFF */            {"ok\x80", 3, 2},     /* lone continuation */
    };
    for (size_t i = 0; i < M2D_ARRAY_LEN(bad); i++) {
        int32_t *ids = NULL;
        size_t n = 0;
        assert_int_equal(m2d_tokenizer_encode(tk, bad[i].s, bad[i].n, &ids, &n), -1);
        assert_null(ids);
        char want[64];
        snprintf(want, sizeof want, "invalid UTF-8 at byte offset %zu", bad[i].off);
        if (!strstr(m2d_errmsg(), want)) fail_msg("'%s' lacks '%s'", m2d_errmsg(), want);
    }
    /* embedded NUL is valid text */
    idvec z = encode(tk, "a\0b", 3);
    assert_true(z.n >= 3);
    free(z.v);
    int32_t oob[] = {5, 8192};
    char *text;
    size_t tl;
    assert_int_equal(m2d_tokenizer_decode(tk, oob, 2, &text, &tl), -1);
    assert_non_null(strstr(m2d_errmsg(), "id 8192 (position 1) out of range [0, 8192)"));
    int32_t neg[] = {-1};
    assert_int_equal(m2d_tokenizer_decode(tk, neg, 1, &text, &tl), -1);
    /* invalid UTF-8 from ids: lossy decode gives one U+FFFD per maximal invalid subpart,
     * decode_bytes gives the raw bytes. Byte-level ids: 0xE2 -> 'â' (id of that char), etc. */
    char *raw;
    size_t rn;
    int32_t ids3[3];
    ids3[0] = m2d_tokenizer_token_id(tk, "\xC3\xA2"); /* 'â' = byte 0xE2 */
    ids3[1] = m2d_tokenizer_token_id(tk, "\xC4\xA4"); /* U+0124 = byte 0x82 (0x7F is U+0121) */
    ids3[2] = m2d_tokenizer_token_id(tk, "a");
    assert_true(ids3[0] >= 0 && ids3[1] >= 0 && ids3[2] >= 0);
    assert_int_equal(m2d_tokenizer_decode_bytes(tk, ids3, 3, &raw, &rn), 0);
    assert_int_equal(rn, 3);
    assert_memory_equal(raw, "\xE2\x82" "a", 3);
    assert_int_equal(m2d_tokenizer_decode(tk, ids3, 3, &text, &tl), 0);
    assert_string_equal(text, "\xEF\xBF\xBD" "a");
    free(raw), free(text);
}

/* ---- CLI ------------------------------------------------------------------------------------ */

static void cli_encode_decode(void **state) {
    (void)state;
    if (!tiny_dir()) TU_SKIP("../shared/models/tiny-qwen3moe not present");
    char *dir = tu_tmpdir();
    char *in = m2d_path_join(dir, "in.txt"), *idf = m2d_path_join(dir, "ids.txt");
    const char *text = "Hello world<|endoftext|>\n\n  tabs\there\n";
    tu_write(in, text, strlen(text));
    char *out = NULL, *err = NULL, *cmd;
    /* --file and stdin agree, and match the library */
    cmd = m2d_strfmt("%s tokenize --model %s --file %s", tu_bin(), tiny_dir(), in);
    assert_int_equal(tu_run(cmd, &out, &err), 0);
    free(cmd);
    char *out2 = NULL;
    cmd = m2d_strfmt("%s tokenize --model %s/tokenizer.json < %s", tu_bin(), tiny_dir(), in);
    /* tu_run redirects stdin from /dev/null; the inner redirect wins */
    assert_int_equal(tu_run(cmd, &out2, NULL), 0);
    free(cmd);
    assert_string_equal(out, out2);
    idvec got = parse_line(out, NULL), want = encode_str(tiny(), text);
    assert_ids_equal(got, want, "CLI");
    assert_int_equal(out[strlen(out) - 1], '\n');
    tu_write(idf, out, strlen(out));
    free(out), free(out2), free(err);
    /* --decode prints the text exactly */
    cmd = m2d_strfmt("%s tokenize --model %s --decode --file %s", tu_bin(), tiny_dir(), idf);
    assert_int_equal(tu_run(cmd, &out, &err), 0);
    free(cmd);
    assert_string_equal(out, text);
    free(out), free(err), free(got.v), free(want.v);
    /* usage */
    cmd = m2d_strfmt("%s help tokenize", tu_bin());
    assert_int_equal(tu_run(cmd, &out, NULL), 0);
    assert_non_null(strstr(out, "--decode"));
    assert_non_null(strstr(out, "--file"));
    free(cmd), free(out);
    free(in), free(idf);
    tu_rm_rf(dir);
    free(dir);
}

static void cli_expect_fail(const char *args, const char *needle) {
    char *cmd = m2d_strfmt("%s tokenize %s", tu_bin(), args);
    char *out = NULL, *err = NULL;
    int rc = tu_run(cmd, &out, &err);
    if (rc == 0 || rc >= 128) fail_msg("'%s': exit %d (want a clean non-zero exit)", cmd, rc);
    assert_string_equal(out, "");
    if (!strstr(err, needle)) fail_msg("'%s': stderr '%s' lacks '%s'", cmd, err, needle);
    int lines = 0;
    for (const char *q = err; *q; q++) lines += *q == '\n';
    if (lines != 1) fail_msg("'%s': stderr is %d lines, want 1: %s", cmd, lines, err);
    free(cmd), free(out), free(err);
}

static void cli_bad_input(void **state) {
    (void)state;
    if (!tiny_dir()) TU_SKIP("../shared/models/tiny-qwen3moe not present");
    char *dir = tu_tmpdir();
    char *bad = m2d_path_join(dir, "bad.txt"), *ids = m2d_path_join(dir, "ids.txt"), *word = m2d_path_join(dir, "w.txt");
    tu_write(bad, "ok \xC3\x28", 5);
    tu_write(ids, "1 2 99999\n", 10);
    tu_write(word, "1 2 x3\n", 7);
    char *broken = write_tokenizer(dir, "broken", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]}}");
    char *uni = write_tokenizer(dir, "uni", "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}");
    char *a;
    cli_expect_fail("--model /nonexistent/x", "/nonexistent/x: cannot open");
    cli_expect_fail("--file x", "--model DIR is required");
    cli_expect_fail((a = m2d_strfmt("--model %s --file /nonexistent/in.txt", tiny_dir())), "/nonexistent/in.txt: cannot open");
    free(a);
    cli_expect_fail((a = m2d_strfmt("--model %s --file %s", tiny_dir(), bad)), "invalid UTF-8 at byte offset 3");
    free(a);
    cli_expect_fail((a = m2d_strfmt("--model %s --decode --file %s", tiny_dir(), ids)), "id 99999 (position 2) out of range");
    free(a);
    cli_expect_fail((a = m2d_strfmt("--model %s --decode --file %s", tiny_dir(), word)), "byte offset 4: expected a token id");
    free(a);
    cli_expect_fail((a = m2d_strfmt("--model %s --file %s", broken, bad)), "field 'model.merges[0]'");
    free(a);
    cli_expect_fail((a = m2d_strfmt("--model %s", uni)), "field 'model.type': 'Unigram' not supported (supported: BPE)");
    free(a);
    cli_expect_fail("--model", "needs a value");
    free(bad), free(ids), free(word), free(broken), free(uni);
    tu_rm_rf(dir);
    free(dir);
}

/* ---- concurrency: one loaded tokenizer, two threads ------------------------------------------- */

typedef struct {
    const char *text;
    size_t n;
    idvec out;
} job;

static void *encode_job(void *arg) {
    job *j = arg;
    if (m2d_tokenizer_encode(tiny(), j->text, j->n, &j->out.v, &j->out.n)) j->out.v = NULL;
    return NULL;
}

static void concurrent_encodes(void **state) {
    (void)state;
    if (!tiny_dir()) TU_SKIP("../shared/models/tiny-qwen3moe not present");
    size_t n;
    char *text = slurp(tu_data_path(WIKI_TEST), &n);
    n = M2D_MIN(n, (size_t)200000);
    (void)tiny();
    job jobs[2] = {{text, n, {0}}, {text, n, {0}}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&th[i], NULL, encode_job, &jobs[i]), 0);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    idvec ref = encode(tiny(), text, n);
    for (int i = 0; i < 2; i++) {
        assert_non_null(jobs[i].out.v);
        assert_ids_equal(jobs[i].out, ref, "thread");
        free(jobs[i].out.v);
    }
    free(ref.v), free(text);
}

static void special_ids(void **state) {
    (void)state;
    if (!tiny_dir()) TU_SKIP("../shared/models/tiny-qwen3moe not present");
    assert_int_equal(m2d_tokenizer_vocab_size(tiny()), 8192);
    assert_int_equal(m2d_tokenizer_eos_id(tiny()), 8189);
    assert_int_equal(m2d_tokenizer_bos_id(tiny()), -1);
    assert_int_equal(m2d_tokenizer_token_id(tiny(), "<|im_start|>"), 8190);
    if (qwen3_dir()) {
        assert_int_equal(m2d_tokenizer_vocab_size(qwen3()), 151669);
        assert_int_equal(m2d_tokenizer_eos_id(qwen3()), 151645); /* <|im_end|> */
        assert_int_equal(m2d_tokenizer_token_id(qwen3(), "<|endoftext|>"), 151643);
    }
}

static int teardown(void **state) {
    (void)state;
    m2d_tokenizer_free(g_qwen3);
    m2d_tokenizer_free(g_tiny);
    for (size_t i = 0; i < g_n_hand; i++) free(g_hand[i].json), free(g_hand[i].text), free(g_hand[i].what);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(merges_both_serialisations),
        cmocka_unit_test(split_behaviours),
        cmocka_unit_test(regex_escapes_like_oniguruma),
        cmocka_unit_test(added_token_flags),
        cmocka_unit_test(bpe_model_options),
        cmocka_unit_test(sentencepiece_pipelines),
        cmocka_unit_test(post_processors),
        cmocka_unit_test(bad_tokenizer_json),
        cmocka_unit_test(invalid_utf8_and_bad_ids),
        cmocka_unit_test(special_ids),
        cmocka_unit_test(tiny_golden_tokens),
        cmocka_unit_test(whitespace_class_like_oniguruma),
        cmocka_unit_test(bpe_scan_equals_heap),
        cmocka_unit_test(nfc_fast_equals_reference),
        cmocka_unit_test(roundtrip),
        cmocka_unit_test(concurrent_encodes),
        cmocka_unit_test(cli_encode_decode),
        cmocka_unit_test(cli_bad_input),
        cmocka_unit_test(tiny_wikitext_matches_reference),
        cmocka_unit_test(tiny_hard_cases_match_reference),
        cmocka_unit_test(bytelevel_regex_variant_matches_reference),
        cmocka_unit_test(qwen3_wikitext_matches_reference),
        cmocka_unit_test(qwen3_hard_cases_match_reference),
        cmocka_unit_test(hand_cases_match_reference),
        cmocka_unit_test(deepseek_v2_matches_reference),
        cmocka_unit_test(gpt_oss_matches_reference),
        cmocka_unit_test(olmoe_matches_reference),
        cmocka_unit_test(mixtral_matches_reference),
        cmocka_unit_test(mistral_metaspace_matches_reference),
        cmocka_unit_test(metaspace_variants_match_reference),
        cmocka_unit_test(word_cuts_equal_whole_words),
    };
    return cmocka_run_group_tests(tests, NULL, teardown);
}
