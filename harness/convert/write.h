/* convert/write — the student as a Hugging Face checkpoint, and the output directory rule every
 * checkpoint moe2dense writes follows (convert, distill). */
#ifndef M2D_CONVERT_WRITE_H
#define M2D_CONVERT_WRITE_H

#include "base/outfile.h"
#include "convert/plan.h"

/* Write the student as a Hugging Face checkpoint into DIR (created if needed): config.json, its
 * weights (teacher dtype), tokenizer files, moe2dense.json (written last: its presence marks a
 * complete output). DIR must be absent, empty or an earlier moe2dense output. The weights are
 * model.safetensors when they are at most M2D_CONVERT_SHARD_BYTES, else shards of at most that
 * (model-0000i-of-0000n.safetensors + model.safetensors.index.json, io/st.h), as transformers'
 * save_pretrained lays them out at its default max_shard_size "5GB". The writer references the
 * student's and the teacher's tensors (no copy): the memory of a write is the student's own. */
#define M2D_CONVERT_SHARD_BYTES ((uint64_t)5000000000u)
int m2d_convert_write(const m2d_model *teacher, const m2d_model *student, const m2d_convert_plan *plan,
                      const char *stats_path, const char *dir);
/* The same with another shard size (tests; a disk that wants smaller files). */
int m2d_convert_write_sharded(const m2d_model *teacher, const m2d_model *student, const m2d_convert_plan *plan,
                              const char *stats_path, const char *dir, uint64_t max_shard_bytes);
/* The text of the moe2dense.json m2d_convert_write writes for PLAN (a student kept in memory:
 * what its distillation's output extends). The caller frees it. */
char *m2d_convert_manifest(const m2d_model *teacher, const m2d_convert_plan *plan, const char *stats_path);

/* W's tensors into DIR (prepared: m2d_convert_prepare_dir) as m2d_convert_write lays them out:
 * model.safetensors when they are at most MAX_SHARD_BYTES, else shards + index; the weights files
 * of an earlier output in DIR are removed first. */
int m2d_convert_write_checkpoint(m2d_st_writer *w, const char *dir, uint64_t max_shard_bytes);

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
