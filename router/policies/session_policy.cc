// session: rendezvous hashing of the request's session key over the eligible workers' names,
// so a session stays on its worker while that worker is eligible; no key: least loaded.
#include "absl/strings/str_cat.h"
#include "common/kv/block_hash.h"
#include "common/string_util.h"
#include "router/policies/policies.h"

namespace kvserve::router::policies {
namespace {

class SessionPolicy : public RoutingPolicy {
 public:
  explicit SessionPolicy(const RoutingConfig& c) : c_(c) {}
  Decision Pick(const std::vector<const WorkerView*>& eligible, const PrefixIndex&,
                const RouteRequest& request) override {
    const size_t first = rotation_.Next(eligible.size());
    if (request.session_key.empty()) {
      return {.worker = LeastLoaded(c_, eligible, first)->id, .reason = RouteReason::kLeastLoad};
    }
    const WorkerView* best = nullptr;
    uint64_t best_score = 0;
    for (const WorkerView* w : eligible) {
      const uint64_t score = StableHash64(absl::StrCat(Sv(request.session_key), "\n", w->name));
      if (best == nullptr || score > best_score) best = w, best_score = score;
    }
    return {.worker = best->id, .reason = RouteReason::kSession};
  }

 private:
  const RoutingConfig c_;
  Rotation rotation_;
};

}  // namespace

std::unique_ptr<RoutingPolicy> MakeSessionPolicy(const RoutingConfig& c) {
  return std::make_unique<SessionPolicy>(c);
}

}  // namespace kvserve::router::policies
