/* crit — small helpers shared by the criteria plugins (statistics shortcuts, weight access,
 * cosine / Gram distances). Plugins stay a few lines by leaning on these. */
#ifndef M2D_CRIT_H
#define M2D_CRIT_H

#include <stdint.h>

#include "criteria/registry.h"

/* sum / n_e over routed tokens; 0 when the expert was never routed (SPEC §2) */
double m2d_crit_routed_avg(const m2d_layer_stats *s, const double *sum, int e);
/* CP_e = Σp^sel_e / n_e (0 when n_e = 0) */
double m2d_crit_cp(const m2d_layer_stats *s, int e);

/* Σ_routed g^a ‖f‖^c for a, c in {0,1,2}: g renormalised over the router's top-k (RENORM = 1,
 * paper 004 Eq. 1: r = p_e / Σ_{S(t)} p) or the model's native gate (RENORM = 0; the same on models
 * that renormalise, norm_topk_prob). NULL for other exponents. */
const double *m2d_crit_routed_sum(const m2d_layer_stats *s, int a, int c, int renorm);
/* The plugin parameter "renorm" (default 1: paper 004 Eq. 1), which must be 0 or 1. */
int m2d_crit_renorm_param(const m2d_layer_view *v, const char *plugin, int *renorm);
/* The plugin parameter "eps" (default 1e-8): the ε of ConMoE's min-max norm (max − min + ε) and
 * weight distance (‖A‖ + ‖B‖ + 2ε). Both denominators are 0 at ε = 0 on degenerate inputs (equal
 * scores, zero experts) and a negative ε reorders them, so it must be finite and > 0. */
int m2d_crit_eps_param(const m2d_params *params, m2d_plugin_kind kind, const char *plugin, double *eps);

/* -1 + m2d_err naming the plugin and layer when the view has no statistics / weights */
int m2d_crit_need_stats(const m2d_layer_view *v, const char *plugin);
int m2d_crit_need_weights(const m2d_layer_view *v, const char *plugin);

/* Router rows of experts idx[0..n) as fp32 [n*d] (caller frees); NULL + m2d_err on bad shape. */
float *m2d_crit_router_rows(const m2d_layer_view *v, const int *idx, int n);

/* Which expert matrices: bit 0 gate, bit 1 up, bit 2 down. */
enum { M2D_W_GATE = 1, M2D_W_UP = 2, M2D_W_DOWN = 4, M2D_W_ALL = 7 };
/* G[n*n] (double) = inner products of the flattened, concatenated matrices `which` of experts
 * idx[0..n). Blocked: each block of every expert is converted to fp32 and multiplied with one
 * SYRK, so memory stays O(n·block) even for 4.7M-weight experts. */
int m2d_crit_expert_gram(const m2d_layer_view *v, const int *idx, int n, int which, double *G);
/* The same for n experts that may come from different layers: expert idx[i] of layer w[i]. */
int m2d_crit_expert_gram_pool(const m2d_layer *const *w, const int *idx, int n, int which, double *G);
/* ConMoE's normalised weight distance (paper 002 App. B.1) between n experts (expert idx[i] of
 * layer w[i]): d(e,e') = (1/3) Σ_{m∈{gate,up,down}} 2‖W_m^e − W_m^e'‖_F / (‖W_m^e‖_F + ‖W_m^e'‖_F + 2ε),
 * ‖x − y‖² from the Gram (‖x‖² + ‖y‖² − 2<x,y>, clamped at 0). dist[n*n], diagonal 0. */
int m2d_crit_weight_distance(const m2d_layer *const *w, const int *idx, int n, double eps, double *dist);
/* b[n*E]: for every expert of the pool of N layers' views (layer i's at b + i*E), the weight
 * distance to the nearest other expert of the pool (0 for a pool of one). Needs weights. */
int m2d_crit_pool_nearest(const m2d_layer_view *views, int n, const char *plugin, double eps, double *b);
/* Inner products of n rows of length len (fp32) into G[n*n] (double), via blocked SYRK. */
void m2d_crit_rows_gram(const float *X, int n, int64_t len, double *G);

/* dist[n*n] = 1 − G_ij / sqrt(G_ii G_jj) (cosine distance from a Gram matrix); similarity 0 (distance 1)
 * when either norm is 0; diagonal 0. */
void m2d_crit_gram_to_cosine_distance(const double *G, int n, double *dist);

#endif
