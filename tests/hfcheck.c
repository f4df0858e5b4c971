/* hfcheck — moe2dense against transformers' goldens (see hfcheck.h). */
#include "hfcheck.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "base/util.h"
#include "calib/calib.h"
#include "engine/backend.h"
#include "engine/engine.h"
#include "io/mxfp4.h"
#include "model/model.h"
#include "routing.h"
#include "testmodel.h"

/* releases for tu_defer: a check's resources are freed even when it fails (testutil.h) */
static void release_json(void *p) { cJSON_Delete(p); }
static void release_stats(void *p) { m2d_calib_stats_free(p); }

const char *hf_golden_dir(void) {
    const char *d = getenv("M2D_HF_GOLDEN");
    return d ? d : "tests/golden/hf";
}

cJSON *hf_load_golden(const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.json", hf_golden_dir(), name);
    size_t n;
    char *text = m2d_read_file(path, &n);
    if (!text) fail_msg("%s", m2d_errmsg());
    cJSON *g = cJSON_ParseWithLength(text, n);
    free(text);
    if (!g) fail_msg("%s: invalid JSON", path);
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
/* The pruned student of golden G: `moe2dense prune` of TEACHER with the golden's importance file,
 * which must be kept as up to date (the same teacher bytes and windows): the kept indices are then
 * the golden's, whatever this CPU's rounding of the importance would give. */
static char *build_pruned(const cJSON *g, const char *work, const char *teacher) {
    const char *name = hf_str(g, "name"), *text = hf_str(g, "calib_text"), *imp_text = hf_str(g, "importance_json");
    char *dir = m2d_path_join(work, name), *calib = m2d_strfmt("%s/%s.txt", work, name);
    char *imp = m2d_strfmt("%s/%s.importance.json", work, name);
    tu_write(calib, text, strlen(text));
    tu_write(imp, imp_text, strlen(imp_text));
    char *cmd = m2d_strfmt("%s prune --teacher %s --data %s --importance %s --out %s", tu_bin(), teacher, calib, imp, dir);
    const cJSON *a;
    cJSON_ArrayForEach(a, hf_item(g, "prune")) {
        char *more = m2d_strfmt("%s '%s'", cmd, a->valuestring);
        free(cmd);
        cmd = more;
    }
    char *out = NULL, *err = NULL;
    if (tu_run(cmd, &out, &err) != 0) fail_msg("%s: %s", cmd, err);
    if (!out || !strstr(out, "kept up-to-date")) fail_msg("%s: the golden's importance file was not kept: %s", cmd, err);
    free(out), free(err), free(cmd), free(calib), free(imp);
    return dir;
}

char *hf_build_student(const cJSON *g, const char *work, hf_build_fn build) {
    const char *name = hf_str(g, "name");
    cJSON *tg = hf_load_golden(hf_str(g, "teacher"));
    char *teacher = build(tg, work);
    cJSON_Delete(tg);
    if (cJSON_HasObjectItem(g, "prune")) {
        char *dir = build_pruned(g, work, teacher);
        free(teacher);
        return dir;
    }
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
    size_t mark = tu_defer_mark();
    if (m2d_calib_run(m, tok, n, &co, &st) != 0) fail_msg("%s: calibrate: %s", name, m2d_errmsg());
    tu_defer(st, release_stats);
    assert_int_equal(cJSON_GetArraySize(layers), st->n_layers);
    int E = m->cfg.num_experts, d = m->cfg.hidden_size, i = 0;
    const char *names[] = {"n", "sum_p", "sum_p_sel", "sum_g", "sum_g2", "sum_f", "sum_f2", "sum_gf", "sum_g2f2"};
    double md = 0, *scale = tu_defer(m2d_malloc(sizeof(double) * (size_t)E * E), free);
    double *rms = tu_defer(m2d_malloc(sizeof(double) * (size_t)E), free);
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
        /* the router logits' Gram (bias included: GPT-OSS), on the same scale and the same bound: its
         * logits are dots of d terms of the same FFN input; every calibration golden has it */
        const double *L = ls->logit_gram;
        for (int a = 0; a < E * E; a++) scale[a] = sqrt(L[(size_t)(a / E) * E + a / E] * L[(size_t)(a % E) * E + a % E]);
        double wl = worst(L, hf_item(ref, "logit_gram"), E * E, scale, 1);
        if (wg > 2e-5 || wm > 2e-5 || wl > 2e-5)
            fail_msg("%s: layer %d: Gram matrix / mean outputs / router logits' Gram differ by %.3g / %.3g / %.3g "
                     "(relative)", name, ls->layer, wg, wm, wl);
        md = fmax(md, fmax(fmax(wg, wm), wl));
    }
    print_message("%s: calibration statistics of %d MoE layers match transformers', max relative difference %.3g\n",
                  name, i, md);
    tu_release(mark);
}

/* Logits and routing of the engine on the golden's tokens against transformers' float64 forward. */
static void release_routing(void *p) {
    tu_routing_free(p);
    free(p);
}
static void release_engine(void *p) { m2d_engine_free(p); }
static void release_model(void *p) { m2d_model_close(p); }

/* The engine on BACKEND (fp32) over the golden's tokens: its logits and routing against
 * transformers'. */
static void check_forward_on(const cJSON *g, const m2d_model *m, const int32_t *tok, int n, const char *backend) {
    const char *name = hf_str(g, "name");
    size_t mark = tu_defer_mark();
    int V = m->cfg.vocab_size, L = m->cfg.num_hidden_layers;
    int k = m->cfg.num_experts_per_tok > 0 ? m->cfg.num_experts_per_tok : 1;
    tu_routing *rp = tu_defer(m2d_malloc(sizeof *rp), release_routing);
    tu_routing_init(rp, L, n, k);
    m2d_engine *e;
    if (m2d_engine_open(m, &(m2d_engine_opts){.backend = backend, .n_threads = 2}, &e) != 0)
        fail_msg("%s on %s: %s", name, backend, m2d_errmsg());
    tu_defer(e, release_engine);
    m2d_engine_set_moe_hook(e, tu_routing_hook, rp);
    float *lg = tu_defer(m2d_malloc(sizeof(float) * (size_t)n * V), free);
    if (m2d_engine_logits(e, tok, n, lg) != 0) fail_msg("%s on %s: %s", name, backend, m2d_errmsg());

    /* Logits: the engine works in fp32 on the checkpoint's exact weights; transformers' reference
     * is float64 except where its modelling code itself rounds to fp32 (RMSNorm, the attention
     * and router softmax). Each fp32 dot product here has at most 128 terms of size <= 1 (weights
     * <= 1/4 in magnitude times normalised activations), relative error <= ~sqrt(128)·6e-8 ~ 7e-7 of
     * its terms' magnitude; over <= 4 layers × (attention + FFN) through the residual stream, the
     * final norm and an LM-head dot of 64 terms, logits of magnitude <= ~5 are expected within
     * ~5·7e-7·sqrt(8)·2 ~ 2e-5, which is asserted (measured: 1e-6 to 4e-6, printed). The cuda
     * backend at fp32 is held to the same: its GEMMs accumulate fp32 products in fp32 (cuBLASLt's
     * CUBLAS_COMPUTE_32F, never TF32) and its attention splits each operand in two (products
     * within 2^-22, backend_cuda.cu), the same error model in another order. */
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
    print_message("%s (%s): max |dlogit| %.3g, max |dlogsumexp| %.3g\n", name, backend, md, ml);
    if (md > tol || ml > tol)
        fail_msg("%s on %s: logits differ from transformers' by %.3g (log-sum-exp %.3g) > %g", name, backend, md, ml, tol);

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
                if (rp->ids[o] != want)
                    fail_msg("%s on %s: layer %d token %d: expert %d of the top-%d is %d, transformers routes to %d",
                             name, backend, l, t, j, k, rp->ids[o], want);
                mg = fmax(mg, fabs(rp->gates[o] - cJSON_GetArrayItem(cJSON_GetArrayItem(gw, t), j)->valuedouble));
            }
    }
    if (n_moe) print_message("%s (%s): routing identical (%d MoE layers), max |dgate| %.3g\n", name, backend, n_moe, mg);
    assert_true(mg < 1e-5);
    tu_release(mark);
}

/* a registered backend that is not the CPU's (cuda in a CUDA=1 build), or NULL; *ABSENT set where
 * its device is missing on this machine */
static const char *device_backend(int *absent) {
    for (int i = 0; i < m2d_backend_count(); i++) {
        const char *b = m2d_backend_kind_at(i)->name;
        if (strcmp(b, "cpu") == 0) continue;
        *absent = tu_device_absent(b);
        return b;
    }
    return NULL;
}

/* The forward on the CPU and on a device backend where the build has one (issue 23: every
 * family's golden on the GPU). Without its device the device run is left out with a line saying
 * so, or fails under M2D_REQUIRE_GPU (the GPU runner, tools/gpu_run.sh). */
void hf_check_forward(const cJSON *g, const char *dir) {
    const char *name = hf_str(g, "name");
    size_t mark = tu_defer_mark();
    m2d_model *m;
    if (m2d_model_open(dir, &m) != 0) fail_msg("%s: %s", name, m2d_errmsg());
    tu_defer(m, release_model);
    assert_string_equal(m->cfg.arch, hf_str(g, "class"));
    const cJSON *toks = hf_item(g, "tokens");
    int n = cJSON_GetArraySize(toks);
    int32_t *tok = tu_defer(m2d_malloc(sizeof(int32_t) * (size_t)n), free);
    for (int t = 0; t < n; t++) tok[t] = cJSON_GetArrayItem(toks, t)->valueint;
    int absent = 0;
    const char *dev = device_backend(&absent);
    if (dev && absent && getenv("M2D_REQUIRE_GPU")) fail_msg("M2D_REQUIRE_GPU is set, but: %s", m2d_errmsg());
    if (dev && !absent) check_forward_on(g, m, tok, n, dev);
    else if (dev) print_message("%s: not run on %s: no GPU\n", name, dev);
    check_forward_on(g, m, tok, n, "cpu");
    const cJSON *rt = hf_item(g, "routing");
    if (cJSON_HasObjectItem(cJSON_GetArrayItem(rt, 0), "calib_stats")) check_calib(name, m, tok, n, rt, "calib_stats");
    tu_release(mark);
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
        /* exact on every CPU: each value is an FP4 table entry (2 significant bits) times a power of
         * two (E8M0 scale), exactly representable in fp32 (subnormals included), in moe2dense and in
         * transformers alike: no rounding anywhere, so the bytes (sha256) are fixed */
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


/* the value of option OPT in golden G's convert arguments (NULL when absent) */
static const char *convert_opt(const cJSON *g, const char *opt) {
    const cJSON *e;
    int next = 0;
    cJSON_ArrayForEach(e, hf_item(g, "convert")) {
        if (next) return e->valuestring;
        next = !strcmp(e->valuestring, opt);
    }
    return NULL;
}

/* Whether the student's bytes are the same on every CPU by construction: experts scored by their
 * routed counts (freq: integers, the same whatever the summation order, given routing decisions
 * far from ties, which the teachers' goldens check identical to transformers'), round-robin
 * groups of them, merge weights n_e / Σ n (one correctly rounded fp64 division of integers) and no
 * floating-point scale (uniform: 1/k, exact; none for an MoE student); every other tensor copied.
 * Any other scoring or scaling is computed from calibration statistics whose last bits depend on
 * the CPU's GEMM kernels (oneDNN / OpenBLAS pick summation orders per ISA), so a few merged
 * weights round to the other bf16 neighbour: check_student_plan and check_student_weights. */
static int student_bytes_exact(const cJSON *g) {
    if (cJSON_HasObjectItem(g, "prune")) return 1; /* copies of the teacher's values at the golden's indices */
    const char *sc = convert_opt(g, "--scoring"), *al = convert_opt(g, "--scaling");
    return sc && !strcmp(sc, "freq") && (!al || !strcmp(al, "uniform"));
}

/* PLAN (moe2dense.json's "layers" entry of one layer) has the golden's decisions ENTRY exactly */
static void check_decisions(const char *name, const cJSON *entry, const cJSON *plan) {
    const char *keys[] = {"selected", "groups"};
    for (int i = 0; i < 2; i++)
        if (!cJSON_Compare(hf_item(entry, keys[i]), hf_item(plan, keys[i]), 1))
            fail_msg("%s: layer %d: %s differ from the golden's", name, hf_item(entry, "layer")->valueint, keys[i]);
}

/* |got / want - 1| <= 1e-12 for each of N values of the JSON array GOT against WANT: both fp64
 * from the same statistics (a handful of roundings of 2^-53 each) */
static void check_fp64(const char *name, int layer, const char *what, const cJSON *got, const double *want, int n) {
    assert_int_equal(cJSON_GetArraySize(got), n);
    for (int i = 0; i < n; i++)
        if (fabs(cJSON_GetArrayItem(got, i)->valuedouble - want[i]) > 1e-12 * fabs(want[i]))
            fail_msg("%s: layer %d: %s[%d] is %.17g, the reference %.17g", name, layer, what, i,
                     cJSON_GetArrayItem(got, i)->valuedouble, want[i]);
}

/* Decisions at least this far apart (relative) cannot flip between CPUs: the statistics agree with
 * transformers' float64 to 2e-5 relative (check_calib), ACP = CP sqrt(G_ee / N) to ~3e-5, so two
 * scores closer than 2 x 3e-5 could swap; 1e-4 leaves a margin. */
#define DECISION_MARGIN 1e-4

/* rank ORDER of the E scores S descending (ties -> lower index), as SPEC §2-3 select and group */
static void rank_scores(const double *s, int E, int *order) {
    for (int i = 0; i < E; i++) order[i] = i;
    for (int i = 1; i < E; i++)
        for (int j = i; j > 0 && (s[order[j]] > s[order[j - 1]] ||
                                  (s[order[j]] == s[order[j - 1]] && order[j] < order[j - 1])); j--) {
            int t = order[j];
            order[j] = order[j - 1], order[j - 1] = t;
        }
}

/* The float plan of an ACP / avg-CP student (SPEC §2-4) recomputed in fp64 from the statistics it
 * was converted from: scores ACP_e = CP_e sqrt(G_ee / N), CP_e = Σp_sel / n_e; merge weights
 * s_e / Σ_g s; α_g = mean CP of group g. The scores of moe2dense.json (PLAN) match to 1e-12, the
 * decisions are the golden's, and every decision (the K-th score against the next, neighbours in
 * the round-robin order) is DECISION_MARGIN from a tie. Writes the merge weights and α of each
 * group into C and ALPHA ([k][K/k], [k]). */
static void check_float_plan(const char *name, const m2d_layer_stats *ls, double N, const cJSON *plan, double *c,
                             double *alpha) {
    int E = ls->E, K = cJSON_GetArraySize(hf_item(plan, "selected")), l = ls->layer;
    double *cp = m2d_malloc(sizeof(double) * E), *acp = m2d_malloc(sizeof(double) * E);
    int *order = m2d_malloc(sizeof(int) * E);
    tu_defer(cp, free), tu_defer(acp, free), tu_defer(order, free);
    for (int e = 0; e < E; e++) {
        cp[e] = ls->n[e] > 0 ? ls->sum_p_sel[e] / ls->n[e] : 0;
        acp[e] = cp[e] * sqrt(ls->gram[(size_t)e * E + e] / N);
    }
    check_fp64(name, l, "scores", hf_item(plan, "scores"), acp, E);
    rank_scores(acp, E, order);
    for (int r = 0; r < K && r + 1 < E; r++)
        if (acp[order[r]] - acp[order[r + 1]] < DECISION_MARGIN * acp[order[r]])
            fail_msg("%s: layer %d: scores of experts %d and %d within %g of a tie: the golden's decisions are "
                     "not exact on every CPU", name, l, order[r], order[r + 1], DECISION_MARGIN);
    const cJSON *grp, *mw = hf_item(plan, "merge_weights");
    int gi = 0, per = 0;
    cJSON_ArrayForEach(grp, hf_item(plan, "groups")) {
        const cJSON *e;
        double sum = 0, cps = 0;
        per = cJSON_GetArraySize(grp);
        cJSON_ArrayForEach(e, grp) sum += acp[e->valueint], cps += cp[e->valueint];
        int j = 0;
        cJSON_ArrayForEach(e, grp) c[gi * per + j++] = sum > 0 ? acp[e->valueint] / sum : 1.0 / per;
        alpha[gi] = cps / per;
        check_fp64(name, l, "merge_weights", cJSON_GetArrayItem(mw, gi), c + gi * per, per);
        gi++;
    }
    check_fp64(name, l, "alpha", hf_item(plan, "alpha"), alpha, gi);
}

/* one bf16 ulp at V: 2^(e - 7) for |V| in [2^e, 2^(e+1)) (8 significant bits) */
static double bf16_ulp(double v) {
    int e;
    frexp(fmax(fabs(v), 1e-38), &e);
    return ldexp(1.0, e - 1 - 7);
}

typedef struct {
    size_t n, differ; /* elements checked, those not equal to bf16(reference) */
} ulp_count;

/* Student element GOT (bf16) against the fp64 reference REF: within one bf16 ulp (moe2dense merges
 * in fp32/fp64 then rounds to nearest: |got - ref| <= ulp/2 + |its merge - ref|, the latter a few
 * fp32 roundings of 2^-24 relative, far below ulp/2 = 2^-9 relative); counted when it is not
 * bf16(ref) (REF near a rounding midpoint). */
static void check_ulp(const char *name, const char *what, double got, double ref, ulp_count *u) {
    if (fabs(got - ref) > bf16_ulp(ref))
        fail_msg("%s: %s: %.9g is more than one bf16 ulp from the float64 reference %.9g", name, what, got, ref);
    u->n++;
    u->differ += got != tu_bf16(ref);
}

/* element (r, c) of 2-D tensor T as fp64 */
static double at(const m2d_tensor *t, int64_t r, int64_t c) {
    float v;
    m2d_to_f32(t->dtype, t->data, r * t->shape[1] + c, 1, &v);
    return v;
}

/* The dense student's merged FFN of layer L (SPEC §4) against the fp64 merge of the teacher's
 * experts with the reference plan (C, ALPHA): gate/up rows [g d_e, (g+1) d_e) = Σ_j c_gj W_e(j),
 * down columns likewise x α_g; the shared experts' rows / columns after them, the teacher's bit
 * for bit (copied). */
static void check_merged_layer(const char *name, const m2d_model *t, const m2d_model *s, int l, const cJSON *groups,
                               const double *c, const double *alpha, ulp_count *u) {
    const m2d_layer *tl = &t->layers[l], *sl = &s->layers[l];
    int de = t->cfg.moe_intermediate_size, d = t->cfg.hidden_size, k = cJSON_GetArraySize(groups);
    const int roles[3] = {M2D_X_EXP_GATE, M2D_X_EXP_UP, M2D_X_EXP_DOWN}, dense[3] = {M2D_T_GATE, M2D_T_UP, M2D_T_DOWN};
    const int shared[3] = {M2D_T_SHARED_GATE, M2D_T_SHARED_UP, M2D_T_SHARED_DOWN};
    for (int m = 0; m < 3; m++) {
        const m2d_tensor *st = sl->w[dense[m]];
        int down = m == 2;
        for (int g = 0; g < k; g++) {
            const cJSON *grp = cJSON_GetArrayItem(groups, g);
            int per = cJSON_GetArraySize(grp);
            for (int i = 0; i < de; i++)
                for (int x = 0; x < d; x++) {
                    double ref = 0;
                    for (int j = 0; j < per; j++) {
                        const m2d_tensor *w = tl->x[roles[m]][cJSON_GetArrayItem(grp, j)->valueint];
                        ref += c[g * per + j] * (down ? at(w, x, i) : at(w, i, x));
                    }
                    if (down) ref *= alpha[g];
                    check_ulp(name, m2d_layer_role_name(dense[m]), down ? at(st, x, g * de + i) : at(st, g * de + i, x),
                              ref, u);
                }
        }
        const m2d_tensor *sh = tl->w[shared[m]];
        for (int i = 0; sh && i < (down ? sh->shape[1] : sh->shape[0]); i++)
            for (int x = 0; x < d; x++)
                if (down ? at(st, x, k * de + i) != at(sh, x, i) : at(st, k * de + i, x) != at(sh, i, x))
                    fail_msg("%s: layer %d: the shared experts' %s is not the teacher's", name, l,
                             m2d_layer_role_name(dense[m]));
    }
}

/* A student converted with floating-point scores and scales (not student_bytes_exact): the
 * golden's decisions ("plan": selected experts and groups per layer) exactly, the float plan
 * recomputed from the student's statistics (check_float_plan), and every merged weight within one
 * bf16 ulp of the fp64 merge of the teacher's experts, with the count that round the other way
 * printed and bounded: an element rounds differently only when its merge lies within ~2^-20 of its
 * value from a midpoint between bf16 neighbours, a fraction ~2 x 2^-20 / 2^-8 = 2^-11 of them;
 * 1 % leaves a wide margin and still catches a systematic error. */
static void check_student_plan(const cJSON *g, const char *dir, const char *teacher_dir, const char *stats_path) {
    const char *name = hf_str(g, "name");
    size_t mark = tu_defer_mark();
    char *mpath = tu_defer(m2d_path_join(dir, "moe2dense.json"), free);
    char *text = tu_defer(m2d_read_file(mpath, NULL), free);
    if (!text) fail_msg("%s: %s", name, m2d_errmsg());
    cJSON *mj = tu_defer(cJSON_Parse(text), release_json);
    m2d_stats *st;
    m2d_model *t, *s;
    if (m2d_stats_read(stats_path, &st) != 0) fail_msg("%s: %s", name, m2d_errmsg());
    tu_defer(st, release_stats);
    if (m2d_model_open(teacher_dir, &t) != 0) fail_msg("%s: %s", name, m2d_errmsg());
    tu_defer(t, release_model);
    if (m2d_model_open(dir, &s) != 0) fail_msg("%s: %s", name, m2d_errmsg());
    tu_defer(s, release_model);
    const cJSON *want = hf_item(g, "plan"), *layers = hf_item(mj, "layers"), *entry;
    assert_int_equal(cJSON_GetArraySize(want), cJSON_GetArraySize(layers));
    int i = 0, E = t->cfg.num_experts;
    double *c = tu_defer(m2d_malloc(sizeof(double) * E), free), *alpha = tu_defer(m2d_malloc(sizeof(double) * E), free);
    ulp_count u = {0, 0};
    cJSON_ArrayForEach(entry, want) {
        const cJSON *plan = cJSON_GetArrayItem(layers, i++);
        int l = hf_item(entry, "layer")->valueint, li = 0;
        assert_int_equal(hf_item(plan, "layer")->valueint, l);
        check_decisions(name, entry, plan);
        while (li < st->n_layers && st->layers[li].layer != l) li++;
        assert_true(li < st->n_layers);
        check_float_plan(name, &st->layers[li], st->N, plan, c, alpha);
        check_merged_layer(name, t, s, l, hf_item(plan, "groups"), c, alpha, &u);
    }
    print_message("%s: decisions the golden's, plan as recomputed in fp64, %zu merged weights within one bf16 ulp of "
                  "the fp64 merge (%zu rounded the other way)\n", name, u.n, u.differ);
    if (u.differ > u.n / 100) fail_msg("%s: %zu of %zu merged weights round away from the fp64 merge", name, u.differ, u.n);
    tu_release(mark);
}

/* Student checks: config.json byte-exact (written from the teacher's by fixed rules); transformers
 * re-saved the golden's student unchanged (recorded when the golden was made); the weights exactly
 * (sha256) where exact by construction, else the decisions and the weights within a bf16 ulp. */
static void check_student(const cJSON *g, const char *work, const char *dir, const char *sha) {
    const char *name = hf_str(g, "name"), *want = hf_str(g, "safetensors_sha256");
    assert_string_equal(hf_str(g, "resaved_sha256"), want);
    size_t mark = tu_defer_mark();
    char *cfg = tu_defer(m2d_path_join(dir, "config.json"), free);
    char *text = tu_defer(m2d_read_file(cfg, NULL), free);
    assert_non_null(text);
    assert_string_equal(text, hf_str(g, "config_json"));
    if (student_bytes_exact(g)) {
        if (strcmp(sha, want) != 0)
            fail_msg("%s: model.safetensors differs from the golden's (sha256 %s, want %s): the student converts "
                     "differently", name, sha, want);
    } else {
        char *teacher = tu_defer(m2d_path_join(work, hf_str(g, "teacher")), free);
        char *stats = tu_defer(m2d_strfmt("%s/%s.stats", work, name), free);
        check_student_plan(g, dir, teacher, stats);
    }
    tu_release(mark);
}

void hf_check_model(const char *name, const char *work, hf_build_fn build) {
    size_t mark = tu_defer_mark();
    cJSON *g = tu_defer(hf_load_golden(name), release_json);
    int student = cJSON_HasObjectItem(g, "teacher");
    char *dir = tu_defer(student ? hf_build_student(g, work, build) : build(g, work), free);
    char sha[65], *st = tu_defer(m2d_path_join(dir, "model.safetensors"), free);
    hf_file_sha256(st, sha);
    if (student) {
        check_student(g, work, dir, sha);
    } else if (strcmp(sha, hf_str(g, "safetensors_sha256")) != 0) {
        /* exact on every CPU: the grid generator's values (integer arithmetic on splitmix64 draws,
         * values every dtype holds exactly, testmodel.h) through moe2dense's writer, no
         * floating-point computation in between */
        fail_msg("%s: model.safetensors differs from the golden's (sha256 %s, want %s): moe2dense's writer no longer "
                 "writes what save_pretrained writes", name, sha, hf_str(g, "safetensors_sha256"));
    }
    hf_check_forward(g, dir);
    if (cJSON_HasObjectItem(g, "mxfp4_sha256")) hf_check_mxfp4(g, dir);
    if (cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(g, "calib")) > 0) hf_check_calib(g, dir);
    tu_release(mark);
}
