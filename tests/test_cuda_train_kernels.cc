/* cuda_train_kernels: the kernels of the cuda backend's training ops
 * (harness/engine/cuda_train_kernels.cuh) run on the CPU in the emulation of tests/cuda_emu.h,
 * against float64 formulas, on every machine — with or without a GPU. What runs here is each
 * kernel's index arithmetic, masks (causal, window, sink, clamp boundaries), chunking and fixed
 * summation order; the ops around them (cuBLASLt GEMMs, the per-head sequence of attention's
 * backward) are tests/test_train_ops.c's on a GPU (tools/gpu_run.sh).
 *
 * Tolerances, u = 2^-24 (fp32 unit roundoff): a value computed in fp64 and rounded once to fp32
 * is within u of its magnitude; fp32 exponentials (expf of an argument rounded in fp32) are within
 * ~(2 + |argument|) u relative; a k-term fp32 fma chain within k u of the sum of |terms|. Each
 * check states the bound it uses. */
#include "cuda_emu.h"
#include "engine/cuda_train_kernels.cuh"

static const double U = 5.9604644775390625e-8; /* 2^-24 */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double uniform(void) { /* [0, 1) */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) * 0x1.0p-53;
}
static double normal(void) { /* Irwin-Hall: 12 uniforms, mean 0, variance 1 */
    double s = 0;
    for (int i = 0; i < 12; i++) s += uniform();
    return s - 6;
}
static std::vector<float> randn(size_t n, double sd = 1) {
    std::vector<float> v(n);
    for (float &x : v) x = (float)(normal() * sd);
    return v;
}

/* a kernel over N elements, TR_THREADS a block */
static void elementwise(int64_t n, std::function<void()> kernel) {
    run_grid((unsigned)((n + TR_THREADS - 1) / TR_THREADS), 1, 1, TR_THREADS, kernel);
}

/* ---- the GEMM fallback: cuBLAS's column-major semantics, all four operations ---- */

/* the operands of one case: A and B as given (fp32) or rounded by k_tr_round_bf16 (bf16; the
 * reference then reads the rounded values; the check ties each to its element's bf16_bits) */
template <typename T> struct gemm_operands;
template <> struct gemm_operands<float> {
    std::vector<float> a, b;
    gemm_operands(const std::vector<float> &A, const std::vector<float> &B, int) : a(A), b(B) {}
    const float *pa() const { return a.data(); }
    const float *pb() const { return b.data(); }
    double va(size_t i) const { return a[i]; }
    double vb(size_t i) const { return b[i]; }
};
template <> struct gemm_operands<__nv_bfloat16> {
    std::vector<__nv_bfloat16> a, b;
    static std::vector<__nv_bfloat16> rounded(const std::vector<float> &x, int ld) {
        int rows = (int)(x.size() / ld);
        std::vector<__nv_bfloat16> r(x.size());
        const float *xp = x.data();
        __nv_bfloat16 *rp = r.data();
        elementwise((int64_t)x.size(), [=] { k_tr_round_bf16(xp, ld, rows, ld, rp); });
        for (size_t i = 0; i < x.size(); i++)
            if (r[i].x != bf16_bits(x[i])) fail_msg("k_tr_round_bf16: element %zu: %04x, want %04x", i, r[i].x, bf16_bits(x[i]));
        return r;
    }
    gemm_operands(const std::vector<float> &A, const std::vector<float> &B, int ld) : a(rounded(A, ld)), b(rounded(B, ld)) {}
    const __nv_bfloat16 *pa() const { return a.data(); }
    const __nv_bfloat16 *pb() const { return b.data(); }
    double va(size_t i) const { return bf16_float(a[i].x); }
    double vb(size_t i) const { return bf16_float(b[i].x); }
};

template <typename T> static void gemm_matches_float64(const char *name) {
    const int m = 5, n = 7, k = 9, ld = 12;
    for (int ta = 0; ta <= 1; ta++)
        for (int tb = 0; tb <= 1; tb++)
            for (int kk = 0; kk <= k; kk += k) { /* k = 0: C = beta C */
                std::vector<float> A = randn((size_t)ld * 12), B = randn((size_t)ld * 12), C = randn((size_t)ld * n), C0 = C;
                gemm_operands<T> op(A, B, ld);
                const T *a = op.pa(), *b = op.pb();
                float *c = C.data();
                elementwise((int64_t)m * n, [=] { k_tr_gemm<T>(ta, tb, m, n, kk, 0.5f, a, ld, b, ld, 2.0f, c, ld); });
                for (int i = 0; i < m; i++)
                    for (int j = 0; j < n; j++) {
                        double s = 0, mag = 0;
                        for (int l = 0; l < kk; l++) {
                            double x = op.va(ta ? l + (size_t)i * ld : i + (size_t)l * ld);
                            double y = op.vb(tb ? j + (size_t)l * ld : l + (size_t)j * ld);
                            s += x * y, mag += fabs(x * y);
                        }
                        double want = 0.5 * s + 2.0 * C0[i + (size_t)j * ld];
                        /* k fma roundings of the sum, then three roundings of the epilogue (bf16
                         * products are exact in fp32, so the same bound holds for them) */
                        double tol = (kk + 4) * U * (0.5 * mag + 2.0 * fabs(C0[i + (size_t)j * ld])) + 1e-30;
                        if (!(fabs(C[i + (size_t)j * ld] - want) <= tol))
                            fail_msg("%s ta %d tb %d k %d: C[%d,%d] %.9g, want %.9g", name, ta, tb, kk, i, j,
                                     C[i + (size_t)j * ld], want);
                    }
            }
}

static void sgemm_matches_float64(void **state) {
    (void)state;
    gemm_matches_float64<float>("sgemm");
}

/* bf16 operands (the training GEMMs at --train-precision bf16): the rounding kernel gives
 * bf16_bits' patterns, and the product of the rounded values is summed as in fp32 */
static void bf16_gemm_matches_float64(void **state) {
    (void)state;
    gemm_matches_float64<__nv_bfloat16>("bf16 gemm");
    /* a window of a strided matrix: rows of LD elements, COLS < LD of them, compacted */
    const int rows = 3, cols = 5, ld = 8;
    std::vector<float> x = randn((size_t)rows * ld);
    std::vector<__nv_bfloat16> out((size_t)rows * cols);
    const float *xp = x.data();
    __nv_bfloat16 *op = out.data();
    elementwise((int64_t)rows * cols, [=] { k_tr_round_bf16(xp, ld, rows, cols, op); });
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) assert_int_equal(out[(size_t)r * cols + c].x, bf16_bits(x[(size_t)r * ld + c]));
}

/* the emulated rounding the kernels' checks rest on, on the values random data never meets: exact
 * halves (to the even neighbour), the carry into the exponent, overflow to infinity, signed zero,
 * subnormals, infinities and NaN (0x7fff, cuda_bf16.hpp's canonical NaN) — each expected bit
 * pattern worked out by hand from the fp32 bits */
static void bf16_rounding_special_values(void **state) {
    (void)state;
    static const struct { uint32_t f; uint16_t want; } cases[] = {
        {0x3f808000u, 0x3f80u}, /* 1 + 2^-8: halfway between 1 and 1 + 2^-7, to the even 1 */
        {0x3f818000u, 0x3f82u}, /* 1 + 3 * 2^-8: halfway, to the even 1 + 2^-6 */
        {0x3f808001u, 0x3f81u}, /* just above halfway: up */
        {0x3f807fffu, 0x3f80u}, /* just below: down */
        {0x3fff8000u, 0x4000u}, /* halfway at the top of the binade: the carry makes 2 */
        {0x7f7fffffu, 0x7f80u}, /* FLT_MAX rounds to infinity */
        {0x80000000u, 0x8000u}, /* -0 */
        {0x00010000u, 0x0001u}, /* a subnormal, exact */
        {0x00008000u, 0x0000u}, /* a subnormal halfway to zero: the even 0 */
        {0xff800000u, 0xff80u}, /* -infinity */
        {0x7fc00001u, 0x7fffu}, /* a quiet NaN with a payload */
        {0xff800001u, 0x7fffu}, /* a negative signalling NaN */
    };
    std::vector<float> x(sizeof cases / sizeof cases[0]);
    for (size_t i = 0; i < x.size(); i++) x[i] = __uint_as_float(cases[i].f);
    std::vector<__nv_bfloat16> r(x.size());
    const float *xp = x.data();
    __nv_bfloat16 *rp = r.data();
    int n = (int)x.size();
    elementwise(n, [=] { k_tr_round_bf16(xp, n, 1, n, rp); });
    for (size_t i = 0; i < x.size(); i++)
        if (r[i].x != cases[i].want) fail_msg("bf16 of %08x: %04x, want %04x", cases[i].f, r[i].x, cases[i].want);
}

/* ---- RMSNorm's backward: rows (fp64 sums), dw by chunks of rows, dx, in place ---- */
static void rmsnorm_bwd_matches_float64(void **state) {
    (void)state;
    const int R = 150, D = 45, ld = 48; /* three chunks of TR_ROW_CHUNK rows */
    const double eps = 1e-6;
    std::vector<float> x = randn((size_t)R * ld), w = randn(D), dy = randn((size_t)R * ld), dx((size_t)R * ld, NAN);
    std::vector<float> dw = randn(D), dw0 = dw;
    std::vector<double> rr(R), cc(R), part((size_t)3 * D);
    const float *xp = x.data(), *wp = w.data(), *dyp = dy.data();
    float *dxp = dx.data(), *dwp = dw.data();
    double *rrp = rr.data(), *ccp = cc.data(), *pp = part.data();
    run_grid(R, 1, 1, 64, [=] { k_rms_bwd_rows(xp, ld, wp, dyp, ld, D, eps, rrp, ccp); });
    run_grid(3, 1, 1, TR_THREADS, [=] { k_tr_col_part(dyp, ld, xp, ld, rrp, R, D, pp); });
    elementwise((int64_t)R * D, [=] { k_rms_bwd_dx(xp, ld, wp, dyp, ld, rrp, ccp, R, D, dxp, ld, 0.0f); });
    run_grid(1, 1, 1, TR_THREADS, [=] { k_tr_col_finish(pp, 3, D, dwp); });
    std::vector<double> gw(D, 0.0);
    for (int r = 0; r < R; r++) {
        const float *xr = &x[(size_t)r * ld], *g = &dy[(size_t)r * ld];
        double ss = 0, dot = 0;
        for (int i = 0; i < D; i++) ss += (double)xr[i] * xr[i], dot += (double)g[i] * w[i] * xr[i];
        double inv = 1 / sqrt(ss / D + eps), c = dot * inv * inv * inv / D;
        for (int i = 0; i < D; i++) {
            double want = inv * w[i] * g[i] - c * xr[i];
            /* fp64 throughout, one rounding to fp32: u of the terms' magnitude */
            double tol = 2 * U * (fabs(inv * w[i] * g[i]) + fabs(c * xr[i])) + 1e-30;
            if (!(fabs(dx[(size_t)r * ld + i] - want) <= tol)) fail_msg("rmsnorm dx[%d,%d]", r, i);
            gw[i] += (double)g[i] * xr[i] * inv;
        }
    }
    for (int i = 0; i < D; i++) /* one rounding of the fp64 sum, one fp32 add */
        assert_true(fabs(dw[i] - (dw0[i] + gw[i])) <= 2 * U * (fabs(dw0[i]) + fabs(gw[i])) + 1e-30);
    /* in place (dx = dy, beta 0), the column sums taken first, as tr_rmsnorm_bwd orders them: the
     * same bits */
    std::vector<float> in = dy;
    float *ip = in.data();
    elementwise((int64_t)R * D, [=] { k_rms_bwd_dx(xp, ld, wp, ip, ld, rrp, ccp, R, D, ip, ld, 0.0f); });
    for (int r = 0; r < R; r++) assert_memory_equal(&in[(size_t)r * ld], &dx[(size_t)r * ld], sizeof(float) * D);
    /* beta 1 adds to what dx held */
    std::vector<float> acc = randn((size_t)R * ld), acc0 = acc;
    float *ap = acc.data();
    elementwise((int64_t)R * D, [=] { k_rms_bwd_dx(xp, ld, wp, dyp, ld, rrp, ccp, R, D, ap, ld, 1.0f); });
    for (int i = 0; i < D; i++) assert_true(fabsf(acc[i] - (acc0[i] + dx[i])) <= (float)U * (fabsf(acc0[i]) + fabsf(dx[i])));
}

/* ---- attention's backward, one head: the masked softmax with a sink, dS, dL/d sink ---- */
static void attention_pieces_match_float64(void **state) {
    (void)state;
    const int n = 37, hd = 40, ldo = 44;
    for (int window = 0; window <= 5; window += 5)
        for (int with_sink = 0; with_sink <= 1; with_sink++) {
            std::vector<float> S = randn((size_t)n * n, 2), P = S, psink(n, NAN), dP = randn((size_t)n * n), dS = dP;
            std::vector<float> o = randn((size_t)n * ldo), dout = randn((size_t)n * ldo);
            std::vector<double> term(n, 0.0);
            float sink = 0.7f, dsink = 0.25f, *Pp = P.data(), *psp = psink.data(), *dSp = dS.data(), *dsk = &dsink;
            const float *sp = with_sink ? &sink : NULL, *op = o.data(), *dop = dout.data();
            double *tp = term.data();
            run_grid(n, 1, 1, 64, [=] { k_attn_bwd_softmax(Pp, n, window, sp, psp); });
            run_grid(n, 1, 1, 64, [=] { k_attn_bwd_ds(Pp, dSp, n, op, ldo, dop, ldo, hd, with_sink ? psp : NULL, tp); });
            run_grid(1, 1, 1, 32, [=] { k_attn_bwd_dsink(tp, n, dsk); });
            double want_dsink = 0;
            for (int i = 0; i < n; i++) {
                int lo = window ? std::max(0, i + 1 - window) : 0;
                double m = with_sink ? sink : -INFINITY, z = 0, D = 0;
                for (int t = lo; t <= i; t++) m = std::max(m, (double)S[(size_t)i * n + t]);
                for (int t = lo; t <= i; t++) z += exp(S[(size_t)i * n + t] - m);
                double zs = with_sink ? exp(sink - m) : 0;
                z += zs;
                for (int c = 0; c < hd; c++) D += (double)o[(size_t)i * ldo + c] * dout[(size_t)i * ldo + c];
                for (int t = 0; t < n; t++) {
                    bool seen = t >= lo && t <= i;
                    double p = seen ? exp(S[(size_t)i * n + t] - m) / z : 0;
                    float got = P[(size_t)i * n + t];
                    /* fp32 exponentials of arguments |s - m| <= ~20: relative (2 + 20 + 4) u */
                    if (!(fabs(got - p) <= 26 * U * p) || (!seen && got != 0.0f))
                        fail_msg("window %d sink %d: P[%d,%d] %.9g, want %.9g", window, with_sink, i, t, got, p);
                    /* dS = P (dP - D) with the kernel's P: the subtraction and product rounded in fp32, D once */
                    double ds = got == 0.0f ? 0 : got * ((double)dP[(size_t)i * n + t] - D);
                    double tol = 3 * U * fabs(got) * (fabs(dP[(size_t)i * n + t]) + fabs(D));
                    if (!(fabs(dS[(size_t)i * n + t] - ds) <= tol + 1e-30)) fail_msg("dS[%d,%d]", i, t);
                }
                if (with_sink) {
                    assert_true(fabs(psink[i] - zs / z) <= 26 * U * zs / z);
                    want_dsink -= zs / z * D;
                } else {
                    assert_true(psink[i] == 0.0f);
                }
            }
            if (with_sink) { /* the sink probabilities within 26 u, D's sums exact to fp64: that much of the sum's magnitude */
                double mag = 0;
                for (int i = 0; i < n; i++) mag += fabs(tp[i]);
                assert_true(fabs(dsink - (0.25 + want_dsink)) <= 30 * U * (mag + 0.25));
            } else {
                assert_true(dsink == 0.25f); /* no terms: nothing added */
            }
        }
}

/* ---- SwiGLU (plain and clamped), clamp: float64 formulas, the clamp boundaries pass ---- */
static void glu_and_clamp_match_float64(void **state) {
    (void)state;
    const int R = 9, C = 31, ld = 33;
    const float alpha = 1.702f, limit = 1.5f;
    std::vector<float> g = randn((size_t)R * ld, 2), u = randn((size_t)R * ld, 2), dh = randn((size_t)R * ld);
    g[3] = limit, u[4] = -limit, u[5] = limit, g[6] = limit + 1e-6f, u[7] = -limit - 1e-6f; /* boundaries */
    for (int clamp = 0; clamp <= 1; clamp++) {
        std::vector<float> dg = dh, du((size_t)R * ld, NAN);
        const float *gp = g.data(), *up = u.data();
        float *dgp = dg.data(), *dup = du.data();
        if (clamp) elementwise(R * C, [=] { k_glu_clamp_bwd(gp, ld, up, ld, R, C, alpha, limit, dgp, ld, dup, ld); });
        else elementwise(R * C, [=] { k_glu_bwd(gp, ld, up, ld, R, C, dgp, ld, dup, ld); });
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++) {
                size_t i = (size_t)r * ld + c;
                double G = g[i], Uv = u[i], H = dh[i], a = clamp ? alpha : 1.0;
                double gc = clamp ? std::min(G, (double)limit) : G, uc = clamp ? std::min(std::max(Uv, -(double)limit), (double)limit) + 1 : Uv;
                double s = 1 / (1 + exp(-a * gc));
                double want_du = clamp && (Uv < -limit || Uv > limit) ? 0 : H * gc * s;
                double want_dg = clamp && G > limit ? 0 : H * uc * s * (1 + a * gc * (1 - s));
                /* ~10 fp32 roundings and one expf (argument |a g| <= ~12): 30 u of the factors' magnitude */
                double mg = fabs(H) * fabs(uc) * (1 + fabs(a * gc)), mu = fabs(H * gc);
                if (!(fabs(dg[i] - want_dg) <= 30 * U * mg + 1e-30) || !(fabs(du[i] - want_du) <= 30 * U * mu + 1e-30))
                    fail_msg("%s [%d,%d]: dg %.9g want %.9g, du %.9g want %.9g", clamp ? "glu_clamp" : "glu", r, c, dg[i],
                             want_dg, du[i], want_du);
            }
    }
    std::vector<float> dy = dh;
    const float *gp = g.data();
    float *dyp = dy.data();
    elementwise(R * C, [=] { k_clamp_bwd(gp, ld, R, C, limit, dyp, ld); });
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            size_t i = (size_t)r * ld + c;
            float want = g[i] >= -limit && g[i] <= limit ? dh[i] : 0.0f;
            assert_memory_equal(&dy[i], &want, sizeof want); /* passed through or zeroed: exact */
        }
}

/* ---- column sums (bias), head sums, the embedding's scatter-add ---- */
static void sums_match_float64(void **state) {
    (void)state;
    const int R = 150, C = 300, ld = 301, chunks = 3; /* chunks on x, two blocks of columns on y */
    std::vector<float> dy = randn((size_t)R * ld), db = randn(C), db0 = db;
    std::vector<double> part((size_t)chunks * C);
    const float *dyp = dy.data();
    float *dbp = db.data();
    double *pp = part.data();
    run_grid(chunks, 2, 1, TR_THREADS, [=] { k_tr_col_part(dyp, ld, NULL, 0, NULL, R, C, pp); });
    run_grid(2, 1, 1, TR_THREADS, [=] { k_tr_col_finish(pp, chunks, C, dbp); });
    for (int c = 0; c < C; c++) {
        double s = 0;
        for (int r = 0; r < R; r++) s += dy[(size_t)r * ld + c];
        assert_true(fabs(db[c] - (db0[c] + s)) <= 2 * U * (fabs(db0[c]) + fabs(s))); /* fp64 sum rounded, one add */
    }
    const int H = 6, S = 8, OFF = 5, W = 3, rows = 70;
    std::vector<float> x = randn((size_t)rows * H * S), y0 = randn((size_t)rows * W);
    for (int beta = 0; beta <= 1; beta++) {
        std::vector<float> y = beta ? y0 : std::vector<float>((size_t)rows * W, NAN);
        const float *xp = x.data() + OFF;
        float *yp = y.data();
        elementwise(rows * W, [=] { k_head_sum(xp, H * S, H, S, rows, W, yp, W, (float)beta); });
        for (int r = 0; r < rows; r++)
            for (int j = 0; j < W; j++) {
                double s = 0;
                for (int h = 0; h < H; h++) s += x[(size_t)r * H * S + OFF + (size_t)h * S + j];
                double want = s + (beta ? y0[(size_t)r * W + j] : 0);
                assert_true(fabs(y[(size_t)r * W + j] - want) <= 2 * U * (fabs(s) + fabs(want)) + 1e-30);
            }
    }
    enum { V = 7, D = 5, N = 9 };
    int32_t tok[N] = {3, 0, 3, 6, 1, 3, 0, 2, 6};
    std::vector<float> dx = randn((size_t)N * D), table = randn((size_t)V * D), want = table;
    for (int i = 0; i < N; i++)
        for (int c = 0; c < D; c++) want[(size_t)tok[i] * D + c] += dx[(size_t)i * D + c];
    const int32_t *tp = tok;
    const float *dxp = dx.data();
    float *tbp = table.data();
    run_grid(1, 1, 1, 32, [=] { k_embed_bwd(tp, N, dxp, D, D, V, tbp, D); });
    /* the same fp32 adds in row order: identical */
    assert_memory_equal(table.data(), want.data(), sizeof(float) * table.size());
}

/* ---- distillation losses and MSE ---- */
static void losses_match_float64(void **state) {
    (void)state;
    const int rows = 3, V = 1000, ld = 1003;
    const double scale = 0.5;
    std::vector<float> zt = randn((size_t)rows * ld, 3), zs0 = randn((size_t)rows * ld, 3);
    for (int reverse = 0; reverse <= 1; reverse++) {
        std::vector<float> zs = zs0;
        std::vector<double> loss(rows, NAN);
        const float *tp = zt.data();
        float *sp = zs.data();
        double *lp = loss.data();
        run_grid(rows, 1, 1, TR_THREADS, [=] { k_kd_rows(reverse, tp, ld, sp, ld, V, scale, lp); });
        for (int r = 0; r < rows; r++) {
            const float *a = &zt[(size_t)r * ld], *b = &zs0[(size_t)r * ld];
            double ma = -INFINITY, mb = -INFINITY, sa = 0, sb = 0, L = 0;
            for (int j = 0; j < V; j++) ma = std::max(ma, (double)a[j]), mb = std::max(mb, (double)b[j]);
            for (int j = 0; j < V; j++) sa += exp(a[j] - ma), sb += exp(b[j] - mb);
            std::vector<double> pt(V), ps(V);
            for (int j = 0; j < V; j++) pt[j] = exp(a[j] - ma) / sa, ps[j] = exp(b[j] - mb) / sb;
            for (int j = 0; j < V; j++) L += reverse ? ps[j] * log(ps[j] / pt[j]) : pt[j] * log(pt[j] / ps[j]);
            /* fp32 exponentials of arguments up to ~25 (z of sd 3): ~30 u relative in each p; the
             * loss, a sum of p (log difference) terms: that much of the sum of |terms| */
            double mag = 0;
            for (int j = 0; j < V; j++) mag += reverse ? fabs(ps[j] * log(ps[j] / pt[j])) : fabs(pt[j] * log(pt[j] / ps[j]));
            if (!(fabs(loss[r] - L) <= 60 * U * mag)) fail_msg("kd %d row %d: loss %.12g, want %.12g", reverse, r, loss[r], L);
            for (int j = 0; j < V; j++) {
                double lr = log(ps[j] / pt[j]);
                double g = reverse ? ps[j] * (lr - L) : ps[j] - pt[j];
                double tol = reverse ? 60 * U * ps[j] * (fabs(lr) + fabs(L) + 1) : 30 * U * (ps[j] + pt[j]);
                if (!(fabs(zs[(size_t)r * ld + j] - scale * g) <= scale * tol + 1e-30))
                    fail_msg("kd %d row %d: dzs[%d] %.9g, want %.9g", reverse, r, j, zs[(size_t)r * ld + j], scale * g);
            }
        }
    }
    const int C = 300;
    std::vector<float> a = randn((size_t)rows * C), b = randn((size_t)rows * C), da = randn((size_t)rows * C), da0 = da;
    std::vector<double> loss(rows);
    const float *ap = a.data(), *bp = b.data();
    float *dp = da.data();
    double *lp = loss.data();
    run_grid(rows, 1, 1, 64, [=] { k_mse_rows(ap, C, bp, C, C, scale, dp, C, lp); });
    for (int r = 0; r < rows; r++) {
        double s = 0;
        for (int j = 0; j < C; j++) {
            double d = (double)a[(size_t)r * C + j] - b[(size_t)r * C + j];
            s += d * d;
            float want = da0[(size_t)r * C + j] + (float)(scale * 2 * d); /* the exact fp64 difference, rounded, one add */
            assert_memory_equal(&da[(size_t)r * C + j], &want, sizeof want);
        }
        assert_true(fabs(loss[r] - s) <= 1e-13 * s); /* fp64 sums of 300 terms in two orders */
    }
}

/* ---- the gradient norm's sum of squares (fixed chunks) and AdamW ---- */
static void sumsq_and_adamw_match_float64(void **state) {
    (void)state;
    const int64_t n = 2 * (int64_t)TR_SUM_CHUNK + 1000; /* three chunks, the last partial */
    std::vector<float> x = randn((size_t)n);
    std::vector<double> part(3), out(1, NAN);
    const float *xp = x.data();
    double *pp = part.data(), *op = out.data();
    run_grid(3, 1, 1, TR_THREADS, [=] { k_sumsq_part(xp, n, pp); });
    run_grid(1, 1, 1, 32, [=] { k_sum_parts(pp, 3, op); });
    double want = 0;
    for (float v : x) want += (double)v * v;
    assert_true(fabs(out[0] - want) <= 1e-12 * want); /* fp64 sums of 1.3e5 terms in two orders */

    const int N = 1000;
    std::vector<float> p = randn(N), g = randn(N), m(N, 0.0f), v(N, 0.0f);
    std::vector<double> P(p.begin(), p.end()), M(N, 0.0), Vv(N, 0.0);
    double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
    for (int step = 1; step <= 3; step++) {
        double bc1 = 1 - pow(b1, step), bc2 = 1 - pow(b2, step);
        adamw_dev a = {(float)(1 - lr * wd), (float)(1 - b1), (float)b2, (float)(1 - b2), (float)sqrt(bc2), (float)eps,
                       (float)(lr / bc1), 0.5f};
        float *pf = p.data(), *mf = m.data(), *vf = v.data();
        const float *gf = g.data();
        elementwise(N, [=] { k_adamw(pf, gf, mf, vf, N, a); });
        for (int i = 0; i < N; i++) {
            double gi = 0.5 * g[i];
            P[i] *= 1 - lr * wd;
            M[i] = b1 * M[i] + (1 - b1) * gi;
            Vv[i] = b2 * Vv[i] + (1 - b2) * gi * gi;
            P[i] -= lr / bc1 * M[i] / (sqrt(Vv[i]) / sqrt(bc2) + eps);
        }
    }
    /* ~10 fp32 roundings a step, three steps, on values of magnitude ~1: 1e-6 relative (test_train_ops' bound) */
    for (int i = 0; i < N; i++) assert_true(fabs(p[i] - P[i]) < 1e-6 * fmax(1, fabs(P[i])));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sgemm_matches_float64),
        cmocka_unit_test(bf16_gemm_matches_float64),
        cmocka_unit_test(bf16_rounding_special_values),
        cmocka_unit_test(rmsnorm_bwd_matches_float64),
        cmocka_unit_test(attention_pieces_match_float64),
        cmocka_unit_test(glu_and_clamp_match_float64),
        cmocka_unit_test(sums_match_float64),
        cmocka_unit_test(losses_match_float64),
        cmocka_unit_test(sumsq_and_adamw_match_float64),
    };
    return cmocka_run_group_tests(tests, emu_setup, emu_teardown);
}
