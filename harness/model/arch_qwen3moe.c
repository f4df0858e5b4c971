/* arch_qwen3moe — Qwen3MoeForCausalLM: Qwen3 attention, routed SwiGLU experts (no shared
 * expert), softmax router with top-k, optionally renormalised (norm_topk_prob). */
#include "model/arch_qwen3.h"

#include <cjson/cJSON.h>
#include <stdlib.h>

#include "base/util.h"
#include "model/decoder.h"

int m2d_qwen3moe_parse(const void *json, const char *path, m2d_config *c) {
    if (m2d_qwen3_parse_common(json, path, c) != 0) return -1;
    /* shapes are required; behaviour flags take HF Qwen3MoeConfig defaults when absent */
    if (m2d_cfg_num_experts(json, path, &c->num_experts) != 0 ||
        m2d_cfg_pos_int(json, path, "num_experts_per_tok", 1, 0, &c->num_experts_per_tok) != 0 ||
        m2d_cfg_pos_int(json, path, "moe_intermediate_size", 1, 0, &c->moe_intermediate_size) != 0 ||
        m2d_cfg_int(json, path, "intermediate_size", 0, 0, &c->intermediate_size) != 0 ||
        m2d_cfg_bool(json, path, "norm_topk_prob", 0, false, &c->norm_topk_prob) != 0 ||
        m2d_cfg_pos_int(json, path, "decoder_sparse_step", 0, 1, &c->decoder_sparse_step) != 0 ||
        m2d_cfg_int_list(json, path, "mlp_only_layers", &c->mlp_only_layers, &c->n_mlp_only_layers) != 0)
        return -1;
    if (m2d_cfg_check_max(path, "num_experts", c->num_experts, 4096) != 0 ||
        m2d_cfg_check_max(path, "moe_intermediate_size", c->moe_intermediate_size, 1 << 17) != 0 ||
        m2d_cfg_check_max(path, "intermediate_size", c->intermediate_size, 1 << 20) != 0)
        return -1;
    if (c->intermediate_size < 0)
        return m2d_err1("%s: field 'intermediate_size': must not be negative", path);
    if (c->num_experts_per_tok > c->num_experts)
        return m2d_err1("%s: field 'num_experts_per_tok': %d exceeds num_experts %d", path, c->num_experts_per_tok,
                       c->num_experts);
    if (m2d_cfg_has(json, "shared_expert_intermediate_size")) {
        int s;
        if (m2d_cfg_int(json, path, "shared_expert_intermediate_size", 0, 0, &s) != 0) return -1;
        if (s != 0) return m2d_err1("%s: field 'shared_expert_intermediate_size': shared experts are not part of "
                                   "Qwen3-MoE (Qwen2-MoE needs its own adapter)", path);
    }
    c->ops.router_renorm = c->norm_topk_prob;
    if (m2d_config_derive_layers(c, path) != 0) return -1;
    return m2d_decoder_check(c, path);
}

/* Keys that only make sense for an MoE (dropped from a dense student's config.json). */
static const char *const MOE_KEYS[] = {"num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
                                       "decoder_sparse_step", "mlp_only_layers", "output_router_logits",
                                       "router_aux_loss_coef"};

int m2d_qwen3moe_student_config(void *json, const m2d_student_shape *s, const char *path) {
    (void)path;
    cJSON *j = json;
    if (s->moe) {
        /* in the teacher's spelling: num_experts, or num_local_experts (transformers >= 5) */
        const char *key = cJSON_HasObjectItem(j, "num_local_experts") && !cJSON_HasObjectItem(j, "num_experts")
                              ? "num_local_experts" : "num_experts";
        cJSON_DeleteItemFromObject(j, "num_experts");
        cJSON_DeleteItemFromObject(j, "num_local_experts");
        m2d_json_set_number(j, key, s->n_experts);
        m2d_json_set_number(j, "num_experts_per_tok", s->top_k);
        return 0;
    }
    m2d_json_set_arch(j, "Qwen3ForCausalLM", "qwen3");
    m2d_json_set_number(j, "intermediate_size", s->ffn_width);
    /* Qwen3MoeConfig has no head_dim (transformers 5 saves none: hidden / heads) and defaults
     * num_key_value_heads to 4, Qwen3Config to 128 and 8: the student states the teacher's */
    if (!cJSON_HasObjectItem(j, "head_dim")) m2d_json_set_number(j, "head_dim", s->head_dim);
    if (!cJSON_HasObjectItem(j, "num_key_value_heads")) m2d_json_set_number(j, "num_key_value_heads", s->num_key_value_heads);
    for (size_t i = 0; i < M2D_ARRAY_LEN(MOE_KEYS); i++) cJSON_DeleteItemFromObject(j, MOE_KEYS[i]);
    return 0;
}

M2D_ARCH(qwen3moe, .name = "Qwen3MoeForCausalLM",
         .summary = "Qwen3-MoE decoder (routed SwiGLU experts, softmax top-k router)",
         .parse_config = m2d_qwen3moe_parse, .tensors = m2d_qwen3_tensors,
         .student = "Qwen3ForCausalLM",
         .student_config = m2d_qwen3moe_student_config, .family = "Qwen3-MoE")
