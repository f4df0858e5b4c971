/* report_usage — plot data of the condenser-expert analyses of paper 001 that `moe2dense analyze
 * --csv` writes (validated by io/analyze_csv.h: numbers and indices only reach these files):
 *
 *  - lorenz.dat: the Lorenz curve of each MoE layer's expert activation rates (App. L, Fig. 5),
 *    one gnuplot block (`index`) per layer, lines "x y layer": x = i/E the fraction of experts
 *    (least used first), y the share of all activations they hold; lorenz.txt:
 *    "BLOCKS MEAN_GINI FIRST_LAYER LAST_LAYER" (BLOCKS 0: the file has no Lorenz rows);
 *  - pearson.dat: per layer "layer mean max" of the off-diagonal Pearson correlation of the
 *    experts' down projections (App. I, Fig. 4); with `analyze --pearson-matrix`, pearson_matrix.dat:
 *    the E x E matrix C_ij of the first layer that has one (plain numbers, NaN where absent);
 *    pearson.txt: "LAYERS HAVE_MATRIX MATRIX_LAYER". */
#ifndef M2D_REPORT_USAGE_H
#define M2D_REPORT_USAGE_H

#include "io/analyze_csv.h"

int m2d_report_usage_plot_data(const m2d_an_csv *a, const char *dir);

#endif
