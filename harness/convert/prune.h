/* convert/prune — dense-to-dense structured pruning of a dense teacher (Minitron: Muralidharan et
 * al., 2024; Sreenivas et al., 2024; the paper's Appendix M and Table 13): the baseline the paper's
 * MoE-to-dense students are compared with at matched total parameters.
 *
 * A target shape keeps `layers` decoder layers (the most important ones, or an explicit list),
 * `hidden` embedding channels, `ffn` FFN neurons per layer and `kv_heads` key/value groups with
 * `heads` query heads in all (heads / kv_heads per group; head_dim is kept). What is kept is chosen
 * by the importance statistics (calib/importance.h); every remaining tensor is cut consistently
 * (embedding and LM head columns, every RMSNorm weight, q/k/v/o row and column blocks per head, the
 * q/k norms, FFN rows and columns). The result is a Hugging Face checkpoint of the teacher's own
 * architecture with moe2dense.json recording the method, the importance file's hash and the kept
 * indices.
 *
 * Shape specs (the CLI's --shape and the experiment's candidates): "L4-H192-F576-A6/2" = 4 layers,
 * hidden 192, FFN 576, 6 query heads in 2 kv groups. Any part may be left out ("H256-F512"): it is
 * the teacher's; "A6" keeps the teacher's kv groups. Layers are kept by block importance (the
 * highest 1 - cos; ties to the lower layer), or by the skip NLL with "L4n" (the layers whose
 * removal raises the NLL most).
 *
 * Kept indices are sorted ascending (the teacher's order); each is the top-k of its importance,
 * ties to the lower index: channels (one set for every tensor), per kept layer its FFN neurons, its
 * kv groups (a group's score: the sum of its query heads') and in each kept group its own top
 * heads / kv_heads query heads (calib/importance.h says why whole groups). head_dim, q/k norms,
 * vocabulary, RoPE and every other config field stay the teacher's. */
#ifndef M2D_CONVERT_PRUNE_H
#define M2D_CONVERT_PRUNE_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

typedef struct {
    int layers;     /* decoder layers kept; 0: the teacher's */
    int hidden;     /* embedding channels; 0: the teacher's */
    int ffn;        /* FFN neurons per layer; 0: the teacher's */
    int heads;      /* query heads in all; 0: the teacher's */
    int kv_heads;   /* key/value groups; 0: the teacher's */
    int layers_by_nll; /* 1: layers ranked by the skip NLL ("L4n"), 0: by block importance */
} m2d_prune_shape;

/* Parse SPEC ("L4-H192-F576-A6/2", parts in any order, each at most once) into *OUT; errors name
 * the part. Checked against a teacher only by m2d_prune_shape_check. */
int m2d_prune_shape_parse(const char *spec, m2d_prune_shape *out);
/* The canonical spec of S resolved against teacher T (every part written): "L4-H192-F576-A6/2"
 * ("L4n-..." when layers are ranked by NLL). */
void m2d_prune_shape_format(const m2d_config *t, const m2d_prune_shape *s, char *buf, size_t n);
/* S fits T: each part >= 1 and <= the teacher's, heads a multiple of kv_heads, heads/kv_heads <=
 * the teacher's group size, a dense teacher of a supported family. One-line error naming the part. */
int m2d_prune_shape_check(const m2d_config *t, const m2d_prune_shape *s);
/* Parameters (elements) of the student of shape S pruned from T, counted as the teacher's own
 * parameter count is (embeddings, LM head unless tied, norms, projections). */
int64_t m2d_prune_params(const m2d_config *t, const m2d_prune_shape *s);

/* Build the pruned student of shape S from TEACHER and the importance file IMPORTANCE_PATH
 * (calib/importance.h; read strictly and checked against TEACHER) and write it to OUT_DIR as a
 * Hugging Face checkpoint of the teacher's architecture (the convert output directory rule:
 * config.json, model.safetensors in the teacher's dtype (every value copied, none computed), the
 * tokenizer files; the checkpoint is reopened by the model loader before moe2dense.json is written
 * last: {"method": "minitron", "shape", "params", "teacher": {dir, architecture, weights_hash},
 * "importance": {path, sha256 of the file, calib_hash, precision, n_windows, seq_len}, "layer_rank",
 * "kept": {"layers", "channels", per kept layer "ffn", "kv_heads", "heads"}, "moe2dense_version"}). */
int m2d_prune_write(const m2d_model *teacher, const char *importance_path, const m2d_prune_shape *s,
                    const char *out_dir);

#endif
