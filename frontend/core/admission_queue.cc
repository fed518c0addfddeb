#include "frontend/core/admission_queue.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvserve::frontend {

namespace pb = ::kvserve::v1;

pb::GenerateResponse ErrorReply(const std::string& id, absl::StatusCode code,
                                absl::string_view message) {
  pb::GenerateResponse r;
  r.set_request_id(id);
  r.set_finish_reason(pb::FINISH_REASON_ERROR);
  r.mutable_error()->set_code(static_cast<int>(code));
  r.mutable_error()->set_message(std::string(message));
  return r;
}

bool RefusedBeforeRunning(const pb::GenerateResponse& r) {
  return r.finish_reason() == pb::FINISH_REASON_ERROR &&
         r.error().code() == static_cast<int>(absl::StatusCode::kFailedPrecondition);
}

void AdmissionQueue::Push(Entry e, bool front) {
  KVSERVE_CHECK_THREAD(owner_);
  if (static_cast<int>(queue_.size()) >= admission_.max_queued) {
    if (metrics_ != nullptr) metrics_->CountRejected("queue_full");
    e.job->on_response(ErrorReply(
        e.job->request.request_id(), absl::StatusCode::kResourceExhausted,
        absl::StrCat("the router is at capacity: ", queue_.size(),
                     " requests wait for a worker (--max-queued-requests); retry later")));
    return;
  }
  e.since = Clock::now();
  if (front) {
    queue_.push_front(std::move(e));
  } else {
    queue_.push_back(std::move(e));
  }
  Published();
}

void AdmissionQueue::PlaceInOrder(const std::function<bool(Entry&)>& place) {
  KVSERVE_CHECK_THREAD(owner_);
  if (queue_.empty()) return;
  while (!queue_.empty()) {
    Entry& e = queue_.front();
    if (!place(e)) break;
    if (metrics_ != nullptr) {
      metrics_->ObserveQueueWait(std::chrono::duration<double>(Clock::now() - e.since).count());
    }
    queue_.pop_front();
  }
  Published();
}

void AdmissionQueue::Expire(Clock::time_point now) {
  KVSERVE_CHECK_THREAD(owner_);
  const auto max_wait =
      std::chrono::milliseconds(absl::ToInt64Milliseconds(admission_.max_queue_wait));
  for (auto it = queue_.begin(); it != queue_.end();) {
    Job& job = *it->job;
    const std::string& id = job.request.request_id();
    if (now >= job.deadline) {
      if (metrics_ != nullptr) metrics_->CountRejected("deadline");
      job.on_response(ErrorReply(id, absl::StatusCode::kDeadlineExceeded, kDeadlineMessage));
    } else if (now - it->since >= max_wait) {
      if (metrics_ != nullptr) metrics_->CountRejected("queue_timeout");
      job.on_response(ErrorReply(id, absl::StatusCode::kResourceExhausted,
                                 absl::StrCat("no worker had room for the request within ",
                                              absl::FormatDuration(admission_.max_queue_wait),
                                              " (--max-queue-wait-seconds); retry later")));
    } else {
      ++it;
      continue;
    }
    it = queue_.erase(it);
  }
  Published();
}

void AdmissionQueue::PlacedAtOnce(const Job& job) {
  if (metrics_ == nullptr) return;
  metrics_->ObserveQueueWait(0);
  if (job.received != Clock::time_point()) {
    metrics_->ObserveAdded("to_worker",
                           std::chrono::duration<double>(Clock::now() - job.received).count());
  }
}

bool AdmissionQueue::Remove(const std::string& request_id) {
  KVSERVE_CHECK_THREAD(owner_);
  const size_t removed = std::erase_if(
      queue_, [&](const Entry& e) { return e.job->request.request_id() == request_id; });
  Published();
  return removed > 0;
}

void AdmissionQueue::Published() {
  KVSERVE_CHECK_THREAD(owner_);
  depth_ = static_cast<int>(queue_.size());
  if (metrics_ != nullptr) metrics_->SetQueueDepth(depth_);
}

}  // namespace kvserve::frontend
