/* analyze_csv — reads what `moe2dense analyze --csv` writes, validating every value, so that the
 * plots are drawn from data only (the numbers and names below), never from text passed on.
 *
 *   # K=8                          optional leading comment lines; "# K=N" (1 <= N <= 65536) is
 *                                  the selection size, other comments are ignored
 *   layer,metric,criterion,other,value     the header, exactly
 *   mean,erank,sf,,3.210000        layer: "mean" or a layer index; metric: overlap (other = a
 *   0,overlap,sf,pp,0.500000       second criterion), erank, erank_w, mu (other empty);
 *                                  criterion names [a-z0-9][a-z0-9_.+-]* (< 32 characters);
 *                                  value: overlap and mu in [0, 1], erank >= 0 (<= K when known)
 * Errors name FILE:LINE:COLUMN and the field. */
#ifndef M2D_ANALYZE_CSV_H
#define M2D_ANALYZE_CSV_H

#include <stddef.h>

typedef enum { M2D_AN_OVERLAP, M2D_AN_ERANK, M2D_AN_ERANK_W, M2D_AN_MU } m2d_an_metric;

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
