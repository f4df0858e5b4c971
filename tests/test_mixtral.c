/* mixtral: MixtralForCausalLM and its dense student MistralForCausalLM.
 *  - against transformers (goldens of tools/hf_goldens_families.py): the checkpoint transformers
 *    writes rebuilt byte for byte, logits, routing and calibration statistics (bf16 with a sliding
 *    window shorter than the sequence; f32 without a window, tied embeddings); the student written
 *    by calibrate + convert loads in transformers' MistralForCausalLM with the same logits;
 *  - against the naive float64 reference forward, and the KV-cache paths against the full forward
 *    with the window cutting into the cache;
 *  - config.json errors and the student's config (Mistral defaults pinned to Mixtral's). */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "engine/engine.h"
#include "familyckpt.h"
#include "hfcheck.h"
#include "model/model.h"
#include "reffwd.h"


static void golden_bf16_window(void **state) { (void)state; hf_check_model("mixtral", tu_work, tu_family_build); }
static void golden_f32_tied(void **state) { (void)state; hf_check_model("mixtral-f32", tu_work, tu_family_build); }
/* calibrate + convert -> MistralForCausalLM, as transformers loads and re-saves it */
static void golden_student(void **state) { (void)state; hf_check_model("mixtral-student", tu_work, tu_family_build); }

/* the engine against the float64 reference (window 16 < 40 tokens), and extend in chunks / branches
 * (keys of the cache fall out of the window) against the full forward */
static void engine_matches_reference_and_cache_paths(void **state) {
    (void)state;
    tu_family_engine_check("mixtral", tu_work, 40, 20, 25);
}

static void expect_config_error(const char *set, const char *del, const char *field) {
    tu_family_config_error("mixtral", set, del, field);
}

static void config_errors_and_defaults(void **state) {
    (void)state;
    expect_config_error("{\"sliding_window\": -4}", NULL, "'sliding_window'");
    expect_config_error("{\"sliding_window\": \"16\"}", NULL, "'sliding_window'");
    expect_config_error("{\"hidden_act\": \"gelu\"}", NULL, "'hidden_act'");
    expect_config_error("{\"num_experts_per_tok\": 9}", NULL, "'num_experts_per_tok'");
    expect_config_error("{\"num_experts\": 4}", NULL, "'num_local_experts'"); /* disagrees with 8 */
    expect_config_error(NULL, "intermediate_size", "'intermediate_size'");
    expect_config_error("{\"rope_parameters\": {\"rope_type\": \"dynamic\", \"factor\": 2}}", NULL, "rope_type");
    /* absent: Mixtral's defaults (no window, eps 1e-5, theta 1e6); null window: full attention */
    char *text = tu_family_edited_config("mixtral", "{\"sliding_window\": null}", "rms_norm_eps");
    m2d_config c;
    assert_int_equal(m2d_config_parse(text, strlen(text), "config.json", &c, NULL), 0);
    assert_null(c.layer_window);
    assert_true(c.rms_norm_eps == 1e-5 && c.num_experts == 8 && c.moe_intermediate_size == 32 && c.ops.router_renorm);
    assert_int_equal(c.ops.qk_norm, M2D_QK_NORM_NONE);
    m2d_config_free(&c);
    free(text);
}

/* the student's config.json: MistralForCausalLM with Mixtral's values where Mistral's defaults differ */
static void student_config_pins_mixtral_defaults(void **state) {
    (void)state;
    char *text = tu_family_edited_config("mixtral", "{\"rope_parameters\": {\"rope_type\": \"default\"}}", "sliding_window");
    char *dir = m2d_path_join(tu_work, "pinned");
    assert_int_equal(tu_family_checkpoint(dir, text, 5), 0);
    char *cfg = m2d_path_join(dir, "config.json");
    cJSON *j = cJSON_Parse(text);
    cJSON_DeleteItemFromObject(j, "rms_norm_eps");
    free(text);
    text = cJSON_Print(j);
    tu_write(cfg, text, strlen(text));
    m2d_model *m;
    assert_int_equal(m2d_model_open(dir, &m), 0);
    char *sj;
    m2d_student_shape sh = {.moe = false, .ffn_width = 64};
    assert_int_equal(m2d_arch_student_config(m, &sh, &sj), 0);
    m2d_config sc;
    const m2d_arch *sa;
    assert_int_equal(m2d_config_parse(sj, strlen(sj), "student", &sc, &sa), 0);
    assert_string_equal(sa->name, "MistralForCausalLM");
    assert_null(sc.layer_window);             /* not Mistral's 4096 */
    assert_true(sc.rms_norm_eps == 1e-5);     /* not Mistral's 1e-6 */
    assert_true(sc.rope_theta == 1000000.0);  /* not Mistral's 1e4 */
    assert_int_equal(sc.intermediate_size, 64);
    assert_null(strstr(sj, "num_local_experts"));
    m2d_config_free(&sc);
    free(sj), free(text), free(cfg), free(dir);
    cJSON_Delete(j);
    m2d_model_close(m);
}

/* inspect names the window of every layer */
static void inspect_shows_windows(void **state) {
    (void)state;
    cJSON *g = hf_load_golden("mixtral");
    char *dir = tu_family_build(g, tu_work), *cmd = m2d_strfmt("%s inspect --model %s", tu_bin(), dir), *out = NULL;
    assert_int_equal(tu_run(cmd, &out, NULL), 0);
    if (!strstr(out, "MixtralForCausalLM") || !strstr(out, "windows        0:sliding 16 1:sliding 16\n"))
        fail_msg("inspect: %s", out);
    free(out), free(cmd), free(dir);
    cJSON_Delete(g);
}

/* calibrate -> convert -> ppl -> eval through the command line */
static void pipeline_end_to_end(void **state) { (void)state; hf_check_pipeline("mixtral-student", tu_work, tu_family_build); }

/* experiments.toml's cross-model experiment (paper section 4.6) end to end through the sweep */
static void cross_model_experiment(void **state) { (void)state; tu_family_cross_model("mixtral", tu_work); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(golden_bf16_window),
        cmocka_unit_test(golden_f32_tied),
        cmocka_unit_test(golden_student),
        cmocka_unit_test(pipeline_end_to_end),
        cmocka_unit_test(cross_model_experiment),
        cmocka_unit_test(inspect_shows_windows),
        cmocka_unit_test(engine_matches_reference_and_cache_paths),
        cmocka_unit_test(config_errors_and_defaults),
        cmocka_unit_test(student_config_pins_mixtral_defaults),
    };
    return cmocka_run_group_tests(tests, tu_work_setup, tu_work_teardown);
}
