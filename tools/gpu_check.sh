#!/bin/sh
# make gpu-check: everything that needs a GPU, in one command, on a machine with an NVIDIA GPU
# (H100/H200: sm_90) and the CUDA toolkit:
#   1. the GPU, its driver and the toolkit (nvidia-smi, nvcc)
#   2. `make CUDA=1` (build-cuda/: the default build is left alone)
#   3. the GPU tests with the GPU required (M2D_REQUIRE_GPU=1: "no GPU" fails instead of skipping):
#      test_engine (every op, engine and golden test on the cuda backend next to the CPU one) and
#      test_ppl (`ppl --device cuda` against the CPU's perplexity)
#   4. bench_cuda (cuBLASLt GEMM peak; pp512 / PPL-eval tokens/s on Qwen3-30B-A3B-shaped 2-layer
#      slices) and tools/bench_hf_gpu.py (transformers bf16, eager and SDPA, same checkpoints),
#      when python3 has torch and transformers
# Everything is also written to $LOG (default build-cuda/gpu-check.log; the device tool's $OUT if
# set). Exit status: non-zero if the build or a test failed; the benchmarks only report.
set -u
cd "$(dirname "$0")/.." || exit 2
out=${OUT:-build-cuda}
mkdir -p "$out"
LOG=${LOG:-$out/gpu-check.log}
MODELS=${M2D_MODELS:-../shared/models}
DATA=${M2D_DATA:-data}
BENCH_DIR=${BENCH_DIR:-/tmp/m2d-gpu-check}

step() { echo; echo "== $* == ($(date -u +%H:%M:%SZ))"; }

main() {

step "GPU and toolkit"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader || {
  echo "gpu-check: nvidia-smi failed: no NVIDIA GPU or driver here"; return 1; }
nvcc=${NVCC:-${CUDA_HOME:-/usr/local/cuda}/bin/nvcc}
[ -x "$nvcc" ] || { echo "gpu-check: no nvcc at $nvcc (set CUDA_HOME or NVCC)"; return 1; }
"$nvcc" --version | tail -2
lscpu | sed -n 's/^Model name: *//p'

step "build dependencies"
missing=""
for pair in cblas.h:libopenblas-dev lapacke.h:liblapacke-dev dnnl.h:libdnnl-dev cjson/cJSON.h:libcjson-dev \
            csv.h:libcsv-dev pcre2.h:libpcre2-dev utf8proc.h:libutf8proc-dev cmocka.h:libcmocka-dev; do
  printf '#define PCRE2_CODE_UNIT_WIDTH 8\n#include <stdarg.h>\n#include <stddef.h>\n#include <setjmp.h>\n#include <stdint.h>\n#include <%s>\n' \
    "${pair%%:*}" | ${CC:-cc} -I/usr/include/openblas -E -x c - >/dev/null 2>&1 || missing="$missing ${pair#*:}"
done
if [ -n "$missing" ]; then
  echo "gpu-check: missing build dependencies:$missing (tools/deps.sh installs them)"; return 1
fi
echo "all present"

step "make CUDA=1"
jobs=$(nproc 2>/dev/null || echo 2)
make -j"$jobs" CUDA=1 build-cuda/moe2dense build-cuda/tests/test_engine build-cuda/tests/test_ppl \
  build-cuda/bench/bench_cuda || { echo "gpu-check: the CUDA=1 build failed"; return 1; }

step "GPU tests (a missing GPU fails)"
[ -d "$MODELS" ] || echo "note: $MODELS missing: the golden tests that read it skip"
[ -d "$DATA" ] || make data || echo "note: no data/: the ppl CLI test skips"
M2D_REQUIRE_GPU=1 M2D_BIN=build-cuda/moe2dense M2D_DATA="$DATA" M2D_MODELS="$MODELS" M2D_BUILD=build-cuda \
  sh tests/run.sh build-cuda/tests/test_engine build-cuda/tests/test_ppl
tests_rc=$?
# the per-test lines with measured differences (cpu vs cuda), for the record
M2D_REQUIRE_GPU=1 M2D_MODELS="$MODELS" build-cuda/tests/test_engine 2>&1 | grep -v '^\[ *\(RUN\|OK\) ' | grep -i "max\|nll\|skip\|fail" | head -60

step "bench_cuda"
M2D_REQUIRE_GPU=1 build-cuda/bench/bench_cuda "$BENCH_DIR"

step "transformers on the same GPU and checkpoints"
if python3 -c 'import torch, transformers; assert torch.cuda.is_available()' 2>/dev/null; then
  python3 tools/bench_hf_gpu.py "$BENCH_DIR/qwen3-30b-a3b-2l" "$BENCH_DIR/qwen3-30b-a3b-2l-dense-k8" 2>&1 |
    grep -v "Loading weights"
else
  echo "skipped: python3 lacks torch/transformers with CUDA"
fi

step "done"
echo "tests: exit $tests_rc"
return "$tests_rc"
}

{ main; echo $? > "$LOG.rc"; } 2>&1 | tee "$LOG"
rc=$(cat "$LOG.rc" 2>/dev/null || echo 1)
rm -f "$LOG.rc"
exit "$rc"
