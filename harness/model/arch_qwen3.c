/* arch_qwen3 — dense Qwen3 (Qwen3ForCausalLM), and the attention/embedding parts shared with
 * Qwen3-MoE. Semantics follow Hugging Face transformers' Qwen3Config / Qwen3MoeConfig: fields
 * that are absent take the HF default, except sizes that determine tensor shapes (required). */
#include "model/arch_qwen3.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "base/util.h"
#include "model/decoder.h"

int m2d_qwen3_parse_common(const void *json, const char *path, m2d_config *c) {
    static const m2d_decoder_defaults dflt = {.rms_norm_eps = 1e-6, .rope_theta = 10000.0,
                                              .max_position_embeddings = 32768};
    if (m2d_decoder_reject_attention_bias(json, path, "Qwen3") != 0 || m2d_decoder_reject_sliding(json, path) != 0 ||
        m2d_decoder_parse(json, path, &dflt, c) != 0)
        return -1;
    c->ops.qk_norm = M2D_QK_NORM_PER_HEAD;
    return 0;
}

#define LAYER_ "model.layers.%d."
const m2d_tensor_spec m2d_qwen3_tensors[] = {
    M2D_DECODER_TENSORS,
    {M2D_SCOPE_LAYER, M2D_T_Q_NORM, LAYER_ "self_attn.q_norm.weight", {M2D_DIM_HEAD, M2D_DIM_NONE}, 0},
    {M2D_SCOPE_LAYER, M2D_T_K_NORM, LAYER_ "self_attn.k_norm.weight", {M2D_DIM_HEAD, M2D_DIM_NONE}, 0},
    M2D_DECODER_DENSE_FFN_TENSORS,
    {M2D_SCOPE_MOE, M2D_T_ROUTER, LAYER_ "mlp.gate.weight", {M2D_DIM_EXPERTS, M2D_DIM_HIDDEN}, 0},
    M2D_DECODER_EXPERT_TENSORS,
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
    return m2d_decoder_check(c, path);
}

M2D_ARCH(qwen3, .name = "Qwen3ForCausalLM", .summary = "Qwen3 dense decoder (GQA, q/k RMSNorm, SwiGLU)",
         .parse_config = m2d_qwen3_parse, .tensors = m2d_qwen3_tensors)
