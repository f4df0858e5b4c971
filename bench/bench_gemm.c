/* bench_gemm — the GEMM module (harness/engine/gemm.c) against the in-process yardsticks.
 *
 * Prints, in one run: OpenBLAS sgemm peak (n = 2048, its own 2 threads) and oneDNN's bf16 matmul
 * peak (2048³, its own OpenMP team of 2), then issue 13's shapes and the tiny teacher's through the
 * module (pool of 2 pthreads, single-threaded kernels) in fp32 (sgemm), bf16 as stored, bf16
 * prepared, and bf16 arithmetic through sgemm (the small-shape fallback), as GFLOP/s and fraction
 * of the yardstick of their precision; the MoE layer (128 experts, cold weights) and calibration
 * (all experts on 256 tokens) as grouped GEMMs; and what an OpenMP team next to our pthreads costs.
 * Usage: bench_gemm [--quick] (quick: no LM head / no 30B-sized MoE and calibration rows). */
#include <cblas.h>
#include <dnnl.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/backend.h"
#include "engine/blas_core.h"
#include "engine/gemm.h"
#include "base/util.h"
#include "yardstick.h"

#define THREADS 2

static m2d_pool *pool; /* THREADS workers, the module's and the interference measurement's */

static uint64_t rng = 88172645463325252ull;
static uint32_t next_u32(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

/* bf16 weights ~ ±[2^-7, 2^-6): random sign and mantissa */
static uint16_t *rand_bf16(size_t n) {
    uint16_t *w = m2d_malloc(n * sizeof *w);
    for (size_t i = 0; i < n; i++) {
        uint32_t r = next_u32();
        w[i] = (uint16_t)(((r >> 7) & 1) << 15 | 0x3c00 | (r & 0x7f));
    }
    return w;
}

static float *rand_f32(size_t n) {
    float *x = m2d_malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = (float)(next_u32() % 2001) * 1e-3f - 1.0f;
    return x;
}

/* best time of RUNS calls of fn after one warm-up call; at least MIN_S seconds in all */
static double best_time(void (*fn)(void *), void *arg, double min_s) {
    fn(arg);
    double best = 1e30, t_all = m2d_now();
    for (int r = 0; r < 3 || m2d_now() - t_all < min_s; r++) {
        double t0 = m2d_now();
        fn(arg);
        double t = m2d_now() - t0;
        if (t < best) best = t;
        if (r > 200) break;
    }
    return best;
}

/* ---------------------------------------------------------------- yardsticks */

typedef struct { int n; float *a, *b, *c; } sg_arg;
static void sg_run(void *p) {
    sg_arg *s = p;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s->n, s->n, s->n, 1, s->a, s->n, s->b, s->n, 0, s->c, s->n);
}

static double sgemm_peak(void) {
    openblas_set_num_threads(THREADS);
    sg_arg s = {2048, rand_f32(2048 * 2048), rand_f32(2048 * 2048), rand_f32(2048 * 2048)};
    double t = best_time(sg_run, &s, 1.0);
    free(s.a); free(s.b); free(s.c);
    openblas_set_num_threads(1);
    return 2.0 * 2048 * 2048 * 2048 / t / 1e9;
}

typedef struct { dnnl_primitive_t p; dnnl_stream_t st; dnnl_exec_arg_t args[3]; } dn_arg;
static void dn_run(void *p) {
    dn_arg *d = p;
    dnnl_primitive_execute(d->p, d->st, 3, d->args);
    dnnl_stream_wait(d->st);
}

/* oneDNN's own matmul Y[m, n] = X[m, k] · B[k, n] (X and B of type T, Y fp32) on its OpenMP team of
 * THREADS, B in layout WTAG (format_tag_any: oneDNN's choice); operands at X/W/Y, or allocated and
 * filled when NULL. The implementation name goes to IMPL. r->p is NULL when oneDNN has none.
 * oneDNN also reads the calling thread's OpenMP thread count when it executes: the caller keeps it
 * at THREADS while it runs the primitive (dn_free sets it back to 1). */
static void dn_team(dnnl_engine_t eng, int m, int n, int k, dnnl_data_type_t t, dnnl_format_tag_t wtag, void *x,
                    void *w, float *y, dn_arg *r, char *impl, size_t cap) {
    omp_set_num_threads(THREADS);
    dnnl_memory_desc_t md[3];
    dnnl_dims_t ad = {m, k}, bd = {k, n}, cd = {m, n};
    dnnl_memory_desc_init_by_tag(&md[0], 2, ad, t, dnnl_ab);
    dnnl_memory_desc_init_by_tag(&md[1], 2, bd, t, wtag);
    dnnl_memory_desc_init_by_tag(&md[2], 2, cd, dnnl_f32, dnnl_ab);
    dnnl_matmul_desc_t mm;
    dnnl_matmul_desc_init(&mm, &md[0], &md[1], NULL, &md[2]);
    dnnl_primitive_desc_t pd;
    r->p = NULL;
    if (dnnl_primitive_desc_create(&pd, &mm, NULL, eng, NULL) == dnnl_success) {
        const char *name = "?";
        dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name);
        snprintf(impl, cap, "%s", name);
        md[1] = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
        dnnl_primitive_create(&r->p, pd);
        dnnl_primitive_desc_destroy(pd);
        dnnl_stream_create(&r->st, eng, dnnl_stream_default_flags);
        void *ptr[3] = {x, w, y};
        int tags[3] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST};
        for (int i = 0; i < 3; i++) {
            dnnl_memory_t mem;
            dnnl_memory_create(&mem, &md[i], eng, ptr[i] ? ptr[i] : DNNL_MEMORY_ALLOCATE);
            if (!ptr[i]) {
                void *h;
                dnnl_memory_get_data_handle(mem, &h);
                memset(h, 0x3c, dnnl_memory_desc_get_size(&md[i]));
            }
            r->args[i] = (dnnl_exec_arg_t){tags[i], mem};
        }
    }
}

static void dn_free(dn_arg *r) {
    omp_set_num_threads(1);
    if (!r->p) return;
    for (int i = 0; i < 3; i++) dnnl_memory_destroy(r->args[i].memory);
    dnnl_primitive_destroy(r->p);
    dnnl_stream_destroy(r->st);
}

/* oneDNN's own n³ matmul in type T, weights in its preferred layout, OpenMP team of THREADS: the
 * yardstick issue 13 quotes (bf16) */
static double dnnl_peak(int n, dnnl_data_type_t t, char *impl, size_t cap) {
    dnnl_engine_t eng;
    dnnl_engine_create(&eng, dnnl_cpu, 0);
    dn_arg r;
    dn_team(eng, n, n, n, t, dnnl_format_tag_any, NULL, NULL, NULL, &r, impl, cap);
    double t_best = r.p ? best_time(dn_run, &r, 1.0) : 0;
    dn_free(&r);
    dnnl_engine_destroy(eng);
    return t_best > 0 ? 2.0 * n * n * (double)n / t_best / 1e9 : 0;
}

/* ---------------------------------------------------------------- the module on one shape */

typedef enum { V_FP32, V_FP32_PREP, V_FP32_DNNL, V_FP32_DNNL_PREP, V_BF16, V_BF16_PREP, V_BF16_SGEMM, V_OWN,
               V_OWN_PREP, N_VARIANTS } variant;
static const char *VNAME[N_VARIANTS] = {"fp32 sgemm as stored", "fp32 sgemm prepared", "fp32 oneDNN as stored",
                                        "fp32 oneDNN prepared", "bf16 oneDNN as stored", "bf16 oneDNN prepared",
                                        "bf16 via sgemm", "bf16 own kernel as stored", "bf16 own kernel prepared"};
static int is_fp32(variant v) { return v <= V_FP32_DNNL_PREP; }
static int is_prepared(variant v) {
    return v == V_FP32_PREP || v == V_FP32_DNNL_PREP || v == V_BF16_PREP || v == V_OWN_PREP;
}
static m2d_gemm_kernel kernel_of(variant v) {
    if (v == V_BF16_SGEMM || v == V_FP32 || v == V_FP32_PREP) return M2D_GEMM_SGEMM;
    return v == V_OWN || v == V_OWN_PREP ? M2D_GEMM_OWN : M2D_GEMM_ONEDNN;
}
/* Whether variant V runs on this CPU for inner dimension IN (the own kernel: where it gives oneDNN's bits). */
static int variant_runs(variant v, int in) {
    if (v == V_OWN || v == V_OWN_PREP) return m2d_gemm_own_eligible(in) > 0;
    return !(v >= V_BF16 && v != V_BF16_SGEMM && !m2d_gemm_bf16_native());
}

typedef struct {
    m2d_gemm_ctx *g;
    m2d_gemm_group *grp;
    int n;
} call_arg;

static void call_run(void *p) {
    call_arg *c = p;
    if (c->n == 1 ? m2d_gemm(c->g, c->grp->x, c->grp->ldx, c->grp->m, c->grp->w, c->grp->y, c->grp->ldy, 0.0f)
                  : m2d_gemm_grouped(c->g, c->grp, c->n)) {
        fprintf(stderr, "bench_gemm: %s\n", m2d_errmsg());
        exit(1);
    }
}

static m2d_gemm_ctx *ctx_for(variant v) {
    m2d_gemm_ctx *g;
    if (m2d_gemm_ctx_new(is_fp32(v) ? M2D_PREC_FP32 : M2D_PREC_BF16, pool, &g)) exit(1);
    m2d_gemm_set_kernel(g, kernel_of(v));
    return g;
}

/* GFLOP/s of N_W weights [out, in] (bf16 as stored) applied to GROUPS groups of m rows each:
 * group i uses weight i % n_w and rows X (shared; when shared_x, all groups read the same rows). */
static double run_variant(variant v, uint16_t *const *w, int n_w, int groups, int m, int out, int in, const float *x,
                          float *y) {
    m2d_gemm_ctx *g = ctx_for(v);
    m2d_gemm_w *wv = m2d_malloc(sizeof *wv * (size_t)n_w);
    m2d_gemm_packed **pk = m2d_calloc((size_t)n_w, sizeof *pk);
    for (int i = 0; i < n_w; i++) {
        wv[i] = m2d_gemm_weight(M2D_BF16, w[i], out, in, in);
        if (is_prepared(v) && m2d_gemm_prepare(g, &wv[i], &pk[i]) == 0) wv[i].packed = pk[i];
    }
    m2d_gemm_group *grp = m2d_malloc(sizeof *grp * (size_t)groups);
    for (int i = 0; i < groups; i++)
        grp[i] = (m2d_gemm_group){x, in, m, &wv[i % n_w], y + (size_t)i * m * out, out, 0.0f, 0};
    call_arg c = {g, grp, groups};
    double flops = 2.0 * m * out * (double)in * groups, t = best_time(call_run, &c, 0.5);
    for (int i = 0; i < n_w; i++) m2d_gemm_packed_free(pk[i]);
    free(pk); free(wv); free(grp);
    m2d_gemm_ctx_free(g);
    return flops / t / 1e9;
}

typedef struct {
    const char *label;
    int m, out, in, n_w, groups;
} bench_shape;

/* every variant's GFLOP/s on one shape (0: not available on this CPU) */
static void shape_measure(const bench_shape *s, double gf[N_VARIANTS]) {
    size_t wn = (size_t)s->out * s->in;
    uint16_t **w = m2d_malloc(sizeof *w * (size_t)s->n_w);
    for (int i = 0; i < s->n_w; i++) w[i] = rand_bf16(wn);
    float *x = rand_f32((size_t)s->m * s->in), *y = m2d_malloc(sizeof(float) * (size_t)s->m * s->out * s->groups);
    for (int v = 0; v < N_VARIANTS; v++)
        gf[v] = variant_runs((variant)v, s->in) ? run_variant((variant)v, w, s->n_w, s->groups, s->m, s->out, s->in, x, y) : 0;
    for (int i = 0; i < s->n_w; i++) free(w[i]);
    free(w); free(x); free(y);
}

static void shape_print(const bench_shape *s, const double gf[N_VARIANTS], double peak32, double peak16) {
    printf("| %s | %d | %d | %d |", s->label, s->m, s->out, s->in);
    for (int v = 0; v < N_VARIANTS; v++)
        if (gf[v] > 0) printf(" %.1f (%.0f %%) |", gf[v], 100 * gf[v] / (is_fp32((variant)v) ? peak32 : peak16));
        else printf(" — |");
    printf("\n");
}

/* The yardsticks, best of this call and PREV (measured at the start and at the end of the run, so
 * that a burst of load from other processes during one of them does not skew every fraction).
 * oneDNN first, and a pause after each: idle OpenBLAS / OpenMP pool threads keep spinning for a
 * while after their last call and would slow whatever runs next. */
typedef struct { double sgemm, dnnl16, dnnl32; char impl16[128], impl32[128]; } yardsticks;
static void measure_yardsticks(yardsticks *y) {
    double p16 = m2d_gemm_bf16_native() ? dnnl_peak(2048, dnnl_bf16, y->impl16, sizeof y->impl16) : 0;
    sleep(1);
    double d32 = dnnl_peak(2048, dnnl_f32, y->impl32, sizeof y->impl32);
    sleep(1);
    double p32 = sgemm_peak();
    sleep(1);
    y->dnnl16 = M2D_MAX(y->dnnl16, p16);
    y->dnnl32 = M2D_MAX(y->dnnl32, d32);
    y->sgemm = M2D_MAX(y->sgemm, p32);
}

/* ---------------------------------------------------------------- dispatch crossover */

/* bf16 through oneDNN (as stored) vs through sgemm on rounded operands, for small squares and
 * batch sizes: where the per-call cost of oneDNN stops paying (the dispatch threshold). */
static void crossover_table(void) {
    static const int sizes[] = {16, 32, 64, 96, 128, 192, 256}, ms[] = {1, 4, 16, 64, 512};
    printf("\n### bf16 kernel crossover: time(oneDNN) / time(sgemm on bf16-rounded operands), as stored\n\n");
    printf("| out = in |");
    for (size_t j = 0; j < M2D_ARRAY_LEN(ms); j++) printf(" m = %d |", ms[j]);
    printf("\n|---|");
    for (size_t j = 0; j < M2D_ARRAY_LEN(ms); j++) printf("---|");
    printf("\n");
    for (size_t i = 0; i < M2D_ARRAY_LEN(sizes); i++) {
        int n = sizes[i];
        uint16_t *w = rand_bf16((size_t)n * n);
        float *x = rand_f32((size_t)512 * n), *y = m2d_malloc(sizeof(float) * 512 * (size_t)n);
        printf("| %d |", n);
        for (size_t j = 0; j < M2D_ARRAY_LEN(ms); j++) {
            double gd = run_variant(V_BF16, &w, 1, 1, ms[j], n, n, x, y);
            double gs = run_variant(V_BF16_SGEMM, &w, 1, 1, ms[j], n, n, x, y);
            printf(" %.2f |", gs / gd);
        }
        printf("\n");
        fflush(stdout);
        free(w); free(x); free(y);
    }
}

/* ---------------------------------------------------------------- OpenMP team vs our pthreads */

static void spin_item(void *ctx, int item) {
    (void)item;
    volatile double *sink = ctx, s = 0;
    for (int i = 0; i < 60000; i++) s += i * 1e-9; /* ~100 us: the size of the norms/RoPE between GEMMs */
    *sink = s;
}

static double sink;
static void pool_work(void) { m2d_pool_for(pool, THREADS, spin_item, &sink); }

static double pool_work_alone(int reps) {
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        double t0 = m2d_now();
        for (int i = 0; i < reps; i++) pool_work();
        best = M2D_MIN(best, (m2d_now() - t0) / reps);
    }
    return best;
}

/* Time of a fixed piece of pool work right after a GEMM (32x768x2048 bf16) that ran through the
 * module (our pthreads) or on oneDNN's own OpenMP team (2 threads), each against the same work
 * alone just before (the module first: once started, the OpenMP team outlives its calls). */
static void omp_interference(void) {
    int m = 32, n = 768, k = 2048, reps = 200;
    uint16_t *w = rand_bf16((size_t)n * k), *xb = m2d_malloc(sizeof(uint16_t) * (size_t)m * k);
    float *x = rand_f32((size_t)m * k), *y = m2d_malloc(sizeof(float) * (size_t)m * n);
    double alone[2], after[2] = {1e30, 1e30};
    dnnl_engine_t eng;
    dnnl_engine_create(&eng, dnnl_cpu, 0);
    m2d_gemm_ctx *g;
    if (m2d_gemm_ctx_new(M2D_PREC_BF16, pool, &g)) exit(1);
    m2d_gemm_w wv = m2d_gemm_weight(M2D_BF16, w, n, k, k);
    dn_arg team = {0};
    char impl[128];
    for (int mode = 0; mode < 2; mode++) { /* 0: the module on our pool; 1: oneDNN's OpenMP team */
        sleep(1);
        alone[mode] = pool_work_alone(reps);
        if (mode == 1) dn_team(eng, m, n, k, dnnl_bf16, dnnl_ba, xb, w, y, &team, impl, sizeof impl);
        for (int r = 0; r < 3; r++) {
            double tw = 0;
            for (int i = 0; i < reps; i++) {
                if (mode == 0) {
                    m2d_gemm(g, x, k, m, &wv, y, n, 0.0f);
                } else {
                    m2d_from_f32(M2D_BF16, x, (int64_t)m * k, xb);
                    dn_run(&team);
                }
                double t0 = m2d_now();
                pool_work();
                tw += m2d_now() - t0;
            }
            after[mode] = M2D_MIN(after[mode], tw / reps);
        }
    }
    printf("\n### An OpenMP team next to our pthreads\n\n");
    printf("~100 us of pool work (2 pthreads) right after a 32x768x2048 bf16 GEMM: through the module (our pthreads) "
           "%.0f us vs %.0f us alone (%+.0f %%); on oneDNN's own OpenMP team of 2: %.0f us vs %.0f us alone (%+.0f %%)\n",
           after[0] * 1e6, alone[0] * 1e6, 100 * (after[0] / alone[0] - 1), after[1] * 1e6, alone[1] * 1e6,
           100 * (after[1] / alone[1] - 1));
    dn_free(&team);
    m2d_gemm_ctx_free(g);
    dnnl_engine_destroy(eng);
    free(w); free(x); free(y); free(xb);
}

/* ---------------------------------------------------------------- slicing cost */

typedef struct { int m, n, k, slice; float *a, *b, *c; } slice_arg;
static void sliced_sgemm(void *p) {
    slice_arg *s = p;
    for (int n0 = 0; n0 < s->n; n0 += s->slice) {
        int nc = M2D_MIN(s->slice, s->n - n0);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s->m, nc, s->k, 1, s->a, s->k, s->b + (size_t)n0 * s->k,
                    s->k, 0, s->c + n0, s->n);
    }
}

/* single-threaded sgemm as one call and as the module's fixed column slices */
static void slicing_cost(void) {
    int m = 512, n = 4096, k = 2048;
    slice_arg s = {m, n, k, n, rand_f32((size_t)m * k), rand_f32((size_t)n * k), rand_f32((size_t)m * n)};
    double whole = best_time(sliced_sgemm, &s, 0.5);
    s.slice = M2D_GEMM_SLICE;
    double sliced = best_time(sliced_sgemm, &s, 0.5);
    printf("\nsgemm %dx%dx%d on one thread: one call %.1f GFLOP/s, %d-column slices %.1f GFLOP/s (%+.1f %%)\n", m, n,
           k, 2.0 * m * n * k / whole / 1e9, M2D_GEMM_SLICE, 2.0 * m * n * k / sliced / 1e9, 100 * (whole / sliced - 1));
    free(s.a); free(s.b); free(s.c);
}

/* The module's bf16 2048³ (as stored, on the pool) against oneDNN's own matmul (its team, weights in
 * its own layout), alternated call by call: this shared machine's AMX rate moves by 2x within minutes,
 * so the table's fractions (the yardsticks measured at the start and the end) can read half where the
 * two are at par; this ratio is measured under one load. */
static void module_vs_team(void) {
    enum { N = 2048, ROUNDS = 5 };
    float *x = rand_f32((size_t)N * N), *y = m2d_malloc(sizeof(float) * N * N);
    uint16_t *w = rand_bf16((size_t)N * N);
    m2d_gemm_ctx *g = ctx_for(V_BF16);
    m2d_gemm_w wv = m2d_gemm_weight(M2D_BF16, w, N, N, N);
    m2d_gemm_group grp = {x, N, N, &wv, y, N, 0.0f, 0};
    call_arg c = {g, &grp, 1};
    dnnl_engine_t eng;
    dnnl_engine_create(&eng, dnnl_cpu, 0);
    dn_arg r;
    char impl[128] = "none";
    dn_team(eng, N, N, N, dnnl_bf16, dnnl_format_tag_any, NULL, NULL, NULL, &r, impl, sizeof impl);
    double ratio[ROUNDS], flops = 2.0 * N * N * (double)N;
    printf("\nbf16 2048^3, the module (as stored, pool of %d) / oneDNN's own team of %d (%s), alternated:", THREADS,
           THREADS, impl);
    for (int i = 0; i < ROUNDS && r.p; i++) {
        double tm = best_time(call_run, &c, 0.3);
        omp_set_num_threads(THREADS);
        double tt = best_time(dn_run, &r, 0.3);
        omp_set_num_threads(1);
        ratio[i] = tt / tm;
        printf(" %.0f/%.0f", flops / tm / 1e9, flops / tt / 1e9);
    }
    if (r.p) {
        qsort(ratio, ROUNDS, sizeof *ratio, bench_cmp_double);
        printf(" GFLOP/s; median ratio %.2f\n", ratio[ROUNDS / 2]);
        dn_free(&r);
    } else {
        printf(" oneDNN has no bf16 matmul here\n");
    }
    dnnl_engine_destroy(eng);
    m2d_gemm_ctx_free(g);
    free(x); free(y); free(w);
}

/* which weights the CPU backend prepares (m2d_gemm_prepare_exact: where a prepared copy keeps the
 * as-stored bits, probed per precision and k at first use) */
static void prepare_exact_line(void) {
    static const int ks[] = {768, 2048, 4096, 6144};
    uint16_t *w = m2d_calloc((size_t)M2D_GEMM_SLICE * 6144, sizeof *w);
    printf("prepared copies keep the as-stored bits (the backend prepares only these), k = 768/2048/4096/6144:");
    for (int p = M2D_PREC_FP32; p <= M2D_PREC_BF16; p++) {
        m2d_gemm_ctx *g;
        if (m2d_gemm_ctx_new((m2d_precision)p, NULL, &g)) break;
        printf(" %s", m2d_precision_name((m2d_precision)p));
        double t0 = m2d_now();
        for (size_t i = 0; i < M2D_ARRAY_LEN(ks); i++) {
            m2d_gemm_w v = m2d_gemm_weight(M2D_BF16, w, M2D_GEMM_SLICE, ks[i], ks[i]);
            printf("%s%s", i ? "/" : " ", m2d_gemm_prepare_exact(g, &v) ? "yes" : "no");
        }
        printf(" (probes %.2f s)", m2d_now() - t0);
        m2d_gemm_ctx_free(g);
    }
    printf("\n");
    free(w);
}

/* ---------------------------------------------------------------- main */

static void cpu_line(void) {
    char line[256] = "?";
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "model name", 10) == 0) break;
    if (f) fclose(f);
    char *c = strchr(line, ':');
    printf("CPU: %s", c ? c + 2 : line);
    const dnnl_version_t *v = dnnl_version();
    printf("oneDNN %d.%d.%d (CPU runtime %s), effective ISA %s, bf16 native: %s; OpenBLAS kernels %s; %d threads\n\n",
           v->major, v->minor, v->patch,
           v->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : v->cpu_runtime == DNNL_RUNTIME_TBB ? "TBB" : "other",
           m2d_gemm_isa_name(), m2d_gemm_bf16_native() ? "yes" : "no", m2d_blas_core(), THREADS);
}

static const bench_shape shapes[] = {
    {"peak shape 2048^3", 2048, 2048, 2048, 1, 1},
    {"one expert's share (gate/up)", 32, 768, 2048, 1, 1},
    {"one expert's share (down)", 32, 2048, 768, 1, 1},
    {"dense K=8 FFN gate/up", 512, 6144, 2048, 1, 1},
    {"dense K=8 FFN down", 512, 2048, 6144, 1, 1},
    {"30B q_proj", 512, 4096, 2048, 1, 1},
    {"30B k/v_proj", 512, 512, 2048, 1, 1},
    {"30B router", 512, 128, 2048, 1, 1},
    {"30B decode-like m=1 (2048x2048)", 1, 2048, 2048, 1, 1},
    {"LM head 151936", 512, 151936, 2048, 1, 1},
    {"MoE layer gate+up: 256 x (32 rows)", 32, 768, 2048, 256, 256},
    {"MoE layer down: 128 x (32 rows)", 32, 2048, 768, 128, 128},
    {"calib gate+up: 256 x (256 rows)", 256, 768, 2048, 256, 256},
    {"calib down: 128 x (256 rows)", 256, 2048, 768, 128, 128},
    {"tiny q/o_proj", 512, 192, 192, 1, 1},
    {"tiny k/v_proj", 512, 64, 192, 1, 1},
    {"tiny router", 512, 64, 192, 1, 1},
    {"tiny expert gate/up (64 rows)", 64, 72, 192, 1, 1},
    {"tiny expert down (64 rows)", 64, 192, 72, 1, 1},
    {"tiny MoE gate+up: 128 x (64 rows)", 64, 72, 192, 128, 128},
    {"tiny student FFN gate/up (576)", 512, 576, 192, 1, 1},
    {"tiny LM head 8192", 512, 8192, 192, 1, 1},
    {"tiny calib gate+up: 128 x (512 rows)", 512, 72, 192, 128, 128},
};

int main(int argc, char **argv) {
    int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    cpu_line();
    yardsticks ys = {0};
    measure_yardsticks(&ys);
    pool = m2d_pool_new(THREADS);
    m2d_backend_host_blas_threads(1); /* OpenBLAS single-threaded: our pool splits the GEMMs */
    size_t n_shapes = M2D_ARRAY_LEN(shapes);
    double(*gf)[N_VARIANTS] = m2d_calloc(n_shapes, sizeof *gf);
    for (size_t i = 0; i < n_shapes; i++)
        if (!quick || !((shapes[i].out > 100000 || shapes[i].n_w > 1) && shapes[i].in > 192))
            shape_measure(&shapes[i], gf[i]);
    m2d_backend_host_blas_threads(THREADS);
    measure_yardsticks(&ys);
    m2d_backend_host_blas_threads(1);
    printf("Yardsticks (best of the start and the end of this run): OpenBLAS sgemm n=2048, %d threads (kernels for "
           "%s): %.1f GFLOP/s; oneDNN bf16 matmul 2048^3 (%s, its OpenMP team of %d): %.1f GFLOP/s\n", THREADS,
           openblas_get_corename(), ys.sgemm, ys.dnnl16 > 0 ? ys.impl16 : "no native bf16", THREADS, ys.dnnl16);
    printf("For comparison, oneDNN's fp32 matmul 2048^3 (%s): %.1f GFLOP/s\n", ys.impl32, ys.dnnl32);
    printf("bf16 kernel in oneDNN's place (chosen at first use): %s\n", m2d_gemm_bf16_choice(NULL));
    printf("fp32 kernel of the sgemm path (AVX2 CPUs, tiny weights; by instruction set): %s\n",
           m2d_gemm_fp32_own() ? "own fma32 (AVX2 + FMA; rows independent of the batch)"
                               : "OpenBLAS sgemm (no FMA, or M2D_GEMM_FP32=openblas)");
    for (int p = M2D_PREC_FP32; p <= M2D_PREC_BF16; p++) { /* what a calibration hook's experts run under */
        int rows, kc, plan = m2d_gemm_exact_plan((m2d_precision)p, &rows, &kc);
        printf("%s rows independent of the batch on oneDNN: %s\n", m2d_precision_name((m2d_precision)p),
               m2d_gemm_onednn_rows_independent((m2d_precision)p) ? "yes"
               : plan ? "with exact rows (calls padded, k split; the probe's plan below)" : "no");
        if (plan) printf("  exact-rows plan: calls of >= %d rows, k in chunks of %d\n", rows, kc);
    }
    prepare_exact_line();
    printf("\n");
    double p16 = ys.dnnl16 > 0 ? ys.dnnl16 : ys.sgemm;
    printf("| shape | m | out | in |");
    for (int v = 0; v < N_VARIANTS; v++) printf(" %s GFLOP/s (of peak) |", VNAME[v]);
    printf("\n|---|---:|---:|---:|");
    for (int v = 0; v < N_VARIANTS; v++) printf("---:|");
    printf("\n");
    for (size_t i = 0; i < n_shapes; i++)
        if (gf[i][V_FP32] > 0) shape_print(&shapes[i], gf[i], ys.sgemm, p16);
    free(gf);
    printf("\nfp32 columns: fraction of the sgemm yardstick; bf16 columns: of the oneDNN bf16 yardstick.\n"
           "Groups: one grouped call over distinct weights (cold: the weights exceed the caches), x shared.\n");
    slicing_cost();
    if (m2d_gemm_bf16_native()) {
        module_vs_team();
        crossover_table();
        omp_interference();
    }
    m2d_pool_free(pool);
    return 0;
}
