#include "router/routing/fetch_plan.h"

#include <algorithm>

namespace kvserve::router {
namespace {

constexpr size_t kNone = static_cast<size_t>(-1);

// The workers of one wire size (KV moves only between equal ones): the two that may send the
// furthest device-cached prefix (the first in view order among equals), and the fastest
// measured prefill rate. Built once per placement, so that the offers for every worker cost
// O(workers) rather than O(workers^2) (at 1,024 workers, a million steps a request).
struct WireGroup {
  int64_t wire = 0;
  double fastest = 0;
  size_t best = kNone, second = kNone;
};

std::vector<WireGroup> Groups(absl::Span<const WorkerView> views,
                              absl::Span<const PrefixIndex::Match> matches) {
  std::vector<WireGroup> groups;
  for (size_t i = 0; i < views.size(); ++i) {
    const WorkerView& v = views[i];
    auto g = std::find_if(groups.begin(), groups.end(),
                          [&](const WireGroup& x) { return x.wire == v.kv_wire_block_bytes; });
    if (g == groups.end()) g = groups.insert(groups.end(), {.wire = v.kv_wire_block_bytes});
    g->fastest = std::max(g->fastest, v.prefill_tokens_per_second);
    if (!v.fresh) continue;  // a silent worker sends nothing
    const int blocks = matches[i].device_blocks;
    if (g->best == kNone || blocks > matches[g->best].device_blocks) {
      g->second = g->best;
      g->best = i;
    } else if (g->second == kNone || blocks > matches[g->second].device_blocks) {
      g->second = i;
    }
  }
  return groups;
}

// PlanFetch for target views[t], given each view's match of the prompt (matches[i] of
// views[i]) and the workers grouped by wire size.
std::optional<FetchPlan> PlanFor(const KvFetchConfig& config, double gbps,
                                 absl::Span<const WorkerView> views,
                                 absl::Span<const PrefixIndex::Match> matches,
                                 absl::Span<const WireGroup> groups, size_t t) {
  const WorkerView& target = views[t];
  if (target.kv_wire_block_bytes <= 0 || gbps <= 0) return std::nullopt;
  const WireGroup& group = *std::find_if(groups.begin(), groups.end(), [&](const WireGroup& g) {
    return g.wire == target.kv_wire_block_bytes;
  });
  // Its own measured rate, else the fastest measured among its wire size.
  const double rate =
      target.prefill_tokens_per_second > 0 ? target.prefill_tokens_per_second : group.fastest;
  if (rate <= 0) return std::nullopt;
  const size_t source = group.best != t ? group.best : group.second;
  if (source == kNone) return std::nullopt;
  const int have = matches[t].total();
  const int more = matches[source].device_blocks - have;
  if (more < std::max(1, config.min_blocks)) return std::nullopt;
  FetchPlan plan{.source = views[source].id, .first_block = have, .blocks = more};
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
    if (views[t].id != to) continue;
    const std::vector<PrefixIndex::Match> matches = Matches(views, index, hashes);
    return PlanFor(config, gbps, views, matches, Groups(views, matches), t);
  }
  return std::nullopt;
}

std::vector<FetchOffer> FetchOffers(const KvFetchConfig& config, double gbps,
                                    absl::Span<const WorkerView> views, const PrefixIndex& index,
                                    absl::Span<const BlockHash> hashes) {
  if (!config.enabled || !config.in_policy || hashes.empty()) return {};
  const std::vector<PrefixIndex::Match> matches = Matches(views, index, hashes);
  const std::vector<WireGroup> groups = Groups(views, matches);
  std::vector<FetchOffer> offers;
  for (size_t t = 0; t < views.size(); ++t) {
    if (!views[t].eligible) continue;
    const std::optional<FetchPlan> plan = PlanFor(config, gbps, views, matches, groups, t);
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
