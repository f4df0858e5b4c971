/* RR round-robin (SPEC §3): sort the selected experts by score, descending (ties → lower expert
 * index); the expert of rank r goes to group r mod k. */
#include <stdlib.h>

#include "criteria/crit.h"
#include "base/util.h"

static int rr_group(const m2d_layer_view *v, const int *selected, const double *scores, int *group_of) {
    int *rank_pos = m2d_malloc((size_t)v->K * sizeof *rank_pos); /* positions in selected, by rank */
    for (int i = 0; i < v->K; i++) rank_pos[i] = i;
    for (int i = 1; i < v->K; i++) { /* insertion sort: K is small and the order must be exact */
        int p = rank_pos[i], j = i;
        for (; j > 0; j--) {
            int q = rank_pos[j - 1];
            double sp = scores[selected[p]], sq = scores[selected[q]];
            if (sq > sp || (sq == sp && selected[q] < selected[p])) break;
            rank_pos[j] = q;
        }
        rank_pos[j] = p;
    }
    for (int r = 0; r < v->K; r++) group_of[rank_pos[r]] = r % v->k;
    free(rank_pos);
    return 0;
}

M2D_PLUGIN(rr, .name = "rr", .kind = M2D_GROUPING,
           .summary = "round-robin: rank r by score (descending) joins group r mod k",
           .group = rr_group,
           .display = "Round-Robin", .report_rank = 8)
