/* routing — see routing.h. */
#include "routing.h"

#include <stdlib.h>

#include "base/util.h"

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
