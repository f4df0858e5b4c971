/* backend_cpu — the "cpu" backend: every weight GEMM through the GEMM module (gemm.h: oneDNN's
 * fp32 or bf16 matmul, sgemm for tiny weights and CPUs without them), one context per precision;
 * attention's GEMMs through the same module in fp32 (OpenBLAS is single-threaded between
 * enter/leave). All parallelism is this backend's own pool (pool.h): GEMMs in fixed tiles of output
 * columns, attention by (kv head, block of query rows), MoE experts as grouped GEMMs,
 * log-probabilities by rows.
 * One kind of thread only: with OpenBLAS's pool threads next to ours, idle pool threads spin in
 * sched_yield and took up to half of the time on tiny shapes (perf); oneDNN's OpenMP team never
 * starts (gemm.c). Fixed tiles leave each element's reduction order unchanged, so results do not
 * depend on the thread count. Thread count and tuning are per backend object (one per engine);
 * this file is the only one in the product that calls OpenBLAS's threading functions.
 *
 * Buffers are host memory; weights are the checkpoint's tensors (mmapped or in memory), read as
 * stored by the GEMM module (bf16 in place; converted per tile into its scratch otherwise), or
 * prepared once in the kernel's layout and kept (make_resident; norms: an fp32 copy). Every
 * kernel has an obviously-correct counterpart in tests/test_engine.c.
 *
 * This file: the backend's state, conversion, weights, memory, the weight GEMM, lifecycle and the
 * ops table. The op families are files of their own (backend_cpu_rows.c, backend_cpu_attn.c,
 * backend_cpu_moe.c; the training ops backend_cpu_train.c), sharing backend_cpu_impl.h. */
#include "engine/backend_cpu_impl.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- dtype conversion (m2d_to_f32 widens BF16 16 lanes at a time) ---- */
typedef struct {
    m2d_dtype t;
    const void *src;
    int64_t first, n, chunk;
    float *dst;
} conv_job;

static void conv_item(void *ctx, int item) {
    conv_job *j = ctx;
    int64_t a = (int64_t)item * j->chunk, b = M2D_MIN(a + j->chunk, j->n);
    m2d_to_f32(j->t, j->src, j->first + a, b - a, j->dst + a);
}

/* n elements from FIRST to fp32, in parallel chunks of 256 Ki elements */
static void convert_par(const cpu_be *c, m2d_dtype t, const void *src, int64_t first, int64_t n, float *dst) {
    const int64_t chunk = 1 << 18;
    if (n <= chunk || c->threads <= 1) {
        m2d_to_f32(t, src, first, n, dst);
        return;
    }
    conv_job j = {t, src, first, n, chunk, dst};
    parallel_for(c, (int)((n + chunk - 1) / chunk), conv_item, &j);
}



 /* weight rows converted */

/* fp32 view of elements [first, first+n) of W: in place, resident, or converted into the
 * backend's scratch (valid until the next op) */
const float *m2d_cpu_weight_rows(m2d_backend *be, const m2d_weight *wh, int64_t first, int64_t n) {
    cpu_be *c = CPU(be);
    const cpu_weight *w = W(wh);
    if (in_place(w->t)) return (const float *)w->t->data + first;
    if (w->f32) return w->f32 + first;
    float *s = scratch(c, (size_t)n);
    convert_par(c, w->t->dtype, w->t->data, first, n, s);
    return s;
}




static m2d_weight *cpu_weight_new(m2d_backend *be, const m2d_tensor *t) {
    (void)be;
    cpu_weight *w = m2d_calloc(1, sizeof *w);
    w->t = t;
    return (m2d_weight *)w;
}

static void cpu_weight_free(m2d_backend *be, m2d_weight *wh) {
    (void)be;
    if (!wh) return;
    free(((cpu_weight *)wh)->f32);
    m2d_gemm_packed_free(((cpu_weight *)wh)->packed);
    free(wh);
}

/* matrices: the GEMM module's prepared copy for the backend's precision; vectors: fp32. F32
 * tensors are never copied: a handle may view memory its owner keeps writing (a trainer's master
 * weights, m2d_cpu_weight_over), and a copy would go stale. Without asking whether the copy keeps
 * the bits (make_resident does: a probe per shape, not worth running for a checkpoint that turns
 * out not to fit). */
static size_t cpu_resident_bytes(m2d_backend *be, const m2d_weight *wh) {
    cpu_be *c = CPU(be);
    const cpu_weight *w = W(wh);
    if (in_place(w->t)) return 0; /* F32: read where it is (it may be a live view, e.g. a trainer's weights) */
    if (is_matrix(w->t)) {
        m2d_gemm_w v = m2d_gemm_tensor_rows(w->t, 0, (int)w->t->shape[0]);
        return w->packed || w->as_stored ? 0 : m2d_gemm_prepare_bytes(gemm_ctx(c, c->resident), &v);
    }
    return in_place(w->t) || w->f32 ? 0 : (size_t)m2d_tensor_numel(w->t) * sizeof(float);
}

static int cpu_make_resident(m2d_backend *be, m2d_weight *wh, size_t *made) {
    cpu_be *c = CPU(be);
    cpu_weight *w = (cpu_weight *)wh;
    if (made) *made = 0;
    if (in_place(w->t)) return 0;
    if (is_matrix(w->t)) { /* prepared only where that keeps the bits (as stored otherwise) */
        m2d_gemm_w v = m2d_gemm_tensor_rows(w->t, 0, (int)w->t->shape[0]);
        m2d_gemm_ctx *g = gemm_ctx(c, c->resident);
        if (w->packed || w->as_stored) return 0;
        if (!m2d_gemm_prepare_exact(g, &v)) { /* as stored, which is always right: asked once */
            w->as_stored = 1;
            return 0;
        }
        if (m2d_gemm_prepare(g, &v, &w->packed)) return -1;
        if (made) *made = m2d_gemm_packed_bytes(w->packed);
        return 0;
    }
    if (in_place(w->t) || w->f32) return 0;
    int64_t n = m2d_tensor_numel(w->t);
    w->f32 = m2d_malloc((size_t)n * sizeof(float));
    convert_par(c, w->t->dtype, w->t->data, 0, n, w->f32);
    if (made) *made = (size_t)n * sizeof(float);
    return 0;
}

/* default: keep prepared copies only when they are small next to RAM (1/8): +10..30% speed
 * measured on tiny models, while big checkpoints stay mmapped in their stored dtype */
static size_t cpu_resident_budget(m2d_backend *be) {
    (void)be;
    size_t eighth = m2d_physical_ram() / 8;
    /* and at most 1 GiB: a prepared bf16 copy is as big as the mmapped checkpoint it duplicates
     * (a 30B-shaped 2-layer slice: 3.1 GB of anonymous memory next to 3.5 GB mapped, for a few
     * per cent per GEMM), so realistic checkpoints stay as stored in either precision */
    return M2D_MIN(eighth, (size_t)1 << 30);
}

void m2d_cpu_weight_f32(m2d_backend *be, const m2d_weight *wh, int64_t first, int64_t n, float *dst) {
    const cpu_weight *w = W(wh);
    if (w->f32) memcpy(dst, w->f32 + first, (size_t)n * sizeof(float));
    else convert_par(CPU(be), w->t->dtype, w->t->data, first, n, dst);
}

/* ---- memory ---- */
/* the smallest cached buffer of BYTES to 2 x BYTES, taken out of the cache; NULL when none */
static void *cache_take(buf_cache *k, size_t bytes, size_t *cap) {
    void *p = NULL;
    pthread_mutex_lock(&k->mu);
    int best = -1;
    for (int i = 0; i < k->n; i++)
        if (k->cap[i] >= bytes && k->cap[i] <= 2 * bytes && (best < 0 || k->cap[i] < k->cap[best])) best = i;
    if (best >= 0) {
        p = k->p[best], *cap = k->cap[best];
        k->bytes -= *cap;
        k->n--;
        k->p[best] = k->p[k->n], k->cap[best] = k->cap[k->n];
    }
    pthread_mutex_unlock(&k->mu);
    return p;
}

/* keep P for reuse if the cache has room (1), else leave it to the caller (0) */
static int cache_put(buf_cache *k, void *p, size_t cap) {
    pthread_mutex_lock(&k->mu);
    int kept = cap >= BUF_CACHE_MIN && k->n < BUF_CACHE_SLOTS && k->bytes + cap <= BUF_CACHE_MAX;
    if (kept) {
        k->p[k->n] = p, k->cap[k->n] = cap;
        k->n++;
        k->bytes += cap;
    }
    pthread_mutex_unlock(&k->mu);
    return kept;
}

static void cache_free(buf_cache *k) {
    for (int i = 0; i < k->n; i++) free(k->p[i]);
    pthread_mutex_destroy(&k->mu);
}

static m2d_buf *cpu_alloc(m2d_backend *be, size_t bytes) {
    cpu_buf *b = m2d_calloc(1, sizeof *b);
    b->bytes = bytes;
    b->p = bytes >= BUF_CACHE_MIN ? cache_take(&CPU(be)->cache, bytes, &b->cap) : NULL;
    if (!b->p) {
        b->p = m2d_malloc(bytes ? bytes : 1);
        b->cap = bytes;
    }
    return (m2d_buf *)b;
}

static void cpu_release(m2d_backend *be, m2d_buf *bh) {
    cpu_buf *b = (cpu_buf *)bh;
    if (!b) return;
    if (!b->view && !cache_put(&CPU(be)->cache, b->p, b->cap)) free(b->p);
    free(b);
}

static m2d_buf *cpu_host_view(m2d_backend *be, void *p, size_t bytes) {
    (void)be;
    cpu_buf *b = m2d_calloc(1, sizeof *b);
    *b = (cpu_buf){p, bytes, 1, bytes};
    return (m2d_buf *)b;
}

static void cpu_upload(m2d_backend *be, m2d_buf *dst, size_t off, const void *src, size_t bytes) {
    (void)be;
    if (bytes) memcpy((char *)B(dst) + off, src, bytes);
}

static void cpu_download(m2d_backend *be, void *dst, const m2d_buf *src, size_t off, size_t bytes) {
    (void)be;
    if (bytes) memcpy(dst, (const char *)B(src) + off, bytes);
}

static void cpu_download_mat(m2d_backend *be, float *dst, int ld_dst, const m2d_mat *src) {
    (void)be;
    const float *s = F(src);
    for (int r = 0; r < src->rows; r++)
        memcpy(dst + (size_t)r * ld_dst, s + (size_t)r * src->ld, sizeof(float) * (size_t)src->cols);
}

/* ---- GEMM: y = x · W[w_row0 ..)^T + beta y, through the GEMM module ---- */
static void cpu_gemm(m2d_backend *be, const m2d_mat *x, const m2d_weight *w, int w_row0, m2d_mat *y, float beta,
                     m2d_precision prec) {
    cpu_be *c = CPU(be);
    if (c->failed) return;
    m2d_gemm_w v = gemm_view(c, w, w_row0, y->cols, prec);
    if (m2d_gemm(gemm_ctx(c, prec), F(x), x->ld, x->rows, &v, F(y), y->ld, beta)) fail(c);
}
static m2d_precision cpu_auto_precision(m2d_backend *be, m2d_precision p) {
    (void)be;
    return m2d_gemm_resolve(p);
}

/* ---- lifecycle, knobs, OpenBLAS threading ---- */

/* OpenBLAS is made single-threaded inside (our threads split the GEMMs; its own pool next to ours
 * only spins in sched_yield) and restored afterwards, so other code's direct cblas/LAPACKE calls
 * keep OpenBLAS's threading. Measured: same speed as leaving OpenBLAS single-threaded for good. */
static void cpu_enter(m2d_backend *be) {
    cpu_be *c = CPU(be);
    if (c->depth++ == 0) {
        c->blas_saved = openblas_get_num_threads();
        if (c->blas_saved != 1) openblas_set_num_threads(1);
    }
}

static int cpu_leave(m2d_backend *be) {
    cpu_be *c = CPU(be);
    if (--c->depth > 0) return 0;
    m2d_cpu_train_state_stale(c->train_state); /* the weights may change before the next enter */
    if (c->blas_saved != 1) openblas_set_num_threads(c->blas_saved);
    if (!c->failed) return 0;
    c->failed = 0;
    return m2d_err("backend cpu: %s", c->err);
}

void m2d_backend_host_blas_threads(int n_threads) { openblas_set_num_threads(n_threads > 0 ? n_threads : 1); }

static int cpu_tune(m2d_backend *be, const char *knob, int value) {
    cpu_be *c = CPU(be);
    if (strcmp(knob, "threads") == 0 && value > 0) m2d_pool_set_threads(c->pool, c->threads = value);
    else if (strcmp(knob, "expert_parallel") == 0 && (value == 0 || value == 1)) c->expert_parallel = value;
    else if (strcmp(knob, "attention_gemm_min_rows") == 0 && value > 0) c->attn_gemm_min_rows = value;
    else if (strcmp(knob, "gemm_kernel") == 0 && value >= M2D_GEMM_AUTO && value <= M2D_GEMM_OWN)
        for (int p = 0; p < 2; p++) m2d_gemm_set_kernel(c->gemm[p], (m2d_gemm_kernel)value);
    else return m2d_err("backend cpu: knob '%s' = %d: unknown knob or bad value (threads >= 1, expert_parallel 0|1, "
                        "attention_gemm_min_rows >= 1, gemm_kernel 0 auto|1 sgemm|2 onednn|3 own)", knob, value);
    return 0;
}

void **m2d_cpu_train_state(m2d_backend *be) { return CPU(be)->depth > 0 ? &CPU(be)->train_state : NULL; }
struct m2d_gemm_ctx *m2d_cpu_gemm(m2d_backend *be, m2d_precision p) { return gemm_ctx(CPU(be), p); }
int m2d_cpu_weight_prepared(const m2d_weight *w) { return W(w)->packed != NULL; }
void m2d_cpu_fail(m2d_backend *be) { fail(CPU(be)); }
int m2d_cpu_failed(m2d_backend *be) { return CPU(be)->failed; }

static void cpu_destroy(m2d_backend *be) {
    cpu_be *c = CPU(be);
    m2d_cpu_train_state_free(c->train_state);
    for (int i = 0; i < N_WORK; i++) free(c->work[i]);
    cache_free(&c->cache);
    for (int p = 0; p < 2; p++) m2d_gemm_ctx_free(c->gemm[p]);
    m2d_pool_free(c->pool);
    free(c);
}

static const m2d_backend_ops cpu_ops = {
    .name = "cpu",
    .precisions = 1u << M2D_PREC_FP32 | 1u << M2D_PREC_BF16,
    .caps = M2D_CAPS_ALL, /* the reference backend implements every op and variant */
    .destroy = cpu_destroy,
    .tune = cpu_tune,
    .enter = cpu_enter,
    .leave = cpu_leave,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .upload = cpu_upload,
    .download = cpu_download,
    .download_mat = cpu_download_mat,
    .host_view = cpu_host_view,
    .weight_new = cpu_weight_new,
    .weight_free = cpu_weight_free,
    .resident_bytes = cpu_resident_bytes,
    .make_resident = cpu_make_resident,
    .resident_budget = cpu_resident_budget,
    .weight_f32 = m2d_cpu_weight_f32,
    .embed = m2d_cpu_embed,
    .gemm = cpu_gemm,
    .rmsnorm = m2d_cpu_rmsnorm,
    .rope = m2d_cpu_rope,
    .attention = m2d_cpu_attention,
    .kv_append = m2d_cpu_kv_append,
    .glu = m2d_cpu_glu,
    .glu_clamp = m2d_cpu_glu_clamp,
    .add_bias = m2d_cpu_add_bias,
    .add = m2d_cpu_add,
    .clamp = m2d_cpu_clamp,
    .sigmoid_scale = m2d_cpu_sigmoid_scale,
    .route = m2d_cpu_route,
    .moe = m2d_cpu_moe,
    .logprobs = m2d_cpu_logprobs,
    .experts_all = m2d_cpu_experts_all,
    .experts_rows_exact = m2d_cpu_experts_rows_exact,
    .gram = m2d_cpu_gram,
    .experts_reduce = m2d_cpu_experts_reduce,
    .auto_precision = cpu_auto_precision,
    .train = &m2d_cpu_train_ops,
};

static int cpu_create(const m2d_backend_opts *o, m2d_backend **out) {
    cpu_be *c = m2d_calloc(1, sizeof *c);
    c->base.ops = &cpu_ops;
    pthread_mutex_init(&c->cache.mu, NULL);
    c->threads = o->n_threads > 0 ? o->n_threads : m2d_default_threads();
    c->pool = m2d_pool_new(c->threads);
    c->expert_parallel = 1;
    c->attn_gemm_min_rows = 64;
    c->resident = m2d_gemm_resolve(o->precision);
    *out = &c->base;
    if (m2d_gemm_ctx_new(M2D_PREC_FP32, c->pool, &c->gemm[0]) || m2d_gemm_ctx_new(M2D_PREC_BF16, c->pool, &c->gemm[1])) {
        cpu_destroy(*out);
        *out = NULL;
        return -1;
    }
    return 0;
}

M2D_BACKEND(cpu, "cpu", "host CPU: oneDNN fp32/bf16 matmul (sgemm for tiny weights), weights as stored or prepared, pthreads",
            cpu_create)

/* ---- shared with the training ops (backend_cpu.h) ---- */
void *m2d_cpu_ptr(const m2d_buf *b) { return B(b); }
float *m2d_cpu_mat(const m2d_mat *m) { return F(m); }
int m2d_cpu_threads(const m2d_backend *be) { return ((const cpu_be *)be)->threads; }
void m2d_cpu_parallel_for(const m2d_backend *be, int n, void (*fn)(void *, int), void *ctx) {
    parallel_for((const cpu_be *)be, n, fn, ctx);
}

/* the handle and the tensor it reads live in one allocation: weight_free releases both */
typedef struct {
    cpu_weight w; /* first: the handle's address */
    m2d_tensor t;
} cpu_weight_view;

m2d_weight *m2d_cpu_weight_over(const float *data, int64_t rows, int64_t cols) {
    cpu_weight_view *v = m2d_calloc(1, sizeof *v);
    v->t = (m2d_tensor){.name = "view", .dtype = M2D_F32, .ndim = 2, .shape = {rows, cols}, .data = data,
                        .nbytes = (size_t)(rows * cols) * sizeof(float)};
    v->w.t = &v->t;
    return (m2d_weight *)&v->w;
}
