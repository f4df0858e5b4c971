/* D-optimal selection: Cholesky-update gains = log-det ratios (LAPACKE), greedy = exhaustive at
 * K = 1 and within the submodular (1 − 1/e) bound otherwise, the kernel / λ of the spec, the
 * do-X plugins end to end, and the theorem E.1 redundancy construction of paper 000.
 * Exact comparisons here (ids, groups, selections, scores of two plugins) are exact on every CPU:
 * plain scalar C on fixed inputs (no BLAS, no oneDNN), whose IEEE operations (-std=c11: no FMA
 * contraction) give the same bits on every x86-64 CPU, and decisions taken on those bits. */
#include "testutil.h"

#include <lapacke.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "crit_fixture.h"
#include "criteria/dopt.h"
#include "criteria/registry.h"

/* log det(𝒦_S + λI) by LAPACK Cholesky (dpotrf) on the |S|×|S| submatrix */
static double logdet_sub(const double *kern, int E, const int *S, int n, double lambda) {
    if (n == 0) return 0;
    double *A = m2d_malloc((size_t)n * n * sizeof *A);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) A[i * n + j] = kern[(size_t)S[i] * E + S[j]] + (i == j ? lambda : 0);
    int info = LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'L', n, A, n);
    assert_int_equal(info, 0);
    double ld = 0;
    for (int i = 0; i < n; i++) ld += 2 * log(A[i * n + i]);
    free(A);
    return ld;
}

/* Random PSD kernel of rank r: 𝒦 = B Bᵀ with B [E×r] Gaussian (r < E makes it singular). */
static void random_psd(uint64_t *st, int E, int r, double *kern) {
    double *B = m2d_malloc((size_t)E * r * sizeof *B);
    for (int i = 0; i < E * r; i++) B[i] = tu_rand_normal(st);
    for (int i = 0; i < E; i++)
        for (int j = 0; j < E; j++) {
            double s = 0;
            for (int c = 0; c < r; c++) s += B[i * r + c] * B[j * r + c];
            kern[i * E + j] = s;
        }
    free(B);
}

static double spec_lambda(const double *kern, int E, int K) {
    double tr = 0;
    for (int e = 0; e < E; e++) tr += kern[e * E + e];
    return tr / ((double)K * E);
}

/* Every gain equals log det(𝒦_{S_t} + λI) − log det(𝒦_{S_{t−1}} + λI): the Cholesky-update
 * residuals are exactly the Schur complements. Both sides are double Cholesky factorisations of
 * well-conditioned (λ > 0) matrices of size <= 12: agreement to 1e-9 absolute. */
static void gains_equal_logdet_ratios(void **state) {
    (void)state;
    uint64_t st = 1234;
    for (int trial = 0; trial < 40; trial++) {
        int E = 3 + trial % 10, r = 1 + trial % E, K = 1 + trial % E;
        double *kern = m2d_malloc((size_t)E * E * sizeof *kern), gains[16];
        int sel[16];
        random_psd(&st, E, r, kern);
        double lambda = spec_lambda(kern, E, K);
        m2d_dopt_greedy(kern, E, K, lambda, sel, gains);
        for (int t = 0; t < K; t++) {
            double ratio = logdet_sub(kern, E, sel, t + 1, lambda) - logdet_sub(kern, E, sel, t, lambda);
            if (fabs(gains[t] - ratio) > 1e-9) fail_msg("trial %d step %d: gain %.15g, log-det ratio %.15g", trial, t, gains[t], ratio);
        }
        /* each greedy step is the best single addition (checked by brute force over candidates) */
        for (int t = 0; t < K; t++) {
            double base = logdet_sub(kern, E, sel, t, lambda), best = -INFINITY;
            int S[16];
            memcpy(S, sel, (size_t)t * sizeof(int));
            for (int e = 0; e < E; e++) {
                int in = 0;
                for (int q = 0; q < t; q++) in |= sel[q] == e;
                if (in) continue;
                S[t] = e;
                best = fmax(best, logdet_sub(kern, E, S, t + 1, lambda) - base);
            }
            assert_true(gains[t] >= best - 1e-9);
        }
        free(kern);
    }
}

/* Exhaustive max of f(S) = log det(𝒦_S + λI) − |S| log λ (= log det(I + 𝒦_S/λ), normalised so
 * f(∅) = 0, monotone submodular) over |S| = K. All sets compared have the same size, so the
 * arg-max is the arg-max of log det(𝒦_S + λI) itself. */
static double exhaustive_best(const double *kern, int E, int K, double lambda, int *best_set) {
    double best = -INFINITY;
    int S[16];
    for (uint32_t mask = 0; mask < (1u << E); mask++) {
        if (__builtin_popcount(mask) != K) continue;
        int n = 0;
        for (int e = 0; e < E; e++)
            if (mask >> e & 1) S[n++] = e;
        double v = logdet_sub(kern, E, S, K, lambda) - K * log(lambda);
        if (v > best + 1e-12) {
            best = v;
            if (best_set) memcpy(best_set, S, (size_t)K * sizeof(int));
        }
    }
    return best;
}

static void greedy_vs_exhaustive(void **state) {
    (void)state;
    uint64_t st = 99;
    for (int trial = 0; trial < 30; trial++) {
        int E = 4 + trial % 9; /* 4..12 */
        double *kern = m2d_malloc((size_t)E * E * sizeof *kern);
        random_psd(&st, E, 1 + trial % E, kern);
        for (int K = 1; K <= M2D_MIN(E, 6); K++) {
            double lambda = spec_lambda(kern, E, K);
            int sel[16], opt[16];
            m2d_dopt_greedy(kern, E, K, lambda, sel, NULL);
            double f_greedy = logdet_sub(kern, E, sel, K, lambda) - K * log(lambda);
            double f_opt = exhaustive_best(kern, E, K, lambda, opt);
            if (K == 1) {
                assert_int_equal(sel[0], opt[0]); /* K = 1: greedy is exhaustive */
            } else if (f_greedy < (1 - exp(-1.0)) * f_opt - 1e-9) {
                fail_msg("trial %d K %d: greedy %.12g < (1-1/e)·opt %.12g", trial, K, f_greedy, f_opt);
            }
            assert_true(f_greedy <= f_opt + 1e-9);
        }
        free(kern);
    }
}

static void ties_go_to_lower_index(void **state) {
    (void)state;
    double kern[16] = {0};
    for (int i = 0; i < 4; i++) kern[i * 4 + i] = 1; /* identical, orthogonal experts */
    int sel[4];
    m2d_dopt_greedy(kern, 4, 3, 0.25, sel, NULL);
    assert_int_equal(sel[0], 0), assert_int_equal(sel[1], 1), assert_int_equal(sel[2], 2);
    /* an all-zero kernel (λ = 0) must not crash or produce NaN picks */
    double zero[16] = {0};
    m2d_dopt_greedy(zero, 4, 2, 0, sel, NULL);
    assert_int_equal(sel[0], 0), assert_int_equal(sel[1], 1);
}

/* do-acp / do-cp / do-man end to end: scores stay the base scores; the selection equals the greedy
 * on a kernel built here by hand from the Gram matrix: 𝒦 = sqrt(I_i I_j) G_ij / N, λ = tr/(K·E). */
static void do_plugins_end_to_end(void **state) {
    (void)state;
    const int lens[] = {6, 8, 5};
    fx_tokens t = fx_make_tokens(8, 2, 3, 3, lens, 7, 17);
    m2d_layer_stats s;
    fx_stats_from_tokens(&t, &s);
    const char *bases[] = {"acp", "cp", "man"};
    for (int b = 0; b < 3; b++) {
        char name[16];
        snprintf(name, sizeof name, "do-%s", bases[b]);
        m2d_layer_view v = fx_view(&s, NULL, 4, 0, NULL);
        double sc[8], base[8], kern[64];
        int sel[8], bsel[8], want[8];
        fx_scores(name, &v, sc, sel);
        fx_scores(bases[b], &v, base, bsel);
        assert_memory_equal(sc, base, sizeof sc);
        for (int i = 0; i < 8; i++)
            for (int j = 0; j < 8; j++) kern[i * 8 + j] = sqrt(base[i] * base[j]) * s.gram[i * 8 + j] / s.N;
        m2d_dopt_greedy(kern, 8, 4, spec_lambda(kern, 8, 4), want, NULL);
        assert_memory_equal(sel, want, 4 * sizeof(int));
        /* the plugins' kernel and λ = tr / (K·E) themselves (the selection above did not depend on λ
         * here): exact, the same fp64 operations in the same order (C11: no FMA contraction) */
        double kd[64], lambda;
        m2d_dopt_kernel(&s, base, 4, kd, &lambda);
        assert_memory_equal(kd, kern, sizeof kern);
        assert_true(lambda == spec_lambda(kern, 8, 4));
        for (int i = 0; i < 4; i++) assert_int_not_equal(sel[i], 7); /* never routed: I = 0 → never useful */
    }
    m2d_layer_stats_free(&s);
    fx_free_tokens(&t);
}

/* Paper 000, App. E.1: E = 2K−1 experts with scalar outputs over 2K−1 equiprobable tokens
 * a_1..a_K, b_2..b_K; experts 0..K−1 are identical (f = 1 on the a's), expert K+j−2 is the
 * indicator of b_j; a deterministic top-1 router sends a_j to expert j−1 and b_j to expert K+j−2.
 * The teacher output is 1 everywhere. ACP ranks the duplicates first; D-optimal must pick a
 * zero-error set: one duplicate plus all the specialists. */
static void build_redundancy_layer(int K, m2d_layer_stats *s) {
    const int E = 2 * K - 1;
    m2d_layer_stats_alloc(s, 0, E, 1, 1);
    float *p = m2d_calloc((size_t)E, sizeof *p), *f = m2d_calloc((size_t)E, sizeof *f), g = 1;
    for (int tok = 0; tok < E; tok++) { /* tok < K: a_{tok+1}; else b_{tok-K+2} */
        int32_t route = tok;
        for (int e = 0; e < E; e++) {
            p[e] = e == route ? 1.0f : 0.0f;
            f[e] = tok < K ? (e < K ? 1.0f : 0.0f) : (e == tok ? 1.0f : 0.0f);
        }
        m2d_layer_stats_add_token(s, p, &route, &g, f);
    }
    m2d_layer_stats_finalize(s);
    free(p), free(f);
}

/* Zero reconstruction error <=> the selected outputs span the all-ones teacher output: here that
 * means at least one duplicate and every specialist (the specialists are the only non-zero
 * outputs on the b tokens). */
static int zero_error_set(const int *sel, int K) {
    int dup = 0, spec = 0;
    for (int i = 0; i < K; i++) *(sel[i] < K ? &dup : &spec) += 1;
    return dup >= 1 && spec == K - 1;
}

static void theorem_e1_redundancy(void **state) {
    (void)state;
    for (int K = 2; K <= 7; K++) {
        const int E = 2 * K - 1;
        m2d_layer_stats s;
        build_redundancy_layer(K, &s);
        m2d_layer_view v = fx_view(&s, NULL, K, 0, NULL);
        v.k = 1;
        double sc[16], kern[256];
        int sel[16];
        fx_scores("acp", &v, sc, sel);
        for (int e = 0; e < E; e++) /* I_A = sqrt(K/(2K−1)), I_B = sqrt(1/(2K−1)) */
            assert_true(fabs(sc[e] - sqrt((e < K ? K : 1.0) / E)) < 1e-12);
        for (int i = 0; i < K; i++) assert_true(sel[i] < K); /* ACP: all duplicates, error (K−1)/(2K−1) */
        assert_false(zero_error_set(sel, K));
        /* the theorem's λ = β = 𝒦 of a specialist: greedy D-opt finds the zero-error set */
        m2d_dopt_kernel(&s, sc, K, kern, &(double){0});
        double beta = kern[(size_t)K * E + K];
        assert_true(fabs(beta - pow(1.0 / E, 1.5)) < 1e-12);
        m2d_dopt_greedy(kern, E, K, beta, sel, NULL);
        assert_true(zero_error_set(sel, K));
        assert_int_equal(sel[0], 0); /* the first duplicate (ties -> lower index) */
        /* the spec's default λ = tr(𝒦)/(K·E) exceeds the threshold αβ/(α−β) for K >= 4 (α, β the
         * duplicate / specialist diagonals), and then log-det itself prefers a second duplicate:
         * do-acp finds the zero-error set for K = 2, 3 only. Documented in criteria/README.md. */
        fx_scores("do-acp", &v, sc, sel);
        double alpha = pow((double)K / E, 1.5), lambda = (K * alpha + (K - 1) * beta) / ((double)K * E);
        int expect_zero = lambda < alpha * beta / (alpha - beta);
        assert_int_equal(expect_zero, K <= 3);
        assert_int_equal(zero_error_set(sel, K), expect_zero);
        m2d_layer_stats_free(&s);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(gains_equal_logdet_ratios),
        cmocka_unit_test(greedy_vs_exhaustive),
        cmocka_unit_test(ties_go_to_lower_index),
        cmocka_unit_test(do_plugins_end_to_end),
        cmocka_unit_test(theorem_e1_redundancy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
