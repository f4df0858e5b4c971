#!/bin/sh
# realsize.sh — a checkpoint of Qwen3-30B-A3B's full shape (48 layers, 61 GB of bf16 in release-style
# shards, random weights) made at benchmark time and taken through inspect -> calibrate -> convert ->
# ppl -> eval, the teacher's passes layer-major and window-major (issue 25). Nothing is committed: the
# checkpoint and the outputs stay under WORK.
#
#   sh bench/realsize.sh WORK [LAYERS]     (LAYERS default 48; WORK needs 61 GB + 7 GB free at 48)
#
# Each step runs under /usr/bin/time: wall seconds, peak RSS (%M) and the blocks read from storage
# (%I, getrusage's ru_inblock in 512-byte units: page-cache misses of read() and of the mapped
# weights' faults, the bytes a pass really pulls from disk). One TSV line a step in WORK/realsize.tsv.
# The page cache cannot be dropped without privileges, so a step may find some of the previous
# step's pages cached: with 61 GB of weights and RAM under half of that, most of each pass is read.
set -eu
WORK=${1:?usage: sh bench/realsize.sh WORK [LAYERS]}
LAYERS=${2:-48}
BIN=./build/moe2dense
CKPT=$WORK/qwen3-30b-a3b-shape
DATA_CAL=data/train-text/wikitext-103-train-prefix/wiki.train.tokens
DATA_PPL=data/wikitext-2-raw/wikitext-2-raw/wiki.test.raw
TOKENIZER=${M2D_TOKENIZER:-../shared/models/qwen3-tokenizer}
TSV=$WORK/realsize.tsv
mkdir -p "$WORK"

# STEP PASS CMD...: one line "step pass wall_s peak_rss_gib read_gb rc"; the command's output in WORK/STEP.log
measure() {
    step=$1 pass=$2
    shift 2
    /usr/bin/time -o "$WORK/$step.time" -f "%e %M %I" "$@" > "$WORK/$step.log" 2>&1 && rc=0 || rc=$?
    read -r wall rss_kb inblocks < "$WORK/$step.time"
    line=$(awk -v s="$step" -v p="$pass" -v w="$wall" -v r="$rss_kb" -v b="$inblocks" -v rc="$rc" \
        'BEGIN { printf "%s\t%s\t%.1f\t%.2f\t%.1f\t%d", s, p, w, r / 1048576, b * 512 / 1e9, rc }')
    echo "$line" | tee -a "$TSV"
    [ "$rc" -eq 0 ] || { echo "realsize: $step failed (exit $rc), see $WORK/$step.log" >&2; exit 1; }
}

lscpu | awk -F: '/Model name|^CPU\(s\)/ { gsub(/^ +/, "", $2); printf "%s: %s\n", $1, $2 }'
awk '/MemTotal/ { printf "RAM: %.1f GiB\n", $2 / 1048576 }' /proc/meminfo
if [ ! -f "$CKPT/model.safetensors.index.json" ]; then
    measure write - ./build/bench/bench_engine write "$CKPT" qwen3-30b "$LAYERS"
    cp "$TOKENIZER/tokenizer.json" "$TOKENIZER/tokenizer_config.json" "$CKPT/"
fi
du -sh "$CKPT"
printf 'step\tpass\twall_s\tpeak_rss_gib\tread_gb\trc\n' >> "$TSV"

measure inspect - $BIN inspect --model "$CKPT"
for pass in layer window; do
    measure calibrate-$pass $pass $BIN calibrate --model "$CKPT" --data "$DATA_CAL" --samples 2 --seq-len 128 \
        --pass $pass --force --out "$WORK/teacher-$pass.stats"
done
cmp "$WORK/teacher-layer.stats" "$WORK/teacher-window.stats" && echo "calibration: layer-major stats = window-major, byte for byte" || { echo "calibration: layer-major stats differ from window-major" >&2; exit 1; }
measure convert - $BIN convert --model "$CKPT" --stats "$WORK/teacher-layer.stats" --scoring do-acp --grouping oc \
    --scaling proportional -K 8 --out "$WORK/student"
measure ppl-student auto $BIN ppl --model "$WORK/student" --data "$DATA_PPL" --seq-len 128 --max-windows 2 --json
for pass in layer window; do
    measure ppl-teacher-$pass $pass $BIN ppl --model "$CKPT" --data "$DATA_PPL" --seq-len 128 --max-windows 2 \
        --pass $pass --json
done
measure eval-student auto $BIN eval --model "$WORK/student" --tasks arc_easy --limit 20 --json
measure eval-teacher-layer layer $BIN eval --model "$CKPT" --tasks arc_easy --limit 20 --pass layer --json
measure dry-run - $BIN sweep experiments.toml --experiment paper-grid-ppl --dry-run --set "model=$CKPT"
grep -h '"ppl"' "$WORK"/ppl-*.log || true
