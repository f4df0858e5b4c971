/* reftrain — float64 reference loss of a dense student (see reftrain.h). */
#include "reftrain.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "reffwd.h"

typedef struct {
    const tu_kd_problem *pb;
    const double *w;
    int d, H, KV, hd, F, V, qd, kvd, n;
} ctx;

/* the layer's parameter of ROLE, or NULL when it has none (biases, sinks, q/k norms) */
static const double *P(const ctx *c, int l, int role) {
    int i = c->pb->layout->layer[l][role];
    return i >= 0 ? c->w + c->pb->layout->p[i].off : NULL;
}

/* y += b when the layer has the bias */
static void add(double *y, const double *b, int n) {
    for (int i = 0; b && i < n; i++) y[i] += b[i];
}

/* OLMoE's clip_qkv: [-lim, lim] (0: off) */
static void clip(double *v, int n, double lim) {
    for (int i = 0; lim > 0 && i < n; i++) v[i] = fmin(fmax(v[i], -lim), lim);
}

static void rms(double *x, int d, const double *w, double eps) {
    double ss = 0;
    for (int i = 0; i < d; i++) ss += x[i] * x[i];
    double r = 1 / sqrt(ss / d + eps);
    for (int i = 0; i < d; i++) x[i] = x[i] * r * w[i];
}

static void linear(const double *w, const double *x, int in, int out, double *y) {
    for (int o = 0; o < out; o++) {
        double s = 0;
        for (int i = 0; i < in; i++) s += w[(size_t)o * in + i] * x[i];
        y[o] = s;
    }
}

/* q/k norm (per head, or over the whole projection when the weight covers it), clip_qkv, then
 * RoPE of each head's first rope_dim (0: all) dims (tests/reffwd.c's, from the config) */
static void qk(const ctx *c, double *v, int heads, const double *norm, int64_t norm_len, int pos) {
    const m2d_config *cf = c->pb->cfg;
    int hd = c->hd;
    if (norm && norm_len == (int64_t)heads * hd && heads > 1) rms(v, heads * hd, norm, cf->rms_norm_eps);
    for (int h = 0; h < heads; h++)
        if (norm && norm_len == hd) rms(v + h * hd, hd, norm, cf->rms_norm_eps);
    clip(v, heads * hd, cf->clip_qkv);
    for (int h = 0; h < heads; h++) tu_ref_rope(v + h * hd, cf->rope_dim ? cf->rope_dim : hd, pos, cf, 0);
}

/* one window's attention block, x [L, d] updated in place */
static void attention(const ctx *c, int l, double *x) {
    const m2d_config *cf = c->pb->cfg;
    int L = c->pb->L, d = c->d, qd = c->qd, kvd = c->kvd, hd = c->hd;
    const m2d_train_params *lay = c->pb->layout;
    double *q = calloc((size_t)L * qd, 8), *k = calloc((size_t)L * kvd, 8), *v = calloc((size_t)L * kvd, 8);
    double *xn = malloc(sizeof(double) * d), *att = calloc((size_t)L * qd, 8), *o = malloc(sizeof(double) * d);
    int qn = lay->layer[l][M2D_T_Q_NORM], kn = lay->layer[l][M2D_T_K_NORM];
    for (int t = 0; t < L; t++) {
        memcpy(xn, x + t * d, sizeof(double) * d);
        rms(xn, d, P(c, l, M2D_T_ATTN_NORM), cf->rms_norm_eps);
        linear(P(c, l, M2D_T_Q), xn, d, qd, q + t * qd);
        linear(P(c, l, M2D_T_K), xn, d, kvd, k + t * kvd);
        linear(P(c, l, M2D_T_V), xn, d, kvd, v + t * kvd);
        add(q + t * qd, P(c, l, M2D_T_Q_BIAS), qd);
        add(k + t * kvd, P(c, l, M2D_T_K_BIAS), kvd);
        add(v + t * kvd, P(c, l, M2D_T_V_BIAS), kvd);
        clip(v + t * kvd, kvd, cf->clip_qkv);
        qk(c, q + t * qd, c->H, qn >= 0 ? P(c, l, M2D_T_Q_NORM) : NULL, qn >= 0 ? (int64_t)lay->p[qn].n : 0, t);
        qk(c, k + t * kvd, c->KV, kn >= 0 ? P(c, l, M2D_T_K_NORM) : NULL, kn >= 0 ? (int64_t)lay->p[kn].n : 0, t);
    }
    /* keys i - window < t <= i (window 0: all t <= i); a sink logit per head in the denominator */
    double *p = malloc(sizeof(double) * L), scale = cf->attn_scale != 0 ? cf->attn_scale : 1 / sqrt((double)hd);
    const double *sinks = P(c, l, M2D_T_SINKS);
    int window = cf->layer_window ? cf->layer_window[l] : 0;
    for (int h = 0; h < c->H; h++) {
        int g = h / (c->H / c->KV);
        for (int i = 0; i < L; i++) {
            int lo = window > 0 && i + 1 > window ? i + 1 - window : 0;
            double m = sinks ? sinks[h] : -INFINITY, s = 0;
            for (int t = lo; t <= i; t++) {
                double dd = 0;
                for (int j = 0; j < hd; j++) dd += q[i * qd + h * hd + j] * k[t * kvd + g * hd + j];
                p[t] = dd * scale;
                m = fmax(m, p[t]);
            }
            for (int t = lo; t <= i; t++) s += (p[t] = exp(p[t] - m));
            if (sinks) s += exp(sinks[h] - m);
            for (int j = 0; j < hd; j++) {
                double a = 0;
                for (int t = lo; t <= i; t++) a += p[t] / s * v[t * kvd + g * hd + j];
                att[i * qd + h * hd + j] = a;
            }
        }
    }
    for (int t = 0; t < L; t++) {
        linear(P(c, l, M2D_T_O), att + t * qd, qd, d, o);
        add(o, P(c, l, M2D_T_O_BIAS), d);
        for (int i = 0; i < d; i++) x[t * d + i] += o[i];
    }
    free(q), free(k), free(v), free(xn), free(att), free(o), free(p);
}

/* SwiGLU silu(g) u, or GPT-OSS's (u' + 1) g' sigmoid(alpha g'), g' = min(g, limit), u' = u clamped */
static double act(const m2d_config *cf, double g, double u) {
    if (cf->ops.ffn_act != M2D_ACT_SWIGLU_CLAMP) return g / (1 + exp(-g)) * u;
    double lim = cf->ops.act_limit, gc = fmin(g, lim), uc = fmin(fmax(u, -lim), lim);
    return (uc + 1) * gc / (1 + exp(-cf->ops.act_alpha * gc));
}

static void ffn(const ctx *c, int l, double *x) {
    int L = c->pb->L, d = c->d, F = c->F;
    double *xn = malloc(sizeof(double) * d), *g = malloc(sizeof(double) * F), *u = malloc(sizeof(double) * F);
    double *o = malloc(sizeof(double) * d);
    for (int t = 0; t < L; t++) {
        memcpy(xn, x + t * d, sizeof(double) * d);
        rms(xn, d, P(c, l, M2D_T_FFN_NORM), c->pb->cfg->rms_norm_eps);
        linear(P(c, l, M2D_T_GATE), xn, d, F, g);
        linear(P(c, l, M2D_T_UP), xn, d, F, u);
        add(g, P(c, l, M2D_T_GATE_BIAS), F);
        add(u, P(c, l, M2D_T_UP_BIAS), F);
        for (int i = 0; i < F; i++) g[i] = act(c->pb->cfg, g[i], u[i]);
        linear(P(c, l, M2D_T_DOWN), g, F, d, o);
        add(o, P(c, l, M2D_T_DOWN_BIAS), d);
        for (int i = 0; i < d; i++) x[t * d + i] += o[i];
    }
    free(xn), free(g), free(u), free(o);
}

static void setup(ctx *c, const tu_kd_problem *pb, const double *w) {
    const m2d_config *cf = pb->cfg;
    *c = (ctx){pb, w, cf->hidden_size, cf->num_attention_heads, cf->num_key_value_heads, cf->head_dim,
               cf->intermediate_size, cf->vocab_size, cf->num_attention_heads * cf->head_dim,
               cf->num_key_value_heads * cf->head_dim, pb->n_seq * pb->L};
}

/* logits of window s (rows [s L, (s+1) L)) and, when MSE, its squared error against the teacher */
static double window(const ctx *c, int s, double *logits) {
    const tu_kd_problem *pb = c->pb;
    const m2d_train_params *lay = pb->layout;
    int L = pb->L, d = c->d;
    double *x = malloc(sizeof(double) * (size_t)L * d), se = 0;
    const double *emb = c->w + lay->p[lay->embed].off;
    for (int t = 0; t < L; t++) memcpy(x + t * d, emb + (size_t)pb->tokens[s * L + t] * d, sizeof(double) * d);
    for (int l = 0; l < pb->cfg->num_hidden_layers; l++) {
        attention(c, l, x);
        ffn(c, l, x);
        for (int i = 0; pb->mse_weight > 0 && i < L * d; i++) {
            double diff = x[i] - pb->teacher_layers[((size_t)l * c->n + (size_t)s * L) * d + i];
            se += diff * diff;
        }
    }
    for (int t = 0; t < L; t++) {
        rms(x + t * d, d, c->w + lay->p[lay->final_norm].off, pb->cfg->rms_norm_eps);
        linear(c->w + lay->p[lay->lm_head].off, x + t * d, d, c->V, logits + (size_t)(s * L + t) * c->V);
    }
    free(x);
    return se;
}

void tu_ref_student_logits(const tu_kd_problem *pb, const double *w, double *logits) {
    ctx c;
    setup(&c, pb, w);
    for (int s = 0; s < pb->n_seq; s++) window(&c, s, logits);
}

static double kl_row(const double *a, const double *b, int V, int reverse) {
    double ma = -INFINITY, mb = -INFINITY, sa = 0, sb = 0, L = 0;
    for (int j = 0; j < V; j++) ma = fmax(ma, a[j]), mb = fmax(mb, b[j]);
    for (int j = 0; j < V; j++) sa += exp(a[j] - ma), sb += exp(b[j] - mb);
    double la = ma + log(sa), lb = mb + log(sb);
    for (int j = 0; j < V; j++) {
        double lt = a[j] - la, ls = b[j] - lb;
        L += reverse ? exp(ls) * (ls - lt) : exp(lt) * (lt - ls);
    }
    return L;
}

double tu_ref_kd_loss(const tu_kd_problem *pb, const double *w) {
    ctx c;
    setup(&c, pb, w);
    double *z = malloc(sizeof(double) * (size_t)c.n * c.V), se = 0, div = 0;
    for (int s = 0; s < pb->n_seq; s++) se += window(&c, s, z);
    for (int r = 0; r < c.n; r++) div += kl_row(pb->teacher_logits + (size_t)r * c.V, z + (size_t)r * c.V, c.V, pb->reverse);
    free(z);
    return pb->scale * div + pb->scale * pb->mse_weight / c.d * se;
}
