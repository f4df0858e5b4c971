/* grouping and scaling plugins: average linkage vs a brute-force implementation, each grouping's
 * defining property on synthetic weights / statistics, canonical ids, K = k, and the scalings.
 * Exact comparisons here (ids, groups, selections, scores of two plugins) are exact on every CPU:
 * plain scalar C on fixed inputs (no BLAS, no oneDNN), whose IEEE operations (-std=c11: no FMA
 * contraction) give the same bits on every x86-64 CPU, and decisions taken on those bits. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "criteria/cluster.h"
#include "criteria/crit.h"
#include "criteria/lsa.h"
#include "crit_fixture.h"
#include "criteria/registry.h"

/* Brute force average linkage: explicit member lists, every linkage recomputed as the mean of
 * member-pair distances at every step; ties -> lexicographically first (lowest members). */
static void brute_average_linkage(const double *dist, int n, int k, int *label) {
    int *cl = m2d_malloc((size_t)n * sizeof *cl); /* cluster id (= lowest member) of each point */
    for (int i = 0; i < n; i++) cl[i] = i;
    for (int clusters = n; clusters > k; clusters--) {
        int ba = -1, bb = -1;
        double best = INFINITY;
        for (int a = 0; a < n; a++)
            for (int b = a + 1; b < n; b++) {
                if (cl[a] != a || cl[b] != b) continue; /* a, b must name clusters */
                double s = 0;
                int cnt = 0;
                for (int i = 0; i < n; i++)
                    for (int j = 0; j < n; j++)
                        if (cl[i] == a && cl[j] == b) s += dist[i * n + j], cnt++;
                if (s / cnt < best) best = s / cnt, ba = a, bb = b;
            }
        for (int i = 0; i < n; i++)
            if (cl[i] == bb) cl[i] = ba;
    }
    int map[64];
    for (int i = 0; i < n; i++) map[i] = -1;
    int next = 0;
    for (int i = 0; i < n; i++) {
        if (map[cl[i]] < 0) map[cl[i]] = next++;
        label[i] = map[cl[i]];
    }
    free(cl);
}

static void average_linkage_matches_brute_force(void **state) {
    (void)state;
    uint64_t st = 5;
    for (int trial = 0; trial < 60; trial++) {
        int n = 2 + trial % 11, dim = 1 + trial % 4;
        double pts[64 * 4], dist[64 * 64];
        for (int i = 0; i < n * dim; i++) pts[i] = tu_rand_normal(&st);
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++) {
                double s = 0;
                for (int c = 0; c < dim; c++) s += (pts[i * dim + c] - pts[j * dim + c]) * (pts[i * dim + c] - pts[j * dim + c]);
                dist[i * n + j] = sqrt(s);
            }
        for (int k = 1; k <= n; k++) {
            int got[64], want[64];
            assert_int_equal(m2d_cluster_average_linkage(dist, n, k, got), 0);
            brute_average_linkage(dist, n, k, want);
            assert_memory_equal(got, want, (size_t)n * sizeof(int));
        }
    }
    /* all distances equal: ties merge the lowest names first → {0,1,2}, {3}, {4} at k = 3 */
    double flat[25];
    for (int i = 0; i < 25; i++) flat[i] = i % 6 ? 1 : 0;
    int lab[5];
    m2d_cluster_average_linkage(flat, 5, 3, lab);
    int want[5] = {0, 0, 0, 1, 2};
    assert_memory_equal(lab, want, sizeof want);
    assert_int_equal(m2d_cluster_average_linkage(flat, 5, 6, lab), -1);
}

/* ---- a synthetic layer with planted structure ----
 * 8 experts, d = 64, d_e = 100 (each flattened expert has 19,200 weights: several SYRK blocks).
 * Weights, router rows and outputs of experts {0,2,5} share one direction, {1,4,7} another,
 * {3,6} a third, plus small noise. */
enum { PE = 8, PD = 64, PDE = 100 };
static const int family[PE] = {0, 1, 0, 2, 1, 0, 2, 1};

typedef struct {
    m2d_layer_stats s;
    fx_weights w;
    float *router, *wm[3];
} planted;

static void make_planted(planted *pl, m2d_dtype dt) {
    uint64_t st = 77;
    size_t per = (size_t)PDE * PD;
    float *dir[3][4];
    for (int f = 0; f < 3; f++)
        for (int m = 0; m < 4; m++) {
            size_t n = m == 0 ? PD : per;
            dir[f][m] = m2d_malloc(n * sizeof(float));
            for (size_t i = 0; i < n; i++) dir[f][m][i] = (float)tu_rand_normal(&st);
        }
    pl->router = m2d_malloc((size_t)PE * PD * sizeof(float));
    for (int m = 0; m < 3; m++) pl->wm[m] = m2d_malloc(PE * per * sizeof(float));
    for (int e = 0; e < PE; e++) {
        for (int i = 0; i < PD; i++) pl->router[e * PD + i] = dir[family[e]][0][i] + 0.2f * (float)tu_rand_normal(&st);
        for (int m = 0; m < 3; m++)
            for (size_t i = 0; i < per; i++)
                pl->wm[m][e * per + i] = (1.0f + 0.1f * e) * dir[family[e]][m + 1][i] + 0.2f * (float)tu_rand_normal(&st);
    }
    fx_make_weights(&pl->w, dt, PE, PD, PDE, pl->router, pl->wm[0], pl->wm[1], pl->wm[2]);
    /* statistics: outputs f_e(t) = (family direction of the token) + noise, via add_token */
    m2d_layer_stats_alloc(&pl->s, 0, PE, 2, 4);
    float p[PE], g[2] = {0.5f, 0.5f}, f[PE * 4];
    for (int t = 0; t < 30; t++) {
        double c[3] = {tu_rand_normal(&st), tu_rand_normal(&st), tu_rand_normal(&st)};
        for (int e = 0; e < PE; e++) {
            p[e] = 1.0f / PE;
            for (int j = 0; j < 4; j++)
                f[e * 4 + j] = (float)(c[family[e]] * (j == family[e] ? 1.0 : 0.1) + 0.05 * tu_rand_normal(&st));
        }
        int32_t topk[2] = {t % PE, (t + 3) % PE};
        m2d_layer_stats_add_token(&pl->s, p, topk, g, f);
    }
    m2d_layer_stats_finalize(&pl->s);
    for (int f2 = 0; f2 < 3; f2++)
        for (int m = 0; m < 4; m++) free(dir[f2][m]);
}

static void free_planted(planted *pl) {
    m2d_layer_stats_free(&pl->s);
    fx_free_weights(&pl->w);
    free(pl->router);
    for (int m = 0; m < 3; m++) free(pl->wm[m]);
}

static void run_group(const char *name, const m2d_layer_view *v, const int *sel, const double *scores, int *groups) {
    const m2d_plugin *p = m2d_plugin_find(M2D_GROUPING, name);
    if (!p) fail_msg("no grouping '%s'", name);
    if (m2d_group_run(p, v, sel, scores, groups) != 0) fail_msg("%s: %s", name, m2d_errmsg());
}

/* groups are the planted families (canonical numbering by first appearance in `selected`) */
static void assert_families(const int *sel, const int *groups, int K) {
    for (int i = 0; i < K; i++)
        for (int j = 0; j < K; j++)
            if ((family[sel[i]] == family[sel[j]]) != (groups[i] == groups[j]))
                fail_msg("experts %d and %d: families %d/%d, groups %d/%d", sel[i], sel[j], family[sel[i]],
                         family[sel[j]], groups[i], groups[j]);
}

static void clusterings_recover_planted_families(void **state) {
    (void)state;
    const m2d_dtype dts[2] = {M2D_F32, M2D_BF16};
    for (int di = 0; di < 2; di++) {
        planted pl;
        make_planted(&pl, dts[di]);
        int sel[PE] = {5, 1, 3, 0, 7, 6, 2, 4}; /* an arbitrary selection order */
        double scores[PE] = {1, 2, 3, 4, 5, 6, 7, 8};
        m2d_layer_view v = fx_view(&pl.s, &pl.w.layer, PE, PDE, NULL);
        v.d = PD;
        v.k = 3;
        int groups[PE];
        run_group("wc", &v, sel, scores, groups);
        assert_families(sel, groups, PE);
        assert_int_equal(groups[0], 0), assert_int_equal(groups[1], 1), assert_int_equal(groups[2], 2); /* canonical */
        run_group("rc", &v, sel, scores, groups);
        assert_families(sel, groups, PE);
        run_group("oc", &v, sel, scores, groups);
        assert_families(sel, groups, PE);
        free_planted(&pl);
    }
}

/* WC's GEMM cosine equals a scalar double loop over the flattened [W_gate; W_up; W_down]
 * (fp32 SYRK blocks of 8192 summed in double: 1e-5 relative on O(1) cosines is ample). */
static void weight_gram_matches_scalar_loop(void **state) {
    (void)state;
    planted pl;
    make_planted(&pl, M2D_F32);
    int idx[3] = {6, 0, 3};
    double G[9], dist[9];
    m2d_layer_view v = fx_view(&pl.s, &pl.w.layer, 3, PDE, NULL);
    v.d = PD;
    assert_int_equal(m2d_crit_expert_gram(&v, idx, 3, M2D_W_ALL, G), 0);
    m2d_crit_gram_to_cosine_distance(G, 3, dist);
    size_t per = (size_t)PDE * PD;
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            double dot = 0, na = 0, nb = 0;
            for (int m = 0; m < 3; m++)
                for (size_t i = 0; i < per; i++) {
                    double x = pl.wm[m][idx[a] * per + i], y = pl.wm[m][idx[b] * per + i];
                    dot += x * y, na += x * x, nb += y * y;
                }
            /* error scales with the norms, not with the (possibly near-zero) dot itself */
            if (fabs(G[a * 3 + b] - dot) > 1e-5 * sqrt(na * nb)) fail_msg("gram[%d,%d]: %g vs %g", a, b, G[a * 3 + b], dot);
            fx_close(dist[a * 3 + b], a == b ? 0 : 1 - dot / sqrt(na * nb), 1e-5, "cosine distance", a * 3 + b);
        }
    free_planted(&pl);
}

static void oc_zero_norm_rule(void **state) {
    (void)state;
    /* 4 experts; expert 2 never produces output: similarity 0 with everyone (distance 1) */
    m2d_layer_stats s;
    m2d_layer_stats_alloc(&s, 0, 4, 1, 2);
    float p[4] = {0.25f, 0.25f, 0.25f, 0.25f}, g = 1;
    const float f1[8] = {1, 0, 1, 0.1f, 0, 0, -1, 0}, f2[8] = {0, 1, 0, 1, 0, 0, 0, -1};
    int32_t r = 0;
    m2d_layer_stats_add_token(&s, p, &r, &g, f1);
    m2d_layer_stats_add_token(&s, p, &r, &g, f2);
    m2d_layer_stats_finalize(&s);
    /* by hand: G00 = 2, G11 = 2.01, G01 = 2, G03 = −2, G13 = −2, G22 = 0:
     * d01 = 1 − 2/sqrt(4.02), d03 = 2, d13 = 1 + 2/sqrt(4.02), d(2, ·) = 1 (zero norm) */
    double d01 = 1 - 2 / sqrt(4.02), d13 = 1 + 2 / sqrt(4.02);
    /* average linkage to k=2: merge 0-1 (d01 ≈ 0.0025) first; then {0,1}–{2} and {2}–{3} tie at
     * exactly 1 and the pair named (0,2) < (2,3) wins → {0,1,2}, {3} */
    assert_true(d01 < 0.01 && d13 > 1.99);
    int sel[4] = {0, 1, 2, 3}, groups[4];
    double scores[4] = {1, 1, 1, 1};
    m2d_layer_view v = fx_view(&s, NULL, 4, 0, NULL);
    v.k = 2;
    run_group("oc", &v, sel, scores, groups);
    int want[4] = {0, 0, 0, 1};
    assert_memory_equal(groups, want, sizeof want);
    m2d_layer_stats_free(&s);
}

static void rr_rank_order(void **state) {
    (void)state;
    m2d_layer_stats s;
    m2d_layer_stats_alloc(&s, 0, 7, 2, 1);
    double scores[7] = {0.5, 0.9, 0.1, 0.9, 0.7, 0.3, 0.0};
    int sel[6] = {4, 0, 1, 3, 5, 2}, groups[6];
    m2d_layer_view v = fx_view(&s, NULL, 6, 0, NULL);
    v.k = 3;
    run_group("rr", &v, sel, scores, groups);
    /* ranks: e1 (0.9, lower index wins the tie) 0, e3 1, e4 2, e0 3, e5 4, e2 5 → raw groups r mod 3:
     * e1 0, e3 1, e4 2, e0 0, e5 1, e2 2; in selected order [e4,e0,e1,e3,e5,e2] = [2,0,0,1,1,2],
     * canonical (first appearance) = [0,1,1,2,2,0] */
    int want[6] = {0, 1, 1, 2, 2, 0};
    assert_memory_equal(groups, want, sizeof want);
    m2d_layer_stats_free(&s);
}

/* AB's two tie rules, exact by construction (router rows of small integers; equal cosines computed
 * by the same operations): anchors tied in score go lower expert index first (e1 and e4 both 5: e1
 * ranks first), and an expert as similar to two anchors joins the higher-ranked one (e0 = e1 + e4
 * and the all-zero e2: with e1, not e4). e3 and e5 lean to e4 and e1. */
static void ab_ties(void **state) {
    (void)state;
    enum { E = 6, D = 4, DE = 2 };
    float router[E * D] = {1, 1, 0, 0, /* e0 */ 1, 0, 0, 0, /* e1 */ 0, 0, 0, 0, /* e2 */
                           1, 8, 0, 0, /* e3 */ 0, 1, 0, 0, /* e4 */ 8, 1, 0, 0 /* e5 */};
    float zeros[E * DE * D] = {0};
    fx_weights w;
    fx_make_weights(&w, M2D_F32, E, D, DE, router, zeros, zeros, zeros);
    m2d_layer_stats s;
    m2d_layer_stats_alloc(&s, 0, E, 2, D);
    m2d_layer_view v = fx_view(&s, &w.layer, E, DE, NULL);
    v.k = 2;
    int sel[E] = {0, 1, 2, 3, 4, 5}, groups[E];
    double scores[E] = {1, 5, 3, 1, 5, 1};
    run_group("ab", &v, sel, scores, groups);
    int want[E] = {0, 0, 0, 1, 1, 0}; /* {e0, e1, e2, e5} with anchor e1, {e3, e4} with e4 */
    assert_memory_equal(groups, want, sizeof want);
    m2d_layer_stats_free(&s);
    fx_free_weights(&w);
}

static void ab_anchors_and_router_cosine(void **state) {
    (void)state;
    planted pl;
    make_planted(&pl, M2D_BF16);
    int sel[6] = {3, 0, 1, 2, 6, 7};
    double scores[PE] = {5, 1, 2, 9, 0, 0, 4, 3}; /* top-3 of the selected: e3 (9), e0 (5), e6 (4) */
    m2d_layer_view v = fx_view(&pl.s, &pl.w.layer, 6, PDE, NULL);
    v.d = PD;
    v.k = 3;
    int groups[6];
    run_group("ab", &v, sel, scores, groups);
    /* anchors sit in distinct groups */
    assert_int_not_equal(groups[0], groups[1]);
    assert_int_not_equal(groups[0], groups[4]);
    assert_int_not_equal(groups[1], groups[4]);
    /* every other expert is with the anchor of highest router cosine (brute force in double) */
    const int anchors[3] = {0, 1, 4}; /* positions of e3, e0, e6 */
    float *rows = m2d_crit_router_rows(&v, sel, 6);
    for (int i = 0; i < 6; i++) {
        if (i == 0 || i == 1 || i == 4) continue;
        int best = -1;
        double bs = -2;
        for (int a = 0; a < 3; a++) {
            double dot = 0, n1 = 0, n2 = 0;
            for (int j = 0; j < PD; j++) {
                double x = rows[i * PD + j], y = rows[anchors[a] * PD + j];
                dot += x * y, n1 += x * x, n2 += y * y;
            }
            if (dot / sqrt(n1 * n2) > bs) bs = dot / sqrt(n1 * n2), best = anchors[a];
        }
        assert_int_equal(groups[i], groups[best]);
    }
    free(rows);
    /* anchors = top-k: a family-0 anchor (e0) attracts e2 (family 0); e7 (family 1) has no
     * family-1 anchor and goes elsewhere, but never into a new group */
    assert_int_equal(groups[3], groups[1]);
    free_planted(&pl);
}

static void every_grouping_is_identity_at_K_equals_k(void **state) {
    (void)state;
    planted pl;
    make_planted(&pl, M2D_F32);
    int sel[4] = {7, 2, 5, 0};
    double scores[PE] = {1, 2, 3, 4, 5, 6, 7, 8};
    m2d_layer_view v = fx_view(&pl.s, &pl.w.layer, 4, PDE, NULL);
    v.d = PD;
    v.k = 4;
    const int identity[4] = {0, 1, 2, 3};
    for (int i = 0; i < m2d_plugin_count(M2D_GROUPING); i++) {
        int groups[4];
        const char *name = m2d_plugin_at(M2D_GROUPING, i)->name;
        if (!strncmp(name, "test-", 5)) continue; /* this binary's deliberately broken plugin */
        if (m2d_plugin_at(M2D_GROUPING, i)->group_model) continue; /* whole-model: test_related.c */
        run_group(name, &v, sel, scores, groups);
        assert_memory_equal(groups, identity, sizeof identity);
    }
    free_planted(&pl);
}

/* ---------------- related-work groupings (paper 003 App. D) ---------------- */

/* HC-SMoE (Eq. 16): average linkage on D_ij = 1 − cos(A_i, A_j), A = μ (mean output over all
 * tokens), every expert of the layer; against the brute-force linkage on directly computed cosines */
static void hc_smoe_is_average_linkage_on_mean_outputs(void **state) {
    (void)state;
    planted pl;
    make_planted(&pl, M2D_F32);
    int sel[PE] = {5, 1, 3, 0, 7, 6, 2, 4};
    double scores[PE] = {1, 2, 3, 4, 5, 6, 7, 8}, dist[PE * PE];
    for (int i = 0; i < PE; i++)
        for (int j = 0; j < PE; j++) {
            const double *a = pl.s.mu + (size_t)sel[i] * pl.s.d, *b = pl.s.mu + (size_t)sel[j] * pl.s.d;
            double dot = 0, na = 0, nb = 0;
            for (int c = 0; c < pl.s.d; c++) dot += a[c] * b[c], na += a[c] * a[c], nb += b[c] * b[c];
            dist[i * PE + j] = i == j ? 0 : 1 - dot / sqrt(na * nb);
        }
    m2d_layer_view v = fx_view(&pl.s, &pl.w.layer, PE, PDE, NULL);
    v.d = PD;
    for (int k = 1; k <= PE; k++) {
        int got[PE], want[PE];
        v.k = k;
        run_group("hc-smoe", &v, sel, scores, got);
        brute_average_linkage(dist, PE, k, want);
        assert_memory_equal(got, want, sizeof want);
    }
    v.k = 3; /* the planted families are the clusters of the mean outputs too */
    int groups[PE];
    run_group("hc-smoe", &v, sel, scores, groups);
    assert_families(sel, groups, PE);
    free_planted(&pl);
}

/* LSA: the maximising permutation's total equals the best of all n! permutations */
static double perm_total(const double *C, int n, const int *perm) {
    double t = 0;
    for (int a = 0; a < n; a++) t += C[a * n + perm[a]];
    return t;
}
static double brute_best(const double *C, int n, int *perm, int depth, int used) {
    if (depth == n) return perm_total(C, n, perm);
    double best = -INFINITY;
    for (int b = 0; b < n; b++)
        if (!(used & (1 << b))) {
            perm[depth] = b;
            best = fmax(best, brute_best(C, n, perm, depth + 1, used | (1 << b)));
        }
    return best;
}
static void lsa_matches_brute_force(void **state) {
    (void)state;
    uint64_t st = 9;
    for (int trial = 0; trial < 40; trial++) {
        int n = 1 + trial % 7, perm[8], tmp[8];
        double C[64];
        for (int i = 0; i < n * n; i++) C[i] = trial % 3 ? tu_rand_normal(&st) : (double)(tu_rand_u64(&st) % 3); /* ties */
        m2d_lsa_max(C, n, perm);
        int seen = 0;
        for (int a = 0; a < n; a++) assert_true(perm[a] >= 0 && perm[a] < n && !(seen & (1 << perm[a]))), seen |= 1 << perm[a];
        fx_close(perm_total(C, n, perm), brute_best(C, n, tmp, 0, 0), 1e-12, "lsa total", trial);
    }
}

/* M-SMoE on a hand-made two-layer model (E = 4, d = 6, d_e = 5):
 *  usage n: layer 0 {40, 10, 20, 30}, layer 1 {70, 10, 10, 10} → ν with each layer's most used set
 *  to 1: L0 {1, .1, .2, .3}, L1 {1, 1/7, 1/7, 1/7}; groups = 2 per layer on average → the global
 *  top 4 are (0,0), (1,0), (0,3), (0,2): layer 0 keeps 3 groups, layer 1 one.
 *  Router logits: z_1 = z_0 + small noise, so expert 1 of layer 0 joins dominant 0 (Eq. 14).
 *  Weights: expert 1 of layer 0 is expert 0 with its intermediate neurons permuted by π, so weight
 *  matching must find π⁻¹ and the aligned merge reproduces expert 0 exactly. */
enum { ME = 4, MD = 6, MDE = 5 };
static void m_smoe_planted(void **state) {
    (void)state;
    uint64_t st = 31;
    const double counts[2][ME] = {{40, 10, 20, 30}, {70, 10, 10, 10}};
    const int pi[MDE] = {3, 0, 4, 1, 2};
    m2d_layer_stats s[2];
    fx_weights w[2];
    float router[ME * MD], wm[3][ME * MDE * MD];
    double zs[50][ME];
    for (int l = 0; l < 2; l++) {
        m2d_layer_stats_alloc(&s[l], l, ME, 2, MD);
        for (int e = 0; e < ME; e++) s[l].n[e] = counts[l][e];
        for (int t = 0; t < 50; t++) {
            for (int e = 0; e < ME; e++) zs[t][e] = tu_rand_normal(&st);
            zs[t][1] = zs[t][0] + 0.05 * tu_rand_normal(&st);
            m2d_layer_stats_add_logits(&s[l], zs[t]);
        }
        for (int i = 0; i < ME * MD; i++) router[i] = (float)tu_rand_normal(&st);
        for (int m = 0; m < 3; m++)
            for (int i = 0; i < ME * MDE * MD; i++) wm[m][i] = (float)tu_rand_normal(&st);
        if (l == 0) /* expert 1 = expert 0 permuted: gate/up row a = row π[a]; down column a = column π[a] */
            for (int a = 0; a < MDE; a++)
                for (int c = 0; c < MD; c++) {
                    for (int m = 0; m < 2; m++) wm[m][MDE * MD + a * MD + c] = wm[m][pi[a] * MD + c];
                    wm[2][MDE * MD + c * MDE + a] = wm[2][c * MDE + pi[a]];
                }
        fx_make_weights(&w[l], M2D_F32, ME, MD, MDE, router, wm[0], wm[1], wm[2]);
    }
    m2d_layer_view views[2] = {fx_view(&s[0], &w[0].layer, ME, MDE, NULL), fx_view(&s[1], &w[1].layer, ME, MDE, NULL)};
    views[0].d = views[1].d = MD;
    int ident[ME] = {0, 1, 2, 3};
    const int *sel[2] = {ident, ident};
    double sc[ME] = {1, 3, 1, 1};
    const double *scores[2] = {sc, sc};
    m2d_model_view mv = {2, views, sel, scores, m2d_plugin_find(M2D_SCORING, "freq"), 2, 0,
                         &(m2d_params){0, NULL, NULL}};
    m2d_layer_groups out[2] = {0};
    assert_int_equal(m2d_group_model_run(m2d_plugin_find(M2D_GROUPING, "m-smoe"), &mv, out), 0);
    assert_int_equal(out[0].n_groups, 3);
    assert_int_equal(out[1].n_groups, 1);
    int want0[ME] = {0, 0, 1, 2}; /* canonical: {0,1}, {2}, {3} */
    assert_memory_equal(out[0].group_of, want0, sizeof want0);
    /* group 0 of layer 0: expert 0 (weight 1/4, unpermuted) and expert 1 (3/4, permuted by π⁻¹) */
    const m2d_layer_groups *g = &out[0];
    assert_int_equal(g->src_start[1] - g->src_start[0], 2);
    for (int x = g->src_start[0]; x < g->src_start[1]; x++) {
        int e = g->src_expert[x];
        assert_int_equal(g->src_layer[x], 0);
        fx_close(g->src_w[x], e == 0 ? 0.25 : 0.75, 1e-15, "m-smoe merge weight", e);
        if (e == 0) assert_null(g->src_perm[x]);
        else
            for (int a = 0; a < MDE; a++) assert_int_equal(pi[g->src_perm[x][a]], a);
    }
    /* align=0: no permutations */
    m2d_layer_groups_free(out, 2);
    const char *keys[] = {"align"};
    double zero[] = {0};
    mv.params = &(m2d_params){1, keys, zero};
    assert_int_equal(m2d_group_model_run(m2d_plugin_find(M2D_GROUPING, "m-smoe"), &mv, out), 0);
    for (int x = 0; x < out[0].src_start[out[0].n_groups]; x++) assert_null(out[0].src_perm[x]);
    m2d_layer_groups_free(out, 2);
    for (int l = 0; l < 2; l++) m2d_layer_stats_free(&s[l]), fx_free_weights(&w[l]);
}

/* remap's parameters. Usage falls layer by layer (layer 0 most used), so with ρ = 0.5 the top half
 * of a 3-layer pool is layer 0 and half of layer 1, and layer 2's experts all map to another layer's
 * prototype. scope = 3e9 (more than int holds) is the whole model, as scope = L; eps must be > 0. */
enum { RL = 3, RE = 4, RD = 3, RDE = 2 };
typedef struct {
    m2d_layer_stats s[RL];
    fx_weights w[RL];
    m2d_layer_view views[RL];
    const int *sel[RL];
    const double *scores[RL];
} remap_fixture;

static void make_remap_fixture(remap_fixture *r) {
    static const int ident[RE] = {0, 1, 2, 3};
    static const double sc[RE] = {1, 1, 1, 1};
    uint64_t st = 9;
    float router[RE * RD], wm[3][RE * RDE * RD];
    for (int l = 0; l < RL; l++) {
        m2d_layer_stats_alloc(&r->s[l], l, RE, 2, RD);
        for (int e = 0; e < RE; e++) r->s[l].n[e] = 100 - 30 * l - e;
        for (int i = 0; i < RE * RD; i++) router[i] = (float)tu_rand_normal(&st);
        for (int m = 0; m < 3; m++)
            for (int i = 0; i < RE * RDE * RD; i++) wm[m][i] = (float)tu_rand_normal(&st);
        fx_make_weights(&r->w[l], M2D_F32, RE, RD, RDE, router, wm[0], wm[1], wm[2]);
        r->views[l] = fx_view(&r->s[l], &r->w[l].layer, RE, RDE, NULL);
        r->views[l].d = RD;
        r->sel[l] = ident, r->scores[l] = sc;
    }
}

static int run_remap(remap_fixture *r, const char *params, m2d_layer_groups *out) {
    m2d_params prm;
    if (m2d_params_parse(params, &prm) != 0) fail_msg("%s", m2d_errmsg());
    m2d_model_view mv = {RL, r->views, r->sel, r->scores, m2d_plugin_find(M2D_SCORING, "freq"), RE / 2, 0.5, &prm};
    memset(out, 0, RL * sizeof *out);
    int rc = m2d_group_model_run(m2d_plugin_find(M2D_GROUPING, "remap"), &mv, out);
    m2d_params_free(&prm);
    return rc;
}

static void remap_scope_and_eps(void **state) {
    (void)state;
    remap_fixture r;
    make_remap_fixture(&r);
    m2d_layer_groups all[RL], huge[RL];
    assert_int_equal(run_remap(&r, "scope=3", all), 0);
    for (int g = 0; g < all[2].n_groups; g++) assert_true(all[2].src_layer[all[2].src_start[g]] != 2);
    assert_int_equal(run_remap(&r, "scope=3e9", huge), 0);
    for (int l = 0; l < RL; l++) {
        const int G = all[l].n_groups;
        assert_int_equal(huge[l].n_groups, G);
        assert_memory_equal(huge[l].group_of, all[l].group_of, RE * sizeof(int));
        assert_memory_equal(huge[l].src_layer, all[l].src_layer, (size_t)G * sizeof(int));
        assert_memory_equal(huge[l].src_expert, all[l].src_expert, (size_t)G * sizeof(int));
    }
    m2d_layer_groups_free(all, RL);
    m2d_layer_groups_free(huge, RL);
    const char *bad[] = {"eps=-1", "eps=0", "scope=3,eps=-1e-300"};
    for (size_t i = 0; i < M2D_ARRAY_LEN(bad); i++) {
        m2d_layer_groups out[RL];
        assert_int_equal(run_remap(&r, bad[i], out), -1);
        if (!strstr(m2d_errmsg(), "grouping plugin 'remap': field 'eps': ") || strchr(m2d_errmsg(), '\n'))
            fail_msg("%s: %s", bad[i], m2d_errmsg());
    }
    for (int l = 0; l < RL; l++) m2d_layer_stats_free(&r.s[l]), fx_free_weights(&r.w[l]);
}

static void canonical_ids(void **state) {
    (void)state;
    int a[6] = {2, 2, 0, 1, 0, 1}, b[6] = {1, 1, 2, 0, 2, 0}, want[6] = {0, 0, 1, 2, 1, 2};
    m2d_groups_canonicalize(6, a);
    m2d_groups_canonicalize(6, b);
    assert_memory_equal(a, want, sizeof want);
    assert_memory_equal(b, want, sizeof want);
}

/* a grouping that leaves a group empty must be rejected by the runner */
static int bad_group(const m2d_layer_view *v, const int *selected, const double *scores, int *group_of) {
    (void)selected, (void)scores;
    for (int i = 0; i < v->K; i++) group_of[i] = 0;
    return 0;
}
M2D_PLUGIN(test_bad_group, .name = "test-bad-group", .kind = M2D_GROUPING, .summary = "test only", .group = bad_group)

static void scalings(void **state) {
    (void)state;
    /* stats with known CP: e0 routed twice with p 0.5, 0.7 (CP 0.6); e1 once with p 0.2; e2 never */
    m2d_layer_stats s;
    m2d_layer_stats_alloc(&s, 0, 4, 1, 1);
    const float pa[4] = {0.5f, 0.2f, 0.1f, 0.2f}, pb[4] = {0.7f, 0.1f, 0.1f, 0.1f}, pc[4] = {0.3f, 0.2f, 0.1f, 0.4f};
    const float f[4] = {1, 1, 1, 1}, g = 1;
    int32_t r0 = 0, r3 = 3;
    m2d_layer_stats_add_token(&s, pa, &r0, &g, f);
    m2d_layer_stats_add_token(&s, pb, &r0, &g, f);
    m2d_layer_stats_add_token(&s, pc, &r3, &g, f);
    m2d_layer_stats_finalize(&s);
    int sel[3] = {0, 2, 3}, groups[3] = {0, 1, 0};
    double scores[4] = {3, 9, 1, 4}, alpha[2];
    m2d_layer_view v = fx_view(&s, NULL, 3, 0, NULL);
    v.k = 2;
    const m2d_plugin *u = m2d_plugin_find(M2D_SCALING, "uniform"), *pr = m2d_plugin_find(M2D_SCALING, "proportional"),
                     *ac = m2d_plugin_find(M2D_SCALING, "avg-cp");
    assert_int_equal(m2d_scale_run(u, &v, sel, scores, groups, alpha), 0);
    assert_true(alpha[0] == 0.5 && alpha[1] == 0.5);
    assert_int_equal(m2d_scale_run(pr, &v, sel, scores, groups, alpha), 0);
    fx_close(alpha[0], 7.0 / 8, 1e-15, "proportional", 0); /* (3+4)/(3+1+4) */
    fx_close(alpha[1], 1.0 / 8, 1e-15, "proportional", 1);
    double zero[4] = {0};
    assert_int_equal(m2d_scale_run(pr, &v, sel, zero, groups, alpha), 0);
    fx_close(alpha[0], 2.0 / 3, 1e-15, "proportional zero", 0); /* falls back to |g|/K */
    fx_close(alpha[1], 1.0 / 3, 1e-15, "proportional zero", 1);
    assert_int_equal(m2d_scale_run(ac, &v, sel, scores, groups, alpha), 0);
    /* group 0 = {e0: CP 0.6, e3: CP 0.4}, group 1 = {e2: never routed, CP 0}; p went through fp32 */
    fx_close(alpha[0], 0.5, 1e-7, "avg-cp", 0);
    assert_true(alpha[1] == 0);
    /* the runner rejects a grouping with an empty group */
    assert_int_equal(m2d_group_run(m2d_plugin_find(M2D_GROUPING, "test-bad-group"), &v, sel, scores, groups), -1);
    assert_non_null(strstr(m2d_errmsg(), "group 1 is empty"));
    /* weight-based groupings without weights: a clear error, no crash */
    assert_int_equal(m2d_group_run(m2d_plugin_find(M2D_GROUPING, "wc"), &v, sel, scores, groups), -1);
    assert_non_null(strstr(m2d_errmsg(), "wc"));
    m2d_layer_stats_free(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(average_linkage_matches_brute_force),
        cmocka_unit_test(clusterings_recover_planted_families),
        cmocka_unit_test(weight_gram_matches_scalar_loop),
        cmocka_unit_test(oc_zero_norm_rule),
        cmocka_unit_test(rr_rank_order),
        cmocka_unit_test(ab_anchors_and_router_cosine),
        cmocka_unit_test(ab_ties),
        cmocka_unit_test(every_grouping_is_identity_at_K_equals_k),
        cmocka_unit_test(hc_smoe_is_average_linkage_on_mean_outputs),
        cmocka_unit_test(lsa_matches_brute_force),
        cmocka_unit_test(m_smoe_planted),
        cmocka_unit_test(remap_scope_and_eps),
        cmocka_unit_test(canonical_ids),
        cmocka_unit_test(scalings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
