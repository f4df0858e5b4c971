# Selection overlap |S_a ∩ S_b| / K between criteria, averaged over MoE layers (paper Fig. 2),
# from `moe2dense analyze --csv`. Input (-e): matrix (written by tools/plots.sh), subtitle.
w = 760; h = 640
load 'plots/common.gp'
set title "Selection overlap between criteria\n{/*0.8 " . subtitle . "}"
set cbrange [0:1]
set cblabel "overlap |S_a ∩ S_b| / K"
set yrange [] reverse
set xtics rotate by -30
set tics nomirror out
set key off
plot matrix matrix rowheaders columnheaders using 1:2:3 with image, \
     matrix matrix rowheaders columnheaders using 1:2:(sprintf("%.2f", $3)):($3 > 0.6 ? 0x000000 : 0xffffff) with labels font ",9" tc rgb variable
