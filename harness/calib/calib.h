/* calib — the calibration pass (SPEC §1): windows, the calibration hash, the statistics.
 *
 * Calibration windows
 *   The calibration text is encoded whole (no BOS). Window i covers tokens [i*L, (i+1)*L) of the
 *   encoded file; M = floor(n_tokens / L) windows exist. Without a seed the first N are used.
 *   With a seed S, N of the M windows are drawn without replacement by a partial Fisher-Yates
 *   shuffle driven by splitmix64 (state = S; next(): state += 0x9E3779B97F4A7C15, then the
 *   standard splitmix64 finaliser); step i swaps slot i with slot i + next() % (M - i). The
 *   chosen windows are then sorted by start offset. Same (text, L, N, S) -> same windows.
 *   If fewer than N windows exist, all M are used, with a loud warning on stderr naming both
 *   numbers (the stats file records what was used).
 *
 *   Document windows (opts.doc_starts, e.g. from m2d_calib_encode_documents): each document is
 *   encoded on its own; window i is the first min(L, length) tokens of a document (documents of
 *   fewer than two tokens are skipped); the N documents are the first N or a seeded choice by
 *   the same shuffle over documents. Their lengths vary, so ES-Act (per-sample length-normalised)
 *   differs from SF/k, which it equals on fixed windows (paper 001 App. D).
 *
 * Calibration identity hash (calib_hash)
 *   sha256( "moe2dense-calib-v1\n" || seq_len as int64 LE || n_windows as int64 LE ||
 *           the token ids of every chosen window in order, each int32 LE ||
 *           gate convention string (no terminator) )
 *   Gate convention: "softmax-topk-renorm" (norm_topk_prob), "softmax-topk", or "topk-softmax"
 *   (GPT-OSS: the gates are a softmax over the k selected logits; p_e is the full softmax all the same).
 *   Document windows: sha256( "moe2dense-calib-v2-documents\n" || seq_len || n_windows (int64 LE)
 *   || for each window its length as int64 LE then its token ids (int32 LE) || gate convention ).
 *
 * The stats file every later command reads: calib/stats_file.h. */
#ifndef M2D_CALIB_H
#define M2D_CALIB_H

#include <stdint.h>

#include "engine/engine.h"
#include "model/model.h"
#include "calib/stats.h"
#include "calib/stats_file.h"
#include "tokenizer/tokenizer.h"

#define M2D_CALIB_DEFAULT_SAMPLES 32
#define M2D_CALIB_MAX_SEQ 2048

typedef struct {
    int seq_len;          /* L; 0 -> min(2048, max_position_embeddings) */
    int n_samples;        /* N windows; 0 -> M2D_CALIB_DEFAULT_SAMPLES */
    int seeded;           /* 0: first N windows; 1: seeded random choice */
    uint64_t seed;
    int n_threads;        /* 0 -> m2d_default_threads() */
    int reference;        /* 1: obviously-correct per-token accumulator (tests); 0: BLAS path */
    const char *data_path;/* recorded in the stats file */
    int progress;         /* 1: progress with ETA on a terminal */
    const int64_t *doc_starts; /* document windows: start of each document in ids (increasing); NULL: */
    int n_docs;                /*   fixed windows of seq_len tokens */
    int precision;        /* m2d_precision of the teacher's GEMMs (0: FP32; AUTO resolved by the
                           * backend; the one used is recorded in the stats) */
    const char *device;   /* the engine's backend: "cpu" (NULL), "cuda", "cuda:N" */
    m2d_pass_mode pass;   /* AUTO (0): layer-major when the teacher does not fit MEM_BUDGET, or forced
                           * (engine.h m2d_pass_opts; identical statistics either way) */
    size_t mem_budget;    /* bytes the pass may hold (0: m2d_default_mem_budget()) */
    const char *spill_dir;/* where a layer-major pass spills residual streams beyond the budget (NULL: $TMPDIR) */
} m2d_calib_opts;

/* Gate convention string for a config. */
const char *m2d_calib_gate_convention(const m2d_config *cfg);
/* Default L for a config: min(2048, max_position_embeddings). */
int m2d_calib_default_seq_len(const m2d_config *cfg);

/* Choose windows (see above). starts must hold n_samples entries; *n_out <= n_samples.
 * Error when not even one window of L tokens fits. */
int m2d_calib_windows(int64_t n_tokens, int seq_len, int n_samples, int seeded, uint64_t seed,
                      int64_t *starts, int *n_out);
/* calib_hash of the chosen windows. */
void m2d_calib_hash(const int32_t *ids, const int64_t *starts, int n_windows, int seq_len,
                    const char *gate_convention, char out[65]);
/* The same for windows of lengths LENS (NULL: fixed windows, = m2d_calib_hash). */
void m2d_calib_hash_windows(const int32_t *ids, const int64_t *starts, const int *lens, int n_windows, int seq_len,
                            const char *gate_convention, char out[65]);
/* Document windows (see above): starts[n], lens[n] (capacity n_samples), *n_out <= n_samples. */
int m2d_calib_doc_windows(const int64_t *doc_starts, int n_docs, int64_t n_ids, int seq_len, int n_samples, int seeded,
                          uint64_t seed, int64_t *starts, int *lens, int *n_out);
/* Byte offsets of WikiText articles (a new one at each level-1 title line " = Title = "; the
 * text before the first title is a document too). *starts malloc'd, (*starts)[0] = 0. */
int m2d_calib_split_documents(const char *text, size_t len, size_t **starts, int *n);
/* Encode each document of TEXT on its own; ids concatenated, doc_starts[i] = first id of document
 * i. All malloc'd. */
int m2d_calib_encode_documents(const m2d_tokenizer *tk, const char *text, size_t len, int32_t **ids, size_t *n_ids,
                               int64_t **doc_starts, int *n_docs);
/* The windows a run with options O would use (fixed or document windows), *lens NULL for fixed
 * ones, and their calib_hash (HASH may be NULL). Errors name the data file. */
int m2d_calib_choose(const m2d_model *m, const int32_t *ids, int64_t n_ids, const m2d_calib_opts *o, int64_t **starts,
                     int **lens, int *n_windows, char hash[65]);

/* Full calibration pass of the unmodified teacher over the chosen windows of ids.
 * *out is a finalised m2d_stats (free with m2d_calib_stats_free). */
int m2d_calib_run(const m2d_model *m, const int32_t *ids, int64_t n_ids, const m2d_calib_opts *o,
                  m2d_stats **out);
/* FLOPs of the expert evaluations of a calibration pass (2*3*d*d_e per expert per token). */
double m2d_calib_expert_flops(const m2d_config *cfg, double n_tokens);

#endif
