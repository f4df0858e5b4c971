/* inspect — what a checkpoint is: architecture, sizes, parameter counts, dtypes, shards;
 * opening it validates every expected tensor (presence, shape, dtype) and every header. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "sweep/sweep.h"
#include "cli/cmd.h"
#include "model/model.h"
#include "base/util.h"

#define INSPECT_USAGE                                                                                   \
    "usage: moe2dense inspect --model DIR [--json] [--tensors]\n"                                       \
    "       moe2dense inspect --model FILE.safetensors [--json] [--tensors]\n"                             \
    "\n"                                                                                                \
    "Opens a Hugging Face checkpoint directory (config.json + model.safetensors, or shards with\n"      \
    "model.safetensors.index.json), validates every safetensors header and every tensor the\n"          \
    "architecture expects (name, shape, dtype; unknown extra tensors are errors) and that every\n"     \
    "float value is finite (a NaN or infinity is an error naming the tensor), and prints:\n"           \
    "architecture and every config field that changes the computation, which layers are MoE,\n"         \
    "parameter counts (total; active per token incl. embeddings and routers; the dense student's\n"     \
    "size for K in {k, 2k, 4k, 8k, E}), tensors per dtype, shards, the weights hash and the model\n"   \
    "hash (config.json and tensors: what statistics, caches and runs are keyed by).\n"                  \
    "\n"                                                                                                \
    "The dense student merges the K selected experts of each MoE layer into k groups of width\n"        \
    "d_e (+ the layer's shared experts), so its FFN width is k*d_e (+ shared) whatever K is: its\n"   \
    "size is the same for every K (K changes\n"                                                        \
    "which experts are merged, not how many parameters result). It is printed per K anyway.\n"          \
    "\n"                                                                                                \
    "options:\n"                                                                                        \
    "  --model DIR   checkpoint directory (required)\n"                                                 \
    "  --json        print one JSON object instead of text\n"                                           \
    "  --tensors     also list every tensor: name, dtype, shape, shard\n"                                \
    "\n"                                                                                                \
    "Given a single .safetensors file (or an index.json) instead of a directory, only the\n"          \
    "safetensors layer is validated and summarised (no config, no architecture).\n"                  \
    "\n"                                                                                                \
    "Supported architectures are listed by an unknown one's error; exit status 1 on any invalid\n"     \
    "input, with one line naming the file and the field.\n"                                             \
    "\n"                                                                                                \
    "example: moe2dense inspect --model ../shared/models/tiny-qwen3moe\n"

/* 14206912 -> "14,206,912" */
static const char *commas(int64_t v, char *buf, size_t n) {
    char tmp[32];
    snprintf(tmp, sizeof tmp, "%lld", (long long)(v < 0 ? -v : v));
    size_t len = strlen(tmp), o = 0;
    if (v < 0 && o + 1 < n) buf[o++] = '-';
    for (size_t i = 0; i < len && o + 2 < n; i++) {
        if (i && (len - i) % 3 == 0) buf[o++] = ',';
        buf[o++] = tmp[i];
    }
    buf[o] = 0;
    return buf;
}

/* K values {k, 2k, 4k, 8k, E}, capped at E, ascending and without repeats. */
static int k_values(const m2d_config *c, int *out) {
    int n = 0, cand[5] = {c->num_experts_per_tok, 2 * c->num_experts_per_tok, 4 * c->num_experts_per_tok,
                          8 * c->num_experts_per_tok, c->num_experts};
    for (int i = 0; i < 5; i++)
        if (cand[i] <= c->num_experts && (n == 0 || cand[i] > out[n - 1])) out[n++] = cand[i];
    return n;
}

static int count_moe(const m2d_config *c) {
    int n = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) n += c->layer_is_moe[l];
    return n;
}

static void dtype_counts(const m2d_st *st, int counts[M2D_DTYPE_COUNT]) {
    memset(counts, 0, sizeof(int) * M2D_DTYPE_COUNT);
    for (int i = 0; i < m2d_st_count(st); i++) counts[m2d_st_at(st, i)->dtype]++;
}

static void shape_str(const m2d_tensor *t, char *buf, size_t n) {
    size_t used = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < t->ndim && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (used < n) snprintf(buf + used, n - used, "]");
}

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static void print_tensor_table(const m2d_st *st) {
    char sh[96];
    for (int i = 0; i < m2d_st_count(st); i++) {
        const m2d_tensor *t = m2d_st_at(st, i);
        shape_str(t, sh, sizeof sh);
        printf("  %-56s %-5s %-16s %s\n", t->name, m2d_dtype_name(t->dtype), sh, base_name(m2d_st_file_of(st, t->name)));
    }
}

static cJSON *tensor_list_json(const m2d_st *st) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < m2d_st_count(st); i++) {
        const m2d_tensor *t = m2d_st_at(st, i);
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "name", t->name);
        cJSON_AddStringToObject(e, "dtype", m2d_dtype_name(t->dtype));
        cJSON *sh = cJSON_AddArrayToObject(e, "shape");
        for (int d = 0; d < t->ndim; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->shape[d]));
        cJSON_AddStringToObject(e, "file", base_name(m2d_st_file_of(st, t->name)));
        cJSON_AddItemToArray(a, e);
    }
    return a;
}

/* A bare safetensors file (or index): header validation and a summary, no architecture. */
static int inspect_st_only(const char *path, int json, int tensors) {
    m2d_st *st;
    if (m2d_st_open(path, &st) != 0) return -1;
    if (m2d_st_check_finite(st)) {
        m2d_st_close(st);
        return -1;
    }
    int counts[M2D_DTYPE_COUNT];
    memset(counts, 0, sizeof counts);
    uint64_t bytes = 0, elems = 0;
    for (int i = 0; i < m2d_st_count(st); i++) {
        const m2d_tensor *t = m2d_st_at(st, i);
        counts[t->dtype]++;
        bytes += t->nbytes;
        elems += (uint64_t)m2d_tensor_numel(t);
    }
    char hash[65];
    m2d_st_hash(st, M2D_ST_HASH_FULL_MAX, hash);
    if (json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "file", path);
        cJSON_AddNumberToObject(j, "tensors", m2d_st_count(st));
        cJSON_AddNumberToObject(j, "elements", (double)elems);
        cJSON_AddNumberToObject(j, "bytes", (double)bytes);
        cJSON *dt = cJSON_AddObjectToObject(j, "dtypes");
        for (int t = 0; t < M2D_DTYPE_COUNT; t++)
            if (counts[t]) cJSON_AddNumberToObject(dt, m2d_dtype_name((m2d_dtype)t), counts[t]);
        cJSON_AddNumberToObject(j, "shards", m2d_st_file_count(st));
        cJSON_AddBoolToObject(j, "valid", 1);
        cJSON_AddStringToObject(j, "weights_hash", hash);
        if (tensors) cJSON_AddItemToObject(j, "tensor_list", tensor_list_json(st));
        char *s = cJSON_Print(j);
        puts(s);
        free(s);
        cJSON_Delete(j);
    } else {
        char be[32], bb[32];
        printf("file           %s (safetensors only: no config.json, architecture not checked)\n", path);
        printf("tensors        %d, %s elements, %s bytes, headers valid\n", m2d_st_count(st),
               commas((int64_t)elems, be, sizeof be), commas((int64_t)bytes, bb, sizeof bb));
        printf("dtypes        ");
        for (int t = 0; t < M2D_DTYPE_COUNT; t++)
            if (counts[t]) printf(" %s %d", m2d_dtype_name((m2d_dtype)t), counts[t]);
        printf("\nshards         %d\n", m2d_st_file_count(st));
        printf("weights_hash   %s\n", hash);
        if (tensors) print_tensor_table(st);
    }
    m2d_st_close(st);
    return 0;
}

/* the per-family features that change the computation, printed only when the model has them:
 * RoPE scaling, windows, attention biases and sinks, latent attention, shared experts (and
 * Qwen2-MoE's gate), group-limited routing and a gate factor, the clamped SwiGLU, quantisation */
static void print_variants(const m2d_model *m) {
    const m2d_config *c = &m->cfg;
    const m2d_rope_scaling *rs = &c->rope_scaling;
    if (rs->kind == M2D_ROPE_SCALING_YARN)
        printf("rope scaling   yarn, factor %g over %d original positions\n", rs->factor, rs->original_max_position_embeddings);
    else if (rs->kind == M2D_ROPE_SCALING_LINEAR) printf("rope scaling   linear, factor %g\n", rs->factor);
    if (c->layer_window) {
        printf("windows       ");
        for (int l = 0; l < c->num_hidden_layers; l++)
            c->layer_window[l] ? printf(" %d:sliding %d", l, c->layer_window[l]) : printf(" %d:full", l);
        printf("\n");
    }
    const m2d_layer *L = &m->layers[0];
    if (L->q_bias || L->sinks)
        printf("attention +    %s%s\n", L->q_bias ? "q/k/v/o biases" : "", L->sinks ? (L->q_bias ? ", learned sinks per head" : "learned sinks per head") : "");
    if (c->ops.attn == M2D_ATTN_MLA)
        printf("latent attn    q_lora_rank %d, kv_lora_rank %d, heads of %d + %d rope dims, values %d, scale %.6g\n",
               c->q_lora_rank, c->kv_lora_rank, c->qk_nope_head_dim, c->rope_dim, c->v_head_dim, c->attn_scale);
    const m2d_layer *M = NULL;
    for (int l = 0; l < c->num_hidden_layers && !M; l++)
        if (c->layer_is_moe[l]) M = &m->layers[l];
    if (c->shared_expert_intermediate_size)
        printf("shared experts width %d per MoE layer, always on%s\n", c->shared_expert_intermediate_size,
               M && M->shared_expert_gate ? ", times sigmoid(shared_expert_gate . x)" : "");
    if (c->n_group) printf("routing        group-limited: the top-%d of %d expert groups\n", c->topk_group, c->n_group);
    if (c->routed_scaling_factor && c->routed_scaling_factor != 1)
        printf("gate factor    routed_scaling_factor %g\n", c->routed_scaling_factor);
    if (c->ops.ffn_act == M2D_ACT_SWIGLU_CLAMP)
        printf("activation     clamped SwiGLU (u + 1) g sigmoid(%g g), limit %g; expert and router biases\n",
               c->ops.act_alpha, c->ops.act_limit);
    if (c->quant_method[0]) printf("quantization   %s experts, dequantised exactly to bf16 on load\n", c->quant_method);
}

/* the dense student's width and parameters for every K of the sweep's defaults */
static void print_student(const m2d_config *c, const m2d_param_counts *p) {
    char b1[32];
    if (c->num_experts > 0) {
        int ks[5], nk = k_values(c, ks);
        int kd = c->num_experts_per_tok * c->moe_intermediate_size, sh = c->shared_expert_intermediate_size;
        if (sh)
            printf("dense student  FFN width k*d_e + shared = %d*%d + %d = %d in every layer, no router;\n",
                   c->num_experts_per_tok, c->moe_intermediate_size, sh, kd + sh);
        else
            printf("dense student  FFN width k*d_e = %d*%d = %d in every MoE layer, no router;\n",
                   c->num_experts_per_tok, c->moe_intermediate_size, kd);
        printf("               same size for every K (K picks which experts merge into the k groups)\n");
        for (int i = 0; i < nk; i++) printf("               K=%-4d %s\n", ks[i], commas(p->dense_student, b1, sizeof b1));
        /* the paper's Table 18 and the model cards count active parameters without the input
         * embedding (a lookup, not a matmul) */
        int64_t embed = (int64_t)c->vocab_size * c->hidden_size;
        char b2[32];
        printf("               without the input embedding: active %s, dense student %s\n",
               commas(p->active - embed, b1, sizeof b1), commas(p->dense_student - embed, b2, sizeof b2));
    } else {
        printf("dense student  n/a (already dense)\n");
    }
}

/* what is stored: dtypes, shards, tensors, the weights' hash and the model's */
static void print_storage(const m2d_model *m) {
    int counts[M2D_DTYPE_COUNT];
    dtype_counts(m->st, counts);
    printf("dtypes        ");
    for (int t = 0; t < M2D_DTYPE_COUNT; t++)
        if (counts[t]) printf(" %s %d", m2d_dtype_name((m2d_dtype)t), counts[t]);
    printf("\n");
    printf("shards         %d\n", m2d_st_file_count(m->st));
    printf("tensors        %d, all present with expected shapes\n", m2d_st_count(m->st));
    printf("weights_hash   %s\n", m->weights_hash);
    printf("model_hash     %s   (config.json and tensors: what statistics and runs are keyed by)\n", m->model_hash);
}

static void print_text(const m2d_model *m) {
    const m2d_config *c = &m->cfg;
    m2d_param_counts p = m2d_model_param_counts(c);
    char b1[32];
    int nmoe = count_moe(c);
    printf("model          %s\n", m->dir);
    printf("architecture   %s (model_type %s)\n", c->arch, c->model_type[0] ? c->model_type : "-");
    printf("layers         %d (%d MoE, %d dense)", c->num_hidden_layers, nmoe, c->num_hidden_layers - nmoe);
    if (nmoe && nmoe < c->num_hidden_layers) {
        printf("; MoE layers:");
        for (int l = 0; l < c->num_hidden_layers; l++)
            if (c->layer_is_moe[l]) printf(" %d", l);
    }
    printf("\n");
    printf("hidden_size    %d\n", c->hidden_size);
    printf("attention      %d query / %d kv heads x head_dim %d, rope_theta %g, rms_norm_eps %g\n",
           c->num_attention_heads, c->num_key_value_heads, c->head_dim, c->rope_theta, c->rms_norm_eps);
    print_variants(m);
    if (c->num_experts > 0) {
        printf("experts        %d routed, top-%d, norm_topk_prob %s, expert width d_e %d\n", c->num_experts,
               c->num_experts_per_tok, c->norm_topk_prob ? "true" : "false", c->moe_intermediate_size);
        printf("sparse rule    decoder_sparse_step %d, mlp_only_layers [", c->decoder_sparse_step);
        for (int i = 0; i < c->n_mlp_only_layers; i++) printf("%s%d", i ? ", " : "", c->mlp_only_layers[i]);
        printf("]\n");
    }
    if (c->intermediate_size > 0) printf("dense FFN      intermediate_size %d\n", c->intermediate_size);
    printf("vocabulary     %d, tie_word_embeddings %s, bos %d, eos %d (-1: none)\n", c->vocab_size,
           c->tie_word_embeddings ? "true" : "false", c->bos_token_id, c->eos_token_id);
    printf("context        max_position_embeddings %d\n", c->max_position_embeddings);
    if (c->num_experts > 0) { /* a sweep's peak memory at the default calibration window, dense student */
        m2d_run_shape rs;
        m2d_run_memory mem;
        m2d_run_shape_from_config(c, &rs);
        int L = M2D_MIN(2048, c->max_position_embeddings > 0 ? c->max_position_embeddings : 2048);
        m2d_run_memory_estimate(&rs, L, 0, m2d_default_threads(), &mem); /* calibrate's default threads */
        printf("sweep memory   ");
        m2d_run_memory_print(&mem, stdout);
        char t[32];
        m2d_fmt_duration(m2d_run_calib_seconds(&rs, 32.0 * L), t, sizeof t);
        printf("calibrate time ~%s for calibrate's default 32 x %d tokens (FLOP estimate at 20 GFLOP/s per core, "
               "every expert on every token; rough)%s\n", t, L, mem.layer_major ? ", plus one read of the weights" : "");
    }
    printf("torch_dtype    %s (stored tensors: see dtypes)\n", m2d_dtype_name(c->torch_dtype));
    printf("parameters     total %s\n", commas(p.total, b1, sizeof b1));
    char how[64] = "dense: every parameter"; /* a dense model routes nothing */
    if (c->num_experts > 0)
        snprintf(how, sizeof how, "top-%d experts, incl. embeddings and routers", c->num_experts_per_tok);
    printf("               active per token %s (%s)\n", commas(p.active, b1, sizeof b1), how);
    print_student(c, &p);
    print_storage(m);
}

static cJSON *config_json(const m2d_config *c) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "vocab_size", c->vocab_size);
    cJSON_AddNumberToObject(j, "hidden_size", c->hidden_size);
    cJSON_AddNumberToObject(j, "intermediate_size", c->intermediate_size);
    cJSON_AddNumberToObject(j, "moe_intermediate_size", c->moe_intermediate_size);
    cJSON_AddNumberToObject(j, "num_experts", c->num_experts);
    cJSON_AddNumberToObject(j, "num_experts_per_tok", c->num_experts_per_tok);
    cJSON_AddNumberToObject(j, "shared_expert_intermediate_size", c->shared_expert_intermediate_size);
    cJSON_AddBoolToObject(j, "norm_topk_prob", c->norm_topk_prob);
    cJSON_AddNumberToObject(j, "decoder_sparse_step", c->decoder_sparse_step);
    cJSON *mo = cJSON_AddArrayToObject(j, "mlp_only_layers");
    for (int i = 0; i < c->n_mlp_only_layers; i++) cJSON_AddItemToArray(mo, cJSON_CreateNumber(c->mlp_only_layers[i]));
    cJSON_AddNumberToObject(j, "num_hidden_layers", c->num_hidden_layers);
    cJSON_AddNumberToObject(j, "num_attention_heads", c->num_attention_heads);
    cJSON_AddNumberToObject(j, "num_key_value_heads", c->num_key_value_heads);
    cJSON_AddNumberToObject(j, "head_dim", c->head_dim);
    cJSON_AddNumberToObject(j, "rope_theta", c->rope_theta);
    cJSON_AddNumberToObject(j, "rms_norm_eps", c->rms_norm_eps);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", c->tie_word_embeddings);
    cJSON_AddNumberToObject(j, "max_position_embeddings", c->max_position_embeddings);
    if (c->bos_token_id >= 0) cJSON_AddNumberToObject(j, "bos_token_id", c->bos_token_id);
    else cJSON_AddNullToObject(j, "bos_token_id");
    if (c->eos_token_id >= 0) cJSON_AddNumberToObject(j, "eos_token_id", c->eos_token_id);
    else cJSON_AddNullToObject(j, "eos_token_id");
    cJSON_AddStringToObject(j, "torch_dtype", c->torch_dtype == M2D_BF16  ? "bfloat16"
                                              : c->torch_dtype == M2D_F16 ? "float16"
                                                                          : "float32");
    return j;
}

static void print_json(const m2d_model *m, int tensors) {
    const m2d_config *c = &m->cfg;
    m2d_param_counts p = m2d_model_param_counts(c);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model", m->dir);
    cJSON_AddStringToObject(j, "architecture", c->arch);
    cJSON_AddStringToObject(j, "model_type", c->model_type);
    cJSON_AddItemToObject(j, "config", config_json(c));
    cJSON *moe = cJSON_AddArrayToObject(j, "moe_layers");
    for (int l = 0; l < c->num_hidden_layers; l++)
        if (c->layer_is_moe[l]) cJSON_AddItemToArray(moe, cJSON_CreateNumber(l));
    cJSON *pj = cJSON_AddObjectToObject(j, "parameters");
    cJSON_AddNumberToObject(pj, "total", (double)p.total);
    cJSON_AddNumberToObject(pj, "active_per_token", (double)p.active);
    cJSON *ds = cJSON_AddArrayToObject(pj, "dense_student");
    int ks[5], nk = c->num_experts > 0 ? k_values(c, ks) : 0;
    for (int i = 0; i < nk; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "K", ks[i]);
        cJSON_AddNumberToObject(e, "params", (double)p.dense_student);
        cJSON_AddNumberToObject(e, "ffn_width", (double)c->num_experts_per_tok * c->moe_intermediate_size);
        cJSON_AddItemToArray(ds, e);
    }
    int counts[M2D_DTYPE_COUNT];
    dtype_counts(m->st, counts);
    cJSON *dt = cJSON_AddObjectToObject(j, "dtypes");
    for (int t = 0; t < M2D_DTYPE_COUNT; t++)
        if (counts[t]) cJSON_AddNumberToObject(dt, m2d_dtype_name((m2d_dtype)t), counts[t]);
    cJSON_AddNumberToObject(j, "shards", m2d_st_file_count(m->st));
    cJSON_AddNumberToObject(j, "tensors", m2d_st_count(m->st));
    cJSON_AddBoolToObject(j, "valid", 1);
    cJSON_AddStringToObject(j, "weights_hash", m->weights_hash);
    cJSON_AddStringToObject(j, "model_hash", m->model_hash);
    if (tensors) cJSON_AddItemToObject(j, "tensor_list", tensor_list_json(m->st));
    char *s = cJSON_Print(j);
    puts(s);
    free(s);
    cJSON_Delete(j);
}

static int cmd_inspect_run(int argc, char **argv) {
    const char *model = NULL;
    int json = 0, tensors = 0;
    m2d_opt opts[] = {{"--model", 1, &model, NULL}, {"--json", 0, NULL, &json}, {"--tensors", 0, NULL, &tensors}, {0}};
    if (m2d_parse_opts("inspect", argc, argv, opts, NULL, 0, NULL) != 0) return m2d_cmd_fail("inspect");
    if (!model) {
        m2d_err("inspect: option '--model' is required (see 'moe2dense help inspect')");
        return m2d_cmd_fail("inspect");
    }
    struct stat sb;
    if (stat(model, &sb) == 0 && !S_ISDIR(sb.st_mode))
        return inspect_st_only(model, json, tensors) == 0 ? 0 : m2d_cmd_fail("inspect");
    m2d_model *m;
    if (m2d_model_open(model, &m) != 0) return m2d_cmd_fail("inspect");
    if (m2d_st_check_finite(m->st)) {
        m2d_model_close(m);
        return m2d_cmd_fail("inspect");
    }
    if (json) print_json(m, tensors);
    else {
        print_text(m);
        if (tensors) print_tensor_table(m->st);
    }
    m2d_model_close(m);
    return 0;
}

M2D_COMMAND(inspect, "inspect", "validate a checkpoint and print its architecture, sizes and parameter counts",
            INSPECT_USAGE, cmd_inspect_run)
