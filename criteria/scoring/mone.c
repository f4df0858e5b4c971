/* MoNE: (Σg_e / n_e) · ‖σ_e‖, σ_e the per-dimension std of f_e over routed tokens.
 * SPEC default: population std (ddof=0). ddof=1 gives the sample std of paper 004's Table 6
 * (σ² · n/(n−1); an expert routed once then scores 0). */
#include <math.h>

#include "criteria/crit.h"
#include "base/util.h"

static int mone_score(const m2d_layer_view *v, double *scores) {
    if (m2d_crit_need_stats(v, "mone") != 0) return -1;
    const m2d_layer_stats *s = v->stats;
    double ddof = m2d_param(v->params, "ddof", 0);
    if (ddof != 0 && ddof != 1)
        return m2d_err("scoring plugin 'mone': layer %d: field 'ddof': %g is not 0 or 1", s->layer, ddof);
    for (int e = 0; e < v->E; e++) {
        double n = s->n[e], var_sum = 0;
        for (int j = 0; j < s->d; j++) var_sum += s->routed_var[(size_t)e * s->d + j];
        double bessel = ddof == 0 ? 1.0 : (n > 1 ? n / (n - 1) : 0.0);
        scores[e] = m2d_crit_routed_avg(s, s->sum_g, e) * sqrt(var_sum * bessel);
    }
    return 0;
}

M2D_PLUGIN(mone, .name = "mone", .kind = M2D_SCORING,
           .summary = "MoNE: mean routed gate × ‖per-dimension routed std of f_e‖",
           .score = mone_score, .params_default = "ddof=0")
