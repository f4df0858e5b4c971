#!/bin/sh
# make layering: which folders each folder's files may include, as an allow-list (RULES below, the
# only place it is written down; see ARCHITECTURE.md). Three rules, checked on every .c/.h/.cu:
#   - a project include names its folder ("engine/engine.h", "criteria/crit.h");
#   - a project header is included with quotes: <engine/engine.h> would pass through -Iharness
#     unseen by a reader, so it is a violation of its own (and is checked against the list too);
#   - a folder includes only the folders its RULES line names (its own is always allowed). An
#     include outside the list "reaches up a layer" when the included folder may itself (directly or
#     not) include the includer, "down past its list" when the includer reaches it only through
#     other folders, "sideways" otherwise.
# Angle includes whose first component is not a project folder (<cjson/cJSON.h>, <sys/stat.h>,
# <stdio.h>) are system headers and are not checked.
# usage: tools/layering.sh [ROOT]   (exit 1 and one line per violation: file:line: message)
RULES='
harness/base      -
harness/io        base
harness/tokenizer base
harness/model     base io
harness/engine    base model
evals             base model tokenizer engine
harness/calib     base model tokenizer engine
criteria          base model calib
harness/convert   base model calib criteria
harness/train     base io model tokenizer engine evals convert
harness/sweep     base io model tokenizer engine evals calib criteria convert train
harness/cli       base io model tokenizer engine evals calib criteria convert train sweep
'
root=${1:-.}
cd "$root" || exit 2
folders=$(printf '%s\n' "$RULES" | awk 'NF { print $1 }')
files=""
for f in $folders; do
  [ -d "$f" ] || { echo "layering: $f: folder missing" >&2; exit 2; }
  files="$files $(find "$f" -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh' | sort)"
done
# shellcheck disable=SC2086
awk -v rules="$RULES" '
  # "harness/calib" is included as "calib/...", "criteria" as "criteria/..."
  function key(folder) { sub(/^harness\//, "", folder); return folder }
  function owner(path,   k) {
    for (k in folder_of) if (index(path, folder_of[k] "/") == 1) return k
    return ""
  }
  BEGIN {
    n = split(rules, line, "\n")
    for (i = 1; i <= n; i++) {
      m = split(line[i], w, " "); if (m == 0) continue
      k = key(w[1]); folder_of[k] = w[1]; order[++nk] = k
      ok[k, k] = 1; allowed[k] = k "/"
      for (j = 2; j <= m; j++) if (w[j] != "-") { ok[k, w[j]] = 1; allowed[k] = allowed[k] " " w[j] "/" }
    }
    # reach[a, b]: a may include b through a chain of allowed includes
    for (a in folder_of) for (b in folder_of) reach[a, b] = ok[a, b]
    for (c in folder_of) for (a in folder_of) for (b in folder_of)
      if (reach[a, c] && reach[c, b]) reach[a, b] = 1
  }
  FNR == 1 { me = owner(FILENAME) }
  /^[ \t]*#[ \t]*include[ \t]*["<]/ {
    inc = $0; sub(/^[^"<]*["<]/, "", inc); sub(/[">].*$/, "", inc)
    angle = ($0 ~ /^[ \t]*#[ \t]*include[ \t]*</)
    shown = angle ? "<" inc ">" : "\"" inc "\""
    top = inc; sub(/\/.*$/, "", top)
    if (angle) {
      if (index(inc, "/") == 0 || !(top in folder_of)) next   # a system header
      printf "%s:%d: #include %s: a project header is included with quotes, \"%s\"\n", FILENAME, FNR, shown, inc
      bad = 1
    }
    if (index(inc, "/") == 0) { printf "%s:%d: #include %s does not name its folder\n", FILENAME, FNR, shown; bad = 1; next }
    if (!(top in folder_of)) { printf "%s:%d: #include %s: \"%s\" is not a layer\n", FILENAME, FNR, shown, top; bad = 1; next }
    if (ok[me, top]) next
    how = reach[top, me] ? "up a layer" : reach[me, top] ? "down past its list" : "sideways"
    printf "%s:%d: #include %s reaches %s: %s may include only %s\n", FILENAME, FNR, shown, how,
           folder_of[me], allowed[me]
    bad = 1
  }
  END {
    if (!bad) printf "layering: ok (%d folders, each on its allow-list)\n", nk
    exit bad
  }' $files
