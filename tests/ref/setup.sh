#!/bin/sh
# Makes a git-ignored Python virtual environment holding the pinned test references, once, and
# records the outcome in one line that the tests read instead of retrying the install.
#
#   sh tests/ref/setup.sh light   tests/ref/.venv     tokenizers + lm-eval (requirements.txt):
#                                                      the default `make test` path
#   sh tests/ref/setup.sh hf      tests/ref/.venv-hf  torch + transformers (requirements-hf.txt):
#                                                      `make verify-hf` and `make hf-goldens` only
#
# Outcome, in VENV.status (one line): "ok", "no-python: WHY" (the tests skip) or "failed: WHY"
# (the tests fail). Exit status 0, 2 and 1 respectively. A venv whose stamp (the sha256 of its
# requirements file) matches is reused without asking the registry; anything else is rebuilt.
# The only network access is pip's, to PyPI, and only while (re)building.
set -u
kind=${1:-light}
here=$(cd "$(dirname "$0")" && pwd)
case "$kind" in
  light) venv="$here/.venv"; req="$here/requirements.txt" ;;
  hf) venv="$here/.venv-hf"; req="$here/requirements-hf.txt" ;;
  *) echo "usage: tests/ref/setup.sh light|hf" >&2; exit 64 ;;
esac
status="$venv.status"
py=${PYTHON:-python3}

say() { # say CODE LINE: record the outcome, print it, exit
  printf '%s\n' "$2" > "$status"
  if [ "$1" = 0 ]; then echo "ref ($kind): ready ($venv)"; else echo "ref ($kind): $2" >&2; fi
  exit "$1"
}

if ! command -v "$py" >/dev/null 2>&1; then
  say 2 "no-python: $py is not installed (make deps installs python3 and python3-venv)"
fi
want=$(sha256sum "$req" | cut -d' ' -f1)

build() {
  if [ -f "$venv/.stamp" ] && [ "$(cat "$venv/.stamp")" = "$want" ] && "$venv/bin/python" -c 'import sys' 2>/dev/null; then
    return 0
  fi
  rm -rf "$venv"
  log="$venv.log"
  t0=$(date +%s)
  echo "ref ($kind): installing $(grep -c '==' "$req") pinned packages into $venv (PyPI) ..."
  if ! "$py" -m venv "$venv" > "$log" 2>&1; then
    rm -rf "$venv"
    echo "python venv failed (install python3-venv: make deps): $(tail -1 "$log")"
    return 1
  fi
  # one short attempt: an unreachable registry fails within seconds, not after pip's 5 retries
  if ! "$venv/bin/pip" install --disable-pip-version-check --no-input --progress-bar off \
      --retries 1 --timeout 30 -r "$req" >> "$log" 2>&1; then
    rm -rf "$venv"
    echo "pip install -r $req failed: $(grep -i 'error' "$log" | tail -1) (full log: $log)"
    return 1
  fi
  printf '%s\n' "$want" > "$venv/.stamp"
  echo "ref ($kind): installed in $(( $(date +%s) - t0 )) s"
}

# serialised, so that two runs sharing the checkout never build the same venv at once
lock="$venv.lock"
if command -v flock >/dev/null 2>&1; then
  out=$( (flock 9; build) 9>"$lock" ); rc=$?
else
  out=$(build); rc=$?
fi
if [ "$rc" != 0 ]; then say 1 "failed: $(printf '%s\n' "$out" | tail -1)"; fi
[ -n "$out" ] && printf '%s\n' "$out"
say 0 ok
