// Writes the Grafana dashboards the chart ships (deploy/helm/kvserve/dashboards/*.json) from the
// panel lists below; `--check` fails if the committed files differ from what this writes.
//
//   node deploy/grafana/generate.mjs [--check]
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const outDir = path.join(path.dirname(fileURLToPath(import.meta.url)), '../helm/kvserve/dashboards');
const ns = 'namespace=~"$namespace"';
const nsw = `${ns}, worker=~"$worker"`;
// The workers' own vllm:* series: each router also serves them summed over its workers (no
// `worker` label), which a sum over the namespace would count again.
const nsWorkers = `${ns}, worker!=""`;
const rate = (expr) => `rate(${expr}[$__rate_interval])`;

// A panel: title, unit, and its queries as [PromQL, legend].
const p = (title, unit, ...targets) => ({ title, unit, targets });
const quantiles = (metric, by = '', sel = ns) => [0.5, 0.95, 0.99].map((q) => [
  `histogram_quantile(${q}, sum by (le${by}) (${rate(`${metric}_bucket{${sel}}`)}))`, `p${q * 100}`]);

const dashboards = {
  'kvserve-overview': {
    title: 'kvserve / Cluster overview',
    panels: [
      p('Requests by status', 'reqps', [`sum by (status) (${rate(`kvserve_router_requests_total{${ns}}`)})`, '{{status}}']),
      p('Error ratio (5xx)', 'percentunit', [
        `(sum(${rate(`kvserve_router_requests_total{status=~"5..", ${ns}}`)}) or vector(0)) / sum(${rate(`kvserve_router_requests_total{${ns}}`)})`, '5xx']),
      p('Time to first token', 's', ...quantiles('kvserve_router_time_to_first_token_seconds')),
      p('Inter-token latency', 's', ...quantiles('vllm:inter_token_latency_seconds', '', nsWorkers)),
      p('End-to-end latency', 's', ...quantiles('kvserve_router_e2e_request_latency_seconds')),
      p('Tokens per second', 'short',
        [`sum(${rate(`vllm:prompt_tokens_total{${nsWorkers}}`)})`, 'prompt'],
        [`sum(${rate(`vllm:generation_tokens_total{${nsWorkers}}`)})`, 'generation']),
      p('Workers serving', 'short',
        [`count(kvserve_draining{${ns}} == 0) or vector(0)`, 'serving'],
        [`sum(kvserve_draining{${ns}})`, 'draining']),
      p('Requests running and waiting', 'short', [`sum by (state) (kvserve_requests{${ns}})`, '{{state}}']),
    ],
  },
  'kvserve-kv-cache': {
    title: 'kvserve / KV cache per worker',
    panels: [
      p('KV blocks by tier and state', 'short', [`sum by (worker, tier, state) (kvserve_kv_blocks{state!="total", ${nsw}})`, '{{worker}} {{tier}} {{state}}']),
      p('KV block usage', 'percentunit', [`kvserve_kv_block_usage_ratio{${nsw}}`, '{{worker}} {{tier}}']),
      p('KV token usage (fill of allocated blocks)', 'percentunit', [`kvserve_kv_token_usage_ratio{${nsw}}`, '{{worker}}']),
      p('Fragmentation (allocated slots without a token)', 'short', [`kvserve_kv_fragmentation_slots{${nsw}}`, '{{worker}}']),
      p('Prefix cache hit rate by tier', 'percentunit', [
        `sum by (worker, tier) (${rate(`kvserve_prefix_cache_hit_tokens_total{${nsw}}`)}) / ignoring(tier) group_left sum by (worker) (${rate(`kvserve_prefix_cache_queried_tokens_total{${nsw}}`)})`,
        '{{worker}} {{tier}}']),
      p('Swap bytes', 'Bps', [`sum by (worker, direction) (${rate(`kvserve_swap_bytes_total{${nsw}}`)})`, '{{worker}} {{direction}}']),
      p('Preemptions', 'ops', [`sum by (worker, mode) (${rate(`kvserve_preemptions_total{${nsw}}`)})`, '{{worker}} {{mode}}']),
      p('Evictions and host spills', 'ops',
        [`sum by (worker) (${rate(`kvserve_kv_evictions_total{${nsw}}`)})`, '{{worker}} evicted'],
        [`sum by (worker) (${rate(`kvserve_kv_host_spilled_blocks_total{${nsw}}`)})`, '{{worker}} spilled to host']),
    ],
  },
  'kvserve-router': {
    title: 'kvserve / Router',
    panels: [
      p('Routing decisions by reason', 'ops', [`sum by (reason) (${rate(`kvserve_router_decisions_total{${ns}}`)})`, '{{reason}}']),
      p('Routing accuracy (reported / predicted cached tokens)', 'percentunit', [
        `sum(${rate(`kvserve_router_prefix_tokens_total{kind="reported", ${ns}}`)}) / sum(${rate(`kvserve_router_prefix_tokens_total{kind="predicted", ${ns}}`)})`, 'accuracy']),
      p('Predicted vs reported cached tokens', 'short', [`sum by (kind) (${rate(`kvserve_router_prefix_tokens_total{${ns}}`)})`, '{{kind}}']),
      p('Load per worker (blocks in flight)', 'short', [`max by (worker) (kvserve_router_worker_load_blocks{${nsw}})`, '{{worker}}']),
      p('Requests routed per worker', 'reqps', [`sum by (worker) (${rate(`kvserve_router_routed_total{${nsw}}`)})`, '{{worker}}']),
      p('KV-event lag', 's', [`max by (worker) (kvserve_router_kv_event_lag_seconds{${nsw}})`, '{{worker}}']),
      p('KV-event gaps and snapshot resyncs', 'ops',
        [`sum by (worker) (${rate(`kvserve_router_kv_event_gaps_total{${nsw}}`)})`, '{{worker}} gaps'],
        [`sum by (worker) (${rate(`kvserve_router_kv_snapshots_total{${nsw}}`)})`, '{{worker}} snapshots']),
      p('Prefix index blocks per worker', 'short', [`max by (worker) (kvserve_router_index_blocks{${nsw}})`, '{{worker}}']),
      p('Index evictions and dropped worker messages', 'ops',
        [`sum by (worker) (${rate(`kvserve_router_index_evictions_total{${nsw}}`)})`, '{{worker}} evicted'],
        [`sum by (worker) (${rate(`kvserve_router_dropped_messages_total{${nsw}}`)})`, '{{worker}} dropped']),
    ],
  },
  'kvserve-admission': {
    title: 'kvserve / Admission and connections',
    panels: [
      p('Requests waiting at the routers', 'short', [`sum(kvserve_router_queue_depth{${ns}})`, 'queued']),
      p('Wait at the router for a worker with room', 's', ...quantiles('kvserve_router_queue_wait_seconds')),
      p('Refused (429) and timed-out (504) requests', 'reqps',
        [`sum by (reason) (${rate(`kvserve_router_rejected_requests_total{${ns}}`)})`, '{{reason}}']),
      p('Requests in flight per worker (router view)', 'short',
        [`sum by (worker) (kvserve_router_worker_inflight_requests{${nsw}})`, '{{worker}}']),
      p("Router's own added latency (p99)", 's', [
        `histogram_quantile(0.99, sum by (le, stage) (${rate(`kvserve_router_added_latency_seconds_bucket{${ns}}`)}))`,
        '{{stage}}']),
      p('Client connections', 'short',
        [`sum(kvserve_router_open_connections{${ns}})`, 'open'],
        [`sum(${rate(`kvserve_router_connections_refused_total{${ns}}`)})`, 'refused/s'],
        [`sum(${rate(`kvserve_router_slow_clients_total{${ns}}`)})`, 'slow clients dropped/s']),
      p('Replies lost, waiting and dropped on the worker link', 'short',
        [`sum by (worker) (${rate(`kvserve_router_reply_gaps_total{${nsw}}`)})`, '{{worker}} gaps/s'],
        [`sum by (worker) (kvserve_replies_waiting{${nsw}})`, '{{worker}} waiting'],
        [`sum by (worker) (${rate(`kvserve_replies_dropped_total{${nsw}}`)})`, '{{worker}} dropped/s']),
    ],
  },
  'kvserve-kv-transfer': {
    title: 'kvserve / KV transfer between workers',
    panels: [
      p('Peer fetches by result', 'ops', [`sum by (result) (${rate(`kvserve_router_kv_fetches_total{${ns}}`)})`, '{{result}}']),
      p('Fetch fallbacks and retries by reason', 'ops',
        [`sum by (reason) (${rate(`kvserve_router_kv_fetch_fallbacks_total{${ns}}`)})`, 'fallback {{reason}}'],
        [`sum by (reason) (${rate(`kvserve_router_kv_fetch_retries_total{${ns}}`)})`, 'retry {{reason}}']),
      p('Fetch time (ask to last ack)', 's', ...quantiles('kvserve_router_kv_fetch_seconds')),
      p('Achieved fetch rate (GB/s)', 'short', [`max(kvserve_router_kv_fetch_gbps{${ns}})`, 'GB/s']),
      p('Device-to-device links', 'short',
        [`max(kvserve_router_kv_links_ready{${ns}})`, 'ready'],
        [`sum by (result) (${rate(`kvserve_router_kv_link_transfers_total{${ns}}`)})`, 'transfers {{result}}/s']),
      p('KV bytes moved per worker', 'Bps',
        [`sum by (worker, direction, format) (${rate(`kvserve_kv_transfer_bytes_total{${nsw}}`)})`, '{{worker}} {{direction}} {{format}}']),
      p('KV blocks moved per worker', 'ops',
        [`sum by (worker, direction) (${rate(`kvserve_kv_transfer_blocks_total{${nsw}}`)})`, '{{worker}} {{direction}}']),
      p('Chunk time per worker (p99)', 's', [
        `histogram_quantile(0.99, sum by (le, worker, direction) (${rate(`kvserve_kv_transfer_chunk_seconds_bucket{${nsw}}`)}))`,
        '{{worker}} {{direction}}']),
      p('Chunks refused or not exported', 'ops',
        [`sum by (worker, direction, reason) (${rate(`kvserve_kv_transfer_failures_total{${nsw}}`)})`, '{{worker}} {{direction}} {{reason}}']),
    ],
  },
  'kvserve-lifecycle': {
    title: 'kvserve / Lifecycle',
    panels: [
      p('Recycles by reason (1h)', 'short', [`sum by (reason) (increase(kvserve_recycles_total{${ns}}[1h]))`, '{{reason}}']),
      p('Restarts per worker (1h)', 'short', [`sum by (worker) (resets(kvserve_uptime_seconds{${nsw}}[1h]))`, '{{worker}}']),
      p('Draining workers', 'short', [`kvserve_draining{${nsw}}`, '{{worker}}']),
      p('Worker uptime', 's', [`kvserve_uptime_seconds{${nsw}}`, '{{worker}}']),
      p('Requests finished by reason', 'reqps', [`sum by (finished_reason) (${rate(`kvserve_requests_finished_total{${ns}}`)})`, '{{finished_reason}}']),
    ],
  },
};

function variable(name, query) {
  return {
    name, type: 'query', datasource: { type: 'prometheus', uid: '${datasource}' }, query: { query, refId: name },
    definition: query, includeAll: true, allValue: '.*', multi: true, refresh: 2, current: {},
  };
}

function dashboard(uid, { title, panels }) {
  return {
    uid, title, tags: ['kvserve'], editable: true, schemaVersion: 39, version: 1, refresh: '30s',
    time: { from: 'now-6h', to: 'now' },
    templating: {
      list: [
        { name: 'datasource', type: 'datasource', query: 'prometheus', current: {} },
        variable('namespace', 'label_values(kvserve_uptime_seconds, namespace)'),
        variable('worker', 'label_values(kvserve_uptime_seconds{namespace=~"$namespace"}, worker)'),
      ],
    },
    panels: panels.map((panel, i) => ({
      id: i + 1, type: 'timeseries', title: panel.title,
      datasource: { type: 'prometheus', uid: '${datasource}' },
      gridPos: { h: 8, w: 12, x: (i % 2) * 12, y: Math.floor(i / 2) * 8 },
      fieldConfig: { defaults: { unit: panel.unit }, overrides: [] },
      targets: panel.targets.map(([expr, legendFormat], j) => ({
        refId: String.fromCharCode(65 + j), expr, legendFormat,
        datasource: { type: 'prometheus', uid: '${datasource}' },
      })),
    })),
  };
}

let stale = 0;
for (const [uid, d] of Object.entries(dashboards)) {
  const file = path.join(outDir, `${uid}.json`);
  const text = `${JSON.stringify(dashboard(uid, d), null, 2)}\n`;
  if (process.argv.includes('--check')) {
    let old = '';
    try { old = readFileSync(file, 'utf8'); } catch { /* missing counts as stale */ }
    if (old !== text) {
      console.error(`${file} is not what deploy/grafana/generate.mjs writes: run it`);
      stale++;
    }
  } else {
    writeFileSync(file, text);
  }
}
process.exit(stale ? 1 : 0);
