// kvserve-worker --openai-port's core (a frontend::Core): the front end's requests go to this
// one worker process over its own ZeroMQ ports, as a router's would (a DEALER to its ROUTER
// port, a SUB to its heartbeats; CURVE when the worker has keys), with the router's admission
// (frontend/core/admission_queue.h: the in-flight limit, the queue and its waits), deadlines and
// reply-sequence checks, and no placement: no prefix index, policy, peer fetch or recycle
// coordination (the fleet's routers coordinate this worker's recycles). Endpoint picks are
// kvserve-router's (--epp-port): a pick job is refused.
//
//   LocalCore core(options);
//   core.Start();
//   core.Submit(std::move(job));   // any thread; job->on_response runs on the core thread
//
// Threads: the core thread (Loop) owns both sockets, the worker's last heartbeat, the requests
// in flight and the queue; other threads hand it work through the inbox and read the
// admin snapshot (info_mu_) and the counts (atomics).
#ifndef KVSERVE_WORKER_OPENAI_LOCAL_CORE_H_
#define KVSERVE_WORKER_OPENAI_LOCAL_CORE_H_

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/net/curve.h"
#include "common/thread_checker.h"
#include "frontend/core/admission_queue.h"
#include "frontend/core/core.h"
#include "frontend/core/core_inbox.h"
#include "frontend/core/front_metrics.h"
#include "kvserve/v1/kvserve.pb.h"
#include "zmq.hpp"

namespace kvserve::worker {

struct LocalCoreOptions {
  // The worker as the admin API names it, and its ZeroMQ ports as this process reaches them.
  std::string name = "self";
  std::string host = "127.0.0.1";
  int port = 0;
  int events_port = 0;
  std::optional<CurveClientKeys> curve;  // the link's keys when the worker has CURVE on
  // A worker whose heartbeat is older than this is out of rotation, its requests failed.
  absl::Duration heartbeat_timeout = absl::Seconds(2);
  frontend::Admission admission;
  std::string coordinator_id = "router";      // Control messages' sender
  frontend::FrontMetrics* metrics = nullptr;  // optional; must outlive the core
};

class LocalCore final : public frontend::Core {
 public:
  // The longest the loop sleeps with nothing to do (deadlines, queue waits, heartbeats).
  static constexpr int kIdleTurnMs = 25;

  explicit LocalCore(const LocalCoreOptions& options);
  ~LocalCore() override;
  void Start();
  void Stop();  // idempotent; joins

  void Submit(std::shared_ptr<frontend::Job> job) override;
  void Abort(const std::string& request_id) override;
  void Started(const std::string& request_id) override {}  // picks are refused: none starts
  [[nodiscard]] int eligible_workers() const override { return eligible_.load(); }
  [[nodiscard]] int known_workers() const override { return 1; }
  [[nodiscard]] std::vector<frontend::WorkerInfo> Workers() const override
      ABSL_LOCKS_EXCLUDED(info_mu_);
  absl::Status Control(const std::string& worker_name, kvserve::v1::ControlAction action) override;
  [[nodiscard]] int64_t grants() const override { return 0; }  // coordinates no recycle

 private:
  using Clock = std::chrono::steady_clock;
  // A request sent to the worker.
  struct Sent {
    std::shared_ptr<frontend::Job> job;
    int sequences = 1;         // its samples
    uint64_t instance_id = 0;  // the worker process it went to
    uint32_t next_seq = 1;     // the GenerateResponse.seq its next reply must have
  };
  enum class Placement { kPlaced, kFull, kFailed };

  // One turn of the loop and its parts.
  void Loop();
  void Place(const std::shared_ptr<frontend::Job>& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  // kFull: the worker has no room yet, or was not heard from (nothing was done); kFailed: the
  // job was ended with an error.
  Placement TryPlace(const std::shared_ptr<frontend::Job>& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  void SendAborts(const std::vector<std::string>& ids) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  void SendControls(const std::vector<std::pair<int, kvserve::v1::ControlAction>>& controls)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  // Waits up to timeout_ms for the worker's replies and heartbeats (or a Wake) and takes them.
  void Poll(int timeout_ms) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  void HandleResponse(const kvserve::v1::GenerateResponse& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  // Ends the requests past their deadline (and aborts them on the worker).
  void ExpireSent(Clock::time_point now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  // Ends the requests of a worker that went silent or restarted.
  void FailLost(Clock::time_point now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  // Ends `it`'s request with `code` and `why`, aborting it on the worker when `abort`.
  void End(absl::flat_hash_map<std::string, Sent>::iterator it, absl::StatusCode code,
           absl::string_view why, const char* abort) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  void Publish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_) ABSL_LOCKS_EXCLUDED(info_mu_);
  absl::Status Send(const google::protobuf::Message& m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  [[nodiscard]] bool Fresh(Clock::time_point now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  // Heard from within the timeout and READY: it takes requests.
  [[nodiscard]] bool Ready(Clock::time_point now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  // The sequences of the requests in flight (a request of n samples is n).
  [[nodiscard]] int SentSequences() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);
  // The most sequences the worker takes at once (0: no limit).
  [[nodiscard]] int InflightLimit() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_thread_);

  // Constant after construction.
  const LocalCoreOptions options_;

  ThreadChecker core_thread_{"local core"};
  zmq::context_t ctx_;
  zmq::socket_t dealer_ ABSL_GUARDED_BY(core_thread_);
  zmq::socket_t sub_ ABSL_GUARDED_BY(core_thread_);
  std::optional<kvserve::v1::WorkerStatus> status_ ABSL_GUARDED_BY(core_thread_);
  Clock::time_point last_heartbeat_ ABSL_GUARDED_BY(core_thread_);
  absl::flat_hash_map<std::string, Sent> sent_ ABSL_GUARDED_BY(core_thread_);
  frontend::AdmissionQueue queue_;  // checks its own thread
  Clock::time_point last_publish_ ABSL_GUARDED_BY(core_thread_);

  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<int> eligible_{0};
  mutable absl::Mutex info_mu_;
  frontend::WorkerInfo info_ ABSL_GUARDED_BY(info_mu_);
  frontend::CoreInbox inbox_;  // thread-safe
};

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_OPENAI_LOCAL_CORE_H_
