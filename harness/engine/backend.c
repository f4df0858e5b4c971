/* backend — the table of registered backends (see backend.h). */
#include "engine/backend.h"

#include <stddef.h>

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
