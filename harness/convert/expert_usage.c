/* expert_usage — activation inequality and down-projection correlation (see expert_usage.h). */
#include "convert/expert_usage.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "criteria/crit.h"
#include "base/util.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double m2d_gini(const double *x, int n) {
    double *s = m2d_malloc((size_t)(n > 0 ? n : 1) * sizeof *s), tot = 0, acc = 0;
    memcpy(s, x, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    /* sorted form of Σ_i Σ_j |x_i − x_j| / (2 n² mean) = Σ_i (2i − n − 1) x_(i) / (n Σx), i 1-based */
    for (int i = 0; i < n; i++) tot += s[i], acc += (2.0 * (i + 1) - n - 1) * s[i];
    free(s);
    return tot > 0 ? acc / (n * tot) : 0;
}

void m2d_lorenz(const double *x, int n, double *lorenz) {
    double *s = m2d_malloc((size_t)(n > 0 ? n : 1) * sizeof *s), tot = 0;
    memcpy(s, x, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    for (int i = 0; i < n; i++) tot += s[i];
    lorenz[0] = 0;
    for (int i = 0; i < n; i++) lorenz[i + 1] = tot > 0 ? lorenz[i] + s[i] / tot : (double)(i + 1) / n;
    if (tot > 0) lorenz[n] = 1; /* exact despite rounding */
    free(s);
}

/* Σ of expert E's down projection */
static double down_sum(const m2d_layer *L, int e) {
    float *w = m2d_tensor_f32(L->exp_down[e]);
    double s = 0;
    for (int64_t i = 0; i < m2d_tensor_numel(L->exp_down[e]); i++) s += w[i];
    free(w);
    return s;
}

int m2d_down_pearson(const m2d_model *m, int layer, double *C) {
    const m2d_layer *L = &m->layers[layer];
    const int E = m->cfg.num_experts;
    if (!L->exp_down) return m2d_err("%s: layer %d: not an MoE layer", m->dir, layer);
    const m2d_layer *const *w = m2d_malloc((size_t)E * sizeof *w);
    int *idx = m2d_malloc((size_t)E * sizeof *idx);
    double *sum = m2d_malloc((size_t)E * sizeof *sum);
    for (int e = 0; e < E; e++) ((const m2d_layer **)w)[e] = L, idx[e] = e, sum[e] = down_sum(L, e);
    int rc = m2d_crit_expert_gram_pool(w, idx, E, M2D_W_DOWN, C);
    double n = (double)m2d_tensor_numel(L->exp_down[0]);
    /* centred inner products <w̃_i, w̃_j> = <w_i, w_j> − Σw_i Σw_j / n, then normalised */
    for (int i = 0; i < E && rc == 0; i++)
        for (int j = 0; j < E; j++) C[(size_t)i * E + j] -= sum[i] * sum[j] / n;
    double *diag = m2d_malloc((size_t)E * sizeof *diag);
    for (int i = 0; i < E; i++) diag[i] = C[(size_t)i * E + i];
    for (int i = 0; i < E && rc == 0; i++)
        for (int j = 0; j < E; j++) {
            double den = sqrt(fmax(diag[i], 0) * fmax(diag[j], 0));
            C[(size_t)i * E + j] = den > 0 ? C[(size_t)i * E + j] / den : 0;
        }
    free((void *)w), free(idx), free(sum), free(diag);
    return rc;
}
