/* model — config.json, architecture adapters, and the loaded model's weight views.
 *
 * An architecture adapter (one file: harness/model/arch_<name>.c) registers itself with
 * M2D_ARCH(...) and declares (1) how to read its config.json into m2d_config, including the ops
 * its layers use (m2d_layer_ops), (2) its tensor table (names, shapes, dtypes per role), (3) the
 * student architecture it converts to and how its config.json is written. Everything generic
 * (binding, validation, unused-tensor check, parameter counts, student tensor names) is done here
 * from those declarations; the engine and the converter read only them. ARCHITECTURE.md lists
 * the exact steps for a new family. */
#ifndef M2D_MODEL_H
#define M2D_MODEL_H

#include <stdbool.h>

#include "io/st.h"
#include "model/rope.h"

/* One limit on the attention head size, for the config readers, the engine and every backend
 * (kernels size their per-head scratch by it): 1024, four times the largest heads (256) of released
 * models; configs beyond it are refused when parsed. */
#define M2D_MAX_HEAD_DIM 1024
/* One limit on DeepSeek's expert groups (n_group), for the config reader and the router kernels
 * (DeepSeek-V2: 8). */
#define M2D_MAX_EXPERT_GROUPS 64

/* ---- what the layers compute (the adapter's ops description) ----
 * The engine reads these and the tensor roles below, never an architecture name. Adding a
 * variant: a new enum value here, its implementation in engine.c (and each backend op it needs),
 * and the engine's creation-time check (check_model) that rejects what it does not implement. */
typedef enum {
    M2D_QK_NORM_NONE,       /* no q/k norm (Qwen2, Mixtral, DeepSeek-V2) */
    M2D_QK_NORM_PER_HEAD,   /* RMSNorm of each head's q/k vector, weight [head_dim] (Qwen3) */
    M2D_QK_NORM_WHOLE,      /* RMSNorm over the whole q/k projection, weight [heads*head_dim] (OLMoE) */
} m2d_qk_norm;

typedef enum {
    M2D_ROUTER_SOFTMAX_TOPK, /* p = softmax over all E router logits; top-k of p (ties -> lower index) */
    M2D_ROUTER_TOPK_SOFTMAX, /* top-k of the logits (ties -> lower index), gates = softmax over those k
                              * logits (GPT-OSS); p = the full softmax all the same (for calibration) */
} m2d_router_kind;

typedef enum {
    M2D_ACT_SWIGLU,          /* silu(gate x) * (up x) */
    M2D_ACT_SWIGLU_CLAMP,    /* GPT-OSS: g = min(gate x, limit), u = clamp(up x, -limit, limit),
                              * (u + 1) * g * sigmoid(alpha * g); alpha, limit in m2d_layer_ops */
} m2d_ffn_act;

typedef enum {
    M2D_ROPE_NEOX,           /* rotate-half (HF default): pairs (i, i + rot/2) of the first rot dims */
    M2D_ROPE_INTERLEAVED,    /* adjacent pairs (2i, 2i + 1) of the first rot dims (DeepSeek-V2, GPT-J) */
} m2d_rope_kind;

typedef enum {
    M2D_ATTN_GQA,            /* q/k/v_proj, grouped-query attention */
    M2D_ATTN_MLA,            /* DeepSeek-V2's multi-head latent attention: q from q_proj or the q LoRA
                              * (q_a_proj, its RMSNorm, q_b_proj); k/v from the normed kv latent
                              * (kv_b_proj) per head, k's last rope dims one rotated key shared by all
                              * heads (kv_a_proj_with_mqa's tail); heads of qk_nope + qk_rope dims
                              * (cfg->head_dim), values of v_head_dim (padded with zeros to head_dim) */
} m2d_attn_kind;

typedef struct {
    m2d_attn_kind attn;
    m2d_qk_norm qk_norm;
    m2d_router_kind router;
    bool router_renorm;     /* gates = p / sum of the k selected p (HF norm_topk_prob) */
    m2d_ffn_act ffn_act;    /* dense FFN and every expert */
    m2d_rope_kind rope;
    float act_alpha, act_limit; /* M2D_ACT_SWIGLU_CLAMP: swiglu_alpha, swiglu_limit */
} m2d_layer_ops;

typedef struct {
    char arch[64];          /* "Qwen3MoeForCausalLM" */
    char model_type[32];    /* "qwen3_moe" */
    int vocab_size, hidden_size, intermediate_size, moe_intermediate_size;
    int num_experts, num_experts_per_tok; /* 0 experts: dense model */
    int shared_expert_intermediate_size; /* width of the always-on shared experts of an MoE layer
                                          * (DeepSeek: n_shared_experts * d_e); 0: none */
    bool norm_topk_prob;    /* as in config.json; the engine reads ops.router_renorm */
    int decoder_sparse_step;
    int *mlp_only_layers; int n_mlp_only_layers;
    int num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim;
    double rope_theta, rms_norm_eps;
    m2d_rope_scaling rope_scaling; /* rope_scaling / rope_parameters beyond theta (model/rope.h) */
    int rope_dim;           /* dimensions rotated per head (0: head_dim): the first ones, or MLA's rope part */
    double attn_scale;      /* softmax scale of the attention scores (0: 1/sqrt(head_dim)) */
    /* M2D_ATTN_MLA (DeepSeek-V2): q LoRA rank (0: q_proj), kv latent rank, head parts */
    int q_lora_rank, kv_lora_rank, qk_nope_head_dim, v_head_dim;
    double mla_norm_eps;    /* of the q and kv latent norms: transformers' DeepseekV2RMSNorm default 1e-6,
                             * whatever rms_norm_eps says (it is not passed to those two) */
    /* router: group-limited top-k (n_group groups, the top topk_group by their best expert; 0: off)
     * and the factor on the gates (DeepSeek's routed_scaling_factor; 0: 1) */
    int n_group, topk_group;
    double routed_scaling_factor;
    bool tie_word_embeddings;
    bool qkv_bias, o_bias;  /* the attention projections carry biases (the adapter's tensor_present) */
    double clip_qkv;        /* q, k, v clamped to [-clip_qkv, clip_qkv] after the q/k norm (OLMoE); 0: off */
    int max_position_embeddings;
    int bos_token_id, eos_token_id; /* -1 when null/absent */
    m2d_dtype torch_dtype;
    bool *layer_is_moe;     /* derived: [num_hidden_layers] */
    m2d_layer_ops ops;      /* filled by the adapter's parse_config */
    char quant_method[16];  /* quantization_config.quant_method ("" when unquantised; "mxfp4") */
    int sliding_window;     /* as in config.json (0: null/absent) */
    /* per layer: keys a query sees, itself included (HF sliding mask: kv > q - window); 0 = full
     * causal attention. NULL: every layer full. Filled by the adapter (layer_types, sliding_window). */
    int *layer_window;
} m2d_config;

/* ---- tensor roles ----
 * Every tensor the engine or the converter uses has a role. A layer holds one pointer per role
 * (NULL where its architecture or layer kind has none); which roles exist, their checkpoint
 * names and shapes come from the adapter's tensor table (m2d_tensor_spec). Each X(...) line is
 * (ROLE, field, part): part M2D_PART_FFN marks the FFN block that conversion replaces (router,
 * experts, dense gate/up/down); everything else is copied from the teacher unchanged.
 * Adding a role (e.g. attention biases, sinks, shared experts for issue 12) is one line here plus
 * its use in the engine; the union keeps both `L->q_proj` and the loop form `L->w[role]`. */
#define M2D_PART_LAYER 0
#define M2D_PART_FFN 1
#define M2D_LAYER_ROLES(X)                                                                    \
    X(ATTN_NORM, attn_norm, M2D_PART_LAYER)   /* RMSNorm before attention [d] */             \
    X(Q, q_proj, M2D_PART_LAYER)              /* [heads*head_dim, d] */                      \
    X(K, k_proj, M2D_PART_LAYER)              /* [kv_heads*head_dim, d] */                   \
    X(V, v_proj, M2D_PART_LAYER)              /* [kv_heads*head_dim, d] */                   \
    X(O, o_proj, M2D_PART_LAYER)              /* [d, heads*head_dim] */                      \
    X(Q_NORM, q_norm, M2D_PART_LAYER)         /* per ops.qk_norm */                          \
    X(K_NORM, k_norm, M2D_PART_LAYER)                                                        \
    X(FFN_NORM, ffn_norm, M2D_PART_LAYER)     /* RMSNorm before the FFN [d] */               \
    X(GATE, gate_proj, M2D_PART_FFN)          /* dense FFN [inter, d] */                     \
    X(UP, up_proj, M2D_PART_FFN)              /* dense FFN [inter, d] */                     \
    X(DOWN, down_proj, M2D_PART_FFN)          /* dense FFN [d, inter] */                     \
    X(ROUTER, router, M2D_PART_FFN)           /* MoE router [E, d] */                        \
    /* optional roles: absent (NULL) = the term is not computed */                           \
    X(Q_BIAS, q_bias, M2D_PART_LAYER)         /* [heads*head_dim], added after q_proj */     \
    X(K_BIAS, k_bias, M2D_PART_LAYER)         /* [kv_heads*head_dim] */                      \
    X(V_BIAS, v_bias, M2D_PART_LAYER)         /* [kv_heads*head_dim] */                      \
    X(O_BIAS, o_bias, M2D_PART_LAYER)         /* [d], added after o_proj */                  \
    X(SINKS, sinks, M2D_PART_LAYER)           /* [heads] attention sink logit per head */    \
    X(GATE_BIAS, gate_bias, M2D_PART_FFN)     /* dense FFN [inter] */                        \
    X(UP_BIAS, up_bias, M2D_PART_FFN)         /* dense FFN [inter] */                        \
    X(DOWN_BIAS, down_bias, M2D_PART_FFN)     /* dense FFN [d] */                            \
    X(ROUTER_BIAS, router_bias, M2D_PART_FFN) /* MoE router [E] */                        \
    X(Q_A, q_a_proj, M2D_PART_LAYER)          /* MLA: q LoRA down [q_lora, d] */            \
    X(Q_A_NORM, q_a_norm, M2D_PART_LAYER)     /* MLA: its RMSNorm [q_lora] */                \
    X(Q_B, q_b_proj, M2D_PART_LAYER)          /* MLA: q LoRA up [heads*head_dim, q_lora] */  \
    X(KV_A, kv_a_proj, M2D_PART_LAYER)        /* MLA: [kv_lora + rope, d] latent + rope key */ \
    X(KV_A_NORM, kv_a_norm, M2D_PART_LAYER)   /* MLA: the latent's RMSNorm [kv_lora] */      \
    X(KV_B, kv_b_proj, M2D_PART_LAYER)        /* MLA: [heads*(nope + v), kv_lora] */         \
    X(SHARED_GATE, shared_gate_proj, M2D_PART_FFN) /* the always-on shared experts of an    */ \
    X(SHARED_UP, shared_up_proj, M2D_PART_FFN)     /* MoE layer (DeepSeek, Qwen2-MoE) as one */ \
    X(SHARED_DOWN, shared_down_proj, M2D_PART_FFN) /* SwiGLU [shared, d] x2, [d, shared]    */ \
    X(SHARED_EXPERT_GATE, shared_expert_gate, M2D_PART_FFN) /* [1, d]: x sigmoid(w.x) (Qwen2-MoE) */
/* Per-expert roles of an MoE layer: arrays of E tensors (the biases optional: NULL arrays). */
#define M2D_EXPERT_ROLES(X)                                                                   \
    X(EXP_GATE, exp_gate) /* [d_e, d] */                                                      \
    X(EXP_UP, exp_up)     /* [d_e, d] */                                                      \
    X(EXP_DOWN, exp_down) /* [d, d_e] */                                                      \
    X(EXP_GATE_BIAS, exp_gate_bias) /* [d_e] */                                               \
    X(EXP_UP_BIAS, exp_up_bias)     /* [d_e] */                                               \
    X(EXP_DOWN_BIAS, exp_down_bias) /* [d] */
/* Model-level roles (fields of m2d_model). */
typedef enum { M2D_M_EMBED, M2D_M_FINAL_NORM, M2D_M_LM_HEAD, M2D_M_COUNT } m2d_model_role;

#define M2D_ROLE_ENUM_(R, f, ...) M2D_T_##R,
#define M2D_XROLE_ENUM_(R, f) M2D_X_##R,
#define M2D_ROLE_FIELD_(R, f, ...) const m2d_tensor *f;
#define M2D_XROLE_FIELD_(R, f) const m2d_tensor **f;
typedef enum { M2D_LAYER_ROLES(M2D_ROLE_ENUM_) M2D_T_COUNT } m2d_layer_role;
typedef enum { M2D_EXPERT_ROLES(M2D_XROLE_ENUM_) M2D_X_COUNT } m2d_expert_role;

typedef struct {
    union {
        const m2d_tensor *w[M2D_T_COUNT];
        struct { M2D_LAYER_ROLES(M2D_ROLE_FIELD_) };
    };
    union {
        const m2d_tensor **x[M2D_X_COUNT]; /* [role][expert], NULL on dense layers */
        struct { M2D_EXPERT_ROLES(M2D_XROLE_FIELD_) };
    };
} m2d_layer;

/* Role names for messages ("q_proj"), and whether a role is part of the replaced FFN block. */
const char *m2d_layer_role_name(int role);
const char *m2d_expert_role_name(int role);
int m2d_layer_role_is_ffn(int role);

/* ---- the adapter's tensor table ----
 * One entry per tensor kind: where it occurs (scope), which role it fills, its checkpoint name
 * (printf format: the layer index, then the expert index) and its shape in config dimensions.
 * The generic binder (m2d_model_open) instantiates every entry, checks presence, shape and dtype,
 * and refuses checkpoint tensors no entry claims. */
typedef enum {
    M2D_SCOPE_MODEL,        /* once per model; role is an m2d_model_role */
    M2D_SCOPE_LAYER,        /* every layer; role is an m2d_layer_role */
    M2D_SCOPE_DENSE,        /* layers with a dense FFN (layer_is_moe false) */
    M2D_SCOPE_MOE,          /* MoE layers */
    M2D_SCOPE_EXPERT,       /* each expert of each MoE layer; role is an m2d_expert_role */
} m2d_scope;

typedef enum {
    M2D_DIM_NONE,           /* unused second dimension (a vector) */
    M2D_DIM_HIDDEN,         /* hidden_size */
    M2D_DIM_VOCAB,          /* vocab_size */
    M2D_DIM_HEAD,           /* head_dim */
    M2D_DIM_Q,              /* num_attention_heads * head_dim */
    M2D_DIM_KV,             /* num_key_value_heads * head_dim */
    M2D_DIM_FFN,            /* intermediate_size (dense FFN width) */
    M2D_DIM_EXPERT_FFN,     /* moe_intermediate_size */
    M2D_DIM_EXPERTS,        /* num_experts */
    M2D_DIM_ONE,            /* 1 (the router row of a dense layer stored as one expert) */
    M2D_DIM_SHARED_FFN,     /* shared_expert_intermediate_size */
    M2D_DIM_HEADS,          /* num_attention_heads */
    M2D_DIM_Q_LORA,         /* MLA: q_lora_rank */
    M2D_DIM_KV_LORA,        /* MLA: kv_lora_rank */
    M2D_DIM_KV_A,           /* MLA: kv_lora_rank + rope dims */
    M2D_DIM_KV_B,           /* MLA: heads * (qk_nope_head_dim + v_head_dim) */
    M2D_DIM_ATTN_OUT,       /* heads * v_head_dim (MLA) or heads * head_dim: o_proj's input */
} m2d_dim;

typedef struct {
    m2d_scope scope;
    int role;
    const char *name;       /* "model.layers.%d.self_attn.q_proj.weight" */
    m2d_dim shape[2];       /* shape[1] M2D_DIM_NONE: 1-D */
    unsigned dtypes;        /* accepted dtypes, bit (1u << m2d_dtype); 0: F32, BF16 or F16 */
} m2d_tensor_spec;

/* Value of DIM under CFG. */
int64_t m2d_dim_value(const m2d_config *cfg, m2d_dim dim);

typedef struct m2d_arch m2d_arch;

/* Parameter counts (elements): total, active per token (top-k experts, shared experts, embeddings
 * and routers included), and the dense student with K selected experts merged into k groups
 * (width k*d_e + the shared experts' in every layer, dense layers zero-padded to it, no router)
 * -- the same for every K. */
typedef struct { int64_t total, active, dense_student; } m2d_param_counts;

typedef struct {
    char *dir;
    m2d_config cfg;
    const m2d_arch *arch;
    m2d_st *st;
    char *config_text;      /* config.json as read (the student's config is derived from it) */
    const m2d_tensor *embed, *final_norm, *lm_head; /* lm_head == embed when tied */
    const m2d_tensor *lm_head_stored; /* tied checkpoints that also store an identical lm_head.weight */
    m2d_layer *layers;      /* [num_hidden_layers] */
    char weights_hash[65];  /* sha256 over tensor names, shapes, dtypes and bytes (provenance) */
    /* identity for caches, statistics and runs: sha256 over config.json's bytes and weights_hash
     * (rope, norms, routing, windows live in the config: changing one changes every result) */
    char model_hash[65];
    /* made by the adapter's post_bind hook (m2d_model_new_tensor): freed by m2d_model_close */
    m2d_tensor **owned; int n_owned, cap_owned;
    int *owned_layer;       /* [n_owned] the layer of a deferred tensor (m2d_model_new_deferred), else -1 */
    unsigned char *layer_ready; /* [num_hidden_layers] 1: the layer's deferred tensors hold their values
                             * (m2d_model_acquire_layer); NULL: the model has none */
    /* stored tensors post_bind read instead of binding them to a role (m2d_model_claim) */
    struct m2d_claim { const m2d_tensor *t; int layer, part; } *claimed; int n_claimed, cap_claimed;
} m2d_model;

/* What conversion asks of the student's config.json (m2d_arch.student_config). */
typedef struct {
    bool moe;               /* false: dense student (arch = the adapter's .student); true: a smaller
                             * MoE of the teacher's own architecture */
    int ffn_width;          /* dense: the merged FFN width of every layer, k * d_e */
    int n_experts, top_k;   /* moe: experts per MoE layer and experts routed per token */
    /* the teacher's attention shape as its reader resolved it (set by m2d_arch_student_config), for a
     * student class whose defaults differ (Qwen3Config: head_dim 128) */
    int head_dim, num_key_value_heads;
} m2d_student_shape;

struct m2d_arch {
    const char *name;       /* architectures[0] in config.json */
    const char *summary;
    /* fill cfg (sizes and cfg->ops) from parsed config.json (a cJSON*); errors name PATH and the
     * field. Must call m2d_config_derive_layers (or set layer_is_moe itself). */
    int (*parse_config)(const void *json, const char *path, m2d_config *cfg);
    /* the tensor table (see m2d_tensor_spec), ending with an entry whose name is NULL */
    const m2d_tensor_spec *tensors;
    /* the dense student this architecture converts to: a registered adapter's name (NULL: not
     * convertible, e.g. a dense architecture), and the rewrite of a copy of the teacher's parsed
     * config.json (cJSON*) into the student's, for a dense or a smaller-MoE student */
    const char *student;
    int (*student_config)(void *json, const m2d_student_shape *s, const char *path);
    /* optional: parameter counts when the tensor table does not give them (NULL: counted from
     * the table, m2d_param_counts_table) */
    m2d_param_counts (*param_counts)(const m2d_config *cfg);
    /* optional: whether the table's entries of SCOPE and ROLE occur under CFG (NULL: all of them),
     * for tensors a config switches on or off (attention biases, DeepSeek's q_lora_rank) */
    bool (*tensor_present)(const m2d_config *cfg, m2d_scope scope, int role);
    /* optional: stored layouts the table cannot bind (quantised or fused tensors, e.g. GPT-OSS's
     * MXFP4 blocks + scales and its fused, interleaved gate_up). Called by m2d_model_open after the
     * table is bound and before the unused-tensor check: fills the remaining roles with tensors it
     * makes (m2d_model_new_tensor, dequantised / split / transposed into the roles' layouts) from
     * stored tensors it claims (m2d_model_claim, which the unused-tensor check then accepts). */
    int (*post_bind)(m2d_model *m);
    /* optional, with post_bind: the values of LAYER's deferred tensors (m2d_model_new_deferred;
     * their buffers zeroed and allocated by the caller, m2d_model_acquire_layer), e.g. MXFP4
     * experts dequantised one layer at a time instead of the whole model at open */
    int (*fill_layer)(const m2d_model *m, int layer);
    /* optional, the inverse for a student written by convert: the FFN block (the roles of part
     * M2D_PART_FFN and the experts) of LAYER of S as S's checkpoint stores it, added to W.
     * NULL: each role tensor under its table name. */
    int (*write_ffn)(const m2d_model *s, int layer, m2d_st_writer *w);
    /* optional, with post_bind: for a stored tensor STORED that post_bind claimed for LAYER outside
     * the FFN, the role of LAYER it made from it (-1: none). With OUT, also that role's values made
     * from FROM (STORED's name, dtype and shape: a random-init student's draw of it) into OUT (the
     * role tensor's dtype and shape), so that a student's stored and bound tensors agree. */
    int (*rederive)(const m2d_model *m, int layer, const m2d_tensor *stored, const m2d_tensor *from, void *out);
    /* optional: the family's name when this architecture is a MoE teacher ("Qwen3-MoE"), for
     * the usage texts that list them (NULL: not a teacher family, e.g. a dense architecture) */
    const char *family;
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
/* The same, leaving the layers' deferred tensors (an adapter's fill_layer: GPT-OSS's MXFP4 experts
 * dequantised) without values until m2d_model_acquire_layer: for passes that hold one layer at a
 * time (the engine acquires each layer it runs, and a layer-major pass releases it after). Every
 * other reader of tensor data opens with m2d_model_open, which acquires every layer. */
int m2d_model_open_lazy(const char *dir, m2d_model **out);
/* LAYER's deferred tensors given their values (a no-op when they have them or the model has none;
 * -1 + m2d_err from the adapter, e.g. an MXFP4 block that dequantises to a non-finite value), and
 * their memory given back (values gone until the next acquire). */
int m2d_model_acquire_layer(const m2d_model *m, int layer);
void m2d_model_release_layer(const m2d_model *m, int layer);
void m2d_model_close(m2d_model *m);
/* Layer LAYER's stored weights (roles, experts and the tensors its post_bind claimed): their
 * bytes (what a layer-major pass holds at once), and paging advice on the mapped ones (io/st.h
 * m2d_st_advise: read ahead before the layer runs, dropped from the process after it). */
size_t m2d_model_layer_bytes(const m2d_model *m, int layer);
void m2d_model_advise_layer(const m2d_model *m, int layer, m2d_st_advice advice);

/* Parameter counts (elements) of CFG via its adapter: see m2d_param_counts above. */
m2d_param_counts m2d_model_param_counts(const m2d_config *cfg);
/* Counted from ARCH's tensor table (and its student's for dense_student). */
m2d_param_counts m2d_param_counts_table(const m2d_arch *arch, const m2d_config *cfg);

/* ---- names from the tensor table ----
 * Checkpoint name of the tensor of ARCH in SCOPE with ROLE at LAYER (and EXPERT) into buf;
 * -1 + m2d_err when the architecture has no such tensor. */
int m2d_arch_tensor_name(const m2d_arch *arch, m2d_scope scope, int role, int layer, int expert, char *buf,
                         size_t cap);
/* Whether ARCH's tensor table has an entry of SCOPE and ROLE (whatever the config). */
int m2d_arch_has_tensor(const m2d_arch *arch, m2d_scope scope, int role);
/* The student's config.json text (cJSON_Print of the teacher's config.json rewritten by the
 * teacher adapter's student_config); caller frees. -1 + m2d_err when the teacher has no student
 * or no config text. */
int m2d_arch_student_config(const m2d_model *teacher, const m2d_student_shape *s, char **json_out);

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
/* num_experts (the Hub's spelling) or num_local_experts (what save_pretrained of transformers >= 5
 * writes for some families; an alias there); both present must agree. Required, positive. */
int m2d_cfg_num_experts(const void *json, const char *path, int *out);
/* Fill cfg->layer_is_moe from num_experts, mlp_only_layers and decoder_sparse_step (HF Qwen3-MoE rule). */
int m2d_config_derive_layers(m2d_config *cfg, const char *path);
/* Tensor NAME with shape [d0] (ndim 1) or [d0, d1] (ndim 2) and a float dtype; else NULL and an
 * error naming the tensor and the expected vs actual shape. */
const m2d_tensor *m2d_model_expect(m2d_model *m, const char *name, int ndim, int64_t d0, int64_t d1);
/* Error if the checkpoint holds a tensor the adapter did not bind (nothing is ignored silently). */
int m2d_model_check_unused(m2d_model *m);

/* ---- for post_bind hooks ----
 * The stored tensor NAME, checked against the shape SHAPE[NDIM] (-1: any extent) and DTYPES (bits
 * 1u << m2d_dtype; 0: F32/BF16/F16), recorded as read for LAYER (-1: model) and PART
 * (M2D_PART_FFN: replaced when a student is written). NULL + an error naming file, tensor, field. */
const m2d_tensor *m2d_model_claim(m2d_model *m, const char *name, int layer, int part, int ndim,
                                  const int64_t *shape, unsigned dtypes);
/* A zero-filled tensor owned by M (freed by m2d_model_close); its data is writable until bound. */
m2d_tensor *m2d_model_new_tensor(m2d_model *m, const char *name, m2d_dtype dtype, int ndim,
                                 const int64_t *shape);
/* The same for LAYER with no values yet (data NULL): the adapter's fill_layer writes them when the
 * layer is acquired (m2d_model_acquire_layer). */
m2d_tensor *m2d_model_new_deferred(m2d_model *m, const char *name, m2d_dtype dtype, int ndim,
                                   const int64_t *shape, int layer);

#endif
