/* train ops: every backward op of the backend's training table (backend.h m2d_backend_train_ops)
 * against finite differences of an explicit float64 reference of its forward, on every registered
 * backend; the losses and AdamW against float64 formulas; and the results independent of the
 * thread count (bit for bit: one machine, the same computation, blocks and chunks fixed by the
 * shape, never by the thread count, so these exact comparisons hold on every CPU).
 *
 * Method: for an op y = f(x, w) and a random cotangent r, phi = sum r * f is a scalar whose
 * gradient the backward op must return when given dy = r. The reference gradient is the central
 * difference of phi computed entirely in float64 (step h = 1e-5: truncation ~h^2 |f'''| ~ 1e-10,
 * rounding ~1e-16/h ~ 1e-11), i.e. exact to ~1e-9 at the scale of these inputs.
 *
 * Tolerance (fp32 kernel vs that exact gradient): each gradient element is a sum of K fp32
 * products (K <= 64 here), whose rounding error is at most ~K u sum|terms| (u = 6e-8); with O(1)
 * inputs the gradient itself is ~sqrt(K) |term| (random signs), so the error relative to the
 * largest gradient element is below ~K^1.5 u = 3e-5 at K = 64. Ops chain at most three such
 * stages (attention: scores, softmax, values), hence TOL = 1e-4 of the largest |gradient|. A
 * wrong term (e.g. dropping the normalisation term of RMSNorm's Jacobian, checked below) is off by
 * O(1) of the gradient's scale. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/tensor.h"
#include "base/util.h"
#include "engine/backend.h"
#include "model/rope.h"

#define TOL 1e-4
#define FD_H 1e-5

static void fill(uint64_t *st, float *x, size_t n, double scale) {
    for (size_t i = 0; i < n; i++) x[i] = (float)(tu_rand_normal(st) * scale);
}

static m2d_backend *new_backend(const char *name, int threads) {
    m2d_backend_opts o = {.n_threads = threads};
    m2d_backend *be;
    if (m2d_backend_new(name, &o, &be)) fail_msg("%s", m2d_errmsg());
    if (!be->ops->train) fail_msg("backend %s has no training ops", name);
    return be;
}

/* TEST_on(backend) on every registered backend that trains (tu_backend_trains: the CPU always, a
 * device where this machine has one) */
#define EACH_BACKEND(test)                                                                      \
    static void test(void **state) {                                                            \
        (void)state;                                                                            \
        for (int i = 0; i < m2d_backend_count(); i++)                                          \
            if (tu_backend_trains(m2d_backend_kind_at(i)->name))                               \
                on_backend = m2d_backend_kind_at(i)->name, test##_on(on_backend);              \
    }

static m2d_buf *up(m2d_backend *be, const void *src, size_t bytes) {
    m2d_buf *b = be->ops->alloc(be, bytes);
    be->ops->upload(be, b, 0, src, bytes);
    return b;
}

static void down(m2d_backend *be, void *dst, m2d_buf *b, size_t bytes) { be->ops->download(be, dst, b, 0, bytes); }

static m2d_mat mat(m2d_buf *b, int rows, int cols) { return m2d_mat_of(b, 0, rows, cols, cols); }

/* ---- finite differences of a float64 scalar function of a vector ---- */
typedef double (*phi_fn)(void *ctx, const double *x);

static void fd_grad(phi_fn phi, void *ctx, const double *x0, int n, double *g) {
    double *x = m2d_malloc(sizeof(double) * (size_t)n);
    memcpy(x, x0, sizeof(double) * (size_t)n);
    for (int i = 0; i < n; i++) {
        double h = FD_H * fmax(1.0, fabs(x0[i]));
        x[i] = x0[i] + h;
        double a = phi(ctx, x);
        x[i] = x0[i] - h;
        double b = phi(ctx, x);
        x[i] = x0[i];
        g[i] = (a - b) / (2 * h);
    }
    free(x);
}

/* max |got - want| over max |want| (the gradient's scale) */
static double rel_err(const float *got, const double *want, int n) {
    double e = 0, s = 0;
    for (int i = 0; i < n; i++) {
        e = fmax(e, fabs(got[i] - want[i]));
        s = fmax(s, fabs(want[i]));
    }
    return s > 0 ? e / s : e;
}

static const char *on_backend = "cpu"; /* the backend EACH_BACKEND runs a check on */

/* the measured error is printed off the CPU (the GPU runner's log) and under M2D_SHOW_ERR */
static void check_grad(const char *what, const float *got, const double *want, int n) {
    double e = rel_err(got, want, n);
    if (getenv("M2D_SHOW_ERR") || strcmp(on_backend, "cpu") != 0)
        print_message("%s on %s: max relative error %.3g\n", what, on_backend, e);
    if (!(e < TOL)) fail_msg("%s on %s: relative gradient error %.3g >= %.3g", what, on_backend, e, TOL);
}

static double *to_double(const float *x, int n) {
    double *d = m2d_malloc(sizeof(double) * (size_t)n);
    for (int i = 0; i < n; i++) d[i] = x[i];
    return d;
}

/* ================= GEMM: y = x W^T ================= */
typedef struct { int n, in, out; const float *r; } gemm_ctx; /* x [n, in] then W [out, in] in the vector */

static double gemm_phi(void *vc, const double *v) {
    const gemm_ctx *c = vc;
    const double *x = v, *w = v + c->n * c->in;
    double s = 0;
    for (int i = 0; i < c->n; i++)
        for (int o = 0; o < c->out; o++) {
            double y = 0;
            for (int k = 0; k < c->in; k++) y += x[i * c->in + k] * w[o * c->in + k];
            s += c->r[i * c->out + o] * y;
        }
    return s;
}

/* dx = r W and dW = r^T x through the ops (beta = 0) at PREC, with threads T */
static void gemm_grads_at(const char *backend, int T, m2d_precision prec, int n, int in, int out, const float *x,
                          const float *w, const float *r, float *dx, float *dw) {
    m2d_backend *be = new_backend(backend, T);
    const m2d_backend_train_ops *tr = be->ops->train;
    m2d_buf *wb = up(be, w, sizeof(float) * out * in), *xb = up(be, x, sizeof(float) * n * in);
    m2d_buf *rb = up(be, r, sizeof(float) * n * out);
    m2d_buf *dxb = be->ops->alloc(be, sizeof(float) * n * in), *dwb = be->ops->alloc(be, sizeof(float) * out * in);
    m2d_weight *wh = tr->weight_view(be, wb, 0, out, in);
    m2d_mat X = mat(xb, n, in), R = mat(rb, n, out), DX = mat(dxb, n, in), DW = mat(dwb, out, in);
    be->ops->enter(be);
    tr->gemm_dx(be, &R, wh, &DX, 0.0f, prec);
    tr->gemm_dw(be, &R, &X, &DW, 0.0f, prec);
    assert_int_equal(be->ops->leave(be), 0);
    down(be, dx, dxb, sizeof(float) * n * in);
    down(be, dw, dwb, sizeof(float) * out * in);
    be->ops->weight_free(be, wh);
    m2d_buf *all[] = {wb, xb, rb, dxb, dwb};
    for (int i = 0; i < 5; i++) be->ops->release(be, all[i]);
    m2d_backend_free(be);
}

static void gemm_grads(const char *backend, int T, int n, int in, int out, const float *x, const float *w,
                       const float *r, float *dx, float *dw) {
    gemm_grads_at(backend, T, M2D_PREC_FP32, n, in, out, x, w, r, dx, dw);
}

static void gemm_case(const char *backend, int n, int in, int out, int with_fd) {
    uint64_t st = (uint64_t)(n * 131 + in * 7 + out);
    float *x = malloc(sizeof(float) * n * in), *w = malloc(sizeof(float) * out * in), *r = malloc(sizeof(float) * n * out);
    fill(&st, x, (size_t)n * in, 1), fill(&st, w, (size_t)out * in, 1), fill(&st, r, (size_t)n * out, 1);
    float *dx = malloc(sizeof(float) * n * in), *dw = malloc(sizeof(float) * out * in);
    float *dx3 = malloc(sizeof(float) * n * in), *dw3 = malloc(sizeof(float) * out * in);
    gemm_grads(backend, 1, n, in, out, x, w, r, dx, dw);
    gemm_grads(backend, 3, n, in, out, x, w, r, dx3, dw3);
    /* blocks fixed by the shape: the thread count changes nothing (one machine: exact) */
    assert_memory_equal(dx, dx3, sizeof(float) * n * in);
    assert_memory_equal(dw, dw3, sizeof(float) * out * in);
    int nv = n * in + out * in;
    double *v = malloc(sizeof(double) * nv), *g = malloc(sizeof(double) * nv);
    for (int i = 0; i < n * in; i++) v[i] = x[i];
    for (int i = 0; i < out * in; i++) v[n * in + i] = w[i];
    gemm_ctx c = {n, in, out, r};
    if (with_fd) {
        fd_grad(gemm_phi, &c, v, nv, g);
    } else { /* phi is bilinear: the analytic gradient in float64 is exact (large shapes) */
        for (int i = 0; i < n; i++)
            for (int k = 0; k < in; k++) {
                double s = 0;
                for (int o = 0; o < out; o++) s += (double)r[i * out + o] * w[o * in + k];
                g[i * in + k] = s;
            }
        for (int o = 0; o < out; o++)
            for (int k = 0; k < in; k++) {
                double s = 0;
                for (int i = 0; i < n; i++) s += (double)r[i * out + o] * x[i * in + k];
                g[n * in + o * in + k] = s;
            }
    }
    check_grad("gemm dx", dx, g, n * in);
    check_grad("gemm dw", dw, g + n * in, out * in);
    free(x), free(w), free(r), free(dx), free(dw), free(dx3), free(dw3), free(v), free(g);
}

static void gemm_backward_on(const char *backend) {
    gemm_case(backend, 5, 7, 6, 1);       /* one call */
    gemm_case(backend, 33, 9, 12, 1);     /* rows > a block */
    gemm_case(backend, 100, 160, 130, 0); /* split into blocks (by columns of dx, rows of dW) */
    gemm_case(backend, 300, 40, 90, 0);   /* split by rows of dx */
}
EACH_BACKEND(gemm_backward)

/* beta = 1 accumulates: dw = dy^T x + dw, dx = dy W + dx */
static void gemm_accumulates_on(const char *backend) {
    uint64_t st = 3;
    int n = 4, in = 5, out = 3;
    float x[20], w[15], r[12], dx0[20], dw0[15], dx[20], dw[15], gx[20], gw[15];
    fill(&st, x, 20, 1), fill(&st, w, 15, 1), fill(&st, r, 12, 1), fill(&st, dx0, 20, 1), fill(&st, dw0, 15, 1);
    gemm_grads(backend, 1, n, in, out, x, w, r, gx, gw);
    m2d_backend *be = new_backend(backend, 1);
    const m2d_backend_train_ops *tr = be->ops->train;
    m2d_buf *wb = up(be, w, sizeof w), *xb = up(be, x, sizeof x), *rb = up(be, r, sizeof r);
    m2d_buf *dxb = up(be, dx0, sizeof dx0), *dwb = up(be, dw0, sizeof dw0);
    m2d_weight *wh = tr->weight_view(be, wb, 0, out, in);
    m2d_mat X = mat(xb, n, in), R = mat(rb, n, out), DX = mat(dxb, n, in), DW = mat(dwb, out, in);
    tr->gemm_dx(be, &R, wh, &DX, 1.0f, M2D_PREC_FP32);
    tr->gemm_dw(be, &R, &X, &DW, 1.0f, M2D_PREC_FP32);
    down(be, dx, dxb, sizeof dx), down(be, dw, dwb, sizeof dw);
    for (int i = 0; i < 20; i++) assert_true(fabsf(dx[i] - (dx0[i] + gx[i])) < 1e-5f);
    for (int i = 0; i < 15; i++) assert_true(fabsf(dw[i] - (dw0[i] + gw[i])) < 1e-5f);
    be->ops->weight_free(be, wh);
    m2d_buf *all[] = {wb, xb, rb, dxb, dwb};
    for (int i = 0; i < 5; i++) be->ops->release(be, all[i]);
    m2d_backend_free(be);
}
EACH_BACKEND(gemm_accumulates)

/* ================= GEMM backward on bf16 operands (--train-precision bf16) ================= */

static double bf(float v) { return m2d_bf16_to_f32(m2d_f32_to_bf16(v)); }

/* A GEMM's result GOT [rows, cols] (row stride LD) against OLD[i, j] (NULL: 0) + sum over k of
 * A(i, k) B(k, j), for the operands' bf16 values (ROUND) or their own, summed in float64; an
 * element is outside when it misses that by more than SLACK u (|old| + sum|terms|), u = 2^-24.
 * Returns how many are. */
static int sums_outside(const float *got, const float *old, int rows, int cols, int ld, int K, const float *a,
                        int64_t as_i, int64_t as_k, const float *b, int64_t bs_k, int64_t bs_j, int round, double slack) {
    int outside = 0;
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) {
            double s = old ? old[(size_t)i * ld + j] : 0, mag = fabs(s);
            for (int k = 0; k < K; k++) {
                float av = a[i * as_i + k * as_k], bv = b[k * bs_k + j * bs_j];
                double t = round ? bf(av) * bf(bv) : (double)av * bv;
                s += t, mag += fabs(t);
            }
            outside += !(fabs(got[(size_t)i * ld + j] - s) <= slack * 0x1p-24 * mag + 1e-30);
        }
    return outside;
}

/* A dense GOT [rows, cols] against sums of K products: the products of bf16 values are exact in
 * fp32 (8 + 8 significant bits), so the only error is the fp32 summation of K of them, at most
 * K u sum|terms| in any order. */
static int bf16_sums_outside(const float *got, int rows, int cols, int K, const float *a, int64_t as_i, int64_t as_k,
                             const float *b, int64_t bs_k, int64_t bs_j, int round) {
    return sums_outside(got, NULL, rows, cols, cols, K, a, as_i, as_k, b, bs_k, bs_j, round, K);
}

static void gemm_bf16_case(const char *backend, int n, int in, int out) {
    uint64_t st = (uint64_t)(n * 31 + in * 5 + out);
    float *x = malloc(sizeof(float) * n * in), *w = malloc(sizeof(float) * out * in), *r = malloc(sizeof(float) * n * out);
    fill(&st, x, (size_t)n * in, 1), fill(&st, w, (size_t)out * in, 1), fill(&st, r, (size_t)n * out, 1);
    float *dx = malloc(sizeof(float) * n * in), *dw = malloc(sizeof(float) * out * in);
    float *dx3 = malloc(sizeof(float) * n * in), *dw3 = malloc(sizeof(float) * out * in);
    gemm_grads_at(backend, 1, M2D_PREC_BF16, n, in, out, x, w, r, dx, dw);
    gemm_grads_at(backend, 3, M2D_PREC_BF16, n, in, out, x, w, r, dx3, dw3);
    assert_memory_equal(dx, dx3, sizeof(float) * n * in); /* blocks fixed by the shape, as in fp32 */
    assert_memory_equal(dw, dw3, sizeof(float) * out * in);
    /* dx[i, c] = sum_o r[i, o] W[o, c]; dW[o, c] = sum_i r[i, o] x[i, c] */
    int bad_dx = bf16_sums_outside(dx, n, in, out, r, out, 1, w, in, 1, 1);
    int bad_dw = bf16_sums_outside(dw, out, in, n, r, 1, out, x, in, 1, 1);
    if (bad_dx || bad_dw)
        fail_msg("bf16 gemm backward on %s, %d x %d x %d: %d dx and %d dW elements outside K u sum|terms| of the sums "
                 "of bf16 operands", backend, n, in, out, bad_dx, bad_dw);
    /* the operands were rounded: most elements miss the unrounded sums by more than that bound */
    assert_true(bf16_sums_outside(dx, n, in, out, r, out, 1, w, in, 1, 0) > n * in / 2);
    assert_true(bf16_sums_outside(dw, out, in, n, r, 1, out, x, in, 1, 0) > out * in / 2);
    if (strcmp(backend, "cpu") != 0) print_message("bf16 gemm backward on %s, %d x %d x %d: within K u\n", backend, n, in, out);
    free(x), free(w), free(r), free(dx), free(dw), free(dx3), free(dw3);
}

static void gemm_bf16_backward_on(const char *backend) {
    gemm_bf16_case(backend, 5, 7, 6);       /* one call */
    gemm_bf16_case(backend, 100, 160, 130); /* blocks of dx's columns (W rounded per block), dW's rows */
    gemm_bf16_case(backend, 300, 40, 90);   /* blocks of dx's rows (W rounded whole) */
}
EACH_BACKEND(gemm_bf16_backward)

/* dx = dy W + dx and dW = dy^T x + dW (beta 1, as the trainer's accumulations) at bf16 on windows of
 * wider rows (ld > cols, at an offset, as the trainer's slices of its activations): each element
 * within 2 (K + 1) u (sum|terms| + |old|) of the exact sum: K terms and the old value take K
 * additions, at most K u (sum|terms| + |old|) off in any order with round-to-nearest (gamma_K <=
 * (K + 1) u), doubled for tensor cores, whose accumulation truncates (up to ~2 K u in published
 * models of A100/H100); a skipped beta or a wrong window is off by O(1). Every element past a
 * window's columns untouched. */
static void gemm_bf16_windows_accumulate_on(const char *backend) {
    enum { n = 37, in = 70, out = 50, off = 3, ldx = in + 5, ldy = out + 7, ldd = in + 3, ldw = in + 1 };
    uint64_t st = 11;
    static float x[off + n * ldx], r[off + n * ldy], w[out * in], dx0[off + n * ldd], dw0[off + out * ldw];
    static float dx[off + n * ldd], dw[off + out * ldw];
    fill(&st, x, off + n * ldx, 1), fill(&st, r, off + n * ldy, 1), fill(&st, w, out * in, 1);
    fill(&st, dx0, off + n * ldd, 1), fill(&st, dw0, off + out * ldw, 1);
    m2d_backend *be = new_backend(backend, 2);
    const m2d_backend_train_ops *tr = be->ops->train;
    m2d_buf *xb = up(be, x, sizeof x), *rb = up(be, r, sizeof r), *wb = up(be, w, sizeof w);
    m2d_buf *dxb = up(be, dx0, sizeof dx0), *dwb = up(be, dw0, sizeof dw0);
    m2d_weight *wh = tr->weight_view(be, wb, 0, out, in);
    m2d_mat X = m2d_mat_of(xb, off, n, in, ldx), R = m2d_mat_of(rb, off, n, out, ldy);
    m2d_mat DX = m2d_mat_of(dxb, off, n, in, ldd), DW = m2d_mat_of(dwb, off, out, in, ldw);
    be->ops->enter(be);
    tr->gemm_dx(be, &R, wh, &DX, 1.0f, M2D_PREC_BF16);
    tr->gemm_dw(be, &R, &X, &DW, 1.0f, M2D_PREC_BF16);
    assert_int_equal(be->ops->leave(be), 0);
    down(be, dx, dxb, sizeof dx), down(be, dw, dwb, sizeof dw);
    int bad_dx = sums_outside(dx + off, dx0 + off, n, in, ldd, out, r + off, ldy, 1, w, in, 1, 1, 2.0 * (out + 1));
    int bad_dw = sums_outside(dw + off, dw0 + off, out, in, ldw, n, r + off, 1, ldy, x + off, ldx, 1, 1, 2.0 * (n + 1));
    if (bad_dx || bad_dw)
        fail_msg("bf16 gemm backward on %s, windows with beta 1: %d dx and %d dW elements outside 2 (K + 1) u", backend,
                 bad_dx, bad_dw);
    for (int i = 0; i < off; i++) assert_true(dx[i] == dx0[i] && dw[i] == dw0[i]);
    for (int i = 0; i < n; i++)
        for (int j = in; j < ldd; j++) assert_true(dx[off + i * ldd + j] == dx0[off + i * ldd + j]);
    for (int o = 0; o < out; o++)
        for (int j = in; j < ldw; j++) assert_true(dw[off + o * ldw + j] == dw0[off + o * ldw + j]);
    be->ops->weight_free(be, wh);
    m2d_buf *all[] = {xb, rb, wb, dxb, dwb};
    for (int i = 0; i < 5; i++) be->ops->release(be, all[i]);
    m2d_backend_free(be);
}
EACH_BACKEND(gemm_bf16_windows_accumulate)

/* y = x W^T at PREC on a fresh backend (the reference of bf16_dx_follows_the_weights) */
static void forward_fresh(const char *backend, m2d_precision prec, int n, int in, int out, const float *x, const float *w,
                          float *y) {
    m2d_backend *be = new_backend(backend, 2);
    m2d_buf *xb = up(be, x, sizeof(float) * n * in), *wb = up(be, w, sizeof(float) * out * in);
    m2d_buf *yb = be->ops->alloc(be, sizeof(float) * n * out);
    m2d_weight *wh = be->ops->train->weight_view(be, wb, 0, out, in);
    m2d_mat X = mat(xb, n, in), Y = mat(yb, n, out);
    be->ops->enter(be);
    be->ops->gemm(be, &X, wh, 0, &Y, 0.0f, prec);
    assert_int_equal(be->ops->leave(be), 0);
    down(be, y, yb, sizeof(float) * n * out);
    be->ops->weight_free(be, wh);
    be->ops->release(be, xb), be->ops->release(be, wb), be->ops->release(be, yb);
    m2d_backend_free(be);
}

/* A backend may keep derived copies of a weight between ops (the CPU: its bf16 transpose, for a
 * step's micro-batches; cuda: its bf16 values, for the forward and dx): AdamW's change of the
 * weights within one enter/leave bracket, and a write between brackets, must reach the next dx and
 * forward; outside a bracket nothing may be kept. Each result equals a fresh backend's on the
 * current weights (bit for bit: the same computation). */
static void bf16_dx_follows_the_weights_on(const char *backend) {
    enum { n = 40, in = 96, out = 80 };
    uint64_t st = 5;
    float w[out * in], r[n * out], g[out * in], zero[out * in], dx[n * in], want[n * in], wnow[out * in];
    fill(&st, w, out * in, 1), fill(&st, r, n * out, 1), fill(&st, g, out * in, 1);
    memset(zero, 0, sizeof zero);
    m2d_backend *be = new_backend(backend, 2);
    const m2d_backend_train_ops *tr = be->ops->train;
    m2d_buf *wb = up(be, w, sizeof w), *rb = up(be, r, sizeof r), *gb = up(be, g, sizeof g);
    m2d_buf *mb = up(be, zero, sizeof zero), *vb = up(be, zero, sizeof zero), *dxb = be->ops->alloc(be, sizeof dx);
    m2d_weight *wh = tr->weight_view(be, wb, 0, out, in);
    m2d_mat R = mat(rb, n, out), DX = mat(dxb, n, in);
    float xf[n * in], y[n * out], want_y[n * out];
    fill(&st, xf, n * in, 1);
    m2d_buf *xfb = up(be, xf, sizeof xf), *yb = be->ops->alloc(be, sizeof y);
    m2d_mat XF = mat(xfb, n, in), Y = mat(yb, n, out);
    m2d_adamw_args a = {0.05, 0.9, 0.95, 1e-8, 0.0, 1, 1.0f};
    for (int round = 0; round < 3; round++) {
        be->ops->enter(be);
        be->ops->gemm(be, &XF, wh, 0, &Y, 0.0f, M2D_PREC_BF16);
        tr->gemm_dx(be, &R, wh, &DX, 0.0f, M2D_PREC_BF16);
        if (round < 2) tr->adamw(be, wb, gb, mb, vb, 0, out * in, &a); /* inside the bracket */
        if (round < 2) tr->gemm_dx(be, &R, wh, &DX, 0.0f, M2D_PREC_BF16);
        if (round < 2) be->ops->gemm(be, &XF, wh, 0, &Y, 0.0f, M2D_PREC_BF16);
        assert_int_equal(be->ops->leave(be), 0);
        down(be, dx, dxb, sizeof dx), down(be, wnow, wb, sizeof wnow), down(be, y, yb, sizeof y);
        float no_dw[out * in];
        gemm_grads_at(backend, 2, M2D_PREC_BF16, n, in, out, zero, wnow, r, want, no_dw);
        assert_memory_equal(dx, want, sizeof dx);
        forward_fresh(backend, M2D_PREC_BF16, n, in, out, xf, wnow, want_y);
        assert_memory_equal(y, want_y, sizeof y);
        if (round == 1) { /* between brackets: new weights written directly */
            fill(&st, w, out * in, 1);
            be->ops->upload(be, wb, 0, w, sizeof w);
        }
    }
    /* outside any bracket (nothing kept): the same bits as inside one, dx and dW */
    float x[n * in], dw[out * in], want_dw[out * in];
    fill(&st, x, n * in, 1);
    m2d_buf *xb = up(be, x, sizeof x), *dwb = be->ops->alloc(be, sizeof dw);
    m2d_mat X = mat(xb, n, in), DW = mat(dwb, out, in);
    tr->gemm_dx(be, &R, wh, &DX, 0.0f, M2D_PREC_BF16);
    tr->gemm_dw(be, &R, &X, &DW, 0.0f, M2D_PREC_BF16);
    down(be, dx, dxb, sizeof dx), down(be, dw, dwb, sizeof dw), down(be, wnow, wb, sizeof wnow);
    gemm_grads_at(backend, 2, M2D_PREC_BF16, n, in, out, x, wnow, r, want, want_dw);
    assert_memory_equal(dx, want, sizeof dx);
    assert_memory_equal(dw, want_dw, sizeof dw);
    be->ops->release(be, xb), be->ops->release(be, dwb), be->ops->release(be, xfb), be->ops->release(be, yb);
    be->ops->weight_free(be, wh);
    m2d_buf *all[] = {wb, rb, gb, mb, vb, dxb};
    for (int i = 0; i < 6; i++) be->ops->release(be, all[i]);
    m2d_backend_free(be);
}
EACH_BACKEND(bf16_dx_follows_the_weights)

/* Forward (rows ROW0.. of each view) and dx (each whole view) at bf16, into Y[v] and DX[v]; in
 * a nested bracket when BRACKET (where a backend may keep derived copies of the weights) */
static void views_bf16(m2d_backend *be, m2d_weight *const *wh, int row0, const m2d_mat *X, m2d_mat *Y, const m2d_mat *R,
                       m2d_mat *DX, int bracket) {
    if (bracket) be->ops->enter(be), be->ops->enter(be);
    for (int v = 0; v < 2; v++) be->ops->gemm(be, X, wh[v], row0, &Y[v], 0.0f, M2D_PREC_BF16);
    if (bracket) assert_int_equal(be->ops->leave(be), 0); /* the inner one: nothing changes */
    for (int v = 0; v < 2; v++) be->ops->train->gemm_dx(be, R, wh[v], &DX[v], 0.0f, M2D_PREC_BF16);
    for (int v = 0; v < 2; v++) be->ops->gemm(be, X, wh[v], row0, &Y[v], 0.0f, M2D_PREC_BF16);
    if (bracket) assert_int_equal(be->ops->leave(be), 0);
}

/* Two weight views over one buffer at odd element offsets, the forward from row 3 (3 x 96 bf16
 * elements: 576 bytes in, a 64-byte alignment where a converted copy's start has 256), dx of each
 * whole view: the same bits with and without the backend's kept copies (outside a bracket, inside a
 * nested one, and on a device with bf16_wcache 0 and 1, when it has that knob), each the same
 * computation on the same values. */
static void bf16_weight_copies_keep_the_bits_on(const char *backend) {
    enum { n = 24, in = 96, out = 40, row0 = 3, off0 = 7, gap = 5 };
    size_t wn = off0 + 2 * (size_t)out * in + gap;
    uint64_t st = 9;
    float *w = malloc(sizeof(float) * wn), x[n * in], r[n * out];
    fill(&st, w, wn, 1), fill(&st, x, n * in, 1), fill(&st, r, n * out, 1);
    m2d_backend *be = new_backend(backend, 2);
    m2d_buf *wb = up(be, w, sizeof(float) * wn), *xb = up(be, x, sizeof x), *rb = up(be, r, sizeof r);
    m2d_weight *wh[2] = {be->ops->train->weight_view(be, wb, off0, out, in),
                         be->ops->train->weight_view(be, wb, off0 + (size_t)out * in + gap, out, in)};
    m2d_buf *yb[2], *dxb[2];
    m2d_mat X = mat(xb, n, in), R = mat(rb, n, out), Y[2], DX[2];
    for (int v = 0; v < 2; v++) {
        yb[v] = be->ops->alloc(be, sizeof(float) * n * (out - row0)), dxb[v] = be->ops->alloc(be, sizeof(float) * n * in);
        Y[v] = mat(yb[v], n, out - row0), DX[v] = mat(dxb[v], n, in);
    }
    float ref[2][n * (out - row0) + n * in], got[2][n * (out - row0) + n * in];
    views_bf16(be, wh, row0, &X, Y, &R, DX, 0);
    for (int v = 0; v < 2; v++) down(be, ref[v], yb[v], sizeof(float) * n * (out - row0)), down(be, ref[v] + n * (out - row0), dxb[v], sizeof(float) * n * in);
    int has_knob = be->ops->tune(be, "bf16_wcache", 1) == 0;
    for (int cache = has_knob; cache >= 0; cache--) {
        if (has_knob) assert_int_equal(be->ops->tune(be, "bf16_wcache", cache), 0);
        views_bf16(be, wh, row0, &X, Y, &R, DX, 1);
        for (int v = 0; v < 2; v++) {
            down(be, got[v], yb[v], sizeof(float) * n * (out - row0)), down(be, got[v] + n * (out - row0), dxb[v], sizeof(float) * n * in);
            if (memcmp(got[v], ref[v], sizeof ref[v]) != 0)
                fail_msg("%s, view %d, bf16_wcache %d: other bits inside a bracket than outside", backend, v, cache);
        }
        if (!has_knob) break;
    }
    for (int v = 0; v < 2; v++) be->ops->weight_free(be, wh[v]), be->ops->release(be, yb[v]), be->ops->release(be, dxb[v]);
    be->ops->release(be, wb), be->ops->release(be, xb), be->ops->release(be, rb);
    m2d_backend_free(be);
    free(w);
}
EACH_BACKEND(bf16_weight_copies_keep_the_bits)

/* ================= RMSNorm ================= */
typedef struct { int rows, d; double eps; const float *r; int drop_term; } rms_ctx; /* x then w */

static double rms_phi(void *vc, const double *v) {
    const rms_ctx *c = vc;
    const double *x = v, *w = v + c->rows * c->d;
    double s = 0;
    for (int i = 0; i < c->rows; i++) {
        double ss = 0;
        for (int j = 0; j < c->d; j++) ss += x[i * c->d + j] * x[i * c->d + j];
        double inv = 1.0 / sqrt(ss / c->d + c->eps);
        for (int j = 0; j < c->d; j++) s += c->r[i * c->d + j] * x[i * c->d + j] * inv * w[j];
    }
    return s;
}

/* the backward op's dx and dw for x [rows, d] (threads T) */
static void rms_grads(const char *backend, int T, int rows, int d, const float *x, const float *w, const float *r,
                      double eps, float *dx, float *dw) {
    m2d_backend *be = new_backend(backend, T);
    const m2d_backend_train_ops *tr = be->ops->train;
    m2d_buf *xb = up(be, x, sizeof(float) * rows * d), *wb = up(be, w, sizeof(float) * d);
    m2d_buf *rb = up(be, r, sizeof(float) * rows * d), *dxb = be->ops->alloc(be, sizeof(float) * rows * d);
    m2d_buf *dwb = be->ops->alloc(be, sizeof(float) * d);
    tr->fill(be, dwb, 0, (size_t)d, 0.0f);
    m2d_weight *wh = tr->weight_view(be, wb, 0, d, 1);
    m2d_mat X = mat(xb, rows, d), R = mat(rb, rows, d), DX = mat(dxb, rows, d), DW = mat(dwb, 1, d);
    tr->rmsnorm_bwd(be, &X, wh, eps, &R, &DX, 0.0f, &DW);
    down(be, dx, dxb, sizeof(float) * rows * d), down(be, dw, dwb, sizeof(float) * d);
    be->ops->weight_free(be, wh);
    m2d_buf *all[] = {xb, wb, rb, dxb, dwb};
    for (int i = 0; i < 5; i++) be->ops->release(be, all[i]);
    m2d_backend_free(be);
}

static void rmsnorm_backward_on(const char *backend) {
    uint64_t st = 11;
    enum { R = 150, D = 24 }; /* 150 rows: three fixed chunks of the dw sum */
    float *x = malloc(sizeof(float) * R * D), *r = malloc(sizeof(float) * R * D), w[D];
    fill(&st, x, R * D, 1), fill(&st, r, R * D, 1);
    for (int j = 0; j < D; j++) w[j] = (float)(1 + 0.3 * tu_rand_normal(&st));
    float *dx = malloc(sizeof(float) * R * D), dw[D], *dx2 = malloc(sizeof(float) * R * D), dw2[D];
    rms_grads(backend, 1, R, D, x, w, r, 1e-6, dx, dw);
    rms_grads(backend, 4, R, D, x, w, r, 1e-6, dx2, dw2);
    /* 1 vs 4 threads, one machine: exact (see the top) */
    assert_memory_equal(dx, dx2, sizeof(float) * R * D);
    assert_memory_equal(dw, dw2, sizeof dw);
    int nv = R * D + D;
    double *v = malloc(sizeof(double) * nv), *g = malloc(sizeof(double) * nv);
    for (int i = 0; i < R * D; i++) v[i] = x[i];
    for (int j = 0; j < D; j++) v[R * D + j] = w[j];
    rms_ctx c = {R, D, 1e-6, r, 0};
    fd_grad(rms_phi, &c, v, nv, g);
    check_grad("rmsnorm dx", dx, g, R * D);
    check_grad("rmsnorm dw", dw, g + R * D, D);
    /* the check has teeth: without the normalisation term of the Jacobian the error is O(1) */
    for (int i = 0; i < R; i++) {
        double ss = 0;
        for (int j = 0; j < D; j++) ss += (double)x[i * D + j] * x[i * D + j];
        double inv = 1.0 / sqrt(ss / D + 1e-6);
        for (int j = 0; j < D; j++) dx2[i * D + j] = (float)(inv * w[j] * r[i * D + j]);
    }
    assert_true(rel_err(dx2, g, R * D) > 100 * TOL);
    /* in place (dx = dy, beta 0): the net's q/k norm backward; same result (the same op, one
     * machine, reading each row before writing it: exact) */
    m2d_backend *be = new_backend(backend, 2);
    m2d_buf *xb = up(be, x, sizeof(float) * R * D), *wb = up(be, w, sizeof w), *rb = up(be, r, sizeof(float) * R * D);
    m2d_buf *dwb = be->ops->alloc(be, sizeof dw);
    be->ops->train->fill(be, dwb, 0, D, 0.0f);
    m2d_weight *wh = be->ops->train->weight_view(be, wb, 0, D, 1);
    m2d_mat X = mat(xb, R, D), RR = mat(rb, R, D), DW = mat(dwb, 1, D);
    be->ops->train->rmsnorm_bwd(be, &X, wh, 1e-6, &RR, &RR, 0.0f, &DW);
    down(be, dx2, rb, sizeof(float) * R * D), down(be, dw2, dwb, sizeof dw2);
    assert_memory_equal(dx, dx2, sizeof(float) * R * D);
    assert_memory_equal(dw, dw2, sizeof dw);
    be->ops->weight_free(be, wh);
    m2d_buf *all[] = {xb, wb, rb, dwb};
    for (int i = 0; i < 4; i++) be->ops->release(be, all[i]);
    m2d_backend_free(be);
    free(x), free(r), free(dx), free(dx2), free(v), free(g);
}
EACH_BACKEND(rmsnorm_backward)

/* beta = 1: dx accumulates (the residual stream's gradient) and dw adds to what it held */
static void rmsnorm_backward_accumulates_on(const char *backend) {
    uint64_t st = 12;
    float x[24], r[24], w[8], g0[24], dwfresh[8], dxfresh[24], dx[24], dw[8];
    fill(&st, x, 24, 1), fill(&st, r, 24, 1), fill(&st, w, 8, 1), fill(&st, g0, 24, 1);
    rms_grads(backend, 1, 3, 8, x, w, r, 1e-5, dxfresh, dwfresh);
    m2d_backend *be = new_backend(backend, 1);
    const m2d_backend_train_ops *tr = be->ops->train;
    m2d_buf *xb = up(be, x, sizeof x), *wb = up(be, w, sizeof w), *rb = up(be, r, sizeof r), *dxb = up(be, g0, sizeof g0);
    float ones[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    m2d_buf *dwb = up(be, ones, sizeof ones);
    m2d_weight *wh = tr->weight_view(be, wb, 0, 8, 1);
    m2d_mat X = mat(xb, 3, 8), R = mat(rb, 3, 8), DX = mat(dxb, 3, 8), DW = mat(dwb, 1, 8);
    tr->rmsnorm_bwd(be, &X, wh, 1e-5, &R, &DX, 1.0f, &DW);
    down(be, dx, dxb, sizeof dx), down(be, dw, dwb, sizeof dw);
    for (int i = 0; i < 24; i++) assert_true(fabsf(dx[i] - (g0[i] + dxfresh[i])) < 1e-5f);
    for (int i = 0; i < 8; i++) assert_true(fabsf(dw[i] - (1 + dwfresh[i])) < 1e-5f);
    be->ops->weight_free(be, wh);
    m2d_buf *all[] = {xb, wb, rb, dxb, dwb};
    for (int i = 0; i < 5; i++) be->ops->release(be, all[i]);
    m2d_backend_free(be);
}
EACH_BACKEND(rmsnorm_backward_accumulates)

/* ================= RoPE: backward = forward at negated positions ================= */
/* pair i of the first ROT dims of each head turns by pos * freq[i], cos and sin times GAIN */
typedef struct { int rows, heads, hd, rot; const int32_t *pos; const double *freq; double gain; const float *r; } rope_ctx;

static double rope_phi(void *vc, const double *x) {
    const rope_ctx *c = vc;
    int half = c->rot / 2;
    double s = 0;
    for (int t = 0; t < c->rows; t++)
        for (int h = 0; h < c->heads; h++) {
            const double *v = x + ((size_t)t * c->heads + h) * c->hd;
            const float *r = c->r + ((size_t)t * c->heads + h) * c->hd;
            for (int i = 0; i < half; i++) {
                double f = c->pos[t] * c->freq[i];
                s += c->gain * (r[i] * (v[i] * cos(f) - v[i + half] * sin(f)) +
                                r[i + half] * (v[i + half] * cos(f) + v[i] * sin(f)));
            }
            for (int i = c->rot; i < c->hd; i++) s += r[i] * v[i]; /* not rotated */
        }
    return s;
}

/* the backward (rope at -pos with the same arguments) against finite differences */
static void rope_case(const char *backend, const m2d_rope_args *ra, const double *freq, double gain, int rot) {
    uint64_t st = 21;
    enum { T = 9, H = 3, HD = 8, N = T * H * HD };
    int32_t pos[T], neg[T];
    for (int t = 0; t < T; t++) pos[t] = 3 * t + 1, neg[t] = -pos[t];
    float x[N], r[N], dx[N];
    fill(&st, x, N, 1), fill(&st, r, N, 1);
    m2d_backend *be = new_backend(backend, 2);
    m2d_buf *rb = up(be, r, sizeof r), *pb = up(be, neg, sizeof neg);
    m2d_mat R = mat(rb, T, H * HD);
    be->ops->rope(be, &R, H, HD, pb, ra);
    down(be, dx, rb, sizeof dx);
    be->ops->release(be, rb), be->ops->release(be, pb);
    m2d_backend_free(be);
    double *v = to_double(x, N), g[N];
    rope_ctx c = {T, H, HD, rot, pos, freq, gain, r};
    fd_grad(rope_phi, &c, v, N, g);
    check_grad(rot < HD ? "rope dx (YaRN, partial)" : "rope dx", dx, g, N);
    free(v);
}

static void rope_backward_on(const char *backend) {
    double freq[4];
    for (int i = 0; i < 4; i++) freq[i] = pow(10000.0, -2.0 * i / 8);
    m2d_rope_args plain = {.kind = M2D_ROPE_NEOX, .theta = 10000.0};
    rope_case(backend, &plain, freq, 1.0, 8);
    /* YaRN (an inv_freq table, attn_factor on cos and sin) on the first 4 of 8 dims: the rest pass
     * through; R(p)^T = R(-p) holds with the gain, which is linear */
    m2d_rope_scaling y = {.kind = M2D_ROPE_SCALING_YARN, .factor = 4, .original_max_position_embeddings = 16};
    double inv[2];
    m2d_rope_inv_freq(&y, 10000.0, 4, inv);
    double gain = m2d_rope_attention_factor(&y);
    assert_true(gain > 1.1); /* 0.1 ln 4 + 1 */
    m2d_rope_args yarn = {.kind = M2D_ROPE_NEOX, .theta = 10000.0, .inv_freq = inv, .attn_factor = gain, .rot_dim = 4};
    rope_case(backend, &yarn, inv, gain, 4);
}
EACH_BACKEND(rope_backward)

/* ================= attention ================= */
/* q [n, H hd], k [n, KV hd], v [n, KV hd], then (with SINKS) the H sink logits; WINDOW 0: causal;
 * SCALE 0: 1/sqrt(hd) */
typedef struct { int n, H, KV, hd; const float *r; int window, sinks; double scale; } att_ctx;

static void att_ref(const att_ctx *c, const double *q, const double *k, const double *v, const double *sink,
                    double *out) {
    int n = c->n, H = c->H, KV = c->KV, hd = c->hd, qd = H * hd, kvd = KV * hd;
    double *p = m2d_malloc(sizeof(double) * (size_t)n), scale = c->scale != 0 ? c->scale : 1 / sqrt((double)hd);
    for (int h = 0; h < H; h++) {
        int g = h / (H / KV);
        for (int i = 0; i < n; i++) {
            int lo = c->window > 0 && i + 1 > c->window ? i + 1 - c->window : 0;
            double m = sink ? sink[h] : -INFINITY, s = 0;
            for (int t = lo; t <= i; t++) {
                double d = 0;
                for (int j = 0; j < hd; j++) d += q[i * qd + h * hd + j] * k[t * kvd + g * hd + j];
                p[t] = d * scale;
                m = fmax(m, p[t]);
            }
            for (int t = lo; t <= i; t++) s += (p[t] = exp(p[t] - m));
            if (sink) s += exp(sink[h] - m);
            for (int j = 0; j < hd; j++) {
                double o = 0;
                for (int t = lo; t <= i; t++) o += p[t] / s * v[t * kvd + g * hd + j];
                out[i * qd + h * hd + j] = o;
            }
        }
    }
    free(p);
}

static double att_phi(void *vc, const double *x) {
    const att_ctx *c = vc;
    int n = c->n, qd = c->H * c->hd, kvd = c->KV * c->hd;
    double *out = m2d_malloc(sizeof(double) * (size_t)n * qd), s = 0;
    att_ref(c, x, x + n * qd, x + n * qd + n * kvd, c->sinks ? x + n * qd + 2 * n * kvd : NULL, out);
    for (int i = 0; i < n * qd; i++) s += c->r[i] * out[i];
    free(out);
    return s;
}

/* forward (the backend's attention op) and backward of one segment, threads T; SINK / DSINK [H]
 * when c->sinks */
static void att_grads(const char *backend, int T, const att_ctx *c, const float *q, const float *k, const float *v,
                      const float *sink, float *dq, float *dk, float *dv, float *dsink) {
    int n = c->n, qd = c->H * c->hd, kvd = c->KV * c->hd;
    m2d_backend *be = new_backend(backend, T);
    const m2d_backend_train_ops *tr = be->ops->train;
    m2d_buf *qb = up(be, q, sizeof(float) * n * qd), *kb = up(be, k, sizeof(float) * n * kvd);
    m2d_buf *vb = up(be, v, sizeof(float) * n * kvd), *ob = be->ops->alloc(be, sizeof(float) * n * qd);
    m2d_buf *rb = up(be, c->r, sizeof(float) * n * qd), *dqb = be->ops->alloc(be, sizeof(float) * n * qd);
    m2d_buf *dkb = be->ops->alloc(be, sizeof(float) * n * kvd), *dvb = be->ops->alloc(be, sizeof(float) * n * kvd);
    float zero[64] = {0};
    m2d_buf *sb = up(be, c->sinks ? sink : zero, sizeof(float) * c->H), *dsb = up(be, zero, sizeof(float) * c->H);
    m2d_weight *sw = c->sinks ? tr->weight_view(be, sb, 0, c->H, 1) : NULL;
    m2d_attn_args a = {.q = mat(qb, n, qd), .k = mat(kb, n, kvd), .v = mat(vb, n, kvd), .n_heads = c->H,
                       .n_kv = c->KV, .head_dim = c->hd, .out = mat(ob, n, qd), .window = c->window, .sinks = sw,
                       .scale = (float)c->scale};
    be->ops->attention(be, &a);
    m2d_attn_bwd_args b = {.q = a.q, .k = a.k, .v = a.v, .out = a.out, .dout = mat(rb, n, qd), .dq = mat(dqb, n, qd),
                           .dk = mat(dkb, n, kvd), .dv = mat(dvb, n, kvd), .n_heads = c->H, .n_kv = c->KV,
                           .head_dim = c->hd, .window = c->window, .sinks = sw, .dsinks = mat(dsb, 1, c->H),
                           .scale = (float)c->scale};
    tr->attention_bwd(be, &b);
    down(be, dq, dqb, sizeof(float) * n * qd), down(be, dk, dkb, sizeof(float) * n * kvd);
    down(be, dv, dvb, sizeof(float) * n * kvd), down(be, dsink, dsb, sizeof(float) * c->H);
    if (sw) be->ops->weight_free(be, sw);
    m2d_buf *all[] = {qb, kb, vb, ob, rb, dqb, dkb, dvb, sb, dsb};
    for (int i = 0; i < 10; i++) be->ops->release(be, all[i]);
    m2d_backend_free(be);
}

static void attention_case(const char *backend, int window, int sinks, double scale) {
    uint64_t st = 31;
    enum { NQ = 13, H = 4, KV = 2, HD = 8, QD = H * HD, KVD = KV * HD };
    float q[NQ * QD], k[NQ * KVD], v[NQ * KVD], r[NQ * QD], sink[H];
    fill(&st, q, NQ * QD, 1), fill(&st, k, NQ * KVD, 1), fill(&st, v, NQ * KVD, 1), fill(&st, r, NQ * QD, 1);
    fill(&st, sink, H, 1);
    att_ctx c = {NQ, H, KV, HD, r, window, sinks, scale};
    float dq[NQ * QD], dk[NQ * KVD], dv[NQ * KVD], dq3[NQ * QD], dk3[NQ * KVD], dv3[NQ * KVD], ds[H], ds3[H];
    att_grads(backend, 1, &c, q, k, v, sink, dq, dk, dv, ds);
    att_grads(backend, 3, &c, q, k, v, sink, dq3, dk3, dv3, ds3);
    assert_memory_equal(dq, dq3, sizeof dq), assert_memory_equal(dk, dk3, sizeof dk), assert_memory_equal(dv, dv3, sizeof dv);
    assert_memory_equal(ds, ds3, sizeof ds);
    int nv = NQ * QD + 2 * NQ * KVD + (sinks ? H : 0);
    double *x = malloc(sizeof(double) * nv), *g = malloc(sizeof(double) * nv);
    for (int i = 0; i < NQ * QD; i++) x[i] = q[i];
    for (int i = 0; i < NQ * KVD; i++) x[NQ * QD + i] = k[i], x[NQ * QD + NQ * KVD + i] = v[i];
    for (int i = 0; sinks && i < H; i++) x[NQ * QD + 2 * NQ * KVD + i] = sink[i];
    fd_grad(att_phi, &c, x, nv, g);
    check_grad("attention dq", dq, g, NQ * QD);
    check_grad("attention dk", dk, g + NQ * QD, NQ * KVD);
    check_grad("attention dv", dv, g + NQ * QD + NQ * KVD, NQ * KVD);
    if (sinks) check_grad("attention dsinks", ds, g + NQ * QD + 2 * NQ * KVD, H);
    else for (int i = 0; i < H; i++) assert_true(ds[i] == 0.0f); /* no sinks: dsinks untouched (exact) */
    free(x), free(g);
}

static void attention_backward_on(const char *backend) {
    attention_case(backend, 0, 0, 0);
    /* GPT-OSS's: a window of 5 of 13 rows (the mask cuts in from row 5), sinks, and a scale
     * other than 1/sqrt(hd) (DeepSeek's kind) */
    attention_case(backend, 5, 1, 0.21);
}
EACH_BACKEND(attention_backward)

/* ================= SwiGLU ================= */
typedef struct { int n; const float *r; } glu_ctx; /* g then u */

static double glu_phi(void *vc, const double *x) {
    const glu_ctx *c = vc;
    double s = 0;
    for (int i = 0; i < c->n; i++) s += c->r[i] * x[i] / (1 + exp(-x[i])) * x[c->n + i];
    return s;
}

static void glu_backward_on(const char *backend) {
    uint64_t st = 41;
    enum { R = 6, C = 11, N = R * C };
    float g[N], u[N], r[N], dg[N], du[N];
    fill(&st, g, N, 2), fill(&st, u, N, 1), fill(&st, r, N, 1);
    m2d_backend *be = new_backend(backend, 2);
    m2d_buf *gb = up(be, g, sizeof g), *ub = up(be, u, sizeof u), *db = up(be, r, sizeof r);
    m2d_buf *dub = be->ops->alloc(be, sizeof du);
    m2d_mat G = mat(gb, R, C), U = mat(ub, R, C), DG = mat(db, R, C), DU = mat(dub, R, C);
    be->ops->train->glu_bwd(be, M2D_ACT_SWIGLU, &G, &U, &DG, &DU);
    down(be, dg, db, sizeof dg), down(be, du, dub, sizeof du);
    m2d_buf *all[] = {gb, ub, db, dub};
    for (int i = 0; i < 4; i++) be->ops->release(be, all[i]);
    m2d_backend_free(be);
    double x[2 * N], gr[2 * N];
    for (int i = 0; i < N; i++) x[i] = g[i], x[N + i] = u[i];
    glu_ctx c = {N, r};
    fd_grad(glu_phi, &c, x, 2 * N, gr);
    check_grad("swiglu dg", dg, gr, N);
    check_grad("swiglu du", du, gr + N, N);
}
EACH_BACKEND(glu_backward)

/* ================= GPT-OSS's clamped SwiGLU ================= */
typedef struct { int n; const float *r; double alpha, limit; } gluc_ctx; /* g then u */

static double gluc_phi(void *vc, const double *x) {
    const gluc_ctx *c = vc;
    double s = 0;
    for (int i = 0; i < c->n; i++) {
        double g = fmin(x[i], c->limit), u = fmin(fmax(x[c->n + i], -c->limit), c->limit);
        s += c->r[i] * (u + 1) * g / (1 + exp(-c->alpha * g));
    }
    return s;
}

static void glu_clamp_grads(const char *backend, const float *g, const float *u, const float *r, int R, int C,
                            float alpha, float limit, float *dg, float *du) {
    size_t bytes = sizeof(float) * (size_t)R * C;
    m2d_backend *be = new_backend(backend, 2);
    m2d_buf *gb = up(be, g, bytes), *ub = up(be, u, bytes), *db = up(be, r, bytes), *dub = be->ops->alloc(be, bytes);
    m2d_mat G = mat(gb, R, C), U = mat(ub, R, C), DG = mat(db, R, C), DU = mat(dub, R, C);
    be->ops->train->glu_clamp_bwd(be, &G, &U, alpha, limit, &DG, &DU);
    down(be, dg, db, bytes), down(be, du, dub, bytes);
    m2d_buf *all[] = {gb, ub, db, dub};
    for (int i = 0; i < 4; i++) be->ops->release(be, all[i]);
    m2d_backend_free(be);
}

/* limit 1.5 against inputs of scale 2: about half the gates and up values are clamped (gradient 0);
 * at the boundary itself torch's clamp passes the gradient (g == limit, u == +-limit: the
 * one-sided derivative from inside) */
static void glu_clamp_backward_on(const char *backend) {
    uint64_t st = 43;
    enum { R = 6, C = 11, N = R * C };
    const float alpha = 1.702f, limit = 1.5f;
    float g[N], u[N], r[N], dg[N], du[N];
    fill(&st, g, N, 2), fill(&st, u, N, 2), fill(&st, r, N, 1);
    glu_clamp_grads(backend, g, u, r, R, C, alpha, limit, dg, du);
    double x[2 * N], gr[2 * N];
    int clamped = 0;
    for (int i = 0; i < N; i++) x[i] = g[i], x[N + i] = u[i], clamped += g[i] > limit || fabsf(u[i]) > limit;
    assert_true(clamped > N / 4);
    gluc_ctx c = {N, r, alpha, limit};
    fd_grad(gluc_phi, &c, x, 2 * N, gr);
    check_grad("clamped swiglu dg", dg, gr, N);
    check_grad("clamped swiglu du", du, gr + N, N);
    float gb[3] = {limit, 0.5f, 0.5f}, ub[3] = {0.25f, limit, -limit}, rb[3] = {1, 1, 1}, dgb[3], dub[3];
    glu_clamp_grads(backend, gb, ub, rb, 1, 3, alpha, limit, dgb, dub);
    /* at the boundaries the gradient passes: the op's own fp32 formula, within 1e-6 relative (a
     * device's expf is not glibc's: <= 2 ulps, through 1 / (1 + e) and four products ~8 u); a
     * boundary wrongly clamped gives 0 */
    float s = 1.0f / (1.0f + expf(-alpha * limit)), want_g = (0.25f + 1.0f) * s * (1.0f + alpha * limit * (1.0f - s));
    float want_u = 0.5f * (1.0f / (1.0f + expf(-alpha * 0.5f)));
    assert_true(fabsf(dgb[0] - want_g) <= 1e-6f * want_g && fabsf(dub[1] - want_u) <= 1e-6f * want_u);
    assert_true(dub[2] == dub[1]); /* -limit and +limit: the same arithmetic */
}
EACH_BACKEND(glu_clamp_backward)

/* ================= clip_qkv's clamp and the biases ================= */

/* torch.clamp's gradient: dy passes where -limit <= x <= limit (the boundary included), else 0 */
static void clamp_backward_on(const char *backend) {
    float x[6] = {-2.0f, -1.5f, -0.3f, 0.0f, 1.5f, 1.5000001f}, dy[6] = {1, 2, 3, 4, 5, 6};
    float want[6] = {0, 2, 3, 4, 5, 0};
    m2d_backend *be = new_backend(backend, 1);
    m2d_buf *xb = up(be, x, sizeof x), *db = up(be, dy, sizeof dy);
    m2d_mat X = mat(xb, 2, 3), D = mat(db, 2, 3);
    be->ops->train->clamp_bwd(be, &X, 1.5f, &D);
    down(be, dy, db, sizeof dy);
    assert_memory_equal(dy, want, sizeof want); /* selection only: exact */
    be->ops->release(be, xb), be->ops->release(be, db);
    m2d_backend_free(be);
}
EACH_BACKEND(clamp_backward)

/* add_bias's backward: db += the column sums of dy (150 rows, added to what db held) */
static void bias_backward_on(const char *backend) {
    uint64_t st = 47;
    enum { R = 150, C = 7 };
    float dy[R * C], db[C], got[C];
    fill(&st, dy, R * C, 1), fill(&st, db, C, 1);
    m2d_backend *be = new_backend(backend, 2);
    m2d_buf *yb = up(be, dy, sizeof dy), *bb = up(be, db, sizeof db);
    m2d_mat Y = mat(yb, R, C), B = mat(bb, 1, C);
    be->ops->train->bias_bwd(be, &Y, &B);
    down(be, got, bb, sizeof got);
    for (int i = 0; i < C; i++) {
        double s = 0;
        for (int r = 0; r < R; r++) s += dy[r * C + i];
        /* a float64 sum of 150 fp32 values (exact to ~1e-16 relative) rounded once, plus one fp32 add */
        assert_true(fabs(got[i] - ((double)db[i] + (float)s)) <= 2 * 6e-8 * (fabs(db[i]) + fabs(s)));
    }
    be->ops->release(be, yb), be->ops->release(be, bb);
    m2d_backend_free(be);
}
EACH_BACKEND(bias_backward)

/* ================= MLA's shared rotated key: one vector given to every head ================= */
typedef struct { int R, H, stride, C; const float *r; } bcast_ctx; /* r: the cotangent [R, H * stride] */

/* phi = sum r * k, k[i, h * stride + j] = x[i, j] for every head h (the other columns not x's) */
static double bcast_phi(void *vc, const double *x) {
    const bcast_ctx *c = vc;
    double s = 0;
    for (int i = 0; i < c->R; i++)
        for (int h = 0; h < c->H; h++)
            for (int j = 0; j < c->C; j++) s += c->r[(size_t)i * c->H * c->stride + h * c->stride + j] * x[i * c->C + j];
    return s;
}

/* head_sum of r's rope columns (offset 5 of heads of 8, as MLA's nope | rope) is phi's gradient,
 * written (beta 0, over a NaN-filled y) or added to what y holds (beta 1). Tolerance: each element
 * is a float64 sum of H = 6 fp32 values rounded once (<= u = 6e-8 relative to the sum's
 * magnitude, against the gradient's scale), far inside TOL; adding y is one more fp32 rounding. */
static void head_sum_backward_on(const char *backend) {
    uint64_t st = 49;
    enum { R = 70, H = 6, S = 8, OFF = 5, C = 3 };
    float r[R * H * S], y0[R * C], got[R * C], x0[R * C];
    fill(&st, r, R * H * S, 1), fill(&st, y0, R * C, 1), fill(&st, x0, R * C, 1);
    bcast_ctx c = {R, H, S, C, r + OFF};
    double *x = to_double(x0, R * C), *want = m2d_malloc(sizeof(double) * R * C);
    fd_grad(bcast_phi, &c, x, R * C, want);
    m2d_backend *be = new_backend(backend, 2);
    for (int beta = 0; beta <= 1; beta++) {
        float init[R * C];
        for (int i = 0; i < R * C; i++) init[i] = beta ? y0[i] : NAN;
        m2d_buf *rb = up(be, r, sizeof r), *yb = up(be, init, sizeof init);
        m2d_mat X = m2d_mat_of(rb, OFF, R, C, H * S), Y = mat(yb, R, C);
        be->ops->train->head_sum(be, &X, H, S, &Y, (float)beta);
        down(be, got, yb, sizeof got);
        for (int i = 0; beta && i < R * C; i++) got[i] -= y0[i];
        check_grad(beta ? "head_sum (beta 1)" : "head_sum", got, want, R * C);
        be->ops->release(be, rb), be->ops->release(be, yb);
    }
    m2d_backend_free(be);
    free(x), free(want);
}
EACH_BACKEND(head_sum_backward)

/* ================= embedding: scatter-add, repeated tokens add up ================= */
static void embed_backward_on(const char *backend) {
    uint64_t st = 51;
    enum { V = 7, D = 5, N = 9 };
    int32_t tok[N] = {3, 0, 3, 6, 1, 3, 0, 2, 6};
    float dx[N * D], table[V * D], want[V * D];
    fill(&st, dx, N * D, 1), fill(&st, table, V * D, 1);
    memcpy(want, table, sizeof want);
    for (int i = 0; i < N; i++)
        for (int c = 0; c < D; c++) want[tok[i] * D + c] += dx[i * D + c];
    m2d_backend *be = new_backend(backend, 2);
    m2d_buf *tb = up(be, tok, sizeof tok), *xb = up(be, dx, sizeof dx), *gb = up(be, table, sizeof table);
    m2d_mat X = mat(xb, N, D), G = mat(gb, V, D);
    be->ops->train->embed_bwd(be, tb, &X, &G);
    float got[V * D];
    down(be, got, gb, sizeof got);
    /* summed in row order, as the loop above: identical (the same correctly rounded fp32 adds in the
     * same order, exact on every CPU) */
    assert_memory_equal(got, want, sizeof got);
    be->ops->release(be, tb), be->ops->release(be, xb), be->ops->release(be, gb);
    m2d_backend_free(be);
}
EACH_BACKEND(embed_backward)

/* ================= distillation losses ================= */
typedef struct { int n, V; int reverse; const double *zt; } kd_ctx;

/* sum over rows of KL(pt || ps) (forward) or KL(ps || pt) (reverse), float64 */
static double kd_phi(void *vc, const double *zs) {
    const kd_ctx *c = vc;
    double total = 0;
    for (int i = 0; i < c->n; i++) {
        const double *a = c->zt + i * c->V, *b = zs + i * c->V;
        double ma = -INFINITY, mb = -INFINITY, sa = 0, sb = 0;
        for (int j = 0; j < c->V; j++) ma = fmax(ma, a[j]), mb = fmax(mb, b[j]);
        for (int j = 0; j < c->V; j++) sa += exp(a[j] - ma), sb += exp(b[j] - mb);
        double la = ma + log(sa), lb = mb + log(sb);
        for (int j = 0; j < c->V; j++) {
            double lt = a[j] - la, ls = b[j] - lb;
            total += c->reverse ? exp(ls) * (ls - lt) : exp(lt) * (lt - ls);
        }
    }
    return total;
}

static void kd_case(const char *backend, m2d_kd_kind kind, int T, float *grad, double *loss) {
    uint64_t st = 61;
    enum { N = 19, V = 37 };
    float zt[N * V], zs[N * V];
    fill(&st, zt, N * V, 3), fill(&st, zs, N * V, 2);
    m2d_backend *be = new_backend(backend, T);
    m2d_buf *tb = up(be, zt, sizeof zt), *sb = up(be, zs, sizeof zs), *lb = be->ops->alloc(be, sizeof(double) * N);
    m2d_mat ZT = mat(tb, N, V), ZS = mat(sb, N, V);
    be->ops->train->kd_loss(be, kind, &ZT, &ZS, 1.0, lb);
    down(be, grad, sb, sizeof zs), down(be, loss, lb, sizeof(double) * N);
    be->ops->release(be, tb), be->ops->release(be, sb), be->ops->release(be, lb);
    m2d_backend_free(be);
    if (T != 1) return;
    double *dt = to_double(zt, N * V), *ds = to_double(zs, N * V), g[N * V], sum = 0;
    kd_ctx c = {N, V, kind == M2D_KD_REVERSE_KL, dt};
    for (int i = 0; i < N; i++) sum += loss[i];
    /* the loss: a sum of V fp32 exponentials per row, accumulated in fp64: relative ~1e-6 */
    assert_true(fabs(sum - kd_phi(&c, ds)) < 1e-6 * fmax(1.0, fabs(sum)));
    fd_grad(kd_phi, &c, ds, N * V, g);
    check_grad(kind == M2D_KD_FORWARD_KL ? "forward KL dzs" : "reverse KL dzs", grad, g, N * V);
    free(dt), free(ds);
}

static void kd_losses_on(const char *backend) {
    enum { N = 19, V = 37 };
    float g1[N * V], g3[N * V];
    double l1[N], l3[N];
    for (int k = 0; k < 2; k++) {
        m2d_kd_kind kind = k ? M2D_KD_REVERSE_KL : M2D_KD_FORWARD_KL;
        kd_case(backend, kind, 1, g1, l1);
        kd_case(backend, kind, 3, g3, l3);
        assert_memory_equal(g1, g3, sizeof g1), assert_memory_equal(l1, l3, sizeof l1); /* 1 vs 3 threads */
    }
}
EACH_BACKEND(kd_losses)

/* KL(p || p) = 0 and its gradient 0; the scale multiplies the gradient */
static void kd_loss_zero_at_match_on(const char *backend) {
    float z[2 * 5] = {1, 2, 3, -1, 0.5f, 7, -3, 0, 0, 2}, zs[10];
    memcpy(zs, z, sizeof z);
    m2d_backend *be = new_backend(backend, 1);
    m2d_buf *tb = up(be, z, sizeof z), *sb = up(be, zs, sizeof zs), *lb = be->ops->alloc(be, sizeof(double) * 2);
    m2d_mat ZT = mat(tb, 2, 5), ZS = mat(sb, 2, 5);
    double loss[2];
    be->ops->train->kd_loss(be, M2D_KD_FORWARD_KL, &ZT, &ZS, 0.25, lb);
    down(be, zs, sb, sizeof zs), down(be, loss, lb, sizeof loss);
    for (int i = 0; i < 10; i++) assert_true(fabsf(zs[i]) < 1e-7f);
    assert_true(fabs(loss[0]) < 1e-7 && fabs(loss[1]) < 1e-7);
    be->ops->release(be, tb), be->ops->release(be, sb), be->ops->release(be, lb);
    m2d_backend_free(be);
}
EACH_BACKEND(kd_loss_zero_at_match)

static void mse_on(const char *backend) {
    uint64_t st = 71;
    float a[12], b[12], d0[12], d[12];
    fill(&st, a, 12, 1), fill(&st, b, 12, 1), fill(&st, d0, 12, 1);
    m2d_backend *be = new_backend(backend, 1);
    m2d_buf *ab = up(be, a, sizeof a), *bb = up(be, b, sizeof b), *db = up(be, d0, sizeof d0);
    m2d_buf *lb = be->ops->alloc(be, sizeof(double) * 3);
    m2d_mat A = mat(ab, 3, 4), Bm = mat(bb, 3, 4), D = mat(db, 3, 4);
    be->ops->train->mse(be, &A, &Bm, 0.5, &D, lb);
    double loss[3];
    down(be, d, db, sizeof d), down(be, loss, lb, sizeof loss);
    for (int r = 0; r < 3; r++) {
        double s = 0;
        for (int c = 0; c < 4; c++) {
            double diff = (double)a[r * 4 + c] - b[r * 4 + c];
            s += diff * diff;
            /* d/da of 0.5 * (a - b)^2 summed = (a - b), added to what was there */
            assert_true(fabs(d[r * 4 + c] - (d0[r * 4 + c] + diff)) < 1e-6);
        }
        assert_true(fabs(loss[r] - s) < 1e-12 * fmax(1, s) + 1e-12);
    }
    be->ops->release(be, ab), be->ops->release(be, bb), be->ops->release(be, db), be->ops->release(be, lb);
    m2d_backend_free(be);
}
EACH_BACKEND(mse)

/* ================= gradient norm and AdamW ================= */
static void sumsq_on(const char *backend) {
    uint64_t st = 81;
    size_t n = 200003; /* several fixed chunks and a partial one */
    float *x = malloc(sizeof(float) * n);
    fill(&st, x, n, 1);
    double want = 0, got1, got4;
    for (size_t i = 7; i < n; i++) want += (double)x[i] * x[i];
    for (int T = 1; T <= 4; T += 3) {
        m2d_backend *be = new_backend(backend, T);
        m2d_buf *xb = up(be, x, sizeof(float) * n), *ob = be->ops->alloc(be, sizeof(double));
        be->ops->train->sumsq(be, xb, 7, n - 7, ob);
        down(be, T == 1 ? &got1 : &got4, ob, sizeof(double));
        be->ops->release(be, xb), be->ops->release(be, ob);
        m2d_backend_free(be);
    }
    assert_memory_equal(&got1, &got4, sizeof(double)); /* fixed chunks, 1 vs 4 threads, one machine: exact */
    /* fp64 sums of 2e5 terms in two orders: ~1e-16 * sqrt(n) relative */
    assert_true(fabs(got1 - want) < 1e-12 * want);
    free(x);
}
EACH_BACKEND(sumsq)

/* five AdamW steps against torch's formulas evaluated in float64 (the op rounds each of its few
 * operations to fp32: ~1e-7 relative per step) */
static void adamw_matches_formula_on(const char *backend) {
    uint64_t st = 91;
    enum { N = 1000, OFF = 3 };
    float p[N + OFF], g[N + OFF], z[N + OFF] = {0};
    fill(&st, p, N + OFF, 1);
    double P[N], M[N] = {0}, Vv[N] = {0};
    for (int i = 0; i < N; i++) P[i] = p[OFF + i];
    m2d_backend *be = new_backend(backend, 2);
    m2d_buf *pb = up(be, p, sizeof p), *gb = be->ops->alloc(be, sizeof g), *mb = up(be, z, sizeof z), *vb = up(be, z, sizeof z);
    double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
    for (int step = 1; step <= 5; step++) {
        fill(&st, g, N + OFF, step == 3 ? 1e-6 : 1); /* a step with tiny gradients: eps matters */
        be->ops->upload(be, gb, 0, g, sizeof g);
        float scale = step == 2 ? 0.5f : 1.0f;
        m2d_adamw_args a = {lr, b1, b2, eps, wd, step, scale};
        be->ops->train->adamw(be, pb, gb, mb, vb, OFF, N, &a);
        for (int i = 0; i < N; i++) {
            double gi = (double)g[OFF + i] * scale;
            P[i] *= 1 - lr * wd;
            M[i] = b1 * M[i] + (1 - b1) * gi;
            Vv[i] = b2 * Vv[i] + (1 - b2) * gi * gi;
            P[i] -= lr / (1 - pow(b1, step)) * M[i] / (sqrt(Vv[i]) / sqrt(1 - pow(b2, step)) + eps);
        }
    }
    float got[N + OFF];
    down(be, got, pb, sizeof got);
    for (int i = 0; i < OFF; i++) assert_true(got[i] == p[i]); /* outside [OFF, OFF + N): untouched, exact */
    for (int i = 0; i < N; i++) assert_true(fabs(got[OFF + i] - P[i]) < 1e-6 * fmax(1, fabs(P[i])));
    m2d_buf *all[] = {pb, gb, mb, vb};
    for (int i = 0; i < 4; i++) be->ops->release(be, all[i]);
    m2d_backend_free(be);
}
EACH_BACKEND(adamw_matches_formula)

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(gemm_backward),
        cmocka_unit_test(gemm_accumulates),
        cmocka_unit_test(gemm_bf16_backward),
        cmocka_unit_test(gemm_bf16_windows_accumulate),
        cmocka_unit_test(bf16_dx_follows_the_weights),
        cmocka_unit_test(bf16_weight_copies_keep_the_bits),
        cmocka_unit_test(rmsnorm_backward),
        cmocka_unit_test(rmsnorm_backward_accumulates),
        cmocka_unit_test(rope_backward),
        cmocka_unit_test(attention_backward),
        cmocka_unit_test(glu_backward),
        cmocka_unit_test(glu_clamp_backward),
        cmocka_unit_test(clamp_backward),
        cmocka_unit_test(bias_backward),
        cmocka_unit_test(head_sum_backward),
        cmocka_unit_test(embed_backward),
        cmocka_unit_test(kd_losses),
        cmocka_unit_test(kd_loss_zero_at_match),
        cmocka_unit_test(mse),
        cmocka_unit_test(sumsq),
        cmocka_unit_test(adamw_matches_formula),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
