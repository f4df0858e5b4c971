/* `moe2dense list` shows every registered plugin (text and --json), and a new plugin file is picked
 * up by `make` with no other edit: the example of criteria/README.md, built in a copy of the tree. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "criteria/registry.h"
#include "base/util.h"

static int is_test_only(const char *name) { return !strncmp(name, "test-", 5); }

static void list_shows_every_plugin(void **state) {
    (void)state;
    char *out = NULL, *err = NULL;
    char *cmd = m2d_strfmt("'%s' list", tu_bin());
    assert_int_equal(tu_run(cmd, &out, &err), 0);
    free(cmd);
    int n = 0;
    for (int k = 0; k < M2D_PLUGIN_KINDS; k++)
        for (int i = 0; i < m2d_plugin_count((m2d_plugin_kind)k); i++) {
            const m2d_plugin *p = m2d_plugin_at((m2d_plugin_kind)k, i);
            char *line = m2d_strfmt("\n  %-14s %s", p->name, p->summary);
            if (!strstr(out, line)) fail_msg("list output lacks '%s'", line + 1);
            free(line);
            n++;
        }
    assert_true(n >= 16 + 2 + 5 + 3); /* the spec's scorings (+bac, freq, acp-routed), groupings, scalings */
    assert_non_null(strstr(out, "do-<scoring>"));
    free(out), free(err);

    /* --json: exactly the registered names, by kind, with parameter defaults */
    cmd = m2d_strfmt("'%s' list --json", tu_bin());
    assert_int_equal(tu_run(cmd, &out, &err), 0);
    free(cmd);
    cJSON *root = cJSON_Parse(out);
    assert_non_null(root);
    for (int k = 0; k < M2D_PLUGIN_KINDS; k++) {
        cJSON *arr = cJSON_GetObjectItem(root, m2d_plugin_kind_name((m2d_plugin_kind)k));
        assert_true(cJSON_IsArray(arr));
        int j = 0;
        for (int i = 0; i < m2d_plugin_count((m2d_plugin_kind)k); i++) {
            const m2d_plugin *p = m2d_plugin_at((m2d_plugin_kind)k, i);
            if (is_test_only(p->name)) continue;
            cJSON *o = cJSON_GetArrayItem(arr, j++);
            assert_non_null(o);
            assert_string_equal(cJSON_GetObjectItem(o, "name")->valuestring, p->name);
        }
        assert_int_equal(cJSON_GetArraySize(arr), j);
    }
    cJSON *bac = NULL, *arr = cJSON_GetObjectItem(root, "scoring");
    cJSON_ArrayForEach(bac, arr) if (!strcmp(cJSON_GetObjectItem(bac, "name")->valuestring, "bac")) break;
    assert_non_null(bac);
    assert_true(cJSON_GetObjectItem(cJSON_GetObjectItem(bac, "params"), "b")->valuedouble == 1);
    cJSON_Delete(root);
    free(out), free(err);

    /* one kind only; an unknown kind is an error naming it */
    cmd = m2d_strfmt("'%s' list grouping", tu_bin());
    assert_int_equal(tu_run(cmd, &out, &err), 0);
    assert_non_null(strstr(out, "wc")), assert_null(strstr(out, "scoring"));
    free(cmd), free(out), free(err);
    cmd = m2d_strfmt("'%s' list nonsense", tu_bin());
    assert_int_not_equal(tu_run(cmd, &out, &err), 0);
    assert_non_null(strstr(err, "nonsense"));
    free(cmd), free(out), free(err);
}

/* criteria/README.md documents every registered plugin (`name`) with its parameter defaults exactly
 * as registered (`params_default`, as `moe2dense list` prints them), so the doc cannot drift */
static void readme_documents_every_plugin(void **state) {
    (void)state;
    size_t n;
    char *md = m2d_read_file("criteria/README.md", &n);
    assert_non_null(md);
    for (int k = 0; k < M2D_PLUGIN_KINDS; k++)
        for (int i = 0; i < m2d_plugin_count((m2d_plugin_kind)k); i++) {
            const m2d_plugin *p = m2d_plugin_at((m2d_plugin_kind)k, i);
            if (is_test_only(p->name)) continue;
            char *name = m2d_strfmt("`%s`", p->name);
            if (!strstr(md, name)) fail_msg("criteria/README.md has no %s", name);
            free(name);
            if (!p->params_default) continue;
            char *params = m2d_strfmt("`%s`", p->params_default);
            if (!strstr(md, params)) fail_msg("criteria/README.md does not give %s's defaults %s", p->name, params);
            free(params);
        }
    free(md);
}

/* The README's example block: the C code between "```c" and "```" after the marker line
 * "<!-- example-plugin: PATH -->". Returns the code and sets *path (both malloc'd). */
static char *readme_example(char **path) {
    size_t n;
    char *md = m2d_read_file("criteria/README.md", &n);
    assert_non_null(md);
    const char *mark = "<!-- example-plugin: ";
    char *m = strstr(md, mark);
    assert_non_null(m);
    m += strlen(mark);
    char *end = strstr(m, " -->");
    assert_non_null(end);
    *path = m2d_strfmt("%.*s", (int)(end - m), m);
    char *open = strstr(end, "```c\n");
    assert_non_null(open);
    open += 5;
    char *close = strstr(open, "```");
    assert_non_null(close);
    char *code = m2d_strfmt("%.*s", (int)(close - open), open);
    free(md);
    return code;
}

static void new_plugin_file_is_picked_up(void **state) {
    (void)state;
    /* not skips: make test runs in a git checkout with its objects built (make deps installs git) */
    if (tu_run("git rev-parse --is-inside-work-tree", NULL, NULL) != 0)
        fail_msg("not a git checkout (or git missing): the test copies the tracked tree");
    const char *build = getenv("M2D_BUILD") ? getenv("M2D_BUILD") : "build";
    char *objects = m2d_path_join(build, "criteria/registry.o");
    if (!m2d_file_exists(objects)) fail_msg("no built objects at %s (run it through make test)", objects);
    free(objects);
    char *dir = tu_tmpdir(), *path = NULL, *code = readme_example(&path);
    /* tracked + untracked-but-not-ignored files, and the build directory (timestamps kept, so
     * make only compiles the new file and relinks) */
    char *cmd = m2d_strfmt("git ls-files -co --exclude-standard -z | xargs -0 tar -cf - | tar -xf - -C '%s' && "
                           "cp -a '%s' '%s/'",
                           dir, build, dir);
    assert_int_equal(tu_run(cmd, NULL, NULL), 0);
    free(cmd);
    char *file = m2d_path_join(dir, path);
    assert_false(m2d_file_exists(file)); /* the example is not already in the tree */
    tu_write(file, code, strlen(code));
    /* build with the same flavour as this run (build-san → SAN=1) */
    int san = strstr(build, "san") != NULL;
    char *out = NULL, *err = NULL;
    cmd = m2d_strfmt("make -C '%s' %s BUILD=%s moe2dense", dir, san ? "SAN=1" : "", san ? "build-san" : build);
    int rc = tu_run(cmd, &out, &err);
    if (rc != 0) fail_msg("%s failed:\n%s\n%s", cmd, out, err);
    free(cmd), free(out), free(err);
    cmd = m2d_strfmt("'%s/%s/moe2dense' list scoring", dir, san ? "build-san" : build);
    assert_int_equal(tu_run(cmd, &out, &err), 0);
    assert_non_null(strstr(out, "\n  cpman "));
    assert_non_null(strstr(out, "CP × MAN (example from criteria/README.md)"));
    free(cmd), free(out), free(err);
    tu_rm_rf(dir);
    free(dir), free(path), free(code), free(file);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(list_shows_every_plugin),
        cmocka_unit_test(readme_documents_every_plugin),
        cmocka_unit_test(new_plugin_file_is_picked_up),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
