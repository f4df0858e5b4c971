/* ConMoE (paper 002): s_e = Norm(a)_e · Norm(b)_e over the layer, with
 *   a_e = REAP_e (Σg‖f‖_e / n_e),
 *   b_e = min_{e'≠e} d(e,e'),  d(e,e') = (1/3) Σ_{m∈{gate,up,down}} 2‖W_m^e − W_m^e'‖_F / (‖W_m^e‖_F + ‖W_m^e'‖_F + 2ε),
 *   Norm(x)_e = (x_e − min x) / (max x − min x + ε)   (paper App. B.1; ε = param eps, default 1e-8).
 * ‖W^e − W^e'‖² is taken from a per-matrix Gram (one blocked SYRK, not E² difference passes):
 * ‖x‖² + ‖y‖² − 2<x,y>, clamped at 0, so near-identical experts have distance ~1e-3 relative noise. */
#include <math.h>
#include <stdlib.h>

#include "criteria/crit.h"
#include "base/util.h"

static void min_max_normalise(double *x, int n, double eps) {
    double lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) lo = fmin(lo, x[i]), hi = fmax(hi, x[i]);
    for (int i = 0; i < n; i++) x[i] = (x[i] - lo) / (hi - lo + eps);
}

/* b[e] = min over e' != e of the normalised weight distance */
static int nearest_weight_distance(const m2d_layer_view *v, double eps, double *b) {
    const int E = v->E;
    int *all = m2d_malloc((size_t)E * sizeof *all);
    for (int e = 0; e < E; e++) all[e] = e;
    double *G = m2d_malloc((size_t)E * E * sizeof *G), *d = m2d_calloc((size_t)E * E, sizeof *d);
    int rc = 0;
    for (int m = 0; m < 3 && rc == 0; m++) {
        rc = m2d_crit_expert_gram(v, all, E, 1 << m, G);
        for (int i = 0; i < E && rc == 0; i++)
            for (int j = 0; j < E; j++) {
                double gii = G[(size_t)i * E + i], gjj = G[(size_t)j * E + j];
                double diff = sqrt(fmax(0.0, gii + gjj - 2 * G[(size_t)i * E + j]));
                d[(size_t)i * E + j] += 2 * diff / (sqrt(gii) + sqrt(gjj) + 2 * eps) / 3;
            }
    }
    for (int e = 0; e < E && rc == 0; e++) {
        b[e] = INFINITY;
        for (int o = 0; o < E; o++)
            if (o != e) b[e] = fmin(b[e], d[(size_t)e * E + o]);
        if (E == 1) b[e] = 0;
    }
    free(all);
    free(G);
    free(d);
    return rc;
}

static int conmoe_score(const m2d_layer_view *v, double *scores) {
    if (m2d_crit_need_stats(v, "conmoe") != 0 || m2d_crit_need_weights(v, "conmoe") != 0) return -1;
    double eps = m2d_param(v->params, "eps", 1e-8);
    double *b = m2d_malloc((size_t)v->E * sizeof *b);
    if (nearest_weight_distance(v, eps, b) != 0) {
        free(b);
        return -1;
    }
    for (int e = 0; e < v->E; e++) scores[e] = m2d_crit_routed_avg(v->stats, v->stats->sum_gf, e);
    min_max_normalise(scores, v->E, eps);
    min_max_normalise(b, v->E, eps);
    for (int e = 0; e < v->E; e++) scores[e] *= b[e];
    free(b);
    return 0;
}

M2D_PLUGIN(conmoe, .name = "conmoe", .kind = M2D_SCORING,
           .summary = "ConMoE: Norm(REAP) × Norm(distance to the nearest expert in weight space)",
           .score = conmoe_score, .params_default = "eps=1e-8",
           .display = "ConMoE", .report_rank = 20)
