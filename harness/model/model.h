/* model — config.json, architecture adapters, and the loaded model's weight views.
 *
 * An architecture adapter (one file: harness/arch_<name>.c) registers itself with
 * M2D_ARCH(...) and knows (1) how to read its config.json into m2d_config and
 * (2) how to bind checkpoint tensors to m2d_layer slots (with expected shapes). */
#ifndef M2D_MODEL_H
#define M2D_MODEL_H

#include <stdbool.h>

#include "io/st.h"

typedef struct {
    char arch[64];          /* "Qwen3MoeForCausalLM" */
    char model_type[32];    /* "qwen3_moe" */
    int vocab_size, hidden_size, intermediate_size, moe_intermediate_size;
    int num_experts, num_experts_per_tok; /* 0 experts: dense model */
    bool norm_topk_prob;
    int decoder_sparse_step;
    int *mlp_only_layers; int n_mlp_only_layers;
    int num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim;
    double rope_theta, rms_norm_eps;
    bool tie_word_embeddings;
    int max_position_embeddings;
    int bos_token_id, eos_token_id; /* -1 when null/absent */
    m2d_dtype torch_dtype;
    bool *layer_is_moe;     /* derived: [num_hidden_layers] */
} m2d_config;

typedef struct {
    const m2d_tensor *attn_norm, *q_proj, *k_proj, *v_proj, *o_proj, *q_norm, *k_norm, *ffn_norm;
    /* dense FFN (layer_is_moe false): [inter, d], [inter, d], [d, inter] */
    const m2d_tensor *gate_proj, *up_proj, *down_proj;
    /* MoE FFN: router [E, d]; per-expert gate/up [d_e, d], down [d, d_e] (arrays of E) */
    const m2d_tensor *router;
    const m2d_tensor **exp_gate, **exp_up, **exp_down;
} m2d_layer;

typedef struct m2d_arch m2d_arch;

/* Parameter counts (elements): total, active per token (top-k experts, embeddings and routers
 * included), and the dense student with K selected experts merged into k groups (width k*d_e
 * per MoE layer, no router) -- the same for every K. */
typedef struct { int64_t total, active, dense_student; } m2d_param_counts;

typedef struct {
    char *dir;
    m2d_config cfg;
    const m2d_arch *arch;
    m2d_st *st;
    const m2d_tensor *embed, *final_norm, *lm_head; /* lm_head == embed when tied */
    const m2d_tensor *lm_head_stored; /* tied checkpoints that also store an identical lm_head.weight */
    m2d_layer *layers;      /* [num_hidden_layers] */
    char weights_hash[65];  /* sha256 over tensor names, shapes, dtypes and bytes (identity for caches) */
} m2d_model;

struct m2d_arch {
    const char *name;       /* architectures[0] in config.json */
    const char *summary;
    /* fill cfg from parsed config.json (a cJSON*); errors name PATH and the field */
    int (*parse_config)(const void *json, const char *path, m2d_config *cfg);
    /* bind m->layers etc. from m->st; check every expected tensor's presence and shape */
    int (*bind)(m2d_model *m);
    /* optional: parameter counts (NULL: the Qwen3-family layout, m2d_param_counts_qwen3) */
    m2d_param_counts (*param_counts)(const m2d_config *cfg);
};

void m2d_arch_register(const m2d_arch *a);
const m2d_arch *m2d_arch_find(const char *name);
/* "Qwen3ForCausalLM, Qwen3MoeForCausalLM" for error messages */
const char *m2d_arch_list(void);

#define M2D_ARCH(ident, ...)                                                     \
    static const m2d_arch ident##_arch = {__VA_ARGS__};                          \
    __attribute__((constructor)) static void ident##_arch_register(void) {       \
        m2d_arch_register(&ident##_arch);                                        \
    }

/* Registered adapters, sorted by name. */
int m2d_arch_count(void);
const m2d_arch *m2d_arch_at(int i);

/* Parse DIR/config.json (needs no weights). */
int m2d_config_load(const char *dir, m2d_config *cfg, const m2d_arch **arch);
/* Same from text in memory; PATH names it in errors. */
int m2d_config_parse(const char *text, size_t len, const char *path, m2d_config *cfg, const m2d_arch **arch);
void m2d_config_free(m2d_config *cfg);
/* Open DIR: config.json + safetensors (mmap) + bind + validate. */
int m2d_model_open(const char *dir, m2d_model **out);
void m2d_model_close(m2d_model *m);

/* Parameter counts (elements) of CFG via its adapter: see m2d_param_counts above. */
m2d_param_counts m2d_model_param_counts(const m2d_config *cfg);
/* Qwen3 family: GQA attention with q/k RMSNorm, two norms per layer, SwiGLU FFN/experts, router [E, d]. */
m2d_param_counts m2d_param_counts_qwen3(const m2d_config *cfg);

/* ---- helpers for architecture adapters ----
 * config.json fields (JSON is the parsed cJSON* given to parse_config). Absent or null takes
 * DFLT unless REQUIRED; a wrong JSON type is an error naming PATH and the field. */
int m2d_cfg_has(const void *json, const char *name); /* present and not null */
int m2d_cfg_int(const void *json, const char *path, const char *name, int required, int dflt, int *out);
int m2d_cfg_pos_int(const void *json, const char *path, const char *name, int required, int dflt, int *out);
/* Error naming PATH and NAME when VALUE > MAX (keeps size arithmetic far from int64 overflow). */
int m2d_cfg_check_max(const char *path, const char *name, int value, int max);
int m2d_cfg_int_or_null(const void *json, const char *path, const char *name, int *out); /* null: -1 */
int m2d_cfg_double(const void *json, const char *path, const char *name, int required, double dflt, double *out);
int m2d_cfg_bool(const void *json, const char *path, const char *name, int required, bool dflt, bool *out);
int m2d_cfg_str(const void *json, const char *path, const char *name, int required, const char *dflt,
                const char **out); /* *out points into JSON */
int m2d_cfg_int_list(const void *json, const char *path, const char *name, int **out, int *n); /* malloc'd */
int m2d_cfg_torch_dtype(const void *json, const char *path, m2d_dtype *out); /* torch_dtype or dtype */
/* Fill cfg->layer_is_moe from num_experts, mlp_only_layers and decoder_sparse_step (HF Qwen3-MoE rule). */
int m2d_config_derive_layers(m2d_config *cfg, const char *path);
/* Tensor NAME with shape [d0] (ndim 1) or [d0, d1] (ndim 2) and a float dtype; else NULL and an
 * error naming the tensor and the expected vs actual shape. */
const m2d_tensor *m2d_model_expect(m2d_model *m, const char *name, int ndim, int64_t d0, int64_t d1);
const m2d_tensor *m2d_model_expectf(m2d_model *m, int ndim, int64_t d0, int64_t d1, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* Error if the checkpoint holds a tensor the adapter did not bind (nothing is ignored silently). */
int m2d_model_check_unused(m2d_model *m);

#endif
