/* calib/ensure — one calibration path for the command and the sweep (see ensure.h). */
#include "calib/ensure.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/outfile.h"
#include "base/util.h"
#include "engine/engine.h"

int m2d_calib_job_tokens(m2d_calib_job *j, const m2d_tokenizer *tk, int documents) {
    size_t len;
    char *text = m2d_read_file(j->opts.data_path, &len);
    if (!text) return -1;
    int64_t *docs = NULL;
    int rc = documents ? m2d_calib_encode_documents(tk, text, len, &j->ids, &j->n_ids, &docs, &j->opts.n_docs)
                       : m2d_tokenizer_encode(tk, text, len, &j->ids, &j->n_ids);
    free(text);
    j->opts.doc_starts = docs;
    return rc ? m2d_err_prefix(j->opts.data_path) : 0;
}

int m2d_calib_job_identity(m2d_calib_job *j, const m2d_model *m) {
    int64_t *starts;
    int *lens;
    if (m2d_calib_choose(m, j->ids, (int64_t)j->n_ids, &j->opts, &starts, &lens, &j->n_windows, j->hash)) return -1;
    free(starts);
    free(lens);
    return 0;
}

m2d_stats *m2d_calib_cached(m2d_calib_job *j, const m2d_model *m, const char *path) {
    m2d_stats *s = NULL;
    if (!m2d_file_exists(path)) return NULL;
    if (m2d_stats_read(path, &s) == 0 && (j->hash[0] || m2d_calib_job_identity(j, m) == 0) &&
        strcmp(s->calib_hash, j->hash) == 0 &&
        strcmp(s->precision, m2d_precision_name((m2d_precision)j->opts.precision)) == 0 &&
        m2d_stats_check_model(s, path, m) == 0)
        return s;
    if (j->cmd)
        fprintf(stderr, "moe2dense %s: %s is stale or damaged (%s): recomputing\n", j->cmd, path, m2d_errmsg());
    m2d_calib_stats_free(s);
    m2d_err_clear();
    return NULL;
}

static int calibrate_into(m2d_calib_job *j, const m2d_model *m, const char *path) {
    double t0 = m2d_now();
    if (m2d_calib_run(m, j->ids, (int64_t)j->n_ids, &j->opts, &j->stats)) return -1;
    j->seconds = m2d_now() - t0;
    if (j->hash[0] && strcmp(j->stats->calib_hash, j->hash) != 0)
        return m2d_err("calibration: windows hash %s differs from the expected %s (internal error)",
                       j->stats->calib_hash, j->hash);
    return m2d_stats_write(j->stats, path);
}

int m2d_calib_ensure(m2d_calib_job *j, const m2d_model *m, const char *path) {
    m2d_lock lock = {.fd = -1, .path = NULL};
    if (j->cmd) {
        if (m2d_lock_acquire(&lock, path, j->cmd, "computing the calibration statistics", 1)) return -1;
        m2d_atomic_remove_leftovers(path); /* of a calibration that was killed while writing */
    }
    j->stats = j->force ? NULL : m2d_calib_cached(j, m, path);
    j->cached = j->stats != NULL;
    int rc = j->cached ? 0 : calibrate_into(j, m, path);
    m2d_lock_release(&lock);
    return rc;
}

void m2d_calib_job_free(m2d_calib_job *j) {
    m2d_calib_stats_free(j->stats);
    free(j->ids);
    free((void *)j->opts.doc_starts);
    j->stats = NULL;
    j->ids = NULL;
    j->opts.doc_starts = NULL;
}
