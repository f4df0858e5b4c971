/* stats: the reference accumulator against direct per-expert computations from stored tokens,
 * shard merging, per-sample ES-Act/ES-Mag, and a tiny fully hand-computed case. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "calib/blocksum.h"
#include "calib/stats.h"
#include "base/util.h"

/* Inputs are float32, all sums are double: the only differences between the accumulator and the
 * direct recomputation below are double rounding in a different summation order, O(N·1e-16)
 * relative, so 1e-10 relative is generous yet catches any formula error. */
#define TOL 1e-10
static void assert_close(double got, double want) {
    double tol = TOL * (1.0 + fabs(want));
    if (fabs(got - want) > tol) fail_msg("got %.17g want %.17g", got, want);
}

enum { E = 5, K_TOP = 2, D = 3, NTOK = 13 };
static const int sample_len[] = {4, 7, 2};

typedef struct {
    float p[NTOK][E], g[NTOK][K_TOP], f[NTOK][E * D];
    int32_t topk[NTOK][K_TOP];
} tokens;

/* Random logits -> full softmax; top-k by p (ties -> lower index); renormalised gates.
 * Expert 4 gets a very low logit so it is never routed (tests the n_e = 0 paths). */
static void make_tokens(tokens *t, uint64_t seed) {
    uint64_t st = seed;
    for (int n = 0; n < NTOK; n++) {
        double logit[E], mx = -1e30, z = 0;
        for (int e = 0; e < E; e++) {
            logit[e] = e == 4 ? -50 : 2 * tu_rand_normal(&st);
            mx = fmax(mx, logit[e]);
        }
        for (int e = 0; e < E; e++) z += exp(logit[e] - mx);
        for (int e = 0; e < E; e++) t->p[n][e] = (float)(exp(logit[e] - mx) / z);
        int used[E] = {0};
        float gs = 0;
        for (int r = 0; r < K_TOP; r++) {
            int best = -1;
            for (int e = 0; e < E; e++)
                if (!used[e] && (best < 0 || t->p[n][e] > t->p[n][best])) best = e;
            used[best] = 1;
            t->topk[n][r] = best;
            gs += t->p[n][best];
        }
        /* odd seeds: a model without renormalisation (native gate = raw p) */
        for (int r = 0; r < K_TOP; r++) t->g[n][r] = t->p[n][t->topk[n][r]] / (seed % 2 ? 1 : gs);
        for (int i = 0; i < E * D; i++) t->f[n][i] = (float)tu_rand_normal(&st);
    }
}

static void feed(m2d_layer_stats *s, const tokens *t, int from, int to) {
    int n = 0;
    for (size_t smp = 0; smp < M2D_ARRAY_LEN(sample_len); smp++)
        for (int i = 0; i < sample_len[smp]; i++, n++) {
            if (n >= from && n < to) m2d_layer_stats_add_token(s, t->p[n], t->topk[n], t->g[n], t->f[n]);
            if (i == sample_len[smp] - 1 && n >= from && n < to) m2d_layer_stats_end_sample(s);
        }
}

static double gate_of(const tokens *t, int n, int e) {
    for (int r = 0; r < K_TOP; r++)
        if (t->topk[n][r] == e) return t->g[n][r];
    return -1; /* not routed */
}
static double norm_of(const tokens *t, int n, int e) {
    double s = 0;
    for (int j = 0; j < D; j++) s += (double)t->f[n][e * D + j] * t->f[n][e * D + j];
    return sqrt(s);
}

/* The renormalised gate r_e(t) = p_e / Σ_{i∈S(t)} p_i (paper 004 Eq. 1). */
static double renorm_gate(const tokens *t, int n, int e) {
    double ps = 0;
    for (int r = 0; r < K_TOP; r++) ps += t->p[n][t->topk[n][r]];
    return gate_of(t, n, e) < 0 ? -1 : t->p[n][e] / ps;
}

/* ‖y − y^(−j)‖ of paper 004 Eqs. 3–5 by brute force: mask j's router row, redo the top-k over the
 * remaining experts (ties → lower index), renormalise over the new set. */
static double exact_damage(const tokens *t, int n, int j) {
    int used[E] = {0};
    used[j] = 1;
    int sel[K_TOP];
    double ps = 0, ps0 = 0;
    for (int r = 0; r < K_TOP; r++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (!used[e] && (best < 0 || t->p[n][e] > t->p[n][best])) best = e;
        used[best] = 1, sel[r] = best, ps += t->p[n][best];
        ps0 += t->p[n][t->topk[n][r]];
    }
    double sq = 0;
    for (int c = 0; c < D; c++) {
        double y = 0, y2 = 0;
        for (int r = 0; r < K_TOP; r++) {
            y += t->p[n][t->topk[n][r]] / ps0 * t->f[n][t->topk[n][r] * D + c];
            y2 += t->p[n][sel[r]] / ps * t->f[n][sel[r] * D + c];
        }
        sq += (y - y2) * (y - y2);
    }
    return sqrt(sq);
}

static void check_renormalised_and_damage(const m2d_layer_stats *s, const tokens *t, int e) {
    double sr = 0, sr2 = 0, srf = 0, srf2 = 0, sr2f = 0, sr2f2 = 0, dmg = 0;
    for (int i = 0; i < NTOK; i++) {
        double r = renorm_gate(t, i, e);
        if (r < 0) continue;
        double nf = norm_of(t, i, e);
        sr += r, sr2 += r * r, srf += r * nf, srf2 += r * nf * nf, sr2f += r * r * nf, sr2f2 += r * r * nf * nf;
        dmg += exact_damage(t, i, e);
    }
    assert_close(s->sum_r[e], sr);
    assert_close(s->sum_r2[e], sr2);
    assert_close(s->sum_rf[e], srf);
    assert_close(s->sum_rf2[e], srf2);
    assert_close(s->sum_r2f[e], sr2f);
    assert_close(s->sum_r2f2[e], sr2f2);
    assert_close(s->damage[e], dmg);
}

/* Every statistic recomputed per expert straight from the definitions of SPEC §1. */
static void check_against_direct(const m2d_layer_stats *s, const tokens *t) {
    assert_close(s->N, NTOK);
    for (int e = 0; e < E; e++) {
        double n = 0, sp = 0, sps = 0, sg = 0, sg2 = 0, sf = 0, sf2 = 0, sgf = 0, sg2f2 = 0, sgf2 = 0, sg2f = 0;
        for (int i = 0; i < NTOK; i++) {
            sp += t->p[i][e];
            double g = gate_of(t, i, e);
            if (g < 0) continue;
            double nf = norm_of(t, i, e);
            n++, sps += t->p[i][e], sg += g, sg2 += g * g, sf += nf, sf2 += nf * nf, sgf += g * nf;
            sg2f2 += g * g * nf * nf, sgf2 += g * nf * nf, sg2f += g * g * nf;
        }
        assert_close(s->n[e], n);
        assert_close(s->sum_p[e], sp);
        assert_close(s->sum_p_sel[e], sps);
        assert_close(s->sum_g[e], sg);
        assert_close(s->sum_g2[e], sg2);
        assert_close(s->sum_f[e], sf);
        assert_close(s->sum_f2[e], sf2);
        assert_close(s->sum_gf[e], sgf);
        assert_close(s->sum_g2f2[e], sg2f2);
        assert_close(s->sum_gf2[e], sgf2);
        assert_close(s->sum_g2f[e], sg2f);
        check_renormalised_and_damage(s, t, e);
        for (int j = 0; j < E; j++) {
            double G = 0;
            for (int i = 0; i < NTOK; i++)
                for (int c = 0; c < D; c++) G += (double)t->f[i][e * D + c] * t->f[i][j * D + c];
            assert_close(s->gram[e * E + j], G);
            assert_true(s->gram[e * E + j] == s->gram[j * E + e]); /* exactly symmetric (by construction: one triangle mirrored) */
        }
        for (int c = 0; c < D; c++) {
            double mu = 0, rm = 0, rv = 0;
            for (int i = 0; i < NTOK; i++) mu += t->f[i][e * D + c];
            for (int i = 0; i < NTOK; i++)
                if (gate_of(t, i, e) >= 0) rm += t->f[i][e * D + c];
            rm = n > 0 ? rm / n : 0;
            for (int i = 0; i < NTOK; i++) /* two-pass variance: independent of E[x²]−E[x]² */
                if (gate_of(t, i, e) >= 0) rv += (t->f[i][e * D + c] - rm) * (t->f[i][e * D + c] - rm);
            rv = n > 0 ? rv / n : 0;
            assert_close(s->mu[e * D + c], mu / NTOK);
            assert_close(s->routed_mean[e * D + c], rm);
            assert_close(s->routed_var[e * D + c], rv);
        }
        /* ES: mean over the 3 samples of (routed count / L_s) and (Σ routed ‖f‖ / L_s) */
        double act = 0, mag = 0, magg = 0;
        int i0 = 0;
        for (size_t smp = 0; smp < M2D_ARRAY_LEN(sample_len); smp++) {
            double a = 0, m = 0, mg = 0;
            for (int i = i0; i < i0 + sample_len[smp]; i++) { /* every token: ‖g f‖, g = 0 off the top-k */
                double g = gate_of(t, i, e);
                if (g >= 0) a += 1, m += norm_of(t, i, e);
                mg += (g >= 0 ? g : 0) * norm_of(t, i, e);
            }
            act += a / sample_len[smp];
            mag += m / sample_len[smp];
            magg += mg / sample_len[smp];
            i0 += sample_len[smp];
        }
        assert_close(s->es_act[e], act / 3);
        assert_close(s->es_mag[e], mag / 3);
        assert_close(s->es_mag_gated[e], magg / 3);
    }
    assert_int_equal(s->n_samples, 3);
    /* the never-routed expert: zeros, not NaN */
    assert_true(s->n[4] == 0 && s->routed_mean[4 * D] == 0 && s->routed_var[4 * D] == 0);
}

static void accumulator_matches_definitions(void **state) {
    (void)state;
    tokens t;
    make_tokens(&t, 42);
    m2d_layer_stats s;
    m2d_layer_stats_alloc(&s, 7, E, K_TOP, D);
    assert_int_equal(s.layer, 7);
    feed(&s, &t, 0, NTOK);
    m2d_layer_stats_finalize(&s);
    check_against_direct(&s, &t);
    m2d_layer_stats_finalize(&s); /* idempotent */
    check_against_direct(&s, &t);
    m2d_layer_stats_free(&s);
    make_tokens(&t, 43); /* native gates = raw p: renormalised sums differ from the native ones */
    m2d_layer_stats_alloc(&s, 7, E, K_TOP, D);
    feed(&s, &t, 0, NTOK);
    m2d_layer_stats_finalize(&s);
    check_against_direct(&s, &t);
    assert_true(fabs(s.sum_g[0] - s.sum_r[0]) > 1e-3);
    /* router-logit Gram: Σ_t z_i z_j, exactly symmetric; exact on every CPU whatever the order or FMA:
     * dyadic values of few bits, every product and sum representable */
    double z1[E] = {1, -2, 0.5, 3, 0}, z2[E] = {0.25, 1, -1, 2, 4};
    m2d_layer_stats_add_logits(&s, z1);
    m2d_layer_stats_add_logits(&s, z2);
    for (int i = 0; i < E; i++)
        for (int j = 0; j < E; j++) assert_true(s.logit_gram[i * E + j] == z1[i] * z1[j] + z2[i] * z2[j]);
    m2d_layer_stats_free(&s);
}

static void merge_of_shards_equals_whole(void **state) {
    (void)state;
    tokens t;
    make_tokens(&t, 7);
    m2d_layer_stats a, b;
    m2d_layer_stats_alloc(&a, 0, E, K_TOP, D);
    m2d_layer_stats_alloc(&b, 0, E, K_TOP, D);
    feed(&a, &t, 0, 4);     /* sample 0 */
    feed(&b, &t, 4, NTOK);  /* samples 1 and 2 */
    m2d_layer_stats_finalize(&a); /* merging after finalize is allowed */
    assert_int_equal(m2d_layer_stats_merge(&a, &b), 0);
    m2d_layer_stats_finalize(&a);
    check_against_direct(&a, &t);

    m2d_layer_stats bad;
    m2d_layer_stats_alloc(&bad, 3, E + 1, K_TOP, D);
    assert_int_equal(m2d_layer_stats_merge(&a, &bad), -1);
    assert_non_null(strstr(m2d_errmsg(), "layer 3"));
    m2d_layer_stats open;
    m2d_layer_stats_alloc(&open, 0, E, K_TOP, D);
    m2d_layer_stats_add_token(&open, t.p[0], t.topk[0], t.g[0], t.f[0]);
    assert_int_equal(m2d_layer_stats_merge(&a, &open), -1);
    assert_non_null(strstr(m2d_errmsg(), "open sample"));
    m2d_layer_stats_free(&a);
    m2d_layer_stats_free(&b);
    m2d_layer_stats_free(&bad);
    m2d_layer_stats_free(&open);
}

/* E=2, k=1, d=2, two samples of lengths 2 and 1, every number by hand. */
static void tiny_hand_computed(void **state) {
    (void)state;
    m2d_layer_stats s;
    m2d_layer_stats_alloc(&s, 0, 2, 1, 2);
    const float p1[] = {0.75f, 0.25f}, p2[] = {0.5f, 0.5f}, p3[] = {0.25f, 0.75f};
    const int32_t s1[] = {0}, s2[] = {0}, s3[] = {1};
    const float g1[] = {0.75f}, g2[] = {0.5f}, g3[] = {0.75f}; /* native gates of a model without renormalisation */
    const float f1[] = {3, 4, 1, 0}, f2[] = {0, 1, 2, 2}, f3[] = {6, 8, 0, 5};
    m2d_layer_stats_add_token(&s, p1, s1, g1, f1);
    m2d_layer_stats_add_token(&s, p2, s2, g2, f2);
    m2d_layer_stats_end_sample(&s);
    m2d_layer_stats_add_token(&s, p3, s3, g3, f3);
    m2d_layer_stats_finalize(&s); /* closes the open second sample */
    assert_close(s.N, 3);
    assert_close(s.n[0], 2), assert_close(s.n[1], 1);
    assert_close(s.sum_p[0], 1.5), assert_close(s.sum_p_sel[0], 1.25), assert_close(s.sum_p_sel[1], 0.75);
    assert_close(s.sum_f[0], 6), assert_close(s.sum_f2[0], 26), assert_close(s.sum_f[1], 5);
    /* G00 = 25+1+100, G01 = 3+2+40, G11 = 1+8+25 */
    assert_close(s.gram[0], 126), assert_close(s.gram[1], 45), assert_close(s.gram[3], 34);
    assert_close(s.mu[0], 3), assert_close(s.mu[1], 13.0 / 3);
    assert_close(s.routed_mean[0], 1.5), assert_close(s.routed_mean[1], 2.5);
    assert_close(s.routed_var[0], 2.25), assert_close(s.routed_var[1], 2.25);
    assert_close(s.routed_mean[2], 0), assert_close(s.routed_mean[3], 5), assert_close(s.routed_var[3], 0);
    /* ES-Act: sample 1: e0 2/2, e1 0; sample 2: e0 0, e1 1/1 → [0.5, 0.5]
     * ES-Mag: sample 1: e0 (5+1)/2 = 3; sample 2: e1 5/1 → [1.5, 2.5] */
    assert_close(s.es_act[0], 0.5), assert_close(s.es_act[1], 0.5);
    assert_close(s.es_mag[0], 1.5), assert_close(s.es_mag[1], 2.5);
    /* ES-Mag of paper 001 (gated output, every token): sample 1: e0 (0.75·5 + 0.5·1)/2 = 2.125;
     * sample 2: e1 0.75·5/1 = 3.75 → [1.0625, 1.875] */
    assert_close(s.es_mag_gated[0], 1.0625), assert_close(s.es_mag_gated[1], 1.875);
    /* k = 1: the renormalised gate is 1 whatever the native one */
    assert_close(s.sum_g[0], 1.25), assert_close(s.sum_r[0], 2), assert_close(s.sum_rf[0], 6);
    assert_close(s.sum_r2f2[1], 25);
    /* exact damage (paper 004 Eq. 7), removing the routed expert promotes the other one (r' = 1):
     * t1: y = f0 = (3,4), y' = f1 = (1,0): √20; t2: (0,1) vs (2,2): √5; t3: f1 = (0,5) vs f0 = (6,8): √45 */
    assert_close(s.damage[0], sqrt(20) + sqrt(5)), assert_close(s.damage[1], sqrt(45));
    assert_int_equal(s.n_samples, 2);
    m2d_layer_stats_free(&s);
}

/* ---------------- blocksum: the fast path's vectorised damage against the scalar loops ---------------- */

static float rand_float(uint64_t *st) { return (float)((double)(tu_rand_u64(st) >> 11) / 9007199254740992.0 * 4 - 2); }

/* A token's top-KK of EE experts by p (ties -> lower index) and its softmax-like p */
static void random_routing(uint64_t *st, int EE, int KK, float *p, int32_t *topk) {
    double sum = 0;
    for (int e = 0; e < EE; e++) p[e] = (float)exp(rand_float(st)), sum += p[e];
    for (int e = 0; e < EE; e++) p[e] = (float)(p[e] / sum);
    int used[64] = {0};
    for (int r = 0; r < KK; r++) {
        int best = -1;
        for (int e = 0; e < EE; e++)
            if (!used[e] && (best < 0 || p[e] > p[best])) best = e;
        used[best] = 1, topk[r] = best;
    }
}

/* token rows by rank (what calibration's fast path reads): f_{topk[r]} for r < KK, then the
 * replacement NX's (zeros when none), rows of DD floats out of F [EE][DD] */
static void rows_by_rank(const float *F, const int32_t *topk, int KK, int nx, int DD, float *rows) {
    for (int r = 0; r <= KK; r++) {
        int e = r < KK ? topk[r] : nx;
        for (int c = 0; c < DD; c++) rows[(size_t)r * DD + c] = e >= 0 ? F[(size_t)e * DD + c] : 0.0f;
    }
}

/* The vectorised damage against stats.c's reference formula (itself checked against the brute
 * force above): the same coefficients, only the Σ_c delta² order differs, so 1e-12 relative
 * (d = 37 terms of fp64 rounding); the reference from rows by rank gives the reference's bits
 * (the same loops over the same values). Cases: routing with a replacement expert, k = E (no
 * replacement), top-k probabilities all 0 (nothing added), k above the kernel's limit (-1). */
static void blocksum_damage_matches_reference(void **state) {
    (void)state;
    enum { EE = 12, DD = 37 };
    uint64_t st = 11;
    float p[EE], F[EE * DD], R[(EE + 1) * DD + 3];
    int32_t topk[EE];
    double out[EE];
    int ks[] = {1, 4, EE};
    for (size_t c = 0; c < M2D_ARRAY_LEN(ks); c++)
        for (int t = 0; t < 20; t++) {
            int KK = ks[c];
            random_routing(&st, EE, KK, p, topk);
            for (int i = 0; i < EE * DD; i++) F[i] = rand_float(&st);
            int nx = m2d_layer_stats_next_expert(p, topk, KK, EE);
            assert_true(KK == EE ? nx == -1 : nx >= 0);
            rows_by_rank(F, topk, KK, nx, DD, R + 3); /* + 3: rows not 32-byte aligned */
            m2d_layer_stats ref, by_rank;
            m2d_layer_stats_alloc(&ref, 0, EE, KK, DD);
            m2d_layer_stats_alloc(&by_rank, 0, EE, KK, DD);
            m2d_layer_stats_add_damage(&ref, p, topk, F, DD);
            m2d_layer_stats_add_damage_rows(&by_rank, p, topk, nx, R + 3, DD);
            assert_memory_equal(ref.damage, by_rank.damage, sizeof(double) * EE);
            assert_int_equal(m2d_blocksum_damage(p, topk, KK, nx, DD, R + 3, DD, out), 0);
            for (int r = 0; r < KK; r++) {
                double want = ref.damage[topk[r]];
                assert_true(want > 0);
                assert_true(fabs(out[r] - want) <= 1e-12 * want);
            }
            m2d_layer_stats_free(&ref);
            m2d_layer_stats_free(&by_rank);
        }
    for (int e = 0; e < EE; e++) p[e] = e < 4 ? 0.0f : 0.125f; /* top-4 by id order among equal p... */
    int32_t zero_top[4] = {0, 1, 2, 3};                        /* ...forced onto experts with p = 0 */
    assert_int_equal(m2d_blocksum_damage(p, zero_top, 4, 4, DD, R, DD, out), 0);
    for (int r = 0; r < 4; r++) assert_true(out[r] == 0); /* p = 0: exact zeros */
    int32_t big[33] = {0};
    assert_int_equal(m2d_blocksum_damage(p, big, 33, -1, DD, R, DD, out), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(accumulator_matches_definitions),
        cmocka_unit_test(merge_of_shards_equals_whole),
        cmocka_unit_test(tiny_hand_computed),
        cmocka_unit_test(blocksum_damage_matches_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
