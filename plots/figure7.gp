# Paper Figure 7 (one panel: one teacher, one results file): post-distillation accuracy (MC average)
# by scoring method and K. Green bars: pure pruning (K = k, one expert per slot); coral bars:
# merging (K = 2k, two experts averaged per slot); dashed line: the random-FFN baseline. Per
# scoring and K the student with the lowest pre-distillation PPL (report --table 16 / --figure 7).
# Input (-e): datadir (report --plot-data output with figure7.dat: "name" avg_K=k avg_K=2k, percent,
# NaN where absent), kk, k2 (the two K), haverandom (0/1), randomacc (percent), the smallest and
# largest value drawn, lo and hi, and whether each K has a bar, havek and have2k, from figure7.txt.
w = 900; h = 520
load 'plots/common.gp'
file = datadir . '/figure7.dat'
set title sprintf("Cross-model validation: accuracy after distillation by scoring and K (k = %d)", kk)
set style data histogram
set style histogram cluster gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set grid ytics
set tics nomirror
set key top right font ",9" opaque
set ylabel "MC average after distillation (%)"
set xtics font ",9"
pad = (hi - lo) * 0.25 + 0.5
set yrange [lo - pad : hi + pad]
if (haverandom) {
    set arrow 1 from graph 0, first randomacc to graph 1, first randomacc nohead dt 2 lw 2 lc rgb '#444444' front
}
# a bar series without a number stops gnuplot ("No valid points"): only the K that have one
prune = sprintf("K = %d (pure pruning)", kk); merge = sprintf("K = %d (merging)", k2)
rnd = haverandom ? sprintf("Random FFN (%.2f %%)", randomacc) : "Random FFN: not measured"
if (havek && have2k) {
    plot file using 2:xtic(1) lc rgb '#5ec962' title prune, '' using 3 lc rgb '#ff7f50' title merge, \
         NaN with lines dt 2 lw 2 lc rgb '#444444' title rnd
} else {
    if (havek) {
        plot file using 2:xtic(1) lc rgb '#5ec962' title prune, NaN with lines dt 2 lw 2 lc rgb '#444444' title rnd
    } else {
        plot file using 3:xtic(1) lc rgb '#ff7f50' title merge, NaN with lines dt 2 lw 2 lc rgb '#444444' title rnd
    }
}
