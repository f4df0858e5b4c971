/* hfcheck — moe2dense against the goldens tools/hf_goldens*.py make with transformers' own classes
 * (tests/golden/hf/, or $M2D_HF_GOLDEN where `make verify-hf` writes fresh ones): loading a golden,
 * rebuilding its checkpoint, converting a student with the CLI, and comparing the engine's logits
 * and routing with transformers' float64 forward. Used by test_hf.c (Qwen3 family) and the family
 * tests (test_mixtral.c, test_gptoss.c). */
#ifndef M2D_TEST_HFCHECK_H
#define M2D_TEST_HFCHECK_H

#include <cjson/cJSON.h>

/* tests/golden/hf or $M2D_HF_GOLDEN */
const char *hf_golden_dir(void);
/* DIR/NAME.json parsed (fails the test when absent or invalid) */
cJSON *hf_load_golden(const char *name);
/* field KEY of O (fails the test when absent / not a string) */
const cJSON *hf_item(const cJSON *o, const char *key);
const char *hf_str(const cJSON *o, const char *key);
void hf_file_sha256(const char *path, char out[65]);
/* the golden's byte-level tokenizer.json into DIR */
void hf_copy_tokenizer(const char *dir);

/* A builder for goldens that list their tensors ([name, dtype, shape] as save_pretrained wrote
 * them, field "tensors"): each filled by the grid generator in that order, next to transformers'
 * config.json text and the golden's tokenizer (every family whose layout the Qwen3 options of
 * tests/testmodel.h do not describe). */
char *hf_build_listed(const cJSON *g, const char *work);
/* Builds the teacher checkpoint of golden G under WORK; returns its directory (malloc'd). */
typedef char *(*hf_build_fn)(const cJSON *g, const char *work);
/* The student of golden G: moe2dense calibrate + convert (the golden's arguments) on the teacher
 * golden G names, built by BUILD. Returns the student's directory (malloc'd). */
char *hf_build_student(const cJSON *g, const char *work, hf_build_fn build);
/* Logits and routing of the engine on the golden's tokens against transformers' (float64), and
 * calibration statistics when the golden's routing records them ("calib_stats"). */
void hf_check_forward(const cJSON *g, const char *dir);
/* Calibration statistics of moe2dense (one window over the golden's tokens) against those the
 * golden computed from transformers' modules (field "calib"). */
void hf_check_calib(const cJSON *g, const char *dir);
/* moe2dense's dequantisation of each MXFP4 tensor pair against the sha256 of transformers'
 * (field "mxfp4_sha256": {name: sha256 of the float32 values}). */
void hf_check_mxfp4(const cJSON *g, const char *dir);
/* Student golden NAME end to end through the command line in WORK/pipeline: its teacher built,
 * calibrate + convert, ppl of teacher and student on WikiText-2 test, eval arc_easy (4 docs) of the
 * student; each step exits 0 with a finite result. Needs `make data`. */
void hf_check_pipeline(const char *name, const char *work, hf_build_fn build);
/* The whole check of golden NAME: teacher (BUILD) or student (built from its teacher). A teacher's
 * model.safetensors sha256 against the golden's (transformers' save_pretrained bytes: exact, no
 * floating point between the grid generator and the writer). A student: its config.json text,
 * transformers' re-save, and its bytes where exact by construction (scores that are counts,
 * uniform scaling), else the golden's decisions ("plan") and every merged weight within one bf16
 * ulp of a float64 merge. Then hf_check_forward, and hf_check_mxfp4 / hf_check_calib when the
 * golden has those fields. A failing check releases what it holds (tu_defer). */
void hf_check_model(const char *name, const char *work, hf_build_fn build);

#endif
