#include "worker/server/drain.h"

#include "glog/logging.h"

namespace kvserve::worker {

namespace pb = ::kvserve::v1;

pb::WorkerState Drain::state() const {
  if (!draining_) return pb::WORKER_STATE_READY;
  return recycle_ && !stop_ ? pb::WORKER_STATE_RECYCLING : pb::WORKER_STATE_DRAINING;
}

bool Drain::Start(const std::string& reason, bool recycle, Clock::time_point now) {
  const pb::WorkerState before = state();
  if (recycle) recycle_ = true;
  if (!draining_) {
    draining_ = true;
    reason_ = reason;
    deadline_ = now + timeout_;
    LOG(INFO) << "draining: " << reason;
  }
  return state() != before;
}

bool Drain::Stop(Clock::time_point now) {
  if (stop_) return false;
  stop_ = true;
  if (draining_) {
    LOG(INFO) << "draining: sigterm (during the " << reason_ << " drain)";
  } else {
    Start("sigterm", /*recycle=*/false, now);
  }
  return true;
}

absl::Status Drain::Undrain() {
  if (recycle_ || stop_) {
    return absl::FailedPreconditionError("a recycle or shutdown drain cannot be undone");
  }
  draining_ = false;
  return absl::OkStatus();
}

void Drain::HoldGrant(int64_t granted_ms, const std::string& by, const std::string& reason,
                      Clock::time_point now) {
  if (draining_) return;
  grant_ = HeldGrant{.granted_ms = granted_ms, .by = by};
  commit_ = now + grant_hold_;
  Start(reason, /*recycle=*/true, now);
}

absl::Status Drain::RevokeGrant(const std::string& by, Clock::time_point now) {
  if (!held(now)) {
    return absl::FailedPreconditionError("no revocable recycle grant (none, or already committed)");
  }
  LOG(INFO) << "recycle grant revoked by " << by;
  grant_.reset();
  recycle_ = false;
  recycle_asked_ = false;         // ask again later
  if (!stop_) draining_ = false;  // a SIGTERM came meanwhile: keep stopping
  return absl::OkStatus();
}

std::optional<Drain::HeldGrant> Drain::held(Clock::time_point now) const {
  if (!grant_ || now >= commit_) return std::nullopt;
  return grant_;
}

bool Drain::AskRecycle() {
  const bool first = !recycle_asked_;
  recycle_asked_ = true;
  return first;
}

std::optional<Drain::Exit> Drain::Finished(Clock::time_point now, bool has_work) {
  if (!ends()) return std::nullopt;
  if (has_work) {
    idle_since_.reset();
  } else if (!idle_since_) {
    idle_since_ = now;
  }
  if (grant_ && now >= commit_) grant_.reset();  // committed
  // A held grant is never acted on: it may still be revoked.
  if (grant_ || has_work || now - *idle_since_ < idle_grace_) return std::nullopt;
  // A SIGTERM during a recycle drain wins: the process is being stopped, not replaced.
  return recycle_ && !stop_ ? Exit::kRecycle : Exit::kStopped;
}

}  // namespace kvserve::worker
