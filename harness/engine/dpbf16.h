/* dpbf16 — the project's own bf16 GEMM micro-kernel on AVX512-BF16 (vdpbf16ps), for gemm.c.
 *
 * C[m, n] = X[m, k] · Wᵀ with X and W bf16 bit patterns and fp32 results, W taken from a packed
 * copy (panels of M2D_DPBF16_NR output columns, each k-pair of a column's two bf16 side by side:
 * the operand layout of vdpbf16ps). The reduction order is part of the contract, so that the
 * result can equal oneDNN's bit for bit (gemm.c checks that at first use, per k):
 *   - k is cut into chunks of KC (even; the last one shorter); a chunk sums its k-pairs in order
 *     with vdpbf16ps into an accumulator that starts at zero;
 *   - the chunks' sums are added in order (C = s0, C = C + s1, ...).
 * oneDNN 2.6's AVX512-BF16 brgemm sums the same way (its K blocks: whole for k <= 512, then 512
 * or 1024 long; measured in gemm.c's probe, not assumed). The row and column blocking of this
 * kernel does not touch the per-element order, so every tile shape gives the same bits (tested).
 *
 * The kernel needs a CPU with AVX512-BF16 (m2d_dpbf16_cpu); it is compiled for it with function
 * attributes, so the rest of the project builds for any x86-64. */
#ifndef M2D_DPBF16_H
#define M2D_DPBF16_H

#include <stddef.h>
#include <stdint.h>

#define M2D_DPBF16_NR 32 /* output columns per panel: two 16-lane fp32 accumulators per row */

/* 1 when this CPU executes vdpbf16ps (cpuid; DNNL_MAX_CPU_ISA does not change it). */
int m2d_dpbf16_cpu(void);

/* Bytes of the packed copy of W [n, k]. */
size_t m2d_dpbf16_packed_bytes(int n, int k);
/* Pack W (n rows of k bf16, row stride ldw elements) into OUT (m2d_dpbf16_packed_bytes; 64-byte
 * aligned for speed). Columns past n and the odd k's partner are zero. */
void m2d_dpbf16_pack(const uint16_t *w, int64_t ldw, int n, int k, uint16_t *out);

/* C[m, n] (row stride ldc, fp32, written) = X (row stride ldx elements) · Wᵀ in KC-long chunks of k
 * as above. The caller guarantees m2d_dpbf16_cpu(). ROWS: the micro-tile's rows, 1..M2D_DPBF16_MR
 * (0: the default); every value gives the same bits. */
#define M2D_DPBF16_MR 12
void m2d_dpbf16_gemm(const uint16_t *x, int64_t ldx, int m, const uint16_t *packed, int n, int k, int kc,
                     float *c, int ldc, int rows);

#endif
