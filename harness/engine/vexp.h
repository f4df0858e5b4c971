/* vexp — exponentials over float arrays in SIMD vectors, where a scalar exp per element was the
 * cost: the sum of exponentials at the heart of the LM head's log-softmax (log-probabilities of
 * every scored token over a vocabulary of up to ~150k logits: in a PPL pass of the dense student
 * this sum, done with one double exp per logit, took ~30 % of the time; issue 28), and SwiGLU's
 * sigmoid (one expf per element of every FFN activation: ~8 % of a calibration pass on the
 * 30B-shaped slice, and single-threaded in the dense FFN).
 *
 * exp(x), x <= 0: x clamped to -87 (a term below 1.7e-38 beside 1 changes nothing), x = k ln2 + r
 * (k = round(x / ln2), Cody-Waite two-part ln2, |r| <= ln2 / 2), exp(r) by Cephes' degree-6
 * polynomial, 2^k by the exponent bits. Relative error <= ~2 float ulps (2.4e-7, tested against
 * exp() in double).
 *
 * m2d_vexp_sum_exp(z, n, m) = sum_j exp(z_j - m) for logits z_j <= m (m their maximum), each term in
 *   float, summed in double: the sum's relative error and the log-probability's absolute error are
 *   <= 2.4e-7, below the fp32 logits' own rounding (~6e-8 |z| per GEMM sum).
 * m2d_vexp_swiglu(g, u, n, h): h = g sigmoid(g) u, sigmoid(g) = 1 / (1 + e) for g >= 0 and e / (1 + e)
 *   for g < 0, e = exp(-|g|) <= 1 (never overflows): relative error <= ~5 float ulps (the exp's 2,
 *   one each for 1 + e, the division and the two products), against glibc expf's path with its ~4;
 *   for g < -87 the clamp leaves an absolute error below 1.7e-38 |g u| (tested against double).
 *
 * Written with GCC vector types (16 floats), so the compiler emits the machine's widest SIMD
 * (AVX-512, AVX2, SSE) from one source; the order of operations is the source's (ISO C: no FMA
 * contraction), and a tail runs through the same lanes, so every element's bits are the same on
 * every x86 CPU and at every position. The obviously-correct paths (double exp per term, expf per
 * element) stay beside them for the tests. */
#ifndef M2D_ENGINE_VEXP_H
#define M2D_ENGINE_VEXP_H

#include <stdint.h>

/* max of z[0..n), n >= 1 */
float m2d_vexp_max(const float *z, int n);
/* sum_j exp(z_j - m), terms in float, sum in double (see above) */
double m2d_vexp_sum_exp(const float *z, int n, float m);
/* the same with exp() in double for every term */
double m2d_vexp_sum_exp_ref(const float *z, int n, float m);

/* h = silu(g) * u elementwise (h may be g or u; see above) */
void m2d_vexp_swiglu(const float *g, const float *u, int64_t n, float *h);
/* the same with one expf per element */
void m2d_vexp_swiglu_ref(const float *g, const float *u, int64_t n, float *h);

#endif
