/* report_moe — what `moe2dense report` shows of a sweep's MoE students (rows with target = moe:
 * a smaller MoE at a fraction `ratio` of each layer's routed experts removed, K = experts kept,
 * routing `top_k` experts per token; papers 001 §2 (iii), 002, 003).
 *
 * The dense table has no place for them (their scaling is "none" and their K follows from the
 * ratio), so they get their own section: one row per method (scoring x grouping, x params when
 * any is set), one column per (ratio, top-k) — ratios ascending, top-k descending — with the
 * experts kept in the column's title; the WikiText-2 PPL, then, when the sweep had an MC stage
 * and some MoE student was evaluated on it, the MC average (%). Bold: the best method of each
 * column (lowest PPL, highest MC); "–" (tex "--"): a failed configuration; empty: not in the
 * file. */
#ifndef M2D_REPORT_MOE_H
#define M2D_REPORT_MOE_H

#include <stdio.h>

#include "io/results.h"
#include "sweep/report_table.h"

/* 1 when row I of R is an MoE student (a "target" column saying moe). */
int m2d_report_is_moe_row(const m2d_results *r, int i);
/* The MoE section (md or tex); nothing when R has no MoE student or FMT is csv. */
int m2d_report_moe_write(const m2d_results *r, m2d_report_format fmt, FILE *f);

#endif
