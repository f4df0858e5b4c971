/* ES-Act (paper 001, App. D): mean over samples s of n_e(s) / (L_s · k), the paper's 1/K included
 * (a constant factor: it changes neither the ranking nor proportional scaling). On fixed-length
 * calibration windows (every L_s = L) this is exactly SF/k; it differs only on windows of varying
 * length (calibrate --windows documents). */
#include "criteria/crit.h"

static int es_act_score(const m2d_layer_view *v, double *scores) {
    if (m2d_crit_need_stats(v, "es-act") != 0) return -1;
    const m2d_layer_stats *s = v->stats;
    for (int e = 0; e < v->E; e++) scores[e] = s->es_act[e] / s->k;
    return 0;
}

M2D_PLUGIN(es_act, .name = "es-act", .kind = M2D_SCORING,
           .summary = "ES-Act: per-sample length-normalised routed fraction / k (= SF/k on fixed-length windows)",
           .score = es_act_score)
