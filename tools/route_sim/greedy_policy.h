// The simulator's greedy bound (--policies greedy; simulator.h).
#ifndef KVSERVE_TOOLS_ROUTE_SIM_GREEDY_POLICY_H_
#define KVSERVE_TOOLS_ROUTE_SIM_GREEDY_POLICY_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "router/routing/prefix_index.h"
#include "router/routing/routing_policy.h"

namespace kvserve::route_sim {

// The bound: the longest cached prefix wins (ties to fewer requests in flight); a prompt
// cached nowhere beyond new_fraction goes to the worker with the fewest requests in flight.
// Load is otherwise ignored.
class GreedyPolicy : public router::RoutingPolicy {
 public:
  GreedyPolicy(double new_fraction, std::function<int64_t(int worker)> load)
      : new_fraction_(new_fraction), load_(std::move(load)) {}
  router::Decision Pick(const std::vector<const router::WorkerView*>& eligible,
                        const router::PrefixIndex& index,
                        const router::RouteRequest& request) override {
    const size_t first = next_++ % eligible.size();
    std::vector<int> match(eligible.size());
    int best_match = 0;
    for (size_t i = 0; i < eligible.size(); ++i) {
      match[i] = index.LongestPrefix(eligible[i]->id, request.hashes).total();
      best_match = std::max(best_match, match[i]);
    }
    const bool is_new = static_cast<double>(best_match) * eligible[0]->block_size <
                        new_fraction_ * static_cast<double>(request.prompt_tokens);
    size_t best = eligible.size();
    for (size_t k = 0; k < eligible.size(); ++k) {
      const size_t i = (first + k) % eligible.size();
      const int m = is_new ? 0 : match[i];
      const int64_t load = load_(eligible[i]->id);
      if (best == eligible.size() || m > (is_new ? 0 : match[best]) ||
          (m == (is_new ? 0 : match[best]) && load < load_(eligible[best]->id))) {
        best = i;
      }
    }
    return {.worker = eligible[best]->id,
            .reason = is_new ? router::RouteReason::kSpread : router::RouteReason::kPrefix};
  }

 private:
  double new_fraction_;
  std::function<int64_t(int worker)> load_;  // blocks in flight on a worker
  uint64_t next_ = 0;
};

}  // namespace kvserve::route_sim

#endif  // KVSERVE_TOOLS_ROUTE_SIM_GREEDY_POLICY_H_
