/* remap — ConMoE's prototype reassignment (paper 002 §3.2, §4.2–4.3, App. B–C). The MoE layers
 * are cut into scopes of `scope` consecutive layers (the last may be shorter; 1: layer-local, the
 * paper uses 4 for Qwen3). In each scope G with expert pool E_G:
 *   - the scoring plugin scores the pool as one (score_scope: conmoe's Norm_G(a)·Norm_G(b) over the
 *     pool; usage / REAP / distance-only selection = scorings freq / reap / conmoe-dist, Table 3);
 *   - the prototypes P_G are the top K_G = max(1, round((1 − ρ)|E_G|)) of the pool (ties → lower
 *     layer, then lower expert: "adaptive", layers get different numbers), or with fixed_k=1 the
 *     top max(1, round((1 − ρ)E)) of each layer ("cross-layer fixed-k", Table 2);
 *   - every expert e of the pool is remapped to its nearest prototype m(e) = argmin_p d(e, p)
 *     (d the normalised weight distance, App. B.1; a prototype to itself; ties → lower index).
 * No weights are fused: a group is one prototype (weight 1), possibly from another layer of the
 * scope. The router is unchanged (every row kept), so a prototype's gate is the sum of the gates of
 * the routed experts mapped to it (§4.3). ρ: the ratio asked for (else 1 − groups / E). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "criteria/crit.h"
#include "base/util.h"

typedef struct {
    const m2d_model_view *mv;
    int first, n, E, P;       /* scope: layers [first, first + n), pool size P = n·E */
    double rho, eps;
    char *proto;              /* [P] 1 for a prototype */
    int *map;                 /* [P] pool index of m(e) */
} scope_t;

/* P_G: the top K of SCORES over the pool (fixed: the top k of each layer) */
static void choose_prototypes(scope_t *sc, const double *scores, int fixed) {
    int K = (int)M2D_MAX(1, lround((1 - sc->rho) * sc->P)), k_l = (int)M2D_MAX(1, lround((1 - sc->rho) * sc->E));
    int *sel = m2d_malloc((size_t)sc->P * sizeof *sel);
    memset(sc->proto, 0, (size_t)sc->P);
    if (!fixed) {
        m2d_select_topk(scores, sc->P, M2D_MIN(K, sc->P), sel);
        for (int i = 0; i < M2D_MIN(K, sc->P); i++) sc->proto[sel[i]] = 1;
    } else {
        for (int l = 0; l < sc->n; l++) {
            m2d_select_topk(scores + (size_t)l * sc->E, sc->E, M2D_MIN(k_l, sc->E), sel);
            for (int i = 0; i < M2D_MIN(k_l, sc->E); i++) sc->proto[l * sc->E + sel[i]] = 1;
        }
    }
    free(sel);
}

/* m(e) for every expert of the pool, from the pool's weight distances */
static int assign_nearest(scope_t *sc) {
    const int P = sc->P, E = sc->E;
    const m2d_layer **w = m2d_malloc((size_t)P * sizeof *w);
    int *idx = m2d_malloc((size_t)P * sizeof *idx);
    for (int i = 0; i < P; i++) w[i] = sc->mv->layers[sc->first + i / E].weights, idx[i] = i % E;
    double *d = m2d_malloc((size_t)P * P * sizeof *d);
    int rc = m2d_crit_weight_distance(w, idx, P, sc->eps, d);
    for (int e = 0; e < P && rc == 0; e++) {
        int best = -1;
        for (int p = 0; p < P && !sc->proto[e]; p++)
            if (sc->proto[p] && (best < 0 || d[(size_t)e * P + p] < d[(size_t)e * P + best])) best = p;
        sc->map[e] = sc->proto[e] ? e : best;
    }
    free(w), free(idx), free(d);
    return rc;
}

/* layer L of the scope: a group per prototype its experts map to (numbered in selected order) */
static void layer_groups(const scope_t *sc, int l, m2d_layer_groups *g) {
    const m2d_layer_view *v = &sc->mv->layers[sc->first + l];
    int *gid = m2d_malloc((size_t)sc->P * sizeof *gid), G = 0;
    for (int p = 0; p < sc->P; p++) gid[p] = -1;
    g->group_of = m2d_malloc((size_t)v->K * sizeof(int));
    int *proto_of = m2d_malloc((size_t)v->K * sizeof *proto_of);
    for (int i = 0; i < v->K; i++) {
        int p = sc->map[l * sc->E + sc->mv->selected[sc->first + l][i]];
        if (gid[p] < 0) proto_of[G] = p, gid[p] = G++;
        g->group_of[i] = gid[p];
    }
    g->n_groups = G;
    g->src_start = m2d_malloc((size_t)(G + 1) * sizeof(int));
    g->src_layer = m2d_malloc((size_t)G * sizeof(int)), g->src_expert = m2d_malloc((size_t)G * sizeof(int));
    g->src_w = m2d_malloc((size_t)G * sizeof(double)), g->src_perm = m2d_calloc((size_t)G, sizeof(int *));
    for (int a = 0; a <= G; a++) g->src_start[a] = a;
    for (int a = 0; a < G; a++) {
        g->src_layer[a] = sc->first + proto_of[a] / sc->E;
        g->src_expert[a] = proto_of[a] % sc->E;
        g->src_w[a] = 1;
    }
    free(gid), free(proto_of);
}

static int remap_scope(scope_t *sc, int fixed, m2d_layer_groups *out) {
    double *scores = m2d_malloc((size_t)sc->P * sizeof *scores);
    sc->proto = m2d_malloc((size_t)sc->P);
    sc->map = m2d_malloc((size_t)sc->P * sizeof *sc->map);
    int rc = m2d_score_scope(sc->mv->scoring, sc->mv->layers + sc->first, sc->n, scores);
    if (rc == 0) {
        choose_prototypes(sc, scores, fixed);
        rc = assign_nearest(sc);
    }
    for (int l = 0; l < sc->n && rc == 0; l++) layer_groups(sc, l, &out[sc->first + l]);
    free(scores), free(sc->proto), free(sc->map);
    return rc;
}

/* layers per scope, clamped to the model's (a scope of L or more layers is the whole model), so
 * any integral value >= 1 is exact int arithmetic */
static int scope_param(const m2d_model_view *mv, int *scope) {
    double s = m2d_param(mv->params, "scope", 1);
    if (s < 1 || s != floor(s))
        return m2d_err("grouping plugin 'remap': field 'scope': %g is not a number of layers >= 1", s);
    *scope = s >= mv->n_layers ? mv->n_layers : (int)s;
    return 0;
}

static int remap_group_model(const m2d_model_view *mv, m2d_layer_groups *out) {
    double fixed = m2d_param(mv->params, "fixed_k", 0), eps;
    int scope = 0;
    if (scope_param(mv, &scope) != 0) return -1;
    if (fixed != 0 && fixed != 1) return m2d_err("grouping plugin 'remap': field 'fixed_k': %g is not 0 or 1", fixed);
    if (m2d_crit_eps_param(mv->params, M2D_GROUPING, "remap", &eps) != 0) return -1;
    const int E = mv->layers[0].E;
    double rho = mv->ratio > 0 ? mv->ratio : 1 - (double)mv->groups / E;
    for (int l = 0; l < mv->n_layers; l++)
        if (m2d_crit_need_weights(&mv->layers[l], "remap")) return -1;
    int rc = 0;
    for (int first = 0; first < mv->n_layers && rc == 0; first += scope) {
        int n = M2D_MIN(mv->n_layers - first, scope);
        scope_t sc = {mv, first, n, E, n * E, rho, eps, NULL, NULL};
        rc = remap_scope(&sc, (int)fixed, out);
    }
    return rc;
}

M2D_PLUGIN(remap, .name = "remap", .kind = M2D_GROUPING,
           .summary = "ConMoE: top prototypes of a scope of layers, every expert remapped to its nearest (remap)",
           .group_model = remap_group_model, .remap = 1, .params_default = "scope=1,fixed_k=0,eps=1e-8",
           .display = "ConMoE remap")
