#!/usr/bin/env bash
# The router's own capacity and added latency (docs/RELIABILITY.md): two kvserve-worker
# --device null (the real server and protocol, a fixed token at once, no model), a router in
# front with --api-threads N, and kvserve-bench serve with one output token per request:
#   saturation   unlimited rate, 32 in flight: requests/s
#   half load    a Poisson rate of half that: p50 / p99 time to the first token at the client
#                (the router, the null workers, the kernel and the client together), and the
#                router's own part from its kvserve_router_added_latency_seconds histogram:
#                request to worker (parse, tokenize, hash, place) and first reply to client
# for 100- and 4000-token prompts, sent as token ids and as text (tokenized by the router), and
# the router's CPU time per request at saturation (user + system, from /proc).
#
#   tests/bench/router_capacity.sh BUILD_BIN_DIR TOKENIZER_DIR [API_THREADS...] > table.md
# Environment: ROUTER_CPUS / OTHER_CPUS (taskset lists) pin the router and the rest (workers,
# client) apart; ROUTER_BIN runs another kvserve-router build; LENGTHS (default "100 4000").
set -euo pipefail
bin=$1
tokenizer=$2
shift 2
threads=("$@")
[[ $# -gt 0 ]] || threads=(1 2)
work=$(mktemp -d /tmp/kvserve-capacity-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

"$bin/kvserve-make-model" --tokenizer "$tokenizer" --out "$work/model" > /dev/null
free_port() {
  node -e 'const s = require("net").createServer().listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); })'
}
field() { node -p "require('$work/r.json').$1"; }
router_pin=(); other_pin=()  # taskset execs its command: $! stays the process's own pid
[[ -n ${ROUTER_CPUS:-} ]] && router_pin=(taskset -c "$ROUTER_CPUS")
[[ -n ${OTHER_CPUS:-} ]] && other_pin=(taskset -c "$OTHER_CPUS")
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

workers=()
for i in 0 1; do
  p=$(free_port); e=$(free_port); m=$(free_port)
  "${other_pin[@]}" "$bin/kvserve-worker" --model "$work/model" --device null --num-blocks 16384 --max-num-seqs 256 \
    --max-model-len 8192 --port "$p" --events-port "$e" --metrics-port "$m" > "$work/worker$i.log" 2>&1 &
  pids+=($!)
  workers+=("127.0.0.1:$p:$e")
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$m/ready" > /dev/null && break; sleep 0.1; done
done

here=$(cd "$(dirname "$0")" && pwd)
added() {  # p50 and p99 (ms) of the router's added latency at `stage` over the last run
  node "$here/quantiles.mjs" "$work/before.txt" "$work/after.txt" \
    kvserve_router_added_latency_seconds "stage=\"$1\""
}
echo "| --api-threads | prompt | tokens | saturation (req/s) | router CPU per request (ms) | half load (req/s) | TTFT p50 / p99 (ms) | router: to worker p50 / p99 (ms) | router: to client p50 / p99 (ms) | failed |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for n in "${threads[@]}"; do
  port=$(free_port)
  "${router_pin[@]}" "${ROUTER_BIN:-$bin/kvserve-router}" --model "$work/model" --served-model-name tiny --port "$port" \
    --workers "$(IFS=,; echo "${workers[*]}")" --api-threads "$n" --max-model-len 8192 \
    --max-queued-requests 100000 > "$work/router$n.log" 2>&1 &
  router=$!
  pids+=($router)
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/ready" > /dev/null && break; sleep 0.1; done
  for len in ${LENGTHS:-100 4000}; do
    prompts=$(( len == 100 ? 3000 : 600 ))
    for format in ids text; do
      text=false; [[ $format == text ]] && text=true
      bench() {
        "${other_pin[@]}" "$bin/kvserve-bench" serve --url "http://127.0.0.1:$port" --random-input-len "$len" \
          --random-output-len 1 --vocab-size 120000 --text-prompts="$text" "$@" \
          --json_out "$work/r.json" > /dev/null
      }
      ticks=$(cpu_ticks "$router")
      bench --num-prompts "$prompts" --max-concurrency 32
      sat=$(field request_throughput)
      cpu_ms=$(node -p "($(cpu_ticks "$router") - $ticks) * 1000 / $(getconf CLK_TCK) / $prompts")
      curl -s "http://127.0.0.1:$port/metrics" > "$work/before.txt"
      bench --num-prompts $(( prompts / 2 )) --request-rate "$(node -p "$sat / 2")"
      curl -s "http://127.0.0.1:$port/metrics" > "$work/after.txt"
      read -r w50 w99 <<< "$(added to_worker)"
      read -r c50 c99 <<< "$(added to_client)"
      printf '| %s | %s | %s | %.0f | %.2f | %.0f | %.2f / %.2f | %.3f / %.3f | %.3f / %.3f | %s |\n' \
        "$n" "$format" "$len" "$sat" "$cpu_ms" "$(field request_throughput)" "$(field median_ttft_ms)" \
        "$(field p99_ttft_ms)" "$w50" "$w99" "$c50" "$c99" "$(field failed)"
    done
  done
  kill "$router"; wait "$router" 2>/dev/null || true
done
