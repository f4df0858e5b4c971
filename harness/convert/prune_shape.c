/* convert/prune_shape — a pruned student's target shape: spec parsing and formatting, the check
 * against a teacher, the parameter count (prune.h). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "calib/importance.h"
#include "convert/prune.h"

/* a positive decimal integer of P (advancing *END); -1 when there is none */
static long parse_pos(const char *p, const char **end) {
    if (*p < '0' || *p > '9') return -1;
    errno = 0;
    char *e;
    long v = strtol(p, &e, 10);
    *end = e;
    return errno || v < 1 || v > INT_MAX / 2 ? -1 : v;
}

/* one part "L4", "L4n", "H192", "F576", "A6/2" or "A6" of length N at P */
static int parse_part(const char *spec, const char *p, size_t n, m2d_prune_shape *s, unsigned *seen) {
    char part[64];
    snprintf(part, sizeof part, "%.*s", (int)M2D_MIN(n, sizeof part - 1), p);
    const char *keys = "LHFA", *k = *p ? strchr(keys, *p) : NULL;
    if (!k || n < 2)
        return m2d_err("prune: shape '%s': part '%s': expected L<layers>, H<hidden>, F<ffn> or A<heads>/<kv heads>",
                       spec, part);
    unsigned bit = 1u << (k - keys);
    if (*seen & bit) return m2d_err("prune: shape '%s': part '%c' given twice", spec, *p);
    *seen |= bit;
    const char *e, *stop = p + n;
    long v = parse_pos(p + 1, &e), kv = 0;
    if (v < 0) return m2d_err("prune: shape '%s': part '%s': expected a positive integer after '%c'", spec, part, *p);
    if (*p == 'L' && e < stop && *e == 'n') s->layers_by_nll = 1, e++;
    if (*p == 'A' && e < stop && *e == '/' && (kv = parse_pos(e + 1, &e)) < 0)
        return m2d_err("prune: shape '%s': part '%s': expected A<heads>/<kv heads> (positive integers)", spec, part);
    if (e != stop) return m2d_err("prune: shape '%s': part '%s': unexpected '%.*s'", spec, part, (int)(stop - e), e);
    if (*p == 'L') s->layers = (int)v;
    if (*p == 'H') s->hidden = (int)v;
    if (*p == 'F') s->ffn = (int)v;
    if (*p == 'A') s->heads = (int)v, s->kv_heads = (int)kv;
    return 0;
}

int m2d_prune_shape_parse(const char *spec, m2d_prune_shape *out) {
    memset(out, 0, sizeof *out);
    if (!spec || !*spec) return m2d_err("prune: shape '': expected parts like L4-H192-F576-A6/2");
    unsigned seen = 0;
    for (const char *p = spec;;) {
        const char *dash = strchr(p, '-');
        size_t n = dash ? (size_t)(dash - p) : strlen(p);
        if (parse_part(spec, p, n, out, &seen)) return -1;
        if (!dash) return 0;
        p = dash + 1;
    }
}

/* S with every part resolved against T */
static m2d_prune_shape resolved(const m2d_config *t, const m2d_prune_shape *s) {
    m2d_prune_shape r = *s;
    if (!r.layers) r.layers = t->num_hidden_layers;
    if (!r.hidden) r.hidden = t->hidden_size;
    if (!r.ffn) r.ffn = t->intermediate_size;
    if (!r.heads) r.heads = t->num_attention_heads;
    if (!r.kv_heads) r.kv_heads = t->num_key_value_heads;
    return r;
}

void m2d_prune_shape_format(const m2d_config *t, const m2d_prune_shape *s, char *buf, size_t n) {
    m2d_prune_shape r = resolved(t, s);
    snprintf(buf, n, "L%d%s-H%d-F%d-A%d/%d", r.layers, r.layers_by_nll ? "n" : "", r.hidden, r.ffn, r.heads,
             r.kv_heads);
}

/* PART's value V within [1, MAX] */
static int check_part(const char *part, int v, int max) {
    if (v < 1 || v > max) return m2d_err("prune: shape part %s = %d: outside [1, %d] (the teacher's)", part, v, max);
    return 0;
}

int m2d_prune_shape_check(const m2d_config *t, const m2d_prune_shape *s) {
    if (m2d_importance_supported(t, NULL)) return -1;
    m2d_prune_shape r = resolved(t, s);
    if (check_part("L (layers)", r.layers, t->num_hidden_layers) || check_part("H (hidden)", r.hidden, t->hidden_size) ||
        check_part("F (ffn)", r.ffn, t->intermediate_size) ||
        check_part("A (query heads)", r.heads, t->num_attention_heads) ||
        check_part("A (kv heads)", r.kv_heads, t->num_key_value_heads))
        return -1;
    if (r.heads % r.kv_heads)
        return m2d_err("prune: shape part A%d/%d: query heads must be a multiple of the kv heads", r.heads, r.kv_heads);
    int group = t->num_attention_heads / t->num_key_value_heads;
    if (r.heads / r.kv_heads > group)
        return m2d_err("prune: shape part A%d/%d: %d query heads per kv group, the teacher has %d", r.heads,
                       r.kv_heads, r.heads / r.kv_heads, group);
    return 0;
}

int64_t m2d_prune_params(const m2d_config *t, const m2d_prune_shape *s) {
    m2d_prune_shape r = resolved(t, s);
    m2d_config c = *t; /* shallow: layer_is_moe (all false) covers the first r.layers layers */
    c.num_hidden_layers = r.layers, c.hidden_size = r.hidden, c.intermediate_size = r.ffn;
    c.num_attention_heads = r.heads, c.num_key_value_heads = r.kv_heads;
    return m2d_model_param_counts(&c).total;
}
