// Device-to-device KV links between workers (docs/DISAGGREGATION.md, kernels/peer_link.h): the
// router pairs every two fresh workers that join links (WorkerStatus.kv_link "nccl") and move
// blocks of the same wire size (the same model, KV format, block size and TP), once each:
//   router -> A  KvLinkOpen (rank 0)            A -> router  KvLinkStatus (the link's id)
//   router -> B  KvLinkOpen (rank 1, the id)    A, B -> router  KvLinkStatus (joined, or why not)
// A link is ready once both joined. A fetch takes a ready link whose two workers carry no other
// link transfer (one at a time per worker: a worker exports over one link at a time and would
// queue the others, which the relay can carry meanwhile) and gives it back when it ends. Any
// failure ends the link at both ends, and the pair gets a new one after a pause; so does a
// worker's restart. KvFetches (router/kv_fetch.h) sends the blocks over it.
//
//   KvLinks links(&pool, timeout);
//   links.Refresh(views, now);                      // each turn of the router's loop
//   links.OnStatus(w, status, now);                 // a KvLinkStatus from Poll
//   if (uint32_t l = links.Acquire(source, target)) ask.set_link_id(l);
//   links.Release(l, ok, now);                      // the transfer ended
//
// One thread (the router's core) owns it and the pool it sends on.
#ifndef KVSERVE_ROUTER_KV_LINKS_H_
#define KVSERVE_ROUTER_KV_LINKS_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kvserve/v1/kvserve.pb.h"
#include "router/routing/routing_policy.h"
#include "router/worker_pool.h"

namespace kvserve::router {

class KvLinks {
 public:
  using Clock = std::chrono::steady_clock;

  // `timeout` bounds a join and each transfer (the workers enforce it) and the router's wait
  // for a link to become ready; a pair waits `retry_after` after a failure.
  KvLinks(WorkerPool* pool, absl::Duration timeout, absl::Duration retry_after = absl::Seconds(5))
      : pool_(pool), timeout_(timeout), retry_after_(retry_after) {}

  void Refresh(absl::Span<const WorkerView> views, Clock::time_point now);
  void OnStatus(int w, const kvserve::v1::KvLinkStatus& status, Clock::time_point now);
  // A ready link between `a` and `b` neither of whose workers is in a link transfer, now marked
  // busy; 0 when there is none.
  uint32_t Acquire(int a, int b);
  // The transfer on `link` (Acquire's) ended: the link is idle again, or, `ok` false, closed.
  void Release(uint32_t link, bool ok, Clock::time_point now);

  [[nodiscard]] int ready() const;

 private:
  enum class State { kMaking, kJoining, kReady };
  struct Link {
    int a = 0, b = 0;  // a < b; a is rank 0
    uint64_t a_instance = 0, b_instance = 0;
    State state = State::kMaking;
    bool a_joined = false, b_joined = false;
    bool busy = false;
    Clock::time_point opened;
  };

  // Ends `id` at both workers; the pair may have another after retry_after_.
  void Close(uint32_t id, Clock::time_point now);
  [[nodiscard]] static bool Linkable(const WorkerView& a, const WorkerView& b);

  WorkerPool* pool_;
  const absl::Duration timeout_, retry_after_;
  std::map<uint32_t, Link> links_;
  std::map<std::pair<int, int>, uint32_t> by_pair_;
  std::map<std::pair<int, int>, Clock::time_point> retry_at_;
  absl::flat_hash_set<int> in_transfer_;  // workers with a link transfer in flight
  uint32_t next_id_ = 1;
};

}  // namespace kvserve::router

#endif  // KVSERVE_ROUTER_KV_LINKS_H_
