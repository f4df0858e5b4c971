/* tiny_teacher — model, tokenizer and engine of tiny-qwen3moe for a test (see tiny_teacher.h). */
#include "tiny_teacher.h"

#include <stdlib.h>
#include <string.h>

#include "testutil.h"

int tu_tiny_teacher_open(int threads, tu_tiny_teacher *t) {
    memset(t, 0, sizeof *t);
    t->dir = tu_model_path("tiny-qwen3moe");
    if (!t->dir) return -1;
    assert_int_equal(m2d_model_open(t->dir, &t->m), 0);
    assert_int_equal(m2d_tokenizer_load(t->dir, &t->tk), 0);
    assert_int_equal(m2d_engine_new(t->m, threads, &t->e), 0);
    return 0;
}

void tu_tiny_teacher_close(tu_tiny_teacher *t) {
    if (t->e) m2d_engine_free(t->e);
    if (t->tk) m2d_tokenizer_free(t->tk);
    if (t->m) m2d_model_close(t->m);
    free(t->dir);
    memset(t, 0, sizeof *t);
}
