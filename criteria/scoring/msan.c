/* MSAN (paper 004): mean squared activation norm over routed tokens, S(1,0,2). */
#include "criteria/crit.h"

static int msan_score(const m2d_layer_view *v, double *scores) {
    if (m2d_crit_need_stats(v, "msan") != 0) return -1;
    const m2d_layer_stats *s = v->stats;
    for (int e = 0; e < v->E; e++) scores[e] = m2d_crit_routed_avg(s, s->sum_f2, e);
    return 0;
}

M2D_PLUGIN(msan, .name = "msan", .kind = M2D_SCORING,
           .summary = "MSAN: mean squared output norm over routed tokens Σ‖f‖²_e / n_e",
           .score = msan_score,
           .display = "MSAN", .report_rank = 18)
