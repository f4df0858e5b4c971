/* reffwd — naive float64 reference forward (see reffwd.h). */
#include "reffwd.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/tensor.h"
#include "base/util.h"
#include "io/st.h"

double *tu_ref_tensor_f64(const m2d_tensor *t) {
    int64_t n = m2d_tensor_numel(t);
    float *f = m2d_tensor_f32(t);
    double *d = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) d[i] = f[i];
    free(f);
    return d;
}

static void ref_rms(double *x, int d, const m2d_tensor *wt, double eps) {
    double *w = tu_ref_tensor_f64(wt), ss = 0;
    for (int i = 0; i < d; i++) ss += x[i] * x[i];
    double r = 1 / sqrt(ss / d + eps);
    for (int i = 0; i < d; i++) x[i] = x[i] * r * w[i];
    free(w);
}

static void ref_linear(const m2d_tensor *wt, const double *x, int in, int out, double *y) {
    double *w = tu_ref_tensor_f64(wt);
    for (int o = 0; o < out; o++) {
        double s = 0;
        for (int i = 0; i < in; i++) s += w[(size_t)o * in + i] * x[i];
        y[o] = s;
    }
    free(w);
}

/* y += b when the bias B is given */
static void ref_bias(const m2d_tensor *b, int n, double *y) {
    if (!b) return;
    double *v = tu_ref_tensor_f64(b);
    for (int i = 0; i < n; i++) y[i] += v[i];
    free(v);
}

static int is_gptoss(const m2d_config *c) { return strcmp(c->arch, "GptOssForCausalLM") == 0; }

/* one FFN (dense, or one expert): W_d act(W_g x + b_g, W_u x + b_u) + b_d, biases when given;
 * act: SwiGLU silu(a) b, or GPT-OSS's (modeling_gpt_oss.py _apply_gate): a = min(a, limit),
 * b = clamp(b, -limit, limit), (b + 1) a sigmoid(alpha a), alpha/limit from swiglu_alpha/limit */
static void ref_ffn(const m2d_config *c, const m2d_tensor *const w[6], const double *x, int d, int inter, double *y) {
    double *a = malloc(sizeof(double) * inter), *b = malloc(sizeof(double) * inter);
    ref_linear(w[0], x, d, inter, a);
    ref_linear(w[1], x, d, inter, b);
    ref_bias(w[3], inter, a);
    ref_bias(w[4], inter, b);
    double alpha = c->ops.act_alpha, limit = c->ops.act_limit;
    for (int i = 0; i < inter; i++)
        if (is_gptoss(c)) {
            double g = fmin(a[i], limit), u = fmin(fmax(b[i], -limit), limit);
            a[i] = (u + 1) * g / (1 + exp(-alpha * g));
        } else {
            a[i] = a[i] / (1 + exp(-a[i])) * b[i];
        }
    ref_linear(w[2], a, inter, d, y);
    ref_bias(w[5], d, y);
    free(a);
    free(b);
}

/* frequency i of DIM rotated dimensions: theta^(-2i/dim), divided by the factor (linear), or YaRN's
 * blend (written from the YaRN paper, "NTK-by-parts"): dimensions turning more than beta_fast times
 * over the original context keep their frequency, those turning fewer than beta_slow times are
 * interpolated (divided by the factor), linearly in between over the rounded range */
static double ref_freq(const m2d_config *c, int i, int dim) {
    const m2d_rope_scaling *s = &c->rope_scaling;
    double base = pow(c->rope_theta, -2.0 * i / dim);
    if (s->kind == M2D_ROPE_SCALING_LINEAR) return base / s->factor;
    if (s->kind != M2D_ROPE_SCALING_YARN) return base;
    double turns_fast = s->beta_fast ? s->beta_fast : 32, turns_slow = s->beta_slow ? s->beta_slow : 1;
    /* the pair index whose wavelength 2 pi / f fits TURNS times into the original context */
    double lo = dim * log(s->original_max_position_embeddings / (turns_fast * 2 * M_PI)) / (2 * log(c->rope_theta));
    double hi = dim * log(s->original_max_position_embeddings / (turns_slow * 2 * M_PI)) / (2 * log(c->rope_theta));
    if (s->truncate) lo = floor(lo), hi = ceil(hi);
    lo = lo < 0 ? 0 : lo, hi = hi > dim - 1 ? dim - 1 : hi;
    double t = (i - lo) / (hi == lo ? 0.001 : hi - lo);
    t = t < 0 ? 0 : t > 1 ? 1 : t;
    return base * (1 - t) + base / s->factor * t;
}

/* cos/sin multiplier: YaRN's 0.1 ln(factor) + 1 (or the ratio of two such for mscale/mscale_all_dim) */
static double ref_rope_gain(const m2d_config *c) {
    const m2d_rope_scaling *s = &c->rope_scaling;
    if (s->kind != M2D_ROPE_SCALING_YARN) return 1;
    if (s->attention_factor) return s->attention_factor;
    double f = s->factor;
#define MS(m) (f <= 1 ? 1 : 0.1 * (m) * log(f) + 1)
    return s->mscale && s->mscale_all_dim ? MS(s->mscale) / MS(s->mscale_all_dim) : MS(1);
#undef MS
}

void tu_ref_rope(double *v, int rot, int pos, const m2d_config *c, int interleaved) {
    double gain = ref_rope_gain(c);
    for (int i = 0; i < rot / 2; i++) {
        double f = pos * ref_freq(c, i, rot);
        double *pa = interleaved ? v + 2 * i : v + i, *pb = interleaved ? pa + 1 : pa + rot / 2, a = *pa, b = *pb;
        *pa = gain * (a * cos(f) - b * sin(f));
        *pb = gain * (b * cos(f) + a * sin(f));
    }
}

static void ref_rope(double *v, int hd, int pos, const m2d_config *c) { tu_ref_rope(v, hd, pos, c, 0); }

/* q/k norm of one token's heads: per head ([head_dim] weight, Qwen3) or over the whole projection
 * (OLMoE), told apart by the weight's length; then RoPE per head */
static void ref_clip(double *v, int n, double lim) {
    for (int i = 0; lim > 0 && i < n; i++) v[i] = v[i] < -lim ? -lim : v[i] > lim ? lim : v[i];
}

static void ref_qk(double *v, int heads, int hd, const m2d_tensor *norm, const m2d_config *c, int pos) {
    if (norm && m2d_tensor_numel(norm) == (int64_t)heads * hd && heads > 1) ref_rms(v, heads * hd, norm, c->rms_norm_eps);
    for (int a = 0; a < heads; a++)
        if (norm && m2d_tensor_numel(norm) == hd) ref_rms(v + (size_t)a * hd, hd, norm, c->rms_norm_eps);
    ref_clip(v, heads * hd, c->clip_qkv); /* OLMoE: after the norms, before RoPE */
    for (int a = 0; a < heads; a++) ref_rope(v + (size_t)a * hd, hd, pos, c);
}

typedef struct {
    int n, d, H, KV, hd;
    double *x, *q, *K, *V; /* residual stream [n, d]; q [n, H*hd]; keys, values [n, KV*hd] */
} ref_state;

/* causal GQA of token t: att [H*hd]; with WINDOW w > 0 only keys t - w < s2 <= t (HF's sliding
 * mask, kv > q - w); with SINKS (per head) exp(sink) joins the softmax denominator (GPT-OSS) */
static void ref_attend(const ref_state *s, int t, int window, const double *sinks, double *att) {
    int H = s->H, KV = s->KV, hd = s->hd, lo = window > 0 && t + 1 > window ? t + 1 - window : 0;
    double *sc = malloc(sizeof(double) * (size_t)(t + 1));
    for (int a = 0; a < H; a++) {
        int g = a / (H / KV);
        double mx = sinks ? sinks[a] : -INFINITY, z = 0;
        for (int s2 = lo; s2 <= t; s2++) {
            double dd = 0;
            for (int i = 0; i < hd; i++) dd += s->q[(size_t)t * H * hd + a * hd + i] * s->K[(size_t)s2 * KV * hd + g * hd + i];
            sc[s2] = dd / sqrt(hd);
            mx = fmax(mx, sc[s2]);
        }
        for (int s2 = lo; s2 <= t; s2++) z += (sc[s2] = exp(sc[s2] - mx));
        if (sinks) z += exp(sinks[a] - mx);
        for (int i = 0; i < hd; i++) {
            double acc = 0;
            for (int s2 = lo; s2 <= t; s2++) acc += sc[s2] * s->V[(size_t)s2 * KV * hd + g * hd + i];
            att[a * hd + i] = acc / z;
        }
    }
    free(sc);
}

static void ref_attention_layer(const m2d_model *m, const m2d_layer *L, ref_state *s, int qk_norm) {
    const m2d_config *c = &m->cfg;
    int d = s->d, H = s->H, KV = s->KV, hd = s->hd;
    double *h = malloc(sizeof(double) * d), *att = malloc(sizeof(double) * H * hd), *y = malloc(sizeof(double) * d);
    for (int t = 0; t < s->n; t++) {
        memcpy(h, s->x + (size_t)t * d, sizeof(double) * d);
        ref_rms(h, d, L->attn_norm, c->rms_norm_eps);
        ref_linear(L->q_proj, h, d, H * hd, s->q + (size_t)t * H * hd);
        ref_linear(L->k_proj, h, d, KV * hd, s->K + (size_t)t * KV * hd);
        ref_linear(L->v_proj, h, d, KV * hd, s->V + (size_t)t * KV * hd);
        ref_bias(L->q_bias, H * hd, s->q + (size_t)t * H * hd);
        ref_bias(L->k_bias, KV * hd, s->K + (size_t)t * KV * hd);
        ref_bias(L->v_bias, KV * hd, s->V + (size_t)t * KV * hd);
        ref_clip(s->V + (size_t)t * KV * hd, KV * hd, c->clip_qkv);
        ref_qk(s->q + (size_t)t * H * hd, H, hd, qk_norm ? L->q_norm : NULL, c, t);
        ref_qk(s->K + (size_t)t * KV * hd, KV, hd, qk_norm ? L->k_norm : NULL, c, t);
    }
    double *sinks = L->sinks ? tu_ref_tensor_f64(L->sinks) : NULL;
    int window = c->layer_window ? c->layer_window[L - m->layers] : 0;
    for (int t = 0; t < s->n; t++) {
        ref_attend(s, t, window, sinks, att);
        ref_linear(L->o_proj, att, H * hd, d, y);
        ref_bias(L->o_bias, d, y);
        for (int i = 0; i < d; i++) s->x[(size_t)t * d + i] += y[i];
    }
    free(h); free(att); free(y); free(sinks);
}

/* DeepSeek-V2's softmax scale: head^-1/2, times yarn_get_mscale(factor, mscale_all_dim)^2 when the
 * RoPE is YaRN-scaled and mscale_all_dim is set (transformers' yarn_apply_mscale) */
double tu_ref_mla_scale(const m2d_config *c, int head) {
    const m2d_rope_scaling *s = &c->rope_scaling;
    double m = 1;
    if (s->kind == M2D_ROPE_SCALING_YARN && s->mscale_all_dim && s->factor > 1) m = 0.1 * s->mscale_all_dim * log(s->factor) + 1;
    return m * m / sqrt(head);
}

/* multi-head latent attention as modeling_deepseek_v2.py writes it, one token at a time: q (q_proj,
 * or q_b(norm(q_a x))), the latent c = norm(kv_a x)[:kv_lora], per head k = [kv_b c (nope) | the one
 * rotated k_pe], v = kv_b c (v part); interleaved RoPE on the rope dims; o_proj as stored */
static void ref_mla_layer(const m2d_model *m, int l, ref_state *s) {
    const m2d_config *c = &m->cfg;
    const m2d_layer *L = &m->layers[l];
    int d = s->d, H = c->num_attention_heads, nope = c->qk_nope_head_dim, rope = c->rope_dim, vd = c->v_head_dim;
    int hd = nope + rope, kr = c->kv_lora_rank, qr = c->q_lora_rank;
    double *h = malloc(sizeof(double) * d), *qa = malloc(sizeof(double) * (qr + 1)), *kva = malloc(sizeof(double) * (kr + rope));
    double *kvb = malloc(sizeof(double) * H * (nope + vd)), *K = malloc(sizeof(double) * (size_t)s->n * H * hd);
    double *V = malloc(sizeof(double) * (size_t)s->n * H * vd), *Q = malloc(sizeof(double) * (size_t)s->n * H * hd);
    for (int t = 0; t < s->n; t++) {
        memcpy(h, s->x + (size_t)t * d, sizeof(double) * d);
        ref_rms(h, d, L->attn_norm, c->rms_norm_eps);
        double *q = Q + (size_t)t * H * hd, *k = K + (size_t)t * H * hd;
        if (qr) {
            ref_linear(L->q_a_proj, h, d, qr, qa);
            ref_rms(qa, qr, L->q_a_norm, 1e-6); /* transformers' DeepseekV2RMSNorm default, not rms_norm_eps */
            ref_linear(L->q_b_proj, qa, qr, H * hd, q);
        } else {
            ref_linear(L->q_proj, h, d, H * hd, q);
        }
        ref_linear(L->kv_a_proj, h, d, kr + rope, kva);
        ref_rms(kva, kr, L->kv_a_norm, 1e-6);
        ref_linear(L->kv_b_proj, kva, kr, H * (nope + vd), kvb);
        tu_ref_rope(kva + kr, rope, t, c, 1);
        for (int a = 0; a < H; a++) {
            tu_ref_rope(q + a * hd + nope, rope, t, c, 1);
            memcpy(k + a * hd, kvb + a * (nope + vd), sizeof(double) * nope);
            memcpy(k + a * hd + nope, kva + kr, sizeof(double) * rope);
            memcpy(V + ((size_t)t * H + a) * vd, kvb + a * (nope + vd) + nope, sizeof(double) * vd);
        }
    }
    char *name = m2d_strfmt("model.layers.%d.self_attn.o_proj.weight", l);
    const m2d_tensor *o = m2d_st_find(m->st, name); /* the stored one, not the engine's padded copy */
    free(name);
    double *att = malloc(sizeof(double) * H * vd), *y = malloc(sizeof(double) * d), *sc = malloc(sizeof(double) * s->n);
    double scale = tu_ref_mla_scale(c, hd);
    for (int t = 0; t < s->n; t++) {
        for (int a = 0; a < H; a++) {
            double mx = -INFINITY, z = 0;
            for (int u = 0; u <= t; u++) {
                double dd = 0;
                for (int i = 0; i < hd; i++) dd += Q[((size_t)t * H + a) * hd + i] * K[((size_t)u * H + a) * hd + i];
                mx = fmax(mx, sc[u] = dd * scale);
            }
            for (int u = 0; u <= t; u++) z += (sc[u] = exp(sc[u] - mx));
            for (int i = 0; i < vd; i++) {
                double acc = 0;
                for (int u = 0; u <= t; u++) acc += sc[u] * V[((size_t)u * H + a) * vd + i];
                att[a * vd + i] = acc / z;
            }
        }
        ref_linear(o, att, H * vd, d, y);
        for (int i = 0; i < d; i++) s->x[(size_t)t * d + i] += y[i];
    }
    free(h); free(qa); free(kva); free(kvb); free(K); free(V); free(Q); free(att); free(y); free(sc);
}

/* DeepSeek's group_limited_greedy: experts of all but the TG groups with the largest best p are
 * marked taken (never chosen) */
static void ref_drop_groups(const double *p, int E, int NG, int TG, int *taken) {
    int per = E / NG, *keep = calloc((size_t)NG, sizeof(int));
    for (int j = 0; j < TG; j++) {
        int b = -1;
        double bm = 0;
        for (int g = 0; g < NG; g++) {
            double m = 0;
            for (int i = 0; i < per; i++) m = fmax(m, p[g * per + i]);
            if (!keep[g] && (b < 0 || m > bm)) b = g, bm = m;
        }
        keep[b] = 1;
    }
    for (int e = 0; e < E; e++) taken[e] = !keep[e / per];
    free(keep);
}

/* softmax router, top-k (ties -> lower index), gates renormalised per norm_topk_prob: y += sum g f_e(h).
 * GPT-OSS (GptOssTopKRouter): logits + bias, top-k of the logits, gates a softmax over those k
 * logits -- the same experts and, in exact arithmetic, the same gates as the renormalised full
 * softmax, which is how it is computed here (the engine takes the softmax of the k logits). */
static void ref_moe(const m2d_model *m, const m2d_layer *L, const double *h, double *x) {
    const m2d_config *c = &m->cfg;
    int d = c->hidden_size, E = c->num_experts, k = c->num_experts_per_tok;
    double *p = malloc(sizeof(double) * E), *y = malloc(sizeof(double) * d), mx = -INFINITY, z = 0, sel = 0;
    ref_linear(L->router, h, d, E, p);
    ref_bias(L->router_bias, E, p);
    for (int e2 = 0; e2 < E; e2++) mx = fmax(mx, p[e2]);
    for (int e2 = 0; e2 < E; e2++) z += (p[e2] = exp(p[e2] - mx));
    for (int e2 = 0; e2 < E; e2++) p[e2] /= z;
    int *taken = calloc((size_t)E, sizeof(int)), *ids = malloc(sizeof(int) * k);
    if (c->n_group) ref_drop_groups(p, E, c->n_group, c->topk_group, taken);
    for (int j = 0; j < k; j++) {
        int b = -1;
        for (int e2 = 0; e2 < E; e2++)
            if (!taken[e2] && (b < 0 || p[e2] > p[b])) b = e2;
        taken[b] = 1;
        ids[j] = b;
        sel += p[b];
    }
    for (int j = 0; j < k; j++) {
        double gw = (c->norm_topk_prob ? p[ids[j]] / sel : p[ids[j]]) * (c->routed_scaling_factor ? c->routed_scaling_factor : 1);
        int e = ids[j];
#define X_(r) (L->r ? L->r[e] : NULL)
        const m2d_tensor *const w[6] = {L->exp_gate[e], L->exp_up[e], L->exp_down[e], X_(exp_gate_bias), X_(exp_up_bias),
                                        X_(exp_down_bias)};
#undef X_
        ref_ffn(c, w, h, d, c->moe_intermediate_size, y);
        for (int i = 0; i < d; i++) x[i] += gw * y[i];
    }
    free(p); free(taken); free(ids);
    if (L->shared_gate_proj) { /* the shared experts, times sigmoid(w . h) when gated (Qwen2-MoE) */
        const m2d_tensor *const w[6] = {L->shared_gate_proj, L->shared_up_proj, L->shared_down_proj, NULL, NULL, NULL};
        ref_ffn(c, w, h, d, c->shared_expert_intermediate_size, y);
        double sg = 1, logit;
        if (L->shared_expert_gate) ref_linear(L->shared_expert_gate, h, d, 1, &logit), sg = 1 / (1 + exp(-logit));
        for (int i = 0; i < d; i++) x[i] += sg * y[i];
    }
    free(y);
}

static void ref_ffn_layer(const m2d_model *m, int l, ref_state *s) {
    const m2d_config *c = &m->cfg;
    const m2d_layer *L = &m->layers[l];
    int d = s->d;
    double *h = malloc(sizeof(double) * d), *y = malloc(sizeof(double) * d);
    for (int t = 0; t < s->n; t++) {
        double *x = s->x + (size_t)t * d;
        memcpy(h, x, sizeof(double) * d);
        ref_rms(h, d, L->ffn_norm, c->rms_norm_eps);
        if (c->layer_is_moe[l]) {
            ref_moe(m, L, h, x);
            continue;
        }
        const m2d_tensor *const w[6] = {L->gate_proj, L->up_proj, L->down_proj, L->gate_bias, L->up_bias, L->down_bias};
        ref_ffn(c, w, h, d, c->intermediate_size, y);
        for (int i = 0; i < d; i++) x[i] += y[i];
    }
    free(h); free(y);
}

void tu_ref_ffn(const m2d_model *m, int layer, int expert, const double *x, double *y) {
    const m2d_config *c = &m->cfg;
    const m2d_layer *L = &m->layers[layer];
    int e = expert;
    memset(y, 0, sizeof(double) * (size_t)c->hidden_size);
    if (e < 0) {
        const m2d_tensor *const w[6] = {L->gate_proj, L->up_proj, L->down_proj, L->gate_bias, L->up_bias, L->down_bias};
        ref_ffn(c, w, x, c->hidden_size, c->intermediate_size, y);
        return;
    }
#define X_(r) (L->r ? L->r[e] : NULL)
    const m2d_tensor *const w[6] = {L->exp_gate[e], L->exp_up[e], L->exp_down[e], X_(exp_gate_bias), X_(exp_up_bias),
                                    X_(exp_down_bias)};
#undef X_
    ref_ffn(c, w, x, c->hidden_size, c->moe_intermediate_size, y);
}

static void forward(const m2d_model *m, const int32_t *tok, int n, double *logits, int qk_norm) {
    const m2d_config *c = &m->cfg;
    int d = c->hidden_size, H = c->num_attention_heads, KV = c->num_key_value_heads, hd = c->head_dim;
    ref_state s = {n, d, H, KV, hd, calloc((size_t)n * d, sizeof(double)), malloc(sizeof(double) * n * H * hd),
                   malloc(sizeof(double) * n * KV * hd), malloc(sizeof(double) * n * KV * hd)};
    double *emb = tu_ref_tensor_f64(m->embed);
    for (int t = 0; t < n; t++) memcpy(s.x + (size_t)t * d, emb + (size_t)tok[t] * d, sizeof(double) * d);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (m->layers[l].kv_a_proj) ref_mla_layer(m, l, &s);
        else ref_attention_layer(m, &m->layers[l], &s, qk_norm);
        ref_ffn_layer(m, l, &s);
    }
    for (int t = 0; t < n; t++) {
        ref_rms(s.x + (size_t)t * d, d, m->final_norm, c->rms_norm_eps);
        ref_linear(m->lm_head, s.x + (size_t)t * d, d, c->vocab_size, logits + (size_t)t * c->vocab_size);
    }
    free(s.x); free(s.q); free(s.K); free(s.V); free(emb);
}

void tu_ref_forward(const m2d_model *m, const int32_t *tok, int n, double *logits) { forward(m, tok, n, logits, 1); }

void tu_ref_forward_no_qk_norm(const m2d_model *m, const int32_t *tok, int n, double *logits) {
    forward(m, tok, n, logits, 0);
}
