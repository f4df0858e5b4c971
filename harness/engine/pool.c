/* pool — parallel loops on a fresh set of pthreads per call (see pool.h).
 *
 * Threads are started per loop and joined at its end: a loop is a layer's GEMM, attention or MoE
 * block (tens of microseconds of start-up next to milliseconds of work), and no idle worker is
 * left spinning or sleeping between loops, next to OpenBLAS/oneDNN or other processes. */
#include "engine/pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "base/util.h"

#define MAX_THREADS 64

struct m2d_pool {
    int threads;
};

typedef struct {
    void (*fn)(void *, int);
    void *ctx;
    int n;
    atomic_int next;
} pool_job;

typedef struct {
    pool_job *job;
    int id;
} pool_arg;

static _Thread_local int worker_id;
static _Thread_local int in_item; /* inside an item: nested loops run serially */

m2d_pool *m2d_pool_new(int n_threads) {
    m2d_pool *p = m2d_calloc(1, sizeof *p);
    m2d_pool_set_threads(p, n_threads);
    return p;
}

void m2d_pool_free(m2d_pool *p) { free(p); }

void m2d_pool_set_threads(m2d_pool *p, int n_threads) {
    p->threads = M2D_MIN(n_threads > 0 ? n_threads : m2d_default_threads(), MAX_THREADS);
}

int m2d_pool_threads(const m2d_pool *p) { return p ? p->threads : 1; }
int m2d_pool_worker(void) { return worker_id; }
int m2d_pool_nested(void) { return in_item; }

static void run_items(pool_job *j) {
    for (int i; (i = atomic_fetch_add(&j->next, 1)) < j->n;) j->fn(j->ctx, i);
}

static void *pool_thread(void *arg) {
    pool_arg *a = arg;
    worker_id = a->id;
    in_item = 1;
    run_items(a->job);
    return NULL;
}

void m2d_pool_for(m2d_pool *p, int n_items, void (*fn)(void *ctx, int item), void *ctx) {
    pool_job j = {fn, ctx, n_items, 0};
    int nt = M2D_MIN(m2d_pool_threads(p), n_items);
    if (nt <= 1 || in_item) {
        for (int i = 0; i < n_items; i++) fn(ctx, i);
        return;
    }
    pthread_t tid[MAX_THREADS];
    pool_arg args[MAX_THREADS];
    int started = 0;
    for (int t = 1; t < nt; t++) {
        args[started] = (pool_arg){&j, started + 1};
        if (pthread_create(&tid[started], NULL, pool_thread, &args[started]) == 0) started++;
    }
    worker_id = 0;
    in_item = 1;
    run_items(&j); /* the calling thread works too; if no thread started it does everything */
    in_item = 0;
    for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);
}
