# Distillation (paper Figure 5 style): WikiText-2 perplexity of each distilled student before and
# after distillation (bars, log scale), the training loss (KD loss per optimizer step) and, when
# the runs validated (distill.eval_every), the validation cross-entropy against tokens seen.
# Inputs (-e): datadir (report --plot-data output), nloss, nval (block counts of
# distill_loss.dat and distill_val.dat). Titles come from the data files (columnheader).
w = 1100; h = (nval > 0 ? 1100 : 760)
load 'plots/common.gp'
set multiplot layout (nval > 0 ? 3 : 2), 1 title "Distillation"
set grid ytics
set tics nomirror
set key top right font ",9" opaque
set title "WikiText-2 perplexity before and after distillation"
set logscale y
set ylabel "perplexity"
set style data histogram
set style histogram cluster gap 1
set style fill solid 0.8 border -1
set xtics rotate by -20 font ",8"
plot datadir . '/distill.dat' using 2:xtic(1) lc rgb '#3b528b' title "converted", \
     '' using 3 lc rgb '#5ec962' title "distilled"
unset logscale y
set style data lines
set xtics norotate font ",9"
set xlabel "tokens"
set title "training loss (KD loss of each step)"
set ylabel "loss"
if (nloss > 0) {
    plot for [i = 0:nloss - 1] datadir . '/distill_loss.dat' index i using 1:2 with lines lw 1.5 title columnheader(1)
}
if (nval > 0) {
    set title "validation cross-entropy (WikiText-2)"
    set ylabel "CE (nats/token)"
    plot for [i = 0:nval - 1] datadir . '/distill_val.dat' index i using 1:2 with linespoints pt 7 ps 0.6 lw 1.5 title columnheader(1)
}
unset multiplot
