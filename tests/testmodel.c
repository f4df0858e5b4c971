/* testmodel — random small Qwen3(-MoE) checkpoints for tests (see testmodel.h). */
#include "testmodel.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "io/st.h"
#include "base/util.h"
#include "model/model.h"

void m2d_testmodel_defaults(m2d_testmodel_opts *o) {
    memset(o, 0, sizeof *o);
    o->moe = true;
    o->vocab_size = 64;
    o->hidden_size = 32;
    o->num_hidden_layers = 2;
    o->num_attention_heads = 4;
    o->num_key_value_heads = 2;
    o->head_dim = 8;
    o->intermediate_size = 64;
    o->moe_intermediate_size = 16;
    o->num_experts = 8;
    o->num_experts_per_tok = 2;
    o->norm_topk_prob = true;
    o->decoder_sparse_step = 1;
    o->rope_theta = 10000.0;
    o->rms_norm_eps = 1e-6;
    o->max_position_embeddings = 128;
    o->bos_token_id = -1;
    o->eos_token_id = 63;
    o->dtype = M2D_BF16;
    o->init_std = 0.1f;
    o->seed = 1;
}

/* splitmix64 + Box-Muller: deterministic and platform independent */
static uint64_t next_u64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double next_normal(uint64_t *s) {
    double u1 = (double)(next_u64(s) >> 11) * 0x1.0p-53, u2 = (double)(next_u64(s) >> 11) * 0x1.0p-53;
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
}

/* the grid generator of testmodel.h */
static float grid_value(uint64_t x, int is_norm) {
    return is_norm ? 1.0f + (float)((int)(x >> 59) - 16) / 128.0f : (float)((int)(x >> 56) - 128) / 512.0f;
}

static uint64_t fnv1a64(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

void m2d_testmodel_grid(const char *name, uint64_t seed, int64_t n, float *out) {
    uint64_t state = seed ^ fnv1a64(name);
    size_t len = strlen(name);
    int is_norm = len >= 11 && strcmp(name + len - 11, "norm.weight") == 0;
    for (int64_t i = 0; i < n; i++) out[i] = grid_value(next_u64(&state), is_norm);
}

/* One tensor to generate at write time (the writer's fill callback): its values depend only on its
 * own start state, so the writer may ask for the tensors in any order and for any chunk. */
typedef struct tm_tensor {
    struct tm_tensor *next;
    m2d_dtype dtype;
    int is_norm, grid;
    float init_std;
    uint64_t state; /* the generator's state before the tensor's first element */
} tm_tensor;

/* The tensors of one write (freed with tm_free after it). */
typedef struct {
    tm_tensor *head;
    uint64_t draws; /* splitmix64 draws the normal generator has made so far (all tensors before) */
} tm_gen;

#define TM_GAMMA 0x9E3779B97F4A7C15ull /* splitmix64's increment: state after k draws = start + k * it */
#define TM_BLOCK 65536                 /* elements generated in fp32 per step of a fill */

/* The state element E starts from: a grid element takes one draw, a normal one two (Box-Muller). */
static uint64_t tm_state_at(const tm_tensor *t, int64_t e) {
    return t->state + (uint64_t)e * (t->grid ? 1u : 2u) * TM_GAMMA;
}

static int tm_fill(void *ctx, const char *name, size_t offset, void *buf, size_t n) {
    (void)name;
    const tm_tensor *t = ctx;
    size_t es = m2d_dtype_size(t->dtype);
    int64_t first = (int64_t)(offset / es), count = (int64_t)(n / es);
    float *v = m2d_malloc(sizeof(float) * (size_t)(count < TM_BLOCK ? (count ? count : 1) : TM_BLOCK));
    for (int64_t b = 0; b < count; b += TM_BLOCK) {
        int64_t m = count - b < TM_BLOCK ? count - b : TM_BLOCK;
        uint64_t st = tm_state_at(t, first + b);
        for (int64_t i = 0; i < m; i++)
            v[i] = t->grid ? grid_value(next_u64(&st), t->is_norm)
                           : t->is_norm ? (float)(1.0 + 0.1 * next_normal(&st)) : (float)(t->init_std * next_normal(&st));
        m2d_from_f32(t->dtype, v, m, (uint8_t *)buf + (size_t)b * es);
    }
    free(v);
    return 0;
}

static void tm_free(tm_gen *g) {
    while (g->head) {
        tm_tensor *t = g->head;
        g->head = t->next;
        free(t);
    }
}

/* Add tensor NAME of O's dtype to W, generated at write time: from the grid stream of its name, or
 * (o->grid false) from the one normal stream of the seed continued where the tensor before it ended,
 * as if all were drawn in the order they are added. */
static int add_random(m2d_st_writer *w, tm_gen *g, const m2d_testmodel_opts *o, const char *name, int ndim,
                      int64_t d0, int64_t d1, int is_norm) {
    int64_t shape[2] = {d0, d1}, n = ndim == 1 ? d0 : d0 * d1;
    tm_tensor *t = m2d_calloc(1, sizeof *t);
    *t = (tm_tensor){g->head, o->dtype, is_norm, o->grid, o->init_std,
                     o->grid ? o->seed ^ fnv1a64(name) : o->seed + g->draws * TM_GAMMA};
    g->head = t;
    if (!o->grid) g->draws += 2 * (uint64_t)n;
    if (o->dtype != M2D_F32 && o->dtype != M2D_F16 && o->dtype != M2D_BF16)
        return m2d_err("testmodel: tensor '%s': dtype must be F32, BF16 or F16", name);
    return m2d_st_writer_add_lazy(w, name, o->dtype, ndim, shape, tm_fill, t);
}

static bool layer_is_moe(const m2d_testmodel_opts *o, int l) {
    if (!o->moe || o->num_experts <= 0) return false;
    for (int i = 0; i < o->n_mlp_only_layers; i++)
        if (o->mlp_only_layers[i] == l) return false;
    return (l + 1) % (o->decoder_sparse_step > 0 ? o->decoder_sparse_step : 1) == 0;
}

static const char *torch_dtype_name(m2d_dtype t) {
    return t == M2D_BF16 ? "bfloat16" : t == M2D_F16 ? "float16" : "float32";
}

static char *config_json(const m2d_testmodel_opts *o) {
    char bos[16], eos[16], mlp_only[512] = "";
    snprintf(bos, sizeof bos, o->bos_token_id < 0 ? "null" : "%d", o->bos_token_id);
    snprintf(eos, sizeof eos, o->eos_token_id < 0 ? "null" : "%d", o->eos_token_id);
    size_t used = 0;
    for (int i = 0; i < o->n_mlp_only_layers && used < sizeof mlp_only; i++)
        used += (size_t)snprintf(mlp_only + used, sizeof mlp_only - used, "%s%d", i ? ", " : "", o->mlp_only_layers[i]);
    char *moe = o->moe ? m2d_strfmt("  \"moe_intermediate_size\": %d,\n  \"num_experts\": %d,\n"
                                    "  \"num_experts_per_tok\": %d,\n  \"norm_topk_prob\": %s,\n"
                                    "  \"decoder_sparse_step\": %d,\n  \"mlp_only_layers\": [%s],\n",
                                    o->moe_intermediate_size, o->num_experts, o->num_experts_per_tok,
                                    o->norm_topk_prob ? "true" : "false", o->decoder_sparse_step, mlp_only)
                       : m2d_strdup("");
    char *s = m2d_strfmt(
        "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n  \"vocab_size\": %d,\n"
        "  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n%s  \"num_hidden_layers\": %d,\n"
        "  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": %d,\n  \"head_dim\": %d,\n"
        "  \"hidden_act\": \"silu\",\n  \"rms_norm_eps\": %.17g,\n  \"rope_theta\": %.17g,\n"
        "  \"rope_scaling\": null,\n  \"max_position_embeddings\": %d,\n  \"attention_bias\": false,\n"
        "  \"tie_word_embeddings\": %s,\n  \"bos_token_id\": %s,\n  \"eos_token_id\": %s,\n"
        "  \"torch_dtype\": \"%s\",\n  \"use_sliding_window\": false\n}\n",
        o->arch ? o->arch : o->moe ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM",
        o->model_type ? o->model_type : o->moe ? "qwen3_moe" : "qwen3", o->vocab_size,
        o->hidden_size, o->intermediate_size, moe, o->num_hidden_layers, o->num_attention_heads,
        o->num_key_value_heads, o->head_dim, o->rms_norm_eps, o->rope_theta, o->max_position_embeddings,
        o->tie_word_embeddings ? "true" : "false", bos, eos, torch_dtype_name(o->dtype));
    free(moe);
    return s;
}

static int add_weights(m2d_st_writer *w, tm_gen *g, const m2d_testmodel_opts *o) {
    int64_t d = o->hidden_size, V = o->vocab_size, hd = o->head_dim;
    int64_t q = (int64_t)o->num_attention_heads * hd, kv = (int64_t)o->num_key_value_heads * hd;
    int64_t de = o->moe_intermediate_size, di = o->intermediate_size;
    char n[256];
#define ADD(nd, a, b, norm, ...) \
    do { snprintf(n, sizeof n, __VA_ARGS__); if (add_random(w, g, o, n, nd, a, b, norm) != 0) return -1; } while (0)
    ADD(2, V, d, 0, "model.embed_tokens.weight");
    ADD(1, d, 0, 1, "model.norm.weight");
    if (!o->tie_word_embeddings) ADD(2, V, d, 0, "lm_head.weight");
    for (int l = 0; l < o->num_hidden_layers; l++) {
        ADD(1, d, 0, 1, "model.layers.%d.input_layernorm.weight", l);
        ADD(1, d, 0, 1, "model.layers.%d.post_attention_layernorm.weight", l);
        ADD(2, q, d, 0, "model.layers.%d.self_attn.q_proj.weight", l);
        ADD(2, kv, d, 0, "model.layers.%d.self_attn.k_proj.weight", l);
        ADD(2, kv, d, 0, "model.layers.%d.self_attn.v_proj.weight", l);
        ADD(2, d, q, 0, "model.layers.%d.self_attn.o_proj.weight", l);
        ADD(1, o->qk_norm_whole ? q : hd, 0, 1, "model.layers.%d.self_attn.q_norm.weight", l);
        ADD(1, o->qk_norm_whole ? kv : hd, 0, 1, "model.layers.%d.self_attn.k_norm.weight", l);
        if (layer_is_moe(o, l)) {
            ADD(2, o->num_experts, d, 0, "model.layers.%d.mlp.gate.weight", l);
            for (int e = 0; e < o->num_experts; e++) {
                ADD(2, de, d, 0, "model.layers.%d.mlp.experts.%d.gate_proj.weight", l, e);
                ADD(2, de, d, 0, "model.layers.%d.mlp.experts.%d.up_proj.weight", l, e);
                ADD(2, d, de, 0, "model.layers.%d.mlp.experts.%d.down_proj.weight", l, e);
            }
        } else {
            ADD(2, di, d, 0, "model.layers.%d.mlp.gate_proj.weight", l);
            ADD(2, di, d, 0, "model.layers.%d.mlp.up_proj.weight", l);
            ADD(2, d, di, 0, "model.layers.%d.mlp.down_proj.weight", l);
        }
    }
#undef ADD
    return 0;
}

int m2d_testmodel_write(const char *dir, const m2d_testmodel_opts *o) {
    if (o->dtype != M2D_F32 && o->dtype != M2D_BF16 && o->dtype != M2D_F16)
        return m2d_err("testmodel: dtype must be F32, BF16 or F16");
    if (m2d_mkdir_p(dir) != 0) return -1;
    char *cfg = o->config_json ? m2d_strdup(o->config_json) : config_json(o), *cfg_path = m2d_path_join(dir, "config.json");
    int rc = m2d_write_file_atomic(cfg_path, cfg, strlen(cfg));
    free(cfg);
    free(cfg_path);
    if (rc != 0) return -1;
    m2d_st_writer *w = m2d_st_writer_new();
    m2d_st_writer_metadata(w, "format", "pt");
    tm_gen g = {0};
    rc = add_weights(w, &g, o);
    if (rc == 0) {
        if (o->shard_bytes) rc = m2d_st_writer_write_sharded(w, dir, o->shard_bytes, NULL);
        else {
            char *p = m2d_path_join(dir, "model.safetensors");
            rc = m2d_st_writer_write(w, p);
            free(p);
        }
    }
    m2d_st_writer_free(w);
    tm_free(&g);
    return rc;
}

int m2d_testmodel_write_grid(const char *dir, const char *config_json, uint64_t seed) {
    m2d_config c;
    if (m2d_config_parse(config_json, strlen(config_json), "config.json", &c, NULL) != 0) return -1;
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    o.moe = c.num_experts > 0;
    o.vocab_size = c.vocab_size, o.hidden_size = c.hidden_size, o.num_hidden_layers = c.num_hidden_layers;
    o.num_attention_heads = c.num_attention_heads, o.num_key_value_heads = c.num_key_value_heads;
    o.head_dim = c.head_dim, o.intermediate_size = c.intermediate_size;
    o.moe_intermediate_size = c.moe_intermediate_size, o.num_experts = c.num_experts;
    o.num_experts_per_tok = c.num_experts_per_tok, o.norm_topk_prob = c.norm_topk_prob;
    o.decoder_sparse_step = c.decoder_sparse_step;
    o.mlp_only_layers = c.mlp_only_layers, o.n_mlp_only_layers = c.n_mlp_only_layers;
    o.tie_word_embeddings = c.tie_word_embeddings, o.dtype = c.torch_dtype;
    o.grid = true, o.seed = seed, o.config_json = config_json;
    int rc = m2d_testmodel_write(dir, &o);
    m2d_config_free(&c);
    return rc;
}

int m2d_testmodel_write_tensors(const char *dir, const char *config_json, uint64_t seed, const m2d_testmodel_tensor *t,
                                int n) {
    if (m2d_mkdir_p(dir) != 0) return -1;
    char *cfg_path = m2d_path_join(dir, "config.json");
    int rc = m2d_write_file_atomic(cfg_path, config_json, strlen(config_json));
    free(cfg_path);
    if (rc != 0) return -1;
    m2d_st_writer *w = m2d_st_writer_new();
    m2d_st_writer_metadata(w, "format", "pt");
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    o.grid = true, o.seed = seed;
    tm_gen g = {0};
    for (int i = 0; i < n && rc == 0; i++) {
        size_t len = strlen(t[i].name);
        int is_norm = len >= 11 && strcmp(t[i].name + len - 11, "norm.weight") == 0;
        o.dtype = t[i].dtype;
        rc = add_random(w, &g, &o, t[i].name, t[i].ndim, t[i].shape[0], t[i].ndim > 1 ? t[i].shape[1] : 0, is_norm);
    }
    char *p = m2d_path_join(dir, "model.safetensors");
    if (rc == 0) rc = m2d_st_writer_write(w, p);
    free(p);
    m2d_st_writer_free(w);
    tm_free(&g);
    return rc;
}
