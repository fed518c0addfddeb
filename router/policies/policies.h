// The routing policies' factories (one file each) and what they share. Internal to
// router/policies/factory.cc's table of names; see router/routing/routing_policy.h for the
// contract.
#ifndef KVSERVE_ROUTER_POLICIES_POLICIES_H_
#define KVSERVE_ROUTER_POLICIES_POLICIES_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "router/routing/routing_policy.h"

namespace kvserve::router::policies {

// Where a scan over the eligible workers starts: advanced at every decision, so that workers
// of equal cost are picked in turn rather than the first listed.
class Rotation {
 public:
  size_t Next(size_t n) { return static_cast<size_t>(counter_++ % n); }

 private:
  uint64_t counter_ = 0;
};

// Blocks in flight plus waiting_blocks per queued request (the old load measure).
int64_t LoadBlocks(const RoutingConfig& c, const WorkerView& w);
// The worker of least LoadBlocks; ties go to the first from `first` on.
const WorkerView* LeastLoaded(const RoutingConfig& c,
                              const std::vector<const WorkerView*>& eligible, size_t first);

std::unique_ptr<RoutingPolicy> MakeCostPolicy(const RoutingConfig& c);
std::unique_ptr<RoutingPolicy> MakePrefixPolicy(const RoutingConfig& c);
std::unique_ptr<RoutingPolicy> MakeRoundRobinPolicy(const RoutingConfig& c);
std::unique_ptr<RoutingPolicy> MakeLeastLoadPolicy(const RoutingConfig& c);
std::unique_ptr<RoutingPolicy> MakeSessionPolicy(const RoutingConfig& c);

}  // namespace kvserve::router::policies

#endif  // KVSERVE_ROUTER_POLICIES_POLICIES_H_
