/* convert/fingerprint — a plan's identity: a sweep fingerprints a plan and skips students it has
 * already built (canonical group order: plan.h). */
#ifndef M2D_CONVERT_FINGERPRINT_H
#define M2D_CONVERT_FINGERPRINT_H

#include "convert/plan.h"

/* Student fingerprint: sha256 of "moe2dense-student-v1", the teacher weights hash, the target and
 * per MoE layer its canonical groups (member ids, merge weights and α as exact hex floats, the
 * sources and a hash of each permutation when given; the student's top-k when changed).
 * Equal fingerprints => bit-identical students. Filled into plan->fingerprint by plan_build. */
void m2d_convert_fingerprint(const m2d_convert_plan *p, char out[65]);

#endif
