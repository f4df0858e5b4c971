/* PP: average full-softmax probability of e over all tokens. */
#include "criteria/crit.h"

static int pp_score(const m2d_layer_view *v, double *scores) {
    if (m2d_crit_need_stats(v, "pp") != 0) return -1;
    const m2d_layer_stats *s = v->stats;
    for (int e = 0; e < v->E; e++) scores[e] = s->N > 0 ? s->sum_p[e] / s->N : 0;
    return 0;
}

M2D_PLUGIN(pp, .name = "pp", .kind = M2D_SCORING,
           .summary = "mean router probability Σp_e / N over all tokens (paper)",
           .score = pp_score,
           .display = "Pre-Selection Probability", .report_rank = 2)
