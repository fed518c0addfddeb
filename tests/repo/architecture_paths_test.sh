#!/usr/bin/env bash
# Every file or folder that docs/ARCHITECTURE.md names in backticks (a relative path with a '/',
# such as `worker/engine.h` or `tools/bench/`) exists in the source tree.
#
#   architecture_paths_test.sh SOURCE_DIR
set -uo pipefail
cd "$1" || exit 1
doc=docs/ARCHITECTURE.md
[[ -f $doc ]] || { echo "$doc is missing"; exit 1; }
paths=$(grep -o '`[^`]*`' "$doc" | tr -d '`' | tr ', ' '\n\n' |
  grep -E '^[A-Za-z][A-Za-z0-9_.-]*(/[A-Za-z0-9_.-]+)+/?$' | sort -u)
count=$(grep -c . <<<"$paths")
if ((count < 20)); then
  echo "$doc names only $count paths: is the extraction broken?"
  exit 1
fi
missing=0
while read -r p; do
  if [[ ! -e $p ]]; then
    echo "$doc names $p, which does not exist"
    missing=$((missing + 1))
  fi
done <<<"$paths"
echo "$((count - missing)) passed, $missing failed"
((missing == 0))
