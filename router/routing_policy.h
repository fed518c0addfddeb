// Picks the worker for a request. Policies:
//   prefix      (default) cost = w_prefill · blocks still to prefill + w_load · load blocks,
//               where cached device blocks count fully and host blocks by host_weight
//               (Dynamo-style), falling back to least-loaded when the load spread passes both
//               an absolute and a relative threshold (SGLang-style); a prompt no worker
//               caches well (under spread_below of its blocks) goes to the worker caching
//               the least (SGLang's smallest tree), so new prefixes spread over the workers;
//   round_robin, least_load, and session (rendezvous hashing of a session key, sticky while
//               its worker stays eligible).
// Draining, recycling, starting and unhealthy workers are never picked.
//
//   ASSIGN_OR_RETURN(Decision d, Route(config, workers, index, hashes, session, &rr));
//
// Pure function of its inputs (plus the round-robin counter); any thread.
#ifndef KVSERVE_ROUTER_ROUTING_POLICY_H_
#define KVSERVE_ROUTER_ROUTING_POLICY_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "router/prefix_index.h"

namespace kvserve::router {

enum class Policy { kPrefix, kRoundRobin, kLeastLoad, kSession };
absl::StatusOr<Policy> ParsePolicy(std::string_view name);

struct WorkerView {
  int id = 0;
  std::string name;
  bool eligible = true;       // healthy and READY (not draining, recycling or starting)
  bool fresh = true;          // its last heartbeat is within the timeout, whatever its state
  int64_t active_blocks = 0;  // referenced device blocks
  int64_t waiting = 0;        // queued requests
};

struct RoutingConfig {
  Policy policy = Policy::kPrefix;
  // A prompt's blocks mostly cost prefill compute; load blocks (what in-flight requests hold)
  // mostly cost a share of decode steps, hence the lower weight: a worker that caches a
  // 32-block prefix keeps the prompt until it carries ~4 more such requests than an idle one.
  double w_prefill = 1.0;
  double w_load = 0.25;
  double host_weight = 0.5;             // a host-tier block saves this fraction of a device block
  int64_t balance_abs_threshold = 512;  // load spread in blocks that triggers the fallback...
  double balance_rel_threshold = 1.5;   // ...when also max > rel × min
  int64_t waiting_blocks = 16;          // load blocks a queued request counts for
  double spread_below = 0.5;            // best cached fraction under which a prompt is "new"
};

// Why a worker was picked: the prefix policy's cost (kPrefix), its spreading of a prompt no
// worker caches (kSpread) or its fallback to the least loaded (kBalance); or another policy.
enum class RouteReason { kPrefix, kSpread, kBalance, kRoundRobin, kLeastLoad, kSession };
// The metric label: "prefix", "spread", "balance", "round_robin", "least_load", "session".
std::string_view RouteReasonName(RouteReason reason);

struct Decision {
  int worker = -1;
  RouteReason reason = RouteReason::kPrefix;
  int predicted_cached_blocks = 0;
};

// Unavailable when no worker is eligible.
absl::StatusOr<Decision> Route(const RoutingConfig& config, absl::Span<const WorkerView> workers,
                               const PrefixIndex& index, absl::Span<const BlockHash> hashes,
                               std::string_view session_key, uint64_t* round_robin);

}  // namespace kvserve::router

#endif  // KVSERVE_ROUTER_ROUTING_POLICY_H_
