/* dopt — greedy D-optimal expert selection (SPEC §2, DO-X) over any base importance I.
 *
 * Kernel 𝒦_ij = sqrt(I_i I_j) · G_ij / N, regulariser λ = (1/(K·E)) Σ_e 𝒦_ee. Greedy: K times add
 * the e ∉ S maximising log(𝒦_ee + λ − 𝒦_eS (𝒦_S + λI)^{-1} 𝒦_Se), ties → lower index. The residual
 * (Schur complement) of every candidate is kept up to date with one Cholesky column per step, so
 * no inverse is ever formed and a whole selection costs O(E·K²). */
#ifndef M2D_DOPT_H
#define M2D_DOPT_H

#include "criteria/registry.h"

/* Greedy over a symmetric PSD kernel [E*E] with regulariser lambda >= 0. selected[K] in greedy
 * order; gains[K] (may be NULL) = log of the residual at each pick, i.e.
 * log det(𝒦_{S_t} + λI) − log det(𝒦_{S_{t−1}} + λI). */
void m2d_dopt_greedy(const double *kern, int E, int K, double lambda, int *selected, double *gains);
/* 𝒦 [E*E] and λ for importances imp[E] from a layer's Gram matrix (uses G and N only). */
void m2d_dopt_kernel(const m2d_layer_stats *s, const double *imp, int K, double *kern, double *lambda);
/* The `select` hook of every do-X plugin: scores are the base importances I. */
int m2d_dopt_select(const m2d_layer_view *v, const double *scores, int *selected);

#endif
