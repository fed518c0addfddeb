// prefix: the rules before the cost model, kept by name for comparison (docs/ROUTING.md shows
// where they fail: an absolute load threshold in blocks, tuned on short prompts, overrides the
// cache once one long request is in flight).
//   cost = w_prefill · blocks still to prefill + w_load · load blocks (host blocks save
//   host_weight of a device block, Dynamo-style); least loaded when the load spread passes
//   both balance thresholds (SGLang-style); a prompt no worker caches beyond spread_below of
//   its blocks goes to the worker caching least (SGLang's smallest tree).
#include <algorithm>
#include <limits>
#include <vector>

#include "router/policies/policies.h"

namespace kvserve::router::policies {
namespace {

class PrefixPolicy : public RoutingPolicy {
 public:
  explicit PrefixPolicy(const RoutingConfig& c) : c_(c) {}

  Decision Pick(const std::vector<const WorkerView*>& eligible, const PrefixIndex& index,
                const RouteRequest& request) override {
    const size_t first = rotation_.Next(eligible.size());
    int64_t min_load = std::numeric_limits<int64_t>::max(), max_load = 0;
    for (const WorkerView* w : eligible) {
      min_load = std::min(min_load, LoadBlocks(c_, *w));
      max_load = std::max(max_load, LoadBlocks(c_, *w));
    }
    if (max_load - min_load > c_.balance_abs_threshold &&
        static_cast<double>(max_load) > c_.balance_rel_threshold * static_cast<double>(min_load)) {
      return {.worker = LeastLoaded(c_, eligible, first)->id, .reason = RouteReason::kBalance};
    }
    // Every worker's match, asked at once (only the holders of the prompt's first block are
    // looked up).
    std::vector<int> ids(eligible.size());
    for (size_t i = 0; i < eligible.size(); ++i) ids[i] = eligible[i]->id;
    const std::vector<PrefixIndex::Match> matches = index.LongestPrefixes(ids, request.hashes);
    if (const WorkerView* pick = SpreadPick(eligible, first, index, matches, request.hashes)) {
      return {.worker = pick->id, .reason = RouteReason::kSpread};
    }
    return {.worker = CheapestPrefill(eligible, first, matches, request.hashes)->id,
            .reason = RouteReason::kPrefix};
  }

 private:
  // The worker caching least (then the least loaded, then the first from `first`), when no
  // worker caches spread_below of the prompt; null otherwise. matches[i] is eligible[i]'s.
  const WorkerView* SpreadPick(const std::vector<const WorkerView*>& eligible, size_t first,
                               const PrefixIndex& index,
                               absl::Span<const PrefixIndex::Match> matches,
                               absl::Span<const BlockHash> hashes) const {
    int best_match = 0;
    for (const PrefixIndex::Match& m : matches) best_match = std::max(best_match, m.total());
    if (hashes.empty() || best_match >= c_.spread_below * static_cast<double>(hashes.size())) {
      return nullptr;
    }
    const WorkerView* pick = nullptr;
    for (size_t k = 0; k < eligible.size(); ++k) {
      const WorkerView* w = eligible[(first + k) % eligible.size()];
      if (pick == nullptr || index.num_blocks(w->id) < index.num_blocks(pick->id) ||
          (index.num_blocks(w->id) == index.num_blocks(pick->id) &&
           LoadBlocks(c_, *w) < LoadBlocks(c_, *pick))) {
        pick = w;
      }
    }
    return pick;
  }

  // The worker of lowest w_prefill · blocks to prefill + w_load · load (from `first` on, so
  // that equal costs go round robin).
  const WorkerView* CheapestPrefill(const std::vector<const WorkerView*>& eligible, size_t first,
                                    absl::Span<const PrefixIndex::Match> matches,
                                    absl::Span<const BlockHash> hashes) const {
    const WorkerView* best = nullptr;
    double best_cost = 0;
    for (size_t k = 0; k < eligible.size(); ++k) {
      const size_t i = (first + k) % eligible.size();
      const WorkerView* w = eligible[i];
      const PrefixIndex::Match& m = matches[i];
      const double to_prefill =
          static_cast<double>(hashes.size()) - m.device_blocks - c_.host_weight * m.host_blocks;
      const double cost =
          c_.w_prefill * to_prefill + c_.w_load * static_cast<double>(LoadBlocks(c_, *w));
      if (best == nullptr || cost < best_cost) best = w, best_cost = cost;
    }
    return best;
  }

  const RoutingConfig c_;
  Rotation rotation_;
};

}  // namespace

std::unique_ptr<RoutingPolicy> MakePrefixPolicy(const RoutingConfig& c) {
  return std::make_unique<PrefixPolicy>(c);
}

}  // namespace kvserve::router::policies
