/* kd — teacher logits, divergence, LM head backward, hidden-state MSE (see kd.h). */
#include "train/kd.h"

#include <stdlib.h>
#include <string.h>

#include "base/util.h"

#define KD_BLOCK_BYTES ((size_t)128 << 20) /* logits of one row block, per side */

struct m2d_kd {
    m2d_engine *te;
    m2d_backend *be;
    const m2d_backend_ops *B;
    const m2d_backend_train_ops *T;
    m2d_net *net;
    m2d_train_params *p;
    m2d_loss_kind kind;
    m2d_precision teacher_prec; /* the teacher engine's (resolved): its LM head runs in it too */
    double mse_weight;
    m2d_mse_norm mse_norm;
    int d, V, n_layers, max_rows, block, rows;
    m2d_weight *teacher_head;
    m2d_buf *ht;            /* teacher final-normed hidden [rows, d] */
    m2d_buf *tl;            /* teacher layer outputs [layers][rows, d] (MSE only) */
    m2d_buf *zs, *zt, *row_loss;
    float *host_h, *host_l; /* one window's teacher outputs */
    double *host_loss;
    double mse_scale, mse_sum;
};

int m2d_loss_parse(const char *s, m2d_loss_kind *out) {
    if (!strcmp(s, "fkl")) *out = M2D_LOSS_FKL;
    else if (!strcmp(s, "rkl")) *out = M2D_LOSS_RKL;
    else if (!strcmp(s, "fkl+mse")) *out = M2D_LOSS_FKL_MSE;
    else return m2d_err("loss '%s': expected fkl, rkl or fkl+mse", s);
    return 0;
}

const char *m2d_loss_name(m2d_loss_kind k) {
    return k == M2D_LOSS_RKL ? "rkl" : k == M2D_LOSS_FKL_MSE ? "fkl+mse" : "fkl";
}

int m2d_mse_norm_parse(const char *s, m2d_mse_norm *out) {
    if (!strcmp(s, "minitron")) *out = M2D_MSE_MINITRON;
    else if (!strcmp(s, "sum")) *out = M2D_MSE_SUM;
    else return m2d_err("mse_norm '%s': expected minitron or sum", s);
    return 0;
}

const char *m2d_mse_norm_name(m2d_mse_norm n) { return n == M2D_MSE_SUM ? "sum" : "minitron"; }

static int check_pair(const m2d_model *t, const m2d_config *s, m2d_loss_kind kind) {
    const m2d_config *c = &t->cfg;
    if (c->vocab_size != s->vocab_size)
        return m2d_err("distill: teacher vocabulary %d differs from the student's %d", c->vocab_size, s->vocab_size);
    if (kind == M2D_LOSS_FKL_MSE && (c->hidden_size != s->hidden_size || c->num_hidden_layers != s->num_hidden_layers))
        return m2d_err("distill: --loss fkl+mse needs the teacher's hidden size and layer count (%d, %d) in the student "
                       "(%d, %d)", c->hidden_size, c->num_hidden_layers, s->hidden_size, s->num_hidden_layers);
    return 0;
}

int m2d_kd_new(const m2d_model *teacher, m2d_engine *te, const m2d_config *scfg, m2d_net *net, m2d_train_params *p,
               int max_rows, m2d_loss_kind kind, double mse_weight, m2d_mse_norm mse_norm, m2d_kd **out) {
    *out = NULL;
    if (check_pair(teacher, scfg, kind)) return -1;
    m2d_kd *k = m2d_calloc(1, sizeof *k);
    k->te = te, k->be = p->be, k->B = p->be->ops, k->T = p->T, k->net = net, k->p = p;
    k->kind = kind, k->mse_weight = mse_weight, k->mse_norm = mse_norm, k->teacher_prec = m2d_engine_precision(te);
    k->d = scfg->hidden_size, k->V = scfg->vocab_size, k->n_layers = scfg->num_hidden_layers, k->max_rows = max_rows;
    size_t per_row = sizeof(float) * (size_t)k->V;
    k->block = (int)M2D_MAX(1, M2D_MIN((size_t)max_rows, KD_BLOCK_BYTES / per_row));
    int td = teacher->cfg.hidden_size, layers = kind == M2D_LOSS_FKL_MSE ? k->n_layers : 0;
    k->teacher_head = k->B->weight_new(k->be, teacher->lm_head);
    k->B->make_resident(k->be, k->teacher_head, NULL);
    k->ht = k->B->alloc(k->be, sizeof(float) * (size_t)max_rows * td);
    k->tl = layers ? k->B->alloc(k->be, sizeof(float) * (size_t)layers * max_rows * td) : NULL;
    k->zs = k->B->alloc(k->be, per_row * (size_t)k->block);
    k->zt = k->B->alloc(k->be, per_row * (size_t)k->block);
    k->row_loss = k->B->alloc(k->be, sizeof(double) * (size_t)M2D_MAX(k->block, max_rows));
    k->host_loss = m2d_malloc(sizeof(double) * (size_t)M2D_MAX(k->block, max_rows));
    if (!k->ht || (layers && !k->tl) || !k->zs || !k->zt || !k->row_loss) {
        m2d_kd_free(k);
        return m2d_err("distill: cannot allocate the loss buffers: %s", m2d_errmsg());
    }
    *out = k;
    return 0;
}

void m2d_kd_free(m2d_kd *k) {
    if (!k) return;
    k->B->weight_free(k->be, k->teacher_head);
    m2d_buf *all[] = {k->ht, k->tl, k->zs, k->zt, k->row_loss};
    for (size_t i = 0; i < M2D_ARRAY_LEN(all); i++) k->B->release(k->be, all[i]);
    free(k->host_h);
    free(k->host_l);
    free(k->host_loss);
    free(k);
}

int m2d_kd_teacher(m2d_kd *k, const int32_t *tokens, int n_seq, int L) {
    const m2d_config *tc = &m2d_engine_model(k->te)->cfg;
    int td = tc->hidden_size, mse = k->kind == M2D_LOSS_FKL_MSE;
    if (n_seq * L > k->max_rows) return m2d_err("distill: %d teacher rows exceed %d", n_seq * L, k->max_rows);
    if (!k->host_h) k->host_h = m2d_malloc(sizeof(float) * (size_t)L * td);
    if (mse && !k->host_l) k->host_l = m2d_malloc(sizeof(float) * (size_t)k->n_layers * L * td);
    k->rows = n_seq * L;
    for (int s = 0; s < n_seq; s++) {
        if (m2d_engine_hidden(k->te, tokens + (size_t)s * L, L, k->host_h, mse ? k->host_l : NULL)) return -1;
        size_t row0 = (size_t)s * L;
        k->B->upload(k->be, k->ht, sizeof(float) * row0 * td, k->host_h, sizeof(float) * (size_t)L * td);
        for (int l = 0; mse && l < k->n_layers; l++)
            k->B->upload(k->be, k->tl, sizeof(float) * ((size_t)l * k->max_rows + row0) * td,
                         k->host_l + (size_t)l * L * td, sizeof(float) * (size_t)L * td);
    }
    return 0;
}

/* Z_T of rows r0 .. r0+nr (one block) into zt */
static m2d_mat teacher_block(m2d_kd *k, int r0, int nr) {
    int td = m2d_engine_model(k->te)->cfg.hidden_size;
    m2d_mat Tb = m2d_mat_of(k->ht, (size_t)r0 * td, nr, td, td), ZT = m2d_mat_of(k->zt, 0, nr, k->V, k->V);
    k->B->gemm(k->be, &Tb, k->teacher_head, 0, &ZT, 0.0f, k->teacher_prec);
    return ZT;
}

void m2d_kd_teacher_logits(m2d_kd *k, float *logits) {
    for (int r0 = 0; r0 < k->rows; r0 += k->block) {
        int nr = M2D_MIN(k->block, k->rows - r0);
        teacher_block(k, r0, nr);
        k->B->download(k->be, logits + (size_t)r0 * k->V, k->zt, 0, sizeof(float) * (size_t)nr * k->V);
    }
}

/* row-order sum of N per-row losses */
static double sum_rows(m2d_kd *k, int n) {
    k->B->download(k->be, k->host_loss, k->row_loss, 0, sizeof(double) * (size_t)n);
    double s = 0;
    for (int i = 0; i < n; i++) s += k->host_loss[i];
    return s;
}

/* MSE of layer LAYER's output against the teacher's, added to dL/d out */
static void mse_layer(void *ctx, int layer, const m2d_mat *out, m2d_mat *dout) {
    m2d_kd *k = ctx;
    m2d_mat t = m2d_mat_of(k->tl, (size_t)layer * k->max_rows * k->d, out->rows, k->d, k->d);
    k->T->mse(k->be, out, &t, k->mse_scale, dout, k->row_loss);
    k->mse_sum += k->mse_scale * sum_rows(k, out->rows);
}

/* Minitron's weight of one layer's MSE for this micro-batch: with L_is the mean over layers of the
 * layers' MSE (each SCALE-weighted per position, mean over hidden dims; the student's layer
 * outputs of the forward) and L_logits = LOGITS, the detached L_logits / L_is over the layer
 * count (0 when L_is is 0, as NeMo's balancer). */
static double minitron_layer_weight(m2d_kd *k, double scale, double logits) {
    m2d_mat DH = m2d_net_dhidden(k->net);
    double is = 0;
    for (int l = 0; l < k->n_layers; l++) {
        m2d_mat out = m2d_net_layer_out(k->net, l);
        m2d_mat t = m2d_mat_of(k->tl, (size_t)l * k->max_rows * k->d, out.rows, k->d, k->d);
        k->T->mse(k->be, &out, &t, 0.0, &DH, k->row_loss); /* the value only: scale 0 adds nothing to DH */
        is += scale * sum_rows(k, out.rows) / k->d;
    }
    is /= k->n_layers;
    return is > 0 ? logits / is / k->n_layers : 0;
}

void m2d_kd_loss_backward(m2d_kd *k, double scale, double *div, double *mse) {
    m2d_mat H = m2d_net_hidden(k->net), DH = m2d_net_dhidden(k->net);
    const m2d_tparam *head = &k->p->p[k->p->lm_head];
    m2d_mat gh = m2d_train_params_grad(k->p, k->p->lm_head);
    m2d_kd_kind kind = k->kind == M2D_LOSS_RKL ? M2D_KD_REVERSE_KL : M2D_KD_FORWARD_KL;
    int rows = k->rows, d = k->d, V = k->V;
    m2d_precision prec = m2d_net_precision(k->net); /* the student's LM head as its other projections */
    double sum = 0;
    for (int r0 = 0; r0 < rows; r0 += k->block) {
        int nr = M2D_MIN(k->block, rows - r0);
        m2d_mat Hb = m2d_mat_of(H.buf, H.off + (size_t)r0 * d, nr, d, d);
        m2d_mat ZS = m2d_mat_of(k->zs, 0, nr, V, V);
        m2d_mat DHb = m2d_mat_of(DH.buf, DH.off + (size_t)r0 * d, nr, d, d);
        k->B->gemm(k->be, &Hb, head->w, 0, &ZS, 0.0f, prec);
        m2d_mat ZT = teacher_block(k, r0, nr);
        k->T->kd_loss(k->be, kind, &ZT, &ZS, scale, k->row_loss);
        sum += sum_rows(k, nr);
        k->T->gemm_dx(k->be, &ZS, head->w, &DHb, 0.0f, prec);
        k->T->gemm_dw(k->be, &ZS, &Hb, &gh, 1.0f, prec);
    }
    *div += scale * sum;
    /* each layer's MSE: mean over positions and hidden dimensions; "sum": summed over layers times
     * the weight; "minitron": balanced against this micro-batch's logit loss, times the weight */
    double w = k->mse_weight;
    if (k->kind == M2D_LOSS_FKL_MSE && k->mse_norm == M2D_MSE_MINITRON) w *= minitron_layer_weight(k, scale, scale * sum);
    k->mse_scale = scale * w / d;
    k->mse_sum = 0;
    m2d_net_backward(k->net, k->kind == M2D_LOSS_FKL_MSE ? mse_layer : NULL, k);
    *mse += k->mse_sum;
}
