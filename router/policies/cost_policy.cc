// cost (the default): the worker of least estimated time to first token, in units of the time
// one prompt token takes to prefill, so that no threshold depends on prompt sizes:
//
//   ttft(w) = (queued(w) + miss_weight · miss(w)) · (1 + decode_weight · decode_seqs(w) /
//   chunk_tokens)
//             + pressure_weight · overflow(w)
//   miss(w)     = prompt tokens − device-cached tokens − host-cached tokens · (1 − host_cost)
//   queued(w)   = prompt tokens its placed requests have yet to prefill (the router's books)
//   overflow(w) = tokens past its device pool once its requests in flight and this one's
//                 uncached blocks are held (it would wait or preempt)
//
// With peer fetch weighed in (RouteRequest::fetch_offers), the blocks a worker would pull
// from a peer leave miss(w), and fetch_weight · the transfer's time, in w's prompt tokens, is
// added: decode rows do not slow a transfer, but it delays this request, and the prefix it
// copies crowds w's cache as a miss's blocks would (fetch_weight 3, as miss_weight: the sweep
// in docs/DISAGGREGATION.md; at 1 the router fetched three times as much and lost hit rate).
//
// With chunked prefill a worker prefills `chunk_tokens` per step while running its decodes, so
// a prompt waits for the prefill queued ahead of it and its own uncached part, each step made
// longer by the decode rows. A miss counts miss_weight (3) times: once for this request's wait,
// and once for each request that will queue behind its prefill (about two at the 70% load a
// fleet is sized for; the sweep on the Mooncake traces is in docs/ROUTING.md). A prompt whose best
// cached prefix anywhere is under new_fraction of it is a new conversation: it goes by queued work
// alone (caching nothing worth keeping, it should land where it starts soonest, which spreads new
// conversations; among equals, on the worker caching least). Ties rotate. While other router
// replicas place on the same workers, a new conversation goes to the best of spread_choices
// random workers instead: replicas that see the same load would all pick the same best worker
// for the requests they get at the same instant (docs/ROUTING.md, "Multi-replica routers").
#include <algorithm>
#include <cmath>
#include <random>

#include "router/policies/policies.h"

namespace kvserve::router::policies {
namespace {

class CostPolicy : public RoutingPolicy {
 public:
  explicit CostPolicy(const RoutingConfig& c)
      : c_(c), draws_(c.seed != 0 ? c.seed : std::random_device{}()) {}

  Decision Pick(const std::vector<const WorkerView*>& eligible, const PrefixIndex& index,
                const RouteRequest& request) override {
    const size_t first = rotation_.Next(eligible.size());
    std::vector<int> ids(eligible.size());
    for (size_t i = 0; i < eligible.size(); ++i) ids[i] = eligible[i]->id;
    const std::vector<PrefixIndex::Match> matches = index.LongestPrefixes(ids, request.hashes);
    double best_cached = 0;
    for (size_t i = 0; i < eligible.size(); ++i) {
      best_cached = std::max(best_cached, Cached(*eligible[i], matches[i]));
    }
    const bool is_new = best_cached < c_.new_fraction * static_cast<double>(request.prompt_tokens);
    const std::vector<size_t> order = Candidates(eligible.size(), first, is_new, request);
    size_t best = eligible.size();
    double best_cost = 0;
    for (const size_t i : order) {
      const double cost =
          is_new ? Ttft(*eligible[i], PrefixIndex::Match{}, {}, request)
                 : Ttft(*eligible[i], matches[i], Offer(*eligible[i], request), request);
      const double eps = 1e-9 * std::max(1.0, best_cost);
      // A new conversation's ties go to the worker caching least (SGLang's smallest tree), so
      // that the conversations, and the cache they will build, spread evenly.
      const bool smaller_tree =
          is_new && best != eligible.size() && cost <= best_cost + eps &&
          index.num_blocks(eligible[i]->id) < index.num_blocks(eligible[best]->id);
      if (best == eligible.size() || cost < best_cost - eps || smaller_tree) {
        best = i, best_cost = cost;
      }
    }
    RouteReason reason = RouteReason::kSpread;
    if (!is_new) {
      const bool holds_best = Cached(*eligible[best], matches[best]) >= best_cached;
      reason = holds_best ? RouteReason::kPrefix : RouteReason::kBalance;
    }
    return {.worker = eligible[best]->id, .reason = reason};
  }

 private:
  // The eligible workers a decision weighs, from `first` on: all, or for a new conversation
  // while other replicas place too, spread_choices of them drawn at random.
  std::vector<size_t> Candidates(size_t n, size_t first, bool is_new, const RouteRequest& r) {
    std::vector<size_t> order(n);
    for (size_t k = 0; k < n; ++k) order[k] = (first + k) % n;
    const size_t draws = static_cast<size_t>(c_.spread_choices);
    if (!is_new || !r.other_replicas || draws == 0 || draws >= n) return order;
    for (size_t k = 0; k < draws; ++k) {  // a partial Fisher-Yates shuffle
      std::swap(order[k], order[k + std::uniform_int_distribution<size_t>(0, n - k - 1)(draws_)]);
    }
    order.resize(draws);
    return order;
  }

  // Prompt tokens worker `w` saves with match `m` (host-tier ones less their onboarding cost).
  double Cached(const WorkerView& w, const PrefixIndex::Match& m) const {
    return static_cast<double>(w.block_size) *
           (m.device_blocks + (1.0 - c_.host_cost) * m.host_blocks);
  }

  static FetchOffer Offer(const WorkerView& w, const RouteRequest& r) {
    const size_t id = static_cast<size_t>(w.id);
    return id < r.fetch_offers.size() ? r.fetch_offers[id] : FetchOffer{};
  }

  double Ttft(const WorkerView& w, const PrefixIndex::Match& m, const FetchOffer& fetch,
              const RouteRequest& r) const {
    const double fetched = static_cast<double>(w.block_size) * fetch.blocks;
    const double miss =
        std::max(0.0, static_cast<double>(r.prompt_tokens) - Cached(w, m) - fetched);
    const double slowdown = 1.0 + c_.decode_weight * static_cast<double>(w.decode_seqs) /
                                      static_cast<double>(c_.chunk_tokens);
    double overflow = 0;
    if (w.capacity_blocks > 0) {
      const int64_t bs = std::max(1, w.block_size);
      const int64_t need = (r.prompt_tokens + r.max_tokens + bs - 1) / bs - m.total();
      overflow = static_cast<double>(
          std::max<int64_t>(0, w.active_blocks + need - w.capacity_blocks) * bs);
    }
    return (static_cast<double>(w.queued_prefill_tokens) + c_.miss_weight * miss) * slowdown +
           c_.fetch_weight * fetch.cost_tokens + c_.pressure_weight * overflow;
  }

  const RoutingConfig c_;
  Rotation rotation_;
  std::mt19937_64 draws_;
};

}  // namespace

std::unique_ptr<RoutingPolicy> MakeCostPolicy(const RoutingConfig& c) {
  return std::make_unique<CostPolicy>(c);
}

}  // namespace kvserve::router::policies
