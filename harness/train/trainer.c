/* trainer — a distillation step: micro-batches, teacher, student, loss, backward, AdamW. */
#include "train/trainer.h"

#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "base/util.h"
#include "engine/engine.h"

struct m2d_trainer {
    m2d_trainer_opts o;
    const m2d_model *student;
    m2d_backend *be;
    m2d_engine *te;
    m2d_train_params *p;
    m2d_net *net;
    m2d_kd *kd;
};

static int check_opts(const m2d_trainer_opts *o) {
    if (o->seq_len < 2) return m2d_err("distill: --seq-len %d: need at least 2", o->seq_len);
    if (o->batch < 1) return m2d_err("distill: --batch %d: need at least 1", o->batch);
    int b = o->micro_batch ? o->micro_batch : o->batch;
    if (b < 1 || o->batch % b)
        return m2d_err("distill: --micro-batch %d must divide --batch %d", o->micro_batch, o->batch);
    if (o->optim.steps < 1) return m2d_err("distill: %d steps: need at least 1", o->optim.steps);
    if (o->train_precision != M2D_PREC_FP32 && o->train_precision != M2D_PREC_BF16)
        return m2d_err("distill: --train-precision %s: fp32 or bf16", m2d_precision_name(o->train_precision));
    return 0;
}

int m2d_train_precision_parse(const char *s, const char *what, m2d_precision *out) {
    m2d_precision p;
    if (m2d_precision_parse(s, what, &p)) return -1;
    if (p != M2D_PREC_FP32 && p != M2D_PREC_BF16) return m2d_err("%s %s: the student trains in fp32 or bf16", what, s);
    *out = p;
    return 0;
}

int m2d_trainer_route_topk(const m2d_config *teacher, int topk) {
    return topk == teacher->num_experts_per_tok ? 0 : topk;
}

const char *m2d_trainer_teacher_backend(const m2d_trainer_opts *o) {
    return o->teacher_backend ? o->teacher_backend : o->backend;
}

static int open_parts(m2d_trainer *t, const m2d_model *teacher) {
    const m2d_trainer_opts *o = &t->o;
    int b = o->micro_batch ? o->micro_batch : o->batch;
    m2d_engine_opts eo = {.backend = m2d_trainer_teacher_backend(o), .n_threads = o->threads, .precision = o->precision};
    if (m2d_engine_open(teacher, &eo, &t->te)) return -1;
    /* the student's backend also holds the teacher's LM head: prepared for the teacher's precision
     * (the student's own weights are fp32 views, never prepared, and its GEMMs ask for fp32) */
    m2d_backend_opts bo = {.n_threads = o->threads, .precision = m2d_engine_precision(t->te)};
    if (m2d_backend_new(o->backend ? o->backend : "cpu", &bo, &t->be)) return -1;
    if (!(t->be->ops->precisions & (1u << o->train_precision)))
        return m2d_err("distill: --train-precision %s: backend %s has no such GEMMs", m2d_precision_name(o->train_precision),
                       t->be->ops->name);
    int route = m2d_trainer_route_topk(&teacher->cfg, o->teacher_topk);
    if (route && m2d_engine_set_route_topk(t->te, route)) return -1;
    if (m2d_train_params_new(t->student, t->be, &t->p)) return -1;
    m2d_net_opts no = {o->seq_len, b, o->recompute, o->train_precision};
    if (m2d_net_new(&t->student->cfg, t->p, &no, &t->net)) return -1;
    return m2d_kd_new(teacher, t->te, &t->student->cfg, t->net, t->p, b * o->seq_len, o->loss, o->mse_weight, o->mse_norm,
                      &t->kd);
}

int m2d_trainer_new(const m2d_model *teacher, const m2d_model *student, const m2d_trainer_opts *o, m2d_trainer **out) {
    *out = NULL;
    if (check_opts(o)) return -1;
    m2d_trainer *t = m2d_calloc(1, sizeof *t);
    t->o = *o;
    t->student = student;
    if (open_parts(t, teacher)) {
        m2d_trainer_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

void m2d_trainer_free(m2d_trainer *t) {
    if (!t) return;
    m2d_kd_free(t->kd);
    m2d_net_free(t->net);
    m2d_train_params_free(t->p);
    m2d_engine_free(t->te);
    m2d_backend_free(t->be);
    free(t);
}

m2d_train_params *m2d_trainer_params(m2d_trainer *t) { return t->p; }
m2d_precision m2d_trainer_precision(const m2d_trainer *t) { return m2d_engine_precision(t->te); }

static int step_impl(m2d_trainer *t, int step, const int32_t *tokens, m2d_step_stats *st) {
    const m2d_trainer_opts *o = &t->o;
    int b = o->micro_batch ? o->micro_batch : o->batch, L = o->seq_len;
    double scale = 1.0 / ((double)o->batch * L);
    memset(st, 0, sizeof *st);
    m2d_train_params_zero(t->p, M2D_PBUF_GRADS);
    for (int mb = 0; mb < o->batch / b; mb++) {
        const int32_t *tok = tokens + (size_t)mb * b * L;
        double t0 = m2d_now();
        if (m2d_kd_teacher(t->kd, tok, b, L)) return -1;
        st->teacher_s += m2d_now() - t0;
        if (m2d_net_forward(t->net, tok, b)) return -1;
        m2d_kd_loss_backward(t->kd, scale, &st->div, &st->mse);
    }
    st->loss = st->div + st->mse;
    m2d_optim_step(t->p, &o->optim, step, &st->grad_norm, &st->lr);
    return 0;
}

int m2d_trainer_step(m2d_trainer *t, int step, const int32_t *tokens, m2d_step_stats *st) {
    if (step < 1 || step > t->o.optim.steps)
        return m2d_err("distill: step %d outside [1, %d]", step, t->o.optim.steps);
    t->be->ops->enter(t->be);
    int rc = step_impl(t, step, tokens, st);
    int lrc = t->be->ops->leave(t->be);
    return rc ? rc : lrc;
}

int m2d_trainer_logits(m2d_trainer *t, const int32_t *tokens, int n_seq, float *logits) {
    int b = t->o.micro_batch ? t->o.micro_batch : t->o.batch;
    if (n_seq > b) return m2d_err("distill: %d windows exceed the micro-batch %d", n_seq, b);
    const m2d_backend_ops *B = t->be->ops;
    int V = t->student->cfg.vocab_size;
    B->enter(t->be);
    int rc = m2d_net_forward(t->net, tokens, n_seq);
    if (rc == 0) {
        m2d_mat H = m2d_net_hidden(t->net);
        m2d_buf *z = B->alloc(t->be, sizeof(float) * (size_t)H.rows * V);
        m2d_mat Z = m2d_mat_of(z, 0, H.rows, V, V);
        B->gemm(t->be, &H, t->p->p[t->p->lm_head].w, 0, &Z, 0.0f, m2d_net_precision(t->net));
        B->download(t->be, logits, z, 0, sizeof(float) * (size_t)H.rows * V);
        B->release(t->be, z);
    }
    int lrc = B->leave(t->be);
    return rc ? rc : lrc;
}

int m2d_trainer_teacher_logits(m2d_trainer *t, const int32_t *tokens, int n_seq, float *logits) {
    int b = t->o.micro_batch ? t->o.micro_batch : t->o.batch;
    if (n_seq > b) return m2d_err("distill: %d windows exceed the micro-batch %d", n_seq, b);
    t->be->ops->enter(t->be);
    int rc = m2d_kd_teacher(t->kd, tokens, n_seq, t->o.seq_len);
    if (rc == 0) m2d_kd_teacher_logits(t->kd, logits);
    int lrc = t->be->ops->leave(t->be);
    return rc ? rc : lrc;
}

size_t m2d_peak_rss(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (size_t)ru.ru_maxrss * 1024; /* Linux: kilobytes */
}
