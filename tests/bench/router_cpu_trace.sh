#!/usr/bin/env bash
# Router CPU per request on long prompts (docs/ROUTING.md): the Mooncake conversation trace's
# first 2 minutes (339 requests, mean prompt 14.3K token ids) replayed at 4x (SPEEDUP=) by
# kvserve-bench serve against kvserve-cluster's router and 8 --device null workers, the cluster
# on CPU 0 and the client on CPU 1; the router's user + system time from /proc over the replay, per request, and
# the same less the idle router's CPU per second (measured for 10 s before) over the replay, and
# its minor page faults per request (deterministic where the CPU figures scatter by +-15%).
# PERF=1 also samples the router with perf (cpu-clock) into $work/perf.data; SYSCALLS=1 counts
# its system calls per thread (perf trace -s) into $work/syscalls.txt. IDS=N replays
# kvserve-bench's random dataset instead: PROMPTS= (2000) prompts of N token ids, 4 output
# tokens each, at RATE= (50) requests/s (the trace argument is then not read: pass -). OUT=
# sets the output tokens per request (4) in either load.
# KEEP_ALIVE=false: the client opens a connection per request (else it reuses kept-alive ones).
# ROUTER_ARGS="..." are passed to the router (kvserve-cluster --router-args), WORKER_ARGS="..."
# to the workers instead of "--device null --num-blocks 40000". ROUTER_OWN_CPU=1 moves the workers
# to CPU 1 beside the client, leaving CPU 0 to the router (and the cluster's supervisor).
#
#   bash tests/bench/router_cpu_trace.sh BUILD_BIN_DIR TOKENIZER_DIR CONVERSATION_TRACE [PORT]
set -euo pipefail
bin=$1
tokenizer=$2
trace=$3
port=${4:-8300}
# Another cluster on the port would be the one measured (the router is found by its port).
if (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; then
  echo "port $port is in use: stop what listens there first" >&2
  exit 1
fi
work=$(mktemp -d /tmp/kvserve-router-cpu-XXXXXX)
"$bin/kvserve-make-model" --tokenizer "$tokenizer" --out "$work/model" \
  --max_position_embeddings 131072 >/dev/null
(taskset -c 0 "$bin/kvserve-cluster" --model "$work/model" --workers 8 --port $port --base-port $((port+100)) --max-model-len 131072 --curve=false --worker-args "${WORKER_ARGS:---device null --num-blocks 40000}" --router-args "${ROUTER_ARGS:-}" > $work/cpu-cluster.log 2>&1 &)
for _ in $(seq 90); do grep -q "ready" "$work/cpu-cluster.log" && break; sleep 1; done
rpid=$(pgrep -f "/kvserve-router .*--port $port" | head -1)
echo "router pid $rpid: $(tr "\0" " " < /proc/$rpid/cmdline | cut -c1-80)" >&2
if [[ -n ${ROUTER_OWN_CPU:-} ]]; then  # the router alone on CPU 0; the workers join the client
  for p in $(pgrep -f "kvserve-worker .*$work/model"); do taskset -a -p -c 1 "$p" > /dev/null; done
fi
ticks() { awk '{print $14+$15}' /proc/$rpid/stat; }
faults() { awk '{print $10}' /proc/$rpid/stat; }  # minor page faults
# The idle router's own CPU (heartbeats, periodic turns) first: it is paid per second, not per
# request, and is subtracted below for the cost a request adds.
sleep 2
i0=$(ticks); s0=$(date +%s.%N); sleep 10; i1=$(ticks); s1=$(date +%s.%N)
t0=$(ticks); f0=$(faults); r0=$(date +%s.%N)
load=(--dataset trace --trace-file "$trace" --trace-window-end-s 120 --trace-speedup "${SPEEDUP:-4}" --trace-max-output "${OUT:-4}")
[[ -n ${IDS:-} ]] && load=(--dataset random --random-input-len "$IDS" --random-output-len "${OUT:-4}" --num-prompts "${PROMPTS:-2000}" --request-rate "${RATE:-50}")
taskset -c 1 "$bin/kvserve-bench" serve --url http://127.0.0.1:$port "${load[@]}" --keep-alive=${KEEP_ALIVE:-true} --vocab-size 128256 --json-out $work/cpu.json > /dev/null 2>&1 &
bpid=$!
[[ -n ${PERF:-} ]] && perf record -e cpu-clock -g -o $work/perf.data -p $rpid -- sleep 25 > /dev/null 2>&1 &
[[ -n ${SYSCALLS:-} ]] && perf trace -s -p $rpid -o $work/syscalls.txt -- sleep 20 > /dev/null 2>&1 &
wait $bpid
t1=$(ticks); f1=$(faults); r1=$(date +%s.%N)
n=$(node -p "require('$work/cpu.json').completed")
hit=$(node -p "require('$work/cpu.json').prefix_cache_hit_rate")
awk -v n="$n" -v h="$hit" -v t="$((t1 - t0))" -v i="$((i1 - i0))" -v f="$((f1 - f0))" -v is="$s0 $s1" \
  -v rs="$r0 $r1" 'BEGIN { split(is, a, " "); split(rs, b, " "); idle = i * 10 / (a[2] - a[1]); rs = b[2] - b[1];
  printf "requests %d hit %.4f router_cpu_ms_per_request %.2f idle_ms_per_s %.2f replay_s %.1f beyond_idle_ms_per_request %.2f page_faults_per_request %.0f\n",
    n, h, t * 10 / n, idle, rs, (t * 10 - idle * rs) / n, f / n }'
pkill -f "kvserve-cluster --model $work/model" || true
# The cluster drains its workers before it exits: wait, so the next run finds the ports free and
# no worker holding this run's cache.
for _ in $(seq 40); do pgrep -f "$work/model" > /dev/null || break; sleep 1; done
pkill -9 -f "$work/model" || true
echo "work files in $work" >&2
