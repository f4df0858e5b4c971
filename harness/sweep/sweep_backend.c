/* sweep_backend — the table of sweep backends by name, and what the runner derives from a backend. */
#include "sweep/sweep_backend.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

#define MAX_SWEEP_BACKENDS 16
static const void *backend_items[MAX_SWEEP_BACKENDS];
static m2d_name_table backends = {backend_items, 0, MAX_SWEEP_BACKENDS, offsetof(m2d_sweep_backend, name),
                                  "too many sweep backends (raise MAX_SWEEP_BACKENDS)"};

void m2d_sweep_backend_register(const m2d_sweep_backend *template_) {
    if (!template_->name || !template_->prepare || !template_->build || !template_->evaluate ||
        !template_->free_student || !template_->open != !template_->destroy) {
        fprintf(stderr, "moe2dense: sweep backend '%s' lacks a required hook\n",
                template_->name ? template_->name : "?");
        abort();
    }
    m2d_name_table_add(&backends, template_);
}

const m2d_sweep_backend *m2d_sweep_backend_find(const char *name) {
    return name ? m2d_name_table_find(&backends, name) : NULL;
}

char *m2d_sweep_backend_names(void) {
    char *s = m2d_strdup("");
    for (int i = 0; i < backends.n; i++) {
        const m2d_sweep_backend *d = backends.items[i];
        char *next = m2d_strfmt("%s%s%s", s, i ? ", " : "", d->name);
        free(s);
        s = next;
    }
    return s;
}

int m2d_sweep_backend_make(const m2d_experiment *x, m2d_sweep_backend *b) {
    memset(b, 0, sizeof *b);
    const m2d_sweep_backend *d = m2d_sweep_backend_find(x->backend);
    if (!d) {
        char *names = m2d_sweep_backend_names();
        m2d_err("%s: experiment '%s': unknown sweep backend '%s' (registered: %s)", x->file, x->name, x->backend,
                names);
        free(names);
        return -1;
    }
    *b = *d;
    b->x = x;
    if (!d->open) return 0;
    b->self = d->open(x);
    return b->self ? 0 : -1;
}

void m2d_sweep_backend_close(m2d_sweep_backend *b) {
    if (b->destroy && b->self) b->destroy(b);
    b->self = NULL;
}

int m2d_sweep_count_distinct(m2d_sweep_backend *b, const m2d_experiment *x, const int *idx, int n) {
    if (!b->plan_fingerprint) return -1;
    char(*fps)[65] = m2d_malloc((size_t)(n + 1) * sizeof *fps);
    int distinct = 0;
    for (int i = 0; i < n && distinct >= 0; i++) {
        char fp[65];
        int rc = b->plan_fingerprint(b, x, &x->configs[idx[i]], fp);
        if (rc < 0) distinct = -1;
        if (rc != 0) continue; /* no student (fails at run time too), or unknown */
        int seen = 0;
        for (int j = 0; j < distinct && !seen; j++) seen = strcmp(fps[j], fp) == 0;
        if (!seen) memcpy(fps[distinct++], fp, 65);
    }
    free(fps);
    return distinct;
}
