/* expert_usage — paper 001's analyses of a trained MoE that need no training:
 *  - App. L, Fig. 5: how unequally the router uses the experts. Activation rate a_e = n_e / N
 *    (the fraction of calibration tokens routed to e); the Lorenz curve L(i/E) = the share of all
 *    activations held by the i least used experts, and the Gini coefficient
 *    G = Σ_i Σ_j |a_i − a_j| / (2 E² ā) (0: uniform, → 1: one expert takes everything).
 *  - App. I, Fig. 4: the Pearson correlation of the experts' down projections,
 *    C_ij = <w̃_i, w̃_j> / (‖w̃_i‖ ‖w̃_j‖), w̃ = vec(W_down) minus its mean (0 for a constant w). */
#ifndef M2D_EXPERT_USAGE_H
#define M2D_EXPERT_USAGE_H

#include "model/model.h"
#include "calib/stats.h"

/* Gini coefficient of x[n] >= 0 (0 when all are 0). */
double m2d_gini(const double *x, int n);
/* lorenz[0..n]: lorenz[i] = share of Σx held by the i smallest (lorenz[0] = 0, lorenz[n] = 1;
 * the diagonal i/n when Σx = 0). */
void m2d_lorenz(const double *x, int n, double *lorenz);
/* Pearson correlation of the E experts' down projections of layer L (teacher weights) into C[E*E]. */
int m2d_down_pearson(const m2d_model *m, int layer, double *C);

#endif
