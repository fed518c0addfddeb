#!/usr/bin/env bash
# The routing simulator against the live cluster on a slice of a Mooncake trace
# (docs/ROUTING.md): kvserve-cluster's router (default flags: the cost policy) and 8
# kvserve-worker --device sim processes (simulated H200s, Llama-3.1-8B's shape, pools of
# FRACTION of the slice's unique tokens), the slice replayed by kvserve-bench serve at its own
# timestamps (/ SPEEDUP); then kvserve-route-sim on the same requests, workers and pools.
# Prints both reports' hit rate, requests per worker and TTFT side by side. DEVICE=null runs
# --device null workers (steps take no time: light load) against the simulator's --instant.
#
#   bash tests/bench/route_sim_live_trace.sh BUILD_BIN_DIR TOKENIZER_DIR TRACE \
#     [WINDOW_END_S=120] [SPEEDUP=1] [FRACTION=0.05] [PORT=8500]
set -euo pipefail
bin=$1
tokenizer=$2
trace=$3
window=${4:-120}
speedup=${5:-1}
fraction=${6:-0.05}
port=${7:-8500}
device=${DEVICE:-sim}
case $device in
  sim) sim_device=(--gpu h200) worker_device="--device sim --sim-gpu h200" ;;
  null) sim_device=(--instant) worker_device="--device null" ;;
  *) echo "DEVICE='$device' is not sim or null" >&2; exit 2 ;;
esac
here=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d /tmp/kvserve-route-live-XXXXXX)
mkdir "$work/model"
cp "$here/tools/route_sim/models/llama-3.1-8b/config.json" "$work/model/"
cp "$tokenizer/tokenizer.json" "$tokenizer/tokenizer_config.json" "$work/model/"
sim_args=(--trace "$trace" --model "$work/model" --workers 8 --window-end-s "$window"
  --speedup "$speedup" "${sim_device[@]}" --max-num-batched-tokens 2048 --max-num-seqs 256
  --policies cost --json-out "$work/sim.json")
"$bin/kvserve-route-sim" "${sim_args[@]}" --capacity-fraction "$fraction" > "$work/sim.txt"
blocks=$(sed -n 's/.* workers of \([0-9]*\) blocks.*/\1/p' "$work/sim.txt")
echo "8 workers of $blocks blocks" >&2
"$bin/kvserve-cluster" --model "$work/model" --workers 8 --port "$port" \
  --base-port $((port + 100)) --max-model-len 131072 --curve=false \
  --worker-args "$worker_device --num-blocks $blocks --max-num-batched-tokens 2048 --max-num-seqs 256" \
  > "$work/cluster.log" 2>&1 &
for i in $(seq 120); do grep -q "ready" "$work/cluster.log" && break; sleep 1; done
"$bin/kvserve-bench" serve --url "http://127.0.0.1:$port" --dataset trace --trace-file "$trace" \
  --trace-window-end-s "$window" --trace-speedup "$speedup" --vocab-size 128256 \
  --json-out "$work/live.json" > "$work/bench.txt" 2>&1
pkill -f "kvserve-cluster --model $work/model" || true
for i in $(seq 40); do pgrep -f "$work/model" > /dev/null || break; sleep 1; done
pkill -9 -f "$work/model" || true
node -e '
const [live, sim] = process.argv.slice(1).map((f) => JSON.parse(require("fs").readFileSync(f)));
const s = sim.cost;
const sorted = (a) => a.slice().sort((x, y) => x - y).join(" / ");
console.log(`requests   live ${live.completed} (failed ${live.failed})   sim ${s.requests}`);
console.log(`hit rate   live ${(100 * live.prefix_cache_hit_rate).toFixed(2)}%   sim ${(100 * s.hit_rate).toFixed(2)}%`);
console.log(`per worker live ${sorted(Object.values(live.requests_per_worker))}`);
console.log(`           sim  ${sorted(s.workers.map((w) => w.requests))}`);
console.log(`ttft p50/p99 ms live ${live.median_ttft_ms.toFixed(0)} / ${live.p99_ttft_ms.toFixed(0)}   sim ${s.p50_ttft_ms.toFixed(0)} / ${s.p99_ttft_ms.toFixed(0)}`);
console.log(`decisions  live ${JSON.stringify(live.decisions)}   sim ${JSON.stringify(s.decisions)}`);
' "$work/live.json" "$work/sim.json"
echo "reports in $work" >&2
