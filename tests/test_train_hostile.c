/* train hostile (issue 27): the training path against hostile input, one test per reproduction of
 * the probe -- a --log that is one of the run's inputs or a foreign file (1), damaged checkpoint
 * pieces and NaN weights (2), two runs into one --out (3), the memory a run needs (5), FIFOs in
 * place of inputs (6), what a killed checkpoint save leaves (7), --out equal to --student (8),
 * flags refused before any model loads or OUT is touched (10), and the small ones (11). The sweep's
 * [distill] checks (4, 5) are in test_sweep_distill.c, the RoPE ranges (9) in test_rope.c. */
#include "testutil.h"
#include "distill_fixture.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/util.h"
#include "convert/convert.h"
#include "engine/backend.h"
#include "io/st.h"
#include "model/model.h"
#include "train/distill.h"

static tu_distill_fixture g_fx;
static char *g_dir, *g_teacher, *g_student, *g_data; /* g_fx's */

static int setup(void **state) {
    (void)state;
    tu_distill_fixture_make(&g_fx);
    g_dir = g_fx.dir, g_teacher = g_fx.teacher, g_student = g_fx.student, g_data = g_fx.data;
    FILE *f = fopen(g_data, "w");
    for (int i = 0; i < 120; i++) fputs(i % 3 ? "alpha beta " : "gamma delta\n", f);
    fclose(f);
    alarm(600); /* a FIFO that blocks open() would hang the test: fail it instead */
    return 0;
}

static int teardown(void **state) {
    (void)state;
    tu_distill_fixture_free(&g_fx);
    return 0;
}

static char *path_in(const char *name) { return m2d_path_join(g_dir, name); }

static m2d_distill_opts base_opts(const char *out, const char *log) {
    m2d_distill_opts o;
    m2d_distill_defaults(&o);
    o.teacher = g_teacher, o.student = g_student, o.data = g_data, o.out = out, o.log = log;
    o.train.seq_len = 16, o.train.batch = 2, o.train.threads = 2;
    o.train.optim.steps = 4, o.train.optim.warmup = 1, o.train.optim.lr = 1e-3;
    o.save_every = 2, o.quiet = true;
    return o;
}

/* the run fails with an error holding WANT */
static void run_fails(const m2d_distill_opts *o, const char *want) {
    m2d_distill_result r;
    if (m2d_distill_run(o, &r) != -1) fail_msg("the run did not fail (expected '%s')", want);
    if (!strstr(m2d_errmsg(), want)) fail_msg("expected an error with '%s', got: %s", want, m2d_errmsg());
}

static char *sha_of(const char *path) {
    size_t n;
    char *d = m2d_read_file(path, &n), hex[65];
    if (!d) fail_msg("%s", m2d_errmsg());
    m2d_sha256_hex(d, n, hex);
    free(d);
    return m2d_strdup(hex);
}

/* OUT (NAME in the work directory) holding the checkpoint of a run stopped after step 2 */
static char *stopped_run(const char *name) {
    char *out = path_in(name);
    tu_distill_stopped(base_opts(out, NULL), 2);
    return out;
}

static char *piece(const char *out, const char *part) { return m2d_strfmt("%s/train-state/step-2.%s.safetensors", out, part); }

/* the CLI's stderr (and exit status) for ARGS after the teacher, student and --out OUT */
static int cli(const char *out, const char *args, char **stdout_text, char **err) {
    char *cmd = m2d_strfmt("%s distill --teacher %s --student %s --out %s --seq-len 16 --batch 2 --threads 2 %s",
                           tu_bin(), g_teacher, g_student, out, args);
    int rc = tu_run(cmd, stdout_text, err);
    free(cmd);
    return rc;
}

/* 1: a --log that names an input or a file that is not a distill log is refused; the file is kept */
static void log_never_replaces_an_input(void **state) {
    (void)state;
    char *weights = m2d_path_join(g_teacher, "model.safetensors"), *sweights = m2d_path_join(g_student, "model.safetensors");
    char *notes = path_in("notes.txt"), *out = path_in("l1");
    const char *victims[] = {weights, sweights, g_data, notes};
    tu_write(notes, "my notes\n{\"step\": 1}\n", 22);
    for (size_t i = 0; i < M2D_ARRAY_LEN(victims); i++) {
        char *before = sha_of(victims[i]);
        m2d_distill_opts o = base_opts(out, victims[i]);
        run_fails(&o, "--log");
        char *after = sha_of(victims[i]);
        assert_string_equal(before, after);
        assert_false(m2d_file_exists(out)); /* refused before OUT was touched */
        free(before), free(after);
    }
    char *stopped = stopped_run("l1-stopped"); /* --resume --log notes.txt: no line of it is cut */
    m2d_distill_opts o = base_opts(stopped, notes);
    o.resume = true;
    run_fails(&o, "is not a distill log");
    char *kept = m2d_read_file(notes, NULL);
    assert_string_equal(kept, "my notes\n{\"step\": 1}\n");
    free(kept), free(stopped), free(weights), free(sweights), free(notes), free(out);
}

/* 2: a NaN in the weights piece, flipped bytes in adam_v, a NaN with a matching hash: refused */
static void damaged_checkpoint_refused(void **state) {
    (void)state;
    char *out = stopped_run("c2"), *w = piece(out, "weights"), *v = piece(out, "adam_v");
    char *state_json = m2d_strfmt("%s/train-state/state.json", out), *copy = path_in("c2-weights");
    tu_copy_file(w, copy);
    size_t n;
    char *bytes = m2d_read_file(w, &n);
    const float nan_value = NAN;
    memcpy(bytes + n - 4, &nan_value, 4); /* the last value of the one tensor */
    tu_write(w, bytes, n);
    m2d_distill_opts o = base_opts(out, NULL);
    o.resume = true;
    run_fails(&o, "step-2.weights.safetensors: tensor 'weights': SHA-256");
    /* the hash made to match: the value itself is refused */
    m2d_st *st;
    if (m2d_st_open(w, &st)) fail_msg("%s", m2d_errmsg());
    char damaged[65], *original = NULL;
    m2d_sha256_hex(m2d_st_at(st, 0)->data, m2d_st_at(st, 0)->nbytes, damaged);
    m2d_st_close(st);
    char *text = m2d_read_file(state_json, NULL);
    cJSON *j = cJSON_Parse(text);
    original = m2d_strdup(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "sha256"), "weights")->valuestring);
    cJSON_Delete(j);
    tu_replace_in_file(state_json, original, damaged);
    run_fails(&o, "tensor 'weights': element");
    char *cmd = m2d_strfmt("%s inspect --model %s", tu_bin(), w), *err = NULL; /* inspect reports it */
    assert_int_not_equal(tu_run(cmd, NULL, &err), 0);
    if (!err || !strstr(err, "not finite")) fail_msg("inspect: %s", err);
    tu_replace_in_file(state_json, damaged, original);
    tu_copy_file(copy, w); /* whole again; now adam_v's bytes flipped */
    char *vb = m2d_read_file(v, &n);
    vb[n - 1] ^= 0x5a;
    tu_write(v, vb, n);
    run_fails(&o, "step-2.adam_v.safetensors: tensor 'adam_v': SHA-256");
    free(vb), free(cmd), free(err), free(text), free(original), free(bytes), free(copy), free(state_json), free(v), free(w), free(out);
}

/* a copy of model directory FROM in NAME, with its file FIFO (when not NULL) made a FIFO */
static char *copy_model(const char *from, const char *name, const char *fifo) {
    char *dir = path_in(name);
    assert_int_equal(m2d_mkdir_p(dir), 0);
    const char *files[] = {"config.json", "model.safetensors", "tokenizer.json"};
    for (size_t i = 0; i < M2D_ARRAY_LEN(files); i++) {
        char *a = m2d_path_join(from, files[i]), *b = m2d_path_join(dir, files[i]);
        if (!fifo || strcmp(files[i], fifo)) tu_copy_file(a, b);
        else assert_int_equal(mkfifo(b, 0600), 0);
        free(a), free(b);
    }
    return dir;
}

/* 2: a student whose weights hold a NaN is refused before training on it */
static void student_with_nan_refused(void **state) {
    (void)state;
    char *dir = copy_model(g_student, "nan-student", NULL), *w = m2d_path_join(dir, "model.safetensors");
    char *out = path_in("n2");
    size_t n;
    char *bytes = m2d_read_file(w, &n);
    memset(bytes + n - 4, 0xff, 4); /* the last value of the last tensor: NaN in F32, BF16 and F16 */
    tu_write(w, bytes, n);
    m2d_distill_opts o = base_opts(out, NULL);
    o.student = dir;
    run_fails(&o, "value(s) not finite");
    assert_false(m2d_file_exists(out));
    free(bytes), free(out), free(w), free(dir);
}

/* 3: while one run holds OUT, another run into it (fresh or resumed) is refused */
static void one_run_per_out(void **state) {
    (void)state;
    char *out = stopped_run("c3");
    m2d_lock held;
    if (m2d_convert_lock_dir(out, &held)) fail_msg("%s", m2d_errmsg());
    m2d_distill_opts o = base_opts(out, NULL);
    o.resume = true;
    run_fails(&o, "in use by pid");
    m2d_lock_release(&held);
    m2d_distill_result r;
    if (m2d_distill_run(&o, &r)) fail_msg("%s", m2d_errmsg()); /* free again: it resumes */
    assert_true(r.finished);
    char *fresh = path_in("c3-fresh");
    assert_int_equal(m2d_mkdir_p(fresh), 0);
    if (m2d_convert_lock_dir(fresh, &held)) fail_msg("%s", m2d_errmsg());
    o = base_opts(fresh, NULL);
    run_fails(&o, "in use by pid");
    m2d_lock_release(&held);
    free(fresh), free(out);
}

/* 5: a batch the machine cannot hold is refused up front with the estimate, not an abort */
static void memory_need_refused(void **state) {
    (void)state;
    char *out = path_in("m5"), *err = NULL, *args = m2d_strfmt("--data %s --steps 2 --batch 1000000", g_data);
    assert_int_equal(cli(out, args, NULL, &err), 1);
    if (!err || !strstr(err, "--batch 1000000 x --seq-len 16 needs ~") || !strstr(err, "more than this machine's"))
        fail_msg("%s", err);
    assert_true(strchr(err, '\n') == err + strlen(err) - 1);
    assert_false(m2d_file_exists(out));
    free(args), free(err), free(out);
}

/* a backend with devices in every build (the estimate asks the backend table, not the name) */
static int no_device(const m2d_backend_opts *o, m2d_backend **out) {
    (void)o, (void)out;
    return m2d_err("fakegpu: no device");
}
M2D_BACKEND(fakegpu, "fakegpu", "test: a backend with devices and none here", no_device, .has_devices = 1)

/* 5b: a student on a GPU keeps its state, activations and KD logits in the GPU's memory: the host
 * estimate counts its host copy, the teacher and one window's teacher outputs (the formula's other
 * parts, exactly) */
static void memory_of_a_device_student(void **state) {
    (void)state;
    m2d_model *t, *s;
    if (m2d_model_open(g_teacher, &t) || m2d_model_open(g_student, &s)) fail_msg("%s", m2d_errmsg());
    int64_t P = m2d_model_param_counts(&s->cfg).total;
    m2d_trainer_opts o = {.seq_len = 16, .batch = 1000000};
    m2d_distill_memory host, dev;
    m2d_distill_memory_estimate(&t->cfg, &s->cfg, P, &o, 1e12, &host);
    o.backend = "fakegpu:1";
    m2d_distill_memory_estimate(&t->cfg, &s->cfg, P, &o, 1e12, &dev);
    assert_true(host.student == 20.0 * P && dev.student == 4.0 * P);
    assert_true(host.activations > 0 && host.logits > 0 && dev.logits == 0);
    assert_true(dev.activations == 4.0 * o.seq_len * t->cfg.hidden_size); /* one window's teacher hidden states */
    assert_true(dev.teacher == host.teacher && dev.total == dev.student + dev.teacher + dev.activations);
    /* --train-precision bf16 on the host: the weights' bf16 transposes (2 bytes a parameter) and one
     * GEMM's transposed operands (an LM head block or a layer's); none of it on the device */
    m2d_trainer_opts ob = o;
    ob.backend = NULL, ob.train_precision = M2D_PREC_BF16;
    m2d_distill_memory hb;
    m2d_distill_memory_estimate(&t->cfg, &s->cfg, P, &ob, 1e12, &hb);
    double R = (double)o.batch * o.seq_len, V = s->cfg.vocab_size, w = fmax(s->cfg.hidden_size, s->cfg.intermediate_size);
    double extra = 6 * fmax(fmin(R, 128.0 * 1024 * 1024 / (4 * V)) * V, R * w) + 2 * R * w;
    assert_true(hb.student == host.student + 2.0 * P);
    assert_true(fabs(hb.logits - host.logits - extra) <= 1e-12 * hb.logits);
    ob.backend = "fakegpu:1";
    m2d_distill_memory_estimate(&t->cfg, &s->cfg, P, &ob, 1e12, &hb);
    assert_true(hb.logits == 0 && hb.student == dev.student);
    for (int i = 0; i < 2; i++) { /* the CPU named, and a backend name this build lacks: the host */
        o.backend = i ? "tpu" : "cpu";
        m2d_distill_memory_estimate(&t->cfg, &s->cfg, P, &o, 1e12, &dev);
        assert_true(dev.total == host.total);
    }
    /* the refusal names the device and the host's part only (no advice on the batch) */
    m2d_config tiny = t->cfg;
    o.backend = "fakegpu";
    assert_int_equal(m2d_distill_check_memory(&tiny, &s->cfg, (int64_t)1 << 40, &o, &m2d_distill_flag_names), -1);
    if (!strstr(m2d_errmsg(), "with the student on fakegpu, the host still needs ~")) fail_msg("%s", m2d_errmsg());
    m2d_model_close(s), m2d_model_close(t);
}

/* 6: a FIFO in place of model.safetensors, config.json or a checkpoint piece is refused at once */
static void fifos_refused(void **state) {
    (void)state;
    const char *fifos[] = {"model.safetensors", "config.json"};
    for (size_t i = 0; i < M2D_ARRAY_LEN(fifos); i++) {
        char *name = m2d_strfmt("fifo-%zu", i), *dir = copy_model(g_teacher, name, fifos[i]);
        m2d_model *m = NULL;
        assert_int_equal(m2d_model_open(dir, &m), -1);
        if (!strstr(m2d_errmsg(), "not a regular file")) fail_msg("%s", m2d_errmsg());
        free(name), free(dir);
    }
    char *out = stopped_run("c6"), *m = piece(out, "adam_m");
    assert_int_equal(unlink(m), 0);
    assert_int_equal(mkfifo(m, 0600), 0);
    m2d_distill_opts o = base_opts(out, NULL);
    o.resume = true;
    run_fails(&o, "step-2.adam_m.safetensors: not a regular file");
    free(m), free(out);
}

/* 7: the temp files of a killed save, and pieces state.json does not name, are removed */
static void interrupted_save_cleaned(void **state) {
    (void)state;
    char *out = stopped_run("c7");
    const char *left[] = {"state.json.m2d-tmp.abcdefghij", "step-2.weights.safetensors.m2d-tmp.0123456789",
                          "step-4.adam_m.safetensors"};
    for (size_t i = 0; i < M2D_ARRAY_LEN(left); i++) {
        char *p = m2d_strfmt("%s/train-state/%s", out, left[i]);
        tu_write(p, "x", 1);
        free(p);
    }
    char *foreign = m2d_strfmt("%s/train-state/notes.txt", out); /* not ours: kept */
    tu_write(foreign, "x", 1);
    m2d_distill_opts o = base_opts(out, NULL);
    o.resume = true, o.stop_after = 3;
    m2d_distill_result r;
    if (m2d_distill_run(&o, &r)) fail_msg("%s", m2d_errmsg());
    for (size_t i = 0; i < M2D_ARRAY_LEN(left); i++) {
        char *p = m2d_strfmt("%s/train-state/%s", out, left[i]);
        if (m2d_file_exists(p)) fail_msg("%s was not removed", p);
        free(p);
    }
    assert_true(m2d_file_exists(foreign));
    free(foreign), free(out);
}

/* 8: --out equal to --student (or --teacher) is refused; the student stays as it was */
static void out_is_not_an_input(void **state) {
    (void)state;
    char *cfg = m2d_path_join(g_student, "config.json"), *before = sha_of(cfg);
    m2d_distill_opts o = base_opts(g_student, NULL);
    run_fails(&o, "is the student's directory (--student)");
    o = base_opts(g_teacher, NULL);
    run_fails(&o, "is the teacher's directory (--teacher)");
    char *after = sha_of(cfg), *mark = m2d_path_join(g_student, "moe2dense.incomplete");
    assert_string_equal(before, after);
    assert_false(m2d_file_exists(mark));
    free(mark), free(after), free(before), free(cfg);
}

/* 10: refused before any model loads: OUT is never created */
static void flags_refused_before_any_work(void **state) {
    (void)state;
    char *dirlog = path_in("a-dir"), *eval = path_in("eval.txt");
    assert_int_equal(m2d_mkdir_p(dirlog), 0);
    tu_write(eval, " = T = \n alpha beta gamma delta \n", 33);
    struct { char *args; const char *want; } cases[] = {
        {m2d_strfmt("--steps 2 --log %s", dirlog), "not a regular file"},
        {m2d_strfmt("--steps 2 --batch 4 --micro-batch 3"), "--micro-batch 3 must divide --batch 4"},
        {m2d_strfmt("--steps 2 --teacher-topk 99"), "--teacher-topk 99 exceeds the teacher's num_experts 8"},
        {m2d_strfmt("--steps 2 --eval-data %s --eval-seq-len 100000", eval),
         "--eval-seq-len 100000 exceeds the teacher's max_position_embeddings"},
        {m2d_strfmt("--steps 2 --eval-data %s --eval-seq-len 64", eval), "fewer than one validation window of 64"},
    };
    for (size_t i = 0; i < M2D_ARRAY_LEN(cases); i++) {
        char *out = m2d_strfmt("%s/f10-%zu", g_dir, i), *args = m2d_strfmt("--data %s %s", g_data, cases[i].args);
        char *err = NULL;
        assert_int_not_equal(cli(out, args, NULL, &err), 0);
        if (!err || !strstr(err, cases[i].want)) fail_msg("%s: expected '%s', got: %s", args, cases[i].want, err);
        if (m2d_file_exists(out)) fail_msg("%s: %s was created", args, out);
        free(err), free(args), free(out), free(cases[i].args);
    }
    free(eval), free(dirlog);
}

/* 11: state.json's step 2.5 and a numeric identity value */
static void state_fields_exact(void **state) {
    (void)state;
    char *out = stopped_run("c11"), *sj = m2d_strfmt("%s/train-state/state.json", out);
    m2d_distill_opts o = base_opts(out, NULL);
    o.resume = true;
    tu_replace_in_file(sj, "\"step\":\t2", "\"step\":\t2.5");
    run_fails(&o, "field 'step': missing or not a positive whole number");
    char *w = piece(out, "weights"); /* a damaged state.json: its pieces are not taken for leftovers */
    assert_true(m2d_file_exists(w));
    free(w);
    tu_replace_in_file(sj, "\"step\":\t2.5", "\"step\":\t2");
    tu_replace_in_file(sj, "\"lr\":\t\"0.001\"", "\"lr\":\t0.001");
    run_fails(&o, "field 'identity.lr': not a string");
    free(sj), free(out);
}

/* 11: the CLI's messages: --eval-data's path once, no "PPL nan" after a resume, a warning for
 * windows repeated within a step, --data DIR named as a directory */
static void cli_messages(void **state) {
    (void)state;
    char *out = path_in("c11-cli"), *err = NULL, *text = NULL, *eval = path_in("eval11.txt");
    char *args = m2d_strfmt("--data %s --steps 4 --eval-data /nonexistent/eval.raw", g_data);
    assert_int_not_equal(cli(out, args, NULL, &err), 0);
    char *first = strstr(err, "/nonexistent/eval.raw");
    if (!first || strstr(first + 1, "/nonexistent/eval.raw")) fail_msg("the path not exactly once: %s", err);
    free(args), free(err);
    tu_write(eval, " = T = \n", 8);
    FILE *f = fopen(eval, "a");
    for (int i = 0; i < 40; i++) fputs(" alpha beta gamma delta \n", f);
    fclose(f);
    args = m2d_strfmt("--data %s --steps 4 --save-every 2 --stop-after 2 --eval-data %s", g_data, eval);
    if (cli(out, args, NULL, &err)) fail_msg("%s", err);
    free(args), free(err);
    args = m2d_strfmt("--data %s --steps 4 --save-every 2 --resume --eval-data %s", g_data, eval);
    if (cli(out, args, &text, &err)) fail_msg("%s", err);
    if (strstr(text, "nan") || !strstr(text, "WikiText-2 PPL")) fail_msg("%s", text);
    free(args), free(err), free(text);
    char *small = path_in("small.txt"), *out2 = path_in("c11-small");
    tu_write(small, "twenty bytes of text", 20); /* one window of 16 for a batch of 2 */
    args = m2d_strfmt("--data %s --steps 1", small);
    if (cli(out2, args, NULL, &err)) fail_msg("%s", err);
    if (!strstr(err, "warning: ") || !strstr(err, "fewer than --batch 2")) fail_msg("%s", err);
    free(args), free(err);
    char *out3 = path_in("c11-dir");
    args = m2d_strfmt("--data %s --steps 1", g_dir);
    assert_int_not_equal(cli(out3, args, NULL, &err), 0);
    if (!strstr(err, "is a directory")) fail_msg("%s", err);
    free(args), free(err), free(out3), free(out2), free(small), free(eval), free(out);
}

/* 11: model_type of another architecture is refused */
static void model_type_matches_architecture(void **state) {
    (void)state;
    char *dir = path_in("mt"), *cfg = m2d_path_join(dir, "config.json");
    assert_int_equal(m2d_mkdir_p(dir), 0);
    char *from = m2d_path_join(g_teacher, "config.json");
    tu_copy_file(from, cfg);
    tu_replace_in_file(cfg, "\"qwen3_moe\"", "\"deepseek_v2\"");
    m2d_config c;
    assert_int_equal(m2d_config_load(dir, &c, NULL), -1);
    if (!strstr(m2d_errmsg(), "field 'model_type': 'deepseek_v2' is the model type of DeepseekV2ForCausalLM"))
        fail_msg("%s", m2d_errmsg());
    free(from), free(cfg), free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(log_never_replaces_an_input),
        cmocka_unit_test(damaged_checkpoint_refused),
        cmocka_unit_test(student_with_nan_refused),
        cmocka_unit_test(one_run_per_out),
        cmocka_unit_test(memory_need_refused),
        cmocka_unit_test(memory_of_a_device_student),
        cmocka_unit_test(fifos_refused),
        cmocka_unit_test(interrupted_save_cleaned),
        cmocka_unit_test(out_is_not_an_input),
        cmocka_unit_test(flags_refused_before_any_work),
        cmocka_unit_test(state_fields_exact),
        cmocka_unit_test(cli_messages),
        cmocka_unit_test(model_type_matches_architecture),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
