/* avg-cp (SPEC §4, for routers that do not renormalise top-k, e.g. DeepSeek-V2): α_g = mean CP of
 * the group's experts, CP_e = Σp^sel_e / n_e (0 for a never-routed expert). */
#include <stdlib.h>

#include "criteria/crit.h"
#include "base/util.h"

static int avg_cp_scale(const m2d_layer_view *v, const int *selected, const double *scores, const int *group_of,
                        double *alpha) {
    (void)scores;
    if (m2d_crit_need_stats(v, "avg-cp") != 0) return -1;
    int *size = m2d_calloc((size_t)v->k, sizeof *size);
    for (int g = 0; g < v->k; g++) alpha[g] = 0;
    for (int i = 0; i < v->K; i++) {
        alpha[group_of[i]] += m2d_crit_cp(v->stats, selected[i]);
        size[group_of[i]]++;
    }
    for (int g = 0; g < v->k; g++) alpha[g] = size[g] ? alpha[g] / size[g] : 0;
    free(size);
    return 0;
}

M2D_PLUGIN(avg_cp, .name = "avg-cp", .kind = M2D_SCALING,
           .summary = "α_g = mean CP of the group's experts (non-renormalising routers, e.g. DeepSeek-V2)",
           .scale = avg_cp_scale,
           .display = "Avg-CP", .report_rank = 15)
