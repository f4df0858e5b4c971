# Shared settings: `term` ('png' or 'svg') and `outfile` come from tools/plots.sh (-e).
if (term eq 'svg') {
    set terminal svg size w, h font "sans,11" background rgb "white"
} else {
    set terminal pngcairo size w, h font "sans,11" background rgb "white"
}
set output outfile
# perceptually uniform, colour-blind-safe (viridis anchors)
set palette defined (0 '#440154', 1 '#3b528b', 2 '#21918c', 3 '#5ec962', 4 '#fde725')
# the paper's compact PPL notation
fmt(v) = (v != v) ? "–" : v >= 999500 ? sprintf("%.1fm", v / 1e6) : v >= 99999.5 ? sprintf("%.0fk", v / 1e3) : v >= 999.95 ? sprintf("%.0f", v) : v >= 99.995 ? sprintf("%.1f", v) : sprintf("%.2f", v)
