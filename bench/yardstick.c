/* yardstick — see yardstick.h. */
#include "yardstick.h"

#include <stdint.h>
#include <stdlib.h>

#include "base/util.h"
#include "engine/gemm.h"
#include "engine/pool.h"

double yardstick_gemm_peak(m2d_precision p) {
    enum { N = 2048 };
    m2d_pool *pool = m2d_pool_new(2);
    m2d_gemm_ctx *g;
    if (m2d_gemm_ctx_new(p, pool, &g)) exit(1);
    float *x = m2d_malloc(sizeof(float) * N * N), *y = m2d_malloc(sizeof(float) * N * N);
    uint16_t *w = m2d_malloc(sizeof(uint16_t) * N * N);
    for (size_t i = 0; i < (size_t)N * N; i++) x[i] = (float)((i % 17) * 0.01), w[i] = m2d_f32_to_bf16((float)((i % 13) * 0.01));
    m2d_gemm_w wv = m2d_gemm_weight(M2D_BF16, w, N, N, N);
    double best = 1e30;
    for (int r = 0; r < 6; r++) {
        double t0 = m2d_now();
        if (m2d_gemm(g, x, N, N, &wv, y, N, 0.0f)) exit(1);
        if (r && m2d_now() - t0 < best) best = m2d_now() - t0;
    }
    free(x); free(y); free(w);
    m2d_gemm_ctx_free(g);
    m2d_pool_free(pool);
    return 2.0 * N * N * (double)N / best / 1e9;
}

/* Layer L's attention projections, the attention itself and its router over n tokens, of which
 * ROWS go on past the attention (o_proj, router: engine.c live_rows) */
static double layer_attention_router_flops(const m2d_config *c, int l, int n, int rows) {
    double d = c->hidden_size, qd = (double)c->num_attention_heads * c->head_dim,
           kvd = (double)c->num_key_value_heads * c->head_dim;
    double f = 2.0 * n * (d * qd + 2 * d * kvd) + 2.0 * rows * qd * d;
    f += 2.0 * 2.0 * c->head_dim * c->num_attention_heads * ((double)n * (n + 1) / 2);
    return c->layer_is_moe[l] ? f + 2.0 * rows * d * c->num_experts : f;
}

static double attention_router_flops(const m2d_config *c, int n) {
    double f = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) f += layer_attention_router_flops(c, l, n, n);
    return f;
}

/* The engine's work: every layer on all n rows, but the last one past its attention only on the
 * SCORED rows (the ones the LM head scores; engine.c live_rows). */
double yardstick_forward_flops(const m2d_config *c, int n, int scored) {
    double d = c->hidden_size, f = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        int rows = l == c->num_hidden_layers - 1 ? scored : n;
        f += layer_attention_router_flops(c, l, n, rows);
        f += c->layer_is_moe[l] ? 2.0 * rows * c->num_experts_per_tok * 3 * d * c->moe_intermediate_size
                                : 2.0 * rows * 3 * d * c->intermediate_size;
    }
    return f + 2.0 * scored * d * c->vocab_size;
}

double yardstick_calib_flops(const m2d_config *c, int n_windows, int L) {
    double d = c->hidden_size, E = c->num_experts, f = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (!c->layer_is_moe[l]) {
            f += 2.0 * L * 3 * d * c->intermediate_size;
            continue;
        }
        f += 6.0 * L * d * c->moe_intermediate_size * E; /* every expert on every token */
        f += (double)L * E * (E + 1) * d;                 /* Gram: E(E+1)/2 dot products of d terms */
        f += 2.0 * L * E * d + (double)L * E * (E + 1);   /* router logits in fp64 and their Gram */
    }
    return n_windows * (attention_router_flops(c, L) + f + 2.0 * d * c->vocab_size);
}

int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
