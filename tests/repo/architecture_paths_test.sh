#!/usr/bin/env bash
# Every file or folder that docs/ARCHITECTURE.md names in backticks (a relative path with a '/',
# such as `worker/engine.h` or `tools/bench/`) exists in the source tree, and every type or
# function it names (`WorkerServer`, `RouterCore::Loop`, `kMaxPlacementAttempts`) is in the code:
# a name on a line of C++ or protobuf that is not a comment, and a member A::B in the code of a
# file that declares A or defines A::B.
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

# Code lines (comments dropped) of the sources that may declare a name.
code_lines() {  # PATTERN [FILES...]: non-comment lines matching the extended regex
  local pattern=$1
  shift
  # (Not grep -q: it would exit at the first match, and under pipefail the SIGPIPE of the
  # greps still writing would fail a name that is there.)
  grep -hE "$pattern" "$@" 2>/dev/null | grep -vE '^[[:space:]]*(//|\*|/\*)' |
    grep -E "$pattern" >/dev/null
}
mapfile -t sources < <(find common frontend epp upstream worker router kernels proto tools tests/testing -type f \
  \( -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' -o -name '*.proto' \))
names=$(grep -o '`[^`]*`' "$doc" | tr -d '`' | tr ', ' '\n\n' |
  grep -E '^(k[A-Z]|[A-Z])[A-Za-z0-9_]*[a-z][A-Za-z0-9_]*(::[A-Za-z_][A-Za-z0-9_]*)?(\(\))?$' |
  sed 's/()$//' | sort -u)
named=$(grep -c . <<<"$names")
if ((named < 10)); then
  echo "$doc names only $named types and functions: is the extraction broken?"
  exit 1
fi
while read -r n; do
  if [[ $n == *::* ]]; then
    owner=${n%%::*} member=${n#*::}
    code_lines "\\b$owner::$member\\b" "${sources[@]}" && continue
    mapfile -t decl < <(grep -lE "\\b(class|struct|message|enum class|enum|namespace) $owner\\b" \
      "${sources[@]}")
    ((${#decl[@]})) && code_lines "\\b$member\\b" "${decl[@]}" && continue
  else
    code_lines "\\b$n\\b" "${sources[@]}" && continue
  fi
  echo "$doc names $n, which the code does not declare"
  missing=$((missing + 1))
done <<<"$names"
count=$((count + named))
echo "$((count - missing)) passed, $missing failed"
((missing == 0))
