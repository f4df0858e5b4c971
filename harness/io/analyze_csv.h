/* analyze_csv — reads what `moe2dense analyze --csv` writes, validating every value, so that the
 * plots are drawn from data only (the numbers and names below), never from text passed on.
 *
 *   # K=8                          optional leading comment lines; "# K=N" (1 <= N <= 65536) is
 *                                  the selection size, other comments are ignored
 *   layer,metric,criterion,other,value     the header, exactly
 *   mean,erank,sf,,3.210000        layer: "mean" or a layer index; metric: one of those
 *   0,overlap,sf,pp,0.500000       `analyze --csv` writes (analyze_csv.c's METRICS table: which
 *   0,lorenz,3,,0.120000           criterion/other each takes — a criterion name [a-z0-9][a-z0-9_.+-]*
 *                                  (< 32 characters), an expert index, S(b;a;c) or nothing — and
 *                                  its value range: overlaps, mu, gini, lorenz in [0, 1], pearson
 *                                  in [-1, 1], erank >= 0 (<= K when known); an empty value (n/a)
 *                                  only for thm33_gap and calib_overlap_*, read as NaN)
 * Errors name FILE:LINE:COLUMN and the field. */
#ifndef M2D_ANALYZE_CSV_H
#define M2D_ANALYZE_CSV_H

#include <stddef.h>

typedef enum {
    M2D_AN_OVERLAP, M2D_AN_ERANK, M2D_AN_ERANK_W, M2D_AN_MU_S, M2D_AN_MU, M2D_AN_THM33_GAP,
    M2D_AN_DAMAGE_OVERLAP_25, M2D_AN_DAMAGE_OVERLAP_50, M2D_AN_CALIB_OVERLAP_25, M2D_AN_CALIB_OVERLAP_50,
    M2D_AN_GINI, M2D_AN_LORENZ, M2D_AN_PEARSON_MEAN, M2D_AN_PEARSON_MAX, M2D_AN_PEARSON,
    M2D_AN_METRIC_COUNT
} m2d_an_metric;

typedef struct {
    int layer;                  /* -1: the mean over layers */
    m2d_an_metric metric;
    char criterion[32], other[32];
    double value;
} m2d_an_row;

typedef struct {
    int K;                      /* 0 when the file has no "# K=" line */
    int n;
    m2d_an_row *rows;
} m2d_an_csv;

int m2d_an_csv_parse(const char *name, const char *text, size_t len, m2d_an_csv *out);
int m2d_an_csv_read(const char *path, m2d_an_csv *out);
void m2d_an_csv_free(m2d_an_csv *a);

#endif
