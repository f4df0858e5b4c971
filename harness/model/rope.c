/* rope — config.json's rotary parameters and the frequencies transformers derives from them. */
#include "model/rope.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "io/st.h"
#include "model/model.h"

const char *m2d_rope_scaling_name(m2d_rope_scaling_kind k) {
    return k == M2D_ROPE_SCALING_LINEAR ? "linear" : k == M2D_ROPE_SCALING_YARN ? "yarn" : "default";
}

/* Keys each rope type reads (transformers' _validate_<type>_rope_parameters); "type" is the old
 * spelling of "rope_type". partial_rotary_factor is accepted only as 1 (checked separately). */
static const char *const DEFAULT_KEYS[] = {"rope_type", "type", "rope_theta", "partial_rotary_factor", NULL};
static const char *const LINEAR_KEYS[] = {"rope_type", "type", "rope_theta", "partial_rotary_factor", "factor", NULL};
static const char *const YARN_KEYS[] = {"rope_type", "type", "rope_theta", "partial_rotary_factor", "factor",
                                        "original_max_position_embeddings", "attention_factor", "beta_fast",
                                        "beta_slow", "mscale", "mscale_all_dim", "truncate", NULL};

static int known_key(const char *const *keys, const char *k) {
    for (; *keys; keys++)
        if (strcmp(*keys, k) == 0) return 1;
    return 0;
}

int m2d_rope_scaling_given(const void *json) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(json, "rope_scaling");
    return v && !cJSON_IsNull(v) && !(cJSON_IsObject(v) && !v->child);
}

/* the scaling object: rope_scaling (Hub) wins over rope_parameters (transformers >= 5), as in
 * transformers' convert_rope_params_to_dict (`rope_scaling or rope_parameters`: an empty
 * rope_scaling does not count); NULL when neither is an object */
static int scaling_object(const cJSON *root, const char *path, const cJSON **obj, const char **name) {
    const char *names[2] = {"rope_scaling", "rope_parameters"};
    *obj = NULL;
    for (int i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, names[i]);
        if (!v || cJSON_IsNull(v) || (i == 0 && !m2d_rope_scaling_given(root))) continue;
        if (!cJSON_IsObject(v)) return m2d_err1("%s: field '%s': must be an object or null", path, names[i]);
        if (!*obj) *obj = v, *name = names[i];
    }
    return 0;
}

/* rope_type, or its old spelling type (both present: must agree); SUB names the object */
static int rope_type(const cJSON *obj, const char *sub, const char **type) {
    const char *a = "default", *b = NULL;
    if (m2d_cfg_str(obj, sub, "type", 0, NULL, &b) != 0 || m2d_cfg_str(obj, sub, "rope_type", 0, b ? b : "default", &a) != 0)
        return -1;
    if (b && strcmp(a, b) != 0) return m2d_err1("%s: field 'rope_type': '%s' and type '%s' disagree", sub, a, b);
    *type = a;
    return 0;
}

/* theta inside the object and at the top level: either, or both when equal */
static int rope_theta(const cJSON *root, const cJSON *obj, const char *path, double dflt, double *theta) {
    int in_obj = obj && m2d_cfg_has(obj, "rope_theta"), top = m2d_cfg_has(root, "rope_theta");
    double a = dflt, b = dflt;
    if (top && m2d_cfg_double(root, path, "rope_theta", 0, dflt, &a) != 0) return -1;
    if (in_obj && m2d_cfg_double(obj, path, "rope_theta", 0, dflt, &b) != 0) return -1;
    if (top && in_obj && a != b)
        return m2d_err1("%s: field 'rope_theta': %g at the top level, %g in the rope parameters", path, a, b);
    *theta = in_obj ? b : a;
    if (!(*theta > 0) || !isfinite(*theta)) return m2d_err1("%s: field 'rope_theta': must be positive", path);
    return 0;
}

/* The range a scaling factor may have: positive, and neither so small nor so large that the
 * frequencies or the attention scale overflow to inf/NaN (1e-310, 1e308). Real checkpoints use
 * factors of 1 to a few hundred, attention factors near 1. */
#define SCALE_MIN 1e-3
#define SCALE_MAX 1e6

static int positive(const cJSON *obj, const char *sub, const char *key, double *out) {
    if (m2d_cfg_double(obj, sub, key, 0, 0, out) != 0) return -1;
    if (!m2d_cfg_has(obj, key)) return 0;
    if (!(*out > 0)) return m2d_err1("%s: field '%s': must be positive", sub, key);
    if (!(*out >= SCALE_MIN && *out <= SCALE_MAX))
        return m2d_err1("%s: field '%s': %g is out of range [%g, %g]", sub, key, *out, SCALE_MIN, SCALE_MAX);
    return 0;
}

/* yarn's keys; factor may be null (then max_position_embeddings / original) */
static int parse_yarn(const cJSON *root, const cJSON *obj, const char *path, const char *sub, int max_pos,
                      m2d_rope_scaling *s) {
    if (!cJSON_GetObjectItemCaseSensitive(obj, "factor"))
        return m2d_err1("%s: field 'factor': missing (required for yarn)", sub);
    /* transformers: a top-level original_max_position_embeddings takes priority (Phi-3 style) */
    int top = m2d_cfg_has(root, "original_max_position_embeddings");
    if (m2d_cfg_pos_int(top ? root : obj, top ? path : sub, "original_max_position_embeddings", 0, max_pos,
                        &s->original_max_position_embeddings) != 0 ||
        positive(obj, sub, "factor", &s->factor) != 0 || positive(obj, sub, "attention_factor", &s->attention_factor) != 0 ||
        m2d_cfg_double(obj, sub, "beta_fast", 0, 0, &s->beta_fast) != 0 ||
        m2d_cfg_double(obj, sub, "beta_slow", 0, 0, &s->beta_slow) != 0 ||
        m2d_cfg_double(obj, sub, "mscale", 0, 0, &s->mscale) != 0 ||
        m2d_cfg_double(obj, sub, "mscale_all_dim", 0, 0, &s->mscale_all_dim) != 0 ||
        m2d_cfg_bool(obj, sub, "truncate", 0, true, &s->truncate) != 0)
        return -1;
    if (s->factor == 0) s->factor = (double)max_pos / s->original_max_position_embeddings;
    return 0;
}

/* the scaling keys of OBJ (named SUB in errors) for rope type TYPE */
static int parse_scaling(const cJSON *root, const cJSON *obj, const char *path, const char *sub, const char *type,
                         int max_pos, m2d_rope_scaling *s) {
    const char *const *keys = DEFAULT_KEYS;
    if (strcmp(type, "linear") == 0) s->kind = M2D_ROPE_SCALING_LINEAR, keys = LINEAR_KEYS;
    else if (strcmp(type, "yarn") == 0) s->kind = M2D_ROPE_SCALING_YARN, keys = YARN_KEYS;
    else if (strcmp(type, "default") != 0)
        return m2d_err1("%s: field 'rope_type': '%s' is not supported (default, linear, yarn)", sub, type);
    for (const cJSON *k = obj->child; k; k = k->next)
        if (!known_key(keys, k->string))
            return m2d_err1("%s: field '%s': not supported for rope_type '%s'", sub, k->string, type);
    double prf = 1;
    if (m2d_cfg_double(obj, sub, "partial_rotary_factor", 0, 1, &prf) != 0) return -1;
    if (prf != 1) return m2d_err1("%s: field 'partial_rotary_factor': only 1 is supported", sub);
    if (s->kind == M2D_ROPE_SCALING_LINEAR) {
        if (positive(obj, sub, "factor", &s->factor) != 0) return -1;
        if (s->factor == 0) return m2d_err1("%s: field 'factor': missing (required for linear)", sub);
        return 0;
    }
    return s->kind == M2D_ROPE_SCALING_YARN ? parse_yarn(root, obj, path, sub, max_pos, s) : 0;
}

int m2d_rope_parse(const void *json, const char *path, double default_theta, int max_pos, double *theta,
                   m2d_rope_scaling *s) {
    const cJSON *root = json, *obj;
    const char *name = "rope_parameters", *type = "default";
    memset(s, 0, sizeof *s);
    if (scaling_object(root, path, &obj, &name) != 0) return -1;
    if (!obj) return rope_theta(root, NULL, path, default_theta, theta);
    char *sub = m2d_strfmt("%s: %s", path, name);
    int rc = rope_type(obj, sub, &type) != 0 || rope_theta(root, obj, path, default_theta, theta) != 0 ||
                     parse_scaling(root, obj, path, sub, type, max_pos, s) != 0
                 ? -1 : 0;
    free(sub);
    return rc;
}

/* transformers' get_mscale */
static double yarn_get_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * log(scale) + 1.0; }

/* the dimension whose wavelength makes NUM_ROTATIONS turns over the original context */
static double correction_dim(double num_rotations, int dim, double base, int max_pos) {
    return dim * log(max_pos / (num_rotations * 2 * M_PI)) / (2 * log(base));
}

static void yarn_inv_freq(const m2d_rope_scaling *s, double theta, int dim, double *inv_freq) {
    double beta_fast = s->beta_fast != 0 ? s->beta_fast : 32, beta_slow = s->beta_slow != 0 ? s->beta_slow : 1;
    double low = correction_dim(beta_fast, dim, theta, s->original_max_position_embeddings);
    double high = correction_dim(beta_slow, dim, theta, s->original_max_position_embeddings);
    if (s->truncate) low = floor(low), high = ceil(high);
    low = fmax(low, 0), high = fmin(high, dim - 1);
    if (low == high) high += 0.001; /* transformers: "prevent singularity" */
    for (int i = 0; i < dim / 2; i++) {
        double pos_freq = pow(theta, 2.0 * i / dim);
        double ramp = fmin(fmax((i - low) / (high - low), 0), 1); /* 0: extrapolate, 1: interpolate */
        inv_freq[i] = 1 / (s->factor * pos_freq) * ramp + 1 / pos_freq * (1 - ramp);
    }
}

void m2d_rope_inv_freq(const m2d_rope_scaling *s, double theta, int dim, double *inv_freq) {
    if (s->kind == M2D_ROPE_SCALING_YARN) {
        yarn_inv_freq(s, theta, dim, inv_freq);
        return;
    }
    double div = s->kind == M2D_ROPE_SCALING_LINEAR ? s->factor : 1;
    for (int i = 0; i < dim / 2; i++) inv_freq[i] = pow(theta, -2.0 * i / dim) / div;
}

double m2d_rope_attention_factor(const m2d_rope_scaling *s) {
    if (s->kind != M2D_ROPE_SCALING_YARN) return 1;
    if (s->attention_factor != 0) return s->attention_factor;
    if (s->mscale != 0 && s->mscale_all_dim != 0)
        return yarn_get_mscale(s->factor, s->mscale) / yarn_get_mscale(s->factor, s->mscale_all_dim);
    return yarn_get_mscale(s->factor, 1);
}

double m2d_rope_softmax_mscale(const m2d_rope_scaling *s) {
    if (s->kind == M2D_ROPE_SCALING_NONE || s->mscale_all_dim == 0) return 1;
    double m = yarn_get_mscale(s->factor, s->mscale_all_dim);
    return m * m;
}
