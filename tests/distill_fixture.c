/* distill_fixture — the models of the distillation tests (see distill_fixture.h). */
#include "distill_fixture.h"

#include <stdlib.h>

#include "base/util.h"
#include "testmodel.h"
#include "testutil.h"

char *tu_distill_model(const char *dir, const char *name, int moe, uint64_t seed, int top_k) {
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    o.moe = moe, o.seed = seed, o.vocab_size = 320, o.eos_token_id = 256, o.init_std = 0.2f;
    o.intermediate_size = moe ? 64 : 32;
    if (top_k) o.num_experts_per_tok = top_k;
    char *path = m2d_path_join(dir, name), *tok = m2d_path_join(path, "tokenizer.json");
    if (m2d_testmodel_write(path, &o)) fail_msg("%s", m2d_errmsg());
    tu_copy_file("tests/golden/hf/tokenizer.json", tok); /* byte-level: ids = bytes */
    free(tok);
    return path;
}

void tu_distill_stopped(m2d_distill_opts o, int step) {
    m2d_distill_result r;
    o.stop_after = step;
    if (m2d_distill_run(&o, &r)) fail_msg("%s", m2d_errmsg());
}

void tu_distill_fixture_make(tu_distill_fixture *f) {
    f->dir = tu_tmpdir();
    f->teacher = tu_distill_model(f->dir, "teacher", 1, 1, 0);
    f->student = tu_distill_model(f->dir, "student", 0, 2, 0);
    f->data = m2d_path_join(f->dir, "train.txt");
}

void tu_distill_fixture_free(tu_distill_fixture *f) {
    tu_rm_rf(f->dir);
    free(f->dir), free(f->teacher), free(f->student), free(f->data);
}
