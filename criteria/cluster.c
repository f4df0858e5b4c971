/* cluster — average linkage by exact pairwise-distance sums between clusters (see cluster.h).
 * O(n³) time, O(n²) memory: n is at most the number of experts of one layer (≤ a few hundred). */
#include "criteria/cluster.h"

#include <stdlib.h>
#include <string.h>

#include "criteria/crit.h"
#include "base/util.h"

int m2d_cluster_average_linkage(const double *dist, int n, int k, int *label) {
    if (n < 1 || k < 1 || k > n) return m2d_err("average linkage: field 'k': need 1 <= k <= n (k=%d, n=%d)", k, n);
    /* sum[a*n+b]: Σ dist over members of clusters named a and b; clusters are named by their lowest
     * member, so merging b into a (a < b) keeps the name a */
    double *sum = m2d_malloc((size_t)n * n * sizeof *sum);
    int *size = m2d_malloc((size_t)n * sizeof *size), *name = m2d_malloc((size_t)n * sizeof *name);
    memcpy(sum, dist, (size_t)n * n * sizeof *sum);
    for (int i = 0; i < n; i++) size[i] = 1, name[i] = i;
    for (int clusters = n; clusters > k; clusters--) {
        int ba = -1, bb = -1;
        double best = 0;
        for (int a = 0; a < n; a++) {
            if (!size[a]) continue;
            for (int b = a + 1; b < n; b++) {
                if (!size[b]) continue;
                double avg = sum[(size_t)a * n + b] / ((double)size[a] * size[b]);
                if (ba < 0 || avg < best) best = avg, ba = a, bb = b; /* strict '<': first pair wins ties */
            }
        }
        for (int c = 0; c < n; c++) {
            sum[(size_t)ba * n + c] += sum[(size_t)bb * n + c];
            sum[(size_t)c * n + ba] = sum[(size_t)ba * n + c];
        }
        size[ba] += size[bb];
        size[bb] = 0;
        for (int i = 0; i < n; i++)
            if (name[i] == bb) name[i] = ba;
    }
    /* canonical labels: first appearance in index order */
    int *map = size; /* reuse: sizes are no longer needed */
    for (int i = 0; i < n; i++) map[i] = -1;
    int next = 0;
    for (int i = 0; i < n; i++) {
        if (map[name[i]] < 0) map[name[i]] = next++;
        label[i] = map[name[i]];
    }
    free(sum);
    free(size);
    free(name);
    return 0;
}

int m2d_cluster_gram_cosine(const double *G, int n, int k, int *label) {
    double *dist = m2d_malloc((size_t)n * n * sizeof *dist);
    m2d_crit_gram_to_cosine_distance(G, n, dist);
    int rc = m2d_cluster_average_linkage(dist, n, k, label);
    free(dist);
    return rc;
}
