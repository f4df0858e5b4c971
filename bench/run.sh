#!/bin/sh
# make bench: runs every bench/bench_* binary in order; each prints its own table.
# Results are recorded by hand in BENCHMARKS.md together with this command.
build=${1:-build}
failed=0 # a failed benchmark is said where it fails and makes the run exit 1
echo "# moe2dense bench — $(date -u +%Y-%m-%dT%H:%MZ) — $(uname -m), $(nproc) cores"
for b in "$build"/bench/bench_*; do
  [ -x "$b" ] || continue
  echo "## $(basename "$b")"
  "$b" || { echo "$(basename "$b"): FAILED (exit $?)"; failed=1; }
  if [ "$(basename "$b")" = bench_engine ]; then # issue 13: fp32 vs bf16, each against its yardstick
    echo "## bench_engine precision"
    "$b" precision || { echo "bench_engine precision: FAILED (exit $?)"; failed=1; }
  fi
done
# issue 13: calibration of a 2-layer Qwen3-30B-A3B-shaped slice against its FLOP bound, and its memory
slice=$(mktemp -d "${TMPDIR:-/tmp}/m2d-bench-slice.XXXXXX")
trap 'rm -rf "$slice"' EXIT INT TERM
echo "## bench_calib rss (2-layer Qwen3-30B-A3B slice, 4 x 512 tokens)"
if "$build"/bench/bench_engine write "$slice/s2" real moe 2 >/dev/null; then
  for p in bf16 fp32; do
    "$build"/bench/bench_calib rss "$slice/s2" calib 4 "$p" || { echo "bench_calib rss $p: FAILED (exit $?)"; failed=1; }
  done
else
  echo "bench_engine write: FAILED (exit $?)"; failed=1
fi
exit "$failed"
