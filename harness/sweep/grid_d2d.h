/* grid_d2d — an experiment's [experiment.NAME.d2d] block (the dense-to-dense baseline, sweep_d2d.h):
 *
 *   teacher     the dense teacher the candidates are pruned from and the D2D student is distilled
 *               with (a directory; required)
 *   candidates  non-empty list of shape specs ("L4-H192-F576-A6/2"; convert/prune.h), each once
 *   data, seq_len, samples, seed   the importance calibration (default: [calibration]'s values)
 *
 * Each candidate becomes one configuration appended to the grid after the axes' configurations
 * (include/exclude rules do not apply to them): scoring "d2d", grouping and scaling "none",
 * K_expr "k", params "shape=SPEC", target "d2d". Errors name FILE:LINE:COL and the field. */
#ifndef M2D_GRID_D2D_H
#define M2D_GRID_D2D_H

#include "sweep/grid.h"

/* Read X's [d2d] (absent: nothing to do) into X's d2d fields and its grid. -1 + m2d_err. */
int m2d_grid_d2d_read(m2d_experiment *x);

#endif
