/* kd — the distillation loss of a micro-batch (SPEC §7): the teacher's logits from its hidden
 * states (the MoE engine in the same process, every step, full vocabulary), the student's from
 * the net, the divergence per position and its gradient, the student's LM head backward, then
 * the net's backward; with --loss fkl+mse also the hidden-state MSE of every decoder layer.
 *
 * Logits are formed in row blocks of at most KD_BLOCK_BYTES of fp32 per side, never [rows, V]:
 * teacher Z_T = H_T · W_T^T (in the teacher engine's precision, like the rest of its forward) and
 * student Z_S = H_S · W_S^T (fp32) with the backend's gemm (the engine's LM head op), the
 * backend's kd_loss turns Z_S into scale · dL/dZ_S, then dH_S = dZ_S · W_S and dW_S += dZ_S^T · H_S. Per-row losses come back to the host and are summed in row order. */
#ifndef M2D_TRAIN_KD_H
#define M2D_TRAIN_KD_H

#include <stdbool.h>

#include "engine/engine.h"
#include "train/net.h"
#include "train/params.h"

typedef enum { M2D_LOSS_FKL, M2D_LOSS_RKL, M2D_LOSS_FKL_MSE } m2d_loss_kind;

/* "fkl" | "rkl" | "fkl+mse" */
int m2d_loss_parse(const char *s, m2d_loss_kind *out);
const char *m2d_loss_name(m2d_loss_kind k);

/* How fkl+mse weighs the hidden-state MSE against the logit loss (w: mse_weight):
 *  - "minitron" (the default of distill and the sweep): as Minitron (Muralidharan et al., 2024)
 *    and its NeMo / Megatron-LM code (LogitsAndIntermediatesLossBalancer): the intermediate loss
 *    is the mean over decoder layers of each layer's MSE (mean over positions and hidden dims),
 *    scaled per micro-batch by the detached ratio L_logits / L_is, so that it weighs as much as the
 *    logit loss (its value equals L_logits); times w.
 *  - "sum": the earlier rule (SPEC §7 before issue 24, no source): w times the sum over layers of
 *    each layer's MSE, raw. */
typedef enum { M2D_MSE_SUM, M2D_MSE_MINITRON } m2d_mse_norm;
int m2d_mse_norm_parse(const char *s, m2d_mse_norm *out); /* "minitron" | "sum" */
const char *m2d_mse_norm_name(m2d_mse_norm n);

typedef struct m2d_kd m2d_kd;

/* The loss of TEACHER (run by engine TE) against the student trained in NET / P (config SCFG),
 * for micro-batches of up to MAX_ROWS rows. Teacher and student must share the vocabulary (and,
 * for the MSE, the hidden size and the number of layers). */
int m2d_kd_new(const m2d_model *teacher, m2d_engine *te, const m2d_config *scfg, m2d_net *net, m2d_train_params *p,
               int max_rows, m2d_loss_kind kind, double mse_weight, m2d_mse_norm mse_norm, m2d_kd **out);
void m2d_kd_free(m2d_kd *k);
/* The teacher's forward on N_SEQ windows of L tokens (host tokens [n_seq * L]). */
int m2d_kd_teacher(m2d_kd *k, const int32_t *tokens, int n_seq, int L);
/* After m2d_kd_teacher: the teacher's logits [rows, vocab] into host LOGITS (the KD targets, its LM
 * head in the teacher engine's precision as in the loss; tests). */
void m2d_kd_teacher_logits(m2d_kd *k, float *logits);
/* After m2d_net_forward on the same windows: the loss (each position weighted by SCALE: 1 / the
 * step's positions) and the whole backward. Adds the scaled divergence to *div and the scaled
 * MSE term to *mse. */
void m2d_kd_loss_backward(m2d_kd *k, double scale, double *div, double *mse);

#endif
