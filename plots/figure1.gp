# Paper Figure 1 at this experiment's scale: every Table 3 student's average accuracy after the same
# distillation (the paper's left panel; the teachers' own), its WikiText-2 perplexity before and
# after (log scale; the teachers' own PPL as their "before" bar), and the wall seconds of one
# optimizer step with the teacher each student was distilled from (MoE vs dense: the paper's 1.6x).
# Input (-e): datadir (report --plot-data output, with figure1.dat: label params ppl_before
# ppl_after mc_avg step_s; NaN where absent) and havemc (figure1.txt: 1 when some MC average is
# there; 0: no accuracy panel).
w = 1100; h = havemc ? 1250 : 900
load 'plots/common.gp'
set multiplot layout (havemc ? 3 : 2), 1 title "MoE-to-dense vs dense-to-dense at matched parameters"
if (havemc) {
    set style data histogram
    set style histogram cluster gap 1
    set style fill solid 0.8 border -1
    set grid ytics
    set xtics rotate by -15 font ",8"
    set title "average accuracy after distillation (teachers: their own)"
    set ylabel "MC average (%)"
    set yrange [0:*]
    plot datadir . '/figure1.dat' using ($5 * 100):xtic(1) lc rgb '#440154' title "MC average"
    set autoscale y
}
set grid ytics
set tics nomirror
set key top left font ",9" opaque
set style data histogram
set style histogram cluster gap 1
set style fill solid 0.8 border -1
set xtics rotate by -15 font ",8"
set title "WikiText-2 perplexity before and after distillation"
set logscale y
set ylabel "perplexity"
plot datadir . '/figure1.dat' using 3:xtic(1) lc rgb '#3b528b' title "before (converted / pruned)", \
     '' using 4 lc rgb '#5ec962' title "after distillation"
unset logscale y
set title "seconds per optimizer step (teacher forward + student training)"
set ylabel "s / step"
set yrange [0:*]
plot datadir . '/figure1.dat' using 6:xtic(1) lc rgb '#21918c' title "s / step"
unset multiplot
