/* sweep: grid expansion, shards, the crash-safe CSV, dedup, failures, resume (incl. kill -9 of a
 * real sweep process at several moments), merge and the CLI — all on the deterministic "fake"
 * backend (tests/sweep_fake.c; the CLI runs are of tu_test_bin(), which links it), so no model is
 * needed. */
#include "testutil.h"
#include "sweep_fixture.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "sweep/grid.h"
#include "sweep/report.h"
#include "io/results.h"
#include "sweep/sweep.h"
#include "sweep/sweep_backend.h"
#include "sweep/sweep_csv.h"
#include "sweep/sweep_mc.h"
#include "base/util.h"

static const char *EXPERIMENTS =
    "[experiment.grid]\n"
    "description = 'paper grid on a 64-expert, top-8 teacher'\n"
    "model = 'MODEL'\n"
    "backend = 'fake'\n"
    "calibration = { data = 'calib.txt', seq_len = 64, samples = 4 }\n"
    "ppl = { data = 'ppl.txt', seq_len = 64, max_windows = 2 }\n"
    "[experiment.grid.axes]\n"
    "scoring = ['sf', 'pp', 'ps', 'cp', 'acp', 'do-cp', 'do-acp']\n"
    "grouping = ['rr', 'wc', 'rc', 'ab', 'oc']\n"
    "scaling = ['uniform', 'proportional']\n"
    "K = ['k', '2k', '4k', '8k', 'E']\n"
    "\n"
    "[experiment.small]\n"
    "model = 'MODEL'\n"
    "backend = 'fake'\n"
    "calibration = { data = 'calib.txt' }\n"
    "ppl = { data = 'ppl.txt', max_windows = 3 }\n"
    "[experiment.small.axes]\n"
    "scoring = ['sf', 'cp', 'failing']\n"
    "grouping = ['rr', 'oc']\n"
    "scaling = ['uniform']\n"
    "K = ['k', 16, 'E/2']\n"
    "params = ['', 'nan']\n"
    "[[experiment.small.exclude]]\n"
    "scoring = 'cp'\n"
    "K = [16, 'E/2']\n"
    "[[experiment.small.exclude]]\n"
    "scoring = 'failing'\n"
    "params = 'nan'\n"
    "\n"
    "[experiment.only]\n"
    "model = 'MODEL'\n"
    "backend = 'fake'\n"
    "calibration = { data = 'calib.txt' }\n"
    "ppl = { data = 'ppl.txt' }\n"
    "[experiment.only.axes]\n"
    "scoring = ['sf', 'cp']\n"
    "grouping = ['rr']\n"
    "scaling = ['uniform', 'proportional']\n"
    "K = ['k', '2k']\n"
    "[[experiment.only.include]]\n"
    "scaling = 'proportional'\n"
    "[[experiment.only.include]]\n"
    "scoring = 'cp'\n"
    "K = 'k'\n";

/* A temp dir with a fake teacher (config.json only: E = 64, k = 8) and the experiments above. */
typedef tu_sweep_fixture fixture;

static fixture make_fixture(void) {
    const char *json = "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"num_experts\": 64, \"num_experts_per_tok\": 8, \"moe_intermediate_size\": 72,"
                       " \"hidden_size\": 192, \"num_hidden_layers\": 4, \"vocab_size\": 8192,"
                       " \"num_attention_heads\": 6, \"num_key_value_heads\": 2, \"head_dim\": 32}";
    return tu_sweep_fixture_make(json, EXPERIMENTS);
}

static void free_fixture(fixture *fx) { tu_sweep_fixture_free(fx); }

static void grid_expands_resolves_and_trims(void **state) {
    (void)state;
    fixture fx = make_fixture();
    m2d_experiment x;
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", NULL, 0, &x), 0);
    assert_int_equal(x.E, 64);
    assert_int_equal(x.k, 8);
    /* 7 x 5 x 2 x {8, 16, 32, 64}: "8k" and "E" are both 64 on this teacher and kept once */
    assert_int_equal(x.n_configs, 280);
    assert_int_equal(x.n_duplicate_K, 70);
    /* K innermost, in axis order; ids distinct */
    assert_string_equal(x.configs[0].K_expr, "k");
    assert_int_equal(x.configs[1].K, 16);
    assert_int_equal(x.configs[3].K, 64);
    assert_string_equal(x.configs[4].scaling, "proportional");
    for (int i = 0; i < x.n_configs; i++)
        for (int j = i + 1; j < x.n_configs; j++) assert_string_not_equal(x.configs[i].id, x.configs[j].id);
    /* ids are a hash of the axis values, stable across runs */
    char id[M2D_ID_LEN + 1];
    m2d_grid_config_id(&x.configs[7], id);
    assert_string_equal(id, x.configs[7].id);
    m2d_experiment_free(&x);

    /* exclude rules: cp only at K = k; "failing" only without params */
    assert_int_equal(m2d_experiment_load(fx.toml, "small", NULL, 0, &x), 0);
    int cp = 0, failing = 0;
    for (int i = 0; i < x.n_configs; i++) {
        if (!strcmp(x.configs[i].scoring, "cp")) {
            cp++;
            assert_int_equal(x.configs[i].K, 8);
        }
        if (!strcmp(x.configs[i].scoring, "failing")) {
            failing++;
            assert_string_equal(x.configs[i].params, "");
        }
    }
    assert_int_equal(cp, 2 * 2);
    assert_int_equal(failing, 2 * 3);
    assert_int_equal(x.n_configs, 2 * 3 * 2 + 4 + 6);
    assert_int_equal(x.n_excluded, 2 * 2 * 2 + 2 * 3);
    m2d_experiment_free(&x);

    /* include rules: proportional, or (cp, K = k) */
    assert_int_equal(m2d_experiment_load(fx.toml, "only", NULL, 0, &x), 0);
    assert_int_equal(x.n_configs, 2 * 2 + 1);
    m2d_experiment_free(&x);

    /* --set overrides and errors */
    char *sets[] = {"axes.K=['k', 'E']", "ppl.max_windows=5"};
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", sets, 2, &x), 0);
    assert_int_equal(x.n_configs, 7 * 5 * 2 * 2);
    assert_int_equal(x.ppl_max_windows, 5);
    m2d_experiment_free(&x);
    char *bad[] = {"axes.K=['9k', 'E']"}; /* 72 > E */
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", bad, 1, &x), -1);
    assert_non_null(strstr(m2d_errmsg(), "axes.K"));
    m2d_experiment_free(&x);
    char *typo[] = {"ppl.max_widows=5"};
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", typo, 1, &x), -1);
    assert_non_null(strstr(m2d_errmsg(), "unknown key 'max_widows'"));
    m2d_experiment_free(&x);
    assert_int_equal(m2d_experiment_load(fx.toml, "nope", NULL, 0, &x), -1);
    assert_non_null(strstr(m2d_errmsg(), "have: grid, small, only"));
    m2d_experiment_free(&x);
    free_fixture(&fx);
}

/* A sweep with MoE students end to end on the CLI: the rows it writes (K_expr "(1-R)E", target,
 * ratio, top_k) pass the row validator that resume, the MC stage and report apply; students that
 * differ only in top-k are different students (no dedup_of); report gives them their own section
 * with a column per (ratio, top-k), and the dense table only the dense rows. */
static void moe_grid_sweep_then_report(void **state) {
    (void)state;
    fixture fx = make_fixture();
    const char *exp = "[experiment.m]\nmodel = 'MODEL'\nbackend = 'fake'\n"
                      "calibration = { data = 'calib.txt', seq_len = 64, samples = 4 }\n"
                      "ppl = { data = 'ppl.txt', seq_len = 64 }\nmc = { tasks = ['arc_easy'] }\n"
                      "[experiment.m.axes]\nscoring = ['reap', 'freq']\ngrouping = ['none']\n"
                      "scaling = ['uniform']\nK = ['2k']\ntarget = ['dense', 'moe']\nratio = [0.25, 0.5]\n"
                      "top_k = [8, 4]\n";
    char *path = m2d_path_join(fx.dir, "m.toml"), *at = strstr(exp, "MODEL");
    char *full = m2d_strfmt("%.*s%s%s", (int)(at - exp), exp, fx.model, at + 5);
    tu_write(path, full, strlen(full));
    char *c = m2d_strfmt("%s sweep %s --experiment m --out %s", tu_test_bin(), path, fx.csv), *out = NULL, *err = NULL;
    if (tu_run(c, &out, &err)) fail_msg("sweep: %s", err);
    free(c), free(out), free(err);
    m2d_results r;
    if (m2d_results_read_checked(fx.csv, &r)) fail_msg("%s", m2d_errmsg());
    assert_int_equal(r.n_rows, 2 * (1 + 2 * 2));
    for (int i = 0; i < r.n_rows; i++) {
        if (strcmp(m2d_results_get(&r, i, "target"), "moe")) continue;
        assert_string_equal(m2d_results_get(&r, i, "dedup_of"), ""); /* top-8 and top-4: two students */
        assert_string_equal(m2d_results_get(&r, i, "K_expr"), !strcmp(m2d_results_get(&r, i, "ratio"), "0.25") ? "(1-0.25)E" : "(1-0.5)E");
    }
    m2d_results_free(&r);
    c = m2d_strfmt("%s report %s", tu_test_bin(), fx.csv);
    if (tu_run(c, &out, &err)) fail_msg("report: %s", err);
    assert_non_null(strstr(out, "| Scoring | Grouping | Scaling | K=16 |\n"));
    assert_non_null(strstr(out, "## MoE students (target moe) — experiment m\n\n8 configuration(s), 2 method(s)."));
    assert_non_null(strstr(out, "| Scoring | Grouping | 25 % removed (K=48), top-8 | 25 % removed (K=48), top-4 | "
                                "50 % removed (K=32), top-8 | 50 % removed (K=32), top-4 |\n"));
    free(c), free(out), free(err);
    free(path), free(full);
    free_fixture(&fx);
}

/* target axis: MoE students at ratios of experts removed next to the dense grid; dense ids unchanged */
static void grid_target_axis(void **state) {
    (void)state;
    fixture fx = make_fixture();
    m2d_experiment dense, x;
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", NULL, 0, &dense), 0);
    char *sets[] = {"axes.target=['dense', 'moe']", "axes.ratio=[0.25, '0.5']"};
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", sets, 2, &x), 0);
    assert_int_equal(x.n_configs, 280 + 7 * 5 * 2);
    int n_moe = 0, d = 0;
    for (int i = 0; i < x.n_configs; i++) {
        const m2d_grid_config *c = &x.configs[i];
        if (strcmp(c->target, "moe")) { /* dense: the same configurations, in order, with the same ids */
            assert_string_equal(c->id, dense.configs[d].id);
            assert_string_equal(c->scaling, dense.configs[d++].scaling);
            continue;
        }
        n_moe++;
        assert_string_equal(c->scaling, "none");
        /* parsed dyadic decimals (0.25, 0.5): exact on every CPU */
        assert_true((c->ratio_v == 0.25 && c->K == 48 && !strcmp(c->K_expr, "(1-0.25)E")) ||
                    (c->ratio_v == 0.5 && c->K == 32 && !strcmp(c->K_expr, "(1-0.5)E")));
        for (int j = 0; j < x.n_configs; j++) assert_true(i == j || strcmp(c->id, x.configs[j].id) != 0);
    }
    assert_int_equal(d, 280);
    assert_int_equal(n_moe, 70);
    /* the CSV gains target and ratio after params only for such a grid */
    char **cols;
    int n = m2d_sweep_columns(&x, &cols);
    assert_string_equal(cols[6], "params"), assert_string_equal(cols[7], "target"), assert_string_equal(cols[8], "ratio");
    m2d_sweep_columns_free(cols, n);
    n = m2d_sweep_columns(&dense, &cols);
    assert_string_equal(cols[7], "d_dense");
    m2d_sweep_columns_free(cols, n);
    m2d_experiment_free(&x);
    m2d_experiment_free(&dense);
    /* an MoE-only grid needs neither scaling nor K; rules select on target and ratio */
    const char *only = "[experiment.r]\nmodel = 'MODEL'\nbackend = 'fake'\n"
                       "calibration = { data = 'calib.txt', seq_len = 64, samples = 4 }\n"
                       "ppl = { data = 'ppl.txt', seq_len = 64 }\n[experiment.r.axes]\nscoring = ['reap', 'freq']\n"
                       "grouping = ['none', 'remap']\ntarget = ['moe']\nratio = [0.25, 0.5]\n"
                       "[[experiment.r.include]]\ngrouping = 'none'\n"
                       "[[experiment.r.include]]\ngrouping = 'remap'\nratio = 0.5\n";
    char *path = m2d_path_join(fx.dir, "r.toml");
    char *text = m2d_strfmt("%s", only), *at = strstr(text, "MODEL");
    char *full = m2d_strfmt("%.*s%s%s", (int)(at - text), text, fx.model, at + 5);
    tu_write(path, full, strlen(full));
    if (m2d_experiment_load(path, "r", NULL, 0, &x)) fail_msg("%s", m2d_errmsg());
    assert_int_equal(x.n_configs, 2 * 2 + 2);
    assert_int_equal(x.n_excluded, 2);
    for (int i = 0; i < x.n_configs; i++)
        if (!strcmp(x.configs[i].grouping, "remap")) assert_true(x.configs[i].ratio_v == 0.5);
    m2d_experiment_free(&x);
    /* errors */
    struct { char *set, *needle; } bad[] = {
        {"axes.target=['sparse']", "not dense or moe"},
        {"axes.target=['moe']", "missing 'ratio'"},
        {"axes.ratio=[0.5]", "only for target \"moe\""},
    };
    for (size_t i = 0; i < M2D_ARRAY_LEN(bad); i++) {
        assert_int_equal(m2d_experiment_load(fx.toml, "grid", &bad[i].set, 1, &x), -1);
        if (!strstr(m2d_errmsg(), bad[i].needle)) fail_msg("'%s': '%s' lacks '%s'", bad[i].set, m2d_errmsg(), bad[i].needle);
        m2d_experiment_free(&x);
    }
    char *ratio_bad[] = {"axes.target=['moe']", "axes.ratio=[1.5]"};
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", ratio_bad, 2, &x), -1);
    assert_non_null(strstr(m2d_errmsg(), "'1.5' is not a fraction"));
    m2d_experiment_free(&x);
    /* top_k (paper 001 §2 (iii)): ratio 0 keeps every expert; top_k = k is the default's id */
    char *tk[] = {"axes.target=['moe']", "axes.ratio=[0, 0.5]", "axes.top_k=[8, 4]"};
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", tk, 3, &x), 0);
    assert_int_equal(x.n_configs, 7 * 5 * 2 * 2);
    char *tk_default[] = {"axes.target=['moe']", "axes.ratio=[0, 0.5]"};
    m2d_experiment y;
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", tk_default, 2, &y), 0);
    assert_string_equal(x.configs[0].K_expr, "(1-0)E");
    assert_int_equal(x.configs[0].K, 64);
    assert_int_equal(x.configs[0].top_k, 0), assert_int_equal(x.configs[1].top_k, 4);
    assert_string_equal(x.configs[0].id, y.configs[0].id);
    assert_string_not_equal(x.configs[1].id, y.configs[1].id);
    n = m2d_sweep_columns(&x, &cols);
    assert_string_equal(cols[9], "top_k");
    m2d_sweep_columns_free(cols, n);
    m2d_experiment_free(&x);
    m2d_experiment_free(&y);
    struct { char *set[3]; const char *needle; } tbad[] = {
        {{"axes.target=['moe']", "axes.ratio=[0.5]", "axes.top_k=[0]"}, "not a number of experts"},
        {{"axes.target=['moe']", "axes.ratio=[0.5]", "axes.top_k=['4']"}, "not a number of experts"},
        {{"axes.top_k=[4]", "ppl.max_windows=1", "ppl.max_windows=1"}, "only for target \"moe\""},
    };
    for (size_t i = 0; i < M2D_ARRAY_LEN(tbad); i++) {
        assert_int_equal(m2d_experiment_load(fx.toml, "grid", tbad[i].set, 3, &x), -1);
        if (!strstr(m2d_errmsg(), tbad[i].needle)) fail_msg("%zu: '%s' lacks '%s'", i, m2d_errmsg(), tbad[i].needle);
        m2d_experiment_free(&x);
    }
    free(path), free(text), free(full);
    free_fixture(&fx);
}

static void resolve_K_expressions(void **state) {
    (void)state;
    int K;
    assert_int_equal(m2d_grid_resolve_K("k", 8, 128, &K), 0);
    assert_int_equal(K, 8);
    assert_int_equal(m2d_grid_resolve_K("4k", 8, 128, &K), 0);
    assert_int_equal(K, 32);
    assert_int_equal(m2d_grid_resolve_K("E", 8, 128, &K), 0);
    assert_int_equal(K, 128);
    assert_int_equal(m2d_grid_resolve_K("E/4", 8, 128, &K), 0);
    assert_int_equal(K, 32);
    assert_int_equal(m2d_grid_resolve_K("24", 8, 128, &K), 0);
    assert_int_equal(K, 24);
    assert_int_equal(m2d_grid_resolve_K("32k", 8, 128, &K), -1); /* 256 > E */
    assert_int_equal(m2d_grid_resolve_K("4", 8, 128, &K), -1);   /* < k */
    assert_int_equal(m2d_grid_resolve_K("E/3", 8, 128, &K), -1);
    assert_int_equal(m2d_grid_resolve_K("k2", 8, 128, &K), -1);
    assert_int_equal(m2d_grid_resolve_K("", 8, 128, &K), -1);
}

static void shards_partition_the_grid(void **state) {
    (void)state;
    fixture fx = make_fixture();
    m2d_experiment x;
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", NULL, 0, &x), 0);
    m2d_sweep_backend b;
    assert_int_equal(m2d_sweep_backend_make(&x, &b), 0);
    for (int n = 1; n <= 7; n += 3) {
        int *seen = m2d_calloc((size_t)x.n_configs, sizeof *seen), lo = 1 << 30, hi = 0, students = 0;
        for (int i = 1; i <= n; i++) {
            int *idx, cnt = m2d_grid_shard(&x, i, n, &idx);
            /* the work is the distinct students: dealt evenly, and dedup never crosses shards */
            int distinct = m2d_sweep_count_distinct(&b, &x, idx, cnt);
            students += distinct;
            lo = M2D_MIN(lo, distinct);
            hi = M2D_MAX(hi, distinct);
            for (int j = 0; j < cnt; j++) seen[idx[j]]++;
            free(idx);
        }
        for (int c = 0; c < x.n_configs; c++) assert_int_equal(seen[c], 1);
        assert_int_equal(students, 224);
        assert_true(hi - lo <= 1);
        free(seen);
    }
    m2d_sweep_backend_close(&b);
    int i, n;
    assert_int_equal(m2d_parse_shard("3/8", &i, &n), 0);
    assert_int_equal(i, 3);
    assert_int_equal(n, 8);
    assert_int_equal(m2d_parse_shard("0/8", &i, &n), -1);
    assert_int_equal(m2d_parse_shard("9/8", &i, &n), -1);
    assert_int_equal(m2d_parse_shard("3", &i, &n), -1);
    m2d_experiment_free(&x);
    free_fixture(&fx);
}

static void results_roundtrip_quoting_and_torn_lines(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    char *path = m2d_path_join(dir, "r.csv");
    const char *cols[] = {"config_id", "status", "ppl"};
    const char *meta[] = {"experiment=e", "model_hash=abc", "host=h1"};
    const char *ident[] = {"experiment", "model_hash"};
    m2d_results_writer w;
    m2d_results ex;
    assert_int_equal(m2d_results_open(path, cols, 3, meta, 3, ident, 2, &w, &ex), 0);
    assert_int_equal(ex.n_rows, 0);
    m2d_results_free(&ex);
    const char *r1[] = {"0000000000a1", "failed: bad \"value\", really\nbad", "1.5"};
    const char *r2[] = {"0000000000a2", "failed: no value", ""};
    assert_int_equal(m2d_results_append(&w, r1), 0);
    assert_int_equal(m2d_results_append(&w, r2), 0);
    m2d_results_close(&w);
    /* a crash mid-row: bytes without a trailing newline */
    FILE *f = fopen(path, "a");
    fputs("0000000000a3,ok,2.", f);
    fclose(f);
    m2d_results r;
    assert_int_equal(m2d_results_read(path, &r), 0);
    assert_int_equal(r.n_rows, 2);
    assert_int_equal(r.torn_bytes, 18);
    assert_string_equal(m2d_results_get(&r, 0, "status"), "failed: bad \"value\", really bad");
    assert_string_equal(m2d_results_get(&r, 1, "ppl"), "");
    assert_string_equal(m2d_results_meta(&r, "host"), "h1");
    m2d_results_free(&r);
    /* re-open drops the torn row, then appends cleanly; a different host is fine */
    const char *meta2[] = {"experiment=e", "model_hash=abc", "host=h2"};
    assert_int_equal(m2d_results_open(path, cols, 3, meta2, 3, ident, 2, &w, &ex), 0);
    assert_int_equal(ex.n_rows, 2);
    m2d_results_free(&ex);
    const char *r3[] = {"0000000000a3", "ok", "2.5"};
    assert_int_equal(m2d_results_append(&w, r3), 0);
    m2d_results_close(&w);
    assert_int_equal(m2d_results_read(path, &r), 0);
    assert_int_equal(r.n_rows, 3);
    assert_int_equal(r.torn_bytes, 0);
    assert_string_equal(m2d_results_get(&r, 2, "ppl"), "2.5");
    m2d_results_free(&r);
    /* another model's run must not append here */
    const char *meta3[] = {"experiment=e", "model_hash=zzz"};
    assert_int_equal(m2d_results_open(path, cols, 3, meta3, 2, ident, 2, &w, NULL), -1);
    assert_non_null(strstr(m2d_errmsg(), "model_hash"));
    const char *cols2[] = {"config_id", "status"};
    assert_int_equal(m2d_results_open(path, cols2, 2, meta, 3, ident, 2, &w, NULL), -1);
    assert_non_null(strstr(m2d_errmsg(), "columns"));
    /* a results file with another name (a hard link) would be appended to and cut through it too */
    char *twin = m2d_strfmt("%s.twin", path);
    assert_int_equal(link(path, twin), 0);
    assert_int_equal(m2d_results_open(path, cols, 3, meta, 3, ident, 2, &w, NULL), -1);
    assert_non_null(strstr(m2d_errmsg(), "hard link"));
    unlink(twin);
    free(twin);
    /* a complete row with the wrong field count is an error naming the line */
    f = fopen(path, "a");
    fputs("0000000000a4,ok\n", f);
    fclose(f);
    assert_int_equal(m2d_results_read(path, &r), -1);
    assert_non_null(strstr(m2d_errmsg(), "r.csv:8:1: the row has 2 fields, the header has 3"));
    m2d_results_free(&r);
    tu_rm_rf(dir);
    free(path);
    free(dir);
}

/* rows by config id -> row index; every grid configuration exactly once */
static void check_one_row_per_config(const m2d_experiment *x, const m2d_results *r) {
    assert_int_equal(r->n_rows, x->n_configs);
    for (int c = 0; c < x->n_configs; c++) {
        int n = 0;
        for (int i = 0; i < r->n_rows; i++) n += strcmp(m2d_results_get(r, i, "config_id"), x->configs[c].id) == 0;
        if (n != 1) fail_msg("config %s has %d rows", x->configs[c].id, n);
    }
}

static int find_row(const m2d_results *r, const char *id) {
    for (int i = 0; i < r->n_rows; i++)
        if (strcmp(m2d_results_get(r, i, "config_id"), id) == 0) return i;
    return -1;
}

static void sweep_dedups_records_failures_and_resumes(void **state) {
    (void)state;
    fixture fx = make_fixture();
    m2d_experiment x;
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", NULL, 0, &x), 0);
    m2d_sweep_opts o = {.out = fx.csv, .jobs = 3};
    m2d_sweep_summary s;
    assert_int_equal(m2d_sweep_run(&x, &o, &s), 0);
    assert_int_equal(s.total, 280);
    /* at K = k the 5 groupings give one student per (scoring, scaling): 7*2*4 dedups */
    assert_int_equal(s.dedup, 56);
    assert_int_equal(s.evaluated, 224);
    m2d_results r;
    assert_int_equal(m2d_results_read(fx.csv, &r), 0);
    check_one_row_per_config(&x, &r);
    assert_string_equal(m2d_results_meta(&r, "experiment"), "grid");
    assert_non_null(m2d_results_meta(&r, "calib_hash"));
    int dedups = 0;
    for (int i = 0; i < r.n_rows; i++) {
        const char *d = m2d_results_get(&r, i, "dedup_of");
        if (!d[0]) continue;
        dedups++;
        int j = find_row(&r, d);
        assert_true(j >= 0);
        assert_string_equal(m2d_results_get(&r, j, "dedup_of"), "");
        assert_string_equal(m2d_results_get(&r, i, "fingerprint"), m2d_results_get(&r, j, "fingerprint"));
        assert_string_equal(m2d_results_get(&r, i, "ppl"), m2d_results_get(&r, j, "ppl"));
        assert_string_equal(m2d_results_get(&r, i, "K"), "8");
    }
    assert_int_equal(dedups, 56);
    m2d_results_free(&r);
    /* resume: nothing to do */
    assert_int_equal(m2d_sweep_run(&x, &o, &s), 0);
    assert_int_equal(s.skipped, 280);
    assert_int_equal(s.evaluated + s.dedup, 0);
    m2d_experiment_free(&x);

    /* failures are recorded and the sweep goes on */
    char *csv2 = m2d_path_join(fx.dir, "small.csv");
    assert_int_equal(m2d_experiment_load(fx.toml, "small", NULL, 0, &x), 0);
    m2d_sweep_opts o2 = {.out = csv2, .jobs = 2};
    assert_int_equal(m2d_sweep_run(&x, &o2, &s), 0);
    assert_int_equal(s.total, x.n_configs);
    assert_int_equal(m2d_results_read(csv2, &r), 0);
    check_one_row_per_config(&x, &r);
    int failed_build = 0, failed_nan = 0;
    for (int i = 0; i < r.n_rows; i++) {
        const char *st = m2d_results_get(&r, i, "status");
        if (!strcmp(m2d_results_get(&r, i, "scoring"), "failing")) {
            assert_non_null(strstr(st, "failed: unknown scoring plugin 'failing'"));
            failed_build++;
        } else if (!strcmp(m2d_results_get(&r, i, "params"), "nan")) {
            assert_string_equal(st, "failed: non-finite perplexity");
            assert_string_equal(m2d_results_get(&r, i, "ppl"), "");
            failed_nan++;
        } else {
            assert_string_equal(st, "ok");
            assert_string_equal(m2d_results_get(&r, i, "ppl_windows"), "3");
        }
    }
    assert_int_equal(failed_build, 6);
    assert_int_equal(failed_nan, 2 * 3 + 2); /* sf: 2 groupings x 3 K; cp: 2 groupings at K = k */
    assert_int_equal(s.failed, failed_build + failed_nan);
    m2d_results_free(&r);
    /* --retry-failed re-runs exactly the failed ones (and they fail again, deterministically) */
    o2.retry_failed = 1;
    assert_int_equal(m2d_sweep_run(&x, &o2, &s), 0);
    assert_int_equal(s.total - s.skipped, failed_build + failed_nan);
    assert_int_equal(m2d_results_read(csv2, &r), 0);
    check_one_row_per_config(&x, &r);
    m2d_results_free(&r);
    m2d_experiment_free(&x);
    /* --retry-failed with another experiment's file: refused before a failed row is dropped */
    size_t n_before, n_after;
    char *before = m2d_read_file(csv2, &n_before);
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", NULL, 0, &x), 0);
    assert_int_equal(m2d_sweep_run(&x, &o2, &s), -1);
    assert_non_null(strstr(m2d_errmsg(), "experiment"));
    char *after = m2d_read_file(csv2, &n_after);
    assert_true(n_before == n_after && memcmp(before, after, n_before) == 0);
    free(before), free(after);
    m2d_experiment_free(&x);
    free(csv2);
    free_fixture(&fx);
}

/* Kill -9 a real sweep process at several moments; after each, restart; at the end there must be
 * exactly one row per configuration, whatever moment the kills hit. */
static void sigkill_at_any_moment_then_resume(void **state) {
    (void)state;
    fixture fx = make_fixture();
    m2d_experiment x;
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", NULL, 0, &x), 0);
    char *cmd = m2d_strfmt("M2D_FAKE_DELAY_MS=3 exec %s sweep %s --experiment grid --out %s --jobs 2 >/dev/null 2>&1",
                           tu_test_bin(), fx.toml, fx.csv);
    /* kill delays in microseconds: before the header exists, early, and mid-run */
    const int delays[] = {0, 2000, 30000, 80000, 150000, 250000};
    for (size_t k = 0; k < M2D_ARRAY_LEN(delays); k++) {
        tu_run_killed(cmd, delays[k]);
        /* whatever is on disk parses (a torn last line is tolerated and reported) */
        if (m2d_file_exists(fx.csv)) {
            m2d_results r;
            assert_int_equal(m2d_results_read(fx.csv, &r), 0);
            assert_true(r.n_rows <= x.n_configs);
            m2d_results_free(&r);
        }
    }
    /* simulate the rarest case too: a torn row left by a crash in the middle of write() */
    if (m2d_file_exists(fx.csv)) {
        FILE *f = fopen(fx.csv, "a");
        fputs("deadbeef0000,sf,rr,uni", f);
        fclose(f);
    }
    char *finish = m2d_strfmt("%s sweep %s --experiment grid --out %s --jobs 2", tu_test_bin(), fx.toml, fx.csv);
    char *out = NULL, *err = NULL;
    assert_int_equal(tu_run(finish, &out, &err), 0);
    if (m2d_file_exists(fx.csv)) assert_non_null(strstr(out, "configurations"));
    m2d_results r;
    assert_int_equal(m2d_results_read(fx.csv, &r), 0);
    assert_int_equal(r.torn_bytes, 0);
    check_one_row_per_config(&x, &r);
    /* resumed dedup rows still point at evaluated rows with the same fingerprint */
    for (int i = 0; i < r.n_rows; i++) {
        const char *d = m2d_results_get(&r, i, "dedup_of");
        if (!d[0]) continue;
        int j = find_row(&r, d);
        assert_true(j >= 0);
        assert_string_equal(m2d_results_get(&r, i, "fingerprint"), m2d_results_get(&r, j, "fingerprint"));
    }
    m2d_results_free(&r);
    free(out);
    free(err);
    free(finish);
    free(cmd);
    m2d_experiment_free(&x);
    free_fixture(&fx);
}

static void cli_dry_run_shards_and_merge(void **state) {
    (void)state;
    fixture fx = make_fixture();
    char *out = NULL, *err = NULL;
    char *c = m2d_strfmt("%s sweep %s --experiment grid --dry-run", tu_test_bin(), fx.toml);
    assert_int_equal(tu_run(c, &out, &err), 0);
    assert_non_null(strstr(out, "configurations: 280"));
    assert_non_null(strstr(out, "distinct students: 224"));
    assert_non_null(strstr(out, "estimated run time"));
    free(c);
    free(out);
    free(err);
    /* three shards, then merge: same rows as a single run */
    for (int i = 1; i <= 3; i++) {
        c = m2d_strfmt("%s sweep %s --experiment grid --shard %d/3 --out %s/s%d.csv", tu_test_bin(), fx.toml, i, fx.dir, i);
        assert_int_equal(tu_run(c, NULL, NULL), 0);
        free(c);
    }
    c = m2d_strfmt("%s merge %s/all.csv %s/s1.csv %s/s2.csv %s/s3.csv --experiments %s --experiment grid", tu_test_bin(),
                   fx.dir, fx.dir, fx.dir, fx.dir, fx.toml);
    assert_int_equal(tu_run(c, &out, &err), 0);
    free(c);
    free(out);
    free(err);
    char *all = m2d_path_join(fx.dir, "all.csv");
    m2d_results r;
    m2d_experiment x;
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", NULL, 0, &x), 0);
    assert_int_equal(m2d_results_read(all, &r), 0);
    check_one_row_per_config(&x, &r);
    for (int i = 0; i < r.n_rows; i++) assert_string_equal(m2d_results_get(&r, i, "config_id"), x.configs[i].id);
    assert_string_equal(m2d_results_meta(&r, "shard"), "all");
    assert_string_equal(m2d_results_meta(&r, "precision"), "fp32"); /* the default, carried through the merge */
    assert_non_null(strstr(m2d_results_meta(&r, "merged_from"), "s3.csv (shard 3/3"));
    m2d_results_free(&r);
    /* a missing shard is a gap; a shard given twice is a duplicate; nothing written */
    c = m2d_strfmt("%s merge %s/gap.csv %s/s1.csv %s/s3.csv --experiments %s --experiment grid", tu_test_bin(), fx.dir,
                   fx.dir, fx.dir, fx.toml);
    assert_int_not_equal(tu_run(c, &out, &err), 0);
    assert_non_null(strstr(err, "configurations missing"));
    assert_non_null(strstr(err, "missing "));
    free(c);
    free(out);
    free(err);
    c = m2d_strfmt("%s merge %s/dup.csv %s/s1.csv %s/s2.csv %s/s2.csv", tu_bin(), fx.dir, fx.dir, fx.dir, fx.dir);
    assert_int_not_equal(tu_run(c, &out, &err), 0);
    assert_non_null(strstr(err, "duplicate"));
    free(c);
    free(out);
    free(err);
    char *gap = m2d_path_join(fx.dir, "gap.csv"), *dup = m2d_path_join(fx.dir, "dup.csv");
    assert_false(m2d_file_exists(gap));
    assert_false(m2d_file_exists(dup));
    /* a run of a different experiment cannot be appended to this file */
    c = m2d_strfmt("%s sweep %s --experiment small --out %s", tu_test_bin(), fx.toml, all);
    assert_int_not_equal(tu_run(c, &out, &err), 0);
    assert_non_null(strstr(err, "refusing to mix") ? err : strstr(err, "columns"));
    free(c);
    free(out);
    free(err);
    /* nor one in another precision (fp32 and bf16 rows never mix) */
    c = m2d_strfmt("%s sweep %s --experiment grid --precision bf16 --out %s", tu_test_bin(), fx.toml, all);
    assert_int_not_equal(tu_run(c, &out, &err), 0);
    assert_non_null(strstr(err, "precision"));
    free(c);
    free(out);
    free(err);
    c = m2d_strfmt("%s sweep %s --experiment grid --precision fp64", tu_test_bin(), fx.toml);
    assert_int_not_equal(tu_run(c, &out, &err), 0);
    assert_non_null(strstr(err, "sweep: --precision: 'fp64' is not a precision (auto, fp32, bf16)"));
    free(c);
    free(out);
    free(err);
    /* usage errors */
    c = m2d_strfmt("%s sweep %s", tu_bin(), fx.toml);
    assert_int_not_equal(tu_run(c, &out, &err), 0);
    assert_non_null(strstr(err, "--experiment NAME is required"));
    free(c);
    free(out);
    free(err);
    c = m2d_strfmt("%s help sweep", tu_bin());
    assert_int_equal(tu_run(c, &out, &err), 0);
    assert_non_null(strstr(out, "--shard I/N"));
    free(c);
    free(out);
    free(err);
    free(gap);
    free(dup);
    free(all);
    m2d_experiment_free(&x);
    free_fixture(&fx);
}

/* The fake backend is a test fixture: the product binary does not have it, and says so. */
static void product_binary_has_no_fake_backend(void **state) {
    (void)state;
    fixture fx = make_fixture();
    char *out = NULL, *err = NULL;
    char *c = m2d_strfmt("%s sweep %s --experiment grid --dry-run", tu_bin(), fx.toml);
    assert_int_not_equal(tu_run(c, &out, &err), 0);
    assert_non_null(strstr(err, "experiments.toml:4:"));
    assert_non_null(strstr(err, "'backend': 'fake' is not a registered sweep backend (pipeline)"));
    free(c);
    free(out);
    free(err);
    c = m2d_strfmt("%s sweep %s --experiment grid --dry-run", tu_test_bin(), fx.toml);
    assert_int_equal(tu_run(c, &out, &err), 0);
    free(c);
    free(out);
    free(err);
    /* in-process (the tests link the fake backend), an unknown name is refused by the loader too */
    m2d_experiment x;
    char *sets[] = {"backend='nope'"};
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", sets, 1, &x), -1);
    assert_non_null(strstr(m2d_errmsg(), "'nope' is not a registered sweep backend (fake, pipeline)"));
    m2d_experiment_free(&x);
    free_fixture(&fx);
}

/* A rerun into the same file refuses other inputs than the rows were made from: other bytes of the
 * PPL text at the same path, other MC settings (header 'inputs'). A file written before that header
 * existed is resumed as it is. */
static void resume_refuses_other_inputs(void **state) {
    (void)state;
    fixture fx = make_fixture();
    m2d_experiment x;
    m2d_sweep_opts o = {.out = fx.csv, .jobs = 1};
    m2d_sweep_summary s;
    char *text_path = m2d_strfmt("ppl.data='%s/ppl.txt'", fx.dir); /* in the test's folder, not the working one */
    char *sets[] = {"axes.scoring=['cp']", "axes.grouping=['rr']", "axes.scaling=['uniform']", "axes.K=['k']",
                    "mc={tasks = ['arc_easy'], configs = 'all'}", text_path};
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", sets, 6, &x), 0);
    tu_write(x.ppl_data, "one text\n", 9);
    assert_int_equal(m2d_sweep_run(&x, &o, &s), 0);
    tu_write(x.ppl_data, "another text\n", 13);
    assert_int_equal(m2d_sweep_run(&x, &o, &s), -1);
    if (!strstr(m2d_errmsg(), "header 'inputs'")) fail_msg("%s", m2d_errmsg());
    tu_write(x.ppl_data, "one text\n", 9);
    assert_int_equal(m2d_sweep_run(&x, &o, &s), 0);
    assert_int_equal(s.skipped, s.total);
    m2d_experiment_free(&x);
    char *limited[] = {"axes.scoring=['cp']", "axes.grouping=['rr']", "axes.scaling=['uniform']", "axes.K=['k']",
                       "mc={tasks = ['arc_easy'], configs = 'all', limit = 3}", text_path};
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", limited, 6, &x), 0);
    assert_int_equal(m2d_sweep_run(&x, &o, &s), -1);
    if (!strstr(m2d_errmsg(), "header 'inputs'")) fail_msg("%s", m2d_errmsg());
    m2d_experiment_free(&x);
    /* the file without its inputs line (as written before it), the first settings: resumed */
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", sets, 6, &x), 0);
    size_t n;
    char *text = m2d_read_file(fx.csv, &n), *line = strstr(text, "inputs="), *end = strchr(line, '\n');
    while (line > text && line[-1] != '\n') line--; /* the line's start (its comment mark) */
    memmove(line, end + 1, strlen(end + 1) + 1);
    tu_write(fx.csv, text, strlen(text));
    free(text);
    assert_int_equal(m2d_sweep_run(&x, &o, &s), 0);
    m2d_experiment_free(&x);
    free(text_path);
    free_fixture(&fx);
}

/* A results file resumed with a smaller grid keeps the rows of configurations no longer in it; the
 * MC stage selects among the grid's own rows only (before, best-per-pair could pick a row of the
 * old grid, skip it as unknown, and leave the grid's row of that pair without MC). */
static void mc_stage_selects_within_the_grid(void **state) {
    (void)state;
    fixture fx = make_fixture();
    m2d_experiment x;
    m2d_sweep_opts o = {.out = fx.csv, .jobs = 1};
    m2d_sweep_summary s;
    const char *Ks[] = {"axes.K=['2k']", "axes.K=['k']"};
    for (int run = 0; run < 2; run++) {
        char *sets[] = {"axes.scoring=['cp']", "axes.grouping=['rr']", "axes.scaling=['uniform']", (char *)Ks[run],
                        "mc={tasks = ['arc_easy'], configs = 'best-per-pair'}"};
        assert_int_equal(m2d_experiment_load(fx.toml, "grid", sets, 5, &x), 0);
        assert_int_equal(m2d_sweep_run(&x, &o, &s), 0);
        assert_int_equal(s.mc_selected, 1);
        assert_int_equal(s.mc_evaluated, 1);
        m2d_results r;
        assert_int_equal(m2d_results_read(fx.csv, &r), 0);
        assert_int_equal(r.n_rows, run + 1);
        for (int i = 0; i < r.n_rows; i++)
            if (!strcmp(m2d_results_get(&r, i, "config_id"), x.configs[0].id))
                assert_true(m2d_results_get(&r, i, "arc_easy_acc")[0] != 0);
        m2d_results_free(&r);
        m2d_experiment_free(&x);
    }
    free_fixture(&fx);
}

static void mc_stage_best_per_pair_fills_columns_and_resumes(void **state) {
    (void)state;
    fixture fx = make_fixture();
    m2d_experiment x;
    char *sets[] = {"mc={tasks = ['arc_easy', 'winogrande'], shots = {arc_easy = 25}, configs = 'best-per-pair'}"};
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", sets, 1, &x), 0);
    assert_int_equal(x.n_mc, 2);
    assert_int_equal(x.mc_shots[0], 25);
    assert_int_equal(x.mc_shots[1], 0);
    /* shots of a task not listed (a misspelling would run 0 shots) and a task twice: one line each */
    m2d_experiment bad;
    char *misspelt[] = {"mc={tasks = ['arc_easy'], shots = {arc_eazy = 5}}"}, *twice[] = {"mc={tasks = ['arc_easy', 'arc_easy']}"};
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", misspelt, 1, &bad), -1);
    if (!strstr(m2d_errmsg(), "mc.shots")) fail_msg("%s", m2d_errmsg());
    m2d_experiment_free(&bad);
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", twice, 1, &bad), -1);
    if (!strstr(m2d_errmsg(), "mc.tasks")) fail_msg("%s", m2d_errmsg());
    m2d_experiment_free(&bad);
    m2d_sweep_opts o = {.out = fx.csv, .jobs = 2};
    m2d_sweep_summary s;
    assert_int_equal(m2d_sweep_run(&x, &o, &s), 0);
    assert_int_equal(s.mc_selected, 7 * 5); /* one per scoring x grouping pair */
    assert_int_equal(s.mc_evaluated, 35);
    m2d_results r, side;
    assert_int_equal(m2d_results_read(fx.csv, &r), 0);
    char *sp = m2d_strfmt("%s.mc.csv", fx.csv);
    assert_int_equal(m2d_results_read(sp, &side), 0);
    assert_int_equal(side.n_rows, 35);
    int *best, nb = m2d_report_best_per_pair(&r, &best);
    assert_int_equal(nb, 35);
    /* the selected rows (and rows of the same student) carry the sidecar's values; others are empty */
    int filled = 0;
    for (int i = 0; i < r.n_rows; i++) {
        const char *v = m2d_results_get(&r, i, "arc_easy_acc");
        int selected = 0, same_student = 0;
        for (int b = 0; b < nb; b++) {
            selected |= best[b] == i;
            same_student |= !strcmp(m2d_results_get(&r, best[b], "fingerprint"), m2d_results_get(&r, i, "fingerprint"));
        }
        if (selected) {
            const char *id = m2d_results_get(&r, i, "config_id");
            int found = 0;
            for (int j = 0; j < side.n_rows; j++)
                if (!strcmp(side.rows[j][0], id)) {
                    assert_string_equal(m2d_results_get(&side, j, "arc_easy_acc"), v);
                    assert_string_equal(m2d_results_get(&side, j, "mc_avg"), m2d_results_get(&r, i, "mc_avg"));
                    found = 1;
                }
            assert_true(found);
        }
        if (same_student) {
            assert_true(v[0] != 0);
            filled++;
        } else {
            assert_string_equal(v, "");
        }
    }
    assert_true(filled >= 35);
    free(best);
    m2d_results_free(&r);
    m2d_results_free(&side);
    /* resume: nothing evaluated again */
    assert_int_equal(m2d_sweep_run(&x, &o, &s), 0);
    assert_int_equal(s.mc_evaluated, 0);
    assert_int_equal(s.skipped, 280);
    m2d_experiment_free(&x);
    free(sp);
    free_fixture(&fx);
}

/* The run header grows as needed (it was a fixed array of 16 with no bounds check). */
static void run_header_grows_without_bound(void **state) {
    (void)state;
    m2d_sweep_meta m = {0};
    for (int i = 0; i < 40; i++) m2d_sweep_meta_add(&m, m2d_strfmt("k%d=v%d", i, i));
    fixture fx = make_fixture();
    m2d_experiment x;
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", NULL, 0, &x), 0);
    m2d_sweep_meta_build(&x, 2, 3, "mh", "ch", "bf16", &m);
    assert_int_equal(m.n, 40 + 17);
    assert_string_equal(m.items[0], "k0=v0");
    assert_string_equal(m.items[39], "k39=v39");
    assert_string_equal(m.items[40], "moe2dense-results=1");
    int found = 0;
    for (int i = 40; i < m.n; i++)
        found += !strcmp(m.items[i], "experiment=grid") + !strcmp(m.items[i], "shard=2/3") +
                 !strcmp(m.items[i], "model_hash=mh") + !strcmp(m.items[i], "backend=fake") +
                 !strcmp(m.items[i], "precision=bf16");
    assert_int_equal(found, 5);
    m2d_sweep_meta_free(&m);
    assert_int_equal(m.n, 0);
    m2d_experiment_free(&x);
    free_fixture(&fx);
}

static void write_csv(const char *path, const char *const *cols, int n_cols, const char *const *cells, int n_rows) {
    m2d_results_writer w;
    const char *meta[] = {"experiment=e"};
    assert_int_equal(m2d_results_open(path, cols, n_cols, meta, 1, NULL, 0, &w, NULL), 0);
    for (int r = 0; r < n_rows; r++) assert_int_equal(m2d_results_append(&w, cells + (size_t)r * n_cols), 0);
    m2d_results_close(&w);
}

/* The MC stage copies sidecar values into the main file by column name, whatever the order of
 * the columns in either file, to every row of the same student; a missing column is an error. */
#define FP1 "1111111111111111111111111111111111111111111111111111111111111111"
#define FP2 "2222222222222222222222222222222222222222222222222222222222222222"
static void mc_fill_finds_columns_by_name(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), *out = m2d_path_join(dir, "r.csv"), *side = m2d_path_join(dir, "r.csv.mc.csv");
    const char *main_cols[] = {"config_id", "ppl", "arc_easy_acc", "mc_avg", "status", "fingerprint"};
    const char *main_cells[] = {"0000000000aa", "10", "", "", "ok", FP1,
                                "0000000000bb", "10", "", "", "ok", FP1,
                                "0000000000cc", "12", "", "", "ok", FP2};
    write_csv(out, main_cols, 6, main_cells, 3);
    const char *side_cols[] = {"status", "mc_avg", "config_id", "wall_s", "arc_easy_acc"};
    const char *side_cells[] = {"ok", "0.500000", "0000000000aa", "1.0", "0.250000",
                                "failed: boom", "0.900000", "0000000000cc", "1.0", "0.900000"};
    write_csv(side, side_cols, 5, side_cells, 2);
    char *mc[] = {"arc_easy_acc", "mc_avg"};
    assert_int_equal(m2d_sweep_mc_fill(out, side, mc, 2), 0);
    m2d_results r;
    assert_int_equal(m2d_results_read(out, &r), 0);
    for (int i = 0; i < 2; i++) { /* a and its dedup b: the same student */
        assert_string_equal(m2d_results_get(&r, i, "arc_easy_acc"), "0.250000");
        assert_string_equal(m2d_results_get(&r, i, "mc_avg"), "0.500000");
        assert_string_equal(m2d_results_get(&r, i, "ppl"), "10");
    }
    assert_string_equal(m2d_results_get(&r, 2, "arc_easy_acc"), ""); /* its MC run failed */
    m2d_results_free(&r);
    char *missing[] = {"winogrande_acc"};
    assert_int_equal(m2d_sweep_mc_fill(out, side, missing, 1), -1);
    assert_non_null(strstr(m2d_errmsg(), "r.csv: field 'winogrande_acc': column missing"));
    tu_rm_rf(dir);
    free(dir);
    free(out);
    free(side);
}

static void shipped_experiments_file_is_valid(void **state) {
    (void)state;
    /* experiments.toml at the top of the repository: the paper grid is 350 configurations on a
     * k = 8, E = 128 teacher (from the [teacher] hints when the weights are absent) */
    if (!m2d_file_exists("experiments.toml")) TU_SKIP("experiments.toml not in the working directory");
    m2d_experiment x;
    char *sets[] = {"model=/nonexistent/Qwen3-30B-A3B"};
    assert_int_equal(m2d_experiment_load("experiments.toml", "paper-grid", sets, 1, &x), 0);
    assert_int_equal(x.n_configs, 350);
    assert_int_equal(x.E, 128);
    assert_int_equal(x.n_mc, 5);
    m2d_experiment_free(&x);
    assert_int_equal(m2d_experiment_load("experiments.toml", "related-scorings", sets, 1, &x), 0);
    assert_int_equal(x.n_configs, 4 * 5 * 2 * 3);
    m2d_experiment_free(&x);
    /* related work as the papers run it: MoE students at two ratios, 6 + 4 + 2 method rows */
    assert_int_equal(m2d_experiment_load("experiments.toml", "related-work", sets, 1, &x), 0);
    assert_int_equal(x.n_configs, (6 + 4 + 2) * 2);
    for (int i = 0; i < x.n_configs; i++) {
        assert_string_equal(x.configs[i].target, "moe");
        assert_true(x.configs[i].K == 96 || x.configs[i].K == 64);
        assert_int_equal(!strcmp(x.configs[i].grouping, "remap"), !strcmp(x.configs[i].params, "scope=4"));
    }
    m2d_experiment_free(&x);
    assert_int_equal(m2d_experiment_load("experiments.toml", "condenser", sets, 1, &x), 0);
    assert_int_equal(x.n_configs, 4 * 2 * 3);
    m2d_experiment_free(&x);
    assert_int_equal(m2d_experiment_load("experiments.toml", "reduced-topk", sets, 1, &x), 0);
    assert_int_equal(x.n_configs, 5);
    assert_int_equal(x.configs[0].K, 128), assert_int_equal(x.configs[0].top_k, 1);
    m2d_experiment_free(&x);
    char *tiny[] = {"model=/nonexistent/tiny", "teacher={experts = 64, top_k = 8}"};
    assert_int_equal(m2d_experiment_load("experiments.toml", "demo", tiny, 2, &x), 0);
    assert_int_equal(x.n_configs, 280);
    assert_int_equal(x.n_distill_ids, 3); /* the ids exist in the grid (checked by the loader) */
    m2d_experiment_free(&x);
    assert_int_equal(m2d_experiment_load("experiments.toml", "distill-compare", tiny, 2, &x), 0);
    assert_int_equal(x.n_configs, 6);
    assert_string_equal(x.configs[4].scoring, "random-ffn"), assert_string_equal(x.configs[5].scoring, "random-init");
    assert_true(x.has_distill);
    assert_int_equal((int)x.distill.tokens, 262144);
    m2d_experiment_free(&x);
}


/* A dry run before the weights are on disk: the model directory does not exist, [teacher] gives the
 * shape, and the dry run prints a time and the peak memory of README "Memory of a sweep" (computed
 * here independently); a bad [teacher] value is refused, naming the file and the field. */
static char *gib_or_mib(double b) {
    const double M = 1024.0 * 1024;
    return b >= 1024 * M ? m2d_strfmt("%.1f GiB", b / (1024 * M)) : m2d_strfmt("%.1f MiB", b / M);
}

static void dry_run_estimates_from_teacher_table(void **state) {
    (void)state;
    fixture fx = make_fixture();
    const char *exp = "[experiment.t]\nmodel = 'DIR/no-such-model'\nbackend = 'fake'\n"
                      "calibration = { data = 'calib.txt', seq_len = 64, samples = 4 }\n"
                      "ppl = { data = 'ppl.txt', seq_len = 64, max_windows = 2 }\n"
                      "[experiment.t.teacher]\nexperts = 64\ntop_k = 8\nmoe_intermediate_size = 72\n"
                      "vocab_size = 8192\nhidden_size = 192\nnum_hidden_layers = 4\nnum_attention_heads = 6\n"
                      "num_key_value_heads = 2\nhead_dim = 32\nintermediate_size = 384\n"
                      "max_position_embeddings = 4096HEADS\n"
                      "[experiment.t.axes]\nscoring = ['sf']\ngrouping = ['rr']\nscaling = ['uniform']\n"
                      "K = ['k', '2k']\n";
    char *path = m2d_path_join(fx.dir, "t.toml");
    const char *dir_at = strstr(exp, "DIR"), *heads_at = strstr(exp, "HEADS");
    char *full = m2d_strfmt("%.*s%s%.*s%s", (int)(dir_at - exp), exp, fx.dir, (int)(heads_at - dir_at - 3),
                            dir_at + 3, heads_at + 5);
    tu_write(path, full, strlen(full));
    char *c = m2d_strfmt("%s sweep %s --experiment t --dry-run", tu_test_bin(), path), *out = NULL, *err = NULL;
    if (tu_run(c, &out, &err)) fail_msg("dry run: %s", err);
    assert_non_null(strstr(out, "teacher shape from [teacher] (config.json not readable)"));
    assert_non_null(strstr(out, "calibration: 4 x 64 tokens, ~"));
    assert_non_null(strstr(out, "estimated run time: ~"));
    assert_null(strstr(out, "unknown"));
    /* the formula: bf16 weights (2 bytes), untied LM head, every layer MoE; the dense student's FFN
     * is k d_e wide at K = 2k as at K = k (K experts merged into k groups), no router */
    double V = 8192, d = 192, n = 4, h = 6, kv = 2, hd = 32, E = 64, k = 8, de = 72, L = 64;
    double attn = d * hd * (2 * h + 2 * kv) + 2 * d + 2 * hd;
    double teacher = 2 * (2 * V * d + d + n * (attn + E * (3 * d * de + d)));
    double student = 2 * (2 * V * d + d + n * (attn + 3 * d * de * k));
    double nb = L; /* 512 MiB / (4 E d) > L */
    /* the Gram's scratch: 16 tokens of E outputs of d doubles a thread; the statistics: two E x E
     * Gram matrices, 6 arrays of E x d and 27 of E a layer (calib/stats.c SLOTS) */
    double gram = 8 * 16 * E * d * m2d_default_threads(), stats = 8 * (2 * E * E + 6 * E * d + 27 * E) * n;
    double calib = 4 * nb * E * d + 8 * nb * (2 * E + d + k) + 4 * 27 * L * d + gram + stats;
    char *t = gib_or_mib(teacher + calib + student), *tt = gib_or_mib(teacher), *tc = gib_or_mib(calib),
         *ts = gib_or_mib(student);
    char *want = m2d_strfmt("peak memory: ~%s (teacher %s mapped as stored, calibration %s, student %s;", t, tt, tc, ts);
    if (!strstr(out, want)) fail_msg("want '%s' in:\n%s", want, out);
    free(want), free(t), free(tt), free(tc), free(ts), free(c), free(out), free(err), free(full);
    /* a bad value: refused by the loader and the CLI, naming the file and the field */
    const char *bad[] = {" = 0", " = -4", " = 'six'"};
    for (int i = 0; i < 3; i++) {
        char *hexp = m2d_strfmt("%s", exp);
        char *p = strstr(hexp, "num_attention_heads = 6");
        full = m2d_strfmt("%.*snum_attention_heads%s%s", (int)(p - hexp), hexp, bad[i], p + strlen("num_attention_heads = 6"));
        char *at = strstr(full, "DIR"), *hd2 = strstr(full, "HEADS");
        char *f2 = m2d_strfmt("%.*s%s%.*s%s", (int)(at - full), full, fx.dir, (int)(hd2 - at - 3), at + 3, hd2 + 5);
        tu_write(path, f2, strlen(f2));
        m2d_experiment x;
        assert_int_equal(m2d_experiment_load(path, "t", NULL, 0, &x), -1);
        assert_non_null(strstr(m2d_errmsg(), "t.toml"));
        assert_non_null(strstr(m2d_errmsg(), "teacher.num_attention_heads"));
        c = m2d_strfmt("%s sweep %s --experiment t --dry-run", tu_test_bin(), path);
        assert_int_not_equal(tu_run(c, &out, &err), 0);
        assert_non_null(strstr(err, "teacher.num_attention_heads"));
        free(c), free(out), free(err), free(f2), free(full), free(hexp);
    }
    /* kv heads must divide the query heads */
    full = m2d_strfmt("%s", exp);
    char *p = strstr(full, "num_key_value_heads = 2");
    p[strlen("num_key_value_heads = ")] = '4';
    char *at = strstr(full, "DIR"), *hd2 = strstr(full, "HEADS");
    char *f2 = m2d_strfmt("%.*s%s%.*s%s", (int)(at - full), full, fx.dir, (int)(hd2 - at - 3), at + 3, hd2 + 5);
    tu_write(path, f2, strlen(f2));
    m2d_experiment x;
    assert_int_equal(m2d_experiment_load(path, "t", NULL, 0, &x), -1);
    assert_non_null(strstr(m2d_errmsg(), "teacher.num_key_value_heads"));
    free(f2), free(full), free(path);
    free_fixture(&fx);
}

/* A teacher larger than any machine's 80 % budget (a 1.2 TB MoE) is estimated layer-major: the
 * peak holds its largest layer and LM head, not its weights; a small one is not. */
static void memory_estimate_layer_major(void **state) {
    (void)state;
    m2d_run_shape big = {.vocab = 151936, .hidden = 8192, .layers = 96, .moe_layers = 96, .heads = 64, .kv_heads = 8,
                         .head_dim = 128, .d_e = 2048, .E = 256, .k = 8, .F = 0, .dtype_bytes = 2, .tied = 0};
    m2d_run_memory m;
    m2d_run_memory_estimate(&big, 512, 0, 64, &m);
    double calib64 = m.calib;
    m2d_run_memory_estimate(&big, 512, 0, 1, &m);
    /* the fp64 Gram's scratch is a thread's: 16 tokens x E x d doubles each */
    assert_true(fabs(calib64 - m.calib - 8.0 * 16 * 256 * 8192 * 63) <= 1e-9 * calib64);
    assert_true(m.teacher > 1e12);
    assert_true(m.layer_major);
    double d = 8192, attn = d * 128 * (2 * 64 + 2 * 8) + 2 * d + 2 * 128;
    double layer = 2 * (attn + 256 * (3 * d * 2048 + d) + 151936 * d);
    assert_true(fabs(m.teacher_layer - layer) <= 1e-9 * layer);
    assert_true(fabs(m.total - (layer + m.calib + m.student)) <= 1e-9 * m.total);
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    m2d_run_memory_print(&m, f);
    fclose(f);
    assert_non_null(strstr(out, "teacher one layer at a time"));
    assert_non_null(strstr(out, "its passes run layer-major"));
    free(out);
    m2d_run_shape small = big;
    small.layers = small.moe_layers = 1, small.hidden = 64, small.vocab = 1000, small.E = 4, small.d_e = 32;
    m2d_run_memory_estimate(&small, 512, 0, 1, &m);
    assert_false(m.layer_major);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(grid_expands_resolves_and_trims),
        cmocka_unit_test(grid_target_axis),
        cmocka_unit_test(moe_grid_sweep_then_report),
        cmocka_unit_test(resolve_K_expressions),
        cmocka_unit_test(shards_partition_the_grid),
        cmocka_unit_test(results_roundtrip_quoting_and_torn_lines),
        cmocka_unit_test(sweep_dedups_records_failures_and_resumes),
        cmocka_unit_test(sigkill_at_any_moment_then_resume),
        cmocka_unit_test(cli_dry_run_shards_and_merge),
        cmocka_unit_test(product_binary_has_no_fake_backend),
        cmocka_unit_test(mc_stage_best_per_pair_fills_columns_and_resumes),
        cmocka_unit_test(mc_stage_selects_within_the_grid),
        cmocka_unit_test(resume_refuses_other_inputs),
        cmocka_unit_test(run_header_grows_without_bound),
        cmocka_unit_test(mc_fill_finds_columns_by_name),
        cmocka_unit_test(shipped_experiments_file_is_valid),
        cmocka_unit_test(dry_run_estimates_from_teacher_table),
        cmocka_unit_test(memory_estimate_layer_major),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
