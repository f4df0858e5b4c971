/* calib/ensure — the calibration steps of `moe2dense calibrate` and of a sweep, in one place:
 * encode the text, choose the windows, keep a stats file that is up to date, or run the teacher
 * and write it.
 *
 * A stats file is up to date when it reads back intact and holds the statistics of the same
 * windows (calib_hash), precision and model weights. Use:
 *
 *   m2d_calib_job j = {.opts = {...}};          (data_path, seq_len, samples, seed, threads, device;
 *                                                 precision resolved: m2d_engine_resolve_precision)
 *   m2d_calib_job_tokens(&j, tk, documents)     the text of j.opts.data_path, encoded
 *   [m2d_calib_job_identity(&j, m)]             j.hash and j.n_windows now (else when needed)
 *   m2d_calib_ensure(&j, m, PATH)               j.stats: PATH's when up to date (j.cached), or computed
 *                                                 and written to PATH (atomically)
 *   (or m2d_calib_cached(&j, m, PATH): PATH's statistics if up to date, never computed)
 *   m2d_calib_job_free(&j) */
#ifndef M2D_CALIB_ENSURE_H
#define M2D_CALIB_ENSURE_H

#include "calib/calib.h"

typedef struct {
    m2d_calib_opts opts;  /* the run's options; opts.doc_starts is the job's (document windows) */
    int force;            /* 1: recompute even if PATH is up to date */
    const char *cmd;      /* non-NULL (e.g. "sweep"): m2d_calib_ensure holds PATH's lock meanwhile,
                           * waiting for another holder ("moe2dense CMD: ..."), and removes what a killed
                           * writer left; a stale PATH is said on stderr; NULL: none of it */
    int32_t *ids;         /* the encoded text */
    size_t n_ids;
    char hash[65];        /* calib_hash of the chosen windows; "" until known */
    int n_windows;        /* windows chosen (may be fewer than asked) */
    m2d_stats *stats;     /* the result; the job's until the caller takes it (sets it NULL) */
    int cached;           /* 1: stats read from an up-to-date PATH; 0: computed by this job */
    double seconds;       /* of the calibration pass, when computed */
} m2d_calib_job;

/* Encode j->opts.data_path whole, or document by document (m2d_calib_encode_documents; sets
 * j->opts.doc_starts/n_docs). Errors name the file. */
int m2d_calib_job_tokens(m2d_calib_job *j, const m2d_tokenizer *tk, int documents);
/* The windows j would use: j->hash, j->n_windows (m2d_calib_choose). */
int m2d_calib_job_identity(m2d_calib_job *j, const m2d_model *m);
/* PATH's statistics when it is up to date for J (J's identity found on the way when not yet known);
 * NULL, no error, when absent or stale. */
m2d_stats *m2d_calib_cached(m2d_calib_job *j, const m2d_model *m, const char *path);
/* j->stats from PATH when it is up to date (and !j->force), else calibrated and written to PATH. */
int m2d_calib_ensure(m2d_calib_job *j, const m2d_model *m, const char *path);
void m2d_calib_job_free(m2d_calib_job *j);

#endif
