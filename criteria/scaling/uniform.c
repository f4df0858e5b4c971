/* uniform (SPEC §4): α_g = 1/k for every group. */
#include "criteria/crit.h"

static int uniform_scale(const m2d_layer_view *v, const int *selected, const double *scores, const int *group_of,
                         double *alpha) {
    (void)selected, (void)scores, (void)group_of;
    for (int g = 0; g < v->k; g++) alpha[g] = 1.0 / v->k;
    return 0;
}

M2D_PLUGIN(uniform, .name = "uniform", .kind = M2D_SCALING,
           .summary = "α_g = 1/k",
           .scale = uniform_scale,
           .display = "Uniform", .report_rank = 13)
