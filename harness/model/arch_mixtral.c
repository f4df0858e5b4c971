/* arch_mixtral — MixtralForCausalLM (routed SwiGLU experts w1/w3/w2, softmax router with top-k
 * renormalised, no q/k norm, sliding window per config) and its dense student MistralForCausalLM
 * (the same attention with one SwiGLU FFN of width k·d_e). Semantics of transformers'
 * modeling_mixtral.py / modeling_mistral.py and their configs: Mixtral's intermediate_size is the
 * expert width; sliding_window null (Mixtral's default) is full attention, an integer w a window
 * of w keys on every layer (Mistral's default when absent is 4096, so the student's config.json
 * spells it out). */
#include <cjson/cJSON.h>
#include <string.h>

#include "base/util.h"
#include "model/arch_qwen3.h"
#include "model/decoder.h"

static const m2d_decoder_defaults MIXTRAL = {.rope_theta = 1000000.0, .rms_norm_eps = 1e-5, .max_position_embeddings = 131072};
static const m2d_decoder_defaults MISTRAL = {.rope_theta = 10000.0, .rms_norm_eps = 1e-6, .max_position_embeddings = 131072};

/* sliding_window (null: full attention; absent: DFLT) onto every layer */
static int parse_window(const void *json, const char *path, int dflt, m2d_config *c) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive((const cJSON *)json, "sliding_window");
    if (!v) c->sliding_window = dflt;
    else if (cJSON_IsNull(v)) c->sliding_window = 0;
    else if (m2d_cfg_pos_int(json, path, "sliding_window", 1, 0, &c->sliding_window) != 0) return -1;
    if (!c->sliding_window) return 0;
    c->layer_window = m2d_malloc(sizeof(int) * (size_t)c->num_hidden_layers);
    for (int l = 0; l < c->num_hidden_layers; l++) c->layer_window[l] = c->sliding_window;
    return 0;
}

/* what Mixtral and Mistral share: sizes, silu, the window, Mistral attention (no q/k norm, no biases) */
static int parse_common(const void *json, const char *path, const m2d_decoder_defaults *d, int window_dflt,
                        m2d_config *c) {
    if (m2d_decoder_parse(json, path, d, c) != 0 || parse_window(json, path, window_dflt, c) != 0) return -1;
    c->ops = (m2d_layer_ops){.qk_norm = M2D_QK_NORM_NONE, .router = M2D_ROUTER_SOFTMAX_TOPK, .router_renorm = true,
                             .ffn_act = M2D_ACT_SWIGLU, .rope = M2D_ROPE_NEOX};
    c->decoder_sparse_step = 1;
    return 0;
}

static int mixtral_parse(const void *json, const char *path, m2d_config *c) {
    if (parse_common(json, path, &MIXTRAL, 0, c) != 0 || m2d_cfg_num_experts(json, path, &c->num_experts) != 0 ||
        m2d_cfg_pos_int(json, path, "num_experts_per_tok", 0, 2, &c->num_experts_per_tok) != 0 ||
        m2d_cfg_pos_int(json, path, "intermediate_size", 1, 0, &c->moe_intermediate_size) != 0)
        return -1;
    if (m2d_cfg_check_max(path, "num_local_experts", c->num_experts, 4096) != 0 ||
        m2d_cfg_check_max(path, "intermediate_size", c->moe_intermediate_size, 1 << 20) != 0)
        return -1;
    if (c->num_experts_per_tok > c->num_experts)
        return m2d_err1("%s: field 'num_experts_per_tok': %d exceeds num_local_experts %d", path,
                        c->num_experts_per_tok, c->num_experts);
    /* MixtralTopKRouter: softmax over all logits, top-k, then always divided by their sum */
    c->norm_topk_prob = true;
    if (m2d_config_derive_layers(c, path) != 0) return -1;
    return m2d_decoder_check(c, path);
}

static int mistral_parse(const void *json, const char *path, m2d_config *c) {
    if (parse_common(json, path, &MISTRAL, 4096, c) != 0 ||
        m2d_cfg_pos_int(json, path, "intermediate_size", 1, 0, &c->intermediate_size) != 0 ||
        m2d_cfg_check_max(path, "intermediate_size", c->intermediate_size, 1 << 20) != 0)
        return -1;
    if (m2d_config_derive_layers(c, path) != 0) return -1;
    return m2d_decoder_check(c, path);
}

static void set_item(cJSON *obj, const char *key, cJSON *v) {
    cJSON_DeleteItemFromObject(obj, key);
    cJSON_AddItemToObject(obj, key, v);
}

/* Fields whose Mistral default differs from Mixtral's, written out when the teacher leaves them to
 * its defaults (so the student computes what the teacher's attention computes). */
static void pin_mixtral_defaults(cJSON *j) {
    if (!cJSON_HasObjectItem(j, "sliding_window")) cJSON_AddNullToObject(j, "sliding_window");
    if (!cJSON_HasObjectItem(j, "rms_norm_eps")) cJSON_AddNumberToObject(j, "rms_norm_eps", MIXTRAL.rms_norm_eps);
    cJSON *rp = cJSON_GetObjectItemCaseSensitive(j, "rope_parameters");
    if (cJSON_IsObject(rp) && !cJSON_HasObjectItem(rp, "rope_theta")) cJSON_AddNumberToObject(rp, "rope_theta", MIXTRAL.rope_theta);
    else if (!cJSON_IsObject(rp) && !cJSON_HasObjectItem(j, "rope_theta")) cJSON_AddNumberToObject(j, "rope_theta", MIXTRAL.rope_theta);
}

static const char *const MIXTRAL_MOE_KEYS[] = {"num_local_experts", "num_experts", "num_experts_per_tok",
                                               "output_router_logits", "router_aux_loss_coef", "router_jitter_noise"};

static int mixtral_student_config(void *json, const m2d_student_shape *s, const char *path) {
    cJSON *j = json;
    if (s->moe) return m2d_qwen3moe_student_config(json, s, path); /* num_local_experts, num_experts_per_tok */
    pin_mixtral_defaults(j);
    set_item(j, "architectures", cJSON_CreateStringArray((const char *[]){"MistralForCausalLM"}, 1));
    set_item(j, "model_type", cJSON_CreateString("mistral"));
    set_item(j, "intermediate_size", cJSON_CreateNumber(s->ffn_width));
    for (size_t i = 0; i < M2D_ARRAY_LEN(MIXTRAL_MOE_KEYS); i++) cJSON_DeleteItemFromObject(j, MIXTRAL_MOE_KEYS[i]);
    return 0;
}

#define LAYER_ "model.layers.%d."
static const m2d_tensor_spec mixtral_tensors[] = {
    M2D_DECODER_TENSORS,
    {M2D_SCOPE_MOE, M2D_T_ROUTER, LAYER_ "block_sparse_moe.gate.weight", {M2D_DIM_EXPERTS, M2D_DIM_HIDDEN}, 0},
    {M2D_SCOPE_EXPERT, M2D_X_EXP_GATE, LAYER_ "block_sparse_moe.experts.%d.w1.weight", {M2D_DIM_EXPERT_FFN, M2D_DIM_HIDDEN}, 0},
    {M2D_SCOPE_EXPERT, M2D_X_EXP_UP, LAYER_ "block_sparse_moe.experts.%d.w3.weight", {M2D_DIM_EXPERT_FFN, M2D_DIM_HIDDEN}, 0},
    {M2D_SCOPE_EXPERT, M2D_X_EXP_DOWN, LAYER_ "block_sparse_moe.experts.%d.w2.weight", {M2D_DIM_HIDDEN, M2D_DIM_EXPERT_FFN}, 0},
    {0},
};

static const m2d_tensor_spec mistral_tensors[] = {
    M2D_DECODER_TENSORS,
    M2D_DECODER_DENSE_FFN_TENSORS,
    {0},
};
#undef LAYER_

M2D_ARCH(mixtral, .name = "MixtralForCausalLM",
         .summary = "Mixtral decoder (routed SwiGLU experts w1/w3/w2, softmax top-k renormalised, sliding window)",
         .parse_config = mixtral_parse, .tensors = mixtral_tensors, .student = "MistralForCausalLM",
         .student_config = mixtral_student_config, .family = "Mixtral")

M2D_ARCH(mistral, .name = "MistralForCausalLM", .summary = "Mistral dense decoder (GQA, SwiGLU, sliding window)",
         .parse_config = mistral_parse, .tensors = mistral_tensors)
