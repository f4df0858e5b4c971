/* calib/importance — Minitron activation-based importance of a dense teacher's structure over the
 * calibration windows (calib.h's windows and hash), for convert/prune.h:
 *   - FFN neuron i of layer l: aggregated |act_i| of the intermediate activation silu(gate)·up;
 *   - attention head h of layer l: aggregated L2 norm of the head's output before o_proj;
 *   - embedding channel c: aggregated |x_c| of every RMSNorm's input, summed over all layers;
 *   - layer l: block importance 1 - mean cosine(layer input, layer output) (Men et al.,
 *     ShortGPT; Minitron's depth ranking), and the mean NLL when the layer is skipped.
 * The aggregation (mean over tokens of the batch, then over windows, as Minitron's best choice) is
 * written in the .c file's head. Statistics are fp64 sums; the file records the model hash and the
 * calibration hash, so a stale file is refused.
 *
 * Use: m2d_importance_ensure(model, &opts, path) — PATH's statistics when up to date for (model,
 * windows), else computed and written atomically; m2d_importance_read to load them. */
#ifndef M2D_CALIB_IMPORTANCE_H
#define M2D_CALIB_IMPORTANCE_H

#include "calib/calib.h"

typedef struct {
    int n_layers, hidden, ffn, heads, kv_heads;
    double *ffn_neuron;   /* [n_layers][ffn] */
    double *head;         /* [n_layers][heads] (query heads; a kv group's importance is its heads' sum) */
    double *channel;      /* [hidden] */
    double *layer_cos;    /* [n_layers] block importance 1 - cos */
    double *layer_nll;    /* [n_layers] mean NLL with layer l skipped (baseline: nll_full) */
    double nll_full;
    char model_hash[65], calib_hash[65];
    int n_windows, seq_len;
} m2d_importance;

/* IMP's statistics for MODEL on the windows of OPTS (opts.data_path encoded whole): read from PATH
 * when up to date, else computed and written to PATH atomically. *OUT malloc'd (m2d_importance_free). */
int m2d_importance_ensure(const m2d_model *model, const m2d_calib_opts *opts, const char *path,
                          m2d_importance **out);
int m2d_importance_read(const char *path, m2d_importance **out);
void m2d_importance_free(m2d_importance *imp);

#endif
