/* attn_ref — the float64 attention every attention test compares with (test_engine's backends,
 * test_cuda_kernels' emulated GPU kernel). Header-only, C and C++.
 *
 * q [nq][H * hd]; k, v [np + nq][KV * hd], the first np rows the prefix; query row i (position
 * np + i) sees key t iff t <= np + i and, with a window w > 0, np + i - w < t (HF's sliding mask);
 * head h reads kv head h / (H / KV); with sinks, exp(sinks[h]) joins head h's denominator (a logit
 * whose value row is zero). Scores s = q·k × scale, softmax with max subtraction, all in double. */
#ifndef M2D_TEST_ATTN_REF_H
#define M2D_TEST_ATTN_REF_H

#include <math.h>
#include <stdlib.h>

static inline void attention_f64(const float *q, const float *k, const float *v, int np, int nq, int H, int KV, int hd,
                                 int window, const float *sinks, double scale, float *out) {
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
                for (int t = lo; t < nk; t++) acc += s[t] * v[(size_t)t * KV * hd + g * hd + c];
                out[(size_t)i * H * hd + h * hd + c] = (float)(acc / z);
            }
        }
    free(s);
}

#endif
