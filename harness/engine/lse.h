/* lse — the sum of exponentials at the heart of the LM head's log-softmax (log-probabilities of
 * every scored token over a vocabulary of up to ~150k logits: in a PPL pass of the dense student
 * this sum, done with one double exp per logit, took ~30 % of the time; issue 28).
 *
 * m2d_lse_sum_exp(z, n, m) = sum_j exp(z_j - m) for logits z_j <= m (m their maximum), each term in
 * float, summed in double:
 *   exp(x), x <= 0: x clamped to -87 (a term below 1.7e-38 beside the maximum's 1 changes nothing),
 *   x = k ln2 + r (k = round(x / ln2), Cody-Waite two-part ln2, |r| <= ln2 / 2), exp(r) by Cephes'
 *   degree-6 polynomial, 2^k by the exponent bits. Relative error per term <= ~2 float ulps
 *   (2.4e-7, tested against exp() in double), so the sum's relative error and the log-probability's
 *   absolute error are <= 2.4e-7: below the fp32 logits' own rounding (~6e-8 |z| per GEMM sum).
 * Written with GCC vector types (16 floats), so the compiler emits the machine's widest SIMD
 * (AVX-512, AVX2, SSE) from one source; the order of operations is the source's (ISO C: no FMA
 * contraction), so the result is bit for bit the same on every x86 CPU. The obviously-correct
 * path m2d_lse_sum_exp_ref (one double exp per logit) stays beside it for the tests. */
#ifndef M2D_ENGINE_LSE_H
#define M2D_ENGINE_LSE_H

/* max of z[0..n), n >= 1 */
float m2d_lse_max(const float *z, int n);
/* sum_j exp(z_j - m), terms in float, sum in double (see above) */
double m2d_lse_sum_exp(const float *z, int n, float m);
/* the same with exp() in double for every term */
double m2d_lse_sum_exp_ref(const float *z, int n, float m);

#endif
