/* REAP (paper 003 Eq. 9): mean over routed tokens of g_e(t)·‖f_e(t)‖, the gate renormalised over
 * the top-k (paper 004 Eq. 1; renorm=0: the model's native gate, which differs only on models that
 * do not renormalise, norm_topk_prob = false). */
#include "criteria/crit.h"

static int reap_score(const m2d_layer_view *v, double *scores) {
    int renorm;
    if (m2d_crit_need_stats(v, "reap") != 0 || m2d_crit_renorm_param(v, "reap", &renorm) != 0) return -1;
    const m2d_layer_stats *s = v->stats;
    const double *sum = m2d_crit_routed_sum(s, 1, 1, renorm);
    for (int e = 0; e < v->E; e++) scores[e] = m2d_crit_routed_avg(s, sum, e);
    return 0;
}

M2D_PLUGIN(reap, .name = "reap", .kind = M2D_SCORING,
           .summary = "REAP: gate-weighted mean output norm Σg‖f‖_e / n_e (gate renormalised over the top-k)",
           .score = reap_score, .params_default = "renorm=1",
           .display = "REAP", .report_rank = 16)
