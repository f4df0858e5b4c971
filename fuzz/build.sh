#!/bin/sh
# Builds each fuzz/fuzz_*.c as a libFuzzer target (clang) and runs it FUZZ_SECONDS (default 20).
set -eu
secs=${FUZZ_SECONDS:-20}
mkdir -p build-fuzz
src=$(ls harness/*/*.c criteria/*.c criteria/*/*.c evals/*.c evals/*/*.c 2>/dev/null | grep -v harness/cli/main.c)
for f in fuzz/fuzz_*.c; do
  [ -e "$f" ] || continue
  name=$(basename "$f" .c)
  clang -std=c11 -g -O1 -fsanitize=fuzzer,address,undefined -Iharness -I. \
    -I/usr/include/openblas -D_DEFAULT_SOURCE -D_FILE_OFFSET_BITS=64 -pthread \
    -o "build-fuzz/$name" "$f" $src -lopenblas -ldnnl -lgomp -llapacke -lcjson -lcsv -lpcre2-8 -lutf8proc -lm
  corpus="fuzz/corpus/${name#fuzz_}"
  mkdir -p "build-fuzz/corpus-$name"
  echo "fuzz: $name for ${secs}s"
  "build-fuzz/$name" -max_total_time="$secs" -print_final_stats=0 "build-fuzz/corpus-$name" $( [ -d "$corpus" ] && echo "$corpus" ) 2>&1 | tail -2
done
