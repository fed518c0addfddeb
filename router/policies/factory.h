// The routing policies by name: kvserve-router's --policy, the simulator's policies.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<RoutingPolicy> policy, MakeRoutingPolicy(config));
#ifndef KVSERVE_ROUTER_POLICIES_FACTORY_H_
#define KVSERVE_ROUTER_POLICIES_FACTORY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "router/routing/routing_policy.h"

namespace kvserve::router {

// InvalidArgument naming the policy when no policy has that name or a parameter is out of
// range.
absl::StatusOr<std::unique_ptr<RoutingPolicy>> MakeRoutingPolicy(const RoutingConfig& config);
// "cost, prefix, round_robin, least_load, session".
std::string PolicyNames();

}  // namespace kvserve::router

#endif  // KVSERVE_ROUTER_POLICIES_FACTORY_H_
