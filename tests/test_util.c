/* util: SHA-256 against FIPS 180-4 vectors, option parsing, atomic writes. */
#include "testutil.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

static void sha256_known_vectors(void **state) {
    (void)state;
    char hex[65];
    m2d_sha256_hex("abc", 3, hex);
    assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    m2d_sha256_hex("", 0, hex);
    assert_string_equal(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    m2d_sha256_hex(two, strlen(two), hex);
    assert_string_equal(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    /* one million 'a' fed in uneven chunks exercises the block boundary logic */
    m2d_sha256 s;
    m2d_sha256_init(&s);
    char a[997];
    memset(a, 'a', sizeof a);
    size_t left = 1000000;
    while (left) {
        size_t n = left < sizeof a ? left : sizeof a;
        m2d_sha256_update(&s, a, n);
        left -= n;
    }
    uint8_t d[32];
    m2d_sha256_final(&s, d);
    m2d_hex(d, 32, hex);
    assert_string_equal(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

static void options_parse_and_reject(void **state) {
    (void)state;
    const char *model = NULL, *k = NULL;
    int json = 0, npos = 0;
    m2d_opt opts[] = {{"--model", 1, &model, NULL}, {"-K", 1, &k, NULL}, {"--json", 0, NULL, &json}, {0}};
    char *argv1[] = {"x", "--model", "dir", "-K=8", "--json", "pos"};
    char *pos[2];
    assert_int_equal(m2d_parse_opts("x", 6, argv1, opts, pos, 2, &npos), 0);
    assert_string_equal(model, "dir");
    assert_string_equal(k, "8");
    assert_int_equal(json, 1);
    assert_int_equal(npos, 1);
    char *argv2[] = {"x", "--bogus"};
    assert_int_equal(m2d_parse_opts("x", 2, argv2, opts, pos, 2, &npos), -1);
    assert_non_null(strstr(m2d_errmsg(), "--bogus"));
    char *argv3[] = {"x", "--model"};
    assert_int_equal(m2d_parse_opts("x", 2, argv3, opts, pos, 2, &npos), -1);
    assert_non_null(strstr(m2d_errmsg(), "needs a value"));
    long v;
    assert_int_equal(m2d_parse_int("x", "-K", "12a", 1, 100, &v), -1);
    assert_int_equal(m2d_parse_int("x", "-K", "12", 1, 100, &v), 0);
    assert_int_equal(v, 12);
}

static void atomic_write_roundtrip(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    char *p = m2d_path_join(dir, "f.bin");
    assert_int_equal(m2d_write_file_atomic(p, "hello", 5), 0);
    size_t n;
    char *s = m2d_read_file(p, &n);
    assert_int_equal(n, 5);
    assert_string_equal(s, "hello");
    free(s);
    assert_null(m2d_read_file("/nonexistent/zzz", &n));
    assert_non_null(strstr(m2d_errmsg(), "/nonexistent/zzz"));
    tu_rm_rf(dir);
    free(p);
    free(dir);
}

/* m2d_err_prefix keeps the whole message behind the prefix; m2d_read_stream reads to the end. */
static void error_prefix_and_stream_read(void **state) {
    (void)state;
    assert_int_equal(m2d_err("id %d out of range", 7), -1);
    assert_int_equal(m2d_err_prefix("stdin"), -1);
    assert_string_equal(m2d_errmsg(), "stdin: id 7 out of range");
    /* one line, whatever a file put in a quoted value (found by fuzz_stats: a newline in 'magic') */
    assert_int_equal(m2d_err("f: field 'magic': '%s'", "m\noe\r\x1b[2J\x7f"), -1);
    assert_string_equal(m2d_errmsg(), "f: field 'magic': 'm?oe??[2J?'");
    char *big = m2d_strfmt("%0*d", 200000, 5); /* longer than the first read buffer */
    assert_int_equal(strlen(big), 200000);
    FILE *f = tmpfile();
    assert_non_null(f);
    fputs(big, f);
    rewind(f);
    size_t n;
    char *s = m2d_read_stream(f, "tmp", &n);
    fclose(f);
    assert_int_equal(n, 200000);
    assert_string_equal(s, big);
    free(s);
    free(big);
}

/* Registries keep their entries sorted by name whatever the registration order. */
typedef struct { int id; const char *name; } named;

static void name_table_sorted(void **state) {
    (void)state;
    static const named b = {1, "beta"}, a = {2, "alpha"}, c = {3, "gamma"};
    const void *items[3];
    m2d_name_table t = {items, 0, 3, offsetof(named, name), "full"};
    m2d_name_table_add(&t, &b);
    m2d_name_table_add(&t, &c);
    m2d_name_table_add(&t, &a);
    assert_int_equal(t.n, 3);
    assert_ptr_equal(items[0], &a);
    assert_ptr_equal(items[1], &b);
    assert_ptr_equal(items[2], &c);
    assert_ptr_equal(m2d_name_table_find(&t, "gamma"), &c);
    assert_null(m2d_name_table_find(&t, "gam"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sha256_known_vectors),
        cmocka_unit_test(options_parse_and_reject),
        cmocka_unit_test(atomic_write_roundtrip),
        cmocka_unit_test(error_prefix_and_stream_read),
        cmocka_unit_test(name_table_sorted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
