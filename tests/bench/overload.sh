#!/usr/bin/env bash
# Overload (docs/RELIABILITY.md): a local cluster of two CPU workers (the random-weight test
# model, --max-num-seqs 8) behind a router with a short queue (--max-queued-requests 64,
# --max-queue-wait-seconds 5). Measures capacity (unlimited rate, 32 in flight), then offers
# three times that for DURATION seconds (Poisson), then half of capacity to show recovery. Prints
# each phase's kvserve-bench summary and the workers' preemptions.
#
#   tests/bench/overload.sh BUILD_BIN_DIR TOKENIZER_DIR [DURATION (60)]
set -euo pipefail
bin=$1
tokenizer=$2
duration=${3:-60}
work=$(mktemp -d /tmp/kvserve-overload-XXXXXX)
cluster=
cleanup() {
  [[ -n $cluster ]] && kill "$cluster" 2>/dev/null && wait "$cluster" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

free_port() {
  node -e 'const s = require("net").createServer().listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); })'
}
field() { [[ -f $work/r.json ]] && node -p "require('$work/r.json').$1" || echo "(no report)"; }
"$bin/kvserve-make-model" --tokenizer "$tokenizer" --out "$work/model" > /dev/null
port=$(free_port)
base=$(( $(free_port) / 10 * 10 ))
"$bin/kvserve-cluster" --model "$work/model" --workers 2 --port "$port" --base-port "$base" \
  --max-model-len 2048 \
  --router-args "--max-queued-requests 64 --max-queue-wait-seconds 5" \
  -- --max-num-seqs 8 --num-blocks 1024 > "$work/cluster.log" 2>&1 &
cluster=$!
for _ in $(seq 600); do grep -q "kvserve-cluster ready" "$work/cluster.log" && break; sleep 0.2; done

bench() {
  rm -f "$work/r.json"
  "$bin/kvserve-bench" serve --url "http://127.0.0.1:$port" --random-input-len 128 \
    --random-output-len 32 --vocab-size 120000 --json_out "$work/r.json" "$@" > /dev/null || true  # non-zero when some failed
  printf '%s: %s req/s offered, %s completed, %s failed, %s req/s served, e2e p50 %s ms p99 %s ms, TTFT p99 %s ms; first error: %s\n' \
    "$phase" "$offered" "$(field completed)" "$(field failed)" "$(field request_throughput)" \
    "$(field median_e2el_ms)" "$(field p99_e2el_ms)" "$(field p99_ttft_ms)" \
    "$(node -p "require('$work/r.json').errors[0] ?? 'none'")"
}
preemptions() {
  local total=0
  for i in 0 1; do
    n=$(curl -s "http://127.0.0.1:$(( base + 3 * i + 2 ))/metrics" |
        awk '/^kvserve_preemptions_total/ { s += $2 } END { print s + 0 }')
    total=$(( total + ${n%.*} ))
  done
  echo "$total"
}

phase=capacity offered=unlimited bench --num-prompts 300 --max-concurrency 32
capacity=$(field request_throughput)
before=$(preemptions)
offered=$(node -p "($capacity * 3).toFixed(1)")
phase="3x capacity for ${duration} s" bench --num-prompts "$(node -p "Math.round($offered * $duration)")" \
  --request-rate "$offered"
echo "preemptions during overload: $(( $(preemptions) - before ))"
offered=$(node -p "($capacity / 2).toFixed(1)")
phase="recovery at half capacity" bench --num-prompts "$(node -p "Math.round($offered * 20)")" \
  --request-rate "$offered"
