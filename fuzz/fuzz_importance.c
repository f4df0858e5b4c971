/* libFuzzer target for the importance file reader (moe2dense prune --importance, calib/importance.h):
 * any input loads or fails with one error line naming the file, never crashes, leaks, reads out of
 * bounds or allocates more than the input's size in scores. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "calib/importance.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    m2d_importance *imp = NULL;
    if (m2d_importance_parse("fuzz.importance.json", (const char *)data, size, &imp) != 0) {
        const char *msg = m2d_errmsg();
        if (strncmp(msg, "fuzz.importance.json: ", 22) != 0 || strchr(msg, '\n')) abort();
        return 0;
    }
    double s = imp->nll_full;
    for (int i = 0; i < imp->n_layers * imp->ffn; i++) s += imp->ffn_neuron[i];
    for (int i = 0; i < imp->hidden; i++) s += imp->channel[i];
    if (s != s) abort(); /* the reader accepts finite numbers only */
    m2d_importance_free(imp);
    return 0;
}
