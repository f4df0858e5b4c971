# PPL grid of one scoring: rows grouping/scaling, columns K; log colour scale shared by all
# scorings (cblo..cbhi) so the panels compare; the best K of each row is framed.
# Inputs (-e): datadir, scoring, title, cblo, cbhi.
w = 780; h = 560
load 'plots/common.gp'
set title sprintf("%s — WikiText-2 perplexity (lower is better; frame: best K per row)", title)
set xlabel "K (experts selected per layer)"
set ylabel "grouping / scaling"
set cblabel "perplexity (log scale)"
set logscale cb
set cbrange [cblo:cbhi]
# colour-bar tics at 1, 2, 5 x 10^n inside the range (gnuplot's log tics alone can leave one tic)
set cbtics () format ""
do for [e = floor(log10(cblo)) : ceil(log10(cbhi))] {
    do for [m in "1 2 5"] {
        v = m * 10.0**e
        if (v >= cblo && v <= cbhi) { set cbtics add (fmt(v) v) }
    }
}
set cbtics add (fmt(cblo) cblo, fmt(cbhi) cbhi)
set yrange [] reverse
set tics nomirror out
set key off
set datafile missing "NaN"
file = datadir . '/heat_' . scoring . '.dat'
# dark text on the bright (high) end of the palette, white on the dark end
t(v) = (log(v) - log(cblo)) / (log(cbhi) - log(cblo) + 1e-300)
tc(v) = (v != v) ? 0 : (t(v) > 0.55 ? 0x000000 : 0xffffff)
plot file matrix rowheaders columnheaders using 1:2:3 with image, \
     file matrix rowheaders columnheaders using 1:2:(fmt($3)):(tc($3)) with labels font ",9" tc rgb variable, \
     datadir . '/best_' . scoring . '.dat' using 1:2 with points pt 4 ps 6.5 lw 2.5 lc rgb '#d62728'
