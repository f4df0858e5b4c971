/* familyckpt — grid checkpoints of Mixtral and GPT-OSS (see familyckpt.h). */
#include "familyckpt.h"
#include "routing.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "base/util.h"
#include "io/mxfp4.h"
#include "io/results.h"
#include "io/st.h"
#include "engine/engine.h"
#include "engine/gemm.h"
#include "hfcheck.h"
#include "model/model.h"
#include "reffwd.h"
#include "testmodel.h"

typedef struct {
    m2d_st_writer *w;
    uint64_t seed;
    m2d_dtype dt;
} ckpt;

/* the grid tensor NAME of shape SHAPE[NDIM] in the checkpoint's dtype */
static int grid(ckpt *k, int ndim, const int64_t *shape, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int grid(ckpt *k, int ndim, const int64_t *shape, const char *fmt, ...) {
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    float *v = m2d_malloc(sizeof(float) * (size_t)(n ? n : 1));
    m2d_testmodel_grid(name, k->seed, n, v);
    int rc = m2d_st_writer_add_f32(k->w, name, k->dt, ndim, shape, v);
    free(v);
    return rc;
}

/* NAME_blocks + NAME_scales of the grid matrices NAME [E, R, C] (see familyckpt.h) */
static int mxfp4(ckpt *k, const char *name, int64_t E, int64_t R, int64_t C) {
    int64_t n = E * R * C;
    float *v = m2d_malloc(sizeof(float) * (size_t)n);
    uint8_t *blk = m2d_malloc((size_t)n / 2), *scl = m2d_malloc((size_t)n / 32);
    m2d_testmodel_grid(name, k->seed, n, v);
    int rc = 0;
    for (int64_t r = 0; r < E * R && rc == 0; r++) rc = m2d_mxfp4_pack_row(v + r * C, C, blk + r * C / 2, scl + r * C / 32);
    char *nb = m2d_strfmt("%s_blocks", name), *ns = m2d_strfmt("%s_scales", name);
    if (rc == 0) rc = m2d_st_writer_add(k->w, nb, M2D_U8, 4, (int64_t[]){E, R, C / 32, 16}, blk);
    if (rc == 0) rc = m2d_st_writer_add(k->w, ns, M2D_U8, 3, (int64_t[]){E, R, C / 32}, scl);
    free(v), free(blk), free(scl), free(nb), free(ns);
    return rc;
}

#define L_ "model.layers.%d."
#define V1(a) ((int64_t[]){a})
#define V2(a, b) ((int64_t[]){a, b})
#define V3(a, b, c) ((int64_t[]){a, b, c})

static int embeddings(ckpt *k, const m2d_config *c) {
    int64_t V = c->vocab_size, d = c->hidden_size;
    if (grid(k, 2, V2(V, d), "model.embed_tokens.weight") || grid(k, 1, V1(d), "model.norm.weight")) return -1;
    return c->tie_word_embeddings ? 0 : grid(k, 2, V2(V, d), "lm_head.weight");
}

/* norms and q/k/v/o (with biases when BIAS) of layer L */
static int attention(ckpt *k, const m2d_config *c, int l, int bias) {
    int64_t d = c->hidden_size, q = (int64_t)c->num_attention_heads * c->head_dim;
    int64_t kv = (int64_t)c->num_key_value_heads * c->head_dim;
    if (grid(k, 1, V1(d), L_ "input_layernorm.weight", l) || grid(k, 1, V1(d), L_ "post_attention_layernorm.weight", l) ||
        grid(k, 2, V2(q, d), L_ "self_attn.q_proj.weight", l) || grid(k, 2, V2(kv, d), L_ "self_attn.k_proj.weight", l) ||
        grid(k, 2, V2(kv, d), L_ "self_attn.v_proj.weight", l) || grid(k, 2, V2(d, q), L_ "self_attn.o_proj.weight", l))
        return -1;
    if (!bias) return 0;
    return grid(k, 1, V1(q), L_ "self_attn.q_proj.bias", l) || grid(k, 1, V1(kv), L_ "self_attn.k_proj.bias", l) ||
                   grid(k, 1, V1(kv), L_ "self_attn.v_proj.bias", l) || grid(k, 1, V1(d), L_ "self_attn.o_proj.bias", l) ||
                   grid(k, 1, V1(c->num_attention_heads), L_ "self_attn.sinks", l)
               ? -1 : 0;
}

static int mixtral_layer(ckpt *k, const m2d_config *c, int l) {
    int64_t d = c->hidden_size, de = c->moe_intermediate_size;
    if (attention(k, c, l, 0) || grid(k, 2, V2(c->num_experts, d), L_ "block_sparse_moe.gate.weight", l)) return -1;
    for (int e = 0; e < c->num_experts; e++)
        if (grid(k, 2, V2(de, d), L_ "block_sparse_moe.experts.%d.w1.weight", l, e) ||
            grid(k, 2, V2(d, de), L_ "block_sparse_moe.experts.%d.w2.weight", l, e) ||
            grid(k, 2, V2(de, d), L_ "block_sparse_moe.experts.%d.w3.weight", l, e))
            return -1;
    return 0;
}

static int gptoss_layer(ckpt *k, const m2d_config *c, int l) {
    int moe = c->layer_is_moe[l];
    int64_t d = c->hidden_size, E = moe ? c->num_experts : 1, de = moe ? c->moe_intermediate_size : c->intermediate_size;
    if (attention(k, c, l, 1) || grid(k, 2, V2(E, d), L_ "mlp.router.weight", l) || grid(k, 1, V1(E), L_ "mlp.router.bias", l) ||
        grid(k, 2, V2(E, 2 * de), L_ "mlp.experts.gate_up_proj_bias", l) || grid(k, 2, V2(E, d), L_ "mlp.experts.down_proj_bias", l))
        return -1;
    if (!c->quant_method[0])
        return grid(k, 3, V3(E, d, 2 * de), L_ "mlp.experts.gate_up_proj", l) ||
                       grid(k, 3, V3(E, de, d), L_ "mlp.experts.down_proj", l)
                   ? -1 : 0;
    char gu[128], dn[128];
    snprintf(gu, sizeof gu, L_ "mlp.experts.gate_up_proj", l);
    snprintf(dn, sizeof dn, L_ "mlp.experts.down_proj", l);
    return mxfp4(k, gu, E, 2 * de, d) || mxfp4(k, dn, E, d, de) ? -1 : 0;
}

int tu_family_checkpoint(const char *dir, const char *config_json, uint64_t seed) {
    m2d_config c;
    const m2d_arch *a;
    if (m2d_config_parse(config_json, strlen(config_json), "config.json", &c, &a) != 0) return -1;
    int gptoss = strcmp(a->name, "GptOssForCausalLM") == 0;
    if (!gptoss && strcmp(a->name, "MixtralForCausalLM") != 0) {
        m2d_config_free(&c);
        return m2d_err("familyckpt: no layout for %s", a->name);
    }
    ckpt k = {m2d_st_writer_new(), seed, c.torch_dtype};
    m2d_st_writer_metadata(k.w, "format", "pt");
    int rc = m2d_mkdir_p(dir) || embeddings(&k, &c);
    for (int l = 0; l < c.num_hidden_layers && rc == 0; l++) rc = gptoss ? gptoss_layer(&k, &c, l) : mixtral_layer(&k, &c, l);
    char *cfg = m2d_path_join(dir, "config.json"), *st = m2d_path_join(dir, "model.safetensors");
    if (rc == 0) rc = m2d_write_file_atomic(cfg, config_json, strlen(config_json));
    if (rc == 0) rc = m2d_st_writer_write(k.w, st);
    free(cfg), free(st);
    m2d_st_writer_free(k.w);
    m2d_config_free(&c);
    return rc ? -1 : 0;
}

char *tu_family_build(const cJSON *g, const char *work) {
    if (cJSON_HasObjectItem(g, "tensors")) return hf_build_listed(g, work); /* goldens that list their tensors */
    char *dir = m2d_path_join(work, hf_str(g, "name"));
    if (tu_family_checkpoint(dir, hf_str(g, "config_json"), (uint64_t)hf_item(g, "seed")->valuedouble) != 0)
        fail_msg("%s: %s", hf_str(g, "name"), m2d_errmsg());
    hf_copy_tokenizer(dir);
    return dir;
}

char *tu_family_edited_config(const char *golden, const char *set, const char *del) {
    cJSON *g = hf_load_golden(golden), *j = cJSON_Parse(hf_str(g, "config_json")), *s = set ? cJSON_Parse(set) : NULL;
    for (cJSON *x = s ? s->child : NULL; x; x = x->next) {
        cJSON_DeleteItemFromObject(j, x->string);
        cJSON_AddItemToObject(j, x->string, cJSON_Duplicate(x, 1));
    }
    if (del) cJSON_DeleteItemFromObject(j, del);
    char *text = cJSON_Print(j);
    cJSON_Delete(j), cJSON_Delete(s), cJSON_Delete(g);
    return text;
}

void tu_family_config_error(const char *golden, const char *set, const char *del, const char *field) {
    char *text = tu_family_edited_config(golden, set, del);
    m2d_config c;
    assert_int_equal(m2d_config_parse(text, strlen(text), "config.json", &c, NULL), -1);
    if (!strstr(m2d_errmsg(), field)) fail_msg("%s: error '%s' does not name '%s'", golden, m2d_errmsg(), field);
    assert_null(strchr(m2d_errmsg(), '\n'));
    free(text);
}

/* log-probs of the N tokens through the KV cache (chunks [0, SPLIT), [SPLIT, N)), and of two
 * branches after truncating the cache to TRUNC, against the full forward FULL */
static void cache_paths(m2d_engine *e, const int32_t *tok, const int32_t *tg, int n, int split, int trunc,
                        const double *full) {
    double *ext = m2d_malloc(sizeof(double) * (size_t)n * 3), *b0 = ext + n, *b1 = ext + 2 * n;
    m2d_kv *kv = m2d_kv_new(e, n);
    assert_int_equal(m2d_engine_extend(e, kv, tok, split, tg, ext), 0);
    assert_int_equal(m2d_engine_extend(e, kv, tok + split, n - split, tg + split, ext + split), 0);
    m2d_kv_truncate(kv, trunc);
    const int32_t *bt[2] = {tok + trunc, tok + trunc}, *btg[2] = {tg + trunc, tg + trunc};
    int lens[2] = {n - trunc, (n - trunc) / 2};
    double *lps[2] = {b0, b1};
    assert_int_equal(m2d_engine_branches(e, kv, 2, bt, lens, btg, lps), 0);
    /* fp32 logits of the same model on a different batching: 1e-4 as the other cache tests */
    for (int i = 0; i < n; i++) assert_true(fabs(ext[i] - full[i]) < 1e-4);
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < lens[b]; i++) assert_true(fabs(lps[b][i] - full[trunc + i]) < 1e-4);
    m2d_kv_free(kv);
    free(ext);
}

/* With oneDNN's kernels forced, where oneDNN's rows are independent of their batch at the precision
 * (m2d_gemm_onednn_rows_independent: fp32 on avx512_core and up, bf16 on avx512_core_bf16 without
 * AMX) or an exact-rows plan makes them so (AMX bf16: calls padded, k split; gemm.h), the engine
 * offers a calibration hook the routed output of every MoE layer (engine.h), and the forward
 * continuing from the hook's own computation gives the logits of the same hooked forward that
 * runs the routed experts itself bit for bit, in fp32 and in bf16: shared experts, biases,
 * clamped activations, scaled gates included (exact on every CPU: the same expert outputs, bit for
 * bit, added in the same order). Where no plan was needed, those are the hookless logits too.
 * Elsewhere nothing is offered and nothing changes (the same computation twice). */
static void routed_substitution(const m2d_model *m, const int32_t *tok, int n, int V) {
    float *a = m2d_malloc(sizeof(float) * (size_t)n * V), *b = m2d_malloc(sizeof(float) * (size_t)n * V);
    float *c = m2d_malloc(sizeof(float) * (size_t)n * V);
    m2d_precision precs[] = {M2D_PREC_FP32, M2D_PREC_BF16};
    for (int p = 0; p < 2; p++) {
        m2d_engine *e;
        setenv("M2D_WEIGHT_CACHE_MB", "0", 1);
        int rc = m2d_engine_open(m, &(m2d_engine_opts){.n_threads = 2, .precision = precs[p]}, &e);
        unsetenv("M2D_WEIGHT_CACHE_MB");
        if (rc) fail_msg("%s", m2d_errmsg());
        assert_int_equal(m2d_engine_tune(e, "gemm_kernel", M2D_GEMM_ONEDNN), 0);
        assert_int_equal(m2d_engine_logits(e, tok, n, a), 0);
        tu_routed_hook_state h = {e, 0, 0, 0, 0};
        m2d_engine_set_moe_hook(e, tu_routed_hook, &h);
        assert_int_equal(m2d_engine_logits(e, tok, n, b), 0);
        assert_true(h.calls > 0);
        assert_int_equal(h.offered, tu_routed_offered_on_onednn(precs[p]) ? h.calls : 0);
        h.decline = 1;
        assert_int_equal(m2d_engine_logits(e, tok, n, c), 0);
        assert_memory_equal(c, b, sizeof(float) * (size_t)n * V);
        int rows, kc;
        if (!m2d_gemm_exact_plan(precs[p], &rows, &kc)) assert_memory_equal(a, b, sizeof(float) * (size_t)n * V);
        m2d_engine_free(e);
    }
    free(a), free(b), free(c);
}

/* the three windows' log-probs LP [3][n] through an engine with pass MODE in MEM_BUDGET bytes */
static void windows_logprobs(const m2d_model *m, const int32_t *tok, const int32_t *tg, int n, m2d_pass_mode mode,
                             size_t mem_budget, const char *spill_dir, m2d_act_mode act, m2d_precision p, double *lp) {
    m2d_engine *e;
    m2d_engine_opts o = {.n_threads = 2, .precision = p, .pass = mode, .mem_budget = mem_budget, .spill_dir = spill_dir,
                         .act = act};
    if (m2d_engine_open(m, &o, &e)) fail_msg("%s", m2d_errmsg());
    assert_int_equal(m2d_engine_pass(e)->layer_major, mode == M2D_PASS_LAYER);
    if (mem_budget == 1) assert_int_equal(m2d_engine_pass(e)->act_budget, 0); /* every window spills */
    const int32_t *toks[3] = {tok, tok + 1, tok}, *tgs[3] = {tg, tg + 1, tg};
    int lens[3] = {n, n - 1, n / 2}, first[3] = {0, 1, n / 4};
    double *lps[3] = {lp, lp + n, lp + 2 * n};
    m2d_window_set set = {3, toks, lens, tgs, first, lps};
    if (act == M2D_ACT_GROUPS) assert_int_equal(m2d_engine_layer_major_groups(e, &set), 3); /* one window each */
    if (m2d_engine_logprobs_windows(e, &set, NULL)) fail_msg("%s", m2d_errmsg());
    m2d_engine_free(e);
}

void tu_layer_major_check(const m2d_model *m, const int32_t *tok, const int32_t *tg, int n, const char *spill_dir,
                          m2d_precision p) {
    double *wm = m2d_calloc((size_t)n * 12, sizeof(double)), *lm = wm + 3 * n, *sp = wm + 6 * n, *gr = wm + 9 * n;
    windows_logprobs(m, tok, tg, n, M2D_PASS_WINDOW, 0, NULL, M2D_ACT_AUTO, p, wm);
    windows_logprobs(m, tok, tg, n, M2D_PASS_LAYER, SIZE_MAX / 2, NULL, M2D_ACT_AUTO, p, lm);
    windows_logprobs(m, tok, tg, n, M2D_PASS_LAYER, 1, spill_dir, M2D_ACT_SPILL, p, sp);
    windows_logprobs(m, tok, tg, n, M2D_PASS_LAYER, 1, spill_dir, M2D_ACT_GROUPS, p, gr);
    /* exact on every machine by construction: both orders run the same ops on the same rows of each
     * window (only the order of windows and layers differs; no op mixes windows), and the residual
     * stream is stored in fp32, the engine's own format between layers */
    assert_memory_equal(wm, lm, sizeof(double) * (size_t)n * 3);
    assert_memory_equal(wm, sp, sizeof(double) * (size_t)n * 3);
    assert_memory_equal(wm, gr, sizeof(double) * (size_t)n * 3);
    free(wm);
}

void tu_family_engine_check(const char *golden, const char *work, int n, int split, int trunc) {
    cJSON *g = hf_load_golden(golden);
    char *dir = tu_family_build(g, work);
    m2d_model *m;
    if (m2d_model_open(dir, &m) != 0) fail_msg("%s", m2d_errmsg());
    int V = m->cfg.vocab_size;
    int32_t *tok = m2d_malloc(sizeof(int32_t) * (size_t)n * 2), *tg = tok + n;
    for (int i = 0; i < n; i++) tok[i] = (i * 53 + 11) % 257;
    for (int i = 0; i < n; i++) tg[i] = tok[(i + 1) % n];
    double *ref = m2d_malloc(sizeof(double) * (size_t)n * V), *full = m2d_malloc(sizeof(double) * (size_t)n);
    float *lg = m2d_malloc(sizeof(float) * (size_t)n * V);
    tu_ref_forward(m, tok, n, ref);
    m2d_engine *e;
    assert_int_equal(m2d_engine_new(m, 2, &e), 0);
    assert_int_equal(m2d_engine_logits(e, tok, n, lg), 0);
    double md = 0;
    for (size_t i = 0; i < (size_t)n * V; i++) md = fmax(md, fabs(lg[i] - ref[i]));
    print_message("%s: engine vs float64 reference: max |dlogit| %.3g\n", golden, md);
    assert_true(md < 2e-5); /* as the transformers goldens (hfcheck.c) */
    assert_int_equal(m2d_engine_logprobs(e, tok, n, tg, 0, full), 0);
    cache_paths(e, tok, tg, n, split, trunc, full);
    m2d_engine_free(e);
    tu_layer_major_check(m, tok, tg, n, work, M2D_PREC_FP32);
    routed_substitution(m, tok, n, V);
    free(ref), free(full), free(lg), free(tok), free(dir);
    m2d_model_close(m);
    cJSON_Delete(g);
}

void tu_family_cross_model(const char *golden, const char *work) {
    cJSON *g = hf_load_golden(golden);
    char *sub = m2d_strfmt("%s/cross-model-%s", work, golden);
    if (m2d_mkdir_p(sub) != 0) fail_msg("%s", m2d_errmsg());
    char *dir = tu_family_build(g, sub), *csv = m2d_strfmt("%s/r.csv", sub);
    char *train = m2d_strdup(tu_data_path("train-text/wikitext-103-train-prefix/wiki.train.tokens"));
    char *wiki = m2d_strdup(tu_data_path("wikitext-2-raw/wikitext-2-raw/wiki.test.raw"));
    if (!m2d_file_exists(train) || !m2d_file_exists(wiki)) fail_msg("%s or %s missing: run 'make data'", train, wiki);
    /* the experiment as committed, on small windows: 4 windows of 32 tokens to calibrate, 2 for
     * the perplexity, 2 arc_easy items zero-shot (the random teachers have 256 positions) */
    char *cmd = m2d_strfmt("%s sweep experiments.toml --experiment cross-model --set model=%s --set out=%s "
                           "--set cache_dir=%s/cache --set calibration.seq_len=32 --set calibration.samples=4 "
                           "--set ppl.seq_len=32 --set ppl.max_windows=2 --set 'mc.tasks=[\"arc_easy\"]' "
                           "--set 'mc.shots={arc_easy = 0}' --set mc.limit=2 --set 'mc.data_dir=\"%s\"' "
                           "--set 'calibration.data=\"%s\"' --set 'ppl.data=\"%s\"'",
                           tu_bin(), dir, csv, sub, tu_data_path(""), train, wiki);
    char *err = NULL;
    if (tu_run(cmd, NULL, &err) != 0) fail_msg("%s: %s", cmd, err ? err : "");
    m2d_results r;
    if (m2d_results_read(csv, &r) != 0) fail_msg("%s", m2d_errmsg());
    m2d_config c;
    if (m2d_config_load(dir, &c, NULL) != 0) fail_msg("%s", m2d_errmsg());
    /* 4 scorings x 2 scalings x K in {k, 2k}; every row done, a student of width k * d_e */
    assert_int_equal(r.n_rows, 16);
    char want_dense[16];
    snprintf(want_dense, sizeof want_dense, "%d", c.num_experts_per_tok * c.moe_intermediate_size);
    for (int i = 0; i < r.n_rows; i++) {
        assert_string_equal(m2d_results_get(&r, i, "status"), "ok");
        assert_string_equal(m2d_results_get(&r, i, "d_dense"), want_dense);
        double ppl = strtod(m2d_results_get(&r, i, "ppl"), NULL), acc = strtod(m2d_results_get(&r, i, "arc_easy_acc"), NULL);
        if (!(isfinite(ppl) && ppl > 1 && acc >= 0 && acc <= 1)) fail_msg("%s: row %d: ppl %g, arc_easy %g", golden, i, ppl, acc);
    }
    print_message("%s: the cross-model experiment ran: 16 configurations, ppl and arc_easy for each\n", golden);
    m2d_config_free(&c);
    m2d_results_free(&r);
    free(err), free(cmd), free(csv), free(dir), free(sub), free(train), free(wiki);
    cJSON_Delete(g);
}
