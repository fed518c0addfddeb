#!/usr/bin/env bash
# The routing study of docs/ROUTING.md: every policy side by side on the same requests with
# kvserve-route-sim, 8 workers, pools of 5% and 20% of the replayed window's unique tokens,
# under load (sim workers: H200 steps for Llama-3.1-8B's shape) and at light load (instant
# steps, as null workers), plus one pooled cache of the same total size.
#
#   bash tests/bench/routing_study.sh BUILD_BIN_DIR MOONCAKE_TRACES_DIR [OUT_DIR]
# MOONCAKE_TRACES_DIR holds conversation_trace.jsonl and synthetic_trace.jsonl from
# github.com/kvcache-ai/Mooncake, FAST25-release/traces/ (not shipped here). The generated
# multi-turn shape is made by kvserve-trace-gen. Run from the repository root.
set -euo pipefail
bin=${1:?usage: routing_study.sh BUILD_BIN_DIR MOONCAKE_TRACES_DIR [OUT_DIR]}
traces=${2:?usage: routing_study.sh BUILD_BIN_DIR MOONCAKE_TRACES_DIR [OUT_DIR]}
out=${3:-$(mktemp -d)}
mkdir -p "$out"
"$bin/kvserve-trace-gen" --shape multi-turn --duration-s 1200 --rate 1.2 --seed 1 \
  --out "$out/multi-turn.jsonl" >/dev/null
policies=cost,prefix,round_robin,least_load,greedy
run() {  # NAME TRACE ARGS...
  local name=$1 trace=$2
  shift 2
  echo "== $name"
  "$bin/kvserve-route-sim" --trace "$trace" --workers 8 --policies "$policies" --pooled \
    --json-out "$out/$name.json" "$@" | tail -n +2
}
for cap in 0.05 0.20; do
  run "conversation-20min-cap$cap-load" "$traces/conversation_trace.jsonl" --window-end-s 1200 \
    --capacity-fraction "$cap"
  run "conversation-20min-cap$cap-light" "$traces/conversation_trace.jsonl" --window-end-s 1200 \
    --capacity-fraction "$cap" --instant
  run "synthetic-cap$cap-load" "$traces/synthetic_trace.jsonl" --capacity-fraction "$cap"
  run "synthetic-cap$cap-light" "$traces/synthetic_trace.jsonl" --capacity-fraction "$cap" --instant
  run "multi-turn-cap$cap-load" "$out/multi-turn.jsonl" --capacity-fraction "$cap"
  run "multi-turn-cap$cap-light" "$out/multi-turn.jsonl" --capacity-fraction "$cap" --instant
done
echo "reports in $out"
