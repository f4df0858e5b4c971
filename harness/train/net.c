/* net — the dense student's forward (the engine's ops, activations kept) and backward. */
#include "train/net.h"

#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "engine/engine_check.h"
#include "model/rope.h"

/* what one layer keeps (X0, its input, is net->x[l]); qc, kc, vc: q, k, v before clip_qkv's clamp;
 * MLA: the q latent before and after its norm (qa, qan), the kv latent likewise (ckv, cn) */
typedef struct {
    m2d_buf *xn1, *qp, *kp, *q, *k, *v, *att, *x1, *xn2, *g, *u, *hh, *qc, *kc, *vc, *qa, *qan, *ckv, *cn;
} layer_acts;

/* the backward's buffers, one set; MLA: dL/d the q latent (dqa), dL/d kv_a_proj_with_mqa's output
 * (dkva: [the kv latent | the shared rotated key]), dL/d kv_b_proj's output (dpk: per head k_nope | v) */
typedef struct {
    m2d_buf *dx, *dxn, *datt, *dq, *dk, *dv, *dhh, *du, *dqa, *dkva, *dpk;
} grad_bufs;

struct m2d_net {
    const m2d_config *c;
    m2d_train_params *p;
    m2d_backend *be;
    const m2d_backend_ops *B;
    const m2d_backend_train_ops *T;
    int L, max_seqs, n_seq, rows;
    int d, qd, kvd, F;
    int qr, kr, kva, kvb;   /* MLA: q and kv latent ranks, kv_a_proj_with_mqa's and kv_b_proj's outputs */
    bool recompute, qk_norm, clip, mla;
    m2d_precision prec;     /* of the projections' GEMMs, forward and backward (m2d_net_opts) */
    m2d_rope_args rope;     /* the engine's (engine.c m2d_engine_open): frequencies, YaRN factor, rotated dims */
    double *inv_freq;
    layer_acts *acts;       /* [layers], or [1] reused when recomputing */
    m2d_buf **x;            /* [layers + 1]: each layer's input; x[layers] the last layer's output */
    m2d_buf *h, *dh;        /* final-normed hidden and its gradient */
    m2d_buf *tok, *pos, *negpos;
    grad_bufs gb;
};

static size_t f32s(int64_t rows, int64_t cols) { return (size_t)rows * (size_t)cols * sizeof(float); }

static int dense_width(const m2d_config *c) { return c->intermediate_size; }

/* ---- buffers ---- */

static int alloc_all(m2d_net *n, m2d_buf **const *list, const size_t *bytes, int count) {
    for (int i = 0; i < count; i++)
        if (!(*list[i] = n->B->alloc(n->be, bytes[i])))
            return m2d_err("training: cannot allocate activations (%zu bytes): %s", bytes[i], m2d_errmsg());
    return 0;
}

static int acts_alloc(m2d_net *n, layer_acts *a) {
    int R = n->max_seqs * n->L;
    m2d_buf **const list[] = {&a->xn1, &a->qp, &a->kp, &a->q, &a->k, &a->v, &a->att, &a->x1, &a->xn2, &a->g,
                              &a->u, &a->hh, &a->qc, &a->kc, &a->vc, &a->qa, &a->qan, &a->ckv, &a->cn};
    size_t bytes[] = {f32s(R, n->d), f32s(R, n->qd), f32s(R, n->kvd), f32s(R, n->qd), f32s(R, n->kvd), f32s(R, n->kvd),
                      f32s(R, n->qd), f32s(R, n->d), f32s(R, n->d), f32s(R, n->F), f32s(R, n->F), f32s(R, n->F),
                      f32s(R, n->qd), f32s(R, n->kvd), f32s(R, n->kvd), f32s(R, n->qr), f32s(R, n->qr),
                      f32s(R, n->kr), f32s(R, n->kr)};
    int count = (int)M2D_ARRAY_LEN(list);
    if (!n->qk_norm) { /* no q/k norm: q and k come straight out of their GEMMs, qp/kp unused */
        bytes[1] = bytes[2] = 0;
    }
    if (!n->clip) bytes[12] = bytes[13] = bytes[14] = 0; /* no clip_qkv: nothing before a clamp to keep */
    if (alloc_all(n, list, bytes, count)) return -1;
    /* MLA: the values' padding (head_dim - v_head_dim per head) stays zero, as the engine's: only
     * the v slots are written (so the attention output's padding and o_proj's gradient there are 0) */
    if (n->mla) n->T->fill(n->be, a->v, 0, (size_t)R * n->kvd, 0.0f);
    return 0;
}

static void acts_free(m2d_net *n, layer_acts *a) {
    m2d_buf *all[] = {a->xn1, a->qp, a->kp, a->q,  a->k,  a->v,  a->att, a->x1,  a->xn2, a->g,
                      a->u,   a->hh, a->qc, a->kc, a->vc, a->qa, a->qan, a->ckv, a->cn};
    for (size_t i = 0; i < M2D_ARRAY_LEN(all); i++) n->B->release(n->be, all[i]);
}

static int grads_alloc(m2d_net *n) {
    int R = n->max_seqs * n->L;
    grad_bufs *g = &n->gb;
    m2d_buf **const list[] = {&g->dx, &g->dxn, &g->datt, &g->dq, &g->dk, &g->dv, &g->dhh, &g->du, &g->dqa,
                              &g->dkva, &g->dpk};
    size_t bytes[] = {f32s(R, n->d), f32s(R, n->d), f32s(R, n->qd), f32s(R, n->qd), f32s(R, n->kvd), f32s(R, n->kvd),
                      f32s(R, n->F), f32s(R, n->F), f32s(R, n->qr), f32s(R, n->kva), f32s(R, n->kvb)};
    return alloc_all(n, list, bytes, (int)M2D_ARRAY_LEN(list));
}

static int net_alloc(m2d_net *n) {
    int R = n->max_seqs * n->L, nl = n->c->num_hidden_layers, na = n->recompute ? 1 : nl;
    n->acts = m2d_calloc((size_t)na, sizeof *n->acts);
    n->x = m2d_calloc((size_t)nl + 1, sizeof *n->x);
    for (int a = 0; a < na; a++)
        if (acts_alloc(n, &n->acts[a])) return -1;
    for (int l = 0; l <= nl; l++)
        if (!(n->x[l] = n->B->alloc(n->be, f32s(R, n->d)))) return -1;
    m2d_buf **const list[] = {&n->h, &n->dh, &n->tok, &n->pos, &n->negpos};
    size_t bytes[] = {f32s(R, n->d), f32s(R, n->d), sizeof(int32_t) * (size_t)R, sizeof(int32_t) * (size_t)R,
                      sizeof(int32_t) * (size_t)R};
    if (alloc_all(n, list, bytes, 5) || grads_alloc(n)) return -1;
    int32_t *pos = m2d_malloc(sizeof(int32_t) * (size_t)R);
    for (int i = 0; i < R; i++) pos[i] = i % n->L;
    n->B->upload(n->be, n->pos, 0, pos, sizeof(int32_t) * (size_t)R);
    for (int i = 0; i < R; i++) pos[i] = -pos[i]; /* RoPE's backward: R(p)^T = R(-p) */
    n->B->upload(n->be, n->negpos, 0, pos, sizeof(int32_t) * (size_t)R);
    free(pos);
    return 0;
}

int m2d_net_new(const m2d_config *c, m2d_train_params *p, const m2d_net_opts *o, m2d_net **out) {
    *out = NULL;
    if (o->prec != M2D_PREC_FP32 && o->prec != M2D_PREC_BF16)
        return m2d_err("training: precision %s: the student trains in fp32 or bf16", m2d_precision_name(o->prec));
    if (o->seq_len < 1 || o->max_seqs < 1) return m2d_err("training: seq_len %d, sequences %d", o->seq_len, o->max_seqs);
    if (o->seq_len > c->max_position_embeddings)
        return m2d_err("training: sequence length %d exceeds max_position_embeddings %d", o->seq_len,
                       c->max_position_embeddings);
    m2d_net *n = m2d_calloc(1, sizeof *n);
    n->c = c, n->p = p, n->be = p->be, n->B = p->be->ops, n->T = p->T;
    n->L = o->seq_len, n->max_seqs = o->max_seqs, n->recompute = o->recompute, n->prec = o->prec;
    n->d = c->hidden_size, n->qd = c->num_attention_heads * c->head_dim, n->kvd = c->num_key_value_heads * c->head_dim;
    n->F = dense_width(c);
    n->qk_norm = c->ops.qk_norm != M2D_QK_NORM_NONE;
    n->clip = c->clip_qkv > 0;
    n->mla = c->ops.attn == M2D_ATTN_MLA;
    if (n->mla) {
        n->qr = c->q_lora_rank, n->kr = c->kv_lora_rank, n->kva = c->kv_lora_rank + c->rope_dim;
        n->kvb = c->num_attention_heads * (c->qk_nope_head_dim + c->v_head_dim);
    }
    int rot = m2d_engine_rope_dim(c);
    n->inv_freq = m2d_malloc(sizeof(double) * (size_t)(rot / 2 ? rot / 2 : 1));
    m2d_rope_inv_freq(&c->rope_scaling, c->rope_theta, rot, n->inv_freq);
    n->rope = (m2d_rope_args){.kind = c->ops.rope, .theta = c->rope_theta, .inv_freq = n->inv_freq,
                              .attn_factor = m2d_rope_attention_factor(&c->rope_scaling), .rot_dim = rot};
    if (net_alloc(n)) {
        m2d_net_free(n);
        return -1;
    }
    *out = n;
    return 0;
}

void m2d_net_free(m2d_net *n) {
    if (!n) return;
    int nl = n->c->num_hidden_layers, na = n->recompute ? 1 : nl;
    for (int a = 0; n->acts && a < na; a++) acts_free(n, &n->acts[a]);
    for (int l = 0; n->x && l <= nl; l++) n->B->release(n->be, n->x[l]);
    m2d_buf *all[] = {n->h, n->dh, n->tok, n->pos, n->negpos, n->gb.dx, n->gb.dxn, n->gb.datt, n->gb.dq, n->gb.dk,
                      n->gb.dv, n->gb.dhh, n->gb.du, n->gb.dqa, n->gb.dkva, n->gb.dpk};
    for (size_t i = 0; i < M2D_ARRAY_LEN(all); i++) n->B->release(n->be, all[i]);
    free(n->acts);
    free(n->x);
    free(n->inv_freq);
    free(n);
}

/* ---- forward ---- */

static m2d_mat M(const m2d_net *n, m2d_buf *b, int cols) { return m2d_mat_of(b, 0, n->rows, cols, cols); }
/* the layer's tensor of ROLE, or NULL when the layer has none (an optional role: biases, sinks) */
static m2d_weight *W(const m2d_net *n, int l, int role) {
    int i = n->p->layer[l][role];
    return i >= 0 ? n->p->p[i].w : NULL;
}
static layer_acts *slot(m2d_net *n, int l) { return &n->acts[n->recompute ? 0 : l]; }

/* y[r] += the layer's bias of ROLE, when it has one */
static void bias(m2d_net *n, int l, int role, m2d_mat *y) {
    if (W(n, l, role)) n->B->add_bias(n->be, y, W(n, l, role));
}

/* the q/k norm's matrix views: each head's vector (per head) or the whole projection */
static m2d_mat heads(const m2d_net *n, m2d_buf *b, int n_heads) {
    int hd = n->c->head_dim;
    if (n->c->ops.qk_norm == M2D_QK_NORM_WHOLE) return m2d_mat_of(b, 0, n->rows, n_heads * hd, n_heads * hd);
    return m2d_mat_of(b, 0, n->rows * n_heads, hd, hd);
}

/* clip_qkv (OLMoE): X's values before the clamp into KEEP, then X clamped */
static void clip(m2d_net *n, m2d_mat *x, m2d_buf *keep) {
    m2d_mat K = M(n, keep, x->cols);
    n->T->copy(n->be, &K, x);
    n->B->clamp(n->be, x, (float)n->c->clip_qkv);
}

/* q, k, v as the engine's gqa_qkv: projections (+ biases), q/k norm, clip_qkv, RoPE */
static void gqa_qkv_fwd(m2d_net *n, int l, layer_acts *a) {
    const m2d_config *c = n->c;
    const m2d_backend_ops *B = n->B;
    int H = c->num_attention_heads, KV = c->num_key_value_heads, hd = c->head_dim;
    m2d_mat XN = M(n, a->xn1, n->d), Q = M(n, a->q, n->qd), K = M(n, a->k, n->kvd), V = M(n, a->v, n->kvd);
    m2d_mat QP = n->qk_norm ? M(n, a->qp, n->qd) : Q, KP = n->qk_norm ? M(n, a->kp, n->kvd) : K;
    B->gemm(n->be, &XN, W(n, l, M2D_T_Q), 0, &QP, 0.0f, n->prec);
    B->gemm(n->be, &XN, W(n, l, M2D_T_K), 0, &KP, 0.0f, n->prec);
    B->gemm(n->be, &XN, W(n, l, M2D_T_V), 0, &V, 0.0f, n->prec);
    bias(n, l, M2D_T_Q_BIAS, &QP);
    bias(n, l, M2D_T_K_BIAS, &KP);
    bias(n, l, M2D_T_V_BIAS, &V);
    if (n->qk_norm) {
        m2d_mat qi = heads(n, a->qp, H), qo = heads(n, a->q, H), ki = heads(n, a->kp, KV), ko = heads(n, a->k, KV);
        B->rmsnorm(n->be, &qi, W(n, l, M2D_T_Q_NORM), c->rms_norm_eps, &qo);
        B->rmsnorm(n->be, &ki, W(n, l, M2D_T_K_NORM), c->rms_norm_eps, &ko);
    }
    if (n->clip) {
        clip(n, &Q, a->qc);
        clip(n, &K, a->kc);
        clip(n, &V, a->vc);
    }
    B->rope(n->be, &Q, H, hd, n->pos, &n->rope);
    B->rope(n->be, &K, KV, hd, n->pos, &n->rope);
}

/* MLA's q as the engine's mla_qkv: q_proj, or q_a_proj, its norm (kept before and after) and q_b_proj */
static void mla_q_fwd(m2d_net *n, int l, layer_acts *a) {
    const m2d_backend_ops *B = n->B;
    m2d_mat XN = M(n, a->xn1, n->d), Q = M(n, a->q, n->qd);
    if (!n->qr) {
        B->gemm(n->be, &XN, W(n, l, M2D_T_Q), 0, &Q, 0.0f, n->prec);
        return;
    }
    m2d_mat QA = M(n, a->qa, n->qr), QAN = M(n, a->qan, n->qr);
    B->gemm(n->be, &XN, W(n, l, M2D_T_Q_A), 0, &QA, 0.0f, n->prec);
    B->rmsnorm(n->be, &QA, W(n, l, M2D_T_Q_A_NORM), n->c->mla_norm_eps, &QAN);
    B->gemm(n->be, &QAN, W(n, l, M2D_T_Q_B), 0, &Q, 0.0f, n->prec);
}

/* MLA (model.h M2D_ATTN_MLA) as the engine's mla_qkv, op for op: the kv latent (kept before and
 * after its norm), kv_b_proj's rows of each head ([k_nope | v]) and the shared rotated key (the
 * last rope rows of kv_a_proj_with_mqa) into heads of head_dim, values zero-padded; RoPE on each
 * head's rope part */
static void mla_qkv_fwd(m2d_net *n, int l, layer_acts *a) {
    const m2d_config *c = n->c;
    const m2d_backend_ops *B = n->B;
    int H = c->num_attention_heads, hd = c->head_dim, nope = c->qk_nope_head_dim, rope = c->rope_dim;
    int vd = c->v_head_dim, qd = n->qd, R = n->rows;
    mla_q_fwd(n, l, a);
    m2d_mat XN = M(n, a->xn1, n->d), CKV = M(n, a->ckv, n->kr), CN = M(n, a->cn, n->kr);
    B->gemm(n->be, &XN, W(n, l, M2D_T_KV_A), 0, &CKV, 0.0f, n->prec);
    B->rmsnorm(n->be, &CKV, W(n, l, M2D_T_KV_A_NORM), c->mla_norm_eps, &CN);
    for (int h = 0; h < H; h++) {
        size_t o = (size_t)h * hd;
        m2d_mat KN = m2d_mat_of(a->k, o, R, nope, qd), KR = m2d_mat_of(a->k, o + nope, R, rope, qd);
        m2d_mat V = m2d_mat_of(a->v, o, R, vd, qd);
        B->gemm(n->be, &CN, W(n, l, M2D_T_KV_B), h * (nope + vd), &KN, 0.0f, n->prec);
        B->gemm(n->be, &CN, W(n, l, M2D_T_KV_B), h * (nope + vd) + nope, &V, 0.0f, n->prec);
        B->gemm(n->be, &XN, W(n, l, M2D_T_KV_A), n->kr, &KR, 0.0f, n->prec);
    }
    m2d_mat QR = m2d_mat_of(a->q, nope, R, qd - nope, qd), KR = m2d_mat_of(a->k, nope, R, qd - nope, qd);
    B->rope(n->be, &QR, H, hd, n->pos, &n->rope);
    B->rope(n->be, &KR, H, hd, n->pos, &n->rope);
}

static void attention_fwd(m2d_net *n, int l, layer_acts *a) {
    const m2d_config *c = n->c;
    const m2d_backend_ops *B = n->B;
    m2d_mat X0 = M(n, n->x[l], n->d), XN = M(n, a->xn1, n->d);
    B->rmsnorm(n->be, &X0, W(n, l, M2D_T_ATTN_NORM), c->rms_norm_eps, &XN);
    if (n->mla) mla_qkv_fwd(n, l, a);
    else gqa_qkv_fwd(n, l, a);
    for (int s = 0; s < n->n_seq; s++) {
        size_t r0 = (size_t)s * n->L;
        m2d_attn_args at = {.q = m2d_mat_of(a->q, r0 * n->qd, n->L, n->qd, n->qd),
                            .k = m2d_mat_of(a->k, r0 * n->kvd, n->L, n->kvd, n->kvd),
                            .v = m2d_mat_of(a->v, r0 * n->kvd, n->L, n->kvd, n->kvd),
                            .n_heads = c->num_attention_heads, .n_kv = c->num_key_value_heads, .head_dim = c->head_dim,
                            .out = m2d_mat_of(a->att, r0 * n->qd, n->L, n->qd, n->qd),
                            .window = c->layer_window ? c->layer_window[l] : 0, .sinks = W(n, l, M2D_T_SINKS),
                            .scale = (float)c->attn_scale};
        B->attention(n->be, &at);
    }
    m2d_mat ATT = M(n, a->att, n->qd), X1 = M(n, a->x1, n->d);
    n->T->copy(n->be, &X1, &X0);
    B->gemm(n->be, &ATT, W(n, l, M2D_T_O), 0, &X1, 1.0f, n->prec); /* residual add, as the engine */
    bias(n, l, M2D_T_O_BIAS, &X1);
}

static void ffn_fwd(m2d_net *n, int l, layer_acts *a) {
    const m2d_backend_ops *B = n->B;
    const m2d_layer_ops *ops = &n->c->ops;
    m2d_mat X1 = M(n, a->x1, n->d), XN = M(n, a->xn2, n->d), G = M(n, a->g, n->F), U = M(n, a->u, n->F);
    m2d_mat HH = M(n, a->hh, n->F), X2 = M(n, n->x[l + 1], n->d);
    B->rmsnorm(n->be, &X1, W(n, l, M2D_T_FFN_NORM), n->c->rms_norm_eps, &XN);
    B->gemm(n->be, &XN, W(n, l, M2D_T_GATE), 0, &G, 0.0f, n->prec);
    B->gemm(n->be, &XN, W(n, l, M2D_T_UP), 0, &U, 0.0f, n->prec);
    bias(n, l, M2D_T_GATE_BIAS, &G);
    bias(n, l, M2D_T_UP_BIAS, &U);
    n->T->copy(n->be, &HH, &G);
    if (ops->ffn_act == M2D_ACT_SWIGLU_CLAMP) B->glu_clamp(n->be, &HH, &U, ops->act_alpha, ops->act_limit);
    else B->glu(n->be, ops->ffn_act, &HH, &U);
    n->T->copy(n->be, &X2, &X1);
    B->gemm(n->be, &HH, W(n, l, M2D_T_DOWN), 0, &X2, 1.0f, n->prec);
    bias(n, l, M2D_T_DOWN_BIAS, &X2);
}

static void layer_fwd(m2d_net *n, int l) {
    layer_acts *a = slot(n, l);
    attention_fwd(n, l, a);
    ffn_fwd(n, l, a);
}

int m2d_net_forward(m2d_net *n, const int32_t *tokens, int n_seq) {
    if (n_seq < 1 || n_seq > n->max_seqs)
        return m2d_err("training: %d windows in a micro-batch (1..%d)", n_seq, n->max_seqs);
    int V = n->c->vocab_size;
    n->n_seq = n_seq;
    n->rows = n_seq * n->L;
    for (int i = 0; i < n->rows; i++)
        if (tokens[i] < 0 || tokens[i] >= V) return m2d_err("training: token %d at %d outside [0, %d)", tokens[i], i, V);
    n->B->upload(n->be, n->tok, 0, tokens, sizeof(int32_t) * (size_t)n->rows);
    m2d_mat X = M(n, n->x[0], n->d);
    n->B->embed(n->be, n->p->p[n->p->embed].w, n->tok, n->rows, &X);
    for (int l = 0; l < n->c->num_hidden_layers; l++) layer_fwd(n, l);
    m2d_mat XF = M(n, n->x[n->c->num_hidden_layers], n->d), H = M(n, n->h, n->d);
    n->B->rmsnorm(n->be, &XF, n->p->p[n->p->final_norm].w, n->c->rms_norm_eps, &H);
    return 0;
}

m2d_precision m2d_net_precision(const m2d_net *n) { return n->prec; }
int m2d_net_rows(const m2d_net *n) { return n->rows; }
m2d_mat m2d_net_hidden(const m2d_net *n) { return M(n, n->h, n->d); }
m2d_mat m2d_net_dhidden(const m2d_net *n) { return M(n, n->dh, n->d); }
m2d_mat m2d_net_layer_out(const m2d_net *n, int layer) { return M(n, n->x[layer + 1], n->d); }

/* ---- backward ---- */

static m2d_mat G_(const m2d_net *n, int l, int role) { return m2d_train_params_grad(n->p, n->p->layer[l][role]); }

/* the gradient of the layer's bias of ROLE (when it has one) from DY, the gradient of what it is added to */
static void bias_bwd(m2d_net *n, int l, int role, const m2d_mat *dy) {
    if (!W(n, l, role)) return;
    m2d_mat g = G_(n, l, role);
    n->T->bias_bwd(n->be, dy, &g);
}

/* dX (n->gb.dx) holds dL/d x[l+1]; adds the FFN block's gradients and leaves dL/d x1 in dX */
static void ffn_bwd(m2d_net *n, int l, layer_acts *a) {
    const m2d_backend_train_ops *T = n->T;
    const m2d_layer_ops *ops = &n->c->ops;
    m2d_mat DX = M(n, n->gb.dx, n->d), DXN = M(n, n->gb.dxn, n->d), DG = M(n, n->gb.dhh, n->F), DU = M(n, n->gb.du, n->F);
    m2d_mat HH = M(n, a->hh, n->F), G = M(n, a->g, n->F), U = M(n, a->u, n->F), XN = M(n, a->xn2, n->d);
    m2d_mat X1 = M(n, a->x1, n->d);
    m2d_mat gd = G_(n, l, M2D_T_DOWN), gg = G_(n, l, M2D_T_GATE), gu = G_(n, l, M2D_T_UP), gn = G_(n, l, M2D_T_FFN_NORM);
    bias_bwd(n, l, M2D_T_DOWN_BIAS, &DX);
    T->gemm_dx(n->be, &DX, W(n, l, M2D_T_DOWN), &DG, 0.0f, n->prec);
    T->gemm_dw(n->be, &DX, &HH, &gd, 1.0f, n->prec);
    if (ops->ffn_act == M2D_ACT_SWIGLU_CLAMP) T->glu_clamp_bwd(n->be, &G, &U, ops->act_alpha, ops->act_limit, &DG, &DU);
    else T->glu_bwd(n->be, ops->ffn_act, &G, &U, &DG, &DU);
    bias_bwd(n, l, M2D_T_GATE_BIAS, &DG);
    bias_bwd(n, l, M2D_T_UP_BIAS, &DU);
    T->gemm_dx(n->be, &DG, W(n, l, M2D_T_GATE), &DXN, 0.0f, n->prec);
    T->gemm_dx(n->be, &DU, W(n, l, M2D_T_UP), &DXN, 1.0f, n->prec);
    T->gemm_dw(n->be, &DG, &XN, &gg, 1.0f, n->prec);
    T->gemm_dw(n->be, &DU, &XN, &gu, 1.0f, n->prec);
    T->rmsnorm_bwd(n->be, &X1, W(n, l, M2D_T_FFN_NORM), n->c->rms_norm_eps, &DXN, &DX, 1.0f, &gn);
}

static void attention_core_bwd(m2d_net *n, int l, layer_acts *a, m2d_buf *datt) {
    const m2d_config *c = n->c;
    m2d_weight *sinks = W(n, l, M2D_T_SINKS);
    for (int s = 0; s < n->n_seq; s++) {
        size_t r0 = (size_t)s * n->L;
        m2d_attn_bwd_args b = {.q = m2d_mat_of(a->q, r0 * n->qd, n->L, n->qd, n->qd),
                               .k = m2d_mat_of(a->k, r0 * n->kvd, n->L, n->kvd, n->kvd),
                               .v = m2d_mat_of(a->v, r0 * n->kvd, n->L, n->kvd, n->kvd),
                               .out = m2d_mat_of(a->att, r0 * n->qd, n->L, n->qd, n->qd),
                               .dout = m2d_mat_of(datt, r0 * n->qd, n->L, n->qd, n->qd),
                               .dq = m2d_mat_of(n->gb.dq, r0 * n->qd, n->L, n->qd, n->qd),
                               .dk = m2d_mat_of(n->gb.dk, r0 * n->kvd, n->L, n->kvd, n->kvd),
                               .dv = m2d_mat_of(n->gb.dv, r0 * n->kvd, n->L, n->kvd, n->kvd),
                               .n_heads = c->num_attention_heads, .n_kv = c->num_key_value_heads,
                               .head_dim = c->head_dim, .window = c->layer_window ? c->layer_window[l] : 0,
                               .sinks = sinks, .scale = (float)c->attn_scale};
        if (sinks) b.dsinks = G_(n, l, M2D_T_SINKS);
        n->T->attention_bwd(n->be, &b);
    }
}

/* DQ, DK, DV hold dL/d(q, k, v as attention read them); back through RoPE, clip_qkv, the q/k
 * norm, the biases and the projections: dL/d(the normed input) into DXN */
static void gqa_qkv_bwd(m2d_net *n, int l, layer_acts *a) {
    const m2d_config *c = n->c;
    const m2d_backend_train_ops *T = n->T;
    int H = c->num_attention_heads, KV = c->num_key_value_heads, hd = c->head_dim;
    m2d_mat DQ = M(n, n->gb.dq, n->qd), DK = M(n, n->gb.dk, n->kvd), DV = M(n, n->gb.dv, n->kvd);
    n->B->rope(n->be, &DQ, H, hd, n->negpos, &n->rope);
    n->B->rope(n->be, &DK, KV, hd, n->negpos, &n->rope);
    if (n->clip) {
        m2d_mat QC = M(n, a->qc, n->qd), KC = M(n, a->kc, n->kvd), VC = M(n, a->vc, n->kvd);
        T->clamp_bwd(n->be, &QC, (float)c->clip_qkv, &DQ);
        T->clamp_bwd(n->be, &KC, (float)c->clip_qkv, &DK);
        T->clamp_bwd(n->be, &VC, (float)c->clip_qkv, &DV);
    }
    if (n->qk_norm) { /* in place: dL/d(q before its norm) replaces dL/dq */
        m2d_mat qi = heads(n, a->qp, H), dq = heads(n, n->gb.dq, H), ki = heads(n, a->kp, KV), dk = heads(n, n->gb.dk, KV);
        m2d_mat gq = G_(n, l, M2D_T_Q_NORM), gk = G_(n, l, M2D_T_K_NORM);
        T->rmsnorm_bwd(n->be, &qi, W(n, l, M2D_T_Q_NORM), c->rms_norm_eps, &dq, &dq, 0.0f, &gq);
        T->rmsnorm_bwd(n->be, &ki, W(n, l, M2D_T_K_NORM), c->rms_norm_eps, &dk, &dk, 0.0f, &gk);
    }
    bias_bwd(n, l, M2D_T_Q_BIAS, &DQ);
    bias_bwd(n, l, M2D_T_K_BIAS, &DK);
    bias_bwd(n, l, M2D_T_V_BIAS, &DV);
    m2d_mat XN = M(n, a->xn1, n->d), DXN = M(n, n->gb.dxn, n->d);
    m2d_mat gq = G_(n, l, M2D_T_Q), gk = G_(n, l, M2D_T_K), gv = G_(n, l, M2D_T_V);
    T->gemm_dx(n->be, &DQ, W(n, l, M2D_T_Q), &DXN, 0.0f, n->prec);
    T->gemm_dx(n->be, &DK, W(n, l, M2D_T_K), &DXN, 1.0f, n->prec);
    T->gemm_dx(n->be, &DV, W(n, l, M2D_T_V), &DXN, 1.0f, n->prec);
    T->gemm_dw(n->be, &DQ, &XN, &gq, 1.0f, n->prec);
    T->gemm_dw(n->be, &DK, &XN, &gk, 1.0f, n->prec);
    T->gemm_dw(n->be, &DV, &XN, &gv, 1.0f, n->prec);
}

/* MLA's q path backward: DQ (dL/dq before RoPE) through q_proj, or q_b_proj, the q latent's norm
 * and q_a_proj; dL/d(the normed input) added to DXN */
static void mla_q_bwd(m2d_net *n, int l, layer_acts *a) {
    const m2d_backend_train_ops *T = n->T;
    m2d_mat DQ = M(n, n->gb.dq, n->qd), XN = M(n, a->xn1, n->d), DXN = M(n, n->gb.dxn, n->d);
    if (!n->qr) {
        m2d_mat gq = G_(n, l, M2D_T_Q);
        T->gemm_dw(n->be, &DQ, &XN, &gq, 1.0f, n->prec);
        T->gemm_dx(n->be, &DQ, W(n, l, M2D_T_Q), &DXN, 1.0f, n->prec);
        return;
    }
    m2d_mat QA = M(n, a->qa, n->qr), QAN = M(n, a->qan, n->qr), DQA = M(n, n->gb.dqa, n->qr);
    m2d_mat gb = G_(n, l, M2D_T_Q_B), gnorm = G_(n, l, M2D_T_Q_A_NORM), ga = G_(n, l, M2D_T_Q_A);
    T->gemm_dw(n->be, &DQ, &QAN, &gb, 1.0f, n->prec);
    T->gemm_dx(n->be, &DQ, W(n, l, M2D_T_Q_B), &DQA, 0.0f, n->prec);
    T->rmsnorm_bwd(n->be, &QA, W(n, l, M2D_T_Q_A_NORM), n->c->mla_norm_eps, &DQA, &DQA, 0.0f, &gnorm);
    T->gemm_dw(n->be, &DQA, &XN, &ga, 1.0f, n->prec);
    T->gemm_dx(n->be, &DQA, W(n, l, M2D_T_Q_A), &DXN, 1.0f, n->prec);
}

/* dL/d kv_b_proj's output, all heads' rows at once: each head's [dk_nope | dv] packed as its rows */
static void mla_pack_kv(m2d_net *n) {
    const m2d_config *c = n->c;
    int nope = c->qk_nope_head_dim, vd = c->v_head_dim, hd = c->head_dim, w = nope + vd, R = n->rows;
    for (int h = 0; h < c->num_attention_heads; h++) {
        m2d_mat kn = m2d_mat_of(n->gb.dk, (size_t)h * hd, R, nope, n->qd), v = m2d_mat_of(n->gb.dv, (size_t)h * hd, R, vd, n->qd);
        m2d_mat pk = m2d_mat_of(n->gb.dpk, (size_t)h * w, R, nope, n->kvb);
        m2d_mat pv = m2d_mat_of(n->gb.dpk, (size_t)h * w + nope, R, vd, n->kvb);
        n->T->copy(n->be, &pk, &kn);
        n->T->copy(n->be, &pv, &v);
    }
}

/* MLA's backward from DQ, DK, DV (dL/d q, k, v as attention read them): RoPE, kv_b_proj, the kv
 * latent's norm, kv_a_proj_with_mqa (dkva: [the latent's gradient | the shared rotated key's,
 * summed over the heads it was given to]) and the q path: dL/d(the normed input) into DXN */
static void mla_qkv_bwd(m2d_net *n, int l, layer_acts *a) {
    const m2d_config *c = n->c;
    const m2d_backend_train_ops *T = n->T;
    int H = c->num_attention_heads, hd = c->head_dim, nope = c->qk_nope_head_dim, R = n->rows, qd = n->qd;
    m2d_mat DQR = m2d_mat_of(n->gb.dq, nope, R, qd - nope, qd), DKR = m2d_mat_of(n->gb.dk, nope, R, qd - nope, qd);
    n->B->rope(n->be, &DQR, H, hd, n->negpos, &n->rope);
    n->B->rope(n->be, &DKR, H, hd, n->negpos, &n->rope);
    mla_pack_kv(n);
    m2d_mat DPK = M(n, n->gb.dpk, n->kvb), CN = M(n, a->cn, n->kr), CKV = M(n, a->ckv, n->kr);
    m2d_mat DKVA = M(n, n->gb.dkva, n->kva), DC = m2d_mat_of(n->gb.dkva, 0, R, n->kr, n->kva);
    m2d_mat DROT = m2d_mat_of(n->gb.dkva, n->kr, R, c->rope_dim, n->kva), DK0 = m2d_mat_of(n->gb.dk, nope, R, c->rope_dim, qd);
    m2d_mat gb = G_(n, l, M2D_T_KV_B), gnorm = G_(n, l, M2D_T_KV_A_NORM), ga = G_(n, l, M2D_T_KV_A);
    m2d_mat XN = M(n, a->xn1, n->d), DXN = M(n, n->gb.dxn, n->d);
    T->gemm_dw(n->be, &DPK, &CN, &gb, 1.0f, n->prec);
    T->gemm_dx(n->be, &DPK, W(n, l, M2D_T_KV_B), &DC, 0.0f, n->prec);
    T->rmsnorm_bwd(n->be, &CKV, W(n, l, M2D_T_KV_A_NORM), c->mla_norm_eps, &DC, &DC, 0.0f, &gnorm);
    T->head_sum(n->be, &DK0, H, hd, &DROT, 0.0f);
    T->gemm_dw(n->be, &DKVA, &XN, &ga, 1.0f, n->prec);
    T->gemm_dx(n->be, &DKVA, W(n, l, M2D_T_KV_A), &DXN, 0.0f, n->prec);
    mla_q_bwd(n, l, a);
}

/* dX holds dL/d x1; adds the attention block's gradients and leaves dL/d x[l] in dX */
static void attention_bwd(m2d_net *n, int l, layer_acts *a) {
    const m2d_config *c = n->c;
    const m2d_backend_train_ops *T = n->T;
    m2d_mat DX = M(n, n->gb.dx, n->d), DXN = M(n, n->gb.dxn, n->d), DATT = M(n, n->gb.datt, n->qd);
    m2d_mat ATT = M(n, a->att, n->qd), X0 = M(n, n->x[l], n->d);
    m2d_mat go = G_(n, l, M2D_T_O), gn = G_(n, l, M2D_T_ATTN_NORM);
    bias_bwd(n, l, M2D_T_O_BIAS, &DX);
    T->gemm_dx(n->be, &DX, W(n, l, M2D_T_O), &DATT, 0.0f, n->prec);
    T->gemm_dw(n->be, &DX, &ATT, &go, 1.0f, n->prec);
    attention_core_bwd(n, l, a, n->gb.datt);
    if (n->mla) mla_qkv_bwd(n, l, a);
    else gqa_qkv_bwd(n, l, a);
    T->rmsnorm_bwd(n->be, &X0, W(n, l, M2D_T_ATTN_NORM), c->rms_norm_eps, &DXN, &DX, 1.0f, &gn);
}

void m2d_net_backward(m2d_net *n, m2d_net_layer_grad cb, void *ctx) {
    int nl = n->c->num_hidden_layers;
    m2d_mat DX = M(n, n->gb.dx, n->d), DH = M(n, n->dh, n->d), XF = M(n, n->x[nl], n->d);
    m2d_mat gf = m2d_train_params_grad(n->p, n->p->final_norm);
    n->T->rmsnorm_bwd(n->be, &XF, n->p->p[n->p->final_norm].w, n->c->rms_norm_eps, &DH, &DX, 0.0f, &gf);
    for (int l = nl - 1; l >= 0; l--) {
        if (cb) {
            m2d_mat out = M(n, n->x[l + 1], n->d);
            cb(ctx, l, &out, &DX);
        }
        if (n->recompute) layer_fwd(n, l); /* the same ops on the same input: the same activations */
        layer_acts *a = slot(n, l);
        ffn_bwd(n, l, a);
        attention_bwd(n, l, a);
    }
    m2d_mat ge = m2d_train_params_grad(n->p, n->p->embed);
    n->T->embed_bwd(n->be, n->tok, &DX, &ge);
}

void m2d_net_activation_bytes(const m2d_config *c, int rows, int seq_len, int threads, bool recompute, size_t *saved,
                              size_t *scratch) {
    size_t d = (size_t)c->hidden_size, qd = (size_t)c->num_attention_heads * c->head_dim;
    size_t kvd = (size_t)c->num_key_value_heads * c->head_dim, F = (size_t)dense_width(c), R = (size_t)rows;
    size_t nl = (size_t)c->num_hidden_layers, qk = c->ops.qk_norm != M2D_QK_NORM_NONE, cl = c->clip_qkv > 0;
    bool mla = c->ops.attn == M2D_ATTN_MLA; /* the q and kv latents, kept and in the backward */
    size_t qr = mla ? (size_t)c->q_lora_rank : 0, kr = mla ? (size_t)c->kv_lora_rank : 0;
    size_t kva = mla ? kr + (size_t)c->rope_dim : 0;
    size_t kvb = mla ? (size_t)c->num_attention_heads * (c->qk_nope_head_dim + c->v_head_dim) : 0;
    size_t layer = R * (3 * d + (2 + qk + cl) * qd + (2 + qk + 2 * cl) * kvd + 3 * F + 2 * qr + 2 * kr) * sizeof(float);
    size_t inputs = (nl + 1) * R * d * sizeof(float) + 2 * R * d * sizeof(float); /* x[], hidden, dhidden */
    *saved = inputs + (recompute ? 0 : nl * layer);
    size_t grads = R * (2 * d + 2 * qd + 2 * kvd + 2 * F + qr + kva + kvb) * sizeof(float);
    size_t att = (size_t)M2D_MAX(threads, 1) * 2 * (size_t)seq_len * seq_len * sizeof(float) +
                 2 * (size_t)c->num_attention_heads * seq_len * c->head_dim * sizeof(float);
    *scratch = grads + att + (recompute ? layer : 0);
}
