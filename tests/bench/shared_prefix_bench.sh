#!/usr/bin/env bash
# The router's shared-prefix acceptance run: for each policy and seed, a fresh local cluster
# (router + 4 CPU workers, kvserve-cluster) and SGLang's generated-shared-prefix workload
# (16 groups × 4 prompts in random order, 512-token system prompt, 32-token question, 16 output
# tokens) from kvserve-bench serve. Prints one line per run (hit rate, requests per worker,
# throughput, TTFT and TPOT); the JSON reports stay in OUT_DIR. POLICIES picks the router
# policies, "cost prefix round_robin" by default (cost is the router's default).
#
#   bash tests/bench/shared_prefix_bench.sh [BUILD_DIR] [CONCURRENCY] [SEEDS...]
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
concurrency=${2:-4}
shift $(( $# > 2 ? 2 : $# )) || true
seeds=("${@:-1 2 3}")
out=${OUT_DIR:-/tmp/kvserve-shared-prefix}
mkdir -p "$out"
port=${PORT:-8190}
policies=${POLICIES:-cost prefix round_robin}
printf '%-12s %4s %4s %9s %9s %9s %6s %17s %9s %s\n' policy seed conc hit_rate ideal of_ideal \
  req/s ttft_mean/p99_ms tpot_ms requests_per_worker
for seed in ${seeds[*]}; do
  for policy in $policies; do
    "$build/bin/kvserve-cluster" --workers 4 --port "$port" --base-port 5800 --policy "$policy" \
      >"$out/cluster.log" 2>&1 &
    cluster=$!
    for _ in $(seq 120); do
      grep -q "kvserve-cluster ready" "$out/cluster.log" && break
      sleep 0.5
    done
    json="$out/$policy-seed$seed-c$concurrency.json"
    "$build/bin/kvserve-bench" serve --url "http://127.0.0.1:$port" --dataset shared-prefix \
      --gsp-num-groups 16 --gsp-prompts-per-group 4 --gsp-system-prompt-len 512 \
      --gsp-question-len 32 --gsp-output-len 16 --max-concurrency "$concurrency" --seed "$seed" \
      --json-out "$json" >/dev/null
    kill -INT "$cluster"
    wait "$cluster" || true
    python3 - "$json" "$policy" "$seed" "$concurrency" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
per = sorted(r["requests_per_worker"].values())
print(f"{sys.argv[2]:12} {sys.argv[3]:>4} {sys.argv[4]:>4} {r['prefix_cache_hit_rate']:9.4f} "
      f"{r['ideal_prefix_cache_hit_rate']:9.4f} "
      f"{r['prefix_cache_hit_rate'] / r['ideal_prefix_cache_hit_rate']:9.3f} "
      f"{r['request_throughput']:6.1f} {r['mean_ttft_ms']:8.0f}/{r['p99_ttft_ms']:<8.0f} "
      f"{r['mean_tpot_ms']:9.1f} {per}")
PY
  done
done
