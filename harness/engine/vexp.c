#include "engine/vexp.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#define LANES 16
typedef float vf __attribute__((vector_size(LANES * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(LANES * sizeof(int32_t))));
typedef double vd __attribute__((vector_size(LANES * sizeof(double))));

#define splat(x) ((vf){0} + (x)) /* every lane x (macros: no vector crosses a call) */
#define load(v, p) memcpy(&(v), (p), sizeof(vf))

/* exp(x) for x <= 0 (see vexp.h): every lane's operations in the source's order */
/* (in place: a vector passed by value gets a GCC ABI note on CPUs without AVX-512) */
static inline void exp_nonpositive(vf *v) {
    vf x = *v;
    const vf lo = splat(-87.0f), round_magic = splat(12582912.0f); /* 1.5 * 2^23: x + it rounds to an integer */
    vi below = x < lo;
    x = (vf)(((vi)lo & below) | ((vi)x & ~below));
    vf k = (x * splat(1.44269504088896341f) + round_magic) - round_magic;
    vf r = x - k * splat(0.693359375f) - k * splat(-2.12194440e-4f);
    vf p = splat(1.9875691500e-4f);
    p = p * r + splat(1.3981999507e-3f);
    p = p * r + splat(8.3334519073e-3f);
    p = p * r + splat(4.1665795894e-2f);
    p = p * r + splat(1.6666665459e-1f);
    p = p * r + splat(5.0000001201e-1f);
    p = p * r * r + r + splat(1.0f);
    vi e = (__builtin_convertvector(k, vi) + 127) << 23; /* k in [-126, 0]: a normal power of two */
    *v = p * (vf)e;
}

float m2d_vexp_max(const float *z, int n) {
    float m = z[0];
    int j = 0;
    if (n >= LANES) {
        vf v, x;
        load(v, z);
        for (j = LANES; j + LANES <= n; j += LANES) {
            load(x, z + j);
            vi gt = x > v;
            v = (vf)(((vi)x & gt) | ((vi)v & ~gt));
        }
        for (int l = 0; l < LANES; l++) m = v[l] > m ? v[l] : m;
    }
    for (; j < n; j++) m = z[j] > m ? z[j] : m;
    return m;
}

double m2d_vexp_sum_exp(const float *z, int n, float m) {
    vd acc = {0};
    int j = 0;
    for (; j + LANES <= n; j += LANES) {
        vf x;
        load(x, z + j);
        x -= m;
        exp_nonpositive(&x);
        acc += __builtin_convertvector(x, vd);
    }
    double s = 0;
    if (j < n) { /* the tail through the same lanes, only its n - j terms summed */
        float t[LANES];
        for (int l = 0; l < LANES; l++) t[l] = j + l < n ? z[j + l] - m : -INFINITY;
        vf e;
        load(e, t);
        exp_nonpositive(&e);
        for (int l = 0; l < n - j; l++) s += e[l];
    }
    for (int l = 0; l < LANES; l++) s += acc[l];
    return s;
}

double m2d_vexp_sum_exp_ref(const float *z, int n, float m) {
    double s = 0;
    for (int j = 0; j < n; j++) s += exp((double)z[j] - m);
    return s;
}

/* one vector of SwiGLU: *X = silu(*X) * *Y (see vexp.h) */
static inline void swiglu_lanes(vf *x, const vf *y) {
    vf g = *x, e = (vf)((vi)g | ((vi){0} + INT32_MIN)); /* -|g|: the sign bit set */
    exp_nonpositive(&e);
    vi neg = g < splat(0.0f);
    vf num = (vf)(((vi)e & neg) | ((vi)splat(1.0f) & ~neg));
    *x = g * (num / (splat(1.0f) + e)) * *y;
}

void m2d_vexp_swiglu(const float *g, const float *u, int64_t n, float *h) {
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        vf x, y;
        load(x, g + i);
        load(y, u + i);
        swiglu_lanes(&x, &y);
        memcpy(h + i, &x, sizeof x);
    }
    if (i < n) { /* the tail through the same lanes */
        float a[LANES] = {0}, b[LANES] = {0};
        memcpy(a, g + i, sizeof(float) * (size_t)(n - i));
        memcpy(b, u + i, sizeof(float) * (size_t)(n - i));
        vf x, y;
        load(x, a);
        load(y, b);
        swiglu_lanes(&x, &y);
        memcpy(h + i, &x, sizeof(float) * (size_t)(n - i));
    }
}

void m2d_vexp_swiglu_ref(const float *g, const float *u, int64_t n, float *h) {
    for (int64_t i = 0; i < n; i++) h[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}
