/* none: every selected expert is its own group, nothing is merged. A dense student then holds
 * all K selected experts side by side (width K·d_e: paper 001 §2 (i), "dense conversion via
 * expert pruning", n → n', k = n'); an MoE student is plain pruning (paper 003). */
#include "criteria/crit.h"

static int none_group(const m2d_layer_view *v, const int *selected, const double *scores, int *group_of) {
    (void)selected, (void)scores;
    for (int i = 0; i < v->K; i++) group_of[i] = i;
    return 0;
}

M2D_PLUGIN(none, .name = "none", .kind = M2D_GROUPING,
           .summary = "no merging: every selected expert is its own group (groups = K; MoE: pruning)",
           .group = none_group, .group_count = M2D_GROUPS_EACH,
           .display = "None")
