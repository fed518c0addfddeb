// The router's core loop: one thread owns the WorkerPool (every ZeroMQ socket), the prefix
// index and the routing state. HTTP threads hand it generation jobs; it picks a worker, sends
// the request, and hands every response delta back through the job's callback (which must be
// thread-safe: it runs on the core thread).
//
// Its parts, each with its own state: the books of placed requests (router/books.h), the
// placer with the admission queue (router/placer.h), KV movement between workers: peer fetch
// and disaggregation (router/kv_movement.h), and the recycle slots (router/recycle_slots.h).
// The core itself runs the loop, the workers' replies (in sequence), aborts, deadlines, lost
// and vanished workers, and the admin view.
//
//   RouterCore core(options);
//   core.Start();                  // or core.StartOn(io): its turns on an io_context's thread
//   core.Submit(std::move(job));   // any thread
#ifndef KVSERVE_ROUTER_ROUTER_CORE_H_
#define KVSERVE_ROUTER_ROUTER_CORE_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "common/thread_checker.h"
#include "frontend/core/core.h"
#include "frontend/core/core_inbox.h"
#include "kvserve/v1/kvserve.pb.h"
#include "router/books.h"
#include "router/discovery.h"
#include "router/kv_fetch.h"
#include "router/kv_movement.h"
#include "router/placer.h"
#include "router/recycle_slots.h"
#include "router/routing/prefix_index.h"
#include "router/routing/routing_policy.h"
#include "router/worker_pool.h"

namespace boost::asio {
class io_context;
}  // namespace boost::asio

namespace kvserve::router {

class IoTurns;
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
  // Framed TCP links to the workers that offer one (WorkerPool::UseLinks; not with `curve`).
  bool worker_links = false;
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
  // Placements a request may have in all (router/books.h).
  static constexpr int kMaxPlacementAttempts = router::kMaxPlacementAttempts;
  // The longest the core loop sleeps with nothing to do: its periodic work (deadlines, queue
  // timeouts, the admin snapshot, heartbeat timeouts) runs at least this often.
  static constexpr int kIdleTurnMs = 25;

  explicit RouterCore(const RouterOptions& options);
  ~RouterCore() override;
  // Runs the core loop on a thread of its own.
  void Start();
  // Or runs its turns on `io`, which one thread runs (kvserve-router --api-threads 0: the HTTP
  // front's I/O thread, so that a request is read, placed, sent and answered on one thread).
  // Stop it on that thread or once `io` no longer runs, and before `io` is destroyed.
  void StartOn(boost::asio::io_context& io);
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
  [[nodiscard]] int64_t grants() const override { return slots_.grants(); }
  [[nodiscard]] int64_t revokes() const { return slots_.revokes(); }

  // Requests moved to another worker because theirs went silent before they started.
  [[nodiscard]] int64_t moved() const { return placer_.moved(); }
  // Requests ended because a worker's replies to them came out of sequence (one was lost).
  [[nodiscard]] int64_t reply_gaps() const { return reply_gaps_.load(); }
  // Requests waiting in the router's queue for a worker with room. Any thread.
  [[nodiscard]] int queued() const { return placer_.queued(); }

 private:
  // The loop of Start's thread: turns until stopped.
  void Loop();
  // One turn: discovery, the inbox, messages from the workers (waiting up to `wait_ms` for the
  // first when there is nothing else to do), KV movement, periodic work. Returns whether the
  // next turn should come at once (KV is in flight, or a socket may hold unread messages).
  bool Turn(int wait_ms) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  // Steps of a turn.
  void SendControls(const std::vector<std::pair<int, kvserve::v1::ControlAction>>& controls)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  void SendAborts(const std::vector<std::string>& aborts)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  // Aborts `p`'s request on its worker (or stops its fetch when it was not sent yet), and
  // forgets the blocks it was assumed to leave there. The caller takes it off the books.
  void StopPlaced(const std::string& request_id, const Placed& p, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  void HandleResponse(int worker, const kvserve::v1::GenerateResponse& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  // Whether `r` is the reply `p` expects next; if not (one was lost or repeated on the link),
  // ends the request with an error, aborts it on the worker and counts the gap.
  bool InSequence(const std::string& request_id, Placed& p, const kvserve::v1::GenerateResponse& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  void UpdateReadiness(const std::vector<WorkerView>& views)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  // Ends requests past their deadline, waiting or placed.
  void ExpireWaits() ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  // Moves or fails the requests of workers that stopped responding or restarted.
  void RescueLost(const std::vector<WorkerView>& views) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  // Moves or fails (MoveOrFail) what the books hold for which `take` is true.
  void MoveTaken(absl::FunctionRef<bool(const Placed&)> take, absl::string_view why,
                 bool may_return = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  void PublishInfo(const std::vector<WorkerView>& views) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_)
      ABSL_LOCKS_EXCLUDED(info_mu_);
  // Applies a discovered worker set: adds new endpoints, removes vanished ones (their requests
  // that had not started move to other workers, started ones end with an error).
  void SyncWorkers(const std::vector<WorkerEndpoint>& endpoints)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);

  // Constant after construction.
  RouterOptions options_;

  // Owned by the core thread (Loop and what it calls; the constructor fills the pool before
  // Start). Checked: core_thread_ binds to the thread that first runs Loop, and every method
  // that touches this state checks it (common/thread_checker.h). The parts (books, KV movement,
  // placer, recycle slots) are not thread-safe: they are the core thread's as their owner is.
  ThreadChecker core_thread_{"router core"};
  zmq::context_t ctx_;  // thread-safe (ZeroMQ); its sockets are the pool's
  PrefixIndex index_ ABSL_GUARDED_BY(core_thread_);
  std::unique_ptr<WorkerPool> pool_ ABSL_GUARDED_BY(core_thread_);
  std::unique_ptr<DnsDiscovery> discovery_ ABSL_GUARDED_BY(core_thread_);
  std::unique_ptr<RoutingPolicy> policy_ ABSL_GUARDED_BY(core_thread_);
  Books books_ ABSL_GUARDED_BY(core_thread_);
  KvMovement kv_ ABSL_GUARDED_BY(core_thread_);
  // Its queued() and moved() are read by any thread; the rest is the core thread's.
  Placer placer_;
  RecycleSlots slots_;  // Turn: the core thread's; its counts any thread's
  std::chrono::steady_clock::time_point last_info_ ABSL_GUARDED_BY(core_thread_);

  // StartOn's driver (the io_context's thread owns it), or null; the pool's wait_fd(), constant
  // after construction.
  std::unique_ptr<IoTurns> io_turns_;
  int pool_wait_fd_ = -1;
  // io_turns_ once started, for any thread's Submit and Abort: one on its thread queues without
  // the inbox's wake-up (an eventfd write, and its read and re-arm) and asks for a turn itself.
  std::atomic<IoTurns*> io_turns_started_{nullptr};
  // The started turns when the caller runs on their thread; else null.
  [[nodiscard]] IoTurns* OnTurnsThread() const;

  // Read by any thread.
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<int> eligible_{0}, known_{0};
  std::atomic<int64_t> reply_gaps_{0};

  mutable absl::Mutex info_mu_;
  std::vector<WorkerInfo> info_ ABSL_GUARDED_BY(info_mu_);

  frontend::CoreInbox inbox_;  // thread-safe
};

}  // namespace kvserve::router

#endif  // KVSERVE_ROUTER_ROUTER_CORE_H_
