/* arch_qwen3 — dense Qwen3 (Qwen3ForCausalLM), and the attention/embedding parts shared with
 * Qwen3-MoE. Semantics follow Hugging Face transformers' Qwen3Config / Qwen3MoeConfig: fields
 * that are absent take the HF default, except sizes that determine tensor shapes (required). */
#include "model/arch_qwen3.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "base/util.h"

static int reject_features(const void *json, const char *path) {
    const char *act;
    bool b;
    if (m2d_cfg_str(json, path, "hidden_act", 0, "silu", &act) != 0) return -1;
    if (strcmp(act, "silu") != 0)
        return m2d_err1("%s: field 'hidden_act': '%s' is not supported (only silu)", path, act);
    if (m2d_cfg_bool(json, path, "attention_bias", 0, false, &b) != 0) return -1;
    if (b) return m2d_err1("%s: field 'attention_bias': true is not supported (Qwen3 has no attention biases)", path);
    if (m2d_cfg_bool(json, path, "use_sliding_window", 0, false, &b) != 0) return -1;
    if (b) return m2d_err1("%s: field 'use_sliding_window': true is not supported (full attention only)", path);
    /* newer transformers also write layer_types; only full attention is implemented */
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive((const cJSON *)json, "layer_types");
    if (lt && !cJSON_IsNull(lt)) {
        if (!cJSON_IsArray(lt)) return m2d_err1("%s: field 'layer_types': must be a list of strings", path);
        for (const cJSON *x = lt->child; x; x = x->next)
            if (!cJSON_IsString(x) || strcmp(x->valuestring, "full_attention") != 0)
                return m2d_err1("%s: field 'layer_types': only \"full_attention\" layers are supported", path);
    }
    return 0;
}

int m2d_decoder_parse(const void *json, const char *path, const m2d_decoder_defaults *d, m2d_config *c) {
    const char *mt;
    if (m2d_cfg_str(json, path, "model_type", 0, "", &mt) != 0) return -1;
    snprintf(c->model_type, sizeof c->model_type, "%s", mt);
    if (m2d_cfg_pos_int(json, path, "vocab_size", 1, 0, &c->vocab_size) != 0 ||
        m2d_cfg_pos_int(json, path, "hidden_size", 1, 0, &c->hidden_size) != 0 ||
        m2d_cfg_pos_int(json, path, "num_hidden_layers", 1, 0, &c->num_hidden_layers) != 0 ||
        m2d_cfg_pos_int(json, path, "num_attention_heads", 1, 0, &c->num_attention_heads) != 0)
        return -1;
    /* HF: num_key_value_heads None -> num_attention_heads; head_dim absent -> hidden / heads */
    if (m2d_cfg_pos_int(json, path, "num_key_value_heads", 0, c->num_attention_heads, &c->num_key_value_heads) != 0)
        return -1;
    if (!m2d_cfg_has(json, "head_dim") && c->hidden_size % c->num_attention_heads != 0)
        return m2d_err1("%s: field 'head_dim': absent and hidden_size %d is not divisible by num_attention_heads %d",
                       path, c->hidden_size, c->num_attention_heads);
    if (m2d_cfg_pos_int(json, path, "head_dim", 0, c->hidden_size / c->num_attention_heads, &c->head_dim) != 0)
        return -1;
    if (m2d_cfg_pos_int(json, path, "max_position_embeddings", 0, d->max_position_embeddings,
                        &c->max_position_embeddings) != 0 ||
        m2d_rope_parse(json, path, d->theta, c->max_position_embeddings, &c->rope_theta, &c->rope_scaling) != 0 ||
        m2d_cfg_double(json, path, "rms_norm_eps", 0, d->rms_norm_eps, &c->rms_norm_eps) != 0 ||
        m2d_cfg_bool(json, path, "tie_word_embeddings", 0, false, &c->tie_word_embeddings) != 0 ||
        m2d_cfg_int_or_null(json, path, "bos_token_id", &c->bos_token_id) != 0 ||
        m2d_cfg_int_or_null(json, path, "eos_token_id", &c->eos_token_id) != 0 ||
        m2d_cfg_torch_dtype(json, path, &c->torch_dtype) != 0)
        return -1;
    /* limits far beyond any released model; they keep every parameter count below 2^60 */
    if (m2d_cfg_check_max(path, "vocab_size", c->vocab_size, 1 << 24) != 0 ||
        m2d_cfg_check_max(path, "hidden_size", c->hidden_size, 1 << 16) != 0 ||
        m2d_cfg_check_max(path, "num_hidden_layers", c->num_hidden_layers, 1024) != 0 ||
        m2d_cfg_check_max(path, "num_attention_heads", c->num_attention_heads, 1024) != 0 ||
        m2d_cfg_check_max(path, "num_key_value_heads", c->num_key_value_heads, 1024) != 0 ||
        m2d_cfg_check_max(path, "head_dim", c->head_dim, M2D_MAX_HEAD_DIM) != 0)
        return -1;
    if (!(c->rms_norm_eps > 0)) return m2d_err1("%s: field 'rms_norm_eps': must be positive", path);
    return 0;
}

int m2d_qwen3_parse_common(const void *json, const char *path, m2d_config *c) {
    static const m2d_decoder_defaults qwen3 = {.theta = 10000.0, .rms_norm_eps = 1e-6, .max_position_embeddings = 32768};
    if (reject_features(json, path) != 0 || m2d_decoder_parse(json, path, &qwen3, c) != 0) return -1;
    c->ops = (m2d_layer_ops){.qk_norm = M2D_QK_NORM_PER_HEAD, .router = M2D_ROUTER_SOFTMAX_TOPK,
                             .router_renorm = false, .ffn_act = M2D_ACT_SWIGLU, .rope = M2D_ROPE_NEOX};
    return 0;
}

int m2d_qwen3_check_config(const m2d_config *c, const char *path) {
    if (c->num_attention_heads % c->num_key_value_heads != 0)
        return m2d_err1("%s: field 'num_key_value_heads': %d does not divide num_attention_heads %d", path,
                       c->num_key_value_heads, c->num_attention_heads);
    if (c->bos_token_id >= c->vocab_size)
        return m2d_err1("%s: field 'bos_token_id': %d outside the vocabulary (%d)", path, c->bos_token_id, c->vocab_size);
    if (c->eos_token_id >= c->vocab_size)
        return m2d_err1("%s: field 'eos_token_id': %d outside the vocabulary (%d)", path, c->eos_token_id, c->vocab_size);
    bool any_dense = false;
    for (int l = 0; l < c->num_hidden_layers; l++) any_dense |= !c->layer_is_moe[l];
    if (any_dense && c->intermediate_size <= 0)
        return m2d_err1("%s: field 'intermediate_size': missing or not positive, but some layers are dense", path);
    return 0;
}

#define LAYER_ "model.layers.%d."
const m2d_tensor_spec m2d_qwen3_tensors[] = {
    {M2D_SCOPE_MODEL, M2D_M_EMBED, "model.embed_tokens.weight", {M2D_DIM_VOCAB, M2D_DIM_HIDDEN}, 0},
    {M2D_SCOPE_MODEL, M2D_M_FINAL_NORM, "model.norm.weight", {M2D_DIM_HIDDEN, M2D_DIM_NONE}, 0},
    {M2D_SCOPE_MODEL, M2D_M_LM_HEAD, "lm_head.weight", {M2D_DIM_VOCAB, M2D_DIM_HIDDEN}, 0},
    {M2D_SCOPE_LAYER, M2D_T_ATTN_NORM, LAYER_ "input_layernorm.weight", {M2D_DIM_HIDDEN, M2D_DIM_NONE}, 0},
    {M2D_SCOPE_LAYER, M2D_T_FFN_NORM, LAYER_ "post_attention_layernorm.weight", {M2D_DIM_HIDDEN, M2D_DIM_NONE}, 0},
    {M2D_SCOPE_LAYER, M2D_T_Q, LAYER_ "self_attn.q_proj.weight", {M2D_DIM_Q, M2D_DIM_HIDDEN}, 0},
    {M2D_SCOPE_LAYER, M2D_T_K, LAYER_ "self_attn.k_proj.weight", {M2D_DIM_KV, M2D_DIM_HIDDEN}, 0},
    {M2D_SCOPE_LAYER, M2D_T_V, LAYER_ "self_attn.v_proj.weight", {M2D_DIM_KV, M2D_DIM_HIDDEN}, 0},
    {M2D_SCOPE_LAYER, M2D_T_O, LAYER_ "self_attn.o_proj.weight", {M2D_DIM_HIDDEN, M2D_DIM_Q}, 0},
    {M2D_SCOPE_LAYER, M2D_T_Q_NORM, LAYER_ "self_attn.q_norm.weight", {M2D_DIM_HEAD, M2D_DIM_NONE}, 0},
    {M2D_SCOPE_LAYER, M2D_T_K_NORM, LAYER_ "self_attn.k_norm.weight", {M2D_DIM_HEAD, M2D_DIM_NONE}, 0},
    {M2D_SCOPE_DENSE, M2D_T_GATE, LAYER_ "mlp.gate_proj.weight", {M2D_DIM_FFN, M2D_DIM_HIDDEN}, 0},
    {M2D_SCOPE_DENSE, M2D_T_UP, LAYER_ "mlp.up_proj.weight", {M2D_DIM_FFN, M2D_DIM_HIDDEN}, 0},
    {M2D_SCOPE_DENSE, M2D_T_DOWN, LAYER_ "mlp.down_proj.weight", {M2D_DIM_HIDDEN, M2D_DIM_FFN}, 0},
    {M2D_SCOPE_MOE, M2D_T_ROUTER, LAYER_ "mlp.gate.weight", {M2D_DIM_EXPERTS, M2D_DIM_HIDDEN}, 0},
    {M2D_SCOPE_EXPERT, M2D_X_EXP_GATE, LAYER_ "mlp.experts.%d.gate_proj.weight", {M2D_DIM_EXPERT_FFN, M2D_DIM_HIDDEN}, 0},
    {M2D_SCOPE_EXPERT, M2D_X_EXP_UP, LAYER_ "mlp.experts.%d.up_proj.weight", {M2D_DIM_EXPERT_FFN, M2D_DIM_HIDDEN}, 0},
    {M2D_SCOPE_EXPERT, M2D_X_EXP_DOWN, LAYER_ "mlp.experts.%d.down_proj.weight", {M2D_DIM_HIDDEN, M2D_DIM_EXPERT_FFN}, 0},
    {0},
};
#undef LAYER_

/* ---- Qwen3ForCausalLM: every layer dense ---- */

int m2d_qwen3_parse(const void *json, const char *path, m2d_config *c) {
    if (m2d_qwen3_parse_common(json, path, c) != 0) return -1;
    if (m2d_cfg_pos_int(json, path, "intermediate_size", 1, 0, &c->intermediate_size) != 0 ||
        m2d_cfg_check_max(path, "intermediate_size", c->intermediate_size, 1 << 20) != 0)
        return -1;
    c->decoder_sparse_step = 1;
    if (m2d_config_derive_layers(c, path) != 0) return -1;
    return m2d_qwen3_check_config(c, path);
}

M2D_ARCH(qwen3, .name = "Qwen3ForCausalLM", .summary = "Qwen3 dense decoder (GQA, q/k RMSNorm, SwiGLU)",
         .parse_config = m2d_qwen3_parse, .tensors = m2d_qwen3_tensors)
