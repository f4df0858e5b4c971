/* backend_cuda_impl — what backend_cuda.cu (the forward and calibration ops, the backend object)
 * shares with backend_cuda_train.cu (the training ops, m2d_backend_train_ops): buffers, sticky
 * errors, a weight's fp32 device values, the general fp32 GEMM, weight views. Host C++ only; each
 * .cu keeps its own kernels (no relocatable device code). */
#ifndef M2D_BACKEND_CUDA_IMPL_CUH
#define M2D_BACKEND_CUDA_IMPL_CUH

#include <cuda_runtime.h>

extern "C" {
#include "engine/backend.h"
}

struct cu_buf {
    void *p;
    size_t bytes;
    size_t cap; /* bytes of the device allocation (>= bytes: a reused one may be larger) */
};

static inline void *cu_ptr(const m2d_buf *b) { return ((const cu_buf *)b)->p; }
static inline float *cu_mat(const m2d_mat *m) { return (float *)cu_ptr(m->buf) + m->off; }
static inline unsigned cu_blocks(int64_t n, int threads) { return (unsigned)((n + threads - 1) / threads); }
/* threads of a one-block-a-row kernel over rows of D values */
static inline int cu_row_threads(int d) { return d >= 1024 ? 256 : d >= 256 ? 128 : 64; }

/* 1 when an earlier op failed (later ops are skipped until leave() reports it) */
int cu_failed(m2d_backend *be);
/* E checked: 0 and the failure kept (naming WHAT) unless cudaSuccess */
int cu_check(m2d_backend *be, cudaError_t e, const char *what);
/* after a kernel launch */
void cu_launched(m2d_backend *be, const char *kernel);
/* elements [first, first + n) of W as fp32 on the device (a scratch copy when W is streamed or
 * bf16: valid until the next op), or NULL after a failure */
const float *cu_weight_dev_f32(m2d_backend *be, const m2d_weight *w, int64_t first, int64_t n);
/* the same as bf16 (a weight view's kept copy inside a bracket, backend_cuda.cu view_bf16) */
const void *cu_weight_dev_bf16(m2d_backend *be, const m2d_weight *w, int64_t first, int64_t n);
/* the weights (views) have changed: their kept bf16 copies are stale (AdamW) */
void cu_weights_changed(m2d_backend *be);
/* column-major C[m, n] = alpha op(A) op(B) + beta C as cublasSgemm defines it (op(X) = X^T when
 * TX), fp32 C and accumulation; A and B fp32 (PREC FP32) or bf16 (BF16: exact products), through
 * cuBLASLt (CUBLAS_COMPUTE_32F, never TF32), k_tr_gemm where it has no algorithm or under the
 * knob gemm_naive; k = 0 scales C by beta */
void cu_gemm(m2d_backend *be, m2d_precision prec, bool ta, bool tb, int m, int n, int k, float alpha, const void *A,
             int lda, const void *B, int ldb, float beta, float *C, int ldc);
/* cu_gemm in fp32 */
void cu_sgemm(m2d_backend *be, bool ta, bool tb, int m, int n, int k, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc);
/* the naive kernel cu_gemm falls back to (backend_cuda_train.cu) */
void cu_gemm_naive(m2d_backend *be, m2d_precision prec, bool ta, bool tb, int m, int n, int k, float alpha,
                   const void *A, int lda, const void *B, int ldb, float beta, float *C, int ldc);

/* weight_view: fp32 rows x cols at element OFF of BUF, read in place by every op (backend_cuda.cu) */
m2d_weight *cu_weight_view(m2d_backend *be, m2d_buf *buf, size_t off, int64_t rows, int64_t cols);

/* the training ops (backend_cuda_train.cu) */
extern const m2d_backend_train_ops cu_train_ops;

#endif
