// round_robin: each eligible worker in turn, whatever it caches or carries.
#include "router/policies/policies.h"

namespace kvserve::router::policies {
namespace {

class RoundRobinPolicy : public RoutingPolicy {
 public:
  Decision Pick(const std::vector<const WorkerView*>& eligible, const PrefixIndex&,
                const RouteRequest&) override {
    return {.worker = eligible[rotation_.Next(eligible.size())]->id,
            .reason = RouteReason::kRoundRobin};
  }

 private:
  Rotation rotation_;
};

}  // namespace

std::unique_ptr<RoutingPolicy> MakeRoundRobinPolicy(const RoutingConfig&) {
  return std::make_unique<RoundRobinPolicy>();
}

}  // namespace kvserve::router::policies
