#!/usr/bin/env bash
# The repository stands alone: no tracked file refers to the folder beside the checkout that
# only the project's own machines have (a clone has nothing beside it).
#
#   self_contained_test.sh SOURCE_DIR
set -uo pipefail
cd "$1" || exit 1
if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "SKIP: $1 is not a git checkout"
  exit 77
fi
pattern='\.\./shared'
hits=$(git grep -n -E "$pattern")
if [[ -n $hits ]]; then
  echo "tracked files refer to the shared folder beside the checkout, which a clone lacks:"
  echo "$hits"
  exit 1
fi
echo "no tracked file refers to the shared folder beside the checkout"
