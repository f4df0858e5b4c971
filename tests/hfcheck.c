/* hfcheck — moe2dense against transformers' goldens (see hfcheck.h). */
#include "hfcheck.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "base/util.h"
#include "calib/calib.h"
#include "engine/engine.h"
#include "io/mxfp4.h"
#include "model/model.h"
#include "routing.h"
#include "testmodel.h"

const char *hf_golden_dir(void) {
    const char *d = getenv("M2D_HF_GOLDEN");
    return d ? d : "tests/golden/hf";
}

cJSON *hf_load_golden(const char *name) {
    char *path = m2d_strfmt("%s/%s.json", hf_golden_dir(), name);
    size_t n;
    char *text = m2d_read_file(path, &n);
    if (!text) fail_msg("%s", m2d_errmsg());
    cJSON *g = cJSON_ParseWithLength(text, n);
    if (!g) fail_msg("%s: invalid JSON", path);
    free(text), free(path);
    return g;
}

const cJSON *hf_item(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v) fail_msg("golden: field '%s' missing", key);
    return v;
}

const char *hf_str(const cJSON *o, const char *key) {
    const cJSON *v = hf_item(o, key);
    if (!cJSON_IsString(v)) fail_msg("golden: field '%s' is not a string", key);
    return v->valuestring;
}

void hf_file_sha256(const char *path, char out[65]) {
    size_t n;
    char *data = m2d_read_file(path, &n);
    if (!data) fail_msg("%s", m2d_errmsg());
    m2d_sha256_hex(data, n, out);
    free(data);
}

void hf_copy_tokenizer(const char *dir) {
    char *tok = m2d_path_join(hf_golden_dir(), "tokenizer.json"), *tok_to = m2d_path_join(dir, "tokenizer.json");
    tu_copy_file(tok, tok_to);
    free(tok), free(tok_to);
}

static m2d_dtype dtype_of(const char *s) {
    if (!strcmp(s, "F32")) return M2D_F32;
    if (!strcmp(s, "BF16")) return M2D_BF16;
    if (!strcmp(s, "F16")) return M2D_F16;
    fail_msg("golden: tensor dtype '%s'", s);
    return M2D_F32;
}

char *hf_build_listed(const cJSON *g, const char *work) {
    char *dir = m2d_path_join(work, hf_str(g, "name"));
    const cJSON *list = hf_item(g, "tensors"), *e;
    int n = cJSON_GetArraySize(list), i = 0;
    m2d_testmodel_tensor *t = m2d_calloc((size_t)n, sizeof *t);
    cJSON_ArrayForEach(e, list) {
        const cJSON *shape = cJSON_GetArrayItem(e, 2);
        t[i].name = cJSON_GetArrayItem(e, 0)->valuestring;
        t[i].dtype = dtype_of(cJSON_GetArrayItem(e, 1)->valuestring);
        t[i].ndim = cJSON_GetArraySize(shape);
        assert_true(t[i].ndim == 1 || t[i].ndim == 2);
        for (int k = 0; k < t[i].ndim; k++) t[i].shape[k] = (int64_t)cJSON_GetArrayItem(shape, k)->valuedouble;
        i++;
    }
    if (m2d_testmodel_write_tensors(dir, hf_str(g, "config_json"), (uint64_t)hf_item(g, "seed")->valuedouble, t, n) != 0)
        fail_msg("%s: %s", hf_str(g, "name"), m2d_errmsg());
    free(t);
    hf_copy_tokenizer(dir);
    return dir;
}

/* The student of golden G: moe2dense calibrate + convert (the golden's arguments) on its teacher. */
char *hf_build_student(const cJSON *g, const char *work, hf_build_fn build) {
    const char *name = hf_str(g, "name");
    cJSON *tg = hf_load_golden(hf_str(g, "teacher"));
    char *teacher = build(tg, work);
    cJSON_Delete(tg);
    char *dir = m2d_path_join(work, name), *calib = m2d_strfmt("%s/%s.txt", work, name);
    char *stats = m2d_strfmt("%s/%s.stats", work, name);
    const char *text = hf_str(g, "calib_text");
    tu_write(calib, text, strlen(text));
    const char *steps[2] = {"calibrate", "convert"};
    for (int s = 0; s < 2; s++) {
        char *cmd = s ? m2d_strfmt("%s convert --model %s --stats %s --out %s", tu_bin(), teacher, stats, dir)
                      : m2d_strfmt("%s calibrate --model %s --data %s --out %s", tu_bin(), teacher, calib, stats);
        const cJSON *args = hf_item(g, steps[s]), *a;
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

/* max over i of |got[i] - want[i]| / scale(i) */
static double worst(const double *got, const cJSON *want, int n, const double *scale, int scale_stride) {
    assert_int_equal(cJSON_GetArraySize(want), n);
    double w = 0;
    for (int i = 0; i < n; i++)
        w = fmax(w, fabs(got[i] - cJSON_GetArrayItem(want, i)->valuedouble) / fmax(scale[scale_stride ? i / scale_stride : 0], 1e-30));
    return w;
}

/* Calibration statistics (SPEC §1) of moe2dense on the golden's tokens (one window) against the
 * ones the golden computed from transformers' own router and expert modules in float64: LAYERS is
 * the golden's per-MoE-layer list, each entry holding "layer" and the statistics (in its member
 * SUB when given); every statistic the entry has is compared.
 * Tolerance: every statistic is a sum over 48 tokens of quantities made from fp32 expert outputs
 * (dots of <= 128 terms: relative error <= ~1e-6, the FFN input itself off by the forward's ~1e-6)
 * and fp32 softmax probabilities (~1e-7): 2e-5 relative to each statistic's own scale (the value,
 * or sqrt(G_ii G_jj) for the Gram matrix, the RMS of |f_e| for the mean output) leaves a margin;
 * the counts are exact (the routing is checked identical). */
static void check_calib(const char *name, const m2d_model *m, const int32_t *tok, int n, const cJSON *layers,
                        const char *sub) {
    m2d_calib_opts co = {.seq_len = n, .n_samples = 1, .n_threads = 2, .data_path = "golden"};
    m2d_stats *st;
    if (m2d_calib_run(m, tok, n, &co, &st) != 0) fail_msg("%s: calibrate: %s", name, m2d_errmsg());
    assert_int_equal(cJSON_GetArraySize(layers), st->n_layers);
    int E = m->cfg.num_experts, d = m->cfg.hidden_size, i = 0;
    const char *names[] = {"n", "sum_p", "sum_p_sel", "sum_g", "sum_g2", "sum_f", "sum_f2", "sum_gf", "sum_g2f2"};
    double md = 0, *scale = m2d_malloc(sizeof(double) * (size_t)E * E), *rms = m2d_malloc(sizeof(double) * (size_t)E);
    const cJSON *layer;
    cJSON_ArrayForEach(layer, layers) {
        const m2d_layer_stats *ls = &st->layers[i++];
        const cJSON *ref = sub ? hf_item(layer, sub) : layer;
        assert_int_equal(ls->layer, hf_item(layer, "layer")->valueint);
        const double *arr[] = {ls->n, ls->sum_p, ls->sum_p_sel, ls->sum_g, ls->sum_g2, ls->sum_f, ls->sum_f2, ls->sum_gf,
                               ls->sum_g2f2};
        for (size_t a = 0; a < M2D_ARRAY_LEN(arr); a++) {
            if (!cJSON_HasObjectItem(ref, names[a])) continue;
            for (int e = 0; e < E; e++) scale[e] = fabs(cJSON_GetArrayItem(hf_item(ref, names[a]), e)->valuedouble);
            double w = worst(arr[a], hf_item(ref, names[a]), E, scale, 1);
            if (w > (a == 0 ? 0 : 2e-5))
                fail_msg("%s: layer %d: calibration statistic %s differs by %.3g (relative)", name, ls->layer, names[a], w);
            md = fmax(md, w);
        }
        for (int a = 0; a < E; a++) rms[a] = sqrt(ls->gram[(size_t)a * E + a] / n);
        for (int a = 0; a < E * E; a++) scale[a] = sqrt(ls->gram[(size_t)(a / E) * E + a / E] * ls->gram[(size_t)(a % E) * E + a % E]);
        double wg = worst(ls->gram, hf_item(ref, "gram"), E * E, scale, 1);
        double wm = cJSON_HasObjectItem(ref, "mu") ? worst(ls->mu, hf_item(ref, "mu"), E * d, rms, d) : 0;
        if (wg > 2e-5 || wm > 2e-5)
            fail_msg("%s: layer %d: Gram matrix / mean outputs differ by %.3g / %.3g (relative)", name, ls->layer, wg, wm);
        md = fmax(md, fmax(wg, wm));
    }
    print_message("%s: calibration statistics of %d MoE layers match transformers', max relative difference %.3g\n",
                  name, i, md);
    free(scale), free(rms);
    m2d_calib_stats_free(st);
}

/* Logits and routing of the engine on the golden's tokens against transformers' float64 forward. */
void hf_check_forward(const cJSON *g, const char *dir) {
    const char *name = hf_str(g, "name");
    m2d_model *m;
    if (m2d_model_open(dir, &m) != 0) fail_msg("%s: %s", name, m2d_errmsg());
    assert_string_equal(m->cfg.arch, hf_str(g, "class"));
    const cJSON *toks = hf_item(g, "tokens");
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
    const cJSON *pos = hf_item(g, "positions"), *rows = hf_item(g, "logit_rows");
    for (int i = 0; i < cJSON_GetArraySize(pos); i++) {
        int p = cJSON_GetArrayItem(pos, i)->valueint;
        const cJSON *row = cJSON_GetArrayItem(rows, i);
        assert_int_equal(cJSON_GetArraySize(row), V);
        for (int v = 0; v < V; v++) md = fmax(md, fabs(lg[(size_t)p * V + v] - cJSON_GetArrayItem(row, v)->valuedouble));
    }
    /* every position: log-sum-exp and the next token's logit (so the NLL of each position) */
    const cJSON *lse = hf_item(g, "logsumexp"), *next = hf_item(g, "next_logit");
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
    const cJSON *rt = hf_item(g, "routing"), *layer;
    int n_moe = 0;
    for (int l = 0; l < L; l++) n_moe += m->cfg.layer_is_moe[l];
    assert_int_equal(cJSON_GetArraySize(rt), n_moe);
    double mg = 0;
    cJSON_ArrayForEach(layer, rt) {
        int l = hf_item(layer, "layer")->valueint;
        assert_true(l >= 0 && l < L && m->cfg.layer_is_moe[l]);
        const cJSON *ex = hf_item(layer, "experts"), *gw = hf_item(layer, "gates");
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
    if (cJSON_HasObjectItem(cJSON_GetArrayItem(rt, 0), "calib_stats")) check_calib(name, m, tok, n, rt, "calib_stats");
    free(lg), free(tok);
    tu_routing_free(&r);
    m2d_engine_free(e);
    m2d_model_close(m);
}

/* the golden's tokens as int32 (malloc'd), their count in *N */
static int32_t *golden_tokens(const cJSON *g, int *n) {
    const cJSON *toks = hf_item(g, "tokens");
    *n = cJSON_GetArraySize(toks);
    int32_t *tok = m2d_malloc(sizeof(int32_t) * (size_t)*n);
    for (int t = 0; t < *n; t++) tok[t] = cJSON_GetArrayItem(toks, t)->valueint;
    return tok;
}

void hf_check_calib(const cJSON *g, const char *dir) {
    const char *name = hf_str(g, "name");
    m2d_model *m;
    if (m2d_model_open(dir, &m) != 0) fail_msg("%s: %s", name, m2d_errmsg());
    int n;
    int32_t *tok = golden_tokens(g, &n);
    check_calib(name, m, tok, n, hf_item(g, "calib"), NULL);
    free(tok);
    m2d_model_close(m);
}

void hf_check_mxfp4(const cJSON *g, const char *dir) {
    const char *name = hf_str(g, "name");
    m2d_st *st;
    if (m2d_st_open(dir, &st) != 0) fail_msg("%s: %s", name, m2d_errmsg());
    const cJSON *h = hf_item(g, "mxfp4_sha256"), *e;
    int n = 0;
    cJSON_ArrayForEach(e, h) {
        char *nb = m2d_strfmt("%s_blocks", e->string), *ns = m2d_strfmt("%s_scales", e->string);
        const m2d_tensor *b = m2d_st_find(st, nb), *s = m2d_st_find(st, ns);
        assert_non_null(b), assert_non_null(s);
        int64_t rows = m2d_tensor_numel(s) / s->shape[s->ndim - 1], cols = s->shape[s->ndim - 1] * 32;
        float *v = m2d_malloc(sizeof(float) * (size_t)(rows * cols));
        for (int64_t r = 0; r < rows; r++)
            assert_int_equal(m2d_mxfp4_dequant_row((const uint8_t *)b->data + r * cols / 2,
                                                   (const uint8_t *)s->data + r * cols / 32, cols, v + r * cols), 0);
        char sha[65];
        m2d_sha256_hex(v, sizeof(float) * (size_t)(rows * cols), sha);
        if (strcmp(sha, e->valuestring) != 0)
            fail_msg("%s: %s: moe2dense dequantises MXFP4 differently from transformers (sha256 %s, want %s)", name,
                     e->string, sha, e->valuestring);
        free(v), free(nb), free(ns);
        n++;
    }
    print_message("%s: %d MXFP4 tensors dequantise to transformers' values exactly\n", name, n);
    m2d_st_close(st);
}

/* `moe2dense CMD` exits 0; its stdout (malloc'd) */
static char *run_ok(const char *cmd) {
    char *out = NULL, *err = NULL;
    if (tu_run(cmd, &out, &err) != 0) fail_msg("%s: %s", cmd, err ? err : "");
    free(err);
    return out;
}

/* the "ppl" of `moe2dense ppl --json` on DIR (2 windows of 32 tokens of WikiText-2 test) */
static double ppl_of(const char *dir) {
    const char *wiki = tu_data_path("wikitext-2-raw/wikitext-2-raw/wiki.test.raw");
    if (!m2d_file_exists(wiki)) fail_msg("%s missing: run 'make data'", wiki);
    char *cmd = m2d_strfmt("%s ppl --model '%s' --data '%s' --seq-len 32 --max-windows 2 --json --threads 2", tu_bin(), dir, wiki);
    char *out = run_ok(cmd), *p = strstr(out, "\"ppl\":");
    if (!p) fail_msg("%s: no \"ppl\" in %s", cmd, out);
    double v = strtod(p + 6, NULL);
    free(out), free(cmd);
    return v;
}

void hf_check_pipeline(const char *name, const char *work, hf_build_fn build) {
    cJSON *g = hf_load_golden(name);
    char *sub = m2d_path_join(work, "pipeline");
    if (m2d_mkdir_p(sub) != 0) fail_msg("%s", m2d_errmsg());
    cJSON *tg = hf_load_golden(hf_str(g, "teacher"));
    char *teacher = build(tg, sub), *student = hf_build_student(g, sub, build); /* calibrate + convert */
    /* random teachers over a 320-token vocabulary: each ppl finite and above 1 */
    double pt = ppl_of(teacher), ps = ppl_of(student);
    if (!(isfinite(pt) && isfinite(ps) && pt > 1 && ps > 1)) fail_msg("%s: ppl teacher %g, student %g", name, pt, ps);
    char *cmd = m2d_strfmt("%s eval --model '%s' --tasks arc_easy --limit 4 --data '%s' --json --threads 2", tu_bin(),
                           student, tu_data_path(""));
    char *out = run_ok(cmd);
    if (!strstr(out, "arc_easy")) fail_msg("%s: no arc_easy result in %s", cmd, out);
    print_message("%s: calibrate -> convert -> ppl (teacher %.4g, student %.4g) -> eval arc_easy: ran end to end\n",
                  name, pt, ps);
    free(out), free(cmd), free(teacher), free(student), free(sub);
    cJSON_Delete(tg), cJSON_Delete(g);
}

void hf_check_model(const char *name, const char *work, hf_build_fn build) {
    cJSON *g = hf_load_golden(name);
    int student = cJSON_HasObjectItem(g, "teacher");
    char *dir = student ? hf_build_student(g, work, build) : build(g, work);
    char sha[65], *st = m2d_path_join(dir, "model.safetensors");
    hf_file_sha256(st, sha);
    const char *want = hf_str(g, "safetensors_sha256");
    if (strcmp(sha, want) != 0)
        fail_msg("%s: model.safetensors differs from the golden's (sha256 %s, want %s)%s", name, sha, want,
                 student ? ": the student converts differently" : ": moe2dense's writer no longer writes what save_pretrained writes");
    if (student) {
        /* transformers re-wrote moe2dense's student unchanged (recorded when the golden was made) */
        assert_string_equal(hf_str(g, "resaved_sha256"), want);
        char *cfg = m2d_path_join(dir, "config.json");
        char *text = m2d_read_file(cfg, NULL);
        assert_non_null(text);
        assert_string_equal(text, hf_str(g, "config_json"));
        free(text), free(cfg);
    }
    hf_check_forward(g, dir);
    if (cJSON_HasObjectItem(g, "mxfp4_sha256")) hf_check_mxfp4(g, dir);
    if (cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(g, "calib")) > 0) hf_check_calib(g, dir);
    free(st), free(dir);
    cJSON_Delete(g);
}
