/* ACP variant: the RMS output norm is taken over the tokens routed to e only. */
#include <math.h>

#include "criteria/crit.h"

static int acp_routed_score(const m2d_layer_view *v, double *scores) {
    if (m2d_crit_need_stats(v, "acp-routed") != 0) return -1;
    const m2d_layer_stats *s = v->stats;
    for (int e = 0; e < v->E; e++) scores[e] = m2d_crit_cp(s, e) * sqrt(m2d_crit_routed_avg(s, s->sum_f2, e));
    return 0;
}

M2D_PLUGIN(acp_routed, .name = "acp-routed", .kind = M2D_SCORING,
           .summary = "CP · sqrt(Σ‖f‖²_e / n_e): ACP with the RMS norm over routed tokens only",
           .score = acp_routed_score)
