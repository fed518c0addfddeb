#!/usr/bin/env bash
# The main job: sets up and builds kvserve, fetches the real Llama 3 tokenizer, and starts a
# local cluster (kvserve-cluster: 2 CPU workers and the router; on first use it makes a small
# random-weight Llama model around that tokenizer). Then it sends a real chat request through
# the router's OpenAI API, prints the answer (random text: the weights are random) and a cache
# summary from the workers' metrics, asks again to show the prefix cache at work, and stops.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
KVSERVE_TESTS=OFF bash scripts/build.sh
bash scripts/fetch-tokenizer.sh
port=${KVSERVE_DEMO_PORT:-8000}
log=$(mktemp)
build/bin/kvserve-cluster --model models/kvserve-tiny-llama3 --tokenizer models/llama3-tokenizer \
  --workers 2 --port "$port" >"$log" 2>&1 &
cluster=$!
trap 'kill -TERM $cluster 2>/dev/null; wait $cluster 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  grep -q "kvserve-cluster ready" "$log" && break
  kill -0 $cluster 2>/dev/null || { cat "$log"; exit 1; }
  sleep 0.2
done
grep "kvserve-cluster ready" "$log"
for _ in $(seq 1 100); do
  [[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/ready") == 200 ]] && break
  sleep 0.1
done
request='{"model": "kvserve-tiny-llama3", "max_tokens": 32, "temperature": 0.8, "seed": 7,
  "messages": [{"role": "system", "content": "You are kvserve, a serving cluster that pages its KV cache."},
               {"role": "user", "content": "Why should a serving engine page its KV cache?"}]}'
echo "== POST /v1/chat/completions"
curl -s "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' -d "$request" |
  tee /tmp/kvserve-demo-answer.json
echo
echo "== the same request again (its prompt's full blocks are now cached on the chosen worker)"
curl -s "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' -d "$request" |
  sed -e 's/.*"usage":/usage: /'
echo
echo "== cache summary (worker metrics)"
for metrics in 5572 5575; do
  curl -s "http://127.0.0.1:$metrics/metrics" |
    grep -E '^(kvserve_kv_blocks\{|kvserve_prefix_cache_(queried|hit)_tokens_total|kvserve_generation_tokens_total)' |
    grep -E 'device|queried|generation' || true
done
