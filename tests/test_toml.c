/* toml: the experiments.toml subset — values, tables, arrays of tables, strictness, positions. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "io/toml.h"
#include "base/util.h"

static m2d_toml *parse(const char *s) { return m2d_toml_parse(s, strlen(s), "t.toml"); }

/* Parse must fail and the message must contain WANT (file:line:col and the reason). */
static void expect_error(const char *doc, const char *want) {
    m2d_toml *t = parse(doc);
    if (t) fail_msg("parsed but should fail: %s", doc);
    if (!strstr(m2d_errmsg(), want)) fail_msg("error '%s' lacks '%s' for doc: %s", m2d_errmsg(), want, doc);
}

static void scalars_and_strings(void **state) {
    (void)state;
    m2d_toml *t = parse("# comment\n"
                        "a = 1\n"
                        "b = -2_000   # trailing comment\n"
                        "c = 1.5e3\n"
                        "d = true\n"
                        "e = false\n"
                        "f = \"tab\\there \\\"q\\\" \\u00e9 \\U0001F600\"\n"
                        "g = 'C:\\path\\no-escapes'\n"
                        "\"quoted key\" = +inf\n"
                        "h = -nan\r\n"
                        "i = 0\n"
                        "j = 3.25\n");
    assert_non_null(t);
    assert_int_equal(m2d_toml_get(t, "a")->i, 1);
    assert_int_equal(m2d_toml_get(t, "b")->i, -2000);
    assert_int_equal(m2d_toml_get(t, "c")->type, M2D_TOML_FLOAT);
    assert_true(m2d_toml_get(t, "c")->f == 1500.0);
    assert_int_equal(m2d_toml_get(t, "d")->type, M2D_TOML_BOOL);
    assert_int_equal(m2d_toml_get(t, "d")->i, 1);
    assert_int_equal(m2d_toml_get(t, "e")->i, 0);
    assert_string_equal(m2d_toml_get(t, "f")->str, "tab\there \"q\" \xc3\xa9 \xf0\x9f\x98\x80");
    assert_string_equal(m2d_toml_get(t, "g")->str, "C:\\path\\no-escapes");
    assert_true(isinf(m2d_toml_get(t, "quoted key")->f));
    assert_true(isnan(m2d_toml_get(t, "h")->f));
    assert_int_equal(m2d_toml_get(t, "i")->i, 0);
    assert_true(m2d_toml_get(t, "j")->f == 3.25);
    m2d_toml_free(t);
}

static void arrays_tables_and_dotted_keys(void **state) {
    (void)state;
    m2d_toml *t = parse("top.x = 1\n"
                        "top.y = 'two'\n"
                        "[experiment.demo]\n"
                        "K = [\"k\", \"2k\",   # inline comment\n"
                        "     8,\n"
                        "     [1, [2, 3]],\n"
                        "]\n"
                        "shots = { winogrande = 5, arc.easy = 25 }\n"
                        "[experiment.demo.axes]\n"
                        "scoring = []\n"
                        "[[experiment.demo.exclude]]\n"
                        "K = 'E'\n"
                        "[[experiment.demo.exclude]]\n"
                        "scoring = 'cp'\n"
                        "[experiment.demo.exclude.sub]\n"
                        "z = 1\n"
                        "[experiment]\n"
                        "defined_late = true\n");
    assert_non_null(t);
    assert_int_equal(m2d_toml_path(t, "top.x")->i, 1);
    assert_string_equal(m2d_toml_path(t, "top.y")->str, "two");
    const m2d_toml *K = m2d_toml_path(t, "experiment.demo.K");
    assert_int_equal(K->type, M2D_TOML_ARRAY);
    assert_int_equal(K->n, 4);
    assert_string_equal(K->items[1]->str, "2k");
    assert_int_equal(K->items[3]->items[1]->items[1]->i, 3);
    assert_int_equal(K->line, 4);
    assert_int_equal(K->col, 5);
    assert_int_equal(m2d_toml_path(t, "experiment.demo.shots.arc.easy")->i, 25);
    assert_int_equal(m2d_toml_path(t, "experiment.demo.axes.scoring")->n, 0);
    const m2d_toml *ex = m2d_toml_path(t, "experiment.demo.exclude");
    assert_int_equal(ex->n, 2);
    assert_string_equal(m2d_toml_get(ex->items[1], "scoring")->str, "cp");
    assert_int_equal(m2d_toml_path(ex->items[1], "sub.z")->i, 1);
    assert_int_equal(m2d_toml_path(t, "experiment.defined_late")->i, 1);
    m2d_toml_free(t);
}

static void strict_errors_name_line_and_column(void **state) {
    (void)state;
    expect_error("a = 1\na = 2\n", "t.toml:2:");
    expect_error("a = 1\na = 2\n", "duplicate key 'a'");
    expect_error("[x]\n[x]\n", "t.toml:2:");
    expect_error("[x]\n[x]\n", "defined twice");
    expect_error("a.b = 1\n[a]\n", "defined twice");
    expect_error("a = {b = 1}\n[a.c]\n", "inline table");
    expect_error("a = {b = 1}\na.c = 2\n", "inline table");
    expect_error("a = [1]\n[[a]]\n", "array of tables");
    expect_error("[[a]]\n[a]\n", "defined twice");
    expect_error("a = 1 2\n", "t.toml:1:7: unexpected '2'");
    expect_error("a = \"unterminated\n", "unterminated string");
    expect_error("a = \"\"\"multi\"\"\"\n", "multi-line strings are not supported");
    expect_error("a = 1979-05-27\n", "dates and times are not supported");
    expect_error("a = 0x1f\n", "invalid value '0x1f'");
    expect_error("a = 012\n", "invalid value '012'");
    expect_error("a = 1__0\n", "invalid value");
    expect_error("a = 1.\n", "invalid value");
    expect_error("a = .5\n", "invalid value");
    expect_error("a = 99999999999999999999\n", "out of range");
    expect_error("a = \"bad \\q escape\"\n", "invalid escape");
    expect_error("a = \"\\ud800\"\n", "scalar value");
    /* values and keys are C strings: NUL would cut them short ("a\0b" read as "a") */
    expect_error("a = \"x\\u0000y\"\n", "t.toml:1:13: unicode escape of NUL: NUL is not supported");
    expect_error("a = \"x\\U00000000y\"\n", "t.toml:1:17: unicode escape of NUL");
    expect_error("\"k\\u0000\" = 1\n", "t.toml:1:9: unicode escape of NUL");
    expect_error("a = [1, 2\n", "expected ',' or ']'");
    expect_error("a = {x = 1,\n y = 2}\n", "single-line");
    expect_error("a = \n", "expected a value");
    expect_error("= 1\n", "expected a key");
    expect_error("b.,c.d = 1\n", "expected a key"); /* fuzz: parts parsed before the error were leaked */
    expect_error("a 1\n", "expected '='");
    expect_error("[a\n", "expected ']'");
    expect_error("[[a]\n", "expected ']]'");
    expect_error("a = tru\n", "invalid value");
    expect_error("a = 1\rb = 2\n", "carriage return");
    expect_error("a = \"\xff\"\n", "invalid UTF-8");
    expect_error("# bell \x07 in comment\n", "control character");
    /* nesting is bounded, not a stack overflow */
    char deep[400];
    strcpy(deep, "a = ");
    for (int i = 0; i < 100; i++) strcat(deep, "[");
    expect_error(deep, "nested too deeply");
}

static void set_overrides(void **state) {
    (void)state;
    m2d_toml *t = parse("[e]\nmodel = 'x'\n[e.calibration]\nsamples = 4\n");
    assert_non_null(t);
    m2d_toml *e = (m2d_toml *)m2d_toml_get(t, "e");
    assert_int_equal(m2d_toml_set(e, "model", "/path/to/Qwen3-30B-A3B"), 0);
    assert_string_equal(m2d_toml_get(e, "model")->str, "/path/to/Qwen3-30B-A3B");
    assert_int_equal(m2d_toml_set(e, "calibration.samples", "512"), 0);
    assert_int_equal(m2d_toml_path(e, "calibration.samples")->type, M2D_TOML_INT);
    assert_int_equal(m2d_toml_path(e, "calibration.samples")->i, 512);
    assert_int_equal(m2d_toml_set(e, "axes.K", "['k', 'E']"), 0);
    assert_int_equal(m2d_toml_path(e, "axes.K")->n, 2);
    assert_int_equal(m2d_toml_set(e, "model.sub", "1"), -1);
    assert_non_null(strstr(m2d_errmsg(), "not a table"));
    /* a key with an empty part was dropped or read as fewer parts; nothing is set */
    const char *bad_keys[] = {".", "..", "a..b", ".model", "model."};
    for (size_t i = 0; i < M2D_ARRAY_LEN(bad_keys); i++) {
        assert_int_equal(m2d_toml_set(e, bad_keys[i], "5"), -1);
        char *want = m2d_strfmt("--set %s: empty key part", bad_keys[i]);
        assert_string_equal(m2d_errmsg(), want);
        free(want);
    }
    assert_null(m2d_toml_get(e, "a"));
    assert_string_equal(m2d_toml_get(e, "model")->str, "/path/to/Qwen3-30B-A3B");
    /* a value holding a newline and a second key is refused (its other items leaked) */
    assert_int_equal(m2d_toml_set(e, "calibration.samples", "5\nw = 3"), -1);
    assert_string_equal(m2d_errmsg(), "--set calibration.samples: the value is more than one TOML value (a newline in it?)");
    assert_int_equal(m2d_toml_path(e, "calibration.samples")->i, 512);
    assert_null(m2d_toml_get(e, "w"));
    m2d_toml_free(t);
}

static void load_reports_missing_file(void **state) {
    (void)state;
    assert_null(m2d_toml_load("/nonexistent/experiments.toml"));
    assert_non_null(strstr(m2d_errmsg(), "/nonexistent/experiments.toml"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(scalars_and_strings),
        cmocka_unit_test(arrays_tables_and_dotted_keys),
        cmocka_unit_test(strict_errors_name_line_and_column),
        cmocka_unit_test(set_overrides),
        cmocka_unit_test(load_reports_missing_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
