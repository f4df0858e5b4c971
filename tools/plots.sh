#!/bin/sh
# make plots: render plots/*.gp into plots/*.png and plots/*.svg.
#   RESULTS  sweep CSV (default results/demo.csv)        -> heatmap_<scoring>, marginal, distill
#            (distill: when the sweep had a distillation stage), figure4 (when its distilled
#            students have MC accuracies: report --figure 4), figure1 (when it had D2D
#            candidates: the MoE-to-dense vs dense-to-dense comparison, report --table 3), figure7
#            (when its per-scoring K = k / 2k students were distilled and scored: report --figure 7)
#   ANALYZE  `moe2dense analyze --csv` output (default results/demo-analyze.csv, optional)
#            -> overlap, erank; lorenz and pearson (paper 001) when the file has their rows;
#            pearson_matrix with `analyze --pearson-matrix`
#   PLOTS_DIR output directory (default plots), M2D_BIN the binary (default ./moe2dense)
#
# Data never becomes code: every data file is read and validated by `moe2dense report` (rows,
# names, numbers; the analyze file's "# K=" line), which writes plain data files for gnuplot.
# The only values spliced into gnuplot commands are checked here once more: plugin-style names,
# display names from a fixed character set, integers, decimal numbers, the analyze file's base
# name (or a fixed text) and the output paths
# (no quotes, backslashes or control characters). Anything else stops the script.
# Plots are rendered into a temporary directory inside PLOTS_DIR and renamed into place; an
# existing symbolic link at a plot's path is refused, not followed.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
csv=${RESULTS:-results/demo.csv}
analyze=${ANALYZE:-results/demo-analyze.csv}
out=${PLOTS_DIR:-plots}
bin=${M2D_BIN:-./moe2dense}
die() { echo "plots: $*" >&2; exit 1; }
command -v gnuplot >/dev/null || die "gnuplot not found (apt-get install gnuplot-nox)"
[ -f "$csv" ] || die "$csv not found (run 'make demo', or RESULTS=path/to.csv make plots)"

nl='
'
# a path that may appear inside a single-quoted gnuplot string
safe_path() {
  case "$1" in *"'"*|*\\*|*"$nl"*|*[[:cntrl:]]*) return 1 ;; esac
}
is_name() { # plugin-style name, as the results validator requires
  case "$1" in ''|[!a-z0-9]*|*[!a-z0-9_.+-]*) return 1 ;; esac
}
is_display() { # display names from the plugin registrations
  case "$1" in ''|*[!A-Za-z0-9\ _.+\(\)/,-]*) return 1 ;; esac
}
is_int() { case "$1" in ''|*[!0-9]*) return 1 ;; esac; }
is_number() { # decimal, as %.6g writes it
  printf '%s\n' "$1" | grep -Eq '^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$'
}

mkdir -p "$out"
out=$(cd "$out" && pwd)
safe_path "$out" || die "PLOTS_DIR '$out' holds a quote, backslash or control character; choose another directory"
tmp=$(mktemp -d "$out/.plots-tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
data="$tmp/data"
mkdir "$data"
if [ -f "$analyze" ]; then
  "$bin" report "$csv" --plot-data "$data" --analyze "$analyze" >/dev/null
else
  "$bin" report "$csv" --plot-data "$data" >/dev/null
fi
read -r lo hi < "$data/range.txt"
is_number "$lo" && is_number "$hi" || die "$data/range.txt: not two numbers"

made=""
render() { # script outfile-stem extra-gnuplot-assignments
  for term in png svg; do
    (cd "$here" && gnuplot -e "term='$term'; outfile='$tmp/$2.$term'; $3" "plots/$1")
    dest="$out/$2.$term"
    [ -L "$dest" ] && die "$dest is a symbolic link; refusing to replace it"
    mv -f "$tmp/$2.$term" "$dest"
  done
  made="$made $out/$2.png"
}
tab=$(printf '\t')
while IFS="$tab" read -r s name; do
  is_name "$s" || die "$data/scorings.txt: '$s' is not a plugin-style name"
  is_display "$name" || die "$data/scorings.txt: display name '$name' has characters outside [A-Za-z0-9 _.+()/,-]"
  render heatmap.gp "heatmap_$s" "datadir='$data'; scoring='$s'; title='$name'; cblo=$lo; cbhi=$hi"
done < "$data/scorings.txt"
if [ -s "$data/scorings.txt" ]; then
  render marginal.gp marginal "datadir='$data'"
else # an MoE-only grid: its students are in the report's MoE section, not in these plots
  echo "plots: $csv holds no dense students: no heat maps or marginals"
fi
if [ -f "$data/distill_curves.txt" ]; then # the sweep had a distillation stage
  read -r nloss nval < "$data/distill_curves.txt"
  is_int "$nloss" && is_int "$nval" || die "$data/distill_curves.txt: not two integers"
  render distill.gp distill "datadir='$data'; nloss=$nloss; nval=$nval"
fi
if [ -f "$data/figure4_scoring.dat" ]; then # post-distillation accuracies: report --figure 4
  render figure4.gp figure4 "datadir='$data'"
fi
if [ -f "$data/figure7.dat" ]; then # per scoring at K = k and 2k, distilled and scored: report --figure 7
  read -r kk k2 haverandom randomacc lo hi havek have2k < "$data/figure7.txt"
  is_int "$kk" && is_int "$k2" && is_int "$haverandom" && is_number "$randomacc" && is_number "$lo" && is_number "$hi" \
    && is_int "$havek" && is_int "$have2k" || die "$data/figure7.txt: not K 2K HAVE_RANDOM RANDOM_AVG LO HI HAVE_K HAVE_2K"
  render figure7.gp figure7 "datadir='$data'; kk=$kk; k2=$k2; haverandom=$haverandom; randomacc=$randomacc; lo=$lo; hi=$hi; havek=$havek; have2k=$have2k"
fi
if [ -f "$data/figure1.dat" ]; then # the sweep had D2D candidates ([d2d]): report --table 3
  read -r havemc < "$data/figure1.txt"
  is_int "$havemc" || die "$data/figure1.txt: not HAVE_MC"
  render figure1.gp figure1 "datadir='$data'; havemc=$havemc"
fi
if [ -f "$analyze" ]; then
  # K: from the analyze file's "# K=N" line (tools/demo.sh writes it) or $ANALYZE_K; else not drawn
  read -r K haveK < "$data/analyze.txt"
  if [ -n "${ANALYZE_K:-}" ]; then K=$ANALYZE_K; haveK=1; fi
  is_int "$K" && is_int "$haveK" || die "K '$K' is not an integer (ANALYZE_K or the analyze file's '# K=' line)"
  base=$(basename "$analyze")
  case "$base" in *[!A-Za-z0-9._-]*) base="the analyze file" ;; esac
  if [ "$haveK" = 1 ]; then sub="$base, K = $K, mean over MoE layers"
  else sub="$base, mean over MoE layers (K not recorded: set ANALYZE_K)"; fi
  render overlap.gp overlap "matrix='$data/overlap.dat'; subtitle='$sub'"
  render erank.gp erank "table='$data/erank.dat'; maxrank=$K; haveK=$haveK; subtitle='$sub'"
  # paper 001's condenser analyses (analyze writes them with every --csv)
  read -r nb gini first last < "$data/lorenz.txt"
  is_int "$nb" && is_number "$gini" && is_int "$first" && is_int "$last" \
    || die "$data/lorenz.txt: not BLOCKS MEAN_GINI FIRST_LAYER LAST_LAYER"
  if [ "$nb" -gt 0 ]; then
    render lorenz.gp lorenz "datafile='$data/lorenz.dat'; nblocks=$nb; meangini=$gini; firstlayer=$first; lastlayer=$last; subtitle='$base'"
  fi
  read -r nl havem mlayer < "$data/pearson.txt"
  is_int "$nl" && is_int "$havem" && is_int "$mlayer" || die "$data/pearson.txt: not LAYERS HAVE_MATRIX MATRIX_LAYER"
  if [ "$nl" -gt 0 ]; then
    render pearson.gp pearson "datafile='$data/pearson.dat'; subtitle='$base'"
  fi
  if [ "$havem" = 1 ]; then
    render pearson_matrix.gp pearson_matrix "datafile='$data/pearson_matrix.dat'; layer=$mlayer; subtitle='$base'"
  fi
else
  echo "plots: $analyze not found: skipping overlap and erank (moe2dense analyze --csv > $analyze)"
fi
echo "plots:$made (and .svg)"
