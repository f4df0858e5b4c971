/* calib/stats_file — the stats file's writer, reader and checks (the format: stats_file.h). */
#include "calib/stats_file.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calib/calib.h"
#include "base/util.h"

/* Stored arrays: the raw sums of stats.h (so files can be merged later); the derived fields
 * (mu, routed mean/variance, ES-Act/Mag) are recomputed on read by m2d_layer_stats_finalize. */
/* per: 0 = [E], 1 = [E*E], 2 = [E*d]; kind: what any real calibration gives (check_payload) */
enum { SIGNED, NONNEG, GRAM }; /* any finite value; a sum of non-negative values; a Gram matrix */
typedef struct { const char *name; int per, kind; } array_desc;
static const array_desc ARRAYS[] = {
    {"n", 0, NONNEG}, {"sum_p", 0, NONNEG}, {"sum_p_sel", 0, NONNEG}, {"sum_g", 0, NONNEG},
    {"sum_g2", 0, NONNEG}, {"sum_f", 0, NONNEG}, {"sum_f2", 0, NONNEG}, {"sum_gf", 0, NONNEG},
    {"sum_g2f2", 0, NONNEG}, {"sum_gf2", 0, NONNEG}, {"sum_g2f", 0, NONNEG}, {"sum_r", 0, NONNEG},
    {"sum_r2", 0, NONNEG}, {"sum_rf", 0, NONNEG}, {"sum_rf2", 0, NONNEG}, {"sum_r2f", 0, NONNEG},
    {"sum_r2f2", 0, NONNEG}, {"damage", 0, NONNEG}, {"es_act_sum", 0, NONNEG}, {"es_mag_sum", 0, NONNEG},
    {"es_magg_sum", 0, NONNEG}, {"gram", 1, GRAM}, {"logit_gram", 1, GRAM}, {"sum_f_all", 2, SIGNED},
    {"sum_f_routed", 2, SIGNED}, {"sum_f_routed_sq", 2, NONNEG},
};
#define N_ARRAYS ((int)M2D_ARRAY_LEN(ARRAYS))

static double **layer_array(m2d_layer_stats *s, int i) {
    double **p[N_ARRAYS] = {&s->n, &s->sum_p, &s->sum_p_sel, &s->sum_g, &s->sum_g2, &s->sum_f, &s->sum_f2,
                            &s->sum_gf, &s->sum_g2f2, &s->sum_gf2, &s->sum_g2f, &s->sum_r, &s->sum_r2,
                            &s->sum_rf, &s->sum_rf2, &s->sum_r2f, &s->sum_r2f2, &s->damage, &s->es_act_sum,
                            &s->es_mag_sum, &s->es_magg_sum, &s->gram, &s->logit_gram, &s->sum_f_all,
                            &s->sum_f_routed, &s->sum_f_routed_sq};
    return p[i];
}

static size_t array_len(int per, int E, int d) {
    return per == 0 ? (size_t)E : per == 1 ? (size_t)E * E : (size_t)E * d;
}

static size_t payload_bytes(int n_layers, int E, int d) {
    size_t per = 0;
    for (int i = 0; i < N_ARRAYS; i++) per += array_len(ARRAYS[i].per, E, d);
    return per * n_layers * sizeof(double);
}

static void put_f64(uint8_t *b, double v) {
    uint64_t u;
    memcpy(&u, &v, 8);
    m2d_put_le64(b, u);
}

static double get_f64(const uint8_t *b) {
    uint64_t u = 0;
    for (int i = 0; i < 8; i++) u |= (uint64_t)b[i] << (8 * i);
    double v;
    memcpy(&v, &u, 8);
    return v;
}

int m2d_stats_write(const m2d_stats *s, const char *path) {
    size_t pbytes = payload_bytes(s->n_layers, s->E, s->d);
    uint8_t *payload = m2d_malloc(pbytes ? pbytes : 1), *q = payload;
    for (int l = 0; l < s->n_layers; l++)
        for (int i = 0; i < N_ARRAYS; i++) {
            const double *a = *layer_array(&s->layers[l], i);
            size_t n = array_len(ARRAYS[i].per, s->E, s->d);
            for (size_t j = 0; j < n; j++, q += 8) put_f64(q, a[j]);
        }
    char sha[65];
    m2d_sha256_hex(payload, pbytes, sha);

    cJSON *h = cJSON_CreateObject();
    cJSON_AddStringToObject(h, "magic", "moe2dense-stats");
    cJSON_AddNumberToObject(h, "version", M2D_STATS_VERSION);
    cJSON_AddStringToObject(h, "model_hash", s->model_hash);
    cJSON_AddStringToObject(h, "calib_hash", s->calib_hash);
    cJSON_AddStringToObject(h, "gate_convention", s->gate_convention);
    cJSON_AddNumberToObject(h, "E", s->E);
    cJSON_AddNumberToObject(h, "k", s->k);
    cJSON_AddNumberToObject(h, "d", s->d);
    cJSON_AddNumberToObject(h, "d_e", s->d_e);
    cJSON_AddNumberToObject(h, "n_layers", s->n_layers);
    cJSON *layers = cJSON_AddArrayToObject(h, "layers");
    for (int l = 0; l < s->n_layers; l++) cJSON_AddItemToArray(layers, cJSON_CreateNumber(s->layers[l].layer));
    cJSON_AddNumberToObject(h, "N", s->N);
    cJSON_AddNumberToObject(h, "n_samples", s->n_layers ? s->layers[0].n_samples : 0);
    cJSON_AddNumberToObject(h, "seq_len", s->seq_len);
    cJSON *win = cJSON_AddArrayToObject(h, "windows");
    for (int w = 0; w < s->n_windows; w++) cJSON_AddItemToArray(win, cJSON_CreateNumber((double)s->window_starts[w]));
    if (s->window_lens) { /* variable-length (document) windows */
        cJSON *wl = cJSON_AddArrayToObject(h, "window_lengths");
        for (int w = 0; w < s->n_windows; w++) cJSON_AddItemToArray(wl, cJSON_CreateNumber(s->window_lens[w]));
    }
    cJSON_AddStringToObject(h, "window_choice", s->window_choice[0] ? s->window_choice : "first");
    cJSON_AddStringToObject(h, "data_path", s->data_path ? s->data_path : "");
    cJSON_AddStringToObject(h, "precision", s->precision[0] ? s->precision : "fp32");
    cJSON *arr = cJSON_AddArrayToObject(h, "arrays");
    for (int i = 0; i < N_ARRAYS; i++) cJSON_AddItemToArray(arr, cJSON_CreateString(ARRAYS[i].name));
    cJSON_AddNumberToObject(h, "data_bytes", (double)pbytes);
    cJSON_AddStringToObject(h, "data_sha256", sha);
    char *js = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    size_t hl = strlen(js), pad = (8 - (16 + hl) % 8) % 8;
    size_t total = 16 + hl + pad + pbytes;
    uint8_t *buf = m2d_malloc(total);
    memcpy(buf, M2D_STATS_MAGIC, 8);
    m2d_put_le64(buf + 8, hl + pad);
    memcpy(buf + 16, js, hl);
    memset(buf + 16 + hl, ' ', pad);
    memcpy(buf + 16 + hl + pad, payload, pbytes);
    int rc = m2d_write_file_atomic(path, buf, total);
    free(js); free(payload); free(buf);
    return rc;
}

/* ---- payload checks: what any real calibration satisfies (a NaN or an all-zero payload with a
 * recomputed checksum loads no further than here) ---- */

/* Every value finite; the sums of non-negative quantities (counts, probabilities, gate weights,
 * norms, squares, damages) >= 0 (ARRAYS[].kind). */
static int check_array(const char *path, const m2d_layer_stats *ls, int i, const double *a, size_t n) {
    int nonneg = ARRAYS[i].kind == NONNEG;
    for (size_t j = 0; j < n; j++) {
        if (!isfinite(a[j]))
            return m2d_err("%s: layer %d: field '%s'[%zu]: %g is not finite (corrupted statistics; recalibrate)", path,
                           ls->layer, ARRAYS[i].name, j, a[j]);
        if (nonneg && a[j] < 0)
            return m2d_err("%s: layer %d: field '%s'[%zu]: %g is negative (a sum of non-negative values; recalibrate)",
                           path, ls->layer, ARRAYS[i].name, j, a[j]);
    }
    return 0;
}

/* Routing invariants: each n_e a count in [0, N], and every token routed to exactly k experts. */
static int check_counts(const char *path, const m2d_stats *s, const m2d_layer_stats *ls) {
    double total = 0;
    for (int e = 0; e < s->E; e++) {
        double n = ls->n[e];
        if (n != floor(n) || n > s->N)
            return m2d_err("%s: layer %d: field 'n'[%d]: %g is not a token count in [0, N = %.0f]", path, ls->layer, e,
                           n, s->N);
        total += n;
    }
    if (total != s->N * s->k)
        return m2d_err("%s: layer %d: field 'n': the routed counts sum to %.0f, not N x k = %.0f (every token goes to "
                       "k experts; corrupted statistics, recalibrate)", path, ls->layer, total, s->N * s->k);
    return 0;
}

/* A Gram matrix (of the experts' outputs, or of the router logits) is one: symmetric (the writer
 * mirrors one triangle, so exactly), a non-negative diagonal and |G_ij| <= sqrt(G_ii G_jj)
 * (Cauchy-Schwarz, with room for rounding). */
static int check_gram(const char *path, const m2d_stats *s, const m2d_layer_stats *ls, const char *name,
                      const double *G) {
    int E = s->E;
    for (int i = 0; i < E; i++) {
        if (G[(size_t)i * E + i] < 0)
            return m2d_err("%s: layer %d: field '%s'[%d][%d]: negative diagonal", path, ls->layer, name, i, i);
        for (int j = 0; j < i; j++) {
            double gij = G[(size_t)i * E + j], bound = sqrt(G[(size_t)i * E + i] * G[(size_t)j * E + j]);
            if (gij != G[(size_t)j * E + i])
                return m2d_err("%s: layer %d: field '%s'[%d][%d]: %g but [%d][%d] is %g (not symmetric)", path,
                               ls->layer, name, i, j, gij, j, i, G[(size_t)j * E + i]);
            if (fabs(gij) > bound * (1 + 1e-6) + 1e-300)
                return m2d_err("%s: layer %d: field '%s'[%d][%d]: %g exceeds sqrt(G_ii G_jj) = %g (not a Gram matrix)",
                               path, ls->layer, name, i, j, gij, bound);
        }
    }
    return 0;
}

static int check_payload(const char *path, const m2d_stats *s) {
    for (int l = 0; l < s->n_layers; l++) {
        m2d_layer_stats *ls = &s->layers[l];
        for (int i = 0; i < N_ARRAYS; i++) {
            const double *a = *layer_array(ls, i);
            if (check_array(path, ls, i, a, array_len(ARRAYS[i].per, s->E, s->d)) ||
                (ARRAYS[i].kind == GRAM && check_gram(path, s, ls, ARRAYS[i].name, a)))
                return -1;
        }
        if (check_counts(path, s, ls)) return -1;
    }
    return 0;
}

/* Header field helpers: each failure names the file and the field. */
static int hdr_int(const char *path, const cJSON *h, const char *field, long lo, long hi, long *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(h, field);
    /* the range first: casting a double outside long's range is undefined */
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi) || v->valuedouble != floor(v->valuedouble))
        return m2d_err("%s: field '%s': missing or not an integer in [%ld, %ld]", path, field, lo, hi);
    *out = (long)v->valuedouble;
    return 0;
}

static int hdr_str(const char *path, const cJSON *h, const char *field, char *out, size_t cap) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(h, field);
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= cap)
        return m2d_err("%s: field '%s': missing, not a string, or longer than %zu bytes", path, field, cap - 1);
    snprintf(out, cap, "%s", v->valuestring);
    return 0;
}

static int is_hex64(const char *s) {
    if (strlen(s) != 64) return 0;
    for (int i = 0; i < 64; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

/* magic, version, hashes, gate convention and shapes */
static int parse_identity(const char *path, const cJSON *h, m2d_stats *s) {
    char buf[64];
    long v;
    if (hdr_str(path, h, "magic", buf, sizeof buf)) return -1;
    if (strcmp(buf, "moe2dense-stats")) return m2d_err("%s: field 'magic': '%s' is not moe2dense-stats", path, buf);
    if (hdr_int(path, h, "version", 0, 1000000, &v)) return -1;
    if (v != M2D_STATS_VERSION)
        return m2d_err("%s: field 'version': %ld is not supported (this build reads version %d; recalibrate)", path, v,
                       M2D_STATS_VERSION);
    if (hdr_str(path, h, "model_hash", s->model_hash, sizeof s->model_hash) || !is_hex64(s->model_hash))
        return m2d_err("%s: field 'model_hash': not a sha256 hex string", path);
    if (hdr_str(path, h, "calib_hash", s->calib_hash, sizeof s->calib_hash) || !is_hex64(s->calib_hash))
        return m2d_err("%s: field 'calib_hash': not a sha256 hex string", path);
    if (hdr_str(path, h, "gate_convention", s->gate_convention, sizeof s->gate_convention)) return -1;
    if (strcmp(s->gate_convention, "softmax-topk-renorm") && strcmp(s->gate_convention, "softmax-topk") &&
        strcmp(s->gate_convention, "topk-softmax"))
        return m2d_err("%s: field 'gate_convention': unknown convention '%s'", path, s->gate_convention);
    if (hdr_int(path, h, "E", 1, 1 << 16, &v)) return -1;
    s->E = (int)v;
    if (hdr_int(path, h, "k", 1, s->E, &v)) return -1;
    s->k = (int)v;
    if (hdr_int(path, h, "d", 1, 1 << 20, &v)) return -1;
    s->d = (int)v;
    if (hdr_int(path, h, "d_e", 1, 1 << 24, &v)) return -1;
    s->d_e = (int)v;
    return 0;
}

/* seq_len, N, the windows (N = windows x seq_len), n_samples, window choice, data path */
static int parse_windows(const char *path, const cJSON *h, m2d_stats *s, long *ns) {
    long v;
    if (hdr_int(path, h, "seq_len", 1, 1 << 30, &v)) return -1;
    s->seq_len = (int)v;
    if (hdr_int(path, h, "n_samples", 0, 1L << 40, ns)) return -1;
    const cJSON *N = cJSON_GetObjectItemCaseSensitive(h, "N");
    if (!cJSON_IsNumber(N) || N->valuedouble < 0 || N->valuedouble != floor(N->valuedouble))
        return m2d_err("%s: field 'N': missing or not a non-negative integer", path);
    s->N = N->valuedouble;
    const cJSON *win = cJSON_GetObjectItemCaseSensitive(h, "windows");
    if (!cJSON_IsArray(win)) return m2d_err("%s: field 'windows': missing or not an array", path);
    s->n_windows = cJSON_GetArraySize(win);
    s->window_starts = m2d_malloc((size_t)(s->n_windows ? s->n_windows : 1) * sizeof(int64_t));
    int i = 0;
    for (const cJSON *w = win->child; w; w = w->next, i++) {
        if (!cJSON_IsNumber(w) || !(w->valuedouble >= 0 && w->valuedouble <= 0x1p62) ||
            w->valuedouble != floor(w->valuedouble))
            return m2d_err("%s: field 'windows': entry %d is not a token offset", path, i);
        s->window_starts[i] = (int64_t)w->valuedouble;
    }
    const cJSON *wl = cJSON_GetObjectItemCaseSensitive(h, "window_lengths");
    if (wl) {
        if (!cJSON_IsArray(wl) || cJSON_GetArraySize(wl) != s->n_windows)
            return m2d_err("%s: field 'window_lengths': not an array of one length per window", path);
        s->window_lens = m2d_malloc((size_t)(s->n_windows ? s->n_windows : 1) * sizeof(int));
        i = 0;
        for (const cJSON *w = wl->child; w; w = w->next, i++) {
            if (!cJSON_IsNumber(w) || w->valuedouble < 1 || w->valuedouble > s->seq_len ||
                w->valuedouble != floor(w->valuedouble))
                return m2d_err("%s: field 'window_lengths': entry %d is not a length in [1, seq_len]", path, i);
            s->window_lens[i] = (int)w->valuedouble;
        }
    }
    if (m2d_stats_window_tokens(s) != s->N)
        return m2d_err("%s: field 'N': %.0f is not the tokens of the %d windows (%.0f)", path, s->N, s->n_windows,
                       m2d_stats_window_tokens(s));
    if (*ns != s->n_windows)
        return m2d_err("%s: field 'n_samples': %ld but %d windows are recorded", path, *ns, s->n_windows);
    const cJSON *wc = cJSON_GetObjectItemCaseSensitive(h, "window_choice");
    if (wc && !cJSON_IsString(wc)) return m2d_err("%s: field 'window_choice': not a string", path);
    snprintf(s->window_choice, sizeof s->window_choice, "%s", wc ? wc->valuestring : "first");
    const cJSON *dp = cJSON_GetObjectItemCaseSensitive(h, "data_path");
    s->data_path = m2d_strdup(cJSON_IsString(dp) ? dp->valuestring : "");
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(h, "precision");
    if (pr && (!cJSON_IsString(pr) || (strcmp(pr->valuestring, "fp32") && strcmp(pr->valuestring, "bf16"))))
        return m2d_err("%s: field 'precision': expected \"fp32\" or \"bf16\"", path);
    snprintf(s->precision, sizeof s->precision, "%s", pr ? pr->valuestring : "fp32");
    return 0;
}

/* the array names of this version, the payload size for NL layers and its checksum */
static int parse_payload(const char *path, const cJSON *h, const m2d_stats *s, long nl, size_t *pbytes, char sha[65]) {
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(h, "arrays");
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) != N_ARRAYS)
        return m2d_err("%s: field 'arrays': expected the %d arrays of version %d", path, N_ARRAYS, M2D_STATS_VERSION);
    int i = 0;
    for (const cJSON *a = arr->child; a; a = a->next, i++)
        if (!cJSON_IsString(a) || strcmp(a->valuestring, ARRAYS[i].name))
            return m2d_err("%s: field 'arrays': entry %d is not '%s'", path, i, ARRAYS[i].name);
    const cJSON *dbj = cJSON_GetObjectItemCaseSensitive(h, "data_bytes");
    if (!cJSON_IsNumber(dbj)) return m2d_err("%s: field 'data_bytes': missing or not a number", path);
    *pbytes = payload_bytes((int)nl, s->E, s->d);
    if (dbj->valuedouble != (double)*pbytes)
        return m2d_err("%s: field 'data_bytes': %.0f does not match E=%d, d=%d, n_layers=%d (%zu bytes)", path,
                       dbj->valuedouble, s->E, s->d, (int)nl, *pbytes);
    if (hdr_str(path, h, "data_sha256", sha, 65) || !is_hex64(sha))
        return m2d_err("%s: field 'data_sha256': not a sha256 hex string", path);
    return 0;
}

/* the MoE layer indices (increasing), each with zeroed sums of the header's shape */
static int parse_layers(const char *path, const cJSON *layers, m2d_stats *s, long nl, long ns) {
    s->layers = m2d_calloc((size_t)nl, sizeof *s->layers);
    s->n_layers = (int)nl;
    int i = 0;
    for (const cJSON *l = layers->child; l; l = l->next, i++) {
        if (!cJSON_IsNumber(l) || l->valuedouble < 0 || l->valuedouble > 1e6 || l->valuedouble != floor(l->valuedouble))
            return m2d_err("%s: field 'layers': entry %d is not a layer index", path, i);
        if (i > 0 && l->valuedouble <= s->layers[i - 1].layer)
            return m2d_err("%s: field 'layers': entry %d is not increasing", path, i);
        m2d_layer_stats_alloc(&s->layers[i], (int)l->valuedouble, s->E, s->k, s->d);
        s->layers[i].N = s->N;
        s->layers[i].n_samples = (int)ns;
    }
    return 0;
}

/* AVAILABLE: the payload bytes the file holds, checked before the layers' sums are allocated (a
 * header of a few hundred bytes may claim terabytes) */
static int parse_header(const char *path, const cJSON *h, size_t available, m2d_stats *s, size_t *pbytes,
                        char sha[65]) {
    long nl, ns;
    if (parse_identity(path, h, s)) return -1;
    /* s->n_layers is set only once s->layers exists (m2d_stats_free walks it) */
    if (hdr_int(path, h, "n_layers", 1, 1 << 16, &nl)) return -1;
    if (parse_windows(path, h, s, &ns)) return -1;
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(h, "layers");
    if (!cJSON_IsArray(layers) || cJSON_GetArraySize(layers) != nl)
        return m2d_err("%s: field 'layers': not an array of n_layers (%d) layer indices", path, (int)nl);
    if (parse_payload(path, h, s, nl, pbytes, sha)) return -1;
    if (available != *pbytes)
        return m2d_err("%s: field 'data_bytes': the file holds %zu payload bytes, the header says %zu (truncated or "
                       "padded file)", path, available, *pbytes);
    return parse_layers(path, layers, s, nl, ns);
}

int m2d_stats_read(const char *path, m2d_stats **out) {
    size_t len;
    uint8_t *buf = (uint8_t *)m2d_read_file(path, &len);
    if (!buf) return -1;
    int rc = m2d_stats_parse(path, buf, len, out);
    free(buf);
    return rc;
}

int m2d_stats_parse(const char *path, const uint8_t *buf, size_t len, m2d_stats **out) {
    m2d_stats *s = m2d_calloc(1, sizeof *s);
    int rc = -1;
    cJSON *h = NULL;
    if (len < 16 || memcmp(buf, M2D_STATS_MAGIC, 8)) {
        m2d_err("%s: field 'magic': not a moe2dense stats file (expected it to start with %s)", path, M2D_STATS_MAGIC);
        goto done;
    }
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++) hl |= (uint64_t)buf[8 + i] << (8 * i);
    if (hl > len - 16 || (16 + hl) % 8) {
        m2d_err("%s: field 'header_length': %llu is inconsistent with the file size %zu (truncated?)", path,
                (unsigned long long)hl, len);
        goto done;
    }
    h = cJSON_ParseWithLength((const char *)buf + 16, (size_t)hl);
    if (!cJSON_IsObject(h)) {
        m2d_err("%s: field 'header': not a JSON object (garbled file?)", path);
        goto done;
    }
    size_t pbytes = 0;
    char sha[65];
    if (parse_header(path, h, len - 16 - (size_t)hl, s, &pbytes, sha)) goto done;
    const uint8_t *q = buf + 16 + hl;
    char got[65];
    m2d_sha256_hex(q, pbytes, got);
    if (strcmp(got, sha)) {
        m2d_err("%s: field 'data_sha256': payload checksum mismatch (corrupted file; recalibrate)", path);
        goto done;
    }
    for (int l = 0; l < s->n_layers; l++)
        for (int i = 0; i < N_ARRAYS; i++) {
            double *a = *layer_array(&s->layers[l], i);
            size_t n = array_len(ARRAYS[i].per, s->E, s->d);
            for (size_t j = 0; j < n; j++, q += 8) a[j] = get_f64(q);
        }
    if (check_payload(path, s)) goto done;
    for (int l = 0; l < s->n_layers; l++) m2d_layer_stats_finalize(&s->layers[l]);
    rc = 0;
done:
    cJSON_Delete(h);
    if (rc) {
        m2d_stats_free(s);
        free(s);
    } else {
        *out = s;
    }
    return rc;
}

void m2d_calib_stats_free(m2d_stats *s) {
    if (!s) return;
    m2d_stats_free(s);
    free(s);
}

int m2d_stats_check_model(const m2d_stats *s, const char *stats_path, const m2d_model *m) {
    const m2d_config *c = &m->cfg;
    if (strcmp(s->model_hash, m->model_hash))
        return m2d_err("%s: field 'model_hash': the statistics were computed on another model (%.12s..., this model "
                       "%s is %.12s...); recalibrate with 'moe2dense calibrate'", stats_path, s->model_hash, m->dir,
                       m->model_hash);
    if (s->E != c->num_experts || s->k != c->num_experts_per_tok || s->d != c->hidden_size ||
        s->d_e != c->moe_intermediate_size)
        return m2d_err("%s: field 'E': shapes (E %d, k %d, d %d, d_e %d) do not match %s", stats_path, s->E, s->k, s->d,
                       s->d_e, m->dir);
    if (strcmp(s->gate_convention, m2d_calib_gate_convention(c)))
        return m2d_err("%s: field 'gate_convention': '%s' but the model uses '%s'", stats_path, s->gate_convention,
                       m2d_calib_gate_convention(c));
    int i = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (!c->layer_is_moe[l]) continue;
        if (i >= s->n_layers || s->layers[i].layer != l)
            return m2d_err("%s: field 'layers': MoE layer %d of %s is missing", stats_path, l, m->dir);
        i++;
    }
    if (i != s->n_layers) return m2d_err("%s: field 'layers': more MoE layers than %s has", stats_path, m->dir);
    return 0;
}
