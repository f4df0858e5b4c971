/* model: config.json parsing, architecture adapters, model_open validation, parameter counts. */
#include "testutil.h"

#include <cjson/cJSON.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/model.h"
#include "testmodel.h"
#include "base/util.h"

static void tiny_teacher_opens(void **state) {
    (void)state;
    char *dir = tu_model_path("tiny-qwen3moe");
    if (!dir) TU_SKIP("../shared/models/tiny-qwen3moe not found");
    m2d_model *m;
    int rc = m2d_model_open(dir, &m);
    if (rc != 0) fail_msg("%s", m2d_errmsg());
    const m2d_config *c = &m->cfg;
    assert_string_equal(c->arch, "Qwen3MoeForCausalLM");
    assert_string_equal(c->model_type, "qwen3_moe");
    assert_int_equal(c->vocab_size, 8192);
    assert_int_equal(c->hidden_size, 192);
    assert_int_equal(c->intermediate_size, 576);
    assert_int_equal(c->moe_intermediate_size, 72);
    assert_int_equal(c->num_experts, 64);
    assert_int_equal(c->num_experts_per_tok, 8);
    assert_true(c->norm_topk_prob);
    assert_int_equal(c->decoder_sparse_step, 1);
    assert_int_equal(c->n_mlp_only_layers, 0);
    assert_int_equal(c->num_hidden_layers, 4);
    assert_int_equal(c->num_attention_heads, 6);
    assert_int_equal(c->num_key_value_heads, 2);
    assert_int_equal(c->head_dim, 32);
    assert_true(c->rope_theta == 10000.0);
    assert_true(c->rms_norm_eps == 1e-6);
    assert_false(c->tie_word_embeddings);
    assert_int_equal(c->max_position_embeddings, 512);
    assert_int_equal(c->bos_token_id, -1);
    assert_int_equal(c->eos_token_id, 8189);
    assert_int_equal(c->torch_dtype, M2D_BF16);
    for (int l = 0; l < 4; l++) {
        assert_true(c->layer_is_moe[l]);
        assert_non_null(m->layers[l].router);
        assert_int_equal(m->layers[l].router->shape[0], 64);
        assert_non_null(m->layers[l].exp_down[63]);
        assert_int_equal(m->layers[l].exp_down[63]->shape[1], 72);
        assert_null(m->layers[l].gate_proj);
    }
    assert_non_null(m->lm_head);
    assert_ptr_not_equal(m->lm_head, m->embed);
    assert_int_equal(strlen(m->weights_hash), 64);
    /* the README's numbers */
    m2d_param_counts p = m2d_model_param_counts(c);
    assert_int_equal(p.total, 14206912);
    assert_int_equal(p.active, 4917184);
    assert_int_equal(p.dense_student, 4868032);
    m2d_model_close(m);
    free(dir);
}

/* ---- small random checkpoints ---- */

static char *write_model(const m2d_testmodel_opts *o) {
    char *dir = tu_tmpdir();
    if (m2d_testmodel_write(dir, o) != 0) fail_msg("%s", m2d_errmsg());
    return dir;
}

static int64_t sum_numel(const m2d_model *m) {
    int64_t n = 0;
    for (int i = 0; i < m2d_st_count(m->st); i++) n += m2d_tensor_numel(m2d_st_at(m->st, i));
    return n;
}

static void open_ok(const char *dir, m2d_model **m) {
    if (m2d_model_open(dir, m) != 0) fail_msg("%s", m2d_errmsg());
}

/* Brute force: the parameter count equals the number of stored elements; active counts
 * k of E experts; the student replaces E experts + router by one FFN of width k*d_e. */
static void testmodel_counts_match_tensors(void **state) {
    (void)state;
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    char *dir = write_model(&o);
    m2d_model *m;
    open_ok(dir, &m);
    m2d_param_counts p = m2d_model_param_counts(&m->cfg);
    assert_int_equal(p.total, sum_numel(m));
    int64_t d = 32, de = 16, E = 8, k = 2, L = 2;
    assert_int_equal(p.active, p.total - L * (E - k) * 3 * d * de);
    assert_int_equal(p.dense_student, p.total - L * (E * 3 * d * de + E * d) + L * 3 * d * k * de);
    m2d_model_close(m);
    tu_rm_rf(dir);
    free(dir);
}

static void dense_tied_and_sharded(void **state) {
    (void)state;
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    o.moe = false;
    o.tie_word_embeddings = true;
    o.dtype = M2D_F32;
    o.shard_bytes = 20000;
    char *dir = write_model(&o);
    m2d_model *m;
    open_ok(dir, &m);
    assert_string_equal(m->cfg.arch, "Qwen3ForCausalLM");
    assert_int_equal(m->cfg.num_experts, 0);
    assert_ptr_equal(m->lm_head, m->embed);
    assert_true(m2d_st_file_count(m->st) > 1);
    for (int l = 0; l < 2; l++) {
        assert_false(m->cfg.layer_is_moe[l]);
        assert_non_null(m->layers[l].down_proj);
        assert_int_equal(m->layers[l].down_proj->shape[1], 64);
    }
    m2d_param_counts p = m2d_model_param_counts(&m->cfg);
    assert_int_equal(p.total, sum_numel(m));
    assert_int_equal(p.active, p.total);
    assert_int_equal(p.dense_student, p.total);
    m2d_model_close(m);
    tu_rm_rf(dir);
    free(dir);
}

/* HF rule: layer l is sparse iff l not in mlp_only_layers and (l + 1) % step == 0. */
static void sparse_step_and_mlp_only(void **state) {
    (void)state;
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    o.num_hidden_layers = 6;
    o.decoder_sparse_step = 2;
    int only[] = {3};
    o.mlp_only_layers = only;
    o.n_mlp_only_layers = 1;
    char *dir = write_model(&o);
    m2d_model *m;
    open_ok(dir, &m);
    bool want[6] = {false, true, false, false, false, true};
    for (int l = 0; l < 6; l++) {
        assert_int_equal(m->cfg.layer_is_moe[l], want[l]);
        assert_int_equal(m->layers[l].router != NULL, want[l]);
        assert_int_equal(m->layers[l].gate_proj != NULL, !want[l]);
    }
    m2d_param_counts p = m2d_model_param_counts(&m->cfg);
    assert_int_equal(p.total, sum_numel(m));
    m2d_model_close(m);
    tu_rm_rf(dir);
    free(dir);
}

/* A Qwen3-MoE config without head_dim (as transformers 5 saves one: Qwen3MoeConfig has no such
 * field) reads hidden / heads; its dense student is a Qwen3Config, whose absent head_dim is 128:
 * the student's config.json states the teacher's head_dim and num_key_value_heads. */
static void student_config_pins_attention_shape(void **state) {
    (void)state;
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    assert_int_equal(o.head_dim * o.num_attention_heads, o.hidden_size); /* derivable: may be left out */
    char *dir = write_model(&o), *cp = m2d_path_join(dir, "config.json");
    size_t n;
    char *text = m2d_read_file(cp, &n), *line = strstr(text, "\"head_dim\"");
    assert_non_null(line);
    char *eol = strchr(line, '\n');
    memmove(line, eol + 1, strlen(eol + 1) + 1);
    tu_write(cp, text, strlen(text));
    m2d_model *m;
    open_ok(dir, &m);
    assert_int_equal(m->cfg.head_dim, o.head_dim);
    char *js;
    m2d_student_shape sh = {.moe = 0, .ffn_width = 16};
    assert_int_equal(m2d_arch_student_config(m, &sh, &js), 0);
    cJSON *j = cJSON_Parse(js);
    assert_string_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "architectures"), 0)->valuestring, "Qwen3ForCausalLM");
    assert_int_equal(cJSON_GetObjectItem(j, "head_dim")->valueint, o.head_dim);
    assert_int_equal(cJSON_GetObjectItem(j, "num_key_value_heads")->valueint, o.num_key_value_heads);
    cJSON_Delete(j);
    free(js), free(text), free(cp);
    m2d_model_close(m);
    tu_rm_rf(dir);
    free(dir);
}

/* The same weights give the same hash whatever the sharding; one changed byte changes it. The
 * model hash (caches, statistics, runs) also changes with the config alone. */
static void weights_hash_identity(void **state) {
    (void)state;
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    char *a = write_model(&o);
    o.shard_bytes = 30000;
    char *b = write_model(&o);
    o.shard_bytes = 0;
    o.seed = 2;
    char *c = write_model(&o);
    m2d_model *ma, *mb, *mc;
    open_ok(a, &ma);
    open_ok(b, &mb);
    open_ok(c, &mc);
    assert_true(m2d_st_file_count(mb->st) > 1);
    assert_string_equal(ma->weights_hash, mb->weights_hash); /* hashes of the same tensor bytes, sharded or not: exact */
    assert_string_equal(ma->model_hash, mb->model_hash);
    assert_string_not_equal(ma->weights_hash, mc->weights_hash);
    assert_string_not_equal(ma->model_hash, mc->model_hash);
    o.seed = 1; /* a's weights (m2d_testmodel_defaults) */
    o.rms_norm_eps *= 10;
    char *d = write_model(&o);
    m2d_model *md;
    open_ok(d, &md);
    assert_string_equal(md->weights_hash, ma->weights_hash);
    assert_string_not_equal(md->model_hash, ma->model_hash);
    m2d_model_close(md);
    tu_rm_rf(d);
    free(d);
    /* sampled mode is deterministic and distinct from full mode */
    char s1[65], s2[65];
    m2d_st_hash(ma->st, 0, s1);
    m2d_st_hash(ma->st, 0, s2);
    assert_string_equal(s1, s2);
    assert_string_not_equal(s1, ma->weights_hash);
    m2d_model_close(ma);
    m2d_model_close(mb);
    m2d_model_close(mc);
    tu_rm_rf(a); tu_rm_rf(b); tu_rm_rf(c);
    free(a); free(b); free(c);
}

/* ---- bad inputs ---- */

/* Write a config edit into a fresh checkpoint; model_open must fail with all NEEDLES in the message. */
static void expect_config_error(const char *from, const char *to, const char *needle1, const char *needle2) {
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    char *dir = write_model(&o);
    char *cfg = m2d_path_join(dir, "config.json");
    tu_replace_in_file(cfg, from, to);
    m2d_model *m = (m2d_model *)0x1;
    m2d_err_clear();
    assert_int_equal(m2d_model_open(dir, &m), -1);
    assert_null(m);
    const char *msg = m2d_errmsg();
    if (!strstr(msg, "config.json") || !strstr(msg, needle1) || (needle2 && !strstr(msg, needle2)))
        fail_msg("edit '%s' -> '%s': unexpected message: %s", from, to, msg);
    m2d_config cfgv;
    assert_int_equal(m2d_config_load(dir, &cfgv, NULL), -1);
    tu_rm_rf(dir);
    free(cfg);
    free(dir);
}

static void bad_configs(void **state) {
    (void)state;
    expect_config_error("\"hidden_size\": 32,", "\"hidden_size\": 32", "(root)", "malformed");
    expect_config_error("Qwen3MoeForCausalLM", "FutureMoeForCausalLM", "FutureMoeForCausalLM", "Qwen3MoeForCausalLM");
    expect_config_error("Qwen3MoeForCausalLM", "FutureMoeForCausalLM", "Qwen3ForCausalLM", NULL);
    expect_config_error("\"hidden_size\": 32,", "", "'hidden_size'", "missing");
    expect_config_error("\"num_experts\": 8,", "", "'num_experts'", "missing");
    expect_config_error("\"hidden_size\": 32,", "\"hidden_size\": \"32\",", "'hidden_size'", "integer");
    expect_config_error("\"hidden_size\": 32,", "\"hidden_size\": 32.5,", "'hidden_size'", "integer");
    expect_config_error("\"norm_topk_prob\": true", "\"norm_topk_prob\": 1", "'norm_topk_prob'", "true or false");
    expect_config_error("\"rope_scaling\": null", "\"rope_scaling\": {\"type\": \"longrope\"}", "rope_scaling: field 'rope_type'",
                        "longrope");
    expect_config_error("\"rope_scaling\": null", "\"rope_scaling\": {\"type\": \"yarn\"}", "rope_scaling: field 'factor'",
                        "missing");
    expect_config_error("\"attention_bias\": false", "\"attention_bias\": true", "'attention_bias'", NULL);
    expect_config_error("\"use_sliding_window\": false", "\"use_sliding_window\": true", "'use_sliding_window'", NULL);
    expect_config_error("\"silu\"", "\"gelu\"", "'hidden_act'", "gelu");
    expect_config_error("\"mlp_only_layers\": []", "\"mlp_only_layers\": [7]", "'mlp_only_layers'", "range");
    expect_config_error("\"mlp_only_layers\": []", "\"mlp_only_layers\": 1", "'mlp_only_layers'", NULL);
    expect_config_error("\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 9", "'num_experts_per_tok'", NULL);
    expect_config_error("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3", "'num_key_value_heads'", NULL);
    expect_config_error("\"architectures\": [\"Qwen3MoeForCausalLM\"],", "", "'architectures'", "missing");
    expect_config_error("\"torch_dtype\": \"bfloat16\"", "\"torch_dtype\": \"int8\"", "'torch_dtype'", NULL);
    expect_config_error("\"eos_token_id\": 63", "\"eos_token_id\": 64", "'eos_token_id'", NULL);
    expect_config_error("\"use_sliding_window\": false",
                        "\"use_sliding_window\": false, \"layer_types\": [\"full_attention\", \"sliding_attention\"]",
                        "'layer_types'", NULL);
    expect_config_error("\"rope_theta\": 10000,", "\"rope_parameters\": {\"rope_type\": \"llama3\", \"factor\": 4},",
                        "rope_parameters: field 'rope_type'", "llama3");
    expect_config_error("{", "[", "(root)", NULL);
    expect_config_error("\"num_experts\": 8,", "\"num_experts\": 100000,", "'num_experts'", "supported maximum");
    expect_config_error("\"num_hidden_layers\": 2,", "\"num_hidden_layers\": 0,", "'num_hidden_layers'", "positive");
    /* transformers >= 5 spells it num_local_experts; both spellings must agree */
    expect_config_error("\"num_experts\": 8,", "\"num_experts\": 8, \"num_local_experts\": 6,", "'num_local_experts'",
                        "disagrees with num_experts 8");
    expect_config_error("\"num_experts\": 8,", "\"num_local_experts\": 0,", "'num_local_experts'", "positive");
    /* a list of token ids is range-checked like a single id (3e9 was cast to int: UB, INT_MIN) */
    expect_config_error("\"eos_token_id\": 63", "\"eos_token_id\": [3e9]", "'eos_token_id'", "out of range");
    expect_config_error("\"bos_token_id\": null", "\"bos_token_id\": [-3e9]", "'bos_token_id'", "out of range");
    expect_config_error("\"bos_token_id\": null", "\"bos_token_id\": [-1]", "'bos_token_id'", "token id");
    /* cJSON reads 1e999 as inf: refused, not used (ppl printed 8192) */
    expect_config_error("\"rms_norm_eps\": 9.9999999999999995e-07", "\"rms_norm_eps\": 1e999", "'rms_norm_eps'",
                        "must be a finite number");
    expect_config_error("\"rope_theta\": 10000,", "\"rope_theta\": -1e999,", "'rope_theta'", "finite");
    /* read as Python's json reads it, or refused: nothing after the object, no key twice */
    expect_config_error("\"hidden_size\": 32,", "\"hidden_size\": 32, \"x\": 1}{\"y\": 2,", "field '(root)'",
                        "unexpected byte 0x7b after the JSON value");
    expect_config_error("\"rope_theta\": 10000,", "\"rope_theta\": 10000, \"rope_theta\": 500000,",
                        "field '(root)': duplicate key 'rope_theta'", NULL);
    expect_config_error("\"rope_scaling\": null", "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 2, \"factor\": 4}",
                        "field 'rope_scaling': duplicate key 'factor'", NULL);
}

/* head_dim absent -> hidden / heads (HF default); list-valued eos takes the first id; the spelling
 * of transformers >= 5 (rope_parameters, num_local_experts). */
static void config_defaults(void **state) {
    (void)state;
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    char *dir = write_model(&o);
    char *cfg = m2d_path_join(dir, "config.json");
    tu_replace_in_file(cfg, "\"head_dim\": 8,", "");
    tu_replace_in_file(cfg, "\"eos_token_id\": 63", "\"eos_token_id\": [62, 63]");
    tu_replace_in_file(cfg, "\"decoder_sparse_step\": 1,", "");
    tu_replace_in_file(cfg, "\"rope_theta\": 10000,", "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 5e5},");
    tu_replace_in_file(cfg, "\"norm_topk_prob\": true,", ""); /* HF Qwen3MoeConfig default: false */
    tu_replace_in_file(cfg, "\"num_experts\": 8,", "\"num_local_experts\": 8,"); /* transformers >= 5 */
    m2d_config c;
    if (m2d_config_load(dir, &c, NULL) != 0) fail_msg("%s", m2d_errmsg());
    assert_int_equal(c.head_dim, 8);
    assert_int_equal(c.eos_token_id, 62);
    assert_int_equal(c.decoder_sparse_step, 1);
    assert_true(c.rope_theta == 5e5);
    assert_false(c.norm_topk_prob);
    assert_int_equal(c.num_experts, 8);
    m2d_config_free(&c);
    tu_rm_rf(dir);
    free(cfg);
    free(dir);
}

/* Rewrite DIR/model.safetensors without tensor DROP, and/or with tensor RESHAPE given a new shape. */
static const char *retype_name; /* tensor rewritten as I16-sized I32 pairs: same bytes, integer dtype */

static void rewrite_weights(const char *dir, const char *drop, const char *reshape, const char *extra) {
    m2d_st *st;
    if (m2d_st_open(dir, &st) != 0) fail_msg("%s", m2d_errmsg());
    m2d_st_writer *w = m2d_st_writer_new();
    for (int i = 0; i < m2d_st_count(st); i++) {
        const m2d_tensor *t = m2d_st_at(st, i);
        if (drop && strcmp(t->name, drop) == 0) continue;
        int64_t shape[M2D_MAX_DIMS];
        memcpy(shape, t->shape, sizeof shape);
        int nd = t->ndim;
        if (reshape && strcmp(t->name, reshape) == 0) { /* same bytes, transposed-looking shape */
            int64_t tmp = shape[0];
            shape[0] = shape[1];
            shape[1] = tmp;
        }
        m2d_dtype dt = t->dtype;
        if (retype_name && strcmp(t->name, retype_name) == 0) { /* BF16 [a, b] -> I32 [a, b/2] */
            dt = M2D_I32;
            shape[nd - 1] /= 2;
        }
        assert_int_equal(m2d_st_writer_add(w, t->name, dt, nd, shape, t->data), 0);
    }
    if (extra) {
        float z[4] = {0};
        int64_t s[1] = {4};
        assert_int_equal(m2d_st_writer_add_f32(w, extra, M2D_BF16, 1, s, z), 0);
    }
    char *p = m2d_path_join(dir, "model.safetensors");
    assert_int_equal(m2d_st_writer_write(w, p), 0);
    m2d_st_writer_free(w);
    m2d_st_close(st);
    free(p);
}

static void expect_weights_error(const char *drop, const char *reshape, const char *extra, const char *n1,
                                 const char *n2) {
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    char *dir = write_model(&o);
    rewrite_weights(dir, drop, reshape, extra);
    m2d_model *m;
    assert_int_equal(m2d_model_open(dir, &m), -1);
    const char *msg = m2d_errmsg();
    if (!strstr(msg, n1) || (n2 && !strstr(msg, n2))) fail_msg("unexpected message: %s", msg);
    tu_rm_rf(dir);
    free(dir);
}

static void bad_weights(void **state) {
    (void)state;
    expect_weights_error("model.layers.1.mlp.experts.7.up_proj.weight", NULL, NULL,
                         "'model.layers.1.mlp.experts.7.up_proj.weight': missing", "[16, 32]");
    expect_weights_error("lm_head.weight", NULL, NULL, "'lm_head.weight': missing", NULL);
    expect_weights_error("model.layers.0.self_attn.q_norm.weight", NULL, NULL, "q_norm.weight': missing", "[8]");
    expect_weights_error(NULL, "model.layers.0.mlp.gate.weight", NULL, "'model.layers.0.mlp.gate.weight'",
                         "expected [8, 32], found [32, 8]");
    expect_weights_error(NULL, NULL, "model.layers.0.mlp.shared_expert_gate.weight", "shared_expert_gate",
                         "not used");
    retype_name = "model.norm.weight";
    expect_weights_error(NULL, NULL, NULL, "'model.norm.weight'", "expected [32], found [16]");
    retype_name = "model.layers.0.self_attn.o_proj.weight"; /* [32, 32] BF16 -> [32, 16] I32 */
    expect_weights_error(NULL, NULL, NULL, "'model.layers.0.self_attn.o_proj.weight'", "expected [32, 32], found [32, 16]");
    retype_name = NULL;
}

/* Right shape, integer dtype: rejected by name. */
static void integer_weights_rejected(void **state) {
    (void)state;
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    o.dtype = M2D_F32;
    char *dir = write_model(&o);
    m2d_st *st;
    assert_int_equal(m2d_st_open(dir, &st), 0);
    m2d_st_writer *w = m2d_st_writer_new();
    for (int i = 0; i < m2d_st_count(st); i++) {
        const m2d_tensor *t = m2d_st_at(st, i);
        m2d_dtype dt = strcmp(t->name, "model.layers.1.mlp.gate.weight") == 0 ? M2D_I32 : t->dtype;
        assert_int_equal(m2d_st_writer_add(w, t->name, dt, t->ndim, t->shape, t->data), 0);
    }
    char *p = m2d_path_join(dir, "model.safetensors");
    assert_int_equal(m2d_st_writer_write(w, p), 0);
    m2d_st_writer_free(w);
    m2d_st_close(st);
    m2d_model *m;
    assert_int_equal(m2d_model_open(dir, &m), -1);
    assert_non_null(strstr(m2d_errmsg(), "'model.layers.1.mlp.gate.weight': field 'dtype': I32"));
    free(p);
    tu_rm_rf(dir);
    free(dir);
}

static void missing_files(void **state) {
    (void)state;
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    char *dir = write_model(&o);
    char *st = m2d_path_join(dir, "model.safetensors"), *cfg = m2d_path_join(dir, "config.json");
    m2d_model *m;
    unlink(st);
    assert_int_equal(m2d_model_open(dir, &m), -1);
    assert_non_null(strstr(m2d_errmsg(), "no model.safetensors"));
    unlink(cfg);
    assert_int_equal(m2d_model_open(dir, &m), -1);
    assert_non_null(strstr(m2d_errmsg(), "config.json"));
    assert_int_equal(m2d_model_open("/nonexistent/m2d-model", &m), -1);
    assert_non_null(strstr(m2d_errmsg(), "/nonexistent/m2d-model/config.json"));
    tu_rm_rf(dir);
    free(st);
    free(cfg);
    free(dir);
}

/* Qwen3-30B-A3B's published config.json (no weights needed). Independent reference for the
 * total: its model.safetensors.index.json says total_size 61064245248 bytes of BF16 = 30,532,122,624
 * parameters; the model card says 3.3B activated. */
static void qwen3_30b_a3b_counts(void **state) {
    (void)state;
    const char *cfg =
        "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,"
        " \"bos_token_id\": 151643, \"decoder_sparse_step\": 1, \"eos_token_id\": 151645, \"head_dim\": 128,"
        " \"hidden_act\": \"silu\", \"hidden_size\": 2048, \"initializer_range\": 0.02, \"intermediate_size\": 6144,"
        " \"max_position_embeddings\": 40960, \"max_window_layers\": 48, \"mlp_only_layers\": [],"
        " \"model_type\": \"qwen3_moe\", \"moe_intermediate_size\": 768, \"norm_topk_prob\": true,"
        " \"num_attention_heads\": 32, \"num_experts\": 128, \"num_experts_per_tok\": 8, \"num_hidden_layers\": 48,"
        " \"num_key_value_heads\": 4, \"output_router_logits\": false, \"rms_norm_eps\": 1e-06, \"rope_scaling\": null,"
        " \"rope_theta\": 1000000.0, \"router_aux_loss_coef\": 0.001, \"sliding_window\": null,"
        " \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.51.0\","
        " \"use_cache\": true, \"use_sliding_window\": false, \"vocab_size\": 151936}";
    m2d_config c;
    const m2d_arch *a;
    if (m2d_config_parse(cfg, strlen(cfg), "config.json", &c, &a) != 0) fail_msg("%s", m2d_errmsg());
    assert_string_equal(a->name, "Qwen3MoeForCausalLM");
    m2d_param_counts p = m2d_model_param_counts(&c);
    assert_int_equal(p.total, 61064245248LL / 2);
    assert_int_equal(p.active / 100000000, 33); /* the card's "3.3B" (3.35B, truncated) */
    assert_int_equal(p.active, 3353032704LL);
    /* dense student: 48 layers of FFN width 8 * 768 = 6144, no routers */
    int64_t attn = 2048LL * 4096 * 2 + 2048LL * 512 * 2 + 256 + 4096;
    assert_int_equal(p.dense_student, 2 * 151936LL * 2048 + 2048 + 48 * (attn + 3LL * 2048 * 6144));
    m2d_config_free(&c);
}

static void arch_registry(void **state) {
    (void)state;
    assert_non_null(m2d_arch_find("Qwen3MoeForCausalLM"));
    assert_non_null(m2d_arch_find("Qwen3ForCausalLM"));
    assert_null(m2d_arch_find("LlamaForCausalLM"));
    assert_true(m2d_arch_count() >= 2);
    assert_non_null(strstr(m2d_arch_list(), "Qwen3ForCausalLM, Qwen3MoeForCausalLM"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tiny_teacher_opens),
        cmocka_unit_test(testmodel_counts_match_tensors),
        cmocka_unit_test(dense_tied_and_sharded),
        cmocka_unit_test(sparse_step_and_mlp_only),
        cmocka_unit_test(student_config_pins_attention_shape),
        cmocka_unit_test(weights_hash_identity),
        cmocka_unit_test(bad_configs),
        cmocka_unit_test(config_defaults),
        cmocka_unit_test(bad_weights),
        cmocka_unit_test(integer_weights_rejected),
        cmocka_unit_test(missing_files),
        cmocka_unit_test(qwen3_30b_a3b_counts),
        cmocka_unit_test(arch_registry),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
