#!/bin/sh
# Installs the Debian packages moe2dense needs (as root), or prints the apt-get line (git: test_plugins
# copies the tracked tree; cmake, time: make bench-peer builds llama.cpp and times it).
PKGS="build-essential pkg-config libopenblas-dev liblapacke-dev libcjson-dev libcsv-dev libpcre2-dev \
libutf8proc-dev libdnnl-dev libcmocka-dev gnuplot-nox bzip2 curl unzip clang libclang-rt-14-dev slurm-wlm git \
cmake time"
# python3 + venv: the tests' references (Hugging Face tokenizers, lm-eval; transformers and torch
# for make verify-hf) are pip-installed from PyPI into a git-ignored venv (tests/ref/setup.sh);
# python3 also checks CPython's random
PKGS="$PKGS python3 python3-venv"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -z "$missing" ]; then echo "deps: all installed"; exit 0; fi
if [ "$(id -u)" = 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends $missing
else
  echo "deps: missing:$missing"
  echo "run: sudo apt-get install -y$missing"
  exit 1
fi
