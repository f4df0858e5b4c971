/* convert/build — the student in memory from a teacher and a plan: merged, scaled and
 * concatenated FFNs, the --target moe layers, the random baselines. See build.h. */
#include "convert/build.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

float m2d_round_for(double v, m2d_dtype target) { return target == M2D_F32 ? (float)v : m2d_f64_to_f32_odd(v); }

void m2d_merge_matrices(const float *const *src, const double *w, int n, size_t numel, double scale, m2d_dtype target,
                        float *out) {
    for (size_t j = 0; j < numel; j++) {
        double acc = 0;
        for (int i = 0; i < n; i++) acc += w[i] * src[i][j];
        out[j] = m2d_round_for(scale * acc, target);
    }
}

void m2d_concat_ffn_blocks(int n, int d, const int *widths, const float *const *gates, const float *const *ups,
                           const float *const *downs, float *gate, float *up, float *down) {
    int total = 0, off = 0;
    for (int b = 0; b < n; b++) total += widths[b];
    for (int b = 0; b < n; b++) {
        size_t blk = (size_t)widths[b] * d;
        memcpy(gate + (size_t)off * d, gates[b], blk * sizeof(float));
        memcpy(up + (size_t)off * d, ups[b], blk * sizeof(float));
        for (int r = 0; r < d; r++)
            memcpy(down + (size_t)r * total + off, downs[b] + (size_t)r * widths[b], (size_t)widths[b] * sizeof(float));
        off += widths[b];
    }
}

void m2d_concat_ffn(int k, int d, int d_e, const float *const *gates, const float *const *ups,
                    const float *const *downs, float *gate, float *up, float *down) {
    int *w = m2d_malloc(sizeof(int) * (size_t)k);
    for (int g = 0; g < k; g++) w[g] = d_e;
    m2d_concat_ffn_blocks(k, d, w, gates, ups, downs, gate, up, down);
    free(w);
}

void m2d_swiglu_ref(int d, int inter, const float *gate, const float *up, const float *down, const float *x, float *y) {
    double *h = m2d_malloc((size_t)inter * sizeof *h);
    for (int i = 0; i < inter; i++) {
        double a = 0, b = 0;
        for (int j = 0; j < d; j++) {
            a += (double)gate[(size_t)i * d + j] * x[j];
            b += (double)up[(size_t)i * d + j] * x[j];
        }
        h[i] = a / (1 + exp(-a)) * b;
    }
    for (int r = 0; r < d; r++) {
        double acc = 0;
        for (int i = 0; i < inter; i++) acc += (double)down[(size_t)r * inter + i] * h[i];
        y[r] = (float)acc;
    }
    free(h);
}

/* The student owns its new tensors; the rest point into the teacher. */
typedef struct {
    m2d_model m;            /* first: the public pointer is &owner->m */
    m2d_tensor **owned;
    char *owns_data;        /* [cap_owned] 0: an alias of another tensor's data (slots of one group) */
    int n_owned, cap_owned;
    const m2d_tensor ***ptr_arrays; /* [n_ptr_arrays] per MoE layer expert pointer arrays (moe target) */
    int n_ptr_arrays;
    struct m2d_claim *claimed; /* a random-init student's own claims (its draws), else NULL: the teacher's */
} student_owner;

static void keep_tensor(student_owner *o, m2d_tensor *t, int owns_data) {
    if (o->n_owned == o->cap_owned) {
        o->cap_owned = o->cap_owned ? 2 * o->cap_owned : 64;
        o->owned = m2d_realloc(o->owned, (size_t)o->cap_owned * sizeof *o->owned);
        o->owns_data = m2d_realloc(o->owns_data, (size_t)o->cap_owned);
    }
    o->owns_data[o->n_owned] = (char)owns_data;
    o->owned[o->n_owned++] = t;
}

static m2d_tensor *new_tensor(student_owner *o, const char *name, m2d_dtype dt, int rows, int cols, const float *src) {
    m2d_tensor *t = m2d_calloc(1, sizeof *t);
    t->name = m2d_strdup(name);
    t->dtype = dt;
    t->ndim = cols > 0 ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols > 0 ? cols : 0;
    int64_t n = (int64_t)rows * (cols > 0 ? cols : 1);
    t->nbytes = (size_t)n * m2d_dtype_size(dt);
    void *data = m2d_malloc(t->nbytes ? t->nbytes : 1);
    m2d_from_f32(dt, src, n, data);
    t->data = data;
    keep_tensor(o, t, 1);
    return t;
}

/* A tensor named NAME over SRC's data (not copied, not freed with the student). */
static const m2d_tensor *alias_tensor(student_owner *o, const char *name, const m2d_tensor *src) {
    m2d_tensor *t = m2d_calloc(1, sizeof *t);
    *t = *src;
    t->name = m2d_strdup(name);
    keep_tensor(o, t, 0);
    return t;
}

/* New FFN tensor of role ROLE (SCOPE: DENSE, MOE or EXPERT) named by ARCH's tensor table; an
 * architecture that writes its FFN block itself (write_ffn: fused or quantised layouts) stores
 * it under other names, and the tensor gets a descriptive one. */
static int role_name(const m2d_arch *arch, m2d_scope scope, int role, int layer, int expert, char *name, size_t n) {
    if (arch->write_ffn && scope == M2D_SCOPE_EXPERT)
        snprintf(name, n, "model.layers.%d.experts.%d.%s", layer, expert, m2d_expert_role_name(role));
    else if (arch->write_ffn)
        snprintf(name, n, "model.layers.%d.%s", layer, m2d_layer_role_name(role));
    else
        return m2d_arch_tensor_name(arch, scope, role, layer, expert, name, n);
    return 0;
}

static const m2d_tensor *role_tensor(student_owner *o, const m2d_arch *arch, m2d_scope scope, int role, int layer,
                                     int expert, m2d_dtype dt, int rows, int cols, const float *src) {
    char name[256];
    if (role_name(arch, scope, role, layer, expert, name, sizeof name) != 0) return NULL;
    return new_tensor(o, name, dt, rows, cols, src);
}

/* One contribution to a group's expert: expert EXPERT of model layer LAYER with weight W, its
 * intermediate neurons permuted by PERM (NULL: as stored). */
typedef struct {
    int layer, expert;
    double w;
    const int *perm;
} contrib;

/* Group G's contributions: its sources (whole-model groupings) or its members (merge weights);
 * returns their number. *out malloc'd. */
static int group_contribs(const m2d_layer_plan *lp, int g, contrib **out) {
    int src = lp->src_start != NULL, a = src ? lp->src_start[g] : lp->group_start[g];
    int n = (src ? lp->src_start[g + 1] : lp->group_start[g + 1]) - a;
    contrib *c = m2d_malloc((size_t)n * sizeof *c);
    for (int i = 0; i < n; i++)
        c[i] = src ? (contrib){lp->src_layer[a + i], lp->src_expert[a + i], lp->src_w[a + i], lp->src_perm[a + i]}
                   : (contrib){lp->layer, lp->members[a + i], lp->merge_w[a + i], NULL};
    *out = c;
    return n;
}

/* Expert role R (M2D_X_*) of C in fp32, the intermediate dimension permuted (rows of gate/up and
 * their biases, columns of down; the down bias lives in the hidden dimension and is not permuted). */
static float *contrib_role(const m2d_model *t, const contrib *c, int r) {
    const m2d_tensor *ts = t->layers[c->layer].x[r][c->expert];
    float *w = m2d_tensor_f32(ts);
    if (!c->perm || r == M2D_X_EXP_DOWN_BIAS) return w;
    int rows = (int)ts->shape[0], cols = ts->ndim > 1 ? (int)ts->shape[1] : 1;
    float *p = m2d_malloc((size_t)rows * cols * sizeof *p);
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++)
            p[(size_t)i * cols + j] =
                r == M2D_X_EXP_DOWN ? w[(size_t)i * cols + c->perm[j]] : w[(size_t)c->perm[i] * cols + j];
    free(w);
    return p;
}

/* Group G's expert role R times SCALE: Σ_c w_c · π_c(W_c), fp64 accumulation, one rounding. */
static float *group_role(const m2d_model *t, const m2d_layer_plan *lp, int g, int r, double scale) {
    contrib *c;
    int n = group_contribs(lp, g, &c);
    size_t numel = (size_t)m2d_tensor_numel(t->layers[c[0].layer].x[r][c[0].expert]);
    float **w = m2d_malloc((size_t)n * sizeof *w), *out = m2d_malloc(numel * sizeof *out);
    double *wt = m2d_malloc((size_t)n * sizeof *wt);
    for (int i = 0; i < n; i++) w[i] = contrib_role(t, &c[i], r), wt[i] = c[i].w;
    m2d_merge_matrices((const float *const *)w, wt, n, numel, scale, t->layers[c[0].layer].x[r][c[0].expert]->dtype, out);
    for (int i = 0; i < n; i++) free(w[i]);
    free(w), free(wt), free(c);
    return out;
}

/* The teacher tensor group G's role R is, unchanged (one unpermuted contribution of weight 1), or NULL. */
static const m2d_tensor *unchanged_role(const m2d_model *t, const m2d_layer_plan *lp, int g, int r) {
    contrib *c;
    int n = group_contribs(lp, g, &c);
    const m2d_tensor *ts = n == 1 && c[0].w == 1 && !c[0].perm ? t->layers[c[0].layer].x[r][c[0].expert] : NULL;
    free(c);
    return ts;
}

/* A student that stores its dense FFN as one expert routed top-1 (OLMoE's) has a router of one row:
 * zeros (the softmax over one logit is 1 whatever its value). NULL for every other student. */
static const m2d_tensor *one_expert_router(student_owner *o, const m2d_arch *sa, int layer, m2d_dtype dt, int d) {
    if (!m2d_arch_has_tensor(sa, M2D_SCOPE_DENSE, M2D_T_ROUTER)) return NULL;
    float *zero = m2d_calloc((size_t)d, sizeof(float));
    const m2d_tensor *r = role_tensor(o, sa, M2D_SCOPE_DENSE, M2D_T_ROUTER, layer, 0, dt, 1, d, zero);
    free(zero);
    return r;
}

/* The dense FFN's biases, when the teacher's experts have them: gate/up merged like the weights
 * and concatenated per group; down merged, scaled by α_g and summed over the groups (group g adds
 * α_g (W_down^(g) h_g + b_down^(g))), in fp64 with one rounding. WIDTH: the dense FFN's. */
static int build_dense_biases(student_owner *o, const m2d_model *t, const m2d_layer_plan *lp, int width, m2d_layer *dst) {
    const m2d_layer *src = &t->layers[lp->layer];
    int d = t->cfg.hidden_size, de = t->cfg.moe_intermediate_size, G = lp->n_groups;
    const int xr[3] = {M2D_X_EXP_GATE_BIAS, M2D_X_EXP_UP_BIAS, M2D_X_EXP_DOWN_BIAS};
    const int roles[3] = {M2D_T_GATE_BIAS, M2D_T_UP_BIAS, M2D_T_DOWN_BIAS};
    for (int b = 0; b < 3; b++) {
        if (!src->x[xr[b]]) continue;
        int n = b == 2 ? d : width; /* a shared expert's part (after the groups') has no bias */
        double *acc = m2d_calloc((size_t)n, sizeof(double));
        for (int g = 0; g < G; g++) {
            contrib *c;
            int nc = group_contribs(lp, g, &c);
            for (int i = 0; i < nc; i++) {
                float *v = contrib_role(t, &c[i], xr[b]);
                double wi = c[i].w * (b == 2 ? lp->alpha[g] : 1.0);
                for (int j = 0; j < (b == 2 ? d : de); j++) acc[(b == 2 ? 0 : (size_t)g * de) + j] += wi * v[j];
                free(v);
            }
            free(c);
        }
        float *out = m2d_malloc((size_t)n * sizeof(float));
        for (int j = 0; j < n; j++) out[j] = m2d_round_for(acc[j], src->x[xr[b]][0]->dtype);
        dst->w[roles[b]] =
            role_tensor(o, o->m.arch, M2D_SCOPE_DENSE, roles[b], lp->layer, 0, src->x[xr[b]][0]->dtype, n, 0, out);
        free(acc);
        free(out);
        if (!dst->w[roles[b]]) return -1;
    }
    return 0;
}

/* The dense FFN of an MoE layer: the k merged groups (down projections scaled by alpha), then the
 * layer's shared experts copied with alpha = 1 (SPEC §4), concatenated. */
static int build_dense_layer(student_owner *o, const m2d_model *t, const m2d_layer_plan *lp, m2d_layer *dst) {
    const m2d_config *c = &t->cfg;
    const m2d_layer *src = &t->layers[lp->layer];
    int d = c->hidden_size, de = c->moe_intermediate_size, G = lp->n_groups, shared = src->shared_gate_proj != NULL;
    int nb = G + shared, *widths = m2d_malloc(sizeof(int) * (size_t)nb);
    m2d_dtype dt = src->exp_gate[0]->dtype;
    float **gs = m2d_malloc((size_t)nb * sizeof *gs), **us = m2d_malloc((size_t)nb * sizeof *us),
          **ds = m2d_malloc((size_t)nb * sizeof *ds);
    size_t W = 0;
    for (int g = 0; g < G; g++) {
        gs[g] = group_role(t, lp, g, M2D_X_EXP_GATE, 1.0);
        us[g] = group_role(t, lp, g, M2D_X_EXP_UP, 1.0);
        ds[g] = group_role(t, lp, g, M2D_X_EXP_DOWN, lp->alpha[g]);
        W += (size_t)(widths[g] = de);
    }
    if (shared) {
        gs[G] = m2d_tensor_f32(src->shared_gate_proj);
        us[G] = m2d_tensor_f32(src->shared_up_proj);
        ds[G] = m2d_tensor_f32(src->shared_down_proj);
        W += (size_t)(widths[G] = c->shared_expert_intermediate_size);
    }
    float *gate = m2d_malloc(W * d * sizeof(float)), *up = m2d_malloc(W * d * sizeof(float)),
          *down = m2d_malloc(W * d * sizeof(float));
    m2d_concat_ffn_blocks(nb, d, widths, (const float *const *)gs, (const float *const *)us, (const float *const *)ds,
                          gate, up, down);
    const m2d_arch *sa = o->m.arch; /* the student's names */
    dst->gate_proj = role_tensor(o, sa, M2D_SCOPE_DENSE, M2D_T_GATE, lp->layer, 0, dt, (int)W, d, gate);
    dst->up_proj = role_tensor(o, sa, M2D_SCOPE_DENSE, M2D_T_UP, lp->layer, 0, dt, (int)W, d, up);
    dst->down_proj = role_tensor(o, sa, M2D_SCOPE_DENSE, M2D_T_DOWN, lp->layer, 0, dt, d, (int)W, down);
    dst->router = one_expert_router(o, sa, lp->layer, src->router->dtype, d);
    dst->router_bias = NULL;
    for (int r = 0; r < M2D_X_COUNT; r++) dst->x[r] = NULL;
    dst->shared_gate_proj = dst->shared_up_proj = dst->shared_down_proj = dst->shared_expert_gate = NULL;
    for (int b = 0; b < nb; b++) { free(gs[b]); free(us[b]); free(ds[b]); }
    free(gs); free(us); free(ds); free(gate); free(up); free(down); free(widths);
    if (!dst->gate_proj || !dst->up_proj || !dst->down_proj) return -1;
    return build_dense_biases(o, t, lp, (int)W, dst);
}

/* Slot of each canonical member position in a shared-router layer: the rank of its expert id. */
static int *member_slots(const m2d_layer_plan *lp) {
    int *slot = m2d_malloc((size_t)lp->K * sizeof *slot);
    for (int i = 0; i < lp->K; i++) {
        slot[i] = 0;
        for (int j = 0; j < lp->K; j++) slot[i] += lp->members[j] < lp->members[i];
    }
    return slot;
}

/* Router rows (and bias entries, one "row" of width 1) of the --target moe student: each member's
 * own in its slot SLOT[i] (shared) or the merge-weighted average of the group's (average). */
static float *moe_router_rows(const m2d_tensor *tr, const m2d_layer_plan *lp, const int *slot, int X, int width) {
    float *router = m2d_tensor_f32(tr), *rows = m2d_calloc((size_t)X * width, sizeof(float));
    for (int g = 0; g < lp->n_groups; g++) {
        int first = lp->group_start[g], n = lp->group_start[g + 1] - first;
        const int *mem = lp->members + first;
        for (int i = 0; i < n && slot; i++)
            memcpy(rows + (size_t)slot[first + i] * width, router + (size_t)mem[i] * width, (size_t)width * sizeof(float));
        for (int j = 0; j < width && !slot; j++) {
            double acc = 0;
            for (int i = 0; i < n; i++) acc += lp->merge_w[first + i] * router[(size_t)mem[i] * width + j];
            rows[(size_t)g * width + j] = m2d_round_for(acc, tr->dtype);
        }
    }
    free(router);
    return rows;
}

/* Group G's expert role R into the slots SLOTS[0..n) of ARR: the first gets the tensor (the
 * teacher's own data when unchanged), the others alias it. */
static int fill_slots(student_owner *o, const m2d_model *t, const m2d_layer_plan *lp, int g, int r, const int *slots,
                      int n, const m2d_tensor **arr) {
    const int d = t->cfg.hidden_size, de = t->cfg.moe_intermediate_size;
    const int rows[M2D_X_COUNT] = {de, de, d, de, de, d}, cols[M2D_X_COUNT] = {d, d, de, 0, 0, 0};
    _Static_assert(M2D_X_COUNT == 6, "expert roles: shapes above");
    const m2d_tensor *first = unchanged_role(t, lp, g, r);
    for (int i = 0; i < n; i++) {
        char name[256];
        if (role_name(o->m.arch, M2D_SCOPE_EXPERT, r, lp->layer, slots[i], name, sizeof name)) return -1;
        if (first) {
            arr[slots[i]] = alias_tensor(o, name, first);
            continue;
        }
        float *merged = group_role(t, lp, g, r, 1.0);
        first = arr[slots[i]] = new_tensor(o, name, t->layers[lp->layer].x[r][0]->dtype, rows[r], cols[r], merged);
        free(merged);
    }
    return 0;
}

/* --target moe layer. Group g's expert goes to one slot (average) or to the slot of every member
 * (shared: slots in increasing teacher expert id, each keeping its router row). Every expert role
 * the teacher has (weights, and biases when present) is merged the same way. */
static int build_moe_layer(student_owner *o, const m2d_model *t, const m2d_convert_plan *plan,
                           const m2d_layer_plan *lp, m2d_layer *dst, int slot) {
    const m2d_layer *src = &t->layers[lp->layer];
    int d = t->cfg.hidden_size, G = lp->n_groups;
    int shared = plan->moe_router == M2D_MOE_ROUTER_SHARED, X = shared ? lp->K : G;
    const m2d_tensor **arr = m2d_calloc((size_t)M2D_X_COUNT * X, sizeof *arr);
    o->ptr_arrays[slot] = arr;
    for (int r = 0; r < M2D_X_COUNT; r++) dst->x[r] = src->x[r] ? arr + (size_t)r * X : NULL;
    int *mslot = shared ? member_slots(lp) : NULL, rc = 0;
    for (int g = 0; g < G && rc == 0; g++) {
        int first = lp->group_start[g], n = shared ? lp->group_start[g + 1] - first : 1;
        const int *slots = shared ? mslot + first : &g;
        for (int r = 0; r < M2D_X_COUNT && rc == 0; r++)
            if (src->x[r]) rc = fill_slots(o, t, lp, g, r, slots, n, arr + (size_t)r * X);
    }
    if (rc == 0) {
        float *rr = moe_router_rows(src->router, lp, mslot, X, d);
        dst->router = role_tensor(o, o->m.arch, M2D_SCOPE_MOE, M2D_T_ROUTER, lp->layer, 0, src->router->dtype, X, d, rr);
        free(rr);
        rc = dst->router ? 0 : -1;
    }
    if (rc == 0 && src->router_bias) {
        float *rb = moe_router_rows(src->router_bias, lp, mslot, X, 1);
        dst->router_bias = role_tensor(o, o->m.arch, M2D_SCOPE_MOE, M2D_T_ROUTER_BIAS, lp->layer, 0,
                                       src->router_bias->dtype, X, 0, rb);
        free(rb);
        rc = dst->router_bias ? 0 : -1;
    }
    free(mslot);
    return rc;
}

/* Dense teacher layer narrower than the student width: zero-pad (SPEC §4). */
static int pad_dense_layer(student_owner *o, const m2d_model *t, int l, int width, m2d_layer *dst) {
    const m2d_layer *src = &t->layers[l];
    int d = t->cfg.hidden_size, w0 = (int)src->gate_proj->shape[0];
    if (w0 == width) return 0;
    if (w0 > width)
        return m2d_err("convert: dense layer %d is wider (%d) than the student width %d (k*d_e + shared experts); the dense student "
                       "(%s) has one intermediate_size for all layers", l, w0, width, o->m.cfg.arch);
    float *g = m2d_calloc((size_t)width * d, sizeof(float)), *u = m2d_calloc((size_t)width * d, sizeof(float)),
          *dn = m2d_calloc((size_t)width * d, sizeof(float));
    m2d_to_f32(src->gate_proj->dtype, src->gate_proj->data, 0, (int64_t)w0 * d, g);
    m2d_to_f32(src->up_proj->dtype, src->up_proj->data, 0, (int64_t)w0 * d, u);
    float *row = m2d_malloc((size_t)w0 * sizeof(float));
    for (int r = 0; r < d; r++) {
        m2d_to_f32(src->down_proj->dtype, src->down_proj->data, (int64_t)r * w0, w0, row);
        memcpy(dn + (size_t)r * width, row, (size_t)w0 * sizeof(float));
    }
    const m2d_arch *sa = o->m.arch;
    dst->gate_proj = role_tensor(o, sa, M2D_SCOPE_DENSE, M2D_T_GATE, l, 0, src->gate_proj->dtype, width, d, g);
    dst->up_proj = role_tensor(o, sa, M2D_SCOPE_DENSE, M2D_T_UP, l, 0, src->up_proj->dtype, width, d, u);
    dst->down_proj = role_tensor(o, sa, M2D_SCOPE_DENSE, M2D_T_DOWN, l, 0, src->down_proj->dtype, d, width, dn);
    free(g); free(u); free(dn); free(row);
    return dst->gate_proj && dst->up_proj && dst->down_proj ? 0 : -1;
}

/* The dense student's FFN width: the k groups of d_e and the shared experts (SPEC §4: d_dense). */
static int student_width(const m2d_config *c, const m2d_convert_plan *plan) {
    return plan->n_groups * c->moe_intermediate_size + c->shared_expert_intermediate_size;
}

/* The student's config: the teacher adapter rewrites the teacher's config.json (m2d_arch_student_config)
 * and the one config reader parses it, so the in-memory student and the written config.json agree
 * by construction. The dense student must be the architecture the teacher adapter names. */
static int student_config(student_owner *o, const m2d_model *t, const m2d_convert_plan *plan) {
    const m2d_config *c = &t->cfg;
    m2d_student_shape sh = {.moe = plan->target == M2D_TARGET_MOE, .ffn_width = student_width(c, plan)};
    if (sh.moe) {
        sh.n_experts = m2d_convert_moe_experts(plan);
        sh.top_k = plan->top_k;
    }
    if (m2d_arch_student_config(t, &sh, &o->m.config_text) != 0) return -1;
    char *label = m2d_strfmt("%s (student config.json)", t->dir);
    int rc = m2d_config_parse(o->m.config_text, strlen(o->m.config_text), label, &o->m.cfg, &o->m.arch);
    const char *want = sh.moe ? t->arch->name : t->arch->student;
    if (rc == 0 && strcmp(o->m.arch->name, want) != 0)
        rc = m2d_err("%s: the student config names architecture %s, but %s converts to %s", label, o->m.arch->name,
                     t->arch->name, want);
    free(label);
    return rc;
}

static int build_layers(student_owner *o, const m2d_model *t, const m2d_convert_plan *plan) {
    const m2d_config *c = &t->cfg;
    int width = student_width(c, plan), rc = 0;
    for (int l = 0, i = 0; l < c->num_hidden_layers && rc == 0; l++) {
        if (c->layer_is_moe[l]) {
            const m2d_layer_plan *lp = &plan->layers[i];
            if (lp->layer != l) rc = m2d_err("convert: plan layer %d does not match MoE layer %d", lp->layer, l);
            else if (plan->target == M2D_TARGET_DENSE) rc = build_dense_layer(o, t, lp, &o->m.layers[l]);
            else rc = build_moe_layer(o, t, plan, lp, &o->m.layers[l], i);
            i++;
        } else if (plan->target == M2D_TARGET_DENSE) {
            rc = pad_dense_layer(o, t, l, width, &o->m.layers[l]);
        }
    }
    return rc;
}

/* ---- random baselines (convert.h) ---- */
typedef enum { INIT_NORMAL, INIT_ONES, INIT_ZEROS } init_kind;

/* A tensor like LIKE (name, dtype, shape) filled as KIND says, from the stream of its name. */
static const m2d_tensor *random_tensor(student_owner *o, const m2d_tensor *like, const m2d_convert_plan *p,
                                       init_kind kind) {
    int64_t rows = like->shape[0], cols = like->ndim == 2 ? like->shape[1] : 0, n = rows * (cols ? cols : 1);
    float *v = m2d_malloc((size_t)(n ? n : 1) * sizeof *v);
    uint64_t st = p->baseline_seed ^ m2d_fnv1a64(like->name);
    for (int64_t i = 0; i < n; i++)
        v[i] = kind == INIT_NORMAL ? (float)(p->init_std * m2d_rand_normal(&st)) : kind == INIT_ONES ? 1.0f : 0.0f;
    const m2d_tensor *t = new_tensor(o, like->name, like->dtype, (int)rows, (int)cols, v);
    free(v);
    return t;
}

/* How Hugging Face initialises a tensor of layer role R: RMSNorm weights 1, biases (and other
 * vectors) 0, matrices and GPT-OSS's attention sinks normal(0, initializer_range). */
static init_kind role_init(int r, const m2d_tensor *x) {
    if (strstr(m2d_layer_role_name(r), "norm")) return INIT_ONES;
    if (r == M2D_T_SINKS) return INIT_NORMAL; /* GptOssPreTrainedModel._init_weights */
    return x->ndim == 1 ? INIT_ZEROS : INIT_NORMAL;
}

/* random-init: each stored tensor the architecture's post_bind claimed outside the FFN (DeepSeek's
 * o_proj, bound padded) drawn at its stored name and shape, and the role made from it remade from
 * the draw, so that the checkpoint written (its stored tensors: write.c) and the student in memory
 * are one model with nothing of the teacher's. */
static void randomize_claimed(student_owner *o, const m2d_model *t, const m2d_convert_plan *p) {
    m2d_model *m = &o->m;
    if (t->n_claimed == 0) return;
    o->claimed = m2d_malloc((size_t)t->n_claimed * sizeof *o->claimed);
    memcpy(o->claimed, t->claimed, (size_t)t->n_claimed * sizeof *o->claimed);
    m->claimed = o->claimed;
    for (int i = 0; i < t->n_claimed; i++) {
        struct m2d_claim *c = &o->claimed[i];
        if (c->part == M2D_PART_FFN) continue; /* the FFN is the student's own (write_ffn) */
        int role = t->arch->rederive ? t->arch->rederive(t, c->layer, c->t, NULL, NULL) : -1;
        const m2d_tensor *draw = random_tensor(o, c->t, p, role >= 0 ? role_init(role, c->t) : INIT_NORMAL);
        if (role >= 0) {
            const m2d_tensor *like = m->layers[c->layer].w[role];
            int64_t n = m2d_tensor_numel(like);
            float *zero = m2d_calloc((size_t)(n ? n : 1), sizeof *zero);
            m2d_tensor *made = new_tensor(o, like->name, like->dtype, (int)like->shape[0],
                                          like->ndim == 2 ? (int)like->shape[1] : 0, zero);
            free(zero);
            t->arch->rederive(t, c->layer, c->t, draw, (void *)made->data);
            m->layers[c->layer].w[role] = made;
        }
        c->t = draw;
    }
}

/* random-ffn: every layer's dense FFN tensors (the one-expert router of a dense layer, where the
 * architecture has one, is kept: its softmax over one expert is 1 whatever it holds);
 * random-init: every tensor of the student. */
static void randomize_student(student_owner *o, const m2d_model *t, const m2d_convert_plan *p) {
    m2d_model *m = &o->m;
    int all = p->baseline == M2D_BASELINE_RANDOM_INIT;
    for (int l = 0; l < m->cfg.num_hidden_layers; l++)
        for (int r = 0; r < M2D_T_COUNT; r++) {
            const m2d_tensor *x = m->layers[l].w[r];
            if (x && r != M2D_T_ROUTER && (all || m2d_layer_role_is_ffn(r)))
                m->layers[l].w[r] = random_tensor(o, x, p, role_init(r, x));
        }
    if (!all) return;
    int tied = m->lm_head == m->embed;
    m->embed = random_tensor(o, m->embed, p, INIT_NORMAL);
    m->final_norm = random_tensor(o, m->final_norm, p, INIT_ONES);
    m->lm_head = tied ? m->embed : random_tensor(o, m->lm_head, p, INIT_NORMAL);
    if (m->lm_head_stored) m->lm_head_stored = m->lm_head;
    randomize_claimed(o, t, p);
}

/* OUT: the student's hash of the teacher's TEACHER_HASH (weights or model) and the plan's fingerprint */
static void student_hash(const char *teacher_hash, const char *fingerprint, char out[65]) {
    char *id = m2d_strfmt("student %s %s", teacher_hash, fingerprint);
    m2d_sha256_hex(id, strlen(id), out);
    free(id);
}

int m2d_convert_build(const m2d_model *t, const m2d_convert_plan *plan, m2d_model **student) {
    const m2d_config *c = &t->cfg;
    int L = c->num_hidden_layers, n_moe = 0;
    for (int l = 0; l < L; l++) n_moe += c->layer_is_moe[l] ? 1 : 0;
    if (plan->n_layers != n_moe || strcmp(plan->teacher_hash, t->model_hash))
        return m2d_err("convert: the plan was made for another model (%.12s..., this is %.12s...)", plan->teacher_hash,
                       t->model_hash);
    student_owner *o = m2d_calloc(1, sizeof *o);
    m2d_model *m = &o->m;
    *m = *t; /* shares st, embeddings, norms, head; dir, config and layers are the student's own */
    m->dir = m2d_strfmt("%s (in-memory student %.12s)", t->dir, plan->fingerprint);
    memset(&m->cfg, 0, sizeof m->cfg);
    m->config_text = NULL;
    m->layers = m2d_malloc((size_t)L * sizeof *m->layers);
    memcpy(m->layers, t->layers, (size_t)L * sizeof *m->layers);
    o->ptr_arrays = m2d_calloc((size_t)(n_moe ? n_moe : 1), sizeof *o->ptr_arrays);
    o->n_ptr_arrays = n_moe;
    int rc = student_config(o, t, plan);
    if (rc == 0) rc = build_layers(o, t, plan);
    if (rc == 0 && plan->baseline) randomize_student(o, t, plan);
    /* identity of an in-memory student: derived from the teacher and the plan (not a hash of bytes) */
    student_hash(t->weights_hash, plan->fingerprint, m->weights_hash);
    student_hash(t->model_hash, plan->fingerprint, m->model_hash);
    if (rc) {
        m2d_convert_student_free(m);
        return -1;
    }
    *student = m;
    return 0;
}

void m2d_convert_student_free(m2d_model *student) {
    if (!student) return;
    student_owner *o = (student_owner *)student;
    for (int i = 0; i < o->n_owned; i++) {
        free((void *)o->owned[i]->name);
        if (o->owns_data[i]) free((void *)o->owned[i]->data);
        free(o->owned[i]);
    }
    free(o->owned);
    free(o->owns_data);
    for (int i = 0; i < o->n_ptr_arrays; i++) free(o->ptr_arrays[i]);
    free(o->ptr_arrays);
    free(o->claimed);
    free(o->m.layers);
    m2d_config_free(&o->m.cfg);
    free(o->m.config_text);
    free(o->m.dir);
    free(o);
}
