/* convert/build — the student in memory from a teacher and a plan (plan.h; the conversion as a
 * whole: convert.h).
 *
 * Weight precision: every merged matrix is accumulated in fp64 (Σ w_e α W_e) and rounded once to
 * the teacher's expert dtype (to nearest even; through fp32 rounded to odd where that dtype is
 * narrower: m2d_round_for), both in memory and on disk, so the in-memory student and the written
 * checkpoint are the same model. */
#ifndef M2D_CONVERT_BUILD_H
#define M2D_CONVERT_BUILD_H

#include "convert/plan.h"

/* ---- the math on plain arrays (tested directly) ---- */
/* V as the fp32 a tensor of dtype TARGET is made from (m2d_from_f32): rounded to nearest for F32,
 * to odd for BF16 and F16, so that V reaches TARGET rounded once (tensor.h m2d_f64_to_f32_odd). */
float m2d_round_for(double v, m2d_dtype target);
/* out[j] = m2d_round_for(scale · Σ_i w[i] · src[i][j], TARGET) with fp64 accumulation. */
void m2d_merge_matrices(const float *const *src, const double *w, int n, size_t numel, double scale, m2d_dtype target,
                        float *out);
/* Dense SwiGLU FFN from n blocks of WIDTHS[b] (gate/up [w_b, d], down [d, w_b]): gate/up
 * row-concatenated, down column-concatenated, in block order. */
void m2d_concat_ffn_blocks(int n, int d, const int *widths, const float *const *gates, const float *const *ups,
                           const float *const *downs, float *gate, float *up, float *down);
/* Dense SwiGLU FFN from k groups (each gate/up [d_e, d], down [d, d_e]):
 * gate/up [k·d_e, d] row-concatenated, down [d, k·d_e] column-concatenated (already scaled). */
void m2d_concat_ffn(int k, int d, int d_e, const float *const *gates, const float *const *ups,
                    const float *const *downs, float *gate, float *up, float *down);
/* y = W_down (silu(W_gate x) ⊙ W_up x) for one vector x [d] -> y [d] (fp64 accumulation). */
void m2d_swiglu_ref(int d, int inter, const float *gate, const float *up, const float *down, const float *x, float *y);

/* ---- student ---- */
/* Build the student in memory. It shares the teacher's unchanged tensors (attention, norms,
 * embeddings, LM head): the teacher must stay open while the student is used. */
int m2d_convert_build(const m2d_model *teacher, const m2d_convert_plan *plan, m2d_model **student);
void m2d_convert_student_free(m2d_model *student);

#endif
