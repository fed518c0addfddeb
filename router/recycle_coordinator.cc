#include "router/recycle_coordinator.h"

#include <algorithm>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace kvserve::router {
namespace {

namespace pb = ::kvserve::v1;

// Revokes held grants beyond the limit: every replica keeps the same ones (earliest first, then
// by name), so concurrent grants by different replicas never take more workers down.
void RevokeConflicts(const CoordinatorOptions& options, absl::Span<const RecycleView> workers,
                     const absl::flat_hash_set<std::string>& already_revoked,
                     CoordinatorDecision& d) {
  if (options.max_unavailable <= 0) return;  // this replica's coordinator is off
  std::vector<const RecycleView*> pending;
  int committed = 0;  // out of rotation for good: draining, recycling past the hold, silent
  for (const RecycleView& w : workers) {
    if (w.recycle_pending) {
      pending.push_back(&w);
    } else if (!w.eligible) {
      ++committed;
    }
  }
  std::sort(pending.begin(), pending.end(), [](const RecycleView* a, const RecycleView* b) {
    return std::tie(a->recycle_grant_ms, a->name) < std::tie(b->recycle_grant_ms, b->name);
  });
  const size_t keep = static_cast<size_t>(std::max(0, options.max_unavailable - committed));
  for (size_t i = keep; i < pending.size(); ++i) {
    std::string key = RevokeKey(pending[i]->instance_id, pending[i]->recycle_grant_ms);
    if (already_revoked.contains(key)) continue;  // sent already; the worker answers once
    pb::Control revoke;
    revoke.set_action(pb::CONTROL_ACTION_RECYCLE_REVOKE);
    revoke.set_instance_id(pending[i]->instance_id);
    revoke.set_coordinator_id(options.coordinator_id);
    d.messages.emplace_back(pending[i]->id, std::move(revoke));
    d.revoked.push_back(std::move(key));
  }
}

// Answers the asks, lowest name first: replicas that see the same asks grant the same worker.
// Unavailable: any worker out of rotation (draining, recycling, restarting, or silent).
void AnswerAsks(const CoordinatorOptions& options, absl::Span<const RecycleView> workers,
                std::vector<RecycleAsk> asks, CoordinatorDecision& d) {
  absl::flat_hash_map<int, std::string> names;
  int unavailable = 0;
  for (const RecycleView& w : workers) {
    names[w.id] = w.name;
    unavailable += w.eligible && !w.grant_in_flight ? 0 : 1;
  }
  std::stable_sort(asks.begin(), asks.end(), [&](const RecycleAsk& a, const RecycleAsk& b) {
    return names[a.worker] < names[b.worker];
  });
  for (RecycleAsk& ask : asks) {
    pb::Control reply;
    reply.set_instance_id(ask.instance_id);
    reply.set_reason(std::move(ask.reason));
    reply.set_coordinator_id(options.coordinator_id);
    if (unavailable < options.max_unavailable) {
      reply.set_action(pb::CONTROL_ACTION_RECYCLE_GRANT);
      ++unavailable;
      ++d.grants;
    } else {
      reply.set_action(pb::CONTROL_ACTION_RECYCLE_DENY);
    }
    d.messages.emplace_back(ask.worker, std::move(reply));
  }
}

}  // namespace

std::string RevokeKey(uint64_t instance_id, int64_t grant_ms) {
  return absl::StrCat(instance_id, "/", grant_ms);
}

CoordinatorDecision CoordinateRecycles(const CoordinatorOptions& options,
                                       absl::Span<const RecycleView> workers,
                                       std::vector<RecycleAsk> asks,
                                       const absl::flat_hash_set<std::string>& already_revoked) {
  CoordinatorDecision d;
  RevokeConflicts(options, workers, already_revoked, d);
  AnswerAsks(options, workers, std::move(asks), d);
  return d;
}

}  // namespace kvserve::router
