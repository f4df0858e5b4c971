/* test_layering — tools/layering.sh (`make layering`) passes on the tree and fails, naming the
 * file and line, on a planted upward include and on an include that does not name its folder. */
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

/* Appends LINE to the end of the first line of FILE's copy that starts with "#include". */
static void plant(const char *dir, const char *file, const char *line) {
    char *path = m2d_path_join(dir, file);
    char *with = m2d_strfmt("%s\n#include \"", line);
    tu_replace_in_file(path, "#include \"", with);
    free(with), free(path);
}

static void upward_include_fails(void **state) {
    (void)state;
    char *dir = copy_tree(), *out = NULL;
    plant(dir, "harness/base/util.c", "#include \"cli/cmd.h\"");
    assert_int_equal(run_check(dir, &out), 1);
    assert_non_null(strstr(out, "harness/base/util.c:"));
    assert_non_null(strstr(out, "\"cli/cmd.h\" reaches up a layer"));
    free(out);
    tu_rm_rf(dir), free(dir);
}

static void engine_may_not_include_evals_or_criteria(void **state) {
    (void)state;
    char *dir = copy_tree(), *out = NULL;
    plant(dir, "harness/engine/engine.c", "#include \"criteria/registry.h\"");
    assert_int_equal(run_check(dir, &out), 1);
    assert_non_null(strstr(out, "harness/engine/engine.c:"));
    free(out);
    tu_rm_rf(dir), free(dir);
}

static void include_without_folder_fails(void **state) {
    (void)state;
    char *dir = copy_tree(), *out = NULL;
    plant(dir, "evals/ppl.c", "#include \"util.h\"");
    assert_int_equal(run_check(dir, &out), 1);
    assert_non_null(strstr(out, "evals/ppl.c:"));
    assert_non_null(strstr(out, "does not name its folder"));
    free(out);
    tu_rm_rf(dir), free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tree_is_layered),
        cmocka_unit_test(upward_include_fails),
        cmocka_unit_test(engine_may_not_include_evals_or_criteria),
        cmocka_unit_test(include_without_folder_fails),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
