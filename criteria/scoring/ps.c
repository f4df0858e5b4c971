/* PS: router probability summed over the tokens routed to e, per calibration token. */
#include "criteria/crit.h"

static int ps_score(const m2d_layer_view *v, double *scores) {
    if (m2d_crit_need_stats(v, "ps") != 0) return -1;
    const m2d_layer_stats *s = v->stats;
    for (int e = 0; e < v->E; e++) scores[e] = s->N > 0 ? s->sum_p_sel[e] / s->N : 0;
    return 0;
}

M2D_PLUGIN(ps, .name = "ps", .kind = M2D_SCORING,
           .summary = "probability mass on routed tokens Σp^sel_e / N (= SF × CP) (paper)",
           .score = ps_score,
           .display = "Post-Selection Probability", .report_rank = 3)
