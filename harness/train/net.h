/* net — forward and backward of a dense student (every op of cfg.ops that the engine implements
 * for dense GQA layers: RMSNorm, q/k/v/o biases, q/k norm per head or whole, clip_qkv, RoPE with
 * the engine's frequencies (linear / YaRN scaling, rotated width), causal GQA attention with
 * sliding windows, sinks and a softmax scale, SwiGLU or GPT-OSS's clamped SwiGLU with gate/up/down
 * biases, residuals, final norm; DeepSeek-V2's latent attention: q directly or through its LoRA,
 * the normed kv latent, kv_b_proj per head, the shared rotated key, YaRN's mscale in the scale)
 * on its training parameters, through the backend's ops.
 *
 * The forward is the engine's, op for op (engine.c forward_hidden: the same backend ops on the
 * same fp32 values, so the student's logits here equal the engine's on the same weights; tested
 * for Qwen3, Qwen2, Mistral, OLMoE, GPT-OSS and DeepSeek-V2 students), except that it keeps what
 * the backward needs. Per layer it saves its input, both norms' outputs, q/k before and after
 * norm+RoPE, v (with clip_qkv also q, k, v before the clamp; with MLA the q and kv latents before
 * and after their norms), the attention output, the gate (before the
 * activation), up and the activation's output; with recompute (activation checkpointing) only
 * the layer inputs are kept and a layer's forward is run again, into one scratch set, just
 * before its backward (same ops, same inputs: the same bits).
 *
 * A micro-batch is n_seq windows of L tokens from position 0, stacked as n_seq * L rows (GEMMs
 * over all rows, attention per window). The backward accumulates into the parameters' gradient
 * buffer (params.h); the caller zeroes it once per optimizer step (gradient accumulation). */
#ifndef M2D_TRAIN_NET_H
#define M2D_TRAIN_NET_H

#include <stdbool.h>
#include <stdint.h>

#include "model/model.h"
#include "train/params.h"

typedef struct m2d_net m2d_net;

typedef struct {
    int seq_len;            /* L */
    int max_seqs;           /* windows per micro-batch (b) */
    bool recompute;         /* activation checkpointing */
    m2d_precision prec;     /* the projections' GEMMs (q/k/v/o, the MLA latents, gate/up/down, and
                             * the LM head in the loss), forward and backward: FP32 (0), or BF16 —
                             * their operands (activations, fp32 master weights, incoming
                             * gradients) rounded to bf16, fp32 accumulation and results, as
                             * PyTorch's bf16 autocast without its bf16 outputs; attention, norms,
                             * activations, the loss and AdamW stay fp32 */
} m2d_net_opts;

/* A network over the parameters P of a model with config CFG (both must outlive it). */
int m2d_net_new(const m2d_config *cfg, m2d_train_params *p, const m2d_net_opts *o, m2d_net **out);
void m2d_net_free(m2d_net *n);

/* Forward of N_SEQ windows (tokens host [n_seq * L]); keeps the activations. The final-normed
 * hidden states are m2d_net_hidden; the residual stream after layer l is m2d_net_layer_out. */
int m2d_net_forward(m2d_net *n, const int32_t *tokens, int n_seq);
int m2d_net_rows(const m2d_net *n);
m2d_precision m2d_net_precision(const m2d_net *n);
m2d_mat m2d_net_hidden(const m2d_net *n);
m2d_mat m2d_net_layer_out(const m2d_net *n, int layer);
/* Where the loss writes dL/d hidden (same shape as m2d_net_hidden) before the backward. */
m2d_mat m2d_net_dhidden(const m2d_net *n);

/* Called during the backward when DOUT holds dL/d(layer LAYER's output) from the logits, before
 * the backward of layer LAYER runs: a loss on hidden states adds its gradient to DOUT here. */
typedef void (*m2d_net_layer_grad)(void *ctx, int layer, const m2d_mat *out, m2d_mat *dout);
/* Backward of the last forward from m2d_net_dhidden; gradients are added to P's. CB may be NULL. */
void m2d_net_backward(m2d_net *n, m2d_net_layer_grad cb, void *ctx);

/* Bytes of activations and backward scratch of a micro-batch of ROWS rows (the memory formula
 * of README "Distillation"): *saved is what the forward keeps, *scratch the backward's buffers
 * and the attention backward's per-head work (one L x L pair per thread). */
void m2d_net_activation_bytes(const m2d_config *cfg, int rows, int seq_len, int threads, bool recompute,
                              size_t *saved, size_t *scratch);

#endif
