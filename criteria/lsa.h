/* lsa — linear sum assignment (the Hungarian method with potentials, O(n³)): the permutation of
 * an n×n weight matrix with the largest total. Used by M-SMoE's weight matching (Ainsworth et al.
 * 2023, as in paper 003 App. D) to align experts' intermediate neurons before merging. */
#ifndef M2D_LSA_H
#define M2D_LSA_H

/* perm[a] = b maximising Σ_a C[a*n + b] over permutations (C row-major, finite). Deterministic;
 * among equal optima an unspecified one. */
void m2d_lsa_max(const double *C, int n, int *perm);

#endif
