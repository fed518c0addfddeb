// The recycle coordinator: decides which workers may drain and restart (planned recycling), so
// that at most --max-unavailable are out of rotation at once, counted from the states the
// workers themselves publish. Several router replicas see the same heartbeats and decide the
// same way, so their concurrent grants never take more workers down (docs/ROUTER.md):
//   1. a worker holding a revocable grant beyond the limit, counting those already out for good
//      and keeping the earliest grants (then by name), gets a revoke (once per grant);
//   2. recycle asks are answered lowest name first: a grant while fewer than the limit are out
//      of rotation (counting this replica's grants its heartbeats do not show yet), else a
//      deny. A limit of 0 turns this replica's coordinator off.
//
//   CoordinatorDecision d = CoordinateRecycles(options, workers, asks, already_revoked);
//   for (const auto& [worker, control] : d.messages) pool.Send(worker, control);
//
// A pure function of its inputs; any thread.
#ifndef KVSERVE_ROUTER_RECYCLE_COORDINATOR_H_
#define KVSERVE_ROUTER_RECYCLE_COORDINATOR_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/types/span.h"
#include "kvserve/v1/kvserve.pb.h"

namespace kvserve::router {

// A worker as the coordinator sees it (the router's view plus its latest heartbeat).
struct RecycleView {
  int id = 0;
  std::string name;
  bool eligible = false;         // in rotation: healthy and READY
  bool recycle_pending = false;  // holds a revocable grant
  int64_t recycle_grant_ms = 0;  // when it was granted
  uint64_t instance_id = 0;
  // This replica granted it a slot that its heartbeats do not show yet: out of rotation for the
  // asks (a second ask answered before that heartbeat must not get a slot too).
  bool grant_in_flight = false;
};

// A worker's ask for a recycle slot (its Control RECYCLE_REQUEST).
struct RecycleAsk {
  int worker = 0;
  uint64_t instance_id = 0;
  std::string reason;
};

struct CoordinatorOptions {
  int max_unavailable = 1;
  std::string coordinator_id = "router";
};

struct CoordinatorDecision {
  std::vector<std::pair<int, kvserve::v1::Control>> messages;  // (worker id, control) in order
  std::vector<std::string> revoked;  // RevokeKey of each revoke among the messages
  int64_t grants = 0;
};

// Identifies one grant: a revoke is sent once per key.
std::string RevokeKey(uint64_t instance_id, int64_t grant_ms);

// The controls to send now. `already_revoked` holds the keys of revokes sent before.
CoordinatorDecision CoordinateRecycles(const CoordinatorOptions& options,
                                       absl::Span<const RecycleView> workers,
                                       std::vector<RecycleAsk> asks,
                                       const absl::flat_hash_set<std::string>& already_revoked);

}  // namespace kvserve::router

#endif  // KVSERVE_ROUTER_RECYCLE_COORDINATOR_H_
