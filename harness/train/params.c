/* params — master weights, gradients and AdamW moments of a dense student (see params.h). */
#include "train/params.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

const char *m2d_train_unsupported(const m2d_config *c) {
    if (c->ops.attn != M2D_ATTN_GQA) return "latent attention (MLA)";
    return NULL;
}

static int check_student(const m2d_model *s, m2d_backend *be) {
    if (!be->ops->train)
        return m2d_err("backend %s has no training ops (it cannot distill)", be->ops->name);
    for (int l = 0; l < s->cfg.num_hidden_layers; l++)
        if (s->cfg.layer_is_moe[l])
            return m2d_err("%s: layer %d is an MoE layer: only dense students are trained", s->dir, l);
    const char *why = m2d_train_unsupported(&s->cfg);
    if (why)
        return m2d_err("%s: the training engine does not implement %s (%s): only dense students with GQA attention "
                       "are trained", s->dir, why, s->cfg.arch);
    return 0;
}

/* append tensor T as a parameter (or return the index it already has: a tied LM head) */
static int add_param(m2d_train_params *p, const m2d_tensor *t, const m2d_tensor **src) {
    for (int i = 0; i < p->n; i++)
        if (src[i] == t) return i;
    m2d_tparam *q = &p->p[p->n];
    q->name = t->name;
    q->ndim = t->ndim;
    q->rows = t->shape[0];
    q->cols = t->ndim > 1 ? t->shape[1] : 1;
    q->n = (size_t)m2d_tensor_numel(t);
    q->off = p->total;
    q->decay = t->ndim >= 2;
    p->total += q->n;
    src[p->n] = t;
    return p->n++;
}

static void collect(m2d_train_params *p, const m2d_model *s, const m2d_tensor **src) {
    const m2d_config *c = &s->cfg;
    p->n_layers = c->num_hidden_layers;
    p->layer = m2d_malloc(sizeof *p->layer * (size_t)(p->n_layers ? p->n_layers : 1));
    p->embed = add_param(p, s->embed, src);
    for (int l = 0; l < p->n_layers; l++)
        for (int r = 0; r < M2D_T_COUNT; r++)
            p->layer[l][r] = s->layers[l].w[r] ? add_param(p, s->layers[l].w[r], src) : -1;
    p->final_norm = add_param(p, s->final_norm, src);
    p->lm_head = add_param(p, s->lm_head, src); /* == embed when tied */
}

/* master weights from the checkpoint, gradients and moments zero */
static void initialise(m2d_train_params *p, const m2d_tensor *const *src) {
    float *host = m2d_malloc(sizeof(float) * (p->total ? p->total : 1));
    for (int i = 0; i < p->n; i++) m2d_to_f32(src[i]->dtype, src[i]->data, 0, (int64_t)p->p[i].n, host + p->p[i].off);
    m2d_train_params_upload(p, M2D_PBUF_WEIGHTS, host);
    free(host);
    for (int b = M2D_PBUF_GRADS; b < M2D_PBUF_COUNT; b++) m2d_train_params_zero(p, (m2d_pbuf)b);
}

int m2d_train_params_new(const m2d_model *s, m2d_backend *be, m2d_train_params **out) {
    *out = NULL;
    if (check_student(s, be)) return -1;
    m2d_train_params *p = m2d_calloc(1, sizeof *p);
    p->be = be;
    p->T = be->ops->train;
    int cap = 3 + M2D_T_COUNT * s->cfg.num_hidden_layers;
    p->p = m2d_calloc((size_t)cap, sizeof *p->p);
    const m2d_tensor **src = m2d_calloc((size_t)cap, sizeof *src);
    collect(p, s, src);
    for (int b = 0; b < M2D_PBUF_COUNT; b++)
        if (!(p->buf[b] = be->ops->alloc(be, sizeof(float) * (p->total ? p->total : 1)))) {
            free(src);
            m2d_train_params_free(p);
            return m2d_err("training: cannot allocate %zu parameters (%s)", p->total, m2d_errmsg());
        }
    for (int i = 0; i < p->n; i++)
        p->p[i].w = p->T->weight_view(be, p->buf[M2D_PBUF_WEIGHTS], p->p[i].off, p->p[i].rows, p->p[i].cols);
    initialise(p, src);
    free(src);
    *out = p;
    return 0;
}

void m2d_train_params_free(m2d_train_params *p) {
    if (!p) return;
    for (int i = 0; i < p->n; i++)
        if (p->p[i].w) p->be->ops->weight_free(p->be, p->p[i].w);
    for (int b = 0; b < M2D_PBUF_COUNT; b++) p->be->ops->release(p->be, p->buf[b]);
    free(p->p);
    free(p->layer);
    free(p);
}

void m2d_train_params_download(m2d_train_params *p, m2d_pbuf which, float *host) {
    p->be->ops->download(p->be, host, p->buf[which], 0, sizeof(float) * p->total);
}

void m2d_train_params_upload(m2d_train_params *p, m2d_pbuf which, const float *host) {
    p->be->ops->upload(p->be, p->buf[which], 0, host, sizeof(float) * p->total);
}

void m2d_train_params_zero(m2d_train_params *p, m2d_pbuf which) { p->T->fill(p->be, p->buf[which], 0, p->total, 0.0f); }

m2d_mat m2d_train_params_grad(const m2d_train_params *p, int i) {
    const m2d_tparam *q = &p->p[i];
    if (q->ndim == 1) return m2d_mat_of(p->buf[M2D_PBUF_GRADS], q->off, 1, (int)q->rows, (int)q->rows);
    return m2d_mat_of(p->buf[M2D_PBUF_GRADS], q->off, (int)q->rows, (int)q->cols, (int)q->cols);
}

/* ---- the model view over host memory ---- */

typedef struct {
    m2d_model m;            /* first: the view's address */
    m2d_tensor *tensors;    /* [n params] */
} model_view;

int m2d_train_params_model(const m2d_train_params *p, const m2d_model *s, float *host, m2d_model **out) {
    model_view *v = m2d_calloc(1, sizeof *v);
    v->m = *s; /* config, architecture and checkpoint shared; tensors and layers are the view's */
    v->tensors = m2d_calloc((size_t)p->n, sizeof *v->tensors);
    for (int i = 0; i < p->n; i++) {
        const m2d_tparam *q = &p->p[i];
        v->tensors[i] = (m2d_tensor){.name = q->name, .dtype = M2D_F32, .ndim = q->ndim, .shape = {q->rows, q->cols},
                                     .data = host + q->off, .nbytes = q->n * sizeof(float)};
        if (q->ndim == 1) v->tensors[i].shape[1] = 0;
    }
    v->m.layers = m2d_calloc((size_t)p->n_layers, sizeof *v->m.layers);
    for (int l = 0; l < p->n_layers; l++)
        for (int r = 0; r < M2D_T_COUNT; r++)
            v->m.layers[l].w[r] = p->layer[l][r] >= 0 ? &v->tensors[p->layer[l][r]] : NULL;
    v->m.embed = &v->tensors[p->embed];
    v->m.final_norm = &v->tensors[p->final_norm];
    v->m.lm_head = &v->tensors[p->lm_head];
    v->m.lm_head_stored = s->lm_head_stored ? v->m.lm_head : NULL;
    *out = &v->m;
    return 0;
}

void m2d_train_params_model_free(m2d_model *view) {
    if (!view) return;
    model_view *v = (model_view *)view;
    free(v->m.layers);
    free(v->tensors);
    free(v);
}
