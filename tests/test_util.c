/* util: SHA-256 against FIPS 180-4 vectors, option parsing, atomic writes, progress lines on a log. */
#include "testutil.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* byte counts (--mem-budget) and directory parts (the spill file's place) */
static void bytes_and_dirs(void **state) {
    (void)state;
    size_t b;
    const char *ok[] = {"512", "20G", "20GiB", "1.5g", "64M", "64MB", "1T", "3k"};
    const size_t want[] = {512, (size_t)20 << 30, (size_t)20 << 30, (size_t)3 << 29, (size_t)64 << 20, (size_t)64 << 20,
                           (size_t)1 << 40, 3072};
    for (int i = 0; i < 8; i++) {
        assert_int_equal(m2d_parse_bytes("t", "--mem-budget", ok[i], &b), 0);
        assert_true(b == want[i]);
    }
    const char *bad[] = {"", "G", "-1G", "12X", "1GG", "nan", "1e30"};
    for (int i = 0; i < 7; i++) {
        assert_int_equal(m2d_parse_bytes("t", "--mem-budget", bad[i], &b), -1);
        assert_non_null(strstr(m2d_errmsg(), "t: option --mem-budget:"));
    }
    const char *paths[][2] = {{"a/b/c.stats", "a/b"}, {"c.stats", "."}, {"/c", "/"}, {"/x/y", "/x"}};
    for (int i = 0; i < 4; i++) {
        char *d = m2d_path_dir(paths[i][0]);
        assert_string_equal(d, paths[i][1]);
        free(d);
    }
    assert_true(m2d_default_mem_budget() > 0 && m2d_default_mem_budget() <= m2d_physical_ram());
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

/* ---- progress on a log (stderr not a terminal) ---- */

/* Runs N updates of a progress over SECS fake seconds with stderr sent to a file; returns what
 * was printed (caller frees). */
static char *logged_progress(const char *dir, int n, double secs) {
    char *path = m2d_path_join(dir, "stderr.log");
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    assert_non_null(freopen(path, "w", stderr));
    m2d_progress p;
    m2d_progress_start(&p, "calibrate", n);
    p.t0 = p.last_print = 0;
    for (int i = 1; i <= n; i++) m2d_progress_update_at(&p, i, secs * i / n);
    m2d_progress_end(&p);
    fflush(stderr);
    assert_int_equal(dup2(saved, STDERR_FILENO), STDERR_FILENO);
    close(saved);
    size_t len;
    char *out = m2d_read_file(path, &len);
    assert_non_null(out);
    free(path);
    return out;
}

static int count_char(const char *s, char c) {
    int k = 0;
    for (; *s; s++) k += *s == c;
    return k;
}

/* Logged: whole lines (no \r, no escape), one per 5 % when slow enough, one a minute at most
 * otherwise; a closing line; nothing for a run under 5 s; nothing with $M2D_QUIET. */
static void progress_when_logged(void **state) {
    (void)state;
    char *quiet = getenv("M2D_QUIET") ? m2d_strdup(getenv("M2D_QUIET")) : NULL;
    unsetenv("M2D_QUIET");
    char *dir = tu_tmpdir();
    char *out = logged_progress(dir, 100, 1000); /* 10 s an item: a line every 5 items */
    assert_int_equal(count_char(out, '\n'), 21);
    assert_int_equal(count_char(out, '\r') + count_char(out, '\033'), 0);
    assert_non_null(strstr(out, "calibrate 5/100 (5.0%) elapsed 0m50s ETA 15m50s\n"));
    assert_non_null(strstr(out, "calibrate 100/100 (100.0%)"));
    assert_non_null(strstr(out, "calibrate done in "));
    free(out);
    out = logged_progress(dir, 1000, 3 * 3600.0); /* 3 hours: a line a minute at most */
    assert_in_range(count_char(out, '\n'), 150, 181);
    free(out);
    out = logged_progress(dir, 1000, 4.9); /* short: silent */
    assert_string_equal(out, "");
    free(out);
    setenv("M2D_QUIET", "1", 1);
    out = logged_progress(dir, 100, 1000);
    assert_string_equal(out, "");
    free(out);
    if (quiet) setenv("M2D_QUIET", quiet, 1);
    else unsetenv("M2D_QUIET");
    free(quiet);
    tu_rm_rf(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sha256_known_vectors),
        cmocka_unit_test(options_parse_and_reject),
        cmocka_unit_test(bytes_and_dirs),
        cmocka_unit_test(atomic_write_roundtrip),
        cmocka_unit_test(error_prefix_and_stream_read),
        cmocka_unit_test(name_table_sorted),
        cmocka_unit_test(progress_when_logged),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
