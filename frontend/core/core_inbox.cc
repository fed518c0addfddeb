#include "frontend/core/core_inbox.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>

#include "glog/logging.h"

namespace kvserve::frontend {

CoreInbox::CoreInbox() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  PCHECK(fd_ >= 0) << "eventfd";
}

CoreInbox::~CoreInbox() { close(fd_); }

void CoreInbox::Wake() {
  if (woken_) return;  // the core has not taken the last wake yet: it takes this too
  woken_ = true;
  const uint64_t one = 1;
  (void)!write(fd_, &one, sizeof(one));
}

void CoreInbox::AddJob(std::shared_ptr<Job> job, bool wake) {
  absl::MutexLock lock(&mu_);
  queued_.jobs.push_back(std::move(job));
  if (wake) Wake();
}

void CoreInbox::AddAbort(const std::string& request_id, bool wake) {
  absl::MutexLock lock(&mu_);
  queued_.aborts.push_back(request_id);
  if (wake) Wake();
}

void CoreInbox::AddStarted(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  queued_.started.push_back(request_id);
  Wake();
}

void CoreInbox::AddControl(int worker, kvserve::v1::ControlAction action) {
  absl::MutexLock lock(&mu_);
  queued_.controls.emplace_back(worker, action);
  Wake();
}

CoreInbox::Taken CoreInbox::Take() {
  Taken taken;
  absl::MutexLock lock(&mu_);
  if (woken_) {  // reset: what woke the core is taken now (no read when nothing came)
    uint64_t wakes = 0;
    (void)!read(fd_, &wakes, sizeof(wakes));
    woken_ = false;
  }
  std::swap(taken, queued_);
  return taken;
}

}  // namespace kvserve::frontend
