// What other threads hand a core's thread: jobs to place, aborts, picks whose response began,
// admin actions; and the eventfd that wakes the core's poll when something came. Both cores
// (RouterCore, LocalCore) own one.
//
//   inbox.AddJob(std::move(job));              // any thread; wakes the core
//   poll(..., inbox.fd());                     // the core thread: readable when woken
//   CoreInbox::Taken taken = inbox.Take();     // the core thread: all queued since, wake reset
#ifndef KVSERVE_FRONTEND_CORE_CORE_INBOX_H_
#define KVSERVE_FRONTEND_CORE_CORE_INBOX_H_

#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "frontend/core/core.h"
#include "kvserve/v1/kvserve.pb.h"

namespace kvserve::frontend {

class CoreInbox {
 public:
  struct Taken {
    std::deque<std::shared_ptr<Job>> jobs;
    std::vector<std::string> aborts;
    std::vector<std::string> started;
    std::vector<std::pair<int, kvserve::v1::ControlAction>> controls;  // (worker id, action)
  };

  CoreInbox();
  ~CoreInbox();
  CoreInbox(const CoreInbox&) = delete;
  CoreInbox& operator=(const CoreInbox&) = delete;

  // Any thread; each wakes the core, unless `wake` is false (a caller on the core's own thread,
  // which runs a turn itself).
  void AddJob(std::shared_ptr<Job> job, bool wake = true) ABSL_LOCKS_EXCLUDED(mu_);
  void AddAbort(const std::string& request_id, bool wake = true) ABSL_LOCKS_EXCLUDED(mu_);
  void AddStarted(const std::string& request_id) ABSL_LOCKS_EXCLUDED(mu_);
  void AddControl(int worker, kvserve::v1::ControlAction action) ABSL_LOCKS_EXCLUDED(mu_);
  // Everything queued since the last call, the wake reset first (what woke the core is taken).
  Taken Take() ABSL_LOCKS_EXCLUDED(mu_);
  // Readable while something waits to be taken: for the core's poll.
  [[nodiscard]] int fd() const { return fd_; }

 private:
  // Writes the eventfd unless a wake is pending already. The write and Take's read happen under
  // mu_, so the eventfd is readable exactly while woken_ is set.
  void Wake() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int fd_;  // an eventfd
  absl::Mutex mu_;
  Taken queued_ ABSL_GUARDED_BY(mu_);
  bool woken_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace kvserve::frontend

#endif  // KVSERVE_FRONTEND_CORE_CORE_INBOX_H_
