/* st — safetensors reader (mmap, single file or sharded) and deterministic writer. Kept whole
 * (~850 lines): reader and writer are two halves of one format and share its header rules.
 *
 * Format: u64 little-endian header length N, N bytes of JSON header, then the data block.
 * Header: {"__metadata__": {str: str}, NAME: {"dtype": "BF16", "shape": [..],
 * "data_offsets": [begin, end]}, ...}; offsets are relative to the data block. */
#include "io/st.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/util.h"
#include "io/json.h"

/* A header longer than this is rejected before it is parsed (the largest real checkpoints
 * have headers of a few MiB; the cap stops a lying length prefix from allocating GBs). */
#define ST_HEADER_CAP ((uint64_t)100 << 20)
/* JSON numbers are doubles: integers above 2^53 cannot be represented exactly. */
#define ST_MAX_EXACT_INT 9007199254740992.0

typedef struct {
    char *path;
    const uint8_t *base;   /* whole file (mmap) or caller's buffer */
    size_t size;
    int mapped;
    int fd;                /* kept open for the sampled hash's reads (-1 for a caller's buffer) */
    uint64_t data_off;     /* file offset of the data block (8 + header length) */
    char **meta_keys, **meta_vals;
    int n_meta;
} st_file;

typedef struct {
    m2d_tensor t;          /* t.name is owned */
    int file;
    uint64_t begin, end;   /* relative to the file's data block */
    void *owned;           /* aligned copy when the mapped data is misaligned for its dtype */
} st_entry;

struct m2d_st {
    st_file *files;
    int n_files;
    st_entry *entries;     /* sorted by name after open */
    int n, cap;
};

/* ---------------------------------------------------------------- errors */

int m2d_err1(const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return m2d_err("%s", buf); /* which keeps it one printable line (names come from untrusted files) */
}

/* ---------------------------------------------------------------- header parsing */

/* The __metadata__ string pairs of a file (reader) or of the file to write (writer). */
static void free_metadata(char **keys, char **vals, int n) {
    for (int i = 0; i < n; i++) {
        free(keys[i]);
        free(vals[i]);
    }
    free(keys);
    free(vals);
}

static void st_free_contents(m2d_st *st) {
    for (int i = 0; i < st->n; i++) {
        free((char *)st->entries[i].t.name);
        free(st->entries[i].owned);
    }
    for (int f = 0; f < st->n_files; f++) {
        st_file *sf = &st->files[f];
        if (sf->mapped && sf->base) munmap((void *)sf->base, sf->size);
        if (sf->fd >= 0) close(sf->fd);
        free_metadata(sf->meta_keys, sf->meta_vals, sf->n_meta);
        free(sf->path);
    }
    free(st->files);
    free(st->entries);
}

static int json_exact_u64(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!(d >= 0) || d > ST_MAX_EXACT_INT || d != (double)(uint64_t)d) return -1;
    *out = (uint64_t)d;
    return 0;
}

static void format_shape(const m2d_tensor *t, char *buf, size_t n) {
    size_t used = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < t->ndim && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (used < n) snprintf(buf + used, n - used, "]");
}

static int parse_metadata(const char *path, const cJSON *meta, st_file *sf) {
    if (!cJSON_IsObject(meta)) return m2d_err1("%s: field '__metadata__': must be an object of strings", path);
    int n = cJSON_GetArraySize(meta);
    sf->meta_keys = m2d_calloc((size_t)n, sizeof(char *));
    sf->meta_vals = m2d_calloc((size_t)n, sizeof(char *));
    for (const cJSON *kv = meta->child; kv; kv = kv->next) {
        if (!cJSON_IsString(kv))
            return m2d_err1("%s: field '__metadata__': value of '%s' must be a string", path, kv->string);
        sf->meta_keys[sf->n_meta] = m2d_strdup(kv->string);
        sf->meta_vals[sf->n_meta] = m2d_strdup(kv->valuestring);
        sf->n_meta++;
    }
    return 0;
}

/* Fill e from one header entry; checks types, dtype, dims and shape x dtype == byte range. */
static int parse_entry(const char *path, const cJSON *j, uint64_t data_len, st_entry *e) {
    const char *name = j->string;
    if (!cJSON_IsObject(j)) return m2d_err1("%s: tensor '%s': must be an object", path, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(j, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(j, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(j, "data_offsets");
    if (!dt) return m2d_err1("%s: tensor '%s': field 'dtype': missing", path, name);
    if (!cJSON_IsString(dt)) return m2d_err1("%s: tensor '%s': field 'dtype': must be a string", path, name);
    if (m2d_dtype_parse(dt->valuestring, &e->t.dtype) != 0)
        return m2d_err1("%s: tensor '%s': field 'dtype': unknown dtype '%s' (supported: F32 F16 BF16 F64 I32 I64 U8)",
                       path, name, dt->valuestring);
    if (!sh) return m2d_err1("%s: tensor '%s': field 'shape': missing", path, name);
    if (!cJSON_IsArray(sh)) return m2d_err1("%s: tensor '%s': field 'shape': must be an array", path, name);
    int nd = cJSON_GetArraySize(sh);
    if (nd > M2D_MAX_DIMS)
        return m2d_err1("%s: tensor '%s': field 'shape': %d dimensions (at most %d supported)", path, name, nd,
                       M2D_MAX_DIMS);
    e->t.ndim = nd;
    uint64_t numel = 1;
    int overflow = 0, i = 0;
    for (const cJSON *d = sh->child; d; d = d->next, i++) {
        uint64_t v;
        if (json_exact_u64(d, &v) != 0)
            return m2d_err1("%s: tensor '%s': field 'shape': dimension %d is not a non-negative integer", path, name, i);
        e->t.shape[i] = (int64_t)v;
        if (v && numel > UINT64_MAX / v) overflow = 1;
        numel *= v;
    }
    if (!off) return m2d_err1("%s: tensor '%s': field 'data_offsets': missing", path, name);
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2)
        return m2d_err1("%s: tensor '%s': field 'data_offsets': must be an array [begin, end]", path, name);
    if (json_exact_u64(off->child, &e->begin) != 0 || json_exact_u64(off->child->next, &e->end) != 0)
        return m2d_err1("%s: tensor '%s': field 'data_offsets': offsets must be non-negative integers", path, name);
    if (e->end < e->begin)
        return m2d_err1("%s: tensor '%s': field 'data_offsets': end %llu before begin %llu", path, name,
                       (unsigned long long)e->end, (unsigned long long)e->begin);
    size_t es = m2d_dtype_size(e->t.dtype);
    if (overflow || numel > UINT64_MAX / es || numel * es != e->end - e->begin) {
        char shape[160];
        format_shape(&e->t, shape, sizeof shape);
        if (overflow || numel > UINT64_MAX / es)
            return m2d_err1("%s: tensor '%s': field 'shape': %s x %s overflows", path, name, shape, dt->valuestring);
        return m2d_err1("%s: tensor '%s': field 'data_offsets': range [%llu, %llu) does not match shape %s x %s "
                       "(%llu bytes)", path, name, (unsigned long long)e->begin, (unsigned long long)e->end, shape,
                       dt->valuestring, (unsigned long long)(numel * es));
    }
    if (e->end > data_len)
        return m2d_err1("%s: tensor '%s': field 'data_offsets': range [%llu, %llu) extends past the end of the "
                       "data (%llu bytes)", path, name, (unsigned long long)e->begin, (unsigned long long)e->end,
                       (unsigned long long)data_len);
    e->t.nbytes = (size_t)(e->end - e->begin);
    return 0;
}

static int cmp_begin(const void *a, const void *b) {
    const st_entry *x = *(st_entry *const *)a, *y = *(st_entry *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* Ranges sorted by begin must not overlap (empty tensors occupy no bytes and never overlap). */
static int check_overlaps(const char *path, st_entry *first, int n) {
    st_entry **order = m2d_malloc((size_t)n * sizeof *order);
    for (int i = 0; i < n; i++) order[i] = &first[i];
    if (n > 1) qsort(order, (size_t)n, sizeof *order, cmp_begin);
    const st_entry *prev = NULL;
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        const st_entry *e = order[i];
        if (e->begin == e->end) continue;
        if (prev && e->begin < prev->end)
            rc = m2d_err1("%s: tensor '%s': field 'data_offsets': range [%llu, %llu) overlaps tensor '%s' [%llu, %llu)",
                         path, e->t.name, (unsigned long long)e->begin, (unsigned long long)e->end, prev->t.name,
                         (unsigned long long)prev->begin, (unsigned long long)prev->end);
        prev = e;
    }
    free(order);
    return rc;
}

static void push_entry(m2d_st *st, const st_entry *e) {
    if (st->n == st->cap) {
        st->cap = st->cap ? st->cap * 2 : 64;
        st->entries = m2d_realloc(st->entries, (size_t)st->cap * sizeof *st->entries);
    }
    st->entries[st->n++] = *e;
}

/* Parse and validate the header of file index FI (bytes already in st->files[fi]); append its tensors. */
static int parse_file(m2d_st *st, int fi) {
    st_file *sf = &st->files[fi];
    const char *path = sf->path;
    if (sf->size < 8)
        return m2d_err1("%s: field 'header length': file is %zu bytes, too short for the 8-byte length prefix",
                       path, sf->size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | sf->base[i];
    if (hlen > ST_HEADER_CAP)
        return m2d_err1("%s: field 'header length': %llu bytes exceeds the %llu-byte cap", path,
                       (unsigned long long)hlen, (unsigned long long)ST_HEADER_CAP);
    if (hlen > sf->size - 8)
        return m2d_err1("%s: field 'header length': %llu bytes but the file has only %zu bytes after the prefix "
                       "(truncated?)", path, (unsigned long long)hlen, sf->size - 8);
    const char *hdr = (const char *)sf->base + 8;
    cJSON *root;
    if (m2d_json_parse(path, "header", hdr, (size_t)hlen, &root) != 0) return -1;
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return m2d_err1("%s: field 'header': must be a JSON object", path);
    }
    uint64_t data_len = sf->size - 8 - hlen;
    const uint8_t *data = sf->base + 8 + hlen;
    sf->data_off = 8 + hlen;
    int first = st->n, rc = 0;
    for (const cJSON *j = root->child; j && rc == 0; j = j->next) {
        if (strcmp(j->string, "__metadata__") == 0) { /* once: m2d_json_parse refuses a key twice */
            rc = parse_metadata(path, j, sf);
            continue;
        }
        st_entry e;
        memset(&e, 0, sizeof e);
        e.file = fi;
        if (parse_entry(path, j, data_len, &e) != 0) {
            rc = -1;
            break;
        }
        e.t.name = m2d_strdup(j->string);
        e.t.data = data + e.begin;
        /* mmap is page-aligned, but a header whose length is not a multiple of 8 leaves data
         * misaligned for its dtype: keep an aligned copy so consumers may read it as float etc. */
        size_t es = m2d_dtype_size(e.t.dtype);
        if (e.t.nbytes && ((uintptr_t)e.t.data % es) != 0) {
            e.owned = m2d_malloc(e.t.nbytes);
            memcpy(e.owned, e.t.data, e.t.nbytes);
            e.t.data = e.owned;
        }
        push_entry(st, &e);
    }
    cJSON_Delete(root);
    if (rc == 0) rc = check_overlaps(path, st->entries + first, st->n - first);
    return rc;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const st_entry *)a)->t.name, ((const st_entry *)b)->t.name);
}

/* Sort by name; duplicate names (within one header, or across shards) are errors. */
static int finish(m2d_st *st) {
    if (st->n > 1) qsort(st->entries, (size_t)st->n, sizeof *st->entries, cmp_name);
    for (int i = 1; i < st->n; i++)
        if (strcmp(st->entries[i].t.name, st->entries[i - 1].t.name) == 0) {
            const st_entry *a = &st->entries[i - 1], *b = &st->entries[i];
            if (a->file == b->file)
                return m2d_err1("%s: tensor '%s': duplicate name in the header", st->files[a->file].path, a->t.name);
            return m2d_err1("%s: tensor '%s': duplicate name, also in %s", st->files[b->file].path, b->t.name,
                           st->files[a->file].path);
        }
    return 0;
}

static st_file *add_file(m2d_st *st, const char *path) {
    st->files = m2d_realloc(st->files, (size_t)(st->n_files + 1) * sizeof *st->files);
    st_file *sf = &st->files[st->n_files++];
    memset(sf, 0, sizeof *sf);
    sf->fd = -1;
    sf->path = m2d_strdup(path);
    return sf;
}

static int map_file(st_file *sf) {
    int fd = m2d_open_input(sf->path); /* a regular file: never blocks on a planted FIFO */
    if (fd < 0) return -1;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return m2d_err1("%s: cannot stat: %s", sf->path, strerror(errno));
    }
    sf->size = (size_t)sb.st_size;
    if (sf->size == 0) {
        close(fd);
        return 0; /* parse_file reports "too short" */
    }
    void *p = mmap(NULL, sf->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return m2d_err1("%s: cannot mmap: %s", sf->path, strerror(errno));
    }
    sf->fd = fd;
    sf->base = p;
    sf->mapped = 1;
    return 0;
}

static int open_single(m2d_st *st, const char *path) {
    st_file *sf = add_file(st, path);
    if (map_file(sf) != 0) return -1;
    return parse_file(st, st->n_files - 1);
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static char *dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return m2d_strdup(".");
    if (slash == path) return m2d_strdup("/");
    return m2d_strfmt("%.*s", (int)(slash - path), path);
}

/* Every weight_map entry of INDEX_PATH is in the shard it names, and every tensor of the shards is
 * listed: each tensor is looked up, whatever the counts (a key given twice once hid an unlisted one). */
static int check_weight_map(const m2d_st *st, const char *index_path, const char *dir, const cJSON *wm) {
    char *listed = m2d_calloc((size_t)st->n + 1, 1);
    int rc = 0;
    for (const cJSON *kv = wm->child; kv && rc == 0; kv = kv->next) {
        int i = m2d_st_index_of(st, kv->string);
        char *sp = m2d_path_join(dir, kv->valuestring);
        if (i < 0)
            rc = m2d_err1("%s: field 'weight_map': tensor '%s' is not in shard '%s'", index_path, kv->string,
                         kv->valuestring);
        else if (strcmp(st->files[st->entries[i].file].path, sp) != 0)
            rc = m2d_err1("%s: field 'weight_map': tensor '%s' is mapped to '%s' but stored in %s", index_path,
                         kv->string, kv->valuestring, st->files[st->entries[i].file].path);
        else listed[i] = 1;
        free(sp);
    }
    for (int i = 0; i < st->n && rc == 0; i++)
        if (!listed[i])
            rc = m2d_err1("%s: field 'weight_map': tensor '%s' in %s is not listed", index_path, st->entries[i].t.name,
                         st->files[st->entries[i].file].path);
    free(listed);
    return rc;
}

static int open_index(m2d_st *st, const char *index_path) {
    size_t len;
    char *text = m2d_read_file(index_path, &len);
    if (!text) return -1;
    cJSON *root;
    int bad = m2d_json_parse(index_path, "(root)", text, len, &root);
    free(text);
    if (bad) return -1;
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return m2d_err1("%s: field '(root)': must be an object with a weight_map", index_path);
    }
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    int rc = 0;
    char *dir = dir_of(index_path);
    if (!wm || !cJSON_IsObject(wm)) {
        rc = m2d_err1("%s: field 'weight_map': missing or not an object", index_path);
        goto out;
    }
    /* open each distinct shard once, in order of first mention */
    for (const cJSON *kv = wm->child; kv && rc == 0; kv = kv->next) {
        if (!cJSON_IsString(kv)) {
            rc = m2d_err1("%s: field 'weight_map': value for '%s' must be a shard file name", index_path, kv->string);
            break;
        }
        const char *shard = kv->valuestring;
        if (!shard[0] || shard[0] == '/' || strstr(shard, "..")) {
            rc = m2d_err1("%s: field 'weight_map': shard '%s' for '%s' must be a relative file name", index_path,
                         shard, kv->string);
            break;
        }
        char *sp = m2d_path_join(dir, shard);
        int known = 0;
        for (int f = 0; f < st->n_files; f++) known |= strcmp(st->files[f].path, sp) == 0;
        if (!known) {
            if (!m2d_file_exists(sp))
                rc = m2d_err1("%s: field 'weight_map': shard '%s' (for tensor '%s') does not exist", index_path, shard,
                             kv->string);
            else rc = open_single(st, sp);
        }
        free(sp);
    }
    if (rc == 0) rc = finish(st);
    if (rc == 0) rc = check_weight_map(st, index_path, dir, wm);
out:
    free(dir);
    cJSON_Delete(root);
    return rc;
}

int m2d_st_open(const char *path, m2d_st **out) {
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0) return m2d_err1("%s: cannot open: %s", path, strerror(errno));
    m2d_st *st = m2d_calloc(1, sizeof *st);
    int rc;
    if (S_ISDIR(sb.st_mode)) {
        char *single = m2d_path_join(path, "model.safetensors");
        char *index = m2d_path_join(path, "model.safetensors.index.json");
        if (m2d_file_exists(single)) rc = open_single(st, single) == 0 ? finish(st) : -1;
        else if (m2d_file_exists(index)) rc = open_index(st, index);
        else rc = m2d_err1("%s: no model.safetensors or model.safetensors.index.json in this directory", path);
        free(single);
        free(index);
    } else if (ends_with(path, ".json")) {
        rc = open_index(st, path);
    } else {
        rc = open_single(st, path) == 0 ? finish(st) : -1;
    }
    if (rc != 0) {
        st_free_contents(st);
        free(st);
        return -1;
    }
    *out = st;
    return 0;
}

int m2d_st_open_buffer(const char *label, const void *buf, size_t len, m2d_st **out) {
    *out = NULL;
    m2d_st *st = m2d_calloc(1, sizeof *st);
    st_file *sf = add_file(st, label);
    sf->base = buf;
    sf->size = len;
    if (parse_file(st, 0) != 0 || finish(st) != 0) {
        st_free_contents(st);
        free(st);
        return -1;
    }
    *out = st;
    return 0;
}

void m2d_st_close(m2d_st *st) {
    if (!st) return;
    st_free_contents(st);
    free(st);
}

int m2d_st_count(const m2d_st *st) { return st->n; }
const m2d_tensor *m2d_st_at(const m2d_st *st, int i) { return &st->entries[i].t; }

static const st_entry *find_entry(const m2d_st *st, const char *name) {
    int lo = 0, hi = st->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(st->entries[mid].t.name, name);
        if (c == 0) return &st->entries[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

const m2d_tensor *m2d_st_find(const m2d_st *st, const char *name) {
    const st_entry *e = find_entry(st, name);
    return e ? &e->t : NULL;
}

int m2d_st_index_of(const m2d_st *st, const char *name) {
    const st_entry *e = find_entry(st, name);
    return e ? (int)(e - st->entries) : -1;
}

const char *m2d_st_file_of(const m2d_st *st, const char *name) {
    const st_entry *e = find_entry(st, name);
    return e ? st->files[e->file].path : NULL;
}

const char *m2d_st_metadata(const m2d_st *st, const char *key) {
    for (int f = 0; f < st->n_files; f++)
        for (int k = 0; k < st->files[f].n_meta; k++)
            if (strcmp(st->files[f].meta_keys[k], key) == 0) return st->files[f].meta_vals[k];
    return NULL;
}

int m2d_st_file_count(const m2d_st *st) { return st->n_files; }
const char *m2d_st_file_path(const m2d_st *st, int i) { return st->files[i].path; }
size_t m2d_st_file_size(const m2d_st *st, int i) { return st->files[i].size; }

void m2d_st_advise(const m2d_st *st, const void *p, size_t n, m2d_st_advice advice) {
    const uint8_t *b = p;
    for (int f = 0; f < st->n_files && n > 0; f++) {
        const st_file *sf = &st->files[f];
        if (!sf->mapped || b < sf->base || b + n > sf->base + sf->size) continue;
        /* whole pages inside [p, p + n) only: a shared edge page may hold a neighbour still in use */
        uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), lo = ((uintptr_t)b + pg - 1) / pg * pg,
                  hi = ((uintptr_t)b + n) / pg * pg;
        if (advice == M2D_ST_WILLNEED) lo = (uintptr_t)b / pg * pg, hi = ((uintptr_t)b + n + pg - 1) / pg * pg;
        if (hi > lo) madvise((void *)lo, hi - lo, advice == M2D_ST_WILLNEED ? MADV_WILLNEED : MADV_DONTNEED);
        return;
    }
}

/* ---------------------------------------------------------------- hashing */

static void hash_u64(m2d_sha256 *s, uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
    m2d_sha256_update(s, b, 8);
}

enum { HASH_WIN = 1024, HASH_INNER = 8, HASH_SMALL = (HASH_INNER + 2) * HASH_WIN };

static int pread_full(int fd, uint8_t *buf, size_t n, uint64_t off) {
    while (n > 0) {
        ssize_t r = pread(fd, buf, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        buf += r, n -= (size_t)r, off += (uint64_t)r;
    }
    return 0;
}

/* Hash bytes [OFF, OFF + N) of entry E (N <= HASH_SMALL). From a mapped file they are read with
 * pread on a descriptor advised POSIX_FADV_RANDOM, so only their pages come from disk: touching
 * them through the map instead lets the kernel's read-around (the disk's readahead, 8 MB on
 * some machines) fetch the whole checkpoint, ~45 GB for Qwen3-30B-A3B's sample of ~180 MB. The
 * bytes are the same either way (the map is the fallback when a read fails). */
static void hash_sample(m2d_sha256 *s, const m2d_st *st, const st_entry *e, size_t off, size_t n) {
    const st_file *sf = &st->files[e->file];
    uint8_t buf[HASH_SMALL];
    const uint8_t *p = (const uint8_t *)e->t.data + off;
    if (sf->fd >= 0 && pread_full(sf->fd, buf, n, sf->data_off + e->begin + off) == 0) p = buf;
    m2d_sha256_update(s, p, n);
}

/* Sampled mode's data: the first and last window plus HASH_INNER evenly strided ones (the whole
 * tensor when it is at most HASH_SMALL bytes). */
static void hash_sampled_data(m2d_sha256 *s, const m2d_st *st, const st_entry *e) {
    size_t n = e->t.nbytes;
    if (n <= HASH_SMALL) {
        hash_sample(s, st, e, 0, n);
        return;
    }
    hash_sample(s, st, e, 0, HASH_WIN);
    size_t stride = (n - 2 * HASH_WIN) / HASH_INNER;
    for (int k = 0; k < HASH_INNER; k++) hash_sample(s, st, e, HASH_WIN + (size_t)k * stride, HASH_WIN);
    hash_sample(s, st, e, n - HASH_WIN, HASH_WIN);
}

/* Identity of the weights. Up to MAX_FULL_BYTES of tensor data, every byte is hashed (with
 * names, dtypes and shapes), so the hash does not depend on sharding or header layout; sha256
 * runs at ~190 MiB/s here, so the default cap (256 MiB) bounds this at ~1.5 s. Above that (a
 * 60 GB checkpoint would take minutes), we hash names/dtypes/shapes, the file sizes, and for
 * each tensor its first and last 1 KiB plus 8 evenly strided 1 KiB windows (whole tensors when
 * they are at most 10 KiB): any re-training, conversion or dtype change alters those bytes with
 * overwhelming probability, and the cost is bounded by the tensor count (~10 KiB each, ~180 MB
 * for the 18k tensors of Qwen3-30B-A3B), not the checkpoint size, provided only those bytes are
 * read from disk (hash_sample). The mode is part of the hashed input, so the two modes never
 * collide. */
void m2d_st_hash(const m2d_st *st, uint64_t max_full_bytes, char out[65]) {
    uint64_t total = 0;
    for (int i = 0; i < st->n; i++) total += st->entries[i].t.nbytes;
    int full = total <= max_full_bytes;
    m2d_sha256 s;
    m2d_sha256_init(&s);
    const char *mode = full ? "m2d-weights-v1-full" : "m2d-weights-v1-sampled";
    m2d_sha256_update(&s, mode, strlen(mode) + 1);
    if (!full)
        for (int f = 0; f < st->n_files; f++) {
            hash_u64(&s, st->files[f].size);
            if (st->files[f].fd >= 0) (void)posix_fadvise(st->files[f].fd, 0, 0, POSIX_FADV_RANDOM);
        }
    for (int i = 0; i < st->n; i++) {
        const m2d_tensor *t = &st->entries[i].t;
        m2d_sha256_update(&s, t->name, strlen(t->name) + 1);
        const char *dt = m2d_dtype_name(t->dtype);
        m2d_sha256_update(&s, dt, strlen(dt) + 1);
        hash_u64(&s, (uint64_t)t->ndim);
        for (int d = 0; d < t->ndim; d++) hash_u64(&s, (uint64_t)t->shape[d]);
        if (full) m2d_sha256_update(&s, t->data, t->nbytes);
        else hash_sampled_data(&s, st, &st->entries[i]);
    }
    uint8_t d[32];
    m2d_sha256_final(&s, d);
    m2d_hex(d, 32, out);
}

/* ---------------------------------------------------------------- writer */

typedef struct {
    char *name;
    m2d_dtype dtype;
    int ndim;
    int64_t shape[M2D_MAX_DIMS];
    const void *data;
    void *owned;
    size_t nbytes;
    m2d_st_fill_fn fill;   /* lazy: the bytes come from fill(ctx, ...) at write time */
    void *ctx;
} wr_entry;

struct m2d_st_writer {
    wr_entry *e;
    int n, cap;
    char **meta_keys, **meta_vals;
    int n_meta;
};

m2d_st_writer *m2d_st_writer_new(void) { return m2d_calloc(1, sizeof(m2d_st_writer)); }

static int writer_push(m2d_st_writer *w, const char *name, m2d_dtype dtype, int ndim, const int64_t *shape,
                       wr_entry **out) {
    if (!name || !name[0]) return m2d_err1("safetensors writer: tensor name is empty");
    if (strcmp(name, "__metadata__") == 0) return m2d_err1("safetensors writer: tensor name '__metadata__' is reserved");
    if ((int)dtype < 0 || dtype >= M2D_DTYPE_COUNT) return m2d_err1("safetensors writer: tensor '%s': bad dtype", name);
    if (ndim < 0 || ndim > M2D_MAX_DIMS)
        return m2d_err1("safetensors writer: tensor '%s': %d dimensions (at most %d)", name, ndim, M2D_MAX_DIMS);
    size_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return m2d_err1("safetensors writer: tensor '%s': negative dimension", name);
        numel *= (size_t)shape[i];
    }
    if (w->n == w->cap) {
        w->cap = w->cap ? w->cap * 2 : 64;
        w->e = m2d_realloc(w->e, (size_t)w->cap * sizeof *w->e);
    }
    wr_entry *e = &w->e[w->n++];
    memset(e, 0, sizeof *e);
    e->name = m2d_strdup(name);
    e->dtype = dtype;
    e->ndim = ndim;
    for (int i = 0; i < ndim; i++) e->shape[i] = shape[i];
    e->nbytes = numel * m2d_dtype_size(dtype);
    *out = e;
    return 0;
}

/* Undo the last push (its WHAT, data or fill callback, was NULL) and report it. */
static int writer_pop_err(m2d_st_writer *w, const char *name, const char *what) {
    w->n--;
    free(w->e[w->n].name);
    return m2d_err1("safetensors writer: tensor '%s': %s is NULL", name, what);
}

int m2d_st_writer_add(m2d_st_writer *w, const char *name, m2d_dtype dtype, int ndim, const int64_t *shape,
                      const void *data) {
    wr_entry *e;
    if (writer_push(w, name, dtype, ndim, shape, &e) != 0) return -1;
    if (e->nbytes && !data) return writer_pop_err(w, name, "data");
    e->owned = m2d_malloc(e->nbytes);
    if (e->nbytes) memcpy(e->owned, data, e->nbytes);
    e->data = e->owned;
    return 0;
}

int m2d_st_writer_add_ref(m2d_st_writer *w, const char *name, m2d_dtype dtype, int ndim, const int64_t *shape,
                          const void *data) {
    wr_entry *e;
    if (writer_push(w, name, dtype, ndim, shape, &e) != 0) return -1;
    if (e->nbytes && !data) return writer_pop_err(w, name, "data");
    e->data = data;
    return 0;
}

int m2d_st_writer_add_lazy(m2d_st_writer *w, const char *name, m2d_dtype dtype, int ndim, const int64_t *shape,
                           m2d_st_fill_fn fill, void *ctx) {
    wr_entry *e;
    if (writer_push(w, name, dtype, ndim, shape, &e) != 0) return -1;
    if (!fill) return writer_pop_err(w, name, "fill callback");
    e->fill = fill;
    e->ctx = ctx;
    return 0;
}

uint64_t m2d_st_writer_data_bytes(const m2d_st_writer *w) {
    uint64_t total = 0;
    for (int i = 0; i < w->n; i++) total += w->e[i].nbytes;
    return total;
}

int m2d_st_writer_add_f32(m2d_st_writer *w, const char *name, m2d_dtype dtype, int ndim, const int64_t *shape,
                          const float *data) {
    if (dtype != M2D_F32 && dtype != M2D_F16 && dtype != M2D_BF16)
        return m2d_err1("safetensors writer: tensor '%s': add_f32 stores only F32, F16 or BF16", name);
    wr_entry *e;
    if (writer_push(w, name, dtype, ndim, shape, &e) != 0) return -1;
    if (e->nbytes && !data) return writer_pop_err(w, name, "data");
    e->owned = m2d_malloc(e->nbytes);
    m2d_from_f32(dtype, data, (int64_t)(e->nbytes / m2d_dtype_size(dtype)), e->owned);
    e->data = e->owned;
    return 0;
}

void m2d_st_writer_metadata(m2d_st_writer *w, const char *key, const char *value) {
    for (int i = 0; i < w->n_meta; i++)
        if (strcmp(w->meta_keys[i], key) == 0) {
            free(w->meta_vals[i]);
            w->meta_vals[i] = m2d_strdup(value);
            return;
        }
    w->meta_keys = m2d_realloc(w->meta_keys, (size_t)(w->n_meta + 1) * sizeof(char *));
    w->meta_vals = m2d_realloc(w->meta_vals, (size_t)(w->n_meta + 1) * sizeof(char *));
    w->meta_keys[w->n_meta] = m2d_strdup(key);
    w->meta_vals[w->n_meta] = m2d_strdup(value);
    w->n_meta++;
}

void m2d_st_writer_free(m2d_st_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++) {
        free(w->e[i].name);
        free(w->e[i].owned);
    }
    free_metadata(w->meta_keys, w->meta_vals, w->n_meta);
    free(w->e);
    free(w);
}

/* growable string for the header */
typedef struct { char *s; size_t n, cap; } sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        while (b->n + n + 1 > b->cap) b->cap = b->cap ? b->cap * 2 : 4096;
        b->s = m2d_realloc(b->s, b->cap);
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_fmt_u64(sbuf *b, uint64_t v) {
    char tmp[24];
    snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v);
    sb_str(b, tmp);
}

/* JSON string literal with serde_json's escapes (quote, backslash, \b \f \n \r \t, other
 * control characters as \u00xx); UTF-8 passes through. */
static void sb_json_string(sbuf *b, const char *s) {
    sb_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"') sb_str(b, "\\\"");
        else if (*p == '\\') sb_str(b, "\\\\");
        else if (*p == '\b') sb_str(b, "\\b");
        else if (*p == '\f') sb_str(b, "\\f");
        else if (*p == '\n') sb_str(b, "\\n");
        else if (*p == '\r') sb_str(b, "\\r");
        else if (*p == '\t') sb_str(b, "\\t");
        else if (*p < 0x20) {
            char tmp[8];
            snprintf(tmp, sizeof tmp, "\\u%04x", *p);
            sb_str(b, tmp);
        } else sb_put(b, (const char *)p, 1);
    }
    sb_put(b, "\"", 1);
}

/* The order of the reference (Rust) safetensors writer, which transformers' save_pretrained uses:
 * dtypes from the widest (its Dtype enum, descending), then names. */
static int dtype_rank(m2d_dtype t) {
    switch (t) {
    case M2D_I64: return 0;
    case M2D_F64: return 1;
    case M2D_F32: return 2;
    case M2D_I32: return 3;
    case M2D_BF16: return 4;
    case M2D_F16: return 5;
    default: return 6; /* U8 */
    }
}

static int cmp_wr(const void *a, const void *b) {
    const wr_entry *x = a, *y = b;
    int r = dtype_rank(x->dtype) - dtype_rank(y->dtype);
    return r ? r : strcmp(x->name, y->name);
}

/* Header JSON: metadata, then entries [from, to) (already sorted), padded to 8 bytes with spaces,
 * byte for byte as the reference (Rust) safetensors writer lays it out (metadata keys sorted here,
 * for determinism; the reference keeps their insertion order, the same for a single key). */
static char *build_header(const m2d_st_writer *w, int from, int to, size_t *len) {
    sbuf b = {0};
    sb_str(&b, "{");
    if (w->n_meta) {
        int *order = m2d_malloc((size_t)w->n_meta * sizeof(int));
        for (int i = 0; i < w->n_meta; i++) order[i] = i;
        for (int i = 1; i < w->n_meta; i++)
            for (int j = i; j > 0 && strcmp(w->meta_keys[order[j - 1]], w->meta_keys[order[j]]) > 0; j--) {
                int t = order[j];
                order[j] = order[j - 1];
                order[j - 1] = t;
            }
        sb_str(&b, "\"__metadata__\":{");
        for (int i = 0; i < w->n_meta; i++) {
            if (i) sb_str(&b, ",");
            sb_json_string(&b, w->meta_keys[order[i]]);
            sb_str(&b, ":");
            sb_json_string(&b, w->meta_vals[order[i]]);
        }
        sb_str(&b, "}");
        free(order);
    }
    uint64_t off = 0;
    for (int i = from; i < to; i++) {
        const wr_entry *e = &w->e[i];
        if (i > from || w->n_meta) sb_str(&b, ",");
        sb_json_string(&b, e->name);
        sb_str(&b, ":{\"dtype\":\"");
        sb_str(&b, m2d_dtype_name(e->dtype));
        sb_str(&b, "\",\"shape\":[");
        for (int d = 0; d < e->ndim; d++) {
            if (d) sb_str(&b, ",");
            sb_fmt_u64(&b, (uint64_t)e->shape[d]);
        }
        sb_str(&b, "],\"data_offsets\":[");
        sb_fmt_u64(&b, off);
        sb_str(&b, ",");
        off += e->nbytes;
        sb_fmt_u64(&b, off);
        sb_str(&b, "]}");
    }
    sb_str(&b, "}");
    while (b.n % 8) sb_str(&b, " ");
    *len = b.n;
    return b.s;
}

/* The data of lazy entry E into F, chunk by chunk through BUF (CAP bytes, a multiple of 8). */
static int write_lazy(m2d_atomic_file *f, const wr_entry *e, uint8_t *buf, size_t cap) {
    for (size_t off = 0; off < e->nbytes && !f->failed; off += cap) {
        size_t n = e->nbytes - off < cap ? e->nbytes - off : cap;
        if (e->fill(e->ctx, e->name, off, buf, n) != 0) {
            char *why = m2d_strdup(m2d_errmsg());
            m2d_err1("%s: tensor '%s': its data could not be produced: %s", f->path, e->name, why);
            free(why);
            return -1;
        }
        m2d_atomic_write(f, buf, n);
    }
    return f->failed ? -1 : 0;
}

/* Entries [from, to) as one safetensors file into the open F (BUF/CAP: the lazy entries' chunk).
 * -1 + m2d_err when a write or a fill fails (the caller aborts F). */
static int write_body(const m2d_st_writer *w, int from, int to, m2d_atomic_file *f, uint8_t *buf, size_t cap) {
    size_t hlen;
    char *hdr = build_header(w, from, to, &hlen);
    uint8_t pre[8];
    for (int i = 0; i < 8; i++) pre[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    m2d_atomic_write(f, pre, 8);
    m2d_atomic_write(f, hdr, hlen);
    free(hdr);
    int rc = f->failed ? -1 : 0;
    for (int i = from; i < to && rc == 0; i++) {
        const wr_entry *e = &w->e[i];
        rc = e->fill ? write_lazy(f, e, buf, cap) : m2d_atomic_write(f, e->data, e->nbytes);
    }
    return rc;
}

/* The one chunk buffer of a write: the largest lazy tensor, at most M2D_ST_FILL_CHUNK bytes. */
static uint8_t *chunk_buffer(const m2d_st_writer *w, size_t *cap) {
    size_t c = 0;
    for (int i = 0; i < w->n; i++)
        if (w->e[i].fill && w->e[i].nbytes > c) c = w->e[i].nbytes;
    *cap = c < M2D_ST_FILL_CHUNK ? c : M2D_ST_FILL_CHUNK;
    return *cap ? m2d_malloc(*cap) : NULL;
}

static int writer_sort(m2d_st_writer *w) {
    if (w->n > 1) qsort(w->e, (size_t)w->n, sizeof *w->e, cmp_wr);
    for (int i = 1; i < w->n; i++)
        if (strcmp(w->e[i].name, w->e[i - 1].name) == 0)
            return m2d_err1("safetensors writer: tensor '%s': added twice", w->e[i].name);
    return 0;
}

/* Atomic write to PATH (base/outfile.h: exclusive temp file, fsync, rename). */
int m2d_st_writer_write(m2d_st_writer *w, const char *path) {
    if (writer_sort(w) != 0) return -1;
    m2d_atomic_file f;
    if (m2d_atomic_open(&f, path) != 0) return -1;
    size_t cap;
    uint8_t *buf = chunk_buffer(w, &cap);
    int rc = write_body(w, 0, w->n, &f, buf, cap);
    free(buf);
    if (rc == 0) return m2d_atomic_commit(&f);
    m2d_atomic_abort(&f);
    return -1;
}

/* START[0..ns]: the first entry of each shard, greedy in write order (dtype, then name); a tensor
 * larger than MAX gets a shard of its own. Returns ns (at least 1). */
static int split_shards(const m2d_st_writer *w, size_t max, int *start) {
    int ns = 0;
    size_t fill = 0;
    for (int i = 0; i < w->n; i++) {
        if (ns == 0 || (fill > 0 && fill + w->e[i].nbytes > max)) {
            start[ns++] = i;
            fill = 0;
        }
        fill += w->e[i].nbytes;
    }
    if (ns == 0) start[ns++] = 0;
    start[ns] = w->n;
    return ns;
}

static int cmp_name_of(const void *a, const void *b) {
    const wr_entry *x = *(const wr_entry *const *)a, *y = *(const wr_entry *const *)b;
    return strcmp(x->name, y->name);
}

/* The index as transformers writes it: json.dumps(index, indent=2, sort_keys=True) + "\n". SHARD_OF[i]:
 * entry i's shard number (1-based), of NS. */
static char *build_index(const m2d_st_writer *w, const int *shard_of, int ns, size_t *len) {
    const wr_entry **by_name = m2d_malloc((size_t)(w->n ? w->n : 1) * sizeof *by_name);
    for (int i = 0; i < w->n; i++) by_name[i] = &w->e[i];
    if (w->n > 1) qsort(by_name, (size_t)w->n, sizeof *by_name, cmp_name_of);
    sbuf b = {0};
    sb_str(&b, "{\n  \"metadata\": {\n    \"total_size\": ");
    sb_fmt_u64(&b, m2d_st_writer_data_bytes(w));
    sb_str(&b, "\n  },\n  \"weight_map\": {");
    for (int i = 0; i < w->n; i++) {
        char fname[64];
        snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", shard_of[by_name[i] - w->e], ns);
        sb_str(&b, i ? ",\n    " : "\n    ");
        sb_json_string(&b, by_name[i]->name);
        sb_str(&b, ": ");
        sb_json_string(&b, fname);
    }
    sb_str(&b, w->n ? "\n  }\n}\n" : "}\n}\n");
    free(by_name);
    *len = b.n;
    return b.s;
}

/* Rename the NS complete temp files F into place, the index last (an older one removed first, so
 * no index ever names a shard of another write). On a failure the shards already moved are
 * removed and the others aborted. */
static int commit_shards(m2d_atomic_file *f, int ns, const char *dir, const char *index, size_t index_len) {
    char *ip = m2d_path_join(dir, "model.safetensors.index.json");
    int rc = m2d_check_output_path(ip);
    if (rc == 0 && unlink(ip) != 0 && errno != ENOENT)
        rc = m2d_err1("%s: cannot remove the old index: %s", ip, strerror(errno));
    int done = 0;
    for (; done < ns && rc == 0; done++) rc = m2d_atomic_commit(&f[done]); /* a failed one counts as done */
    if (rc == 0) rc = m2d_write_file_atomic(ip, index, index_len);
    for (int s = 0; s < ns && rc != 0; s++) {
        if (s >= done) m2d_atomic_abort(&f[s]);
        else {
            char *fname = m2d_strfmt("model-%05d-of-%05d.safetensors", s + 1, ns), *p = m2d_path_join(dir, fname);
            unlink(p);
            free(p);
            free(fname);
        }
    }
    free(ip);
    return rc;
}

int m2d_st_writer_write_sharded(m2d_st_writer *w, const char *dir, size_t max_shard_bytes, int *n_shards) {
    if (writer_sort(w) != 0) return -1;
    int *start = m2d_malloc((size_t)(w->n + 2) * sizeof(int)), *shard_of = m2d_calloc((size_t)w->n + 1, sizeof(int));
    int ns = split_shards(w, max_shard_bytes, start), opened = 0, rc = 0;
    m2d_atomic_file *f = m2d_calloc((size_t)ns, sizeof *f);
    size_t cap;
    uint8_t *buf = chunk_buffer(w, &cap);
    for (int s = 0; s < ns && rc == 0; s++) {
        char *fname = m2d_strfmt("model-%05d-of-%05d.safetensors", s + 1, ns), *p = m2d_path_join(dir, fname);
        rc = m2d_atomic_open(&f[s], p);
        if (rc == 0) opened++, rc = write_body(w, start[s], start[s + 1], &f[s], buf, cap);
        for (int i = start[s]; i < start[s + 1]; i++) shard_of[i] = s + 1;
        free(p);
        free(fname);
    }
    free(buf);
    if (rc == 0) {
        size_t ilen;
        char *index = build_index(w, shard_of, ns, &ilen);
        rc = commit_shards(f, ns, dir, index, ilen);
        free(index);
    } else
        for (int s = 0; s < opened; s++) m2d_atomic_abort(&f[s]);
    if (n_shards) *n_shards = ns;
    free(f);
    free(shard_of);
    free(start);
    return rc;
}

int m2d_st_check_finite(const m2d_st *st) {
    for (int i = 0; i < st->n; i++) {
        const m2d_tensor *t = &st->entries[i].t;
        int64_t count, first = m2d_tensor_first_non_finite(t, &count);
        if (first >= 0)
            return m2d_err1("%s: tensor '%s': %lld value(s) not finite (the first at element %lld)",
                            st->files[st->entries[i].file].path, t->name, (long long)count, (long long)first);
    }
    return 0;
}
