/* actstore — the residual streams of many windows between the layers of a layer-major pass
 * (engine.h m2d_engine_logprobs_windows): one fp32 array of ROWS x COLS held in memory when it
 * fits a byte budget, else in a file (created and unlinked at once in a directory the caller
 * names, so nothing is left behind and nothing can be planted) read and written a window at a
 * time. The engine's residual stream is fp32 in every precision, so storing it in fp32 keeps the
 * layer-major results identical to the window-major ones. */
#ifndef M2D_ACTSTORE_H
#define M2D_ACTSTORE_H

#include <stddef.h>

typedef struct m2d_actstore m2d_actstore;

/* NULL + m2d_err when the file cannot be made (naming DIR). DIR NULL: $TMPDIR, else /tmp. */
m2d_actstore *m2d_actstore_open(size_t rows, size_t cols, size_t mem_budget, const char *dir);
/* rows [ROW0, ROW0 + N) into DST / from SRC; -1 + m2d_err on an I/O error (naming the file). */
int m2d_actstore_get(m2d_actstore *s, size_t row0, size_t n, float *dst);
int m2d_actstore_put(m2d_actstore *s, size_t row0, size_t n, const float *src);
int m2d_actstore_spilled(const m2d_actstore *s); /* 1: held in a file */
void m2d_actstore_free(m2d_actstore *s);

#endif
