/* lm — the log-likelihood scorer interface the multiple-choice evaluation is written against,
 * plus its engine-backed implementation (tokenizer + forward engine with a KV cache).
 *
 * A scorer answers lm-eval's `loglikelihood` requests: for each (context, continuation) pair,
 * the sum of natural-log probabilities of the continuation tokens given the context, and whether
 * every continuation token is the argmax (is_greedy). Tests plug in a hand-made scorer whose
 * log-probs are known; the sweep plugs in students. */
#ifndef M2D_LM_H
#define M2D_LM_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"

typedef struct {
    const char *context;       /* exact strings as lm-eval builds them (NUL-terminated UTF-8) */
    const char *continuation;
} m2d_ll_request;

typedef struct {
    double ll;                 /* sum of log p(continuation tokens | context), natural log */
    int is_greedy;             /* 1 when every continuation token is the argmax; -1 when the
                                * scorer does not compute it (engine: only M2D_LM_NAIVE does) */
} m2d_ll_result;

typedef struct m2d_lm m2d_lm;
struct m2d_lm {
    const char *name;
    /* Score n requests. The evaluation passes all requests of one document per call (the
     * choices of one question), so an implementation can share their common prefix. */
    int (*loglikelihood)(m2d_lm *lm, const m2d_ll_request *reqs, int n, m2d_ll_result *out);
    void (*free)(m2d_lm *lm);
    void *impl;
};

int m2d_lm_loglikelihood(m2d_lm *lm, const m2d_ll_request *reqs, int n, m2d_ll_result *out);
void m2d_lm_free(m2d_lm *lm);

/* ---- lm-eval's request → token rules, independent of any model (tested with a toy tokenizer) ---- */

/* Python str.isspace for a code point, and len(s.rstrip()) in bytes (UTF-8). */
int m2d_py_isspace(int32_t cp);
size_t m2d_py_rstrip_len(const char *s, size_t len);

/* encode(text, len) -> malloc'd ids; 0 or -1 */
typedef int (*m2d_encode_fn)(void *user, const char *text, size_t len, int32_t **ids, size_t *n);

typedef struct {
    int32_t *tokens;   /* the model input window + the last token: scored positions are at the end */
    int n;             /* total tokens in `tokens` (input is tokens[0..n-2]) */
    int n_cont;        /* the last n_cont tokens of `tokens` are the continuation (scored) */
} m2d_ll_tokens;

/* lm-eval's HFLM._encode_pair + the truncation of _loglikelihood_tokens:
 *  - trailing whitespace of the context moves to the front of the continuation;
 *  - whole = encode(context + continuation), ctx = encode(context), cont = whole[len(ctx):];
 *  - empty context -> ctx = [prefix_token] and cont = encode(continuation);
 *  - the sequence ctx + cont keeps its last max_length + 1 tokens (left truncation).
 * n_cont may be 0 (the continuation merged into the context's last token); the caller scores 0. */
int m2d_ll_tokenize(m2d_encode_fn enc, void *user, int prefix_token, int max_length,
                    const m2d_ll_request *req, m2d_ll_tokens *out);
void m2d_ll_tokens_free(m2d_ll_tokens *t);

/* ---- a scorer that only records the requests it is asked (every ll is -1): the exact requests
 * an evaluation sends, for tests and benchmarks that replay them through real scorers ---- */
typedef struct {
    m2d_ll_request *reqs;   /* owned copies, in the order asked */
    int *group;             /* call index of each request (one call = the choices of one document) */
    int n, cap, calls;
} m2d_ll_recording;
/* A scorer appending to REC (zero-initialised by the caller); it owns nothing, m2d_lm_free is a no-op. */
m2d_lm m2d_lm_recorder(m2d_ll_recording *rec);
void m2d_ll_recording_free(m2d_ll_recording *rec);
/* A scorer answering the requests of REC, in their order, with RES (scored elsewhere, e.g. by
 * m2d_lm_engine_score_all): a request other than the recorded one at its place is an error. */
typedef struct {
    const m2d_ll_recording *rec;
    const m2d_ll_result *res;
    int next;
} m2d_ll_replay;
m2d_lm m2d_lm_replayer(m2d_ll_replay *rp);

/* ---- engine-backed scorer ---- */

typedef enum {
    M2D_LM_CACHED = 0,  /* shared prefix once in a KV cache (kept across calls), branches batched */
    M2D_LM_NAIVE = 1,   /* one full forward per request with full logits (lm-eval's way; reference
                         * path for tests and the bench; the only mode that computes is_greedy) */
    M2D_LM_NAIVE_LP = 2,/* one forward per request, log-probs streamed at the continuation only */
} m2d_lm_mode;

/* Open the model in DIR (config, weights, tokenizer.json) as a scorer whose engine EO opens
 * (engine.h: backend/device, threads, the GEMMs' precision, AUTO resolved by the backend).
 * max_length <= 0: the model's max_position_embeddings. */
int m2d_lm_engine_open(const char *dir, const m2d_engine_opts *eo, m2d_lm_mode mode, int max_length, m2d_lm **out);
/* The same scorer over an engine and tokenizer the caller keeps (e.g. a student built in memory
 * by the sweep); m2d_lm_free releases only the scorer (its KV cache), not ENG or TOK. */
typedef struct m2d_engine m2d_engine;
typedef struct m2d_tokenizer m2d_tokenizer;
int m2d_lm_engine_wrap(m2d_engine *eng, const m2d_tokenizer *tok, m2d_lm_mode mode, int max_length, m2d_lm **out);
/* Counters of the engine scorer (tokens actually run through the model, cache reuse). */
typedef struct { int64_t requests, tokens_forwarded, tokens_reused; } m2d_lm_stats;
/* The scorer's engine (NULL for a scorer without one). */
m2d_engine *m2d_lm_engine_of(const m2d_lm *lm);
int m2d_lm_engine_stats(const m2d_lm *lm, m2d_lm_stats *out);
void m2d_lm_engine_set_mode(m2d_lm *lm, m2d_lm_mode mode);
/* Every one of the N requests scored in one pass of the engine scorer LM's engine over all of them
 * (engine.h m2d_engine_logprobs_windows: layer-major when the engine's pass is, so a model larger
 * than memory is read once, not once a question): each request its own window from position 0, no
 * prefix shared (the same log-probs as the cached mode's within its tolerance); is_greedy -1. */
int m2d_lm_engine_score_all(m2d_lm *lm, const m2d_ll_request *reqs, int n, m2d_ll_result *out);

#endif
