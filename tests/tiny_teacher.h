/* tiny_teacher — ../shared/models/tiny-qwen3moe opened for a test: model, tokenizer, engine. */
#ifndef M2D_TINY_TEACHER_H
#define M2D_TINY_TEACHER_H

#include "engine/engine.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    char *dir;          /* the model directory */
    m2d_model *m;
    m2d_tokenizer *tk;
    m2d_engine *e;      /* THREADS threads */
} tu_tiny_teacher;

/* 0 and *t opened; -1 when the model is not there (the caller skips). Open failures fail the test. */
int tu_tiny_teacher_open(int threads, tu_tiny_teacher *t);
void tu_tiny_teacher_close(tu_tiny_teacher *t);

#endif
