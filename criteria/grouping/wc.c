/* WC weight clustering (SPEC §3): average-linkage clustering (criteria/cluster.h) of the selected
 * experts under cosine distance between their flattened [W_gate; W_up; W_down], cut at k clusters.
 * The cosines come from one blocked SYRK over the weights (m2d_crit_expert_gram). */
#include <stdlib.h>

#include "criteria/cluster.h"
#include "criteria/crit.h"
#include "base/util.h"

static int wc_group(const m2d_layer_view *v, const int *selected, const double *scores, int *group_of) {
    (void)scores;
    if (m2d_crit_need_weights(v, "wc") != 0) return -1;
    double *G = m2d_malloc((size_t)v->K * v->K * sizeof *G);
    int rc = m2d_crit_expert_gram(v, selected, v->K, M2D_W_ALL, G);
    if (rc == 0) rc = m2d_cluster_gram_cosine(G, v->K, v->k, group_of);
    free(G);
    return rc;
}

M2D_PLUGIN(wc, .name = "wc", .kind = M2D_GROUPING,
           .summary = "weight clustering: average linkage, cosine distance of flattened [W_gate; W_up; W_down]",
           .group = wc_group,
           .display = "Weight Cluster", .report_rank = 9)
