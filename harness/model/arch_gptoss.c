/* arch_gptoss — GptOssForCausalLM, following transformers' modeling_gpt_oss.py and
 * integrations/mxfp4.py exactly:
 *  - attention: q/k/v/o with biases, a learned sink logit per head (in every softmax denominator),
 *    sliding-window (layer_types "sliding_attention", window sliding_window) or full attention per
 *    layer, RoPE rotate-half with YaRN (GptOssConfig's default rope when config.json names none);
 *  - experts: fused gate_up [E, d, 2·d_e] with gate and up interleaved (columns 2j, 2j + 1), down
 *    [E, d_e, d], biases on both; the clamped SwiGLU (u + 1) · g · sigmoid(alpha g) with
 *    g = min(gate, limit), u = clamp(up, ±limit) (swiglu_alpha 1.702, swiglu_limit 7.0);
 *  - router: logits with a bias, top-k of the logits, gates = softmax over those k;
 *  - storage: the experts unquantised (bf16/f32 as above) or MXFP4 (quantization_config
 *    quant_method "mxfp4": NAME_blocks [E, rows, cols/32, 16] + NAME_scales [E, rows, cols/32] of
 *    each matrix in nn.Linear [out, in] layout, io/mxfp4.h). The post_bind hook makes per-expert
 *    role tensors owned by the model, deferred: fill_layer splits and transposes (or dequantises,
 *    to bf16: exact) one layer's experts into them, 2 bytes per expert weight (GPT-OSS-20B: ~38 GB
 *    for every layer at once with m2d_model_open; one layer at a time, ~1.6 GB, with
 *    m2d_model_open_lazy in a layer-major pass).
 * Student (SPEC §4, paper §4.6): a GptOssForCausalLM with one expert of width k·d_e routed top-1.
 * A softmax over one logit is exactly 1, so such a model is the dense FFN it holds: this adapter
 * parses num_local_experts = num_experts_per_tok = 1 as dense layers (the router, zero, is read
 * and not used), and writes the dense layers back in that form (write_ffn), experts unquantised in
 * the teacher's expert dtype (bf16 for an MXFP4 teacher), without quantization_config. */
#include <cjson/cJSON.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "io/mxfp4.h"
#include "model/decoder.h"
#include "model/rope.h"

static const m2d_decoder_defaults GPTOSS = {.rope_theta = 150000.0, .rms_norm_eps = 1e-5, .max_position_embeddings = 131072};

/* layer_types (absent: GptOssConfig's default, sliding on even layers) onto cfg->layer_window */
static int parse_layer_types(const void *json, const char *path, m2d_config *c) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive((const cJSON *)json, "sliding_window"), *lt;
    if (v && cJSON_IsNull(v)) c->sliding_window = 0;
    else if (m2d_cfg_pos_int(json, path, "sliding_window", 0, 128, &c->sliding_window) != 0) return -1;
    int L = c->num_hidden_layers;
    c->layer_window = m2d_calloc((size_t)L, sizeof(int));
    lt = cJSON_GetObjectItemCaseSensitive((const cJSON *)json, "layer_types");
    if (lt && !cJSON_IsNull(lt) && (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != L))
        return m2d_err1("%s: field 'layer_types': must be a list of %d strings (one per layer)", path, L);
    const cJSON *x = lt && !cJSON_IsNull(lt) ? lt->child : NULL;
    for (int l = 0; l < L; l++, x = x ? x->next : NULL) {
        const char *t = x ? (cJSON_IsString(x) ? x->valuestring : "") : (l % 2 == 0 ? "sliding_attention" : "full_attention");
        if (strcmp(t, "sliding_attention") == 0) c->layer_window[l] = c->sliding_window;
        else if (strcmp(t, "full_attention") != 0)
            return m2d_err1("%s: field 'layer_types': element %d must be \"sliding_attention\" or \"full_attention\"", path, l);
        if (strcmp(t, "sliding_attention") == 0 && c->sliding_window == 0)
            return m2d_err1("%s: field 'sliding_window': null, but layer %d is a sliding_attention layer", path, l);
    }
    return 0;
}

/* RoPE: as config.json says; with neither rope_scaling nor rope_parameters GptOssConfig's default
 * (yarn, factor 32 over 4096 positions, beta_fast 32, beta_slow 1, truncate false) */
static int parse_rope_default(const void *json, m2d_config *c) {
    if (m2d_rope_scaling_given(json) || m2d_cfg_has(json, "rope_parameters")) return 0;
    c->rope_scaling = (m2d_rope_scaling){.kind = M2D_ROPE_SCALING_YARN, .factor = 32.0,
                                         .original_max_position_embeddings = 4096, .beta_fast = 32.0,
                                         .beta_slow = 1.0, .truncate = false};
    return 0;
}

/* quantization_config: absent, or MXFP4 */
static int parse_quant(const void *json, const char *path, m2d_config *c) {
    const cJSON *q = cJSON_GetObjectItemCaseSensitive((const cJSON *)json, "quantization_config");
    if (!q || cJSON_IsNull(q)) return 0;
    const char *method;
    if (!cJSON_IsObject(q)) return m2d_err1("%s: field 'quantization_config': must be an object", path);
    if (m2d_cfg_str(q, path, "quant_method", 1, NULL, &method) != 0) return -1;
    if (strcmp(method, "mxfp4") != 0)
        return m2d_err1("%s: field 'quantization_config': quant_method '%s' is not supported (mxfp4)", path, method);
    snprintf(c->quant_method, sizeof c->quant_method, "%s", method);
    return 0;
}

static int parse_experts(const void *json, const char *path, m2d_config *c) {
    int E, k, de;
    double alpha, limit;
    if (m2d_cfg_num_experts(json, path, &E) != 0 || m2d_cfg_pos_int(json, path, "num_experts_per_tok", 0, 4, &k) != 0 ||
        m2d_cfg_pos_int(json, path, "intermediate_size", 1, 0, &de) != 0 ||
        m2d_cfg_double(json, path, "swiglu_alpha", 0, 1.702, &alpha) != 0 ||
        m2d_cfg_double(json, path, "swiglu_limit", 0, 7.0, &limit) != 0)
        return -1;
    if (m2d_cfg_check_max(path, "num_local_experts", E, 4096) != 0 ||
        m2d_cfg_check_max(path, "intermediate_size", de, 1 << 20) != 0)
        return -1;
    if (k > E) return m2d_err1("%s: field 'num_experts_per_tok': %d exceeds num_local_experts %d", path, k, E);
    /* both are used as floats: beyond FLT_MAX they become inf (alpha = inf gives 0 * inf = NaN) */
    if (!(limit > 0) || !isfinite((float)limit))
        return m2d_err1("%s: field 'swiglu_limit': must be positive and at most %g", path, FLT_MAX);
    if (!(alpha > 0) || !isfinite((float)alpha))
        return m2d_err1("%s: field 'swiglu_alpha': must be positive and at most %g (GPT-OSS: 1.702)", path, FLT_MAX);
    c->ops.act_alpha = (float)alpha, c->ops.act_limit = (float)limit;
    if (E == 1 && k == 1) { /* the dense student: one expert, weight exactly 1 */
        c->intermediate_size = de;
        return 0;
    }
    c->num_experts = E, c->num_experts_per_tok = k, c->moe_intermediate_size = de;
    c->norm_topk_prob = true; /* softmax over the k selected logits = the renormalised full softmax */
    return 0;
}

static int gptoss_parse(const void *json, const char *path, m2d_config *c) {
    bool bias;
    if (m2d_decoder_parse(json, path, &GPTOSS, c) != 0 || parse_rope_default(json, c) != 0 ||
        parse_layer_types(json, path, c) != 0 || parse_quant(json, path, c) != 0 || parse_experts(json, path, c) != 0 ||
        m2d_cfg_bool(json, path, "attention_bias", 0, true, &bias) != 0)
        return -1;
    if (!bias) return m2d_err1("%s: field 'attention_bias': false is not supported (GPT-OSS has attention biases)", path);
    if (c->hidden_size % M2D_MXFP4_BLOCK || (c->moe_intermediate_size + c->intermediate_size) % M2D_MXFP4_BLOCK) {
        if (c->quant_method[0])
            return m2d_err1("%s: field 'hidden_size': %d and the expert width must be multiples of 32 for MXFP4", path,
                            c->hidden_size);
    }
    c->ops.qk_norm = M2D_QK_NORM_NONE, c->ops.router = M2D_ROUTER_TOPK_SOFTMAX, c->ops.router_renorm = true;
    c->ops.ffn_act = M2D_ACT_SWIGLU_CLAMP, c->ops.rope = M2D_ROPE_NEOX;
    c->decoder_sparse_step = 1;
    if (m2d_config_derive_layers(c, path) != 0) return -1;
    return m2d_decoder_check(c, path);
}

/* ---- the experts' stored layouts into per-expert role tensors ---- */

typedef struct {
    const m2d_model *m;
    int layer, E, de, d;
    m2d_dtype dt;            /* of the role tensors made */
    m2d_tensor **gate, **up, **down, **bg, **bu, **bd; /* [E] each */
} experts_out;

/* the stored tensors one layer's experts are read from (NULL where the storage has none) */
typedef struct {
    const m2d_tensor *gub, *db;          /* biases: gate_up [E, 2de] interleaved, down [E, d] */
    const m2d_tensor *gu, *dn;           /* unquantised: gate_up [E, d, 2de], down [E, de, d] */
    const m2d_tensor *gb, *gs, *dbk, *ds; /* MXFP4 blocks and scales of gate_up and down */
} experts_src;

static const char *const SRC_NAME[8] = {"gate_up_proj_bias", "down_proj_bias", "gate_up_proj", "down_proj",
                                        "gate_up_proj_blocks", "gate_up_proj_scales", "down_proj_blocks",
                                        "down_proj_scales"};

static char *xname(const experts_out *x, int e, const char *what) {
    return m2d_strfmt("model.layers.%d.mlp.experts[%d].%s", x->layer, e, what);
}

/* the role tensors, deferred: their values come when the layer is acquired (gptoss_fill_layer) */
static void make_tensors(m2d_model *m, experts_out *x, m2d_dtype bias_dt) {
    const char *nm[6] = {"gate_proj (from gate_up_proj)", "up_proj (from gate_up_proj)", "down_proj",
                         "gate_proj.bias", "up_proj.bias", "down_proj.bias"};
    m2d_tensor **arr[6] = {x->gate, x->up, x->down, x->bg, x->bu, x->bd};
    int64_t shp[6][2] = {{x->de, x->d}, {x->de, x->d}, {x->d, x->de}, {x->de, 0}, {x->de, 0}, {x->d, 0}};
    for (int e = 0; e < x->E; e++)
        for (int r = 0; r < 6; r++) {
            char *n = xname(x, e, nm[r]);
            arr[r][e] = m2d_model_new_deferred(m, n, r < 3 ? x->dt : bias_dt, r < 3 ? 2 : 1, shp[r], x->layer);
            free(n);
        }
}

/* unquantised: gate_up [E, d, 2de] -> gate/up [de, d] (columns 2j / 2j+1, transposed); down
 * [E, de, d] -> [d, de]; element bytes copied as stored */
static void split_unquantised(experts_out *x, const m2d_tensor *gu, const m2d_tensor *dn) {
    size_t es = m2d_dtype_size(gu->dtype);
    int d = x->d, de = x->de;
    for (int e = 0; e < x->E; e++) {
        const char *g0 = (const char *)gu->data + (size_t)e * d * 2 * de * es;
        const char *d0 = (const char *)dn->data + (size_t)e * de * d * es;
        char *g = (char *)x->gate[e]->data, *u = (char *)x->up[e]->data, *o = (char *)x->down[e]->data;
        for (int i = 0; i < d; i++)
            for (int j = 0; j < de; j++) {
                memcpy(g + ((size_t)j * d + i) * es, g0 + ((size_t)i * 2 * de + 2 * j) * es, es);
                memcpy(u + ((size_t)j * d + i) * es, g0 + ((size_t)i * 2 * de + 2 * j + 1) * es, es);
                memcpy(o + ((size_t)i * de + j) * es, d0 + ((size_t)j * d + i) * es, es);
            }
    }
}

/* MXFP4: rows of [E, R, C] dequantised (exact in bf16) into DST (rows of R, or only the rows
 * r0, r0 + step, ... when STEP 2: the interleaved gate/up) */
static int dequant_rows(const experts_out *x, const m2d_tensor *blk, const m2d_tensor *scl, int R, int C,
                        m2d_tensor **dst, int r0, int step) {
    float *row = m2d_malloc(sizeof(float) * (size_t)C);
    int rc = 0;
    for (int e = 0; e < x->E && rc == 0; e++)
        for (int r = r0; r < R && rc == 0; r += step) {
            size_t idx = (size_t)e * R + r;
            if (m2d_mxfp4_dequant_row((const uint8_t *)blk->data + idx * (C / 2),
                                      (const uint8_t *)scl->data + idx * (C / 32), C, row) != 0)
                rc = m2d_err1("%s: tensor '%s': field 'data': expert %d row %d dequantises to a non-finite value "
                              "(scale byte 255 or too large)", m2d_st_file_of(x->m->st, scl->name), scl->name, e, r);
            else
                m2d_from_f32(M2D_BF16, row, C, (char *)dst[e]->data + (size_t)(r / step) * C * 2);
        }
    free(row);
    return rc;
}

/* biases: gate_up [E, 2de] interleaved, down [E, d] (converted to the first's dtype by bytes) */
static void split_biases(experts_out *x, const m2d_tensor *gub, const m2d_tensor *db) {
    size_t es = m2d_dtype_size(gub->dtype), ds = m2d_dtype_size(db->dtype);
    for (int e = 0; e < x->E; e++) {
        const char *b = (const char *)gub->data + (size_t)e * 2 * x->de * es;
        for (int j = 0; j < x->de; j++) {
            memcpy((char *)x->bg[e]->data + j * es, b + (size_t)2 * j * es, es);
            memcpy((char *)x->bu[e]->data + j * es, b + (size_t)(2 * j + 1) * es, es);
        }
        memcpy((void *)x->bd[e]->data, (const char *)db->data + (size_t)e * x->d * ds, (size_t)x->d * ds);
    }
}

static const m2d_tensor *claim(m2d_model *m, int layer, const char *what, int ndim, const int64_t *shape,
                               unsigned dtypes) {
    char *n = m2d_strfmt("model.layers.%d.mlp.%s", layer, what);
    const m2d_tensor *t = m2d_model_claim(m, n, layer, M2D_PART_FFN, ndim, shape, dtypes);
    free(n);
    return t;
}

/* the stored experts of X->layer, claimed (shapes and dtypes checked at open); X->dt set */
static int claim_experts(m2d_model *m, experts_out *x) {
    int E = x->E, d = x->d, de = x->de, l = x->layer;
    const m2d_tensor *gub = claim(m, l, "experts.gate_up_proj_bias", 2, (int64_t[]){E, 2 * de}, 0);
    if (!gub || !claim(m, l, "experts.down_proj_bias", 2, (int64_t[]){E, d}, 1u << gub->dtype)) return -1;
    if (!m->cfg.quant_method[0]) {
        const m2d_tensor *gu = claim(m, l, "experts.gate_up_proj", 3, (int64_t[]){E, d, 2 * de}, 0);
        if (!gu || !claim(m, l, "experts.down_proj", 3, (int64_t[]){E, de, d}, 1u << gu->dtype)) return -1;
        x->dt = gu->dtype;
    } else {
        const unsigned u8 = 1u << M2D_U8;
        if (!claim(m, l, "experts.gate_up_proj_blocks", 4, (int64_t[]){E, 2 * de, d / 32, 16}, u8) ||
            !claim(m, l, "experts.gate_up_proj_scales", 3, (int64_t[]){E, 2 * de, d / 32}, u8) ||
            !claim(m, l, "experts.down_proj_blocks", 4, (int64_t[]){E, d, de / 32, 16}, u8) ||
            !claim(m, l, "experts.down_proj_scales", 3, (int64_t[]){E, d, de / 32}, u8))
            return -1;
        x->dt = M2D_BF16;
    }
    make_tensors(m, x, gub->dtype);
    return 0;
}

/* the stored tensors of LAYER's experts, claimed at open (each present for its storage) */
static experts_src sources_of(const m2d_model *m, int layer) {
    const m2d_tensor *t[8];
    for (int i = 0; i < 8; i++) {
        char *n = m2d_strfmt("model.layers.%d.mlp.experts.%s", layer, SRC_NAME[i]);
        t[i] = m2d_st_find(m->st, n);
        free(n);
    }
    return (experts_src){t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]};
}

/* the values of X's role tensors from the stored experts */
static int fill_experts(experts_out *x, const experts_src *s) {
    int d = x->d, de = x->de;
    if (!x->m->cfg.quant_method[0]) split_unquantised(x, s->gu, s->dn);
    else if (dequant_rows(x, s->gb, s->gs, 2 * de, d, x->gate, 0, 2) || dequant_rows(x, s->gb, s->gs, 2 * de, d, x->up, 1, 2) ||
             dequant_rows(x, s->dbk, s->ds, d, de, x->down, 0, 1))
        return -1;
    split_biases(x, s->gub, s->db);
    return 0;
}

/* LAYER's experts (E of them, one for the dense student) as X over the role arrays ARR [6][E] */
static experts_out layer_experts(const m2d_model *m, int layer, m2d_tensor **arr) {
    const m2d_config *c = &m->cfg;
    int moe = c->layer_is_moe[layer], E = moe ? c->num_experts : 1;
    experts_out x = {m, layer, E, moe ? c->moe_intermediate_size : c->intermediate_size, c->hidden_size, M2D_BF16,
                     NULL, NULL, NULL, NULL, NULL, NULL};
    x.gate = arr, x.up = arr + E, x.down = arr + 2 * E, x.bg = arr + 3 * E, x.bu = arr + 4 * E, x.bd = arr + 5 * E;
    return x;
}

static const int ROLES[6] = {M2D_X_EXP_GATE, M2D_X_EXP_UP, M2D_X_EXP_DOWN, M2D_X_EXP_GATE_BIAS, M2D_X_EXP_UP_BIAS,
                             M2D_X_EXP_DOWN_BIAS};

/* The layer's role tensors: made deferred here (the MXFP4 experts are dequantised one layer at a
 * time when acquired, m2d_model_open_lazy, or every layer at open, m2d_model_open). */
static int gptoss_post_bind(m2d_model *m) {
    const m2d_config *c = &m->cfg;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        m2d_layer *L = &m->layers[l];
        int moe = c->layer_is_moe[l], E = moe ? c->num_experts : 1;
        m2d_tensor **arr = m2d_calloc((size_t)6 * E, sizeof *arr);
        experts_out x = layer_experts(m, l, arr);
        int rc = claim_experts(m, &x);
        if (rc == 0 && moe) {
            for (int r = 0; r < 6; r++) {
                L->x[ROLES[r]] = m2d_malloc(sizeof(const m2d_tensor *) * (size_t)E);
                memcpy(L->x[ROLES[r]], arr + (size_t)r * E, sizeof(const m2d_tensor *) * (size_t)E);
            }
        } else if (rc == 0) { /* the one-expert student: a dense FFN; its router is read, never used */
            L->gate_proj = x.gate[0], L->up_proj = x.up[0], L->down_proj = x.down[0];
            L->gate_bias = x.bg[0], L->up_bias = x.bu[0], L->down_bias = x.bd[0];
            rc = claim(m, l, "router.weight", 2, (int64_t[]){1, c->hidden_size}, 0) &&
                         claim(m, l, "router.bias", 1, (int64_t[]){1}, 0)
                     ? 0 : -1;
        }
        free(arr);
        if (rc) return -1;
    }
    return 0;
}

/* The values of LAYER's role tensors (model.h fill_layer). They are the model's own deferred
 * tensors (m2d_model_new_deferred), writable: the casts drop the const of the layer's view. */
static int gptoss_fill_layer(const m2d_model *m, int layer) {
    const m2d_layer *L = &m->layers[layer];
    int moe = m->cfg.layer_is_moe[layer], E = moe ? m->cfg.num_experts : 1;
    m2d_tensor **arr = m2d_calloc((size_t)6 * E, sizeof *arr);
    const m2d_tensor *dense[6] = {L->gate_proj, L->up_proj, L->down_proj, L->gate_bias, L->up_bias, L->down_bias};
    for (int r = 0; r < 6; r++)
        for (int e = 0; e < E; e++) arr[(size_t)r * E + e] = (m2d_tensor *)(moe ? L->x[ROLES[r]][e] : dense[r]);
    experts_out x = layer_experts(m, layer, arr);
    experts_src src = sources_of(m, layer);
    int rc = fill_experts(&x, &src);
    free(arr);
    return rc;
}

/* ---- the student's FFN block as GPT-OSS stores it ---- */

typedef struct {
    int E, W, d;
    m2d_dtype dt, bdt;
    const m2d_tensor *const *gate, *const *up, *const *down, *const *bg, *const *bu, *const *bd; /* [E]; biases may be NULL */
} experts_in;

/* element I of T, or zero when T is NULL, as DT's bytes (same dtype: copied) */
static void put_elem(char *dst, m2d_dtype dt, const m2d_tensor *t, int64_t i) {
    size_t es = m2d_dtype_size(dt);
    if (!t) memset(dst, 0, es);
    else if (t->dtype == dt) memcpy(dst, (const char *)t->data + i * es, es);
    else {
        float f;
        m2d_to_f32(t->dtype, t->data, i, 1, &f);
        m2d_from_f32(dt, &f, 1, dst);
    }
}

static int add_fused(const experts_in *x, int layer, m2d_st_writer *w) {
    int E = x->E, W = x->W, d = x->d;
    size_t es = m2d_dtype_size(x->dt), bs = m2d_dtype_size(x->bdt);
    char *gu = m2d_malloc((size_t)E * d * 2 * W * es), *dn = m2d_malloc((size_t)E * W * d * es);
    char *gub = m2d_malloc((size_t)E * 2 * W * bs), *db = m2d_malloc((size_t)E * d * bs);
    for (int e = 0; e < E; e++) {
        for (int i = 0; i < d; i++)
            for (int j = 0; j < W; j++) {
                char *o = gu + (((size_t)e * d + i) * 2 * W + 2 * j) * es;
                put_elem(o, x->dt, x->gate[e], (int64_t)j * d + i);
                put_elem(o + es, x->dt, x->up[e], (int64_t)j * d + i);
                put_elem(dn + (((size_t)e * W + j) * d + i) * es, x->dt, x->down[e], (int64_t)i * W + j);
            }
        for (int j = 0; j < W; j++) {
            put_elem(gub + ((size_t)e * 2 * W + 2 * j) * bs, x->bdt, x->bg ? x->bg[e] : NULL, j);
            put_elem(gub + ((size_t)e * 2 * W + 2 * j + 1) * bs, x->bdt, x->bu ? x->bu[e] : NULL, j);
        }
        for (int i = 0; i < d; i++) put_elem(db + ((size_t)e * d + i) * bs, x->bdt, x->bd ? x->bd[e] : NULL, i);
    }
    char n[4][160];
    const char *sfx[4] = {"gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias"};
    for (int i = 0; i < 4; i++) snprintf(n[i], sizeof n[i], "model.layers.%d.mlp.experts.%s", layer, sfx[i]);
    int rc = m2d_st_writer_add(w, n[0], x->dt, 3, (int64_t[]){E, d, 2 * W}, gu) ||
             m2d_st_writer_add(w, n[1], x->bdt, 2, (int64_t[]){E, 2 * W}, gub) ||
             m2d_st_writer_add(w, n[2], x->dt, 3, (int64_t[]){E, W, d}, dn) ||
             m2d_st_writer_add(w, n[3], x->bdt, 2, (int64_t[]){E, d}, db)
                 ? -1 : 0;
    free(gu), free(dn), free(gub), free(db);
    return rc;
}

static int add_router(const m2d_tensor *wt, const m2d_tensor *b, int d, m2d_dtype dt, int layer,
                      m2d_st_writer *w) {
    char nw[160], nb[160];
    snprintf(nw, sizeof nw, "model.layers.%d.mlp.router.weight", layer);
    snprintf(nb, sizeof nb, "model.layers.%d.mlp.router.bias", layer);
    if (wt) { /* an MoE student's own router */
        if (m2d_st_writer_add(w, nw, wt->dtype, 2, wt->shape, wt->data)) return -1;
        return b ? m2d_st_writer_add(w, nb, b->dtype, 1, b->shape, b->data) : 0;
    }
    char *zero = m2d_calloc((size_t)d, m2d_dtype_size(dt)); /* one expert: any finite logit gives weight 1 */
    int rc = m2d_st_writer_add(w, nw, dt, 2, (int64_t[]){1, d}, zero) || m2d_st_writer_add(w, nb, dt, 1, (int64_t[]){1}, zero);
    free(zero);
    return rc ? -1 : 0;
}

static int gptoss_write_ffn(const m2d_model *s, int layer, m2d_st_writer *w) {
    const m2d_config *c = &s->cfg;
    const m2d_layer *L = &s->layers[layer];
    int moe = c->layer_is_moe[layer];
    experts_in x = {moe ? c->num_experts : 1, moe ? c->moe_intermediate_size : c->intermediate_size, c->hidden_size,
                    M2D_BF16, M2D_BF16, NULL, NULL, NULL, NULL, NULL, NULL};
    if (moe) {
        x.gate = L->exp_gate, x.up = L->exp_up, x.down = L->exp_down;
        x.bg = L->exp_gate_bias, x.bu = L->exp_up_bias, x.bd = L->exp_down_bias;
    } else {
        x.gate = &L->gate_proj, x.up = &L->up_proj, x.down = &L->down_proj;
        x.bg = L->gate_bias ? &L->gate_bias : NULL, x.bu = L->up_bias ? &L->up_bias : NULL;
        x.bd = L->down_bias ? &L->down_bias : NULL;
    }
    if (!x.gate || !x.gate[0]) return m2d_err("%s: layer %d: no FFN weights to write", s->dir, layer);
    x.dt = x.gate[0]->dtype;
    x.bdt = x.bg ? x.bg[0]->dtype : x.dt;
    return add_router(moe ? L->router : NULL, moe ? L->router_bias : NULL, x.d, x.bdt, layer, w) ||
                   add_fused(&x, layer, w)
               ? -1 : 0;
}

/* ---- student config and parameter counts ---- */

static int gptoss_student_config(void *json, const m2d_student_shape *s, const char *path) {
    cJSON *j = json;
    if (s->moe && s->n_experts == 1)
        return m2d_err1("%s: a GPT-OSS of one expert is the dense student: convert with --target dense", path);
    cJSON_DeleteItemFromObject(j, "quantization_config"); /* the student's experts are stored unquantised */
    cJSON_DeleteItemFromObject(j, "num_experts");
    cJSON_DeleteItemFromObject(j, "num_local_experts");
    cJSON_AddNumberToObject(j, "num_local_experts", s->moe ? s->n_experts : 1);
    cJSON_DeleteItemFromObject(j, "num_experts_per_tok");
    cJSON_AddNumberToObject(j, "num_experts_per_tok", s->moe ? s->top_k : 1);
    cJSON_DeleteItemFromObject(j, "experts_per_token"); /* the Hub config's alias, if present */
    if (!s->moe) {
        cJSON_DeleteItemFromObject(j, "intermediate_size");
        cJSON_AddNumberToObject(j, "intermediate_size", s->ffn_width);
    }
    return 0;
}

/* elements of one expert of width W (gate_up + biases, down + bias) and of a router of E experts */
static int64_t expert_numel(int64_t d, int64_t W) { return 3 * W * d + 2 * W + d; }

static m2d_param_counts gptoss_param_counts(const m2d_config *c) {
    int64_t d = c->hidden_size, V = c->vocab_size, q = (int64_t)c->num_attention_heads * c->head_dim;
    int64_t kv = (int64_t)c->num_key_value_heads * c->head_dim, E = c->num_experts, k = c->num_experts_per_tok;
    int64_t model = V * d * (c->tie_word_embeddings ? 1 : 2) + d;
    int64_t base = 2 * d + (q * d + q) + 2 * (kv * d + kv) + (d * q + d) + c->num_attention_heads;
    int64_t de = c->moe_intermediate_size, dense = expert_numel(d, c->intermediate_size) + d + 1;
    int64_t student = expert_numel(d, k * de) + d + 1; /* one expert of width k·d_e, its router */
    m2d_param_counts p = {model, model, model};
    for (int l = 0; l < c->num_hidden_layers; l++) {
        int moe = c->layer_is_moe[l];
        p.total += base + (moe ? E * expert_numel(d, de) + E * (d + 1) : dense);
        p.active += base + (moe ? k * expert_numel(d, de) + E * (d + 1) : dense);
        p.dense_student += base + (moe ? student : dense);
    }
    return p;
}

#define LAYER_ "model.layers.%d."
static const m2d_tensor_spec gptoss_tensors[] = {
    M2D_DECODER_TENSORS,
    M2D_DECODER_QKV_BIASES,
    {M2D_SCOPE_LAYER, M2D_T_O_BIAS, LAYER_ "self_attn.o_proj.bias", {M2D_DIM_HIDDEN, M2D_DIM_NONE}, 0},
    {M2D_SCOPE_LAYER, M2D_T_SINKS, LAYER_ "self_attn.sinks", {M2D_DIM_HEADS, M2D_DIM_NONE}, 0},
    {M2D_SCOPE_MOE, M2D_T_ROUTER, LAYER_ "mlp.router.weight", {M2D_DIM_EXPERTS, M2D_DIM_HIDDEN}, 0},
    {M2D_SCOPE_MOE, M2D_T_ROUTER_BIAS, LAYER_ "mlp.router.bias", {M2D_DIM_EXPERTS, M2D_DIM_NONE}, 0},
    {0}, /* the experts (and the one-expert student's FFN): gptoss_post_bind */
};
#undef LAYER_

M2D_ARCH(gptoss, .name = "GptOssForCausalLM",
         .summary = "GPT-OSS decoder (sinks, sliding/full layers, YaRN, biases, clamped SwiGLU experts, MXFP4)",
         .parse_config = gptoss_parse, .tensors = gptoss_tensors, .student = "GptOssForCausalLM",
         .student_config = gptoss_student_config, .param_counts = gptoss_param_counts,
         .post_bind = gptoss_post_bind, .fill_layer = gptoss_fill_layer, .write_ffn = gptoss_write_ffn, .family = "GPT-OSS")
