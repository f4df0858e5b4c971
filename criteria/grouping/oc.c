/* OC output clustering (SPEC §3): average-linkage clustering of the selected experts under the
 * output distance d(i,j) = 1 − G_ij / sqrt(G_ii G_jj) from the calibration Gram matrix
 * (similarity 0, distance 1, when a norm is 0), cut at k clusters. */
#include <stdlib.h>

#include "criteria/cluster.h"
#include "criteria/crit.h"
#include "base/util.h"

static int oc_group(const m2d_layer_view *v, const int *selected, const double *scores, int *group_of) {
    (void)scores;
    if (m2d_crit_need_stats(v, "oc") != 0) return -1;
    const int K = v->K, E = v->E;
    double *G = m2d_malloc((size_t)K * K * sizeof *G);
    for (int i = 0; i < K; i++)
        for (int j = 0; j < K; j++) G[(size_t)i * K + j] = v->stats->gram[(size_t)selected[i] * E + selected[j]];
    int rc = m2d_cluster_gram_cosine(G, K, v->k, group_of);
    free(G);
    return rc;
}

M2D_PLUGIN(oc, .name = "oc", .kind = M2D_GROUPING,
           .summary = "output clustering: average linkage on 1 − cosine of expert outputs (calibration Gram)",
           .group = oc_group,
           .display = "Output Cluster", .report_rank = 12)
