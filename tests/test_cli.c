/* The CLI's help for every command (issue 30): `help CMD`, `CMD --help` and `CMD -h` print the
 * same text and exit 0, whatever else is on the line; the title appears once; the data paths the
 * examples name are files that `make data` links; usage texts name every teacher family; `help
 * eval` lists every registered task (issue 26). */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/util.h"
#include "evals/mc.h"
#include "sweep_fixture.h"

/* stdout of `moe2dense ARGS`; its exit status must be WANT_RC */
static char *cli(const char *args, int want_rc) {
    char *cmd = m2d_strfmt("'%s' %s", tu_bin(), args), *out = NULL, *err = NULL;
    int rc = tu_run(cmd, &out, &err);
    if (rc != want_rc) fail_msg("%s: exit %d (want %d): %s", cmd, rc, want_rc, err ? err : "");
    free(cmd);
    free(err);
    return out;
}

/* The command names `moe2dense help` lists (lines "  NAME  summary"), without "help" itself. */
static int command_names(char names[][32], int cap) {
    char *list = cli("help", 0);
    int n = 0;
    for (char *line = strtok(list, "\n"); line; line = strtok(NULL, "\n")) {
        char name[32];
        if (line[0] != ' ' || sscanf(line, " %31s", name) != 1 || !strcmp(name, "help")) continue;
        assert_true(n < cap);
        snprintf(names[n++], 32, "%s", name);
    }
    free(list);
    return n;
}

static int count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

static void every_command_has_help_flags(void **state) {
    (void)state;
    char names[64][32];
    int n = command_names(names, 64);
    assert_true(n >= 10);
    static const char *const forms[] = {"%s --help", "%s -h", "%s --model x --help", "%s --bogus -h"};
    for (int i = 0; i < n; i++) {
        char *args = m2d_strfmt("help %s", names[i]), *want = cli(args, 0);
        char *title = m2d_strfmt("moe2dense %s — ", names[i]);
        if (strncmp(want, title, strlen(title)) != 0 || count(want, title) != 1)
            fail_msg("help %s: the title '%s' is not the first line, once:\n%s", names[i], title, want);
        for (size_t f = 0; f < M2D_ARRAY_LEN(forms); f++) {
            char *a = m2d_strfmt(forms[f], names[i]), *got = cli(a, 0);
            if (strcmp(got, want) != 0) fail_msg("moe2dense %s differs from 'help %s':\n%s", a, names[i], got);
            free(a), free(got);
        }
        free(args), free(want), free(title);
    }
}

/* Every data/... path in a help text is a file under the data directory after `make data`. */
static void help_data_paths_exist(void **state) {
    (void)state;
    if (!m2d_file_exists(tu_data_path("wikitext-2-raw/wikitext-2-raw/wiki.test.raw")))
        TU_SKIP("data missing: run 'make data'");
    char names[64][32];
    int n = command_names(names, 64), paths = 0;
    for (int i = 0; i < n; i++) {
        char *args = m2d_strfmt("help %s", names[i]), *text = cli(args, 0);
        for (const char *p = strstr(text, " data/"); p; p = strstr(p + 1, " data/")) {
            size_t len = strspn(p + 6, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-/");
            char *rel = m2d_strfmt("%.*s", (int)len, p + 6);
            if (!m2d_file_exists(tu_data_path(rel))) fail_msg("help %s names data/%s, which does not exist", names[i], rel);
            free(rel);
            paths++;
        }
        free(args), free(text);
    }
    assert_true(paths >= 3); /* ppl's and distill's examples at least */
}

/* The commands that take a teacher name all six families, not only Qwen3-MoE. */
static void teacher_families_named(void **state) {
    (void)state;
    static const char *const cmds[] = {"calibrate", "convert", "distill"};
    static const char *const families[] = {"Qwen3-MoE", "Qwen2-MoE", "Mixtral", "OLMoE", "DeepSeek-V2", "GPT-OSS"};
    for (size_t c = 0; c < M2D_ARRAY_LEN(cmds); c++) {
        char *args = m2d_strfmt("help %s", cmds[c]), *text = cli(args, 0);
        assert_null(strstr(text, "Qwen3-MoE checkpoint"));
        for (size_t f = 0; f < M2D_ARRAY_LEN(families); f++)
            if (!strstr(text, families[f])) fail_msg("help %s does not name %s", cmds[c], families[f]);
        free(args), free(text);
    }
}

/* `help eval` is built from the task registry (evals/tasks/): every registered task is listed
 * under --tasks, with its paper shots under --shots paper. */
static void eval_help_lists_every_task(void **state) {
    (void)state;
    char *text = cli("help eval", 0);
    const char *tasks = strstr(text, "--tasks LIST"), *shots = strstr(text, "--shots N|paper");
    const char *end = strstr(text, "--limit N");
    assert_non_null(tasks), assert_non_null(shots), assert_non_null(end);
    assert_true(m2d_mc_plugin_count() >= 5);
    for (int i = 0; i < m2d_mc_plugin_count(); i++) {
        const m2d_mc_plugin *p = m2d_mc_plugin_at(i);
        char *name = m2d_strfmt(" %s,", p->name), *shot = m2d_strfmt(" %s %d", p->name, p->paper_shots);
        const char *at = strstr(tasks, name), *sat = strstr(shots, shot);
        if (!at || at > shots) fail_msg("help eval: --tasks does not list %s:\n%s", p->name, text);
        if (!sat || sat > end) fail_msg("help eval: --shots paper does not give%s:\n%s", shot, text);
        free(name), free(shot);
    }
    free(text);
}

/* An unknown command stays an error, with or without --help. */
static void unknown_command(void **state) {
    (void)state;
    free(cli("nosuch --help", 2));
    free(cli("help nosuch", 2));
}

/* Output that cannot be written (stdout on a full disk) is an error, not exit 0: one line naming
 * the command and standard output, exit status 1. */
static void expect_stdout_write_failure(const char *args, const char *cmd) {
    char *c = m2d_strfmt("%s >/dev/full", args), *out = NULL, *err = NULL;
    int rc = tu_run(c, &out, &err);
    char *want = m2d_strfmt("moe2dense %s: standard output: write failed: No space left on device\n", cmd);
    if (rc != 1 || !err || strcmp(err, want) != 0) fail_msg("%s: exit %d (want 1)\nstderr: %s\nwant:   %s", c, rc, err, want);
    free(want), free(c), free(out), free(err);
}

static void stdout_write_failure_is_an_error(void **state) {
    (void)state;
    if (access("/dev/full", W_OK) != 0) TU_SKIP("no /dev/full");
    tu_sweep_fixture fx = tu_sweep_fixture_make(
        "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"num_experts\": 8, \"num_experts_per_tok\": 2,"
        " \"moe_intermediate_size\": 16, \"hidden_size\": 32, \"num_hidden_layers\": 2, \"vocab_size\": 64,"
        " \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 16}",
        "[experiment.t]\nmodel = 'MODEL'\nbackend = 'fake'\n"
        "calibration = { data = 'calib.txt', seq_len = 8, samples = 1 }\nppl = { data = 'ppl.txt', seq_len = 8 }\n"
        "[experiment.t.axes]\nscoring = ['sf']\ngrouping = ['rr']\nscaling = ['uniform']\nK = ['k']\n");
    const char *csv = "# experiment=t\nconfig_id,scoring,grouping,scaling,K_expr,K,params,ppl,status,dedup_of\n"
                      "000000000010,sf,rr,uniform,k,2,,38.5,ok,\n";
    tu_write(fx.csv, csv, strlen(csv));
    const char *cases[][2] = {
        {"'%s' list", "list"},
        {"'%s' help report", "help"},
        {"'%s' report --help", "report"},
        {"'%s' report '%s'", "report"},
        {"'%s' report '%s' --format csv", "report"},
        {"'%s' sweep '%s' --experiment t --dry-run", "sweep"},
    };
    for (size_t i = 0; i < M2D_ARRAY_LEN(cases); i++) {
        const char *arg = strstr(cases[i][0], "sweep") ? fx.toml : fx.csv;
        const char *bin = strstr(cases[i][0], "sweep") ? tu_test_bin() : tu_bin();
        char *args = m2d_strfmt(cases[i][0], bin, arg);
        expect_stdout_write_failure(args, cases[i][1]);
        free(args);
    }
    char *model = tu_model_path("tiny-qwen3moe");
    if (model) {
        char *args = m2d_strfmt("'%s' inspect --model '%s'", tu_bin(), model);
        expect_stdout_write_failure(args, "inspect");
        free(args), free(model);
    }
    tu_sweep_fixture_free(&fx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_command_has_help_flags),
        cmocka_unit_test(help_data_paths_exist),
        cmocka_unit_test(teacher_families_named),
        cmocka_unit_test(eval_help_lists_every_task),
        cmocka_unit_test(unknown_command),
        cmocka_unit_test(stdout_write_failure_is_an_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
