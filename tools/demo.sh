#!/bin/sh
# make demo: the `demo` experiment end to end on the tiny teacher (../shared/models/tiny-qwen3moe):
# calibrate (cached) -> sweep (280 configurations, then distillation of 3 of them) -> report ->
# analyze -> plots.
# Outputs: results/demo.csv, results/demo.md, results/demo.tex, results/demo-analyze.csv, plots/*.png|svg.
# DEMO_ARGS adds sweep options (e.g. DEMO_ARGS="--jobs 2 --threads 1").
set -eu
bin=${M2D_BIN:-./moe2dense}
csv=results/demo.csv
now() { date +%s.%N; }
t0=$(now)
mkdir -p results
# a pipeline's status is its last command's (no pipefail in sh): the sweep's own is kept in a file
rc=$(mktemp results/.demo-rc.XXXXXX)
checked() { s=0; "$@" || s=$?; echo "$s" > "$rc"; } # "$@" inside a pipeline, its exit status kept
status() { s=$(cat "$rc"); [ "$s" = 0 ] || { echo "demo: $1 failed (exit $s)" >&2; rm -f "$rc"; exit 1; }; }
echo "demo: grid (dry run)"
{ checked "$bin" sweep experiments.toml --experiment demo --dry-run; } | sed -n '/^configurations/,$p'
status "sweep --dry-run"
echo "demo: sweep (resumes if $csv exists; remove it to start over)"
{ checked "$bin" sweep experiments.toml --experiment demo --out "$csv" ${DEMO_ARGS:-}; } | tee results/demo-sweep.log
status sweep
rm -f "$rc"
t1=$(now)
"$bin" report "$csv" --out results/demo.md
"$bin" report "$csv" --format tex --out results/demo.tex
# the statistics the sweep cached: results/cache/<model_hash[:16]>-<calib_hash[:16]>.m2dstats
mh=$(sed -n 's/^# model_hash=//p' "$csv" | cut -c1-16)
ch=$(sed -n 's/^# calib_hash=//p' "$csv" | cut -c1-16)
stats="results/cache/$mh-$ch.m2dstats"
model=$(sed -n 's/^# model=//p' "$csv")
k=$(sed -n 's/.*"num_experts_per_tok": *\([0-9]*\).*/\1/p' "$model/config.json")
# written to a fresh file (mktemp: O_EXCL) and renamed over the output: a symlink planted at
# results/demo-analyze.csv is replaced, never followed (mv -T: not moved into a linked directory)
an_tmp=$(mktemp results/.demo-analyze.XXXXXX)
chmod 644 "$an_tmp"
{ echo "# K=$k"; "$bin" analyze --stats "$stats" --model "$model" --criteria sf,pp,ps,cp,acp,do-cp,do-acp --csv --pearson-matrix; } \
  > "$an_tmp" || { rm -f "$an_tmp"; exit 1; }
mv -fT "$an_tmp" results/demo-analyze.csv
sh tools/plots.sh
t2=$(now)
awk -v t0="$t0" -v t1="$t1" -v t2="$t2" 'BEGIN { printf "demo: %.1f s in all (sweep incl. calibration %.1f s, report+analyze+plots %.1f s)\n", t2 - t0, t1 - t0, t2 - t1 }'
# the distillation stage's time (sweep line "distilled now in X s") is work, not overhead
dist=$(sed -n 's/.* distilled now in \([0-9.]*\) s.*/\1/p' results/demo-sweep.log)
sed -n 's/.* \([0-9.]*\) s wall: \([0-9.]*\) s prepare.*, \([0-9.]*\) s in build+evaluate.*/\1 \2 \3/p' results/demo-sweep.log |
  awk -v d="${dist:-0}" '{ if ($1 > 0) printf "demo: sweep overhead (not calibration/preparation, build+evaluate or distillation): %.2f s = %.1f%% of the sweep wall time\n", $1 - $2 - $3 - d, 100 * ($1 - $2 - $3 - d) / $1 }'
[ -n "$dist" ] && echo "demo: distillation stage $dist s (3 students, PPL before/after in results/demo.md)"
echo "demo: table  results/demo.md (LaTeX: results/demo.tex), raw results $csv"
echo "demo: plots  plots/heatmap_*.png, plots/marginal.png, plots/distill.png, plots/overlap.png, plots/erank.png,"
echo "             plots/lorenz.png, plots/pearson.png, plots/pearson_matrix.png (and .svg of each)"
