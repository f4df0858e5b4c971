/* engine_check — the checks m2d_engine_open makes before it runs anything (internal to the engine):
 * a model the engine implements (shapes, the tensors each layer's ops read; a one-line error
 * naming what is missing) and a backend that has every capability its layers need (backend.h's
 * M2D_CAPS; m2d_engine_required_caps in engine.h). */
#ifndef M2D_ENGINE_CHECK_H
#define M2D_ENGINE_CHECK_H

#include "engine/backend.h"
#include "model/model.h"

/* the rotated part of a head (cfg.rope_dim, or the whole head) */
int m2d_engine_rope_dim(const m2d_config *c);
/* 0, or -1 + m2d_err naming the model, the layer and what the engine does not implement */
int m2d_engine_check_model(const m2d_model *m);
/* 0, or -1 + m2d_err naming the capability backend BE lacks for M */
int m2d_engine_check_caps(const m2d_model *m, const m2d_backend *be);

#endif
