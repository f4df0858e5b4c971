/* arch_wholeqk — a test-only architecture adapter (linked into the tests, never into the product).
 *
 * "TestWholeQkNormMoeForCausalLM" is Qwen3-MoE except for one op: the q/k RMSNorm runs over the
 * whole projection (weights [heads*head_dim] and [kv_heads*head_dim]), as in OLMoE, instead of per
 * head. Its dense student "TestWholeQkNormForCausalLM" keeps that op. tests/test_arch.c loads a
 * checkpoint of it, runs it through the engine, calibrates, converts and writes the student, and
 * checks every step against the naive reference (tests/reffwd.c) -- with no edit to engine.c or to
 * the student writer: this file is everything the new family needs. */
#include <cjson/cJSON.h>

#include "base/util.h"
#include "model/arch_qwen3.h"

#define LAYER_ "model.layers.%d."
static const m2d_tensor_spec tensors[] = {
    {M2D_SCOPE_MODEL, M2D_M_EMBED, "model.embed_tokens.weight", {M2D_DIM_VOCAB, M2D_DIM_HIDDEN}, 0},
    {M2D_SCOPE_MODEL, M2D_M_FINAL_NORM, "model.norm.weight", {M2D_DIM_HIDDEN, M2D_DIM_NONE}, 0},
    {M2D_SCOPE_MODEL, M2D_M_LM_HEAD, "lm_head.weight", {M2D_DIM_VOCAB, M2D_DIM_HIDDEN}, 0},
    {M2D_SCOPE_LAYER, M2D_T_ATTN_NORM, LAYER_ "input_layernorm.weight", {M2D_DIM_HIDDEN, M2D_DIM_NONE}, 0},
    {M2D_SCOPE_LAYER, M2D_T_FFN_NORM, LAYER_ "post_attention_layernorm.weight", {M2D_DIM_HIDDEN, M2D_DIM_NONE}, 0},
    {M2D_SCOPE_LAYER, M2D_T_Q, LAYER_ "self_attn.q_proj.weight", {M2D_DIM_Q, M2D_DIM_HIDDEN}, 0},
    {M2D_SCOPE_LAYER, M2D_T_K, LAYER_ "self_attn.k_proj.weight", {M2D_DIM_KV, M2D_DIM_HIDDEN}, 0},
    {M2D_SCOPE_LAYER, M2D_T_V, LAYER_ "self_attn.v_proj.weight", {M2D_DIM_KV, M2D_DIM_HIDDEN}, 0},
    {M2D_SCOPE_LAYER, M2D_T_O, LAYER_ "self_attn.o_proj.weight", {M2D_DIM_HIDDEN, M2D_DIM_Q}, 0},
    /* the one difference: norms over the whole projection */
    {M2D_SCOPE_LAYER, M2D_T_Q_NORM, LAYER_ "self_attn.q_norm.weight", {M2D_DIM_Q, M2D_DIM_NONE}, 0},
    {M2D_SCOPE_LAYER, M2D_T_K_NORM, LAYER_ "self_attn.k_norm.weight", {M2D_DIM_KV, M2D_DIM_NONE}, 0},
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

static int parse_moe(const void *json, const char *path, m2d_config *c) {
    if (m2d_qwen3moe_parse(json, path, c) != 0) return -1;
    c->ops.qk_norm = M2D_QK_NORM_WHOLE;
    return 0;
}

static int parse_dense(const void *json, const char *path, m2d_config *c) {
    if (m2d_qwen3_parse(json, path, c) != 0) return -1;
    c->ops.qk_norm = M2D_QK_NORM_WHOLE;
    return 0;
}

/* Qwen3-MoE's rewrite, then this family's own student name */
static int student_config(void *json, const m2d_student_shape *s, const char *path) {
    if (m2d_qwen3moe_student_config(json, s, path) != 0) return -1;
    if (s->moe) return 0;
    cJSON *j = json;
    cJSON_ReplaceItemInObject(j, "architectures", cJSON_CreateStringArray((const char *[]){"TestWholeQkNormForCausalLM"}, 1));
    cJSON_ReplaceItemInObject(j, "model_type", cJSON_CreateString("test_wholeqk"));
    return 0;
}

M2D_ARCH(test_wholeqk_moe, .name = "TestWholeQkNormMoeForCausalLM",
         .summary = "test only: Qwen3-MoE with q/k norm over the whole projection", .parse_config = parse_moe,
         .tensors = tensors, .student = "TestWholeQkNormForCausalLM", .student_config = student_config)

M2D_ARCH(test_wholeqk_dense, .name = "TestWholeQkNormForCausalLM",
         .summary = "test only: dense student of TestWholeQkNormMoeForCausalLM", .parse_config = parse_dense,
         .tensors = tensors)
