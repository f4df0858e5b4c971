/* rope: config.json's rotary parameters (model/rope.h) against what Hugging Face transformers
 * derives from the same fields (tests/golden/hf/rope.json, made by tools/hf_goldens.py from
 * transformers' own rope initialisers): inverse frequencies, the cos/sin attention factor and
 * DeepSeek-V2's softmax mscale, for default, linear and YaRN (DeepSeek-V2-Lite's, GPT-OSS's,
 * Qwen3's, mscale != mscale_all_dim, implicit factor), in the Hub's spelling and in the one
 * transformers >= 5 writes back; and the one-line errors for what is not supported. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "model/rope.h"

static cJSON *load_json(const char *path) {
    size_t n;
    char *text = m2d_read_file(path, &n);
    if (!text) fail_msg("%s", m2d_errmsg());
    cJSON *j = cJSON_ParseWithLength(text, n);
    free(text);
    if (!j) fail_msg("%s: invalid JSON", path);
    return j;
}

/* parse FIELDS (an object of config.json fields) and compare with the case's transformers values */
static void check_case(const char *name, const cJSON *fields, const cJSON *c) {
    int dim = cJSON_GetObjectItem(c, "dim")->valueint;
    int max_pos = cJSON_GetObjectItem(fields, "max_position_embeddings")->valueint;
    double theta, inv[512];
    m2d_rope_scaling s;
    if (m2d_rope_parse(fields, name, 10000.0, max_pos, &theta, &s) != 0) fail_msg("%s: %s", name, m2d_errmsg());
    m2d_rope_inv_freq(&s, theta, dim, inv);
    const cJSON *want = cJSON_GetObjectItem(c, "inv_freq");
    assert_int_equal(cJSON_GetArraySize(want), dim / 2);
    /* transformers computes the frequencies in float32 (arange, pow, the YaRN ramp): each value
     * carries a few ulp of 2^-24 relative error; ours are double */
    double worst = 0;
    for (int i = 0; i < dim / 2; i++) {
        double w = cJSON_GetArrayItem(want, i)->valuedouble;
        worst = fmax(worst, fabs(inv[i] - w) / w);
    }
    if (worst > 1e-6) fail_msg("%s: inverse frequencies differ from transformers' by %.3g (relative)", name, worst);
    /* the factors are Python floats (double) in transformers */
    double af = cJSON_GetObjectItem(c, "attention_factor")->valuedouble;
    double ms = cJSON_GetObjectItem(c, "softmax_mscale")->valuedouble;
    if (fabs(m2d_rope_attention_factor(&s) - af) > 1e-12 || fabs(m2d_rope_softmax_mscale(&s) - ms) > 1e-12)
        fail_msg("%s: attention factor %.17g / mscale %.17g, transformers %.17g / %.17g", name,
                 m2d_rope_attention_factor(&s), m2d_rope_softmax_mscale(&s), af, ms);
    print_message("%s: %s, max relative difference %.2g\n", name, m2d_rope_scaling_name(s.kind), worst);
}

static void rope_matches_transformers(void **state) {
    (void)state;
    const char *dir = getenv("M2D_HF_GOLDEN") ? getenv("M2D_HF_GOLDEN") : "tests/golden/hf";
    char *path = m2d_path_join(dir, "rope.json");
    cJSON *g = load_json(path);
    const cJSON *cases = cJSON_GetObjectItem(g, "cases"), *c;
    int n = 0;
    cJSON_ArrayForEach(c, cases) {
        char *hub = m2d_strfmt("%s (config as given)", c->string), *saved = m2d_strfmt("%s (as saved)", c->string);
        check_case(hub, cJSON_GetObjectItem(c, "config"), c);
        check_case(saved, cJSON_GetObjectItem(c, "saved_config"), c); /* transformers >= 5's spelling */
        free(hub), free(saved);
        n++;
    }
    assert_true(n >= 7);
    cJSON_Delete(g);
    free(path);
}

/* JSON text -> error message (must fail) */
static void expect_error(const char *json, const char *needle) {
    cJSON *j = cJSON_Parse(json);
    assert_non_null(j);
    double theta;
    m2d_rope_scaling s;
    m2d_err_clear();
    assert_int_equal(m2d_rope_parse(j, "config.json", 10000.0, 4096, &theta, &s), -1);
    if (!strstr(m2d_errmsg(), "config.json") || !strstr(m2d_errmsg(), needle))
        fail_msg("%s: unexpected message: %s", json, m2d_errmsg());
    cJSON_Delete(j);
}

/* transformers reads `rope_scaling or rope_parameters`: an empty rope_scaling falls back to
 * rope_parameters (here linear x2); with neither, the plain rotation */
static void empty_rope_scaling_is_absent(void **state) {
    (void)state;
    const char *cases[] = {"{\"rope_scaling\": {}, \"rope_parameters\": {\"rope_type\": \"linear\", \"factor\": 2}}",
                           "{\"rope_scaling\": {}}"};
    for (int i = 0; i < 2; i++) {
        cJSON *j = cJSON_Parse(cases[i]);
        double theta;
        m2d_rope_scaling s;
        assert_int_equal(m2d_rope_parse(j, "config.json", 10000.0, 4096, &theta, &s), 0);
        assert_int_equal(s.kind, i == 0 ? M2D_ROPE_SCALING_LINEAR : M2D_ROPE_SCALING_NONE);
        if (i == 0) assert_true(s.factor == 2);
        assert_int_equal(m2d_rope_scaling_given(j), 0);
        cJSON_Delete(j);
    }
}

static void rope_errors(void **state) {
    (void)state;
    expect_error("{\"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 2}}", "rope_scaling: field 'rope_type'");
    expect_error("{\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 2, \"rope_type\": \"linear\"}}", "disagree");
    expect_error("{\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 2, \"low_freq_factor\": 1}}", "'low_freq_factor'");
    expect_error("{\"rope_scaling\": {\"type\": \"yarn\"}}", "field 'factor': missing");
    expect_error("{\"rope_scaling\": {\"type\": \"yarn\", \"factor\": -2}}", "field 'factor': must be positive");
    expect_error("{\"rope_scaling\": {\"type\": \"linear\"}}", "field 'factor': missing");
    expect_error("{\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 2, \"beta_fast\": \"x\"}}", "'beta_fast'");
    expect_error("{\"rope_parameters\": {\"rope_type\": \"default\", \"partial_rotary_factor\": 0.5}}",
                 "'partial_rotary_factor'");
    expect_error("{\"rope_theta\": 1e4, \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1e6}}",
                 "field 'rope_theta'");
    expect_error("{\"rope_theta\": -1}", "field 'rope_theta': must be positive");
    /* issue 27 (9): absurd positive values overflow the frequencies or the scale to inf / NaN */
    expect_error("{\"rope_scaling\": {\"type\": \"linear\", \"factor\": 1e-310}}", "field 'factor': 1e-310 is out of range");
    expect_error("{\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4, \"attention_factor\": 1e308}}",
                 "field 'attention_factor': 1e+308 is out of range");
    expect_error("{\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 1e-310, \"mscale\": 0.707, "
                 "\"mscale_all_dim\": 0.707, \"original_max_position_embeddings\": 4096}}", /* DeepSeek-V2's */
                 "field 'factor': 1e-310 is out of range");
    expect_error("{\"rope_scaling\": 4}", "field 'rope_scaling': must be an object");
    /* absent everything: the family's default theta, no scaling */
    cJSON *j = cJSON_Parse("{\"rope_scaling\": null}");
    double theta;
    m2d_rope_scaling s;
    assert_int_equal(m2d_rope_parse(j, "config.json", 5e5, 4096, &theta, &s), 0);
    assert_true(theta == 5e5 && s.kind == M2D_ROPE_SCALING_NONE);
    assert_true(m2d_rope_attention_factor(&s) == 1 && m2d_rope_softmax_mscale(&s) == 1);
    cJSON_Delete(j);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(rope_matches_transformers),
        cmocka_unit_test(rope_errors),
        cmocka_unit_test(empty_rope_scaling_is_absent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
