// The simulator's router queue (simulator.h): requests a replica holds because every worker it
// may place on is at SimOptions::router_max_inflight, as kvserve-router's admission queue
// holds them (--max-inflight-per-worker). Which leaves first is the order's: first come first
// served (kvserve-router's), or the shortest uncached prompt first (Dynamo's router offers it),
// ties in arrival order. A request's uncached prompt is taken when it arrives (the longest
// prefix any worker caches then).
//
//   held.Push({.arrival = now, .uncached_tokens = u, ...});
//   while (!held.empty() && room) Route(held.Pop());
//
// Plain data; the simulator's one thread.
#ifndef KVSERVE_TOOLS_ROUTE_SIM_HELD_REQUESTS_H_
#define KVSERVE_TOOLS_ROUTE_SIM_HELD_REQUESTS_H_

#include <algorithm>
#include <cstdint>
#include <deque>
#include <vector>

#include "common/kv/block_hash.h"

namespace kvserve::route_sim {

enum class QueueOrder { kFirstCome, kShortestUncached };

// A request the router has not placed yet.
struct HeldRequest {
  int index = 0;  // in the trace's window
  double arrival = 0;
  int64_t uncached_tokens = 0;
  std::vector<int32_t> prompt;
  std::vector<BlockHash> hashes;
  int64_t max_tokens = 1;
};

class HeldRequests {
 public:
  explicit HeldRequests(QueueOrder order) : order_(order) {}

  void Push(HeldRequest r) {
    held_.push_back(std::move(r));
    max_depth_ = std::max(max_depth_, held_.size());
  }
  // The next to place, by the order. Not empty.
  HeldRequest Pop() {
    auto next = held_.begin();
    if (order_ == QueueOrder::kShortestUncached) {
      next = std::min_element(held_.begin(), held_.end(), [](const auto& a, const auto& b) {
        return a.uncached_tokens < b.uncached_tokens;  // stable: the earlier of equals
      });
    }
    HeldRequest r = std::move(*next);
    held_.erase(next);
    return r;
  }
  [[nodiscard]] bool empty() const { return held_.empty(); }
  [[nodiscard]] size_t max_depth() const { return max_depth_; }

 private:
  QueueOrder order_;
  std::deque<HeldRequest> held_;
  size_t max_depth_ = 0;
};

}  // namespace kvserve::route_sim

#endif  // KVSERVE_TOOLS_ROUTE_SIM_HELD_REQUESTS_H_
