# The Pearson correlation matrix C_ij of one layer's expert down projections (paper 001 App. I,
# Fig. 4), from `moe2dense analyze --csv --pearson-matrix`. Inputs (-e): datafile
# (pearson_matrix.dat: E rows of E numbers), layer, subtitle.
w = 700; h = 640
load 'plots/common.gp'
set title sprintf("Pearson correlation of the down projections, layer %d", layer) . "\n{/*0.8 " . subtitle . "}"
set palette defined (-1 '#3b4cc0', 0 '#f7f7f7', 1 '#b40426')
set cbrange [-1:1]
set cblabel "Pearson correlation"
set xlabel "expert j"
set ylabel "expert i"
set autoscale xfix
set autoscale yfix
set yrange [] reverse
set size square
set tics out nomirror
set key off
plot datafile matrix with image
