/* merge (harness/sweep/shard_merge.c) in-process: shards of a fake-backend sweep joined into one
 * CSV in grid order; duplicates, gaps (with and without the experiment), torn lines, rows of
 * another grid and inputs of another run are reported, and OUT is not written on an error. */
#include "testutil.h"
#include "sweep_fixture.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/util.h"
#include "io/results.h"
#include "sweep/grid.h"
#include "sweep/shard_merge.h"
#include "sweep/sweep.h"

/* 2 scorings x 2 groupings x 1 scaling x 3 K = 12 configurations on E = 16, k = 4 */
static const char *EXPERIMENTS = "[experiment.m]\nmodel = 'MODEL'\nbackend = 'fake'\n"
                                 "calibration = { data = 'c.txt' }\nppl = { data = 'p.txt' }\n"
                                 "[experiment.m.axes]\nscoring = ['sf', 'cp']\ngrouping = ['rr', 'oc']\n"
                                 "scaling = ['uniform']\nK = ['k', '2k', 'E']\n"
                                 "[experiment.other]\nmodel = 'MODEL'\nbackend = 'fake'\n"
                                 "calibration = { data = 'c.txt' }\nppl = { data = 'p.txt' }\n"
                                 "[experiment.other.axes]\nscoring = ['pp']\ngrouping = ['rr']\n"
                                 "scaling = ['uniform']\nK = ['k']\n";

typedef struct {
    tu_sweep_fixture fx;
    m2d_experiment x;
    char *shard[3];  /* DIR/sI.csv: shard I+1 of 3 */
    char *out;       /* DIR/all.csv */
} shards;

static void run_shard(const m2d_experiment *x, int i, int n, const char *out) {
    m2d_sweep_opts o = {.out = out, .shard_i = i, .shard_n = n, .jobs = 1};
    m2d_sweep_summary s;
    assert_int_equal(m2d_sweep_run(x, &o, &s), 0);
}

static shards make_shards(void) {
    shards sh;
    sh.fx = tu_sweep_fixture_make("{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"vocab_size\": 64, "
                                  "\"hidden_size\": 32, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                                  "\"moe_intermediate_size\": 16, \"num_experts\": 16, \"num_experts_per_tok\": 4}",
                                  EXPERIMENTS);
    assert_int_equal(m2d_experiment_load(sh.fx.toml, "m", NULL, 0, &sh.x), 0);
    assert_int_equal(sh.x.n_configs, 12);
    for (int i = 0; i < 3; i++) {
        sh.shard[i] = m2d_strfmt("%s/s%d.csv", sh.fx.dir, i + 1);
        run_shard(&sh.x, i + 1, 3, sh.shard[i]);
    }
    sh.out = m2d_path_join(sh.fx.dir, "all.csv");
    return sh;
}

static void free_shards(shards *sh) {
    for (int i = 0; i < 3; i++) free(sh->shard[i]);
    free(sh->out);
    m2d_experiment_free(&sh->x);
    tu_sweep_fixture_free(&sh->fx);
}

/* merge INPUTS (n) into sh->out, against experiment m when WITH_EXP */
static int merge(shards *sh, char *const *inputs, int n, int with_exp, int allow_gaps, m2d_shard_merge_result *res) {
    m2d_shard_merge_opts o = {sh->out, inputs, n, with_exp ? sh->fx.toml : NULL, with_exp ? "m" : NULL,
                              NULL, 0, allow_gaps};
    return m2d_shard_merge(&o, res);
}

static int has_note(const m2d_shard_merge_result *res, const char *needle) {
    for (int i = 0; i < res->n_notes; i++)
        if (strstr(res->notes[i], needle)) return 1;
    return 0;
}

static void shards_join_in_grid_order(void **state) {
    (void)state;
    shards sh = make_shards();
    m2d_shard_merge_result res;
    /* inputs in any order: the output follows the grid */
    char *in[] = {sh.shard[2], sh.shard[0], sh.shard[1]};
    assert_int_equal(merge(&sh, in, 3, 1, 0, &res), 0);
    assert_int_equal(res.rows, 12);
    assert_int_equal(res.files, 3);
    assert_int_equal(res.gaps, 0);
    assert_int_equal(res.n_notes, 0);
    m2d_shard_merge_result_free(&res);
    m2d_results r;
    assert_int_equal(m2d_results_read(sh.out, &r), 0);
    assert_int_equal(r.n_rows, 12);
    for (int i = 0; i < r.n_rows; i++) assert_string_equal(m2d_results_get(&r, i, "config_id"), sh.x.configs[i].id);
    assert_string_equal(m2d_results_meta(&r, "shard"), "all");
    assert_string_equal(m2d_results_meta(&r, "experiment"), "m");
    assert_null(m2d_results_meta(&r, "host"));
    const char *from = m2d_results_meta(&r, "merged_from");
    assert_non_null(strstr(from, "s3.csv (shard 3/3, host "));
    assert_true(strstr(from, "s3.csv") < strstr(from, "s1.csv")); /* in the order given */
    m2d_results_free(&r);
    /* without the experiment: the rows in input order, checked against the header's grid_size */
    assert_int_equal(merge(&sh, in, 3, 0, 0, &res), 0);
    assert_int_equal(res.rows, 12);
    assert_int_equal(res.n_notes, 0);
    m2d_shard_merge_result_free(&res);
    free_shards(&sh);
}

static void gaps_are_listed_and_nothing_is_written(void **state) {
    (void)state;
    shards sh = make_shards();
    m2d_results s2;
    assert_int_equal(m2d_results_read(sh.shard[1], &s2), 0);
    int missing = s2.n_rows;
    m2d_shard_merge_result res;
    char *in[] = {sh.shard[0], sh.shard[2]};
    assert_int_equal(merge(&sh, in, 2, 1, 0, &res), -1);
    assert_non_null(strstr(m2d_errmsg(), "configuration(s) missing; "));
    assert_non_null(strstr(m2d_errmsg(), "all.csv not written"));
    assert_false(m2d_file_exists(sh.out));
    assert_int_equal(res.gaps, missing);
    /* one note per missing configuration (naming it and its axes), then the count */
    assert_int_equal(res.n_notes, missing + 1);
    const char *id = m2d_results_get(&s2, 0, "config_id");
    char *want = m2d_strfmt("missing %s (%s %s %s K=%s)", id, m2d_results_get(&s2, 0, "scoring"),
                            m2d_results_get(&s2, 0, "grouping"), m2d_results_get(&s2, 0, "scaling"),
                            m2d_results_get(&s2, 0, "K"));
    assert_true(has_note(&res, want));
    free(want);
    char *count = m2d_strfmt("%d of 12 configurations missing", missing);
    assert_string_equal(res.notes[res.n_notes - 1], count);
    free(count);
    m2d_shard_merge_result_free(&res);
    /* --allow-gaps writes what there is */
    assert_int_equal(merge(&sh, in, 2, 1, 1, &res), 0);
    assert_int_equal(res.rows, 12 - missing);
    assert_int_equal(res.gaps, missing);
    assert_true(m2d_file_exists(sh.out));
    m2d_shard_merge_result_free(&res);
    unlink(sh.out);
    /* without the experiment the gap is the header's grid size */
    assert_int_equal(merge(&sh, in, 2, 0, 0, &res), -1);
    char *rows = m2d_strfmt("%d rows but the grid has 12 configurations", 12 - missing);
    assert_true(has_note(&res, rows));
    free(rows);
    assert_false(m2d_file_exists(sh.out));
    m2d_shard_merge_result_free(&res);
    m2d_results_free(&s2);
    free_shards(&sh);
}

static void duplicates_and_mismatches_are_errors(void **state) {
    (void)state;
    shards sh = make_shards();
    m2d_shard_merge_result res;
    /* a shard given twice: every row of it is a duplicate; five are named */
    char *dup[] = {sh.shard[0], sh.shard[1], sh.shard[2], sh.shard[1]};
    assert_int_equal(merge(&sh, dup, 4, 1, 0, &res), -1);
    assert_non_null(strstr(m2d_errmsg(), "duplicate configuration(s) across the inputs"));
    assert_true(res.n_notes >= 1 && res.n_notes <= 5);
    assert_true(has_note(&res, "duplicate configuration "));
    assert_false(m2d_file_exists(sh.out));
    m2d_shard_merge_result_free(&res);
    /* the output is one of the inputs */
    char *self[] = {sh.shard[0], sh.out};
    assert_int_equal(merge(&sh, self, 2, 0, 0, &res), -1);
    assert_non_null(strstr(m2d_errmsg(), "is also an input"));
    m2d_shard_merge_result_free(&res);
    /* the same, the output spelt otherwise (DIR/./sI.csv): the same file, not the same string */
    char *respelt = m2d_path_join(sh.fx.dir, "./s1.csv");
    shards alias = sh;
    alias.out = respelt;
    assert_int_equal(merge(&alias, sh.shard, 3, 0, 0, &res), -1);
    assert_non_null(strstr(m2d_errmsg(), "is also an input"));
    m2d_shard_merge_result_free(&res);
    free(respelt);
    /* shards of other precisions are other runs */
    size_t n;
    char *text = m2d_read_file(sh.shard[1], &n), *p = strstr(text, "precision=");
    assert_non_null(p);
    char *edited = m2d_strfmt("%.*sprecision=other%s", (int)(p - text), text, strchr(p, '\n'));
    tu_write(sh.shard[1], edited, strlen(edited));
    assert_int_equal(merge(&sh, sh.shard, 3, 0, 0, &res), -1);
    assert_non_null(strstr(m2d_errmsg(), "header 'precision'"));
    m2d_shard_merge_result_free(&res);
    tu_write(sh.shard[1], text, n);
    free(text), free(edited);
    /* shards of another grid (other --set axes keep every identity key) or of another split */
    const char *fields[][3] = {{"grid=", "grid=00ff", "header 'grid'"},
                               {"grid_size=", "grid_size=999", "header 'grid_size'"},
                               {"shard=", "shard=2/7", "header 'shard' of 3 vs 7 shards"}};
    for (int f = 0; f < 3; f++) {
        text = m2d_read_file(sh.shard[1], &n), p = strstr(text, fields[f][0]);
        assert_non_null(p);
        edited = m2d_strfmt("%.*s%s%s", (int)(p - text), text, fields[f][1], strchr(p, '\n'));
        tu_write(sh.shard[1], edited, strlen(edited));
        assert_int_equal(merge(&sh, sh.shard, 3, 0, 0, &res), -1);
        if (!strstr(m2d_errmsg(), fields[f][2])) fail_msg("%s", m2d_errmsg());
        m2d_shard_merge_result_free(&res);
        tu_write(sh.shard[1], text, n);
        free(text), free(edited);
    }
    /* rows of another run: another experiment's CSV has another identity */
    m2d_experiment other;
    assert_int_equal(m2d_experiment_load(sh.fx.toml, "other", NULL, 0, &other), 0);
    char *op = m2d_path_join(sh.fx.dir, "other.csv");
    run_shard(&other, 0, 0, op);
    char *mixed[] = {sh.shard[0], op};
    assert_int_equal(merge(&sh, mixed, 2, 0, 0, &res), -1);
    assert_non_null(strstr(m2d_errmsg(), "come from different runs: header 'experiment'"));
    m2d_shard_merge_result_free(&res);
    /* checked against another experiment than the shards ran */
    char *one[] = {op};
    assert_int_equal(merge(&sh, one, 1, 1, 0, &res), -1);
    assert_non_null(strstr(m2d_errmsg(), "is from experiment 'other', not 'm'"));
    m2d_shard_merge_result_free(&res);
    /* --experiments without --experiment */
    m2d_shard_merge_opts half = {sh.out, one, 1, sh.fx.toml, NULL, NULL, 0, 0};
    assert_int_equal(m2d_shard_merge(&half, &res), -1);
    assert_non_null(strstr(m2d_errmsg(), "go together"));
    m2d_shard_merge_result_free(&res);
    free(op);
    m2d_experiment_free(&other);
    free_shards(&sh);
}

/* a torn last line (a killed shard) is noted and ignored; rows outside the grid are an error */
static void torn_lines_and_foreign_rows(void **state) {
    (void)state;
    shards sh = make_shards();
    FILE *f = fopen(sh.shard[1], "a");
    fputs("deadbeef0000,sf,rr,uni", f);
    fclose(f);
    m2d_shard_merge_result res;
    assert_int_equal(merge(&sh, sh.shard, 3, 1, 0, &res), 0);
    assert_int_equal(res.n_notes, 1);
    assert_non_null(strstr(res.notes[0], "s2.csv: ignoring a torn last line"));
    m2d_shard_merge_result_free(&res);
    unlink(sh.out);
    /* the same shards checked against a grid with another K axis: some rows belong to none */
    m2d_shard_merge_opts o = {sh.out, sh.shard, 3, sh.fx.toml, "m", (char *[]){"axes.K=['k']"}, 1, 0};
    assert_int_equal(m2d_shard_merge(&o, &res), -1);
    assert_non_null(strstr(m2d_errmsg(), "row(s) are not configurations of experiment 'm'"));
    assert_false(m2d_file_exists(sh.out));
    m2d_shard_merge_result_free(&res);
    free_shards(&sh);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(shards_join_in_grid_order),
        cmocka_unit_test(gaps_are_listed_and_nothing_is_written),
        cmocka_unit_test(duplicates_and_mismatches_are_errors),
        cmocka_unit_test(torn_lines_and_foreign_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
