/* blocksum — calibration's per-token pruning damage on vectors of fp64 (calib.c's fast path).
 *
 * It does what stats.c's scalar loop does, on 8 lanes of doubles (GCC vector extensions: AVX-512
 * where the CPU has it, two AVX2 halves or SSE elsewhere); its reduction (Σ_c delta²) keeps 8
 * partial sums added in a fixed order, so its rounding differs from the scalar loop's by a few
 * ulps of fp64 (and never depends on the thread count). The per-expert sums and norms are the
 * backend's (backend.h experts_reduce). */
#ifndef M2D_BLOCKSUM_H
#define M2D_BLOCKSUM_H

#include <stddef.h>
#include <stdint.h>

/* The pruning damage of one token (m2d_layer_stats_add_damage_rows, paper 004 Eq. 7: the same
 * formula with the mixing coefficients computed once per token instead of once per element, the k
 * (+1) rows loaded once for all k removals): OUT[j] = ‖y − y^(−topk[j])‖, to be added to
 * damage[topk[j]]; all 0 when the top-k probabilities sum to 0. Rows by rank: f_{topk[r]} at F + r *
 * STRIDE for r < k, the replacement NX's (m2d_layer_stats_next_expert) at F + k * STRIDE (not read
 * when NX is -1). Differs from the reference only in the order of the Σ_c delta² sum. Returns -1
 * (nothing computed) for k > 32: use the reference. */
int m2d_blocksum_damage(const float *p, const int32_t *topk, int k, int nx, int d, const float *f, size_t stride,
                        double *out);

#endif
