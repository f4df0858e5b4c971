/* st — safetensors: memory-mapped reader (single file or sharded) and deterministic writer. */
#ifndef M2D_ST_H
#define M2D_ST_H

#include "tensor.h"

typedef struct m2d_st m2d_st;

/* PATH is a .safetensors file, a model.safetensors.index.json, or a directory holding
 * model.safetensors or model.safetensors.index.json. Validates every header fully
 * (size cap, JSON, dtype, shape x dtype = byte range, ranges inside the file and not
 * overlapping, no duplicate names across shards). Error names the file and the field. */
int m2d_st_open(const char *path, m2d_st **out);
void m2d_st_close(m2d_st *st);

int m2d_st_count(const m2d_st *st);
const m2d_tensor *m2d_st_at(const m2d_st *st, int i);        /* sorted by name */
const m2d_tensor *m2d_st_find(const m2d_st *st, const char *name); /* NULL if absent */
const char *m2d_st_file_of(const m2d_st *st, const char *name);    /* shard path of a tensor */
/* __metadata__ value for KEY (first file that has it), or NULL. */
const char *m2d_st_metadata(const m2d_st *st, const char *key);

/* Writer: tensors are written sorted by name (deterministic), header padded with spaces
 * to a multiple of 8 bytes, data contiguous in that order. Data is copied at add time. */
typedef struct m2d_st_writer m2d_st_writer;
m2d_st_writer *m2d_st_writer_new(void);
int m2d_st_writer_add(m2d_st_writer *w, const char *name, m2d_dtype dtype, int ndim,
                      const int64_t *shape, const void *data);
/* Convenience: add fp32 data, stored as DTYPE (F32/F16/BF16) with round-to-nearest-even. */
int m2d_st_writer_add_f32(m2d_st_writer *w, const char *name, m2d_dtype dtype, int ndim,
                          const int64_t *shape, const float *data);
void m2d_st_writer_metadata(m2d_st_writer *w, const char *key, const char *value);
int m2d_st_writer_write(m2d_st_writer *w, const char *path); /* atomic: temp + rename */
void m2d_st_writer_free(m2d_st_writer *w);

#endif
