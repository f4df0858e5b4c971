# Marginal effect of each axis (paper Fig. 4 style, with PPL): for every value of an axis, the
# geometric-mean PPL over all configurations with that value (bars), their median (diamonds)
# and the best one (dots). Failed configurations are left out (their count is in the report).
# Inputs (-e): datadir.
w = 1100; h = 760
load 'plots/common.gp'
set multiplot layout 2, 2 title "Marginal effect of each axis on WikiText-2 perplexity (log scale)"
set logscale y
set style fill solid 0.8 border -1
set boxwidth 0.6
set grid ytics
set tics nomirror
set key top left font ",9"
set ylabel "perplexity"
do for [axis in "scoring grouping scaling K"] {
    set title "by " . axis
    set xtics rotate by -30 font ",9"
    plot datadir . '/marginal_' . axis . '.dat' using 0:2:xtic(1) with boxes lc rgb '#3b528b' title "geometric mean", \
         '' using 0:3 with points pt 13 ps 1.6 lc rgb '#ff7f0e' title "median", \
         '' using 0:4 with points pt 7 ps 1.4 lc rgb '#d62728' title "best"
}
unset multiplot
