/* lsa — shortest augmenting paths with row/column potentials (Kuhn–Munkres in the O(n³) form):
 * rows are added one at a time; each addition runs a Dijkstra-like search over reduced costs
 * a[i][j] − u[i] − v[j] ≥ 0 (a = −C, so the minimum is C's maximum) and augments along the way. */
#include "criteria/lsa.h"

#include <math.h>
#include <stdlib.h>

#include "base/util.h"

void m2d_lsa_max(const double *C, int n, int *perm) {
    /* 1-based as in the textbook form: column 0 and row 0 are the virtual start */
    double *u = m2d_calloc((size_t)n + 1, sizeof *u), *v = m2d_calloc((size_t)n + 1, sizeof *v);
    double *minv = m2d_malloc(((size_t)n + 1) * sizeof *minv);
    int *p = m2d_calloc((size_t)n + 1, sizeof *p), *way = m2d_calloc((size_t)n + 1, sizeof *way);
    char *used = m2d_malloc((size_t)n + 1);
    for (int i = 1; i <= n; i++) {
        p[0] = i;
        int j0 = 0;
        for (int j = 0; j <= n; j++) minv[j] = INFINITY, used[j] = 0;
        do {
            used[j0] = 1;
            int i0 = p[j0], j1 = 0;
            double delta = INFINITY;
            for (int j = 1; j <= n; j++) {
                if (used[j]) continue;
                double cur = -C[(size_t)(i0 - 1) * n + (j - 1)] - u[i0] - v[j];
                if (cur < minv[j]) minv[j] = cur, way[j] = j0;
                if (minv[j] < delta) delta = minv[j], j1 = j;
            }
            for (int j = 0; j <= n; j++) {
                if (used[j]) u[p[j]] += delta, v[j] -= delta;
                else minv[j] -= delta;
            }
            j0 = j1;
        } while (p[j0] != 0);
        do { /* augment along the path back to the start */
            int j1 = way[j0];
            p[j0] = p[j1];
            j0 = j1;
        } while (j0);
    }
    for (int j = 1; j <= n; j++) perm[p[j] - 1] = j - 1;
    free(u), free(v), free(minv), free(p), free(way), free(used);
}
