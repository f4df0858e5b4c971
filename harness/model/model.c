/* model — architecture registry, config.json loading, model open/validate, parameter counts. */
#include "model/model.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "io/json.h"

/* ---------------------------------------------------------------- registry */

#define MAX_ARCHS 32
static const void *arch_items[MAX_ARCHS];
static m2d_name_table archs = {arch_items, 0, MAX_ARCHS, offsetof(m2d_arch, name),
                               "too many architectures (raise MAX_ARCHS)"};

void m2d_arch_register(const m2d_arch *a) { m2d_name_table_add(&archs, a); }
const m2d_arch *m2d_arch_find(const char *name) { return m2d_name_table_find(&archs, name); }
int m2d_arch_count(void) { return archs.n; }
const m2d_arch *m2d_arch_at(int i) { return archs.items[i]; }

const char *m2d_arch_list(void) {
    static char buf[1024];
    return m2d_name_table_list(&archs, buf, sizeof buf);
}

/* ---------------------------------------------------------------- config field helpers */

static const cJSON *field(const void *json, const char *name) {
    return cJSON_GetObjectItemCaseSensitive((const cJSON *)json, name);
}

int m2d_cfg_has(const void *json, const char *name) {
    const cJSON *v = field(json, name);
    return v && !cJSON_IsNull(v);
}

/* V, field NAME, as an int: an integral number within int's range (the cast is UB beyond it) */
static int int_value(const cJSON *v, const char *path, const char *name, int *out) {
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        return m2d_err1("%s: field '%s': must be an integer", path, name);
    if (fabs(v->valuedouble) > 2147483647.0)
        return m2d_err1("%s: field '%s': %.17g is out of range (at most 2147483647)", path, name, v->valuedouble);
    *out = (int)v->valuedouble;
    return 0;
}

int m2d_cfg_int(const void *json, const char *path, const char *name, int required, int dflt, int *out) {
    const cJSON *v = field(json, name);
    if (!v || cJSON_IsNull(v)) {
        if (required) return m2d_err1("%s: field '%s': missing (required)", path, name);
        *out = dflt;
        return 0;
    }
    return int_value(v, path, name, out);
}

int m2d_cfg_pos_int(const void *json, const char *path, const char *name, int required, int dflt, int *out) {
    if (m2d_cfg_int(json, path, name, required, dflt, out) != 0) return -1;
    if (*out <= 0) return m2d_err1("%s: field '%s': must be positive (got %d)", path, name, *out);
    return 0;
}

int m2d_cfg_check_max(const char *path, const char *name, int value, int max) {
    if (value > max) return m2d_err1("%s: field '%s': %d exceeds the supported maximum %d", path, name, value, max);
    return 0;
}

int m2d_cfg_int_or_null(const void *json, const char *path, const char *name, int *out) {
    const cJSON *v = field(json, name);
    if (v && cJSON_IsArray(v)) {
        /* some configs list several eos ids; the first is the one generation stops on by default */
        if (cJSON_GetArraySize(v) == 0) {
            *out = -1;
            return 0;
        }
        if (!cJSON_IsNumber(v->child)) return m2d_err1("%s: field '%s': must be a token id, a list of ids, or null", path, name);
        if (int_value(v->child, path, name, out) != 0) return -1;
        if (*out < 0) return m2d_err1("%s: field '%s': must be a token id, a list of ids, or null", path, name);
        return 0;
    }
    if (m2d_cfg_int(json, path, name, 0, -1, out) != 0) return -1;
    if (*out < -1) return m2d_err1("%s: field '%s': must be a token id or null", path, name);
    return 0;
}

int m2d_cfg_double(const void *json, const char *path, const char *name, int required, double dflt, double *out) {
    const cJSON *v = field(json, name);
    if (!v || cJSON_IsNull(v)) {
        if (required) return m2d_err1("%s: field '%s': missing (required)", path, name);
        *out = dflt;
        return 0;
    }
    if (!cJSON_IsNumber(v)) return m2d_err1("%s: field '%s': must be a number", path, name);
    /* cJSON reads 1e999 as inf: refused, as Python's json would give inf too and no field means it */
    if (!isfinite(v->valuedouble)) return m2d_err1("%s: field '%s': must be a finite number", path, name);
    *out = v->valuedouble;
    return 0;
}

int m2d_cfg_bool(const void *json, const char *path, const char *name, int required, bool dflt, bool *out) {
    const cJSON *v = field(json, name);
    if (!v || cJSON_IsNull(v)) {
        if (required) return m2d_err1("%s: field '%s': missing (required)", path, name);
        *out = dflt;
        return 0;
    }
    if (!cJSON_IsBool(v)) return m2d_err1("%s: field '%s': must be true or false", path, name);
    *out = cJSON_IsTrue(v);
    return 0;
}

int m2d_cfg_str(const void *json, const char *path, const char *name, int required, const char *dflt,
                const char **out) {
    const cJSON *v = field(json, name);
    if (!v || cJSON_IsNull(v)) {
        if (required) return m2d_err1("%s: field '%s': missing (required)", path, name);
        *out = dflt;
        return 0;
    }
    if (!cJSON_IsString(v)) return m2d_err1("%s: field '%s': must be a string", path, name);
    *out = v->valuestring;
    return 0;
}

int m2d_cfg_int_list(const void *json, const char *path, const char *name, int **out, int *n) {
    const cJSON *v = field(json, name);
    *out = NULL;
    *n = 0;
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsArray(v)) return m2d_err1("%s: field '%s': must be a list of integers", path, name);
    int cnt = cJSON_GetArraySize(v);
    int *a = m2d_malloc((size_t)(cnt ? cnt : 1) * sizeof(int));
    int i = 0;
    for (const cJSON *x = v->child; x; x = x->next, i++) {
        if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || fabs(x->valuedouble) > 2147483647.0) {
            free(a);
            if (cJSON_IsNumber(x) && x->valuedouble == floor(x->valuedouble))
                return m2d_err1("%s: field '%s': element %d: %.17g is out of range (at most 2147483647)", path, name,
                                i, x->valuedouble);
            return m2d_err1("%s: field '%s': element %d must be an integer", path, name, i);
        }
        a[i] = (int)x->valuedouble;
    }
    *out = a;
    *n = cnt;
    return 0;
}

int m2d_cfg_num_experts(const void *json, const char *path, int *out) {
    int a = m2d_cfg_has(json, "num_experts"), b = m2d_cfg_has(json, "num_local_experts"), other;
    if (m2d_cfg_pos_int(json, path, b && !a ? "num_local_experts" : "num_experts", 1, 0, out) != 0) return -1;
    if (!a || !b) return 0;
    if (m2d_cfg_pos_int(json, path, "num_local_experts", 1, 0, &other) != 0) return -1;
    if (other != *out)
        return m2d_err1("%s: field 'num_local_experts': %d disagrees with num_experts %d", path, other, *out);
    return 0;
}

int m2d_cfg_torch_dtype(const void *json, const char *path, m2d_dtype *out) {
    /* newer transformers write "dtype", older "torch_dtype"; absent means float32 (HF default) */
    const char *name = m2d_cfg_has(json, "torch_dtype") ? "torch_dtype" : "dtype";
    const char *s;
    if (m2d_cfg_str(json, path, name, 0, "float32", &s) != 0) return -1;
    if (strcmp(s, "float32") == 0) *out = M2D_F32;
    else if (strcmp(s, "bfloat16") == 0) *out = M2D_BF16;
    else if (strcmp(s, "float16") == 0) *out = M2D_F16;
    else return m2d_err1("%s: field '%s': unsupported dtype '%s' (float32, bfloat16, float16)", path, name, s);
    return 0;
}

/* ---------------------------------------------------------------- config */

void m2d_config_free(m2d_config *cfg) {
    free(cfg->mlp_only_layers);
    free(cfg->layer_is_moe);
    free(cfg->layer_window);
    cfg->mlp_only_layers = NULL;
    cfg->layer_is_moe = NULL;
    cfg->layer_window = NULL;
}

/* Hugging Face's model_type of each architecture: a config naming one architecture and another's
 * model_type (deepseek_v2 with Qwen3MoeForCausalLM) is contradictory, so it is refused; a model_type
 * or an architecture not listed here (absent, a fine-tune's own, a test's) is not checked. */
static const struct { const char *arch, *model_type; } MODEL_TYPES[] = {
    {"DeepseekV2ForCausalLM", "deepseek_v2"}, {"GptOssForCausalLM", "gpt_oss"}, {"MixtralForCausalLM", "mixtral"},
    {"MistralForCausalLM", "mistral"}, {"OlmoeForCausalLM", "olmoe"}, {"Qwen2MoeForCausalLM", "qwen2_moe"},
    {"Qwen2ForCausalLM", "qwen2"}, {"Qwen3ForCausalLM", "qwen3"}, {"Qwen3MoeForCausalLM", "qwen3_moe"}};

static const char *model_type_of(const char *arch) {
    for (size_t i = 0; i < M2D_ARRAY_LEN(MODEL_TYPES); i++)
        if (!strcmp(arch, MODEL_TYPES[i].arch)) return MODEL_TYPES[i].model_type;
    return NULL;
}

static int check_model_type(const char *path, const m2d_config *cfg) {
    if (!model_type_of(cfg->arch)) return 0; /* an architecture registered elsewhere (tests) */
    for (size_t i = 0; i < M2D_ARRAY_LEN(MODEL_TYPES); i++)
        if (!strcmp(cfg->model_type, MODEL_TYPES[i].model_type) && strcmp(cfg->arch, MODEL_TYPES[i].arch))
            return m2d_err1("%s: field 'model_type': '%s' is the model type of %s, not of architectures[0] %s", path,
                            cfg->model_type, MODEL_TYPES[i].arch, cfg->arch);
    return 0;
}

int m2d_config_parse(const char *text, size_t len, const char *path, m2d_config *cfg, const m2d_arch **arch) {
    memset(cfg, 0, sizeof *cfg);
    if (arch) *arch = NULL;
    cJSON *root;
    if (m2d_json_parse(path, "(root)", text, len, &root) != 0) return -1;
    int rc = 0;
    const m2d_arch *a = NULL;
    const cJSON *archs_j = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    if (!cJSON_IsObject(root)) rc = m2d_err1("%s: field '(root)': must be a JSON object", path);
    else if (!archs_j) rc = m2d_err1("%s: field 'architectures': missing (required)", path);
    else if (!cJSON_IsArray(archs_j) || cJSON_GetArraySize(archs_j) < 1 || !cJSON_IsString(archs_j->child))
        rc = m2d_err1("%s: field 'architectures': must be a non-empty list of strings", path);
    else if (!(a = m2d_arch_find(archs_j->child->valuestring)))
        rc = m2d_err1("%s: field 'architectures': unsupported architecture '%s' (supported: %s)", path,
                     archs_j->child->valuestring, m2d_arch_list());
    if (rc == 0) {
        snprintf(cfg->arch, sizeof cfg->arch, "%s", a->name);
        rc = a->parse_config(root, path, cfg);
    }
    if (rc == 0) rc = check_model_type(path, cfg);
    cJSON_Delete(root);
    if (rc != 0) {
        m2d_config_free(cfg);
        return -1;
    }
    if (arch) *arch = a;
    return 0;
}

int m2d_config_load(const char *dir, m2d_config *cfg, const m2d_arch **arch) {
    memset(cfg, 0, sizeof *cfg);
    char *path = m2d_path_join(dir, "config.json");
    size_t len;
    char *text = m2d_read_file(path, &len);
    int rc = -1;
    if (text) rc = m2d_config_parse(text, len, path, cfg, arch);
    free(text);
    free(path);
    return rc;
}

int m2d_config_derive_layers(m2d_config *cfg, const char *path) {
    int L = cfg->num_hidden_layers;
    for (int i = 0; i < cfg->n_mlp_only_layers; i++)
        if (cfg->mlp_only_layers[i] < 0 || cfg->mlp_only_layers[i] >= L)
            return m2d_err1("%s: field 'mlp_only_layers': layer %d out of range [0, %d)", path, cfg->mlp_only_layers[i],
                           L);
    free(cfg->layer_is_moe);
    cfg->layer_is_moe = m2d_calloc((size_t)L, sizeof(bool));
    bool *only = m2d_calloc((size_t)L, sizeof(bool));
    for (int i = 0; i < cfg->n_mlp_only_layers; i++) only[cfg->mlp_only_layers[i]] = true;
    /* HF Qwen3MoeDecoderLayer: sparse iff layer not in mlp_only_layers and num_experts > 0 and
     * (layer_idx + 1) % decoder_sparse_step == 0 (so step 2 makes layers 1, 3, 5, ... sparse). */
    for (int l = 0; l < L; l++)
        cfg->layer_is_moe[l] = !only[l] && cfg->num_experts > 0 && (l + 1) % cfg->decoder_sparse_step == 0;
    free(only);
    return 0;
}

/* ---------------------------------------------------------------- roles and dimensions */

#define ROLE_NAME_(R, f, ...) #f,
#define ROLE_PART_(R, f, part) part,
#define XROLE_NAME_(R, f) #f,
static const char *const layer_role_names[M2D_T_COUNT] = {M2D_LAYER_ROLES(ROLE_NAME_)};
static const int layer_role_part[M2D_T_COUNT] = {M2D_LAYER_ROLES(ROLE_PART_)};
static const char *const expert_role_names[M2D_X_COUNT] = {M2D_EXPERT_ROLES(XROLE_NAME_)};
static const char *const model_role_names[M2D_M_COUNT] = {"embed_tokens", "final_norm", "lm_head"};
/* the union in m2d_layer relies on the named fields lining up with the role arrays */
_Static_assert(sizeof(((m2d_layer *)0)->w) == M2D_T_COUNT * sizeof(void *), "m2d_layer roles");
_Static_assert(offsetof(m2d_layer, router) == M2D_T_ROUTER * sizeof(void *), "m2d_layer role order");
_Static_assert(offsetof(m2d_layer, exp_down) - offsetof(m2d_layer, x) == M2D_X_EXP_DOWN * sizeof(void *),
               "m2d_layer expert role order");

const char *m2d_layer_role_name(int role) { return role >= 0 && role < M2D_T_COUNT ? layer_role_names[role] : "?"; }
const char *m2d_expert_role_name(int role) { return role >= 0 && role < M2D_X_COUNT ? expert_role_names[role] : "?"; }
int m2d_layer_role_is_ffn(int role) { return role >= 0 && role < M2D_T_COUNT && layer_role_part[role] == M2D_PART_FFN; }

int64_t m2d_dim_value(const m2d_config *c, m2d_dim dim) {
    switch (dim) {
    case M2D_DIM_NONE: return 0;
    case M2D_DIM_HIDDEN: return c->hidden_size;
    case M2D_DIM_VOCAB: return c->vocab_size;
    case M2D_DIM_HEAD: return c->head_dim;
    case M2D_DIM_Q: return (int64_t)c->num_attention_heads * c->head_dim;
    case M2D_DIM_KV: return (int64_t)c->num_key_value_heads * c->head_dim;
    case M2D_DIM_FFN: return c->intermediate_size;
    case M2D_DIM_EXPERT_FFN: return c->moe_intermediate_size;
    case M2D_DIM_EXPERTS: return c->num_experts;
    case M2D_DIM_ONE: return 1;
    case M2D_DIM_SHARED_FFN: return c->shared_expert_intermediate_size;
    case M2D_DIM_HEADS: return c->num_attention_heads;
    case M2D_DIM_Q_LORA: return c->q_lora_rank;
    case M2D_DIM_KV_LORA: return c->kv_lora_rank;
    case M2D_DIM_KV_A: return (int64_t)c->kv_lora_rank + c->rope_dim;
    case M2D_DIM_KV_B: return (int64_t)c->num_attention_heads * (c->qk_nope_head_dim + c->v_head_dim);
    case M2D_DIM_ATTN_OUT:
        return (int64_t)c->num_attention_heads * (c->ops.attn == M2D_ATTN_MLA ? c->v_head_dim : c->head_dim);
    }
    return 0;
}

/* Does a spec of SCOPE occur in layer L? */
static int scope_in_layer(const m2d_config *c, m2d_scope scope, int l) {
    switch (scope) {
    case M2D_SCOPE_LAYER: return 1;
    case M2D_SCOPE_DENSE: return !c->layer_is_moe[l];
    case M2D_SCOPE_MOE:
    case M2D_SCOPE_EXPERT: return c->layer_is_moe[l];
    case M2D_SCOPE_MODEL: return 0;
    }
    return 0;
}

/* Does the adapter's config switch this entry on (m2d_arch.tensor_present)? */
static int spec_present(const m2d_arch *a, const m2d_config *c, const m2d_tensor_spec *sp) {
    return !a || !a->tensor_present || a->tensor_present(c, sp->scope, sp->role);
}

static void spec_name(const m2d_tensor_spec *sp, int layer, int expert, char *buf, size_t cap) {
    /* the format takes the layer, then the expert (printf ignores extra arguments) */
    snprintf(buf, cap, sp->name, layer, expert);
}

static const m2d_tensor_spec *find_spec(const m2d_arch *a, m2d_scope scope, int role) {
    for (const m2d_tensor_spec *sp = a ? a->tensors : NULL; sp && sp->name; sp++)
        if (sp->scope == scope && sp->role == role) return sp;
    return NULL;
}

int m2d_arch_has_tensor(const m2d_arch *a, m2d_scope scope, int role) { return find_spec(a, scope, role) != NULL; }

int m2d_arch_tensor_name(const m2d_arch *a, m2d_scope scope, int role, int layer, int expert, char *buf, size_t cap) {
    const m2d_tensor_spec *sp = find_spec(a, scope, role);
    if (!sp && (scope == M2D_SCOPE_DENSE || scope == M2D_SCOPE_MOE)) sp = find_spec(a, M2D_SCOPE_LAYER, role);
    if (!sp) {
        const char *rn = scope == M2D_SCOPE_EXPERT ? m2d_expert_role_name(role)
                         : scope == M2D_SCOPE_MODEL ? (role >= 0 && role < M2D_M_COUNT ? model_role_names[role] : "?")
                                                    : m2d_layer_role_name(role);
        return m2d_err("architecture %s: its tensor table has no '%s' tensor", a ? a->name : "(none)", rn);
    }
    spec_name(sp, layer, expert, buf, cap);
    return 0;
}

/* ---------------------------------------------------------------- open and bind */

static void format_dims(int ndim, const int64_t *shape, char *buf, size_t n) {
    size_t used = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (used < n) snprintf(buf + used, n - used, "]");
}

const m2d_tensor *m2d_model_expect(m2d_model *m, const char *name, int ndim, int64_t d0, int64_t d1) {
    const m2d_tensor *t = m2d_st_find(m->st, name);
    int64_t want[2] = {d0, d1};
    char ws[64], hs[96];
    format_dims(ndim, want, ws, sizeof ws);
    if (!t) return m2d_err1("%s: tensor '%s': missing (expected shape %s)", m->dir, name, ws), NULL;
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == want[i];
    if (!ok) {
        format_dims(t->ndim, t->shape, hs, sizeof hs);
        m2d_err1("%s: tensor '%s': field 'shape': expected %s, found %s", m2d_st_file_of(m->st, name), name, ws, hs);
        return NULL;
    }
    if (t->dtype != M2D_F32 && t->dtype != M2D_BF16 && t->dtype != M2D_F16) {
        m2d_err1("%s: tensor '%s': field 'dtype': %s is not a floating weight dtype (F32, BF16, F16)",
                m2d_st_file_of(m->st, name), name, m2d_dtype_name(t->dtype));
        return NULL;
    }
    return t;
}

/* A table tensor: presence, shape from the config, accepted dtype. */
static const m2d_tensor *bind_spec(m2d_model *m, const m2d_tensor_spec *sp, int layer, int expert) {
    char name[256];
    spec_name(sp, layer, expert, name, sizeof name);
    int ndim = sp->shape[1] == M2D_DIM_NONE ? 1 : 2;
    const m2d_tensor *t = m2d_model_expect(m, name, ndim, m2d_dim_value(&m->cfg, sp->shape[0]),
                                           m2d_dim_value(&m->cfg, sp->shape[1]));
    if (t && sp->dtypes && !(sp->dtypes & (1u << t->dtype))) {
        m2d_err1("%s: tensor '%s': field 'dtype': %s is not accepted by %s", m2d_st_file_of(m->st, name), name,
                 m2d_dtype_name(t->dtype), m->cfg.arch);
        return NULL;
    }
    return t;
}

/* Tied embeddings (HF semantics): lm_head is the embedding; a stored lm_head.weight is accepted
 * only when it is byte-identical (HF ignores it). */
static int bind_lm_head(m2d_model *m, const m2d_tensor_spec *sp) {
    if (!m->cfg.tie_word_embeddings) return (m->lm_head = bind_spec(m, sp, 0, 0)) ? 0 : -1;
    char name[256];
    spec_name(sp, 0, 0, name, sizeof name);
    const m2d_tensor *h = m2d_st_find(m->st, name);
    if (h && (h->dtype != m->embed->dtype || h->nbytes != m->embed->nbytes ||
              memcmp(h->data, m->embed->data, h->nbytes) != 0))
        return m2d_err1("%s: tensor '%s': differs from the embedding '%s' but tie_word_embeddings is true",
                        m2d_st_file_of(m->st, name), name, m->embed->name);
    m->lm_head = m->embed;
    m->lm_head_stored = h;
    return 0;
}

/* Model-scope entries, in the order embed, final norm, LM head (the LM head may tie to the embedding). */
static int bind_model_tensors(m2d_model *m) {
    const m2d_arch *a = m->arch;
    for (int role = 0; role < M2D_M_COUNT; role++) {
        const m2d_tensor_spec *sp = find_spec(a, M2D_SCOPE_MODEL, role);
        if (!sp) return m2d_err1("architecture %s: its tensor table has no '%s' tensor", a->name, model_role_names[role]);
        if (role == M2D_M_LM_HEAD) {
            if (bind_lm_head(m, sp) != 0) return -1;
        } else if (!(*(role == M2D_M_EMBED ? &m->embed : &m->final_norm) = bind_spec(m, sp, 0, 0))) {
            return -1;
        }
    }
    return 0;
}

static int bind_layer(m2d_model *m, int l) {
    const m2d_arch *a = m->arch;
    m2d_layer *L = &m->layers[l];
    int E = m->cfg.num_experts;
    for (const m2d_tensor_spec *sp = a->tensors; sp && sp->name; sp++) {
        if (!scope_in_layer(&m->cfg, sp->scope, l) || !spec_present(a, &m->cfg, sp)) continue;
        if (sp->scope != M2D_SCOPE_EXPERT) {
            if (!(L->w[sp->role] = bind_spec(m, sp, l, 0))) return -1;
            continue;
        }
        L->x[sp->role] = m2d_calloc((size_t)E, sizeof(const m2d_tensor *));
        for (int e = 0; e < E; e++)
            if (!(L->x[sp->role][e] = bind_spec(m, sp, l, e))) return -1;
    }
    return 0;
}

/* Bind every entry of the adapter's tensor table. */
static int bind_table(m2d_model *m) {
    if (bind_model_tensors(m) != 0) return -1;
    for (int l = 0; l < m->cfg.num_hidden_layers; l++)
        if (bind_layer(m, l) != 0) return -1;
    return 0;
}

/* FN on every tensor of LAYER: its roles, its experts' roles, the stored tensors its post_bind claimed */
static void for_layer_tensor(const m2d_model *m, int layer, void (*fn)(const m2d_model *, const m2d_tensor *, void *),
                             void *ctx) {
    const m2d_layer *L = &m->layers[layer];
    for (int r = 0; r < M2D_T_COUNT; r++)
        if (L->w[r]) fn(m, L->w[r], ctx);
    for (int r = 0; r < M2D_X_COUNT && m->cfg.layer_is_moe[layer]; r++)
        for (int x = 0; L->x[r] && x < m->cfg.num_experts; x++) fn(m, L->x[r][x], ctx);
    for (int i = 0; i < m->n_claimed; i++)
        if (m->claimed[i].layer == layer) fn(m, m->claimed[i].t, ctx);
}

static void add_nbytes(const m2d_model *m, const m2d_tensor *t, void *ctx) {
    (void)m;
    *(size_t *)ctx += t->nbytes;
}

size_t m2d_model_layer_bytes(const m2d_model *m, int layer) {
    size_t b = 0;
    for_layer_tensor(m, layer, add_nbytes, &b);
    return b;
}

static void advise_tensor(const m2d_model *m, const m2d_tensor *t, void *ctx) {
    m2d_st_advise(m->st, t->data, t->nbytes, *(const m2d_st_advice *)ctx);
}

void m2d_model_advise_layer(const m2d_model *m, int layer, m2d_st_advice advice) {
    if (m->st) for_layer_tensor(m, layer, advise_tensor, &advice);
}

void m2d_model_close(m2d_model *m) {
    if (!m) return;
    if (m->layers)
        for (int l = 0; l < m->cfg.num_hidden_layers; l++)
            for (int r = 0; r < M2D_X_COUNT; r++) free(m->layers[l].x[r]);
    free(m->layers);
    for (int i = 0; i < m->n_owned; i++) {
        free((void *)m->owned[i]->name);
        free((void *)m->owned[i]->data);
        free(m->owned[i]);
    }
    free(m->owned);
    free(m->owned_layer);
    free(m->layer_ready);
    free(m->claimed);
    m2d_st_close(m->st);
    m2d_config_free(&m->cfg);
    free(m->config_text);
    free(m->dir);
    free(m);
}

static void model_identity(m2d_model *m, size_t config_len) {
    char config_hash[65];
    m2d_sha256_hex(m->config_text, config_len, config_hash);
    char *id = m2d_strfmt("model\nconfig.json %s\ntensors %s\n", config_hash, m->weights_hash);
    m2d_sha256_hex(id, strlen(id), m->model_hash);
    free(id);
}

static int open_model(const char *dir, int lazy, m2d_model **out) {
    *out = NULL;
    m2d_model *m = m2d_calloc(1, sizeof *m);
    m->dir = m2d_strdup(dir);
    char *path = m2d_path_join(dir, "config.json");
    size_t len = 0;
    m->config_text = m2d_read_file(path, &len);
    int rc = m->config_text ? m2d_config_parse(m->config_text, len, path, &m->cfg, &m->arch) : -1;
    free(path);
    if (rc != 0) goto fail;
    if (m2d_st_open(dir, &m->st) != 0) goto fail;
    m->layers = m2d_calloc((size_t)m->cfg.num_hidden_layers, sizeof *m->layers);
    if (bind_table(m) != 0) goto fail;
    if (m->arch->post_bind && m->arch->post_bind(m) != 0) goto fail;
    /* tensors the adapter did not bind would be silently ignored: refuse them */
    if (m2d_model_check_unused(m) != 0) goto fail;
    m2d_st_hash(m->st, M2D_ST_HASH_FULL_MAX, m->weights_hash);
    model_identity(m, len);
    for (int l = 0; !lazy && l < m->cfg.num_hidden_layers; l++)
        if (m2d_model_acquire_layer(m, l) != 0) goto fail;
    *out = m;
    return 0;
fail:
    m2d_model_close(m);
    return -1;
}

int m2d_model_open(const char *dir, m2d_model **out) { return open_model(dir, 0, out); }
int m2d_model_open_lazy(const char *dir, m2d_model **out) { return open_model(dir, 1, out); }

/* the deferred tensors of LAYER get buffers (ALLOC) or lose them. The tensors are the model's own
 * heap objects (m2d_model_new_deferred), so writing through the const model is writing to them. */
static void deferred_buffers(const m2d_model *m, int layer, int alloc) {
    for (int i = 0; i < m->n_owned; i++) {
        if (m->owned_layer[i] != layer) continue;
        m2d_tensor *t = m->owned[i];
        free((void *)t->data);
        t->data = alloc ? m2d_calloc(t->nbytes ? t->nbytes : 1, 1) : NULL;
    }
}

int m2d_model_acquire_layer(const m2d_model *m, int layer) {
    if (!m->layer_ready || m->layer_ready[layer]) return 0;
    deferred_buffers(m, layer, 1);
    if (m->arch->fill_layer(m, layer) != 0) {
        deferred_buffers(m, layer, 0);
        return -1;
    }
    m->layer_ready[layer] = 1;
    return 0;
}

void m2d_model_release_layer(const m2d_model *m, int layer) {
    if (!m->layer_ready || !m->layer_ready[layer]) return;
    deferred_buffers(m, layer, 0);
    m->layer_ready[layer] = 0;
}

/* Every checkpoint tensor must be one the adapter bound (an extra tensor usually means a
 * feature we do not implement, e.g. biases or shared experts). */
int m2d_model_check_unused(m2d_model *m) {
    int n = m2d_st_count(m->st);
    char *used = m2d_calloc((size_t)n + 1, 1);
    /* owned tensors (post_bind's) are not the checkpoint's: only stored ones are marked */
#define USE(p) do { int i_ = (p) ? m2d_st_index_of(m->st, (p)->name) : -1; \
                     if (i_ >= 0 && m2d_st_at(m->st, i_) == (p)) used[i_] = 1; } while (0)
    USE(m->embed);
    USE(m->final_norm);
    USE(m->lm_head);
    USE(m->lm_head_stored);
    for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
        const m2d_layer *L = &m->layers[l];
        for (int r = 0; r < M2D_T_COUNT; r++) USE(L->w[r]);
        for (int r = 0; r < M2D_X_COUNT; r++)
            for (int e = 0; L->x[r] && e < m->cfg.num_experts; e++) USE(L->x[r][e]);
    }
    for (int i = 0; i < m->n_claimed; i++) USE(m->claimed[i].t);
#undef USE
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++)
        if (!used[i]) {
            const m2d_tensor *t = m2d_st_at(m->st, i);
            rc = m2d_err1("%s: tensor '%s': not used by %s (unsupported feature or wrong architecture?)",
                         m2d_st_file_of(m->st, t->name), t->name, m->cfg.arch);
        }
    free(used);
    return rc;
}

/* ---------------------------------------------------------------- post_bind helpers */

const m2d_tensor *m2d_model_claim(m2d_model *m, const char *name, int layer, int part, int ndim, const int64_t *shape,
                                  unsigned dtypes) {
    const m2d_tensor *t = m2d_st_find(m->st, name);
    char ws[96], hs[96];
    format_dims(ndim, shape, ws, sizeof ws);
    if (!t) return m2d_err1("%s: tensor '%s': missing (expected shape %s)", m->dir, name, ws), NULL;
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = shape[i] < 0 || t->shape[i] == shape[i];
    if (!ok) {
        format_dims(t->ndim, t->shape, hs, sizeof hs);
        return m2d_err1("%s: tensor '%s': field 'shape': expected %s, found %s", m2d_st_file_of(m->st, name), name,
                        ws, hs), NULL;
    }
    unsigned ok_types = dtypes ? dtypes : (1u << M2D_F32) | (1u << M2D_BF16) | (1u << M2D_F16);
    if (!(ok_types & (1u << t->dtype)))
        return m2d_err1("%s: tensor '%s': field 'dtype': %s is not accepted by %s", m2d_st_file_of(m->st, name), name,
                        m2d_dtype_name(t->dtype), m->cfg.arch), NULL;
    if (m->n_claimed == m->cap_claimed) {
        m->cap_claimed = m->cap_claimed ? 2 * m->cap_claimed : 64;
        m->claimed = m2d_realloc(m->claimed, (size_t)m->cap_claimed * sizeof *m->claimed);
    }
    m->claimed[m->n_claimed++] = (struct m2d_claim){t, layer, part};
    return t;
}

m2d_tensor *m2d_model_new_tensor(m2d_model *m, const char *name, m2d_dtype dtype, int ndim, const int64_t *shape) {
    m2d_tensor *t = m2d_calloc(1, sizeof *t);
    t->name = m2d_strdup(name);
    t->dtype = dtype;
    t->ndim = ndim;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= (t->shape[i] = shape[i]);
    t->nbytes = (size_t)n * m2d_dtype_size(dtype);
    t->data = m2d_calloc(t->nbytes ? t->nbytes : 1, 1);
    if (m->n_owned == m->cap_owned) {
        m->cap_owned = m->cap_owned ? 2 * m->cap_owned : 64;
        m->owned = m2d_realloc(m->owned, (size_t)m->cap_owned * sizeof *m->owned);
        m->owned_layer = m2d_realloc(m->owned_layer, (size_t)m->cap_owned * sizeof *m->owned_layer);
    }
    m->owned_layer[m->n_owned] = -1;
    m->owned[m->n_owned++] = t;
    return t;
}

m2d_tensor *m2d_model_new_deferred(m2d_model *m, const char *name, m2d_dtype dtype, int ndim, const int64_t *shape,
                                   int layer) {
    m2d_tensor *t = m2d_model_new_tensor(m, name, dtype, ndim, shape);
    free((void *)t->data);
    t->data = NULL;
    m->owned_layer[m->n_owned - 1] = layer;
    if (!m->layer_ready) m->layer_ready = m2d_calloc((size_t)m->cfg.num_hidden_layers, 1);
    return t;
}

/* ---------------------------------------------------------------- parameter counts */

m2d_param_counts m2d_model_param_counts(const m2d_config *c) {
    const m2d_arch *a = m2d_arch_find(c->arch);
    if (a && a->param_counts) return a->param_counts(c);
    return m2d_param_counts_table(a, c);
}

static int64_t spec_numel(const m2d_tensor_spec *sp, const m2d_config *c) {
    int64_t n = m2d_dim_value(c, sp->shape[0]);
    return sp->shape[1] == M2D_DIM_NONE ? n : n * m2d_dim_value(c, sp->shape[1]);
}

/* Elements of the table entries of SCOPE in one layer (EXPERT: per expert). */
static int64_t scope_numel(const m2d_arch *a, const m2d_config *c, m2d_scope scope) {
    int64_t n = 0;
    for (const m2d_tensor_spec *sp = a ? a->tensors : NULL; sp && sp->name; sp++)
        if (sp->scope == scope && spec_present(a, c, sp)) n += spec_numel(sp, c);
    return n;
}

m2d_param_counts m2d_param_counts_table(const m2d_arch *a, const m2d_config *c) {
    int64_t model = 0;
    for (const m2d_tensor_spec *sp = a ? a->tensors : NULL; sp && sp->name; sp++)
        if (sp->scope == M2D_SCOPE_MODEL && !(sp->role == M2D_M_LM_HEAD && c->tie_word_embeddings))
            model += spec_numel(sp, c);
    int64_t base = scope_numel(a, c, M2D_SCOPE_LAYER), dense = scope_numel(a, c, M2D_SCOPE_DENSE);
    int64_t router = scope_numel(a, c, M2D_SCOPE_MOE), expert = scope_numel(a, c, M2D_SCOPE_EXPERT);
    /* the dense student merges K selected experts into k groups, next to the shared experts: one
     * FFN width k * d_e + shared in every layer (the teacher's dense layers are zero-padded to it) */
    const m2d_arch *st = a && a->student ? m2d_arch_find(a->student) : NULL;
    m2d_config sc = *c;
    sc.intermediate_size = c->num_experts_per_tok * c->moe_intermediate_size + c->shared_expert_intermediate_size;
    int64_t student_ffn = scope_numel(st ? st : a, &sc, M2D_SCOPE_DENSE);
    int any_moe = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) any_moe |= c->layer_is_moe && c->layer_is_moe[l];
    m2d_param_counts p = {model, model, model};
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (c->layer_is_moe && c->layer_is_moe[l]) {
            p.total += base + router + expert * c->num_experts;
            p.active += base + router + expert * c->num_experts_per_tok;
        } else {
            p.total += base + dense;
            p.active += base + dense;
        }
        p.dense_student += base + (any_moe ? student_ffn : dense);
    }
    return p;
}

/* ---------------------------------------------------------------- student config */

/* The number literals of JSON TEXT in document order, onto the number nodes of its parse tree
 * (kept in their unused valuestring, which cJSON_Delete frees): N-th literal, N-th node. */
static const char *keep_literals(cJSON *node, const char *p) {
    for (; node; node = node->next) {
        if (cJSON_IsNumber(node)) {
            for (; *p && *p != '-' && (*p < '0' || *p > '9'); p++) /* the next number outside a string */
                if (*p == '"')
                    for (p++; *p && *p != '"'; p++) p += *p == '\\' && p[1];
            const char *q = p;
            while (*q && strchr("+-0123456789.eE", *q)) q++;
            node->valuestring = m2d_strfmt("%.*s", (int)(q - p), p);
            p = q;
        }
        p = keep_literals(node->child, p);
    }
    return p;
}

/* Numbers still holding the value of their literal print as written (7.0 stays 7.0: transformers'
 * strict config classes refuse an int where a float is declared); the others as cJSON prints them. */
static void restore_literals(cJSON *node) {
    for (; node; node = node->next) {
        if (cJSON_IsNumber(node) && node->valuestring) {
            if (strtod(node->valuestring, NULL) == node->valuedouble) node->type = cJSON_Raw;
            else free(node->valuestring), node->valuestring = NULL;
        }
        restore_literals(node->child);
    }
}

int m2d_arch_student_config(const m2d_model *t, const m2d_student_shape *s, char **json_out) {
    *json_out = NULL;
    const m2d_arch *a = t->arch;
    if (!a || !a->student_config || (!s->moe && !a->student))
        return m2d_err("%s: architecture %s declares no student to convert to", t->dir, t->cfg.arch);
    if (!t->config_text) return m2d_err("%s: the teacher's config.json text is not available", t->dir);
    cJSON *j = cJSON_Parse(t->config_text);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return m2d_err("%s/config.json: field '(root)': not a JSON object", t->dir);
    }
    keep_literals(j, t->config_text);
    char *path = m2d_path_join(t->dir, "config.json");
    m2d_student_shape sh = *s;
    sh.head_dim = t->cfg.head_dim, sh.num_key_value_heads = t->cfg.num_key_value_heads;
    int rc = a->student_config(j, &sh, path);
    free(path);
    restore_literals(j);
    if (rc == 0) *json_out = cJSON_Print(j);
    cJSON_Delete(j);
    return rc;
}
