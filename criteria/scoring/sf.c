/* SF: fraction of calibration tokens routed to e. */
#include "criteria/crit.h"

static int sf_score(const m2d_layer_view *v, double *scores) {
    if (m2d_crit_need_stats(v, "sf") != 0) return -1;
    const m2d_layer_stats *s = v->stats;
    for (int e = 0; e < v->E; e++) scores[e] = s->N > 0 ? s->n[e] / s->N : 0;
    return 0;
}

M2D_PLUGIN(sf, .name = "sf", .kind = M2D_SCORING,
           .summary = "selection frequency n_e / N (paper)",
           .score = sf_score,
           .display = "Selection Frequency", .report_rank = 1)
