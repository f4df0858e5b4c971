/* M-SMoE (paper 003 App. D; Li et al. 2024 "Merge, then compress"), over the whole model:
 *  1. usage frequency ν_e = n_e / Σ n per layer; the most used expert of every layer gets ν = 1 so
 *     that each layer keeps at least one group; the groups × L experts with the highest ν across
 *     all layers are the dominant experts (ties → lower layer, then lower expert), so layers get
 *     different numbers of groups (the budget is global; MC-SMoE's reference cuts at a frequency
 *     threshold, which gives fewer groups when experts tie exactly at it);
 *  2. every other expert joins the dominant expert of its layer with the most similar router
 *     logits (Eq. 14 as MC-SMoE computes it: cosine of the columns of the router-logit matrix over
 *     all calibration tokens, from the statistics' logit Gram; ties → the more used dominant);
 *  3. with align=1 (default) each member is first permuted onto its dominant expert by weight
 *     matching (Ainsworth et al. 2023): the intermediate neurons' permutation maximising
 *     Σ_a <gate_d[a], gate_j[π a]> + <up_d[a], up_j[π a]> + <down_d[:,a], down_j[:,π a]>
 *     (linear sum assignment), which leaves f_j unchanged;
 *  4. the (aligned) members are merged by the scoring plugin's weights (scoring freq: Eq. 15).
 * All E experts stay addressable: the router keeps every row and the gates of a group add up. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "criteria/crit.h"
#include "criteria/lsa.h"
#include "base/util.h"

typedef struct { double nu; int layer, expert; } ranked;

static int cmp_ranked(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->nu != y->nu) return x->nu > y->nu ? -1 : 1;
    if (x->layer != y->layer) return x->layer - y->layer;
    return x->expert - y->expert;
}

/* dominant[l*E + e] = 1 for the global top groups·L by adjusted usage frequency */
static void choose_dominant(const m2d_model_view *mv, char *dominant) {
    const int L = mv->n_layers, E = mv->layers[0].E;
    ranked *r = m2d_malloc((size_t)L * E * sizeof *r);
    for (int l = 0; l < L; l++) {
        const m2d_layer_stats *s = mv->layers[l].stats;
        double tot = 0;
        int top = 0;
        for (int e = 0; e < E; e++) tot += s->n[e], top = s->n[e] > s->n[top] ? e : top;
        for (int e = 0; e < E; e++) r[l * E + e] = (ranked){e == top ? 1.0 : tot > 0 ? s->n[e] / tot : 0, l, e};
    }
    qsort(r, (size_t)L * E, sizeof *r, cmp_ranked);
    memset(dominant, 0, (size_t)L * E);
    int T = (int)M2D_MIN((int64_t)mv->groups * L, (int64_t)L * E);
    for (int i = 0; i < T; i++) dominant[r[i].layer * E + r[i].expert] = 1;
    free(r);
}

/* cosine distance of router-logit columns i and j (1 when a column is all zero) */
static double logit_distance(const m2d_layer_stats *s, int i, int j) {
    double gi = s->logit_gram[(size_t)i * s->E + i], gj = s->logit_gram[(size_t)j * s->E + j];
    return gi > 0 && gj > 0 ? 1 - s->logit_gram[(size_t)i * s->E + j] / sqrt(gi * gj) : 1;
}

/* perm aligning expert J's intermediate neurons onto expert D's (both of layer W) */
static int *weight_matching(const m2d_layer *w, int dom, int j, int d_e, int d) {
    float *a[3], *b[3], *S = m2d_calloc((size_t)d_e * d_e, sizeof *S);
    const m2d_tensor *const *mats[3] = {w->exp_gate, w->exp_up, w->exp_down};
    for (int m = 0; m < 3; m++) a[m] = m2d_tensor_f32(mats[m][dom]), b[m] = m2d_tensor_f32(mats[m][j]);
    for (int m = 0; m < 2; m++) /* gate, up [d_e, d]: S += A Bᵀ */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, d_e, d_e, d, 1.0f, a[m], d, b[m], d, 1.0f, S, d_e);
    /* down [d, d_e]: S += Aᵀ B */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d_e, d_e, d, 1.0f, a[2], d_e, b[2], d_e, 1.0f, S, d_e);
    double *C = m2d_malloc((size_t)d_e * d_e * sizeof *C);
    for (size_t i = 0; i < (size_t)d_e * d_e; i++) C[i] = S[i];
    int *perm = m2d_malloc((size_t)d_e * sizeof *perm);
    m2d_lsa_max(C, d_e, perm);
    for (int m = 0; m < 3; m++) free(a[m]), free(b[m]);
    free(S), free(C);
    return perm;
}

/* grp[e] for every expert of layer L: its dominant expert's group (groups = dominant experts in
 * usage order, ties -> lower index); returns the number of groups, dom[g] its dominant expert */
static int assign_groups(const m2d_layer_stats *s, const char *is_dom, int *grp, int *dom) {
    const int E = s->E;
    int G = 0;
    for (int e = 0; e < E; e++)
        if (is_dom[e]) dom[G++] = e;
    for (int a = 1; a < G; a++) /* insertion sort by usage, stable: ties keep the lower index first */
        for (int b = a; b > 0 && s->n[dom[b]] > s->n[dom[b - 1]]; b--) {
            int t = dom[b]; dom[b] = dom[b - 1]; dom[b - 1] = t;
        }
    for (int a = 0; a < G; a++) grp[dom[a]] = a;
    for (int e = 0; e < E; e++) {
        if (is_dom[e]) continue;
        int best = 0; /* strict '<': the more used dominant wins ties */
        for (int a = 1; a < G; a++)
            if (logit_distance(s, e, dom[a]) < logit_distance(s, e, dom[best])) best = a;
        grp[e] = best;
    }
    return G;
}

/* group a's sources: its members, weighted by the scoring plugin's scores (uniform if all 0),
 * each but the dominant permuted onto it when ALIGN */
static void group_sources(const m2d_model_view *mv, int l, const int *grp, int a, int dom, int align,
                          m2d_layer_groups *g, int *pos) {
    const m2d_layer_view *v = &mv->layers[l];
    double sum = 0;
    int n = 0;
    for (int e = 0; e < v->E; e++)
        if (grp[e] == a) sum += mv->scores[l][e], n++;
    g->src_start[a] = *pos;
    for (int e = 0; e < v->E; e++) {
        if (grp[e] != a) continue;
        g->src_layer[*pos] = l, g->src_expert[*pos] = e;
        g->src_w[*pos] = sum > 0 ? mv->scores[l][e] / sum : 1.0 / n;
        if (align && e != dom) g->src_perm[*pos] = weight_matching(v->weights, dom, e, v->d_e, v->d);
        (*pos)++;
    }
}

static int group_layer(const m2d_model_view *mv, int l, const char *dominant, int align, m2d_layer_groups *g) {
    const m2d_layer_view *v = &mv->layers[l];
    const int E = v->E;
    int *dom = m2d_malloc((size_t)E * sizeof *dom), *grp = m2d_malloc((size_t)E * sizeof *grp);
    int G = assign_groups(v->stats, dominant + (size_t)l * E, grp, dom), pos = 0;
    g->n_groups = G;
    g->group_of = m2d_malloc((size_t)v->K * sizeof(int));
    for (int i = 0; i < v->K; i++) g->group_of[i] = grp[mv->selected[l][i]];
    g->src_start = m2d_malloc((size_t)(G + 1) * sizeof(int));
    g->src_layer = m2d_malloc((size_t)E * sizeof(int)), g->src_expert = m2d_malloc((size_t)E * sizeof(int));
    g->src_w = m2d_malloc((size_t)E * sizeof(double)), g->src_perm = m2d_calloc((size_t)E, sizeof(int *));
    for (int a = 0; a < G; a++) group_sources(mv, l, grp, a, dom[a], align, g, &pos);
    g->src_start[G] = pos;
    free(dom), free(grp);
    return 0;
}

static int m_smoe_group_model(const m2d_model_view *mv, m2d_layer_groups *out) {
    double align = m2d_param(mv->params, "align", 1);
    if (align != 0 && align != 1) return m2d_err("grouping plugin 'm-smoe': field 'align': %g is not 0 or 1", align);
    for (int l = 0; l < mv->n_layers; l++)
        if (m2d_crit_need_stats(&mv->layers[l], "m-smoe") || (align && m2d_crit_need_weights(&mv->layers[l], "m-smoe")))
            return -1;
    char *dominant = m2d_malloc((size_t)mv->n_layers * mv->layers[0].E);
    choose_dominant(mv, dominant);
    int rc = 0;
    for (int l = 0; l < mv->n_layers && rc == 0; l++) rc = group_layer(mv, l, dominant, (int)align, &out[l]);
    free(dominant);
    return rc;
}

M2D_PLUGIN(m_smoe, .name = "m-smoe", .kind = M2D_GROUPING,
           .summary = "M-SMoE: global dominant experts by usage, router-logit similarity, weight-matched merge (remap)",
           .group_model = m_smoe_group_model, .remap = 1, .params_default = "align=1",
           .display = "M-SMoE")
