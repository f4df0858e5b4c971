/* json — strict JSON documents (see json.h). */
#include "io/json.h"

#include <stdlib.h>
#include <string.h>

#include "base/util.h"

static int cmp_key(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* O's first key (in sorted order) that appears twice, or NULL; sorted, so a weight_map of tens of
 * thousands of tensors costs n log n */
static const char *duplicate_key(const cJSON *o) {
    int n = cJSON_GetArraySize(o), i = 0;
    if (n < 2) return NULL;
    const char **keys = m2d_malloc((size_t)n * sizeof *keys);
    for (const cJSON *c = o->child; c; c = c->next) keys[i++] = c->string;
    qsort(keys, (size_t)n, sizeof *keys, cmp_key);
    const char *dup = NULL;
    for (i = 1; i < n && !dup; i++)
        if (!strcmp(keys[i], keys[i - 1])) dup = keys[i];
    free(keys);
    return dup;
}

/* Every object in J, J included, has unique keys; AT names J (NULL: the top, called ROOT). */
static int check_unique(const char *path, const char *root, const char *at, const cJSON *j) {
    const char *dup = cJSON_IsObject(j) ? duplicate_key(j) : NULL;
    if (dup)
        return m2d_err("%s: field '%s': duplicate key '%s' (JSON readers differ on which one counts)", path,
                       at ? at : root, dup);
    int i = 0, rc = 0;
    for (const cJSON *c = j->child; c && rc == 0; c = c->next, i++) {
        if (!cJSON_IsObject(c) && !cJSON_IsArray(c)) continue;
        char *sub = cJSON_IsObject(j) ? (at ? m2d_strfmt("%s.%s", at, c->string) : m2d_strdup(c->string))
                                      : m2d_strfmt("%s[%d]", at ? at : root, i);
        rc = check_unique(path, root, sub, c);
        free(sub);
    }
    return rc;
}

int m2d_json_parse(const char *path, const char *root, const char *text, size_t len, cJSON **out) {
    const char *end = NULL;
    *out = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!j) {
        size_t at = end ? (size_t)(end - text) : 0;
        const char *ep = cJSON_GetErrorPtr();
        if (ep && ep >= text && ep <= text + len) at = (size_t)(ep - text);
        return m2d_err("%s: field '%s': malformed JSON near byte %zu of %zu", path, root, at, len);
    }
    for (const char *p = end; p < text + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            cJSON_Delete(j);
            return m2d_err("%s: field '%s': unexpected byte 0x%02x after the JSON value at byte %zu", path, root,
                           (unsigned char)*p, (size_t)(p - text));
        }
    if (check_unique(path, root, NULL, j) != 0) {
        cJSON_Delete(j);
        return -1;
    }
    *out = j;
    return 0;
}
