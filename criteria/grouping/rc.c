/* RC router clustering (SPEC §3): average-linkage clustering of the selected experts under cosine
 * distance between their router weight rows (d-vectors), cut at k clusters. */
#include <stdlib.h>

#include "criteria/cluster.h"
#include "criteria/crit.h"
#include "base/util.h"

static int rc_group(const m2d_layer_view *v, const int *selected, const double *scores, int *group_of) {
    (void)scores;
    if (m2d_crit_need_weights(v, "rc") != 0) return -1;
    float *rows = m2d_crit_router_rows(v, selected, v->K);
    if (!rows) return -1;
    double *G = m2d_malloc((size_t)v->K * v->K * sizeof *G);
    m2d_crit_rows_gram(rows, v->K, v->d, G);
    int rc = m2d_cluster_gram_cosine(G, v->K, v->k, group_of);
    free(rows);
    free(G);
    return rc;
}

M2D_PLUGIN(rc, .name = "rc", .kind = M2D_GROUPING,
           .summary = "router clustering: average linkage, cosine distance of router rows",
           .group = rc_group,
           .display = "Router Cluster", .report_rank = 10)
