/* backend — the table of registered backends (see backend.h). */
#include "engine/backend.h"

#include <stddef.h>
#include <stdlib.h>
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

/* the registered kind SPEC ("name" or "name:N") names, or NULL */
static const m2d_backend_kind *kind_of(const char *spec) {
    char name[64];
    size_t len = strcspn(spec, ":");
    if (len >= sizeof name) return NULL;
    memcpy(name, spec, len);
    name[len] = 0;
    return m2d_name_table_find(&backends, name);
}

/* SPEC = "name" or "name:N": the kind and the device index (-1 + m2d_err naming WHAT if bad) */
static const m2d_backend_kind *parse_spec(const char *spec, const char *what, int *device) {
    const char *colon = strchr(spec, ':');
    *device = -1;
    const m2d_backend_kind *k = kind_of(spec);
    if (!k) {
        int cuda = strncmp(spec, "cuda", 4) == 0 && (spec[4] == 0 || spec[4] == ':');
        m2d_err("%s '%s': unknown device (this build has: %s%s)", what, spec, m2d_backend_list(),
                cuda ? "; cuda needs a build with `make CUDA=1`" : "");
        return NULL;
    }
    if (!colon) return k;
    char *end;
    long n = strtol(colon + 1, &end, 10);
    if (!k->has_devices || colon[1] < '0' || colon[1] > '9' || *end || n > 1 << 20) {
        m2d_err("%s '%s': %s", what, spec,
                k->has_devices ? "expected a device index after ':' (e.g. cuda:0)" : "this backend has no device index");
        return NULL;
    }
    *device = (int)n;
    return k;
}

int m2d_backend_spec_has_devices(const char *spec) {
    const m2d_backend_kind *k = spec ? kind_of(spec) : NULL;
    return k && k->has_devices;
}

int m2d_device_check(const char *spec, const char *what) {
    int dev;
    return parse_spec(spec ? spec : "", what, &dev) ? 0 : -1;
}

int m2d_backend_new(const char *name, const m2d_backend_opts *o, m2d_backend **out) {
    *out = NULL;
    int dev;
    const m2d_backend_kind *k = parse_spec(name ? name : "", "backend", &dev);
    if (!k) return -1;
    m2d_backend_opts opts = {0};
    if (o) opts = *o;
    if (dev >= 0) opts.device = dev;
    return k->create(&opts, out);
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

const char *m2d_cap_name(m2d_cap c) {
    static const char *names[] = {
#define M2D_CAP_NAME(id, name) name,
        M2D_CAPS(M2D_CAP_NAME)
#undef M2D_CAP_NAME
    };
    return (unsigned)c < M2D_CAP_COUNT ? names[c] : "?";
}

int m2d_backend_missing(const m2d_backend *be, uint64_t caps) {
    for (int c = 0; c < M2D_CAP_COUNT; c++)
        if ((caps & M2D_CAP(c)) && !m2d_backend_supports(be, (m2d_cap)c)) return c;
    return -1;
}
