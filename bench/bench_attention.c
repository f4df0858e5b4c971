/* bench_attention — the CPU backend's attention op alone, at Qwen3-30B-A3B's attention shape (32
 * query heads, 4 kv heads, head_dim 128), 2 threads: the GEMM formulation (causal row blocks
 * through the GEMM module, fp32 and with bf16 operands: m2d_attn_args.prec) and the per-row dot
 * products (attn_item, fp32; not timed from 2,048 rows, where it takes seconds), for segments of
 * NQ rows after a cached prefix of NP rows. Prints ms per call (best of REPS) and GFLOP/s counting the causal
 * FLOPs only (4·heads·hd per (query, visible key) pair).
 * Usage: bench_attention [NQ NP REPS] (default: a table of prompt, long-prompt and extend shapes). */
#include <stdio.h>
#include <stdlib.h>

#include "engine/backend.h"
#include "base/util.h"

enum { H = 32, KV = 4, HD = 128 };

static float *filled(size_t n, uint64_t seed) {
    float *x = m2d_malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((seed >> 40) % 2001) / 1000.0f - 1.0f;
    }
    return x;
}

static m2d_buf *upload(m2d_backend *be, const float *x, size_t n) {
    m2d_buf *b = be->ops->alloc(be, sizeof(float) * n);
    be->ops->upload(be, b, 0, x, sizeof(float) * n);
    return b;
}

/* best time of REPS calls (after one warm-up) with segments of at least MIN_ROWS on the GEMM path */
static double time_attention(m2d_backend *be, int nq, int np, int reps, int min_rows, m2d_precision prec) {
    size_t nqe = (size_t)nq * H * HD, nke = (size_t)nq * KV * HD, npe = (size_t)KV * (np ? np : 1) * HD;
    float *q = filled(nqe, 1), *k = filled(nke, 2), *v = filled(nke, 3), *kp = filled(npe, 4), *vp = filled(npe, 5);
    m2d_buf *Q = upload(be, q, nqe), *K = upload(be, k, nke), *V = upload(be, v, nke), *O = upload(be, q, nqe);
    m2d_buf *KP = upload(be, kp, npe), *VP = upload(be, vp, npe);
    m2d_attn_args a = {.q = m2d_mat_of(Q, 0, nq, H * HD, H * HD), .k = m2d_mat_of(K, 0, nq, KV * HD, KV * HD),
                       .v = m2d_mat_of(V, 0, nq, KV * HD, KV * HD), .k_cache = np ? KP : NULL,
                       .v_cache = np ? VP : NULL, .head_stride = (size_t)np * HD, .np = np, .n_heads = H,
                       .n_kv = KV, .head_dim = HD, .out = m2d_mat_of(O, 0, nq, H * HD, H * HD), .prec = prec};
    be->ops->tune(be, "attention_gemm_min_rows", min_rows);
    double best = 1e30;
    for (int r = 0; r <= reps; r++) {
        double t0 = m2d_now();
        be->ops->attention(be, &a);
        double t = m2d_now() - t0;
        if (r && t < best) best = t;
    }
    m2d_buf *all[] = {Q, K, V, O, KP, VP};
    for (int i = 0; i < 6; i++) be->ops->release(be, all[i]);
    free(q), free(k), free(v), free(kp), free(vp);
    return best;
}

static void row(m2d_backend *be, int nq, int np, int reps) {
    double fl = 4.0 * H * HD * ((double)nq * np + (double)nq * (nq + 1) / 2);
    double tg = time_attention(be, nq, np, reps, 1, M2D_PREC_FP32);
    double tb = time_attention(be, nq, np, reps, 1, M2D_PREC_BF16);
    printf("| %5d | %5d | %9.3f | %7.1f | %9.3f | %7.1f | %5.2fx |", nq, np, tg * 1e3, fl / tg / 1e9, tb * 1e3,
           fl / tb / 1e9, tg / tb);
    if (nq >= 2048) {
        printf(" — | — | — |\n");
        return;
    }
    double td = time_attention(be, nq, np, reps, 1 << 30, M2D_PREC_FP32);
    printf(" %9.3f | %7.1f | %5.2fx |\n", td * 1e3, fl / td / 1e9, td / tg);
}

int main(int argc, char **argv) {
    m2d_backend_opts o = {.n_threads = 2};
    m2d_backend *be;
    if (m2d_backend_new("cpu", &o, &be)) {
        fprintf(stderr, "bench_attention: %s\n", m2d_errmsg());
        return 1;
    }
    be->ops->enter(be);
    printf("attention op, %d x %d heads (%d kv heads), 2 threads; GFLOP/s of the causal FLOPs\n", H, HD, KV);
    printf("|    nq |    np | GEMM fp32 (ms) | GFLOP/s | GEMM bf16 (ms) | GFLOP/s | bf16 speed-up | dots fp32 (ms) "
           "| GFLOP/s | GEMM speed-up |\n");
    printf("|------:|------:|---------:|--------:|---------:|--------:|------:|---------:|--------:|------:|\n");
    if (argc > 1) {
        row(be, atoi(argv[1]), argc > 2 ? atoi(argv[2]) : 0, argc > 3 ? atoi(argv[3]) : 5);
    } else {
        int shapes[][3] = {{512, 0, 10}, {1024, 0, 3}, {2048, 0, 3}, {64, 512, 10}, {8, 512, 20}};
        for (int i = 0; i < 5; i++) row(be, shapes[i][0], shapes[i][1], shapes[i][2]);
    }
    int rc = be->ops->leave(be);
    if (rc) fprintf(stderr, "bench_attention: %s\n", m2d_errmsg());
    m2d_backend_free(be);
    return rc ? 1 : 0;
}
