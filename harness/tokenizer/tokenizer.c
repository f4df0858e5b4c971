/* tokenizer — Hugging Face tokenizer.json (BPE model) reimplemented to give exactly the ids of
 * Hugging Face `tokenizers` (Rust) with add_special_tokens=False.
 *
 * Pipeline (as HF runs it):
 *   1. added tokens with normalized=false are cut out of the RAW text (leftmost-longest match,
 *      honouring single_word / lstrip / rstrip);
 *   2. every remaining segment is normalized (NFC/NFD/NFKC/NFKD via utf8proc, Prepend, Replace),
 *      then added tokens with normalized=true are cut out of the normalized segment the same way;
 *   3. the pre-tokenizers (Split with a regex, Digits, Metaspace, ByteLevel) split the rest into
 *      pieces;
 *   4. each piece goes through BPE (rank-ordered merges over symbol ids, byte fallback, unknown
 *      tokens fused or not, memoised per call).
 * Normalizers: tknorm.c; pre-tokenizers: tkpretok.c; BPE: tkbpe.c (modules: tkimpl.h).
 * Decoding (tkdecode.c) runs the decoder chain over the ids' token strings.
 *
 * All mutable state of an encode lives in a per-call context, so one loaded tokenizer can be
 * used from several threads at once. */
#include "tokenizer/tkimpl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "base/util.h"

#define DEFAULT_HEAP_THRESHOLD 48
/* words longer than this (bytes) are cut where no merge can reach across (see m2d_tkbpe_word_cuts) */
#define DEFAULT_CUT_MIN 256
/* ids index dense tables: bound them so a corrupt file cannot ask for gigabytes */
#define MAX_ID 16777215
#define MAX_ID_STR "16777215"

static void re_scratch_init(re_scratch *r) {
    r->md = pcre2_match_data_create(1, NULL);
    memset(&r->spans, 0, sizeof r->spans);
}

static void re_scratch_free(re_scratch *r) {
    pcre2_match_data_free(r->md);
    free(r->spans.v);
}

static int build_added_set(m2d_tokenizer *tk, added_set *set, int normalized) {
    int count[256] = {0};
    set->n = 0;
    for (int i = 0; i < tk->n_added; i++)
        if (tk->added[i].normalized == normalized && tk->added[i].match_len) count[(unsigned char)tk->added[i].match[0]]++, set->n++;
    set->idx = m2d_malloc((size_t)(set->n ? set->n : 1) * sizeof *set->idx);
    set->start[0] = 0;
    for (int b = 0; b < 256; b++) set->start[b + 1] = set->start[b] + count[b];
    int fill[256];
    memcpy(fill, set->start, sizeof fill);
    for (int i = 0; i < tk->n_added; i++)
        if (tk->added[i].normalized == normalized && tk->added[i].match_len)
            set->idx[fill[(unsigned char)tk->added[i].match[0]]++] = i;
    return 0;
}

/* One added_tokens entry: its flags into *a (content borrowed from the JSON). */
static int parse_added_token(const loadctx *L, const cJSON *t, int i, added_token *a) {
    char f[96];
    const cJSON *id = m2d_tkj_get(t, "id"), *content = m2d_tkj_get(t, "content");
    snprintf(f, sizeof f, "added_tokens[%d].id", i);
    if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > MAX_ID ||
        id->valuedouble != (double)(int32_t)id->valuedouble)
        return m2d_tk_field_err(L, f, "expected an integer id in [0, " MAX_ID_STR "]");
    snprintf(f, sizeof f, "added_tokens[%d].content", i);
    if (!cJSON_IsString(content)) return m2d_tk_field_err(L, f, "expected a string");
    memset(a, 0, sizeof *a);
    a->content = content->valuestring;
    a->len = strlen(a->content);
    if (m2d_utf8_first_invalid(a->content, a->len) != a->len) return m2d_tk_field_err(L, f, "invalid UTF-8");
    struct { const char *name; int *dst; int dflt; } flags[] = {
        {"single_word", &a->single_word, 0}, {"lstrip", &a->lstrip, 0}, {"rstrip", &a->rstrip, 0},
        {"normalized", &a->normalized, 1}, {"special", &a->special, 0}};
    for (size_t k = 0; k < M2D_ARRAY_LEN(flags); k++) {
        snprintf(f, sizeof f, "added_tokens[%d].%s", i, flags[k].name);
        if (m2d_tkj_bool(L->path, t, flags[k].name, f, flags[k].dflt, flags[k].dst)) return -1;
    }
    return 0;
}

/* HF ignores the ids written in added_tokens and adds the entries one by one as
 * AddedVocabulary::add_tokens does: a content added before keeps its id (the later entry's flags
 * win), a content in the model's vocab takes the model's id, any other the next id — the vocab's
 * size, or one past the largest added id when that is not below it. Empty contents are ignored. */
static int load_added_tokens(m2d_tokenizer *tk, const loadctx *L, const cJSON *list) {
    if (!list || cJSON_IsNull(list)) return 0;
    if (!cJSON_IsArray(list)) return m2d_tk_field_err(L, "added_tokens", "expected an array");
    int n = cJSON_GetArraySize(list), i = 0;
    int64_t vocab_n = (int64_t)tk->vocab.n, max_id = -1;
    tk->added = m2d_calloc((size_t)(n ? n : 1), sizeof *tk->added);
    for (const cJSON *t = list->child; t; t = t->next, i++) {
        added_token a, *prev = NULL;
        if (parse_added_token(L, t, i, &a)) return -1;
        if (!a.len) continue;
        for (int k = 0; k < tk->n_added && !prev; k++)
            if (tk->added[k].len == a.len && !memcmp(tk->added[k].content, a.content, a.len)) prev = &tk->added[k];
        if (prev) {
            a.id = prev->id;
            a.content = prev->content, a.match = prev->match, a.match_len = prev->match_len;
            *prev = a;
            continue;
        }
        int64_t id = m2d_tkbpe_token_id(tk, a.content, a.len);
        if (id < 0) id = max_id < 0 ? vocab_n : max_id >= vocab_n || vocab_n == 0 ? max_id + 1 : vocab_n;
        if (id > MAX_ID) return m2d_err("%s: field 'added_tokens[%d]': more tokens than ids up to " MAX_ID_STR, L->path, i);
        max_id = M2D_MAX(max_id, id);
        a.id = (int32_t)id;
        a.content = m2d_strdup(a.content);
        a.match = m2d_strdup(a.content);
        a.match_len = a.len;
        tk->added[tk->n_added++] = a;
    }
    return 0;
}

/* bos/eos from tokenizer_config.json: a string, null, or {"content": ...} (AddedToken form). */
static int config_token(m2d_tokenizer *tk, const loadctx *L, const cJSON *cfg, const char *name, int32_t *out) {
    *out = -1;
    const cJSON *v = m2d_tkj_get(cfg, name);
    if (!v || cJSON_IsNull(v)) return 0;
    const cJSON *content = cJSON_IsObject(v) ? m2d_tkj_get(v, "content") : v;
    if (!cJSON_IsString(content)) return m2d_tk_field_err(L, name, "expected a string, null or {\"content\": ...}");
    int32_t id = m2d_tokenizer_token_id(tk, content->valuestring);
    if (id < 0) return m2d_err("%s: field '%s': token '%s' is not in the vocabulary", L->path, name, content->valuestring);
    *out = id;
    return 0;
}

int m2d_tk_load_sequence(m2d_tokenizer *tk, const loadctx *L, const cJSON *node, const char *field, const char *key,
                         m2d_tk_loader load) {
    char f[256];
    snprintf(f, sizeof f, "%s.%s", field, key);
    const cJSON *list = m2d_tkj_get(node, key);
    if (!cJSON_IsArray(list)) return m2d_tk_field_err(L, f, "expected an array");
    int i = 0;
    for (const cJSON *c = list->child; c; c = c->next, i++) {
        snprintf(f, sizeof f, "%s.%s[%d]", field, key, i);
        if (load(tk, L, c, f)) return -1;
    }
    return 0;
}

static cJSON *parse_json_file(const char *path) {
    size_t len;
    char *text = m2d_read_file(path, &len);
    if (!text) return NULL;
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t off = at && at >= text && at <= text + len ? (size_t)(at - text) : 0;
        m2d_err("%s: invalid JSON near byte offset %zu", path, off);
    }
    free(text);
    return root;
}

static int load_config(m2d_tokenizer *tk, const char *json_path) {
    const char *slash = strrchr(json_path, '/');
    char *dir = slash ? m2d_strfmt("%.*s", (int)(slash - json_path), json_path) : m2d_strdup(".");
    char *cfg_path = m2d_path_join(dir, "tokenizer_config.json");
    free(dir);
    int rc = 0;
    if (m2d_file_exists(cfg_path)) {
        cJSON *cfg = parse_json_file(cfg_path);
        loadctx L = {cfg_path};
        if (!cfg) rc = -1;
        else if (!cJSON_IsObject(cfg)) rc = m2d_err("%s: expected a JSON object", cfg_path);
        else rc = config_token(tk, &L, cfg, "bos_token", &tk->bos_id) || config_token(tk, &L, cfg, "eos_token", &tk->eos_id) ? -1 : 0;
        cJSON_Delete(cfg);
    }
    free(cfg_path);
    return rc;
}

/* id -> token table and the one-character lookup table. */
static void build_id_tables(m2d_tokenizer *tk) {
    int32_t max_id = -1;
    for (size_t i = 0; i < tk->vocab.n; i++) max_id = M2D_MAX(max_id, tk->vocab.e[i].val);
    for (int i = 0; i < tk->n_added; i++) max_id = M2D_MAX(max_id, tk->added[i].id);
    tk->n_ids = max_id + 1;
    tk->id_tok = m2d_calloc((size_t)(tk->n_ids ? tk->n_ids : 1), sizeof *tk->id_tok);
    tk->id_len = m2d_calloc((size_t)(tk->n_ids ? tk->n_ids : 1), sizeof *tk->id_len);
    for (size_t i = 0; i < tk->vocab.n; i++) {
        const m2d_strmap_entry *e = &tk->vocab.e[i];
        tk->id_tok[e->val] = tk->vocab.keys + e->off; /* keys arena is final now */
        tk->id_len[e->val] = e->len;
    }
    for (int i = 0; i < tk->n_added; i++) { /* HF looks up added tokens first */
        tk->id_tok[tk->added[i].id] = tk->added[i].content;
        tk->id_len[tk->added[i].id] = (uint32_t)tk->added[i].len;
    }
    for (uint32_t cp = 0; cp < 0x800; cp++) {
        char buf[4];
        int k = m2d_utf8_put(buf, cp);
        tk->char_id[cp] = m2d_tkbpe_token_id(tk, buf, (size_t)k);
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        tk->byte_fallback_id[b] = m2d_tkbpe_token_id(tk, name, strlen(name));
    }
}

/* Tokens matched after normalization are themselves normalized first (HF does the same). */
static int normalize_added_tokens(m2d_tokenizer *tk) {
    re_scratch rs;
    re_scratch_init(&rs);
    int rc = 0;
    for (int i = 0; i < tk->n_added && !rc; i++) {
        added_token *a = &tk->added[i];
        if (!a->normalized) continue;
        char *owned;
        const char *s = a->match;
        size_t n = a->match_len;
        int moved = 0;
        rc = m2d_tknorm_apply(tk, &rs, &s, &n, &owned, &moved);
        if (owned) {
            free(a->match);
            a->match = owned;
            a->match_len = n;
        }
    }
    re_scratch_free(&rs);
    return rc;
}

static int load_root(m2d_tokenizer *tk, const loadctx *L, const cJSON *root) {
    if (!cJSON_IsObject(root)) return m2d_err("%s: expected a JSON object", L->path);
    if (m2d_tkbpe_load(tk, L, m2d_tkj_get(root, "model")) || load_added_tokens(tk, L, m2d_tkj_get(root, "added_tokens")) ||
        m2d_tknorm_load(tk, L, m2d_tkj_get(root, "normalizer"), "normalizer") ||
        m2d_tkpretok_load(tk, L, m2d_tkj_get(root, "pre_tokenizer"), "pre_tokenizer") ||
        m2d_tkdecoder_load(L->path, m2d_tkj_get(root, "decoder"), &tk->decoder) ||
        m2d_tkpost_load(L->path, m2d_tkj_get(root, "post_processor"), MAX_ID, &tk->post))
        return -1;
    tk->norms_unicode_only = 1;
    for (int i = 0; i < tk->n_norms; i++) tk->norms_unicode_only &= tk->norms[i].kind <= NORM_NFKD;
    if (normalize_added_tokens(tk)) return -1;
    build_added_set(tk, &tk->raw_set, 0);
    build_added_set(tk, &tk->norm_set, 1);
    build_id_tables(tk);
    m2d_tkbpe_word_cuts(tk);
    return 0;
}

int m2d_tokenizer_load(const char *path, m2d_tokenizer **out) {
    *out = NULL;
    m2d_bytelevel_init();
    struct stat st;
    if (stat(path, &st) != 0)
        return m2d_err("%s: cannot open: %s (want a tokenizer.json or a directory holding one)", path, strerror(errno));
    /* a directory holds tokenizer.json; anything else is taken as the file itself */
    char *json_path = S_ISDIR(st.st_mode) ? m2d_path_join(path, "tokenizer.json") : m2d_strdup(path);
    cJSON *root = parse_json_file(json_path);
    if (!root) {
        free(json_path);
        return -1;
    }
    m2d_tokenizer *tk = m2d_calloc(1, sizeof *tk);
    tk->path = json_path;
    tk->bos_id = tk->eos_id = tk->unk_id = -1;
    tk->heap_threshold = DEFAULT_HEAP_THRESHOLD;
    tk->cut_min = DEFAULT_CUT_MIN;
    loadctx L = {json_path};
    int rc = load_root(tk, &L, root) || load_config(tk, json_path) ? -1 : 0;
    cJSON_Delete(root);
    if (rc) m2d_tokenizer_free(tk);
    else *out = tk;
    return rc;
}

void m2d_tokenizer_free(m2d_tokenizer *tk) {
    if (!tk) return;
    m2d_strmap_free(&tk->vocab);
    m2d_pairmap_free(&tk->merges);
    if (tk->cut_pairs.keys) m2d_pairmap_free(&tk->cut_pairs);
    for (int i = 0; i < tk->n_added; i++) {
        free(tk->added[i].content);
        free(tk->added[i].match);
    }
    free(tk->added);
    free(tk->raw_set.idx);
    free(tk->norm_set.idx);
    for (int i = 0; i < tk->n_norms; i++) {
        free(tk->norms[i].prepend);
        m2d_tkreplace_free(&tk->norms[i].rep);
    }
    for (int i = 0; i < tk->n_stages; i++) pcre2_code_free(tk->stages[i].re);
    m2d_tkdecoder_free(tk->decoder);
    m2d_tkpost_free(&tk->post);
    free(tk->id_tok);
    free(tk->id_len);
    free(tk->subword_prefix);
    free(tk->word_suffix);
    free(tk->path);
    free(tk);
}

int m2d_tokenizer_vocab_size(const m2d_tokenizer *tk) { return tk->n_ids; }
int m2d_tokenizer_bos_id(const m2d_tokenizer *tk) { return tk->bos_id; }
int m2d_tokenizer_eos_id(const m2d_tokenizer *tk) { return tk->eos_id; }

int m2d_tokenizer_token_id(const m2d_tokenizer *tk, const char *token) {
    size_t n = strlen(token);
    for (int i = 0; i < tk->n_added; i++) /* HF: added tokens first, then the model */
        if (tk->added[i].len == n && !memcmp(tk->added[i].content, token, n)) return tk->added[i].id;
    return m2d_tkbpe_token_id(tk, token, n);
}

const char *m2d_tokenizer_id_token(const m2d_tokenizer *tk, int32_t id, size_t *len) {
    if (id < 0 || id >= tk->n_ids || !tk->id_tok[id]) return NULL;
    if (len) *len = tk->id_len[id];
    return tk->id_tok[id];
}

void m2d_tokenizer_set_bpe_heap_threshold(m2d_tokenizer *tk, size_t n) { tk->heap_threshold = n; }
void m2d_tokenizer_set_word_cut_min(m2d_tokenizer *tk, size_t n) { tk->cut_min = n; }
void m2d_tokenizer_set_reference_nfc(m2d_tokenizer *tk, int on) { tk->slow_paths = on; }

/* -- added tokens ------------------------------------------------------------------------------ */

/* Leftmost-longest match of the set in s[from..n): returns the added index or -1. */
static int added_find(const m2d_tokenizer *tk, const added_set *set, const char *s, size_t n, size_t from, size_t *at) {
    for (size_t i = from; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        int best = -1;
        size_t best_len = 0;
        for (int k = set->start[b]; k < set->start[b + 1]; k++) {
            const added_token *a = &tk->added[set->idx[k]];
            if (a->match_len > best_len && a->match_len <= n - i && !memcmp(s + i, a->match, a->match_len))
                best = set->idx[k], best_len = a->match_len;
        }
        if (best >= 0) {
            *at = i;
            return best;
        }
    }
    return -1;
}

typedef int (*segment_fn)(enc_ctx *c, const char *s, size_t n);

/* HF AddedVocabulary::find_matches + split: emit added-token ids, pass the text between to fn. */
static int split_added(enc_ctx *c, const added_set *set, const char *s, size_t n, segment_fn fn) {
    const m2d_tokenizer *tk = c->tk;
    if (!set->n) return fn(c, s, n);
    size_t start_offset = 0, from = 0, at;
    int k;
    while (from < n && (k = added_find(tk, set, s, n, from, &at)) >= 0) {
        const added_token *a = &tk->added[k];
        size_t start = at, stop = at + a->match_len;
        from = stop; /* the automaton resumes after the match, whatever happens to it */
        if (a->single_word) {
            size_t p;
            int start_space = start == 0 || !m2d_is_word_char(m2d_utf8_prev(s, start, &p));
            uint32_t cp = 0;
            int stop_space = stop == n || (m2d_utf8_next((const unsigned char *)s, n, stop, &cp), !m2d_is_word_char(cp));
            if (!start_space || !stop_space) continue;
        }
        if (a->lstrip) {
            size_t ns = start, p;
            while (ns > 0 && m2d_is_white_space(m2d_utf8_prev(s, ns, &p))) ns = p;
            start = M2D_MAX(ns, start_offset);
        }
        if (a->rstrip) {
            uint32_t cp;
            int len;
            while (stop < n && (len = m2d_utf8_next((const unsigned char *)s, n, stop, &cp)) > 0 && m2d_is_white_space(cp))
                stop += (size_t)len;
        }
        if (start_offset < start && fn(c, s + start_offset, start - start_offset)) return -1;
        m2d_tk_emit(c, a->id);
        start_offset = stop;
    }
    if (start_offset < n) return fn(c, s + start_offset, n - start_offset);
    return 0;
}

static int pre_tokenize_segment(enc_ctx *c, const char *s, size_t n) {
    return m2d_tkpretok_run(c, 0, s, n, c->seg_first && s == c->norm_base);
}

static int normalized_segment(enc_ctx *c, const char *s, size_t n) {
    char *owned;
    const char *t = s;
    int moved = 0;
    if (m2d_tknorm_apply(c->tk, &c->rs, &t, &n, &owned, &moved)) return -1;
    c->norm_base = t;
    c->seg_first = s == c->text && !moved;
    int rc = split_added(c, &c->tk->norm_set, t, n, pre_tokenize_segment);
    free(owned);
    return rc;
}

static void enc_free(enc_ctx *c) {
    for (int i = 0; i <= MAX_STAGES; i++) {
        free(c->depth[i].buf);
        free(c->depth[i].buf2);
        free(c->depth[i].spans.v);
    }
    re_scratch_free(&c->rs);
    m2d_strmap_free(&c->memo);
    free(c->memo_ids);
    free(c->memo_len);
    free(c->sym);
    free(c->prev);
    free(c->next);
    free(c->heap);
}

int m2d_tokenizer_encode(const m2d_tokenizer *tk, const char *text, size_t len, int32_t **ids, size_t *n_ids) {
    *ids = NULL;
    *n_ids = 0;
    size_t bad = m2d_utf8_first_invalid(text, len);
    if (bad != len) return m2d_err("invalid UTF-8 at byte offset %zu", bad);
    enc_ctx c;
    memset(&c, 0, sizeof c);
    c.tk = tk;
    c.text = text;
    re_scratch_init(&c.rs);
    m2d_strmap_init(&c.memo, M2D_MIN(len / 8 + 16, (size_t)1 << 16));
    int rc = split_added(&c, &tk->raw_set, text, len, normalized_segment);
    if (rc == 0) {
        *ids = c.ids ? c.ids : m2d_malloc(sizeof(int32_t));
        *n_ids = c.n;
    } else {
        free(c.ids);
        m2d_err_prefix(tk->path);
    }
    enc_free(&c);
    return rc;
}

int m2d_tokenizer_encode_special(const m2d_tokenizer *tk, const char *text, size_t len, int32_t **ids, size_t *n_ids) {
    int32_t *body;
    size_t n;
    if (m2d_tokenizer_encode(tk, text, len, &body, &n)) {
        *ids = NULL;
        *n_ids = 0;
        return -1;
    }
    const m2d_tkpost *p = &tk->post;
    int32_t *all = m2d_malloc((p->n_pre + n + p->n_post + 1) * sizeof *all);
    if (p->n_pre) memcpy(all, p->pre, p->n_pre * sizeof *all);
    if (n) memcpy(all + p->n_pre, body, n * sizeof *all);
    if (p->n_post) memcpy(all + p->n_pre + n, p->post, p->n_post * sizeof *all);
    free(body);
    *ids = all;
    *n_ids = p->n_pre + n + p->n_post;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Decoding                                                                                     */

static int decode_run(const m2d_tokenizer *tk, const int32_t *ids, size_t n, int raw, m2d_tkbuf *out) {
    const char **toks = m2d_malloc((n ? n : 1) * sizeof *toks);
    uint32_t *lens = m2d_malloc((n ? n : 1) * sizeof *lens);
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= tk->n_ids) rc = m2d_err("id %ld (position %zu) out of range [0, %d)", (long)id, i, tk->n_ids);
        else if (!tk->id_tok[id]) rc = m2d_err("id %ld (position %zu) has no token in the vocabulary", (long)id, i);
        else toks[i] = tk->id_tok[id], lens[i] = tk->id_len[id];
    }
    if (!rc) rc = m2d_tkdecoder_run(tk->decoder, toks, lens, n, raw, out);
    free(toks);
    free(lens);
    return rc;
}

int m2d_tokenizer_decode_bytes(const m2d_tokenizer *tk, const int32_t *ids, size_t n, char **bytes, size_t *len) {
    m2d_tkbuf b = {0};
    *bytes = NULL;
    *len = 0;
    if (decode_run(tk, ids, n, 1, &b)) {
        free(b.p);
        return -1;
    }
    *bytes = b.p;
    *len = b.n;
    return 0;
}

int m2d_tokenizer_decode(const m2d_tokenizer *tk, const int32_t *ids, size_t n, char **text, size_t *len) {
    m2d_tkbuf b = {0};
    *text = NULL;
    *len = 0;
    if (decode_run(tk, ids, n, 0, &b)) {
        free(b.p);
        return -1;
    }
    if (m2d_utf8_first_invalid(b.p, b.n) != b.n) { /* only from invalid UTF-8 in a token string itself */
        m2d_tkbuf l = {0};
        m2d_tkbuf_put_lossy(&l, b.p, b.n);
        free(b.p);
        b = l;
    }
    *text = b.p;
    *len = b.n;
    return 0;
}
