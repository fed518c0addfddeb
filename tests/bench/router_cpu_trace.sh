#!/usr/bin/env bash
# Router CPU per request on long prompts (docs/ROUTING.md): the Mooncake conversation trace's
# first 2 minutes (339 requests, mean prompt 12K token ids) replayed at 4x by kvserve-bench serve
# against kvserve-cluster's router and 8 --device null workers, the cluster on CPU 0 and the
# client on CPU 1; the router's user + system time from /proc over the replay, per request.
# PERF=1 also samples the router with perf (cpu-clock) into $work/perf.data.
#
#   bash tests/bench/router_cpu_trace.sh BUILD_BIN_DIR TOKENIZER_DIR CONVERSATION_TRACE [PORT]
set -euo pipefail
bin=$1
tokenizer=$2
trace=$3
port=${4:-8300}
work=$(mktemp -d /tmp/kvserve-router-cpu-XXXXXX)
"$bin/kvserve-make-model" --tokenizer "$tokenizer" --out "$work/model" \
  --max_position_embeddings 131072 >/dev/null
(taskset -c 0 "$bin/kvserve-cluster" --model "$work/model" --workers 8 --port $port --base-port $((port+100)) --max-model-len 131072 --curve=false --worker-args "--device null --num-blocks 40000" > $work/cpu-cluster.log 2>&1 &)
for i in $(seq 90); do grep -q "ready" $work/cpu-cluster.log && break; sleep 1; done
rpid=$(pgrep -f "bin/kvserve-router .*--port $port" | head -1)
echo "router pid $rpid: $(tr "\0" " " < /proc/$rpid/cmdline | cut -c1-80)" >&2
t0=$(awk '{print $14+$15}' /proc/$rpid/stat)
taskset -c 1 "$bin/kvserve-bench" serve --url http://127.0.0.1:$port --dataset trace --trace-file "$trace" --trace-window-end-s 120 --trace-speedup 4 --trace-max-output 4 --vocab-size 128256 --json-out $work/cpu.json > /dev/null 2>&1 &
bpid=$!
[[ -n ${PERF:-} ]] && perf record -e cpu-clock -g -o $work/perf.data -p $rpid -- sleep 25 > /dev/null 2>&1 &
wait $bpid
t1=$(awk '{print $14+$15}' /proc/$rpid/stat)
n=$(node -p "require('$work/cpu.json').completed")
hit=$(node -p "require('$work/cpu.json').prefix_cache_hit_rate")
awk -v n="$n" -v h="$hit" -v t="$((t1 - t0))" 'BEGIN { printf "requests %d hit %.4f router_cpu_ms_per_request %.2f\n", n, h, t * 10 / n }'
pkill -f "kvserve-cluster --model $work/model" || true
