/* MAN (paper 004): mean activation norm over routed tokens, S(1,0,1). */
#include "criteria/crit.h"

static int man_score(const m2d_layer_view *v, double *scores) {
    if (m2d_crit_need_stats(v, "man") != 0) return -1;
    const m2d_layer_stats *s = v->stats;
    for (int e = 0; e < v->E; e++) scores[e] = m2d_crit_routed_avg(s, s->sum_f, e);
    return 0;
}

M2D_PLUGIN(man, .name = "man", .kind = M2D_SCORING,
           .summary = "MAN: mean output norm over routed tokens Σ‖f‖_e / n_e",
           .score = man_score,
           .display = "MAN", .report_rank = 17)
