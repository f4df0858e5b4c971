/* dpbf16: the own AVX512-BF16 GEMM kernel and its place in gemm.c.
 *
 * The process runs with oneDNN limited to avx512_core_bf16 (DNNL_MAX_CPU_ISA, set in main before
 * oneDNN starts, unless the caller set it: make test-isa's AVX2), the kernel choice of a CPU with
 * AVX512-BF16 and no AMX (Zen 4, Zen 5), which is where the own kernel may stand in for oneDNN.
 *
 * Checks, on a CPU with AVX512-BF16:
 *  - against float64 on the bf16 operands: products of two bf16 are exact in fp32 (8 + 8
 *    significant bits), so the only error is fp32 summation of K terms in any order:
 *    |Y - Σ x w| <= γ_K Σ|x w|, γ_K = K u / (1 - K u), u = 2^-24 (Higham §3.1). The check operands
 *    stay far from fp32's subnormal range, where vdpbf16ps flushes to zero;
 *  - every micro-tile height and the obviously-correct path (one accumulator per element, the same
 *    chunks, one vdpbf16ps lane) give the same bits: the blocking never touches the order of a sum;
 *  - wherever gemm.c calls the own kernel eligible, its results through m2d_gemm equal oneDNN's bit
 *    for bit (weights as stored in bf16 and fp32, prepared, beta 0 and 1, 1 or 2 threads, odd
 *    shapes): the dispatch choice changes the speed, never a number.
 * Without AVX512-BF16 (or with oneDNN on AVX2), the own kernel is never chosen: forcing it runs
 * oneDNN's (or sgemm's) path and counts no own slice. */
#include "testutil.h"

#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "engine/dpbf16.h"
#include "engine/gemm.h"
#include "engine/pool.h"

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static double from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* bf16 values of normals scaled by 2^-4..2^4 */
static void fill_bf16(uint64_t *st, uint16_t *v, size_t n) {
    for (size_t i = 0; i < n; i++)
        v[i] = to_bf16((float)(tu_rand_normal(st) * ldexp(1.0, (int)(tu_rand_uniform(st) * 9) - 4)));
}

typedef struct {
    int m, n, k;
    uint16_t *x, *w, *packed;
    float *y;
} problem;

static problem problem_new(uint64_t *st, int m, int n, int k) {
    problem p = {m, n, k, m2d_malloc(sizeof(uint16_t) * (size_t)m * k), m2d_malloc(sizeof(uint16_t) * (size_t)n * k),
                 m2d_malloc(m2d_dpbf16_packed_bytes(n, k)), m2d_malloc(sizeof(float) * (size_t)m * n)};
    fill_bf16(st, p.x, (size_t)m * k);
    fill_bf16(st, p.w, (size_t)n * k);
    m2d_dpbf16_pack(p.w, k, n, k, p.packed);
    return p;
}

static void problem_free(problem *p) { free(p->x), free(p->w), free(p->packed), free(p->y); }

/* The obviously-correct path: element (i, j) alone, one accumulator per chunk in lane 0 of
 * vdpbf16ps, chunks added in order. */
__attribute__((target("avx512f,avx512bf16"))) static float element_ref(const problem *p, int i, int j, int kc) {
    float c = 0;
    for (int k0 = 0; k0 < p->k; k0 += kc) {
        __m512 acc = _mm512_setzero_ps();
        for (int t = k0; t < p->k && t < k0 + kc; t += 2) {
            uint32_t a = p->x[(size_t)i * p->k + t], b = p->w[(size_t)j * p->k + t];
            if (t + 1 < p->k) a |= (uint32_t)p->x[(size_t)i * p->k + t + 1] << 16, b |= (uint32_t)p->w[(size_t)j * p->k + t + 1] << 16;
            acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_set1_epi32((int)a), (__m512bh)_mm512_set1_epi32((int)b));
        }
        c = k0 == 0 ? _mm512_cvtss_f32(acc) : c + _mm512_cvtss_f32(acc);
    }
    return c;
}

static void kernel_matches_float64(void **state) {
    (void)state;
    if (!m2d_dpbf16_cpu()) {
        print_message("no AVX512-BF16 on this CPU: the kernel cannot run; gemm never chooses it (own_never_chosen)\n");
        return;
    }
    static const int shapes[][3] = {{1, 1, 1}, {5, 33, 7}, {12, 32, 64}, {13, 70, 1023}, {29, 64, 2048}, {3, 300, 4099}};
    uint64_t st = 1;
    for (size_t s = 0; s < M2D_ARRAY_LEN(shapes); s++) {
        problem p = problem_new(&st, shapes[s][0], shapes[s][1], shapes[s][2]);
        m2d_dpbf16_gemm(p.x, p.k, p.m, p.packed, p.n, p.k, 512, p.y, p.n, 0);
        double gamma = tu_gamma_f32(p.k);
        for (int i = 0; i < p.m; i++)
            for (int j = 0; j < p.n; j++) {
                double sum = 0, abs_sum = 0;
                for (int t = 0; t < p.k; t++) {
                    double pr = from_bf16(p.x[(size_t)i * p.k + t]) * from_bf16(p.w[(size_t)j * p.k + t]);
                    sum += pr, abs_sum += fabs(pr);
                }
                double err = fabs(p.y[(size_t)i * p.n + j] - sum);
                if (err > gamma * abs_sum)
                    fail_msg("%dx%dx%d (%d, %d): %.9g vs %.9g, bound %.3g", p.m, p.n, p.k, i, j, p.y[(size_t)i * p.n + j], sum,
                             gamma * abs_sum);
            }
        problem_free(&p);
    }
}

static void tiles_and_reference_same_bits(void **state) {
    (void)state;
    if (!m2d_dpbf16_cpu()) return; /* see kernel_matches_float64 */
    static const int shapes[][3] = {{1, 5, 3}, {25, 70, 515}, {13, 33, 2050}, {40, 96, 1024}, {400, 40, 130}}; /* 400: > one MC block */
    static const int kcs[] = {2, 64, 512, 1024, 1 << 20};
    uint64_t st = 2;
    for (size_t s = 0; s < M2D_ARRAY_LEN(shapes); s++) {
        problem p = problem_new(&st, shapes[s][0], shapes[s][1], shapes[s][2]);
        float *y2 = m2d_malloc(sizeof(float) * (size_t)p.m * p.n);
        for (size_t c = 0; c < M2D_ARRAY_LEN(kcs); c++) {
            int kc = kcs[c] > p.k ? p.k + (p.k & 1) : kcs[c];
            m2d_dpbf16_gemm(p.x, p.k, p.m, p.packed, p.n, p.k, kc, p.y, p.n, M2D_DPBF16_MR);
            for (int rows = 1; rows < M2D_DPBF16_MR; rows++) {
                m2d_dpbf16_gemm(p.x, p.k, p.m, p.packed, p.n, p.k, kc, y2, p.n, rows);
                assert_memory_equal(y2, p.y, sizeof(float) * (size_t)p.m * p.n);
            }
            for (int i = 0; i < p.m; i++)
                for (int j = 0; j < p.n; j++) {
                    float r = element_ref(&p, i, j, kc);
                    if (memcmp(&r, &p.y[(size_t)i * p.n + j], sizeof r) != 0)
                        fail_msg("%dx%dx%d kc %d (%d, %d): tile %.9g, one element %.9g", p.m, p.n, p.k, kc, i, j,
                                 p.y[(size_t)i * p.n + j], r);
                }
        }
        free(y2);
        problem_free(&p);
    }
}

/* Y of X·Wᵀ (+ Y when BETA) through m2d_gemm with kernel KERN, W stored as DT, optionally prepared
 * (computed into a Y with gaps between its rows, returned dense). */
static float *run_gemm(m2d_gemm_kernel kern, int nt, m2d_dtype dt, const float *wf, const float *x, const float *y0,
                       int m, int n, int k, int prepared, float beta, m2d_gemm_stats *stats) {
    static m2d_pool *pool;
    if (!pool) pool = m2d_pool_new(2);
    m2d_gemm_ctx *g;
    assert_int_equal(m2d_gemm_ctx_new(M2D_PREC_BF16, nt > 1 ? pool : NULL, &g), 0);
    m2d_gemm_set_kernel(g, kern);
    void *wd = m2d_malloc(m2d_dtype_size(dt) * (size_t)n * k);
    m2d_from_f32(dt, wf, (int64_t)n * k, wd);
    m2d_gemm_w w = m2d_gemm_weight(dt, wd, n, k, k);
    m2d_gemm_packed *pk = NULL;
    if (prepared) {
        assert_int_equal(m2d_gemm_prepare(g, &w, &pk), 0);
        assert_int_equal(m2d_gemm_packed_bytes(pk), m2d_gemm_prepare_bytes(g, &w));
        w = m2d_gemm_packed_rows(pk, 0, n);
    }
    int ldy = n + 3; /* Y with gaps between its rows (the own kernel stores into Y itself at beta 0) */
    float *yp = m2d_malloc(sizeof(float) * (size_t)m * ldy), *y = m2d_malloc(sizeof(float) * (size_t)m * n);
    for (int r = 0; r < m; r++) {
        memcpy(yp + (size_t)r * ldy, y0 + (size_t)r * n, sizeof(float) * (size_t)n);
        for (int c = n; c < ldy; c++) yp[(size_t)r * ldy + c] = -12345.0f;
    }
    assert_int_equal(m2d_gemm(g, x, k, m, &w, yp, ldy, beta), 0);
    for (int r = 0; r < m; r++) {
        memcpy(y + (size_t)r * n, yp + (size_t)r * ldy, sizeof(float) * (size_t)n);
        for (int c = n; c < ldy; c++) assert_true(yp[(size_t)r * ldy + c] == -12345.0f); /* the gaps untouched */
    }
    free(yp);
    *stats = m2d_gemm_get_stats(g);
    m2d_gemm_packed_free(pk);
    m2d_gemm_ctx_free(g);
    free(wd);
    return y;
}

static void own_equals_onednn_bit_for_bit(void **state) {
    (void)state;
    static const int shapes[][3] = {{1, 256, 2048}, {3, 17, 33}, {13, 300, 514}, {64, 700, 768}, {37, 256, 1026},
                                    {300, 64, 1024}, {5, 96, 3000}, {70, 512, 6144}};
    uint64_t st = 3;
    int own_ran = 0;
    for (size_t s = 0; s < M2D_ARRAY_LEN(shapes); s++) {
        int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
        float *wf = m2d_malloc(sizeof(float) * (size_t)n * k), *x = m2d_malloc(sizeof(float) * (size_t)m * k);
        float *y0 = m2d_malloc(sizeof(float) * (size_t)m * n);
        for (size_t i = 0; i < (size_t)n * k; i++) wf[i] = (float)tu_rand_normal(&st);
        for (size_t i = 0; i < (size_t)m * k; i++) x[i] = (float)tu_rand_normal(&st);
        for (size_t i = 0; i < (size_t)m * n; i++) y0[i] = (float)tu_rand_normal(&st);
        int eligible = m2d_gemm_own_eligible(k) > 0;
        for (int v = 0; v < 8; v++) {
            m2d_dtype dt = v & 1 ? M2D_F32 : M2D_BF16;
            int prepared = (v >> 1) & 1, nt = v & 4 ? 2 : 1;
            float beta = (float)(v & 1); /* beta 1 with the fp32 weights, 0 with bf16 */
            m2d_gemm_stats so, sd;
            float *yo = run_gemm(M2D_GEMM_OWN, nt, dt, wf, x, y0, m, n, k, prepared, beta, &so);
            float *yd = run_gemm(M2D_GEMM_ONEDNN, nt, dt, wf, x, y0, m, n, k, prepared, beta, &sd);
            if (memcmp(yo, yd, sizeof(float) * (size_t)m * n) != 0)
                fail_msg("%dx%dx%d %s%s beta %g threads %d: own and oneDNN differ", m, n, k, m2d_dtype_name(dt),
                         prepared ? " prepared" : "", beta, nt);
            assert_int_equal(so.own > 0, eligible);
            assert_int_equal(sd.own, 0);
            own_ran |= so.own > 0;
            free(yo), free(yd);
        }
        free(wf), free(x), free(y0);
    }
    /* not asserted: that some k is eligible (oneDNN's blocking on another CPU might be matched by no
     * chunking of the own kernel; then the own kernel never runs, which each shape above checks) */
    print_message("own kernel %s on these shapes\n", own_ran ? "ran and matched oneDNN" : "not eligible");
}

/* The choice: one line; the own kernel only where eligible. */
static void choice_is_reported(void **state) {
    (void)state;
    int own = -1;
    const char *line = m2d_gemm_bf16_choice(&own);
    print_message("bf16 kernel: %s\n", line);
    assert_true(strlen(line) > 0);
    assert_true(own == 0 || own == 1);
    if (own) assert_true(m2d_gemm_own_eligible(2048) > 0);
    if (!m2d_dpbf16_cpu()) assert_int_equal(m2d_gemm_own_eligible(2048), 0);
}

int main(void) {
    setenv("DNNL_MAX_CPU_ISA", "AVX512_CORE_BF16", 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(kernel_matches_float64),
        cmocka_unit_test(tiles_and_reference_same_bits),
        cmocka_unit_test(own_equals_onednn_bit_for_bit),
        cmocka_unit_test(choice_is_reported),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
