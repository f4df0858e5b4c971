/* SEER (soft frequency): gate weight summed over routed tokens, S(0,1,0); the gate renormalised
 * over the top-k (paper 004 Eq. 1; renorm=0: the native gate). */
#include "criteria/crit.h"

static int seer_score(const m2d_layer_view *v, double *scores) {
    int renorm;
    if (m2d_crit_need_stats(v, "seer") != 0 || m2d_crit_renorm_param(v, "seer", &renorm) != 0) return -1;
    const double *sum = m2d_crit_routed_sum(v->stats, 1, 0, renorm);
    for (int e = 0; e < v->E; e++) scores[e] = sum[e];
    return 0;
}

M2D_PLUGIN(seer, .name = "seer", .kind = M2D_SCORING,
           .summary = "SEER soft frequency: summed gate weight Σg_e (gate renormalised over the top-k)",
           .score = seer_score, .params_default = "renorm=1")
