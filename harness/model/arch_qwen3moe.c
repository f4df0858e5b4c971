/* arch_qwen3moe — Qwen3MoeForCausalLM: Qwen3 attention, routed SwiGLU experts (no shared
 * expert), softmax router with top-k, optionally renormalised (norm_topk_prob). */
#include "model/arch_qwen3.h"

#include <stdlib.h>

#include "base/util.h"

/* num_experts (the Hub's config.json) or num_local_experts (what save_pretrained of transformers
 * >= 5 writes; num_experts is its alias there); both present must agree. */
static int parse_num_experts(const void *json, const char *path, int *out) {
    int a = m2d_cfg_has(json, "num_experts"), b = m2d_cfg_has(json, "num_local_experts"), other;
    if (m2d_cfg_pos_int(json, path, b && !a ? "num_local_experts" : "num_experts", 1, 0, out) != 0) return -1;
    if (!a || !b) return 0;
    if (m2d_cfg_pos_int(json, path, "num_local_experts", 1, 0, &other) != 0) return -1;
    if (other != *out)
        return m2d_err1("%s: field 'num_local_experts': %d disagrees with num_experts %d", path, other, *out);
    return 0;
}

static int qwen3moe_parse(const void *json, const char *path, m2d_config *c) {
    if (m2d_qwen3_parse_common(json, path, c) != 0) return -1;
    /* shapes are required; behaviour flags take HF Qwen3MoeConfig defaults when absent */
    if (parse_num_experts(json, path, &c->num_experts) != 0 ||
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
    if (m2d_config_derive_layers(c, path) != 0) return -1;
    return m2d_qwen3_check_config(c, path);
}

static int qwen3moe_bind(m2d_model *m) {
    const m2d_config *c = &m->cfg;
    int64_t d = c->hidden_size, de = c->moe_intermediate_size, E = c->num_experts;
    if (m2d_qwen3_bind_common(m) != 0) return -1;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (!c->layer_is_moe[l]) {
            if (m2d_qwen3_bind_dense_ffn(m, l, c->intermediate_size) != 0) return -1;
            continue;
        }
        m2d_layer *L = &m->layers[l];
        if (!(L->router = m2d_model_expectf(m, 2, E, d, "model.layers.%d.mlp.gate.weight", l))) return -1;
        L->exp_gate = m2d_calloc((size_t)E, sizeof *L->exp_gate);
        L->exp_up = m2d_calloc((size_t)E, sizeof *L->exp_up);
        L->exp_down = m2d_calloc((size_t)E, sizeof *L->exp_down);
        for (int e = 0; e < E; e++) {
            const char *p = "model.layers";
            if (!(L->exp_gate[e] = m2d_model_expectf(m, 2, de, d, "%s.%d.mlp.experts.%d.gate_proj.weight", p, l, e)) ||
                !(L->exp_up[e] = m2d_model_expectf(m, 2, de, d, "%s.%d.mlp.experts.%d.up_proj.weight", p, l, e)) ||
                !(L->exp_down[e] = m2d_model_expectf(m, 2, d, de, "%s.%d.mlp.experts.%d.down_proj.weight", p, l, e)))
                return -1;
        }
    }
    return 0;
}

M2D_ARCH(qwen3moe, "Qwen3MoeForCausalLM", "Qwen3-MoE decoder (routed SwiGLU experts, softmax top-k router)",
         qwen3moe_parse, qwen3moe_bind, NULL)
