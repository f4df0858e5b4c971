/* analyze — how the scoring criteria's selections relate (paper Fig. 2, Fig. 3, Thm 3.2):
 * selection overlap |S_a ∩ S_b| / K between every pair of criteria, the effective rank
 * (Roy & Vetterli 2007: exp of the entropy of the normalised singular values) of the selected
 * kernel submatrix, and mutual coherence μ = max_{i≠j} |K_ij| / sqrt(K_ii K_jj) — of the whole
 * expert kernel (all E experts, as paper 000 Thm 3.3 defines it, with the theorem's bound
 * K·log((1 + (K−1)μ) / (1 − (K−1)μ)) on what the diagonal proxy can lose when (K−1)μ < 1), and of
 * each selection's submatrix (μ_S).
 *
 * Two kernels are reported for each selection S: the plain output Gram G_S / N, and the
 * importance-weighted 𝒦_S with 𝒦_ij = sqrt(I_i I_j) G_ij / N where I are the criterion's own
 * scores (the kernel DO-X maximises log det of). The paper's Fig. 3 does not say which it
 * plots; both are printed. μ is scale invariant, so it is the same for both kernels. */
#ifndef M2D_ANALYZE_H
#define M2D_ANALYZE_H

#include "model/model.h"
#include "calib/stats.h"

typedef struct {
    int n_crit, K, n_layers;
    char **names;           /* [n_crit] criteria that ran */
    int *layer_ids;         /* [n_layers] model layer index */
    int *selected;          /* [n_layers][n_crit][K] */
    double *erank;          /* [n_layers][n_crit] effective rank of G_S / N */
    double *erank_w;        /* [n_layers][n_crit] effective rank of the importance-weighted 𝒦_S */
    double *coherence;      /* [n_layers][n_crit] μ_S of G_S (the selection's submatrix) */
    double *mu;             /* [n_layers] μ of the whole kernel G (all E experts; paper 000 Thm 3.3) */
    double *thm33_gap;      /* [n_layers] K·log((1+(K−1)μ)/(1−(K−1)μ)), NAN when (K−1)μ >= 1 */
    double *overlap;        /* [n_layers][n_crit][n_crit] |S_a ∩ S_b| / K */
    char **skipped;         /* [n_skipped] "name: reason" for criteria that failed */
    int n_skipped;
} m2d_analysis;

/* Effective rank of a symmetric PSD n×n matrix (row-major): singular values = |eigenvalues|
 * (LAPACK dsyevd); 0 for the zero matrix. */
double m2d_effective_rank(const double *A, int n);
/* μ of a symmetric n×n matrix; pairs with a zero diagonal entry count as 0. 0 when n < 2. */
double m2d_mutual_coherence(const double *A, int n);
/* Paper 000 Thm 3.3: K·log((1 + (K−1)μ) / (1 − (K−1)μ)), NAN when (K−1)μ >= 1 (no bound). */
double m2d_thm33_gap(double mu, int K);

/* Run every criterion in NAMES (NULL: all registered scoring plugins) at K on every layer.
 * A criterion that fails is listed in skipped, not fatal. Needs the teacher for plugins that
 * read weights; the stats must belong to it. */
int m2d_analyze(const m2d_model *m, const m2d_stats *s, int K, const char *const *names, int n_names,
                m2d_analysis **out);
void m2d_analysis_free(m2d_analysis *a);

#endif
