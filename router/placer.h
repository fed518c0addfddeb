// Placing requests on workers. A request goes to the worker the policy picks among those with
// room (router/routing/routing_policy.h), on the books' load (router/books.h); when every
// eligible worker is at its limit it waits in the admission queue, in arrival order (a moved
// request first), until one has room, its deadline passes or --max-queue-wait-seconds. A
// request whose worker is lost before it started moves to another (MoveOrFail), at most
// kMaxPlacementAttempts placements in all.
//
// Not thread-safe but for queued() and moved(): RouterCore owns it on the core thread. It owns
// the admission queue (which checks its own thread); the pool, index, books, KV movement and
// policy are the core's.
//
//   placer.Place(job);                  // a new request: placed, queued, or ended with an error
//   placer.PlaceQueued();               // each turn, once workers may have room
//   placer.MoveOrFail(id, placed, why); // a request off the books, then
//   placer.PlaceMoves();
#ifndef KVSERVE_ROUTER_PLACER_H_
#define KVSERVE_ROUTER_PLACER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/kv/block_hash.h"
#include "frontend/core/admission_queue.h"
#include "frontend/core/core.h"
#include "router/books.h"
#include "router/kv_fetch.h"
#include "router/kv_movement.h"
#include "router/routing/prefix_index.h"
#include "router/routing/routing_policy.h"
#include "router/worker_pool.h"

namespace kvserve::router {

class RouterMetrics;

class Placer {
 public:
  struct Options {
    frontend::Admission admission;     // per-worker limits and the queue's
    KvFetchConfig kv_fetch;            // peer fetch offers for the policy
    RouterMetrics* metrics = nullptr;  // optional; outlives this
  };

  // `pool`, `index`, `books`, `kv` and `policy` are the core's and outlive this.
  Placer(const Options& options, WorkerPool* pool, PrefixIndex* index, Books* books, KvMovement* kv,
         RoutingPolicy* policy);

  // Places the job, or queues it when every ready worker is at its limit (at the queue's front
  // for a request that moves: it came first), or ends it with an error. `attempts`: the
  // placements it will have had; `exclude`: the worker it leaves (-1: none).
  void Place(const std::shared_ptr<frontend::Job>& job, int attempts = 1, int exclude = -1);
  // Places queued requests in order while workers have room.
  void PlaceQueued();
  // Ends queued requests that waited too long or passed their deadline.
  void ExpireQueued(std::chrono::steady_clock::time_point now) { queue_.Expire(now); }
  // Takes a request out of the queue (aborted); false when it was not there.
  bool Unqueue(const std::string& request_id) { return queue_.Remove(request_id); }
  // For a request taken off the books: forgets its routed blocks and fetch, and queues it to
  // move when it is movable (to another worker; with `may_return`, its own one may take it
  // again: only the way to it broke), else ends it with Unavailable `why`. PlaceMoves places
  // them.
  void MoveOrFail(const std::string& request_id, const Placed& placed, absl::string_view why,
                  bool may_return = false);
  void PlaceMoves();
  // The most sequences worker `w` takes at once (0: no limit).
  [[nodiscard]] int InflightLimit(int w) const;

  // Requests waiting in the queue, and moved so far. Any thread.
  [[nodiscard]] int queued() const { return queue_.depth(); }
  [[nodiscard]] int64_t moved() const { return moved_.load(); }

 private:
  enum class Placement { kPlaced, kFull, kFailed };
  // A request to place again: its job, the placements it had, and the worker it leaves.
  struct Move {
    std::shared_ptr<frontend::Job> job;
    int attempts;
    int from;
  };

  // kFull: no ready worker has room (nothing was done); kFailed: the job was ended with an error.
  Placement TryPlace(const std::shared_ptr<frontend::Job>& job, int attempts, int exclude);
  // Marks in `views` the workers that may take `job` now (ready, not `exclude`, not prefill-only,
  // within their in-flight limit; with the books' load); false when it should wait: some worker
  // is ready or not heard from yet, and none has room.
  bool MarkRoom(const frontend::Job& job, int exclude, std::vector<WorkerView>& views) const;
  // The prompt's full-block hashes with the cache key of the first eligible worker.
  std::vector<BlockHash> PromptHashes(const kvserve::v1::GenerateRequest& request,
                                      const std::vector<WorkerView>& views) const;
  // A pick job's endpoints: the decision's, then its fallbacks, each routed among those left.
  std::vector<std::string> PickEndpoints(const frontend::Job& job, std::vector<WorkerView> views,
                                         const std::vector<BlockHash>& hashes, int first);
  void CountDecision(const Decision& d, const std::vector<WorkerView>& views) const;

  const Options options_;
  WorkerPool* const pool_;
  PrefixIndex* const index_;
  Books* const books_;
  KvMovement* const kv_;
  RoutingPolicy* const policy_;
  frontend::AdmissionQueue queue_;
  std::vector<Move> moves_;  // MoveOrFail's, until PlaceMoves
  std::atomic<int64_t> moved_{0};
};

}  // namespace kvserve::router

#endif  // KVSERVE_ROUTER_PLACER_H_
