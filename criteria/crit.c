/* crit — helpers shared by the criteria plugins. */
#include "criteria/crit.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

double m2d_crit_routed_avg(const m2d_layer_stats *s, const double *sum, int e) {
    return s->n[e] > 0 ? sum[e] / s->n[e] : 0.0;
}

double m2d_crit_cp(const m2d_layer_stats *s, int e) { return m2d_crit_routed_avg(s, s->sum_p_sel, e); }

const double *m2d_crit_routed_sum(const m2d_layer_stats *s, int a, int c, int renorm) {
    const double *native[3][3] = {{s->n, s->sum_f, s->sum_f2},
                                  {s->sum_g, s->sum_gf, s->sum_gf2},
                                  {s->sum_g2, s->sum_g2f, s->sum_g2f2}};
    const double *renormed[3][3] = {{s->n, s->sum_f, s->sum_f2},
                                    {s->sum_r, s->sum_rf, s->sum_rf2},
                                    {s->sum_r2, s->sum_r2f, s->sum_r2f2}};
    if (a < 0 || a > 2 || c < 0 || c > 2) return NULL;
    return renorm ? renormed[a][c] : native[a][c];
}

int m2d_crit_renorm_param(const m2d_layer_view *v, const char *plugin, int *renorm) {
    double r = m2d_param(v->params, "renorm", 1);
    if (r != 0 && r != 1)
        return m2d_err("scoring plugin '%s': layer %d: field 'renorm': %g is not 0 (native gate) or 1 (renormalised "
                       "over the top-k, paper 004 Eq. 1)", plugin, v->stats ? v->stats->layer : -1, r);
    *renorm = (int)r;
    return 0;
}

int m2d_crit_eps_param(const m2d_params *params, m2d_plugin_kind kind, const char *plugin, double *eps) {
    double x = m2d_param(params, "eps", 1e-8);
    if (!(x > 0) || !isfinite(x))
        return m2d_err("%s plugin '%s': field 'eps': %g is not a finite number > 0 (ε keeps ConMoE's distances and "
                       "norms of equal or zero experts from dividing by 0)", m2d_plugin_kind_name(kind), plugin, x);
    *eps = x;
    return 0;
}

static int layer_of(const m2d_layer_view *v) { return v->stats ? v->stats->layer : -1; }

int m2d_crit_need_stats(const m2d_layer_view *v, const char *plugin) {
    if (!v->stats) return m2d_err("plugin '%s': layer view has no calibration statistics", plugin);
    if (v->stats->E != v->E)
        return m2d_err("plugin '%s': layer %d: field 'E': statistics have %d experts, view has %d", plugin,
                       v->stats->layer, v->stats->E, v->E);
    return 0;
}

int m2d_crit_need_weights(const m2d_layer_view *v, const char *plugin) {
    const m2d_layer *w = v->weights;
    if (!w || !w->router || !w->exp_gate || !w->exp_up || !w->exp_down)
        return m2d_err("plugin '%s': layer %d: needs the teacher's router and expert weights", plugin, layer_of(v));
    return 0;
}

float *m2d_crit_router_rows(const m2d_layer_view *v, const int *idx, int n) {
    const m2d_tensor *r = v->weights->router;
    if (r->ndim != 2 || r->shape[0] != v->E || r->shape[1] != v->d) {
        m2d_err("layer %d: field '%s': router shape is not [E=%d, d=%d]", layer_of(v), r->name ? r->name : "router",
                v->E, v->d);
        return NULL;
    }
    float *X = m2d_malloc((size_t)n * (size_t)v->d * sizeof *X);
    for (int i = 0; i < n; i++)
        m2d_to_f32(r->dtype, r->data, (int64_t)idx[i] * v->d, v->d, X + (size_t)i * v->d);
    return X;
}

/* Block length for the blocked Gram: each SYRK accumulates at most BLOCK products in fp32
 * (relative error ~ sqrt(BLOCK)·2^-24 ≈ 5e-6 typical, BLOCK·2^-24 ≈ 5e-4 worst case) and the
 * blocks are summed in double. Memory: n·BLOCK floats. */
#define BLOCK 8192

static void syrk_block_into(const float *X, int n, int len, float *C, double *G) {
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasNoTrans, n, len, 1.0f, X, len, 0.0f, C, n);
    for (int i = 0; i < n; i++)
        for (int j = i; j < n; j++) G[(size_t)i * n + j] += C[(size_t)i * n + j];
}

static void mirror_upper(double *G, int n) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++) G[(size_t)i * n + j] = G[(size_t)j * n + i];
}

void m2d_crit_rows_gram(const float *X, int n, int64_t len, double *G) {
    memset(G, 0, (size_t)n * n * sizeof *G);
    float *blk = m2d_malloc((size_t)n * BLOCK * sizeof *blk), *C = m2d_malloc((size_t)n * n * sizeof *C);
    for (int64_t off = 0; off < len; off += BLOCK) {
        int b = (int)M2D_MIN((int64_t)BLOCK, len - off);
        for (int i = 0; i < n; i++) memcpy(blk + (size_t)i * b, X + (size_t)i * len + off, (size_t)b * sizeof *blk);
        syrk_block_into(blk, n, b, C, G);
    }
    mirror_upper(G, n);
    free(blk);
    free(C);
}

int m2d_crit_expert_gram_pool(const m2d_layer *const *w, const int *idx, int n, int which, double *G) {
    memset(G, 0, (size_t)n * n * sizeof *G);
    static const char *mat_name[3] = {"gate", "up", "down"};
    float *blk = m2d_malloc((size_t)n * BLOCK * sizeof *blk), *C = m2d_malloc((size_t)n * n * sizeof *C);
    int rc = 0;
    for (int m = 0; m < 3 && rc == 0; m++) {
        if (!(which & (1 << m))) continue;
#define MAT(i) (m == 0 ? w[i]->exp_gate[idx[i]] : m == 1 ? w[i]->exp_up[idx[i]] : w[i]->exp_down[idx[i]])
        int64_t len = m2d_tensor_numel(MAT(0));
        for (int i = 1; i < n && rc == 0; i++)
            if (m2d_tensor_numel(MAT(i)) != len)
                rc = m2d_err("field 'experts.%d.%s': size %lld differs from expert %d's %lld", idx[i], mat_name[m],
                             (long long)m2d_tensor_numel(MAT(i)), idx[0], (long long)len);
        for (int64_t off = 0; off < len && rc == 0; off += BLOCK) {
            int b = (int)M2D_MIN((int64_t)BLOCK, len - off);
            for (int i = 0; i < n; i++) {
                const m2d_tensor *t = MAT(i);
                m2d_to_f32(t->dtype, t->data, off, b, blk + (size_t)i * b);
            }
            syrk_block_into(blk, n, b, C, G);
        }
#undef MAT
    }
    mirror_upper(G, n);
    free(blk);
    free(C);
    return rc;
}

int m2d_crit_expert_gram(const m2d_layer_view *v, const int *idx, int n, int which, double *G) {
    const m2d_layer **w = m2d_malloc((size_t)(n > 0 ? n : 1) * sizeof *w);
    for (int i = 0; i < n; i++) w[i] = v->weights;
    int rc = m2d_crit_expert_gram_pool(w, idx, n, which, G);
    free(w);
    if (rc) {
        char pre[32];
        snprintf(pre, sizeof pre, "layer %d", layer_of(v));
        m2d_err_prefix(pre);
    }
    return rc;
}

int m2d_crit_weight_distance(const m2d_layer *const *w, const int *idx, int n, double eps, double *dist) {
    double *G = m2d_malloc((size_t)n * n * sizeof *G);
    memset(dist, 0, (size_t)n * n * sizeof *dist);
    int rc = 0;
    for (int m = 0; m < 3 && rc == 0; m++) {
        rc = m2d_crit_expert_gram_pool(w, idx, n, 1 << m, G);
        for (int i = 0; i < n && rc == 0; i++)
            for (int j = 0; j < n; j++) {
                double gii = G[(size_t)i * n + i], gjj = G[(size_t)j * n + j];
                double diff = sqrt(fmax(0.0, gii + gjj - 2 * G[(size_t)i * n + j]));
                dist[(size_t)i * n + j] += i == j ? 0 : 2 * diff / (sqrt(gii) + sqrt(gjj) + 2 * eps) / 3;
            }
    }
    free(G);
    return rc;
}

void m2d_crit_gram_to_cosine_distance(const double *G, int n, double *dist) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            double gi = G[(size_t)i * n + i], gj = G[(size_t)j * n + j];
            double sim = gi > 0 && gj > 0 ? G[(size_t)i * n + j] / sqrt(gi * gj) : 0.0;
            dist[(size_t)i * n + j] = i == j ? 0.0 : 1.0 - sim;
        }
}

int m2d_crit_pool_nearest(const m2d_layer_view *views, int n, const char *plugin, double eps, double *b) {
    const int E = views[0].E, P = n * E;
    for (int i = 0; i < n; i++)
        if (m2d_crit_need_weights(&views[i], plugin) != 0) return -1;
    const m2d_layer **w = m2d_malloc((size_t)P * sizeof *w);
    int *idx = m2d_malloc((size_t)P * sizeof *idx);
    for (int i = 0; i < P; i++) w[i] = views[i / E].weights, idx[i] = i % E;
    double *d = m2d_malloc((size_t)P * P * sizeof *d);
    int rc = m2d_crit_weight_distance(w, idx, P, eps, d);
    for (int e = 0; e < P && rc == 0; e++) {
        b[e] = P == 1 ? 0 : INFINITY;
        for (int o = 0; o < P; o++)
            if (o != e) b[e] = fmin(b[e], d[(size_t)e * P + o]);
    }
    free(w), free(idx), free(d);
    return rc;
}
