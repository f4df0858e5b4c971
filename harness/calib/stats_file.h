/* calib/stats_file — the file m2d_calib_run's statistics are kept in (moe2dense calibrate writes
 * it; convert, sweep, analyze and inspect read it). The statistics themselves: stats.h; the
 * calibration windows and hash the header records: calib.h.
 *
 * Stats file (version 2), all integers and floats little-endian:
 *   offset 0   8 bytes   magic "M2DSTATS"
 *   offset 8   uint64    H = length of the JSON header in bytes (header is padded with spaces
 *                        so that 16 + H is a multiple of 8)
 *   offset 16  H bytes   JSON header (UTF-8), an object with:
 *       "magic": "moe2dense-stats", "version": 2,
 *       "model_hash": m2d_model.model_hash of the teacher (config.json and tensors), "calib_hash": the calibration
 *       identity hash (calib.h), "gate_convention", "E", "k", "d", "d_e", "n_layers" (MoE
 *       layers), "layers": [model layer index of each MoE layer], "N": calibration tokens, "n_samples", "seq_len",
 *       "windows": [start token offset of each window], "window_lengths": [tokens of each window]
 *       (document windows only; absent: every window is seq_len), "data_path": the calibration file as
 *       given, "precision": "fp32" or "bf16", the precision of the teacher's GEMMs (absent in
 *       files written before it existed: "fp32"), "arrays": [names, in storage order],
 *       "data_bytes": byte length of the payload, "data_sha256": sha256 of the payload.
 *   offset 16+H  payload: for each MoE layer in order, float64 arrays in "arrays" order:
 *       n, sum_p, sum_p_sel, sum_g, sum_g2, sum_f, sum_f2, sum_gf, sum_g2f2, sum_gf2, sum_g2f,
 *       sum_r, sum_r2, sum_rf, sum_rf2, sum_r2f, sum_r2f2, damage,
 *       es_act_sum, es_mag_sum, es_magg_sum                      [E] each
 *       gram, logit_gram                                         [E*E] row-major, symmetric
 *       sum_f_all, sum_f_routed, sum_f_routed_sq                 [E*d] row-major (expert, dim)
 *   These are the raw sums of stats.h (mergeable); the reader derives mu, routed_mean,
 *   routed_var, es_act, es_mag, es_mag_gated with m2d_layer_stats_finalize. Each layer's N and
 *   n_samples are the header's. The file ends exactly after the payload.
 *   Version 2 added the renormalised-gate sums (sum_r*), damage, es_magg_sum, logit_gram and
 *   window_lengths; a version-1 file is refused with a one-line error (recalibrate).
 *   A reader checks magic, version, every header field's type and range, the payload length
 *   (E, d, n_layers) against the file size, the payload sha256 (truncation, garbling), and the
 *   values: all finite, the sums of non-negative quantities >= 0, each n_e a count <= N with
 *   sum_e n_e = N k (every token is routed to k experts), the Gram matrix's diagonal >= 0 and
 *   |G_ij| <= sqrt(G_ii G_jj); an error names the layer and the field.
 *   The file is written atomically (temp + rename). */
#ifndef M2D_STATS_FILE_H
#define M2D_STATS_FILE_H

#include <stdint.h>

#include "model/model.h"
#include "calib/stats.h"

#define M2D_STATS_MAGIC "M2DSTATS"
#define M2D_STATS_VERSION 2

/* Stats file. write: atomic. read: full validation (see above); free with m2d_calib_stats_free. */
int m2d_stats_write(const m2d_stats *s, const char *path);
int m2d_stats_read(const char *path, m2d_stats **out);
/* The same from memory: BUF[0..len) is the file's content, PATH the name in errors. */
int m2d_stats_parse(const char *path, const uint8_t *buf, size_t len, m2d_stats **out);
void m2d_calib_stats_free(m2d_stats *s); /* m2d_stats_free + free of the struct; NULL ok */
/* Error unless the stats were computed on this model (weights hash, shapes, layer set). */
int m2d_stats_check_model(const m2d_stats *s, const char *stats_path, const m2d_model *m);

#endif
