/* reffwd — the naive float64 reference forward every engine test compares against: straight loops
 * over the Hugging Face definitions (Qwen3 / Qwen3-MoE, the OLMoE-style q/k norm over the whole
 * projection, attention biases and clip_qkv, Mixtral's sliding window, GPT-OSS's biases, sinks,
 * windows, clamped SwiGLU and router, shared experts with or without Qwen2-MoE's sigmoid gate,
 * DeepSeek-V2's latent attention, group-limited routing and gate factor), one token at a time,
 * everything in double. Independent of the engine, its backends, its batching and its weight
 * conversion: it reads the model's tensors (the stored ones) and HF config fields only (q/k norm
 * kind from the norm weight's length, latent attention, biases and sinks from their tensors, gates
 * from norm_topk_prob, windows from layer_window, GPT-OSS's activation and router from its
 * architecture name), not cfg.ops -- except GPT-OSS's swiglu_alpha / swiglu_limit, config values
 * kept there. */
#ifndef M2D_REFFWD_H
#define M2D_REFFWD_H

#include <stdint.h>

#include "model/model.h"

/* logits [n, vocab] in double for tokens tok[0..n) from position 0 */
/* T's elements as float64 (malloc'd) */
double *tu_ref_tensor_f64(const m2d_tensor *t);
/* RoPE of one head's first ROT dims at position POS, as config C says (theta, linear or YaRN
 * frequencies, YaRN's gain on cos and sin): pairs (i, i + rot/2), or (2i, 2i + 1) when INTERLEAVED */
void tu_ref_rope(double *v, int rot, int pos, const m2d_config *c, int interleaved);
void tu_ref_forward(const m2d_model *m, const int32_t *tok, int n, double *logits);
/* Same, with the q/k norms skipped (a deliberately wrong model: tests show their tolerance is
 * far below the difference it makes). */
void tu_ref_forward_no_qk_norm(const m2d_model *m, const int32_t *tok, int n, double *logits);
/* y [hidden] = the FFN of LAYER on x [hidden] (no norm, no residual): expert EXPERT of an MoE
 * layer, or the dense FFN when EXPERT < 0; biases and activation as in the forward above. */
void tu_ref_ffn(const m2d_model *m, int layer, int expert, const double *x, double *y);

#endif
