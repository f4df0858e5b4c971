/* The unified family of paper 004: S(b,a,c) = (1 / n_e^b) Σ_{routed} g^a ‖f‖^c, g renormalised
 * over the top-k as in its Eq. 1 (renorm=0: the model's native gate).
 * Defaults b=1, a=1, c=1 (= REAP). a and c must be in {0,1,2} (the sums calibration keeps);
 * b is any real (paper: {0,1}). Never-routed experts score 0. Examples: freq (0,0,0),
 * seer (0,1,0), ean (0,0,1), reap (1,1,1), man (1,0,1), msan (1,0,2). */
#include <math.h>

#include "criteria/crit.h"
#include "base/util.h"

/* an exponent calibration keeps sums for (0, 1 or 2); checked as a double, before any cast to int */
static int stored_exponent(double x) { return x == 0 || x == 1 || x == 2; }

static int bac_score(const m2d_layer_view *v, double *scores) {
    int renorm;
    if (m2d_crit_need_stats(v, "bac") != 0 || m2d_crit_renorm_param(v, "bac", &renorm) != 0) return -1;
    const m2d_layer_stats *s = v->stats;
    double b = m2d_param(v->params, "b", 1), a = m2d_param(v->params, "a", 1), c = m2d_param(v->params, "c", 1);
    if (!stored_exponent(a) || !stored_exponent(c))
        return m2d_err("scoring plugin 'bac': layer %d: field 'a'/'c': (a=%g, c=%g) not available; "
                       "calibration keeps Σ g^a‖f‖^c for a, c in {0,1,2}", s->layer, a, c);
    const double *sum = m2d_crit_routed_sum(s, (int)a, (int)c, renorm);
    for (int e = 0; e < v->E; e++) scores[e] = s->n[e] > 0 ? sum[e] / pow(s->n[e], b) : 0;
    return 0;
}

M2D_PLUGIN(bac, .name = "bac", .kind = M2D_SCORING,
           .summary = "unified family S(b,a,c) = n_e^-b Σ_routed g^a ‖f‖^c (paper 004; a, c in {0,1,2})",
           .score = bac_score, .params_default = "b=1,a=1,c=1,renorm=1")
