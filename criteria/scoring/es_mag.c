/* ES-Mag (paper 001, App. D): mean over calibration samples s of Σ_{t∈s routed to e} ‖f_e(t)‖ / L_s. */
#include "criteria/crit.h"

static int es_mag_score(const m2d_layer_view *v, double *scores) {
    if (m2d_crit_need_stats(v, "es-mag") != 0) return -1;
    const m2d_layer_stats *s = v->stats;
    for (int e = 0; e < v->E; e++) scores[e] = s->es_mag[e];
    return 0;
}

M2D_PLUGIN(es_mag, .name = "es-mag", .kind = M2D_SCORING,
           .summary = "ES-Mag: per-sample length-normalised routed output norm, averaged over samples",
           .score = es_mag_score)
