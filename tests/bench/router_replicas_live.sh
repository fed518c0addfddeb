#!/usr/bin/env bash
# Router replicas live (docs/ROUTING.md, "Multi-replica routers"): kvserve-cluster's 8
# kvserve-worker --device sim processes (simulated H200s, Llama-3.1-8B's shape, pools of
# FRACTION of the slice's unique tokens) behind REPLICAS kvserve-router processes (the
# cluster's own and REPLICAS - 1 more on the same workers), a slice of a Mooncake trace replayed
# by kvserve-bench serve at its own timestamps (/ SPEEDUP), each request to the next router in
# turn (a round-robin balancer). Run once per REPLICAS: each run starts a fresh cluster, so no
# cache carries over. Prints the hit rate, requests per worker, TTFT and the decisions.
# SPREAD_MS=N spreads the requests of each binned timestamp over up to N ms
# (kvserve-bench --trace-spread-arrivals-ms; 0, the default: as recorded).
#
#   [SPREAD_MS=3000] bash tests/bench/router_replicas_live.sh BUILD_BIN_DIR TOKENIZER_DIR TRACE \
#     REPLICAS [WINDOW_END_S=300] [SPEEDUP=1] [FRACTION=0.05] [PORT=8600]
set -euo pipefail
bin=$1
tokenizer=$2
trace=$3
replicas=$4
window=${5:-300}
speedup=${6:-1}
fraction=${7:-0.05}
port=${8:-8600}
here=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d /tmp/kvserve-replicas-live-XXXXXX)
mkdir "$work/model"
cp "$here/tools/route_sim/models/llama-3.1-8b/config.json" "$work/model/"
cp "$tokenizer/tokenizer.json" "$tokenizer/tokenizer_config.json" "$work/model/"
# The pool size the simulator gives this slice (the same rule as route_sim_live_trace.sh).
"$bin/kvserve-route-sim" --trace "$trace" --model "$work/model" --workers 8 \
  --window-end-s "$window" --speedup "$speedup" --capacity-fraction "$fraction" \
  --policies round_robin --instant > "$work/sim.txt"
blocks=$(sed -n 's/.* workers of \([0-9]*\) blocks.*/\1/p' "$work/sim.txt")
base=$((port + 100))
"$bin/kvserve-cluster" --model "$work/model" --workers 8 --port "$port" --base-port "$base" \
  --max-model-len 131072 --curve=false \
  --worker-args "--device sim --sim-gpu h200 --num-blocks $blocks --max-num-batched-tokens 2048 --max-num-seqs 256" \
  > "$work/cluster.log" 2>&1 &
for i in $(seq 120); do grep -q "ready" "$work/cluster.log" && break; sleep 1; done
workers=$(for i in $(seq 0 7); do printf '127.0.0.1:%d:%d,' $((base + 3 * i)) $((base + 3 * i + 1)); done)
urls="http://127.0.0.1:$port"
for r in $(seq 1 $((replicas - 1))); do
  "$bin/kvserve-router" --model "$work/model" --host 127.0.0.1 --port $((port + r)) \
    --workers "${workers%,}" --max-model-len 131072 --router-id "replica-$r" \
    > "$work/router-$r.log" 2>&1 &
  urls="$urls,http://127.0.0.1:$((port + r))"
done
for r in $(seq 1 $((replicas - 1))); do
  for i in $(seq 60); do grep -q "8/8 workers ready" "$work/router-$r.log" && break; sleep 1; done
done
"$bin/kvserve-bench" serve --url "$urls" --dataset trace --trace-file "$trace" \
  --trace-window-end-s "$window" --trace-speedup "$speedup" --vocab-size 128256 \
  --trace-spread-arrivals-ms "${SPREAD_MS:-0}" \
  --json-out "$work/live.json" > "$work/bench.txt" 2>&1
pkill -f "kvserve-router --model $work/model" || true
pkill -f "kvserve-cluster --model $work/model" || true
for i in $(seq 40); do pgrep -f "$work/model" > /dev/null || break; sleep 1; done
pkill -9 -f "$work/model" || true
node -e '
const live = JSON.parse(require("fs").readFileSync(process.argv[1]));
const sorted = (a) => a.slice().sort((x, y) => x - y).join(" ");
console.log(`replicas ${process.argv[2]}: requests ${live.completed} (failed ${live.failed}), ` +
  `hit rate ${(100 * live.prefix_cache_hit_rate).toFixed(2)}%, ` +
  `per worker ${sorted(Object.values(live.requests_per_worker))}, ` +
  `ttft p50/p90/p99 ms ${live.median_ttft_ms.toFixed(0)} / ${live.p90_ttft_ms.toFixed(0)} / ` +
  `${live.p99_ttft_ms.toFixed(0)}, decisions ${JSON.stringify(live.decisions)}`);
' "$work/live.json" "$replicas"
echo "reports in $work" >&2
