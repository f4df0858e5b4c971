/* libFuzzer target for a distillation checkpoint piece (step-S.weights|adam_m|adam_v.safetensors,
 * train/state.h): the first input byte picks the piece (its value mod 3) and, with bit 7 set, makes
 * the expected SHA-256 the piece's own so that the fuzzer gets past the hash to the value checks;
 * the rest is the file. Any input is accepted or refused with one error line naming the file, never
 * crashes, leaks or reads out of bounds; an accepted piece holds the one F32 tensor of the run's 4
 * parameters, every value finite (adam_v's also >= 0). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "io/st.h"
#include "train/state.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define TOTAL 4
static const char *const NAMES[] = {"weights", "adam_m", "adam_v"};

/* the SHA-256 the piece is checked against: its own tensor's when asked and there, else zeros */
static void expected_sha(const m2d_st *st, int part, int own, char sha[65]) {
    memset(sha, '0', 64);
    sha[64] = 0;
    const m2d_tensor *t = m2d_st_find(st, NAMES[part]);
    if (own && t && t->nbytes == sizeof(float) * TOTAL) m2d_sha256_hex(t->data, t->nbytes, sha);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int part = data[0] % 3, own = data[0] & 0x80;
    m2d_st *st;
    if (m2d_st_open_buffer("fuzz.safetensors", data + 1, size - 1, &st) != 0) return 0; /* fuzz_safetensors' */
    char sha[65];
    expected_sha(st, part, own, sha);
    const float *x = NULL;
    if (m2d_train_state_check_piece("fuzz.safetensors", st, part, TOTAL, sha, &x) != 0) {
        const char *msg = m2d_errmsg();
        if (strncmp(msg, "fuzz.safetensors: ", 18) != 0 || strchr(msg, '\n')) abort();
    } else {
        for (int i = 0; i < TOTAL; i++)
            if (!isfinite(x[i]) || (part == 2 && x[i] < 0)) abort();
    }
    m2d_st_close(st);
    return 0;
}
