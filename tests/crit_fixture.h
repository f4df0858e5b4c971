/* crit_fixture — synthetic per-token calibration data and teacher weights for the criteria tests.
 * Header-only (static functions): each test binary that includes it gets its own copy. */
#ifndef M2D_CRIT_FIXTURE_H
#define M2D_CRIT_FIXTURE_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "criteria/registry.h"
#include "calib/stats.h"
#include "base/tensor.h"
#include "testutil.h"
#include "base/util.h"

/* Tokens of one synthetic layer: full softmax p, top-k set, renormalised gates, all outputs f. */
typedef struct {
    int E, k, d, n_tok, n_samples;
    int *sample_len;
    float *p;      /* [n_tok*E] */
    int32_t *topk; /* [n_tok*k] */
    float *g;      /* [n_tok*k] */
    float *f;      /* [n_tok*E*d] */
} fx_tokens;

/* Random logits (expert `never` gets -50 so it is never routed; -1 for none), top-k by p with
 * ties -> lower index, renormalised gates, N(0,1) outputs scaled per expert so norms differ. */
static inline fx_tokens fx_make_tokens(int E, int k, int d, int n_samples, const int *lens, int never, uint64_t seed) {
    fx_tokens t = {E, k, d, 0, n_samples, NULL, NULL, NULL, NULL, NULL};
    t.sample_len = m2d_malloc((size_t)n_samples * sizeof(int));
    for (int s = 0; s < n_samples; s++) t.n_tok += (t.sample_len[s] = lens[s]);
    t.p = m2d_malloc((size_t)t.n_tok * E * sizeof(float));
    t.topk = m2d_malloc((size_t)t.n_tok * k * sizeof(int32_t));
    t.g = m2d_malloc((size_t)t.n_tok * k * sizeof(float));
    t.f = m2d_malloc((size_t)t.n_tok * E * d * sizeof(float));
    uint64_t st = seed;
    double *logit = m2d_malloc((size_t)E * sizeof(double));
    for (int n = 0; n < t.n_tok; n++) {
        double mx = -1e30, z = 0;
        for (int e = 0; e < E; e++) {
            logit[e] = e == never ? -50 : 1.5 * tu_rand_normal(&st);
            mx = fmax(mx, logit[e]);
        }
        for (int e = 0; e < E; e++) z += exp(logit[e] - mx);
        float *p = t.p + (size_t)n * E;
        for (int e = 0; e < E; e++) p[e] = (float)(exp(logit[e] - mx) / z);
        float gs = 0;
        for (int r = 0; r < k; r++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int used = 0;
                for (int q = 0; q < r; q++) used |= t.topk[(size_t)n * k + q] == e;
                if (!used && (best < 0 || p[e] > p[best])) best = e;
            }
            t.topk[(size_t)n * k + r] = best;
            gs += p[best];
        }
        for (int r = 0; r < k; r++) t.g[(size_t)n * k + r] = p[t.topk[(size_t)n * k + r]] / gs;
        for (int e = 0; e < E; e++)
            for (int j = 0; j < d; j++)
                t.f[((size_t)n * E + e) * d + j] = (float)((1.0 + 0.3 * e) * tu_rand_normal(&st));
    }
    free(logit);
    return t;
}

static inline void fx_free_tokens(fx_tokens *t) {
    free(t->sample_len), free(t->p), free(t->topk), free(t->g), free(t->f);
}

/* Feed every token through the reference accumulator, closing each sample; finalize. */
static inline void fx_stats_from_tokens(const fx_tokens *t, m2d_layer_stats *s) {
    m2d_layer_stats_alloc(s, 0, t->E, t->k, t->d);
    int n = 0;
    for (int smp = 0; smp < t->n_samples; smp++) {
        for (int i = 0; i < t->sample_len[smp]; i++, n++)
            m2d_layer_stats_add_token(s, t->p + (size_t)n * t->E, t->topk + (size_t)n * t->k, t->g + (size_t)n * t->k,
                                      t->f + (size_t)n * t->E * t->d);
        m2d_layer_stats_end_sample(s);
    }
    m2d_layer_stats_finalize(s);
}

/* gate of expert e on token n (-1 when not routed) and its output norm */
static inline double fx_gate(const fx_tokens *t, int n, int e) {
    for (int r = 0; r < t->k; r++)
        if (t->topk[(size_t)n * t->k + r] == e) return t->g[(size_t)n * t->k + r];
    return -1;
}
static inline const float *fx_f(const fx_tokens *t, int n, int e) { return t->f + ((size_t)n * t->E + e) * t->d; }
static inline double fx_norm(const fx_tokens *t, int n, int e) {
    double s = 0;
    const float *f = fx_f(t, n, e);
    for (int j = 0; j < t->d; j++) s += (double)f[j] * f[j];
    return sqrt(s);
}

/* Synthetic teacher weights for one layer (fp32 or bf16): router [E,d], gate/up [d_e,d], down [d,d_e]. */
typedef struct {
    m2d_layer layer;
    m2d_tensor router, *gate, *up, *down;
    const m2d_tensor **pg, **pu, **pd;
    void *bufs[4];
} fx_weights;

static inline void fx_tensor(m2d_tensor *t, const char *name, m2d_dtype dt, int64_t r, int64_t c, const void *data) {
    memset(t, 0, sizeof *t);
    t->name = name, t->dtype = dt, t->ndim = 2, t->shape[0] = r, t->shape[1] = c, t->data = data;
    t->nbytes = (size_t)(r * c) * m2d_dtype_size(dt);
}

/* Fill from values given as fp32 arrays (router [E*d], experts [E][3][...]); converted to dt. */
static inline void fx_make_weights(fx_weights *w, m2d_dtype dt, int E, int d, int d_e, const float *router,
                                   const float *gate, const float *up, const float *down) {
    memset(w, 0, sizeof *w);
    size_t es = m2d_dtype_size(dt), per = (size_t)d_e * d;
    const float *src[4] = {router, gate, up, down};
    size_t n[4] = {(size_t)E * d, per * E, per * E, per * E};
    for (int i = 0; i < 4; i++) {
        w->bufs[i] = m2d_malloc(n[i] * es);
        m2d_from_f32(dt, src[i], (int64_t)n[i], w->bufs[i]);
    }
    fx_tensor(&w->router, "router", dt, E, d, w->bufs[0]);
    w->gate = m2d_calloc((size_t)E, sizeof(m2d_tensor));
    w->up = m2d_calloc((size_t)E, sizeof(m2d_tensor));
    w->down = m2d_calloc((size_t)E, sizeof(m2d_tensor));
    w->pg = m2d_calloc((size_t)E, sizeof(void *));
    w->pu = m2d_calloc((size_t)E, sizeof(void *));
    w->pd = m2d_calloc((size_t)E, sizeof(void *));
    for (int e = 0; e < E; e++) {
        fx_tensor(&w->gate[e], "gate", dt, d_e, d, (char *)w->bufs[1] + e * per * es);
        fx_tensor(&w->up[e], "up", dt, d_e, d, (char *)w->bufs[2] + e * per * es);
        fx_tensor(&w->down[e], "down", dt, d, d_e, (char *)w->bufs[3] + e * per * es);
        w->pg[e] = &w->gate[e], w->pu[e] = &w->up[e], w->pd[e] = &w->down[e];
    }
    w->layer.router = &w->router;
    w->layer.exp_gate = w->pg, w->layer.exp_up = w->pu, w->layer.exp_down = w->pd;
}

static inline void fx_free_weights(fx_weights *w) {
    for (int i = 0; i < 4; i++) free(w->bufs[i]);
    free(w->gate), free(w->up), free(w->down), free(w->pg), free(w->pu), free(w->pd);
}

static inline m2d_layer_view fx_view(const m2d_layer_stats *s, const m2d_layer *w, int K, int d_e,
                                     const m2d_params *params) {
    m2d_layer_view v = {s, w, s->E, s->k, K, s->d, d_e, params};
    return v;
}

/* Scores of the named scoring plugin (asserts success). */
static inline void fx_scores(const char *name, const m2d_layer_view *v, double *scores, int *selected) {
    const m2d_plugin *p = m2d_plugin_find(M2D_SCORING, name);
    if (!p) fail_msg("no scoring plugin '%s'", name);
    if (m2d_score_and_select(p, v, scores, selected) != 0) fail_msg("%s: %s", name, m2d_errmsg());
}

/* |got − want| <= tol·(1 + |want|) */
static inline void fx_close(double got, double want, double tol, const char *what, int e) {
    if (!(fabs(got - want) <= tol * (1.0 + fabs(want))))
        fail_msg("%s[%d]: got %.17g want %.17g", what, e, got, want);
}

#endif
