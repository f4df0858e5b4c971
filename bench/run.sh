#!/bin/sh
# make bench: runs every bench/bench_* binary in order; each prints its own table.
# Results are recorded by hand in BENCHMARKS.md together with this command.
build=${1:-build}
echo "# moe2dense bench — $(date -u +%Y-%m-%dT%H:%MZ) — $(uname -m), $(nproc) cores"
for b in "$build"/bench/bench_*; do
  [ -x "$b" ] || continue
  echo "## $(basename "$b")"
  "$b" || echo "$(basename "$b"): FAILED (exit $?)"
  if [ "$(basename "$b")" = bench_engine ]; then # issue 13: fp32 vs bf16, each against its yardstick
    echo "## bench_engine precision"
    "$b" precision || echo "bench_engine precision: FAILED (exit $?)"
  fi
done
