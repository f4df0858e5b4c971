/* backend — the table of registered backends (see backend.h). */
#include "engine/backend.h"

#include <stddef.h>
#include <string.h>

#include "base/util.h"

#define MAX_BACKENDS 8
static const void *backend_items[MAX_BACKENDS];
static m2d_name_table backends = {backend_items, 0, MAX_BACKENDS, offsetof(m2d_backend_kind, name),
                                  "too many backends (raise MAX_BACKENDS)"};

void m2d_backend_register(const m2d_backend_kind *k) { m2d_name_table_add(&backends, k); }
int m2d_backend_count(void) { return backends.n; }
const m2d_backend_kind *m2d_backend_kind_at(int i) { return backends.items[i]; }

const char *m2d_backend_list(void) {
    static char buf[256];
    return m2d_name_table_list(&backends, buf, sizeof buf);
}

int m2d_backend_new(const char *name, const m2d_backend_opts *o, m2d_backend **out) {
    *out = NULL;
    const m2d_backend_kind *k = m2d_name_table_find(&backends, name ? name : "");
    if (!k) return m2d_err("backend '%s': unknown (available: %s)", name ? name : "", m2d_backend_list());
    m2d_backend_opts dflt = {0};
    return k->create(o ? o : &dflt, out);
}

void m2d_backend_free(m2d_backend *be) {
    if (be) be->ops->destroy(be);
}

const char *m2d_precision_name(m2d_precision p) {
    return p == M2D_PREC_FP32 ? "fp32" : p == M2D_PREC_BF16 ? "bf16" : p == M2D_PREC_AUTO ? "auto" : "?";
}

int m2d_precision_parse(const char *s, const char *what, m2d_precision *out) {
    for (int p = 0; s && p < M2D_PREC_COUNT; p++)
        if (strcmp(s, m2d_precision_name((m2d_precision)p)) == 0) {
            *out = (m2d_precision)p;
            return 0;
        }
    return m2d_err("%s: '%s' is not a precision (auto, fp32, bf16)", what, s ? s : "(null)");
}
