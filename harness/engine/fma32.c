/* fma32 — see fma32.h for the layout and the reduction order.
 *
 * Loop nest: per block of NC columns, per chunk of KC k, per block of up to MC_MAX rows, per panel
 * of 16 columns: for the first block of rows the panel's chunk is packed ([k][16] fp32, 16 KiB: L1)
 * from W's rows just before it is used and, when there are later blocks of rows, kept for them in
 * a buffer of up to NC x KC (256 KiB: L2, one per call); then per block of up to MR rows one
 * micro-tile: MR x 16 fp32 accumulators (12 ymm registers) that start from C (or zero on the first
 * chunk) and take the chunk's k in order, each k two loads of the packed chunk and one broadcast
 * of X per row. X's block of rows x KC stays in L2 across the panels. So W is read and packed once
 * per call (it was once per block of rows: three times for a 511-row LM head slice). */
#include "engine/fma32.h"

#include "base/tensor.h"
#include "base/util.h"

#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NR M2D_FMA32_NR
#define MR M2D_FMA32_MR
#define KC 256
#define NC 256 /* columns whose packed chunks are kept for the later blocks of rows */
#define MC_MAX (40 * MR) /* X's block of rows: 240 x KC fp32 is 240 KiB, within L2 */
#define TARGET __attribute__((target("avx2,fma")))

int m2d_fma32_cpu(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

static int n_panels(int n) { return (n + NR - 1) / NR; }

static inline float widen(const void *w, int bf16, int64_t i) {
    return bf16 ? m2d_bf16_to_f32(((const uint16_t *)w)[i]) : ((const float *)w)[i];
}

/* 8 values of row R from element KK, as fp32 */
static inline __attribute__((always_inline)) TARGET __m256 load_row8(const void *w, int bf16, int64_t at) {
    if (!bf16) return _mm256_loadu_ps((const float *)w + at);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + at));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* 8 x 8 floats transposed in registers: R[i] lane q becomes R[q] lane i. */
static inline __attribute__((always_inline)) TARGET void transpose8(__m256 r[8]) {
    __m256 t[8], s[8];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) { /* rows 4h..4h+3 */
        s[4 * h] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0x44);
        s[4 * h + 1] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0xEE);
        s[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
        s[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xEE);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(s[i], s[4 + i], 0x20);
        r[4 + i] = _mm256_permute2f128_ps(s[i], s[4 + i], 0x31);
    }
}

/* Columns [j0, j0 + 16) of W, k [k0, k0 + 8 * blocks), into the panel chunk B ([k][16]): per 8 k,
 * two transposes of 8 x 8, so that each 64-byte line of B is written whole. */
TARGET static void pack16(const void *w, int bf16, int64_t ldw, int j0, int k0, int blocks, float *b) {
    for (int bl = 0; bl < blocks; bl++)
        for (int h = 0; h < 2; h++) {
            __m256 r[8];
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) r[i] = load_row8(w, bf16, (int64_t)(j0 + 8 * h + i) * ldw + k0 + 8 * bl);
            transpose8(r);
#pragma GCC unroll 8
            for (int q = 0; q < 8; q++) _mm256_store_ps(b + (size_t)(8 * bl + q) * NR + 8 * h, r[q]);
        }
}

/* The chunk of panel PN (k [k0, k0 + kn)) into B ([kn][16], 32-byte aligned); columns past n zero */
static void pack_chunk(const void *w, int bf16, int64_t ldw, int n, int pn, int k0, int kn, float *b) {
    int j0 = pn * NR, nc = n - j0 < NR ? n - j0 : NR, blocks = nc == NR ? kn / 8 : 0;
    if (blocks) pack16(w, bf16, ldw, j0, k0, blocks, b);
    for (int j = 0; j < NR; j++)
        for (int kk = 8 * blocks; kk < kn; kk++)
            b[(size_t)kk * NR + j] = j < nc ? widen(w, bf16, (int64_t)(j0 + j) * ldw + k0 + kk) : 0.0f;
}

/* The rows of W that pack_chunk(pn, k0, kn) will read, asked for ahead of time: W streams from memory
 * once per call (the LM head: 151,936 rows), and sixteen short rows a chunk are too many streams for
 * the hardware's prefetcher to find while the row tiles run. */
static void prefetch_chunk(const void *w, int bf16, int64_t ldw, int n, int pn, int k0, int kn) {
    size_t es = bf16 ? sizeof(uint16_t) : sizeof(float);
    for (int j = pn * NR; j < n && j < (pn + 1) * NR; j++) {
        const char *row = (const char *)w + ((size_t)j * ldw + k0) * es;
        for (size_t at = 0; at < kn * es; at += 64) __builtin_prefetch(row + at, 0, 2);
    }
}

/* Lanes of a panel's half that exist (for masked loads and stores of a last, narrower panel) */
static inline __attribute__((always_inline)) TARGET __m256i half_mask(int nc, int half) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(nc - 8 * half), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* One micro-tile: R rows of X (row stride ldx, at the chunk's first k) times the panel's chunk B
 * (KN k) continuing the chains held in C (RESUME) or starting them (C is then only written). R is
 * a constant at every call site (see tile), so the accumulators live in registers. */
static inline __attribute__((always_inline)) TARGET void micro(const float *x, int64_t ldx, const int R,
                                                               const float *b, int kn, float *c, int64_t ldc,
                                                               int nc, int resume) {
    __m256 a0[MR], a1[MR];
    int whole = nc == NR; /* the masks are made where used: live across the k loop they spill an accumulator */
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        const float *cr = c + r * ldc;
        if (!resume) {
            a0[r] = a1[r] = _mm256_setzero_ps();
        } else if (whole) {
            a0[r] = _mm256_loadu_ps(cr);
            a1[r] = _mm256_loadu_ps(cr + 8);
        } else {
            a0[r] = _mm256_maskload_ps(cr, half_mask(nc, 0));
            a1[r] = _mm256_maskload_ps(cr + 8, half_mask(nc, 1));
        }
    }
#pragma GCC unroll 4 /* the loop's own adds and compares, a quarter as often */
    for (int p = 0; p < kn; p++) {
        __m256 b0 = _mm256_load_ps(b + (size_t)p * NR), b1 = _mm256_load_ps(b + (size_t)p * NR + 8);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            __m256 xa = _mm256_broadcast_ss(x + r * ldx + p);
            a0[r] = _mm256_fmadd_ps(xa, b0, a0[r]);
            a1[r] = _mm256_fmadd_ps(xa, b1, a1[r]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        float *cr = c + r * ldc;
        if (whole) {
            _mm256_storeu_ps(cr, a0[r]);
            _mm256_storeu_ps(cr + 8, a1[r]);
        } else {
            _mm256_maskstore_ps(cr, half_mask(nc, 0), a0[r]);
            _mm256_maskstore_ps(cr + 8, half_mask(nc, 1), a1[r]);
        }
    }
}

/* The micro-tile for R = 1..MR rows, each a specialisation with R constant. */
TARGET static void tile(const float *x, int64_t ldx, int R, const float *b, int kn, float *c, int64_t ldc, int nc,
                        int resume) {
#define CASE(n) \
    case n: micro(x, ldx, n, b, kn, c, ldc, nc, resume); break;
    switch (R) {
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6)
    default: break;
    }
#undef CASE
}

/* R (constant: 1..MR) rows, eight columns at a time, without packing: per 8 k, W's 8 rows are
 * transposed in registers and the 8 k are taken in order by the R chains of each column (lanes:
 * columns). Up to MR rows this beats packing, which stores and reloads every weight for a product
 * that uses it a few times (BENCHMARKS.md, "The own fp32 kernel packs W once per call"). */
static inline __attribute__((always_inline)) TARGET void few_rows_r(const float *x, int64_t ldx, const int R,
                                                                    const void *w, int bf16, int64_t ldw, int n,
                                                                    int k, float *c, int64_t ldc) {
    int j0 = 0;
    for (; j0 + 8 <= n; j0 += 8) {
        __m256 a[MR];
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) a[r] = _mm256_setzero_ps();
        int k0 = 0;
        for (; k0 + 8 <= k; k0 += 8) {
            __m256 t[8];
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) t[i] = load_row8(w, bf16, (int64_t)(j0 + i) * ldw + k0);
            transpose8(t);
#pragma GCC unroll 8
            for (int q = 0; q < 8; q++)
#pragma GCC unroll 6
                for (int r = 0; r < R; r++)
                    a[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(x + r * ldx + k0 + q), t[q], a[r]);
        }
        for (; k0 < k; k0++) { /* the last k % 8, one k at a time */
            float v[8];
            for (int i = 0; i < 8; i++) v[i] = widen(w, bf16, (int64_t)(j0 + i) * ldw + k0);
            __m256 wk = _mm256_loadu_ps(v);
#pragma GCC unroll 6
            for (int r = 0; r < R; r++) a[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(x + r * ldx + k0), wk, a[r]);
        }
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) _mm256_storeu_ps(c + r * ldc + j0, a[r]);
    }
    for (; j0 < n; j0++) /* the last n % 8 columns, one chain each */
        for (int r = 0; r < R; r++) {
            float acc = 0.0f;
            for (int kk = 0; kk < k; kk++) acc = fmaf(x[r * ldx + kk], widen(w, bf16, (int64_t)j0 * ldw + kk), acc);
            c[r * ldc + j0] = acc;
        }
}

/* 1..MR rows, each count a specialisation with R constant (the accumulators stay in registers) */
TARGET static void few_rows(const float *x, int64_t ldx, int m, const void *w, int bf16, int64_t ldw, int n, int k,
                            float *c, int64_t ldc) {
#define CASE(r) \
    case r: few_rows_r(x, ldx, r, w, bf16, ldw, n, k, c, ldc); break;
    switch (m) {
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6)
    default: break;
    }
#undef CASE
}

/* Rows per outer block: as many as fit MC_MAX, the blocks equal in size (a multiple of MR) */
static int block_rows(int m) {
    int nb = (m + MC_MAX - 1) / MC_MAX, mc = (m + nb - 1) / nb;
    return (mc + MR - 1) / MR * MR;
}

void m2d_fma32_gemm(const float *x, int64_t ldx, int m, const void *w, int bf16, int64_t ldw, int n, int k, float *c,
                    int64_t ldc) {
    if (k == 0) { /* no k: every chain is its zero start */
        for (int r = 0; r < m; r++) memset(c + (int64_t)r * ldc, 0, sizeof(float) * (size_t)n);
        return;
    }
    if (m <= MR) {
        few_rows(x, ldx, m, w, bf16, ldw, n, k, c, ldc);
        return;
    }
    int mc = block_rows(m);
    /* one block of rows: one panel's chunk at a time, in L1; more: every chunk of NC columns kept */
    float chunk[KC * NR] __attribute__((aligned(32)));
    int kc = M2D_MIN(k, KC); /* the longest chunk: the stride of the kept panels */
    float *kept = mc < m ? m2d_malloc64(sizeof(float) * (size_t)n_panels(M2D_MIN(n, NC)) * NR * kc) : NULL;
    for (int j0 = 0; j0 < n; j0 += NC) {
        int jn = M2D_MIN(NC, n - j0), np = n_panels(jn);
        const void *wj = bf16 ? (const void *)((const uint16_t *)w + j0 * ldw)
                              : (const void *)((const float *)w + j0 * ldw);
        for (int k0 = 0; k0 < k; k0 += KC) {
            int kn = M2D_MIN(KC, k - k0);
            for (int m0 = 0; m0 < m; m0 += mc) {
                int m1 = M2D_MIN(m, m0 + mc);
                for (int pn = 0; pn < np; pn++) {
                    float *b = kept ? kept + (size_t)pn * kc * NR : chunk;
                    if (m0 == 0) { /* packed just in time for the first block of rows, kept for the rest */
                        pack_chunk(wj, bf16, ldw, jn, pn, k0, kn, b);
                        if (pn + 1 < np) prefetch_chunk(wj, bf16, ldw, jn, pn + 1, k0, kn);
                        else if (k0 + KC < k) prefetch_chunk(wj, bf16, ldw, jn, 0, k0 + KC, M2D_MIN(KC, k - k0 - KC));
                    }
                    int nc = M2D_MIN(NR, jn - pn * NR);
                    for (int r0 = m0; r0 < m1; r0 += MR)
                        tile(x + (int64_t)r0 * ldx + k0, ldx, M2D_MIN(MR, m1 - r0), b, kn,
                             c + (int64_t)r0 * ldc + j0 + pn * NR, ldc, nc, k0 > 0);
                }
            }
        }
    }
    free(kept);
}
