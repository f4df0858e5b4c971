/* prune_overlap — paper 004's ranking analyses for one-shot expert pruning at the ratios 25 % and
 * 50 % of each layer's experts removed:
 *  - Fig. 3: the overlap of the experts pruned by the proxy damage D̂_j = Σ_routed g_j‖f_j‖ (Eq. 8,
 *    g the gate renormalised over the top-k, Eq. 1) and by the exact single-expert damage D̂^Δ_j
 *    (Eq. 7, kept by calibration);
 *  - Figs. 4–5: for every variant S(b,a,c) = n_j^−b Σ_routed g^a‖f‖^c (b ∈ {0,1}, a, c ∈ {0,1,2}),
 *    the overlap of the experts pruned under two or more calibrations of the same model.
 * The pruned set at ratio ρ is the m = round(ρ·E) lowest-scored experts: the complement of the
 * top E − m (ties: the lower index is kept, as the selection keeps it). Overlap = |∩ B_i| / m. */
#ifndef M2D_PRUNE_OVERLAP_H
#define M2D_PRUNE_OVERLAP_H

#include "calib/stats.h"

enum { M2D_PRUNE_N_RATIOS = 2, M2D_PRUNE_N_VARIANTS = 18 };
extern const double m2d_prune_ratios[M2D_PRUNE_N_RATIOS]; /* 0.25, 0.5 */

typedef struct {
    int n_layers, n_sets;
    int *layer_ids;          /* [n_layers] */
    int b[M2D_PRUNE_N_VARIANTS], a[M2D_PRUNE_N_VARIANTS], c[M2D_PRUNE_N_VARIANTS];
    double *damage;          /* [n_layers][ratio] proxy vs exact damage, on the first set */
    double *cross;           /* [n_layers][variant][ratio] across the n_sets calibrations (n_sets >= 2) */
} m2d_prune_analysis;

/* PRUNED[E] = 1 for the m = round(RATIO·E) lowest of SCORES (see above); returns m. */
int m2d_pruned_set(const double *scores, int E, double ratio, char *pruned);
/* |∩_i B_i| / m over the pruned sets of N score vectors (1 when m = 0). */
double m2d_pruned_overlap(const double *const *scores, int n, int E, double ratio);
/* S(b,a,c) of every expert of one layer (gate renormalised over the top-k) into scores[E]. */
void m2d_prune_variant_scores(const m2d_layer_stats *s, int b, int a, int c, double *scores);
/* The analyses over N_SETS statistics of one model (same layers and E; checked). */
int m2d_prune_analyze(const m2d_stats *const *sets, int n_sets, m2d_prune_analysis **out);
void m2d_prune_analysis_free(m2d_prune_analysis *p);

#endif
