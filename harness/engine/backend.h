/* backend — the device boundary of the engine: memory, weights and every compute op a forward
 * pass needs, as a table of function pointers (m2d_backend_ops) on an object held per engine.
 *
 * The engine (engine.c) calls only these ops, on buffers the backend allocated; it never touches
 * activations itself. A backend is chosen by name ("cpu"; issue 17 adds "cuda") through a small
 * self-registering table (M2D_BACKEND below), so adding one is one new file plus its build flag.
 *
 * Conventions every backend follows (and tests/test_engine.c checks for each registered backend):
 *  - Activations are fp32, row-major. A matrix operand is an m2d_mat: a window of `rows` rows of
 *    `cols` elements, row stride `ld` elements, starting `off` elements into a buffer. Index arrays
 *    (tokens, positions, expert ids) are int32 buffers; log-probabilities are fp64 buffers.
 *  - Weights stay in their stored dtype (F32/BF16/F16 today); an m2d_weight is the backend's handle
 *    for one checkpoint tensor (for a GEMM: a row-major [out, in] nn.Linear matrix). make_resident
 *    asks the backend to keep a prepared copy (CPU: the GEMM kernel's layout for the backend's
 *    precision, m2d_backend_opts; a GPU: device memory, its own layout); otherwise the backend
 *    reads or prepares rows on use. Either way the results are bit-identical.
 *  - Each GEMM carries an m2d_precision (fp32, or bf16 operands with fp32 accumulation; a backend
 *    states what it supports in `precisions`, resolves AUTO in `auto_precision`, and the engine
 *    refuses others).
 *  - Results must not depend on the thread count or schedule: reductions run in a fixed order
 *    (the CPU backend splits GEMMs by output rows/columns only and scatter-adds experts in id order).
 *  - Ops do not return errors: a backend records its first failure (device OOM, launch error),
 *    skips later ops, and reports it from leave() with m2d_err. alloc returns NULL on failure.
 *  - enter()/leave() bracket every engine entry point (the CPU backend makes OpenBLAS
 *    single-threaded inside: its own threads split the work); they nest.
 * Training (issue 11) adds a second table, m2d_backend_train_ops (below), reached through
 * ops->train: the backward of every forward op, the distillation losses and the optimizer step,
 * with the same conventions. A backend that cannot train leaves it NULL. */
#ifndef M2D_BACKEND_H
#define M2D_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/tensor.h"
#include "model/model.h"

typedef struct m2d_backend m2d_backend;
typedef struct m2d_buf m2d_buf;       /* backend memory (opaque) */
typedef struct m2d_weight m2d_weight; /* a weight tensor as the backend holds it (opaque) */

/* The arithmetic of GEMMs. FP32 is zero, so zeroed options mean the exact path. AUTO is what
 * users ask for; a backend resolves it (auto_precision) to one it runs fastest. */
typedef enum {
    M2D_PREC_FP32,          /* fp32 operands, fp32 accumulation */
    M2D_PREC_BF16,          /* operands rounded to bf16 (nearest even), exact products, fp32 accumulation */
    M2D_PREC_AUTO,          /* the backend's fastest: CPU bf16 where the CPU computes bf16 natively */
    M2D_PREC_COUNT
} m2d_precision;

/* "fp32", "bf16", "auto" */
const char *m2d_precision_name(m2d_precision p);
/* Parse a --precision value; error naming WHAT (e.g. "--precision") for anything else. */
int m2d_precision_parse(const char *s, const char *what, m2d_precision *out);

/* A rows x cols fp32 window of BUF: element (r, c) at off + r*ld + c. */
typedef struct {
    m2d_buf *buf;
    size_t off;
    int rows, cols, ld;
} m2d_mat;

static inline m2d_mat m2d_mat_of(m2d_buf *buf, size_t off, int rows, int cols, int ld) {
    m2d_mat m = {buf, off, rows, cols, ld};
    return m;
}

/* Causal grouped-query attention of one segment of nq query rows (scale 1/sqrt(head_dim) unless given; query
 * head h uses kv head h / (n_heads / n_kv); scores and softmax in fp32 with max subtraction).
 * Row i attends to the np cached prefix positions and to segment rows 0..i; with a window w > 0
 * only to the last w of those positions (itself included: key t is seen from query position p iff
 * p - w < t <= p, HF's sliding mask). With sinks, head h's softmax denominator also holds
 * exp(sinks[h]) (a logit whose value row is zero: GPT-OSS). */
typedef struct {
    m2d_mat q;              /* [nq, n_heads*head_dim], already normed and rotated */
    m2d_mat k, v;           /* [nq, n_kv*head_dim], this segment's own keys/values (same ld) */
    const m2d_buf *k_cache, *v_cache; /* prefix: kv head g's np rows start at cache_off + g*head_stride, */
    size_t cache_off, head_stride;    /*   [np, head_dim] contiguous (the m2d_kv layout); unused if np == 0 */
    int np;
    int n_heads, n_kv, head_dim;
    m2d_mat out;            /* [nq, n_heads*head_dim] */
    int window;             /* 0: full causal attention */
    const m2d_weight *sinks; /* [n_heads] or NULL */
    float scale;            /* scores = q.k * scale (0: 1/sqrt(head_dim)) */
    m2d_precision prec;     /* FP32 (0): fp32 operands. BF16 (capability attention-bf16): q, k, v and
                             * the softmax's numerators exp(s - max) rounded to bf16 (nearest even)
                             * before their products, which are exact, summed in fp32; the
                             * denominator sums the unrounded numerators (as a flash kernel does) */
} m2d_attn_args;

/* Routing of n tokens: logits [n, E] in, probabilities out (in place), top-k ids and gate weights. */
typedef struct {
    m2d_router_kind kind;   /* model.h: how p is formed and the k chosen (ties -> lower index) */
    bool renorm;            /* SOFTMAX_TOPK: gates = p / sum of the chosen p; else gates = p */
    int k;
    /* group-limited top-k (DeepSeek's group_limited_greedy): the E experts in n_group groups of
     * E / n_group, only the topk_group groups with the largest best p compete (ties -> lower
     * group); 0: off */
    int n_group, topk_group;
    float scale;            /* gates *= scale after the above (routed_scaling_factor); 0: 1 */
} m2d_route_args;

/* Routed experts of an MoE layer on n tokens: out[t] = sum_j gates[t,j] * f_{topk[t,j]}(x[t]),
 * f_e(x) = down_e(act(gate_e x + bg_e, up_e x + bu_e)) + bd_e (biases when given). out is
 * overwritten; the sum runs over experts in id order (fixed, schedule-independent). */
typedef struct {
    m2d_mat x;              /* [n, d] FFN input */
    const m2d_buf *topk;    /* int32 [n, k] (route's output) */
    const m2d_buf *gates;   /* fp32 [n, k] */
    int k, n_experts, d_ff; /* experts per token, experts, expert width d_e */
    m2d_weight *const *gate, *const *up, *const *down; /* [n_experts] each */
    m2d_ffn_act act;
    m2d_precision prec;
    m2d_mat out;            /* [n, d] */
    m2d_weight *const *gate_bias, *const *up_bias, *const *down_bias; /* [n_experts] each, or NULL */
    float act_alpha, act_limit; /* M2D_ACT_SWIGLU_CLAMP's parameters */
    int exact_rows;         /* each token's expert outputs independent of its batch where the backend
                             * can make them so at some cost (experts_rows_exact); 0: fastest */
} m2d_moe_args;

/* RoPE of each head's first rot_dim dimensions (the rest unchanged): pair i turns by pos * f_i,
 * f_i = inv_freq[i] or theta^(-2i/rot_dim); cos and sin are multiplied by attn_factor (YaRN). */
typedef struct {
    m2d_rope_kind kind;
    double theta;
    const double *inv_freq; /* host [rot_dim/2]; NULL: theta^(-2i/rot_dim) */
    double attn_factor;     /* 0: 1 */
    int rot_dim;            /* 0: head_dim */
} m2d_rope_args;

/* Capabilities: the ops and op variants a backend implements (ggml's supports_op). A backend lists
 * them in m2d_backend_ops.caps; the engine refuses at open, in one line naming the capability, a
 * model that needs one the backend lacks (m2d_engine_required_caps), and the tests ask the same
 * query instead of calling an op a backend does not have. Ops without an entry here (gemm, rmsnorm,
 * full causal GQA attention, rotate-half RoPE at theta^(-2i/d), softmax + top-k routing, SwiGLU
 * experts, the LM head) every backend implements. A capability listed promises its op pointer is
 * set (test_engine checks that for every registered backend). */
#define M2D_CAPS(X)                                                                                \
    X(ROPE_INTERLEAVED, "rope-interleaved")     /* M2D_ROPE_INTERLEAVED pairs (DeepSeek-V2) */       \
    X(ROPE_SCALED, "rope-scaled")               /* an inv_freq table and attn_factor (YaRN, linear) */ \
    X(ROPE_PARTIAL, "rope-partial")             /* rot_dim < head_dim */                           \
    X(ATTN_WINDOW, "attention-window")          /* sliding-window attention */                     \
    X(ATTN_SINKS, "attention-sinks")            /* GPT-OSS's sink logits */                        \
    X(ATTN_SCALE, "attention-scale")            /* a softmax scale other than 1/sqrt(head_dim) */  \
    X(ATTN_BF16, "attention-bf16")              /* attention on bf16 operands (m2d_attn_args.prec) */ \
    X(BIAS, "add_bias")                         /* the add_bias op (attention and router biases) */ \
    X(CLAMP, "clamp")                           /* the clamp op (OLMoE's clip_qkv) */              \
    X(SIGMOID_SCALE, "sigmoid_scale")           /* the sigmoid_scale op (Qwen2-MoE's shared gate) */ \
    X(GLU_CLAMP, "glu_clamp")                   /* the clamped SwiGLU, op and experts (GPT-OSS) */ \
    X(ROUTE_TOPK_SOFTMAX, "route-topk-softmax") /* M2D_ROUTER_TOPK_SOFTMAX (GPT-OSS) */            \
    X(ROUTE_GROUPS, "route-group-limited")      /* group-limited top-k (DeepSeek-V2) */            \
    X(ROUTE_SCALE, "route-scale")               /* a gate factor (routed_scaling_factor) */        \
    X(MOE_BIAS, "expert-biases")                /* expert gate/up/down biases (GPT-OSS) */         \
    X(EXPERTS_ALL, "experts_all")               /* calibration: every expert on every token */     \
    X(GRAM, "gram")                             /* calibration: the Gram of the expert outputs */  \
    X(EXPERTS_REDUCE, "experts_reduce")         /* calibration: sums and chosen rows of them */    \
    X(TRAIN, "train")                           /* the training ops (m2d_backend_train_ops) */

typedef enum {
#define M2D_CAP_ENUM(id, name) M2D_CAP_##id,
    M2D_CAPS(M2D_CAP_ENUM)
#undef M2D_CAP_ENUM
    M2D_CAP_COUNT
} m2d_cap;

#define M2D_CAP(c) (1ull << (c))
#define M2D_CAPS_ALL (M2D_CAP(M2D_CAP_COUNT) - 1)
/* "rope-interleaved", ... */
const char *m2d_cap_name(m2d_cap c);

typedef struct {
    const char *name;       /* "cpu" */
    unsigned precisions;    /* bit (1u << m2d_precision) for each supported precision */
    uint64_t caps;          /* M2D_CAP(c) for each capability implemented (above) */
    int resident_embedding; /* embedding lookups want the table resident (a device's memory: a
                             * streamed lookup is a round trip through the host); 0: they convert
                             * just the rows they read (the CPU) */

    void (*destroy)(m2d_backend *be);
    /* backend-specific knobs (CPU: "threads", "expert_parallel", "attention_gemm_min_rows");
     * -1 + m2d_err for an unknown knob or value */
    int (*tune)(m2d_backend *be, const char *knob, int value);
    void (*enter)(m2d_backend *be);
    int (*leave)(m2d_backend *be); /* -1 + m2d_err if an op failed since the outermost enter */

    /* ---- memory ---- */
    m2d_buf *(*alloc)(m2d_backend *be, size_t bytes);  /* contents undefined; NULL + m2d_err on failure */
    void (*release)(m2d_backend *be, m2d_buf *buf);    /* NULL ok */
    void (*upload)(m2d_backend *be, m2d_buf *dst, size_t dst_off_bytes, const void *src, size_t bytes);
    void (*download)(m2d_backend *be, void *dst, const m2d_buf *src, size_t src_off_bytes, size_t bytes);
    /* src's rows x cols window into host dst with row stride ld_dst */
    void (*download_mat)(m2d_backend *be, float *dst, int ld_dst, const m2d_mat *src);
    /* A buffer over the caller's host memory P (bytes), for ops to read and write in place without
     * upload/download (release frees the handle, not P); NULL op or NULL result: not possible
     * (device memory): the caller allocates and copies instead. */
    m2d_buf *(*host_view)(m2d_backend *be, void *p, size_t bytes);
    /* Host memory P (bytes) page-locked for the copies to and from it (a device's DMA reads and
     * writes it directly: several times the rate of pageable memory); unpin undoes it, and destroy
     * undoes what is left. Best effort: -1 (no m2d_err) leaves P pageable, copies as before. NULL
     * ops: nothing to gain (host memory). */
    int (*pin)(m2d_backend *be, void *p, size_t bytes);
    void (*unpin)(m2d_backend *be, void *p);

    /* ---- weights ---- */
    m2d_weight *(*weight_new)(m2d_backend *be, const m2d_tensor *t); /* t must outlive the handle */
    void (*weight_free)(m2d_backend *be, m2d_weight *w);
    /* the most make_resident may take (0: nothing to do, or done); cheap: the engine asks it of
     * every weight to see whether a checkpoint fits the budget */
    size_t (*resident_bytes)(m2d_backend *be, const m2d_weight *w);
    /* a resident copy of W (the CPU: prepared in its kernel's layout; a device: uploaded), or W kept
     * as stored where a copy would change a result (it never does: every result keeps its bits).
     * *MADE (may be NULL): the bytes of the copy made now, 0 when none was (already resident, or
     * kept as stored): what the engine charges to its budget, resident_bytes being an upper bound */
    int (*make_resident)(m2d_backend *be, m2d_weight *w, size_t *made);
    size_t (*resident_budget)(m2d_backend *be);       /* bytes of prepared weights affordable by default */
    /* elements [first, first+n) of W as fp32 into host dst (tests, debugging) */
    void (*weight_f32)(m2d_backend *be, const m2d_weight *w, int64_t first, int64_t n, float *dst);

    /* ---- ops ---- */
    /* x[i] = row tokens[i] of TABLE ([vocab, d] weight), as fp32 */
    void (*embed)(m2d_backend *be, const m2d_weight *table, const m2d_buf *tokens, int n, m2d_mat *x);
    /* y = x · W[w_row0 .. w_row0 + y.cols)^T + beta · y  (x.cols = W's columns; y.rows = x.rows) */
    void (*gemm)(m2d_backend *be, const m2d_mat *x, const m2d_weight *w, int w_row0, m2d_mat *y, float beta,
                 m2d_precision prec);
    /* y = x / sqrt(mean(x^2) + eps) * w, per row over x.cols (sum of squares in fp64); y may be x */
    void (*rmsnorm)(m2d_backend *be, const m2d_mat *x, const m2d_weight *w, double eps, m2d_mat *y);
    /* rotary embedding of the n_heads heads of each row of x (head h at column h*head_dim), at
     * positions pos[row] (int32); see m2d_rope_args */
    void (*rope)(m2d_backend *be, m2d_mat *x, int n_heads, int head_dim, const m2d_buf *pos, const m2d_rope_args *r);
    void (*attention)(m2d_backend *be, const m2d_attn_args *a);
    /* rows of k, v (a [n, n_kv*head_dim] segment) to cache positions pos0.. (layout as m2d_attn_args) */
    void (*kv_append)(m2d_backend *be, m2d_buf *k_cache, m2d_buf *v_cache, size_t cache_off, size_t head_stride,
                      int pos0, const m2d_mat *k, const m2d_mat *v, int n_kv, int head_dim);
    /* g = act(g, u) elementwise (SwiGLU: silu(g) * u) */
    void (*glu)(m2d_backend *be, m2d_ffn_act act, m2d_mat *g, const m2d_mat *u);
    /* g = (clamp(u, -limit, limit) + 1) * min(g, limit) * sigmoid(alpha * min(g, limit))
     * elementwise (M2D_ACT_SWIGLU_CLAMP, GPT-OSS's experts) */
    void (*glu_clamp)(m2d_backend *be, m2d_mat *g, const m2d_mat *u, float alpha, float limit);
    /* y[r] += b for every row r of y (b: a weight of y.cols elements) */
    void (*add_bias)(m2d_backend *be, m2d_mat *y, const m2d_weight *b);
    void (*add)(m2d_backend *be, m2d_mat *y, const m2d_mat *x); /* y += x (residual) */
    /* y[r, :] *= sigmoid(s[r, 0]) for every row r (Qwen2-MoE's shared-expert gate) */
    void (*sigmoid_scale)(m2d_backend *be, m2d_mat *y, const m2d_mat *s);
    /* x = min(max(x, -limit), limit) elementwise (OLMoE's clip_qkv) */
    void (*clamp)(m2d_backend *be, m2d_mat *x, float limit);
    /* topk int32 [n, k], gates fp32 [n, k] (see m2d_route_args); logits become the full softmax
     * p for every router kind */
    void (*route)(m2d_backend *be, m2d_mat *logits, const m2d_route_args *r, m2d_buf *topk, m2d_buf *gates);
    void (*moe)(m2d_backend *be, const m2d_moe_args *a);
    /* lp[i] = log softmax(hid_i · HEAD^T)[targets[i]] (fp64), over all VOCAB rows of HEAD, without
     * materialising [n, vocab] (streaming log-sum-exp) */
    void (*logprobs)(m2d_backend *be, const m2d_mat *hid, const m2d_weight *head, int vocab, const m2d_buf *targets,
                     m2d_buf *lp, m2d_precision prec);

    /* ---- calibration (SPEC §1: every expert on every token, and their Gram) ---- */
    /* f_e(x) of EVERY expert on the same n rows (no routing, no gate): out [n, n_experts * d], token
     * t's output of expert e at columns e*d .. e*d + d (topk, gates and k are unused) */
    void (*experts_all)(m2d_backend *be, const m2d_moe_args *a);
    /* 1 when an expert's output for a token does not depend on which other tokens share its
     * batch, for every expert of A (with A's exact_rows): experts_all then reproduces moe's expert
     * outputs bit for bit (the engine lets a calibration hook supply the routed output only then).
     * NULL: never. */
    int (*experts_rows_exact)(m2d_backend *be, const m2d_moe_args *a);
    /* g (fp64 [E, E] row-major; only the upper triangle i <= j is updated) += sum over the rows t
     * of f ([n, E * d]) of F_t F_t^T, F_t = row t as [E, d]. FP32: every product and sum in fp64
     * (SPEC §1); BF16: each token's F_t F_t^T in fp32 (d terms), added into fp64 (the error
     * analysis is in backend_cpu.c). Rows in order: the same result on any thread count. */
    void (*gram)(m2d_backend *be, const m2d_mat *f, int n_experts, m2d_buf *g, m2d_precision prec);
    /* Calibration's reductions of f ([n, E * d], experts_all's layout) where f lies, so that only
     * what the statistics read leaves the backend (a GPU's f is 1 MiB a token on Qwen3-30B-A3B):
     *   sum_f (fp64 [E, d]) += Σ_t f_e(t), each element summed over t = 0 .. n-1 in order onto
     *     its value: fp64 additions of fp32 values, so the same bits on every backend;
     *   norm2 (fp64 [E, n]) = ‖f_e(t)‖², summed in fp64 in any order;
     *   sel (fp32 [n, k1, d]): row (t, r) = f_{ids[t * k1 + r]}(t), zeros where that id is -1
     *     (ids int32 [n, k1], each -1 or in [0, E)). */
    void (*experts_reduce)(m2d_backend *be, const m2d_mat *f, int n_experts, const m2d_buf *ids, int k1, m2d_buf *sel,
                           m2d_buf *sum_f, m2d_buf *norm2);
    /* what AUTO means on this backend (FP32 and BF16 are returned unchanged) */
    m2d_precision (*auto_precision)(m2d_backend *be, m2d_precision p);

    /* training ops (below); NULL: this backend cannot train (the trainer refuses with one line) */
    const struct m2d_backend_train_ops *train;
} m2d_backend_ops;

/* ---- training (issue 11): the backward of each forward op, losses, the optimizer step ----
 * Same conventions as the forward ops: fp32 m2d_mat windows, no error returns (sticky errors),
 * reductions in a fixed order so that results do not depend on the thread count or schedule.
 * "beta" follows gemm: the output is overwritten (0) or accumulated into (1). Gradients of
 * weights are m2d_mat windows of plain buffers ([out, in] like the weight, a norm's as 1 x d).
 * The backward of RoPE needs no op: R(p)^T = R(-p), the forward rope at negated positions (true
 * for every rotary variant whose angle is linear in the position, YaRN's mscale included; the
 * gradient checks in tests/test_train_ops.c would catch a variant where it is not). */

/* Backward of causal GQA attention over one segment of n rows with no cached prefix (training
 * windows): the forward's operands and output, and dL/d out; dq, dk, dv are overwritten. Window,
 * sinks and scale as the forward's (m2d_attn_args); with sinks, dsinks (1 x n_heads) receives
 * dL/d sink added to what it holds: the sink's probability P_s of each row times -(o . dout). */
typedef struct {
    m2d_mat q, k, v, out;   /* as m2d_attn_args (q [n, heads*hd], k/v [n, kv*hd]) */
    m2d_mat dout;           /* [n, heads*hd] */
    m2d_mat dq, dk, dv;     /* shapes of q, k, v */
    int n_heads, n_kv, head_dim;
    int window;             /* 0: full causal */
    const m2d_weight *sinks; /* [n_heads] or NULL */
    m2d_mat dsinks;         /* 1 x n_heads (used only with sinks) */
    float scale;            /* 0: 1/sqrt(head_dim) */
} m2d_attn_bwd_args;

typedef enum {
    M2D_KD_FORWARD_KL,      /* KL(p_T || p_S) = sum p_T (log p_T - log p_S) */
    M2D_KD_REVERSE_KL,      /* KL(p_S || p_T) */
} m2d_kd_kind;

/* AdamW as torch.optim.AdamW: p -= lr*wd*p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps). g is multiplied by grad_scale first. */
typedef struct {
    double lr, beta1, beta2, eps, weight_decay;
    int step;               /* t, 1-based */
    float grad_scale;       /* global-norm clipping factor (1: none) */
} m2d_adamw_args;

typedef struct m2d_backend_train_ops {
    /* A weight handle over fp32 rows x cols at element OFF of BUF (the trainer's master weights):
     * the forward ops use it like a checkpoint weight and see later writes to BUF made by adamw or
     * between brackets (enter/leave): inside a bracket a backend may keep what it derives from the
     * weight (a bf16 copy, a transpose) from its first use until adamw, so a write to BUF inside a
     * bracket by any other op (upload, fill, copy) is not seen by the ops that follow it there.
     * weight_free. */
    m2d_weight *(*weight_view)(m2d_backend *be, m2d_buf *buf, size_t off, int64_t rows, int64_t cols);
    void (*fill)(m2d_backend *be, m2d_buf *buf, size_t off, size_t n, float value); /* n floats from OFF */
    void (*copy)(m2d_backend *be, m2d_mat *dst, const m2d_mat *src);
    /* dx = dy · W + beta dx: gemm's backward for its input (W [out, in] as in gemm, rows from 0).
     * PREC as gemm's (FP32 or BF16, never AUTO): BF16 rounds dy and W to bf16 (nearest even), exact
     * products, fp32 accumulation and dx. A backend that trains takes every precision it lists. */
    void (*gemm_dx)(m2d_backend *be, const m2d_mat *dy, const m2d_weight *w, m2d_mat *dx, float beta,
                    m2d_precision prec);
    /* dw = dy^T · x + beta dw ([out, in]): gemm's backward for its weight (PREC as gemm_dx: BF16
     * rounds dy and x; dw stays fp32) */
    void (*gemm_dw)(m2d_backend *be, const m2d_mat *dy, const m2d_mat *x, m2d_mat *dw, float beta,
                    m2d_precision prec);
    /* rmsnorm's backward (per row over x.cols): dx = J^T dy + beta dx; dw (1 x cols) += sum over
     * rows of dy * x / rms (rows summed in order). dx may be dy (with beta 0). */
    void (*rmsnorm_bwd)(m2d_backend *be, const m2d_mat *x, const m2d_weight *w, double eps, const m2d_mat *dy,
                        m2d_mat *dx, float beta, m2d_mat *dw);
    void (*attention_bwd)(m2d_backend *be, const m2d_attn_bwd_args *a);
    /* glu's backward: h = act(g, u); dh comes in DG and is replaced by dL/dg; du is overwritten */
    void (*glu_bwd)(m2d_backend *be, m2d_ffn_act act, const m2d_mat *g, const m2d_mat *u, m2d_mat *dg, m2d_mat *du);
    /* glu_clamp's backward, as glu_bwd; torch's clamp gradients: min(g, limit) passes dL where
     * g <= limit, clamp(u, -limit, limit) where -limit <= u <= limit (the boundary passes) */
    void (*glu_clamp_bwd)(m2d_backend *be, const m2d_mat *g, const m2d_mat *u, float alpha, float limit, m2d_mat *dg,
                          m2d_mat *du);
    /* clamp's backward (torch.clamp's): dy zeroed where the clamp's input x is outside [-limit, limit] */
    void (*clamp_bwd)(m2d_backend *be, const m2d_mat *x, float limit, m2d_mat *dy);
    /* add_bias's backward: db (1 x cols) += the sum over the rows of dy (in row order per fixed
     * chunk, the chunks added in order) */
    void (*bias_bwd)(m2d_backend *be, const m2d_mat *dy, m2d_mat *db);
    /* The backward of one vector given to n_heads heads (MLA's shared rotated key): y[r, j] =
     * the sum over h = 0 .. n_heads-1 (in order, fp64) of x[r, h * stride + j], + beta y[r, j];
     * X is the first head's window (x.cols = y.cols <= stride, the heads at columns h * stride) */
    void (*head_sum)(m2d_backend *be, const m2d_mat *x, int n_heads, int stride, m2d_mat *y, float beta);
    /* embed's backward: dtable row tokens[i] += dx row i, for i = 0 .. dx.rows-1 in order */
    void (*embed_bwd)(m2d_backend *be, const m2d_buf *tokens, const m2d_mat *dx, m2d_mat *dtable);
    /* Distillation loss per row of logits (temperature 1, natural log): row_loss[i] (fp64) = the
     * row's divergence between softmax(zt_i) and softmax(zs_i); zs is replaced by
     * scale * d row_loss[i] / d zs_i. */
    void (*kd_loss)(m2d_backend *be, m2d_kd_kind kind, const m2d_mat *zt, m2d_mat *zs, double scale, m2d_buf *row_loss);
    /* Squared error: row_loss[i] (fp64) = sum_j (a_ij - b_ij)^2; da += scale * 2 (a - b) */
    void (*mse)(m2d_backend *be, const m2d_mat *a, const m2d_mat *b, double scale, m2d_mat *da, m2d_buf *row_loss);
    /* out[0] (fp64) = sum of the squares of n floats at element OFF of X (fixed order) */
    void (*sumsq)(m2d_backend *be, const m2d_buf *x, size_t off, size_t n, m2d_buf *out);
    /* one AdamW step over the n floats at element OFF of P, gradient G and moments M, V (all four
     * buffers laid out alike; see m2d_adamw_args) */
    void (*adamw)(m2d_backend *be, m2d_buf *p, const m2d_buf *g, m2d_buf *m, m2d_buf *v, size_t off, size_t n,
                  const m2d_adamw_args *a);
} m2d_backend_train_ops;

/* Every backend object starts with this. */
struct m2d_backend {
    const m2d_backend_ops *ops;
};

typedef struct {
    int n_threads;          /* host threads (<= 0: m2d_default_threads()) */
    m2d_precision precision; /* of the engine's GEMMs: what make_resident prepares weights for */
    int device;             /* device index of a backend with devices ("cuda:N"); 0 otherwise */
} m2d_backend_opts;

/* ---- the table of backends ---- */
typedef struct {
    const char *name;
    const char *summary;
    int (*create)(const m2d_backend_opts *o, m2d_backend **out);
    int has_devices;        /* accepts "name:N" (device N); "name" alone is device 0 */
} m2d_backend_kind;

void m2d_backend_register(const m2d_backend_kind *k);
/* M2D_BACKEND(ident, "name", "summary", create[, .has_devices = 1]) */
#define M2D_BACKEND(ident, name_, summary_, create_, ...)                                          \
    static const m2d_backend_kind ident##_backend_kind = {                                         \
        .name = name_, .summary = summary_, .create = create_, __VA_ARGS__};                       \
    __attribute__((constructor)) static void ident##_backend_register(void) {                      \
        m2d_backend_register(&ident##_backend_kind);                                               \
    }
/* Create the backend NAME, "name" or "name:N" for a backend with devices (N overrides o->device);
 * an unknown name is an error listing the registered ones. A backend whose device is absent fails
 * with its own one-line error ("cuda: no CUDA device (...)"), never falling back to another. */
int m2d_backend_new(const char *name, const m2d_backend_opts *o, m2d_backend **out);
/* Check a --device value ("cpu", "cuda", "cuda:N") against the backends this build has, without
 * creating one; a one-line error naming WHAT for anything else. */
int m2d_device_check(const char *spec, const char *what);
void m2d_backend_free(m2d_backend *be); /* NULL ok */
/* 1 when SPEC ("name" or "name:N") names a registered backend with devices (memory of its own,
 * not the host's); 0 for NULL, "cpu" or a name this build does not register */
int m2d_backend_spec_has_devices(const char *spec);
/* 1 when BE implements capability C */
static inline int m2d_backend_supports(const m2d_backend *be, m2d_cap c) { return (be->ops->caps & M2D_CAP(c)) != 0; }
/* the first capability of the set CAPS that BE lacks, or -1 when it has them all */
int m2d_backend_missing(const m2d_backend *be, uint64_t caps);
const char *m2d_backend_list(void);     /* "cpu" (for messages and --help) */
int m2d_backend_count(void);            /* registered backends, sorted by name */
const m2d_backend_kind *m2d_backend_kind_at(int i);

/* Threads the host BLAS/LAPACK library uses for calls made outside the engines (criteria plugins,
 * analysis). The CPU backend owns BLAS threading; nothing else calls OpenBLAS's thread functions. */
void m2d_backend_host_blas_threads(int n_threads);

#endif
