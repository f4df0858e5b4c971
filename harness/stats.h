/* stats — calibration statistics of SPEC §1, per MoE layer, in double precision.
 * Produced by calib.c (moe2dense calibrate), read (never written) by every plugin. */
#ifndef M2D_STATS_H
#define M2D_STATS_H

#include <stdint.h>

typedef struct {
    int layer;              /* model layer index */
    int E, k, d;            /* experts, router top-k, hidden size */
    double N;               /* calibration tokens */
    /* [E] each; "routed" = tokens t with e in S(t) */
    double *n;              /* n_e: routed count */
    double *sum_p;          /* Σ_t p_e(t), all tokens */
    double *sum_p_sel;      /* Σ_{routed} p_e(t) */
    double *sum_g, *sum_g2; /* Σ_{routed} g_e, g_e² (native gate weight) */
    double *sum_f, *sum_f2; /* Σ_{routed} ‖f_e‖, ‖f_e‖² */
    double *sum_gf, *sum_g2f2; /* Σ_{routed} g‖f‖, g²‖f‖² */
    double *gram;           /* [E*E] G_ij = Σ_t <f_i(t), f_j(t)> over all tokens, row-major */
    double *mu;             /* [E*d] Σ_t f_e(t) / N over all tokens */
    double *routed_mean;    /* [E*d] mean of f_e over routed tokens (0 if n_e = 0) */
    double *routed_var;     /* [E*d] population variance of f_e over routed tokens */
    /* seed 001 (condenser experts), per calibration sample s of length L_s, averaged over samples:
     * es_act[e] = mean_s (n_e(s) / L_s), es_mag[e] = mean_s (Σ_{t∈s routed to e} ‖f_e(t)‖ / L_s) */
    double *es_act, *es_mag;
    int n_samples;
} m2d_layer_stats;

typedef struct {
    int n_layers;           /* MoE layers only */
    m2d_layer_stats *layers;
    int E, k, d, d_e;
    double N;
    char model_hash[65], calib_hash[65];
    char gate_convention[32]; /* "softmax-topk-renorm" or "softmax-topk" */
    /* which calibration windows were used: start token offsets into the encoded file */
    int n_windows, seq_len;
    int64_t *window_starts;
    char *data_path;
} m2d_stats;

/* Allocate zeroed arrays for one layer (E experts, d hidden). */
void m2d_layer_stats_alloc(m2d_layer_stats *s, int layer, int E, int k, int d);
void m2d_layer_stats_free(m2d_layer_stats *s);
void m2d_stats_free(m2d_stats *s);

#endif
