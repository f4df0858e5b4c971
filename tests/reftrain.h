/* reftrain — the float64 reference of the distillation loss of a dense student as a function of
 * its parameters (straight loops over the Hugging Face definitions of the dense students: Qwen3,
 * with the q/k/v/o and FFN biases, clip_qkv, the whole-projection q/k norm, GPT-OSS's sinks,
 * sliding windows and clamped SwiGLU, and RoPE as tests/reffwd.c rotates it, but
 * on a flat double vector laid out as the trainer's parameter buffers, m2d_train_params), so that
 * finite differences of it give the exact gradient the trainer's fp32 backward must match. */
#ifndef M2D_REFTRAIN_H
#define M2D_REFTRAIN_H

#include <stdint.h>

#include "model/model.h"
#include "train/params.h"

typedef struct {
    const m2d_config *cfg;       /* the student's */
    const m2d_train_params *layout;
    int n_seq, L;
    const int32_t *tokens;       /* [n_seq * L] */
    const double *teacher_logits;/* [n_seq * L, vocab] */
    const double *teacher_layers;/* [layers][n_seq * L][d] (MSE only) or NULL */
    int reverse;                 /* reverse KL instead of forward */
    double scale;                /* weight of each position (1 / positions of the step) */
    double mse_weight;           /* 0: no MSE term */
} tu_kd_problem;

/* The loss at parameters W (p->total doubles). */
double tu_ref_kd_loss(const tu_kd_problem *pb, const double *w);
/* Student logits [n_seq * L, vocab] in float64 at parameters W. */
void tu_ref_student_logits(const tu_kd_problem *pb, const double *w, double *logits);

#endif
