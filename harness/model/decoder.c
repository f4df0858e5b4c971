/* decoder — config fields every decoder family shares (see decoder.h). */
#include "model/decoder.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "base/util.h"
#include "io/st.h"

int m2d_decoder_reject_sliding(const void *json, const char *path) {
    bool b;
    if (m2d_cfg_bool(json, path, "use_sliding_window", 0, false, &b) != 0) return -1;
    if (b) return m2d_err1("%s: field 'use_sliding_window': true is not supported (full attention only)", path);
    /* newer transformers also write layer_types; only full attention is implemented */
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive((const cJSON *)json, "layer_types");
    if (lt && !cJSON_IsNull(lt)) {
        if (!cJSON_IsArray(lt)) return m2d_err1("%s: field 'layer_types': must be a list of strings", path);
        for (const cJSON *x = lt->child; x; x = x->next)
            if (!cJSON_IsString(x) || strcmp(x->valuestring, "full_attention") != 0)
                return m2d_err1("%s: field 'layer_types': only \"full_attention\" layers are supported", path);
    }
    return 0;
}

int m2d_decoder_reject_attention_bias(const void *json, const char *path, const char *family) {
    bool b;
    if (m2d_cfg_bool(json, path, "attention_bias", 0, false, &b) != 0) return -1;
    if (b) return m2d_err1("%s: field 'attention_bias': true is not supported (%s has no attention biases)", path, family);
    return 0;
}

static int parse_sizes(const void *json, const char *path, m2d_config *c) {
    if (m2d_cfg_pos_int(json, path, "vocab_size", 1, 0, &c->vocab_size) != 0 ||
        m2d_cfg_pos_int(json, path, "hidden_size", 1, 0, &c->hidden_size) != 0 ||
        m2d_cfg_pos_int(json, path, "num_hidden_layers", 1, 0, &c->num_hidden_layers) != 0 ||
        m2d_cfg_pos_int(json, path, "num_attention_heads", 1, 0, &c->num_attention_heads) != 0)
        return -1;
    /* HF: num_key_value_heads None -> num_attention_heads; head_dim absent -> hidden / heads */
    if (m2d_cfg_pos_int(json, path, "num_key_value_heads", 0, c->num_attention_heads, &c->num_key_value_heads) != 0)
        return -1;
    if (!m2d_cfg_has(json, "head_dim") && c->hidden_size % c->num_attention_heads != 0)
        return m2d_err1("%s: field 'head_dim': absent and hidden_size %d is not divisible by num_attention_heads %d",
                        path, c->hidden_size, c->num_attention_heads);
    return m2d_cfg_pos_int(json, path, "head_dim", 0, c->hidden_size / c->num_attention_heads, &c->head_dim);
}

/* limits far beyond any released model; they keep every parameter count below 2^60 */
static int check_limits(const m2d_config *c, const char *path) {
    if (m2d_cfg_check_max(path, "vocab_size", c->vocab_size, 1 << 24) != 0 ||
        m2d_cfg_check_max(path, "hidden_size", c->hidden_size, 1 << 16) != 0 ||
        m2d_cfg_check_max(path, "num_hidden_layers", c->num_hidden_layers, 1024) != 0 ||
        m2d_cfg_check_max(path, "num_attention_heads", c->num_attention_heads, 1024) != 0 ||
        m2d_cfg_check_max(path, "num_key_value_heads", c->num_key_value_heads, 1024) != 0 ||
        m2d_cfg_check_max(path, "head_dim", c->head_dim, M2D_MAX_HEAD_DIM) != 0)
        return -1;
    if (!(c->rms_norm_eps > 0)) return m2d_err1("%s: field 'rms_norm_eps': must be positive", path);
    return 0;
}

int m2d_decoder_parse(const void *json, const char *path, const m2d_decoder_defaults *d, m2d_config *c) {
    const char *mt, *act;
    if (m2d_cfg_str(json, path, "hidden_act", 0, "silu", &act) != 0) return -1;
    if (strcmp(act, "silu") != 0)
        return m2d_err1("%s: field 'hidden_act': '%s' is not supported (only silu)", path, act);
    if (m2d_cfg_str(json, path, "model_type", 0, "", &mt) != 0) return -1;
    snprintf(c->model_type, sizeof c->model_type, "%s", mt);
    if (parse_sizes(json, path, c) != 0 ||
        m2d_cfg_pos_int(json, path, "max_position_embeddings", 0, d->max_position_embeddings,
                        &c->max_position_embeddings) != 0 ||
        m2d_rope_parse(json, path, d->rope_theta, c->max_position_embeddings, &c->rope_theta, &c->rope_scaling) != 0 ||
        m2d_cfg_double(json, path, "rms_norm_eps", 0, d->rms_norm_eps, &c->rms_norm_eps) != 0 ||
        m2d_cfg_bool(json, path, "tie_word_embeddings", 0, false, &c->tie_word_embeddings) != 0 ||
        m2d_cfg_int_or_null(json, path, "bos_token_id", &c->bos_token_id) != 0 ||
        m2d_cfg_int_or_null(json, path, "eos_token_id", &c->eos_token_id) != 0 ||
        m2d_cfg_torch_dtype(json, path, &c->torch_dtype) != 0 || check_limits(c, path) != 0)
        return -1;
    c->ops = (m2d_layer_ops){.qk_norm = M2D_QK_NORM_NONE, .router = M2D_ROUTER_SOFTMAX_TOPK,
                             .router_renorm = false, .ffn_act = M2D_ACT_SWIGLU, .rope = M2D_ROPE_NEOX};
    return 0;
}

int m2d_decoder_check(const m2d_config *c, const char *path) {
    if (c->num_attention_heads % c->num_key_value_heads != 0)
        return m2d_err1("%s: field 'num_key_value_heads': %d does not divide num_attention_heads %d", path,
                        c->num_key_value_heads, c->num_attention_heads);
    if (c->bos_token_id >= c->vocab_size)
        return m2d_err1("%s: field 'bos_token_id': %d outside the vocabulary (%d)", path, c->bos_token_id, c->vocab_size);
    if (c->eos_token_id >= c->vocab_size)
        return m2d_err1("%s: field 'eos_token_id': %d outside the vocabulary (%d)", path, c->eos_token_id, c->vocab_size);
    bool any_dense = false;
    for (int l = 0; l < c->num_hidden_layers; l++) any_dense |= !c->layer_is_moe[l];
    if (any_dense && c->intermediate_size <= 0)
        return m2d_err1("%s: field 'intermediate_size': missing or not positive, but some layers are dense", path);
    return 0;
}

void m2d_json_set_number(void *json, const char *key, double v) {
    cJSON_DeleteItemFromObject(json, key);
    cJSON_AddNumberToObject(json, key, v);
}

void m2d_json_set_string(void *json, const char *key, const char *v) {
    cJSON_DeleteItemFromObject(json, key);
    cJSON_AddStringToObject(json, key, v);
}

void m2d_json_set_arch(void *json, const char *arch, const char *model_type) {
    cJSON *a = cJSON_CreateStringArray((const char *[]){arch}, 1);
    if (!cJSON_ReplaceItemInObject(json, "architectures", a)) cJSON_AddItemToObject(json, "architectures", a);
    m2d_json_set_string(json, "model_type", model_type);
}

void m2d_json_drop(void *json, const char *const *keys) {
    for (; *keys; keys++) cJSON_DeleteItemFromObject(json, *keys);
}
