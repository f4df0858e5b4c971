/* optim — the learning-rate schedule, global-norm gradient clipping and AdamW over all
 * parameters (SPEC §7, paper Table 9), with torch's semantics:
 *   lr(s) for step s of S (1-based), W warm-up steps: s <= W: peak s / W; otherwise
 *         min + (peak - min) (1 + cos(pi (s - W) / (S - W))) / 2;
 *   clipping as torch.nn.utils.clip_grad_norm_: norm = the L2 norm of all gradients (reported
 *         before clipping), coefficient min(1, clip / (norm + 1e-6)) applied to every gradient;
 *   AdamW as torch.optim.AdamW (decoupled decay, bias correction; backend.h m2d_adamw_args),
 *         weight decay only on tensors of two or more dimensions. */
#ifndef M2D_TRAIN_OPTIM_H
#define M2D_TRAIN_OPTIM_H

#include "train/params.h"

typedef struct {
    double lr, min_lr;      /* peak and final learning rate */
    int warmup, steps;      /* W and S */
    double beta1, beta2, eps, weight_decay;
    double clip;            /* max gradient norm; 0: no clipping */
} m2d_optim_opts;

/* Paper defaults (Table 9): 1e-4 -> 1e-5, 20 warm-up steps, betas 0.9/0.95, eps 1e-8, wd 0.01, clip 1. */
void m2d_optim_defaults(m2d_optim_opts *o);
double m2d_lr_at(const m2d_optim_opts *o, int step);
/* Global L2 norm of the gradients (fp64, summed in a fixed order). */
double m2d_grad_norm(m2d_train_params *p);
/* One optimizer step S (1-based) on the accumulated gradients: clip, AdamW at lr(S). Returns the
 * gradient norm before clipping in *grad_norm and the learning rate in *lr. */
void m2d_optim_step(m2d_train_params *p, const m2d_optim_opts *o, int step, double *grad_norm, double *lr);

#endif
