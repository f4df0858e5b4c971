/* hf: moe2dense against Hugging Face transformers itself, through the goldens that
 * tools/hf_goldens.py makes with transformers' own classes, save_pretrained and forward
 * (tests/golden/hf/, or $M2D_HF_GOLDEN: `make verify-hf` makes them afresh and runs this test):
 *   - the checkpoint format: the config.json that transformers writes loads, and moe2dense's
 *     safetensors writer rebuilds transformers' model.safetensors byte for byte from the grid
 *     generator (tests/testmodel.h);
 *   - the forward of every architecture: logits and routing against transformers' (float64);
 *   - conversion: calibrate + convert of a transformers-written teacher give the student that
 *     transformers' save_pretrained writes back unchanged, and the student's logits (and, for an
 *     MoE target, routing) equal transformers' on it. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "engine/engine.h"
#include "model/model.h"
#include "routing.h"
#include "testmodel.h"

static char *g_work; /* checkpoints built so far: g_work/<name> */

static const char *golden_dir(void) {
    const char *d = getenv("M2D_HF_GOLDEN");
    return d ? d : "tests/golden/hf";
}

static cJSON *load_golden(const char *name) {
    char *path = m2d_strfmt("%s/%s.json", golden_dir(), name);
    size_t n;
    char *text = m2d_read_file(path, &n);
    if (!text) fail_msg("%s", m2d_errmsg());
    cJSON *g = cJSON_ParseWithLength(text, n);
    if (!g) fail_msg("%s: invalid JSON", path);
    free(text), free(path);
    return g;
}

static const cJSON *item(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v) fail_msg("golden: field '%s' missing", key);
    return v;
}

static const char *str(const cJSON *o, const char *key) {
    const cJSON *v = item(o, key);
    if (!cJSON_IsString(v)) fail_msg("golden: field '%s' is not a string", key);
    return v->valuestring;
}

static void file_sha256(const char *path, char out[65]) {
    size_t n;
    char *data = m2d_read_file(path, &n);
    if (!data) fail_msg("%s", m2d_errmsg());
    m2d_sha256_hex(data, n, out);
    free(data);
}

static void copy_file(const char *from, const char *to) {
    size_t n;
    char *data = m2d_read_file(from, &n);
    if (!data) fail_msg("%s", m2d_errmsg());
    tu_write(to, data, n);
    free(data);
}

/* The checkpoint of golden G, rebuilt by moe2dense: transformers' config.json text, weights from
 * the grid generator through moe2dense's safetensors writer, the golden's tokenizer. */
static char *build_teacher(const cJSON *g) {
    const char *name = str(g, "name"), *config = str(g, "config_json");
    char *dir = m2d_path_join(g_work, name);
    if (m2d_testmodel_write_grid(dir, config, (uint64_t)item(g, "seed")->valuedouble) != 0)
        fail_msg("%s: the config.json transformers wrote does not load, or writing failed: %s", name, m2d_errmsg());
    char *tok = m2d_path_join(golden_dir(), "tokenizer.json"), *tok_to = m2d_path_join(dir, "tokenizer.json");
    copy_file(tok, tok_to);
    free(tok), free(tok_to);
    return dir;
}

/* The student of golden G: moe2dense calibrate + convert (the golden's arguments) on its teacher. */
static char *build_student(const cJSON *g) {
    const char *name = str(g, "name");
    cJSON *tg = load_golden(str(g, "teacher"));
    char *teacher = build_teacher(tg);
    cJSON_Delete(tg);
    char *dir = m2d_path_join(g_work, name), *calib = m2d_strfmt("%s/%s.txt", g_work, name);
    char *stats = m2d_strfmt("%s/%s.stats", g_work, name);
    const char *text = str(g, "calib_text");
    tu_write(calib, text, strlen(text));
    const char *steps[2] = {"calibrate", "convert"};
    for (int s = 0; s < 2; s++) {
        char *cmd = s ? m2d_strfmt("%s convert --model %s --stats %s --out %s", tu_bin(), teacher, stats, dir)
                      : m2d_strfmt("%s calibrate --model %s --data %s --out %s", tu_bin(), teacher, calib, stats);
        const cJSON *args = item(g, steps[s]), *a;
        cJSON_ArrayForEach(a, args) {
            char *more = m2d_strfmt("%s '%s'", cmd, a->valuestring);
            free(cmd);
            cmd = more;
        }
        char *err = NULL;
        if (tu_run(cmd, NULL, &err) != 0) fail_msg("%s: %s", cmd, err);
        free(err), free(cmd);
    }
    free(teacher), free(calib), free(stats);
    return dir;
}

/* Logits and routing of the engine on the golden's tokens against transformers' float64 forward. */
static void check_forward(const cJSON *g, const char *dir) {
    const char *name = str(g, "name");
    m2d_model *m;
    if (m2d_model_open(dir, &m) != 0) fail_msg("%s: %s", name, m2d_errmsg());
    assert_string_equal(m->cfg.arch, str(g, "class"));
    const cJSON *toks = item(g, "tokens");
    int n = cJSON_GetArraySize(toks), V = m->cfg.vocab_size, L = m->cfg.num_hidden_layers;
    int k = m->cfg.num_experts_per_tok > 0 ? m->cfg.num_experts_per_tok : 1;
    int32_t *tok = m2d_malloc(sizeof(int32_t) * (size_t)n);
    for (int t = 0; t < n; t++) tok[t] = cJSON_GetArrayItem(toks, t)->valueint;
    tu_routing r;
    tu_routing_init(&r, L, n, k);
    m2d_engine *e;
    assert_int_equal(m2d_engine_new(m, 2, &e), 0);
    m2d_engine_set_moe_hook(e, tu_routing_hook, &r);
    float *lg = m2d_malloc(sizeof(float) * (size_t)n * V);
    if (m2d_engine_logits(e, tok, n, lg) != 0) fail_msg("%s: %s", name, m2d_errmsg());

    /* Logits: the engine works in fp32 on the checkpoint's exact weights; transformers' reference
     * is float64 except where its modelling code itself rounds to fp32 (RMSNorm, the attention
     * and router softmax). Each fp32 dot product here has at most 128 terms of size <= 1 (weights
     * <= 1/4 in magnitude times normalised activations), relative error <= ~sqrt(128)·6e-8 ~ 7e-7 of
     * its terms' magnitude; over <= 4 layers × (attention + FFN) through the residual stream, the
     * final norm and an LM-head dot of 64 terms, logits of magnitude <= ~5 are expected within
     * ~5·7e-7·sqrt(8)·2 ~ 2e-5, which is asserted (measured: 1e-6 to 4e-6, printed). */
    const double tol = 2e-5;
    double md = 0;
    const cJSON *pos = item(g, "positions"), *rows = item(g, "logit_rows");
    for (int i = 0; i < cJSON_GetArraySize(pos); i++) {
        int p = cJSON_GetArrayItem(pos, i)->valueint;
        const cJSON *row = cJSON_GetArrayItem(rows, i);
        assert_int_equal(cJSON_GetArraySize(row), V);
        for (int v = 0; v < V; v++) md = fmax(md, fabs(lg[(size_t)p * V + v] - cJSON_GetArrayItem(row, v)->valuedouble));
    }
    /* every position: log-sum-exp and the next token's logit (so the NLL of each position) */
    const cJSON *lse = item(g, "logsumexp"), *next = item(g, "next_logit");
    assert_int_equal(cJSON_GetArraySize(lse), n);
    double ml = 0;
    for (int t = 0; t < n; t++) {
        const float *z = lg + (size_t)t * V;
        double mx = z[0], s = 0;
        for (int v = 1; v < V; v++) mx = fmax(mx, z[v]);
        for (int v = 0; v < V; v++) s += exp(z[v] - mx);
        ml = fmax(ml, fabs(mx + log(s) - cJSON_GetArrayItem(lse, t)->valuedouble));
        if (t < n - 1) md = fmax(md, fabs(z[tok[t + 1]] - cJSON_GetArrayItem(next, t)->valuedouble));
    }
    print_message("%s: max |dlogit| %.3g, max |dlogsumexp| %.3g\n", name, md, ml);
    if (md > tol || ml > tol) fail_msg("%s: logits differ from transformers' by %.3g (log-sum-exp %.3g) > %g", name, md, ml, tol);

    /* Routing: the same experts in the same order for every token of every MoE layer; gate weights
     * come out of an fp32 softmax in both (transformers computes the router softmax in fp32 too):
     * to 1e-5. */
    const cJSON *rt = item(g, "routing"), *layer;
    int n_moe = 0;
    for (int l = 0; l < L; l++) n_moe += m->cfg.layer_is_moe[l];
    assert_int_equal(cJSON_GetArraySize(rt), n_moe);
    double mg = 0;
    cJSON_ArrayForEach(layer, rt) {
        int l = item(layer, "layer")->valueint;
        assert_true(l >= 0 && l < L && m->cfg.layer_is_moe[l]);
        const cJSON *ex = item(layer, "experts"), *gw = item(layer, "gates");
        for (int t = 0; t < n; t++)
            for (int j = 0; j < k; j++) {
                size_t o = ((size_t)l * n + t) * k + j;
                int want = cJSON_GetArrayItem(cJSON_GetArrayItem(ex, t), j)->valueint;
                if (r.ids[o] != want)
                    fail_msg("%s: layer %d token %d: expert %d of the top-%d is %d, transformers routes to %d", name, l, t,
                             j, k, r.ids[o], want);
                mg = fmax(mg, fabs(r.gates[o] - cJSON_GetArrayItem(cJSON_GetArrayItem(gw, t), j)->valuedouble));
            }
    }
    if (n_moe) print_message("%s: routing identical (%d MoE layers), max |dgate| %.3g\n", name, n_moe, mg);
    assert_true(mg < 1e-5);
    free(lg), free(tok);
    tu_routing_free(&r);
    m2d_engine_free(e);
    m2d_model_close(m);
}

static void check_model(const char *name) {
    cJSON *g = load_golden(name);
    int student = cJSON_HasObjectItem(g, "teacher");
    char *dir = student ? build_student(g) : build_teacher(g);
    char sha[65], *st = m2d_path_join(dir, "model.safetensors");
    file_sha256(st, sha);
    const char *want = str(g, "safetensors_sha256");
    if (strcmp(sha, want) != 0)
        fail_msg("%s: model.safetensors differs from the golden's (sha256 %s, want %s)%s", name, sha, want,
                 student ? ": the student converts differently" : ": moe2dense's writer no longer writes what save_pretrained writes");
    if (student) {
        /* transformers re-wrote moe2dense's student unchanged (recorded when the golden was made) */
        assert_string_equal(str(g, "resaved_sha256"), want);
        char *cfg = m2d_path_join(dir, "config.json");
        char *text = m2d_read_file(cfg, NULL);
        assert_non_null(text);
        assert_string_equal(text, str(g, "config_json"));
        free(text), free(cfg);
    }
    check_forward(g, dir);
    free(st), free(dir);
    cJSON_Delete(g);
}

/* Qwen3-MoE in bf16: renormalised top-k, a dense layer, untied embeddings. */
static void qwen3moe_bf16(void **state) { (void)state; check_model("qwen3moe"); }
/* Qwen3-MoE in f32: top-k not renormalised, tied embeddings, decoder_sparse_step 2, 3:1 GQA. */
static void qwen3moe_f32(void **state) { (void)state; check_model("qwen3moe-f32"); }
/* dense Qwen3 (the student's family), bf16, tied embeddings. */
static void qwen3_dense(void **state) { (void)state; check_model("qwen3"); }
/* the dense student of the bf16 teacher (zero-padded dense layer), in transformers' Qwen3ForCausalLM. */
static void student_dense(void **state) { (void)state; check_model("qwen3moe-student"); }
/* the smaller MoE (--target moe, groups), in transformers' Qwen3MoeForCausalLM. */
static void student_moe(void **state) { (void)state; check_model("qwen3moe-student-moe"); }

static int setup(void **state) {
    (void)state;
    char tmpl[] = "/tmp/m2d-test-hf-XXXXXX";
    if (!mkdtemp(tmpl)) return -1;
    g_work = m2d_strdup(tmpl);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    tu_rm_rf(g_work);
    free(g_work);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(qwen3moe_bf16), cmocka_unit_test(qwen3moe_f32), cmocka_unit_test(qwen3_dense),
        cmocka_unit_test(student_dense), cmocka_unit_test(student_moe),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
