/* arch_qwen2moe — Qwen2MoeForCausalLM (Qwen1.5-MoE, Qwen2-57B-A14B; transformers'
 * modeling_qwen2_moe.py) and its dense student Qwen2ForCausalLM.
 *
 * Qwen2-MoE: Qwen2 attention (q/k/v biases when qkv_bias, no q/k norm), sparse layers by
 * decoder_sparse_step / mlp_only_layers as Qwen3-MoE, softmax top-k router (renormalised only when
 * norm_topk_prob, false in the released models), and per MoE layer one always-on shared expert of
 * width shared_expert_intermediate_size whose output is multiplied by sigmoid(shared_expert_gate . x).
 *
 * The dense student (SPEC §4, as DeepSeek's shared experts): the k merged groups and the shared
 * expert, copied with alpha = 1, concatenated into one SwiGLU FFN of width
 * k * moe_intermediate_size + shared_expert_intermediate_size. The sigmoid gate has no place in a
 * dense FFN and is dropped: the student applies the shared expert at weight 1 where the teacher
 * applies sigmoid(g . x) in (0, 1) (documented in README, "Supported models"). Qwen2ForCausalLM
 * always has q/k/v biases, so a teacher without them (qkv_bias false) has no dense student here. */
#include <cjson/cJSON.h>
#include <string.h>

#include "base/util.h"
#include "io/st.h"
#include "model/decoder.h"

static const m2d_decoder_defaults QWEN2_DEFAULTS = {.rms_norm_eps = 1e-6, .rope_theta = 10000.0,
                                                    .max_position_embeddings = 32768};

static int parse_common(const void *json, const char *path, m2d_config *c) {
    if (m2d_decoder_parse(json, path, &QWEN2_DEFAULTS, c) != 0 || m2d_decoder_reject_sliding(json, path) != 0)
        return -1;
    if (m2d_cfg_has(json, "attention_bias"))
        return m2d_err1("%s: field 'attention_bias': not a Qwen2 field (its q/k/v biases follow qkv_bias)", path);
    return 0;
}

static int parse_moe_fields(const void *json, const char *path, m2d_config *c) {
    if (m2d_cfg_num_experts(json, path, &c->num_experts) != 0 ||
        m2d_cfg_pos_int(json, path, "num_experts_per_tok", 1, 0, &c->num_experts_per_tok) != 0 ||
        m2d_cfg_pos_int(json, path, "moe_intermediate_size", 1, 0, &c->moe_intermediate_size) != 0 ||
        m2d_cfg_pos_int(json, path, "shared_expert_intermediate_size", 1, 0, &c->shared_expert_intermediate_size) != 0 ||
        m2d_cfg_int(json, path, "intermediate_size", 0, 0, &c->intermediate_size) != 0 ||
        m2d_cfg_bool(json, path, "norm_topk_prob", 0, false, &c->norm_topk_prob) != 0 ||
        m2d_cfg_bool(json, path, "qkv_bias", 0, true, &c->qkv_bias) != 0 ||
        m2d_cfg_pos_int(json, path, "decoder_sparse_step", 0, 1, &c->decoder_sparse_step) != 0 ||
        m2d_cfg_int_list(json, path, "mlp_only_layers", &c->mlp_only_layers, &c->n_mlp_only_layers) != 0)
        return -1;
    if (m2d_cfg_check_max(path, "num_experts", c->num_experts, 4096) != 0 ||
        m2d_cfg_check_max(path, "moe_intermediate_size", c->moe_intermediate_size, 1 << 17) != 0 ||
        m2d_cfg_check_max(path, "shared_expert_intermediate_size", c->shared_expert_intermediate_size, 1 << 20) != 0 ||
        m2d_cfg_check_max(path, "intermediate_size", c->intermediate_size, 1 << 20) != 0)
        return -1;
    if (c->intermediate_size < 0) return m2d_err1("%s: field 'intermediate_size': must not be negative", path);
    if (c->num_experts_per_tok > c->num_experts)
        return m2d_err1("%s: field 'num_experts_per_tok': %d exceeds num_experts %d", path, c->num_experts_per_tok,
                        c->num_experts);
    return 0;
}

static int parse_qwen2moe(const void *json, const char *path, m2d_config *c) {
    if (parse_common(json, path, c) != 0 || parse_moe_fields(json, path, c) != 0) return -1;
    c->ops.router_renorm = c->norm_topk_prob;
    if (m2d_config_derive_layers(c, path) != 0) return -1;
    return m2d_decoder_check(c, path);
}

/* dense Qwen2: q/k/v biases always (transformers hard-codes them) */
static int parse_qwen2(const void *json, const char *path, m2d_config *c) {
    if (parse_common(json, path, c) != 0 || m2d_cfg_pos_int(json, path, "intermediate_size", 1, 0, &c->intermediate_size) != 0 ||
        m2d_cfg_check_max(path, "intermediate_size", c->intermediate_size, 1 << 20) != 0)
        return -1;
    c->qkv_bias = true;
    c->decoder_sparse_step = 1;
    if (m2d_config_derive_layers(c, path) != 0) return -1;
    return m2d_decoder_check(c, path);
}

static bool qwen2_tensor_present(const m2d_config *c, m2d_scope scope, int role) {
    return scope != M2D_SCOPE_LAYER || (role != M2D_T_Q_BIAS && role != M2D_T_K_BIAS && role != M2D_T_V_BIAS) ||
           c->qkv_bias;
}

#define LAYER_ "model.layers.%d."
static const m2d_tensor_spec qwen2_tensors[] = {
    M2D_DECODER_TENSORS,
    M2D_DECODER_QKV_BIASES,
    M2D_DECODER_DENSE_FFN_TENSORS,
    {M2D_SCOPE_MOE, M2D_T_ROUTER, LAYER_ "mlp.gate.weight", {M2D_DIM_EXPERTS, M2D_DIM_HIDDEN}, 0},
    {M2D_SCOPE_MOE, M2D_T_SHARED_GATE, LAYER_ "mlp.shared_expert.gate_proj.weight", {M2D_DIM_SHARED_FFN, M2D_DIM_HIDDEN}, 0},
    {M2D_SCOPE_MOE, M2D_T_SHARED_UP, LAYER_ "mlp.shared_expert.up_proj.weight", {M2D_DIM_SHARED_FFN, M2D_DIM_HIDDEN}, 0},
    {M2D_SCOPE_MOE, M2D_T_SHARED_DOWN, LAYER_ "mlp.shared_expert.down_proj.weight", {M2D_DIM_HIDDEN, M2D_DIM_SHARED_FFN}, 0},
    {M2D_SCOPE_MOE, M2D_T_SHARED_EXPERT_GATE, LAYER_ "mlp.shared_expert_gate.weight", {M2D_DIM_ONE, M2D_DIM_HIDDEN}, 0},
    M2D_DECODER_EXPERT_TENSORS,
    {0},
};
#undef LAYER_

/* Keys that only make sense for Qwen2-MoE (dropped from the dense student's config.json). */
static const char *const MOE_KEYS[] = {"num_experts", "num_local_experts", "num_experts_per_tok",
                                       "moe_intermediate_size", "shared_expert_intermediate_size", "norm_topk_prob",
                                       "decoder_sparse_step", "mlp_only_layers", "output_router_logits",
                                       "router_aux_loss_coef", "qkv_bias", NULL};

static int qwen2moe_student_config(void *json, const m2d_student_shape *s, const char *path) {
    if (s->moe) {
        const char *key = cJSON_HasObjectItem(json, "num_local_experts") && !cJSON_HasObjectItem(json, "num_experts")
                              ? "num_local_experts" : "num_experts";
        m2d_json_drop(json, (const char *const[]){"num_experts", "num_local_experts", NULL});
        m2d_json_set_number(json, key, s->n_experts);
        m2d_json_set_number(json, "num_experts_per_tok", s->top_k);
        return 0;
    }
    if (cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(json, "qkv_bias")))
        return m2d_err1("%s: field 'qkv_bias': false, but the dense student Qwen2ForCausalLM always has q/k/v biases "
                        "(convert --target moe keeps Qwen2-MoE)", path);
    m2d_json_set_arch(json, "Qwen2ForCausalLM", "qwen2");
    m2d_json_set_number(json, "intermediate_size", s->ffn_width);
    m2d_json_drop(json, MOE_KEYS);
    return 0;
}

M2D_ARCH(qwen2moe, .name = "Qwen2MoeForCausalLM",
         .summary = "Qwen2-MoE (q/k/v biases, softmax top-k router, shared expert with a sigmoid gate)",
         .parse_config = parse_qwen2moe, .tensors = qwen2_tensors, .student = "Qwen2ForCausalLM",
         .student_config = qwen2moe_student_config, .tensor_present = qwen2_tensor_present,
         .family = "Qwen2-MoE")

M2D_ARCH(qwen2, .name = "Qwen2ForCausalLM", .summary = "Qwen2 dense decoder (GQA, q/k/v biases, SwiGLU)",
         .parse_config = parse_qwen2, .tensors = qwen2_tensors, .tensor_present = qwen2_tensor_present)
