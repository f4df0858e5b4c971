/* engine_check — what the engine implements, checked before it runs (engine_check.h): the
 * shapes, the tensors each layer's ops need, and the backend capabilities the model's layers call
 * for (m2d_engine_required_caps). */
#include "engine/engine_check.h"

#include <stdio.h>
#include <string.h>

#include "base/util.h"
#include "engine/engine.h"

static int check_shapes(const m2d_model *m) {
    const m2d_config *c = &m->cfg;
    const char *dir = m->dir ? m->dir : "model";
    if (c->hidden_size <= 0 || c->num_attention_heads <= 0 || c->num_key_value_heads <= 0 || c->head_dim <= 0 ||
        c->head_dim % 2 || c->num_attention_heads % c->num_key_value_heads || c->vocab_size <= 0 ||
        c->num_hidden_layers <= 0)
        return m2d_err("%s: config: inconsistent attention shape (heads %d, kv heads %d, head_dim %d)", dir,
                       c->num_attention_heads, c->num_key_value_heads, c->head_dim);
    if (c->head_dim > M2D_MAX_HEAD_DIM)
        return m2d_err("%s: field 'head_dim': %d exceeds the supported maximum %d", dir, c->head_dim, M2D_MAX_HEAD_DIM);
    return 0;
}

static int need(const m2d_model *m, int l, const m2d_tensor *t, const char *what) {
    if (t) return 0;
    return m2d_err("%s: layer %d: no '%s' tensor bound (the engine needs it for %s)", m->dir ? m->dir : "model", l,
                   what, m->cfg.arch);
}

/* q/k norm tensors exactly as cfg.ops.qk_norm says: absent, [head_dim], or the whole projection */
static int check_qk_norm(const m2d_model *m, int l) {
    const m2d_config *c = &m->cfg;
    const m2d_layer *L = &m->layers[l];
    if (c->ops.qk_norm == M2D_QK_NORM_NONE) {
        if (L->q_norm || L->k_norm)
            return m2d_err("%s: layer %d: q/k norm tensors bound, but %s's ops say no q/k norm", m->dir, l, c->arch);
        return 0;
    }
    if (c->ops.qk_norm != M2D_QK_NORM_PER_HEAD && c->ops.qk_norm != M2D_QK_NORM_WHOLE)
        return m2d_err("%s: q/k norm kind %d is not implemented by the engine", m->dir, (int)c->ops.qk_norm);
    if (need(m, l, L->q_norm, "q_norm") || need(m, l, L->k_norm, "k_norm")) return -1;
    int whole = c->ops.qk_norm == M2D_QK_NORM_WHOLE;
    int64_t q = whole ? (int64_t)c->num_attention_heads * c->head_dim : c->head_dim;
    int64_t k = whole ? (int64_t)c->num_key_value_heads * c->head_dim : c->head_dim;
    if (m2d_tensor_numel(L->q_norm) != q || m2d_tensor_numel(L->k_norm) != k)
        return m2d_err("%s: layer %d: q/k norm weights have %lld/%lld elements, expected %lld/%lld", m->dir, l,
                       (long long)m2d_tensor_numel(L->q_norm), (long long)m2d_tensor_numel(L->k_norm), (long long)q,
                       (long long)k);
    return 0;
}

/* the attention tensors ops.attn reads */
static int check_attention(const m2d_model *m, int l) {
    const m2d_layer *L = &m->layers[l];
    if (m->cfg.ops.attn != M2D_ATTN_MLA)
        return need(m, l, L->q_proj, "q_proj") || need(m, l, L->k_proj, "k_proj") || need(m, l, L->v_proj, "v_proj") ||
                       check_qk_norm(m, l)
                   ? -1
                   : 0;
    if (m->cfg.q_lora_rank ? need(m, l, L->q_a_proj, "q_a_proj") || need(m, l, L->q_a_norm, "q_a_norm") ||
                                 need(m, l, L->q_b_proj, "q_b_proj")
                           : need(m, l, L->q_proj, "q_proj"))
        return -1;
    return need(m, l, L->kv_a_proj, "kv_a_proj") || need(m, l, L->kv_a_norm, "kv_a_norm") ||
                   need(m, l, L->kv_b_proj, "kv_b_proj")
               ? -1
               : 0;
}

static int check_layer(const m2d_model *m, int l) {
    const m2d_layer *L = &m->layers[l];
    if (need(m, l, L->attn_norm, "attn_norm") || check_attention(m, l) || need(m, l, L->o_proj, "o_proj") ||
        need(m, l, L->ffn_norm, "ffn_norm"))
        return -1;
    if (!m->cfg.layer_is_moe[l]) {
        if (need(m, l, L->gate_proj, "gate_proj") || need(m, l, L->up_proj, "up_proj") ||
            need(m, l, L->down_proj, "down_proj"))
            return -1;
        /* a dense layer stored as one expert routed top-1 (OLMoE's dense student): the softmax
         * over its one logit is 1, so the router is never evaluated */
        if (L->router && m2d_tensor_numel(L->router) != m->cfg.hidden_size)
            return m2d_err("%s: layer %d: a dense layer with a router of %lld elements (one row of %d expected)",
                           m->dir, l, (long long)m2d_tensor_numel(L->router), m->cfg.hidden_size);
        return 0;
    }
    if (need(m, l, L->router, "router")) return -1;
    if (L->shared_gate_proj || L->shared_up_proj || L->shared_down_proj || L->shared_expert_gate) {
        if (need(m, l, L->shared_gate_proj, "shared_gate_proj") || need(m, l, L->shared_up_proj, "shared_up_proj") ||
            need(m, l, L->shared_down_proj, "shared_down_proj"))
            return -1;
        if (m2d_tensor_numel(L->shared_gate_proj) != (int64_t)m->cfg.shared_expert_intermediate_size * m->cfg.hidden_size)
            return m2d_err("%s: layer %d: shared experts of %lld elements, config says width %d", m->dir, l,
                           (long long)m2d_tensor_numel(L->shared_gate_proj), m->cfg.shared_expert_intermediate_size);
    }
    int weights[3] = {M2D_X_EXP_GATE, M2D_X_EXP_UP, M2D_X_EXP_DOWN}; /* the biases are optional */
    for (int r = 0; r < 3; r++)
        if (!L->x[weights[r]]) return need(m, l, NULL, m2d_expert_role_name(weights[r]));
    return 0;
}

int m2d_engine_rope_dim(const m2d_config *c) { return c->rope_dim ? c->rope_dim : c->head_dim; }

int m2d_engine_check_model(const m2d_model *m) {
    if (!m || !m->layers || !m->embed || !m->lm_head || !m->final_norm)
        return m2d_err("engine: model is not bound (missing embed/lm_head/final_norm/layers)");
    const m2d_layer_ops *ops = &m->cfg.ops;
    if ((ops->router != M2D_ROUTER_SOFTMAX_TOPK && ops->router != M2D_ROUTER_TOPK_SOFTMAX) ||
        (ops->ffn_act != M2D_ACT_SWIGLU && ops->ffn_act != M2D_ACT_SWIGLU_CLAMP) ||
        (ops->rope != M2D_ROPE_NEOX && ops->rope != M2D_ROPE_INTERLEAVED))
        return m2d_err("%s: %s uses a router, activation or RoPE variant the engine does not implement", m->dir,
                       m->cfg.arch);
    int rot = m2d_engine_rope_dim(&m->cfg);
    if (rot <= 0 || rot % 2 || rot > m->cfg.head_dim)
        return m2d_err("%s: config: RoPE over %d dimensions of a head of %d (must be even and fit)", m->dir, rot,
                       m->cfg.head_dim);
    if (check_shapes(m)) return -1;
    for (int l = 0; l < m->cfg.num_hidden_layers; l++)
        if (check_layer(m, l)) return -1;
    return 0;
}

/* the capabilities (backend.h) of one layer's weights: biases, the shared-expert gate */
static uint64_t layer_caps(const m2d_layer *L) {
    static const int bias_roles[] = {M2D_T_Q_BIAS,    M2D_T_K_BIAS,  M2D_T_V_BIAS,   M2D_T_O_BIAS,
                                     M2D_T_GATE_BIAS, M2D_T_UP_BIAS, M2D_T_DOWN_BIAS, M2D_T_ROUTER_BIAS};
    static const int expert_bias_roles[] = {M2D_X_EXP_GATE_BIAS, M2D_X_EXP_UP_BIAS, M2D_X_EXP_DOWN_BIAS};
    uint64_t caps = 0;
    for (size_t i = 0; i < M2D_ARRAY_LEN(bias_roles); i++)
        if (L->w[bias_roles[i]]) caps |= M2D_CAP(M2D_CAP_BIAS);
    for (size_t i = 0; i < M2D_ARRAY_LEN(expert_bias_roles); i++)
        if (L->x[expert_bias_roles[i]]) caps |= M2D_CAP(M2D_CAP_MOE_BIAS);
    if (L->w[M2D_T_SHARED_EXPERT_GATE]) caps |= M2D_CAP(M2D_CAP_SIGMOID_SCALE);
    return caps;
}

uint64_t m2d_engine_required_caps(const m2d_model *m) {
    const m2d_config *c = &m->cfg;
    uint64_t caps = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        caps |= layer_caps(&m->layers[l]);
        if (c->layer_window && c->layer_window[l] > 0) caps |= M2D_CAP(M2D_CAP_ATTN_WINDOW);
        if (m->layers[l].w[M2D_T_SINKS]) caps |= M2D_CAP(M2D_CAP_ATTN_SINKS);
    }
    if (c->ops.rope == M2D_ROPE_INTERLEAVED) caps |= M2D_CAP(M2D_CAP_ROPE_INTERLEAVED);
    if (c->rope_scaling.kind != M2D_ROPE_SCALING_NONE) caps |= M2D_CAP(M2D_CAP_ROPE_SCALED);
    if (m2d_engine_rope_dim(c) < c->head_dim) caps |= M2D_CAP(M2D_CAP_ROPE_PARTIAL);
    if (c->attn_scale != 0) caps |= M2D_CAP(M2D_CAP_ATTN_SCALE);
    if (c->clip_qkv > 0) caps |= M2D_CAP(M2D_CAP_CLAMP);
    if (c->ops.ffn_act == M2D_ACT_SWIGLU_CLAMP) caps |= M2D_CAP(M2D_CAP_GLU_CLAMP);
    if (c->num_experts > 0) {
        if (c->ops.router == M2D_ROUTER_TOPK_SOFTMAX) caps |= M2D_CAP(M2D_CAP_ROUTE_TOPK_SOFTMAX);
        if (c->n_group > 0) caps |= M2D_CAP(M2D_CAP_ROUTE_GROUPS);
        if (c->routed_scaling_factor != 0 && c->routed_scaling_factor != 1) caps |= M2D_CAP(M2D_CAP_ROUTE_SCALE);
    }
    return caps;
}

/* A model whose layers need an op or variant the backend lacks is refused here, naming it,
 * instead of failing mid-forward. */
int m2d_engine_check_caps(const m2d_model *m, const m2d_backend *be) {
    int miss = m2d_backend_missing(be, m2d_engine_required_caps(m));
    if (miss < 0) return 0;
    return m2d_err("%s: %s needs '%s', which backend %s does not implement", m->dir ? m->dir : "model", m->cfg.arch,
                   m2d_cap_name((m2d_cap)miss), be->ops->name);
}
