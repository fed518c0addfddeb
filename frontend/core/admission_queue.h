// A core's admission queue (frontend::Admission): the requests that found no worker with room,
// first come first placed (a request that moves goes to the front: it came first). Past
// max_queued waiting a new one is refused (429 "queue_full"); one that waited max_queue_wait
// ends with ResourceExhausted ("queue_timeout"), one past its deadline with DeadlineExceeded
// ("deadline"). Counted in the front's metrics (queue depth, waits, refusals).
//
//   AdmissionQueue queue(admission, metrics);
//   queue.Push({.job = job}, /*front=*/false);
//   queue.PlaceInOrder([&](AdmissionQueue::Entry& e) { return TryPlace(e) != kFull; });
//   queue.Expire(now);                      // periodically
//
// Owned by one core's thread; depth() may be read from any thread.
#ifndef KVSERVE_FRONTEND_CORE_ADMISSION_QUEUE_H_
#define KVSERVE_FRONTEND_CORE_ADMISSION_QUEUE_H_

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "common/thread_checker.h"
#include "frontend/core/core.h"
#include "frontend/core/front_metrics.h"

namespace kvserve::frontend {

class AdmissionQueue {
 public:
  using Clock = std::chrono::steady_clock;
  struct Entry {
    std::shared_ptr<Job> job;
    int attempts = 1;  // placements it had (a core that moves requests counts them)
    int from = -1;     // the worker it leaves (-1: none)
    Clock::time_point since;
  };

  AdmissionQueue(const Admission& admission, FrontMetrics* metrics)
      : admission_(admission), metrics_(metrics) {}

  // Requests waiting. Any thread.
  [[nodiscard]] int depth() const { return depth_.load(); }
  // Queues `e` (since: now), or ends its job with ResourceExhausted when max_queued wait.
  void Push(Entry e, bool front);
  // Offers the waiting entries to `place` in order, until it returns false (no room: the entry
  // stays first); those it took (placed, or ended by it) leave the queue.
  void PlaceInOrder(const std::function<bool(Entry&)>& place);
  // Ends the entries past their deadline or the longest wait.
  void Expire(Clock::time_point now);
  // A request placed as it came, without waiting: a wait of 0 in the metrics (their quantiles
  // cover every request) and the core's own time from its last byte to its worker.
  void PlacedAtOnce(const Job& job);
  // Drops the waiting request `request_id`; false if none waits.
  bool Remove(const std::string& request_id);

 private:
  void Published() ABSL_EXCLUSIVE_LOCKS_REQUIRED(owner_);

  const Admission admission_;
  FrontMetrics* const metrics_;             // null: none
  ThreadChecker owner_{"admission queue"};  // the core thread that first uses it
  std::deque<Entry> queue_ ABSL_GUARDED_BY(owner_);
  std::atomic<int> depth_{0};
};

// The reply that ends request `id` with an error (finish reason error), for a job's on_response.
kvserve::v1::GenerateResponse ErrorReply(const std::string& id, absl::StatusCode code,
                                         absl::string_view message);

// Whether a worker refused the request before anything of it ran (FailedPrecondition: it is
// draining, or a bridge's upstream could not be reached), so that it may go elsewhere.
bool RefusedBeforeRunning(const kvserve::v1::GenerateResponse& r);

// What a request past its deadline ends with.
inline constexpr absl::string_view kDeadlineMessage =
    "the request did not finish within its deadline (--request-timeout-seconds, or the "
    "X-Request-Timeout header)";

}  // namespace kvserve::frontend

#endif  // KVSERVE_FRONTEND_CORE_ADMISSION_QUEUE_H_
