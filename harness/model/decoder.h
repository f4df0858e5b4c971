/* decoder — config.json fields every decoder-only family shares (sizes, heads, RoPE, norms,
 * tokens, dtype), their limits and consistency, and the helpers adapters use to write a student's
 * config.json. Family adapters (arch_*.c) call these and add what is theirs. Semantics follow
 * transformers: fields that are absent take the family's transformers default, except sizes that
 * determine tensor shapes (required). */
#ifndef M2D_DECODER_H
#define M2D_DECODER_H

#include "model/model.h"

/* A family's transformers defaults for the fields that have one. */
typedef struct {
    double rms_norm_eps, rope_theta;
    int max_position_embeddings;
} m2d_decoder_defaults;

/* model_type, vocab_size, hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads
 * (absent: the heads), head_dim (absent: hidden / heads), max_position_embeddings, RoPE
 * (m2d_rope_parse), rms_norm_eps, tie_word_embeddings, bos/eos ids, torch_dtype; hidden_act must be
 * silu. Checks the sizes against limits far beyond any released model (they keep every parameter
 * count below 2^60). Sets cfg->ops to SwiGLU, softmax top-k router without renormalisation,
 * rotate-half RoPE, no q/k norm: the family adjusts. */
int m2d_decoder_parse(const void *json, const char *path, const m2d_decoder_defaults *d, m2d_config *cfg);
/* Error for sliding-window attention (use_sliding_window true, or layer_types naming anything but
 * full_attention): not implemented for these families. */
int m2d_decoder_reject_sliding(const void *json, const char *path);
/* Error for attention_bias true (FAMILY names the family in the message). */
int m2d_decoder_reject_attention_bias(const void *json, const char *path, const char *family);
/* Consistency after the family's fields: kv heads divide heads, token ids inside the vocabulary,
 * intermediate_size positive when some layer is dense (layer_is_moe filled). */
int m2d_decoder_check(const m2d_config *cfg, const char *path);

/* The tensor-table entries every decoder family names alike (transformers' Llama layout): embedding,
 * final norm, LM head, per layer the two RMSNorms (BASE); with q/k/v/o_proj; q/k/v_proj's biases. */
#define M2D_DECODER_BASE_TENSORS \
    {M2D_SCOPE_MODEL, M2D_M_EMBED, "model.embed_tokens.weight", {M2D_DIM_VOCAB, M2D_DIM_HIDDEN}, 0}, \
    {M2D_SCOPE_MODEL, M2D_M_FINAL_NORM, "model.norm.weight", {M2D_DIM_HIDDEN, M2D_DIM_NONE}, 0}, \
    {M2D_SCOPE_MODEL, M2D_M_LM_HEAD, "lm_head.weight", {M2D_DIM_VOCAB, M2D_DIM_HIDDEN}, 0}, \
    {M2D_SCOPE_LAYER, M2D_T_ATTN_NORM, "model.layers.%d.input_layernorm.weight", {M2D_DIM_HIDDEN, M2D_DIM_NONE}, 0}, \
    {M2D_SCOPE_LAYER, M2D_T_FFN_NORM, "model.layers.%d.post_attention_layernorm.weight", {M2D_DIM_HIDDEN, M2D_DIM_NONE}, 0}
#define M2D_DECODER_TENSORS \
    M2D_DECODER_BASE_TENSORS, \
    {M2D_SCOPE_LAYER, M2D_T_Q, "model.layers.%d.self_attn.q_proj.weight", {M2D_DIM_Q, M2D_DIM_HIDDEN}, 0}, \
    {M2D_SCOPE_LAYER, M2D_T_K, "model.layers.%d.self_attn.k_proj.weight", {M2D_DIM_KV, M2D_DIM_HIDDEN}, 0}, \
    {M2D_SCOPE_LAYER, M2D_T_V, "model.layers.%d.self_attn.v_proj.weight", {M2D_DIM_KV, M2D_DIM_HIDDEN}, 0}, \
    {M2D_SCOPE_LAYER, M2D_T_O, "model.layers.%d.self_attn.o_proj.weight", {M2D_DIM_HIDDEN, M2D_DIM_Q}, 0}
#define M2D_DECODER_QKV_BIASES \
    {M2D_SCOPE_LAYER, M2D_T_Q_BIAS, "model.layers.%d.self_attn.q_proj.bias", {M2D_DIM_Q, M2D_DIM_NONE}, 0}, \
    {M2D_SCOPE_LAYER, M2D_T_K_BIAS, "model.layers.%d.self_attn.k_proj.bias", {M2D_DIM_KV, M2D_DIM_NONE}, 0}, \
    {M2D_SCOPE_LAYER, M2D_T_V_BIAS, "model.layers.%d.self_attn.v_proj.bias", {M2D_DIM_KV, M2D_DIM_NONE}, 0}

/* The dense FFN (mlp.gate/up/down_proj) and the routed experts (mlp.experts.E.*) as Qwen-style
 * families name them. */
#define M2D_DECODER_DENSE_FFN_TENSORS \
    {M2D_SCOPE_DENSE, M2D_T_GATE, "model.layers.%d.mlp.gate_proj.weight", {M2D_DIM_FFN, M2D_DIM_HIDDEN}, 0}, \
    {M2D_SCOPE_DENSE, M2D_T_UP, "model.layers.%d.mlp.up_proj.weight", {M2D_DIM_FFN, M2D_DIM_HIDDEN}, 0}, \
    {M2D_SCOPE_DENSE, M2D_T_DOWN, "model.layers.%d.mlp.down_proj.weight", {M2D_DIM_HIDDEN, M2D_DIM_FFN}, 0}
#define M2D_DECODER_EXPERT_TENSORS \
    {M2D_SCOPE_EXPERT, M2D_X_EXP_GATE, "model.layers.%d.mlp.experts.%d.gate_proj.weight", {M2D_DIM_EXPERT_FFN, M2D_DIM_HIDDEN}, 0}, \
    {M2D_SCOPE_EXPERT, M2D_X_EXP_UP, "model.layers.%d.mlp.experts.%d.up_proj.weight", {M2D_DIM_EXPERT_FFN, M2D_DIM_HIDDEN}, 0}, \
    {M2D_SCOPE_EXPERT, M2D_X_EXP_DOWN, "model.layers.%d.mlp.experts.%d.down_proj.weight", {M2D_DIM_HIDDEN, M2D_DIM_EXPERT_FFN}, 0}

/* ---- writing a student's config.json (cJSON* objects) ---- */
/* KEY = V: the old entry removed, the new one added at the end (as the goldens' students have it). */
void m2d_json_set_number(void *json, const char *key, double v);
void m2d_json_set_string(void *json, const char *key, const char *v);
/* architectures = [ARCH] (in place), model_type = MODEL_TYPE (moved to the end) */
void m2d_json_set_arch(void *json, const char *arch, const char *model_type);
/* Remove each of the NULL-terminated KEYS. */
void m2d_json_drop(void *json, const char *const *keys);

#endif
