/* HC-SMoE (paper 003 App. D, Eq. 16; Chen et al. 2025): every expert of the layer (K = E) is
 * clustered by hierarchical agglomerative clustering with average linkage on the cosine distance
 * of the experts' representative vectors A_i = mean output over all calibration tokens (μ_e of the
 * statistics): D_ij = 1 − A_i·A_j / (‖A_i‖ ‖A_j‖) (similarity 0 when a norm is 0), cut at the
 * number of groups asked for. Each cluster is merged by the scoring plugin's weights (with
 * scoring freq: usage-frequency weighting, Eq. 15); the router keeps every row, so the gates of
 * one cluster's experts add up (Eq. 3). */
#include <stdlib.h>

#include "criteria/cluster.h"
#include "criteria/crit.h"
#include "base/util.h"

static int hc_smoe_group(const m2d_layer_view *v, const int *selected, const double *scores, int *group_of) {
    (void)scores;
    if (m2d_crit_need_stats(v, "hc-smoe") != 0) return -1;
    const int K = v->K, d = v->stats->d;
    double *G = m2d_calloc((size_t)K * K, sizeof *G);
    for (int i = 0; i < K; i++)
        for (int j = 0; j <= i; j++) {
            const double *a = v->stats->mu + (size_t)selected[i] * d, *b = v->stats->mu + (size_t)selected[j] * d;
            double dot = 0;
            for (int c = 0; c < d; c++) dot += a[c] * b[c];
            G[(size_t)i * K + j] = G[(size_t)j * K + i] = dot;
        }
    int rc = m2d_cluster_gram_cosine(G, K, v->k, group_of);
    free(G);
    return rc;
}

M2D_PLUGIN(hc_smoe, .name = "hc-smoe", .kind = M2D_GROUPING,
           .summary = "HC-SMoE: average linkage on 1 − cosine of the experts' mean outputs, all E experts (remap)",
           .group = hc_smoe_group, .remap = 1,
           .display = "HC-SMoE")
