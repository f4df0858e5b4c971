/* mxfp4 — OCP MXFP4 rows: dequantiser and packer (see mxfp4.h). */
#include "io/mxfp4.h"

#include <math.h>

#include "base/util.h"

const float m2d_fp4_values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

int m2d_mxfp4_dequant_row(const uint8_t *blocks, const uint8_t *scales, int64_t n, float *out) {
    for (int64_t b = 0; b < n / M2D_MXFP4_BLOCK; b++) {
        float lut[16]; /* this block's 16 values: exact products (power-of-two scale) */
        int finite = 1;
        if (scales[b] == 255) return -1; /* NaN in E8M0 */
        for (int c = 0; c < 16; c++) {
            lut[c] = ldexpf(m2d_fp4_values[c], (int)scales[b] - 127);
            finite &= isfinite(lut[c]);
        }
        const uint8_t *q = blocks + b * (M2D_MXFP4_BLOCK / 2);
        float *o = out + b * M2D_MXFP4_BLOCK;
        for (int i = 0; i < M2D_MXFP4_BLOCK / 2; i++) {
            o[2 * i] = lut[q[i] & 15];
            o[2 * i + 1] = lut[q[i] >> 4];
        }
        for (int i = 0; !finite && i < M2D_MXFP4_BLOCK; i++) /* only near the top of the range */
            if (!isfinite(o[i])) return -1;
    }
    return 0;
}

/* Code of the FP4 value nearest to v (|v| <= 6 after scaling), ties to the even code. */
static uint8_t fp4_code(double v) {
    uint8_t sign = signbit(v) ? 8 : 0;
    double a = fabs(v);
    int best = 0;
    for (int c = 1; c < 8; c++) {
        double d = fabs(a - m2d_fp4_values[c]), db = fabs(a - m2d_fp4_values[best]);
        if (d < db || (d == db && (c & 1) == 0)) best = c;
    }
    return (uint8_t)(sign | best);
}

int m2d_mxfp4_pack_row(const float *x, int64_t n, uint8_t *blocks, uint8_t *scales) {
    if (n % M2D_MXFP4_BLOCK) return m2d_err("mxfp4: row of %lld values is not a multiple of 32", (long long)n);
    for (int64_t b = 0; b < n / M2D_MXFP4_BLOCK; b++) {
        const float *xb = x + b * M2D_MXFP4_BLOCK;
        double amax = 0;
        for (int i = 0; i < M2D_MXFP4_BLOCK; i++) {
            if (!isfinite(xb[i])) return m2d_err("mxfp4: value %lld is not finite", (long long)(b * 32 + i));
            amax = fmax(amax, fabs(xb[i]));
        }
        /* smallest e with amax <= 6 * 2^e (exact comparisons in double) */
        int e = 0;
        if (amax > 0) {
            e = (int)ceil(log2(amax / 6.0));
            while (ldexp(6.0, e) < amax) e++;
            while (ldexp(6.0, e - 1) >= amax) e--;
        }
        if (e + 127 < 0 || e + 127 > 254)
            return m2d_err("mxfp4: block %lld needs scale 2^%d, outside E8M0's range", (long long)b, e);
        scales[b] = (uint8_t)(e + 127);
        uint8_t *q = blocks + b * (M2D_MXFP4_BLOCK / 2);
        for (int i = 0; i < M2D_MXFP4_BLOCK / 2; i++)
            q[i] = (uint8_t)(fp4_code(ldexp(xb[2 * i], -e)) | fp4_code(ldexp(xb[2 * i + 1], -e)) << 4);
    }
    return 0;
}
