#!/bin/sh
# make bench: runs every bench/bench_* binary in order; each prints its own table.
# Results are recorded by hand in BENCHMARKS.md together with this command.
build=${1:-build}
echo "# moe2dense bench — $(date -u +%Y-%m-%dT%H:%MZ) — $(uname -m), $(nproc) cores"
for b in "$build"/bench/bench_*; do
  [ -x "$b" ] || continue
  echo "## $(basename "$b")"
  "$b" || echo "$(basename "$b"): FAILED (exit $?)"
done
