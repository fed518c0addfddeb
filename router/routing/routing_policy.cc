#include "router/routing/routing_policy.h"

namespace kvserve::router {

absl::StatusOr<Decision> Route(RoutingPolicy& policy, absl::Span<const WorkerView> workers,
                               const PrefixIndex& index, const RouteRequest& request) {
  std::vector<const WorkerView*> eligible;
  for (const WorkerView& w : workers) {
    if (w.eligible) eligible.push_back(&w);
  }
  if (eligible.empty()) {
    return absl::UnavailableError("no worker is ready (all draining, recycling or unhealthy)");
  }
  Decision d = policy.Pick(eligible, index, request);
  d.predicted_cached_blocks = index.LongestPrefix(d.worker, request.hashes).total();
  return d;
}

std::string_view RouteReasonName(RouteReason reason) {
  switch (reason) {
    case RouteReason::kPrefix:
      return "prefix";
    case RouteReason::kSpread:
      return "spread";
    case RouteReason::kBalance:
      return "balance";
    case RouteReason::kRoundRobin:
      return "round_robin";
    case RouteReason::kLeastLoad:
      return "least_load";
    case RouteReason::kSession:
      return "session";
  }
  return "unknown";
}

}  // namespace kvserve::router
