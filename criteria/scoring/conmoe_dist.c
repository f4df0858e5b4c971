/* ConMoE's distance-only prototype selection (paper 002 Table 3, App. C): s_e = b_e, the normalised
 * weight distance to the nearest other expert of the scope (one layer, or a pooled cross-layer
 * scope through score_scope); keeps the hardest-to-replace experts, ignoring routing. */
#include "criteria/crit.h"
#include "base/util.h"

static int dist_scope(const m2d_layer_view *views, int n, double *scores) {
    double eps;
    if (m2d_crit_eps_param(views[0].params, M2D_SCORING, "conmoe-dist", &eps) != 0) return -1;
    return m2d_crit_pool_nearest(views, n, "conmoe-dist", eps, scores);
}

static int dist_score(const m2d_layer_view *v, double *scores) { return dist_scope(v, 1, scores); }

M2D_PLUGIN(conmoe_dist, .name = "conmoe-dist", .kind = M2D_SCORING,
           .summary = "ConMoE distance only (paper 002 Table 3): weight distance to the nearest other expert",
           .score = dist_score, .score_scope = dist_scope, .params_default = "eps=1e-8",
           .display = "Distance-only")
