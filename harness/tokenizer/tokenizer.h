/* tokenizer — Hugging Face tokenizer.json: BPE (byte-level or SentencePiece style with byte
 * fallback), normalizers, pre-tokenizers (Split regexes with Oniguruma's meaning via PCRE2, ByteLevel,
 * Metaspace, Digits), added/special tokens, decoders, post-processors. Encode gives exactly HF
 * `tokenizers` ids.
 * A loaded tokenizer is read-only: encode/decode may run from several threads at once. */
#ifndef M2D_TOKENIZER_H
#define M2D_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct m2d_tokenizer m2d_tokenizer;

/* PATH: a tokenizer.json file or a directory holding one. */
int m2d_tokenizer_load(const char *path, m2d_tokenizer **out);
void m2d_tokenizer_free(m2d_tokenizer *tk);

/* Encode UTF-8 text (len bytes; no BOS added: add_special_tokens=False semantics).
 * *ids is malloc'd; returns 0 or -1 (invalid UTF-8 is an error naming the byte offset). */
int m2d_tokenizer_encode(const m2d_tokenizer *tk, const char *text, size_t len, int32_t **ids, size_t *n_ids);
/* The same with add_special_tokens=True (HF Tokenizer.encode's default): the tokenizer.json
 * post_processor's ids around the text's (TemplateProcessing's single template, e.g. the BOS of
 * Llama / Mixtral / DeepSeek; RobertaProcessing / BertProcessing: cls, sep; ByteLevel: none).
 * transformers' LlamaTokenizerFast may rebuild that template from tokenizer_config.json's
 * add_bos_token / add_eos_token; this follows the tokenizer.json. */
int m2d_tokenizer_encode_special(const m2d_tokenizer *tk, const char *text, size_t len, int32_t **ids, size_t *n_ids);
/* Decode ids to UTF-8 (malloc'd, NUL-terminated). Out-of-range id is an error. */
int m2d_tokenizer_decode(const m2d_tokenizer *tk, const int32_t *ids, size_t n, char **text, size_t *len);

int m2d_tokenizer_vocab_size(const m2d_tokenizer *tk);     /* max id + 1 */
int m2d_tokenizer_token_id(const m2d_tokenizer *tk, const char *token); /* -1 if absent */
int m2d_tokenizer_bos_id(const m2d_tokenizer *tk);         /* -1 if none (from tokenizer_config.json when present) */
int m2d_tokenizer_eos_id(const m2d_tokenizer *tk);         /* -1 if none */

/* Decode to the raw bytes the ids spell (no U+FFFD substitution; *bytes malloc'd and
 * NUL-terminated). m2d_tokenizer_decode is this plus Rust's from_utf8_lossy, as HF does. */
int m2d_tokenizer_decode_bytes(const m2d_tokenizer *tk, const int32_t *ids, size_t n, char **bytes, size_t *len);
/* The token string of an id (added tokens as written in tokenizer.json), NULL if none. */
const char *m2d_tokenizer_id_token(const m2d_tokenizer *tk, int32_t id, size_t *len);
/* Testing hook: words of more than N initial symbols are merged with the priority queue,
 * shorter ones with the direct O(n^2) scan (both give the same ids; tests compare them).
 * 0 = always the queue, SIZE_MAX = always the scan. Not thread-safe against encodes. */
void m2d_tokenizer_set_bpe_heap_threshold(m2d_tokenizer *tk, size_t n);
/* Testing hook: pieces longer than N bytes are cut where no merge can reach across (only in
 * pipelines that never split the text, e.g. SentencePiece style), shorter ones are merged whole
 * (same ids; tests compare them). 0 = cut every piece, SIZE_MAX = never. Not thread-safe against encodes. */
void m2d_tokenizer_set_word_cut_min(m2d_tokenizer *tk, size_t n);
/* Testing hook: 1 = NFC the whole text with utf8proc (the reference), 0 = normalize only the
 * stretches that can change (default; same result). */
void m2d_tokenizer_set_reference_nfc(m2d_tokenizer *tk, int on);

#endif
