/* convert — build the student from a teacher, its calibration statistics and three plugins
 * (SPEC §4): per MoE layer, score + select K experts, group them into k groups, merge each group
 * by score-weighted averaging, scale each group's down projection by α_g, concatenate into one
 * dense SwiGLU FFN of width k·d_e, followed by the layer's shared experts (DeepSeek, Qwen2-MoE:
 * copied, α = 1, not part of K). A teacher whose gates carry a factor (DeepSeek's
 * routed_scaling_factor) has every α of a dense student multiplied by it (the scaling rules speak
 * of p). Everything else is the teacher's, bit for bit.
 *
 * --target moe (REAP-style smaller MoE): each group is merged into one expert as above (α = 1:
 * the router's gate weights do the weighting). How the router reaches it (SPEC §4):
 *  - shared (default): every retained expert keeps its own router row, and every member of a
 *    group points at the group's merged expert. Qwen3-MoE has one expert per router row, so the
 *    merged weights are stored once per member: num_experts = K, slots in increasing teacher
 *    expert id (so top-k ties still go to the lower teacher index). Routing is the teacher's,
 *    restricted to the K retained rows; two routed members of one group both add the merged
 *    expert, with their own gate weights.
 *  - average: one expert per group, whose router row is the merge-weighted average of its
 *    members' rows: num_experts = number of groups (smaller, but routing changes).
 * With one expert per group (--groups K, the default: pure pruning) both are the same student.
 * Pruning (K < E, one expert per group) is paper 003's Eq. 2: softmax over the K retained rows,
 * top-k, renormalised when the teacher renormalises — on such a model exactly the teacher's
 * probabilities restricted to the survivors and renormalised over the new top-k.
 * Remapping groupings (HC-SMoE, M-SMoE, ConMoE; plugin .remap): all E experts are members
 * (K = E) and the student keeps every router row, shared mode: the router is the teacher's
 * unchanged, top-k over the same E logits, and slot e holds its group's expert, so the output is
 * Σ_{i∈top-k} g_i f_{group(i)} = Σ_groups (Σ_{i in group} g_i) f_group — the gates of routed
 * experts of one group add up (paper 003 Eq. 3, paper 002 §4.3). Exactly the papers' function; the
 * only difference is fp32 summation order (g_1 f + g_2 f instead of (g_1 + g_2) f). The
 * checkpoint stores E slots (paper 002 App. B.2: "materialised"), slots of one group sharing
 * their data in memory.
 * num_experts_per_tok = min(top_k or k, num_experts).
 *
 * The converter is four modules, one idea each; this header brings them together for callers:
 *   plan.h         what to build (plugins → canonical groups, merge weights, α), checks, parameters
 *   fingerprint.h  a plan's identity (equal fingerprints, bit-identical students)
 *   build.h        the student in memory (the merge math on plain arrays, random baselines)
 *   write.h        the student as a Hugging Face checkpoint, the output directory rule */
#ifndef M2D_CONVERT_H
#define M2D_CONVERT_H

#include "convert/plan.h"
#include "convert/fingerprint.h"
#include "convert/build.h"
#include "convert/write.h"

#endif
