/* testmodel — writes a small random Qwen3 / Qwen3-MoE checkpoint directory (config.json +
 * model.safetensors, or shards + index) for tests of the engine, calibration and conversion.
 * Weights are deterministic in the seed: N(0, init_std) for matrices, 1 + N(0, 0.1) for norms; or,
 * with `grid`, the generator that tools/hf_goldens.py reproduces in Python, so that the checkpoint
 * transformers writes and this one are the same file:
 *   tensor NAME: state = seed XOR FNV-1a-64(NAME); element i (row-major) takes x = splitmix64(state),
 *   norm weights (NAME ends in "norm.weight"): 1 + ((x >> 59) - 16) / 128,
 *   every other tensor:                        ((x >> 56) - 128) / 512,
 * values that bf16, f16 and f32 all hold exactly. */
#ifndef M2D_TESTMODEL_H
#define M2D_TESTMODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/tensor.h"

typedef struct {
    bool moe;                   /* Qwen3MoeForCausalLM (true) or Qwen3ForCausalLM */
    int vocab_size, hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim;
    int intermediate_size;      /* dense FFN width (dense model / dense layers of a MoE) */
    int moe_intermediate_size, num_experts, num_experts_per_tok;
    bool norm_topk_prob;
    int decoder_sparse_step;
    const int *mlp_only_layers; int n_mlp_only_layers;
    bool tie_word_embeddings;
    double rope_theta, rms_norm_eps;
    int max_position_embeddings;
    int bos_token_id, eos_token_id; /* -1 writes null */
    m2d_dtype dtype;            /* F32, BF16 or F16 */
    float init_std;
    uint64_t seed;
    size_t shard_bytes;         /* 0: single model.safetensors; else shards of at most this size */
    bool grid;                  /* the generator above instead of normal draws */
    const char *config_json;    /* written as config.json verbatim; NULL: made from these options */
    const char *arch, *model_type; /* NULL: Qwen3's; else written to config.json as given */
    bool qk_norm_whole;         /* q/k norm weights over the whole projection (OLMoE-style) */
} m2d_testmodel_opts;

/* One tensor of a checkpoint given as a list (any architecture). */
typedef struct {
    const char *name;
    m2d_dtype dtype;
    int ndim;
    int64_t shape[2];
} m2d_testmodel_tensor;

/* Defaults: 2-layer Qwen3-MoE, hidden 32, 4 q / 2 kv heads x head_dim 8, 8 experts top-2 of
 * width 16, dense intermediate 64, vocab 64, norm_topk_prob true, BF16, seed 1, unsharded. */
void m2d_testmodel_defaults(m2d_testmodel_opts *o);
/* The first N values of the grid generator above for tensor NAME (its kind from the name). */
void m2d_testmodel_grid(const char *name, uint64_t seed, int64_t n, float *out);
/* Create DIR if needed and write the checkpoint. -1 + m2d_err on failure. */
int m2d_testmodel_write(const char *dir, const m2d_testmodel_opts *o);
/* The checkpoint whose config.json is CONFIG_JSON (written verbatim; sizes read from it by the
 * one config reader) with the grid generator's weights for SEED: what tools/hf_goldens.py makes
 * with transformers from the same config. */
int m2d_testmodel_write_grid(const char *dir, const char *config_json, uint64_t seed);
/* DIR/config.json = CONFIG_JSON verbatim and DIR/model.safetensors holding the N tensors, each
 * from the grid generator above (seeded by SEED and its name): any architecture's checkpoint from
 * the tensor list of a golden (tools/hf_goldens.py records the one save_pretrained wrote). */
int m2d_testmodel_write_tensors(const char *dir, const char *config_json, uint64_t seed, const m2d_testmodel_tensor *t,
                                int n);

#endif
