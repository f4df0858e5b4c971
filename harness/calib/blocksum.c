/* blocksum — vectorised fp64 sums over fp32 rows (see blocksum.h). */
#include "calib/blocksum.h"

#include <math.h>
#include <string.h>

#include "base/util.h"

typedef double v8d __attribute__((vector_size(64)));
typedef float v8f __attribute__((vector_size(32)));

#define LANES 8
#define DAMAGE_MAX_K 32 /* top-k of every supported family is far below; larger k takes the scalar path */

/* Vectors stay inside the functions that use them (macros, pointers): passing a 64-byte vector by
 * value would depend on the ISA the file is compiled for (-Wpsabi in builds without AVX-512). */
#define LOAD8(dst, f)                                                                                                   \
    do {                                                                                                                \
        v8f v_;                                                                                                         \
        memcpy(&v_, (f), sizeof v_);                                                                                    \
        (dst) = __builtin_convertvector(v_, v8d);                                                                       \
    } while (0)

/* the lanes added in a fixed order (then the scalar tail by the caller) */
static double hsum(const v8d *v) {
    double s = 0;
    for (int i = 0; i < LANES; i++) s += (*v)[i];
    return s;
}

/* The mixing coefficients of removal j (stats.c's formula): coef[j][r] multiplies f_{topk[r]},
 * coef[j][k] multiplies f_nx (the expert that joins the top-k), 0 when there is none. */
static void damage_coefs(const float *p, const int32_t *topk, int k, int nx, double psel, double coef[][DAMAGE_MAX_K + 1]) {
    for (int j = 0; j < k; j++) {
        double den = psel - p[topk[j]] + (nx >= 0 ? p[nx] : 0);
        for (int r = 0; r < k; r++) {
            double rr = p[topk[r]] / psel, rn = r == j || den <= 0 ? 0 : p[topk[r]] / den;
            coef[j][r] = rr - rn;
        }
        coef[j][k] = nx >= 0 && den > 0 ? p[nx] / den : 0;
    }
}

/* ‖delta_j‖² of every removal j over the d columns: the k (+1) rows loaded once per 8 columns */
static void damage_norms(const float *const *rows, int k, int has_nx, int d, double coef[][DAMAGE_MAX_K + 1],
                         double *sq) {
    v8d acc[DAMAGE_MAX_K] = {{0}}, x[DAMAGE_MAX_K + 1];
    int c = 0;
    for (; c + LANES <= d; c += LANES) {
        for (int r = 0; r < k + has_nx; r++) LOAD8(x[r], rows[r] + c);
        for (int j = 0; j < k; j++) {
            v8d dl = {0};
            for (int r = 0; r < k; r++) dl += coef[j][r] * x[r];
            if (has_nx) dl -= coef[j][k] * x[k];
            acc[j] += dl * dl;
        }
    }
    for (int j = 0; j < k; j++) {
        sq[j] = hsum(&acc[j]);
        for (int cc = c; cc < d; cc++) {
            double dl = 0;
            for (int r = 0; r < k; r++) dl += coef[j][r] * rows[r][cc];
            if (has_nx) dl -= coef[j][k] * rows[k][cc];
            sq[j] += dl * dl;
        }
    }
}

int m2d_blocksum_damage(const float *p, const int32_t *topk, int k, int nx, int d, const float *f, size_t stride,
                        double *out) {
    if (k > DAMAGE_MAX_K) return -1;
    for (int j = 0; j < k; j++) out[j] = 0;
    double psel = 0;
    for (int r = 0; r < k; r++) psel += p[topk[r]];
    if (psel <= 0) return 0;
    double coef[DAMAGE_MAX_K][DAMAGE_MAX_K + 1], sq[DAMAGE_MAX_K];
    damage_coefs(p, topk, k, nx, psel, coef);
    const float *rows[DAMAGE_MAX_K + 1];
    for (int r = 0; r <= k; r++) rows[r] = f + (size_t)r * stride;
    damage_norms(rows, k, nx >= 0, d, coef, sq);
    for (int j = 0; j < k; j++) out[j] = sqrt(sq[j]);
    return 0;
}
