// least_load: the worker whose requests in flight (and queue) hold the fewest blocks.
#include "router/policies/policies.h"

namespace kvserve::router::policies {
namespace {

class LeastLoadPolicy : public RoutingPolicy {
 public:
  explicit LeastLoadPolicy(const RoutingConfig& c) : c_(c) {}
  Decision Pick(const std::vector<const WorkerView*>& eligible, const PrefixIndex&,
                const RouteRequest&) override {
    return {.worker = LeastLoaded(c_, eligible, rotation_.Next(eligible.size()))->id,
            .reason = RouteReason::kLeastLoad};
  }

 private:
  const RoutingConfig c_;
  Rotation rotation_;
};

}  // namespace

int64_t LoadBlocks(const RoutingConfig& c, const WorkerView& w) {
  return w.active_blocks + w.waiting * c.waiting_blocks;
}

const WorkerView* LeastLoaded(const RoutingConfig& c,
                              const std::vector<const WorkerView*>& eligible, size_t first) {
  const WorkerView* best = nullptr;
  for (size_t k = 0; k < eligible.size(); ++k) {
    const WorkerView* w = eligible[(first + k) % eligible.size()];
    if (best == nullptr || LoadBlocks(c, *w) < LoadBlocks(c, *best)) best = w;
  }
  return best;
}

std::unique_ptr<RoutingPolicy> MakeLeastLoadPolicy(const RoutingConfig& c) {
  return std::make_unique<LeastLoadPolicy>(c);
}

}  // namespace kvserve::router::policies
