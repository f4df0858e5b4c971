/* routing — records the engine's routing through its MoE hook, for tests that compare it with a
 * golden routing: per MoE layer and token, the top-k experts and their gate weights. */
#ifndef M2D_TEST_ROUTING_H
#define M2D_TEST_ROUTING_H

#include <stdint.h>

#include "engine/engine.h"

typedef struct {
    int n, k;      /* tokens, experts per token */
    int32_t *ids;  /* [layer][token][k], zero for dense layers */
    float *gates;  /* same layout */
} tu_routing;

/* Storage for N_LAYERS x N tokens x K; free with tu_routing_free. */
void tu_routing_init(tu_routing *r, int n_layers, int n, int k);
void tu_routing_free(tu_routing *r);
/* An m2d_moe_hook: m2d_engine_set_moe_hook(e, tu_routing_hook, &routing). */
int tu_routing_hook(void *user, const m2d_moe_event *ev);

/* An m2d_moe_hook that hands the layer's routed output back when the engine offers it
 * (m2d_moe_event.routed): every expert's output from m2d_engine_all_experts on E, the gated terms
 * added in increasing expert id (by a plain double loop, not calibration's code), or zeros. */
typedef struct {
    m2d_engine *e;
    int zeros;          /* hand back zeros instead (the substitution must then move the logits) */
    int calls, offered; /* MoE layers seen, and those where the engine offered the substitution */
    int decline;        /* count the offer but let the engine run the routed experts itself */
} tu_routed_hook_state;
/* Whether the engine offers the substitution at precision P with oneDNN's kernel forced: where
 * oneDNN's rows are independent of the batch, or an exact-rows plan makes them so (gemm.h); where
 * oneDNN has no native kernel the weights take the sgemm path, whose own fp32 kernel (AVX2 + FMA)
 * computes every row on its own. */
int tu_routed_offered_on_onednn(m2d_precision p);
int tu_routed_hook(void *user, const m2d_moe_event *ev);

#endif
