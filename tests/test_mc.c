/* mc: prompts to the character (data/LM_EVAL_TASKS.md), few-shot selection against Python's
 * generator, metrics on a hand-made model whose log-likelihoods are known, MMLU micro groups,
 * the paper average, deviations, and bad input. The engine is not involved: the model is a
 * function of the request strings (FNV-1a hash), mirrored in tests/ref/lm_eval_requests.py. Requests
 * and metrics are checked against lm-evaluation-harness itself (lm-eval, tests/ref/.venv).
 * Exact comparisons here are of strings (prompts, request hashes: sha256 of bytes) or of
 * accuracies that are small-integer ratios with power-of-two denominators (0.75, 0.5, 0): exact on
 * every CPU; other floating-point results carry tolerances. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "evals/lm.h"
#include "evals/mc.h"
#include "base/util.h"

/* ---------------------------------------------------------------- hand-made models */

/* toy: ll = -((FNV-1a64(context NUL continuation) mod 1000003) / 1000), as in lm_eval_requests.py */
static double toy_ll(const char *ctx, const char *cont) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)ctx; *p; p++) h = (h ^ *p) * 0x100000001b3ull;
    h = (h ^ 0) * 0x100000001b3ull;
    for (const unsigned char *p = (const unsigned char *)cont; *p; p++) h = (h ^ *p) * 0x100000001b3ull;
    return -((double)(h % 1000003ull) / 1000.0);
}

static int toy_loglikelihood(m2d_lm *lm, const m2d_ll_request *r, int n, m2d_ll_result *out) {
    (void)lm;
    for (int i = 0; i < n; i++) {
        out[i].ll = toy_ll(r[i].context, r[i].continuation);
        out[i].is_greedy = 0;
    }
    return 0;
}
static m2d_lm toy_lm = {"toy", toy_loglikelihood, NULL, NULL};

/* "letter A" model: prefers the continuation " A" / contexts ending in the first option */
static int prefer_first_loglikelihood(m2d_lm *lm, const m2d_ll_request *r, int n, m2d_ll_result *out) {
    (void)lm;
    for (int i = 0; i < n; i++) {
        out[i].ll = (strcmp(r[i].continuation, " A") == 0 || strstr(r[i].continuation, "[good]") ||
                     (strlen(r[i].context) > 3 && strcmp(r[i].context + strlen(r[i].context) - 3, "one") == 0))
                        ? -1.0
                        : -2.0;
        out[i].is_greedy = 0;
    }
    return 0;
}
static m2d_lm prefer_first_lm = {"prefer-first", prefer_first_loglikelihood, NULL, NULL};

static int have_data(void) {
    struct stat st;
    return stat(tu_data_path("arc/ARC-V1-Feb2018-2/ARC-Challenge/ARC-Challenge-Test.jsonl"), &st) == 0;
}
#define NEED_DATA() do { if (!have_data()) TU_SKIP("data/ not populated (run make data)"); } while (0)

static const char *data_dir(void) {
    const char *d = getenv("M2D_DATA");
    return d ? d : "data";
}

static void load_task(const char *plugin, int sub, int shots, m2d_mc_task *t) {
    const m2d_mc_plugin *p = m2d_mc_plugin_find(plugin);
    assert_non_null(p);
    memset(t, 0, sizeof *t);
    if (sub >= 0) snprintf(t->name, sizeof t->name, "%s_%s", plugin, p->subtask_name(sub));
    else snprintf(t->name, sizeof t->name, "%s", plugin);
    if (p->load(data_dir(), sub < 0 ? 0 : sub, shots, t) != 0) fail_msg("load %s: %s", plugin, m2d_errmsg());
}

/* requests of doc `d` with the few-shot examples the task's generator (seeded 1234) gives it */
static char *doc_context(m2d_mc_task *t, int d, int shots, m2d_ll_request *reqs) {
    m2d_pyrandom rng;
    m2d_pyrandom_seed(&rng, 1234);
    int idx[64], n = 0;
    for (int i = 0; i <= d; i++) assert_int_equal(m2d_mc_fewshot(t, &rng, i, shots, idx, &n), 0);
    char *prefix = m2d_mc_fewshot_prefix(t, idx, n);
    m2d_mc_doc_requests(t, d, prefix, reqs);
    return prefix;
}

/* ---------------------------------------------------------------- prompts (LM_EVAL_TASKS.md) */

static void prompt_arc_challenge_first(void **state) {
    (void)state;
    NEED_DATA();
    m2d_mc_task t;
    load_task("arc_challenge", -1, 0, &t);
    assert_int_equal(t.eval.n, 1172);
    assert_int_equal(t.pool_own.n, 1119);
    m2d_ll_request r[4];
    free(doc_context(&t, 0, 0, r));
    const char *ctx = "Question: An astronomer observes that a planet rotates faster after a meteorite impact. "
                      "Which is the most likely effect of this increase in rotation?\nAnswer:";
    const char *conts[] = {" Planetary density will decrease.", " Planetary years will become longer.",
                           " Planetary days will become shorter.", " Planetary gravity will become stronger."};
    assert_int_equal(t.eval.docs[0].n_choices, 4);
    assert_int_equal(t.eval.docs[0].gold, 2);
    for (int c = 0; c < 4; c++) {
        assert_string_equal(r[c].context, ctx);
        assert_string_equal(r[c].continuation, conts[c]);
    }
    m2d_mc_requests_free(r, 4);
    /* 25-shot: Random(1234).sample(train, 25) starts with train[902] (see test_pyrandom) */
    free(doc_context(&t, 0, 25, r));
    const char *first_ex = "Question: What is the first step of the process in the formation of sedimentary "
                           "rocks?\nAnswer: erosion\n\n";
    assert_memory_equal(r[0].context, first_ex, strlen(first_ex));
    size_t lc = strlen(r[0].context), lq = strlen(ctx);
    assert_true(lc > lq);
    assert_string_equal(r[0].context + lc - lq, ctx);
    assert_memory_equal(r[0].context + lc - lq - 2, "\n\n", 2);
    m2d_mc_requests_free(r, 4);
    m2d_mc_task_free(&t);
}

static void prompt_hellaswag_text_variant_first(void **state) {
    (void)state;
    NEED_DATA();
    m2d_mc_task t;
    load_task("hellaswag", -1, 10, &t);
    assert_int_equal(t.eval.n, 10042);
    assert_true(t.pool_is_eval);
    assert_int_equal(t.n_notes, 2); /* text variant + no train split */
    m2d_ll_request r[4];
    free(doc_context(&t, 0, 0, r));
    /* lm-eval: "...on a roof. He" (ctx_b.capitalize()); the text variant cannot restore the capital */
    const char *conts[] = {" is using wrap to wrap a pair of skis.", " is ripping level tiles off.",
                           " is holding a rubik's cube.", " starts pulling up roofing on a roof."};
    for (int c = 0; c < 4; c++) {
        assert_string_equal(r[c].context, "Roof shingle removal: A man is sitting on a roof. he");
        assert_string_equal(r[c].continuation, conts[c]);
    }
    assert_int_equal(t.eval.docs[0].gold, 3);
    assert_non_null(strstr(t.notes[0], "capitalize"));
    m2d_mc_requests_free(r, 4);
    m2d_mc_task_free(&t);
}

/* The canonical jsonl (when present) gives lm-eval's exact context, capital "He" included. */
static void prompt_hellaswag_canonical_jsonl(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    char *sub = m2d_strfmt("%s/hellaswag/data", dir);
    assert_int_equal(m2d_mkdir_p(sub), 0);
    char *val = m2d_strfmt("%s/hellaswag_val.jsonl", sub);
    const char *line =
        "{\"ind\": 24, \"activity_label\": \"Roof shingle removal\", \"ctx_a\": \"A man is sitting on a roof.\", "
        "\"ctx_b\": \"he\", \"ctx\": \"A man is sitting on a roof. he\", \"endings\": [\"is using wrap to wrap a pair "
        "of skis.\", \"is ripping level tiles off.\", \"is holding a rubik's cube.\", \"starts pulling up roofing on "
        "a roof.\"], \"source_id\": \"activitynet~v_-JhWjGDPHMY\", \"split\": \"val\", \"split_type\": \"indomain\", "
        "\"label\": 3}\n"
        "{\"ind\": 1, \"activity_label\": \"Making a cake\", \"ctx_a\": \"[header] How to bake [title] Mix it.\", "
        "\"ctx_b\": \"tHEN  Stir\", \"endings\": [\"  [step] Pour  it. \", \"Bake [substeps] it.\"], \"label\": \"1\"}\n";
    tu_write(val, line, strlen(line));
    m2d_mc_task t;
    memset(&t, 0, sizeof t);
    const m2d_mc_plugin *p = m2d_mc_plugin_find("hellaswag");
    assert_int_equal(p->load(dir, 0, 0, &t), 0);
    assert_int_equal(t.eval.n, 2);
    assert_int_equal(t.n_notes, 0); /* canonical data at zero shots: no deviation */
    assert_string_equal(t.eval.docs[0].text, "Roof shingle removal: A man is sitting on a roof. He");
    assert_string_equal(t.eval.docs[0].choices[3], "starts pulling up roofing on a roof.");
    assert_int_equal(t.eval.docs[0].gold, 3);
    /* preprocess: strip; " [title]" -> ". "; drop [..]; "  " -> " " once; capitalize lower-cases the rest */
    assert_string_equal(t.eval.docs[1].text, "Making a cake: How to bake. Mix it. Then stir");
    assert_string_equal(t.eval.docs[1].choices[0], " Pour it."); /* strip runs before [step] goes */
    assert_string_equal(t.eval.docs[1].choices[1], "Bake it.");
    assert_int_equal(t.eval.docs[1].gold, 1);
    m2d_mc_task_free(&t);
    /* few-shot without the train split: pool = validation (recorded) */
    assert_int_equal(p->load(dir, 0, 1, &t), 0);
    assert_true(t.pool_is_eval);
    assert_int_equal(t.n_notes, 1);
    m2d_mc_task_free(&t);
    /* with the train split: the pool is train, k+1 still drawn (draw_extra), nothing to record */
    char *train = m2d_strfmt("%s/hellaswag_train.jsonl", sub);
    tu_write(train, line, strlen(line));
    assert_int_equal(p->load(dir, 0, 1, &t), 0);
    assert_false(t.pool_is_eval);
    assert_true(t.draw_extra);
    assert_int_equal(t.pool_own.n, 2);
    assert_int_equal(t.n_notes, 0);
    m2d_mc_task_free(&t);
    free(train);
    tu_rm_rf(dir);
    free(val); free(sub); free(dir);
}

static void hellaswag_preprocess_rules(void **state) {
    (void)state;
    char *s = m2d_hellaswag_preprocess("  a [title]b [x] c   d [unclosed\n[y]e ");
    /* strip -> "a [title]b [x] c   d [unclosed\n[y]e"; " [title]" -> ". "; [..] removed (not across
     * the newline); "   " -> "  " (one pass of "  " -> " " leaves two of three spaces).
     * Expected value checked with python3 re.sub / str.replace. */
    assert_string_equal(s, "a. b c  d [unclosed\ne");
    free(s);
    /* Python str.strip(): Unicode whitespace (U+3000, U+00A0, U+2029, \x1c) on both ends */
    s = m2d_py_strip("\xe3\x80\x80 x y\xc2\xa0\n\xe2\x80\xa9\x1c", 14);
    assert_string_equal(s, "x y");
    free(s);
}

static void prompt_winogrande_first(void **state) {
    (void)state;
    NEED_DATA();
    m2d_mc_task t;
    load_task("winogrande", -1, 5, &t);
    assert_int_equal(t.eval.n, 1267);
    assert_int_equal(t.pool_own.n, 10234); /* train_l: train_xl is absent here */
    assert_int_equal(t.n_notes, 1);
    assert_non_null(strstr(t.notes[0], "train_l"));
    m2d_ll_request r[2];
    free(doc_context(&t, 0, 0, r));
    assert_string_equal(r[0].context, "Sarah was a much better surgeon than Maria so Sarah");
    assert_string_equal(r[1].context, "Sarah was a much better surgeon than Maria so Maria");
    assert_string_equal(r[0].continuation, " always got the easier cases.");
    assert_string_equal(r[1].continuation, " always got the easier cases.");
    assert_int_equal(t.eval.docs[0].gold, 1);
    m2d_mc_requests_free(r, 2);
    /* 5-shot, second doc: lm-eval draws k+1 = 6 per doc for winogrande (fewshot_split ==
     * test_split, both None), so doc 1 gets Random(1234).sample(pool, 6) called twice ->
     * [1375, ...]; drawing only 5 would give [572, ...] (a "hangovers" sentence) instead.
     * train_l[1375] is the Jason/Craig sentence, answer 2; the example is its gold context +
     * " " + the text after the blank. */
    free(doc_context(&t, 1, 5, r));
    const char *ex = "Jason had a pain in their neck but Craig did not. Craig had to make an appointment with a dentist.\n\n";
    assert_memory_equal(r[0].context, ex, strlen(ex));
    m2d_mc_requests_free(r, 2);
    m2d_mc_task_free(&t);
    /* zero-shot needs no pool and records nothing */
    load_task("winogrande", -1, 0, &t);
    assert_int_equal(t.n_notes, 0);
    m2d_mc_task_free(&t);
}

static void prompt_mmlu_first(void **state) {
    (void)state;
    NEED_DATA();
    m2d_mc_task t;
    load_task("mmlu", 0, 5, &t);
    assert_string_equal(t.name, "mmlu_abstract_algebra");
    assert_int_equal(t.eval.n, 100);
    assert_int_equal(t.pool_own.n, 5);
    m2d_ll_request r[4];
    free(doc_context(&t, 0, 0, r));
    assert_string_equal(r[0].context, "The following are multiple choice questions (with answers) about abstract "
                                      "algebra.\n\nFind the degree for the given field extension Q(sqrt(2), "
                                      "sqrt(3), sqrt(18)) over Q.\nA. 0\nB. 4\nC. 2\nD. 6\nAnswer:");
    assert_string_equal(r[1].continuation, " B");
    assert_int_equal(t.eval.docs[0].gold, 1);
    m2d_mc_requests_free(r, 4);
    /* 5-shot, as lm-eval renders it (tests/ref/lm_eval_requests.py) */
    free(doc_context(&t, 0, 5, r));
    assert_string_equal(
        r[0].context,
        "The following are multiple choice questions (with answers) about abstract algebra.\n\nFind all c in Z_3 "
        "such that Z_3[x]/(x^2 + c) is a field.\nA. 0\nB. 1\nC. 2\nD. 3\nAnswer: B\n\nStatement 1 | If aH is an "
        "element of a factor group, then |aH| divides |a|. Statement 2 | If H and K are subgroups of G then HK is a "
        "subgroup of G.\nA. True, True\nB. False, False\nC. True, False\nD. False, True\nAnswer: B\n\nStatement 1 | "
        "Every element of a group generates a cyclic subgroup of the group. Statement 2 | The symmetric group S_10 "
        "has 10 elements.\nA. True, True\nB. False, False\nC. True, False\nD. False, True\nAnswer: C\n\nStatement 1| "
        "Every function from a finite set onto itself must be one to one. Statement 2 | Every subgroup of an abelian "
        "group is abelian.\nA. True, True\nB. False, False\nC. True, False\nD. False, True\nAnswer: A\n\nFind the "
        "characteristic of the ring 2Z.\nA. 0\nB. 3\nC. 12\nD. 30\nAnswer: A\n\nFind the degree for the given field "
        "extension Q(sqrt(2), sqrt(3), sqrt(18)) over Q.\nA. 0\nB. 4\nC. 2\nD. 6\nAnswer:");
    m2d_mc_requests_free(r, 4);
    m2d_mc_task_free(&t);
}

/* ---------------------------------------------------------------- against lm-eval itself */

/* tests/ref/lm_eval_requests.py ARGS: lm-eval's own task configs on the same data files (see its
 * docstring); returns its stdout. */
static char *lm_eval(const char *args) {
    char *cmd = m2d_strfmt("%s tests/ref/lm_eval_requests.py %s", tu_ref_python(), args);
    char *out = NULL, *err = NULL;
    int rc = tu_run(cmd, &out, &err);
    if (rc != 0) fail_msg("%s: exit %d: %s", cmd, rc, err ? err : "");
    free(cmd), free(err);
    return out;
}

/* Fails naming request LINE and showing both strings around their first difference. */
static void fail_line_diff(int line, const char *ours, const char *ref) {
    size_t i = 0;
    while (ours[i] && ours[i] == ref[i]) i++;
    size_t from = i > 160 ? i - 160 : 0;
    fail_msg("request %d differs from lm-eval's at byte %zu:\n  ours:    ...%.240s\n  lm-eval: ...%.240s", line, i,
             ours + from, ref + from);
}

/* Our requests (what eval --dump-requests writes) for each SPEC "TASK:SHOTS:LIMIT" equal lm-eval's,
 * line by line; and the hand-made model's acc / acc_norm equal lm-eval's own process_results. */
static void check_against_lm_eval(const char *data, const char *const *specs, int n_specs) {
    char *dir = tu_tmpdir(), *args = m2d_strfmt("'%s'", data);
    size_t cap = 1 << 20, len = 0;
    char *got = m2d_malloc(cap);
    m2d_mc_results *res = m2d_calloc((size_t)n_specs, sizeof *res);
    for (int i = 0; i < n_specs; i++) {
        char task[96];
        int shots, limit;
        if (sscanf(specs[i], "%95[^:]:%d:%d", task, &shots, &limit) != 3) fail_msg("bad spec %s", specs[i]);
        char *dump = m2d_strfmt("%s/req%d.jsonl", dir, i);
        m2d_mc_config cfg;
        m2d_mc_config_default(&cfg);
        cfg.data_dir = data;
        cfg.dump_requests = dump;
        if (m2d_mc_run(&toy_lm, task, shots, limit, &cfg, &res[i]) != 0) fail_msg("%s: %s", specs[i], m2d_errmsg());
        size_t n;
        char *part = m2d_read_file(dump, &n);
        assert_non_null(part);
        while (len + n + 1 > cap) got = m2d_realloc(got, cap *= 2);
        memcpy(got + len, part, n + 1);
        len += n;
        free(part), free(dump);
        char *more = m2d_strfmt("%s %s", args, specs[i]);
        free(args);
        args = more;
    }
    char *want = lm_eval(args);
    char *sg = NULL, *sw = NULL;
    char *lg = strtok_r(got, "\n", &sg), *lw = strtok_r(want, "\n", &sw);
    int lines = 0;
    while (lg || lw) {
        if (!lg || !lw) fail_msg("request count differs after %d requests (ours %s)", lines, lg ? "more" : "fewer");
        cJSON *a = cJSON_Parse(lg), *b = cJSON_Parse(lw);
        assert_non_null(a);
        assert_non_null(b);
        if (!cJSON_Compare(a, b, 1)) fail_line_diff(lines, lg, lw);
        cJSON_Delete(a), cJSON_Delete(b);
        lines++;
        lg = strtok_r(NULL, "\n", &sg);
        lw = strtok_r(NULL, "\n", &sw);
    }
    print_message("%d requests equal lm-eval's\n", lines);
    /* metrics: lm-eval's process_results over the same hand-made model */
    char *more = m2d_strfmt("--summary %s", args);
    char *sum = lm_eval(more);
    char *ss = NULL;
    int tasks = 0;
    for (char *ls = strtok_r(sum, "\n", &ss); ls; ls = strtok_r(NULL, "\n", &ss), tasks++) {
        cJSON *j = cJSON_Parse(ls);
        assert_non_null(j);
        const char *task = cJSON_GetObjectItem(j, "task")->valuestring;
        int i = cJSON_GetObjectItem(j, "spec")->valueint;
        assert_true(i >= 0 && i < n_specs);
        const m2d_mc_task_result *r = m2d_mc_results_find(&res[i], task);
        if (!r) fail_msg("%s: no result for %s", specs[i], task);
        int n = cJSON_GetObjectItem(j, "n")->valueint;
        assert_int_equal(r->n, n);
        assert_int_equal((int)lround(r->acc * n), cJSON_GetObjectItem(j, "acc")->valueint);
        const cJSON *an = cJSON_GetObjectItem(j, "acc_norm");
        assert_int_equal(r->has_acc_norm, !cJSON_IsNull(an));
        if (r->has_acc_norm) assert_int_equal((int)lround(r->acc_norm * n), an->valueint);
        cJSON_Delete(j);
    }
    assert_true(tasks >= n_specs);
    for (int i = 0; i < n_specs; i++) m2d_mc_results_free(&res[i]);
    free(sum), free(more), free(want), free(got), free(args), free(res);
    tu_rm_rf(dir);
    free(dir);
}

/* The first documents of every task at the paper's shots and at 0 shots (MMLU: the first
 * document of every subject, and more of two), request by request. */
static void requests_and_metrics_equal_lm_eval(void **state) {
    (void)state;
    NEED_DATA();
    static const char *const specs[] = {
        "arc_challenge:25:4", "arc_challenge:0:60", "arc_easy:25:20", "arc_easy:0:20", "winogrande:5:20",
        "winogrande:0:40", "hellaswag:10:8", "hellaswag:0:60", "mmlu:5:1", "mmlu:0:1",
        "mmlu_abstract_algebra:5:10", "mmlu_high_school_european_history:5:2",
    };
    check_against_lm_eval(data_dir(), specs, (int)M2D_ARRAY_LEN(specs));
}

/* HellaSwag's canonical path against lm-eval's own process_docs (ctx_b.capitalize(), " [title]",
 * [..] removal, double spaces) and its train pool, on synthetic documents in the HF format. */
static void hellaswag_canonical_equals_lm_eval(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    char *sub = m2d_strfmt("%s/hellaswag/data", dir);
    assert_int_equal(m2d_mkdir_p(sub), 0);
    static const char *labels[] = {"Roof shingle removal", "Making a cake", "[header] Caf\xc3\xa9", "Sports"};
    static const char *ctx_a[] = {"A man is sitting on a roof.", "[header] How to bake [title] Mix it.",
                                  " [title]Tea  time   now", "", "\xc3\xa9t\xc3\xa9 [x]at [title] the  [step] park"};
    static const char *ctx_b[] = {"he", "tHEN  Stir", "", "\xc3\x89MILE runs", "3 kids [y] play", "  leading"};
    static const char *endings[] = {"is using wrap.", "  [step] Pour  it. ", "Bake [substeps] it.", "[title] x",
                                    "a  b   c    d", "\xc3\xa9l\xc3\xa8ve [z]", "stops.", " ends [unclosed"};
    char *files[2] = {m2d_strfmt("%s/hellaswag_val.jsonl", sub), m2d_strfmt("%s/hellaswag_train.jsonl", sub)};
    uint64_t rng = 11;
    for (int f = 0; f < 2; f++) {
        size_t cap = 1 << 16, o = 0;
        char *buf = m2d_malloc(cap);
        for (int d = 0; d < (f ? 24 : 12); d++) {
            int n = 2 + (int)(tu_rand_u64(&rng) % 3), gold = (int)(tu_rand_u64(&rng) % (uint64_t)n);
            o += (size_t)snprintf(buf + o, cap - o, "{\"ind\": %d, \"activity_label\": \"%s\", \"ctx_a\": \"%s\", "
                                  "\"ctx_b\": \"%s\", \"endings\": [", 100 * f + d,
                                  labels[tu_rand_u64(&rng) % M2D_ARRAY_LEN(labels)],
                                  ctx_a[tu_rand_u64(&rng) % M2D_ARRAY_LEN(ctx_a)],
                                  ctx_b[tu_rand_u64(&rng) % M2D_ARRAY_LEN(ctx_b)]);
            for (int e = 0; e < n; e++)
                o += (size_t)snprintf(buf + o, cap - o, "%s\"%s %d\"", e ? ", " : "",
                                      endings[tu_rand_u64(&rng) % M2D_ARRAY_LEN(endings)], e);
            o += (size_t)snprintf(buf + o, cap - o, "], \"label\": %d}\n", gold);
        }
        tu_write(files[f], buf, o);
        free(buf);
    }
    static const char *const specs[] = {"hellaswag:0:0", "hellaswag:3:0"};
    check_against_lm_eval(dir, specs, 2);
    free(files[0]), free(files[1]), free(sub);
    tu_rm_rf(dir);
    free(dir);
}

/* A model that scores nothing and records, per document, the hash of its requests as
 * tests/ref/lm_eval_requests.py --hashes computes it. */
typedef struct {
    char (*hash)[17];
    int n, cap;
} hash_record;

static int hashing_loglikelihood(m2d_lm *lm, const m2d_ll_request *r, int n, m2d_ll_result *out) {
    hash_record *h = lm->impl;
    m2d_sha256 s;
    m2d_sha256_init(&s);
    for (int i = 0; i < n; i++) {
        m2d_sha256_update(&s, r[i].context, strlen(r[i].context) + 1);
        m2d_sha256_update(&s, r[i].continuation, strlen(r[i].continuation) + 1);
        out[i].ll = 0, out[i].is_greedy = 0;
    }
    uint8_t d[32];
    m2d_sha256_final(&s, d);
    if (h->n == h->cap) h->hash = m2d_realloc(h->hash, (size_t)(h->cap = h->cap ? 2 * h->cap : 1024) * sizeof *h->hash);
    for (int i = 0; i < 8; i++) snprintf(h->hash[h->n] + 2 * i, 3, "%02x", d[i]);
    h->n++;
    return 0;
}

/* Every document of every task at the paper's shots: the hashes of our requests equal those of
 * lm-eval's (tests/golden/lm_eval_requests.txt, written by `make lm-eval-goldens` from the
 * requests lm-eval builds on ../shared/data). No Python needed. `make verify-lm-eval` runs the
 * same comparison against hashes lm-eval makes now ($M2D_LM_EVAL_GOLDEN) and, with
 * M2D_LM_EVAL_LIVE=1, shows the first differing request in full. */
static void requests_equal_lm_eval_golden_hashes(void **state) {
    (void)state;
    NEED_DATA();
    const char *path = getenv("M2D_LM_EVAL_GOLDEN");
    char *golden = m2d_read_file(path ? path : "tests/golden/lm_eval_requests.txt", NULL);
    if (!golden) fail_msg("%s", m2d_errmsg());
    hash_record h = {0};
    m2d_lm lm = {"hashing", hashing_loglikelihood, NULL, &h};
    char *save = NULL, task[96] = "";
    int shots = 0, n_docs = 0, doc = 0, sections = 0, total = 0;
    for (char *line = strtok_r(golden, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#' && line[1] != '#') continue;
        if (line[0] == '#') {
            assert_int_equal(sscanf(line, "## %95s %d %d", task, &shots, &n_docs), 3);
            m2d_mc_config cfg;
            m2d_mc_config_default(&cfg);
            cfg.data_dir = data_dir();
            m2d_mc_results res;
            h.n = 0;
            if (m2d_mc_run(&lm, task, shots, 0, &cfg, &res) != 0) fail_msg("%s: %s", task, m2d_errmsg());
            m2d_mc_results_free(&res);
            if (h.n != n_docs) fail_msg("%s %d-shot: %d documents, lm-eval had %d", task, shots, h.n, n_docs);
            doc = 0;
            sections++;
            continue;
        }
        assert_true(doc < n_docs);
        if (strcmp(h.hash[doc], line) != 0) {
            if (getenv("M2D_LM_EVAL_LIVE")) { /* the requests up to this document, side by side */
                char *spec = m2d_strfmt("%s:%d:%d", task, shots, doc + 1);
                const char *const specs[] = {spec};
                check_against_lm_eval(data_dir(), specs, 1);
                free(spec);
            }
            fail_msg("%s %d-shot document %d: its requests differ from lm-eval's (hash %s, lm-eval %s); "
                     "`make verify-lm-eval` shows the difference", task, shots, doc, h.hash[doc], line);
        }
        doc++, total++;
    }
    /* the five tasks, MMLU as its 57 subjects */
    assert_int_equal(sections, 4 + 57);
    print_message("%d documents (%d tasks) hash like lm-eval's requests\n", total, sections);
    free(h.hash), free(golden);
}

/* ---------------------------------------------------------------- metrics, hand-made numbers */

static m2d_mc_doc mkdoc(int n, const char **choices, int gold) {
    m2d_mc_doc d = {0};
    d.n_choices = n;
    d.choices = (char **)choices;
    d.gold = gold;
    return d;
}

static void metrics_acc_and_acc_norm(void **state) {
    (void)state;
    int a, an;
    /* lengths 1, 10, 4: ll/len = -1, -0.5, -0.5 -> acc picks the highest ll (index 0),
     * acc_norm ties between 1 and 2 and keeps the lower index */
    const char *c1[] = {"x", "abcdefghij", "abcd"};
    m2d_mc_doc d = mkdoc(3, c1, 1);
    m2d_mc_score(&d, (double[]){-1.0, -5.0, -2.0}, &a, &an);
    assert_int_equal(a, 0);
    assert_int_equal(an, 1);
    /* exact ties in ll: numpy argmax takes the first */
    d.gold = 0;
    m2d_mc_score(&d, (double[]){-3.0, -3.0, -3.0}, &a, &an);
    assert_int_equal(a, 1);
    assert_int_equal(an, 0); /* -3, -0.3, -0.75: index 1 wins acc_norm */
    /* lengths in code points, not bytes: "é"x4 is 4 code points / 8 bytes, "abcdef" is 6.
     * ll -4.4 / 4 = -1.1 vs -6 / 6 = -1.0 -> index 1; by bytes it would be -0.55 -> index 0 */
    const char *c2[] = {"\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9", "abcdef"};
    d = mkdoc(2, c2, 1);
    m2d_mc_score(&d, (double[]){-4.4, -6.0}, &a, &an);
    assert_int_equal(a, 0);
    assert_int_equal(an, 1);
    assert_int_equal(m2d_utf8_codepoints("\xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80"), 4);
    /* NaN, as numpy's argmax takes it: the first NaN is the maximum. An empty choice with ll 0 gives
     * 0/0 = NaN in acc_norm, so index 2 wins it (not index 1's -0.5); a NaN log-likelihood wins acc */
    const char *c3[] = {"a", "bb", ""};
    d = mkdoc(3, c3, 2);
    m2d_mc_score(&d, (double[]){-5.0, -1.0, 0.0}, &a, &an);
    assert_int_equal(a, 1);  /* ll: index 2's 0.0 is the highest */
    assert_int_equal(an, 1); /* norm -5, -0.5, NaN: index 2 */
    d.gold = 1;
    m2d_mc_score(&d, (double[]){-5.0, NAN, NAN}, &a, &an);
    assert_int_equal(a, 1);
    assert_int_equal(an, 1);
}

static void metrics_stderr(void **state) {
    (void)state;
    /* [1,0,1,1]: mean .75, sample var = (3 * .0625 + .5625) / 3 = .25, stderr = .5 / 2 = .25 */
    assert_true(fabs(m2d_mc_stderr(3, 4) - 0.25) < 1e-15);
    /* closed form sqrt(p(1-p)/(n-1)) */
    assert_true(fabs(m2d_mc_stderr(37, 100) - sqrt(0.37 * 0.63 / 99)) < 1e-15);
    assert_true(isnan(m2d_mc_stderr(1, 1))); /* lm-eval: "N/A" for a single item */
    assert_true(m2d_mc_stderr(0, 10) == 0); /* sqrt(0 x 1 / 9) = 0 exactly */
    /* pooled (lm-eval pooled_sample_stderr): sizes 4, 100 with stderrs .25 and se(37/100):
     * var = (3*.0625*4 + 99*se2^2*100) / (104 - 2); result sqrt(var / 104) */
    double se2 = sqrt(0.37 * 0.63 / 99);
    double want = sqrt((3 * 0.0625 * 4 + 99 * se2 * se2 * 100) / 102.0 / 104.0);
    double got = m2d_mc_pooled_stderr((double[]){0.25, se2}, (int[]){4, 100}, 2);
    assert_true(fabs(got - want) < 1e-15);
    assert_true(isnan(m2d_mc_pooled_stderr((double[]){NAN, 0.1}, (int[]){1, 10}, 2)));
}

/* ---------------------------------------------------------------- synthetic data: groups, paper average */

static void put(const char *dir, const char *rel, const char *text) {
    char *p = m2d_path_join(dir, rel);
    char *slash = strrchr(p, '/');
    *slash = 0;
    assert_int_equal(m2d_mkdir_p(p), 0);
    *slash = '/';
    tu_write(p, text, strlen(text));
    free(p);
}

/* MMLU: subject s has (s % 4) + 2 test rows; row r's gold is A when r < s % 3 + 1 (else C), so the
 * "always A" model gets min(s % 3 + 1, rows) right. Dev rows: 5 per subject. */
static void write_mmlu(const char *dir, int *correct, int *rows) {
    const m2d_mc_plugin *p = m2d_mc_plugin_find("mmlu");
    for (int s = 0; s < p->n_subtasks; s++) {
        rows[s] = s % 4 + 2;
        correct[s] = 0;
        char buf[4096] = "";
        for (int r = 0; r < rows[s]; r++) {
            int a = r < s % 3 + 1;
            correct[s] += a;
            char line[128];
            snprintf(line, sizeof line, "\"Q %d, \"\"%d\"\"\",x,y, z ,w,%s\n", s, r, a ? "A" : "C");
            strcat(buf, line);
        }
        char *rel = m2d_strfmt("mmlu/data/test/%s_test.csv", p->subtask_name(s));
        put(dir, rel, buf);
        free(rel);
        rel = m2d_strfmt("mmlu/data/dev/%s_dev.csv", p->subtask_name(s));
        put(dir, rel, "d1,a,b,c,d,A\nd2,a,b,c,d,B\nd3,a,b,c,d,C\nd4,a,b,c,d,D\nd5,a,b,c,d,A\n");
        free(rel);
    }
}

static void mmlu_micro_groups(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    int correct[64], rows[64];
    write_mmlu(dir, correct, rows);
    m2d_mc_config cfg;
    m2d_mc_config_default(&cfg);
    cfg.data_dir = dir;
    m2d_mc_results res;
    if (m2d_mc_run(&prefer_first_lm, "mmlu", 5, 0, &cfg, &res)) fail_msg("%s", m2d_errmsg());
    const m2d_mc_plugin *p = m2d_mc_plugin_find("mmlu");
    const char *groups[] = {"stem", "humanities", "social_sciences", "other"};
    const int group_sizes[] = {19, 13, 12, 13};
    int tot_c = 0, tot_n = 0;
    double se[4];
    int gn[4];
    for (int g = 0; g < 4; g++) {
        int c = 0, n = 0, subjects = 0;
        double ses[64];
        int sz[64];
        for (int s = 0; s < p->n_subtasks; s++) {
            if (strcmp(p->subtask_group(s), groups[g]) != 0) continue;
            char name[96];
            snprintf(name, sizeof name, "mmlu_%s", p->subtask_name(s));
            const m2d_mc_task_result *t = m2d_mc_results_find(&res, name);
            assert_non_null(t);
            assert_int_equal(t->n, rows[s]);
            assert_true(fabs(t->acc - (double)correct[s] / rows[s]) < 1e-15);
            ses[subjects] = t->acc_stderr;
            sz[subjects++] = rows[s];
            c += correct[s];
            n += rows[s];
        }
        assert_int_equal(subjects, group_sizes[g]);
        char name[96];
        snprintf(name, sizeof name, "mmlu_%s", groups[g]);
        const m2d_mc_task_result *t = m2d_mc_results_find(&res, name);
        assert_non_null(t);
        assert_true(t->is_group);
        assert_int_equal(t->n, n);
        assert_true(fabs(t->acc - (double)c / n) < 1e-12); /* micro, not the mean of subjects */
        se[g] = m2d_mc_pooled_stderr(ses, sz, subjects);
        assert_true(fabs(t->acc_stderr - se[g]) < 1e-15);
        gn[g] = n;
        tot_c += c;
        tot_n += n;
    }
    const m2d_mc_task_result *all = m2d_mc_results_find(&res, "mmlu");
    assert_non_null(all);
    assert_int_equal(all->n, tot_n);
    assert_true(fabs(all->acc - (double)tot_c / tot_n) < 1e-12);
    assert_true(fabs(all->acc_stderr - m2d_mc_pooled_stderr(se, gn, 4)) < 1e-15);
    assert_false(res.has_paper_average);
    m2d_mc_results_free(&res);
    /* --limit applies per subject */
    if (m2d_mc_run(&prefer_first_lm, "mmlu", 0, 2, &cfg, &res)) fail_msg("%s", m2d_errmsg());
    assert_int_equal(m2d_mc_results_find(&res, "mmlu")->n, 2 * 57);
    m2d_mc_results_free(&res);
    tu_rm_rf(dir);
    free(dir);
}

/* Small versions of all five tasks; the "prefer first" model's scores are known per task. */
static void write_small_tasks(const char *dir) {
    /* ARC: 4 test items, gold = 0,1,0,0 (labels A-D and 1-4) -> acc 3/4; the first choice is the
     * marked "[good]" one so acc_norm agrees (all other choices score lower) */
    const char *arc =
        "{\"id\":\"t1\",\"question\":{\"stem\":\"S1\",\"choices\":[{\"text\":\"[good] a\",\"label\":\"A\"},{\"text\":\"b\",\"label\":\"B\"}]},\"answerKey\":\"A\"}\n"
        "{\"id\":\"t2\",\"question\":{\"stem\":\"S2\",\"choices\":[{\"text\":\"[good] a\",\"label\":\"1\"},{\"text\":\"b\",\"label\":\"2\"}]},\"answerKey\":\"2\"}\n"
        "{\"id\":\"t3\",\"question\":{\"stem\":\"S3\",\"choices\":[{\"text\":\"[good] a\",\"label\":\"A\"},{\"text\":\"b\",\"label\":\"B\"},{\"text\":\"c\",\"label\":\"C\"}]},\"answerKey\":\"A\"}\n"
        "{\"id\":\"t4\",\"question\":{\"stem\":\"S4\",\"choices\":[{\"text\":\"[good] a\",\"label\":\"A\"},{\"text\":\"b\",\"label\":\"B\"}]},\"answerKey\":\"A\"}\n";
    put(dir, "arc/ARC-V1-Feb2018-2/ARC-Easy/ARC-Easy-Test.jsonl", arc);
    put(dir, "arc/ARC-V1-Feb2018-2/ARC-Easy/ARC-Easy-Train.jsonl", arc);
    put(dir, "arc/ARC-V1-Feb2018-2/ARC-Challenge/ARC-Challenge-Test.jsonl", arc);
    put(dir, "arc/ARC-V1-Feb2018-2/ARC-Challenge/ARC-Challenge-Train.jsonl", arc);
    /* Winogrande: contexts ending in "one" win; gold 0, 1 -> acc 1/2 */
    const char *wino =
        "{\"qID\":\"a\",\"sentence\":\"It was _ indeed.\",\"option1\":\"one\",\"option2\":\"two\",\"answer\":\"1\"}\n"
        "{\"qID\":\"b\",\"sentence\":\"Then _ left.\",\"option1\":\"one\",\"option2\":\"two\",\"answer\":\"2\"}\n";
    put(dir, "winogrande/winogrande_1.1/dev.jsonl", wino);
    put(dir, "winogrande/winogrande_1.1/train_l.jsonl", wino);
    /* HellaSwag text variant: 3 items, gold 0, 0, 2 -> acc 2/3 */
    put(dir, "hellaswag/derived/klosax-hellaswag_text_data/hellaswag_val_full.txt",
        "Act: ctx one\n0\n[good] e0\ne1\ne2\ne3\n"
        "Act: ctx two\n0\n[good] e0\ne1\ne2\ne3\n"
        "Act: ctx three\n2\n[good] e0\ne1\ne2\ne3\n");
}

static void run_all_paper_average_and_outputs(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    int correct[64], rows[64];
    write_mmlu(dir, correct, rows);
    write_small_tasks(dir);
    m2d_mc_config cfg;
    m2d_mc_config_default(&cfg);
    cfg.data_dir = dir;
    char *dump = m2d_path_join(dir, "dump.jsonl");
    cfg.dump_requests = dump;
    m2d_mc_results res;
    if (m2d_mc_run(&prefer_first_lm, "all", 1, 0, &cfg, &res)) fail_msg("%s", m2d_errmsg());
    const m2d_mc_task_result *ae = m2d_mc_results_find(&res, "arc_easy"), *hs = m2d_mc_results_find(&res, "hellaswag");
    const m2d_mc_task_result *wg = m2d_mc_results_find(&res, "winogrande"), *mm = m2d_mc_results_find(&res, "mmlu");
    assert_non_null(ae); assert_non_null(hs); assert_non_null(wg); assert_non_null(mm);
    assert_true(ae->acc == 0.75 && ae->acc_norm == 0.75);
    assert_true(fabs(hs->acc_norm - 2.0 / 3.0) < 1e-15);
    assert_true(wg->acc == 0.5);
    assert_false(wg->has_acc_norm);
    assert_true(res.has_paper_average);
    double want = (wg->acc + hs->acc_norm + ae->acc_norm + m2d_mc_results_find(&res, "arc_challenge")->acc_norm + mm->acc) / 5;
    assert_true(fabs(res.paper_average - want) < 1e-15);
    /* deviations are in the results, the text and the JSON */
    assert_int_equal(hs->n_notes, 2);
    assert_int_equal(wg->n_notes, 1);
    char *text = NULL;
    size_t tl = 0;
    FILE *f = open_memstream(&text, &tl);
    m2d_mc_results_print(&res, f);
    fclose(f);
    assert_non_null(strstr(text, "deviations from lm-evaluation-harness"));
    assert_non_null(strstr(text, "train_l"));
    assert_non_null(strstr(text, "paper average"));
    assert_null(strstr(text, "mmlu_abstract_algebra")); /* subjects only in the JSON */
    assert_non_null(strstr(text, "mmlu_stem"));
    char *js = m2d_mc_results_json(&res);
    cJSON *j = cJSON_Parse(js);
    assert_non_null(j);
    cJSON *r = cJSON_GetObjectItem(j, "results");
    assert_non_null(cJSON_GetObjectItem(r, "mmlu_abstract_algebra"));
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetObjectItem(r, "hellaswag"), "deviations")), 2);
    assert_true(fabs(cJSON_GetObjectItem(j, "paper_average")->valuedouble - want) < 1e-12);
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "config"), "fewshot_random_seed")->valueint, 1234);
    cJSON_Delete(j);
    free(js);
    free(text);
    /* the dump holds every request: 4+4 ARC x (2,2,3,2 choices), 2x2 winogrande, 3x4 hellaswag, mmlu 4 each */
    size_t n;
    char *d = m2d_read_file(dump, &n);
    assert_non_null(d);
    int lines = 0;
    for (size_t i = 0; i < n; i++) lines += d[i] == '\n';
    int mm_rows = 0;
    for (int s = 0; s < 57; s++) mm_rows += rows[s];
    assert_int_equal(lines, 2 * 9 + 4 + 12 + 4 * mm_rows);
    assert_int_equal(res.n_requests, lines);
    free(d);
    m2d_mc_results_free(&res);
    tu_rm_rf(dir);
    free(dump);
    free(dir);
}

/* ---------------------------------------------------------------- bad input */

static void bad_input_messages(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    m2d_mc_config cfg;
    m2d_mc_config_default(&cfg);
    cfg.data_dir = dir;
    m2d_mc_results res;
    /* unknown task lists what exists */
    assert_int_equal(m2d_mc_run(&toy_lm, "arc_easy,nonsense", 0, 0, &cfg, &res), -1);
    assert_non_null(strstr(m2d_errmsg(), "nonsense"));
    assert_non_null(strstr(m2d_errmsg(), "arc_challenge, arc_easy, hellaswag, mmlu, winogrande"));
    /* missing data file: named */
    assert_int_equal(m2d_mc_run(&toy_lm, "arc_easy", 0, 0, &cfg, &res), -1);
    assert_non_null(strstr(m2d_errmsg(), "ARC-Easy-Test.jsonl"));
    assert_int_equal(m2d_mc_run(&toy_lm, "hellaswag", 0, 0, &cfg, &res), -1);
    assert_non_null(strstr(m2d_errmsg(), "hellaswag_val.jsonl"));
    /* malformed jsonl: file:line; missing field: file:line and the field */
    put(dir, "winogrande/winogrande_1.1/dev.jsonl",
        "{\"sentence\":\"a _ b\",\"option1\":\"x\",\"option2\":\"y\",\"answer\":\"1\"}\n{\"sentence\": oops}\n");
    assert_int_equal(m2d_mc_run(&toy_lm, "winogrande", 0, 0, &cfg, &res), -1);
    assert_non_null(strstr(m2d_errmsg(), "dev.jsonl:2"));
    put(dir, "winogrande/winogrande_1.1/dev.jsonl",
        "{\"sentence\":\"a _ b\",\"option1\":\"x\",\"option2\":\"y\",\"answer\":\"1\"}\n\n{\"sentence\":\"a _ b\",\"option1\":\"x\",\"answer\":\"1\"}\n");
    assert_int_equal(m2d_mc_run(&toy_lm, "winogrande", 0, 0, &cfg, &res), -1);
    assert_non_null(strstr(m2d_errmsg(), "dev.jsonl:3"));
    assert_non_null(strstr(m2d_errmsg(), "'option2'"));
    put(dir, "arc/ARC-V1-Feb2018-2/ARC-Easy/ARC-Easy-Test.jsonl",
        "{\"id\":\"t\",\"question\":{\"stem\":\"S\",\"choices\":[{\"text\":\"a\",\"label\":\"A\"},{\"text\":\"b\",\"label\":\"B\"}]},\"answerKey\":\"E\"}\n");
    assert_int_equal(m2d_mc_run(&toy_lm, "arc_easy", 0, 0, &cfg, &res), -1);
    assert_non_null(strstr(m2d_errmsg(), "ARC-Easy-Test.jsonl:1"));
    assert_non_null(strstr(m2d_errmsg(), "'answerKey'"));
    /* bad CSV row: file:row and field */
    put(dir, "mmlu/data/test/anatomy_test.csv", "q,a,b,c,d,A\nq2,a,b,c,d\n");
    put(dir, "mmlu/data/dev/anatomy_dev.csv", "q,a,b,c,d,A\n");
    assert_int_equal(m2d_mc_run(&toy_lm, "mmlu_anatomy", 0, 0, &cfg, &res), -1);
    assert_non_null(strstr(m2d_errmsg(), "anatomy_test.csv:row 2"));
    assert_non_null(strstr(m2d_errmsg(), "field"));
    put(dir, "mmlu/data/test/anatomy_test.csv", "q,a,b,c,d,A\nq2,a,b,c,d,E\n");
    assert_int_equal(m2d_mc_run(&toy_lm, "mmlu_anatomy", 0, 0, &cfg, &res), -1);
    assert_non_null(strstr(m2d_errmsg(), "anatomy_test.csv:row 2: field 'answer'"));
    /* too few docs for the requested shots */
    put(dir, "mmlu/data/test/anatomy_test.csv", "q,a,b,c,d,A\n");
    assert_int_equal(m2d_mc_run(&toy_lm, "mmlu_anatomy", 6, 0, &cfg, &res), -1);
    assert_non_null(strstr(m2d_errmsg(), "6-shot"));
    /* a failed run leaves no dump file behind */
    char *dump = m2d_path_join(dir, "d.jsonl");
    cfg.dump_requests = dump;
    assert_int_equal(m2d_mc_run(&toy_lm, "mmlu_anatomy,arc_easy", 0, 0, &cfg, &res), -1);
    assert_false(m2d_file_exists(dump));
    free(dump);
    tu_rm_rf(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(prompt_arc_challenge_first),
        cmocka_unit_test(prompt_hellaswag_text_variant_first),
        cmocka_unit_test(prompt_hellaswag_canonical_jsonl),
        cmocka_unit_test(hellaswag_preprocess_rules),
        cmocka_unit_test(prompt_winogrande_first),
        cmocka_unit_test(prompt_mmlu_first),
        cmocka_unit_test(requests_and_metrics_equal_lm_eval),
        cmocka_unit_test(hellaswag_canonical_equals_lm_eval),
        cmocka_unit_test(requests_equal_lm_eval_golden_hashes),
        cmocka_unit_test(metrics_acc_and_acc_norm),
        cmocka_unit_test(metrics_stderr),
        cmocka_unit_test(mmlu_micro_groups),
        cmocka_unit_test(run_all_paper_average_and_outputs),
        cmocka_unit_test(bad_input_messages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
