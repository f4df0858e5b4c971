/* distill: moe2dense's distillation steps against an independent reference — the same steps done
 * by transformers' Qwen3 modelling (and, issue 24, GPT-OSS's, OLMoE's, DeepSeek-V2's and Mixtral's
 * dense students) with torch autograd, torch.optim.AdamW and clip_grad_norm_
 * (tools/distill_ref.py; committed numbers in tests/golden/distill/, or $M2D_DISTILL_GOLDEN, which
 * `make verify-distill` makes afresh). Per case: the same teacher and student checkpoints (rebuilt
 * here byte for byte from the grid generator), the same token windows in file order, the same
 * schedule, micro-batches, loss, clipping and AdamW; per step the loss before the update, the
 * gradient norm before clipping and the learning rate must agree; and each tensor's total update.
 * Every case runs on each backend that trains: the CPU, and a GPU where the machine has one (the
 * teacher's forward and the student's training both there; tools/gpu_run.sh). */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "engine/backend.h"
#include "model/model.h"
#include "familyckpt.h"
#include "hfcheck.h"
#include "testmodel.h"
#include "tokenizer/tokenizer.h"
#include "train/data.h"
#include "train/trainer.h"

/* Tolerances. Both sides compute the same float32 math in different summation orders (OpenBLAS
 * blocks and our fixed-order reductions vs torch's kernels), so step 1 agrees to the rounding of
 * fp32 sums: ~1e-7 relative for the loss (a mean of per-position sums over the vocabulary) and
 * ~1e-6 for the gradient norm (each gradient element is a sum over all positions, relative error
 * ~sqrt(N) u with N ~ 10^2..10^3 terms). Later steps start from weights that differ by those
 * roundings; AdamW normalises each update by sqrt(v), so an element whose gradient is at the
 * rounding level may move by up to 2 lr in the other direction -- such elements have gradients
 * ~1e-6 of the largest, so their effect on the next losses stays at that level over these few
 * steps. Bounds: 1e-5 for the loss, 1e-4 for the gradient norm and for each tensor's total update
 * (the Euclidean norm over its elements, where the sign-unstable ones count most), an order of
 * magnitude above what the two implementations show (printed by each case); the learning rate is
 * the same double-precision formula on both sides (the golden keeps 12 digits). */
#define LOSS_TOL 1e-5
#define NORM_TOL 1e-4
#define UPDATE_TOL 1e-4
/* --train-precision bf16 (case fkl-bf16): an fp32 difference of ~1e-7 between the two sides moves
 * an operand across a bf16 rounding boundary now and then, by a whole bf16 step (2^-8 relative),
 * so the two sides part by what bf16 rounding does to nearby inputs, not by fp32 rounding. That is
 * measured on the reference itself: torch against torch with the student's initial weights
 * multiplied by 1 + 1.2e-7 N(0, 1) (7 draws, the case's 6 steps) parts by up to 2.7e-4 in a loss,
 * 1.8e-3 in a gradient norm and 3.0e-3 in a tensor's update. Bounds: about 4x those. Training the
 * same case in fp32 lands outside them (checked: 5e-3 in the second step's loss), so the check
 * tells bf16 training from fp32 training; the rounding of each GEMM's operands is checked exactly
 * by test_train_ops (gemm_bf16_backward). */
#define BF16_LOSS_TOL 1e-3
#define BF16_NORM_TOL 7e-3
#define BF16_UPDATE_TOL 1.2e-2


static const char *golden_dir(void) {
    const char *d = getenv("M2D_DISTILL_GOLDEN");
    return d ? d : "tests/golden/distill";
}

static cJSON *load_json(const char *path) {
    size_t n;
    char *text = m2d_read_file(path, &n);
    if (!text) fail_msg("%s", m2d_errmsg());
    cJSON *g = cJSON_ParseWithLength(text, n);
    if (!g) fail_msg("%s: invalid JSON", path);
    free(text);
    return g;
}

static const cJSON *item(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v) fail_msg("golden: field '%s' missing", key);
    return v;
}

static double num(const cJSON *o, const char *key) { return item(o, key)->valuedouble; }

/* DIR: golden part P's checkpoint from the grid generator, in the layout of its architecture: from
 * its tensor list when it has one (OLMoE, DeepSeek-V2, Mixtral's Mistral student), GPT-OSS's and
 * Mixtral's (tests/familyckpt.h), or Qwen3's */
static void write_part(const cJSON *p, const char *dir) {
    const char *cfg = item(p, "config_json")->valuestring;
    uint64_t seed = (uint64_t)num(p, "seed");
    if (cJSON_HasObjectItem(p, "tensors")) {
        char *at = hf_build_listed(p, tu_work);
        if (strcmp(at, dir) != 0) fail_msg("golden part written to %s, not %s", at, dir);
        free(at);
        return;
    }
    int family = strstr(cfg, "GptOssForCausalLM") || strstr(cfg, "MixtralForCausalLM");
    if ((family ? tu_family_checkpoint(dir, cfg, seed) : m2d_testmodel_write_grid(dir, cfg, seed)) != 0)
        fail_msg("%s: %s", dir, m2d_errmsg());
}

/* the checkpoint of golden part PART ("teacher", "student"), checked against transformers' bytes */
static m2d_model *build(const cJSON *g, const char *name, const char *part) {
    const cJSON *p = item(g, part);
    char *dir = m2d_strfmt("%s/%s-%s", tu_work, name, part), *st = m2d_path_join(dir, "model.safetensors");
    write_part(p, dir);
    size_t n;
    char *data = m2d_read_file(st, &n), hex[65];
    m2d_sha256_hex(data, n, hex);
    /* exact on every CPU: the grid generator's values (integer arithmetic, values every dtype
     * holds exactly) through the writer, no floating-point computation in between */
    assert_string_equal(hex, item(p, "safetensors_sha256")->valuestring);
    m2d_model *m;
    if (m2d_model_open(dir, &m)) fail_msg("%s", m2d_errmsg());
    free(data), free(st), free(dir);
    return m;
}

static void windows_of(const cJSON *g, int L, m2d_windows *w) {
    m2d_tokenizer *tk;
    char *tok = m2d_path_join(golden_dir(), "tokenizer.json");
    if (m2d_tokenizer_load(tok, &tk)) fail_msg("%s", m2d_errmsg());
    const char *text = item(g, "text")->valuestring;
    char *path = m2d_path_join(tu_work, "text.txt");
    tu_write(path, text, strlen(text));
    if (m2d_windows_open(tk, path, L, M2D_ORDER_SEQUENTIAL, 0, w)) fail_msg("%s", m2d_errmsg());
    assert_string_equal(w->ids_hash, item(g, "tokens_sha256")->valuestring); /* token ids: no floating point */
    m2d_tokenizer_free(tk);
    free(tok), free(path);
}

static m2d_trainer_opts settings(const cJSON *c) {
    m2d_trainer_opts o = {.seq_len = (int)num(c, "seq_len"), .batch = (int)num(c, "batch"),
                          .micro_batch = (int)num(c, "micro_batch"), .mse_weight = num(c, "mse_weight"),
                          .teacher_topk = (int)num(c, "teacher_topk"), .threads = 2};
    if (m2d_loss_parse(item(c, "loss")->valuestring, &o.loss)) fail_msg("%s", m2d_errmsg());
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(c, "mse_norm"); /* absent: the goldens' "sum" */
    if (norm && m2d_mse_norm_parse(norm->valuestring, &o.mse_norm)) fail_msg("%s", m2d_errmsg());
    const cJSON *tp = cJSON_GetObjectItemCaseSensitive(c, "train_precision"); /* absent: fp32 */
    if (tp && m2d_train_precision_parse(tp->valuestring, "train_precision", &o.train_precision))
        fail_msg("%s", m2d_errmsg());
    m2d_optim_defaults(&o.optim);
    o.optim.steps = (int)num(c, "steps"), o.optim.warmup = (int)num(c, "warmup");
    o.optim.lr = num(c, "lr"), o.optim.min_lr = num(c, "min_lr");
    o.optim.weight_decay = num(c, "weight_decay"), o.optim.clip = num(c, "clip");
    return o;
}

static double rel(double a, double b) { return fabs(a - b) / fmax(fabs(b), 1e-30); }

/* each tensor's total update |w_final - W0| (W0: the weights before step 1) against the
 * reference's: the worst relative difference. A tensor whose reference update is 0 (a dense
 * student's unused router bias: no gradient, no decay on 1-D tensors) must not move at all (exact). */
static double update_difference(m2d_trainer *t, const float *w0, const cJSON *ref, const char *name) {
    m2d_train_params *p = m2d_trainer_params(t);
    float *w = malloc(sizeof(float) * p->total);
    m2d_train_params_download(p, M2D_PBUF_WEIGHTS, w);
    double worst = 0;
    /* the reference's tensors are the parameters, and GPT-OSS's one-expert router (its forward never
     * reads it: moe2dense does not train it, torch decays it with no gradient) */
    for (const cJSON *e = ref->child; e; e = e->next) {
        int found = 0;
        for (int i = 0; i < p->n && !found; i++) found = strcmp(p->p[i].name, e->string) == 0;
        if (!found && !strstr(e->string, ".mlp.router.")) fail_msg("%s: %s is not a parameter", name, e->string);
    }
    for (int i = 0; i < p->n; i++) {
        double s = 0, want = num(ref, p->p[i].name);
        for (size_t j = p->p[i].off; j < p->p[i].off + p->p[i].n; j++) s += ((double)w[j] - w0[j]) * ((double)w[j] - w0[j]);
        if (want == 0) assert_true(s == 0);
        else worst = fmax(worst, rel(sqrt(s), want));
        if (getenv("M2D_SHOW_ERR") && want != 0 && rel(sqrt(s), want) > 1e-5)
            print_message("%s: %s update %.9g (ref %.9g)\n", name, p->p[i].name, sqrt(s), want);
    }
    print_message("%s: worst relative difference of a tensor's update %.2g\n", name, worst);
    free(w);
    return worst;
}

/* Golden case NAME opened for training at THREADS threads (0: the settings' default). */
typedef struct {
    char *path;
    cJSON *g;
    m2d_model *teacher, *student;
    m2d_trainer_opts o;
    m2d_windows w;
    m2d_trainer *t;
    int32_t *tok;
} case_fx;

/* ... on BACKEND (the teacher's forward and the student's training); STUDENT_FP32: the student
 * trains in fp32 whatever the case says */
static void case_open_as(const char *name, int threads, const char *backend, int student_fp32, case_fx *c) {
    c->path = m2d_strfmt("%s/%s.json", golden_dir(), name);
    c->g = load_json(c->path);
    c->teacher = build(c->g, name, "teacher"), c->student = build(c->g, name, "student");
    c->o = settings(item(c->g, "settings"));
    c->o.backend = c->o.teacher_backend = backend;
    if (threads) c->o.threads = threads;
    if (student_fp32) c->o.train_precision = M2D_PREC_FP32;
    windows_of(c->g, c->o.seq_len, &c->w);
    if (m2d_trainer_new(c->teacher, c->student, &c->o, &c->t)) fail_msg("%s", m2d_errmsg());
    c->tok = malloc(sizeof(int32_t) * (size_t)c->o.batch * c->o.seq_len);
}

static void case_open(const char *name, int threads, const char *backend, case_fx *c) {
    case_open_as(name, threads, backend, 0, c);
}

static void case_step(case_fx *c, int s, m2d_step_stats *st) {
    m2d_windows_get(&c->w, (int64_t)(s - 1) * c->o.batch, c->o.batch, c->tok);
    if (m2d_trainer_step(c->t, s, c->tok, st)) fail_msg("%s", m2d_errmsg());
}

static void case_close(case_fx *c) {
    free(c->tok);
    m2d_trainer_free(c->t);
    m2d_windows_free(&c->w);
    m2d_model_close(c->teacher), m2d_model_close(c->student);
    cJSON_Delete(c->g);
    free(c->path);
}

/* The steps of golden case NAME on BACKEND against the reference: the worst relative difference of
 * a loss, a gradient norm, a learning rate and a tensor's update, into WORST[4]; the case's
 * train_precision (fp32: STUDENT_FP32). Returns the case's precision. */
static m2d_precision case_difference(const char *name, const char *backend, int student_fp32, double worst[4]) {
    case_fx c;
    case_open_as(name, 0, backend, student_fp32, &c);
    m2d_train_params *p = m2d_trainer_params(c.t);
    float *w0 = malloc(sizeof(float) * p->total);
    m2d_train_params_download(p, M2D_PBUF_WEIGHTS, w0);
    const cJSON *steps = item(c.g, "steps");
    worst[0] = worst[1] = worst[2] = 0;
    for (int s = 1; s <= c.o.optim.steps; s++) {
        m2d_step_stats st;
        case_step(&c, s, &st);
        const cJSON *ref = cJSON_GetArrayItem(steps, s - 1);
        double e[3] = {rel(st.loss, num(ref, "loss")), rel(st.grad_norm, num(ref, "grad_norm")), rel(st.lr, num(ref, "lr"))};
        for (int k = 0; k < 3; k++) worst[k] = fmax(worst[k], e[k]);
        if (getenv("M2D_SHOW_ERR"))
            print_message("%s step %d: loss %.9g (ref %.9g) grad_norm %.9g (ref %.9g) lr %.9g\n", name, s, st.loss,
                          num(ref, "loss"), st.grad_norm, num(ref, "grad_norm"), st.lr);
    }
    print_message("%s on %s%s: worst relative difference loss %.2g, grad_norm %.2g, lr %.2g\n", name, backend,
                  student_fp32 ? " (student in fp32)" : "", worst[0], worst[1], worst[2]);
    char *what = m2d_strfmt("%s on %s", name, backend);
    worst[3] = update_difference(c.t, w0, item(c.g, "update_norms"), what);
    m2d_precision prec = c.o.train_precision;
    free(what);
    free(w0);
    case_close(&c);
    return prec;
}

static void check_case_on(const char *name, const char *backend) {
    double w[4];
    /* tolerances: see the top of this file (a GPU's fp32 sums run in yet another order) */
    if (case_difference(name, backend, 0, w) == M2D_PREC_BF16)
        assert_true(w[0] < BF16_LOSS_TOL && w[1] < BF16_NORM_TOL && w[2] < 1e-11 && w[3] < BF16_UPDATE_TOL);
    else
        assert_true(w[0] < LOSS_TOL && w[1] < NORM_TOL && w[2] < 1e-11 && w[3] < UPDATE_TOL);
}

/* golden case NAME on every backend that trains: the CPU, and the GPU where there is one */
static void check_case(const char *name) {
    for (int i = 0; i < m2d_backend_count(); i++)
        if (tu_backend_trains(m2d_backend_kind_at(i)->name)) check_case_on(name, m2d_backend_kind_at(i)->name);
}

/* Steps of golden case NAME at T threads: per-step loss and gradient norm, final fp32 weights. */
static float *run_threads(const char *name, int threads, double *loss, double *norm, size_t *n_w) {
    case_fx c;
    case_open(name, threads, "cpu", &c);
    for (int s = 1; s <= c.o.optim.steps && s <= 8; s++) {
        m2d_step_stats st;
        case_step(&c, s, &st);
        loss[s - 1] = st.loss, norm[s - 1] = st.grad_norm;
    }
    m2d_train_params *p = m2d_trainer_params(c.t);
    float *weights = malloc(sizeof(float) * p->total);
    m2d_train_params_download(p, M2D_PBUF_WEIGHTS, weights);
    *n_w = p->total;
    case_close(&c);
    return weights;
}

/* Training does not depend on the thread count: every case (fkl with micro-batches and clipping,
 * rkl with Eq. 6 routing, fkl+mse, fkl with the student's GEMMs in bf16) gives bit-identical losses, gradient norms and weights at 1, 2
 * and 3 threads (the forward and backward ops split rows/columns by thread, never a reduction). */
static void thread_count_independent(void **state) {
    (void)state;
    const char *cases[] = {"fkl", "rkl-topk", "fkl-mse", "fkl-bf16"};
    for (int c = 0; c < (int)M2D_ARRAY_LEN(cases); c++) {
        double l1[8] = {0}, n1[8] = {0};
        size_t n_1;
        float *w1 = run_threads(cases[c], 1, l1, n1, &n_1);
        for (int threads = 2; threads <= 3; threads++) {
            double l[8] = {0}, n[8] = {0};
            size_t n_t;
            float *w = run_threads(cases[c], threads, l, n, &n_t);
            assert_int_equal(n_t, n_1);
            assert_memory_equal(l, l1, sizeof l);
            assert_memory_equal(n, n1, sizeof n);
            assert_memory_equal(w, w1, n_t * sizeof *w);
            free(w);
        }
        assert_true(l1[0] > 0 && n1[0] > 0);
        free(w1);
    }
}

static void fkl(void **state) { (void)state; check_case("fkl"); }
static void rkl_topk(void **state) { (void)state; check_case("rkl-topk"); }
static void fkl_mse(void **state) { (void)state; check_case("fkl-mse"); }
static void fkl_mse_minitron(void **state) { (void)state; check_case("fkl-mse-minitron"); }
/* --train-precision bf16 against torch with every nn.Linear of the student on bf16 operands */
static void fkl_bf16(void **state) {
    (void)state;
    check_case("fkl-bf16");
    double w[4]; /* the bounds tell bf16 training from fp32 training (see BF16_LOSS_TOL) */
    case_difference("fkl-bf16", "cpu", 1, w);
    assert_true(w[0] > BF16_LOSS_TOL);
}
/* issue 24: GPT-OSS's dense student (biases, sinks, a window, YaRN, the clamped SwiGLU) and
 * OLMoE's (clip_qkv, the whole-projection q/k norm, attention biases) against transformers' own
 * GptOssForCausalLM and OlmoeForCausalLM */
static void gptoss_fkl(void **state) { (void)state; check_case("gptoss-fkl"); }
static void olmoe_rkl(void **state) { (void)state; check_case("olmoe-rkl"); }
/* DeepSeek-V2's dense student (latent attention with q LoRA, values narrower than the heads: o_proj's
 * padding, YaRN's attention factor and softmax mscale) against transformers' DeepseekV2ForCausalLM */
static void deepseekv2_fkl(void **state) { (void)state; check_case("deepseekv2-fkl"); }
/* Mixtral's dense student MistralForCausalLM (a window of 5 cutting into 16 positions, head_dim 24
 * wider than hidden / heads, no q/k norm) taught by transformers' MixtralForCausalLM */
static void mixtral_fkl(void **state) { (void)state; check_case("mixtral-fkl"); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fkl),
        cmocka_unit_test(rkl_topk),
        cmocka_unit_test(fkl_mse),
        cmocka_unit_test(fkl_mse_minitron),
        cmocka_unit_test(fkl_bf16),
        cmocka_unit_test(gptoss_fkl),
        cmocka_unit_test(olmoe_rkl),
        cmocka_unit_test(deepseekv2_fkl),
        cmocka_unit_test(mixtral_fkl),
        cmocka_unit_test(thread_count_independent),
    };
    return cmocka_run_group_tests(tests, tu_work_setup, tu_work_teardown);
}
