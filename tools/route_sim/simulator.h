// The offline routing simulator behind `kvserve-route-sim`: a trace replayed in virtual time
// against N workers, each the worker's own engine (scheduler, paged KV cache manager and block
// pool, prefix cache, eviction, KV events) on the simulated GPU (`--device sim` without
// sleeping: each step advances that worker's clock by the time worker/sim/step_cost.h gives),
// routed by the router's own policy code (router/routing/routing_policy.h) over the router's own
// prefix index fed by those workers' KV events. An hour of trace at 8-256 workers runs in seconds
// to minutes.
//
//   ASSIGN_OR_RETURN(SimReport r, Simulate(trace, options));
//
// What differs from the live cluster: no network or router CPU time (events and placements
// arrive at once), and a request's outputs are dated at the end of the step that made them.
// One thread; nothing shared.
#ifndef KVSERVE_TOOLS_ROUTE_SIM_SIMULATOR_H_
#define KVSERVE_TOOLS_ROUTE_SIM_SIMULATOR_H_

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "router/routing/fetch_plan.h"
#include "router/routing/routing_policy.h"
#include "tools/route_sim/held_requests.h"
#include "tools/trace/trace.h"
#include "worker/engine_config.h"

namespace kvserve::route_sim {

struct SimOptions {
  int workers = 8;
  // Router replicas behind a round-robin load balancer: each sees every worker's events, and
  // only its own placements as assumed index entries.
  int replicas = 1;
  // What a replica's routing takes for a worker's load (docs/ROUTING.md, "Multi-replica
  // routers"). kOwn: its own placements alone (and the worker's waiting count at once).
  // kReports: the worker's last load report (Engine::load(), every report_interval_s) plus its
  // own placements that report had not seen, as kvserve-router does.
  enum class ReplicaLoad { kOwn, kReports };
  ReplicaLoad replica_load = ReplicaLoad::kReports;
  double report_interval_s = 0.05;
  int64_t capacity_blocks = 0;  // each worker's device pool, in blocks of `engine.cache`'s size
  // Each worker's engine: model_dir (only config.json is read), block size, scheduler limits,
  // the simulated GPU, max_model_len (0: the model's, or the pool's tokens if fewer). The
  // simulator sets the device and the pool.
  worker::EngineConfig engine;
  // The routing policy by name (router/routing/routing_policy.h), or "greedy": the bound the issue
  // measures against (the longest cached prefix, new conversations to the worker with the
  // fewest requests in flight), which ignores load otherwise.
  router::RoutingConfig routing;
  // Light load: steps take no time (the null worker), so every request ends before the next
  // arrives; the hit rate is then the routing's alone.
  bool instant = false;
  double speedup = 1.0;  // trace time divided by this
  int64_t window_start_ms = 0, window_end_ms = std::numeric_limits<int64_t>::max();
  int64_t max_output = 0;  // 0: the trace's output lengths
  int trace_block_size = 512;
  // Peer prefix fetch (router/routing/fetch_plan.h) as the router plans it, with the link moving
  // fetch.initial_gbps throughout: the request reaches its worker once its blocks have.
  router::KvFetchConfig fetch;
  // Disaggregated serving (docs/DISAGGREGATION.md): the first `prefill_workers` workers only
  // prefill. A request its decode worker would prefill more than max_local_prefill_tokens of is
  // prefilled on one of them first (one token, discarded), and reaches its decode worker once
  // the blocks have crossed a link of disagg_gbps; the decode worker then prefills only what
  // did not come and generates every token.
  int prefill_workers = 0;
  int64_t max_local_prefill_tokens = 1000;
  double disagg_gbps = 10;
  // Layer streaming (docs/DISAGGREGATION.md): a phase's blocks leave the prefill worker in the
  // steps that compute them, layer by layer behind the compute, rather than once it ended. Each
  // step's blocks start as its first layer ends, at disagg_gbps, never ahead of the layers the
  // step has computed, after the phase's earlier steps' blocks. Each phase has its own link:
  // in both modes, transfers never share bandwidth.
  bool disagg_stream_layers = false;
  // The router's admission queue (kvserve-router's --max-inflight-per-worker): a replica places
  // on a worker only while it counts fewer than this many of its requests (0: no limit; every
  // request is placed as it arrives), and holds the rest in `queue_order` until one ends. A
  // request's TTFT counts from its arrival.
  int router_max_inflight = 0;
  QueueOrder queue_order = QueueOrder::kFirstCome;
  // Time what each replica's placing and KV-event taking cost on this CPU (router_cost.h; each
  // batch then goes through its wire bytes): the report's router_cost and router_cpu.
  bool router_cost = false;
};

struct SimReport {
  // Unchanged by the run, so side-by-side runs compare the same requests.
  nlohmann::json json;
  // With SimOptions::router_cost, what the replicas' placing and KV-event taking cost this CPU
  // (router_cost.h): differs run to run.
  nlohmann::json router_cpu;
};

// InvalidArgument for bad options (naming them); the engines' own errors (a prompt longer than
// max_model_len) are counted in the report, not returned.
absl::StatusOr<SimReport> Simulate(const std::vector<trace::TraceRequest>& trace,
                                   const SimOptions& options);

}  // namespace kvserve::route_sim

#endif  // KVSERVE_TOOLS_ROUTE_SIM_SIMULATOR_H_
