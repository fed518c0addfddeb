#!/usr/bin/env bash
# A missing or corrupt model fixture makes the tests that read it fail with a message naming the
# file, never crash. Breaks a copy of the fixtures three ways and runs test binaries on it:
# those given with --must-fail must exit 1 and name the file; every binary must exit 0 or 1
# (gtest's pass or fail; a signal or abort is a crash), and name the file when it fails.
#
#   fixture_errors_test.sh FIXTURES_DIR [--must-fail] BINARY... [--may-fail BINARY...]
set -uo pipefail
fixtures=$1
shift
must=() may=() list=must
for arg in "$@"; do
  case $arg in
    --must-fail) list=must ;;
    --may-fail) list=may ;;
    *) if [[ $list == must ]]; then must+=("$arg"); else may+=("$arg"); fi ;;
  esac
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

# case name, the file it breaks (relative to the fixtures), how
break_fixture() {
  local dir=$1 how=$2 file=$3
  case $how in
    missing) rm -rf "${dir:?}/$(dirname "$file")" ;;
    truncated) head -c 1000 "$dir/$file" >"$dir/$file.tmp" && mv "$dir/$file.tmp" "$dir/$file" ;;
    garbled) printf '{"prompts": [[1, 2], "x"' >"$dir/$file" ;;
  esac
}

check() {  # binary, must_fail, case, file
  local bin=$1 must_fail=$2 how=$3 file=$4 log rc
  log="$work/$(basename "$bin")-$how.log"
  KVSERVE_FIXTURES="$work/fixtures" timeout 300 "$bin" >"$log" 2>&1
  rc=$?
  local name
  name=$(basename "$file")
  [[ $how == missing ]] && name=$(dirname "$file")
  if ((rc != 0 && rc != 1)); then
    echo "FAIL: $(basename "$bin") with a $how $file: exit $rc (a crash); last lines:"
    tail -n 5 "$log"
    failures=$((failures + 1))
  elif ((rc == 0 && must_fail)); then
    echo "FAIL: $(basename "$bin") passed with a $how $file"
    failures=$((failures + 1))
  elif ((rc == 1)) && ! grep -q "$name" "$log"; then
    echo "FAIL: $(basename "$bin") failed with a $how $file without naming $name; last lines:"
    tail -n 5 "$log"
    failures=$((failures + 1))
  else
    echo "ok: $(basename "$bin") with a $how $file: exit $rc"
  fi
}

for spec in missing:tiny-qwen2/config.json truncated:tiny-llama3/model.safetensors \
            garbled:tiny-qwen3/reference.json; do
  how=${spec%%:*} file=${spec#*:}
  rm -rf "$work/fixtures"
  cp -r "$fixtures" "$work/fixtures"
  break_fixture "$work/fixtures" "$how" "$file"
  for bin in "${must[@]}"; do check "$bin" 1 "$how" "$file"; done
  for bin in "${may[@]}"; do check "$bin" 0 "$how" "$file"; done
done
echo "$((3 * (${#must[@]} + ${#may[@]}) - failures)) passed, $failures failed"
((failures == 0))
