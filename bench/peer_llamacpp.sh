#!/bin/sh
# bench/peer_llamacpp.sh — issue 13: llama.cpp's CPU backend side by side with moe2dense on the
# random 2-layer slices with Qwen3-30B-A3B layer dimensions (bf16), measured in one run.
#
#   sh bench/peer_llamacpp.sh build     fetch the pinned llama-cpp-python sdist with pip download
#                                       from the index pip is configured with (sha256 checked),
#                                       build its vendored llama.cpp's llama-bench and
#                                       llama-perplexity (CPU only, Release, GGML_NATIVE) in build/peer
#                                       (PEER_ISA=avx2: the AVX2 llama.cpp and moe2dense for x86-64-v3)
#   sh bench/peer_llamacpp.sh convert   write both slices (bench_engine write) to $PEER_TMP and convert
#                                       them to GGUF bf16 with the vendored convert_hf_to_gguf.py
#   sh bench/peer_llamacpp.sh run       build + convert, then the measurements, interleaved (`make bench-peer`)
#   sh bench/peer_llamacpp.sh clean     remove the slices and GGUFs in $PEER_TMP (build/peer stays)
#
# Every step is skipped when its output is already there. Nothing third-party enters the repository:
# sources and builds live in build/peer (git-ignored), checkpoints in $PEER_TMP (default /tmp/m2d-peer,
# about 10 GB). Python for the converter: $PEER_PYTHON, default tests/ref/.venv-hf (torch +
# transformers, made by `sh tests/ref/setup.sh hf`), with the sdist's own gguf-py and a pinned
# sentencepiece (installed into build/peer/pydeps, not into the venv) on PYTHONPATH.
# PEER_ROUNDS (default 3): interleaved rounds after one warm-up round that is not counted; each cell
# is the median of the rounds. The same statistic on both sides (issue 28): pp512 is the mean of a
# process's repetitions (llama-bench's avg_ts, bench_engine's mean), PPL the whole-process wall time
# with one window per batch on both sides (llama-perplexity -b 512, as moe2dense ppl), and beside it
# the scored tokens per second (llama-perplexity scores the second half of each window only).
#
# PEER_ISA (issue 28: measure on every CPU you get, emulate the others) picks the CPU the run stands for:
#   native            (default) both sides as built for this CPU
#   avx512_core_bf16  a Zen 4's kernel choice: every moe2dense process under DNNL_MAX_CPU_ISA=AVX512_CORE_BF16
#                     (oneDNN's AVX512-BF16 brgemm, no AMX); llama.cpp the native build, whose bf16 matmuls
#                     use no AMX tiles on an AMX CPU either (ggml-cpu's AMX path, amx/common.h
#                     qtype_has_amx_kernels, serves Q4_0/Q4_1/Q8_0/Q4_K/Q5_K/Q6_K/IQ4_XS only, and nothing
#                     in ggml issues AMX-BF16 instructions: its bf16 dot products are AVX512-BF16)
#   avx2              an AVX2-only CPU: moe2dense built with -march=x86-64-v3 in $BUILD/x86-64-v3, run
#                     under DNNL_MAX_CPU_ISA=AVX2 and OPENBLAS_CORETYPE=Haswell (the kernels OpenBLAS picks
#                     on an AVX2 CPU; its fp32 path runs there); llama.cpp built a second time, GGML_NATIVE
#                     off and x86-64-v3's AVX/AVX2/FMA/F16C/BMI2 only, in build/peer/llama.cpp-build-avx2
# The yardsticks (bench_gemm) run under the same emulation. An emulation picks kernels only: the memory
# system, the clocks and the execution ports stay this CPU's.
set -eu

LLAMA_CPP_PYTHON_VERSION=0.3.36 # vendors ggml-org/llama.cpp@0c1e57098 (its CHANGELOG.md)
LLAMA_CPP_PYTHON_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
SENTENCEPIECE_VERSION=0.2.1 # convert_hf_to_gguf.py's requirements: >=0.1.98,<0.3.0

root=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-build}
peer="$root/$BUILD/peer"
src="$peer/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
lcpp="$src/vendor/llama.cpp"
tmp=${PEER_TMP:-/tmp/m2d-peer}
tokdir=${PEER_TOKENIZER:-$root/../shared/models/qwen3-tokenizer}
wiki="$root/data/wikitext-2-raw/wikitext-2-raw/wiki.test.raw"
jobs=${PEER_JOBS:-2}

die() { echo "peer_llamacpp: $*" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || die "$1 is not installed ($2)"; }
log() { echo "peer_llamacpp: $*" >&2; }

# the emulation: moe2dense's binaries ($m2d), their environment ($isa_env), llama.cpp's build ($lbuild)
isa=${PEER_ISA:-native}
m2d="$root/$BUILD"; isa_env=""; lsfx=""
case "$isa" in
  native) ;;
  avx512_core_bf16) isa_env="DNNL_MAX_CPU_ISA=AVX512_CORE_BF16" ;;
  avx2) m2d="$root/$BUILD/x86-64-v3"; isa_env="DNNL_MAX_CPU_ISA=AVX2 OPENBLAS_CORETYPE=Haswell"; lsfx="-avx2" ;;
  *) die "PEER_ISA=$isa is not native, avx512_core_bf16 or avx2" ;;
esac
lbuild="$peer/llama.cpp-build$lsfx"

cpu() {
  echo "$(lscpu | sed -n 's/^Model name: *//p'), family $(lscpu | sed -n 's/^CPU family: *//p')" \
    "model $(lscpu | sed -n 's/^Model: *//p')"
}

emulation() {
  case "$isa" in
    native) echo "PEER_ISA=native: both sides as built for $(cpu)" ;;
    avx512_core_bf16) echo "PEER_ISA=avx512_core_bf16, emulated: Zen-4-like kernel choice (moe2dense under" \
      "DNNL_MAX_CPU_ISA=AVX512_CORE_BF16, no AMX; llama.cpp the native build, no AMX in its bf16 matmuls) on $(cpu)" ;;
    avx2) echo "PEER_ISA=avx2, emulated: AVX2-only (moe2dense -march=x86-64-v3 under DNNL_MAX_CPU_ISA=AVX2" \
      "OPENBLAS_CORETYPE=Haswell, llama.cpp AVX2 build: GGML_NATIVE=OFF, AVX/AVX2/FMA/F16C/BMI2) on $(cpu)" ;;
  esac
}

# a Python with pip: $PEER_PIP_PYTHON, python3, or the test references' venv (tests/ref/setup.sh light)
pip_python() {
  for py in ${PEER_PIP_PYTHON:-} python3 "$root/tests/ref/.venv/bin/python"; do
    "$py" -m pip --version >/dev/null 2>&1 && { echo "$py"; return 0; }
  done
  sh "$root/tests/ref/setup.sh" light >&2 || die "no Python with pip (make deps installs python3-venv; or set PEER_PIP_PYTHON)"
  echo "$root/tests/ref/.venv/bin/python"
}

# the sdist through pip download (pip's own index configuration decides where from: nothing here
# names a host), into a fresh directory, then sha256-checked before it is used
download_sdist() {
  dl="$peer/download"
  rm -rf "$dl"
  py=$(pip_python)
  log "downloading the llama-cpp-python $LLAMA_CPP_PYTHON_VERSION sdist (77 MB) with pip download"
  "$py" -m pip download --disable-pip-version-check --no-input --progress-bar off --no-deps --no-binary :all: \
    -d "$dl" "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" > "$peer/download.log" 2>&1 ||
    die "pip download llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION failed: $(tail -1 "$peer/download.log") (log: $peer/download.log)"
  got=$(sha256sum "$dl/$(basename "$tgz")" 2>/dev/null | cut -d' ' -f1)
  [ "$got" = "$LLAMA_CPP_PYTHON_SHA256" ] ||
    die "sha256 of the downloaded sdist is '$got', expected $LLAMA_CPP_PYTHON_SHA256 (in $dl)"
  mv "$dl/$(basename "$tgz")" "$tgz"
  rm -rf "$dl"
}

fetch() {
  tgz="$peer/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
  mkdir -p "$peer"
  if ! [ -f "$tgz" ] || [ "$(sha256sum "$tgz" | cut -d' ' -f1)" != "$LLAMA_CPP_PYTHON_SHA256" ]; then
    download_sdist
  fi
  if ! [ -f "$src/.unpacked" ]; then
    rm -rf "$src"
    tar -xzf "$tgz" -C "$peer" || die "could not unpack $tgz"
    [ -f "$lcpp/CMakeLists.txt" ] || die "$tgz has no vendor/llama.cpp/CMakeLists.txt"
    touch "$src/.unpacked"
  fi
}

build() {
  fetch
  stamp="$lbuild/.built-from" # the sdist's sha256: a version bump rebuilds
  if [ -x "$lbuild/bin/llama-bench" ] && [ -x "$lbuild/bin/llama-perplexity" ] && [ -f "$stamp" ] &&
    [ "$(cat "$stamp")" = "$LLAMA_CPP_PYTHON_SHA256" ]; then return 0; fi
  rm -rf "$lbuild"
  need cmake "apt-get install cmake"
  need g++ "apt-get install g++"
  # avx2: the instruction sets of x86-64-v3 (moe2dense's -march there), none of AVX-512, AVX-VNNI, AMX
  isa_flags="-DGGML_NATIVE=ON"
  [ "$isa" = avx2 ] && isa_flags="-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON \
-DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF \
-DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
  log "building llama.cpp (llama-bench, llama-perplexity; CPU, Release, $isa_flags) in $lbuild with -j$jobs"
  # shellcheck disable=SC2086 # isa_flags: one word per option
  cmake -S "$lcpp" -B "$lbuild" -DCMAKE_BUILD_TYPE=Release $isa_flags -DGGML_CUDA=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_APP=OFF > "$peer/cmake-configure$lsfx.log" 2>&1 ||
    die "cmake configure failed: $(grep -m1 -i error "$peer/cmake-configure$lsfx.log") (log: $peer/cmake-configure$lsfx.log)"
  cmake --build "$lbuild" --config Release -j "$jobs" --target llama-bench llama-perplexity \
    > "$peer/cmake-build$lsfx.log" 2>&1 ||
    die "llama.cpp build failed: $(grep -m1 -i error "$peer/cmake-build$lsfx.log") (log: $peer/cmake-build$lsfx.log)"
  echo "$LLAMA_CPP_PYTHON_SHA256" > "$stamp"
}

# avx2: moe2dense's own C without AVX-512 in its own build folder (make is incremental; the parent make's
# MAKEFLAGS, e.g. its BUILD, are not passed on)
build_m2d() {
  [ "$isa" = avx2 ] || return 0
  log "building moe2dense for x86-64-v3 (AVX2, no AVX-512) in $m2d with -j$jobs"
  mkdir -p "$peer"
  MAKEFLAGS='' make -C "$root" -j"$jobs" BUILD="$BUILD/x86-64-v3" CFLAGS="-O2 -march=x86-64-v3 -g" \
    "$BUILD/x86-64-v3/moe2dense" "$BUILD/x86-64-v3/bench/bench_engine" "$BUILD/x86-64-v3/bench/bench_gemm" \
    > "$peer/m2d-x86-64-v3-build.log" 2>&1 ||
    die "make BUILD=$BUILD/x86-64-v3 failed: $(grep -m1 -i error "$peer/m2d-x86-64-v3-build.log") (log: $peer/m2d-x86-64-v3-build.log)"
}

# $tmp is ours: in /tmp by default, so a planted symlink or someone else's directory is refused
own_tmp() {
  [ -L "$tmp" ] && die "$tmp is a symbolic link (refused; set PEER_TMP)"
  mkdir -p "$tmp"
  [ -O "$tmp" ] || die "$tmp belongs to another user (refused; set PEER_TMP)"
}

python_for_convert() {
  if [ -n "${PEER_PYTHON:-}" ]; then py=$PEER_PYTHON; else
    py="$root/tests/ref/.venv-hf/bin/python"
    [ -x "$py" ] || sh "$root/tests/ref/setup.sh" hf >&2 || die "no Python with torch + transformers (tests/ref/setup.sh hf failed)"
  fi
  "$py" -c 'import torch, transformers, numpy, yaml' 2>/dev/null ||
    die "$py lacks torch/transformers/numpy/pyyaml (convert_hf_to_gguf.py needs them; set PEER_PYTHON)"
  # the converter imports sentencepiece even for BPE vocabularies (Qwen3 dense); kept beside, not in the venv
  pypath="$lcpp/gguf-py:$peer/pydeps"
  PYTHONPATH="$pypath" "$py" -c 'import sentencepiece' 2>/dev/null && return 0
  log "installing sentencepiece==$SENTENCEPIECE_VERSION into $peer/pydeps (PyPI)"
  "$py" -m pip install --disable-pip-version-check --no-input --progress-bar off --no-deps \
    --target "$peer/pydeps" "sentencepiece==$SENTENCEPIECE_VERSION" > "$peer/pydeps.log" 2>&1 ||
    die "pip install sentencepiece==$SENTENCEPIECE_VERSION failed: $(tail -1 "$peer/pydeps.log")"
}

# write_slice KIND: the random 2-layer slice (bench_engine write ... real KIND 2) with the Qwen3 tokenizer
write_slice() {
  dir="$tmp/$1"
  [ -f "$dir/.complete" ] && return 0
  [ -f "$tokdir/tokenizer.json" ] || die "$tokdir/tokenizer.json is missing (the Qwen3 tokenizer; set PEER_TOKENIZER)"
  rm -rf "$dir"
  log "writing the $1 slice to $dir"
  "$root/$BUILD/bench/bench_engine" write "$dir" real "$1" 2 || die "bench_engine write $dir real $1 2 failed"
  cp "$tokdir/tokenizer.json" "$tokdir/tokenizer_config.json" "$dir/"
  touch "$dir/.complete"
}

convert() {
  fetch
  for b in bench/bench_engine moe2dense; do
    [ -x "$root/$BUILD/$b" ] || die "$BUILD/$b is missing (make -j2 all $BUILD/bench/bench_engine)"
  done
  own_tmp
  for kind in moe dense; do
    write_slice "$kind"
    gguf="$tmp/$kind-bf16.gguf"
    [ -f "$gguf" ] && continue
    python_for_convert
    log "converting $tmp/$kind to $gguf (convert_hf_to_gguf.py --outtype bf16)"
    PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$pypath" "$py" "$lcpp/convert_hf_to_gguf.py" --outtype bf16 \
      --outfile "$gguf.part" "$tmp/$kind" > "$tmp/convert-$kind.log" 2>&1 ||
      die "convert_hf_to_gguf.py failed on $tmp/$kind: $(tail -1 "$tmp/convert-$kind.log") (log: $tmp/convert-$kind.log)"
    mv "$gguf.part" "$gguf"
  done
}

# ---- measurement: one line per result in $res: "WORK ENGINE VALUE" (WORK pp-moe|pp-dense|ppl-moe|ppl-dense|
# tps-moe|tps-dense; pp VALUE = tokens/s, ppl VALUE = whole-process seconds, tps VALUE = scored tokens per
# whole-process second); the summary keeps the median of the rounds. Round 0 (the warm-up) records nothing.

record() { [ "$round" -gt 0 ] && echo "$1 $2 $3" >> "$res"; return 0; }

# llama-bench pp512: the mean tokens/s of its repetitions (avg_ts; bench_engine records the same mean)
llama_pp() {
  out="$logs/llama-bench-$1-$2.jsonl"
  "$lbuild/bin/llama-bench" -m "$tmp/$1-bf16.gguf" -p 512 -n 0 -t 2 -r 3 -o jsonl > "$out" 2> "$out.err" ||
    die "llama-bench failed on $tmp/$1-bf16.gguf: $(tail -1 "$out.err")"
  best=$(sed -n 's/.*"samples_ts": \[ *\([^]]*\)\].*/\1/p' "$out" | tr ',' '\n' | sort -g | tail -1 | tr -d ' ')
  mean=$(sed -n 's/.*"avg_ts": \([0-9.e+-]*\).*/\1/p' "$out")
  [ -n "$best" ] || die "no samples_ts in $out"
  [ -n "$mean" ] || die "no avg_ts in $out"
  record "pp-$1" llama "$mean"
  echo "round $2: llama-bench pp512 $1: mean of 3 $mean tok/s (best $best)"
}

# bench_engine case (a fresh process, weights as stored, best of 3 after a warm-up pass): pp512
m2d_pp() { # KIND PREC(bf16|fp32) ROUND
  rec="$logs/m2d-pp-$1-$2-$3.rec"
  cache=0; [ "$2" = bf16 ] && cache=4
  # shellcheck disable=SC2086 # isa_env: VAR=value words for env
  M2D_BENCH_RECORD="$rec" env $isa_env "$m2d/bench/bench_engine" case "$tmp/$1" "$1" pp 512 3 "$cache" 1 ||
    die "bench_engine case $tmp/$1 pp failed"
  best=$(cut -d' ' -f1 "$rec"); mean=$(cut -d' ' -f3 "$rec")
  [ -n "$mean" ] || die "bench_engine case wrote no mean to $rec"
  record "pp-$1" "m2d-$2" "$mean"
  echo "round $3: moe2dense pp512 $1 $2: mean of 3 $mean tok/s (best $best; peak RSS $(cut -d' ' -f2 "$rec") MB)"
}

# whole process under /usr/bin/time: wall seconds, then the PPL line
timed() { # LOG CMD...: runs CMD with stdout+stderr to LOG; prints its wall seconds
  t="$1.time"; lg=$1; shift
  /usr/bin/time -f '%e %M' -o "$t" "$@" > "$lg" 2>&1 || die "failed: $* (log: $lg)"
  cut -d' ' -f1 "$t"
}

rss_mb() { echo $(($(cut -d' ' -f2 "$1.time") / 1024)); }

llama_ppl() {
  lg="$logs/llama-perplexity-$1-$2.log"
  s=$(timed "$lg" "$lbuild/bin/llama-perplexity" -m "$tmp/$1-bf16.gguf" -f "$wiki" -c 512 -b 512 --chunks 4 -t 2)
  ppl=$(sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p' "$lg")
  [ -n "$ppl" ] || die "no final PPL in $lg"
  record "ppl-$1" llama "$s"
  # llama-perplexity scores tokens n_ctx/2 + 1 .. n_ctx - 1 of each window: 255 of 512, 4 windows
  record "tps-$1" llama "$(awk -v s="$s" 'BEGIN { printf "%.1f", 4 * 255 / s }')"
  echo "round $2: llama-perplexity $1: $s s, peak RSS $(rss_mb "$lg") MB, PPL $ppl" \
    "(scores the second half of each window: 4 x 255 tokens)"
}

m2d_ppl() { # KIND PREC ROUND
  lg="$logs/m2d-ppl-$1-$2-$3.log"
  # shellcheck disable=SC2086
  s=$(timed "$lg" env $isa_env "$m2d/moe2dense" ppl --model "$tmp/$1" --data "$wiki" --seq-len 512 --max-windows 4 \
    --precision "$2" --threads 2)
  n=$(awk '$1 == "tokens_scored" && NF == 2 {print $2}' "$lg")
  [ -n "$n" ] || die "no tokens_scored in $lg"
  record "ppl-$1" "m2d-$2" "$s"
  record "tps-$1" "m2d-$2" "$(awk -v n="$n" -v s="$s" 'BEGIN { printf "%.1f", n / s }')"
  echo "round $3: moe2dense ppl $1 $2: $s s, peak RSS $(rss_mb "$lg") MB, PPL $(awk '$1 == "ppl" && NF == 2 {print $2}' "$lg")" \
    "($n tokens scored)"
}

# --quick: the same yardsticks (measured at the start and the end of bench_gemm), fewer shapes between,
# under the emulation's environment; the rate steady() compares is kept in $logs/yardstick-WHEN: the oneDNN
# bf16 2048^3 matmul, or where oneDNN has no native bf16 (avx2) the OpenBLAS sgemm the fp32 path runs on
yardsticks() {
  echo "yardsticks ($1): $isa_env ${m2d#"$root"/}/bench/bench_gemm --quick | head -5"
  # shellcheck disable=SC2086
  env $isa_env "$m2d/bench/bench_gemm" --quick 2>/dev/null | head -5 > "$logs/bench_gemm-$1.txt" || true
  cat "$logs/bench_gemm-$1.txt"
  pat='oneDNN bf16 matmul 2048^3 ([^)]*)'; [ "$isa" = avx2 ] && pat='OpenBLAS sgemm n=2048, [^)]*)'
  sed -n "s/.*$pat: \([0-9.]*\) GFLOP\/s.*/\1/p" "$logs/bench_gemm-$1.txt" > "$logs/yardstick-$1"
}

# the ratios mean something only if the load stayed the same: the yardstick at the start and the end
steady() {
  y=bf16; [ "$isa" = avx2 ] && y="fp32 (sgemm)"
  awk -v y="$y" -v a="$(cat "$logs/yardstick-start")" -v b="$(cat "$logs/yardstick-end")" 'BEGIN {
    if (a <= 0 || b <= 0) { printf "WARNING: no %s yardstick read; the load during the run is unknown\n", y; exit }
    r = a < b ? a / b : b / a
    if (r < 0.85) printf "WARNING: the %s yardstick moved from %.0f to %.0f GFLOP/s: the load changed during the run, its ratios are unreliable\n", y, a, b
    else printf "%s yardstick steady: %.0f at the start, %.0f at the end (GFLOP/s)\n", y, a, b }'
}

system_info() {
  echo "CPU: $(cpu), $(nproc) CPUs;" \
    "flags: $(grep -o -w -E 'avx512f|avx512bw|avx512vl|avx512_bf16|avx512_vnni|amx_bf16|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')" \
    "$(grep -q -w amx_bf16 /proc/cpuinfo || echo '(no AMX)')"
  echo "llama.cpp: llama-cpp-python $LLAMA_CPP_PYTHON_VERSION sdist (sha256 $LLAMA_CPP_PYTHON_SHA256)," \
    "vendored $(sed -n 's/^- feat: update llama.cpp to //p' "$src/CHANGELOG.md" | head -1);" \
    "llama-bench --version: $("$lbuild/bin/llama-bench" --version 2>&1 | head -1)"
  echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
}

summary() {
  echo
  echo "| work | moe2dense bf16 | moe2dense fp32 | llama.cpp | ratio bf16 / llama.cpp | ratio fp32 / llama.cpp |"
  echo "|---|---:|---:|---:|---:|---:|"
  sort -k1,1 -k2,2 -k3,3g "$res" | awk '
    { k = $1 SUBSEP $2; n[k]++; x[k, n[k]] = $3 }
    END {
      for (k in n) { m = n[k]; med[k] = m % 2 ? x[k, (m + 1) / 2] : (x[k, m / 2] + x[k, m / 2 + 1]) / 2
                     if (x[k, m] > 1.25 * x[k, 1]) { split(k, kk, SUBSEP); noisy = noisy " " kk[1] "/" kk[2] } }
      c = split("pp-moe pp-dense ppl-moe ppl-dense tps-moe tps-dense", w, " ")
      name["pp-moe"] = "pp512, MoE slice (tok/s)"; name["pp-dense"] = "pp512, dense K=8 student (tok/s)"
      name["ppl-moe"] = "PPL L=512, 4 windows, MoE slice (s, whole process)"
      name["ppl-dense"] = "PPL L=512, 4 windows, dense student (s, whole process)"
      name["tps-moe"] = "PPL, MoE slice (scored tokens/s, whole process)"
      name["tps-dense"] = "PPL, dense student (scored tokens/s, whole process)"
      for (i = 1; i <= c; i++) {
        b = med[w[i], "m2d-bf16"]; f = med[w[i], "m2d-fp32"]; l = med[w[i], "llama"]; up = (w[i] !~ /^ppl-/)
        if (l <= 0 || b <= 0 || f <= 0) { printf "| %s | missing |\n", name[w[i]]; continue }
        rb = up ? b / l : l / b; rf = up ? f / l : l / f
        fmt = up ? "| %s | %.0f | %.0f | %.0f | %.2fx | %.2fx |\n" : "| %s | %.2f | %.2f | %.2f | %.2fx | %.2fx |\n"
        printf fmt, name[w[i]], b, f, l, rb, rf
      }
      if (noisy != "") print "\nWARNING: cells that varied by more than 25 % across the rounds (load changed):" noisy
    }'
  echo
  echo "ratios: moe2dense / llama.cpp throughput (pp and scored tokens/s: moe2dense / llama.cpp; PPL seconds:"
  echo "llama.cpp / moe2dense); the median of $rounds interleaved rounds per cell after a warm-up round; pp512"
  echo "is the mean of each process's 3 repetitions on both sides; logs in $logs."
  echo "Work differs in PPL: llama-perplexity (-b 512, one window per batch as moe2dense) computes logits for"
  echo "the second half of each window only (4 x 255 tokens scored); moe2dense ppl scores all of it (4 x 511)."
  emulation
}

run() {
  build
  build_m2d
  convert
  [ -f "$wiki" ] || die "$wiki is missing (make data)"
  [ -x /usr/bin/time ] || die "/usr/bin/time is missing (apt-get install time)"
  rounds=${PEER_ROUNDS:-3}
  logs="$tmp/logs"; res="$logs/results.txt"
  rm -rf "$logs"; mkdir -p "$logs"
  echo "# moe2dense vs llama.cpp (CPU), issues 13 and 28 — $(date -u +%Y-%m-%dT%H:%MZ)"
  emulation
  system_info
  yardsticks start
  round=0 # round 0 warms the page cache and the CPU up and is not recorded (record())
  while [ "$round" -le "$rounds" ]; do # interleaved: every engine sees the same load in each round
    for kind in moe dense; do
      llama_pp "$kind" "$round"; m2d_pp "$kind" bf16 "$round"; m2d_pp "$kind" fp32 "$round"
      llama_ppl "$kind" "$round"; m2d_ppl "$kind" bf16 "$round"; m2d_ppl "$kind" fp32 "$round"
    done
    round=$((round + 1))
  done
  grep -h -m1 'system_info' "$logs"/llama-perplexity-moe-1.log | sed 's/^/llama.cpp /' || true
  yardsticks end
  echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
  summary
  steady
}

case "${1:-run}" in
  build) build; build_m2d ;;
  convert) convert ;;
  run) run ;;
  clean) [ -L "$tmp" ] || rm -rf "$tmp" ;;
  *) die "usage: sh bench/peer_llamacpp.sh build|convert|run|clean" ;;
esac
