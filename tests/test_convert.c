/* convert: merge / scale / concatenate math, the App. A identity (K = k: dense FFN = Σ α-weighted
 * experts), student logits vs a hand-built checkpoint of the same merged matrices, the written
 * checkpoint vs the in-memory student, zero-padding of narrow dense layers, fingerprints, the
 * --target moe student, and bad input. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "calib/calib.h"
#include "convert/convert.h"
#include "engine/engine.h"
#include "model/model.h"
#include "io/st.h"
#include "testmodel.h"
#include "base/util.h"

/* ---------------- math on plain arrays ---------------- */

static void merge_weights_sum_to_one_and_uniform_fallback(void **state) {
    (void)state;
    double s[4] = {0.5, 1.5, 0.0, 2.0}, w[4];
    m2d_merge_weights(s, 4, w);
    assert_true(fabs(w[0] + w[1] + w[2] + w[3] - 1) < 1e-15);
    assert_true(w[0] == 0.125 && w[1] == 0.375 && w[2] == 0 && w[3] == 0.5);
    double z[3] = {0, 0, 0}, u[3];
    m2d_merge_weights(z, 3, u);
    for (int i = 0; i < 3; i++) assert_true(u[i] == 1.0 / 3);
    double one = 0, w1;
    m2d_merge_weights(&one, 1, &w1);
    assert_true(w1 == 1.0);
}

static void merge_matrices_weighted_average(void **state) {
    (void)state;
    float a[3] = {1, 2, 3}, b[3] = {3, 2, -1};
    const float *src[2] = {a, b};
    double w[2] = {0.25, 0.75};
    float out[3];
    m2d_merge_matrices(src, w, 2, 3, 1.0, M2D_F32, out);
    /* exact on every CPU: dyadic weights and small integers, every fp64 step exact (scalar C,
     * -std=c11: no FMA contraction) */
    assert_true(out[0] == 2.5f && out[1] == 2.0f && out[2] == 0.0f);
    m2d_merge_matrices(src, w, 2, 3, 0.5, M2D_F32, out);
    assert_true(out[0] == 1.25f && out[1] == 1.0f && out[2] == 0.0f);
    /* a group of identical copies merges back to the expert, bit for bit, whatever the weights:
     * the fp64 sum Σ w_i c is within 3·2^-53 |c| of the fp32 value c (weights summing to 1 up to
     * 2^-53), far inside half an fp32 ulp (2^-25 |c|), so it rounds back to c on every CPU */
    uint64_t st = 5;
    float c[50], merged[50];
    for (int i = 0; i < 50; i++) c[i] = (float)tu_rand_normal(&st);
    const float *copies[3] = {c, c, c};
    double w3[3] = {0.2, 0.3, 0.5};
    m2d_merge_matrices(copies, w3, 3, 50, 1.0, M2D_F32, merged);
    assert_memory_equal(merged, c, sizeof c);
    /* the same for bf16 experts: within 3·2^-53 |c| of a bf16 value, far from a bf16 tie */
    uint16_t cb[50], mb[50];
    for (int i = 0; i < 50; i++) cb[i] = m2d_f32_to_bf16(c[i]), c[i] = m2d_bf16_to_f32(cb[i]);
    m2d_merge_matrices(copies, w3, 3, 50, 1.0, M2D_BF16, merged);
    m2d_from_f32(M2D_BF16, merged, 50, mb);
    assert_memory_equal(mb, cb, sizeof cb);
}

/* x rounded to bf16 to nearest even straight from fp64, written independently of the converter:
 * a normal x is r · 2^(e-7) with r an integer of 8 bits; nearbyint rounds r to nearest even (the
 * default rounding mode), and the product is exact. The bit pattern is fp32's upper half. */
static uint16_t bf16_of_double(double x) {
    int e;
    frexp(x, &e); /* |x| in [2^(e-1), 2^e) */
    double ulp = ldexp(1.0, e - 8), v = nearbyint(x / ulp) * ulp;
    float f = (float)v; /* exact: 8 significant bits */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

/* A merged bf16 weight is rounded once from its fp64 value: paper-free arithmetic. The example of a
 * review: experts 1 and 1 + 2^-7, weights 0.5 -/+ 2^-23, an exact merge 1 + 2^-8 + 2^-30, just past
 * the bf16 tie 1 + 2^-8: bf16 0x3f81. Rounded to fp32 first (to nearest) it sat on the tie and went
 * to even, 0x3f80. Then 100,000 values next to bf16 ties (a tie +/- up to 2^-26 relative, both
 * signs, many binades) against bf16_of_double: exact on every machine (integer and IEEE-exact steps). */
static void merge_rounds_once_to_bf16(void **state) {
    (void)state;
    float a = 1.0f, b = 1.0f + 0x1p-7f, out;
    const float *src[2] = {&a, &b};
    double w[2] = {0.5 - 0x1p-23, 0.5 + 0x1p-23};
    m2d_merge_matrices(src, w, 2, 1, 1.0, M2D_BF16, &out);
    uint16_t h;
    m2d_from_f32(M2D_BF16, &out, 1, &h);
    assert_int_equal(h, 0x3f81);
    assert_int_equal(bf16_of_double(1.0 + 0x1p-8 + 0x1p-30), 0x3f81);
    uint64_t st = 77;
    for (int i = 0; i < 100000; i++) {
        uint64_t r = tu_rand_u64(&st);
        double tie = ldexp(1.0 + ((double)(r & 0x7f) + 0.5) / 128.0, (int)((r >> 7) % 200) - 100);
        double x = tie * (1.0 + ldexp((double)((int)((r >> 20) % 129) - 64), -32)) * ((r >> 40) & 1 ? -1 : 1);
        uint16_t got;
        float f = m2d_round_for(x, M2D_BF16);
        m2d_from_f32(M2D_BF16, &f, 1, &got);
        if (got != bf16_of_double(x)) fail_msg("x = %.17g: bf16 0x%04x, once-rounded 0x%04x", x, got, bf16_of_double(x));
    }
}

static void concat_layout(void **state) {
    (void)state;
    /* k = 2 groups, d = 2, d_e = 3: gate/up stack rows, down stacks column blocks */
    float g0[6] = {1, 2, 3, 4, 5, 6}, g1[6] = {7, 8, 9, 10, 11, 12};
    float d0[6] = {1, 2, 3, 4, 5, 6}, d1[6] = {7, 8, 9, 10, 11, 12};
    const float *gs[2] = {g0, g1}, *ds[2] = {d0, d1};
    float gate[12], up[12], down[12];
    m2d_concat_ffn(2, 2, 3, gs, gs, ds, gate, up, down); /* copies: exact */
    for (int i = 0; i < 6; i++) assert_true(gate[i] == g0[i] && gate[6 + i] == g1[i] && up[6 + i] == g1[i]);
    float want_down[12] = {1, 2, 3, 7, 8, 9, 4, 5, 6, 10, 11, 12};
    assert_memory_equal(down, want_down, sizeof want_down);
}

/* ---------------- fixtures ---------------- */

typedef struct {
    char *dir;
    m2d_model *m;
    m2d_stats *s;
} fixture;

static void make_fixture(fixture *f, m2d_testmodel_opts *o) {
    f->dir = tu_tmpdir();
    char *md = m2d_path_join(f->dir, "teacher");
    if (m2d_testmodel_write(md, o)) fail_msg("%s", m2d_errmsg());
    if (m2d_model_open(md, &f->m)) fail_msg("%s", m2d_errmsg());
    free(md);
    uint64_t seed = 17;
    int n = 256;
    int32_t *ids = m2d_malloc((size_t)n * sizeof *ids);
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(tu_rand_u64(&seed) % (uint64_t)f->m->cfg.vocab_size);
    m2d_calib_opts co = {.seq_len = 64, .n_samples = 4, .n_threads = 1};
    if (m2d_calib_run(f->m, ids, n, &co, &f->s)) fail_msg("%s", m2d_errmsg());
    free(ids);
}

static void free_fixture(fixture *f) {
    m2d_calib_stats_free(f->s);
    m2d_model_close(f->m);
    tu_rm_rf(f->dir);
    free(f->dir);
}

static m2d_convert_plan *plan_or_fail(fixture *f, const char *sc, const char *gr, const char *sca, int K, m2d_target t) {
    m2d_convert_opts o = {.scoring = sc, .grouping = gr, .scaling = sca, .K = K, .target = t};
    m2d_convert_plan *p;
    if (m2d_convert_plan_build(f->m, f->s, &o, &p)) fail_msg("%s", m2d_errmsg());
    return p;
}

static float *logits_of(const m2d_model *m, const int32_t *tok, int n) {
    m2d_engine *e;
    if (m2d_engine_new(m, 1, &e)) fail_msg("%s", m2d_errmsg());
    float *lg = m2d_malloc((size_t)n * m->cfg.vocab_size * sizeof(float));
    if (m2d_engine_logits(e, tok, n, lg)) fail_msg("%s", m2d_errmsg());
    m2d_engine_free(e);
    return lg;
}

/* ---------------- App. A identity ---------------- */

/* K = k, every group one expert: the dense FFN equals Σ_g α_g f_{e_g}(x) on any input.
 * Tolerance: the student side is an fp64 reference on fp32 weights (exact copies of the teacher's
 * fp32 weights times α = 1/k, exact for k = 2), the teacher side is the engine's fp32 kernel;
 * with d = 32, d_e = 16 term dot products the fp32 error is ~(d + d_e)·2⁻²⁴ ≈ 3e-6 relative to the
 * output scale, so 1e-5 of the largest |y| bounds it. */
static void dense_ffn_equals_alpha_weighted_experts(void **state) {
    (void)state;
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    o.dtype = M2D_F32;
    fixture f;
    make_fixture(&f, &o);
    const char *groupings[] = {"rr", "wc", "rc", "ab", "oc"};
    char fp0[65] = "";
    for (size_t gi = 0; gi < M2D_ARRAY_LEN(groupings); gi++) {
        m2d_convert_plan *p = plan_or_fail(&f, "acp", groupings[gi], "uniform", 2, M2D_TARGET_DENSE);
        /* K = k: every grouping yields the same student, so the same fingerprint */
        if (gi == 0) memcpy(fp0, p->fingerprint, 65);
        else assert_string_equal(fp0, p->fingerprint);
        m2d_model *s;
        assert_int_equal(m2d_convert_build(f.m, p, &s), 0);
        assert_string_equal(s->cfg.arch, "Qwen3ForCausalLM");
        assert_int_equal(s->cfg.intermediate_size, 32);
        m2d_engine *e;
        assert_int_equal(m2d_engine_new(f.m, 1, &e), 0);
        int d = 32;
        uint64_t st = 99;
        for (int li = 0; li < p->n_layers; li++) {
            const m2d_layer_plan *lp = &p->layers[li];
            assert_int_equal(lp->n_groups, 2);
            for (int g = 0; g < 2; g++) {
                assert_int_equal(lp->group_start[g + 1] - lp->group_start[g], 1);
                assert_true(lp->merge_w[g] == 1.0);
                assert_true(lp->alpha[g] == 0.5);
            }
            const m2d_layer *L = &s->layers[lp->layer];
            float *gate = m2d_tensor_f32(L->gate_proj), *up = m2d_tensor_f32(L->up_proj), *down = m2d_tensor_f32(L->down_proj);
            for (int trial = 0; trial < 4; trial++) {
                float x[32], y[32], fe[32], want[32] = {0};
                for (int j = 0; j < d; j++) x[j] = (float)tu_rand_normal(&st);
                m2d_swiglu_ref(d, 32, gate, up, down, x, y);
                for (int g = 0; g < 2; g++) {
                    assert_int_equal(m2d_engine_expert(e, lp->layer, lp->members[g], x, 1, fe), 0);
                    for (int j = 0; j < d; j++) want[j] += (float)(lp->alpha[g] * fe[j]);
                }
                double scale = 0, worst = 0;
                for (int j = 0; j < d; j++) {
                    scale = fmax(scale, fabs(want[j]));
                    worst = fmax(worst, fabs(y[j] - want[j]));
                }
                assert_true(worst <= 1e-5 * scale);
            }
            free(gate); free(up); free(down);
        }
        m2d_engine_free(e);
        m2d_convert_student_free(s);
        m2d_convert_plan_free(p);
    }
    free_fixture(&f);
}

/* App. A, "copied experts" case: a group made of copies of one expert merges back to that expert
 * whatever its merge weights, so the dense FFN again equals Σ_g α_g f_g. The teacher is a test
 * checkpoint whose experts 1 and 3 are copies of experts 0 and 2; the plan is written by hand
 * (groups {0,1}, {2,3}, merge weights 0.3/0.7 and 0.6/0.4, α 0.25 and 0.75). Tolerance as above. */
static void copied_experts_group_equals_expert(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    char *src = m2d_path_join(dir, "src"), *dup = m2d_path_join(dir, "dup");
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    o.dtype = M2D_F32;
    assert_int_equal(m2d_testmodel_write(src, &o), 0);
    m2d_model *sm;
    assert_int_equal(m2d_model_open(src, &sm), 0);
    m2d_st_writer *w = m2d_st_writer_new();
    for (int i = 0; i < m2d_st_count(sm->st); i++) {
        const m2d_tensor *t = m2d_st_at(sm->st, i);
        const m2d_tensor *from = t;
        int l, e, n = 0;
        char rest[64];
        if (sscanf(t->name, "model.layers.%d.mlp.experts.%d.%63s%n", &l, &e, rest, &n) == 3 && (e == 1 || e == 3)) {
            char name[160];
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.%s", l, e - 1, rest);
            from = m2d_st_find(sm->st, name);
            assert_non_null(from);
        }
        assert_int_equal(m2d_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, from->data), 0);
    }
    m2d_mkdir_p(dup);
    char *p = m2d_path_join(dup, "model.safetensors");
    assert_int_equal(m2d_st_writer_write(w, p), 0);
    m2d_st_writer_free(w);
    free(p);
    char *cs = m2d_path_join(src, "config.json"), *cd = m2d_path_join(dup, "config.json");
    size_t n;
    char *cfg = m2d_read_file(cs, &n);
    tu_write(cd, cfg, n);
    free(cfg); free(cs); free(cd);
    m2d_model_close(sm);
    m2d_model *m;
    assert_int_equal(m2d_model_open(dup, &m), 0);

    m2d_convert_plan plan = {0};
    plan.target = M2D_TARGET_DENSE;
    plan.K = 4;
    plan.n_groups = 2;
    plan.n_layers = 2;
    snprintf(plan.teacher_hash, sizeof plan.teacher_hash, "%s", m->model_hash);
    m2d_layer_plan lps[2];
    int members[4] = {0, 1, 2, 3}, starts[3] = {0, 2, 4};
    double mw[4] = {0.3, 0.7, 0.6, 0.4}, alpha[2] = {0.25, 0.75};
    for (int i = 0; i < 2; i++)
        lps[i] = (m2d_layer_plan){.layer = i, .K = 4, .n_groups = 2, .d_e = 32, .selected = members,
                                  .group_start = starts, .members = members, .merge_w = mw, .alpha = alpha};
    plan.layers = lps;
    m2d_convert_fingerprint(&plan, plan.fingerprint);
    m2d_model *s;
    assert_int_equal(m2d_convert_build(m, &plan, &s), 0);
    m2d_engine *e;
    assert_int_equal(m2d_engine_new(m, 1, &e), 0);
    uint64_t st = 31;
    for (int l = 0; l < 2; l++) {
        const m2d_layer *L = &s->layers[l];
        float *gate = m2d_tensor_f32(L->gate_proj), *up = m2d_tensor_f32(L->up_proj), *down = m2d_tensor_f32(L->down_proj);
        for (int trial = 0; trial < 4; trial++) {
            float x[32], y[32], f0[32], f2[32];
            for (int j = 0; j < 32; j++) x[j] = (float)tu_rand_normal(&st);
            m2d_swiglu_ref(32, 32, gate, up, down, x, y);
            assert_int_equal(m2d_engine_expert(e, l, 0, x, 1, f0), 0);
            assert_int_equal(m2d_engine_expert(e, l, 2, x, 1, f2), 0);
            double scale = 0, worst = 0;
            for (int j = 0; j < 32; j++) {
                double want = 0.25 * f0[j] + 0.75 * f2[j];
                scale = fmax(scale, fabs(want));
                worst = fmax(worst, fabs(y[j] - want));
            }
            assert_true(worst <= 1e-5 * scale);
        }
        free(gate); free(up); free(down);
    }
    m2d_engine_free(e);
    m2d_convert_student_free(s);
    m2d_model_close(m);
    tu_rm_rf(dir);
    free(src); free(dup); free(dir);
}

/* ---------------- logits: in memory == written == hand-built ---------------- */

static const m2d_tensor *find_t(const m2d_st *st, const char *name) {
    const m2d_tensor *t = m2d_st_find(st, name);
    if (!t) fail_msg("missing tensor %s", name);
    return t;
}

/* Independent construction of the dense student from the plan: straight loops, written with the
 * safetensors writer, config from scratch. */
static void hand_build(const fixture *f, const m2d_convert_plan *p, const char *dir) {
    const m2d_config *c = &f->m->cfg;
    int d = c->hidden_size, de = c->moe_intermediate_size, G = p->n_groups, W = G * de;
    m2d_st_writer *w = m2d_st_writer_new();
    for (int i = 0; i < m2d_st_count(f->m->st); i++) {
        const m2d_tensor *t = m2d_st_at(f->m->st, i);
        if (strstr(t->name, ".mlp.")) continue;
        assert_int_equal(m2d_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data), 0);
    }
    for (int li = 0; li < p->n_layers; li++) {
        const m2d_layer_plan *lp = &p->layers[li];
        float *gate = m2d_calloc((size_t)W * d, sizeof(float)), *up = m2d_calloc((size_t)W * d, sizeof(float)),
              *down = m2d_calloc((size_t)W * d, sizeof(float));
        for (int g = 0; g < G; g++)
            for (int r = 0; r < de; r++)
                for (int j = 0; j < d; j++) {
                    double ag = 0, au = 0, ad = 0, ad2 = 0;
                    for (int m = lp->group_start[g]; m < lp->group_start[g + 1]; m++) {
                        char name[128];
                        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.gate_proj.weight", lp->layer, lp->members[m]);
                        const m2d_tensor *tg = find_t(f->m->st, name);
                        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.up_proj.weight", lp->layer, lp->members[m]);
                        const m2d_tensor *tu = find_t(f->m->st, name);
                        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.down_proj.weight", lp->layer, lp->members[m]);
                        const m2d_tensor *td = find_t(f->m->st, name);
                        float v;
                        m2d_to_f32(tg->dtype, tg->data, (int64_t)r * d + j, 1, &v);
                        ag += lp->merge_w[m] * v;
                        m2d_to_f32(tu->dtype, tu->data, (int64_t)r * d + j, 1, &v);
                        au += lp->merge_w[m] * v;
                        /* down is [d, de]: element (j, r) */
                        m2d_to_f32(td->dtype, td->data, (int64_t)j * de + r, 1, &v);
                        ad += lp->merge_w[m] * v;
                    }
                    ad2 = lp->alpha[g] * ad;
                    /* rounded once to bf16 (the converter: fp32 to odd, then to nearest even) */
                    gate[(size_t)(g * de + r) * d + j] = m2d_bf16_to_f32(bf16_of_double(ag));
                    up[(size_t)(g * de + r) * d + j] = m2d_bf16_to_f32(bf16_of_double(au));
                    down[(size_t)j * W + g * de + r] = m2d_bf16_to_f32(bf16_of_double(ad2));
                }
        char name[128];
        int64_t sgu[2] = {W, d}, sd[2] = {d, W};
        snprintf(name, sizeof name, "model.layers.%d.mlp.gate_proj.weight", lp->layer);
        assert_int_equal(m2d_st_writer_add_f32(w, name, M2D_BF16, 2, sgu, gate), 0);
        snprintf(name, sizeof name, "model.layers.%d.mlp.up_proj.weight", lp->layer);
        assert_int_equal(m2d_st_writer_add_f32(w, name, M2D_BF16, 2, sgu, up), 0);
        snprintf(name, sizeof name, "model.layers.%d.mlp.down_proj.weight", lp->layer);
        assert_int_equal(m2d_st_writer_add_f32(w, name, M2D_BF16, 2, sd, down), 0);
        free(gate); free(up); free(down);
    }
    m2d_mkdir_p(dir);
    char *path = m2d_path_join(dir, "model.safetensors");
    assert_int_equal(m2d_st_writer_write(w, path), 0);
    m2d_st_writer_free(w);
    free(path);
    char *cfg = m2d_strfmt(
        "{\"architectures\":[\"Qwen3ForCausalLM\"],\"model_type\":\"qwen3\",\"vocab_size\":%d,\"hidden_size\":%d,"
        "\"intermediate_size\":%d,\"num_hidden_layers\":%d,\"num_attention_heads\":%d,\"num_key_value_heads\":%d,"
        "\"head_dim\":%d,\"rms_norm_eps\":%g,\"rope_theta\":%g,\"max_position_embeddings\":%d,"
        "\"tie_word_embeddings\":false,\"bos_token_id\":null,\"eos_token_id\":%d,\"torch_dtype\":\"bfloat16\"}",
        c->vocab_size, d, W, c->num_hidden_layers, c->num_attention_heads, c->num_key_value_heads, c->head_dim,
        c->rms_norm_eps, c->rope_theta, c->max_position_embeddings, c->eos_token_id);
    path = m2d_path_join(dir, "config.json");
    tu_write(path, cfg, strlen(cfg));
    free(path);
    free(cfg);
}

static void student_logits_written_and_hand_built(void **state) {
    (void)state;
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    fixture f;
    make_fixture(&f, &o);
    m2d_convert_plan *p = plan_or_fail(&f, "do-acp", "oc", "proportional", 6, M2D_TARGET_DENSE);
    for (int li = 0; li < p->n_layers; li++) {
        const m2d_layer_plan *lp = &p->layers[li];
        for (int g = 0; g < lp->n_groups; g++) {
            double sw = 0;
            for (int m = lp->group_start[g]; m < lp->group_start[g + 1]; m++) sw += lp->merge_w[m];
            assert_true(fabs(sw - 1) < 1e-12);
        }
    }
    m2d_model *s;
    assert_int_equal(m2d_convert_build(f.m, p, &s), 0);
    int32_t tok[40];
    uint64_t st = 4;
    for (int i = 0; i < 40; i++) tok[i] = (int32_t)(tu_rand_u64(&st) % 64);
    float *mem = logits_of(s, tok, 40);

    char *out = m2d_path_join(f.dir, "student");
    assert_int_equal(m2d_convert_write(f.m, s, p, "stats.bin", out), 0);
    m2d_model *w;
    if (m2d_model_open(out, &w)) fail_msg("%s", m2d_errmsg());
    assert_string_equal(w->cfg.arch, "Qwen3ForCausalLM");
    assert_string_equal(w->cfg.model_type, "qwen3");
    assert_int_equal(w->cfg.intermediate_size, 32);
    assert_int_equal(w->cfg.num_experts, 0);
    float *disk = logits_of(w, tok, 40);
    /* same weights (teacher dtype in memory and on disk), same engine: bit-identical (one machine,
     * the same computation) */
    assert_memory_equal(mem, disk, 40 * 64 * sizeof(float));
    /* unchanged tensors are bit-exact copies of the teacher's (copied bytes) */
    for (int i = 0; i < m2d_st_count(f.m->st); i++) {
        const m2d_tensor *t = m2d_st_at(f.m->st, i);
        if (strstr(t->name, ".mlp.")) continue;
        const m2d_tensor *u = m2d_st_find(w->st, t->name);
        assert_non_null(u);
        assert_int_equal(u->nbytes, t->nbytes);
        assert_memory_equal(u->data, t->data, t->nbytes);
    }
    /* moe2dense.json records the plan */
    char *mj = m2d_path_join(out, "moe2dense.json");
    size_t n;
    char *text = m2d_read_file(mj, &n);
    assert_non_null(text);
    cJSON *j = cJSON_Parse(text);
    assert_string_equal(cJSON_GetObjectItem(j, "fingerprint")->valuestring, p->fingerprint);
    assert_string_equal(cJSON_GetObjectItem(j, "scoring")->valuestring, "do-acp");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "layers")), 2);
    cJSON_Delete(j);
    free(text);
    free(mj);

    char *hb = m2d_path_join(f.dir, "hand");
    hand_build(&f, p, hb);
    m2d_model *h;
    if (m2d_model_open(hb, &h)) fail_msg("%s", m2d_errmsg());
    float *hand = logits_of(h, tok, 40);
    /* exact: hand_build merges with the same fp64 operations in the same order as the converter
     * (scalar C, -std=c11: no FMA contraction, IEEE-exact on every CPU) and rounds each once to bf16
     * (bf16_of_double, written apart from the converter's rounding to odd), so the weights are the same
     * bytes; then one machine's same engine */
    assert_memory_equal(hand, disk, 40 * 64 * sizeof(float));
    /* and the student is not the teacher */
    float *teach = logits_of(f.m, tok, 40);
    assert_true(memcmp(teach, disk, 40 * 64 * sizeof(float)) != 0); /* other weights: far from equal */

    /* rewriting into an earlier output is allowed; into a foreign non-empty dir is not */
    assert_int_equal(m2d_convert_write(f.m, s, p, "stats.bin", out), 0);
    assert_int_equal(m2d_convert_write(f.m, s, p, "stats.bin", hb), -1);
    assert_non_null(strstr(m2d_errmsg(), "not empty"));

    /* a convert killed mid-write leaves its marker and temp files (of both name styles): the rerun
     * recognises them as its own, removes them and writes a complete student; a foreign file
     * beside them still makes it refuse */
    char *done = m2d_path_join(out, "moe2dense.json"), *mark = m2d_path_join(out, "moe2dense.incomplete");
    char *old_tmp = m2d_path_join(out, "model.safetensors.tmp.4242");
    char *new_tmp = m2d_path_join(out, "config.json.m2d-tmp.abcde12345");
    assert_int_equal(unlink(done), 0);
    tu_write(mark, "x", 1);
    tu_write(old_tmp, "partial", 7);
    tu_write(new_tmp, "{", 1);
    assert_int_equal(m2d_convert_write(f.m, s, p, "stats.bin", out), 0);
    assert_true(m2d_file_exists(done));
    assert_false(m2d_file_exists(mark));
    assert_false(m2d_file_exists(old_tmp));
    assert_false(m2d_file_exists(new_tmp));
    char *foreign = m2d_path_join(out, "notes.txt.tmp.1");
    assert_int_equal(unlink(done), 0);
    tu_write(foreign, "mine", 4);
    assert_int_equal(m2d_convert_write(f.m, s, p, "stats.bin", out), -1);
    assert_non_null(strstr(m2d_errmsg(), "not empty"));
    assert_true(m2d_file_exists(foreign));
    free(foreign); free(done); free(mark); free(old_tmp); free(new_tmp);

    free(teach); free(hand); free(mem); free(disk);
    m2d_model_close(h);
    m2d_model_close(w);
    free(hb);
    free(out);
    m2d_convert_student_free(s);
    m2d_convert_plan_free(p);
    free_fixture(&f);
}

/* The files model-*.safetensors in DIR (shards). */
static int count_shards(const char *dir) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        n += !strncmp(e->d_name, "model-", 6) && len > 12 && !strcmp(e->d_name + len - 12, ".safetensors");
    }
    closedir(d);
    return n;
}

/* The teacher's tokenizer files are copied byte for byte (SentencePiece's tokenizer.model and a
 * chat template too), and a rewrite leaves none the teacher lacks (an earlier student's). */
static void tokenizer_files_follow_the_teacher(void **state) {
    (void)state;
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    fixture f;
    make_fixture(&f, &o);
    m2d_convert_plan *p = plan_or_fail(&f, "acp", "rr", "uniform", 4, M2D_TARGET_DENSE);
    m2d_model *s;
    assert_int_equal(m2d_convert_build(f.m, p, &s), 0);
    const char *names[] = {"tokenizer.model", "chat_template.jinja"}, *bytes[] = {"\x0a\x01sp\x00model", "{{ x }}\n"};
    size_t lens[] = {10, 8};
    for (int i = 0; i < 2; i++) {
        char *src = m2d_path_join(f.m->dir, names[i]);
        tu_write(src, bytes[i], lens[i]);
        free(src);
    }
    char *out = m2d_path_join(f.dir, "tok-student");
    assert_int_equal(m2d_convert_write(f.m, s, p, "stats.bin", out), 0);
    for (int i = 0; i < 2; i++) {
        char *dst = m2d_path_join(out, names[i]);
        size_t n;
        char *got = m2d_read_file(dst, &n);
        assert_non_null(got);
        assert_int_equal(n, lens[i]);
        assert_memory_equal(got, bytes[i], n);
        free(got), free(dst);
    }
    char *tmpl = m2d_path_join(f.m->dir, names[1]), *stale = m2d_path_join(out, "added_tokens.json");
    char *copied = m2d_path_join(out, names[1]);
    unlink(tmpl);
    tu_write(stale, "{}", 2);
    assert_int_equal(m2d_convert_write(f.m, s, p, "stats.bin", out), 0);
    assert_false(m2d_file_exists(stale));
    assert_false(m2d_file_exists(copied));
    free(tmpl), free(stale), free(copied), free(out);
    m2d_convert_student_free(s);
    m2d_convert_plan_free(p);
    free_fixture(&f);
}

/* A student larger than the shard size is written as Hugging Face's shards + index, and reads back
 * with the same tensors as the one-file checkpoint; a rewrite of the other layout into the same
 * directory leaves none of the earlier weights files (a stale model.safetensors would hide the
 * index from every reader). */
static void large_student_is_sharded(void **state) {
    (void)state;
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    fixture f;
    make_fixture(&f, &o);
    m2d_convert_plan *p = plan_or_fail(&f, "do-acp", "oc", "proportional", 6, M2D_TARGET_DENSE);
    m2d_model *s;
    assert_int_equal(m2d_convert_build(f.m, p, &s), 0);
    char *one = m2d_path_join(f.dir, "one"), *sh = m2d_path_join(f.dir, "sharded");
    char *index = m2d_path_join(sh, "model.safetensors.index.json"), *single = m2d_path_join(sh, "model.safetensors");
    assert_int_equal(m2d_convert_write(f.m, s, p, "stats.bin", one), 0);
    assert_int_equal(m2d_convert_write(f.m, s, p, "stats.bin", sh), 0); /* first one file, then shards over it */
    assert_true(m2d_file_exists(single));
    assert_int_equal(m2d_convert_write_sharded(f.m, s, p, "stats.bin", sh, 4096), 0);
    assert_false(m2d_file_exists(single));
    assert_true(m2d_file_exists(index));
    assert_true(count_shards(sh) > 2);
    m2d_model *a, *b;
    if (m2d_model_open(one, &a) || m2d_model_open(sh, &b)) fail_msg("%s", m2d_errmsg());
    assert_int_equal(m2d_st_file_count(a->st), 1);
    assert_true(m2d_st_file_count(b->st) > 2);
    assert_int_equal(m2d_st_count(a->st), m2d_st_count(b->st));
    for (int i = 0; i < m2d_st_count(a->st); i++) {
        const m2d_tensor *x = m2d_st_at(a->st, i), *y = m2d_st_at(b->st, i);
        assert_string_equal(x->name, y->name);
        assert_int_equal(x->nbytes, y->nbytes);
        assert_memory_equal(x->data, y->data, x->nbytes);
    }
    m2d_model_close(b);
    /* and back to one file: no index, no shard left */
    assert_int_equal(m2d_convert_write(f.m, s, p, "stats.bin", sh), 0);
    assert_false(m2d_file_exists(index));
    assert_int_equal(count_shards(sh), 0);
    if (m2d_model_open(sh, &b)) fail_msg("%s", m2d_errmsg());
    assert_int_equal(m2d_st_file_count(b->st), 1);
    m2d_model_close(b);
    m2d_model_close(a);
    free(index), free(single), free(one), free(sh);
    m2d_convert_student_free(s);
    m2d_convert_plan_free(p);
    free_fixture(&f);
}

/* ---------------- zero padding ---------------- */

static void narrow_dense_layer_is_zero_padded(void **state) {
    (void)state;
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    int only[1] = {0};
    o.mlp_only_layers = only;
    o.n_mlp_only_layers = 1;
    o.intermediate_size = 24; /* narrower than k·d_e = 32 */
    o.num_hidden_layers = 3;
    fixture f;
    make_fixture(&f, &o);
    assert_int_equal(f.s->n_layers, 2);
    m2d_convert_plan *p = plan_or_fail(&f, "freq", "rr", "uniform", 4, M2D_TARGET_DENSE);
    m2d_model *s;
    assert_int_equal(m2d_convert_build(f.m, p, &s), 0);
    const m2d_layer *L = &s->layers[0], *T = &f.m->layers[0];
    assert_int_equal(L->gate_proj->shape[0], 32);
    assert_int_equal(L->down_proj->shape[1], 32);
    float *g = m2d_tensor_f32(L->gate_proj), *tg = m2d_tensor_f32(T->gate_proj);
    float *dn = m2d_tensor_f32(L->down_proj), *td = m2d_tensor_f32(T->down_proj);
    for (int r = 0; r < 32; r++)
        for (int j = 0; j < 32; j++) {
            assert_true(g[r * 32 + j] == (r < 24 ? tg[r * 32 + j] : 0.0f));
            assert_true(dn[j * 32 + r] == (r < 24 ? td[j * 24 + r] : 0.0f));
        }
    /* the padded FFN computes the same function as the original */
    float *u = m2d_tensor_f32(L->up_proj), *tu = m2d_tensor_f32(T->up_proj);
    float x[32], y0[32], y1[32];
    uint64_t st = 8;
    for (int j = 0; j < 32; j++) x[j] = (float)tu_rand_normal(&st);
    m2d_swiglu_ref(32, 24, tg, tu, td, x, y0);
    m2d_swiglu_ref(32, 32, g, u, dn, x, y1);
    /* exact on every CPU: the padded rows give a = b = 0, h = 0, and the down sum adds exact +0
     * terms after the same terms in the same order (scalar fp64 C) */
    assert_memory_equal(y0, y1, sizeof y0);
    /* written and reloaded, it runs */
    char *out = m2d_path_join(f.dir, "student");
    assert_int_equal(m2d_convert_write(f.m, s, p, NULL, out), 0);
    m2d_model *w;
    if (m2d_model_open(out, &w)) fail_msg("%s", m2d_errmsg());
    int32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    float *a = logits_of(s, tok, 8), *b = logits_of(w, tok, 8);
    assert_memory_equal(a, b, 8 * 64 * sizeof(float)); /* in memory and written: the same bytes, one machine's engine */
    free(a); free(b);
    m2d_model_close(w);
    free(out);
    free(g); free(tg); free(dn); free(td); free(u); free(tu);
    m2d_convert_student_free(s);
    m2d_convert_plan_free(p);
    free_fixture(&f);
}

/* ---------------- --target moe ---------------- */

/* the shared-router slot of canonical member I: its expert's rank among the layer's members */
static int slot_of(const m2d_layer_plan *lp, int i) {
    int r = 0;
    for (int j = 0; j < lp->K; j++) r += lp->members[j] < lp->members[i];
    return r;
}

static void moe_target_pruned_and_merged(void **state) {
    (void)state;
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    fixture f;
    make_fixture(&f, &o);
    int32_t tok[24];
    for (int i = 0; i < 24; i++) tok[i] = (i * 7) % 64;
    /* K = E, pure pruning: every expert kept in order with its own router row = the teacher
     * (copied weights, one machine's same engine: exact) */
    m2d_convert_plan *all = plan_or_fail(&f, "reap", "rr", NULL, 8, M2D_TARGET_MOE);
    m2d_model *s;
    assert_int_equal(m2d_convert_build(f.m, all, &s), 0);
    float *a = logits_of(s, tok, 24), *t = logits_of(f.m, tok, 24);
    assert_memory_equal(a, t, 24 * 64 * sizeof(float));
    free(a);
    m2d_convert_student_free(s);
    m2d_convert_plan_free(all);

    /* K = 4 pruned: router rows of the retained experts, written as Qwen3-MoE with 4 experts */
    m2d_convert_plan *p = plan_or_fail(&f, "reap", "rr", NULL, 4, M2D_TARGET_MOE);
    assert_int_equal(m2d_convert_build(f.m, p, &s), 0);
    assert_int_equal(s->cfg.num_experts, 4);
    float *rs = m2d_tensor_f32(s->layers[0].router), *rt = m2d_tensor_f32(f.m->layers[0].router);
    for (int g = 0; g < 4; g++) /* slots in increasing teacher expert id; router rows copied: exact */
        assert_memory_equal(rs + slot_of(&p->layers[0], g) * 32, rt + p->layers[0].members[g] * 32, 32 * sizeof(float));
    free(rs); free(rt);
    a = logits_of(s, tok, 24);
    char *out = m2d_path_join(f.dir, "moe");
    assert_int_equal(m2d_convert_write(f.m, s, p, NULL, out), 0);
    m2d_model *w;
    if (m2d_model_open(out, &w)) fail_msg("%s", m2d_errmsg());
    assert_string_equal(w->cfg.arch, "Qwen3MoeForCausalLM");
    assert_int_equal(w->cfg.num_experts, 4);
    assert_int_equal(w->cfg.num_experts_per_tok, 2);
    float *b = logits_of(w, tok, 24);
    assert_memory_equal(a, b, 24 * 64 * sizeof(float)); /* in memory and written: the same bytes, one machine */
    free(a); free(b);
    m2d_model_close(w);
    m2d_convert_student_free(s);
    m2d_convert_plan_free(p);

    /* K = 6 merged into 3 groups, router "average": one expert per group */
    m2d_convert_opts mo = {.scoring = "acp", .grouping = "oc", .K = 6, .target = M2D_TARGET_MOE, .n_groups = 3,
                           .moe_router = M2D_MOE_ROUTER_AVERAGE};
    assert_int_equal(m2d_convert_plan_build(f.m, f.s, &mo, &p), 0);
    assert_int_equal(m2d_convert_build(f.m, p, &s), 0);
    assert_int_equal(s->cfg.num_experts, 3);
    m2d_model *avg = s;
    m2d_convert_plan *avg_plan = p;
    /* router "shared" (default): 6 experts keep their own rows, members of a group carry the
     * group's merged expert, which is the "average" student's expert bit for bit (the same merge,
     * same plan, same process; router rows copied) */
    mo.moe_router = M2D_MOE_ROUTER_SHARED;
    assert_int_equal(m2d_convert_plan_build(f.m, f.s, &mo, &p), 0);
    assert_string_not_equal(p->fingerprint, avg_plan->fingerprint);
    /* one expert a group: the average of a member's row is its row, the same student, one fingerprint */
    m2d_convert_opts one = {.scoring = "acp", .grouping = "none", .K = 6, .target = M2D_TARGET_MOE,
                            .moe_router = M2D_MOE_ROUTER_AVERAGE};
    m2d_convert_plan *pa, *ps;
    assert_int_equal(m2d_convert_plan_build(f.m, f.s, &one, &pa), 0);
    one.moe_router = M2D_MOE_ROUTER_SHARED;
    assert_int_equal(m2d_convert_plan_build(f.m, f.s, &one, &ps), 0);
    assert_string_equal(pa->fingerprint, ps->fingerprint);
    m2d_model *sa, *ss;
    assert_int_equal(m2d_convert_build(f.m, pa, &sa), 0);
    assert_int_equal(m2d_convert_build(f.m, ps, &ss), 0);
    float *la = logits_of(sa, tok, 24), *ls = logits_of(ss, tok, 24);
    assert_memory_equal(la, ls, 24 * 64 * sizeof(float)); /* the same tensors, one machine's engine: exact */
    free(la), free(ls);
    m2d_convert_student_free(sa), m2d_convert_student_free(ss);
    m2d_convert_plan_free(pa), m2d_convert_plan_free(ps);
    assert_int_equal(m2d_convert_build(f.m, p, &s), 0);
    assert_int_equal(s->cfg.num_experts, 6);
    assert_int_equal(s->cfg.num_experts_per_tok, 2);
    for (int li = 0; li < p->n_layers; li++) {
        const m2d_layer_plan *lp = &p->layers[li];
        const m2d_layer *sl = &s->layers[lp->layer], *al = &avg->layers[lp->layer];
        rs = m2d_tensor_f32(sl->router);
        rt = m2d_tensor_f32(f.m->layers[lp->layer].router);
        for (int g = 0; g < lp->n_groups; g++)
            for (int i = lp->group_start[g]; i < lp->group_start[g + 1]; i++) {
                int x = slot_of(lp, i);
                assert_memory_equal(rs + x * 32, rt + lp->members[i] * 32, 32 * sizeof(float));
                assert_memory_equal(sl->exp_gate[x]->data, al->exp_gate[g]->data, sl->exp_gate[x]->nbytes);
                assert_memory_equal(sl->exp_up[x]->data, al->exp_up[g]->data, sl->exp_up[x]->nbytes);
                assert_memory_equal(sl->exp_down[x]->data, al->exp_down[g]->data, sl->exp_down[x]->nbytes);
            }
        free(rs); free(rt);
    }
    assert_int_equal(m2d_convert_write(f.m, s, p, NULL, out), 0);
    assert_int_equal(m2d_model_open(out, &w), 0);
    assert_int_equal(w->cfg.num_experts, 6);
    a = logits_of(s, tok, 24);
    b = logits_of(w, tok, 24);
    assert_memory_equal(a, b, 24 * 64 * sizeof(float)); /* in memory and written: the same bytes, one machine */
    free(a); free(b);
    m2d_model_close(w);
    m2d_convert_student_free(s);
    m2d_convert_plan_free(p);
    s = avg;
    p = avg_plan;
    assert_int_equal(m2d_convert_write(f.m, s, p, NULL, out), 0);
    assert_int_equal(m2d_model_open(out, &w), 0);
    a = logits_of(s, tok, 24);
    b = logits_of(w, tok, 24);
    assert_memory_equal(a, b, 24 * 64 * sizeof(float)); /* in memory and written: the same bytes, one machine */
    free(a); free(b); free(t);
    m2d_model_close(w);
    m2d_convert_student_free(s);
    m2d_convert_plan_free(p);
    free(out);
    free_fixture(&f);
}

/* ---------------- fingerprints and bad input ---------------- */

/* `help convert` names the default router of --target moe as the one convert uses (issue 14: it
 * described "average" while the default was "shared"): the text says so, and a convert without
 * --moe-router builds the same student (fingerprint) as --moe-router shared, another than average
 * (K = 4 in 2 groups, so the two modes differ). */
static void help_convert_names_the_default_router(void **state) {
    (void)state;
    char *c = m2d_strfmt("%s help convert", tu_bin()), *out = NULL, *err = NULL;
    assert_int_equal(tu_run(c, &out, &err), 0);
    assert_non_null(strstr(out, "  --moe-router R    --target moe only: shared (default: every retained expert keeps its own\n"));
    assert_non_null(strstr(out, "members of one group add up) or average (one expert per group, router row =\n"));
    const char *avg = strstr(out, "or average ("), *next = avg ? strstr(avg, "\n  --") : NULL;
    assert_non_null(avg);
    assert_non_null(next);
    /* average is not called the default anywhere in the rest of the --moe-router description */
    char *rest = m2d_strfmt("%.*s", (int)(next - avg), avg);
    assert_null(strstr(rest, "default"));
    free(rest);
    free(c), free(out), free(err);
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    fixture f;
    make_fixture(&f, &o);
    char *stats = m2d_path_join(f.dir, "t.stats");
    assert_int_equal(m2d_stats_write(f.s, stats), 0);
    const char *modes[3] = {"", "--moe-router shared", "--moe-router average"};
    char *fp[3];
    for (int i = 0; i < 3; i++) {
        c = m2d_strfmt("%s convert --model %s/teacher --stats %s --target moe --scoring reap --grouping rr -K 4 "
                       "--groups 2 %s --fingerprint", tu_bin(), f.dir, stats, modes[i]);
        if (tu_run(c, &fp[i], &err)) fail_msg("%s: %s", c, err);
        free(c), free(err);
    }
    assert_string_equal(fp[0], fp[1]);
    assert_string_not_equal(fp[0], fp[2]);
    for (int i = 0; i < 3; i++) free(fp[i]);
    free(stats);
    free_fixture(&f);
}


static void fingerprints_distinguish_students(void **state) {
    (void)state;
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    fixture f;
    make_fixture(&f, &o);
    m2d_convert_plan *a = plan_or_fail(&f, "acp", "rr", "uniform", 4, M2D_TARGET_DENSE);
    m2d_convert_plan *b = plan_or_fail(&f, "acp", "rr", "uniform", 4, M2D_TARGET_DENSE);
    m2d_convert_plan *c = plan_or_fail(&f, "acp", "rr", "proportional", 4, M2D_TARGET_DENSE);
    m2d_convert_plan *d = plan_or_fail(&f, "acp", "rr", "uniform", 6, M2D_TARGET_DENSE);
    assert_string_equal(a->fingerprint, b->fingerprint);
    assert_string_not_equal(a->fingerprint, c->fingerprint);
    assert_string_not_equal(a->fingerprint, d->fingerprint);
    m2d_convert_plan_free(a); m2d_convert_plan_free(b); m2d_convert_plan_free(c); m2d_convert_plan_free(d);
    free_fixture(&f);
}

static void expect_plan_error(fixture *f, m2d_convert_opts *o, const char *needle) {
    m2d_convert_plan *p = NULL;
    assert_int_equal(m2d_convert_plan_build(f->m, f->s, o, &p), -1);
    if (!strstr(m2d_errmsg(), needle)) fail_msg("error '%s' lacks '%s'", m2d_errmsg(), needle);
}

static void bad_input_rejected(void **state) {
    (void)state;
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    fixture f;
    make_fixture(&f, &o);
    m2d_convert_opts c = {.scoring = "nope", .grouping = "rr", .scaling = "uniform", .K = 4, .target = M2D_TARGET_DENSE};
    expect_plan_error(&f, &c, "available: ");
    expect_plan_error(&f, &c, "acp");
    c.scoring = "acp";
    c.grouping = "zz";
    expect_plan_error(&f, &c, "unknown grouping plugin 'zz' (available: ab, hc-smoe, m-smoe, none, oc, rc, remap, rr, wc)");
    c.grouping = "rr";
    c.scaling = "zz";
    expect_plan_error(&f, &c, "uniform");
    c.scaling = "uniform";
    c.K = 1;
    expect_plan_error(&f, &c, "-K 1 is outside [k, E] = [2, 8]");
    c.K = 9;
    expect_plan_error(&f, &c, "-K 9");
    c.K = 4;
    const char *keys[1] = {"bogus"};
    double vals[1] = {1};
    c.params = (m2d_params){1, keys, vals};
    expect_plan_error(&f, &c, "bogus");
    c.params = (m2d_params){0, NULL, NULL};
    char *k;
    double v;
    assert_int_equal(m2d_convert_parse_param("b=1.5", &k, &v), 0);
    assert_string_equal(k, "b");
    assert_true(v == 1.5);
    free(k);
    assert_int_equal(m2d_convert_parse_param("b", &k, &v), -1);
    assert_int_equal(m2d_convert_parse_param("b=x", &k, &v), -1);
    assert_int_equal(m2d_convert_parse_param("=1", &k, &v), -1);
    /* statistics of another model */
    fixture g;
    o.seed = 2;
    make_fixture(&g, &o);
    m2d_convert_plan *p;
    assert_int_equal(m2d_convert_plan_build(f.m, g.s, &c, &p), -1);
    assert_non_null(strstr(m2d_errmsg(), "model_hash"));
    free_fixture(&g);
    free_fixture(&f);
}

/* ---------------- random baselines (random-ffn, random-init) ---------------- */

/* The generator itself: 2^20 draws of m2d_rand_normal against N(0, 1). Bounds are 6 standard
 * errors of each estimate (mean: 1/√n; variance: √(2/n); 4th moment: √(96/n); P(|z| < 1):
 * √(p(1−p)/n)), so a correct generator fails with probability < 1e-8 and a wrong distribution
 * (uniform, half-normal, a variance off by 1 %) does not pass. Same seed, same sequence. */
static void baseline_normal_generator(void **state) {
    (void)state;
    const int n = 1 << 20;
    uint64_t st = 12345, again = 12345;
    double s1 = 0, s2 = 0, s4 = 0, inside = 0;
    for (int i = 0; i < n; i++) {
        double z = m2d_rand_normal(&st);
        if (i < 1000) assert_true(z == m2d_rand_normal(&again));
        s1 += z, s2 += z * z, s4 += z * z * z * z, inside += fabs(z) < 1;
    }
    double m = s1 / n, v = s2 / n - m * m, k4 = s4 / n, p = inside / n;
    assert_true(fabs(m) < 6 / sqrt(n));
    assert_true(fabs(v - 1) < 6 * sqrt(2.0 / n));
    assert_true(fabs(k4 - 3) < 6 * sqrt(96.0 / n));
    assert_true(fabs(p - 0.682689492137086) < 6 * sqrt(0.2167 / n));
}

/* The documented draw of tensor NAME's element values (std, seed), in the tensor's dtype: the
 * bytes a baseline must hold. */
static void *expected_normal(const m2d_tensor *t, double std, uint64_t seed) {
    int64_t n = m2d_tensor_numel(t);
    float *v = m2d_malloc((size_t)n * sizeof *v);
    uint64_t st = seed ^ m2d_fnv1a64(t->name);
    for (int64_t i = 0; i < n; i++) v[i] = (float)(std * m2d_rand_normal(&st));
    void *b = m2d_malloc(t->nbytes);
    m2d_from_f32(t->dtype, v, n, b);
    free(v);
    return b;
}

static m2d_model *write_baseline(fixture *f, m2d_baseline kind, uint64_t seed, const char *name, char **fp) {
    m2d_convert_opts o = {.scoring = "sf", .grouping = "rr", .scaling = "uniform", .K = 2,
                          .target = M2D_TARGET_DENSE, .baseline = kind, .baseline_seed = seed};
    m2d_convert_plan *p;
    m2d_model *s, *w;
    if (m2d_convert_plan_build(f->m, f->s, &o, &p) || m2d_convert_build(f->m, p, &s)) fail_msg("%s", m2d_errmsg());
    assert_true(p->init_std == 0.02); /* the test teacher's config has no initializer_range */
    char *out = m2d_path_join(f->dir, name);
    assert_int_equal(m2d_convert_write(f->m, s, p, "stats.bin", out), 0);
    if (m2d_model_open(out, &w)) fail_msg("%s", m2d_errmsg());
    *fp = m2d_strdup(p->fingerprint);
    /* moe2dense.json records the baseline */
    char *mj = m2d_path_join(out, "moe2dense.json");
    size_t n;
    char *text = m2d_read_file(mj, &n);
    cJSON *j = cJSON_Parse(text), *b = cJSON_GetObjectItem(j, "baseline");
    assert_non_null(b);
    assert_string_equal(cJSON_GetObjectItem(b, "kind")->valuestring, m2d_baseline_name(kind));
    assert_true(cJSON_GetObjectItem(b, "seed")->valuedouble == (double)seed);
    assert_true(cJSON_GetObjectItem(b, "init_std")->valuedouble == 0.02);
    cJSON_Delete(j);
    free(text), free(mj), free(out);
    m2d_convert_student_free(s);
    m2d_convert_plan_free(p);
    return w;
}

/* Which tensors are the teacher's bit for bit, which are the documented random draws; shapes of
 * the student's width (k·d_e); the same seed gives the same bytes, another seed other ones; the
 * pooled random values follow normal(0, 0.02) (6 standard errors, as above; bf16-rounded values
 * move the std by < 2^-9 relative, far inside the bound). */
static void baselines_random_ffn_and_random_init(void **state) {
    (void)state;
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    o.dtype = M2D_BF16;
    fixture f;
    make_fixture(&f, &o);
    char *fp_a, *fp_b, *fp_c, *fp_d;
    m2d_model *ffn = write_baseline(&f, M2D_BASELINE_RANDOM_FFN, 7, "ffn", &fp_a);
    m2d_model *ffn2 = write_baseline(&f, M2D_BASELINE_RANDOM_FFN, 7, "ffn2", &fp_b);
    m2d_model *ffn8 = write_baseline(&f, M2D_BASELINE_RANDOM_FFN, 8, "ffn8", &fp_c);
    m2d_model *init = write_baseline(&f, M2D_BASELINE_RANDOM_INIT, 7, "init", &fp_d);
    assert_string_equal(fp_a, fp_b);
    assert_string_not_equal(fp_a, fp_c);
    assert_string_not_equal(fp_a, fp_d);
    m2d_convert_plan *conv = plan_or_fail(&f, "sf", "rr", "uniform", 2, M2D_TARGET_DENSE);
    assert_string_not_equal(fp_a, conv->fingerprint);
    m2d_convert_plan_free(conv);
    int width = f.m->cfg.num_experts_per_tok * f.m->cfg.moe_intermediate_size;
    assert_int_equal(ffn->cfg.intermediate_size, width);
    assert_int_equal(init->cfg.intermediate_size, width);
    double s1 = 0, s2 = 0, inside = 0, n = 0;
    for (int i = 0; i < m2d_st_count(ffn->st); i++) {
        const m2d_tensor *a = m2d_st_at(ffn->st, i), *b = m2d_st_find(ffn2->st, a->name),
                         *c = m2d_st_find(ffn8->st, a->name), *r = m2d_st_find(init->st, a->name),
                         *t = m2d_st_find(f.m->st, a->name);
        assert_non_null(b), assert_non_null(c), assert_non_null(r);
        assert_memory_equal(a->data, b->data, a->nbytes); /* deterministic: the same seed's draws, one machine */
        int is_ffn = strstr(a->name, ".mlp.") != NULL, is_norm = strstr(a->name, "norm") != NULL;
        if (is_ffn) {
            assert_int_equal(a->shape[a->shape[0] == f.m->cfg.hidden_size ? 1 : 0], width);
            void *want = expected_normal(a, 0.02, 7); /* the same generator in this process: exact */
            assert_memory_equal(a->data, want, a->nbytes);
            free(want);
            assert_true(memcmp(a->data, c->data, a->nbytes) != 0); /* another seed: other draws */
            float *v = m2d_tensor_f32(a);
            for (int64_t e = 0; e < m2d_tensor_numel(a); e++)
                s1 += v[e], s2 += (double)v[e] * v[e], inside += fabs(v[e]) < 0.02, n++;
            free(v);
        } else { /* random-ffn: the teacher's, bit for bit */
            assert_non_null(t);
            assert_int_equal(a->nbytes, t->nbytes);
            assert_memory_equal(a->data, t->data, t->nbytes);
        }
        /* random-init: matrices the documented draws, norms 1 */
        float *v = m2d_tensor_f32(r);
        if (is_norm) {
            for (int64_t e = 0; e < m2d_tensor_numel(r); e++) assert_true(v[e] == 1.0f);
        } else {
            void *want = expected_normal(r, 0.02, 7);
            assert_memory_equal(r->data, want, r->nbytes); /* same generator, same process */
            free(want);
            if (!is_ffn) assert_true(memcmp(r->data, t->data, t->nbytes) != 0);
        }
        free(v);
    }
    double m = s1 / n, sd = sqrt(s2 / n - m * m), p = inside / n;
    assert_true(n > 4000);
    assert_true(fabs(m) < 6 * 0.02 / sqrt(n));
    assert_true(fabs(sd / 0.02 - 1) < 6 * sqrt(0.5 / n) + 0x1p-9);
    assert_true(fabs(p - 0.682689492137086) < 6 * sqrt(0.2167 / n) + 0.01); /* + bf16 ties at ±σ */
    /* the random-init student runs: its logits are near-uniform (|logit| small, ~0.02²·d scale) */
    int32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    float *lg = logits_of(init, tok, 8);
    for (int i = 0; i < 8 * init->cfg.vocab_size; i++) assert_true(isfinite(lg[i]) && fabs(lg[i]) < 1);
    free(lg);
    /* a baseline is a dense student */
    m2d_convert_opts bad = {.scoring = "sf", .grouping = "rr", .K = 2, .target = M2D_TARGET_MOE,
                            .baseline = M2D_BASELINE_RANDOM_FFN};
    expect_plan_error(&f, &bad, "dense student");
    m2d_baseline k;
    assert_int_equal(m2d_baseline_parse("random-init", &k), 0);
    assert_int_equal(k, M2D_BASELINE_RANDOM_INIT);
    assert_int_equal(m2d_baseline_parse("random", &k), -1);
    assert_non_null(strstr(m2d_errmsg(), "random-ffn or random-init"));
    m2d_model_close(ffn), m2d_model_close(ffn2), m2d_model_close(ffn8), m2d_model_close(init);
    free(fp_a), free(fp_b), free(fp_c), free(fp_d);
    free_fixture(&f);
}

/* ---------------- related work: ConMoE remap, pruning by ratio, none + indicator ---------------- */

/* ConMoE's normalised weight distance (paper 002 App. B.1) straight from its definition:
 * (1/3) Σ_m 2‖W_m^a − W_m^b‖_F / (‖W_m^a‖_F + ‖W_m^b‖_F + 2ε), fp64 over the fp32 values */
static double brute_distance(const m2d_model *m, int la, int ea, int lb, int eb, double eps) {
    double dist = 0;
    for (int r = 0; r < 3; r++) {
        const m2d_layer *A = &m->layers[la], *B = &m->layers[lb];
        const m2d_tensor *ta = r == 0 ? A->exp_gate[ea] : r == 1 ? A->exp_up[ea] : A->exp_down[ea];
        const m2d_tensor *tb = r == 0 ? B->exp_gate[eb] : r == 1 ? B->exp_up[eb] : B->exp_down[eb];
        float *x = m2d_tensor_f32(ta), *y = m2d_tensor_f32(tb);
        double diff = 0, nx = 0, ny = 0;
        for (int64_t i = 0; i < m2d_tensor_numel(ta); i++)
            diff += ((double)x[i] - y[i]) * ((double)x[i] - y[i]), nx += (double)x[i] * x[i], ny += (double)y[i] * y[i];
        dist += 2 * sqrt(diff) / (sqrt(nx) + sqrt(ny) + 2 * eps) / 3;
        free(x), free(y);
    }
    return dist;
}

/* The remap of paper 002 §3.2 by brute force: prototypes = the top K of the pooled frequency scores
 * (ties → lower layer, then expert), m(e) = the nearest prototype (ties → lower pool index). */
static void brute_remap(const fixture *f, int first, int n, double rho, int fixed, int *proto_of) {
    const int E = f->m->cfg.num_experts, P = n * E, K = (int)fmax(1, lround((1 - rho) * (fixed ? E : P)));
    int *is_proto = m2d_calloc((size_t)P, sizeof(int));
    for (int l = 0; l < (fixed ? n : 1); l++) /* fixed: the top K of each layer; else of the pool */
        for (int c = 0; c < K; c++) {
            int best = -1, lo = fixed ? l * E : 0, hi = fixed ? (l + 1) * E : P;
            for (int i = lo; i < hi; i++)
                if (!is_proto[i] &&
                    (best < 0 || f->s->layers[first + i / E].n[i % E] > f->s->layers[first + best / E].n[best % E]))
                    best = i;
            is_proto[best] = 1;
        }
    for (int e = 0; e < P; e++) {
        int le = f->s->layers[first + e / E].layer, best = -1;
        double bd = INFINITY;
        for (int q = 0; q < P && !is_proto[e]; q++) {
            if (!is_proto[q]) continue;
            double d = brute_distance(f->m, le, e % E, f->s->layers[first + q / E].layer, q % E, 1e-8);
            if (d < bd) bd = d, best = q;
        }
        proto_of[e] = is_proto[e] ? e : best;
    }
    free(is_proto);
}

/* remap student: the teacher's router unchanged, slot e holding m(e)'s weights bit for bit (copies,
 * weight 1, no permutation: exact on every CPU) */
static int check_remap(const fixture *f, int scope, double rho, int fixed) {
    char prm[32];
    snprintf(prm, sizeof prm, "scope=%d,fixed_k=%d", scope, fixed);
    m2d_params params;
    if (m2d_params_parse(prm, &params)) fail_msg("%s", m2d_errmsg());
    m2d_convert_opts o = {.scoring = "freq", .grouping = "remap", .target = M2D_TARGET_MOE, .ratio = rho,
                          .params = params};
    m2d_convert_plan *p;
    if (m2d_convert_plan_build(f->m, f->s, &o, &p)) fail_msg("%s", m2d_errmsg());
    m2d_model *s;
    assert_int_equal(m2d_convert_build(f->m, p, &s), 0);
    const int E = f->m->cfg.num_experts;
    assert_int_equal(p->K, E);
    assert_int_equal(s->cfg.num_experts, E);
    int *proto = m2d_malloc((size_t)scope * E * sizeof *proto), n_proto = 0;
    for (int first = 0; first < p->n_layers; first += scope) {
        int n = p->n_layers - first < scope ? p->n_layers - first : scope;
        brute_remap(f, first, n, rho, fixed, proto);
        for (int i = 0; i < n * E; i++) n_proto += proto[i] == i;
        for (int i = 0; i < n * E; i++) {
            const m2d_layer_plan *lp = &p->layers[first + i / E];
            int e = i % E, g;
            for (g = 0; g < lp->n_groups; g++) /* the group holding expert e */
                for (int j = lp->group_start[g]; j < lp->group_start[g + 1]; j++)
                    if (lp->members[j] == e) goto found;
            fail_msg("expert %d in no group", e);
        found:
            assert_int_equal(lp->src_start[g + 1] - lp->src_start[g], 1);
            int src = lp->src_start[g];
            assert_int_equal(lp->src_layer[src], f->s->layers[first + proto[i] / E].layer);
            assert_int_equal(lp->src_expert[src], proto[i] % E);
            assert_true(lp->src_w[src] == 1 && lp->src_perm[src] == NULL);
            const m2d_layer *sl = &s->layers[lp->layer], *tl = &f->m->layers[lp->src_layer[src]];
            assert_memory_equal(sl->exp_gate[e]->data, tl->exp_gate[proto[i] % E]->data, sl->exp_gate[e]->nbytes);
            assert_memory_equal(sl->exp_up[e]->data, tl->exp_up[proto[i] % E]->data, sl->exp_up[e]->nbytes);
            assert_memory_equal(sl->exp_down[e]->data, tl->exp_down[proto[i] % E]->data, sl->exp_down[e]->nbytes);
            assert_memory_equal(sl->router->data, f->m->layers[lp->layer].router->data, sl->router->nbytes);
        }
    }
    int cross = 0; /* prototypes taken from another layer of the scope */
    for (int l = 0; l < p->n_layers; l++)
        for (int g = 0; g < p->layers[l].n_groups; g++) cross += p->layers[l].src_layer[p->layers[l].src_start[g]] != p->layers[l].layer;
    /* parameters: every distinct expert tensor (by its data) counted once */
    int64_t repeats = 0;
    for (int l = 0; l < p->n_layers; l++) {
        const m2d_layer *sl = &s->layers[p->layers[l].layer];
        for (int e = 0; e < E; e++) {
            int seen = 0;
            for (int q = 0; q < e; q++) seen |= sl->exp_gate[q]->data == sl->exp_gate[e]->data;
            repeats += seen;
        }
    }
    assert_true(m2d_convert_student_params(p, s) ==
                m2d_model_param_counts(&s->cfg).total - repeats * 3 * s->cfg.hidden_size * s->cfg.moe_intermediate_size);
    /* K_G = max(1, round((1 − ρ)|E_G|)) prototypes per scope (scopes here are whole) */
    assert_int_equal(n_proto, (int)lround((1 - rho) * p->n_layers * E));
    free(proto);
    m2d_convert_student_free(s);
    m2d_convert_plan_free(p);
    m2d_params_free(&params);
    return cross;
}

static void conmoe_remap_against_brute_force(void **state) {
    (void)state;
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    fixture f;
    make_fixture(&f, &o);
    assert_int_equal(f.s->n_layers, 2);
    assert_int_equal(check_remap(&f, 1, 0.5, 0), 0); /* layer-local */
    /* one scope of both layers: here some experts' prototypes are in the other layer */
    assert_true(check_remap(&f, 2, 0.25, 0) > 0);
    assert_true(check_remap(&f, 2, 0.75, 0) > 0);
    /* cross-layer fixed-k (Table 2): the top of each layer, remapped over the whole scope */
    check_remap(&f, 2, 0.5, 1);
    /* a remap student computes Σ_{i∈top-k} g_i f_{m(i)}: the teacher with expert i's weights
     * replaced by m(i)'s; with ρ → 0 every expert is its own prototype: the teacher exactly */
    m2d_convert_opts id = {.scoring = "freq", .grouping = "remap", .target = M2D_TARGET_MOE, .ratio = 0.01};
    m2d_convert_plan *p;
    m2d_model *s;
    assert_int_equal(m2d_convert_plan_build(f.m, f.s, &id, &p), 0);
    assert_int_equal(m2d_convert_build(f.m, p, &s), 0);
    int32_t tok[16];
    for (int i = 0; i < 16; i++) tok[i] = (i * 5) % 64;
    float *a = logits_of(s, tok, 16), *t = logits_of(f.m, tok, 16);
    assert_memory_equal(a, t, 16 * 64 * sizeof(float)); /* the teacher's bytes, one machine's engine: exact */
    free(a), free(t);
    m2d_convert_student_free(s);
    m2d_convert_plan_free(p);
    /* remap keeps the router: --moe-router average and a -K other than E are refused */
    id.moe_router = M2D_MOE_ROUTER_AVERAGE;
    expect_plan_error(&f, &id, "--router shared");
    free_fixture(&f);
}

/* ConMoE's scores over a cross-layer pool (score_scope): Norm_G(REAP) · Norm_G(b) with min/max and
 * the nearest neighbour taken over both layers' experts; conmoe-dist = b alone. */
static void conmoe_pooled_scores(void **state) {
    (void)state;
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    fixture f;
    make_fixture(&f, &o);
    const int E = f.m->cfg.num_experts, P = 2 * E;
    m2d_layer_view views[2];
    for (int l = 0; l < 2; l++) {
        const m2d_layer_stats *ls = &f.s->layers[l];
        views[l] = (m2d_layer_view){ls, &f.m->layers[ls->layer], E, 2, E, 32, 16, NULL};
    }
    double a[16], b[16], got[16];
    for (int i = 0; i < P; i++) {
        const m2d_layer_stats *ls = &f.s->layers[i / E];
        int e = i % E;
        a[i] = ls->n[e] > 0 ? ls->sum_rf[e] / ls->n[e] : 0;
        b[i] = INFINITY;
        for (int q = 0; q < P; q++)
            if (q != i) b[i] = fmin(b[i], brute_distance(f.m, ls->layer, e, f.s->layers[q / E].layer, q % E, 1e-8));
    }
    assert_int_equal(m2d_score_scope(m2d_plugin_find(M2D_SCORING, "conmoe-dist"), views, 2, got), 0);
    /* the Gram form of ‖x − y‖ loses ~1e-7 relative to the direct sum (fp64 of fp32 products) */
    for (int i = 0; i < P; i++) assert_true(fabs(got[i] - b[i]) < 1e-6 * (1 + b[i]));
    double alo = INFINITY, ahi = -INFINITY, blo = INFINITY, bhi = -INFINITY;
    for (int i = 0; i < P; i++) alo = fmin(alo, a[i]), ahi = fmax(ahi, a[i]), blo = fmin(blo, b[i]), bhi = fmax(bhi, b[i]);
    assert_int_equal(m2d_score_scope(m2d_plugin_find(M2D_SCORING, "conmoe"), views, 2, got), 0);
    for (int i = 0; i < P; i++) {
        double want = (a[i] - alo) / (ahi - alo + 1e-8) * (b[i] - blo) / (bhi - blo + 1e-8);
        if (!(fabs(got[i] - want) < 1e-5)) fail_msg("conmoe[%d]: %.17g want %.17g (a %g b %g)", i, got[i], want, a[i], b[i]);
    }
    /* a pool of one layer is the plain score */
    double one[8];
    int sel[8];
    assert_int_equal(m2d_score_scope(m2d_plugin_find(M2D_SCORING, "conmoe"), views, 1, got), 0);
    assert_int_equal(m2d_score_and_select(m2d_plugin_find(M2D_SCORING, "conmoe"), &views[0], one, sel), 0);
    assert_memory_equal(got, one, sizeof one); /* the same scoring of the same statistics, one process */
    free_fixture(&f);
}

/* M-SMoE through convert: a merged group is Σ_s w_s · π_s(W_s) with each source's intermediate
 * neurons permuted (rows of gate/up, columns of down), stored in the slot of every member; the
 * router is the teacher's. Checked against that sum on the teacher's weights (bf16: one rounding,
 * so within a bf16 ulp). */
static void m_smoe_student_holds_aligned_merges(void **state) {
    (void)state;
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    fixture f;
    make_fixture(&f, &o);
    m2d_convert_opts mo = {.scoring = "freq", .grouping = "m-smoe", .target = M2D_TARGET_MOE, .ratio = 0.5};
    m2d_convert_plan *p;
    m2d_model *s;
    assert_int_equal(m2d_convert_plan_build(f.m, f.s, &mo, &p), 0);
    assert_int_equal(m2d_convert_build(f.m, p, &s), 0);
    const int d = 32, de = 16;
    int checked = 0, groups = 0;
    for (int l = 0; l < p->n_layers; l++) {
        const m2d_layer_plan *lp = &p->layers[l];
        groups += lp->n_groups;
        /* router: copied bytes */
        assert_memory_equal(s->layers[lp->layer].router->data, f.m->layers[lp->layer].router->data,
                            f.m->layers[lp->layer].router->nbytes);
        for (int g = 0; g < lp->n_groups; g++) {
            int a = lp->src_start[g], n = lp->src_start[g + 1] - a;
            for (int m = 0; m < 3; m++) {
                double *want = m2d_calloc((size_t)d * de, sizeof *want);
                for (int x = a; x < a + n; x++) {
                    const m2d_layer *tl = &f.m->layers[lp->src_layer[x]];
                    const m2d_tensor *t = m == 0 ? tl->exp_gate[lp->src_expert[x]] : m == 1 ? tl->exp_up[lp->src_expert[x]]
                                                                                           : tl->exp_down[lp->src_expert[x]];
                    float *w = m2d_tensor_f32(t);
                    for (int r = 0; r < (m == 2 ? d : de); r++)
                        for (int c = 0; c < (m == 2 ? de : d); c++) {
                            int pr = m != 2 && lp->src_perm[x] ? lp->src_perm[x][r] : r;
                            int pc = m == 2 && lp->src_perm[x] ? lp->src_perm[x][c] : c;
                            want[r * (m == 2 ? de : d) + c] += lp->src_w[x] * w[pr * (m == 2 ? de : d) + pc];
                        }
                    free(w);
                    checked += lp->src_perm[x] != NULL;
                }
                for (int i = lp->group_start[g]; i < lp->group_start[g + 1]; i++) { /* every member's slot */
                    const m2d_layer *sl = &s->layers[lp->layer];
                    int e = lp->members[i];
                    float *got = m2d_tensor_f32(m == 0 ? sl->exp_gate[e] : m == 1 ? sl->exp_up[e] : sl->exp_down[e]);
                    for (int q = 0; q < d * de; q++)
                        if (fabs(got[q] - want[q]) > 0x1p-8 * fabs(want[q]) + 1e-30)
                            fail_msg("layer %d group %d matrix %d [%d]: %g vs %g", lp->layer, g, m, q, got[q], want[q]);
                    free(got);
                }
                free(want);
            }
        }
    }
    assert_true(checked > 0); /* some members were aligned by a permutation */
    assert_int_equal(groups, (int)lround(0.5 * 8) * p->n_layers); /* the global budget: groups·L in all */
    m2d_convert_student_free(s);
    m2d_convert_plan_free(p);
    free_fixture(&f);
}

/* grouping none + scaling indicator: a dense student of width K·d_e holding the K selected experts
 * side by side with α = 1 (paper 001 §2 (i)); --ratio and --top-k for an MoE student */
static void none_indicator_ratio_topk(void **state) {
    (void)state;
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    fixture f;
    make_fixture(&f, &o);
    m2d_convert_plan *p = plan_or_fail(&f, "freq", "none", "indicator", 5, M2D_TARGET_DENSE);
    m2d_model *s;
    assert_int_equal(m2d_convert_build(f.m, p, &s), 0);
    assert_int_equal(p->n_groups, 5);
    assert_int_equal(s->cfg.intermediate_size, 5 * 16);
    for (int l = 0; l < p->n_layers; l++) {
        const m2d_layer_plan *lp = &p->layers[l];
        float *g = m2d_tensor_f32(s->layers[lp->layer].gate_proj);
        for (int c = 0; c < 5; c++) {
            assert_int_equal(lp->group_start[c + 1] - lp->group_start[c], 1);
            assert_true(lp->alpha[c] == 1.0);
            float *t = m2d_tensor_f32(f.m->layers[lp->layer].exp_gate[lp->members[c]]);
            /* a singleton group of weight 1, alpha 1: 1·x rounds to x, exact */
            assert_memory_equal(g + (size_t)c * 16 * 32, t, 16 * 32 * sizeof(float));
            free(t);
        }
        free(g);
    }
    m2d_convert_student_free(s);
    m2d_convert_plan_free(p);
    /* --ratio 0.25 of E = 8: K = 6 pruned; --top-k 1: one expert per token */
    m2d_convert_opts mo = {.scoring = "reap", .grouping = "none", .target = M2D_TARGET_MOE, .ratio = 0.25, .top_k = 1};
    assert_int_equal(m2d_convert_plan_build(f.m, f.s, &mo, &p), 0);
    assert_int_equal(p->K, 6);
    assert_int_equal(m2d_convert_build(f.m, p, &s), 0);
    assert_int_equal(s->cfg.num_experts, 6);
    assert_int_equal(s->cfg.num_experts_per_tok, 1);
    m2d_convert_student_free(s);
    m2d_convert_plan_free(p);
    mo.n_groups = 3;
    expect_plan_error(&f, &mo, "give neither -K nor --groups");
    mo = (m2d_convert_opts){.scoring = "reap", .grouping = "none", .target = M2D_TARGET_MOE, .K = 6, .n_groups = 3};
    expect_plan_error(&f, &mo, "groups must be K = 6");
    free_fixture(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(merge_weights_sum_to_one_and_uniform_fallback),
        cmocka_unit_test(merge_matrices_weighted_average),
        cmocka_unit_test(merge_rounds_once_to_bf16),
        cmocka_unit_test(concat_layout),
        cmocka_unit_test(dense_ffn_equals_alpha_weighted_experts),
        cmocka_unit_test(copied_experts_group_equals_expert),
        cmocka_unit_test(student_logits_written_and_hand_built),
        cmocka_unit_test(tokenizer_files_follow_the_teacher),
        cmocka_unit_test(large_student_is_sharded),
        cmocka_unit_test(narrow_dense_layer_is_zero_padded),
        cmocka_unit_test(moe_target_pruned_and_merged),
        cmocka_unit_test(fingerprints_distinguish_students),
        cmocka_unit_test(help_convert_names_the_default_router),
        cmocka_unit_test(bad_input_rejected),
        cmocka_unit_test(baseline_normal_generator),
        cmocka_unit_test(baselines_random_ffn_and_random_init),
        cmocka_unit_test(conmoe_remap_against_brute_force),
        cmocka_unit_test(conmoe_pooled_scores),
        cmocka_unit_test(none_indicator_ratio_topk),
        cmocka_unit_test(m_smoe_student_holds_aligned_merges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
