#!/bin/sh
# make plots: render plots/*.gp into plots/*.png and plots/*.svg.
#   RESULTS  sweep CSV (default results/demo.csv)        -> heatmap_<scoring>, marginal, distill
#            (distill: when the sweep had a distillation stage)
#   ANALYZE  `moe2dense analyze --csv` output (default results/demo-analyze.csv, optional)
#            -> overlap, erank
#   PLOTS_DIR output directory (default plots), M2D_BIN the binary (default ./moe2dense)
set -eu
csv=${RESULTS:-results/demo.csv}
analyze=${ANALYZE:-results/demo-analyze.csv}
out=${PLOTS_DIR:-plots}
bin=${M2D_BIN:-./moe2dense}
command -v gnuplot >/dev/null || { echo "plots: gnuplot not found (apt-get install gnuplot-nox)" >&2; exit 1; }
[ -f "$csv" ] || { echo "plots: $csv not found (run 'make demo', or RESULTS=path/to.csv make plots)" >&2; exit 1; }
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bin" report "$csv" --plot-data "$tmp" >/dev/null
read -r lo hi < "$tmp/range.txt"
made=""
render() { # script outfile-stem extra-gnuplot-assignments
  for term in png svg; do
    gnuplot -e "term='$term'; outfile='$out/$2.$term'; $3" "$1"
  done
  made="$made $out/$2.png"
}
tab=$(printf '\t')
while IFS="$tab" read -r s name; do
  render plots/heatmap.gp "heatmap_$s" "datadir='$tmp'; scoring='$s'; title='$name'; cblo=$lo; cbhi=$hi"
done < "$tmp/scorings.txt"
render plots/marginal.gp marginal "datadir='$tmp'"
if [ -f "$tmp/distill_curves.txt" ]; then # the sweep had a distillation stage
  read -r nloss nval < "$tmp/distill_curves.txt"
  render plots/distill.gp distill "datadir='$tmp'; nloss=$((nloss + 0)); nval=$((nval + 0))"
fi
if [ -f "$analyze" ]; then
  # overlap matrix (mean over layers) and erank table from the analyze CSV
  awk -F, '$1=="mean" && $2=="overlap" { if (!($3 in seen)) { seen[$3]=1; order[n++]=$3 } v[$3","$4]=$5 }
           END { printf "x"; for (i=0;i<n;i++) printf " %s", order[i]; printf "\n";
                 for (i=0;i<n;i++) { printf "%s", order[i]; for (j=0;j<n;j++) printf " %s", v[order[i]","order[j]]; printf "\n" } }' \
      "$analyze" > "$tmp/overlap.dat"
  awk -F, '$1=="mean" && ($2=="erank" || $2=="erank_w") { if (!($3 in seen)) { seen[$3]=1; order[n++]=$3 } v[$3","$2]=$5 }
           END { for (i=0;i<n;i++) printf "%s %s %s\n", order[i], v[order[i]",erank"], v[order[i]",erank_w"] }' \
      "$analyze" > "$tmp/erank.dat"
  # K: from a leading "# K=N" line (tools/demo.sh writes it) or $ANALYZE_K; else not drawn
  K=${ANALYZE_K:-$(sed -n 's/^# K=//p' "$analyze" | head -1)}
  if [ -n "$K" ]; then haveK=1; sub="$(basename "$analyze"), K = $K, mean over MoE layers"
  else haveK=0; K=$(awk '{ if ($2 > m) m = $2 } END { printf "%d", m + 1 }' "$tmp/erank.dat")
       sub="$(basename "$analyze"), mean over MoE layers (K not recorded: set ANALYZE_K)"; fi
  render plots/overlap.gp overlap "matrix='$tmp/overlap.dat'; subtitle='$sub'"
  render plots/erank.gp erank "table='$tmp/erank.dat'; maxrank=$K; haveK=$haveK; subtitle='$sub'"
else
  echo "plots: $analyze not found: skipping overlap and erank (moe2dense analyze --csv > $analyze)"
fi
echo "plots:$made (and .svg)"
