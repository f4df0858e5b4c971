/* yardstick — what the benchmarks measure against, shared by them: the in-process GEMM peak of a
 * precision and the FLOPs of a forward pass and of a calibration run. */
#ifndef M2D_BENCH_YARDSTICK_H
#define M2D_BENCH_YARDSTICK_H

#include "engine/backend.h"
#include "model/model.h"

/* The GEMM module's rate on 2048³ (X fp32, W bf16 as stored, a pool of 2 threads) in precision P,
 * GFLOP/s: the yardstick of the engine's GEMMs in that precision (best of 5 after a warm-up). */
double yardstick_gemm_peak(m2d_precision p);

/* FLOPs of a forward over n tokens from position 0 (causal attention; the top-k experts of MoE
 * layers) and the LM head on SCORED rows, as the engine computes it: the last layer goes on past its
 * attention only for the scored rows. */
double yardstick_forward_flops(const m2d_config *c, int n, int scored);

/* FLOPs calibration needs for N_WINDOWS windows of L tokens (SPEC §1): the forward without its
 * top-k experts (subsumed: every expert runs on every token), the LM head on one row per window,
 * every expert on every token, the upper triangle of each token's expert-output Gram and the
 * router-logit Gram. */
double yardstick_calib_flops(const m2d_config *c, int n_windows, int L);

/* qsort's order of doubles, ascending (the benches' medians) */
int bench_cmp_double(const void *a, const void *b);

#endif
