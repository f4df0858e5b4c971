/* gemm — sgemm (fp32) and oneDNN matmul (bf16) behind one call; see gemm.h for the contract.
 *
 * oneDNN in Debian (2.6.3) is built with the OpenMP runtime (libgomp): a primitive runs
 * `#pragma omp parallel num_threads(nthr)` with the nthr it was created with, from whichever thread
 * executes it. Created under omp_set_num_threads(1), nthr is 1 and oneDNN never starts a team, so
 * the only threads are the caller's pool. Why not one oneDNN call over all cores: the pool also
 * runs GEMMs from inside its own items (MoE experts in parallel), where a team per worker would put
 * 4 threads on 2 cores; a team's threads spin after each call (measured in bench_gemm: ~100 us of
 * pool work right after a oneDNN call on its own team of 2 took 2.6x as long, +6 % after the same
 * call through this module); and on 2 pthreads the module reaches 86-92 % of oneDNN's own team at
 * 2048³ and at issue 13's 512-row shapes (BENCHMARKS.md).
 *
 * Kept whole (~1000 lines): every path here (one GEMM, grouped GEMMs, preparing weights, the
 * row-independence probe) shares the primitive cache, the scratch pool and the rule that oneDNN
 * runs only under this module's threads; split, those would become a header of oneDNN internals
 * (dnnl.h types) that other files could misuse. */
#include "engine/gemm.h"

#include <cblas.h>
#include <dnnl.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "engine/dpbf16.h"
#include "engine/fma32.h"

#define CACHE_CAP 512 /* primitives kept (LRU); ~90 KB each for brgemm */

/* ------------------------------------------------------------------ precision and ISA */

const char *m2d_gemm_isa_name(void) {
    switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "unknown";
    }
}

int m2d_gemm_bf16_native(void) {
    /* the ISA values are nested bit sets: every ISA with native bf16 contains avx512_core_bf16's bits
     * (AMX does; avx2_vnni and the plain AVX-512 levels do not) */
    unsigned isa = (unsigned)dnnl_get_effective_cpu_isa(), bf = (unsigned)dnnl_cpu_isa_avx512_core_bf16;
    return (isa & bf) == bf;
}

int m2d_gemm_fp32_onednn_native(void) {
    unsigned isa = (unsigned)dnnl_get_effective_cpu_isa(), core = (unsigned)dnnl_cpu_isa_avx512_core;
    return (isa & core) == core;
}

m2d_precision m2d_gemm_resolve(m2d_precision p) {
    if (p != M2D_PREC_AUTO) return p;
    return m2d_gemm_bf16_native() ? M2D_PREC_BF16 : M2D_PREC_FP32;
}

m2d_gemm_w m2d_gemm_weight(m2d_dtype dtype, const void *data, int out, int in, int64_t ld) {
    return (m2d_gemm_w){dtype, data, out, in, ld, NULL, 0, 0};
}


m2d_gemm_w m2d_gemm_tensor_rows(const m2d_tensor *t, int64_t r0, int n) {
    int64_t in = t->shape[1];
    const char *base = (const char *)t->data + (size_t)(r0 * in) * m2d_dtype_size(t->dtype);
    m2d_gemm_w w = m2d_gemm_weight(t->dtype, base, n, (int)in, in);
    w.whole = t->shape[0] * in;
    return w;
}

/* ------------------------------------------------------------------ oneDNN engine, threads */

static dnnl_engine_t dnnl_eng;
static pthread_once_t dnnl_once = PTHREAD_ONCE_INIT;
static dnnl_status_t dnnl_init_status;

static void dnnl_init(void) {
    dnnl_init_status = dnnl_engine_create(&dnnl_eng, dnnl_cpu, 0);
    /* the context's cache holds the primitives it uses; oneDNN's own cache would keep a second
     * reference to each (memory) and saves only the ~30 us of creating a descriptor */
    if (dnnl_init_status == dnnl_success) dnnl_set_primitive_cache_capacity(0);
}

static int dnnl_ready(void) {
    pthread_once(&dnnl_once, dnnl_init);
    if (dnnl_init_status != dnnl_success)
        return m2d_err("gemm: oneDNN CPU engine could not be created (status %d)", (int)dnnl_init_status);
    return 0;
}

/* oneDNN takes a primitive's thread count from the calling thread's OpenMP setting when it creates
 * it, and a reorder's when it runs: set it to 1 around those (the setting is per thread) and back. */
static int saved_omp_threads(void) {
    int saved = omp_get_max_threads();
    if (saved != 1) omp_set_num_threads(1);
    return saved;
}

static void restore_omp_threads(int saved) {
    if (saved != 1) omp_set_num_threads(saved);
}

/* ------------------------------------------------------------------ scratch pool */

typedef struct {
    void *p;
    size_t cap;
    int busy;
} scratch_buf;

typedef struct {
    pthread_mutex_t mu;
    scratch_buf *b;
    int n;
} scratch_pool;

/* A buffer of at least `bytes`, exclusively the caller's until scratch_put: the smallest free one
 * that fits, else the largest free one grown, else a new one. Their number is bounded by the
 * concurrency; they live until the context is freed. */
static void *scratch_get(scratch_pool *s, size_t bytes) {
    pthread_mutex_lock(&s->mu);
    int fit = -1, big = -1;
    for (int i = 0; i < s->n; i++) {
        if (s->b[i].busy) continue;
        if (s->b[i].cap >= bytes && (fit < 0 || s->b[i].cap < s->b[fit].cap)) fit = i;
        if (big < 0 || s->b[i].cap > s->b[big].cap) big = i;
    }
    int i = fit >= 0 ? fit : big;
    if (i < 0) {
        s->b = m2d_realloc(s->b, sizeof *s->b * (size_t)(s->n + 1));
        i = s->n++;
        s->b[i] = (scratch_buf){NULL, 0, 0};
    }
    if (s->b[i].cap < bytes) {
        free(s->b[i].p);
        s->b[i].p = m2d_malloc64(bytes);
        s->b[i].cap = bytes;
    }
    s->b[i].busy = 1;
    void *p = s->b[i].p;
    pthread_mutex_unlock(&s->mu);
    return p;
}

static void scratch_put(scratch_pool *s, void *p) {
    if (!p) return;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n; i++)
        if (s->b[i].p == p) s->b[i].busy = 0;
    pthread_mutex_unlock(&s->mu);
}

static void scratch_free(scratch_pool *s) {
    for (int i = 0; i < s->n; i++) free(s->b[i].p);
    free(s->b);
}

/* ------------------------------------------------------------------ bf16 rounding */

typedef uint32_t v16u32 __attribute__((vector_size(64)));
typedef uint16_t v16u16 __attribute__((vector_size(32)));

/* Round to nearest even, NaN kept quiet: the same bits as m2d_f32_to_bf16, 16 lanes at a time into
 * BITS (the bf16 pattern in the low half of each lane). No vector types cross the call (ABI). */
static inline void bf16_bits16(const float *x, uint32_t bits[16]) {
    v16u32 u;
    memcpy(&u, x, sizeof u);
    v16u32 nan = (v16u32)((u & 0x7fffffffu) > 0x7f800000u);
    v16u32 r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    r = (nan & ((u >> 16) | 0x40u)) | (~nan & r);
    memcpy(bits, &r, sizeof r);
}

/* rows x cols of X (row stride ldx) rounded to bf16, into a dense [rows, cols] buffer: bf16 bit
 * patterns (uint16_t) or, AS_F32, the rounded values as fp32 (operands of the sgemm bf16 path) */
static void round_rows(const float *x, int ldx, int rows, int cols, void *out, int as_f32) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * ldx;
        uint16_t *oh = (uint16_t *)out + (size_t)r * cols;
        uint32_t *of = (uint32_t *)out + (size_t)r * cols;
        int i = 0;
        for (; i + 16 <= cols; i += 16) {
            uint32_t b[16];
            bf16_bits16(xr + i, b);
            v16u32 v;
            memcpy(&v, b, sizeof v);
            if (as_f32) {
                v <<= 16;
                memcpy(of + i, &v, sizeof v);
            } else {
                v16u16 h = __builtin_convertvector(v, v16u16);
                memcpy(oh + i, &h, sizeof h);
            }
        }
        for (; i < cols; i++) {
            uint16_t h = m2d_f32_to_bf16(xr[i]);
            if (as_f32) of[i] = (uint32_t)h << 16;
            else oh[i] = h;
        }
    }
}

void m2d_bf16_rows(const float *x, int ldx, int rows, int cols, uint16_t *out) { round_rows(x, ldx, rows, cols, out, 0); }

void m2d_bf16_rows_f32(const float *x, int ldx, int rows, int cols, float *out) { round_rows(x, ldx, rows, cols, out, 1); }

/* Rows [r0, r0+nr) of W as fp32 [nr, in] (bf16-rounded when ROUND), into out. */
static void weight_rows_f32(const m2d_gemm_w *w, int r0, int nr, int round, float *out) {
    for (int r = 0; r < nr; r++) {
        float *o = out + (size_t)r * w->in;
        m2d_to_f32(w->dtype, w->data, (int64_t)(r0 + r) * w->ld, w->in, o);
        if (round && w->dtype != M2D_BF16) m2d_bf16_rows_f32(o, w->in, 1, w->in, o);
    }
}

/* Rows [r0, r0+nr) of W as dense bf16 [nr, in]. */
static void weight_rows_bf16(const m2d_gemm_w *w, int r0, int nr, float *tmp, uint16_t *out) {
    for (int r = 0; r < nr; r++) {
        if (w->dtype == M2D_BF16) {
            memcpy(out + (size_t)r * w->in, (const uint16_t *)w->data + (int64_t)(r0 + r) * w->ld,
                   sizeof(uint16_t) * (size_t)w->in);
        } else {
            m2d_to_f32(w->dtype, w->data, (int64_t)(r0 + r) * w->ld, w->in, tmp);
            m2d_bf16_rows(tmp, w->in, 1, w->in, out + (size_t)r * w->in);
        }
    }
}

/* ------------------------------------------------------------------ primitive cache */

typedef struct {
    int m, n, k, blocked, f32; /* X [m, k] · (Wᵀ [k, n], plain or blocked) -> dense fp32 [m, n]; operands
                                * bf16, or fp32 when f32 */
} prim_key;

typedef struct prim_entry {
    prim_key key;
    dnnl_primitive_t prim;
    dnnl_memory_desc_t src_md, wei_md, dst_md, pad_md; /* pad_md: the scratchpad */
    size_t pad_bytes;
    int refs, evicted;
    unsigned long last_use;
    struct prim_entry *next;
} prim_entry;

#define N_BUCKETS 1024

typedef struct {
    pthread_mutex_t mu;
    prim_entry *bucket[N_BUCKETS];
    int n, cap;
    unsigned long clock;
} prim_cache;

struct m2d_gemm_ctx {
    m2d_precision prec; /* resolved: FP32 or BF16 */
    m2d_pool *pool;
    m2d_gemm_kernel kernel;  /* AUTO: by weight size and ISA (see wants_dnnl) */
    prim_cache cache;
    scratch_pool scratch;
    int force_rows, force_kc; /* m2d_gemm_force_exact_plan (0: the probe's plan) */
    atomic_long n_sgemm, n_fma32, n_dnnl, n_own, n_gemv, n_created, n_hits;
};

static size_t key_hash(const prim_key *k) {
    uint64_t h = 1469598103934665603ull;
    int f[5] = {k->m, k->n, k->k, k->blocked, k->f32};
    for (int i = 0; i < 5; i++) h = (h ^ (uint64_t)(uint32_t)f[i]) * 1099511628211ull;
    return (size_t)(h % N_BUCKETS);
}

static int key_eq(const prim_key *a, const prim_key *b) {
    return a->m == b->m && a->n == b->n && a->k == b->k && a->blocked == b->blocked && a->f32 == b->f32;
}

static void entry_destroy(prim_entry *e) {
    dnnl_primitive_destroy(e->prim);
    free(e);
}

/* Matmul Y[m, n] = X[m, k] · B[k, n], all dense: X and B = Wᵀ bf16 (or both fp32; B plain: W's
 * rows, or the given blocked layout), Y fp32. Single-threaded (see the top of the file); the
 * scratchpad is supplied per execution so concurrent executions share nothing. */
static dnnl_status_t create_prim(const prim_key *k, const dnnl_memory_desc_t *blocked, prim_entry *e) {
    dnnl_dims_t sd = {k->m, k->k}, wd = {k->k, k->n}, dd = {k->m, k->n};
    dnnl_data_type_t t = k->f32 ? dnnl_f32 : dnnl_bf16;
    dnnl_status_t s = dnnl_memory_desc_init_by_tag(&e->src_md, 2, sd, t, dnnl_ab);
    if (s == dnnl_success) {
        if (blocked) e->wei_md = *blocked;
        else s = dnnl_memory_desc_init_by_tag(&e->wei_md, 2, wd, t, dnnl_ba);
    }
    if (s == dnnl_success) s = dnnl_memory_desc_init_by_tag(&e->dst_md, 2, dd, dnnl_f32, dnnl_ab);
    dnnl_matmul_desc_t md;
    if (s == dnnl_success) s = dnnl_matmul_desc_init(&md, &e->src_md, &e->wei_md, NULL, &e->dst_md);
    dnnl_primitive_attr_t attr = NULL;
    if (s == dnnl_success) s = dnnl_primitive_attr_create(&attr);
    if (s == dnnl_success) s = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    dnnl_primitive_desc_t pd = NULL;
    int saved = saved_omp_threads();
    if (s == dnnl_success) s = dnnl_primitive_desc_create(&pd, &md, attr, dnnl_eng, NULL);
    if (s == dnnl_success) s = dnnl_primitive_create(&e->prim, pd);
    restore_omp_threads(saved);
    if (s == dnnl_success) {
        e->pad_md = *dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        e->pad_bytes = dnnl_memory_desc_get_size(&e->pad_md);
    }
    dnnl_primitive_desc_destroy(pd);
    dnnl_primitive_attr_destroy(attr);
    return s;
}

/* Drop the least recently used idle-or-busy entry from the table (busy ones are freed by their
 * last user). Called with the lock held. */
static void cache_evict_lru(prim_cache *c) {
    prim_entry **victim = NULL;
    for (int b = 0; b < N_BUCKETS; b++)
        for (prim_entry **p = &c->bucket[b]; *p; p = &(*p)->next)
            if (!victim || (*p)->last_use < (*victim)->last_use) victim = p;
    if (!victim) return;
    prim_entry *e = *victim;
    *victim = e->next;
    c->n--;
    if (e->refs == 0) entry_destroy(e);
    else e->evicted = 1;
}

/* The primitive for K (created on a miss), referenced until prim_release. NULL + m2d_err when
 * oneDNN cannot create it. Creation runs under the lock: first uses of a shape are serialised. */
static prim_entry *prim_acquire(m2d_gemm_ctx *g, const prim_key *k, const dnnl_memory_desc_t *blocked) {
    prim_cache *c = &g->cache;
    size_t h = key_hash(k);
    pthread_mutex_lock(&c->mu);
    prim_entry *e = c->bucket[h];
    while (e && !key_eq(&e->key, k)) e = e->next;
    if (e) {
        atomic_fetch_add(&g->n_hits, 1);
    } else {
        e = m2d_calloc(1, sizeof *e);
        e->key = *k;
        dnnl_status_t s = create_prim(k, blocked, e);
        if (s != dnnl_success) {
            pthread_mutex_unlock(&c->mu);
            free(e);
            m2d_err("gemm: oneDNN %s matmul %dx%dx%d%s could not be created (status %d)", k->f32 ? "fp32" : "bf16",
                    k->m, k->n, k->k, k->blocked ? " (prepared weights)" : "", (int)s);
            return NULL;
        }
        atomic_fetch_add(&g->n_created, 1);
        while (c->n >= c->cap) cache_evict_lru(c);
        e->next = c->bucket[h];
        c->bucket[h] = e;
        c->n++;
    }
    e->refs++;
    e->last_use = ++c->clock;
    pthread_mutex_unlock(&c->mu);
    return e;
}

static void prim_release(m2d_gemm_ctx *g, prim_entry *e) {
    pthread_mutex_lock(&g->cache.mu);
    int dead = --e->refs == 0 && e->evicted;
    pthread_mutex_unlock(&g->cache.mu);
    if (dead) entry_destroy(e);
}

static void cache_free(prim_cache *c) {
    for (int b = 0; b < N_BUCKETS; b++)
        for (prim_entry *e = c->bucket[b], *nx; e; e = nx) {
            nx = e->next;
            entry_destroy(e);
        }
}

/* ------------------------------------------------------------------ prepared weights */

typedef struct {
    int n0, n;               /* output columns of this slice */
    dnnl_memory_desc_t md;   /* oneDNN's blocked layout of Wᵀ[:, n0:n0+n] (unused for the own kernel) */
    void *data;              /* in that layout, or the own kernel's (m2d_dpbf16_pack) */
} packed_slice;

struct m2d_gemm_packed {
    m2d_precision prec;
    int out, in;
    size_t bytes;
    float *f32;              /* fp32 precision: W as fp32 [out, in] */
    packed_slice *slice;     /* bf16 precision: one per M2D_GEMM_SLICE columns */
    int n_slices;
    int own_kc;              /* > 0: slices packed for the own kernel, k chunks of own_kc */
};

/* ------------------------------------------------------------------ one GEMM */

/* How oneDNN reads a call's X: dense [m, K] (kc 0), or, where an exact-rows plan pads or splits the
 * call (gemm.h), chunk-major: per chunk of kc columns [rows, kn] at rows * k0 elements, rows =
 * max(m, min_rows), the rows past m repeating row 0 (their results are dropped). */
typedef struct {
    int rows, kc, min_rows;
} x_layout_t;

typedef struct {
    m2d_gemm_ctx *g;
    m2d_gemm_group c;    /* the call: X, W, Y, beta */
    int use_dnnl;        /* oneDNN's path (oneDNN, or the own kernel in its place when own_kc > 0) */
    int own_kc;
    const void *xd;      /* oneDNN: X as it reads it (bf16, or fp32 in fp32 precision), laid out as xl says */
    void *x_copy;        /* xd when it is this job's own scratch copy */
    const float *xr;     /* sgemm: X (bf16-rounded in bf16 precision) and its row stride */
    int ldxr;
    x_layout_t xl;       /* xd's layout: dense, or chunk-major under an exact-rows plan */
    int n_items;         /* tiles: row blocks x column slices */
    int rows;            /* rows per tile (oneDNN; sgemm: all m) */
    atomic_int failed;
    char err[256];       /* the first failing item's message (errors are per thread) */
} gemm_job;

static int n_slices(int out) { return (out + M2D_GEMM_SLICE - 1) / M2D_GEMM_SLICE; }

/* Execute one cached primitive on raw pointers; the scratchpad comes from the pool. */
static int dnnl_exec(m2d_gemm_ctx *g, prim_entry *e, const void *x, const void *w, float *y) {
    void *pad = e->pad_bytes ? scratch_get(&g->scratch, e->pad_bytes) : NULL;
    dnnl_memory_t ms = NULL, mw = NULL, md = NULL, mp = NULL;
    dnnl_stream_t st = NULL;
    dnnl_status_t s = dnnl_stream_create(&st, dnnl_eng, dnnl_stream_default_flags);
    if (s == dnnl_success) s = dnnl_memory_create(&ms, &e->src_md, dnnl_eng, (void *)x);
    if (s == dnnl_success) s = dnnl_memory_create(&mw, &e->wei_md, dnnl_eng, (void *)w);
    if (s == dnnl_success) s = dnnl_memory_create(&md, &e->dst_md, dnnl_eng, y);
    if (s == dnnl_success && pad) s = dnnl_memory_create(&mp, &e->pad_md, dnnl_eng, pad);
    if (s == dnnl_success) {
        dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, ms}, {DNNL_ARG_WEIGHTS, mw}, {DNNL_ARG_DST, md},
                                   {DNNL_ARG_SCRATCHPAD, mp}};
        s = dnnl_primitive_execute(e->prim, st, pad ? 4 : 3, args);
    }
    dnnl_memory_destroy(ms);
    dnnl_memory_destroy(mw);
    dnnl_memory_destroy(md);
    dnnl_memory_destroy(mp);
    dnnl_stream_destroy(st);
    scratch_put(&g->scratch, pad);
    if (s != dnnl_success) return m2d_err("gemm: oneDNN matmul failed (status %d)", (int)s);
    return 0;
}

static int own_tile_rows(void); /* the own kernel's micro-tile height, measured once (below) */

/* Bytes of an element of X as oneDNN reads it: bf16 bit patterns, or fp32 in fp32 precision */
static size_t x_elem_size(const m2d_gemm_ctx *g) { return g->prec == M2D_PREC_FP32 ? sizeof(float) : sizeof(uint16_t); }

/* Columns [k0, k0+kn) of rows [n0, n0+n) of W as the slice's kernel reads them: the prepared
 * slice, W in place (stored in the precision's type, dense, all of k), else a dense copy into
 * scratch (*CONV, to give back; oneDNN 2.6 takes its brgemm kernels only for a dense Wᵀ, see
 * dnnl_slice). */
static const void *slice_weight(gemm_job *j, const packed_slice *ps, int n0, int n, int k0, int kn, void **conv) {
    const m2d_gemm_w *w = j->c.w;
    scratch_pool *sp = &j->g->scratch;
    int f32 = j->g->prec == M2D_PREC_FP32, dense = k0 == 0 && kn == w->in && w->ld == w->in;
    *conv = NULL;
    if (ps) return ps->data;
    if (dense && !f32 && w->dtype == M2D_BF16) return (const uint16_t *)w->data + (int64_t)n0 * w->ld;
    if (dense && f32 && w->dtype == M2D_F32 && ((uintptr_t)w->data & 3) == 0) return (const float *)w->data + (int64_t)n0 * w->ld;
    m2d_gemm_w part = *w; /* columns k0.. of W's rows */
    part.data = (const char *)w->data + (size_t)k0 * m2d_dtype_size(w->dtype);
    part.in = kn;
    if (f32) {
        *conv = scratch_get(sp, sizeof(float) * (size_t)n * kn);
        weight_rows_f32(&part, n0, n, 0, *conv);
    } else {
        *conv = scratch_get(sp, sizeof(uint16_t) * (size_t)n * kn);
        float *tmp = scratch_get(sp, sizeof(float) * (size_t)kn);
        weight_rows_bf16(&part, n0, n, tmp, *conv);
        scratch_put(sp, tmp);
    }
    return *conv;
}

/* ACC [m, n] (row stride LDACC: n for oneDNN, which needs a dense Y) = X [m, kn] (dense, the
 * precision's type) · Wᵀ of the slice WP [n, kn], on this thread: oneDNN, or the own kernel in its
 * place (the same operands) */
static int slice_product(gemm_job *j, const packed_slice *ps, int m, int n, int kn, const void *x, const void *wp,
                         float *acc, int ldacc) {
    scratch_pool *sp = &j->g->scratch;
    if (j->own_kc) {
        uint16_t *pk = ps ? NULL : scratch_get(sp, m2d_dpbf16_packed_bytes(n, kn));
        if (pk) m2d_dpbf16_pack(wp, kn, n, kn, pk);
        m2d_dpbf16_gemm(x, kn, m, pk ? pk : wp, n, kn, j->own_kc, acc, ldacc, own_tile_rows());
        scratch_put(sp, pk);
        return 0;
    }
    prim_key k = {m, n, kn, ps != NULL, j->g->prec == M2D_PREC_FP32};
    prim_entry *e = prim_acquire(j->g, &k, ps ? &ps->md : NULL);
    int rc = e ? dnnl_exec(j->g, e, x, wp, acc) : -1;
    if (e) prim_release(j->g, e);
    return rc;
}

typedef float v16f __attribute__((vector_size(64)));

/* a[i] += b[i], 16 lanes at a time (an elementwise sum: the same bits as the scalar loop) */
static void add_floats(float *a, const float *b, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        v16f va, vb;
        memcpy(&va, a + i, sizeof va);
        memcpy(&vb, b + i, sizeof vb);
        va += vb;
        memcpy(a + i, &va, sizeof va);
    }
    for (; i < n; i++) a[i] += b[i];
}

/* Rows [r0, r0+m) of the slice under the exact-rows plan (gemm.h, m2d_gemm_rows_independent_exact):
 * k in chunks of xl.kc whose products are added in order, X from the chunk-major copy (padded to
 * xl.rows rows: copy_x_chunks). ACC holds m rows plus the padding. */
static int slice_exact(gemm_job *j, int n0, int n, int r0, int m, float *acc) {
    scratch_pool *sp = &j->g->scratch;
    int K = j->c.w->in, kc = j->xl.kc, mp = m + (j->xl.rows - j->c.m); /* a padded call is one tile */
    size_t es = x_elem_size(j->g);
    float *part = K > kc ? scratch_get(sp, sizeof(float) * (size_t)mp * n) : NULL;
    int rc = 0;
    for (int k0 = 0; k0 < K && rc == 0; k0 += kc) {
        int kn = M2D_MIN(kc, K - k0);
        const char *x = (const char *)j->xd + ((size_t)j->xl.rows * k0 + (size_t)r0 * kn) * es;
        void *conv;
        const void *wp = slice_weight(j, NULL, n0, n, k0, kn, &conv);
        rc = slice_product(j, NULL, mp, n, kn, x, wp, k0 ? part : acc, n);
        scratch_put(sp, conv);
        if (k0 && rc == 0) add_floats(acc, part, (size_t)m * n);
    }
    scratch_put(sp, part);
    return rc;
}

/* Y [m, n] (row stride LDY) = ACC (dense [m, n]) + beta·Y: a kernel's sums computed into scratch,
 * stored the same way whichever kernel made them (the same bits for the same sums) */
static void store_rows(float *y, int ldy, const float *acc, int m, int n, float beta) {
    for (int i = 0; i < m; i++) {
        float *yr = y + (size_t)i * ldy;
        const float *ar = acc + (size_t)i * n;
        if (beta == 0.0f) memcpy(yr, ar, sizeof(float) * (size_t)n);
        else
            for (int c = 0; c < n; c++) yr[c] = ar[c] + beta * yr[c];
    }
}

/* Output columns [n0, n0+n) through oneDNN (or the own kernel in its place: the same operands, the
 * same sums). oneDNN's operands are always dense: oneDNN 2.6 takes its brgemm kernels only for a
 * dense Y and a dense Wᵀ and otherwise falls back to an older gemm with another summation order
 * (measured; a strided X too), so a slice is computed into scratch and then stored (+ beta·Y; the
 * own kernel stores into Y itself at beta 0), and W rows are read in place only when stored in the
 * precision's type with ld == in (else copied or converted), or from the prepared slice. */
static int dnnl_slice(gemm_job *j, int item) {
    const m2d_gemm_w *w = j->c.w;
    int slice = item % n_slices(w->out), r0 = item / n_slices(w->out) * j->rows;
    int n0 = slice * M2D_GEMM_SLICE, n = M2D_MIN(M2D_GEMM_SLICE, w->out - n0), m = M2D_MIN(j->rows, j->c.m - r0);
    const packed_slice *ps = w->packed ? &w->packed->slice[w->p0 / M2D_GEMM_SLICE + slice] : NULL;
    scratch_pool *sp = &j->g->scratch;
    int exact = j->xl.kc > 0, rc;
    /* the own kernel stores into Y itself where nothing is added (oneDNN needs a dense Y: scratch) */
    float *yd = j->own_kc && !exact && j->c.beta == 0.0f ? j->c.y + (size_t)r0 * j->c.ldy + n0 : NULL;
    float *acc = yd ? NULL : scratch_get(sp, sizeof(float) * (size_t)(m + (j->xl.rows - j->c.m)) * n);
    if (exact) {
        rc = slice_exact(j, n0, n, r0, m, acc);
    } else {
        void *conv;
        const void *wp = slice_weight(j, ps, n0, n, 0, w->in, &conv);
        const char *x = (const char *)j->xd + (size_t)r0 * w->in * x_elem_size(j->g);
        rc = slice_product(j, ps, m, n, w->in, x, wp, yd ? yd : acc, yd ? j->c.ldy : n);
        scratch_put(sp, conv);
    }
    if (rc == 0 && acc) store_rows(j->c.y + (size_t)r0 * j->c.ldy + n0, j->c.ldy, acc, m, n, j->c.beta);
    scratch_put(sp, acc);
    atomic_fetch_add(j->own_kc ? &j->g->n_own : &j->g->n_dnnl, 1);
    return rc;
}

/* ------------------------------------------------------------------ few rows: a dot product per element */

/* With OpenBLAS (no FMA, or M2D_GEMM_FP32=openblas), at most this many rows the sgemm path computes
 * each element as one dot product over W's row as stored instead of calling sgemm: sgemm packs
 * (and, for bf16 weights, the caller converts) a whole 256-row slice of W per call, which at m = 1
 * costs ~30x the product (bench_gemm, AVX2: 2.6 GFLOP/s at 1 x 2048 x 2048 as stored against ~80 at
 * m >= 32): the LM head of a pp run, and experts that got one token. sgemm's own order depends on m
 * anyway. The own fp32 kernel takes these rows too (unpacked, transposing W's rows in registers:
 * as fast as the dot products, faster on a streamed LM head; BENCHMARKS.md), so that a row's bits
 * never depend on the batch. */
#define GEMV_MAX_ROWS 2

typedef float v8f __attribute__((vector_size(32)));
typedef uint16_t v8u16 __attribute__((vector_size(16)));
typedef uint32_t v8u32 __attribute__((vector_size(32)));

/* 8 weights from W's row at element k into *V, as fp32: BF16 widened exactly, or F32 as stored
 * (through a pointer: a 32-byte vector return value changes the ABI where AVX is off) */
static inline void load8(v8f *v, const void *w, int bf16, int k) {
    if (bf16) {
        v8u16 h;
        memcpy(&h, (const uint16_t *)w + k, sizeof h);
        v8u32 u = __builtin_convertvector(h, v8u32) << 16;
        memcpy(v, &u, sizeof *v);
    } else {
        memcpy(v, (const float *)w + k, sizeof *v);
    }
}

/* Σ_k x[k] w[k] in fp32 in a fixed order given k: four 8-lane partial sums over 32 k at a time,
 * combined pairwise, the lanes summed pairwise, then the tail in order. */
static float dot_row(const float *x, const void *w, int bf16, int k) {
    v8f a[4] = {{0}, {0}, {0}, {0}};
    int k0 = 0;
    for (; k0 + 32 <= k; k0 += 32)
        for (int i = 0; i < 4; i++) {
            v8f xv, wv;
            memcpy(&xv, x + k0 + 8 * i, sizeof xv);
            load8(&wv, w, bf16, k0 + 8 * i);
            a[i] += xv * wv;
        }
    v8f s = (a[0] + a[1]) + (a[2] + a[3]);
    float t = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; k0 < k; k0++) {
        float wk = bf16 ? m2d_bf16_to_f32(((const uint16_t *)w)[k0]) : ((const float *)w)[k0];
        t += x[k0] * wk;
    }
    return t;
}

/* W's rows [n0, n0+n) as a kernel of the sgemm path reads them: where they are when stored BF16 and
 * the kernel reads bf16 (BF16_OK; exact in fp32, and already bf16 in bf16 precision) or F32 in
 * fp32 precision (aligned: read as floats), from the prepared fp32 copy, else converted into
 * scratch (bf16-rounded in bf16 precision; *CONV, to be put back). */
typedef struct {
    const void *w;
    int bf16;
    int64_t ld;
    float *conv;
} slice_rows_t;

static slice_rows_t slice_rows(gemm_job *j, int n0, int n, int bf16_ok) {
    const m2d_gemm_w *w = j->c.w;
    int K = w->in, fp32 = j->g->prec == M2D_PREC_FP32;
    if (w->packed) return (slice_rows_t){w->packed->f32 + (size_t)(w->p0 + n0) * K, 0, K, NULL};
    size_t es = m2d_dtype_size(w->dtype);
    const char *at = (const char *)w->data + (size_t)n0 * w->ld * es;
    if (w->dtype == M2D_BF16 && bf16_ok) return (slice_rows_t){at, 1, w->ld, NULL};
    if (w->dtype == M2D_F32 && fp32 && ((uintptr_t)w->data & 3) == 0) return (slice_rows_t){at, 0, w->ld, NULL};
    float *conv = scratch_get(&j->g->scratch, sizeof(float) * (size_t)n * K);
    weight_rows_f32(w, n0, n, !fp32, conv);
    return (slice_rows_t){conv, 0, K, conv};
}

/* Output columns [n0, n0+n) of the sgemm path for few rows, by dot products */
static void gemv_slice(gemm_job *j, int slice) {
    int n0 = slice * M2D_GEMM_SLICE, n = M2D_MIN(M2D_GEMM_SLICE, j->c.w->out - n0), K = j->c.w->in;
    slice_rows_t src = slice_rows(j, n0, n, 1);
    size_t es = src.bf16 ? sizeof(uint16_t) : sizeof(float);
    for (int i = 0; i < j->c.m; i++) {
        const float *xi = j->xr + (size_t)i * j->ldxr;
        float *yi = j->c.y + (size_t)i * j->c.ldy + n0;
        for (int c = 0; c < n; c++) {
            float d = dot_row(xi, (const char *)src.w + (size_t)c * src.ld * es, src.bf16, K);
            yi[c] = j->c.beta == 0.0f ? d : d + j->c.beta * yi[c];
        }
    }
    scratch_put(&j->g->scratch, src.conv);
    atomic_fetch_add(&j->g->n_gemv, 1);
}

/* The sgemm path's kernel (gemm.h m2d_gemm_fp32_own): fixed by the instruction set, once per process */
static pthread_once_t fma32_once = PTHREAD_ONCE_INIT;
static int fma32_on;
static void fma32_choose(void) {
    const char *e = getenv("M2D_GEMM_FP32");
    fma32_on = m2d_fma32_cpu() && !(e && strcmp(e, "openblas") == 0);
}
int m2d_gemm_fp32_own(void) {
    pthread_once(&fma32_once, fma32_choose);
    return fma32_on;
}

/* Output columns [n0, n0+n) through the own fp32 kernel or sgemm */
static void sgemm_slice(gemm_job *j, int slice) {
    int n0 = slice * M2D_GEMM_SLICE, n = M2D_MIN(M2D_GEMM_SLICE, j->c.w->out - n0), K = j->c.w->in, m = j->c.m;
    int own = m2d_gemm_fp32_own();
    slice_rows_t src = slice_rows(j, n0, n, own);
    float *y = j->c.y + n0;
    if (!own) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, K, 1.0f, j->xr, j->ldxr, src.w, (int)src.ld,
                    j->c.beta, y, j->c.ldy);
    } else if (j->c.beta == 0.0f) {
        m2d_fma32_gemm(j->xr, j->ldxr, m, src.w, src.bf16, src.ld, n, K, y, j->c.ldy);
    } else { /* the chains pause in Y, so they run in scratch and beta Y is added once at the end */
        float *acc = scratch_get(&j->g->scratch, sizeof(float) * (size_t)m * n);
        m2d_fma32_gemm(j->xr, j->ldxr, m, src.w, src.bf16, src.ld, n, K, acc, n);
        store_rows(y, j->c.ldy, acc, m, n, j->c.beta);
        scratch_put(&j->g->scratch, acc);
    }
    scratch_put(&j->g->scratch, src.conv);
    atomic_fetch_add(own ? &j->g->n_fma32 : &j->g->n_sgemm, 1);
}

static void gemm_item(void *ctx, int item) {
    gemm_job *j = ctx;
    if (j->use_dnnl) {
        if (dnnl_slice(j, item) && atomic_exchange(&j->failed, 1) == 0)
            snprintf(j->err, sizeof j->err, "%s", m2d_errmsg());
    } else {
        if (j->c.m <= GEMV_MAX_ROWS && !m2d_gemm_fp32_own()) gemv_slice(j, item);
        else sgemm_slice(j, item);
    }
}

/* ------------------------------------------------------------------ planning and running */

static int check_weight(const m2d_gemm_ctx *g, const m2d_gemm_w *w) {
    if (!w || w->out <= 0 || w->in <= 0) return m2d_err("gemm: weight shape [%d, %d]", w ? w->out : 0, w ? w->in : 0);
    if (w->packed) {
        const m2d_gemm_packed *p = w->packed;
        int rows_ok = w->p0 % M2D_GEMM_SLICE == 0 && w->p0 + w->out <= p->out &&
                      (w->out % M2D_GEMM_SLICE == 0 || w->p0 + w->out == p->out);
        if (p->prec != g->prec || !rows_ok || p->in != w->in || w->p0 < 0)
            return m2d_err("gemm: prepared weight [%d, %d] %s used as rows %d..%d of [%d, %d] in a %s context", p->out,
                           p->in, m2d_precision_name(p->prec), w->p0, w->p0 + w->out, p->out, w->in,
                           m2d_precision_name(g->prec));
        return 0;
    }
    if (!w->data || w->ld < w->in) return m2d_err("gemm: weight [%d, %d] with row stride %lld", w->out, w->in, (long long)w->ld);
    if (w->dtype != M2D_F32 && w->dtype != M2D_BF16 && w->dtype != M2D_F16 && w->dtype != M2D_F64)
        return m2d_err("gemm: weight dtype %s is not a float type", m2d_dtype_name(w->dtype));
    return 0;
}

static int check_call(const m2d_gemm_ctx *g, const float *x, int ldx, int m, const m2d_gemm_w *w, const float *y,
                      int ldy) {
    if (check_weight(g, w)) return -1;
    if (m < 0 || (m > 0 && (!x || !y)) || ldx < w->in || ldy < w->out)
        return m2d_err("gemm: X [%d, %d] (row stride %d) -> Y [%d, %d] (row stride %d)", m, w->in, ldx, m, w->out, ldy);
    return 0;
}

/* Does W go to oneDNN? (bf16 precision on a CPU with native bf16, and a weight big enough to
 * amortise oneDNN's per-call cost; a prepared weight is in the layout of the kernel chosen then) */
static int wants_dnnl(const m2d_gemm_ctx *g, const m2d_gemm_w *w) {
    if (w->packed) return w->packed->slice != NULL;
    if (g->kernel == M2D_GEMM_SGEMM) return 0;
    if (!(g->prec == M2D_PREC_FP32 ? m2d_gemm_fp32_onednn_native() : m2d_gemm_bf16_native())) return 0;
    return g->kernel == M2D_GEMM_ONEDNN || g->kernel == M2D_GEMM_OWN ||
           (w->whole ? w->whole : (int64_t)w->out * w->in) >= M2D_GEMM_DNNL_MIN_WEIGHT;
}

/* ------------------------------------------------------------------ row independence */

/* Probe shapes [out, in] and batch sizes: where oneDNN switches kernels by the number of rows (AMX's
 * brgemm: measured on a Xeon model 207, a bf16 row computed in a call of 1-2 rows differs from the
 * same row in one of >= 3 at 128 x 2048, 1-4 vs >= 7 at 64 x 32, 1-16 vs >= 17 at 16 x 64; and at
 * k > 1024 its blocking over k changes with the rows, at any number of them), some row of a batch
 * differs from that row computed alone or in another batch. The first shape's k is 2 kc + 64
 * under an exact-rows plan (two chunks and a tail). */
static const int probe_shape[][2] = {{128, 2048}, {64, 32}, {16, 64}};
static const int probe_m[] = {2, 3, 5, 8, 17, 33, 64, 300};
#define PROBE_ROWS 1100 /* the reference batch: AMX's blocking over k changes again above 1024 rows */
#define PROBE_SINGLE 33 /* rows also computed alone */

/* X·Wᵀ for M rows as one group (EXACT: its exact_rows) */
static int probe_call(m2d_gemm_ctx *g, const float *x, int in, int m, const m2d_gemm_w *w, float *y, int exact) {
    m2d_gemm_group q = {x, in, m, w, y, w->out, 0.0f, exact};
    return m2d_gemm_grouped(g, &q, 1);
}

/* Rows [r0, r0+m) of X in one call equal, bit for bit, those rows of the reference YREF */
static int probe_rows_match(m2d_gemm_ctx *g, const float *x, int in, int r0, int m, const m2d_gemm_w *w,
                            const float *yref, float *y, int exact) {
    return !probe_call(g, x + (size_t)r0 * in, in, m, w, y, exact) &&
           memcmp(y, yref + (size_t)r0 * w->out, sizeof(float) * (size_t)m * w->out) == 0;
}

/* Every row of the reference batch of PROBE_ROWS equals that row computed alone (the first
 * PROBE_SINGLE), in each batch of probe_m from row 0, and in the batch of rows 300 on, on one shape. */
static int probe_shape_rows(m2d_gemm_ctx *g, int out, int in, uint64_t *st, int exact) {
    m2d_dtype dt = g->prec == M2D_PREC_BF16 ? M2D_BF16 : M2D_F32;
    float *wv = m2d_malloc(sizeof(float) * (size_t)out * in), *x = m2d_malloc(sizeof(float) * (size_t)PROBE_ROWS * in);
    float *yref = m2d_malloc(sizeof(float) * (size_t)PROBE_ROWS * out), *y = m2d_malloc(sizeof(float) * (size_t)PROBE_ROWS * out);
    void *wd = m2d_malloc(m2d_dtype_size(dt) * (size_t)out * in);
    for (size_t i = 0; i < (size_t)out * in; i++) wv[i] = (float)m2d_rand_normal(st);
    for (size_t i = 0; i < (size_t)PROBE_ROWS * in; i++) x[i] = (float)m2d_rand_normal(st);
    m2d_from_f32(dt, wv, (int64_t)out * in, wd);
    m2d_gemm_w w = m2d_gemm_weight(dt, wd, out, in, in);
    int same = !probe_call(g, x, in, PROBE_ROWS, &w, yref, exact);
    for (int r = 0; r < PROBE_SINGLE && same; r++) same = probe_rows_match(g, x, in, r, 1, &w, yref, y, exact);
    for (size_t i = 0; i < M2D_ARRAY_LEN(probe_m) && same; i++)
        same = probe_rows_match(g, x, in, 0, probe_m[i], &w, yref, y, exact);
    if (same) same = probe_rows_match(g, x, in, 300, PROBE_ROWS - 300, &w, yref, y, exact);
    free(wv), free(x), free(yref), free(y), free(wd);
    return same;
}

/* Whether rows are independent at precision P on oneDNN's kernels, as they are (KC 0) or under the
 * exact-rows plan (MIN_ROWS, KC), on every probe shape. */
static int probe_rows(m2d_precision p, int min_rows, int kc) {
    m2d_gemm_ctx *g;
    if (m2d_gemm_ctx_new(p, NULL, &g)) return 0;
    m2d_gemm_set_kernel(g, M2D_GEMM_ONEDNN);
    m2d_gemm_force_exact_plan(g, min_rows, kc);
    uint64_t st = 30;
    int same = 1;
    for (size_t i = 0; i < M2D_ARRAY_LEN(probe_shape) && same; i++)
        same = probe_shape_rows(g, probe_shape[i][0], i == 0 && kc ? 2 * kc + 64 : probe_shape[i][1], &st, kc > 0);
    m2d_gemm_ctx_free(g);
    return same;
}

/* Where oneDNN's matmul takes one kernel (and one reduction order) for every number of rows: fp32
 * on avx512_core and up (its brgemm; AMX has no fp32), bf16 on avx512_core_bf16 without AMX. Then
 * the probe confirms it on this CPU and this oneDNN (a new kernel that the ISA rule does not know
 * of turns the claim off). */
static int onednn_rows_independent(m2d_precision p) {
    unsigned isa = (unsigned)dnnl_get_effective_cpu_isa(), amx = (unsigned)dnnl_cpu_isa_avx512_core_amx;
    int isa_ok = p == M2D_PREC_FP32 ? m2d_gemm_fp32_onednn_native() : m2d_gemm_bf16_native() && (isa & amx) != amx;
    return isa_ok && probe_rows(p, 0, 0);
}

/* Exact-rows plans tried in order, cheapest first. Measured on a Xeon model 207 (oneDNN 2.6.3,
 * AMX bf16): with k <= 1024 every row of a call of >= 17 rows is the same bits as in any other such
 * call (16 to 2048 columns, up to 4096 rows); k = 1536 or 2048 and calls of 1-16 rows differ. */
static const int exact_candidates[][2] = {{17, 1024}, {33, 1024}, {17, 512}, {65, 512}, {65, 256}};

typedef struct {
    int indep;          /* rows independent as they are */
    int min_rows, kc;   /* else the exact-rows plan that makes them so (0: none) */
} rows_fact;

static pthread_once_t rows_once[2] = {PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT};
static rows_fact rows_facts[2];

static void rows_probe(m2d_precision p, rows_fact *f) {
    f->indep = onednn_rows_independent(p);
    int native = p == M2D_PREC_FP32 ? m2d_gemm_fp32_onednn_native() : m2d_gemm_bf16_native();
    for (size_t i = 0; native && !f->indep && !f->kc && i < M2D_ARRAY_LEN(exact_candidates); i++)
        if (probe_rows(p, exact_candidates[i][0], exact_candidates[i][1]))
            f->min_rows = exact_candidates[i][0], f->kc = exact_candidates[i][1];
}
static void rows_probe_fp32(void) { rows_probe(M2D_PREC_FP32, &rows_facts[0]); }
static void rows_probe_bf16(void) { rows_probe(M2D_PREC_BF16, &rows_facts[1]); }

static const rows_fact *rows_fact_of(m2d_precision p) {
    int b = m2d_gemm_resolve(p) == M2D_PREC_BF16;
    pthread_once(&rows_once[b], b ? rows_probe_bf16 : rows_probe_fp32);
    return &rows_facts[b];
}

int m2d_gemm_onednn_rows_independent(m2d_precision p) { return rows_fact_of(p)->indep; }

int m2d_gemm_exact_plan(m2d_precision p, int *min_rows, int *kc) {
    const rows_fact *f = rows_fact_of(p);
    *min_rows = f->min_rows, *kc = f->kc;
    return f->kc > 0;
}

void m2d_gemm_force_exact_plan(m2d_gemm_ctx *g, int min_rows, int kc) {
    g->force_rows = kc > 0 ? M2D_MAX(min_rows, 1) : 0;
    g->force_kc = kc > 0 ? kc : 0;
}

/* The plan exact_rows follows on this context (forced, else the probe's); 0 when none applies */
int m2d_gemm_plan_of(const m2d_gemm_ctx *g, int *min_rows, int *kc) {
    if (g->force_kc) {
        *min_rows = g->force_rows, *kc = g->force_kc;
        return 1;
    }
    return m2d_gemm_exact_plan(g->prec, min_rows, kc);
}

/* ------------------------------------------------------------------ the own bf16 kernel */

/* Where the own kernel may stand in for oneDNN at all: a CPU with AVX512-BF16 and oneDNN on its
 * avx512_core_bf16 brgemm (AMX's tiles sum in another order: never its bits). */
static int own_cpu_ok(void) {
    unsigned isa = (unsigned)dnnl_get_effective_cpu_isa(), amx = (unsigned)dnnl_cpu_isa_avx512_core_amx;
    return m2d_dpbf16_cpu() && m2d_gemm_bf16_native() && (isa & amx) != amx;
}

#define CHECK_ROWS 8
#define CHECK_COLS M2D_GEMM_SLICE

static int scale_exponent(uint64_t *st) { return (int)(fabs(m2d_rand_normal(st)) * 5.0) % 13 - 6; }

/* X [CHECK_ROWS, k] and W [CHECK_COLS, k] (bf16) of normals scaled by 2^-6..2^6, so that nearly every
 * output element rounds differently under another order of its sums. */
static void check_operands(int k, float *x, uint16_t *w) {
    uint64_t st = 0x5eed0000u + (uint64_t)k;
    float *wf = m2d_malloc(sizeof(float) * (size_t)k);
    for (size_t i = 0; i < (size_t)CHECK_ROWS * k; i++)
        x[i] = (float)(m2d_rand_normal(&st) * ldexp(1.0, scale_exponent(&st)));
    for (int r = 0; r < CHECK_COLS; r++) {
        for (int i = 0; i < k; i++) wf[i] = (float)(m2d_rand_normal(&st) * ldexp(1.0, scale_exponent(&st)));
        m2d_bf16_rows(wf, k, 1, k, w + (size_t)r * k);
    }
    free(wf);
}

/* The chunk length to try I-th for inner dimension K: whole, the block sizes oneDNN 2.6 was seen to
 * use, then every other multiple of 32 below K (its blocking may follow a CPU's cache sizes); 0 at
 * the end. */
static int chunk_candidate(int k, int i) {
    static const int seen[] = {512, 1024, 256, 2048, 128, 4096, 64, 8192};
    if (i == 0) return k + (k & 1);
    for (int j = 0; j < (int)M2D_ARRAY_LEN(seen); j++)
        if (--i == 0) return seen[j] < k ? seen[j] : -1;
    for (int kc = 32; kc < k; kc += 32) {
        int known = 0;
        for (int j = 0; j < (int)M2D_ARRAY_LEN(seen); j++) known |= seen[j] == kc;
        if (!known && --i == 0) return kc;
    }
    return 0;
}

/* The k chunk (see dpbf16.h) with which the own kernel gives oneDNN's bits for inner dimension K:
 * oneDNN's result on the check operands against the own kernel's for each candidate chunk length;
 * 0 when none matches. */
static int find_chunk(int k) {
    m2d_gemm_ctx *g;
    if (m2d_gemm_ctx_new(M2D_PREC_BF16, NULL, &g)) return 0;
    m2d_gemm_set_kernel(g, M2D_GEMM_ONEDNN);
    float *x = m2d_malloc(sizeof(float) * (size_t)CHECK_ROWS * k);
    uint16_t *w = m2d_malloc(sizeof(uint16_t) * (size_t)CHECK_COLS * k), *xb = m2d_malloc(sizeof(uint16_t) * (size_t)CHECK_ROWS * k);
    uint16_t *pk = m2d_malloc64(m2d_dpbf16_packed_bytes(CHECK_COLS, k));
    float *ref = m2d_malloc(sizeof(float) * CHECK_ROWS * CHECK_COLS), *own = m2d_malloc(sizeof(float) * CHECK_ROWS * CHECK_COLS);
    check_operands(k, x, w);
    m2d_bf16_rows(x, k, CHECK_ROWS, k, xb);
    m2d_dpbf16_pack(w, k, CHECK_COLS, k, pk);
    m2d_gemm_w wv = m2d_gemm_weight(M2D_BF16, w, CHECK_COLS, k, k);
    int found = 0;
    if (m2d_gemm(g, x, k, CHECK_ROWS, &wv, ref, CHECK_COLS, 0.0f) == 0) {
        for (int i = 0, kc; !found && (kc = chunk_candidate(k, i)) != 0; i++) {
            if (kc < 0) continue; /* a seen block size not below k */
            m2d_dpbf16_gemm(xb, k, CHECK_ROWS, pk, CHECK_COLS, k, kc, own, CHECK_COLS, 0);
            if (memcmp(own, ref, sizeof(float) * CHECK_ROWS * CHECK_COLS) == 0) found = kc;
        }
    }
    free(x), free(w), free(xb), free(pk), free(ref), free(own);
    m2d_gemm_ctx_free(g);
    return found;
}

/* find_chunk's answers, per k (the engine meets a handful of k): append-only, an entry published by
 * the count after it is written, so that the lookup on every GEMM call takes no lock. A k beyond
 * the table's capacity is answered 0 (oneDNN: the same bits, only the speed differs). */
#define CHUNK_KS 64
static struct {
    pthread_mutex_t mu; /* serialises the checks of new k */
    atomic_int n;
    int kc[CHUNK_KS][2]; /* {k, chunk or 0} */
} chunks = {PTHREAD_MUTEX_INITIALIZER, 0, {{0, 0}}};

/* The published answer for K, or -1. */
static int chunk_lookup(int k) {
    int n = atomic_load_explicit(&chunks.n, memory_order_acquire);
    for (int i = 0; i < n; i++)
        if (chunks.kc[i][0] == k) return chunks.kc[i][1];
    return -1;
}

static pthread_once_t own_cpu_once = PTHREAD_ONCE_INIT;
static int own_cpu;
static void own_cpu_probe(void) { own_cpu = own_cpu_ok(); }

int m2d_gemm_own_eligible(int k) {
    pthread_once(&own_cpu_once, own_cpu_probe);
    if (!own_cpu || k <= 0) return 0;
    int kc = chunk_lookup(k);
    if (kc >= 0) return kc;
    pthread_mutex_lock(&chunks.mu); /* the first caller for a new k checks it */
    kc = chunk_lookup(k);
    int n = atomic_load_explicit(&chunks.n, memory_order_relaxed);
    if (kc < 0 && n < CHUNK_KS) {
        kc = find_chunk(k);
        chunks.kc[n][0] = k, chunks.kc[n][1] = kc;
        atomic_store_explicit(&chunks.n, n + 1, memory_order_release);
    }
    pthread_mutex_unlock(&chunks.mu);
    return kc > 0 ? kc : 0;
}

/* The own kernel's micro-tile height, measured once: the fastest of a few on a prepared 256 x 2048 x
 * 256 product (every height gives the same bits, dpbf16.h). */
static struct {
    pthread_once_t once;
    int rows;
    double ms[3];
} tile = {PTHREAD_ONCE_INIT, 0, {0}};
static const int tile_heights[3] = {4, 8, M2D_DPBF16_MR};

/* The timing probes' operands: X [PROBE_M, PROBE_K] fp32 and W [PROBE_N, PROBE_K] bf16 of normals. */
enum { PROBE_M = 256, PROBE_K = 2048, PROBE_N = M2D_GEMM_SLICE };
static void probe_operands(float *x, uint16_t *w) {
    uint64_t st = 41;
    float *wf = m2d_malloc(sizeof(float) * PROBE_K);
    for (int i = 0; i < PROBE_M * PROBE_K; i++) x[i] = (float)m2d_rand_normal(&st);
    for (int r = 0; r < PROBE_N; r++) {
        for (int i = 0; i < PROBE_K; i++) wf[i] = (float)m2d_rand_normal(&st);
        m2d_bf16_rows(wf, PROBE_K, 1, PROBE_K, w + (size_t)r * PROBE_K);
    }
    free(wf);
}

static void choose_tile(void) {
    enum { M = PROBE_M, K = PROBE_K, N = PROBE_N };
    float *xf = m2d_malloc(sizeof(float) * M * K), *c = m2d_malloc(sizeof(float) * M * N);
    uint16_t *x = m2d_malloc(sizeof(uint16_t) * M * K), *w = m2d_malloc(sizeof(uint16_t) * N * K);
    uint16_t *pk = m2d_malloc64(m2d_dpbf16_packed_bytes(N, K));
    probe_operands(xf, w);
    m2d_bf16_rows(xf, K, M, K, x);
    m2d_dpbf16_pack(w, K, N, K, pk);
    for (int h = 0; h < 3; h++) {
        tile.ms[h] = HUGE_VAL;
        for (int rep = 0; rep < 3; rep++) {
            double t0 = m2d_now();
            m2d_dpbf16_gemm(x, K, M, pk, N, K, K, c, N, tile_heights[h]);
            tile.ms[h] = M2D_MIN(tile.ms[h], (m2d_now() - t0) * 1e3);
        }
        if (tile.ms[h] < tile.ms[tile.rows]) tile.rows = h;
    }
    tile.rows = tile_heights[tile.rows];
    free(xf), free(c), free(x), free(w), free(pk);
}

static int own_tile_rows(void) {
    pthread_once(&tile.once, choose_tile);
    return tile.rows;
}

/* The probe behind m2d_gemm_bf16_choice: as-stored bf16 weights [256, 2048] on 32 and 256 rows,
 * each kernel best of 3 after a warm-up, on one thread. */
static double probe_ms(m2d_gemm_kernel kern, const float *x, const m2d_gemm_w *w, float *y) {
    static const int rows[] = {32, 256};
    m2d_gemm_ctx *g;
    if (m2d_gemm_ctx_new(M2D_PREC_BF16, NULL, &g)) return HUGE_VAL;
    m2d_gemm_set_kernel(g, kern);
    double total = 0;
    for (size_t r = 0; r < M2D_ARRAY_LEN(rows); r++) {
        double best = HUGE_VAL;
        for (int rep = 0; rep < 4; rep++) {
            double t0 = m2d_now();
            if (m2d_gemm(g, x, w->in, rows[r], w, y, w->out, 0.0f)) best = HUGE_VAL, rep = 4;
            else if (rep > 0) best = M2D_MIN(best, m2d_now() - t0);
        }
        total += best;
    }
    m2d_gemm_ctx_free(g);
    return total * 1e3;
}

static struct {
    pthread_once_t once;
    int own;
    char line[256];
} choice = {PTHREAD_ONCE_INIT, 0, ""};

static void choose_bf16_kernel(void) {
    const char *force = getenv("M2D_GEMM_BF16");
    if (!m2d_gemm_own_eligible(2048)) {
        snprintf(choice.line, sizeof choice.line, "oneDNN (%s; own vdpbf16ps kernel not eligible: %s)", m2d_gemm_isa_name(),
                 !m2d_dpbf16_cpu() ? "no AVX512-BF16" : own_cpu ? "not oneDNN's bits" : "oneDNN not on avx512_core_bf16");
        return;
    }
    if (force && (strcmp(force, "own") == 0 || strcmp(force, "onednn") == 0)) {
        choice.own = strcmp(force, "own") == 0;
        snprintf(choice.line, sizeof choice.line, "%s (M2D_GEMM_BF16=%s)", choice.own ? "own vdpbf16ps kernel" : "oneDNN", force);
        return;
    }
    float *x = m2d_malloc(sizeof(float) * PROBE_M * PROBE_K), *y = m2d_malloc(sizeof(float) * PROBE_M * PROBE_N);
    uint16_t *wb = m2d_malloc(sizeof(uint16_t) * PROBE_N * PROBE_K);
    probe_operands(x, wb);
    m2d_gemm_w w = m2d_gemm_weight(M2D_BF16, wb, PROBE_N, PROBE_K, PROBE_K);
    double t_dnnl = probe_ms(M2D_GEMM_ONEDNN, x, &w, y), t_own = probe_ms(M2D_GEMM_OWN, x, &w, y);
    choice.own = t_own < t_dnnl;
    snprintf(choice.line, sizeof choice.line, "%s (probe: own %.2f ms with %d-row tiles, oneDNN %s %.2f ms; tiles of 4/8/12 rows %.2f/%.2f/%.2f ms)",
             choice.own ? "own vdpbf16ps kernel" : "oneDNN", t_own, own_tile_rows(), m2d_gemm_isa_name(), t_dnnl, tile.ms[0], tile.ms[1], tile.ms[2]);
    free(x), free(y), free(wb);
}

const char *m2d_gemm_bf16_choice(int *own) {
    pthread_once(&choice.once, choose_bf16_kernel);
    if (own) *own = choice.own;
    return choice.line;
}

/* Bytes of a [out, in] weight packed for the own kernel, slice by slice. */
static size_t own_packed_bytes(int out, int in) {
    size_t bytes = 0;
    for (int n0 = 0; n0 < out; n0 += M2D_GEMM_SLICE) bytes += m2d_dpbf16_packed_bytes(M2D_MIN(M2D_GEMM_SLICE, out - n0), in);
    return bytes;
}

/* The chunk for W's k when the own kernel takes W in a bf16 context, else 0 (oneDNN or sgemm). */
static int own_chunk(const m2d_gemm_ctx *g, const m2d_gemm_w *w) {
    if (w->packed) return w->packed->own_kc;
    if (g->prec != M2D_PREC_BF16 || !wants_dnnl(g, w) || g->kernel == M2D_GEMM_ONEDNN) return 0;
    int own = g->kernel == M2D_GEMM_OWN;
    if (g->kernel == M2D_GEMM_AUTO) m2d_gemm_bf16_choice(&own);
    return own ? m2d_gemm_own_eligible(w->in) : 0;
}

/* The own kernels' result for a row does not depend on the other rows (no blocking over k changes
 * with m), so it holds wherever one of them takes W: the bf16 one in oneDNN's place, the fp32 one
 * on the sgemm path. */
int m2d_gemm_rows_independent(const m2d_gemm_ctx *g, const m2d_gemm_w *w) {
    if (!wants_dnnl(g, w)) return m2d_gemm_fp32_own();
    return own_chunk(g, w) > 0 || m2d_gemm_onednn_rows_independent(g->prec);
}

int m2d_gemm_rows_independent_exact(const m2d_gemm_ctx *g, const m2d_gemm_w *w) {
    int min_rows, kc;
    return m2d_gemm_rows_independent(g, w) || (wants_dnnl(g, w) && !w->packed && m2d_gemm_plan_of(g, &min_rows, &kc));
}

/* Rows per oneDNN tile: all of X, unless the column slices alone give fewer than 4 work items for
 * a GEMM worth splitting (>= 64 MFLOP; the router, K/V projections): then blocks of >= 64 rows
 * (measured: router 512x128x2048 from 430 to 680 GFLOP/s). The blocks are a function of the shape
 * alone, so the result is the same on any thread count; where oneDNN's result for a row does not
 * depend on the other rows of its call (m2d_gemm_onednn_rows_independent) this changes the speed
 * only. sgemm's blocking depends on m, so sgemm tiles are whole column slices. */
static int tile_rows(int m, int out, int in) {
    int ns = n_slices(out);
    if (ns >= 4 || 2.0 * m * out * in < 64e6) return m;
    int blocks = M2D_MIN((4 + ns - 1) / ns, m / 64);
    return blocks > 1 ? (m + blocks - 1) / blocks : m;
}

/* Bytes of oneDNN's dense copy of ROWS x K of X: bf16 bit patterns, or fp32 */
static size_t x_copy_bytes(int rows, int K, int bf16) {
    return (size_t)rows * K * (bf16 ? sizeof(uint16_t) : sizeof(float));
}

/* ROWS x K of X (row stride LDX) as oneDNN reads it: dense, rounded to bf16 when BF16 */
static void copy_x_rows(const float *x, int ldx, int rows, int K, int bf16, void *out) {
    if (bf16) {
        m2d_bf16_rows(x, ldx, rows, K, out);
        return;
    }
    for (int r = 0; r < rows; r++) memcpy((float *)out + (size_t)r * K, x + (size_t)r * ldx, sizeof(float) * (size_t)K);
}

/* X for oneDNN: in place (fp32 with dense rows), else a dense copy into scratch (see dnnl_slice) */
static void plan_x(gemm_job *j) {
    int K = j->c.w->in, bf16 = j->g->prec == M2D_PREC_BF16;
    if (!bf16 && j->c.ldx == K) {
        j->xd = j->c.x;
        return;
    }
    void *xd = scratch_get(&j->g->scratch, x_copy_bytes(j->c.m, K, bf16));
    copy_x_rows(j->c.x, j->c.ldx, j->c.m, K, bf16, xd);
    j->xd = j->x_copy = xd;
}

/* Group Q's x_layout_t on G */
static x_layout_t x_layout(const m2d_gemm_ctx *g, const m2d_gemm_group *q) {
    x_layout_t l = {q->m, 0, 0};
    int r, c;
    if (q->exact_rows && wants_dnnl(g, q->w) && !q->w->packed && !own_chunk(g, q->w) && m2d_gemm_plan_of(g, &r, &c) &&
        (q->m < r || q->w->in > c))
        l = (x_layout_t){M2D_MAX(q->m, r), c, r};
    return l;
}

/* Rows [r0, r1) of X in the chunk-major layout L */
static void copy_x_chunks(const m2d_gemm_group *q, x_layout_t l, int bf16, int r0, int r1, void *out) {
    int K = q->w->in;
    size_t es = bf16 ? sizeof(uint16_t) : sizeof(float);
    for (int k0 = 0; k0 < K; k0 += l.kc) {
        int kn = M2D_MIN(l.kc, K - k0);
        for (int r = r0; r < r1; r++)
            copy_x_rows(q->x + (size_t)(r < q->m ? r : 0) * q->ldx + k0, q->ldx, 1, kn, bf16,
                        (char *)out + ((size_t)l.rows * k0 + (size_t)r * kn) * es);
    }
}

/* Choose the kernel and make the operand copies it reads; the work items are tiles of fixed
 * column slices (and, for oneDNN, row blocks). */
static void gemm_plan(gemm_job *j, int parallel) {
    m2d_gemm_ctx *g = j->g;
    int K = j->c.w->in;
    j->use_dnnl = wants_dnnl(g, j->c.w);
    j->own_kc = j->use_dnnl ? own_chunk(g, j->c.w) : 0;
    j->xl = x_layout(g, &j->c);
    j->n_items = n_slices(j->c.w->out);
    j->rows = j->c.m;
    if (j->use_dnnl) {
        /* a group of a grouped call runs on one thread: no row blocks (each would repack W's slice) */
        j->rows = parallel ? tile_rows(j->c.m, j->c.w->out, K) : j->c.m;
        if (j->rows < j->xl.min_rows) j->rows = j->c.m; /* a padded tile is the whole call */
        j->n_items *= (j->c.m + j->rows - 1) / j->rows;
        if (j->xd) return; /* the caller's shared copy (m2d_gemm_grouped) */
        if (!j->xl.kc) {
            plan_x(j);
            return;
        }
        int bf16 = g->prec == M2D_PREC_BF16;
        j->xd = j->x_copy = scratch_get(&g->scratch, x_copy_bytes(j->xl.rows, K, bf16));
        copy_x_chunks(&j->c, j->xl, bf16, 0, j->xl.rows, j->x_copy);
        return;
    }
    j->xr = j->c.x;
    j->ldxr = j->c.ldx;
    if (g->prec == M2D_PREC_BF16) {
        float *xr = scratch_get(&g->scratch, sizeof(float) * (size_t)j->c.m * K);
        m2d_bf16_rows_f32(j->c.x, j->c.ldx, j->c.m, K, xr);
        j->xr = xr;
        j->ldxr = K;
    }
}

static void gemm_done(gemm_job *j) {
    scratch_put(&j->g->scratch, j->x_copy);
    if (j->xr != j->c.x) scratch_put(&j->g->scratch, (void *)j->xr);
}

static gemm_job job_for(m2d_gemm_ctx *g, const m2d_gemm_group *call) {
    gemm_job j;
    memset(&j, 0, sizeof j);
    j.g = g;
    j.c = *call;
    return j;
}

/* Plan, run the slices (through the pool when PARALLEL), release the scratch. */
static int gemm_run(gemm_job *j, int parallel) {
    gemm_plan(j, parallel);
    if (parallel) m2d_pool_for(j->g->pool, j->n_items, gemm_item, j);
    else
        for (int i = 0; i < j->n_items; i++) gemm_item(j, i);
    gemm_done(j);
    return atomic_load(&j->failed) ? m2d_err("%s", j->err) : 0;
}

/* One checked call, split over the pool */
static int gemm_call(m2d_gemm_ctx *g, const m2d_gemm_group *call) {
    if (call->m == 0) return 0;
    gemm_job j = job_for(g, call);
    return gemm_run(&j, 1);
}

int m2d_gemm(m2d_gemm_ctx *g, const float *x, int ldx, int m, const m2d_gemm_w *w, float *y, int ldy, float beta) {
    if (check_call(g, x, ldx, m, w, y, ldy)) return -1;
    m2d_gemm_group call = {x, ldx, m, w, y, ldy, beta, 0};
    return gemm_call(g, &call);
}

typedef struct {
    m2d_gemm_ctx *g;
    const m2d_gemm_group *grp;
    const void **xd; /* [n_groups] oneDNN's copy of the group's X made once for a run of groups, or NULL
                      * (in the group's x_layout) */
    atomic_int failed;
    char err[256];
} group_job;

static void group_item(void *ctx, int item) {
    group_job *gj = ctx;
    const m2d_gemm_group *q = &gj->grp[item];
    if (q->m == 0) return;
    gemm_job j = job_for(gj->g, q);
    j.xd = gj->xd[item];
    if (gemm_run(&j, 0) && atomic_exchange(&gj->failed, 1) == 0)
        snprintf(gj->err, sizeof gj->err, "group %d: %s", item, m2d_errmsg());
}

/* Does the group hand oneDNN a copy of X (bf16, or fp32 with gaps between rows)? */
static int needs_x_copy(const m2d_gemm_ctx *g, const m2d_gemm_group *q) {
    return q->m > 0 && wants_dnnl(g, q->w) && (g->prec == M2D_PREC_BF16 || q->ldx != q->w->in);
}

/* The same X in the same layout (x_layout) */
static int same_x(const m2d_gemm_ctx *g, const m2d_gemm_group *a, const m2d_gemm_group *b) {
    x_layout_t la = x_layout(g, a), lb = x_layout(g, b);
    return a->x == b->x && a->ldx == b->ldx && a->m == b->m && a->w->in == b->w->in && la.rows == lb.rows &&
           la.kc == lb.kc;
}

typedef struct {
    const m2d_gemm_group *q;
    void *out;
    int bf16;
    x_layout_t l;
} xcopy_job;

#define XCOPY_ROWS 32

static void xcopy_item(void *ctx, int item) {
    const xcopy_job *j = ctx;
    int r0 = item * XCOPY_ROWS, n = M2D_MIN(XCOPY_ROWS, j->l.rows - r0), K = j->q->w->in;
    if (j->l.kc) copy_x_chunks(j->q, j->l, j->bf16, r0, r0 + n, j->out);
    else copy_x_rows(j->q->x + (size_t)r0 * j->q->ldx, j->q->ldx, n, K, j->bf16, (char *)j->out + x_copy_bytes(r0, K, j->bf16));
}

/* X shared by consecutive groups (calibration: every expert's gate and up read the same rows) is
 * copied for oneDNN once, its rows in parallel, instead of once per group. Returns the copies
 * made, to be put back with scratch_put (NULL-terminated in COPIES[n_groups + 1]). */
static void share_x_copies(m2d_gemm_ctx *g, const m2d_gemm_group *grp, int n, const void **xd, void **copies) {
    int nc = 0;
    for (int i = 0; i < n; i++) {
        xd[i] = NULL;
        if (!needs_x_copy(g, &grp[i])) continue;
        if (i > 0 && xd[i - 1] && same_x(g, &grp[i - 1], &grp[i])) {
            xd[i] = xd[i - 1];
            continue;
        }
        if (i + 1 >= n || !needs_x_copy(g, &grp[i + 1]) || !same_x(g, &grp[i], &grp[i + 1])) continue; /* its own */
        int bf16 = g->prec == M2D_PREC_BF16;
        x_layout_t l = x_layout(g, &grp[i]);
        xcopy_job j = {&grp[i], scratch_get(&g->scratch, x_copy_bytes(l.rows, grp[i].w->in, bf16)), bf16, l};
        m2d_pool_for(g->pool, (l.rows + XCOPY_ROWS - 1) / XCOPY_ROWS, xcopy_item, &j);
        xd[i] = copies[nc++] = j.out;
    }
    copies[nc] = NULL;
}

int m2d_gemm_grouped(m2d_gemm_ctx *g, const m2d_gemm_group *groups, int n_groups) {
    for (int i = 0; i < n_groups; i++) {
        const m2d_gemm_group *q = &groups[i];
        char where[32];
        snprintf(where, sizeof where, "group %d", i);
        if (check_call(g, q->x, q->ldx, q->m, q->w, q->y, q->ldy)) return m2d_err_prefix(where);
    }
    int nt = m2d_pool_threads(g->pool);
    if (nt > 1 && n_groups < 2 * nt) { /* few groups: split each one instead */
        for (int i = 0; i < n_groups; i++)
            if (gemm_call(g, &groups[i])) return -1;
        return 0;
    }
    const void **xd = m2d_malloc(sizeof *xd * (size_t)n_groups);
    void **copies = m2d_malloc(sizeof *copies * (size_t)(n_groups + 1));
    share_x_copies(g, groups, n_groups, xd, copies);
    group_job gj = {g, groups, xd, 0, ""};
    m2d_pool_for(g->pool, n_groups, group_item, &gj);
    for (int i = 0; copies[i]; i++) scratch_put(&g->scratch, copies[i]);
    free(xd);
    free(copies);
    return atomic_load(&gj.failed) ? m2d_err("%s", gj.err) : 0;
}

/* ------------------------------------------------------------------ preparing weights */

/* oneDNN's preferred layout of Wᵀ[:, slice] ([in, n], bf16 or fp32 when F32); it does not depend
 * on m (checked for m = 1..2048: BA16a64b2a for bf16 on AVX512-BF16), so one copy serves every
 * batch size. */
static dnnl_status_t blocked_md(int n, int k, int f32, dnnl_memory_desc_t *out) {
    dnnl_memory_desc_t a, b, c;
    dnnl_dims_t ad = {M2D_GEMM_SLICE, k}, bd = {k, n}, cd = {M2D_GEMM_SLICE, n};
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_data_type_t t = f32 ? dnnl_f32 : dnnl_bf16;
    dnnl_status_t s = dnnl_memory_desc_init_by_tag(&a, 2, ad, t, dnnl_ab);
    if (s == dnnl_success) s = dnnl_memory_desc_init_by_tag(&b, 2, bd, t, dnnl_format_tag_any);
    if (s == dnnl_success) s = dnnl_memory_desc_init_by_tag(&c, 2, cd, dnnl_f32, dnnl_ab);
    if (s == dnnl_success) s = dnnl_matmul_desc_init(&md, &a, &b, NULL, &c);
    int saved = saved_omp_threads();
    if (s == dnnl_success) s = dnnl_primitive_desc_create(&pd, &md, NULL, dnnl_eng, NULL);
    restore_omp_threads(saved);
    if (s == dnnl_success) *out = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    dnnl_primitive_desc_destroy(pd);
    return s;
}

/* Reorder plain rows (Wᵀ as [k, n] with stride ldw; bf16, or fp32 when F32) into the slice's
 * blocked buffer. */
static dnnl_status_t reorder_slice(const void *w, int64_t ldw, int n, int k, int f32, packed_slice *ps) {
    dnnl_memory_desc_t src;
    dnnl_dims_t d = {k, n}, st = {1, ldw};
    dnnl_primitive_desc_t rpd = NULL;
    dnnl_primitive_t r = NULL;
    dnnl_memory_t ms = NULL, md = NULL;
    dnnl_stream_t strm = NULL;
    int saved = saved_omp_threads();
    dnnl_status_t s = dnnl_memory_desc_init_by_strides(&src, 2, d, f32 ? dnnl_f32 : dnnl_bf16, st);
    if (s == dnnl_success) s = dnnl_reorder_primitive_desc_create(&rpd, &src, dnnl_eng, &ps->md, dnnl_eng, NULL);
    if (s == dnnl_success) s = dnnl_primitive_create(&r, rpd);
    if (s == dnnl_success) s = dnnl_stream_create(&strm, dnnl_eng, dnnl_stream_default_flags);
    if (s == dnnl_success) s = dnnl_memory_create(&ms, &src, dnnl_eng, (void *)w);
    if (s == dnnl_success) s = dnnl_memory_create(&md, &ps->md, dnnl_eng, ps->data);
    if (s == dnnl_success) {
        dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, ms}, {DNNL_ARG_TO, md}};
        s = dnnl_primitive_execute(r, strm, 2, args);
    }
    restore_omp_threads(saved);
    dnnl_memory_destroy(ms);
    dnnl_memory_destroy(md);
    dnnl_stream_destroy(strm);
    dnnl_primitive_destroy(r);
    dnnl_primitive_desc_destroy(rpd);
    return s;
}

typedef struct {
    m2d_gemm_ctx *g;
    const m2d_gemm_w *w;
    m2d_gemm_packed *p;
    atomic_int status; /* first oneDNN failure, 0 when none */
} prep_job;

/* A slice in the own kernel's layout: from the stored bf16 rows, or from rows rounded to bf16. */
static void prep_own_slice(const m2d_gemm_w *w, packed_slice *ps) {
    ps->data = m2d_malloc64(m2d_dpbf16_packed_bytes(ps->n, w->in));
    if (w->dtype == M2D_BF16) {
        m2d_dpbf16_pack((const uint16_t *)w->data + (int64_t)ps->n0 * w->ld, w->ld, ps->n, w->in, ps->data);
        return;
    }
    uint16_t *b = m2d_malloc(sizeof(uint16_t) * (size_t)ps->n * w->in);
    float *tmp = m2d_malloc(sizeof(float) * (size_t)w->in);
    weight_rows_bf16(w, ps->n0, ps->n, tmp, b);
    m2d_dpbf16_pack(b, w->in, ps->n, w->in, ps->data);
    free(b);
    free(tmp);
}

static void prep_item(void *ctx, int i) {
    prep_job *j = ctx;
    const m2d_gemm_w *w = j->w;
    packed_slice *ps = &j->p->slice[i];
    ps->n0 = i * M2D_GEMM_SLICE;
    ps->n = M2D_MIN(M2D_GEMM_SLICE, w->out - ps->n0);
    int f32 = j->g->prec == M2D_PREC_FP32;
    if (j->p->own_kc) {
        prep_own_slice(w, ps);
        return;
    }
    dnnl_status_t s = blocked_md(ps->n, w->in, f32, &ps->md);
    if (s == dnnl_success) ps->data = m2d_malloc64(dnnl_memory_desc_get_size(&ps->md));
    size_t es = m2d_dtype_size(w->dtype);
    if (s == dnnl_success && w->dtype == (f32 ? M2D_F32 : M2D_BF16)) { /* the stored rows as they are */
        s = reorder_slice((const char *)w->data + (size_t)(ps->n0 * w->ld) * es, w->ld, ps->n, w->in, f32, ps);
    } else if (s == dnnl_success && f32) { /* other dtypes: to fp32 first */
        float *b = m2d_malloc(sizeof(float) * (size_t)ps->n * w->in);
        weight_rows_f32(w, ps->n0, ps->n, 0, b);
        s = reorder_slice(b, w->in, ps->n, w->in, 1, ps);
        free(b);
    } else if (s == dnnl_success) { /* round to bf16 first */
        uint16_t *b = m2d_malloc(sizeof(uint16_t) * (size_t)ps->n * w->in);
        float *tmp = m2d_malloc(sizeof(float) * (size_t)w->in);
        weight_rows_bf16(w, ps->n0, ps->n, tmp, b);
        s = reorder_slice(b, w->in, ps->n, w->in, 0, ps);
        free(b);
        free(tmp);
    }
    if (s != dnnl_success) atomic_store(&j->status, (int)s);
}

void m2d_gemm_packed_free(m2d_gemm_packed *p) {
    if (!p) return;
    for (int i = 0; i < p->n_slices; i++) free(p->slice[i].data);
    free(p->slice);
    free(p->f32);
    free(p);
}

int m2d_gemm_prepare(m2d_gemm_ctx *g, const m2d_gemm_w *w, m2d_gemm_packed **out) {
    *out = NULL;
    if (check_weight(g, w)) return -1;
    if (w->packed) return m2d_err("gemm: prepare: the weight is already prepared");
    m2d_gemm_packed *p = m2d_calloc(1, sizeof *p);
    p->prec = g->prec;
    p->out = w->out;
    p->in = w->in;
    if (!wants_dnnl(g, w)) { /* sgemm reads fp32 (bf16-rounded in bf16 precision) */
        p->f32 = m2d_malloc64(sizeof(float) * (size_t)w->out * w->in);
        weight_rows_f32(w, 0, w->out, g->prec == M2D_PREC_BF16, p->f32);
        p->bytes = sizeof(float) * (size_t)w->out * w->in;
        *out = p;
        return 0;
    }
    p->n_slices = n_slices(w->out);
    p->slice = m2d_calloc((size_t)p->n_slices, sizeof *p->slice);
    p->own_kc = own_chunk(g, w);
    prep_job j = {g, w, p, 0};
    m2d_pool_for(g->pool, p->n_slices, prep_item, &j);
    if (atomic_load(&j.status)) {
        m2d_gemm_packed_free(p);
        return m2d_err("gemm: prepare [%d, %d] for oneDNN: status %d", w->out, w->in, atomic_load(&j.status));
    }
    p->bytes = p->own_kc ? own_packed_bytes(w->out, w->in) : 0;
    for (int i = 0; i < p->n_slices && !p->own_kc; i++) p->bytes += dnnl_memory_desc_get_size(&p->slice[i].md);
    *out = p;
    return 0;
}

size_t m2d_gemm_packed_bytes(const m2d_gemm_packed *p) { return p ? p->bytes : 0; }

int m2d_gemm_packed_current(const m2d_gemm_ctx *g, const m2d_gemm_packed *p, const m2d_gemm_w *w) {
    return p->prec == g->prec && (p->slice != NULL) == wants_dnnl(g, w) && p->own_kc == own_chunk(g, w);
}

m2d_gemm_w m2d_gemm_packed_rows(const m2d_gemm_packed *p, int r0, int n) {
    return (m2d_gemm_w){M2D_F32, NULL, n, p->in, p->in, p, r0, 0};
}

/* ------------------------------------------------------------------ prepared == as stored */

/* Whether oneDNN's result for a prepared copy has the as-stored bits, per precision, inner
 * dimension k and width of the last column slice (out % M2D_GEMM_SLICE: oneDNN picks its blocking
 * per slice shape), found at first use: a bf16 weight of uniform values, one full slice and one of
 * that width, on 300, 512, 1,100, 150, 777, 64, 37, 17 and 1 rows, prepared and as stored,
 * on one thread, each row count both as one call (split into row blocks by its shape, as a single
 * GEMM of a weight of fewer than 4 slices is) and whole (as grouped calls and wider weights run).
 * oneDNN 2.6's AMX kernels pick their k blocks by the problem's size and layout, so a prepared copy
 * gives other bits at some k and row counts and not at others (measured: k <= 768 the same
 * everywhere; odd k from 999 and even k from 1,216 differ at some row counts; at k = 2,100, 3 and
 * 1,100 rows agree and 300 do not; the blocking changes again past 1,024 rows): the probe tries
 * row counts of each kind the engine runs (windows of 512 and past 1,024 rows, odd MC and expert
 * batches), those most often different first. A sample, not a proof: it is as good as the row
 * counts it tries. So a kernel found to block k by layout at all is trusted nowhere: before the
 * first answer for a precision, two canaries (k = 999 and 2,100, 44 columns past a full slice: both
 * differ on AMX) are probed, and where either differs no weight is prepared in that precision
 * (layout_sensitive).
 * oneDNN's AVX512-BF16 and fp32 kernels gave the same bits at every k tried. */
enum { EXACT_FACTS = 256 };
typedef struct {
    m2d_precision prec;
    int k, rest, exact;
} exact_fact;
static struct {
    pthread_mutex_t mu;
    int n;
    exact_fact f[EXACT_FACTS];
    int sensitive[2]; /* per precision (index: bf16): -1 not probed yet, 1 the canaries differed */
} exact_facts = {PTHREAD_MUTEX_INITIALIZER, 0, {{0, 0, 0, 0}}, {-1, -1}};

/* uniform in [-1, 1) with 24 random bits (splitmix64: cheaper than normals, 3 M of them at k = 6,144) */
static float uniform_pm1(uint64_t *st) { return (float)(m2d_splitmix64(st) >> 40) * 0x1p-23f - 1.0f; }

/* Y for the first M rows of X by W (as stored or prepared), as one call (WHOLE 0) or as a group of
 * one, whose rows stay whole; 0 on success */
static int probe_product(m2d_gemm_ctx *g, const float *x, int k, int m, const m2d_gemm_w *w, float *y, int whole) {
    m2d_gemm_group one = {x, k, m, w, y, w->out, 0.0f, 0};
    return whole ? m2d_gemm_grouped(g, &one, 1) : m2d_gemm(g, x, k, m, w, y, w->out, 0.0f);
}

static int prepare_probe(m2d_precision prec, int k, int rest) {
    static const int rows[] = {300, 512, 1100, 150, 777, 64, 37, 17, 1};
    enum { M = 1100 };
    const int N = M2D_GEMM_SLICE + rest;
    m2d_gemm_ctx *g;
    if (m2d_gemm_ctx_new(prec, NULL, &g)) return 0;
    m2d_gemm_set_kernel(g, M2D_GEMM_ONEDNN); /* the caller's weight takes oneDNN, whatever this one's size */
    uint64_t st = 97;
    float *x = m2d_malloc(sizeof(float) * M * k), *wf = m2d_malloc(sizeof(float) * k);
    float *y1 = m2d_malloc(sizeof(float) * M * N), *y2 = m2d_malloc(sizeof(float) * M * N);
    uint16_t *wb = m2d_malloc(sizeof(uint16_t) * N * k);
    for (size_t i = 0; i < (size_t)M * k; i++) x[i] = uniform_pm1(&st);
    for (int r = 0; r < N; r++) {
        for (int i = 0; i < k; i++) wf[i] = uniform_pm1(&st);
        m2d_bf16_rows(wf, k, 1, k, wb + (size_t)r * k);
    }
    m2d_gemm_w w = m2d_gemm_weight(M2D_BF16, wb, N, k, k), wp = w;
    m2d_gemm_packed *pk = NULL;
    int same = m2d_gemm_prepare(g, &w, &pk) == 0;
    wp.packed = pk;
    for (size_t i = 0; i < 2 * M2D_ARRAY_LEN(rows) && same; i++) {
        int m = rows[i / 2], whole = (int)(i % 2);
        same = !probe_product(g, x, k, m, &w, y1, whole) && !probe_product(g, x, k, m, &wp, y2, whole) &&
               memcmp(y1, y2, sizeof(float) * (size_t)m * N) == 0;
    }
    m2d_gemm_packed_free(pk);
    m2d_gemm_ctx_free(g);
    free(x), free(wf), free(y1), free(y2), free(wb);
    return same;
}

/* 1 when oneDNN's kernel for PREC sums k in other blocks for a prepared copy at the canaries (called
 * with exact_facts.mu held; probed once) */
static int layout_sensitive(m2d_precision prec) {
    int *s = &exact_facts.sensitive[prec == M2D_PREC_BF16];
    if (*s < 0) *s = !prepare_probe(prec, 999, 44) || !prepare_probe(prec, 2100, 44);
    return *s;
}

int m2d_gemm_prepare_exact(const m2d_gemm_ctx *g, const m2d_gemm_w *w) {
    if (check_weight(g, w) || !wants_dnnl(g, w) || own_chunk(g, w)) return 1; /* sgemm's fp32 copy, the own layout */
    int rest = w->out % M2D_GEMM_SLICE;
    pthread_mutex_lock(&exact_facts.mu); /* held through a probe: each (precision, k, rest) is probed once */
    int exact = -1;
    for (int i = 0; i < exact_facts.n && exact < 0; i++) {
        const exact_fact *f = &exact_facts.f[i];
        if (f->prec == g->prec && f->k == w->in && f->rest == rest) exact = f->exact;
    }
    if (exact < 0 && exact_facts.n < EXACT_FACTS) {
        exact = !layout_sensitive(g->prec) && prepare_probe(g->prec, w->in, rest);
        exact_facts.f[exact_facts.n++] = (exact_fact){g->prec, w->in, rest, exact};
    }
    pthread_mutex_unlock(&exact_facts.mu);
    return exact > 0; /* a full table: as stored, which is always right */
}

size_t m2d_gemm_prepare_bytes(m2d_gemm_ctx *g, const m2d_gemm_w *w) {
    if (check_weight(g, w) || w->packed) return 0;
    if (!wants_dnnl(g, w)) return sizeof(float) * (size_t)w->out * w->in;
    if (own_chunk(g, w)) return own_packed_bytes(w->out, w->in);
    /* every slice is M2D_GEMM_SLICE wide but the last: two layouts to ask oneDNN for */
    int full = w->out / M2D_GEMM_SLICE, rest = w->out % M2D_GEMM_SLICE, f32 = g->prec == M2D_PREC_FP32;
    dnnl_memory_desc_t md;
    size_t bytes = 0;
    if (full && blocked_md(M2D_GEMM_SLICE, w->in, f32, &md) == dnnl_success)
        bytes += (size_t)full * dnnl_memory_desc_get_size(&md);
    if (rest && blocked_md(rest, w->in, f32, &md) == dnnl_success) bytes += dnnl_memory_desc_get_size(&md);
    return bytes;
}

/* ------------------------------------------------------------------ context */

int m2d_gemm_ctx_new(m2d_precision p, m2d_pool *pool, m2d_gemm_ctx **out) {
    *out = NULL;
    if (dnnl_ready()) return -1;
    m2d_gemm_ctx *g = m2d_calloc(1, sizeof *g);
    g->prec = m2d_gemm_resolve(p);
    g->pool = pool;
    g->cache.cap = CACHE_CAP;
    pthread_mutex_init(&g->cache.mu, NULL);
    pthread_mutex_init(&g->scratch.mu, NULL);
    *out = g;
    return 0;
}

void m2d_gemm_ctx_free(m2d_gemm_ctx *g) {
    if (!g) return;
    cache_free(&g->cache);
    scratch_free(&g->scratch);
    pthread_mutex_destroy(&g->cache.mu);
    pthread_mutex_destroy(&g->scratch.mu);
    free(g);
}

m2d_precision m2d_gemm_precision(const m2d_gemm_ctx *g) { return g->prec; }

void m2d_gemm_set_kernel(m2d_gemm_ctx *g, m2d_gemm_kernel k) { g->kernel = k; }

void m2d_gemm_set_cache_capacity(m2d_gemm_ctx *g, int n) {
    pthread_mutex_lock(&g->cache.mu);
    g->cache.cap = n > 1 ? n : 1;
    while (g->cache.n > g->cache.cap) cache_evict_lru(&g->cache);
    pthread_mutex_unlock(&g->cache.mu);
}

m2d_gemm_stats m2d_gemm_get_stats(const m2d_gemm_ctx *g) {
    return (m2d_gemm_stats){atomic_load(&g->n_sgemm), atomic_load(&g->n_fma32), atomic_load(&g->n_dnnl),
                            atomic_load(&g->n_own), atomic_load(&g->n_gemv), atomic_load(&g->n_created), atomic_load(&g->n_hits)};
}
