/* sweep distill stage ([distill], harness/sweep/sweep_distill.c) on the deterministic "fake"
 * backend (tests/sweep_fake.c: a distilled student has half its student's PPL and MC accuracies
 * (1 + a) / 2): selection (best-per-pair, all, a list), one distillation per distinct student,
 * the columns filled in the main CSV, MC scored on the distilled students, failures recorded
 * (and retried with --retry-failed), resume, a refused resume with other settings, and the
 * [distill] table's errors. */
#include "testutil.h"
#include "sweep_fixture.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/util.h"
#include "io/results.h"
#include "sweep/grid.h"
#include "sweep/report.h"
#include "sweep/report_distill.h"
#include "sweep/report_scoring_k.h"
#include "sweep/sweep.h"

static const char *EXPERIMENTS =
    "[experiment.grid]\n"
    "model = 'MODEL'\n"
    "backend = 'fake'\n"
    "calibration = { data = 'calib.txt', seq_len = 64, samples = 4 }\n"
    "ppl = { data = 'ppl.txt', seq_len = 64, max_windows = 2 }\n"
    "[experiment.grid.axes]\n"
    "scoring = ['sf', 'cp', 'do-acp']\n"
    "grouping = ['rr', 'oc']\n"
    "scaling = ['uniform', 'proportional']\n"
    "K = ['k', '2k', 'E']\n"
    "params = ['', 'distill-fail']\n"
    "[experiment.grid.distill]\n"
    "data = 'MODEL/../train.txt'\n"
    "tokens = 1000\n"
    "seq_len = 8\n"
    "batch = 2\n"
    "lr = 1e-3\n";

/* the grid over a teacher of config JSON, with its training text */
static tu_sweep_fixture fixture_of(const char *json) {
    tu_sweep_fixture fx = tu_sweep_fixture_make(json, EXPERIMENTS);
    char *train = m2d_path_join(fx.dir, "train.txt"); /* checked before any work: it must be training text */
    tu_write(train, "the training text of the fake backend\n", 38);
    free(train);
    return fx;
}

static tu_sweep_fixture make_fixture(void) {
    return fixture_of("{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"num_experts\": 64, \"num_experts_per_tok\": 8,"
                      " \"moe_intermediate_size\": 72, \"hidden_size\": 192, \"num_hidden_layers\": 4,"
                      " \"vocab_size\": 8192, \"num_attention_heads\": 6, \"num_key_value_heads\": 2, \"head_dim\": 32,"
                      " \"max_position_embeddings\": 512}");
}

/* X is refused by the dry run (an error holding WANT and naming experiments.toml) and by the run
 * (holding WANT), before any work: no CSV (WHAT names the case) */
static void refused_before_work(m2d_experiment *x, const tu_sweep_fixture *fx, const char *what, const char *want) {
    m2d_sweep_opts o = {.out = fx->csv, .jobs = 1};
    m2d_sweep_summary s;
    FILE *devnull = fopen("/dev/null", "w");
    int dry = m2d_sweep_dry_run(x, &o, devnull);
    fclose(devnull);
    if (dry != -1 || !strstr(m2d_errmsg(), want) || !strstr(m2d_errmsg(), "experiments.toml"))
        fail_msg("%s: dry run %d: expected '%s', got '%s'", what, dry, want, m2d_errmsg());
    assert_int_equal(m2d_sweep_run(x, &o, &s), -1);
    if (!strstr(m2d_errmsg(), want)) fail_msg("%s: run: got '%s'", what, m2d_errmsg());
    assert_false(m2d_file_exists(fx->csv));
}

static double num(const m2d_results *r, int i, const char *col) { return strtod(m2d_results_get(r, i, col), NULL); }

/* Rows of R whose student (fingerprint) is one of the selected rows SEL[0..n). */
static int same_student_as_any(const m2d_results *r, int i, const int *sel, int n) {
    for (int s = 0; s < n; s++)
        if (!strcmp(m2d_results_get(r, sel[s], "fingerprint"), m2d_results_get(r, i, "fingerprint"))) return 1;
    return 0;
}

static int distinct_fingerprints(const m2d_results *r, const int *sel, int n) {
    int d = 0;
    for (int s = 0; s < n; s++) d += !same_student_as_any(r, sel[s], sel, s);
    return d;
}

/* X loaded from the fixture's grid with the one --set SET and run into its CSV (JOBS jobs) */
static void load_and_run(const tu_sweep_fixture *fx, char *set, int jobs, m2d_experiment *x, m2d_sweep_summary *s) {
    char *sets[] = {set};
    assert_int_equal(m2d_experiment_load(fx->toml, "grid", sets, 1, x), 0);
    m2d_sweep_opts o = {.out = fx->csv, .jobs = jobs};
    assert_int_equal(m2d_sweep_run(x, &o, s), 0);
}

/* best-per-pair (pre-distillation PPL) with MC tasks: every selected student distilled once; its
 * rows get distill_ppl (half the fake's PPL), the tokens of ceil(1000 / 16) steps, and MC values
 * of the distilled student (mc_student = distilled); the plain MC stage does not run; a resume
 * distills nothing again; other settings are refused. */
static void best_per_pair_distills_scores_and_resumes(void **state) {
    (void)state;
    tu_sweep_fixture fx = make_fixture();
    m2d_experiment x;
    char *sets[] = {"mc={tasks = ['arc_easy'], configs = 'best-per-pair'}"};
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", sets, 1, &x), 0);
    assert_true(x.has_distill);
    assert_string_equal(x.distill_configs, "best-per-pair");
    m2d_sweep_opts o = {.out = fx.csv, .jobs = 2};
    m2d_sweep_summary s;
    assert_int_equal(m2d_sweep_run(&x, &o, &s), 0);
    m2d_results r;
    assert_int_equal(m2d_results_read(fx.csv, &r), 0);
    int *best, nb = m2d_report_best_per_pair(&r, &best);
    assert_int_equal(nb, 3 * 2);
    assert_int_equal(s.distill_selected, nb);
    assert_int_equal(s.distill_evaluated, distinct_fingerprints(&r, best, nb));
    assert_int_equal(s.mc_evaluated, 0);
    char *mc_side = m2d_strfmt("%s.mc.csv", fx.csv);
    assert_false(m2d_file_exists(mc_side));
    int filled = 0;
    for (int i = 0; i < r.n_rows; i++) {
        if (!same_student_as_any(&r, i, best, nb)) {
            assert_string_equal(m2d_results_get(&r, i, "distill_ppl"), "");
            assert_string_equal(m2d_results_get(&r, i, "arc_easy_acc"), "");
            assert_string_equal(m2d_results_get(&r, i, "mc_student"), "");
            continue;
        }
        filled++;
        if (!strcmp(m2d_results_get(&r, i, "params"), "distill-fail")) { /* its distillation failed */
            assert_string_equal(m2d_results_get(&r, i, "distill_ppl"), "");
            assert_string_equal(m2d_results_get(&r, i, "mc_student"), "");
            continue;
        }
        assert_true(fabs(num(&r, i, "distill_ppl") - num(&r, i, "ppl") / 2) < 1e-4);
        assert_string_equal(m2d_results_get(&r, i, "distill_tokens"), "1008"); /* 63 steps of 2 x 8 */
        assert_string_equal(m2d_results_get(&r, i, "distill_steps"), "63");
        assert_true(m2d_results_get(&r, i, "distill_final_loss")[0] != 0);
        assert_string_equal(m2d_results_get(&r, i, "mc_student"), "distilled");
        assert_true(num(&r, i, "arc_easy_acc") >= 0.5); /* (1 + a) / 2 */
    }
    assert_true(filled >= nb);
    /* the teacher's MC on the same tasks in the header (the fake's fixed values); no dense teacher */
    assert_non_null(m2d_results_meta(&r, "teacher_mc"));
    assert_string_equal(m2d_results_meta(&r, "teacher_mc"), "arc_easy_acc:0.600000,arc_easy_acc_norm:0.650000,"
                                                             "mc_avg:0.600000");
    assert_null(m2d_results_meta(&r, "d2d_teacher_mc"));
    /* a resume keeps the header's teacher_mc (not measured again): a marked value survives */
    m2d_results_set_meta(&r, "teacher_mc", "arc_easy_acc:0.123000,mc_avg:0.123000");
    assert_int_equal(m2d_results_write(fx.csv, &r), 0);
    free(best);
    m2d_results_free(&r);
    assert_int_equal(m2d_sweep_run(&x, &o, &s), 0);
    assert_int_equal(s.distill_evaluated, 0);
    assert_int_equal(m2d_results_read(fx.csv, &r), 0);
    assert_string_equal(m2d_results_meta(&r, "teacher_mc"), "arc_easy_acc:0.123000,mc_avg:0.123000");
    m2d_results_free(&r);
    m2d_experiment_free(&x);
    /* the sidecar's header records the settings: another token budget does not mix into it */
    char *more[] = {"mc={tasks = ['arc_easy'], configs = 'best-per-pair'}", "distill.tokens=2000"};
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", more, 2, &x), 0);
    assert_int_equal(m2d_sweep_run(&x, &o, &s), -1);
    assert_non_null(strstr(m2d_errmsg(), "results.csv.distill.csv: header 'distill' is"));
    assert_non_null(strstr(m2d_errmsg(), "tokens=2000"));
    m2d_experiment_free(&x);
    free(mc_side);
    tu_sweep_fixture_free(&fx);
}

/* OUT.distill planted as a link: no student is written through it (each selected row fails, saying
 * so), and the link's target stays empty. */
static void students_folder_link_refused(void **state) {
    (void)state;
    tu_sweep_fixture fx = make_fixture();
    char *victim = m2d_path_join(fx.dir, "victim"), *link = m2d_strfmt("%s.distill", fx.csv);
    assert_int_equal(m2d_mkdir_p(victim), 0);
    assert_int_equal(symlink(victim, link), 0);
    m2d_experiment x;
    m2d_sweep_summary s;
    load_and_run(&fx, "distill.configs='best-per-scoring-K'", 1, &x, &s);
    assert_true(s.distill_selected > 0);
    char *side = m2d_strfmt("%s.distill.csv", fx.csv);
    m2d_results r;
    assert_int_equal(m2d_results_read(side, &r), 0);
    assert_int_equal(r.n_rows, s.distill_selected);
    for (int i = 0; i < r.n_rows; i++)
        if (!strstr(m2d_results_get(&r, i, "status"), "symbolic link")) fail_msg("%s", m2d_results_get(&r, i, "status"));
    char *cmd = m2d_strfmt("test -z \"$(ls -A '%s')\"", victim);
    assert_int_equal(system(cmd), 0);
    m2d_results_free(&r);
    m2d_experiment_free(&x);
    free(cmd), free(side), free(victim), free(link);
    tu_sweep_fixture_free(&fx);
}

/* configs = "best-per-scoring-K" (paper Tables 8, 16, 17): per scoring the lowest pre-distillation
 * PPL at K = k and at K = 2k, over groupings, scalings and params: 3 scorings x 2 = 6 rows
 * (m2d_report_best_per_scoring_K of the results), each distilled (unless its params make the fake
 * fail) and nothing else (K = E never); the dry run on the finished file lists exactly those rows. */
static void best_per_scoring_K_distills_the_selection(void **state) {
    (void)state;
    tu_sweep_fixture fx = make_fixture();
    m2d_experiment x;
    m2d_sweep_summary s;
    load_and_run(&fx, "distill.configs='best-per-scoring-K'", 2, &x, &s);
    m2d_results r;
    assert_int_equal(m2d_results_read(fx.csv, &r), 0);
    int *sel, n = m2d_report_best_per_scoring_K(&r, &sel);
    assert_int_equal(n, 3 * 2);
    assert_int_equal(s.distill_selected, n);
    for (int q = 0; q < n; q++) {
        int K = atoi(m2d_results_get(&r, sel[q], "K"));
        assert_int_equal(K, q % 2 ? 16 : 8); /* k, then 2k, per scoring */
        for (int i = 0; i < r.n_rows; i++) /* the lowest PPL of its scoring at its K */
            if (!strcmp(m2d_results_get(&r, i, "scoring"), m2d_results_get(&r, sel[q], "scoring")) &&
                atoi(m2d_results_get(&r, i, "K")) == K && !strcmp(m2d_results_get(&r, i, "status"), "ok"))
                assert_true(num(&r, sel[q], "ppl") <= num(&r, i, "ppl"));
        if (strcmp(m2d_results_get(&r, sel[q], "params"), "distill-fail"))
            assert_true(fabs(num(&r, sel[q], "distill_ppl") - num(&r, sel[q], "ppl") / 2) < 1e-4);
    }
    for (int i = 0; i < r.n_rows; i++)
        if (!same_student_as_any(&r, i, sel, n)) assert_string_equal(m2d_results_get(&r, i, "distill_ppl"), "");
    char *out = NULL, *err = NULL;
    char *c = m2d_strfmt("%s sweep %s --experiment grid --dry-run --out %s --set \"distill.configs='best-per-scoring-K'\"",
                         tu_test_bin(), fx.toml, fx.csv);
    assert_int_equal(tu_run(c, &out, &err), 0);
    const char *head = "distillation selection: per scoring the lowest pre-distillation PPL at K = k = 8 and at K = 2k = 16 "
                       "(at most 6 students)\nselected now from the PPLs in the results file (6):\n";
    const char *at = strstr(out, head);
    if (!at) fail_msg("dry run: %s", out);
    at += strlen(head);
    for (int q = 0; q < n; q++) {
        char *line = m2d_strfmt("%s %s ", m2d_results_get(&r, sel[q], "config_id"), m2d_results_get(&r, sel[q], "scoring"));
        if (strncmp(at, line, strlen(line))) fail_msg("dry run line %d: want '%s...' in:\n%s", q, line, out);
        at = strchr(at, '\n') + 1;
        free(line);
    }
    free(c), free(out), free(err), free(sel);
    m2d_results_free(&r);
    m2d_experiment_free(&x);
    tu_sweep_fixture_free(&fx);
}

/* configs = "all": every evaluated student; a failed distillation is a failed sidecar row and
 * leaves the main row's distillation columns empty; a list of ids distills exactly those. */
static void all_and_list_with_failures(void **state) {
    (void)state;
    tu_sweep_fixture fx = make_fixture();
    m2d_experiment x;
    m2d_sweep_summary s;
    load_and_run(&fx, "distill.configs=all", 1, &x, &s);
    m2d_sweep_opts o = {.out = fx.csv, .jobs = 1}; /* the resumes below */
    m2d_results r, side;
    assert_int_equal(m2d_results_read(fx.csv, &r), 0);
    char *sp = m2d_strfmt("%s.distill.csv", fx.csv);
    assert_int_equal(m2d_results_read(sp, &side), 0);
    assert_int_equal(side.n_rows, s.distill_evaluated);
    int failed = 0;
    for (int j = 0; j < side.n_rows; j++) failed += !strncmp(m2d_results_get(&side, j, "status"), "failed: distill", 15);
    assert_true(failed > 0);
    assert_int_equal(s.distill_failed, failed); /* `sweep` then exits 3 */
    for (int i = 0; i < r.n_rows; i++) {
        const char *v = m2d_results_get(&r, i, "distill_ppl");
        if (!strcmp(m2d_results_get(&r, i, "params"), "distill-fail")) assert_string_equal(v, "");
        else assert_true(fabs(strtod(v, NULL) - num(&r, i, "ppl") / 2) < 1e-4);
    }
    assert_true(m2d_results_col(&r, "mc_student") < 0); /* no MC tasks: no such column */
    char *id = m2d_strdup(m2d_results_get(&r, 3, "config_id"));
    m2d_results_free(&r);
    m2d_results_free(&side);
    /* a resume leaves the failures alone; --retry-failed distills them again (and they fail again) */
    assert_int_equal(m2d_sweep_run(&x, &o, &s), 0);
    assert_int_equal(s.distill_evaluated, 0);
    o.retry_failed = 1;
    assert_int_equal(m2d_sweep_run(&x, &o, &s), 0);
    assert_int_equal(s.distill_evaluated, failed);
    o.retry_failed = 0;
    m2d_experiment_free(&x);
    /* a list: exactly that configuration */
    tu_rm_rf(fx.csv), tu_rm_rf(sp);
    char *list = m2d_strfmt("distill.configs=['%s']", id);
    char *sets2[] = {list};
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", sets2, 1, &x), 0);
    assert_int_equal(m2d_sweep_run(&x, &o, &s), 0);
    assert_int_equal(s.distill_selected, 1);
    assert_int_equal(m2d_results_read(sp, &side), 0);
    assert_int_equal(side.n_rows, 1);
    assert_string_equal(m2d_results_get(&side, 0, "config_id"), id);
    m2d_results_free(&side);
    m2d_experiment_free(&x);
    free(list), free(id), free(sp);
    tu_sweep_fixture_free(&fx);
}

/* The sweep's --precision is its distillation stage's teacher precision (the fake backend fails a
 * distillation given another one) and the sidecar's header records it. */
static void precision_flows_into_the_stage(void **state) {
    (void)state;
    tu_sweep_fixture fx = make_fixture();
    m2d_experiment x;
    char *sets[] = {"distill.configs=all"};
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", sets, 1, &x), 0);
    m2d_sweep_opts o = {.out = fx.csv, .jobs = 1, .precision = M2D_PREC_BF16};
    m2d_sweep_summary s;
    assert_int_equal(m2d_sweep_run(&x, &o, &s), 0);
    char *sp = m2d_strfmt("%s.distill.csv", fx.csv);
    m2d_results side;
    assert_int_equal(m2d_results_read(sp, &side), 0);
    int ok = 0;
    for (int j = 0; j < side.n_rows; j++) {
        const char *st = m2d_results_get(&side, j, "status");
        if (strstr(st, "precision")) fail_msg("%s", st);
        ok += !strcmp(st, "ok");
    }
    assert_true(ok > 0);
    char *text = m2d_read_file(sp, NULL);
    assert_non_null(strstr(text, "precision=bf16"));
    assert_null(strstr(text, "train_precision")); /* fp32 students: the header as before the key */
    free(text);
    m2d_results_free(&side);
    m2d_experiment_free(&x);
    free(sp);
    /* distill.train_precision: the students' GEMMs, a setting of the stage's header (a sidecar of
     * fp32 students refuses it: another --out) */
    char *sets_bf16[] = {"distill.configs=all", "distill.train_precision='bf16'"};
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", sets_bf16, 2, &x), 0);
    assert_int_equal(x.distill.train.train_precision, M2D_PREC_BF16);
    assert_int_equal(m2d_sweep_run(&x, &o, &s), -1);
    assert_non_null(strstr(m2d_errmsg(), "refusing to mix results"));
    char *out2 = m2d_path_join(fx.dir, "bf16.csv");
    o.out = out2;
    if (m2d_sweep_run(&x, &o, &s)) fail_msg("%s", m2d_errmsg());
    sp = m2d_strfmt("%s.distill.csv", out2);
    text = m2d_read_file(sp, NULL);
    assert_non_null(strstr(text, "train_precision=bf16"));
    free(text), free(sp), free(out2);
    assert_int_equal(m2d_results_read(fx.csv, &side), 0); /* for the free below */
    m2d_results_free(&side);
    m2d_experiment_free(&x);
    tu_sweep_fixture_free(&fx);
}

/* [distill] errors name the file and the key; no table: no stage, no columns. */
static void distill_table_errors(void **state) {
    (void)state;
    tu_sweep_fixture fx = make_fixture();
    struct { const char *set, *want; } cases[] = {
        {"distill.epochs=2", "unknown key 'epochs' in [distill]"},
        {"distill.steps=10", "[distill] needs exactly one of 'tokens' and 'steps'"},
        {"distill.loss='kl'", "'distill.loss' must be \"fkl\", \"rkl\" or \"fkl+mse\""},
        {"distill.order='random'", "'distill.order' must be \"shuffle\" or \"sequential\""},
        {"distill.configs='best'", "'distill.configs' must be \"all\", \"best-per-pair\", \"best-per-scoring-K\" or an array of config ids"},
        {"distill.configs=['0123456789ab']", "distill.configs: '0123456789ab' is not a config id of the grid"},
        {"distill.lr='high'", "'distill.lr' must be a number"},
        {"distill.lr=0", "'distill.lr' must be a positive number"},
        {"distill.recompute=1", "'distill.recompute' must be true or false"},
        {"distill.mse_norm='mean'", "'distill.mse_norm' must be \"minitron\" or \"sum\""},
        {"distill.train_precision='auto'", "'distill.train_precision' must be \"fp32\" or \"bf16\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        m2d_experiment x;
        char *sets[] = {(char *)cases[i].set};
        assert_int_equal(m2d_experiment_load(fx.toml, "grid", sets, 1, &x), -1);
        if (!strstr(m2d_errmsg(), cases[i].want)) fail_msg("%s: got '%s'", cases[i].set, m2d_errmsg());
        m2d_experiment_free(&x);
    }
    /* data is required */
    const char *no_data = "[experiment.e]\nmodel = 'M'\nbackend = 'fake'\ncalibration = { data = 'c' }\n"
                          "ppl = { data = 'p' }\nteacher = { experts = 8, top_k = 2 }\n"
                          "axes = { scoring = ['sf'], grouping = ['rr'], scaling = ['uniform'], K = ['k'] }\n"
                          "distill = { tokens = 10 }\n";
    char *path = m2d_path_join(fx.dir, "nodata.toml");
    tu_write(path, no_data, strlen(no_data));
    m2d_experiment x;
    assert_int_equal(m2d_experiment_load(path, "e", NULL, 0, &x), -1);
    assert_non_null(strstr(m2d_errmsg(), "missing 'distill.data'"));
    m2d_experiment_free(&x);
    free(path);
    tu_sweep_fixture_free(&fx);
}

/* Issue 27 (4, 5): [distill] is checked before any work, by the dry run and the run alike -- a
 * window past the teacher's context, K' above its experts, a micro-batch that does not divide the
 * batch, a batch the machine's memory cannot hold, data that is missing, empty, binary or shorter
 * than one window: refused with one line, and nothing is written (no CSV, no sidecar). */
static void distill_checked_before_work(void **state) {
    (void)state;
    tu_sweep_fixture fx = make_fixture();
    char *tok = m2d_path_join(fx.model, "tokenizer.json"); /* the teacher's tokenizer counts the windows */
    tu_copy_file("tests/golden/hf/tokenizer.json", tok);
    const char *files[][2] = {{"empty.txt", ""}, {"binary.txt", "ab\0cd"}, {"short.txt", "abc"}};
    for (size_t i = 0; i < 3; i++) {
        char *p = m2d_path_join(fx.dir, files[i][0]);
        tu_write(p, files[i][1], i == 1 ? 5 : strlen(files[i][1]));
        free(p);
    }
    struct { char *set; const char *want; } cases[] = {
        {m2d_strdup("distill.seq_len=513"), "distill.seq_len 513 exceeds the teacher's max_position_embeddings 512"},
        {m2d_strdup("distill.teacher_topk=65"), "distill.teacher_topk 65 exceeds the teacher's num_experts 64"},
        {m2d_strdup("distill.micro_batch=4"), "distill.micro_batch 4 must divide distill.batch 2"},
        {m2d_strdup("distill.batch=1000000"), "distill.batch 1000000 x distill.seq_len 8 needs ~"},
        {m2d_strfmt("distill.data='%s/missing.txt'", fx.dir), "missing.txt: cannot open"},
        {m2d_strfmt("distill.data='%s/empty.txt'", fx.dir), "empty.txt: empty"},
        {m2d_strfmt("distill.data='%s/binary.txt'", fx.dir), "binary.txt: holds NUL bytes"},
        {m2d_strfmt("distill.data='%s/short.txt'", fx.dir), "short.txt: 3 tokens is less than one window of 8"},
        {m2d_strfmt("distill.data='%s'", fx.dir), "is a directory"},
    };
    char *side = m2d_strfmt("%s.distill.csv", fx.csv);
    for (size_t i = 0; i < M2D_ARRAY_LEN(cases); i++) {
        m2d_experiment x;
        char *sets[] = {cases[i].set};
        assert_int_equal(m2d_experiment_load(fx.toml, "grid", sets, 1, &x), 0);
        refused_before_work(&x, &fx, cases[i].set, cases[i].want);
        assert_false(m2d_file_exists(side));
        m2d_experiment_free(&x);
        free(cases[i].set);
    }
    free(side), free(tok);
    tu_sweep_fixture_free(&fx);
}

/* Issue 24: DeepSeek-V2's dense student keeps its latent attention, which the training engine
 * implements: a [distill] block on it passes the dry run (params.h m2d_train_unsupported refuses
 * no attention kind the engine runs) */
static void deepseek_student_passes_dry_run(void **state) {
    (void)state;
    tu_sweep_fixture fx = fixture_of(
        "{\"architectures\": [\"DeepseekV2ForCausalLM\"], \"first_k_dense_replace\": 1, \"head_dim\": 8,"
        " \"hidden_size\": 64, \"intermediate_size\": 48, \"kv_lora_rank\": 32, \"max_position_embeddings\": 64,"
        " \"moe_intermediate_size\": 16, \"n_routed_experts\": 8, \"n_shared_experts\": 2, \"norm_topk_prob\": false,"
        " \"num_attention_heads\": 4, \"num_experts_per_tok\": 2, \"num_hidden_layers\": 3,"
        " \"num_key_value_heads\": 4, \"q_lora_rank\": null, \"qk_nope_head_dim\": 16, \"qk_rope_head_dim\": 8,"
        " \"v_head_dim\": 12, \"topk_method\": \"greedy\", \"vocab_size\": 320}");
    m2d_experiment x;
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", NULL, 0, &x), 0);
    m2d_sweep_opts o = {.out = fx.csv, .jobs = 1};
    FILE *devnull = fopen("/dev/null", "w");
    int dry = m2d_sweep_dry_run(&x, &o, devnull);
    fclose(devnull);
    if (dry != 0) fail_msg("dry run: %s", m2d_errmsg());
    m2d_experiment_free(&x);
    tu_sweep_fixture_free(&fx);
}

/* Issue 27 (4, 5): a sidecar that holds no distilled student (every row failed) does not block a
 * rerun with fixed settings: it is started afresh (also with --retry-failed); one that holds a
 * result is still refused (best_per_pair_distills_scores_and_resumes). */
static void failed_sidecar_does_not_block_a_rerun(void **state) {
    (void)state;
    tu_sweep_fixture fx = make_fixture();
    char *sets[] = {"distill.configs=all", "axes.params=['distill-fail']", "distill.tokens=2000"};
    m2d_experiment x;
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", sets, 2, &x), 0);
    m2d_sweep_opts o = {.out = fx.csv, .jobs = 1};
    m2d_sweep_summary s;
    assert_int_equal(m2d_sweep_run(&x, &o, &s), 0);
    assert_true(s.distill_failed > 0 && s.distill_failed == s.distill_evaluated);
    m2d_experiment_free(&x);
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", sets, 3, &x), 0);
    o.retry_failed = 1;
    if (m2d_sweep_run(&x, &o, &s)) fail_msg("%s", m2d_errmsg());
    char *side = m2d_strfmt("%s.distill.csv", fx.csv), *text = m2d_read_file(side, NULL);
    assert_non_null(strstr(text, "tokens=2000"));
    free(text), free(side);
    m2d_experiment_free(&x);
    tu_sweep_fixture_free(&fx);
}

/* distill.val_data: the validation curve's held-out text. Default: the file beside ppl.data with
 * "test" read as "valid"; none needed without a curve (eval_every 0); required with one when
 * ppl.data's name has no "test"; refused when it is ppl.data (by name or through a link). The
 * sidecar's settings record it. */
static void validation_data_is_held_out(void **state) {
    (void)state;
    tu_sweep_fixture fx = make_fixture();
    char *ppl = m2d_path_join(fx.dir, "wiki.test.raw"), *lnk = m2d_path_join(fx.dir, "held-out.raw");
    tu_write(ppl, "x\n", 2);
    assert_int_equal(symlink(ppl, lnk), 0);
    char *set_ppl = m2d_strfmt("ppl.data='%s'", ppl), *set_lnk = m2d_strfmt("distill.val_data='%s'", lnk);
    char *want_valid = m2d_path_join(fx.dir, "wiki.valid.raw");
    m2d_experiment x;
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", NULL, 0, &x), 0);
    assert_null(x.distill_val_data); /* ppl.txt: no curve, nothing to validate on */
    m2d_experiment_free(&x);
    char *curve[] = {"distill.eval_every=2"};
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", curve, 1, &x), -1);
    assert_non_null(strstr(m2d_errmsg(), "missing 'distill.val_data' (ppl.data 'ppl.txt'"));
    m2d_experiment_free(&x);
    char *dflt[] = {"distill.eval_every=2", set_ppl};
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", dflt, 2, &x), 0);
    assert_string_equal(x.distill_val_data, want_valid);
    m2d_experiment_free(&x);
    char *same[] = {"distill.val_data='ppl.txt'"}, *linked[] = {set_ppl, set_lnk};
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", same, 1, &x), -1);
    assert_non_null(strstr(m2d_errmsg(), "'distill.val_data': 'ppl.txt' is ppl.data, the split the tables report"));
    m2d_experiment_free(&x);
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", linked, 2, &x), -1);
    assert_non_null(strstr(m2d_errmsg(), "is ppl.data, the split the tables report"));
    m2d_experiment_free(&x);
    /* recorded in the sidecar's settings */
    char *rec[] = {"distill.eval_every=2", "distill.val_data='valid.txt'"};
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", rec, 2, &x), 0);
    m2d_sweep_opts o = {.out = fx.csv, .jobs = 1};
    m2d_sweep_summary s;
    assert_int_equal(m2d_sweep_run(&x, &o, &s), 0);
    char *sp = m2d_strfmt("%s.distill.csv", fx.csv);
    m2d_results side;
    assert_int_equal(m2d_results_read(sp, &side), 0);
    assert_non_null(strstr(m2d_results_meta(&side, "distill"), " val_data=valid.txt "));
    m2d_results_free(&side);
    m2d_experiment_free(&x);
    free(sp), free(ppl), free(lnk), free(set_ppl), free(set_lnk), free(want_valid);
    tu_sweep_fixture_free(&fx);
}

/* The dry run says what the stage will do. */
static void dry_run_describes_the_stage(void **state) {
    (void)state;
    tu_sweep_fixture fx = make_fixture();
    char *out = NULL, *err = NULL;
    char *c = m2d_strfmt("%s sweep %s --experiment grid --dry-run --out %s", tu_test_bin(), fx.toml, fx.csv);
    assert_int_equal(tu_run(c, &out, &err), 0);
    char *want = m2d_strfmt("distillation: best-per-pair configurations, tokens 1000, L = 8, B = 2, "
                            "loss fkl, into %s.distill/", fx.csv);
    if (!strstr(out, want)) fail_msg("dry run: %s", out);
    free(want), free(c), free(out), free(err);
    tu_sweep_fixture_free(&fx);
}

/* Issue 24 (Tables 4, 5): distill.loss and distill.teacher_topk as lists are axes of the stage:
 * the selected student is distilled once per (loss, K'), one sidecar row each (K' 0 recorded as
 * the teacher's k); the main CSV gets the first combination; a resume distills nothing again and a
 * grown list only the new combinations; the report's Tables 4 and 5 lay the rows out. */
static void ablation_rows_and_tables(void **state) {
    (void)state;
    tu_sweep_fixture fx = make_fixture();
    m2d_experiment x;
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", NULL, 0, &x), 0);
    char *id = m2d_strdup(x.configs[0].id); /* sf/rr/uniform/k, params '' */
    m2d_experiment_free(&x);
    char *list = m2d_strfmt("distill.configs=['%s']", id);
    char *sets[] = {list, "distill.loss=['fkl', 'rkl', 'fkl+mse']", "distill.teacher_topk=[0, 16, 64]",
                    "mc={tasks = ['arc_easy'], configs = 'best-per-pair'}", "distill.teacher_topk=[0, 16, 64, 4]"};
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", sets, 4, &x), 0);
    assert_true(x.distill_ablation);
    m2d_sweep_opts o = {.out = fx.csv, .jobs = 1};
    m2d_sweep_summary s;
    if (m2d_sweep_run(&x, &o, &s)) fail_msg("%s", m2d_errmsg());
    assert_int_equal(s.distill_evaluated, 9);
    m2d_results r, side;
    char *sp = m2d_strfmt("%s.distill.csv", fx.csv);
    assert_int_equal(m2d_results_read(fx.csv, &r), 0);
    assert_int_equal(m2d_results_read(sp, &side), 0);
    assert_int_equal(side.n_rows, 9);
    double ppl = num(&r, 0, "ppl");
    assert_string_equal(m2d_results_get(&r, 0, "config_id"), id);
    assert_true(fabs(num(&r, 0, "distill_ppl") - ppl / 2) < 1e-3); /* the first: fkl at the own routing */
    static const char *const losses[] = {"fkl", "rkl", "fkl+mse"}; /* the fake divides by 2 + L + K'/100 */
    static const char *const topks[] = {"8", "16", "64"};
    for (int l = 0; l < 3; l++)
        for (int k = 0; k < 3; k++) {
            int n = 0;
            for (int j = 0; j < side.n_rows; j++) {
                if (strcmp(m2d_results_get(&side, j, "loss"), losses[l]) ||
                    strcmp(m2d_results_get(&side, j, "teacher_topk"), topks[k]))
                    continue;
                n++;
                double want = ppl / (2 + l + (k ? atoi(topks[k]) : 0) / 100.0);
                assert_string_equal(m2d_results_get(&side, j, "config_id"), id);
                assert_string_equal(m2d_results_get(&side, j, "status"), "ok");
                assert_true(fabs(num(&side, j, "distill_ppl") - want) < 1e-3);
            }
            assert_int_equal(n, 1);
        }
    char *text = m2d_read_file(sp, NULL);
    assert_non_null(strstr(text, "loss=per-row mse_weight=")); /* per row: the lists may grow */
    assert_non_null(strstr(text, "teacher_topk=per-row"));
    free(text);
    m2d_results_free(&side);
    assert_int_equal(m2d_sweep_run(&x, &o, &s), 0);
    assert_int_equal(s.distill_evaluated, 0);
    m2d_experiment_free(&x);
    sets[2] = sets[4]; /* K' = 4 added: three more */
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", sets, 4, &x), 0);
    assert_int_equal(m2d_sweep_run(&x, &o, &s), 0);
    assert_int_equal(s.distill_evaluated, 3);
    m2d_experiment_free(&x);
    /* Table 4 (csv): K' ascending at fkl, deltas against k' = 8 */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_int_equal(m2d_report_ablation_write(fx.csv, &r, 4, M2D_REPORT_CSV, f), 0);
    fclose(f);
    char ppl16[32], d16[32], row[256];
    m2d_report_format_ppl(ppl / 2.16, ppl16, sizeof ppl16);
    snprintf(d16, sizeof d16, "%+.2f", ppl / 2.16 - ppl / 2);
    assert_non_null(strstr(buf, "config_id,k',PPL,ARC-E,Avg (%),Δ PPL,Δ Avg (pp)\n"));
    char *p4 = strstr(buf, ",4,"), *p8 = strstr(buf, ",8 (default),"), *p16 = strstr(buf, ",16,"),
         *p64 = strstr(buf, ",64 (all),");
    assert_true(p4 && p8 && p16 && p64 && p4 < p8 && p8 < p16 && p16 < p64);
    snprintf(row, sizeof row, "%s,16,%s,", id, ppl16);
    assert_non_null(strstr(buf, row));
    assert_non_null(strstr(strchr(p16, '\n') - 30, d16));
    free(buf), buf = NULL;
    /* Table 5 (md): the losses in the paper's order at k' = 8, deltas against forward KL */
    f = open_memstream(&buf, &len);
    assert_int_equal(m2d_report_ablation_write(fx.csv, &r, 5, M2D_REPORT_MD, f), 0);
    fclose(f);
    char *fw = strstr(buf, "| Forward KL |"), *im = strstr(buf, "| Intermediate (logit + hidden MSE) |"),
         *rv = strstr(buf, "| Reverse KL |");
    assert_true(fw && im && rv && fw < im && im < rv);
    char d_rkl[32];
    snprintf(d_rkl, sizeof d_rkl, "| %+.2f |", ppl / 3 - ppl / 2);
    assert_non_null(strstr(rv, d_rkl));
    assert_non_null(strstr(buf, "Student: Selection Frequency"));
    free(buf), buf = NULL;
    /* tex: booktabs, the Delta as math (no unicode input needed) */
    f = open_memstream(&buf, &len);
    assert_int_equal(m2d_report_ablation_write(fx.csv, &r, 5, M2D_REPORT_TEX, f), 0);
    fclose(f);
    assert_non_null(strstr(buf, "$\\Delta$ PPL"));
    assert_null(strstr(buf, "\xce\x94"));
    assert_non_null(strstr(buf, "\\toprule"));
    free(buf);
    m2d_results_free(&r);
    free(sp), free(list), free(id);
    tu_sweep_fixture_free(&fx);
}

/* Issue 24: the lists are checked before any work -- K' above the experts (dry run and run, the
 * element named), an unknown loss, a repeated value, an empty list (the load) -- and a sidecar
 * without the ablation's columns has no Table 4. */
static void ablation_lists_checked(void **state) {
    (void)state;
    tu_sweep_fixture fx = make_fixture();
    m2d_experiment x;
    char *big[] = {"distill.teacher_topk=[8, 65]"};
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", big, 1, &x), 0);
    m2d_sweep_opts o = {.out = fx.csv, .jobs = 1};
    m2d_sweep_summary s;
    FILE *devnull = fopen("/dev/null", "w");
    assert_int_equal(m2d_sweep_dry_run(&x, &o, devnull), -1);
    fclose(devnull);
    assert_non_null(strstr(m2d_errmsg(), "distill.teacher_topk 65 exceeds the teacher's num_experts 64"));
    assert_int_equal(m2d_sweep_run(&x, &o, &s), -1);
    assert_non_null(strstr(m2d_errmsg(), "distill.teacher_topk 65 exceeds the teacher's num_experts 64"));
    assert_false(m2d_file_exists(fx.csv));
    m2d_experiment_free(&x);
    struct { const char *set, *want; } cases[] = {
        {"distill.loss=['fkl', 'xkl']", "'distill.loss' must be \"fkl\", \"rkl\" or \"fkl+mse\""},
        {"distill.loss=['fkl', 'fkl']", "'distill.loss' must be a list of distinct values"},
        {"distill.teacher_topk=[8, 8]", "'distill.teacher_topk' must be a list of distinct values"},
        {"distill.teacher_topk=[]", "'distill.teacher_topk' must be a value or a non-empty list"},
        {"distill.teacher_topk=[-1]", "'distill.teacher_topk' must be an integer in [0, 1048576]"},
    };
    for (size_t i = 0; i < M2D_ARRAY_LEN(cases); i++) {
        char *sets[] = {(char *)cases[i].set};
        assert_int_equal(m2d_experiment_load(fx.toml, "grid", sets, 1, &x), -1);
        if (!strstr(m2d_errmsg(), cases[i].want)) fail_msg("%s: got '%s'", cases[i].set, m2d_errmsg());
        m2d_experiment_free(&x);
    }
    char *sets[] = {"distill.configs=all"}; /* scalars: the sidecar as before, no ablation columns */
    assert_int_equal(m2d_experiment_load(fx.toml, "grid", sets, 1, &x), 0);
    assert_int_equal(m2d_sweep_run(&x, &o, &s), 0);
    m2d_experiment_free(&x);
    m2d_results r;
    assert_int_equal(m2d_results_read(fx.csv, &r), 0);
    FILE *f = fopen("/dev/null", "w");
    assert_int_equal(m2d_report_ablation_write(fx.csv, &r, 4, M2D_REPORT_MD, f), -1);
    fclose(f);
    assert_non_null(strstr(m2d_errmsg(), "results.csv.distill.csv: field 'loss': column missing"));
    m2d_results_free(&r);
    tu_sweep_fixture_free(&fx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(best_per_pair_distills_scores_and_resumes),
        cmocka_unit_test(all_and_list_with_failures),
        cmocka_unit_test(best_per_scoring_K_distills_the_selection),
        cmocka_unit_test(students_folder_link_refused),
        cmocka_unit_test(precision_flows_into_the_stage),
        cmocka_unit_test(distill_table_errors),
        cmocka_unit_test(validation_data_is_held_out),
        cmocka_unit_test(dry_run_describes_the_stage),
        cmocka_unit_test(deepseek_student_passes_dry_run),
        cmocka_unit_test(distill_checked_before_work),
        cmocka_unit_test(failed_sidecar_does_not_block_a_rerun),
        cmocka_unit_test(ablation_rows_and_tables),
        cmocka_unit_test(ablation_lists_checked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
