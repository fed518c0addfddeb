// MakeRoutingPolicy's table: every policy by name (one file each under policies/).
#include "router/policies/factory.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "router/policies/policies.h"

namespace kvserve::router {
namespace {

using Factory = std::unique_ptr<RoutingPolicy> (*)(const RoutingConfig&);

// Every policy by name: a new one is a file under policies/ and a line here.
constexpr std::pair<std::string_view, Factory> kPolicies[] = {
    {"cost", policies::MakeCostPolicy},
    {"prefix", policies::MakePrefixPolicy},
    {"round_robin", policies::MakeRoundRobinPolicy},
    {"least_load", policies::MakeLeastLoadPolicy},
    {"session", policies::MakeSessionPolicy},
};

absl::Status CheckParameters(const RoutingConfig& c) {
  if (c.host_cost < 0 || c.host_cost > 1) {
    return absl::InvalidArgumentError("--route-host-cost must be in [0, 1]");
  }
  if (c.new_fraction < 0 || c.new_fraction > 1) {
    return absl::InvalidArgumentError("--route-new-fraction must be in [0, 1]");
  }
  if (c.decode_weight < 0 || c.pressure_weight < 0 || c.fetch_weight < 0 || c.chunk_tokens < 1 ||
      c.miss_weight < 1) {
    return absl::InvalidArgumentError(
        "--route-decode-weight, --route-pressure-weight and --route-fetch-weight must be >= 0, "
        "--route-chunk-tokens and --route-miss-weight >= 1");
  }
  if (c.spread_choices < 0) {
    return absl::InvalidArgumentError("--route-spread-choices must be >= 0 (0: the best of all)");
  }
  if (c.w_prefill < 0 || c.w_load < 0 || c.balance_abs_threshold < 0 ||
      c.balance_rel_threshold < 1) {
    return absl::InvalidArgumentError(
        "--w-prefill, --w-load and --balance-abs-threshold must be >= 0, "
        "--balance-rel-threshold >= 1");
  }
  return absl::OkStatus();
}

}  // namespace

std::string PolicyNames() {
  std::string names;
  for (const auto& [name, factory] : kPolicies) {
    if (!names.empty()) names += ", ";
    names += name;
  }
  return names;
}

absl::StatusOr<std::unique_ptr<RoutingPolicy>> MakeRoutingPolicy(const RoutingConfig& config) {
  RETURN_IF_ERROR(CheckParameters(config));
  for (const auto& [name, factory] : kPolicies) {
    if (name == config.policy) return factory(config);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--policy '", config.policy, "' is not one of ", PolicyNames()));
}
}  // namespace kvserve::router
