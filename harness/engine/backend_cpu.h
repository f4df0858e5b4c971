/* backend_cpu — what the CPU backend's training ops (backend_cpu_train.c) share with its forward
 * ops (backend_cpu.c and its op files): host pointers of buffers and matrices, the backend's
 * thread pool, its threaded sgemm and its weight views. Internal to the "cpu" backend; nothing else includes it. */
#ifndef M2D_BACKEND_CPU_H
#define M2D_BACKEND_CPU_H

#include "engine/backend.h"

/* host pointer of a buffer, of a matrix's first element */
void *m2d_cpu_ptr(const m2d_buf *b);
float *m2d_cpu_mat(const m2d_mat *m);
int m2d_cpu_threads(const m2d_backend *be);
/* fn(ctx, item) for item in [0, n) on the backend's threads (nested calls run serially) */
void m2d_cpu_parallel_for(const m2d_backend *be, int n, void (*fn)(void *ctx, int item), void *ctx);
/* fp32 view of elements [first, first+n) of W (in place, resident, or converted into the
 * backend's scratch, valid until the next op) */
const float *m2d_cpu_weight_rows(m2d_backend *be, const m2d_weight *w, int64_t first, int64_t n);
/* a weight handle over host fp32 memory DATA (rows x cols); freed by the backend's weight_free */
m2d_weight *m2d_cpu_weight_over(const float *data, int64_t rows, int64_t cols);

/* 1 when make_resident made W a prepared copy (0: as stored; tests) */
int m2d_cpu_weight_prepared(const m2d_weight *w);

/* the GEMM module's context for precision P (FP32 or BF16) on the backend's threads */
struct m2d_gemm_ctx *m2d_cpu_gemm(m2d_backend *be, m2d_precision p);
/* keep the failure m2d_err just set: the outermost leave reports it, later ops are skipped */
void m2d_cpu_fail(m2d_backend *be);
int m2d_cpu_failed(m2d_backend *be);

extern const m2d_backend_train_ops m2d_cpu_train_ops; /* backend_cpu_train.c */
/* The training ops' state kept between ops (backend_cpu_train.c: bf16 transposed weights and
 * scratch): its slot in the backend, NULL outside an enter/leave bracket (nothing derived from the
 * weights may be used there); marked stale (its memory kept for the next step) at the outermost
 * leave, and freed with the backend. */
void **m2d_cpu_train_state(m2d_backend *be);
void m2d_cpu_train_state_stale(void *state);
void m2d_cpu_train_state_free(void *state);

#endif
