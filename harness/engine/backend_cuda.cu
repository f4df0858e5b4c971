/* backend_cuda — the "cuda" backend (built only by `make CUDA=1`): every op of backend.h on one
 * NVIDIA GPU. GEMMs go through cuBLASLt with fp32 accumulation (CUBLAS_COMPUTE_32F: never TF32),
 * fp32 or bf16 operands by the op's precision; the rest are this file's kernels. The one use of
 * tensor cores on fp32 operands is attention's 3xTF32 (each operand split in two TF32 parts, three
 * products: fp32-level accuracy, see k_attention_tc) and its 3xFP16 twin (k_attention_h16: the same
 * split with fp16 parts of power-of-two-scaled operands).
 *
 * Everything runs in order on the legacy default stream, so scratch buffers are reused without
 * events: cudaMemcpy from pageable host memory waits for the stream's earlier work before it
 * writes, and cudaFree (when a scratch buffer grows) synchronises the device. Released buffers
 * are kept for reuse (cu_alloc), as the CPU backend keeps them: no cudaFree, so no device sync,
 * between a forward's calls.
 *
 * Buffers are device memory. A weight is the checkpoint's tensor on the host; make_resident copies
 * it to the device in its stored dtype (BF16 and F32 as they are; other dtypes as fp32, exactly).
 * A weight that is not resident is copied to the device on every use ("streamed": correct, slow;
 * a note on stderr says so once per backend). Either way an op sees the same device values, so the
 * results do not depend on residency.
 *
 * Numerics follow backend_cpu.c: RMSNorm sums squares in fp64; RoPE angles in fp64; routing
 * softmax with max subtraction and an fp64 sum, top-k ties to the lower index; attention in fp32
 * with max subtraction (backend.h), online softmax over tiles of 32 keys (k_attention_tc on tensor
 * cores, k_attention_tiled on the CUDA cores; the warp-per-row reference kernel keeps its weights
 * and sums in fp64); the LM head's log-sum-exp as
 * the CPU's: fp32 exponential terms, fp64 sums over vocabulary chunks; MoE outputs summed per token
 * in expert-id order. Sums run in a fixed order (no atomics but attention's order-free maxima), so
 * results do not depend on timing.
 *
 * Fast paths and the reference next to them (knobs; M2D_CUDA_FAST=0 turns the fast ones off):
 * MoE at BF16 by a device-side plan and grouped GEMMs (moe_grouped 3: mma.sync, 1: WMMA; 0:
 * per-expert cuBLASLt with the plan on the host), attention on tensor cores or by tiles
 * (attn_kernel 3: 3xFP16, 2: 3xTF32, 1: tiles; 0: one warp a row), calibration's experts batched
 * or one by one (all_batched 1, 0) and its Gram on the fp64 tensor cores or by FMA tiles
 * (gram_kernel 1, 0), every GEMM through cuBLASLt or the one-thread-per-output kernel
 * (gemm_naive), the LM head's log-sum-exp in one pass or two (lse_kernel 1, 0). The tests run
 * both sides; knob profile times the ops. A kernel not yet timed on a GPU waits behind a knob
 * whose default is the measured path (gx_ldsm: k_gx's fragments by ldmatrix; gx_wide: its wider
 * blocks); once timed, the faster becomes the default and the other goes (BENCHMARKS.md, run 11:
 * the plan on one block and k_gx's 6-stage pipeline went).
 *
 * Errors: ops do not return them. The first CUDA/cuBLASLt failure is kept (sticky), later ops are
 * skipped, and leave() reports it with m2d_err after synchronising the device.
 *
 * The forward and calibration ops are one nvcc translation unit, host code and kernels together,
 * so the device helpers, the kernels and their launchers link without relocatable device code
 * (-rdc). The training ops are backend_cuda_train.cu's (their own kernels, this file's buffers,
 * errors and GEMMs through backend_cuda_impl.cuh). The op families are its sections (---- ... ----). */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <mma.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "engine/backend.h"
#include "base/util.h"
}

#include "engine/backend_cuda_impl.cuh" /* what the training ops (backend_cuda_train.cu) share */
#include "engine/cuda_kernels.cuh"      /* the kernels the CPU emulation checks too */

/* ---- objects ---- */

/* Released buffers kept for a later alloc they fit (at most twice its size): a forward allocates
 * the same workspace every call, and cudaFree synchronises the device (the host stops launching
 * until the GPU idles) while cudaMalloc costs tens of microseconds. Safe on one stream: a reused
 * buffer's next writer is ordered after every earlier reader. */
#define BUF_CACHE_SLOTS 64
#define BUF_CACHE_MAX ((size_t)2 << 30)     /* bytes kept in all */
#define BUF_CACHE_MAX_BUF ((size_t)1 << 30) /* larger buffers are freed (calibration's expert outputs
                                             * of a 512-token block: 537 MB on Qwen3-30B-A3B) */

struct cu_buf_cache {
    void *p[BUF_CACHE_SLOTS];
    size_t cap[BUF_CACHE_SLOTS], bytes;
    int n;
};

struct cu_weight {
    const m2d_tensor *t;
    void *dev;      /* resident copy, or NULL (streamed on use); a view's device values */
    m2d_dtype dt;   /* its dtype: M2D_BF16 or M2D_F32 */
    m2d_tensor *view; /* a weight view's own tensor (cu_weight_view: DEV is not this weight's) */
    void *bf16;       /* a view's values rounded to bf16 (view_bf16), or NULL */
    uint64_t bf16_gen; /* the weights' generation (cu_be.wgen) BF16 was made in; 0: never */
    int bf16_none;    /* no device memory was left for BF16: rounded per GEMM instead */
    cu_weight *copy_prev, *copy_next; /* the backend's list of views holding BF16 (copies_flush) */
};

/* scratch device buffers, each grown on demand and reused op after op */
enum {
    SLOT_WRAW,   /* a streamed weight range, as uploaded */
    SLOT_WCONV,  /* a weight range converted to the GEMM's operand type */
    SLOT_XCONV,  /* activations rounded to bf16 */
    SLOT_MOE_X,  /* gathered expert inputs [n*k, d] */
    SLOT_MOE_G,  /* expert gate/activation outputs [n*k, d_ff] */
    SLOT_MOE_U,  /* expert up outputs [n*k, d_ff] */
    SLOT_MOE_Y,  /* expert outputs [n*k, d] */
    SLOT_MOE_IDX, /* pair order and per-token rows, int32 [2, n*k] */
    SLOT_MOE_PLAN, /* the grouped path's device plan (gm_plan) */
    SLOT_LM,     /* a block of LM-head logits */
    SLOT_LM_ST,  /* running max / sum / target logit per row, fp64 [3, n] */
    SLOT_ROPE,   /* RoPE frequencies, fp64 [rot/2] */
    SLOT_BIAS,   /* a bias (or sink) vector as fp32 */
    SLOT_GRAM,   /* the Gram's per-slice partial sums, fp64 [slices, E, E] */
    SLOT_ATTN_MAX, /* attention's max |q|, |k|, |v| per head (k_h16_absmax), uint32 [H + 2 KV] */
    SLOT_ATTN_KV,  /* attention's keys and values as k_h16_prep's tiles [KV][tiles] */
    SLOT_COUNT
};

#define ALGO_CACHE 256
#define PROF_MAX 8192  /* timed op calls between two leave()s (more are counted as untimed) */
#define PROF_KINDS 16

/* op timing (knob profile, M2D_CUDA_PROFILE=1): CUDA events around each op call, summed per op
 * at leave(), when the device has synchronised */
struct cu_prof {
    int on, n, untimed;
    cudaEvent_t (*ev)[2];     /* [PROF_MAX] start, end; created at the first use */
    const char **what;        /* [PROF_MAX] the op of each pair */
    const char *name[PROF_KINDS];
    double ms[PROF_KINDS];
    long calls[PROF_KINDS];
};

struct algo_key {
    int type, n, in, out, ldw, ldx, ldy;
    unsigned align; /* min alignment of the pointers, bytes */
    int batch;      /* pointer-array batch count (lt_gemm_batched); 0: one GEMM */
    int trans;      /* lt_matmul: 1 + (A transposed) + 2 (B transposed); 0: lt_gemm_batched's (TN) */
};

struct algo_entry {
    algo_key key;
    cublasLtMatmulAlgo_t algo;
    size_t ws;
    int used, none; /* none: cuBLASLt has no algorithm, the naive kernel runs (batched: the
                     * per-expert path) */
};

#define PIN_SLOTS 16 /* host buffers page-locked at once (calibration pins four) */

struct cu_be {
    m2d_backend base;
    int device;
    cublasLtHandle_t lt;
    void *ws;             /* cuBLASLt workspace */
    size_t ws_bytes;
    void *slot[SLOT_COUNT];
    size_t slot_cap[SLOT_COUNT];
    algo_entry algos[ALGO_CACHE];
    int algo_next;
    int depth;
    int caller_device;    /* the device current at the outermost enter (restored by its leave), or -1 */
    int failed;           /* sticky: first failure since the last leave() report */
    char why[512];
    int streamed_note;    /* the streaming note was printed */
    int gemm_naive;       /* knob: every GEMM through k_gemm_naive */
    int moe_grouped;      /* knob: MoE and calibration at BF16 by the grouped kernels: k_gx where it
                           * applies, else k_grouped (3, the default); k_grouped (1; 2: its loads
                           * not overlapped with the MMAs); 0: the per-expert path */
    int attn_kernel;      /* knob: attention by k_attention_h16 (3, the default; k_attention_tc for
                           * heads beyond its range), k_attention_tc (2), k_attention_tiled (1)
                           * where they apply, or the warp-per-row reference k_attention (0) */
    unsigned attn_smem_set; /* k_attention_tc<32, 64, 128> (bits 0-2), k_attention_h16 (bits 3-5),
                           * k_attention_b16 (bits 6-8) allowed their shared memory on this device */
    int all_grouped_rows; /* knob: experts_all takes the grouped kernels up to this many rows (default 64) */
    int gram_kernel;      /* knob: calibration's Gram on the fp64 tensor cores (1, the default; 2: the
                           * next chunk prefetched, the same bits, until a GPU has timed both) or by
                           * FMA tiles (0) */
    unsigned gx_smem_set; /* k_gx instantiations allowed their shared memory (gx_launch_as's bits) */
    int gx_ldsm;          /* knob: k_gx's fragments by ldmatrix (1) or 32-bit shared loads (0, the
                           * default until a GPU has timed both; the same bits) */
    int gx_wide;          /* knob: k_gx's blocks of GX_BN_WIDE weight rows, warps of BM x 64 (1), or
                           * GX_BN (0, the default until a GPU has timed both; the same bits) */
    int lm_rows;          /* knob: the LM head's rows per GEMM (LM_ROWS by default; 1 .. LM_ROWS) */
    int lse_kernel;       /* knob: the LM head's log-sum-exp in one pass (k_lse_rows, 1, the default:
                           * 6-7 % more PPL-eval tokens/s on an H200) or two (k_lse_chunk, 0, the
                           * reference) */
    int all_batched;      /* knob: experts_all past all_grouped_rows as batched GEMMs where they
                           * apply (1, the default; 2: an error where they do not, for the tests) or
                           * expert by expert (0) */
    int bf16_wcache;      /* knob: a weight view's bf16 copy kept within a bracket until the weights
                           * change (1, the default: view_bf16) or made again at every GEMM (0; the
                           * same bits) */
    uint64_t wgen;        /* the weights' generation: AdamW and the outermost leave start a new one */
    int wcache_note;      /* the note that a bf16 copy found no device memory was printed */
    cu_weight *copies;    /* the views holding a bf16 copy, given back when memory runs out */
    const cu_weight *copy_live; /* the view whose copy the current op reads (kept by copies_flush) */
    int calib_overlap;    /* knob: calibration's selected rows copied to the host on a copy stream while
                           * the Gram runs (1), or after it (0, the default until a GPU has timed both;
                           * the same bytes) */
    cudaStream_t copy_stream;  /* non-blocking: its copies wait only for the events they are given */
    cudaEvent_t copy_ready;    /* recorded after the kernel that wrote copy_buf */
    const m2d_buf *copy_buf;   /* the buffer whose next download may run on copy_stream, or NULL */
    void *pinned[PIN_SLOTS]; /* host ranges page-locked by cu_pin (NULL: free slot) */
    int *dev_err;         /* device int: set by a kernel that met bad input (checked at leave) */
    double rope_freq[M2D_MAX_HEAD_DIM / 2]; /* the RoPE frequencies in SLOT_ROPE (rope_half of them) */
    int rope_half;
    int err_armed;        /* a kernel that may set dev_err ran since the last leave() */
    struct gm_weights *gw; /* the grouped MoE's pointer tables (16 KiB), refilled per call */
    cu_buf_cache cache;   /* released buffers kept for reuse (cu_alloc, cu_release) */
    cu_prof prof;
};

static cu_be *CU(m2d_backend *be) { return (cu_be *)be; }
static void *P(const m2d_buf *b) { return ((const cu_buf *)b)->p; }
static float *F(const m2d_mat *m) { return (float *)P(m->buf) + m->off; }
static const cu_weight *W(const m2d_weight *w) { return (const cu_weight *)w; }

/* ---- sticky errors ---- */

__attribute__((format(printf, 2, 3))) static void fail(cu_be *c, const char *fmt, ...) {
    if (c->failed) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->why, sizeof c->why, fmt, ap);
    va_end(ap);
    c->failed = 1;
}

static int cuda_ok(cu_be *c, cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 1;
    fail(c, "%s: %s", what, cudaGetErrorString(e));
    return 0;
}

static int lt_ok(cu_be *c, cublasStatus_t s, const char *what) {
    if (s == CUBLAS_STATUS_SUCCESS) return 1;
    fail(c, "%s: cuBLAS status %d", what, (int)s);
    return 0;
}

/* after a kernel launch: launch-configuration errors surface here, faults at leave() */
static void launched(cu_be *c, const char *kernel) { cuda_ok(c, cudaGetLastError(), kernel); }

static unsigned blocks_for(int64_t n, int threads) { return cu_blocks(n, threads); }

int cu_failed(m2d_backend *be) { return CU(be)->failed; }
int cu_check(m2d_backend *be, cudaError_t e, const char *what) { return cuda_ok(CU(be), e, what); }
void cu_launched(m2d_backend *be, const char *kernel) { launched(CU(be), kernel); }

/* the smallest cached buffer of BYTES to 2 x BYTES (taken out of the cache), or NULL */
static void *cache_take(cu_buf_cache *k, size_t bytes, size_t *cap) {
    int best = -1;
    for (int i = 0; i < k->n; i++)
        if (k->cap[i] >= bytes && k->cap[i] <= 2 * bytes && (best < 0 || k->cap[i] < k->cap[best])) best = i;
    if (best < 0) return NULL;
    void *p = k->p[best];
    *cap = k->cap[best];
    k->bytes -= *cap;
    k->p[best] = k->p[--k->n], k->cap[best] = k->cap[k->n];
    return p;
}

static void cache_flush(cu_buf_cache *k) {
    for (int i = 0; i < k->n; i++) cudaFree(k->p[i]);
    k->n = 0, k->bytes = 0;
}

static void copy_link(cu_be *c, cu_weight *w) {
    w->copy_prev = NULL, w->copy_next = c->copies;
    if (c->copies) c->copies->copy_prev = w;
    c->copies = w;
}

static void copy_unlink(cu_be *c, cu_weight *w) {
    if (w->copy_prev) w->copy_prev->copy_next = w->copy_next;
    else if (c->copies == w) c->copies = w->copy_next;
    if (w->copy_next) w->copy_next->copy_prev = w->copy_prev;
    w->copy_prev = w->copy_next = NULL;
    if (c->copy_live == w) c->copy_live = NULL;
}

/* The views' bf16 copies given back (each is made again at its next use: the same bits), but the
 * one the current op reads; 1 if any was. cudaFree waits for the kernels still reading them. */
static int copies_flush(cu_be *c) {
    int any = 0;
    for (cu_weight *w = c->copies, *next; w; w = next) {
        next = w->copy_next;
        if (w == c->copy_live) continue;
        cudaFree(w->bf16);
        w->bf16 = NULL, w->bf16_gen = 0;
        copy_unlink(c, w);
        any = 1;
    }
    return any;
}

/* cudaMalloc; when the device is out of memory, the buffer cache given back and one more try, then
 * (COPIES) the views' bf16 copies, which only save time, and one more: a run that fits without the
 * copies fits with them. A copy itself asks without COPIES (view_bf16): copies never evict each
 * other. */
static cudaError_t dev_malloc_from(cu_be *c, void **p, size_t bytes, int copies) {
    cudaError_t e = cudaMalloc(p, bytes);
    if (e == cudaErrorMemoryAllocation && c->cache.n) {
        cudaGetLastError();
        cache_flush(&c->cache);
        e = cudaMalloc(p, bytes);
    }
    if (e == cudaErrorMemoryAllocation && copies && copies_flush(c)) {
        cudaGetLastError();
        e = cudaMalloc(p, bytes);
    }
    return e;
}

static cudaError_t dev_malloc(cu_be *c, void **p, size_t bytes) { return dev_malloc_from(c, p, bytes, 1); }

/* scratch slot S with at least BYTES (contents not kept when it grows); NULL after a failure */
static void *scratch(cu_be *c, int s, size_t bytes) {
    if (c->failed) return NULL;
    if (bytes > c->slot_cap[s]) {
        cudaFree(c->slot[s]);
        c->slot[s] = NULL;
        c->slot_cap[s] = 0;
        size_t want = bytes + bytes / 4; /* some headroom: shapes vary from op to op */
        if (!cuda_ok(c, dev_malloc(c, &c->slot[s], want), "cudaMalloc (scratch)")) return NULL;
        c->slot_cap[s] = want;
    }
    return c->slot[s];
}

/* a warp's sum (the reductions of cuda_kernels.cuh are its others) */
__device__ static float warp_sum_f(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v; /* butterfly: every lane ends with the same bits (a + b == b + a) */
}

/* ---- dtype kernels ---- */

__global__ static void k_bf16_to_f32(const uint16_t *s, int64_t n, float *d) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) d[i] = __uint_as_float((unsigned)s[i] << 16); /* exact: bf16 is fp32's top half */
}

__global__ static void k_f32_to_bf16(const float *s, int64_t n, __nv_bfloat16 *d) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) d[i] = __float2bfloat16_rn(s[i]); /* nearest even, as m2d_f32_to_bf16 */
}

/* rows x cols window (row stride ld) to a compact bf16 matrix */
__global__ static void k_mat_to_bf16(const float *x, int ld, int rows, int cols, __nv_bfloat16 *d) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)rows * cols) return;
    int r = (int)(i / cols), col = (int)(i % cols);
    d[i] = __float2bfloat16_rn(x[(size_t)r * ld + col]);
}

/* ---- weights ---- */

static m2d_dtype device_dtype(m2d_dtype stored) { return stored == M2D_BF16 ? M2D_BF16 : M2D_F32; }

/* host bytes of elements [first, first+n) in the device dtype: the tensor's own bytes for
 * BF16/F32, else a converted fp32 copy in *tmp (caller frees) */
static const void *host_range(const m2d_tensor *t, int64_t first, int64_t n, void **tmp) {
    *tmp = NULL;
    if (t->dtype == M2D_BF16 || t->dtype == M2D_F32)
        return (const char *)t->data + (size_t)first * m2d_dtype_size(t->dtype);
    float *f = (float *)m2d_malloc(sizeof(float) * (size_t)(n ? n : 1));
    m2d_to_f32(t->dtype, t->data, first, n, f);
    *tmp = f;
    return f;
}

static void note_streaming(cu_be *c) {
    if (c->streamed_note) return;
    c->streamed_note = 1;
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    fprintf(stderr, "cuda: note: weights not resident on the device are copied from host memory on every use "
                    "(slow; %zu of %zu MiB device memory free; M2D_WEIGHT_CACHE_MB sets the resident budget)\n",
            fr >> 20, tot >> 20);
}

/* Scratch slot S for N elements of ES bytes that stand at element FIRST of a weight, placed at
 * FIRST's alignment modulo 256 bytes: where a resident copy (or a view's kept bf16 copy) would have
 * them. cuBLASLt's algorithm is picked by its operands' alignment (find_algo), so a range streamed
 * or converted per call must sit as it would in a copy, or the two could sum in other orders. */
static void *scratch_at(cu_be *c, int s, int64_t first, int64_t n, size_t es) {
    size_t off = (size_t)first * es % 256;
    char *d = (char *)scratch(c, s, (size_t)n * es + off);
    return d ? d + off : NULL;
}

/* device pointer to elements [first, first+n) of W in its device dtype (*dt): the resident copy,
 * or the range uploaded into SLOT_WRAW */
static const void *wdev(cu_be *c, const cu_weight *w, int64_t first, int64_t n, m2d_dtype *dt) {
    *dt = w->dev ? w->dt : device_dtype(w->t->dtype);
    size_t es = m2d_dtype_size(*dt);
    if (w->dev) return (const char *)w->dev + (size_t)first * es;
    note_streaming(c);
    void *tmp, *d = scratch_at(c, SLOT_WRAW, first, n, es);
    if (!d) return NULL;
    const void *src = host_range(w->t, first, n, &tmp);
    cuda_ok(c, cudaMemcpy(d, src, (size_t)n * es, cudaMemcpyHostToDevice), "cudaMemcpy (weight)");
    free(tmp);
    return c->failed ? NULL : d;
}

/* A weight view's values (the trainer's fp32 master weights) rounded to bf16, kept: a bf16 step
 * rounds each weight for its forward GEMM and again for its dx, per micro-batch (an LM head of
 * 151,936 x 2,048 twice per block of rows), while the weights change only by AdamW inside a
 * bracket, or between brackets (backend.h weight_view). So the copy is made at the first use in a
 * weights' generation and kept until AdamW or the outermost leave starts the next; the same
 * rounding as a conversion per call, so the same bits. Its memory (2 bytes a weight) stays with
 * the view. */
static const void *view_bf16(cu_be *c, const cu_weight *cw) {
    cu_weight *w = (cu_weight *)cw; /* the handle's cache, not its value */
    int64_t n = m2d_tensor_numel(w->view);
    cudaError_t e = cudaSuccess;
    if (!w->bf16 && (e = dev_malloc_from(c, &w->bf16, sizeof(__nv_bfloat16) * (size_t)n, 0)) == cudaSuccess)
        copy_link(c, w); /* a new copy joins the list copies_flush gives back */
    if (e != cudaSuccess && e != cudaErrorMemoryAllocation) { /* a fault, not a full device: sticky */
        w->bf16 = NULL;
        cuda_ok(c, e, "cudaMalloc (a weight's bf16 copy)");
        return NULL;
    }
    if (e != cudaSuccess) {
        cudaGetLastError(); /* not sticky: this view is rounded per GEMM instead, as without the copy */
        w->bf16 = NULL;
        w->bf16_none = 1;
        if (!c->wcache_note) {
            size_t fr = 0, tot = 0;
            cudaMemGetInfo(&fr, &tot);
            fprintf(stderr, "cuda: note: no device memory for a weight's bf16 copy (%zu of %zu MiB free): weights "
                            "without one are rounded at every GEMM (slower, the same results)\n", fr >> 20, tot >> 20);
            c->wcache_note = 1;
        }
        return NULL;
    }
    if (w->bf16_gen != c->wgen) {
        k_f32_to_bf16<<<blocks_for(n, 256), 256>>>((const float *)w->dev, n, (__nv_bfloat16 *)w->bf16);
        launched(c, "weight conversion (kept)");
        w->bf16_gen = c->wgen;
    }
    return c->failed ? NULL : w->bf16;
}

/* elements [first, first+n) of W as WANT (M2D_F32 or M2D_BF16) on the device */
static const void *wtyped(cu_be *c, const cu_weight *w, int64_t first, int64_t n, m2d_dtype want) {
    if (want == M2D_BF16 && w->view && !w->bf16_none && c->bf16_wcache && c->depth > 0) {
        const void *b = view_bf16(c, w);
        c->copy_live = w; /* kept if this op's own scratch runs out of memory */
        if (b) return (const void *)((const __nv_bfloat16 *)b + first);
        if (c->failed) return NULL; /* else: no memory for the copy, converted below */
    }
    m2d_dtype dt;
    const void *p = wdev(c, w, first, n, &dt);
    if (!p || dt == want) return p;
    void *d = scratch_at(c, SLOT_WCONV, first, n, m2d_dtype_size(want));
    if (!d) return NULL;
    if (want == M2D_F32) k_bf16_to_f32<<<blocks_for(n, 256), 256>>>((const uint16_t *)p, n, (float *)d);
    else k_f32_to_bf16<<<blocks_for(n, 256), 256>>>((const float *)p, n, (__nv_bfloat16 *)d);
    launched(c, "weight conversion");
    return d;
}

static m2d_weight *cu_weight_new(m2d_backend *be, const m2d_tensor *t) {
    (void)be;
    cu_weight *w = (cu_weight *)m2d_calloc(1, sizeof *w);
    w->t = t;
    w->dt = device_dtype(t->dtype);
    return (m2d_weight *)w;
}

static void cu_weight_free(m2d_backend *be, m2d_weight *wh) {
    if (!wh) return;
    cu_weight *w = (cu_weight *)wh;
    copy_unlink(CU(be), w);
    if (w->view) free(w->view);
    else cudaFree(w->dev);
    cudaFree(w->bf16);
    free(w);
}

/* fp32 rows x cols at element OFF of BUF (the trainer's master weights): resident from the start,
 * so every op reads BUF itself and sees later writes to it */
m2d_weight *cu_weight_view(m2d_backend *be, m2d_buf *buf, size_t off, int64_t rows, int64_t cols) {
    (void)be;
    cu_weight *w = (cu_weight *)m2d_calloc(1, sizeof *w);
    w->view = (m2d_tensor *)m2d_calloc(1, sizeof *w->view);
    *w->view = (m2d_tensor){.name = "view", .dtype = M2D_F32, .ndim = 2, .shape = {rows, cols}, .data = NULL,
                            .nbytes = (size_t)(rows * cols) * sizeof(float)};
    w->t = w->view;
    w->dev = (float *)P(buf) + off;
    w->dt = M2D_F32;
    return (m2d_weight *)w;
}

const float *cu_weight_dev_f32(m2d_backend *be, const m2d_weight *w, int64_t first, int64_t n) {
    return (const float *)wtyped(CU(be), W(w), first, n, M2D_F32);
}

const void *cu_weight_dev_bf16(m2d_backend *be, const m2d_weight *w, int64_t first, int64_t n) {
    return wtyped(CU(be), W(w), first, n, M2D_BF16);
}

void cu_weights_changed(m2d_backend *be) { CU(be)->wgen++; }

static size_t cu_resident_bytes(m2d_backend *be, const m2d_weight *wh) {
    (void)be;
    const cu_weight *w = W(wh);
    return w->dev ? 0 : (size_t)m2d_tensor_numel(w->t) * m2d_dtype_size(w->dt);
}

static int cu_make_resident(m2d_backend *be, m2d_weight *wh, size_t *made) {
    cu_be *c = CU(be);
    cu_weight *w = (cu_weight *)wh;
    if (made) *made = 0;
    if (w->dev) return 0;
    int64_t n = m2d_tensor_numel(w->t);
    size_t bytes = (size_t)n * m2d_dtype_size(w->dt);
    cudaSetDevice(c->device); /* as cu_alloc */
    cudaError_t e = dev_malloc(c, &w->dev, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        w->dev = NULL;
        cudaGetLastError(); /* an allocation failure is not sticky: the weight stays streamed */
        return m2d_err("cuda: no device memory for weight '%s' (%zu bytes): %s", w->t->name, bytes,
                       cudaGetErrorString(e));
    }
    void *tmp;
    const void *src = host_range(w->t, 0, n, &tmp);
    e = cudaMemcpy(w->dev, src, bytes, cudaMemcpyHostToDevice);
    free(tmp);
    if (e != cudaSuccess) {
        cudaFree(w->dev);
        w->dev = NULL;
        return m2d_err("cuda: copying weight '%s' to the device: %s", w->t->name, cudaGetErrorString(e));
    }
    if (made) *made = bytes;
    return 0;
}

/* free device memory less a reserve for activations, scratch and the cuBLASLt workspace:
 * max(2 GiB, 10% of the device) */
static size_t cu_resident_budget(m2d_backend *be) {
    (void)be;
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) return 0;
    size_t reserve = M2D_MAX((size_t)2 << 30, tot / 10);
    return fr > reserve ? fr - reserve : 0;
}

static void cu_weight_f32(m2d_backend *be, const m2d_weight *wh, int64_t first, int64_t n, float *dst) {
    cu_be *c = CU(be);
    const cu_weight *w = W(wh);
    if (!w->dev) { /* host conversion: exactly what a streamed upload would carry */
        m2d_to_f32(w->t->dtype, w->t->data, first, n, dst);
        return;
    }
    size_t es = m2d_dtype_size(w->dt);
    void *h = m2d_malloc((size_t)(n ? n : 1) * es);
    cuda_ok(c, cudaMemcpy(h, (const char *)w->dev + (size_t)first * es, (size_t)n * es, cudaMemcpyDeviceToHost),
            "cudaMemcpy (weight_f32)");
    m2d_to_f32(w->dt, h, 0, n, dst);
    free(h);
}

/* ---- memory ---- */

static m2d_buf *cu_alloc(m2d_backend *be, size_t bytes) {
    cu_be *c = CU(be);
    size_t want = bytes ? bytes : 1, cap = want;
    cudaSetDevice(c->device); /* a caller's thread may have another current device (cuda:N) */
    void *p = cache_take(&c->cache, want, &cap);
    cudaError_t e = p ? cudaSuccess : dev_malloc(c, &p, want);
    if (e != cudaSuccess) {
        cudaGetLastError();
        m2d_err("cuda: out of device memory allocating %zu bytes: %s", bytes, cudaGetErrorString(e));
        return NULL;
    }
    cu_buf *b = (cu_buf *)m2d_calloc(1, sizeof *b);
    b->p = p;
    b->bytes = bytes;
    b->cap = cap;
    return (m2d_buf *)b;
}

static void cu_release(m2d_backend *be, m2d_buf *mb) {
    cu_be *c = CU(be);
    cu_buf *b = (cu_buf *)mb;
    if (!b) return;
    if (mb == c->copy_buf) c->copy_buf = NULL; /* never downloaded: the next download is an ordinary one */
    cu_buf_cache *k = &c->cache;
    if (b->cap <= BUF_CACHE_MAX_BUF && k->n < BUF_CACHE_SLOTS && k->bytes + b->cap <= BUF_CACHE_MAX) {
        k->p[k->n] = b->p, k->cap[k->n++] = b->cap;
        k->bytes += b->cap;
    } else {
        cudaFree(b->p);
    }
    free(b);
}

static void cu_upload(m2d_backend *be, m2d_buf *dst, size_t off, const void *src, size_t bytes) {
    cu_be *c = CU(be);
    if (bytes && !c->failed)
        cuda_ok(c, cudaMemcpy((char *)P(dst) + off, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy (upload)");
}

/* After the kernels that write B: its next download waits for them only, not for what the default
 * stream runs after them (the knob calib_overlap: the Gram), and runs on the copy stream. */
static void copy_early(cu_be *c, const m2d_buf *b) {
    if (!c->copy_stream && !cuda_ok(c, cudaStreamCreateWithFlags(&c->copy_stream, cudaStreamNonBlocking), "copy stream"))
        return;
    if (!c->copy_ready && !cuda_ok(c, cudaEventCreateWithFlags(&c->copy_ready, cudaEventDisableTiming), "copy event"))
        return;
    if (cuda_ok(c, cudaEventRecord(c->copy_ready, 0), "cudaEventRecord")) c->copy_buf = b;
}

/* synchronous for the caller either way: the bytes are on the host when it returns */
static void cu_download(m2d_backend *be, void *dst, const m2d_buf *src, size_t off, size_t bytes) {
    cu_be *c = CU(be);
    if (!bytes || c->failed) return;
    const void *from = (const char *)P(src) + off;
    if (src != c->copy_buf) {
        cuda_ok(c, cudaMemcpy(dst, from, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy (download)");
        return;
    }
    c->copy_buf = NULL;
    if (cuda_ok(c, cudaStreamWaitEvent(c->copy_stream, c->copy_ready, 0), "cudaStreamWaitEvent"))
        cuda_ok(c, cudaMemcpyAsync(dst, from, bytes, cudaMemcpyDeviceToHost, c->copy_stream), "cudaMemcpyAsync (download)");
    cuda_ok(c, cudaStreamSynchronize(c->copy_stream), "cudaStreamSynchronize (download)");
}

/* P page-locked (cudaHostRegister): the copies to and from it run by DMA at the link's rate
 * instead of through the driver's pageable staging. A failure (a range overlapping one already
 * locked, no slot left, too little lockable memory) leaves P pageable and is not an error. */
static int cu_pin(m2d_backend *be, void *p, size_t bytes) {
    cu_be *c = CU(be);
    int slot = 0;
    while (slot < PIN_SLOTS && c->pinned[slot]) slot++;
    if (slot == PIN_SLOTS || cudaHostRegister(p, bytes, cudaHostRegisterDefault) != cudaSuccess) {
        cudaGetLastError(); /* not sticky: the copies work on pageable memory */
        return -1;
    }
    c->pinned[slot] = p;
    return 0;
}

static void cu_unpin(m2d_backend *be, void *p) {
    cu_be *c = CU(be);
    for (int slot = 0; slot < PIN_SLOTS; slot++)
        if (c->pinned[slot] == p) {
            cudaHostUnregister(p);
            c->pinned[slot] = NULL;
        }
}

static void cu_download_mat(m2d_backend *be, float *dst, int ld_dst, const m2d_mat *src) {
    cu_be *c = CU(be);
    if (c->failed || src->rows <= 0 || src->cols <= 0) return;
    cuda_ok(c,
            cudaMemcpy2D(dst, sizeof(float) * (size_t)ld_dst, F(src), sizeof(float) * (size_t)src->ld,
                         sizeof(float) * (size_t)src->cols, (size_t)src->rows, cudaMemcpyDeviceToHost),
            "cudaMemcpy2D (download_mat)");
}

/* ---- GEMMs ---- */

/* The obviously-correct GEMM next to cuBLASLt: one thread per output element, the dot product in
 * fp32 in index order. Used when cuBLASLt has no algorithm for a shape/alignment, and for every
 * GEMM under the knob gemm_naive = 1 (tests compare the two paths). */
template <typename T> __device__ static float to_f32(T v);
template <> __device__ float to_f32<float>(float v) { return v; }
template <> __device__ float to_f32<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__global__ static void k_gemm_naive(const T *w, int ldw, const T *x, int ldx, int n, int in, int out, float *y,
                                    int ldy, float beta) {
    int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (int64_t)n * out) return;
    int i = (int)(id / out), o = (int)(id % out);
    const T *wr = w + (size_t)o * ldw, *xr = x + (size_t)i * ldx;
    float s = 0.0f;
    for (int k = 0; k < in; k++) s = fmaf(to_f32(xr[k]), to_f32(wr[k]), s);
    float *yo = y + (size_t)i * ldy + o;
    *yo = beta == 0.0f ? s : s + beta * *yo; /* beta = 0 never reads y (it may hold garbage) */
}

static void naive_gemm(cu_be *c, cudaDataType_t type, const void *w, int ldw, const void *x, int ldx, int n, int in,
                       int out, float *y, int ldy, float beta) {
    unsigned b = blocks_for((int64_t)n * out, 256);
    if (type == CUDA_R_16BF)
        k_gemm_naive<__nv_bfloat16><<<b, 256>>>((const __nv_bfloat16 *)w, ldw, (const __nv_bfloat16 *)x, ldx, n, in,
                                                out, y, ldy, beta);
    else k_gemm_naive<float><<<b, 256>>>((const float *)w, ldw, (const float *)x, ldx, n, in, out, y, ldy, beta);
    launched(c, "k_gemm_naive");
}

/* cuBLASLt:
 * Row-major y[n, out] = x[n, in] · w[out, in]^T + beta y is, in cuBLASLt's column-major terms,
 * Y^T[out, n] = op(A) · B with A = w seen as [in, out] (ld ldw) transposed, and B = x seen as
 * [in, n] (ld ldx): the "TN" case, the one every cuBLASLt kernel family supports. */

static unsigned ptr_align(const void *p) {
    uintptr_t a = (uintptr_t)p;
    unsigned al = 256;
    while (al > 1 && a % al) al >>= 1;
    return al;
}

static int key_eq(const algo_key *a, const algo_key *b) { return memcmp(a, b, sizeof *a) == 0; }

/* the heuristic's first algorithm for this shape and alignment (cached: the query costs ~10 us) */
static const algo_entry *find_algo(cu_be *c, const algo_key *k, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t la,
                                   cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t ly) {
    for (int i = 0; i < ALGO_CACHE; i++)
        if (c->algos[i].used && key_eq(&c->algos[i].key, k)) return &c->algos[i];
    cublasLtMatmulPreference_t pref;
    if (!lt_ok(c, cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate")) return NULL;
    uint32_t al = k->align;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &c->ws_bytes,
                                         sizeof c->ws_bytes);
    cublasLtMatmulPreferenceAttributes_t aligns[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++) cublasLtMatmulPreferenceSetAttribute(pref, aligns[i], &al, sizeof al);
    cublasLtMatmulHeuristicResult_t r;
    int got = 0;
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(c->lt, op, la, lb, ly, ly, pref, 1, &r, &got);
    cublasLtMatmulPreferenceDestroy(pref);
    if (s != CUBLAS_STATUS_SUCCESS && s != CUBLAS_STATUS_NOT_SUPPORTED) {
        fail(c, "cublasLtMatmulAlgoGetHeuristic: status %d", (int)s);
        return NULL;
    }
    algo_entry *e = &c->algos[c->algo_next];
    c->algo_next = (c->algo_next + 1) % ALGO_CACHE;
    e->key = *k;
    e->none = s != CUBLAS_STATUS_SUCCESS || got < 1; /* e.g. an odd bf16 row stride: the naive kernel */
    e->algo = r.algo;
    e->ws = r.workspaceSize;
    e->used = 1;
    return e;
}

/* One cuBLASLt matmul in cuBLAS's column-major terms: C[m, n] = alpha op(A) op(B) + beta C, A and B
 * of TYPE (op: transposed when TA / TB; A stored [ta ? k : m, ta ? m : k], B likewise), C fp32,
 * fp32 accumulation (CUBLAS_COMPUTE_32F). Returns 1 when cuBLASLt has no algorithm for the shape
 * (the caller's naive kernel runs instead), else 0 (a failure is kept sticky). */
static int lt_matmul(cu_be *c, cudaDataType_t type, bool ta, bool tb, int m, int n, int k, float alpha, const void *A,
                     int lda, const void *B, int ldb, float beta, float *C, int ldc) {
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ly = NULL;
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    int none = 0;
    if (lt_ok(c, cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate") &&
        lt_ok(c, cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa), "TRANSA") &&
        lt_ok(c, cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb), "TRANSB") &&
        lt_ok(c, cublasLtMatrixLayoutCreate(&la, type, ta ? k : m, ta ? m : k, lda), "layout A") &&
        lt_ok(c, cublasLtMatrixLayoutCreate(&lb, type, tb ? n : k, tb ? k : n, ldb), "layout B") &&
        lt_ok(c, cublasLtMatrixLayoutCreate(&ly, CUDA_R_32F, (uint64_t)m, (uint64_t)n, ldc), "layout C")) {
        algo_key key = {(int)type, n, k, m, lda, ldb, ldc, M2D_MIN(M2D_MIN(ptr_align(A), ptr_align(B)), ptr_align(C)),
                        0, 1 + ta + 2 * tb};
        const algo_entry *e = find_algo(c, &key, op, la, lb, ly);
        none = e && e->none;
        if (e && !none)
            lt_ok(c, cublasLtMatmul(c->lt, op, &alpha, A, la, B, lb, &beta, C, ly, C, ly, &e->algo, c->ws, e->ws, 0),
                  "cublasLtMatmul");
    }
    if (ly) cublasLtMatrixLayoutDestroy(ly);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
    return none;
}

/* y = x · w^T + beta y; x and w of TYPE (CUDA_R_32F or CUDA_R_16BF), y fp32; fp32 accumulation */
static void lt_gemm(cu_be *c, cudaDataType_t type, const void *w, int ldw, const void *x, int ldx, int n, int in,
                    int out, float *y, int ldy, float beta) {
    if (c->failed || n <= 0 || out <= 0) return;
    if (c->gemm_naive || lt_matmul(c, type, true, false, out, n, in, 1.0f, w, ldw, x, ldx, beta, y, ldy))
        naive_gemm(c, type, w, ldw, x, ldx, n, in, out, y, ldy, beta);
}

/* the general GEMM of the training ops (backend_cuda_impl.cuh) */
void cu_gemm(m2d_backend *be, m2d_precision prec, bool ta, bool tb, int m, int n, int k, float alpha, const void *A,
             int lda, const void *B, int ldb, float beta, float *C, int ldc) {
    cu_be *c = CU(be);
    if (c->failed || m <= 0 || n <= 0) return;
    cudaDataType_t type = prec == M2D_PREC_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    /* k = 0: C = beta C, which the naive kernel's empty sum gives */
    if (c->gemm_naive || k <= 0 || lt_matmul(c, type, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc))
        cu_gemm_naive(be, prec, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

void cu_sgemm(m2d_backend *be, bool ta, bool tb, int m, int n, int k, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc) {
    cu_gemm(be, M2D_PREC_FP32, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* AUTO is bf16 on the GPU: tensor cores, fp32 accumulation (fp32 stays the exactness path) */
static m2d_precision resolve(m2d_precision p) { return p == M2D_PREC_AUTO ? M2D_PREC_BF16 : p; }

static m2d_precision cu_auto_precision(m2d_backend *be, m2d_precision p) {
    (void)be;
    return resolve(p);
}

/* x [rows, cols] (stride ldx) as the GEMM's B operand: itself (fp32) or rounded to bf16 into
 * SLOT_XCONV (compact, *ld = cols) */
static const void *x_operand(cu_be *c, const float *x, int ldx, int rows, int cols, m2d_precision prec, int *ld) {
    *ld = ldx;
    if (prec != M2D_PREC_BF16) return x;
    int64_t n = (int64_t)rows * cols;
    void *d = scratch(c, SLOT_XCONV, (size_t)(n ? n : 1) * 2);
    if (!d) return NULL;
    k_mat_to_bf16<<<blocks_for(n, 256), 256>>>(x, ldx, rows, cols, (__nv_bfloat16 *)d);
    launched(c, "k_mat_to_bf16");
    *ld = cols;
    return d;
}

/* y[n, out] = x[n, in] · W[row0 .. row0+out)^T + beta y at precision PREC */
static void gemm_rows(cu_be *c, const float *x, int ldx, int n, int in, const cu_weight *w, int64_t row0, int out,
                      float *y, int ldy, float beta, m2d_precision prec) {
    if (c->failed || n <= 0 || out <= 0) return;
    if (in <= 0) { /* no terms: y = beta y (an empty weight has nothing to convert) */
        cu_sgemm(&c->base, false, false, out, n, 0, 1.0f, NULL, 1, NULL, 1, beta, y, ldy);
        return;
    }
    prec = resolve(prec);
    int bf = prec == M2D_PREC_BF16, ldb;
    const void *wp = wtyped(c, w, row0 * in, (int64_t)out * in, bf ? M2D_BF16 : M2D_F32);
    const void *xp = wp ? x_operand(c, x, ldx, n, in, prec, &ldb) : NULL;
    if (xp) lt_gemm(c, bf ? CUDA_R_16BF : CUDA_R_32F, wp, in, xp, ldb, n, in, out, y, ldy, beta);
}

static void cu_gemm(m2d_backend *be, const m2d_mat *x, const m2d_weight *w, int w_row0, m2d_mat *y, float beta,
                    m2d_precision prec) {
    gemm_rows(CU(be), F(x), x->ld, x->rows, x->cols, W(w), w_row0, y->cols, F(y), y->ld, beta, prec);
}

/* ---- per-row and elementwise kernels ---- */

/* one block per row: y = x / sqrt(mean(x^2) + eps) * w, the sum of squares in fp64 */
__global__ static void k_rmsnorm(const float *x, int ldx, const float *w, int d, double eps, float *y, int ldy) {
    const float *xr = x + (size_t)blockIdx.x * ldx;
    float *yr = y + (size_t)blockIdx.x * ldy;
    double ss = 0;
    for (int i = threadIdx.x; i < d; i += blockDim.x) ss += (double)xr[i] * xr[i];
    ss = block_sum_d(ss);
    float inv = (float)(1.0 / sqrt(ss / d + eps));
    for (int i = threadIdx.x; i < d; i += blockDim.x) yr[i] = __fmul_rn(__fmul_rn(xr[i], inv), w[i]);
}


static void cu_rmsnorm(m2d_backend *be, const m2d_mat *x, const m2d_weight *w, double eps, m2d_mat *y) {
    cu_be *c = CU(be);
    if (c->failed || x->rows <= 0) return;
    const float *wv = (const float *)wtyped(c, W(w), 0, x->cols, M2D_F32);
    if (!wv) return;
    k_rmsnorm<<<x->rows, cu_row_threads(x->cols)>>>(F(x), x->ld, wv, x->cols, eps, F(y), y->ld);
    launched(c, "k_rmsnorm");
}

/* RoPE (m2d_rope_args), one thread per (row, head, pair i < rot/2): pair (a, b) = (x[i], x[i + rot/2])
 * rotate-half or (x[2i], x[2i+1]) interleaved turns by f = pos * inv_freq[i] (fp64), cos and sin
 * times attn_factor, as backend_cpu.c */
__global__ static void k_rope(float *x, int ld, int rows, int n_heads, int hd, const int32_t *pos,
                              const double *inv_freq, int half, int inter, double af) {
    int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (int64_t)rows * n_heads * half) return;
    int i = (int)(id % half), h = (int)(id / half % n_heads), t = (int)(id / half / n_heads);
    double f = pos[t] * inv_freq[i];
    float cs = (float)(cos(f) * af), sn = (float)(sin(f) * af);
    float *v = x + (size_t)t * ld + (size_t)h * hd;
    float *pa = v + (inter ? 2 * i : i), *pb = pa + (inter ? 1 : half);
    float a = *pa, b = *pb;
    *pa = __fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn)); /* no FMA contraction: the CPU's rounding */
    *pb = __fadd_rn(__fmul_rn(b, cs), __fmul_rn(a, sn));
}

static void cu_rope(m2d_backend *be, m2d_mat *x, int n_heads, int hd, const m2d_buf *pos, const m2d_rope_args *r) {
    cu_be *c = CU(be);
    int rot = r->rot_dim ? r->rot_dim : hd, half = rot / 2;
    int64_t n = (int64_t)x->rows * n_heads * half;
    if (c->failed || n <= 0) return;
    double f[M2D_MAX_HEAD_DIM / 2];
    for (int i = 0; i < half; i++) f[i] = r->inv_freq ? r->inv_freq[i] : pow(r->theta, -2.0 * i / rot);
    double *fd = (double *)scratch(c, SLOT_ROPE, sizeof(double) * (size_t)half);
    if (!fd) return;
    /* every layer has the same frequencies: upload them once (a copy from pageable memory waits for
     * the device, which would stall the host's launches twice a layer) */
    if (half != c->rope_half || memcmp(f, c->rope_freq, sizeof(double) * (size_t)half) != 0) {
        if (!cuda_ok(c, cudaMemcpy(fd, f, sizeof(double) * (size_t)half, cudaMemcpyHostToDevice), "rope freqs")) return;
        memcpy(c->rope_freq, f, sizeof(double) * (size_t)half);
        c->rope_half = half;
    }
    k_rope<<<blocks_for(n, 256), 256>>>(F(x), x->ld, x->rows, n_heads, hd, (const int32_t *)P(pos), fd, half,
                                        r->kind == M2D_ROPE_INTERLEAVED, r->attn_factor != 0 ? r->attn_factor : 1.0);
    launched(c, "k_rope");
}

__global__ static void k_glu(float *g, int ldg, const float *u, int ldu, int rows, int cols) {
    int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (int64_t)rows * cols) return;
    int r = (int)(id / cols), j = (int)(id % cols);
    g[(size_t)r * ldg + j] = swiglu1(g[(size_t)r * ldg + j], u[(size_t)r * ldu + j]);
}

static void glu_rows(cu_be *c, float *g, int ldg, const float *u, int ldu, int rows, int cols) {
    int64_t n = (int64_t)rows * cols;
    if (c->failed || n <= 0) return;
    k_glu<<<blocks_for(n, 256), 256>>>(g, ldg, u, ldu, rows, cols);
    launched(c, "k_glu");
}

static void cu_glu(m2d_backend *be, m2d_ffn_act act, m2d_mat *g, const m2d_mat *u) {
    (void)act; /* M2D_ACT_SWIGLU is the only activation (the engine checks) */
    glu_rows(CU(be), F(g), g->ld, F(u), u->ld, g->rows, g->cols);
}

__global__ static void k_add(float *y, int ldy, const float *x, int ldx, int rows, int cols) {
    int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (int64_t)rows * cols) return;
    int r = (int)(id / cols), j = (int)(id % cols);
    y[(size_t)r * ldy + j] += x[(size_t)r * ldx + j];
}

static void cu_add(m2d_backend *be, m2d_mat *y, const m2d_mat *x) {
    cu_be *c = CU(be);
    int64_t n = (int64_t)y->rows * y->cols;
    if (c->failed || n <= 0) return;
    k_add<<<blocks_for(n, 256), 256>>>(F(y), y->ld, F(x), x->ld, y->rows, y->cols);
    launched(c, "k_add");
}

__global__ static void k_glu_clamp(float *g, int ldg, const float *u, int ldu, int rows, int cols, float alpha,
                                   float limit) {
    int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (int64_t)rows * cols) return;
    int r = (int)(id / cols), j = (int)(id % cols);
    g[(size_t)r * ldg + j] = swiglu_clamp1(g[(size_t)r * ldg + j], u[(size_t)r * ldu + j], alpha, limit);
}

static void glu_clamp_rows(cu_be *c, float *g, int ldg, const float *u, int ldu, int rows, int cols, float alpha,
                           float limit) {
    int64_t n = (int64_t)rows * cols;
    if (c->failed || n <= 0) return;
    k_glu_clamp<<<blocks_for(n, 256), 256>>>(g, ldg, u, ldu, rows, cols, alpha, limit);
    launched(c, "k_glu_clamp");
}

/* the experts' activation: SwiGLU or the clamped one */
static void act_rows(cu_be *c, const m2d_moe_args *a, float *g, int ldg, const float *u, int ldu, int rows, int cols) {
    if (a->act == M2D_ACT_SWIGLU_CLAMP) glu_clamp_rows(c, g, ldg, u, ldu, rows, cols, a->act_alpha, a->act_limit);
    else glu_rows(c, g, ldg, u, ldu, rows, cols);
}

static void cu_glu_clamp(m2d_backend *be, m2d_mat *g, const m2d_mat *u, float alpha, float limit) {
    glu_clamp_rows(CU(be), F(g), g->ld, F(u), u->ld, g->rows, g->cols, alpha, limit);
}

/* y[r] += b for every row (b: cols floats on the device) */
__global__ static void k_add_row(float *y, int ldy, int rows, int cols, const float *b) {
    int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (int64_t)rows * cols) return;
    int r = (int)(id / cols), j = (int)(id % cols);
    y[(size_t)r * ldy + j] += b[j];
}

/* y[rows, cols] += the weight B (cols elements) on every row */
static void bias_rows(cu_be *c, float *y, int ldy, int rows, int cols, const m2d_weight *b) {
    int64_t n = (int64_t)rows * cols;
    if (c->failed || n <= 0 || !b) return;
    const float *bv = (const float *)wtyped(c, W(b), 0, cols, M2D_F32);
    if (!bv) return;
    k_add_row<<<blocks_for(n, 256), 256>>>(y, ldy, rows, cols, bv);
    launched(c, "k_add_row");
}

static void cu_add_bias(m2d_backend *be, m2d_mat *y, const m2d_weight *b) {
    bias_rows(CU(be), F(y), y->ld, y->rows, y->cols, b);
}

__global__ static void k_clamp(float *x, int ld, int rows, int cols, float limit) {
    int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (int64_t)rows * cols) return;
    float *v = x + (size_t)(id / cols) * ld + id % cols;
    *v = *v < -limit ? -limit : *v > limit ? limit : *v;
}

static void cu_clamp(m2d_backend *be, m2d_mat *x, float limit) {
    cu_be *c = CU(be);
    int64_t n = (int64_t)x->rows * x->cols;
    if (c->failed || n <= 0) return;
    k_clamp<<<blocks_for(n, 256), 256>>>(F(x), x->ld, x->rows, x->cols, limit);
    launched(c, "k_clamp");
}

/* y[r, :] *= sigmoid(s[r, 0]) */
__global__ static void k_sigmoid_scale(float *y, int ldy, int rows, int cols, const float *s, int lds) {
    int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (int64_t)rows * cols) return;
    int r = (int)(id / cols), j = (int)(id % cols);
    float g = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-s[(size_t)r * lds])));
    y[(size_t)r * ldy + j] = __fmul_rn(y[(size_t)r * ldy + j], g);
}

static void cu_sigmoid_scale(m2d_backend *be, m2d_mat *y, const m2d_mat *sm) {
    cu_be *c = CU(be);
    int64_t n = (int64_t)y->rows * y->cols;
    if (c->failed || n <= 0) return;
    k_sigmoid_scale<<<blocks_for(n, 256), 256>>>(F(y), y->ld, y->rows, y->cols, F(sm), sm->ld);
    launched(c, "k_sigmoid_scale");
}

/* row tok[i] of the table (device dtype BF16 or F32) as fp32 */
__global__ static void k_embed(const void *table, int bf16, const int32_t *tok, int n, int d, float *x, int ldx) {
    int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (int64_t)n * d) return;
    int i = (int)(id / d), j = (int)(id % d);
    size_t src = (size_t)tok[i] * d + j;
    x[(size_t)i * ldx + j] = bf16 ? __uint_as_float((unsigned)((const uint16_t *)table)[src] << 16)
                                  : ((const float *)table)[src];
}

/* a streamed table is not uploaded whole: the token ids come to the host, the rows go up */
static void embed_streamed(cu_be *c, const cu_weight *w, const m2d_buf *tokens, int n, m2d_mat *x) {
    int d = x->cols;
    int32_t *tok = (int32_t *)m2d_malloc(sizeof(int32_t) * (size_t)n);
    float *rows = (float *)m2d_malloc(sizeof(float) * (size_t)n * d);
    if (cuda_ok(c, cudaMemcpy(tok, P(tokens), sizeof(int32_t) * (size_t)n, cudaMemcpyDeviceToHost), "embed tokens")) {
        for (int i = 0; i < n; i++) m2d_to_f32(w->t->dtype, w->t->data, (int64_t)tok[i] * d, d, rows + (size_t)i * d);
        cuda_ok(c,
                cudaMemcpy2D(F(x), sizeof(float) * (size_t)x->ld, rows, sizeof(float) * (size_t)d,
                             sizeof(float) * (size_t)d, (size_t)n, cudaMemcpyHostToDevice),
                "embed rows");
    }
    free(tok);
    free(rows);
}

static void cu_embed(m2d_backend *be, const m2d_weight *table, const m2d_buf *tokens, int n, m2d_mat *x) {
    cu_be *c = CU(be);
    const cu_weight *w = W(table);
    if (c->failed || n <= 0) return;
    if (!w->dev) {
        embed_streamed(c, w, tokens, n, x);
        return;
    }
    int64_t tot = (int64_t)n * x->cols;
    k_embed<<<blocks_for(tot, 256), 256>>>(w->dev, w->dt == M2D_BF16, (const int32_t *)P(tokens), n, x->cols, F(x),
                                           x->ld);
    launched(c, "k_embed");
}

__global__ static void k_kv_append(float *K, float *V, size_t head_stride, int pos0, const float *k, const float *v,
                                   int ldk, int ldv, int rows, int n_kv, int hd) {
    int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (int64_t)n_kv * rows * hd) return;
    int j = (int)(id % hd), i = (int)(id / hd % rows), g = (int)(id / hd / rows);
    size_t dst = g * head_stride + (size_t)(pos0 + i) * hd + j;
    K[dst] = k[(size_t)i * ldk + (size_t)g * hd + j];
    V[dst] = v[(size_t)i * ldv + (size_t)g * hd + j];
}

static void cu_kv_append(m2d_backend *be, m2d_buf *kc, m2d_buf *vc, size_t off, size_t head_stride, int pos0,
                         const m2d_mat *k, const m2d_mat *v, int n_kv, int hd) {
    cu_be *c = CU(be);
    int64_t n = (int64_t)n_kv * k->rows * hd;
    if (c->failed || n <= 0) return;
    k_kv_append<<<blocks_for(n, 256), 256>>>((float *)P(kc) + off, (float *)P(vc) + off, head_stride, pos0, F(k),
                                             F(v), k->ld, v->ld, k->rows, n_kv, hd);
    launched(c, "k_kv_append");
}

/* ---- routing: one block per token ---- */

/* (value, index) argmax with ties to the lower index; index -1 loses to everything */
__device__ static int better(float va, int ia, float vb, int ib) {
    if (ib < 0) return ia >= 0;
    if (ia < 0) return 0;
    return va > vb || (va == vb && ia < ib);
}

__device__ static int block_argmax(const float *p, const unsigned char *taken, int E) {
    __shared__ float bv[32];
    __shared__ int bi[32];
    float v = 0.0f;
    int ix = -1;
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        if (!taken[e] && better(p[e], e, v, ix)) v = p[e], ix = e;
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, v, o);
        int oi = __shfl_xor_sync(0xffffffffu, ix, o);
        if (better(ov, oi, v, ix)) v = ov, ix = oi;
    }
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) bv[wid] = v, bi[wid] = ix;
    __syncthreads();
    if (wid == 0) {
        v = lane < nw ? bv[lane] : 0.0f;
        ix = lane < nw ? bi[lane] : -1;
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, v, o);
            int oi = __shfl_xor_sync(0xffffffffu, ix, o);
            if (better(ov, oi, v, ix)) v = ov, ix = oi;
        }
        if (lane == 0) bi[0] = ix;
    }
    __syncthreads();
    return bi[0];
}

/* softmax in place (max-subtracted, sum in fp64), top-k by repeated argmax, gates */
__global__ static void k_route(float *logits, int ld, int E, int k, int renorm, int32_t *topk, float *gates) {
    extern __shared__ unsigned char sh[];
    float *p = (float *)sh;
    unsigned char *taken = sh + sizeof(float) * (size_t)E;
    float *row = logits + (size_t)blockIdx.x * ld;
    float m = -INFINITY;
    for (int e = threadIdx.x; e < E; e += blockDim.x) m = fmaxf(m, row[e]);
    m = block_max_f(m);
    double s = 0;
    for (int e = threadIdx.x; e < E; e += blockDim.x) s += (double)(p[e] = expf(row[e] - m));
    s = block_sum_d(s);
    float inv = (float)(1.0 / s);
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        row[e] = p[e] = __fmul_rn(p[e], inv);
        taken[e] = 0;
    }
    __syncthreads();
    int32_t *id = topk + (size_t)blockIdx.x * k;
    for (int j = 0; j < k; j++) {
        int b = block_argmax(p, taken, E);
        if (threadIdx.x == 0) id[j] = b, taken[b] = 1;
        __syncthreads();
    }
    if (threadIdx.x != 0) return;
    double t = 0;
    for (int j = 0; j < k; j++) t += p[id[j]];
    for (int j = 0; j < k; j++) gates[(size_t)blockIdx.x * k + j] = renorm ? (float)(p[id[j]] / t) : p[id[j]];
}

/* The other router variants, one thread per token, in backend_cpu.c's own arithmetic (k and E are
 * small, and routing is a sliver of a layer's time): top-k of the logits with a softmax over the k
 * (GPT-OSS), group-limited top-k (DeepSeek-V2). */
__device__ static void softmax_row_d(float *x, int n) {
    float m = -INFINITY;
    for (int i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    double s = 0;
    for (int i = 0; i < n; i++) s += x[i] = expf(x[i] - m);
    float inv = (float)(1.0 / s);
    for (int i = 0; i < n; i++) x[i] = __fmul_rn(x[i], inv);
}

/* strict '>' over increasing indices: ties go to the lower index */
__device__ static void topk_row_d(const float *p, int E, int k, int32_t *idx, unsigned char *taken) {
    for (int e = 0; e < E; e++) taken[e] = 0;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
        idx[j] = best;
        taken[best] = 1;
    }
}

struct route_dev {
    int ld, E, k, renorm, n_group, topk_group, topk_softmax;
    float scale;
};

__global__ static void k_route_serial(float *logits, route_dev r, int n, int32_t *topk, float *gates,
                                      unsigned char *scratch) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    int E = r.E, k = r.k;
    float *p = logits + (size_t)t * r.ld, *g = gates + (size_t)t * k;
    float *masked = (float *)scratch + (size_t)t * (E + k), *sel = masked + E;
    unsigned char *taken = scratch + sizeof(float) * (size_t)n * (E + k) + (size_t)t * E;
    int32_t *id = topk + (size_t)t * k;
    if (r.topk_softmax) { /* top-k of the logits, softmax over those k; p the full softmax all the same */
        topk_row_d(p, E, k, id, taken);
        for (int j = 0; j < k; j++) sel[j] = p[id[j]];
        softmax_row_d(sel, k);
        for (int j = 0; j < k; j++) g[j] = sel[j];
        softmax_row_d(p, E);
        return;
    }
    softmax_row_d(p, E);
    if (r.n_group > 0) { /* the groups ranked by their best p; the others' p taken as 0 */
        int per = E / r.n_group;
        float gmax[M2D_MAX_EXPERT_GROUPS];
        int32_t gid[M2D_MAX_EXPERT_GROUPS];
        for (int q = 0; q < r.n_group; q++) {
            gmax[q] = -INFINITY;
            for (int i = 0; i < per; i++) gmax[q] = fmaxf(gmax[q], p[q * per + i]);
        }
        topk_row_d(gmax, r.n_group, r.topk_group, gid, taken);
        for (int i = 0; i < E; i++) masked[i] = 0;
        for (int j = 0; j < r.topk_group; j++)
            for (int i = 0; i < per; i++) masked[gid[j] * per + i] = p[gid[j] * per + i];
        topk_row_d(masked, E, k, id, taken);
    } else {
        topk_row_d(p, E, k, id, taken);
    }
    double s = 0;
    for (int j = 0; j < k; j++) s += p[id[j]];
    for (int j = 0; j < k; j++) g[j] = r.renorm ? (float)(p[id[j]] / s) : p[id[j]];
    for (int j = 0; j < k && r.scale != 0; j++) g[j] = __fmul_rn(g[j], r.scale);
}

static void cu_route(m2d_backend *be, m2d_mat *logits, const m2d_route_args *r, m2d_buf *topk, m2d_buf *gates) {
    cu_be *c = CU(be);
    int E = logits->cols, n = logits->rows;
    if (c->failed || n <= 0) return;
    if (r->k < 1 || r->k > E) {
        fail(c, "route: k = %d outside [1, %d experts]", r->k, E);
        return;
    }
    int serial = r->kind == M2D_ROUTER_TOPK_SOFTMAX || r->n_group > 0 || (r->scale != 0 && r->scale != 1);
    if (!serial) {
        size_t shm = (sizeof(float) + 1) * (size_t)E;
        k_route<<<n, E >= 256 ? 256 : 64, shm>>>(F(logits), logits->ld, E, r->k, r->renorm ? 1 : 0,
                                                  (int32_t *)P(topk), (float *)P(gates));
        launched(c, "k_route");
        return;
    }
    if (r->n_group > M2D_MAX_EXPERT_GROUPS || (r->n_group > 0 && (E % r->n_group || r->topk_group > r->n_group))) {
        fail(c, "route: %d expert groups (top %d) do not fit %d experts", r->n_group, r->topk_group, E);
        return;
    }
    unsigned char *sc = (unsigned char *)scratch(c, SLOT_MOE_G, (sizeof(float) * (size_t)(E + r->k) + E) * (size_t)n);
    if (!sc) return;
    route_dev d = {logits->ld, E, r->k, r->renorm ? 1 : 0, r->n_group, r->topk_group,
                   r->kind == M2D_ROUTER_TOPK_SOFTMAX, r->scale};
    k_route_serial<<<blocks_for(n, 64), 64>>>(F(logits), d, n, (int32_t *)P(topk), (float *)P(gates), sc);
    launched(c, "k_route_serial");
}

/* ---- attention: one warp per (query row, head), one pass over the keys (online softmax) ---- */

/* PER = elements of the head vector per lane (hd <= 32 * PER) */
template <int PER>
__device__ static void attn_key(const float (&q)[PER], const float *kr, const float *vr, int hd, float scale,
                                float &m, double &l, double (&acc)[PER]) {
    int lane = threadIdx.x & 31;
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < PER; j++)
        if (lane + 32 * j < hd) s += q[j] * kr[lane + 32 * j];
    s = warp_sum_f(s) * scale; /* the same bits in every lane: the branch below is uniform */
    if (s > m) {
        double r = m == -INFINITY ? 0.0 : exp((double)m - s);
        l *= r;
#pragma unroll
        for (int j = 0; j < PER; j++) acc[j] *= r;
        m = s;
    }
    double p = exp((double)s - m);
    l += p;
#pragma unroll
    for (int j = 0; j < PER; j++)
        if (lane + 32 * j < hd) acc[j] += p * vr[lane + 32 * j];
}

template <int PER>
__global__ static void k_attention(attn_dev a) {
    int w = (int)(((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    if (w >= a.nq * a.n_heads) return; /* whole warps: nq*n_heads items, blockDim a multiple of 32 */
    int i = w / a.n_heads, h = w % a.n_heads, g = h / (a.n_heads / a.n_kv), hd = a.hd;
    float q[PER];
    double acc[PER];
#pragma unroll
    for (int j = 0; j < PER; j++) {
        q[j] = lane + 32 * j < hd ? a.q[(size_t)i * a.ldq + (size_t)h * hd + lane + 32 * j] : 0.0f;
        acc[j] = 0.0;
    }
    /* a sink is one more logit whose value row is zero: it starts the running max and sum */
    float scale = a.scale, m = a.sinks ? a.sinks[h] : -INFINITY;
    double l = a.sinks ? 1.0 : 0.0;
    int lo = a.window > 0 ? max(0, a.np + i + 1 - a.window) : 0; /* first key position row i sees */
    for (int t = lo; t < a.np; t++) {
        size_t o = g * a.head_stride + (size_t)t * hd;
        attn_key<PER>(q, a.kp + o, a.vp + o, hd, scale, m, l, acc);
    }
    for (int t = max(0, lo - a.np); t <= i; t++)
        attn_key<PER>(q, a.ks + (size_t)t * a.ldk + (size_t)g * hd, a.vs + (size_t)t * a.ldv + (size_t)g * hd, hd,
                      scale, m, l, acc);
    float *o = a.out + (size_t)i * a.ldo + (size_t)h * hd;
#pragma unroll
    for (int j = 0; j < PER; j++)
        if (lane + 32 * j < hd) o[lane + 32 * j] = (float)(acc[j] / l);
}

/* ---- attention on bf16 operands, the reference: one warp a (query row, head), two passes ----
 * m2d_attn_args.prec BF16 where k_attention_b16 does not run (head_dim > 128, attn_kernel < 2):
 * q, k, v rounded to bf16, the scores (exact products, fp32 sums) and the row's maximum in a
 * first pass, then p = exp(s - max) in fp64, summed unrounded, rounded to bf16 for P V (fp64
 * sums), as the CPU backend's rule (backend.h) */
__device__ static __forceinline__ float bf16r(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

/* the score of key row KR (rounded as it is read) against the rounded Q, scaled */
template <int PER>
__device__ static __forceinline__ float b16_ref_score(const float (&q)[PER], const float *kr, int hd, float scale) {
    int lane = threadIdx.x & 31;
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < PER; j++)
        if (lane + 32 * j < hd) s += q[j] * bf16r(kr[lane + 32 * j]);
    return warp_sum_f(s) * scale;
}

template <int PER>
__global__ static void k_attention_b16_ref(attn_dev a) {
    int w = (int)(((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    if (w >= a.nq * a.n_heads) return; /* whole warps */
    int i = w / a.n_heads, h = w % a.n_heads, g = h / (a.n_heads / a.n_kv), hd = a.hd;
    float q[PER];
    double acc[PER];
#pragma unroll
    for (int j = 0; j < PER; j++) {
        q[j] = lane + 32 * j < hd ? bf16r(a.q[(size_t)i * a.ldq + (size_t)h * hd + lane + 32 * j]) : 0.0f;
        acc[j] = 0.0;
    }
    int lo = a.window > 0 ? max(0, a.np + i + 1 - a.window) : 0, nk = a.np + i + 1;
    float m = a.sinks ? a.sinks[h] : -INFINITY;
    for (int pass = 0; pass < 2; pass++) {
        double l = pass && a.sinks ? exp((double)a.sinks[h] - m) : 0.0;
        for (int t = lo; t < nk; t++) {
            const float *kr, *vr;
            tc_kv_rows(a, g, t, kr, vr);
            float s = b16_ref_score<PER>(q, kr, hd, a.scale);
            if (pass == 0) {
                m = fmaxf(m, s);
                continue;
            }
            double p = exp((double)s - m);
            l += p;
            float pb = bf16r((float)p);
#pragma unroll
            for (int j = 0; j < PER; j++)
                if (lane + 32 * j < hd) acc[j] += (double)pb * bf16r(vr[lane + 32 * j]);
        }
        if (pass == 0) continue;
        float *o = a.out + (size_t)i * a.ldo + (size_t)h * hd;
#pragma unroll
        for (int j = 0; j < PER; j++)
            if (lane + 32 * j < hd) o[lane + 32 * j] = (float)(acc[j] / l);
    }
}

/* ---- attention, tiled: 8 query rows of one head a block, keys staged 32 at a time ----
 * The warp-per-row kernel above walks the keys one by one (a warp reduction and an fp64 exp per
 * key). Here the block's 8 rows (a warp each) share each tile of 32 keys and values in shared
 * memory; lane l scores key l of the tile (its whole dot product), the warp folds the tile into
 * its running max, sum and weighted values (online softmax, fp32 as backend.h specifies), lane l
 * owning value dimensions l, l + 32, ... Same masks as k_attention: causal, the window, the sink
 * logit starting the running max and sum. For head_dim <= AT_MAX_HD, a multiple of 4. */
#define AT_ROWS 8   /* query rows (warps) per block */
#define AT_KEYS 32  /* keys per tile: one per lane */
#define AT_MAX_HD 128

template <int PER>
__global__ static void __launch_bounds__(AT_ROWS * 32) k_attention_tiled(attn_dev a) {
    __shared__ __align__(16) float Ks[AT_KEYS][AT_MAX_HD + 4], Vs[AT_KEYS][AT_MAX_HD], Qs[AT_ROWS][AT_MAX_HD];
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, hd = a.hd, h = blockIdx.y;
    int g = h / (a.n_heads / a.n_kv), i0 = blockIdx.x * AT_ROWS, i = i0 + w, live = i < a.nq;
    int last = a.np + M2D_MIN(i0 + AT_ROWS, a.nq) - 1; /* the block's last query position */
    int lo_blk = a.window > 0 ? max(0, a.np + i0 + 1 - a.window) : 0;
    int p = a.np + i, lo = a.window > 0 ? max(0, p + 1 - a.window) : 0; /* this warp's keys: lo .. p */
    for (int j = lane; j < hd; j += 32) Qs[w][j] = live ? a.q[(size_t)i * a.ldq + (size_t)h * hd + j] : 0.0f;
    float m = a.sinks ? a.sinks[h] : -INFINITY, l = a.sinks ? 1.0f : 0.0f, acc[PER];
#pragma unroll
    for (int j = 0; j < PER; j++) acc[j] = 0.0f;
    for (int t0 = lo_blk; t0 <= last; t0 += AT_KEYS) {
        __syncthreads(); /* the previous tile is consumed (and Qs written, the first time) */
        for (int rr = 0; rr < AT_KEYS / AT_ROWS; rr++) { /* warp w stages 4 keys, its lanes along each row */
            int kk = w * (AT_KEYS / AT_ROWS) + rr, t = t0 + kk;
            const float *kr = NULL, *vr = NULL; /* NULL: past the block's last key, zeros */
            if (t <= last && t < a.np) kr = a.kp + g * a.head_stride + (size_t)t * hd, vr = a.vp + g * a.head_stride + (size_t)t * hd;
            else if (t <= last) kr = a.ks + (size_t)(t - a.np) * a.ldk + (size_t)g * hd, vr = a.vs + (size_t)(t - a.np) * a.ldv + (size_t)g * hd;
            if (a.vec) {
                for (int j = 4 * lane; j < hd; j += 128) {
                    float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                    *(float4 *)&Ks[kk][j] = kr ? *(const float4 *)(kr + j) : z;
                    *(float4 *)&Vs[kk][j] = vr ? *(const float4 *)(vr + j) : z;
                }
            } else {
                for (int j = lane; j < hd; j += 32) Ks[kk][j] = kr ? kr[j] : 0.0f, Vs[kk][j] = vr ? vr[j] : 0.0f;
            }
        }
        __syncthreads();
        if (!live || t0 > p || t0 + AT_KEYS <= lo) continue; /* nothing of this tile for this row (warp-uniform) */
        int t = t0 + lane;
        float s = -INFINITY;
        if (t >= lo && t <= p) {
            float dot = 0.0f;
            for (int j = 0; j < hd; j += 4) {
                float4 qv = *(const float4 *)&Qs[w][j], kv = *(const float4 *)&Ks[lane][j];
                dot = fmaf(qv.x, kv.x, dot), dot = fmaf(qv.y, kv.y, dot);
                dot = fmaf(qv.z, kv.z, dot), dot = fmaf(qv.w, kv.w, dot);
            }
            s = dot * a.scale;
        }
        float mn = fmaxf(m, warp_max_f(s)); /* finite: the tile holds at least one key of this row */
        float r = expf(m - mn), pr = expf(s - mn); /* exp(-inf) = 0: no earlier keys, a masked key */
        l = l * r + warp_sum_f(pr);
#pragma unroll
        for (int j = 0; j < PER; j++) acc[j] *= r;
        for (int kk = 0; kk < AT_KEYS; kk++) {
            float pk = __shfl_sync(0xffffffffu, pr, kk);
#pragma unroll
            for (int j = 0; j < PER; j++)
                if (lane + 32 * j < hd) acc[j] = fmaf(pk, Vs[kk][lane + 32 * j], acc[j]);
        }
        m = mn;
    }
    if (!live) return;
    float *o = a.out + (size_t)i * a.ldo + (size_t)h * hd;
#pragma unroll
    for (int j = 0; j < PER; j++)
        if (lane + 32 * j < hd) o[lane + 32 * j] = acc[j] / l;
}

/* KERNEL<HD> (k_attention_tc or k_attention_h16, ROWS query rows a block, SMEM bytes of shared
 * memory, allowed once: bit BIT of attn_smem_set) over the query rows and heads */
static void launch_tc_kernel(cu_be *c, const attn_dev *d, void (*kernel)(attn_dev), int rows, size_t smem,
                             unsigned bit, const char *name) {
    if (!(c->attn_smem_set & bit) &&
        !cuda_ok(c, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                 "attention shared memory"))
        return;
    c->attn_smem_set |= bit;
    dim3 grid((unsigned)((d->nq + rows - 1) / rows), (unsigned)d->n_heads);
    kernel<<<grid, TC_WARPS * 32, smem>>>(*d);
    launched(c, name);
}

/* attn_kernel 3: the heads' maxima (k_h16_absmax), the keys and values as tiles (k_h16_prep),
 * then k_attention_h16 for the heads in its range and k_attention_tc for the others (each skips
 * the other's heads) */
template <int HD>
static void launch_attention_tc(cu_be *c, attn_dev *d) {
    unsigned bit = 1u << (HD / 64); /* HD 32, 64, 128: bits 0, 1, 2 (<< 3 for k_attention_h16) */
    if (c->attn_kernel >= 3) {
        int heads = d->n_heads + 2 * d->n_kv, tiles = (d->np + d->nq + TC_KEYS - 1) / TC_KEYS;
        uint32_t *mx = (uint32_t *)scratch(c, SLOT_ATTN_MAX, sizeof(uint32_t) * (size_t)heads);
        void *kv = scratch(c, SLOT_ATTN_KV, sizeof(h16_tile<HD>) * (size_t)tiles * d->n_kv);
        if (!mx || !kv || !cuda_ok(c, cudaMemsetAsync(mx, 0, sizeof(uint32_t) * (size_t)heads), "cudaMemsetAsync")) return;
        k_h16_absmax<<<dim3((unsigned)((d->np + d->nq + H16_ROWS - 1) / H16_ROWS), (unsigned)heads), 256>>>(*d, mx);
        launched(c, "k_h16_absmax");
        d->absmax = mx, d->h16_tiles = kv, d->h16_ntiles = tiles;
        k_h16_prep<HD><<<dim3((unsigned)tiles, (unsigned)d->n_kv), TC_WARPS * 32>>>(*d);
        launched(c, "k_h16_prep");
        launch_tc_kernel(c, d, k_attention_h16<HD>, H16_ROWS_BLK, sizeof(h16_smem<HD>), bit << 3, "k_attention_h16");
    }
    launch_tc_kernel(c, d, k_attention_tc<HD>, TC_ROWS, sizeof(tc_smem<HD>), bit, "k_attention_tc");
}

/* bf16 operands: the keys and values rounded into tiles (k_b16_prep), then k_attention_b16 */
template <int HD>
static void launch_attention_b16(cu_be *c, attn_dev *d) {
    int tiles = (d->np + d->nq + TC_KEYS - 1) / TC_KEYS;
    void *kv = scratch(c, SLOT_ATTN_KV, sizeof(b16_tile<HD>) * (size_t)tiles * d->n_kv);
    if (!kv) return;
    d->h16_tiles = kv, d->h16_ntiles = tiles;
    k_b16_prep<HD><<<dim3((unsigned)tiles, (unsigned)d->n_kv), TC_WARPS * 32>>>(*d);
    launched(c, "k_b16_prep");
    launch_tc_kernel(c, d, k_attention_b16<HD>, H16_ROWS_BLK, sizeof(b16_smem<HD>), 1u << (HD / 64) << 6,
                     "k_attention_b16");
}

/* attention on bf16 operands (m2d_attn_args.prec BF16): k_attention_b16 where the tensor-core
 * kernels run (head_dim <= 128, attn_kernel >= 2), else the two-pass reference */
static void attention_b16(cu_be *c, attn_dev *d) {
    if (d->hd <= 128 && c->attn_kernel >= 2) {
        if (d->hd <= 32) launch_attention_b16<32>(c, d);
        else if (d->hd <= 64) launch_attention_b16<64>(c, d);
        else launch_attention_b16<128>(c, d);
        return;
    }
    unsigned blocks = blocks_for((int64_t)d->nq * d->n_heads * 32, 128);
    if (d->hd <= 32) k_attention_b16_ref<1><<<blocks, 128>>>(*d);
    else if (d->hd <= 64) k_attention_b16_ref<2><<<blocks, 128>>>(*d);
    else if (d->hd <= 128) k_attention_b16_ref<4><<<blocks, 128>>>(*d);
    else if (d->hd <= 256) k_attention_b16_ref<8><<<blocks, 128>>>(*d);
    else if (d->hd <= 512) k_attention_b16_ref<16><<<blocks, 128>>>(*d);
    else k_attention_b16_ref<32><<<blocks, 128>>>(*d); /* M2D_MAX_HEAD_DIM = 1024 */
    launched(c, "k_attention_b16_ref");
}

/* 0 when the tensor-core kernels ran, -1 when they do not take this head size */
static int attention_tc(cu_be *c, attn_dev *d) {
    if (d->hd > 128 || c->attn_kernel < 2) return -1;
    if (d->hd <= 32) launch_attention_tc<32>(c, d);
    else if (d->hd <= 64) launch_attention_tc<64>(c, d);
    else launch_attention_tc<128>(c, d);
    return 0;
}

/* 0 when the tiled kernel ran, -1 when it does not take this head size */
static int attention_tiled(cu_be *c, attn_dev *d) {
    if (d->hd > AT_MAX_HD || d->hd % 4 || c->attn_kernel < 1) return -1;
    dim3 grid((unsigned)((d->nq + AT_ROWS - 1) / AT_ROWS), (unsigned)d->n_heads);
    if (d->hd <= 32) k_attention_tiled<1><<<grid, AT_ROWS * 32>>>(*d);
    else if (d->hd <= 64) k_attention_tiled<2><<<grid, AT_ROWS * 32>>>(*d);
    else k_attention_tiled<4><<<grid, AT_ROWS * 32>>>(*d);
    launched(c, "k_attention_tiled");
    return 0;
}

static void cu_attention(m2d_backend *be, const m2d_attn_args *a) {
    cu_be *c = CU(be);
    int nq = a->q.rows;
    if (c->failed || nq <= 0) return;
    const float *sinks = a->sinks ? (const float *)wtyped(c, W(a->sinks), 0, a->n_heads, M2D_F32) : NULL;
    if (c->failed) return;
    attn_dev d = {F(&a->q), F(&a->k), F(&a->v), NULL, NULL, a->q.ld, a->k.ld, a->v.ld, nq, a->np, a->n_heads,
                  a->n_kv, a->head_dim, a->out.ld, a->head_stride, F(&a->out), a->window, sinks,
                  a->scale != 0 ? a->scale : 1.0f / sqrtf((float)a->head_dim), 0, NULL, NULL, 0};
    if (a->np) {
        d.kp = (const float *)P(a->k_cache) + a->cache_off;
        d.vp = (const float *)P(a->v_cache) + a->cache_off;
    }
    /* k/v rows as float4s where every row start is 16-byte aligned (NULL, no prefix, is) */
    const float *rows[4] = {d.ks, d.vs, d.kp, d.vp};
    d.vec = a->head_dim % 4 == 0 && d.ldk % 4 == 0 && d.ldv % 4 == 0 && d.head_stride % 4 == 0;
    for (int i = 0; i < 4; i++) d.vec = d.vec && (uintptr_t)rows[i] % 16 == 0;
    if (a->prec == M2D_PREC_BF16) return attention_b16(c, &d);
    if (attention_tc(c, &d) == 0 || attention_tiled(c, &d) == 0) return;
    int64_t threads = (int64_t)nq * a->n_heads * 32;
    unsigned blocks = blocks_for(threads, 128);
    int hd = a->head_dim;
    if (hd <= 32) k_attention<1><<<blocks, 128>>>(d);
    else if (hd <= 64) k_attention<2><<<blocks, 128>>>(d);
    else if (hd <= 128) k_attention<4><<<blocks, 128>>>(d);
    else if (hd <= 256) k_attention<8><<<blocks, 128>>>(d);
    else if (hd <= 512) k_attention<16><<<blocks, 128>>>(d);
    else k_attention<32><<<blocks, 128>>>(d); /* M2D_MAX_HEAD_DIM = 1024 */
    launched(c, "k_attention");
}

/* ---- MoE: gather by expert, one GEMM per active expert and projection, scatter-add ---- */

/* Xs[r] = x[token of pair[r]] */
__global__ static void k_gather(const float *x, int ldx, const int32_t *pair, int k, int rows, int d, float *xs) {
    int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (int64_t)rows * d) return;
    int r = (int)(id / d), j = (int)(id % d);
    xs[id] = x[(size_t)(pair[r] / k) * ldx + j];
}

/* out[t] = sum over the token's k rows in bucket (= expert id) order of gate * Y[row]; the rows of
 * token t are tok_rows[t*k ..] ascending, their gates gates[pair[row]] */
__global__ static void k_scatter(const float *Y, const int32_t *pair, const int32_t *tok_rows, const float *gates,
                                 int n, int k, int d, float *out, int ldo) {
    int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (int64_t)n * d) return;
    int t = (int)(id / d), j = (int)(id % d);
    float acc = 0.0f;
    for (int s = 0; s < k; s++) {
        int r = tok_rows[(size_t)t * k + s];
        if (r < 0) continue; /* the grouped path's pair with an expert id out of range (reported) */
        acc = __fadd_rn(acc, __fmul_rn(gates[pair[r]], Y[(size_t)r * d + j])); /* the CPU's o += g*y */
    }
    out[(size_t)t * ldo + j] = acc;
}

/* host plan: pairs (t*k + j) bucketed by expert (token order within), bucket starts, and each
 * token's rows in bucket order; -1 + sticky error for an expert id out of range */
struct moe_plan {
    int *start;   /* [E + 1] */
    int32_t *idx; /* [2, nk]: pair of each bucket row, then each token's rows ascending */
};

static int moe_plan_make(cu_be *c, const int32_t *topk, int n, int k, int E, moe_plan *p) {
    int nk = n * k;
    p->start = (int *)m2d_calloc((size_t)E + 1, sizeof(int));
    p->idx = (int32_t *)m2d_malloc(sizeof(int32_t) * 2 * (size_t)nk);
    for (int i = 0; i < nk; i++) {
        if (topk[i] < 0 || topk[i] >= E) {
            fail(c, "moe: expert id %d at pair %d outside [0, %d)", topk[i], i, E);
            return -1;
        }
        p->start[topk[i] + 1]++;
    }
    for (int e = 0; e < E; e++) p->start[e + 1] += p->start[e];
    int *fill = (int *)m2d_malloc(sizeof(int) * (size_t)(E > n ? E : n));
    memcpy(fill, p->start, sizeof(int) * (size_t)E);
    for (int i = 0; i < nk; i++) p->idx[fill[topk[i]]++] = i;
    memset(fill, 0, sizeof(int) * (size_t)n);
    for (int r = 0; r < nk; r++) { /* ascending r: each token's rows come out in expert-id order */
        int t = p->idx[r] / k;
        p->idx[nk + (size_t)t * k + fill[t]++] = r;
    }
    free(fill);
    return 0;
}

/* expert E's f_e on ROWS rows of x (ld ldx): gate and up into G, U ([rows, de], compact), the
 * activation, down into y (ld ldy); biases where the experts have them, as backend_cpu.c */
static void expert_rows(cu_be *c, const m2d_moe_args *a, int e, const float *x, int ldx, int rows, float *G, float *U,
                        float *y, int ldy) {
    int d = a->x.cols, de = a->d_ff;
    gemm_rows(c, x, ldx, rows, d, W(a->gate[e]), 0, de, G, de, 0.0f, a->prec);
    gemm_rows(c, x, ldx, rows, d, W(a->up[e]), 0, de, U, de, 0.0f, a->prec);
    if (a->gate_bias) bias_rows(c, G, de, rows, de, a->gate_bias[e]);
    if (a->up_bias) bias_rows(c, U, de, rows, de, a->up_bias[e]);
    act_rows(c, a, G, de, U, de, rows, de);
    gemm_rows(c, G, de, rows, de, W(a->down[e]), 0, d, y, ldy, 0.0f, a->prec);
    if (a->down_bias) bias_rows(c, y, ldy, rows, d, a->down_bias[e]);
}

/* the three projections of every active expert over its bucket rows (G, U: [nk, de]; Y: [nk, d]) */
static void moe_experts(cu_be *c, const m2d_moe_args *a, const moe_plan *p, const float *Xs, float *G, float *U,
                        float *Y) {
    int d = a->x.cols, de = a->d_ff;
    for (int e = 0; e < a->n_experts && !c->failed; e++) {
        int m0 = p->start[e], mn = p->start[e + 1] - m0;
        if (mn == 0) continue;
        expert_rows(c, a, e, Xs + (size_t)m0 * d, d, mn, G + (size_t)m0 * de, U + (size_t)m0 * de, Y + (size_t)m0 * d,
                    d);
    }
}

/* ---- MoE at BF16 without the host: the plan on the device, grouped tensor-core GEMMs ----
 *
 * The per-expert path above copies the top-k ids to the host (a device sync) and launches ~7
 * kernels and 3 cuBLASLt calls per active expert: ~900 launches a layer at 128 experts, bound by
 * the host. Here one MoE layer is 7 launches and no sync (issue 23):
 *   k_plan_*        the bucket plan (stable counting sort of the pairs by expert, token order
 *                   within a bucket, as moe_plan_make), the tile list, each token's rows: three
 *                   launches over chunks of tokens (cuda_kernels.cuh);
 *   k_gather_bf16   the bucket rows of x, rounded to bf16 (x_operand's rounding);
 *   k_gx<2, BM>     gate and up of every tile's expert (mma.sync bf16 x bf16 -> fp32; cuda_kernels.cuh),
 *                   their biases, the activation, H rounded to bf16 (the down GEMM's operand
 *                   rounding); k_grouped<2> (WMMA) where k_gx does not apply or by the knob;
 *   k_gx<1, BM>     down, its bias, fp32 rows (or k_grouped<1>);
 *   k_scatter       the gate-weighted sum per token in expert-id order (as the per-expert path).
 * The grid of the grouped kernels is sized by the bound nk/BM + E on the tile count (the exact
 * count is on the device; spare blocks exit at once). The per-expert path stays: fp32, weights
 * not resident, more than GM_MAX_E experts, and the knob moe_grouped = 0 (tests compare both). */
#define GM_BM 32   /* rows of a tile (one expert's bucket rows) */
#define GM_BN 64   /* output columns of a tile: 4 warps of 16 */
#define GM_BK 64   /* inner-dimension step */
#define GM_LDS (GM_BK + 8) /* smem row stride of the bf16 operand tiles (a multiple of 8, 16-byte rows) */
#define GM_LDC (2 * GM_BN + 4) /* smem row stride of the fp32 result tile (gate, then up) */

/* tiles of BM rows: at most nk / BM full ones and one partial a used expert */
static int gm_max_tiles(int nk, int E, int bm) { return nk / bm + M2D_MIN(E, nk) + 1; }

static size_t gm_plan_ints(int n, int k, int E, int bm) {
    size_t nk = (size_t)n * k;
    return (size_t)E + 1 + 4 * nk + 2 * (size_t)gm_max_tiles((int)nk, E, bm) + 2 + (size_t)plan_chunks(n, k) * E;
}

static gm_plan gm_plan_at(int32_t *base, int n, int k, int E, int bm) {
    gm_plan p;
    int nk = n * k, mt = gm_max_tiles(nk, E, bm);
    p.start = base, p.pair = p.start + E + 1, p.row_of = p.pair + nk, p.tok_rows = p.row_of + nk;
    p.tile_e = p.tok_rows + nk, p.tile_r0 = p.tile_e + mt, p.n_tiles = p.tile_r0 + mt, p.err = p.n_tiles + 1;
    p.base = p.err + 1;
    return p;
}

/* the bucket plan on many blocks (cuda_kernels.cuh: k_plan_count, k_plan_scan, k_plan_place) */
static void gm_plan_make(cu_be *c, const int32_t *topk, int n, int k, int E, int bm, const gm_plan &pl) {
    int ch = plan_chunks(n, k);
    k_plan_count<<<ch, PLAN_T>>>(topk, n, k, E, pl);
    k_plan_scan<<<1, PLAN_T>>>(ch, E, bm, pl);
    k_plan_place<<<ch, PLAN_T>>>(topk, n, k, E, pl);
    launched(c, "k_plan_place");
}

/* xs[r] = bf16(x[token of pair[r]]) for the rows in use (*rows) */
__global__ static void k_gather_bf16(const float *x, int ldx, const int32_t *pair, const int32_t *rows, int k, int d,
                                     int64_t cap, __nv_bfloat16 *xs) {
    int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= cap) return;
    int r = (int)(id / d), j = (int)(id % d);
    if (r >= *rows) return;
    xs[id] = __float2bfloat16_rn(x[(size_t)(pair[r] / k) * ldx + j]);
}

/* 8 consecutive operand values from SRC as packed bf16 (VALID of them in range, the rest 0) */
__device__ static uint4 gm_get8(const __nv_bfloat16 *src, int valid) {
    if (valid >= 8 && ((uintptr_t)src & 15) == 0) return *(const uint4 *)src;
    union { uint4 v; unsigned short s[8]; } u;
    for (int j = 0; j < 8; j++) u.s[j] = j < valid ? ((const unsigned short *)src)[j] : 0;
    return u.v;
}

__device__ static uint4 gm_get8(const float *src, int valid) { /* rounded as k_f32_to_bf16 */
    float f[8];
    if (valid >= 8 && ((uintptr_t)src & 15) == 0) {
        float4 x = ((const float4 *)src)[0], y = ((const float4 *)src)[1];
        f[0] = x.x, f[1] = x.y, f[2] = x.z, f[3] = x.w, f[4] = y.x, f[5] = y.y, f[6] = y.z, f[7] = y.w;
    } else {
        for (int j = 0; j < 8; j++) f[j] = j < valid ? src[j] : 0.0f;
    }
    union { uint4 v; unsigned short s[8]; } u;
    for (int j = 0; j < 8; j++) u.s[j] = __bfloat16_as_ushort(__float2bfloat16_rn(f[j]));
    return u.v;
}

#define GM_T 128 /* threads of a k_grouped block */
#define GM_CA (GM_BM * GM_BK / 8 / GM_T) /* 8-value chunks of the A tile per thread */
#define GM_CB (GM_BN * GM_BK / 8 / GM_T) /* ... of one weight tile per thread */

/* this thread's chunks of the A tile (rows r0 .. r1) and the NB weight tiles (columns n0 ..) at k0,
 * into registers */
template <int NB, typename TW>
__device__ static void gm_fetch(const gm_args &g, const gm_ptrs &p, int e, const __nv_bfloat16 *A, int r0, int r1,
                                int n0, int k0, uint4 (&ra)[GM_CA], uint4 (&rb)[NB * GM_CB]) {
    int kv = g.K - k0; /* valid inner columns from k0 */
#pragma unroll
    for (int i = 0; i < GM_CA; i++) {
        int q = threadIdx.x + i * GM_T, m = q / (GM_BK / 8), kc = q % (GM_BK / 8) * 8, r = r0 + m;
        ra[i] = gm_get8(A + (size_t)(r < r1 ? r : r0) * g.lda + k0 + kc, r < r1 ? kv - kc : 0);
    }
#pragma unroll
    for (int i = 0; i < NB * GM_CB; i++) {
        int q = threadIdx.x + i * GM_T, b = q / (GM_BN * GM_BK / 8), qq = q % (GM_BN * GM_BK / 8);
        int nn = qq / (GM_BK / 8), kc = qq % (GM_BK / 8) * 8, col = n0 + nn;
        rb[i] = gm_get8((const TW *)p.w[b][e] + (size_t)(col < g.N ? col : 0) * g.K + k0 + kc, col < g.N ? kv - kc : 0);
    }
}

/* the fetched chunks into the shared tiles (the same index map as gm_fetch) */
template <int NB>
__device__ static void gm_stash(__nv_bfloat16 *As, __nv_bfloat16 *Bs, const uint4 (&ra)[GM_CA],
                                const uint4 (&rb)[NB * GM_CB]) {
#pragma unroll
    for (int i = 0; i < GM_CA; i++) {
        int q = threadIdx.x + i * GM_T;
        *(uint4 *)(As + q / (GM_BK / 8) * GM_LDS + q % (GM_BK / 8) * 8) = ra[i];
    }
#pragma unroll
    for (int i = 0; i < NB * GM_CB; i++) {
        int q = threadIdx.x + i * GM_T, b = q / (GM_BN * GM_BK / 8), qq = q % (GM_BN * GM_BK / 8);
        *(uint4 *)(Bs + (b * GM_BN + qq / (GM_BK / 8)) * GM_LDS + qq % (GM_BK / 8) * 8) = rb[i];
    }
}

/* One block per (tile, 64 output columns), 4 warps, warp w owning columns 16w..16w+15 of the
 * tile's 32 rows. NB = 2: gate and up into fp32, + biases, the activation, H in bf16; NB = 1: down
 * + bias into fp32. TW: the weights' dtype (fp32 weights are rounded to bf16 as they are staged,
 * as wtyped does). Accumulation fp32 (WMMA), as cuBLASLt's CUBLAS_COMPUTE_32F. PRE: the next k
 * step's global loads are issued before this step's MMAs (in flight while they run); without it
 * each step loads, then computes (the knob moe_grouped = 2; the same results). */
template <int NB, typename TW, bool PRE>
__global__ static void __launch_bounds__(GM_T) k_grouped(gm_args g, gm_ptrs p) {
    int e, r0, r1, n0 = blockIdx.y * GM_BN;
    if (!gm_tile<GM_BM>(g, blockIdx.x, e, r0, r1)) return;
    const __nv_bfloat16 *A = g.a + e * g.a_es;
    __shared__ __align__(128) unsigned char sm[M2D_MAX((GM_BM + NB * GM_BN) * GM_LDS * 2, GM_BM * GM_LDC * 4)];
    __nv_bfloat16 *As = (__nv_bfloat16 *)sm, *Bs = As + GM_BM * GM_LDS;
    int tid = threadIdx.x, w = tid >> 5;
    nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> acc[NB][2];
    for (int b = 0; b < NB; b++)
        for (int i = 0; i < 2; i++) nvcuda::wmma::fill_fragment(acc[b][i], 0.0f);
    uint4 ra[GM_CA], rb[NB * GM_CB];
    if (PRE) gm_fetch<NB, TW>(g, p, e, A, r0, r1, n0, 0, ra, rb);
    for (int k0 = 0; k0 < g.K; k0 += GM_BK) {
        if (!PRE) gm_fetch<NB, TW>(g, p, e, A, r0, r1, n0, k0, ra, rb);
        gm_stash<NB>(As, Bs, ra, rb);
        __syncthreads();
        if (PRE && k0 + GM_BK < g.K) gm_fetch<NB, TW>(g, p, e, A, r0, r1, n0, k0 + GM_BK, ra, rb);
#pragma unroll
        for (int kk = 0; kk < GM_BK; kk += 16) {
            nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, __nv_bfloat16, nvcuda::wmma::row_major> fa[2];
            nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, __nv_bfloat16, nvcuda::wmma::col_major> fb;
            for (int i = 0; i < 2; i++) nvcuda::wmma::load_matrix_sync(fa[i], As + 16 * i * GM_LDS + kk, GM_LDS);
            for (int b = 0; b < NB; b++) {
                /* B (k, n) = W[n0 + n][k0 + k]: the staged rows of W are B's columns */
                nvcuda::wmma::load_matrix_sync(fb, Bs + (b * GM_BN + 16 * w) * GM_LDS + kk, GM_LDS);
                for (int i = 0; i < 2; i++) nvcuda::wmma::mma_sync(acc[b][i], fa[i], fb, acc[b][i]);
            }
        }
        __syncthreads();
    }
    float *C = (float *)sm; /* the operand tiles are dead: the results go through the same smem */
    for (int b = 0; b < NB; b++)
        for (int i = 0; i < 2; i++)
            nvcuda::wmma::store_matrix_sync(C + 16 * i * GM_LDC + b * GM_BN + 16 * w, acc[b][i], GM_LDC,
                                            nvcuda::wmma::mem_row_major);
    __syncthreads();
    gm_epilogue<NB, GM_BM, GM_LDC>(g, p, e, r0, r1, n0, GM_BN, C);
}

/* a resident device pointer of W, or NULL (streamed); *dt its dtype */
static const void *resident(const m2d_weight *w, m2d_dtype *dt) {
    if (!w || !W(w)->dev) return NULL;
    *dt = W(w)->dt;
    return W(w)->dev;
}

/* the pointer table of NB weight arrays (and their biases) of E experts: 0, or -1 where one is
 * not resident or the dtypes differ (the per-expert path then runs) */
static int gm_table(m2d_weight *const *const ws[2], m2d_weight *const *const bs[2], int NB, int E, gm_ptrs *p,
                    m2d_dtype *wdt, int *b_bf16, int *aligned16) {
    memset(p, 0, sizeof *p);
    int bdt = -1;
    for (int b = 0; b < NB; b++)
        for (int e = 0; e < E; e++) {
            m2d_dtype dt;
            if (!(p->w[b][e] = resident(ws[b][e], &dt)) || (b + e > 0 && dt != *wdt)) return -1;
            *aligned16 &= ((uintptr_t)p->w[b][e] & 15) == 0;
            *wdt = dt;
            if (!bs[b]) continue;
            if (!(p->b[b][e] = resident(bs[b][e], &dt)) || (bdt >= 0 && (int)dt != bdt)) return -1;
            bdt = (int)dt;
        }
    *b_bf16 = bdt == M2D_BF16;
    return 0;
}

/* the experts' weights as the grouped kernels take them: gate and up, then down */
struct gm_weights {
    gm_ptrs gu, dn;
    m2d_dtype wdt[2];
    int b_bf16[2];
    int aligned16; /* every weight pointer 16-byte aligned (k_gx's cp.async) */
};

/* A's expert weights in the backend's tables, or NULL: not BF16, too many experts, a weight not
 * resident, mixed dtypes */
static const gm_weights *gm_weights_table(cu_be *c, const m2d_moe_args *a) {
    if (resolve(a->prec) != M2D_PREC_BF16 || a->n_experts > GM_MAX_E) return NULL;
    if (!c->gw) c->gw = (gm_weights *)m2d_malloc(sizeof *c->gw);
    gm_weights *gw = c->gw;
    m2d_weight *const *const w2[2] = {a->gate, a->up}, *const *const b2[2] = {a->gate_bias, a->up_bias};
    m2d_weight *const *const w1[2] = {a->down, NULL}, *const *const b1[2] = {a->down_bias, NULL};
    gw->aligned16 = 1;
    if (gm_table(w2, b2, 2, a->n_experts, &gw->gu, &gw->wdt[0], &gw->b_bf16[0], &gw->aligned16) ||
        gm_table(w1, b1, 1, a->n_experts, &gw->dn, &gw->wdt[1], &gw->b_bf16[1], &gw->aligned16))
        return NULL;
    return gw;
}

/* the same for the grouped kernels: NULL also with the knob moe_grouped = 0 */
static const gm_weights *gm_weights_of(cu_be *c, const m2d_moe_args *a) {
    return c->moe_grouped ? gm_weights_table(c, a) : NULL;
}

template <bool PRE>
static void gm_launch_pre(int NB, m2d_dtype wdt, dim3 grid, const gm_args *g, const gm_ptrs *p) {
    if (NB == 2 && wdt == M2D_BF16) k_grouped<2, __nv_bfloat16, PRE><<<grid, GM_T>>>(*g, *p);
    else if (NB == 2) k_grouped<2, float, PRE><<<grid, GM_T>>>(*g, *p);
    else if (wdt == M2D_BF16) k_grouped<1, __nv_bfloat16, PRE><<<grid, GM_T>>>(*g, *p);
    else k_grouped<1, float, PRE><<<grid, GM_T>>>(*g, *p);
}

/* k_gx<NB, BM, BN, LDSM> with its dynamic shared memory (allowed past 48 KB once per
 * instantiation: bit BIT of gx_smem_set) */
template <int NB, int BM, int BN, bool LDSM>
static void gx_launch_as(cu_be *c, dim3 grid, const gm_args *g, const gm_ptrs *p) {
    unsigned bit = 1u << ((NB - 1) + 2 * (BM == 64) + 4 * LDSM + 8 * (BN == GX_BN_WIDE));
    size_t smem = sizeof(gx_smem<BM, BN>);
    if (!(c->gx_smem_set & bit)) {
        if (!cuda_ok(c, cudaFuncSetAttribute(k_gx<NB, BM, BN, LDSM>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem),
                     "k_gx shared memory"))
            return;
        c->gx_smem_set |= bit;
    }
    k_gx<NB, BM, BN, LDSM><<<grid, GX_T, smem>>>(*g, *p);
}

/* the knobs gx_ldsm and gx_wide: the instantiation */
template <int NB, int BM>
static void gx_launch_nb(cu_be *c, dim3 grid, const gm_args *g, const gm_ptrs *p) {
    if (c->gx_wide && c->gx_ldsm) gx_launch_as<NB, BM, GX_BN_WIDE, true>(c, grid, g, p);
    else if (c->gx_wide) gx_launch_as<NB, BM, GX_BN_WIDE, false>(c, grid, g, p);
    else if (c->gx_ldsm) gx_launch_as<NB, BM, GX_BN, true>(c, grid, g, p);
    else gx_launch_as<NB, BM, GX_BN, false>(c, grid, g, p);
}

template <int BM>
static void gx_launch(cu_be *c, int NB, dim3 grid, const gm_args *g, const gm_ptrs *p) {
    if (NB == 2) gx_launch_nb<2, BM>(c, grid, g, p);
    else gx_launch_nb<1, BM>(c, grid, g, p);
}

/* the grouped GEMM of NB weight matrices over TILES tiles of BM rows: k_gx (BM 32 or 64; its
 * blocks take GX_BN / NB output columns, GX_BN_WIDE / NB with gx_wide) or k_grouped (BM 0:
 * GM_BM-row tiles, GM_BN columns) */
static void gm_launch(cu_be *c, int NB, m2d_dtype wdt, int bm, int tiles, const gm_args *g, const gm_ptrs *p) {
    int cols = bm ? (c->gx_wide ? GX_BN_WIDE : GX_BN) / NB : GM_BN;
    dim3 grid((unsigned)tiles, (unsigned)((g->N + cols - 1) / cols));
    if (bm == 64) gx_launch<64>(c, NB, grid, g, p);
    else if (bm == 32) gx_launch<32>(c, NB, grid, g, p);
    else if (c->moe_grouped == 2) gm_launch_pre<false>(NB, wdt, grid, g, p);
    else gm_launch_pre<true>(NB, wdt, grid, g, p);
    launched(c, bm ? "k_gx" : "k_grouped");
}

/* k_gx's tile rows for buckets of ROWS rows on average (knob moe_grouped 3), or 0: k_grouped (the
 * other knob values; fp32 weights, inner dimensions not multiples of 8, unaligned weights) */
static int gx_bm(const cu_be *c, const gm_weights *gw, int d, int de, int rows) {
    if (c->moe_grouped != 3 || gw->wdt[0] != M2D_BF16 || gw->wdt[1] != M2D_BF16 || !gw->aligned16 || d % 8 || de % 8)
        return 0;
    return rows >= 64 ? 64 : 32;
}

/* where the grouped GEMMs read and write: tiles from a plan (MoE) or every expert on the same
 * rows_const rows (calibration); XS the bf16 operand rows (expert e's at xs + e*xs_es), H the bf16
 * activations, Y the fp32 outputs (expert e's row r at y + e*y_es + r*ldy) */
struct gm_io {
    const int32_t *tile_e, *tile_r0, *n_tiles, *start;
    int bm, tiles, rows_const; /* bm: gm_launch's */
    const __nv_bfloat16 *xs;
    int64_t xs_es;
    __nv_bfloat16 *h;
    int64_t h_es;
    float *y;
    int ldy;
    int64_t y_es;
};

/* H = act(gate, up) of every tile's expert, then Y = down(H) */
static void gm_experts(cu_be *c, const m2d_moe_args *a, const gm_weights *gw, const gm_io *io) {
    int d = a->x.cols, de = a->d_ff;
    gm_args g = {io->xs, d, io->xs_es, d, de, io->tile_e, io->tile_r0, io->n_tiles, io->start, io->rows_const,
                 io->h, de, io->h_es, gw->b_bf16[0], a->act == M2D_ACT_SWIGLU_CLAMP, a->act_alpha, a->act_limit};
    gm_launch(c, 2, gw->wdt[0], io->bm, io->tiles, &g, &gw->gu);
    gm_args g2 = {io->h, de, io->h_es, de, d, io->tile_e, io->tile_r0, io->n_tiles, io->start, io->rows_const,
                  io->y, io->ldy, io->y_es, gw->b_bf16[1], 0, 0.0f, 0.0f};
    gm_launch(c, 1, gw->wdt[1], io->bm, io->tiles, &g2, &gw->dn);
}

/* cu_moe's grouped path; -1 where it does not apply (nothing launched) */
static int moe_grouped(cu_be *c, const m2d_moe_args *a) {
    int n = a->x.rows, d = a->x.cols, k = a->k, de = a->d_ff, E = a->n_experts, nk = n * k;
    const gm_weights *gw = k > GM_MAX_K ? NULL : gm_weights_of(c, a);
    if (!gw) return -1;
    int bm = gx_bm(c, gw, d, de, nk / E), tile_rows = bm ? bm : GM_BM;
    int32_t *ints = (int32_t *)scratch(c, SLOT_MOE_PLAN, sizeof(int32_t) * gm_plan_ints(n, k, E, tile_rows));
    __nv_bfloat16 *xs = (__nv_bfloat16 *)scratch(c, SLOT_XCONV, 2 * (size_t)nk * d);
    __nv_bfloat16 *H = (__nv_bfloat16 *)scratch(c, SLOT_MOE_G, 2 * (size_t)nk * de);
    float *Y = (float *)scratch(c, SLOT_MOE_Y, sizeof(float) * (size_t)nk * d);
    if (ints && xs && H && Y) { /* else the sticky error is set */
        gm_plan pl = gm_plan_at(ints, n, k, E, tile_rows);
        pl.err = c->dev_err;
        c->err_armed = 1;
        gm_plan_make(c, (const int32_t *)P(a->topk), n, k, E, tile_rows, pl);
        k_gather_bf16<<<blocks_for((int64_t)nk * d, 256), 256>>>(F(&a->x), a->x.ld, pl.pair, pl.start + E, k, d,
                                                                  (int64_t)nk * d, xs);
        launched(c, "k_gather_bf16");
        gm_io io = {pl.tile_e, pl.tile_r0, pl.n_tiles, pl.start, bm, gm_max_tiles(nk, E, tile_rows), 0, xs, 0, H, 0,
                    Y, d, 0};
        gm_experts(c, a, gw, &io);
        k_scatter<<<blocks_for((int64_t)n * d, 256), 256>>>(Y, pl.pair, pl.tok_rows, (const float *)P(a->gates), n,
                                                            k, d, F(&a->out), a->out.ld);
        launched(c, "k_scatter");
    }
    return 0;
}

/* cu_experts_all's grouped path: every expert on the same n rows, out's columns e*d .. e*d + d;
 * -1 where it does not apply. Only up to the knob all_grouped_rows (default 64) rows: at 512 rows
 * cuBLASLt's per-expert GEMMs ran faster than the WMMA kernel on an H200 (calibration 60 against
 * 76 ms a layer, both with the host copy of f), and its batched GEMMs faster than k_gx (1.49
 * against 2.97 ms; bench_cuda times both sides again). */
static int experts_all_grouped(cu_be *c, const m2d_moe_args *a) {
    int n = a->x.rows, d = a->x.cols, de = a->d_ff, E = a->n_experts, ldx;
    const gm_weights *gw = n > c->all_grouped_rows ? NULL : gm_weights_of(c, a);
    if (!gw) return -1;
    __nv_bfloat16 *H = (__nv_bfloat16 *)scratch(c, SLOT_MOE_G, 2 * (size_t)E * n * de);
    const void *xs = H ? x_operand(c, F(&a->x), a->x.ld, n, d, M2D_PREC_BF16, &ldx) : NULL; /* compact: ldx = d */
    if (xs) {
        int bm = gx_bm(c, gw, d, de, n), tile_rows = bm ? bm : GM_BM;
        gm_io io = {NULL, NULL, NULL, NULL, bm, E * ((n + tile_rows - 1) / tile_rows), n, (const __nv_bfloat16 *)xs, 0,
                    H, (int64_t)n * de, F(&a->out), a->out.ld, d};
        gm_experts(c, a, gw, &io);
    }
    return 0;
}

static void cu_moe(m2d_backend *be, const m2d_moe_args *a) {
    cu_be *c = CU(be);
    int n = a->x.rows, d = a->x.cols, k = a->k, de = a->d_ff, nk = n * k;
    if (c->failed || n <= 0 || moe_grouped(c, a) == 0) return;
    int32_t *topk = (int32_t *)m2d_malloc(sizeof(int32_t) * (size_t)nk);
    moe_plan p = {NULL, NULL};
    /* the bucket sizes decide the GEMM shapes, which the host launches: the ids come down */
    if (cuda_ok(c, cudaMemcpy(topk, P(a->topk), sizeof(int32_t) * (size_t)nk, cudaMemcpyDeviceToHost), "moe topk") &&
        moe_plan_make(c, topk, n, k, a->n_experts, &p) == 0) {
        int32_t *idx = (int32_t *)scratch(c, SLOT_MOE_IDX, sizeof(int32_t) * 2 * (size_t)nk);
        float *Xs = (float *)scratch(c, SLOT_MOE_X, sizeof(float) * (size_t)nk * d);
        float *G = (float *)scratch(c, SLOT_MOE_G, sizeof(float) * (size_t)nk * de);
        float *U = (float *)scratch(c, SLOT_MOE_U, sizeof(float) * (size_t)nk * de);
        float *Y = (float *)scratch(c, SLOT_MOE_Y, sizeof(float) * (size_t)nk * d);
        if (idx && Xs && G && U && Y &&
            cuda_ok(c, cudaMemcpy(idx, p.idx, sizeof(int32_t) * 2 * (size_t)nk, cudaMemcpyHostToDevice), "moe plan")) {
            k_gather<<<blocks_for((int64_t)nk * d, 256), 256>>>(F(&a->x), a->x.ld, idx, k, nk, d, Xs);
            launched(c, "k_gather");
            moe_experts(c, a, &p, Xs, G, U, Y);
            if (!c->failed) {
                k_scatter<<<blocks_for((int64_t)n * d, 256), 256>>>(Y, idx, idx + nk, (const float *)P(a->gates), n,
                                                                    k, d, F(&a->out), a->out.ld);
                launched(c, "k_scatter");
            }
        }
    }
    free(p.start);
    free(p.idx);
    free(topk);
}

/* ---- calibration: every expert on every token, the Gram of their outputs ---- */

/* ---- calibration's experts as three batched GEMMs (knob all_batched, default 1) ----
 * Expert by expert, every expert costs ~7 launches (three cuBLASLt calls with their descriptors,
 * the conversions of x and H to bf16, the activation): ~900 a layer at 128 experts, which bound a
 * 512-token block by the host (5.3 ms for 0.6 TFLOP on an H200). Here x is rounded to bf16 once,
 * gate and up are one pointer-array batched cuBLASLt call each over all experts (x shared), the
 * activation and H's rounding one launch each over all of them, and down one more batched call
 * writing each expert's columns of the output. The roundings are the per-expert path's (x, H
 * to bf16; fp32 accumulation, fp32 gate/up outputs): only cuBLASLt's summation order differs. */
#define ALL_BATCH_BYTES ((size_t)1 << 30) /* gate, up (fp32) and H (bf16) of the experts of a batch */

/* y_i = x_i · w_i^T for i < batch, the pointer arrays W, X, Y on the device (every pointer ALIGN
 * bytes aligned); bf16 operands, fp32 output and accumulation; the algorithm from find_algo's
 * cache. -1 (nothing launched, no error) where cuBLASLt offers no algorithm; DRY: only that answer */
static int lt_gemm_batched(cu_be *c, const void *const *w, int ldw, const void *const *x, int ldx, int n, int in,
                           int out, float *const *y, int ldy, int batch, unsigned align, int dry) {
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t l[3] = {NULL, NULL, NULL};
    cublasOperation_t ta = CUBLAS_OP_T;
    uint32_t mode = CUBLASLT_BATCH_MODE_POINTER_ARRAY;
    int32_t count = batch;
    int rc = -1;
    const uint64_t rows[3] = {(uint64_t)in, (uint64_t)in, (uint64_t)out};
    const uint64_t cols[3] = {(uint64_t)out, (uint64_t)n, (uint64_t)n};
    const int64_t ld[3] = {ldw, ldx, ldy};
    const cudaDataType_t ty[3] = {CUDA_R_16BF, CUDA_R_16BF, CUDA_R_32F};
    int ok = lt_ok(c, cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate") &&
             lt_ok(c, cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "TRANSA");
    for (int i = 0; i < 3 && ok; i++)
        ok = lt_ok(c, cublasLtMatrixLayoutCreate(&l[i], ty[i], rows[i], cols[i], ld[i]), "layout") &&
             lt_ok(c, cublasLtMatrixLayoutSetAttribute(l[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count),
                   "batch") &&
             lt_ok(c, cublasLtMatrixLayoutSetAttribute(l[i], CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode, sizeof mode),
                   "batch mode");
    if (ok) {
        algo_key k = {(int)CUDA_R_16BF, n, in, out, ldw, ldx, ldy, align, batch, 0};
        const algo_entry *e = find_algo(c, &k, op, l[0], l[1], l[2]);
        float alpha = 1.0f, beta = 0.0f;
        rc = e && !e->none ? 0 : -1;
        if (rc == 0 && !dry)
            lt_ok(c, cublasLtMatmul(c->lt, op, &alpha, w, l[0], x, l[1], &beta, y, l[2], (void *)y, l[2], &e->algo, c->ws,
                                    e->ws, 0), "cublasLtMatmul (batched)");
    }
    for (int i = 0; i < 3; i++)
        if (l[i]) cublasLtMatrixLayoutDestroy(l[i]);
    if (op) cublasLtMatmulDescDestroy(op);
    return rc;
}

/* the pointer arrays of a batch of experts, kind by kind (gate, up and down weights, x, G, U, H,
 * the output columns) */
enum { BP_WG, BP_WU, BP_WD, BP_X, BP_G, BP_U, BP_H, BP_Y, BP_COUNT };

/* elements from one expert's G, U or H to the next: n de rounded up to 8, so that every expert's
 * rows start 16-byte aligned in fp32 and bf16 */
static size_t batch_stride(int n, int de) { return ((size_t)n * de + 7) & ~(size_t)7; }

/* the pointer arrays of experts e0 .. e0 + eb - 1 into device memory D; al[g] the alignment of
 * every pointer of GEMM g (gate, up, down) */
static int experts_batch_ptrs(cu_be *c, const m2d_moe_args *a, const gm_weights *gw, int e0, int eb, const void *xs,
                              float *G, float *U, __nv_bfloat16 *H, const void **D, unsigned al[3]) {
    int n = a->x.rows, d = a->x.cols, de = a->d_ff;
    static const int gemm_of[BP_COUNT][3] = {{1, 0, 0}, {0, 1, 0}, {0, 0, 1}, {1, 1, 0},
                                             {1, 0, 0}, {0, 1, 0}, {0, 0, 1}, {0, 0, 1}};
    const void **hp = (const void **)m2d_malloc(sizeof(void *) * BP_COUNT * (size_t)eb);
    al[0] = al[1] = al[2] = 256;
    for (int i = 0; i < eb; i++) {
        const void *v[BP_COUNT] = {gw->gu.w[0][e0 + i], gw->gu.w[1][e0 + i], gw->dn.w[0][e0 + i], xs,
                                   G + (size_t)i * batch_stride(n, de), U + (size_t)i * batch_stride(n, de),
                                   H + (size_t)i * batch_stride(n, de), F(&a->out) + (size_t)(e0 + i) * d};
        for (int b = 0; b < BP_COUNT; b++) {
            hp[(size_t)b * eb + i] = v[b];
            for (int g = 0; g < 3; g++)
                if (gemm_of[b][g]) al[g] = M2D_MIN(al[g], ptr_align(v[b]));
        }
    }
    int ok = cuda_ok(c, cudaMemcpy(D, hp, sizeof(void *) * BP_COUNT * (size_t)eb, cudaMemcpyHostToDevice),
                     "batch pointers");
    free(hp);
    return ok ? 0 : -1;
}

/* the three batched GEMMs of experts P[.. m] (experts_batch_ptrs), or with DRY whether cuBLASLt
 * has algorithms for all three (-1: no; nothing launched) */
static int experts_batch_gemms(cu_be *c, const m2d_moe_args *a, const void *const *P, int m, const unsigned al[3],
                               float *G, float *U, __nv_bfloat16 *H, int dry) {
    int n = a->x.rows, d = a->x.cols, de = a->d_ff;
    float *const *g = (float *const *)(P + BP_G * m), *const *u = (float *const *)(P + BP_U * m);
    if (lt_gemm_batched(c, P + BP_WG * m, d, P + BP_X * m, d, n, d, de, g, de, m, al[0], dry) ||
        lt_gemm_batched(c, P + BP_WU * m, d, P + BP_X * m, d, n, d, de, u, de, m, al[1], dry))
        return -1;
    int64_t bs = (int64_t)batch_stride(n, de);
    int parts = bs == (int64_t)n * de ? 1 : m, rows = parts == 1 ? m * n : n; /* padded: expert by expert */
    for (int i = 0; i < parts && !dry; i++) {
        act_rows(c, a, G + i * bs, de, U + i * bs, de, rows, de);
        k_mat_to_bf16<<<blocks_for((int64_t)rows * de, 256), 256>>>(G + i * bs, de, rows, de, H + i * bs);
        launched(c, "k_mat_to_bf16");
    }
    return lt_gemm_batched(c, P + BP_WD * m, de, P + BP_H * m, de, n, de, d, (float *const *)(P + BP_Y * m), a->out.ld,
                           m, al[2], dry);
}

/* cu_experts_all's batched path; -1 where it does not apply (fp32, biases, weights not resident
 * bf16, no pointer-array algorithm for these shapes and alignments, the knob off): the per-expert
 * path then runs */
static int experts_all_batched(cu_be *c, const m2d_moe_args *a) {
    int n = a->x.rows, d = a->x.cols, de = a->d_ff, E = a->n_experts, ldx;
    if (!c->all_batched) return -1;
    const gm_weights *gw = a->gate_bias || a->up_bias || a->down_bias ? NULL : gm_weights_table(c, a);
    if (!gw || gw->wdt[0] != M2D_BF16 || gw->wdt[1] != M2D_BF16) {
        if (c->all_batched != 2) return -1;
        fail(c, "experts_all: the batched path (knob all_batched 2) does not apply: biases, or weights not "
                "resident bf16");
        return 0;
    }
    size_t bs = batch_stride(n, de);
    int eb = (int)M2D_MAX((size_t)1, M2D_MIN((size_t)E, ALL_BATCH_BYTES / (bs * 10)));
    float *G = (float *)scratch(c, SLOT_MOE_G, sizeof(float) * (size_t)eb * bs);
    float *U = (float *)scratch(c, SLOT_MOE_U, sizeof(float) * (size_t)eb * bs);
    __nv_bfloat16 *H = (__nv_bfloat16 *)scratch(c, SLOT_MOE_Y, 2 * (size_t)eb * bs);
    const void **D = (const void **)scratch(c, SLOT_MOE_IDX, sizeof(void *) * BP_COUNT * (size_t)eb);
    const void *xs = G && U && H && D ? x_operand(c, F(&a->x), a->x.ld, n, d, M2D_PREC_BF16, &ldx) : NULL; /* ldx = d */
    if (!xs) return 0; /* the sticky error is set */
    for (int e0 = 0; e0 < E && !c->failed; e0 += eb) {
        int m = M2D_MIN(eb, E - e0);
        unsigned al[3];
        if (experts_batch_ptrs(c, a, gw, e0, m, xs, G, U, H, D, al)) return 0;
        if (e0 == 0 && experts_batch_gemms(c, a, D, m, al, G, U, H, 1)) { /* nothing written yet */
            if (c->all_batched != 2) return -1;
            fail(c, "experts_all: no batched cuBLASLt algorithm (alignments %u, %u, %u; knob all_batched 2)", al[0],
                 al[1], al[2]);
            return 0;
        }
        if (experts_batch_gemms(c, a, D, m, al, G, U, H, 0)) {
            fail(c, "cuBLASLt: no batched algorithm for experts %d.. (%d at a time)", e0, m);
            return 0;
        }
    }
    return 0;
}

/* f_e(x) of every expert on all n rows, expert by expert, into out's columns e*d .. e*d + d */
static void cu_experts_all(m2d_backend *be, const m2d_moe_args *a) {
    cu_be *c = CU(be);
    int n = a->x.rows, d = a->x.cols, de = a->d_ff;
    if (c->failed || n <= 0 || experts_all_grouped(c, a) == 0 || experts_all_batched(c, a) == 0) return;
    float *G = (float *)scratch(c, SLOT_MOE_G, sizeof(float) * (size_t)n * de);
    float *U = (float *)scratch(c, SLOT_MOE_U, sizeof(float) * (size_t)n * de);
    for (int e = 0; e < a->n_experts && G && U && !c->failed; e++)
        expert_rows(c, a, e, F(&a->x), a->x.ld, n, G, U, F(&a->out) + (size_t)e * d, a->out.ld);
}

/* The Gram: k_gram_mma (gram_kernel 1; 2: prefetching) or k_gram_tile (0) over fixed slices of the rows, then
 * k_gram_add (cuda_kernels.cuh) */
static void cu_gram(m2d_backend *be, const m2d_mat *f, int E, m2d_buf *gb, m2d_precision prec) {
    (void)prec;
    cu_be *c = CU(be);
    int n = f->rows, d = f->cols / E, slices = c->gram_kernel ? GRAM_MMA_SLICES : GRAM_SLICES;
    if (c->failed || n <= 0) return;
    double *part = (double *)scratch(c, SLOT_GRAM, sizeof(double) * slices * (size_t)E * E);
    if (!part) return;
    dim3 grid((E + GRAM_TILE - 1) / GRAM_TILE, (E + GRAM_TILE - 1) / GRAM_TILE, slices);
    if (c->gram_kernel == 2) k_gram_mma<true><<<grid, GRAM_MMA_THREADS>>>(F(f), f->ld, n, E, d, part);
    else if (c->gram_kernel) k_gram_mma<false><<<grid, GRAM_MMA_THREADS>>>(F(f), f->ld, n, E, d, part);
    else k_gram_tile<<<grid, GRAM_THREADS>>>(F(f), f->ld, n, E, d, part);
    launched(c, c->gram_kernel ? "k_gram_mma" : "k_gram_tile");
    k_gram_add<<<blocks_for((int64_t)E * E, 256), 256>>>(part, slices, E, (double *)P(gb));
    launched(c, "k_gram_add");
}

/* ---- calibration's reductions of the expert outputs (backend.h experts_reduce): the kernels in
 * cuda_kernels.cuh ---- */

static void cu_experts_reduce(m2d_backend *be, const m2d_mat *f, int E, const m2d_buf *ids, int k1, m2d_buf *sel,
                              m2d_buf *sum_f, m2d_buf *norm2) {
    cu_be *c = CU(be);
    int n = f->rows, d = f->cols / E;
    if (c->failed || n <= 0) return;
    k_reduce_sums<<<blocks_for((int64_t)E * d, 256), 256>>>(F(f), f->ld, n, E, d, (double *)P(sum_f));
    launched(c, "k_reduce_sums");
    k_reduce_norms<<<blocks_for((int64_t)E * n * 32, 256), 256>>>(F(f), f->ld, n, E, d, (double *)P(norm2));
    launched(c, "k_reduce_norms");
    k_reduce_select<<<blocks_for((int64_t)n * k1 * d, 256), 256>>>(F(f), f->ld, n, d, (const int32_t *)P(ids), k1,
                                                                   (float *)P(sel));
    launched(c, "k_reduce_select");
    if (c->calib_overlap) copy_early(c, sel); /* the engine launches the Gram next, then downloads sel */
}

/* ---- LM head log-probabilities: chunks of the vocabulary, running log-sum-exp in fp64 ---- */
#define LM_CHUNK 16384 /* vocabulary rows per GEMM */
#define LM_ROWS 2048   /* hidden rows per GEMM (the larger, the nearer cuBLASLt's peak): <= 128 MiB of logits;
                        * the knob lm_rows sets it (fewer: the chunk's logits may stay in L2 for
                        * the log-sum-exp that reads them) */

__global__ static void k_lse_init(double *st, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) st[i] = -INFINITY, st[n + i] = 0.0, st[2 * n + i] = 0.0;
}

/* one block per row of z [rows, nv]: fold the chunk at vocabulary offset v0 into (max, sum) */
__global__ static void k_lse_chunk(const float *z, int nv, int v0, const int32_t *targets, double *st, int n, int r0) {
    int r = blockIdx.x, i = r0 + r;
    const float *zr = z + (size_t)r * nv;
    float cm = -INFINITY;
    for (int j = threadIdx.x; j < nv; j += blockDim.x) cm = fmaxf(cm, zr[j]);
    cm = block_max_f(cm);
    double s = 0;
    for (int j = threadIdx.x; j < nv; j += blockDim.x) s += expf(zr[j] - cm); /* float terms, double sum: as the CPU */
    s = block_sum_d(s);
    if (threadIdx.x == 0) lse_state_fold(st, n, i, cm, s, zr, v0, nv, targets[i]);
}

__global__ static void k_lse_final(const double *st, int n, double *lp) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) lp[i] = st[2 * n + i] - st[i] - log(st[n + i]);
}

static void cu_logprobs(m2d_backend *be, const m2d_mat *hid, const m2d_weight *head, int V, const m2d_buf *targets,
                        m2d_buf *lpb, m2d_precision prec) {
    cu_be *c = CU(be);
    int n = hid->rows, d = hid->cols, ldb;
    if (c->failed || n <= 0) return;
    prec = resolve(prec);
    int bf = prec == M2D_PREC_BF16;
    double *st = (double *)scratch(c, SLOT_LM_ST, sizeof(double) * 3 * (size_t)n);
    float *z = (float *)scratch(c, SLOT_LM, sizeof(float) * (size_t)M2D_MIN(n, c->lm_rows) * M2D_MIN(V, LM_CHUNK));
    const void *x = st && z ? x_operand(c, F(hid), hid->ld, n, d, prec, &ldb) : NULL; /* rounded once */
    if (!x) return;
    k_lse_init<<<blocks_for(n, 256), 256>>>(st, n);
    launched(c, "k_lse_init");
    const int32_t *tg = (const int32_t *)P(targets);
    for (int v0 = 0; v0 < V && !c->failed; v0 += LM_CHUNK) {
        int nv = M2D_MIN(LM_CHUNK, V - v0);
        const void *w = wtyped(c, W(head), (int64_t)v0 * d, (int64_t)nv * d, bf ? M2D_BF16 : M2D_F32);
        for (int r0 = 0; w && r0 < n && !c->failed; r0 += c->lm_rows) {
            int nr = M2D_MIN(c->lm_rows, n - r0);
            const char *xr = (const char *)x + (size_t)r0 * ldb * (bf ? 2 : 4);
            lt_gemm(c, bf ? CUDA_R_16BF : CUDA_R_32F, w, d, xr, ldb, nr, d, nv, z, nv, 0.0f);
            if (c->lse_kernel) {
                k_lse_rows<<<nr, LSE_T>>>(z, nv, v0, tg, st, n, r0, nv % 4 == 0 && ((uintptr_t)z & 15) == 0);
                launched(c, "k_lse_rows");
            } else {
                k_lse_chunk<<<nr, 256>>>(z, nv, v0, tg, st, n, r0);
                launched(c, "k_lse_chunk");
            }
        }
    }
    k_lse_final<<<blocks_for(n, 256), 256>>>(st, n, (double *)P(lpb));
    launched(c, "k_lse_final");
}

/* ---- op timing (knob profile) ---- */

static int prof_begin(cu_be *c, const char *what) {
    cu_prof *p = &c->prof;
    if (!p->on || c->failed) return -1;
    if (!p->ev) {
        p->ev = (cudaEvent_t(*)[2])m2d_calloc(PROF_MAX, sizeof *p->ev);
        p->what = (const char **)m2d_calloc(PROF_MAX, sizeof *p->what);
        for (int i = 0; i < PROF_MAX; i++) cudaEventCreate(&p->ev[i][0]), cudaEventCreate(&p->ev[i][1]);
    }
    if (p->n >= PROF_MAX) {
        p->untimed++;
        return -1;
    }
    cudaEventRecord(p->ev[p->n][0], 0);
    p->what[p->n] = what;
    return p->n++;
}

static void prof_end(cu_be *c, int i) {
    if (i >= 0) cudaEventRecord(c->prof.ev[i][1], 0);
}

/* after the device synchronised: the recorded pairs into the per-op sums */
static void prof_collect(cu_be *c) {
    cu_prof *p = &c->prof;
    for (int i = 0; i < p->n; i++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, p->ev[i][0], p->ev[i][1]) != cudaSuccess) continue;
        int k = 0;
        while (k < PROF_KINDS && p->name[k] && p->name[k] != p->what[i]) k++;
        if (k == PROF_KINDS) continue;
        p->name[k] = p->what[i], p->ms[k] += ms, p->calls[k]++;
    }
    p->n = 0;
}

/* the sums on stderr, largest first, then cleared */
static void prof_report(cu_be *c) {
    cu_prof *p = &c->prof;
    double tot = 0;
    for (int k = 0; k < PROF_KINDS && p->name[k]; k++) tot += p->ms[k];
    fprintf(stderr, "cuda profile (device %d): %.3f ms in ops%s\n", c->device, tot,
            p->untimed ? " (some calls untimed: more than PROF_MAX between syncs)" : "");
    for (;;) {
        int best = -1;
        for (int k = 0; k < PROF_KINDS && p->name[k]; k++)
            if (p->calls[k] > 0 && (best < 0 || p->ms[k] > p->ms[best])) best = k;
        if (best < 0) break;
        fprintf(stderr, "  %-12s %7ld calls %10.3f ms %5.1f %%\n", p->name[best], p->calls[best], p->ms[best],
                tot > 0 ? 100 * p->ms[best] / tot : 0);
        p->calls[best] = 0;
    }
    memset(p->name, 0, sizeof p->name), memset(p->ms, 0, sizeof p->ms), memset(p->calls, 0, sizeof p->calls);
    p->untimed = 0;
}

/* OP with its events around it, under the name WHAT */
#define TIMED(op, what, params, args)          \
    static void op##_timed params {            \
        int i_ = prof_begin(CU(be), what);     \
        op args;                               \
        prof_end(CU(be), i_);                  \
    }

TIMED(cu_gemm, "gemm", (m2d_backend *be, const m2d_mat *x, const m2d_weight *w, int w_row0, m2d_mat *y, float beta,
      m2d_precision prec), (be, x, w, w_row0, y, beta, prec))
TIMED(cu_rmsnorm, "rmsnorm", (m2d_backend *be, const m2d_mat *x, const m2d_weight *w, double eps, m2d_mat *y),
      (be, x, w, eps, y))
TIMED(cu_rope, "rope", (m2d_backend *be, m2d_mat *x, int n_heads, int hd, const m2d_buf *pos, const m2d_rope_args *r),
      (be, x, n_heads, hd, pos, r))
TIMED(cu_attention, "attention", (m2d_backend *be, const m2d_attn_args *a), (be, a))
TIMED(cu_kv_append, "kv_append", (m2d_backend *be, m2d_buf *kc, m2d_buf *vc, size_t off, size_t head_stride, int pos0,
      const m2d_mat *k, const m2d_mat *v, int n_kv, int hd), (be, kc, vc, off, head_stride, pos0, k, v, n_kv, hd))
TIMED(cu_glu, "glu", (m2d_backend *be, m2d_ffn_act act, m2d_mat *g, const m2d_mat *u), (be, act, g, u))
TIMED(cu_add, "add", (m2d_backend *be, m2d_mat *y, const m2d_mat *x), (be, y, x))
TIMED(cu_route, "route", (m2d_backend *be, m2d_mat *logits, const m2d_route_args *r, m2d_buf *topk, m2d_buf *gates),
      (be, logits, r, topk, gates))
TIMED(cu_moe, "moe", (m2d_backend *be, const m2d_moe_args *a), (be, a))
TIMED(cu_logprobs, "logprobs", (m2d_backend *be, const m2d_mat *hid, const m2d_weight *head, int V,
      const m2d_buf *targets, m2d_buf *lpb, m2d_precision prec), (be, hid, head, V, targets, lpb, prec))
TIMED(cu_embed, "embed", (m2d_backend *be, const m2d_weight *table, const m2d_buf *tokens, int n, m2d_mat *x),
      (be, table, tokens, n, x))
TIMED(cu_experts_all, "experts_all", (m2d_backend *be, const m2d_moe_args *a), (be, a))
TIMED(cu_gram, "gram", (m2d_backend *be, const m2d_mat *f, int E, m2d_buf *gb, m2d_precision prec),
      (be, f, E, gb, prec))
TIMED(cu_experts_reduce, "experts_reduce",
      (m2d_backend *be, const m2d_mat *f, int E, const m2d_buf *ids, int k1, m2d_buf *sel, m2d_buf *sum_f, m2d_buf *norm2),
      (be, f, E, ids, k1, sel, sum_f, norm2))

/* ---- lifecycle ---- */

/* the outermost enter makes this backend's device current and leave gives the caller's back: two
 * backends on two GPUs nest (the trainer's student backend around its teacher engine's calls) */
static void cu_enter(m2d_backend *be) {
    cu_be *c = CU(be);
    if (c->depth++ > 0) return;
    if (cudaGetDevice(&c->caller_device) != cudaSuccess) c->caller_device = -1;
    cuda_ok(c, cudaSetDevice(c->device), "cudaSetDevice");
}

/* the outermost leave synchronises, so a kernel fault is reported by the entry point that ran it */
static int leave_outermost(cu_be *c);

static int cu_leave(m2d_backend *be) {
    cu_be *c = CU(be);
    if (c->depth > 0 && --c->depth > 0) return 0;
    int rc = leave_outermost(c);
    if (c->caller_device >= 0 && c->caller_device != c->device) cudaSetDevice(c->caller_device);
    c->caller_device = -1;
    return rc;
}

static int leave_outermost(cu_be *c) {
    c->wgen++; /* the weights may change before the next enter (view_bf16) */
    cuda_ok(c, cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    if (c->prof.n) prof_collect(c);
    if (c->err_armed && !c->failed) { /* the flag comes back only after a kernel that may set it */
        int bad = 0;
        c->err_armed = 0;
        if (cuda_ok(c, cudaMemcpy(&bad, c->dev_err, sizeof bad, cudaMemcpyDeviceToHost), "error flag") && bad) {
            cudaMemset(c->dev_err, 0, sizeof bad);
            fail(c, "moe: an expert id outside [0, n_experts) in topk");
        }
    }
    if (!c->failed) return 0;
    c->failed = 0;
    cudaGetLastError(); /* a non-sticky error is cleared; a sticky one will fail the next op again */
    return m2d_err("cuda: device %d: %s", c->device, c->why);
}

static int cu_tune(m2d_backend *be, const char *knob, int value) {
    if (strcmp(knob, "all_grouped_rows") == 0 && value >= 0) {
        CU(be)->all_grouped_rows = value;
        return 0;
    }
    if (strcmp(knob, "lm_rows") == 0 && value >= 1 && value <= LM_ROWS) {
        CU(be)->lm_rows = value;
        return 0;
    }
    int *at = strcmp(knob, "gemm_naive") == 0 ? &CU(be)->gemm_naive
              : strcmp(knob, "moe_grouped") == 0 ? &CU(be)->moe_grouped
              : strcmp(knob, "attn_kernel") == 0 ? &CU(be)->attn_kernel
              : strcmp(knob, "gram_kernel") == 0 ? &CU(be)->gram_kernel
              : strcmp(knob, "all_batched") == 0 ? &CU(be)->all_batched
              : strcmp(knob, "lse_kernel") == 0  ? &CU(be)->lse_kernel
              : strcmp(knob, "gx_ldsm") == 0     ? &CU(be)->gx_ldsm
              : strcmp(knob, "gx_wide") == 0     ? &CU(be)->gx_wide
              : strcmp(knob, "calib_overlap") == 0 ? &CU(be)->calib_overlap
              : strcmp(knob, "bf16_wcache") == 0 ? &CU(be)->bf16_wcache
              : strcmp(knob, "profile") == 0     ? &CU(be)->prof.on : NULL;
    if (at == &CU(be)->prof.on && value == 0 && *at) prof_report(CU(be)); /* profile 0: report, stop */
    int top = at == &CU(be)->attn_kernel || at == &CU(be)->moe_grouped ? 3
              : at == &CU(be)->all_batched || at == &CU(be)->gram_kernel   ? 2
                                                                             : 1; /* the knob's largest value */
    if (at && value >= 0 && value <= top) {
        *at = value;
        return 0;
    }
    return m2d_err("backend cuda: knob '%s' = %d: unknown knob or bad value (gemm_naive, profile, "
                   "lse_kernel, gx_ldsm, gx_wide, calib_overlap, bf16_wcache: 0|1; moe_grouped, attn_kernel: 0..3; all_batched, gram_kernel: 0|1|2; "
                   "all_grouped_rows: >= 0; "
                   "lm_rows: 1..2048)",
                   knob, value);
}

static void cu_destroy(m2d_backend *be) {
    cu_be *c = CU(be);
    if (c->prof.on) prof_report(c);
    for (int i = 0; c->prof.ev && i < PROF_MAX; i++) cudaEventDestroy(c->prof.ev[i][0]), cudaEventDestroy(c->prof.ev[i][1]);
    free(c->prof.ev);
    free(c->prof.what);
    for (int s = 0; s < PIN_SLOTS; s++)
        if (c->pinned[s]) cudaHostUnregister(c->pinned[s]);
    for (int s = 0; s < SLOT_COUNT; s++) cudaFree(c->slot[s]);
    cache_flush(&c->cache);
    cudaFree(c->ws);
    cudaFree(c->dev_err);
    if (c->copy_ready) cudaEventDestroy(c->copy_ready);
    if (c->copy_stream) cudaStreamDestroy(c->copy_stream);
    if (c->lt) cublasLtDestroy(c->lt);
    free(c->gw);
    free(c);
}

static m2d_backend_ops make_ops(void) {
    m2d_backend_ops o;
    memset(&o, 0, sizeof o);
    o.name = "cuda";
    o.precisions = (1u << M2D_PREC_FP32) | (1u << M2D_PREC_BF16);
    o.destroy = cu_destroy, o.tune = cu_tune, o.enter = cu_enter, o.leave = cu_leave;
    o.alloc = cu_alloc, o.release = cu_release, o.upload = cu_upload, o.download = cu_download;
    o.download_mat = cu_download_mat, o.pin = cu_pin, o.unpin = cu_unpin;
    o.weight_new = cu_weight_new, o.weight_free = cu_weight_free, o.resident_bytes = cu_resident_bytes;
    o.make_resident = cu_make_resident, o.resident_budget = cu_resident_budget, o.weight_f32 = cu_weight_f32;
    o.embed = cu_embed_timed, o.gemm = cu_gemm_timed, o.rmsnorm = cu_rmsnorm_timed, o.rope = cu_rope_timed;
    o.attention = cu_attention_timed, o.kv_append = cu_kv_append_timed, o.glu = cu_glu_timed, o.add = cu_add_timed;
    o.route = cu_route_timed, o.moe = cu_moe_timed, o.logprobs = cu_logprobs_timed;
    o.glu_clamp = cu_glu_clamp, o.add_bias = cu_add_bias, o.clamp = cu_clamp, o.sigmoid_scale = cu_sigmoid_scale;
    o.experts_all = cu_experts_all_timed, o.gram = cu_gram_timed, o.experts_reduce = cu_experts_reduce_timed;
    o.auto_precision = cu_auto_precision;
    o.train = &cu_train_ops;
    o.caps = M2D_CAPS_ALL; /* every forward, calibration and training op */
    o.resident_embedding = 1; /* a streamed lookup syncs, converts on the host and uploads n x d floats */
    return o;
}

static const m2d_backend_ops cuda_ops = make_ops();

#define WORKSPACE_BYTES ((size_t)32 << 20) /* cuBLAS's recommendation for Hopper */

/* *value from the environment variable NAME (one digit 0..TOP), if set; -1 with an error naming it */
static int env_knob(const char *name, const char *knob, int top, int *value) {
    const char *v = getenv(name);
    if (!v) return 0;
    if (strlen(v) != 1 || v[0] < '0' || v[0] > '0' + top)
        return m2d_err("cuda: %s=%s: expected 0 to %d (the knob %s)", name, v, top, knob);
    *value = v[0] - '0';
    return 0;
}

static int cu_create(const m2d_backend_opts *o, m2d_backend **out) {
    *out = NULL;
    /* M2D_CUDA_ATTN, M2D_CUDA_MOE=0..3, M2D_CUDA_LSE, M2D_CUDA_WCACHE=0|1: the knobs attn_kernel,
     * moe_grouped, lse_kernel and bf16_wcache for a whole process, so that the GPU runner can put a
     * kernel that is not the default through the CLI (and a bench through a trainer's backends);
     * checked first, so that a bad value is named with or without a GPU */
    int attn_kernel = 3, moe_kernel = 3, lse_kernel = 1, wcache = 1;
    if (env_knob("M2D_CUDA_ATTN", "attn_kernel", 3, &attn_kernel) ||
        env_knob("M2D_CUDA_MOE", "moe_grouped", 3, &moe_kernel) || env_knob("M2D_CUDA_LSE", "lse_kernel", 1, &lse_kernel) ||
        env_knob("M2D_CUDA_WCACHE", "bf16_wcache", 1, &wcache))
        return -1;
    int n = 0, dev = o->device;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) return m2d_err("cuda: no CUDA device (cudaGetDeviceCount: %s)", cudaGetErrorString(e));
    if (n == 0) return m2d_err("cuda: no CUDA device (cudaGetDeviceCount: 0 devices)");
    if (dev < 0 || dev >= n) return m2d_err("cuda: device %d does not exist (%d CUDA devices: 0..%d)", dev, n, n - 1);
    if ((e = cudaSetDevice(dev)) != cudaSuccess) return m2d_err("cuda: cudaSetDevice(%d): %s", dev, cudaGetErrorString(e));
    cu_be *c = (cu_be *)m2d_calloc(1, sizeof *c);
    c->base.ops = &cuda_ops;
    c->device = dev;
    c->caller_device = -1;
    c->ws_bytes = WORKSPACE_BYTES;
    /* M2D_CUDA_FAST=0: the reference kernels (per-expert MoE, warp-per-row attention, the two-pass
     * log-sum-exp, weights rounded at every bf16 GEMM): the GPU runner's A/B of the two paths in one
     * call */
    const char *fast = getenv("M2D_CUDA_FAST");
    int ref = fast && strcmp(fast, "0") == 0;
    c->moe_grouped = ref ? 0 : moe_kernel;
    c->all_grouped_rows = 64;
    c->lm_rows = LM_ROWS;
    c->attn_kernel = ref ? 0 : attn_kernel;
    c->gram_kernel = !ref;
    c->all_batched = !ref;
    c->lse_kernel = ref ? 0 : lse_kernel;
    c->bf16_wcache = ref ? 0 : wcache;
    c->wgen = 1;
    const char *prof = getenv("M2D_CUDA_PROFILE"); /* 1: op times on stderr when the backend is freed */
    c->prof.on = prof && strcmp(prof, "1") == 0;
    cublasStatus_t s = cublasLtCreate(&c->lt);
    if (s != CUBLAS_STATUS_SUCCESS || (e = cudaMalloc(&c->ws, c->ws_bytes)) != cudaSuccess ||
        (e = cudaMalloc(&c->dev_err, sizeof(int))) != cudaSuccess || (e = cudaMemset(c->dev_err, 0, sizeof(int))) != cudaSuccess) {
        if (s == CUBLAS_STATUS_SUCCESS) cublasLtDestroy(c->lt);
        cudaFree(c->ws);
        cudaFree(c->dev_err);
        free(c);
        return s != CUBLAS_STATUS_SUCCESS ? m2d_err("cuda: cublasLtCreate: status %d", (int)s)
                                          : m2d_err("cuda: workspace or error flag: %s", cudaGetErrorString(e));
    }
    *out = &c->base;
    return 0;
}

M2D_BACKEND(cuda, "cuda", "NVIDIA GPU (cuda[:N]): cuBLASLt fp32/bf16 GEMMs with fp32 accumulation, fused kernels",
            cu_create, .has_devices = 1)
