/* analyze — selection overlap, effective rank, mutual coherence (see analyze.h). */
#include "convert/analyze.h"

#include <lapacke.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "calib/calib.h"
#include "criteria/registry.h"
#include "base/util.h"

double m2d_effective_rank(const double *A, int n) {
    if (n <= 0) return 0;
    double *a = m2d_malloc((size_t)n * n * sizeof *a), *w = m2d_malloc((size_t)n * sizeof *w);
    memcpy(a, A, (size_t)n * n * sizeof *a);
    int info = LAPACKE_dsyevd(LAPACK_ROW_MAJOR, 'N', 'U', n, a, n, w);
    double er = 0;
    if (info == 0) {
        double sum = 0;
        for (int i = 0; i < n; i++) sum += fabs(w[i]);
        if (sum > 0) {
            double h = 0;
            for (int i = 0; i < n; i++) {
                double p = fabs(w[i]) / sum;
                if (p > 0) h -= p * log(p);
            }
            er = exp(h);
        }
    } else {
        er = NAN;
    }
    free(a);
    free(w);
    return er;
}

double m2d_mutual_coherence(const double *A, int n) {
    double mu = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            if (i == j) continue;
            double den = sqrt(A[(size_t)i * n + i] * A[(size_t)j * n + j]);
            if (den > 0) mu = fmax(mu, fabs(A[(size_t)i * n + j]) / den);
        }
    return mu;
}

double m2d_thm33_gap(double mu, int K) {
    double x = (K - 1) * mu;
    return x < 1 ? K * log((1 + x) / (1 - x)) : NAN;
}

/* Submatrix of G / N on S, optionally weighted by sqrt(I_i I_j). */
static void kernel_sub(const m2d_layer_stats *ls, const int *S, int K, const double *imp, double *out) {
    int E = ls->E;
    double N = ls->N > 0 ? ls->N : 1;
    for (int a = 0; a < K; a++)
        for (int b = 0; b < K; b++) {
            double v = ls->gram[(size_t)S[a] * E + S[b]] / N;
            if (imp) v *= sqrt(imp[S[a]] * imp[S[b]]);
            out[(size_t)a * K + b] = v;
        }
}

void m2d_analysis_free(m2d_analysis *a) {
    if (!a) return;
    for (int i = 0; i < a->n_crit; i++) free(a->names[i]);
    for (int i = 0; i < a->n_skipped; i++) free(a->skipped[i]);
    free(a->names); free(a->skipped); free(a->layer_ids); free(a->selected);
    free(a->erank); free(a->erank_w); free(a->coherence); free(a->overlap); free(a->mu); free(a->thm33_gap);
    free(a);
}

/* Run one criterion on every layer; -1 (with m2d_err) if it fails anywhere. */
static int run_criterion(const m2d_model *m, const m2d_stats *s, const m2d_plugin *p, int K, int *sel, double *scores_all) {
    const m2d_config *c = &m->cfg;
    m2d_params none = {0, NULL, NULL};
    for (int l = 0; l < s->n_layers; l++) {
        const m2d_layer_stats *ls = &s->layers[l];
        m2d_layer_view v = {ls, &m->layers[ls->layer], s->E, s->k, K, s->d, s->d_e, &none};
        if (m2d_score_and_select(p, &v, scores_all + (size_t)l * s->E, sel + (size_t)l * K)) return -1;
    }
    (void)c;
    return 0;
}

int m2d_analyze(const m2d_model *m, const m2d_stats *s, int K, const char *const *names, int n_names,
                m2d_analysis **out) {
    if (m2d_stats_check_model(s, "statistics", m)) return -1;
    if (K < 1 || K > s->E) return m2d_err("analyze: -K %d is outside [1, E = %d]", K, s->E);
    int n_cand = names ? n_names : m2d_plugin_count(M2D_SCORING);
    const m2d_plugin **cand = m2d_malloc((size_t)(n_cand ? n_cand : 1) * sizeof *cand);
    for (int i = 0; i < n_cand; i++) {
        cand[i] = names ? m2d_plugin_find(M2D_SCORING, names[i]) : m2d_plugin_at(M2D_SCORING, i);
        if (!cand[i]) {
            free(cand);
            return m2d_err("analyze: unknown scoring criterion '%s' (see 'moe2dense list')", names[i]);
        }
    }
    int L = s->n_layers, E = s->E;
    m2d_analysis *a = m2d_calloc(1, sizeof *a);
    a->K = K;
    a->n_layers = L;
    a->layer_ids = m2d_malloc((size_t)L * sizeof(int));
    for (int l = 0; l < L; l++) a->layer_ids[l] = s->layers[l].layer;
    a->names = m2d_calloc((size_t)n_cand + 1, sizeof(char *));
    a->skipped = m2d_calloc((size_t)n_cand + 1, sizeof(char *));
    int *sel_all = m2d_malloc((size_t)n_cand * L * K * sizeof(int));
    double *scores = m2d_malloc((size_t)n_cand * L * E * sizeof(double));
    for (int i = 0; i < n_cand; i++) {
        int c = a->n_crit;
        if (run_criterion(m, s, cand[i], K, sel_all + (size_t)c * L * K, scores + (size_t)c * L * E)) {
            a->skipped[a->n_skipped++] = m2d_strfmt("%s: %s", cand[i]->name, m2d_errmsg());
            continue;
        }
        a->names[a->n_crit++] = m2d_strdup(cand[i]->name);
    }
    free(cand);
    int C = a->n_crit;
    a->selected = m2d_malloc((size_t)(L * C * K + 1) * sizeof(int));
    a->erank = m2d_calloc((size_t)(L * C + 1), sizeof(double));
    a->erank_w = m2d_calloc((size_t)(L * C + 1), sizeof(double));
    a->coherence = m2d_calloc((size_t)(L * C + 1), sizeof(double));
    a->overlap = m2d_calloc((size_t)(L * C * C + 1), sizeof(double));
    a->mu = m2d_calloc((size_t)L + 1, sizeof(double));
    a->thm33_gap = m2d_calloc((size_t)L + 1, sizeof(double));
    double *ker = m2d_malloc((size_t)K * K * sizeof(double));
    for (int l = 0; l < L; l++) {
        const m2d_layer_stats *ls = &s->layers[l];
        a->mu[l] = m2d_mutual_coherence(ls->gram, E); /* scale invariant: G or G / N */
        a->thm33_gap[l] = m2d_thm33_gap(a->mu[l], K);
        for (int c = 0; c < C; c++) {
            const int *S = sel_all + ((size_t)c * L + l) * K;
            memcpy(a->selected + ((size_t)l * C + c) * K, S, (size_t)K * sizeof(int));
            kernel_sub(ls, S, K, NULL, ker);
            a->erank[l * C + c] = m2d_effective_rank(ker, K);
            a->coherence[l * C + c] = m2d_mutual_coherence(ker, K);
            kernel_sub(ls, S, K, scores + ((size_t)c * L + l) * E, ker);
            a->erank_w[l * C + c] = m2d_effective_rank(ker, K);
        }
        for (int x = 0; x < C; x++)
            for (int y = 0; y < C; y++) {
                const int *Sx = sel_all + ((size_t)x * L + l) * K, *Sy = sel_all + ((size_t)y * L + l) * K;
                int common = 0;
                for (int i = 0; i < K; i++)
                    for (int j = 0; j < K; j++) common += Sx[i] == Sy[j];
                a->overlap[((size_t)l * C + x) * C + y] = (double)common / K;
            }
    }
    free(ker);
    free(sel_all);
    free(scores);
    *out = a;
    return 0;
}
