/* dopt — greedy D-optimal selection with incremental Cholesky (see dopt.h). */
#include "criteria/dopt.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "criteria/crit.h"
#include "base/util.h"

void m2d_dopt_greedy(const double *kern, int E, int K, double lambda, int *selected, double *gains) {
    /* resid[e] = 𝒦_ee + λ − ‖c_e‖², where row c_e of L (the Cholesky factor of 𝒦_S + λI extended
     * by candidate e) is grown one column per pick: c_e[t] = (𝒦_ej − <c_e, c_j>) / sqrt(resid_j). */
    double *resid = m2d_malloc((size_t)E * sizeof *resid);
    double *c = m2d_calloc((size_t)E * (size_t)(K > 0 ? K : 1), sizeof *c); /* row e: c_e[0..t) */
    char *used = m2d_calloc((size_t)E, 1);
    for (int e = 0; e < E; e++) resid[e] = kern[(size_t)e * E + e] + lambda;
    for (int t = 0; t < K; t++) {
        int j = -1;
        for (int e = 0; e < E; e++) /* strict '>' keeps the lower index on ties */
            if (!used[e] && (j < 0 || resid[e] > resid[j])) j = e;
        used[j] = 1;
        selected[t] = j;
        double rj = resid[j] > 0 ? resid[j] : 0.0;
        if (gains) gains[t] = log(rj);
        if (rj <= 0) continue; /* only with λ = 0 and a degenerate kernel: nothing left to explain */
        double piv = sqrt(rj);
        const double *cj = c + (size_t)j * K;
        for (int e = 0; e < E; e++) {
            if (used[e]) continue;
            double *ce = c + (size_t)e * K, dot = 0;
            for (int s = 0; s < t; s++) dot += ce[s] * cj[s];
            ce[t] = (kern[(size_t)e * E + j] - dot) / piv;
            resid[e] -= ce[t] * ce[t];
        }
    }
    free(resid);
    free(c);
    free(used);
}

void m2d_dopt_kernel(const m2d_layer_stats *s, const double *imp, int K, double *kern, double *lambda) {
    const int E = s->E;
    double N = s->N > 0 ? s->N : 1.0, trace = 0;
    for (int i = 0; i < E; i++)
        for (int j = 0; j < E; j++)
            kern[(size_t)i * E + j] = sqrt(imp[i] * imp[j]) * s->gram[(size_t)i * E + j] / N;
    for (int e = 0; e < E; e++) trace += kern[(size_t)e * E + e];
    *lambda = trace / ((double)K * E);
}

int m2d_dopt_select(const m2d_layer_view *v, const double *scores, int *selected) {
    if (m2d_crit_need_stats(v, "do-*") != 0) return -1;
    double *kern = m2d_malloc((size_t)v->E * v->E * sizeof *kern), lambda;
    m2d_dopt_kernel(v->stats, scores, v->K, kern, &lambda);
    m2d_dopt_greedy(kern, v->E, v->K, lambda, selected, NULL);
    free(kern);
    return 0;
}
