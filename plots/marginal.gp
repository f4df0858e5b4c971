# Marginal effect of each axis (paper Fig. 4 style, with PPL): for every value of an axis, the
# geometric-mean PPL over all configurations with that value (bars), their median (diamonds)
# and the best one (dots). Failed configurations are left out (their count is in the report).
# Each panel's log y range is fitted to its data (bars start at the panel's floor, so compare
# bar tops, not bar areas). Inputs (-e): datadir.
w = 1100; h = 760
load 'plots/common.gp'
set multiplot layout 2, 2 title "Marginal effect of each axis on WikiText-2 perplexity (log scale)"
set logscale y
set style fill solid 0.8 border -1
set boxwidth 0.6
set grid ytics
set tics nomirror
set key top left font ",9" opaque
set ylabel "perplexity"
do for [axis in "scoring grouping scaling K"] {
    file = datadir . '/marginal_' . axis . '.dat'
    stats file using 4 nooutput
    lo = STATS_min
    stats file using 2 nooutput
    hi = STATS_max
    stats file using 3 nooutput
    hi = (STATS_max > hi ? STATS_max : hi)
    ymin = lo / 1.15; ymax = hi * 1.6
    set yrange [ymin:ymax]
    set ytics () format ""
    do for [e = floor(log10(ymin)) : ceil(log10(ymax))] {
        do for [m in "1 1.5 2 3 5 7"] {
            v = m * 10.0**e
            if (v >= ymin && v <= ymax) { set ytics add (fmt(v) v) }
        }
    }
    set title "by " . axis
    set xtics rotate by -30 font ",9"
    plot file using 0:2:xtic(1) with boxes lc rgb '#3b528b' title "geometric mean", \
         '' using 0:3 with points pt 13 ps 1.6 lc rgb '#ff7f0e' title "median", \
         '' using 0:4 with points pt 7 ps 1.4 lc rgb '#d62728' title "best"
}
unset multiplot
