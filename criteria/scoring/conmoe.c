/* ConMoE (paper 002 §4.1, App. B.1): s_e = Norm_G(a)_e · Norm_G(b)_e over the experts of a scope
 * G (one layer for the plain plugin; several neighbouring layers pooled when the remap grouping
 * scores a cross-layer scope through score_scope), with
 *   a_e = REAP_e = Σg‖f‖_e / n_e (g the normalised routing weight: renormalised over the top-k,
 *         paper 004 Eq. 1; renorm=0: the native gate),
 *   b_e = min_{e'∈E_G, e'≠e} d(e,e'), d the normalised weight distance (m2d_crit_weight_distance),
 *   Norm_G(x)_e = (x_e − min_G x) / (max_G x − min_G x + ε)   (ε = param eps, default 1e-8).
 * ‖W^e − W^e'‖² is taken from a per-matrix Gram (one blocked SYRK, not E² difference passes):
 * ‖x‖² + ‖y‖² − 2<x,y>, clamped at 0, so near-identical experts have distance ~1e-3 relative noise.
 * conmoe-dist (its own file) is the distance-only selection of the paper's Table 3 (b_e alone). */
#include <math.h>
#include <stdlib.h>

#include "criteria/crit.h"
#include "base/util.h"

static void min_max_normalise(double *x, int n, double eps) {
    double lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) lo = fmin(lo, x[i]), hi = fmax(hi, x[i]);
    for (int i = 0; i < n; i++) x[i] = (x[i] - lo) / (hi - lo + eps);
}

static int conmoe_scope(const m2d_layer_view *views, int n, double *scores) {
    const int E = views[0].E, P = n * E;
    int renorm;
    double eps;
    for (int i = 0; i < n; i++)
        if (m2d_crit_need_stats(&views[i], "conmoe") != 0 || m2d_crit_renorm_param(&views[i], "conmoe", &renorm) != 0)
            return -1;
    if (m2d_crit_eps_param(views[0].params, M2D_SCORING, "conmoe", &eps) != 0) return -1;
    double *b = m2d_malloc((size_t)P * sizeof *b);
    if (m2d_crit_pool_nearest(views, n, "conmoe", eps, b) != 0) {
        free(b);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        const double *sum = m2d_crit_routed_sum(views[i].stats, 1, 1, renorm);
        for (int e = 0; e < E; e++) scores[(size_t)i * E + e] = m2d_crit_routed_avg(views[i].stats, sum, e);
    }
    min_max_normalise(scores, P, eps);
    min_max_normalise(b, P, eps);
    for (int e = 0; e < P; e++) scores[e] *= b[e];
    free(b);
    return 0;
}

static int conmoe_score(const m2d_layer_view *v, double *scores) { return conmoe_scope(v, 1, scores); }

M2D_PLUGIN(conmoe, .name = "conmoe", .kind = M2D_SCORING,
           .summary = "ConMoE: Norm(REAP) × Norm(distance to the nearest expert in weight space)",
           .score = conmoe_score, .score_scope = conmoe_scope, .params_default = "eps=1e-8,renorm=1",
           .display = "ConMoE", .report_rank = 20)

