/* SEER (soft frequency): gate weight summed over routed tokens, S(0,1,0). */
#include "criteria/crit.h"

static int seer_score(const m2d_layer_view *v, double *scores) {
    if (m2d_crit_need_stats(v, "seer") != 0) return -1;
    const m2d_layer_stats *s = v->stats;
    for (int e = 0; e < v->E; e++) scores[e] = s->sum_g[e];
    return 0;
}

M2D_PLUGIN(seer, .name = "seer", .kind = M2D_SCORING,
           .summary = "SEER soft frequency: summed gate weight Σg_e",
           .score = seer_score)
