#!/bin/sh
# make data: populate DATA_DIR from a local mirror (links, sha256-checked) or from upstream.
# usage: tools/data.sh MIRROR DATA_DIR
set -u
mirror=$1; dest=$2
manifest="$dest/MANIFEST"
[ -f "$manifest" ] || { echo "data: $manifest: manifest missing" >&2; exit 1; }
fail=0
have_mirror=0
[ -d "$mirror" ] && have_mirror=1 && mirror=$(cd "$mirror" && pwd)
check_sha() { # file expected
  [ "$2" = "-" ] && return 0
  got=$(sha256sum "$1" | cut -d' ' -f1)
  [ "$got" = "$2" ] || { echo "data: $1: sha256 mismatch (got $got, want $2)" >&2; return 1; }
}
# the file or member of an upstream download, placed at DATA_DIR/REL only once its sha256 holds
# (a file there counts as done on the next run); a download that fails the check is dropped
fetch_upstream() { # rel sha url
  url=${3%%#*}; member=""
  case "$3" in *#*) member=${3#*#};; esac
  [ "$url" = "-" ] && { echo "data: $1: no upstream source (only in a mirror)" >&2; return 1; }
  cache="$dest/.downloads/$(basename "$url")"
  mkdir -p "$dest/.downloads" "$(dirname "$dest/$1")"
  if [ ! -s "$cache" ]; then
    echo "data: downloading $url"
    curl -fsSL --retry 3 -o "$cache.part" "$url" && mv "$cache.part" "$cache" || { echo "data: $url: download failed" >&2; return 1; }
  fi
  part="$dest/$1.part"; rm -rf "$part"
  if [ -z "$member" ]; then cp "$cache" "$part" || return 1
  else
    tmp="$dest/.downloads/x"; rm -rf "$tmp"; mkdir -p "$tmp"
    case "$cache" in
      *.zip) unzip -q -o "$cache" "$member*" -d "$tmp" ;;
      *.tar) tar -xf "$cache" -C "$tmp" "$member" ;;
    esac || { echo "data: $cache: member $member missing" >&2; return 1; }
    mv "$tmp/$member" "$part" || return 1
  fi
  if [ -f "$part" ] && ! check_sha "$part" "$2"; then
    rm -rf "$part" "$cache"
    return 1
  fi
  rm -rf "$dest/$1" && mv "$part" "$dest/$1"
}
while IFS='|' read -r rel sha url; do
  case "$rel" in ''|'#'*) continue;; esac
  if [ -e "$dest/$rel" ]; then continue; fi
  if [ $have_mirror = 1 ] && [ -e "$mirror/$rel" ]; then
    mkdir -p "$(dirname "$dest/$rel")"
    if [ -f "$mirror/$rel" ]; then check_sha "$mirror/$rel" "$sha" || { fail=1; continue; }; fi
    # -f: a dangling link of a mirror that moved is replaced (-e above is false for it)
    ln -sfn "$mirror/$rel" "$dest/$rel" || fail=1
  elif [ $have_mirror = 1 ]; then
    # known gaps of the shared mirror (see its SOURCES.md): note them, don't download
    echo "data: $rel: not in mirror $mirror (documented gap; tasks fall back where they can)"
  else
    fetch_upstream "$rel" "$sha" "$url" || fail=1
  fi
done < "$manifest"
# docs that tasks consult
for f in LM_EVAL_TASKS.md SOURCES.md; do
  [ -e "$dest/$f" ] || { [ $have_mirror = 1 ] && [ -e "$mirror/$f" ] && { ln -sfn "$mirror/$f" "$dest/$f" || fail=1; }; }
done
# HellaSwag text variant ships bz2-compressed; tasks read the decompressed file.
hs="$dest/hellaswag/derived/klosax-hellaswag_text_data"
if [ -e "$hs/hellaswag_val_full.txt.bz2" ] && [ ! -e "$hs/hellaswag_val_full.txt" ]; then
  bunzip2 -kc "$hs/hellaswag_val_full.txt.bz2" > "$hs/hellaswag_val_full.txt.part" &&
    check_sha "$hs/hellaswag_val_full.txt.part" d572539320eb2050e858ca34b495bbe2103e3b3f1391a9c3bcdf215b0bb93bd1 &&
    mv "$hs/hellaswag_val_full.txt.part" "$hs/hellaswag_val_full.txt" || fail=1
fi
[ $fail = 0 ] && echo "data: $dest ready" || { echo "data: some files failed (see above)" >&2; exit 1; }
