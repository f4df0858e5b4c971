/* engine — the batched forward pass (logits, streaming log-probs, KV-cache extend and branches,
 * one expert's function, a routing hook for calibration) of any architecture an adapter describes
 * (model.h: tensor roles + cfg.ops), computed by a backend object (backend.h) held per engine.
 *
 * Contract: the engine reads only tensor roles and cfg.ops, never an architecture name; it
 * refuses at creation (one-line error) a model whose ops or tensors it does not implement. All
 * compute goes through the engine's backend; host memory is touched only for the caller's inputs
 * and outputs and, when a hook is set, the hook's copy of the routing (or the probe's copies of the
 * activations it asked for). An engine is used by one
 * thread at a time (the sweep gives each worker its own). */
#ifndef M2D_ENGINE_H
#define M2D_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/backend.h"
#include "model/model.h"

typedef struct m2d_engine m2d_engine;

typedef enum { M2D_PASS_AUTO, M2D_PASS_WINDOW, M2D_PASS_LAYER } m2d_pass_mode;
/* Where a layer-major pass keeps residual streams that exceed its budget: AUTO: whichever moves fewer
 * bytes, GROUPS of windows that each fit (the weights read once per group: (groups - 1) x weights
 * more) or a SPILL file (each layer writes and reads back the excess: 2 x layers x excess). */
typedef enum { M2D_ACT_AUTO, M2D_ACT_GROUPS, M2D_ACT_SPILL } m2d_act_mode;

typedef struct {
    const char *backend;     /* registered backend name (NULL: "cpu"); see m2d_backend_list() */
    int n_threads;           /* host threads of the backend (<= 0: m2d_default_threads()) */
    m2d_precision precision; /* of every GEMM (0: FP32, exact); AUTO: the backend's fastest (CPU: bf16
                              * where the CPU has native bf16, else fp32); else one the backend supports */
    /* passes over many windows (m2d_engine_logprobs_windows): see m2d_engine_plan_pass */
    m2d_pass_mode pass;      /* AUTO (0): layer-major when the weights do not fit MEM_BUDGET */
    size_t mem_budget;       /* bytes a pass may hold (0: m2d_default_mem_budget(), 80 % of RAM) */
    const char *spill_dir;   /* layer-major residual streams beyond the budget go to a file there
                              * (NULL: $TMPDIR, else /tmp) */
    m2d_act_mode act;        /* how they exceed it (AUTO: the cheaper) */
    m2d_precision attention; /* of attention's operands, whatever PRECISION: FP32 (0: the default,
                              * exact) or BF16 (q, k, v and the softmax's numerators rounded to bf16,
                              * as transformers' bf16 SDPA does; backend.h m2d_attn_args.prec), where
                              * the backend has the capability attention-bf16 (else refused) */
} m2d_engine_opts;

/* An engine on a new backend object it owns. The model must outlive the engine. */
int m2d_engine_open(const m2d_model *m, const m2d_engine_opts *o, m2d_engine **out);
/* Same with the "cpu" backend, N_THREADS threads, fp32. */
int m2d_engine_new(const m2d_model *m, int n_threads, m2d_engine **out);
void m2d_engine_free(m2d_engine *e);
/* The engine's backend (for tests and tools: tuning, buffers) and its knobs (backend.h tune). */
m2d_backend *m2d_engine_backend(m2d_engine *e);
int m2d_engine_tune(m2d_engine *e, const char *knob, int value);
/* Make weights resident in the backend's prepared form (CPU: the GEMM kernel's layout for the
 * engine's precision: oneDNN's blocked bf16 or fp32; norms an fp32 copy) up to BUDGET bytes
 * (each layer's norms, attention, router and dense FFN first, then experts, LM head last).
 * Weights not kept are prepared on use into a reusable buffer (bounded memory). m2d_engine_open
 * applies $M2D_WEIGHT_CACHE_MB when set (0: prepare everything on use), else keeps the whole model
 * only if it fits the backend's default budget (CPU: 1/8 of physical RAM; checkpoints of real
 * size stay as stored). The embedding is never kept (only looked-up rows are converted) unless it
 * is the tied LM head. Same results either way. Returns the bytes held. */
size_t m2d_engine_cache_weights(m2d_engine *e, size_t budget_bytes);
/* MoE experts spread over the engine's threads, each GEMM single-threaded (1, the default), or
 * one expert after another with multi-threaded GEMMs (0). Same result either way (tested). */
void m2d_engine_set_expert_parallel(m2d_engine *e, int on);
const m2d_model *m2d_engine_model(const m2d_engine *e);
/* the precision the engine's GEMMs run in (AUTO resolved): what outputs record */
m2d_precision m2d_engine_precision(const m2d_engine *e);
/* the precision of attention's operands (m2d_engine_opts.attention): what outputs record */
m2d_precision m2d_engine_attention_precision(const m2d_engine *e);
/* What P would resolve to on BACKEND (NULL: "cpu") without opening an engine (for identities
 * decided before a run: cache names, headers); -1 with m2d_err when the backend lacks it. */
int m2d_engine_resolve_precision(const char *backend, m2d_precision p, m2d_precision *out);
/* Whether an engine on BACKEND (NULL: "cpu") takes attention precision P (m2d_engine_opts.attention),
 * without opening one (a sweep checks before any work); -1 with m2d_err naming why not. */
int m2d_engine_check_attention(const char *backend, m2d_precision p);
/* The backend capabilities (backend.h, M2D_CAP) a forward of M needs; m2d_engine_open refuses a
 * backend that lacks one, naming it. */
uint64_t m2d_engine_required_caps(const m2d_model *m);

/* Calibration hook: called at every MoE layer during a forward, after routing and before
 * the experts run (the residual stream always follows the teacher's real routing). The event's
 * arrays are host copies made for the hook, valid during the call; without a hook nothing is
 * copied.
 * A hook that has run every expert on every token anyway (calibration) may hand the layer's
 * routed output back instead of letting the engine run the top-k experts again: it writes
 * routed[t] = Σ_r gates[t, r] · f_{topk[t, r]}(x_t), with f from m2d_engine_all_experts and the
 * terms added in increasing expert id (the order of the engine's own MoE op), for every token,
 * and sets *routed_set = 1. The engine offers this (routed non-NULL) only where the backend
 * computes an expert's output for a token independently of the other tokens in its batch
 * (backend.h experts_rows_exact; CPU: oneDNN's kernels), so the forward continues from exactly
 * the values it would have computed itself. With a hook set, the experts (here and in
 * m2d_engine_all_experts) are computed with the backend's exact rows (m2d_moe_args.exact_rows;
 * CPU: where oneDNN's rows depend on the batch, as with AMX, calls are padded and k is split so
 * that they do not, gemm.h): on such a CPU a hooked forward may differ from a hookless one in the
 * last bits, and the substitution is offered there too. */
typedef struct {
    int layer, n_tokens, hidden, n_experts, top_k;
    const float *x;       /* [n, d] FFN input (after the post-attention RMSNorm) */
    const float *probs;   /* [n, E] fp32 softmax over all router logits */
    const int32_t *topk;  /* [n, k] routed experts, descending probability, ties -> lower index */
    const float *gates;   /* [n, k] native gate weights (renormalised when cfg.ops.router_renorm) */
    float *routed;        /* [n, d] the hook's routed output (see above), or NULL: not offered */
    int *routed_set;      /* set to 1 by a hook that filled every row of routed (NULL with it) */
} m2d_moe_event;
/* Non-zero aborts the forward; the engine's error then ends with the hook's m2d_err message. */
typedef int (*m2d_moe_hook)(void *user, const m2d_moe_event *ev);
void m2d_engine_set_moe_hook(m2d_engine *e, m2d_moe_hook hook, void *user);

/* Probe hook (analyses of dense models: Minitron importance, calib/importance.c): called during every
 * forward at the points of each decoder layer that POINTS selects (bits 1u << m2d_probe_point) with a
 * host copy of that activation, valid during the call, rows in the order of the forward's tokens.
 * Without a hook nothing is copied and nothing is computed beyond one pointer test per point. */
typedef enum {
    M2D_PROBE_LAYER_IN,   /* [n, d] the residual stream entering the layer */
    M2D_PROBE_ATTN_NORM,  /* [n, d] the attention RMSNorm's output (what q/k/v read) */
    M2D_PROBE_HEADS,      /* [n, heads*head_dim] attention output of each query head, before o_proj */
    M2D_PROBE_FFN_NORM,   /* [n, d] the FFN RMSNorm's output */
    M2D_PROBE_FFN_ACT,    /* [n, intermediate] act(gate x)·(up x) before down_proj (dense FFN layers) */
    M2D_PROBE_LAYER_OUT,  /* [n, d] the residual stream after the layer */
    M2D_PROBE_COUNT
} m2d_probe_point;
typedef struct {
    int layer;
    m2d_probe_point point;
    int n_tokens, cols;
    const float *x;       /* [n_tokens, cols] */
} m2d_probe_event;
/* Non-zero aborts the forward (the engine's error names the layer and ends with the hook's message). */
typedef int (*m2d_probe_hook)(void *user, const m2d_probe_event *ev);
void m2d_engine_set_probe(m2d_engine *e, m2d_probe_hook hook, void *user, unsigned points);
/* Every later forward skips decoder layer LAYER (its residual stream passes unchanged; no probe
 * fires there; nothing is appended to a KV cache for it); -1 restores every layer. -1 + m2d_err
 * when LAYER is outside [-1, num_hidden_layers). */
int m2d_engine_set_skip_layer(m2d_engine *e, int layer);

/* f_e(x) of expert E_IDX of LAYER on n token vectors x [n, d] -> out [n, d] (no gate weight). */
int m2d_engine_expert(m2d_engine *e, int layer, int expert, const float *x, int n, float *out);
/* Calibration (SPEC §1): f_e(x_t) of EVERY expert of LAYER on n token vectors x [n, d] ->
 * f [n, E * d] (token t's output of expert e at f + (t * E + e) * d), as grouped GEMMs on the
 * backend; when GRAM is not NULL, its upper triangle (fp64 [E, E], row-major) += the sum over
 * tokens of F_t F_t^T (F_t: token t's [E, d] block), accumulated as the backend's gram op says
 * (fp64 in fp32 precision). Host arrays are used in place where the backend can (CPU). */
int m2d_engine_all_experts(m2d_engine *e, int layer, const float *x, int n, float *f, double *gram);
/* The same pass with calibration's reductions made where the outputs lie (backend.h
 * experts_reduce), so that they never cross to the host whole (1 MiB a token on Qwen3-30B-A3B):
 * sum_f [E, d] += Σ_t f_e(x_t) (fp64, tokens in order: the same bits on every backend); norm2
 * [E, n] = ‖f_e(x_t)‖² (fp64); sel [n, k1, d] = the outputs of the k1 experts ids [n, k1] names
 * for each token (-1: zeros); GRAM as above. WORK: host memory of [n, E * d] floats that a backend
 * computing on the host uses for the outputs in place (the CPU), or NULL. */
int m2d_engine_all_experts_reduced(m2d_engine *e, int layer, const float *x, int n, const int32_t *ids, int k1,
                                   float *sel, double *sum_f, double *norm2, double *gram, float *work);

/* Host buffers that cross to and from the backend often (calibration's per-block arrays) made
 * faster to copy where the backend can (cuda: page-locked); a no-op elsewhere or on failure.
 * Unpin before freeing P while the engine lives; m2d_engine_free unpins what is left. */
void m2d_engine_pin(m2d_engine *e, void *p, size_t bytes);
void m2d_engine_unpin(m2d_engine *e, void *p);

/* Full window from position 0: logits [n, vocab] (fp32). */
int m2d_engine_logits(m2d_engine *e, const int32_t *tokens, int n, float *logits);
/* Full window from position 0: the final-normed hidden states hidden [n, d] (what the LM head
 * reads; the distillation teacher's logits are formed from them in row blocks) and, when LAYERS
 * is not NULL, the residual stream after every decoder layer, layers [num_hidden_layers][n][d]
 * (the hidden-state MSE of --loss fkl+mse). */
int m2d_engine_hidden(m2d_engine *e, const int32_t *tokens, int n, float *hidden, float *layers);
/* Routing override for distillation (paper Eq. 6, SPEC §7): every MoE layer routes each token to
 * its K highest-probability experts, weighted by their raw softmax probabilities (not
 * renormalised, whatever the model's norm_topk_prob). The probabilities are the softmax over all
 * E router logits for every router kind: GPT-OSS's router, whose own gates are a softmax over its
 * top-k logits only (renormalised by construction), takes the top K of that full softmax under the
 * override (the K largest logits, up to fp32 ties of p: lower index first). 0 restores the
 * model's own routing.
 * -1 + m2d_err when K is outside [1, num_experts]. */
int m2d_engine_set_route_topk(m2d_engine *e, int k);
/* Streaming: lp[t - first] = log p(targets[t] | tokens[0..t]) for t in [first, n), computed
 * in row blocks so [n x vocab] is never materialised. The last layer computes keys, values and the
 * attention of every row but goes on (o_proj, FFN/experts, final norm) only for rows [first, n)
 * (unless a MoE hook or probe watches the layers: they see every row). Where the backend's GEMMs
 * give a row the same bits whatever the batch this equals the full forward bit for bit. */
int m2d_engine_logprobs(m2d_engine *e, const int32_t *tokens, int n, const int32_t *targets,
                        int first, double *lp);

/* ---- passes over many windows: calibration and perplexity (issue 25) ----
 * Window w is TOKENS[w][0 .. LENS[w]) from position 0, with log-probs as m2d_engine_logprobs:
 * LP[w][t - FIRST[w]] = log p(TARGETS[w][t] | tokens[0..t]) for t in [FIRST[w], LENS[w]). */
typedef struct {
    int n;
    const int32_t *const *tokens;
    const int *lens;
    const int32_t *const *targets;
    const int *first;
    double *const *lp;
} m2d_window_set;
typedef struct {
    /* 0: window-major, each window through every layer (m2d_engine_logprobs per window);
     * 1: layer-major, every window through layer 0, then layer 1, ...: each layer's weights are
     * read once per pass (read ahead before the layer, dropped from the process after it), so a
     * checkpoint larger than memory is read once instead of once per window. Same results, bit
     * for bit, in every precision, and the same hook and probe calls (a layer's windows in order). */
    int layer_major;
    size_t act_budget;      /* layer-major: bytes of residual streams (fp32) kept in memory; beyond,
                             * groups of windows or a spill file (engine/actstore.h), see act */
    const char *spill_dir;  /* where the spill file is made (NULL: $TMPDIR, else /tmp) */
    m2d_act_mode act;       /* residual streams over act_budget: groups of windows or a spill file */
} m2d_pass_opts;
/* A window set's own arrays for N windows, zeroed, for the caller to fill; SET spans them. lp[w] is
 * the caller's malloc'd buffer, freed with the arrays (tokens and targets are not). */
typedef struct {
    const int32_t **tokens, **targets;
    int *lens, *first;
    double **lp;
    m2d_window_set set;
} m2d_window_arrays;
void m2d_window_arrays_init(m2d_window_arrays *a, int n);
void m2d_window_arrays_free(m2d_window_arrays *a);
/* The windows through the engine as its pass says (m2d_engine_opts; m2d_engine_pass), with a
 * progress line labelled PROGRESS (base/util.h m2d_progress; NULL: silent). */
int m2d_engine_logprobs_windows(m2d_engine *e, const m2d_window_set *windows, const char *progress);
const m2d_pass_opts *m2d_engine_pass(const m2d_engine *e);
/* How many groups of windows a layer-major pass over WINDOWS runs in (1: one pass, the residual
 * streams in memory or, beyond the budget, spilled); the choice m2d_act_mode describes. */
int m2d_engine_layer_major_groups(const m2d_engine *e, const m2d_window_set *windows);

/* How a pass on M runs within MEM_BUDGET bytes (weights and residual streams). M2D_PASS_AUTO:
 * window-major while the weights fit the budget, else layer-major; the others force one. Layer-major keeps the residual streams in
 * memory up to what the largest layer and the LM head leave of the budget. */
m2d_pass_opts m2d_engine_plan_pass(const m2d_model *m, size_t mem_budget, m2d_pass_mode mode);
/* "auto", "window" or "layer" -> *MODE; -1 + m2d_err naming WHAT otherwise */
int m2d_pass_mode_parse(const char *what, const char *s, m2d_pass_mode *mode);
/* Bytes of M's weights as stored (every layer, the embedding, the final norm and an untied LM head). */
size_t m2d_engine_weight_bytes(const m2d_model *m);

/* KV cache for prefix reuse (multiple-choice: a shared context, several continuations). */
typedef struct m2d_kv m2d_kv;
m2d_kv *m2d_kv_new(m2d_engine *e, int capacity);
int m2d_kv_len(const m2d_kv *kv);
void m2d_kv_truncate(m2d_kv *kv, int len);
void m2d_kv_free(m2d_kv *kv);
/* Append n tokens at positions kv_len..; if lp != NULL, lp[i] = log p(targets[i] | all before). */
int m2d_engine_extend(m2d_engine *e, m2d_kv *kv, const int32_t *tokens, int n,
                      const int32_t *targets, double *lp);
/* Several branches that each attend to the cached prefix and to themselves only, run as one
 * batch (GEMMs, not GEMVs). The cache is left as it was. lp[b][i] as in extend. */
int m2d_engine_branches(m2d_engine *e, const m2d_kv *prefix, int n_branches,
                        const int32_t *const *tokens, const int *lens,
                        const int32_t *const *targets, double *const *lp);

#endif
