/* analyze_csv — reads what `moe2dense analyze --csv` writes, validating every value, so that the
 * plots are drawn from data only (the numbers and names below), never from text passed on.
 *
 *   # K=8                          optional leading comment lines; "# K=N" (1 <= N <= 65536) is
 *                                  the selection size, other comments are ignored
 *   layer,metric,criterion,other,value     the header, exactly
 *   mean,erank,sf,,3.210000        layer: "mean" or a layer index; then per metric:
 *   0,overlap,sf,pp,0.500000
 *     metric            criterion              other        value
 *     overlap           name                   name         [0, 1]
 *     erank erank_w     name                   empty        >= 0 (<= K when known)
 *     mu                empty or name          empty        [0, 1]
 *     mu_S              name                   empty        [0, 1]
 *     thm33_gap         empty                  empty        >= 0, or empty (n/a)
 *     damage_overlap_25 damage_overlap_50      empty        empty        [0, 1]
 *     calib_overlap_25 calib_overlap_50   S(b;a;c) (b 0-1, a c 0-2)   empty   [0, 1], or empty (n/a)
 *     gini              empty                  empty        [0, 1]
 *     pearson_mean pearson_max   empty         empty        [-1, 1]
 *     lorenz            expert count i         empty        [0, 1] (share of the i least used)
 *     pearson           expert index i         index j      [-1, 1]
 *   names: [a-z0-9][a-z0-9_.+-]* (< 32 characters); indices: up to 6 digits.
 * Errors name FILE:LINE:COLUMN and the field. */
#ifndef M2D_ANALYZE_CSV_H
#define M2D_ANALYZE_CSV_H

#include <stddef.h>

typedef enum {
    M2D_AN_OVERLAP, M2D_AN_ERANK, M2D_AN_ERANK_W, M2D_AN_MU, M2D_AN_MU_S, M2D_AN_THM33_GAP, M2D_AN_DAMAGE_25,
    M2D_AN_DAMAGE_50, M2D_AN_CALIB_25, M2D_AN_CALIB_50, M2D_AN_GINI, M2D_AN_PEARSON_MEAN, M2D_AN_PEARSON_MAX,
    M2D_AN_LORENZ, M2D_AN_PEARSON
} m2d_an_metric;

typedef struct {
    int layer;                  /* -1: the mean over layers */
    m2d_an_metric metric;
    char criterion[32], other[32];
    int i, j;                   /* lorenz: i; pearson: i, j (the criterion and other as numbers); else -1 */
    double value;               /* NaN where the file says n/a (an empty value, where allowed) */
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
