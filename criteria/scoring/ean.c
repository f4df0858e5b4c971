/* EAN: expert activation norm summed over routed tokens, S(0,0,1). */
#include "criteria/crit.h"

static int ean_score(const m2d_layer_view *v, double *scores) {
    if (m2d_crit_need_stats(v, "ean") != 0) return -1;
    const m2d_layer_stats *s = v->stats;
    for (int e = 0; e < v->E; e++) scores[e] = s->sum_f[e];
    return 0;
}

M2D_PLUGIN(ean, .name = "ean", .kind = M2D_SCORING,
           .summary = "EAN: summed output norm over routed tokens Σ‖f‖_e",
           .score = ean_score,
           .display = "EAN", .report_rank = 19)
