/* lm: lm-eval's request -> token rules on a toy tokenizer; the engine-backed scorer's cached
 * (shared prefix + branches) and naive (full forward per request) paths agree on the tiny
 * teacher; the eval command end to end with --limit. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/engine.h"
#include "evals/lm.h"
#include "evals/mc.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "base/util.h"

/* ---------------------------------------------------------------- toy tokenizer */

/* One token per byte, except that a space followed by a letter is one token (256 + letter):
 * enough to see merges across the context/continuation boundary. */
static int toy_encode(void *user, const char *text, size_t len, int32_t **ids, size_t *n) {
    (void)user;
    int32_t *out = m2d_malloc(sizeof(int32_t) * (len ? len : 1));
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c == ' ' && i + 1 < len && ((text[i + 1] >= 'a' && text[i + 1] <= 'z') || (text[i + 1] >= 'A' && text[i + 1] <= 'Z'))) {
            out[k++] = 256 + (unsigned char)text[++i];
        } else {
            out[k++] = c;
        }
    }
    *ids = out;
    *n = k;
    return 0;
}

static void expect_tokens(const m2d_ll_tokens *t, const int32_t *want, int n, int n_cont) {
    assert_int_equal(t->n, n);
    assert_int_equal(t->n_cont, n_cont);
    for (int i = 0; i < n; i++) assert_int_equal(t->tokens[i], want[i]);
}

static void tokenize_rules(void **state) {
    (void)state;
    m2d_ll_tokens t;
    /* plain: "Q:" + " A" -> ctx [Q, :], continuation [ A] */
    m2d_ll_request r = {"Q:", " A"};
    assert_int_equal(m2d_ll_tokenize(toy_encode, NULL, 999, 0, &r, &t), 0);
    expect_tokens(&t, (int32_t[]){'Q', ':', 256 + 'A'}, 3, 1);
    m2d_ll_tokens_free(&t);
    /* trailing whitespace of the context moves to the continuation: "Q: " + "A" scores " A" as one
     * merged token, exactly like "Q:" + " A" */
    m2d_ll_request r2 = {"Q: ", "A"};
    assert_int_equal(m2d_ll_tokenize(toy_encode, NULL, 999, 0, &r2, &t), 0);
    expect_tokens(&t, (int32_t[]){'Q', ':', 256 + 'A'}, 3, 1);
    m2d_ll_tokens_free(&t);
    /* a merge across the boundary stays in the continuation: whole = enc("ab c") = [a, b, ' c'];
     * ctx = enc("ab ") would be [a, b, ' '] -- after moving the space, ctx = enc("ab") = [a, b] */
    m2d_ll_request r3 = {"ab ", "cd"};
    assert_int_equal(m2d_ll_tokenize(toy_encode, NULL, 999, 0, &r3, &t), 0);
    expect_tokens(&t, (int32_t[]){'a', 'b', 256 + 'c', 'd'}, 4, 2);
    m2d_ll_tokens_free(&t);
    /* Python rstrip() is Unicode-aware: a trailing NBSP (U+00A0) moves too */
    m2d_ll_request r7 = {"Q:\xc2\xa0", "A"};
    assert_int_equal(m2d_ll_tokenize(toy_encode, NULL, 999, 0, &r7, &t), 0);
    expect_tokens(&t, (int32_t[]){'Q', ':', 0xc2, 0xa0, 'A'}, 5, 3);
    m2d_ll_tokens_free(&t);
    assert_int_equal(m2d_py_rstrip_len("a \t\n\xe3\x80\x80", 7), 1); /* U+3000 ideographic space */
    assert_int_equal(m2d_py_rstrip_len("a\xc3\xa9", 3), 3);           /* é is not whitespace */
    /* empty context: a single prefix token, continuation encoded alone */
    m2d_ll_request r4 = {"", " Hi"};
    assert_int_equal(m2d_ll_tokenize(toy_encode, NULL, 999, 0, &r4, &t), 0);
    expect_tokens(&t, (int32_t[]){999, 256 + 'H', 'i'}, 3, 2);
    m2d_ll_tokens_free(&t);
    assert_int_equal(m2d_ll_tokenize(toy_encode, NULL, -1, 0, &r4, &t), -1);
    /* left truncation to max_length + 1 tokens (the input is the first max_length of them) */
    m2d_ll_request r5 = {"0123456789", " x"};
    assert_int_equal(m2d_ll_tokenize(toy_encode, NULL, 999, 4, &r5, &t), 0);
    expect_tokens(&t, (int32_t[]){'6', '7', '8', '9', 256 + 'x'}, 5, 1);
    m2d_ll_tokens_free(&t);
    /* a continuation longer than the window: only max_length of its tokens can be scored */
    m2d_ll_request r6 = {"a", "123456"};
    assert_int_equal(m2d_ll_tokenize(toy_encode, NULL, 999, 3, &r6, &t), 0);
    expect_tokens(&t, (int32_t[]){'3', '4', '5', '6'}, 4, 3);
    m2d_ll_tokens_free(&t);
}

/* ---------------------------------------------------------------- engine on the tiny teacher */

static int have_data(void) {
    struct stat st;
    return stat(tu_data_path("mmlu/data/dev/anatomy_dev.csv"), &st) == 0;
}

/* Requests of the first docs of a few tasks, collected through a recording scorer. */
static void collect(m2d_ll_recording *rec, const char *tasks, int shots, int limit) {
    m2d_lm lm = m2d_lm_recorder(rec);
    m2d_mc_config cfg;
    m2d_mc_config_default(&cfg);
    cfg.data_dir = getenv("M2D_DATA") ? getenv("M2D_DATA") : "data";
    m2d_mc_results res;
    if (m2d_mc_run(&lm, tasks, shots, limit, &cfg, &res)) fail_msg("%s", m2d_errmsg());
    m2d_mc_results_free(&res);
}

/* Documents of TASKS (SHOTS, LIMIT) whose best two choices, as LM scores them, are within the
 * per-token tolerance of cached_equals_naive (1e-4 a scored byte, each side): where another scorer
 * may choose otherwise */
static int near_ties(m2d_lm *lm, const char *tasks, int shots, int limit) {
    m2d_ll_recording rec = {0};
    collect(&rec, tasks, shots, limit);
    m2d_ll_result *res = m2d_calloc((size_t)rec.n + 1, sizeof *res);
    int ties = 0;
    for (int i = 0; i < rec.n;) {
        int j = i, best = -1, second = -1;
        while (j < rec.n && rec.group[j] == rec.group[i]) j++;
        for (int k = i; k < j; k++) {
            assert_int_equal(m2d_lm_loglikelihood(lm, rec.reqs + k, 1, res + k), 0);
            if (best < 0 || res[k].ll > res[best].ll) second = best, best = k;
            else if (second < 0 || res[k].ll > res[second].ll) second = k;
        }
        if (second >= 0) {
            double tol = 1e-4 * (double)(strlen(rec.reqs[best].continuation) + strlen(rec.reqs[second].continuation));
            ties += res[best].ll - res[second].ll <= tol;
        }
        i = j;
    }
    free(res);
    m2d_ll_recording_free(&rec);
    return ties;
}

/* Cached (KV prefix + batched branches) and naive (a full forward per request) give the same
 * log-likelihoods. Tolerance: both run the same fp32 kernels, but on different matrix shapes
 * (one prefix pass + a batch of branches vs one window) and with attention summed over the
 * cached prefix and the branch separately, so each logit can differ by a few fp32 ulps of its
 * accumulations (hidden 192, 4 layers: observed |dlogit| ~1e-6..1e-5). A continuation of m
 * tokens sums m log-softmax values, each off by at most ~2 max|dlogit|; 1e-4 per scored token
 * leaves an order of magnitude of headroom and is far below any acc decision margin that
 * matters (a flip needs two choices within 1e-4 nats). */
static void cached_equals_naive(void **state) {
    (void)state;
    char *dir = tu_model_path("tiny-qwen3moe");
    if (!dir) TU_SKIP("tiny-qwen3moe not found");
    if (!have_data()) { free(dir); TU_SKIP("data/ not populated (run make data)"); }
    m2d_ll_recording rec = {0};
    collect(&rec, "mmlu_anatomy", 5, 2);  /* shared description + dev shots, beyond 512 tokens */
    collect(&rec, "mmlu_virology", 1, 2); /* the cached prefix is reused from one doc to the next */
    collect(&rec, "arc_easy,winogrande", 1, 1);
    collect(&rec, "hellaswag", 0, 1);
    m2d_lm *cached = NULL, *naive = NULL;
    if (m2d_lm_engine_open(dir, &(m2d_engine_opts){.n_threads = 2}, M2D_LM_CACHED, 0, &cached)) fail_msg("%s", m2d_errmsg());
    if (m2d_lm_engine_open(dir, &(m2d_engine_opts){.n_threads = 2}, M2D_LM_NAIVE, 0, &naive)) fail_msg("%s", m2d_errmsg());
    m2d_ll_result *a = m2d_calloc((size_t)rec.n, sizeof *a), *b = m2d_calloc((size_t)rec.n, sizeof *b);
    for (int i = 0; i < rec.n;) {
        int j = i;
        while (j < rec.n && rec.group[j] == rec.group[i]) j++;
        assert_int_equal(m2d_lm_loglikelihood(cached, rec.reqs + i, j - i, a + i), 0);
        for (int k = i; k < j; k++) assert_int_equal(m2d_lm_loglikelihood(naive, rec.reqs + k, 1, b + k), 0);
        i = j;
    }
    double worst = 0;
    int greedy = 0;
    for (int i = 0; i < rec.n; i++) {
        assert_true(isfinite(a[i].ll) && a[i].ll < 0);
        double d = fabs(a[i].ll - b[i].ll);
        if (d > worst) worst = d;
        /* 1e-4 per scored token; byte-level BPE: tokens <= bytes of the continuation */
        double tol = 1e-4 * (double)strlen(rec.reqs[i].continuation);
        if (d > tol) fail_msg("request %d: cached %.9f naive %.9f (tol %.1g)", i, a[i].ll, b[i].ll, tol);
        assert_true(b[i].is_greedy == 0 || b[i].is_greedy == 1);
        greedy += b[i].is_greedy;
    }
    print_message("cached vs naive: %d requests, max |dll| = %.3g, %d greedy\n", rec.n, worst, greedy);
    m2d_lm_stats st;
    assert_int_equal(m2d_lm_engine_stats(cached, &st), 0);
    assert_int_equal(st.requests, rec.n);
    assert_true(st.tokens_reused > 0);
    /* the one-pass scoring of a layer-major engine (every request its own window, all through one
     * layer at a time) against naive, with the same per-token tolerance */
    m2d_lm *one = NULL;
    if (m2d_lm_engine_open(dir, &(m2d_engine_opts){.n_threads = 2, .pass = M2D_PASS_LAYER}, M2D_LM_CACHED, 0, &one))
        fail_msg("%s", m2d_errmsg());
    assert_true(m2d_engine_pass(m2d_lm_engine_of(one))->layer_major);
    assert_int_equal(m2d_lm_engine_score_all(one, rec.reqs, rec.n, a), 0);
    for (int i = 0; i < rec.n; i++) {
        double tol = 1e-4 * (double)strlen(rec.reqs[i].continuation);
        if (fabs(a[i].ll - b[i].ll) > tol) fail_msg("request %d: one pass %.9f naive %.9f (tol %.1g)", i, a[i].ll, b[i].ll, tol);
    }
    /* and m2d_mc_run takes that path by itself, with the cached run's accuracies */
    m2d_mc_config cfg;
    m2d_mc_config_default(&cfg);
    cfg.data_dir = getenv("M2D_DATA") ? getenv("M2D_DATA") : "data";
    m2d_mc_results r1, r2;
    if (m2d_mc_run(one, "arc_easy,winogrande", 1, 3, &cfg, &r1) || m2d_mc_run(cached, "arc_easy,winogrande", 1, 3, &cfg, &r2))
        fail_msg("%s", m2d_errmsg());
    assert_int_equal(r1.n_tasks, r2.n_tasks);
    assert_int_equal(r1.n_requests, r2.n_requests);
    /* the two scorers agree within 1e-4 per token (above), so a document's choice can flip only
     * where its best two choices are that close: each such near tie may move one document */
    int ties = near_ties(naive, "arc_easy,winogrande", 1, 3);
    for (int t = 0; t < r1.n_tasks; t++) {
        assert_int_equal(r1.tasks[t].n, r2.tasks[t].n);
        double moved = fabs(r1.tasks[t].acc - r2.tasks[t].acc) * r1.tasks[t].n;
        if (moved > ties + 1e-9) fail_msg("task %d: %.0f documents changed their answer, %d near ties", t, moved, ties);
    }
    m2d_mc_results_free(&r1), m2d_mc_results_free(&r2);
    m2d_lm_free(one);
    m2d_lm_free(cached);
    m2d_lm_free(naive);
    m2d_ll_recording_free(&rec);
    free(a); free(b); free(dir);
}

/* The engine scorer against a hand computation: an empty context scores the continuation after
 * the prefix token (EOS here: the tiny teacher has no BOS), i.e. naive logprobs of the window. */
static void empty_context_uses_eos(void **state) {
    (void)state;
    char *dir = tu_model_path("tiny-qwen3moe");
    if (!dir) TU_SKIP("tiny-qwen3moe not found");
    m2d_lm *cached = NULL, *naive = NULL;
    if (m2d_lm_engine_open(dir, &(m2d_engine_opts){.n_threads = 2}, M2D_LM_CACHED, 0, &cached)) fail_msg("%s", m2d_errmsg());
    if (m2d_lm_engine_open(dir, &(m2d_engine_opts){.n_threads = 2}, M2D_LM_NAIVE, 0, &naive)) fail_msg("%s", m2d_errmsg());
    m2d_ll_request r[2] = {{"", "The cat sat on the mat."}, {"", "The dog sat on the mat."}};
    m2d_ll_result a[2], b[2], c[2];
    assert_int_equal(m2d_lm_loglikelihood(cached, r, 2, a), 0);
    assert_int_equal(m2d_lm_loglikelihood(naive, r, 2, b), 0);
    m2d_lm_engine_set_mode(naive, M2D_LM_NAIVE_LP); /* streamed log-probs, no full logits */
    assert_int_equal(m2d_lm_loglikelihood(naive, r, 2, c), 0);
    for (int i = 0; i < 2; i++) {
        /* same fp32 tolerance argument as cached_equals_naive: 1e-4 per token, < 30 tokens */
        assert_true(fabs(a[i].ll - b[i].ll) < 3e-3);
        assert_true(fabs(c[i].ll - b[i].ll) < 3e-3);
        assert_true(b[i].is_greedy == 0 || b[i].is_greedy == 1);
        assert_int_equal(a[i].is_greedy, -1);
    }
    assert_true(a[0].ll != a[1].ll);
    /* the same scorer over an engine and tokenizer owned by the caller (the sweep's way) */
    m2d_model *m = NULL;
    m2d_engine *e = NULL;
    m2d_tokenizer *tk = NULL;
    m2d_lm *wrapped = NULL;
    assert_int_equal(m2d_model_open(dir, &m), 0);
    assert_int_equal(m2d_engine_new(m, 2, &e), 0);
    assert_int_equal(m2d_tokenizer_load(dir, &tk), 0);
    assert_int_equal(m2d_lm_engine_wrap(e, tk, M2D_LM_CACHED, 0, &wrapped), 0);
    assert_int_equal(m2d_lm_loglikelihood(wrapped, r, 2, c), 0);
    for (int i = 0; i < 2; i++) assert_true(c[i].ll == a[i].ll); /* same path, same numbers (one machine) */
    m2d_lm_engine_set_mode(wrapped, M2D_LM_NAIVE); /* full logits: the vocabulary from the wrapped engine */
    assert_int_equal(m2d_lm_loglikelihood(wrapped, r, 2, c), 0);
    for (int i = 0; i < 2; i++) assert_true(c[i].ll == b[i].ll); /* the naive scorer's path: the same numbers */
    m2d_lm_free(wrapped); /* leaves e, tk, m to us */
    m2d_engine_free(e);
    m2d_tokenizer_free(tk);
    m2d_model_close(m);
    m2d_lm_free(cached);
    m2d_lm_free(naive);
    free(dir);
}

/* ---------------------------------------------------------------- the command */

static void eval_command_smoke(void **state) {
    (void)state;
    char *dir = tu_model_path("tiny-qwen3moe");
    if (!dir) TU_SKIP("tiny-qwen3moe not found");
    if (!have_data()) { free(dir); TU_SKIP("data/ not populated (run make data)"); }
    const char *data = getenv("M2D_DATA") ? getenv("M2D_DATA") : "data";
    char *tmp = tu_tmpdir();
    char *dump = m2d_path_join(tmp, "req.jsonl");
    /* every task on 1 document, 1 shot (MMLU: one subject, to keep CI time low; the full
     * family and the paper average are covered with a hand-made model in test_mc); JSON out */
    char *cmd = m2d_strfmt("%s eval --model '%s' --data '%s' --tasks arc_easy,arc_challenge,hellaswag,winogrande,"
                           "mmlu_anatomy --shots 1 --limit 1 --json --dump-requests '%s' --threads 2",
                           tu_bin(), dir, data, dump);
    char *out = NULL, *err = NULL;
    int rc = tu_run(cmd, &out, &err);
    if (rc != 0) fail_msg("rc %d: %s", rc, err ? err : "");
    cJSON *j = cJSON_Parse(out);
    assert_non_null(j);
    cJSON *res = cJSON_GetObjectItem(j, "results");
    const char *tasks[] = {"arc_easy", "arc_challenge", "hellaswag", "winogrande", "mmlu_anatomy"};
    for (size_t i = 0; i < M2D_ARRAY_LEN(tasks); i++) {
        cJSON *t = cJSON_GetObjectItem(res, tasks[i]);
        assert_non_null(t);
        assert_int_equal(cJSON_GetObjectItem(t, "n")->valueint, 1);
        double acc = cJSON_GetObjectItem(t, "acc")->valuedouble;
        assert_true(acc == 0 || acc == 1);
    }
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(j, "paper_average"))); /* needs all five tasks */
    assert_string_equal(cJSON_GetObjectItem(j, "precision")->valuestring, "fp32"); /* the default, recorded */
    assert_string_equal(cJSON_GetObjectItem(j, "precision_requested")->valuestring, "fp32");
    assert_string_equal(cJSON_GetObjectItem(j, "attention")->valuestring, "fp32");
    /* 1-shot: text variant and its missing train split; winogrande's train_l pool */
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetObjectItem(res, "hellaswag"), "deviations")), 2);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetObjectItem(res, "winogrande"), "deviations")), 1);
    /* dump: one JSON line per request, the count the JSON reports */
    size_t n;
    char *d = m2d_read_file(dump, &n);
    assert_non_null(d);
    int lines = 0;
    for (size_t i = 0; i < n; i++) lines += d[i] == '\n';
    assert_int_equal(lines, (int)cJSON_GetObjectItem(j, "requests")->valuedouble);
    char *first = strtok(d, "\n");
    cJSON *l = cJSON_Parse(first);
    assert_non_null(cJSON_GetObjectItem(l, "context"));
    assert_non_null(cJSON_GetObjectItem(l, "continuation"));
    cJSON_Delete(l);
    free(d);
    cJSON_Delete(j);
    free(out); free(err); free(cmd);
    /* bad input: unknown task and missing model */
    cmd = m2d_strfmt("%s eval --model '%s' --data '%s' --tasks arc_easy,bogus", tu_bin(), dir, data);
    assert_int_not_equal(tu_run(cmd, NULL, &err), 0);
    assert_non_null(strstr(err, "bogus"));
    assert_non_null(strstr(err, "arc_challenge"));
    free(err); free(cmd);
    cmd = m2d_strfmt("%s eval --model /nonexistent/m --tasks arc_easy", tu_bin());
    assert_int_not_equal(tu_run(cmd, NULL, &err), 0);
    assert_non_null(strstr(err, "/nonexistent/m"));
    free(err); free(cmd);
    cmd = m2d_strfmt("%s eval --model '%s' --tasks arc_easy --shots x", tu_bin(), dir);
    assert_int_not_equal(tu_run(cmd, NULL, &err), 0);
    assert_non_null(strstr(err, "--shots"));
    free(err); free(cmd);
    cmd = m2d_strfmt("%s eval --model '%s' --tasks arc_easy --precision fp8", tu_bin(), dir);
    assert_int_not_equal(tu_run(cmd, NULL, &err), 0);
    assert_non_null(strstr(err, "eval: --precision: 'fp8' is not a precision (auto, fp32, bf16)"));
    free(err); free(cmd);
    cmd = m2d_strfmt("%s eval --model '%s' --tasks arc_easy --attention auto", tu_bin(), dir);
    assert_int_not_equal(tu_run(cmd, NULL, &err), 0);
    assert_non_null(strstr(err, "eval: option --attention: 'auto' is not fp32 or bf16"));
    free(err); free(cmd);
    /* bf16 GEMMs and attention on one document: the precisions used are recorded in the text output */
    cmd = m2d_strfmt("%s eval --model '%s' --data '%s' --tasks arc_easy --limit 1 --threads 2 --precision bf16 "
                     "--attention bf16", tu_bin(), dir, data);
    assert_int_equal(tu_run(cmd, &out, &err), 0);
    assert_non_null(strstr(out, "precision bf16 (requested bf16)\nattention bf16\n"));
    free(out); free(err); free(cmd);
    tu_rm_rf(tmp);
    free(dump); free(tmp); free(dir);
}

/* The recording scorer keeps copies of every request, in order, with the call each came in. */
static void recorder_records_calls(void **state) {
    (void)state;
    m2d_ll_recording rec = {0};
    m2d_lm lm = m2d_lm_recorder(&rec);
    char ctx[] = "Q: 1+1?";
    m2d_ll_request first[2] = {{ctx, " 2"}, {ctx, " 3"}}, second[1] = {{"", "x"}};
    m2d_ll_result out[2] = {{0, 1}, {0, 1}};
    assert_int_equal(m2d_lm_loglikelihood(&lm, first, 2, out), 0);
    assert_true(out[0].ll == -1 && out[1].ll == -1 && out[0].is_greedy == 0);
    for (int i = 0; i < 70; i++) assert_int_equal(m2d_lm_loglikelihood(&lm, second, 1, out), 0); /* grows */
    ctx[0] = 'Z'; /* copies, not pointers into the caller's strings */
    assert_int_equal(rec.n, 72);
    assert_int_equal(rec.calls, 71);
    assert_string_equal(rec.reqs[0].context, "Q: 1+1?");
    assert_string_equal(rec.reqs[1].continuation, " 3");
    assert_string_equal(rec.reqs[71].continuation, "x");
    assert_int_equal(rec.group[1], 0);
    assert_int_equal(rec.group[2], 1);
    assert_int_equal(rec.group[71], 70);
    m2d_lm_free(&lm);
    m2d_ll_recording_free(&rec);
    assert_int_equal(rec.n, 0);
    assert_null(rec.reqs);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tokenize_rules),
        cmocka_unit_test(recorder_records_calls),
        cmocka_unit_test(cached_equals_naive),
        cmocka_unit_test(empty_context_uses_eos),
        cmocka_unit_test(eval_command_smoke),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
