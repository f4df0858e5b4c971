/* inspect CLI: the tiny teacher's README numbers, JSON output, and bad inputs end in exit 1
 * with one line naming the file and field. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testmodel.h"
#include "base/util.h"

static int inspect(const char *args, char **out, char **err) {
    char *cmd = m2d_strfmt("'%s' inspect %s", tu_bin(), args);
    int rc = tu_run(cmd, out, err);
    free(cmd);
    return rc;
}

static void tiny_teacher_text(void **state) {
    (void)state;
    char *dir = tu_model_path("tiny-qwen3moe");
    if (!dir) TU_SKIP("tiny-qwen3moe not found");
    char *args = m2d_strfmt("--model '%s'", dir), *out, *err;
    int rc = inspect(args, &out, &err);
    if (rc != 0) fail_msg("rc %d: %s", rc, err);
    assert_non_null(strstr(out, "Qwen3MoeForCausalLM"));
    assert_non_null(strstr(out, "total 14,206,912"));
    assert_non_null(strstr(out, "active per token 4,917,184"));
    assert_non_null(strstr(out, "K=8    4,868,032"));
    assert_non_null(strstr(out, "K=64   4,868,032"));
    assert_non_null(strstr(out, "BF16 807"));
    assert_non_null(strstr(out, "shards         1"));
    assert_non_null(strstr(out, "64 routed, top-8"));
    /* README "Memory of a sweep": the teacher is its 14,206,912 bf16 parameters, 27.1 MiB */
    assert_non_null(strstr(out, "sweep memory   peak memory: ~"));
    assert_non_null(strstr(out, "(teacher 27.1 MiB mapped as stored"));
    assert_non_null(strstr(out, "calibrate time ~"));
    assert_string_equal(err, "");
    free(out); free(err); free(args); free(dir);
}

static void tiny_teacher_json(void **state) {
    (void)state;
    char *dir = tu_model_path("tiny-qwen3moe");
    if (!dir) TU_SKIP("tiny-qwen3moe not found");
    char *args = m2d_strfmt("--model '%s' --json", dir), *out, *err;
    int rc = inspect(args, &out, &err);
    if (rc != 0) fail_msg("rc %d: %s", rc, err);
    cJSON *j = cJSON_Parse(out);
    assert_non_null(j);
    const cJSON *p = cJSON_GetObjectItem(j, "parameters");
    assert_true(cJSON_GetObjectItem(p, "total")->valuedouble == 14206912);
    assert_true(cJSON_GetObjectItem(p, "active_per_token")->valuedouble == 4917184);
    const cJSON *ds = cJSON_GetObjectItem(p, "dense_student");
    assert_int_equal(cJSON_GetArraySize(ds), 4); /* K = 8, 16, 32, 64 (8k = 64 = E appears once) */
    int want_k[4] = {8, 16, 32, 64}, i = 0;
    for (const cJSON *e = ds->child; e; e = e->next, i++) {
        assert_int_equal((int)cJSON_GetObjectItem(e, "K")->valuedouble, want_k[i]);
        assert_true(cJSON_GetObjectItem(e, "params")->valuedouble == 4868032);
    }
    assert_true(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "dtypes"), "BF16")->valuedouble == 807);
    assert_true(cJSON_GetObjectItem(j, "shards")->valuedouble == 1);
    assert_string_equal(cJSON_GetObjectItem(j, "architecture")->valuestring, "Qwen3MoeForCausalLM");
    const cJSON *cfg = cJSON_GetObjectItem(j, "config");
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(cfg, "bos_token_id")));
    assert_true(cJSON_GetObjectItem(cfg, "eos_token_id")->valuedouble == 8189);
    assert_int_equal(strlen(cJSON_GetObjectItem(j, "weights_hash")->valuestring), 64);
    cJSON_Delete(j);
    free(out); free(err); free(args); free(dir);
}

/* A sharded dense model with mixed expectations: counts shards and dtypes; its text names no experts. */
static void sharded_dense(void **state) {
    (void)state;
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    o.moe = false;
    o.dtype = M2D_F16;
    o.shard_bytes = 8192;
    char *dir = tu_tmpdir();
    assert_int_equal(m2d_testmodel_write(dir, &o), 0);
    char *args = m2d_strfmt("--model '%s' --json", dir), *out, *err;
    int rc = inspect(args, &out, &err);
    if (rc != 0) fail_msg("rc %d: %s", rc, err);
    cJSON *j = cJSON_Parse(out);
    assert_non_null(j);
    assert_true(cJSON_GetObjectItem(j, "shards")->valuedouble > 1);
    assert_true(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "dtypes"), "F16")->valuedouble == 25); /* 3 + 2 layers x (8 attention/norm + 3 FFN) */
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "parameters"), "dense_student")), 0);
    cJSON_Delete(j);
    free(out); free(err); free(args);
    /* the text: no experts, so no "top-0 experts" (issue 30) */
    args = m2d_strfmt("--model '%s'", dir);
    rc = inspect(args, &out, &err);
    if (rc != 0) fail_msg("rc %d: %s", rc, err);
    assert_null(strstr(out, "top-0"));
    assert_non_null(strstr(out, "(dense: every parameter)"));
    assert_non_null(strstr(out, "dense student  n/a (already dense)"));
    free(out); free(err); free(args);
    tu_rm_rf(dir);
    free(dir);
}

/* Corrupt a fresh checkpoint with CORRUPT, run inspect, expect exit 1 and one stderr line with NEEDLE. */
static void expect_cli_error(void (*corrupt)(const char *dir), const char *needle) {
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    char *dir = tu_tmpdir();
    assert_int_equal(m2d_testmodel_write(dir, &o), 0);
    corrupt(dir);
    char *args = m2d_strfmt("--model '%s'", dir), *out, *err;
    int rc = inspect(args, &out, &err);
    assert_int_equal(rc, 1);
    assert_string_equal(out, "");
    if (!strstr(err, needle) || strncmp(err, "moe2dense inspect: ", 19) != 0 || strchr(err, '\n') != err + strlen(err) - 1)
        fail_msg("unexpected stderr: %s", err);
    free(out); free(err); free(args);
    tu_rm_rf(dir);
    free(dir);
}

static char *weights(const char *dir) { return m2d_path_join(dir, "model.safetensors"); }

static void truncate_weights(const char *dir) {
    char *p = weights(dir);
    assert_int_equal(truncate(p, 1000), 0);
    free(p);
}
static void garble_header(const char *dir) {
    char *p = weights(dir);
    FILE *f = fopen(p, "r+b");
    fseek(f, 8, SEEK_SET);
    fputs("{\"x\":", f);
    fclose(f);
    free(p);
}
static void huge_header_len(const char *dir) {
    char *p = weights(dir);
    FILE *f = fopen(p, "r+b");
    uint8_t b[8] = {0, 0, 0, 0, 1, 0, 0, 0};
    fwrite(b, 1, 8, f);
    fclose(f);
    free(p);
}
static void bad_json_config(const char *dir) {
    char *p = m2d_path_join(dir, "config.json");
    tu_replace_in_file(p, "{", "[");
    free(p);
}
static void unknown_arch(const char *dir) {
    char *p = m2d_path_join(dir, "config.json");
    tu_replace_in_file(p, "Qwen3MoeForCausalLM", "FutureMoeForCausalLM");
    free(p);
}
static void no_config(const char *dir) {
    char *p = m2d_path_join(dir, "config.json");
    unlink(p);
    free(p);
}
static void no_weights(const char *dir) {
    char *p = weights(dir);
    unlink(p);
    free(p);
}
static void wrong_shape_config(const char *dir) {
    char *p = m2d_path_join(dir, "config.json");
    tu_replace_in_file(p, "\"moe_intermediate_size\": 16", "\"moe_intermediate_size\": 17");
    free(p);
}

static void cli_bad_inputs(void **state) {
    (void)state;
    expect_cli_error(truncate_weights, "model.safetensors");
    expect_cli_error(garble_header, "field 'header'");
    expect_cli_error(huge_header_len, "field 'header length'");
    expect_cli_error(bad_json_config, "config.json: field '(root)'");
    expect_cli_error(unknown_arch, "unsupported architecture 'FutureMoeForCausalLM' (supported: ");
    expect_cli_error(no_config, "config.json: cannot open");
    expect_cli_error(no_weights, "no model.safetensors");
    expect_cli_error(wrong_shape_config, "expected [17, 32], found [16, 32]");
}

/* A bare .safetensors file: header-level summary; --tensors lists every tensor. */
static void safetensors_file_only(void **state) {
    (void)state;
    char *dir = tu_model_path("tiny-qwen3moe");
    if (!dir) TU_SKIP("tiny-qwen3moe not found");
    char *args = m2d_strfmt("--model '%s/model.safetensors' --tensors", dir), *out, *err;
    int rc = inspect(args, &out, &err);
    if (rc != 0) fail_msg("rc %d: %s", rc, err);
    assert_non_null(strstr(out, "807, 14,206,912 elements, 28,413,824 bytes"));
    assert_non_null(strstr(out, "model.layers.3.mlp.experts.63.down_proj.weight"));
    assert_non_null(strstr(out, "[192, 72]"));
    free(out); free(err); free(args);
    args = m2d_strfmt("--model '%s' --json --tensors", dir);
    rc = inspect(args, &out, &err);
    assert_int_equal(rc, 0);
    cJSON *j = cJSON_Parse(out);
    assert_non_null(j);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "tensor_list")), 807);
    cJSON_Delete(j);
    free(out); free(err); free(args); free(dir);
    /* a broken file is reported the same way */
    char *tmp = tu_tmpdir(), *p = m2d_path_join(tmp, "x.safetensors");
    tu_write(p, "\x02\0\0\0\0\0\0\0{", 9);
    args = m2d_strfmt("--model '%s'", p);
    assert_int_equal(inspect(args, &out, &err), 1);
    assert_non_null(strstr(err, "x.safetensors: field 'header length'"));
    free(out); free(err); free(args); free(p);
    tu_rm_rf(tmp);
    free(tmp);
}

static void cli_usage(void **state) {
    (void)state;
    char *out, *err;
    assert_int_equal(inspect("", &out, &err), 1);
    assert_non_null(strstr(err, "--model"));
    free(out); free(err);
    assert_int_equal(inspect("--model x --bogus", &out, &err), 1);
    assert_non_null(strstr(err, "--bogus"));
    free(out); free(err);
    char *cmd = m2d_strfmt("'%s' help inspect", tu_bin());
    assert_int_equal(tu_run(cmd, &out, &err), 0);
    assert_non_null(strstr(out, "--json"));
    assert_non_null(strstr(out, "same for every K"));
    free(out); free(err); free(cmd);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tiny_teacher_text),
        cmocka_unit_test(tiny_teacher_json),
        cmocka_unit_test(sharded_dense),
        cmocka_unit_test(cli_bad_inputs),
        cmocka_unit_test(safetensors_file_only),
        cmocka_unit_test(cli_usage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
