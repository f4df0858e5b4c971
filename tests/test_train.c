/* train: the dense student's training forward against the engine, the whole model's gradient
 * against finite differences of the float64 reference (tests/reftrain.c) for every loss, and the
 * properties a distillation step must have: independent of the thread count, recompute
 * (activation checkpointing) changes no bit, micro-batches sum to the batch, the schedule, and
 * the teacher's routing override (Eq. 6). */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "engine/engine.h"
#include "familyckpt.h"
#include "hfcheck.h"
#include "reftrain.h"
#include "testmodel.h"
#include "train/kd.h"
#include "train/net.h"
#include "train/optim.h"
#include "train/params.h"
#include "train/trainer.h"

enum { L = 8, NSEQ = 2, V = 64 };

static char *g_dir;
static m2d_model *g_teacher, *g_student, *g_tied;
/* the families' dense students (tests/golden/hf, vocabulary 320) and a teacher of their vocabulary */
static m2d_model *g_teacher320, *g_gptoss, *g_olmoe, *g_qwen2, *g_mistral, *g_deepseek, *g_deepseek_q;

static m2d_model *open_dir(char *dir) {
    m2d_model *m;
    if (m2d_model_open(dir, &m)) fail_msg("%s", m2d_errmsg());
    free(dir);
    return m;
}

static m2d_model *write_open_vocab(const char *name, int moe, int tied, uint64_t seed, int vocab) {
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    o.vocab_size = vocab;
    o.moe = moe;
    o.tie_word_embeddings = tied;
    o.seed = seed;
    o.intermediate_size = moe ? 64 : 32; /* the student: k * d_e = 2 * 16 */
    o.init_std = 0.3f;                   /* weights large enough that every term of the loss matters */
    char *dir = m2d_path_join(g_dir, name);
    if (m2d_testmodel_write(dir, &o)) fail_msg("%s", m2d_errmsg());
    return open_dir(dir);
}

static m2d_model *write_open(const char *name, int moe, int tied, uint64_t seed) {
    return write_open_vocab(name, moe, tied, seed, V);
}

/* GPT-OSS's dense student (q/k/v/o and gate/up/down biases, sinks, YaRN, the clamped SwiGLU),
 * edited so that every feature acts within L = 8 positions and the grid's small weights: a
 * window of 3 on its sliding layer, swiglu_limit 0.5 (about a third of the gates and up values
 * clamped) */
static m2d_model *gptoss_student(void) {
    char *cfg = tu_family_edited_config("gptoss-student", "{\"sliding_window\": 3, \"swiglu_limit\": 0.5}", NULL);
    char *dir = m2d_path_join(g_dir, "gptoss-student");
    if (tu_family_checkpoint(dir, cfg, 5)) fail_msg("%s", m2d_errmsg());
    free(cfg);
    return open_dir(dir);
}

/* a converted student's golden (its config and tensor list, no seed) with the grid's weights */
static m2d_model *listed_student(const char *golden, uint64_t seed) {
    cJSON *g = hf_load_golden(golden);
    cJSON_AddNumberToObject(g, "seed", (double)seed);
    char *dir = hf_build_listed(g, g_dir);
    cJSON_Delete(g);
    return open_dir(dir);
}

/* OLMoE's dense student (the q/k norm over the whole projection, clip_qkv 1.5: the normed q and
 * k are ~N(0, 1), so about one in eight values is clamped) */
static m2d_model *olmoe_student(void) { return listed_student("olmoe-student", 6); }

/* Mixtral's dense student MistralForCausalLM (no q/k norm, a sliding window: 3 here, cutting into
 * L = 8), its Llama layout written from its config */
static m2d_model *mistral_student(void) {
    char *cfg = tu_family_edited_config("mixtral-student", "{\"sliding_window\": 3}", NULL);
    m2d_config c;
    if (m2d_config_parse(cfg, strlen(cfg), "config.json", &c, NULL)) fail_msg("%s", m2d_errmsg());
    int64_t d = c.hidden_size, q = (int64_t)c.num_attention_heads * c.head_dim, F = c.intermediate_size;
    int64_t kv = (int64_t)c.num_key_value_heads * c.head_dim;
    const char *lname[] = {"input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
                           "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                           "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"};
    int64_t lshape[][2] = {{d, 0}, {d, 0}, {q, d}, {kv, d}, {kv, d}, {d, q}, {F, d}, {F, d}, {d, F}};
    int n = 3 + 9 * c.num_hidden_layers;
    m2d_testmodel_tensor *t = calloc((size_t)n, sizeof *t);
    char **names = calloc((size_t)n, sizeof *names);
    t[0] = (m2d_testmodel_tensor){"model.embed_tokens.weight", M2D_BF16, 2, {c.vocab_size, d}};
    t[1] = (m2d_testmodel_tensor){"model.norm.weight", M2D_BF16, 1, {d, 0}};
    t[2] = (m2d_testmodel_tensor){"lm_head.weight", M2D_BF16, 2, {c.vocab_size, d}};
    for (int l = 0, i = 3; l < c.num_hidden_layers; l++)
        for (int r = 0; r < 9; r++, i++) {
            names[i] = m2d_strfmt("model.layers.%d.%s", l, lname[r]);
            t[i] = (m2d_testmodel_tensor){names[i], M2D_BF16, lshape[r][1] ? 2 : 1, {lshape[r][0], lshape[r][1]}};
        }
    char *dir = m2d_path_join(g_dir, "mistral-student");
    if (m2d_testmodel_write_tensors(dir, cfg, 8, t, n)) fail_msg("%s", m2d_errmsg());
    for (int i = 0; i < n; i++) free(names[i]);
    free(names), free(t), free(cfg);
    m2d_config_free(&c);
    return open_dir(dir);
}

/* golden NAME's DeepSeek-V2 teacher made a dense student of width F (every layer dense: its MoE
 * layers' tensors replaced by a dense FFN's), with the grid's weights of SEED */
static m2d_model *deepseek_dense_of(const char *name, int F, uint64_t seed) {
    cJSON *g = hf_load_golden(name), *list = cJSON_CreateArray(), *e;
    char *cfg = tu_family_edited_config(name, NULL, NULL);
    m2d_config c;
    if (m2d_config_parse(cfg, strlen(cfg), "config.json", &c, NULL)) fail_msg("%s", m2d_errmsg());
    free(cfg);
    char *set = m2d_strfmt("{\"first_k_dense_replace\": %d, \"intermediate_size\": %d}", c.num_hidden_layers, F);
    cfg = tu_family_edited_config(name, set, NULL);
    cJSON_ArrayForEach(e, hf_item(g, "tensors"))
        if (!strstr(cJSON_GetArrayItem(e, 0)->valuestring, ".mlp.")) cJSON_AddItemToArray(list, cJSON_Duplicate(e, 1));
    const char *dtype = cJSON_GetArrayItem(cJSON_GetArrayItem(list, 0), 1)->valuestring;
    const char *ffn[] = {"gate_proj", "up_proj", "down_proj"};
    for (int l = 0; l < c.num_hidden_layers; l++)
        for (int k = 0; k < 3; k++) {
            char *t = m2d_strfmt("[\"model.layers.%d.mlp.%s.weight\", \"%s\", [%d, %d]]", l, ffn[k], dtype,
                                 k < 2 ? F : c.hidden_size, k < 2 ? c.hidden_size : F);
            cJSON_AddItemToArray(list, cJSON_Parse(t));
            free(t);
        }
    cJSON_ReplaceItemInObject(g, "tensors", list);
    cJSON_ReplaceItemInObject(g, "config_json", cJSON_CreateString(cfg));
    char *dense = m2d_strfmt("%s-dense", name);
    cJSON_ReplaceItemInObject(g, "name", cJSON_CreateString(dense));
    cJSON_AddNumberToObject(g, "seed", (double)seed);
    char *dir = hf_build_listed(g, g_dir);
    cJSON_Delete(g);
    m2d_config_free(&c);
    free(set), free(cfg), free(dense);
    return open_dir(dir);
}

static int setup(void **state) {
    (void)state;
    g_dir = tu_tmpdir();
    g_teacher = write_open("teacher", 1, 0, 1);
    g_student = write_open("student", 0, 0, 2);
    g_tied = write_open("tied", 0, 1, 3);
    g_teacher320 = write_open_vocab("teacher320", 1, 0, 4, 320);
    g_gptoss = gptoss_student();
    g_olmoe = olmoe_student();
    g_qwen2 = listed_student("qwen2moe-student", 9); /* Qwen2-MoE's: Qwen2ForCausalLM, q/k/v biases */
    g_mistral = mistral_student();
    /* DeepSeek-V2's: the converted golden's (MLA without q LoRA, values of 12 in heads of 24, so
     * o_proj is padded; YaRN, mscale 0.707 on both), and golden deepseekv2-q's teacher made dense
     * (q LoRA, tied embeddings, values as wide as the heads, mscale_all_dim 0.5 alone) */
    g_deepseek = listed_student("deepseekv2-student", 10);
    g_deepseek_q = deepseek_dense_of("deepseekv2-q", 24, 11);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    m2d_model_close(g_teacher), m2d_model_close(g_student), m2d_model_close(g_tied);
    m2d_model_close(g_teacher320), m2d_model_close(g_gptoss), m2d_model_close(g_olmoe);
    m2d_model_close(g_qwen2), m2d_model_close(g_mistral), m2d_model_close(g_deepseek), m2d_model_close(g_deepseek_q);
    tu_rm_rf(g_dir);
    free(g_dir);
    return 0;
}

static void tokens(uint64_t seed, int32_t *t, int n) {
    for (int i = 0; i < n; i++) t[i] = (int32_t)(tu_rand_u64(&seed) % V);
}

static m2d_trainer_opts topts(int threads) {
    m2d_trainer_opts o = {.seq_len = L, .batch = NSEQ, .micro_batch = 0, .loss = M2D_LOSS_FKL, .mse_weight = 1.0,
                          .threads = threads};
    m2d_optim_defaults(&o.optim);
    o.optim.steps = 4, o.optim.warmup = 1, o.optim.lr = 1e-2, o.optim.min_lr = 1e-3;
    return o;
}

/* ---- the training forward is the engine's ---- */

/* One window: the same backend ops on the same fp32 weights (bf16 widened exactly) and the same
 * GEMM shapes as the engine: the same bits. Windows stacked into one micro-batch run GEMMs over
 * more rows, for which OpenBLAS may block the same dot products differently (the engine itself
 * gives bit-identical results only for equal shapes): then each logit is within a few fp32
 * roundings of the GEMM chain, < 1e-5 of the logits' scale. */
static void training_logits_equal_engine(void **state) {
    (void)state;
    int32_t tok[NSEQ * L];
    tokens(5, tok, NSEQ * L);
    /* the families' students: every op of theirs (biases, sinks, windows, YaRN, clamped SwiGLU,
     * clip_qkv, the whole q/k norm, MLA with and without q LoRA) as the engine runs it */
    m2d_model *students[] = {g_student, g_tied, g_gptoss, g_olmoe, g_qwen2, g_mistral, g_deepseek, g_deepseek_q};
    for (int s = 0; s < (int)M2D_ARRAY_LEN(students); s++) {
        m2d_model *teacher = s < 2 ? g_teacher : g_teacher320;
        m2d_trainer *t;
        m2d_trainer_opts o = topts(2);
        if (m2d_trainer_new(teacher, students[s], &o, &t)) fail_msg("%s", m2d_errmsg());
        int V = students[s]->cfg.vocab_size;
        float *got = malloc(sizeof(float) * NSEQ * L * V), *want = malloc(sizeof(float) * L * V);
        float *one = malloc(sizeof(float) * L * V);
        m2d_engine *e;
        assert_int_equal(m2d_engine_new(students[s], 2, &e), 0);
        assert_int_equal(m2d_trainer_logits(t, tok, NSEQ, got), 0);
        for (int w = 0; w < NSEQ; w++) {
            assert_int_equal(m2d_engine_logits(e, tok + w * L, L, want), 0);
            assert_int_equal(m2d_trainer_logits(t, tok + w * L, 1, one), 0);
            assert_memory_equal(one, want, sizeof(float) * L * V); /* one machine, same ops and shapes: exact */
            double md = 0, scale = 0;
            for (int i = 0; i < L * V; i++) {
                md = fmax(md, fabs(got[(size_t)w * L * V + i] - want[i]));
                scale = fmax(scale, fabs(want[i]));
            }
            assert_true(md < 1e-5 * scale);
        }
        m2d_engine_free(e);
        m2d_trainer_free(t);
        free(got), free(want), free(one);
    }
}

/* ---- whole-model gradient against finite differences ---- */

typedef struct {
    m2d_backend *be;
    m2d_engine *te;
    m2d_train_params *p;
    m2d_net *net;
    m2d_kd *kd;
} parts;

static void parts_open(parts *x, m2d_model *teacher, m2d_model *student, m2d_loss_kind kind, m2d_mse_norm norm) {
    m2d_backend_opts bo = {.n_threads = 2};
    if (m2d_backend_new("cpu", &bo, &x->be) || m2d_engine_new(teacher, 2, &x->te) ||
        m2d_train_params_new(student, x->be, &x->p))
        fail_msg("%s", m2d_errmsg());
    m2d_net_opts no = {.seq_len = L, .max_seqs = NSEQ};
    if (m2d_net_new(&student->cfg, x->p, &no, &x->net) ||
        m2d_kd_new(teacher, x->te, &student->cfg, x->net, x->p, NSEQ * L, kind, 0.7, norm, &x->kd))
        fail_msg("%s", m2d_errmsg());
}

static void parts_close(parts *x) {
    m2d_kd_free(x->kd), m2d_net_free(x->net), m2d_train_params_free(x->p), m2d_engine_free(x->te);
    m2d_backend_free(x->be);
}

/* the teacher's logits (and layer outputs) as float64 constants of the reference problem */
static void teacher_outputs(m2d_engine *te, const int32_t *tok, double *logits, double *layers) {
    const m2d_config *c = &m2d_engine_model(te)->cfg;
    int d = c->hidden_size, nl = c->num_hidden_layers, V = c->vocab_size;
    float *z = malloc(sizeof(float) * L * V), *h = malloc(sizeof(float) * L * d), *ly = malloc(sizeof(float) * nl * L * d);
    for (int s = 0; s < NSEQ; s++) {
        assert_int_equal(m2d_engine_logits(te, tok + s * L, L, z), 0);
        for (int i = 0; i < L * V; i++) logits[(size_t)s * L * V + i] = z[i];
        assert_int_equal(m2d_engine_hidden(te, tok + s * L, L, h, ly), 0);
        for (int l = 0; l < nl; l++)
            for (int i = 0; i < L * d; i++) layers[((size_t)l * NSEQ * L + (size_t)s * L) * d + i] = ly[(size_t)l * L * d + i];
    }
    free(z), free(h), free(ly);
}

/* parameter I is a dense layer's router (OLMoE's and GPT-OSS's dense students keep one) */
static int unused_router(const m2d_train_params *p, int i) {
    for (int l = 0; l < p->n_layers; l++)
        if (p->layer[l][M2D_T_ROUTER] == i || p->layer[l][M2D_T_ROUTER_BIAS] == i) return 1;
    return 0;
}

/* The fp32 gradient of every parameter against central differences of the float64 loss on a
 * sample of entries (entry 0 and five random ones per tensor). Tolerance: the fp32 backward
 * chains ~12 stages per layer (GEMMs over <= 64 terms, norms, softmax), each within ~K^1.5 u =
 * 3e-5 of its output's scale (see test_train_ops.c), so 1e-3 of the tensor's largest gradient
 * bounds the whole chain with room; the finite differences are exact to ~1e-9.
 * NORM "minitron" (fkl+mse): the MSE part equals 0.7 x the divergence (the balance), and the
 * gradient is that of the "sum" loss whose weight gives the same value (the ratio is detached:
 * Minitron / NeMo's balancer scale the MSE's gradient, they do not differentiate the ratio). */
static void gradient_case(m2d_model *teacher, m2d_model *student, m2d_loss_kind kind, m2d_mse_norm norm) {
    parts x;
    parts_open(&x, teacher, student, kind, norm);
    int V = student->cfg.vocab_size;
    int32_t tok[NSEQ * L];
    tokens(7, tok, NSEQ * L);
    double scale = 1.0 / (NSEQ * L), div = 0, mse = 0;
    x.be->ops->enter(x.be);
    m2d_train_params_zero(x.p, M2D_PBUF_GRADS);
    assert_int_equal(m2d_kd_teacher(x.kd, tok, NSEQ, L), 0);
    assert_int_equal(m2d_net_forward(x.net, tok, NSEQ), 0);
    m2d_kd_loss_backward(x.kd, scale, &div, &mse);
    assert_int_equal(x.be->ops->leave(x.be), 0);
    size_t T = x.p->total;
    float *w32 = malloc(sizeof(float) * T), *g32 = malloc(sizeof(float) * T);
    m2d_train_params_download(x.p, M2D_PBUF_WEIGHTS, w32);
    m2d_train_params_download(x.p, M2D_PBUF_GRADS, g32);
    int d = teacher->cfg.hidden_size, nl = teacher->cfg.num_hidden_layers; /* = the student's for the MSE */
    double *tl = malloc(sizeof(double) * NSEQ * L * V), *tly = malloc(sizeof(double) * nl * NSEQ * L * d);
    teacher_outputs(x.te, tok, tl, tly);
    tu_kd_problem pb = {&student->cfg, x.p, NSEQ, L, tok, tl, tly, kind == M2D_LOSS_RKL, scale,
                        kind == M2D_LOSS_FKL_MSE ? 0.7 : 0};
    double *w = malloc(sizeof(double) * T);
    for (size_t i = 0; i < T; i++) w[i] = w32[i];
    if (kind == M2D_LOSS_FKL_MSE && norm == M2D_MSE_MINITRON) {
        assert_true(fabs(mse - 0.7 * div) < 1e-6 * div); /* weighs as much as the logit loss, times w */
        pb.mse_weight = 0;
        double d0 = tu_ref_kd_loss(&pb, w);
        pb.mse_weight = 1;
        double layers_sum = tu_ref_kd_loss(&pb, w) - d0; /* sum over layers of each layer's MSE */
        pb.mse_weight = mse / layers_sum;                /* the equivalent "sum" weight */
    }
    double ref = tu_ref_kd_loss(&pb, w);
    /* the loss itself: fp32 logits (error ~1e-6 of their scale) inside a float64 sum */
    assert_true(fabs(div + mse - ref) < 1e-5 * fabs(ref) + 1e-9);
    if (kind == M2D_LOSS_FKL_MSE) assert_true(mse > 0.01 * ref); /* the MSE term is really in */
    uint64_t st = 99;
    double worst = 0;
    for (int i = 0; i < x.p->n; i++) {
        const m2d_tparam *q = &x.p->p[i];
        double gmax = 0;
        for (size_t j = 0; j < q->n; j++) gmax = fmax(gmax, fabs(g32[q->off + j]));
        if (unused_router(x.p, i)) { /* a one-expert router the dense forward never reads: no gradient */
            assert_true(gmax == 0);
            continue;
        }
        assert_true(gmax > 0); /* every other parameter receives a gradient */
        for (int k = 0; k < 6; k++) {
            size_t j = k ? (size_t)(tu_rand_u64(&st) % q->n) : 0, at = q->off + j;
            double h = 1e-5 * fmax(1, fabs(w[at])), keep = w[at];
            w[at] = keep + h;
            double a = tu_ref_kd_loss(&pb, w);
            w[at] = keep - h;
            double b = tu_ref_kd_loss(&pb, w);
            w[at] = keep;
            double fd = (a - b) / (2 * h), e = fabs(fd - g32[at]) / gmax;
            worst = fmax(worst, e);
            if (!(e < 1e-3)) fail_msg("%s %s[%zu]: backward %.9g, finite differences %.9g (relative %.3g)",
                                      m2d_loss_name(kind), q->name, j, g32[at], fd, e);
        }
    }
    if (getenv("M2D_SHOW_ERR"))
        print_message("%s %s: worst relative gradient error %.3g\n", student->cfg.arch, m2d_loss_name(kind), worst);
    parts_close(&x);
    free(w32), free(g32), free(tl), free(tly), free(w);
}

static void whole_model_gradient(void **state) {
    (void)state;
    gradient_case(g_teacher, g_student, M2D_LOSS_FKL, M2D_MSE_SUM);
    gradient_case(g_teacher, g_student, M2D_LOSS_RKL, M2D_MSE_SUM);
    gradient_case(g_teacher, g_student, M2D_LOSS_FKL_MSE, M2D_MSE_SUM);
    gradient_case(g_teacher, g_student, M2D_LOSS_FKL_MSE, M2D_MSE_MINITRON);
    gradient_case(g_teacher, g_tied, M2D_LOSS_FKL, M2D_MSE_SUM); /* tied embeddings: both uses add into one gradient */
}

/* Issue 24: the families' dense students, every feature of theirs in the gradient (GPT-OSS: biases,
 * sinks, a window cutting in, YaRN, the clamped SwiGLU; OLMoE: clip_qkv and the whole q/k norm;
 * Qwen2: q/k/v biases; Mistral: a window; DeepSeek-V2: MLA with and without q LoRA, the shared
 * rotated key, YaRN's mscale, o_proj's padding, tied embeddings) */
static void family_students_gradient(void **state) {
    (void)state;
    m2d_model *students[] = {g_gptoss, g_olmoe, g_qwen2, g_mistral, g_deepseek, g_deepseek_q};
    for (int i = 0; i < (int)M2D_ARRAY_LEN(students); i++) /* OLMoE's with reverse KL, the others forward */
        gradient_case(g_teacher320, students[i], students[i] == g_olmoe ? M2D_LOSS_RKL : M2D_LOSS_FKL, M2D_MSE_SUM);
}

/* ---- properties of a step ---- */

/* S steps of STUDENT (teacher TEACHER) from its initialisation; the step stats and the final weights */
static void run_steps_of(m2d_model *teacher, m2d_model *student, m2d_trainer_opts o, int S, m2d_step_stats *st,
                         float **weights, size_t *total) {
    m2d_trainer *t;
    if (m2d_trainer_new(teacher, student, &o, &t)) fail_msg("%s", m2d_errmsg());
    int32_t tok[NSEQ * L];
    for (int s = 1; s <= S; s++) {
        tokens((uint64_t)s * 17, tok, NSEQ * L);
        if (m2d_trainer_step(t, s, tok, &st[s - 1])) fail_msg("%s", m2d_errmsg());
        /* the teacher's forward took some time; a wall time is no result of the step (the
         * comparisons below are of the numbers a step computes) */
        assert_true(st[s - 1].teacher_s > 0);
        st[s - 1].teacher_s = 0;
    }
    m2d_train_params *p = m2d_trainer_params(t);
    *total = p->total;
    *weights = malloc(sizeof(float) * p->total);
    m2d_train_params_download(p, M2D_PBUF_WEIGHTS, *weights);
    m2d_trainer_free(t);
}

static void run_steps(m2d_trainer_opts o, int S, m2d_step_stats *st, float **weights, size_t *total) {
    run_steps_of(g_teacher, g_student, o, S, st, weights, total);
}

/* 1, 3 threads and recompute give the same bits (MLA: its latents and the values' zero padding
 * kept or recomputed); whether the last step's loss is below the first's */
static int independent_of_threads_and_recompute(m2d_model *teacher, m2d_model *student) {
    m2d_step_stats a[4], b[4], c[4];
    float *wa, *wb, *wc;
    size_t n;
    run_steps_of(teacher, student, topts(1), 4, a, &wa, &n);
    run_steps_of(teacher, student, topts(3), 4, b, &wb, &n);
    m2d_trainer_opts o = topts(2);
    o.recompute = true;
    run_steps_of(teacher, student, o, 4, c, &wc, &n);
    /* exact on every CPU: one machine, the same computation; the backend's results do not depend
     * on the thread count (backend.h) and recomputation reruns the same forward ops */
    assert_memory_equal(a, b, sizeof a);
    assert_memory_equal(a, c, sizeof a);
    assert_memory_equal(wa, wb, sizeof(float) * n);
    assert_memory_equal(wa, wc, sizeof(float) * n);
    free(wa), free(wb), free(wc);
    return a[3].loss < a[0].loss;
}

/* The Qwen3 student learns on these batches (a new one every step); the
 * DeepSeek-V2 students, of the grid's weights against another family's teacher, need more than
 * four such steps (on one repeated batch they learn: 1.57 -> 1.03 and 1.85 -> 0.89 in four) */
static void steps_independent_of_threads_and_recompute(void **state) {
    (void)state;
    assert_true(independent_of_threads_and_recompute(g_teacher, g_student)); /* it learns */
    independent_of_threads_and_recompute(g_teacher320, g_deepseek_q);
    independent_of_threads_and_recompute(g_teacher320, g_deepseek);
}

/* MLA's o_proj as the loader pads it (zero columns after each head's v_head_dim): the parameter
 * knows which columns are the checkpoint's, and after steps its padding is still exactly zero in
 * the weights, their gradient and both moments (the padded values are zero, so is everything
 * computed from them: exact on every CPU) */
static void mla_padding_never_trained(void **state) {
    (void)state;
    m2d_trainer_opts o = topts(2);
    m2d_trainer *t;
    if (m2d_trainer_new(g_teacher320, g_deepseek, &o, &t)) fail_msg("%s", m2d_errmsg());
    int32_t tok[NSEQ * L];
    for (int s = 1; s <= 3; s++) {
        m2d_step_stats st;
        tokens((uint64_t)s * 29, tok, NSEQ * L);
        if (m2d_trainer_step(t, s, tok, &st)) fail_msg("%s", m2d_errmsg());
    }
    m2d_train_params *p = m2d_trainer_params(t);
    const m2d_config *c = &g_deepseek->cfg;
    float *b = malloc(sizeof(float) * p->total);
    int checked = 0;
    for (int k = 0; k < M2D_PBUF_COUNT; k++) {
        m2d_train_params_download(p, (m2d_pbuf)k, b);
        for (int l = 0; l < c->num_hidden_layers; l++) {
            const m2d_tparam *q = &p->p[p->layer[l][M2D_T_O]];
            char *want = m2d_strfmt("model.layers.%d.self_attn.o_proj.weight", l);
            assert_string_equal(q->name, want); /* the checkpoint's name, written [d, heads * v_head_dim] */
            assert_true(q->group == c->head_dim && q->keep == c->v_head_dim && q->keep < q->group);
            assert_int_equal(m2d_tparam_stored_cols(q), c->num_attention_heads * c->v_head_dim);
            double real = 0;
            for (int64_t r = 0; r < q->rows; r++)
                for (int64_t j = 0; j < q->cols; j++) {
                    float x = b[q->off + r * q->cols + j];
                    if (j % q->group < q->keep) {
                        real += fabs(x);
                        continue;
                    }
                    assert_true(x == 0.0f);
                    checked++;
                }
            assert_true(real > 0); /* the real columns did move / hold values */
            free(want);
        }
    }
    assert_true(checked > 0);
    free(b);
    m2d_trainer_free(t);
}

/* micro-batches of one window: the same step up to the order of fp32 gradient sums */
static void micro_batches_sum_to_the_batch(void **state) {
    (void)state;
    m2d_step_stats a[3], b[3];
    float *wa, *wb;
    size_t n;
    run_steps(topts(2), 3, a, &wa, &n);
    m2d_trainer_opts o = topts(2);
    o.micro_batch = 1;
    run_steps(o, 3, b, &wb, &n);
    for (int s = 0; s < 3; s++) {
        assert_true(fabs(a[s].loss - b[s].loss) < 1e-5 * a[s].loss);
        assert_true(fabs(a[s].grad_norm - b[s].grad_norm) < 1e-4 * a[s].grad_norm);
        assert_true(a[s].lr == b[s].lr); /* the same schedule formula of the step number: exact */
    }
    free(wa), free(wb);
}

static void lr_schedule(void **state) {
    (void)state;
    m2d_optim_opts o;
    m2d_optim_defaults(&o);
    o.steps = 10, o.warmup = 4, o.lr = 1e-3, o.min_lr = 1e-4;
    assert_true(fabs(m2d_lr_at(&o, 1) - 2.5e-4) < 1e-18);
    assert_true(fabs(m2d_lr_at(&o, 4) - 1e-3) < 1e-18);
    /* s = 7: t = 3/6, cos(pi/2) = 0: halfway */
    assert_true(fabs(m2d_lr_at(&o, 7) - 5.5e-4) < 1e-15);
    assert_true(fabs(m2d_lr_at(&o, 10) - 1e-4) < 1e-18);
    o.warmup = 0;
    assert_true(fabs(m2d_lr_at(&o, 1) - (1e-4 + 0.9e-3 * 0.5 * (1 + cos(M_PI / 10)))) < 1e-15);
    m2d_optim_defaults(&o); /* Table 9 */
    /* parsed decimals against the same literals: strtod and the compiler both round correctly */
    assert_true(o.lr == 1e-4 && o.min_lr == 1e-5 && o.warmup == 20 && o.beta1 == 0.9 && o.beta2 == 0.95 &&
                o.weight_decay == 0.01 && o.eps == 1e-8);
}

/* the loss with a decaying step must differ from one without, and norms must not decay */
static void decay_only_on_matrices(void **state) {
    (void)state;
    m2d_train_params *p;
    m2d_backend *be;
    m2d_backend_opts bo = {.n_threads = 1};
    assert_int_equal(m2d_backend_new("cpu", &bo, &be), 0);
    assert_int_equal(m2d_train_params_new(g_student, be, &p), 0);
    for (int i = 0; i < p->n; i++) {
        int norm = strstr(p->p[i].name, "norm") != NULL;
        assert_int_equal(p->p[i].decay, !norm);
    }
    /* untied: embedding and LM head are two parameters; every role of every layer is there */
    assert_int_not_equal(p->embed, p->lm_head);
    assert_int_equal(p->n, 3 + g_student->cfg.num_hidden_layers * 11);
    m2d_train_params_free(p);
    assert_int_equal(m2d_train_params_new(g_tied, be, &p), 0);
    assert_int_equal(p->embed, p->lm_head);
    m2d_train_params_free(p);
    /* an MoE model is refused */
    assert_int_equal(m2d_train_params_new(g_teacher, be, &p), -1);
    assert_non_null(strstr(m2d_errmsg(), "MoE layer"));
    m2d_backend_free(be);
}

/* Eq. 6: K' experts by probability, weighted by the raw softmax probabilities */
typedef struct { int calls, k; int ok; } route_seen;

static int route_hook(void *user, const m2d_moe_event *ev) {
    route_seen *r = user;
    r->calls++;
    r->k = ev->top_k;
    for (int t = 0; t < ev->n_tokens; t++) {
        const float *p = ev->probs + (size_t)t * ev->n_experts;
        for (int j = 0; j < ev->top_k; j++) {
            int e = ev->topk[t * ev->top_k + j];
            if (ev->gates[t * ev->top_k + j] != p[e]) r->ok = 0;
            if (j && p[e] > p[ev->topk[t * ev->top_k + j - 1]]) r->ok = 0;
        }
    }
    return 0;
}

/* teacher_topk = k (the teacher's own top-k) is the teacher's own routing, the paper's Table 4
 * row "8 (default)" (renormalised where the config renormalises): the KD targets equal those of
 * no override (0), bit for bit; k + 1 is Eq. 6 and changes them. */
static float *teacher_targets(int topk, const int32_t *tok) {
    m2d_trainer_opts o = topts(2);
    o.teacher_topk = topk;
    m2d_trainer *t;
    if (m2d_trainer_new(g_teacher, g_student, &o, &t)) fail_msg("%s", m2d_errmsg());
    float *z = malloc(sizeof(float) * NSEQ * L * V);
    if (m2d_trainer_teacher_logits(t, tok, NSEQ, z)) fail_msg("%s", m2d_errmsg());
    m2d_trainer_free(t);
    return z;
}

static void teacher_topk_k_is_own_routing(void **state) {
    (void)state;
    int k = g_teacher->cfg.num_experts_per_tok;
    assert_true(g_teacher->cfg.norm_topk_prob && k < g_teacher->cfg.num_experts); /* Eq. 6 at k would differ */
    assert_int_equal(m2d_trainer_route_topk(&g_teacher->cfg, 0), 0);
    assert_int_equal(m2d_trainer_route_topk(&g_teacher->cfg, k), 0);
    assert_int_equal(m2d_trainer_route_topk(&g_teacher->cfg, k + 1), k + 1);
    int32_t tok[NSEQ * L];
    tokens(5, tok, NSEQ * L);
    float *own = teacher_targets(0, tok), *at_k = teacher_targets(k, tok), *wider = teacher_targets(k + 1, tok);
    assert_memory_equal(own, at_k, sizeof(float) * NSEQ * L * V);
    assert_memory_not_equal(own, wider, sizeof(float) * NSEQ * L * V);
    free(own), free(at_k), free(wider);
}

static void teacher_route_override(void **state) {
    (void)state;
    m2d_engine *e;
    assert_int_equal(m2d_engine_new(g_teacher, 1, &e), 0);
    int32_t tok[L];
    tokens(3, tok, L);
    float *a = malloc(sizeof(float) * L * V), *b = malloc(sizeof(float) * L * V), *c = malloc(sizeof(float) * L * V);
    assert_int_equal(m2d_engine_logits(e, tok, L, a), 0);
    assert_int_equal(m2d_engine_set_route_topk(e, 5), 0);
    route_seen r = {0, 0, 1};
    m2d_engine_set_moe_hook(e, route_hook, &r);
    assert_int_equal(m2d_engine_logits(e, tok, L, b), 0);
    assert_int_equal(r.k, 5);
    assert_true(r.calls == 2 && r.ok);
    m2d_engine_set_moe_hook(e, NULL, NULL);
    assert_int_equal(m2d_engine_set_route_topk(e, 0), 0); /* back to the model's own routing */
    assert_int_equal(m2d_engine_logits(e, tok, L, c), 0);
    assert_memory_equal(a, c, sizeof(float) * L * V); /* the same forward again, one machine: exact */
    assert_memory_not_equal(a, b, sizeof(float) * L * V);
    assert_int_equal(m2d_engine_set_route_topk(e, 9), -1); /* 8 experts */
    assert_non_null(strstr(m2d_errmsg(), "num_experts"));
    m2d_engine_free(e);
    free(a), free(b), free(c);
}

/* Eq. 6 on GPT-OSS's router (top-k of the logits, gates a softmax over those k): its own gates are
 * renormalised (they differ from the full softmax p), the override's are p itself, K' of them in
 * descending order (engine.h m2d_engine_set_route_topk) */
static void teacher_route_override_gptoss(void **state) {
    (void)state;
    char *cfg = tu_family_edited_config("gptoss", NULL, NULL), *dir = m2d_path_join(g_dir, "gptoss-teacher");
    if (tu_family_checkpoint(dir, cfg, 7)) fail_msg("%s", m2d_errmsg());
    m2d_model *m = open_dir(dir);
    free(cfg);
    int k = m->cfg.num_experts_per_tok;
    assert_true(m->cfg.ops.router == M2D_ROUTER_TOPK_SOFTMAX && k + 1 <= m->cfg.num_experts);
    m2d_engine *e;
    assert_int_equal(m2d_engine_new(m, 1, &e), 0);
    int32_t tok[L];
    tokens(3, tok, L);
    float *z = malloc(sizeof(float) * L * m->cfg.vocab_size);
    route_seen own = {0, 0, 1}, wide = {0, 0, 1};
    m2d_engine_set_moe_hook(e, route_hook, &own);
    assert_int_equal(m2d_engine_logits(e, tok, L, z), 0);
    assert_true(own.calls > 0 && own.k == k && !own.ok); /* the model's own gates: renormalised */
    assert_int_equal(m2d_engine_set_route_topk(e, k + 1), 0);
    m2d_engine_set_moe_hook(e, route_hook, &wide);
    assert_int_equal(m2d_engine_logits(e, tok, L, z), 0);
    assert_true(wide.calls == own.calls && wide.k == k + 1 && wide.ok); /* exactly p (the same fp32 values) */
    m2d_engine_free(e);
    m2d_model_close(m);
    free(z);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(training_logits_equal_engine),
        cmocka_unit_test(whole_model_gradient),
        cmocka_unit_test(family_students_gradient),
        cmocka_unit_test(mla_padding_never_trained),
        cmocka_unit_test(steps_independent_of_threads_and_recompute),
        cmocka_unit_test(micro_batches_sum_to_the_batch),
        cmocka_unit_test(lr_schedule),
        cmocka_unit_test(decay_only_on_matrices),
        cmocka_unit_test(teacher_route_override),
        cmocka_unit_test(teacher_route_override_gptoss),
        cmocka_unit_test(teacher_topk_k_is_own_routing),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
