/* architecture seam: a second architecture that differs from Qwen3-MoE in one op (q/k RMSNorm over
 * the whole projection, tests/arch_wholeqk.c) loads, runs through the engine, calibrates, converts
 * to its own dense student and reloads -- with engine.c and the student writer untouched -- and
 * every forward agrees with the naive float64 reference (tests/reffwd.c). */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "calib/calib.h"
#include "convert/convert.h"
#include "engine/engine.h"
#include "model/arch_qwen3.h"
#include "reffwd.h"
#include "testmodel.h"

/* A second test-only adapter, local to this file: Qwen3-MoE whose table accepts only F32 weights
 * (the table's dtype rule). */
static m2d_tensor_spec f32_tensors[32];

__attribute__((constructor)) static void build_f32_table(void) {
    int n = 0;
    for (const m2d_tensor_spec *sp = m2d_qwen3_tensors; sp->name && n + 1 < (int)M2D_ARRAY_LEN(f32_tensors); sp++) {
        f32_tensors[n] = *sp;
        f32_tensors[n++].dtypes = 1u << M2D_F32;
    }
}

M2D_ARCH(test_f32only, .name = "TestF32OnlyMoeForCausalLM", .summary = "test only: Qwen3-MoE, F32 weights only",
         .parse_config = m2d_qwen3moe_parse, .tensors = f32_tensors)

static void wholeqk_opts(m2d_testmodel_opts *o) {
    m2d_testmodel_defaults(o);
    o->arch = "TestWholeQkNormMoeForCausalLM";
    o->model_type = "test_wholeqk_moe";
    o->qk_norm_whole = true;
    o->dtype = M2D_F32;
    o->init_std = 0.2f; /* large enough that the q/k norm changes the logits visibly */
}

static m2d_model *open_or_fail(const char *dir) {
    m2d_model *m;
    if (m2d_model_open(dir, &m)) fail_msg("%s", m2d_errmsg());
    return m;
}

/* a fresh temporary directory holding a checkpoint of the test architecture, opened */
static m2d_model *write_teacher(char **dir) {
    *dir = tu_tmpdir();
    m2d_testmodel_opts o;
    wholeqk_opts(&o);
    if (m2d_testmodel_write(*dir, &o)) fail_msg("%s", m2d_errmsg());
    return open_or_fail(*dir);
}

static float *engine_logits(const m2d_model *m, const int32_t *tok, int n) {
    m2d_engine *e;
    if (m2d_engine_new(m, 2, &e)) fail_msg("%s", m2d_errmsg());
    float *lg = m2d_malloc((size_t)n * m->cfg.vocab_size * sizeof(float));
    if (m2d_engine_logits(e, tok, n, lg)) fail_msg("%s", m2d_errmsg());
    m2d_engine_free(e);
    return lg;
}

static double max_diff_ref(const float *lg, const double *ref, size_t n) {
    double md = 0;
    for (size_t i = 0; i < n; i++) md = fmax(md, fabs(lg[i] - ref[i]));
    return md;
}

/* engine vs the reference on n random tokens; returns the max |dlogit|, and in *vs_no_norm the
 * distance to the same model with its q/k norms dropped (the op under test) */
static double check_forward(const m2d_model *m, uint64_t seed, double *vs_no_norm) {
    int n = 24, V = m->cfg.vocab_size;
    int32_t tok[24];
    for (int i = 0; i < n; i++) tok[i] = (int32_t)(tu_rand_u64(&seed) % (uint64_t)V);
    float *lg = engine_logits(m, tok, n);
    double *ref = m2d_malloc(sizeof(double) * (size_t)n * V);
    tu_ref_forward(m, tok, n, ref);
    double md = max_diff_ref(lg, ref, (size_t)n * V);
    tu_ref_forward_no_qk_norm(m, tok, n, ref);
    *vs_no_norm = max_diff_ref(lg, ref, (size_t)n * V);
    free(lg);
    free(ref);
    return md;
}

/* The adapter's table and ops reach the model: whole-projection norm weights, ops.qk_norm, the
 * generic parameter count (checked against the checkpoint's own element count), and a checkpoint
 * with Qwen3's per-head norm shapes is refused naming the tensor. */
static void adapter_binds_its_table(void **state) {
    (void)state;
    char *dir;
    m2d_model *m = write_teacher(&dir);
    assert_string_equal(m->arch->name, "TestWholeQkNormMoeForCausalLM");
    assert_int_equal(m->cfg.ops.qk_norm, M2D_QK_NORM_WHOLE);
    assert_int_equal(m->layers[1].q_norm->shape[0], 4 * 8);
    assert_int_equal(m->layers[1].k_norm->shape[0], 2 * 8);
    int64_t numel = 0;
    for (int i = 0; i < m2d_st_count(m->st); i++) numel += m2d_tensor_numel(m2d_st_at(m->st, i));
    assert_int_equal(m2d_model_param_counts(&m->cfg).total, numel);
    m2d_model_close(m);

    m2d_testmodel_opts o;
    wholeqk_opts(&o);
    o.qk_norm_whole = false; /* per-head shapes under the whole-norm architecture */
    char *bad = m2d_path_join(dir, "bad");
    assert_int_equal(m2d_testmodel_write(bad, &o), 0);
    m2d_model *b;
    assert_int_equal(m2d_model_open(bad, &b), -1);
    assert_non_null(strstr(m2d_errmsg(), "'model.layers.0.self_attn.q_norm.weight'"));
    assert_non_null(strstr(m2d_errmsg(), "expected [32], found [8]"));
    free(bad);
    tu_rm_rf(dir);
    free(dir);
}

/* Tolerance as tests/test_engine.c's checkpoint test: fp32 vs double on dots of length <= 32 of
 * O(1) terms (relative error ~ 8·eps ~ 5e-7 per dot) over 2 layers, logits of size ~1: expect
 * ~1e-6, assert 5e-5. Dropping the q/k norms moves the logits by > 1e-2: the test sees the op. */
static void engine_runs_whole_qk_norm(void **state) {
    (void)state;
    char *dir;
    m2d_model *m = write_teacher(&dir);
    double control, md = check_forward(m, 5, &control);
    print_message("whole q/k norm teacher: max |dlogit| vs reference %.3g (without the norm: %.3g)\n", md, control);
    assert_true(md < 5e-5);
    assert_true(control > 1e-2);
    m2d_model_close(m);
    tu_rm_rf(dir);
    free(dir);
}

/* The table's dtype rule: an F32-only table refuses a BF16 checkpoint naming the tensor and dtype. */
static void table_dtype_rule(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    o.arch = "TestF32OnlyMoeForCausalLM";
    o.dtype = M2D_BF16;
    assert_int_equal(m2d_testmodel_write(dir, &o), 0);
    m2d_model *m;
    assert_int_equal(m2d_model_open(dir, &m), -1);
    assert_non_null(strstr(m2d_errmsg(), "tensor 'model.embed_tokens.weight': field 'dtype': BF16 is not accepted by "
                                         "TestF32OnlyMoeForCausalLM"));
    o.dtype = M2D_F32;
    assert_int_equal(m2d_testmodel_write(dir, &o), 0);
    m = open_or_fail(dir);
    m2d_model_close(m);
    tu_rm_rf(dir);
    free(dir);
}

static m2d_convert_plan *plan_for(const m2d_model *m, m2d_stats **stats) {
    uint64_t seed = 17;
    int n = 256;
    int32_t *ids = m2d_malloc((size_t)n * sizeof *ids);
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(tu_rand_u64(&seed) % (uint64_t)m->cfg.vocab_size);
    m2d_calib_opts co = {.seq_len = 64, .n_samples = 4, .n_threads = 1};
    if (m2d_calib_run(m, ids, n, &co, stats)) fail_msg("%s", m2d_errmsg());
    free(ids);
    m2d_convert_opts o = {.scoring = "acp", .grouping = "rr", .scaling = "uniform", .K = 4, .target = M2D_TARGET_DENSE};
    m2d_convert_plan *p;
    if (m2d_convert_plan_build(m, *stats, &o, &p)) fail_msg("%s", m2d_errmsg());
    return p;
}

/* Calibrate, convert to the adapter's own dense student (its names, its config, its q/k norm),
 * check the in-memory student against the reference, write it, reopen it as
 * TestWholeQkNormForCausalLM and get bit-identical logits. */
static void converts_to_its_own_student(void **state) {
    (void)state;
    char *dir;
    m2d_model *t = write_teacher(&dir), *s, *w;
    char *sdir = m2d_path_join(dir, "student");
    m2d_stats *stats;
    m2d_convert_plan *p = plan_for(t, &stats);
    if (m2d_convert_build(t, p, &s)) fail_msg("%s", m2d_errmsg());
    assert_string_equal(s->cfg.arch, "TestWholeQkNormForCausalLM");
    assert_int_equal(s->cfg.ops.qk_norm, M2D_QK_NORM_WHOLE);
    assert_int_equal(s->cfg.intermediate_size, 2 * 16);
    assert_string_equal(s->layers[1].gate_proj->name, "model.layers.1.mlp.gate_proj.weight");
    assert_int_equal(m2d_model_param_counts(&s->cfg).total, m2d_model_param_counts(&t->cfg).dense_student);
    double control, md = check_forward(s, 6, &control);
    print_message("whole q/k norm student: max |dlogit| vs reference %.3g (without the norm: %.3g)\n", md, control);
    assert_true(md < 5e-5);
    assert_true(control > 1e-2);

    assert_int_equal(m2d_convert_write(t, s, p, NULL, sdir), 0);
    w = open_or_fail(sdir);
    assert_string_equal(w->arch->name, "TestWholeQkNormForCausalLM");
    assert_string_equal(w->cfg.model_type, "test_wholeqk");
    assert_int_equal(w->cfg.ops.qk_norm, M2D_QK_NORM_WHOLE);
    int32_t tok[16];
    uint64_t st = 3;
    for (int i = 0; i < 16; i++) tok[i] = (int32_t)(tu_rand_u64(&st) % 64);
    float *mem = engine_logits(s, tok, 16), *disk = engine_logits(w, tok, 16);
    /* same weights (teacher dtype in memory and on disk), same engine: bit-identical (one machine,
     * the same computation) */
    assert_memory_equal(mem, disk, 16 * 64 * sizeof(float));
    free(mem); free(disk);
    m2d_model_close(w);
    m2d_convert_student_free(s);
    m2d_convert_plan_free(p);
    m2d_calib_stats_free(stats);
    m2d_model_close(t);
    tu_rm_rf(dir);
    free(dir);
    free(sdir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(adapter_binds_its_table),
        cmocka_unit_test(table_dtype_rule),
        cmocka_unit_test(engine_runs_whole_qk_norm),
        cmocka_unit_test(converts_to_its_own_student),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
