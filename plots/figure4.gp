# Paper Figure 4: marginal effect of (a) scoring and (b) grouping on the downstream accuracy after
# distillation. Per value: the mean MC average over Table 12's students that have one (bars), the
# range of those students (min to max, whiskers at the bar's right) and their count under the value's name, the mean printed in the bar; each
# panel's title gives its spread (highest mean - lowest, in points). The y range is fitted to the
# data (bars start at the panel's floor, so compare bar tops). Input (-e): datadir (report
# --plot-data output with figure4_scoring.dat and figure4_grouping.dat: "name" mean min max n,
# percent).
w = 1100; h = 520
load 'plots/common.gp'
set multiplot layout 1, 2 title "Marginal effect of each design axis on accuracy after distillation (MC average, %)"
set style fill solid 0.8 border -1
set boxwidth 0.6
set grid ytics
set tics nomirror
set key top right font ",9" opaque
set ylabel "mean accuracy (%)"
set xtics rotate by -30 font ",9"
panel = 0
do for [axis in "scoring grouping"] {
    panel = panel + 1
    file = datadir . '/figure4_' . axis . '.dat'
    stats file using 2 nooutput
    spread = STATS_max - STATS_min
    stats file using 3 nooutput
    lo = STATS_min
    stats file using 4 nooutput
    hi = STATS_max
    pad = (hi - lo) * 0.25 + 0.5
    set yrange [lo - pad : hi + pad]
    set title sprintf("(%s) %s: spread %.2f pp", panel == 1 ? "a" : "b", axis, spread)
    plot file using 0:2:xtic(sprintf("%s (n=%d)", strcol(1), int($5))) with boxes lc rgb '#3b528b' title "mean", \
         '' using ($0 + 0.2):2:3:4 with yerrorbars pt 7 ps 0 lc rgb '#d62728' lw 1.5 title "min-max", \
         '' using 0:2:(sprintf("%.2f", $2)) with labels offset 0, -0.8 font ",9" tc rgb 'white' notitle
}
unset multiplot
