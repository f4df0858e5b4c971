/* cuda_kernels: kernels of the cuda backend (harness/engine/cuda_kernels.cuh: the tensor-core
 * attention k_attention_tc and k_attention_h16, the MoE's grouped GEMMs k_gx, calibration's Gram
 * (FMA tiles and fp64 MMA) and reductions) run on the
 * CPU, against float64 loops, on every machine — with or without a GPU.
 *
 * The kernel's own source is compiled here as C++ with M2D_CUDA_EMULATED: a block's 128 threads run
 * as coroutines (ucontext), __syncthreads waits for all of them, and the warp collectives —
 * __syncwarp, __shfl_xor_sync, mma.sync.m16n8k8 TF32 and m16n8k16 FP16 and BF16 — wait for the warp's 32
 * lanes, then act on their registers as the PTX ISA defines them (m16n8k16's layouts at
 * k_attention_h16; fp16 rounding to nearest even, checked against the compiler's _Float16;
 * cp.async as an immediate copy, its zero fill too): fragment layouts of mma.m16n8k8 .tf32 (A: a0 (g, c),
 * a1 (g + 8, c), a2 (g, c + 4), a3 (g + 8, c + 4); B: b0 (k = c, n = g), b1 (k = c + 4, n = g); C/D:
 * (g, 2c), (g, 2c + 1), (g + 8, 2c), (g + 8, 2c + 1); g = lane / 4, c = lane % 4), operands that must
 * be TF32 (low 13 bits zero: the kernel rounds every one, tf32_rna, itself checked against float64
 * rounding here), products exact in fp32 and summed in fp32; and mma.sync.m8n8k4 f64 for the
 * Gram. So what runs here is the kernel's index arithmetic, masks (causal, window, prefix), sinks, online softmax and 3xTF32 split;
 * what only a GPU can check (tensor cores' own summation order, the real layouts, timing) is
 * test_engine's on the cuda backend (tools/gpu_run.sh).
 *
 * Tolerance 1e-5 on outputs of N(0,1) inputs, as test_engine's attention cases (derived there:
 * fp32 scores of hd-term dots, convex combinations of values); the 3xTF32 split leaves ~2^-22 of
 * each product, within that; one product per term (1xTF32) would be ~1e-3 off and fails. */
#include "cuda_emu.h"
#include "attn_ref.h"
#include "engine/cuda_kernels.cuh"

/* KERNEL<HD> (HD 32, 64 or 128 for a.hd) over a grid of GX x GY blocks of TC_WARPS warps */
template <template <int> class K>
static void launch_kernel(const attn_dev &a, unsigned gx, unsigned gy) {
    if (a.hd <= 32) run_grid(gx, gy, 1, TC_WARPS * 32, [a] { K<32>::run(a); });
    else if (a.hd <= 64) run_grid(gx, gy, 1, TC_WARPS * 32, [a] { K<64>::run(a); });
    else run_grid(gx, gy, 1, TC_WARPS * 32, [a] { K<128>::run(a); });
}

/* an attention kernel over the query rows (ROWS a block) and heads */
template <template <int> class K>
static void launch_rows(const attn_dev &a, int rows) {
    launch_kernel<K>(a, (unsigned)((a.nq + rows - 1) / rows), (unsigned)a.n_heads);
}
template <int HD> struct tc_kernel { static void run(attn_dev a) { k_attention_tc<HD>(a); } };
template <int HD> struct prep_kernel { static void run(attn_dev a) { k_h16_prep<HD>(a); } };
template <int HD> struct h16_kernel { static void run(attn_dev a) { k_attention_h16<HD>(a); } };
template <int HD> struct b16_prep_kernel { static void run(attn_dev a) { k_b16_prep<HD>(a); } };
template <int HD> struct b16_kernel { static void run(attn_dev a) { k_attention_b16<HD>(a); } };

/* attention as attention_tc in backend_cuda.cu launches it: attn_kernel 2, k_attention_tc; 3,
 * the heads' maxima and the tiles, then k_attention_h16 and
 * k_attention_tc (each skipping the other's heads); 4 (bf16 operands, attention_b16): the bf16
 * tiles, then k_attention_b16 */
static void launch(attn_dev a, int kernel) {
    static_assert(sizeof(tc_smem<128>) <= sizeof tc_raw && sizeof(h16_smem<128>) <= sizeof tc_raw &&
                      sizeof(b16_smem<128>) <= sizeof tc_raw, "shared memory");
    std::vector<uint32_t> mx((size_t)(a.n_heads + 2 * a.n_kv), 0u);
    int tiles = (a.np + a.nq + TC_KEYS - 1) / TC_KEYS;
    std::vector<h16_tile<128>> kv((size_t)tiles * a.n_kv); /* the largest tile: room for any HD */
    if (kernel == 4) {
        a.h16_tiles = kv.data(), a.h16_ntiles = tiles;
        launch_kernel<b16_prep_kernel>(a, (unsigned)tiles, (unsigned)a.n_kv);
        launch_rows<b16_kernel>(a, H16_ROWS_BLK);
        return;
    }
    if (kernel == 3) {
        uint32_t *mp = mx.data();
        run_grid((unsigned)((a.np + a.nq + H16_ROWS - 1) / H16_ROWS), (unsigned)mx.size(), 1, 256, [a, mp] { k_h16_absmax(a, mp); });
        a.absmax = mp, a.h16_tiles = kv.data(), a.h16_ntiles = tiles;
        launch_kernel<prep_kernel>(a, (unsigned)tiles, (unsigned)a.n_kv);
        launch_rows<h16_kernel>(a, H16_ROWS_BLK);
    }
    launch_rows<tc_kernel>(a, TC_ROWS);
}

/* ---- the reference and the cases ---- */

static uint64_t rng = 88172645463325252ull;
static double normal(void) { /* Irwin-Hall: 12 uniforms, mean 0, variance 1 */
    double u = 0;
    for (int i = 0; i < 12; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        u += (double)(rng >> 11) / 9007199254740992.0;
    }
    return u - 6;
}

typedef struct {
    int H, KV, hd, np, nq, window, sinks, prefix;
    float scale;  /* 0: 1/sqrt(hd) */
    int qk_exp;   /* q times 2^qk_exp, k times 2^-qk_exp: the same scores */
    int v_exp[2]; /* kv head g's values times 2^v_exp[g] (its outputs too) */
} attn_case;

/* One case's inputs: q [nq][H hd], k and v [np + nq][KV hd] of N(0,1) values (q times 2^qk_exp, k
 * times 2^-qk_exp, kv head g's values times 2^v_exp[g]), the prefix as a cache ([KV][np][hd], the
 * m2d_kv layout), and the kernels' argument block over them (the whole sequence as one segment
 * without c.prefix) */
struct attn_data {
    std::vector<float> q, k, v, kp, vp, o;
    float sinks[4] = {1.0f, -2.0f, 3.0f, 0.0f};
    float scale;
    attn_dev a;
};

static void case_data(const attn_case &c, attn_data &d) {
    int T_ = c.np + c.nq;
    d.q.resize((size_t)c.nq * c.H * c.hd), d.k.resize((size_t)T_ * c.KV * c.hd), d.v.resize(d.k.size());
    d.o.assign(d.q.size(), NAN), d.kp.resize((size_t)c.KV * c.np * c.hd + 1), d.vp.resize(d.kp.size());
    for (float &x : d.q) x = (float)normal();
    for (float &x : d.k) x = (float)normal();
    for (float &x : d.v) x = (float)normal();
    for (float &x : d.q) x = ldexpf(x, c.qk_exp);
    for (float &x : d.k) x = ldexpf(x, -c.qk_exp);
    for (size_t i = 0; i < d.v.size(); i++) d.v[i] = ldexpf(d.v[i], c.v_exp[std::min(1, (int)(i / c.hd % c.KV))]);
    for (int g = 0; g < c.KV; g++)
        for (int t = 0; t < c.np; t++)
            for (int j = 0; j < c.hd; j++) {
                d.kp[((size_t)g * c.np + t) * c.hd + j] = d.k[(size_t)t * c.KV * c.hd + g * c.hd + j];
                d.vp[((size_t)g * c.np + t) * c.hd + j] = d.v[(size_t)t * c.KV * c.hd + g * c.hd + j];
            }
    d.scale = c.scale != 0 ? c.scale : 1.0f / sqrtf((float)c.hd);
    const float *ks = d.k.data() + (size_t)c.np * c.KV * c.hd, *vs = d.v.data() + (size_t)c.np * c.KV * c.hd;
    d.a = {d.q.data(), ks, vs, c.prefix ? d.kp.data() : NULL, c.prefix ? d.vp.data() : NULL, c.H * c.hd, c.KV * c.hd,
           c.KV * c.hd, c.nq, c.prefix ? c.np : 0, c.H, c.KV, c.hd, c.H * c.hd, (size_t)c.np * c.hd, d.o.data(),
           c.window, c.sinks ? d.sinks : NULL, d.scale, 0, NULL, NULL, 0};
    /* as cu_attention: float4 staging where hd % 4 == 0 and every row start is 16-byte aligned */
    const float *rows[4] = {d.a.ks, d.a.vs, d.a.kp, d.a.vp};
    d.a.vec = c.hd % 4 == 0 && d.a.ldk % 4 == 0 && d.a.ldv % 4 == 0 && d.a.head_stride % 4 == 0;
    for (int i = 0; i < 4; i++) d.a.vec = d.a.vec && (uintptr_t)rows[i] % 16 == 0;
}

/* the float64 reference of a case (ROUND_P: attention_f64_p's bf16 numerators) on Q, K, V */
static void case_reference(const attn_case &c, const attn_data &d, const float *q, const float *k, const float *v,
                           int round_p, float *r) {
    size_t seg = (size_t)c.np * c.KV * c.hd; /* without the prefix: the segment alone */
    attention_f64_p(q, c.prefix ? k : k + seg, c.prefix ? v : v + seg, c.prefix ? c.np : 0, c.nq, c.H, c.KV, c.hd,
                    c.window, c.sinks ? d.sinks : NULL, d.scale, round_p, r);
}

static void print_case(const attn_case &c, int kernel, const char *what, double d) {
    print_message("kernel %d: H %d KV %d hd %d np %d nq %d window %d sinks %d scale %g 2^%d 2^%d,%d %s: %s %.3g\n", kernel,
                  c.H, c.KV, c.hd, c.np, c.nq, c.window, c.sinks, c.scale, c.qk_exp, c.v_exp[0], c.v_exp[1],
                  c.prefix ? "cached prefix" : "one segment", what, d);
}

/* max |kernel - float64| over the outputs of one case, relative to the head's value scale */
static double run_case(const attn_case &c, int kernel) {
    attn_data d;
    case_data(c, d);
    std::vector<float> r(d.q.size());
    case_reference(c, d, d.q.data(), d.k.data(), d.v.data(), 0, r.data());
    tf32_violations = h16_violations = h16_mmas = tf32_mmas = 0;
    launch(d.a, kernel);
    assert_int_equal(tf32_violations, 0); /* every mma operand rounded to TF32 first */
    assert_int_equal(h16_violations, 0);  /* every fp16 operand finite: the scaling kept it in range */
    /* which kernel ran: with attn_kernel 3, k_attention_h16 for the heads whose largest |q|, |k|
     * and |v| lie in [2^-27, 2^54) (or are 0), k_attention_tc for the others */
    int h16_heads = 0, T_ = c.np + c.nq;
    for (int h = 0; h < c.H; h++) {
        int g = h / (c.H / c.KV);
        double mq = 0, mk = 0, mv = 0;
        for (int i = 0; i < c.nq; i++)
            for (int j = 0; j < c.hd; j++) mq = fmax(mq, fabs(d.q[(size_t)i * c.H * c.hd + h * c.hd + j]));
        for (int t = c.prefix ? 0 : c.np; t < T_; t++)
            for (int j = 0; j < c.hd; j++) {
                mk = fmax(mk, fabs(d.k[(size_t)t * c.KV * c.hd + g * c.hd + j]));
                mv = fmax(mv, fabs(d.v[(size_t)t * c.KV * c.hd + g * c.hd + j]));
            }
        auto fits = [](double m) { return m == 0 || (m >= ldexp(1, -27) && m < ldexp(1, 54)); };
        h16_heads += fits(mq) && fits(mk) && fits(mv);
    }
    assert_true(kernel == 3 && h16_heads > 0 ? h16_mmas > 0 : h16_mmas == 0);
    assert_true(kernel == 3 && h16_heads == c.H ? tf32_mmas == 0 : tf32_mmas > 0);
    double worst = 0; /* relative to the head's value scale (the outputs' scale) */
    for (size_t i = 0; i < d.o.size(); i++) {
        int g = (int)(i / c.hd % c.H) / (c.H / c.KV);
        worst = fmax(worst, fabs((double)d.o[i] - r[i]) / ldexp(1.0, c.v_exp[std::min(1, g)])); /* NaN: unwritten */
        assert_false(isnan(d.o[i]));
    }
    print_case(c, kernel, "max |d| vs float64 =", worst);
    assert_true(worst < 1e-5);
    return worst;
}

/* k_attention_b16 (attention on bf16 operands) on a case, against float64 on the bf16-rounded q,
 * k, v, as test_engine's op_attention_bf16 checks the backends (its bounds, derived there): within
 * 2^-9 max|v| + 1e-5 of the unrounded numerators' result (rounding a numerator moves the output,
 * a convex combination of v, by at most 2^-9 max|v|), and on average 4x nearer to the result with
 * rounded numerators (attention_f64_p) than that result is to the unrounded one: the kernel rounds
 * the same numerators, but for the few that fp32's exp2 and score roundings put across a bf16
 * rounding boundary (measured: 1,000x nearer and more). Values
 * scaled per kv head (v_exp) count relative to their scale. */
static void run_case_b16(const attn_case &c) {
    attn_data d;
    case_data(c, d);
    std::vector<float> qb(d.q), kb(d.k), vb(d.v), r(d.q.size()), rr(d.q.size());
    for (std::vector<float> *x : {&qb, &kb, &vb})
        for (float &e : *x) e = attn_ref_bf16(e);
    case_reference(c, d, qb.data(), kb.data(), vb.data(), 0, r.data());
    case_reference(c, d, qb.data(), kb.data(), vb.data(), 1, rr.data());
    double vmax = 0;
    for (size_t i = 0; i < vb.size(); i++) vmax = fmax(vmax, fabs(vb[i]) / ldexp(1.0, c.v_exp[std::min(1, (int)(i / c.hd % c.KV))]));
    tf32_violations = h16_violations = h16_mmas = tf32_mmas = bf16_mmas = 0;
    launch(d.a, 4);
    assert_true(bf16_mmas > 0 && h16_mmas == 0 && tf32_mmas == 0); /* k_attention_b16 alone */
    double worst = 0, to_rounded = 0, gap = 0;
    for (size_t i = 0; i < d.o.size(); i++) {
        double sc = ldexp(1.0, c.v_exp[std::min(1, (int)(i / c.hd % c.H) / (c.H / c.KV))]);
        assert_false(isnan(d.o[i])); /* unwritten */
        worst = fmax(worst, fabs((double)d.o[i] - r[i]) / sc);
        to_rounded += fabs((double)d.o[i] - rr[i]) / sc / (double)d.o.size();
        gap += fabs((double)rr[i] - r[i]) / sc / (double)d.o.size();
    }
    print_case(c, 4, "mean |d| to rounded numerators", to_rounded);
    print_case(c, 4, "mean |d| between the references", gap);
    assert_true(worst < ldexp(vmax, -9) + 1e-5);
    /* a window of 1 has one numerator a row, exp(0) = 1 exactly: no rounding to see */
    if (gap > 1e-6) assert_true(to_rounded * 4 < gap);
}

/* the case on k_attention_tc (attn_kernel 2), on k_attention_h16 (3) and on bf16 operands
 * (k_attention_b16) */
static void run_kernels(const attn_case &c) {
    for (int kernel = 2; kernel <= 3; kernel++) run_case(c, kernel);
    run_case_b16(c);
}

/* test_engine's op_attention_causal_gqa: hd 20 (not a multiple of 8: the padding), 70 rows (two
 * blocks, the second partial), GQA 4 heads on 2 */
static void causal_gqa(void **state) {
    (void)state;
    for (int pre = 0; pre < 2; pre++) run_kernels({4, 2, 20, 5, 70, 0, 0, pre, 0, 0, {0, 0}});
}

/* op_attention_window_sinks: windows of 1, 5 and 40 (cutting into the prefix), sinks */
static void window_and_sinks(void **state) {
    (void)state;
    const int windows[4] = {0, 1, 5, 40};
    for (int wi = 0; wi < 4; wi++)
        for (int sk = 0; sk < 2; sk++)
            for (int pre = 0; pre < 2; pre++) run_kernels({4, 2, 16, 9, 70, windows[wi], sk, pre, 0, 0, {0, 0}});
}

/* a given scale (MLA's mscale); hd 18 and 2 kv heads of 18 floats: rows not 16-byte aligned, so
 * K and V are staged element by element */
static void scale_and_unaligned_rows(void **state) {
    (void)state;
    run_kernels({2, 2, 24, 4, 40, 0, 0, 1, 0.37f, 0, {0, 0}});
    run_kernels({4, 2, 18, 3, 33, 0, 0, 1, 0, 0, {0, 0}});
}

/* op_attention_gemm_blocks' sizes: hd 64 over 300 rows, hd 128 (the largest head) over 200 rows,
 * windows cutting through blocks and tiles, sinks */
static void blocks_64_and_128(void **state) {
    (void)state;
    run_kernels({4, 2, 64, 37, 300, 50, 1, 1, 0, 0, {0, 0}});
    run_kernels({4, 2, 64, 37, 300, 200, 0, 0, 0, 0, {0, 0}});
    run_kernels({4, 2, 128, 70, 200, 9, 0, 1, 0, 0, {0, 0}});
    run_kernels({4, 2, 128, 70, 200, 0, 1, 0, 0, 0, {0, 0}});
}

/* k_attention_h16's tiles that skip the masks (tc_unmasked) at their edges: a prefix of 14 puts a
 * tile's last key one past a warp's first row (a tile of 32 keys from 0, warps of 16 rows from 14 +
 * 16 w); a window of 47 puts a tile's first key one before the last row's window */
static void unmasked_tile_edges(void **state) {
    (void)state;
    run_kernels({4, 2, 64, 14, 150, 0, 0, 1, 0, 0, {0, 0}});
    run_kernels({4, 2, 32, 0, 100, 47, 0, 0, 0, 0, {0, 0}});
}

/* k_attention_h16's scaling: q and k moved by 2^20 (the same scores), the kv heads' values by 2^-20
 * and 2^30 (in range: every head on fp16); values of 2^60 and 2^-40 (beyond: that kv head's q heads
 * on k_attention_tc, the others on fp16); q at 2^-30 (every head beyond). Differences relative to
 * the head's value scale. */
static void h16_scaling_and_fallback(void **state) {
    (void)state;
    run_kernels({4, 2, 64, 10, 100, 0, 1, 1, 0, 20, {-20, 30}});
    run_kernels({4, 2, 64, 10, 100, 0, 0, 0, 0, 0, {60, 0}});
    run_kernels({4, 2, 32, 0, 70, 0, 0, 0, 0, 0, {0, -40}});
    run_kernels({4, 2, 32, 0, 70, 0, 0, 0, 0, -30, {0, 0}});
}

/* The emulation's fp32 -> fp16 rounding (m2d_emu_f2h, standing for __floats2half2_rn) against the
 * compiler's _Float16 conversion, on random bit patterns, ties, subnormals, overflow; fp16 -> fp32
 * (m2d_emu_h2f) on all 65,536 halves. h16_pair's parts sum to x within 2^-22 |x| where the lo part
 * is normal (|x| >= 2^-3), within 2^-25 below (fp16's subnormal spacing 2^-24, halved). */
static uint16_t f16_bits(_Float16 h) {
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}

static void fp16_rounding_matches_compiler(void **state) {
    (void)state;
    for (uint32_t u = 0; u < 65536; u++) {
        uint16_t b = (uint16_t)u;
        _Float16 h;
        memcpy(&h, &b, 2);
        float want = (float)h, got = m2d_emu_h2f(u);
        assert_true(isnan(want) ? isnan(got) : memcmp(&want, &got, 4) == 0);
    }
    std::vector<uint32_t> bits = {0x477fe000u, 0x477fefffu, 0x477ff000u, 0x38800000u, 0x387fffffu, 0x33000000u,
                                  0x33000001u, 0x32ffffffu, 0x3f801000u, 0x3f803000u, 0x7f800000u, 0x80000000u};
    for (int i = 0; i < 400000; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        uint32_t u = (uint32_t)(rng >> 16);
        u = (u & 0x80ffffffu) | ((0x30u + (u >> 24) % 0x1c) << 24 & 0x7f000000u); /* mostly near fp16's range */
        bits.push_back(u);
        bits.push_back((u & ~0x1fffu) | 0x1000u); /* a tie */
    }
    for (uint32_t u : bits) {
        float x = __uint_as_float(u);
        uint16_t want = f16_bits((_Float16)x), got = m2d_emu_f2h(x);
        if (got != want) print_message("x %08x: %04x against %04x\n", u, got, want);
        assert_int_equal(got, want);
        if (fabsf(x) > 16384.0f) continue; /* h16_pair's operands are scaled below 2^14 */
        uint2 p = h16_pair(x, -x);
        double rest = fabs((double)x - m2d_emu_h2f(p.x & 0xffffu) - m2d_emu_h2f(p.y & 0xffffu));
        assert_true(rest <= fmax(ldexp(fabs((double)x), -22), ldexp(1.0, -25)));
        assert_true(m2d_emu_h2f(p.x >> 16) == -m2d_emu_h2f(p.x & 0xffffu)); /* the high half is x1's */
    }
}

/* tf32_rna, k_attention_tc's integer rounding to TF32, against rounding in float64: to a multiple
 * of 2^(e - 10) (e: the binade, at least -126: subnormals keep the same spacing), to nearest, ties
 * away from zero — cvt.rna.tf32.f32's rounding as the PTX ISA defines it — on finite values: random
 * bit patterns, exact ties, subnormals, carries into the next binade and to infinity. tf32_pair's
 * two parts are TF32 and sum to x within 2^-22 |x| (the rest is at most half a TF32 ulp of the
 * small part, itself at most half a TF32 ulp of x; near underflow, half TF32's subnormal spacing). */
static float tf32_by_float64(float x) {
    if (x == 0) return x;
    double q = ldexp(1.0, std::max(ilogb(x), -126) - 10);
    return (float)copysign(floor(fabs((double)x) / q + 0.5) * q, (double)x); /* past FLT_MAX: inf */
}

static void tf32_rounding_matches_float64(void **state) {
    (void)state;
    std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x00001000u, 0x00000fffu, 0x00001fffu,
                                  0x807ff000u, 0x3f800fffu, 0x3f801000u, 0xbf803000u, 0x3fffffffu,
                                  0x7f7ff000u, 0x7f7fefffu, 0xff7fffffu};
    for (int i = 0; i < 200000; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        uint32_t u = (uint32_t)(rng >> 16);
        if ((u & 0x7f800000u) == 0x7f800000u) continue; /* infinities and NaNs: not the kernel's operands */
        bits.push_back(u);
        bits.push_back((u & ~0x1fffu) | 0x1000u); /* a tie */
    }
    for (uint32_t u : bits) {
        float x = __uint_as_float(u), want = tf32_by_float64(x);
        uint32_t got = tf32_rna(x);
        if (got != __float_as_uint(want)) print_message("x %08x: %08x against %08x\n", u, got, __float_as_uint(want));
        assert_int_equal(got, __float_as_uint(want));
        if (!isfinite(want)) continue;
        uint2 p = tf32_pair(x);
        assert_int_equal(p.x & 0x1fffu, 0);
        assert_int_equal(p.y & 0x1fffu, 0);
        double rest = fabs((double)x - __uint_as_float(p.x) - __uint_as_float(p.y));
        /* below ~2^-104 the small part is subnormal, where TF32's spacing is 2^-136 */
        assert_true(rest <= fmax(ldexp(fabs((double)x), -22), ldexp(1.0, -137)));
    }
}

/* calibration's Gram (k_gram_mma, prefetching or not, or k_gram_tile, then k_gram_add, as cu_gram
 * launches them: KERNEL its gram_kernel) against
 * the fp64 sum over tokens and columns: E = 70 (a second, partial tile of 64), d = 40 (columns in
 * chunks of 16, the last partial), n = 37 rows (fewer than the slices: empty slices add zeros) and
 * 150 (slices of one and two rows), rows with padding (ld > E d). Both sum the same fp64 products
 * of fp32 values, in other orders: |Δ| <= γ_{n d} Σ|F_i F_j| with γ_m = m u / (1 - m u), u = 2^-53
 * (Higham §3.1). Only the upper triangle moves: the lower one keeps its start (-7). Returns g. */
static std::vector<double> gram_case(int n, int kernel) {
    const bool mma = kernel > 0;
    const int E = 70, d = 40, ld = E * d + 3, slices = mma ? GRAM_MMA_SLICES : GRAM_SLICES;
    std::vector<float> f((size_t)n * ld);
    rng = 0x2545f4914f6cdd1dull + (uint64_t)n; /* the same F for every kernel of a case */
    for (float &x : f) x = (float)normal();
    std::vector<double> part((size_t)slices * E * E, NAN), g((size_t)E * E);
    for (int i = 0; i < E * E; i++) g[i] = i % E >= i / E ? 0.5 : -7.0;
    int tiles = (E + GRAM_TILE - 1) / GRAM_TILE;
    const float *fp = f.data();
    double *pp = part.data(), *gp = g.data();
    if (kernel == 2) run_grid(tiles, tiles, slices, GRAM_MMA_THREADS, [=] { k_gram_mma<true>(fp, ld, n, E, d, pp); });
    else if (mma) run_grid(tiles, tiles, slices, GRAM_MMA_THREADS, [=] { k_gram_mma<false>(fp, ld, n, E, d, pp); });
    else run_grid(tiles, tiles, slices, GRAM_THREADS, [=] { k_gram_tile(fp, ld, n, E, d, pp); });
    run_grid((E * E + 255) / 256, 1, 1, 256, [=] { k_gram_add(pp, slices, E, gp); });
    const double u = ldexp(1, -53), gamma = n * d * u / (1 - n * d * u);
    double worst = 0;
    for (int i = 0; i < E; i++)
        for (int j = 0; j < E; j++) {
            if (i > j) {
                assert_true(g[(size_t)i * E + j] == -7.0);
                continue;
            }
            double want = 0.5, mag = 0;
            for (int t = 0; t < n; t++)
                for (int c = 0; c < d; c++) {
                    double p = (double)f[(size_t)t * ld + i * d + c] * f[(size_t)t * ld + j * d + c];
                    want += p, mag += fabs(p);
                }
            double diff = fabs(g[(size_t)i * E + j] - want);
            worst = fmax(worst, diff / mag);
            if (!(diff <= gamma * mag + 2 * u)) print_message("(%d, %d): %.17g against %.17g\n", i, j, g[(size_t)i * E + j], want);
            assert_true(diff <= gamma * mag + 2 * u); /* + the 0.5 start's rounding */
        }
    print_message("gram (%s): E %d, d %d, %d rows: max |d| / sum|products| = %.3g (bound %.3g)\n",
                  kernel == 2 ? "k_gram_mma, prefetching" : mma ? "k_gram_mma" : "k_gram_tile", E, d, n, worst, gamma);
    return g;
}

static void gram_matches_float64(void **state) {
    (void)state;
    for (int n : {37, 150}) {
        gram_case(n, 0);
        std::vector<double> g1 = gram_case(n, 1), g2 = gram_case(n, 2);
        assert_memory_equal(g1.data(), g2.data(), sizeof(double) * g1.size()); /* the same DMMAs in the same order */
    }
}

/* calibration's reductions (k_reduce_sums, k_reduce_norms, k_reduce_select, as cu_experts_reduce
 * launches them) against the host: the sums onto a start, tokens in order, are the host's own fp64
 * additions (exact: backend.h's contract, the CPU's bits); the norms are a warp's butterfly sum of
 * d fp64 squares, within γ_d of the host's ordered sum (Higham §3.1); the chosen rows are copies
 * (exact), zeros for id -1. E = 5, d = 45 (lanes with 1 or 2 columns), 33 rows padded (ld > E d). */
static void reductions_match_host(void **state) {
    (void)state;
    const int n = 33, E = 5, d = 45, ld = E * d + 7, k1 = 3;
    std::vector<float> f((size_t)n * ld), sel((size_t)n * k1 * d, NAN);
    std::vector<int32_t> ids((size_t)n * k1);
    std::vector<double> sum((size_t)E * d), want((size_t)E * d), n2((size_t)E * n, NAN);
    for (float &x : f) x = (float)normal();
    for (size_t i = 0; i < ids.size(); i++) ids[i] = (int32_t)(i * 7 % (E + 1)) - 1; /* -1 .. E-1 */
    for (size_t i = 0; i < sum.size(); i++) sum[i] = want[i] = 0.25 * (double)(i % 9) - 1;
    const float *fp = f.data();
    const int32_t *ip = ids.data();
    float *sp = sel.data();
    double *sump = sum.data(), *n2p = n2.data();
    run_grid((E * d + 255) / 256, 1, 1, 256, [=] { k_reduce_sums(fp, ld, n, E, d, sump); });
    run_grid((E * n * 32 + 255) / 256, 1, 1, 256, [=] { k_reduce_norms(fp, ld, n, E, d, n2p); });
    run_grid((n * k1 * d + 255) / 256, 1, 1, 256, [=] { k_reduce_select(fp, ld, n, d, ip, k1, sp); });
    const double u = ldexp(1, -53), gamma = d * u / (1 - d * u);
    for (int e = 0; e < E; e++)
        for (int t = 0; t < n; t++) {
            double q = 0;
            for (int j = 0; j < d; j++) {
                double v = f[(size_t)t * ld + e * d + j];
                want[(size_t)e * d + j] += v, q += v * v;
            }
            assert_true(fabs(n2[(size_t)e * n + t] - q) <= gamma * q);
        }
    assert_memory_equal(sum.data(), want.data(), sizeof(double) * sum.size());
    for (int t = 0; t < n; t++)
        for (int r = 0; r < k1; r++)
            for (int j = 0; j < d; j++) {
                int e = ids[(size_t)t * k1 + r];
                float w = e < 0 ? 0.0f : f[(size_t)t * ld + e * d + j];
                assert_memory_equal(&sel[((size_t)t * k1 + r) * d + j], &w, sizeof w);
            }
}

/* ---- the MoE's grouped GEMMs on mma.sync (k_gx) ---- */

static uint16_t bf16_normal(double sd) { return bf16_bits((float)(normal() * sd)); }

/* k_gx<NB, BM, BN, LDSM> as gm_launch launches it, over TILES tiles (spare blocks past the plan's included) */
template <int NB, int BM, int BN, bool LDSM>
static void gx_run(const gm_args &g, const gm_ptrs &p, int tiles) {
    static_assert(sizeof(gx_smem<BM, BN>) <= sizeof tc_raw, "shared memory");
    const gm_args *gp = &g;
    const gm_ptrs *pp = &p;
    run_grid((unsigned)tiles, (unsigned)((g.N + BN / NB - 1) / (BN / NB)), 1, GX_T, [gp, pp] { k_gx<NB, BM, BN, LDSM>(*gp, *pp); });
}

/* One MoE layer's experts through k_gx<2, BM> (gate, up, the activation, H in bf16) and k_gx<1, BM>
 * (down) against float64, bucket rows from a plan (tiles of BM rows: buckets of 0, 1, BM - 1, BM + 7
 * and 2 BM + 3 rows) or every expert on ROWS_CONST rows. d = 72 and d_ff = 104 (or D and DE) leave an inner tail
 * (not multiples of GX_BK) and output columns past the last full block; the outputs have padding
 * columns (ldc > N) that must stay untouched. Bounds (Higham §3.1, u = 2^-24): the bf16 products
 * are exact in fp32 and a K-term fp32 sum is within γ_K Σ|terms| (γ_K = K u / (1 - K u)), + u of
 * the bias add; through the activation (|∂h/∂g| <= 1.5 |u + 1|, |∂h/∂u| <= |g| + 1, SwiGLU's and
 * the clamped one's), the activation's own fp32 roundings (expf, a division, products: 8 u
 * allowed) and H's rounding to bf16 (half an ulp: at most 2^-8 relative).
 * Down reads the kernel's own H, so its operands are the reference's exactly. */
static std::vector<uint16_t> gx_last_h; /* the last case's H and Y, for the variants' bits */
static std::vector<float> gx_last_y;

template <int BM, int BN, bool LDSM>
static void gx_case(int rows_const, bool bf16_bias, bool clamp, int d = 72, int de = 104) {
    rng = 0x9e3779b97f4a7c15ull; /* the same operands for every variant of a case */
    /* H's padded rows stay 16-byte aligned: down's k_gx reads them by cp.async */
    const int E = 5, bucket[E] = {0, 1, BM - 1, BM + 7, 2 * BM + 3}, ldh = de + 8, ldy = d + 3;
    std::vector<int32_t> start(E + 1), tile_e, tile_r0;
    for (int e = 0; e < E; e++) start[e + 1] = start[e] + (rows_const ? 0 : bucket[e]);
    for (int e = 0; e < E && !rows_const; e++)
        for (int r = start[e]; r < start[e + 1]; r += BM) tile_e.push_back(e), tile_r0.push_back(r);
    int n_tiles = (int)tile_e.size(), rows = rows_const ? rows_const : start[E];
    int64_t a_es = rows_const ? (int64_t)rows_const * d : 0, h_es = rows_const ? (int64_t)rows_const * ldh : 0,
            y_es = rows_const ? (int64_t)rows_const * ldy : 0;
    size_t all_rows = rows_const ? (size_t)E * rows_const : (size_t)rows;
    std::vector<uint16_t> x(all_rows * d), wg((size_t)E * de * d), wu(wg.size()), wd((size_t)E * d * de);
    std::vector<uint16_t> h(all_rows * ldh, 0xffffu); /* a NaN: unwritten */
    std::vector<float> y(all_rows * ldy, NAN), bias32(3 * E * d + 3 * E * de);
    std::vector<uint16_t> bias16(bias32.size());
    for (uint16_t &v : x) v = bf16_normal(1);
    for (auto *w : {&wg, &wu, &wd})
        for (uint16_t &v : *w) v = bf16_normal(0.2);
    for (size_t i = 0; i < bias32.size(); i++) bias16[i] = bf16_normal(0.5), bias32[i] = bf16_float(bias16[i]);
    gm_ptrs pg, pd;
    memset(&pg, 0, sizeof pg), memset(&pd, 0, sizeof pd);
    const void *bias = bf16_bias ? (const void *)bias16.data() : (const void *)bias32.data();
    size_t bsz = bf16_bias ? 2 : 4;
    for (int e = 0; e < E; e++) {
        pg.w[0][e] = wg.data() + (size_t)e * de * d, pg.w[1][e] = wu.data() + (size_t)e * de * d;
        pd.w[0][e] = wd.data() + (size_t)e * d * de;
        pg.b[0][e] = (const char *)bias + bsz * e * de, pg.b[1][e] = (const char *)bias + bsz * (E + e) * de;
        pd.b[0][e] = (const char *)bias + bsz * (2 * E * de + e * d);
    }
    int32_t nt = n_tiles;
    const float alpha = 1.702f, limit = 1.5f;
    gm_args g1 = {(const __nv_bfloat16 *)x.data(), d, a_es, d, de, tile_e.data(), tile_r0.data(), &nt, start.data(),
                  rows_const, h.data(), ldh, h_es, bf16_bias, clamp, alpha, limit};
    gm_args g2 = {(const __nv_bfloat16 *)h.data(), ldh, h_es, de, d, tile_e.data(), tile_r0.data(), &nt, start.data(),
                  rows_const, y.data(), ldy, y_es, bf16_bias, 0, 0.0f, 0.0f};
    int tiles = rows_const ? E * ((rows_const + BM - 1) / BM) : n_tiles + 2;
    bf16_mmas = 0, ldsm_loads = 0, ldsm_misaligned = 0;
    gx_run<2, BM, BN, LDSM>(g1, pg, tiles);
    gx_run<1, BM, BN, LDSM>(g2, pd, tiles);
    assert_true(bf16_mmas > 0);
    assert_int_equal(ldsm_loads > 0, LDSM); /* the variant asked for ran */
    assert_int_equal(ldsm_misaligned, 0);
    const double u = ldexp(1, -24);
    double worst_h = 0, worst_y = 0;
    for (int e = 0; e < E; e++) {
        int r0 = rows_const ? 0 : start[e], r1 = rows_const ? rows_const : start[e + 1];
        for (int r = r0; r < r1; r++) {
            size_t row = rows_const ? (size_t)e * rows_const + r : (size_t)r;
            const uint16_t *xr = &x[row * d], *hr = &h[row * ldh];
            for (int j = 0; j < de; j++) { /* H */
                double gs = bias32[e * de + j], us = bias32[(E + e) * de + j], mg = fabs(gs), mu = fabs(us);
                for (int k = 0; k < d; k++) {
                    double a = bf16_float(xr[k]), pg_ = a * bf16_float(wg[((size_t)e * de + j) * d + k]),
                           pu = a * bf16_float(wu[((size_t)e * de + j) * d + k]);
                    gs += pg_, us += pu, mg += fabs(pg_), mu += fabs(pu);
                }
                double want;
                if (clamp) {
                    double a = fmin(gs, limit), b = fmin(fmax(us, -limit), limit);
                    want = (b + 1) * a / (1 + exp(-alpha * a));
                } else {
                    want = gs / (1 + exp(-gs)) * us;
                }
                double gam = (d + 1) * u / (1 - (d + 1) * u), eg = gam * mg, eu = gam * mu;
                double tol = (ldexp(1, -8) + 8 * u) * fabs(want) + 1.5 * (fabs(us) + 1 + eu) * eg + (fabs(gs) + 1 + eg) * eu + 1e-30;
                double diff = fabs(bf16_float(hr[j]) - want);
                worst_h = fmax(worst_h, diff / tol);
                if (!(diff <= tol)) fail_msg("k_gx<2, %d>: h[%zu][%d] = %.7g, float64 %.7g, bound %.3g", BM, row, j, bf16_float(hr[j]), want, tol);
            }
            for (int j = de; j < ldh; j++) assert_int_equal(hr[j], 0xffffu); /* padding untouched */
            for (int o = 0; o < d; o++) { /* Y from the kernel's H */
                double s = bias32[2 * E * de + e * d + o], mag = fabs(s);
                for (int k = 0; k < de; k++) {
                    double p = (double)bf16_float(hr[k]) * bf16_float(wd[((size_t)e * d + o) * de + k]);
                    s += p, mag += fabs(p);
                }
                double gam = (de + 1) * u / (1 - (de + 1) * u), diff = fabs(y[row * ldy + o] - s);
                worst_y = fmax(worst_y, diff / (gam * mag));
                if (!(diff <= gam * mag)) fail_msg("k_gx<1, %d>: y[%zu][%d] = %.9g, float64 %.9g, bound %.3g", BM, row, o, y[row * ldy + o], s, gam * mag);
            }
            for (int o = d; o < ldy; o++) assert_true(isnan(y[row * ldy + o]));
        }
    }
    gx_last_h = h, gx_last_y = y;
    print_message("k_gx BM %d, BN %d%s, %s, biases %s%s: worst |d| / bound: h %.3f, y %.3f\n", BM, BN, LDSM ? ", ldmatrix" : "",
                  rows_const ? "every expert on the same rows" : "plan's tiles", bf16_bias ? "bf16" : "fp32",
                  clamp ? ", clamped SwiGLU" : "", worst_h, worst_y);
}

/* a case by 32-bit fragment loads, then by ldmatrix (knob gx_ldsm), in the wide blocks (knob
 * gx_wide), and both: each against float64, and all with the same bits (the same values in the
 * same MMAs in the same order: exact by construction) */
template <int BM>
static void gx_variants(int rows_const, bool bf16_bias, bool clamp, int d = 72, int de = 104) {
    gx_case<BM, GX_BN, false>(rows_const, bf16_bias, clamp, d, de);
    std::vector<uint16_t> h = gx_last_h;
    std::vector<float> y = gx_last_y;
    for (int v = 1; v <= 3; v++) { /* bit 0: ldmatrix, bit 1: wide */
        if (v == 1) gx_case<BM, GX_BN, true>(rows_const, bf16_bias, clamp, d, de);
        else if (v == 2) gx_case<BM, GX_BN_WIDE, false>(rows_const, bf16_bias, clamp, d, de);
        else gx_case<BM, GX_BN_WIDE, true>(rows_const, bf16_bias, clamp, d, de);
        assert_true(h == gx_last_h);
        assert_memory_equal(y.data(), gx_last_y.data(), sizeof(float) * y.size()); /* NaN padding included */
    }
}

static void gx_matches_float64(void **state) {
    (void)state;
    gx_variants<32>(0, false, false);
    gx_variants<64>(0, true, true);
    gx_variants<32>(41, true, false);
    gx_variants<64>(40, false, true);
    gx_variants<64>(0, true, false, 232, 200); /* 8 and 7 inner steps: the stages wrap */
    gx_variants<32>(41, true, true, 232, 200);
    gx_variants<64>(0, false, false, 72, 296); /* gate/up 296 columns: a wide block's 128 and a tail */
}

/* ---- the LM head's one-pass log-sum-exp (k_lse_rows) ---- */

/* Two chunks of logits folded into the state as cu_logprobs does (the first 1,000 wide, float4
 * loads; the second 37, not a multiple of 4: scalar loads), for 6 rows: N(0, 3) logits, one row
 * shifted by 80 (the running maxima rescale), one whose largest logit is in the second chunk, one
 * with -inf logits (masked: add nothing; a thread's first value among them), targets in either
 * chunk and at both chunks' first logit; and a row with a NaN first (a NaN log-prob, as the
 * two-pass kernel gives). Against float64 log-softmax:
 * each term is an fp32 expf (within 2 ulps on a GPU) of z - m, rounded (u |z - m| relative),
 * scaled and summed in fp64, so the sum is within (2 + max_i (t_i |d_i|) V / S) u relative of
 * float64's; |d| e^-|d| <= 1/e, so with V = 1,037 terms and S >= 1 that is <= (2 + 382) u, and
 * the log-prob (target - max - log S; the first two exact) as far off: 384 u = 2.3e-5 (with the
 * host's expf, correctly rounded, far less: the printout); a lost term, a wrong rescaling or
 * target is >= 1e-3 off. */
static void lse_rows_match_float64(void **state) {
    (void)state;
    const int n = 6, nv[2] = {1000, 37}, V = nv[0] + nv[1];
    std::vector<float> z0((size_t)n * nv[0] + 4), z1((size_t)n * nv[1]), full((size_t)n * V);
    for (int r = 0; r < n; r++)
        for (int v = 0; v < V; v++) {
            float x = (float)(3 * normal()) + (r == 1 ? 80.0f : 0.0f) + (r == 2 && v == V - 5 ? 20.0f : 0.0f);
            if (r == 3 && v % 7 == 0) x = -INFINITY;
            if (r == 5 && v == 0) x = NAN;
            full[(size_t)r * V + v] = x;
            if (v < nv[0]) z0[(size_t)r * nv[0] + v] = x;
            else z1[(size_t)r * nv[1] + v - nv[0]] = x;
        }
    std::vector<int32_t> tg = {0, 1010, V - 5, 6, 1000, 999};
    std::vector<double> st(3 * n);
    for (int r = 0; r < n; r++) st[r] = -INFINITY, st[n + r] = 0, st[2 * n + r] = 0;
    double *sp = st.data();
    const int32_t *tp = tg.data();
    float *zp0 = (float *)(((uintptr_t)z0.data() + 15) & ~(uintptr_t)15), *zp1 = z1.data();
    memcpy(zp0, z0.data(), sizeof(float) * n * nv[0]);
    run_grid(n, 1, 1, LSE_T, [=] { k_lse_rows(zp0, nv[0], 0, tp, sp, n, 0, 1); });
    run_grid(n, 1, 1, LSE_T, [=] { k_lse_rows(zp1, nv[1], nv[0], tp, sp, n, 0, 0); });
    const double u = ldexp(1, -24);
    double worst = 0;
    assert_true(isnan(st[2 * n + 5] - st[5] - log(st[n + 5])));
    for (int r = 0; r < n - 1; r++) {
        const float *x = &full[(size_t)r * V];
        double mx = -INFINITY, sum = 0;
        for (int v = 0; v < V; v++) mx = fmax(mx, x[v]);
        for (int v = 0; v < V; v++) sum += exp(x[v] - mx);
        double want = x[tg[r]] - mx - log(sum), got = st[2 * n + r] - st[r] - log(st[n + r]);
        worst = fmax(worst, fabs(got - want));
        if (!(fabs(got - want) <= 384 * u)) fail_msg("row %d: log-prob %.12g, float64 %.12g", r, got, want);
    }
    print_message("k_lse_rows: worst |log-prob - float64| = %.3g (%.1f u)\n", worst, worst / u);
}

/* Whole chunks masked (-inf): row 0's first chunk (its state's maximum still -inf when the second
 * comes), row 1's second; the other logits 0, so log p = -log(the unmasked count) within the
 * 384 u above. A masked chunk had given NaN (0 x exp(-inf - -inf)). */
static void lse_rows_masked_chunks(void **state) {
    (void)state;
    const int n = 2, nv[2] = {8, 4};
    alignas(16) float z0[n * 8];
    float z1[n * 4];
    for (int v = 0; v < n * nv[0]; v++) z0[v] = v < nv[0] ? -INFINITY : 0.0f;
    for (int v = 0; v < n * nv[1]; v++) z1[v] = v < nv[1] ? 0.0f : -INFINITY;
    std::vector<int32_t> tg = {nv[0], 0};
    std::vector<double> st = {-INFINITY, -INFINITY, 0, 0, 0, 0};
    double *sp = st.data();
    const int32_t *tp = tg.data();
    float *a = z0, *b = z1;
    run_grid(n, 1, 1, LSE_T, [=] { k_lse_rows(a, nv[0], 0, tp, sp, n, 0, 1); });
    run_grid(n, 1, 1, LSE_T, [=] { k_lse_rows(b, nv[1], nv[0], tp, sp, n, 0, 0); });
    const double want[2] = {-log(4.0), -log(8.0)}, u = ldexp(1, -24);
    for (int r = 0; r < n; r++) {
        double got = st[2 * n + r] - st[r] - log(st[n + r]);
        if (!(fabs(got - want[r]) <= 384 * u)) fail_msg("row %d: log-prob %.12g, want %.12g", r, got, want[r]);
    }
}

/* ---- the MoE's plan on many blocks (k_plan_count, k_plan_scan, k_plan_place) ---- */

/* The plan against the host's stable counting sort (what backend_cuda.cu's moe_plan_make
 * computes for the per-expert path): bucket starts, each bucket's pairs in token order, each pair's row (-1 for
 * an id out of range, and the error flag), each token's rows ascending (-1 last), the tiles of BM
 * rows in expert order. Exact: integers. Several chunks (the last partial), one chunk, k = 32 (8
 * tokens a chunk), ids out of range. */
static void plan_case(int n, int k, int E, int bm, bool bad_ids) {
    int nk = n * k, chunks = plan_chunks(n, k), mt = nk / bm + std::min(E, nk) + 1;
    std::vector<int32_t> topk(nk);
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++) topk[(size_t)t * k + j] = (int32_t)((t * 7 + j * (E / k + 1) + (t * t) % 5) % E);
    if (bad_ids) topk[5] = -1, topk[nk - 1] = E;
    std::vector<int32_t> start(E + 1, -9), pair(nk, -9), row_of(nk, -9), tok_rows(nk, -9), tile_e(mt, -9), tile_r0(mt, -9),
        base((size_t)chunks * E, -9);
    int32_t n_tiles = -9, err = 0;
    gm_plan p = {start.data(), pair.data(), row_of.data(), tok_rows.data(), tile_e.data(), tile_r0.data(), &n_tiles, &err, base.data()};
    const int32_t *tp = topk.data();
    run_grid(chunks, 1, 1, PLAN_T, [=] { k_plan_count(tp, n, k, E, p); });
    run_grid(1, 1, 1, PLAN_T, [=] { k_plan_scan(chunks, E, bm, p); });
    run_grid(chunks, 1, 1, PLAN_T, [=] { k_plan_place(tp, n, k, E, p); });
    /* the host's plan */
    std::vector<int32_t> w_start(E + 1, 0), w_pair, w_row(nk, -1), w_tile_e, w_tile_r0;
    for (int e = 0; e < E; e++) {
        w_start[e] = (int32_t)w_pair.size();
        for (int i = 0; i < nk; i++)
            if (topk[i] == e) w_row[i] = (int32_t)w_pair.size(), w_pair.push_back(i);
        for (int r = w_start[e]; r < (int)w_pair.size(); r += bm) w_tile_e.push_back(e), w_tile_r0.push_back(r);
    }
    w_start[E] = (int32_t)w_pair.size();
    assert_int_equal(err, bad_ids ? 1 : 0);
    assert_true(std::equal(w_start.begin(), w_start.end(), start.begin()));
    assert_true(std::equal(w_pair.begin(), w_pair.end(), pair.begin()));
    assert_true(w_row == row_of);
    assert_int_equal(n_tiles, (int)w_tile_e.size());
    assert_true(std::equal(w_tile_e.begin(), w_tile_e.end(), tile_e.begin()));
    assert_true(std::equal(w_tile_r0.begin(), w_tile_r0.end(), tile_r0.begin()));
    for (int t = 0; t < n; t++) {
        std::vector<int32_t> rows;
        for (int j = 0; j < k; j++)
            if (w_row[(size_t)t * k + j] >= 0) rows.push_back(w_row[(size_t)t * k + j]);
        std::sort(rows.begin(), rows.end());
        rows.resize(k, -1);
        assert_true(std::equal(rows.begin(), rows.end(), tok_rows.begin() + (ptrdiff_t)t * k));
    }
}

static void plan_matches_host(void **state) {
    (void)state;
    plan_case(100, 8, 16, 32, false); /* 32 tokens a chunk: 4 chunks, the last partial */
    plan_case(100, 8, 16, 64, true);
    plan_case(200, 8, 8, 64, false);  /* ~200 rows an expert: several tiles of 64 */
    plan_case(37, 3, 5, 32, false);   /* one chunk */
    plan_case(300, 6, 128, 64, true);
    plan_case(20, 32, 256, 32, false); /* 8 tokens a chunk; E = PLAN_T */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(causal_gqa),
        cmocka_unit_test(window_and_sinks),
        cmocka_unit_test(scale_and_unaligned_rows),
        cmocka_unit_test(blocks_64_and_128),
        cmocka_unit_test(unmasked_tile_edges),
        cmocka_unit_test(h16_scaling_and_fallback),
        cmocka_unit_test(tf32_rounding_matches_float64),
        cmocka_unit_test(fp16_rounding_matches_compiler),
        cmocka_unit_test(gram_matches_float64),
        cmocka_unit_test(reductions_match_host),
        cmocka_unit_test(gx_matches_float64),
        cmocka_unit_test(lse_rows_match_float64),
        cmocka_unit_test(lse_rows_masked_chunks),
        cmocka_unit_test(plan_matches_host),
    };
    return cmocka_run_group_tests(tests, emu_setup, emu_teardown);
}
