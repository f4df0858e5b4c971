/* DO-ACP (paper): D-optimal selection with base importance I = ACP. Registered by name so
 * `moe2dense list` shows it; any other do-X is resolved on demand by m2d_plugin_find. */
#include "criteria/crit.h"
#include "criteria/dopt.h"

static int do_acp_score(const m2d_layer_view *v, double *scores) {
    return m2d_plugin_find(M2D_SCORING, "acp")->score(v, scores);
}

M2D_PLUGIN(do_acp, .name = "do-acp", .kind = M2D_SCORING,
           .summary = "D-optimal selection (greedy log-det on the Gram kernel) with importance I = acp (paper)",
           .score = do_acp_score, .select = m2d_dopt_select,
           .display = "D-Optimal + ACP", .report_rank = 7)
