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
                      "[experiment.t.axes]\nscoring = ['sf', 'do-acp', 'nonexistent']\n"
                      "grouping = ['rr', 'oc']\nscaling = ['proportional']\nK = ['k', '2k']\n"
                      "[[experiment.t.exclude]]\nscoring = 'nonexistent'\ngrouping = 'oc'\n",
                      &fx))
        TU_SKIP("../shared/models/tiny-qwen3moe or the data not found (run 'make data')");
    m2d_experiment x;
    assert_int_equal(m2d_experiment_load(fx.toml, "t", NULL, 0, &x), 0);
    assert_int_equal(x.n_configs, 2 * 2 * 2 + 2);
    m2d_sweep_opts o = {.out = fx.csv, .jobs = 2};
    m2d_sweep_summary s;
    assert_int_equal(m2d_sweep_run(&x, &o, &s), 0);
    /* K = k: rr and oc give one student per scoring (fingerprint) */
    assert_int_equal(s.dedup, 2);
    assert_int_equal(s.evaluated, 6);
    assert_int_equal(s.failed, 2); /* the unknown scoring, recorded, the sweep went on */
    m2d_results r;
    assert_int_equal(m2d_results_read(fx.csv, &r), 0);
    assert_int_equal(r.n_rows, x.n_configs);
    int checked = 0;
    for (int i = 0; i < r.n_rows; i++) {
        const char *st = m2d_results_get(&r, i, "status");
        if (!strcmp(m2d_results_get(&r, i, "scoring"), "nonexistent")) {
            assert_non_null(strstr(st, "failed: "));
            assert_non_null(strstr(st, "nonexistent"));
            continue;
        }
        assert_string_equal(st, "ok");
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
        cmocka_unit_test(mc_stage_matches_eval_on_converted_student),
        cmocka_unit_test(distill_stage_matches_distill_command),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
