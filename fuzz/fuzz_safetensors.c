/* libFuzzer target: arbitrary bytes as a whole safetensors file. The parser must never crash,
 * read out of bounds or leak; on success every tensor view must lie inside the buffer (or in
 * an aligned copy) and be consistent with its shape and dtype. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/st.h"
#include "base/util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    m2d_st *st;
    if (m2d_st_open_buffer("fuzz.safetensors", data, size, &st) != 0) {
        /* one line, naming the file */
        const char *msg = m2d_errmsg();
        if (strncmp(msg, "fuzz.safetensors", 16) != 0 || strchr(msg, '\n')) abort();
        return 0;
    }
    volatile uint8_t sink = 0;
    for (int i = 0; i < m2d_st_count(st); i++) {
        const m2d_tensor *t = m2d_st_at(st, i);
        if ((size_t)m2d_tensor_numel(t) * m2d_dtype_size(t->dtype) != t->nbytes) abort();
        if (m2d_st_find(st, t->name) != t) abort();
        /* touch first and last byte: ASan catches an out-of-bounds view */
        if (t->nbytes) sink ^= ((const uint8_t *)t->data)[0] ^ ((const uint8_t *)t->data)[t->nbytes - 1];
        if (i && strcmp(m2d_st_at(st, i - 1)->name, t->name) >= 0) abort();
    }
    (void)sink;
    char hash[65];
    m2d_st_hash(st, 1 << 20, hash);
    m2d_st_close(st);
    return 0;
}
