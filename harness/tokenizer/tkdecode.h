/* tkdecode — the decoder of a tokenizer.json (HF `decoders`): ByteLevel, Metaspace, Replace,
 * ByteFallback, Fuse, Strip and Sequence of them, applied to the token strings of the ids as HF's
 * decode_chain does. Read-only once loaded: decodes may run from several threads at once. */
#ifndef M2D_TKDECODE_H
#define M2D_TKDECODE_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "tokenizer/tktext.h"

typedef struct m2d_tkdecoder m2d_tkdecoder;

/* DEC: the "decoder" object of PATH's tokenizer.json; NULL or JSON null = no decoder (HF then joins
 * the token strings with a space). Unsupported types are a one-line error naming the field. */
int m2d_tkdecoder_load(const char *path, const cJSON *dec, m2d_tkdecoder **out);
void m2d_tkdecoder_free(m2d_tkdecoder *d);

/* Appends the decoded text of the N token strings to OUT. raw = 1 keeps the bytes that byte-level and
 * byte-fallback tokens spell even where they are not valid UTF-8; raw = 0 replaces them as HF does
 * (ByteLevel: U+FFFD per maximal invalid subpart; ByteFallback: U+FFFD per byte). */
int m2d_tkdecoder_run(const m2d_tkdecoder *d, const char *const *tok, const uint32_t *len, size_t n, int raw,
                      m2d_tkbuf *out);

#endif
