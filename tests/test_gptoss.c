/* gptoss: GptOssForCausalLM (attention sinks, sliding + full layers, YaRN, biases, the clamped
 * SwiGLU, top-k softmax routing, MXFP4 experts) and its one-expert student.
 *  - against transformers (goldens of tools/hf_goldens_families.py): the checkpoints rebuilt byte
 *    for byte (bf16 experts; MXFP4 experts packed by io/mxfp4.c, the same bytes as the Python
 *    mirror), MXFP4 dequantisation identical to transformers' own, logits, routing, calibration
 *    statistics; the students of calibrate + convert (dense: one expert of width k·d_e routed top-1;
 *    --target moe) load in transformers' GptOssForCausalLM with the same logits;
 *  - against the float64 reference forward; KV-cache paths against the full forward;
 *  - bad checkpoints and configs (one-line errors naming file and field); parameter counts of
 *    GPT-OSS-20B (the paper's Table 18). */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "calib/calib.h"
#include "convert/convert.h"
#include "engine/engine.h"
#include "familyckpt.h"
#include "hfcheck.h"
#include "io/st.h"
#include "model/model.h"
#include "reffwd.h"


/* bf16 experts, limit 0.5 (clamps reached), layers sliding / full / sliding, window 8 < 48, YaRN */
static void golden_bf16(void **state) { (void)state; hf_check_model("gptoss", tu_work, tu_family_build); }
/* MXFP4 experts, the Hub's config spelling (rope_scaling, quantization_config), limit 7 */
static void golden_mxfp4(void **state) { (void)state; hf_check_model("gptoss-mxfp4", tu_work, tu_family_build); }
/* the dense student of the MXFP4 teacher: one bf16 expert of width k·d_e, routed top-1 */
static void golden_student(void **state) { (void)state; hf_check_model("gptoss-student", tu_work, tu_family_build); }
/* --target moe: 3 experts (router rows and biases kept), top-2 */
static void golden_student_moe(void **state) { (void)state; hf_check_model("gptoss-student-moe", tu_work, tu_family_build); }

static char *golden_dir_built(const char *name) {
    cJSON *g = hf_load_golden(name);
    char *dir = tu_family_build(g, tu_work);
    cJSON_Delete(g);
    return dir;
}

static m2d_model *open_dir(const char *dir) {
    m2d_model *m;
    if (m2d_model_open(dir, &m) != 0) fail_msg("%s", m2d_errmsg());
    return m;
}

/* the engine against the float64 reference; the KV cache (window 8 cutting into it) against the
 * full forward */
static void engine_matches_reference(void **state) {
    (void)state;
    tu_family_engine_check("gptoss", tu_work, 30, 13, 20);
    tu_family_engine_check("gptoss-mxfp4", tu_work, 30, 13, 20);
}

/* ---- bad input ---- */

/* DIR's model.safetensors rewritten: tensor DROP left out, and FN(name, data, bytes) given a copy of
 * every tensor's bytes to change */
static void rewrite_st(const char *dir, const char *drop, void (*fn)(const char *, uint8_t *, size_t)) {
    m2d_st *st;
    if (m2d_st_open(dir, &st) != 0) fail_msg("%s", m2d_errmsg());
    m2d_st_writer *w = m2d_st_writer_new();
    m2d_st_writer_metadata(w, "format", "pt");
    for (int i = 0; i < m2d_st_count(st); i++) {
        const m2d_tensor *t = m2d_st_at(st, i);
        if (drop && strcmp(t->name, drop) == 0) continue;
        uint8_t *copy = m2d_malloc(t->nbytes ? t->nbytes : 1);
        memcpy(copy, t->data, t->nbytes);
        if (fn) fn(t->name, copy, t->nbytes);
        assert_int_equal(m2d_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, copy), 0);
        free(copy);
    }
    m2d_st_close(st);
    char *p = m2d_path_join(dir, "model.safetensors");
    assert_int_equal(m2d_st_writer_write(w, p), 0);
    m2d_st_writer_free(w);
    free(p);
}

static void expect_open_error(const char *dir, const char *a, const char *b) {
    m2d_model *m = NULL;
    assert_int_equal(m2d_model_open(dir, &m), -1);
    assert_null(m);
    const char *msg = m2d_errmsg();
    if (!strstr(msg, a) || (b && !strstr(msg, b))) fail_msg("error '%s' does not name '%s' / '%s'", msg, a, b ? b : "");
    assert_null(strchr(msg, '\n'));
}

static void scale_255(const char *name, uint8_t *d, size_t n) {
    if (strcmp(name, "model.layers.1.mlp.experts.down_proj_scales") == 0 && n > 5) d[5] = 255;
}

static void mxfp4_checkpoint_errors(void **state) {
    (void)state;
    char *dir = golden_dir_built("gptoss-mxfp4");
    rewrite_st(dir, "model.layers.2.mlp.experts.gate_up_proj_scales", NULL);
    expect_open_error(dir, "model.layers.2.mlp.experts.gate_up_proj_scales", "missing");
    free(dir);
    dir = golden_dir_built("gptoss-mxfp4");
    rewrite_st(dir, NULL, scale_255);
    expect_open_error(dir, "model.layers.1.mlp.experts.down_proj_scales", "non-finite");
    free(dir);
    dir = golden_dir_built("gptoss-mxfp4");
    rewrite_st(dir, "model.layers.0.mlp.router.bias", NULL);
    expect_open_error(dir, "model.layers.0.mlp.router.bias", "missing");
    free(dir);
    /* the unquantised checkpoint under a config that says MXFP4 */
    dir = golden_dir_built("gptoss");
    char *cfg = m2d_path_join(dir, "config.json");
    tu_replace_in_file(cfg, "\"architectures\"", "\"quantization_config\": {\"quant_method\": \"mxfp4\"}, \"architectures\"");
    expect_open_error(dir, "model.layers.0.mlp.experts.gate_up_proj_blocks", "missing"); /* the biases exist in both */
    free(cfg), free(dir);
}

/* m2d_model_open_lazy (issue 25: GPT-OSS calibrates without its experts dequantised all at once):
 * at every MoE layer of a layer-major pass only that layer's experts hold values; none after it;
 * the log-probs equal the eagerly opened model's bit for bit; a scale byte 255 in layer 1 is
 * reported when layer 1 is acquired, naming the tensor. */
typedef struct { const m2d_model *m; int calls, worst; } held_check;
static int count_held(void *user, const m2d_moe_event *ev) {
    held_check *h = user;
    int held = 0;
    for (int l = 0; l < h->m->cfg.num_hidden_layers; l++) held += h->m->layer_ready[l];
    h->worst = held > h->worst ? held : h->worst;
    h->calls++;
    assert_int_equal(h->m->layer_ready[ev->layer], 1);
    return 0;
}

static void lazy_experts_one_layer_at_a_time(void **state) {
    (void)state;
    char *dir = golden_dir_built("gptoss-mxfp4");
    m2d_model *eager = open_dir(dir), *lazy;
    if (m2d_model_open_lazy(dir, &lazy) != 0) fail_msg("%s", m2d_errmsg());
    int L = lazy->cfg.num_hidden_layers;
    for (int l = 0; l < L; l++) assert_int_equal(lazy->layer_ready[l], 0), assert_int_equal(eager->layer_ready[l], 1);
    assert_null(lazy->layers[0].x[M2D_X_EXP_GATE][0]->data);
    enum { N = 24 };
    int32_t tok[N + 1];
    for (int i = 0; i <= N; i++) tok[i] = (i * 37 + 5) % 200;
    double lp_lazy[N], lp_eager[N], *lps[1] = {lp_lazy};
    const int32_t *toks[1] = {tok}, *tgs[1] = {tok + 1};
    int lens[1] = {N}, first[1] = {0};
    m2d_window_set set = {1, toks, lens, tgs, first, lps};
    m2d_engine *e;
    /* a layer-major engine keeps no prepared copies (engine.c default_residency) */
    assert_int_equal(m2d_engine_open(lazy, &(m2d_engine_opts){.n_threads = 1, .pass = M2D_PASS_LAYER}, &e), 0);
    held_check h = {lazy, 0, 0};
    m2d_engine_set_moe_hook(e, count_held, &h);
    if (m2d_engine_logprobs_windows(e, &set, NULL)) fail_msg("%s", m2d_errmsg());
    m2d_engine_free(e);
    print_message("lazy MXFP4 experts: %d MoE events, at most %d layer(s) dequantised at once\n", h.calls, h.worst);
    assert_int_equal(h.calls, L);
    assert_int_equal(h.worst, 1);
    for (int l = 0; l < L; l++) assert_int_equal(lazy->layer_ready[l], 0);
    assert_int_equal(m2d_engine_open(eager, &(m2d_engine_opts){.n_threads = 1}, &e), 0);
    assert_int_equal(m2d_engine_logprobs(e, tok, N, tok + 1, 0, lp_eager), 0);
    m2d_engine_free(e);
    assert_memory_equal(lp_lazy, lp_eager, sizeof lp_lazy); /* the same values, bf16 exact either way */
    m2d_model_close(lazy), m2d_model_close(eager);
    free(dir);
}

/* a bad MXFP4 scale found when its layer is acquired, not at a lazy open */
static void lazy_experts_bad_scale(void **state) {
    (void)state;
    char *dir = golden_dir_built("gptoss-mxfp4");
    rewrite_st(dir, NULL, scale_255);
    m2d_model *lazy;
    if (m2d_model_open_lazy(dir, &lazy) != 0) fail_msg("%s", m2d_errmsg());
    assert_int_equal(m2d_model_acquire_layer(lazy, 0), 0);
    assert_int_equal(m2d_model_acquire_layer(lazy, 1), -1);
    assert_non_null(strstr(m2d_errmsg(), "model.layers.1.mlp.experts.down_proj_scales"));
    assert_non_null(strstr(m2d_errmsg(), "non-finite"));
    assert_int_equal(lazy->layer_ready[1], 0);
    assert_null(lazy->layers[1].x[M2D_X_EXP_DOWN][0]->data); /* nothing half-filled kept */
    m2d_model_close(lazy);
    free(dir);
}

static void checkpoint_errors(void **state) {
    (void)state;
    char *dir = golden_dir_built("gptoss");
    rewrite_st(dir, "model.layers.0.self_attn.sinks", NULL);
    expect_open_error(dir, "model.layers.0.self_attn.sinks", "missing");
    free(dir);
    dir = golden_dir_built("gptoss");
    rewrite_st(dir, "model.layers.2.mlp.experts.down_proj", NULL);
    expect_open_error(dir, "model.layers.2.mlp.experts.down_proj", "missing");
    free(dir);
}

static void expect_config_error(const char *set, const char *del, const char *field) {
    tu_family_config_error("gptoss", set, del, field);
}

static void config_errors_and_defaults(void **state) {
    (void)state;
    expect_config_error("{\"layer_types\": [\"sliding_attention\", \"full_attention\"]}", NULL, "'layer_types'");
    expect_config_error("{\"layer_types\": [\"sliding_attention\", \"chunked_attention\", \"full_attention\"]}", NULL,
                        "'layer_types'");
    expect_config_error("{\"sliding_window\": null}", NULL, "'sliding_window'");
    expect_config_error("{\"attention_bias\": false}", NULL, "'attention_bias'");
    expect_config_error("{\"quantization_config\": {\"quant_method\": \"gptq\"}}", NULL, "'quantization_config'");
    expect_config_error("{\"swiglu_limit\": -1.0}", NULL, "'swiglu_limit'");
    /* used as floats: 1e300 would be inf there */
    expect_config_error("{\"swiglu_limit\": 1e300}", NULL, "'swiglu_limit'");
    expect_config_error("{\"swiglu_alpha\": 1e300}", NULL, "'swiglu_alpha'");
    expect_config_error("{\"swiglu_alpha\": 0}", NULL, "'swiglu_alpha'");
    expect_config_error("{\"num_experts_per_tok\": 5}", NULL, "'num_experts_per_tok'");
    expect_config_error(NULL, "intermediate_size", "'intermediate_size'");
    /* absent: GptOssConfig's defaults (alternating layers from sliding, window 128, YaRN factor 32,
     * theta 150000, alpha 1.702, limit 7) */
    char *text = tu_family_edited_config("gptoss", NULL, "layer_types");
    cJSON *j = cJSON_Parse(text);
    const char *drop[] = {"sliding_window", "rope_parameters", "swiglu_limit", "swiglu_alpha"};
    for (int i = 0; i < 4; i++) cJSON_DeleteItemFromObject(j, drop[i]);
    free(text);
    text = cJSON_Print(j);
    m2d_config c;
    assert_int_equal(m2d_config_parse(text, strlen(text), "config.json", &c, NULL), 0);
    assert_int_equal(c.layer_window[0], 128), assert_int_equal(c.layer_window[1], 0), assert_int_equal(c.layer_window[2], 128);
    assert_int_equal(c.rope_scaling.kind, M2D_ROPE_SCALING_YARN);
    assert_true(c.rope_scaling.factor == 32 && c.rope_scaling.original_max_position_embeddings == 4096 &&
                !c.rope_scaling.truncate && c.rope_theta == 150000.0);
    assert_true(c.ops.act_alpha == 1.702f && c.ops.act_limit == 7.0f);
    assert_int_equal(c.ops.router, M2D_ROUTER_TOPK_SOFTMAX), assert_int_equal(c.ops.ffn_act, M2D_ACT_SWIGLU_CLAMP);
    m2d_config_free(&c);
    cJSON_Delete(j);
    free(text);
}

/* GPT-OSS-20B's config.json (as on the Hub, with its layer_types spelled out) */
static const char *GPTOSS_20B =
    "{\"architectures\": [\"GptOssForCausalLM\"], \"attention_bias\": true, \"eos_token_id\": 200002,"
    " \"experts_per_token\": 4, \"head_dim\": 64, \"hidden_act\": \"silu\", \"hidden_size\": 2880,"
    " \"intermediate_size\": 2880, \"max_position_embeddings\": 131072, \"model_type\": \"gpt_oss\","
    " \"num_attention_heads\": 64, \"num_experts_per_tok\": 4, \"num_hidden_layers\": 24, \"num_key_value_heads\": 8,"
    " \"num_local_experts\": 32, \"pad_token_id\": 199999, \"quantization_config\": {\"modules_to_not_convert\":"
    " [\"model.layers.*.self_attn\", \"model.layers.*.mlp.router\", \"model.embed_tokens\", \"lm_head\"],"
    " \"quant_method\": \"mxfp4\"}, \"rms_norm_eps\": 1e-05, \"rope_scaling\": {\"beta_fast\": 32.0, \"beta_slow\": 1.0,"
    " \"factor\": 32.0, \"original_max_position_embeddings\": 4096, \"rope_type\": \"yarn\", \"truncate\": false},"
    " \"rope_theta\": 150000, \"sliding_window\": 128, \"swiglu_limit\": 7.0, \"tie_word_embeddings\": false,"
    " \"torch_dtype\": \"bfloat16\", \"vocab_size\": 201088}";

/* Table 18: 20.9B total, 3.6B active, a 3.6B dense student of width 4 x 2880 = 11520 -- the active
 * and student counts without the input embedding (a lookup), as OpenAI's model card counts them */
static void parameter_counts_of_gptoss_20b(void **state) {
    (void)state;
    m2d_config c;
    assert_int_equal(m2d_config_parse(GPTOSS_20B, strlen(GPTOSS_20B), "gpt-oss-20b/config.json", &c, NULL), 0);
    m2d_param_counts p = m2d_model_param_counts(&c);
    int64_t embed = (int64_t)c.vocab_size * c.hidden_size;
    assert_true(p.total == 20914757184LL);
    assert_true(p.active - embed == 3608307264LL);
    assert_true(p.dense_student - embed == 3605956440LL);
    assert_int_equal(c.num_experts_per_tok * c.moe_intermediate_size, 11520);
    m2d_config_free(&c);
}

/* the student's config: one expert, top-1, the dense width, no quantization_config; it parses as
 * dense layers, and the inspect command shows Table 18's arithmetic */
static void student_config_and_inspect(void **state) {
    (void)state;
    char *dir = golden_dir_built("gptoss-mxfp4");
    m2d_model *m = open_dir(dir);
    char *sj;
    m2d_student_shape sh = {.moe = false, .ffn_width = 64};
    assert_int_equal(m2d_arch_student_config(m, &sh, &sj), 0);
    assert_null(strstr(sj, "quantization_config"));
    assert_non_null(strstr(sj, "\"swiglu_limit\":\t7.0")); /* floats stay floats for transformers */
    m2d_config sc;
    assert_int_equal(m2d_config_parse(sj, strlen(sj), "student", &sc, NULL), 0);
    assert_int_equal(sc.num_experts, 0), assert_int_equal(sc.intermediate_size, 64);
    for (int l = 0; l < sc.num_hidden_layers; l++) assert_false(sc.layer_is_moe[l]);
    m2d_config_free(&sc);
    m2d_student_shape one = {.moe = true, .n_experts = 1, .top_k = 1};
    free(sj);
    assert_int_equal(m2d_arch_student_config(m, &one, &sj), -1);
    assert_non_null(strstr(m2d_errmsg(), "--target dense"));
    m2d_model_close(m);
    char *cmd = m2d_strfmt("%s inspect --model %s", tu_bin(), dir), *out = NULL;
    assert_int_equal(tu_run(cmd, &out, NULL), 0);
    assert_non_null(strstr(out, "GptOssForCausalLM"));
    assert_non_null(strstr(out, "without the input embedding"));
    assert_non_null(strstr(out, "windows        0:sliding 8 1:full 2:full\n"));
    assert_non_null(strstr(out, "yarn, factor 4 over 16"));
    assert_non_null(strstr(out, "q/k/v/o biases, learned sinks per head"));
    assert_non_null(strstr(out, "limit 7;"));
    assert_non_null(strstr(out, "quantization   mxfp4 experts"));
    free(out), free(cmd), free(dir);
}

/* App. A identity with biases and the clamped SwiGLU: K = k, every group one expert (merge weight
 * 1, alpha = 1/k = 1/2), so the dense student's FFN -- gate/up and their biases concatenated, down
 * and its bias scaled by alpha and summed -- equals sum_g alpha_g f_{e_g}(x), biases included, on
 * any x. Both sides in float64 from the stored bf16 values (tests/reffwd.c); scaling by 1/2 is exact
 * in bf16, so they agree to float64 rounding (1e-12 of the output scale). */
static void dense_student_equals_alpha_weighted_experts(void **state) {
    (void)state;
    char *dir = golden_dir_built("gptoss");
    m2d_model *t = open_dir(dir);
    int32_t tok[48];
    for (int i = 0; i < 48; i++) tok[i] = (i * 53 + 7) % 257;
    m2d_calib_opts co = {.seq_len = 48, .n_samples = 1, .n_threads = 2};
    m2d_stats *st;
    if (m2d_calib_run(t, tok, 48, &co, &st) != 0) fail_msg("%s", m2d_errmsg());
    m2d_convert_opts o = {.scoring = "freq", .grouping = "rr", .scaling = "uniform", .K = 2, .target = M2D_TARGET_DENSE};
    m2d_convert_plan *p;
    m2d_model *s;
    if (m2d_convert_plan_build(t, st, &o, &p) != 0 || m2d_convert_build(t, p, &s) != 0) fail_msg("%s", m2d_errmsg());
    int d = t->cfg.hidden_size;
    double x[64], y[64], fe[64], want[64];
    uint64_t rng = 5;
    for (int li = 0; li < p->n_layers; li++) {
        const m2d_layer_plan *lp = &p->layers[li];
        assert_int_equal(lp->n_groups, 2);
        assert_non_null(s->layers[lp->layer].down_bias);
        for (int trial = 0; trial < 3; trial++) {
            for (int j = 0; j < d; j++) x[j] = 2 * tu_rand_normal(&rng), want[j] = 0; /* clamps reached (limit 0.5) */
            tu_ref_ffn(s, lp->layer, -1, x, y);
            for (int g = 0; g < 2; g++) {
                assert_true(lp->merge_w[g] == 1.0 && lp->alpha[g] == 0.5);
                tu_ref_ffn(t, lp->layer, lp->members[g], x, fe);
                for (int j = 0; j < d; j++) want[j] += lp->alpha[g] * fe[j];
            }
            double scale = 0, worst = 0;
            for (int j = 0; j < d; j++) scale = fmax(scale, fabs(want[j])), worst = fmax(worst, fabs(y[j] - want[j]));
            if (!(scale > 0 && worst <= 1e-12 * scale)) fail_msg("layer %d: |student - sum alpha f| %.3g of %.3g", lp->layer, worst, scale);
        }
    }
    m2d_convert_student_free(s);
    m2d_convert_plan_free(p);
    m2d_calib_stats_free(st);
    m2d_model_close(t);
    free(dir);
}

/* random-init draws the attention sinks as transformers initialises them, normal(0,
 * initializer_range) (GptOssPreTrainedModel._init_weights), not zeros: each a nonzero draw within
 * 6 standard deviations */
static void random_init_draws_the_sinks(void **state) {
    (void)state;
    char *dir = golden_dir_built("gptoss");
    m2d_model *t = open_dir(dir);
    int32_t tok[48];
    for (int i = 0; i < 48; i++) tok[i] = (i * 31 + 5) % 257;
    m2d_calib_opts co = {.seq_len = 48, .n_samples = 1, .n_threads = 2};
    m2d_stats *st;
    if (m2d_calib_run(t, tok, 48, &co, &st) != 0) fail_msg("%s", m2d_errmsg());
    m2d_convert_opts o = {.scoring = "freq", .grouping = "rr", .scaling = "uniform", .K = 2, .target = M2D_TARGET_DENSE,
                          .baseline = M2D_BASELINE_RANDOM_INIT, .baseline_seed = 9};
    m2d_convert_plan *p;
    m2d_model *s;
    if (m2d_convert_plan_build(t, st, &o, &p) != 0 || m2d_convert_build(t, p, &s) != 0) fail_msg("%s", m2d_errmsg());
    for (int l = 0; l < s->cfg.num_hidden_layers; l++) {
        const m2d_tensor *x = s->layers[l].sinks;
        assert_non_null(x);
        float *v = m2d_tensor_f32(x);
        for (int64_t h = 0; h < m2d_tensor_numel(x); h++)
            if (!(v[h] != 0 && fabs(v[h]) <= 6 * p->init_std)) fail_msg("layer %d: sink %lld = %g", l, (long long)h, v[h]);
        free(v);
    }
    m2d_convert_student_free(s);
    m2d_convert_plan_free(p);
    m2d_calib_stats_free(st);
    m2d_model_close(t);
    free(dir);
}

/* calibrate -> convert -> ppl -> eval through the command line */
static void pipeline_end_to_end(void **state) { (void)state; hf_check_pipeline("gptoss-student", tu_work, tu_family_build); }

/* experiments.toml's cross-model experiment (paper section 4.6) end to end through the sweep */
static void cross_model_experiment(void **state) { (void)state; tu_family_cross_model("gptoss-mxfp4", tu_work); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(golden_bf16),
        cmocka_unit_test(golden_mxfp4),
        cmocka_unit_test(golden_student),
        cmocka_unit_test(pipeline_end_to_end),
        cmocka_unit_test(cross_model_experiment),
        cmocka_unit_test(dense_student_equals_alpha_weighted_experts),
        cmocka_unit_test(random_init_draws_the_sinks),
        cmocka_unit_test(golden_student_moe),
        cmocka_unit_test(engine_matches_reference),
        cmocka_unit_test(mxfp4_checkpoint_errors),
        cmocka_unit_test(lazy_experts_one_layer_at_a_time),
        cmocka_unit_test(lazy_experts_bad_scale),
        cmocka_unit_test(checkpoint_errors),
        cmocka_unit_test(config_errors_and_defaults),
        cmocka_unit_test(parameter_counts_of_gptoss_20b),
        cmocka_unit_test(student_config_and_inspect),
    };
    return cmocka_run_group_tests(tests, tu_work_setup, tu_work_teardown);
}
