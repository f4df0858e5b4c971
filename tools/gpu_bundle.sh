#!/bin/sh
# make gpu-bundle: everything the GPU checks need, built here, packed for a GPU machine that has
# the NVIDIA driver and cuBLASLt but none of this project's Debian libraries (the lent H100/H200:
# not Debian, no apt, no network; see README "GPU").
#
#   gpu-bundle/bundle.tar.xz   (git-ignored; under 64 MiB) holding
#     bin/      moe2dense, test_engine, test_ppl, test_calib, test_hf, test_train_ops, test_distill, bench_cuda (CUDA=1 build,
#               stripped)
#     lib/      the shared libraries they load that are not glibc's, the C++ runtime's or the
#               GPU's own (OpenBLAS, oneDNN, cJSON, ... from `ldd`); cudart is bundled too
#     models/   tiny-qwen3moe (config, weights, tokenizer, golden) from $MODELS
#     data/     the WikiText-2 files the tests read, ARC-Easy (test_ppl's eval), the demo's
#               calibration text (+ experiments.toml)
#     tests/golden/hf/  transformers' goldens (test_hf); tests/golden/distill/ PyTorch's distillation
#               steps (test_distill: the trainer on cuda next to the CPU)
#     run.sh, tests/run.sh, bench_hf_gpu.py, distill_ref.py (+ hf_goldens.py, which it imports)
#
# On the GPU machine: tools/gpu_run.sh unpacks it and runs everything (tests with the GPU required,
# then the benchmarks), writing its logs to $OUT. Nothing here needs a GPU; `sh tools/gpu_run.sh`
# on this machine runs the same script (its GPU tests then fail with "no GPU", as they must).
set -eu
cd "$(dirname "$0")/.."
root=$(pwd)
MODELS=${M2D_MODELS:-../shared/models}
DATA=${M2D_DATA:-data}
NVCC=${NVCC:-${CUDA_HOME:-/usr/local/cuda}/bin/nvcc}
dest=gpu-bundle
stage=build-cuda/bundle-stage
bins="moe2dense tests/test_engine tests/test_ppl tests/test_calib tests/test_hf tests/test_train_ops tests/test_distill bench/bench_cuda"

[ -x "$NVCC" ] || { echo "gpu-bundle: no nvcc at $NVCC (set CUDA_HOME or NVCC)"; exit 1; }
[ -f "$MODELS/tiny-qwen3moe/model.safetensors" ] || { echo "gpu-bundle: $MODELS/tiny-qwen3moe missing"; exit 1; }
wiki="$DATA/wikitext-2-raw/wikitext-2-raw"
[ -f "$wiki/wiki.test.raw" ] || make -s data DATA_DIR="$DATA"

targets=""
for b in $bins; do targets="$targets build-cuda/$b"; done
make -j"$(nproc)" CUDA=1 NVCC="$NVCC" $targets

rm -rf "$stage"
mkdir -p "$stage/bin" "$stage/lib" "$stage/models/tiny-qwen3moe/golden" "$stage/data/wikitext-2-raw/wikitext-2-raw" \
  "$stage/tests"
for b in $bins; do strip -o "$stage/bin/$(basename "$b")" "build-cuda/$b"; done

# every shared library the binaries load, less the ones the GPU machine has in a newer version
# (glibc, libstdc++, libgcc) and the GPU's own (driver, cuBLASLt: too large to carry, there already)
for b in "$stage"/bin/*; do ldd "$b"; done | awk '$3 ~ /^\// {print $3}' | sort -u |
  grep -Ev '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|ld-linux[^/]*|libcuda|libcublas[^/]*)\.so' |
  while read -r lib; do cp -L "$lib" "$stage/lib/"; done

m=$MODELS/tiny-qwen3moe
cp "$m/config.json" "$m/model.safetensors" "$m/tokenizer.json" "$m/tokenizer_config.json" "$stage/models/tiny-qwen3moe/"
cp "$m"/golden/* "$stage/models/tiny-qwen3moe/golden/"
cp -L "$wiki/wiki.test.raw" "$wiki/wiki.valid.raw" "$stage/data/wikitext-2-raw/wikitext-2-raw/"
# make demo's experiment and its calibration text (tools/gpu_e2e.sh runs its grid on both devices)
mkdir -p "$stage/data/train-text/wikitext-103-train-prefix"
cp -L "$DATA/train-text/wikitext-103-train-prefix/wiki.train.tokens" "$stage/data/train-text/wikitext-103-train-prefix/"
cp experiments.toml "$stage/"
# ARC-Easy: test_ppl's `eval --device cuda` next to the CPU
arc=arc/ARC-V1-Feb2018-2/ARC-Easy
mkdir -p "$stage/data/$arc"
cp -L "$DATA/$arc"/*.jsonl "$stage/data/$arc/"
cp tests/run.sh "$stage/tests/"
# transformers' goldens of every family (test_hf runs each forward on cuda next to the CPU)
mkdir -p "$stage/tests/golden"
cp -r tests/golden/hf tests/golden/distill "$stage/tests/golden/"
# make demo's grid on this machine's CPU (fp32; ~1 min on 2 cores): tools/gpu_e2e.sh compares the
# GPU's grid against it instead of spending the GPU machine's minutes on the CPU half
echo "gpu-bundle: make demo's grid on the CPU for the end-to-end check"
tmp=$(mktemp -d)
(cd "$stage" && "$root/build-cuda/moe2dense" sweep experiments.toml --experiment demo \
   --set model=models/tiny-qwen3moe --out "$tmp/demo-cpu.csv" --device cpu > "$tmp/log" 2>&1) ||
  { tail -3 "$tmp/log"; rm -rf "$tmp"; echo "gpu-bundle: the CPU's demo grid failed"; exit 1; }
mkdir -p "$stage/e2e"
cp "$tmp/demo-cpu.csv" "$stage/e2e/"
echo "$(lscpu | sed -n 's/^Model name: *//p'), commit $(git rev-parse --short HEAD 2>/dev/null)" > "$stage/e2e/made-on.txt"
rm -rf "$tmp" "$stage/results" # its cache: the GPU grid must calibrate on the GPU, not reuse it
cp tools/bench_hf_gpu.py tools/distill_ref.py tools/hf_goldens.py tools/gpu_run.sh tools/gpu_e2e.sh "$stage/"
git rev-parse --short HEAD > "$stage/COMMIT" 2>/dev/null || echo unknown > "$stage/COMMIT"

mkdir -p "$dest"
# tar's own status (a pipe would report xz's), and the size checked before the bundle is put in place
XZ_OPT="-T0 -6" tar -C "$stage" -cJf "$dest/bundle.tar.xz.tmp" . || { rm -f "$dest/bundle.tar.xz.tmp"; echo "gpu-bundle: tar failed"; exit 1; }
size=$(stat -c %s "$dest/bundle.tar.xz.tmp")
[ "$size" -lt $((60 * 1048576)) ] || { rm -f "$dest/bundle.tar.xz.tmp"; echo "gpu-bundle: over 60 MiB: the device tool carries 64 MiB in all"; exit 1; }
mv "$dest/bundle.tar.xz.tmp" "$dest/bundle.tar.xz"
echo "gpu-bundle: $dest/bundle.tar.xz, $((size / 1048576)) MiB, commit $(cat "$stage/COMMIT")"
