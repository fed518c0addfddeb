#include "router/routing_flags.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/init.h"
#include "common/status_macros.h"
#include "router/policies/factory.h"

ABSL_FLAG(std::string, policy, "cost",
          "cost (least estimated time to first token; docs/ROUTING.md), prefix (the rules before "
          "it), round_robin, least_load or session");
ABSL_FLAG(double, route_host_cost, 0.1,
          "cost policy: a host-tier cached token costs this fraction of prefilling it");
ABSL_FLAG(
    double, route_new_fraction, 0.1,
    "cost policy: a prompt cached nowhere beyond this fraction of it is placed by load alone");
ABSL_FLAG(double, route_decode_weight, 1.0,
          "cost policy: prompt tokens of prefill one decode sequence in a step is worth");
ABSL_FLAG(int64_t, route_chunk_tokens, 2048,
          "cost policy: prompt tokens a worker prefills per step (its --max-num-batched-tokens)");
ABSL_FLAG(double, route_miss_weight, 3.0,
          "cost policy: how many times an uncached prompt token counts (its own wait, and the "
          "wait it adds for each request that queues after it)");
ABSL_FLAG(double, route_fetch_weight, 3.0,
          "cost policy, with --kv-fetch: how many times a peer fetch's transfer time counts, in "
          "prompt tokens of the worker that would fetch");
ABSL_FLAG(double, route_pressure_weight, 1.0,
          "cost policy: cost, in prompt tokens, of each token past a worker's free KV pool");
ABSL_FLAG(int32_t, route_spread_choices, 2,
          "cost policy, while other router replicas place on the same workers: a new "
          "conversation goes to the better of this many random workers (0: the best of all)");
ABSL_FLAG(double, w_prefill, 1.0, "prefix policy: cost weight of each block still to prefill");
ABSL_FLAG(double, w_load, 0.25, "prefix policy: cost weight of each block of load");
ABSL_FLAG(int64_t, balance_abs_threshold, 512,
          "prefix policy: load spread in blocks past which (with the relative threshold) the "
          "least-loaded worker is chosen");
ABSL_FLAG(double, balance_rel_threshold, 1.5,
          "prefix policy: ...when also the busiest worker's load exceeds this × the idlest's");

namespace kvserve::router {

absl::StatusOr<RoutingConfig> RoutingConfigFromFlags(const std::vector<std::string>& policies) {
  RoutingConfig c;
  c.policy = absl::GetFlag(FLAGS_policy);
  c.host_cost = absl::GetFlag(FLAGS_route_host_cost);
  c.new_fraction = absl::GetFlag(FLAGS_route_new_fraction);
  c.decode_weight = absl::GetFlag(FLAGS_route_decode_weight);
  c.chunk_tokens = absl::GetFlag(FLAGS_route_chunk_tokens);
  c.pressure_weight = absl::GetFlag(FLAGS_route_pressure_weight);
  c.miss_weight = absl::GetFlag(FLAGS_route_miss_weight);
  c.fetch_weight = absl::GetFlag(FLAGS_route_fetch_weight);
  c.spread_choices = absl::GetFlag(FLAGS_route_spread_choices);
  c.w_prefill = absl::GetFlag(FLAGS_w_prefill);
  c.w_load = absl::GetFlag(FLAGS_w_load);
  c.balance_abs_threshold = absl::GetFlag(FLAGS_balance_abs_threshold);
  c.balance_rel_threshold = absl::GetFlag(FLAGS_balance_rel_threshold);
  RETURN_IF_ERROR(MakeRoutingPolicy(c).status());  // names a bad policy or parameter
  // A policy's own flags under another policy would be ignored: refused by name instead.
  const struct {
    const char* policy;
    std::vector<const char*> flags;
  } owners[] = {
      {"cost",
       {"route_host_cost", "route_new_fraction", "route_decode_weight", "route_chunk_tokens",
        "route_miss_weight", "route_pressure_weight", "route_fetch_weight",
        "route_spread_choices"}},
      {"prefix", {"w_prefill", "w_load", "balance_abs_threshold", "balance_rel_threshold"}},
  };
  const std::vector<std::string> used = policies.empty() ? std::vector{c.policy} : policies;
  for (const auto& [policy, flags] : owners) {
    if (std::find(used.begin(), used.end(), policy) != used.end()) continue;
    for (const char* flag : flags) {
      if (FlagChanged(flag)) {
        std::string name = flag;
        std::replace(name.begin(), name.end(), '_', '-');
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, " is a flag of the ", policy, " policy, which is not in use"));
      }
    }
  }
  return c;
}

}  // namespace kvserve::router
