#!/bin/sh
# Builds each fuzz/fuzz_*.c as a libFuzzer target (clang, ASan + UBSan) and runs it FUZZ_SECONDS
# (default 20) on its seed corpus fuzz/corpus/NAME. The library is compiled once (instrumented for
# coverage, build-fuzz/obj) and linked into every target. A crash, leak or timeout fails the run
# (exit 1) after all targets ran; the failing input is kept as build-fuzz/NAME-crash-*.
set -eu
secs=${FUZZ_SECONDS:-20}
jobs=${FUZZ_JOBS:-2}
mkdir -p build-fuzz/obj
flags="-std=c11 -g -O1 -fsanitize=address,undefined -Iharness -I. -I/usr/include/openblas -D_DEFAULT_SOURCE -D_FILE_OFFSET_BITS=64 -pthread"
src=$(ls harness/*/*.c criteria/*.c criteria/*/*.c evals/*.c evals/*/*.c 2>/dev/null | grep -v harness/cli/main.c)
# compile the library once, in parallel, only what changed
printf '%s\n' $src | xargs -P "$jobs" -I{} sh -c '
  o="build-fuzz/obj/$(echo "{}" | tr / _).o"
  if [ ! -e "$o" ] || [ "{}" -nt "$o" ] || [ -n "$(find harness criteria evals -name "*.h" -newer "$o" | head -1)" ]; then
    clang '"$flags"' -fsanitize=fuzzer-no-link -c -o "$o" "{}"
  fi'
objs=$(for f in $src; do echo "build-fuzz/obj/$(echo "$f" | tr / _).o"; done)
failed=""
for f in fuzz/fuzz_*.c; do
  [ -e "$f" ] || continue
  name=$(basename "$f" .c)
  clang $flags -fsanitize=fuzzer -o "build-fuzz/$name" "$f" $objs \
    -lopenblas -llapacke -lcjson -lcsv -lpcre2-8 -lutf8proc -lm
  corpus="fuzz/corpus/${name#fuzz_}"
  mkdir -p "build-fuzz/corpus-$name"
  echo "fuzz: $name for ${secs}s"
  if "build-fuzz/$name" -max_total_time="$secs" -print_final_stats=0 -artifact_prefix="build-fuzz/$name-" \
      "build-fuzz/corpus-$name" $( [ -d "$corpus" ] && echo "$corpus" ) > "build-fuzz/$name.log" 2>&1; then
    tail -1 "build-fuzz/$name.log"
  else
    grep -E 'ERROR|SUMMARY|#[0-9]+ 0x|Test unit written' "build-fuzz/$name.log" | head -30
    failed="$failed $name"
  fi
done
if [ -n "$failed" ]; then
  echo "fuzz: FAILED:$failed (inputs in build-fuzz/, logs build-fuzz/NAME.log)"
  exit 1
fi
echo "fuzz: all targets ran ${secs}s without a finding"
