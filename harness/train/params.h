/* params — the trainable tensors of a dense student (SPEC §7: every tensor is trained): fp32
 * master weights initialised from the checkpoint (bf16/f16 -> fp32 exactly), their gradients and
 * the two AdamW moments, each in one backend buffer with the same layout (tensor i at elements
 * [off, off + n)). Forward ops read the master weights through weight views (backend.h
 * weight_view), so an optimizer step is visible to the next forward without a copy.
 *
 * Which tensors: the embedding, every layer's tensors (by role), the final norm, and the LM head
 * unless it is tied to the embedding (then both roles are one parameter and their gradients add).
 * Weight decay applies to tensors of two or more dimensions only (not to norm weights). */
#ifndef M2D_TRAIN_PARAMS_H
#define M2D_TRAIN_PARAMS_H

#include <stdbool.h>
#include <stddef.h>

#include "engine/backend.h"
#include "model/model.h"

typedef struct {
    const char *name;       /* checkpoint name (the student tensor's) */
    int ndim;
    int64_t rows, cols;     /* 1-D: rows = length, cols = 1 */
    size_t off, n;          /* elements in the buffers */
    bool decay;             /* weight decay applies */
    m2d_weight *w;          /* view of the master weights */
} m2d_tparam;

typedef enum { M2D_PBUF_WEIGHTS, M2D_PBUF_GRADS, M2D_PBUF_ADAM_M, M2D_PBUF_ADAM_V, M2D_PBUF_COUNT } m2d_pbuf;

typedef struct {
    m2d_backend *be;
    const m2d_backend_train_ops *T;
    int n;                  /* parameters */
    m2d_tparam *p;
    size_t total;           /* elements per buffer */
    m2d_buf *buf[M2D_PBUF_COUNT];
    int n_layers;
    int embed, final_norm, lm_head; /* parameter indices (lm_head == embed when tied) */
    int (*layer)[M2D_T_COUNT];      /* [layer][role] -> parameter index, -1 when absent */
} m2d_train_params;

/* The first feature of config C that the training forward/backward (net.c) does not implement,
 * or NULL. It implements every dense-layer op of the engine but latent attention: GQA with or
 * without a q/k norm (per head or whole), q/k/v/o biases, clip_qkv, RoPE of every scaling and
 * rotated width, attention sinks, sliding windows, any attention scale, SwiGLU and GPT-OSS's
 * clamped SwiGLU with gate/up/down biases. C may be a teacher's: its dense student keeps its
 * attention, RoPE and activation (the sweep's dry run refuses with it before any work). */
const char *m2d_train_unsupported(const m2d_config *c);
/* The parameters of dense STUDENT on backend BE (which must have training ops), initialised from
 * its tensors; gradients and moments zero. -1 + m2d_err for a model with MoE layers, one with a
 * feature m2d_train_unsupported names, or a backend that cannot train. A dense student's unused
 * router row (OLMoE, GPT-OSS: their dense students keep a one-expert router the forward never
 * reads) is a parameter whose gradient is zero: AdamW leaves it as it is, up to weight decay. */
int m2d_train_params_new(const m2d_model *student, m2d_backend *be, m2d_train_params **out);
void m2d_train_params_free(m2d_train_params *p);
/* Buffer WHICH to or from host memory of p->total floats. */
void m2d_train_params_download(m2d_train_params *p, m2d_pbuf which, float *host);
void m2d_train_params_upload(m2d_train_params *p, m2d_pbuf which, const float *host);
void m2d_train_params_zero(m2d_train_params *p, m2d_pbuf which);
/* Gradient window of parameter I: [rows, cols] (a norm's: 1 x rows). */
m2d_mat m2d_train_params_grad(const m2d_train_params *p, int i);

/* STUDENT with every trained tensor replaced by an F32 tensor over HOST (p->total floats, laid
 * out as the buffers): an ordinary model for the engine (evaluation) and the writer (output).
 * Shares STUDENT's checkpoint; free with m2d_train_params_model_free. */
int m2d_train_params_model(const m2d_train_params *p, const m2d_model *student, float *host, m2d_model **out);
void m2d_train_params_model_free(m2d_model *view);

#endif
