#include "router/routing/fetch_plan.h"

#include <algorithm>

namespace kvserve::router {
namespace {

// The prefill rate a fetch to `target` is weighed against: its own measured one, else the
// fastest measured among the workers of its wire size (0: none measured).
double PrefillRate(const WorkerView& target, absl::Span<const WorkerView> views) {
  if (target.prefill_tokens_per_second > 0) return target.prefill_tokens_per_second;
  double rate = 0;
  for (const WorkerView& v : views) {
    if (v.kv_wire_block_bytes == target.kv_wire_block_bytes) {
      rate = std::max(rate, v.prefill_tokens_per_second);
    }
  }
  return rate;
}

// PlanFetch for target views[t], given each view's match of the prompt (matches[i] of
// views[i]).
std::optional<FetchPlan> PlanFor(const KvFetchConfig& config, double gbps,
                                 absl::Span<const WorkerView> views,
                                 absl::Span<const PrefixIndex::Match> matches, size_t t) {
  const WorkerView& target = views[t];
  if (target.kv_wire_block_bytes <= 0 || gbps <= 0) return std::nullopt;
  const double rate = PrefillRate(target, views);
  if (rate <= 0) return std::nullopt;
  const int have = matches[t].total();
  FetchPlan plan{.first_block = have};
  for (size_t i = 0; i < views.size(); ++i) {
    const WorkerView& v = views[i];
    if (i == t || !v.fresh || v.kv_wire_block_bytes != target.kv_wire_block_bytes) continue;
    const int more = matches[i].device_blocks - have;
    if (more >= std::max(1, config.min_blocks) && more > plan.blocks) {
      plan.source = v.id;
      plan.blocks = more;
    }
  }
  if (plan.source < 0) return std::nullopt;
  plan.transfer_s = static_cast<double>(plan.blocks) *
                    static_cast<double>(target.kv_wire_block_bytes) / (gbps * 1e9);
  plan.prefill_s = static_cast<double>(plan.blocks) * target.block_size / rate;
  if (plan.transfer_s >= plan.prefill_s) return std::nullopt;
  return plan;
}

std::vector<PrefixIndex::Match> Matches(absl::Span<const WorkerView> views,
                                        const PrefixIndex& index,
                                        absl::Span<const BlockHash> hashes) {
  std::vector<int> ids;
  ids.reserve(views.size());
  for (const WorkerView& v : views) ids.push_back(v.id);
  return index.LongestPrefixes(ids, hashes);
}

}  // namespace

std::optional<FetchPlan> PlanFetch(const KvFetchConfig& config, double gbps,
                                   absl::Span<const WorkerView> views, const PrefixIndex& index,
                                   absl::Span<const BlockHash> hashes, int to) {
  if (!config.enabled || hashes.empty()) return std::nullopt;
  for (size_t t = 0; t < views.size(); ++t) {
    if (views[t].id == to) return PlanFor(config, gbps, views, Matches(views, index, hashes), t);
  }
  return std::nullopt;
}

std::vector<FetchOffer> FetchOffers(const KvFetchConfig& config, double gbps,
                                    absl::Span<const WorkerView> views, const PrefixIndex& index,
                                    absl::Span<const BlockHash> hashes) {
  if (!config.enabled || !config.in_policy || hashes.empty()) return {};
  const std::vector<PrefixIndex::Match> matches = Matches(views, index, hashes);
  std::vector<FetchOffer> offers;
  for (size_t t = 0; t < views.size(); ++t) {
    if (!views[t].eligible) continue;
    const std::optional<FetchPlan> plan = PlanFor(config, gbps, views, matches, t);
    if (!plan) continue;
    const size_t id = static_cast<size_t>(views[t].id);
    if (offers.size() <= id) offers.resize(id + 1);
    // The transfer's time in the target's prompt tokens: the blocks' tokens at the ratio of
    // moving them to prefilling them.
    offers[id] = {.blocks = plan->blocks,
                  .cost_tokens = static_cast<double>(plan->blocks) * views[t].block_size *
                                 plan->transfer_s / plan->prefill_s};
  }
  return offers;
}

}  // namespace kvserve::router
