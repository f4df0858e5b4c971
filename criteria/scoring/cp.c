/* CP: mean router probability of e on the tokens routed to it (0 if never routed). */
#include "criteria/crit.h"

static int cp_score(const m2d_layer_view *v, double *scores) {
    if (m2d_crit_need_stats(v, "cp") != 0) return -1;
    const m2d_layer_stats *s = v->stats;
    for (int e = 0; e < v->E; e++) scores[e] = m2d_crit_cp(s, e);
    return 0;
}

M2D_PLUGIN(cp, .name = "cp", .kind = M2D_SCORING,
           .summary = "conditional probability Σp^sel_e / n_e (paper)",
           .score = cp_score,
           .display = "Conditional Probability", .report_rank = 4)
