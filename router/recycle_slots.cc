#include "router/recycle_slots.h"

namespace kvserve::router {
namespace {

namespace pb = ::kvserve::v1;

}  // namespace

RecycleView RecycleSlots::View(const WorkerPool& pool, const WorkerView& v) {
  RecycleView w{.id = v.id, .name = v.name, .eligible = v.eligible};
  if (const pb::WorkerStatus* st = pool.status(v.id); st != nullptr) {
    w.recycle_pending = st->recycle_pending();
    w.recycle_grant_ms = st->recycle_grant_ms();
    w.instance_id = st->instance_id();
  }
  // A grant stays in flight until the worker's heartbeats show it out of rotation (or two
  // heartbeat timeouts pass: the grant was lost, or refused).
  if (auto it = grants_in_flight_.find(v.id); it != grants_in_flight_.end()) {
    const bool shown = !v.eligible || w.recycle_pending;
    const auto age = std::chrono::steady_clock::now() - it->second;
    if (shown || age > 2 * absl::ToChronoNanoseconds(heartbeat_timeout_)) {
      grants_in_flight_.erase(it);
    } else {
      w.grant_in_flight = true;
    }
  }
  return w;
}

void RecycleSlots::Turn(WorkerPool& pool, const std::vector<WorkerView>& views) {
  std::vector<RecycleView> workers;
  workers.reserve(views.size());
  for (const WorkerView& v : views) workers.push_back(View(pool, v));
  std::vector<RecycleAsk> asks;
  for (auto& [w, instance, reason] : pool.TakeRecycleAsks()) {
    asks.push_back({w, instance, std::move(reason)});
  }
  CoordinatorDecision d = CoordinateRecycles(options_, workers, std::move(asks), revoked_);
  for (auto& [w, control] : d.messages) {
    if (control.action() == pb::CONTROL_ACTION_RECYCLE_GRANT) {
      grants_in_flight_[w] = std::chrono::steady_clock::now();
    }
    pool.Send(w, control).IgnoreError();
  }
  for (std::string& key : d.revoked) revoked_.insert(std::move(key));
  grants_ += d.grants;
  revokes_ += static_cast<int64_t>(d.revoked.size());
}

}  // namespace kvserve::router
