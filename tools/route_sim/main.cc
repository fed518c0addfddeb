// kvserve-route-sim: replays a request trace (Mooncake JSONL) against N simulated GPU workers in
// virtual time, routed by the router's own policies, and compares policies side by side on the
// same requests (tools/route_sim/simulator.h; docs/ROUTING.md has the runs).
//
//   kvserve-route-sim --trace conversation_trace.jsonl --workers 8 --capacity-fraction 0.05
//       --policies cost,prefix,round_robin,least_load,greedy --pooled [--instant]
//       [--gpu h200] [--speedup 4] [--window-end-s 1200] [--json-out FILE]
//       [--kv-fetch-gbps 1,10] [--prefill-workers 1 --disagg-gbps 10]
#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/init.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "router/routing_flags.h"
#include "tools/route_sim/goodput.h"
#include "tools/route_sim/simulator.h"

ABSL_FLAG(std::string, trace, "",
          "The trace: Mooncake JSONL (timestamp, input_length, "
          "output_length, hash_ids)");
ABSL_FLAG(int32_t, trace_block_size, 512, "Tokens per hash id in the trace");
ABSL_FLAG(int64_t, spread_arrivals_ms, 0,
          "Spread each group of requests that share a timestamp over the gap to the next one, at "
          "most this many ms (the published traces bin their timestamps, 3 s apart in the "
          "conversation trace; tools/trace/trace.h SpreadArrivals); 0: all at the timestamp");
ABSL_FLAG(uint64_t, spread_seed, 1, "With --spread-arrivals-ms: the draw of the arrivals");
ABSL_FLAG(int32_t, workers, 8, "Workers");
ABSL_FLAG(int32_t, replicas, 1, "Router replicas, requests spread over them in turn");
ABSL_FLAG(std::string, replica_load, "reports",
          "What a replica takes for a worker's load: reports (the worker's load report plus its "
          "own placements the report had not seen, as kvserve-router does) or own (its own "
          "placements alone)");
ABSL_FLAG(double, report_interval_ms, 50, "With --replica-load reports: how often workers report");
ABSL_FLAG(double, capacity_fraction, 0.05,
          "Each worker's KV pool as a fraction of the window's unique tokens");
ABSL_FLAG(int64_t, capacity_blocks, 0, "Each worker's KV pool in blocks (instead of the fraction)");
ABSL_FLAG(std::string, model, "tools/route_sim/models/llama-3.1-8b",
          "Model directory whose config.json gives the shape (no weights are read)");
ABSL_FLAG(int32_t, block_size, 16, "KV block size in tokens");
ABSL_FLAG(std::string, gpu, "h200", "The simulated GPU: h100, h200, a100");
ABSL_FLAG(int32_t, max_num_batched_tokens, 2048, "Each worker's prefill chunk per step");
ABSL_FLAG(int32_t, max_num_seqs, 256, "Each worker's most sequences at once");
ABSL_FLAG(int32_t, router_max_inflight_per_worker, 0,
          "The router's admission limit (kvserve-router's --max-inflight-per-worker): a replica "
          "holds requests while each worker has this many of its own (0: none held)");
ABSL_FLAG(std::string, router_queue_order, "fcfs",
          "With --router-max-inflight-per-worker: which held request is placed first, fcfs or "
          "shortest-uncached (the shortest prompt less what the workers cache of it)");
ABSL_FLAG(std::string, policies, "cost,prefix,round_robin,least_load,greedy",
          "Policies to compare on the same requests: the router's (cost, prefix, round_robin, "
          "least_load, session) and greedy (the longest cached prefix, load ignored)");
ABSL_FLAG(bool, pooled, false,
          "Also run one worker holding every worker's pool, steps taking no time: the hit rate of "
          "one pooled cache");
ABSL_FLAG(bool, instant, false, "Steps take no time (light load, as null workers)");
ABSL_FLAG(double, speedup, 1.0, "Trace time divided by this");
ABSL_FLAG(double, window_start_s, 0, "Replay requests from this trace second...");
ABSL_FLAG(double, window_end_s, 1e12, "...to this one");
ABSL_FLAG(int64_t, max_output, 0, "Cap on output lengths (0: the trace's)");
ABSL_FLAG(std::string, json_out, "", "Write every run's report here");
ABSL_FLAG(bool, goodput, false,
          "Instead of one run per policy, find each policy's highest rate within the SLO "
          "(--slo-ttft-p99-ms, --slo-tpot-p99-ms) by replaying the trace faster or slower");
ABSL_FLAG(double, slo_ttft_p99_ms, 2000, "--goodput: the SLO's TTFT p99, milliseconds");
ABSL_FLAG(double, slo_tpot_p99_ms, 100, "--goodput: the SLO's TPOT p99, milliseconds");
ABSL_FLAG(double, goodput_min_speedup, 0.05, "--goodput: the slowest replay tried");
ABSL_FLAG(double, goodput_max_speedup, 20, "--goodput: the fastest replay tried");
ABSL_FLAG(int32_t, goodput_steps, 10, "--goodput: bisections between the two");
ABSL_FLAG(
    std::string, kv_fetch_gbps, "",
    "Also run each policy with peer prefix fetch (router/routing/fetch_plan.h) over a link of each "
    "of these rates, GB/s, comma-separated (e.g. \"1,10\"; empty: none)");
ABSL_FLAG(int32_t, kv_fetch_min_blocks, 4, "With --kv-fetch-gbps: the fewest blocks worth a fetch");
ABSL_FLAG(int32_t, prefill_workers, 0,
          "Also run each policy disaggregated: this many of --workers only prefill, the rest "
          "decode (docs/DISAGGREGATION.md; 0: no such run)");
ABSL_FLAG(int64_t, max_local_prefill_tokens, 1000,
          "Disaggregated runs: a request its decode worker would prefill more of than this is "
          "prefilled on a prefill worker (kvserve-router's flag)");
ABSL_FLAG(double, disagg_gbps, 10,
          "Disaggregated runs: the rate of the link from prefill to decode workers, GB/s");
ABSL_FLAG(bool, disagg_stream_layers, true,
          "Disaggregated runs: also run with layer streaming (the phase's blocks sent as its "
          "steps compute them), beside the transfer once the phase ended");
ABSL_FLAG(bool, router_cost, false,
          "Under each run, what one router replica's placing and KV-event taking cost on this "
          "CPU (per request, per second, the index's size; docs/ROUTING.md)");

namespace kvserve::route_sim {
namespace {

absl::StatusOr<SimOptions> BaseOptions(const std::vector<trace::TraceRequest>& trace) {
  SimOptions o;
  o.router_cost = absl::GetFlag(FLAGS_router_cost);
  o.workers = absl::GetFlag(FLAGS_workers);
  o.replicas = absl::GetFlag(FLAGS_replicas);
  const std::string load = absl::GetFlag(FLAGS_replica_load);
  if (load != "reports" && load != "own") {
    return absl::InvalidArgumentError(
        absl::StrCat("--replica-load must be reports or own, not '", load, "'"));
  }
  o.replica_load =
      load == "own" ? SimOptions::ReplicaLoad::kOwn : SimOptions::ReplicaLoad::kReports;
  o.report_interval_s = absl::GetFlag(FLAGS_report_interval_ms) / 1000;
  o.trace_block_size = absl::GetFlag(FLAGS_trace_block_size);
  o.engine.model_dir = absl::GetFlag(FLAGS_model);
  o.engine.cache.block_size = absl::GetFlag(FLAGS_block_size);
  o.engine.max_model_len = 0;
  o.engine.scheduler.max_num_batched_tokens = absl::GetFlag(FLAGS_max_num_batched_tokens);
  o.engine.scheduler.max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs);
  ASSIGN_OR_RETURN(o.engine.backend.sim_gpu, worker::GpuPreset(absl::GetFlag(FLAGS_gpu)));
  o.instant = absl::GetFlag(FLAGS_instant);
  o.speedup = absl::GetFlag(FLAGS_speedup);
  o.router_max_inflight = absl::GetFlag(FLAGS_router_max_inflight_per_worker);
  const std::string order = absl::GetFlag(FLAGS_router_queue_order);
  if (order != "fcfs" && order != "shortest-uncached") {
    return absl::InvalidArgumentError(
        absl::StrCat("--router-queue-order must be fcfs or shortest-uncached, not '", order, "'"));
  }
  o.queue_order = order == "fcfs" ? QueueOrder::kFirstCome : QueueOrder::kShortestUncached;
  o.window_start_ms = static_cast<int64_t>(absl::GetFlag(FLAGS_window_start_s) * 1000);
  o.window_end_ms = static_cast<int64_t>(std::min(absl::GetFlag(FLAGS_window_end_s), 1e12) * 1000);
  o.max_output = absl::GetFlag(FLAGS_max_output);
  // The routing flags kvserve-router takes (router/routing_flags.h), but --policy: the runs'
  // policies come from --policies.
  if (FlagChanged("policy")) {
    return absl::InvalidArgumentError("kvserve-route-sim takes --policies A,B,..., not --policy");
  }
  const std::vector<std::string> policies =
      absl::StrSplit(absl::GetFlag(FLAGS_policies), ',', absl::SkipEmpty());
  ASSIGN_OR_RETURN(o.routing, router::RoutingConfigFromFlags(policies));
  o.capacity_blocks = absl::GetFlag(FLAGS_capacity_blocks);
  if (o.capacity_blocks == 0) {
    const std::vector<trace::TraceRequest> window =
        trace::Window(trace, o.window_start_ms, o.window_end_ms);
    const double fraction = absl::GetFlag(FLAGS_capacity_fraction);
    if (!(fraction > 0)) return absl::InvalidArgumentError("--capacity-fraction must be > 0");
    o.capacity_blocks = static_cast<int64_t>(
        fraction * static_cast<double>(trace::UniqueTokens(window, o.trace_block_size)) /
        o.engine.cache.block_size);
  }
  return o;
}

void PrintRow(const std::string& name, const nlohmann::json& r, double wall_s) {
  const double req_ratio =
      r["requests_per_worker_min"].get<double>() > 0
          ? r["requests_per_worker_max"].get<double>() / r["requests_per_worker_min"].get<double>()
          : 0;
  std::cout << absl::StrFormat(
      "%-18s %7.2f%% %8.2f %9.0f %9.0f %9.0f %8.1f %8.1f %6.1f%% %7lld %7.1f  %s\n", name,
      100 * r["hit_rate"].get<double>(), req_ratio, r["p50_ttft_ms"].get<double>(),
      r["p90_ttft_ms"].get<double>(), r["p99_ttft_ms"].get<double>(),
      r["p50_tpot_ms"].get<double>(), r["p99_tpot_ms"].get<double>(),
      100 * r["utilization"].get<double>(), static_cast<long long>(r["errors"].get<int64_t>()),
      wall_s, r["decisions"].dump());
  if (r["disaggregated"].get<int64_t>() > 0) {
    std::cout << absl::StrFormat(
        "%-18s disaggregated %lld, blocks moved in %.1f s of link, %.1f s of it after the "
        "phases\n",
        "", static_cast<long long>(r["disaggregated"].get<int64_t>()),
        r["fetch_seconds"].get<double>(), r["exposed_fetch_seconds"].get<double>());
  }
  if (r["fetches"].get<int64_t>() > 0) {
    std::cout << absl::StrFormat(
        "%-18s fetches %lld, blocks fetched %lld, link busy %.1f s, "
        "fallbacks %s\n",
        "", static_cast<long long>(r["fetches"].get<int64_t>()),
        static_cast<long long>(r["fetched_blocks"].get<int64_t>()),
        r["fetch_seconds"].get<double>(), r["fetch_fallbacks"].dump());
  }
}

// --kv-fetch-gbps's rates (checked, with --kv-fetch-min-blocks).
absl::StatusOr<std::vector<double>> FetchRates() {
  std::vector<double> rates;
  for (absl::string_view g :
       absl::StrSplit(absl::GetFlag(FLAGS_kv_fetch_gbps), ',', absl::SkipEmpty())) {
    double v = 0;
    if (!absl::SimpleAtod(g, &v) || !(v > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--kv-fetch-gbps: '", std::string(g), "' is not a rate > 0"));
    }
    rates.push_back(v);
  }
  if (absl::GetFlag(FLAGS_kv_fetch_min_blocks) < 1) {
    return absl::InvalidArgumentError("--kv-fetch-min-blocks must be >= 1");
  }
  return rates;
}

// The goodput search's flags would be ignored without --goodput: refused by name instead.
absl::Status RefuseGoodputFlags() {
  for (const char* flag : {"slo_ttft_p99_ms", "slo_tpot_p99_ms", "goodput_min_speedup",
                           "goodput_max_speedup", "goodput_steps"}) {
    if (FlagChanged(flag)) {
      std::string name = flag;
      std::replace(name.begin(), name.end(), '_', '-');
      return absl::InvalidArgumentError(absl::StrCat("--", name, " is a flag of --goodput"));
    }
  }
  return absl::OkStatus();
}

// --goodput: each policy's highest rate within the SLO, and how the first policy's compares.
absl::Status RunGoodput(const std::vector<trace::TraceRequest>& trace, const SimOptions& base) {
  const Slo slo{.ttft_p99_ms = absl::GetFlag(FLAGS_slo_ttft_p99_ms),
                .tpot_p99_ms = absl::GetFlag(FLAGS_slo_tpot_p99_ms)};
  const GoodputSearch search{.min_speedup = absl::GetFlag(FLAGS_goodput_min_speedup),
                             .max_speedup = absl::GetFlag(FLAGS_goodput_max_speedup),
                             .steps = absl::GetFlag(FLAGS_goodput_steps)};
  std::cout << absl::StrFormat("goodput: TTFT p99 <= %.0f ms, TPOT p99 <= %.0f ms\n",
                               slo.ttft_p99_ms, slo.tpot_p99_ms);
  std::cout << absl::StrFormat("%-18s %9s %9s %9s %9s %7s %8s\n", "policy", "speedup", "req/s",
                               "ttft_p99", "tpot_p99", "hit", "tries");
  nlohmann::json all;
  std::vector<std::pair<std::string, double>> rates;
  for (absl::string_view p :
       absl::StrSplit(absl::GetFlag(FLAGS_policies), ',', absl::SkipEmpty())) {
    SimOptions o = base;
    o.routing.policy = std::string(p);
    ASSIGN_OR_RETURN(Goodput g, FindGoodput(trace, o, slo, search));
    nlohmann::json tries = nlohmann::json::array();
    nlohmann::json at;  // the report at the answer
    for (const GoodputTry& t : g.tries) {
      tries.push_back({{"speedup", t.speedup},
                       {"requests_per_second", t.requests_per_second},
                       {"met", t.met},
                       {"p99_ttft_ms", t.report["p99_ttft_ms"]},
                       {"p99_tpot_ms", t.report["p99_tpot_ms"]}});
      if (t.met && t.speedup == g.speedup) at = t.report;
    }
    all[o.routing.policy] = {
        {"speedup", g.speedup}, {"requests_per_second", g.requests_per_second}, {"tries", tries}};
    rates.emplace_back(o.routing.policy, g.requests_per_second);
    std::cout << absl::StrFormat(
        "%-18s %9.3f %9.3f %9.0f %9.1f %6.2f%% %8d\n", o.routing.policy, g.speedup,
        g.requests_per_second, at.is_null() ? 0.0 : at["p99_ttft_ms"].get<double>(),
        at.is_null() ? 0.0 : at["p99_tpot_ms"].get<double>(),
        at.is_null() ? 0.0 : 100 * at["hit_rate"].get<double>(), static_cast<int>(g.tries.size()));
  }
  for (size_t i = 1; i < rates.size(); ++i) {
    if (rates[i].second > 0) {
      std::cout << absl::StrFormat("%s / %s: %.2fx\n", rates[0].first, rates[i].first,
                                   rates[0].second / rates[i].second);
    }
  }
  if (const std::string out = absl::GetFlag(FLAGS_json_out); !out.empty()) {
    std::ofstream(out) << all.dump(2) << "\n";
  }
  return absl::OkStatus();
}

// Under a run's row: what one replica's placing and event taking cost (router_cost.h).
void PrintRouterCost(const nlohmann::json& counts, const nlohmann::json& cpu) {
  std::cout << absl::StrFormat(
      "  router: placing %.1f us/request; events %.1f us/request (%.0f block events/s in %.0f "
      "batches/s, %.2f%% of a core); index at most %lld entries\n",
      cpu["placing_us_per_request"].get<double>(), cpu["events_us_per_request"].get<double>(),
      counts["block_events_per_s"].get<double>(), counts["event_batches_per_s"].get<double>(),
      100 * cpu["events_core_share"].get<double>(), counts["peak_index_entries"].get<long long>());
}

absl::Status Main() {
  const std::string path = absl::GetFlag(FLAGS_trace);
  if (path.empty()) return absl::InvalidArgumentError("--trace FILE is required");
  ASSIGN_OR_RETURN(std::vector<trace::TraceRequest> trace,
                   trace::ReadTrace(path, absl::GetFlag(FLAGS_trace_block_size)));
  if (const int64_t spread = absl::GetFlag(FLAGS_spread_arrivals_ms); spread < 0) {
    return absl::InvalidArgumentError("--spread-arrivals-ms must be >= 0");
  } else if (spread > 0) {
    trace = trace::SpreadArrivals(std::move(trace), spread, absl::GetFlag(FLAGS_spread_seed));
  } else if (FlagChanged("spread_seed")) {
    return absl::InvalidArgumentError("--spread-seed is a flag of --spread-arrivals-ms");
  }
  ASSIGN_OR_RETURN(SimOptions base, BaseOptions(trace));
  std::cout << absl::StrFormat(
      "trace %s: %d requests; %d workers of %lld blocks (%d tokens each), %s, speedup %.2f%s\n",
      path, trace.size(), base.workers, static_cast<long long>(base.capacity_blocks),
      base.engine.cache.block_size, base.engine.backend.sim_gpu.name, base.speedup,
      base.instant ? ", instant steps" : "");
  if (absl::GetFlag(FLAGS_goodput)) return RunGoodput(trace, base);
  RETURN_IF_ERROR(RefuseGoodputFlags());
  std::cout << absl::StrFormat("%-18s %8s %8s %9s %9s %9s %8s %8s %7s %7s %7s  %s\n", "policy",
                               "hit", "req_max/min", "ttft_p50", "ttft_p90", "ttft_p99", "tpot_p50",
                               "tpot_p99", "util", "errors", "wall_s", "decisions");
  nlohmann::json all;
  auto run = [&](const std::string& name, const SimOptions& o) -> absl::Status {
    const auto start = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(SimReport r, Simulate(trace, o));
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    r.json["wall_seconds"] = wall;
    PrintRow(name, r.json, wall);
    if (absl::GetFlag(FLAGS_router_cost)) {
      PrintRouterCost(r.json["router_cost"], r.router_cpu);
      r.json["router_cpu"] = r.router_cpu;
    }
    all[name] = r.json;
    return absl::OkStatus();
  };
  ASSIGN_OR_RETURN(const std::vector<double> rates, FetchRates());
  for (absl::string_view p :
       absl::StrSplit(absl::GetFlag(FLAGS_policies), ',', absl::SkipEmpty())) {
    SimOptions o = base;
    o.routing.policy = std::string(p);
    RETURN_IF_ERROR(run(o.routing.policy, o));
    for (double gbps : rates) {
      // The fetch planned for the worker the policy picked, then weighed in the pick itself.
      for (const bool in_policy : {false, true}) {
        o.fetch = {.enabled = true,
                   .min_blocks = absl::GetFlag(FLAGS_kv_fetch_min_blocks),
                   .initial_gbps = gbps,
                   .in_policy = in_policy};
        RETURN_IF_ERROR(run(absl::StrCat(p, "+fetch", gbps, in_policy ? "+aware" : ""), o));
      }
    }
    if (const int prefill = absl::GetFlag(FLAGS_prefill_workers); prefill > 0) {
      o.fetch = {};
      o.prefill_workers = prefill;
      o.max_local_prefill_tokens = absl::GetFlag(FLAGS_max_local_prefill_tokens);
      o.disagg_gbps = absl::GetFlag(FLAGS_disagg_gbps);
      const std::string name = absl::StrCat(p, "+", prefill, "P", o.workers - prefill, "D");
      RETURN_IF_ERROR(run(name, o));
      if (absl::GetFlag(FLAGS_disagg_stream_layers)) {
        o.disagg_stream_layers = true;
        RETURN_IF_ERROR(run(name + "+stream", o));
      }
    }
  }
  if (absl::GetFlag(FLAGS_pooled)) {
    SimOptions o = base;
    o.workers = 1;
    o.capacity_blocks = base.capacity_blocks * base.workers;
    o.instant = true;
    o.routing.policy = "round_robin";
    RETURN_IF_ERROR(run("pooled", o));
  }
  if (const std::string out = absl::GetFlag(FLAGS_json_out); !out.empty()) {
    std::ofstream(out) << all.dump(2) << "\n";
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace kvserve::route_sim

int main(int argc, char** argv) {
  kvserve::InitProgram(argc, argv, "kvserve-route-sim: routing policies on a trace, offline");
  absl::Status s = kvserve::route_sim::Main();
  if (!s.ok()) {
    std::cerr << "kvserve-route-sim: " << s.message() << "\n";
    return 1;
  }
  return 0;
}
