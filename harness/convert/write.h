/* convert/write — the student as a Hugging Face checkpoint, and the output directory rule every
 * checkpoint moe2dense writes follows (convert, distill). */
#ifndef M2D_CONVERT_WRITE_H
#define M2D_CONVERT_WRITE_H

#include "base/outfile.h"
#include "convert/plan.h"

/* Write the student as a Hugging Face checkpoint into DIR (created if needed): config.json,
 * model.safetensors (teacher dtype), tokenizer files, moe2dense.json (written last: its
 * presence marks a complete output). DIR must be absent, empty or an earlier moe2dense output. */
int m2d_convert_write(const m2d_model *teacher, const m2d_model *student, const m2d_convert_plan *plan,
                      const char *stats_path, const char *dir);
/* The text of the moe2dense.json m2d_convert_write writes for PLAN (a student kept in memory:
 * what its distillation's output extends). The caller frees it. */
char *m2d_convert_manifest(const m2d_model *teacher, const m2d_convert_plan *plan, const char *stats_path);

/* The output directory rule of every checkpoint moe2dense writes (convert, distill), for a writer
 * that fills DIR over a long time (distill): DIR is created if absent; a directory with files but
 * neither moe2dense.json nor moe2dense.incomplete is refused; moe2dense.incomplete is written and
 * an earlier output's moe2dense.json removed (it is written last: its presence marks a complete
 * output). m2d_convert_finish_dir removes moe2dense.incomplete after moe2dense.json is written.
 * DIR's lock is taken and stays held in *LOCK (released by the caller when the run ends), so two
 * runs never write one directory; m2d_convert_lock_dir takes only the lock (a resumed run). */
int m2d_convert_prepare_dir(const char *dir, m2d_lock *lock);
int m2d_convert_lock_dir(const char *dir, m2d_lock *lock);
int m2d_convert_finish_dir(const char *dir);
/* Copy the tokenizer files (tokenizer.json, tokenizer_config.json, ...) of model FROM into TO_DIR. */
int m2d_convert_copy_tokenizer(const m2d_model *from, const char *to_dir);

#endif
