/* families: every architecture with a transformers golden (tests/golden/hf) through the engine
 * without Python — its checkpoint rebuilt from the golden's config.json and tensor list (grid
 * generator), then:
 *   - the forward against the naive float64 reference (tests/reffwd.c) on other tokens than the
 *     golden's, and the KV-cache paths (extend, branches over a cached prefix) against the full
 *     forward (tu_family_engine_check of tests/familyckpt.h);
 *   - calibrate + convert (ACP, K = 2k) to the dense student, written and re-opened: its config
 *     loads as the student architecture, every layer is dense, and its forward matches the
 *     reference too.
 * test_hf.c checks the same checkpoints against transformers itself. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "calib/calib.h"
#include "convert/convert.h"
#include "engine/backend.h"
#include "engine/engine.h"
#include "familyckpt.h"
#include "hfcheck.h"
#include "reffwd.h"
#include "testmodel.h"


/* golden NAME's checkpoint in tu_work/NAME (config.json + grid weights of its tensor list) */
static char *build(const char *name) {
    cJSON *g = hf_load_golden(name);
    char *dir = tu_family_build(g, tu_work);
    cJSON_Delete(g);
    return dir;
}

static m2d_model *open_model(const char *dir) {
    m2d_model *m;
    if (m2d_model_open(dir, &m) != 0) fail_msg("%s", m2d_errmsg());
    return m;
}

static void rand_tokens(uint64_t seed, int32_t *t, int n, int V) {
    for (int i = 0; i < n; i++) t[i] = (int32_t)(tu_rand_u64(&seed) % (uint64_t)V);
}

/* logits of the engine against the float64 reference: fp32 dots of <= 128 terms through <= 4
 * layers (see test_engine.c's bound), asserted at 5e-5 */
static double vs_reference(const m2d_model *m, const char *what) {
    int n = 40, V = m->cfg.vocab_size;
    int32_t tok[40];
    rand_tokens(11, tok, n, V);
    m2d_engine *e;
    assert_int_equal(m2d_engine_new(m, 2, &e), 0);
    float *lg = m2d_malloc(sizeof(float) * (size_t)n * V);
    double *rl = m2d_malloc(sizeof(double) * (size_t)n * V), md = 0;
    if (m2d_engine_logits(e, tok, n, lg) != 0) fail_msg("%s: %s", what, m2d_errmsg());
    tu_ref_forward(m, tok, n, rl);
    for (size_t i = 0; i < (size_t)n * V; i++) md = fmax(md, fabs(lg[i] - rl[i]));
    print_message("%s: max |dlogit| vs the float64 reference %.3g\n", what, md);
    assert_true(md < 5e-5);
    free(lg), free(rl);
    m2d_engine_free(e);
    return md;
}

/* calibrate on random tokens, convert to the dense student in memory (ACP, K = 2k or E), and check
 * the student's forward against the reference too: a dense student is an ordinary model of the
 * student architecture (written and re-read, so its config.json loads) */
static void student_vs_reference(const m2d_model *t, const char *dir, const char *what) {
    int n = 64, V = t->cfg.vocab_size;
    int32_t *tok = m2d_malloc(sizeof(int32_t) * (size_t)n);
    rand_tokens(3, tok, n, V);
    m2d_calib_opts co = {.seq_len = 32, .n_samples = 2, .n_threads = 2, .data_path = "random"};
    m2d_stats *st;
    if (m2d_calib_run(t, tok, n, &co, &st) != 0) fail_msg("%s: %s", what, m2d_errmsg());
    int k = t->cfg.num_experts_per_tok, E = t->cfg.num_experts;
    m2d_convert_opts o = {.scoring = "acp", .grouping = "rr", .scaling = "avg-cp", .K = M2D_MIN(2 * k, E)};
    m2d_convert_plan *plan;
    m2d_model *s;
    if (m2d_convert_plan_build(t, st, &o, &plan) != 0 || m2d_convert_build(t, plan, &s) != 0)
        fail_msg("%s: convert: %s", what, m2d_errmsg());
    char *out = m2d_strfmt("%s-student", dir);
    if (m2d_convert_write(t, s, plan, "stats", out) != 0) fail_msg("%s: %s", what, m2d_errmsg());
    m2d_model *w = open_model(out);
    char *label = m2d_strfmt("%s student (%s)", what, w->cfg.arch);
    vs_reference(w, label);
    for (int l = 0; l < w->cfg.num_hidden_layers; l++) assert_false(w->cfg.layer_is_moe[l]);
    free(label), free(out), free(tok);
    m2d_model_close(w);
    m2d_convert_student_free(s);
    m2d_convert_plan_free(plan);
    m2d_calib_stats_free(st);
}

/* DENSE_STUDENT false: the teacher has none (no_dense_student checks the error) */
static void family(const char *name, bool dense_student) {
    tu_family_engine_check(name, tu_work, 40, 17, 9); /* the teacher vs the reference, KV-cache paths */
    char *dir = build(name);
    m2d_model *m = open_model(dir);
    if (m->cfg.num_experts > 0 && dense_student) student_vs_reference(m, dir, name);
    m2d_model_close(m);
    free(dir);
}

/* golden NAME's teacher has no dense student: the in-memory build fails naming config.json and
 * NEEDLE (the --target moe student is checked by test_hf.c) */
static void no_dense_student(const char *name, const char *needle) {
    char *dir = build(name);
    m2d_model *t = open_model(dir);
    int32_t tok[64];
    rand_tokens(3, tok, 64, t->cfg.vocab_size);
    m2d_calib_opts co = {.seq_len = 32, .n_samples = 2, .n_threads = 1, .data_path = "random"};
    m2d_stats *st;
    if (m2d_calib_run(t, tok, 64, &co, &st) != 0) fail_msg("%s: %s", name, m2d_errmsg());
    m2d_convert_opts o = {.scoring = "acp", .grouping = "rr", .scaling = "avg-cp", .K = t->cfg.num_experts};
    m2d_convert_plan *plan;
    m2d_model *s = NULL;
    assert_int_equal(m2d_convert_plan_build(t, st, &o, &plan), 0);
    m2d_err_clear();
    assert_int_equal(m2d_convert_build(t, plan, &s), -1);
    if (!strstr(m2d_errmsg(), "config.json") || !strstr(m2d_errmsg(), needle))
        fail_msg("%s: unexpected message: %s", name, m2d_errmsg());
    m2d_convert_plan_free(plan);
    m2d_calib_stats_free(st);
    m2d_model_close(t);
    free(dir);
}

/* golden NAME's config.json with FROM replaced by TO: parsing fails with a message naming
 * config.json and NEEDLE */
static void expect_config_error(const char *name, const char *from, const char *to, const char *needle) {
    char *path = m2d_strfmt("tests/golden/hf/%s.json", name);
    char *text = m2d_read_file(path, NULL);
    assert_non_null(text);
    cJSON *g = cJSON_Parse(text);
    const char *cfg = cJSON_GetObjectItem(g, "config_json")->valuestring;
    const char *at = strstr(cfg, from);
    if (!at) fail_msg("%s: '%s' not in its config.json", name, from);
    char *edited = m2d_strfmt("%.*s%s%s", (int)(at - cfg), cfg, to, at + strlen(from));
    m2d_config c;
    m2d_err_clear();
    assert_int_equal(m2d_config_parse(edited, strlen(edited), "config.json", &c, NULL), -1);
    if (!strstr(m2d_errmsg(), "config.json") || !strstr(m2d_errmsg(), needle))
        fail_msg("%s: '%s' -> '%s': unexpected message: %s", name, from, to, m2d_errmsg());
    free(edited), free(text), free(path);
    cJSON_Delete(g);
}

/* Hub config.json TEXT parses; its parameter counts are TOTAL and ACTIVE (to 0.05B) */
static void hub_config(const char *text, const char *arch, double total, double active, double student) {
    m2d_config c;
    if (m2d_config_parse(text, strlen(text), "config.json", &c, NULL) != 0) fail_msg("%s", m2d_errmsg());
    assert_string_equal(c.arch, arch);
    m2d_param_counts p = m2d_model_param_counts(&c);
    print_message("%s: total %.3fB, active %.3fB, dense student %.3fB\n", arch, p.total / 1e9, p.active / 1e9,
                  p.dense_student / 1e9);
    assert_true(fabs(p.total / 1e9 - total) < 0.05 && fabs(p.active / 1e9 - active) < 0.05);
    assert_true(fabs(p.dense_student / 1e9 - student) < 0.05);
    m2d_config_free(&c);
}

/* allenai/OLMoE-1B-7B-0924's config.json as on the Hub (rope_theta + rope_scaling, torch_dtype):
 * 6.9B parameters, 1.3B active (the model card's numbers) */
static const char OLMOE_HUB[] =
    "{\"architectures\": [\"OlmoeForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,"
    " \"clip_qkv\": null, \"eos_token_id\": 50279, \"hidden_act\": \"silu\", \"hidden_size\": 2048,"
    " \"initializer_range\": 0.02, \"intermediate_size\": 1024, \"max_position_embeddings\": 4096,"
    " \"model_type\": \"olmoe\", \"norm_topk_prob\": false, \"num_attention_heads\": 16, \"num_experts\": 64,"
    " \"num_experts_per_tok\": 8, \"num_hidden_layers\": 16, \"num_key_value_heads\": 16,"
    " \"output_router_logits\": false, \"pad_token_id\": 1, \"rms_norm_eps\": 1e-05, \"rope_scaling\": null,"
    " \"rope_theta\": 10000.0, \"router_aux_loss_coef\": 0.01, \"tie_word_embeddings\": false,"
    " \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.43.0.dev0\", \"use_cache\": true,"
    " \"vocab_size\": 50304}";

static void olmoe_configs(void **state) {
    (void)state;
    hub_config(OLMOE_HUB, "OlmoeForCausalLM", 6.92, 1.28, 1.28);
    expect_config_error("olmoe", "\"clip_qkv\": 1.5", "\"clip_qkv\": 0", "'clip_qkv'");
    expect_config_error("olmoe", "\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 9", "'num_experts_per_tok'");
    expect_config_error("olmoe", "\"num_experts\": 8", "\"num_local_experts\": 8, \"num_experts\": 7", "'num_local_experts'");
    expect_config_error("olmoe", "\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"", "'hidden_act'");
    expect_config_error("olmoe", "\"hidden_size\": 64", "\"hidden_size\": 64, \"head_dim\": 8", "'head_dim'");
    expect_config_error("olmoe", "\"use_cache\": true", "\"use_cache\": true, \"sliding_window\": 16", "'sliding_window'");
    expect_config_error("olmoe", "\"rope_type\": \"default\"", "\"rope_type\": \"llama3\"", "'rope_type'");
    expect_config_error("olmoe", "\"intermediate_size\": 32,", "", "'intermediate_size'");
}

/* Qwen/Qwen1.5-MoE-A2.7B's config.json as on the Hub: 14.3B parameters, 2.7B active (the model
 * card's numbers); the dense student (k = 4 groups of 1408 + the shared expert's 5632) 2.69B */
static const char QWEN2MOE_HUB[] =
    "{\"architectures\": [\"Qwen2MoeForCausalLM\"], \"attention_dropout\": 0.0, \"bos_token_id\": 151643,"
    " \"decoder_sparse_step\": 1, \"eos_token_id\": 151643, \"hidden_act\": \"silu\", \"hidden_size\": 2048,"
    " \"initializer_range\": 0.02, \"intermediate_size\": 5632, \"max_position_embeddings\": 8192,"
    " \"max_window_layers\": 21, \"model_type\": \"qwen2_moe\", \"moe_intermediate_size\": 1408,"
    " \"norm_topk_prob\": false, \"num_attention_heads\": 16, \"num_experts\": 60, \"num_experts_per_tok\": 4,"
    " \"num_hidden_layers\": 24, \"num_key_value_heads\": 16, \"output_router_logits\": false,"
    " \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0, \"router_aux_loss_coef\": 0.001,"
    " \"shared_expert_intermediate_size\": 5632, \"sliding_window\": 32768, \"tie_word_embeddings\": false,"
    " \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.39.0.dev0\", \"use_cache\": true,"
    " \"use_sliding_window\": false, \"vocab_size\": 151936}";

static void qwen2moe_configs(void **state) {
    (void)state;
    hub_config(QWEN2MOE_HUB, "Qwen2MoeForCausalLM", 14.32, 2.69, 2.69);
    expect_config_error("qwen2moe", "\"shared_expert_intermediate_size\": 32,", "", "'shared_expert_intermediate_size'");
    expect_config_error("qwen2moe", "\"moe_intermediate_size\": 16", "\"moe_intermediate_size\": -1",
                        "'moe_intermediate_size'");
    expect_config_error("qwen2moe", "\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 9", "'num_experts_per_tok'");
    expect_config_error("qwen2moe", "\"qkv_bias\": true", "\"qkv_bias\": 1", "'qkv_bias'");
    expect_config_error("qwen2moe", "\"qkv_bias\": true", "\"qkv_bias\": true, \"attention_bias\": true",
                        "'attention_bias'");
    expect_config_error("qwen2moe", "\"use_sliding_window\": false", "\"use_sliding_window\": true",
                        "'use_sliding_window'");
    expect_config_error("qwen2moe", "\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"", "'hidden_act'");
    expect_config_error("qwen2moe", "\"mlp_only_layers\": [", "\"mlp_only_layers\": [7, ", "'mlp_only_layers'");
    no_dense_student("qwen2moe-f32", "'qkv_bias'");
}

/* deepseek-ai/DeepSeek-V2-Lite's config.json as on the Hub (Hub spelling of YaRN): 15.7B parameters
 * (the model card's), 2.66B active and a dense student of 2.66B counting the embeddings (by hand:
 * 27 MLA layers of 13.8M, 26 MoE layers of 64 + 2 shared experts of 3 x 2048 x 1408, a dense layer
 * of 10944; the student every layer (6 + 2) x 1408 wide) */
static const char DEEPSEEKV2_LITE_HUB[] =
    "{\"architectures\": [\"DeepseekV2ForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,"
    " \"aux_loss_alpha\": 0.001, \"bos_token_id\": 100000, \"eos_token_id\": 100001, \"first_k_dense_replace\": 1,"
    " \"hidden_act\": \"silu\", \"hidden_size\": 2048, \"initializer_range\": 0.02, \"intermediate_size\": 10944,"
    " \"kv_lora_rank\": 512, \"max_position_embeddings\": 163840, \"model_type\": \"deepseek_v2\","
    " \"moe_intermediate_size\": 1408, \"moe_layer_freq\": 1, \"n_group\": 1, \"n_routed_experts\": 64,"
    " \"n_shared_experts\": 2, \"norm_topk_prob\": false, \"num_attention_heads\": 16, \"num_experts_per_tok\": 6,"
    " \"num_hidden_layers\": 27, \"num_key_value_heads\": 16, \"pretraining_tp\": 1, \"q_lora_rank\": null,"
    " \"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64, \"rms_norm_eps\": 1e-06, \"rope_scaling\": {\"beta_fast\": 32,"
    " \"beta_slow\": 1, \"factor\": 40, \"mscale\": 0.707, \"mscale_all_dim\": 0.707,"
    " \"original_max_position_embeddings\": 4096, \"type\": \"yarn\"}, \"rope_theta\": 10000,"
    " \"routed_scaling_factor\": 1.0, \"scoring_func\": \"softmax\", \"seq_aux\": true, \"tie_word_embeddings\": false,"
    " \"topk_group\": 1, \"topk_method\": \"greedy\", \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.33.1\","
    " \"use_cache\": true, \"v_head_dim\": 128, \"vocab_size\": 102400}";

static void deepseekv2_configs(void **state) {
    (void)state;
    hub_config(DEEPSEEKV2_LITE_HUB, "DeepseekV2ForCausalLM", 15.706, 2.661, 2.660);
    expect_config_error("deepseekv2", "\"topk_method\": \"greedy\"", "\"topk_method\": \"noaux_tc\"", "'topk_method'");
    expect_config_error("deepseekv2-q", "\"n_group\": 4", "\"n_group\": 3", "'n_group'");
    expect_config_error("deepseekv2-q", "\"topk_group\": 2", "\"topk_group\": 5", "'topk_group'");
    expect_config_error("deepseekv2", "\"norm_topk_prob\": false", "\"norm_topk_prob\": true", "'norm_topk_prob'");
    expect_config_error("deepseekv2", "\"num_key_value_heads\": 4", "\"num_key_value_heads\": 2", "'num_key_value_heads'");
    expect_config_error("deepseekv2", "\"qk_rope_head_dim\": 8", "\"qk_rope_head_dim\": 7", "'qk_rope_head_dim'");
    expect_config_error("deepseekv2", "\"first_k_dense_replace\": 1", "\"first_k_dense_replace\": 4",
                        "'first_k_dense_replace'");
    expect_config_error("deepseekv2", "\"n_routed_experts\": 8", "\"n_routed_experts\": 8, \"moe_layer_freq\": 2",
                        "'moe_layer_freq'");
    expect_config_error("deepseekv2", "\"n_routed_experts\": 8", "\"n_routed_experts\": 8, \"scoring_func\": \"sigmoid\"",
                        "'scoring_func'");
    expect_config_error("deepseekv2", "\"kv_lora_rank\": 32", "\"kv_lora_rank\": 0", "'kv_lora_rank'");
    expect_config_error("deepseekv2", "\"kv_lora_rank\": 32", "\"kv_lora_rank\": 32, \"mlp_bias\": true", "'mlp_bias'");
    expect_config_error("deepseekv2-q", "\"routed_scaling_factor\": 2.5", "\"routed_scaling_factor\": 0",
                        "'routed_scaling_factor'");
}

static void deepseekv2(void **state) { (void)state; family("deepseekv2", true); }
static void deepseekv2_q(void **state) { (void)state; family("deepseekv2-q", true); }

/* routed_scaling_factor: the dense student's α = factor x the scaling rule's (uniform: 1/k), so
 * that it scales the groups as the teacher scales its gates; a smaller MoE keeps the factor in its
 * config instead (α = 1) */
static void deepseekv2_gate_factor(void **state) {
    (void)state;
    char *dir = build("deepseekv2-q");
    m2d_model *t = open_model(dir);
    int32_t tok[64];
    rand_tokens(3, tok, 64, t->cfg.vocab_size);
    m2d_calib_opts co = {.seq_len = 32, .n_samples = 2, .n_threads = 1, .data_path = "random"};
    m2d_stats *st;
    if (m2d_calib_run(t, tok, 64, &co, &st) != 0) fail_msg("%s", m2d_errmsg());
    int k = t->cfg.num_experts_per_tok;
    for (int target = 0; target < 2; target++) {
        m2d_convert_opts o = {.scoring = "acp", .grouping = "rr", .scaling = "uniform", .K = 2 * k,
                              .target = target ? M2D_TARGET_MOE : M2D_TARGET_DENSE, .n_groups = target ? 4 : 0};
        m2d_convert_plan *plan;
        if (m2d_convert_plan_build(t, st, &o, &plan) != 0) fail_msg("%s", m2d_errmsg());
        for (int g = 0; g < plan->layers[0].n_groups; g++)
            assert_true(fabs(plan->layers[0].alpha[g] - (target ? 1.0 : 2.5 / k)) < 1e-15);
        m2d_convert_plan_free(plan);
    }
    m2d_calib_stats_free(st);
    m2d_model_close(t);
    free(dir);
}

/* DeepSeek-V2's q and kv latent norms keep transformers' DeepseekV2RMSNorm default eps 1e-6
 * whatever rms_norm_eps is (modeling_deepseek_v2.py passes it only to the layer and final norms):
 * with rms_norm_eps 0.5 the engine still matches the float64 reference, which takes 1e-6 there
 * (0.5 in those two norms moved a tiny model's NLL from 110.91 to 111.54 in transformers) */
static void deepseekv2_latent_norms_keep_their_eps(void **state) {
    (void)state;
    char *dir = build("deepseekv2-q"), *cp = m2d_path_join(dir, "config.json");
    size_t n;
    char *text = m2d_read_file(cp, &n), *eps = strstr(text, "\"rms_norm_eps\"");
    assert_non_null(eps);
    char *end = strpbrk(eps + 15, ",}");
    char *edited = m2d_strfmt("%.*s\"rms_norm_eps\": 0.5%s", (int)(eps - text), text, end);
    tu_write(cp, edited, strlen(edited));
    m2d_model *m = open_model(dir);
    assert_true(m->cfg.rms_norm_eps == 0.5 && m->cfg.mla_norm_eps == 1e-6);
    vs_reference(m, "deepseekv2-q, rms_norm_eps 0.5");
    m2d_model_close(m);
    tu_write(cp, text, n); /* the checkpoint as the other tests build it */
    free(edited), free(text), free(cp), free(dir);
}

/* A random-init baseline of DeepSeek-V2 (whose o_proj the adapter binds padded, from a stored
 * tensor it claims): no stored tensor of the checkpoint written holds the teacher's bytes, and the
 * checkpoint read back is the student kept in memory (the sweep scores that one): the same logits
 * from the same bytes (fp32 engine, one machine: 1e-6 of the logits' scale allows only an
 * operand-order difference, far below what one differing weight gives). */
static void deepseekv2_random_init_written_as_kept(void **state) {
    (void)state;
    char *dir = build("deepseekv2");
    m2d_model *t = open_model(dir);
    int32_t tok[64];
    rand_tokens(4, tok, 64, t->cfg.vocab_size);
    m2d_calib_opts co = {.seq_len = 32, .n_samples = 2, .n_threads = 1, .data_path = "random"};
    m2d_stats *st;
    if (m2d_calib_run(t, tok, 64, &co, &st) != 0) fail_msg("%s", m2d_errmsg());
    m2d_convert_opts o = {.scoring = "acp", .grouping = "rr", .scaling = "uniform", .K = 2 * t->cfg.num_experts_per_tok,
                          .target = M2D_TARGET_DENSE, .baseline = M2D_BASELINE_RANDOM_INIT, .baseline_seed = 3};
    m2d_convert_plan *plan;
    m2d_model *s;
    if (m2d_convert_plan_build(t, st, &o, &plan) != 0 || m2d_convert_build(t, plan, &s) != 0) fail_msg("%s", m2d_errmsg());
    char *out = m2d_strfmt("%s-random-init", dir);
    if (m2d_convert_write(t, s, plan, "stats", out) != 0) fail_msg("%s", m2d_errmsg());
    m2d_model *w = open_model(out);
    for (int i = 0; i < m2d_st_count(w->st); i++) {
        const m2d_tensor *x = m2d_st_at(w->st, i), *y = m2d_st_find(t->st, x->name);
        if (y && x->nbytes == y->nbytes && x->nbytes > 64 && memcmp(x->data, y->data, x->nbytes) == 0)
            fail_msg("random-init: '%s' holds the teacher's bytes", x->name);
    }
    int n = 24, V = t->cfg.vocab_size;
    float *la = m2d_malloc(sizeof(float) * (size_t)n * V), *lb = m2d_malloc(sizeof(float) * (size_t)n * V);
    m2d_engine *ea, *eb;
    assert_int_equal(m2d_engine_new(s, 1, &ea), 0);
    assert_int_equal(m2d_engine_new(w, 1, &eb), 0);
    assert_int_equal(m2d_engine_logits(ea, tok, n, la), 0);
    assert_int_equal(m2d_engine_logits(eb, tok, n, lb), 0);
    double scale = 0, worst = 0;
    for (size_t i = 0; i < (size_t)n * V; i++) scale = fmax(scale, fabs(la[i])), worst = fmax(worst, fabs(la[i] - lb[i]));
    if (!(worst <= 1e-6 * scale)) fail_msg("random-init: in memory and written differ by %.3g of %.3g", worst, scale);
    m2d_engine_free(ea), m2d_engine_free(eb);
    free(la), free(lb), free(out), free(dir);
    m2d_model_close(w);
    m2d_convert_student_free(s);
    m2d_convert_plan_free(plan);
    m2d_calib_stats_free(st);
    m2d_model_close(t);
}

/* experiments.toml's cross-model-deepseek (paper §4.6) end to end on the small DeepSeek-V2 teacher,
 * scaled down with --set: calibrate, 8 configurations converted and scored (PPL, one MC task), the
 * K = 2k DO-ACP / ACP pair may share a student (dedup) */
static void cross_model_sweep(void **state) {
    (void)state;
    const char *train = tu_data_path("train-text/wikitext-103-train-prefix/wiki.train.tokens");
    const char *test = tu_data_path("wikitext-2-raw/wikitext-2-raw/wiki.test.raw");
    if (!m2d_file_exists(train) || !m2d_file_exists(test) || !m2d_file_exists(tu_data_path("arc")))
        TU_SKIP("run 'make data' (WikiText / ARC missing)");
    char *dir = build("deepseekv2"), *csv = m2d_path_join(tu_work, "cross.csv"), *out = NULL, *err = NULL;
    char *cmd = m2d_strfmt("'%s' sweep experiments.toml --experiment cross-model-deepseek --set model='%s' --set out='%s' "
                           "--set cache_dir='%s/cache' --set calibration.data='%s' --set calibration.seq_len=32 "
                           "--set calibration.samples=4 --set ppl.data='%s' --set ppl.seq_len=32 --set ppl.max_windows=2 "
                           "--set mc.limit=2 --set 'mc.tasks=[\"arc_easy\"]' --set 'mc.shots={arc_easy=0}' --threads 1",
                           tu_bin(), dir, csv, tu_work, train, test);
    if (tu_run(cmd, &out, &err) != 0) fail_msg("%s: %s", cmd, err);
    char *text = m2d_read_file(csv, NULL);
    assert_non_null(text);
    int rows = 0, ok = 0;
    for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (*l == '#' || !strncmp(l, "config_id", 9)) continue;
        rows++;
        ok += strstr(l, ",ok,") && strstr(l, ",avg-cp,") && strstr(l, ",gptq,32,2,") ? 1 : 0;
    }
    print_message("cross-model-deepseek: %d rows, %d ok\n", rows, ok);
    assert_int_equal(rows, 8);
    assert_int_equal(ok, 8);
    free(text), free(cmd), free(out), free(err), free(csv), free(dir);
}

/* A test-only backend: the CPU backend without the optional ops add_bias and sigmoid_scale, their
 * capabilities withdrawn with them (backend.h M2D_CAPS), as a backend that has not implemented them. */
static m2d_backend_ops nobias_ops;
static int nobias_create(const m2d_backend_opts *o, m2d_backend **out) {
    if (m2d_backend_new("cpu", o, out)) return -1;
    nobias_ops = *(*out)->ops;
    nobias_ops.name = "cpu-nobias";
    nobias_ops.add_bias = NULL;
    nobias_ops.sigmoid_scale = NULL;
    nobias_ops.caps &= ~(M2D_CAP(M2D_CAP_BIAS) | M2D_CAP(M2D_CAP_SIGMOID_SCALE));
    (*out)->ops = &nobias_ops;
    return 0;
}
M2D_BACKEND(nobias, "cpu-nobias", "test only: the CPU backend without add_bias and sigmoid_scale", nobias_create)

/* A model whose layers need an op the backend leaves out is refused when the engine opens, naming
 * the capability and the backend (not a crash mid-forward); a model that needs none of them runs. */
static void backend_without_an_op_refuses_the_model(void **state) {
    (void)state;
    char *dir = build("qwen2moe"); /* q/k/v biases and a gated shared expert */
    m2d_model *m = open_model(dir);
    m2d_engine *e = NULL;
    assert_int_equal(m2d_engine_open(m, &(m2d_engine_opts){.backend = "cpu-nobias", .n_threads = 1}, &e), -1);
    assert_null(e);
    uint64_t need = m2d_engine_required_caps(m); /* Qwen2-MoE: q/k/v biases and the shared expert's gate */
    assert_true((need & M2D_CAP(M2D_CAP_BIAS)) && (need & M2D_CAP(M2D_CAP_SIGMOID_SCALE)));
    assert_non_null(strstr(m2d_errmsg(), "needs 'add_bias', which backend cpu-nobias does not implement"));
    m2d_model_close(m);
    free(dir);
    dir = build("mixtral"); /* no biases, no shared expert */
    m = open_model(dir);
    assert_int_equal(m2d_engine_open(m, &(m2d_engine_opts){.backend = "cpu-nobias", .n_threads = 1}, &e), 0);
    m2d_engine_free(e);
    m2d_model_close(m);
    free(dir);
}

static void qwen2moe(void **state) { (void)state; family("qwen2moe", true); }
static void qwen2moe_f32(void **state) { (void)state; family("qwen2moe-f32", false); }

static void olmoe(void **state) { (void)state; family("olmoe", true); }
static void olmoe_bias(void **state) { (void)state; family("olmoe-bias", true); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(olmoe),
        cmocka_unit_test(olmoe_bias),
        cmocka_unit_test(olmoe_configs),
        cmocka_unit_test(qwen2moe),
        cmocka_unit_test(qwen2moe_f32),
        cmocka_unit_test(qwen2moe_configs),
        cmocka_unit_test(backend_without_an_op_refuses_the_model),
        cmocka_unit_test(deepseekv2_configs),
        cmocka_unit_test(deepseekv2),
        cmocka_unit_test(deepseekv2_q),
        cmocka_unit_test(cross_model_sweep),
        cmocka_unit_test(deepseekv2_latent_norms_keep_their_eps),
        cmocka_unit_test(deepseekv2_random_init_written_as_kept),
        cmocka_unit_test(deepseekv2_gate_factor),
    };
    return cmocka_run_group_tests(tests, tu_work_setup, tu_work_teardown);
}
