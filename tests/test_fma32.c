/* fma32: the own fp32 GEMM kernel (AVX2 + FMA) of the sgemm path, and its place in gemm.c.
 *
 * Checks, on a CPU with AVX2 and FMA (every CPU this project targets; elsewhere the kernel is never
 * chosen and m2d_gemm_fp32_own() is 0, which is checked instead):
 *  - bit for bit against the obviously-correct loop: c = 0; for k: c = fmaf(x[k], w[k], c). IEEE 754
 *    fixes fma's result, so this equality holds on every CPU by construction; any blocking (row
 *    tiles of 1-6, k chunks of 256 resumed from C, narrower last panels, strided X, W and C) that
 *    touched the order of a chain would break it. W fp32 and bf16 (widened exactly);
 *  - against float64: |C - Σ x w| <= γ_K Σ|x w|, γ_K = K u / (1 - K u), u = 2^-24 (a recursive
 *    sum of K terms, each fma rounding once; Higham §3.1);
 *  - through m2d_gemm on the sgemm path (fp32 and bf16 precision, weights too small for oneDNN):
 *    a row's bits do not depend on the batch (1, 2, 3 or 37 rows, any offset), nor on beta's path
 *    (beta 1 adds Y once after the chains). */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "engine/fma32.h"
#include "engine/gemm.h"
#include "engine/pool.h"

static float bf16_value(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* W as fp32, or as bf16 bit patterns (the fp32 values truncated to bf16, so both hold the same values) */
typedef struct {
    int n, k, ld, bf16;
    float *f;
    uint16_t *h;
} weights;

static weights weights_new(uint64_t *st, int n, int k, int ld, int bf16) {
    weights w = {n, k, ld, bf16, m2d_malloc(sizeof(float) * (size_t)n * ld), m2d_malloc(sizeof(uint16_t) * (size_t)n * ld)};
    for (size_t i = 0; i < (size_t)n * ld; i++) {
        float v = (float)(tu_rand_normal(st) * ldexp(1.0, (int)(tu_rand_uniform(st) * 9) - 4));
        uint32_t u;
        memcpy(&u, &v, sizeof u);
        w.h[i] = (uint16_t)(u >> 16);
        w.f[i] = bf16 ? bf16_value(w.h[i]) : v;
    }
    return w;
}

static void weights_free(weights *w) { free(w->f), free(w->h); }

static const void *weights_data(const weights *w) { return w->bf16 ? (const void *)w->h : (const void *)w->f; }

/* The order of the contract: one fma chain over k, from zero */
static float chain(const float *x, const float *w, int k) {
    float c = 0.0f;
    for (int i = 0; i < k; i++) c = fmaf(x[i], w[i], c);
    return c;
}

static void one_shape(uint64_t *st, int m, int n, int k, int bf16) {
    int ldx = k + 3, ldw = k + 5, ldc = n + 7;
    weights w = weights_new(st, n, k, ldw, bf16);
    float *x = m2d_malloc(sizeof(float) * (size_t)m * ldx), *c = m2d_malloc(sizeof(float) * (size_t)m * ldc);
    for (size_t i = 0; i < (size_t)m * ldx; i++) x[i] = (float)tu_rand_normal(st);
    for (size_t i = 0; i < (size_t)m * ldc; i++) c[i] = -7.0f; /* gaps must stay untouched */
    m2d_fma32_gemm(x, ldx, m, weights_data(&w), bf16, ldw, n, k, c, ldc);
    for (int r = 0; r < m; r++) {
        for (int j = 0; j < n; j++) {
            const float *xr = x + (size_t)r * ldx, *wj = w.f + (size_t)j * ldw;
            float want = chain(xr, wj, k), got = c[(size_t)r * ldc + j];
            if (memcmp(&want, &got, sizeof want))
                fail_msg("%d x %d x %d (%s W): C[%d, %d] = %a, the fma chain gives %a", m, n, k, bf16 ? "bf16" : "fp32",
                         r, j, got, want);
            double exact = 0, mag = 0;
            for (int i = 0; i < k; i++) exact += (double)xr[i] * wj[i], mag += fabs((double)xr[i] * wj[i]);
            assert_true(fabs(got - exact) <= tu_gamma_f32(k) * mag);
        }
        for (int j = n; j < ldc; j++) assert_true(c[(size_t)r * ldc + j] == -7.0f);
    }
    free(x), free(c);
    weights_free(&w);
}

static void equals_the_fma_chain(void **state) {
    (void)state;
    if (!m2d_fma32_cpu()) {
        assert_int_equal(m2d_gemm_fp32_own(), 0); /* never chosen without AVX2 and FMA */
        return;
    }
    uint64_t st = 41;
    /* rows: every tile height and several blocks of rows; columns: narrower and wider than a panel,
     * a last panel narrower than 16, and (300) two blocks of kept chunks, the second partial, which
     * the later blocks of rows (250) read again, with k shorter than a chunk too; k: below, at and
     * past a chunk of 256, and none */
    const int ms[] = {1, 2, 3, 4, 5, 6, 7, 13, 250};
    const int ns[] = {1, 5, 16, 17, 40, 300};
    const int ks[] = {0, 1, 7, 8, 9, 255, 256, 257, 600};
    for (int bf16 = 0; bf16 <= 1; bf16++)
        for (size_t a = 0; a < M2D_ARRAY_LEN(ms); a++)
            for (size_t b = 0; b < M2D_ARRAY_LEN(ns); b++)
                for (size_t i = 0; i < M2D_ARRAY_LEN(ks); i++)
                    if ((ms[a] < 250 || ks[i] == 7 || ks[i] == 257 || ks[i] == 600) && (ns[b] < 300 || ms[a] >= 13))
                        one_shape(&st, ms[a], ns[b], ks[i], bf16);
}

/* Through the GEMM module: weights of 300 x 45 (13,500 elements) take oneDNN where it has native
 * kernels, so the sgemm path is forced; every row of a 37-row call has the bits of that row in a
 * call of 1, 2 or 3 rows at any offset, as stored (F32 and BF16) and prepared, beta 0 and 1. */
static void rows_do_not_depend_on_the_batch(void **state) {
    (void)state;
    if (!m2d_gemm_fp32_own()) return; /* OpenBLAS: rows depend on the batch (test_gemm) */
    uint64_t st = 43;
    enum { M = 37, N = 300, K = 45 };
    float x[M * K], y0[M * N];
    for (int i = 0; i < M * K; i++) x[i] = (float)tu_rand_normal(&st);
    for (int i = 0; i < M * N; i++) y0[i] = (float)tu_rand_normal(&st);
    float *all = m2d_malloc(sizeof(float) * M * N), *few = m2d_malloc(sizeof(float) * M * N);
    m2d_pool *pool = m2d_pool_new(2);
    m2d_precision precs[2] = {M2D_PREC_FP32, M2D_PREC_BF16};
    for (int p = 0; p < 2; p++)
        for (int bf16 = 0; bf16 <= 1; bf16++)
            for (int prepared = 0; prepared <= 1; prepared++)
                for (int beta = 0; beta <= 1; beta++) {
                    weights w = weights_new(&st, N, K, K, bf16);
                    m2d_gemm_ctx *g;
                    assert_int_equal(m2d_gemm_ctx_new(precs[p], pool, &g), 0);
                    m2d_gemm_set_kernel(g, M2D_GEMM_SGEMM);
                    m2d_gemm_w wv = m2d_gemm_weight(bf16 ? M2D_BF16 : M2D_F32, weights_data(&w), N, K, K);
                    m2d_gemm_packed *pk = NULL;
                    if (prepared) {
                        assert_int_equal(m2d_gemm_prepare(g, &wv, &pk), 0);
                        wv = m2d_gemm_packed_rows(pk, 0, N);
                    }
                    assert_int_equal(m2d_gemm_rows_independent(g, &wv), 1);
                    memcpy(all, y0, sizeof y0);
                    memcpy(few, y0, sizeof y0);
                    assert_int_equal(m2d_gemm(g, x, K, M, &wv, all, N, (float)beta), 0);
                    for (int r0 = 0, step = 1; r0 < M; r0 += step, step = step % 3 + 1) {
                        int m = r0 + step <= M ? step : M - r0;
                        assert_int_equal(m2d_gemm(g, x + r0 * K, K, m, &wv, few + r0 * N, N, (float)beta), 0);
                    }
                    assert_memory_equal(all, few, sizeof(float) * M * N);
                    m2d_gemm_packed_free(pk);
                    m2d_gemm_ctx_free(g);
                    weights_free(&w);
                }
    m2d_pool_free(pool);
    free(all), free(few);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(equals_the_fma_chain),
        cmocka_unit_test(rows_do_not_depend_on_the_batch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
