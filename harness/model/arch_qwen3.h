/* arch_qwen3 — pieces shared by the Qwen3 family adapters (dense Qwen3 and Qwen3-MoE). */
#ifndef M2D_ARCH_QWEN3_H
#define M2D_ARCH_QWEN3_H

#include "model/model.h"

/* Attention, embedding, norm, RoPE and token fields common to Qwen3 and Qwen3-MoE, plus the
 * rejection of features we do not implement (rope_scaling, attention_bias, sliding window,
 * activations other than silu). */
int m2d_qwen3_parse_common(const void *json, const char *path, m2d_config *cfg);
/* Sanity of the parsed sizes (heads divide, positive sizes, k <= E, ...). */
int m2d_qwen3_check_config(const m2d_config *cfg, const char *path);
/* Bind embeddings, final norm, LM head and each layer's attention and norms. */
int m2d_qwen3_bind_common(m2d_model *m);
/* Bind layer L's dense SwiGLU FFN model.layers.L.mlp.{gate,up,down}_proj of width INTER. */
int m2d_qwen3_bind_dense_ffn(m2d_model *m, int l, int inter);

#endif
