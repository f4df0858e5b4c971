/* backend — the compute primitives the engine is written against (CPU: OpenBLAS + pthreads).
 *
 * All activations are fp32, row-major, with explicit leading dimensions (elements) so the
 * engine can address one head or one block of a wider matrix without copying. A second
 * backend would implement these same functions. Every fast kernel here has an obviously
 * correct counterpart in tests/test_engine.c (naive loops) that the tests compare against. */
#ifndef M2D_BACKEND_H
#define M2D_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "base/tensor.h"

/* Threads for the backend's parallel loops (GEMMs are split across them). */
void m2d_be_set_threads(int n_threads);
int m2d_be_threads(void);
/* Bracket a batch of backend calls: OpenBLAS is made single-threaded inside (our threads split
 * the GEMMs; its own pool next to ours only spins in sched_yield) and restored afterwards, so
 * other code's direct cblas/LAPACKE calls keep OpenBLAS's threading. Every m2d_engine_* compute
 * call does this. Measured: same speed as leaving OpenBLAS single-threaded for good.
 *   int saved = m2d_be_begin(); ...; m2d_be_end(saved); */
int m2d_be_begin(void);
void m2d_be_end(int saved);

/* Run fn(ctx, item) for item in [0, n_items) on up to m2d_be_threads() pthreads
 * (items are handed out dynamically; fn must be safe to run concurrently). Called from inside
 * an item, it runs serially on the calling worker (so kernels can be nested freely). */
void m2d_be_parallel_for(int n_items, void (*fn)(void *ctx, int item), void *ctx);

/* Index of the calling worker inside m2d_be_parallel_for: 0 (the caller) .. threads-1, so
 * work items can use per-worker scratch. */
int m2d_be_worker(void);

/* Single-threaded conversion (inside a parallel worker). */
void m2d_be_convert_1t(m2d_dtype t, const void *src, int64_t first, int64_t n, float *dst);

/* Convert n elements of a stored weight (F32/F16/BF16/F64) to fp32, in parallel chunks. */
void m2d_be_convert(m2d_dtype t, const void *src, int64_t first, int64_t n, float *dst);

/* y[n, out] = x[n, in] · W^T + beta * y, W is [out, in] row-major fp32 (an nn.Linear weight).
 * ldx/ldw/ldy are row strides in elements. fp32 accumulation (cblas_sgemm), split by output
 * columns (or rows) over the threads (call it between m2d_be_begin/end, or OpenBLAS's own
 * threads run underneath ours: correct, but oversubscribed). */
void m2d_be_matmul_wt(const float *x, int ldx, int n, int in, const float *w, int ldw, int out,
                      float *y, int ldy, float beta);

/* RMSNorm over the last dim: y = x / sqrt(mean(x^2) + eps) * w (sum of squares in double).
 * x and y may alias. rows rows of length d, with row strides ldx / ldy. */
void m2d_be_rmsnorm(const float *x, int ldx, const float *w, int rows, int d, double eps, float *y, int ldy);

/* Rotary embedding, rotate-half (HF/Qwen): for i < hd/2, with f = pos * theta^(-2i/hd),
 * (a, b) = (x[i], x[i+hd/2]) -> (a cos f - b sin f, b cos f + a sin f). Angles in double.
 * x is [n, n_heads * hd] with row stride ldx; pos[n] positions. */
void m2d_be_rope(float *x, int ldx, int n, int n_heads, int hd, const int *pos, double theta);

/* In-place softmax of one row (max-subtracted, sum in double). */
void m2d_be_softmax(float *x, int n);

/* h = silu(g) * u elementwise (silu(g) = g / (1 + exp(-g))). h may alias g or u. */
void m2d_be_swiglu(const float *g, const float *u, int64_t n, float *h);

/* Top-k of p[E]: indices in descending value; equal values -> the lower index first. */
void m2d_be_topk(const float *p, int E, int k, int32_t *idx);

/* Causal grouped-query attention for one segment of nq query rows.
 *   q   [nq, n_heads*hd]  (row stride ldq; already normed and rotated)
 *   ks, vs [nq, n_kv*hd]  this segment's own keys/values (row stride ldk)
 *   kp, vp                np prefix keys/values visible to every row: head g's rows are
 *                         kp + g*p_head_stride, [np, hd] contiguous (a KV cache); np may be 0
 *   out [nq, n_heads*hd]  (row stride ldo)
 * Row i attends to all np prefix keys and to segment keys 0..i; scale 1/sqrt(hd); query head h
 * uses kv head h / (n_heads / n_kv). Scores and softmax in fp32 with max subtraction. */
void m2d_be_attention(const float *q, int ldq, const float *ks, const float *vs, int ldk, int nq,
                      const float *kp, const float *vp, size_t p_head_stride, int np,
                      int n_heads, int n_kv, int hd, float *out, int ldo);
/* Segments of at least ROWS query rows (default 64) use the GEMM formulation (per head
 * S = QK^T, masked softmax, O = PV with sgemm); shorter ones use the per-row dot-product
 * kernel. Both are tested against naive loops; tests switch with this. */
void m2d_be_set_attention_gemm_min_rows(int rows);

#endif
