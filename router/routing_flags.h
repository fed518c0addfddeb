// The routing flags every binary that routes shares (kvserve-router, kvserve-route-sim):
// --policy, the cost model's --route-*, the prefix policy's --w-* and --balance-*.
//
//   ASSIGN_OR_RETURN(RoutingConfig routing, RoutingConfigFromFlags());
#ifndef KVSERVE_ROUTER_ROUTING_FLAGS_H_
#define KVSERVE_ROUTER_ROUTING_FLAGS_H_

#include "absl/status/statusor.h"
#include "router/routing_policy.h"

namespace kvserve::router {

// InvalidArgument naming the flag for an unknown policy or a parameter out of range.
absl::StatusOr<RoutingConfig> RoutingConfigFromFlags();

}  // namespace kvserve::router

#endif  // KVSERVE_ROUTER_ROUTING_FLAGS_H_
