/* optim — schedule, clipping, AdamW (see optim.h). */
#include "train/optim.h"

#include <math.h>

#include "base/util.h"

void m2d_optim_defaults(m2d_optim_opts *o) {
    *o = (m2d_optim_opts){.lr = 1e-4, .min_lr = 1e-5, .warmup = 20, .steps = 0, .beta1 = 0.9, .beta2 = 0.95,
                          .eps = 1e-8, .weight_decay = 0.01, .clip = 1.0};
}

double m2d_lr_at(const m2d_optim_opts *o, int s) {
    if (s <= o->warmup) return o->lr * s / o->warmup;
    if (o->steps <= o->warmup) return o->min_lr;
    double t = (double)(s - o->warmup) / (o->steps - o->warmup);
    return o->min_lr + (o->lr - o->min_lr) * 0.5 * (1.0 + cos(M_PI * t));
}

double m2d_grad_norm(m2d_train_params *p) {
    m2d_buf *out = p->be->ops->alloc(p->be, sizeof(double));
    double s = 0;
    p->T->sumsq(p->be, p->buf[M2D_PBUF_GRADS], 0, p->total, out);
    p->be->ops->download(p->be, &s, out, 0, sizeof s);
    p->be->ops->release(p->be, out);
    return sqrt(s);
}

void m2d_optim_step(m2d_train_params *p, const m2d_optim_opts *o, int step, double *grad_norm, double *lr) {
    *grad_norm = m2d_grad_norm(p);
    *lr = m2d_lr_at(o, step);
    float coef = 1.0f;
    if (o->clip > 0) { /* torch: clip / (norm + 1e-6) in fp32, clamped to 1 */
        coef = (float)o->clip / ((float)*grad_norm + 1e-6f);
        if (coef > 1.0f) coef = 1.0f;
    }
    for (int i = 0; i < p->n; i++) {
        m2d_adamw_args a = {*lr, o->beta1, o->beta2, o->eps, p->p[i].decay ? o->weight_decay : 0.0, step, coef};
        p->T->adamw(p->be, p->buf[M2D_PBUF_WEIGHTS], p->buf[M2D_PBUF_GRADS], p->buf[M2D_PBUF_ADAM_M],
                    p->buf[M2D_PBUF_ADAM_V], p->p[i].off, p->p[i].n, &a);
    }
}
