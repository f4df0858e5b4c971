/* Frequency: number of calibration tokens routed to e, S(0,0,0). */
#include "criteria/crit.h"

static int freq_score(const m2d_layer_view *v, double *scores) {
    if (m2d_crit_need_stats(v, "freq") != 0) return -1;
    const m2d_layer_stats *s = v->stats;
    for (int e = 0; e < v->E; e++) scores[e] = s->n[e];
    return 0;
}

M2D_PLUGIN(freq, .name = "freq", .kind = M2D_SCORING,
           .summary = "frequency: routed token count n_e",
           .score = freq_score)
