/* MoNE (paper 004 Table 6): (Σg_e / n_e) · ‖σ_e‖, σ_e the per-dimension std of f_e over routed
 * tokens with 1/(n_e − 1) (ddof=1, the paper's sample variance; an expert routed once scores 0);
 * ddof=0 gives the population std (1/n_e). The gate is renormalised over the top-k (Eq. 1;
 * renorm=0: the native gate). */
#include <math.h>

#include "criteria/crit.h"
#include "base/util.h"

static int mone_score(const m2d_layer_view *v, double *scores) {
    int renorm;
    if (m2d_crit_need_stats(v, "mone") != 0 || m2d_crit_renorm_param(v, "mone", &renorm) != 0) return -1;
    const m2d_layer_stats *s = v->stats;
    double ddof = m2d_param(v->params, "ddof", 1);
    if (ddof != 0 && ddof != 1)
        return m2d_err("scoring plugin 'mone': layer %d: field 'ddof': %g is not 0 or 1", s->layer, ddof);
    const double *sum_g = m2d_crit_routed_sum(s, 1, 0, renorm);
    for (int e = 0; e < v->E; e++) {
        double n = s->n[e], var_sum = 0;
        for (int j = 0; j < s->d; j++) var_sum += s->routed_var[(size_t)e * s->d + j];
        double bessel = ddof == 0 ? 1.0 : (n > 1 ? n / (n - 1) : 0.0);
        scores[e] = m2d_crit_routed_avg(s, sum_g, e) * sqrt(var_sum * bessel);
    }
    return 0;
}

M2D_PLUGIN(mone, .name = "mone", .kind = M2D_SCORING,
           .summary = "MoNE: mean routed gate × ‖per-dimension routed std of f_e‖ (sample std, ddof=1)",
           .score = mone_score, .params_default = "ddof=1,renorm=1")
