/* calib/importance — Minitron activation-based importance of a dense teacher's structure over the
 * calibration windows (calib.h's windows and hash), for convert/prune.h (Muralidharan et al., 2024,
 * "Compact Language Models via Pruning and Knowledge Distillation", §2.2; the paper's App. M):
 *   - FFN neuron i of layer l: the intermediate activation a_i = act(gate x)_i·(up x)_i (what
 *     down_proj reads);
 *   - attention head h of layer l (a query head): the L2 norm of the head's attention output
 *     (head_dim values, before o_proj);
 *   - embedding channel c: |LN(X)_c|, the output of every RMSNorm that feeds a projection (the
 *     attention and the FFN norm of every layer: Minitron's F_emb over "the LayerNorm layers"; the
 *     RMSNorm weight is part of LN(X)), the per-norm scores summed over the 2L norms;
 *   - layer l: block importance BI_l = 1 - mean over every token of cos(layer input, layer output)
 *     (Men et al., 2024, ShortGPT; Minitron's depth ranking), and the mean next-token NLL of the
 *     windows with layer l skipped (Minitron's "LM loss" depth metric; nll_full without skipping).
 * Aggregation (Minitron's best, "mean over the sequence, L2 norm over the batch", as NVIDIA's
 * ModelOpt implements it): per window (a batch row) the mean over its tokens of |value|, then the
 * square root of the sum of squares over the windows. A window is the batch row of one forward.
 * Everything is summed in fp64 from the engine's fp32 activations (engine.h's probe hook).
 *
 * GQA: the importance is per query head. convert/prune.c keeps whole kv groups (a group's score: the
 * sum of its query heads') and, in each kept group, the same number of its own most important query
 * heads: a kv head serves exactly the query heads of its group (Hugging Face repeat_kv: query head q
 * reads kv head q / (heads / kv_heads)), so a query head cannot move to another group, and every
 * group of the student must hold heads / kv_heads of them.
 *
 * The importance file (JSON, written atomically, read back strictly): {"format":
 * "moe2dense-importance-v1", "model_hash" (m2d_model.model_hash), "calib_hash" (calib.h, gate
 * convention of the config), "precision", "data_path", "seq_len", "n_windows", "window_starts",
 * "aggregation", the sizes "n_layers", "hidden", "ffn", "heads", "kv_heads", "head_dim", and the
 * scores "ffn_neuron" [n_layers][ffn], "head" [n_layers][heads], "channel" [hidden], "layer_cos"
 * [n_layers], "layer_nll" [n_layers], "nll_full"}. Numbers are written so that they read back
 * bit for bit (cJSON: %.17g where %.15g does not round-trip). A file whose model or calibration hash
 * or precision differs from the run's is stale (recomputed by m2d_importance_ensure); a damaged
 * one is an error naming the file and the field. */
#ifndef M2D_CALIB_IMPORTANCE_H
#define M2D_CALIB_IMPORTANCE_H

#include "calib/calib.h"

#define M2D_IMPORTANCE_FORMAT "moe2dense-importance-v1"

typedef struct {
    int n_layers, hidden, ffn, heads, kv_heads, head_dim;
    double *ffn_neuron;   /* [n_layers][ffn] */
    double *head;         /* [n_layers][heads] (query heads; a kv group's importance is its heads' sum) */
    double *channel;      /* [hidden] */
    double *layer_cos;    /* [n_layers] block importance 1 - mean cos */
    double *layer_nll;    /* [n_layers] mean NLL with layer l skipped (baseline: nll_full) */
    double nll_full;
    char model_hash[65], calib_hash[65], precision[16];
    int n_windows, seq_len;
    int64_t *window_starts; /* [n_windows] token offsets of the windows in the encoded text */
} m2d_importance;

/* The statistics for MODEL on the windows of OPTS (opts.data_path encoded whole with the model's
 * tokenizer; fixed windows; opts.precision, n_threads, device as in calibration): read from PATH
 * when up to date (*cached = 1; CACHED may be NULL), else computed and written to PATH atomically.
 * A dense teacher only (GQA attention, every layer a dense FFN): anything else is refused in one
 * line. *OUT malloc'd (m2d_importance_free). PATH's lock is held meanwhile (concurrent shards
 * compute it once); CMD ("prune", "sweep") prefixes what is said on stderr. */
int m2d_importance_ensure(const m2d_model *model, const m2d_calib_opts *opts, const char *path, const char *cmd,
                          m2d_importance **out, int *cached);
/* The importance of MODEL over the N_WINDOWS windows of SEQ_LEN tokens of IDS starting at STARTS
 * (no file). OPTS gives precision, threads and device. */
int m2d_importance_compute(const m2d_model *model, const int32_t *ids, const int64_t *starts, int n_windows,
                           int seq_len, const m2d_calib_opts *opts, m2d_importance **out);
int m2d_importance_write(const m2d_importance *imp, const char *data_path, const char *path);
/* Read PATH strictly: every field present, of its type and size; errors "PATH: field F: ...". */
int m2d_importance_read(const char *path, m2d_importance **out);
/* The same from TEXT [n] in memory, PATH naming it in errors (the fuzz target's entry). */
int m2d_importance_parse(const char *path, const char *text, size_t n, m2d_importance **out);
/* IMP (read from PATH) belongs to MODEL: its weights hash and sizes. Error naming PATH and field. */
int m2d_importance_check_model(const m2d_importance *imp, const char *path, const m2d_model *model);
/* A dense teacher the importance (and pruning) handles: GQA attention, every layer a dense SwiGLU
 * FFN, no attention biases, sliding windows or whole-projection q/k norms. One-line error naming DIR
 * and the architecture otherwise. */
int m2d_importance_supported(const m2d_config *cfg, const char *dir);
void m2d_importance_free(m2d_importance *imp);

#endif
