/* distill_fixture — the models of the distillation tests: a small random Qwen3-MoE teacher and a
 * dense student, with the byte-level tokenizer (ids = bytes), in a fresh work directory. */
#ifndef M2D_DISTILL_FIXTURE_H
#define M2D_DISTILL_FIXTURE_H

#include <stdint.h>

#include "train/distill.h"

typedef struct {
    char *dir;              /* the work directory (removed by tu_distill_fixture_free) */
    char *teacher, *student;/* DIR/teacher (MoE, seed 1), DIR/student (dense, seed 2) */
    char *data;             /* DIR/train.txt: the path only, the test writes its text */
} tu_distill_fixture;

/* Model NAME in DIR (malloc'd path): MoE or dense, SEED, TOP_K experts per token (0: 2 of 8). */
char *tu_distill_model(const char *dir, const char *name, int moe, uint64_t seed, int top_k);
/* Run O stopped after step STEP (its checkpoint in O.out); fails the test when the run fails. */
void tu_distill_stopped(m2d_distill_opts o, int step);
void tu_distill_fixture_make(tu_distill_fixture *f);
void tu_distill_fixture_free(tu_distill_fixture *f);

#endif
