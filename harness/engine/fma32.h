/* fma32 — the project's own fp32 GEMM kernel on AVX2 + FMA, for gemm.c's sgemm path.
 *
 * C[m, n] = X[m, k] · Wᵀ, X fp32 and W fp32 or bf16, both row-major as stored, fp32 C. W is
 * packed inside, a panel of M2D_FMA32_NR output columns by a chunk of k at a time (each k's NR
 * weights side by side, fp32), just before the first block of rows reads it, and kept (per thread,
 * up to 256 columns) for the later blocks of rows.
 *
 * The reduction order is the contract: every element of C is ONE chain of fused multiply-adds
 * over k in order, starting from zero:
 *     c = 0;  for kk = 0 .. k-1:  c = fma(x[kk], w[kk], c)        (one rounding per step)
 * The blocking (row tiles, k chunks, panels) only decides when a chain pauses in C and resumes
 * from it, which does not change a bit, so the result for a row never depends on the other rows
 * of the call, on the column slice, on the thread count or on the CPU: IEEE 754 fixes fma's
 * result. A scalar loop of fmaf gives the same bits (tested). Its error bound is the usual
 * γ_k Σ|x w| of a recursive sum (Higham §3.1), as for sgemm.
 *
 * Why: OpenBLAS's blocking makes a row's bits depend on the number of rows in its call, so with
 * it a statistic computed on a block of tokens could not equal, bit for bit, the same statistic
 * computed token by token (calibration's fast path against its reference in test_calib, on CPUs
 * where oneDNN has no native kernel) and the engine could not hand a MoE hook its own routed
 * outputs there. Here it is as fast as OpenBLAS from 3 rows up (BENCHMARKS.md, "An own fp32 kernel
 * for AVX2"), and it packs W in L1-sized pieces straight from BF16 or F32 (no conversion pass), once
 * per call, and reads X where it is; up to 6 rows take a path without packing (1-2 rows: as fast as
 * OpenBLAS's dot products).
 *
 * The kernel needs AVX2 and FMA (m2d_fma32_cpu); it is compiled for them with function
 * attributes, so the rest of the project builds for any x86-64. */
#ifndef M2D_FMA32_H
#define M2D_FMA32_H

#include <stddef.h>
#include <stdint.h>

#define M2D_FMA32_NR 16 /* output columns per panel: two 8-lane fp32 accumulators per row */
#define M2D_FMA32_MR 6  /* rows per micro-tile: 12 accumulators, 2 weight vectors, 1 broadcast */

/* 1 when this CPU executes AVX2 and FMA (cpuid). */
int m2d_fma32_cpu(void);

/* C[m, n] (row stride ldc, written) = X · Wᵀ in the order above, W [n, k] row-major (row stride
 * ldw elements; fp32, or bf16 bit patterns when BF16, widened exactly). The caller guarantees
 * m2d_fma32_cpu(). */
void m2d_fma32_gemm(const float *x, int64_t ldx, int m, const void *w, int bf16, int64_t ldw, int n, int k, float *c,
                    int64_t ldc);

#endif
