/* tkpost — tokenizer.json post-processors for add_special_tokens=True (see tkpost.h). */
#include "tokenizer/tkpost.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tktext.h"
#include "base/util.h"

#define MAX_DEPTH 16

static void push(int32_t **v, size_t *n, int32_t id) {
    *v = m2d_realloc(*v, (*n + 1) * sizeof **v);
    (*v)[(*n)++] = id;
}

static int id_value(const char *path, const cJSON *v, const char *field, int32_t max_id, int32_t *out) {
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > max_id || v->valuedouble != (double)(int32_t)v->valuedouble) {
        char what[64];
        snprintf(what, sizeof what, "expected an integer id in [0, %ld]", (long)max_id);
        return m2d_tkj_err(path, field, what);
    }
    *out = (int32_t)v->valuedouble;
    return 0;
}

/* The ids of special_tokens[NAME] appended to *v. */
static int special_ids(const char *path, const cJSON *pp, const char *field, const char *name, int32_t max_id, int32_t **v,
                       size_t *n) {
    char f[320];
    snprintf(f, sizeof f, "%s.special_tokens.%.120s.ids", field, name);
    const cJSON *tok = m2d_tkj_get(m2d_tkj_get(pp, "special_tokens"), name);
    if (!tok) {
        snprintf(f, sizeof f, "%s.special_tokens", field);
        return m2d_err("%s: field '%s': no entry for the template's special token '%.120s'", path, f, name);
    }
    const cJSON *ids = m2d_tkj_get(tok, "ids");
    if (!cJSON_IsArray(ids)) return m2d_tkj_err(path, f, "expected an array of ids");
    for (const cJSON *c = ids->child; c; c = c->next) {
        int32_t id;
        if (id_value(path, c, f, max_id, &id)) return -1;
        push(v, n, id);
    }
    return 0;
}

/* TemplateProcessing's "single": SpecialToken pieces before and after the one Sequence "A". */
static int load_template(const char *path, const cJSON *pp, const char *field, int32_t max_id, m2d_tkpost *out) {
    char f[256];
    snprintf(f, sizeof f, "%s.single", field);
    const cJSON *single = m2d_tkj_get(pp, "single");
    if (!cJSON_IsArray(single)) return m2d_tkj_err(path, f, "expected an array of template pieces");
    int seen_a = 0, i = 0;
    for (const cJSON *piece = single->child; piece; piece = piece->next, i++) {
        snprintf(f, sizeof f, "%s.single[%d]", field, i);
        const cJSON *sp = m2d_tkj_get(piece, "SpecialToken"), *seq = m2d_tkj_get(piece, "Sequence");
        const cJSON *id = m2d_tkj_get(sp ? sp : seq, "id");
        if (!(sp || seq) || !cJSON_IsString(id))
            return m2d_tkj_err(path, f, "expected {\"SpecialToken\": {\"id\": ...}} or {\"Sequence\": {\"id\": \"A\"}}");
        if (seq) {
            if (strcmp(id->valuestring, "A") != 0 || seen_a)
                return m2d_tkj_err(path, f, "a single-sequence template holds Sequence \"A\" exactly once");
            seen_a = 1;
        } else if (seen_a ? special_ids(path, pp, field, id->valuestring, max_id, &out->post, &out->n_post)
                          : special_ids(path, pp, field, id->valuestring, max_id, &out->pre, &out->n_pre)) {
            return -1;
        }
    }
    snprintf(f, sizeof f, "%s.single", field);
    return seen_a ? 0 : m2d_tkj_err(path, f, "no Sequence \"A\"");
}

/* RobertaProcessing / BertProcessing: cls A sep, each given as [token, id]. */
static int load_cls_sep(const char *path, const cJSON *pp, const char *field, int32_t max_id, m2d_tkpost *out) {
    static const char *names[] = {"cls", "sep"};
    for (int k = 0; k < 2; k++) {
        char f[256];
        snprintf(f, sizeof f, "%s.%s", field, names[k]);
        const cJSON *pair = m2d_tkj_get(pp, names[k]);
        if (!cJSON_IsArray(pair) || cJSON_GetArraySize(pair) != 2 || !cJSON_IsString(pair->child))
            return m2d_tkj_err(path, f, "expected [token, id]");
        int32_t id;
        if (id_value(path, pair->child->next, f, max_id, &id)) return -1;
        if (k == 0) push(&out->pre, &out->n_pre, id);
        else push(&out->post, &out->n_post, id);
    }
    return 0;
}

/* One processor at FIELD added to *out (Sequence: in turn). */
static int load_one(const char *path, const cJSON *pp, const char *field, int32_t max_id, int depth, m2d_tkpost *out) {
    const char *type;
    if (m2d_tkj_type(path, pp, field, &type)) return -1;
    char f[256];
    if (!strcmp(type, "Sequence")) {
        snprintf(f, sizeof f, "%s.processors", field);
        const cJSON *list = m2d_tkj_get(pp, "processors");
        if (!cJSON_IsArray(list)) return m2d_tkj_err(path, f, "expected an array");
        if (depth == MAX_DEPTH) return m2d_tkj_err(path, f, "nested too deeply");
        int i = 0;
        for (const cJSON *c = list->child; c; c = c->next, i++) {
            snprintf(f, sizeof f, "%s.processors[%d]", field, i);
            if (load_one(path, c, f, max_id, depth + 1, out)) return -1;
        }
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) return 0;
    /* HF hands the next processor the pieces (specials, text) as separate encodings and its template
     * then takes the first piece for the text: a second processor adding ids is refused, not guessed */
    if (out->n_pre || out->n_post)
        return m2d_tkj_err(path, field, "a second post-processor that adds ids after one that did is not supported");
    m2d_tkpost w = {0};
    int rc;
    if (!strcmp(type, "TemplateProcessing")) rc = load_template(path, pp, field, max_id, &w);
    else if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) rc = load_cls_sep(path, pp, field, max_id, &w);
    else {
        snprintf(f, sizeof f, "%s.type", field);
        return m2d_tkj_unsupported(path, f, type,
                                   "TemplateProcessing, ByteLevel, RobertaProcessing, BertProcessing, Sequence, null");
    }
    if (rc == 0) {
        m2d_tkpost_free(out);
        *out = w;
        return 0;
    }
    m2d_tkpost_free(&w);
    return -1;
}

int m2d_tkpost_load(const char *path, const cJSON *pp, int32_t max_id, m2d_tkpost *out) {
    memset(out, 0, sizeof *out);
    if (!pp || cJSON_IsNull(pp)) return 0;
    if (load_one(path, pp, "post_processor", max_id, 0, out) == 0) return 0;
    m2d_tkpost_free(out);
    return -1;
}

void m2d_tkpost_free(m2d_tkpost *p) {
    free(p->pre);
    free(p->post);
    memset(p, 0, sizeof *p);
}
