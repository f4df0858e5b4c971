/* routing — see routing.h. */
#include "routing.h"

#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "engine/gemm.h"

void tu_routing_init(tu_routing *r, int n_layers, int n, int k) {
    r->n = n, r->k = k;
    r->ids = m2d_calloc((size_t)n_layers * n * k, sizeof *r->ids);
    r->gates = m2d_calloc((size_t)n_layers * n * k, sizeof *r->gates);
}

void tu_routing_free(tu_routing *r) {
    free(r->ids), free(r->gates);
    r->ids = NULL, r->gates = NULL;
}

int tu_routing_hook(void *user, const m2d_moe_event *ev) {
    tu_routing *r = user;
    for (int t = 0; t < ev->n_tokens; t++)
        for (int j = 0; j < ev->top_k; j++) {
            size_t o = ((size_t)ev->layer * r->n + t) * r->k + j;
            r->ids[o] = ev->topk[t * ev->top_k + j];
            r->gates[o] = ev->gates[t * ev->top_k + j];
        }
    return 0;
}

int tu_routed_offered_on_onednn(m2d_precision p) {
    int native = p == M2D_PREC_FP32 ? m2d_gemm_fp32_onednn_native() : m2d_gemm_bf16_native(), rows, kc;
    if (!native) return m2d_gemm_fp32_own(); /* oneDNN forced but absent: the sgemm path */
    return m2d_gemm_onednn_rows_independent(p) || m2d_gemm_exact_plan(p, &rows, &kc);
}

int tu_routed_hook(void *user, const m2d_moe_event *ev) {
    tu_routed_hook_state *h = user;
    h->calls++;
    if ((ev->routed == NULL) != (ev->routed_set == NULL)) return m2d_err("routed hook: routed and routed_set disagree");
    if (!ev->routed) return 0;
    h->offered++;
    if (h->decline) return 0;
    int n = ev->n_tokens, E = ev->n_experts, d = ev->hidden, k = ev->top_k;
    float *F = m2d_malloc(sizeof(float) * (size_t)n * E * d);
    int rc = m2d_engine_all_experts(h->e, ev->layer, ev->x, n, F, NULL);
    for (int t = 0; t < n && rc == 0; t++) {
        float *o = ev->routed + (size_t)t * d;
        memset(o, 0, sizeof(float) * d);
        for (int x = 0; x < E && !h->zeros; x++)
            for (int r = 0; r < k; r++)
                if (ev->topk[t * k + r] == x)
                    for (int i = 0; i < d; i++) o[i] += ev->gates[t * k + r] * F[((size_t)t * E + x) * d + i];
    }
    free(F);
    *ev->routed_set = rc == 0;
    return rc;
}
