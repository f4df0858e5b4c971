/* AB anchor-based (SPEC §3): the k highest-scoring selected experts (ties → lower expert index) are
 * anchors, one per group; every other selected expert joins the anchor whose router row has the
 * highest cosine similarity with its own (similarity 0 when a row is all zero; ties → the
 * higher-ranked anchor). */
#include <stdlib.h>

#include "criteria/crit.h"
#include "base/util.h"

static int ab_group(const m2d_layer_view *v, const int *selected, const double *scores, int *group_of) {
    if (m2d_crit_need_weights(v, "ab") != 0) return -1;
    const int K = v->K, k = v->k;
    /* anchors: top-k of the selected experts' scores */
    double *sel_scores = m2d_malloc((size_t)K * sizeof *sel_scores);
    int *anchor_pos = m2d_malloc((size_t)k * sizeof *anchor_pos);
    for (int i = 0; i < K; i++) sel_scores[i] = scores[selected[i]];
    for (int a = 0; a < k; a++) {
        int best = -1;
        for (int i = 0; i < K; i++) {
            int taken = 0;
            for (int b = 0; b < a; b++) taken |= anchor_pos[b] == i;
            if (taken) continue;
            if (best < 0 || sel_scores[i] > sel_scores[best] ||
                (sel_scores[i] == sel_scores[best] && selected[i] < selected[best]))
                best = i;
        }
        anchor_pos[a] = best;
    }
    float *rows = m2d_crit_router_rows(v, selected, K);
    if (!rows) {
        free(sel_scores), free(anchor_pos);
        return -1;
    }
    size_t n2 = (size_t)K * K;
    double *G = m2d_malloc(n2 * sizeof *G), *dist = m2d_malloc(n2 * sizeof *dist);
    m2d_crit_rows_gram(rows, K, v->d, G);
    m2d_crit_gram_to_cosine_distance(G, K, dist); /* similarity = 1 − distance */
    for (int i = 0; i < K; i++) group_of[i] = -1;
    for (int a = 0; a < k; a++) group_of[anchor_pos[a]] = a;
    for (int i = 0; i < K; i++) {
        if (group_of[i] >= 0) continue;
        int best = 0;
        for (int a = 1; a < k; a++) /* smallest distance = highest similarity; strict: first anchor wins ties */
            if (dist[(size_t)i * K + anchor_pos[a]] < dist[(size_t)i * K + anchor_pos[best]]) best = a;
        group_of[i] = best;
    }
    free(sel_scores), free(anchor_pos), free(rows), free(G), free(dist);
    return 0;
}

M2D_PLUGIN(ab, .name = "ab", .kind = M2D_GROUPING,
           .summary = "anchor-based: top-k scores are anchors; others join the anchor with the most similar router row",
           .group = ab_group,
           .display = "Anchor-Based", .report_rank = 11)
