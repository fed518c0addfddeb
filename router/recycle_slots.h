// One router replica's side of planned recycling: each turn it answers the workers' recycle
// asks and revokes surplus grants (CoordinateRecycles, router/recycle_coordinator.h), and
// remembers between turns what that decision needs: the grants it sent that the workers'
// heartbeats do not show yet, and the revokes it sent (one per grant).
//
// Turn runs on the core thread (RouterCore owns this); grants() and revokes() on any thread.
//
//   RecycleSlots slots({.max_unavailable = 1, .coordinator_id = "router-0"}, heartbeat_timeout);
//   slots.Turn(pool, pool.Views());  // each turn of the core loop
#ifndef KVSERVE_ROUTER_RECYCLE_SLOTS_H_
#define KVSERVE_ROUTER_RECYCLE_SLOTS_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/time/time.h"
#include "router/recycle_coordinator.h"
#include "router/worker_pool.h"

namespace kvserve::router {

class RecycleSlots {
 public:
  // A grant not shown by the worker's heartbeats within two `heartbeat_timeout`s was lost or
  // refused, and no longer holds a slot.
  RecycleSlots(CoordinatorOptions options, absl::Duration heartbeat_timeout)
      : options_(std::move(options)), heartbeat_timeout_(heartbeat_timeout) {}

  // Takes the asks `pool` received since the last turn, decides, and sends the controls.
  void Turn(WorkerPool& pool, const std::vector<WorkerView>& views);

  // Recycle slots granted so far, and grants revoked because another replica granted a slot at
  // the same moment.
  [[nodiscard]] int64_t grants() const { return grants_.load(); }
  [[nodiscard]] int64_t revokes() const { return revokes_.load(); }

 private:
  // The coordinator's view of `v`, with this replica's grant in flight to it (dropping the
  // grant once shown or expired).
  RecycleView View(const WorkerPool& pool, const WorkerView& v);

  const CoordinatorOptions options_;
  const absl::Duration heartbeat_timeout_;
  absl::flat_hash_set<std::string> revoked_;  // RevokeKey of each revoke sent
  // Workers this replica granted a slot, and when: until their heartbeats show it.
  absl::flat_hash_map<int, std::chrono::steady_clock::time_point> grants_in_flight_;
  std::atomic<int64_t> grants_{0}, revokes_{0};
};

}  // namespace kvserve::router

#endif  // KVSERVE_ROUTER_RECYCLE_SLOTS_H_
