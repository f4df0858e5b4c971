/* sweep_pipeline: the real backend on ../shared/models/tiny-qwen3moe.
 *  - PPL on once-encoded tokens (m2d_ppl_gptq_tokens, what the pipeline scores with) equals
 *    m2d_ppl_gptq (the library path that encodes per call);
 *  - a small sweep: calibration cached and reused, K = k rows across groupings recorded as
 *    dedup_of (decided by the plan fingerprint), and one configuration's PPL equals an
 *    independent path: `moe2dense calibrate` + `convert --out DIR` + `ppl --model DIR`;
 *  - the distillation stage: its distilled checkpoint is bit for bit the one `moe2dense distill`
 *    makes from the converted student with the same settings, and its distill_ppl / MC columns
 *    are what `ppl` / `eval` measure on that checkpoint. */
#include "testutil.h"
#include "tiny_teacher.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "sweep/grid.h"
#include "evals/ppl.h"
#include "model/model.h"
#include "io/results.h"
#include "sweep/sweep.h"
#include "tokenizer/tokenizer.h"
#include "base/util.h"

static const char *wiki_test(void) { return tu_data_path("wikitext-2-raw/wikitext-2-raw/wiki.test.raw"); }
static const char *wiki_train(void) { return tu_data_path("train-text/wikitext-103-train-prefix/wiki.train.tokens"); }

/* A temporary directory with an experiment "t" on the tiny teacher: calibration on 4 windows of
 * 64 tokens of the WikiText-103 prefix (cached in DIR/cache), PPL on MAX_WINDOWS WikiText-2
 * windows of 64, then the keys in EXTRA (mc, axes, rules). */
typedef struct {
    char *model, *dir, *toml, *csv;
} sweep_fx;

/* 0 and *fx; -1 when the model or the data is missing (the caller skips) */
static int sweep_fx_make(int max_windows, const char *extra, sweep_fx *fx) {
    fx->model = tu_model_path("tiny-qwen3moe");
    if (!fx->model || !m2d_file_exists(wiki_test()) || !m2d_file_exists(wiki_train())) {
        free(fx->model);
        return -1;
    }
    fx->dir = tu_tmpdir();
    fx->toml = m2d_path_join(fx->dir, "e.toml");
    fx->csv = m2d_path_join(fx->dir, "r.csv");
    char *text = m2d_strfmt("[experiment.t]\nmodel = '%s'\ncache_dir = '%s/cache'\n"
                            "calibration = { data = '%s', seq_len = 64, samples = 4 }\n"
                            "ppl = { data = '%s', seq_len = 64, max_windows = %d }\n%s",
                            fx->model, fx->dir, wiki_train(), wiki_test(), max_windows, extra);
    tu_write(fx->toml, text, strlen(text));
    free(text);
    return 0;
}

static void sweep_fx_free(sweep_fx *fx) {
    tu_rm_rf(fx->dir);
    free(fx->model);
    free(fx->dir);
    free(fx->toml);
    free(fx->csv);
}

/* `moe2dense calibrate` + `convert` of do-acp / oc / proportional / K = 16 into DIR/student, then
 * COMMAND (run in the shell after them); its stdout in *out */
static void convert_then(const sweep_fx *fx, const char *command, char **out) {
    char *c = m2d_strfmt("%s calibrate --model %s --data %s --out %s/s.stats --seq-len 64 --samples 4 && "
                         "%s convert --model %s --stats %s/s.stats --scoring do-acp --grouping oc "
                         "--scaling proportional -K 16 --out %s/student && %s",
                         tu_bin(), fx->model, wiki_train(), fx->dir, tu_bin(), fx->model, fx->dir, fx->dir, command);
    char *err = NULL;
    int rc = tu_run(c, out, &err);
    if (rc) print_message("%s\n%s\n", *out ? *out : "", err ? err : "");
    assert_int_equal(rc, 0);
    free(err);
    free(c);
}

/* The header's teacher shape and teacher_ppl (the report's teacher row) are the teacher's own
 * perplexity on the students' windows: what `moe2dense ppl` measures on the teacher (issue 30). */
static void teacher_ppl_in_header(const sweep_fx *fx, const m2d_results *r) {
    assert_string_equal(m2d_results_meta(r, "teacher"), "E=64 k=8");
    const char *tp = m2d_results_meta(r, "teacher_ppl");
    assert_non_null(tp);
    assert_non_null(strstr(tp, " windows=2"));
    char *c = m2d_strfmt("%s ppl --model %s --data %s --seq-len 64 --max-windows 2 --json", tu_bin(), fx->model,
                         wiki_test());
    char *out = NULL, *err = NULL;
    assert_int_equal(tu_run(c, &out, &err), 0);
    const char *p = strstr(out, "\"ppl\":");
    assert_non_null(p);
    double want = strtod(p + 6, NULL), got = strtod(tp, NULL);
    if (fabs(got - want) > 1e-6 * want) fail_msg("teacher_ppl %.6f vs ppl --model teacher %.6f", got, want);
    free(c), free(out), free(err);
}

static void ppl_on_tokens_matches_library_gptq(void **state) {
    (void)state;
    if (!m2d_file_exists(wiki_test())) TU_SKIP("run 'make data' (WikiText-2 missing)");
    tu_tiny_teacher t;
    if (tu_tiny_teacher_open(1, &t)) TU_SKIP("../shared/models/tiny-qwen3moe not found");
    m2d_tokenizer *tk = t.tk;
    m2d_engine *e = t.e;
    size_t len;
    char *raw = m2d_read_file(wiki_test(), &len);
    /* only the first part of the file: enough for 3 windows of 64, keeps the test fast */
    size_t cut = 20000;
    while (cut < len && raw[cut] != '\n') cut++;
    m2d_ppl_result ref;
    assert_int_equal(m2d_ppl_gptq(e, tk, raw, cut + 1, 64, 3, &ref), 0);
    size_t jl, n;
    char *joined = m2d_ppl_gptq_text(raw, cut + 1, &jl);
    int32_t *ids;
    assert_int_equal(m2d_tokenizer_encode(tk, joined, jl, &ids, &n), 0);
    m2d_ppl_result tok;
    assert_int_equal(m2d_ppl_gptq_tokens(e, ids, n, 64, 3, NULL, &tok), 0);
    double ppl = tok.ppl;
    assert_int_equal(tok.windows, ref.windows);
    /* the same engine calls on the same tokens in the same order: identical sums */
    assert_true(ppl == ref.ppl);
    assert_true(isfinite(ppl) && ppl > 1);
    free(ids);
    free(joined);
    free(raw);
    tu_tiny_teacher_close(&t);
}

static void small_sweep_dedups_caches_and_matches_convert_then_ppl(void **state) {
    (void)state;
    sweep_fx fx;
    if (sweep_fx_make(2,
                      "[experiment.t.axes]\nscoring = ['sf', 'do-acp']\n"
                      "grouping = ['rr', 'oc']\nscaling = ['proportional']\nK = ['k', '2k']\n",
                      &fx))
        TU_SKIP("../shared/models/tiny-qwen3moe or the data not found (run 'make data')");
    m2d_experiment x;
    m2d_sweep_opts o = {.out = fx.csv, .jobs = 2};
    m2d_sweep_summary s;
    /* an unknown scoring is refused before any work: no calibration, no CSV */
    char *unknown[] = {"axes.scoring=['sf', 'do-acp', 'nonexistent']"};
    assert_int_equal(m2d_experiment_load(fx.toml, "t", unknown, 1, &x), 0);
    assert_int_equal(m2d_sweep_run(&x, &o, &s), -1);
    assert_non_null(strstr(m2d_errmsg(), "--set: experiment 't': axes.scoring: unknown scoring plugin 'nonexistent'"));
    assert_false(m2d_file_exists(fx.csv));
    char *cache = m2d_path_join(fx.dir, "cache");
    assert_false(m2d_file_exists(cache));
    free(cache);
    m2d_experiment_free(&x);
    assert_int_equal(m2d_experiment_load(fx.toml, "t", NULL, 0, &x), 0);
    assert_int_equal(x.n_configs, 2 * 2 * 2);
    assert_int_equal(m2d_sweep_run(&x, &o, &s), 0);
    /* K = k: rr and oc give one student per scoring (fingerprint) */
    assert_int_equal(s.dedup, 2);
    assert_int_equal(s.evaluated, 6);
    assert_int_equal(s.failed, 0);
    m2d_results r;
    assert_int_equal(m2d_results_read(fx.csv, &r), 0);
    assert_int_equal(r.n_rows, x.n_configs);
    int checked = 0;
    for (int i = 0; i < r.n_rows; i++) {
        assert_string_equal(m2d_results_get(&r, i, "status"), "ok");
        assert_string_equal(m2d_results_get(&r, i, "d_dense"), "576"); /* k * d_e = 8 * 72 */
        assert_string_equal(m2d_results_get(&r, i, "ppl_windows"), "2");
        if (m2d_results_get(&r, i, "dedup_of")[0]) assert_string_equal(m2d_results_get(&r, i, "K"), "8");
        /* one configuration through the independent command-line path */
        if (!checked && !strcmp(m2d_results_get(&r, i, "scoring"), "do-acp") &&
            !strcmp(m2d_results_get(&r, i, "K"), "16") && !strcmp(m2d_results_get(&r, i, "grouping"), "oc")) {
            checked = 1;
            char *ppl = m2d_strfmt("%s ppl --model %s/student --data %s --seq-len 64 --max-windows 2 --json", tu_bin(),
                                   fx.dir, wiki_test());
            char *out = NULL;
            convert_then(&fx, ppl, &out);
            const char *p = strstr(out, "\"ppl\":");
            assert_non_null(p);
            double want = strtod(p + 6, NULL), got = strtod(m2d_results_get(&r, i, "ppl"), NULL);
            /* the CSV holds 4 decimals; the student written to disk is the in-memory one */
            if (fabs(got - want) > 6e-5 * M2D_MAX(1.0, want / 100)) fail_msg("sweep ppl %.6f vs convert+ppl %.6f", got, want);
            free(ppl);
            free(out);
        }
    }
    assert_true(checked);
    teacher_ppl_in_header(&fx, &r);
    m2d_results_free(&r);
    /* the calibration cache is reused: a second run on a fresh CSV does not recalibrate */
    char *csv2 = m2d_path_join(fx.dir, "r2.csv");
    char *c = m2d_strfmt("%s sweep %s --experiment t --out %s", tu_bin(), fx.toml, csv2);
    char *out = NULL, *err = NULL;
    assert_int_equal(tu_run(c, &out, &err), 0);
    assert_null(strstr(err, "calibrated"));
    free(c);
    free(out);
    free(err);
    /* and the dry run now knows the exact number of distinct students */
    c = m2d_strfmt("%s sweep %s --experiment t --dry-run --out %s", tu_bin(), fx.toml, csv2);
    assert_int_equal(tu_run(c, &out, &err), 0);
    assert_non_null(strstr(out, "distinct students: 6 (from their fingerprints)"));
    free(c);
    free(out);
    free(err);
    free(csv2);
    m2d_experiment_free(&x);
    sweep_fx_free(&fx);
}

/* The paper's baselines as configurations (a baseline in the scoring axis): one student per
 * baseline whatever the grouping (the weights depend on kind, seed and width only: fingerprint
 * dedup), its PPL equals `convert --baseline` + `ppl`, and a random-init student is near-uniform
 * over the 8,192-token vocabulary (PPL within a factor 2 of V; the teacher's is ~100). */
static void baselines_in_the_scoring_axis(void **state) {
    (void)state;
    sweep_fx fx;
    if (sweep_fx_make(2,
                      "[experiment.t.axes]\nscoring = ['random-ffn', 'random-init']\n"
                      "grouping = ['rr', 'oc']\nscaling = ['proportional']\nK = ['k']\n",
                      &fx))
        TU_SKIP("../shared/models/tiny-qwen3moe or the data not found (run 'make data')");
    m2d_experiment x;
    m2d_sweep_opts o = {.out = fx.csv, .jobs = 1};
    m2d_sweep_summary s;
    assert_int_equal(m2d_experiment_load(fx.toml, "t", NULL, 0, &x), 0);
    assert_int_equal(m2d_sweep_run(&x, &o, &s), 0);
    assert_int_equal(s.dedup, 2);
    assert_int_equal(s.failed, 0);
    m2d_results r;
    assert_int_equal(m2d_results_read(fx.csv, &r), 0);
    assert_int_equal(r.n_rows, 4);
    char *cmd = m2d_strfmt("%s calibrate --model %s --data %s --out %s/s.stats --seq-len 64 --samples 4 && "
                           "%s convert --model %s --stats %s/s.stats --baseline random-ffn --out %s/ffn && "
                           "%s ppl --model %s/ffn --data %s --seq-len 64 --max-windows 2 --json",
                           tu_bin(), fx.model, wiki_train(), fx.dir, tu_bin(), fx.model, fx.dir, fx.dir, tu_bin(),
                           fx.dir, wiki_test());
    char *out = NULL, *err = NULL;
    int rc = tu_run(cmd, &out, &err);
    if (rc) print_message("%s\n%s\n", out ? out : "", err ? err : "");
    assert_int_equal(rc, 0);
    const char *p = strstr(out, "\"ppl\":");
    assert_non_null(p);
    double want = strtod(p + 6, NULL);
    for (int i = 0; i < r.n_rows; i++) {
        assert_string_equal(m2d_results_get(&r, i, "status"), "ok");
        assert_string_equal(m2d_results_get(&r, i, "d_dense"), "576");
        double got = strtod(m2d_results_get(&r, i, "ppl"), NULL);
        if (!strcmp(m2d_results_get(&r, i, "scoring"), "random-ffn")) {
            if (fabs(got - want) > 6e-5 * M2D_MAX(1.0, want / 100)) fail_msg("sweep ppl %.6f vs convert+ppl %.6f", got, want);
        } else {
            assert_true(got > 8192 / 2.0 && got < 8192 * 2.0);
        }
    }
    free(cmd), free(out), free(err);
    m2d_results_free(&r);
    m2d_experiment_free(&x);
    sweep_fx_free(&fx);
}

/* MoE targets in the sweep (paper 003's comparison): REAP pruning and ConMoE remap at 50 % of the
 * experts removed; the pruned student's PPL equals `convert --target moe --ratio 0.5` + `ppl`, and
 * the remap student (64 slots, 32 distinct experts) counts its experts once. */
static void moe_target_rows_match_convert_then_ppl(void **state) {
    (void)state;
    sweep_fx fx;
    if (sweep_fx_make(2,
                      "[experiment.t.axes]\nscoring = ['reap']\ngrouping = ['none', 'remap']\n"
                      "target = ['moe']\nratio = [0.5, 0]\ntop_k = [8, 4]\n"
                      "[[experiment.t.include]]\nratio = 0.5\ntop_k = 8\n"
                      "[[experiment.t.include]]\ngrouping = 'none'\nratio = 0\ntop_k = 4\n",
                      &fx))
        TU_SKIP("../shared/models/tiny-qwen3moe or the data not found (run 'make data')");
    m2d_experiment x;
    assert_int_equal(m2d_experiment_load(fx.toml, "t", NULL, 0, &x), 0);
    assert_int_equal(x.n_configs, 3);
    m2d_sweep_opts o = {.out = fx.csv, .jobs = 1};
    m2d_sweep_summary sum;
    assert_int_equal(m2d_sweep_run(&x, &o, &sum), 0);
    m2d_results r;
    if (m2d_results_read_checked(fx.csv, &r)) fail_msg("%s", m2d_errmsg()); /* what report and resume read */
    assert_int_equal(r.n_rows, 3);
    /* the calibration actually used: all 4 windows of 64 asked for */
    assert_string_equal(m2d_results_meta(&r, "calibration"), "fixed windows=4 requested=4 seq_len=64 tokens=256");
    const char *n_params[2] = {0};
    double pruned_ppl = NAN, topk4_ppl = NAN;
    for (int i = 0; i < 3; i++) {
        assert_string_equal(m2d_results_get(&r, i, "status"), "ok");
        assert_string_equal(m2d_results_get(&r, i, "target"), "moe");
        if (!strcmp(m2d_results_get(&r, i, "ratio"), "0")) { /* the teacher with 4 experts per token */
            assert_string_equal(m2d_results_get(&r, i, "top_k"), "4");
            assert_string_equal(m2d_results_get(&r, i, "K"), "64");
            topk4_ppl = strtod(m2d_results_get(&r, i, "ppl"), NULL);
            continue;
        }
        assert_string_equal(m2d_results_get(&r, i, "top_k"), "8");
        assert_string_equal(m2d_results_get(&r, i, "ratio"), "0.5");
        assert_string_equal(m2d_results_get(&r, i, "K"), "32");
        assert_string_equal(m2d_results_get(&r, i, "d_dense"), "");
        int none = !strcmp(m2d_results_get(&r, i, "grouping"), "none");
        n_params[!none] = m2d_results_get(&r, i, "n_params");
        if (none) pruned_ppl = strtod(m2d_results_get(&r, i, "ppl"), NULL);
    }
    /* the same 32 distinct experts per layer; remap keeps all 64 router rows of d weights */
    m2d_config cfg;
    const m2d_arch *arch;
    assert_int_equal(m2d_config_load(fx.model, &cfg, &arch), 0);
    int64_t moe_layers = 0;
    for (int l = 0; l < cfg.num_hidden_layers; l++) moe_layers += cfg.layer_is_moe[l];
    assert_true(strtoll(n_params[1], NULL, 10) - strtoll(n_params[0], NULL, 10) == moe_layers * 32 * cfg.hidden_size);
    m2d_config_free(&cfg);
    char *c = m2d_strfmt("%s calibrate --model %s --data %s --out %s/s.stats --seq-len 64 --samples 4 && "
                         "%s convert --model %s --stats %s/s.stats --target moe --scoring reap --grouping none "
                         "--ratio 0.5 --out %s/pruned && %s ppl --model %s/pruned --data %s --seq-len 64 "
                         "--max-windows 2 --json",
                         tu_bin(), fx.model, wiki_train(), fx.dir, tu_bin(), fx.model, fx.dir, fx.dir, tu_bin(),
                         fx.dir, wiki_test());
    char *out = NULL, *err = NULL;
    if (tu_run(c, &out, &err)) fail_msg("%s\n%s", out ? out : "", err ? err : "");
    const char *p = strstr(out, "\"ppl\":");
    assert_non_null(p);
    double want = strtod(p + 6, NULL); /* the CSV holds 4 decimals */
    if (fabs(pruned_ppl - want) > 6e-5 * M2D_MAX(1.0, want / 100)) fail_msg("sweep ppl %.6f vs convert+ppl %.6f", pruned_ppl, want);
    free(c), free(out), free(err);
    c = m2d_strfmt("%s convert --model %s --stats %s/s.stats --target moe --scoring reap --grouping none -K 64 "
                   "--top-k 4 --out %s/top4 && %s ppl --model %s/top4 --data %s --seq-len 64 --max-windows 2 --json",
                   tu_bin(), fx.model, fx.dir, fx.dir, tu_bin(), fx.dir, wiki_test());
    if (tu_run(c, &out, &err)) fail_msg("%s\n%s", out ? out : "", err ? err : "");
    p = strstr(out, "\"ppl\":");
    assert_non_null(p);
    want = strtod(p + 6, NULL);
    if (fabs(topk4_ppl - want) > 6e-5 * M2D_MAX(1.0, want / 100)) fail_msg("top-4 sweep ppl %.6f vs %.6f", topk4_ppl, want);
    assert_true(fabs(topk4_ppl - pruned_ppl) > 1e-3); /* a different student */
    free(c), free(out), free(err);
    m2d_results_free(&r);
    m2d_experiment_free(&x);
    sweep_fx_free(&fx);
}

/* Calibration data holding fewer windows than calibration.samples asks for: the sweep calibrates
 * on what there is, says so on stderr with the numbers, and records the windows actually used in
 * the CSV header (calibration=: windows, requested, seq_len, tokens, the note); report shows it. */
static void calibration_header_records_windows_used(void **state) {
    (void)state;
    sweep_fx fx;
    if (sweep_fx_make(1, "[experiment.t.axes]\nscoring = ['sf']\ngrouping = ['rr']\nscaling = ['uniform']\nK = ['k']\n",
                      &fx))
        TU_SKIP("../shared/models/tiny-qwen3moe or the data not found (run 'make data')");
    /* the first 2,000 bytes of the WikiText-103 prefix: a few hundred tokens, fewer than 16 x 64 */
    size_t len;
    char *text = m2d_read_file(wiki_train(), &len), *small = m2d_path_join(fx.dir, "small.txt");
    assert_true(len > 2000);
    tu_write(small, text, 2000);
    free(text);
    char *c = m2d_strfmt("%s sweep %s --experiment t --set \"calibration.data='%s'\" --set calibration.samples=16 "
                         "--out %s", tu_bin(), fx.toml, small, fx.csv);
    char *out = NULL, *err = NULL;
    if (tu_run(c, &out, &err)) fail_msg("%s", err);
    /* a fresh calibration warns itself */
    assert_non_null(strstr(err, "WARNING: calibration: "));
    assert_non_null(strstr(err, "16 were asked for"));
    free(c), free(out);
    m2d_results r;
    if (m2d_results_read_checked(fx.csv, &r)) fail_msg("%s", m2d_errmsg());
    const char *cal = m2d_results_meta(&r, "calibration");
    assert_non_null(cal);
    int windows = -1, requested = -1, seq_len = -1;
    double tokens = -1;
    assert_int_equal(sscanf(cal, "fixed windows=%d requested=%d seq_len=%d tokens=%lf", &windows, &requested, &seq_len,
                            &tokens), 4);
    assert_true(windows >= 1 && windows < 16);
    assert_int_equal(requested, 16);
    assert_int_equal(seq_len, 64);
    assert_true(tokens == 64.0 * windows);
    assert_non_null(strstr(cal, " (fewer windows than requested: the data holds no more)"));
    char *said = m2d_strfmt("holds only %d windows of up to 64 tokens; 16 were asked for, %d are used", windows, windows);
    if (!strstr(err, said)) fail_msg("'%s' not in: %s", said, err);
    free(said), free(err);
    /* a second sweep reads the cached statistics: the sweep warns, with the same numbers */
    char *csv2 = m2d_path_join(fx.dir, "r2.csv");
    c = m2d_strfmt("%s sweep %s --experiment t --set \"calibration.data='%s'\" --set calibration.samples=16 --out %s",
                   tu_bin(), fx.toml, small, csv2);
    if (tu_run(c, &out, &err)) fail_msg("%s", err);
    assert_null(strstr(err, "calibrated"));
    said = m2d_strfmt("warning: %s: calibration.samples = 16 but %s holds only %d window(s) of 64 tokens (%d tokens): "
                      "the cached statistics of those are used", fx.toml, small, windows, 64 * windows);
    if (!strstr(err, said)) fail_msg("'%s' not in: %s", said, err);
    free(said), free(c), free(out), free(err), free(csv2);
    /* report shows it above the tables (md; tex as a comment) */
    char *line = m2d_strfmt("Calibration (windows actually used): %s\n\n## Perplexity by configuration", cal);
    c = m2d_strfmt("%s report %s", tu_bin(), fx.csv);
    assert_int_equal(tu_run(c, &out, &err), 0);
    if (strncmp(out, line, strlen(line))) fail_msg("report begins:\n%.300s", out);
    free(c), free(out), free(err), free(line);
    line = m2d_strfmt("%% Calibration (windows actually used): %s\n", cal);
    c = m2d_strfmt("%s report %s --format tex", tu_bin(), fx.csv);
    assert_int_equal(tu_run(c, &out, &err), 0);
    assert_non_null(strstr(out, line));
    free(c), free(out), free(err), free(line);
    m2d_results_free(&r);
    free(small);
    sweep_fx_free(&fx);
}

/* --attention bf16 reaches the evaluation: the header records it beside the GEMM precision, the
 * teacher's perplexity there is `ppl --attention bf16`'s (same engine calls; 1e-6 as
 * teacher_ppl_in_header) and not the fp32 attention's, and a resume with another attention is
 * refused (rows of both would mix). */
static void attention_bf16_reaches_the_evaluation(void **state) {
    (void)state;
    sweep_fx fx;
    if (sweep_fx_make(2, "[experiment.t.axes]\nscoring = ['sf']\ngrouping = ['rr']\nscaling = ['uniform']\nK = ['k']\n",
                      &fx))
        TU_SKIP("../shared/models/tiny-qwen3moe or the data not found (run 'make data')");
    char *c = m2d_strfmt("%s sweep %s --experiment t --attention bf16 --out %s", tu_bin(), fx.toml, fx.csv);
    char *out = NULL, *err = NULL;
    if (tu_run(c, &out, &err)) fail_msg("%s", err);
    free(c), free(out), free(err);
    m2d_results r;
    if (m2d_results_read_checked(fx.csv, &r)) fail_msg("%s", m2d_errmsg());
    assert_string_equal(m2d_results_meta(&r, "precision"), "fp32 attention=bf16");
    double got = strtod(m2d_results_meta(&r, "teacher_ppl"), NULL), want[2];
    for (int bf16 = 0; bf16 < 2; bf16++) {
        c = m2d_strfmt("%s ppl --model %s --data %s --seq-len 64 --max-windows 2 --json --attention %s", tu_bin(),
                       fx.model, wiki_test(), bf16 ? "bf16" : "fp32");
        assert_int_equal(tu_run(c, &out, &err), 0);
        want[bf16] = strtod(strstr(out, "\"ppl\":") + 6, NULL);
        free(c), free(out), free(err);
    }
    if (fabs(got - want[1]) > 1e-6 * want[1]) fail_msg("teacher_ppl %.6f vs ppl --attention bf16 %.6f", got, want[1]);
    assert_true(want[0] != want[1]);
    m2d_results_free(&r);
    c = m2d_strfmt("%s sweep %s --experiment t --out %s", tu_bin(), fx.toml, fx.csv);
    assert_int_not_equal(tu_run(c, &out, &err), 0);
    assert_non_null(strstr(err, "header 'precision' is 'fp32 attention=bf16' but this run has 'fp32': refusing to mix"));
    free(c), free(out), free(err);
    sweep_fx_free(&fx);
}

/* What the run would refuse, the dry run refuses first, in one line naming where the value is
 * (FILE:LINE:COL, or --set), with exit status 1; neither writes a CSV or calibrates. */
static void dry_run_refuses_what_the_run_refuses(void **state) {
    (void)state;
    sweep_fx fx;
    if (sweep_fx_make(2, "[experiment.t.axes]\nscoring = ['sf', 'nope']\ngrouping = ['rr']\n"
                         "scaling = ['uniform']\nK = ['k']\n", &fx))
        TU_SKIP("../shared/models/tiny-qwen3moe or the data not found (run 'make data')");
    const char *cases[][2] = {
        {"", "/e.toml:7:18: experiment 't': axes.scoring: unknown scoring plugin 'nope' (see 'moe2dense list')"},
        {"--set \"axes.scoring=['sf', 'nada']\"", "--set: experiment 't': axes.scoring: unknown scoring plugin 'nada'"},
        {"--set \"axes.scoring=['sf']\" --set calibration.seq_len=100000",
         "'calibration.seq_len' 100000 exceeds the teacher's max_position_embeddings 512"},
        {"--set \"axes.scoring=['sf']\" --set ppl.seq_len=513", "'ppl.seq_len' 513 exceeds the teacher's"},
        {"--set \"axes.scoring=['sf']\" --set \"axes.params=['bogus=1']\"", "params 'bogus=1'"},
        {"--set \"axes.scoring=['sf']\" --set calibration.data=/nonexistent/calib.txt",
         "'calibration.data': /nonexistent/calib.txt: cannot read"},
        {"--set \"axes.scoring=['sf']\" --set \"mc.tasks=['nope']\"", "mc.tasks: unknown task 'nope'"},
    };
    for (size_t i = 0; i < M2D_ARRAY_LEN(cases); i++)
        for (int dry = 1; dry >= 0; dry--) {
            char *c = m2d_strfmt("%s sweep %s --experiment t --out %s %s %s", tu_bin(), fx.toml, fx.csv,
                                 dry ? "--dry-run" : "", cases[i][0]);
            char *out = NULL, *err = NULL;
            int rc = tu_run(c, &out, &err);
            if (rc != 1 || !strstr(err, cases[i][1]) || strchr(err, '\n') != err + strlen(err) - 1)
                fail_msg("%s\nexit %d\nstderr: %s\nwant: %s", c, rc, err, cases[i][1]);
            assert_false(m2d_file_exists(fx.csv));
            char *cache = m2d_path_join(fx.dir, "cache");
            assert_false(m2d_file_exists(cache));
            free(cache);
            free(c);
            free(out);
            free(err);
        }
    sweep_fx_free(&fx);
}

/* Names in DIR holding ".m2d-tmp." or ".tmp." (what a killed writer would leave), for messages. */
static int count_leftovers(const char *dir) {
    char *c = m2d_strfmt("ls -a %s | grep -c -e '\\.m2d-tmp\\.' -e '\\.tmp\\.'", dir), *out = NULL;
    tu_run(c, &out, NULL);
    int n = out ? atoi(out) : 0;
    free(out);
    free(c);
    return n;
}

/* kill -9 at several moments (loading, calibrating, writing the cache, converting, evaluating),
 * then resumed: the same rows as an uninterrupted run (wall times aside), a cache that loads, no
 * temp file left behind. And two sweeps sharing a cache calibrate once (the entry's lock). */
static void killed_pipeline_sweep_resumes_to_the_same_rows(void **state) {
    (void)state;
    sweep_fx fx;
    if (sweep_fx_make(1, "[experiment.t.axes]\nscoring = ['sf', 'do-acp']\ngrouping = ['rr', 'oc']\n"
                         "scaling = ['proportional']\nK = ['2k']\n", &fx))
        TU_SKIP("../shared/models/tiny-qwen3moe or the data not found (run 'make data')");
    char *a = m2d_path_join(fx.dir, "a.csv"), *b = m2d_path_join(fx.dir, "b.csv");
    /* two sweeps at once on one cache directory, different outputs: one calibration */
    char *two = m2d_strfmt("(%s sweep %s --experiment t --out %s --jobs 1 2>&1 & "
                           "%s sweep %s --experiment t --out %s/x.csv --jobs 1 2>&1; wait)",
                           tu_bin(), fx.toml, a, tu_bin(), fx.toml, fx.dir);
    char *out = NULL;
    assert_int_equal(tu_run(two, &out, NULL), 0);
    int calibrated = 0;
    for (const char *p = out; (p = strstr(p, "calibrated ")); p++) calibrated++;
    if (calibrated != 1) fail_msg("%d calibrations (want 1):\n%s", calibrated, out);
    free(out);
    free(two);
    /* the killed runs use their own cache, so calibration is among the moments hit */
    char *cache2 = m2d_strfmt("%s/cache2", fx.dir);
    char *cmd = m2d_strfmt("exec %s sweep %s --experiment t --out %s --jobs 1 --set cache_dir=%s >/dev/null 2>&1",
                           tu_bin(), fx.toml, b, cache2);
    /* a whole run takes ~2 s here (teacher + calibration ~2 s, 4 students ~0.2 s): the first kills
     * land while loading and calibrating, the later ones (cache written by then) while
     * converting and evaluating */
    const int delays_ms[] = {30, 150, 300, 600, 900, 1300, 1800, 2600, 250, 350, 450, 550, 650};
    for (size_t k = 0; k < M2D_ARRAY_LEN(delays_ms); k++) tu_run_killed(cmd, delays_ms[k] * 1000L);
    char *resume = m2d_strfmt("%s sweep %s --experiment t --out %s --jobs 1 --set cache_dir=%s", tu_bin(), fx.toml, b,
                              cache2);
    assert_int_equal(tu_run(resume, NULL, NULL), 0);
    m2d_results ra, rb;
    if (m2d_results_read_checked(a, &ra) || m2d_results_read_checked(b, &rb)) fail_msg("%s", m2d_errmsg());
    assert_int_equal(ra.n_rows, 4);
    assert_int_equal(rb.n_rows, 4);
    /* every column but wall_s as text, exactly: one machine, the same computation, a resume
     * restoring the cache's results bit for bit (no value computed on another machine) */
    for (int i = 0; i < ra.n_rows; i++) {
        int j = 0;
        while (j < rb.n_rows && strcmp(rb.rows[j][0], ra.rows[i][0])) j++;
        assert_true(j < rb.n_rows);
        for (int c = 0; c < ra.n_cols; c++)
            if (strcmp(ra.cols[c], "wall_s") && strcmp(ra.rows[i][c], rb.rows[j][c]))
                fail_msg("%s %s: '%s' vs '%s' after kills", ra.rows[i][0], ra.cols[c], ra.rows[i][c], rb.rows[j][c]);
    }
    assert_int_equal(count_leftovers(fx.dir), 0);
    assert_int_equal(count_leftovers(cache2), 0);
    m2d_results_free(&ra);
    m2d_results_free(&rb);
    free(resume);
    free(cmd);
    free(cache2);
    free(a);
    free(b);
    sweep_fx_free(&fx);
}

/* The MC stage on a real student equals `moe2dense eval` on the same student written by convert. */
static void mc_stage_matches_eval_on_converted_student(void **state) {
    (void)state;
    if (!m2d_file_exists(tu_data_path("arc"))) TU_SKIP("run 'make data' (ARC missing)");
    char *extra = m2d_strfmt("mc = { tasks = ['arc_easy'], limit = 4, data_dir = '%s' }\n"
                             "[experiment.t.axes]\nscoring = ['do-acp']\ngrouping = ['oc']\n"
                             "scaling = ['proportional']\nK = ['2k']\n",
                             tu_data_path(""));
    sweep_fx fx;
    int missing = sweep_fx_make(1, extra, &fx);
    free(extra);
    if (missing) TU_SKIP("../shared/models/tiny-qwen3moe or the data not found (run 'make data')");
    char *then = m2d_strfmt("%s sweep %s --experiment t --out %s && "
                            "%s eval --model %s/student --tasks arc_easy --limit 4 --data %s --json",
                            tu_bin(), fx.toml, fx.csv, tu_bin(), fx.dir, tu_data_path(""));
    char *out = NULL;
    convert_then(&fx, then, &out);
    m2d_results r;
    assert_int_equal(m2d_results_read(fx.csv, &r), 0);
    assert_int_equal(r.n_rows, 1);
    double acc = strtod(m2d_results_get(&r, 0, "arc_easy_acc"), NULL);
    double acc_norm = strtod(m2d_results_get(&r, 0, "arc_easy_acc_norm"), NULL);
    /* eval --json: ... "name":"arc_easy", ... "acc":X, ... "acc_norm":Y */
    const char *t = strstr(out, "\"arc_easy\"");
    assert_non_null(t);
    const char *a = strstr(t, "\"acc\":"), *an = strstr(t, "\"acc_norm\":");
    assert_non_null(a);
    assert_non_null(an);
    assert_true(fabs(acc - strtod(a + 6, NULL)) < 1e-6);
    assert_true(fabs(acc_norm - strtod(an + 11, NULL)) < 1e-6);
    /* arc_easy's paper metric is acc_norm: the average of one task is that value */
    assert_true(fabs(strtod(m2d_results_get(&r, 0, "mc_avg"), NULL) - acc_norm) < 1e-6);
    m2d_results_free(&r);
    free(then);
    free(out);
    sweep_fx_free(&fx);
}

/* The distillation stage on a real student against the command-line path: calibrate + convert +
 * `moe2dense distill` (same settings) gives the same checkpoint, bit for bit; `ppl` and `eval` on
 * it give the stage's distill_ppl and MC columns. */
static void distill_stage_matches_distill_command(void **state) {
    (void)state;
    if (!m2d_file_exists(tu_data_path("arc"))) TU_SKIP("run 'make data' (ARC missing)");
    sweep_fx fx;
    char *dir = tu_tmpdir(), *train = m2d_path_join(dir, "train.txt");
    size_t n;
    char *text = m2d_read_file(wiki_train(), &n);
    if (!text) TU_SKIP("run 'make data' (WikiText-103 prefix missing)");
    tu_write(train, text, M2D_MIN(n, (size_t)60000)); /* a prefix: a few hundred windows of 32 */
    free(text);
    char *extra = m2d_strfmt("mc = { tasks = ['arc_easy'], limit = 4, data_dir = '%s' }\n"
                             "distill = { data = '%s', steps = 3, seq_len = 32, batch = 2, lr = 2e-3, warmup = 1 }\n"
                             "[experiment.t.axes]\nscoring = ['do-acp']\ngrouping = ['oc']\n"
                             "scaling = ['proportional']\nK = ['2k']\n",
                             tu_data_path(""), train);
    int missing = sweep_fx_make(1, extra, &fx);
    free(extra);
    if (missing) TU_SKIP("../shared/models/tiny-qwen3moe or the data not found (run 'make data')");
    /* the same thread count: the engine's forward GEMM splits by it (bits can differ across counts) */
    char *then = m2d_strfmt("%s sweep %s --experiment t --out %s --jobs 1 --threads 2 && %s distill --teacher %s "
                            "--student %s/student --data %s --out %s/d --steps 3 --seq-len 32 --batch 2 --lr 2e-3 "
                            "--warmup 1 --threads 2",
                            tu_bin(), fx.toml, fx.csv, tu_bin(), fx.model, fx.dir, train, fx.dir);
    char *out = NULL;
    convert_then(&fx, then, &out);
    free(out);
    m2d_results r;
    assert_int_equal(m2d_results_read(fx.csv, &r), 0);
    assert_int_equal(r.n_rows, 1);
    const char *id = m2d_results_get(&r, 0, "config_id");
    assert_string_equal(m2d_results_get(&r, 0, "distill_steps"), "3");
    assert_string_equal(m2d_results_get(&r, 0, "distill_tokens"), "192");
    assert_string_equal(m2d_results_get(&r, 0, "mc_student"), "distilled");
    double pre = strtod(m2d_results_get(&r, 0, "ppl"), NULL), post = strtod(m2d_results_get(&r, 0, "distill_ppl"), NULL);
    assert_true(isfinite(post) && post > 1 && post != pre);
    char *ckpt = m2d_strfmt("%s.distill/%s", fx.csv, id), *init = m2d_strfmt("%s.init", ckpt);
    assert_false(m2d_file_exists(init)); /* the converted student's temporary checkpoint is gone */
    char *c = m2d_strfmt("cmp %s/model.safetensors %s/d/model.safetensors && %s ppl --model %s --data %s --seq-len 64 "
                         "--max-windows 1 --json && %s eval --model %s --tasks arc_easy --limit 4 --data %s --json",
                         ckpt, fx.dir, tu_bin(), ckpt, wiki_test(), tu_bin(), ckpt, tu_data_path(""));
    char *err = NULL;
    int rc = tu_run(c, &out, &err);
    if (rc) fail_msg("%s\n%s", out ? out : "", err ? err : "");
    const char *p = strstr(out, "\"ppl\":"), *t = strstr(out, "\"arc_easy\"");
    assert_non_null(p);
    assert_non_null(t);
    if (fabs(strtod(p + 6, NULL) - post) > 6e-5 * M2D_MAX(1.0, post / 100))
        fail_msg("stage distill_ppl %.6f vs ppl on the checkpoint %.6f", post, strtod(p + 6, NULL));
    const char *a = strstr(t, "\"acc\":");
    assert_non_null(a);
    assert_true(fabs(strtod(m2d_results_get(&r, 0, "arc_easy_acc"), NULL) - strtod(a + 6, NULL)) < 1e-6);
    m2d_results_free(&r);
    free(c), free(out), free(err), free(then), free(ckpt), free(init), free(train);
    tu_rm_rf(dir);
    free(dir);
    sweep_fx_free(&fx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ppl_on_tokens_matches_library_gptq),
        cmocka_unit_test(small_sweep_dedups_caches_and_matches_convert_then_ppl),
        cmocka_unit_test(moe_target_rows_match_convert_then_ppl),
        cmocka_unit_test(calibration_header_records_windows_used), cmocka_unit_test(attention_bf16_reaches_the_evaluation),
        cmocka_unit_test(baselines_in_the_scoring_axis),
        cmocka_unit_test(dry_run_refuses_what_the_run_refuses),
        cmocka_unit_test(killed_pipeline_sweep_resumes_to_the_same_rows),
        cmocka_unit_test(mc_stage_matches_eval_on_converted_student),
        cmocka_unit_test(distill_stage_matches_distill_command),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
