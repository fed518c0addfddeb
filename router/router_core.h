// The router's core loop: one thread owns the WorkerPool (every ZeroMQ socket), the prefix
// index and the routing state. HTTP threads hand it generation jobs; it picks a worker, sends
// the request, and hands every response delta back through the job's callback (which must be
// thread-safe: it runs on the core thread).
//
//   RouterCore core(options);
//   core.Start();
//   core.Submit(std::move(job));   // any thread
#ifndef KVSERVE_ROUTER_ROUTER_CORE_H_
#define KVSERVE_ROUTER_ROUTER_CORE_H_

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "common/thread_checker.h"
#include "frontend/core/admission_queue.h"
#include "frontend/core/core.h"
#include "frontend/core/core_inbox.h"
#include "kvserve/v1/kvserve.pb.h"
#include "router/discovery.h"
#include "router/kv_fetch.h"
#include "router/routing/prefix_index.h"
#include "router/routing/routing_policy.h"
#include "router/worker_pool.h"

namespace kvserve::router {

class RouterMetrics;

struct RouterOptions {
  std::vector<WorkerEndpoint> workers;
  // Discovery by DNS instead of (or besides) the static list: every address of the name is a
  // worker at the target's ports; re-resolved every dns_refresh. Tests pass their resolver.
  std::optional<DnsTarget> workers_dns;
  absl::Duration dns_refresh = absl::Seconds(10);
  DnsDiscovery::Resolver dns_resolver;
  RoutingConfig routing;
  absl::Duration heartbeat_timeout = absl::Seconds(2);
  RouterMetrics* metrics = nullptr;  // optional; must outlive the core
  // Recycle coordinator: at most this many workers draining or recycling at once.
  int max_unavailable = 1;
  std::string coordinator_id = "router";
  // False: this core answers no recycle ask and revokes nothing (kvserve-worker --openai-port's
  // front, which sees one worker, must not grant what the fleet's routers coordinate).
  bool coordinate_recycles = true;
  // CURVE: every link to a worker authenticates with these (worker_pool.h).
  std::optional<CurveClientKeys> curve;
  // Per-worker limits and the router's queue (frontend/core/core.h).
  frontend::Admission admission;
  // Peer prefix fetch (router/kv_fetch.h): off unless enabled.
  KvFetchConfig kv_fetch;
  // Disaggregated serving (docs/DISAGGREGATION.md), with workers of role prefill in the pool: a
  // request whose decode worker would prefill more than this many tokens is prefilled on a
  // prefill worker first, and its decode worker pulls the KV (as a peer fetch). Fewer: the
  // decode worker prefills it itself (Dynamo's max_local_prefill_length).
  int64_t max_local_prefill_tokens = 1000;
};

// The front end's job and worker view (frontend/core/core.h), as the core's own.
using frontend::Job;
using frontend::WorkerInfo;

class RouterCore : public frontend::Core {
 public:
  // Requests whose worker went away (or drained) before anything streamed are placed again, on
  // another worker, up to this many placements in all.
  static constexpr int kMaxPlacementAttempts = 3;
  // The longest the core loop sleeps with nothing to do: its periodic work (deadlines, queue
  // timeouts, the admin snapshot, heartbeat timeouts) runs at least this often.
  static constexpr int kIdleTurnMs = 25;

  explicit RouterCore(const RouterOptions& options);
  ~RouterCore() override;
  void Start();
  void Stop();  // idempotent; joins

  // Queue a job for placement. Any thread.
  void Submit(std::shared_ptr<Job> job) override;
  // Abort a submitted request (client gone). Any thread.
  void Abort(const std::string& request_id) override;
  // A picked request's response began (its gateway saw the headers): its prompt is prefilled,
  // and it counts as decoding. Any thread.
  void Started(const std::string& request_id) override;
  // Workers eligible for routing, and known. Any thread.
  [[nodiscard]] int eligible_workers() const override { return eligible_.load(); }
  [[nodiscard]] int known_workers() const override { return known_.load(); }
  // Admin: a snapshot of the workers (any thread), and control actions (DRAIN, UNDRAIN,
  // RECYCLE) queued to the core thread. NotFound for an unknown worker name.
  [[nodiscard]] std::vector<WorkerInfo> Workers() const override ABSL_LOCKS_EXCLUDED(info_mu_);
  absl::Status Control(const std::string& worker_name, kvserve::v1::ControlAction action) override
      ABSL_LOCKS_EXCLUDED(info_mu_);
  // Recycle slots granted so far (the coordinator), and grants revoked because another
  // replica granted a slot at the same moment.
  [[nodiscard]] int64_t grants() const override { return grants_.load(); }
  [[nodiscard]] int64_t revokes() const { return revokes_.load(); }

  // Requests moved to another worker because theirs went silent before they started.
  [[nodiscard]] int64_t moved() const { return moved_.load(); }
  // Requests ended because a worker's replies to them came out of sequence (one was lost).
  [[nodiscard]] int64_t reply_gaps() const { return reply_gaps_.load(); }
  // Requests waiting in the router's queue for a worker with room. Any thread.
  [[nodiscard]] int queued() const { return queue_.depth(); }

 private:
  // A placed request, as the core thread tracks it.
  struct Placed {
    int worker;
    std::shared_ptr<Job> job;
    bool started = false;  // a response arrived: the request can no longer move
    int attempts = 1;
    uint64_t instance_id = 0;       // the worker process it went to (0: not known yet)
    std::vector<BlockHash> hashes;  // its prompt's blocks, recorded in the index as assumed
    uint32_t next_seq = 1;          // the GenerateResponse.seq its next reply must have
    // Not sent yet: its worker is pulling its prefix from a peer (KvFetches' number; 0: none).
    uint64_t fetch = 0;
    // Not sent yet: a prefill worker is computing its KV under this request id (empty: none),
    // after which its worker pulls blocks from prefill_first on.
    std::string prefill;
    int prefill_first = 0;
  };
  // A prefill phase that ended: the request it was for, its own id, the prefill worker, and
  // whether the KV is there.
  struct Prefilled {
    std::string request_id, prefill_id;
    int worker = -1;
    bool ok = false;
  };
  // A request to place again: its job, the placements it had, and the worker it leaves.
  struct Move {
    std::shared_ptr<Job> job;
    int attempts;
    int from;
  };
  enum class Placement { kPlaced, kFull, kFailed };
  // What in-flight requests hold of a worker, from the router's own books.
  struct Load {
    int64_t blocks = 0;
    int requests = 0;
    int sequences = 0;           // a request of n samples runs n
    int64_t prefill_tokens = 0;  // prompt tokens not started requests have yet to prefill
    int64_t decode_seqs = 0;     // sequences of started requests
  };

  // Steps of one turn of the core loop.
  void Loop();
  void SendControls(const std::vector<std::pair<int, kvserve::v1::ControlAction>>& controls)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  void SendAborts(const std::vector<std::string>& aborts)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  void HandleResponse(int worker, const kvserve::v1::GenerateResponse& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  // Whether `r` is the reply `p` expects next; if not (one was lost or repeated on the link),
  // ends the request with an error, aborts it on the worker and counts the gap.
  bool InSequence(const std::string& request_id, Placed& p, const kvserve::v1::GenerateResponse& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  void UpdateReadiness(const std::vector<WorkerView>& views)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  void Coordinate(const std::vector<WorkerView>& views) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  // Moves or fails the requests of workers that stopped responding or restarted.
  void RescueLost(const std::vector<WorkerView>& views) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);

  // Placement and the admission queue (router_core_place.cc).
  // Places the job, or queues it when every ready worker is at its limit (at the queue's front
  // for a request that moves: it came first).
  void Place(const std::shared_ptr<Job>& job, int attempts = 1, int exclude = -1)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  // kFull: no ready worker has room (nothing was done); kFailed: the job was ended with an error.
  Placement TryPlace(const std::shared_ptr<Job>& job, int attempts, int exclude)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  // Marks in `views` the workers that may take `job` now (ready, not `exclude`, not prefill-only,
  // within their in-flight limit; with the router's load); false when it should wait: some
  // worker is ready or not heard from yet, and none has room.
  bool MarkRoom(const Job& job, int exclude, std::vector<WorkerView>& views)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  // The prompt's full-block hashes with the cache key of the first eligible worker.
  std::vector<BlockHash> PromptHashes(const kvserve::v1::GenerateRequest& request,
                                      const std::vector<WorkerView>& views)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  // A pick job's endpoints: the decision's, then its fallbacks, each routed among those left.
  std::vector<std::string> PickEndpoints(const Job& job, std::vector<WorkerView> views,
                                         const std::vector<BlockHash>& hashes, int first)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  // Peer prefix fetch (router_core_fetch.cc): starts one for a request just routed to worker
  // `to` when PlanFetch finds one worth it (the request then waits for it: its number, else 0),
  // and sends the requests whose fetch ended (moved or failed when the send fails).
  uint64_t MaybeFetch(Job& job, const std::vector<WorkerView>& views,
                      const std::vector<BlockHash>& hashes, int to)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  void SendFetched(std::vector<KvFetches::Done>& done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  // Disaggregated serving (router_core_fetch.cc): for a request routed to decode worker `to`,
  // when it would prefill more than max_local_prefill_tokens there and a prefill worker of its
  // KV shape is ready, sends that worker the prefill phase (placed on its books) and returns
  // its id (empty: the request goes on as it is). Then, as prefill phases end, starts each
  // request's fetch from its prefill worker (or sends it at once when the phase failed).
  // `*first_block`: the first block `to` lacks, which the fetch will start from. `*stream`:
  // the fetch streaming the phase's blocks over a link (KvFetches' number; 0: none), which
  // sends the request when it ends, whether the phase ended or not.
  std::string MaybeDisaggregate(Job& job, const std::vector<BlockHash>& hashes, int to,
                                int* first_block, uint64_t* stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  // The prefill workers ready to prefill for `decode` (its KV shape), with the router's load.
  std::vector<WorkerView> PrefillWorkers(const WorkerView& decode,
                                         const std::vector<WorkerView>& views)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  // `job`'s prefill phase on `worker`: its prompt alone, one greedy token nobody reads; its end
  // is queued in prefilled_.
  std::shared_ptr<Job> PrefillPhase(const Job& job, int worker, int predicted_cached)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  void StartDecodes(std::vector<KvFetches::Done>& fetched)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  void Enqueue(Move move, bool front) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  // Places queued requests in order while workers have room.
  void PlaceQueued() ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  // Ends queued requests that waited too long and requests past their deadline.
  void ExpireWaits() ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  // The most sequences worker `w` takes at once (0: no limit).
  [[nodiscard]] int InflightLimit(int w) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  // Whether `p` may be placed again: nothing of it streamed and it has placements left.
  [[nodiscard]] static bool CanMove(const Placed& p) {
    return !p.started && p.attempts < kMaxPlacementAttempts;
  }
  // Queues `p` to move when CanMove, else ends it with Unavailable `why`. The caller erases it
  // from inflight_ and places the moves once done iterating.
  void MoveOrFail(const std::string& request_id, const Placed& p, absl::string_view why,
                  std::vector<Move>& moves) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  void PlaceMoves(std::vector<Move>& moves) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  void PublishInfo(const std::vector<WorkerView>& views) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_)
      ABSL_LOCKS_EXCLUDED(info_mu_);
  // Applies a discovered worker set: adds new endpoints, removes vanished ones (their requests
  // that had not started move to other workers, started ones end with an error).
  void SyncWorkers(const std::vector<WorkerEndpoint>& endpoints)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  // What each worker's in-flight requests will hold, from the router's own books.
  absl::flat_hash_map<int, Load> InflightLoad() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);

  // Constant after construction.
  RouterOptions options_;

  // Owned by the core thread (Loop and what it calls; the constructor fills the pool before
  // Start). Checked: core_thread_ binds to the thread that first runs Loop, and every method
  // that touches this state checks it (common/thread_checker.h).
  ThreadChecker core_thread_{"router core"};
  zmq::context_t ctx_;  // thread-safe (ZeroMQ); its sockets are the pool's
  PrefixIndex index_ ABSL_GUARDED_BY(core_thread_);
  std::unique_ptr<WorkerPool> pool_ ABSL_GUARDED_BY(core_thread_);
  std::unique_ptr<DnsDiscovery> discovery_ ABSL_GUARDED_BY(core_thread_);
  absl::flat_hash_map<std::string, Placed> inflight_ ABSL_GUARDED_BY(core_thread_);
  frontend::AdmissionQueue queue_;  // checks its own thread
  // RevokeKey of each revoke sent.
  absl::flat_hash_set<std::string> revoked_ ABSL_GUARDED_BY(core_thread_);
  // Workers this replica granted a recycle slot, and when: until their heartbeats show it.
  absl::flat_hash_map<int, std::chrono::steady_clock::time_point> grants_in_flight_
      ABSL_GUARDED_BY(core_thread_);
  std::chrono::steady_clock::time_point last_info_ ABSL_GUARDED_BY(core_thread_);
  std::unique_ptr<RoutingPolicy> policy_ ABSL_GUARDED_BY(core_thread_);
  std::unique_ptr<KvLinks> links_ ABSL_GUARDED_BY(core_thread_);  // null: --kv-links off
  std::unique_ptr<KvFetches> fetches_ ABSL_GUARDED_BY(core_thread_);
  std::vector<Prefilled> prefilled_ ABSL_GUARDED_BY(core_thread_);  // since the last turn

  // Read by any thread.
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<int> eligible_{0}, known_{0};
  std::atomic<int64_t> moved_{0}, grants_{0}, revokes_{0}, reply_gaps_{0};

  mutable absl::Mutex info_mu_;
  std::vector<WorkerInfo> info_ ABSL_GUARDED_BY(info_mu_);

  frontend::CoreInbox inbox_;  // thread-safe
};

}  // namespace kvserve::router

#endif  // KVSERVE_ROUTER_ROUTER_CORE_H_
