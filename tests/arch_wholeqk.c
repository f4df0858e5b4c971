/* arch_wholeqk — a test-only architecture adapter (linked into the tests, never into the product).
 *
 * "TestWholeQkNormMoeForCausalLM" is Qwen3-MoE except for one op: the q/k RMSNorm runs over the
 * whole projection (weights [heads*head_dim] and [kv_heads*head_dim]), as in OLMoE, instead of per
 * head. Its dense student "TestWholeQkNormForCausalLM" keeps that op. tests/test_arch.c loads a
 * checkpoint of it, runs it through the engine, calibrates, converts and writes the student, and
 * checks every step against the naive reference (tests/reffwd.c) -- with no edit to engine.c or to
 * the student writer: this file is everything the new family needs. */
#include <cjson/cJSON.h>

#include "base/util.h"
#include "model/arch_qwen3.h"

/* Qwen3's tensor table with the one difference: q/k norm weights over the whole projection.
 * Filled before main (constructors run before any model is opened). */
static m2d_tensor_spec tensors[32];

__attribute__((constructor)) static void build_tensor_table(void) {
    int n = 0;
    for (const m2d_tensor_spec *sp = m2d_qwen3_tensors; sp->name && n + 1 < (int)M2D_ARRAY_LEN(tensors); sp++) {
        tensors[n] = *sp;
        if (sp->scope == M2D_SCOPE_LAYER && sp->role == M2D_T_Q_NORM) tensors[n].shape[0] = M2D_DIM_Q;
        if (sp->scope == M2D_SCOPE_LAYER && sp->role == M2D_T_K_NORM) tensors[n].shape[0] = M2D_DIM_KV;
        n++;
    }
    tensors[n] = (m2d_tensor_spec){0};
}

static int parse_moe(const void *json, const char *path, m2d_config *c) {
    if (m2d_qwen3moe_parse(json, path, c) != 0) return -1;
    c->ops.qk_norm = M2D_QK_NORM_WHOLE;
    return 0;
}

static int parse_dense(const void *json, const char *path, m2d_config *c) {
    if (m2d_qwen3_parse(json, path, c) != 0) return -1;
    c->ops.qk_norm = M2D_QK_NORM_WHOLE;
    return 0;
}

/* Qwen3-MoE's rewrite, then this family's own student name */
static int student_config(void *json, const m2d_student_shape *s, const char *path) {
    if (m2d_qwen3moe_student_config(json, s, path) != 0) return -1;
    if (s->moe) return 0;
    cJSON *j = json;
    cJSON_ReplaceItemInObject(j, "architectures", cJSON_CreateStringArray((const char *[]){"TestWholeQkNormForCausalLM"}, 1));
    cJSON_ReplaceItemInObject(j, "model_type", cJSON_CreateString("test_wholeqk"));
    return 0;
}

M2D_ARCH(test_wholeqk_moe, .name = "TestWholeQkNormMoeForCausalLM",
         .summary = "test only: Qwen3-MoE with q/k norm over the whole projection", .parse_config = parse_moe,
         .tensors = tensors, .student = "TestWholeQkNormForCausalLM", .student_config = student_config)

M2D_ARCH(test_wholeqk_dense, .name = "TestWholeQkNormForCausalLM",
         .summary = "test only: dense student of TestWholeQkNormMoeForCausalLM", .parse_config = parse_dense,
         .tensors = tensors)
