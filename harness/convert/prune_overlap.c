/* prune_overlap — paper 004's ranking analyses (see prune_overlap.h). */
#include "convert/prune_overlap.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "criteria/crit.h"
#include "criteria/registry.h"
#include "base/util.h"

const double m2d_prune_ratios[M2D_PRUNE_N_RATIOS] = {0.25, 0.5};

int m2d_pruned_set(const double *scores, int E, double ratio, char *pruned) {
    int m = (int)lround(ratio * E), keep = E - m;
    int *top = m2d_malloc((size_t)(keep > 0 ? keep : 1) * sizeof *top);
    m2d_select_topk(scores, E, keep, top);
    memset(pruned, 1, (size_t)E);
    for (int i = 0; i < keep; i++) pruned[top[i]] = 0;
    free(top);
    return m;
}

double m2d_pruned_overlap(const double *const *scores, int n, int E, double ratio) {
    char *all = m2d_malloc((size_t)E), *one = m2d_malloc((size_t)E);
    int m = m2d_pruned_set(scores[0], E, ratio, all);
    for (int i = 1; i < n; i++) {
        m2d_pruned_set(scores[i], E, ratio, one);
        for (int e = 0; e < E; e++) all[e] &= one[e];
    }
    int common = 0;
    for (int e = 0; e < E; e++) common += all[e];
    free(all), free(one);
    return m > 0 ? (double)common / m : 1.0;
}

void m2d_prune_variant_scores(const m2d_layer_stats *s, int b, int a, int c, double *scores) {
    const double *sum = m2d_crit_routed_sum(s, a, c, 1);
    for (int e = 0; e < s->E; e++) scores[e] = b ? m2d_crit_routed_avg(s, sum, e) : sum[e];
}

static int check_sets(const m2d_stats *const *sets, int n) {
    for (int i = 1; i < n; i++)
        if (strcmp(sets[i]->model_hash, sets[0]->model_hash) || sets[i]->n_layers != sets[0]->n_layers ||
            sets[i]->E != sets[0]->E)
            return m2d_err("analyze: statistics %d: field 'model_hash': another model than the first statistics'", i + 1);
    return 0;
}

/* proxy (Eq. 8) vs exact (Eq. 7) damage on layer S */
static void damage_overlap(const m2d_layer_stats *s, double *out) {
    const double *proxy = m2d_crit_routed_sum(s, 1, 1, 1);
    const double *v[2] = {proxy, s->damage};
    for (int r = 0; r < M2D_PRUNE_N_RATIOS; r++) out[r] = m2d_pruned_overlap(v, 2, s->E, m2d_prune_ratios[r]);
}

/* every variant's overlap across the sets on layer L */
static void cross_overlap(const m2d_prune_analysis *p, const m2d_stats *const *sets, int l, double *out) {
    const int E = sets[0]->E;
    double *buf = m2d_malloc((size_t)p->n_sets * E * sizeof *buf);
    const double **v = m2d_malloc((size_t)p->n_sets * sizeof *v);
    for (int x = 0; x < M2D_PRUNE_N_VARIANTS; x++) {
        for (int i = 0; i < p->n_sets; i++) {
            m2d_prune_variant_scores(&sets[i]->layers[l], p->b[x], p->a[x], p->c[x], buf + (size_t)i * E);
            v[i] = buf + (size_t)i * E;
        }
        for (int r = 0; r < M2D_PRUNE_N_RATIOS; r++)
            out[x * M2D_PRUNE_N_RATIOS + r] = m2d_pruned_overlap(v, p->n_sets, E, m2d_prune_ratios[r]);
    }
    free(buf), free(v);
}

int m2d_prune_analyze(const m2d_stats *const *sets, int n_sets, m2d_prune_analysis **out) {
    if (n_sets < 1) return m2d_err("analyze: no statistics");
    if (check_sets(sets, n_sets)) return -1;
    const int L = sets[0]->n_layers;
    m2d_prune_analysis *p = m2d_calloc(1, sizeof *p);
    p->n_layers = L, p->n_sets = n_sets;
    for (int x = 0; x < M2D_PRUNE_N_VARIANTS; x++) p->b[x] = x / 9, p->a[x] = x / 3 % 3, p->c[x] = x % 3;
    p->layer_ids = m2d_malloc((size_t)(L + 1) * sizeof(int));
    p->damage = m2d_calloc((size_t)L * M2D_PRUNE_N_RATIOS + 1, sizeof(double));
    p->cross = n_sets > 1 ? m2d_calloc((size_t)L * M2D_PRUNE_N_VARIANTS * M2D_PRUNE_N_RATIOS, sizeof(double)) : NULL;
    for (int l = 0; l < L; l++) {
        p->layer_ids[l] = sets[0]->layers[l].layer;
        damage_overlap(&sets[0]->layers[l], p->damage + (size_t)l * M2D_PRUNE_N_RATIOS);
        if (p->cross) cross_overlap(p, sets, l, p->cross + (size_t)l * M2D_PRUNE_N_VARIANTS * M2D_PRUNE_N_RATIOS);
    }
    *out = p;
    return 0;
}

void m2d_prune_analysis_free(m2d_prune_analysis *p) {
    if (!p) return;
    free(p->layer_ids), free(p->damage), free(p->cross), free(p);
}
