/* blocksum — vectorised fp64 sums over fp32 rows, for calibration's fast path (calib.c).
 *
 * Each function does what a scalar loop in stats.c does, on 8 lanes of doubles (GCC vector
 * extensions: AVX-512 where the CPU has it, two AVX2 halves or SSE elsewhere). Element-wise sums
 * (acc[j] += f[j]) give the scalar loop's results bit for bit; a reduction (Σ_j f[j]²) keeps 8
 * partial sums added in a fixed order, so its rounding differs from the scalar loop's by a few
 * ulps of fp64 (and never depends on the thread count). */
#ifndef M2D_BLOCKSUM_H
#define M2D_BLOCKSUM_H

#include <stddef.h>
#include <stdint.h>

/* acc[j] += f[j] for j < d; returns Σ_j f[j]² */
double m2d_blocksum_add_norm2(double *acc, const float *f, int d);

/* The pruning damage of one token (m2d_layer_stats_add_damage, paper 004 Eq. 7: the same formula
 * with the mixing coefficients computed once per token instead of once per element, the k (+1)
 * rows loaded once for all k removals): OUT[j] = ‖y − y^(−topk[j])‖, to be added to
 * damage[topk[j]]; all 0 when the top-k probabilities sum to 0. Differs from the reference only in
 * the order of the Σ_c delta² sum. Returns -1 (nothing computed) for k > 32: use the reference. */
int m2d_blocksum_damage(const float *p, const int32_t *topk, int k, int E, int d, const float *F, size_t stride,
                        double *out);

#endif
