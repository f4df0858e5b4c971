/* ACP: CP scaled by the root-mean-square output norm of e over ALL tokens, consistent with the
 * Gram matrix used by D-optimal selection (SPEC §2 default). */
#include <math.h>

#include "criteria/crit.h"

static int acp_score(const m2d_layer_view *v, double *scores) {
    if (m2d_crit_need_stats(v, "acp") != 0) return -1;
    const m2d_layer_stats *s = v->stats;
    for (int e = 0; e < v->E; e++) {
        double mean_sq_norm = s->N > 0 ? s->gram[(size_t)e * s->E + e] / s->N : 0;
        scores[e] = m2d_crit_cp(s, e) * sqrt(mean_sq_norm);
    }
    return 0;
}

M2D_PLUGIN(acp, .name = "acp", .kind = M2D_SCORING,
           .summary = "CP · sqrt(G_ee / N): CP times the RMS output norm over all tokens (paper default)",
           .score = acp_score,
           .display = "Activation-Wtd Cond. Prob.", .report_rank = 5)
