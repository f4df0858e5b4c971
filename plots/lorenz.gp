# Lorenz curves of the experts' activation rates n_e / N, one per MoE layer coloured by its index
# (paper 001 App. L, Fig. 5), from `moe2dense analyze --csv`: the further below the diagonal, the
# more unequal the use of the experts (Gini = twice the area between the curve and the diagonal).
# Inputs (-e): datafile (lorenz.dat: x y layer, one block per layer), nblocks, meangini, firstlayer,
# lastlayer, subtitle (all written and checked by tools/plots.sh).
w = 760; h = 640
load 'plots/common.gp'
set title sprintf("Lorenz curves of expert activations (mean Gini %.3f over %d MoE layers)", meangini, nblocks) . "\n{/*0.8 " . subtitle . "}"
set xlabel "fraction of experts (least used first)"
set ylabel "share of all activations"
set xrange [0:1]
set yrange [0:1]
set size square
set grid
set key top left
set cbrange [firstlayer:(lastlayer > firstlayer ? lastlayer : firstlayer + 1)]
set cblabel "layer"
# a tick per layer (every 5th beyond 10 layers); a parenthesised expression after cbtics would be
# read as a list of explicit tick positions (one tick), so the step goes through a variable
cbstep = (lastlayer - firstlayer <= 10 ? 1 : 5)
set cbtics firstlayer, cbstep
plot for [b=0:nblocks-1] datafile index b using 1:2:3 with lines lw 1.3 lc palette notitle, \
     x with lines dt 2 lw 1.2 lc rgb 'gray40' title "equal use (Gini 0)"
