/* pool — the CPU backend's worker threads: parallel loops over independent work items.
 *
 * One pool per backend object (per engine); the GEMM module (gemm.h) runs its tiles on the pool of
 * the backend that owns it. Items are handed out dynamically, so the schedule varies from run to
 * run: callers make results independent of it (each item writes its own outputs; reductions over
 * items run afterwards, in a fixed order). A loop started from inside an item, of any pool, runs
 * serially on the calling worker, so kernels nest freely (MoE experts in parallel, each running a
 * GEMM that would otherwise split itself). */
#ifndef M2D_POOL_H
#define M2D_POOL_H

typedef struct m2d_pool m2d_pool;

/* A pool of N_THREADS workers (the caller counts as one; <= 0: m2d_default_threads()). */
m2d_pool *m2d_pool_new(int n_threads);
void m2d_pool_free(m2d_pool *p); /* NULL ok */
void m2d_pool_set_threads(m2d_pool *p, int n_threads);
int m2d_pool_threads(const m2d_pool *p); /* NULL: 1 */

/* fn(ctx, item) for item in [0, n_items) on up to m2d_pool_threads(p) threads, the caller
 * included; returns when all are done. NULL pool, one thread or a nested call: serial. */
void m2d_pool_for(m2d_pool *p, int n_items, void (*fn)(void *ctx, int item), void *ctx);

/* Inside an item: the worker's index in [0, threads) (per-worker scratch); 0 outside. */
int m2d_pool_worker(void);
/* Non-zero inside an item (loops started here run serially). */
int m2d_pool_nested(void);

#endif
