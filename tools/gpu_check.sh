#!/bin/sh
# make gpu-check: everything that needs a GPU, in one command, on a machine with an NVIDIA GPU
# (H100/H200: sm_90), the CUDA toolkit and this project's build dependencies (tools/deps.sh). The
# same path as a GPU machine without them takes (README, "GPU"): tools/gpu_bundle.sh builds
# `make CUDA=1` (build-cuda/; the default build is left alone) and packs the GPU checks, then
# tools/gpu_run.sh runs them — the GPU tests with the GPU required, one configuration and the demo
# grid on both devices, bench_cuda and transformers on the same checkpoints. Logs in $OUT (default
# build-cuda/gpu-check/). Exit status: non-zero if the build or a test failed.
set -u
cd "$(dirname "$0")/.." || exit 2
sh tools/gpu_bundle.sh || { echo "gpu-check: the CUDA=1 build or the bundle failed"; exit 1; }
OUT=${OUT:-build-cuda/gpu-check} exec sh tools/gpu_run.sh gpu-bundle/bundle.tar.xz
