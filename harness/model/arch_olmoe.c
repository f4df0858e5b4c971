/* arch_olmoe — OlmoeForCausalLM (transformers' modeling_olmoe.py): every layer MoE, routed SwiGLU
 * experts of width intermediate_size, softmax router with top-k (renormalised only when
 * norm_topk_prob, false in released OLMoE), q/k RMSNorm over the whole projection, optional
 * clip_qkv (q, k, v clamped after the norms), optional attention biases, rotate-half RoPE.
 *
 * Its dense student is an OlmoeForCausalLM too, since transformers has no dense class with this
 * attention: one expert of width k*d_e routed top-1 per layer. The softmax over one logit is 1, so
 * that layer is exactly a dense SwiGLU FFN; this adapter reads such a config (num_experts 1,
 * num_experts_per_tok 1) as dense layers whose weights are the one expert's, with the router
 * row (written as zeros by the converter) bound but never evaluated. */
#include <cjson/cJSON.h>
#include <string.h>

#include "base/util.h"
#include "io/st.h"
#include "model/decoder.h"

static int parse_olmoe(const void *json, const char *path, m2d_config *c) {
    static const m2d_decoder_defaults dflt = {.rms_norm_eps = 1e-5, .rope_theta = 10000.0,
                                              .max_position_embeddings = 4096};
    bool bias;
    if (m2d_decoder_parse(json, path, &dflt, c) != 0 || m2d_decoder_reject_sliding(json, path) != 0) return -1;
    /* transformers sizes q_norm by hidden_size and k_norm by (hidden / heads) * kv_heads */
    if (c->head_dim * c->num_attention_heads != c->hidden_size)
        return m2d_err1("%s: field 'head_dim': %d * %d heads must equal hidden_size %d (OLMoE's q/k norms)", path,
                        c->head_dim, c->num_attention_heads, c->hidden_size);
    if (m2d_cfg_has(json, "sliding_window"))
        return m2d_err1("%s: field 'sliding_window': must be null (OLMoE attends to the full context)", path);
    if (m2d_cfg_num_experts(json, path, &c->num_experts) != 0 ||
        m2d_cfg_pos_int(json, path, "num_experts_per_tok", 1, 0, &c->num_experts_per_tok) != 0 ||
        m2d_cfg_pos_int(json, path, "intermediate_size", 1, 0, &c->moe_intermediate_size) != 0 ||
        m2d_cfg_bool(json, path, "norm_topk_prob", 0, false, &c->norm_topk_prob) != 0 ||
        m2d_cfg_double(json, path, "clip_qkv", 0, 0, &c->clip_qkv) != 0 ||
        m2d_cfg_bool(json, path, "attention_bias", 0, false, &bias) != 0)
        return -1;
    if (m2d_cfg_has(json, "clip_qkv") && !(c->clip_qkv > 0))
        return m2d_err1("%s: field 'clip_qkv': must be positive or null", path);
    if (m2d_cfg_check_max(path, "num_experts", c->num_experts, 4096) != 0 ||
        m2d_cfg_check_max(path, "intermediate_size", c->moe_intermediate_size, 1 << 20) != 0)
        return -1;
    if (c->num_experts_per_tok > c->num_experts)
        return m2d_err1("%s: field 'num_experts_per_tok': %d exceeds num_experts %d", path, c->num_experts_per_tok,
                        c->num_experts);
    c->qkv_bias = c->o_bias = bias;
    c->ops.qk_norm = M2D_QK_NORM_WHOLE;
    c->ops.router_renorm = c->norm_topk_prob;
    c->decoder_sparse_step = 1;
    c->intermediate_size = c->moe_intermediate_size;
    if (c->num_experts == 1 && c->num_experts_per_tok == 1) /* one expert routed top-1: a dense layer */
        c->num_experts = c->num_experts_per_tok = c->moe_intermediate_size = 0;
    if (m2d_config_derive_layers(c, path) != 0) return -1;
    return m2d_decoder_check(c, path);
}

static bool olmoe_tensor_present(const m2d_config *c, m2d_scope scope, int role) {
    if (scope != M2D_SCOPE_LAYER) return true;
    if (role == M2D_T_Q_BIAS || role == M2D_T_K_BIAS || role == M2D_T_V_BIAS) return c->qkv_bias;
    return role == M2D_T_O_BIAS ? c->o_bias : true;
}

#define LAYER_ "model.layers.%d."
static const m2d_tensor_spec olmoe_tensors[] = {
    M2D_DECODER_TENSORS,
    M2D_DECODER_QKV_BIASES,
    {M2D_SCOPE_LAYER, M2D_T_O_BIAS, LAYER_ "self_attn.o_proj.bias", {M2D_DIM_HIDDEN, M2D_DIM_NONE}, 0},
    {M2D_SCOPE_LAYER, M2D_T_Q_NORM, LAYER_ "self_attn.q_norm.weight", {M2D_DIM_Q, M2D_DIM_NONE}, 0},
    {M2D_SCOPE_LAYER, M2D_T_K_NORM, LAYER_ "self_attn.k_norm.weight", {M2D_DIM_KV, M2D_DIM_NONE}, 0},
    {M2D_SCOPE_MOE, M2D_T_ROUTER, LAYER_ "mlp.gate.weight", {M2D_DIM_EXPERTS, M2D_DIM_HIDDEN}, 0},
    M2D_DECODER_EXPERT_TENSORS,
    /* the dense student: its one expert, and the router row the converter writes as zeros */
    {M2D_SCOPE_DENSE, M2D_T_ROUTER, LAYER_ "mlp.gate.weight", {M2D_DIM_ONE, M2D_DIM_HIDDEN}, 0},
    {M2D_SCOPE_DENSE, M2D_T_GATE, LAYER_ "mlp.experts.0.gate_proj.weight", {M2D_DIM_FFN, M2D_DIM_HIDDEN}, 0},
    {M2D_SCOPE_DENSE, M2D_T_UP, LAYER_ "mlp.experts.0.up_proj.weight", {M2D_DIM_FFN, M2D_DIM_HIDDEN}, 0},
    {M2D_SCOPE_DENSE, M2D_T_DOWN, LAYER_ "mlp.experts.0.down_proj.weight", {M2D_DIM_HIDDEN, M2D_DIM_FFN}, 0},
    {0},
};
#undef LAYER_

/* a dense student: one expert of width s->ffn_width routed top-1; an MoE student: fewer experts */
static int olmoe_student_config(void *json, const m2d_student_shape *s, const char *path) {
    (void)path;
    const char *key = cJSON_HasObjectItem(json, "num_local_experts") && !cJSON_HasObjectItem(json, "num_experts")
                          ? "num_local_experts" : "num_experts";
    m2d_json_drop(json, (const char *const[]){"num_experts", "num_local_experts", NULL});
    m2d_json_set_number(json, key, s->moe ? s->n_experts : 1);
    m2d_json_set_number(json, "num_experts_per_tok", s->moe ? s->top_k : 1);
    if (!s->moe) m2d_json_set_number(json, "intermediate_size", s->ffn_width);
    return 0;
}

M2D_ARCH(olmoe, .name = "OlmoeForCausalLM",
         .summary = "OLMoE (q/k norm over the whole projection, softmax top-k router, clip_qkv); dense student: one "
                    "expert routed top-1",
         .parse_config = parse_olmoe, .tensors = olmoe_tensors, .student = "OlmoeForCausalLM",
         .student_config = olmoe_student_config, .tensor_present = olmoe_tensor_present,
         .family = "OLMoE")
