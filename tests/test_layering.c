/* test_layering — tools/layering.sh (`make layering`) passes on the tree and fails, naming the
 * file, the line and the rule broken, on one planted violation of each kind: a project header in
 * angle brackets, a sideways include, an upward include, an include that does not name its folder. */
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "testutil.h"

/* A copy of the layered folders in a fresh temporary directory. */
static char *copy_tree(void) {
    char *dir = tu_tmpdir();
    char *cmd = m2d_strfmt("cp -a harness criteria evals '%s/'", dir);
    assert_int_equal(tu_run(cmd, NULL, NULL), 0);
    free(cmd);
    return dir;
}

static int run_check(const char *dir, char **out) {
    char *cmd = m2d_strfmt("sh tools/layering.sh '%s'", dir);
    int rc = tu_run(cmd, out, NULL);
    free(cmd);
    return rc;
}

static void tree_is_layered(void **state) {
    (void)state;
    char *out = NULL;
    int rc = run_check(".", &out);
    if (rc != 0) fail_msg("layering violations:\n%s", out ? out : "");
    free(out);
}

/* Inserts LINE before the first line of FILE's copy that starts with "#include \"" and returns
 * the line number LINE now has there. */
static int plant(const char *dir, const char *file, const char *line) {
    char *path = m2d_path_join(dir, file);
    char *text = m2d_read_file(path, NULL);
    assert_non_null(text);
    const char *at = strstr(text, "#include \"");
    assert_non_null(at);
    int lineno = 1;
    for (const char *c = text; c < at; c++) lineno += *c == '\n';
    free(text);
    char *with = m2d_strfmt("%s\n#include \"", line);
    tu_replace_in_file(path, "#include \"", with);
    free(with), free(path);
    return lineno;
}

/* Plants LINE in FILE, runs the check on the copy and asserts that it fails with the line
 * "FILE:N: MESSAGE" for the planted line N, for each MESSAGE given. */
static void assert_caught(const char *file, const char *line, const char *const *messages, int n) {
    char *dir = copy_tree(), *out = NULL;
    int lineno = plant(dir, file, line);
    assert_int_equal(run_check(dir, &out), 1);
    for (int i = 0; i < n; i++) {
        char *want = m2d_strfmt("%s:%d: %s\n", file, lineno, messages[i]);
        if (!strstr(out, want)) fail_msg("missing \"%s\" in:\n%s", want, out);
        free(want);
    }
    free(out);
    tu_rm_rf(dir), free(dir);
}

static void angle_include_fails(void **state) {
    (void)state;
    /* both what the angle form hides: the project header itself, and that criteria may not reach
     * the engine (only through calib) */
    const char *const want[] = {
        "#include <engine/engine.h>: a project header is included with quotes, \"engine/engine.h\"",
        "#include <engine/engine.h> reaches down past its list: criteria may include only criteria/ "
        "base/ model/ calib/",
    };
    assert_caught("criteria/crit.c", "#include <engine/engine.h>", want, 2);
}

static void sideways_include_fails(void **state) {
    (void)state;
    const char *const want[] = {
        "#include \"evals/mc.h\" reaches sideways: harness/calib may include only calib/ base/ model/ "
        "tokenizer/ engine/",
    };
    assert_caught("harness/calib/calib.c", "#include \"evals/mc.h\"", want, 1);
}

static void upward_include_fails(void **state) {
    (void)state;
    const char *const want[] = {
        "#include \"cli/cmd.h\" reaches up a layer: harness/base may include only base/",
    };
    assert_caught("harness/base/util.c", "#include \"cli/cmd.h\"", want, 1);
}

static void engine_may_not_include_evals_or_criteria(void **state) {
    (void)state;
    const char *const want[] = {
        "#include \"criteria/registry.h\" reaches up a layer: harness/engine may include only engine/ "
        "base/ model/",
    };
    assert_caught("harness/engine/engine.c", "#include \"criteria/registry.h\"", want, 1);
}

static void include_without_folder_fails(void **state) {
    (void)state;
    const char *const want[] = {"#include \"util.h\" does not name its folder"};
    assert_caught("evals/ppl.c", "#include \"util.h\"", want, 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tree_is_layered),
        cmocka_unit_test(angle_include_fails),
        cmocka_unit_test(sideways_include_fails),
        cmocka_unit_test(upward_include_fails),
        cmocka_unit_test(engine_may_not_include_evals_or_criteria),
        cmocka_unit_test(include_without_folder_fails),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
