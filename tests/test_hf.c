/* hf: moe2dense against Hugging Face transformers itself, through the goldens that
 * tools/hf_goldens.py makes with transformers' own classes, save_pretrained and forward
 * (tests/golden/hf/, or $M2D_HF_GOLDEN: `make verify-hf` makes them afresh and runs this test):
 *   - the checkpoint format: the config.json that transformers writes loads, and moe2dense's
 *     safetensors writer rebuilds transformers' model.safetensors byte for byte from the grid
 *     generator (tests/testmodel.h);
 *   - the forward of every architecture: logits and routing against transformers' (float64);
 *   - conversion: calibrate + convert of a transformers-written teacher give the student that
 *     transformers' save_pretrained writes back unchanged, and the student's logits (and, for an
 *     MoE target, routing) equal transformers' on it. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "model/model.h"
#include "hfcheck.h"
#include "testmodel.h"

/* The checkpoint of golden G in WORK/<name> (tu_work holds those built so far), rebuilt by
 * moe2dense: transformers' config.json text, weights from the grid generator through moe2dense's
 * safetensors writer, the golden's tokenizer. */
static char *build_teacher(const cJSON *g, const char *work) {
    if (cJSON_HasObjectItem(g, "tensors")) return hf_build_listed(g, work);
    const char *name = hf_str(g, "name"), *config = hf_str(g, "config_json");
    char *dir = m2d_path_join(work, name);
    if (m2d_testmodel_write_grid(dir, config, (uint64_t)hf_item(g, "seed")->valuedouble) != 0)
        fail_msg("%s: the config.json transformers wrote does not load, or writing failed: %s", name, m2d_errmsg());
    hf_copy_tokenizer(dir);
    return dir;
}

/* Qwen3-MoE in bf16: renormalised top-k, a dense layer, untied embeddings. */
static void qwen3moe_bf16(void **state) { (void)state; hf_check_model("qwen3moe", tu_work, build_teacher); }
/* Qwen3-MoE in f32: top-k not renormalised, tied embeddings, decoder_sparse_step 2, 3:1 GQA. */
static void qwen3moe_f32(void **state) { (void)state; hf_check_model("qwen3moe-f32", tu_work, build_teacher); }
/* Qwen3-MoE with YaRN RoPE (48 positions over an original context of 16). */
static void qwen3moe_yarn(void **state) { (void)state; hf_check_model("qwen3moe-yarn", tu_work, build_teacher); }
/* OLMoE in bf16: q/k norm over the whole projection, clip_qkv, GQA, top-k not renormalised. */
static void olmoe_bf16(void **state) { (void)state; hf_check_model("olmoe", tu_work, build_teacher); }
/* OLMoE in f32: attention biases, renormalised top-k, tied embeddings. */
static void olmoe_bias(void **state) { (void)state; hf_check_model("olmoe-bias", tu_work, build_teacher); }
/* OLMoE's dense student: an OlmoeForCausalLM with one expert of width k*d_e routed top-1. */
static void olmoe_student(void **state) { (void)state; hf_check_model("olmoe-student", tu_work, build_teacher); }
/* Qwen2-MoE in bf16: q/k/v biases, the shared expert and its sigmoid gate, a dense layer, top-k not
 * renormalised. */
static void qwen2moe_bf16(void **state) { (void)state; hf_check_model("qwen2moe", tu_work, build_teacher); }
/* Qwen2-MoE in f32: no q/k/v biases, renormalised top-k, tied embeddings. */
static void qwen2moe_f32(void **state) { (void)state; hf_check_model("qwen2moe-f32", tu_work, build_teacher); }
/* Qwen2-MoE's dense student (a Qwen2ForCausalLM: k groups and the shared expert concatenated). */
static void qwen2moe_student(void **state) { (void)state; hf_check_model("qwen2moe-student", tu_work, build_teacher); }
/* the smaller Qwen2-MoE (--target moe): the shared expert and its gate copied. */
static void qwen2moe_student_moe(void **state) {
    (void)state;
    hf_check_model("qwen2moe-student-moe", tu_work, build_teacher);
}
/* DeepSeek-V2-Lite's shape in bf16: MLA without q LoRA, YaRN + softmax mscale, a first dense layer,
 * 2 shared experts, greedy top-k. */
static void deepseekv2_bf16(void **state) { (void)state; hf_check_model("deepseekv2", tu_work, build_teacher); }
/* DeepSeek-V2 in f32: q LoRA, group-limited routing, routed_scaling_factor 2.5, YaRN attention factor. */
static void deepseekv2_q(void **state) { (void)state; hf_check_model("deepseekv2-q", tu_work, build_teacher); }
/* DeepSeek-V2's dense student (every layer dense, the first zero-padded, MLA unchanged). */
static void deepseekv2_student(void **state) {
    (void)state;
    hf_check_model("deepseekv2-student", tu_work, build_teacher);
}
/* dense Qwen3 (the student's family), bf16, tied embeddings. */
static void qwen3_dense(void **state) { (void)state; hf_check_model("qwen3", tu_work, build_teacher); }
/* the dense student of the bf16 teacher (zero-padded dense layer), in transformers' Qwen3ForCausalLM. */
static void student_dense(void **state) { (void)state; hf_check_model("qwen3moe-student", tu_work, build_teacher); }
/* dense Qwen3 pruned by moe2dense prune (Minitron: a layer, channels of the tied embedding, a kv group
 * and a query head removed), loaded, re-saved and run by transformers' Qwen3ForCausalLM. */
static void qwen3_pruned(void **state) { (void)state; hf_check_model("qwen3-pruned", tu_work, build_teacher); }
/* the smaller MoE (--target moe, groups), in transformers' Qwen3MoeForCausalLM. */
static void student_moe(void **state) { (void)state; hf_check_model("qwen3moe-student-moe", tu_work, build_teacher); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(qwen3moe_bf16), cmocka_unit_test(qwen3moe_f32), cmocka_unit_test(qwen3_dense), cmocka_unit_test(qwen3_pruned),
        cmocka_unit_test(student_dense), cmocka_unit_test(student_moe), cmocka_unit_test(qwen3moe_yarn),
        cmocka_unit_test(olmoe_bf16), cmocka_unit_test(olmoe_bias), cmocka_unit_test(olmoe_student),
        cmocka_unit_test(qwen2moe_bf16), cmocka_unit_test(qwen2moe_f32), cmocka_unit_test(qwen2moe_student),
        cmocka_unit_test(qwen2moe_student_moe), cmocka_unit_test(deepseekv2_bf16), cmocka_unit_test(deepseekv2_q),
        cmocka_unit_test(deepseekv2_student),
    };
    return cmocka_run_group_tests(tests, tu_work_setup, tu_work_teardown);
}
