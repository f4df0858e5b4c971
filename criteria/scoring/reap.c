/* REAP (paper 003): mean over routed tokens of g_e(t)·‖f_e(t)‖. */
#include "criteria/crit.h"

static int reap_score(const m2d_layer_view *v, double *scores) {
    if (m2d_crit_need_stats(v, "reap") != 0) return -1;
    const m2d_layer_stats *s = v->stats;
    for (int e = 0; e < v->E; e++) scores[e] = m2d_crit_routed_avg(s, s->sum_gf, e);
    return 0;
}

M2D_PLUGIN(reap, .name = "reap", .kind = M2D_SCORING,
           .summary = "REAP: gate-weighted mean output norm Σg‖f‖_e / n_e",
           .score = reap_score,
           .display = "REAP", .report_rank = 16)
