/* dpbf16 — see dpbf16.h for the layout and the reduction order.
 *
 * Loop nest: per block of MC rows, per panel of 32 columns, per k chunk, per block of up to MR rows,
 * one micro-tile:
 * MR x 32 fp32 accumulators (24 zmm registers at MR = 12) over the chunk's k-pairs, each pair one
 * 32-bit broadcast of X and two packed loads of W. The panel's chunk (32 x KC bf16: 32 KiB at
 * KC = 512) stays in L1/L2 across the row blocks. */
#include "engine/dpbf16.h"

#include <immintrin.h>
#include <string.h>

#define NR M2D_DPBF16_NR
#define MR M2D_DPBF16_MR
#define MC (16 * MR) /* rows of X per outer block: 192 x KC = 1024 bf16 is 384 KiB, within L2 */
#define TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

int m2d_dpbf16_cpu(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
}

static int n_panels(int n) { return (n + NR - 1) / NR; }
static int n_pairs(int k) { return (k + 1) / 2; }

size_t m2d_dpbf16_packed_bytes(int n, int k) {
    return (size_t)n_panels(n) * (size_t)n_pairs(k) * NR * 2 * sizeof(uint16_t);
}

/* Columns [j0, j1) of a panel, k-pairs [p0, p1), one 32-bit pair at a time. */
static void pack_scalar(const uint16_t *w, int64_t ldw, int j0, int j1, int p0, int p1, int k, uint16_t *panel) {
    for (int j = j0; j < j1; j++) {
        uint16_t *col = panel + (size_t)(j % NR) * 2;
        const uint16_t *row = w + (int64_t)j * ldw;
        for (int p = p0; p < p1; p++) {
            col[(size_t)p * NR * 2] = row[2 * p];
            if (2 * p + 1 < k) col[(size_t)p * NR * 2 + 1] = row[2 * p + 1];
        }
    }
}

/* 16 x 16 32-bit words transposed in registers: R[i] word q becomes R[q] word i. */
static inline __attribute__((always_inline)) TARGET void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) { /* r[4i + e], 128-bit lane L: rows 4i..4i+3, word 4L + e */
        r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int e = 0; e < 4; e++) { /* gather lane L of the four row groups into word 4L + e */
        __m512i a = _mm512_shuffle_i32x4(r[e], r[4 + e], 0x88), b = _mm512_shuffle_i32x4(r[e], r[4 + e], 0xdd);
        __m512i c = _mm512_shuffle_i32x4(r[8 + e], r[12 + e], 0x88), d = _mm512_shuffle_i32x4(r[8 + e], r[12 + e], 0xdd);
        t[e] = _mm512_shuffle_i32x4(a, c, 0x88);
        t[8 + e] = _mm512_shuffle_i32x4(a, c, 0xdd);
        t[4 + e] = _mm512_shuffle_i32x4(b, d, 0x88);
        t[12 + e] = _mm512_shuffle_i32x4(b, d, 0xdd);
    }
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

/* 16 whole columns [j0, j0 + 16) of a panel, k-pairs [0, 16 * blocks): 16 pairs of 16 columns per
 * transpose. */
TARGET static void pack16(const uint16_t *w, int64_t ldw, int j0, int blocks, uint16_t *panel) {
    uint16_t *dst = panel + (size_t)(j0 % NR) * 2;
    for (int pb = 0; pb < blocks; pb++) {
        __m512i r[16];
        for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512(w + (int64_t)(j0 + i) * ldw + 32 * pb);
        transpose16(r);
        for (int q = 0; q < 16; q++) _mm512_storeu_si512(dst + (size_t)(16 * pb + q) * NR * 2, r[q]);
    }
}

void m2d_dpbf16_pack(const uint16_t *w, int64_t ldw, int n, int k, uint16_t *out) {
    int kp = n_pairs(k);
    memset(out, 0, m2d_dpbf16_packed_bytes(n, k));
    for (int j0 = 0; j0 < n; j0 += 16) {
        uint16_t *panel = out + (size_t)(j0 / NR) * kp * NR * 2;
        int j1 = j0 + 16 < n ? j0 + 16 : n, blocks = j1 - j0 == 16 ? k / 32 : 0; /* partial groups: scalar */
        if (blocks) pack16(w, ldw, j0, blocks, panel);
        pack_scalar(w, ldw, j0, j1, 16 * blocks, kp, k, panel);
    }
}

/* Columns of a panel that exist (its mask per 16-lane half). */
static __mmask16 half_mask(int nc, int half) {
    int c = nc - 16 * half;
    return c >= 16 ? (__mmask16)0xFFFF : c <= 0 ? (__mmask16)0 : (__mmask16)((1u << c) - 1);
}

/* One micro-tile: R rows of X from X (row stride ldx, at the chunk's first k) times the panel's
 * chunk B (NP full pairs, then one lone k when ODD) into C (ADD: C += the chunk's sum, else
 * C = it). R is a constant at every call site (see tile), so the accumulators live in registers. */
static inline __attribute__((always_inline)) TARGET void micro(const uint16_t *x, int64_t ldx, const int R,
                                                               const uint16_t *b, int np, int odd, float *c,
                                                               int ldc, int nc, int add) {
    __m512 a0[MR], a1[MR];
#pragma GCC unroll 12
    for (int r = 0; r < R; r++) a0[r] = a1[r] = _mm512_setzero_ps();
    for (int p = 0; p < np; p++) {
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + (size_t)p * NR * 2);
        __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + (size_t)p * NR * 2 + NR);
#pragma GCC unroll 12
        for (int r = 0; r < R; r++) {
            int32_t pair;
            memcpy(&pair, x + r * ldx + 2 * p, sizeof pair);
            __m512bh xa = (__m512bh)_mm512_set1_epi32(pair);
            a0[r] = _mm512_dpbf16_ps(a0[r], xa, b0);
            a1[r] = _mm512_dpbf16_ps(a1[r], xa, b1);
        }
    }
    if (odd) { /* the last k alone: its partner is zero on both sides (X is not read past k) */
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + (size_t)np * NR * 2);
        __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + (size_t)np * NR * 2 + NR);
#pragma GCC unroll 12
        for (int r = 0; r < R; r++) {
            __m512bh xa = (__m512bh)_mm512_set1_epi32((int32_t)x[r * ldx + 2 * np]);
            a0[r] = _mm512_dpbf16_ps(a0[r], xa, b0);
            a1[r] = _mm512_dpbf16_ps(a1[r], xa, b1);
        }
    }
    __mmask16 m0 = half_mask(nc, 0), m1 = half_mask(nc, 1);
#pragma GCC unroll 12
    for (int r = 0; r < R; r++) {
        float *cr = c + (size_t)r * ldc;
        if (add) {
            a0[r] = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, cr), a0[r]);
            a1[r] = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, cr + 16), a1[r]);
        }
        _mm512_mask_storeu_ps(cr, m0, a0[r]);
        _mm512_mask_storeu_ps(cr + 16, m1, a1[r]);
    }
}

/* The micro-tile for R = 1..MR rows, each a specialisation with R constant. */
TARGET static void tile(const uint16_t *x, int64_t ldx, int R, const uint16_t *b, int np, int odd, float *c,
                        int ldc, int nc, int add) {
#define CASE(n) \
    case n: micro(x, ldx, n, b, np, odd, c, ldc, nc, add); break;
    switch (R) {
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8) CASE(9) CASE(10) CASE(11) CASE(12)
    default: break;
    }
#undef CASE
}

void m2d_dpbf16_gemm(const uint16_t *x, int64_t ldx, int m, const uint16_t *packed, int n, int k, int kc,
                     float *c, int ldc, int rows) {
    int kp = n_pairs(k), mr = rows >= 1 && rows <= MR ? rows : MR;
    if (kc < 2 || kc > k) kc = k + (k & 1); /* one chunk */
    for (int m0 = 0; m0 < m; m0 += MC) { /* X's block of rows for a chunk stays in L2 across the panels */
        int m1 = m - m0 < MC ? m : m0 + MC;
        for (int pn = 0; pn < n_panels(n); pn++) {
            const uint16_t *panel = packed + (size_t)pn * kp * NR * 2;
            int nc = n - pn * NR < NR ? n - pn * NR : NR;
            for (int k0 = 0; k0 < k; k0 += kc) {
                int len = k - k0 < kc ? k - k0 : kc;
                const uint16_t *b = panel + (size_t)(k0 / 2) * NR * 2;
                for (int r0 = m0; r0 < m1; r0 += mr)
                    tile(x + (int64_t)r0 * ldx + k0, ldx, m1 - r0 < mr ? m1 - r0 : mr, b, len / 2, len & 1,
                         c + (size_t)r0 * ldc + pn * NR, ldc, nc, k0 > 0);
            }
        }
    }
}
