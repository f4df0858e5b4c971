/* libFuzzer target for the distillation checkpoint's state.json (train/state.h): any input is
 * accepted or refused with one error line naming the file, never crashes, leaks or reads out of
 * bounds; an accepted one has a whole step within the run, finite losses and a 64-hex-digit
 * SHA-256 per piece. The run's identity is fixed (teacher=t, lr=0.001): the seed corpus matches it,
 * so the fuzzer also reaches the hash and loss fields. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "train/state.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_STEPS 8
#define TOTAL 4

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    m2d_run_identity id = {0};
    m2d_run_identity_add(&id, "teacher", "%s", "t");
    m2d_run_identity_add(&id, "lr", "%s", "0.001");
    double losses[MAX_STEPS];
    char sha[3][65];
    int step = -1;
    if (m2d_train_state_parse("fuzz/state.json", (const char *)data, size, &id, TOTAL, MAX_STEPS, &step, losses,
                              sha) != 0) {
        const char *msg = m2d_errmsg();
        if (strncmp(msg, "fuzz/state.json: ", 17) != 0 || strchr(msg, '\n')) abort();
    } else {
        if (step < 1 || step > MAX_STEPS) abort();
        for (int i = 0; i < step; i++)
            if (!isfinite(losses[i])) abort();
        for (int p = 0; p < 3; p++)
            if (strlen(sha[p]) != 64 || strspn(sha[p], "0123456789abcdef") != 64) abort();
    }
    m2d_run_identity_free(&id);
    return 0;
}
