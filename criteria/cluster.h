/* cluster — average-linkage agglomerative clustering on a distance matrix, cut at k clusters.
 *
 * Average linkage: D(A,B) = mean of dist(a,b) over a ∈ A, b ∈ B. Each step merges the pair of
 * clusters with the smallest D. Deterministic tie-breaking: a cluster is named by its lowest
 * member index; among pairs with exactly equal D the pair (A,B), A<B, that is lexicographically
 * smallest in those names wins. Labels are canonical: numbered by first appearance in index order. */
#ifndef M2D_CLUSTER_H
#define M2D_CLUSTER_H

/* dist[n*n] symmetric; 1 <= k <= n; label[n] in [0, k). Returns 0 (or -1 + m2d_err on bad k). */
int m2d_cluster_average_linkage(const double *dist, int n, int k, int *label);
/* The same under the cosine distance of a Gram matrix G[n*n] (m2d_crit_gram_to_cosine_distance):
 * the last step of the oc, rc and wc groupings. */
int m2d_cluster_gram_cosine(const double *G, int n, int k, int *label);

#endif
