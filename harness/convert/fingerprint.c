/* convert/fingerprint — a plan's identity (see fingerprint.h). */
#include "convert/fingerprint.h"

#include <stdarg.h>
#include <stdio.h>

#include "base/util.h"

/* 1 when every group of every layer is one expert of its own layer: then the "average" router (the
 * members' rows averaged) is the "shared" one (each member's own row), the same student */
static int singleton_groups(const m2d_convert_plan *p) {
    for (int i = 0; i < p->n_layers; i++) {
        const m2d_layer_plan *l = &p->layers[i];
        if (l->src_start) return 0;
        for (int g = 0; g < l->n_groups; g++)
            if (l->group_start[g + 1] - l->group_start[g] != 1) return 0;
    }
    return 1;
}

static const char *target_name(const m2d_convert_plan *p) {
    if (p->target == M2D_TARGET_DENSE) return "dense";
    return p->moe_router == M2D_MOE_ROUTER_SHARED || singleton_groups(p) ? "moe" : "moe-average";
}

static void sha_str(m2d_sha256 *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sha_str(m2d_sha256 *s, const char *fmt, ...) {
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    m2d_sha256_update(s, buf, (size_t)M2D_MIN(n, (int)sizeof buf - 1));
}

/* " src L.E:w[:perm sha]" of source J */
static void fingerprint_source(m2d_sha256 *s, const m2d_layer_plan *l, int j) {
    sha_str(s, " src %d.%d:%a", l->src_layer[j], l->src_expert[j], l->src_w[j]);
    if (l->src_perm[j]) {
        char h[65];
        m2d_sha256_hex(l->src_perm[j], (size_t)l->d_e * sizeof(int), h);
        sha_str(s, ":perm-%.16s", h);
    }
}

void m2d_convert_fingerprint(const m2d_convert_plan *p, char out[65]) {
    m2d_sha256 s;
    m2d_sha256_init(&s);
    sha_str(&s, "moe2dense-student-v1\nteacher %s\ntarget %s\n", p->teacher_hash, target_name(p));
    if (p->target == M2D_TARGET_MOE) sha_str(&s, "top_k %d\n", p->top_k); /* part of the student's config */
    if (p->baseline) /* the weights depend on kind, seed, std and the width only, not on the plan */
        sha_str(&s, "baseline %s seed %llu std %a groups %d\n", m2d_baseline_name(p->baseline),
                (unsigned long long)p->baseline_seed, p->init_std, p->n_groups);
    for (int i = 0; i < p->n_layers && p->baseline; i++) sha_str(&s, "layer %d\n", p->layers[i].layer);
    for (int i = 0; i < p->n_layers && !p->baseline; i++) {
        const m2d_layer_plan *l = &p->layers[i];
        sha_str(&s, "layer %d groups %d\n", l->layer, l->n_groups);
        for (int g = 0; g < l->n_groups; g++) {
            sha_str(&s, "group alpha=%a", l->alpha[g]);
            for (int j = l->group_start[g]; j < l->group_start[g + 1]; j++)
                sha_str(&s, " %d:%a", l->members[j], l->merge_w[j]);
            for (int j = l->src_start ? l->src_start[g] : 0; l->src_start && j < l->src_start[g + 1]; j++)
                fingerprint_source(&s, l, j);
            sha_str(&s, "\n");
        }
    }
    uint8_t d[32];
    m2d_sha256_final(&s, d);
    m2d_hex(d, 32, out);
}
