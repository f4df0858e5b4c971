/* report_usage — plot data of paper 001's Gini / Lorenz and Pearson analyses (see report_usage.h). */
#include "sweep/report_usage.h"

#include <math.h>
#include <stdlib.h>

#include "base/util.h"
#include "sweep/report_table.h"

/* the distinct layers (>= 0) of A's rows of METRIC, in order of first appearance -> out; count */
static int layers_of(const m2d_an_csv *a, m2d_an_metric metric, int *out) {
    int n = 0;
    for (int r = 0; r < a->n; r++) {
        if (a->rows[r].metric != metric || a->rows[r].layer < 0) continue;
        int seen = 0;
        for (int k = 0; k < n && !seen; k++) seen = out[k] == a->rows[r].layer;
        if (!seen) out[n++] = a->rows[r].layer;
    }
    return n;
}

/* the value of METRIC in LAYER (for lorenz and pearson: at I, J); NaN when absent */
static double value_at(const m2d_an_csv *a, m2d_an_metric metric, int layer, int i, int j) {
    double v = NAN;
    for (int r = 0; r < a->n; r++) {
        const m2d_an_row *x = &a->rows[r];
        if (x->metric == metric && x->layer == layer && x->i == i && x->j == j) v = x->value;
    }
    return v;
}

/* the largest index I of METRIC's rows in LAYER (the layer's expert count for lorenz) */
static int max_index(const m2d_an_csv *a, m2d_an_metric metric, int layer) {
    int m = -1;
    for (int r = 0; r < a->n; r++)
        if (a->rows[r].metric == metric && a->rows[r].layer == layer && a->rows[r].i > m) m = a->rows[r].i;
    return m;
}

static int write_lorenz(const m2d_an_csv *a, int *layers, const char *dir) {
    int n = layers_of(a, M2D_AN_LORENZ, layers), first = n ? layers[0] : 0, last = first;
    m2d_report_file lp, tp;
    FILE *f = m2d_report_file_open(&lp, dir, "lorenz.dat"), *t = m2d_report_file_open(&tp, dir, "lorenz.txt");
    double gini = 0;
    int n_gini = 0;
    fprintf(f, "# x = i/E (fraction of experts, least used first), y = share of activations, layer\n");
    for (int k = 0; k < n; k++) {
        int L = layers[k], E = max_index(a, M2D_AN_LORENZ, L);
        first = L < first ? L : first, last = L > last ? L : last;
        if (k) fprintf(f, "\n\n"); /* a new gnuplot block */
        for (int i = 0; i <= E; i++) {
            double y = value_at(a, M2D_AN_LORENZ, L, i, -1);
            if (isfinite(y) && E > 0) fprintf(f, "%.6g %.6g %d\n", (double)i / E, y, L);
        }
        double g = value_at(a, M2D_AN_GINI, L, -1, -1);
        if (isfinite(g)) gini += g, n_gini++;
    }
    fprintf(t, "%d %.6g %d %d\n", n, n_gini ? gini / n_gini : 0.0, first, last);
    int rc = m2d_report_file_close(&lp);
    return m2d_report_file_close(&tp) || rc ? -1 : 0;
}

static int write_pearson(const m2d_an_csv *a, int *layers, const char *dir) {
    int n = layers_of(a, M2D_AN_PEARSON_MEAN, layers);
    m2d_report_file pp, tp;
    FILE *f = m2d_report_file_open(&pp, dir, "pearson.dat"), *t = m2d_report_file_open(&tp, dir, "pearson.txt");
    fprintf(f, "# layer mean max (off-diagonal Pearson correlation of the experts' down projections)\n");
    for (int k = 0; k < n; k++)
        fprintf(f, "%d %.6g %.6g\n", layers[k], value_at(a, M2D_AN_PEARSON_MEAN, layers[k], -1, -1),
                value_at(a, M2D_AN_PEARSON_MAX, layers[k], -1, -1));
    int n_matrix = layers_of(a, M2D_AN_PEARSON, layers), L = n_matrix ? layers[0] : -1;
    fprintf(t, "%d %d %d\n", n, n_matrix > 0, n_matrix ? L : 0);
    int rc = m2d_report_file_close(&pp);
    if (m2d_report_file_close(&tp)) rc = -1;
    if (!n_matrix || rc) return rc;
    int E = max_index(a, M2D_AN_PEARSON, L) + 1;
    double *C = m2d_malloc((size_t)E * E * sizeof *C);
    for (int i = 0; i < E * E; i++) C[i] = NAN;
    for (int r = 0; r < a->n; r++) {
        const m2d_an_row *x = &a->rows[r];
        if (x->metric == M2D_AN_PEARSON && x->layer == L && x->j < E) C[(size_t)x->i * E + x->j] = x->value;
    }
    m2d_report_file mp;
    FILE *m = m2d_report_file_open(&mp, dir, "pearson_matrix.dat");
    for (int i = 0; i < E; i++) {
        for (int j = 0; j < E; j++) fprintf(m, j ? " %.6g" : "%.6g", C[(size_t)i * E + j]);
        fputc('\n', m);
    }
    free(C);
    return m2d_report_file_close(&mp);
}

int m2d_report_usage_plot_data(const m2d_an_csv *a, const char *dir) {
    int *layers = m2d_malloc((size_t)(a->n + 1) * sizeof *layers);
    int rc = write_lorenz(a, layers, dir);
    if (rc == 0) rc = write_pearson(a, layers, dir);
    free(layers);
    return rc;
}
