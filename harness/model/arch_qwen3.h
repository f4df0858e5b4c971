/* arch_qwen3 — pieces shared by the Qwen3 family adapters (dense Qwen3 and Qwen3-MoE), and
 * reusable by adapters of related families (a test-only adapter builds on them). */
#ifndef M2D_ARCH_QWEN3_H
#define M2D_ARCH_QWEN3_H

#include "model/model.h"

/* Attention, embedding, norm, RoPE and token fields common to Qwen3 and Qwen3-MoE, plus the
 * rejection of features we do not implement (attention_bias, sliding window, activations other
 * than silu; RoPE types other than default, linear and yarn: model/rope.h). Sets cfg->ops to Qwen3's (q/k norm per head, softmax top-k
 * router renormalised per norm_topk_prob, SwiGLU, rotate-half RoPE). */
int m2d_qwen3_parse_common(const void *json, const char *path, m2d_config *cfg);
/* Dense Qwen3's config (every layer dense, intermediate_size required). */
int m2d_qwen3_parse(const void *json, const char *path, m2d_config *cfg);
/* Qwen3-MoE's config fields on top of the common ones (experts, router, sparse layers). */
int m2d_qwen3moe_parse(const void *json, const char *path, m2d_config *cfg);
/* Qwen3-MoE's config.json rewritten for its student: a Qwen3ForCausalLM with
 * intermediate_size = s->ffn_width (MoE keys dropped), or the same architecture with fewer experts. */
int m2d_qwen3moe_student_config(void *json, const m2d_student_shape *s, const char *path);

/* The Qwen3 / Qwen3-MoE tensor table (dense layers use the DENSE entries, MoE layers the MOE and
 * EXPERT ones, so one table serves both). Ends with an entry whose name is NULL. */
extern const m2d_tensor_spec m2d_qwen3_tensors[];

#endif
