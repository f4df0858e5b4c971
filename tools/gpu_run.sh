#!/bin/sh
# The GPU checks of a bundle made by tools/gpu_bundle.sh (make gpu-bundle), on a machine with an
# NVIDIA GPU, its driver and cuBLASLt, and none of this project's build dependencies:
#   sh tools/gpu_run.sh [gpu-bundle/bundle.tar.xz]
# 1. the GPU, driver and libraries (every bundled binary's libraries resolve)
# 2. the GPU tests with the GPU required (M2D_REQUIRE_GPU=1: "no GPU" fails instead of skipping),
#    every case run, one line per case with its measured difference; then test_engine and
#    test_calib again under M2D_CUDA_FAST=0 (the reference kernels: per-expert MoE through cuBLASLt,
#    warp-per-row attention, the two-pass log-sum-exp, calibration's experts one by one and its
#    Gram by FMA tiles), their output in test_reference.log
# 3. bench_cuda (GEMM yardstick; pp512 / PPL-eval tokens/s on Qwen3-30B-A3B-shaped slices, the
#    reference kernels' row, op times), then transformers on the same checkpoints when python3 has
#    torch + transformers
# 4. one configuration end to end on both devices (tools/gpu_e2e.sh)
# 5. ncu (Nsight Compute, when the machine has it) on k_gx in one ppl-2048 forward of the MoE slice,
#    with the knobs gx_ldsm and gx_wide off and on: its throughputs, occupancy and warp stalls
# Logs go to $OUT (default /tmp/m2d-gpu-out): gpu-run.log (everything), test_*.log (each binary's
# whole output), bench.log. Each stage has a time limit (STAGE_S, default 240 s) so that one hung
# stage cannot eat the machine's time (BENCH_S, default 300 s, for bench_cuda: it writes 5 GB of
# checkpoints first); SKIP_E2E=1 leaves stage 4 out, SKIP_NCU=1 stage 5, SKIP_HF=1 transformers,
# SKIP_BENCH=1 both benchmarks and ncu, BENCH_ONLY=moe the dense student's slice. Exit status: non-zero if
# a test failed.
set -u
bundle=${1:-gpu-bundle/bundle.tar.xz}
out=${OUT:-/tmp/m2d-gpu-out}
B=${M2D_BUNDLE_DIR:-/tmp/m2d-bundle}
STAGE_S=${STAGE_S:-240}
mkdir -p "$out" && out=$(cd "$out" && pwd) || exit 2 # absolute: main runs in the bundle
LOG=$out/gpu-run.log

step() { echo; echo "== $* == ($(date -u +%H:%M:%SZ))"; }

# libcublasLt.so.13 of this machine: the toolkit's, the dynamic linker's, or a pip wheel's
find_cublaslt() {
  for d in ${CUDA_HOME:-/usr/local/cuda}/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -e "$d/libcublasLt.so.13" ] && { echo "$d"; return; }
  done
  p=$(ldconfig -p 2>/dev/null | awk '/libcublasLt\.so\.13 /{print $NF; exit}')
  [ -n "$p" ] && { dirname "$p"; return; }
  p=$(find /usr /opt -name 'libcublasLt.so.13*' 2>/dev/null | head -1)
  [ -n "$p" ] && dirname "$p"
}

main() {
step "unpack $bundle"
rm -rf "$B" && mkdir -p "$B" && xz -dc "$bundle" | tar -C "$B" -xf - || { echo "gpu-run: cannot unpack $bundle"; return 1; }
echo "commit $(cat "$B/COMMIT")"

step "GPU, driver, libraries"
nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.max.sm --format=csv,noheader ||
  echo "gpu-run: nvidia-smi failed"
lscpu | sed -n 's/^Model name: *//p'
lt=$(find_cublaslt)
echo "cuBLASLt: ${lt:-not found}"
export LD_LIBRARY_PATH="$B/lib${lt:+:$lt}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
missing=0
for b in "$B"/bin/*; do
  if ldd "$b" | grep -q 'not found'; then ldd "$b" | grep 'not found' | sed "s|^|$(basename "$b"): |"; missing=1; fi
done
[ "$missing" = 0 ] && echo "every library resolves"

step "GPU tests (M2D_REQUIRE_GPU=1)"
export M2D_REQUIRE_GPU=1 M2D_BIN="$B/bin/moe2dense" M2D_DATA="$B/data" M2D_MODELS="$B/models" M2D_BUILD=/tmp/m2d-gpu-build
mkdir -p "$M2D_BUILD"
cd "$B" || return 1 # the tests' relative paths (experiments.toml and its data/) are the bundle's
tests_rc=0
# one line per case, with the measured differences the tests print
cases() { grep -E '^\[ *(OK|FAILED|SKIPPED|ERROR) *\]|^\[ *LINE|max|nll|NLL|differ|error|skip|worst|same bits' "$1" | grep -v '^\[==' | head -150; }
for t in "$B"/bin/test_*; do
  name=$(basename "$t")
  timeout "$STAGE_S" "$t" > "$out/$name.log" 2>&1; rc=$?
  [ "$rc" -ne 0 ] && tests_rc=1
  cases "$out/$name.log"
  echo "$name: exit $rc$( [ "$rc" = 124 ] && echo ' (timed out)')"
done

step "the engine and calibration tests again with the reference kernels (M2D_CUDA_FAST=0)"
: > "$out/test_reference.log"
for name in test_engine test_calib; do
  M2D_CUDA_FAST=0 timeout "$STAGE_S" "$B/bin/$name" > "$M2D_BUILD/ref.log" 2>&1; rc=$?
  [ "$rc" -ne 0 ] && tests_rc=1
  cat "$M2D_BUILD/ref.log" >> "$out/test_reference.log"
  cases "$M2D_BUILD/ref.log" | grep -v '^\[ *OK'
  echo "$name (M2D_CUDA_FAST=0): exit $rc$( [ "$rc" = 124 ] && echo ' (timed out)')"
done

BENCH_DIR=/tmp/m2d-gpu-bench
if [ "${SKIP_BENCH:-0}" = 1 ]; then
  step "bench_cuda: skipped (SKIP_BENCH=1)"; SKIP_HF=1
else
  step "bench_cuda"
  timeout "${BENCH_S:-300}" "$B/bin/bench_cuda" "$BENCH_DIR" 2>&1 | tee "$out/bench.log"
fi

step "transformers on the same GPU and checkpoints"
if [ "${SKIP_HF:-0}" != 1 ] && python3 -c 'import torch, transformers; assert torch.cuda.is_available()' 2>/dev/null; then
  timeout "$STAGE_S" python3 "$B/bench_hf_gpu.py" "$BENCH_DIR/qwen3-30b-a3b-2l" "$BENCH_DIR/qwen3-30b-a3b-2l-dense-k8" 2>&1 |
    grep -v "Loading weights" | tee -a "$out/bench.log"
  # the distillation step of bench_cuda's last row, in PyTorch (teacher bf16, student fp32, SDPA)
  echo "distillation step, PyTorch on the GPU (L = 512, 1 window):" | tee -a "$out/bench.log"
  timeout "$STAGE_S" python3 "$B/distill_ref.py" --bench --teacher "$BENCH_DIR/qwen3-30b-a3b-2l" \
    --student "$BENCH_DIR/qwen3-30b-a3b-2l-dense-k8" --batch 1 --seq-len 512 --iters 3 --device cuda --teacher-dtype bf16 \
    --attn sdpa 2>&1 | grep -v "Loading weights" | tail -3 | tee -a "$out/bench.log"
else
  echo "skipped (SKIP_HF=1, or python3 lacks torch/transformers with CUDA)"
fi

# then the end-to-end check (the bundle carries its CPU half, so it is ~30 s of GPU work)
if [ "${SKIP_E2E:-0}" = 1 ]; then
  step "end to end: skipped (SKIP_E2E=1)"
else
  step "one configuration end to end, cpu next to cuda (tools/gpu_e2e.sh)"
  { M2D_BUNDLE_ROOT=$B timeout "$STAGE_S" bash "$B/gpu_e2e.sh" 2>&1; echo $? > "$out/.e2e-rc"; } | tee "$out/e2e.log"
  e2e_rc=$(cat "$out/.e2e-rc" 2>/dev/null || echo 1); rm -f "$out/.e2e-rc"
  echo "end to end: exit $e2e_rc"
  [ "$e2e_rc" = 0 ] || tests_rc=1
fi

# last: ncu, for the next kernel's design (the runner's outer time limit may cut it)
ncu=$(command -v ncu || ls "${CUDA_HOME:-/usr/local/cuda}/bin/ncu" 2>/dev/null)
if [ "${SKIP_NCU:-0}" = 1 ] || [ "${SKIP_BENCH:-0}" = 1 ] || [ -z "$ncu" ]; then
  step "ncu: skipped (SKIP_NCU=1, SKIP_BENCH=1, or no ncu)"
else
  step "ncu: k_gx in one ppl-2048 forward of the MoE slice, its variants (ncu locks the clocks: compare shares)"
  for v in gx_ldsm=0 gx_ldsm=1 gx_wide=1 gx_ldsm=1,gx_wide=1; do
    rep="$out/ncu-$(echo "$v" | tr ',=' '_-').txt"
    BENCH_PROFILE=$v timeout 60 "$ncu" --kernel-name regex:k_gx --launch-count 4 --section SpeedOfLight \
      --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
      "$B/bin/bench_cuda" "$BENCH_DIR" > "$rep" 2>&1
    echo "$v: exit $? (whole report: $(basename "$rep"))"
    grep -E 'k_gx|Duration|Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|Warp Cycles Per Issued' "$rep" | head -40
  done
fi

step "done"
echo "tests: exit $tests_rc"
return "$tests_rc"
}

{ main; echo $? > "$out/.rc"; } 2>&1 | tee "$LOG"
rc=$(cat "$out/.rc" 2>/dev/null || echo 1)
rm -f "$out/.rc"
exit "$rc"
