/* stats — the reference accumulator for the calibration statistics of SPEC §1.
 *
 * Everything is summed in double precision. The derived per-expert vectors (mu, routed mean and
 * variance, ES-Act/ES-Mag) are always recomputed from raw sums by finalize(), which makes shards
 * mergeable and finalize() idempotent. This path is deliberately simple (scalar loops); the
 * calibration pass has a fast BLAS path that is tested against it. */
#include "calib/stats.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

static double *zeros(size_t n) { return m2d_calloc(n ? n : 1, sizeof(double)); }

void m2d_layer_stats_alloc(m2d_layer_stats *s, int layer, int E, int k, int d) {
    memset(s, 0, sizeof *s);
    s->layer = layer;
    s->E = E;
    s->k = k;
    s->d = d;
    size_t e = (size_t)E, ed = (size_t)E * (size_t)d;
    s->n = zeros(e);
    s->sum_p = zeros(e);
    s->sum_p_sel = zeros(e);
    s->sum_g = zeros(e);
    s->sum_g2 = zeros(e);
    s->sum_f = zeros(e);
    s->sum_f2 = zeros(e);
    s->sum_gf = zeros(e);
    s->sum_g2f2 = zeros(e);
    s->sum_gf2 = zeros(e);
    s->sum_g2f = zeros(e);
    s->gram = zeros(e * e);
    s->mu = zeros(ed);
    s->routed_mean = zeros(ed);
    s->routed_var = zeros(ed);
    s->es_act = zeros(e);
    s->es_mag = zeros(e);
    s->sum_f_all = zeros(ed);
    s->sum_f_routed = zeros(ed);
    s->sum_f_routed_sq = zeros(ed);
    s->es_act_sum = zeros(e);
    s->es_mag_sum = zeros(e);
    s->cur_n = zeros(e);
    s->cur_f = zeros(e);
}

void m2d_layer_stats_free(m2d_layer_stats *s) {
    if (!s) return;
    double **arrays[] = {&s->n, &s->sum_p, &s->sum_p_sel, &s->sum_g, &s->sum_g2, &s->sum_f,
                         &s->sum_f2, &s->sum_gf, &s->sum_g2f2, &s->sum_gf2, &s->sum_g2f, &s->gram, &s->mu, &s->routed_mean,
                         &s->routed_var, &s->es_act, &s->es_mag, &s->sum_f_all, &s->sum_f_routed,
                         &s->sum_f_routed_sq, &s->es_act_sum, &s->es_mag_sum, &s->cur_n, &s->cur_f};
    for (size_t i = 0; i < M2D_ARRAY_LEN(arrays); i++) {
        free(*arrays[i]);
        *arrays[i] = NULL;
    }
}

void m2d_stats_free(m2d_stats *s) {
    if (!s) return;
    for (int l = 0; l < s->n_layers; l++) m2d_layer_stats_free(&s->layers[l]);
    free(s->layers);
    free(s->window_starts);
    free(s->data_path);
    memset(s, 0, sizeof *s);
}

void m2d_layer_stats_add_token(m2d_layer_stats *s, const float *p, const int32_t *topk,
                               const float *g, const float *f) {
    const int E = s->E, d = s->d;
    s->N += 1.0;
    s->cur_len += 1.0;
    for (int e = 0; e < E; e++) {
        const float *fe = f + (size_t)e * d;
        s->sum_p[e] += p[e];
        double *mu = s->sum_f_all + (size_t)e * d;
        for (int j = 0; j < d; j++) mu[j] += fe[j];
        /* Gram: lower triangle computed, mirrored so gram stays exactly symmetric */
        for (int i = 0; i <= e; i++) {
            const float *fi = f + (size_t)i * d;
            double dot = 0;
            for (int j = 0; j < d; j++) dot += (double)fe[j] * fi[j];
            s->gram[(size_t)e * E + i] += dot;
            if (i != e) s->gram[(size_t)i * E + e] += dot;
        }
    }
    for (int r = 0; r < s->k; r++) {
        const float *fe = f + (size_t)topk[r] * d;
        double norm2 = 0;
        for (int j = 0; j < d; j++) norm2 += (double)fe[j] * fe[j];
        m2d_layer_stats_add_routed(s, topk[r], p[topk[r]], g[r], fe, norm2);
    }
}

void m2d_layer_stats_add_routed(m2d_layer_stats *s, int e, double p_e, double g, const float *f, double norm2) {
    double norm = sqrt(norm2);
    s->n[e] += 1.0;
    s->sum_p_sel[e] += p_e;
    s->sum_g[e] += g;
    s->sum_g2[e] += g * g;
    s->sum_f[e] += norm;
    s->sum_f2[e] += norm2;
    s->sum_gf[e] += g * norm;
    s->sum_g2f2[e] += g * g * norm2;
    s->sum_gf2[e] += g * norm2;
    s->sum_g2f[e] += g * g * norm;
    double *rm = s->sum_f_routed + (size_t)e * s->d, *rq = s->sum_f_routed_sq + (size_t)e * s->d;
    for (int j = 0; j < s->d; j++) {
        rm[j] += f[j];
        rq[j] += (double)f[j] * f[j];
    }
    s->cur_n[e] += 1.0;
    s->cur_f[e] += norm;
}

void m2d_layer_stats_end_sample(m2d_layer_stats *s) {
    if (s->cur_len <= 0) return;
    for (int e = 0; e < s->E; e++) {
        s->es_act_sum[e] += s->cur_n[e] / s->cur_len;
        s->es_mag_sum[e] += s->cur_f[e] / s->cur_len;
        s->cur_n[e] = s->cur_f[e] = 0;
    }
    s->cur_len = 0;
    s->n_samples++;
}

static void add_into(double *dst, const double *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

int m2d_layer_stats_merge(m2d_layer_stats *dst, const m2d_layer_stats *src) {
    if (dst->E != src->E || dst->k != src->k || dst->d != src->d)
        return m2d_err("stats merge: layer %d: shape (E=%d, k=%d, d=%d) differs from (E=%d, k=%d, d=%d)",
                       src->layer, src->E, src->k, src->d, dst->E, dst->k, dst->d);
    if (src->cur_len > 0)
        return m2d_err("stats merge: layer %d: source has an open sample (call end_sample first)", src->layer);
    size_t e = (size_t)dst->E, ed = e * (size_t)dst->d;
    dst->N += src->N;
    add_into(dst->n, src->n, e);
    add_into(dst->sum_p, src->sum_p, e);
    add_into(dst->sum_p_sel, src->sum_p_sel, e);
    add_into(dst->sum_g, src->sum_g, e);
    add_into(dst->sum_g2, src->sum_g2, e);
    add_into(dst->sum_f, src->sum_f, e);
    add_into(dst->sum_f2, src->sum_f2, e);
    add_into(dst->sum_gf, src->sum_gf, e);
    add_into(dst->sum_g2f2, src->sum_g2f2, e);
    add_into(dst->sum_gf2, src->sum_gf2, e);
    add_into(dst->sum_g2f, src->sum_g2f, e);
    add_into(dst->gram, src->gram, e * e);
    add_into(dst->sum_f_all, src->sum_f_all, ed);
    add_into(dst->sum_f_routed, src->sum_f_routed, ed);
    add_into(dst->sum_f_routed_sq, src->sum_f_routed_sq, ed);
    add_into(dst->es_act_sum, src->es_act_sum, e);
    add_into(dst->es_mag_sum, src->es_mag_sum, e);
    dst->n_samples += src->n_samples;
    return 0;
}

void m2d_layer_stats_finalize(m2d_layer_stats *s) {
    m2d_layer_stats_end_sample(s);
    const int E = s->E, d = s->d;
    for (int e = 0; e < E; e++) {
        double ne = s->n[e];
        for (int j = 0; j < d; j++) {
            size_t i = (size_t)e * d + j;
            s->mu[i] = s->N > 0 ? s->sum_f_all[i] / s->N : 0;
            double mean = ne > 0 ? s->sum_f_routed[i] / ne : 0;
            double var = ne > 0 ? s->sum_f_routed_sq[i] / ne - mean * mean : 0;
            s->routed_mean[i] = mean;
            s->routed_var[i] = var > 0 ? var : 0; /* E[x²]−E[x]² may round below 0 */
        }
        s->es_act[e] = s->n_samples ? s->es_act_sum[e] / s->n_samples : 0;
        s->es_mag[e] = s->n_samples ? s->es_mag_sum[e] / s->n_samples : 0;
    }
}
