// What the front end hands its requests to: a Core places each job on a worker, streams the
// worker's replies back through the job's callback, and answers the admin API. Two implement it:
// kvserve-router's RouterCore (placement over a fleet: router/router_core.h) and
// kvserve-worker --openai-port's LocalCore (its own process: worker/openai/local_core.h). The
// front end (frontend/http/, epp/) knows only this interface.
//
//   core->Submit(std::move(job));      // any thread; job->on_response runs on the core's thread
//   core->Abort(request_id);           // the client left
//
// Every method may be called from any thread.
#ifndef KVSERVE_FRONTEND_CORE_CORE_H_
#define KVSERVE_FRONTEND_CORE_CORE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kvserve/v1/kvserve.pb.h"

namespace kvserve::frontend {

// A worker as the admin API shows it.
struct WorkerInfo {
  int id = 0;
  std::string name;
  bool eligible = false;
  std::string state;  // from the worker's heartbeat: STARTING, READY, DRAINING, RECYCLING, ...
  double load = 0;
  int64_t device_blocks_total = 0, device_blocks_active = 0, device_blocks_cached = 0;
  int num_running = 0, num_waiting = 0;
  uint64_t instance_id = 0;
  // The core's side: its in-flight load, its index, the KV-event stream's health.
  int64_t load_blocks = 0, index_blocks = 0, event_batches = 0, event_gaps = 0, event_joins = 0,
          snapshots = 0;
  // Requests the core has on it now, and the most it sends at once (0: no limit).
  int inflight_requests = 0, inflight_limit = 0;
  // The core's estimate of its load, every router replica's placements in it when the worker
  // sends load reports (load_reported): prompt tokens to prefill, decode rows (load_blocks: the
  // blocks its requests reserve).
  int64_t prefill_tokens = 0, decode_seqs = 0;
  bool load_reported = false;
  // Where it serves /metrics with vLLM's names, "host:port" (empty: nowhere).
  std::string metrics_endpoint;
};

// Admission: sequences (a request of n samples is n) one worker takes from this core at once (0:
// the max_num_seqs its heartbeat reports; unlimited when it reports none); a worker with nothing
// in flight takes any request. A request that finds every ready worker at its limit waits in the
// core's queue, first come first placed; past max_queued waiting, or max_queue_wait waited, it
// is refused with ResourceExhausted (a 429 with Retry-After at the front).
struct Admission {
  int max_inflight_per_worker = 0;
  int max_queued = 1024;
  absl::Duration max_queue_wait = absl::Seconds(30);
};

struct Job {
  kvserve::v1::GenerateRequest request;
  std::string session_key;
  // Past it the request ends with DeadlineExceeded, queued or running (and is aborted on its
  // worker). The default: none.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  // When its HTTP request was read (the core's added latency is measured from it; unset: not
  // measured).
  std::chrono::steady_clock::time_point received;
  // Called on the core thread for every response (and once with an error response when the
  // job cannot be placed or its worker is lost).
  std::function<void(const kvserve::v1::GenerateResponse&)> on_response;
  // Set for an endpoint picker's request (epp/): it is placed on the books like any other
  // (load, the index's assumed blocks, admission and the queue) but never sent; a gateway sends
  // it to the endpoints on_pick is given. It leaves the books on Abort(request_id).
  struct Pick {
    // The gateway's subset hint: endpoints ("ip:port") it may go to; unset: any.
    std::optional<std::vector<std::string>> subset;
    int fallbacks = 0;  // endpoints after the first, each the best of those left
    // On the core thread, once: the endpoints, best first (errors go to on_response).
    std::function<void(const std::vector<std::string>& endpoints)> on_pick;
  };
  std::optional<Pick> pick;
};

class Core {
 public:
  virtual ~Core() = default;
  // Queues a job for placement.
  virtual void Submit(std::shared_ptr<Job> job) = 0;
  // Aborts a submitted request (client gone; a pick that ended).
  virtual void Abort(const std::string& request_id) = 0;
  // A picked request's response began (its gateway saw the headers): its prompt is prefilled,
  // and it counts as decoding.
  virtual void Started(const std::string& request_id) = 0;
  // Workers eligible for routing (at least one: /ready is 200), and known.
  [[nodiscard]] virtual int eligible_workers() const = 0;
  [[nodiscard]] virtual int known_workers() const = 0;
  [[nodiscard]] bool ready() const { return eligible_workers() > 0; }
  // Admin: a snapshot of the workers, and control actions (DRAIN, UNDRAIN, RECYCLE) for one;
  // NotFound for an unknown worker name.
  [[nodiscard]] virtual std::vector<WorkerInfo> Workers() const = 0;
  virtual absl::Status Control(const std::string& worker_name,
                               kvserve::v1::ControlAction action) = 0;
  // Recycle slots granted so far (a core that coordinates recycles; else 0).
  [[nodiscard]] virtual int64_t grants() const = 0;
};

}  // namespace kvserve::frontend

#endif  // KVSERVE_FRONTEND_CORE_CORE_H_
