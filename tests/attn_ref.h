/* attn_ref — the float64 attention every attention test compares with (test_engine's backends,
 * test_cuda_kernels' emulated GPU kernel). Header-only, C and C++.
 *
 * q [nq][H * hd]; k, v [np + nq][KV * hd], the first np rows the prefix; query row i (position
 * np + i) sees key t iff t <= np + i and, with a window w > 0, np + i - w < t (HF's sliding mask);
 * head h reads kv head h / (H / KV); with sinks, exp(sinks[h]) joins head h's denominator (a logit
 * whose value row is zero). Scores s = q·k × scale, softmax with max subtraction, all in double.
 * attention_f64_p also rounds the softmax's numerators to bf16 (attn_ref_bf16), as attention on
 * bf16 operands does. */
#ifndef M2D_TEST_ATTN_REF_H
#define M2D_TEST_ATTN_REF_H

#include <math.h>
#include <stdlib.h>

/* x rounded to bf16 (to nearest, ties to even), as a float: the reference's own rounding */
static inline float attn_ref_bf16(float x) {
    union {
        float f;
        unsigned u;
    } v = {x};
    v.u = (v.u + 0x7fffu + ((v.u >> 16) & 1u)) & 0xffff0000u; /* finite x only */
    return v.f;
}

/* attention_f64 (below) with ROUND_P: each numerator exp(s - m), m the row's maximum, rounded to
 * bf16 before P V, the denominator summing them unrounded (m2d_attn_args.prec BF16's rule) */
static inline void attention_f64_p(const float *q, const float *k, const float *v, int np, int nq, int H, int KV, int hd,
                                   int window, const float *sinks, double scale, int round_p, float *out) {
    double *s = (double *)malloc(sizeof(double) * (size_t)(np + nq));
    for (int i = 0; i < nq; i++)
        for (int h = 0; h < H; h++) {
            int g = h / (H / KV), nk = np + i + 1, lo = window > 0 && nk > window ? nk - window : 0;
            double m = sinks ? sinks[h] : -INFINITY, z = 0;
            for (int t = lo; t < nk; t++) {
                double dot = 0;
                for (int c = 0; c < hd; c++) dot += (double)q[(size_t)i * H * hd + h * hd + c] * k[(size_t)t * KV * hd + g * hd + c];
                s[t] = dot * scale;
                m = fmax(m, s[t]);
            }
            for (int t = lo; t < nk; t++) z += (s[t] = exp(s[t] - m));
            if (sinks) z += exp(sinks[h] - m);
            for (int c = 0; c < hd; c++) {
                double acc = 0;
                for (int t = lo; t < nk; t++)
                    acc += (round_p ? (double)attn_ref_bf16((float)s[t]) : s[t]) * v[(size_t)t * KV * hd + g * hd + c];
                out[(size_t)i * H * hd + h * hd + c] = (float)(acc / z);
            }
        }
    free(s);
}

static inline void attention_f64(const float *q, const float *k, const float *v, int np, int nq, int H, int KV, int hd,
                                 int window, const float *sinks, double scale, float *out) {
    attention_f64_p(q, k, v, np, nq, H, KV, hd, window, sinks, scale, 0, out);
}

#endif
