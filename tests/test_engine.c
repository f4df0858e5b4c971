/* engine + backend: every op against naive loops, the whole forward against the float64
 * golden outputs of the tiny Qwen3-MoE, and the engine's entry points against each other. */
#include "testutil.h"
#include "attn_ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/backend_cpu.h"
#include "engine/engine.h"
#include "engine/gemm.h"
#include "engine/vexp.h"
#include "familyckpt.h"
#include "routing.h"
#include "reffwd.h"
#include "testmodel.h"
#include "base/util.h"

static void fill_normal(uint64_t *st, float *x, size_t n, double scale) {
    for (size_t i = 0; i < n; i++) x[i] = (float)(tu_rand_normal(st) * scale);
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

/* ---------------- ops vs naive loops (through the backend object) ---------------- */

/* fn(backend) on every registered backend; where a device is absent the test reports one line
 * "no GPU" and counts as skipped after the others ran (M2D_REQUIRE_GPU=1, tools/gpu_check.sh:
 * a failure instead) */
static void each_backend(void (*fn)(const char *backend)) {
    int absent = 0;
    for (int i = 0; i < m2d_backend_count(); i++) {
        const m2d_backend_kind *k = m2d_backend_kind_at(i);
        const char *name = k->name;
        if (strncmp(k->summary, "test fixture:", 13) == 0) continue; /* this binary's fixtures (below), not backends */
        if (tu_device_absent(name)) absent = 1;
        else fn(name);
    }
    if (absent && getenv("M2D_REQUIRE_GPU")) fail_msg("M2D_REQUIRE_GPU is set, but: %s", m2d_errmsg());
    if (absent) TU_SKIP("no GPU");
}

/* tests run on every registered backend: TEST(state) calls TEST_on(backend) for each */
#define EACH_BACKEND(test)                                                  \
    static void test(void **state) {                                        \
        (void)state;                                                        \
        each_backend(test##_on);                                            \
    }

/* op tests call ops between enter and leave, as the engine does: a backend reports an op's
 * failure (a GPU's launch error or fault) from leave() */
static m2d_backend *new_backend(const char *name, int threads) {
    m2d_backend_opts o = {.n_threads = threads};
    m2d_backend *be;
    if (m2d_backend_new(name, &o, &be)) fail_msg("%s", m2d_errmsg());
    be->ops->enter(be);
    return be;
}

static void end_backend(m2d_backend *be) {
    if (be->ops->leave(be)) fail_msg("%s", m2d_errmsg());
    m2d_backend_free(be);
}

/* 1 when BACKEND lacks one of the capabilities CAPS (backend.h): the variant's case is not run on
 * it (said in one line), never an op it does not have called */
static int lacks(const char *backend, uint64_t caps) {
    m2d_backend *be;
    if (m2d_backend_new(backend, NULL, &be)) fail_msg("%s", m2d_errmsg());
    int miss = m2d_backend_missing(be, caps);
    m2d_backend_free(be);
    if (miss >= 0) print_message("backend %s lacks '%s': case not run on it\n", backend, m2d_cap_name((m2d_cap)miss));
    return miss >= 0;
}

/* an fp32 engine on BACKEND */
static void engine_on(const char *backend, const m2d_model *m, int threads, m2d_engine **e) {
    m2d_engine_opts o = {.backend = backend, .n_threads = threads, .precision = M2D_PREC_FP32};
    if (m2d_engine_open(m, &o, e)) fail_msg("%s", m2d_errmsg());
}

static m2d_buf *upload(m2d_backend *be, const void *src, size_t bytes) {
    m2d_buf *b = be->ops->alloc(be, bytes);
    be->ops->upload(be, b, 0, src, bytes);
    return b;
}

static void download(m2d_backend *be, void *dst, m2d_buf *b, size_t bytes) { be->ops->download(be, dst, b, 0, bytes); }

/* a weight handle on host data (the tensor struct must outlive it) */
static m2d_weight *weight_of(m2d_backend *be, m2d_tensor *t, m2d_dtype dt, const void *data, int64_t r, int64_t c) {
    memset(t, 0, sizeof *t);
    t->name = "w", t->dtype = dt, t->ndim = c ? 2 : 1, t->shape[0] = r, t->shape[1] = c, t->data = data;
    t->nbytes = (size_t)(r * (c ? c : 1)) * m2d_dtype_size(dt);
    return be->ops->weight_new(be, t);
}

/* y = x · w^T on BACKEND, fp32 and (where supported) bf16, against double loops; a backend with a
 * second GEMM path under the knob gemm_naive (cuda: its simple kernel next to cuBLASLt) is checked
 * on both */
static void matmul_check(const char *backend, int naive);

static void op_matmul_matches_loops_on(const char *backend) {
    matmul_check(backend, 0);
    matmul_check(backend, 1);
}

static void matmul_check(const char *backend, int naive) {
    uint64_t st = 1;
    int n = 7, in = 33, out = 19;
    float x[7 * 33], w[19 * 33], y[7 * 19];
    fill_normal(&st, x, sizeof x / 4, 1);
    fill_normal(&st, w, sizeof w / 4, 1);
    m2d_backend *be = new_backend(backend, 1);
    if (naive && be->ops->tune(be, "gemm_naive", 1) != 0) { /* one GEMM path only */
        end_backend(be);
        return;
    }
    m2d_tensor wt;
    m2d_weight *wh = weight_of(be, &wt, M2D_F32, w, out, in);
    m2d_buf *xb = upload(be, x, sizeof x), *yb = be->ops->alloc(be, sizeof y);
    m2d_mat X = m2d_mat_of(xb, 0, n, in, in), Y = m2d_mat_of(yb, 0, n, out, out);
    be->ops->gemm(be, &X, wh, 0, &Y, 0.0f, M2D_PREC_FP32);
    download(be, y, yb, sizeof y);
    for (int i = 0; i < n; i++)
        for (int o = 0; o < out; o++) {
            double s = 0;
            for (int k = 0; k < in; k++) s += (double)x[i * in + k] * w[o * in + k];
            /* 33 fp32 products of N(0,1) values: |err| <= 33 * eps * sum|x w| ~ 33*6e-8*33 */
            assert_true(fabs(s - y[i * out + o]) < 1e-4);
        }
    if (be->ops->precisions & (1u << M2D_PREC_BF16)) { /* operands rounded to bf16, exact products */
        be->ops->gemm(be, &X, wh, 0, &Y, 0.0f, M2D_PREC_BF16);
        download(be, y, yb, sizeof y);
        for (int i = 0; i < n; i++)
            for (int o = 0; o < out; o++) {
                double s = 0;
                for (int k = 0; k < in; k++)
                    s += tu_bf16(x[i * in + k]) * tu_bf16(w[o * in + k]);
                /* bf16 x bf16 products are exact in fp32: only the fp32 accumulation errs, as above */
                assert_true(fabs(s - y[i * out + o]) < 1e-4);
            }
    }
    be->ops->release(be, xb), be->ops->release(be, yb), be->ops->weight_free(be, wh);
    end_backend(be);
}

/* rmsnorm of one row of length 2 through the backend */
static void rmsnorm2(m2d_backend *be, m2d_weight *wh, const float *x, double eps, float *y) {
    m2d_buf *xb = upload(be, x, 8), *yb = be->ops->alloc(be, 8);
    m2d_mat X = m2d_mat_of(xb, 0, 1, 2, 2), Y = m2d_mat_of(yb, 0, 1, 2, 2);
    be->ops->rmsnorm(be, &X, wh, eps, &Y);
    download(be, y, yb, 8);
    be->ops->release(be, xb), be->ops->release(be, yb);
}

static void op_rmsnorm_analytic_on(const char *backend) {
    m2d_backend *be = new_backend(backend, 1);
    m2d_tensor wt;
    /* x = (3, 4): mean square 12.5 -> x / sqrt(12.5 + eps) * w */
    float x[2] = {3, 4}, w[2] = {2, 0.5f}, y[2];
    m2d_weight *wh = weight_of(be, &wt, M2D_F32, w, 2, 0);
    rmsnorm2(be, wh, x, 0.0, y);
    assert_true(fabs(y[0] - 3 / sqrt(12.5) * 2) < 1e-6);
    assert_true(fabs(y[1] - 4 / sqrt(12.5) * 0.5) < 1e-6);
    /* eps enters under the root */
    float z[2] = {0, 0};
    rmsnorm2(be, wh, z, 1e-6, y);
    assert_true(y[0] == 0 && y[1] == 0); /* 0 x (anything finite) = 0: exact */
    be->ops->weight_free(be, wh);
    end_backend(be);
}

/* RoPE of one row of n_heads heads at position POS, in place on host x */
static void rope_row(m2d_backend *be, float *x, int n_heads, int hd, int32_t pos) {
    size_t bytes = sizeof(float) * (size_t)n_heads * hd;
    m2d_buf *xb = upload(be, x, bytes), *pb = upload(be, &pos, sizeof pos);
    m2d_mat X = m2d_mat_of(xb, 0, 1, n_heads * hd, n_heads * hd);
    m2d_rope_args r = {.kind = M2D_ROPE_NEOX, .theta = 10000.0};
    be->ops->rope(be, &X, n_heads, hd, pb, &r);
    download(be, x, xb, bytes);
    be->ops->release(be, xb), be->ops->release(be, pb);
}

static void op_rope_rotate_half_on(const char *backend) {
    int hd = 8, half = 4;
    float x[2 * 8], ref[2 * 8];
    uint64_t st = 2;
    fill_normal(&st, x, 16, 1);
    memcpy(ref, x, sizeof x);
    m2d_backend *be = new_backend(backend, 1);
    rope_row(be, x, 2, hd, 5);
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < half; i++) {
            double f = 5 * pow(10000.0, -2.0 * i / hd);
            double a = ref[h * 8 + i], b = ref[h * 8 + i + half];
            assert_true(fabs(x[h * 8 + i] - (a * cos(f) - b * sin(f))) < 1e-5);
            assert_true(fabs(x[h * 8 + i + half] - (b * cos(f) + a * sin(f))) < 1e-5);
        }
    /* position 0 is the identity */
    float y[8];
    memcpy(y, ref, sizeof y);
    rope_row(be, y, 1, 8, 0);
    assert_true(max_abs_diff(y, ref, 8) == 0); /* cos 0 = 1, sin 0 = 0 exactly: exact on every CPU */
    end_backend(be);
}

/* RoPE variants: interleaved pairs, a partial rotation (rot_dim < head_dim, the rest untouched),
 * given frequencies and an attention factor (YaRN), against the formula written out per pair */
static void op_rope_variants_on(const char *backend) {
    if (lacks(backend, M2D_CAP(M2D_CAP_ROPE_INTERLEAVED) | M2D_CAP(M2D_CAP_ROPE_SCALED) | M2D_CAP(M2D_CAP_ROPE_PARTIAL))) return;
    int hd = 12, rot = 8, H = 3;
    double inv_freq[4] = {1.0, 0.37, 0.021, 1e-4};
    float x[3 * 12], ref[3 * 12];
    uint64_t st = 9;
    fill_normal(&st, x, sizeof x / 4, 1);
    m2d_backend *be = new_backend(backend, 1);
    for (int kind = 0; kind < 2; kind++) {
        int32_t pos = 37;
        memcpy(ref, x, sizeof x);
        float y[3 * 12];
        memcpy(y, x, sizeof x);
        m2d_buf *xb = upload(be, y, sizeof y), *pb = upload(be, &pos, sizeof pos);
        m2d_mat X = m2d_mat_of(xb, 0, 1, H * hd, H * hd);
        m2d_rope_args r = {.kind = kind ? M2D_ROPE_INTERLEAVED : M2D_ROPE_NEOX, .theta = 1e4, .inv_freq = inv_freq,
                           .attn_factor = 1.25, .rot_dim = rot};
        be->ops->rope(be, &X, H, hd, pb, &r);
        download(be, y, xb, sizeof y);
        be->ops->release(be, xb), be->ops->release(be, pb);
        for (int h = 0; h < H; h++) {
            const float *v = ref + h * hd;
            for (int i = 0; i < rot / 2; i++) {
                int ia = kind ? 2 * i : i, ib = kind ? 2 * i + 1 : i + rot / 2;
                double f = pos * inv_freq[i], c = 1.25 * cos(f), sn = 1.25 * sin(f);
                /* |x| <= ~4, cos/sin rounded to fp32: error ~ 4 * 2 * 6e-8 */
                assert_true(fabs(y[h * hd + ia] - (v[ia] * c - v[ib] * sn)) < 1e-5);
                assert_true(fabs(y[h * hd + ib] - (v[ib] * c + v[ia] * sn)) < 1e-5);
            }
            for (int i = rot; i < hd; i++) assert_true(y[h * hd + i] == v[i]); /* not rotated: copied, exact */
        }
    }
    end_backend(be);
}

/* add_bias: y[r] += b (a bf16 vector: converted like any weight); clamp to [-limit, limit] */
static void op_bias_and_clamp_on(const char *backend) {
    if (lacks(backend, M2D_CAP(M2D_CAP_BIAS) | M2D_CAP(M2D_CAP_CLAMP))) return;
    int rows = 3, cols = 21;
    float y[3 * 21], ref[3 * 21], b[21];
    uint16_t bb[21];
    uint64_t st = 12;
    fill_normal(&st, y, sizeof y / 4, 2);
    fill_normal(&st, b, 21, 1);
    for (int i = 0; i < cols; i++) bb[i] = m2d_f32_to_bf16(b[i]), b[i] = m2d_bf16_to_f32(bb[i]);
    m2d_backend *be = new_backend(backend, 1);
    m2d_tensor bt;
    m2d_weight *wb = weight_of(be, &bt, M2D_BF16, bb, cols, 0);
    m2d_buf *yb = upload(be, y, sizeof y);
    m2d_mat Y = m2d_mat_of(yb, 0, rows, cols, cols);
    be->ops->add_bias(be, &Y, wb);
    be->ops->clamp(be, &Y, 1.5f);
    download(be, ref, yb, sizeof ref);
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < cols; i++) {
            float want = y[r * cols + i] + b[i]; /* one fp32 add, then the clamp: exact */
            want = want < -1.5f ? -1.5f : want > 1.5f ? 1.5f : want;
            assert_true(ref[r * cols + i] == want);
        }
    be->ops->release(be, yb), be->ops->weight_free(be, wb);
    end_backend(be);
}

/* sigmoid_scale: y[r, :] *= sigmoid(s[r, 0]) (s with a row stride of its own), against float64 */
static void op_sigmoid_scale_on(const char *backend) {
    if (lacks(backend, M2D_CAP(M2D_CAP_SIGMOID_SCALE))) return;
    int rows = 4, cols = 9;
    float y[4 * 9], out[4 * 9], sv[4 * 3];
    uint64_t st = 21;
    fill_normal(&st, y, sizeof y / 4, 2);
    fill_normal(&st, sv, sizeof sv / 4, 4);
    m2d_backend *be = new_backend(backend, 1);
    m2d_buf *yb = upload(be, y, sizeof y), *sb = upload(be, sv, sizeof sv);
    m2d_mat Y = m2d_mat_of(yb, 0, rows, cols, cols), S = m2d_mat_of(sb, 0, rows, 1, 3);
    be->ops->sigmoid_scale(be, &Y, &S);
    download(be, out, yb, sizeof out);
    /* expf and one fp32 product: relative error a few ulp */
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < cols; i++) {
            double want = y[r * cols + i] / (1 + exp(-(double)sv[r * 3]));
            assert_true(fabs(out[r * cols + i] - want) <= 4e-7 * fabs(want) + 1e-30);
        }
    be->ops->release(be, yb), be->ops->release(be, sb);
    end_backend(be);
}

/* the route op on one row of E logits: probabilities in place, top-k ids and gates */
static void route_row(m2d_backend *be, float *p, int E, int k, int32_t *idx) {
    m2d_buf *pb = upload(be, p, sizeof(float) * E), *ib = be->ops->alloc(be, sizeof(int32_t) * k),
            *gb = be->ops->alloc(be, sizeof(float) * k);
    m2d_mat P = m2d_mat_of(pb, 0, 1, E, E);
    m2d_route_args r = {.kind = M2D_ROUTER_SOFTMAX_TOPK, .renorm = false, .k = k};
    be->ops->route(be, &P, &r, ib, gb);
    download(be, p, pb, sizeof(float) * E);
    download(be, idx, ib, sizeof(int32_t) * k);
    be->ops->release(be, pb), be->ops->release(be, ib), be->ops->release(be, gb);
}

static void op_softmax_and_swiglu_on(const char *backend) {
    m2d_backend *be = new_backend(backend, 1);
    float p[3] = {1000, 1000, 1001}; /* huge logits: exp overflows without max subtraction */
    int32_t top[1];
    route_row(be, p, 3, 1, top);
    double z = 2 + exp(1.0);
    assert_true(fabs(p[0] - 1 / z) < 1e-6 && fabs(p[2] - exp(1.0) / z) < 1e-6);
    float g[3] = {0, 1, -2}, u[3] = {5, 2, 3}, h[3];
    m2d_buf *gb = upload(be, g, sizeof g), *ub = upload(be, u, sizeof u);
    m2d_mat G = m2d_mat_of(gb, 0, 1, 3, 3), U = m2d_mat_of(ub, 0, 1, 3, 3);
    be->ops->glu(be, M2D_ACT_SWIGLU, &G, &U);
    download(be, h, gb, sizeof h);
    assert_true(h[0] == 0); /* silu(0) = 0 / 2 = 0 exactly */
    assert_true(fabs(h[1] - 2 / (1 + exp(-1.0))) < 1e-6);
    assert_true(fabs(h[2] - 3 * -2 / (1 + exp(2.0))) < 1e-6);
    be->ops->release(be, gb), be->ops->release(be, ub);
    end_backend(be);
}

/* top-k runs on the router probabilities; softmax is monotonic and maps equal logits to equal
 * probabilities, so the ties below are ties of p */
static void op_topk_ties_to_lower_index_on(const char *backend) {
    m2d_backend *be = new_backend(backend, 1);
    float p[6] = {0.1f, 0.3f, 0.2f, 0.3f, 0.3f, 0.0f};
    int32_t idx[5];
    route_row(be, p, 6, 4, idx);
    assert_int_equal(idx[0], 1);
    assert_int_equal(idx[1], 3);
    assert_int_equal(idx[2], 4);
    assert_int_equal(idx[3], 2);
    float z[5] = {0};
    route_row(be, z, 5, 5, idx);
    for (int i = 0; i < 5; i++) assert_int_equal(idx[i], i);
    end_backend(be);
}

/* naive causal GQA over one sequence of length np + nq where the first np are the prefix; with a
 * window w > 0 query position p sees keys p - w < t <= p; with sinks, exp(sinks[h]) joins head h's
 * denominator */
/* the attention scale both helpers below use (0: 1/sqrt(head_dim), the op's default), and the
 * precision attention_host_ws asks for (m2d_attn_args.prec) */
static float g_attn_scale;
static m2d_precision g_attn_prec;

static void attention_naive_ws(const float *q, const float *k, const float *v, int np, int nq, int H, int KV, int hd,
                               int window, const float *sinks, float *out) {
    attention_f64(q, k, v, np, nq, H, KV, hd, window, sinks, g_attn_scale != 0 ? g_attn_scale : 1 / sqrt(hd), out);
}

static void attention_naive(const float *q, const float *k, const float *v, int np, int nq, int H, int KV, int hd,
                            float *out) {
    attention_naive_ws(q, k, v, np, nq, H, KV, hd, 0, NULL, out);
}

/* the attention op on host arrays: segment q/k/v of nq rows, prefix (kp, vp) as a cache of np rows;
 * WINDOW and SINKS (fp32 [H] or NULL) as in m2d_attn_args */
static void attention_host_ws(m2d_backend *be, const float *q, const float *k, const float *v, int nq, const float *kp,
                              const float *vp, int np, int H, int KV, int hd, int window, const float *sinks, float *o) {
    size_t qb = sizeof(float) * nq * H * hd, kb = sizeof(float) * nq * KV * hd, pb = sizeof(float) * KV * np * hd;
    m2d_buf *Qb = upload(be, q, qb), *Kb = upload(be, k, kb), *Vb = upload(be, v, kb), *Ob = be->ops->alloc(be, qb);
    m2d_buf *KP = np ? upload(be, kp, pb) : NULL, *VP = np ? upload(be, vp, pb) : NULL;
    m2d_tensor st;
    m2d_weight *sw = sinks ? weight_of(be, &st, M2D_F32, sinks, H, 0) : NULL;
    m2d_attn_args a = {.q = m2d_mat_of(Qb, 0, nq, H * hd, H * hd), .k = m2d_mat_of(Kb, 0, nq, KV * hd, KV * hd),
                       .v = m2d_mat_of(Vb, 0, nq, KV * hd, KV * hd), .k_cache = KP, .v_cache = VP, .cache_off = 0,
                       .head_stride = (size_t)np * hd, .np = np, .n_heads = H, .n_kv = KV, .head_dim = hd,
                       .out = m2d_mat_of(Ob, 0, nq, H * hd, H * hd), .window = window, .sinks = sw, .scale = g_attn_scale,
                       .prec = g_attn_prec};
    be->ops->attention(be, &a);
    download(be, o, Ob, qb);
    m2d_buf *all[] = {Qb, Kb, Vb, Ob, KP, VP};
    for (int i = 0; i < 6; i++) be->ops->release(be, all[i]);
    if (sw) be->ops->weight_free(be, sw);
}

static void attention_host(m2d_backend *be, const float *q, const float *k, const float *v, int nq, const float *kp,
                           const float *vp, int np, int H, int KV, int hd, float *o) {
    attention_host_ws(be, q, k, v, nq, kp, vp, np, H, KV, hd, 0, NULL, o);
}

/* the first NP rows of k, v ([T][KV * hd]) in the cache layout: per kv head, NP rows of hd */
static void prefix_as_cache(const float *k, const float *v, int np, int KV, int hd, float *kp, float *vp) {
    for (int g = 0; g < KV; g++)
        for (int t = 0; t < np; t++) {
            memcpy(kp + ((size_t)g * np + t) * hd, k + (size_t)t * KV * hd + g * hd, sizeof(float) * hd);
            memcpy(vp + ((size_t)g * np + t) * hd, v + (size_t)t * KV * hd + g * hd, sizeof(float) * hd);
        }
}

/* Select the backend's attention kernel number PATH (0, 1, ...): cpu's knob attention_gemm_min_rows
 * (0: the dot-product kernel, 1: GEMM blocks), cuda's attn_kernel (0: tensor cores in 3xFP16, the
 * default; 1: in 3xTF32; 2: tiles on the CUDA cores, 3: the warp-per-row reference). false when
 * the backend has no such kernel; path 0 always runs (a backend with one kernel has neither knob). */
static bool attention_path(m2d_backend *be, int path) {
    static const int cpu_min_rows[2] = {1 << 30, 1}, cuda_kernel[4] = {3, 2, 1, 0};
    if (path < 2 && be->ops->tune(be, "attention_gemm_min_rows", cpu_min_rows[path]) == 0) return true;
    if (path < 4 && be->ops->tune(be, "attn_kernel", cuda_kernel[path]) == 0) return true;
    return path == 0;
}

/* |o - r| < tol over n outputs of attention kernel PATH; a failure names the kernel, the case and
 * the difference first (a GPU run's log is all its next session reads) */
static void attention_close(const float *o, const float *r, size_t n, double tol, int path, const char *what) {
    double d = max_abs_diff(o, r, n);
    if (!(d < tol)) fprintf(stderr, "attention kernel %d, %s: max |d| = %.3g (allowed %.3g)\n", path, what, d, tol);
    assert_true(d < tol);
}

/* attention inputs: q [nq][H * hd], k and v [np + nq][KV * hd] of N(0,1) values (drawn in that
 * order from SEED), and the first np rows of k and v as a cache (kp, vp) */
typedef struct {
    float *q, *k, *v, *kp, *vp;
} attn_inputs;

static attn_inputs attn_inputs_new(uint64_t seed, int np, int nq, int H, int KV, int hd) {
    size_t T = (size_t)(np + nq);
    attn_inputs in = {malloc(sizeof(float) * nq * H * hd), malloc(sizeof(float) * T * KV * hd),
                      malloc(sizeof(float) * T * KV * hd), malloc(sizeof(float) * KV * np * hd + 1),
                      malloc(sizeof(float) * KV * np * hd + 1)};
    fill_normal(&seed, in.q, (size_t)nq * H * hd, 1);
    fill_normal(&seed, in.k, T * KV * hd, 1);
    fill_normal(&seed, in.v, T * KV * hd, 1);
    prefix_as_cache(in.k, in.v, np, KV, hd, in.kp, in.vp);
    return in;
}

static void attn_inputs_free(attn_inputs *in) {
    free(in->q), free(in->k), free(in->v), free(in->kp), free(in->vp);
}

static void op_attention_causal_gqa_on(const char *backend) {
    uint64_t st = 3;
    int H = 4, KV = 2, hd = 20, np = 5, nq = 70; /* 70 > one row block; hd not a multiple of 16 */
    int T = np + nq;
    float *q = malloc(sizeof(float) * nq * H * hd), *k = malloc(sizeof(float) * T * KV * hd),
          *v = malloc(sizeof(float) * T * KV * hd), *o = malloc(sizeof(float) * nq * H * hd),
          *r = malloc(sizeof(float) * nq * H * hd);
    fill_normal(&st, q, (size_t)nq * H * hd, 1);
    fill_normal(&st, k, (size_t)T * KV * hd, 1);
    fill_normal(&st, v, (size_t)T * KV * hd, 1);
    attention_naive(q, k, v, np, nq, H, KV, hd, r);
    /* prefix as a cache: [KV][np][hd] */
    float *kp = malloc(sizeof(float) * KV * np * hd), *vp = malloc(sizeof(float) * KV * np * hd);
    prefix_as_cache(k, v, np, KV, hd, kp, vp);
    m2d_backend *be = new_backend(backend, 2);
    float *o2 = malloc(sizeof(float) * T * H * hd), *r2 = malloc(sizeof(float) * T * H * hd),
          *q2 = malloc(sizeof(float) * T * H * hd);
    fill_normal(&st, q2, (size_t)T * H * hd, 1);
    attention_naive(q2, k, v, 0, T, H, KV, hd, r2);
    for (int path = 0; attention_path(be, path); path++) {
        attention_host(be, q, k + np * KV * hd, v + np * KV * hd, nq, kp, vp, np, H, KV, hd, o);
        /* scores are dots of 20 N(0,1) pairs (|s| ~ 5): fp32 error ~ 20 * 6e-8 * 20; weights and
         * outputs are convex combinations of N(0,1) values: 1e-5 leaves a wide margin */
        attention_close(o, r, (size_t)nq * H * hd, 1e-5, path, "causal GQA, hd 20, a cached prefix");
        /* no prefix: the whole sequence as one segment */
        attention_host(be, q2, k, v, T, NULL, NULL, 0, H, KV, hd, o2);
        attention_close(o2, r2, (size_t)T * H * hd, 1e-5, path, "causal GQA, hd 20, one segment");
    }
    end_backend(be);
    free(q); free(k); free(v); free(o); free(r); free(kp); free(vp); free(o2); free(r2); free(q2);
}

/* backend.h: a weight made resident (the CPU: prepared in its kernel's layout; a GPU: uploaded)
 * gives the bits it gave as stored, in every precision. In bf16 at many inner dimensions past 768,
 * oneDNN's AMX kernels sum k in other blocks for a prepared weight than for one as stored (gemm.c
 * m2d_gemm_prepare_exact; measured: k = 999 and 6,144 at 512 rows), so the CPU backend keeps such
 * weights as stored there. The shapes are none the probe tries (700 and 1,300 rows; last slices 8
 * and 88 columns wide after one and two full ones). Exact: one machine, one kernel, the same
 * operands. Returns whether a resident copy was made. */
static int resident_same_bits(const char *backend, m2d_precision prec, int m, int out, int in) {
    uint64_t st = (uint64_t)in;
    float *x = malloc(sizeof(float) * m * in), *y1 = malloc(sizeof(float) * m * out), *y2 = malloc(sizeof(float) * m * out);
    uint16_t *w = malloc(sizeof(uint16_t) * out * in);
    fill_normal(&st, x, (size_t)m * in, 1);
    for (size_t i = 0; i < (size_t)out * in; i++) w[i] = m2d_f32_to_bf16((float)tu_rand_normal(&st));
    m2d_backend_opts o = {.n_threads = 2, .precision = prec};
    m2d_backend *be;
    if (m2d_backend_new(backend, &o, &be)) fail_msg("%s", m2d_errmsg());
    be->ops->enter(be);
    m2d_tensor t;
    m2d_weight *wh = weight_of(be, &t, M2D_BF16, w, out, in);
    m2d_buf *xb = upload(be, x, sizeof(float) * m * in), *yb = be->ops->alloc(be, sizeof(float) * m * out);
    m2d_mat X = m2d_mat_of(xb, 0, m, in, in), Y = m2d_mat_of(yb, 0, m, out, out);
    be->ops->gemm(be, &X, wh, 0, &Y, 0.0f, prec);
    download(be, y1, yb, sizeof(float) * m * out);
    int resident = be->ops->resident_bytes && be->ops->resident_bytes(be, wh) > 0;
    if (be->ops->make_resident) assert_int_equal(be->ops->make_resident(be, wh, NULL), 0);
    assert_int_equal(be->ops->resident_bytes(be, wh), 0); /* done, or kept as stored: nothing left to do */
    if (strcmp(backend, "cpu") == 0) resident = m2d_cpu_weight_prepared(wh); /* a device always uploads */
    be->ops->gemm(be, &X, wh, 0, &Y, 0.0f, prec);
    download(be, y2, yb, sizeof(float) * m * out);
    size_t differ = 0;
    for (size_t i = 0; i < (size_t)m * out; i++) differ += memcmp(&y1[i], &y2[i], sizeof(float)) != 0;
    if (differ)
        fail_msg("%s, %s, %d x %d x %d: %zu of %d results change when the weight is made resident", backend,
                 m2d_precision_name(prec), m, out, in, differ, m * out);
    be->ops->release(be, xb), be->ops->release(be, yb);
    be->ops->weight_free(be, wh);
    end_backend(be);
    free(x), free(y1), free(y2), free(w);
    return resident;
}

/* k = 8, 264 columns: a weight under M2D_GEMM_DNNL_MIN_WEIGHT takes sgemm and its fp32 copy on the CPU (uploaded on
 * a GPU), so something is made resident there on every machine and the check is not vacuous; at the
 * other k whether a copy is made is the probe's answer on this CPU (printed). */
static void op_resident_weights_keep_bits_on(const char *backend) {
    static const int ins[] = {8, 96, 999, 2100, 6144}, shapes[][2] = {{700, 264}, {1300, 600}};
    for (size_t i = 0; i < sizeof ins / sizeof *ins; i++)
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
            for (int p = M2D_PREC_FP32; p <= M2D_PREC_BF16; p++) {
                int m = shapes[s][0], out = shapes[s][1];
                int resident = resident_same_bits(backend, (m2d_precision)p, m, out, ins[i]);
                if (ins[i] == 8 && s == 0) assert_true(resident);
                else if (s == 0)
                    print_message("%s, %s, k = %d: %s\n", backend, m2d_precision_name((m2d_precision)p), ins[i],
                                  resident ? "made resident" : "kept as stored");
            }
}

/* One product X·Wᵀ on the cpu backend with the gemm_kernel knob at KERNEL, W as stored or (RESIDENT)
 * made resident before the knob is set: a prepared copy is in the layout of the kernel of its day. */
static void cpu_product(m2d_precision prec, int kernel, int resident, const float *x, int m, const uint16_t *w, int out,
                        int in, float *y) {
    m2d_backend_opts o = {.n_threads = 2, .precision = prec};
    m2d_backend *be;
    if (m2d_backend_new("cpu", &o, &be)) fail_msg("%s", m2d_errmsg());
    be->ops->enter(be);
    m2d_tensor t;
    m2d_weight *wh = weight_of(be, &t, M2D_BF16, w, out, in);
    if (resident) assert_int_equal(be->ops->make_resident(be, wh, NULL), 0);
    assert_int_equal(be->ops->tune(be, "gemm_kernel", kernel), 0);
    m2d_buf *xb = upload(be, x, sizeof(float) * m * in), *yb = be->ops->alloc(be, sizeof(float) * m * out);
    m2d_mat X = m2d_mat_of(xb, 0, m, in, in), Y = m2d_mat_of(yb, 0, m, out, out);
    be->ops->gemm(be, &X, wh, 0, &Y, 0.0f, prec);
    download(be, y, yb, sizeof(float) * m * out);
    be->ops->release(be, xb), be->ops->release(be, yb);
    be->ops->weight_free(be, wh);
    end_backend(be);
}

/* A kernel chosen after weights were made resident (gemm_kernel 1 sgemm, 2 onednn, 3 own) gives the
 * bits of weights as stored under that kernel: a copy prepared for another kernel is not read (it
 * would sum in the old kernel's order). 2,112 elements take sgemm's fp32 copy under auto, 312,000
 * oneDNN's layout where it has a native kernel. Exact: one machine, the same kernel, the same operands. */
static void cpu_resident_weights_follow_a_later_kernel(void **state) {
    (void)state;
    static const int shapes[][3] = {{37, 264, 8}, {300, 600, 520}}; /* m, out, in */
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int p = M2D_PREC_FP32; p <= M2D_PREC_BF16; p++)
            for (int kernel = 1; kernel <= 3; kernel++) {
                int m = shapes[s][0], out = shapes[s][1], in = shapes[s][2];
                uint64_t st = 5;
                float *x = malloc(sizeof(float) * m * in), *y1 = malloc(sizeof(float) * m * out),
                      *y2 = malloc(sizeof(float) * m * out);
                uint16_t *w = malloc(sizeof(uint16_t) * out * in);
                fill_normal(&st, x, (size_t)m * in, 1);
                for (size_t i = 0; i < (size_t)out * in; i++) w[i] = m2d_f32_to_bf16((float)tu_rand_normal(&st));
                cpu_product((m2d_precision)p, kernel, 0, x, m, w, out, in, y1);
                cpu_product((m2d_precision)p, kernel, 1, x, m, w, out, in, y2);
                if (memcmp(y1, y2, sizeof(float) * (size_t)m * out) != 0)
                    fail_msg("%s, %d x %d x %d, gemm_kernel %d set after make_resident: other bits than as stored",
                             m2d_precision_name((m2d_precision)p), m, out, in, kernel);
                free(x), free(y1), free(y2), free(w);
            }
}

/* log p(target) of one hidden row (1, 0) through an fp32 head [V, 2] whose rows [lo, hi) are (-inf, 0)
 * (logit -inf: masked) and the others 0 (logit 0) */
static double masked_logprob(const char *backend, int V, int lo, int hi, int target) {
    m2d_backend *be = new_backend(backend, 2);
    float *w = calloc((size_t)V * 2, sizeof(float)), h[2] = {1, 0};
    for (int v = lo; v < hi; v++) w[2 * v] = -INFINITY;
    m2d_tensor t;
    m2d_weight *wh = weight_of(be, &t, M2D_F32, w, V, 2);
    int32_t tg = target;
    double lp = 0;
    m2d_buf *hb = upload(be, h, sizeof h), *tb = upload(be, &tg, sizeof tg), *lb = be->ops->alloc(be, sizeof lp);
    m2d_mat H = m2d_mat_of(hb, 0, 1, 2, 2);
    be->ops->logprobs(be, &H, wh, V, tb, lb, M2D_PREC_FP32);
    download(be, &lp, lb, sizeof lp);
    be->ops->release(be, hb), be->ops->release(be, tb), be->ops->release(be, lb);
    be->ops->weight_free(be, wh);
    end_backend(be);
    free(w);
    return lp;
}

/* The streaming log-sum-exp over vocabulary chunks where a whole chunk is masked (-inf): the first
 * chunks, the last one, and part of one (V = 2 x 16,384 + 3: whole chunks of the CPU's 4,096 and the
 * GPU's 16,384 alike). Each unmasked logit is 0, so log p = -log(unmasked rows); every term is
 * exp(0) within 2 float ulps (vexp.h) and the sum is in fp64: 1e-6 is far outside that and far
 * inside a wrong count. A masked chunk had made the result NaN (-inf - -inf). */
static void op_logprobs_masked_chunks_on(const char *backend) {
    enum { C = 16384, V = 2 * C + 3 };
    static const int cases[][3] = {{0, C, C}, {2 * C, V, 0}, {0, 16000, C}}; /* lo, hi, target */
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        double lp = masked_logprob(backend, V, cases[i][0], cases[i][1], cases[i][2]);
        double want = -log((double)(V - (cases[i][1] - cases[i][0])));
        if (!(fabs(lp - want) < 1e-6))
            fail_msg("%s: rows [%d, %d) masked: log p = %.9g, want %.9g", backend, cases[i][0], cases[i][1], lp, want);
    }
}
EACH_BACKEND(op_logprobs_masked_chunks)

static void op_convert_parallel_on(const char *backend) {
    size_t n = (1 << 19) + 77;
    uint16_t *b = malloc(n * 2);
    float *f = malloc(n * 4);
    for (size_t i = 0; i < n; i++) b[i] = (uint16_t)(i * 2654435761u >> 7);
    m2d_backend *be = new_backend(backend, 2);
    m2d_tensor t;
    m2d_weight *wh = weight_of(be, &t, M2D_BF16, b, (int64_t)n, 0);
    be->ops->weight_f32(be, wh, 3, (int64_t)n - 3, f);
    for (size_t i = 0; i < n - 3; i++) {
        float ref = m2d_bf16_to_f32(b[i + 3]);
        assert_memory_equal(&f[i], &ref, 4); /* exact on every CPU: bf16 -> fp32 is a 16-bit shift, NaNs included */
    }
    be->ops->weight_free(be, wh);
    end_backend(be);
    free(b);
    free(f);
}


EACH_BACKEND(op_matmul_matches_loops)
EACH_BACKEND(op_resident_weights_keep_bits)
EACH_BACKEND(op_rmsnorm_analytic)
EACH_BACKEND(op_rope_rotate_half)
EACH_BACKEND(op_rope_variants)
EACH_BACKEND(op_bias_and_clamp)
EACH_BACKEND(op_sigmoid_scale)
EACH_BACKEND(op_softmax_and_swiglu)
EACH_BACKEND(op_topk_ties_to_lower_index)
EACH_BACKEND(op_attention_causal_gqa)
EACH_BACKEND(op_convert_parallel)

/* ---- ops of the GPT-OSS / Mixtral families (window, sinks, biases, clamped SwiGLU, top-k softmax) ---- */

/* sliding window and sinks, both kernels, with and without a cached prefix; the window cuts into
 * the prefix and into the segment */
static void op_attention_window_sinks_on(const char *backend) {
    if (lacks(backend, M2D_CAP(M2D_CAP_ATTN_WINDOW) | M2D_CAP(M2D_CAP_ATTN_SINKS))) return;
    int H = 4, KV = 2, hd = 16, np = 9, nq = 70;
    attn_inputs in = attn_inputs_new(21, np, nq, H, KV, hd);
    const float *q = in.q, *k = in.k, *v = in.v, *kp = in.kp, *vp = in.vp;
    float *o = malloc(sizeof(float) * nq * H * hd), *r = malloc(sizeof(float) * nq * H * hd),
          sinks[4] = {0.5f, -3.0f, 4.0f, 0.0f};
    m2d_backend *be = new_backend(backend, 2);
    int windows[4] = {0, 1, 5, 40};
    for (int wi = 0; wi < 4; wi++)
        for (int sk = 0; sk < 2; sk++)
            for (int path = 0; attention_path(be, path); path++) {
                const float *sn = sk ? sinks : NULL;
                attention_naive_ws(q, k, v, np, nq, H, KV, hd, windows[wi], sn, r);
                attention_host_ws(be, q, k + np * KV * hd, v + np * KV * hd, nq, kp, vp, np, H, KV, hd, windows[wi], sn, o);
                /* as op_attention_causal_gqa: scores of 16-term dots, convex combinations (the sink
                 * only scales them down) */
                attention_close(o, r, (size_t)nq * H * hd, 1e-5, path, "window and sinks, a cached prefix");
                attention_naive_ws(q, k, v, 0, nq, H, KV, hd, windows[wi], sn, r);
                attention_host_ws(be, q, k, v, nq, NULL, NULL, 0, H, KV, hd, windows[wi], sn, o);
                attention_close(o, r, (size_t)nq * H * hd, 1e-5, path, "window and sinks, one segment");
            }
    /* a window of 1 with no sink is the value row itself: exact on every CPU (a softmax over one
     * score is exp(0) / exp(0) = 1 exactly, and 1 x v = v) */
    attention_host_ws(be, q, k, v, nq, NULL, NULL, 0, H, KV, hd, 1, NULL, o);
    for (int i = 0; i < nq; i++)
        for (int h = 0; h < H; h++)
            for (int c = 0; c < hd; c++) assert_true(o[(size_t)i * H * hd + h * hd + c] == v[(size_t)i * KV * hd + (h / 2) * hd + c]);
    end_backend(be);
    attn_inputs_free(&in);
    free(o); free(r);
}

/* Attention at sizes where the kernels work in blocks: query rows in several blocks and a partial
 * last one, a cached prefix, a window cutting through blocks and the prefix, sinks; every kernel
 * of the backend (attention_path) against the float64 loops and against its first kernel.
 * Sizes: head_dim 64, 300 rows (the CPU's GEMM attention takes its oneDNN kernel: K and Vᵀ of >=
 * 4096 elements); head_dim 128, 200 rows (the largest head of cuda's tensor-core kernel).
 * Tolerance: a score is a dot of hd N(0,1) pairs (sum of |q_j k_j| ~ 0.64 hd), each product
 * rounded to fp32 (cuda's 3xTF32: within ~2^-22 of it) and summed in fp32: a random-walk error of
 * ~sqrt(hd) * 6e-8 * 1 ~ 7e-7 at hd = 128, 6e-8 after the 1/sqrt(hd) scale; an output is a convex
 * combination of up to 370 N(0,1) values (|v| < 5) summed in fp32 in blocks of <= 64 terms, ~1e-6
 * typical (measured 7e-7 at hd = 64 on the CPU). 1e-5 everywhere; the worst is printed. */
static double attention_blocks_check(m2d_backend *be, int hd, int np, int nq, const int windows[3]) {
    int H = 4, KV = 2;
    attn_inputs in = attn_inputs_new(77, np, nq, H, KV, hd);
    const float *q = in.q, *k = in.k, *v = in.v, *kp = in.kp, *vp = in.vp;
    size_t n = (size_t)nq * H * hd;
    float *o = malloc(sizeof(float) * n), *o0 = malloc(sizeof(float) * n), *r = malloc(sizeof(float) * n),
          sinks[4] = {1.0f, -2.0f, 3.0f, 0.0f};
    double worst = 0;
    for (int wi = 0; wi < 3; wi++)
        for (int pre = 0; pre < 2; pre++) {
            const float *sn = wi == 1 ? sinks : NULL;
            const float *ks = k + (size_t)np * KV * hd, *vs = v + (size_t)np * KV * hd; /* the segment */
            if (pre) attention_naive_ws(q, k, v, np, nq, H, KV, hd, windows[wi], sn, r);
            else attention_naive_ws(q, ks, vs, 0, nq, H, KV, hd, windows[wi], sn, r);
            for (int path = 0; attention_path(be, path); path++) {
                attention_host_ws(be, q, ks, vs, nq, kp, vp, pre ? np : 0, H, KV, hd, windows[wi], sn, path ? o : o0);
                worst = fmax(worst, max_abs_diff(path ? o : o0, r, n));
                char what[96];
                snprintf(what, sizeof what, "in blocks, hd %d, %d rows, window %d, %s", hd, nq, windows[wi],
                         pre ? "a cached prefix" : "one segment");
                attention_close(path ? o : o0, r, n, 1e-5, path, what);
                if (path) attention_close(o, o0, n, 1e-5, path, "in blocks, against kernel 0");
            }
        }
    attn_inputs_free(&in);
    free(o); free(o0); free(r);
    return worst;
}

static void op_attention_gemm_blocks_on(const char *backend) {
    if (lacks(backend, M2D_CAP(M2D_CAP_ATTN_WINDOW) | M2D_CAP(M2D_CAP_ATTN_SINKS))) return;
    m2d_backend *be = new_backend(backend, 2);
    const int w64[3] = {0, 50, 200}, w128[3] = {0, 100, 9};
    double d64 = attention_blocks_check(be, 64, 37, 300, w64), d128 = attention_blocks_check(be, 128, 70, 200, w128);
    printf("%s: attention in blocks, every kernel: max |d| vs float64 = %.2g (hd 64, 300 rows), %.2g (hd 128, 200 rows)\n",
           backend, d64, d128);
    end_backend(be);
}

/* a given softmax scale (MLA's mscale) on both attention paths, with a cached prefix, against the
 * float64 loops (as op_attention_causal_gqa: 1e-5) */
static void op_attention_scale_on(const char *backend) {
    if (lacks(backend, M2D_CAP(M2D_CAP_ATTN_SCALE))) return;
    uint64_t st = 9;
    int H = 2, KV = 2, hd = 24, np = 4, nq = 40, T = np + nq;
    float *q = malloc(sizeof(float) * nq * H * hd), *k = malloc(sizeof(float) * T * KV * hd),
          *v = malloc(sizeof(float) * T * KV * hd), *o = malloc(sizeof(float) * nq * H * hd),
          *r = malloc(sizeof(float) * nq * H * hd), *kp = malloc(sizeof(float) * KV * np * hd),
          *vp = malloc(sizeof(float) * KV * np * hd);
    fill_normal(&st, q, (size_t)nq * H * hd, 1);
    fill_normal(&st, k, (size_t)T * KV * hd, 1);
    fill_normal(&st, v, (size_t)T * KV * hd, 1);
    for (int g = 0; g < KV; g++) /* the prefix in the cache layout: per kv head, np rows */
        for (int t = 0; t < np; t++)
            for (int c = 0; c < hd; c++) {
                kp[((size_t)g * np + t) * hd + c] = k[(size_t)t * KV * hd + g * hd + c];
                vp[((size_t)g * np + t) * hd + c] = v[(size_t)t * KV * hd + g * hd + c];
            }
    m2d_backend *be = new_backend(backend, 1);
    g_attn_scale = 0.37f;
    for (int path = 0; attention_path(be, path); path++) {
        attention_naive_ws(q, k, v, np, nq, H, KV, hd, 0, NULL, r);
        attention_host_ws(be, q, k + np * KV * hd, v + np * KV * hd, nq, kp, vp, np, H, KV, hd, 0, NULL, o);
        attention_close(o, r, (size_t)nq * H * hd, 1e-5, path, "a given scale");
    }
    g_attn_scale = 0;
    attention_host_ws(be, q, k + np * KV * hd, v + np * KV * hd, nq, kp, vp, np, H, KV, hd, 0, NULL, r);
    assert_true(max_abs_diff(o, r, (size_t)nq * H * hd) > 1e-3); /* the scale does change the result */
    end_backend(be);
    free(q); free(k); free(v); free(o); free(r); free(kp); free(vp);
}

/* bf16 copies of x's n values, as floats, by the reference's own rounding (attn_ref.h) */
static float *bf16_copy(const float *x, size_t n) {
    float *r = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) r[i] = attn_ref_bf16(x[i]);
    return r;
}

static double mean_abs_diff(const float *a, const float *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += fabs((double)a[i] - b[i]);
    return s / (double)n;
}

/* Attention on bf16 operands (m2d_attn_args.prec BF16), every kernel of the backend, with a
 * cached prefix, a window and sinks, against float64 on the bf16-rounded q, k, v:
 * - within 2^-9 max|v| + 1e-5 of the float64 result with unrounded numerators: rounding a
 *   numerator p to bf16 moves it by at most 2^-9 p, and the output is Σ p v / Σ p, so by at most
 *   2^-9 max|v|; the rest is op_attention_gemm_blocks' fp32 error (< 1e-5) — scores of bf16
 *   operands are exact products summed in fp32;
 * - nearer to the float64 result whose numerators are rounded (the kernel's rule) than to the
 *   unrounded one, on average over the outputs, by 4x: the kernel's numerators differ from the
 *   float64 ones by fp32 roundings (~1e-7 relative), so they round to the same bf16 but for the
 *   few within that of a rounding boundary (~1e-7 / 2^-9 ~ 1e-4 of them), while unrounded ones are
 *   2^-9-relative away (measured on the CPU: a mean > 1,000x nearer);
 * - and not the fp32 op: q, k, v's rounding moves the outputs by ~2^-9 relative (> 1e-4). */
static void op_attention_bf16_on(const char *backend) {
    if (lacks(backend, M2D_CAP(M2D_CAP_ATTN_BF16) | M2D_CAP(M2D_CAP_ATTN_WINDOW) | M2D_CAP(M2D_CAP_ATTN_SINKS))) return;
    int H = 4, KV = 2, hd = 64, np = 37, nq = 150;
    attn_inputs in = attn_inputs_new(41, np, nq, H, KV, hd);
    size_t n = (size_t)nq * H * hd, nkv = (size_t)(np + nq) * KV * hd;
    float *qb = bf16_copy(in.q, n), *kb = bf16_copy(in.k, nkv), *vb = bf16_copy(in.v, nkv);
    float *o = malloc(sizeof(float) * n), *o32 = malloc(sizeof(float) * n), *r = malloc(sizeof(float) * n),
          *rr = malloc(sizeof(float) * n), sinks[4] = {1.0f, -2.0f, 3.0f, 0.0f};
    double vmax = 0;
    for (size_t i = 0; i < nkv; i++) vmax = fmax(vmax, fabs(vb[i]));
    m2d_backend *be = new_backend(backend, 2);
    const int windows[2] = {0, 50};
    for (int wi = 0; wi < 2; wi++) {
        const float *sn = wi ? sinks : NULL;
        attention_f64(qb, kb, vb, np, nq, H, KV, hd, windows[wi], sn, 1 / sqrt(hd), r);
        attention_f64_p(qb, kb, vb, np, nq, H, KV, hd, windows[wi], sn, 1 / sqrt(hd), 1, rr);
        for (int path = 0; attention_path(be, path); path++) {
            g_attn_prec = M2D_PREC_BF16;
            attention_host_ws(be, in.q, in.k + (size_t)np * KV * hd, in.v + (size_t)np * KV * hd, nq, in.kp, in.vp, np,
                              H, KV, hd, windows[wi], sn, o);
            g_attn_prec = M2D_PREC_FP32;
            attention_host_ws(be, in.q, in.k + (size_t)np * KV * hd, in.v + (size_t)np * KV * hd, nq, in.kp, in.vp, np,
                              H, KV, hd, windows[wi], sn, o32);
            attention_close(o, r, n, ldexp(vmax, -9) + 1e-5, path, "bf16 operands");
            double to_rounded = mean_abs_diff(o, rr, n), to_unrounded = mean_abs_diff(o, r, n);
            printf("%s: attention kernel %d in bf16, window %d: mean |d| %.2g to rounded numerators, %.2g to unrounded; "
                   "max |d| to fp32 %.2g\n", backend, path, windows[wi], to_rounded, to_unrounded, max_abs_diff(o, o32, n));
            assert_true(to_rounded * 4 < to_unrounded);
            assert_true(max_abs_diff(o, o32, n) > 1e-4);
        }
    }
    end_backend(be);
    attn_inputs_free(&in);
    free(qb); free(kb); free(vb); free(o); free(o32); free(r); free(rr);
}
EACH_BACKEND(op_attention_bf16)

/* group-limited top-k (DeepSeek's group_limited_greedy) and the gate factor, against a float64
 * brute force: 4 groups of 3, the best 2 groups by their best p, top 3 among their experts */
static void op_route_group_limited_on(const char *backend) {
    if (lacks(backend, M2D_CAP(M2D_CAP_ROUTE_GROUPS) | M2D_CAP(M2D_CAP_ROUTE_SCALE))) return;
    enum { N = 64, E = 12, NG = 4, TG = 2, K = 3 };
    float lg[N * E], p[N * E], g[N * K];
    int32_t id[N * K];
    uint64_t st = 17;
    fill_normal(&st, lg, N * E, 1.5);
    memcpy(p, lg, sizeof lg);
    m2d_backend *be = new_backend(backend, 1);
    m2d_buf *pb = upload(be, p, sizeof p), *ib = be->ops->alloc(be, sizeof id), *gb = be->ops->alloc(be, sizeof g);
    m2d_mat P = m2d_mat_of(pb, 0, N, E, E);
    m2d_route_args ra = {.kind = M2D_ROUTER_SOFTMAX_TOPK, .k = K, .n_group = NG, .topk_group = TG, .scale = 2.5f};
    be->ops->route(be, &P, &ra, ib, gb);
    download(be, id, ib, sizeof id), download(be, g, gb, sizeof g);
    int differs = 0; /* rows where the plain top-k would pick otherwise: the grouping is exercised */
    for (int t = 0; t < N; t++) {
        double q[E], z = 0, gm[NG];
        for (int e = 0; e < E; e++) z += (q[e] = exp(lg[t * E + e]));
        for (int e = 0; e < E; e++) q[e] /= z;
        for (int c = 0; c < NG; c++) gm[c] = fmax(fmax(q[3 * c], q[3 * c + 1]), q[3 * c + 2]);
        int keep[NG] = {0}, plain = -1;
        for (int j = 0; j < TG; j++) {
            int b = -1;
            for (int c = 0; c < NG; c++)
                if (!keep[c] && (b < 0 || gm[c] > gm[b])) b = c;
            keep[b] = 1;
        }
        int taken[E] = {0};
        for (int j = 0; j < K; j++) {
            int b = -1;
            for (int e = 0; e < E; e++)
                if (keep[e / 3] && !taken[e] && (b < 0 || q[e] > q[b])) b = e;
            taken[b] = 1;
            assert_int_equal(id[t * K + j], b);
            assert_true(fabs(g[t * K + j] - 2.5 * q[b]) < 1e-6);
        }
        for (int e = 0; e < E; e++) /* an expert of a dropped group beats the k-th chosen one */
            if (!keep[e / 3] && q[e] > q[id[t * K + K - 1]]) plain = e;
        differs += plain >= 0;
    }
    assert_true(differs > 0);
    be->ops->release(be, pb), be->ops->release(be, ib), be->ops->release(be, gb);
    end_backend(be);
}

static void op_bias_and_clamped_swiglu_on(const char *backend) {
    if (lacks(backend, M2D_CAP(M2D_CAP_BIAS) | M2D_CAP(M2D_CAP_GLU_CLAMP))) return;
    m2d_backend *be = new_backend(backend, 1);
    float y[6] = {1, 2, 3, 4, 5, 6}, b[3] = {0.5f, -1, 0}, out[6];
    m2d_tensor bt;
    m2d_weight *bw = weight_of(be, &bt, M2D_F32, b, 3, 0);
    m2d_buf *yb = upload(be, y, sizeof y);
    m2d_mat Y = m2d_mat_of(yb, 0, 2, 3, 3);
    be->ops->add_bias(be, &Y, bw);
    download(be, out, yb, sizeof out);
    for (int i = 0; i < 6; i++) assert_true(out[i] == y[i] + b[i % 3]); /* one IEEE fp32 add: correctly rounded everywhere */
    /* the clamps: gate only from above, up from both sides; the +1 on up */
    float g[5] = {-20, -1, 0.5f, 7, 9}, u[5] = {-9, 0.25f, -0.5f, 8, 1}, h[5];
    m2d_buf *gb = upload(be, g, sizeof g), *ub = upload(be, u, sizeof u);
    m2d_mat G = m2d_mat_of(gb, 0, 1, 5, 5), U = m2d_mat_of(ub, 0, 1, 5, 5);
    be->ops->glu_clamp(be, &G, &U, 1.702f, 7.0f);
    download(be, h, gb, sizeof h);
    for (int i = 0; i < 5; i++) {
        double a = fmin(g[i], 7.0), c = fmin(fmax(u[i], -7.0), 7.0);
        double want = (c + 1) * a / (1 + exp(-1.702 * a));
        assert_true(fabs(h[i] - want) <= 1e-6 * fmax(1, fabs(want)));
    }
    assert_true(fabs(h[3] - 8 * 7 / (1 + exp(-1.702 * 7))) < 1e-5); /* both clamped to 7: (7 + 1) g sig */
    be->ops->release(be, yb), be->ops->release(be, gb), be->ops->release(be, ub), be->ops->weight_free(be, bw);
    end_backend(be);
}

/* GPT-OSS routing: top-k of the logits, gates a softmax over those k alone; p the full softmax */
static void op_route_topk_softmax_on(const char *backend) {
    if (lacks(backend, M2D_CAP(M2D_CAP_ROUTE_TOPK_SOFTMAX))) return;
    m2d_backend *be = new_backend(backend, 1);
    float p[6] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f, 3.0f}, ref[6], gates[3];
    memcpy(ref, p, sizeof p);
    int32_t id[3];
    m2d_buf *pb = upload(be, p, sizeof p), *ib = be->ops->alloc(be, sizeof id), *gb = be->ops->alloc(be, sizeof gates);
    m2d_mat P = m2d_mat_of(pb, 0, 1, 6, 6);
    m2d_route_args r = {.kind = M2D_ROUTER_TOPK_SOFTMAX, .k = 3};
    be->ops->route(be, &P, &r, ib, gb);
    download(be, p, pb, sizeof p), download(be, id, ib, sizeof id), download(be, gates, gb, sizeof gates);
    assert_int_equal(id[0], 5), assert_int_equal(id[1], 1), assert_int_equal(id[2], 3); /* tie 1 = 3: lower first */
    double z = exp(3.0) + 2 * exp(2.0), zall = 0;
    assert_true(fabs(gates[0] - exp(3.0) / z) < 1e-6 && fabs(gates[1] - exp(2.0) / z) < 1e-6);
    for (int e = 0; e < 6; e++) zall += exp(ref[e]);
    for (int e = 0; e < 6; e++) assert_true(fabs(p[e] - exp(ref[e]) / zall) < 1e-6);
    be->ops->release(be, pb), be->ops->release(be, ib), be->ops->release(be, gb);
    end_backend(be);
}

/* the MoE op with expert biases and the clamped activation against a direct loop, on both of the
 * CPU backend's schedules (expert-parallel and one expert at a time) */
static void op_moe_biases_clamp_on(const char *backend) {
    if (lacks(backend, M2D_CAP(M2D_CAP_MOE_BIAS) | M2D_CAP(M2D_CAP_GLU_CLAMP))) return;
    enum { N = 9, D = 12, DE = 8, E = 4, K = 2 };
    uint64_t st = 33;
    float x[N * D], w[3][E][DE * D], bias[3][E][D], y[N * D], ref[N * D] = {0}, gates[N * K];
    int32_t topk[N * K];
    fill_normal(&st, x, sizeof x / 4, 1), fill_normal(&st, &w[0][0][0], sizeof w / 4, 0.5);
    fill_normal(&st, &bias[0][0][0], sizeof bias / 4, 0.5);
    for (int t = 0; t < N; t++)
        for (int j = 0; j < K; j++) topk[t * K + j] = (t + 3 * j) % E, gates[t * K + j] = 0.25f + 0.5f * j;
    m2d_backend *be = new_backend(backend, 2);
    m2d_tensor tt[6][E];
    m2d_weight *wh[6][E];
    for (int e = 0; e < E; e++)
        for (int m = 0; m < 3; m++) {
            wh[m][e] = weight_of(be, &tt[m][e], M2D_F32, w[m][e], m == 2 ? D : DE, m == 2 ? DE : D);
            wh[3 + m][e] = weight_of(be, &tt[3 + m][e], M2D_F32, bias[m][e], m == 2 ? D : DE, 0);
        }
    for (int t = 0; t < N; t++) /* ref: sum_j gate * (down(act(gate x + bg, up x + bu)) + bd) */
        for (int j = 0; j < K; j++) {
            int e = topk[t * K + j];
            double hmid[DE];
            for (int i = 0; i < DE; i++) {
                double a = bias[0][e][i], b = bias[1][e][i];
                for (int c = 0; c < D; c++) a += (double)w[0][e][i * D + c] * x[t * D + c], b += (double)w[1][e][i * D + c] * x[t * D + c];
                a = fmin(a, 1.5), b = fmin(fmax(b, -1.5), 1.5); /* limit 1.5: some entries clamp */
                hmid[i] = (b + 1) * a / (1 + exp(-1.702 * a));
            }
            for (int o = 0; o < D; o++) {
                double s = bias[2][e][o];
                for (int i = 0; i < DE; i++) s += (double)w[2][e][o * DE + i] * hmid[i];
                ref[t * D + o] += (float)(gates[t * K + j] * s);
            }
        }
    m2d_buf *xb = upload(be, x, sizeof x), *ib = upload(be, topk, sizeof topk), *gb = upload(be, gates, sizeof gates),
            *yb = be->ops->alloc(be, sizeof y);
    for (int par = 0; par < 2; par++) {
        if (be->ops->tune(be, "expert_parallel", par) != 0 && par > 0) break;
        m2d_moe_args a = {.x = m2d_mat_of(xb, 0, N, D, D), .topk = ib, .gates = gb, .k = K, .n_experts = E, .d_ff = DE,
                          .gate = wh[0], .up = wh[1], .down = wh[2], .act = M2D_ACT_SWIGLU_CLAMP, .prec = M2D_PREC_FP32,
                          .out = m2d_mat_of(yb, 0, N, D, D), .gate_bias = wh[3], .up_bias = wh[4], .down_bias = wh[5],
                          .act_alpha = 1.702f, .act_limit = 1.5f};
        be->ops->moe(be, &a);
        download(be, y, yb, sizeof y);
        /* 12- and 8-term fp32 dots of values ~1: errors ~1e-6 */
        assert_true(max_abs_diff(y, ref, N * D) < 2e-5);
    }
    m2d_buf *all[] = {xb, ib, gb, yb};
    for (int i = 0; i < 4; i++) be->ops->release(be, all[i]);
    for (int m = 0; m < 6; m++)
        for (int e = 0; e < E; e++) be->ops->weight_free(be, wh[m][e]);
    end_backend(be);
}

/* The MoE op at BF16 with bf16 weights made resident (the cuda backend's grouped paths: the plan on
 * the device, mma.sync (k_gx) or WMMA (k_grouped) GEMMs; its per-expert path under moe_grouped = 0) against float64 loops on the
 * operands the BF16 contract rounds: x and the activation h to bf16, weights bf16 already, biases
 * fp32. Bound per output: fp32 accumulation (K terms, |err| <= ~K u sum|terms|: 1e-5 of the
 * magnitude is > 10x that for K <= 136) plus one bf16 ulp (2^-8 relative) of every h_i, since h
 * is rounded from an fp32 value where the reference rounds the float64 one and the two can fall
 * either side of a rounding boundary. A wrong expert, bias, transpose or tile edge is O(1) off. */
static void moe_bf16_case(const char *backend, int N, int D, int DE, int E, int K, int biases, int clamp_act) {
    uint64_t st = 1000 + (uint64_t)N;
    float *x = malloc(sizeof(float) * N * D), *w = malloc(sizeof(float) * 3 * E * DE * D);
    float *bias = malloc(sizeof(float) * 3 * E * D), *gates = malloc(sizeof(float) * N * K);
    float *y = malloc(sizeof(float) * N * D), *ref = calloc((size_t)N * D, sizeof(float));
    double *bound = calloc((size_t)N * D, sizeof(double)), *h = malloc(sizeof(double) * DE);
    uint16_t *wb = malloc(sizeof(uint16_t) * 3 * E * DE * D);
    int32_t *topk = malloc(sizeof(int32_t) * N * K);
    fill_normal(&st, x, (size_t)N * D, 1), fill_normal(&st, w, (size_t)3 * E * DE * D, 0.3);
    fill_normal(&st, bias, (size_t)3 * E * D, 0.5);
    for (size_t i = 0; i < (size_t)3 * E * DE * D; i++) wb[i] = m2d_f32_to_bf16(w[i]), w[i] = m2d_bf16_to_f32(wb[i]);
    for (int t = 0; t < N; t++) /* K distinct experts per token, unevenly loaded */
        for (int j = 0; j < K; j++) topk[t * K + j] = (t * t % 7 + j * (E / K)) % E, gates[t * K + j] = 0.2f + 0.3f * j;
    const float limit = 1.5f, alpha = 1.702f;
    for (int t = 0; t < N; t++)
        for (int j = 0; j < K; j++) {
            int e = topk[t * K + j];
            const float *wg = w + (size_t)e * DE * D, *wu = w + ((size_t)E + e) * DE * D, *wd = w + ((size_t)2 * E + e) * D * DE;
            for (int i = 0; i < DE; i++) {
                double a = biases ? bias[e * D + i] : 0, b = biases ? bias[(E + e) * D + i] : 0;
                for (int c = 0; c < D; c++) {
                    double xc = tu_bf16(x[t * D + c]);
                    a += (double)wg[i * D + c] * xc, b += (double)wu[i * D + c] * xc;
                }
                if (clamp_act) a = fmin(a, limit), b = fmin(fmax(b, -limit), limit);
                double v = clamp_act ? (b + 1) * a / (1 + exp(-alpha * a)) : a / (1 + exp(-a)) * b;
                h[i] = tu_bf16(v);
            }
            for (int o = 0; o < D; o++) {
                double s = biases ? bias[(2 * E + e) * D + o] : 0, mag = 0;
                for (int i = 0; i < DE; i++) s += (double)wd[o * DE + i] * h[i], mag += fabs(wd[o * DE + i] * h[i]);
                ref[t * D + o] += (float)(gates[t * K + j] * s);
                bound[t * D + o] += gates[t * K + j] * (ldexp(mag, -8) + 1e-5 * (1 + mag + fabs(s)));
            }
        }
    m2d_backend *be = new_backend(backend, 2);
    m2d_tensor *tt = malloc(sizeof(m2d_tensor) * 6 * E);
    m2d_weight **wh = malloc(sizeof(m2d_weight *) * 6 * E);
    for (int m = 0; m < 3; m++)
        for (int e = 0; e < E; e++) {
            int o = m * E + e;
            wh[o] = weight_of(be, &tt[o], M2D_BF16, wb + (size_t)o * DE * D, m == 2 ? D : DE, m == 2 ? DE : D);
            wh[3 * E + o] = weight_of(be, &tt[3 * E + o], M2D_F32, bias + (size_t)o * D, m == 2 ? D : DE, 0);
        }
    for (int i = 0; i < 6 * E && be->ops->make_resident; i++) assert_int_equal(be->ops->make_resident(be, wh[i], NULL), 0);
    m2d_buf *xb = upload(be, x, sizeof(float) * N * D), *ib = upload(be, topk, sizeof(int32_t) * N * K);
    m2d_buf *gb = upload(be, gates, sizeof(float) * N * K), *yb = be->ops->alloc(be, sizeof(float) * N * D);
    for (int grouped = 3; grouped >= 0; grouped--) { /* cuda: 3 mma.sync, 2, 1 WMMA (op timing on), 0 per expert */
        int knob = be->ops->tune(be, "moe_grouped", grouped) == 0;
        if (!knob && grouped < 3) break; /* a backend with one path runs it once */
        static const char *paths[] = {"per expert", "grouped WMMA", "grouped WMMA, loads not overlapped",
                                      "grouped mma.sync where it applies"};
        const char *path = knob ? paths[grouped] : "its one path";
        int timed = (grouped == 1 || grouped == 3) && be->ops->tune(be, "profile", 1) == 0;
        m2d_moe_args a = {.x = m2d_mat_of(xb, 0, N, D, D), .topk = ib, .gates = gb, .k = K, .n_experts = E, .d_ff = DE,
                          .gate = wh, .up = wh + E, .down = wh + 2 * E, .prec = M2D_PREC_BF16,
                          .act = clamp_act ? M2D_ACT_SWIGLU_CLAMP : M2D_ACT_SWIGLU, .out = m2d_mat_of(yb, 0, N, D, D),
                          .gate_bias = biases ? wh + 3 * E : NULL, .up_bias = biases ? wh + 4 * E : NULL,
                          .down_bias = biases ? wh + 5 * E : NULL, .act_alpha = alpha, .act_limit = limit};
        be->ops->moe(be, &a);
        download(be, y, yb, sizeof(float) * N * D);
        if (timed) assert_int_equal(be->ops->tune(be, "profile", 0), 0); /* its table on stderr */
        /* cuda: k_gx's fragments by ldmatrix, and its wide blocks: the same values in the same MMAs
         * in the same order, so the same bits */
        static const char *const what[] = {"k_gx by ldmatrix", "k_gx in wide blocks", "k_gx wide, by ldmatrix"};
        for (int v = 1; knob && grouped == 3 && v <= 3; v++) { /* bit 0: gx_ldsm, bit 1: gx_wide */
            if (be->ops->tune(be, "gx_ldsm", v & 1) || be->ops->tune(be, "gx_wide", v >> 1)) break;
            float *y2 = malloc(sizeof(float) * N * D);
            be->ops->moe(be, &a);
            download(be, y2, yb, sizeof(float) * N * D);
            assert_int_equal(be->ops->tune(be, "gx_ldsm", 0) || be->ops->tune(be, "gx_wide", 0), 0);
            assert_memory_equal(y2, y, sizeof(float) * N * D);
            print_message("%s: moe bf16 %dx%d, %d experts: %s gives the same bits\n", backend, N, D, E, what[v - 1]);
            free(y2);
        }
        double worst = 0;
        for (int i = 0; i < N * D; i++) {
            worst = fmax(worst, fabs(y[i] - ref[i]) / bound[i]);
            if (!(fabs(y[i] - ref[i]) <= bound[i]))
                fail_msg("%s moe bf16 (%s) N=%d: out[%d][%d] = %.7g, reference %.7g, bound %.3g", backend, path, N,
                         i / D, i % D, y[i], ref[i], bound[i]);
        }
        print_message("%s: moe bf16 %dx%d, %d experts (%s): worst |d| / bound = %.3f\n", backend, N, D, E, path,
                      worst);
    }
    m2d_buf *all[] = {xb, ib, gb, yb};
    for (int i = 0; i < 4; i++) be->ops->release(be, all[i]);
    for (int i = 0; i < 6 * E; i++) be->ops->weight_free(be, wh[i]);
    end_backend(be);
    free(x), free(w), free(bias), free(gates), free(y), free(ref), free(bound), free(h), free(wb), free(topk), free(tt),
        free(wh);
}

/* small and odd (D = 12: no 16-byte rows, tails everywhere) with biases and the clamped
 * activation; larger (several tiles per expert, column and inner tails) with SwiGLU */
static void op_moe_bf16_resident_on(const char *backend) {
    if (lacks(backend, M2D_CAP(M2D_CAP_MOE_BIAS) | M2D_CAP(M2D_CAP_GLU_CLAMP))) return;
    moe_bf16_case(backend, 9, 12, 8, 4, 2, 1, 1);
    moe_bf16_case(backend, 300, 136, 72, 16, 4, 0, 0);
    moe_bf16_case(backend, 70, 64, 200, 8, 3, 1, 0);
}

EACH_BACKEND(op_moe_bf16_resident)
EACH_BACKEND(op_attention_window_sinks)
EACH_BACKEND(op_attention_scale)
EACH_BACKEND(op_attention_gemm_blocks)
EACH_BACKEND(op_route_group_limited)
EACH_BACKEND(op_bias_and_clamped_swiglu)
EACH_BACKEND(op_route_topk_softmax)
EACH_BACKEND(op_moe_biases_clamp)

/* ---------------- in-memory models ---------------- */

typedef struct {
    m2d_model m;
    m2d_tensor *t; int nt, capt;
    float **bufs; int nb;
} mem_model;

static const m2d_tensor *mm_tensor(mem_model *mm, const float *src, int64_t r, int64_t c, m2d_dtype dt) {
    assert_true(mm->nt < mm->capt);
    m2d_tensor *t = &mm->t[mm->nt++];
    int64_t n = r * (c ? c : 1);
    void *data = malloc((size_t)n * m2d_dtype_size(dt));
    m2d_from_f32(dt, src, n, data);
    mm->bufs[mm->nb++] = data;
    t->name = "mem";
    t->dtype = dt;
    t->ndim = c ? 2 : 1;
    t->shape[0] = r;
    t->shape[1] = c;
    t->data = data;
    t->nbytes = (size_t)n * m2d_dtype_size(dt);
    return t;
}

static const m2d_tensor *mm_random(mem_model *mm, uint64_t *st, int64_t r, int64_t c, double scale, double mean,
                                   m2d_dtype dt) {
    int64_t n = r * (c ? c : 1);
    float *f = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) f[i] = (float)(mean + scale * tu_rand_normal(st));
    const m2d_tensor *t = mm_tensor(mm, f, r, c, dt);
    free(f);
    return t;
}

static void mm_config(mem_model *mm, int layers, int E, int k, int de, int inter) {
    m2d_config *c = &mm->m.cfg;
    memset(c, 0, sizeof *c);
    snprintf(c->arch, sizeof c->arch, "%s", E ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM");
    c->vocab_size = 300; c->hidden_size = 32; c->num_hidden_layers = layers;
    c->num_attention_heads = 4; c->num_key_value_heads = 2; c->head_dim = 16;
    c->num_experts = E; c->num_experts_per_tok = k; c->moe_intermediate_size = de; c->intermediate_size = inter;
    c->norm_topk_prob = true; c->decoder_sparse_step = 1;
    c->ops = (m2d_layer_ops){.qk_norm = M2D_QK_NORM_PER_HEAD, .router = M2D_ROUTER_SOFTMAX_TOPK, .router_renorm = true,
                             .ffn_act = M2D_ACT_SWIGLU, .rope = M2D_ROPE_NEOX};
    c->rope_theta = 10000; c->rms_norm_eps = 1e-6; c->max_position_embeddings = 128;
    c->bos_token_id = -1; c->eos_token_id = 299; c->torch_dtype = M2D_F32;
    c->layer_is_moe = calloc((size_t)layers, sizeof(bool));
    for (int l = 0; l < layers; l++) c->layer_is_moe[l] = E > 0;
    mm->capt = 16 + layers * (16 + 3 * E);
    mm->t = calloc((size_t)mm->capt, sizeof(m2d_tensor));
    mm->bufs = calloc((size_t)mm->capt, sizeof(float *));
    mm->m.layers = calloc((size_t)layers, sizeof(m2d_layer));
    mm->m.dir = "mem";
}

/* attention weights, norms, embeddings drawn from SEED (shared between the dense and the MoE twin) */
static void mm_shared(mem_model *mm, uint64_t seed, m2d_dtype dt) {
    m2d_config *c = &mm->m.cfg;
    uint64_t st = seed;
    int d = c->hidden_size, qd = c->num_attention_heads * c->head_dim, kvd = c->num_key_value_heads * c->head_dim;
    mm->m.embed = mm_random(mm, &st, c->vocab_size, d, 1.0, 0, dt);
    mm->m.lm_head = mm_random(mm, &st, c->vocab_size, d, 0.2, 0, dt);
    mm->m.final_norm = mm_random(mm, &st, d, 0, 0.1, 1, dt);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        m2d_layer *L = &mm->m.layers[l];
        L->attn_norm = mm_random(mm, &st, d, 0, 0.1, 1, dt);
        L->ffn_norm = mm_random(mm, &st, d, 0, 0.1, 1, dt);
        L->q_norm = mm_random(mm, &st, c->head_dim, 0, 0.1, 1, dt);
        L->k_norm = mm_random(mm, &st, c->head_dim, 0, 0.1, 1, dt);
        L->q_proj = mm_random(mm, &st, qd, d, 0.2, 0, dt);
        L->k_proj = mm_random(mm, &st, kvd, d, 0.2, 0, dt);
        L->v_proj = mm_random(mm, &st, kvd, d, 0.2, 0, dt);
        L->o_proj = mm_random(mm, &st, d, qd, 0.2, 0, dt);
    }
}

static void mm_random_moe(mem_model *mm, uint64_t seed, m2d_dtype dt) {
    m2d_config *c = &mm->m.cfg;
    uint64_t st = seed;
    int d = c->hidden_size, E = c->num_experts, de = c->moe_intermediate_size;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        m2d_layer *L = &mm->m.layers[l];
        L->router = mm_random(mm, &st, E, d, 0.5, 0, dt);
        L->exp_gate = calloc((size_t)E, sizeof(void *));
        L->exp_up = calloc((size_t)E, sizeof(void *));
        L->exp_down = calloc((size_t)E, sizeof(void *));
        for (int x = 0; x < E; x++) {
            L->exp_gate[x] = mm_random(mm, &st, de, d, 0.2, 0, dt);
            L->exp_up[x] = mm_random(mm, &st, de, d, 0.2, 0, dt);
            L->exp_down[x] = mm_random(mm, &st, d, de, 0.2, 0, dt);
        }
    }
}

static void mm_free(mem_model *mm) {
    for (int i = 0; i < mm->nb; i++) free(mm->bufs[i]);
    for (int l = 0; l < mm->m.cfg.num_hidden_layers; l++) {
        free((void *)mm->m.layers[l].exp_gate);
        free((void *)mm->m.layers[l].exp_up);
        free((void *)mm->m.layers[l].exp_down);
    }
    free(mm->bufs); free(mm->t); free(mm->m.layers); free(mm->m.cfg.layer_is_moe);
}

static void rand_tokens(uint64_t *st, int32_t *t, int n, int V) {
    for (int i = 0; i < n; i++) t[i] = (int32_t)(tu_rand_u64(st) % (uint64_t)V);
}

/* Dense FFN == MoE with k = E, zero router (probs 1/E, renormalised gates 1/E) and experts that are
 * blocks of the dense FFN with down_proj scaled by E. */
static void dense_equals_moe_on(const char *backend) {
    int L = 2, E = 4, de = 8, inter = E * de, d = 32;
    mem_model dense = {0}, moe = {0};
    mm_config(&dense, L, 0, 0, 0, inter);
    mm_config(&moe, L, E, E, de, 0);
    mm_shared(&dense, 42, M2D_F32);
    mm_shared(&moe, 42, M2D_F32);
    uint64_t st = 7;
    float *gate = malloc(sizeof(float) * inter * d), *up = malloc(sizeof(float) * inter * d),
          *down = malloc(sizeof(float) * d * inter), *blk = malloc(sizeof(float) * d * de), *zero = calloc((size_t)E * d, 4);
    for (int l = 0; l < L; l++) {
        fill_normal(&st, gate, (size_t)inter * d, 0.2);
        fill_normal(&st, up, (size_t)inter * d, 0.2);
        fill_normal(&st, down, (size_t)d * inter, 0.2);
        m2d_layer *DL = &dense.m.layers[l], *ML = &moe.m.layers[l];
        DL->gate_proj = mm_tensor(&dense, gate, inter, d, M2D_F32);
        DL->up_proj = mm_tensor(&dense, up, inter, d, M2D_F32);
        DL->down_proj = mm_tensor(&dense, down, d, inter, M2D_F32);
        ML->router = mm_tensor(&moe, zero, E, d, M2D_F32);
        ML->exp_gate = calloc((size_t)E, sizeof(void *));
        ML->exp_up = calloc((size_t)E, sizeof(void *));
        ML->exp_down = calloc((size_t)E, sizeof(void *));
        for (int x = 0; x < E; x++) {
            ML->exp_gate[x] = mm_tensor(&moe, gate + (size_t)x * de * d, de, d, M2D_F32);
            ML->exp_up[x] = mm_tensor(&moe, up + (size_t)x * de * d, de, d, M2D_F32);
            for (int r = 0; r < d; r++)
                for (int j = 0; j < de; j++) blk[r * de + j] = (float)E * down[(size_t)r * inter + x * de + j];
            ML->exp_down[x] = mm_tensor(&moe, blk, d, de, M2D_F32);
        }
    }
    m2d_engine *ed, *em;
    engine_on(backend, &dense.m, 2, &ed);
    engine_on(backend, &moe.m, 2, &em);
    int n = 40, V = 300;
    int32_t tok[40];
    rand_tokens(&st, tok, n, V);
    float *ld = malloc(sizeof(float) * n * V), *lm = malloc(sizeof(float) * n * V);
    assert_int_equal(m2d_engine_logits(ed, tok, n, ld), 0);
    assert_int_equal(m2d_engine_logits(em, tok, n, lm), 0);
    /* same math, different fp32 summation order (4 partial down-projections of 8 terms vs one of
     * 32, scaled by E then 1/E exactly): logits of size ~1 differ by a few ulp per layer */
    double diff = max_abs_diff(ld, lm, (size_t)n * V);
    print_message("dense vs MoE max |dlogit| = %.3g\n", diff);
    assert_true(diff < 1e-4);
    free(ld); free(lm); free(gate); free(up); free(down); free(blk); free(zero);
    m2d_engine_free(ed);
    m2d_engine_free(em);
    mm_free(&dense);
    mm_free(&moe);
}
EACH_BACKEND(dense_equals_moe)

static void build_random_moe(mem_model *mm, m2d_dtype dt) {
    mm_config(mm, 2, 8, 2, 12, 0);
    mm_shared(mm, 11, dt);
    mm_random_moe(mm, 12, dt);
}

/* log-softmax of full logits (double) */
static double lsm(const float *z, int V, int t) {
    double m = -INFINITY, s = 0;
    for (int j = 0; j < V; j++) m = fmax(m, z[j]);
    for (int j = 0; j < V; j++) s += exp((double)z[j] - m);
    return z[t] - m - log(s);
}

static void streaming_logprobs_match_logits_on(const char *backend) {
    mem_model mm = {0};
    build_random_moe(&mm, M2D_BF16);
    m2d_engine *e;
    engine_on(backend, &mm.m, 2, &e);
    int n = 50, V = 300;
    uint64_t st = 5;
    int32_t tok[50], tg[50];
    rand_tokens(&st, tok, n, V);
    rand_tokens(&st, tg, n, V);
    float *lg = malloc(sizeof(float) * n * V);
    double lp[50];
    assert_int_equal(m2d_engine_logits(e, tok, n, lg), 0);
    /* cuda: its log-sum-exp in one pass (lse_kernel 1, the default), in two (0), and in one over
     * GEMMs of 16 rows (lm_rows: three row blocks); other backends, their one way */
    for (int run = 0; run < 3; run++) {
        if (run > 0 && (m2d_engine_tune(e, "lse_kernel", run == 1 ? 0 : 1) ||
                        (run == 2 && m2d_engine_tune(e, "lm_rows", 16))))
            break;
        assert_int_equal(m2d_engine_logprobs(e, tok, n, tg, 3, lp), 0);
        /* identical hidden states and GEMMs; only the log-sum-exp order differs (double) */
        for (int t = 3; t < n; t++) assert_true(fabs(lp[t - 3] - lsm(lg + (size_t)t * V, V, tg[t])) < 1e-5);
    }
    free(lg);
    m2d_engine_free(e);
    mm_free(&mm);
}
EACH_BACKEND(streaming_logprobs_match_logits)

static void extend_and_branches_check(const char *backend, int gemm_min_rows) {
    mem_model mm = {0};
    build_random_moe(&mm, M2D_BF16);
    m2d_engine *e;
    engine_on(backend, &mm.m, 2, &e);
    /* a backend with one attention kernel has no such knob: it runs the default case only */
    if (m2d_engine_tune(e, "attention_gemm_min_rows", gemm_min_rows) != 0) {
        assert_string_not_equal(backend, "cpu");
        if (gemm_min_rows != 64) {
            m2d_engine_free(e);
            mm_free(&mm);
            return;
        }
    }
    int V = 300, np = 20;
    int lens[3] = {5, 9, 1};
    uint64_t st = 9;
    int32_t pre[20], br[3][9], tg[3][9];
    rand_tokens(&st, pre, np, V);
    for (int b = 0; b < 3; b++) {
        rand_tokens(&st, br[b], lens[b], V);
        rand_tokens(&st, tg[b], lens[b], V);
    }
    /* reference: one full forward of prefix + branch */
    double ref[3][9];
    for (int b = 0; b < 3; b++) {
        int32_t all[29], at[29];
        memcpy(all, pre, sizeof pre);
        memcpy(all + np, br[b], sizeof(int32_t) * lens[b]);
        memcpy(at + np, tg[b], sizeof(int32_t) * lens[b]);
        assert_int_equal(m2d_engine_logprobs(e, all, np + lens[b], at, np, ref[b]), 0);
    }
    m2d_kv *kv = m2d_kv_new(e, 64);
    assert_non_null(kv);
    /* prefix in two extends (exercises a non-empty prefix inside extend) */
    assert_int_equal(m2d_engine_extend(e, kv, pre, 12, NULL, NULL), 0);
    assert_int_equal(m2d_engine_extend(e, kv, pre + 12, np - 12, NULL, NULL), 0);
    assert_int_equal(m2d_kv_len(kv), np);
    /* fp32 forward of the same numbers through different attention splits: the per-row
     * dot products are summed in a different order (prefix / segment); 1e-4 on log-probs */
    for (int b = 0; b < 3; b++) {
        double lp[9];
        assert_int_equal(m2d_engine_extend(e, kv, br[b], lens[b], tg[b], lp), 0);
        for (int i = 0; i < lens[b]; i++) assert_true(fabs(lp[i] - ref[b][i]) < 1e-4);
        m2d_kv_truncate(kv, np);
    }
    double out[3][9];
    const int32_t *bt[3] = {br[0], br[1], br[2]}, *btg[3] = {tg[0], tg[1], tg[2]};
    double *blp[3] = {out[0], out[1], out[2]};
    assert_int_equal(m2d_engine_branches(e, kv, 3, bt, lens, btg, blp), 0);
    assert_int_equal(m2d_kv_len(kv), np);
    for (int b = 0; b < 3; b++)
        for (int i = 0; i < lens[b]; i++) assert_true(fabs(out[b][i] - ref[b][i]) < 1e-4);
    /* bad input */
    int32_t bad = 300;
    assert_int_equal(m2d_engine_extend(e, kv, &bad, 1, NULL, NULL), -1);
    assert_non_null(strstr(m2d_errmsg(), "out of range"));
    assert_int_equal(m2d_engine_logits(e, pre, 0, NULL), -1);
    int32_t *longw = calloc(129, sizeof(int32_t));
    assert_int_equal(m2d_engine_logits(e, longw, 129, NULL), -1);
    assert_non_null(strstr(m2d_errmsg(), "max_position_embeddings"));
    free(longw);
    m2d_kv_free(kv);
    m2d_engine_free(e);
    mm_free(&mm);
}

/* both attention kernels: per-row dot products (default for these short segments) and GEMMs */
static void extend_and_branches_match_full_forward_on(const char *backend) {
    extend_and_branches_check(backend, 64);
    extend_and_branches_check(backend, 1);
}
EACH_BACKEND(extend_and_branches_match_full_forward)

typedef struct { int calls; int expert_checked; m2d_engine *e; double maxdiff; } hook_state;

static int test_hook(void *user, const m2d_moe_event *ev) {
    hook_state *h = user;
    h->calls++;
    /* routing invariants: descending probs, gates sum to 1 */
    for (int t = 0; t < ev->n_tokens; t++) {
        double s = 0;
        for (int j = 0; j < ev->top_k; j++) {
            s += ev->gates[t * ev->top_k + j];
            if (j) assert_true(ev->probs[t * ev->n_experts + ev->topk[t * ev->top_k + j]] <=
                               ev->probs[t * ev->n_experts + ev->topk[t * ev->top_k + j - 1]]);
        }
        assert_true(fabs(s - 1) < 1e-5);
    }
    if (ev->layer == 1) return m2d_err("test hook: enough at layer %d", ev->layer); /* abort at the second layer */
    return 0;
}

static void hook_sees_routing_and_can_abort_on(const char *backend) {
    mem_model mm = {0};
    build_random_moe(&mm, M2D_F16);
    m2d_engine *e;
    engine_on(backend, &mm.m, 1, &e);
    hook_state h = {0};
    m2d_engine_set_moe_hook(e, test_hook, &h);
    int32_t tok[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    float *lg = malloc(sizeof(float) * 10 * 300);
    assert_int_equal(m2d_engine_logits(e, tok, 10, lg), -1);
    assert_int_equal(h.calls, 2);
    assert_non_null(strstr(m2d_errmsg(), "aborted the forward at layer 1: test hook: enough at layer 1"));
    /* expert function vs naive SwiGLU */
    float x[3 * 32], y[3 * 32];
    uint64_t st = 4;
    fill_normal(&st, x, 96, 1);
    assert_int_equal(m2d_engine_expert(e, 0, 5, x, 3, y), 0);
    const m2d_layer *L = &mm.m.layers[0];
    float *g = m2d_tensor_f32(L->exp_gate[5]), *u = m2d_tensor_f32(L->exp_up[5]), *dn = m2d_tensor_f32(L->exp_down[5]);
    for (int t = 0; t < 3; t++) {
        double hbuf[12];
        for (int j = 0; j < 12; j++) {
            double a = 0, b = 0;
            for (int i = 0; i < 32; i++) {
                a += (double)g[j * 32 + i] * x[t * 32 + i];
                b += (double)u[j * 32 + i] * x[t * 32 + i];
            }
            hbuf[j] = a / (1 + exp(-a)) * b;
        }
        for (int i = 0; i < 32; i++) {
            double o = 0;
            for (int j = 0; j < 12; j++) o += (double)dn[i * 12 + j] * hbuf[j];
            assert_true(fabs(o - y[t * 32 + i]) < 1e-5);
        }
    }
    assert_int_equal(m2d_engine_expert(e, 0, 8, x, 3, y), -1);
    free(g); free(u); free(dn); free(lg);
    m2d_engine_free(e);
    mm_free(&mm);
}
EACH_BACKEND(hook_sees_routing_and_can_abort)

/* The engine offers the substitution only where the backend's expert outputs do not depend on
 * the batch: on the sgemm path (this model's small experts by default) where its own fp32 kernel
 * runs (m2d_gemm_fp32_own: AVX2 + FMA; not with OpenBLAS), with oneDNN forced where its fp32 rows
 * are independent of the batch (m2d_gemm_onednn_rows_independent) or an exact-rows plan makes them
 * so (tu_routed_offered_on_onednn). Then the forward continues from the
 * hook's output and the logits are the hookless forward's bit for bit where no plan was needed
 * (exact on every CPU: the same expert outputs added in the same order); a hook returning zeros
 * moves them (the substitution is really used). */
static void hook_can_supply_the_routed_output(void **state) {
    (void)state;
    mem_model mm = {0};
    build_random_moe(&mm, M2D_BF16);
    int32_t tok[24];
    for (int i = 0; i < 24; i++) tok[i] = (i * 37 + 5) % 300;
    size_t nl = 24 * 300;
    float *ref = m2d_malloc(sizeof(float) * nl), *got = m2d_malloc(sizeof(float) * nl);
    for (int onednn = 0; onednn <= 1; onednn++) {
        m2d_engine *e;
        engine_on("cpu", &mm.m, 2, &e);
        if (onednn) assert_int_equal(m2d_engine_tune(e, "gemm_kernel", M2D_GEMM_ONEDNN), 0);
        assert_int_equal(m2d_engine_logits(e, tok, 24, ref), 0);
        tu_routed_hook_state h = {e, 0, 0, 0, 0};
        m2d_engine_set_moe_hook(e, tu_routed_hook, &h);
        assert_int_equal(m2d_engine_logits(e, tok, 24, got), 0);
        assert_int_equal(h.calls, 2);
        int offered = onednn ? tu_routed_offered_on_onednn(M2D_PREC_FP32) : m2d_gemm_fp32_own();
        assert_int_equal(h.offered, offered ? 2 : 0);
        int rows, kc;
        if (!m2d_gemm_exact_plan(M2D_PREC_FP32, &rows, &kc)) {
            assert_memory_equal(got, ref, sizeof(float) * nl);
        } else {
            /* an exact-rows plan blocks the hook's rows otherwise than the engine's GEMM: the same
             * fp32 math in another summation order, a few ulp of logits of size ~1 a layer (as
             * dense_equals_moe's 1e-4); a wrong row or expert moves them by > 1e-3 (below) */
            double d = 0;
            for (size_t i = 0; i < nl; i++) d = fmax(d, fabs(got[i] - ref[i]));
            if (!(d < 1e-4)) fail_msg("routed output from the hook: logits differ by %.3g", d);
        }
        h.zeros = 1;
        assert_int_equal(m2d_engine_logits(e, tok, 24, got), 0);
        double worst = 0;
        for (size_t i = 0; i < nl; i++) worst = fmax(worst, fabs(got[i] - ref[i]));
        if (h.offered) assert_true(worst > 1e-3);
        else assert_true(worst == 0); /* not offered: the hookless computation itself, one machine */
        m2d_engine_free(e);
    }
    free(ref);
    free(got);
    mm_free(&mm);
}

static void weight_cache_and_expert_order_give_identical_results_on(const char *backend) {
    mem_model mm = {0};
    build_random_moe(&mm, M2D_BF16);
    m2d_engine *a, *b;
    engine_on(backend, &mm.m, 2, &a);
    engine_on(backend, &mm.m, 2, &b);
    assert_true(m2d_engine_cache_weights(b, (size_t)1 << 30) > 0);
    m2d_engine_set_expert_parallel(b, 0); /* also: experts one at a time == expert-parallel */
    /* exact on every CPU: one machine, the same prepared fp32 weights (kept or prepared on use) in
     * the same GEMMs, whose results do not depend on the thread count (backend.h), summed in the
     * same order whichever thread runs an expert */
    int32_t tok[30];
    uint64_t st = 8;
    rand_tokens(&st, tok, 30, 300);
    float *la = malloc(sizeof(float) * 30 * 300), *lb = malloc(sizeof(float) * 30 * 300);
    assert_int_equal(m2d_engine_logits(a, tok, 30, la), 0);
    assert_int_equal(m2d_engine_logits(b, tok, 30, lb), 0);
    /* same fp32 weights; OpenBLAS splits GEMMs across threads by rows/columns, never along the
     * reduction, and the scatter-add runs in expert order in both paths: identical */
    assert_memory_equal(la, lb, sizeof(float) * 30 * 300);
    free(la); free(lb);
    m2d_engine_free(a);
    m2d_engine_free(b);
    mm_free(&mm);
}
EACH_BACKEND(weight_cache_and_expert_order_give_identical_results)

/* The same logits, bit for bit, at 1 and 2 threads on the tiny teacher over 384 tokens (GEMMs large
 * enough to be split across threads: backend.h promises results independent of the thread count,
 * so a run reproduces at any --threads; an earlier CPU backend sized its GEMM blocks by the thread
 * count and moved perplexity in the 8th digit). */
static void results_do_not_depend_on_thread_count_on(const char *backend) {
    const char *dir = tu_models_dir();
    if (!dir) TU_SKIP("../shared/models not found");
    char path[1024];
    snprintf(path, sizeof path, "%s/tiny-qwen3moe", dir);
    m2d_model *model;
    if (m2d_model_open(path, &model)) fail_msg("%s", m2d_errmsg());
    enum { N = 384 };
    int32_t tok[N];
    uint64_t st = 11;
    rand_tokens(&st, tok, N, model->cfg.vocab_size);
    size_t nl = (size_t)N * model->cfg.vocab_size;
    float *l1 = malloc(sizeof(float) * nl), *l2 = malloc(sizeof(float) * nl);
    m2d_engine *e1, *e2;
    engine_on(backend, model, 1, &e1);
    engine_on(backend, model, 2, &e2);
    assert_int_equal(m2d_engine_logits(e1, tok, N, l1), 0);
    assert_int_equal(m2d_engine_logits(e2, tok, N, l2), 0);
    /* exact on every CPU: one machine, the same computation; only the thread count differs, and the
     * backends' blockings (hence summation orders) do not depend on it */
    assert_memory_equal(l1, l2, sizeof(float) * nl);
    free(l1); free(l2);
    m2d_engine_free(e1);
    m2d_engine_free(e2);
    m2d_model_close(model);
}
EACH_BACKEND(results_do_not_depend_on_thread_count)


/* ---------------- layer-major passes (issue 25) ---------------- */

typedef struct { int calls, layer[64], tokens[64]; } hook_log;
static int log_hook(void *user, const m2d_moe_event *ev) {
    hook_log *h = user;
    if (h->calls < 64) h->layer[h->calls] = ev->layer, h->tokens[h->calls] = ev->n_tokens;
    h->calls++;
    return 0;
}

/* the hook's calls of two windows (10 and 7 tokens) through an engine with pass MODE */
static void hook_calls(const m2d_model *m, m2d_pass_mode mode, hook_log *h) {
    m2d_engine *e;
    if (m2d_engine_open(m, &(m2d_engine_opts){.n_threads = 1, .pass = mode}, &e)) fail_msg("%s", m2d_errmsg());
    m2d_engine_set_moe_hook(e, log_hook, h);
    int32_t tok[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    const int32_t *toks[2] = {tok, tok + 3};
    int lens[2] = {10, 7}, first[2] = {9, 6};
    double lp[2], *lps[2] = {lp, lp + 1};
    m2d_window_set set = {2, toks, lens, toks, first, lps};
    assert_int_equal(m2d_engine_logprobs_windows(e, &set, NULL), 0);
    m2d_engine_free(e);
}

/* Log-probs from row FIRST on: the last layer finishes only rows [FIRST, n) after its attention
 * (engine.c live_rows). Those rows' log-probs equal the full forward's: bit for bit where every GEMM
 * gives a row the same bits whatever the batch (fp32 on oneDNN's brgemm: every tiny-teacher weight
 * is >= 4096 elements, m2d_gemm_onednn_rows_independent), else within fp32 summation-order noise:
 * a reordered fp32 dot product of length K moves by <= γ_K Σ|x w| (K <= 192 here: ~1e-5 relative),
 * and the log-probs (|lp| <~ 10) through the teacher's 4 layers by far less than 1e-4. */
static void last_layer_finishes_only_needed_rows(void **state) {
    (void)state;
    const char *dir = tu_models_dir();
    if (!dir) TU_SKIP("../shared/models not found");
    char *path = m2d_strfmt("%s/tiny-qwen3moe", dir);
    m2d_model *m;
    if (m2d_model_open(path, &m)) fail_msg("%s", m2d_errmsg());
    enum { N = 40, FIRST = 29 };
    int32_t tok[N + 1];
    uint64_t st = 8;
    rand_tokens(&st, tok, N + 1, m->cfg.vocab_size);
    m2d_engine *e;
    if (m2d_engine_open(m, &(m2d_engine_opts){.n_threads = 2, .precision = M2D_PREC_FP32}, &e)) fail_msg("%s", m2d_errmsg());
    assert_int_equal(m2d_engine_tune(e, "gemm_kernel", M2D_GEMM_ONEDNN), 0);
    double all[N], tail[N - FIRST];
    assert_int_equal(m2d_engine_logprobs(e, tok, N, tok + 1, 0, all), 0);
    assert_int_equal(m2d_engine_logprobs(e, tok, N, tok + 1, FIRST, tail), 0);
    if (m2d_gemm_onednn_rows_independent(M2D_PREC_FP32))
        assert_memory_equal(tail, all + FIRST, sizeof tail);
    for (int i = 0; i < N - FIRST; i++) assert_true(fabs(tail[i] - all[FIRST + i]) <= 1e-4);
    m2d_engine_free(e);
    m2d_model_close(m);
    free(path);
}

/* The pass rule (engine.h m2d_engine_plan_pass), the hook's calls in each order, and the
 * log-probs of both orders on the tiny teacher in fp32 and bf16 (bit for bit, familyckpt.h). */
static void layer_major_pass(void **state) {
    (void)state;
    mem_model mm = {0};
    build_random_moe(&mm, M2D_F16);
    size_t w = m2d_engine_weight_bytes(&mm.m), big = 0;
    for (int l = 0; l < mm.m.cfg.num_hidden_layers; l++) big = M2D_MAX(big, m2d_model_layer_bytes(&mm.m, l));
    assert_false(m2d_engine_plan_pass(&mm.m, w, M2D_PASS_AUTO).layer_major);
    m2d_pass_opts o = m2d_engine_plan_pass(&mm.m, w - 1, M2D_PASS_AUTO);
    assert_true(o.layer_major);
    assert_int_equal(o.act_budget, w - 1 - big - mm.m.lm_head->nbytes);
    assert_true(m2d_engine_plan_pass(&mm.m, w, M2D_PASS_LAYER).layer_major);
    assert_false(m2d_engine_plan_pass(&mm.m, 1, M2D_PASS_WINDOW).layer_major);
    /* window-major: window 0 through layers 0, 1, then window 1; layer-major: layer 0 for both
     * windows, then layer 1 */
    hook_log a = {0}, b = {0};
    hook_calls(&mm.m, M2D_PASS_WINDOW, &a);
    hook_calls(&mm.m, M2D_PASS_LAYER, &b);
    assert_int_equal(a.calls, 4), assert_int_equal(b.calls, 4);
    const int wl[4] = {0, 1, 0, 1}, wt[4] = {10, 10, 7, 7}, ll[4] = {0, 0, 1, 1}, lt[4] = {10, 7, 10, 7};
    assert_memory_equal(a.layer, wl, sizeof wl), assert_memory_equal(a.tokens, wt, sizeof wt);
    assert_memory_equal(b.layer, ll, sizeof ll), assert_memory_equal(b.tokens, lt, sizeof lt);
    mm_free(&mm);
    const char *dir = tu_models_dir();
    if (!dir) TU_SKIP("../shared/models not found");
    char *path = m2d_strfmt("%s/tiny-qwen3moe", dir), *tmp = tu_tmpdir();
    m2d_model *m;
    if (m2d_model_open(path, &m)) fail_msg("%s", m2d_errmsg());
    enum { N = 48 };
    int32_t tok[N + 1];
    uint64_t st = 5;
    rand_tokens(&st, tok, N + 1, m->cfg.vocab_size);
    tu_layer_major_check(m, tok, tok + 1, N, tmp, M2D_PREC_FP32);
    tu_layer_major_check(m, tok, tok + 1, N, tmp, M2D_PREC_BF16);
    /* over the budget: groups of windows when re-reading the weights moves fewer bytes than spilling
     * (200 windows of 48 tokens, 7.03 MiB of residual streams, a budget of half of them: 2 groups
     * read the 27.1 MiB of weights once more; a spill writes and reads back the other 3.52 MiB at
     * each of 4 layers, 28.1 MiB), else one spilled pass; forced either way */
    {
        enum { NW = 200 };
        const int32_t *tk[NW], *tg[NW];
        int ln[NW], fs[NW];
        double *lpw[NW], one[N];
        for (int w = 0; w < NW; w++) tk[w] = tok, tg[w] = tok + 1, ln[w] = N, fs[w] = N - 1, lpw[w] = one;
        m2d_window_set many = {NW, tk, ln, tg, fs, lpw};
        size_t layer = 0, acts = (size_t)NW * N * m->cfg.hidden_size * sizeof(float);
        for (int l = 0; l < m->cfg.num_hidden_layers; l++) layer = M2D_MAX(layer, m2d_model_layer_bytes(m, l));
        const m2d_act_mode acts_mode[3] = {M2D_ACT_AUTO, M2D_ACT_SPILL, M2D_ACT_GROUPS};
        const int want[3] = {2, 1, 2};
        for (int i = 0; i < 3; i++) {
            m2d_engine *g;
            m2d_engine_opts go = {.n_threads = 1, .pass = M2D_PASS_LAYER, .act = acts_mode[i],
                                  .mem_budget = layer + m->lm_head->nbytes + acts / 2};
            assert_int_equal(m2d_engine_open(m, &go, &g), 0);
            assert_int_equal(m2d_engine_layer_major_groups(g, &many), want[i]);
            m2d_engine_free(g);
        }
    }
    /* a spill directory that cannot take the file: one line naming it, no crash */
    m2d_engine *e;
    char *missing = m2d_strfmt("%s/no-such-dir", tmp);
    m2d_engine_opts eo = {.n_threads = 1, .pass = M2D_PASS_LAYER, .mem_budget = 1, .spill_dir = missing,
                          .act = M2D_ACT_SPILL};
    assert_int_equal(m2d_engine_open(m, &eo, &e), 0);
    double lp[N], *lps[1] = {lp};
    const int32_t *toks[1] = {tok}, *tgs[1] = {tok + 1};
    int lens[1] = {N}, first[1] = {0};
    m2d_window_set set = {1, toks, lens, tgs, first, lps};
    assert_int_equal(m2d_engine_logprobs_windows(e, &set, NULL), -1);
    assert_non_null(strstr(m2d_errmsg(), "no-such-dir/.m2d-activations-"));
    assert_non_null(strstr(m2d_errmsg(), "cannot create the activation spill file"));
    m2d_engine_free(e);
    m2d_model_close(m);
    tu_rm_rf(tmp);
    free(tmp), free(path), free(missing);
}

/* ---------------- golden outputs of the tiny Qwen3-MoE ---------------- */

/* an engine on the CPU backend in precision P */
static m2d_engine *engine_at(const m2d_model *m, int threads, m2d_precision p) {
    m2d_engine *e;
    m2d_engine_opts o = {.backend = "cpu", .n_threads = threads, .precision = p};
    if (m2d_engine_open(m, &o, &e)) fail_msg("%s", m2d_errmsg());
    return e;
}


static void golden_tiny_qwen3moe_on(const char *backend) {
    const char *dir = tu_models_dir();
    if (!dir) TU_SKIP("../shared/models not found");
    char path[1024];
    snprintf(path, sizeof path, "%s/tiny-qwen3moe", dir);
    m2d_model *model;
    assert_int_equal(m2d_model_open(path, &model), 0);
    snprintf(path, sizeof path, "%s/tiny-qwen3moe/golden/tokens.txt", dir);
    char *txt = m2d_read_file(path, NULL);
    assert_non_null(txt);
    int32_t tok[64];
    int n = 0;
    for (char *p = txt, *end; n < 64 && (tok[n] = (int32_t)strtol(p, &end, 10), end != p); p = end) n++;
    assert_int_equal(n, 64);
    free(txt);
    size_t len;
    snprintf(path, sizeof path, "%s/tiny-qwen3moe/golden/logits.f32", dir);
    float *ref = (float *)(void *)m2d_read_file(path, &len);
    assert_non_null(ref);
    assert_int_equal(len, (size_t)64 * 8192 * 4);

    m2d_engine *e;
    engine_on(backend, model, 2, &e);
    tu_routing rc;
    tu_routing_init(&rc, 4, 64, 8);
    m2d_engine_set_moe_hook(e, tu_routing_hook, &rc);
    float *lg = malloc(sizeof(float) * 64 * 8192);
    assert_int_equal(m2d_engine_logits(e, tok, 64, lg), 0);

    /* logits: the reference is float64 on the same bf16 weights. Our error is fp32 rounding in
     * dot products of length <= 576 (relative ~ sqrt(K)·eps ~ 24·6e-8 ~ 1.4e-6 of the terms'
     * magnitude per dot), compounded over 4 layers × (attention + FFN) through the residual
     * stream and the final norm; logits here have |z| up to ~15, so the expected worst-case error
     * is of order 15 · 1.4e-6 · sqrt(8 sublayers) ~ 6e-5; we assert 1e-4 (measured: ~1e-5). */
    double md = max_abs_diff(lg, ref, (size_t)64 * 8192), zmax = 0;
    for (size_t i = 0; i < (size_t)64 * 8192; i++) zmax = fmax(zmax, fabs(ref[i]));
    print_message("golden: max |dlogit| = %.3g (max |logit| %.2f)\n", md, zmax);
    assert_true(md < 1e-4);

    /* routing: exactly the same experts in the same order; gates to 1e-5 */
    snprintf(path, sizeof path, "%s/tiny-qwen3moe/golden/routing.txt", dir);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[1024];
    int rows = 0;
    double gmax = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        char *p = line, *end;
        int l = (int)strtol(p, &end, 10), t = (int)strtol(end, &p, 10);
        for (int j = 0; j < 8; j++) {
            int id = (int)strtol(p, &end, 10);
            double gw = strtod(end + 1, &p);
            size_t o = ((size_t)l * 64 + t) * 8 + j;
            assert_int_equal(rc.ids[o], id);
            gmax = fmax(gmax, fabs(rc.gates[o] - gw));
        }
        rows++;
    }
    fclose(f);
    assert_int_equal(rows, 4 * 64);
    print_message("golden: routing identical, max |dgate| = %.3g\n", gmax);
    assert_true(gmax < 1e-5);

    /* mean next-token NLL through the streaming path */
    double lp[63];
    m2d_engine_set_moe_hook(e, NULL, NULL);
    /* lp[t] = log p(next[t] | tok[0..t]) with next = tokens shifted by one */
    int32_t next[64];
    for (int t = 0; t < 63; t++) next[t] = tok[t + 1];
    next[63] = 0;
    assert_int_equal(m2d_engine_logprobs(e, tok, 63, next, 0, lp), 0);
    double nll = 0;
    for (int t = 0; t < 63; t++) nll -= lp[t];
    nll /= 63;
    print_message("golden: mean NLL %.9f (reference 5.395405632827731)\n", nll);
    assert_true(fabs(nll - 5.395405632827731) < 1e-5);
    /* bf16 (issue 13: what bf16 activations change): the same NLL through a BF16 engine */
    m2d_engine *eb = engine_at(model, 2, M2D_PREC_BF16);
    assert_int_equal(m2d_engine_logprobs(eb, tok, 63, next, 0, lp), 0);
    double nllb = 0;
    for (int t = 0; t < 63; t++) nllb -= lp[t];
    nllb /= 63;
    print_message("golden: bf16 mean NLL %.9f, relative difference %.3g\n", nllb, fabs(nllb / 5.395405632827731 - 1));
    /* 4 layers, each GEMM's activations rounded to bf16 (2^-8 relative worst case per dot,
     * zero-mean): a mean over 63 tokens of log-probabilities moves by <= ~1e-3 relative; bound
     * 2e-3 (measured 7.6e-5) */
    assert_true(fabs(nllb / 5.395405632827731 - 1) < 2e-3);
    m2d_engine_free(eb);
    free(lg); free(ref);
    tu_routing_free(&rc);
    m2d_engine_free(e);
    m2d_model_close(model);
}
EACH_BACKEND(golden_tiny_qwen3moe)


/* ---------------- naive float64 reference forward: tests/reffwd.c ---------------- */

/* Checkpoints written by the testmodel helper and opened through m2d_model_open: a MoE with
 * dense layers (mlp_only_layers + decoder_sparse_step), tied embeddings, f16; a dense Qwen3; a MoE
 * with YaRN RoPE past its original context (attention factor != 1). */
static void engine_matches_naive_reference_on_checkpoints_on(const char *backend) {
    char *dir = tu_tmpdir();
    int only[1] = {0};
    for (int variant = 0; variant < 4; variant++) {
        m2d_testmodel_opts o;
        m2d_testmodel_defaults(&o);
        o.seed = 100 + (uint64_t)variant;
        o.init_std = 0.1f;
        if (variant == 0) { /* layer 0 in mlp_only_layers; sparse step 2 makes only odd layers MoE */
            o.num_hidden_layers = 4;
            o.mlp_only_layers = only;
            o.n_mlp_only_layers = 1;
            o.decoder_sparse_step = 2;
            o.tie_word_embeddings = true;
            o.dtype = M2D_F16;
            o.norm_topk_prob = false;
        } else if (variant == 1) {
            o.moe = false;
            o.dtype = M2D_F32;
        } else {
            o.num_experts_per_tok = 3;
        }
        char *sub = m2d_strfmt("%s/m%d", dir, variant);
        assert_int_equal(m2d_testmodel_write(sub, &o), 0);
        if (variant == 3) {
            char *cfg = m2d_path_join(sub, "config.json");
            tu_replace_in_file(cfg, "\"rope_scaling\": null", "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4, "
                               "\"original_max_position_embeddings\": 8, \"mscale\": 1.0, \"mscale_all_dim\": 0.5}");
            free(cfg);
        }
        m2d_model *m;
        assert_int_equal(m2d_model_open(sub, &m), 0);
        if (variant == 0) {
            int n_moe = 0;
            for (int l = 0; l < 4; l++) n_moe += m->cfg.layer_is_moe[l];
            assert_true(n_moe > 0 && n_moe < 4);
        }
        m2d_engine *e;
        engine_on(backend, m, 2, &e);
        int n = 24, V = m->cfg.vocab_size;
        int32_t tok[24];
        uint64_t st = 77 + (uint64_t)variant;
        rand_tokens(&st, tok, n, V);
        float *lg = malloc(sizeof(float) * n * V);
        double *rl = malloc(sizeof(double) * n * V);
        assert_int_equal(m2d_engine_logits(e, tok, n, lg), 0);
        tu_ref_forward(m, tok, n, rl);
        double md = 0;
        for (size_t i = 0; i < (size_t)n * V; i++) md = fmax(md, fabs(lg[i] - rl[i]));
        /* fp32 vs double on dots of length <= 64 of O(1) terms (relative error ~ 8·eps ~ 5e-7 per
         * dot), over <= 4 layers, logits of size ~1: expect ~1e-6, assert 5e-5 */
        print_message("variant %d: max |dlogit| vs float64 reference = %.3g\n", variant, md);
        assert_true(md < 5e-5);
        free(lg);
        free(rl);
        m2d_engine_free(e);
        m2d_model_close(m);
        free(sub);
    }
    tu_rm_rf(dir);
    free(dir);
}
EACH_BACKEND(engine_matches_naive_reference_on_checkpoints)

/* ---------------- device names ---------------- */

static void device_names_and_missing_devices(void **state) {
    (void)state;
    assert_int_equal(m2d_device_check("cpu", "--device"), 0);
    assert_int_equal(m2d_device_check("tpu", "--device"), -1);
    assert_non_null(strstr(m2d_errmsg(), "--device 'tpu': unknown device"));
    assert_int_equal(m2d_device_check("cpu:0", "--device"), -1);
    assert_non_null(strstr(m2d_errmsg(), "no device index"));
    m2d_backend *be;
    int has_cuda = 0;
    for (int i = 0; i < m2d_backend_count(); i++) has_cuda |= strcmp(m2d_backend_kind_at(i)->name, "cuda") == 0;
    if (!has_cuda) { /* the default build: no cuda backend */
        assert_int_equal(m2d_device_check("cuda:0", "--device"), -1);
        assert_non_null(strstr(m2d_errmsg(), "make CUDA=1"));
        assert_int_equal(m2d_backend_new("cuda", NULL, &be), -1);
        return;
    }
    assert_int_equal(m2d_device_check("cuda", "--device"), 0);
    assert_int_equal(m2d_device_check("cuda:3", "--device"), 0);
    /* a bad M2D_CUDA_ATTN, M2D_CUDA_MOE, M2D_CUDA_LSE or M2D_CUDA_WCACHE (a kernel for a process) is
     * one line naming it, GPU or not; each one's bad values start past its largest */
    const char *bad_knob[] = {"4", "x", "33", "", "-1"},
               *knob_env[] = {"M2D_CUDA_ATTN", "M2D_CUDA_MOE", "M2D_CUDA_LSE", "M2D_CUDA_WCACHE"};
    for (size_t v = 0; v < 4; v++) {
        for (size_t i = 0; i < sizeof bad_knob / sizeof *bad_knob; i++) {
            setenv(knob_env[v], v >= 2 && i == 0 ? "2" : bad_knob[i], 1);
            assert_int_equal(m2d_backend_new("cuda", NULL, &be), -1);
            assert_non_null(strstr(m2d_errmsg(), knob_env[v]));
            assert_null(strchr(m2d_errmsg(), '\n'));
        }
        unsetenv(knob_env[v]);
    }
    const char *bad[] = {"cuda:", "cuda:x", "cuda:-1", "cuda:1x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(m2d_device_check(bad[i], "--device"), -1);
        assert_non_null(strstr(m2d_errmsg(), "expected a device index"));
    }
    /* with a GPU: device 0 opens and device 1000 does not; without: the one-line error, no fallback */
    if (m2d_backend_new("cuda:0", NULL, &be) == 0) {
        assert_string_equal(be->ops->name, "cuda");
        end_backend(be);
        assert_int_equal(m2d_backend_new("cuda:1000", NULL, &be), -1);
        assert_non_null(strstr(m2d_errmsg(), "cuda: device 1000 does not exist"));
    } else {
        assert_non_null(strstr(m2d_errmsg(), "cuda: no CUDA device (cudaGetDeviceCount: "));
        assert_null(strchr(m2d_errmsg(), '\n'));
        assert_null(be);
    }
}

/* ---------------- bf16 (precision BF16: operands rounded to bf16, fp32 accumulation) ---------------- */

/* Backend GEMM in BF16 against float64 references, with u_b = 2^-8 (bf16's unit roundoff: 8
 * significant bits) and gamma_K = K u / (1 - K u), u = 2^-24:
 *  - against the reference on bf16-rounded operands: products of bf16 values are exact in fp32, so
 *    only the fp32 accumulation errs: |y - ref~| <= gamma_K sum|x~ w~| (tight; proves the backend
 *    really rounded the operands, since ref~ differs from the exact product by ~u_b);
 *  - against the exact operands: x~ w~ = x w (1 + d), |d| <= (1 + u_b)^2 - 1, so
 *    |y - ref| <= ((1 + u_b)^2 - 1 + gamma_K (1 + u_b)^2) sum|x w|.
 * The weight (150 x 200) is big enough for oneDNN's kernel where the CPU has native bf16. */
static void op_matmul_bf16_on(const char *backend) {
    m2d_backend *be = new_backend(backend, 2);
    if (!(be->ops->precisions & (1u << M2D_PREC_BF16))) {
        end_backend(be);
        return;
    }
    uint64_t st = 3;
    enum { N = 37, IN = 200, OUT = 150 };
    float *x = malloc(sizeof(float) * N * IN), *w = malloc(sizeof(float) * OUT * IN), *y = malloc(sizeof(float) * N * OUT);
    fill_normal(&st, x, (size_t)N * IN, 1);
    fill_normal(&st, w, (size_t)OUT * IN, 1);
    m2d_tensor wt;
    m2d_weight *wh = weight_of(be, &wt, M2D_F32, w, OUT, IN);
    m2d_buf *xb = upload(be, x, sizeof(float) * N * IN), *yb = be->ops->alloc(be, sizeof(float) * N * OUT);
    m2d_mat X = m2d_mat_of(xb, 0, N, IN, IN), Y = m2d_mat_of(yb, 0, N, OUT, OUT);
    be->ops->enter(be);
    be->ops->gemm(be, &X, wh, 0, &Y, 0.0f, M2D_PREC_BF16);
    assert_int_equal(be->ops->leave(be), 0);
    download(be, y, yb, sizeof(float) * N * OUT);
    const double u = ldexp(1, -24), ub = ldexp(1, -8), gk = IN * u / (1 - IN * u);
    double e_r = 0, e_x = 0; /* rms of y - ref~ and of ref~ - ref */
    for (int i = 0; i < N; i++)
        for (int o = 0; o < OUT; o++) {
            double s = 0, sr = 0, mag = 0, magr = 0;
            for (int k = 0; k < IN; k++) {
                double xv = x[i * IN + k], wv = w[o * IN + k];
                s += xv * wv, sr += tu_bf16(xv) * tu_bf16(wv), mag += fabs(xv * wv), magr += fabs(tu_bf16(xv) * tu_bf16(wv));
            }
            double yv = y[i * OUT + o];
            assert_true(fabs(yv - sr) <= gk * magr);
            assert_true(fabs(yv - s) <= ((1 + ub) * (1 + ub) - 1 + gk * (1 + ub) * (1 + ub)) * mag);
            e_r += (yv - sr) * (yv - sr), e_x += (sr - s) * (sr - s);
        }
    assert_true(e_r * 256 < e_x); /* tracks the rounded operands, not the exact ones (rms ratio < 1/16) */
    be->ops->release(be, xb), be->ops->release(be, yb), be->ops->weight_free(be, wh);
    end_backend(be);
    free(x); free(w); free(y);
}
EACH_BACKEND(op_matmul_bf16)

/* AUTO resolves to what the CPU computes natively (bf16 with avx512_bf16/AMX, else fp32); a
 * precision outside the enum is refused. */
static void precision_auto_and_bad_value(void **state) {
    (void)state;
    mem_model mm = {0};
    mm_config(&mm, 1, 8, 2, 12, 0);
    mm_shared(&mm, 11, M2D_BF16);
    mm_random_moe(&mm, 12, M2D_BF16);
    m2d_engine *e = engine_at(&mm.m, 1, M2D_PREC_AUTO);
    assert_int_equal(m2d_engine_precision(e), m2d_gemm_bf16_native() ? M2D_PREC_BF16 : M2D_PREC_FP32);
    m2d_engine_free(e);
    e = engine_at(&mm.m, 1, M2D_PREC_BF16);
    assert_int_equal(m2d_engine_precision(e), M2D_PREC_BF16);
    m2d_engine_free(e);
    m2d_engine_opts o = {.n_threads = 1, .precision = M2D_PREC_COUNT};
    assert_int_equal(m2d_engine_open(&mm.m, &o, &e), -1);
    assert_non_null(strstr(m2d_errmsg(), "precision"));
    mm_free(&mm);
}

/* The whole forward in BF16 against the float64 reference (same bf16 weights, exact operands).
 * The weights are bf16 already, so each GEMM rounds only its activations: per dot at most
 * (u_b + gamma_K) sum|x w| (op_matmul_bf16), 2^-8 = 3.9e-3 relative in the worst case, less in
 * practice (independent zero-mean roundings partly cancel). Logits here are |z| <= ~2.3; 2 layers
 * (4 sublayers) + the LM head compound at most ~5 such relative errors of O(1) terms: ~5 x 3.9e-3
 * x 2.3 = 0.045 worst case. Bound 2^-4 = 0.0625 (measured 0.008). Not vacuous: the fp32 engine
 * must sit 100x closer to the reference than the bf16 one, so BF16 really changed the arithmetic.
 * With attention on bf16 operands too (m2d_engine_opts.attention), each attention adds three
 * roundings (q and k: 2^-8 of the scores' sum |q k|; the numerators and v: 2^-9 each), 6 more
 * terms of <= 2^-8 x 2.3 in 2 layers: 0.1 worst case, bound 2^-3 (measured 0.009); it moves the
 * logits (the op saw BF16), and the engine reports it. */
static void engine_bf16_tracks_reference(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    o.seed = 102;
    o.init_std = 0.1f;
    o.num_experts_per_tok = 3;
    assert_int_equal(m2d_testmodel_write(dir, &o), 0);
    m2d_model *m;
    assert_int_equal(m2d_model_open(dir, &m), 0);
    m2d_engine *eb = engine_at(m, 2, M2D_PREC_BF16), *ef = engine_at(m, 2, M2D_PREC_FP32), *ea;
    m2d_engine_opts oa = {.backend = "cpu", .n_threads = 2, .precision = M2D_PREC_BF16, .attention = M2D_PREC_BF16};
    if (m2d_engine_open(m, &oa, &ea)) fail_msg("%s", m2d_errmsg());
    assert_int_equal(m2d_engine_attention_precision(ea), M2D_PREC_BF16);
    assert_int_equal(m2d_engine_attention_precision(eb), M2D_PREC_FP32);
    int n = 24, V = m->cfg.vocab_size;
    int32_t tok[24];
    uint64_t st = 79;
    rand_tokens(&st, tok, n, V);
    float *lb = malloc(sizeof(float) * n * V), *lf = malloc(sizeof(float) * n * V), *la = malloc(sizeof(float) * n * V);
    double *rl = malloc(sizeof(double) * n * V);
    assert_int_equal(m2d_engine_logits(eb, tok, n, lb), 0);
    assert_int_equal(m2d_engine_logits(ef, tok, n, lf), 0);
    assert_int_equal(m2d_engine_logits(ea, tok, n, la), 0);
    tu_ref_forward(m, tok, n, rl);
    double db = 0, df = 0, da = 0, zmax = 0;
    for (size_t i = 0; i < (size_t)n * V; i++) {
        db = fmax(db, fabs(lb[i] - rl[i]));
        df = fmax(df, fabs(lf[i] - rl[i]));
        da = fmax(da, fabs(la[i] - rl[i]));
        zmax = fmax(zmax, fabs(rl[i]));
    }
    print_message("bf16 engine: max |dlogit| vs float64 = %.3g (fp32: %.3g; bf16 attention too: %.3g, moved by %.3g; "
                  "max |logit| %.2f)\n", db, df, da, max_abs_diff(la, lb, (size_t)n * V), zmax);
    assert_true(db < 0.0625);
    assert_true(df * 100 < db);
    assert_true(da < 0.125);
    assert_true(max_abs_diff(la, lb, (size_t)n * V) > 0);
    /* streaming log-probabilities in bf16 equal log-softmax of the bf16 logits (same GEMM tiles) */
    int32_t tg[24];
    rand_tokens(&st, tg, n, V);
    double lp[24];
    assert_int_equal(m2d_engine_logprobs(eb, tok, n, tg, 0, lp), 0);
    for (int t = 0; t < n; t++) assert_true(fabs(lp[t] - lsm(lb + (size_t)t * V, V, tg[t])) < 1e-4);
    free(lb); free(lf); free(la); free(rl);
    m2d_engine_free(eb);
    m2d_engine_free(ef);
    m2d_engine_free(ea);
    m2d_model_close(m);
    tu_rm_rf(dir);
    free(dir);
}

/* Calibration's all-experts pass: f_e(x_t) of every expert equals the single-expert entry point
 * (same GEMM module, grouped vs one call: the same bits), and the Gram op adds sum_t F_t F_t^T
 * into the upper triangle only. Gram bounds against the float64 sum over the returned f:
 * FP32 accumulates in fp64 (relative 1e-12 of sum|f_i f_j| is ~1e4 x fp64's rounding);
 * BF16 forms each token's F_t F_t^T in fp32 over d terms: |err| <= gamma_d sum|f_i f_j|. */
/* G (fp64 [E, E], started at 1 above the diagonal and -7 below) against 1 + the fp64 sum over the n
 * rows of f ([n, E*d]) of <f_i, f_j>: within REL of the sum of |products| on and above the diagonal,
 * the sentinel untouched below it (never written, so exact); the largest relative difference */
static double check_gram(const double *g, const float *f, int n, int E, int d, double rel) {
    double worst = 0;
    for (int i = 0; i < E; i++)
        for (int j = 0; j < E; j++) {
            if (j < i) {
                assert_true(g[i * E + j] == -7.0);
                continue;
            }
            double s = 0, mag = 0;
            for (int t = 0; t < n; t++)
                for (int k = 0; k < d; k++) {
                    double a = f[((size_t)t * E + i) * d + k], b = f[((size_t)t * E + j) * d + k];
                    s += a * b, mag += fabs(a * b);
                }
            worst = fmax(worst, fabs(g[i * E + j] - 1.0 - s) / (mag + 1e-300));
            assert_true(fabs(g[i * E + j] - 1.0 - s) <= rel * mag + 1e-15);
        }
    return worst;
}

static void all_experts_and_gram_match_naive(void **state) {
    (void)state;
    mem_model mm = {0};
    build_random_moe(&mm, M2D_BF16);
    int n = 37, d = 32, E = 8;
    const double u = ldexp(1, -24), gd = d * u / (1 - d * u);
    float *x = malloc(sizeof(float) * n * d), *f = malloc(sizeof(float) * n * E * d), *y = malloc(sizeof(float) * n * d);
    double *g = malloc(sizeof(double) * E * E);
    uint64_t st = 9;
    fill_normal(&st, x, (size_t)n * d, 1);
    for (int p = 0; p < 2; p++) {
        m2d_engine *e = engine_at(&mm.m, 2, p ? M2D_PREC_BF16 : M2D_PREC_FP32);
        for (int i = 0; i < E * E; i++) g[i] = i % E >= i / E ? 1.0 : -7.0;
        assert_int_equal(m2d_engine_all_experts(e, 1, x, n, f, g), 0);
        for (int ex = 0; ex < E; ex++) {
            assert_int_equal(m2d_engine_expert(e, 1, ex, x, n, y), 0);
            /* exact on every CPU: one machine, the same GEMM of the same shape per expert (grouped or not) */
            for (int t = 0; t < n; t++) assert_memory_equal(f + ((size_t)t * E + ex) * d, y + (size_t)t * d, sizeof(float) * d);
        }
        check_gram(g, f, n, E, d, (p ? gd : 0) + 1e-12);
        assert_int_equal(m2d_engine_all_experts(e, 0, x, 0, f, g), -1); /* no tokens */
        m2d_engine_free(e);
    }
    free(x); free(f); free(y); free(g);
    mm_free(&mm);
}

/* ---------------- capabilities (backend.h M2D_CAPS) ---------------- */

/* Fixture backends of this test binary only: the CPU backend under another name with OPS, a copy of
 * its ops table, changed after creation (each_backend skips them) */
static int cpu_fixture(const m2d_backend_opts *o, m2d_backend **out, m2d_backend_ops *ops, const char *name) {
    if (m2d_backend_new("cpu", o, out)) return -1;
    *ops = *(*out)->ops;
    ops->name = name;
    (*out)->ops = ops;
    return 0;
}

/* "capless": none of the optional capabilities, so that the engine's refusal can be seen */
static m2d_backend_ops capless_ops;

static int capless_create(const m2d_backend_opts *o, m2d_backend **out) {
    if (cpu_fixture(o, out, &capless_ops, "capless")) return -1;
    capless_ops.caps = 0;
    return 0;
}

M2D_BACKEND(capless, "capless", "test fixture: the cpu backend with no optional capability", capless_create)

/* "embedres": lookups ask for a resident embedding, and each weight it is asked to keep counts
 * as kept whole (the CPU may keep a bf16 weight as stored), as a GPU's do */
static m2d_backend_ops embedres_ops;
static int (*cpu_make_resident)(m2d_backend *be, m2d_weight *w, size_t *made);

static int embedres_make_resident(m2d_backend *be, m2d_weight *w, size_t *made) {
    size_t asked = embedres_ops.resident_bytes(be, w);
    if (cpu_make_resident(be, w, made)) return -1;
    if (made) *made = asked;
    return 0;
}

static int embedres_create(const m2d_backend_opts *o, m2d_backend **out) {
    if (cpu_fixture(o, out, &embedres_ops, "embedres")) return -1;
    embedres_ops.resident_embedding = 1;
    cpu_make_resident = embedres_ops.make_resident; /* the cpu backend's: cpu_fixture copied its table */
    embedres_ops.make_resident = embedres_make_resident;
    return 0;
}

M2D_BACKEND(embedres, "embedres", "test fixture: the cpu backend with resident_embedding", embedres_create)

/* The residency policy makes an untied embedding resident where the backend's lookups want it
 * (the cuda backend: a streamed lookup is a host round trip a forward), and not on the CPU; the
 * lookups give the same values either way (bit for bit: the same fp32 rows). */
static void embedding_resident_where_the_backend_wants_it(void **state) {
    (void)state;
    mem_model mm = {0};
    build_random_moe(&mm, M2D_BF16);
    assert_true(mm.m.lm_head != mm.m.embed); /* untied: the embedding is its own weight */
    m2d_engine *a, *b;
    engine_on("cpu", &mm.m, 1, &a);
    engine_on("embedres", &mm.m, 1, &b);
    size_t ra = m2d_engine_cache_weights(a, (size_t)1 << 30), rb = m2d_engine_cache_weights(b, (size_t)1 << 30);
    const m2d_config *c = &mm.m.cfg;
    assert_true(rb > ra); /* the embedding's prepared copy on top of everything else */
    assert_true(rb - ra >= (size_t)c->vocab_size * c->hidden_size * 2);
    int32_t tok[12];
    uint64_t st = 5;
    rand_tokens(&st, tok, 12, c->vocab_size);
    float *la = malloc(sizeof(float) * 12 * c->vocab_size), *lb = malloc(sizeof(float) * 12 * c->vocab_size);
    assert_int_equal(m2d_engine_logits(a, tok, 12, la), 0);
    assert_int_equal(m2d_engine_logits(b, tok, 12, lb), 0);
    assert_memory_equal(la, lb, sizeof(float) * 12 * c->vocab_size);
    free(la), free(lb);
    m2d_engine_free(a), m2d_engine_free(b);
    mm_free(&mm);
}

/* "halfres": every other weight it is asked to keep is kept as stored (the CPU's answer where a
 * copy would change the bits), whatever this CPU's probe says; counts the copies it makes */
static m2d_backend_ops halfres_ops;
static int (*halfres_cpu)(m2d_backend *be, m2d_weight *w, size_t *made);
static int halfres_asked, halfres_copies;
static size_t halfres_bytes; /* of the copies made */

static int halfres_make_resident(m2d_backend *be, m2d_weight *w, size_t *made) {
    if (made) *made = 0;
    if (halfres_asked++ % 2) return 0;
    if (halfres_cpu(be, w, made)) return -1;
    halfres_copies += made && *made > 0;
    halfres_bytes += made ? *made : 0;
    return 0;
}

static int halfres_create(const m2d_backend_opts *o, m2d_backend **out) {
    if (cpu_fixture(o, out, &halfres_ops, "halfres")) return -1;
    halfres_cpu = halfres_ops.make_resident;
    halfres_ops.make_resident = halfres_make_resident;
    return 0;
}

M2D_BACKEND(halfres, "halfres", "test fixture: the cpu backend keeping every other weight as stored", halfres_create)

/* The weight cache's budget pays for the copies made, not for the weights kept as stored: the
 * bytes it reports are those of its copies, and a budget of exactly that makes the same copies
 * again (charging the kept weights' upper bounds stopped it half way). */
static void weight_cache_charges_only_copies(void **state) {
    (void)state;
    mem_model mm = {0};
    build_random_moe(&mm, M2D_BF16);
    m2d_engine *a, *b;
    engine_on("halfres", &mm.m, 1, &a); /* M2D_WEIGHT_CACHE_MB=0 (main): nothing kept at open */
    engine_on("halfres", &mm.m, 1, &b);
    halfres_asked = halfres_copies = 0, halfres_bytes = 0;
    size_t all = m2d_engine_cache_weights(a, (size_t)1 << 30);
    int copies_all = halfres_copies;
    assert_true(copies_all > 1);
    assert_int_equal(all, halfres_bytes);
    halfres_asked = halfres_copies = 0, halfres_bytes = 0;
    assert_int_equal(m2d_engine_cache_weights(b, all), all);
    assert_int_equal(halfres_copies, copies_all);
    m2d_engine_free(a), m2d_engine_free(b);
    mm_free(&mm);
}

/* a capability a backend lists is an op it has (the engine and the tests rely on it) */
static void caps_promise_their_ops_on(const char *backend) {
    m2d_backend *be = new_backend(backend, 1);
    const m2d_backend_ops *B = be->ops;
    struct { m2d_cap cap; const void *op; } need[] = {
        {M2D_CAP_BIAS, (const void *)B->add_bias},           {M2D_CAP_CLAMP, (const void *)B->clamp},
        {M2D_CAP_SIGMOID_SCALE, (const void *)B->sigmoid_scale}, {M2D_CAP_GLU_CLAMP, (const void *)B->glu_clamp},
        {M2D_CAP_EXPERTS_ALL, (const void *)B->experts_all}, {M2D_CAP_GRAM, (const void *)B->gram},
        {M2D_CAP_EXPERTS_REDUCE, (const void *)B->experts_reduce}, {M2D_CAP_TRAIN, (const void *)B->train},
    };
    for (size_t i = 0; i < M2D_ARRAY_LEN(need); i++)
        if (m2d_backend_supports(be, need[i].cap) && !need[i].op)
            fail_msg("backend %s lists '%s' but has no such op", backend, m2d_cap_name(need[i].cap));
    assert_true(B->auto_precision != NULL); /* --precision auto resolves on every backend */
    end_backend(be);
}
EACH_BACKEND(caps_promise_their_ops)

/* The capabilities a model needs follow its config and weights, and an engine on a backend that
 * lacks one is refused at open, in one line naming it. The fixture backend "capless" (above) lacks them all. */
static void engine_refuses_a_model_the_backend_cannot_run(void **state) {
    (void)state;
    mem_model mm = {0};
    build_random_moe(&mm, M2D_F32);
    assert_true(m2d_engine_required_caps(&mm.m) == 0); /* plain Qwen3-MoE: nothing optional */
    m2d_engine *e;
    m2d_engine_opts o = {.backend = "capless", .n_threads = 1, .precision = M2D_PREC_FP32};
    assert_int_equal(m2d_engine_open(&mm.m, &o, &e), 0);
    float x[32] = {0}, f[8 * 32];
    double g[64] = {0};
    assert_int_equal(m2d_engine_all_experts(e, 1, x, 1, f, g), -1); /* calibration: refused, not a NULL call */
    assert_non_null(strstr(m2d_errmsg(), "calibration needs 'experts_all', which backend capless does not implement"));
    m2d_engine_free(e);
    /* attention on bf16 operands: a capability too; and only fp32 or bf16 */
    m2d_engine_opts oa = {.backend = "capless", .n_threads = 1, .attention = M2D_PREC_BF16};
    assert_int_equal(m2d_engine_open(&mm.m, &oa, &e), -1);
    assert_null(e);
    assert_non_null(strstr(m2d_errmsg(), "attention in bf16 needs 'attention-bf16', which backend capless does not implement"));
    oa.backend = "cpu", oa.attention = M2D_PREC_AUTO;
    assert_int_equal(m2d_engine_open(&mm.m, &oa, &e), -1);
    assert_non_null(strstr(m2d_errmsg(), "attention precision auto: fp32 or bf16"));
    mm.m.cfg.attn_scale = 0.1;
    assert_true(m2d_engine_required_caps(&mm.m) == M2D_CAP(M2D_CAP_ATTN_SCALE));
    mm.m.cfg.n_group = 4, mm.m.cfg.topk_group = 2, mm.m.cfg.ops.rope = M2D_ROPE_INTERLEAVED;
    uint64_t want = M2D_CAP(M2D_CAP_ATTN_SCALE) | M2D_CAP(M2D_CAP_ROUTE_GROUPS) | M2D_CAP(M2D_CAP_ROPE_INTERLEAVED);
    assert_true(m2d_engine_required_caps(&mm.m) == want);
    assert_int_equal(m2d_engine_open(&mm.m, &o, &e), -1);
    assert_null(e);
    /* the first missing one in M2D_CAPS order, named with the backend */
    assert_non_null(strstr(m2d_errmsg(), "needs 'rope-interleaved', which backend capless does not implement"));
    assert_null(strchr(m2d_errmsg(), '\n'));
    mm.m.cfg.attn_scale = 0, mm.m.cfg.n_group = 0, mm.m.cfg.topk_group = 0, mm.m.cfg.ops.rope = M2D_ROPE_NEOX;
    mm_free(&mm);
}

/* m2d_engine_all_experts_reduced against the outputs F [n, E * d] and Gram G the unreduced pass
 * gave for the same tokens (the same op on the same rows: the same bits): the chosen rows are F's
 * (zeros for -1), the Gram G again (exact: the gram op adds rows in order), sum_f the host's fp64
 * sum over the tokens in order onto its start (exact: fp64 additions of fp32 values in one order,
 * backend.h), norm2 within d * 2^-53 of the host's (fp64, another order; 1e-13 relative); the
 * same bits into page-locked arrays; a bad expert id refused in one line. */
static void reduced_matches_outputs(m2d_engine *e, int layer, const float *x, int n, int E, int d, const float *F,
                                    const double *G) {
    enum { K1 = 3 };
    int32_t *ids = malloc(sizeof(int32_t) * n * K1);
    float *sel = malloc(sizeof(float) * n * K1 * d);
    double *sum = malloc(sizeof(double) * E * d), *want = malloc(sizeof(double) * E * d),
           *n2 = malloc(sizeof(double) * E * n), *g = malloc(sizeof(double) * E * E);
    uint64_t st = 23;
    for (int i = 0; i < n * K1; i++) ids[i] = (int)(tu_rand_u64(&st) % (E + 1)) - 1; /* -1 .. E-1 */
    for (int i = 0; i < E * d; i++) sum[i] = want[i] = (double)(i % 7) - 3.25;
    for (int i = 0; i < E * E; i++) g[i] = i % E >= i / E ? 1.0 : -7.0; /* as the unreduced call's start */
    assert_int_equal(m2d_engine_all_experts_reduced(e, layer, x, n, ids, K1, sel, sum, n2, g, NULL), 0);
    for (int t = 0; t < n; t++)
        for (int r = 0; r < K1; r++) {
            int ex = ids[t * K1 + r];
            for (int k = 0; k < d; k++) {
                float w = ex < 0 ? 0.0f : F[((size_t)t * E + ex) * d + k];
                assert_memory_equal(&sel[((size_t)t * K1 + r) * d + k], &w, sizeof w);
            }
        }
    assert_memory_equal(g, G, sizeof(double) * E * E);
    for (int ex = 0; ex < E; ex++)
        for (int t = 0; t < n; t++) {
            double q = 0;
            for (int k = 0; k < d; k++) {
                double v = F[((size_t)t * E + ex) * d + k];
                want[(size_t)ex * d + k] += v;
                q += v * v;
            }
            assert_true(fabs(n2[(size_t)ex * n + t] - q) <= 1e-13 * q);
        }
    assert_memory_equal(sum, want, sizeof(double) * E * d);
    /* again into page-locked arrays (m2d_engine_pin; pinning a range twice fails quietly): the
     * same bits */
    float *sel2 = malloc(sizeof(float) * n * K1 * d);
    double *sum2 = malloc(sizeof(double) * E * d), *n22 = malloc(sizeof(double) * E * n);
    for (int i = 0; i < E * d; i++) sum2[i] = (double)(i % 7) - 3.25;
    m2d_engine_pin(e, sel2, sizeof(float) * n * K1 * d);
    m2d_engine_pin(e, sel2, sizeof(float) * n * K1 * d);
    m2d_engine_pin(e, n22, sizeof(double) * E * n);
    assert_int_equal(m2d_engine_all_experts_reduced(e, layer, x, n, ids, K1, sel2, sum2, n22, NULL, NULL), 0);
    assert_memory_equal(sel2, sel, sizeof(float) * n * K1 * d);
    assert_memory_equal(sum2, want, sizeof(double) * E * d);
    assert_memory_equal(n22, n2, sizeof(double) * E * n);
    m2d_engine_unpin(e, sel2);
    m2d_engine_unpin(e, n22);
    free(sel2); free(sum2); free(n22);
    ids[5] = E;
    assert_int_equal(m2d_engine_all_experts_reduced(e, layer, x, n, ids, K1, sel, sum, n2, NULL, NULL), -1);
    assert_non_null(strstr(m2d_errmsg(), "expert id 8 (token 1) outside [-1, 8)"));
    free(ids); free(sel); free(sum); free(want); free(n2); free(g);
}

/* a reduced pass whose selected rows are all zeros (every id -1), so that the buffer the next pass
 * reuses for its rows (the backend's cache hands back the same size) holds other bytes than the
 * rows it must bring: a copy made before the rows are written shows */
static void poison_selected(m2d_engine *e, int layer, const float *x, int n, int E, int d) {
    enum { K1 = 3 }; /* reduced_matches_outputs' */
    int32_t *ids = malloc(sizeof(int32_t) * n * K1);
    float *sel = malloc(sizeof(float) * n * K1 * d);
    double *sum = calloc((size_t)E * d, sizeof(double)), *n2 = malloc(sizeof(double) * E * n);
    for (int i = 0; i < n * K1; i++) ids[i] = -1;
    assert_int_equal(m2d_engine_all_experts_reduced(e, layer, x, n, ids, K1, sel, sum, n2, NULL, NULL), 0);
    for (int i = 0; i < n * K1 * d; i++) assert_true(sel[i] == 0.0f);
    free(ids), free(sel), free(sum), free(n2);
}

/* calibration's experts path PATH at BF16 (cuda: 0 the grouped kernels, the default at few rows
 * (k_gx where it applies); 1 batched GEMMs, required (knob all_batched 2: an error, not the
 * per-expert path, where they do not apply); 2 expert by expert; 3 the WMMA grouped kernel);
 * false when the backend has no such path (0 always runs) */
static bool experts_path(m2d_engine *e, int path) {
    m2d_backend *be = m2d_engine_backend(e);
    if (path == 0) return true;
    if (path > 3 || be->ops->tune(be, "all_grouped_rows", path == 3 ? 64 : 0)) return false;
    if (path == 3) return be->ops->tune(be, "all_batched", 1) == 0 && be->ops->tune(be, "moe_grouped", 1) == 0;
    return be->ops->tune(be, "all_batched", path == 1 ? 2 : 0) == 0;
}

/* cuda: the Gram on the fp64 tensor cores with its next chunk prefetched (knob gram_kernel 2) gives
 * the bits of the one without (1): the same DMMAs in the same order, from the same start; then the
 * knob back at the backend's own value (0, the FMA tiles, under M2D_CUDA_FAST=0). A backend
 * without the knob: nothing. */
static void gram_prefetch_same_bits(m2d_engine *e, int layer, const float *x, int n, int E, float *f) {
    m2d_backend *be = m2d_engine_backend(e);
    double *g[2] = {malloc(sizeof(double) * E * E), malloc(sizeof(double) * E * E)};
    int run = 0;
    for (; run < 2 && be->ops->tune(be, "gram_kernel", 1 + run) == 0; run++) {
        for (int i = 0; i < E * E; i++) g[run][i] = i % E >= i / E ? 1.0 : -7.0;
        assert_int_equal(m2d_engine_all_experts(e, layer, x, n, f, g[run]), 0);
    }
    if (run == 2) {
        assert_memory_equal(g[1], g[0], sizeof(double) * E * E);
        const char *fast = getenv("M2D_CUDA_FAST");
        assert_int_equal(be->ops->tune(be, "gram_kernel", fast && strcmp(fast, "0") == 0 ? 0 : 1), 0);
    }
    free(g[0]);
    free(g[1]);
}

/* Calibration's ops on every backend: every expert on every token against the float64 reference
 * FFN, on each of the backend's paths, and the Gram (fp64, upper triangle) against the fp64 sum of
 * the outputs it was given; the reduced pass against them (reduced_matches_outputs). */
static void calibration_ops_match_float64_on(const char *backend) {
    if (lacks(backend, M2D_CAP(M2D_CAP_EXPERTS_ALL) | M2D_CAP(M2D_CAP_GRAM) | M2D_CAP(M2D_CAP_EXPERTS_REDUCE))) return;
    mem_model mms[2]; /* fp32 weights; bf16 weights (a real checkpoint's: cuda's batched path) */
    memset(mms, 0, sizeof mms);
    build_random_moe(&mms[0], M2D_F32);
    build_random_moe(&mms[1], M2D_BF16);
    int n = 37, d = 32, E = 8, layer = 1;
    float *x = malloc(sizeof(float) * n * d), *f = malloc(sizeof(float) * n * E * d);
    double *g = malloc(sizeof(double) * E * E), xd[32], yd[32], md[2] = {0, 0};
    uint64_t st = 19;
    fill_normal(&st, x, (size_t)n * d, 1);
    for (int p = 0; p < 2; p++) { /* FP32, then BF16 (cuda: the grouped tensor-core kernels) */
        mem_model *mm = &mms[p];
        m2d_engine *e;
        m2d_engine_opts o = {.backend = backend, .n_threads = 2, .precision = p ? M2D_PREC_BF16 : M2D_PREC_FP32};
        if (m2d_engine_open(&mm->m, &o, &e)) fail_msg("%s", m2d_errmsg());
        if (p && m2d_engine_precision(e) != M2D_PREC_BF16) { /* a backend without BF16 */
            m2d_engine_free(e);
            break;
        }
        if (p) m2d_engine_cache_weights(e, (size_t)1 << 30); /* resident: what the grouped kernels take */
        for (int path = 0; path == 0 || (p && experts_path(e, path)); path++) {
            for (int i = 0; i < E * E; i++) g[i] = i % E >= i / E ? 1.0 : -7.0;
            assert_int_equal(m2d_engine_all_experts(e, layer, x, n, f, g), 0);
            double mp = 0;
            for (int t = 0; t < n; t++)
                for (int ex = 0; ex < E; ex++) {
                    for (int k = 0; k < d; k++) xd[k] = x[(size_t)t * d + k];
                    tu_ref_ffn(&mm->m, layer, ex, xd, yd);
                    for (int k = 0; k < d; k++) mp = fmax(mp, fabs(f[((size_t)t * E + ex) * d + k] - yd[k]));
                }
            /* FP32: GEMMs over 32 and 12 terms of O(1) values, outputs O(1): ~1e-6 at worst. BF16: x,
             * W and h rounded to bf16 (2^-9 relative each), the same O(1) terms: a few 2^-8 of the
             * outputs' O(1) magnitudes; 2^-4 as engine_bf16_tracks_reference. Not vacuous: BF16 must
             * sit > 10x farther from float64 than FP32, and a wrong expert, row or column is O(1) off. */
            assert_true(mp < (p ? 0.0625 : 1e-5));
            md[p] = fmax(md[p], mp);
            /* both sums in fp64 over n*d = 1184 products of exact fp32 values: |err| <= 1184 * 2^-53 *
             * mag (BF16 may form each token's products in fp32 over d terms: gamma_d, backend.h) */
            const double u = ldexp(1, -24), gd = d * u / (1 - d * u);
            double gw = check_gram(g, f, n, E, d, (p ? gd : 0) + 1e-12);
            print_message("%s: experts_all (%s, path %d) max |d| vs float64 %.3g; gram max relative |d| %.3g\n",
                          backend, p ? "bf16" : "fp32", path, mp, gw);
            if (path == 0) gram_prefetch_same_bits(e, layer, x, n, E, f); /* the Gram's path is not the experts' */
            reduced_matches_outputs(e, layer, x, n, E, d, f, g);
            m2d_backend *be = m2d_engine_backend(e);
            if (path == 0 && be->ops->tune(be, "calib_overlap", 1) == 0) { /* cuda: the selected rows copied */
                poison_selected(e, layer, x, n, E, d); /* while the Gram runs: the same bytes, not stale ones */
                reduced_matches_outputs(e, layer, x, n, E, d, f, g);
                print_message("%s: the reduced pass with the selected rows copied during the Gram: the same bytes\n",
                              backend);
                assert_int_equal(be->ops->tune(be, "calib_overlap", 0), 0);
            }
        }
        m2d_engine_free(e);
    }
    if (md[1] > 0) assert_true(md[1] > 10 * md[0]);
    free(x); free(f); free(g);
    mm_free(&mms[0]);
    mm_free(&mms[1]);
}
EACH_BACKEND(calibration_ops_match_float64)

/* The LM head's sum of exponentials (vexp.h) against exp() in double. Per term: Cephes' polynomial
 * (~1 float ulp) on the Cody-Waite reduced argument, then the product with 2^k (0.5 ulp): measured
 * 1.39 ulps at worst over [-88, 0]; checked at 2 ulps = 2.4e-7 relative for terms above the -87
 * clamp. A sum of positive terms keeps that relative bound, so log(sum) moves by <= 2.4e-7 (plus
 * the double sum's own ~n * 1.1e-16). Lengths not a multiple of the 16 lanes take the tail path. */
static void lse_sum_exp_matches_double(void **state) {
    (void)state;
    float z[1];
    double worst = 0;
    for (double x = -87.0; x <= 0; x += 1.7e-4) {
        z[0] = (float)x;
        double fast = m2d_vexp_sum_exp(z, 1, 0.0f), ref = exp((double)z[0]);
        worst = fmax(worst, fabs(fast - ref) / ref);
    }
    print_message("exp terms: worst relative error %.3g (%.2f float ulps)\n", worst, worst / 0x1p-24);
    assert_true(worst <= 0x1p-22);
    uint64_t seed = 7;
    for (int n = 1; n <= 4099; n += n < 40 ? 1 : 1013) {
        float *v = m2d_malloc(sizeof(float) * (size_t)n);
        float mx = -INFINITY;
        for (int i = 0; i < n; i++) {
            v[i] = (float)(m2d_splitmix64(&seed) % 60001) * 1e-3f - 30.0f; /* logits in [-30, 30] */
            mx = fmaxf(mx, v[i]);
        }
        assert_true(m2d_vexp_max(v, n) == mx); /* a maximum is exact */
        double fast = log(m2d_vexp_sum_exp(v, n, mx)), ref = log(m2d_vexp_sum_exp_ref(v, n, mx));
        assert_true(fabs(fast - ref) <= 2.4e-7 + n * 1.2e-16);
        free(v);
    }
}

/* SwiGLU's vector sigmoid (vexp.h) against double. With u = 2^-24 (half a float ulp): e = exp(-|g|)
 * is within 4u (the 2 ulps checked above); 1 + e within 4u e / (1 + e) + u <= 3u; the division adds
 * u, and the numerator e (g < 0) its 4u: sigmoid within 8u; the products by g and by the up value
 * 2u more: |h - ref| <= 10u |ref|, plus, below g = -87 (the exp's clamp), 1.7e-38 |g u| (the clamped
 * term) and a denormal's spacing. Every element gives the same bits at any position and in arrays of
 * any length (full vectors and the tail alike). */
static void swiglu_matches_double(void **state) {
    (void)state;
    enum { N = 200001 };
    float *g = m2d_malloc(sizeof(float) * N), *u = m2d_malloc(sizeof(float) * N), *h = m2d_malloc(sizeof(float) * N);
    uint64_t seed = 11;
    for (int i = 0; i < N; i++) {
        g[i] = (float)(-100.0 + 200.0 * i / (N - 1));
        u[i] = (float)((double)(m2d_splitmix64(&seed) % 20001) * 1e-3 - 10.0);
    }
    m2d_vexp_swiglu(g, u, N, h);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        double ref = (double)g[i] / (1.0 + exp(-(double)g[i])) * u[i];
        double allow = 10 * 0x1p-24 * fabs(ref) + 1.7e-38 * fabs((double)g[i] * u[i]) + 0x1p-149;
        if (fabs(h[i] - ref) > allow) fail_msg("g %.9g u %.9g: %.9g vs %.17g", g[i], u[i], h[i], ref);
        if (fabs(ref) > 1e-30) worst = fmax(worst, fabs(h[i] - ref) / fabs(ref));
    }
    print_message("swiglu: worst relative error %.3g (%.2f half-ulps)\n", worst, worst / 0x1p-24);
    for (int n = 1; n <= 40; n++) /* elements 1000.. placed at every offset of arrays of every length */
        for (int off = 0; off < n; off++) {
            float gg[40], uu[40], hh[40];
            for (int i = 0; i < n; i++) gg[i] = g[1000 + (i - off + n) % n], uu[i] = u[1000 + (i - off + n) % n];
            m2d_vexp_swiglu(gg, uu, n, hh);
            assert_memory_equal(&hh[off], &h[1000], sizeof(float));
        }
    float same[3] = {0.5f, -3.0f, 7.0f}, up[3] = {2.0f, 1.0f, -1.0f}, ref[3];
    m2d_vexp_swiglu_ref(same, up, 3, ref);
    m2d_vexp_swiglu(same, up, 3, same); /* in place, as the engine calls it */
    for (int i = 0; i < 3; i++) assert_true(fabs(same[i] - ref[i]) <= 10 * 0x1p-24 * fabs(ref[i]));
    free(g), free(u), free(h);
}

int main(void) {
    /* tests run the convert-on-use path (the one big checkpoints take); the cache is compared
     * against it explicitly in weight_cache_and_expert_order_give_identical_results */
    setenv("M2D_WEIGHT_CACHE_MB", "0", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(op_matmul_matches_loops),
        cmocka_unit_test(op_resident_weights_keep_bits),
        cmocka_unit_test(op_logprobs_masked_chunks),
        cmocka_unit_test(cpu_resident_weights_follow_a_later_kernel),
        cmocka_unit_test(lse_sum_exp_matches_double),
        cmocka_unit_test(swiglu_matches_double),
        cmocka_unit_test(op_rmsnorm_analytic),
        cmocka_unit_test(op_rope_rotate_half), cmocka_unit_test(op_rope_variants), cmocka_unit_test(op_bias_and_clamp),
        cmocka_unit_test(op_sigmoid_scale), cmocka_unit_test(op_attention_scale), cmocka_unit_test(op_attention_bf16),
        cmocka_unit_test(op_route_group_limited),
        cmocka_unit_test(op_softmax_and_swiglu),
        cmocka_unit_test(op_topk_ties_to_lower_index),
        cmocka_unit_test(op_attention_causal_gqa),
        cmocka_unit_test(op_convert_parallel),
        cmocka_unit_test(op_attention_window_sinks), cmocka_unit_test(op_attention_gemm_blocks),
        cmocka_unit_test(op_bias_and_clamped_swiglu),
        cmocka_unit_test(op_route_topk_softmax),
        cmocka_unit_test(op_moe_biases_clamp),
        cmocka_unit_test(op_moe_bf16_resident),
        cmocka_unit_test(dense_equals_moe),
        cmocka_unit_test(streaming_logprobs_match_logits),
        cmocka_unit_test(extend_and_branches_match_full_forward),
        cmocka_unit_test(hook_sees_routing_and_can_abort),
        cmocka_unit_test(hook_can_supply_the_routed_output),
        cmocka_unit_test(weight_cache_and_expert_order_give_identical_results),
        cmocka_unit_test(results_do_not_depend_on_thread_count),
        cmocka_unit_test(layer_major_pass),
        cmocka_unit_test(golden_tiny_qwen3moe),
        cmocka_unit_test(engine_matches_naive_reference_on_checkpoints),
        cmocka_unit_test(op_matmul_bf16),
        cmocka_unit_test(precision_auto_and_bad_value),
        cmocka_unit_test(engine_bf16_tracks_reference),
        cmocka_unit_test(all_experts_and_gram_match_naive),
        cmocka_unit_test(caps_promise_their_ops),
        cmocka_unit_test(engine_refuses_a_model_the_backend_cannot_run),
        cmocka_unit_test(embedding_resident_where_the_backend_wants_it),
        cmocka_unit_test(weight_cache_charges_only_copies),
        cmocka_unit_test(calibration_ops_match_float64),
        cmocka_unit_test(last_layer_finishes_only_needed_rows),
        cmocka_unit_test(device_names_and_missing_devices),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
