// WorkerServer: control actions (drain, undrain, recycle grants and revokes, snapshot requests),
// and the drain they start: no new requests, in-flight ones finished or aborted at the drain
// timeout, a recycle grant held revocable until committed, then the exit.
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "worker/server/process_clock.h"
#include "worker/server/worker_server.h"

namespace kvserve::worker {

namespace pb = ::kvserve::v1;

void WorkerServer::HandleControl(const std::string& identity, const pb::Control& c) {
  KVSERVE_CHECK_THREAD(loop_thread_);
  pb::ControlReply r;
  r.set_control_id(c.control_id());
  r.set_ok(true);
  switch (c.action()) {
    case pb::CONTROL_ACTION_DRAIN:
      StartDrain(c.reason().empty() ? "admin" : c.reason(), /*recycle=*/false);
      break;
    case pb::CONTROL_ACTION_UNDRAIN:
      if (recycle_after_drain_ || stop_after_drain_) {
        r.set_ok(false);
        r.mutable_error()->set_message("a recycle or shutdown drain cannot be undone");
      } else {
        draining_ = false;
        state_ = pb::WORKER_STATE_READY;
      }
      break;
    case pb::CONTROL_ACTION_RECYCLE_GRANT:
      if (c.instance_id() != 0 && c.instance_id() != instance_id_) {
        r.set_ok(false);
        r.mutable_error()->set_message("the grant is for an earlier instance of this worker");
        break;
      }
      if (draining_) break;  // a second replica's grant for the same slot: already held
      grant_pending_ = true;
      grant_ms_ = NowMs();
      granted_by_ = c.coordinator_id();
      grant_commit_ = Clock::now() + std::chrono::milliseconds(
                                         absl::ToInt64Milliseconds(options_.recycle_grant_hold));
      StartDrain(c.reason().empty() ? "recycle" : c.reason(), /*recycle=*/true);
      break;
    case pb::CONTROL_ACTION_RECYCLE_REVOKE:
      if (!grant_pending_ || Clock::now() >= grant_commit_) {
        r.set_ok(false);
        r.mutable_error()->set_message("no revocable recycle grant (none, or already committed)");
        break;
      }
      LOG(INFO) << "recycle grant revoked by " << c.coordinator_id();
      grant_pending_ = false;
      recycle_after_drain_ = false;
      recycle_requested_ = false;  // ask again later
      if (stop_after_drain_) {
        state_ = pb::WORKER_STATE_DRAINING;  // a SIGTERM came meanwhile: keep stopping
      } else {
        draining_ = false;
        state_ = pb::WORKER_STATE_READY;
      }
      PublishStatus();
      break;
    case pb::CONTROL_ACTION_RECYCLE:
      StartDrain(c.reason().empty() ? "recycle" : c.reason(), /*recycle=*/true);
      break;
    case pb::CONTROL_ACTION_RECYCLE_DENY:
      recycle_requested_ = false;  // ask again later
      break;
    case pb::CONTROL_ACTION_SNAPSHOT_REQUEST:
      PublishSnapshot();
      break;
    default:
      r.set_ok(false);
      r.mutable_error()->set_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
      r.mutable_error()->set_message(absl::StrCat("unsupported control action ", c.action()));
      metrics_->CountDropped("bad_control_action");
  }
  Reply(identity, r);
}

void WorkerServer::StartDrain(const std::string& reason, bool recycle) {
  KVSERVE_CHECK_THREAD(loop_thread_);
  if (recycle) recycle_after_drain_ = true;
  if (draining_) return;
  draining_ = true;
  drain_reason_ = reason;
  drain_deadline_ =
      Clock::now() + std::chrono::milliseconds(absl::ToInt64Milliseconds(options_.drain_timeout));
  state_ = recycle ? pb::WORKER_STATE_RECYCLING : pb::WORKER_STATE_DRAINING;
  LOG(INFO) << "draining: " << reason;
  PublishStatus();
}

bool WorkerServer::RecycleDue(std::string* reason) {
  KVSERVE_CHECK_THREAD(loop_thread_);
  const RecyclePolicy& p = options_.recycle;
  if (p.after_requests > 0 && served_requests_ >= p.after_requests)
    *reason = "requests";
  else if (p.after_seconds > 0 && Seconds(Clock::now() - started_) >= p.after_seconds)
    *reason = "uptime";
  else if (p.on_rss_growth_mb > 0 && RssMb() - start_rss_mb_ >= p.on_rss_growth_mb)
    *reason = "rss_growth";
  else if (p.on_fragmentation > 0) {
    const Engine::KvUsage u = engine_->kv_usage();
    if (u.allocated_slots > 0 &&
        1.0 - static_cast<double>(u.used_tokens) / u.allocated_slots >= p.on_fragmentation) {
      *reason = "fragmentation";
    }
  }
  return !reason->empty();
}

std::optional<WorkerServer::Exit> WorkerServer::ContinueDrain(Clock::time_point now) {
  KVSERVE_CHECK_THREAD(loop_thread_);
  if (engine_->HasWork() && now >= drain_deadline_) AbortForDrainTimeout();
  if (!engine_->HasWork() && idle_since_ == Clock::time_point()) idle_since_ = now;
  if (engine_->HasWork()) idle_since_ = Clock::time_point();
  // Idle: keep answering "draining" for a short grace period, so that a request already on
  // the wire gets a retryable error instead of vanishing with the process.
  if (grant_pending_ && now >= grant_commit_) grant_pending_ = false;  // committed
  // A held grant is never acted on: it may still be revoked.
  if (grant_pending_ || engine_->HasWork() || now - idle_since_ < std::chrono::milliseconds(200)) {
    return std::nullopt;
  }
  if (recycle_after_drain_ && !stop_after_drain_) metrics_->CountRecycle(drain_reason_);
  state_ = pb::WORKER_STATE_STOPPING;
  UpdateMetrics();
  PublishAllCleared();
  PublishStatus();
  // A SIGTERM during a recycle drain wins: the process is being stopped, not replaced.
  return recycle_after_drain_ && !stop_after_drain_ ? Exit::kRecycle : Exit::kStopped;
}

void WorkerServer::AbortForDrainTimeout() {
  KVSERVE_CHECK_THREAD(loop_thread_);
  for (const std::string& id : engine_->AbortAll()) {
    auto it = routes_.find(id);
    if (it == routes_.end()) continue;
    pb::GenerateResponse r;
    r.set_request_id(id);
    r.set_finish_reason(pb::FINISH_REASON_ABORT);
    r.mutable_error()->set_code(static_cast<int>(absl::StatusCode::kUnavailable));
    r.mutable_error()->set_message(
        absl::StrCat("aborted: the worker's drain timeout passed (", drain_reason_, ")"));
    Respond(it->second, r);
    routes_.erase(it);
    metrics_->CountRequestEnd("abort");
  }
}

}  // namespace kvserve::worker
