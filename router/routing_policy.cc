#include "router/routing_policy.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/block_hash.h"
#include "common/string_util.h"

namespace kvserve::router {
namespace {

int64_t LoadBlocks(const RoutingConfig& c, const WorkerView& w) {
  return w.active_blocks + w.waiting * c.waiting_blocks;
}

}  // namespace

absl::StatusOr<Policy> ParsePolicy(std::string_view name) {
  if (name == "prefix") return Policy::kPrefix;
  if (name == "round_robin") return Policy::kRoundRobin;
  if (name == "least_load") return Policy::kLeastLoad;
  if (name == "session") return Policy::kSession;
  return absl::InvalidArgumentError(absl::StrCat(
      "--policy '", Sv(name), "' is not one of prefix, round_robin, least_load, session"));
}

namespace {

// A prompt that no worker caches well (best match under spread_below of its blocks) goes to the
// worker that caches the least (SGLang's smallest tree), so that new prefixes spread their
// groups, and with them the load, over the workers; lower load, then round robin from
// `first`, break ties. Null when some worker caches the prompt well.
const WorkerView* SpreadPick(const RoutingConfig& c, const std::vector<const WorkerView*>& eligible,
                             size_t first, const PrefixIndex& index,
                             absl::Span<const BlockHash> hashes) {
  int best_match = 0;
  for (const WorkerView* w : eligible) {
    best_match = std::max(best_match, index.LongestPrefix(w->id, hashes).total());
  }
  if (hashes.empty() || best_match >= c.spread_below * static_cast<double>(hashes.size())) {
    return nullptr;
  }
  const WorkerView* pick = nullptr;
  for (size_t k = 0; k < eligible.size(); ++k) {
    const WorkerView* w = eligible[(first + k) % eligible.size()];
    if (pick == nullptr || index.num_blocks(w->id) < index.num_blocks(pick->id) ||
        (index.num_blocks(w->id) == index.num_blocks(pick->id) &&
         LoadBlocks(c, *w) < LoadBlocks(c, *pick))) {
      pick = w;
    }
  }
  return pick;
}

// The worker of lowest w_prefill · blocks to prefill + w_load · load, scanned from `first` so
// that equal costs go round robin.
const WorkerView* CheapestPrefill(const RoutingConfig& c,
                                  const std::vector<const WorkerView*>& eligible, size_t first,
                                  const PrefixIndex& index, absl::Span<const BlockHash> hashes) {
  const WorkerView* best = nullptr;
  double best_cost = 0;
  for (size_t k = 0; k < eligible.size(); ++k) {
    const WorkerView* w = eligible[(first + k) % eligible.size()];
    const PrefixIndex::Match m = index.LongestPrefix(w->id, hashes);
    const double to_prefill =
        static_cast<double>(hashes.size()) - m.device_blocks - c.host_weight * m.host_blocks;
    const double cost =
        c.w_prefill * to_prefill + c.w_load * static_cast<double>(LoadBlocks(c, *w));
    if (best == nullptr || cost < best_cost) best = w, best_cost = cost;
  }
  return best;
}

}  // namespace

absl::StatusOr<Decision> Route(const RoutingConfig& c, absl::Span<const WorkerView> workers,
                               const PrefixIndex& index, absl::Span<const BlockHash> hashes,
                               std::string_view session_key, uint64_t* round_robin) {
  std::vector<const WorkerView*> eligible;
  for (const WorkerView& w : workers) {
    if (w.eligible) eligible.push_back(&w);
  }
  if (eligible.empty())
    return absl::UnavailableError("no worker is ready (all draining, recycling or unhealthy)");
  auto finish = [&](const WorkerView* w, RouteReason reason) {
    Decision d;
    d.worker = w->id;
    d.reason = reason;
    d.predicted_cached_blocks = index.LongestPrefix(w->id, hashes).total();
    return d;
  };
  auto least_loaded = [&] {
    const WorkerView* best = eligible[0];
    for (const WorkerView* w : eligible) {
      if (LoadBlocks(c, *w) < LoadBlocks(c, *best)) best = w;
    }
    return best;
  };
  switch (c.policy) {
    case Policy::kRoundRobin:
      return finish(eligible[(*round_robin)++ % eligible.size()], RouteReason::kRoundRobin);
    case Policy::kLeastLoad:
      return finish(least_loaded(), RouteReason::kLeastLoad);
    case Policy::kSession: {
      if (session_key.empty()) return finish(least_loaded(), RouteReason::kLeastLoad);
      // Rendezvous hashing: the key stays on its worker while that worker is eligible.
      const WorkerView* best = nullptr;
      uint64_t best_score = 0;
      for (const WorkerView* w : eligible) {
        const uint64_t score = StableHash64(absl::StrCat(Sv(session_key), "\n", w->name));
        if (best == nullptr || score > best_score) best = w, best_score = score;
      }
      return finish(best, RouteReason::kSession);
    }
    case Policy::kPrefix:
      break;
  }
  int64_t min_load = std::numeric_limits<int64_t>::max(), max_load = 0;
  for (const WorkerView* w : eligible) {
    min_load = std::min(min_load, LoadBlocks(c, *w));
    max_load = std::max(max_load, LoadBlocks(c, *w));
  }
  if (max_load - min_load > c.balance_abs_threshold &&
      static_cast<double>(max_load) > c.balance_rel_threshold * static_cast<double>(min_load)) {
    return finish(least_loaded(), RouteReason::kBalance);
  }
  const size_t first = (*round_robin)++ % eligible.size();
  if (const WorkerView* pick = SpreadPick(c, eligible, first, index, hashes)) {
    return finish(pick, RouteReason::kSpread);
  }
  return finish(CheapestPrefill(c, eligible, first, index, hashes), RouteReason::kPrefix);
}

std::string_view RouteReasonName(RouteReason reason) {
  switch (reason) {
    case RouteReason::kPrefix:
      return "prefix";
    case RouteReason::kSpread:
      return "spread";
    case RouteReason::kBalance:
      return "balance";
    case RouteReason::kRoundRobin:
      return "round_robin";
    case RouteReason::kLeastLoad:
      return "least_load";
    case RouteReason::kSession:
      return "session";
  }
  return "unknown";
}

}  // namespace kvserve::router
