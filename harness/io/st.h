/* st — safetensors: memory-mapped reader (single file or sharded) and deterministic writer. */
#ifndef M2D_ST_H
#define M2D_ST_H

#include "base/tensor.h"

typedef struct m2d_st m2d_st;

/* m2d_err with control characters replaced by '?': for messages quoting names or strings read
 * from untrusted files, so that an error always stays one line. */
int m2d_err1(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* PATH is a .safetensors file, a model.safetensors.index.json, or a directory holding
 * model.safetensors or model.safetensors.index.json. Validates every header fully
 * (size cap, JSON, dtype, shape x dtype = byte range, ranges inside the file and not
 * overlapping, no duplicate names across shards). Error names the file and the field. */
int m2d_st_open(const char *path, m2d_st **out);
void m2d_st_close(m2d_st *st);

int m2d_st_count(const m2d_st *st);
const m2d_tensor *m2d_st_at(const m2d_st *st, int i);        /* sorted by name */
const m2d_tensor *m2d_st_find(const m2d_st *st, const char *name); /* NULL if absent */
int m2d_st_index_of(const m2d_st *st, const char *name);        /* index for m2d_st_at, -1 if absent */
const char *m2d_st_file_of(const m2d_st *st, const char *name);    /* shard path of a tensor */
/* __metadata__ value for KEY (first file that has it), or NULL. */
const char *m2d_st_metadata(const m2d_st *st, const char *key);
/* Files behind the view (1 for a single file, the shards otherwise), in order of first mention. */
int m2d_st_file_count(const m2d_st *st);
const char *m2d_st_file_path(const m2d_st *st, int i);
size_t m2d_st_file_size(const m2d_st *st, int i);
/* Parse a whole safetensors file held in memory (not copied: BUF must outlive the view).
 * LABEL names it in errors. Same validation as m2d_st_open (used by the fuzzer and tests). */
int m2d_st_open_buffer(const char *label, const void *buf, size_t len, m2d_st **out);
/* Paging advice for the mapped bytes [P, P + N) of ST: M2D_ST_WILLNEED starts reading them now,
 * M2D_ST_DONTNEED drops them from this process (a later read faults them in again from the file).
 * Layer-major passes call it per layer so a checkpoint larger than RAM is read once per pass.
 * Bytes outside ST's file mappings (owned copies, a caller's buffer) are left alone: the same
 * advice on anonymous memory would zero it. */
typedef enum { M2D_ST_WILLNEED, M2D_ST_DONTNEED } m2d_st_advice;
void m2d_st_advise(const m2d_st *st, const void *p, size_t n, m2d_st_advice advice);
/* Identity hash of the weights (hex sha256). Every byte is hashed when the tensor data is at
 * most MAX_FULL_BYTES, else a strided sample (see st.c). M2D_ST_HASH_FULL_MAX is the default. */
#define M2D_ST_HASH_FULL_MAX ((uint64_t)256 << 20)
void m2d_st_hash(const m2d_st *st, uint64_t max_full_bytes, char out[65]);

/* Writer: tensors are written sorted by dtype then name (deterministic, the reference writer's
 * order), header padded with spaces to a multiple of 8 bytes, data contiguous in that order.
 * add copies the data at add time, add_ref keeps a pointer, add_lazy a callback that produces the
 * bytes at write time: the header needs only names, dtypes and shapes, so a writer of lazy (or
 * referenced) tensors holds at most one chunk of tensor data, whatever the model's size. */
typedef struct m2d_st_writer m2d_st_writer;
m2d_st_writer *m2d_st_writer_new(void);
int m2d_st_writer_add(m2d_st_writer *w, const char *name, m2d_dtype dtype, int ndim,
                      const int64_t *shape, const void *data);
/* Convenience: add fp32 data, stored as DTYPE (F32/F16/BF16) with round-to-nearest-even. */
int m2d_st_writer_add_f32(m2d_st_writer *w, const char *name, m2d_dtype dtype, int ndim,
                          const int64_t *shape, const float *data);
/* Like add, without copying: DATA must stay valid until write/free (for large outputs). */
int m2d_st_writer_add_ref(m2d_st_writer *w, const char *name, m2d_dtype dtype, int ndim,
                          const int64_t *shape, const void *data);
/* Bytes [OFFSET, OFFSET + N) of tensor NAME's data (row-major, its dtype) into BUF, a buffer the
 * writer owns and reuses. The writer asks for each lazy tensor once per write, in order, in chunks
 * of at most M2D_ST_FILL_CHUNK bytes (OFFSET and N multiples of 8 bytes or the tensor's end, so
 * always of the element size). Returns 0, or -1 + m2d_err: the write then fails and leaves
 * nothing behind. */
typedef int (*m2d_st_fill_fn)(void *ctx, const char *name, size_t offset, void *buf, size_t n);
#define M2D_ST_FILL_CHUNK ((size_t)64 << 20)
int m2d_st_writer_add_lazy(m2d_st_writer *w, const char *name, m2d_dtype dtype, int ndim,
                           const int64_t *shape, m2d_st_fill_fn fill, void *ctx);
void m2d_st_writer_metadata(m2d_st_writer *w, const char *key, const char *value);
int m2d_st_writer_write(m2d_st_writer *w, const char *path); /* atomic: temp + rename */
/* Sharded, Hugging Face's layout: DIR/model-0000i-of-0000n.safetensors (split in write order at
 * MAX_SHARD_BYTES, a larger tensor gets its own shard) + DIR/model.safetensors.index.json
 * ({"metadata": {"total_size": data bytes}, "weight_map": {name: shard}}, as transformers'
 * save_pretrained prints it: json.dumps(indent=2, sort_keys=True) + newline). Every shard goes to
 * a temp file first; only when all are complete are they renamed into place (an older index is
 * removed before, the new one written last), so a failure leaves no new shard and no index that
 * names a missing or partial one. */
int m2d_st_writer_write_sharded(m2d_st_writer *w, const char *dir, size_t max_shard_bytes, int *n_shards);
/* Total data bytes of the tensors added so far (what a sharding decision needs). */
uint64_t m2d_st_writer_data_bytes(const m2d_st_writer *w);
void m2d_st_writer_free(m2d_st_writer *w);

/* 0 when every value of every F32/BF16/F16 tensor of ST is finite; else -1 + m2d_err naming the
 * file, the first such tensor, how many of its values are NaN or infinite and where the first is. */
int m2d_st_check_finite(const m2d_st *st);

#endif
