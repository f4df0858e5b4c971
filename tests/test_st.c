/* st: safetensors writer/reader round trips (bit-identical), determinism, sharding, and
 * rejection of every kind of malformed file with a one-line error naming file and field. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include "io/st.h"
#include "base/util.h"

/* ---- raw file construction ---- */

/* 8-byte little-endian length + HEADER + DATA_LEN bytes of data (byte i = i & 255). */
static uint8_t *raw_file(const char *header, uint64_t claimed_len, size_t data_len, size_t *n) {
    size_t h = strlen(header);
    *n = 8 + h + data_len;
    uint8_t *b = m2d_malloc(*n);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(claimed_len >> (8 * i));
    memcpy(b + 8, header, h);
    for (size_t i = 0; i < data_len; i++) b[8 + h + i] = (uint8_t)i;
    return b;
}

/* Parse HEADER (+ data) from memory; expect failure whose message contains all needles. */
static void expect_bad(const char *header, size_t data_len, const char *n1, const char *n2) {
    size_t n;
    uint8_t *b = raw_file(header, strlen(header), data_len, &n);
    m2d_st *st = (m2d_st *)0x1;
    m2d_err_clear();
    int rc = m2d_st_open_buffer("x.safetensors", b, n, &st);
    const char *msg = m2d_errmsg();
    if (rc != -1) fail_msg("accepted bad header: %s", header);
    assert_null(st);
    if (strncmp(msg, "x.safetensors: ", 15) != 0 || !strstr(msg, n1) || (n2 && !strstr(msg, n2)) || strchr(msg, '\n'))
        fail_msg("header %s: unexpected message: %s", header, msg);
    free(b);
}

static void expect_good(const char *header, size_t data_len, int count) {
    size_t n;
    uint8_t *b = raw_file(header, strlen(header), data_len, &n);
    m2d_st *st;
    if (m2d_st_open_buffer("x.safetensors", b, n, &st) != 0) fail_msg("%s: %s", header, m2d_errmsg());
    assert_int_equal(m2d_st_count(st), count);
    m2d_st_close(st);
    free(b);
}

#define T1 "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}"

static void header_validation(void **state) {
    (void)state;
    expect_good("{" T1 "}", 8, 1);
    expect_good("{" T1 "}   ", 8, 1);       /* space padding */
    expect_good("{}", 0, 0);                 /* empty file is valid */
    expect_good("{\"__metadata__\":{\"format\":\"pt\"}," T1 "}", 8, 1);
    expect_good("{\"s\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]}}", 8, 1);    /* scalar */
    expect_good("{\"e\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[0,0]}," T1 "}", 8, 2); /* empty */
    expect_bad("{" T1, 8, "field 'header'", "malformed JSON");
    expect_bad("{" T1 "}xx", 8, "field 'header'", "after the JSON");
    expect_bad("[1,2]", 0, "field 'header'", "object");
    expect_bad("{\"a\":3}", 0, "tensor 'a'", "object");
    expect_bad("{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "tensor 'a': field 'dtype': missing", NULL);
    expect_bad("{\"a\":{\"dtype\":7,\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "field 'dtype'", "string");
    expect_bad("{\"a\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "field 'dtype': unknown dtype 'Q4'",
               NULL);
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, "field 'shape': missing", NULL);
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8, "field 'shape'", "array");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, "field 'shape'", "dimension 0");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", 8, "field 'shape'", NULL);
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 8, "field 'shape'", NULL);
    expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,1]}}", 1, "field 'shape'",
               "5 dimensions");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "field 'data_offsets': missing", NULL);
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, "field 'data_offsets'", NULL);
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":\"0,8\"}}", 8, "field 'data_offsets'", NULL);
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 8, "field 'data_offsets'", NULL);
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, "field 'data_offsets'", "before");
    /* header lying about sizes */
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 12, "field 'data_offsets'",
               "does not match shape [3] x F32 (12 bytes)");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,8]}}", 8,
               "field 'shape'", "overflows");
    /* range beyond the file (truncated data) */
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 15, "field 'data_offsets'",
               "past the end of the data (15 bytes)");
    /* overlapping ranges */
    expect_bad("{" T1 ",\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "tensor 'b'",
               "overlaps tensor 'a' [0, 8)");
    /* duplicate names */
    expect_bad("{" T1 ",\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 16, "field 'header'",
               "duplicate key 'a'");
    /* a field twice in one entry: cJSON would take the first, safetensors' own reader not */
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
               "field 'a': duplicate key 'dtype'", NULL);
    expect_bad("{\"__metadata__\":{\"format\":\"pt\",\"format\":\"np\"}}", 0, "field '__metadata__': duplicate key 'format'",
               NULL);
    /* names from the file are quoted with control characters replaced: one line */
    expect_bad("{\"a\\nb\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "tensor 'a?b'", "'Q4'");
    /* metadata */
    expect_bad("{\"__metadata__\":{\"format\":1}}", 0, "field '__metadata__'", "'format'");
    expect_bad("{\"__metadata__\":[\"x\"]}", 0, "field '__metadata__'", NULL);
    expect_bad("{\"__metadata__\":{},\"__metadata__\":{}}", 0, "field 'header'", "duplicate key '__metadata__'");
}

/* The message format the issue asks for, verbatim. */
static void exact_mismatch_message(void **state) {
    (void)state;
    const char *h = "{\"model.layers.0.mlp.gate.weight\":{\"dtype\":\"BF16\",\"shape\":[64,192],"
                    "\"data_offsets\":[0,4096]}}";
    size_t n;
    uint8_t *b = raw_file(h, strlen(h), 4096, &n);
    m2d_st *st;
    assert_int_equal(m2d_st_open_buffer("model.safetensors", b, n, &st), -1);
    assert_string_equal(m2d_errmsg(), "model.safetensors: tensor 'model.layers.0.mlp.gate.weight': field "
                                      "'data_offsets': range [0, 4096) does not match shape [64, 192] x BF16 "
                                      "(24576 bytes)");
    free(b);
}

static void length_prefix(void **state) {
    (void)state;
    m2d_st *st;
    uint8_t tiny[5] = {1, 0, 0, 0, 0};
    assert_int_equal(m2d_st_open_buffer("x.safetensors", tiny, sizeof tiny, &st), -1);
    assert_non_null(strstr(m2d_errmsg(), "field 'header length'"));
    assert_non_null(strstr(m2d_errmsg(), "too short"));
    size_t n;
    uint8_t *b = raw_file("{}", 1000, 0, &n); /* claims more than the file holds */
    assert_int_equal(m2d_st_open_buffer("x.safetensors", b, n, &st), -1);
    assert_non_null(strstr(m2d_errmsg(), "x.safetensors: field 'header length': 1000 bytes"));
    free(b);
    b = raw_file("{}", (uint64_t)1 << 40, 0, &n); /* beyond the cap */
    assert_int_equal(m2d_st_open_buffer("x.safetensors", b, n, &st), -1);
    assert_non_null(strstr(m2d_errmsg(), "cap"));
    free(b);
    b = raw_file("{}", UINT64_MAX, 0, &n);
    assert_int_equal(m2d_st_open_buffer("x.safetensors", b, n, &st), -1);
    free(b);
}

/* ---- writer ---- */

static char *tmp_path(const char *dir, const char *name) { return m2d_path_join(dir, name); }

static uint8_t *slurp(const char *path, size_t *n) {
    uint8_t *b = (uint8_t *)m2d_read_file(path, n);
    if (!b) fail_msg("%s", m2d_errmsg());
    return b;
}

/* Every byte the writer tests compare (headers, data, file sha256) is exact on every CPU: fixed
 * literals (1.0 / 3 is a compile-time constant, correctly rounded), integers, and fp32 -> bf16 / f16
 * conversions that round to nearest even (integer arithmetic on the bits, or F16C, which is IEEE
 * too); no floating-point computation otherwise. */
static void fill_writer(m2d_st_writer *w, int reverse) {
    static const float f[6] = {1.0f, -2.5f, 3.14159f, 1e-30f, 65504.0f, -0.0f};
    static const double dd[2] = {1.0 / 3, -7};
    static const int32_t i32[3] = {-1, 0, 2147483647};
    static const int64_t i64[2] = {INT64_MIN, 42};
    static const uint8_t u8[5] = {0, 1, 2, 254, 255};
    int64_t s23[2] = {2, 3}, s2[1] = {2}, s3[1] = {3}, s5[1] = {5}, s0[2] = {0, 4};
    for (int k = 0; k < 2; k++) {
        if ((k == 0) != (reverse != 0)) {
            assert_int_equal(m2d_st_writer_add_f32(w, "w.f32", M2D_F32, 2, s23, f), 0);
            assert_int_equal(m2d_st_writer_add_f32(w, "w.bf16", M2D_BF16, 2, s23, f), 0);
            assert_int_equal(m2d_st_writer_add_f32(w, "w.f16", M2D_F16, 2, s23, f), 0);
            assert_int_equal(m2d_st_writer_add(w, "w.f64", M2D_F64, 1, s2, dd), 0);
        } else {
            assert_int_equal(m2d_st_writer_add(w, "i.32", M2D_I32, 1, s3, i32), 0);
            assert_int_equal(m2d_st_writer_add(w, "i.64", M2D_I64, 1, s2, i64), 0);
            assert_int_equal(m2d_st_writer_add(w, "u\"8\\\n\xc3\xa9", M2D_U8, 1, s5, u8), 0);
            assert_int_equal(m2d_st_writer_add(w, "empty", M2D_F32, 2, s0, NULL), 0);
            assert_int_equal(m2d_st_writer_add(w, "scalar", M2D_F64, 0, NULL, dd), 0);
        }
    }
    m2d_st_writer_metadata(w, reverse ? "z" : "format", reverse ? "last" : "pt");
    m2d_st_writer_metadata(w, reverse ? "format" : "z", reverse ? "pt" : "last");
}

/* All dtypes, a scalar, an empty tensor, escaped names, metadata: written and read back bit-exact;
 * insertion order does not matter; the header is 8-byte padded with spaces. */
static void writer_roundtrip_all_dtypes(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    char *p1 = tmp_path(dir, "a.safetensors"), *p2 = tmp_path(dir, "b.safetensors");
    m2d_st_writer *w = m2d_st_writer_new();
    fill_writer(w, 0);
    assert_int_equal(m2d_st_writer_write(w, p1), 0);
    m2d_st_writer_free(w);
    w = m2d_st_writer_new();
    fill_writer(w, 1);
    assert_int_equal(m2d_st_writer_write(w, p2), 0);
    m2d_st_writer_free(w);
    size_t n1, n2;
    uint8_t *b1 = slurp(p1, &n1), *b2 = slurp(p2, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(b1, b2, n1); /* the same tensors added in another order: bytes (see fill_writer) */
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | b1[i];
    assert_int_equal(hlen % 8, 0);
    assert_true(hlen + 8 <= n1);
    /* byte for byte what the reference writer (safetensors 0.8.0, which transformers' save_pretrained
     * uses) writes for these tensors and metadata: __metadata__ first, then tensors by dtype (widest
     * first) and name, no whitespace; values converted to bf16/f16 as torch does (round to nearest
     * even). Made by safetensors.torch.save_file(tensors, path, metadata={"format": "pt", "z": "last"}). */
    const char *want_header =
        "{\"__metadata__\":{\"format\":\"pt\",\"z\":\"last\"},\"i.64\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]},"
        "\"scalar\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[16,24]},\"w.f64\":{\"dtype\":\"F64\",\"shape\":[2],"
        "\"data_offsets\":[24,40]},\"empty\":{\"dtype\":\"F32\",\"shape\":[0,4],\"data_offsets\":[40,40]},\"w.f32\":{\"dtype\":"
        "\"F32\",\"shape\":[2,3],\"data_offsets\":[40,64]},\"i.32\":{\"dtype\":\"I32\",\"shape\":[3],\"data_offsets\":[64,76]},"
        "\"w.bf16\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[76,88]},\"w.f16\":{\"dtype\":\"F16\",\"shape\":[2,3],"
        "\"data_offsets\":[88,100]},\"u\\\"8\\\\\\n\xc3\xa9\":{\"dtype\":\"U8\",\"shape\":[5],\"data_offsets\":[100,105]}}    ";
    assert_int_equal(hlen, strlen(want_header));
    assert_memory_equal(b1 + 8, want_header, hlen);
    char sha[65];
    m2d_sha256_hex(b1, n1, sha);
    assert_string_equal(sha, "3968797d7d0b4acee7881f3065c39ef9d7cd1a1b54b9e7d4fd2613f0d1aec4c0");
    for (uint64_t i = hlen; i > 0 && b1[8 + i - 1] != '}'; i--) assert_int_equal(b1[8 + i - 1], ' ');

    m2d_st *st;
    if (m2d_st_open(p1, &st) != 0) fail_msg("%s", m2d_errmsg());
    assert_int_equal(m2d_st_count(st), 9);
    assert_string_equal(m2d_st_metadata(st, "format"), "pt");
    assert_string_equal(m2d_st_metadata(st, "z"), "last");
    assert_null(m2d_st_metadata(st, "nope"));
    for (int i = 1; i < m2d_st_count(st); i++)
        assert_true(strcmp(m2d_st_at(st, i - 1)->name, m2d_st_at(st, i)->name) < 0);
    const m2d_tensor *t = m2d_st_find(st, "w.bf16");
    assert_non_null(t);
    assert_int_equal(t->dtype, M2D_BF16);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[1], 3);
    assert_int_equal(t->nbytes, 12);
    float back[6];
    m2d_to_f32(t->dtype, t->data, 0, 6, back);
    assert_true(back[0] == 1.0f && back[1] == -2.5f);
    t = m2d_st_find(st, "w.f32");
    assert_memory_equal(t->data, ((const float[]){1.0f, -2.5f, 3.14159f, 1e-30f, 65504.0f, -0.0f}), 24);
    t = m2d_st_find(st, "i.64");
    assert_true(((const int64_t *)t->data)[0] == INT64_MIN);
    t = m2d_st_find(st, "u\"8\\\n\xc3\xa9");
    assert_non_null(t);
    assert_memory_equal(t->data, ((const uint8_t[]){0, 1, 2, 254, 255}), 5);
    t = m2d_st_find(st, "scalar");
    assert_int_equal(t->ndim, 0);
    assert_true(((const double *)t->data)[0] == 1.0 / 3);
    assert_int_equal(m2d_st_find(st, "empty")->nbytes, 0);
    assert_int_equal(m2d_st_file_count(st), 1);
    assert_string_equal(m2d_st_file_of(st, "w.f16"), p1);
    m2d_st_close(st);
    free(b1);
    free(b2);
    free(p1);
    free(p2);
    tu_rm_rf(dir);
    free(dir);
}

static int fill_zero(void *ctx, const char *name, size_t offset, void *buf, size_t n) {
    (void)ctx, (void)name, (void)offset;
    memset(buf, 0, n);
    return 0;
}

static void writer_rejects(void **state) {
    (void)state;
    m2d_st_writer *w = m2d_st_writer_new();
    int64_t s[1] = {1};
    float v = 0;
    assert_int_equal(m2d_st_writer_add_f32(w, "a", M2D_F32, 1, s, &v), 0);
    assert_int_equal(m2d_st_writer_add_f32(w, "a", M2D_F32, 1, s, &v), 0);
    assert_int_equal(m2d_st_writer_add_f32(w, "", M2D_F32, 1, s, &v), -1);
    assert_int_equal(m2d_st_writer_add_f32(w, "__metadata__", M2D_F32, 1, s, &v), -1);
    assert_int_equal(m2d_st_writer_add_f32(w, "i", M2D_I32, 1, s, &v), -1);
    assert_int_equal(m2d_st_writer_add(w, "null", M2D_F32, 1, s, NULL), -1);
    assert_non_null(strstr(m2d_errmsg(), "'null': data is NULL"));
    assert_int_equal(m2d_st_writer_add_ref(w, "null", M2D_F32, 1, s, NULL), -1);
    assert_int_equal(m2d_st_writer_add_lazy(w, "null", M2D_F32, 1, s, NULL, NULL), -1);
    assert_non_null(strstr(m2d_errmsg(), "'null': fill callback is NULL"));
    assert_int_equal(m2d_st_writer_add_lazy(w, "neg", M2D_F32, 1, (int64_t[]){-1}, fill_zero, NULL), -1);
    char *dir = tu_tmpdir(), *p = tmp_path(dir, "dup.safetensors");
    assert_int_equal(m2d_st_writer_write(w, p), -1);
    assert_non_null(strstr(m2d_errmsg(), "'a': added twice"));
    assert_false(m2d_file_exists(p)); /* nothing partial left behind */
    m2d_st_writer_free(w);
    w = m2d_st_writer_new();
    char *bad = m2d_strfmt("%s/no/such/dir/x.safetensors", dir);
    assert_int_equal(m2d_st_writer_write(w, bad), -1);
    m2d_st_writer_free(w);
    free(bad);
    free(p);
    tu_rm_rf(dir);
    free(dir);
}

/* The tiny teacher: read every tensor, write, re-read, compare bytes; writing twice is identical. */
static void tiny_teacher_roundtrip(void **state) {
    (void)state;
    const char *models = tu_models_dir();
    char *src = models ? m2d_path_join(models, "tiny-qwen3moe/model.safetensors") : NULL;
    if (!src || !m2d_file_exists(src)) {
        free(src);
        TU_SKIP("tiny-qwen3moe not found");
    }
    m2d_st *a;
    if (m2d_st_open(src, &a) != 0) fail_msg("%s", m2d_errmsg());
    assert_int_equal(m2d_st_count(a), 807);
    assert_string_equal(m2d_st_metadata(a, "format"), "pt");
    char *dir = tu_tmpdir(), *p1 = tmp_path(dir, "1.safetensors"), *p2 = tmp_path(dir, "2.safetensors");
    for (int pass = 0; pass < 2; pass++) {
        m2d_st_writer *w = m2d_st_writer_new();
        m2d_st_writer_metadata(w, "format", "pt");
        /* add in reverse order: the writer sorts */
        for (int i = m2d_st_count(a) - 1; i >= 0; i--) {
            const m2d_tensor *t = m2d_st_at(a, i);
            assert_int_equal(m2d_st_writer_add_ref(w, t->name, t->dtype, t->ndim, t->shape, t->data), 0);
        }
        assert_int_equal(m2d_st_writer_write(w, pass ? p2 : p1), 0);
        m2d_st_writer_free(w);
    }
    size_t n1, n2, n0;
    uint8_t *b1 = slurp(p1, &n1), *b2 = slurp(p2, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(b1, b2, n1); /* copied tensors, two orders of adding: bytes, no arithmetic */
    /* independent reference: the teacher's file was written by another safetensors writer, which
     * put __metadata__ last (the current one, 0.8.0, puts it first, as ours does: see
     * writer_roundtrip_all_dtypes). Same size, the same header object, the data byte for byte. */
    uint8_t *b0 = slurp(src, &n0);
    assert_int_equal(n0, n1);
    uint64_t hl0 = 0, hl1 = 0;
    for (int i = 7; i >= 0; i--) hl0 = hl0 << 8 | b0[i], hl1 = hl1 << 8 | b1[i];
    assert_int_equal(hl0, hl1);
    cJSON *j0 = cJSON_ParseWithLength((const char *)b0 + 8, hl0), *j1 = cJSON_ParseWithLength((const char *)b1 + 8, hl1);
    assert_true(cJSON_Compare(j0, j1, 1));
    cJSON_Delete(j0), cJSON_Delete(j1);
    assert_memory_equal(b0 + 8 + hl0, b1 + 8 + hl1, n1 - 8 - hl1); /* copied data: exact */
    free(b0);
    free(b1);
    free(b2);
    m2d_st *b;
    if (m2d_st_open(p1, &b) != 0) fail_msg("%s", m2d_errmsg());
    assert_int_equal(m2d_st_count(b), m2d_st_count(a));
    for (int i = 0; i < m2d_st_count(a); i++) {
        const m2d_tensor *x = m2d_st_at(a, i), *y = m2d_st_at(b, i);
        assert_string_equal(x->name, y->name);
        assert_int_equal(x->dtype, y->dtype);
        assert_int_equal(x->ndim, y->ndim);
        assert_memory_equal(x->shape, y->shape, sizeof(int64_t) * (size_t)x->ndim);
        assert_int_equal(x->nbytes, y->nbytes);
        assert_memory_equal(x->data, y->data, x->nbytes); /* read back what was copied: exact */
    }
    char h1[65], h2[65];
    m2d_st_hash(a, M2D_ST_HASH_FULL_MAX, h1);
    m2d_st_hash(b, M2D_ST_HASH_FULL_MAX, h2);
    assert_string_equal(h1, h2);
    m2d_st_close(a);
    m2d_st_close(b);
    free(p1);
    free(p2);
    free(src);
    tu_rm_rf(dir);
    free(dir);
}

/* ---- sharded ---- */

static char *sharded_dir(int *n_shards) {
    char *dir = tu_tmpdir();
    m2d_st_writer *w = m2d_st_writer_new();
    float v[64];
    for (int i = 0; i < 64; i++) v[i] = (float)i;
    int64_t s[1] = {64};
    for (int i = 0; i < 6; i++) {
        char name[16];
        snprintf(name, sizeof name, "t%d", i);
        assert_int_equal(m2d_st_writer_add_f32(w, name, M2D_F32, 1, s, v), 0);
    }
    assert_int_equal(m2d_st_writer_write_sharded(w, dir, 600, n_shards), 0); /* 2 tensors per shard */
    m2d_st_writer_free(w);
    return dir;
}

static void sharded_roundtrip(void **state) {
    (void)state;
    int ns;
    char *dir = sharded_dir(&ns);
    assert_int_equal(ns, 3);
    m2d_st *st;
    if (m2d_st_open(dir, &st) != 0) fail_msg("%s", m2d_errmsg());
    assert_int_equal(m2d_st_count(st), 6);
    assert_int_equal(m2d_st_file_count(st), 3);
    assert_non_null(strstr(m2d_st_file_of(st, "t5"), "model-00003-of-00003.safetensors"));
    assert_true(((const float *)m2d_st_find(st, "t4")->data)[63] == 63.0f);
    m2d_st_close(st);
    char *idx = m2d_path_join(dir, "model.safetensors.index.json");
    if (m2d_st_open(idx, &st) != 0) fail_msg("%s", m2d_errmsg());
    assert_int_equal(m2d_st_count(st), 6);
    m2d_st_close(st);
    /* the index as transformers' save_pretrained prints it (json.dumps(indent=2, sort_keys=True)) */
    size_t n;
    char *text = m2d_read_file(idx, &n);
    assert_string_equal(text, "{\n  \"metadata\": {\n    \"total_size\": 1536\n  },\n  \"weight_map\": {\n"
                              "    \"t0\": \"model-00001-of-00003.safetensors\",\n"
                              "    \"t1\": \"model-00001-of-00003.safetensors\",\n"
                              "    \"t2\": \"model-00002-of-00003.safetensors\",\n"
                              "    \"t3\": \"model-00002-of-00003.safetensors\",\n"
                              "    \"t4\": \"model-00003-of-00003.safetensors\",\n"
                              "    \"t5\": \"model-00003-of-00003.safetensors\"\n  }\n}\n");
    free(text);
    free(idx);
    tu_rm_rf(dir);
    free(dir);
}

/* ---- lazy tensors ---- */

/* fill callback over a tensor held in memory (CTX: its m2d_tensor) */
static int fill_from_tensor(void *ctx, const char *name, size_t offset, void *buf, size_t n) {
    const m2d_tensor *t = ctx;
    assert_string_equal(name, t->name);
    assert_true(offset + n <= t->nbytes);
    memcpy(buf, (const uint8_t *)t->data + offset, n);
    return 0;
}

/* A writer holding every tensor of ST lazily (fill_from_tensor), with fill_writer's metadata. */
static m2d_st_writer *lazy_copy_of(const m2d_st *st) {
    m2d_st_writer *w = m2d_st_writer_new();
    for (int i = 0; i < m2d_st_count(st); i++) {
        const m2d_tensor *t = m2d_st_at(st, i);
        assert_int_equal(m2d_st_writer_add_lazy(w, t->name, t->dtype, t->ndim, t->shape, fill_from_tensor, (void *)t), 0);
    }
    m2d_st_writer_metadata(w, "format", "pt");
    m2d_st_writer_metadata(w, "z", "last");
    return w;
}

static void assert_same_file(const char *a, const char *b) {
    size_t n1, n2;
    uint8_t *b1 = slurp(a, &n1), *b2 = slurp(b, &n2);
    if (n1 != n2 || memcmp(b1, b2, n1) != 0) fail_msg("%s and %s differ", a, b);
    free(b1);
    free(b2);
}

/* The same tensors copied at add time and produced at write time: the same bytes, one file or
 * sharded (every shard and the index). */
static void lazy_equals_copied(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), *p1 = tmp_path(dir, "copied.safetensors"), *p2 = tmp_path(dir, "lazy.safetensors");
    char *d1 = tmp_path(dir, "copied"), *d2 = tmp_path(dir, "lazy");
    assert_int_equal(m2d_mkdir_p(d1), 0);
    assert_int_equal(m2d_mkdir_p(d2), 0);
    m2d_st_writer *w = m2d_st_writer_new();
    fill_writer(w, 0);
    assert_int_equal(m2d_st_writer_write(w, p1), 0);
    int ns1, ns2;
    assert_int_equal(m2d_st_writer_write_sharded(w, d1, 20, &ns1), 0);
    m2d_st_writer_free(w);
    m2d_st *st;
    if (m2d_st_open(p1, &st) != 0) fail_msg("%s", m2d_errmsg());
    w = lazy_copy_of(st);
    assert_int_equal(m2d_st_writer_write(w, p2), 0);
    assert_int_equal(m2d_st_writer_write_sharded(w, d2, 20, &ns2), 0);
    m2d_st_writer_free(w);
    assert_same_file(p1, p2);
    assert_int_equal(ns1, ns2);
    assert_true(ns1 > 2);
    for (int s = 1; s <= ns1; s++) {
        char *name = m2d_strfmt("model-%05d-of-%05d.safetensors", s, ns1);
        char *a = tmp_path(d1, name), *b = tmp_path(d2, name);
        assert_same_file(a, b);
        free(a), free(b), free(name);
    }
    char *i1 = tmp_path(d1, "model.safetensors.index.json"), *i2 = tmp_path(d2, "model.safetensors.index.json");
    assert_same_file(i1, i2);
    m2d_st *sh;
    if (m2d_st_open(d2, &sh) != 0) fail_msg("%s", m2d_errmsg());
    assert_int_equal(m2d_st_count(sh), m2d_st_count(st));
    for (int i = 0; i < m2d_st_count(st); i++) {
        const m2d_tensor *x = m2d_st_at(st, i), *y = m2d_st_at(sh, i);
        assert_string_equal(x->name, y->name);
        assert_int_equal(x->dtype, y->dtype);
        assert_int_equal(x->nbytes, y->nbytes);
        assert_memory_equal(x->data, y->data, x->nbytes);
    }
    m2d_st_close(sh);
    m2d_st_close(st);
    free(i1), free(i2), free(p1), free(p2), free(d1), free(d2);
    tu_rm_rf(dir);
    free(dir);
}

/* Byte i of a tensor of test_chunked (a pattern the file is checked against) */
static uint8_t pattern_at(size_t i) { return (uint8_t)(i * 2654435761u >> 13); }

typedef struct {
    int calls;
    void *buf;           /* the buffer of the first call: every call gets the same one */
    size_t max_n;
    size_t heap0;        /* heap in use before the write (0: not measured) */
    size_t max_heap_growth;
    int fail_on;         /* fail when asked for this tensor index (-1: never) */
} fill_probe;

/* Bytes in use on the heap (glibc's count; ASan's allocator is not in it: 0 growth there). */
static size_t heap_in_use(void) {
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

/* Tensor "t<i>" (U8) filled with pattern_at from its start; records what the writer hands out. */
static int fill_pattern(void *ctx, const char *name, size_t offset, void *buf, size_t n) {
    fill_probe *p = ctx;
    int idx = atoi(name + 1);
    if (idx == p->fail_on) return m2d_err("generator for %s: out of entropy", name);
    if (!p->calls++) p->buf = buf;
    assert_ptr_equal(buf, p->buf);
    if (n > p->max_n) p->max_n = n;
    for (size_t i = 0; i < n; i++) ((uint8_t *)buf)[i] = pattern_at(offset + i);
    size_t heap = heap_in_use();
    if (p->heap0 && heap > p->heap0 && heap - p->heap0 > p->max_heap_growth) p->max_heap_growth = heap - p->heap0;
    return 0;
}

static void add_pattern_tensors(m2d_st_writer *w, fill_probe *p, int n, int64_t bytes) {
    for (int i = 0; i < n; i++) {
        char name[16];
        snprintf(name, sizeof name, "t%03d", i);
        assert_int_equal(m2d_st_writer_add_lazy(w, name, M2D_U8, 1, &bytes, fill_pattern, p), 0);
    }
}

/* A tensor larger than the chunk comes in chunks of M2D_ST_FILL_CHUNK through one buffer. */
static void lazy_chunked(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), *p = tmp_path(dir, "big.safetensors");
    m2d_st_writer *w = m2d_st_writer_new();
    fill_probe probe = {.fail_on = -1};
    add_pattern_tensors(w, &probe, 1, (int64_t)M2D_ST_FILL_CHUNK + 24);
    assert_int_equal(m2d_st_writer_write(w, p), 0);
    m2d_st_writer_free(w);
    assert_int_equal(probe.calls, 2);
    assert_int_equal(probe.max_n, M2D_ST_FILL_CHUNK);
    m2d_st *st;
    if (m2d_st_open(p, &st) != 0) fail_msg("%s", m2d_errmsg());
    const m2d_tensor *t = m2d_st_find(st, "t000");
    assert_int_equal(t->nbytes, M2D_ST_FILL_CHUNK + 24);
    for (size_t i = 0; i < t->nbytes; i++)
        if (((const uint8_t *)t->data)[i] != pattern_at(i)) fail_msg("byte %zu differs", i);
    m2d_st_close(st);
    free(p);
    tu_rm_rf(dir);
    free(dir);
}

/* A writer of many lazy tensors holds one tensor's buffer, not the model: 256 tensors of 256 KiB
 * (64 MiB) written sharded while the heap grows by less than two tensors (writer bookkeeping,
 * the index, and one buffer of 256 KiB). */
static void lazy_memory_is_one_tensor(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    const int64_t bytes = 256 << 10;
    m2d_st_writer *w = m2d_st_writer_new();
    fill_probe probe = {.fail_on = -1};
    add_pattern_tensors(w, &probe, 256, bytes);
    probe.heap0 = heap_in_use();
    int ns;
    assert_int_equal(m2d_st_writer_write_sharded(w, dir, (size_t)8 << 20, &ns), 0);
    m2d_st_writer_free(w);
    assert_int_equal(ns, 8);
    assert_int_equal(probe.calls, 256);
    assert_int_equal(probe.max_n, bytes);
    if (probe.max_heap_growth >= 2 * (size_t)bytes)
        fail_msg("the heap grew by %zu bytes while writing 256 lazy tensors of %lld", probe.max_heap_growth,
                 (long long)bytes);
    m2d_st *st;
    if (m2d_st_open(dir, &st) != 0) fail_msg("%s", m2d_errmsg());
    assert_int_equal(m2d_st_count(st), 256);
    const m2d_tensor *t = m2d_st_find(st, "t255");
    for (size_t i = 0; i < t->nbytes; i++) assert_int_equal(((const uint8_t *)t->data)[i], pattern_at(i));
    m2d_st_close(st);
    tu_rm_rf(dir);
    free(dir);
}

/* Names in DIR other than "." and ".." (one string, sorted, space-separated). */
static char *dir_listing(const char *dir) {
    char *cmd = m2d_strfmt("ls -A '%s' | tr '\\n' ' '", dir), *out = NULL;
    assert_int_equal(tu_run(cmd, &out, NULL), 0);
    free(cmd);
    return out ? out : m2d_strdup("");
}

/* A fill that fails (in the last shard, after the others are complete) leaves no new shard, no
 * index and no temp file; an earlier complete output in the directory stays as it was. */
static void lazy_failure_leaves_nothing(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), *single = tmp_path(dir, "one.safetensors");
    fill_probe probe = {.fail_on = 5};
    m2d_st_writer *w = m2d_st_writer_new();
    add_pattern_tensors(w, &probe, 6, 256);
    assert_int_equal(m2d_st_writer_write_sharded(w, dir, 512, NULL), -1);
    const char *msg = m2d_errmsg();
    if (!strstr(msg, "model-00003-of-00003.safetensors: tensor 't005'") || !strstr(msg, "out of entropy") ||
        strchr(msg, '\n'))
        fail_msg("unexpected message: %s", msg);
    char *ls = dir_listing(dir);
    assert_string_equal(ls, "");
    free(ls);
    probe.calls = 0; /* a new write, a new buffer */
    assert_int_equal(m2d_st_writer_write(w, single), -1);
    assert_non_null(strstr(m2d_errmsg(), "one.safetensors: tensor 't005'"));
    ls = dir_listing(dir);
    assert_string_equal(ls, "");
    free(ls);
    m2d_st_writer_free(w);
    /* over an earlier output of the same layout: it stays whole */
    int ns;
    tu_rm_rf(dir);
    free(dir);
    dir = sharded_dir(&ns);
    char *before = dir_listing(dir);
    w = m2d_st_writer_new();
    probe = (fill_probe){.fail_on = 5};
    add_pattern_tensors(w, &probe, 6, 256);
    assert_int_equal(m2d_st_writer_write_sharded(w, dir, 512, NULL), -1);
    m2d_st_writer_free(w);
    char *after = dir_listing(dir);
    assert_string_equal(before, after);
    m2d_st *st;
    if (m2d_st_open(dir, &st) != 0) fail_msg("%s", m2d_errmsg());
    assert_true(((const float *)m2d_st_find(st, "t4")->data)[63] == 63.0f);
    m2d_st_close(st);
    free(before), free(after), free(single);
    tu_rm_rf(dir);
    free(dir);
}

static void write_text(const char *dir, const char *name, const char *text) {
    char *p = m2d_path_join(dir, name);
    tu_write(p, text, strlen(text));
    free(p);
}

static void expect_bad_index(const char *index_json, const char *n1, const char *n2) {
    int ns;
    char *dir = sharded_dir(&ns);
    write_text(dir, "model.safetensors.index.json", index_json);
    m2d_st *st;
    assert_int_equal(m2d_st_open(dir, &st), -1);
    const char *msg = m2d_errmsg();
    if (!strstr(msg, n1) || (n2 && !strstr(msg, n2))) fail_msg("index %s: unexpected message: %s", index_json, msg);
    tu_rm_rf(dir);
    free(dir);
}

#define S1 "\"model-00001-of-00003.safetensors\""
#define S2 "\"model-00002-of-00003.safetensors\""
#define S3 "\"model-00003-of-00003.safetensors\""

static void bad_index(void **state) {
    (void)state;
    expect_bad_index("{\"weight_map\": {", "index.json: field '(root)'", "malformed");
    expect_bad_index("{\"weight_map\": {\"t0\": " S1 "}} {}", "index.json: field '(root)'", "after the JSON value");
    /* a key twice: Python keeps the last, cJSON found the first; the equal count hid unlisted t1 */
    expect_bad_index("{\"weight_map\": {\"t0\": " S1 ", \"t0\": " S1 ", \"t2\": " S2 ", \"t3\": " S2 ", \"t4\": " S3
                     ", \"t5\": " S3 "}}",
                     "index.json: field 'weight_map': duplicate key 't0'", NULL);
    expect_bad_index("{\"metadata\": {}}", "field 'weight_map'", "missing");
    expect_bad_index("{\"weight_map\": {\"t0\": 3}}", "field 'weight_map'", "'t0'");
    /* missing shard */
    expect_bad_index("{\"weight_map\": {\"t0\": " S1 ", \"t1\": " S1 ", \"t2\": \"model-00009-of-00009.safetensors\"}}",
                     "field 'weight_map'", "model-00009-of-00009.safetensors' (for tensor 't2') does not exist");
    /* weight_map names a tensor not in that shard */
    expect_bad_index("{\"weight_map\": {\"t0\": " S1 ", \"t1\": " S1 ", \"t2\": " S2 ", \"t3\": " S2 ", \"t4\": " S3
                     ", \"t5\": " S3 ", \"t9\": " S3 "}}",
                     "field 'weight_map'", "tensor 't9' is not in shard 'model-00003-of-00003.safetensors'");
    /* weight_map points at the wrong shard */
    expect_bad_index("{\"weight_map\": {\"t0\": " S1 ", \"t1\": " S2 ", \"t2\": " S2 ", \"t3\": " S2 ", \"t4\": " S3
                     ", \"t5\": " S3 "}}",
                     "tensor 't1' is mapped to 'model-00002-of-00003.safetensors'", "stored in");
    /* a shard tensor that the map does not list */
    expect_bad_index("{\"weight_map\": {\"t0\": " S1 ", \"t2\": " S2 ", \"t3\": " S2 ", \"t4\": " S3 ", \"t5\": " S3 "}}",
                     "tensor 't1'", "not listed");
    expect_bad_index("{\"weight_map\": {\"t0\": \"../x.safetensors\"}}", "field 'weight_map'", "relative");
}

/* The same tensor name in two shards is a duplicate. */
static void duplicate_across_shards(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    for (int s = 0; s < 2; s++) {
        m2d_st_writer *w = m2d_st_writer_new();
        float v = (float)s;
        int64_t shape[1] = {1};
        assert_int_equal(m2d_st_writer_add_f32(w, "same", M2D_F32, 1, shape, &v), 0);
        assert_int_equal(m2d_st_writer_add_f32(w, s ? "b" : "a", M2D_F32, 1, shape, &v), 0);
        char *p = m2d_strfmt("%s/s%d.safetensors", dir, s);
        assert_int_equal(m2d_st_writer_write(w, p), 0);
        m2d_st_writer_free(w);
        free(p);
    }
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\": {\"a\": \"s0.safetensors\", \"same\": \"s0.safetensors\", \"b\": \"s1.safetensors\"}}");
    m2d_st *st;
    assert_int_equal(m2d_st_open(dir, &st), -1);
    assert_non_null(strstr(m2d_errmsg(), "tensor 'same': duplicate name, also in"));
    tu_rm_rf(dir);
    free(dir);
}

/* Truncated file on disk, empty file, missing file, directory without weights. */
static void bad_files_on_disk(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), *p = tmp_path(dir, "m.safetensors");
    m2d_st_writer *w = m2d_st_writer_new();
    float v[16] = {0};
    int64_t s[1] = {16};
    assert_int_equal(m2d_st_writer_add_f32(w, "x", M2D_F32, 1, s, v), 0);
    assert_int_equal(m2d_st_writer_write(w, p), 0);
    m2d_st_writer_free(w);
    size_t n;
    uint8_t *b = slurp(p, &n);
    m2d_st *st;
    tu_write(p, b, n - 1); /* cut the last byte */
    assert_int_equal(m2d_st_open(p, &st), -1);
    assert_non_null(strstr(m2d_errmsg(), "tensor 'x': field 'data_offsets'"));
    assert_non_null(strstr(m2d_errmsg(), p));
    tu_write(p, b, 20); /* cut inside the header */
    assert_int_equal(m2d_st_open(p, &st), -1);
    assert_non_null(strstr(m2d_errmsg(), "field 'header length'"));
    tu_write(p, b, 0);
    assert_int_equal(m2d_st_open(p, &st), -1);
    assert_non_null(strstr(m2d_errmsg(), "too short"));
    free(b);
    assert_int_equal(m2d_st_open("/nonexistent/x.safetensors", &st), -1);
    assert_non_null(strstr(m2d_errmsg(), "/nonexistent/x.safetensors"));
    unlink(p);
    assert_int_equal(m2d_st_open(dir, &st), -1);
    assert_non_null(strstr(m2d_errmsg(), "no model.safetensors"));
    free(p);
    tu_rm_rf(dir);
    free(dir);
}

/* A header whose length is not a multiple of 8 leaves data misaligned; values must still read. */
static void misaligned_data_is_copied(void **state) {
    (void)state;
    const char *h = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}"; /* odd length */
    size_t hl = strlen(h), n = 8 + hl + 8;
    assert_true(hl % 4 != 0);
    uint8_t *b = m2d_calloc(1, n);
    b[0] = (uint8_t)hl;
    memcpy(b + 8, h, hl);
    float v[2] = {1.5f, -2.0f};
    memcpy(b + 8 + hl, v, 8);
    m2d_st *st;
    assert_int_equal(m2d_st_open_buffer("x", b, n, &st), 0);
    const m2d_tensor *t = m2d_st_find(st, "a");
    assert_int_equal((uintptr_t)t->data % 4, 0);
    assert_true(((const float *)t->data)[0] == 1.5f && ((const float *)t->data)[1] == -2.0f);
    m2d_st_close(st);
    free(b);
}

/* Sampled hashing (large checkpoints): deterministic, sees the first bytes of each tensor,
 * differs from full mode, and full mode sees every byte. */
static void hash_modes(void **state) {
    (void)state;
    enum { N = 1 << 18 };
    float *v = m2d_calloc(N, sizeof(float));
    int64_t s[1] = {N};
    char *dir = tu_tmpdir(), *p = tmp_path(dir, "h.safetensors");
    char full[3][65], samp[3][65];
    for (int variant = 0; variant < 3; variant++) {
        if (variant == 1) v[0] = 1.0f;          /* inside the first window */
        if (variant == 2) v[N / 2 + 3] = 2.0f;  /* full mode must see any byte */
        m2d_st_writer *w = m2d_st_writer_new();
        assert_int_equal(m2d_st_writer_add_f32(w, "big", M2D_F32, 1, s, v), 0);
        assert_int_equal(m2d_st_writer_write(w, p), 0);
        m2d_st_writer_free(w);
        m2d_st *st;
        assert_int_equal(m2d_st_open(p, &st), 0);
        m2d_st_hash(st, M2D_ST_HASH_FULL_MAX, full[variant]);
        m2d_st_hash(st, 0, samp[variant]);
        char again[65];
        m2d_st_hash(st, 0, again);
        assert_string_equal(again, samp[variant]);
        m2d_st_close(st);
    }
    assert_string_not_equal(full[0], samp[0]);
    assert_string_not_equal(full[0], full[1]);
    assert_string_not_equal(full[1], full[2]);
    assert_string_not_equal(samp[0], samp[1]);
    free(v);
    free(p);
    tu_rm_rf(dir);
    free(dir);
}

/* ---- the sampled hash reads only its windows ---- */
enum { SP_TENSORS = 4, SP_WIN = 1024, SP_INNER = 8, SP_SKIP = 1 << 20 };
#define SP_BYTES ((size_t)8 << 20)

/* A sparse file (no data blocks, nothing in the page cache) of SP_TENSORS BF16 tensors of
 * SP_BYTES each; returns the data block's offset. */
static size_t sparse_checkpoint(const char *path) {
    char hdr[1024];
    size_t h = 0;
    h += (size_t)snprintf(hdr + h, sizeof hdr - h, "{");
    for (int i = 0; i < SP_TENSORS; i++)
        h += (size_t)snprintf(hdr + h, sizeof hdr - h, "%s\"t%d\":{\"dtype\":\"BF16\",\"shape\":[%zu],"
                              "\"data_offsets\":[%zu,%zu]}", i ? "," : "", i, SP_BYTES / 2,
                              (size_t)i * SP_BYTES, (size_t)(i + 1) * SP_BYTES);
    h += (size_t)snprintf(hdr + h, sizeof hdr - h, "}");
    while (h % 8) hdr[h++] = ' ';
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)h >> (8 * i));
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, len, 8), 8);
    assert_int_equal(write(fd, hdr, h), (ssize_t)h);
    assert_int_equal(ftruncate(fd, (off_t)(8 + h + SP_TENSORS * SP_BYTES)), 0);
    assert_int_equal(fsync(fd), 0);
    close(fd);
    return 8 + h;
}

/* Is page PG (of PAGE bytes) within a page of a sampled window (mirrors st.c's sampling)? */
static int sp_sampled_page(size_t data_off, size_t pg, size_t page) {
    for (int i = 0; i < SP_TENSORS; i++) {
        size_t t0 = data_off + (size_t)i * SP_BYTES, stride = (SP_BYTES - 2 * SP_WIN) / SP_INNER;
        for (int k = 0; k < SP_INNER + 2; k++) {
            size_t w = t0 + (k == 0 ? 0 : k == SP_INNER + 1 ? SP_BYTES - SP_WIN : SP_WIN + (size_t)(k - 1) * stride);
            if (pg + 1 >= w / page && pg <= (w + SP_WIN - 1) / page + 1) return 1;
        }
    }
    return 0;
}

/* Pages of PATH in the page cache (mincore on a fresh mapping) past the first SP_SKIP bytes
 * (the header, faulted in by the open's parse): *IN within a page of a sampled window, *OUT
 * elsewhere. -1 when mincore cannot tell. */
static int sp_resident(const char *path, size_t data_off, size_t *in, size_t *out) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE), size = data_off + SP_TENSORS * SP_BYTES;
    size_t np = (size + page - 1) / page;
    int fd = open(path, O_RDONLY);
    void *map = fd < 0 ? MAP_FAILED : mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    unsigned char *vec = m2d_malloc(np);
    int rc = map == MAP_FAILED || mincore(map, size, vec) != 0 ? -1 : 0;
    *in = *out = 0;
    for (size_t pg = SP_SKIP / page; rc == 0 && pg < np; pg++)
        if (vec[pg] & 1) ++*(sp_sampled_page(data_off, pg, page) ? in : out);
    free(vec);
    if (map != MAP_FAILED) munmap(map, size);
    if (fd >= 0) close(fd);
    return rc;
}

/* Regression guard for issue 25: the sampled hash of a big checkpoint must bring only its
 * windows' pages into memory, not the read-around of each (which on a disk with 8 MB readahead
 * read a whole 46 GB checkpoint). Measured with mincore on a sparse file whose pages start out
 * uncached; where the filesystem caches no hole pages (tmpfs) nothing is measurable, which the
 * test says in a line (the checkout's ext4 here and in CI measures). */
static void hash_reads_only_samples(void **state) {
    (void)state;
    /* in the build folder when the runner names it (the checkout's disk; /tmp may be a tmpfs) */
    const char *build = getenv("M2D_BUILD");
    char tmpl[4096];
    snprintf(tmpl, sizeof tmpl, "%s/st-hash-XXXXXX", build ? build : "/tmp");
    char *dir = mkdtemp(tmpl) ? m2d_strdup(tmpl) : tu_tmpdir(), *p = tmp_path(dir, "sparse.safetensors");
    size_t data_off = sparse_checkpoint(p), in = 0, out = 0;
    m2d_st *st;
    assert_int_equal(m2d_st_open(p, &st), 0);
    int fd = open(p, O_RDONLY);
    assert_true(fd >= 0);
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED); /* what the open's parse read around */
    close(fd);
    char h[65];
    m2d_st_hash(st, 0, h);
    m2d_st_close(st);
    int rc = sp_resident(p, data_off, &in, &out);
    tu_rm_rf(dir);
    free(dir);
    free(p);
    if (rc != 0) fail_msg("measuring the resident pages (mincore) failed");
    if (in == 0) { /* not a skip: a filesystem with nothing to measure is said, not counted */
        print_message("hash_reads_only_samples: this filesystem caches no hole pages: nothing to measure\n");
        return;
    }
    if (out != 0) fail_msg("sampled hash brought %zu pages outside its windows into memory (%zu within)", out, in);
    print_message("sampled hash: %zu pages within its windows, none outside\n", in);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(header_validation),
        cmocka_unit_test(exact_mismatch_message),
        cmocka_unit_test(length_prefix),
        cmocka_unit_test(writer_roundtrip_all_dtypes),
        cmocka_unit_test(writer_rejects),
        cmocka_unit_test(tiny_teacher_roundtrip),
        cmocka_unit_test(sharded_roundtrip),
        cmocka_unit_test(lazy_equals_copied),
        cmocka_unit_test(lazy_chunked),
        cmocka_unit_test(lazy_memory_is_one_tensor),
        cmocka_unit_test(lazy_failure_leaves_nothing),
        cmocka_unit_test(bad_index),
        cmocka_unit_test(duplicate_across_shards),
        cmocka_unit_test(bad_files_on_disk),
        cmocka_unit_test(misaligned_data_is_copied),
        cmocka_unit_test(hash_modes),
        cmocka_unit_test(hash_reads_only_samples),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
