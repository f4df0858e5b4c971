/* proportional (SPEC §4): α_g = Σ_{e∈g} s_e / Σ_{e∈S} s_e. When every selected score is 0 the
 * shares fall back to group sizes, |g| / K (matching the uniform average used for merging then). */
#include "criteria/crit.h"

static int proportional_scale(const m2d_layer_view *v, const int *selected, const double *scores,
                              const int *group_of, double *alpha) {
    double total = 0;
    for (int i = 0; i < v->K; i++) total += scores[selected[i]];
    for (int g = 0; g < v->k; g++) alpha[g] = 0;
    for (int i = 0; i < v->K; i++) alpha[group_of[i]] += total > 0 ? scores[selected[i]] / total : 1.0 / v->K;
    return 0;
}

M2D_PLUGIN(proportional, .name = "proportional", .kind = M2D_SCALING,
           .summary = "α_g = Σ_g s / Σ_S s (the group's share of the selected scores)",
           .scale = proportional_scale,
           .display = "Proportional", .report_rank = 14)
