#!/bin/sh
# make layering: every file of a layer may include headers of its own layer or of a lower one, and
# every project include names its folder ("engine/engine.h", "criteria/crit.h"). The order below,
# lowest first, is the only place the layering is written down; see ARCHITECTURE.md.
# usage: tools/layering.sh [ROOT]   (exit 1 and one line per violation: file:line: message)
LAYERS="harness/base harness/io harness/tokenizer harness/model harness/engine evals harness/calib
criteria harness/convert harness/train harness/sweep harness/cli"
root=${1:-.}
cd "$root" || exit 2
# include prefix of a layer: harness/X is included as "X/...", a top-level folder as "folder/..."
prefix() { case "$1" in harness/*) echo "${1#harness/}" ;; *) echo "$1" ;; esac; }
map=""; i=0
for l in $LAYERS; do map="$map $(prefix "$l")=$i"; i=$((i + 1)); done
bad=0; i=0
for l in $LAYERS; do
  [ -d "$l" ] || { echo "layering: $l: layer folder missing" >&2; exit 2; }
  files=$(find "$l" -name '*.[ch]' | sort)
  if [ -n "$files" ]; then
    # shellcheck disable=SC2086
    awk -v level="$i" -v map="$map" '
      BEGIN { n = split(map, kv, " "); for (j = 1; j <= n; j++) { split(kv[j], p, "="); lv[p[1]] = p[2] } }
      /^[ \t]*#[ \t]*include[ \t]*"/ {
        inc = $0; sub(/^[^"]*"/, "", inc); sub(/".*$/, "", inc)
        if (index(inc, "/") == 0) { printf "%s:%d: #include \"%s\" does not name its folder\n", FILENAME, FNR, inc; bad = 1; next }
        top = inc; sub(/\/.*$/, "", top)
        if (!(top in lv)) { printf "%s:%d: #include \"%s\": \"%s\" is not a layer\n", FILENAME, FNR, inc, top; bad = 1; next }
        if (lv[top] + 0 > level + 0) { printf "%s:%d: #include \"%s\" reaches up a layer\n", FILENAME, FNR, inc; bad = 1 }
      }
      END { exit bad }' $files || bad=1
  fi
  i=$((i + 1))
done
[ "$bad" = 0 ] && echo "layering: ok ($(echo $LAYERS | wc -w) layers)"
exit "$bad"
