# Pearson correlation of the experts' down projections per MoE layer (paper 001 App. I, Fig. 4),
# from `moe2dense analyze --csv`: the mean and the largest correlation over all pairs of experts.
# Inputs (-e): datafile (pearson.dat: layer mean max), subtitle.
w = 820; h = 520
load 'plots/common.gp'
set title "Pearson correlation of the experts' down projections\n{/*0.8 " . subtitle . "}"
set xlabel "layer"
set ylabel "correlation between two experts"
set grid
set key below horizontal
stats datafile using 1 nooutput
# a tick per layer (every 4th beyond 12); through a variable: "set xtics (EXPR)" would be a list
# of explicit tick positions, i.e. one tick
xstep = (STATS_max - STATS_min <= 12 ? 1 : 4)
set xtics nomirror STATS_min, xstep
set ytics nomirror
plot datafile using 1:2 with linespoints pt 7 ps 0.7 lw 1.5 lc rgb '#3b528b' title "mean over pairs", \
     '' using 1:3 with linespoints pt 7 ps 0.7 lw 1.5 lc rgb '#5ec962' title "max over pairs"
