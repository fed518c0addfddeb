// The routing flags every binary that routes shares (kvserve-router, kvserve-route-sim):
// --policy, the cost model's --route-*, the prefix policy's --w-* and --balance-*.
//
//   ASSIGN_OR_RETURN(RoutingConfig routing, RoutingConfigFromFlags());
#ifndef KVSERVE_ROUTER_ROUTING_FLAGS_H_
#define KVSERVE_ROUTER_ROUTING_FLAGS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "router/routing/routing_policy.h"

namespace kvserve::router {

// InvalidArgument naming the flag for an unknown policy, a parameter out of range, or a flag
// of another policy than the one chosen (it would be ignored).
// `policies`: the policies the flags will serve (default: --policy's).
absl::StatusOr<RoutingConfig> RoutingConfigFromFlags(const std::vector<std::string>& policies = {});

}  // namespace kvserve::router

#endif  // KVSERVE_ROUTER_ROUTING_FLAGS_H_
