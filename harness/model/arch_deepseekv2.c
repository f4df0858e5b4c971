/* arch_deepseekv2 — DeepseekV2ForCausalLM (DeepSeek-V2, -Lite; transformers' modeling_deepseek_v2.py).
 *
 * Multi-head latent attention (model.h M2D_ATTN_MLA): q from q_proj, or with q_lora_rank from
 * q_a_proj, its RMSNorm and q_b_proj; k and v per head from the RMS-normed kv latent (kv_b_proj),
 * each head's key ending in the one rotated key kv_a_proj_with_mqa gives all heads; heads of
 * qk_nope_head_dim + qk_rope_head_dim, values of v_head_dim; interleaved RoPE on the rope part, YaRN
 * with its attention factor and the softmax mscale (yarn_apply_mscale). Layers below
 * first_k_dense_replace are dense; the others route a softmax over n_routed_experts to the top k
 * (greedy, or group-limited: topk_method), gates times routed_scaling_factor, never renormalised,
 * plus n_shared_experts always-on experts as one SwiGLU of n_shared_experts * d_e.
 *
 * The engine's attention takes values of head_dim: the values are zero-padded per head, so post_bind
 * gives o_proj the matching zero columns (an owned copy; the stored o_proj is what a student keeps).
 *
 * The dense student (paper §4.6) is a DeepseekV2ForCausalLM whose every layer is dense
 * (first_k_dense_replace = num_hidden_layers, intermediate_size = k * d_e + the shared experts'),
 * MLA unchanged. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "io/st.h"
#include "model/decoder.h"

static int parse_mla(const void *json, const char *path, m2d_config *c) {
    int rope = 0;
    c->q_lora_rank = 1536; /* transformers' default when absent; null: no q LoRA */
    if (m2d_cfg_has(json, "q_lora_rank") &&
        m2d_cfg_pos_int(json, path, "q_lora_rank", 1, 0, &c->q_lora_rank) != 0)
        return -1;
    if (!m2d_cfg_has(json, "q_lora_rank") && cJSON_HasObjectItem((const cJSON *)json, "q_lora_rank"))
        c->q_lora_rank = 0;
    if (m2d_cfg_pos_int(json, path, "kv_lora_rank", 0, 512, &c->kv_lora_rank) != 0 ||
        m2d_cfg_pos_int(json, path, "qk_nope_head_dim", 0, 128, &c->qk_nope_head_dim) != 0 ||
        m2d_cfg_pos_int(json, path, "qk_rope_head_dim", 0, 64, &rope) != 0 ||
        m2d_cfg_pos_int(json, path, "v_head_dim", 0, 128, &c->v_head_dim) != 0 ||
        m2d_cfg_check_max(path, "q_lora_rank", c->q_lora_rank, 1 << 16) != 0 ||
        m2d_cfg_check_max(path, "kv_lora_rank", c->kv_lora_rank, 1 << 16) != 0)
        return -1;
    if (rope % 2) return m2d_err1("%s: field 'qk_rope_head_dim': %d must be even", path, rope);
    c->rope_dim = rope;
    c->head_dim = c->qk_nope_head_dim + rope; /* config.json's head_dim is the rope part's (transformers) */
    if (c->head_dim > M2D_MAX_HEAD_DIM || c->v_head_dim > c->head_dim)
        return m2d_err1("%s: field 'v_head_dim': %d with heads of %d + %d dimensions (at most %d, values no wider)",
                        path, c->v_head_dim, c->qk_nope_head_dim, rope, M2D_MAX_HEAD_DIM);
    /* MLA's keys and values have every head (transformers would repeat them num_attention_heads /
     * num_key_value_heads times more) */
    if (c->num_key_value_heads != c->num_attention_heads)
        return m2d_err1("%s: field 'num_key_value_heads': %d, but multi-head latent attention has %d (the heads)",
                        path, c->num_key_value_heads, c->num_attention_heads);
    c->attn_scale = m2d_rope_softmax_mscale(&c->rope_scaling) / sqrt((double)c->head_dim);
    return 0;
}

/* topk_method, its groups, the gate factor; norm_topk_prob must be false (transformers ignores it) */
static int parse_routing(const void *json, const char *path, m2d_config *c) {
    const char *method, *scoring;
    if (m2d_cfg_str(json, path, "topk_method", 0, "greedy", &method) != 0 ||
        m2d_cfg_str(json, path, "scoring_func", 0, "softmax", &scoring) != 0 ||
        m2d_cfg_double(json, path, "routed_scaling_factor", 0, 1.0, &c->routed_scaling_factor) != 0 ||
        m2d_cfg_bool(json, path, "norm_topk_prob", 0, false, &c->norm_topk_prob) != 0)
        return -1;
    if (strcmp(scoring, "softmax") != 0)
        return m2d_err1("%s: field 'scoring_func': '%s' is not supported (DeepSeek-V2 routes by softmax)", path, scoring);
    if (c->norm_topk_prob)
        return m2d_err1("%s: field 'norm_topk_prob': true is not supported (DeepSeek-V2 gates are not renormalised)",
                        path);
    if (!(c->routed_scaling_factor > 0))
        return m2d_err1("%s: field 'routed_scaling_factor': must be positive", path);
    if (!strcmp(method, "greedy")) return 0;
    if (strcmp(method, "group_limited_greedy") != 0)
        return m2d_err1("%s: field 'topk_method': '%s' is not supported (greedy, group_limited_greedy)", path, method);
    if (m2d_cfg_pos_int(json, path, "n_group", 1, 0, &c->n_group) != 0 ||
        m2d_cfg_pos_int(json, path, "topk_group", 1, 0, &c->topk_group) != 0 ||
        m2d_cfg_check_max(path, "n_group", c->n_group, M2D_MAX_EXPERT_GROUPS) != 0)
        return -1;
    if (c->num_experts % c->n_group != 0)
        return m2d_err1("%s: field 'n_group': %d does not divide n_routed_experts %d", path, c->n_group, c->num_experts);
    if (c->topk_group > c->n_group || c->num_experts_per_tok > c->topk_group * (c->num_experts / c->n_group))
        return m2d_err1("%s: field 'topk_group': %d of %d groups cannot hold the top %d", path, c->topk_group,
                        c->n_group, c->num_experts_per_tok);
    return 0;
}

static int parse_experts(const void *json, const char *path, m2d_config *c) {
    int n_shared, fkd, freq;
    if (m2d_cfg_pos_int(json, path, "n_routed_experts", 1, 0, &c->num_experts) != 0 ||
        m2d_cfg_pos_int(json, path, "num_experts_per_tok", 1, 0, &c->num_experts_per_tok) != 0 ||
        m2d_cfg_pos_int(json, path, "moe_intermediate_size", 1, 0, &c->moe_intermediate_size) != 0 ||
        m2d_cfg_int(json, path, "n_shared_experts", 0, 2, &n_shared) != 0 ||
        m2d_cfg_int(json, path, "first_k_dense_replace", 0, 0, &fkd) != 0 ||
        m2d_cfg_int(json, path, "moe_layer_freq", 0, 1, &freq) != 0 ||
        m2d_cfg_int(json, path, "intermediate_size", 0, 0, &c->intermediate_size) != 0 ||
        m2d_cfg_check_max(path, "n_routed_experts", c->num_experts, 4096) != 0 ||
        m2d_cfg_check_max(path, "moe_intermediate_size", c->moe_intermediate_size, 1 << 17) != 0 ||
        m2d_cfg_check_max(path, "n_shared_experts", n_shared, 64) != 0 ||
        m2d_cfg_check_max(path, "intermediate_size", c->intermediate_size, 1 << 20) != 0)
        return -1;
    if (n_shared < 0) return m2d_err1("%s: field 'n_shared_experts': must not be negative", path);
    if (freq != 1) return m2d_err1("%s: field 'moe_layer_freq': %d is not supported (1: every layer from first_k_dense_replace on)", path, freq);
    if (fkd < 0 || fkd > c->num_hidden_layers)
        return m2d_err1("%s: field 'first_k_dense_replace': %d outside [0, %d]", path, fkd, c->num_hidden_layers);
    if (c->num_experts_per_tok > c->num_experts)
        return m2d_err1("%s: field 'num_experts_per_tok': %d exceeds n_routed_experts %d", path, c->num_experts_per_tok,
                        c->num_experts);
    c->shared_expert_intermediate_size = n_shared * c->moe_intermediate_size;
    c->n_mlp_only_layers = fkd; /* layers below first_k_dense_replace are dense */
    c->mlp_only_layers = m2d_calloc((size_t)(fkd ? fkd : 1), sizeof(int));
    for (int l = 0; l < fkd; l++) c->mlp_only_layers[l] = l;
    c->decoder_sparse_step = 1;
    return 0;
}

/* DeepseekV2Config's mlp_bias adds biases to every FFN projection, which this reader does not hold */
static int reject_mlp_bias(const void *json, const char *path) {
    bool b;
    if (m2d_cfg_bool(json, path, "mlp_bias", 0, false, &b) != 0) return -1;
    return b ? m2d_err1("%s: field 'mlp_bias': true is not supported (FFN biases)", path) : 0;
}

static int parse_deepseekv2(const void *json, const char *path, m2d_config *c) {
    static const m2d_decoder_defaults dflt = {.rms_norm_eps = 1e-6, .rope_theta = 10000.0,
                                              .max_position_embeddings = 2048};
    if (m2d_decoder_parse(json, path, &dflt, c) != 0 || m2d_decoder_reject_sliding(json, path) != 0 ||
        m2d_decoder_reject_attention_bias(json, path, "this DeepSeek-V2 reader") != 0 || reject_mlp_bias(json, path) != 0 ||
        parse_mla(json, path, c) != 0 ||
        parse_experts(json, path, c) != 0 || parse_routing(json, path, c) != 0)
        return -1;
    c->ops.attn = M2D_ATTN_MLA;
    c->ops.rope = M2D_ROPE_INTERLEAVED;
    c->mla_norm_eps = 1e-6; /* modeling_deepseek_v2.py: DeepseekV2RMSNorm(q_lora_rank), (kv_lora_rank) */
    if (m2d_config_derive_layers(c, path) != 0) return -1;
    return m2d_decoder_check(c, path);
}

static bool deepseekv2_tensor_present(const m2d_config *c, m2d_scope scope, int role) {
    if (scope == M2D_SCOPE_LAYER && role == M2D_T_Q) return c->q_lora_rank == 0;
    if (scope == M2D_SCOPE_LAYER && (role == M2D_T_Q_A || role == M2D_T_Q_A_NORM || role == M2D_T_Q_B))
        return c->q_lora_rank > 0;
    if (scope == M2D_SCOPE_MOE && role != M2D_T_ROUTER) return c->shared_expert_intermediate_size > 0;
    return true;
}

#define LAYER_ "model.layers.%d."
static const m2d_tensor_spec deepseekv2_tensors[] = {
    M2D_DECODER_BASE_TENSORS,
    {M2D_SCOPE_LAYER, M2D_T_Q, LAYER_ "self_attn.q_proj.weight", {M2D_DIM_Q, M2D_DIM_HIDDEN}, 0},
    {M2D_SCOPE_LAYER, M2D_T_Q_A, LAYER_ "self_attn.q_a_proj.weight", {M2D_DIM_Q_LORA, M2D_DIM_HIDDEN}, 0},
    {M2D_SCOPE_LAYER, M2D_T_Q_A_NORM, LAYER_ "self_attn.q_a_layernorm.weight", {M2D_DIM_Q_LORA, M2D_DIM_NONE}, 0},
    {M2D_SCOPE_LAYER, M2D_T_Q_B, LAYER_ "self_attn.q_b_proj.weight", {M2D_DIM_Q, M2D_DIM_Q_LORA}, 0},
    {M2D_SCOPE_LAYER, M2D_T_KV_A, LAYER_ "self_attn.kv_a_proj_with_mqa.weight", {M2D_DIM_KV_A, M2D_DIM_HIDDEN}, 0},
    {M2D_SCOPE_LAYER, M2D_T_KV_A_NORM, LAYER_ "self_attn.kv_a_layernorm.weight", {M2D_DIM_KV_LORA, M2D_DIM_NONE}, 0},
    {M2D_SCOPE_LAYER, M2D_T_KV_B, LAYER_ "self_attn.kv_b_proj.weight", {M2D_DIM_KV_B, M2D_DIM_KV_LORA}, 0},
    {M2D_SCOPE_LAYER, M2D_T_O, LAYER_ "self_attn.o_proj.weight", {M2D_DIM_HIDDEN, M2D_DIM_ATTN_OUT}, 0},
    M2D_DECODER_DENSE_FFN_TENSORS,
    {M2D_SCOPE_MOE, M2D_T_ROUTER, LAYER_ "mlp.gate.weight", {M2D_DIM_EXPERTS, M2D_DIM_HIDDEN}, 0},
    {M2D_SCOPE_MOE, M2D_T_SHARED_GATE, LAYER_ "mlp.shared_experts.gate_proj.weight", {M2D_DIM_SHARED_FFN, M2D_DIM_HIDDEN}, 0},
    {M2D_SCOPE_MOE, M2D_T_SHARED_UP, LAYER_ "mlp.shared_experts.up_proj.weight", {M2D_DIM_SHARED_FFN, M2D_DIM_HIDDEN}, 0},
    {M2D_SCOPE_MOE, M2D_T_SHARED_DOWN, LAYER_ "mlp.shared_experts.down_proj.weight", {M2D_DIM_HIDDEN, M2D_DIM_SHARED_FFN}, 0},
    M2D_DECODER_EXPERT_TENSORS,
    {0},
};
#undef LAYER_

/* OUT [d, heads * head_dim] = O [d, heads * v_head_dim] with zero columns after each head's
 * v_head_dim (OUT zeroed; the same dtype, bytes copied) */
static void pad_o_proj(const m2d_config *c, const m2d_tensor *o, void *out) {
    int d = c->hidden_size, H = c->num_attention_heads, vd = c->v_head_dim, hd = c->head_dim;
    size_t es = m2d_dtype_size(o->dtype);
    for (int r = 0; r < d; r++)
        for (int h = 0; h < H; h++)
            memcpy((char *)out + ((size_t)r * H * hd + (size_t)h * hd) * es,
                   (const char *)o->data + ((size_t)r * H * vd + (size_t)h * vd) * es, (size_t)vd * es);
}

/* o_proj [d, heads * v_head_dim] -> an owned [d, heads * head_dim], the engine's padded attention
 * output (pad_o_proj) */
static int deepseekv2_post_bind(m2d_model *m) {
    const m2d_config *c = &m->cfg;
    int d = c->hidden_size, H = c->num_attention_heads, vd = c->v_head_dim, hd = c->head_dim;
    for (int l = 0; l < c->num_hidden_layers && vd < hd; l++) {
        /* claimed: the stored o_proj counts as read though no role holds it any more */
        const m2d_tensor *o = m2d_model_claim(m, m->layers[l].o_proj->name, l, M2D_PART_LAYER, 2,
                                              (const int64_t[]){d, (int64_t)H * vd}, 0);
        if (!o) return -1;
        char *name = m2d_strfmt("%s (values padded to %d per head)", o->name, hd);
        m2d_tensor *p = m2d_model_new_tensor(m, name, o->dtype, 2, (const int64_t[]){d, (int64_t)H * hd});
        free(name);
        pad_o_proj(c, o, (void *)p->data); /* ours until bound (m2d_model_new_tensor) */
        m->layers[l].o_proj = p;
    }
    return 0;
}

/* the only tensor post_bind claims is each layer's stored o_proj, made into the role O */
static int deepseekv2_rederive(const m2d_model *m, int layer, const m2d_tensor *stored, const m2d_tensor *from,
                               void *out) {
    (void)layer, (void)stored;
    if (out) pad_o_proj(&m->cfg, from, out);
    return M2D_T_O;
}

/* dense: every layer dense of width s->ffn_width; MoE: fewer routed experts (greedy routing only) */
static int deepseekv2_student_config(void *json, const m2d_student_shape *s, const char *path) {
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(json, "num_hidden_layers");
    if (!s->moe) {
        m2d_json_set_number(json, "first_k_dense_replace", cJSON_IsNumber(layers) ? layers->valuedouble : 0);
        m2d_json_set_number(json, "intermediate_size", s->ffn_width);
        return 0;
    }
    const cJSON *method = cJSON_GetObjectItemCaseSensitive(json, "topk_method");
    if (cJSON_IsString(method) && strcmp(method->valuestring, "greedy") != 0)
        return m2d_err1("%s: field 'topk_method': %s routing has no smaller-MoE student (convert --target dense)", path,
                        method->valuestring);
    m2d_json_set_number(json, "n_routed_experts", s->n_experts);
    m2d_json_set_number(json, "num_experts_per_tok", s->top_k);
    return 0;
}

M2D_ARCH(deepseekv2, .name = "DeepseekV2ForCausalLM",
         .summary = "DeepSeek-V2 / -Lite (multi-head latent attention, YaRN, shared experts, group-limited routing, "
                    "first dense layers); dense student: every layer dense, MLA unchanged",
         .parse_config = parse_deepseekv2, .tensors = deepseekv2_tensors, .student = "DeepseekV2ForCausalLM",
         .student_config = deepseekv2_student_config, .tensor_present = deepseekv2_tensor_present,
         .post_bind = deepseekv2_post_bind, .rederive = deepseekv2_rederive, .family = "DeepSeek-V2")
