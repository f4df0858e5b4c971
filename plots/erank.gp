# Effective rank of the selected experts' output Gram (paper Fig. 3), mean over MoE layers, from
# `moe2dense analyze --csv`: erank of G_S / N and of the importance-weighted kernel.
# Inputs (-e): table (criterion erank erank_w), maxrank (= K; drawn as a dashed line when
# haveK = 1), subtitle.
w = 820; h = 560
load 'plots/common.gp'
set title "Effective rank of the selected experts (higher = more diverse)\n{/*0.8 " . subtitle . "}"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set yrange [0:maxrank * 1.12]
set key below horizontal
set ylabel "effective rank (max K)"
set grid ytics
set tics nomirror
set xtics rotate by -30
plot table using 2:xtic(1) title "erank of G_S / N" lc rgb '#3b528b', \
     '' using 3 title "erank of importance-weighted kernel" lc rgb '#5ec962', \
     (haveK ? maxrank : NaN) with lines dt 2 lw 1.5 lc rgb 'gray40' title (haveK ? "K (the maximum)" : "")
