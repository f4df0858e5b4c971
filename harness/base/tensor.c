#include "base/tensor.h"

#include <math.h>
#include <string.h>

#include "base/util.h"

static const struct { const char *name; size_t size; } dtype_info[M2D_DTYPE_COUNT] = {
    [M2D_F32] = {"F32", 4}, [M2D_F16] = {"F16", 2}, [M2D_BF16] = {"BF16", 2}, [M2D_F64] = {"F64", 8},
    [M2D_I32] = {"I32", 4}, [M2D_I64] = {"I64", 8}, [M2D_U8] = {"U8", 1},
};

size_t m2d_dtype_size(m2d_dtype t) { return dtype_info[t].size; }
const char *m2d_dtype_name(m2d_dtype t) { return dtype_info[t].name; }

int m2d_dtype_parse(const char *s, m2d_dtype *out) {
    for (int i = 0; i < M2D_DTYPE_COUNT; i++)
        if (strcmp(s, dtype_info[i].name) == 0) {
            *out = (m2d_dtype)i;
            return 0;
        }
    return -1;
}

int64_t m2d_tensor_numel(const m2d_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

float m2d_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t m2d_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

float m2d_f64_to_f32_odd(double x) {
    float f = (float)x; /* to nearest */
    if ((double)f == x || isnan(x) || isinf(f)) return f; /* exact; NaN; past FLT_MAX: inf is every rounding's */
    uint32_t u;
    memcpy(&u, &f, 4);
    if (fabs((double)f) > fabs(x)) u -= 1; /* rounded away from zero: the neighbour toward zero (bit patterns are monotone) */
    u |= 1;
    memcpy(&f, &u, 4);
    return f;
}

float m2d_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) u = sign;
        else { /* subnormal: normalise */
            int e = -1;
            do { man <<= 1; e++; } while (!(man & 0x400));
            u = sign | (uint32_t)(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
        }
    } else if (exp == 31) u = sign | 0x7f800000 | man << 13;
    else u = sign | (exp + 112) << 23 | man << 13;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t m2d_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffff;
    if (a > 0x7f800000) return sign | 0x7e00;
    if (a >= 0x477ff000) return sign | 0x7c00; /* rounds to inf */
    if (a < 0x38800000) { /* subnormal or zero in f16 */
        float v;
        memcpy(&v, &a, 4);
        /* scale so that the f16 subnormal unit (2^-24) becomes 1 and let the FPU round (nearest even) */
        return sign | (uint16_t)nearbyintf(v * 16777216.0f);
    }
    uint32_t r = a + 0xfff + ((a >> 13) & 1);
    return sign | (uint16_t)((r - 0x38000000) >> 13);
}

void m2d_to_f32(m2d_dtype t, const void *src, int64_t first, int64_t n, float *dst) {
    switch (t) {
    case M2D_F32: memcpy(dst, (const float *)src + first, (size_t)n * 4); break;
    case M2D_BF16: { /* the top half of an fp32: widen 16 lanes at a time (weights on the GEMM path) */
        typedef uint16_t v16h __attribute__((vector_size(32)));
        typedef uint32_t v16w __attribute__((vector_size(64)));
        const uint16_t *s = (const uint16_t *)src + first;
        int64_t i = 0;
        for (; i + 16 <= n; i += 16) {
            v16h h;
            memcpy(&h, s + i, sizeof h);
            v16w w = __builtin_convertvector(h, v16w) << 16;
            memcpy(dst + i, &w, sizeof w);
        }
        for (; i < n; i++) dst[i] = m2d_bf16_to_f32(s[i]);
        break;
    }
    case M2D_F16: {
        const uint16_t *s = (const uint16_t *)src + first;
        for (int64_t i = 0; i < n; i++) dst[i] = m2d_f16_to_f32(s[i]);
        break;
    }
    case M2D_F64: {
        const double *s = (const double *)src + first;
        for (int64_t i = 0; i < n; i++) dst[i] = (float)s[i];
        break;
    }
    default: memset(dst, 0, (size_t)n * 4); break;
    }
}

void m2d_from_f32(m2d_dtype t, const float *src, int64_t n, void *dst) {
    switch (t) {
    case M2D_F32: memcpy(dst, src, (size_t)n * 4); break;
    case M2D_BF16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = m2d_f32_to_bf16(src[i]);
        break;
    case M2D_F16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = m2d_f32_to_f16(src[i]);
        break;
    default: break;
    }
}

float *m2d_tensor_f32(const m2d_tensor *t) {
    int64_t n = m2d_tensor_numel(t);
    float *out = m2d_malloc((size_t)n * sizeof(float));
    m2d_to_f32(t->dtype, t->data, 0, n, out);
    return out;
}

int64_t m2d_tensor_first_non_finite(const m2d_tensor *t, int64_t *count) {
    float buf[4096];
    int64_t n = m2d_tensor_numel(t), first = -1;
    *count = 0;
    if (t->dtype != M2D_F32 && t->dtype != M2D_BF16 && t->dtype != M2D_F16) return -1;
    for (int64_t at = 0; at < n; at += 4096) {
        int64_t m = M2D_MIN(4096, n - at);
        m2d_to_f32(t->dtype, t->data, at, m, buf);
        for (int64_t i = 0; i < m; i++)
            if (!isfinite(buf[i])) {
                if (first < 0) first = at + i;
                ++*count;
            }
    }
    return first;
}
