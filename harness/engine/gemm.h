/* gemm — Y = X·Wᵀ (+ beta·Y) for the CPU backend, in fp32 (the own AVX2 kernel, or OpenBLAS sgemm,
 * where oneDNN has no native fp32 kernel or the weight is small) or bf16 (oneDNN matmul).
 *
 * Convention (the engine's, an nn.Linear): X [m, in] fp32 row-major with row stride ldx, W [out, in]
 * row-major with row stride ld (as stored in the checkpoint: F32 or BF16, also F16/F64), Y [m, out]
 * fp32 with row stride ldy. Strides are in elements.
 *
 * Precision (one per context):
 *   fp32  X and W in fp32 (W converted exactly from its stored dtype), fp32 accumulation: sgemm.
 *   bf16  X and W rounded to bf16 (round to nearest even; BF16 weights are used as stored), exact
 *         products, fp32 accumulation, fp32 Y. oneDNN's matmul (brgemm, AVX512-BF16 or AMX) does
 *         this; weights too small to amortise oneDNN's per-call cost, and CPUs without native
 *         bf16, run the same arithmetic through sgemm on bf16-rounded operands, so "bf16" means
 *         bf16 operands whichever kernel ran (results agree to fp32 summation order).
 *   auto  bf16 when oneDNN reports an ISA with native bf16 (avx512_core_bf16, avx512_core_amx),
 *         else fp32 (oneDNN would emulate bf16 at a fraction of the fp32 speed).
 *
 * Threads: every oneDNN primitive is created single-threaded (its OpenMP team never starts), and
 * a GEMM is split into column slices of the output (M2D_GEMM_SLICE wide, whatever the kernel) that
 * the caller's pool runs — one kind of thread on the machine. The slice boundaries do not depend
 * on the thread count, so neither do the results: both kernels' per-element summation order
 * depends on where a call's columns start and end (measured for OpenBLAS 0.3.21: splitting
 * 37x700x320 at column 384 changes 4 % of the elements), and fixed slices make it the same on 1
 * or 16 threads, nested or not, grouped or single (tested bit for bit); prepared or as stored too
 * where m2d_gemm_prepare_exact says so.
 * A view of some of W's rows (m2d_gemm_tensor_rows) that starts on a slice boundary gives the
 * whole matrix's bits for those rows when both views take oneDNN (the kernel is chosen per view,
 * by its size; oneDNN's result for a column does not depend on how many follow it in the slice).
 * Slicing costs sgemm <= 5 % against one call (bench_gemm). oneDNN tiles are also split into row
 * blocks of >= 64 rows when the slices alone give fewer than 4 work items (chosen by the shape
 * alone; where m2d_gemm_onednn_rows_independent holds, a row's result does not depend on them).
 *
 * Prepared weights: m2d_gemm_prepare copies W once into the layout the precision's kernel reads
 * fastest (bf16: oneDNN's blocked layout, same bytes as bf16; fp32: an fp32 copy) and reports the
 * bytes. Unprepared weights are read as stored (bf16: in place, no conversion; fp32 precision:
 * converted per call into scratch).
 *
 * OpenBLAS must be single-threaded while a context runs sgemm on the pool (the CPU backend's
 * begin/end bracket does this); otherwise OpenBLAS's own threads run under the pool's.
 *
 * Thread safety: one context may be used from several threads at once (the primitive cache and
 * the scratch pool are locked); tests run it concurrently. */
#ifndef M2D_GEMM_H
#define M2D_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include "base/tensor.h"
#include "engine/backend.h"
#include "engine/pool.h"

/* oneDNN's effective ISA on this CPU ("avx512_core_bf16", "avx2", ...; honours DNNL_MAX_CPU_ISA /
 * ONEDNN_MAX_CPU_ISA) and whether it computes bf16 natively. */
const char *m2d_gemm_isa_name(void);
int m2d_gemm_bf16_native(void);
/* Whether oneDNN has its brgemm fp32 matmul here (avx512_core and up). */
int m2d_gemm_fp32_onednn_native(void);
/* auto -> bf16 or fp32 as above; fp32 and bf16 are returned unchanged. */
m2d_precision m2d_gemm_resolve(m2d_precision p);

/* Rows x cols of X (row stride LDX) rounded to bf16 (nearest even, NaN kept quiet: the bits of
 * m2d_f32_to_bf16), 16 lanes at a time, into a dense [rows, cols] OUT: the bf16 bit patterns, or
 * (_f32) the rounded values as fp32; OUT may be X itself when LDX == cols. What "bf16 operands"
 * means here, for the GEMMs and for the CPU backend's attention. */
void m2d_bf16_rows(const float *x, int ldx, int rows, int cols, uint16_t *out);
void m2d_bf16_rows_f32(const float *x, int ldx, int rows, int cols, float *out);
/* Output columns per work item (a multiple of 64, oneDNN's column block; see Threads above). */
#define M2D_GEMM_SLICE 256

typedef struct m2d_gemm_ctx m2d_gemm_ctx;
typedef struct m2d_gemm_packed m2d_gemm_packed;

/* A weight W [out, in]: as stored (data, dtype, ld), or rows [p0, p0 + out) of a prepared weight
 * (packed != NULL; then only out, in and p0 are read). WHOLE: the elements of the whole matrix a
 * view of rows belongs to (0: out * in); the kernel is chosen by it, so every view of a tensor
 * meets the kernel of the whole (and of its prepared copy). */
typedef struct {
    m2d_dtype dtype;
    const void *data;
    int out, in;
    int64_t ld;
    const m2d_gemm_packed *packed;
    int p0;
    int64_t whole;
} m2d_gemm_w;

/* A weight view of a stored matrix [out, in] with row stride ld. */
m2d_gemm_w m2d_gemm_weight(m2d_dtype dtype, const void *data, int out, int in, int64_t ld);
/* Rows [r0, r0+n) of a 2-D checkpoint tensor (an nn.Linear weight; the LM head in vocab chunks). */
m2d_gemm_w m2d_gemm_tensor_rows(const m2d_tensor *t, int64_t r0, int n);
/* Rows [r0, r0+n) of a prepared weight: r0 a multiple of M2D_GEMM_SLICE, and n too unless the view
 * ends at the last row (checked at use); the same bits as those rows of the whole. */
m2d_gemm_w m2d_gemm_packed_rows(const m2d_gemm_packed *p, int r0, int n);

/* Context: precision resolved once (auto -> fp32|bf16); work runs on POOL (NULL: serial), which
 * must outlive the context. */
int m2d_gemm_ctx_new(m2d_precision p, m2d_pool *pool, m2d_gemm_ctx **out);
void m2d_gemm_ctx_free(m2d_gemm_ctx *g);
m2d_precision m2d_gemm_precision(const m2d_gemm_ctx *g);

/* Y[m, out] = X·Wᵀ + beta·Y (beta 0: Y is only written). Errors (-1, m2d_err): bad shapes or
 * strides, unsupported dtype, a packed weight of another context/precision. */
int m2d_gemm(m2d_gemm_ctx *g, const float *x, int ldx, int m, const m2d_gemm_w *w, float *y, int ldy,
             float beta);

/* Independent GEMMs (e.g. one per MoE expert on its gathered rows, or every expert on the same
 * rows for calibration) spread over the pool as one batch of work items. EXACT_ROWS: compute
 * every row independently of the other rows of its call wherever m2d_gemm_rows_independent_exact
 * says the module can, at some cost where oneDNN's kernels would not (see there). */
typedef struct {
    const float *x;
    int ldx, m;
    const m2d_gemm_w *w;
    float *y;
    int ldy;
    float beta;
    int exact_rows;
} m2d_gemm_group;
int m2d_gemm_grouped(m2d_gemm_ctx *g, const m2d_gemm_group *groups, int n_groups);

/* 1 when oneDNN's result for a row of X·Wᵀ at precision P (AUTO resolved) does not depend on the
 * other rows of its call (their number, their values): fp32 on avx512_core and up, bf16 on
 * avx512_core_bf16 without AMX (AMX's kernels change with the number of rows), each confirmed by a
 * probe at first use (cached); 0 where oneDNN lacks the precision's native kernels. */
int m2d_gemm_onednn_rows_independent(m2d_precision p);
/* 1 when a row of X·Wᵀ does not depend on the other rows of its call: W takes oneDNN here and
 * m2d_gemm_onednn_rows_independent holds, or an own kernel takes W (the bf16 one in oneDNN's place;
 * on the sgemm path the fp32 one, m2d_gemm_fp32_own); tested in test_gemm. OpenBLAS's blocking
 * depends on m, so 0 there. */
int m2d_gemm_rows_independent(const m2d_gemm_ctx *g, const m2d_gemm_w *w);
/* The same for a group with exact_rows set: also where oneDNN's kernels depend on the number of
 * rows (AMX bf16) but a probe at first use found that they do not once every call has at least
 * min_rows rows and at most kc terms per sum: such a call's rows are padded to min_rows and its
 * k split into chunks of kc whose products are added in order (bit for bit the same row in a
 * call of any size; tested in test_gemm). Not for prepared weights (their layout holds all of k). */
int m2d_gemm_rows_independent_exact(const m2d_gemm_ctx *g, const m2d_gemm_w *w);
/* What the probe found for the precision: 1 and *MIN_ROWS, *KC when exact_rows pads and splits
 * (0 where rows are independent without it, or where no padding and chunking makes them so). */
int m2d_gemm_exact_plan(m2d_precision p, int *min_rows, int *kc);
/* The plan exact_rows follows on G: the probe's, or the one forced on G (below) */
int m2d_gemm_plan_of(const m2d_gemm_ctx *g, int *min_rows, int *kc);
/* Tests: make exact_rows pad and split with MIN_ROWS and KC on this context whatever the CPU (0, 0:
 * the probe's plan again), so that the chunked path runs and is checked on every machine. */
void m2d_gemm_force_exact_plan(m2d_gemm_ctx *g, int min_rows, int kc);

/* Prepare W for this context's precision (see above); the handle is independent of the stored
 * data afterwards. Free with m2d_gemm_packed_free (before the context). */
int m2d_gemm_prepare(m2d_gemm_ctx *g, const m2d_gemm_w *w, m2d_gemm_packed **out);
size_t m2d_gemm_packed_bytes(const m2d_gemm_packed *p);
/* 1 when W's prepared copy gives the bits W gives as stored (found per precision, k and width of
 * W's last slice at first use by a probe of tens of milliseconds, cached), and the precision's
 * kernel kept them at two canary shapes too: everywhere measured but oneDNN's AMX bf16 kernels,
 * which block k otherwise for their own layout at many k past 768, so no bf16 weight is prepared
 * for them (gemm.c). The CPU backend prepares only such weights, so that results never depend on
 * what was made resident (backend.h). */
int m2d_gemm_prepare_exact(const m2d_gemm_ctx *g, const m2d_gemm_w *w);
/* 1 when P, a prepared copy of W (W as stored), is in the layout of the kernel W takes in G now;
 * 0 after a kernel chosen since (m2d_gemm_set_kernel): the copy then no longer gives W's bits, so
 * the caller reads W as stored. */
int m2d_gemm_packed_current(const m2d_gemm_ctx *g, const m2d_gemm_packed *p, const m2d_gemm_w *w);
/* What m2d_gemm_prepare(g, w) would take, without preparing (0 for a bad or prepared weight). */
size_t m2d_gemm_prepare_bytes(m2d_gemm_ctx *g, const m2d_gemm_w *w);
void m2d_gemm_packed_free(m2d_gemm_packed *p);

/* The kernel of a weight. AUTO (the default; measured, see gemm.c and BENCHMARKS.md): oneDNN for
 * weights of at least M2D_GEMM_DNNL_MIN_WEIGHT elements where oneDNN has a native kernel for the
 * precision (bf16: avx512_core_bf16 or AMX; fp32: avx512_core, its brgemm), sgemm for smaller
 * weights and elsewhere. By weight, not by batch size, so a weight always meets the same kernel.
 * In bf16 the own kernel (engine/dpbf16.h) takes oneDNN's place where it gives oneDNN's bits (see
 * m2d_gemm_bf16_choice) and the probe found it faster. SGEMM / ONEDNN / OWN force one (ONEDNN: any
 * size, still only where native; OWN: where the own kernel is eligible, else as ONEDNN); set before
 * preparing weights. Tests and benches compare the kernels with it. */
typedef enum { M2D_GEMM_AUTO, M2D_GEMM_SGEMM, M2D_GEMM_ONEDNN, M2D_GEMM_OWN } m2d_gemm_kernel;
/* Measured (bench_gemm's crossover table, BENCHMARKS.md): oneDNN's per-call cost (primitive lookup,
 * memory objects, packing) loses to sgemm on bf16-rounded operands only for weights of at most
 * ~64 x 64; from 64 x 64 up oneDNN wins at every batch size m >= 16 and ties below. The rule
 * depends on the weight alone (not on m), so a weight always takes the same kernel and a prepared
 * copy is in that kernel's layout: results never depend on the batch or on preparation. */
#define M2D_GEMM_DNNL_MIN_WEIGHT 4096
void m2d_gemm_set_kernel(m2d_gemm_ctx *g, m2d_gemm_kernel k);

/* The bf16 kernel in oneDNN's place, chosen once per process by measurement (dispatch by what this
 * CPU does, not by its vendor): where the CPU has AVX512-BF16 and oneDNN runs its avx512_core_bf16
 * brgemm (no AMX), a probe of a few milliseconds times both on as-stored slices of 32 and 256 rows
 * x 2048 x 256 and keeps the faster (the own kernel with the micro-tile height, 4, 8 or 12 rows, that
 * was fastest on a prepared 256 x 2048 x 256 product); the own kernel is only a candidate because it gives oneDNN's
 * bits (its k chunks are matched to oneDNN's per k at first use and checked on random data; a k
 * whose bits differ stays on oneDNN), so the choice changes the speed, never a result.
 * M2D_GEMM_BF16=own|onednn overrides the probe (benches). Returns a line for logs and benches,
 * e.g. "own vdpbf16ps kernel (probe: own 1.21 ms with 12-row tiles, oneDNN 1.40 ms; ...)". 1 in
 * *OWN when it won. */
const char *m2d_gemm_bf16_choice(int *own);
/* 1 when the own kernel may run for inner dimension K here (eligible CPU and oneDNN, and its k
 * chunks reproduce oneDNN's bits for K); the first call per K runs the check. */
int m2d_gemm_own_eligible(int k);

/* The sgemm path's kernel: 1 when it is the own fp32 kernel (engine/fma32.h: each element one chain
 * of fused multiply-adds over k in order, so a row's bits depend neither on the other rows nor on
 * the slice), for every number of rows, chosen by the instruction set (AVX2 and FMA) unless
 * M2D_GEMM_FP32=openblas; 0: OpenBLAS's sgemm, with dot products for 1-2 rows (stats.gemv). The
 * two give other bits, so the choice is never a measurement: it is fixed per CPU. */
int m2d_gemm_fp32_own(void);

/* Primitives kept in the context's cache (LRU; default 512, ~90 KB each). Tests shrink it to
 * exercise eviction while other threads still run an evicted primitive. */
void m2d_gemm_set_cache_capacity(m2d_gemm_ctx *g, int n);

/* What ran (for tests and benches): counts of GEMM slices by kernel, and primitives created. */
typedef struct {
    long sgemm, fma32, dnnl, own, gemv, primitives_created, cache_hits; /* sgemm: OpenBLAS; fma32: the own fp32
                                                                          * kernel; gemv: the sgemm path's few-row
                                                                          * dot products */
} m2d_gemm_stats;
m2d_gemm_stats m2d_gemm_get_stats(const m2d_gemm_ctx *g);

#endif
