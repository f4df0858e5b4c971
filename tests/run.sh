#!/bin/sh
# Runs every cmocka test binary given, then prints one closing line that CI reads:
#   "tests: N passed, N failed, N skipped"
# A binary that crashes (no cmocka summary) counts as one failure.
passed=0; failed=0; skipped=0; bad=""
# Progress lines (m2d_progress) off: stderr is captured here, and a test checks the output it
# expects, not a progress line that a slow machine happens to print (test_util sets it back).
export M2D_QUIET=1
# With M2D_REF_SETUP=1 (make test) the test references' venv (tests/ref/setup.sh) is made once,
# here, before any test: a failed install counts as one failure with one message ("ref-setup"),
# and the tests that need it read the recorded outcome and skip instead of retrying the install.
if [ "${M2D_REF_SETUP:-0}" = 1 ]; then
  sh tests/ref/setup.sh light; rc=$?
  if [ "$rc" -eq 1 ]; then
    failed=1; bad=" ref-setup"
    printf '%-32s %4d passed %3d failed %3d skipped\n' ref-setup 0 1 0
  fi
  export M2D_REF_COUNTED=1
fi
for t in "$@"; do
  name=$(basename "$t")
  out=$("$t" 2>&1); rc=$?
  p=$(printf '%s\n' "$out" | sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' | awk '{s+=$1} END {print s+0}')
  f=$(printf '%s\n' "$out" | sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' | awk '{s+=$1} END {print s+0}')
  s=$(printf '%s\n' "$out" | sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' | awk '{s+=$1} END {print s+0}')
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
  passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
  if [ "$f" -ne 0 ]; then
    bad="$bad $name"
    printf '%s\n' "$out" | grep -v '^\[       OK \]\|^\[ RUN      \]' | tail -40
  fi
  printf '%-32s %4d passed %3d failed %3d skipped\n' "$name" "$p" "$f" "$s"
done
[ -n "$bad" ] && echo "failing:$bad"
echo "tests: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
