/* indicator: α_g = 1 for every group — the 0/1 gates of paper 001 §2, g_{i,t} = 1[i ∈ S_t], under
 * which a dense student with all n' selected experts active sums their outputs unweighted. */
#include "criteria/crit.h"

static int indicator_scale(const m2d_layer_view *v, const int *selected, const double *scores, const int *group_of,
                           double *alpha) {
    (void)selected, (void)scores, (void)group_of;
    for (int g = 0; g < v->k; g++) alpha[g] = 1.0;
    return 0;
}

M2D_PLUGIN(indicator, .name = "indicator", .kind = M2D_SCALING,
           .summary = "α_g = 1 (the 0/1 selection gates of paper 001 §2)",
           .scale = indicator_scale,
           .display = "Indicator")
