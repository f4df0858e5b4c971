/* scoring plugins: each formula against a direct per-token computation on synthetic data, REAP's
 * own unit-test vectors, ConMoE against brute-force weight distances, and registry behaviour.
 * Exact comparisons here (ids, groups, selections, scores of two plugins) are exact on every CPU:
 * plain scalar C on fixed inputs (no BLAS, no oneDNN), whose IEEE operations (-std=c11: no FMA
 * contraction) give the same bits on every x86-64 CPU, and decisions taken on those bits. */
#include "testutil.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "crit_fixture.h"
#include "criteria/registry.h"

/* Statistics are double sums of float inputs; the direct recomputation differs only in summation
 * order (relative ~1e-15 per op), so 1e-9 relative is loose enough yet catches any formula slip. */
#define TOL 1e-9

enum { E = 6, KT = 2, D = 4, NEVER = 5 };
static const int lens[] = {5, 9, 3, 7};

typedef double (*direct_fn)(const fx_tokens *t, int e);

/* r_e(t) = p_e / Σ_{i∈S(t)} p_i, the gate of paper 004 Eq. 1 (the scorings' default); -1 off the top-k */
static double renormed(const fx_tokens *t, int n, int e) {
    double ps = 0;
    for (int r = 0; r < t->k; r++) ps += t->p[(size_t)n * t->E + t->topk[(size_t)n * t->k + r]];
    return fx_gate(t, n, e) >= 0 ? t->p[(size_t)n * t->E + e] / ps : -1;
}
/* Σ_routed g^a ‖f‖^c with the renormalised gate (NATIVE = 0) or the model's own (NATIVE = 1) */
static double routed_sum_g(const fx_tokens *t, int e, int a, int c, int native) {
    double s = 0;
    for (int n = 0; n < t->n_tok; n++) {
        double g = native ? fx_gate(t, n, e) : renormed(t, n, e);
        if (g >= 0) s += pow(g, a) * pow(fx_norm(t, n, e), c);
    }
    return s;
}
static double routed_sum(const fx_tokens *t, int e, int a, int c) { return routed_sum_g(t, e, a, c, 0); }
static double count(const fx_tokens *t, int e) { return routed_sum(t, e, 0, 0); }
static double ravg(const fx_tokens *t, int e, int a, int c) { return count(t, e) > 0 ? routed_sum(t, e, a, c) / count(t, e) : 0; }
static double sum_p(const fx_tokens *t, int e, int routed_only) {
    double s = 0;
    for (int n = 0; n < t->n_tok; n++)
        if (!routed_only || fx_gate(t, n, e) >= 0) s += t->p[(size_t)n * t->E + e];
    return s;
}
static double cp(const fx_tokens *t, int e) { return count(t, e) > 0 ? sum_p(t, e, 1) / count(t, e) : 0; }
static double mean_sq_norm_all(const fx_tokens *t, int e) {
    double s = 0;
    for (int n = 0; n < t->n_tok; n++) s += fx_norm(t, n, e) * fx_norm(t, n, e);
    return s / t->n_tok;
}

static double d_sf(const fx_tokens *t, int e) { return count(t, e) / t->n_tok; }
static double d_pp(const fx_tokens *t, int e) { return sum_p(t, e, 0) / t->n_tok; }
static double d_ps(const fx_tokens *t, int e) { return sum_p(t, e, 1) / t->n_tok; }
static double d_acp(const fx_tokens *t, int e) { return cp(t, e) * sqrt(mean_sq_norm_all(t, e)); }
static double d_acp_routed(const fx_tokens *t, int e) { return cp(t, e) * sqrt(ravg(t, e, 0, 2)); }
static double d_reap(const fx_tokens *t, int e) { return ravg(t, e, 1, 1); }
static double d_ean(const fx_tokens *t, int e) { return routed_sum(t, e, 0, 1); }
static double d_man(const fx_tokens *t, int e) { return ravg(t, e, 0, 1); }
static double d_msan(const fx_tokens *t, int e) { return ravg(t, e, 0, 2); }
static double d_seer(const fx_tokens *t, int e) { return routed_sum(t, e, 1, 0); }
/* mag 0: ES-Act, paper 001 App. D: (1/N_s) Σ_j (1/L_j) Σ_k 1[g > 0] / K; mag 1: ES-Mag over every
 * token of ‖v‖, v the gated output g·f (g = 0 off the top-k); mag 2: the ungated routed variant */
static double es(const fx_tokens *t, int e, int mag) {
    double acc = 0;
    int n = 0;
    for (int s = 0; s < t->n_samples; s++) {
        double x = 0;
        for (int i = 0; i < t->sample_len[s]; i++, n++) {
            double g = fx_gate(t, n, e) >= 0 ? fx_gate(t, n, e) : 0;
            if (mag == 1) x += g * fx_norm(t, n, e);
            else if (g > 0) x += mag ? fx_norm(t, n, e) : 1.0 / t->k;
        }
        acc += x / t->sample_len[s];
    }
    return acc / t->n_samples;
}
static double d_es_act(const fx_tokens *t, int e) { return es(t, e, 0); }
static double d_es_mag(const fx_tokens *t, int e) { return es(t, e, 1); }
/* MoNE: mean routed gate × ‖per-dimension std‖; two-pass variance, population (ddof 0) */
static double mone(const fx_tokens *t, int e, int ddof) {
    double n = count(t, e);
    if (n == 0) return 0;
    double var_sum = 0;
    for (int j = 0; j < t->d; j++) {
        double m = 0, v = 0;
        for (int i = 0; i < t->n_tok; i++)
            if (fx_gate(t, i, e) >= 0) m += fx_f(t, i, e)[j];
        m /= n;
        for (int i = 0; i < t->n_tok; i++)
            if (fx_gate(t, i, e) >= 0) v += (fx_f(t, i, e)[j] - m) * (fx_f(t, i, e)[j] - m);
        var_sum += n - ddof > 0 ? v / (n - ddof) : 0;
    }
    return ravg(t, e, 1, 0) * sqrt(var_sum);
}
static double d_mone(const fx_tokens *t, int e) { return mone(t, e, 1); } /* paper 004 Table 6: 1/(N_j − 1) */

static const struct { const char *name; direct_fn fn; int routed_avg; } table[] = {
    {"sf", d_sf, 0},     {"pp", d_pp, 0},     {"ps", d_ps, 0},           {"cp", cp, 1},
    {"acp", d_acp, 1},   {"acp-routed", d_acp_routed, 1},                {"reap", d_reap, 1},
    {"ean", d_ean, 0},   {"man", d_man, 1},   {"msan", d_msan, 1},       {"freq", count, 0},
    {"seer", d_seer, 0}, {"es-act", d_es_act, 0}, {"es-mag", d_es_mag, 0}, {"mone", d_mone, 1},
    {"do-cp", cp, 1},    {"do-acp", d_acp, 1},    {"do-reap", d_reap, 1},
};

static void formulas_match_direct_computation(void **state) {
    (void)state;
    fx_tokens t = fx_make_tokens(E, KT, D, 4, lens, NEVER, 11);
    m2d_layer_stats s;
    fx_stats_from_tokens(&t, &s);
    m2d_layer_view v = fx_view(&s, NULL, 3, 0, NULL);
    double scores[E];
    int sel[E];
    for (size_t i = 0; i < M2D_ARRAY_LEN(table); i++) {
        fx_scores(table[i].name, &v, scores, sel);
        for (int e = 0; e < E; e++) fx_close(scores[e], table[i].fn(&t, e), TOL, table[i].name, e);
        if (table[i].routed_avg) assert_true(scores[NEVER] == 0.0); /* never routed: exactly 0 */
        /* non-DO plugins select top-K by score */
        if (strncmp(table[i].name, "do-", 3) != 0) {
            int want[E];
            m2d_select_topk(scores, E, 3, want);
            assert_memory_equal(sel, want, 3 * sizeof(int));
        }
    }
    m2d_layer_stats_free(&s);
    fx_free_tokens(&t);
}

/* bac over the paper's whole grid b ∈ {0, 1, 0.5}, a, c ∈ {0,1,2}, and its named special cases */
static void bac_family_grid(void **state) {
    (void)state;
    fx_tokens t = fx_make_tokens(E, KT, D, 4, lens, NEVER, 5);
    m2d_layer_stats s;
    fx_stats_from_tokens(&t, &s);
    double scores[E];
    int sel[E];
    const double bs[] = {0, 1, 0.5};
    const char *keys[] = {"b", "a", "c"};
    for (int bi = 0; bi < 3; bi++)
        for (int a = 0; a <= 2; a++)
            for (int c = 0; c <= 2; c++) {
                double vals[] = {bs[bi], a, c};
                m2d_params prm = {3, keys, vals};
                m2d_layer_view v = fx_view(&s, NULL, 2, 0, &prm);
                fx_scores("bac", &v, scores, sel);
                for (int e = 0; e < E; e++) {
                    double n = count(&t, e), want = n > 0 ? routed_sum(&t, e, a, c) / pow(n, bs[bi]) : 0;
                    fx_close(scores[e], want, TOL, "bac", e);
                }
            }
    /* named members: freq (0,0,0), seer (0,1,0), ean (0,0,1), reap (1,1,1), man (1,0,1), msan (1,0,2) */
    const struct { const char *name; double b, a, c; } named[] = {
        {"freq", 0, 0, 0}, {"seer", 0, 1, 0}, {"ean", 0, 0, 1}, {"reap", 1, 1, 1}, {"man", 1, 0, 1}, {"msan", 1, 0, 2}};
    for (size_t i = 0; i < M2D_ARRAY_LEN(named); i++) {
        double vals[] = {named[i].b, named[i].a, named[i].c}, ref[E];
        m2d_params prm = {3, keys, vals};
        m2d_layer_view v = fx_view(&s, NULL, 2, 0, &prm), v0 = fx_view(&s, NULL, 2, 0, NULL);
        fx_scores("bac", &v, scores, sel);
        fx_scores(named[i].name, &v0, ref, sel);
        for (int e = 0; e < E; e++) fx_close(scores[e], ref[e], 1e-12, named[i].name, e);
    }
    /* defaults b=a=c=1 are REAP */
    m2d_layer_view v = fx_view(&s, NULL, 2, 0, NULL);
    double ref[E];
    fx_scores("bac", &v, scores, sel);
    fx_scores("reap", &v, ref, sel);
    assert_memory_equal(scores, ref, sizeof ref);
    /* exponents outside the stored grid and unknown keys are errors naming the field */
    double bad_vals[] = {1, 3, 1};
    m2d_params bad = {3, keys, bad_vals};
    v = fx_view(&s, NULL, 2, 0, &bad);
    assert_int_equal(m2d_score_and_select(m2d_plugin_find(M2D_SCORING, "bac"), &v, scores, sel), -1);
    assert_non_null(strstr(m2d_errmsg(), "a=3"));
    /* exponents beyond int are refused before any cast to int (UB; caught by SAN=1's float-cast-overflow) */
    const double huge[][3] = {{1, 1e300, 1}, {1, 1, -1e300}, {1, 3e9, 1}, {1, 1, -3e9}};
    for (size_t i = 0; i < M2D_ARRAY_LEN(huge); i++) {
        m2d_params h = {3, keys, huge[i]};
        v = fx_view(&s, NULL, 2, 0, &h);
        assert_int_equal(m2d_score_and_select(m2d_plugin_find(M2D_SCORING, "bac"), &v, scores, sel), -1);
        assert_non_null(strstr(m2d_errmsg(), "scoring plugin 'bac': layer 0: field 'a'/'c'"));
    }
    m2d_params typo;
    assert_int_equal(m2d_params_parse("b=1,bb=2", &typo), 0);
    v = fx_view(&s, NULL, 2, 0, &typo);
    assert_int_equal(m2d_score_and_select(m2d_plugin_find(M2D_SCORING, "bac"), &v, scores, sel), -1);
    assert_non_null(strstr(m2d_errmsg(), "'bb'"));
    m2d_params_free(&typo);
    m2d_layer_stats_free(&s);
    fx_free_tokens(&t);
}

/* the documented alternatives: MoNE's population std (ddof=0), ES-Mag's ungated variant (gated=0) */
static void named_variants(void **state) {
    (void)state;
    fx_tokens t = fx_make_tokens(E, KT, D, 4, lens, NEVER, 9);
    m2d_layer_stats s;
    fx_stats_from_tokens(&t, &s);
    const char *keys[] = {"ddof"}, *gkeys[] = {"gated"};
    double vals[] = {0};
    m2d_params prm = {1, keys, vals}, gprm = {1, gkeys, vals};
    m2d_layer_view v = fx_view(&s, NULL, 2, 0, &prm);
    double scores[E];
    int sel[E];
    fx_scores("mone", &v, scores, sel);
    for (int e = 0; e < E; e++) fx_close(scores[e], mone(&t, e, 0), TOL, "mone ddof=0", e);
    v = fx_view(&s, NULL, 2, 0, &gprm);
    fx_scores("es-mag", &v, scores, sel);
    for (int e = 0; e < E; e++) fx_close(scores[e], es(&t, e, 2), TOL, "es-mag gated=0", e);
    m2d_layer_stats_free(&s);
    fx_free_tokens(&t);
}

/* On a model that does not renormalise (native gate = raw p), REAP, SEER, S(b,a,c) and MoNE use
 * the gate renormalised over the top-k (paper 004 Eq. 1) unless renorm=0. */
static void renormalised_gate_default(void **state) {
    (void)state;
    fx_tokens t = fx_make_tokens(E, KT, D, 4, lens, NEVER, 13);
    for (int n = 0; n < t.n_tok; n++) /* native gate = raw softmax */
        for (int r = 0; r < KT; r++) t.g[(size_t)n * KT + r] = t.p[(size_t)n * E + t.topk[(size_t)n * KT + r]];
    m2d_layer_stats s;
    fx_stats_from_tokens(&t, &s);
    double sc[E], sr[E], sn[E];
    int sel[E];
    const char *keys[] = {"renorm"};
    double zero[] = {0};
    m2d_params native = {1, keys, zero};
    for (int e = 0; e < E; e++) {
        double n = count(&t, e), a = 0, b = 0;
        for (int i = 0; i < t.n_tok; i++)
            if (fx_gate(&t, i, e) >= 0) a += renormed(&t, i, e) * fx_norm(&t, i, e), b += renormed(&t, i, e);
        sr[e] = n > 0 ? a / n : 0; /* REAP with r */
        sn[e] = b;                 /* SEER with r */
    }
    m2d_layer_view v = fx_view(&s, NULL, 2, 0, NULL), vn = fx_view(&s, NULL, 2, 0, &native);
    fx_scores("reap", &v, sc, sel);
    for (int e = 0; e < E; e++) fx_close(sc[e], sr[e], TOL, "reap renorm", e);
    fx_scores("bac", &v, sc, sel);
    for (int e = 0; e < E; e++) fx_close(sc[e], sr[e], TOL, "bac renorm", e);
    fx_scores("seer", &v, sc, sel);
    for (int e = 0; e < E; e++) fx_close(sc[e], sn[e], TOL, "seer renorm", e);
    double native_reap[E];
    for (int e = 0; e < E; e++) native_reap[e] = count(&t, e) > 0 ? routed_sum_g(&t, e, 1, 1, 1) / count(&t, e) : 0;
    fx_scores("reap", &vn, sc, sel);
    for (int e = 0; e < E; e++) fx_close(sc[e], native_reap[e], TOL, "reap native", e);
    fx_scores("seer", &vn, sc, sel);
    for (int e = 0; e < E; e++) fx_close(sc[e], routed_sum_g(&t, e, 1, 0, 1), TOL, "seer native", e);
    assert_true(fabs(sr[0] - native_reap[0]) > 1e-3 * sr[0]); /* the two really differ here */
    m2d_layer_stats_free(&s);
    fx_free_tokens(&t);
}

/* REAP's own unit-test vectors: E=2, k=1, outputs e0=[[3,4],[1,0],[5,12]], e1=[[0,2],[0,4],[8,15]],
 * selected [0],[1],[0], logits [[2,1],[0,3],[4,0]], mask [1,0,1]: only tokens 0 and 2 are fed;
 * gates are the full softmax (k=1, not renormalised). */
static void reap_reference_vectors(void **state) {
    (void)state;
    const float out[3][4] = {{3, 4, 0, 2}, {1, 0, 0, 4}, {5, 12, 8, 15}}; /* token: [e0 | e1] */
    const double logits[3][2] = {{2, 1}, {0, 3}, {4, 0}};
    const int32_t sel[3] = {0, 1, 0};
    const int mask[3] = {1, 0, 1};
    m2d_layer_stats s;
    m2d_layer_stats_alloc(&s, 0, 2, 1, 2);
    for (int t = 0; t < 3; t++) {
        if (!mask[t]) continue;
        double z = exp(logits[t][0]) + exp(logits[t][1]);
        float p[2] = {(float)(exp(logits[t][0]) / z), (float)(exp(logits[t][1]) / z)};
        float g[1] = {p[sel[t]]};
        m2d_layer_stats_add_token(&s, p, &sel[t], g, out[t]);
    }
    m2d_layer_stats_finalize(&s);
    m2d_layer_view v = fx_view(&s, NULL, 1, 0, NULL);
    double sc[2];
    int pick[2];
    fx_scores("freq", &v, sc, pick);
    assert_true(sc[0] == 2 && sc[1] == 0);
    fx_scores("ean", &v, sc, pick);
    assert_true(sc[0] == 18 && sc[1] == 0);
    fx_scores("man", &v, sc, pick);
    assert_true(sc[0] == 9 && sc[1] == 0);
    /* REAP's own vectors use the native (not renormalised) softmax gate: renorm=0. The reference
     * is printed to 6 decimals; p passes through fp32 (rel. 6e-8) */
    const char *keys[] = {"renorm"};
    double zero[] = {0};
    m2d_params native = {1, keys, zero};
    m2d_layer_view vn = fx_view(&s, NULL, 1, 0, &native);
    fx_scores("reap", &vn, sc, pick);
    assert_true(fabs(sc[0] - 8.210736) < 5e-7);
    assert_true(sc[1] == 0);
    assert_int_equal(pick[0], 0);
    /* paper 004 Eq. 1 (the default): with k = 1 the renormalised gate is 1, REAP = MAN = 9 */
    fx_scores("reap", &v, sc, pick);
    assert_true(sc[0] == 9 && sc[1] == 0);
    m2d_layer_stats_free(&s);
}

/* ConMoE vs brute force: distances from explicit weight differences, min-max norms by hand. */
static void conmoe_against_brute_force(void **state) {
    (void)state;
    enum { CE = 5, CD = 3, DE = 2 };
    fx_tokens t = fx_make_tokens(CE, 2, CD, 2, lens, -1, 21);
    m2d_layer_stats s;
    fx_stats_from_tokens(&t, &s);
    uint64_t st = 3;
    float router[CE * CD], w[3][CE * DE * CD];
    for (int i = 0; i < CE * CD; i++) router[i] = (float)tu_rand_normal(&st);
    for (int m = 0; m < 3; m++)
        for (int i = 0; i < CE * DE * CD; i++) w[m][i] = (float)tu_rand_normal(&st);
    /* expert 3 is a near copy of expert 1 (small nearest distance for both) */
    for (int m = 0; m < 3; m++)
        for (int i = 0; i < DE * CD; i++) w[m][3 * DE * CD + i] = w[m][1 * DE * CD + i] * 1.01f;
    fx_weights fw;
    fx_make_weights(&fw, M2D_F32, CE, CD, DE, router, w[0], w[1], w[2]);
    m2d_layer_view v = fx_view(&s, &fw.layer, 2, DE, NULL);
    double sc[CE];
    int sel[CE];
    fx_scores("conmoe", &v, sc, sel);
    const double eps = 1e-8;
    double a[CE], b[CE];
    for (int e = 0; e < CE; e++) {
        a[e] = d_reap(&t, e);
        b[e] = INFINITY;
        for (int o = 0; o < CE; o++) {
            if (o == e) continue;
            double dist = 0;
            for (int m = 0; m < 3; m++) {
                double diff = 0, ne = 0, no = 0;
                for (int i = 0; i < DE * CD; i++) {
                    double x = w[m][e * DE * CD + i], y = w[m][o * DE * CD + i];
                    diff += (x - y) * (x - y), ne += x * x, no += y * y;
                }
                dist += 2 * sqrt(diff) / (sqrt(ne) + sqrt(no) + 2 * eps) / 3;
            }
            b[e] = fmin(b[e], dist);
        }
    }
    double alo = a[0], ahi = a[0], blo = b[0], bhi = b[0];
    for (int e = 1; e < CE; e++) alo = fmin(alo, a[e]), ahi = fmax(ahi, a[e]), blo = fmin(blo, b[e]), bhi = fmax(bhi, b[e]);
    for (int e = 0; e < CE; e++) {
        double want = (a[e] - alo) / (ahi - alo + eps) * (b[e] - blo) / (bhi - blo + eps);
        /* weights are fp32 and the Gram route (‖x‖²+‖y‖²−2<x,y>, fp32 SYRK) loses ~1e-6 relative on
         * ‖x−y‖² for these O(1) sizes; the near-copy distance (~0.01) is the worst case: 1e-4 */
        fx_close(sc[e], want, 1e-4, "conmoe", e);
    }
    assert_true(sc[1] < 1e-3 || sc[3] < 1e-3); /* the near copies are the most replaceable */
    /* without weights: a clear error */
    m2d_layer_view nw = fx_view(&s, NULL, 2, DE, NULL);
    assert_int_equal(m2d_score_and_select(m2d_plugin_find(M2D_SCORING, "conmoe"), &nw, sc, sel), -1);
    assert_non_null(strstr(m2d_errmsg(), "conmoe"));
    fx_free_weights(&fw);
    m2d_layer_stats_free(&s);
    fx_free_tokens(&t);
}

/* ConMoE's ε (conmoe, conmoe-dist here; remap's in test_grouping) must be finite and > 0. On a
 * degenerate pool (all-zero experts) ε = 0 makes the weight distance 0/0, and ε < 0 passes silently
 * (with a changed min-max norm): both are one-line errors naming the field. The parser already
 * refuses nan and inf. */
static void conmoe_eps_must_be_positive(void **state) {
    (void)state;
    enum { CE = 4, CD = 3, DE = 2 };
    fx_tokens t = fx_make_tokens(CE, 2, CD, 2, lens, -1, 5);
    m2d_layer_stats s;
    fx_stats_from_tokens(&t, &s);
    static const float zr[CE * CD], zw[CE * DE * CD];
    fx_weights fw;
    fx_make_weights(&fw, M2D_F32, CE, CD, DE, zr, zw, zw, zw);
    const char *plugins[] = {"conmoe", "conmoe-dist"}, *bad[] = {"eps=-1", "eps=0", "eps=-0", "eps=-1e-300"};
    double sc[CE];
    int sel[CE];
    for (size_t i = 0; i < M2D_ARRAY_LEN(plugins); i++) {
        m2d_layer_view ok = fx_view(&s, &fw.layer, 2, DE, NULL);
        fx_scores(plugins[i], &ok, sc, sel); /* the default ε: every distance 0, every score 0 */
        for (int e = 0; e < CE; e++) assert_true(sc[e] == 0);
        char want[64];
        snprintf(want, sizeof want, "scoring plugin '%s': field 'eps': ", plugins[i]);
        for (size_t j = 0; j < M2D_ARRAY_LEN(bad); j++) {
            m2d_params prm;
            assert_int_equal(m2d_params_parse(bad[j], &prm), 0);
            m2d_layer_view v = fx_view(&s, &fw.layer, 2, DE, &prm);
            assert_int_equal(m2d_score_and_select(m2d_plugin_find(M2D_SCORING, plugins[i]), &v, sc, sel), -1);
            if (!strstr(m2d_errmsg(), want) || strchr(m2d_errmsg(), '\n'))
                fail_msg("%s %s: %s", plugins[i], bad[j], m2d_errmsg());
            m2d_params_free(&prm);
        }
    }
    m2d_params none;
    assert_int_equal(m2d_params_parse("eps=nan", &none), -1);
    assert_int_equal(m2d_params_parse("eps=inf", &none), -1);
    fx_free_weights(&fw);
    m2d_layer_stats_free(&s);
    fx_free_tokens(&t);
}

/* A deliberately broken plugin, registered only in this test binary: the runner must reject it. */
static int negative_score(const m2d_layer_view *v, double *scores) {
    for (int e = 0; e < v->E; e++) scores[e] = e == 1 ? -1 : 1;
    return 0;
}
M2D_PLUGIN(test_negative, .name = "test-negative", .kind = M2D_SCORING, .summary = "test only", .score = negative_score)

static void registry_lookup_and_validation(void **state) {
    (void)state;
    /* every required name is registered */
    const char *names[] = {"sf", "pp", "ps", "cp", "acp", "acp-routed", "do-cp", "do-acp", "reap", "ean", "man",
                           "msan", "seer", "mone", "conmoe", "es-act", "es-mag", "bac", "freq"};
    for (size_t i = 0; i < M2D_ARRAY_LEN(names); i++) assert_non_null(m2d_plugin_find(M2D_SCORING, names[i]));
    const char *groupings[] = {"rr", "wc", "rc", "ab", "oc"}, *scalings[] = {"uniform", "proportional", "avg-cp"};
    for (size_t i = 0; i < 5; i++) assert_non_null(m2d_plugin_find(M2D_GROUPING, groupings[i]));
    for (size_t i = 0; i < 3; i++) assert_non_null(m2d_plugin_find(M2D_SCALING, scalings[i]));
    /* sorted, and do-X resolved on demand for any base (once: same pointer) */
    for (int i = 1; i < m2d_plugin_count(M2D_SCORING); i++)
        assert_true(strcmp(m2d_plugin_at(M2D_SCORING, i - 1)->name, m2d_plugin_at(M2D_SCORING, i)->name) < 0);
    const m2d_plugin *dr = m2d_plugin_find(M2D_SCORING, "do-reap");
    assert_non_null(dr);
    assert_ptr_equal(dr, m2d_plugin_find(M2D_SCORING, "do-reap"));
    assert_ptr_equal(dr->score, m2d_plugin_find(M2D_SCORING, "reap")->score);
    assert_non_null(dr->select);
    assert_null(m2d_plugin_find(M2D_SCORING, "do-do-cp")); /* base has its own selection */
    assert_null(m2d_plugin_find(M2D_SCORING, "do-nope"));
    assert_null(m2d_plugin_find(M2D_GROUPING, "do-rr"));
    assert_null(m2d_plugin_find(M2D_SCALING, "nope"));

    /* runner checks: negative score, K out of range */
    fx_tokens t = fx_make_tokens(E, KT, D, 4, lens, NEVER, 1);
    m2d_layer_stats s;
    fx_stats_from_tokens(&t, &s);
    double sc[E];
    int sel[E];
    m2d_layer_view v = fx_view(&s, NULL, 2, 0, NULL);
    assert_int_equal(m2d_score_and_select(m2d_plugin_find(M2D_SCORING, "test-negative"), &v, sc, sel), -1);
    assert_non_null(strstr(m2d_errmsg(), "scores[1]"));
    v.K = 0;
    assert_int_equal(m2d_score_and_select(m2d_plugin_find(M2D_SCORING, "sf"), &v, sc, sel), -1);
    assert_non_null(strstr(m2d_errmsg(), "'K'"));
    v.K = 1; /* K < k: an MoE student smaller than the router's top-k (convert refuses it for dense) */
    assert_int_equal(m2d_score_and_select(m2d_plugin_find(M2D_SCORING, "sf"), &v, sc, sel), 0);
    v.K = E + 1;
    assert_int_equal(m2d_score_and_select(m2d_plugin_find(M2D_SCORING, "sf"), &v, sc, sel), -1);
    m2d_layer_stats_free(&s);
    fx_free_tokens(&t);

    /* top-K ties -> lower index */
    double tied[] = {1, 3, 3, 0, 3};
    int top[3];
    m2d_select_topk(tied, 5, 3, top);
    assert_int_equal(top[0], 1), assert_int_equal(top[1], 2), assert_int_equal(top[2], 4);

    /* params parsing */
    m2d_params p;
    assert_int_equal(m2d_params_parse("b=0.5,a=2", &p), 0);
    assert_int_equal(p.n, 2);
    assert_true(m2d_param(&p, "b", 9) == 0.5 && m2d_param(&p, "a", 9) == 2 && m2d_param(&p, "c", 9) == 9);
    m2d_params_free(&p);
    assert_int_equal(m2d_params_parse("b", &p), -1);
    assert_int_equal(m2d_params_parse("b=x", &p), -1);
    assert_int_equal(m2d_params_parse("b=1,b=2", &p), -1);
    assert_non_null(strstr(m2d_errmsg(), "'b'"));
    assert_int_equal(m2d_params_parse("", &p), 0);
    assert_int_equal(p.n, 0);
}

/* A test-only family: the registry makes "test-x2-S" from any scaling S except proportional, with
 * no knowledge of the family (the do- family is registered the same way by do_any.c). */
static int test_x2_derive(const m2d_plugin *base, m2d_plugin *out) {
    if (!strcmp(base->name, "proportional")) return -1;
    out->summary = "test only";
    out->scale = base->scale;
    return 0;
}
M2D_PLUGIN_FACTORY(test_x2, .prefix = "test-x2-", .kind = M2D_SCALING, .pattern = "test-x2-<scaling>",
                   .summary = "test only", .derive = test_x2_derive)

static void factories_make_plugins_from_registered_bases(void **state) {
    (void)state;
    const m2d_plugin *p = m2d_plugin_find(M2D_SCALING, "test-x2-uniform");
    assert_non_null(p);
    assert_string_equal(p->name, "test-x2-uniform");
    assert_int_equal(p->kind, M2D_SCALING);
    assert_ptr_equal(p->scale, m2d_plugin_find(M2D_SCALING, "uniform")->scale);
    assert_ptr_equal(p, m2d_plugin_find(M2D_SCALING, "test-x2-uniform"));
    assert_null(m2d_plugin_find(M2D_SCALING, "test-x2-proportional")); /* derive refused the base */
    assert_null(m2d_plugin_find(M2D_SCALING, "test-x2-nope"));         /* no such base */
    assert_null(m2d_plugin_find(M2D_SCORING, "test-x2-sf"));           /* another kind's family */
    /* the registry lists the families by kind (`moe2dense list` prints pattern and summary) */
    int found = 0;
    for (int i = 0; i < m2d_plugin_factory_count(M2D_SCALING); i++)
        found |= !strcmp(m2d_plugin_factory_at(M2D_SCALING, i)->pattern, "test-x2-<scaling>");
    assert_true(found);
    assert_int_equal(m2d_plugin_factory_count(M2D_GROUPING), 0);
    assert_int_equal(m2d_plugin_factory_count(M2D_SCORING), 1);
    assert_string_equal(m2d_plugin_factory_at(M2D_SCORING, 0)->prefix, "do-");
}

/* do-X keeps X's scoring whole (only the selection is D-optimal): the same score, the same pooling of
 * a cross-layer scope (score_scope: remap over do-conmoe normalises the scope as conmoe does) and
 * the same parameters */
static int registered_scoring(const char *name) {
    for (int i = 0; i < m2d_plugin_count(M2D_SCORING); i++)
        if (!strcmp(m2d_plugin_at(M2D_SCORING, i)->name, name)) return 1;
    return 0;
}

static void do_family_keeps_base_scoring(void **state) {
    (void)state;
    for (int i = 0; i < m2d_plugin_count(M2D_SCORING); i++) {
        const m2d_plugin *x = m2d_plugin_at(M2D_SCORING, i);
        char name[64];
        snprintf(name, sizeof name, "do-%s", x->name);
        if (x->select || registered_scoring(name)) continue; /* not the factory's (do-cp, do-acp: the paper's own) */
        const m2d_plugin *d = m2d_plugin_find(M2D_SCORING, name);
        if (!d || d->score != x->score || d->score_scope != x->score_scope || d->params_default != x->params_default)
            fail_msg("%s does not keep %s's scoring", name, x->name);
    }
    assert_non_null(m2d_plugin_find(M2D_SCORING, "do-conmoe")->score_scope);
    assert_non_null(m2d_plugin_find(M2D_SCORING, "do-conmoe-dist")->score_scope);
}

/* do-X plugins are created on first lookup; concurrent first lookups (sweep workers) agree */
static void *lookup_do_msan(void *arg) {
    *(const m2d_plugin **)arg = m2d_plugin_find(M2D_SCORING, "do-msan");
    return NULL;
}
static void derived_lookup_is_thread_safe(void **state) {
    (void)state;
    pthread_t th[8];
    const m2d_plugin *got[8];
    for (int i = 0; i < 8; i++) assert_int_equal(pthread_create(&th[i], NULL, lookup_do_msan, &got[i]), 0);
    for (int i = 0; i < 8; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 8; i++) {
        assert_non_null(got[i]);
        assert_ptr_equal(got[i], got[0]);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(formulas_match_direct_computation),
        cmocka_unit_test(bac_family_grid),
        cmocka_unit_test(named_variants),
        cmocka_unit_test(renormalised_gate_default),
        cmocka_unit_test(reap_reference_vectors),
        cmocka_unit_test(conmoe_against_brute_force),
        cmocka_unit_test(conmoe_eps_must_be_positive),
        cmocka_unit_test(registry_lookup_and_validation),
        cmocka_unit_test(derived_lookup_is_thread_safe),
        cmocka_unit_test(factories_make_plugins_from_registered_bases),
        cmocka_unit_test(do_family_keeps_base_scoring),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
