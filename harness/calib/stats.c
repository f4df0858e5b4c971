/* stats — the reference accumulator for the calibration statistics of SPEC §1.
 *
 * Everything is summed in double precision. The derived per-expert vectors (mu, routed mean and
 * variance, ES-Act/ES-Mag) are always recomputed from raw sums by finalize(), which makes shards
 * mergeable and finalize() idempotent. This path is deliberately simple (scalar loops); the
 * calibration pass has a fast BLAS path that is tested against it. */
#include "calib/stats.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

static double *zeros(size_t n) { return m2d_calloc(n ? n : 1, sizeof(double)); }

/* The per-layer arrays by shape: [E] vectors that are raw sums (merged by adding), [E] derived,
 * [E*E] and [E*d]; one table so that alloc, free and merge cannot forget one. */
typedef enum { SUM_E, DERIVED_E, SUM_EE, SUM_ED, DERIVED_ED, OPEN_E } array_kind;
typedef struct { size_t off; array_kind kind; } array_slot;
#define SLOT(field, kind) {offsetof(m2d_layer_stats, field), kind}
static const array_slot SLOTS[] = {
    SLOT(n, SUM_E), SLOT(sum_p, SUM_E), SLOT(sum_p_sel, SUM_E), SLOT(sum_g, SUM_E), SLOT(sum_g2, SUM_E),
    SLOT(sum_f, SUM_E), SLOT(sum_f2, SUM_E), SLOT(sum_gf, SUM_E), SLOT(sum_g2f2, SUM_E), SLOT(sum_gf2, SUM_E),
    SLOT(sum_g2f, SUM_E), SLOT(sum_r, SUM_E), SLOT(sum_r2, SUM_E), SLOT(sum_rf, SUM_E), SLOT(sum_rf2, SUM_E),
    SLOT(sum_r2f, SUM_E), SLOT(sum_r2f2, SUM_E), SLOT(damage, SUM_E), SLOT(es_act_sum, SUM_E),
    SLOT(es_mag_sum, SUM_E), SLOT(es_magg_sum, SUM_E), SLOT(gram, SUM_EE), SLOT(logit_gram, SUM_EE),
    SLOT(sum_f_all, SUM_ED), SLOT(sum_f_routed, SUM_ED), SLOT(sum_f_routed_sq, SUM_ED), SLOT(mu, DERIVED_ED),
    SLOT(routed_mean, DERIVED_ED), SLOT(routed_var, DERIVED_ED), SLOT(es_act, DERIVED_E), SLOT(es_mag, DERIVED_E),
    SLOT(es_mag_gated, DERIVED_E), SLOT(cur_n, OPEN_E), SLOT(cur_f, OPEN_E), SLOT(cur_gf, OPEN_E),
};

static double **slot_ptr(m2d_layer_stats *s, int i) { return (double **)((char *)s + SLOTS[i].off); }

static size_t slot_len(const m2d_layer_stats *s, int i) {
    size_t e = (size_t)s->E;
    switch (SLOTS[i].kind) {
    case SUM_EE: return e * e;
    case SUM_ED: case DERIVED_ED: return e * (size_t)s->d;
    default: return e;
    }
}

void m2d_layer_stats_alloc(m2d_layer_stats *s, int layer, int E, int k, int d) {
    memset(s, 0, sizeof *s);
    s->layer = layer;
    s->E = E;
    s->k = k;
    s->d = d;
    for (int i = 0; i < (int)M2D_ARRAY_LEN(SLOTS); i++) *slot_ptr(s, i) = zeros(slot_len(s, i));
}

void m2d_layer_stats_free(m2d_layer_stats *s) {
    if (!s) return;
    for (int i = 0; i < (int)M2D_ARRAY_LEN(SLOTS); i++) {
        free(*slot_ptr(s, i));
        *slot_ptr(s, i) = NULL;
    }
}

void m2d_stats_free(m2d_stats *s) {
    if (!s) return;
    for (int l = 0; l < s->n_layers; l++) m2d_layer_stats_free(&s->layers[l]);
    free(s->layers);
    free(s->window_starts);
    free(s->window_lens);
    free(s->data_path);
    memset(s, 0, sizeof *s);
}

double m2d_stats_window_tokens(const m2d_stats *s) {
    if (!s->window_lens) return (double)s->n_windows * s->seq_len;
    double n = 0;
    for (int w = 0; w < s->n_windows; w++) n += s->window_lens[w];
    return n;
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
    double psel = 0;
    for (int r = 0; r < s->k; r++) psel += p[topk[r]];
    for (int r = 0; r < s->k; r++) {
        const float *fe = f + (size_t)topk[r] * d;
        double norm2 = 0;
        for (int j = 0; j < d; j++) norm2 += (double)fe[j] * fe[j];
        double rg = psel > 0 ? p[topk[r]] / psel : 0;
        m2d_layer_stats_add_routed(s, topk[r], p[topk[r]], g[r], rg, fe, norm2);
    }
    m2d_layer_stats_add_damage(s, p, topk, f, (size_t)d);
}

void m2d_layer_stats_add_routed(m2d_layer_stats *s, int e, double p_e, double g, double r, const float *f,
                                double norm2) {
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
    s->sum_r[e] += r;
    s->sum_r2[e] += r * r;
    s->sum_rf[e] += r * norm;
    s->sum_rf2[e] += r * norm2;
    s->sum_r2f[e] += r * r * norm;
    s->sum_r2f2[e] += r * r * norm2;
    double *rm = s->sum_f_routed + (size_t)e * s->d, *rq = s->sum_f_routed_sq + (size_t)e * s->d;
    for (int j = 0; j < s->d; j++) {
        rm[j] += f[j];
        rq[j] += (double)f[j] * f[j];
    }
    s->cur_n[e] += 1.0;
    s->cur_f[e] += norm;
    s->cur_gf[e] += fabs(g) * norm;
}

int m2d_layer_stats_next_expert(const float *p, const int32_t *topk, int k, int E) {
    int best = -1;
    for (int e = 0; e < E; e++) {
        int routed = 0;
        for (int r = 0; r < k; r++) routed |= topk[r] == e;
        if (!routed && (best < 0 || p[e] > p[best])) best = e;
    }
    return best;
}

/* damage[topk[j]] += ‖y − y^(−j)‖ for each j; f_{topk[r]} at BASE + (BY_RANK ? r : topk[r]) * STRIDE,
 * the replacement NX's at BASE + (BY_RANK ? k : NX) * STRIDE */
static void add_damage(m2d_layer_stats *s, const float *p, const int32_t *topk, int nx, const float *base,
                       size_t stride, int by_rank) {
    const int k = s->k, d = s->d;
    double psel = 0;
    for (int r = 0; r < k; r++) psel += p[topk[r]];
    if (psel <= 0) return;
    const float *fx = nx >= 0 ? base + (size_t)(by_rank ? k : nx) * stride : NULL;
    for (int j = 0; j < k; j++) {
        /* y − y^(−j) = Σ_{i∈S} (r_i − r'_i) f_i − r'_x f_x with r'_i = 0 for i = j */
        double den = psel - p[topk[j]] + (nx >= 0 ? p[nx] : 0), sq = 0;
        for (int c = 0; c < d; c++) {
            double delta = 0;
            for (int r = 0; r < k; r++) {
                double rr = p[topk[r]] / psel, rn = r == j || den <= 0 ? 0 : p[topk[r]] / den;
                delta += (rr - rn) * base[(size_t)(by_rank ? r : topk[r]) * stride + c];
            }
            if (fx && den > 0) delta -= p[nx] / den * fx[c];
            sq += delta * delta;
        }
        s->damage[topk[j]] += sqrt(sq);
    }
}

void m2d_layer_stats_add_damage(m2d_layer_stats *s, const float *p, const int32_t *topk, const float *F,
                                size_t stride) {
    add_damage(s, p, topk, m2d_layer_stats_next_expert(p, topk, s->k, s->E), F, stride, 0);
}

void m2d_layer_stats_add_damage_rows(m2d_layer_stats *s, const float *p, const int32_t *topk, int nx, const float *rows,
                                     size_t stride) {
    add_damage(s, p, topk, nx, rows, stride, 1);
}

void m2d_layer_stats_add_logits(m2d_layer_stats *s, const double *z) {
    const int E = s->E;
    for (int i = 0; i < E; i++)
        for (int j = 0; j <= i; j++) {
            s->logit_gram[(size_t)i * E + j] += z[i] * z[j];
            if (i != j) s->logit_gram[(size_t)j * E + i] += z[i] * z[j];
        }
}

void m2d_layer_stats_end_sample(m2d_layer_stats *s) {
    if (s->cur_len <= 0) return;
    for (int e = 0; e < s->E; e++) {
        s->es_act_sum[e] += s->cur_n[e] / s->cur_len;
        s->es_mag_sum[e] += s->cur_f[e] / s->cur_len;
        s->es_magg_sum[e] += s->cur_gf[e] / s->cur_len;
        s->cur_n[e] = s->cur_f[e] = s->cur_gf[e] = 0;
    }
    s->cur_len = 0;
    s->n_samples++;
}

int m2d_layer_stats_merge(m2d_layer_stats *dst, const m2d_layer_stats *src) {
    if (dst->E != src->E || dst->k != src->k || dst->d != src->d)
        return m2d_err("stats merge: layer %d: shape (E=%d, k=%d, d=%d) differs from (E=%d, k=%d, d=%d)",
                       src->layer, src->E, src->k, src->d, dst->E, dst->k, dst->d);
    if (src->cur_len > 0)
        return m2d_err("stats merge: layer %d: source has an open sample (call end_sample first)", src->layer);
    dst->N += src->N;
    for (int i = 0; i < (int)M2D_ARRAY_LEN(SLOTS); i++) {
        array_kind kd = SLOTS[i].kind;
        if (kd != SUM_E && kd != SUM_EE && kd != SUM_ED) continue;
        double *a = *slot_ptr(dst, i);
        const double *b = *slot_ptr((m2d_layer_stats *)src, i);
        for (size_t j = 0, n = slot_len(dst, i); j < n; j++) a[j] += b[j];
    }
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
        s->es_mag_gated[e] = s->n_samples ? s->es_magg_sum[e] / s->n_samples : 0;
    }
}
