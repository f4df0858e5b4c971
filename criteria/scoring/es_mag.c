/* ES-Mag (paper 001 App. D): s_e = (1/N_s) Σ_j (1/L_j) Σ_{k=1}^{L_j} ‖v_{e,j,k}‖ over every token k
 * of every calibration sample j, v the gated output g_e f_e (native gate; 0 off the top-k, so only
 * routed tokens add). gated=0: today's earlier variant, the ungated routed norm ‖f_e‖. */
#include "criteria/crit.h"
#include "base/util.h"

static int es_mag_score(const m2d_layer_view *v, double *scores) {
    if (m2d_crit_need_stats(v, "es-mag") != 0) return -1;
    const m2d_layer_stats *s = v->stats;
    double gated = m2d_param(v->params, "gated", 1);
    if (gated != 0 && gated != 1)
        return m2d_err("scoring plugin 'es-mag': layer %d: field 'gated': %g is not 0 or 1", s->layer, gated);
    for (int e = 0; e < v->E; e++) scores[e] = gated ? s->es_mag_gated[e] : s->es_mag[e];
    return 0;
}

M2D_PLUGIN(es_mag, .name = "es-mag", .kind = M2D_SCORING,
           .summary = "ES-Mag: per-sample length-normalised norm of the gated output, averaged over samples",
           .score = es_mag_score, .params_default = "gated=1")
