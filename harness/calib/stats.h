/* stats — calibration statistics of SPEC §1, per MoE layer, in double precision.
 * Produced by calib.c (moe2dense calibrate), read (never written) by every plugin. */
#ifndef M2D_STATS_H
#define M2D_STATS_H

#include <stddef.h>
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
    double *sum_gf2, *sum_g2f; /* Σ_{routed} g‖f‖², g²‖f‖  (complete the S(b,a,c) grid a,c ∈ {0,1,2}) */
    /* the same six gate sums with the gate renormalised over the top-k, r_e(t) = p_e(t) / Σ_{i∈S(t)} p_i(t)
     * (paper 004 Eq. 1; equal to the native ones when the model renormalises, norm_topk_prob) */
    double *sum_r, *sum_r2, *sum_rf, *sum_rf2, *sum_r2f, *sum_r2f2;
    /* paper 004 Eq. 7, the exact single-expert pruning damage: Σ_{routed} ‖y(t) − y^(−e)(t)‖ with
     * y = Σ_{i∈S} r_i f_i and y^(−e) the output after removing e's router row (the next expert by
     * p joins the top-k, gates renormalised over the new set) */
    double *damage;
    double *logit_gram;     /* [E*E] Σ_t z_i(t) z_j(t), z the router logits, all tokens (M-SMoE, Eq. 14) */
    double *gram;           /* [E*E] G_ij = Σ_t <f_i(t), f_j(t)> over all tokens, row-major */
    double *mu;             /* [E*d] Σ_t f_e(t) / N over all tokens */
    double *routed_mean;    /* [E*d] mean of f_e over routed tokens (0 if n_e = 0) */
    double *routed_var;     /* [E*d] population variance of f_e over routed tokens */
    /* seed 001 (condenser experts), per calibration sample s of length L_s, averaged over samples:
     * es_act[e] = mean_s (n_e(s) / L_s), es_mag[e] = mean_s (Σ_{t∈s routed to e} ‖f_e(t)‖ / L_s),
     * es_mag_gated[e] = mean_s (Σ_{t∈s} ‖g_e(t) f_e(t)‖ / L_s) (paper 001 App. D: every token, the
     * gated output, native gate; g_e(t) = 0 off the top-k, so the sum runs over routed tokens) */
    double *es_act, *es_mag, *es_mag_gated;
    int n_samples;
    /* ---- raw running sums (stats.c): the derived fields above (mu, routed_mean, routed_var,
     * es_act, es_mag) are recomputed from these by m2d_layer_stats_finalize(), so shards of
     * data can be merged (m2d_layer_stats_merge) before or after finalizing. ---- */
    double *sum_f_all;      /* [E*d] Σ_t f_e(t) over all tokens            (mu = sum_f_all / N) */
    double *sum_f_routed;   /* [E*d] Σ_{routed} f_e(t)                       (routed_mean)        */
    double *sum_f_routed_sq;/* [E*d] Σ_{routed} f_e(t)² per dimension        (routed_var)         */
    double *es_act_sum;     /* [E] Σ over closed samples of n_e(s)/L_s */
    double *es_mag_sum;     /* [E] Σ over closed samples of Σ_{routed in s} ‖f_e‖ / L_s */
    double *es_magg_sum;    /* [E] Σ over closed samples of Σ_{routed in s} g‖f_e‖ / L_s */
    /* the calibration sample currently open (tokens added since the last end_sample) */
    double *cur_n, *cur_f, *cur_gf; /* [E] n_e(s), Σ_{routed in s} ‖f_e‖, Σ_{routed in s} g‖f_e‖ */
    double cur_len;         /* L_s so far */
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
    int *window_lens;       /* NULL: every window is seq_len tokens; else document windows of these lengths */
    char window_choice[48]; /* how they were chosen: "first" or "seeded:<seed>" (splitmix64, calib.h) */
    char precision[8];      /* of the teacher's GEMMs during calibration: "fp32" or "bf16" */
    char *data_path;
} m2d_stats;

/* Allocate zeroed arrays for one layer (E experts, d hidden). */
void m2d_layer_stats_alloc(m2d_layer_stats *s, int layer, int E, int k, int d);
void m2d_layer_stats_free(m2d_layer_stats *s);

/* The reference accumulator (obviously correct, double precision, O(E²d) per token): one token t.
 *   p[E]     full softmax over all E router logits (fp32)
 *   topk[k]  the router's top-k set S(t) (distinct expert ids in [0, E))
 *   g[k]     native gate weight applied to topk[i] (renormalised or raw p, per the model)
 *   f[E*d]   outputs f_e(t) of ALL experts, row e at f + e*d (before any gate weight)
 * Everything but the router-logit Gram (m2d_layer_stats_add_logits). */
void m2d_layer_stats_add_token(m2d_layer_stats *s, const float *p, const int32_t *topk,
                               const float *g, const float *f);
/* The routed part of one token's update, for one (token, expert) pair of its top-k: expert E
 * with router probability P_E, native gate weight G, renormalised gate R (P_E / Σ_{top-k} p),
 * output f [d] of squared norm NORM2 (n, sum_p_sel, the gate/norm moment sums, the routed
 * per-dimension sums, the open sample's sums). The reference accumulator and calibration's fast
 * path both use it. */
void m2d_layer_stats_add_routed(m2d_layer_stats *s, int e, double p_e, double g, double r, const float *f,
                                double norm2);
/* Paper 004 Eq. 7 for one token: damage[j] += ‖y − y^(−j)‖ for every j in its top-k (see damage
 * above). Expert e's output is at F + e * STRIDE (d floats). Replacement: the expert with the
 * highest p outside the top-k (ties -> lower index); none when k = E. */
void m2d_layer_stats_add_damage(m2d_layer_stats *s, const float *p, const int32_t *topk, const float *F,
                                size_t stride);
/* The same from rows by rank: f_{topk[r]} at ROWS + r * STRIDE for r < k, and the replacement NX's
 * (m2d_layer_stats_next_expert) at ROWS + k * STRIDE (not read when NX is -1). */
void m2d_layer_stats_add_damage_rows(m2d_layer_stats *s, const float *p, const int32_t *topk, int nx, const float *rows,
                                     size_t stride);
/* That replacement: the expert with the highest P outside TOPK[K] (ties -> lower index), -1 when
 * every one of the E experts is routed. */
int m2d_layer_stats_next_expert(const float *p, const int32_t *topk, int k, int E);
/* logit_gram += z zᵀ for one token's router logits z[E] (double). */
void m2d_layer_stats_add_logits(m2d_layer_stats *s, const double *z);
/* Close the current calibration sample (ES-Act / ES-Mag average over samples of per-sample,
 * length-normalised sums). A sample with no tokens is ignored. */
void m2d_layer_stats_end_sample(m2d_layer_stats *s);
/* dst += src (same layer shape E, k, d; src must have no open sample). -1 + m2d_err on mismatch. */
int m2d_layer_stats_merge(m2d_layer_stats *dst, const m2d_layer_stats *src);
/* Recompute mu, routed_mean, routed_var, es_act, es_mag from the raw sums. Closes an open
 * sample first. Idempotent: more tokens or merges may follow, then finalize again. */
void m2d_layer_stats_finalize(m2d_layer_stats *s);
void m2d_stats_free(m2d_stats *s);
/* Tokens of the recorded windows: Σ window_lens, or n_windows × seq_len. */
double m2d_stats_window_tokens(const m2d_stats *s);

#endif
