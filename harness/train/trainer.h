/* trainer — one optimizer step of distillation: for each micro-batch of the step's windows, the
 * teacher's forward (the MoE engine), the student's forward, the loss and the backward
 * (gradients accumulate over micro-batches), then clipping and AdamW (optim.h). Everything runs
 * on one backend object of the student's (the teacher's engine has its own); neither the training
 * ops (backend_cpu_train.c) nor the engine's forward depend on the thread count: a step is bit for
 * bit the same at any thread count (tests/test_distill.c thread_count_independent). How the step
 * is split into micro-batches changes its result only by the fp32 rounding of the gradient sums
 * (each micro-batch's gradient is added in order), except under --mse-norm minitron: its detached
 * ratio L_logits / L_is is taken per micro-batch, as NeMo / Megatron-LM take it per micro-batch
 * under gradient accumulation, so the micro-batch size is part of the loss there (it is part of a
 * run's identity, and the manifest records it). */
#ifndef M2D_TRAIN_TRAINER_H
#define M2D_TRAIN_TRAINER_H

#include <stdbool.h>

#include "model/model.h"
#include "train/kd.h"
#include "train/net.h"
#include "train/optim.h"
#include "train/params.h"

typedef struct {
    int seq_len;            /* L */
    int batch;              /* B: windows per optimizer step */
    int micro_batch;        /* b: windows per forward/backward (divides B; 0: B) */
    bool recompute;         /* activation checkpointing */
    m2d_loss_kind loss;
    double mse_weight;      /* --loss fkl+mse */
    m2d_mse_norm mse_norm;  /* its weighting against the logit loss (kd.h; 0: "sum") */
    int teacher_topk;       /* > 0: the teacher routes with Eq. 6 over K' experts; 0 or the teacher's
                             * own top-k: its own routing (m2d_trainer_route_topk) */
    m2d_optim_opts optim;
    int threads;            /* <= 0: m2d_default_threads() */
    const char *backend;    /* NULL: "cpu" */
    const char *teacher_backend; /* the teacher's forward (its hidden states reach the student's
                                  * backend through the host); NULL: backend */
    m2d_precision precision;/* of the TEACHER's forward and LM head (the KD targets; 0: FP32; AUTO is
                             * resolved by the engine: m2d_trainer_precision); the student's GEMMs
                             * follow train_precision, whatever this says. */
    m2d_precision train_precision; /* the student's projection GEMMs, forward and backward (m2d_net_opts
                                    * prec): FP32 (0) or BF16 operands; its master weights, AdamW,
                                    * attention, norms and loss stay fp32 either way */
} m2d_trainer_opts;

typedef struct {
    double loss;            /* the step's mean loss before the update (divergence + MSE term) */
    double div, mse;        /* its two parts */
    double grad_norm;       /* before clipping */
    double lr;
    double teacher_s;       /* wall seconds of the step in the teacher's forward through its layers
                             * (m2d_kd_teacher: the engine's hidden states, uploaded); its LM head runs
                             * block by block inside the loss and is not included */
} m2d_step_stats;

typedef struct m2d_trainer m2d_trainer;

/* TEACHER and STUDENT must outlive the trainer. */
int m2d_trainer_new(const m2d_model *teacher, const m2d_model *student, const m2d_trainer_opts *o, m2d_trainer **out);
void m2d_trainer_free(m2d_trainer *t);
/* Optimizer step STEP (1-based) on TOKENS: the step's B windows of L tokens, in order. */
int m2d_trainer_step(m2d_trainer *t, int step, const int32_t *tokens, m2d_step_stats *st);
m2d_train_params *m2d_trainer_params(m2d_trainer *t);
/* Where the teacher's forward runs: O's teacher_backend, else the student's backend (NULL: "cpu"). */
const char *m2d_trainer_teacher_backend(const m2d_trainer_opts *o);
/* The precision the teacher runs in (AUTO resolved). */
m2d_precision m2d_trainer_precision(const m2d_trainer *t);
/* The student's logits [n_seq * L, vocab] on N_SEQ windows through the training forward (tests:
 * they equal the engine's on the same weights). */
int m2d_trainer_logits(m2d_trainer *t, const int32_t *tokens, int n_seq, float *logits);
/* The teacher's logits [n_seq * L, vocab] on N_SEQ windows: the KD targets, computed as a step
 * computes them (the teacher engine's hidden states, its LM head in the teacher's precision). */
int m2d_trainer_teacher_logits(m2d_trainer *t, const int32_t *tokens, int n_seq, float *logits);
/* Peak resident set of the process so far (bytes; getrusage). */
size_t m2d_peak_rss(void);

/* Parse a --train-precision value (fp32 or bf16; AUTO is refused: the student's precision is a
 * choice of the experiment, not of the machine); error naming WHAT. */
int m2d_train_precision_parse(const char *s, const char *what, m2d_precision *out);

/* The K' the teacher's routing is overridden with (Eq. 6: its K' most probable experts weighted
 * by their raw softmax probabilities) for TOPK: 0, the teacher's own routing, when TOPK is 0 or
 * the teacher's own top-k (the paper's Table 4 row "k' = 8 (default)" is the teacher as trained,
 * renormalised where its config renormalises; a literal Eq. 6 at K' = k would not be); else TOPK. */
int m2d_trainer_route_topk(const m2d_config *teacher, int topk);

#endif
