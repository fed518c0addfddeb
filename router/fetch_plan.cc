#include "router/fetch_plan.h"

#include <algorithm>

namespace kvserve::router {
namespace {

const WorkerView* FindView(absl::Span<const WorkerView> views, int id) {
  for (const WorkerView& v : views) {
    if (v.id == id) return &v;
  }
  return nullptr;
}

}  // namespace

std::optional<FetchPlan> PlanFetch(const KvFetchConfig& config, double gbps,
                                   absl::Span<const WorkerView> views, const PrefixIndex& index,
                                   absl::Span<const BlockHash> hashes, int to) {
  const WorkerView* target = FindView(views, to);
  if (!config.enabled || hashes.empty() || target == nullptr || target->kv_wire_block_bytes <= 0 ||
      gbps <= 0) {
    return std::nullopt;
  }
  double rate = target->prefill_tokens_per_second;
  for (const WorkerView& v : views) {
    if (target->prefill_tokens_per_second <= 0 &&
        v.kv_wire_block_bytes == target->kv_wire_block_bytes) {
      rate = std::max(rate, v.prefill_tokens_per_second);
    }
  }
  if (rate <= 0) return std::nullopt;
  const int have = index.LongestPrefix(to, hashes).total();
  FetchPlan plan{.first_block = have};
  for (const WorkerView& v : views) {
    if (v.id == to || !v.fresh || v.kv_wire_block_bytes != target->kv_wire_block_bytes) continue;
    const int more = index.LongestPrefix(v.id, hashes).device_blocks - have;
    if (more >= std::max(1, config.min_blocks) && more > plan.blocks) {
      plan.source = v.id;
      plan.blocks = more;
    }
  }
  if (plan.source < 0) return std::nullopt;
  plan.transfer_s = static_cast<double>(plan.blocks) *
                    static_cast<double>(target->kv_wire_block_bytes) / (gbps * 1e9);
  plan.prefill_s = static_cast<double>(plan.blocks) * target->block_size / rate;
  if (plan.transfer_s >= plan.prefill_s) return std::nullopt;
  return plan;
}

}  // namespace kvserve::router
